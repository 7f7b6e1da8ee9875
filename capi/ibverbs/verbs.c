/* verbs.c: protection domains, memory regions, completion queues and
 * channels, queue pairs, shared receive queues, the fast path on the
 * shared rings, and asynchronous events. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <signal.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ibv_rt.h"

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

/* ---- helpers ---- */

static struct rt_session *sess(struct ibv_context *ctx) { return to_ctx(ctx)->s; }

/* call runs a request with args and returns 0 or an errno value. */
static int call(struct rt_session *s, uint16_t type, const uint64_t *args, uint8_t nargs, const int *fds, unsigned nfds,
		struct rt_msg *rep)
{
	struct rt_request req = {.type = type, .nargs = nargs, .args = args, .nfds = nfds, .fds = fds};
	if (rt_call(s, &req, rep) < 0)
		return errno ? errno : EIO;
	return 0;
}

static struct rt_msg *new_msg(void)
{
	struct rt_msg *m = malloc(sizeof(*m));
	if (!m)
		errno = ENOMEM;
	return m;
}

/* call_noreply is call for a request whose reply carries nothing the
 * caller needs (the destroys, SRQ_LIMIT): 0 or an errno. */
static int call_noreply(struct rt_session *s, uint16_t type, const uint64_t *args, uint8_t nargs)
{
	struct rt_msg *m = new_msg();
	if (!m)
		return ENOMEM;
	int e = call(s, type, args, nargs, NULL, 0, m);
	free(m);
	return e;
}

static void close_reply_fds(struct rt_msg *m)
{
	for (unsigned i = 0; i < m->nfds; i++)
		close(m->fds[i]);
	m->nfds = 0;
}

/* map_ring_fd maps a whole ring memfd shared; MADV_DONTFORK keeps it out of
 * children. */
static void *map_fd(int fd, size_t *len)
{
	struct stat st;
	if (fstat(fd, &st) < 0)
		return NULL;
	if (st.st_size < RING_ENTRIES) {
		errno = EPROTO;
		return NULL;
	}
	void *m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		return NULL;
	madvise(m, (size_t)st.st_size, MADV_DONTFORK);
	*len = (size_t)st.st_size;
	return m;
}

int ring_open(struct rt_ring *r, uint8_t *base, size_t len)
{
	r->base = base;
	r->cap = rt_load32((uint32_t *)(void *)(base + RING_CAPACITY));
	r->esize = rt_load32((uint32_t *)(void *)(base + RING_ESIZE));
	if (r->cap == 0 || (r->cap & (r->cap - 1)) || r->esize == 0 || r->esize % 8 ||
	    (uint64_t)RING_ENTRIES + (uint64_t)r->cap * r->esize > len) {
		errno = EPROTO;
		return -1;
	}
	r->idx = 0;
	return 0;
}

/* ---- live QPs and SRQs, for events and lookups ---- */

static pthread_mutex_t obj_mu = PTHREAD_MUTEX_INITIALIZER;
static struct rt_qp *qps;
static struct rt_ctx *ctxs;
static struct rt_channel *channels;

void rt_ctx_link(struct rt_ctx *c)
{
	pthread_mutex_lock(&obj_mu);
	c->next = ctxs;
	ctxs = c;
	pthread_mutex_unlock(&obj_mu);
}

void rt_ctx_unlink(struct rt_ctx *c)
{
	pthread_mutex_lock(&obj_mu);
	for (struct rt_ctx **pp = &ctxs; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	pthread_mutex_unlock(&obj_mu);
}

RT_VISIBLE struct ibv_qp *rt_qp_lookup(uint32_t qpn)
{
	pthread_mutex_lock(&obj_mu);
	struct rt_qp *q = qps;
	while (q && q->qp.qp_num != qpn)
		q = q->next;
	pthread_mutex_unlock(&obj_mu);
	return q ? &q->qp : NULL;
}

/* channel_wake makes a completion channel's fd readable. */
static void channel_wake(struct rt_channel *c)
{
	uint64_t one = 1;
	ssize_t w = write(c->ch.fd, &one, sizeof(one));
	(void)w;
}

/* ---- asynchronous events ---- */

struct srq_ref {
	struct srq_ref *next;
	struct rt_srq *srq;
};
static struct srq_ref *srqs;

static void post_async(struct rt_ctx *c, struct ibv_async_event *ev)
{
	if (c->async_wr < 0)
		return; /* the session has ended */
	ssize_t w = send(c->async_wr, ev, sizeof(*ev), MSG_DONTWAIT | MSG_NOSIGNAL);
	if (w != (ssize_t)sizeof(*ev))
		rt_debug("asynchronous event %d lost (queue full)", ev->event_type);
}

/* event_object is the QP, SRQ or CQ an event names (NULL: the device's
 * or a port's). */
static void *event_object(const struct ibv_async_event *ev)
{
	switch (ev->event_type) {
	case IBV_EVENT_CQ_ERR:
		return ev->element.cq;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		return ev->element.srq;
	case IBV_EVENT_DEVICE_FATAL:
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		return NULL;
	default:
		return ev->element.qp;
	}
}

/* purge_async takes the unread events naming obj out of c's queue, as
 * the kernel drops a destroyed object's events (obj_mu held: no event is
 * posted meanwhile; a thread reading events may take some first). */
static void purge_async(struct rt_ctx *c, const void *obj)
{
	if (c->async_wr < 0)
		return; /* the session has ended: its queue ends with IBV_EVENT_DEVICE_FATAL */
	struct ibv_async_event *evs = NULL;
	size_t n = 0, cap = 0;
	for (;;) {
		if (n == cap) {
			size_t ncap = cap ? 2 * cap : 32;
			struct ibv_async_event *e = realloc(evs, ncap * sizeof(*e));
			if (!e)
				break;
			evs = e;
			cap = ncap;
		}
		if (recv(c->vctx.context.async_fd, &evs[n], sizeof(evs[n]), MSG_DONTWAIT) != (ssize_t)sizeof(evs[n]))
			break;
		n++;
	}
	for (size_t i = 0; i < n; i++)
		if (event_object(&evs[i]) != obj)
			post_async(c, &evs[i]);
	free(evs);
}

/* cq_overflowed posts IBV_EVENT_CQ_ERR once for a CQ whose ring lost a
 * completion (obj_mu held). */
static void cq_overflowed(struct ibv_cq *cq)
{
	struct rt_cq *q = (struct rt_cq *)cq;
	if (!q || q->overflow_told || !rt_load32(ring_word(&q->r, RING_OVERFLOW)))
		return;
	q->overflow_told = 1;
	struct ibv_async_event ev;
	memset(&ev, 0, sizeof(ev));
	ev.event_type = IBV_EVENT_CQ_ERR;
	ev.element.cq = cq;
	post_async(to_ctx(cq->context), &ev);
}

/* terminate_event names a QP's failure as libibverbs would: a protection
 * error (RDMAP remote protection, DDP tagged buffer) is an access error,
 * anything else fatal. */
static enum ibv_event_type terminate_event(const struct rt_msg *m)
{
	if (m->args[RT_EVA_TYPE] == RT_EV_QP_FATAL)
		return IBV_EVENT_QP_FATAL;
	uint64_t layer = m->args[RT_EVA_TERM_LAYER], type = m->args[RT_EVA_TERM_TYPE];
	if ((layer == RT_TERM_RDMAP && type == 0) || (layer == RT_TERM_DDP && type == 1))
		return IBV_EVENT_QP_ACCESS_ERR;
	return IBV_EVENT_QP_FATAL;
}

static void on_event(void *unused, uint16_t type, const struct rt_msg *m)
{
	(void)unused;
	struct ibv_async_event ev;
	memset(&ev, 0, sizeof(ev));
	pthread_mutex_lock(&obj_mu);
	if (type == 0) {
		ev.event_type = IBV_EVENT_DEVICE_FATAL;
		ev.element.port_num = 1;
		/* The last event: then ibv_get_async_event fails (EIO), as
		 * the kernel's after a device is gone. */
		for (struct rt_ctx *c = ctxs; c; c = c->next) {
			post_async(c, &ev);
			close(c->async_wr);
			c->async_wr = -1;
		}
		/* Wake every thread waiting for a completion event: it finds
		 * the session ended (get_cq_event). */
		for (struct rt_channel *ch = channels; ch; ch = ch->next)
			channel_wake(ch);
		pthread_mutex_unlock(&obj_mu);
		return;
	}
	switch (m->args[RT_EVA_TYPE]) {
	case RT_EV_TERMINATE_SENT:
	case RT_EV_TERMINATE_RECEIVED:
	case RT_EV_QP_FATAL:
		for (struct rt_qp *q = qps; q; q = q->next)
			if (q->qp.qp_num == m->args[RT_EVA_QPN]) {
				/* A QP fails when a CQ of its overflows: the CQ's
				 * error first, as siw reports it. */
				cq_overflowed(q->qp.send_cq);
				if (q->qp.recv_cq != q->qp.send_cq)
					cq_overflowed(q->qp.recv_cq);
				ev.event_type = terminate_event(m);
				ev.element.qp = &q->qp;
				post_async(to_ctx(q->qp.context), &ev);
				break;
			}
		break;
	case RT_EV_SRQ_LIMIT_REACHED:
	case RT_EV_SRQ_ERR:
		for (struct srq_ref *r = srqs; r; r = r->next)
			if (r->srq->h == m->args[RT_EVA_SRQ]) {
				ev.event_type = m->args[RT_EVA_TYPE] == RT_EV_SRQ_ERR ? IBV_EVENT_SRQ_ERR : IBV_EVENT_SRQ_LIMIT_REACHED;
				ev.element.srq = &r->srq->srq;
				post_async(to_ctx(r->srq->srq.context), &ev);
				break;
			}
		break;
	default:
		break; /* connection events are librdmacm's */
	}
	pthread_mutex_unlock(&obj_mu);
}

void rt_events_init(struct rt_session *s)
{
	static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	static struct rt_session *done;
	pthread_mutex_lock(&mu);
	if (done != s) {
		rt_add_handler(s, RT_EVENT, on_event, NULL);
		rt_add_handler(s, 0, on_event, NULL);
		done = s;
	}
	pthread_mutex_unlock(&mu);
}

/* ibv_get_async_event reads the socket, as rdma-core reads its fd: a
 * signal interrupts the read as the kernel decides (SA_RESTART). */
RT_VISIBLE int ibv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *ev)
{
	ssize_t r = read(ctx->async_fd, ev, sizeof(*ev));
	if (r == (ssize_t)sizeof(*ev))
		return 0;
	if (r >= 0)
		errno = EIO;
	return -1;
}

RT_VISIBLE void ibv_ack_async_event(struct ibv_async_event *ev)
{
	switch (ev->event_type) {
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED: {
		struct ibv_qp *q = ev->element.qp;
		pthread_mutex_lock(&q->mutex);
		q->events_completed++;
		pthread_cond_signal(&q->cond);
		pthread_mutex_unlock(&q->mutex);
		break;
	}
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED: {
		struct ibv_srq *s = ev->element.srq;
		pthread_mutex_lock(&s->mutex);
		s->events_completed++;
		pthread_cond_signal(&s->cond);
		pthread_mutex_unlock(&s->mutex);
		break;
	}
	case IBV_EVENT_CQ_ERR: {
		struct ibv_cq *c = ev->element.cq;
		pthread_mutex_lock(&c->mutex);
		c->async_events_completed++;
		pthread_cond_signal(&c->cond);
		pthread_mutex_unlock(&c->mutex);
		break;
	}
	default:
		break;
	}
}

/* ---- protection domains ---- */

RT_VISIBLE struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
	if (!ctx) {
		errno = EINVAL;
		return NULL;
	}
	struct rt_msg *m = new_msg();
	struct rt_pd *p = calloc(1, sizeof(*p));
	if (!m || !p) {
		free(m);
		free(p);
		errno = ENOMEM;
		return NULL;
	}
	int e = call(sess(ctx), RT_ALLOC_PD, NULL, 0, NULL, 0, m);
	if (e) {
		free(m);
		free(p);
		errno = e;
		return NULL;
	}
	p->h = m->args[0];
	free(m);
	p->pd.context = ctx;
	p->pd.handle = (uint32_t)p->h;
	return &p->pd;
}

RT_VISIBLE int ibv_dealloc_pd(struct ibv_pd *pd)
{
	if (!pd)
		return EINVAL;
	struct rt_pd *p = (struct rt_pd *)pd;
	int e = call_noreply(sess(pd->context), RT_DEALLOC_PD, &p->h, 1);
	if (e)
		return e;
	free(p);
	return 0;
}

RT_VISIBLE uint64_t rt_pd_handle(struct ibv_pd *pd) { return pd ? ((struct rt_pd *)pd)->h : 0; }

/* ---- memory regions ---- */

#define RT_ACCESS_MASK (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED)

RT_VISIBLE struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, unsigned int access)
{
	if (!pd) {
		errno = EINVAL;
		return NULL;
	}
	access &= ~(unsigned)IBV_ACCESS_OPTIONAL_RANGE; /* hints */
	if (access & ~(unsigned)RT_ACCESS_MASK) {
		errno = (access & IBV_ACCESS_ON_DEMAND) ? EOPNOTSUPP : EINVAL;
		return NULL;
	}
	if (len == 0) {
		errno = EINVAL;
		return NULL;
	}
	if (len > rt_limit(sess(pd->context), RT_QD_MAX_MR_SIZE)) {
		errno = ENOMEM; /* above max_mr_size: refused before any page moves */
		return NULL;
	}
	/* ib_access_writable's flags: the kernel pins such an MR's pages
	 * for writing. */
	int fd = rt_mem_share(addr, len,
			      (access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC |
					 IBV_ACCESS_MW_BIND)) != 0);
	if (fd < 0)
		return NULL;
	struct rt_msg *m = new_msg();
	struct rt_mr *r = calloc(1, sizeof(*r));
	if (!m || !r) {
		free(m);
		free(r);
		errno = ENOMEM;
		return NULL;
	}
	uint64_t args[6] = {((struct rt_pd *)pd)->h, (uintptr_t)addr, len, access, (uintptr_t)addr, iova};
	int e = call(sess(pd->context), RT_REG_MR, args, 6, &fd, 1, m);
	if (e) {
		free(m);
		free(r);
		errno = e;
		return NULL;
	}
	r->h = m->args[0];
	r->mr.context = pd->context;
	r->mr.pd = pd;
	r->mr.addr = addr;
	r->mr.length = len;
	r->mr.handle = (uint32_t)r->h;
	r->mr.lkey = r->mr.rkey = (uint32_t)m->args[1];
	free(m);
	return &r->mr;
}

RT_VISIBLE struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	return ibv_reg_mr_iova2(pd, addr, len, (uintptr_t)addr, (unsigned)access);
}

RT_VISIBLE struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access)
{
	return ibv_reg_mr_iova2(pd, addr, len, iova, (unsigned)access);
}

RT_VISIBLE int ibv_dereg_mr(struct ibv_mr *mr)
{
	if (!mr)
		return EINVAL;
	struct rt_mr *r = (struct rt_mr *)mr;
	int e = call_noreply(sess(mr->context), RT_DEREG_MR, &r->h, 1);
	if (e)
		return e;
	free(r);
	return 0;
}

RT_VISIBLE int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t len, int access)
{
	(void)mr;
	(void)flags;
	(void)pd;
	(void)addr;
	(void)len;
	(void)access;
	errno = EOPNOTSUPP;
	return IBV_REREG_MR_ERR_INPUT;
}

/* ---- completion channels and queues ---- */

/* forward is a channel's forwarder thread: it adds 1 to the channel's fd
 * whenever the eventfd of one of its CQs fires, until stopfd does. */
static void *forward(void *arg)
{
	struct rt_channel *c = arg;
	for (;;) {
		struct epoll_event evs[16];
		int n = epoll_wait(c->epfd, evs, 16, -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return NULL;
		}
		int fire = 0;
		pthread_mutex_lock(&c->mu);
		for (int i = 0; i < n; i++) {
			if (evs[i].data.ptr == c) {
				pthread_mutex_unlock(&c->mu);
				return NULL;
			}
			/* Only a CQ still in the channel (a destroyed one's
			 * pointer may be stale). */
			for (struct rt_cq *q = c->cqs; q; q = q->next_in_channel)
				if (q == evs[i].data.ptr) {
					uint64_t v;
					ssize_t rd = read(q->efd, &v, sizeof(v));
					(void)rd;
					fire = 1;
					break;
				}
		}
		pthread_mutex_unlock(&c->mu);
		if (fire)
			channel_wake(c);
	}
}

RT_VISIBLE struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *ctx)
{
	if (!ctx) {
		errno = EINVAL;
		return NULL;
	}
	struct rt_channel *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->ch.fd = eventfd(0, EFD_CLOEXEC);
	c->epfd = epoll_create1(EPOLL_CLOEXEC);
	c->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
	int e = 0;
	if (c->ch.fd < 0 || c->epfd < 0 || c->stopfd < 0 || epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->stopfd, &ev) < 0)
		e = errno;
	c->ch.context = ctx;
	pthread_mutex_init(&c->mu, NULL);
	if (!e) {
		/* The forwarder takes no signal: those of the process go to
		 * the program's threads, whose waits they interrupt. */
		sigset_t all, old;
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, &old);
		e = pthread_create(&c->fwd, NULL, forward, c);
		c->pid = getpid();
		pthread_sigmask(SIG_SETMASK, &old, NULL);
	}
	if (e) {
		if (c->ch.fd >= 0)
			close(c->ch.fd);
		if (c->epfd >= 0)
			close(c->epfd);
		if (c->stopfd >= 0)
			close(c->stopfd);
		pthread_mutex_destroy(&c->mu);
		free(c);
		errno = e;
		return NULL;
	}
	pthread_mutex_lock(&obj_mu);
	c->next = channels;
	channels = c;
	pthread_mutex_unlock(&obj_mu);
	return &c->ch;
}

RT_VISIBLE int ibv_destroy_comp_channel(struct ibv_comp_channel *ch)
{
	if (!ch)
		return EINVAL;
	struct rt_channel *c = (struct rt_channel *)ch;
	pthread_mutex_lock(&c->mu);
	int busy = c->cqs != NULL;
	pthread_mutex_unlock(&c->mu);
	if (busy)
		return EBUSY;
	pthread_mutex_lock(&obj_mu);
	for (struct rt_channel **pp = &channels; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	pthread_mutex_unlock(&obj_mu);
	if (c->pid == getpid()) {
		uint64_t one = 1;
		ssize_t w = write(c->stopfd, &one, sizeof(one));
		(void)w;
		pthread_join(c->fwd, NULL);
	}
	close(c->stopfd);
	close(c->epfd);
	close(ch->fd);
	pthread_mutex_destroy(&c->mu);
	free(c);
	return 0;
}

RT_VISIBLE struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context, struct ibv_comp_channel *channel,
					int comp_vector)
{
	if (!ctx || cqe <= 0 || comp_vector < 0 || comp_vector >= ctx->num_comp_vectors) {
		errno = EINVAL;
		return NULL;
	}
	struct rt_msg *m = new_msg();
	struct rt_cq *q = calloc(1, sizeof(*q));
	if (!m || !q) {
		free(m);
		free(q);
		errno = ENOMEM;
		return NULL;
	}
	uint64_t n = (uint64_t)cqe;
	int e = call(sess(ctx), RT_CREATE_CQ, &n, 1, NULL, 0, m);
	if (e) {
		free(m);
		free(q);
		errno = e;
		return NULL;
	}
	q->h = m->args[0];
	if (m->nfds != 2) {
		close_reply_fds(m);
		e = EPROTO;
		goto undo;
	}
	q->efd = m->fds[1];
	q->mem = map_fd(m->fds[0], &q->memlen);
	close(m->fds[0]);
	m->nfds = 0;
	if (!q->mem || ring_open(&q->r, q->mem, q->memlen) < 0 || q->r.esize != sizeof(struct rt_cqe)) {
		e = q->mem ? EPROTO : errno;
		if (q->mem)
			munmap(q->mem, q->memlen);
		close(q->efd);
		goto undo;
	}
	q->r.idx = rt_load32(ring_word(&q->r, RING_CONS));
	q->ev_seen = rt_load32(ring_word(&q->r, RING_EVENTS));
	pthread_spin_init(&q->lock, PTHREAD_PROCESS_PRIVATE);
	q->cq.context = ctx;
	q->cq.channel = channel;
	q->cq.cq_context = cq_context;
	q->cq.handle = (uint32_t)q->h;
	q->cq.cqe = (int)q->r.cap;
	pthread_mutex_init(&q->cq.mutex, NULL);
	pthread_cond_init(&q->cq.cond, NULL);
	if (channel) {
		struct rt_channel *c = (struct rt_channel *)channel;
		struct epoll_event ev = {.events = EPOLLIN, .data.ptr = q};
		pthread_mutex_lock(&c->mu);
		if (epoll_ctl(c->epfd, EPOLL_CTL_ADD, q->efd, &ev) < 0) {
			e = errno;
			pthread_mutex_unlock(&c->mu);
			munmap(q->mem, q->memlen);
			close(q->efd);
			goto undo;
		}
		q->next_in_channel = c->cqs;
		c->cqs = q;
		channel->refcnt++;
		pthread_mutex_unlock(&c->mu);
	}
	free(m);
	return &q->cq;
undo:;
	uint64_t h = q->h;
	call(sess(ctx), RT_DESTROY_CQ, &h, 1, NULL, 0, m);
	free(m);
	free(q);
	errno = e;
	return NULL;
}

RT_VISIBLE int ibv_destroy_cq(struct ibv_cq *cq)
{
	if (!cq)
		return EINVAL;
	struct rt_cq *q = (struct rt_cq *)cq;
	int e = call_noreply(sess(cq->context), RT_DESTROY_CQ, &q->h, 1);
	if (e)
		return e;
	pthread_mutex_lock(&obj_mu);
	purge_async(to_ctx(cq->context), cq);
	pthread_mutex_unlock(&obj_mu);
	if (cq->channel) {
		struct rt_channel *c = (struct rt_channel *)cq->channel;
		pthread_mutex_lock(&c->mu);
		for (struct rt_cq **pp = &c->cqs; *pp; pp = &(*pp)->next_in_channel)
			if (*pp == q) {
				*pp = q->next_in_channel;
				break;
			}
		cq->channel->refcnt--;
		epoll_ctl(c->epfd, EPOLL_CTL_DEL, q->efd, NULL);
		pthread_mutex_unlock(&c->mu);
	}
	close(q->efd);
	munmap(q->mem, q->memlen);
	pthread_spin_destroy(&q->lock);
	free(q);
	return 0;
}

RT_VISIBLE int ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
	if (!cq || cqe <= 0)
		return EINVAL;
	return cqe <= cq->cqe ? 0 : EOPNOTSUPP;
}

RT_VISIBLE uint64_t rt_cq_handle(struct ibv_cq *cq) { return cq ? ((struct rt_cq *)cq)->h : 0; }

/*
 * Idle polling. Programs such as perftest's poll a CQ in a loop however
 * long its next completion takes (a bandwidth test of 1 MiB Writes waits
 * 0.2 to 1 ms for each; its server polls for the closing message for the
 * whole test). The service's engine runs on the same processors, so a
 * thread that has polled only empty CQs for longer than its spin sleeps in
 * ibv_poll_cq on the CQ's eventfd until a completion arrives or 1 ms has
 * passed (protocol 8.4: Waiting), then looks again. The spin is
 * RDMATAP_POLL_SPIN microseconds (default 50, as the service's poller's:
 * longer than a small message's round trip through two services, shorter
 * than the gaps between 1 MiB completions, through which a spin would take
 * a processor from the engine) while completions come within it, and
 * adapts as the service's poller's does: halved (down to a sixteenth)
 * after each longer wait, so that a bandwidth test spins little of each
 * gap. A thread that gets completions from any CQ at least once per spin
 * never sleeps, nor does one polling a CQ of a completion channel (its
 * eventfd is the channel's).
 *
 * Only a thread that waits in ibv_poll_cq sleeps there: one that polls
 * between other work (libfabric's progress polls the CQ on its way to a
 * Send; an MPI rank tests its requests between computations) must get its
 * empty answer at once, or its next WR goes out a millisecond late. So the
 * spin starts again whenever the thread shows that it does something else
 * between polls: it posts a WR (ibv_post_send, ibv_post_recv,
 * ibv_post_srq_recv), it polls another CQ than the one it has been
 * polling (the eventfd it would sleep on is that CQ's only), or more than
 * POLL_GAP_NS pass between two of its empty polls (a wait is a loop of
 * polls a few hundred nanoseconds apart).
 */
static __thread uint64_t idle_since; /* this thread's polls have found nothing since (ns); 0: they found some */
static __thread uint64_t spin_now;   /* this thread's current spin (ns); 0: not yet set */
static __thread uint64_t last_empty; /* when this thread's last empty poll returned (ns) */
static __thread const void *idle_cq; /* the CQ of this thread's idle polls (compared, never followed) */

#define POLL_GAP_NS 10000u

/* active restarts this thread's spin: it does something besides polling
 * (it posts work). */
static inline void active(void) { idle_since = 0; }

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts); /* vDSO: no system call */
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#define POLL_SPIN_US 50 /* RDMATAP_POLL_SPIN's default */

static uint64_t poll_spin_ns(void)
{
	static uint64_t v; /* +1: set */
	uint64_t x = __atomic_load_n(&v, __ATOMIC_RELAXED);
	if (!x) {
		const char *e = getenv("RDMATAP_POLL_SPIN");
		char *end;
		unsigned long long us = e && *e ? strtoull(e, &end, 10) : POLL_SPIN_US;
		if (e && *e && *end)
			us = POLL_SPIN_US;
		x = (us > UINT64_MAX / 2000 ? UINT64_MAX / 2 : (uint64_t)us * 1000) + 1;
		__atomic_store_n(&v, x, __ATOMIC_RELAXED);
	}
	return x - 1;
}

/* poll_ring moves up to n completions of q into wc. */
static int poll_ring(struct rt_cq *q, int n, struct ibv_wc *wc)
{
	pthread_spin_lock(&q->lock);
	uint32_t cons = q->r.idx, prod = rt_load32(ring_word(&q->r, RING_PROD));
	int k = 0;
	while (k < n && cons != prod) {
		struct rt_cqe e;
		memcpy(&e, ring_entry(&q->r, cons), sizeof(e));
		struct ibv_wc *w = &wc[k++];
		w->wr_id = e.id;
		w->status = (enum ibv_wc_status)e.status;
		w->opcode = (enum ibv_wc_opcode)e.opcode;
		w->vendor_err = e.status ? (uint32_t)e.term_layer << 16 | (uint32_t)e.term_type << 8 | e.term_code : 0;
		w->byte_len = e.byte_len;
		w->wc_flags = 0;
		w->imm_data = 0;
		if (e.flags & RT_WCF_WITH_IMM) {
			w->imm_data = e.imm;
			w->wc_flags |= IBV_WC_WITH_IMM;
		} else if (e.flags & RT_WCF_WITH_INV) {
			w->invalidated_rkey = e.inv_stag;
			w->wc_flags |= IBV_WC_WITH_INV;
		}
		w->qp_num = e.qpn;
		w->src_qp = 0;
		w->pkey_index = 0;
		w->slid = 0;
		w->sl = 0;
		w->dlid_path_bits = 0;
		cons++;
	}
	if (k) {
		q->r.idx = cons;
		rt_store32(ring_word(&q->r, RING_CONS), cons);
	}
	pthread_spin_unlock(&q->lock);
	return k;
}

/* idle_sleep waits on the CQ's eventfd until the service has added a
 * completion (it writes the eventfd while Waiting is nonzero) or 1 ms has
 * passed. */
static void idle_sleep(struct rt_cq *q)
{
	uint32_t *waiting = ring_word(&q->r, RING_WAITING);
	__atomic_fetch_add(waiting, 1, __ATOMIC_SEQ_CST);
	if (rt_load32(ring_word(&q->r, RING_PROD)) == __atomic_load_n(&q->r.idx, __ATOMIC_RELAXED)) {
		struct pollfd p = {.fd = q->efd, .events = POLLIN};
		if (poll(&p, 1, 1) == 1) {
			uint64_t v;
			ssize_t rd = read(q->efd, &v, sizeof(v));
			(void)rd;
		}
	}
	__atomic_fetch_sub(waiting, 1, __ATOMIC_SEQ_CST);
}

/* busy ends an idle period of this thread: the spin adapts to its length. */
static void busy(void)
{
	if (!idle_since)
		return;
	uint64_t full = poll_spin_ns(), waited = now_ns() - idle_since;
	if (waited <= full)
		spin_now = full;
	else if (spin_now / 2 > full / 16)
		spin_now /= 2;
	else
		spin_now = full / 16;
	idle_since = 0;
}

int rt_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	struct rt_cq *q = (struct rt_cq *)cq;
	if (n <= 0)
		return 0;
	int k = poll_ring(q, n, wc);
	if (k) {
		busy();
		return k;
	}
	if (rt_session_dead(sess(cq->context)))
		return -1; /* the service is gone: nothing will complete */
	uint64_t t = now_ns();
	uint64_t gap = t - last_empty;
	last_empty = t;
	if (!idle_since || idle_cq != q || gap > POLL_GAP_NS) {
		idle_since = t; /* (re)starts the spin */
		idle_cq = q;
		return 0;
	}
	if (!spin_now)
		spin_now = poll_spin_ns();
	if (cq->channel || t - idle_since <= spin_now)
		return 0;
	int e = errno;
	idle_sleep(q);
	errno = e;
	k = poll_ring(q, n, wc);
	if (k)
		busy();
	else
		last_empty = now_ns(); /* the sleep is no gap between polls */
	return k;
}

int rt_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	struct rt_cq *q = (struct rt_cq *)cq;
	uint32_t *arm = ring_word(&q->r, RING_ARM);
	if (solicited_only) {
		uint32_t none = RT_ARM_NONE;
		__atomic_compare_exchange_n(arm, &none, RT_ARM_SOLICITED, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
	} else {
		rt_store32(arm, RT_ARM_ANY);
	}
	return 0;
}

/* take_event takes one completion event of the channel's CQs, if any. */
static struct rt_cq *take_event(struct rt_channel *c)
{
	for (struct rt_cq *q = c->cqs; q; q = q->next_in_channel) {
		uint32_t ev = rt_load32(ring_word(&q->r, RING_EVENTS));
		if (ev != q->ev_seen) {
			q->ev_seen++;
			if (ev != q->ev_seen)
				channel_wake(c); /* more events wait: keep the channel readable */
			return q;
		}
	}
	return NULL;
}

/* get_cq_event is ibv_get_cq_event with cancellation disabled; it enables
 * it only around its wait, where it holds no lock (rping cancels the
 * thread that waits in ibv_get_cq_event). The wait is a read() of the
 * channel's fd, as rdma-core's: a signal interrupts it as the kernel
 * decides (EINTR, or a restart under SA_RESTART), a non-blocking channel
 * gives EAGAIN, and the session's end makes the fd readable. */
static int get_cq_event(struct rt_channel *c, struct ibv_cq **cq, void **cq_context, int cs)
{
	struct ibv_comp_channel *ch = &c->ch;
	for (;;) {
		pthread_mutex_lock(&c->mu);
		struct rt_cq *q = take_event(c);
		pthread_mutex_unlock(&c->mu);
		if (q) {
			*cq = &q->cq;
			if (cq_context)
				*cq_context = q->cq.cq_context;
			return 0;
		}
		if (rt_session_dead(sess(ch->context))) {
			errno = EIO; /* the service is gone: no event will come */
			return -1;
		}
		uint64_t v;
		int old;
		pthread_setcancelstate(cs, &old);
		ssize_t n = read(ch->fd, &v, sizeof(v));
		int e = errno;
		pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
		if (n < 0) {
			errno = e;
			return -1;
		}
	}
}

RT_VISIBLE int ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context)
{
	if (!ch || !cq) {
		errno = EINVAL;
		return -1;
	}
	int cs;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cs);
	int r = get_cq_event((struct rt_channel *)ch, cq, cq_context, cs);
	int e = errno;
	pthread_setcancelstate(cs, NULL);
	errno = e;
	return r;
}

RT_VISIBLE void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int n)
{
	if (!cq)
		return;
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += n;
	pthread_cond_signal(&cq->cond);
	pthread_mutex_unlock(&cq->mutex);
}

/* ---- shared receive queues ---- */

RT_VISIBLE struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	if (!pd || !attr || attr->attr.srq_limit > attr->attr.max_wr) {
		errno = EINVAL;
		return NULL;
	}
	struct rt_msg *m = new_msg();
	struct rt_srq *s = calloc(1, sizeof(*s));
	struct srq_ref *ref = calloc(1, sizeof(*ref));
	if (!m || !s || !ref) {
		free(m);
		free(s);
		free(ref);
		errno = ENOMEM;
		return NULL;
	}
	uint32_t sge = attr->attr.max_sge ? attr->attr.max_sge : 1;
	uint64_t depth = attr->attr.max_wr, maxwr = rt_limit(sess(pd->context), RT_QD_MAX_SRQ_WR);
	if (depth <= maxwr && 2 * depth <= maxwr)
		depth *= 2; /* as a QP's rings */
	uint64_t args[3] = {((struct rt_pd *)pd)->h, depth, sge};
	int e = call(sess(pd->context), RT_CREATE_SRQ, args, 3, NULL, 0, m);
	if (e)
		goto fail;
	s->h = m->args[0];
	if (m->nfds != 1) {
		close_reply_fds(m);
		e = EPROTO;
		goto undo;
	}
	s->mem = map_fd(m->fds[0], &s->memlen);
	close(m->fds[0]);
	m->nfds = 0;
	if (!s->mem || ring_open(&s->r, s->mem, s->memlen) < 0 || s->r.esize < sizeof(struct rt_recv_entry) + 16 * (size_t)sge) {
		e = s->mem ? EPROTO : errno;
		if (s->mem)
			munmap(s->mem, s->memlen);
		goto undo;
	}
	s->r.idx = rt_load32(ring_word(&s->r, RING_PROD));
	s->max_sge = sge;
	s->max_wr = attr->attr.max_wr;
	pthread_spin_init(&s->lock, PTHREAD_PROCESS_PRIVATE);
	s->srq.context = pd->context;
	s->srq.srq_context = attr->srq_context;
	s->srq.pd = pd;
	s->srq.handle = (uint32_t)s->h;
	pthread_mutex_init(&s->srq.mutex, NULL);
	pthread_cond_init(&s->srq.cond, NULL);
	attr->attr.max_sge = sge;
	if (attr->attr.srq_limit) {
		uint64_t la[2] = {s->h, attr->attr.srq_limit};
		if (call(sess(pd->context), RT_SRQ_LIMIT, la, 2, NULL, 0, m) == 0)
			s->limit = attr->attr.srq_limit;
	}
	free(m);
	ref->srq = s;
	pthread_mutex_lock(&obj_mu);
	ref->next = srqs;
	srqs = ref;
	pthread_mutex_unlock(&obj_mu);
	return &s->srq;
undo:;
	uint64_t h = s->h;
	call(sess(pd->context), RT_DESTROY_SRQ, &h, 1, NULL, 0, m);
fail:
	free(m);
	free(s);
	free(ref);
	errno = e;
	return NULL;
}

RT_VISIBLE int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask)
{
	if (!srq || !attr)
		return EINVAL;
	struct rt_srq *s = (struct rt_srq *)srq;
	if (mask & ~IBV_SRQ_LIMIT)
		return EINVAL; /* the service cannot resize an SRQ */
	if (mask & IBV_SRQ_LIMIT) {
		uint64_t la[2] = {s->h, attr->srq_limit};
		int e = call_noreply(sess(srq->context), RT_SRQ_LIMIT, la, 2);
		if (e)
			return e;
		s->limit = attr->srq_limit;
	}
	return 0;
}

RT_VISIBLE int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr)
{
	if (!srq || !attr)
		return EINVAL;
	struct rt_srq *s = (struct rt_srq *)srq;
	attr->max_wr = s->max_wr;
	attr->max_sge = s->max_sge;
	attr->srq_limit = s->limit;
	return 0;
}

RT_VISIBLE int ibv_destroy_srq(struct ibv_srq *srq)
{
	if (!srq)
		return EINVAL;
	struct rt_srq *s = (struct rt_srq *)srq;
	int e = call_noreply(sess(srq->context), RT_DESTROY_SRQ, &s->h, 1);
	if (e)
		return e;
	pthread_mutex_lock(&obj_mu);
	for (struct srq_ref **pp = &srqs; *pp; pp = &(*pp)->next)
		if ((*pp)->srq == s) {
			struct srq_ref *r = *pp;
			*pp = r->next;
			free(r);
			break;
		}
	purge_async(to_ctx(srq->context), srq);
	pthread_mutex_unlock(&obj_mu);
	munmap(s->mem, s->memlen);
	pthread_spin_destroy(&s->lock);
	free(s);
	return 0;
}

RT_VISIBLE uint64_t rt_srq_handle(struct ibv_srq *srq) { return srq ? ((struct rt_srq *)srq)->h : 0; }

/*
 * ring_room waits for room for one entry in a ring this end produces. The
 * service advances a ring's Cons only after a pass over its entries, and
 * the WRs it took may complete before that: a program that keeps no more
 * than its max WRs outstanding can find the ring full for a moment. So a
 * full ring is waited on, up to about 2 ms (waking the service if it
 * sleeps), before the post fails with ENOMEM.
 */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

static int ring_room(struct rt_session *s, struct rt_ring *r, uint32_t prod, uint32_t *cons)
{
	if (prod - *cons < r->cap)
		return 1;
	for (int i = 0; i < 20000; i++) {
		*cons = rt_load32(ring_word(r, RING_CONS));
		if (prod - *cons < r->cap)
			return 1;
		if (i == 0)
			rt_ring_doorbell(s);
		if (i > 100)
			sched_yield();
		else
			cpu_relax();
	}
	return 0;
}

/* post_recv_ring fills receive entries into r. */
static int post_recv_ring(struct rt_session *s, struct rt_ring *r, pthread_spinlock_t *lock, uint32_t max_sge, struct ibv_recv_wr *wr,
			  struct ibv_recv_wr **bad)
{
	int err = 0;
	active();
	pthread_spin_lock(lock);
	uint32_t prod = r->idx, start = prod;
	uint32_t cons = rt_load32(ring_word(r, RING_CONS));
	for (; wr; wr = wr->next) {
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > max_sge) {
			err = EINVAL;
			break;
		}
		if (!ring_room(s, r, prod, &cons)) {
			err = ENOMEM;
			break;
		}
		struct rt_recv_entry *e = (struct rt_recv_entry *)(void *)ring_entry(r, prod);
		e->id = wr->wr_id;
		e->nsge = (uint32_t)wr->num_sge;
		e->unused = 0;
		for (int i = 0; i < wr->num_sge; i++) {
			e->sge[i].addr = wr->sg_list[i].addr;
			e->sge[i].len = wr->sg_list[i].length;
			e->sge[i].lkey = wr->sg_list[i].lkey;
		}
		prod++;
	}
	if (prod != start) {
		r->idx = prod;
		rt_store32(ring_word(r, RING_PROD), prod);
	}
	pthread_spin_unlock(lock);
	if (prod != start)
		rt_ring_doorbell(s);
	if (err && bad)
		*bad = wr;
	return err;
}

int rt_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct rt_srq *s = (struct rt_srq *)srq;
	return post_recv_ring(sess(srq->context), &s->r, &s->lock, s->max_sge, wr, bad);
}

/* ---- queue pairs ---- */

static void qp_unlink(struct rt_qp *q)
{
	pthread_mutex_lock(&obj_mu);
	for (struct rt_qp **pp = &qps; *pp; pp = &(*pp)->next)
		if (*pp == q) {
			*pp = q->next;
			break;
		}
	pthread_mutex_unlock(&obj_mu);
}

static void qp_free(struct rt_qp *q)
{
	if (q->bounce_mr)
		ibv_dereg_mr(q->bounce_mr);
	if (q->bounce)
		munmap(q->bounce, q->bounce_len);
	if (q->mem)
		munmap(q->mem, q->memlen);
	free(q);
}

RT_VISIBLE struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
	if (!pd || !a || !a->send_cq || !a->recv_cq) {
		errno = EINVAL;
		return NULL;
	}
	/* The contexts share the process's session, whose handles would name
	 * another context's CQ: the kernel looks handles up per context. */
	if (a->send_cq->context != pd->context || a->recv_cq->context != pd->context ||
	    (a->srq && a->srq->context != pd->context)) {
		errno = EINVAL;
		return NULL;
	}
	if (a->qp_type != IBV_QPT_RC) {
		errno = EOPNOTSUPP; /* iWARP has RC QPs only */
		return NULL;
	}
	struct ibv_context *ctx = pd->context;
	struct rt_msg *m = new_msg();
	struct rt_qp *q = calloc(1, sizeof(*q));
	if (!m || !q) {
		free(m);
		free(q);
		errno = ENOMEM;
		return NULL;
	}
	struct ibv_qp_cap cap = a->cap;
	if (cap.max_send_wr == 0)
		cap.max_send_wr = 1;
	if (cap.max_recv_wr == 0)
		cap.max_recv_wr = 1;
	if (cap.max_send_sge == 0)
		cap.max_send_sge = 1;
	if (cap.max_recv_sge == 0)
		cap.max_recv_sge = 1;
	if (cap.max_inline_data == 0)
		cap.max_inline_data = 64; /* what the service takes 0 for */
	/* Rings of twice the depth asked for (within the device's limit): the
	 * service frees ring entries in passes, after their WRs may have
	 * completed (see ring_room). */
	uint64_t maxwr = rt_limit(sess(ctx), RT_QD_MAX_QP_WR);
	uint64_t swr = cap.max_send_wr, rwr = cap.max_recv_wr;
	if (swr <= maxwr && 2 * swr <= maxwr)
		swr *= 2;
	if (rwr <= maxwr && 2 * rwr <= maxwr)
		rwr *= 2;
	uint64_t args[10] = {((struct rt_pd *)pd)->h, ((struct rt_cq *)a->send_cq)->h, ((struct rt_cq *)a->recv_cq)->h,
			     a->srq ? ((struct rt_srq *)a->srq)->h : 0, swr, rwr, cap.max_send_sge,
			     cap.max_recv_sge, cap.max_inline_data, a->sq_sig_all ? 1 : 0};
	int e = call(sess(ctx), RT_CREATE_QP, args, 10, NULL, 0, m);
	if (e) {
		free(m);
		free(q);
		errno = e;
		return NULL;
	}
	uint32_t qpn = (uint32_t)m->args[0];
	uint64_t sq_bytes = m->args[1];
	if (m->nfds != 1) {
		close_reply_fds(m);
		e = EPROTO;
		goto undo;
	}
	q->mem = map_fd(m->fds[0], &q->memlen);
	close(m->fds[0]);
	m->nfds = 0;
	if (!q->mem) {
		e = errno;
		goto undo;
	}
	if (sq_bytes > q->memlen || ring_open(&q->sq, q->mem, sq_bytes) < 0 ||
	    q->sq.esize < sizeof(struct rt_send_entry) + 16 * (size_t)cap.max_send_sge ||
	    (!a->srq && (ring_open(&q->rq, (uint8_t *)q->mem + sq_bytes, q->memlen - sq_bytes) < 0 ||
			 q->rq.esize < sizeof(struct rt_recv_entry) + 16 * (size_t)cap.max_recv_sge))) {
		e = EPROTO;
		goto undo;
	}
	q->sq.idx = rt_load32(ring_word(&q->sq, RING_PROD));
	if (!a->srq)
		q->rq.idx = rt_load32(ring_word(&q->rq, RING_PROD));
	q->max_send_sge = cap.max_send_sge;
	q->max_recv_sge = cap.max_recv_sge;
	q->max_inline = cap.max_inline_data;
	q->sig_all = a->sq_sig_all;
	if (rt_session_features(sess(ctx)) & RT_FEATURE_INLINE_DATA) {
		/* Inline data goes in the SQ entry itself (protocol 8.3). */
		if (q->sq.esize < sizeof(struct rt_send_entry) + (size_t)q->max_inline) {
			e = EPROTO;
			goto undo;
		}
	} else {
		/* The bounce buffer of inline sends: one slot per SQ entry, free
		 * again once the service took the entry (it copies inline data
		 * then). */
		q->bounce_len = ((size_t)q->sq.cap * q->max_inline + 4095) & ~(size_t)4095;
		q->bounce = mmap(NULL, q->bounce_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (q->bounce == MAP_FAILED) {
			q->bounce = NULL;
			e = errno;
			goto undo;
		}
		q->bounce_mr = ibv_reg_mr(pd, q->bounce, q->bounce_len, IBV_ACCESS_LOCAL_WRITE);
		if (!q->bounce_mr) {
			e = errno;
			goto undo;
		}
	}
	pthread_spin_init(&q->slock, PTHREAD_PROCESS_PRIVATE);
	pthread_spin_init(&q->rlock, PTHREAD_PROCESS_PRIVATE);
	q->cap = cap;
	a->cap = cap;
	struct ibv_qp *qp = &q->qp;
	qp->context = ctx;
	qp->qp_context = a->qp_context;
	qp->pd = pd;
	qp->send_cq = a->send_cq;
	qp->recv_cq = a->recv_cq;
	qp->srq = a->srq;
	qp->handle = qpn;
	qp->qp_num = qpn;
	qp->state = IBV_QPS_RESET;
	qp->qp_type = IBV_QPT_RC;
	pthread_mutex_init(&qp->mutex, NULL);
	pthread_cond_init(&qp->cond, NULL);
	free(m);
	pthread_mutex_lock(&obj_mu);
	q->next = qps;
	qps = q;
	pthread_mutex_unlock(&obj_mu);
	return qp;
undo:;
	uint64_t h = qpn;
	call(sess(ctx), RT_DESTROY_QP, &h, 1, NULL, 0, m);
	free(m);
	qp_free(q);
	errno = e;
	return NULL;
}

struct ibv_qp *rt_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *a)
{
	if (a->comp_mask & ~(uint32_t)(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS) || a->create_flags) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (!(a->comp_mask & IBV_QP_INIT_ATTR_PD) || !a->pd || a->pd->context != ctx) {
		errno = EINVAL;
		return NULL;
	}
	return ibv_create_qp(a->pd, (struct ibv_qp_init_attr *)a);
}

RT_VISIBLE int ibv_destroy_qp(struct ibv_qp *qp)
{
	if (!qp)
		return EINVAL;
	struct rt_qp *q = (struct rt_qp *)qp;
	uint64_t h = qp->qp_num;
	int e = call_noreply(sess(qp->context), RT_DESTROY_QP, &h, 1);
	if (e)
		return e;
	qp_unlink(q);
	pthread_mutex_lock(&obj_mu);
	purge_async(to_ctx(qp->context), qp);
	pthread_mutex_unlock(&obj_mu);
	pthread_spin_destroy(&q->slock);
	pthread_spin_destroy(&q->rlock);
	qp_free(q);
	return 0;
}

RT_VISIBLE uint64_t rt_qp_handle(struct ibv_qp *qp) { return qp ? qp->qp_num : 0; }

RT_VISIBLE void rt_qp_set_state(struct ibv_qp *qp, enum ibv_qp_state state)
{
	if (qp)
		__atomic_store_n(&qp->state, state, __ATOMIC_SEQ_CST);
}

static enum ibv_qp_state qp_state(struct ibv_qp *qp) { return __atomic_load_n(&qp->state, __ATOMIC_SEQ_CST); }

static void disconnect_done(void *ctx, struct rt_msg *rep)
{
	(void)ctx;
	for (unsigned i = 0; i < rep->nfds; i++)
		close(rep->fds[i]);
}

static int qp_transition(struct ibv_qp *qp, const struct ibv_qp_attr *attr);

RT_VISIBLE int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	if (!qp || !attr)
		return EINVAL;
	if (mask & ~(IBV_QP_RATE_LIMIT - 1))
		return EOPNOTSUPP; /* libibverbs' modify command carries no more */
	int e = mask & IBV_QP_STATE ? qp_transition(qp, attr) : 0;
	/* The other attributes of an iWARP QP are its connection's; the ACK
	 * timeout is recorded for ibv_query_qp (librdmacm sets it from
	 * RDMA_OPTION_ID_ACK_TIMEOUT, and programs read it back). */
	if (!e && (mask & IBV_QP_TIMEOUT))
		__atomic_store_n(&((struct rt_qp *)qp)->timeout, attr->timeout, __ATOMIC_RELAXED);
	return e;
}

/* The state transition of ibv_modify_qp. */
static int qp_transition(struct ibv_qp *qp, const struct ibv_qp_attr *attr)
{
	enum ibv_qp_state cur = qp_state(qp);
	int connected = cur == IBV_QPS_RTS || cur == IBV_QPS_SQD;
	switch (attr->qp_state) {
	case IBV_QPS_RESET:
	case IBV_QPS_INIT:
		if (connected)
			return EINVAL;
		rt_qp_set_state(qp, attr->qp_state);
		return 0;
	case IBV_QPS_RTR:
	case IBV_QPS_RTS:
		/* An iWARP QP is connected by the CM (librdmacm), never by a
		 * peer's QP number: these transitions only succeed on a QP the
		 * CM has connected already. */
		return connected ? 0 : EINVAL;
	case IBV_QPS_ERR:
		if (connected) {
			/* As siw: the connection closes (the peer sees it end),
			 * and every WR completes flushed once it has. */
			uint64_t h = qp->qp_num;
			struct rt_request req = {.type = RT_DISCONNECT, .nargs = 1, .args = &h};
			rt_call_async(sess(qp->context), &req, disconnect_done, NULL);
		} else if (cur != IBV_QPS_ERR && (rt_session_features(sess(qp->context)) & RT_FEATURE_CM)) {
			/* Not connected: QP_ERROR flushes what is posted now. */
			uint64_t h = qp->qp_num;
			int e = call_noreply(sess(qp->context), RT_QP_ERROR, &h, 1);
			if (e)
				return e;
		}
		rt_qp_set_state(qp, IBV_QPS_ERR);
		return 0;
	default:
		return EINVAL;
	}
}

RT_VISIBLE int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask, struct ibv_qp_init_attr *init)
{
	(void)mask;
	if (!qp || !attr)
		return EINVAL;
	struct rt_qp *q = (struct rt_qp *)qp;
	struct rt_msg *m = new_msg();
	if (!m)
		return ENOMEM;
	uint64_t h = qp->qp_num;
	int e = call(sess(qp->context), RT_QUERY_QP, &h, 1, NULL, 0, m);
	uint64_t st = m->args[0];
	free(m);
	if (e)
		return e;
	enum ibv_qp_state s;
	switch (st) {
	case RT_QPS_RTS: s = IBV_QPS_RTS; break;
	case RT_QPS_CLOSING: s = IBV_QPS_SQD; break;
	case RT_QPS_TERMINATE: s = IBV_QPS_SQE; break;
	case RT_QPS_ERROR: s = IBV_QPS_ERR; break;
	default:
		/* Not connected: an iWARP QP's IDLE, which cxgb4 reports as
		 * INIT (an iWARP QP has no RESET of its own, and rdma-core's
		 * tests expect INIT of a new QP of an RNIC); siw leaves the
		 * state out of its answer, so the kernel's zero: RESET. */
		s = qp_state(qp);
		if (s != IBV_QPS_ERR && s != IBV_QPS_RTR)
			s = IBV_QPS_INIT;
		break;
	}
	if (st != RT_QPS_IDLE)
		rt_qp_set_state(qp, s);
	memset(attr, 0, sizeof(*attr));
	attr->qp_state = s;
	attr->cur_qp_state = s;
	attr->path_mtu = IBV_MTU_1024;
	attr->qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	attr->cap = q->cap;
	attr->max_rd_atomic = 16;
	attr->max_dest_rd_atomic = 16;
	attr->port_num = 1;
	attr->timeout = __atomic_load_n(&q->timeout, __ATOMIC_RELAXED);
	if (init) {
		memset(init, 0, sizeof(*init));
		init->qp_context = qp->qp_context;
		init->send_cq = qp->send_cq;
		init->recv_cq = qp->recv_cq;
		init->srq = qp->srq;
		init->cap = q->cap;
		init->qp_type = IBV_QPT_RC;
		init->sq_sig_all = q->sig_all;
	}
	return 0;
}

int rt_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct rt_qp *q = (struct rt_qp *)qp;
	if (qp->srq) {
		if (bad)
			*bad = wr;
		return EINVAL;
	}
	return post_recv_ring(sess(qp->context), &q->rq, &q->rlock, q->max_recv_sge, wr, bad);
}

static int send_opcode(enum ibv_wr_opcode op, uint8_t *out)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE: *out = RT_OP_RDMA_WRITE; return 0;
	case IBV_WR_RDMA_WRITE_WITH_IMM: *out = RT_OP_RDMA_WRITE_WITH_IMM; return 0;
	case IBV_WR_SEND: *out = RT_OP_SEND; return 0;
	case IBV_WR_SEND_WITH_IMM: *out = RT_OP_SEND_WITH_IMM; return 0;
	case IBV_WR_RDMA_READ: *out = RT_OP_RDMA_READ; return 0;
	case IBV_WR_ATOMIC_CMP_AND_SWP: *out = RT_OP_CMP_SWP; return 0;
	case IBV_WR_ATOMIC_FETCH_AND_ADD: *out = RT_OP_FETCH_ADD; return 0;
	case IBV_WR_LOCAL_INV: *out = RT_OP_LOCAL_INV; return 0;
	case IBV_WR_SEND_WITH_INV: *out = RT_OP_SEND_WITH_INV; return 0;
	case IBV_WR_BIND_MW: *out = RT_OP_BIND_MW; return 0;
	default: return -1; /* TSO, driver opcodes */
	}
}

/* send_flags maps a WR's send flags to the protocol's (7.4). */
static inline uint8_t send_flags(unsigned f)
{
	uint8_t fl = 0;
	if (f & IBV_SEND_SIGNALED)
		fl |= RT_SF_SIGNALED;
	if (f & IBV_SEND_SOLICITED)
		fl |= RT_SF_SOLICITED;
	if (f & IBV_SEND_FENCE)
		fl |= RT_SF_FENCE;
	return fl;
}

/* put_sgl copies a WR's SGL into its entry. */
static inline void put_sgl(struct rt_send_entry *e, const struct ibv_send_wr *wr)
{
	e->nsge = (uint16_t)wr->num_sge;
	for (int i = 0; i < wr->num_sge; i++) {
		e->sge[i].addr = wr->sg_list[i].addr;
		e->sge[i].len = wr->sg_list[i].length;
		e->sge[i].lkey = wr->sg_list[i].lkey;
	}
}

/* put_data fills the data of a Send or an RDMA Write: the SGL, or with
 * IBV_SEND_INLINE its bytes, copied now (the program may reuse its buffer,
 * or never have registered it) into the entry itself or, without
 * RT_FEATURE_INLINE_DATA, into the entry's bounce slot. EINVAL for more
 * inline bytes than the QP's max. */
__attribute__((always_inline)) static inline int put_data(struct rt_qp *q, uint32_t prod, struct rt_send_entry *e, const struct ibv_send_wr *wr, uint8_t *fl)
{
	if (!(wr->send_flags & IBV_SEND_INLINE)) {
		put_sgl(e, wr);
		return 0;
	}
	size_t total = 0;
	for (int i = 0; i < wr->num_sge; i++)
		total += wr->sg_list[i].length;
	if (total > q->max_inline)
		return EINVAL;
	if (!q->bounce) {
		/* The payload travels in the entry. */
		uint8_t *d = (uint8_t *)e + sizeof(*e);
		size_t off = 0;
		for (int i = 0; i < wr->num_sge; i++) {
			memcpy(d + off, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
			off += wr->sg_list[i].length;
		}
		e->data_len = (uint32_t)total;
		*fl |= RT_SF_INLINE | RT_SF_INLINE_DATA;
		return 0;
	}
	uint8_t *slot = q->bounce + (size_t)(prod & (q->sq.cap - 1)) * q->max_inline;
	size_t off = 0;
	for (int i = 0; i < wr->num_sge; i++) {
		memcpy(slot + off, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
		off += wr->sg_list[i].length;
	}
	*fl |= RT_SF_INLINE;
	if (total) {
		e->nsge = 1;
		e->sge[0].addr = (uintptr_t)slot;
		e->sge[0].len = (uint32_t)total;
		e->sge[0].lkey = q->bounce_mr->lkey;
	}
	return 0;
}

/* SEND, SEND_WITH_IMM, SEND_WITH_INV. */
static inline int put_send(struct rt_qp *q, uint32_t prod, struct rt_send_entry *e, const struct ibv_send_wr *wr, uint8_t *fl)
{
	if (wr->opcode == IBV_WR_SEND_WITH_IMM)
		e->imm = wr->imm_data;
	else if (wr->opcode == IBV_WR_SEND_WITH_INV)
		e->inv_rkey = wr->invalidate_rkey;
	return put_data(q, prod, e, wr, fl);
}

/* RDMA_WRITE, RDMA_WRITE_WITH_IMM. */
static inline int put_write(struct rt_qp *q, uint32_t prod, struct rt_send_entry *e, const struct ibv_send_wr *wr, uint8_t *fl)
{
	e->remote_addr = wr->wr.rdma.remote_addr;
	e->rkey = wr->wr.rdma.rkey;
	if (wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
		e->imm = wr->imm_data;
	return put_data(q, prod, e, wr, fl);
}

/* RDMA_READ: the SGL (never inline). */
static inline int put_read(struct rt_send_entry *e, const struct ibv_send_wr *wr)
{
	e->remote_addr = wr->wr.rdma.remote_addr;
	e->rkey = wr->wr.rdma.rkey;
	put_sgl(e, wr);
	return 0;
}

/* ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD. */
static inline int put_atomic(struct rt_send_entry *e, const struct ibv_send_wr *wr)
{
	e->remote_addr = wr->wr.atomic.remote_addr;
	e->rkey = wr->wr.atomic.rkey;
	e->compare_add = wr->wr.atomic.compare_add;
	e->swap = wr->wr.atomic.swap;
	put_sgl(e, wr);
	return 0;
}

/* LOCAL_INV. */
static inline int put_local_inv(struct rt_send_entry *e, const struct ibv_send_wr *wr)
{
	e->inv_rkey = wr->invalidate_rkey;
	put_sgl(e, wr);
	return 0;
}

/* BIND_MW: a type 2 window (protocol 7.3): no SGE, neither inline nor
 * solicited. */
static inline int put_bind_mw(struct rt_send_entry *e, const struct ibv_send_wr *wr)
{
	const struct ibv_mw_bind_info *bi = &wr->bind_mw.bind_info;
	if (!wr->bind_mw.mw || (wr->send_flags & (IBV_SEND_INLINE | IBV_SEND_SOLICITED)))
		return EINVAL;
	e->rkey = wr->bind_mw.rkey;
	e->remote_addr = bi->addr;
	e->compare_add = bi->length;
	e->inv_rkey = bi->mr ? bi->mr->rkey : 0;
	e->imm = bi->mw_access_flags;
	e->swap = ((struct rt_mw *)wr->bind_mw.mw)->h;
	return 0;
}

/* put_wr fills the SQ entry e, at index prod of q's SQ, from wr, whose
 * opcode send_opcode took as op: 0, or EINVAL for a WR the protocol cannot
 * carry (the entry is then not to be published). */
static inline int put_wr(struct rt_qp *q, uint32_t prod, struct rt_send_entry *e, const struct ibv_send_wr *wr, uint8_t op)
{
	memset(e, 0, sizeof(*e));
	e->id = wr->wr_id;
	e->opcode = op;
	uint8_t fl = send_flags(wr->send_flags);
	int err;
	switch (wr->opcode) {
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_IMM:
	case IBV_WR_SEND_WITH_INV:
		err = put_send(q, prod, e, wr, &fl);
		break;
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		err = put_write(q, prod, e, wr, &fl);
		break;
	case IBV_WR_RDMA_READ:
		err = put_read(e, wr);
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		err = put_atomic(e, wr);
		break;
	case IBV_WR_LOCAL_INV:
		err = put_local_inv(e, wr);
		break;
	case IBV_WR_BIND_MW:
		err = put_bind_mw(e, wr);
		break;
	default:
		err = EINVAL; /* send_opcode refuses it first */
		break;
	}
	if (!err)
		e->flags = fl;
	return err;
}

int rt_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct rt_qp *q = (struct rt_qp *)qp;
	int err = 0;
	enum ibv_qp_state st = qp_state(qp);
	if (st == IBV_QPS_RESET || st == IBV_QPS_INIT) {
		/* Not connected, nor being connected by the CM (RTR): siw's
		 * ENOTCONN. */
		if (bad)
			*bad = wr;
		return ENOTCONN;
	}
	active();
	pthread_spin_lock(&q->slock);
	uint32_t prod = q->sq.idx, start = prod;
	uint32_t cons = rt_load32(ring_word(&q->sq, RING_CONS));
	for (; wr; wr = wr->next) {
		uint8_t op;
		if (send_opcode(wr->opcode, &op) < 0 || wr->num_sge < 0 || (uint32_t)wr->num_sge > q->max_send_sge ||
		    (wr->send_flags & ~(unsigned)(IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE))) {
			err = EINVAL;
			break;
		}
		if (!ring_room(sess(qp->context), &q->sq, prod, &cons)) {
			err = ENOMEM;
			break;
		}
		err = put_wr(q, prod, (struct rt_send_entry *)(void *)ring_entry(&q->sq, prod), wr, op);
		if (err)
			break;
		prod++;
	}
	if (prod != start) {
		q->sq.idx = prod;
		rt_store32(ring_word(&q->sq, RING_PROD), prod);
	}
	pthread_spin_unlock(&q->slock);
	if (prod != start)
		rt_ring_doorbell(sess(qp->context));
	if (err && bad)
		*bad = wr;
	return err;
}

/* ---- memory windows ---- */

struct ibv_mw *rt_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) {
		errno = EINVAL;
		return NULL;
	}
	struct rt_msg *m = new_msg();
	struct rt_mw *w = calloc(1, sizeof(*w));
	if (!m || !w) {
		free(m);
		free(w);
		errno = ENOMEM;
		return NULL;
	}
	uint64_t args[2] = {((struct rt_pd *)pd)->h, type == IBV_MW_TYPE_1 ? 1 : 2};
	int e = call(sess(pd->context), RT_ALLOC_MW, args, 2, NULL, 0, m);
	if (e) {
		free(m);
		free(w);
		errno = e;
		return NULL;
	}
	w->h = m->args[0];
	w->mw.context = pd->context;
	w->mw.pd = pd;
	w->mw.rkey = (uint32_t)m->args[1];
	w->mw.handle = (uint32_t)w->h;
	w->mw.type = type;
	free(m);
	return &w->mw;
}

int rt_dealloc_mw(struct ibv_mw *mw)
{
	struct rt_mw *w = (struct rt_mw *)mw;
	int e = call_noreply(sess(mw->context), RT_DEALLOC_MW, &w->h, 1);
	if (e)
		return e;
	free(w);
	return 0;
}

/* rt_bind_mw binds a type 1 window (BIND_MW message); the bind completes in
 * the QP's send queue order. */
int rt_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *b)
{
	struct rt_mw *w = (struct rt_mw *)mw;
	const struct ibv_mw_bind_info *i = &b->bind_info;
	if (b->send_flags & ~(unsigned)(IBV_SEND_SIGNALED | IBV_SEND_FENCE))
		return EINVAL;
	struct rt_msg *m = new_msg();
	if (!m)
		return ENOMEM;
	uint64_t args[8] = {qp->qp_num, w->h, b->wr_id, send_flags(b->send_flags), i->mr ? i->mr->rkey : 0, i->addr, i->length,
			    i->mw_access_flags};
	int e = call(sess(qp->context), RT_BIND_MW, args, 8, NULL, 0, m);
	if (!e)
		mw->rkey = (uint32_t)m->args[0];
	free(m);
	return e;
}
