/*
 * gone.c: the service going away, for capi's tests.
 *
 * Waits in ibv_get_cq_event after printing "waiting"; the test then stops
 * the service. The wait must end with an error, polling must report the
 * error, the asynchronous event must be IBV_EVENT_DEVICE_FATAL (the
 * last: then ibv_get_async_event fails with EIO) and new calls must fail. Prints "gone: ok" and exits 0 when all went right.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

static void fail(const char *what, int err)
{
	fprintf(stderr, "gone: %s: %s\n", what, strerror(err));
	exit(1);
}

int main(void)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	if (!l || !l[0])
		fail("no device", ENODEV);
	struct ibv_context *ctx = ibv_open_device(l[0]);
	ibv_free_device_list(l);
	if (!ctx)
		fail("ibv_open_device", errno);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_cq *cq = ch ? ibv_create_cq(ctx, 4, NULL, ch, 0) : NULL;
	if (!cq || ibv_req_notify_cq(cq, 0))
		fail("the CQ", errno);
	printf("waiting\n");
	fflush(stdout);
	struct ibv_cq *ecq;
	void *ectx;
	if (ibv_get_cq_event(ch, &ecq, &ectx) == 0 || errno != EIO)
		fail("ibv_get_cq_event after the service's end: want EIO", errno);
	struct ibv_wc wc;
	if (ibv_poll_cq(cq, 1, &wc) >= 0)
		fail("ibv_poll_cq after the service's end: want an error", EINVAL);
	struct ibv_async_event ev;
	if (ibv_get_async_event(ctx, &ev))
		fail("ibv_get_async_event", errno);
	if (ev.event_type != IBV_EVENT_DEVICE_FATAL)
		fail("the asynchronous event is not IBV_EVENT_DEVICE_FATAL", EINVAL);
	ibv_ack_async_event(&ev);
	if (ibv_get_async_event(ctx, &ev) == 0 || errno != EIO)
		fail("ibv_get_async_event after IBV_EVENT_DEVICE_FATAL: want EIO", errno);
	errno = 0;
	if (ibv_alloc_pd(ctx) || errno != ECONNRESET)
		fail("ibv_alloc_pd after the service's end: want ECONNRESET", errno);
	printf("gone: ok\n");
	return 0;
}
