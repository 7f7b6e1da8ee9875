package iwarp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/rdmatap/rdmatap/internal/lattrace"
	"io"

	"gvisor.dev/gvisor/pkg/tcpip"

	"github.com/rdmatap/rdmatap/zerocopy"
)

// The transmit path of an RDMAP stream, one goroutine per QP. A message's
// way through it:
//
//  1. Work: the TX goroutine picks, under the QP lock, the next thing to
//     send: a queued Terminate first, then the RTR of a peer-to-peer
//     initiator, then inbound Read and Atomic Requests (their responses,
//     in order, at most four in a row while sends wait) and the send
//     queue in order.
//     A responder sends nothing until the initiator's first FPDU arrived;
//     an initiator facing a peer that may be siw holds its first FPDU
//     for FirstFPDUDelay after the MPA Reply (a timer, see QP.Start).
//  2. Resolution: the work request's SGL is resolved to slices of
//     registered memory (STag, PD, bounds), and an RDMA Read or atomic gets
//     its ORQ entry before its request can reach the wire.
//  3. Framing: the message is cut into FPDUs no larger than the
//     connection's current maximum segment payload, so every FPDU fits a
//     TCP segment. With MPA markers, each FPDU is sized where it starts so
//     that with the markers among it it fills one segment (markerTiles).
//  4. Copy: netstack's Endpoint.Write pulls the bytes through fpduWriter (a
//     tcpip.Payloader), which writes headers, copies payload from the
//     registered memory straight into the stack's buffers, and computes
//     the CRC32c in the same pass. One Write per message; Nagle is off.
//     The source regions are held during each of netstack's reads, never
//     while it waits for send-buffer space; one deregistered meanwhile
//     cuts the message off (see fpduWriter.Read).
//  5. Completion: a Send or Write completes once TCP has the bytes; a Read
//     completes when its last Read Response segment has been placed, an
//     atomic when its Atomic Response has arrived. One with Immediate
//     completes as a Send or Write once the peer has shown it takes
//     Immediate Data; until then with the response to a zero-length Read
//     sent right behind it (QP.probesImm). The send queue completes in
//     order: a WR done before a Read or atomic posted ahead of it waits
//     for that one's completion (QP.completeSQ, QP.retireORQ).

const irqBurst = 4 // Read Responses served in a row while sends wait

type txJob uint8

const (
	jobNone txJob = iota
	jobSQ
	jobRTR
	jobReadResp
	jobTerminate
	jobFIN
	jobExit
)

// transmitter is a QP's transmit side. Its fields belong to the holder of
// qp.txMu (the package's Locks section has who that is); init runs in
// Start. The QP's shared state (the send queue, the ORQ and IRQ, the
// MSNs) it reads and changes under qp.mu, taken inside txMu (pick,
// claimORQ, nextMSN), and it completes work requests and calls qp.fail
// with txMu held, qp.mu not.
type transmitter struct {
	qp *QP
	// +checklocks:qp.txMu
	crcOn bool
	// +checklocks:qp.txMu
	rtr RTR // RTR still to send (peer-to-peer initiator)
	// +checklocks:qp.txMu
	maxFPDU int
	// +checklocks:qp.txMu
	stats *Stats
	// +checklocks:qp.txMu
	burst int
	// +checklocks:qp.txMu
	finSent bool
	// +checklocks:qp.txMu
	readOK bool
	// +checklocks:qp.txMu
	mp int // cached Stream.MaxPayload
	// +checklocks:qp.txMu
	mpLeft int

	// +checklocks:qp.txMu
	inlineBuf []byte

	// +checklocks:qp.txMu
	fw fpduWriter
	// +checklocks:qp.txMu
	mk markerInserter // MPA markers: wraps fw (and computes the CRC)
	// +checklocks:qp.txMu
	mkOn bool
	// +checklocks:qp.txMu
	src zerocopy.SGList
	// +checklocks:qp.txMu
	regs []*Region // the regions src lies in
	// +checklocks:qp.txMu
	wqe sendWQE
	// +checklocks:qp.txMu
	irq irqEntry
	// +checklocks:qp.txMu
	rr [ReadRequestSize]byte
	// +checklocks:qp.txMu
	ar [AtomicRequestSize]byte
	// +checklocks:qp.txMu
	imm [ImmediateDataSize]byte
	// +checklocks:qp.txMu
	arsp [AtomicResponseSize]byte
	// atomicID is the Request Identifier claimORQ gave the atomic being
	// sent.
	// +checklocks:qp.txMu
	atomicID uint32
	// +checklocks:qp.txMu
	readSt Status // why claimORQ failed (not readOK)
	// +checklocks:qp.txMu
	probing bool // the WR being sent holds an ORQ entry for its probe (claimProbe)
	// +checklocks:qp.txMu
	buf [rxHdrMax + 8]byte
}

// +checklocks:t.qp.txMu
func (t *transmitter) init(p ConnParams) {
	t.crcOn = p.CRC
	t.mkOn = p.MarkersTx
	if t.mkOn {
		// The inserter computes each CRC over the FPDU with its markers.
		t.mk.reset(p.CRC)
		t.crcOn = false
	}
	t.stats = t.qp.cfg.Stats
	t.maxFPDU = t.qp.cfg.MaxFPDU
	t.mpLeft = 0
	t.burst = 0
	t.finSent = false
	t.rtr = 0
	if p.Initiator && p.PeerToPeer {
		t.rtr = p.RTR
	}
	if t.src == nil {
		t.src = make(zerocopy.SGList, 0, t.qp.cfg.MaxSendSGE)
		t.regs = make([]*Region, 0, t.qp.cfg.MaxSendSGE)
		t.fw.held.regs = make([]*Region, 0, t.qp.cfg.MaxSendSGE)
		t.wqe.sgl = make([]SGE, 0, t.qp.cfg.MaxSendSGE)
		t.inlineBuf = make([]byte, 0, t.qp.cfg.MaxInline)
	}
}

func (t *transmitter) run() {
	qp := t.qp
	defer close(qp.txDone)
	for {
		qp.txMu.Lock()
		exit := t.drain(false)
		qp.txMu.Unlock()
		if exit {
			return
		}
		select {
		case <-qp.kick:
		case <-qp.ctx.Done():
			// A Terminate queued as the QP failed still goes out.
			qp.txMu.Lock()
			qp.mu.Lock()
			job := t.pick(false)
			qp.mu.Unlock()
			if job == jobTerminate {
				t.sendTerminate()
			}
			qp.txMu.Unlock()
			return
		}
	}
}

// drain runs jobs until none is left; qp.txMu is held. inline restricts it
// to what a poster may transmit in its own goroutine. It reports whether
// the TX goroutine must end.
// +checklocks:t.qp.txMu
func (t *transmitter) drain(inline bool) bool {
	qp := t.qp
	for {
		qp.mu.Lock()
		job := t.pick(inline)
		qp.mu.Unlock()
		switch job {
		case jobNone:
			return false
		case jobExit:
			return true
		case jobTerminate:
			t.sendTerminate()
			return true
		case jobFIN:
			t.finSent = true
			if err := qp.stream.CloseWrite(); err != nil {
				qp.fail(err, true)
				return true
			}
		case jobReadResp:
			if !t.sendReadResp() {
				return true
			}
		case jobRTR:
			if !t.sendRTR() {
				return true
			}
		case jobSQ:
			if !t.sendWQE() {
				return true
			}
		}
	}
}

// sendReadResp sends the Read or atomic Response pick took (t.irq); false
// means the TX path must end.
// +checklocks:t.qp.txMu
func (t *transmitter) sendReadResp() bool {
	e := &t.irq
	if e.atomic {
		// The atomic was executed when its request arrived.
		AtomicResponse(t.arsp[:]).Encode(e.reqID, e.original)
		f := DDPFields{Opcode: OpAtomicResp, QN: QNAtomicResp, MSN: t.nextMSN(QNAtomicResp)}
		return t.send(&f, nil, nil, 0, t.arsp[:])
	}
	f := DDPFields{Opcode: OpReadResponse, STag: e.sinkSTag, TO: e.sinkTO}
	n := len(e.src)
	t.src = append(t.src[:0], e.src)
	t.regs = append(t.regs[:0], e.srcReg)
	if e.srcPaged {
		// Checked when the request arrived.
		t.src, _ = e.srcReg.Pieces(t.src[:0], e.srcTO, e.srcLen)
		n = int(e.srcLen)
	}
	if n == 0 {
		t.src, t.regs = t.src[:0], t.regs[:0]
	}
	ok := t.send(&f, t.src, t.regs, n, nil)
	if !ok && t.fw.cut {
		// The source was deregistered under the Read
		// Response: the peer's Read fails (RFC 5040
		// would have refused its STag from the start).
		t.cutOff(TermCode{LayerRDMAP, ETypeRemoteProtection, CodeInvalidSTag})
	}
	e.src, e.srcReg, e.srcPaged = nil, nil, false
	return ok
}

// respondInlineMax is the longest Read Response respondInline sends.
const respondInlineMax = 4096

// respondInline sends the Read and atomic Responses just queued in the
// caller's goroutine — the link's, whose connection tap fed the short
// requests to the receiver — when the TX goroutine is idle and nothing
// else is queued: a short Read is then answered without a goroutine
// hand-off, as postDirect posts a short Send. Long responses, and
// responses behind queued sends, stay with the TX goroutine.
func (t *transmitter) respondInline() {
	qp := t.qp
	if !qp.txMu.TryLock() {
		qp.wake()
		return
	}
	t.respondShort() // +checklocksforce: TryLock took txMu
	qp.txMu.Unlock()
	qp.wakeIfMore()
}

// respondShort sends the short responses at the head of the inbound
// request queue while nothing else is to go first (respondOK).
// +checklocks:t.qp.txMu
func (t *transmitter) respondShort() {
	qp := t.qp
	for {
		qp.mu.Lock()
		if !t.respondOK() {
			qp.mu.Unlock()
			return
		}
		job := t.pick(false) // a Read Response: respondOK left nothing else
		qp.mu.Unlock()
		if job != jobReadResp || !t.sendReadResp() {
			return
		}
	}
}

// wakeIfMore wakes the TX goroutine when work is left for it: after a
// poster or the link's goroutine has transmitted what it may.
func (qp *QP) wakeIfMore() {
	qp.mu.Lock()
	more := qp.moreTXLocked()
	qp.mu.Unlock()
	if more {
		qp.wake()
	}
}

// moreTXLocked reports whether the TX goroutine has work: queued WRs or
// responses, a Terminate, or the close. qp.mu is held.
// +checklocks:qp.mu
func (qp *QP) moreTXLocked() bool {
	return qp.sqN > 0 || qp.irqN > 0 || qp.term != nil && !qp.termSent || qp.closing
}

// respondOK reports whether pick would take a short response off the head
// of the inbound request queue and nothing else: the QP is transmitting,
// the send queue is empty, and the response is short and in one piece.
// +checklocks:t.qp.mu
// +checklocks:t.qp.txMu
func (t *transmitter) respondOK() bool {
	qp := t.qp
	if qp.term != nil || qp.state >= StateTerminate || t.finSent || qp.txHeld() || qp.rtrDue ||
		qp.irqN == 0 || qp.sqN > 0 || qp.closing {
		return false
	}
	e := &qp.irq[qp.irqHead]
	return e.atomic || !e.srcPaged && e.srcLen <= respondInlineMax
}

// inlineTXMax is the largest send WR a poster transmits itself.
const inlineTXMax = 64 << 10

// postInline transmits freshly posted small WRs in the poster's goroutine
// when the TX goroutine is idle, saving a goroutine hand-off per message
// (Linux siw likewise transmits in the caller's syscall). Anything it leaves
// goes to the TX goroutine.
func (qp *QP) postInline() {
	if !qp.txMu.TryLock() {
		qp.wake()
		return
	}
	qp.tx.drain(true) // +checklocksforce: TryLock took txMu
	qp.txMu.Unlock()
	qp.wakeIfMore()
}

// directOK reports whether wr may skip the send queue: the QP is up and
// transmitting, nothing is queued before it (send queue, Read Responses,
// a Terminate), and it is a small Send or Write. qp.mu is held.
// +checklocks:qp.mu
func (qp *QP) directOK(wr *SendWR) bool {
	if qp.state != StateRTS || qp.txHeld() || qp.rtrDue || qp.sqN > 0 || qp.irqN > 0 || qp.term != nil ||
		qp.needsORQ(wr.Op) || wr.Flags&FlagFence != 0 && qp.orqN > 0 {
		return false
	}
	n := len(wr.Data)
	for _, s := range wr.SGL {
		n += int(s.Length)
	}
	return n <= inlineTXMax
}

// postDirect transmits wr in the poster's goroutine without queueing it,
// as postInline would right after queueing it, minus the copies into and
// out of the send queue slot (netstack copies the bytes before it returns,
// which is what inline requires). qp.mu and qp.txMu are held on entry;
// both are released.
// +checklocksrelease:qp.mu
// +checklocksrelease:qp.txMu
func (qp *QP) postDirect(wr *SendWR) (int, error) {
	t := &qp.tx
	if err := qp.checkSendWR(wr); err != nil {
		qp.txMu.Unlock()
		qp.mu.Unlock()
		return 0, err
	}
	w := &t.wqe
	w.set(wr)
	w.sgl = append(w.sgl[:0], wr.SGL...)
	w.signaled = qp.cfg.SignalAll || wr.Flags&FlagSignaled != 0
	w.inlined = false
	if wr.Data != nil {
		// Copied once: the bytes may be in memory another process
		// changes (a service client's ring).
		w.inline = append(t.inlineBuf[:0], wr.Data...)
		w.inlined = true
	} else if wr.Flags&FlagInline != 0 {
		// An inline WR's SGEs are checked at post time (an error
		// here, not a completion), as gatherInline does.
		for _, s := range w.sgl {
			if _, _, st := qp.localSlice(s, 0); st != StatusSuccess {
				qp.txMu.Unlock()
				qp.mu.Unlock()
				return 0, fmt.Errorf("%w: inline SGE lkey %#x: %v", ErrInvalidWR, s.LKey, st)
			}
		}
	}
	qp.mu.Unlock()
	t.sendWQE()
	qp.txMu.Unlock()
	return 1, nil
}

// pick chooses work; qp.mu is held.
// +checklocks:t.qp.mu
// +checklocks:t.qp.txMu
func (t *transmitter) pick(inline bool) txJob {
	qp := t.qp
	if qp.term != nil && !qp.termSent {
		if inline {
			return jobNone
		}
		return jobTerminate
	}
	if qp.state >= StateTerminate {
		if inline {
			return jobNone
		}
		return jobExit
	}
	// A memory registration WR sends nothing: at the head of the send
	// queue it need not wait for the first FPDU's turn (memwr.go).
	localHead := qp.sqN > 0 && qp.sq[qp.sqHead].wr.Op.local()
	if t.finSent {
		return jobNone
	}
	if qp.txHeld() && !localHead {
		if qp.closing && qp.txGate && !qp.held && !inline {
			// A responder disconnecting before the initiator has
			// spoken: no FPDU may go, but the FIN may (it is no
			// FPDU). What it queued is flushed when the QP ends.
			return jobFIN
		}
		return jobNone
	}
	if qp.rtrDue && !localHead {
		qp.rtrDue = false
		return jobRTR
	}
	if inline {
		// Posters send small WRs only; Read Responses, the FIN and large
		// messages stay with the TX goroutine.
		if qp.irqN > 0 || qp.sqN == 0 || qp.closing {
			return jobNone
		}
		e := &qp.sq[qp.sqHead]
		if qp.needsORQ(e.wr.Op) && qp.orqN == len(qp.orq) || wqeBytes(e) > inlineTXMax {
			return jobNone
		}
	}
	if qp.irqN > 0 && (qp.sqN == 0 || t.burst < irqBurst) {
		t.irq = qp.irq[qp.irqHead]
		qp.irq[qp.irqHead].src = nil
		qp.irqHead = (qp.irqHead + 1) % len(qp.irq)
		qp.irqN--
		t.burst++
		return jobReadResp
	}
	t.burst = 0
	if qp.sqN > 0 {
		e := &qp.sq[qp.sqHead]
		if (qp.needsORQ(e.wr.Op) && qp.orqN == len(qp.orq)) || (e.wr.Flags&FlagFence != 0 && qp.orqN > 0) {
			// Wait for a Read or Atomic Response to free an ORQ slot
			// (ORD bounds Reads and atomics together, RFC 7306).
			return jobNone
		}
		t.wqe.wr, t.wqe.mr, t.wqe.mw = e.wr, e.mr, e.mw
		t.wqe.signaled = e.signaled
		t.wqe.inlined = e.inlined
		t.wqe.sgl = append(t.wqe.sgl[:0], e.sgl...)
		// The slot may be reposted as soon as it is released: keep a copy.
		t.wqe.inline = append(t.inlineBuf[:0], e.inline...)
		t.probing = false
		if e.wr.Op.usesORQ() {
			t.readOK = t.claimORQ()
		} else if qp.probesImm(e.wr.Op) {
			t.claimProbe(e)
		}
		qp.sqHead = (qp.sqHead + 1) % len(qp.sq)
		qp.sqN--
		return jobSQ
	}
	if qp.closing {
		return jobFIN
	}
	return jobNone
}

// claimORQ resolves the sink of a Read (or the 8 bytes that receive an
// atomic's original value) and reserves its ORQ entry; qp.mu held.
// +checklocks:t.qp.mu
// +checklocks:t.qp.txMu
func (t *transmitter) claimORQ() bool {
	qp := t.qp
	w := &t.wqe
	var sink []byte
	var reg *Region
	var stag uint32
	var to uint64
	var paged bool
	size := 0
	if len(w.sgl) == 1 {
		s := w.sgl[0]
		r, st := qp.localRegion(s, AccessLocalWrite)
		if st == StatusSuccess && !(r.Paged() && !w.wr.Op.IsAtomic()) {
			// A contiguous sink (an atomic's 8 bytes must lie in
			// one page).
			var ok bool
			if sink, ok = r.Slice(s.Addr, uint64(s.Length)); !ok {
				st = StatusLocalProtection
			}
		} else if st == StatusSuccess {
			paged = true // placed through sinkReg.Pieces
		}
		if st != StatusSuccess {
			t.readSt = st
			return false
		}
		reg, stag, to, size = r, s.LKey, s.Addr, int(s.Length)
	}
	op := w.wr.Op
	var inv *Region
	if op == WRReadInv {
		var err error
		if inv, err = qp.invalidationTarget(w.wr.InvalidateRKey); err != nil {
			t.readSt = StatusMWBind
			return false
		}
		op = WRRead
	}
	var id uint32
	if w.wr.Op.IsAtomic() {
		qp.atomicID++
		id = qp.atomicID
		t.atomicID = id
	}
	o := &qp.orq[(qp.orqHead+qp.orqN)%len(qp.orq)]
	*o = orqEntry{id: w.wr.ID, signaled: w.signaled, op: op, reqID: id,
		sinkSTag: stag, sinkTO: to, size: uint32(size), sink: sink, sinkReg: reg, sinkPaged: paged, inv: inv}
	qp.orqN++
	qp.orqClaimed.Add(1)
	return true
}

// claimProbe reserves the ORQ entry of the zero-length Read that follows
// the Immediate Data message of e (see QP.probesImm); qp.mu held.
// +checklocks:t.qp.mu
// +checklocks:t.qp.txMu
func (t *transmitter) claimProbe(e *sendWQE) {
	qp := t.qp
	n := len(e.inline)
	if !e.inlined {
		n = 0
		for _, s := range e.sgl {
			n += int(s.Length)
		}
	}
	qp.orq[(qp.orqHead+qp.orqN)%len(qp.orq)] = orqEntry{probe: true, id: e.wr.ID, signaled: e.signaled, op: e.wr.Op, probeLen: uint32(n)}
	qp.orqN++
	qp.orqClaimed.Add(1)
	t.probing = true
}

// unprobe gives back the probe's ORQ entry of a WR that failed before its
// Read went out (the entry is the last: no other is claimed meanwhile,
// and no response can free it).
// +checklocks:t.qp.txMu
func (t *transmitter) unprobe() {
	if !t.probing {
		return
	}
	t.probing = false
	qp := t.qp
	qp.mu.Lock()
	qp.orqN--
	qp.orqClaimed.Add(^uint64(0))
	qp.orq[(qp.orqHead+qp.orqN)%len(qp.orq)] = orqEntry{}
	qp.mu.Unlock()
}

// sendProbe sends the zero-length Read behind a WR's Immediate Data
// message; the WR completes with its response.
// +checklocks:t.qp.txMu
func (t *transmitter) sendProbe() bool {
	t.probing = false
	ReadRequest(t.rr[:]).Encode(&ReadRequestFields{SourceSTag: 1})
	f := DDPFields{Opcode: OpReadRequest, QN: QNReadReq, MSN: t.nextMSN(QNReadReq)}
	return t.send(&f, nil, nil, 0, t.rr[:])
}

// sendWQE transmits the claimed send queue entry; false ends TX.
// +checklocks:t.qp.txMu
func (t *transmitter) sendWQE() bool {
	qp := t.qp
	w := &t.wqe
	if w.wr.Op.local() {
		return t.execLocal(w)
	}
	switch w.wr.Op {
	case WRRead, WRReadInv:
		if !t.readOK {
			return t.localError(w, t.readSt)
		}
		var sink SGE
		if len(w.sgl) == 1 {
			sink = w.sgl[0]
		}
		ReadRequest(t.rr[:]).Encode(&ReadRequestFields{
			SinkSTag: sink.LKey, SinkTO: sink.Addr, Size: sink.Length,
			SourceSTag: w.wr.RKey, SourceTO: w.wr.RemoteAddr,
		})
		f := DDPFields{Opcode: OpReadRequest, QN: QNReadReq, MSN: t.nextMSN(QNReadReq)}
		return t.send(&f, nil, nil, 0, t.rr[:])
	case WRAtomicCmpSwap, WRAtomicFetchAdd:
		if !t.readOK {
			return t.localError(w, t.readSt)
		}
		return t.sendAtomic(w)
	}
	var src zerocopy.SGList
	var regs []*Region
	var n int
	if w.inlined {
		src = append(t.src[:0], w.inline)
		n = len(w.inline)
	} else {
		var st Status
		src, regs, n, st = qp.resolveSGL(t.src, t.regs, w.sgl, 0)
		t.src, t.regs = src, regs
		if st != StatusSuccess {
			t.unprobe()
			return t.localError(w, st)
		}
	}
	var f DDPFields
	op := wrCompOp(w.wr.Op)
	switch w.wr.Op {
	case WRWrite, WRWriteImm:
		f = DDPFields{Opcode: OpWrite, STag: w.wr.RKey, TO: w.wr.RemoteAddr}
	case WRSend, WRSendInvalidate, WRSendImm:
		if w.wr.Op == WRSendImm && !t.sendImmediate(w, ImmFlagForSend) {
			t.unprobe()
			qp.completeSQ(Completion{ID: w.wr.ID, Status: StatusWRFlush, Op: op})
			return false
		}
		f = DDPFields{Opcode: OpSend, QN: QNSend, MSN: t.nextMSN(QNSend)}
		if w.wr.Op == WRSendInvalidate {
			f.Opcode = OpSendInvalidate
			f.RsvdULP = w.wr.InvalidateRKey
		}
		if w.wr.Flags&FlagSolicited != 0 {
			f.Opcode += OpSendSE - OpSend
		}
	}
	if !t.send(&f, src, regs, n, nil) {
		t.unprobe()
		if t.fw.cut {
			// The source was deregistered while it was being sent.
			qp.completeSQ(Completion{ID: w.wr.ID, Status: StatusLocalProtection, Op: op})
			t.cutOff(TermCode{LayerRDMAP, ETypeRDMAPCatastrophic, CodeUnspecified})
			return false
		}
		qp.completeSQ(Completion{ID: w.wr.ID, Status: StatusWRFlush, Op: op})
		return false
	}
	if w.wr.Op == WRWriteImm && !t.sendImmediate(w, 0) {
		t.unprobe()
		qp.completeSQ(Completion{ID: w.wr.ID, Status: StatusWRFlush, Op: op})
		return false
	}
	if t.probing {
		// The WR completes with the probe's response (or the error
		// the peer's Terminate names; a failed send flushes it).
		return t.sendProbe()
	}
	if w.signaled {
		qp.completeSQ(Completion{ID: w.wr.ID, Op: op, ByteLen: uint32(n)})
	}
	return true
}

// sendAtomic sends an atomic's request; its ORQ entry is claimed. The
// WR completes when the Atomic Response arrives. libibverbs' CmpSwap
// compares and swaps all 64 bits (both masks all ones); its FetchAdd is
// one 64-bit add (no field boundaries: Add Mask 0).
// +checklocks:t.qp.txMu
func (t *transmitter) sendAtomic(w *sendWQE) bool {
	f := AtomicRequestFields{RequestID: t.atomicID, RemoteSTag: w.wr.RKey, RemoteTO: w.wr.RemoteAddr}
	if w.wr.Op == WRAtomicFetchAdd {
		f.Op, f.AddSwapData = AtomicFetchAdd, w.wr.CompareAdd
	} else {
		f.Op, f.AddSwapData, f.AddSwapMask = AtomicCmpSwap, w.wr.Swap, ^uint64(0)
		f.CompareData, f.CompareMask = w.wr.CompareAdd, ^uint64(0)
	}
	AtomicRequest(t.ar[:]).Encode(&f)
	d := DDPFields{Opcode: OpAtomicRequest, QN: QNReadReq, MSN: t.nextMSN(QNReadReq)}
	return t.send(&d, nil, nil, 0, t.ar[:])
}

// sendImmediate sends the Immediate Data message of a Write or Send with
// Immediate; flags are rdmatap's upper 32 bits (see ImmediateData). The
// Immediate Data of a Write carries the WR's solicited event; that of a
// Send leaves it to the Send.
// +checklocks:t.qp.txMu
func (t *transmitter) sendImmediate(w *sendWQE, flags uint64) bool {
	ImmediateData(t.imm[:]).Encode(flags | uint64(w.wr.Imm))
	f := DDPFields{Opcode: OpImmediate, QN: QNSend, MSN: t.nextMSN(QNSend)}
	if w.wr.Flags&FlagSolicited != 0 && w.wr.Op == WRWriteImm {
		f.Opcode = OpImmediateSE
	}
	return t.send(&f, nil, nil, 0, t.imm[:])
}

// localError completes a WR whose local buffers are invalid and takes the
// QP down, as a local protection error does on an RNIC.
// +checklocks:t.qp.txMu
func (t *transmitter) localError(w *sendWQE, st Status) bool {
	qp := t.qp
	qp.completeSQ(Completion{ID: w.wr.ID, Status: st, Op: wrCompOp(w.wr.Op)})
	qp.terminate(TermCode{LayerRDMAP, ETypeRDMAPCatastrophic, CodeUnspecified}, nil, 0)
	t.sendTerminate()
	return false
}

// +checklocks:t.qp.txMu
func (t *transmitter) nextMSN(qn int) uint32 {
	qp := t.qp
	qp.mu.Lock()
	m := qp.txSendMSN[qn]
	qp.txSendMSN[qn]++
	qp.mu.Unlock()
	return m
}

// sendRTR sends the peer-to-peer Ready-To-Receive message (RFC 6581 §4).
// +checklocks:t.qp.txMu
func (t *transmitter) sendRTR() bool {
	qp := t.qp
	switch {
	case t.rtr&RTRWrite != 0:
		// Zero-length Write to STag 1, TO 0, like siw: hardware may treat
		// STag 0 specially even for zero-length Writes.
		f := DDPFields{Opcode: OpWrite, STag: 1}
		return t.send(&f, nil, nil, 0, nil)
	case t.rtr&RTRRead != 0:
		// The RTR goes before any Read of the send queue claims an
		// ORQ entry, so it takes the first.
		qp.mu.Lock()
		qp.orq[(qp.orqHead+qp.orqN)%len(qp.orq)] = orqEntry{rtr: true, op: WRRead}
		qp.orqN++
		qp.orqClaimed.Add(1)
		qp.mu.Unlock()
		ReadRequest(t.rr[:]).Encode(&ReadRequestFields{SourceSTag: 1})
		f := DDPFields{Opcode: OpReadRequest, QN: QNReadReq, MSN: t.nextMSN(QNReadReq)}
		return t.send(&f, nil, nil, 0, t.rr[:])
	default:
		f := DDPFields{Opcode: OpSend, QN: QNSend, MSN: t.nextMSN(QNSend)}
		return t.send(&f, nil, nil, 0, nil)
	}
}

// send writes one message from src, which lies in the regions regs; false
// means the stream failed (the QP is then taken to ERROR), or, with
// t.fw.cut, that a source region was deregistered during the message (the
// caller then calls cutOff).
// +checklocks:t.qp.txMu
func (t *transmitter) send(f *DDPFields, src zerocopy.SGList, regs []*Region, n int, extra []byte) bool {
	qp := t.qp
	// The segment payload changes rarely (PMTU, options) and reading it
	// takes the endpoint lock: refresh it every 64 messages.
	if t.mpLeft <= 0 {
		t.mp, t.mpLeft = qp.stream.MaxPayload(), 64
	}
	t.mpLeft--
	max := t.maxFPDU
	if mp := t.mp; max <= 0 || (mp > 0 && mp < max) {
		max = mp
	}
	if t.mkOn {
		// Each FPDU with its markers fills one segment of max octets.
		t.fw.reset(f, src, n, extra, MarkersMaxFPDU(max), t.crcOn, t.stats)
		t.fw.tileMarked(t.mk.tile(max))
	} else {
		t.fw.reset(f, src, n, extra, max, t.crcOn, t.stats)
	}
	t.fw.regs = regs
	w0, d0 := t.mk.wire, t.mk.data
	lattrace.Mark(lattrace.TCPWrite)
	sent, err := qp.stream.WritePayload(qp.ctx, t.payload())
	lattrace.Mark(lattrace.TCPWritten)
	t.fw.regs = nil
	if t.fw.cut {
		// netstack dropped what it read in the call that hit the cut and
		// kept the sent bytes before it, which may end inside an FPDU.
		if t.mkOn {
			sent = int64(t.mk.resync(w0+uint64(sent)) - d0)
		}
		t.fw.torn = !t.fw.fpduEnd(sent)
		return false
	}
	if err != nil {
		qp.fail(err, true)
		return false
	}
	if t.stats != nil {
		t.stats.TxFPDUs.Add(t.fw.fpdus)
		t.stats.TxOps[f.Opcode].Add(1)
		t.stats.TxBytes.Add(uint64(n))
	}
	return true
}

// payload is what netstack reads a message from: the FPDU writer, or the
// marker inserter around it.
// +checklocks:t.qp.txMu
func (t *transmitter) payload() tcpip.Payloader {
	if t.mkOn {
		t.mk.inner = &t.fw
		return &t.mk
	}
	return &t.fw
}

// ErrCutOff reports a message cut off because memory it was sent from was
// deregistered while it was being sent.
var ErrCutOff = errors.New("iwarp: message cut off: its memory was deregistered during the transfer")

// cutOff ends the stream after a message was cut off. Cut between FPDUs,
// the stream is still framed and a Terminate with code goes out; cut
// inside one (the FPDU's header is out, and the rest of it may not be
// read), only a reset ends the stream without the peer taking the FPDU
// as whole.
// +checklocks:t.qp.txMu
func (t *transmitter) cutOff(code TermCode) {
	qp := t.qp
	if t.fw.torn {
		qp.fail(ErrCutOff, true)
		return
	}
	qp.terminate(code, nil, 0)
	t.sendTerminate()
}

// sendTerminate writes the queued Terminate and takes the QP to ERROR.
// The Terminate goes out once: a later call (the TX goroutine's last look
// when the QP's context ends, after a poster sent it) finds it sent.
// +checklocks:t.qp.txMu
func (t *transmitter) sendTerminate() {
	qp := t.qp
	qp.mu.Lock()
	tf := qp.term
	sent := qp.termSent
	qp.termSent = true
	qp.mu.Unlock()
	if tf == nil || sent {
		return
	}
	var body [TerminateMaxSize]byte
	n := Terminate(body[:]).Encode(tf)
	f := DDPFields{Opcode: OpTerminate, Last: true, QN: QNTerminate, MSN: 1}
	t.fw.reset(&f, nil, 0, body[:n], 1<<16, t.crcOn, t.stats)
	if t.mkOn {
		t.mk.tile(0) // one FPDU, the last
	}
	ok := true
	lattrace.Mark(lattrace.TCPWrite)
	if _, err := qp.stream.WritePayload(qp.ctx, t.payload()); err != nil {
		ok = false
	}
	if ok && t.stats != nil {
		t.stats.TermSent.Add(1)
		t.stats.TxFPDUs.Add(1)
	}
	qp.event(Event{Type: EventTerminateSent, Term: tf.Code, Err: qp.termErr})
	qp.fail(qp.termErr, !ok)
}

// fpduWriter frames one message as FPDUs while netstack copies it: it is
// the tcpip.Payloader of the message's Write. Headers are written from a
// small buffer, payload is copied from registered memory with its CRC in
// the same pass, then pad and CRC trailer follow.
type fpduWriter struct {
	f      DDPFields
	baseTO uint64
	extra  []byte
	src    zerocopy.SGList
	regs   []*Region // the regions src lies in, held during each Read
	held   holds
	cut    bool // a region was deregistered: the message ended early
	torn   bool // ... inside an FPDU (set by transmitter.send)
	total  int
	maxPay int
	tiles  markerTiles // with markers: FPDU k fills tile k (tileMarked); size 0: every FPDU but the last has maxPay
	crcOn  bool
	stats  *Stats

	off    int // message payload bytes framed so far
	size   int // bytes of the whole message's FPDUs
	remain int // bytes left to produce
	stage  int
	buf    [MPALengthSize + DDPUntaggedHeaderSize + TerminateMaxSize]byte
	hLen   int
	hPos   int
	segLen int
	segPos int
	tr     [8]byte
	trLen  int
	trPos  int
	crc    uint32
	fpdus  uint64
	pf     int // message payload bytes prefetched so far
}

// prefetchAhead is how far ahead of the copy the transmitter prefetches
// the message's source. At 1420-byte FPDUs the copies out of a cold MR ran
// at half the speed of TCP's 64 KB copies of the same bytes (the hardware
// prefetcher does not carry over from one short copy to the next); with
// 8 KiB prefetched ahead, 10 GB of 1 MiB Writes spent 0.20–0.25 s in the
// copies and 0.12 s in the prefetch instead of 0.77–0.82 s.
const prefetchAhead = 8 << 10

// prefetch keeps the source prefetched up to prefetchAhead bytes past
// the copy's position.
func (w *fpduWriter) prefetch() {
	start := max(w.pf, w.off)
	if end := min(w.total, w.off+prefetchAhead); start < end {
		w.src.Prefetch(start, end-start)
		w.pf = end
	}
}

const (
	fwNext = iota
	fwHeader
	fwPayload
	fwTrailer
	fwDone
)

func (w *fpduWriter) reset(f *DDPFields, src zerocopy.SGList, n int, extra []byte, maxFPDU int, crcOn bool, stats *Stats) {
	w.f = *f
	w.baseTO = f.TO
	w.extra = extra
	w.src = src
	w.total = n
	w.crcOn = crcOn
	w.stats = stats
	w.off, w.stage, w.fpdus, w.pf = 0, fwNext, 0, 0
	w.regs, w.cut, w.torn = nil, false, false
	w.tiles = markerTiles{}
	hs := w.headerSize()
	// The largest FPDU that fits a segment, a multiple of 4 so that only
	// the last FPDU of a message needs a pad (as siw does).
	fp := min(maxFPDU, MPALengthSize+MaxULPDU) &^ 3
	w.maxPay = max((fp-MPALengthSize-hs-MPACRCSize)&^3, 4)
	if n == 0 {
		w.remain = FPDULen(hs + len(extra))
	} else {
		k, r := n/w.maxPay, n%w.maxPay
		w.remain = k * FPDULen(hs+w.maxPay)
		if r > 0 {
			w.remain += FPDULen(hs + r)
		}
	}
	w.size = w.remain
}

// headerSize returns the size of the message's DDP and RDMAP headers.
func (w *fpduWriter) headerSize() int {
	if w.f.Opcode.Tagged() {
		return DDPTaggedHeaderSize
	}
	return DDPUntaggedHeaderSize
}

// tileMarked sizes the FPDUs of the message reset framed by the tiles of
// a marked stream rather than by one maximum: FPDU k but the last carries
// the payload that makes it, with the markers the inserter puts among it,
// fill tile k (see markerTiles). A message without payload is one FPDU
// anyway.
func (w *fpduWriter) tileMarked(t markerTiles) {
	if t.size == 0 || w.total == 0 {
		return
	}
	w.tiles = t
	hs := w.headerSize()
	k := w.tiledFPDUs()
	w.remain = t.start(k-1) + FPDULen(hs+w.total-w.tiledPayload(k-1))
	w.size = w.remain
}

// tiledPayload returns the payload that the first k FPDUs of a tiled
// message carry when all are full.
func (w *fpduWriter) tiledPayload(k int) int {
	return w.tiles.start(k) - k*(MPALengthSize+w.headerSize()+MPACRCSize)
}

// tiledFPDUs returns how many FPDUs a tiled message takes: the fewest
// whose full payloads hold it. A tile's FPDU-stream octets vary by one
// marker from tile to tile, so the estimate from the mean is off by a few
// FPDUs at most.
func (w *fpduWriter) tiledFPDUs() int {
	per := int(w.tiles.size)*markerRun/MPAMarkerInterval - (MPALengthSize + w.headerSize() + MPACRCSize)
	k := max(1, (w.total+per-1)/per)
	for k > 1 && w.tiledPayload(k-1) >= w.total {
		k--
	}
	for w.tiledPayload(k) < w.total {
		k++
	}
	return k
}

// RecordRest implements netstack.RecordPayloader: the bytes left of the
// FPDU being produced. Every FPDU of a message but the last has the same
// length. (With markers, the markerInserter around the writer is the
// RecordPayloader.)
func (w *fpduWriter) RecordRest() int {
	if w.remain == 0 {
		return 0
	}
	full := w.fullLen()
	done := w.size - w.remain
	if k := w.total / w.maxPay; done < k*full {
		return (full - done%full) % full
	}
	return w.remain
}

// RecordFit implements netstack.RecordPayloader: the most bytes, at most
// max, that can be produced next and end at an FPDU boundary; 0 if none
// lies within max bytes.
func (w *fpduWriter) RecordFit(max int) int {
	if w.remain <= max {
		return w.remain
	}
	if w.tiles.size != 0 {
		return 0 // tiled: the markerInserter around w fits tiles
	}
	full := w.fullLen()
	done := w.size - w.remain
	// FPDUs 0..k-1 are full and the boundaries among them lie at
	// multiples of full; the next boundary after them is the message's
	// end, which is more than max away.
	k := w.total / w.maxPay
	if b := min((done+max)/full, k) * full; b > done {
		return b - done
	}
	return 0
}

// RecordPlan implements netstack/tcp.RecordPlanner: the lengths of the
// FPDUs (the first one's rest, when one is under way) that end within max
// bytes, appended to ls, so that TCP learns their boundaries before it
// reads them all in one Read. (Tiled messages: the markerInserter around
// w plans nothing, and TCP reads record by record.)
func (w *fpduWriter) RecordPlan(max int, ls []int) []int {
	if w.tiles.size != 0 {
		return ls
	}
	full := w.fullLen()
	fulls := (w.total / w.maxPay) * full // where the full FPDUs end
	pos := w.size - w.remain
	end := pos + max
	for pos < w.size {
		next := w.size
		if pos < fulls {
			next = (pos/full + 1) * full
		}
		if next > end {
			break
		}
		ls = append(ls, next-pos)
		pos = next
	}
	return ls
}

// Len implements tcpip.Payloader: the bytes still to produce.
func (w *fpduWriter) Len() int { return w.remain }

// Read implements io.Reader for netstack's Write. The source regions are
// held for the whole call (one acquire per region per chunk of netstack's
// buffer, not per FPDU) and released before it returns: netstack may wait
// for send-buffer space between two calls, and a deregistration must not
// wait for that. A region found deregistered cuts the message off: Read
// fails with ErrCutOff and cut set, and netstack drops what it read in
// that endpoint Write. (Ending early with io.EOF is no option: netstack
// keeps reading until it has the Len it asked for, and spins.)
func (w *fpduWriter) Read(p []byte) (int, error) {
	if w.cut {
		return 0, ErrCutOff
	}
	if len(w.regs) > 0 && w.stage != fwDone {
		if !w.held.holdAll(w.regs) {
			w.held.drop()
			w.cut = true
			w.stage, w.remain = fwDone, 0
			return 0, ErrCutOff
		}
		defer w.held.drop()
	}
	n := 0
	for len(p) > 0 && w.stage != fwDone {
		switch w.stage {
		case fwNext:
			if k := w.wholeRun(p); k > 0 {
				p, n = p[k:], n+k
				continue
			}
			w.startFPDU()
			if k := w.whole(p); k > 0 {
				p, n = p[k:], n+k
			}
		case fwHeader:
			c := copy(p, w.buf[w.hPos:w.hLen])
			w.hPos += c
			p, n = p[c:], n+c
			if w.hPos == w.hLen {
				w.stage = fwPayload
				if w.segLen == 0 {
					w.endPayload()
				}
			}
		case fwPayload:
			c := min(len(p), w.segLen-w.segPos)
			if w.crcOn {
				_, w.crc = w.src.CopyToCRC(p[:c], w.off+w.segPos, w.crc)
			} else {
				w.src.CopyTo(p[:c], w.off+w.segPos)
			}
			w.segPos += c
			p, n = p[c:], n+c
			if w.segPos == w.segLen {
				w.endPayload()
			}
		case fwTrailer:
			c := copy(p, w.tr[w.trPos:w.trLen])
			w.trPos += c
			p, n = p[c:], n+c
			if w.trPos == w.trLen {
				w.endFPDU()
			}
		}
	}
	w.remain -= n
	if n == 0 && w.stage == fwDone {
		return 0, io.EOF
	}
	return n, nil
}

// fpduEnd reports whether the first n bytes of the message end at an FPDU
// boundary. Every FPDU of a message with payload but the last has the same
// length (and only a Read Request, which has none, carries extra), unless
// the message is tiled.
func (w *fpduWriter) fpduEnd(n int64) bool {
	if w.tiles.size != 0 {
		if n >= int64(w.size) {
			return n == int64(w.size)
		}
		// FPDU k starts near k tiles' worth of FPDU-stream octets.
		k := int(n * MPAMarkerInterval / (int64(w.tiles.size) * markerRun))
		for k > 0 && int64(w.tiles.start(k)) > n {
			k--
		}
		for int64(w.tiles.start(k+1)) <= n {
			k++
		}
		return int64(w.tiles.start(k)) == n
	}
	return n%int64(w.fullLen()) == 0
}

// fullLen returns the length of a full FPDU of an untiled message: every
// FPDU but the last, which carries the rest.
func (w *fpduWriter) fullLen() int { return FPDULen(w.headerSize() + w.maxPay) }

func (w *fpduWriter) startFPDU() {
	if w.tiles.size != 0 {
		k := int(w.fpdus)
		w.segLen = min(w.tiles.start(k+1)-w.tiles.start(k)-(MPALengthSize+w.headerSize()+MPACRCSize), w.total-w.off)
	} else {
		w.segLen = min(w.maxPay, w.total-w.off)
	}
	w.segPos = 0
	w.prefetch()
	w.f.Last = w.off+w.segLen == w.total
	if w.f.Opcode.Tagged() {
		w.f.TO = w.baseTO + uint64(w.off)
	} else {
		w.f.MO = uint32(w.off)
	}
	hs := DDPHeader(w.buf[MPALengthSize:]).Encode(&w.f)
	h := MPALengthSize + hs
	if w.off == 0 {
		h += copy(w.buf[h:], w.extra)
	}
	binary.BigEndian.PutUint16(w.buf[0:], uint16(h-MPALengthSize+w.segLen))
	w.hLen, w.hPos = h, 0
	if w.crcOn {
		w.crc = zerocopy.UpdateCRC32C(0, w.buf[:h])
	}
	w.stage = fwHeader
	w.fpdus++
}

// whole writes the FPDU that startFPDU began straight into p when all of
// it fits there — the common case, as netstack reads a payloader into
// chunks of up to 64 KiB — and returns its length; it returns 0, having
// written nothing, when p is too short, and the staged path takes over.
func (w *fpduWriter) whole(p []byte) int {
	total := FPDULen(w.hLen - MPALengthSize + w.segLen)
	if total > len(p) {
		return 0
	}
	h := copy(p, w.buf[:w.hLen])
	if w.crcOn {
		_, w.crc = w.src.CopyToCRC(p[h:h+w.segLen], w.off, w.crc)
	} else {
		w.src.CopyTo(p[h:h+w.segLen], w.off)
	}
	w.trailer(p[h+w.segLen : total])
	w.endFPDU()
	return total
}

// wholeRun writes the message's next FPDUs straight into p while each is
// full, not the message's last, and fits whole: the bulk of a large
// message cut into short FPDUs. The FPDU before each was full and not the
// last either, so its header in buf differs from the next one's only in
// the TO (tagged) or MO (untagged), which wholeRun sets in place; whole
// FPDUs of the largest payload need no pad. It returns the bytes written
// (0 for the first FPDU of a message, tiled FPDUs, or when none fits).
func (w *fpduWriter) wholeRun(p []byte) int {
	if w.off == 0 || w.tiles.size != 0 {
		return 0
	}
	hLen := MPALengthSize + w.headerSize()
	pay := w.maxPay
	full := hLen + pay + MPACRCSize
	hb := w.buf[:hLen]
	tagged := w.f.Opcode.Tagged()
	n := 0
	for len(p)-n >= full && w.total-w.off > pay {
		if tagged {
			binary.BigEndian.PutUint64(hb[MPALengthSize+ddpTO:], w.baseTO+uint64(w.off))
		} else {
			binary.BigEndian.PutUint32(hb[MPALengthSize+ddpMO:], uint32(w.off))
		}
		q := p[n : n+full]
		w.prefetch()
		copy(q, hb)
		var crc uint32
		if w.crcOn {
			_, crc = w.src.CopyToCRC(q[hLen:hLen+pay], w.off, zerocopy.UpdateCRC32C(0, hb))
		} else {
			w.src.CopyTo(q[hLen:hLen+pay], w.off)
		}
		binary.LittleEndian.PutUint32(q[hLen+pay:], crc)
		w.off += pay
		w.fpdus++
		n += full
	}
	return n
}

// trailer writes the pad and the CRC that end the current FPDU into tr,
// which is exactly as long as they are.
func (w *fpduWriter) trailer(tr []byte) {
	pad := len(tr) - MPACRCSize
	clear(tr[:pad])
	var crc uint32
	if w.crcOn {
		crc = zerocopy.UpdateCRC32C(w.crc, tr[:pad])
	}
	binary.LittleEndian.PutUint32(tr[pad:], crc) // CRC32c goes least significant byte first, as in iSCSI and siw
}

func (w *fpduWriter) endPayload() {
	w.trLen, w.trPos = FPDUPad(w.hLen-MPALengthSize+w.segLen)+MPACRCSize, 0
	w.trailer(w.tr[:w.trLen])
	w.stage = fwTrailer
}

// endFPDU moves on once an FPDU's last byte is out.
func (w *fpduWriter) endFPDU() {
	w.off += w.segLen
	if w.off >= w.total {
		w.stage = fwDone
	} else {
		w.stage = fwNext
	}
}

func wqeBytes(e *sendWQE) int {
	if e.inlined {
		return len(e.inline)
	}
	n := 0
	for _, s := range e.sgl {
		n += int(s.Length)
	}
	return n
}
