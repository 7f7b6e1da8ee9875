/*
 * badargs.c: bad arguments to libibverbs and librdmacm through a service
 * (the service's own address is argv[1]). Every case gets the errno (or
 * return value, or completion status) the reference gives, and no case
 * crashes, hangs or leaves an object unusable. Each case names what
 * rdma-core's libibverbs and librdmacm, the kernel's verbs and CM and its
 * siw driver do with it ("ref:"); where rdmatap differs on purpose it
 * says why.
 *
 * Undefined behaviour in the reference (freed objects, a pointer the
 * library never handed out used as one of its objects, an event
 * acknowledged twice) is left out.
 *
 * Prints one line per failed case and "badargs: N cases ok" when all
 * passed; exits 1 when any failed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

static int cases, failed;

/* CASE records one case: cond must hold. */
#define CASE(name, cond) case_at(__LINE__, name, (cond))
static void case_at(int line, const char *name, int ok)
{
	cases++;
	if (!ok) {
		failed++;
		fprintf(stderr, "badargs:%d: %s: FAILED (errno %d: %s)\n", line, name, errno, strerror(errno));
	}
}

/* MUST stops the program: what follows depends on it. */
#define MUST(c)                                                                                    \
	do {                                                                                       \
		if (!(c)) {                                                                        \
			fprintf(stderr, "badargs:%d: %s failed (errno %d: %s)\n", __LINE__, #c, errno, \
				strerror(errno));                                                  \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

/* NULL_ERRNO: a constructor returned NULL with errno e. */
#define NULL_ERRNO(name, call, e)                       \
	do {                                            \
		errno = 0;                              \
		void *p_ = (void *)(call);              \
		CASE(name, p_ == NULL && errno == (e)); \
	} while (0)

/* RC_ERRNO: a call returning -1 and errno (librdmacm's, ibv_query_gid's). */
#define RC_ERRNO(name, call, e)                      \
	do {                                         \
		errno = 0;                           \
		int r_ = (call);                     \
		CASE(name, r_ == -1 && errno == (e)); \
	} while (0)

static struct ibv_context *ctx;
static struct ibv_device_attr dattr;
static struct sockaddr_in me;
static struct rdma_event_channel *ch;

/* ---- a connection in this process, for the data path's cases ---- */

struct end {
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	uint8_t *buf; /* 64 KiB */
};

struct pair {
	struct rdma_cm_id *lid;
	struct end a, p; /* active and passive */
	uint8_t rpdata[255], apdata[255]; /* private data the ends got */
};

static struct rdma_cm_event *next_event(enum rdma_cm_event_type want)
{
	struct pollfd pf = {.fd = ch->fd, .events = POLLIN};
	struct rdma_cm_event *e;
	MUST(poll(&pf, 1, 10000) == 1);
	MUST(rdma_get_cm_event(ch, &e) == 0);
	if (e->event != want) {
		fprintf(stderr, "badargs: event %s (status %d), want %s\n", rdma_event_str(e->event), e->status,
			rdma_event_str(want));
		exit(1);
	}
	return e;
}

static void end_qp(struct end *x, struct ibv_pd *pd)
{
	x->pd = pd;
	x->cq = ibv_create_cq(x->id->verbs, 64, NULL, NULL, 0);
	MUST(x->cq);
	struct ibv_qp_init_attr a = {.send_cq = x->cq, .recv_cq = x->cq, .qp_type = IBV_QPT_RC,
				     .cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 2, .max_recv_sge = 2}};
	MUST(rdma_create_qp(x->id, pd, &a) == 0);
	x->buf = malloc(65536);
	MUST(x->buf);
	memset(x->buf, 0, 65536);
	x->mr = ibv_reg_mr(pd, x->buf, 65536, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	MUST(x->mr);
}

/* connect makes a connected pair of QPs, the private data of 255 bytes
 * each way (the most rdma_conn_param can carry). */
static void connect_pair(struct pair *c, struct ibv_pd *pd)
{
	memset(c, 0, sizeof(*c));
	MUST(rdma_create_id(ch, &c->lid, NULL, RDMA_PS_TCP) == 0);
	struct sockaddr_in a = me;
	MUST(rdma_bind_addr(c->lid, (struct sockaddr *)&a) == 0);
	MUST(rdma_listen(c->lid, 1) == 0);
	struct sockaddr_in dst = me;
	dst.sin_port = rdma_get_src_port(c->lid);
	MUST(rdma_create_id(ch, &c->a.id, NULL, RDMA_PS_TCP) == 0);
	MUST(rdma_resolve_addr(c->a.id, NULL, (struct sockaddr *)&dst, 2000) == 0);
	rdma_ack_cm_event(next_event(RDMA_CM_EVENT_ADDR_RESOLVED));
	MUST(rdma_resolve_route(c->a.id, 2000) == 0);
	rdma_ack_cm_event(next_event(RDMA_CM_EVENT_ROUTE_RESOLVED));
	end_qp(&c->a, pd);
	uint8_t req[255], rep[255];
	for (int i = 0; i < 255; i++) {
		req[i] = (uint8_t)(i * 3 + 1);
		rep[i] = (uint8_t)(i * 5 + 2);
	}
	struct rdma_conn_param cp = {.private_data = req, .private_data_len = 255, .responder_resources = 1,
				     .initiator_depth = 1};
	MUST(rdma_connect(c->a.id, &cp) == 0);
	struct rdma_cm_event *e = next_event(RDMA_CM_EVENT_CONNECT_REQUEST);
	c->p.id = e->id;
	MUST(e->param.conn.private_data_len >= 255);
	memcpy(c->rpdata, e->param.conn.private_data, 255);
	rdma_ack_cm_event(e);
	end_qp(&c->p, pd);
	struct rdma_conn_param ap = {.private_data = rep, .private_data_len = 255, .responder_resources = 1,
				     .initiator_depth = 1};
	MUST(rdma_accept(c->p.id, &ap) == 0);
	for (int n = 0; n < 2; n++) {
		e = next_event(RDMA_CM_EVENT_ESTABLISHED);
		if (e->id == c->a.id) {
			MUST(e->param.conn.private_data_len >= 255);
			memcpy(c->apdata, e->param.conn.private_data, 255);
		}
		rdma_ack_cm_event(e);
	}
}

static void close_end(struct end *x)
{
	if (x->id->qp)
		rdma_destroy_qp(x->id);
	MUST(ibv_destroy_cq(x->cq) == 0);
	if (x->mr)
		MUST(ibv_dereg_mr(x->mr) == 0);
	free(x->buf);
	MUST(rdma_destroy_id(x->id) == 0);
}

/* close_pair disconnects (if still connected) and frees both ends,
 * taking whatever events the pair has left on the channel. */
static void close_pair(struct pair *c)
{
	rdma_disconnect(c->a.id);
	int fl = fcntl(ch->fd, F_GETFL);
	for (int got = 0; got < 2;) {
		struct pollfd pf = {.fd = ch->fd, .events = POLLIN};
		if (poll(&pf, 1, 10000) != 1)
			break;
		struct rdma_cm_event *e;
		fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK);
		int r = rdma_get_cm_event(ch, &e);
		fcntl(ch->fd, F_SETFL, fl);
		if (r)
			continue;
		if (e->event == RDMA_CM_EVENT_DISCONNECTED)
			got++;
		rdma_ack_cm_event(e);
	}
	close_end(&c->a);
	close_end(&c->p);
	MUST(rdma_destroy_id(c->lid) == 0);
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* placed waits (10 s at most) for want's n bytes at p: an RDMA Write's
 * completion at the initiator says nothing of its placement. */
static int placed(const volatile uint8_t *p, const char *want, size_t n)
{
	for (double end = now() + 10; now() < end;) {
		size_t k = 0;
		while (k < n && p[k] == (uint8_t)want[k])
			k++;
		if (k == n)
			return 1;
		usleep(10);
	}
	return 0;
}

/* wait_wc polls cq for one completion (10 s at most). */
static int wait_wc(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (double end = now() + 10; now() < end;) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n;
		usleep(10);
	}
	return 0;
}

/* ctx_async_fd is the asynchronous event descriptor of librdmacm's
 * context of the device. */
static struct ibv_context *cm_ctx;
static int ctx_async_fd(void) { return cm_ctx->async_fd; }

static void sge_to(struct ibv_sge *s, struct end *x, size_t off, uint32_t len)
{
	s->addr = (uintptr_t)x->buf + off;
	s->length = len;
	s->lkey = x->mr->lkey;
}

/* ---- libibverbs ---- */

static void device_cases(struct ibv_device *dev)
{
	/* ref: rdma-core takes any pointer for one of its devices (a pointer
	 * it never listed is undefined behaviour); rdmatap knows its one
	 * device and answers ENODEV for any other. */
	struct ibv_device bogus;
	memcpy(&bogus, dev, sizeof(bogus));
	NULL_ERRNO("ibv_open_device of a device not listed", ibv_open_device(&bogus), ENODEV);
	NULL_ERRNO("ibv_open_device(NULL)", ibv_open_device(NULL), ENODEV);

	/* ref: the kernel's rdma_is_port_valid: EINVAL for a port not 1. */
	struct ibv_port_attr pa;
	CASE("ibv_query_port port 0: EINVAL", ibv_query_port(ctx, 0, &pa) == EINVAL);
	CASE("ibv_query_port port 2: EINVAL", ibv_query_port(ctx, 2, &pa) == EINVAL);
	CASE("ibv_query_port port 1", ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE);

	/* ref: ibv_query_gid returns -1 (the kernel's rdma_get_gid_attr:
	 * EINVAL beyond siw's table of one GID or on another port). */
	union ibv_gid gid;
	RC_ERRNO("ibv_query_gid index 1", ibv_query_gid(ctx, 1, 1, &gid), EINVAL);
	RC_ERRNO("ibv_query_gid index -1", ibv_query_gid(ctx, 1, -1, &gid), EINVAL);
	RC_ERRNO("ibv_query_gid port 2", ibv_query_gid(ctx, 2, 0, &gid), EINVAL);
	CASE("ibv_query_gid index 0", ibv_query_gid(ctx, 1, 0, &gid) == 0);
	/* ref: ibv_query_pkey reads ports/P/pkeys/I in sysfs: -1 (ENOENT)
	 * for an index beyond the table of one. */
	__be16 pkey;
	CASE("ibv_query_pkey index 1: -1", ibv_query_pkey(ctx, 1, 1, &pkey) == -1);
	CASE("ibv_query_pkey port 0: -1", ibv_query_pkey(ctx, 0, 0, &pkey) == -1);
	CASE("ibv_query_pkey index 0", ibv_query_pkey(ctx, 1, 0, &pkey) == 0);
}

static void mr_cases(struct ibv_pd *pd)
{
	uint8_t *heap = malloc(8192);
	MUST(heap);
	/* ref: siw_reg_user_mr: EINVAL for length 0. */
	NULL_ERRNO("ibv_reg_mr of 0 bytes", ibv_reg_mr(pd, heap, 0, IBV_ACCESS_LOCAL_WRITE), EINVAL);
	/* ref: siw_umem_get cannot pin page 0: EFAULT. */
	NULL_ERRNO("ibv_reg_mr at NULL", ibv_reg_mr(pd, NULL, 4096, IBV_ACCESS_LOCAL_WRITE), EFAULT);
	/* ref: pinning an unmapped page: EFAULT. The range lies low in the
	 * address space, where the kernel places no mapping it chooses
	 * itself: the hole stays one (a sanitizer's allocator would fill a
	 * hole among its own mappings). */
	uint8_t *m = mmap((void *)0x30000000, 3 * 4096, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	MUST(m == (void *)0x30000000);
	MUST(munmap(m + 4096, 4096) == 0);
	NULL_ERRNO("ibv_reg_mr over a hole", ibv_reg_mr(pd, m, 3 * 4096, IBV_ACCESS_LOCAL_WRITE), EFAULT);
	NULL_ERRNO("ibv_reg_mr of unmapped memory", ibv_reg_mr(pd, m + 4096, 4096, IBV_ACCESS_LOCAL_WRITE), EFAULT);
	munmap(m, 4096);
	munmap(m + 2 * 4096, 4096);
	/* ref: siw_umem_get pins with FOLL_WRITE when the access lets the MR
	 * be written (ib_access_writable: local or remote write, atomics,
	 * window binding): read-only memory is EFAULT then; memory the
	 * program cannot read is EFAULT always. */
	uint8_t *ro = mmap(NULL, 2 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	MUST(ro != MAP_FAILED);
	memset(ro, 0x5c, 4096);
	MUST(mprotect(ro, 4096, PROT_READ) == 0);
	MUST(mprotect(ro + 4096, 4096, PROT_NONE) == 0);
	NULL_ERRNO("ibv_reg_mr LOCAL_WRITE of read-only memory", ibv_reg_mr(pd, ro, 4096, IBV_ACCESS_LOCAL_WRITE), EFAULT);
	NULL_ERRNO("ibv_reg_mr MW_BIND of read-only memory", ibv_reg_mr(pd, ro, 4096, IBV_ACCESS_MW_BIND), EFAULT);
	NULL_ERRNO("ibv_reg_mr of PROT_NONE memory", ibv_reg_mr(pd, ro + 4096, 4096, IBV_ACCESS_REMOTE_READ), EFAULT);
	static const char text[] = "a constant";
	NULL_ERRNO("ibv_reg_mr REMOTE_WRITE of a constant", ibv_reg_mr(pd, (void *)text, sizeof(text), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE), EFAULT);
	struct ibv_mr *romr = ibv_reg_mr(pd, ro, 4096, IBV_ACCESS_REMOTE_READ);
	CASE("ibv_reg_mr REMOTE_READ of read-only memory", romr != NULL);
	CASE("... keeps its contents", ro[0] == 0x5c && ro[4095] == 0x5c);
	if (romr)
		CASE("... ibv_dereg_mr", ibv_dereg_mr(romr) == 0);
	munmap(ro, 2 * 4096);
	/* ref: the kernel's ib_check_mr_access: remote write or atomic
	 * without local write, and unknown bits, are EINVAL; on-demand
	 * paging on a device without it EOPNOTSUPP. */
	NULL_ERRNO("ibv_reg_mr REMOTE_WRITE without LOCAL_WRITE", ibv_reg_mr(pd, heap, 100, IBV_ACCESS_REMOTE_WRITE), EINVAL);
	NULL_ERRNO("ibv_reg_mr REMOTE_ATOMIC without LOCAL_WRITE", ibv_reg_mr(pd, heap, 100, IBV_ACCESS_REMOTE_ATOMIC), EINVAL);
	NULL_ERRNO("ibv_reg_mr of an unknown access bit", ibv_reg_mr(pd, heap, 100, IBV_ACCESS_LOCAL_WRITE | (1 << 12)), EINVAL);
	NULL_ERRNO("ibv_reg_mr ON_DEMAND", ibv_reg_mr(pd, heap, 100, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND), EOPNOTSUPP);
	/* ref: siw charges the pages against RLIMIT_MEMLOCK before pinning:
	 * ENOMEM for a length no process can lock. rdmatap refuses a length
	 * above the device's max_mr_size with ENOMEM before it moves
	 * anything. */
	NULL_ERRNO("ibv_reg_mr of SIZE_MAX bytes", ibv_reg_mr(pd, heap, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE), ENOMEM);
	NULL_ERRNO("ibv_reg_mr above max_mr_size", ibv_reg_mr(pd, heap, (size_t)dattr.max_mr_size + 1, IBV_ACCESS_LOCAL_WRITE), ENOMEM);
	/* The heap is still intact and registrable. */
	struct ibv_mr *mr = ibv_reg_mr(pd, heap, 8192, IBV_ACCESS_LOCAL_WRITE);
	CASE("ibv_reg_mr after the bad ones", mr != NULL);
	if (mr)
		CASE("ibv_dereg_mr", ibv_dereg_mr(mr) == 0);
	free(heap);
}

static void cq_cases(void)
{
	/* ref: siw_create_cq: EINVAL for fewer than 1 or more than
	 * max_cqe entries; the kernel: EINVAL for a comp_vector beyond
	 * num_comp_vectors. */
	NULL_ERRNO("ibv_create_cq cqe 0", ibv_create_cq(ctx, 0, NULL, NULL, 0), EINVAL);
	NULL_ERRNO("ibv_create_cq cqe -1", ibv_create_cq(ctx, -1, NULL, NULL, 0), EINVAL);
	NULL_ERRNO("ibv_create_cq cqe max_cqe+1", ibv_create_cq(ctx, dattr.max_cqe + 1, NULL, NULL, 0), EINVAL);
	NULL_ERRNO("ibv_create_cq comp_vector 1", ibv_create_cq(ctx, 4, NULL, NULL, 1), EINVAL);
	NULL_ERRNO("ibv_create_cq comp_vector -1", ibv_create_cq(ctx, 4, NULL, NULL, -1), EINVAL);
	struct ibv_cq *cq = ibv_create_cq(ctx, dattr.max_cqe, NULL, NULL, 0);
	CASE("ibv_create_cq cqe max_cqe", cq != NULL);
	if (!cq)
		return;
	/* ref: siw's poll loops while i < num_entries: 0 for 0 and below. */
	struct ibv_wc wc[2];
	CASE("ibv_poll_cq 0 entries", ibv_poll_cq(cq, 0, wc) == 0);
	CASE("ibv_poll_cq -1 entries", ibv_poll_cq(cq, -1, wc) == 0);
	/* ref: siw_req_notify_cq stores the arm flags: 0 every time. */
	CASE("ibv_req_notify_cq", ibv_req_notify_cq(cq, 0) == 0);
	CASE("ibv_req_notify_cq again", ibv_req_notify_cq(cq, 0) == 0);
	CASE("ibv_req_notify_cq solicited", ibv_req_notify_cq(cq, 1) == 0);
	CASE("ibv_destroy_cq", ibv_destroy_cq(cq) == 0);
}

static void qp_cases(struct ibv_pd *pd)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	MUST(cq);
	struct ibv_qp_init_attr base = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
					.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp_init_attr a;
	/* ref: siw_create_qp: EINVAL for depths or SGEs above the device's
	 * limits. */
	a = base;
	a.cap.max_send_wr = (uint32_t)dattr.max_qp_wr + 1;
	NULL_ERRNO("ibv_create_qp max_send_wr above max_qp_wr", ibv_create_qp(pd, &a), EINVAL);
	a = base;
	a.cap.max_recv_wr = (uint32_t)dattr.max_qp_wr + 1;
	NULL_ERRNO("ibv_create_qp max_recv_wr above max_qp_wr", ibv_create_qp(pd, &a), EINVAL);
	a = base;
	a.cap.max_send_sge = (uint32_t)dattr.max_sge + 1;
	NULL_ERRNO("ibv_create_qp max_send_sge above max_sge", ibv_create_qp(pd, &a), EINVAL);
	a = base;
	a.cap.max_recv_sge = (uint32_t)dattr.max_sge + 1;
	NULL_ERRNO("ibv_create_qp max_recv_sge above max_sge", ibv_create_qp(pd, &a), EINVAL);
	a = base;
	a.cap.max_inline_data = 1u << 20;
	NULL_ERRNO("ibv_create_qp max_inline_data of 1 MiB", ibv_create_qp(pd, &a), EINVAL);
	/* ref: siw_create_qp: EOPNOTSUPP for any type but RC (what
	 * perftest's and rdma-core's examples report). */
	a = base;
	a.qp_type = IBV_QPT_UD;
	NULL_ERRNO("ibv_create_qp UD", ibv_create_qp(pd, &a), EOPNOTSUPP);
	a.qp_type = IBV_QPT_UC;
	NULL_ERRNO("ibv_create_qp UC", ibv_create_qp(pd, &a), EOPNOTSUPP);
	a.qp_type = IBV_QPT_XRC_SEND;
	NULL_ERRNO("ibv_create_qp XRC_SEND", ibv_create_qp(pd, &a), EOPNOTSUPP);
	/* ref: the kernel looks a CQ's handle up in the context of the
	 * call: another context's CQ is EINVAL. */
	struct ibv_context *ctx2 = ibv_open_device(ctx->device);
	MUST(ctx2);
	struct ibv_cq *cq2 = ibv_create_cq(ctx2, 4, NULL, NULL, 0);
	MUST(cq2);
	a = base;
	a.send_cq = cq2;
	NULL_ERRNO("ibv_create_qp with another context's send CQ", ibv_create_qp(pd, &a), EINVAL);
	a = base;
	a.recv_cq = cq2;
	NULL_ERRNO("ibv_create_qp with another context's receive CQ", ibv_create_qp(pd, &a), EINVAL);
	a = base;
	a.send_cq = NULL;
	NULL_ERRNO("ibv_create_qp without a send CQ", ibv_create_qp(pd, &a), EINVAL);
	MUST(ibv_destroy_cq(cq2) == 0);
	MUST(ibv_close_device(ctx2) == 0);

	/* ref: siw_qp_modify: a QP not connected cannot go to RTS (EINVAL);
	 * the kernel: EINVAL for a state beyond ERR; libibverbs' command:
	 * EOPNOTSUPP for attribute bits from IBV_QP_RATE_LIMIT on; siw:
	 * an empty mask does nothing (0). */
	a = base;
	struct ibv_qp *qp = ibv_create_qp(pd, &a);
	MUST(qp);
	struct ibv_qp_attr qa = {.qp_state = IBV_QPS_RTS};
	CASE("ibv_modify_qp RESET to RTS: EINVAL", ibv_modify_qp(qp, &qa, IBV_QP_STATE) == EINVAL);
	qa.qp_state = (enum ibv_qp_state)42;
	CASE("ibv_modify_qp to state 42: EINVAL", ibv_modify_qp(qp, &qa, IBV_QP_STATE) == EINVAL);
	qa.qp_state = IBV_QPS_INIT;
	CASE("ibv_modify_qp with an unknown mask bit: EOPNOTSUPP",
	     ibv_modify_qp(qp, &qa, IBV_QP_STATE | (1 << 29)) == EOPNOTSUPP);
	CASE("ibv_modify_qp with an empty mask", ibv_modify_qp(qp, &qa, 0) == 0 && qp->state == IBV_QPS_RESET);
	qa.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	CASE("ibv_modify_qp to INIT", ibv_modify_qp(qp, &qa, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS) == 0 && qp->state == IBV_QPS_INIT);
	qa.qp_state = IBV_QPS_RTS;
	CASE("ibv_modify_qp INIT to RTS: EINVAL", ibv_modify_qp(qp, &qa, IBV_QP_STATE) == EINVAL && qp->state == IBV_QPS_INIT);

	/* Posting to a QP never connected. ref: siw's kernel post_send
	 * answers ENOTCONN for a QP not in RTS and sets bad_wr to the first
	 * WR (siw's user library writes the WRs into its SQ first and then
	 * fails the doorbell with ENOTCONN, returning -1: rdmatap queues
	 * nothing); receives are taken in RESET and INIT (siw's IDLE). */
	uint8_t *buf = malloc(4096);
	MUST(buf);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	MUST(mr);
	struct ibv_sge sge = {(uintptr_t)buf, 64, mr->lkey};
	struct ibv_send_wr swr[2] = {{.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND, .next = &swr[1]},
				     {.wr_id = 2, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND}};
	struct ibv_send_wr *sbad = NULL;
	CASE("ibv_post_send on a QP in INIT: ENOTCONN, bad_wr the first", ibv_post_send(qp, swr, &sbad) == ENOTCONN && sbad == &swr[0]);
	struct ibv_recv_wr rwr = {.wr_id = 3, .sg_list = &sge, .num_sge = 1}, *rbad = NULL;
	CASE("ibv_post_recv on a QP in INIT", ibv_post_recv(qp, &rwr, &rbad) == 0);
	struct ibv_recv_wr rwr2[2] = {{.wr_id = 4, .sg_list = &sge, .num_sge = 1, .next = &rwr2[1]},
				      {.wr_id = 5, .sg_list = &sge, .num_sge = 2}};
	CASE("ibv_post_recv num_sge above max_recv_sge: EINVAL, bad_wr the second",
	     ibv_post_recv(qp, rwr2, &rbad) == EINVAL && rbad == &rwr2[1]);
	rwr2[1].num_sge = -1;
	CASE("ibv_post_recv num_sge -1: EINVAL", ibv_post_recv(qp, &rwr2[1], &rbad) == EINVAL && rbad == &rwr2[1]);

	/* A QP in RESET takes receives and refuses sends likewise; in ERR
	 * (siw's ERROR) a post completes flushed. */
	a = base;
	struct ibv_qp *qp2 = ibv_create_qp(pd, &a);
	MUST(qp2);
	swr[1].next = NULL;
	CASE("ibv_post_send on a QP in RESET: ENOTCONN", ibv_post_send(qp2, &swr[1], &sbad) == ENOTCONN && sbad == &swr[1]);
	rwr.wr_id = 6;
	CASE("ibv_post_recv on a QP in RESET", ibv_post_recv(qp2, &rwr, &rbad) == 0);
	qa.qp_state = IBV_QPS_ERR;
	CASE("ibv_modify_qp RESET to ERR", ibv_modify_qp(qp2, &qa, IBV_QP_STATE) == 0 && qp2->state == IBV_QPS_ERR);
	swr[1].send_flags = IBV_SEND_SIGNALED;
	CASE("ibv_post_send on a QP in ERR", ibv_post_send(qp2, &swr[1], &sbad) == 0);
	/* The service has no QP state to set for a QP never connected:
	 * its WRs complete flushed when it is destroyed. */
	CASE("ibv_destroy_qp in ERR", ibv_destroy_qp(qp2) == 0);
	struct ibv_wc fwc[2];
	int nf = 0;
	for (int i = 0; i < 100000 && nf < 2; i++) {
		int k = ibv_poll_cq(cq, 2 - nf, fwc + nf);
		if (k < 0)
			break;
		nf += k;
	}
	CASE("... its receive and send complete flushed", nf == 2 && fwc[0].status == IBV_WC_WR_FLUSH_ERR && fwc[1].status == IBV_WC_WR_FLUSH_ERR);

	/* ref: the kernel refuses to destroy an object in use: EBUSY
	 * (ib_destroy_usecnt), and the object stays usable. */
	CASE("ibv_dealloc_pd holding an MR and a QP: EBUSY", ibv_dealloc_pd(pd) == EBUSY);
	CASE("ibv_destroy_cq used by a QP: EBUSY", ibv_destroy_cq(cq) == EBUSY);
	struct ibv_wc wc;
	CASE("ibv_poll_cq after the refused destroy", ibv_poll_cq(cq, 1, &wc) >= 0);
	CASE("ibv_destroy_qp", ibv_destroy_qp(qp) == 0);
	CASE("ibv_dealloc_pd holding an MR: EBUSY", ibv_dealloc_pd(pd) == EBUSY);
	struct ibv_mr *mr2 = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	CASE("ibv_reg_mr on the PD after the refused dealloc", mr2 != NULL);
	if (mr2)
		MUST(ibv_dereg_mr(mr2) == 0);
	MUST(ibv_dereg_mr(mr) == 0);
	free(buf);

	/* A completion channel with a CQ. ref: libibverbs counts the CQs
	 * on a channel: EBUSY. */
	struct ibv_comp_channel *cc = ibv_create_comp_channel(ctx);
	MUST(cc);
	struct ibv_cq *ccq = ibv_create_cq(ctx, 4, NULL, cc, 0);
	MUST(ccq);
	CASE("ibv_destroy_comp_channel with a CQ: EBUSY", ibv_destroy_comp_channel(cc) == EBUSY);
	MUST(ibv_destroy_cq(ccq) == 0);
	CASE("ibv_destroy_comp_channel", ibv_destroy_comp_channel(cc) == 0);
	MUST(ibv_destroy_cq(cq) == 0);
}

static void unsupported_cases(struct ibv_pd *pd)
{
	/* ref: siw has no address handles, flows, XRC domains or work
	 * queues: libibverbs answers EOPNOTSUPP for the missing operation. */
	struct ibv_ah_attr aa = {.port_num = 1};
	NULL_ERRNO("ibv_create_ah", ibv_create_ah(pd, &aa), EOPNOTSUPP);
	struct ibv_xrcd_init_attr xa = {.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS, .fd = -1, .oflags = O_CREAT};
	NULL_ERRNO("ibv_open_xrcd", ibv_open_xrcd(ctx, &xa), EOPNOTSUPP);
	struct ibv_wq_init_attr wa = {.wq_type = IBV_WQT_RQ, .max_wr = 1, .max_sge = 1, .pd = pd};
	NULL_ERRNO("ibv_create_wq", ibv_create_wq(ctx, &wa), EOPNOTSUPP);
	struct ibv_cq *cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	MUST(cq);
	struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	MUST(qp);
	struct ibv_flow_attr fa = {.type = IBV_FLOW_ATTR_NORMAL, .size = sizeof(fa), .port = 1};
	NULL_ERRNO("ibv_create_flow", ibv_create_flow(qp, &fa), EOPNOTSUPP);
	union ibv_gid mgid = {.raw = {0xff}};
	CASE("ibv_attach_mcast: EOPNOTSUPP", ibv_attach_mcast(qp, &mgid, 0) == EOPNOTSUPP);
	MUST(ibv_destroy_qp(qp) == 0);
	MUST(ibv_destroy_cq(cq) == 0);
	/* ref: a window type the verbs do not define: EINVAL (the kernel's
	 * uverbs passes the type to the driver, which knows 1 and 2). siw
	 * has no windows at all (EOPNOTSUPP); rdmatap has both types. */
	NULL_ERRNO("ibv_alloc_mw of type 3", ibv_alloc_mw(pd, (enum ibv_mw_type)3), EINVAL);
	/* ref: siw_create_srq: EINVAL for max_wr 0 or above max_srq_wr,
	 * max_sge above max_srq_sge, a limit above max_wr; libibverbs:
	 * EOPNOTSUPP for an XRC SRQ (no create_srq_ex). */
	struct ibv_srq_init_attr sa = {.attr = {.max_wr = 0, .max_sge = 1}};
	NULL_ERRNO("ibv_create_srq max_wr 0", ibv_create_srq(pd, &sa), EINVAL);
	sa.attr.max_wr = (uint32_t)dattr.max_srq_wr + 1;
	NULL_ERRNO("ibv_create_srq max_wr above max_srq_wr", ibv_create_srq(pd, &sa), EINVAL);
	sa.attr.max_wr = 4;
	sa.attr.max_sge = (uint32_t)dattr.max_srq_sge + 1;
	NULL_ERRNO("ibv_create_srq max_sge above max_srq_sge", ibv_create_srq(pd, &sa), EINVAL);
	sa.attr.max_sge = 1;
	sa.attr.srq_limit = 5;
	NULL_ERRNO("ibv_create_srq limit above max_wr", ibv_create_srq(pd, &sa), EINVAL);
	struct ibv_srq_init_attr_ex sx = {.attr = {.max_wr = 4, .max_sge = 1}, .srq_type = IBV_SRQT_XRC, .pd = pd,
					  .comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ};
	NULL_ERRNO("ibv_create_srq_ex XRC", ibv_create_srq_ex(ctx, &sx), EOPNOTSUPP);
}

/* ---- the data path on a connection ---- */

static void post_cases(struct ibv_pd *pd)
{
	struct pair c;
	connect_pair(&c, pd);
	int pdata_ok = 1;
	for (int i = 0; i < 255; i++)
		if (c.rpdata[i] != (uint8_t)(i * 3 + 1) || c.apdata[i] != (uint8_t)(i * 5 + 2))
			pdata_ok = 0;
	/* ref: private_data_len is a uint8_t, and iWARP's limit (MPA: 512
	 * bytes less the MPA v2 header) is above it: 255 bytes go through
	 * both ways, no length can exceed the limit. */
	CASE("255 bytes of private data each way", pdata_ok);

	struct ibv_qp *qp = c.a.id->qp;
	struct ibv_sge sg[3];
	sge_to(&sg[0], &c.a, 0, 16);
	sge_to(&sg[1], &c.a, 16, 16);
	sge_to(&sg[2], &c.a, 32, 16);
	/* ref: siw's kernel post_send: EINVAL for more SGEs than the QP's
	 * max_send_sge (2 here), an opcode it lacks; bad_wr is the failing
	 * WR, the WRs before it are posted (siw's user library checks
	 * against its device maximum of SGEs only). */
	struct ibv_send_wr w[2] = {
		{.wr_id = 10, .sg_list = sg, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		 .wr.rdma = {.remote_addr = (uintptr_t)c.p.buf, .rkey = c.p.mr->rkey}, .next = &w[1]},
		{.wr_id = 11, .sg_list = sg, .num_sge = 3, .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		 .wr.rdma = {.remote_addr = (uintptr_t)c.p.buf, .rkey = c.p.mr->rkey}}};
	struct ibv_send_wr *bad = NULL;
	struct ibv_wc wc;
	CASE("ibv_post_send num_sge above max_send_sge: EINVAL, bad_wr the second", ibv_post_send(qp, w, &bad) == EINVAL && bad == &w[1]);
	CASE("the WR before the bad one completes", wait_wc(c.a.cq, &wc) == 1 && wc.wr_id == 10 && wc.status == IBV_WC_SUCCESS);
	w[1].num_sge = -1;
	CASE("ibv_post_send num_sge -1: EINVAL", ibv_post_send(qp, &w[1], &bad) == EINVAL && bad == &w[1]);
	w[1].num_sge = 1;
	w[1].opcode = IBV_WR_TSO;
	CASE("ibv_post_send IBV_WR_TSO: EINVAL", ibv_post_send(qp, &w[1], &bad) == EINVAL && bad == &w[1]);
	w[1].opcode = (enum ibv_wr_opcode)77;
	CASE("ibv_post_send opcode 77: EINVAL", ibv_post_send(qp, &w[1], &bad) == EINVAL && bad == &w[1]);
	/* siw ignores send flags it does not know; rdmatap refuses them:
	 * a ring entry has no room for them. */
	w[1].opcode = IBV_WR_RDMA_WRITE;
	w[1].send_flags = IBV_SEND_SIGNALED | (1u << 20);
	CASE("ibv_post_send an unknown send flag: EINVAL", ibv_post_send(qp, &w[1], &bad) == EINVAL && bad == &w[1]);
	/* Inline data beyond max_inline_data. ref: siw: EINVAL. */
	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr qinit;
	MUST(ibv_query_qp(qp, &qattr, IBV_QP_CAP, &qinit) == 0);
	uint8_t *big = calloc(1, qattr.cap.max_inline_data + 1);
	MUST(big);
	struct ibv_sge isge = {(uintptr_t)big, qattr.cap.max_inline_data + 1, 0};
	struct ibv_send_wr iw = {.wr_id = 12, .sg_list = &isge, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE};
	CASE("ibv_post_send inline beyond max_inline_data: EINVAL", ibv_post_send(qp, &iw, &bad) == EINVAL && bad == &iw);
	free(big);
	/* ref: receives likewise (siw's post_recv: EINVAL above
	 * max_recv_sge). */
	struct ibv_recv_wr rw = {.wr_id = 13, .sg_list = sg, .num_sge = 3}, *rbad = NULL;
	CASE("ibv_post_recv num_sge above max_recv_sge on a connected QP: EINVAL",
	     ibv_post_recv(qp, &rw, &rbad) == EINVAL && rbad == &rw);
	/* The connection works on after the refused posts. */
	memcpy(c.a.buf, "still here", 11);
	sge_to(&sg[0], &c.a, 0, 11);
	w[0].next = NULL;
	w[0].wr_id = 14;
	CASE("a post after the refused ones", ibv_post_send(qp, &w[0], &bad) == 0);
	CASE("... completes", wait_wc(c.a.cq, &wc) == 1 && wc.wr_id == 14 && wc.status == IBV_WC_SUCCESS);
	CASE("... and placed its data", placed(c.p.buf, "still here", 11));
	close_pair(&c);

	/* ref: siw checks an SGE's STag and bounds when it processes the
	 * WR: a bad lkey or a length beyond the MR completes with
	 * IBV_WC_LOC_PROT_ERR, and the QP goes to ERROR (later WRs are
	 * flushed). */
	connect_pair(&c, pd);
	sge_to(&sg[0], &c.a, 0, 16);
	sg[0].lkey ^= 0x5a5a00;
	w[0].wr_id = 20;
	w[0].wr.rdma.remote_addr = (uintptr_t)c.p.buf;
	w[0].wr.rdma.rkey = c.p.mr->rkey;
	CASE("ibv_post_send with a bad lkey", ibv_post_send(c.a.id->qp, &w[0], &bad) == 0);
	CASE("... completes with IBV_WC_LOC_PROT_ERR", wait_wc(c.a.cq, &wc) == 1 && wc.wr_id == 20 && wc.status == IBV_WC_LOC_PROT_ERR);
	close_pair(&c);
	/* ref: the kernel drops a destroyed QP's unread asynchronous events
	 * (the access error above): none is left to name freed memory. */
	struct pollfd apf = {.fd = ctx_async_fd(), .events = POLLIN};
	CASE("no asynchronous event of the destroyed QPs is left", poll(&apf, 1, 0) == 0);

	connect_pair(&c, pd);
	sge_to(&sg[0], &c.a, 65536 - 8, 16);
	w[0].wr_id = 21;
	w[0].wr.rdma.remote_addr = (uintptr_t)c.p.buf;
	w[0].wr.rdma.rkey = c.p.mr->rkey;
	CASE("ibv_post_send beyond the MR's end", ibv_post_send(c.a.id->qp, &w[0], &bad) == 0);
	CASE("... completes with IBV_WC_LOC_PROT_ERR", wait_wc(c.a.cq, &wc) == 1 && wc.wr_id == 21 && wc.status == IBV_WC_LOC_PROT_ERR);
	close_pair(&c);

	/* ref: after ibv_dereg_mr its lkey names nothing: siw completes a
	 * WR using it with IBV_WC_LOC_PROT_ERR. The memory is unmapped
	 * here before the post: nothing may touch it. */
	connect_pair(&c, pd);
	uint8_t *gone = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	MUST(gone != MAP_FAILED);
	struct ibv_mr *gmr = ibv_reg_mr(pd, gone, 8192, IBV_ACCESS_LOCAL_WRITE);
	MUST(gmr);
	uint32_t lkey = gmr->lkey;
	MUST(ibv_dereg_mr(gmr) == 0);
	MUST(munmap(gone, 8192) == 0);
	struct ibv_sge gs = {(uintptr_t)gone, 4096, lkey};
	struct ibv_send_wr gw = {.wr_id = 22, .sg_list = &gs, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED, .wr.rdma = {.remote_addr = (uintptr_t)c.p.buf, .rkey = c.p.mr->rkey}};
	CASE("ibv_post_send with a deregistered MR's lkey", ibv_post_send(c.a.id->qp, &gw, &bad) == 0);
	CASE("... completes with IBV_WC_LOC_PROT_ERR", wait_wc(c.a.cq, &wc) == 1 && wc.wr_id == 22 && wc.status == IBV_WC_LOC_PROT_ERR);
	close_pair(&c);

	/* The same on the receive side: the peer's Send finds a receive
	 * whose MR is gone (ref: siw_proc_send's STag check:
	 * IBV_WC_LOC_PROT_ERR, and a Terminate). The service has taken the
	 * receive before the deregistration (it takes ring entries before
	 * each call). */
	connect_pair(&c, pd);
	gone = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	MUST(gone != MAP_FAILED);
	gmr = ibv_reg_mr(pd, gone, 8192, IBV_ACCESS_LOCAL_WRITE);
	MUST(gmr);
	struct ibv_sge rgs = {(uintptr_t)gone, 4096, gmr->lkey};
	struct ibv_recv_wr grw = {.wr_id = 24, .sg_list = &rgs, .num_sge = 1}, *grbad;
	MUST(ibv_post_recv(c.p.id->qp, &grw, &grbad) == 0);
	MUST(ibv_dereg_mr(gmr) == 0);
	MUST(munmap(gone, 8192) == 0);
	sge_to(&sg[0], &c.a, 0, 64);
	struct ibv_send_wr sw = {.wr_id = 25, .sg_list = sg, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
	CASE("ibv_post_send of a Send to a receive whose MR is gone", ibv_post_send(c.a.id->qp, &sw, &bad) == 0);
	CASE("... the receive completes with IBV_WC_LOC_PROT_ERR",
	     wait_wc(c.p.cq, &wc) == 1 && wc.wr_id == 24 && wc.status == IBV_WC_LOC_PROT_ERR);
	close_pair(&c);

	/* A CQ too small for the WRs completing into it. ref: siw loses
	 * the completion that finds its CQ full, reports IBV_EVENT_CQ_ERR
	 * on the CQ and fails the QP. The completions the CQ holds stay
	 * whole. */
	connect_pair(&c, pd);
	struct ibv_cq *small = ibv_create_cq(c.a.id->verbs, 1, NULL, NULL, 0);
	MUST(small);
	struct ibv_qp_init_attr oa = {.send_cq = small, .recv_cq = small, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 64, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
	struct rdma_cm_id *oid;
	MUST(rdma_create_id(ch, &oid, NULL, RDMA_PS_TCP) == 0);
	{
		struct rdma_cm_id *lid;
		MUST(rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP) == 0);
		struct sockaddr_in la = me;
		MUST(rdma_bind_addr(lid, (struct sockaddr *)&la) == 0);
		MUST(rdma_listen(lid, 1) == 0);
		struct sockaddr_in dst = me;
		dst.sin_port = rdma_get_src_port(lid);
		MUST(rdma_resolve_addr(oid, NULL, (struct sockaddr *)&dst, 2000) == 0);
		rdma_ack_cm_event(next_event(RDMA_CM_EVENT_ADDR_RESOLVED));
		MUST(rdma_resolve_route(oid, 2000) == 0);
		rdma_ack_cm_event(next_event(RDMA_CM_EVENT_ROUTE_RESOLVED));
		MUST(rdma_create_qp(oid, pd, &oa) == 0);
		struct rdma_conn_param op = {.responder_resources = 1, .initiator_depth = 1};
		MUST(rdma_connect(oid, &op) == 0);
		struct rdma_cm_event *e = next_event(RDMA_CM_EVENT_CONNECT_REQUEST);
		struct rdma_cm_id *pid = e->id;
		rdma_ack_cm_event(e);
		struct ibv_qp_init_attr pa = {.send_cq = c.p.cq, .recv_cq = c.p.cq, .qp_type = IBV_QPT_RC,
					      .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
		MUST(rdma_create_qp(pid, pd, &pa) == 0);
		MUST(rdma_accept(pid, &op) == 0);
		rdma_ack_cm_event(next_event(RDMA_CM_EVENT_ESTABLISHED));
		rdma_ack_cm_event(next_event(RDMA_CM_EVENT_ESTABLISHED));
		int n = small->cqe + 8;
		for (int i = 0; i < n; i++) {
			struct ibv_send_wr ow = {.wr_id = 1000 + (uint64_t)i, .sg_list = sg, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
						 .send_flags = IBV_SEND_SIGNALED,
						 .wr.rdma = {.remote_addr = (uintptr_t)c.p.buf, .rkey = c.p.mr->rkey}};
			sge_to(&sg[0], &c.a, 0, 64);
			MUST(ibv_post_send(oid->qp, &ow, &bad) == 0);
		}
		struct ibv_async_event ev;
		struct pollfd pf = {.fd = c.a.id->verbs->async_fd, .events = POLLIN};
		int fatal = 0, cqerr = 0;
		while (poll(&pf, 1, 10000) == 1 && ibv_get_async_event(c.a.id->verbs, &ev) == 0) {
			if (ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == oid->qp)
				fatal = 1;
			if (ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == small)
				cqerr = 1;
			ibv_ack_async_event(&ev);
			if (fatal && cqerr)
				break;
		}
		CASE("a CQ overflow: IBV_EVENT_CQ_ERR on the CQ", cqerr);
		CASE("a CQ overflow: IBV_EVENT_QP_FATAL on its QP", fatal);
		int got = 0, whole = 1;
		struct ibv_wc owc;
		while (ibv_poll_cq(small, 1, &owc) == 1) {
			if (owc.wr_id != 1000 + (uint64_t)got || owc.qp_num != oid->qp->qp_num)
				whole = 0;
			got++;
		}
		CASE("a CQ overflow: the CQ holds its capacity of whole completions", got == small->cqe && whole);
		rdma_disconnect(oid);
		rdma_destroy_qp(pid);
		rdma_destroy_qp(oid);
		MUST(rdma_destroy_id(lid) == 0);
		/* their DISCONNECTED events, if any, go with the IDs */
		MUST(rdma_destroy_id(pid) == 0);
		MUST(rdma_destroy_id(oid) == 0);
	}
	MUST(ibv_destroy_cq(small) == 0);
	close_pair(&c);

	/* Destroying what a connection uses. ref: EBUSY, and the objects
	 * go on working. */
	connect_pair(&c, pd);
	CASE("ibv_destroy_cq of a connected QP's CQ: EBUSY", ibv_destroy_cq(c.a.cq) == EBUSY);
	CASE("ibv_dealloc_pd of connected QPs: EBUSY", ibv_dealloc_pd(pd) == EBUSY);
	memcpy(c.a.buf, "after EBUSY", 12);
	sge_to(&sg[0], &c.a, 0, 12);
	w[0].wr_id = 23;
	w[0].wr.rdma.remote_addr = (uintptr_t)c.p.buf;
	w[0].wr.rdma.rkey = c.p.mr->rkey;
	CASE("a post after the refused destroys", ibv_post_send(c.a.id->qp, &w[0], &bad) == 0);
	CASE("... completes", wait_wc(c.a.cq, &wc) == 1 && wc.wr_id == 23 && wc.status == IBV_WC_SUCCESS);
	CASE("... and placed its data", placed(c.p.buf, "after EBUSY", 12));
	close_pair(&c);
}

/* ---- librdmacm ---- */

static void cm_cases(struct ibv_pd *pd)
{
	struct rdma_cm_id *id;
	/* ref: librdmacm: EINVAL for a port space the kernel lacks. */
	RC_ERRNO("rdma_create_id of port space 7", rdma_create_id(ch, &id, NULL, (enum rdma_port_space)7), EINVAL);
	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	/* ref: librdmacm's ucma_addrlen: 0 for a family it does not know,
	 * EINVAL. */
	struct sockaddr_un_like {
		sa_family_t family;
		char path[32];
	} un = {.family = AF_UNIX, .path = "x"};
	RC_ERRNO("rdma_bind_addr AF_UNIX", rdma_bind_addr(id, (struct sockaddr *)&un), EINVAL);
	RC_ERRNO("rdma_bind_addr NULL", rdma_bind_addr(id, NULL), EINVAL);
	/* ref: the kernel's rdma_translate_ip: EADDRNOTAVAIL for an address
	 * no device has. */
	struct sockaddr_in other = {.sin_family = AF_INET, .sin_port = htons(7471)};
	inet_pton(AF_INET, "203.0.113.9", &other.sin_addr);
	RC_ERRNO("rdma_bind_addr of an address not the device's", rdma_bind_addr(id, (struct sockaddr *)&other), EADDRNOTAVAIL);
	other.sin_port = 0;
	RC_ERRNO("rdma_bind_addr of an address not the device's, port 0", rdma_bind_addr(id, (struct sockaddr *)&other),
		 EADDRNOTAVAIL);
	/* ref: the kernel: an ID binds once (EINVAL). */
	struct sockaddr_in any = {.sin_family = AF_INET};
	CASE("rdma_bind_addr after the refused ones", rdma_bind_addr(id, (struct sockaddr *)&any) == 0);
	RC_ERRNO("rdma_bind_addr twice", rdma_bind_addr(id, (struct sockaddr *)&any), EINVAL);
	/* ref: the kernel: EINVAL for an accept or reject of an ID that
	 * holds no request, a connect before the route is resolved, a
	 * disconnect of an ID not connected. */
	struct rdma_conn_param cp = {.responder_resources = 1, .initiator_depth = 1};
	RC_ERRNO("rdma_accept of a bound ID", rdma_accept(id, &cp), EINVAL);
	RC_ERRNO("rdma_reject of a bound ID", rdma_reject(id, NULL, 0), EINVAL);
	RC_ERRNO("rdma_connect of a bound ID", rdma_connect(id, &cp), EINVAL);
	RC_ERRNO("rdma_disconnect of a bound ID", rdma_disconnect(id), EINVAL);
	RC_ERRNO("rdma_resolve_route of a bound ID", rdma_resolve_route(id, 1000), EINVAL);
	MUST(rdma_destroy_id(id) == 0);

	/* ref: the kernel's rdma_listen binds an unbound ID to the IPv4
	 * wildcard: 0. */
	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	CASE("rdma_listen of an unbound ID", rdma_listen(id, 1) == 0);
	RC_ERRNO("rdma_accept of a listener", rdma_accept(id, &cp), EINVAL);
	RC_ERRNO("rdma_connect of a listener", rdma_connect(id, &cp), EINVAL);
	MUST(rdma_destroy_id(id) == 0);

	/* ref: librdmacm: EINVAL for a NULL destination (ucma_addrlen). */
	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	RC_ERRNO("rdma_resolve_addr to NULL", rdma_resolve_addr(id, NULL, NULL, 1000), EINVAL);
	RC_ERRNO("rdma_connect of an unresolved ID", rdma_connect(id, &cp), EINVAL);
	RC_ERRNO("rdma_resolve_route of an unresolved ID", rdma_resolve_route(id, 1000), EINVAL);
	RC_ERRNO("rdma_disconnect of an unresolved ID", rdma_disconnect(id), EINVAL);
	/* ref: the kernel: EINVAL for an option of the wrong size. */
	uint8_t tos = 0;
	RC_ERRNO("rdma_set_option TOS of 4 bytes", rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 4), EINVAL);
	MUST(rdma_destroy_id(id) == 0);

	/* ref: librdmacm destroys an ID whatever QP it holds (0); the QP
	 * is the program's to destroy and works until then. */
	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	struct sockaddr_in dst = me;
	dst.sin_port = htons(9);
	MUST(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 1000) == 0);
	rdma_ack_cm_event(next_event(RDMA_CM_EVENT_ADDR_RESOLVED));
	struct ibv_cq *cq = ibv_create_cq(id->verbs, 4, NULL, NULL, 0);
	MUST(cq);
	struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
	MUST(rdma_create_qp(id, pd, &qa) == 0);
	struct ibv_qp_init_attr qa2 = qa;
	RC_ERRNO("rdma_create_qp on an ID with a QP", rdma_create_qp(id, pd, &qa2), EINVAL);
	struct ibv_qp *qp = id->qp;
	CASE("rdma_destroy_id holding a QP", rdma_destroy_id(id) == 0);
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	CASE("ibv_query_qp of the QP after its ID went", ibv_query_qp(qp, &attr, IBV_QP_STATE, &init) == 0);
	CASE("ibv_destroy_qp of the QP after its ID went", ibv_destroy_qp(qp) == 0);
	MUST(ibv_destroy_cq(cq) == 0);

	/* ref: an ID destroyed with its events queued takes them along: a
	 * non-blocking channel then has nothing (EAGAIN). */
	struct rdma_event_channel *ch2 = rdma_create_event_channel();
	MUST(ch2);
	MUST(fcntl(ch2->fd, F_SETFL, fcntl(ch2->fd, F_GETFL) | O_NONBLOCK) == 0);
	struct rdma_cm_id *ids[3];
	for (int i = 0; i < 3; i++) {
		MUST(rdma_create_id(ch2, &ids[i], NULL, RDMA_PS_TCP) == 0);
		MUST(rdma_resolve_addr(ids[i], NULL, (struct sockaddr *)&dst, 1000) == 0);
	}
	for (int i = 0; i < 3; i++)
		MUST(rdma_destroy_id(ids[i]) == 0);
	struct rdma_cm_event *e;
	RC_ERRNO("rdma_get_cm_event on a channel whose IDs are gone: EAGAIN", rdma_get_cm_event(ch2, &e), EAGAIN);
	RC_ERRNO("rdma_get_cm_event(NULL)", rdma_get_cm_event(NULL, &e), EINVAL);
	RC_ERRNO("rdma_get_cm_event without an event pointer", rdma_get_cm_event(ch2, NULL), EINVAL);
	RC_ERRNO("rdma_ack_cm_event(NULL)", rdma_ack_cm_event(NULL), EINVAL);
	rdma_destroy_event_channel(ch2);

	/* ref: iWARP has no multicast: the kernel's CM answers ENOSYS
	 * (rdma_join_multicast on an iWARP device). */
	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_UDP) == 0);
	struct sockaddr_in mc = {.sin_family = AF_INET};
	inet_pton(AF_INET, "239.1.1.1", &mc.sin_addr);
	RC_ERRNO("rdma_join_multicast", rdma_join_multicast(id, (struct sockaddr *)&mc, NULL), ENOSYS);
	MUST(rdma_destroy_id(id) == 0);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: badargs ADDR\n");
		return 2;
	}
	me.sin_family = AF_INET;
	MUST(inet_pton(AF_INET, argv[1], &me.sin_addr) == 1);
	int n;
	struct ibv_device **l = ibv_get_device_list(&n);
	MUST(l && n == 1);
	ctx = ibv_open_device(l[0]);
	MUST(ctx);
	MUST(ibv_query_device(ctx, &dattr) == 0);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	MUST(pd);
	ch = rdma_create_event_channel();
	MUST(ch);

	device_cases(l[0]);
	mr_cases(pd);
	cq_cases();
	qp_cases(pd);
	unsupported_cases(pd);
	/* librdmacm's IDs use the library's own context of the device: the
	 * connections' PD is on it. */
	struct ibv_pd *cpd = NULL;
	{
		struct rdma_cm_id *id;
		MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
		struct sockaddr_in dst = me;
		dst.sin_port = htons(9);
		MUST(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 1000) == 0);
		rdma_ack_cm_event(next_event(RDMA_CM_EVENT_ADDR_RESOLVED));
		cpd = ibv_alloc_pd(id->verbs);
		MUST(cpd);
		cm_ctx = id->verbs;
		MUST(rdma_destroy_id(id) == 0);
	}
	cm_cases(cpd);
	post_cases(cpd);
	MUST(ibv_dealloc_pd(cpd) == 0);

	rdma_destroy_event_channel(ch);
	CASE("ibv_dealloc_pd at the end", ibv_dealloc_pd(pd) == 0);
	CASE("ibv_close_device", ibv_close_device(ctx) == 0);
	ibv_free_device_list(l);
	if (failed) {
		fprintf(stderr, "badargs: %d of %d cases failed\n", failed, cases);
		return 1;
	}
	printf("badargs: %d cases ok\n", cases);
	return 0;
}
