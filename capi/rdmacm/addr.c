/*
 * addr.c: addresses as the service protocol writes them, rdma_getaddrinfo,
 * rdma_event_str and rpoll.
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm.h"

socklen_t cm_addr_len(const struct sockaddr *sa)
{
	if (!sa)
		return 0;
	switch (sa->sa_family) {
	case AF_INET:
		return sizeof(struct sockaddr_in);
	case AF_INET6:
		return sizeof(struct sockaddr_in6);
	default:
		return 0;
	}
}

int cm_format_addr(const struct sockaddr *sa, int wildcard_empty, char *buf, size_t len)
{
	char ip[INET6_ADDRSTRLEN];
	int n;
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
		if (wildcard_empty && in->sin_addr.s_addr == htonl(INADDR_ANY))
			n = snprintf(buf, len, ":%u", ntohs(in->sin_port));
		else if (!inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip)))
			return -1;
		else
			n = snprintf(buf, len, "%s:%u", ip, ntohs(in->sin_port));
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
		if (wildcard_empty && IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr))
			n = snprintf(buf, len, ":%u", ntohs(in6->sin6_port));
		else if (!inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip)))
			return -1;
		else
			n = snprintf(buf, len, "[%s]:%u", ip, ntohs(in6->sin6_port));
	} else {
		return -1;
	}
	return n < 0 || (size_t)n >= len ? -1 : n;
}

int cm_parse_addr(const uint8_t *s, size_t n, struct sockaddr_storage *ss)
{
	char buf[INET6_ADDRSTRLEN + 16];
	if (n == 0 || n >= sizeof(buf))
		return -1;
	memcpy(buf, s, n);
	buf[n] = 0;
	char *colon = strrchr(buf, ':');
	if (!colon || colon[1] == 0)
		return -1;
	*colon = 0;
	char *end;
	unsigned long port = strtoul(colon + 1, &end, 10);
	if (*end || port > 65535)
		return -1;
	char *host = buf;
	int v6 = 0;
	if (host[0] == '[') {
		size_t hl = strlen(host);
		if (hl < 2 || host[hl - 1] != ']')
			return -1;
		host[hl - 1] = 0;
		host++;
		v6 = 1;
	}
	memset(ss, 0, sizeof(*ss));
	if (!v6) {
		struct sockaddr_in *in = (struct sockaddr_in *)ss;
		if (inet_pton(AF_INET, host, &in->sin_addr) != 1)
			return -1;
		in->sin_family = AF_INET;
		in->sin_port = htons((uint16_t)port);
		return 0;
	}
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
	if (inet_pton(AF_INET6, host, &in6->sin6_addr) != 1)
		return -1;
	in6->sin6_family = AF_INET6;
	in6->sin6_port = htons((uint16_t)port);
	return 0;
}

/*
 * The address map. A program that learns its peer's address over the
 * kernel's network (qperf's control connection, a launcher's exchange)
 * holds the peer host's kernel address, where no rdmatap endpoint
 * listens; RDMATAP_ADDR_MAP ("FROM=TO,...", set by `rdmatap exec --map`)
 * names the endpoint address each such address stands for, and every
 * address a program passes to rdma_bind_addr or rdma_resolve_addr is
 * looked up in it. Read once; a malformed map fails every lookup.
 */
#define CM_MAP_MAX 64

struct cm_map_entry {
	struct sockaddr_storage from, to;
};

static struct cm_map_entry cm_map[CM_MAP_MAX];
static int cm_map_n = -1; /* -1: malformed */
static pthread_once_t cm_map_once = PTHREAD_ONCE_INIT;

static int cm_map_ip(const char *s, size_t n, struct sockaddr_storage *ss)
{
	char buf[INET6_ADDRSTRLEN];
	if (n == 0 || n >= sizeof(buf))
		return -1;
	memcpy(buf, s, n);
	buf[n] = 0;
	memset(ss, 0, sizeof(*ss));
	struct sockaddr_in *in = (struct sockaddr_in *)ss;
	if (inet_pton(AF_INET, buf, &in->sin_addr) == 1) {
		in->sin_family = AF_INET;
		return 0;
	}
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
	if (inet_pton(AF_INET6, buf, &in6->sin6_addr) == 1) {
		in6->sin6_family = AF_INET6;
		return 0;
	}
	return -1;
}

static int cm_same_ip(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	if (a->ss_family != b->ss_family)
		return 0;
	if (a->ss_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
		       sizeof(struct in6_addr));
}

static void cm_map_load(void)
{
	const char *env = getenv("RDMATAP_ADDR_MAP");
	int n = 0;
	const char *p = env;
	while (p && *p) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		const char *eq = memchr(p, '=', len);
		struct cm_map_entry e;
		if (n == CM_MAP_MAX || !eq || cm_map_ip(p, (size_t)(eq - p), &e.from) ||
		    cm_map_ip(eq + 1, len - (size_t)(eq - p) - 1, &e.to) || e.from.ss_family != e.to.ss_family) {
			fprintf(stderr, "rdmatap: RDMATAP_ADDR_MAP: entry %.*s is not FROM=TO of two IP addresses of one family"
					" (at most %d entries); no address is mapped and binding or resolving fails\n",
				(int)len, p, CM_MAP_MAX);
			cm_map_n = -1;
			return;
		}
		cm_map[n++] = e;
		p = end ? end + 1 : NULL;
	}
	cm_map_n = n;
}

int cm_map_addr(struct sockaddr_storage *ss)
{
	pthread_once(&cm_map_once, cm_map_load);
	if (cm_map_n < 0)
		return cm_set_errno(EINVAL);
	for (int i = 0; i < cm_map_n; i++) {
		if (!cm_same_ip(ss, &cm_map[i].from))
			continue;
		if (ss->ss_family == AF_INET)
			((struct sockaddr_in *)ss)->sin_addr = ((const struct sockaddr_in *)&cm_map[i].to)->sin_addr;
		else
			((struct sockaddr_in6 *)ss)->sin6_addr = ((const struct sockaddr_in6 *)&cm_map[i].to)->sin6_addr;
		break;
	}
	return 0;
}

static struct sockaddr *dup_addr(const struct sockaddr *sa, socklen_t len)
{
	struct sockaddr *d = calloc(1, sizeof(struct sockaddr_storage));
	if (d && len <= sizeof(struct sockaddr_storage))
		memcpy(d, sa, len);
	return d;
}

void rdma_freeaddrinfo(struct rdma_addrinfo *res)
{
	while (res) {
		struct rdma_addrinfo *next = res->ai_next;
		free(res->ai_src_addr);
		free(res->ai_dst_addr);
		free(res->ai_src_canonname);
		free(res->ai_dst_canonname);
		free(res->ai_route);
		free(res->ai_connect);
		free(res);
		res = next;
	}
}

/* copy_hint duplicates a hint's address into *dst, *len when it is one
 * (its length covers its family's sockaddr): 0, or -1 with errno. */
static int copy_hint(struct sockaddr **dst, socklen_t *len, const struct sockaddr *sa, socklen_t salen)
{
	if (!sa || !salen)
		return 0;
	socklen_t l = cm_addr_len(sa);
	if (!l || salen < l)
		return cm_set_errno(EINVAL);
	*dst = dup_addr(sa, l);
	if (!*dst)
		return cm_set_errno(ENOMEM);
	*len = l;
	return 0;
}

/*
 * rdma_getaddrinfo resolves node and service with getaddrinfo: the first
 * address is the destination, or with RAI_PASSIVE the source. Without
 * node and service it resolves nothing and answers with the hints'
 * flags, family and addresses; in both cases a source or destination the
 * resolution left empty is taken from the hints (ai_src_addr,
 * ai_dst_addr), as rdma-core's does. It returns 0, getaddrinfo's error
 * code, or -1 with errno set.
 */
int rdma_getaddrinfo(const char *node, const char *service, const struct rdma_addrinfo *hints,
		     struct rdma_addrinfo **res)
{
	if (!res || (!node && !service && !hints))
		return cm_set_errno(EINVAL);
	struct rdma_addrinfo h;
	memset(&h, 0, sizeof(h));
	if (hints)
		h = *hints;
	if (h.ai_family != 0 && h.ai_family != AF_INET && h.ai_family != AF_INET6)
		return cm_set_errno(EAFNOSUPPORT);
	struct addrinfo *gres = NULL;
	if (node || service) {
		struct addrinfo gh;
		memset(&gh, 0, sizeof(gh));
		gh.ai_family = h.ai_family;
		gh.ai_socktype = SOCK_STREAM;
		if (h.ai_flags & RAI_PASSIVE)
			gh.ai_flags |= AI_PASSIVE;
		if (h.ai_flags & RAI_NUMERICHOST)
			gh.ai_flags |= AI_NUMERICHOST;
		int ret = getaddrinfo(node, service, &gh, &gres);
		if (ret)
			return ret;
	}
	struct rdma_addrinfo *ai = calloc(1, sizeof(*ai));
	if (!ai) {
		if (gres)
			freeaddrinfo(gres);
		return cm_set_errno(ENOMEM);
	}
	ai->ai_flags = h.ai_flags;
	ai->ai_family = gres ? gres->ai_family : h.ai_family;
	ai->ai_qp_type = h.ai_qp_type ? h.ai_qp_type : IBV_QPT_RC;
	ai->ai_port_space = h.ai_port_space ? h.ai_port_space : RDMA_PS_TCP;
	int err = 0;
	if (gres) {
		struct sockaddr *a = dup_addr(gres->ai_addr, gres->ai_addrlen);
		if (!a)
			err = ENOMEM;
		else if (h.ai_flags & RAI_PASSIVE)
			ai->ai_src_addr = a, ai->ai_src_len = gres->ai_addrlen;
		else
			ai->ai_dst_addr = a, ai->ai_dst_len = gres->ai_addrlen;
		freeaddrinfo(gres);
	}
	if (!err && !ai->ai_src_addr && copy_hint(&ai->ai_src_addr, &ai->ai_src_len, h.ai_src_addr, h.ai_src_len))
		err = errno;
	if (!err && !ai->ai_dst_addr && copy_hint(&ai->ai_dst_addr, &ai->ai_dst_len, h.ai_dst_addr, h.ai_dst_len))
		err = errno;
	if (!err && !ai->ai_family)
		ai->ai_family = ai->ai_src_addr ? ai->ai_src_addr->sa_family
						: ai->ai_dst_addr ? ai->ai_dst_addr->sa_family : 0;
	if (!err && ((ai->ai_src_addr && ai->ai_src_addr->sa_family != ai->ai_family) ||
		     (ai->ai_dst_addr && ai->ai_dst_addr->sa_family != ai->ai_family)))
		err = EINVAL;
	if (err) {
		rdma_freeaddrinfo(ai);
		return cm_set_errno(err);
	}
	*res = ai;
	return 0;
}

const char *rdma_event_str(enum rdma_cm_event_type event)
{
	static const char *const names[] = {
		[RDMA_CM_EVENT_ADDR_RESOLVED] = "RDMA_CM_EVENT_ADDR_RESOLVED",
		[RDMA_CM_EVENT_ADDR_ERROR] = "RDMA_CM_EVENT_ADDR_ERROR",
		[RDMA_CM_EVENT_ROUTE_RESOLVED] = "RDMA_CM_EVENT_ROUTE_RESOLVED",
		[RDMA_CM_EVENT_ROUTE_ERROR] = "RDMA_CM_EVENT_ROUTE_ERROR",
		[RDMA_CM_EVENT_CONNECT_REQUEST] = "RDMA_CM_EVENT_CONNECT_REQUEST",
		[RDMA_CM_EVENT_CONNECT_RESPONSE] = "RDMA_CM_EVENT_CONNECT_RESPONSE",
		[RDMA_CM_EVENT_CONNECT_ERROR] = "RDMA_CM_EVENT_CONNECT_ERROR",
		[RDMA_CM_EVENT_UNREACHABLE] = "RDMA_CM_EVENT_UNREACHABLE",
		[RDMA_CM_EVENT_REJECTED] = "RDMA_CM_EVENT_REJECTED",
		[RDMA_CM_EVENT_ESTABLISHED] = "RDMA_CM_EVENT_ESTABLISHED",
		[RDMA_CM_EVENT_DISCONNECTED] = "RDMA_CM_EVENT_DISCONNECTED",
		[RDMA_CM_EVENT_DEVICE_REMOVAL] = "RDMA_CM_EVENT_DEVICE_REMOVAL",
		[RDMA_CM_EVENT_MULTICAST_JOIN] = "RDMA_CM_EVENT_MULTICAST_JOIN",
		[RDMA_CM_EVENT_MULTICAST_ERROR] = "RDMA_CM_EVENT_MULTICAST_ERROR",
		[RDMA_CM_EVENT_ADDR_CHANGE] = "RDMA_CM_EVENT_ADDR_CHANGE",
		[RDMA_CM_EVENT_TIMEWAIT_EXIT] = "RDMA_CM_EVENT_TIMEWAIT_EXIT",
	};
	if ((unsigned)event < sizeof(names) / sizeof(names[0]))
		return names[event];
	return "UNKNOWN EVENT";
}

/* rpoll is rsockets' poll; this library makes no rsockets, so every
 * descriptor is a plain one and poll answers. */
int rpoll(struct pollfd *fds, nfds_t nfds, int timeout) { return poll(fds, nfds, timeout); }
