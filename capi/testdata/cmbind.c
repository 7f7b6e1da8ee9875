/*
 * cmbind.c: what librdmacm's CM adds on the service (protocol feature CM),
 * both ends in this process on the service's device (its own address,
 * argv[1]): connecting from a port chosen with rdma_bind_addr, and from the
 * port the service picked for a bind to port 0 (rdma_get_src_port knows it
 * before the connection, and the peer sees it); ibv_modify_qp to
 * IBV_QPS_ERR flushing a QP's receives; DISCONNECTED's status after a
 * graceful close (0) and after a reset (-ECONNRESET). Prints "ok" and
 * exits 0, or says what failed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include "cmtest.h"


/* make_qp gives x a QP with three receives posted (WR IDs 1 to 3). */
static void make_qp(struct end *x)
{
	x->pd = ibv_alloc_pd(x->id->verbs);
	CHECK(x->pd);
	x->cq = ibv_create_cq(x->id->verbs, 16, NULL, NULL, 0);
	CHECK(x->cq);
	struct ibv_qp_init_attr a = {.send_cq = x->cq, .recv_cq = x->cq, .qp_type = IBV_QPT_RC,
				     .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
	CHECK(rdma_create_qp(x->id, x->pd, &a) == 0);
	x->mr = ibv_reg_mr(x->pd, x->buf, sizeof(x->buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(x->mr);
	for (uint64_t i = 1; i <= 3; i++) {
		struct ibv_sge sge = {(uintptr_t)x->buf + 64 * (i - 1), 64, x->mr->lkey};
		struct ibv_recv_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = 1}, *bad;
		CHECK(ibv_post_recv(x->id->qp, &wr, &bad) == 0);
	}
}

static void free_qp(struct end *x)
{
	rdma_destroy_qp(x->id);
	CHECK(ibv_dereg_mr(x->mr) == 0);
	CHECK(ibv_destroy_cq(x->cq) == 0);
	CHECK(ibv_dealloc_pd(x->pd) == 0);
}

/* flushed waits for n completions on x's CQ, each flushed. */
static void flushed(struct end *x, int n)
{
	for (int got = 0; got < n;) {
		struct ibv_wc wc;
		int r;
		for (long i = 0; (r = ibv_poll_cq(x->cq, 1, &wc)) == 0; i++) {
			CHECK(i < 100000000);
			if (i > 1000)
				usleep(10);
		}
		CHECK(r == 1);
		CHECK(wc.status == IBV_WC_WR_FLUSH_ERR && wc.opcode == IBV_WC_RECV);
		got++;
	}
}

/* connect_from connects a new ID bound to src (port 0: the service picks)
 * to dst, the listener lid accepting; it returns both ends connected. */
static void connect_from(struct sockaddr_in *src, struct sockaddr_in *dst, struct end *c, struct end *s)
{
	CHECK(rdma_create_id(ch, &c->id, c, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(c->id, (struct sockaddr *)src) == 0);
	uint16_t port = ntohs(rdma_get_src_port(c->id));
	CHECK(port != 0 && (src->sin_port == 0 || port == ntohs(src->sin_port)));
	CHECK(rdma_resolve_addr(c->id, NULL, (struct sockaddr *)dst, 2000) == 0);
	ack(next(RDMA_CM_EVENT_ADDR_RESOLVED, c->id));
	CHECK(rdma_resolve_route(c->id, 2000) == 0);
	ack(next(RDMA_CM_EVENT_ROUTE_RESOLVED, c->id));
	make_qp(c);
	CHECK(rdma_connect(c->id, NULL) == 0);
	struct rdma_cm_event *e = next(RDMA_CM_EVENT_CONNECT_REQUEST, NULL);
	s->id = e->id;
	s->id->context = s;
	/* The peer sees the connection come from the bound port. */
	CHECK(ntohs(((struct sockaddr_in *)rdma_get_peer_addr(s->id))->sin_port) == port);
	ack(e);
	make_qp(s);
	CHECK(rdma_accept(s->id, NULL) == 0);
	for (int established = 0; established < 2; established++) {
		e = next(RDMA_CM_EVENT_ESTABLISHED, NULL);
		CHECK(e->id == c->id || e->id == s->id);
		ack(e);
	}
	CHECK(ntohs(rdma_get_src_port(c->id)) == port);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: cmbind ADDR\n");
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

	/* 1. From a chosen port; a graceful disconnect's status is 0. */
	struct sockaddr_in src = me;
	src.sin_port = htons(31415);
	struct end c1 = {0}, s1 = {0};
	connect_from(&src, &dst, &c1, &s1);
	CHECK(rdma_disconnect(c1.id) == 0);
	for (int i = 0; i < 2; i++) {
		struct rdma_cm_event *e = next(RDMA_CM_EVENT_DISCONNECTED, NULL);
		CHECK(e->status == 0);
		ack(e);
	}
	flushed(&c1, 3);
	flushed(&s1, 3);
	free_qp(&c1);
	free_qp(&s1);
	CHECK(rdma_destroy_id(c1.id) == 0);
	CHECK(rdma_destroy_id(s1.id) == 0);

	/* 2. From the port the service picked at bind (port 0); the peer's
	 * QP destroyed without a disconnect resets the connection: status
	 * -ECONNRESET. */
	src.sin_port = 0;
	struct end c2 = {0}, s2 = {0};
	connect_from(&src, &dst, &c2, &s2);
	free_qp(&s2);
	for (;;) { /* s2's own DISCONNECTED may come first */
		struct rdma_cm_event *e = next(RDMA_CM_EVENT_DISCONNECTED, NULL);
		struct rdma_cm_id *id = e->id;
		int st = e->status;
		ack(e);
		if (id == c2.id) {
			CHECK(st == -ECONNRESET);
			break;
		}
		CHECK(id == s2.id);
	}
	flushed(&c2, 3);
	free_qp(&c2);
	CHECK(rdma_destroy_id(c2.id) == 0);
	CHECK(rdma_destroy_id(s2.id) == 0);

	/* 3. ibv_modify_qp to ERR flushes a QP that never connected. */
	struct end c3 = {0};
	CHECK(rdma_create_id(ch, &c3.id, &c3, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(c3.id, NULL, (struct sockaddr *)&dst, 2000) == 0);
	ack(next(RDMA_CM_EVENT_ADDR_RESOLVED, c3.id));
	make_qp(&c3);
	struct ibv_qp_attr qa = {.qp_state = IBV_QPS_ERR};
	CHECK(ibv_modify_qp(c3.id->qp, &qa, IBV_QP_STATE) == 0);
	CHECK(c3.id->qp->state == IBV_QPS_ERR);
	flushed(&c3, 3);
	free_qp(&c3);
	CHECK(rdma_destroy_id(c3.id) == 0);

	CHECK(rdma_destroy_id(lid) == 0);
	rdma_destroy_event_channel(ch);
	printf("ok\n");
	return 0;
}
