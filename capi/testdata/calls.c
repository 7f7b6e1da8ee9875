/*
 * calls.c: the private interface's calls, for capi's tests.
 *
 * LISTEN, then a GET_REQUEST with a completion function that a CANCEL
 * ends; calls from several threads at once; error replies; a thread
 * canceled in ibv_get_cq_event; a forked child's own default context. Prints "calls: ok" and exits 0 when all went right.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "rdmatap_core.h"

static void fail(const char *what, int err)
{
	fprintf(stderr, "calls: %s: %s\n", what, strerror(err));
	exit(1);
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int done;
static uint32_t done_status;

static void on_request(void *ctx, struct rt_msg *rep)
{
	if (ctx != &done)
		abort();
	pthread_mutex_lock(&mu);
	done = 1;
	done_status = rep->status;
	pthread_cond_signal(&cv);
	pthread_mutex_unlock(&mu);
}

static struct rt_session *s;

static void *worker(void *arg)
{
	struct ibv_pd *pd = arg;
	for (int i = 0; i < 200; i++) {
		uint64_t a = rt_pd_handle(pd);
		struct rt_request req = {.type = RT_ALLOC_PD};
		struct rt_msg *m = malloc(sizeof(*m));
		if (!m || rt_call(s, &req, m) < 0 || m->args[0] == 0 || m->args[0] == a)
			fail("ALLOC_PD from a thread", errno);
		uint64_t h = m->args[0];
		struct rt_request d = {.type = RT_DEALLOC_PD, .nargs = 1, .args = &h};
		if (rt_call(s, &d, m) < 0)
			fail("DEALLOC_PD from a thread", errno);
		free(m);
	}
	return NULL;
}

static void *cq_waiter(void *arg)
{
	struct ibv_comp_channel *ch = arg;
	struct ibv_cq *cq;
	void *ctx;
	ibv_get_cq_event(ch, &cq, &ctx); /* canceled while it waits */
	return (void *)1;
}

int main(void)
{
	struct ibv_context *ctx = rt_default_context();
	if (!ctx)
		fail("rt_default_context", errno);
	if (rt_default_context() != ctx)
		fail("rt_default_context: another context", EINVAL);
	s = rt_context_session(ctx);
	if (!s || s != rt_session_get())
		fail("rt_context_session", EINVAL);
	if (strcmp(rt_session_device_name(s), ctx->device->name))
		fail("rt_session_device_name", EINVAL);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd || rt_pd_handle(pd) == 0)
		fail("ibv_alloc_pd", errno);

	static struct rt_msg m;
	uint64_t largs[2] = {0, 0};
	struct rt_field addr = {":0", 2};
	struct rt_request listen = {.type = RT_LISTEN, .nargs = 2, .args = largs, .nfields = 1, .fields = &addr};
	if (rt_call(s, &listen, &m) < 0)
		fail("LISTEN", errno);
	uint64_t lh = m.args[0];
	if (m.args[1] == 0)
		fail("LISTEN: no port", EINVAL);
	struct rt_request get = {.type = RT_GET_REQUEST, .nargs = 1, .args = &lh};
	uint32_t seq = rt_call_async(s, &get, on_request, &done);
	if (!seq)
		fail("GET_REQUEST", errno);
	rt_cancel(s, seq);
	pthread_mutex_lock(&mu);
	while (!done)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
	if (done_status != RT_CANCELED)
		fail("GET_REQUEST after CANCEL: want CANCELED", (int)done_status);
	struct rt_request close_l = {.type = RT_CLOSE_LISTENER, .nargs = 1, .args = &lh};
	if (rt_call(s, &close_l, &m) < 0)
		fail("CLOSE_LISTENER", errno);
	/* an error reply: the handle is gone */
	if (rt_call(s, &close_l, &m) == 0 || errno != EINVAL || m.status != RT_INVALID_ARGUMENT)
		fail("CLOSE_LISTENER twice: want EINVAL", errno);
	const uint8_t *text;
	uint16_t tlen;
	if (rt_msg_field(&m, 0, &text, &tlen) < 0 || tlen == 0)
		fail("the error's text", EINVAL);

	pthread_t t[4];
	for (int i = 0; i < 4; i++)
		if (pthread_create(&t[i], NULL, worker, pd))
			fail("pthread_create", EAGAIN);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);

	/* A handle that names nothing is an error reply. */
	uint64_t bad = 12345;
	struct rt_request q = {.type = RT_QUERY_QP, .nargs = 1, .args = &bad};
	if (rt_call(s, &q, &m) == 0 || errno != EINVAL)
		fail("QUERY_QP of no QP: want EINVAL", errno);
	if (rt_session_dead(s))
		fail("rt_session_dead", EINVAL);
	/* A thread canceled while it waits for a completion event (as rping
	 * ends its CQ thread) leaves the channel and CQ usable. (Not under
	 * AddressSanitizer, which does not unpoison a stack pthread_cancel
	 * unwound and reports the thread's exit: CALLS_NO_CANCEL.) */
	if (getenv("CALLS_NO_CANCEL"))
		goto end;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_cq *cq = ch ? ibv_create_cq(ctx, 4, NULL, ch, 0) : NULL;
	if (!cq || ibv_req_notify_cq(cq, 0))
		fail("the CQ", errno);
	pthread_t w;
	if (pthread_create(&w, NULL, cq_waiter, ch))
		fail("pthread_create", EAGAIN);
	pthread_cancel(w);
	void *res;
	pthread_join(w, &res);
	if (res != PTHREAD_CANCELED)
		fail("the waiting thread was not canceled", EINVAL);
	int r;
	if ((r = ibv_destroy_cq(cq)) || (r = ibv_destroy_comp_channel(ch)))
		fail("destroying the CQ and channel after the cancel", r);
end:

	if (ibv_dealloc_pd(pd))
		fail("ibv_dealloc_pd", EIO);
	printf("calls: ok\n");
	return 0;
}
