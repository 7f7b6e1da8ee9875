/* session.c: the process's session with the rdmatap service: connection,
 * HELLO, the reader thread, calls and unsolicited-message handlers. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "rt_internal.h"

struct pending {
	struct pending *next;
	uint32_t seq;
	int done;
	struct rt_msg *rep; /* the reply, once done (sync calls) */
	void (*fn)(void *ctx, struct rt_msg *rep);
	void *ctx;
};

struct handler {
	struct handler *next;
	uint16_t type;
	void (*fn)(void *ctx, uint16_t type, const struct rt_msg *msg);
	void *ctx;
};

struct rt_session {
	int sock;
	int doorbell;
	uint32_t *ctl;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint32_t next_seq;
	int dead;
	struct pending *pend;
	struct handler *handlers;
	char devname[64];
	uint64_t flags, features, id;
	int have_limits;
	uint64_t limits[RT_QD_ARGS];
};

/* Defaults of the service's limits (protocol 6.1) for a service that does
 * not offer QUERY_DEVICE. */
static const uint64_t default_limits[RT_QD_ARGS] = {
	[RT_QD_MAX_QP] = 1024,
	[RT_QD_MAX_QP_WR] = 16384,
	[RT_QD_MAX_SGE] = 64,
	[RT_QD_MAX_SGE_RD] = 64,
	[RT_QD_MAX_CQ] = 1024,
	[RT_QD_MAX_CQE] = 65536,
	[RT_QD_MAX_MR] = 4096,
	[RT_QD_MAX_MR_SIZE] = 1ULL << 30,
	[RT_QD_MAX_PD] = 1024,
	[RT_QD_MAX_QP_RD_ATOM] = 16,
	[RT_QD_MAX_QP_INIT_RD] = 16,
	[RT_QD_MAX_SRQ] = 1024,
	[RT_QD_MAX_SRQ_WR] = 16384,
	[RT_QD_MAX_SRQ_SGE] = 64,
	[RT_QD_MAX_INLINE] = 4096,
	[RT_QD_MAX_PRIV_DATA] = 508,
	[RT_QD_MAX_MSG_SIZE] = 1ULL << 31,
	[RT_QD_ATOMIC_CAP] = 1,
	[RT_QD_PAGE_SIZE_CAP] = 0xfffff000,
	[RT_QD_MAX_MW] = 4096,
	[RT_QD_MAX_FR_PAGES] = 1 << 20,
	[RT_QD_VENDOR_PART_ID] = 0,
	[RT_QD_VENDOR_ID] = 0,
};

static pthread_mutex_t session_mu = PTHREAD_MUTEX_INITIALIZER;
static struct rt_session *session;
static int atfork_done;

void rt_debug(const char *fmt, ...)
{
	static int on = -1;
	if (on < 0)
		on = getenv("RDMATAP_DEBUG") != NULL;
	if (!on)
		return;
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "rdmatap: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
}

/* ---- wire encoding ---- */

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

static void close_fds(const int *fds, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		close(fds[i]);
}

/* send_msg encodes and sends one request with seq. */
static int send_msg(int sock, const struct rt_request *req, uint32_t seq)
{
	uint8_t buf[RT_MAX_MSG];
	if (req->nargs > RT_MAX_ARGS || req->nfds > RT_MAX_FDS) {
		errno = EINVAL;
		return -1;
	}
	size_t n = RT_HDR_SIZE + 8 * (size_t)req->nargs;
	for (unsigned i = 0; i < req->nfields; i++) {
		if (n + 2 + req->fields[i].len > RT_MAX_MSG) {
			errno = EMSGSIZE;
			return -1;
		}
		put16(buf + n, req->fields[i].len);
		if (req->fields[i].len)
			memcpy(buf + n + 2, req->fields[i].data, req->fields[i].len);
		n += 2 + req->fields[i].len;
	}
	put16(buf, req->type);
	buf[2] = req->nargs;
	buf[3] = 0;
	put32(buf + 4, seq);
	put32(buf + 8, 0);
	put32(buf + 12, (uint32_t)(n - RT_HDR_SIZE - 8 * (size_t)req->nargs));
	for (unsigned i = 0; i < req->nargs; i++)
		put64(buf + RT_HDR_SIZE + 8 * i, req->args[i]);

	struct iovec iov = {.iov_base = buf, .iov_len = n};
	union {
		char b[CMSG_SPACE(sizeof(int) * RT_MAX_FDS)];
		struct cmsghdr align;
	} ctl;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (req->nfds) {
		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.b;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * req->nfds);
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * req->nfds);
		memcpy(CMSG_DATA(c), req->fds, sizeof(int) * req->nfds);
	}
	for (;;) {
		ssize_t w = sendmsg(sock, &mh, MSG_NOSIGNAL);
		if (w == (ssize_t)n)
			return 0;
		if (w < 0 && errno == EINTR)
			continue;
		if (w >= 0)
			errno = EIO;
		return -1;
	}
}

/* recv_msg reads and decodes one message. Returns 0, or -1 at end of file
 * or on an error (errno). A malformed message gives EPROTO. */
static int recv_msg(int sock, struct rt_msg *m)
{
	uint8_t buf[RT_MAX_MSG];
	union {
		char b[CMSG_SPACE(sizeof(int) * RT_MAX_FDS)];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf)};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof(ctl.b)};
	ssize_t n;
	do
		n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -1;
	m->nfds = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		int fds[RT_MAX_FDS];
		if (k > RT_MAX_FDS)
			k = RT_MAX_FDS;
		memcpy(fds, CMSG_DATA(c), k * sizeof(int));
		for (size_t i = 0; i < k; i++) {
			if (m->nfds < RT_MAX_FDS)
				m->fds[m->nfds++] = fds[i];
			else
				close(fds[i]);
		}
	}
	if (n == 0) {
		close_fds(m->fds, m->nfds);
		errno = ECONNRESET;
		return -1;
	}
	uint8_t nargs = n >= RT_HDR_SIZE ? buf[2] : 0;
	if (n < RT_HDR_SIZE || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || nargs > RT_MAX_ARGS || buf[3] != 0 ||
	    (size_t)n != RT_HDR_SIZE + 8 * (size_t)nargs + get32(buf + 12)) {
		close_fds(m->fds, m->nfds);
		errno = EPROTO;
		return -1;
	}
	m->type = get16(buf);
	m->nargs = nargs;
	m->seq = get32(buf + 4);
	m->status = get32(buf + 8);
	memset(m->args, 0, sizeof(m->args));
	for (unsigned i = 0; i < nargs; i++)
		m->args[i] = get64(buf + RT_HDR_SIZE + 8 * i);
	m->payload_len = get32(buf + 12);
	memcpy(m->payload, buf + RT_HDR_SIZE + 8 * nargs, m->payload_len);
	return 0;
}

RT_VISIBLE int rt_msg_field(const struct rt_msg *m, unsigned i, const uint8_t **data, uint16_t *len)
{
	uint32_t off = 0;
	for (unsigned k = 0;; k++) {
		if (off + 2 > m->payload_len)
			return -1;
		uint16_t l = get16(m->payload + off);
		if (off + 2 + l > m->payload_len)
			return -1;
		if (k == i) {
			*data = m->payload + off + 2;
			*len = l;
			return 0;
		}
		off += 2 + l;
	}
}

RT_VISIBLE int rt_msg_errno(const struct rt_msg *m)
{
	switch (m->status) {
	case RT_OK:
		return 0;
	case RT_BUSY:
		return EBUSY;
	case RT_CLOSED:
		return ECONNRESET;
	case RT_QUEUE_FULL:
	case RT_LIMIT:
		return ENOMEM;
	case RT_REJECTED:
	case RT_MARKERS:
	case RT_NO_MATCHING_RTR:
		return ECONNREFUSED;
	case RT_PERMISSION:
		return EACCES;
	case RT_CANCELED:
		return ECANCELED;
	case RT_VERSION:
		return EPROTO;
	case RT_TIMEOUT:
		return ETIMEDOUT;
	case RT_ERRNO:
		if (m->args[0] > 0 && m->args[0] < 4096)
			return (int)m->args[0];
		return EIO;
	case RT_GENERAL:
		return EIO;
	default:
		return EINVAL;
	}
}

/* ---- the reader thread ---- */

static void closed_msg(struct rt_msg *m, uint32_t seq)
{
	memset(m, 0, offsetof(struct rt_msg, payload));
	m->seq = seq;
	m->status = RT_CLOSED;
}

static void run_handlers(struct rt_session *s, uint16_t type, const struct rt_msg *m)
{
	/* Handlers are only ever appended, with atomic stores. */
	for (struct handler *h = __atomic_load_n(&s->handlers, __ATOMIC_ACQUIRE); h; h = __atomic_load_n(&h->next, __ATOMIC_ACQUIRE))
		if (h->type == type)
			h->fn(h->ctx, type, m);
}

/* dispatch_mu is held while the reader thread handles a message, and by
 * rt_quiesce_begin: registration moves heap pages, and a write the reader
 * thread (or a handler it runs) made to them meanwhile would be lost. */
static pthread_mutex_t dispatch_mu = PTHREAD_MUTEX_INITIALIZER;
static __thread int on_reader;

void rt_quiesce_begin(void)
{
	if (!on_reader)
		pthread_mutex_lock(&dispatch_mu);
}

void rt_quiesce_end(void)
{
	if (!on_reader)
		pthread_mutex_unlock(&dispatch_mu);
}

void rt_quiesce_reset(void) { pthread_mutex_init(&dispatch_mu, NULL); }

/* dispatch hands one message to its call or handlers; it returns whether
 * m was kept (a reply a caller waits for). */
static int dispatch(struct rt_session *s, struct rt_msg *m)
{
	if (m->seq == 0 && m->status == RT_OK && (m->type == RT_EVENT || m->type == RT_QP_DONE)) {
		close_fds(m->fds, m->nfds);
		m->nfds = 0;
		run_handlers(s, m->type, m);
		return 0;
	}
	if (m->type == RT_ERROR && m->seq == 0) {
		rt_debug("the service could not read a message");
		return 0;
	}
	pthread_mutex_lock(&s->mu);
	struct pending **pp = &s->pend, *p;
	while ((p = *pp) && p->seq != m->seq)
		pp = &p->next;
	if (!p) {
		pthread_mutex_unlock(&s->mu);
		close_fds(m->fds, m->nfds);
		return 0;
	}
	if (p->fn) {
		*pp = p->next;
		pthread_mutex_unlock(&s->mu);
		p->fn(p->ctx, m);
		free(p);
		return 0;
	}
	p->rep = m;
	p->done = 1;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return 1;
}

static void *reader(void *arg)
{
	struct rt_session *s = arg;
	on_reader = 1;
	struct rt_msg *m = malloc(sizeof(*m));
	while (m) {
		if (recv_msg(s->sock, m) < 0) {
			if (errno == EPROTO)
				rt_debug("malformed message from the service");
			break;
		}
		pthread_mutex_lock(&dispatch_mu);
		int kept = dispatch(s, m);
		pthread_mutex_unlock(&dispatch_mu);
		if (kept)
			m = malloc(sizeof(*m));
	}
	free(m);
	/* The session ended: fail every call, tell the handlers. */
	pthread_mutex_lock(&dispatch_mu);
	pthread_mutex_lock(&s->mu);
	__atomic_store_n(&s->dead, 1, __ATOMIC_SEQ_CST);
	struct pending *list = s->pend, *keep = NULL;
	s->pend = NULL;
	while (list) {
		struct pending *p = list;
		list = p->next;
		if (p->fn) {
			pthread_mutex_unlock(&s->mu);
			struct rt_msg *c = malloc(sizeof(*c));
			if (c) {
				closed_msg(c, p->seq);
				p->fn(p->ctx, c);
				free(c);
			}
			free(p);
			pthread_mutex_lock(&s->mu);
		} else {
			p->done = 1; /* rep NULL: closed */
			p->next = keep;
			keep = p;
		}
	}
	s->pend = keep;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	run_handlers(s, 0, NULL);
	pthread_mutex_unlock(&dispatch_mu);
	return NULL;
}

/* ---- connecting ---- */

static void child_after_fork(void)
{
	/* The child shares the parent's socket: forget the session there (its
	 * reader thread does not exist in the child, and may have held the
	 * dispatch lock at the fork); the next use connects. */
	if (session) {
		close(session->sock);
		session = NULL;
	}
	pthread_mutex_init(&session_mu, NULL);
	rt_quiesce_reset();
}

static int hello(struct rt_session *s)
{
	uint64_t args[3] = {RT_MAGIC, RT_VERSION_NUM, RT_FEATURES};
	struct rt_request req = {.type = RT_HELLO, .nargs = 3, .args = args};
	if (send_msg(s->sock, &req, 0) < 0 && errno != EPIPE && errno != ECONNRESET)
		return -1;
	struct rt_msg *m = malloc(sizeof(*m));
	if (!m)
		return -1;
	if (recv_msg(s->sock, m) < 0) {
		free(m);
		return -1;
	}
	const uint8_t *name;
	uint16_t nlen;
	if (m->type != RT_HELLO || m->status != RT_OK || m->nfds != 2) {
		if (m->status != RT_OK && rt_msg_field(m, 0, &name, &nlen) == 0)
			fprintf(stderr, "rdmatap: the service refused the session: %.*s\n", (int)nlen, name);
		close_fds(m->fds, m->nfds);
		int e = m->status == RT_LIMIT ? EAGAIN : EPROTO;
		free(m);
		errno = e;
		return -1;
	}
	s->flags = m->args[RT_HELLO_FLAGS];
	s->id = m->args[RT_HELLO_ID];
	s->features = m->args[RT_HELLO_FEATURES] & RT_FEATURES;
	if (rt_msg_field(m, 0, &name, &nlen) == 0) {
		if (nlen >= sizeof(s->devname))
			nlen = sizeof(s->devname) - 1;
		memcpy(s->devname, name, nlen);
		s->devname[nlen] = 0;
	}
	struct stat st;
	int ctlfd = m->fds[0];
	s->doorbell = m->fds[1];
	free(m);
	if (fstat(ctlfd, &st) < 0 || st.st_size < 4096) {
		close(ctlfd);
		errno = EPROTO;
		return -1;
	}
	void *ctl = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, ctlfd, 0);
	close(ctlfd);
	if (ctl == MAP_FAILED)
		return -1;
	madvise(ctl, 4096, MADV_DONTFORK);
	s->ctl = ctl;
	return 0;
}

static struct rt_session *connect_session(void)
{
	const char *path = getenv("RDMATAP_SOCKET");
	if (!path || !*path) {
		errno = ENOENT;
		return NULL;
	}
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof(sa.sun_path)) {
		errno = ENAMETOOLONG;
		return NULL;
	}
	strcpy(sa.sun_path, path);
	struct rt_session *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->doorbell = -1;
	s->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s->sock < 0 || connect(s->sock, (struct sockaddr *)&sa, sizeof(sa)) < 0 || hello(s) < 0) {
		int e = errno;
		rt_debug("connecting to %s: %s", path, strerror(e));
		if (s->sock >= 0)
			close(s->sock);
		if (s->doorbell >= 0)
			close(s->doorbell);
		free(s);
		errno = e;
		return NULL;
	}
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	s->next_seq = 1;
	if (s->features & RT_FEATURE_QUERY_DEVICE) {
		struct rt_msg *m = malloc(sizeof(*m));
		struct rt_request q = {.type = RT_QUERY_DEVICE};
		if (m && send_msg(s->sock, &q, s->next_seq++) == 0 && recv_msg(s->sock, m) == 0 && m->type == RT_QUERY_DEVICE &&
		    m->status == RT_OK) {
			memcpy(s->limits, m->args, sizeof(s->limits));
			s->have_limits = 1;
			close_fds(m->fds, m->nfds);
		}
		free(m);
	}
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	pthread_t t;
	int err = pthread_create(&t, &at, reader, s);
	pthread_attr_destroy(&at);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (err) {
		close(s->sock);
		close(s->doorbell);
		munmap(s->ctl, 4096);
		free(s);
		errno = err;
		return NULL;
	}
	rt_debug("session %llu on device %s", (unsigned long long)s->id, s->devname);
	return s;
}

RT_VISIBLE struct rt_session *rt_session_get(void)
{
	struct rt_session *s = __atomic_load_n(&session, __ATOMIC_ACQUIRE);
	if (s)
		return s;
	pthread_mutex_lock(&session_mu);
	if (!atfork_done) {
		pthread_atfork(NULL, NULL, child_after_fork);
		atfork_done = 1;
	}
	s = session;
	if (!s) {
		s = connect_session();
		if (s)
			__atomic_store_n(&session, s, __ATOMIC_RELEASE);
	}
	int e = errno;
	pthread_mutex_unlock(&session_mu);
	errno = e;
	return s;
}

RT_VISIBLE const char *rt_session_device_name(struct rt_session *s) { return s->devname; }

RT_VISIBLE int rt_session_dead(struct rt_session *s) { return __atomic_load_n(&s->dead, __ATOMIC_SEQ_CST); }

uint32_t *rt_session_ctl(struct rt_session *s) { return s->ctl; }
int rt_session_doorbell(struct rt_session *s) { return s->doorbell; }
const uint64_t *rt_session_limits(struct rt_session *s) { return s->have_limits ? s->limits : default_limits; }
uint64_t rt_limit(struct rt_session *s, enum rt_query_device_arg i) { return rt_session_limits(s)[i]; }
uint64_t rt_session_flags(struct rt_session *s) { return s->flags; }
RT_VISIBLE uint64_t rt_session_features(struct rt_session *s) { return s->features; }

void rt_ring_doorbell(struct rt_session *s)
{
	if (rt_load32(s->ctl) != 0) {
		uint64_t one = 1;
		ssize_t w = write(s->doorbell, &one, sizeof(one));
		(void)w; /* EAGAIN: the counter is full, a wake-up is pending anyway */
	}
}

/* ---- calls ---- */

static uint32_t start(struct rt_session *s, const struct rt_request *req, void (*fn)(void *, struct rt_msg *), void *ctx)
{
	struct pending *p = calloc(1, sizeof(*p));
	if (!p)
		return 0;
	int cs;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cs); /* sendmsg under the lock */
	p->fn = fn;
	p->ctx = ctx;
	pthread_mutex_lock(&s->mu);
	if (s->dead) {
		pthread_mutex_unlock(&s->mu);
		pthread_setcancelstate(cs, NULL);
		free(p);
		errno = ECONNRESET;
		return 0;
	}
	uint32_t seq = s->next_seq++;
	if (seq == 0)
		seq = s->next_seq++;
	p->seq = seq;
	p->next = s->pend;
	s->pend = p;
	/* Send under the lock: the reply cannot overtake the registration,
	 * and a failed send unlinks cleanly. */
	int r = send_msg(s->sock, req, seq);
	int e = errno;
	if (r < 0) {
		s->pend = p->next;
		pthread_mutex_unlock(&s->mu);
		pthread_setcancelstate(cs, NULL);
		free(p);
		errno = e == EPIPE ? ECONNRESET : e;
		return 0;
	}
	pthread_mutex_unlock(&s->mu);
	pthread_setcancelstate(cs, NULL);
	return seq;
}

RT_VISIBLE uint32_t rt_call_send(struct rt_session *s, const struct rt_request *req) { return start(s, req, NULL, NULL); }

RT_VISIBLE uint32_t rt_call_async(struct rt_session *s, const struct rt_request *req, void (*done)(void *ctx, struct rt_msg *rep),
				  void *ctx)
{
	if (!done) {
		errno = EINVAL;
		return 0;
	}
	return start(s, req, done, ctx);
}

RT_VISIBLE int rt_call_wait(struct rt_session *s, uint32_t seq, struct rt_msg *rep)
{
	/* A call is not a cancellation point: a thread canceled in the wait
	 * would leave the session locked and the reply unclaimed. */
	int cs;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cs);
	pthread_mutex_lock(&s->mu);
	struct pending **pp = &s->pend, *p;
	while ((p = *pp) && p->seq != seq)
		pp = &p->next;
	if (!p || p->fn) {
		pthread_mutex_unlock(&s->mu);
		pthread_setcancelstate(cs, NULL);
		errno = EINVAL;
		return -1;
	}
	while (!p->done)
		pthread_cond_wait(&s->cv, &s->mu);
	/* find it again: the list may have changed */
	for (pp = &s->pend; *pp != p; pp = &(*pp)->next)
		;
	*pp = p->next;
	pthread_mutex_unlock(&s->mu);
	pthread_setcancelstate(cs, NULL);
	struct rt_msg *m = p->rep;
	free(p);
	if (!m) {
		closed_msg(rep, seq);
		errno = ECONNRESET;
		return -1;
	}
	memcpy(rep, m, offsetof(struct rt_msg, payload) + m->payload_len);
	free(m);
	if (rep->status != RT_OK) {
		close_fds(rep->fds, rep->nfds);
		rep->nfds = 0;
		const uint8_t *t;
		uint16_t l;
		if (rt_msg_field(rep, 0, &t, &l) == 0)
			rt_debug("call %u (type %u): status %u: %.*s", seq, rep->type, rep->status, (int)l, t);
		errno = rt_msg_errno(rep);
		return -1;
	}
	return 0;
}

RT_VISIBLE int rt_call(struct rt_session *s, const struct rt_request *req, struct rt_msg *rep)
{
	uint32_t seq = rt_call_send(s, req);
	if (!seq) {
		int e = errno;
		closed_msg(rep, 0);
		errno = e;
		return -1;
	}
	return rt_call_wait(s, seq, rep);
}

RT_VISIBLE void rt_cancel(struct rt_session *s, uint32_t seq)
{
	uint64_t a = seq;
	struct rt_request req = {.type = RT_CANCEL, .nargs = 1, .args = &a};
	int cs;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cs);
	pthread_mutex_lock(&s->mu);
	if (!s->dead)
		send_msg(s->sock, &req, 0);
	pthread_mutex_unlock(&s->mu);
	pthread_setcancelstate(cs, NULL);
}

RT_VISIBLE int rt_add_handler(struct rt_session *s, uint16_t msg_type,
			      void (*fn)(void *ctx, uint16_t msg_type, const struct rt_msg *msg), void *ctx)
{
	struct handler *h = malloc(sizeof(*h));
	if (!h)
		return -1;
	h->type = msg_type;
	h->fn = fn;
	h->ctx = ctx;
	pthread_mutex_lock(&s->mu);
	/* Append, keeping registration order; the list is only ever extended. */
	struct handler **pp = &s->handlers;
	while (*pp)
		pp = &(*pp)->next;
	h->next = NULL;
	__atomic_store_n(pp, h, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&s->mu);
	return 0;
}
