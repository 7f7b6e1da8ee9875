/*
 * cm.c: librdmacm's connection manager through a service, both ends in
 * this process on the service's device (its own address, argv[1]):
 * non-blocking and pollable event channels, an ephemeral port known at
 * bind, private data in request, reject and accept, REJECTED for a port
 * nobody listens on, Sends both ways (the responder's first), the
 * addresses, disconnect, IDs destroyed with events still queued, the
 * synchronous calls of an ID without a channel, rdma_getaddrinfo and
 * rdma_event_str. Prints "ok" and exits 0, or says what failed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include "cmtest.h"


static void make_qp(struct end *x)
{
	x->pd = ibv_alloc_pd(x->id->verbs);
	CHECK(x->pd);
	x->cq = ibv_create_cq(x->id->verbs, 16, NULL, NULL, 0);
	CHECK(x->cq);
	struct ibv_qp_init_attr a = {.send_cq = x->cq, .recv_cq = x->cq, .qp_type = IBV_QPT_RC,
				     .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
	CHECK(rdma_create_qp(x->id, x->pd, &a) == 0);
	CHECK(x->id->qp && x->id->qp->state == IBV_QPS_INIT);
	x->mr = ibv_reg_mr(x->pd, x->buf, sizeof(x->buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(x->mr);
	struct ibv_sge sge = {(uintptr_t)x->buf, 128, x->mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1}, *bad;
	CHECK(ibv_post_recv(x->id->qp, &wr, &bad) == 0);
}

static void free_qp(struct end *x)
{
	rdma_destroy_qp(x->id);
	CHECK(ibv_dereg_mr(x->mr) == 0);
	CHECK(ibv_destroy_cq(x->cq) == 0);
	CHECK(ibv_dealloc_pd(x->pd) == 0);
}

static void send_text(struct end *x, const char *text)
{
	size_t n = strlen(text) + 1;
	memcpy(x->buf + 128, text, n);
	struct ibv_sge sge = {(uintptr_t)x->buf + 128, (uint32_t)n, x->mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 2, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED}, *bad;
	CHECK(ibv_post_send(x->id->qp, &wr, &bad) == 0);
}

/* completion waits for the completion wr_id on x's CQ. */
static struct ibv_wc completion(struct end *x, uint64_t wr_id)
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
	CHECK(wc.status == IBV_WC_SUCCESS);
	CHECK(wc.wr_id == wr_id);
	return wc;
}

static void resolve(struct rdma_cm_id *id, struct sockaddr_in *dst)
{
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)dst, 2000) == 0);
	ack(next(RDMA_CM_EVENT_ADDR_RESOLVED, id));
	CHECK(id->verbs);
	/* The device's PD, as librdmacm gives an ID bound to a device. */
	CHECK(id->pd && id->pd->context == id->verbs);
	/* The source is the device's address (dst is the device's own here),
	 * port 0, as the kernel's resolution picks the interface's. */
	const struct sockaddr_in *src = (const struct sockaddr_in *)rdma_get_local_addr(id);
	CHECK(src->sin_family == AF_INET && src->sin_addr.s_addr == dst->sin_addr.s_addr);
	CHECK(rdma_resolve_route(id, 2000) == 0);
	ack(next(RDMA_CM_EVENT_ROUTE_RESOLVED, id));
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: cm ADDR\n");
		return 2;
	}
	struct sockaddr_in me = {.sin_family = AF_INET};
	CHECK(inet_pton(AF_INET, argv[1], &me.sin_addr) == 1);

	CHECK(strcmp(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED") == 0);
	CHECK(strcmp(rdma_event_str((enum rdma_cm_event_type)99), "UNKNOWN EVENT") == 0);

	/* rdma_getaddrinfo */
	struct rdma_addrinfo hints = {.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST, .ai_port_space = RDMA_PS_TCP}, *res;
	CHECK(rdma_getaddrinfo(argv[1], "7000", &hints, &res) == 0);
	CHECK(res->ai_src_addr && !res->ai_dst_addr && res->ai_family == AF_INET && res->ai_qp_type == IBV_QPT_RC);
	CHECK(((struct sockaddr_in *)res->ai_src_addr)->sin_port == htons(7000));
	rdma_freeaddrinfo(res);
	hints.ai_flags = RAI_NUMERICHOST;
	CHECK(rdma_getaddrinfo(argv[1], "7001", &hints, &res) == 0);
	CHECK(res->ai_dst_addr && !res->ai_src_addr && res->ai_port_space == RDMA_PS_TCP);
	rdma_freeaddrinfo(res);
	CHECK(rdma_getaddrinfo("not an address", "1", &hints, &res) != 0);
	/* Without node and service: the hints' addresses (libfabric's use). */
	errno = 0;
	CHECK(rdma_getaddrinfo(NULL, NULL, NULL, &res) == -1 && errno == EINVAL);
	struct sockaddr_in hsrc = me;
	hsrc.sin_port = htons(7002);
	struct rdma_addrinfo h3 = {.ai_flags = RAI_PASSIVE, .ai_src_addr = (struct sockaddr *)&hsrc,
				   .ai_src_len = sizeof(hsrc)};
	CHECK(rdma_getaddrinfo(NULL, NULL, &h3, &res) == 0);
	CHECK(res->ai_src_addr && !res->ai_dst_addr && res->ai_family == AF_INET && res->ai_src_len == sizeof(hsrc));
	CHECK(res->ai_qp_type == IBV_QPT_RC && res->ai_port_space == RDMA_PS_TCP && (res->ai_flags & RAI_PASSIVE));
	CHECK(memcmp(res->ai_src_addr, &hsrc, sizeof(hsrc)) == 0);
	rdma_freeaddrinfo(res);
	struct rdma_addrinfo h4 = {.ai_dst_addr = (struct sockaddr *)&hsrc, .ai_dst_len = sizeof(hsrc)};
	CHECK(rdma_getaddrinfo(NULL, NULL, &h4, &res) == 0);
	CHECK(res->ai_dst_addr && !res->ai_src_addr && res->ai_family == AF_INET);
	rdma_freeaddrinfo(res);
	h4.ai_dst_len = 2; /* shorter than a sockaddr_in */
	errno = 0;
	CHECK(rdma_getaddrinfo(NULL, NULL, &h4, &res) == -1 && errno == EINVAL);
	/* A destination resolved, the source from the hints. */
	struct rdma_addrinfo h5 = {.ai_flags = RAI_NUMERICHOST, .ai_src_addr = (struct sockaddr *)&hsrc,
				   .ai_src_len = sizeof(hsrc)};
	CHECK(rdma_getaddrinfo(argv[1], "7003", &h5, &res) == 0);
	CHECK(res->ai_dst_addr && res->ai_src_addr && ((struct sockaddr_in *)res->ai_src_addr)->sin_port == htons(7002));
	rdma_freeaddrinfo(res);

	/* A non-blocking channel with nothing queued. */
	ch = rdma_create_event_channel();
	CHECK(ch);
	CHECK(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0);
	struct rdma_cm_event *e;
	errno = 0;
	CHECK(rdma_get_cm_event(ch, &e) == -1 && errno == EAGAIN);

	/* A listener on an ephemeral port: known once bound. */
	struct rdma_cm_id *lid;
	CHECK(rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(lid, (struct sockaddr *)&me) == 0);
	uint16_t port = ntohs(rdma_get_src_port(lid));
	CHECK(port != 0);
	CHECK(lid->verbs && lid->pd && lid->pd->context == lid->verbs);
	CHECK(rdma_listen(lid, 4) == 0);
	struct sockaddr_in dst = me;
	dst.sin_port = htons(port);

	/* 1. A request with private data, rejected with private data. */
	struct end c1 = {0};
	CHECK(rdma_create_id(ch, &c1.id, &c1, RDMA_PS_TCP) == 0);
	resolve(c1.id, &dst);
	make_qp(&c1);
	struct rdma_conn_param cp = {.private_data = "request-1", .private_data_len = 10, .responder_resources = 1,
				     .initiator_depth = 1};
	CHECK(rdma_connect(c1.id, &cp) == 0);
	e = next(RDMA_CM_EVENT_CONNECT_REQUEST, NULL);
	CHECK(e->listen_id == lid && e->id != lid && e->id->context == NULL);
	CHECK(e->param.conn.private_data_len >= 10 && memcmp(e->param.conn.private_data, "request-1", 10) == 0);
	CHECK(e->id->verbs && e->id->pd == lid->pd);
	struct rdma_cm_id *r1 = e->id;
	ack(e);
	CHECK(rdma_reject(r1, "no", 3) == 0);
	e = next(RDMA_CM_EVENT_REJECTED, c1.id);
	CHECK(e->status == 28); /* IB_CM_REJ_CONSUMER_DEFINED: the remote application's reject */
	CHECK(e->param.conn.private_data_len >= 3 && memcmp(e->param.conn.private_data, "no", 3) == 0);
	ack(e);
	CHECK(rdma_destroy_id(r1) == 0);
	free_qp(&c1);
	CHECK(rdma_destroy_id(c1.id) == 0);

	/* 2. Accepted with private data; the responder sends first. */
	struct end c2 = {0}, s2 = {0};
	CHECK(rdma_create_id(ch, &c2.id, &c2, RDMA_PS_TCP) == 0);
	resolve(c2.id, &dst);
	make_qp(&c2);
	cp.private_data = "request-2";
	/* The ID's ACK timeout goes to the QP the CM connects (librdmacm's
	 * RTS attributes), as ibv_query_qp then tells. */
	uint8_t tmo = 21;
	CHECK(rdma_set_option(c2.id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &tmo, sizeof(tmo)) == 0);
	CHECK(rdma_connect(c2.id, &cp) == 0);
	e = next(RDMA_CM_EVENT_CONNECT_REQUEST, NULL);
	CHECK(memcmp(e->param.conn.private_data, "request-2", 10) == 0);
	s2.id = e->id;
	s2.id->context = &s2;
	ack(e);
	make_qp(&s2);
	tmo = 17;
	CHECK(rdma_set_option(s2.id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &tmo, sizeof(tmo)) == 0);
	struct ibv_qp_attr ta = {.qp_state = IBV_QPS_RTS};
	int qmask;
	CHECK(rdma_init_qp_attr(s2.id, &ta, &qmask) == 0);
	CHECK((qmask & IBV_QP_TIMEOUT) && ta.timeout == 17);
	struct rdma_conn_param ap = {.private_data = "accepted", .private_data_len = 9, .responder_resources = 1,
				     .initiator_depth = 1};
	CHECK(rdma_accept(s2.id, &ap) == 0);
	for (int established = 0; established < 2; established++) {
		struct pollfd p = {.fd = ch->fd, .events = POLLIN};
		CHECK(poll(&p, 1, 10000) == 1);
		CHECK(rdma_get_cm_event(ch, &e) == 0);
		CHECK(e->event == RDMA_CM_EVENT_ESTABLISHED);
		if (e->id == c2.id)
			CHECK(e->param.conn.private_data_len >= 9 &&
			      memcmp(e->param.conn.private_data, "accepted", 9) == 0);
		else
			CHECK(e->id == s2.id);
		ack(e);
	}
	CHECK(c2.id->qp->state == IBV_QPS_RTS && s2.id->qp->state == IBV_QPS_RTS);
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(c2.id->qp, &ta, IBV_QP_TIMEOUT, &qi) == 0 && ta.timeout == 21);
	CHECK(ibv_query_qp(s2.id->qp, &ta, IBV_QP_TIMEOUT, &qi) == 0 && ta.timeout == 17);
	struct sockaddr_in *cl = (struct sockaddr_in *)rdma_get_local_addr(c2.id);
	struct sockaddr_in *cr = (struct sockaddr_in *)rdma_get_peer_addr(c2.id);
	struct sockaddr_in *sl = (struct sockaddr_in *)rdma_get_local_addr(s2.id);
	struct sockaddr_in *sr = (struct sockaddr_in *)rdma_get_peer_addr(s2.id);
	CHECK(cr->sin_port == htons(port) && cr->sin_addr.s_addr == me.sin_addr.s_addr);
	CHECK(sl->sin_port == htons(port) && sr->sin_port == cl->sin_port && cl->sin_port != 0);
	CHECK(rdma_get_dst_port(c2.id) == htons(port));

	send_text(&s2, "from the responder");
	completion(&s2, 2);
	struct ibv_wc wc = completion(&c2, 1);
	CHECK(wc.byte_len == 19 && strcmp(c2.buf, "from the responder") == 0);
	send_text(&c2, "from the initiator");
	completion(&c2, 2);
	wc = completion(&s2, 1);
	CHECK(wc.byte_len == 19 && strcmp(s2.buf, "from the initiator") == 0);

	CHECK(rdma_disconnect(c2.id) == 0);
	for (int disconnected = 0; disconnected < 2; disconnected++) {
		struct pollfd p = {.fd = ch->fd, .events = POLLIN};
		CHECK(poll(&p, 1, 10000) == 1);
		CHECK(rdma_get_cm_event(ch, &e) == 0);
		CHECK(e->event == RDMA_CM_EVENT_DISCONNECTED && (e->id == c2.id || e->id == s2.id));
		ack(e);
	}
	CHECK(rdma_disconnect(s2.id) == 0); /* the peer's is done already */
	free_qp(&c2);
	free_qp(&s2);
	CHECK(rdma_destroy_id(c2.id) == 0);
	CHECK(rdma_destroy_id(s2.id) == 0);

	/* 3. A request never taken off the channel goes with its listener. */
	struct end c3 = {0};
	CHECK(rdma_create_id(ch, &c3.id, &c3, RDMA_PS_TCP) == 0);
	resolve(c3.id, &dst);
	make_qp(&c3);
	CHECK(rdma_connect(c3.id, NULL) == 0);
	struct pollfd p = {.fd = ch->fd, .events = POLLIN};
	CHECK(poll(&p, 1, 10000) == 1); /* the CONNECT_REQUEST waits */
	CHECK(rdma_destroy_id(lid) == 0);
	e = next(RDMA_CM_EVENT_REJECTED, c3.id);
	ack(e);
	free_qp(&c3);
	CHECK(rdma_destroy_id(c3.id) == 0);

	/* 4. Nobody listens: the connection is refused, without private
	 * data. */
	struct end c4 = {0};
	CHECK(rdma_create_id(ch, &c4.id, &c4, RDMA_PS_TCP) == 0);
	resolve(c4.id, &dst);
	make_qp(&c4);
	CHECK(rdma_connect(c4.id, NULL) == 0);
	e = next(RDMA_CM_EVENT_REJECTED, c4.id);
	CHECK(e->status == -ECONNREFUSED && e->param.conn.private_data_len == 0);
	ack(e);
	free_qp(&c4);
	CHECK(rdma_destroy_id(c4.id) == 0);

	/* 5. An ID destroyed with its events unread. */
	struct rdma_cm_id *id5;
	CHECK(rdma_create_id(ch, &id5, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id5, NULL, (struct sockaddr *)&dst, 2000) == 0);
	CHECK(rdma_destroy_id(id5) == 0);
	errno = 0;
	CHECK(rdma_get_cm_event(ch, &e) == -1 && errno == EAGAIN);

	/* 6. Synchronous IDs (no channel): a refused connect fails at once. */
	struct rdma_addrinfo h2 = {.ai_flags = RAI_NUMERICHOST, .ai_port_space = RDMA_PS_TCP};
	char ps[8];
	snprintf(ps, sizeof(ps), "%u", port);
	CHECK(rdma_getaddrinfo(argv[1], ps, &h2, &res) == 0);
	struct ibv_qp_init_attr qa = {.cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
	struct rdma_cm_id *sid;
	CHECK(rdma_create_ep(&sid, res, NULL, &qa) == 0);
	CHECK(sid->qp && sid->send_cq && sid->recv_cq && sid->send_cq_channel);
	errno = 0;
	CHECK(rdma_connect(sid, NULL) == -1 && errno == ECONNREFUSED);
	rdma_destroy_ep(sid);
	rdma_freeaddrinfo(res);

	rdma_destroy_event_channel(ch);
	printf("ok\n");
	return 0;
}
