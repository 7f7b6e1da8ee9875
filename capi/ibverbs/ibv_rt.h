/* ibv_rt.h: libibverbs' objects as rdmatap makes them. */
#ifndef IBV_RT_H
#define IBV_RT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <infiniband/verbs.h>

#include "rt_internal.h"

/*
 * The layouts programs read directly (fields, and the inline functions of
 * verbs.h that reach ibv_context_ops and verbs_context), as rdma-core 44's
 * ABI on x86_64 has them: a header that differs fails the build.
 */
#if defined(__x86_64__)
_Static_assert(sizeof(struct ibv_device) == 664, "sizeof ibv_device");
_Static_assert(offsetof(struct ibv_device, node_type) == 16, "ibv_device.node_type");
_Static_assert(offsetof(struct ibv_device, transport_type) == 20, "ibv_device.transport_type");
_Static_assert(offsetof(struct ibv_device, name) == 24, "ibv_device.name");
_Static_assert(offsetof(struct ibv_device, dev_name) == 88, "ibv_device.dev_name");
_Static_assert(offsetof(struct ibv_device, dev_path) == 152, "ibv_device.dev_path");
_Static_assert(offsetof(struct ibv_device, ibdev_path) == 408, "ibv_device.ibdev_path");
_Static_assert(sizeof(struct ibv_context) == 328, "sizeof ibv_context");
_Static_assert(offsetof(struct ibv_context, device) == 0, "ibv_context.device");
_Static_assert(offsetof(struct ibv_context, ops) == 8, "ibv_context.ops");
_Static_assert(offsetof(struct ibv_context, cmd_fd) == 264, "ibv_context.cmd_fd");
_Static_assert(offsetof(struct ibv_context, async_fd) == 268, "ibv_context.async_fd");
_Static_assert(offsetof(struct ibv_context, num_comp_vectors) == 272, "ibv_context.num_comp_vectors");
_Static_assert(offsetof(struct ibv_context, abi_compat) == 320, "ibv_context.abi_compat");
_Static_assert(offsetof(struct ibv_context_ops, poll_cq) == 88, "ibv_context_ops.poll_cq");
_Static_assert(offsetof(struct ibv_context_ops, req_notify_cq) == 96, "ibv_context_ops.req_notify_cq");
_Static_assert(offsetof(struct ibv_context_ops, post_srq_recv) == 160, "ibv_context_ops.post_srq_recv");
_Static_assert(offsetof(struct ibv_context_ops, post_send) == 200, "ibv_context_ops.post_send");
_Static_assert(offsetof(struct ibv_context_ops, post_recv) == 208, "ibv_context_ops.post_recv");
_Static_assert(sizeof(struct verbs_context) == 648, "sizeof verbs_context");
_Static_assert(offsetof(struct verbs_context, query_port) == 0, "verbs_context.query_port");
_Static_assert(offsetof(struct verbs_context, query_device_ex) == 216, "verbs_context.query_device_ex");
_Static_assert(offsetof(struct verbs_context, create_qp_ex) == 264, "verbs_context.create_qp_ex");
_Static_assert(offsetof(struct verbs_context, sz) == 312, "verbs_context.sz");
_Static_assert(offsetof(struct verbs_context, context) == 320, "verbs_context.context");
_Static_assert(sizeof(struct ibv_wc) == 48, "sizeof ibv_wc");
_Static_assert(offsetof(struct ibv_wc, status) == 8, "ibv_wc.status");
_Static_assert(offsetof(struct ibv_wc, opcode) == 12, "ibv_wc.opcode");
_Static_assert(offsetof(struct ibv_wc, byte_len) == 20, "ibv_wc.byte_len");
_Static_assert(offsetof(struct ibv_wc, qp_num) == 28, "ibv_wc.qp_num");
_Static_assert(offsetof(struct ibv_wc, wc_flags) == 36, "ibv_wc.wc_flags");
_Static_assert(sizeof(struct ibv_send_wr) == 128, "sizeof ibv_send_wr");
_Static_assert(offsetof(struct ibv_send_wr, sg_list) == 16, "ibv_send_wr.sg_list");
_Static_assert(offsetof(struct ibv_send_wr, opcode) == 28, "ibv_send_wr.opcode");
_Static_assert(offsetof(struct ibv_send_wr, send_flags) == 32, "ibv_send_wr.send_flags");
_Static_assert(offsetof(struct ibv_send_wr, wr) == 40, "ibv_send_wr.wr");
_Static_assert(sizeof(struct ibv_recv_wr) == 32, "sizeof ibv_recv_wr");
_Static_assert(sizeof(struct ibv_sge) == 16, "sizeof ibv_sge");
_Static_assert(sizeof(struct ibv_pd) == 16, "sizeof ibv_pd");
_Static_assert(sizeof(struct ibv_mr) == 48, "sizeof ibv_mr");
_Static_assert(offsetof(struct ibv_mr, lkey) == 36, "ibv_mr.lkey");
_Static_assert(offsetof(struct ibv_mr, rkey) == 40, "ibv_mr.rkey");
_Static_assert(sizeof(struct ibv_cq) == 128, "sizeof ibv_cq");
_Static_assert(offsetof(struct ibv_cq, channel) == 8, "ibv_cq.channel");
_Static_assert(offsetof(struct ibv_cq, cq_context) == 16, "ibv_cq.cq_context");
_Static_assert(offsetof(struct ibv_cq, cqe) == 28, "ibv_cq.cqe");
_Static_assert(offsetof(struct ibv_cq, comp_events_completed) == 120, "ibv_cq.comp_events_completed");
_Static_assert(sizeof(struct ibv_qp) == 160, "sizeof ibv_qp");
_Static_assert(offsetof(struct ibv_qp, qp_context) == 8, "ibv_qp.qp_context");
_Static_assert(offsetof(struct ibv_qp, qp_num) == 52, "ibv_qp.qp_num");
_Static_assert(offsetof(struct ibv_qp, state) == 56, "ibv_qp.state");
_Static_assert(offsetof(struct ibv_qp, qp_type) == 60, "ibv_qp.qp_type");
_Static_assert(sizeof(struct ibv_srq) == 128, "sizeof ibv_srq");
_Static_assert(sizeof(struct ibv_comp_channel) == 16, "sizeof ibv_comp_channel");
_Static_assert(offsetof(struct ibv_comp_channel, fd) == 8, "ibv_comp_channel.fd");
_Static_assert(sizeof(struct ibv_device_attr) == 232, "sizeof ibv_device_attr");
_Static_assert(sizeof(struct ibv_port_attr) == 52, "sizeof ibv_port_attr");
_Static_assert(sizeof(struct ibv_qp_attr) == 144, "sizeof ibv_qp_attr");
_Static_assert(sizeof(struct ibv_qp_init_attr) == 64, "sizeof ibv_qp_init_attr");
_Static_assert(sizeof(struct ibv_async_event) == 16, "sizeof ibv_async_event");
_Static_assert(sizeof(struct ibv_device_attr_ex) == 400, "sizeof ibv_device_attr_ex");
#endif

/* Ring header offsets (protocol 8.2). */
enum {
	RING_PROD = 0,
	RING_CONS = 64,
	RING_WAITING = 128,
	RING_ARM = 132,
	RING_EVENTS = 136,
	RING_OVERFLOW = 140,
	RING_CAPACITY = 192,
	RING_ESIZE = 196,
	RING_ENTRIES = 256,
};

/* A send entry (protocol 8.3). */
struct rt_sge {
	uint64_t addr;
	uint32_t len;
	uint32_t lkey;
};
struct rt_send_entry {
	uint64_t id;
	uint8_t opcode;
	uint8_t flags;
	uint16_t nsge;
	uint32_t data_len; /* with RT_SF_INLINE_DATA: the payload's length, from offset 64 */
	uint64_t remote_addr;
	uint32_t rkey;
	uint32_t inv_rkey;
	uint32_t imm;
	uint32_t unused1;
	uint64_t compare_add;
	uint64_t swap;
	uint64_t unused2;
	struct rt_sge sge[];
};
_Static_assert(sizeof(struct rt_sge) == 16, "SGE");
_Static_assert(offsetof(struct rt_send_entry, opcode) == 8, "send opcode");
_Static_assert(offsetof(struct rt_send_entry, nsge) == 10, "send nsge");
_Static_assert(offsetof(struct rt_send_entry, data_len) == 12, "send data length");
_Static_assert(offsetof(struct rt_send_entry, remote_addr) == 16, "send remote");
_Static_assert(offsetof(struct rt_send_entry, rkey) == 24, "send rkey");
_Static_assert(offsetof(struct rt_send_entry, inv_rkey) == 28, "send inv");
_Static_assert(offsetof(struct rt_send_entry, imm) == 32, "send imm");
_Static_assert(offsetof(struct rt_send_entry, compare_add) == 40, "send cmp");
_Static_assert(offsetof(struct rt_send_entry, swap) == 48, "send swap");
_Static_assert(offsetof(struct rt_send_entry, sge) == 64, "send sge");

struct rt_recv_entry {
	uint64_t id;
	uint32_t nsge;
	uint32_t unused;
	struct rt_sge sge[];
};
_Static_assert(offsetof(struct rt_recv_entry, sge) == 16, "recv sge");

struct rt_cqe {
	uint64_t id;
	uint8_t status;
	uint8_t opcode;
	uint8_t flags;
	uint8_t zero0;
	uint32_t byte_len;
	uint32_t qpn;
	uint32_t inv_stag;
	uint32_t imm;
	uint8_t term_layer, term_type, term_code, zero1;
};
_Static_assert(sizeof(struct rt_cqe) == 32, "completion entry");
_Static_assert(offsetof(struct rt_cqe, byte_len) == 12, "cqe len");
_Static_assert(offsetof(struct rt_cqe, qpn) == 16, "cqe qpn");
_Static_assert(offsetof(struct rt_cqe, imm) == 24, "cqe imm");

/* Protocol send opcodes and flags (7.3, 7.4), completion flags (7.5). */
enum {
	RT_OP_SEND = 0,
	RT_OP_SEND_WITH_INV = 1,
	RT_OP_RDMA_WRITE = 2,
	RT_OP_RDMA_READ = 3,
	RT_OP_RDMA_WRITE_WITH_IMM = 4,
	RT_OP_SEND_WITH_IMM = 5,
	RT_OP_CMP_SWP = 6,
	RT_OP_FETCH_ADD = 7,
	RT_OP_LOCAL_INV = 8,
	RT_OP_BIND_MW = 10,
	RT_SF_SIGNALED = 1,
	RT_SF_INLINE = 2,
	RT_SF_SOLICITED = 4,
	RT_SF_FENCE = 8,
	RT_SF_INLINE_DATA = 0x80,
	RT_WCF_WITH_INV = 1,
	RT_WCF_SOLICITED = 2,
	RT_WCF_WITH_IMM = 4,
	RT_ARM_NONE = 0,
	RT_ARM_ANY = 1,
	RT_ARM_SOLICITED = 2,
};

/* A mapped ring: its shared header and the local copy of the index this
 * end owns. */
struct rt_ring {
	uint8_t *base;
	uint32_t cap, esize;
	uint32_t idx;
};

static inline uint32_t *ring_word(const struct rt_ring *r, unsigned off) { return (uint32_t *)(void *)(r->base + off); }
static inline uint8_t *ring_entry(const struct rt_ring *r, uint32_t i) { return r->base + RING_ENTRIES + (size_t)(i & (r->cap - 1)) * r->esize; }
/* ring_open checks and takes a ring at base (len bytes in its mapping). */
int ring_open(struct rt_ring *r, uint8_t *base, size_t len);

struct rt_ctx {
	struct verbs_context vctx; /* ends with the ibv_context */
	struct rt_session *s;
	int async_wr; /* write end of the async events' socket pair (context.async_fd is the read end) */
	struct rt_ctx *next; /* open contexts */
};

static inline struct rt_ctx *to_ctx(struct ibv_context *c) { return (struct rt_ctx *)(void *)((uint8_t *)c - offsetof(struct rt_ctx, vctx.context)); }

struct rt_pd {
	struct ibv_pd pd;
	uint64_t h;
};

struct rt_mr {
	struct ibv_mr mr;
	uint64_t h;
};

struct rt_mw {
	struct ibv_mw mw;
	uint64_t h;
};

/* A completion channel. ch.fd is an eventfd of the library's own, which
 * ibv_get_cq_event reads (blocking unless the program made it
 * non-blocking) and programs may poll: the channel's forwarder thread
 * waits on epfd, which holds the CQs' eventfds (written by the service)
 * and stopfd, and adds 1 to ch.fd whenever one of them fires. */
struct rt_channel {
	struct ibv_comp_channel ch;
	pthread_mutex_t mu;
	struct rt_cq *cqs;
	int epfd;
	int stopfd;
	pthread_t fwd;
	pid_t pid;               /* the process the forwarder runs in (a fork's child has none) */
	struct rt_channel *next; /* live channels */
};

struct rt_cq {
	struct ibv_cq cq;
	uint64_t h;
	int efd;
	void *mem;
	size_t memlen;
	struct rt_ring r;
	pthread_spinlock_t lock;
	uint32_t ev_seen; /* events taken by ibv_get_cq_event (under the channel's lock) */
	int overflow_told; /* IBV_EVENT_CQ_ERR posted (under obj_mu) */
	struct rt_cq *next_in_channel;
};

struct rt_srq {
	struct ibv_srq srq;
	uint64_t h;
	void *mem;
	size_t memlen;
	struct rt_ring r;
	uint32_t max_sge, max_wr, limit;
	pthread_spinlock_t lock;
};

struct rt_qp {
	struct ibv_qp qp;
	void *mem;
	size_t memlen;
	struct rt_ring sq, rq;
	pthread_spinlock_t slock, rlock;
	uint32_t max_send_sge, max_recv_sge, max_inline;
	struct ibv_qp_cap cap;
	int sig_all;
	uint8_t timeout; /* IBV_QP_TIMEOUT as last set (ibv_query_qp's): recorded only, the connection's TCP retransmits */
	uint8_t *bounce; /* inline data without RT_FEATURE_INLINE_DATA: max_inline bytes per SQ entry */
	size_t bounce_len;
	struct ibv_mr *bounce_mr;
	struct rt_qp *next; /* live QPs */
};

/* mem.c: make [addr, addr+len) shared with the service; returns the
 * process's memfd (a borrowed descriptor), or -1 with errno. Pages the
 * program cannot read, or (writable) cannot write, are EFAULT, as the
 * kernel cannot pin them. */
int rt_mem_share(void *addr, size_t len, int writable);

/*
 * verbs.c. device.c opens contexts: it installs their operations (one
 * table, device.c's), links them into the live contexts that events reach
 * and starts the session's event handling; verbs.c calls nothing of
 * device.c's.
 */
void rt_events_init(struct rt_session *s);
void rt_ctx_link(struct rt_ctx *c);
void rt_ctx_unlink(struct rt_ctx *c);
/* The context's operations. */
int rt_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
int rt_req_notify_cq(struct ibv_cq *cq, int solicited_only);
int rt_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int rt_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
int rt_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
struct ibv_mw *rt_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type);
int rt_dealloc_mw(struct ibv_mw *mw);
int rt_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *b);
struct ibv_qp *rt_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *a);

#endif
