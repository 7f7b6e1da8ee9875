/*
 * killed.c: a program with a connection, QPs, CQs, a completion channel
 * and MRs, for TestKilledProgram. It connects through librdmacm to
 * argv[2] ("IP:PORT"), whose accept carries the peer's buffer (address,
 * rkey and length, 16 bytes little endian).
 *
 *   killed stream PEER     RDMA Writes into the peer's buffer, 16 at a
 *                          time, forever; prints "streaming" once 64
 *                          completed (the test kills it).
 *   killed bystander PEER  prints "connected", waits for a line on
 *                          stdin, then RDMA Writes its pattern into the
 *                          peer's buffer and Sends 4 bytes; prints
 *                          "bystander: ok" once both completed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define CHECK(c)                                                                                  \
	do {                                                                                     \
		if (!(c)) {                                                                      \
			fprintf(stderr, "killed:%d: %s failed (errno %d: %s)\n", __LINE__, #c, errno, \
				strerror(errno));                                                \
			exit(1);                                                                 \
		}                                                                                \
	} while (0)

enum { CHUNK = 65536, DEPTH = 16, BYSTANDER_LEN = 65536 + 123 };

static struct rdma_event_channel *ch;

static struct rdma_cm_event *next_event(enum rdma_cm_event_type want)
{
	struct pollfd p = {.fd = ch->fd, .events = POLLIN};
	struct rdma_cm_event *e;
	CHECK(poll(&p, 1, 10000) == 1);
	CHECK(rdma_get_cm_event(ch, &e) == 0);
	if (e->event != want) {
		fprintf(stderr, "killed: event %s (status %d), want %s\n", rdma_event_str(e->event), e->status,
			rdma_event_str(want));
		exit(1);
	}
	return e;
}

static struct ibv_wc wait_wc(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0);
		if (n == 1)
			break;
	}
	if (wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "killed: completion %llu: %s\n", (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
		exit(1);
	}
	return wc;
}

int main(int argc, char **argv)
{
	if (argc != 3 || (strcmp(argv[1], "stream") && strcmp(argv[1], "bystander"))) {
		fprintf(stderr, "usage: killed stream|bystander IP:PORT\n");
		return 2;
	}
	int stream = strcmp(argv[1], "stream") == 0;
	char host[64];
	snprintf(host, sizeof(host), "%s", argv[2]);
	char *colon = strrchr(host, ':');
	CHECK(colon);
	*colon = 0;
	struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
	CHECK(inet_pton(AF_INET, host, &dst.sin_addr) == 1);

	ch = rdma_create_event_channel();
	CHECK(ch);
	struct rdma_cm_id *id;
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0);
	rdma_ack_cm_event(next_event(RDMA_CM_EVENT_ADDR_RESOLVED));
	CHECK(rdma_resolve_route(id, 2000) == 0);
	rdma_ack_cm_event(next_event(RDMA_CM_EVENT_ROUTE_RESOLVED));

	struct ibv_pd *pd = ibv_alloc_pd(id->verbs);
	CHECK(pd);
	struct ibv_comp_channel *cc = ibv_create_comp_channel(id->verbs);
	CHECK(cc);
	struct ibv_cq *scq = ibv_create_cq(id->verbs, 2 * DEPTH, NULL, cc, 0);
	struct ibv_cq *rcq = ibv_create_cq(id->verbs, 4, NULL, NULL, 0);
	CHECK(scq && rcq);
	CHECK(ibv_req_notify_cq(scq, 0) == 0);
	struct ibv_qp_init_attr qa = {.send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = DEPTH, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1}};
	CHECK(rdma_create_qp(id, pd, &qa) == 0);
	size_t len = stream ? (size_t)DEPTH * CHUNK : BYSTANDER_LEN + 4;
	uint8_t *buf = malloc(len);
	uint8_t *spare = malloc(1 << 20); /* one more MR for the service to release */
	CHECK(buf && spare);
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(i * 7 + 11);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *smr = ibv_reg_mr(pd, spare, 1 << 20, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(mr && smr);
	struct ibv_sge rsge = {(uintptr_t)spare, 4096, smr->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 100, .sg_list = &rsge, .num_sge = 1}, *rbad;
	CHECK(ibv_post_recv(id->qp, &rwr, &rbad) == 0);

	struct rdma_conn_param cp = {.responder_resources = 1, .initiator_depth = 1};
	CHECK(rdma_connect(id, &cp) == 0);
	struct rdma_cm_event *e = next_event(RDMA_CM_EVENT_ESTABLISHED);
	CHECK(e->param.conn.private_data_len >= 16);
	uint64_t raddr;
	uint32_t rkey, rlen;
	memcpy(&raddr, e->param.conn.private_data, 8);
	memcpy(&rkey, (const uint8_t *)e->param.conn.private_data + 8, 4);
	memcpy(&rlen, (const uint8_t *)e->param.conn.private_data + 12, 4);
	rdma_ack_cm_event(e);

	if (!stream) {
		CHECK(rlen >= BYSTANDER_LEN);
		printf("connected\n");
		fflush(stdout);
		char line[16];
		CHECK(fgets(line, sizeof(line), stdin) != NULL);
		struct ibv_sge s = {(uintptr_t)buf, BYSTANDER_LEN, mr->lkey};
		struct ibv_send_wr w = {.wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
					.send_flags = IBV_SEND_SIGNALED, .wr.rdma = {.remote_addr = raddr, .rkey = rkey}}, *bad;
		CHECK(ibv_post_send(id->qp, &w, &bad) == 0);
		memcpy(buf + BYSTANDER_LEN, "done", 4);
		struct ibv_sge s2 = {(uintptr_t)buf + BYSTANDER_LEN, 4, mr->lkey};
		struct ibv_send_wr w2 = {.wr_id = 2, .sg_list = &s2, .num_sge = 1, .opcode = IBV_WR_SEND,
					 .send_flags = IBV_SEND_SIGNALED}, *bad2;
		CHECK(ibv_post_send(id->qp, &w2, &bad2) == 0);
		CHECK(wait_wc(scq).wr_id == 1);
		CHECK(wait_wc(scq).wr_id == 2);
		printf("bystander: ok\n");
		return 0;
	}

	/* Stream: keep DEPTH writes in flight, forever. */
	CHECK(rlen >= CHUNK);
	long done = 0;
	for (int i = 0; i < DEPTH; i++) {
		struct ibv_sge s = {(uintptr_t)buf + (size_t)i * CHUNK, CHUNK, mr->lkey};
		struct ibv_send_wr w = {.wr_id = (uint64_t)i, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
					.send_flags = IBV_SEND_SIGNALED, .wr.rdma = {.remote_addr = raddr, .rkey = rkey}}, *bad;
		CHECK(ibv_post_send(id->qp, &w, &bad) == 0);
	}
	for (;;) {
		struct ibv_wc wc = wait_wc(scq);
		if (++done == 64) {
			printf("streaming\n");
			fflush(stdout);
		}
		struct ibv_sge s = {(uintptr_t)buf + (size_t)wc.wr_id * CHUNK, CHUNK, mr->lkey};
		struct ibv_send_wr w = {.wr_id = wc.wr_id, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
					.send_flags = IBV_SEND_SIGNALED, .wr.rdma = {.remote_addr = raddr, .rkey = rkey}}, *bad;
		CHECK(ibv_post_send(id->qp, &w, &bad) == 0);
	}
}
