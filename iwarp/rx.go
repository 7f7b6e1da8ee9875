package iwarp

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rdmatap/rdmatap/zerocopy"
)

// The receive path of an RDMAP stream, one goroutine per QP. An FPDU's way
// through it:
//
//  1. TCP bytes: netstack's Endpoint.Read hands Write slices of the stack's
//     own packet memory, in stream order, cut anywhere (even inside a header).
//  2. MPA frame: the 2-byte ULPDU_Length, then the DDP header (14 or 18
//     bytes, plus the 28-byte Read Request or the Terminate header), are
//     gathered into a small header buffer.
//  3. DDP/RDMAP header checks: versions, opcode, queue number, MSN and MO,
//     framing (a ULPDU shorter than its headers).
//  4. STag and queue lookup: a tagged segment's STag is looked up and
//     checked for PD, access rights and base and bounds; an untagged Send
//     takes the next posted receive.
//  5. Placement: payload is copied once from packet memory into the target
//     region, the CRC32c computed in the same pass. The region is held
//     while its bytes are touched, from the first placement of a stream
//     read to the read's end; one deregistered meanwhile is not touched
//     again, and the FPDU is refused as one naming its STag would be.
//  6. Trailer: pad and CRC are checked (when negotiated).
//  7. Completion: the last segment of a Send completes the receive; the last
//     Read Response segment completes the Read; a Read Request goes to the
//     IRQ for the TX goroutine; an Atomic Request (RFC 7306) is executed and
//     its response queued in the IRQ behind earlier Read Responses; an
//     Atomic Response completes the atomic; Immediate Data completes a
//     receive (or rides on the Send behind it); a Terminate ends the stream.
//
// The parser consumes (stream offset, bytes) in order and knows nothing of
// TCP, so a segment-level feed can drive it unchanged.

const (
	rxHeader = iota
	rxPayload
	rxTrailer
	rxDead

	rxHdrMax = MPALengthSize + DDPUntaggedHeaderSize + TerminateMaxSize
)

// rxMsg is the untagged Send message being received.
type rxMsg struct {
	active bool
	wqe    recvWQE
	msn    uint32
	size   int // capacity of the receive buffers
	placed int
	dst    zerocopy.SGList
	regs   []*Region // the regions dst lies in
}

// receiver is a QP's receive side. Its fields belong to the holder of
// qp.rxMu (the package's Locks section has who that is); init runs in
// Start. The QP's shared state (the ORQ and IRQ, the TX gate, immOK) it
// reads and changes under qp.mu, taken inside rxMu; the Send state it
// tells the segment placer, under the placer's mu (takeRecv,
// publishSends). It completes work requests with rxMu held, qp.mu not.
// +checklocksalias:seg.qp.rxMu=qp.rxMu
type receiver struct {
	qp *QP
	// +checklocks:qp.rxMu
	crcOn bool
	// +checklocks:qp.rxMu
	sendRTR bool // responder expecting a zero-length Send as RTR
	// +checklocks:qp.rxMu
	gateOpen bool
	// +checklocks:qp.rxMu
	stats *Stats

	// +checklocks:qp.rxMu
	state int
	// +checklocks:qp.rxMu
	hdr [rxHdrMax]byte
	// +checklocks:qp.rxMu
	have int
	// +checklocks:qp.rxMu
	need int
	// +checklocks:qp.rxMu
	ulpdu int
	// +checklocks:qp.rxMu
	op Opcode
	// +checklocks:qp.rxMu
	last bool
	// +checklocks:qp.rxMu
	payLen int
	// +checklocks:qp.rxMu
	payPos int
	// +checklocks:qp.rxMu
	dst []byte // tagged destination
	// +checklocks:qp.rxMu
	reg *Region // the region dst (or dstv) lies in
	// +checklocks:qp.rxMu
	sgl zerocopy.SGList // untagged destination
	// +checklocks:qp.rxMu
	sglOff int
	// +checklocks:qp.rxMu
	crc uint32
	// +checklocks:qp.rxMu
	trail [7]byte
	// +checklocks:qp.rxMu
	trHave int
	// +checklocks:qp.rxMu
	trNeed int
	// dstv is a tagged destination in a region over separate pages:
	// the FPDU's payload in the pages it spans (backed by dstvBuf).
	// +checklocks:qp.rxMu
	dstv zerocopy.SGList
	// +checklocks:qp.rxMu
	dstvBuf zerocopy.SGList

	// +checklocks:qp.rxMu
	expect [numQN]uint32
	// +checklocks:qp.rxMu
	cur rxMsg
	// A Send with Immediate's Immediate Data, waiting for its Send.
	// +checklocks:qp.rxMu
	imm uint32
	// +checklocks:qp.rxMu
	hasImm bool
	// +checklocks:qp.rxMu
	offset uint64 // TCP stream offset of the next byte
	// +checklocks:qp.rxMu
	held holds // regions being placed into during this stream read

	// MPA markers: in is what the stream feeds, the receiver itself or
	// the stripper in front of it (which then checks the CRC).
	// +checklocks:qp.rxMu
	in io.Writer
	// +checklocks:qp.rxMu
	mk markerStripper

	// Segment placement (nil: stream placement only). Set by Start
	// before the receive path runs, like waitOr, waitUnread and heldFn,
	// and read-only after: the RX goroutine reads them while it waits,
	// without rxMu.
	seg *segPlacer
	// +checklocks:qp.rxMu
	start uint64 // stream offset of the current FPDU
	// +checklocks:qp.rxMu
	early *placedFPDU // the current FPDU was placed from its segment
	// +checklocks:qp.rxMu
	taken *placedFPDU // deliverRun claimed the next FPDU's record (segPlacer.takePlaced)
	// +checklocks:qp.rxMu
	vcrc uint32 // CRC32c of its payload as delivered (no MPA CRC)
	// +checklocks:qp.rxMu
	tcp tcpFeed // the input from TCP, when the tap may feed too
	// waitOr waits for the stream or the placer's queue (segment
	// placement with a retaining source).
	waitOr func(ctx context.Context, wake <-chan struct{}) error
	// tapFeed is set while the tap feeds the receiver a short segment on
	// the link's goroutine (segPlacer.feed); a response queued meanwhile
	// sets respondDue, and the feeder sends it (transmitter.respondInline).
	// +checklocks:qp.rxMu
	tapFeed    bool
	respondDue atomic.Bool
	// waitUnread (segment placement, a stream that has it) waits like
	// waitOr but leaves what the tap has fed out (see fedHeld); heldFn is
	// fedHeld, made once.
	waitUnread func(ctx context.Context, wake <-chan struct{}, had func() int, spin time.Duration) error
	heldFn     func() int
	// The Send state last told the placer (publishSends).
	// +checklocks:qp.rxMu
	pubActive bool
	// +checklocks:qp.rxMu
	pubExpect uint32

	// Counters, kept locally and added to the shared Stats after each
	// read: atomics per FPDU would bounce a cache line between QPs.
	// +checklocks:qp.rxMu
	n rxCounts

	// rresp is the head of the ORQ, copied under qp.mu when the first
	// FPDU of its Read Response arrives (rrespOn until the last one), so
	// that the FPDUs after it are checked and counted without the lock:
	// two qp.mu round trips per FPDU, a cache line shared with the TX
	// goroutine and posters, were an eighth of an RDMA Read's CPU at
	// MTU 1500. Only this goroutine takes the head off the ORQ, and
	// nobody changes it while it is there.
	// +checklocks:qp.rxMu
	rresp orqEntry
	// +checklocks:qp.rxMu
	rrespOn bool

	// cont is the region of the RDMA Write under way when its last FPDU
	// was placed into it and was not the Write's last: the next FPDU
	// that continues it (contWrite) skips the STag lookup and the checks
	// its header repeats. contCtl is that FPDU's two control bytes
	// without the Last flag, contSTag its STag and contTO the TO that
	// follows it.
	// +checklocks:qp.rxMu
	cont *Region
	// +checklocks:qp.rxMu
	contCtl [2]byte
	// +checklocks:qp.rxMu
	contSTag uint32
	// +checklocks:qp.rxMu
	contTO uint64
	// contRR: the last FPDU was a Read Response, not the last, placed
	// into the sink of rresp (not over separate pages); contCtl and
	// contSTag are its control bytes and STag.
	// +checklocks:qp.rxMu
	contRR bool
}

type rxCounts struct {
	fpdus, bytes, placed, copies, crcErrors uint64
	ops                                     [16]uint64
}

// +checklocks:r.qp.rxMu
func (r *receiver) flushStats() {
	s := r.stats
	if s == nil {
		r.n = rxCounts{}
		return
	}
	n := &r.n
	// A read may finish an FPDU without starting one: its bytes count
	// even when no FPDU header was in it.
	if n.fpdus != 0 || n.bytes != 0 || n.placed != 0 || n.copies != 0 {
		s.RxFPDUs.Add(n.fpdus)
		s.RxBytes.Add(n.bytes)
		s.PlacedBytes.Add(n.placed)
		s.PlacementCopies.Add(n.copies)
		for i, v := range n.ops {
			if v != 0 {
				s.RxOps[i].Add(v)
			}
		}
	}
	if n.crcErrors != 0 {
		s.CRCErrors.Add(n.crcErrors)
	}
	*n = rxCounts{}
}

// +checklocks:r.qp.rxMu
func (r *receiver) init(p ConnParams) {
	r.crcOn, r.in = p.CRC, r
	if p.MarkersRx {
		r.crcOn = false
		r.mk.reset(r, p.CRC, r.markerError)
		r.in = &r.mk
	}
	r.sendRTR = !p.Initiator && p.PeerToPeer && p.RTR == RTRSend
	r.gateOpen = p.Initiator
	r.stats = r.qp.cfg.Stats
	r.state = rxHeader
	r.have, r.need = 0, 4
	for i := range r.expect {
		r.expect[i] = 1
	}
	r.hasImm = false
	r.rresp, r.rrespOn = orqEntry{}, false
	r.cont, r.contRR = nil, false
	if r.cur.wqe.sgl == nil {
		r.cur.wqe.sgl = make([]SGE, 0, r.qp.cfg.RQ.MaxSGE())
		r.cur.dst = make(zerocopy.SGList, 0, r.qp.cfg.RQ.MaxSGE())
		r.cur.regs = make([]*Region, 0, r.qp.cfg.RQ.MaxSGE())
		r.held.regs = make([]*Region, 0, r.qp.cfg.RQ.MaxSGE()+1)
	}
}

// run reads the stream until it ends. It waits for readability without
// holding rxMu, so that a busy-polling Progress can take the bytes first.
func (r *receiver) run() {
	qp := r.qp
	defer close(qp.rxDone)
	for {
		var err error
		if r.waitOr != nil {
			// Segment placement queues segments beyond a hole for this
			// goroutine, which TCP's hole leaves idle. What TCP holds
			// of the stream the tap has fed already is read only when
			// TCP holds more, or drainAfter of it.
			if r.waitUnread != nil {
				err = r.waitUnread(qp.ctx, r.seg.wake, r.heldFn, 0)
			} else {
				err = r.waitOr(qp.ctx, r.seg.wake)
			}
			if err == nil {
				r.seg.work()
			}
		} else {
			err = qp.stream.WaitReadable(qp.ctx)
		}
		if err != nil {
			r.streamErr(err)
			return
		}
		qp.rxMu.Lock()
		_, err = qp.stream.TryReadTo(r.in, 0)
		r.afterRead()
		qp.rxMu.Unlock()
		if err != nil {
			r.streamErr(err)
			return
		}
	}
}

// afterRead ends a stream read: with segment placement, the FPDUs placed
// from segments that now follow in order are delivered without waiting
// for TCP to hand them over (see segPlacer.feed); then the counters are
// added up.
// +checklocks:r.qp.rxMu
func (r *receiver) afterRead() {
	if r.seg != nil && r.seg.rx != nil {
		if r.seg.nkept.Load() > 0 && r.seg.nrec.Load() > 0 {
			// FPDUs placed beyond a hole wait: what the tap kept of the
			// stream before them (a hole filler the tap could not feed
			// too) need not wait for TCP's processor.
			r.seg.feedKept(^uint64(0))
		}
		r.deliverPlaced()
	}
	r.flushStats()
}

// streamErr ends the QP when the stream reports an error or the peer's FIN.
func (r *receiver) streamErr(err error) {
	qp := r.qp
	qp.rxMu.Lock()
	clean := r.state == rxHeader && r.have == 0
	dead := r.state == rxDead
	qp.rxMu.Unlock()
	switch {
	case errors.Is(err, io.EOF) && !dead && clean:
		// The peer closed at an FPDU boundary: a graceful close.
		qp.fail(nil, false)
	case errors.Is(err, io.EOF) && !dead:
		qp.fail(&TerminateError{Code: TermCode{LayerLLP, ETypeMPA, CodeTCPLost}}, false)
	default:
		qp.fail(err, false)
	}
}

// Write consumes stream bytes. It never fails: after a protocol error it
// discards the rest of the stream while the Terminate goes out. The regions
// it placed into are released when it returns.
// +checklocks:r.qp.rxMu
func (r *receiver) Write(p []byte) (int, error) {
	n := len(p)
	r.offset += uint64(n)
	if r.seg != nil {
		r.seg.parsed.Store(r.offset)
	}
	defer r.held.drop()
	for len(p) > 0 {
		switch r.state {
		case rxHeader:
			if r.have == 0 {
				r.start = r.offset - uint64(len(p))
				if k := r.whole(p); k > 0 {
					p = p[k:]
					continue
				}
			}
			c := copy(r.hdr[r.have:r.need], p)
			r.have += c
			p = p[c:]
			if r.have < r.need {
				continue
			}
			if r.need == 4 {
				if !r.sizeHeader() {
					continue
				}
				if r.have < r.need {
					continue
				}
			}
			r.onHeader()
		case rxPayload:
			c := min(len(p), r.payLen-r.payPos)
			if !r.place(p[:c]) {
				return n, nil
			}
			r.payPos += c
			p = p[c:]
			if r.payPos == r.payLen {
				r.state = rxTrailer
			}
		case rxTrailer:
			c := copy(r.trail[r.trHave:r.trNeed], p)
			r.trHave += c
			p = p[c:]
			if r.trHave == r.trNeed {
				r.onTrailer()
			}
		case rxDead:
			return n, nil
		}
	}
	return n, nil
}

// whole takes a complete FPDU at the start of p in one pass: the common
// case, as netstack's views hold many whole FPDUs. It runs the same steps
// as the byte-wise path above (onHeader, place, onTrailer), only without
// gathering the FPDU piece by piece. It returns 0, having consumed
// nothing, for an FPDU that p cuts, for a ULPDU shorter than its header
// (the byte-wise path raises the framing error), and for Read and Atomic
// Requests, Atomic Responses, Immediate Data and Terminates, whose headers
// are longer.
// +checklocks:r.qp.rxMu
func (r *receiver) whole(p []byte) int {
	if len(p) < MPALengthSize+DDPUntaggedHeaderSize {
		return 0
	}
	ulpdu := int(binary.BigEndian.Uint16(p))
	total := FPDULen(ulpdu)
	if total > len(p) {
		return 0
	}
	if (r.cont != nil || r.contRR) && (r.seg == nil || r.seg.passInOrder(r.start)) {
		if r.wholeCont(p, ulpdu, total) {
			return total
		}
	}
	h := DDPHeader(p[MPALengthSize:])
	hs, op := h.HeaderSize(), h.Opcode()
	if ulpdu < hs || !h.Tagged() && (extHeaderSize(op) > 0 || op == OpTerminate) {
		return 0
	}
	need := MPALengthSize + hs
	if need == MPALengthSize+DDPTaggedHeaderSize {
		// A fixed-size copy is two moves; copy calls memmove.
		*(*[MPALengthSize + DDPTaggedHeaderSize]byte)(r.hdr[:]) = [MPALengthSize + DDPTaggedHeaderSize]byte(p)
	} else {
		copy(r.hdr[:need], p)
	}
	r.have, r.need, r.ulpdu, r.op = need, need, ulpdu, op
	r.onHeader()
	if r.state == rxDead {
		return need
	}
	if r.payLen > 0 {
		if !r.place(p[need : need+r.payLen]) {
			return total
		}
		r.payPos = r.payLen
	}
	if tr := p[need+r.payLen : total]; len(tr) == MPACRCSize {
		*(*[MPACRCSize]byte)(r.trail[:]) = [MPACRCSize]byte(tr)
		r.trHave = MPACRCSize
	} else {
		r.trHave = copy(r.trail[:r.trNeed], tr)
	}
	r.onTrailer()
	return total
}

// wholeCont takes a whole FPDU that continues the RDMA Write (see
// contWrite) or the Read Response (at the next TO of the Read's sink) of
// the FPDU before it and is not its last, with no pad, nor, with segment
// placement, any FPDU placed from a segment waiting for the in-order path
// (passInOrder): the bulk of a large message cut into short FPDUs. It
// runs the steps of onHeader, place, onTrailer and endFPDU for such an
// FPDU in one go, without their state changes, which the next FPDU would
// undo. false, having changed nothing the byte-wise path does not redo,
// leaves the FPDU to it: any other FPDU, one whose region is gone, and
// one whose CRC fails (its bytes are placed again there and the error
// raised).
// +checklocks:r.qp.rxMu
func (r *receiver) wholeCont(p []byte, ulpdu, total int) bool {
	const need = MPALengthSize + DDPTaggedHeaderSize
	payLen := ulpdu - DDPTaggedHeaderSize
	h := DDPHeader(p[MPALengthSize:need])
	// The control bytes as they were, so with Last clear.
	if payLen <= 0 || total != need+payLen+MPACRCSize || h[ddpControl] != r.contCtl[0] || h[rdmapCtrl] != r.contCtl[1] ||
		h.STag() != r.contSTag {
		return false
	}
	var dst []byte
	var reg *Region
	if c := r.cont; c != nil {
		if h.TO() != r.contTO || !c.Valid() {
			return false
		}
		d, ok := c.Slice(r.contTO, uint64(payLen))
		if !ok {
			return false
		}
		dst, reg = d, c
	} else {
		// The checks of checkReadResponse.
		o := &r.rresp
		if !r.rrespOn || o.op != WRRead || h.TO() != o.sinkTO+uint64(o.placed) || uint64(o.placed)+uint64(payLen) > uint64(o.size) {
			return false
		}
		dst, reg = o.sink[o.placed:int(o.placed)+payLen], o.sinkReg
	}
	if !r.held.hold(reg) {
		return false
	}
	src := p[need : need+payLen]
	if r.crcOn {
		crc := zerocopy.UpdateCRC32C(0, p[:need])
		_, crc = zerocopy.PlaceCRC(dst, src, crc)
		if binary.LittleEndian.Uint32(p[need+payLen:]) != crc {
			return false
		}
	} else {
		zerocopy.Place(dst, src)
	}
	if r.cont != nil {
		r.contTO += uint64(payLen)
	} else {
		r.rresp.placed += uint32(payLen)
	}
	n := &r.n
	n.fpdus++
	n.copies++
	n.placed += uint64(payLen)
	n.bytes += uint64(payLen)
	return true
}

// sizeHeader works out, from the first four bytes, how many header bytes
// this FPDU has.
// +checklocks:r.qp.rxMu
func (r *receiver) sizeHeader() bool {
	r.ulpdu = int(binary.BigEndian.Uint16(r.hdr[0:]))
	h := DDPHeader(r.hdr[MPALengthSize:])
	hs := h.HeaderSize()
	r.op = h.Opcode()
	need := hs
	if !h.Tagged() {
		switch r.op {
		case OpTerminate:
			need = min(max(r.ulpdu, hs+termCtrlLen), hs+TerminateMaxSize)
		default:
			need += extHeaderSize(r.op)
		}
	}
	if r.ulpdu < need {
		// A ULPDU shorter than the headers it announces: the stream can
		// no longer be framed (siw answers the same with LLP/MPA 0x03).
		r.fail(TermCode{LayerLLP, ETypeMPA, CodeFPDUStart}, min(r.have-MPALengthSize, 2))
		return false
	}
	r.need = MPALengthSize + need
	return true
}

// markerError terminates the stream on a bad marker or, with markers, a
// bad CRC (the stripper checks the CRC over the FPDU with its markers).
// +checklocks:r.qp.rxMu
func (r *receiver) markerError(e *MarkerError) {
	if e.Code.Code == CodeCRC {
		r.n.crcErrors++
	}
	if r.state != rxDead {
		r.fail(e.Code, r.have-MPALengthSize)
	}
}

// mismatch ends the stream when TCP delivered other bytes than the segment
// an FPDU was placed from: the region may hold bytes the stream never had,
// which only a local catastrophic error may leave behind.
// +checklocks:r.qp.rxMu
func (r *receiver) mismatch(hdrLen int) {
	r.early = nil
	r.seg.stats.Mismatches.Add(1)
	r.fail(TermCode{LayerRDMAP, ETypeRDMAPCatastrophic, CodeUnspecified}, hdrLen)
}

// fail raises a Terminate for the current FPDU and stops parsing.
// +checklocks:r.qp.rxMu
func (r *receiver) fail(code TermCode, hdrLen int) {
	r.state = rxDead
	off := r.hdr[MPALengthSize : MPALengthSize+min(max(hdrLen, 0), r.need-MPALengthSize)]
	r.qp.terminate(code, off, r.ulpdu)
}

// onHeader runs once the FPDU's headers are complete: checks, lookup, and
// the choice of destination.
// +checklocks:r.qp.rxMu
func (r *receiver) onHeader() {
	h := DDPHeader(r.hdr[MPALengthSize:r.need])
	hl := r.need - MPALengthSize
	r.payLen = r.ulpdu - hl
	r.payPos = 0
	r.dst, r.reg, r.sgl, r.dstv = nil, nil, nil, nil
	r.last = h.Last()
	r.trHave, r.trNeed = 0, FPDUPad(r.ulpdu)+MPACRCSize
	if r.crcOn {
		r.crc = zerocopy.UpdateCRC32C(0, r.hdr[:r.need])
	}
	r.n.fpdus++
	r.early = nil
	if r.seg != nil {
		var stale bool
		if r.taken != nil {
			r.early, r.taken = r.taken, nil
		} else {
			r.early, stale = r.seg.claimInOrder(r.start, r.start+uint64(FPDULen(r.ulpdu)))
		}
		r.vcrc = 0
		if stale {
			r.mismatch(hl)
			return
		}
	}
	if !r.contWrite(h) {
		if code, bad := r.check(h); bad {
			r.fail(code, hl)
			return
		}
	}
	if e := r.early; e != nil && (e.payLen != r.payLen || !r.placedHere(e)) {
		// Placed from its segment as another FPDU than TCP delivers.
		r.mismatch(hl)
		return
	}
	if !r.gateOpen {
		r.gateOpen = true
		r.qp.firstFPDU()
	}
	if r.payLen == 0 {
		r.state = rxTrailer
	} else {
		r.state = rxPayload
	}
}

// contWrite sets the destination of an FPDU that continues the RDMA Write
// of the FPDU before it (r.cont): the same control bytes but for the Last
// flag, the same STag, the next TO, and payload. Its header then passes
// every check of that FPDU's, which check would repeat, and the region,
// looked up and checked for that FPDU, is the one its STag names as long
// as it is valid (deregistration invalidates it before it leaves the
// table): only validity and the bounds are checked again. false: check
// the FPDU as usual.
// +checklocks:r.qp.rxMu
func (r *receiver) contWrite(h DDPHeader) bool {
	c := r.cont
	r.cont = nil
	if c == nil || r.payLen == 0 || h[ddpControl]&^ddpFlagLast != r.contCtl[0] || h[rdmapCtrl] != r.contCtl[1] ||
		h.STag() != r.contSTag || h.TO() != r.contTO || !c.Valid() {
		return false
	}
	dst, ok := c.Slice(r.contTO, uint64(r.payLen))
	if !ok {
		return false
	}
	r.dst, r.reg = dst, c
	return true
}

// placedHere reports whether the current FPDU's destination, as checked,
// is where the placer put its payload.
// +checklocks:r.qp.rxMu
func (r *receiver) placedHere(e *placedFPDU) bool {
	switch {
	case r.dst != nil:
		return r.op.Tagged() && e.addr == unsafe.Pointer(unsafe.SliceData(r.dst))
	case r.dstv != nil:
		return false // the placer leaves pages alone (segPlacer.writeDst)
	case r.sgl != nil:
		return r.op.IsSend() && e.wqe == r.cur.wqe.id && e.addr == sglAddr(r.sgl, r.sglOff)
	}
	return false
}

// check validates the headers and sets the destination; bad reports an
// error to terminate with.
// +checklocks:r.qp.rxMu
func (r *receiver) check(h DDPHeader) (code TermCode, bad bool) {
	tagged := h.Tagged()
	if h.DDPVersion() != DDPVersion {
		if tagged {
			return TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPTaggedVersion}, true
		}
		return TermCode{LayerDDP, ETypeUntaggedBuffer, CodeDDPUntaggedVersion}, true
	}
	if h.RDMAPVersion() != RDMAPVersion {
		return TermCode{LayerRDMAP, ETypeRemoteOperation, CodeInvalidRDMAPVersion}, true
	}
	if tagged != r.op.Tagged() || r.op > OpAtomicResp || r.op > OpTerminate && r.qp.cfg.NoExtensions {
		return TermCode{LayerRDMAP, ETypeRemoteOperation, CodeUnexpectedOpcode}, true
	}
	if !tagged {
		qn := h.QN()
		if qn >= numQN {
			return TermCode{LayerDDP, ETypeUntaggedBuffer, CodeInvalidQN}, true
		}
		want := uint32(QNSend)
		switch r.op {
		case OpReadRequest, OpAtomicRequest:
			want = QNReadReq
		case OpTerminate:
			want = QNTerminate
		case OpAtomicResp:
			want = QNAtomicResp
		}
		if qn != want {
			return TermCode{LayerDDP, ETypeUntaggedBuffer, CodeInvalidQN}, true
		}
	}
	switch r.op {
	case OpWrite:
		return r.checkWrite(h)
	case OpReadResponse:
		return r.checkReadResponse(h)
	case OpReadRequest:
		return r.checkReadRequest(h)
	case OpAtomicRequest:
		return r.checkAtomicRequest(h)
	case OpAtomicResp:
		return r.checkAtomicResponse(h)
	case OpImmediate, OpImmediateSE:
		return r.checkImmediate(h)
	case OpTerminate:
		if err := Terminate(h.Payload()).Validate(); err != nil {
			return TermCode{LayerRDMAP, ETypeRemoteOperation, CodeUnspecified}, true
		}
		return
	}
	return r.checkSend(h)
}

// +checklocks:r.qp.rxMu
func (r *receiver) checkWrite(h DDPHeader) (TermCode, bool) {
	if r.payLen == 0 {
		// A zero-length Write places nothing, so its STag is not checked
		// (RFC 5040 §5.1); siw's Write RTR carries STag 1.
		return TermCode{}, false
	}
	qp := r.qp
	reg := qp.cfg.Mem.Lookup(h.STag())
	switch {
	case reg == nil:
		return TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPInvalidSTag}, true
	case !reg.Associated(qp.cfg.PD, qp.cfg.Num):
		return TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPSTagNotAssociated}, true
	case reg.Access&AccessRemoteWrite == 0:
		return TermCode{LayerRDMAP, ETypeRemoteProtection, CodeAccessRights}, true
	}
	to := h.TO()
	if to+uint64(r.payLen) < to {
		return TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPTOWrap}, true
	}
	if reg.Paged() {
		dstv, ok := reg.Pieces(r.dstvBuf[:0], to, uint64(r.payLen))
		if !ok {
			return TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPBaseBounds}, true
		}
		r.dstvBuf = dstv
		r.dstv, r.reg = dstv, reg
		return TermCode{}, false
	}
	dst, ok := reg.Slice(to, uint64(r.payLen))
	if !ok {
		return TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPBaseBounds}, true
	}
	r.dst, r.reg = dst, reg
	return TermCode{}, false
}

// +checklocks:r.qp.rxMu
func (r *receiver) checkReadResponse(h DDPHeader) (TermCode, bool) {
	o := &r.rresp
	if !r.rrespOn {
		qp := r.qp
		qp.mu.Lock()
		if qp.orqN == 0 {
			qp.mu.Unlock()
			// A Read Response nobody asked for.
			return TermCode{LayerRDMAP, ETypeRemoteOperation, CodeUnexpectedOpcode}, true
		}
		*o = qp.orq[qp.orqHead]
		qp.mu.Unlock()
		r.rrespOn = true
	}
	if o.op != WRRead && !o.probe {
		// Responses come in the order of the requests: an atomic's is due.
		return TermCode{LayerRDMAP, ETypeRemoteOperation, CodeUnexpectedOpcode}, true
	}
	if h.STag() != o.sinkSTag {
		return TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPInvalidSTag}, true
	}
	if h.TO() != o.sinkTO+uint64(o.placed) || uint64(o.placed)+uint64(r.payLen) > uint64(o.size) {
		return TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPBaseBounds}, true
	}
	if o.sinkPaged {
		r.dstvBuf, _ = o.sinkReg.Pieces(r.dstvBuf[:0], h.TO(), uint64(r.payLen))
		r.dstv, r.reg = r.dstvBuf, o.sinkReg
		return TermCode{}, false
	}
	r.dst, r.reg = o.sink[o.placed:int(o.placed)+r.payLen], o.sinkReg
	return TermCode{}, false
}

// +checklocks:r.qp.rxMu
func (r *receiver) checkReadRequest(h DDPHeader) (TermCode, bool) {
	qp := r.qp
	if h.MSN() != r.expect[QNReadReq] {
		return TermCode{LayerDDP, ETypeUntaggedBuffer, CodeMSNRange}, true
	}
	if h.MO() != 0 || !h.Last() || r.payLen != 0 {
		return TermCode{LayerDDP, ETypeUntaggedBuffer, CodeInvalidMO}, true
	}
	if r.irqFull(true) {
		// More Reads in flight than the IRD we granted.
		return TermCode{LayerRDMAP, ETypeRemoteOperation, CodeCatastrophicStream}, true
	}
	rr := ReadRequest(h.Payload())
	if rr.Size() == 0 {
		return TermCode{}, false
	}
	reg := qp.cfg.Mem.Lookup(rr.SourceSTag())
	switch {
	case reg == nil:
		return TermCode{LayerRDMAP, ETypeRemoteProtection, CodeInvalidSTag}, true
	case !reg.Associated(qp.cfg.PD, qp.cfg.Num):
		return TermCode{LayerRDMAP, ETypeRemoteProtection, CodeSTagNotAssociated}, true
	case reg.Access&AccessRemoteRead == 0:
		return TermCode{LayerRDMAP, ETypeRemoteProtection, CodeAccessRights}, true
	}
	to := rr.SourceTO()
	if to+uint64(rr.Size()) < to {
		return TermCode{LayerRDMAP, ETypeRemoteProtection, CodeTOWrap}, true
	}
	if _, ok := reg.InBounds(to, uint64(rr.Size())); !ok {
		return TermCode{LayerRDMAP, ETypeRemoteProtection, CodeBaseBounds}, true
	}
	return TermCode{}, false
}

// irqFull reports whether a Read or Atomic Request now would exceed the
// IRD we granted. rtr lets the first FPDU through with IRD 0: a Read RTR
// (RFC 6581), which a zero-length Read Request may be and an atomic never.
// +checklocks:r.qp.rxMu
func (r *receiver) irqFull(rtr bool) bool {
	qp := r.qp
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.irqN >= qp.params.IRD && !(rtr && qp.params.IRD == 0 && qp.irqN == 0 && !r.gateOpen)
}

// checkAtomicRequest checks an Atomic Request (RFC 7306) on queue 1: the
// queue's MSN, one whole segment, room in the IRQ (atomics count against
// IRD, as Reads do), the operation, and the target: a valid STag of this
// PD with remote atomic access, and 8 bytes inside the region at an
// 8-byte aligned address. The operation runs only once the whole FPDU
// has passed its CRC (endAtomicRequest).
// +checklocks:r.qp.rxMu
func (r *receiver) checkAtomicRequest(h DDPHeader) (TermCode, bool) {
	qp := r.qp
	if h.MSN() != r.expect[QNReadReq] {
		return TermCode{LayerDDP, ETypeUntaggedBuffer, CodeMSNRange}, true
	}
	if h.MO() != 0 || !h.Last() || r.payLen != 0 {
		return TermCode{LayerDDP, ETypeUntaggedBuffer, CodeInvalidMO}, true
	}
	if r.irqFull(false) {
		return TermCode{LayerRDMAP, ETypeRemoteOperation, CodeCatastrophicStream}, true
	}
	ar := AtomicRequest(h.Payload())
	if op := ar.Op(); op != AtomicFetchAdd && op != AtomicSwap && op != AtomicCmpSwap {
		return TermCode{LayerRDMAP, ETypeRemoteOperation, CodeUnexpectedOpcode}, true
	}
	reg := qp.cfg.Mem.Lookup(ar.RemoteSTag())
	switch {
	case reg == nil:
		return TermCode{LayerRDMAP, ETypeRemoteProtection, CodeInvalidSTag}, true
	case !reg.Associated(qp.cfg.PD, qp.cfg.Num):
		return TermCode{LayerRDMAP, ETypeRemoteProtection, CodeSTagNotAssociated}, true
	case reg.Access&AccessRemoteAtomic == 0:
		return TermCode{LayerRDMAP, ETypeRemoteProtection, CodeAccessRights}, true
	}
	to := ar.RemoteTO()
	if to+AtomicTargetSize < to {
		return TermCode{LayerRDMAP, ETypeRemoteProtection, CodeTOWrap}, true
	}
	if _, ok := reg.InBounds(to, AtomicTargetSize); !ok {
		return TermCode{LayerRDMAP, ETypeRemoteProtection, CodeBaseBounds}, true
	}
	// In a region over separate pages, a word across two pages is not
	// one aligned word either.
	if word, ok := reg.Slice(to, AtomicTargetSize); !ok || !aligned8(word) {
		// The target must be a naturally aligned 64-bit word: only
		// that can be updated atomically (and with sync/atomic).
		return TermCode{LayerRDMAP, ETypeRemoteOperation, CodeUnspecified}, true
	}
	return TermCode{}, false
}

// checkAtomicResponse checks an Atomic Response (RFC 7306) on queue 3: the
// queue's MSN, one whole segment, and that it answers the oldest
// outstanding request, which must be an atomic with its Request
// Identifier.
// +checklocks:r.qp.rxMu
func (r *receiver) checkAtomicResponse(h DDPHeader) (TermCode, bool) {
	qp := r.qp
	if h.MSN() != r.expect[QNAtomicResp] {
		return TermCode{LayerDDP, ETypeUntaggedBuffer, CodeMSNRange}, true
	}
	if h.MO() != 0 || !h.Last() || r.payLen != 0 {
		return TermCode{LayerDDP, ETypeUntaggedBuffer, CodeInvalidMO}, true
	}
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.orqN == 0 {
		return TermCode{LayerRDMAP, ETypeRemoteOperation, CodeUnexpectedOpcode}, true
	}
	o := &qp.orq[qp.orqHead]
	if !o.op.IsAtomic() || o.reqID != AtomicResponse(h.Payload()).RequestID() {
		return TermCode{LayerRDMAP, ETypeRemoteOperation, CodeUnexpectedOpcode}, true
	}
	return TermCode{}, false
}

// checkImmediate checks an Immediate Data message (RFC 7306) on queue 0:
// the Send MSN, one whole segment, and a posted receive to consume,
// except for one that goes with the Send behind it (see ImmediateData).
// +checklocks:r.qp.rxMu
func (r *receiver) checkImmediate(h DDPHeader) (TermCode, bool) {
	m := &r.cur
	if m.active || h.MSN() != r.expect[QNSend] {
		return TermCode{LayerDDP, ETypeUntaggedBuffer, CodeMSNRange}, true
	}
	if h.MO() != 0 || !h.Last() || r.payLen != 0 {
		return TermCode{LayerDDP, ETypeUntaggedBuffer, CodeInvalidMO}, true
	}
	if ImmediateData(h.Payload()).ForSend() {
		if r.hasImm {
			// Two Immediate Data messages for one Send.
			return TermCode{LayerRDMAP, ETypeRemoteOperation, CodeUnexpectedOpcode}, true
		}
		return TermCode{}, false
	}
	if r.hasImm {
		// The Send that was to carry the last one never came.
		return TermCode{LayerRDMAP, ETypeRemoteOperation, CodeUnexpectedOpcode}, true
	}
	if !r.takeRecv(h.MSN()) {
		return TermCode{LayerDDP, ETypeUntaggedBuffer, CodeNoBuffer}, true
	}
	m.active, m.msn, m.placed, m.size = true, h.MSN(), 0, 0
	return TermCode{}, false
}

// +checklocks:r.qp.rxMu
func (r *receiver) checkSend(h DDPHeader) (TermCode, bool) {
	qp := r.qp
	msn, mo := h.MSN(), h.MO()
	m := &r.cur
	if !m.active {
		if msn != r.expect[QNSend] {
			return TermCode{LayerDDP, ETypeUntaggedBuffer, CodeMSNRange}, true
		}
		if mo != 0 {
			return TermCode{LayerDDP, ETypeUntaggedBuffer, CodeInvalidMO}, true
		}
		if r.sendRTR && r.payLen == 0 && h.Last() && !r.gateOpen {
			// RFC 6581 zero-length Send RTR: consumes an MSN, not a buffer.
			return TermCode{}, false
		}
		if !r.takeRecv(msn) {
			return TermCode{LayerDDP, ETypeUntaggedBuffer, CodeNoBuffer}, true
		}
		dst, regs, size, st := qp.resolveSGL(m.dst, m.regs, m.wqe.sgl, AccessLocalWrite)
		m.dst, m.regs = dst, regs
		m.active, m.msn, m.placed, m.size = true, msn, 0, size
		if st != StatusSuccess {
			qp.complete(qp.cfg.RecvCQ, Completion{ID: m.wqe.id, Status: st, Op: CompRecv})
			m.active = false
			return TermCode{LayerDDP, ETypeDDPCatastrophic, 0}, true
		}
	} else {
		if msn != m.msn {
			return TermCode{LayerDDP, ETypeUntaggedBuffer, CodeMSNRange}, true
		}
		if int(mo) != m.placed {
			return TermCode{LayerDDP, ETypeUntaggedBuffer, CodeInvalidMO}, true
		}
	}
	if m.placed+r.payLen > m.size {
		qp.complete(qp.cfg.RecvCQ, Completion{ID: m.wqe.id, Status: StatusLocalLength, Op: CompRecv})
		m.active = false
		return TermCode{LayerDDP, ETypeUntaggedBuffer, CodeMessageTooLong}, true
	}
	r.sgl = m.dst
	r.sglOff = m.placed
	return TermCode{}, false
}

// place copies payload bytes to the destination, with the CRC in the same
// pass. false: the destination was deregistered since the headers were
// checked; nothing was placed, and the stream is terminated.
// +checklocks:r.qp.rxMu
func (r *receiver) place(b []byte) bool {
	if r.early != nil {
		// Placed from its segment already. With the MPA CRC, the tap
		// verified the CRC of the bytes it placed, and the delivered
		// FPDU's CRC field is compared with theirs (onTrailer): the
		// bytes need no second pass. Without it, the delivered bytes'
		// CRC32c is compared with that of the bytes placed.
		if !r.crcOn {
			r.vcrc = zerocopy.UpdateCRC32C(r.vcrc, b)
		}
		return true
	}
	if !r.holdDst() {
		r.fenced()
		return false
	}
	r.n.copies++
	r.n.placed += uint64(len(b))
	switch {
	case r.dst != nil:
		d := r.dst[r.payPos:]
		if w := r.lastWord(d, len(b)); w > 0 {
			// The end of an RDMA Write: its last aligned 32-bit word
			// is stored after the rest and atomically (see lastWord).
			k := len(b) - w
			r.placeBytes(d[:k], b[:k])
			if r.crcOn {
				r.crc = zerocopy.UpdateCRC32C(r.crc, b[k:])
			}
			storeWord(d[k:k+w], b[k:])
			return true
		}
		r.placeBytes(d, b)
	case r.dstv != nil:
		r.placePaged(b)
	case r.sgl != nil:
		if r.crcOn {
			_, r.crc = r.sgl.PlaceFromCRC(r.sglOff+r.payPos, b, r.crc)
		} else {
			r.sgl.PlaceFrom(r.sglOff+r.payPos, b)
		}
	default:
		// Bytes with no destination (the tail of a long Terminate).
		if r.crcOn {
			r.crc = zerocopy.UpdateCRC32C(r.crc, b)
		}
	}
	return true
}

// holdDst holds the regions of the current destination (see Region).
// +checklocks:r.qp.rxMu
func (r *receiver) holdDst() bool {
	switch {
	case r.dst != nil || r.dstv != nil:
		return r.held.hold(r.reg)
	case r.sgl != nil:
		return r.held.holdAll(r.cur.regs)
	}
	return true
}

// fenced terminates the stream when the destination of the FPDU being
// placed was deregistered under it, as if the FPDU had named an invalid
// STag from the start (RFC 5041's tagged-buffer errors). A receive buffer deregistered
// while posted is a local protection error on its completion.
// +checklocks:r.qp.rxMu
func (r *receiver) fenced() {
	hl := r.need - MPALengthSize
	if r.dst != nil || r.dstv != nil {
		r.fail(TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPInvalidSTag}, hl)
		return
	}
	qp := r.qp
	qp.complete(qp.cfg.RecvCQ, Completion{ID: r.cur.wqe.id, Status: StatusLocalProtection, Op: CompRecv})
	r.cur.active = false
	r.fail(TermCode{LayerDDP, ETypeDDPCatastrophic, 0}, hl)
}

// placePaged places b at r.payPos of a tagged destination over separate
// pages; a Write's last aligned word is stored last and atomically, as
// for one run of memory, when it lies in one page.
// +checklocks:r.qp.rxMu
func (r *receiver) placePaged(b []byte) {
	k := len(b)
	var wd []byte
	if r.op == OpWrite && r.last && r.payPos+len(b) == r.payLen && len(b) >= 4 {
		last := r.dstv[len(r.dstv)-1]
		if len(last) >= 4 && lastWordAligned(last, len(last)) {
			k, wd = len(b)-4, last[len(last)-4:]
		}
	}
	if r.crcOn {
		_, r.crc = r.dstv.PlaceFromCRC(r.payPos, b[:k], r.crc)
	} else {
		r.dstv.PlaceFrom(r.payPos, b[:k])
	}
	if wd != nil {
		if r.crcOn {
			r.crc = zerocopy.UpdateCRC32C(r.crc, b[k:])
		}
		storeWord(wd, b[k:])
	}
}

// +checklocks:r.qp.rxMu
func (r *receiver) placeBytes(d, b []byte) {
	if r.crcOn {
		_, r.crc = zerocopy.PlaceCRC(d, b, r.crc)
	} else {
		zerocopy.Place(d, b)
	}
}

// lastWord returns 4 when the n bytes about to be placed at d end an RDMA
// Write and that end is 4-byte aligned (0 otherwise). That last 32-bit word
// is then stored after the rest, with one atomic store, so an application
// that polls the end of its buffer for a Write's arrival (as perftest's
// write_lat and credit schemes do) may poll it with atomic.LoadUint32: once
// it sees the new word, Go's memory model orders every other byte of the
// Write before its next reads, and the race detector agrees.
// +checklocks:r.qp.rxMu
func (r *receiver) lastWord(d []byte, n int) int {
	if r.op != OpWrite || !r.last || r.payPos+n != r.payLen || !lastWordAligned(d, n) {
		return 0
	}
	return 4
}

// lastWordAligned reports whether n bytes placed at d end with an aligned
// 32-bit word.
func lastWordAligned(d []byte, n int) bool {
	return n >= 4 && (uintptr(unsafe.Pointer(unsafe.SliceData(d)))+uintptr(n))&3 == 0
}

// storeWord stores the 4 bytes of b at d with one atomic store; the bytes
// land as a copy would place them, in any byte order.
func storeWord(d, b []byte) {
	atomic.StoreUint32((*uint32)(unsafe.Pointer(unsafe.SliceData(d))), binary.NativeEndian.Uint32(b))
}

// onTrailer checks pad and CRC and finishes the segment.
// +checklocks:r.qp.rxMu
func (r *receiver) onTrailer() {
	pad := r.trNeed - MPACRCSize
	if r.crcOn && r.early == nil {
		crc := zerocopy.UpdateCRC32C(r.crc, r.trail[:pad])
		if got := binary.LittleEndian.Uint32(r.trail[pad:]); got != crc {
			r.n.crcErrors++
			r.fail(TermCode{LayerLLP, ETypeMPA, CodeCRC}, r.need-MPALengthSize)
			return
		}
	}
	if e := r.early; e != nil {
		delivered := r.vcrc
		if r.crcOn {
			delivered = binary.LittleEndian.Uint32(r.trail[pad:])
		}
		if delivered != e.crc {
			r.mismatch(r.need - MPALengthSize)
			return
		}
		r.early = nil
		if e.hasWord {
			storeWord(r.dst[r.payLen-4:], e.word[:])
		}
	}
	r.endFPDU()
}

// endFPDU finishes an FPDU whose payload and trailer are done: counters,
// and the end of its message.
// +checklocks:r.qp.rxMu
func (r *receiver) endFPDU() {
	r.n.bytes += uint64(r.payLen)
	if r.last {
		r.n.ops[r.op]++
		if r.seg != nil {
			r.seg.messageDone(r.start + uint64(FPDULen(r.ulpdu)))
		}
	}
	h := DDPHeader(r.hdr[MPALengthSize:r.need])
	r.state = rxHeader
	r.have, r.need = 0, 4
	r.cont, r.contRR = nil, false
	if !r.last && r.dst != nil {
		switch r.op {
		case OpWrite:
			r.cont = r.reg
			r.contCtl = [2]byte{h[ddpControl] &^ ddpFlagLast, h[rdmapCtrl]}
			r.contSTag, r.contTO = h.STag(), h.TO()+uint64(r.payLen)
		case OpReadResponse:
			r.contRR = r.rrespOn && !r.rresp.sinkPaged
			r.contCtl = [2]byte{h[ddpControl] &^ ddpFlagLast, h[rdmapCtrl]}
			r.contSTag = h.STag()
		}
	}
	switch r.op {
	case OpWrite:
	case OpReadResponse:
		r.endReadResponse(h)
	case OpReadRequest:
		r.endReadRequest(h)
	case OpAtomicRequest:
		r.endAtomicRequest(h)
	case OpAtomicResp:
		r.endAtomicResponse(h)
	case OpImmediate, OpImmediateSE:
		r.endImmediate(h)
		r.publishSends()
	case OpTerminate:
		t := Terminate(h.Payload())
		code, _ := DecodeTerminateLenient(t)
		var op Opcode
		var known bool
		if t.Validate() == nil {
			if dh, ok := t.DDPHeader(); ok {
				op, known = dh.Opcode(), true
			}
		}
		r.state = rxDead
		r.qp.terminated(code, op, known)
	default:
		r.endSend(h)
		r.publishSends()
	}
}

// takeRecv takes the receive of the untagged message msn. With segment
// placement, the take and what it tells the placer happen together, under
// the placer's lock: the placer places a Send beyond a hole into the
// receive it will take (segPlacer.sendDst), and must not see the queue's
// head move without knowing.
//
// A queue with a refill function (RecvQueue.SetRefill) that is empty gets
// one more chance: the function runs, with rxMu held and the placer's
// lock not, and the take is tried again.
// +checklocks:r.qp.rxMu
func (r *receiver) takeRecv(msn uint32) bool {
	if r.takeRecvOnce(msn) {
		return true
	}
	return r.qp.cfg.RQ.runRefill() && r.takeRecvOnce(msn)
}

// +checklocks:r.qp.rxMu
func (r *receiver) takeRecvOnce(msn uint32) bool {
	qp, p, m := r.qp, r.seg, &r.cur
	if p == nil || p.rx == nil || qp.cfg.SharedRQ {
		return qp.cfg.RQ.take(&m.wqe)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !qp.cfg.RQ.take(&m.wqe) {
		return false
	}
	p.rxCur, p.rxCurMSN, p.rxCurID = true, msn, m.wqe.id
	p.rxCurSGL = append(p.rxCurSGL[:0], m.wqe.sgl...)
	p.rxNext = msn + 1
	r.pubActive, r.pubExpect = true, r.expect[QNSend]
	return true
}

// publishSends tells the segment placer, when it changed, the Send state
// takeRecv did not: a message ended, or an MSN passed without a receive.
// +checklocks:r.qp.rxMu
func (r *receiver) publishSends() {
	p, m := r.seg, &r.cur
	if p == nil || p.rx == nil || r.pubActive == m.active && r.pubExpect == r.expect[QNSend] {
		return
	}
	r.pubActive, r.pubExpect = m.active, r.expect[QNSend]
	p.mu.Lock()
	p.rxCur = m.active
	if m.active {
		p.rxNext = m.msn + 1
	} else {
		p.rxNext = r.expect[QNSend]
	}
	p.mu.Unlock()
}

// deliverPlaced delivers, in order, the FPDUs placed from segments that
// follow the receiver's position, as if the stream had handed them over:
// checks, the end of their messages and, for the short ones kept whole,
// their processing. It stops at the first FPDU not placed, or one the
// receiver stands inside. rxMu is held (the tap's feed).
// +checklocks:r.qp.rxMu
func (r *receiver) deliverPlaced() {
	if !r.seg.markers {
		r.deliverRun()
		return
	}
	// With markers the receiver is fed through the stripper, which must
	// stand at the same FPDU boundary (between its Writes, never inside an
	// FPDU); after delivering, it moves on to where the receiver stands,
	// and TCP's copy of what was delivered never reaches it (tcpFeed).
	// The tap checked the markers within each FPDU it placed.
	if r.mk.err != nil || r.mk.fr.state != mfStart || r.mk.data != r.offset {
		return
	}
	from := r.offset
	r.deliverRun()
	if r.offset != from && r.state != rxDead {
		r.mk.skipTo(r.offset)
	}
}

// deliverRun delivers the placed FPDUs that follow in order from r.offset.
// +checklocks:r.qp.rxMu
func (r *receiver) deliverRun() {
	for r.state == rxHeader && r.have == 0 {
		e, small := r.seg.takePlaced(r.offset)
		if e == nil {
			return
		}
		if small {
			r.Write(e.small)
			continue
		}
		r.taken = e
		at := r.offset
		r.start = at
		need := MPALengthSize + DDPHeader(e.hdr[MPALengthSize:]).HeaderSize()
		copy(r.hdr[:need], e.hdr[:need])
		r.have, r.need = need, need
		r.ulpdu = int(binary.BigEndian.Uint16(e.hdr[:]))
		r.op = DDPHeader(r.hdr[MPALengthSize:need]).Opcode()
		r.offset += uint64(e.total)
		r.onHeader() // finds e placed; checks it as the stream would
		if r.state == rxDead {
			return
		}
		if r.early != e {
			// Not the FPDU it was placed as (onHeader has ended the stream).
			return
		}
		r.early = nil
		if e.hasWord {
			storeWord(r.dst[r.payLen-4:], e.word[:])
		}
		r.payPos = r.payLen
		r.endFPDU()
		r.held.drop()
	}
}

// fedTo is where the stream's bytes go with segment placement, and how
// far it has had them: the receiver at its stream offset or, with markers,
// the stripper in front of it at its offset in the marked stream.
// +checklocks:r.qp.rxMu
func (r *receiver) fedTo() (io.Writer, uint64) {
	if r.seg.markers {
		return &r.mk, r.mk.wire
	}
	return r, r.offset
}

// drainAfter is how many bytes of the stream the tap has fed the receiver
// TCP may hold before they are read (some 40 small messages): reading
// them only drains TCP's queue, a round of locks and a wake-up per message
// (0.7 µs of CPU in a 2-byte TAP ping-pong's 12 µs round trip).
const drainAfter = 1024

// fedHeld is how many of the bytes TCP holds the tap has fed the receiver
// already (TCP takes a segment after the tap, so its copy of what was fed
// comes first), or -1 when what TCP holds is to be read now: without the
// tap's input, once the receiver is dead, and at drainAfter.
func (r *receiver) fedHeld() int {
	r.qp.rxMu.Lock()
	defer r.qp.rxMu.Unlock()
	if r.in != &r.tcp || r.state == rxDead {
		return -1
	}
	_, at := r.fedTo()
	if at < r.tcp.off || at-r.tcp.off >= drainAfter {
		return -1
	}
	return int(at - r.tcp.off)
}

// tcpFeed is the receiver's input with segment placement: the bytes TCP
// hands over, less those the tap fed the receiver first.
type tcpFeed struct {
	r   *receiver
	off uint64 // stream offset of the next byte TCP hands over
}

// Write skips what the receiver has had already, then feeds it the rest.
// The skipped bytes passed the tap's checks (the connection's, TCP's
// checksum and window, and the MPA CRC when negotiated); TCP's copy of
// them is the same segment's or its retransmission's.
// +checklocks:f.r.qp.rxMu
func (f *tcpFeed) Write(p []byte) (int, error) {
	n := len(p)
	off := f.off
	f.off += uint64(n)
	w, done := f.r.fedTo()
	if off < done {
		k := min(uint64(n), done-off)
		p = p[k:]
	}
	if len(p) > 0 {
		w.Write(p)
		// FPDUs the tap placed beyond a hole TCP has just filled are
		// delivered now, ahead of TCP handing them over.
		f.r.deliverPlaced()
	}
	return n, nil
}

// +checklocks:r.qp.rxMu
func (r *receiver) endSend(h DDPHeader) {
	qp := r.qp
	m := &r.cur
	if !m.active {
		// The zero-length Send RTR.
		r.expect[QNSend]++
		return
	}
	m.placed += r.payLen
	if !h.Last() {
		return
	}
	c := Completion{ID: m.wqe.id, Op: CompRecv, ByteLen: uint32(m.placed)}
	if r.op.Solicited() {
		c.Flags |= CompSolicited
	}
	if r.hasImm {
		// Send with Immediate: the Immediate Data came first.
		c.Flags |= CompWithImm
		c.Imm, r.hasImm = r.imm, false
	}
	m.active = false
	r.expect[QNSend]++
	if r.op.Invalidates() {
		stag := h.InvalidateSTag()
		// Only an STag the peer may access itself can be invalidated
		// remotely (see remoteInvalidate). A region registered for
		// local access only, such as one behind posted receives, is
		// never the peer's to take away. The fence waits for other QPs'
		// accesses; this one holds none while it waits.
		r.held.drop()
		if !qp.remoteInvalidate(qp.cfg.Mem.Lookup(stag)) {
			c.Status = StatusRemoteInvalidRequest
			qp.complete(qp.cfg.RecvCQ, c)
			r.fail(TermCode{LayerRDMAP, ETypeRemoteOperation, CodeCannotInvalidate}, len(h))
			return
		}
		c.Flags |= CompWithInvalidate
		c.InvalidatedRKey = stag
	}
	qp.complete(qp.cfg.RecvCQ, c)
}

// testHookReadResponseEnd, when set, runs when a Read Response's last
// segment has been placed, before its ORQ entry is completed.
var testHookReadResponseEnd func()

// +checklocks:r.qp.rxMu
func (r *receiver) endReadResponse(h DDPHeader) {
	r.rresp.placed += uint32(r.payLen)
	if !h.Last() {
		return
	}
	if testHookReadResponseEnd != nil {
		testHookReadResponseEnd()
	}
	placed := r.rresp.placed
	r.rresp, r.rrespOn = orqEntry{}, false
	qp := r.qp
	qp.mu.Lock()
	o := &qp.orq[qp.orqHead]
	if placed != o.size {
		qp.mu.Unlock()
		r.fail(TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPBaseBounds}, len(h))
		return
	}
	o.placed = placed
	c := Completion{ID: o.id, Op: CompRead, ByteLen: o.size}
	if o.probe {
		// The peer took the Immediate Data before it: the WR is done,
		// and the peer takes them.
		c.Op, c.ByteLen = wrCompOp(o.op), o.probeLen
		qp.immOK = true
	}
	report := o.signaled && !o.rtr
	inv := o.inv
	o.inv = nil
	qp.orqHead = (qp.orqHead + 1) % len(qp.orq)
	qp.orqN--
	more := qp.moreTXLocked()
	qp.mu.Unlock()
	if inv != nil && !r.readInvalidate(inv) {
		c.Status = StatusMWBind
		qp.retireORQ(&c)
		r.fail(TermCode{LayerRDMAP, ETypeRDMAPCatastrophic, CodeUnspecified}, len(h))
		return
	}
	if report {
		qp.retireORQ(&c)
	} else {
		qp.retireORQ(nil)
	}
	if more {
		qp.wake() // an ORQ slot is free again, and work may wait for it
	}
}

// +checklocks:r.qp.rxMu
func (r *receiver) endReadRequest(h DDPHeader) {
	qp := r.qp
	rr := ReadRequest(h.Payload())
	r.expect[QNReadReq]++
	var src []byte
	var reg *Region
	paged := false
	if rr.Size() > 0 {
		// Checked in checkReadRequest; the region may have been
		// deregistered since, which the lookup catches (and the TX path
		// holds it while it sends from it).
		reg = qp.cfg.Mem.Lookup(rr.SourceSTag())
		var ok bool
		if reg != nil && reg.Paged() {
			// The TX path takes the pieces (irqEntry.srcPaged).
			_, ok = reg.InBounds(rr.SourceTO(), uint64(rr.Size()))
			paged = true
		} else if reg != nil {
			src, ok = reg.Slice(rr.SourceTO(), uint64(rr.Size()))
		}
		if !ok {
			r.fail(TermCode{LayerRDMAP, ETypeRemoteProtection, CodeInvalidSTag}, len(h))
			return
		}
	}
	qp.mu.Lock()
	if qp.irqN == len(qp.irq) {
		qp.mu.Unlock()
		r.fail(TermCode{LayerRDMAP, ETypeRemoteOperation, CodeCatastrophicStream}, len(h))
		return
	}
	e := &qp.irq[(qp.irqHead+qp.irqN)%len(qp.irq)]
	*e = irqEntry{sinkSTag: rr.SinkSTag(), sinkTO: rr.SinkTO(), src: src, srcReg: reg,
		srcPaged: paged, srcTO: rr.SourceTO(), srcLen: uint64(rr.Size())}
	qp.irqN++
	qp.mu.Unlock()
	r.wakeTX()
}

// wakeTX has a queued response sent: by the TX goroutine, or, when the tap
// is feeding the receiver on the link's goroutine, by that goroutine once
// the feed is done (transmitter.respondInline). rxMu is held.
// +checklocks:r.qp.rxMu
func (r *receiver) wakeTX() {
	if r.tapFeed {
		r.respondDue.Store(true)
		return
	}
	r.qp.wake()
}

// endImmediate delivers an Immediate Data message: with the receive it
// took (the receive of an RDMA Write with Immediate), or, for a Send with
// Immediate, with the Send that follows.
// +checklocks:r.qp.rxMu
func (r *receiver) endImmediate(h DDPHeader) {
	qp := r.qp
	d := ImmediateData(h.Payload())
	r.expect[QNSend]++
	if d.ForSend() {
		r.imm, r.hasImm = d.Imm(), true
		return
	}
	m := &r.cur
	c := Completion{ID: m.wqe.id, Op: CompRecvRDMAWithImm, Flags: CompWithImm, Imm: d.Imm()}
	if r.op == OpImmediateSE {
		c.Flags |= CompSolicited
	}
	m.active = false
	qp.complete(qp.cfg.RecvCQ, c)
}

// endAtomicRequest executes an Atomic Request that passed its checks and
// its CRC, and queues its Atomic Response behind the Read Responses
// already due. The target is the host's 64-bit word at the (8-byte
// aligned) address: it is read and written with sync/atomic in the host's
// byte order, so the operation is atomic against every other atomic of
// this device (whichever QP it came on) and against the host program's
// own sync/atomic operations on the word. The operands and the original
// value travel in network byte order, as RFC 7306's fields do.
// +checklocks:r.qp.rxMu
func (r *receiver) endAtomicRequest(h DDPHeader) {
	qp := r.qp
	ar := AtomicRequest(h.Payload())
	r.expect[QNReadReq]++
	qp.mu.Lock()
	full := qp.irqN == len(qp.irq)
	qp.mu.Unlock()
	if full {
		r.fail(TermCode{LayerRDMAP, ETypeRemoteOperation, CodeCatastrophicStream}, len(h))
		return
	}
	// Checked in checkAtomicRequest; the region may have been
	// deregistered since, which the lookup and the hold catch.
	reg := qp.cfg.Mem.Lookup(ar.RemoteSTag())
	var word []byte
	ok := false
	if reg != nil {
		word, ok = reg.Slice(ar.RemoteTO(), AtomicTargetSize)
	}
	if !ok || !r.held.hold(reg) {
		r.fail(TermCode{LayerRDMAP, ETypeRemoteProtection, CodeInvalidSTag}, len(h))
		return
	}
	orig := executeAtomic((*uint64)(unsafe.Pointer(unsafe.SliceData(word))), ar)
	qp.mu.Lock()
	e := &qp.irq[(qp.irqHead+qp.irqN)%len(qp.irq)]
	*e = irqEntry{atomic: true, reqID: ar.RequestID(), original: orig}
	qp.irqN++
	qp.mu.Unlock()
	r.wakeTX()
}

// executeAtomic runs the request's operation on *p and returns the value
// *p had before it. Masks: CmpSwap compares the bits set in the Compare
// Mask and replaces those set in the Swap Mask; Swap replaces the bits set
// in the Swap Mask; FetchAdd's Add Mask marks field ends, past which no
// carry goes (0: one 64-bit add). libibverbs' operations (all-ones masks,
// Add Mask 0) take one atomic instruction; other masks a compare-and-swap
// loop.
func executeAtomic(p *uint64, ar AtomicRequest) uint64 {
	data, mask := ar.AddSwapData(), ar.AddSwapMask()
	switch ar.Op() {
	case AtomicFetchAdd:
		if mask == 0 {
			return atomic.AddUint64(p, data) - data
		}
		for {
			old := atomic.LoadUint64(p)
			if atomic.CompareAndSwapUint64(p, old, maskedAdd(old, data, mask)) {
				return old
			}
		}
	case AtomicSwap:
		if mask == ^uint64(0) {
			return atomic.SwapUint64(p, data)
		}
		for {
			old := atomic.LoadUint64(p)
			if atomic.CompareAndSwapUint64(p, old, old&^mask|data&mask) {
				return old
			}
		}
	default: // AtomicCmpSwap; checkAtomicRequest refused the rest
		cmp, cmpMask := ar.CompareData(), ar.CompareMask()
		for {
			old := atomic.LoadUint64(p)
			if (old^cmp)&cmpMask != 0 {
				return old // the comparison failed at this load
			}
			if atomic.CompareAndSwapUint64(p, old, old&^mask|data&mask) {
				return old
			}
		}
	}
}

// endAtomicResponse completes the atomic at the head of the ORQ: the
// original value goes to its 8-byte SGE in host byte order.
// +checklocks:r.qp.rxMu
func (r *receiver) endAtomicResponse(h DDPHeader) {
	qp := r.qp
	r.expect[QNAtomicResp]++
	qp.mu.Lock()
	o := qp.orq[qp.orqHead]
	qp.orq[qp.orqHead] = orqEntry{}
	qp.orqHead = (qp.orqHead + 1) % len(qp.orq)
	qp.orqN--
	more := qp.moreTXLocked()
	qp.mu.Unlock()
	c := Completion{ID: o.id, Op: wrCompOp(o.op), ByteLen: AtomicTargetSize}
	if !r.held.hold(o.sinkReg) {
		// Deregistered since the WR was posted.
		c.Status = StatusLocalProtection
		qp.retireORQ(&c)
		r.fail(TermCode{LayerRDMAP, ETypeRDMAPCatastrophic, CodeUnspecified}, len(h))
		return
	}
	v := AtomicResponse(h.Payload()).OriginalValue()
	if aligned8(o.sink) {
		atomic.StoreUint64((*uint64)(unsafe.Pointer(unsafe.SliceData(o.sink))), v)
	} else {
		binary.NativeEndian.PutUint64(o.sink, v)
	}
	r.n.placed += AtomicTargetSize
	if o.signaled {
		qp.retireORQ(&c)
	} else {
		qp.retireORQ(nil)
	}
	if more {
		qp.wake() // an ORQ slot is free again, and work may wait for it
	}
}

// aligned8 reports whether b starts at an 8-byte aligned address.
func aligned8(b []byte) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))&7 == 0
}

// openGate lets a responder's TX start (the gate of MPAStrict or
// peer-to-peer mode, and the first-FPDU hold): the initiator has spoken
// first, or the application knows it is past the MPA Reply. It reports
// whether the QP is the responder.
func (qp *QP) openGate() (responder bool) {
	qp.mu.Lock()
	responder = !qp.params.Initiator
	opened := qp.txGate
	qp.txGate = false
	if responder && qp.held {
		qp.held, opened = false, true
	}
	qp.mu.Unlock()
	if opened {
		qp.wake()
	}
	return responder
}

// firstFPDU is the receiver's news of the peer's first FPDU: a responder's
// TX may start, and its QP is established (IBV_EVENT_COMM_EST: the first
// message has arrived; an initiator's is established at Start).
func (qp *QP) firstFPDU() {
	if qp.openGate() {
		qp.event(Event{Type: EventEstablished})
	}
}
