/*
 * librdmacm.so.1 for rdmatap: the connection manager of rdma_cma.h on the
 * service protocol (docs/service-protocol.md, section 5.6), on top of
 * rdmatap's libibverbs.so.1 and its private interface rdmatap_core.h.
 *
 * The protocol connects QPs: DIAL connects a QP to an address, LISTEN and
 * GET_REQUEST hand out connection requests, ACCEPT and REJECT answer them,
 * DISCONNECT closes. Everything else of the CM is local: binding records
 * an address until rdma_listen, address and route resolution record the
 * peer and report success at once (a peer that cannot be reached shows up
 * as the connection's failure). DIAL, ACCEPT and GET_REQUEST run as
 * asynchronous calls whose replies become events; the service's
 * DISCONNECTED event of a connected QP becomes RDMA_CM_EVENT_DISCONNECTED.
 *
 * An event channel's descriptor is a semaphore eventfd counting queued
 * events: it polls readable while one waits, and reading it (blocking or
 * not, as the descriptor's flags say) takes the right to one event.
 *
 * One mutex guards every ID, channel and event of the process: the CM is
 * not a data path.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include "cm.h"
#include "rdmatap_core.h"

/* The layouts programs read (rdma-core 44's, x86-64 and every LP64 ABI). */
#if defined(__LP64__)
_Static_assert(sizeof(struct rdma_event_channel) == 4, "rdma_event_channel");
_Static_assert(offsetof(struct rdma_cm_id, verbs) == 0, "rdma_cm_id.verbs");
_Static_assert(offsetof(struct rdma_cm_id, channel) == 8, "rdma_cm_id.channel");
_Static_assert(offsetof(struct rdma_cm_id, context) == 16, "rdma_cm_id.context");
_Static_assert(offsetof(struct rdma_cm_id, qp) == 24, "rdma_cm_id.qp");
_Static_assert(offsetof(struct rdma_cm_id, route) == 32, "rdma_cm_id.route");
_Static_assert(sizeof(struct rdma_addr) == 296, "rdma_addr");
_Static_assert(offsetof(struct rdma_cm_id, ps) == 344, "rdma_cm_id.ps");
_Static_assert(offsetof(struct rdma_cm_id, port_num) == 348, "rdma_cm_id.port_num");
_Static_assert(offsetof(struct rdma_cm_id, event) == 352, "rdma_cm_id.event");
_Static_assert(offsetof(struct rdma_cm_id, send_cq_channel) == 360, "rdma_cm_id.send_cq_channel");
_Static_assert(offsetof(struct rdma_cm_id, pd) == 400, "rdma_cm_id.pd");
_Static_assert(offsetof(struct rdma_cm_id, qp_type) == 408, "rdma_cm_id.qp_type");
_Static_assert(sizeof(struct rdma_cm_id) == 416, "rdma_cm_id");
_Static_assert(offsetof(struct rdma_cm_event, event) == 16, "rdma_cm_event.event");
_Static_assert(offsetof(struct rdma_cm_event, status) == 20, "rdma_cm_event.status");
_Static_assert(offsetof(struct rdma_cm_event, param) == 24, "rdma_cm_event.param");
_Static_assert(sizeof(struct rdma_cm_event) == 80, "rdma_cm_event");
_Static_assert(sizeof(struct rdma_conn_param) == 24, "rdma_conn_param");
_Static_assert(offsetof(struct rdma_conn_param, qp_num) == 16, "rdma_conn_param.qp_num");
_Static_assert(sizeof(struct rdma_addrinfo) == 96, "rdma_addrinfo");
_Static_assert(offsetof(struct rdma_addrinfo, ai_src_addr) == 24, "rdma_addrinfo.ai_src_addr");
_Static_assert(offsetof(struct rdma_addrinfo, ai_next) == 88, "rdma_addrinfo.ai_next");
#endif

enum cm_state {
	ST_IDLE,
	ST_BOUND,
	ST_ADDR,	/* address resolved */
	ST_ROUTE,	/* route resolved */
	ST_LISTEN,
	ST_REQ,		/* a connection request not answered yet */
	ST_CONNECTING,	/* DIAL in progress */
	ST_ACCEPTING,	/* ACCEPT in progress */
	ST_CONNECTED,
	ST_DISCONNECTED,
	ST_FAILED,
};

struct cm_channel {
	struct rdma_event_channel ch; /* first: programs hold a pointer to it */
	struct cm_event *head, *tail;
};

struct cm_id {
	struct rdma_cm_id id; /* first: programs hold a pointer to it */
	struct cm_id *next;
	enum cm_state state;
	int sync;		/* created without a channel: owns id.channel */
	uint64_t listener;	/* LISTEN's handle */
	uint64_t req;		/* the connection request of a child */
	uint32_t qpn;		/* QP connected or being connected */
	uint32_t seq;		/* DIAL or ACCEPT in progress */
	int refs;		/* asynchronous calls that will still touch the ID */
	int unacked;		/* events handed out and not acknowledged */
	int destroying;
	int early_disc;		/* DISCONNECTED came before DIAL's or ACCEPT's reply */
	int own_cqs;		/* rdma_create_qp made the CQs and channels */
	struct ibv_qp_init_attr *ep_attr; /* rdma_create_ep of a listener */
	struct ibv_pd *ep_pd;
	uint8_t req_resp, req_init; /* a request's: what its initiator may read and answers */
	uint8_t tos, ack_timeout;
	int ack_timeout_set; /* RDMA_OPTION_ID_ACK_TIMEOUT given: the CM sets it on the QP it connects */
	int reuseaddr, afonly;
	int bound; /* rdma_bind_addr gave the source address: connect from it */
	int ext_qp;	   /* rdma_connect of an ID without a QP: its program's QP, conn_param->qp_num */
	int resp_pending; /* CONNECT_RESPONSE handed out, rdma_establish not called yet */
};

struct cm_event {
	struct rdma_cm_event ev; /* first: programs hold a pointer to it */
	struct cm_event *next;
	struct cm_id *owner;	/* whose unacked count the event holds */
	struct cm_channel *ch;
	uint8_t pdata[256];
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static struct cm_id *ids;
static struct rt_session *handled; /* the session our handlers are on */

static void on_event(void *unused, uint16_t type, const struct rt_msg *m);

/* The session the IDs' calls went to (NULL before the first). */
static struct rt_session *cur_session(void) { return __atomic_load_n(&handled, __ATOMIC_ACQUIRE); }

/* fork() copies the mutex as it is: held across the fork, it is released
 * on both sides (a child, such as qperf's server's, makes its own IDs). */
static void fork_prepare(void) { pthread_mutex_lock(&mu); }
static void fork_release(void) { pthread_mutex_unlock(&mu); }
static void fork_init(void) { pthread_atfork(fork_prepare, fork_release, fork_release); }

static struct rt_session *session(void)
{
	static pthread_mutex_t hmu = PTHREAD_MUTEX_INITIALIZER;
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, fork_init);
	struct rt_session *s = rt_session_get();
	if (!s)
		return NULL;
	pthread_mutex_lock(&hmu);
	if (__atomic_load_n(&handled, __ATOMIC_ACQUIRE) != s) {
		if (rt_add_handler(s, RT_EVENT, on_event, NULL) || rt_add_handler(s, 0, on_event, NULL)) {
			pthread_mutex_unlock(&hmu);
			return NULL;
		}
		__atomic_store_n(&handled, s, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&hmu);
	return s;
}

static struct cm_id *to_id(struct rdma_cm_id *id) { return (struct cm_id *)id; }
static struct cm_channel *to_ch(struct rdma_event_channel *ch) { return (struct cm_channel *)ch; }

/* ---- event channels ---- */

static struct cm_channel *channel_new(void)
{
	struct cm_channel *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->ch.fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
	if (c->ch.fd < 0) {
		int e = errno;
		free(c);
		errno = e;
		return NULL;
	}
	return c;
}

static void channel_free(struct cm_channel *c)
{
	while (c->head) {
		struct cm_event *e = c->head;
		c->head = e->next;
		free(e);
	}
	close(c->ch.fd);
	free(c);
}

struct rdma_event_channel *rdma_create_event_channel(void)
{
	struct cm_channel *c = channel_new();
	return c ? &c->ch : NULL;
}

void rdma_destroy_event_channel(struct rdma_event_channel *channel)
{
	if (!channel)
		return;
	pthread_mutex_lock(&mu);
	struct cm_channel *c = to_ch(channel);
	/* Undelivered events of IDs destroyed already; an ID still on the
	 * channel is the program's error, as with librdmacm. */
	struct cm_event **pp = &c->head;
	while (*pp) {
		struct cm_event *e = *pp;
		*pp = e->next;
		free(e);
	}
	c->tail = NULL;
	pthread_mutex_unlock(&mu);
	channel_free(c);
}

/* Take back the token of an event that leaves the queue unread, without
 * waiting: if a reader holds it already, that reader finds the queue
 * shorter and waits on (kernels whose eventfd ignores RWF_NOWAIT leave the
 * token: a reader then wakes once for nothing). */
static void take_token(struct cm_channel *c)
{
	uint64_t v;
	struct iovec io = {&v, sizeof(v)};
	ssize_t r = preadv2(c->ch.fd, &io, 1, -1, RWF_NOWAIT);
	(void)r;
}

/* Queue an event (mu held). owner's unacked count holds it once handed out. */
static struct cm_event *push_event(struct cm_channel *ch, struct cm_id *owner, struct cm_id *id,
				   enum rdma_cm_event_type type, int status)
{
	struct cm_event *e = calloc(1, sizeof(*e));
	if (!e)
		return NULL; /* the program sees no event: as a lost one */
	e->ev.id = &id->id;
	e->ev.event = type;
	e->ev.status = status;
	e->owner = owner;
	e->ch = ch;
	if (ch->tail)
		ch->tail->next = e;
	else
		ch->head = e;
	ch->tail = e;
	uint64_t one = 1;
	if (write(ch->ch.fd, &one, sizeof(one)) != sizeof(one)) {
		/* The counter cannot overflow in practice (2^64 - 2 events). */
	}
	return e;
}

static void event_pdata(struct cm_event *e, const uint8_t *data, uint16_t len)
{
	if (len > sizeof(e->pdata) - 1)
		len = sizeof(e->pdata) - 1;
	if (len) {
		memcpy(e->pdata, data, len);
		e->ev.param.conn.private_data = e->pdata;
		e->ev.param.conn.private_data_len = (uint8_t)len;
	}
}

int rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event)
{
	if (!channel || !event)
		return cm_set_errno(EINVAL);
	struct cm_channel *c = to_ch(channel);
	for (;;) {
		uint64_t v;
		ssize_t r = read(c->ch.fd, &v, sizeof(v));
		if (r < 0)
			return -1; /* EAGAIN on a non-blocking channel; EINTR as librdmacm's */
		pthread_mutex_lock(&mu);
		struct cm_event *e = c->head;
		if (e) {
			c->head = e->next;
			if (!c->head)
				c->tail = NULL;
			e->next = NULL;
			e->owner->unacked++;
		}
		pthread_mutex_unlock(&mu);
		if (e) {
			*event = &e->ev;
			return 0;
		}
		/* A token whose event left with its destroyed ID: wait on. */
	}
}

int rdma_ack_cm_event(struct rdma_cm_event *event)
{
	if (!event)
		return cm_set_errno(EINVAL);
	struct cm_event *e = (struct cm_event *)event;
	pthread_mutex_lock(&mu);
	e->owner->unacked--;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	free(e);
	return 0;
}

/* ---- IDs ---- */

static struct cm_id *id_new(struct rdma_event_channel *channel, void *context, enum rdma_port_space ps)
{
	struct cm_id *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	if (!channel) {
		struct cm_channel *ch = channel_new();
		if (!ch) {
			free(c);
			return NULL;
		}
		channel = &ch->ch;
		c->sync = 1;
	}
	c->id.channel = channel;
	c->id.context = context;
	c->id.ps = ps;
	c->id.port_num = 1;
	c->id.qp_type = ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB ? IBV_QPT_UD : IBV_QPT_RC;
	return c;
}

/* Link a new ID into the list (mu held). */
static void id_link(struct cm_id *c)
{
	c->next = ids;
	ids = c;
}

int rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context,
		   enum rdma_port_space ps)
{
	if (!id)
		return cm_set_errno(EINVAL);
	switch (ps) {
	case RDMA_PS_TCP:
	case RDMA_PS_IB:
	case RDMA_PS_UDP:
	case RDMA_PS_IPOIB:
		break;
	default:
		return cm_set_errno(EINVAL);
	}
	if (!session())
		return -1;
	struct cm_id *c = id_new(channel, context, ps);
	if (!c)
		return -1;
	pthread_mutex_lock(&mu);
	id_link(c);
	pthread_mutex_unlock(&mu);
	*id = &c->id;
	return 0;
}

static void fire_and_forget(void *ctx, struct rt_msg *rep)
{
	(void)ctx;
	for (unsigned i = 0; i < rep->nfds; i++)
		close(rep->fds[i]);
}

/* Reject a connection request nobody will answer (from any thread). */
static void reject_request(struct rt_session *s, uint64_t req)
{
	uint64_t a = req;
	struct rt_field f = {.data = "", .len = 0};
	struct rt_request r = {.type = RT_REJECT, .nargs = 1, .args = &a, .nfields = 1, .fields = &f};
	rt_call_async(s, &r, fire_and_forget, NULL);
}

/* Free a child ID of a CONNECT_REQUEST never handed out (mu held). */
static void drop_child(struct cm_id *child)
{
	for (struct cm_id **pp = &ids; *pp; pp = &(*pp)->next)
		if (*pp == child) {
			*pp = child->next;
			break;
		}
	struct rt_session *s = cur_session();
	if (child->req && s)
		reject_request(s, child->req);
	if (child->sync)
		channel_free(to_ch(child->id.channel));
	free(child);
}

/* Take the ID's events that were never handed out off its channel (mu held). */
static void drop_events(struct cm_id *c)
{
	struct cm_channel *ch = to_ch(c->id.channel);
	struct cm_event **pp = &ch->head;
	ch->tail = NULL;
	while (*pp) {
		struct cm_event *e = *pp;
		if (e->owner == c) {
			*pp = e->next;
			if (e->ev.event == RDMA_CM_EVENT_CONNECT_REQUEST && e->ev.id != &c->id)
				drop_child(to_id(e->ev.id));
			free(e);
			take_token(ch);
			continue;
		}
		ch->tail = e;
		pp = &e->next;
	}
}

int rdma_destroy_id(struct rdma_cm_id *id)
{
	if (!id)
		return cm_set_errno(EINVAL);
	struct cm_id *c = to_id(id);
	struct rt_session *s = cur_session();
	pthread_mutex_lock(&mu);
	c->destroying = 1;
	drop_events(c);
	uint64_t listener = c->listener;
	c->listener = 0;
	if (c->state == ST_REQ && c->req && s) {
		reject_request(s, c->req);
		c->req = 0;
	}
	uint32_t seq = c->seq;
	pthread_mutex_unlock(&mu);
	if (listener && s) {
		struct rt_msg *m = malloc(sizeof(*m));
		if (m) {
			struct rt_request r = {.type = RT_CLOSE_LISTENER, .nargs = 1, .args = &listener};
			rt_call(s, &r, m); /* a GET_REQUEST in progress ends CLOSED */
			free(m);
		}
	}
	if (seq && s)
		rt_cancel(s, seq);
	pthread_mutex_lock(&mu);
	while (c->refs > 0 || c->unacked > 0)
		pthread_cond_wait(&cv, &mu);
	for (struct cm_id **pp = &ids; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	pthread_mutex_unlock(&mu);
	if (c->sync)
		channel_free(to_ch(c->id.channel));
	free(c->ep_attr);
	free(c);
	return 0;
}

/* ---- synchronous IDs ---- */

static int event_errno(const struct rdma_cm_event *e)
{
	if (e->event == RDMA_CM_EVENT_REJECTED)
		return ECONNREFUSED; /* as librdmacm's, whatever the reason */
	if (e->status < 0)
		return -e->status;
	switch (e->event) {
	case RDMA_CM_EVENT_REJECTED:
		return ECONNREFUSED;
	case RDMA_CM_EVENT_UNREACHABLE:
		return ETIMEDOUT;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
		return EHOSTUNREACH;
	default:
		return EIO;
	}
}

/* Wait, on an ID without a channel of the program's, for the event that
 * ends an operation. */
static int sync_wait(struct cm_id *c, enum rdma_cm_event_type want, struct rdma_cm_event **keep)
{
	for (;;) {
		struct rdma_cm_event *e;
		if (rdma_get_cm_event(c->id.channel, &e))
			return -1;
		if (e->event == RDMA_CM_EVENT_DISCONNECTED && want != RDMA_CM_EVENT_DISCONNECTED) {
			rdma_ack_cm_event(e);
			continue;
		}
		if (e->event == want && e->status == 0) {
			if (keep)
				*keep = e;
			else
				rdma_ack_cm_event(e);
			return 0;
		}
		int err = event_errno(e);
		rdma_ack_cm_event(e);
		return cm_set_errno(err);
	}
}

/* ---- addresses ---- */

static int copy_addr(struct sockaddr_storage *dst, const struct sockaddr *src)
{
	socklen_t len = cm_addr_len(src);
	if (!len)
		return cm_set_errno(src && src->sa_family == AF_IB ? EAFNOSUPPORT : EINVAL);
	memset(dst, 0, sizeof(*dst));
	memcpy(dst, src, len);
	return cm_map_addr(dst);
}

/* The device's PD of the library's, shared by its IDs: librdmacm gives
 * every ID bound to a device (rdma_bind_addr, rdma_resolve_addr, a
 * request's) the device's PD in cm_id->pd, which programs use for QPs and
 * MRs of their own (pyverbs' CMID.pd is it), and rdma_create_qp without a
 * PD uses. Allocated once, with the ID's first device. */
static pthread_mutex_t pd_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ibv_pd *dev_pd;
static struct ibv_context *dev_pd_ctx;

static struct ibv_pd *default_pd(struct ibv_context *ctx)
{
	pthread_mutex_lock(&pd_mu);
	if (!dev_pd || dev_pd_ctx != ctx) {
		struct ibv_pd *pd = ibv_alloc_pd(ctx);
		if (pd) {
			dev_pd = pd;
			dev_pd_ctx = ctx;
		}
	}
	struct ibv_pd *r = dev_pd_ctx == ctx ? dev_pd : NULL;
	pthread_mutex_unlock(&pd_mu);
	return r;
}

/* The device's PD if allocated already: for IDs made where no call to
 * the service may wait (a connection request's, on the reply's thread). */
static struct ibv_pd *cached_pd(struct ibv_context *ctx)
{
	pthread_mutex_lock(&pd_mu);
	struct ibv_pd *r = ctx && dev_pd_ctx == ctx ? dev_pd : NULL;
	pthread_mutex_unlock(&pd_mu);
	return r;
}

static int set_verbs(struct cm_id *c)
{
	if (c->id.verbs && c->id.pd)
		return 0;
	struct ibv_context *ctx = c->id.verbs ? c->id.verbs : rt_default_context();
	if (!ctx)
		return -1;
	struct ibv_pd *pd = c->id.pd ? c->id.pd : default_pd(ctx);
	if (!pd)
		return -1;
	c->id.verbs = ctx;
	c->id.pd = pd;
	return 0;
}

/* Open the service's listener for c's source address (mu not held): LISTEN
 * with the backlog, then the port the service chose goes into the address. */
static int open_listener(struct cm_id *c, struct rt_session *s, int backlog)
{
	char addr[INET6_ADDRSTRLEN + 16];
	int n = cm_format_addr(&c->id.route.addr.src_addr, 1, addr, sizeof(addr));
	if (n < 0)
		return cm_set_errno(EINVAL);
	if (strcmp(addr, ":0") == 0)
		n = 0;
	uint64_t a[2] = {backlog <= 0 ? 0 : backlog > 1024 ? 1024 : (uint64_t)backlog, 0};
	struct rt_field f = {addr, (uint16_t)n};
	struct rt_request req = {.type = RT_LISTEN, .nargs = 2, .args = a, .nfields = 1, .fields = &f};
	struct rt_msg *m = malloc(sizeof(*m));
	if (!m)
		return cm_set_errno(ENOMEM);
	if (rt_call(s, &req, m)) {
		int e = errno;
		free(m);
		return cm_set_errno(e);
	}
	uint64_t handle = m->args[RT_LISTEN_HANDLE];
	uint16_t port = (uint16_t)m->args[RT_LISTEN_PORT];
	free(m);
	pthread_mutex_lock(&mu);
	c->listener = handle;
	if (c->id.route.addr.src_addr.sa_family == AF_INET6)
		c->id.route.addr.src_sin6.sin6_port = htons(port);
	else
		c->id.route.addr.src_sin.sin_port = htons(port);
	pthread_mutex_unlock(&mu);
	return 0;
}

static void close_listener(struct cm_id *c, struct rt_session *s)
{
	pthread_mutex_lock(&mu);
	uint64_t h = c->listener;
	c->listener = 0;
	pthread_mutex_unlock(&mu);
	if (!h)
		return;
	struct rt_request req = {.type = RT_CLOSE_LISTENER, .nargs = 1, .args = &h};
	struct rt_msg *m = malloc(sizeof(*m));
	if (m) {
		rt_call(s, &req, m);
		free(m);
	}
}

static int is_unspecified(const struct sockaddr *sa);

/* check_local_addr asks the service whether sa's IP is the device's (a
 * listener on it with a port of the service's choice, closed at once):
 * EADDRNOTAVAIL when it is not, as the kernel's rdma_bind_addr. */
static int check_local_addr(struct rt_session *s, const struct sockaddr_storage *sa)
{
	struct sockaddr_storage probe = *sa;
	if (probe.ss_family == AF_INET6)
		((struct sockaddr_in6 *)&probe)->sin6_port = 0;
	else
		((struct sockaddr_in *)&probe)->sin_port = 0;
	char addr[INET6_ADDRSTRLEN + 16];
	int n = cm_format_addr((struct sockaddr *)&probe, 1, addr, sizeof(addr));
	if (n < 0)
		return cm_set_errno(EINVAL);
	uint64_t a[2] = {1, 0};
	struct rt_field f = {addr, (uint16_t)n};
	struct rt_request req = {.type = RT_LISTEN, .nargs = 2, .args = a, .nfields = 1, .fields = &f};
	struct rt_msg *m = malloc(sizeof(*m));
	if (!m)
		return cm_set_errno(ENOMEM);
	if (rt_call(s, &req, m)) {
		int e = errno;
		free(m);
		return cm_set_errno(e);
	}
	uint64_t h = m->args[0];
	struct rt_request close = {.type = RT_CLOSE_LISTENER, .nargs = 1, .args = &h};
	rt_call(s, &close, m);
	free(m);
	return 0;
}

/*
 * Binding is the ID's own until it listens or connects (the protocol
 * binds nothing else) with one exception: port 0 opens the service's
 * listener at once, so that rdma_get_src_port tells the port before
 * rdma_listen, as programs such as qperf expect. Connection requests
 * wait in its backlog until rdma_listen; using the ID to connect closes it.
 */
int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)
{
	if (!id || !addr)
		return cm_set_errno(EINVAL);
	struct cm_id *c = to_id(id);
	pthread_mutex_lock(&mu);
	int ok = c->state == ST_IDLE;
	pthread_mutex_unlock(&mu);
	if (!ok)
		return cm_set_errno(EINVAL);
	struct rt_session *s = session();
	if (!s)
		return -1;
	if (copy_addr(&id->route.addr.src_storage, addr) || set_verbs(c))
		return -1;
	if ((rdma_get_src_port(id) == 0 && open_listener(c, s, 0)) ||
	    (rdma_get_src_port(id) != 0 && !is_unspecified(&id->route.addr.src_addr) &&
	     check_local_addr(s, &id->route.addr.src_storage))) {
		int e = errno;
		memset(&id->route.addr.src_storage, 0, sizeof(id->route.addr.src_storage));
		return cm_set_errno(e);
	}
	pthread_mutex_lock(&mu);
	c->state = ST_BOUND;
	c->bound = 1;
	pthread_mutex_unlock(&mu);
	return 0;
}

static int is_unspecified(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return ((const struct sockaddr_in *)sa)->sin_addr.s_addr == htonl(INADDR_ANY);
	if (sa->sa_family == AF_INET6)
		return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)sa)->sin6_addr);
	return 1;
}

/* device_ipv4 asks the service for its device's IPv4 address (QUERY_PORT,
 * protocol 5.7): 0 with *ip set, -1 when the service does not tell it or
 * the device has none. */
static int device_ipv4(struct rt_session *s, struct in_addr *ip)
{
	if (!s || !(rt_session_features(s) & RT_FEATURE_LINK_BIT))
		return -1;
	struct rt_msg *m = malloc(sizeof(*m));
	if (!m)
		return -1;
	uint64_t port = 1;
	struct rt_request req = {.type = RT_QUERY_PORT, .nargs = 1, .args = &port};
	const uint8_t *f;
	uint16_t n;
	int ok = rt_call(s, &req, m) == 0 && rt_msg_field(m, RT_PORT_FIELD_IPV4, &f, &n) == 0 && n == 4;
	if (ok)
		memcpy(&ip->s_addr, f, 4);
	free(m);
	return ok ? 0 : -1;
}

/* A source address left unspecified becomes the device's address, as the
 * kernel's resolution picks the address of the interface that reaches the
 * destination (the device is the only one): programs read it with
 * rdma_get_local_addr and hand it to their peers (libfabric's verbs
 * provider makes it its endpoints' name). IPv6: the service tells the
 * device's IPv4 address only, so an IPv6 source stays unspecified. */
static void fill_source(struct rdma_cm_id *id)
{
	if (id->route.addr.src_addr.sa_family != AF_INET || !is_unspecified(&id->route.addr.src_addr))
		return;
	struct in_addr ip;
	if (device_ipv4(session(), &ip) == 0)
		id->route.addr.src_sin.sin_addr = ip;
}

int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src_addr, struct sockaddr *dst_addr, int timeout_ms)
{
	(void)timeout_ms; /* resolution is local and immediate */
	if (!id || !dst_addr)
		return cm_set_errno(EINVAL);
	struct cm_id *c = to_id(id);
	struct sockaddr_storage dst;
	if (copy_addr(&dst, dst_addr))
		return -1;
	if (is_unspecified((struct sockaddr *)&dst))
		return cm_set_errno(EINVAL);
	pthread_mutex_lock(&mu);
	enum cm_state st = c->state;
	pthread_mutex_unlock(&mu);
	if (st != ST_IDLE && st != ST_BOUND)
		return cm_set_errno(EINVAL);
	if (src_addr && st == ST_IDLE) { /* a bound ID keeps its address, as the kernel's */
		if (src_addr->sa_family != dst.ss_family)
			return cm_set_errno(EINVAL);
		if (copy_addr(&id->route.addr.src_storage, src_addr))
			return -1;
	} else if (st == ST_IDLE) {
		memset(&id->route.addr.src_storage, 0, sizeof(id->route.addr.src_storage));
		id->route.addr.src_addr.sa_family = dst.ss_family;
	}
	if (set_verbs(c))
		return -1;
	fill_source(id);
	struct rt_session *s = cur_session();
	if (s)
		close_listener(c, s);
	pthread_mutex_lock(&mu);
	id->route.addr.dst_storage = dst;
	c->state = ST_ADDR;
	push_event(to_ch(id->channel), c, c, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
	pthread_mutex_unlock(&mu);
	return c->sync ? sync_wait(c, RDMA_CM_EVENT_ADDR_RESOLVED, NULL) : 0;
}

int rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
	(void)timeout_ms;
	if (!id)
		return cm_set_errno(EINVAL);
	struct cm_id *c = to_id(id);
	pthread_mutex_lock(&mu);
	if (c->state != ST_ADDR) {
		pthread_mutex_unlock(&mu);
		return cm_set_errno(EINVAL);
	}
	c->state = ST_ROUTE;
	push_event(to_ch(id->channel), c, c, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
	pthread_mutex_unlock(&mu);
	return c->sync ? sync_wait(c, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL) : 0;
}

__be16 rdma_get_src_port(struct rdma_cm_id *id)
{
	if (!id)
		return 0;
	if (id->route.addr.src_addr.sa_family == AF_INET6)
		return id->route.addr.src_sin6.sin6_port;
	return id->route.addr.src_sin.sin_port;
}

__be16 rdma_get_dst_port(struct rdma_cm_id *id)
{
	if (!id)
		return 0;
	if (id->route.addr.dst_addr.sa_family == AF_INET6)
		return id->route.addr.dst_sin6.sin6_port;
	return id->route.addr.dst_sin.sin_port;
}

/* ---- QPs ---- */

static void destroy_own_cqs(struct rdma_cm_id *id)
{
	if (id->recv_cq && id->recv_cq != id->send_cq)
		ibv_destroy_cq(id->recv_cq);
	if (id->send_cq)
		ibv_destroy_cq(id->send_cq);
	if (id->recv_cq_channel && id->recv_cq_channel != id->send_cq_channel)
		ibv_destroy_comp_channel(id->recv_cq_channel);
	if (id->send_cq_channel)
		ibv_destroy_comp_channel(id->send_cq_channel);
	id->send_cq = id->recv_cq = NULL;
	id->send_cq_channel = id->recv_cq_channel = NULL;
}

/* CQs with completion channels for a QP the program gave none (as
 * librdmacm does: rdma_get_send_comp and friends use them). */
static int create_own_cqs(struct rdma_cm_id *id, struct ibv_qp_init_attr *attr)
{
	int send = !attr->send_cq, recv = !attr->recv_cq;
	if (!send && !recv)
		return 0;
	if (send) {
		id->send_cq_channel = ibv_create_comp_channel(id->verbs);
		if (!id->send_cq_channel)
			goto fail;
		int n = attr->cap.max_send_wr ? (int)attr->cap.max_send_wr : 1;
		id->send_cq = ibv_create_cq(id->verbs, n, id, id->send_cq_channel, 0);
		if (!id->send_cq)
			goto fail;
		attr->send_cq = id->send_cq;
	}
	if (recv) {
		id->recv_cq_channel = ibv_create_comp_channel(id->verbs);
		if (!id->recv_cq_channel)
			goto fail;
		int n = attr->cap.max_recv_wr ? (int)attr->cap.max_recv_wr : 1;
		id->recv_cq = ibv_create_cq(id->verbs, n, id, id->recv_cq_channel, 0);
		if (!id->recv_cq)
			goto fail;
		attr->recv_cq = id->recv_cq;
	}
	to_id(id)->own_cqs = 1;
	return 0;
fail:;
	int e = errno;
	destroy_own_cqs(id);
	return cm_set_errno(e ? e : ENOMEM);
}

int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)
{
	if (!id || !qp_init_attr || id->qp)
		return cm_set_errno(EINVAL);
	if (!id->verbs && set_verbs(to_id(id)))
		return -1;
	if (!pd)
		pd = id->pd ? id->pd : default_pd(id->verbs);
	if (!pd)
		return -1;
	if (pd->context != id->verbs)
		return cm_set_errno(EINVAL);
	struct ibv_qp_init_attr attr = *qp_init_attr;
	if (create_own_cqs(id, &attr))
		return -1;
	if (!attr.srq)
		attr.srq = id->srq;
	struct ibv_qp *qp = ibv_create_qp(pd, &attr);
	if (!qp) {
		int e = errno;
		if (to_id(id)->own_cqs)
			destroy_own_cqs(id);
		to_id(id)->own_cqs = 0;
		return cm_set_errno(e ? e : ENOMEM);
	}
	qp_init_attr->cap = attr.cap;
	/* librdmacm hands an iWARP QP over in INIT, ready for receives. */
	rt_qp_set_state(qp, IBV_QPS_INIT);
	id->qp = qp;
	id->pd = pd;
	return 0;
}

int rdma_create_qp_ex(struct rdma_cm_id *id, struct ibv_qp_init_attr_ex *attr)
{
	if (!id || !attr)
		return cm_set_errno(EINVAL);
	if (attr->comp_mask & ~(uint32_t)(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS))
		return cm_set_errno(EOPNOTSUPP);
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_context = attr->qp_context;
	a.send_cq = attr->send_cq;
	a.recv_cq = attr->recv_cq;
	a.srq = attr->srq;
	a.cap = attr->cap;
	a.qp_type = attr->qp_type;
	a.sq_sig_all = attr->sq_sig_all;
	struct ibv_pd *pd = attr->comp_mask & IBV_QP_INIT_ATTR_PD ? attr->pd : NULL;
	if (rdma_create_qp(id, pd, &a))
		return -1;
	attr->cap = a.cap;
	return 0;
}

void rdma_destroy_qp(struct rdma_cm_id *id)
{
	if (!id || !id->qp)
		return;
	ibv_destroy_qp(id->qp);
	id->qp = NULL;
	if (to_id(id)->own_cqs) {
		destroy_own_cqs(id);
		to_id(id)->own_cqs = 0;
	}
}

int rdma_create_srq(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	if (!id || !attr || id->srq)
		return cm_set_errno(EINVAL);
	if (!id->verbs && set_verbs(to_id(id)))
		return -1;
	if (!pd)
		pd = id->pd ? id->pd : default_pd(id->verbs);
	if (!pd)
		return -1;
	struct ibv_srq *srq = ibv_create_srq(pd, attr);
	if (!srq)
		return -1;
	id->srq = srq;
	id->pd = pd;
	return 0;
}

void rdma_destroy_srq(struct rdma_cm_id *id)
{
	if (!id || !id->srq)
		return;
	ibv_destroy_srq(id->srq);
	id->srq = NULL;
}

int rdma_init_qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *qp_attr, int *qp_attr_mask)
{
	if (!id || !qp_attr || !qp_attr_mask)
		return cm_set_errno(EINVAL);
	/*
	 * iWARP's: the access flags for INIT and RTR, nothing more for RTS.
	 * The CM, not the program, moves a QP past INIT: an iWARP QP reaches
	 * RTS with its connection, which rdma_accept and rdma_connect make
	 * (RTR is no iWARP state, and cxgb4 leaves it out likewise). So the
	 * state is in the mask for INIT only, and not once the CM connects
	 * the QP: a program that creates its QP itself and moves it with
	 * these attributes (librdmacm's way for a QP outside the CM) moves it
	 * to INIT, and then the CM connects it.
	 */
	pthread_mutex_lock(&mu);
	enum cm_state st = to_id(id)->state;
	pthread_mutex_unlock(&mu);
	int connecting = st == ST_CONNECTING || st == ST_ACCEPTING || st == ST_CONNECTED || st == ST_DISCONNECTED;
	switch (qp_attr->qp_state) {
	case IBV_QPS_INIT:
	case IBV_QPS_RTR:
		qp_attr->qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
		qp_attr->port_num = id->port_num;
		*qp_attr_mask = IBV_QP_ACCESS_FLAGS | IBV_QP_PORT;
		if (qp_attr->qp_state == IBV_QPS_INIT && !connecting)
			*qp_attr_mask |= IBV_QP_STATE;
		return 0;
	case IBV_QPS_RTS:
		*qp_attr_mask = 0;
		pthread_mutex_lock(&mu);
		if (to_id(id)->ack_timeout_set) {
			/* As librdmacm's RTS attributes on InfiniBand. */
			qp_attr->timeout = to_id(id)->ack_timeout;
			*qp_attr_mask |= IBV_QP_TIMEOUT;
		}
		pthread_mutex_unlock(&mu);
		return 0;
	default:
		return cm_set_errno(EINVAL);
	}
}

/* ---- connections ---- */

/* The QP a connection call uses: the ID's, else conn_param's number. */
static uint32_t conn_qpn(struct rdma_cm_id *id, const struct rdma_conn_param *p)
{
	if (id->qp)
		return id->qp->qp_num;
	if (p && p->qp_num && rt_qp_lookup(p->qp_num))
		return p->qp_num;
	return 0;
}

/* A QP the CM starts to connect is in RTR until the connection is
 * established or fails: sends posted meanwhile go to the service, as
 * siw's QP takes them once rdma_accept returned. The ID's own QP gets the
 * ID's ACK timeout, as librdmacm sets it with the QP's move to RTS
 * (ibv_query_qp reports it; the connection's TCP does the retransmitting). */
static void qp_connecting(struct cm_id *c, uint32_t qpn)
{
	struct ibv_qp *qp = rt_qp_lookup(qpn);
	if (!qp)
		return;
	pthread_mutex_lock(&mu);
	struct ibv_qp_attr a = {.timeout = c->ack_timeout};
	int set = c->ack_timeout_set && c->id.qp == qp;
	pthread_mutex_unlock(&mu);
	if (set)
		ibv_modify_qp(qp, &a, IBV_QP_TIMEOUT);
	enum ibv_qp_state st = __atomic_load_n(&qp->state, __ATOMIC_SEQ_CST);
	if (st == IBV_QPS_RESET || st == IBV_QPS_INIT)
		rt_qp_set_state(qp, IBV_QPS_RTR);
}

/* Apply a successful DIAL or ACCEPT reply (mu held). */
static void connected(struct cm_id *c, const struct rt_msg *rep)
{
	int active = c->state == ST_CONNECTING;
	const uint8_t *d;
	uint16_t n;
	struct sockaddr_storage ss;
	if (rt_msg_field(rep, RT_CONN_FIELD_LOCAL, &d, &n) == 0 && cm_parse_addr(d, n, &ss) == 0)
		c->id.route.addr.src_storage = ss;
	if (rt_msg_field(rep, RT_CONN_FIELD_REMOTE, &d, &n) == 0 && cm_parse_addr(d, n, &ss) == 0)
		c->id.route.addr.dst_storage = ss;
	struct ibv_qp *qp = rt_qp_lookup(c->qpn);
	if (qp)
		rt_qp_set_state(qp, IBV_QPS_RTS);
	c->state = ST_CONNECTED;
	/* An ID without a QP of its own connected the program's QP: as
	 * librdmacm, CONNECT_RESPONSE, which rdma_establish acknowledges. */
	enum rdma_cm_event_type t = RDMA_CM_EVENT_ESTABLISHED;
	if (active && c->ext_qp) {
		t = RDMA_CM_EVENT_CONNECT_RESPONSE;
		c->resp_pending = 1;
	}
	struct cm_event *e = push_event(to_ch(c->id.channel), c, c, t, 0);
	if (e) {
		/* The accepting end's private data; the passive end had the
		 * initiator's with the request. */
		if (active && rt_msg_field(rep, RT_CONN_FIELD_PRIVATE_DATA, &d, &n) == 0)
			event_pdata(e, d, n);
		uint64_t ird = rep->args[RT_NEG_IRD], ord = rep->args[RT_NEG_ORD];
		e->ev.param.conn.responder_resources = ird > 255 ? 255 : (uint8_t)ird;
		e->ev.param.conn.initiator_depth = ord > 255 ? 255 : (uint8_t)ord;
		e->ev.param.conn.qp_num = c->qpn;
	}
	if (c->early_disc) {
		c->early_disc = 0;
		c->state = ST_DISCONNECTED;
		if (qp)
			rt_qp_set_state(qp, IBV_QPS_ERR);
		push_event(to_ch(c->id.channel), c, c, RDMA_CM_EVENT_DISCONNECTED, 0);
	}
}

/* The event a failed DIAL or ACCEPT makes, as the kernel's iWARP CM: a
 * refused or rejected connection is REJECTED, one that timed out
 * UNREACHABLE, anything else CONNECT_ERROR; status is -errno, but for a
 * connection the peer rejected (an MPA Reply with the Reject bit:
 * rdma_reject, whose private data comes along), whose status is
 * IB_CM_REJ_CONSUMER_DEFINED (28), as librdmacm reports a consumer's
 * reject on InfiniBand: a port nobody listens on (-ECONNREFUSED) and a
 * consumer's reject can be told apart. */
#define REJ_CONSUMER_DEFINED 28
static void failed(struct cm_id *c, const struct rt_msg *rep, int active)
{
	int err = rt_msg_errno(rep);
	if (!err)
		err = EIO;
	enum rdma_cm_event_type t = RDMA_CM_EVENT_CONNECT_ERROR;
	if (rep->status == RT_CLOSED)
		t = RDMA_CM_EVENT_CONNECT_ERROR; /* the session ended, not the peer */
	else if (active && (rep->status == RT_REJECTED || err == ECONNREFUSED || err == ECONNRESET))
		t = RDMA_CM_EVENT_REJECTED;
	else if (active && (err == ETIMEDOUT || err == ENETUNREACH || err == EHOSTUNREACH))
		t = RDMA_CM_EVENT_UNREACHABLE;
	c->state = ST_FAILED;
	c->early_disc = 0;
	struct cm_event *e =
		push_event(to_ch(c->id.channel), c, c, t, active && rep->status == RT_REJECTED ? REJ_CONSUMER_DEFINED : -err);
	const uint8_t *d;
	uint16_t n;
	if (e && rep->status == RT_REJECTED && rt_msg_field(rep, 0, &d, &n) == 0)
		event_pdata(e, d, n);
}

static void conn_done(struct cm_id *c, struct rt_msg *rep, int active)
{
	for (unsigned i = 0; i < rep->nfds; i++)
		close(rep->fds[i]);
	pthread_mutex_lock(&mu);
	c->seq = 0;
	if (!c->destroying) {
		if (rep->status == RT_OK)
			connected(c, rep);
		else
			failed(c, rep, active);
	}
	c->refs--;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

static void dial_done(void *ctx, struct rt_msg *rep) { conn_done(ctx, rep, 1); }
static void accept_done(void *ctx, struct rt_msg *rep) { conn_done(ctx, rep, 0); }

/* Connection parameters (protocol 5.6) from index k: IRD, ORD; MPA's
 * settings are the device's but peer-to-peer (below). Without parameters, or with librdmacm's
 * "as many as possible" (255), an accept answers with what the request
 * offered and a connect asks for the device's (0). */
static void conn_args(uint64_t *a, const struct rdma_conn_param *p, const struct cm_id *req)
{
	uint8_t ird = req ? req->req_resp : 0, ord = req ? req->req_init : 0;
	if (p && p->responder_resources != RDMA_MAX_RESP_RES)
		ird = p->responder_resources;
	if (p && p->initiator_depth != RDMA_MAX_INIT_DEPTH)
		ord = p->initiator_depth;
	a[0] = ird;
	a[1] = ord;
	for (int i = 2; i < 7; i++)
		a[i] = 0;
	/* An initiator asks for RFC 6581's peer-to-peer mode: its RTR frees
	 * the responder to send first, as programs such as ucmatose and
	 * perftest's servers do right after the accept (a responder without
	 * it waits for the initiator's first FPDU, RFC 5044). A responder
	 * that declines it gets a plain MPA v2 or v1 connection. */
	if (!req)
		a[4] = RT_TRI_TRUE;
}

/* Send DIAL or ACCEPT for c (state already set, mu not held). */
static int start_conn(struct cm_id *c, const struct rt_request *req, void (*done)(void *, struct rt_msg *),
		      enum cm_state back, enum rdma_cm_event_type want)
{
	struct rt_session *s = session();
	if (!s)
		return -1;
	pthread_mutex_lock(&mu);
	c->refs++;
	pthread_mutex_unlock(&mu);
	uint32_t seq = rt_call_async(s, req, done, c);
	pthread_mutex_lock(&mu);
	if (!seq) {
		int e = errno;
		c->refs--;
		c->state = back;
		pthread_cond_broadcast(&cv);
		pthread_mutex_unlock(&mu);
		return cm_set_errno(e);
	}
	if (c->state == ST_CONNECTING || c->state == ST_ACCEPTING)
		c->seq = seq;
	pthread_mutex_unlock(&mu);
	return c->sync ? sync_wait(c, want, NULL) : 0;
}

int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)
{
	if (!id)
		return cm_set_errno(EINVAL);
	struct cm_id *c = to_id(id);
	if (id->qp_type != IBV_QPT_RC)
		return cm_set_errno(ENOSYS);
	uint32_t qpn = conn_qpn(id, conn_param);
	if (!qpn)
		return cm_set_errno(EINVAL);
	char addr[INET6_ADDRSTRLEN + 16];
	if (cm_format_addr(&id->route.addr.dst_addr, 0, addr, sizeof(addr)) < 0)
		return cm_set_errno(EINVAL);
	pthread_mutex_lock(&mu);
	if (c->state != ST_ROUTE && c->state != ST_ADDR) {
		pthread_mutex_unlock(&mu);
		return cm_set_errno(EINVAL);
	}
	enum cm_state back = c->state;
	c->state = ST_CONNECTING;
	c->qpn = qpn;
	c->ext_qp = !id->qp;
	c->resp_pending = 0;
	pthread_mutex_unlock(&mu);
	qp_connecting(c, qpn);
	uint64_t a[8] = {qpn};
	conn_args(a + 1, conn_param, NULL);
	struct rt_field f[3] = {{addr, (uint16_t)strlen(addr)},
				{conn_param ? conn_param->private_data : NULL,
				 conn_param && conn_param->private_data ? conn_param->private_data_len : 0},
				{NULL, 0}};
	struct rt_request req = {.type = RT_DIAL, .nargs = 8, .args = a, .nfields = 2, .fields = f};
	/* A bound ID connects from its address and port (protocol 5.6: DIAL's
	 * third field; the CM feature). */
	char local[INET6_ADDRSTRLEN + 16];
	struct rt_session *s = session();
	if (c->bound && rdma_get_src_port(id) != 0 && s && (rt_session_features(s) & RT_FEATURE_CM_BIT)) {
		int n = cm_format_addr(&id->route.addr.src_addr, 1, local, sizeof(local));
		if (n > 0) {
			f[2] = (struct rt_field){local, (uint16_t)n};
			req.nfields = 3;
		}
	}
	return start_conn(c, &req, dial_done, back,
			  id->qp ? RDMA_CM_EVENT_ESTABLISHED : RDMA_CM_EVENT_CONNECT_RESPONSE);
}

int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)
{
	if (!id)
		return cm_set_errno(EINVAL);
	struct cm_id *c = to_id(id);
	uint32_t qpn = conn_qpn(id, conn_param);
	if (!qpn)
		return cm_set_errno(EINVAL);
	pthread_mutex_lock(&mu);
	if (c->state != ST_REQ || !c->req) {
		pthread_mutex_unlock(&mu);
		return cm_set_errno(EINVAL);
	}
	uint64_t a[9] = {c->req, qpn};
	c->state = ST_ACCEPTING;
	c->qpn = qpn;
	c->req = 0;
	pthread_mutex_unlock(&mu);
	qp_connecting(c, qpn);
	conn_args(a + 2, conn_param, c);
	struct rt_field f = {conn_param ? conn_param->private_data : NULL,
			     conn_param && conn_param->private_data ? conn_param->private_data_len : 0};
	struct rt_request req = {.type = RT_ACCEPT, .nargs = 9, .args = a, .nfields = 1, .fields = &f};
	return start_conn(c, &req, accept_done, ST_FAILED, RDMA_CM_EVENT_ESTABLISHED);
}

int rdma_reject(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
	if (!id)
		return cm_set_errno(EINVAL);
	struct cm_id *c = to_id(id);
	struct rt_session *s = session();
	if (!s)
		return -1;
	pthread_mutex_lock(&mu);
	if (c->state != ST_REQ || !c->req) {
		pthread_mutex_unlock(&mu);
		return cm_set_errno(EINVAL);
	}
	uint64_t a = c->req;
	c->req = 0;
	c->state = ST_FAILED;
	pthread_mutex_unlock(&mu);
	struct rt_field f = {private_data, private_data ? private_data_len : 0};
	struct rt_request req = {.type = RT_REJECT, .nargs = 1, .args = &a, .nfields = 1, .fields = &f};
	if (!rt_call_async(s, &req, fire_and_forget, NULL))
		return -1;
	return 0;
}

int rdma_reject_ece(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
	return rdma_reject(id, private_data, private_data_len);
}

/*
 * The active end of a connection of the program's own QP (an ID without a
 * QP, conn_param->qp_num) acknowledges CONNECT_RESPONSE, as librdmacm's.
 * The iWARP connection is up with the MPA Reply already, and the passive
 * end's ESTABLISHED came with its ACCEPT's reply: there is no message to
 * send. On an ID with a QP, as librdmacm, EINVAL.
 */
int rdma_establish(struct rdma_cm_id *id)
{
	if (!id || id->qp)
		return cm_set_errno(EINVAL);
	struct cm_id *c = to_id(id);
	pthread_mutex_lock(&mu);
	int ok = c->state == ST_CONNECTED && c->resp_pending;
	c->resp_pending = 0;
	pthread_mutex_unlock(&mu);
	return ok ? 0 : cm_set_errno(EINVAL);
}

int rdma_notify(struct rdma_cm_id *id, enum ibv_event_type event)
{
	(void)event; /* as the kernel's CM for iWARP: nothing to do */
	if (!id)
		return cm_set_errno(EINVAL);
	pthread_mutex_lock(&mu);
	enum cm_state st = to_id(id)->state;
	pthread_mutex_unlock(&mu);
	return st == ST_CONNECTED || st == ST_ACCEPTING || st == ST_CONNECTING ? 0 : cm_set_errno(EINVAL);
}

int rdma_disconnect(struct rdma_cm_id *id)
{
	if (!id)
		return cm_set_errno(EINVAL);
	struct cm_id *c = to_id(id);
	struct rt_session *s = session();
	if (!s)
		return -1;
	pthread_mutex_lock(&mu);
	enum cm_state st = c->state;
	uint64_t qpn = c->qpn;
	pthread_mutex_unlock(&mu);
	if (st == ST_DISCONNECTED)
		return 0;
	if (st != ST_CONNECTED)
		return cm_set_errno(EINVAL);
	struct rt_msg *m = malloc(sizeof(*m));
	if (!m)
		return cm_set_errno(ENOMEM);
	struct rt_request req = {.type = RT_DISCONNECT, .nargs = 1, .args = &qpn};
	int r = rt_call(s, &req, m);
	int e = errno;
	free(m);
	struct ibv_qp *qp = rt_qp_lookup((uint32_t)qpn);
	if (qp)
		rt_qp_set_state(qp, IBV_QPS_ERR);
	if (r) {
		/* The connection ended meanwhile: its DISCONNECTED event
		 * reports it. */
		pthread_mutex_lock(&mu);
		st = c->state;
		pthread_mutex_unlock(&mu);
		return st == ST_DISCONNECTED ? 0 : cm_set_errno(e);
	}
	return 0;
}

/* ---- listening ---- */

static void getreq_done(void *ctx, struct rt_msg *rep);

/* Ask for the next connection request, holding a reference of c's that
 * the call's completion gives back (mu not held; any thread). */
static int next_request(struct cm_id *c, struct rt_session *s)
{
	pthread_mutex_lock(&mu);
	uint64_t l = c->listener;
	pthread_mutex_unlock(&mu);
	struct rt_request req = {.type = RT_GET_REQUEST, .nargs = 1, .args = &l};
	if (l && rt_call_async(s, &req, getreq_done, c))
		return 0;
	int e = l ? errno : ECANCELED;
	pthread_mutex_lock(&mu);
	c->refs--;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	return cm_set_errno(e);
}

static void getreq_done(void *ctx, struct rt_msg *rep)
{
	struct cm_id *l = ctx;
	struct rt_session *s = cur_session();
	for (unsigned i = 0; i < rep->nfds; i++)
		close(rep->fds[i]);
	int again = 0;
	pthread_mutex_lock(&mu);
	if (rep->status == RT_OK) {
		uint64_t req = rep->args[RT_REQ_HANDLE];
		struct cm_id *child = NULL;
		if (!l->destroying && l->listener)
			child = id_new(l->sync ? NULL : l->id.channel, l->id.context, l->id.ps);
		if (!child) {
			if (s)
				reject_request(s, req);
		} else {
			child->id.verbs = l->id.verbs;
			child->id.pd = cached_pd(l->id.verbs);
			child->id.route.addr.src_storage = l->id.route.addr.src_storage;
			const uint8_t *d;
			uint16_t n;
			struct sockaddr_storage ss;
			if (rt_msg_field(rep, RT_REQ_FIELD_ADDR, &d, &n) == 0 && cm_parse_addr(d, n, &ss) == 0)
				child->id.route.addr.dst_storage = ss;
			child->req = req;
			child->state = ST_REQ;
			uint64_t ird = rep->args[RT_REQ_IRD], ord = rep->args[RT_REQ_ORD];
			child->req_resp = ord > 254 ? 254 : (uint8_t)ord;
			child->req_init = ird > 254 ? 254 : (uint8_t)ird;
			child->tos = l->tos;
			id_link(child);
			struct cm_event *e =
				push_event(to_ch(l->id.channel), l, child, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
			if (e) {
				e->ev.listen_id = &l->id;
				if (rt_msg_field(rep, RT_REQ_FIELD_PRIVATE_DATA, &d, &n) == 0)
					event_pdata(e, d, n);
				/* The initiator's IRD is what this end may read;
				 * its ORD what this end must answer. */
				e->ev.param.conn.responder_resources = child->req_resp;
				e->ev.param.conn.initiator_depth = child->req_init;
			} else {
				drop_child(child);
			}
		}
		again = !l->destroying && l->listener && s;
	}
	if (!again) {
		/* CLOSED (listener closed), CANCELED, a lost session or a
		 * limit end the loop. */
		l->refs--;
		pthread_cond_broadcast(&cv);
	}
	pthread_mutex_unlock(&mu);
	if (again)
		next_request(l, s); /* keeps the reference */
}

int rdma_listen(struct rdma_cm_id *id, int backlog)
{
	if (!id)
		return cm_set_errno(EINVAL);
	struct cm_id *c = to_id(id);
	struct rt_session *s = session();
	if (!s)
		return -1;
	pthread_mutex_lock(&mu);
	enum cm_state st = c->state;
	pthread_mutex_unlock(&mu);
	if (st == ST_IDLE) {
		/* librdmacm binds an unbound ID to the IPv4 wildcard. */
		struct sockaddr_in any = {.sin_family = AF_INET};
		if (rdma_bind_addr(id, (struct sockaddr *)&any))
			return -1;
	} else if (st != ST_BOUND) {
		return cm_set_errno(EINVAL);
	}
	if (set_verbs(c))
		return -1;
	pthread_mutex_lock(&mu);
	int have = c->listener != 0;
	pthread_mutex_unlock(&mu);
	if (!have && open_listener(c, s, backlog))
		return -1;
	pthread_mutex_lock(&mu);
	c->state = ST_LISTEN;
	c->refs++; /* the GET_REQUEST loop's */
	pthread_mutex_unlock(&mu);
	if (next_request(c, s)) {
		int e = errno;
		close_listener(c, s);
		pthread_mutex_lock(&mu);
		c->state = ST_BOUND;
		pthread_mutex_unlock(&mu);
		return cm_set_errno(e);
	}
	return 0;
}

int rdma_get_request(struct rdma_cm_id *listen, struct rdma_cm_id **id)
{
	if (!listen || !id)
		return cm_set_errno(EINVAL);
	struct cm_id *l = to_id(listen);
	if (!l->sync)
		return cm_set_errno(EINVAL);
	struct rdma_cm_event *e;
	if (sync_wait(l, RDMA_CM_EVENT_CONNECT_REQUEST, &e))
		return -1;
	struct rdma_cm_id *child = e->id;
	rdma_ack_cm_event(e);
	if (l->ep_attr) {
		struct ibv_qp_init_attr attr = *l->ep_attr;
		if (rdma_create_qp(child, l->ep_pd, &attr)) {
			int err = errno;
			rdma_reject(child, NULL, 0);
			rdma_destroy_id(child);
			return cm_set_errno(err);
		}
	}
	*id = child;
	return 0;
}

/* ---- endpoints ---- */

int rdma_create_ep(struct rdma_cm_id **id, struct rdma_addrinfo *res, struct ibv_pd *pd,
		   struct ibv_qp_init_attr *qp_init_attr)
{
	if (!id || !res)
		return cm_set_errno(EINVAL);
	struct rdma_cm_id *cid;
	if (rdma_create_id(NULL, &cid, NULL, (enum rdma_port_space)res->ai_port_space))
		return -1;
	struct cm_id *c = to_id(cid);
	if (res->ai_qp_type)
		cid->qp_type = (enum ibv_qp_type)res->ai_qp_type;
	if (qp_init_attr)
		qp_init_attr->qp_type = cid->qp_type;
	if (res->ai_flags & RAI_PASSIVE) {
		if (!res->ai_src_addr || rdma_bind_addr(cid, res->ai_src_addr))
			goto fail;
		if (qp_init_attr) {
			c->ep_attr = malloc(sizeof(*c->ep_attr));
			if (!c->ep_attr)
				goto fail;
			*c->ep_attr = *qp_init_attr;
			c->ep_pd = pd;
		}
	} else {
		if (rdma_resolve_addr(cid, res->ai_src_addr, res->ai_dst_addr, 2000) ||
		    rdma_resolve_route(cid, 2000))
			goto fail;
		if (qp_init_attr && rdma_create_qp(cid, pd, qp_init_attr))
			goto fail;
	}
	*id = cid;
	return 0;
fail:;
	int e = errno;
	rdma_destroy_id(cid);
	return cm_set_errno(e);
}

void rdma_destroy_ep(struct rdma_cm_id *id)
{
	if (!id)
		return;
	rdma_destroy_qp(id);
	rdma_destroy_srq(id);
	rdma_destroy_id(id);
}

/* ---- the rest of the interface ---- */

int rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *channel)
{
	if (!id)
		return cm_set_errno(EINVAL);
	struct cm_id *c = to_id(id);
	struct cm_channel *nc = NULL;
	if (!channel) {
		nc = channel_new();
		if (!nc)
			return -1;
		channel = &nc->ch;
	}
	pthread_mutex_lock(&mu);
	while (c->unacked > 0)
		pthread_cond_wait(&cv, &mu);
	struct cm_channel *old = to_ch(id->channel);
	/* Move the ID's waiting events along. */
	struct cm_event **pp = &old->head, *moved = NULL, **mt = &moved;
	old->tail = NULL;
	while (*pp) {
		struct cm_event *e = *pp;
		if (e->owner == c) {
			*pp = e->next;
			e->next = NULL;
			*mt = e;
			mt = &e->next;
			take_token(old);
			continue;
		}
		old->tail = e;
		pp = &e->next;
	}
	struct cm_channel *ch = to_ch(channel);
	while (moved) {
		struct cm_event *e = moved;
		moved = e->next;
		e->next = NULL;
		e->ch = ch;
		if (ch->tail)
			ch->tail->next = e;
		else
			ch->head = e;
		ch->tail = e;
		uint64_t one = 1;
		if (write(ch->ch.fd, &one, sizeof(one)) != sizeof(one)) {
			/* cannot overflow */
		}
	}
	int was_sync = c->sync;
	id->channel = channel;
	c->sync = nc != NULL;
	pthread_mutex_unlock(&mu);
	if (was_sync)
		channel_free(old);
	return 0;
}

int rdma_set_option(struct rdma_cm_id *id, int level, int optname, void *optval, size_t optlen)
{
	if (!id || !optval)
		return cm_set_errno(EINVAL);
	struct cm_id *c = to_id(id);
	if (level != RDMA_OPTION_ID)
		return cm_set_errno(ENOSYS); /* IB path records: not iWARP's */
	/* Recorded, as the kernel records them for iWARP; the service applies
	 * none of them (its connections use its own TCP settings). */
	switch (optname) {
	case RDMA_OPTION_ID_TOS:
		if (optlen != sizeof(uint8_t))
			return cm_set_errno(EINVAL);
		c->tos = *(uint8_t *)optval;
		return 0;
	case RDMA_OPTION_ID_REUSEADDR:
		if (optlen != sizeof(int))
			return cm_set_errno(EINVAL);
		c->reuseaddr = *(int *)optval;
		return 0;
	case RDMA_OPTION_ID_AFONLY:
		if (optlen != sizeof(int))
			return cm_set_errno(EINVAL);
		c->afonly = *(int *)optval;
		return 0;
	case RDMA_OPTION_ID_ACK_TIMEOUT:
		if (optlen != sizeof(uint8_t))
			return cm_set_errno(EINVAL);
		pthread_mutex_lock(&mu);
		c->ack_timeout = *(uint8_t *)optval;
		c->ack_timeout_set = 1;
		pthread_mutex_unlock(&mu);
		return 0;
	default:
		return cm_set_errno(ENOSYS);
	}
}

struct ibv_context **rdma_get_devices(int *num_devices)
{
	struct ibv_context *ctx = rt_default_context();
	struct ibv_context **l = calloc(2, sizeof(*l));
	if (!l)
		return NULL;
	l[0] = ctx;
	if (num_devices)
		*num_devices = ctx ? 1 : 0;
	return l;
}

void rdma_free_devices(struct ibv_context **list) { free(list); }

/* iWARP has no multicast (the kernel's CM answers ENOSYS as well). */
int rdma_join_multicast(struct rdma_cm_id *id, struct sockaddr *addr, void *context)
{
	(void)id;
	(void)addr;
	(void)context;
	return cm_set_errno(ENOSYS);
}

int rdma_join_multicast_ex(struct rdma_cm_id *id, struct rdma_cm_join_mc_attr_ex *attr, void *context)
{
	(void)id;
	(void)attr;
	(void)context;
	return cm_set_errno(ENOSYS);
}

int rdma_leave_multicast(struct rdma_cm_id *id, struct sockaddr *addr)
{
	(void)id;
	(void)addr;
	return cm_set_errno(EADDRNOTAVAIL); /* never joined */
}

/* ECE is InfiniBand's; an iWARP connection has none. */
int rdma_set_local_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	(void)id;
	(void)ece;
	return cm_set_errno(EOPNOTSUPP);
}

int rdma_get_remote_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	(void)id;
	(void)ece;
	return cm_set_errno(EOPNOTSUPP);
}

/* ---- the service's events ---- */

static void on_event(void *unused, uint16_t type, const struct rt_msg *m)
{
	(void)unused;
	pthread_mutex_lock(&mu);
	if (type == 0) {
		/* The session ended, and every connection with it; IDs on the
		 * device that wait for nothing else learn that it is gone. A
		 * DIAL or ACCEPT in progress fails on its own. */
		for (struct cm_id *c = ids; c; c = c->next) {
			if (c->destroying)
				continue;
			switch (c->state) {
			case ST_CONNECTED:
				c->state = ST_DISCONNECTED;
				push_event(to_ch(c->id.channel), c, c, RDMA_CM_EVENT_DISCONNECTED, 0);
				break;
			case ST_BOUND:
			case ST_ADDR:
			case ST_ROUTE:
			case ST_LISTEN:
			case ST_REQ:
				push_event(to_ch(c->id.channel), c, c, RDMA_CM_EVENT_DEVICE_REMOVAL, 0);
				break;
			default:
				break;
			}
		}
		pthread_mutex_unlock(&mu);
		return;
	}
	if (m->args[RT_EVA_TYPE] == RT_EV_DISCONNECTED) {
		uint32_t qpn = (uint32_t)m->args[RT_EVA_QPN];
		for (struct cm_id *c = ids; c; c = c->next) {
			if (c->qpn != qpn || c->destroying)
				continue;
			if (c->state == ST_CONNECTED) {
				c->state = ST_DISCONNECTED;
				struct ibv_qp *qp = rt_qp_lookup(qpn);
				if (qp)
					rt_qp_set_state(qp, IBV_QPS_ERR);
				/* status: 0 for a graceful close by either end,
				 * -ECONNRESET when an error ended it (RT_EVA_REASON). */
				push_event(to_ch(c->id.channel), c, c, RDMA_CM_EVENT_DISCONNECTED,
					   m->args[RT_EVA_REASON] == RT_DISC_ERROR ? -ECONNRESET : 0);
				break;
			}
			if (c->state == ST_CONNECTING || c->state == ST_ACCEPTING) {
				c->early_disc = 1;
				break;
			}
		}
	}
	pthread_mutex_unlock(&mu);
}
