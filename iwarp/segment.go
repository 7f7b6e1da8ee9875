package iwarp

import (
	"context"
	"encoding/binary"
	"fmt"
	"github.com/rdmatap/rdmatap/internal/lattrace"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/zerocopy"
)

// Segment placement: payload placed from TCP segments as they arrive,
// before TCP reassembles the stream (RFC 5041 allows placement out of
// order; delivery stays in order). A segment's way:
//
//  1. netstack's connection tap hands the segment over before IP and TCP
//     see it: 4-tuple, flags and TCP checksum checked, bytes already read
//     trimmed, and its offset in the receive stream (Conn.TapSegments).
//  2. Where it lies (seen): in order with no hole pending, it is left to
//     the receiver, which reads it from TCP a moment later, unless it is
//     short and the idle receiver waits for exactly it (fed, see below:
//     a small message's latency is two goroutine hand-offs less); filling the
//     hole the receiver waits at, it is fed to the receiver (feed), which
//     then delivers in order whatever was placed beyond (deliverPlaced);
//     beyond a hole, it is queued for the receive goroutine (or placed at
//     once when the source cannot keep packets).
//  3. Framing: an FPDU is placed only if it lies wholly in the segment, and
//     its start is trusted when an MPA marker in the segment points to it
//     (RFC 5044 §5, when markers were negotiated: the markers are removed
//     first, without a copy), when the in-order path or an earlier placed
//     FPDU has told where it is (the boundary the stream knows), or under
//     RFC 5044 Appendix A's rules for FPDU-aligned senders: the segment
//     begins with an FPDU, the FPDUs' lengths tile it exactly and, since a
//     guessed header is not proof, the MPA CRC (which must then be
//     negotiated) verifies. Anything else is left to the stream.
//  4. Checks: the MPA CRC (when negotiated) before a byte is placed; DDP
//     and RDMAP versions; STag, PD, access and bounds for an RDMA Write as
//     the in-order path checks them; for a Read Response, an outstanding
//     Read with that sink STag; for a Send, a known receive (sendDst). A
//     failed check only means "not here": the in-order path sees the same
//     FPDU and raises the Terminate.
//  5. Claim: an FPDU the in-order path has reached, or one placed already
//     (a duplicate or retransmission), is skipped; otherwise it is claimed.
//  6. Placement: one copy from packet memory into the region (held, see
//     Region); a Write's last aligned word waits for in-order delivery
//     (receiver.lastWord); short FPDUs that are not placed are kept whole.
//  7. In order, the receiver finds the FPDU placed, from the tap or from
//     TCP: it checks it as usual, does not copy its payload again, and
//     checks that it would have placed it where it was placed, and that
//     TCP delivered the same FPDU (its MPA CRC field, or the payload's
//     CRC32c without the CRC); a mismatch terminates the stream rather
//     than leave wrong data in place.

// Placement chooses how a QP places received payload.
type Placement uint8

const (
	// PlacementStream places payload from TCP's in-order stream only.
	PlacementStream Placement = iota
	// PlacementSegment also places payload from TCP segments as they
	// arrive beyond a hole, and delivers from them when a hole fills.
	PlacementSegment
)

func (p Placement) String() string {
	switch p {
	case PlacementStream:
		return "stream"
	case PlacementSegment:
		return "segment"
	}
	return fmt.Sprintf("Placement(%d)", uint8(p))
}

// ParsePlacement parses "stream" or "segment".
func ParsePlacement(s string) (Placement, error) {
	switch s {
	case "stream", "":
		return PlacementStream, nil
	case "segment":
		return PlacementSegment, nil
	}
	return 0, fmt.Errorf("%w: placement %q (want stream or segment)", ErrInvalidWR, s)
}

// SegmentSource is a Stream that can hand over its received segments
// (netstack.Conn).
type SegmentSource interface {
	TapSegments(fn func(off uint64, payload [][]byte), stats *netstack.ConnTapStats) (remove func(), err error)
}

// SegmentRetainer is a SegmentSource whose handler may keep a segment past
// its call (netstack.Conn), and which the receive goroutine can wait on
// together with the placer's wake-up.
type SegmentRetainer interface {
	TapSegmentsRetain(fn func(off uint64, payload [][]byte, retain func() netstack.Kept), stats *netstack.ConnTapStats) (remove func(), err error)
	WaitReadableOr(ctx context.Context, wake <-chan struct{}) error
}

// SegmentStats count what segment placement did (atomic).
type SegmentStats struct {
	netstack.ConnTapStats // segments refused before the DDP layer saw them

	PlacedBytes     atomic.Uint64 // payload bytes placed from segments, before TCP delivered them
	OutOfOrderBytes atomic.Uint64 // ... of which beyond a hole in the stream
	SendBytes       atomic.Uint64 // ... of which Send payload (the rest: RDMA Writes and Read Responses)
	ReadRespBytes   atomic.Uint64 // ... of which Read Response payload
	ByMarker        atomic.Uint64 // FPDUs located by an MPA marker
	ByStream        atomic.Uint64 // FPDUs located by a boundary the stream knew
	ByAlignment     atomic.Uint64 // FPDUs located by RFC 5044 Appendix A alignment
	Unframed        atomic.Uint64 // segments whose FPDU boundaries could not be established
	LeftInOrder     atomic.Uint64 // FPDUs not placed early by design: Sends, Reads, a message's last FPDU
	Refused         atomic.Uint64 // FPDUs left to the stream by a failed check (see RefusedCRC...)
	RefusedCRC      atomic.Uint64 // ... the MPA CRC did not verify
	RefusedHeader   atomic.Uint64 // ... DDP or RDMAP version, or no payload
	RefusedSTag     atomic.Uint64 // ... STag, PD, access or bounds check failed
	RefusedMarker   atomic.Uint64 // ... an MPA marker within the FPDU pointed elsewhere
	Duplicates      atomic.Uint64 // payload bytes of FPDUs placed already or reached in order
	Mismatches      atomic.Uint64 // placed FPDUs whose in-order bytes differed (stream terminated)
	FedBytes        atomic.Uint64 // payload bytes of hole-filling segments the tap fed the receiver (counted in PlacedBytes too)
	KeptBytes       atomic.Uint64 // payload bytes of in-order segments the tap kept and fed the receiver before TCP handed them over (counted in PlacedBytes too)
	FillsFed        atomic.Uint64 // hole-filling segments the receiver had from the tap (HoleFills counts only the timed ones)
	DeliveredEarly  atomic.Uint64 // FPDUs delivered in order by the tap, before TCP handed them over
	Queued          atomic.Uint64 // segments beyond a hole placed by the receive goroutine rather than the link's
	QuickFed        atomic.Uint64 // short segments in order fed to the idle receiver by the tap
	QuickFedBytes   atomic.Uint64 // ... their payload bytes (counted in PlacedBytes too)

	// Hole fills: a segment that filled a hole in the stream, and the
	// time from its arrival to the completion of the next message in
	// order (the one the hole held back), in nanoseconds.
	HoleFills, HoleFillNanos atomic.Uint64
	HoleFillHist             DurationHist // their times
}

// placedFPDU is an FPDU placed from a segment, waiting for the in-order
// path.
type placedFPDU struct {
	done   bool   // placement finished (false: under way)
	crc    uint32 // MPA CRC field with CRC negotiated, else the payload's CRC32c
	payLen int
	total  int // the whole FPDU's length

	// The MPA length and DDP header, for delivery without the stream's
	// bytes (see receiver.deliverPlaced).
	hdr [MPALengthSize + DDPUntaggedHeaderSize]byte
	// Where the payload went (its first byte), and for a Send the
	// receive's ID: the in-order path checks that it would have placed
	// the FPDU there.
	addr unsafe.Pointer
	wqe  uint64
	// The last aligned word of a Write's last FPDU, placed only when the
	// Write is delivered in order (see receiver.lastWord).
	word    [4]byte
	hasWord bool

	// small holds a whole short FPDU that is not placed (a zero-length
	// Send, a Read Request), kept so that the tap can deliver it in order
	// behind placed FPDUs; the in-order path treats it as not placed.
	small []byte
}

// quickFeed is the longest segment payload that arrives in order and is
// fed to an idle receiver from the tap (see placeRetain): longer ones are
// bulk, whose copy belongs on the receive goroutine, not the link's.
const quickFeed = 512

// smallFPDU is the longest FPDU kept whole for delivery from the tap.
const smallFPDU = 64

// segPlacer places one QP's segments. Its methods run on netstack's link
// goroutine (place), serialized per connection by netstack, and on the
// receive path (claimInOrder); mu guards the state they share.
//
// Locks: placeMu guards the placement scratch, mu the shared state (the
// fields marked with each); front, nrec, parsed and nkept are atomics
// read without mu. The package's Locks section has who takes them and
// their order.
// +checklocksalias:rx.qp.rxMu=qp.rxMu
type segPlacer struct {
	qp      *QP
	crcOn   bool
	markers bool // the peer inserts MPA markers: the tap's offsets are the marked stream's
	// The marked segment being placed (markers): its views, offset, size,
	// and the views of its FPDU stream (the runs between the markers).
	// +checklocks:placeMu
	wv segView
	// +checklocks:placeMu
	woff uint64
	// +checklocks:placeMu
	wn int
	// +checklocks:placeMu
	dv segView

	stats *SegmentStats
	// +checklocks:placeMu
	held holds
	// +checklocks:placeMu
	hdr [MPALengthSize + DDPUntaggedHeaderSize]byte
	// A Send's destination being resolved (sendDst).
	// +checklocks:placeMu
	ssge []SGE
	// +checklocks:placeMu
	sdst zerocopy.SGList
	// +checklocks:placeMu
	sregs []*Region

	// placeMu serializes placement (the scratch fields above): the link's
	// goroutine and, for queued segments, the receive goroutine.
	placeMu sync.Mutex
	// +checklocks:mu
	jobs []segJob      // segments beyond a hole for the receive goroutine (mu)
	wake chan struct{} // wakes the receive goroutine for jobs
	// fedWake (ManualProgress QPs) wakes a WaitProgress caller once the
	// tap has fed the receiver: what was fed may be what it waits for.
	fedWake chan struct{}
	// fedN counts the feeds that sent on fedWake: a WaitProgress caller
	// woken by one returns at once, without reading the stream.
	fedN atomic.Uint64

	mu    sync.Mutex
	front atomic.Uint64 // FPDUs starting before front belong to the in-order path (written by it)
	nrec  atomic.Int64  // records in placed (the in-order path skips the lock while there are none)
	// parsed is how far the receiver has parsed the stream: bytes it has
	// had were seen, whether or not the tap saw their segments (those
	// that arrived before the tap was installed, or that it refused and
	// TCP took).
	parsed atomic.Uint64
	// +checklocks:mu
	known map[uint64]struct{} // FPDU starts the stream or placed FPDUs told
	// +checklocks:mu
	after map[uint64]uint64 // segment end -> the FPDU start its cut FPDU told
	// +checklocks:mu
	prune int // prune known and after beyond this size
	// +checklocks:mu
	placed map[uint64]*placedFPDU
	// +checklocks:mu
	starts startQueue // of placed, lowest first
	// +checklocks:mu
	contig uint64 // end of the contiguous data the tap has seen
	// +checklocks:mu
	ahead spans // the ranges of segments seen beyond contig
	// +checklocks:mu
	removed bool
	// +checklocks:mu
	busy    int  // place calls under way
	observe bool // place nothing: only time hole fills (QPConfig.TimeHoleFills)
	// +checklocks:mu
	fillAt time.Time // arrival of the last segment that filled a hole, zero once timed
	// +checklocks:mu
	fillEnd uint64 // the end of the contiguous data that segment made

	// rx is the QP's receiver, fed from the tap when a segment fills the
	// hole it waits at (nil: no delivery from the tap, as with markers).
	rx *receiver
	// The receiver's Send state (see sendDst): the message under way and
	// its receive, and the MSN of the next untagged message.
	// +checklocks:mu
	rxCur bool
	// +checklocks:mu
	rxCurMSN uint32
	// +checklocks:mu
	rxCurID uint64
	// +checklocks:mu
	rxCurSGL []SGE
	// +checklocks:mu
	rxNext uint32
	// kept are the latest segments that reached the tap in order (and hole
	// fillers), their packets retained (no copy) until the receiver has
	// parsed their bytes, oldest first from kh (mu). TCP's processor
	// goroutine runs behind the link's: when a segment fills the hole the
	// receiver waits at, TCP may not have taken the segments in front of
	// it yet, and the tap feeds the receiver these instead of leaving the
	// fill to wait for TCP (feedKept).
	// Keeping costs a clean stream some 4% of its throughput (a packet
	// reference taken and dropped per segment), so the tap keeps only
	// while holes come: for keepAfterHole segments after the last one.
	// +checklocks:mu
	kept [maxKept]keptSeg
	// +checklocks:mu
	kh int
	// +checklocks:mu
	kn    int
	nkept atomic.Int32 // kn, read without mu
	// +checklocks:mu
	keepFor int // segments still to keep

	// eager places segments that arrive in order too, rather than leave
	// them to the receiver (the unit tests of the framing rules, which
	// have no receiver, use it).
	eager bool
}

func newSegPlacer(qp *QP, crcOn, markers bool) *segPlacer {
	p := &segPlacer{qp: qp, crcOn: crcOn, markers: markers, known: map[uint64]struct{}{0: {}}, placed: map[uint64]*placedFPDU{},
		after: map[uint64]uint64{}, prune: 256}
	p.wake = make(chan struct{}, 1)
	p.stats = qp.cfg.SegStats
	if p.stats == nil {
		p.stats = new(SegmentStats)
	}
	return p
}

// segView is a segment's payload: views into packet memory.
type segView [][]byte

// copyOut copies bytes [off, off+len(dst)) of the views into dst.
func (v segView) copyOut(dst []byte, off int) {
	for _, b := range v {
		if off >= len(b) {
			off -= len(b)
			continue
		}
		c := copy(dst, b[off:])
		dst = dst[c:]
		off = 0
		if len(dst) == 0 {
			return
		}
	}
}

// crc folds bytes [off, off+n) of the views into crc.
func (v segView) crc(crc uint32, off, n int) uint32 {
	for _, b := range v {
		if n == 0 {
			break
		}
		if off >= len(b) {
			off -= len(b)
			continue
		}
		c := min(len(b)-off, n)
		crc = zerocopy.UpdateCRC32C(crc, b[off:off+c])
		n -= c
		off = 0
	}
	return crc
}

// place copies bytes [off, off+len(dst)) into dst; with crc non-nil it
// folds their CRC32c into *crc in the same pass.
func (v segView) place(dst []byte, off int, crc *uint32) {
	for _, b := range v {
		if len(dst) == 0 {
			break
		}
		if off >= len(b) {
			off -= len(b)
			continue
		}
		c := min(len(b)-off, len(dst))
		if crc != nil {
			_, *crc = zerocopy.PlaceCRC(dst[:c], b[off:off+c], *crc)
		} else {
			zerocopy.Place(dst[:c], b[off:off+c])
		}
		dst = dst[c:]
		off = 0
	}
}

func (v segView) size() int {
	n := 0
	for _, b := range v {
		n += len(b)
	}
	return n
}

// place handles one segment whose first byte is at stream offset off.
func (p *segPlacer) place(off uint64, payload [][]byte) { p.placeRetain(off, payload, nil) }

// placeRetain is place for a source that can keep a segment's packet
// memory after its callback (retain): a segment beyond a hole is then
// queued for the QP's receive goroutine, which is idle while TCP holds the
// stream back, rather than placed on the link's goroutine, which every
// packet of the stack goes through.
func (p *segPlacer) placeRetain(off uint64, payload [][]byte, retain func() netstack.Kept) {
	p.placeMu.Lock()
	defer p.placeMu.Unlock()
	v, off, n, mfirst, marked := p.view(segView(payload), off)
	// Every segment counts for the contiguous data the tap has seen, a
	// short one too (a hole left by it would never fill).
	p.mu.Lock()
	if p.removed {
		p.mu.Unlock()
		return
	}
	arrival := p.seen(off, off+uint64(n))
	if arrival == segAhead {
		p.keepFor = keepAfterHole
	}
	if (arrival == segInOrder || arrival == segFill) && retain != nil && p.rx != nil && !p.observe && (p.keepFor > 0 || p.kn > 0) {
		p.keep(payload, off, n, retain)
	}
	if p.observe || (arrival == segInOrder || arrival == segOld) && !p.eager {
		// In order, the stream places the segment as soon as the
		// receiver reads it: placing it here would only move the copy
		// onto the link's goroutine, ahead of TCP. A short one, though,
		// is fed to an idle receiver that waits for exactly it: its
		// message completes now, not after TCP's goroutine has taken
		// the segment and woken the receive goroutine (two hand-offs of
		// a small message's latency).
		quick := arrival == segInOrder && !p.observe && p.rx != nil && n <= quickFeed
		if quick {
			p.busy++
		}
		p.mu.Unlock()
		if quick {
			ok, delivered := p.feed(v, off, n, true)
			p.wv = nil
			clear(p.dv)
			if p.rx.respondDue.Swap(false) {
				// A short Read (or atomic) Request was fed: its
				// response goes out now, from this goroutine.
				p.qp.tx.respondInline()
			}
			p.mu.Lock()
			p.busy--
			p.mu.Unlock()
			if ok {
				p.stats.QuickFed.Add(1)
			}
			if delivered > 0 {
				// The consumer of what was delivered was just made
				// runnable on this P, behind this goroutine's work for
				// the rest of the packet (TCP's share, the next packet):
				// let it run first. In-memory ping-pong: 21–23 µs
				// round trips with this, 25 µs without, on 2 cores.
				runtime.Gosched()
			}
		} else {
			p.wv = nil
			clear(p.dv)
		}
		return
	}
	if arrival == segAhead && retain != nil && len(p.jobs) < maxSegJobs {
		// Queued as it came (with markers, the marked segment: the
		// receive goroutine removes them again).
		woff := off
		if p.markers {
			woff = p.woff
			p.wv = nil
			clear(p.dv)
		}
		p.jobs = append(p.jobs, segJob{off: woff, views: slices.Clone(payload), hold: retain()})
		p.mu.Unlock()
		p.stats.Queued.Add(1)
		select {
		case p.wake <- struct{}{}:
		default:
		}
		return
	}
	p.busy++
	p.mu.Unlock()
	p.frame(v, off, n, arrival, marked, mfirst)
}

// segJob is a segment beyond a hole queued for the receive goroutine, its
// packet memory kept until release.
type segJob struct {
	off   uint64
	views [][]byte
	hold  netstack.Kept
}

// keptSeg is a segment the tap kept for the receiver (segPlacer.kept).
type keptSeg struct {
	off, end uint64 // its bytes' offsets in the receiver's input (fedTo's: the marked stream with markers)
	dend     uint64 // its end in the FPDU stream
	views    [maxKeptViews][]byte
	nv       int
	hold     netstack.Kept
}

const (
	// maxKept bounds the kept segments: TCP's processor lags the link by
	// a few segments; the oldest are let go first.
	maxKept = 64
	// maxKeptViews: a segment in more views is not kept.
	maxKeptViews = 4
	// keepAfterHole is how many segments the tap keeps after a hole
	// appeared (segPlacer.keepFor).
	keepAfterHole = 8192
)

// keep keeps a segment that arrived in order (placeRetain: the segment at
// stream offset off, n octets of the FPDU stream; its raw views and, with
// markers, p.woff); p.mu is held.
// +checklocks:p.mu
// +checklocks:p.placeMu
func (p *segPlacer) keep(payload [][]byte, off uint64, n int, retain func() netstack.Kept) {
	parsed := p.parsed.Load()
	for p.kn > 0 && (p.kept[p.kh].dend <= parsed || p.kn == maxKept) {
		p.popKept().hold.Release()
	}
	if p.keepFor <= 0 || len(payload) > maxKeptViews || off+uint64(n) <= parsed {
		return
	}
	p.keepFor--
	woff, wn := off, n
	if p.markers {
		woff, wn = p.woff, p.wn
	}
	e := &p.kept[(p.kh+p.kn)%maxKept]
	e.off, e.end, e.dend, e.nv = woff, woff+uint64(wn), off+uint64(n), copy(e.views[:], payload)
	e.hold = retain()
	p.kn++
	p.nkept.Store(int32(p.kn))
}

// popKept takes the oldest kept segment off the ring; p.mu is held.
// +checklocks:p.mu
func (p *segPlacer) popKept() keptSeg {
	e := p.kept[p.kh]
	p.kept[p.kh] = keptSeg{}
	p.kh = (p.kh + 1) % maxKept
	p.kn--
	p.nkept.Store(int32(p.kn))
	return e
}

// feedKept feeds the receiver (rxMu held) the kept segments that continue
// its input, until it has had the octets before offset to (fedTo's
// offsets) or the kept ones stop short. They passed the tap's checks, as
// a hole filler does; TCP's copy of them is skipped when it comes
// (tcpFeed).
// +checklocks:p.rx.qp.rxMu
func (p *segPlacer) feedKept(to uint64) {
	r := p.rx
	placed := r.n.placed
	for r.state != rxDead {
		w, at := r.fedTo()
		if at >= to {
			break
		}
		var e keptSeg
		found := false
		p.mu.Lock()
		for p.kn > 0 {
			k := &p.kept[p.kh]
			if k.end <= at {
				p.popKept().hold.Release() // had from TCP
				continue
			}
			if k.off <= at {
				e, found = p.popKept(), true
			}
			break
		}
		p.mu.Unlock()
		if !found {
			break
		}
		skip := int(at - e.off)
		for _, b := range e.views[:e.nv] {
			if skip >= len(b) {
				skip -= len(b)
				continue
			}
			w.Write(b[skip:])
			skip = 0
		}
		e.hold.Release()
	}
	fed := r.n.placed - placed
	p.stats.KeptBytes.Add(fed)
	p.stats.PlacedBytes.Add(fed)
}

// maxSegJobs bounds the queue; beyond it, segments are placed at once.
const maxSegJobs = 1024

// work places the queued segments (the receive goroutine's share) and
// reports whether there were any.
func (p *segPlacer) work() bool {
	any := false
	for {
		p.placeMu.Lock()
		j, ok := p.nextJob()
		if ok {
			p.runJob(j)
		}
		p.placeMu.Unlock()
		if !ok {
			return any
		}
		any = true
	}
}

// workLocked places every queued segment now; placeMu is held (a segment
// that fills the receiver's hole: what lies beyond must be placed before
// it can be delivered).
// +checklocks:p.placeMu
func (p *segPlacer) workLocked() {
	for {
		j, ok := p.nextJob()
		if !ok {
			return
		}
		p.runJob(j)
	}
}

func (p *segPlacer) nextJob() (segJob, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.jobs) == 0 {
		return segJob{}, false
	}
	j := p.jobs[0]
	p.jobs[0] = segJob{}
	p.jobs = p.jobs[1:]
	if p.removed {
		j.hold.Release()
		return segJob{}, false // stop releases the rest
	}
	p.busy++
	return j, true
}

// runJob places a queued segment (its busy count taken) and releases it.
// +checklocks:p.placeMu
func (p *segPlacer) runJob(j segJob) {
	v, off, n, mfirst, marked := p.view(segView(j.views), j.off)
	p.frame(v, off, n, segAhead, marked, mfirst)
	j.hold.Release()
}

// framed ends frame: the regions placed into and the packet's memory are
// let go, and the segment's busy count is returned.
// +checklocks:p.placeMu
func (p *segPlacer) framed() {
	p.held.drop()
	p.wv = nil
	clear(p.dv) // packet memory: not to be held past the callback
	p.mu.Lock()
	p.busy--
	p.mu.Unlock()
}

// frame finds the FPDUs of a segment that is not in order and places them
// (or, filling the receiver's hole, feeds it to the receiver). p.busy was
// counted for it; placeMu is held.
// +checklocks:p.placeMu
func (p *segPlacer) frame(v segView, off uint64, n, arrival int, marked bool, mfirst uint64) {
	defer p.framed()
	if arrival == segFill && p.rx != nil {
		// What was queued beyond the hole is placed first, so that the
		// receiver can be handed all of it.
		if p.markers {
			// The queued segments use the scratch views: this one's
			// are made again after them.
			wv, woff, wn := p.wv, p.woff, p.wn
			p.workLocked()
			p.wv, p.woff, p.wn = wv, woff, wn
			p.demark(wv, woff, wn)
			v = p.dv
		} else {
			p.workLocked()
		}
		if ok, _ := p.feed(v, off, n, false); ok {
			return
		}
	}
	// The first FPDU start the stream knows in this segment: with GSO or
	// TSO, segments are cut anywhere, and an FPDU that began in an earlier
	// segment told where the next one starts.
	first, known := off, false
	p.mu.Lock()
	if marked {
		first, known = mfirst, true
	} else if _, ok := p.known[off]; ok {
		known = true
	} else if k, ok := p.after[off]; ok && k < off+uint64(n) {
		first, known = k, true
	}
	p.mu.Unlock()
	behind := arrival == segAhead
	pos := 0
	if known {
		pos = int(first - off)
	} else if p.markers || !(p.crcOn && p.tiles(v, n)) {
		p.stats.Unframed.Add(1)
		return
	}
	for pos+MPALengthSize+DDPTaggedHeaderSize <= n {
		v.copyOut(p.hdr[:], pos)
		total := FPDULen(int(binary.BigEndian.Uint16(p.hdr[:])))
		if pos+total > n {
			// Cut by the segment: the stream places it, but its
			// header tells where the next FPDU starts. (Trusted as
			// far as the start it was read at: known, or verified.)
			p.mu.Lock()
			if end := off + uint64(n); end >= p.front.Load() {
				p.after[end] = off + uint64(pos+total)
				p.bound()
			}
			p.mu.Unlock()
			return
		}
		byMarker := marked && off+uint64(pos) == mfirst
		if !p.placeFPDU(v, off+uint64(pos), pos, total, behind, known, byMarker) {
			return
		}
		pos += total
	}
}

// view returns the FPDU stream of the segment v at stream offset off, its
// offset and size: the segment itself or, with markers, its runs between
// the markers (p.dv; p.wv keeps the marked segment), with the FPDU start a
// marker in it points to (marked). placeMu is held.
// +checklocks:p.placeMu
func (p *segPlacer) view(v segView, off uint64) (dv segView, doff uint64, n int, mfirst uint64, marked bool) {
	if !p.markers {
		return v, off, v.size(), 0, false
	}
	p.wv, p.woff, p.wn = v, off, v.size()
	doff, mfirst, marked = p.demark(v, off, p.wn)
	return p.dv, doff, p.dv.size(), mfirst, marked
}

// demark removes the markers from a marked segment at stream offset off
// (n octets): p.dv gets its FPDU-stream octets (sub-slices, no copy), and
// it returns their offset in the FPDU stream and the first FPDU start a
// marker in the segment points to that lies in the segment (RFC 5044 §5:
// a marker's FPDUPTR points back to the FPDU it is in, or, zero, to the
// one right after it).
// +checklocks:p.placeMu
func (p *segPlacer) demark(v segView, off uint64, n int) (doff, first uint64, ok bool) {
	p.dv = p.dv[:0]
	pos := off
	for _, b := range v {
		for len(b) > 0 {
			r := pos % MPAMarkerInterval
			k := uint64(len(b))
			if r < MPAMarkerSize {
				k = min(k, MPAMarkerSize-r) // marker octets: dropped
			} else {
				k = min(k, MPAMarkerInterval-r)
				p.dv = append(p.dv, b[:k])
			}
			b, pos = b[k:], pos+k
		}
	}
	end := off + uint64(n)
	var mk [MPAMarkerSize]byte
	for m := (off + MPAMarkerInterval - 1) / MPAMarkerInterval * MPAMarkerInterval; m+MPAMarkerSize <= end; m += MPAMarkerInterval {
		v.copyOut(mk[:], int(m-off))
		if s := MarkerFPDUStart(m, MPAMarker(mk[:])); s >= off && s < end && s%MPAMarkerInterval >= MPAMarkerSize {
			return MarkerDataOffset(off), MarkerDataOffset(s), true
		}
	}
	return MarkerDataOffset(off), 0, false
}

// wireCRC checks the CRC of the FPDU at FPDU-stream offset at (total
// octets) in the marked segment: RFC 5044 computes it over the FPDU as it
// travels, markers inside it included. It returns the CRC field.
// +checklocks:p.placeMu
func (p *segPlacer) wireCRC(at uint64, total int) (uint32, bool) {
	ws := MarkerWireOffset(at)
	we := MarkerWireOffset(at+uint64(total)-1) + 1
	if ws < p.woff || we > p.woff+uint64(p.wn) {
		return 0, false
	}
	var c [MPACRCSize]byte
	p.wv.copyOut(c[:], int(we-MPACRCSize-p.woff))
	field := binary.LittleEndian.Uint32(c[:])
	return field, p.wv.crc(0, int(ws-p.woff), int(we-MPACRCSize-ws)) == field
}

// What checkMarkers found.
const (
	markersGood   = iota
	markersBad    // a marker points elsewhere
	markersUnseen // the marker right before the FPDU is not in the segment
)

// checkMarkers checks the markers of the FPDU at FPDU-stream offset at
// (total octets) in the marked segment being placed, as the in-order
// path's stripper would (RFC 5044 §5): each marker within the FPDU points
// back to its ULPDU_Length field, and one right before it, at the
// boundary, points nowhere. An FPDU the tap places may be delivered
// without passing the stripper, so every marker it carries, the boundary
// one included, must have been checked here.
// +checklocks:p.placeMu
func (p *segPlacer) checkMarkers(at uint64, total int) int {
	ws := MarkerWireOffset(at)
	we := MarkerWireOffset(at+uint64(total)-1) + 1
	var mk [MPAMarkerSize]byte
	for m := ws - ws%MPAMarkerInterval; m < we; m += MPAMarkerInterval {
		want := m - ws
		if m < ws {
			if m+MPAMarkerSize != ws {
				continue // inside the FPDU before: checked with it
			}
			want = 0
		}
		if m < p.woff || m+MPAMarkerSize > p.woff+uint64(p.wn) {
			// Only the boundary marker can lie outside: the FPDU is
			// whole in the segment.
			return markersUnseen
		}
		p.wv.copyOut(mk[:], int(m-p.woff))
		if uint64(MPAMarker(mk[:]).FPDUPtr()) != want {
			return markersBad
		}
	}
	return markersGood
}

// How a segment arrived, relative to the contiguous data the tap has seen.
const (
	segInOrder = iota // it extends the contiguous data, and no hole lies beyond
	segOld            // it holds nothing new
	segFill           // it fills (part of) a hole: segments lie beyond it
	segAhead          // a hole lies before it
)

// seen records that the tap saw bytes [start, end) and tells how they
// arrived; p.mu is held.
// +checklocks:p.mu
func (p *segPlacer) seen(start, end uint64) int {
	if d := p.parsed.Load(); d > p.contig {
		p.contig = p.ahead.advance(d)
	}
	if start > p.contig {
		p.ahead.add(start, end)
		return segAhead
	}
	if end <= p.contig {
		return segOld
	}
	arrival := segInOrder
	if len(p.ahead) > 0 {
		p.fillAt = time.Now() // the segment fills (part of) a hole
		arrival = segFill
	}
	p.contig = p.ahead.advance(max(p.contig, end))
	if arrival == segFill {
		p.fillEnd = p.contig
	}
	return arrival
}

// spans are the byte ranges seen beyond the contiguous data: sorted,
// disjoint and not adjacent (merged as they come).
type spans [][2]uint64

// maxSpans bounds the ranges kept (a peer's scattered segments may not
// grow it without bound): the farthest are forgotten, which only costs
// their bytes' count as out of order and a later hole fill's timing.
const maxSpans = 4096

// add records [start, end).
func (s *spans) add(start, end uint64) {
	v := *s
	// The first range that ends at or after start.
	i := sort.Search(len(v), func(i int) bool { return v[i][1] >= start })
	j := i
	for j < len(v) && v[j][0] <= end {
		start, end = min(start, v[j][0]), max(end, v[j][1])
		j++
	}
	switch {
	case i == j:
		v = slices.Insert(v, i, [2]uint64{start, end})
	default:
		v[i] = [2]uint64{start, end}
		v = slices.Delete(v, i+1, j)
	}
	if len(v) > maxSpans {
		v = v[:maxSpans]
	}
	*s = v
}

// advance returns how far the contiguous data reaches from contig with the
// ranges that join it, and drops those.
func (s *spans) advance(contig uint64) uint64 {
	v := *s
	k := 0
	for k < len(v) && v[k][0] <= contig {
		contig = max(contig, v[k][1])
		k++
	}
	*s = slices.Delete(v, 0, k)
	return contig
}

// tiles reports whether the segment holds whole FPDUs end to end (RFC 5044
// Appendix A: an aligned sender starts every segment with an FPDU and
// never splits one).
func (p *segPlacer) tiles(v segView, n int) bool {
	var l [MPALengthSize]byte
	pos := 0
	for pos+MPALengthSize <= n {
		v.copyOut(l[:], pos)
		ulpdu := int(binary.BigEndian.Uint16(l[:]))
		if ulpdu < DDPUntaggedHeaderSize && ulpdu < DDPTaggedHeaderSize {
			return false
		}
		pos += FPDULen(ulpdu)
	}
	return pos == n
}

// placeFPDU checks and places the FPDU at stream offset at (segment offset
// pos, total bytes).
//
// An FPDU at a start nobody told (aligned) is believed only once its CRC
// verifies; false stops the segment there.
// +checklocks:p.placeMu
func (p *segPlacer) placeFPDU(v segView, at uint64, pos, total int, behind, known, byMarker bool) bool {
	h := DDPHeader(p.hdr[MPALengthSize:])
	ulpdu := int(binary.BigEndian.Uint16(p.hdr[:]))
	op := h.Opcode()
	hs := h.HeaderSize()
	payLen := ulpdu - hs
	// What is placed: tagged payload by STag and TO (RDMA Write, Read
	// Response); a Send's payload into the receive its MSN selects, when
	// that receive is known (see sendDst).
	placing := payLen > 0 && (h.Tagged() && (op == OpWrite || op == OpReadResponse) ||
		!h.Tagged() && op.IsSend() && h.QN() == QNSend && p.rx != nil && !p.qp.cfg.SharedRQ)
	var fpduCRC uint32
	if p.crcOn && (placing || !known) {
		var ok bool
		if p.markers {
			fpduCRC, ok = p.wireCRC(at, total)
		} else {
			var c [MPACRCSize]byte
			v.copyOut(c[:], pos+total-MPACRCSize)
			fpduCRC = binary.LittleEndian.Uint32(c[:])
			ok = v.crc(0, pos, total-MPACRCSize) == fpduCRC
		}
		if !ok {
			p.stats.Refused.Add(1)
			p.stats.RefusedCRC.Add(1)
			return false
		}
	}
	if p.markers {
		switch p.checkMarkers(at, total) {
		case markersBad:
			// The in-order path meets the bad marker and terminates.
			p.stats.Refused.Add(1)
			p.stats.RefusedMarker.Add(1)
			return false
		case markersUnseen:
			// Its boundary marker came in an earlier segment: the
			// stream checks it, and places the FPDU.
			p.stats.LeftInOrder.Add(1)
			p.learn(at + uint64(total))
			return true
		}
	}
	if byMarker {
		p.stats.ByMarker.Add(1)
	} else if known {
		p.stats.ByStream.Add(1)
	} else {
		p.stats.ByAlignment.Add(1)
	}
	if !placing {
		p.stats.LeftInOrder.Add(1)
		if total <= smallFPDU && p.rx != nil {
			// Kept whole, so the tap can deliver it in order behind the
			// placed FPDUs before it.
			if e := p.claim(at, total, 0); e != nil {
				e.small = make([]byte, total)
				v.copyOut(e.small, pos)
				p.finished(e, 0)
			}
			return true
		}
		p.learn(at + uint64(total))
		return true
	}
	if h.DDPVersion() != DDPVersion || h.RDMAPVersion() != RDMAPVersion {
		p.stats.Refused.Add(1)
		p.stats.RefusedHeader.Add(1)
		return false
	}
	var dst []byte
	var sgl zerocopy.SGList
	var wqe uint64
	var ok, paged bool
	switch {
	case op == OpWrite:
		dst, ok, paged = p.writeDst(h, payLen)
	case op == OpReadResponse:
		dst, ok, paged = p.readResponseDst(h, payLen)
	default:
		sgl, wqe, ok = p.sendDst(h, payLen)
		if !ok {
			// No receive known for it yet: the stream places it.
			p.stats.LeftInOrder.Add(1)
			p.learn(at + uint64(total))
			return true
		}
	}
	if paged {
		// Memory over separate pages: the stream places it.
		p.stats.LeftInOrder.Add(1)
		p.learn(at + uint64(total))
		return true
	}
	if !ok {
		p.stats.Refused.Add(1)
		p.stats.RefusedSTag.Add(1)
		p.learn(at + uint64(total))
		return true
	}
	e := p.claim(at, total, payLen)
	if e == nil {
		p.stats.Duplicates.Add(uint64(payLen))
		return true
	}
	copy(e.hdr[:], p.hdr[:MPALengthSize+hs])
	e.wqe = wqe
	if dst != nil {
		e.addr = unsafe.Pointer(unsafe.SliceData(dst))
	} else {
		e.addr = sglAddr(sgl, int(h.MO()))
	}
	if op == OpWrite && h.Last() && lastWordAligned(dst, payLen) {
		// The Write's last word waits for its in-order delivery.
		dst = dst[:payLen-4]
		v.copyOut(e.word[:], pos+total-FPDUPad(ulpdu)-MPACRCSize-4)
		e.hasWord = true
	}

	// The receiver checks what TCP delivers against the FPDU's CRC field
	// when it has one to check (CRC on, no markers: the CRC was verified
	// above, so the copy need not compute it again); otherwise against
	// the payload's CRC32c, computed in the copy.
	payOff := pos + MPALengthSize + hs
	withCRC := !(p.crcOn && !p.markers)
	crc := fpduCRC
	if withCRC {
		crc = 0
	}
	if dst != nil {
		if withCRC {
			v.place(dst, payOff, &crc)
		} else {
			v.place(dst, payOff, nil)
		}
	} else {
		crc = v.scatter(sgl, int(h.MO()), payOff, payLen, withCRC, crc)
	}
	if e.hasWord && withCRC {
		crc = zerocopy.UpdateCRC32C(crc, e.word[:])
	}
	p.finished(e, crc)
	p.stats.PlacedBytes.Add(uint64(payLen))
	switch {
	case op == OpReadResponse:
		p.stats.ReadRespBytes.Add(uint64(payLen))
	case op != OpWrite:
		p.stats.SendBytes.Add(uint64(payLen))
	}
	if behind {
		p.stats.OutOfOrderBytes.Add(uint64(payLen))
	}
	if s := p.qp.cfg.Stats; s != nil {
		s.PlacementCopies.Add(1)
		s.PlacedBytes.Add(uint64(payLen))
	}
	return true
}

// writeDst is where an RDMA Write's payload goes, checked as the in-order
// path checks it (STag, PD, access, bounds), with its region held. paged:
// the region lies over separate pages, which the placer leaves to the
// stream (so the in-order path never meets a payload placed in pieces).
// +checklocks:p.placeMu
func (p *segPlacer) writeDst(h DDPHeader, payLen int) (dst []byte, ok, paged bool) {
	qp := p.qp
	reg := qp.cfg.Mem.Lookup(h.STag())
	if reg == nil || !reg.Associated(qp.cfg.PD, qp.cfg.Num) || reg.Access&AccessRemoteWrite == 0 || h.TO()+uint64(payLen) < h.TO() {
		return nil, false, false
	}
	if reg.Paged() {
		return nil, false, true
	}
	dst, ok = reg.Slice(h.TO(), uint64(payLen))
	return dst, ok && p.held.hold(reg), false
}

// readResponseDst is where a Read Response's payload goes: the sink of the
// outstanding Read whose STag it names, at its TO (RFC 5040: a Read
// Response is tagged by the Read's sink STag and TO), with the sink's
// region held. The in-order path checks the response against the oldest
// outstanding Read, as ever.
// +checklocks:p.placeMu
func (p *segPlacer) readResponseDst(h DDPHeader, payLen int) (dst []byte, ok, paged bool) {
	qp := p.qp
	qp.mu.Lock()
	defer qp.mu.Unlock()
	for i := 0; i < qp.orqN; i++ {
		o := &qp.orq[(qp.orqHead+i)%len(qp.orq)]
		if o.op != WRRead || o.rtr || o.sinkSTag != h.STag() || h.TO() < o.sinkTO {
			continue
		}
		off := h.TO() - o.sinkTO
		if off+uint64(payLen) > uint64(o.size) || o.sinkReg == nil {
			return nil, false, false
		}
		if o.sinkPaged {
			return nil, false, true
		}
		dst := o.sink[off : off+uint64(payLen)]
		return dst, p.held.hold(o.sinkReg), false
	}
	return nil, false, false
}

// sendDst is where a Send's payload goes: the receive its MSN selects,
// when the placer knows which one that is. The receiver publishes its
// Send state (publishSends, takeRecv): the receive of the message under
// way, and the MSN of the next untagged message, whose receive is then the
// one at the head of the queue. A Send further ahead waits for the stream:
// which receive it takes depends on the messages before it (an Immediate
// Data may take one, or none), which a hole can hide.
// +checklocks:p.placeMu
func (p *segPlacer) sendDst(h DDPHeader, payLen int) (zerocopy.SGList, uint64, bool) {
	qp := p.qp
	msn := h.MSN()
	p.mu.Lock()
	var id uint64
	var found bool
	switch {
	case p.rxCur && msn == p.rxCurMSN:
		id, found = p.rxCurID, true
		p.ssge = append(p.ssge[:0], p.rxCurSGL...)
	case msn == p.rxNext:
		p.ssge, id, found = qp.cfg.RQ.peek(p.ssge[:0])
	}
	p.mu.Unlock()
	if !found {
		return nil, 0, false
	}
	dst, regs, size, st := qp.resolveSGL(p.sdst, p.sregs, p.ssge, AccessLocalWrite)
	p.sdst, p.sregs = dst, regs
	if st != StatusSuccess || uint64(h.MO())+uint64(payLen) > uint64(size) || !p.held.holdAll(regs) {
		return nil, 0, false
	}
	return dst, id, true
}

// sglAddr is the address of byte off of l (nil beyond it).
func sglAddr(l zerocopy.SGList, off int) unsafe.Pointer {
	for _, b := range l {
		if off < len(b) {
			return unsafe.Pointer(&b[off])
		}
		off -= len(b)
	}
	return nil
}

// scatter places bytes [from, from+n) of the views at offset off of l; with
// withCRC it folds their CRC32c into crc and returns it.
func (v segView) scatter(l zerocopy.SGList, off, from, n int, withCRC bool, crc uint32) uint32 {
	for _, b := range v {
		if n == 0 {
			break
		}
		if from >= len(b) {
			from -= len(b)
			continue
		}
		c := min(len(b)-from, n)
		if withCRC {
			_, crc = l.PlaceFromCRC(off, b[from:from+c], crc)
		} else {
			l.PlaceFrom(off, b[from:from+c])
		}
		off, n, from = off+c, n-c, 0
	}
	return crc
}

// claim records the FPDU at stream offset at (total octets, payLen of
// payload) as being placed; nil if the in-order path has reached it or it
// was placed already (a duplicate or retransmission).
func (p *segPlacer) claim(at uint64, total, payLen int) *placedFPDU {
	p.mu.Lock()
	defer p.mu.Unlock()
	// Counted first, then front read: the in-order path stores front,
	// then reads the count (claimInOrder), so one of the two sees the
	// other (sequentially consistent atomics).
	p.nrec.Add(1)
	front := p.front.Load()
	if next := at + uint64(total); next >= front {
		p.known[next] = struct{}{}
		p.bound()
	}
	if at < front || p.placed[at] != nil || p.removed {
		p.nrec.Add(-1)
		return nil
	}
	e := &placedFPDU{payLen: payLen, total: total}
	p.placed[at] = e
	p.starts.push(at)
	return e
}

// finished marks a claimed FPDU placed.
func (p *segPlacer) finished(e *placedFPDU, crc uint32) {
	p.mu.Lock()
	e.crc, e.done = crc, true
	p.mu.Unlock()
}

// feed hands a segment that fills the hole the receiver waits at, or a
// short one in order that it waits for, straight to the receiver, then
// delivers the FPDUs placed beyond it that now lie in order: their
// messages complete now, not when TCP has handed the stream over. It
// reports false, having done nothing, when the receiver is busy (it will
// read the segment from TCP) or stands elsewhere.
//
// A hole-filling segment (quick false) may first read from TCP what the
// receiver has not read before it; delivered is the number of FPDUs
// delivered.
// +checklocks:p.placeMu
func (p *segPlacer) feed(v segView, off uint64, n int, quick bool) (ok bool, delivered uint64) {
	qp := p.qp
	if !qp.rxMu.TryLock() {
		return false, 0
	}
	defer qp.rxMu.Unlock()
	return p.feedLocked(v, off, n, quick) // +checklocksforce: TryLock took rxMu
}

// feedLocked is feed with the receiver's rxMu held.
// +checklocks:p.rx.qp.rxMu
// +checklocks:p.placeMu
func (p *segPlacer) feedLocked(v segView, off uint64, n int, quick bool) (ok bool, delivered uint64) {
	qp, r := p.qp, p.rx
	if p.markers {
		// The marked segment goes to the stripper in front of the
		// receiver, at its offset in the marked stream.
		v, off, n = p.wv, p.woff, p.wn
	}
	w, at := r.fedTo()
	end := off + uint64(n)
	if !quick && at < off && r.state != rxDead {
		// The receiver has not read all TCP holds before the hole yet
		// (TCP gets this segment only after the tap): read it now.
		if _, err := qp.stream.TryReadTo(r.in, 0); err != nil {
			r.flushStats()
			return false, 0 // the receiver's goroutine sees the error too
		}
		// What TCP's processor has not taken yet, the tap kept: feed
		// that.
		p.feedKept(off)
		w, at = r.fedTo()
	}
	if at < off || quick && at >= end || r.state == rxDead {
		return false, 0
	}
	skip := int(at - off)
	placed, fpdus := r.n.placed, r.n.fpdus
	r.tapFeed = quick
	for _, b := range v {
		if skip >= len(b) {
			skip -= len(b)
			continue
		}
		w.Write(b[skip:])
		skip = 0
	}
	r.tapFeed = false
	fed := r.n.placed - placed
	if !quick {
		p.stats.FillsFed.Add(1)
	}
	if quick {
		p.stats.QuickFedBytes.Add(fed)
	} else {
		p.stats.FedBytes.Add(fed)
	}
	p.stats.PlacedBytes.Add(fed)
	r.deliverPlaced()
	delivered = r.n.fpdus - fpdus
	p.stats.DeliveredEarly.Add(delivered)
	r.flushStats()
	lattrace.Mark(lattrace.Fed)
	if p.fedWake != nil {
		p.fedN.Add(1)
		select {
		case p.fedWake <- struct{}{}:
		default:
		}
	}
	return true, delivered
}

// takePlaced looks up and claims in one step (one lock), for the
// receiver's delivery of placed FPDUs (deliverRun): the complete FPDU
// placed at stream offset at, claimed as claimInOrder claims it; or, for a
// short FPDU kept whole, its record unclaimed (small: the receiver
// processes its bytes, which claims it). nil when no complete FPDU is
// placed there, or when a stale start lies before at (the usual path
// finds it).
func (p *segPlacer) takePlaced(at uint64) (e *placedFPDU, small bool) {
	if p.nrec.Load() == 0 {
		return nil, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	e = p.placed[at]
	if e == nil || !e.done || p.starts.min() < at {
		return nil, false
	}
	if e.small != nil {
		return e, true
	}
	if at+1 > p.front.Load() {
		p.front.Store(at + 1) // as claimInOrder
	}
	p.starts.pop() // at is the lowest
	delete(p.placed, at)
	p.nrec.Add(-1)
	if next := at + uint64(e.total); next >= p.contig {
		p.known[next] = struct{}{}
		p.bound()
	}
	return e, false
}

// learn records an FPDU start the placer found (the end of a checked FPDU).
func (p *segPlacer) learn(start uint64) {
	p.mu.Lock()
	if start >= p.front.Load() {
		p.known[start] = struct{}{}
		p.bound()
	}
	p.mu.Unlock()
}

// passInOrder is claimInOrder for an FPDU the receive path takes in one
// step (receiver.wholeCont) while nothing placed from segments waits: it
// leaves every FPDU starting at or before at to the receive path and
// reports true when no placement record exists, so there is nothing to
// claim. false: the receive path takes the FPDU the usual way.
func (p *segPlacer) passInOrder(at uint64) bool {
	if at+1 > p.front.Load() {
		p.front.Store(at + 1) // only the in-order path (rxMu held) writes it
	}
	return p.nrec.Load() == 0
}

// claimInOrder is called by the receive path when it reaches the FPDU
// starting at stream offset at, whose successor starts at next. It returns
// the FPDU's record if it was placed from a segment (the receiver then
// verifies instead of copying), nil otherwise. From now on the placer
// leaves every FPDU before next to the receive path. stale reports an FPDU
// placed at a start the stream has passed without an FPDU beginning there:
// the segment it came from was not what TCP delivered, and the bytes it
// placed were never the stream's.
func (p *segPlacer) claimInOrder(at, next uint64) (e *placedFPDU, stale bool) {
	if at+1 > p.front.Load() {
		p.front.Store(at + 1) // only the in-order path (rxMu held) writes it
	}
	if p.nrec.Load() == 0 {
		// Nothing placed from segments, nothing to claim (see claim).
		return nil, false
	}
	p.mu.Lock()
	for p.starts.len() > 0 && p.starts.min() < at {
		p.starts.pop()
		stale = true
	}
	for {
		e = p.placed[at]
		if e == nil || e.done {
			if e != nil {
				p.starts.pop() // at is the lowest now
				delete(p.placed, at)
				p.nrec.Add(-1)
				if e.small != nil {
					e = nil // kept, not placed
				}
			}
			if next >= p.contig {
				// Only a segment the tap has not seen all of may start
				// there (one that ends before contig is old, and one
				// that reaches past it is fed before it is framed).
				p.known[next] = struct{}{}
				p.bound()
			}
			p.mu.Unlock()
			return e, stale
		}
		// A placement of this FPDU is under way (one copy of at most a
		// segment): wait for it.
		p.mu.Unlock()
		runtime.Gosched()
		p.mu.Lock()
	}
}

// bound drops the FPDU starts behind the in-order path once known and after
// have grown past the bound, which then doubles with what stays
// (amortized); p.mu is held.
// +checklocks:p.mu
func (p *segPlacer) bound() {
	if len(p.known)+len(p.after) <= p.prune {
		return
	}
	front := p.front.Load()
	for k := range p.known {
		if k < front {
			delete(p.known, k)
		}
	}
	for k := range p.after {
		if k < front {
			delete(p.after, k)
		}
	}
	p.prune = max(256, 2*(len(p.known)+len(p.after)))
}

// messageDone is called by the receive path when a message whose last
// FPDU ends at stream offset end completes in order. The first completion
// after a hole was filled times the fill, if the message had arrived whole
// by then (the hole was all that held it back; a message still arriving
// when the hole filled waited for its bytes, not for the fill).
func (p *segPlacer) messageDone(end uint64) {
	p.mu.Lock()
	at := p.fillAt
	whole := end <= p.fillEnd
	p.fillAt = time.Time{}
	p.mu.Unlock()
	if !at.IsZero() && whole {
		d := time.Since(at)
		p.stats.HoleFills.Add(1)
		p.stats.HoleFillNanos.Add(uint64(d))
		p.stats.HoleFillHist.Add(d)
	}
}

// stop ends placement: once it returns, no segment is being placed and
// none will be.
func (p *segPlacer) stop() {
	p.mu.Lock()
	p.removed = true
	for p.busy > 0 {
		p.mu.Unlock()
		runtime.Gosched()
		p.mu.Lock()
	}
	jobs := p.jobs
	p.jobs = nil
	for p.kn > 0 {
		p.popKept().hold.Release()
	}
	p.mu.Unlock()
	for _, j := range jobs {
		j.hold.Release()
	}
}

// startQueue holds the starts of placed FPDUs in ascending order. They are
// claimed lowest first, in the stream's order, and placed mostly in it too,
// so a push is an append and a pop moves a head; a start placed out of
// order (a segment reordered) is inserted where it belongs. (A binary heap
// through container/heap boxed every offset and dispatched every
// comparison: in a long hole's delivery its Pop was half of the time per
// FPDU.)
type startQueue struct {
	v    []uint64
	head int
}

func (q *startQueue) len() int { return len(q.v) - q.head }

// min returns the lowest start (q is not empty).
func (q *startQueue) min() uint64 { return q.v[q.head] }

// push adds x.
func (q *startQueue) push(x uint64) {
	if n := len(q.v); n == q.head || q.v[n-1] <= x {
		q.v = append(q.v, x)
		return
	}
	i, _ := slices.BinarySearch(q.v[q.head:], x)
	q.v = slices.Insert(q.v, q.head+i, x)
}

// pop removes the lowest start (q is not empty).
func (q *startQueue) pop() {
	q.head++
	switch {
	case q.head == len(q.v):
		q.v, q.head = q.v[:0], 0
	case q.head >= 256 && q.head >= len(q.v)/2:
		n := copy(q.v, q.v[q.head:])
		q.v, q.head = q.v[:n], 0
	}
}
