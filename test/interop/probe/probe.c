/*
 * probe: what rping and perftest never exercise, between Linux siw (this
 * program, in the siw VM) and rdmatap (test/interop/probepeer on the host).
 *
 *   probe server ADDR PORT CELL...   accept one rdma_cm connection a cell
 *   probe client ADDR PORT CELL...   connect once a cell
 *   probe local                      what siw's user library refuses
 *
 * Each cell prints "PROBE <cell> PASS|FAIL|SKIP <details>"; the exit status
 * is 1 if any cell failed. The peer runs the same cells in the same order.
 * Both sides put 16 bytes of private data in their connect/accept:
 * cell number, pad[3], be32 rkey, be64 address of a 4096-byte data region.
 *
 * Cells (in is towards siw, out is from siw):
 *   sendinv_in     rdmatap's Send with Invalidate names siw's STag: siw
 *                  receives it, and rdmatap's Read of the STag afterwards
 *                  is refused with an invalid-STag Terminate (rdmatap
 *                  checks; siw's user CQEs never say IBV_WC_WITH_INV)
 *   sendinv_out    siw's Send with Invalidate names rdmatap's STag (libsiw
 *                  takes it from wr.rdma.rkey, so the probe sets both); siw's
 *                  Read of it afterwards must fail (rdmatap checks that it
 *                  answered with a Terminate)
 *   srq            both sides receive four Sends through an SRQ
 *   solicited_in   rdmatap sends two Sends and a Send with Solicited Event;
 *                  siw's CQ, armed solicited-only, must raise one event,
 *                  after the third
 *   solicited_out  siw sends the same; rdmatap checks WCSolicited
 *   atomic         rdmatap posts a Fetch&Add to siw's memory: siw answers
 *                  with a Terminate, its QP fails, the memory is unchanged
 *   imm_write      rdmatap posts an RDMA Write with Immediate (64 bytes at
 *                  offset 64): siw answers its Immediate Data message with a
 *                  Terminate, its QP fails, the first word is unchanged
 *   imm_send       the same for a Send with Immediate
 *   fastreg        rdmatap fast-registers a page list (REG_MR) and sends
 *                  "fr RKEY ADDR LEN": siw Writes 3000 bytes at ADDR+1000
 *                  and Reads back what rdmatap put there (byte i is
 *                  i*3+5); rdmatap Local Invalidates, registers other pages
 *                  zero-based under the next key ("fr2 ..."), siw Writes 16
 *                  bytes at 4090 of it; then siw Writes with the old STag
 *                  and its QP must fail (rdmatap checks its Terminate)
 *   read_inv       rdmatap Reads siw's data region with local invalidate
 *                  of its sink and sends "ri RKEY ADDR": siw's Write to the
 *                  sink's STag must fail its QP
 *   solicited_notify  siw sends two Sends, pauses, then a Send with
 *                  Solicited Event; rdmatap's CQ, armed solicited-only,
 *                  must raise one event, with all three receives in it
 *
 * Build: gcc -O2 -Wall -o probe probe.c -lrdmacm -libverbs
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define DATA 4096
#define CTL 64 /* one control/receive slot */
#define NSLOT 8

struct pdata {
	uint8_t cell, pad[3];
	uint32_t rkey; /* big-endian */
	uint64_t addr; /* big-endian */
};

struct conn {
	struct rdma_event_channel *ec;
	struct rdma_cm_id *id, *listen;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	struct ibv_srq *srq;
	struct ibv_mr *data, *ctl;
	char *dbuf, *cbuf;
	struct pdata peer;
	struct rdma_cm_id *pend; /* a connect request that came during a teardown */
	struct pdata pend_peer;
};

static const char *cells[] = {"sendinv_in", "sendinv_out", "srq", "solicited_in", "solicited_out", "atomic",
			      "fastreg", "read_inv", "solicited_notify", "imm_write", "imm_send", NULL};
static int failed;
static char why[256];

static void result(const char *cell, const char *st, const char *fmt, ...)
{
	va_list ap;
	printf("PROBE %s %s ", cell, st);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	if (!strcmp(st, "FAIL"))
		failed = 1;
}

static int bad(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof why, fmt, ap);
	va_end(ap);
	return -1;
}

static long long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

/* get_event waits up to ms for the next rdma_cm event, which must be want. */
static int get_event(struct conn *c, enum rdma_cm_event_type want, int ms, struct rdma_cm_event *out)
{
	struct pollfd p = {.fd = c->ec->fd, .events = POLLIN};
	struct rdma_cm_event *ev;
	if (poll(&p, 1, ms) <= 0)
		return bad("no %s within %d ms", rdma_event_str(want), ms);
	if (rdma_get_cm_event(c->ec, &ev))
		return bad("rdma_get_cm_event: %s", strerror(errno));
	*out = *ev;
	if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST && want != ev->event) {
		/* The peer's next cell, early: keep it for serve. */
		c->pend = ev->id;
		memcpy(&c->pend_peer, ev->param.conn.private_data, sizeof c->pend_peer);
		rdma_ack_cm_event(ev);
		return get_event(c, want, ms, out);
	}
	if (ev->event == RDMA_CM_EVENT_ESTABLISHED || ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
		if (ev->param.conn.private_data_len >= sizeof(struct pdata))
			memcpy(&c->peer, ev->param.conn.private_data, sizeof c->peer);
	}
	rdma_ack_cm_event(ev);
	if (out->event != want)
		return bad("%s (status %d) instead of %s", rdma_event_str(out->event), out->status, rdma_event_str(want));
	return 0;
}

/* setup creates the QP's resources on c->id; srq: receive through an SRQ. */
static int setup(struct conn *c, int srq)
{
	struct ibv_qp_init_attr qa = {0};
	c->pd = ibv_alloc_pd(c->id->verbs);
	c->ch = ibv_create_comp_channel(c->id->verbs);
	c->cq = c->ch ? ibv_create_cq(c->id->verbs, 64, NULL, c->ch, 0) : NULL;
	if (!c->pd || !c->cq)
		return bad("pd/cq: %s", strerror(errno));
	c->dbuf = calloc(1, DATA);
	c->cbuf = calloc(NSLOT, CTL);
	for (int i = 0; i < DATA; i++)
		c->dbuf[i] = (char)(i * 7 + 1);
	c->data = ibv_reg_mr(c->pd, c->dbuf, DATA, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
	c->ctl = ibv_reg_mr(c->pd, c->cbuf, NSLOT * CTL, IBV_ACCESS_LOCAL_WRITE);
	if (!c->data || !c->ctl)
		return bad("ibv_reg_mr: %s", strerror(errno));
	if (srq) {
		struct ibv_srq_init_attr sa = {.attr = {.max_wr = 16, .max_sge = 1}};
		c->srq = ibv_create_srq(c->pd, &sa);
		if (!c->srq)
			return bad("ibv_create_srq: %s", strerror(errno));
	}
	qa.send_cq = qa.recv_cq = c->cq;
	qa.srq = c->srq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 16;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	if (rdma_create_qp(c->id, c->pd, &qa))
		return bad("rdma_create_qp: %s", strerror(errno));
	return 0;
}

static void teardown(struct conn *c)
{
	struct rdma_cm_event ev;
	if (c->id && c->id->qp) {
		rdma_disconnect(c->id);
		get_event(c, RDMA_CM_EVENT_DISCONNECTED, 2000, &ev);
		rdma_destroy_qp(c->id);
	}
	if (c->srq)
		ibv_destroy_srq(c->srq);
	if (c->data)
		ibv_dereg_mr(c->data);
	if (c->ctl)
		ibv_dereg_mr(c->ctl);
	if (c->cq)
		ibv_destroy_cq(c->cq);
	if (c->ch)
		ibv_destroy_comp_channel(c->ch);
	if (c->pd)
		ibv_dealloc_pd(c->pd);
	if (c->id)
		rdma_destroy_id(c->id);
	free(c->dbuf);
	free(c->cbuf);
	c->id = NULL, c->srq = NULL, c->data = c->ctl = NULL, c->cq = NULL, c->ch = NULL, c->pd = NULL;
	c->dbuf = c->cbuf = NULL;
}

static int post_recv(struct conn *c, int slot)
{
	struct ibv_sge sge = {.addr = (uintptr_t)c->cbuf + slot * CTL, .length = CTL, .lkey = c->ctl->lkey};
	struct ibv_recv_wr wr = {.wr_id = slot, .sg_list = &sge, .num_sge = 1}, *badwr;
	int rv = c->srq ? ibv_post_srq_recv(c->srq, &wr, &badwr) : ibv_post_recv(c->id->qp, &wr, &badwr);
	return rv ? bad("post recv: %s", strerror(rv)) : 0;
}

/* post_send sends msg from the last control slot, signaled unless
 * unsignaled (the QP has sq_sig_all 0). */
static int post_send_flags(struct conn *c, enum ibv_wr_opcode op, int flags, const char *msg, uint32_t inv, int unsignaled)
{
	char *b = c->cbuf + (NSLOT - 1) * CTL;
	struct ibv_sge sge = {.addr = (uintptr_t)b, .length = strlen(msg), .lkey = c->ctl->lkey};
	struct ibv_send_wr wr = {.wr_id = 100, .sg_list = &sge, .num_sge = 1, .opcode = op,
				 .send_flags = (unsignaled ? 0 : IBV_SEND_SIGNALED) | flags}, *badwr;
	int rv;
	strcpy(b, msg);
	if (op == IBV_WR_SEND_WITH_INV) {
		wr.invalidate_rkey = inv;
		/* libsiw (rdma-core 44) puts wr.rdma.rkey, not invalidate_rkey,
		 * into the Send with Invalidate's Inval STag field. */
		wr.wr.rdma.rkey = inv;
	}
	rv = ibv_post_send(c->id->qp, &wr, &badwr);
	return rv ? bad("post send: %s", strerror(rv)) : 0;
}

static int post_send(struct conn *c, enum ibv_wr_opcode op, int flags, const char *msg, uint32_t inv)
{
	return post_send_flags(c, op, flags, msg, inv, 0);
}

/* wait_wc polls the CQ for one completion for up to ms. */
static int wait_wc(struct conn *c, struct ibv_wc *wc, int ms)
{
	long long end = now_ms() + ms;
	do {
		int n = ibv_poll_cq(c->cq, 1, wc);
		if (n < 0)
			return bad("ibv_poll_cq: %d", n);
		if (n == 1)
			return 0;
		usleep(500);
	} while (now_ms() < end);
	return bad("no completion within %d ms", ms);
}

/* wait_recv skips send completions up to the next receive, in *rx. */
static int wait_recv(struct conn *c, struct ibv_wc *rx, int ms)
{
	for (;;) {
		if (wait_wc(c, rx, ms))
			return -1;
		if (rx->status != IBV_WC_SUCCESS)
			return bad("%s completion: %s", rx->opcode & IBV_WC_RECV ? "receive" : "send", ibv_wc_status_str(rx->status));
		if (rx->opcode & IBV_WC_RECV)
			return 0;
	}
}

static const char *slot(struct conn *c, struct ibv_wc *wc)
{
	char *s = c->cbuf + wc->wr_id * CTL;
	s[wc->byte_len < CTL ? wc->byte_len : CTL - 1] = 0;
	return s;
}

/* The cells' bodies, after the connection is up. Return 0 for PASS, 1 for
 * SKIP, -1 for FAIL, with why set. */

static int sendinv_in(struct conn *c)
{
	struct ibv_wc wc;
	if (wait_recv(c, &wc, 10000))
		return -1;
	/* siw reports the invalidation (IBV_WC_WITH_INV) to kernel consumers
	 * only (siw_rqe_complete); a user CQE never has it. That the STag is
	 * gone is checked by the peer: its Read of it must be refused. */
	int ok = !strcmp(slot(c, &wc), "inv") && (!(wc.wc_flags & IBV_WC_WITH_INV) || wc.invalidated_rkey == c->data->rkey);
	snprintf(why, sizeof why, "received \"%s\", wc_flags %#x (siw tells user space no IBV_WC_WITH_INV), invalidated_rkey %#x",
		 slot(c, &wc), wc.wc_flags, wc.invalidated_rkey);
	char w[sizeof why];
	strcpy(w, why);
	if (post_send(c, IBV_WR_SEND, 0, ok ? "ok" : "bad", 0))
		return -1;
	/* The peer now reads the invalidated STag: siw terminates, and our
	 * receive posted for nothing is flushed. */
	int flushed = 0;
	while (!flushed && !wait_wc(c, &wc, 5000))
		flushed = wc.status == IBV_WC_WR_FLUSH_ERR;
	snprintf(why, sizeof why, "%s; our QP %s after the peer's Read", w, flushed ? "failed" : "still up");
	return ok ? 0 : -1;
}

static int sendinv_out(struct conn *c)
{
	struct ibv_wc wc;
	char verdict[CTL];
	if (post_send(c, IBV_WR_SEND_WITH_INV, 0, "inv", be32toh(c->peer.rkey)) || wait_recv(c, &wc, 10000))
		return -1;
	strcpy(verdict, slot(c, &wc));
	/* Read the invalidated STag: the peer must refuse it. */
	struct ibv_sge sge = {.addr = (uintptr_t)c->dbuf, .length = 8, .lkey = c->data->lkey};
	struct ibv_send_wr wr = {.wr_id = 200, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
				 .send_flags = IBV_SEND_SIGNALED}, *badwr;
	wr.wr.rdma.remote_addr = be64toh(c->peer.addr);
	wr.wr.rdma.rkey = be32toh(c->peer.rkey);
	if (ibv_post_send(c->id->qp, &wr, &badwr))
		return bad("post read: %s", strerror(errno));
	enum ibv_wc_status st = IBV_WC_SUCCESS;
	int done = 0;
	while (!done && !wait_wc(c, &wc, 5000))
		if (wc.wr_id == 200)
			st = wc.status, done = 1;
	/* siw gives no completion status from a Terminate it receives: the
	 * Read ends when the QP fails (flushed); the peer checks that it sent
	 * the Terminate. */
	snprintf(why, sizeof why, "peer's verdict on the invalidation: %s; our Read of the invalidated STag: %s",
		 verdict, done ? ibv_wc_status_str(st) : "no completion");
	return !strcmp(verdict, "ok") && done && st != IBV_WC_SUCCESS ? 0 : -1;
}

static int srq(struct conn *c)
{
	struct ibv_wc wc;
	int got = 0, sent = 0, seen = 0;
	for (int i = 0; i < 4; i++) {
		char m[16];
		snprintf(m, sizeof m, "srq-%d", i);
		if (post_send(c, IBV_WR_SEND, 0, m, 0))
			return -1;
		if (wait_wc(c, &wc, 10000))
			return -1;
		if (wc.status != IBV_WC_SUCCESS)
			return bad("completion %s", ibv_wc_status_str(wc.status));
		if (wc.opcode & IBV_WC_RECV) {
			got++, seen |= 1 << wc.wr_id;
			if (strncmp(slot(c, &wc), "srq-", 4))
				return bad("received %s", slot(c, &wc));
		} else
			sent++;
	}
	while (got < 4 || sent < 4) {
		if (wait_wc(c, &wc, 10000))
			return bad("%d of 4 received through the SRQ, %d sent", got, sent);
		if (wc.status != IBV_WC_SUCCESS)
			return bad("completion %s", ibv_wc_status_str(wc.status));
		if (wc.opcode & IBV_WC_RECV)
			got++, seen |= 1 << wc.wr_id;
		else
			sent++;
	}
	snprintf(why, sizeof why, "4 Sends each way, received in SRQ slots %#x", seen);
	return seen == 0xf ? 0 : -1;
}

static int solicited_in(struct conn *c)
{
	struct pollfd p = {.fd = c->ch->fd, .events = POLLIN};
	struct ibv_cq *ecq;
	void *ectx;
	struct ibv_wc wc;
	int n = 0, early, later = 0;
	/* The peer sends two Sends, waits 500 ms, then a Send with SE. */
	early = poll(&p, 1, 400) > 0;
	if (!early)
		later = poll(&p, 1, 5000) > 0;
	if (early || later) {
		ibv_get_cq_event(c->ch, &ecq, &ectx);
		ibv_ack_cq_events(c->cq, 1);
	}
	long long end = now_ms() + 5000;
	while (n < 3 && now_ms() < end)
		if (ibv_poll_cq(c->cq, 1, &wc) == 1 && wc.status == IBV_WC_SUCCESS && (wc.opcode & IBV_WC_RECV))
			n++;
	if (n != 3)
		return bad("%d of 3 Sends received", n);
	if (early)
		return bad("the solicited-only CQ event fired before the Send with Solicited Event");
	if (!later) {
		snprintf(why, sizeof why, "siw raised no event for its CQ armed solicited-only (3 Sends received, "
					  "the last with Solicited Event): siw_rqe_complete notifies with SIW_WQE_SIGNALLED only");
		return 1;
	}
	snprintf(why, sizeof why, "one event, after the Send with Solicited Event");
	return 0;
}

static int solicited_out(struct conn *c)
{
	struct ibv_wc wc;
	if (post_send(c, IBV_WR_SEND, 0, "plain-1", 0) || post_send(c, IBV_WR_SEND, 0, "plain-2", 0) ||
	    post_send(c, IBV_WR_SEND, IBV_SEND_SOLICITED, "solicited", 0) || wait_recv(c, &wc, 10000))
		return -1;
	snprintf(why, sizeof why, "peer's verdict: %s", slot(c, &wc));
	return strcmp(slot(c, &wc), "ok") ? -1 : 0;
}

static int atomic(struct conn *c)
{
	struct ibv_wc wc;
	int flushed = 0;
	uint64_t before;
	memcpy(&before, c->dbuf, 8);
	while (!flushed && !wait_wc(c, &wc, 8000))
		flushed = wc.status == IBV_WC_WR_FLUSH_ERR;
	int same = !memcmp(&before, c->dbuf, 8);
	snprintf(why, sizeof why, "QP %s, target word %s", flushed ? "failed (receive flushed)" : "still up",
		 same ? "unchanged" : "CHANGED");
	return flushed && same ? 0 : -1;
}

/* rdma posts a signaled RDMA Write or Read (wr_id 200) of n bytes at the
 * start of the data region to or from addr under rkey. */
static int rdma(struct conn *c, enum ibv_wr_opcode op, int n, uint64_t addr, uint32_t rkey)
{
	struct ibv_sge sge = {.addr = (uintptr_t)c->dbuf, .length = n, .lkey = c->data->lkey};
	struct ibv_send_wr wr = {.wr_id = 200, .sg_list = &sge, .num_sge = 1, .opcode = op,
				 .send_flags = IBV_SEND_SIGNALED}, *badwr;
	wr.wr.rdma.remote_addr = addr;
	wr.wr.rdma.rkey = rkey;
	int rv = ibv_post_send(c->id->qp, &wr, &badwr);
	return rv ? bad("post %s: %s", op == IBV_WR_RDMA_READ ? "read" : "write", strerror(rv)) : 0;
}

/* wait_send waits for send WR wrid's completion, skipping other sends' (no
 * receive may complete meanwhile). */
static int wait_send(struct conn *c, uint64_t wrid, int ms)
{
	struct ibv_wc wc;
	for (;;) {
		if (wait_wc(c, &wc, ms))
			return -1;
		if (wc.opcode & IBV_WC_RECV)
			return bad("a receive (\"%s\") came while waiting for a send", slot(c, &wc));
		if (wc.status != IBV_WC_SUCCESS)
			return bad("send %d completion: %s", (int)wc.wr_id, ibv_wc_status_str(wc.status));
		if (wc.wr_id == wrid)
			return 0;
	}
}

/* failed waits up to 5 s for a flushed completion: the QP failed. */
static int qp_failed(struct conn *c)
{
	struct ibv_wc wc;
	while (!wait_wc(c, &wc, 5000))
		if (wc.status == IBV_WC_WR_FLUSH_ERR)
			return 1;
	return 0;
}

static int fastreg(struct conn *c)
{
	struct ibv_wc wc;
	unsigned rkey, rkey2, len, len2;
	unsigned long long addr, addr2;
	char m[CTL];
	if (wait_recv(c, &wc, 10000))
		return -1;
	if (sscanf(slot(c, &wc), "fr %x %llx %u", &rkey, &addr, &len) != 3 || len < 4000)
		return bad("received \"%s\", want fr RKEY ADDR LEN", slot(c, &wc));
	if (rdma(c, IBV_WR_RDMA_WRITE, 3000, addr + 1000, rkey) || wait_send(c, 200, 10000) ||
	    post_send(c, IBV_WR_SEND, 0, "written", 0) || wait_recv(c, &wc, 10000))
		return -1;
	if (strcmp(slot(c, &wc), "check"))
		return bad("received \"%s\", want check", slot(c, &wc));
	memset(c->dbuf, 0, 3000);
	if (rdma(c, IBV_WR_RDMA_READ, 3000, addr + 1000, rkey) || wait_send(c, 200, 10000))
		return -1;
	int rok = 1;
	for (int i = 0; i < 3000; i++)
		rok &= c->dbuf[i] == (char)(i * 3 + 5);
	if (post_send(c, IBV_WR_SEND, 0, rok ? "read ok" : "read bad", 0))
		return -1;
	if (!rok)
		return bad("our Read through the peer's STag %#x returned other bytes", rkey);
	if (wait_recv(c, &wc, 10000))
		return -1;
	if (sscanf(slot(c, &wc), "fr2 %x %llx %u", &rkey2, &addr2, &len2) != 3 || len2 < 4106)
		return bad("received \"%s\", want fr2 RKEY ADDR LEN", slot(c, &wc));
	if (rdma(c, IBV_WR_RDMA_WRITE, 16, addr2 + 4090, rkey2) || wait_send(c, 200, 10000) ||
	    post_send(c, IBV_WR_SEND, 0, "w2", 0) || wait_recv(c, &wc, 10000))
		return -1;
	snprintf(m, sizeof m, "%s", slot(c, &wc));
	if (strcmp(m, "ok"))
		return bad("peer's verdict on our Write through STag %#x: %s", rkey2, m);
	/* The old STag: the peer must refuse it and end the connection. */
	if (rdma(c, IBV_WR_RDMA_WRITE, 8, addr, rkey))
		return -1;
	int f = qp_failed(c);
	snprintf(why, sizeof why, "Write and Read through STag %#x (VA %#llx), Write through %#x (zero-based) placed; "
				  "our Write with the invalidated %#x: QP %s",
		 rkey, addr, rkey2, rkey, f ? "failed" : "still up");
	return f ? 0 : -1;
}

static int read_inv(struct conn *c)
{
	struct ibv_wc wc;
	unsigned rkey;
	unsigned long long addr;
	if (wait_recv(c, &wc, 10000))
		return -1;
	if (sscanf(slot(c, &wc), "ri %x %llx", &rkey, &addr) != 2)
		return bad("received \"%s\", want ri RKEY ADDR", slot(c, &wc));
	if (rdma(c, IBV_WR_RDMA_WRITE, 8, addr, rkey))
		return -1;
	int f = qp_failed(c);
	snprintf(why, sizeof why, "our Write to the peer's Read sink %#x after its Read with invalidate: QP %s",
		 rkey, f ? "failed" : "still up");
	return f ? 0 : -1;
}

static int solicited_notify(struct conn *c)
{
	struct ibv_wc wc;
	if (post_send(c, IBV_WR_SEND, 0, "plain-1", 0) || wait_send(c, 100, 10000) ||
	    post_send(c, IBV_WR_SEND, 0, "plain-2", 0) || wait_send(c, 100, 10000))
		return -1;
	usleep(700000);
	if (post_send(c, IBV_WR_SEND, IBV_SEND_SOLICITED, "solicited", 0) || wait_recv(c, &wc, 10000))
		return -1;
	snprintf(why, sizeof why, "peer's verdict: %s", slot(c, &wc));
	return strcmp(slot(c, &wc), "ok") ? -1 : 0;
}

static int run_cell(struct conn *c, const char *cell)
{
	if (!strcmp(cell, "fastreg"))
		return fastreg(c);
	if (!strcmp(cell, "read_inv"))
		return read_inv(c);
	if (!strcmp(cell, "solicited_notify"))
		return solicited_notify(c);
	if (!strcmp(cell, "sendinv_in"))
		return sendinv_in(c);
	if (!strcmp(cell, "sendinv_out"))
		return sendinv_out(c);
	if (!strcmp(cell, "srq"))
		return srq(c);
	if (!strcmp(cell, "solicited_in"))
		return solicited_in(c);
	if (!strcmp(cell, "solicited_out"))
		return solicited_out(c);
	if (!strcmp(cell, "atomic") || !strcmp(cell, "imm_write") || !strcmp(cell, "imm_send"))
		return atomic(c); /* the same from siw's side: its QP fails, the word unchanged */
	return bad("unknown cell");
}

static int cell_num(const char *cell)
{
	for (int i = 0; cells[i]; i++)
		if (!strcmp(cells[i], cell))
			return i + 1;
	return 0;
}

/* The initiator speaks first (iWARP; rdmatap's responder sends nothing
 * before): the client sends "hello" into slot HELLO of the server. */
#define HELLO (NSLOT - 2)

/* prepare posts the cell's receives (before the connection is up). */
static int prepare(struct conn *c, const char *cell, int server)
{
	int n = !strcmp(cell, "srq") || !strcmp(cell, "solicited_in") ? 4 : !strcmp(cell, "fastreg") ? 5 : 2;
	/* First: receives complete in the order they were posted. */
	if (server && post_recv(c, HELLO))
		return -1;
	for (int i = 0; i < n; i++)
		if (post_recv(c, i))
			return -1;
	if (!strcmp(cell, "solicited_in") && ibv_req_notify_cq(c->cq, 1))
		return bad("ibv_req_notify_cq(solicited_only): %s", strerror(errno));
	return 0;
}

static void conn_param(struct conn *c, const char *cell, struct pdata *pd, struct rdma_conn_param *cp)
{
	memset(pd, 0, sizeof *pd);
	pd->cell = cell_num(cell);
	pd->rkey = htobe32(c->data->rkey);
	pd->addr = htobe64((uintptr_t)c->dbuf);
	memset(cp, 0, sizeof *cp);
	cp->private_data = pd;
	cp->private_data_len = sizeof *pd;
	cp->responder_resources = cp->initiator_depth = 1;
}

static int serve(struct conn *c, const char *cell)
{
	struct rdma_cm_event ev;
	struct rdma_conn_param cp;
	struct pdata pd;
	if (c->pend) {
		c->id = c->pend, c->peer = c->pend_peer, c->pend = NULL;
	} else {
		if (get_event(c, RDMA_CM_EVENT_CONNECT_REQUEST, 120000, &ev))
			return -1;
		c->id = ev.id;
	}
	if (c->peer.cell != cell_num(cell))
		return bad("the peer runs cell %d, we run %d", c->peer.cell, cell_num(cell));
	if (setup(c, !strcmp(cell, "srq")) || prepare(c, cell, 1))
		return -1;
	conn_param(c, cell, &pd, &cp);
	if (rdma_accept(c->id, &cp))
		return bad("rdma_accept: %s", strerror(errno));
	if (get_event(c, RDMA_CM_EVENT_ESTABLISHED, 10000, &ev))
		return -1;
	struct ibv_wc wc;
	if (wait_recv(c, &wc, 10000))
		return -1;
	if (wc.wr_id != HELLO || strcmp(slot(c, &wc), "hello"))
		return bad("first message %s in slot %d, want hello", slot(c, &wc), (int)wc.wr_id);
	return run_cell(c, cell);
}

static int dial(struct conn *c, struct sockaddr *dst, const char *cell)
{
	struct rdma_cm_event ev;
	struct rdma_conn_param cp;
	struct pdata pd;
	long long end = now_ms() + 120000;
	for (;;) {
		if (rdma_create_id(c->ec, &c->id, NULL, RDMA_PS_TCP))
			return bad("rdma_create_id: %s", strerror(errno));
		if (rdma_resolve_addr(c->id, NULL, dst, 2000) || get_event(c, RDMA_CM_EVENT_ADDR_RESOLVED, 3000, &ev) ||
		    rdma_resolve_route(c->id, 2000) || get_event(c, RDMA_CM_EVENT_ROUTE_RESOLVED, 3000, &ev))
			return -1;
		if (setup(c, !strcmp(cell, "srq")) || prepare(c, cell, 0))
			return -1;
		conn_param(c, cell, &pd, &cp);
		if (rdma_connect(c->id, &cp)) {
			/* Seen as ETIMEDOUT while the peer's endpoint was still
			 * starting (its TAP not up yet): try again too. */
			int e = errno;
			if (now_ms() > end)
				return bad("rdma_connect: %s", strerror(e));
		} else if (!get_event(c, RDMA_CM_EVENT_ESTABLISHED, 10000, &ev))
			break;
		/* Refused or unreachable: the peer is not listening yet. */
		if (now_ms() > end)
			return -1;
		teardown(c);
		sleep(1);
	}
	if (c->peer.cell != cell_num(cell))
		return bad("the peer runs cell %d, we run %d", c->peer.cell, cell_num(cell));
	/* Unsignaled: its completion would mix with the cell's on our CQ
	 * (the server answers hello at once). */
	if (post_send_flags(c, IBV_WR_SEND, 0, "hello", 0, 1))
		return -1;
	return run_cell(c, cell);
}

/* local reports what siw's user library refuses outright. */
static void local(void)
{
	int n;
	struct ibv_device **devs = ibv_get_device_list(&n);
	struct ibv_context *ctx = n > 0 ? ibv_open_device(devs[0]) : NULL;
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (!pd) {
		result("local", "FAIL", "no siw device");
		return;
	}
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	int mwerr = errno;
	result("fastreg_siw", "SKIP", "libibverbs has no fast-registration work request (IB_WR_REG_MR is for kernel consumers); "
				 "memory windows: ibv_alloc_mw %s", mw ? "succeeded" : strerror(mwerr));
	if (mw)
		ibv_dealloc_mw(mw);
	result("read_inv_siw", "SKIP", "libibverbs has no RDMA Read with Invalidate (IB_WR_RDMA_READ_WITH_INV is for kernel consumers)");
	/* Local Invalidate: libsiw maps IBV_WR_LOCAL_INV to no opcode. */
	struct ibv_cq *cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *qp = cq ? ibv_create_qp(pd, &qa) : NULL;
	struct ibv_send_wr wr = {.opcode = IBV_WR_LOCAL_INV, .invalidate_rkey = 0x1234, .send_flags = IBV_SEND_SIGNALED}, *badwr;
	int rv = qp ? ibv_post_send(qp, &wr, &badwr) : -1;
	result("local_inv", "SKIP", "siw's user library refuses IBV_WR_LOCAL_INV: ibv_post_send = %d (%s)", rv,
	       rv > 0 ? strerror(rv) : rv < 0 ? strerror(-rv) : "accepted");
	if (qp)
		ibv_destroy_qp(qp);
	if (cq)
		ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(devs);
}

int main(int argc, char **argv)
{
	struct conn c = {0};
	struct addrinfo *ai;
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 2 && !strcmp(argv[1], "local")) {
		local();
		return failed;
	}
	if (argc < 5 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
		fprintf(stderr, "usage: probe server|client ADDR PORT CELL... | probe local\n");
		return 2;
	}
	int server = !strcmp(argv[1], "server");
	if (getaddrinfo(argv[2], argv[3], NULL, &ai)) {
		fprintf(stderr, "probe: bad address %s:%s\n", argv[2], argv[3]);
		return 2;
	}
	c.ec = rdma_create_event_channel();
	if (server) {
		if (rdma_create_id(c.ec, &c.listen, NULL, RDMA_PS_TCP) || rdma_bind_addr(c.listen, ai->ai_addr) ||
		    rdma_listen(c.listen, 4)) {
			fprintf(stderr, "probe: listen: %s\n", strerror(errno));
			return 2;
		}
		printf("LISTENING %s:%s\n", argv[2], argv[3]);
	}
	for (int i = 4; i < argc; i++) {
		const char *cell = argv[i];
		why[0] = 0;
		int rv = server ? serve(&c, cell) : dial(&c, ai->ai_addr, cell);
		result(cell, rv == 0 ? "PASS" : rv > 0 ? "SKIP" : "FAIL", "%s", why);
		teardown(&c);
	}
	if (c.listen)
		rdma_destroy_id(c.listen);
	rdma_destroy_event_channel(c.ec);
	freeaddrinfo(ai);
	return failed;
}
