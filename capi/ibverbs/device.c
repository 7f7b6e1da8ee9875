/* device.c: the device list, contexts, device and port queries, the
 * library's string and utility functions. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ibv_rt.h"

#undef ibv_get_device_list
#undef ibv_query_port

/* The one device: the service's. */
static pthread_mutex_t dev_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ibv_device *the_device;

/* The port as QUERY_PORT gives it (protocol 5.7), or, from a service that
 * does not offer it, a made-up one: up, MTU 1500, and a locally
 * administered Ethernet address derived from the device's name. */
struct port_info {
	uint64_t state, phys_state, mtu, active_mtu, width, speed;
	int has_ip;
	uint8_t ip[4];
	uint8_t mac[6];
	uint8_t gid[16];
	uint8_t guid[8]; /* network order */
};

static void port_made_up(const char *name, struct port_info *p)
{
	memset(p, 0, sizeof(*p));
	uint64_t h = 1469598103934665603ULL;
	for (const char *c = name; *c; c++)
		h = (h ^ (uint8_t)*c) * 1099511628211ULL;
	for (int i = 0; i < 6; i++)
		p->mac[i] = (uint8_t)(h >> (8 * i));
	p->mac[0] = (uint8_t)((p->mac[0] & 0xfe) | 0x02);
	p->state = IBV_PORT_ACTIVE;
	p->phys_state = 5; /* LinkUp */
	p->mtu = 1500;
	p->active_mtu = IBV_MTU_1024;
	p->width = 1; /* 1X */
	p->speed = 1; /* SDR */
	memcpy(p->gid, p->mac, 6);
	const uint8_t g[8] = {p->mac[0] ^ 2, p->mac[1], p->mac[2], 0xff, 0xfe, p->mac[3], p->mac[4], p->mac[5]};
	memcpy(p->guid, g, 8);
}

/* port_of fills *p for the session's device; a reply field of the wrong
 * length, or a value out of range, makes the port the made-up one. */
static void port_of(struct rt_session *s, const char *name, struct port_info *p)
{
	port_made_up(name, p);
	if (!s || !(rt_session_features(s) & RT_FEATURE_LINK))
		return;
	struct rt_msg *m = malloc(sizeof(*m));
	if (!m)
		return;
	uint64_t port = 1;
	struct rt_request req = {.type = RT_QUERY_PORT, .nargs = 1, .args = &port};
	const uint8_t *f[RT_PORT_FIELDS];
	uint16_t n[RT_PORT_FIELDS];
	const uint64_t *a = m->args;
	int ok = rt_call(s, &req, m) == 0 && a[RT_PORT_STATE] >= 1 && a[RT_PORT_STATE] <= 5 && a[RT_PORT_ACTIVE_MTU] >= 1 &&
		 a[RT_PORT_ACTIVE_MTU] <= 5;
	for (unsigned i = 0; ok && i < RT_PORT_FIELDS; i++)
		ok = rt_msg_field(m, i, &f[i], &n[i]) == 0;
	if (ok && (n[RT_PORT_FIELD_IPV4] == 0 || n[RT_PORT_FIELD_IPV4] == 4) && n[RT_PORT_FIELD_MAC] == 6 &&
	    n[RT_PORT_FIELD_GID] == 16 && n[RT_PORT_FIELD_GUID] == 8) {
		p->state = a[RT_PORT_STATE];
		p->phys_state = a[RT_PORT_PHYS_STATE];
		p->mtu = a[RT_PORT_LINK_MTU];
		p->active_mtu = a[RT_PORT_ACTIVE_MTU];
		p->width = a[RT_PORT_ACTIVE_WIDTH];
		p->speed = a[RT_PORT_ACTIVE_SPEED];
		p->has_ip = n[RT_PORT_FIELD_IPV4] == 4;
		if (p->has_ip)
			memcpy(p->ip, f[RT_PORT_FIELD_IPV4], 4);
		memcpy(p->mac, f[RT_PORT_FIELD_MAC], 6);
		memcpy(p->gid, f[RT_PORT_FIELD_GID], 16);
		memcpy(p->guid, f[RT_PORT_FIELD_GUID], 8);
	}
	free(m);
}

static uint64_t guid_of(struct rt_session *s, const char *name)
{
	struct port_info p;
	port_of(s, name, &p);
	uint64_t v;
	memcpy(&v, p.guid, 8); /* network order in memory, as __be64 */
	return v;
}

RT_VISIBLE struct ibv_device **ibv_get_device_list(int *num)
{
	struct rt_session *s = rt_session_get();
	struct ibv_device **list = calloc(2, sizeof(*list));
	if (!list) {
		errno = ENOMEM;
		return NULL;
	}
	if (num)
		*num = 0;
	if (!s)
		return list;
	pthread_mutex_lock(&dev_mu);
	if (!the_device) {
		struct ibv_device *d = calloc(1, sizeof(*d));
		if (d) {
			const char *n = rt_session_device_name(s);
			d->node_type = IBV_NODE_RNIC;
			d->transport_type = IBV_TRANSPORT_IWARP;
			snprintf(d->name, sizeof(d->name), "%s", n);
			snprintf(d->dev_name, sizeof(d->dev_name), "uverbs0");
			snprintf(d->dev_path, sizeof(d->dev_path), "/sys/class/infiniband_verbs/uverbs0");
			snprintf(d->ibdev_path, sizeof(d->ibdev_path), "/sys/class/infiniband/%.64s", n);
			the_device = d;
		}
	}
	pthread_mutex_unlock(&dev_mu);
	if (the_device) {
		list[0] = the_device;
		if (num)
			*num = 1;
	}
	return list;
}

RT_VISIBLE void ibv_free_device_list(struct ibv_device **list) { free(list); }

RT_VISIBLE const char *ibv_get_device_name(struct ibv_device *d) { return d ? d->name : NULL; }

RT_VISIBLE __be64 ibv_get_device_guid(struct ibv_device *d) { return d ? guid_of(rt_session_get(), d->name) : 0; }

RT_VISIBLE int ibv_get_device_index(struct ibv_device *d) { return d && d == the_device ? 0 : -1; }

static int query_device_ex(struct ibv_context *ctx, const struct ibv_query_device_ex_input *in, struct ibv_device_attr_ex *a,
			   size_t size);
static int query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a, size_t size);

/* The operations of a context, the one table of them: libibverbs' inline
 * functions (ibv_post_send, ibv_poll_cq, ...) call through it. What is
 * not set here is NULL. */
static const struct ibv_context_ops context_ops = {
	._compat_query_device = ibv_query_device,
	._compat_query_port = ibv_query_port,
	.poll_cq = rt_poll_cq,
	.req_notify_cq = rt_req_notify_cq,
	.post_send = rt_post_send,
	.post_recv = rt_post_recv,
	.post_srq_recv = rt_post_srq_recv,
	.alloc_mw = rt_alloc_mw,
	.dealloc_mw = rt_dealloc_mw,
	.bind_mw = rt_bind_mw,
};

/* install_ops sets the context's operations: the table, and the extended
 * ones of its verbs_context. */
static void install_ops(struct rt_ctx *c)
{
	c->vctx.context.ops = context_ops;
	c->vctx.query_port = query_port;
	c->vctx.query_device_ex = query_device_ex;
	c->vctx.create_qp_ex = rt_create_qp_ex;
}

RT_VISIBLE struct ibv_context *ibv_open_device(struct ibv_device *d)
{
	if (!d || d != the_device) {
		errno = ENODEV;
		return NULL;
	}
	struct rt_session *s = rt_session_get();
	if (!s)
		return NULL;
	struct rt_ctx *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	/* The asynchronous events' queue: datagrams, so that a destroyed
	 * object's unread events can be taken out (purge_async). */
	int p[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, p) < 0) {
		free(c);
		return NULL;
	}
	c->s = s;
	c->async_wr = p[1];
	struct ibv_context *ctx = &c->vctx.context;
	ctx->device = d;
	ctx->cmd_fd = -1;
	ctx->async_fd = p[0];
	ctx->num_comp_vectors = 1;
	pthread_mutex_init(&ctx->mutex, NULL);
	ctx->abi_compat = __VERBS_ABI_IS_EXTENDED;
	c->vctx.sz = sizeof(c->vctx);
	install_ops(c);
	rt_events_init(s);
	rt_ctx_link(c);
	return ctx;
}

RT_VISIBLE int ibv_close_device(struct ibv_context *ctx)
{
	if (!ctx)
		return EINVAL;
	struct rt_ctx *c = to_ctx(ctx);
	rt_ctx_unlink(c);
	close(ctx->async_fd);
	if (c->async_wr >= 0) /* closed at the session's end */
		close(c->async_wr);
	pthread_mutex_destroy(&ctx->mutex);
	free(c);
	return 0;
}

RT_VISIBLE struct ibv_context *rt_default_context(void)
{
	static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	static struct ibv_context *ctx;
	pthread_mutex_lock(&mu);
	/* After fork() the parent's context names the parent's session. */
	if (ctx && to_ctx(ctx)->s != rt_session_get())
		ctx = NULL;
	if (!ctx) {
		struct ibv_device **l = ibv_get_device_list(NULL);
		if (l && l[0])
			ctx = ibv_open_device(l[0]);
		else if (l)
			errno = ENODEV;
		ibv_free_device_list(l);
	}
	struct ibv_context *r = ctx;
	pthread_mutex_unlock(&mu);
	return r;
}

RT_VISIBLE struct rt_session *rt_context_session(struct ibv_context *ctx)
{
	return ctx && ctx->device == the_device && ctx->abi_compat == __VERBS_ABI_IS_EXTENDED ? to_ctx(ctx)->s : NULL;
}

RT_VISIBLE int ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *a)
{
	if (!ctx || !a)
		return EINVAL;
	const uint64_t *l = rt_session_limits(to_ctx(ctx)->s);
	memset(a, 0, sizeof(*a));
	snprintf(a->fw_ver, sizeof(a->fw_ver), "rdmatap");
	a->node_guid = guid_of(to_ctx(ctx)->s, ctx->device->name);
	a->sys_image_guid = a->node_guid;
	a->max_mr_size = l[RT_QD_MAX_MR_SIZE];
	a->page_size_cap = l[RT_QD_PAGE_SIZE_CAP];
	a->vendor_id = (uint32_t)l[RT_QD_VENDOR_ID];
	a->vendor_part_id = (uint32_t)l[RT_QD_VENDOR_PART_ID];
	a->hw_ver = 0;
	a->max_qp = (int)l[RT_QD_MAX_QP];
	a->max_qp_wr = (int)l[RT_QD_MAX_QP_WR];
	a->device_cap_flags = IBV_DEVICE_MEM_MGT_EXTENSIONS;
	a->max_sge = (int)l[RT_QD_MAX_SGE];
	a->max_sge_rd = (int)l[RT_QD_MAX_SGE_RD];
	a->max_cq = (int)l[RT_QD_MAX_CQ];
	a->max_cqe = (int)l[RT_QD_MAX_CQE];
	a->max_mr = (int)l[RT_QD_MAX_MR];
	a->max_pd = (int)l[RT_QD_MAX_PD];
	a->max_qp_rd_atom = (int)l[RT_QD_MAX_QP_RD_ATOM];
	a->max_qp_init_rd_atom = (int)l[RT_QD_MAX_QP_INIT_RD];
	uint64_t res = l[RT_QD_MAX_QP_RD_ATOM] * l[RT_QD_MAX_QP];
	a->max_res_rd_atom = (int)(res > 0x7fffffff ? 0x7fffffff : res);
	a->atomic_cap = (enum ibv_atomic_cap)l[RT_QD_ATOMIC_CAP];
	a->max_mw = (int)l[RT_QD_MAX_MW];
	a->max_srq = (int)l[RT_QD_MAX_SRQ];
	a->max_srq_wr = (int)l[RT_QD_MAX_SRQ_WR];
	a->max_srq_sge = (int)l[RT_QD_MAX_SRQ_SGE];
	a->max_fmr = 0;
	a->max_pkeys = 1;
	a->phys_port_cnt = 1;
	return 0;
}

static int query_device_ex(struct ibv_context *ctx, const struct ibv_query_device_ex_input *in, struct ibv_device_attr_ex *a,
			   size_t size)
{
	if (in && in->comp_mask)
		return EINVAL;
	if (size < sizeof(a->orig_attr))
		return EINVAL;
	memset(a, 0, size < sizeof(*a) ? size : sizeof(*a));
	int e = ibv_query_device(ctx, &a->orig_attr);
	if (e)
		return e;
	/* As rdma-core: the port count again, for callers of more than 255
	 * ports (siw's device has one). */
	if (size >= offsetof(struct ibv_device_attr_ex, phys_port_cnt_ex) + sizeof(a->phys_port_cnt_ex))
		a->phys_port_cnt_ex = a->orig_attr.phys_port_cnt;
	return 0;
}

static int query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a, size_t size)
{
	if (!ctx || !a)
		return EINVAL;
	if (port != 1)
		return EINVAL;
	const uint64_t *l = rt_session_limits(to_ctx(ctx)->s);
	struct port_info pi;
	port_of(to_ctx(ctx)->s, ctx->device->name, &pi);
	struct ibv_port_attr p;
	memset(&p, 0, sizeof(p));
	p.state = (enum ibv_port_state)pi.state;
	p.max_mtu = (enum ibv_mtu)pi.active_mtu; /* as siw: the link's */
	p.active_mtu = (enum ibv_mtu)pi.active_mtu;
	p.gid_tbl_len = 1;
	p.port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_DEVICE_MGMT_SUP;
	p.max_msg_sz = (uint32_t)(l[RT_QD_MAX_MSG_SIZE] > 0xffffffffULL ? 0xffffffffULL : l[RT_QD_MAX_MSG_SIZE]);
	p.pkey_tbl_len = 1;
	p.active_width = (uint8_t)pi.width;
	p.active_speed = (uint8_t)pi.speed;
	p.phys_state = (uint8_t)pi.phys_state;
	p.link_layer = IBV_LINK_LAYER_ETHERNET;
	memcpy(a, &p, size < sizeof(p) ? size : sizeof(p));
	return 0;
}

RT_VISIBLE int ibv_query_port(struct ibv_context *ctx, uint8_t port, struct _compat_ibv_port_attr *a)
{
	/* the legacy entry: the old structure is a prefix of the new one */
	return query_port(ctx, port, (struct ibv_port_attr *)(void *)a, offsetof(struct ibv_port_attr, link_layer));
}

RT_VISIBLE int ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
	if (!ctx || !gid || port != 1 || index != 0) {
		errno = EINVAL;
		return -1;
	}
	struct port_info p;
	port_of(to_ctx(ctx)->s, ctx->device->name, &p);
	memcpy(gid->raw, p.gid, 16);
	return 0;
}

/* ibv_gid_type_sysfs of rdma-core's driver.h */
RT_VISIBLE int ibv_query_gid_type(struct ibv_context *ctx, uint8_t port, unsigned int index, int *type)
{
	if (!ctx || !type || port != 1 || index != 0) {
		errno = EINVAL;
		return -1;
	}
	*type = 0;
	return 0;
}

RT_VISIBLE int _ibv_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index, struct ibv_gid_entry *e, uint32_t flags,
				 size_t size)
{
	if (!ctx || !e || flags || size < sizeof(*e))
		return EINVAL;
	if (port != 1 || index != 0)
		return ENODATA;
	memset(e, 0, sizeof(*e));
	struct port_info p;
	port_of(to_ctx(ctx)->s, ctx->device->name, &p);
	memcpy(e->gid.raw, p.gid, 16);
	e->gid_index = 0;
	e->port_num = 1;
	e->gid_type = IBV_GID_TYPE_IB;
	e->ndev_ifindex = 0;
	return 0;
}

RT_VISIBLE ssize_t _ibv_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *e, size_t max, uint32_t flags, size_t size)
{
	if (max < 1)
		return -EINVAL;
	int r = _ibv_query_gid_ex(ctx, 1, 0, e, flags, size);
	return r ? -r : 1;
}

RT_VISIBLE int ibv_query_pkey(struct ibv_context *ctx, uint8_t port, int index, __be16 *pkey)
{
	if (!ctx || !pkey || port != 1 || index != 0)
		return -1;
	*pkey = 0xffff;
	return 0;
}

RT_VISIBLE int ibv_get_pkey_index(struct ibv_context *ctx, uint8_t port, __be16 pkey)
{
	if (!ctx || port != 1 || pkey != 0xffff)
		return -1;
	return 0;
}

RT_VISIBLE int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)
{
	char path[512];
	if (snprintf(path, sizeof(path), "%s/%s", dir, file) >= (int)sizeof(path))
		return -1;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, size);
	close(fd);
	if (n < 0)
		return -1;
	if (n > 0 && buf[n - 1] == '\n')
		buf[--n] = 0;
	else if ((size_t)n < size)
		buf[n] = 0;
	return (int)n;
}

RT_VISIBLE int ibv_fork_init(void) { return 0; }

RT_VISIBLE enum ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }

RT_VISIBLE const char *ibv_node_type_str(enum ibv_node_type t)
{
	static const char *const s[] = {"InfiniBand channel adapter", "InfiniBand switch", "InfiniBand router", "iWARP NIC",
					"usNIC", "usNIC UDP", "unspecified"};
	return t >= 1 && t <= 7 ? s[t - 1] : "unknown";
}

RT_VISIBLE const char *ibv_port_state_str(enum ibv_port_state s)
{
	static const char *const n[] = {"PORT_NOP", "PORT_DOWN", "PORT_INIT", "PORT_ARMED", "PORT_ACTIVE", "PORT_ACTIVE_DEFER"};
	return (unsigned)s < 6 ? n[s] : "unknown";
}

RT_VISIBLE const char *ibv_event_type_str(enum ibv_event_type e)
{
	static const char *const n[] = {
		"CQ error", "local work queue catastrophic error", "invalid request local work queue error",
		"local access violation work queue error", "communication established", "send queue drained",
		"path migrated", "path migration request error", "local catastrophic error", "port active",
		"port error", "LID change", "P_Key change", "SM change", "SRQ catastrophic error", "SRQ limit reached",
		"last WQE reached", "client reregistration", "GID table change", "WQ fatal"};
	return (unsigned)e < sizeof(n) / sizeof(n[0]) ? n[e] : "unknown";
}

RT_VISIBLE const char *ibv_wc_status_str(enum ibv_wc_status s)
{
	static const char *const n[] = {"success", "local length error", "local QP operation error",
					"local EE context operation error", "local protection error", "Work Request Flushed Error",
					"memory management operation error", "bad response error", "local access error",
					"remote invalid request error", "remote access error", "remote operation error",
					"transport retry counter exceeded", "RNR retry counter exceeded", "local RDD violation error",
					"remote invalid RD request", "aborted error", "invalid EE context number",
					"invalid EE context state", "fatal error", "response timeout error", "general error",
					"TM error", "TM rendezvous request error"};
	return (unsigned)s < sizeof(n) / sizeof(n[0]) ? n[s] : "unknown";
}

RT_VISIBLE int ibv_rate_to_mult(enum ibv_rate r)
{
	switch (r) {
	case IBV_RATE_2_5_GBPS: return 1;
	case IBV_RATE_5_GBPS: return 2;
	case IBV_RATE_10_GBPS: return 4;
	case IBV_RATE_20_GBPS: return 8;
	case IBV_RATE_30_GBPS: return 12;
	case IBV_RATE_40_GBPS: return 16;
	case IBV_RATE_60_GBPS: return 24;
	case IBV_RATE_80_GBPS: return 32;
	case IBV_RATE_120_GBPS: return 48;
	default: return -1;
	}
}

RT_VISIBLE enum ibv_rate mult_to_ibv_rate(int m)
{
	switch (m) {
	case 1: return IBV_RATE_2_5_GBPS;
	case 2: return IBV_RATE_5_GBPS;
	case 4: return IBV_RATE_10_GBPS;
	case 8: return IBV_RATE_20_GBPS;
	case 12: return IBV_RATE_30_GBPS;
	case 16: return IBV_RATE_40_GBPS;
	case 24: return IBV_RATE_60_GBPS;
	case 32: return IBV_RATE_80_GBPS;
	case 48: return IBV_RATE_120_GBPS;
	default: return IBV_RATE_MAX;
	}
}

/* Operations of InfiniBand transports an iWARP device lacks. */
RT_VISIBLE struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	(void)pd;
	(void)attr;
	errno = EOPNOTSUPP;
	return NULL;
}

RT_VISIBLE int ibv_destroy_ah(struct ibv_ah *ah)
{
	(void)ah;
	return EINVAL;
}

RT_VISIBLE struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc, struct ibv_grh *grh, uint8_t port)
{
	(void)pd;
	(void)wc;
	(void)grh;
	(void)port;
	errno = EOPNOTSUPP;
	return NULL;
}

RT_VISIBLE int ibv_init_ah_from_wc(struct ibv_context *ctx, uint8_t port, struct ibv_wc *wc, struct ibv_grh *grh,
				   struct ibv_ah_attr *attr)
{
	(void)ctx;
	(void)port;
	(void)wc;
	(void)grh;
	(void)attr;
	return EOPNOTSUPP;
}

RT_VISIBLE int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	(void)qp;
	(void)gid;
	(void)lid;
	return EOPNOTSUPP;
}

RT_VISIBLE int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	(void)qp;
	(void)gid;
	(void)lid;
	return EOPNOTSUPP;
}

RT_VISIBLE struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	(void)qp;
	return NULL; /* no QP is made with the work-request API */
}
