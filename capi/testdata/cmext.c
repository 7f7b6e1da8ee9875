/*
 * cmext.c: connections of QPs made outside the CM, as librdmacm documents
 * them (rdma_init_qp_attr, conn_param->qp_num, CONNECT_RESPONSE and
 * rdma_establish), both ends in this process on the service's device (its
 * own address, argv[1]), as rdma-core's own test of it (pyverbs'
 * test_rdmacm_async_traffic_external_qp) does: each end creates a CQ and a
 * QP on cm_id->pd with ibv_create_qp, moves it with rdma_init_qp_attr's
 * attributes for INIT, RTR and RTS, and names it in conn_param; the
 * active end gets CONNECT_RESPONSE and calls rdma_establish; then a Send
 * each way. Prints "ok" and exits 0, or says what failed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include "cmtest.h"

struct xend {
	struct rdma_cm_id *id;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char buf[256];
};

/* make_qp gives x a QP of its own on its ID's PD (the device's), moved
 * as rdma_init_qp_attr says for INIT, RTR and RTS. */
static void make_qp(struct xend *x)
{
	CHECK(x->id->verbs && x->id->pd);
	x->cq = ibv_create_cq(x->id->verbs, 8, NULL, NULL, 0);
	CHECK(x->cq);
	struct ibv_qp_init_attr a = {.send_cq = x->cq, .recv_cq = x->cq, .qp_type = IBV_QPT_RC,
				     .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
	x->qp = ibv_create_qp(x->id->pd, &a);
	CHECK(x->qp);
	x->mr = ibv_reg_mr(x->id->pd, x->buf, sizeof(x->buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(x->mr);
}

static void to_rts(struct xend *x)
{
	enum ibv_qp_state states[] = {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS};
	for (int i = 0; i < 3; i++) {
		struct ibv_qp_attr qa = {.qp_state = states[i]};
		int mask;
		CHECK(rdma_init_qp_attr(x->id, &qa, &mask) == 0);
		CHECK(ibv_modify_qp(x->qp, &qa, mask) == 0);
	}
}

static void post_recv(struct xend *x)
{
	struct ibv_sge sge = {(uintptr_t)x->buf, 128, x->mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1}, *bad;
	CHECK(ibv_post_recv(x->qp, &wr, &bad) == 0);
}

static void send_text(struct xend *x, const char *text)
{
	size_t n = strlen(text) + 1;
	memcpy(x->buf + 128, text, n);
	struct ibv_sge sge = {(uintptr_t)x->buf + 128, (uint32_t)n, x->mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 2, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED}, *bad;
	CHECK(ibv_post_send(x->qp, &wr, &bad) == 0);
}

static struct ibv_wc completion(struct xend *x, uint64_t wr_id)
{
	struct ibv_wc wc;
	for (long i = 0;; i++) {
		int n = ibv_poll_cq(x->cq, 1, &wc);
		CHECK(n >= 0);
		if (n == 1)
			break;
		CHECK(i < 100000000);
		if (i > 1000)
			usleep(10);
	}
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != wr_id)
		fprintf(stderr, "completion %llu: %s\n", (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
	CHECK(wc.status == IBV_WC_SUCCESS);
	CHECK(wc.wr_id == wr_id);
	return wc;
}

static void free_end(struct xend *x)
{
	CHECK(ibv_destroy_qp(x->qp) == 0);
	CHECK(ibv_dereg_mr(x->mr) == 0);
	CHECK(ibv_destroy_cq(x->cq) == 0);
	CHECK(rdma_destroy_id(x->id) == 0);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: cmext ADDR\n");
		return 2;
	}
	struct sockaddr_in me = {.sin_family = AF_INET};
	CHECK(inet_pton(AF_INET, argv[1], &me.sin_addr) == 1);
	ch = rdma_create_event_channel();
	CHECK(ch);

	struct rdma_cm_id *lid;
	CHECK(rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(lid, (struct sockaddr *)&me) == 0);
	CHECK(rdma_listen(lid, 4) == 0);
	struct sockaddr_in dst = me;
	dst.sin_port = rdma_get_src_port(lid);

	struct xend c = {0}, s = {0};
	CHECK(rdma_create_id(ch, &c.id, &c, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(c.id, NULL, (struct sockaddr *)&dst, 2000) == 0);
	ack(next(RDMA_CM_EVENT_ADDR_RESOLVED, c.id));
	CHECK(rdma_resolve_route(c.id, 2000) == 0);
	ack(next(RDMA_CM_EVENT_ROUTE_RESOLVED, c.id));
	make_qp(&c);
	/* Before the connection: INIT is the program's to make, RTR and RTS
	 * the CM's (the mask leaves the state out). */
	struct ibv_qp_attr qa = {.qp_state = IBV_QPS_INIT};
	int mask;
	CHECK(rdma_init_qp_attr(c.id, &qa, &mask) == 0 && (mask & IBV_QP_STATE));
	CHECK(ibv_modify_qp(c.qp, &qa, mask) == 0);
	qa.qp_state = IBV_QPS_RTS;
	CHECK(rdma_init_qp_attr(c.id, &qa, &mask) == 0 && !(mask & IBV_QP_STATE));
	struct rdma_conn_param cp = {.qp_num = c.qp->qp_num, .responder_resources = 1, .initiator_depth = 1};
	errno = 0;
	CHECK(rdma_establish(c.id) == -1 && errno == EINVAL); /* nothing to acknowledge yet */
	CHECK(rdma_connect(c.id, &cp) == 0);

	struct rdma_cm_event *e = next(RDMA_CM_EVENT_CONNECT_REQUEST, NULL);
	s.id = e->id;
	ack(e);
	CHECK(s.id->pd == lid->pd);
	make_qp(&s);
	to_rts(&s);
	CHECK(rdma_accept(s.id, &(struct rdma_conn_param){.qp_num = s.qp->qp_num}) == 0);
	CHECK(!s.id->qp && !c.id->qp);

	/* The passive end's ESTABLISHED, the active end's CONNECT_RESPONSE:
	 * their order is the service's. */
	for (int got = 0; got < 2; got++) {
		CHECK(rdma_get_cm_event(ch, &e) == 0);
		if (e->id == c.id) {
			CHECK(e->event == RDMA_CM_EVENT_CONNECT_RESPONSE && e->status == 0);
			CHECK(e->param.conn.qp_num == c.qp->qp_num);
		} else {
			CHECK(e->id == s.id && e->event == RDMA_CM_EVENT_ESTABLISHED && e->status == 0);
		}
		ack(e);
	}
	to_rts(&c);
	CHECK(rdma_establish(c.id) == 0);
	errno = 0;
	CHECK(rdma_establish(c.id) == -1 && errno == EINVAL); /* acknowledged already */

	post_recv(&s);
	send_text(&c, "from the initiator");
	completion(&c, 2);
	struct ibv_wc wc = completion(&s, 1);
	CHECK(wc.byte_len == 19 && strcmp(s.buf, "from the initiator") == 0);
	post_recv(&c);
	send_text(&s, "from the responder");
	completion(&s, 2);
	wc = completion(&c, 1);
	CHECK(wc.byte_len == 19 && strcmp(c.buf, "from the responder") == 0);

	CHECK(rdma_disconnect(s.id) == 0);
	for (int got = 0; got < 2; got++) {
		CHECK(rdma_get_cm_event(ch, &e) == 0);
		CHECK(e->event == RDMA_CM_EVENT_DISCONNECTED && (e->id == c.id || e->id == s.id));
		ack(e);
	}
	free_end(&c);
	free_end(&s);
	CHECK(rdma_destroy_id(lid) == 0);
	rdma_destroy_event_channel(ch);
	printf("ok\n");
	return 0;
}
