/*
 * inlinelat.c: 64-byte round trips with and without IBV_SEND_INLINE
 * through rdmatap's libibverbs, for capi's BenchmarkInlineLatency.
 *
 * Usage: inlinelat IP:PORT ROUNDS send|write inline|plain
 *
 * Connects an RC QP to IP:PORT (DIAL through the private interface; the
 * peer's accept carries its buffer's address and rkey as 12 bytes of
 * private data), then ROUNDS times: posts a 64-byte Send, or a 64-byte
 * RDMA Write with Immediate into the peer's buffer, inline or from a
 * registered buffer, and busy-polls for the peer's 64-byte answer and the
 * send's completion. Every answer's bytes are checked. Prints
 * "inlinelat: N ns per round trip".
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <infiniband/verbs.h>

#include "rdmatap_core.h"

#define SIZE 64

static void fail(const char *what, int err)
{
	fprintf(stderr, "inlinelat: %s: %s\n", what, strerror(err));
	exit(1);
}

static void poll1(struct ibv_cq *cq, const char *what)
{
	struct ibv_wc wc;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		;
	if (n < 0 || wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "inlinelat: %s: %s\n", what, ibv_wc_status_str(wc.status));
		exit(1);
	}
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: inlinelat IP:PORT ROUNDS send|write inline|plain\n");
		return 2;
	}
	long rounds = atol(argv[2]);
	int write = strcmp(argv[3], "write") == 0, inl = strcmp(argv[4], "inline") == 0;
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
				      .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1, .max_inline_data = SIZE}};
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	uint8_t *buf = malloc(2 * SIZE);
	if (!qp || !buf)
		fail("ibv_create_qp", errno);
	memset(buf, 0, 2 * SIZE);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 2 * SIZE, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		fail("ibv_reg_mr", errno);
	struct ibv_sge rsge = {.addr = (uintptr_t)buf + SIZE, .length = SIZE, .lkey = mr->lkey};
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
	const uint8_t *pdata;
	uint16_t plen;
	if (rt_msg_field(&rep, 2, &pdata, &plen) < 0 || plen != 12)
		fail("the peer's private data", EPROTO);
	uint64_t raddr = 0;
	uint32_t rkey = 0;
	for (int i = 7; i >= 0; i--)
		raddr = raddr << 8 | pdata[i];
	for (int i = 11; i >= 8; i--)
		rkey = rkey << 8 | pdata[i];
	rt_qp_set_state(qp, IBV_QPS_RTS);

	/* The message: from the registered buffer, or from the stack
	 * (unregistered: lkey 0) when inline. */
	uint8_t stackmsg[SIZE];
	struct ibv_sge ssge = {.addr = (uintptr_t)buf, .length = SIZE, .lkey = mr->lkey};
	if (inl)
		ssge = (struct ibv_sge){.addr = (uintptr_t)stackmsg, .length = SIZE, .lkey = 0};
	struct ibv_send_wr swr = {.sg_list = &ssge, .num_sge = 1, .opcode = write ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED | (inl ? IBV_SEND_INLINE : 0),
				  .wr.rdma = {.remote_addr = raddr, .rkey = rkey}},
			   *bad_s;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long i = 0; i < rounds; i++) {
		uint8_t *msg = inl ? stackmsg : buf;
		memset(msg, (int)(i & 0xff), SIZE);
		swr.imm_data = (uint32_t)i;
		if (ibv_post_send(qp, &swr, &bad_s))
			fail("ibv_post_send", EIO);
		poll1(rcq, "receive");
		if (buf[SIZE] != (uint8_t)i || buf[2 * SIZE - 1] != (uint8_t)i)
			fail("the answer's bytes", EPROTO);
		if (ibv_post_recv(qp, &rwr, &bad_r))
			fail("ibv_post_recv", EIO);
		poll1(scq, "send");
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double ns = (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
	printf("inlinelat: %.0f ns per round trip\n", ns / (double)rounds);
	ibv_destroy_qp(qp);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(scq);
	ibv_destroy_cq(rcq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	free(buf);
	return 0;
}
