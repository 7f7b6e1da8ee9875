/*
 * rdmatap_core.h: the private interface rdmatap's libibverbs.so.1 exports
 * to rdmatap's librdmacm.so.1 (symbol version RDMATAP_PRIVATE_1).
 *
 * A process has one session with the rdmatap service: a SOCK_SEQPACKET
 * connection to the socket named by the environment variable
 * RDMATAP_SOCKET, made on first use (docs/service-protocol.md). A reader
 * thread owned by the session receives every message from the service: it
 * hands each reply to the call waiting for it (or to its completion
 * function) and each unsolicited message (EVENT, QP_DONE) to the handlers
 * registered for its type.
 *
 * Every function here is safe to call from any thread. Completion
 * functions and handlers run on the reader thread: they may call
 * rt_call_send, rt_call_async and rt_cancel, but never rt_call or
 * rt_call_wait (the reply they would wait for is read by that thread).
 */
#ifndef RDMATAP_CORE_H
#define RDMATAP_CORE_H

#include <stddef.h>
#include <stdint.h>

#include <infiniband/verbs.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Wire limits (protocol section 1 and 2). */
#define RT_MAX_MSG 4096
#define RT_MAX_ARGS 24
#define RT_MAX_FDS 4
#define RT_HDR_SIZE 16

/* HELLO's reply arguments, by index (protocol section 3.1). */
enum rt_hello_arg {
	RT_HELLO_VERSION = 0,  /* the service's protocol version */
	RT_HELLO_FLAGS = 1,    /* bit 0: the device has the extensions off */
	RT_HELLO_ID = 2,       /* the session's ID */
	RT_HELLO_FEATURES = 3, /* the features the service offers */
	RT_HELLO_ARGS = 4,     /* the number of arguments */
};

/* Message types (protocol section 4). */
enum rt_msg_type {
	RT_HELLO = 1,
	RT_ALLOC_PD = 2,
	RT_DEALLOC_PD = 3,
	RT_CREATE_CQ = 4,
	RT_DESTROY_CQ = 5,
	RT_REG_MR = 6,
	RT_DEREG_MR = 7,
	RT_CREATE_SRQ = 8,
	RT_DESTROY_SRQ = 9,
	RT_SRQ_LIMIT = 10,
	RT_CREATE_QP = 11,
	RT_DESTROY_QP = 12,
	RT_QUERY_QP = 13,
	RT_DISCONNECT = 14,
	RT_DIAL = 15,
	RT_LISTEN = 16,
	RT_CLOSE_LISTENER = 17,
	RT_GET_REQUEST = 18,
	RT_ACCEPT = 19,
	RT_REJECT = 20,
	RT_CANCEL = 21,
	RT_EVENT = 22,
	RT_QP_DONE = 23,
	RT_ERROR = 24,
	RT_ALLOC_MR = 25,
	RT_MAP_MR = 26,
	RT_SET_IOVA = 27,
	RT_ALLOC_MW = 28,
	RT_DEALLOC_MW = 29,
	RT_BIND_MW = 30,
	RT_QUERY_MEM = 31,
	RT_STATS = 32,
	RT_QUERY_DEVICE = 33,
	RT_QUERY_PORT = 34,
	RT_QP_ERROR = 35,
};

/* Reply statuses (protocol section 2.5). */
enum rt_status {
	RT_OK = 0,
	RT_INVALID_ARGUMENT = 1,
	RT_INVALID_STATE = 2,
	RT_BUSY = 3,
	RT_CLOSED = 4,
	RT_QUEUE_FULL = 5,
	RT_REJECTED = 6,
	RT_LIMIT = 7,
	RT_PERMISSION = 8,
	RT_CANCELED = 9,
	RT_VERSION = 10,
	RT_GENERAL = 11,
	RT_TOO_MANY_SGE = 12,
	RT_MARKERS = 13,
	RT_NO_MATCHING_RTR = 14,
	RT_TIMEOUT = 15,
	RT_INVALID_WR = 16,
	RT_INVALID_ARG_WR = 17,
	RT_ERRNO = 18,
};

/* Terminate layers: EVENT's argument RT_EVA_TERM_LAYER (protocol section 7.8). */
enum rt_term_layer { RT_TERM_RDMAP = 0, RT_TERM_DDP = 1, RT_TERM_LLP = 2 };

/* EVENT types (protocol section 7.9). */
enum rt_event_type {
	RT_EV_ESTABLISHED = 0,
	RT_EV_DISCONNECTED = 1,
	RT_EV_TERMINATE_SENT = 2,
	RT_EV_TERMINATE_RECEIVED = 3,
	RT_EV_QP_FATAL = 4,
	RT_EV_SRQ_LIMIT_REACHED = 5,
	RT_EV_SRQ_ERR = 6,
};

/* QP states: QUERY_QP's reply argument 0 (protocol section 7.2). */
enum rt_qp_state {
	RT_QPS_IDLE = 0,
	RT_QPS_RTS = 1,
	RT_QPS_CLOSING = 2,
	RT_QPS_TERMINATE = 3,
	RT_QPS_ERROR = 4,
};

/* DISCONNECTED events' reasons: EVENT's argument RT_EVA_REASON (feature CM). */
enum rt_disconnect_reason {
	RT_DISC_LOCAL = 1, /* this end closed gracefully first */
	RT_DISC_PEER = 2,  /* the peer closed gracefully first */
	RT_DISC_ERROR = 3, /* an error ended the connection */
};

/* EVENT's arguments, by index (protocol section 2.8). */
enum rt_event_arg {
	RT_EVA_TYPE = 0,       /* an rt_event_type */
	RT_EVA_QPN = 1,        /* the QP's number (0: none) */
	RT_EVA_SRQ = 2,        /* the SRQ's handle (0: none) */
	RT_EVA_TERM_LAYER = 3, /* a Terminate's layer, type and code */
	RT_EVA_TERM_TYPE = 4,
	RT_EVA_TERM_CODE = 5,
	RT_EVA_REASON = 6, /* an rt_disconnect_reason (feature CM) */
};

/* QUERY_DEVICE's reply arguments, by index (protocol section 5.7): the
 * ibv_device_attr limits as this client may use them. */
enum rt_query_device_arg {
	RT_QD_MAX_QP = 0,
	RT_QD_MAX_QP_WR = 1,
	RT_QD_MAX_SGE = 2,
	RT_QD_MAX_SGE_RD = 3,
	RT_QD_MAX_CQ = 4,
	RT_QD_MAX_CQE = 5,
	RT_QD_MAX_MR = 6,
	RT_QD_MAX_MR_SIZE = 7,
	RT_QD_MAX_PD = 8,
	RT_QD_MAX_QP_RD_ATOM = 9,  /* IRD */
	RT_QD_MAX_QP_INIT_RD = 10, /* ORD */
	RT_QD_MAX_SRQ = 11,
	RT_QD_MAX_SRQ_WR = 12,
	RT_QD_MAX_SRQ_SGE = 13,
	RT_QD_MAX_INLINE = 14,
	RT_QD_MAX_PRIV_DATA = 15,
	RT_QD_MAX_MSG_SIZE = 16,
	RT_QD_ATOMIC_CAP = 17, /* an ibv_atomic_cap */
	RT_QD_PAGE_SIZE_CAP = 18,
	RT_QD_MAX_MW = 19,
	RT_QD_MAX_FR_PAGES = 20,
	RT_QD_VENDOR_PART_ID = 21,
	RT_QD_VENDOR_ID = 22,
	RT_QD_ARGS = 23, /* the number of arguments */
};

/* QUERY_PORT's reply arguments, by index (protocol section 5.7). */
enum rt_port_arg {
	RT_PORT_STATE = 0,        /* an ibv_port_state */
	RT_PORT_PHYS_STATE = 1,   /* 5 LinkUp, 3 Disabled */
	RT_PORT_LINK_MTU = 2,     /* the link's IP MTU in bytes */
	RT_PORT_ACTIVE_MTU = 3,   /* an ibv_mtu */
	RT_PORT_ACTIVE_WIDTH = 4, /* active_width */
	RT_PORT_ACTIVE_SPEED = 5, /* active_speed */
	RT_PORT_ARGS = 6,         /* the number of arguments */
};

/* QUERY_PORT's reply fields, by index. */
enum rt_port_field {
	RT_PORT_FIELD_IPV4 = 0, /* 4 bytes, or empty */
	RT_PORT_FIELD_MAC = 1,  /* 6 bytes */
	RT_PORT_FIELD_GID = 2,  /* 16 bytes */
	RT_PORT_FIELD_GUID = 3, /* 8 bytes, network order */
	RT_PORT_FIELDS = 4,     /* the number of fields */
};

/* Tri (protocol section 7.10). */
enum rt_tri { RT_TRI_UNSET = 0, RT_TRI_FALSE = 1, RT_TRI_TRUE = 2 };

/* A DIAL or ACCEPT reply's arguments, by index: what the connection
 * negotiated (protocol section 5.6). */
enum rt_neg_arg {
	RT_NEG_MPA_REVISION = 0,
	RT_NEG_CRC = 1, /* 1: on */
	RT_NEG_IRD = 2,
	RT_NEG_ORD = 3,
	RT_NEG_PEER_TO_PEER = 4, /* 1: on */
	RT_NEG_RTR = 5,          /* the RTR type used */
	RT_NEG_MARKERS_TX = 6,   /* 1: this end inserts markers */
	RT_NEG_MARKERS_RX = 7,   /* 1: the peer inserts markers */
	RT_NEG_ARGS = 8,         /* the number of arguments */
};

/* A DIAL or ACCEPT reply's fields, by index. */
enum rt_conn_field {
	RT_CONN_FIELD_LOCAL = 0,        /* the local address, IP:PORT */
	RT_CONN_FIELD_REMOTE = 1,       /* the remote address */
	RT_CONN_FIELD_PRIVATE_DATA = 2, /* the peer's private data */
	RT_CONN_FIELDS = 3,             /* the number of fields */
};

/* LISTEN's reply arguments, by index (protocol section 5.6). */
enum rt_listen_arg {
	RT_LISTEN_HANDLE = 0, /* the listener's handle */
	RT_LISTEN_PORT = 1,   /* the port listened on */
	RT_LISTEN_ARGS = 2,   /* the number of arguments */
};

/* GET_REQUEST's reply arguments, by index (protocol section 5.6): the
 * connection request and what its initiator asked for. */
enum rt_req_arg {
	RT_REQ_HANDLE = 0,       /* the connection request's handle */
	RT_REQ_MPA_REVISION = 1, /* the initiator's MPA revision */
	RT_REQ_CRC = 2,          /* 1: CRC asked */
	RT_REQ_IRD = 3,          /* IRD offered */
	RT_REQ_ORD = 4,          /* ORD offered */
	RT_REQ_PEER_TO_PEER = 5, /* 1: peer-to-peer asked */
	RT_REQ_RTR = 6,          /* RTR types offered */
	RT_REQ_MARKERS = 7,      /* 1: markers asked */
	RT_REQ_ARGS = 8,         /* the number of arguments */
};

/* GET_REQUEST's reply fields, by index. */
enum rt_req_field {
	RT_REQ_FIELD_ADDR = 0,         /* the initiator's address, IP:PORT */
	RT_REQ_FIELD_PRIVATE_DATA = 1, /* its private data */
	RT_REQ_FIELDS = 2,             /* the number of fields */
};

/* The session of the process (opaque). */
struct rt_session;

/*
 * rt_session_get returns the process's session, connecting to
 * $RDMATAP_SOCKET and exchanging HELLO on first use. On failure it returns
 * NULL with errno set (ENOENT when RDMATAP_SOCKET is unset, the connect's
 * errno, EPROTO for a refused HELLO) and tries again on the next call.
 * After fork() the child has no session: its first call connects anew.
 */
struct rt_session *rt_session_get(void);

/* The device's name from the HELLO reply (valid as long as the process). */
const char *rt_session_device_name(struct rt_session *s);

/* Whether the session has ended (end of file from the service). */
int rt_session_dead(struct rt_session *s);

/* The features HELLO agreed on (protocol 3.1: bit 0 QUERY_DEVICE, 1
 * INLINE_DATA, 2 LINK, 3 CM). */
uint64_t rt_session_features(struct rt_session *s);
#define RT_FEATURE_LINK_BIT (1ULL << 2)
#define RT_FEATURE_CM_BIT (1ULL << 3)

/* One payload field (protocol section 2.4). */
struct rt_field {
	const void *data;
	uint16_t len;
};

/* A request to send. args[0..nargs) are sent; fields become the payload;
 * fds (at most RT_MAX_FDS) ride along and stay the caller's. */
struct rt_request {
	uint16_t type;
	uint8_t nargs;
	const uint64_t *args;
	unsigned nfields;
	const struct rt_field *fields;
	unsigned nfds;
	const int *fds;
};

/* A message received: a reply, or an unsolicited EVENT / QP_DONE. The
 * descriptors of a reply belong to whoever receives the reply, who must
 * close them; those of other messages are closed by the session. */
struct rt_msg {
	uint16_t type;
	uint8_t nargs;
	uint32_t seq;
	uint32_t status;
	uint64_t args[RT_MAX_ARGS]; /* args past nargs read as 0 */
	uint32_t payload_len;
	unsigned nfds;
	int fds[RT_MAX_FDS];
	uint8_t payload[RT_MAX_MSG];
};

/* rt_msg_field finds payload field i: 0 with *data and *len set, or -1 when the
 * payload has fewer fields or is malformed. */
int rt_msg_field(const struct rt_msg *m, unsigned i, const uint8_t **data, uint16_t *len);

/* rt_msg_errno maps a reply's status to an errno: ERRNO's own, EINVAL,
 * EBUSY, ENOMEM for LIMIT and QUEUE_FULL, ECONNREFUSED for REJECTED,
 * ECANCELED, ETIMEDOUT, EPERM, ... (0 for OK). */
int rt_msg_errno(const struct rt_msg *m);

/*
 * rt_call sends req and waits for its reply into *rep. It returns 0 when
 * the reply's status is OK; otherwise -1 with errno set (rt_msg_errno of
 * the reply, whose status and text stay in *rep with rep->status nonzero;
 * or ECONNRESET with rep->status RT_CLOSED when the session ended, or the
 * send's errno). On failure, descriptors that came with the reply are
 * closed already.
 */
int rt_call(struct rt_session *s, const struct rt_request *req, struct rt_msg *rep);

/* rt_call_send sends req and returns its sequence number (nonzero), or 0
 * with errno set. Its reply is waited for with rt_call_wait (exactly once,
 * from any thread). */
uint32_t rt_call_send(struct rt_session *s, const struct rt_request *req);

/* rt_call_wait waits for the reply of the call seq; returns as rt_call. */
int rt_call_wait(struct rt_session *s, uint32_t seq, struct rt_msg *rep);

/*
 * rt_call_async sends req; when its reply arrives (or the session ends:
 * then rep->status is RT_CLOSED and rep->nargs 0), done(ctx, rep) runs on
 * the reader thread, and owns the reply's descriptors (rep itself is valid
 * only during the call). Returns the sequence number, or 0 with errno set
 * (done is then never called).
 */
uint32_t rt_call_async(struct rt_session *s, const struct rt_request *req,
		       void (*done)(void *ctx, struct rt_msg *rep), void *ctx);

/* rt_cancel asks the service to abandon the blocking call seq (CANCEL);
 * the call still gets its one reply. */
void rt_cancel(struct rt_session *s, uint32_t seq);

/*
 * rt_add_handler registers fn to run, on the reader thread, for every
 * unsolicited message of type msg_type (RT_EVENT or RT_QP_DONE), and with
 * msg == NULL, msg_type 0, when the session ends. Handlers run in the order
 * registered; every handler sees every message of its type and must ignore
 * what is not its own (e.g. librdmacm takes ESTABLISHED and DISCONNECTED,
 * libibverbs turns TERMINATE_*, QP_FATAL and SRQ_LIMIT_REACHED into
 * asynchronous events). Returns 0, or -1 with errno.
 */
int rt_add_handler(struct rt_session *s, uint16_t msg_type,
		   void (*fn)(void *ctx, uint16_t msg_type, const struct rt_msg *msg), void *ctx);

/*
 * Lookups from libibverbs objects to the service's handles. Each returns 0
 * for an object that is not rdmatap's (or NULL).
 */
uint64_t rt_pd_handle(struct ibv_pd *pd);
uint64_t rt_qp_handle(struct ibv_qp *qp);	/* the QP number */
uint64_t rt_cq_handle(struct ibv_cq *cq);
uint64_t rt_srq_handle(struct ibv_srq *srq);
struct rt_session *rt_context_session(struct ibv_context *ctx);

/* rt_qp_lookup returns the live QP of QP number qpn, or NULL. */
struct ibv_qp *rt_qp_lookup(uint32_t qpn);

/*
 * rt_qp_set_state records the state librdmacm moved a QP into (IBV_QPS_RTS
 * once DIAL or ACCEPT succeeded, IBV_QPS_ERR after a disconnect), which
 * ibv_query_qp and ibv_modify_qp report and check.
 */
void rt_qp_set_state(struct ibv_qp *qp, enum ibv_qp_state state);

/*
 * rt_default_context returns a device context of the process, opened on
 * first use and never closed (librdmacm's cm_id->verbs), or NULL with
 * errno set.
 */
struct ibv_context *rt_default_context(void);

#ifdef __cplusplus
}
#endif

#endif
