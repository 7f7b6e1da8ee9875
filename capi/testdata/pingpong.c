/*
 * pingpong.c: Send ping-pong through rdmatap's libibverbs, for capi's
 * benchmark.
 *
 * Usage: pingpong IP:PORT ROUNDS SIZE
 *
 * Connects an RC QP to IP:PORT (DIAL through the private interface), then
 * ROUNDS times: Sends SIZE bytes and busy-polls for the peer's answer.
 * Prints "pingpong: N ns per round trip".
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <infiniband/verbs.h>

#include "rdmatap_core.h"

static void fail(const char *what, int err)
{
	fprintf(stderr, "pingpong: %s: %s\n", what, strerror(err));
	exit(1);
}

static void poll1(struct ibv_cq *cq, const char *what)
{
	struct ibv_wc wc;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		;
	if (n < 0 || wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "pingpong: %s: %s\n", what, ibv_wc_status_str(wc.status));
		exit(1);
	}
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: pingpong IP:PORT ROUNDS SIZE\n");
		return 2;
	}
	long rounds = atol(argv[2]);
	size_t size = (size_t)atol(argv[3]);
	struct ibv_device **devs = ibv_get_device_list(NULL);
	if (!devs || !devs[0])
		fail("no device", ENODEV);
	struct ibv_context *ctx = ibv_open_device(devs[0]);
	ibv_free_device_list(devs);
	if (!ctx)
		fail("ibv_open_device", errno);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *scq = ibv_create_cq(ctx, 64, NULL, NULL, 0), *rcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	if (!pd || !scq || !rcq)
		fail("setup", errno);
	struct ibv_qp_init_attr qa = {.send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	uint8_t *buf = malloc(2 * size + 1);
	if (!qp || !buf)
		fail("ibv_create_qp", errno);
	memset(buf, 1, 2 * size + 1);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 2 * size + 1, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		fail("ibv_reg_mr", errno);
	struct ibv_sge rsge = {.addr = (uintptr_t)buf + size, .length = (uint32_t)size + 1, .lkey = mr->lkey};
	struct ibv_recv_wr rwr = {.sg_list = &rsge, .num_sge = 1}, *bad_r;
	for (int i = 0; i < 8; i++)
		if (ibv_post_recv(qp, &rwr, &bad_r))
			fail("ibv_post_recv", EIO);
	struct rt_session *s = rt_context_session(ctx);
	uint64_t args[8] = {rt_qp_handle(qp)};
	struct rt_field f[2] = {{argv[1], (uint16_t)strlen(argv[1])}, {"", 0}};
	struct rt_request req = {.type = RT_DIAL, .nargs = 8, .args = args, .nfields = 2, .fields = f};
	static struct rt_msg rep;
	if (rt_call(s, &req, &rep) < 0)
		fail("DIAL", errno);
	rt_qp_set_state(qp, IBV_QPS_RTS);

	struct ibv_sge ssge = {.addr = (uintptr_t)buf, .length = (uint32_t)size, .lkey = mr->lkey};
	struct ibv_send_wr swr = {.sg_list = &ssge, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED}, *bad_s;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long i = 0; i < rounds; i++) {
		if (ibv_post_send(qp, &swr, &bad_s))
			fail("ibv_post_send", EIO);
		poll1(rcq, "receive");
		if (ibv_post_recv(qp, &rwr, &bad_r))
			fail("ibv_post_recv", EIO);
		poll1(scq, "send");
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double ns = (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
	printf("pingpong: %.0f ns per round trip\n", ns / (double)rounds);
	ibv_destroy_qp(qp);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(scq);
	ibv_destroy_cq(rcq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	free(buf);
	return 0;
}
