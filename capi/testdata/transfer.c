/*
 * transfer.c: a client of rdmatap's libibverbs for capi's tests.
 *
 * Usage: transfer IP:PORT
 *
 * Registers malloc'd memory (unaligned, between canaries), makes an RC QP,
 * connects it to IP:PORT with the service's DIAL (through the private
 * interface librdmacm uses) exchanging buffers in the private data, then:
 * RDMA Writes WRITE_LEN bytes into the peer's buffer and Sends SEND_LEN
 * bytes and an inline message from the stack; waits (through a completion
 * channel) for the peer's RDMA Write into its own buffer and the peer's
 * Send; checks every byte; checks the errors libibverbs gives for what
 * iWARP cannot do and for objects in use; tears everything down. Prints
 * "transfer: ok" and exits 0 when all went right.
 */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "rdmatap_core.h"

#define WRITE_LEN (64 * 1024 + 123)
#define SEND_LEN 4000
#define INLINE_LEN 40
#define PEER_WRITE_LEN (32 * 1024 + 7)
#define PEER_SEND_LEN 3000
#define CANARY 4096

static void fail(const char *what, int err)
{
	fprintf(stderr, "transfer: %s: %s\n", what, strerror(err));
	exit(1);
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 7 + seed);
}

static void check(const char *what, const uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (uint8_t)(i * 7 + seed)) {
			fprintf(stderr, "transfer: %s: byte %zu is %u, want %u\n", what, i, p[i], (uint8_t)(i * 7 + seed));
			exit(1);
		}
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}
static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}
static uint32_t get32(const uint8_t *p) { return (uint32_t)get64((const uint8_t[8]){p[0], p[1], p[2], p[3], 0, 0, 0, 0}); }

/* wait_cq waits through the channel for one completion of cq. */
static void wait_cq(struct ibv_comp_channel *ch, struct ibv_cq *cq, struct ibv_wc *wc, const char *what)
{
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n < 0)
			fail("ibv_poll_cq", EIO);
		if (n == 1) {
			if (wc->status != IBV_WC_SUCCESS) {
				fprintf(stderr, "transfer: %s: completion of WR %llu: status %s\n", what, (unsigned long long)wc->wr_id,
					ibv_wc_status_str(wc->status));
				exit(1);
			}
			return;
		}
		if (ibv_req_notify_cq(cq, 0))
			fail("ibv_req_notify_cq", EIO);
		n = ibv_poll_cq(cq, 1, wc);
		if (n == 1) {
			if (wc->status != IBV_WC_SUCCESS) {
				fprintf(stderr, "transfer: %s: completion of WR %llu: status %s\n", what, (unsigned long long)wc->wr_id,
					ibv_wc_status_str(wc->status));
				exit(1);
			}
			return;
		}
		struct pollfd pfd = {.fd = ch->fd, .events = POLLIN};
		if (poll(&pfd, 1, 10000) != 1) {
			fprintf(stderr, "transfer: %s: no completion event in 10 s\n", what);
			exit(1);
		}
		struct ibv_cq *ev_cq;
		void *ev_ctx;
		if (ibv_get_cq_event(ch, &ev_cq, &ev_ctx))
			fail("ibv_get_cq_event", errno);
		if (ev_cq != cq || ev_ctx != (void *)cq->context)
			fail("ibv_get_cq_event: wrong CQ", EINVAL);
		ibv_ack_cq_events(ev_cq, 1);
	}
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: transfer IP:PORT\n");
		return 2;
	}
	int num;
	struct ibv_device **devs = ibv_get_device_list(&num);
	if (!devs || num != 1)
		fail("ibv_get_device_list: want one device", ENODEV);
	struct ibv_context *ctx = ibv_open_device(devs[0]);
	if (!ctx)
		fail("ibv_open_device", errno);
	ibv_free_device_list(devs);
	struct ibv_device_attr da;
	if (ibv_query_device(ctx, &da))
		fail("ibv_query_device", EIO);
	struct ibv_port_attr pa;
	if (ibv_query_port(ctx, 1, &pa) || pa.state != IBV_PORT_ACTIVE)
		fail("ibv_query_port", EIO);

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd)
		fail("ibv_alloc_pd", errno);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	if (!ch)
		fail("ibv_create_comp_channel", errno);
	struct ibv_cq *scq = ibv_create_cq(ctx, 16, ctx, ch, 0);
	struct ibv_cq *rcq = ibv_create_cq(ctx, 16, ctx, ch, 0);
	if (!scq || !rcq)
		fail("ibv_create_cq", errno);

	/* What iWARP cannot do fails as programs expect. */
	struct ibv_qp_init_attr ud = {.send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_UD,
				      .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
	errno = 0;
	if (ibv_create_qp(pd, &ud) || errno != EOPNOTSUPP)
		fail("ibv_create_qp of a UD QP: want EOPNOTSUPP", errno);

	struct ibv_qp_init_attr qa = {.send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 2, .max_recv_sge = 1, .max_inline_data = 64}};
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	if (!qp)
		fail("ibv_create_qp", errno);
	struct ibv_qp_attr ma = {.qp_state = IBV_QPS_INIT, .qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
	int r = ibv_modify_qp(qp, &ma, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS);
	if (r)
		fail("ibv_modify_qp to INIT", r);
	ma.qp_state = IBV_QPS_RTR;
	ma.dest_qp_num = 99;
	if ((r = ibv_modify_qp(qp, &ma, IBV_QP_STATE | IBV_QP_DEST_QPN)) != EINVAL)
		fail("ibv_modify_qp to RTR by QP number: want EINVAL", r);

	/* Memory: malloc'd, unaligned, between canaries that must survive. */
	uint8_t *before = malloc(CANARY), *src = malloc(WRITE_LEN + SEND_LEN + 1), *after = malloc(CANARY);
	uint8_t *dst = malloc(PEER_WRITE_LEN), *rbuf = malloc(PEER_SEND_LEN);
	if (!before || !src || !after || !dst || !rbuf)
		fail("malloc", ENOMEM);
	fill(before, CANARY, 1);
	fill(after, CANARY, 2);
	uint8_t *wsrc = src + 1, *ssrc = src + 1 + WRITE_LEN;
	fill(wsrc, WRITE_LEN, 3);
	fill(ssrc, SEND_LEN, 4);
	memset(dst, 0, PEER_WRITE_LEN);
	memset(rbuf, 0, PEER_SEND_LEN);
	struct ibv_mr *smr = ibv_reg_mr(pd, wsrc, WRITE_LEN + SEND_LEN, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *dmr = ibv_reg_mr(pd, dst, PEER_WRITE_LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_mr *rmr = ibv_reg_mr(pd, rbuf, PEER_SEND_LEN, IBV_ACCESS_LOCAL_WRITE);
	if (!smr || !dmr || !rmr)
		fail("ibv_reg_mr", errno);
	check("canary before", before, CANARY, 1);
	check("canary after", after, CANARY, 2);
	check("source after registration", wsrc, WRITE_LEN, 3);
	errno = 0;
	if (ibv_reg_mr(pd, NULL, 4096, IBV_ACCESS_LOCAL_WRITE) || errno != EFAULT)
		fail("ibv_reg_mr of NULL: want EFAULT", errno);
	if ((r = ibv_dealloc_pd(pd)) != EBUSY)
		fail("ibv_dealloc_pd of a PD in use: want EBUSY", r);
	if ((r = ibv_destroy_cq(scq)) != EBUSY)
		fail("ibv_destroy_cq of a CQ in use: want EBUSY", r);

	struct ibv_sge rsge = {.addr = (uintptr_t)rbuf, .length = PEER_SEND_LEN, .lkey = rmr->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 7, .sg_list = &rsge, .num_sge = 1}, *bad_r;
	if ((r = ibv_post_recv(qp, &rwr, &bad_r)))
		fail("ibv_post_recv", r);

	/* Connect: the private data carries our buffer, the reply the peer's. */
	struct rt_session *s = rt_context_session(ctx);
	if (!s)
		fail("rt_context_session", EINVAL);
	uint8_t priv[16];
	put64(priv, (uintptr_t)dst);
	put32(priv + 8, dmr->rkey);
	put32(priv + 12, PEER_WRITE_LEN);
	uint64_t args[8] = {rt_qp_handle(qp), 0, 0, 0, 0, 0, 0, 0};
	struct rt_field f[2] = {{argv[1], (uint16_t)strlen(argv[1])}, {priv, sizeof(priv)}};
	struct rt_request req = {.type = RT_DIAL, .nargs = 8, .args = args, .nfields = 2, .fields = f};
	static struct rt_msg rep;
	if (rt_call(s, &req, &rep) < 0)
		fail("DIAL", errno);
	const uint8_t *pd_data;
	uint16_t pd_len;
	if (rt_msg_field(&rep, 2, &pd_data, &pd_len) < 0 || pd_len != 16)
		fail("DIAL: the peer's private data", EPROTO);
	uint64_t raddr = get64(pd_data);
	uint32_t rkey = get32(pd_data + 8), rlen = get32(pd_data + 12);
	if (rlen < WRITE_LEN)
		fail("the peer's buffer is short", EINVAL);
	rt_qp_set_state(qp, IBV_QPS_RTS);
	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr qinit;
	if ((r = ibv_query_qp(qp, &qattr, IBV_QP_STATE, &qinit)) || qattr.qp_state != IBV_QPS_RTS)
		fail("ibv_query_qp: want RTS", r ? r : EINVAL);

	/* A fork: the child gets copies of registered memory; the parent's
	 * stays shared with the service (the transfers below use it). */
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0)
		fail("fork", errno);
	if (pid == 0) {
		check("the child's copy of the source", wsrc, WRITE_LEN, 3);
		memset(wsrc, 0, WRITE_LEN);
		memset(dst, 0xff, PEER_WRITE_LEN);
		_exit(0);
	}
	int st;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		fail("the child failed", ECHILD);
	check("the source after the child wrote its copy", wsrc, WRITE_LEN, 3);

	/* RDMA Write, then Send, then an inline Send from the stack. */
	struct ibv_sge wsge = {.addr = (uintptr_t)wsrc, .length = WRITE_LEN, .lkey = smr->lkey};
	struct ibv_send_wr wwr = {.wr_id = 1, .sg_list = &wsge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED, .wr.rdma = {.remote_addr = raddr, .rkey = rkey}};
	struct ibv_sge ssge[2] = {{.addr = (uintptr_t)ssrc, .length = 1000, .lkey = smr->lkey},
				  {.addr = (uintptr_t)ssrc + 1000, .length = SEND_LEN - 1000, .lkey = smr->lkey}};
	struct ibv_send_wr swr = {.wr_id = 2, .sg_list = ssge, .num_sge = 2, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
	uint8_t stackmsg[INLINE_LEN];
	fill(stackmsg, INLINE_LEN, 5);
	struct ibv_sge isge = {.addr = (uintptr_t)stackmsg, .length = INLINE_LEN, .lkey = 0};
	struct ibv_send_wr iwr = {.wr_id = 3, .sg_list = &isge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE};
	wwr.next = &swr;
	swr.next = &iwr;
	struct ibv_send_wr *bad_s;
	if ((r = ibv_post_send(qp, &wwr, &bad_s)))
		fail("ibv_post_send", r);
	memset(stackmsg, 0, sizeof(stackmsg)); /* inline: the data was taken at post time */
	for (uint64_t want = 1; want <= 3; want++) {
		struct ibv_wc wc;
		wait_cq(ch, scq, &wc, "send");
		if (wc.wr_id != want || wc.qp_num != qp->qp_num)
			fail("send completion out of order", EPROTO);
		if (wc.opcode != (want == 1 ? IBV_WC_RDMA_WRITE : IBV_WC_SEND))
			fail("send completion opcode", EPROTO);
	}
	/* The peer's RDMA Write and Send. */
	struct ibv_wc wc;
	wait_cq(ch, rcq, &wc, "receive");
	if (wc.wr_id != 7 || wc.opcode != IBV_WC_RECV || wc.byte_len != PEER_SEND_LEN)
		fail("receive completion", EPROTO);
	check("the peer's RDMA Write", dst, PEER_WRITE_LEN, 6);
	check("the peer's Send", rbuf, PEER_SEND_LEN, 8);

	/* Memory windows: a type 1 window bound by ibv_bind_mw, a type 2
	 * window by a BIND_MW work request; both binds complete. */
	struct ibv_mr *wmr = ibv_reg_mr(pd, dst, PEER_WRITE_LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_MW_BIND);
	struct ibv_mw *mw1 = wmr ? ibv_alloc_mw(pd, IBV_MW_TYPE_1) : NULL;
	struct ibv_mw *mw2 = mw1 ? ibv_alloc_mw(pd, IBV_MW_TYPE_2) : NULL;
	if (!mw2)
		fail("ibv_alloc_mw", errno);
	uint32_t old_rkey = mw1->rkey;
	struct ibv_mw_bind mb = {.wr_id = 31, .send_flags = IBV_SEND_SIGNALED,
				 .bind_info = {.mr = wmr, .addr = (uintptr_t)dst, .length = 4096, .mw_access_flags = IBV_ACCESS_REMOTE_WRITE}};
	if ((r = ibv_bind_mw(qp, mw1, &mb)))
		fail("ibv_bind_mw", r);
	if (mw1->rkey == old_rkey)
		fail("ibv_bind_mw: the window's rkey did not change", EINVAL);
	struct ibv_send_wr bwr = {.wr_id = 32, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED,
				  .bind_mw = {.mw = mw2, .rkey = ibv_inc_rkey(mw2->rkey),
					      .bind_info = {.mr = wmr, .addr = (uintptr_t)dst + 4096, .length = 4096,
							    .mw_access_flags = IBV_ACCESS_REMOTE_WRITE}}};
	if ((r = ibv_post_send(qp, &bwr, &bad_s)))
		fail("ibv_post_send of BIND_MW", r);
	for (uint64_t want = 31; want <= 32; want++) {
		wait_cq(ch, scq, &wc, "bind");
		if (wc.wr_id != want || wc.opcode != IBV_WC_BIND_MW)
			fail("bind completion", EPROTO);
	}
	if ((r = ibv_dealloc_mw(mw1)) || (r = ibv_dealloc_mw(mw2)) || (r = ibv_dereg_mr(wmr)))
		fail("ibv_dealloc_mw", r);

	/* An RDMA Write with a wrong key: the peer answers with a Terminate
	 * and the QP's failure arrives as an asynchronous event. (The Write
	 * itself may complete before: on iWARP a Write completes once sent.) */
	wwr.next = NULL;
	wwr.wr_id = 9;
	wwr.wr.rdma.rkey = rkey ^ 0x5a00;
	if ((r = ibv_post_send(qp, &wwr, &bad_s)))
		fail("ibv_post_send of the bad write", r);
	for (int tries = 0;; tries++) {
		int n = ibv_poll_cq(scq, 1, &wc);
		if (n == 1)
			break;
		if (tries > 10000)
			fail("no completion of the bad write", ETIMEDOUT);
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	if (wc.wr_id != 9 || (wc.status != IBV_WC_SUCCESS && wc.status != IBV_WC_REM_ACCESS_ERR))
		fprintf(stderr, "transfer: the bad write completed with %s\n", ibv_wc_status_str(wc.status)), exit(1);
	struct pollfd apfd = {.fd = ctx->async_fd, .events = POLLIN};
	if (poll(&apfd, 1, 10000) != 1)
		fail("no asynchronous event in 10 s", ETIMEDOUT);
	struct ibv_async_event aev;
	if (ibv_get_async_event(ctx, &aev))
		fail("ibv_get_async_event", errno);
	if ((aev.event_type != IBV_EVENT_QP_FATAL && aev.event_type != IBV_EVENT_QP_ACCESS_ERR) || aev.element.qp != qp)
		fprintf(stderr, "transfer: asynchronous event %s\n", ibv_event_type_str(aev.event_type)), exit(1);
	printf("transfer: asynchronous event: %s\n", ibv_event_type_str(aev.event_type));
	ibv_ack_async_event(&aev);

	/* A shared receive queue: receives go to it, not to its QPs. */
	struct ibv_srq_init_attr sa = {.attr = {.max_wr = 8, .max_sge = 1}};
	struct ibv_srq *srq = ibv_create_srq(pd, &sa);
	if (!srq)
		fail("ibv_create_srq", errno);
	struct ibv_qp_init_attr sqa = qa;
	sqa.srq = srq;
	struct ibv_qp *sqp = ibv_create_qp(pd, &sqa);
	if (!sqp)
		fail("ibv_create_qp with an SRQ", errno);
	struct ibv_recv_wr *bad_sr;
	if ((r = ibv_post_recv(sqp, &rwr, &bad_sr)) != EINVAL || bad_sr != &rwr)
		fail("ibv_post_recv on a QP with an SRQ: want EINVAL", r);
	if ((r = ibv_post_srq_recv(srq, &rwr, &bad_sr)))
		fail("ibv_post_srq_recv", r);
	struct ibv_srq_attr sattr = {.srq_limit = 1};
	if ((r = ibv_modify_srq(srq, &sattr, IBV_SRQ_LIMIT)))
		fail("ibv_modify_srq", r);
	sattr.max_wr = 100;
	if ((r = ibv_modify_srq(srq, &sattr, IBV_SRQ_MAX_WR)) != EINVAL)
		fail("ibv_modify_srq resizing: want EINVAL", r);
	memset(&sattr, 0, sizeof(sattr));
	if ((r = ibv_query_srq(srq, &sattr)) || sattr.max_wr != 8 || sattr.srq_limit != 1)
		fail("ibv_query_srq", r ? r : EINVAL);
	if ((r = ibv_destroy_srq(srq)) != EBUSY)
		fail("ibv_destroy_srq of an SRQ in use: want EBUSY", r);
	if ((r = ibv_destroy_qp(sqp)) || (r = ibv_destroy_srq(srq)))
		fail("destroying the SRQ and its QP", r);

	/* Tear down, in order. */
	if ((r = ibv_destroy_qp(qp)))
		fail("ibv_destroy_qp", r);
	if ((r = ibv_dereg_mr(smr)) || (r = ibv_dereg_mr(dmr)) || (r = ibv_dereg_mr(rmr)))
		fail("ibv_dereg_mr", r);
	if ((r = ibv_destroy_comp_channel(ch)) != EBUSY)
		fail("ibv_destroy_comp_channel with CQs: want EBUSY", r);
	if ((r = ibv_destroy_cq(scq)) || (r = ibv_destroy_cq(rcq)))
		fail("ibv_destroy_cq", r);
	if ((r = ibv_destroy_comp_channel(ch)))
		fail("ibv_destroy_comp_channel", r);
	if ((r = ibv_dealloc_pd(pd)))
		fail("ibv_dealloc_pd", r);
	/* the registered memory is still the program's */
	check("source after deregistration", wsrc, WRITE_LEN, 3);
	check("canary before, at the end", before, CANARY, 1);
	check("canary after, at the end", after, CANARY, 2);
	free(before);
	free(src);
	free(after);
	free(dst);
	free(rbuf);
	if ((r = ibv_close_device(ctx)))
		fail("ibv_close_device", r);
	printf("transfer: ok\n");
	return 0;
}
