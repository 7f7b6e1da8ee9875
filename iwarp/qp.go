package iwarp

import (
	"context"
	"errors"
	"fmt"
	"github.com/rdmatap/rdmatap/internal/lattrace"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"

	"github.com/rdmatap/rdmatap/zerocopy"
)

// Stream is the reliable byte stream (an LLP) an RDMAP stream runs on: a
// netstack TCP connection. ReadTo hands w slices of the stack's own packet
// memory, which is what lets the receive path place payload with one copy.
type Stream interface {
	ReadTo(ctx context.Context, w io.Writer, max int) (int, error)
	// TryReadTo is ReadTo without blocking: (0, nil) when nothing is queued.
	TryReadTo(w io.Writer, max int) (int, error)
	// WaitReadable blocks until a read would not block or ctx ends.
	WaitReadable(ctx context.Context) error
	ReadFull(ctx context.Context, p []byte) error
	Write(ctx context.Context, p []byte) (int, error)
	WritePayload(ctx context.Context, pl tcpip.Payloader) (int64, error)
	MaxPayload() int
	CloseWrite() error
	Abort()
	Close() error
}

// QPState is the RDMAP stream state (RFC 5040 §6; the Linux siw names).
type QPState uint8

// QP states.
const (
	StateIdle QPState = iota
	StateRTS
	StateClosing
	StateTerminate
	StateError
)

func (s QPState) String() string {
	switch s {
	case StateIdle:
		return "IDLE"
	case StateRTS:
		return "RTS"
	case StateClosing:
		return "CLOSING"
	case StateTerminate:
		return "TERMINATE"
	case StateError:
		return "ERROR"
	}
	return fmt.Sprintf("QPState(%d)", uint8(s))
}

// EventType is the kind of an asynchronous QP event.
type EventType uint8

// Asynchronous events.
const (
	EventEstablished EventType = iota
	EventDisconnected
	EventTerminateSent
	EventTerminateReceived
	EventFatal
)

func (e EventType) String() string {
	return [...]string{"ESTABLISHED", "DISCONNECTED", "TERMINATE_SENT", "TERMINATE_RECEIVED", "QP_FATAL"}[e]
}

// Event is an asynchronous QP event.
type Event struct {
	Type  EventType
	QPNum uint32
	Term  TermCode // for Terminate events
	Err   error
	// ByPeer (EventDisconnected without Err): the peer closed the
	// connection gracefully first; else this end did (Disconnect).
	ByPeer bool
}

// QPConfig configures a QP.
type QPConfig struct {
	Num    uint32
	PD     uint32
	Mem    *MemTable
	SendCQ CQ
	RecvCQ CQ
	// RQ is the QP's receive queue, or a shared receive queue.
	RQ       *RecvQueue
	SharedRQ bool
	// Send queue limits.
	MaxSendWR  int
	MaxSendSGE int
	MaxInline  int
	// SignalAll completes every send WR, as sq_sig_all does.
	SignalAll bool
	// MaxFPDU caps the FPDU size; 0 uses the connection's current maximum
	// TCP segment payload, which keeps one FPDU per segment.
	MaxFPDU int
	// FirstFPDUDelay holds an initiator's first FPDU (the RTR, or the
	// first message) for this long after the MPA Reply. Linux siw (all
	// builds without the accept-race fix) stops reading a connection whose
	// first FPDU arrives while it is still switching the socket from
	// connection setup to the QP: a few milliseconds avoid it. The hold is
	// a timer: Start and posters do not wait, posts queue until it ends.
	// It is skipped when the responder answered the early-FPDU query
	// (ConnParams.EarlyFPDUOK). 0: none.
	FirstFPDUDelay time.Duration
	// MPAStrict keeps RFC 5044's startup rule on a responder: it
	// transmits nothing before the initiator's first FPDU has arrived
	// (OpenTXGate lifts the rule for one QP). Without it a responder
	// transmits whenever its application posts, as Linux siw's does:
	// siw's initiator sends nothing before its application does (without
	// peer-to-peer mode), so a server that speaks first (ib_write_lat,
	// ucmatose) would wait for it forever. In peer-to-peer mode (RFC 6581)
	// a responder always waits for the initiator's RTR.
	MPAStrict bool
	// ManualProgress starts no receive goroutine: the application drives
	// the receive path with Progress or WaitProgress (libfabric's manual
	// progress). Incoming data, completions, Terminates and the peer's close
	// are seen only when it does.
	ManualProgress bool
	// WaitSpin (ManualProgress, segment placement): WaitProgress checks
	// for the tap's feed this long before it sleeps, yielding between
	// checks (see netstack.Conn.WaitUnreadOr); 0 to MaxWaitSpin.
	WaitSpin time.Duration
	// OnEvent receives asynchronous events; it must not block.
	OnEvent func(Event)
	// Counters, shared by the QPs of a device; nil for none.
	Stats *Stats
	// Placement: PlacementSegment also places RDMA Write payload from TCP
	// segments as they arrive (the stream must be a SegmentSource).
	Placement Placement
	// NoExtensions turns the RFC 7306 extensions (atomics, Immediate
	// Data) off: posting them fails, and the peer's atomic and Immediate
	// Data messages are answered with a Terminate (RDMAP Remote Operation
	// / Unexpected OpCode), as Linux siw does.
	NoExtensions bool
	// SegStats counts segment placement; nil for none.
	SegStats *SegmentStats
	// TimeHoleFills installs the segment tap with stream placement too,
	// only to time hole fills (SegmentStats.HoleFills), so that the two
	// modes can be compared; it costs the tap's per-segment work.
	TimeHoleFills bool
}

// ConnParams are the negotiated properties of an RDMAP stream.
type ConnParams struct {
	Initiator  bool
	Revision   uint8
	CRC        bool
	IRD, ORD   int
	PeerToPeer bool
	RTR        RTR // the one RTR type chosen, with PeerToPeer
	// MPA markers (RFC 5044 §5), per direction (§7.1: each end's M bit
	// asks the other to insert them): this end inserts them in what it
	// sends (MarkersTx) or strips them from what it receives (MarkersRx).
	MarkersTx, MarkersRx bool
	// EarlyFPDUOK: the peer takes FPDUs right behind the MPA Reply, so
	// this end does not hold its first FPDU (FirstFPDUDelay). On an
	// initiator: the responder answered its query (MPAFlagEarlyFPDUQuery);
	// on a responder: the initiator asked it, which rdmatap's initiator
	// does and siw's never does.
	EarlyFPDUOK bool
}

// Stats are per-device counters (atomic).
type Stats struct {
	TxFPDUs, RxFPDUs             atomic.Uint64
	TxBytes, RxBytes             atomic.Uint64 // payload bytes
	PlacedBytes, PlacementCopies atomic.Uint64
	CRCErrors                    atomic.Uint64
	TermSent, TermRecv           atomic.Uint64
	RxOps, TxOps                 [16]atomic.Uint64 // messages by RDMAP opcode
}

// Errors a QP reports.
var (
	ErrTerminated = errors.New("iwarp: RDMAP stream terminated")
	ErrFlushed    = errors.New("iwarp: work request flushed")
	ErrClosed     = errors.New("iwarp: QP closed")
)

// TerminateError reports a Terminate sent or received.
type TerminateError struct {
	Code     TermCode
	Received bool // true: the peer sent it
}

func (e *TerminateError) Error() string {
	dir := "sent"
	if e.Received {
		dir = "received"
	}
	return fmt.Sprintf("iwarp: terminate %s: %v", dir, e.Code)
}

// Is makes errors.Is(err, ErrTerminated) true for any Terminate.
func (e *TerminateError) Is(target error) bool { return target == ErrTerminated }

// sendWQE is a send queue entry: a copy of the posted WR.
type sendWQE struct {
	wr       SendWR // without SGL, MR and MW (set)
	mr, mw   memRef // REG_MR's MR, BIND_MW's window
	sgl      []SGE  // into the QP's slab
	inline   []byte
	inlined  bool
	signaled bool
}

// set copies the work request wr into e, all but its SGL, which the caller
// copies into e.sgl, and its MR and window, which e names by memRef: the
// poster's pointers are not kept (see memRef), so that an SGL built for the
// call stays on the poster's stack.
func (e *sendWQE) set(wr *SendWR) {
	e.wr = SendWR{ID: wr.ID, Op: wr.Op, Flags: wr.Flags, RemoteAddr: wr.RemoteAddr, RKey: wr.RKey,
		InvalidateRKey: wr.InvalidateRKey, Imm: wr.Imm, CompareAdd: wr.CompareAdd, Swap: wr.Swap,
		Access: wr.Access, Bind: wr.Bind}
	e.mr, e.mw = memRef{}, memRef{}
	if wr.MR != nil {
		e.mr = wr.MR.ref()
	}
	if wr.MW != nil {
		e.mw = wr.MW.ref()
	}
}

// orqEntry is an outstanding RDMA Read or atomic we issued (bounded by
// ORD: RFC 7306 counts atomics against the same limit).
type orqEntry struct {
	id       uint64
	signaled bool
	rtr      bool // the zero-length Read of an RTR: no completion
	// probe: the zero-length Read behind an Immediate Data message, whose
	// WR (op, probeLen bytes) completes with its response (QP.probesImm).
	probe    bool
	probeLen uint32
	op       WROp // WRRead, an atomic, or (probe) a WR with Immediate
	reqID    uint32
	// For a Read, the sink of the Read Response; for an atomic, the 8
	// bytes that receive the original value.
	sinkSTag uint32
	sinkTO   uint64
	size     uint32
	placed   uint32
	sink     []byte
	sinkReg  *Region // the region sink lies in
	// sinkPaged: the sink lies in a region over separate pages (sink is
	// nil; the Read Response's pieces come from sinkReg.Pieces).
	sinkPaged bool
	// inv is what a Read with local invalidate invalidates when its data
	// has arrived.
	inv *Region
}

// irqEntry is an inbound RDMA Read or atomic we must answer (bounded by
// IRD), in the order they arrived.
type irqEntry struct {
	sinkSTag uint32
	sinkTO   uint64
	src      []byte
	srcReg   *Region // the region src lies in
	// srcPaged: the source lies in a region over separate pages (src is
	// nil): srcLen bytes from TO srcTO of srcReg.
	srcPaged bool
	srcTO    uint64
	srcLen   uint64
	// An executed atomic: the Atomic Response to send.
	atomic   bool
	reqID    uint32
	original uint64
}

// QP is one RDMAP stream's protocol engine: the send queue and its TX
// goroutine, the receive path, the ORQ and IRQ, and the state machine.
//
// Locks: mu guards the fields marked +checklocks:mu, txMu the transmitter
// (tx) and rxMu the receiver (rx); the package's Locks section has who
// takes each and their order. termErr is written once under mu, together
// with term (terminate) or by the peer's Terminate (terminated), and read
// without mu only by the one who saw term set (sendTerminate) or armed
// the Terminate timer (terminate).
// +checklocksalias:rx.qp.rxMu=rxMu
// +checklocksalias:tx.qp.txMu=txMu
type QP struct {
	cfg QPConfig

	mu   sync.Mutex // guards the fields marked +checklocks:mu
	txMu sync.Mutex // held while transmitting: by the TX goroutine or a poster; guards tx
	rxMu sync.Mutex // held while receiving: by the RX goroutine or a poller; guards rx
	// termTimer fails the QP if its Terminate cannot go out (terminate);
	// stopped once the QP is done.
	// +checklocks:mu
	termTimer *time.Timer
	// +checklocks:mu
	state QPState
	// +checklocks:mu
	params ConnParams
	// stream, ctx and cancel: set once by Start (see above).
	stream Stream
	live   atomic.Value // the Stream, for lock-free Progress
	ctx    context.Context
	cancel context.CancelFunc

	// send queue (ring of posted, not yet transmitted WRs)
	// +checklocks:mu
	sq []sendWQE
	// +checklocks:mu
	sqHead int
	// +checklocks:mu
	sqN int
	// outstanding reads (we are requester) and inbound reads (responder);
	// the receiver keeps a copy of the head (receiver.rresp)
	// +checklocks:mu
	orq []orqEntry
	// +checklocks:mu
	orqHead int
	// +checklocks:mu
	orqN int
	// The send queue completes in order, as an RNIC's does (libfabric's
	// verbs provider takes each send completion as that of its QP's
	// oldest outstanding WR): a WR that completes when TCP has its bytes
	// (a Send, a Write, a bind, or one that failed) waits behind the
	// Reads and atomics posted before it until they have completed.
	// orqClaimed counts the ORQ entries ever claimed (changed under mu
	// by the transmitter), orqRetired those whose completion (or none)
	// has gone to the CQ; sqHeld are the completions waiting, in order,
	// each for orqRetired to reach its after.
	orqClaimed atomic.Uint64
	orqRetired atomic.Uint64
	sqHeldN    atomic.Int32
	cmu        sync.Mutex // orders the send queue's completions (see sqHeld)
	// +checklocks:cmu
	sqHeld []heldCompletion
	// immOK: the peer has answered the Read behind an Immediate Data
	// message, so it takes them (see probesImm).
	// +checklocks:mu
	immOK bool
	// The opcode of the message the peer's Terminate names, if it did.
	// +checklocks:mu
	termOp Opcode
	// +checklocks:mu
	termOpKnown bool
	// +checklocks:mu
	irq []irqEntry
	// +checklocks:mu
	irqHead int
	// +checklocks:mu
	irqN int
	// +checklocks:mu
	txGate bool // responder: TX waits for the first inbound FPDU
	// held: TX waits out FirstFPDUDelay after the MPA Reply (holdTimer
	// ends it, or on a responder the initiator's first FPDU); posts
	// meanwhile queue, nothing is sent.
	// +checklocks:mu
	held bool
	// +checklocks:mu
	holdTimer *time.Timer
	// +checklocks:mu
	rtrDue bool // a peer-to-peer initiator's RTR is still to go, before anything else
	// termSent: term has gone out (sendTerminate sends it once).
	// +checklocks:mu
	termSent bool
	// +checklocks:mu
	term    *TerminateFields
	termErr *TerminateError // written once under mu; see above for its reads
	// +checklocks:mu
	closing bool // graceful close requested
	// +checklocks:mu
	txSendMSN [numQN]uint32
	// +checklocks:mu
	atomicID uint32 // Request Identifier of the last atomic issued

	// +checklocks:mu
	windows []*Region // type 2 window bindings made on this QP (memwr.go)

	kick   chan struct{}
	done   chan struct{}
	txDone chan struct{} // set once by Start
	rxDone chan struct{} // set once by Start
	// +checklocks:mu
	err error

	rx receiver    // guarded by rxMu (see receiver)
	tx transmitter // guarded by txMu (see transmitter)

	seg      *segPlacer // PlacementSegment; set once by Start
	segUntap func()     // set once by Start
}

// NewQP creates a QP in the IDLE state. Receives may be posted at once;
// sends queue until the stream is established.
func NewQP(cfg QPConfig) (*QP, error) {
	if cfg.Mem == nil || cfg.SendCQ == nil || cfg.RecvCQ == nil || cfg.RQ == nil {
		return nil, fmt.Errorf("%w: QP needs a memory table, CQs and a receive queue", ErrInvalidWR)
	}
	if cfg.MaxSendWR <= 0 {
		cfg.MaxSendWR = 128
	}
	if cfg.MaxSendSGE <= 0 {
		cfg.MaxSendSGE = 4
	}
	if cfg.WaitSpin < 0 || cfg.WaitSpin > MaxWaitSpin {
		return nil, fmt.Errorf("%w: WaitSpin %v: want 0..%v", ErrInvalidWR, cfg.WaitSpin, MaxWaitSpin)
	}
	if cfg.MaxSendWR > 1<<20 || cfg.MaxSendSGE > 64 || cfg.MaxInline < 0 || cfg.MaxInline > 4096 {
		return nil, fmt.Errorf("%w: send queue %d WRs, %d SGEs, %d inline", ErrInvalidWR, cfg.MaxSendWR, cfg.MaxSendSGE, cfg.MaxInline)
	}
	// The send queue's slots are allocated as posts first need them
	// (growSQ), like the receive queue's.
	qp := &QP{cfg: cfg, kick: make(chan struct{}, 1), done: make(chan struct{})}
	qp.rx.qp = qp
	qp.tx.qp = qp
	for i := range qp.txSendMSN {
		qp.txSendMSN[i] = 1
	}
	return qp, nil
}

// growSQ doubles the full send queue ring (up to MaxSendWR), keeping the
// queued WRs in order; qp.mu is held. Once the queue has grown to its
// working depth, posting allocates nothing.
// +checklocks:qp.mu
func (qp *QP) growSQ() {
	old := len(qp.sq)
	n := min(max(2*old, queueGrowth), qp.cfg.MaxSendWR)
	sq := make([]sendWQE, n)
	for i := range qp.sqN {
		sq[i] = qp.sq[(qp.sqHead+i)%old]
	}
	sge, inl := qp.cfg.MaxSendSGE, qp.cfg.MaxInline
	slab := make([]SGE, (n-old)*sge)
	var inlines []byte
	if inl > 0 {
		inlines = make([]byte, (n-old)*inl)
	}
	for i := old; i < n; i++ {
		j := i - old
		sq[i].sgl = slab[j*sge : j*sge : (j+1)*sge]
		if inlines != nil {
			sq[i].inline = inlines[j*inl : (j+1)*inl]
		}
	}
	qp.sq, qp.sqHead = sq, 0
}

// Num returns the QP number.
func (qp *QP) Num() uint32 { return qp.cfg.Num }

// RecvQueue returns the QP's receive queue: its own, or the shared one it
// takes receives from.
func (qp *QP) RecvQueue() *RecvQueue { return qp.cfg.RQ }

// State returns the current state.
func (qp *QP) State() QPState {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.state
}

// Params returns the negotiated connection parameters.
func (qp *QP) Params() ConnParams {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.params
}

// Err returns why the QP left RTS (nil while it is up or after a clean close).
func (qp *QP) Err() error {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.err
}

// Done is closed when the QP has reached ERROR and flushed its queues.
func (qp *QP) Done() <-chan struct{} { return qp.done }

// Start moves the QP to RTS on an established, MPA-negotiated stream and
// starts its TX and RX goroutines (one of each per QP). It never waits:
// an initiator's first-FPDU hold (FirstFPDUDelay) runs on a timer, and
// the RTR of peer-to-peer mode goes out from the transmitter.
func (qp *QP) Start(s Stream, p ConnParams) error {
	// The receiver is set up under rxMu, so that no poller (Progress)
	// receives meanwhile, and the transmitter under txMu, so that no
	// poster transmits: the one place both are held (see Locks).
	qp.rxMu.Lock()
	defer qp.rxMu.Unlock()
	qp.txMu.Lock()
	qp.mu.Lock()
	if qp.state != StateIdle {
		qp.mu.Unlock()
		qp.txMu.Unlock()
		return ErrInvalidState
	}
	if p.IRD < 0 || p.ORD < 0 || p.IRD > MPAMaxIRDORD || p.ORD > MPAMaxIRDORD {
		qp.mu.Unlock()
		qp.txMu.Unlock()
		return fmt.Errorf("%w: IRD %d ORD %d", ErrInvalidWR, p.IRD, p.ORD)
	}
	qp.stream = s
	qp.live.Store(s)
	qp.params = p
	qp.state = StateRTS
	qp.ctx, qp.cancel = context.WithCancel(context.Background())
	ord := max(p.ORD, 1)
	qp.orq = make([]orqEntry, ord)
	qp.immOK = false
	qp.termOp, qp.termOpKnown = 0, false
	qp.irq = make([]irqEntry, max(p.IRD, 1))
	// A strict responder (and any in peer-to-peer mode, whose initiator
	// speaks first with its RTR) stays silent until the initiator's first
	// FPDU; otherwise it transmits as soon as its application posts, as
	// Linux siw's responder does (MPAStrict).
	qp.txGate = !p.Initiator && (qp.cfg.MPAStrict || p.PeerToPeer)
	qp.txDone = make(chan struct{})
	qp.rxDone = make(chan struct{})
	qp.rx.init(p)
	qp.tx.init(p)
	if qp.cfg.Placement == PlacementSegment || qp.cfg.TimeHoleFills {
		src, ok := s.(SegmentSource)
		if !ok {
			qp.state = StateIdle
			qp.mu.Unlock()
			qp.txMu.Unlock()
			qp.cancel()
			return fmt.Errorf("%w: segment placement needs a stream that hands over its segments", ErrInvalidWR)
		}
		seg := newSegPlacer(qp, p.CRC, p.MarkersRx)
		seg.observe = qp.cfg.Placement != PlacementSegment
		// What the tap's callbacks read is set before the tap goes in:
		// from then on the link's goroutine may call them.
		qp.rx.seg = seg
		if !seg.observe && qp.cfg.ManualProgress {
			seg.fedWake = make(chan struct{}, 1)
		}
		if !seg.observe {
			// A segment that fills the hole the receiver waits at is
			// fed to it from the tap; TCP's copy is then skipped.
			seg.rx = &qp.rx
			seg.rxNext = qp.rx.expect[QNSend] // +checklocksignore: seg is not published yet
			qp.rx.pubActive, qp.rx.pubExpect = false, qp.rx.expect[QNSend]
			_, at := qp.rx.fedTo()
			qp.rx.tcp = tcpFeed{r: &qp.rx, off: at}
			qp.rx.in = &qp.rx.tcp
		}
		var untap func()
		var err error
		if rs, ok := s.(SegmentRetainer); ok && !seg.observe && !qp.cfg.ManualProgress {
			// Segments beyond a hole go to the receive goroutine.
			qp.rx.waitOr = rs.WaitReadableOr
			untap, err = rs.TapSegmentsRetain(seg.placeRetain, &seg.stats.ConnTapStats)
		} else {
			untap, err = src.TapSegments(seg.place, &seg.stats.ConnTapStats)
		}
		if uw, ok := s.(unreadWaiter); ok && !seg.observe && err == nil {
			qp.rx.waitUnread, qp.rx.heldFn = uw.WaitUnreadOr, qp.rx.fedHeld
		}
		if err != nil {
			qp.rx.seg, qp.rx.waitOr = nil, nil
			qp.state = StateIdle
			qp.mu.Unlock()
			qp.txMu.Unlock()
			qp.cancel()
			return fmt.Errorf("iwarp: segment placement: %w", err)
		}
		qp.seg, qp.segUntap = seg, untap
	}
	// RFC 6581: a peer-to-peer initiator's first FPDU is the RTR. The
	// transmitter sends it before anything else (pick), and no poster
	// transmits past it (directOK).
	qp.rtrDue = qp.tx.rtr != 0
	if qp.cfg.FirstFPDUDelay > 0 && !p.EarlyFPDUOK && (p.Initiator || !qp.txGate) {
		// The siw accept-race guard: hold the first FPDU without
		// blocking anyone. Posts queue meanwhile; the timer opens the
		// gate and wakes the TX goroutine, which sends the RTR (if any)
		// and then the queue in order. An initiator's FPDU may reach
		// unpatched siw while it is still switching its socket over to
		// the QP; a responder's may reach siw's initiator before it has
		// read the Reply, which it then refuses: a responder that does
		// not wait for the initiator's first FPDU waits for it or for
		// the timer, whichever comes first.
		qp.held = true
		qp.holdTimer = time.AfterFunc(qp.cfg.FirstFPDUDelay, qp.endHold)
	}
	qp.mu.Unlock()
	qp.txMu.Unlock()
	go qp.tx.run()
	if p := qp.cfg.ManualProgress; !p {
		go qp.rx.run()
	} else {
		close(qp.rxDone)
	}
	if p.Initiator {
		qp.event(Event{Type: EventEstablished})
	}
	return nil
}

// endHold ends an initiator's first-FPDU hold (the timer's function).
func (qp *QP) endHold() {
	qp.mu.Lock()
	if !qp.held {
		qp.mu.Unlock()
		return
	}
	qp.held = false
	qp.mu.Unlock()
	qp.wake()
}

// OpenTXGate lets a responder that waits for the initiator's first FPDU
// (QPConfig.MPAStrict, or peer-to-peer mode) transmit before it has
// arrived, as Linux siw's responder does whenever its application posts.
// RFC 5044 has the initiator speak first (RFC 6581's RTR exists for
// applications whose responder speaks first), and unpatched siw as an
// initiator resets a connection whose MPA Reply is followed by bytes
// before it has read the Reply; so an application calls this only once it
// knows the initiator has finished connecting, for instance after the
// initiator has spoken on another connection since its connect returned
// (perftest's ib_write_lat server, whose first Write opens the test, after
// the handshakes). It does nothing on an initiator or an open gate.
func (qp *QP) OpenTXGate() { qp.openGate() }

// txHeld reports whether the QP may not transmit yet: a responder waiting
// for the initiator's first FPDU, or an initiator holding its own. qp.mu
// is held.
// +checklocks:qp.mu
func (qp *QP) txHeld() bool { return qp.txGate || qp.held }

func (qp *QP) event(e Event) {
	e.QPNum = qp.cfg.Num
	if qp.cfg.OnEvent != nil {
		qp.cfg.OnEvent(e)
	}
}

func (qp *QP) wake() {
	select {
	case qp.kick <- struct{}{}:
	default:
	}
}

// PostSend queues send work requests. It copies each WR (and, for inline
// WRs, its data), so the caller may reuse them at once. On error it returns
// the index of the first WR not posted, as ibv_post_send's bad_wr does.
func (qp *QP) PostSend(wrs ...SendWR) (int, error) {
	lattrace.Mark(lattrace.Post)
	qp.mu.Lock()
	if qp.state > StateRTS || qp.closing {
		qp.mu.Unlock()
		return 0, ErrInvalidState
	}
	if len(wrs) == 1 && qp.directOK(&wrs[0]) && qp.txMu.TryLock() {
		// qp.mu is released inside.
		return qp.postDirect(&wrs[0]) // +checklocksignore: txMu taken by TryLock
	}
	for i := range wrs {
		wr := &wrs[i]
		if err := qp.checkSendWR(wr); err != nil {
			qp.mu.Unlock()
			return i, err
		}
		if qp.sqN == len(qp.sq) {
			if qp.sqN == qp.cfg.MaxSendWR {
				qp.mu.Unlock()
				return i, ErrQueueFull
			}
			qp.growSQ()
		}
		e := &qp.sq[(qp.sqHead+qp.sqN)%len(qp.sq)]
		e.set(wr)
		e.sgl = append(e.sgl[:0], wr.SGL...)
		e.signaled = qp.cfg.SignalAll || wr.Flags&FlagSignaled != 0
		e.inlined = false
		if wr.Data != nil {
			e.inline = append(e.inline[:0], wr.Data...)
			e.inlined = true
		} else if wr.Flags&FlagInline != 0 && !wr.Op.usesORQ() {
			n, err := qp.gatherInline(e)
			if err != nil {
				qp.mu.Unlock()
				return i, err
			}
			e.inline = e.inline[:cap(e.inline)]
			e.sgl = e.sgl[:0]
			e.inlined = true
			e.inline = e.inline[:n]
		}
		qp.sqN++
	}
	started := qp.state == StateRTS && !qp.txHeld()
	qp.mu.Unlock()
	if started {
		qp.postInline()
	} else {
		qp.wake()
	}
	return len(wrs), nil
}

func (qp *QP) checkSendWR(wr *SendWR) error {
	if len(wr.SGL) > qp.cfg.MaxSendSGE {
		return ErrTooManySGE
	}
	if wr.Op.extension() && qp.cfg.NoExtensions {
		return fmt.Errorf("%w: %v needs the RFC 7306 extensions, which are off", ErrInvalidWR, wr.Op)
	}
	if wr.Data != nil {
		if wr.Flags&FlagInline == 0 || len(wr.SGL) != 0 {
			return fmt.Errorf("%w: inline data takes FlagInline and no SGEs", ErrInvalidWR)
		}
		switch wr.Op {
		case WRSend, WRSendInvalidate, WRWrite, WRWriteImm, WRSendImm:
		default:
			return fmt.Errorf("%w: %v cannot carry inline data", ErrInvalidWR, wr.Op)
		}
	}
	switch wr.Op {
	case WRSend, WRSendInvalidate, WRWrite, WRWriteImm, WRSendImm:
	case WRAtomicCmpSwap, WRAtomicFetchAdd:
		// The original value lands in one 8-byte SGE, as libibverbs asks.
		if len(wr.SGL) != 1 || wr.SGL[0].Length != AtomicTargetSize {
			return fmt.Errorf("%w: %v takes one 8-byte SGE", ErrInvalidWR, wr.Op)
		}
		if wr.Flags&FlagInline != 0 {
			return fmt.Errorf("%w: %v cannot be inline", ErrInvalidWR, wr.Op)
		}
	case WRLocalInv, WRRegMR, WRBindMW, wrBindMW1:
		return qp.checkLocalWR(wr)
	case WRRead, WRReadInv:
		// The Read Response lands at one sink STag and TO: one SGE, as
		// siw's max_sge_rd.
		if len(wr.SGL) > 1 {
			return fmt.Errorf("%w: RDMA Read takes at most one SGE", ErrTooManySGE)
		}
		if wr.Flags&FlagInline != 0 {
			return fmt.Errorf("%w: RDMA Read cannot be inline", ErrInvalidWR)
		}
	default:
		return fmt.Errorf("%w: opcode %v", ErrInvalidWR, wr.Op)
	}
	total := uint64(len(wr.Data))
	for _, s := range wr.SGL {
		total += uint64(s.Length)
	}
	if total > 1<<32-1 {
		return fmt.Errorf("%w: message longer than 4 GiB", ErrInvalidWR)
	}
	if wr.Flags&FlagInline != 0 && total > uint64(qp.cfg.MaxInline) {
		return fmt.Errorf("%w: %d bytes inline, max %d", ErrInvalidWR, total, qp.cfg.MaxInline)
	}
	return nil
}

// gatherInline copies an inline WR's data into its queue entry.
func (qp *QP) gatherInline(e *sendWQE) (int, error) {
	n := 0
	buf := e.inline[:cap(e.inline)]
	for _, s := range e.sgl {
		r, st := qp.localRegion(s, 0)
		if st == StatusSuccess && s.Length > 0 && !r.acquire() {
			st = StatusLocalProtection // deregistered since the lookup
		}
		if st != StatusSuccess {
			return 0, fmt.Errorf("%w: inline SGE lkey %#x: %v", ErrInvalidWR, s.LKey, st)
		}
		if s.Length > 0 {
			n += r.copyOut(buf[n:], s.Addr, uint64(s.Length))
			r.release()
		}
	}
	return n, nil
}

// localSlice resolves a local SGE, checking the STag, PD, bounds and the
// access the operation needs. The slice may be touched only while its
// region is held (see Region).
// In a region over separate pages, the SGE must lie in one page (an
// atomic's 8 bytes); see localRegion for any SGE.
func (qp *QP) localSlice(s SGE, need Access) ([]byte, *Region, Status) {
	r, st := qp.localRegion(s, need)
	if st != StatusSuccess {
		return nil, nil, st
	}
	b, ok := r.Slice(s.Addr, uint64(s.Length))
	if !ok {
		return nil, nil, StatusLocalProtection
	}
	return b, r, StatusSuccess
}

// localRegion checks a local SGE as localSlice does and returns the region
// it lies in (reach its bytes with Region.Pieces).
func (qp *QP) localRegion(s SGE, need Access) (*Region, Status) {
	r := qp.cfg.Mem.Lookup(s.LKey)
	// A window's STag is for remote access only.
	if r == nil || r.PD != qp.cfg.PD || r.Access&need != need || r.Kind == KindMW {
		return nil, StatusLocalProtection
	}
	if _, ok := r.InBounds(s.Addr, uint64(s.Length)); !ok {
		return nil, StatusLocalProtection
	}
	return r, StatusSuccess
}

// resolveSGL turns an SGL into slices of registered memory, and the
// regions they lie in into regs (which must be held around any access).
func (qp *QP) resolveSGL(dst zerocopy.SGList, regs []*Region, sgl []SGE, need Access) (zerocopy.SGList, []*Region, int, Status) {
	dst, regs = dst[:0], regs[:0]
	n := 0
	for _, s := range sgl {
		r, st := qp.localRegion(s, need)
		if st != StatusSuccess {
			return dst, regs, 0, st
		}
		if s.Length > 0 {
			// One piece, or one per page of a region over
			// separate pages.
			dst, _ = r.Pieces(dst, s.Addr, uint64(s.Length))
			regs = append(regs, r)
		}
		n += int(s.Length)
	}
	return dst, regs, n, StatusSuccess
}

// PostRecv posts receives to the QP's own receive queue.
func (qp *QP) PostRecv(id uint64, sgl []SGE) error {
	if qp.cfg.SharedRQ {
		return fmt.Errorf("%w: QP uses a shared receive queue", ErrInvalidWR)
	}
	if qp.State() >= StateTerminate {
		return ErrInvalidState
	}
	return qp.cfg.RQ.Post(id, sgl)
}

func (qp *QP) complete(cq CQ, c Completion) {
	c.QPNum = qp.cfg.Num
	if !cq.Push(c) {
		qp.event(Event{Type: EventFatal, Err: ErrCQOverflow})
	}
}

// heldCompletion is a send queue completion waiting for the ORQ entries
// claimed before its WR (after of them retired).
type heldCompletion struct {
	c     Completion
	after uint64
}

// completeSQ completes a send queue WR that holds no ORQ entry, in
// order: behind every Read and atomic posted before it. Its caller is the
// transmitter of the WR (or the flush, once the transmitter is gone), so
// the ORQ entries claimed so far are those of the WRs before it.
func (qp *QP) completeSQ(c Completion) {
	after := qp.orqClaimed.Load()
	if qp.sqHeldN.Load() == 0 && qp.orqRetired.Load() >= after {
		qp.complete(qp.cfg.SendCQ, c)
		return
	}
	qp.cmu.Lock()
	defer qp.cmu.Unlock()
	if len(qp.sqHeld) == 0 && qp.orqRetired.Load() >= after {
		qp.complete(qp.cfg.SendCQ, c)
		return
	}
	qp.sqHeld = append(qp.sqHeld, heldCompletion{c: c, after: after})
	qp.sqHeldN.Store(int32(len(qp.sqHeld)))
}

// retireORQ completes the oldest ORQ entry (c, nil for one that reports
// nothing) and then the WRs held behind it. The ORQ's entries retire in
// order (their responses arrive in order; the flush takes them from the
// head).
func (qp *QP) retireORQ(c *Completion) {
	qp.cmu.Lock()
	defer qp.cmu.Unlock()
	if c != nil {
		qp.complete(qp.cfg.SendCQ, *c)
	}
	n := qp.orqRetired.Add(1)
	i := 0
	for ; i < len(qp.sqHeld) && qp.sqHeld[i].after <= n; i++ {
		qp.complete(qp.cfg.SendCQ, qp.sqHeld[i].c)
	}
	if i > 0 {
		rest := copy(qp.sqHeld, qp.sqHeld[i:])
		clear(qp.sqHeld[rest:])
		qp.sqHeld = qp.sqHeld[:rest]
		qp.sqHeldN.Store(int32(rest))
	}
}

// terminate is called when this end detects an error: it queues a
// Terminate for the TX goroutine, which sends it, closes the stream and
// moves the QP to ERROR. offending is the ULPDU (headers) that caused it.
func (qp *QP) terminate(code TermCode, offending []byte, segLen int) {
	qp.mu.Lock()
	if qp.state >= StateTerminate || qp.term != nil {
		qp.mu.Unlock()
		return
	}
	qp.state = StateTerminate
	qp.term = &TerminateFields{Code: code, ULPDU: append([]byte(nil), offending...), SegmentLength: segLen}
	qp.termErr = &TerminateError{Code: code}
	qp.err = qp.termErr
	qp.mu.Unlock()
	qp.wake()
	// A TX blocked on a peer that no longer reads must not hold the
	// Terminate forever.
	t := time.AfterFunc(2*time.Second, func() {
		select {
		case <-qp.done:
		default:
			qp.fail(qp.termErr, true)
		}
	})
	qp.mu.Lock()
	qp.termTimer = t
	qp.mu.Unlock()
}

// probesImm reports whether a WR of op waits for a zero-length RDMA Read
// sent right behind its Immediate Data message, holding an ORQ entry, and
// completes with that Read's response: RFC 7306 gives no way to ask a peer
// whether it takes Immediate Data, and one that does not (Linux siw)
// answers with a Terminate, which completes the WR with the error it
// names rather than with a success reported when the bytes left. Once a
// response came, the peer is known to take them and WRs with Immediate
// complete as Sends and Writes do. Not with ORD 0 (the peer takes no
// Reads). qp.mu is held.
// +checklocks:qp.mu
func (qp *QP) probesImm(op WROp) bool {
	return op.hasImm() && !qp.immOK && qp.params.ORD > 0
}

// needsORQ reports whether a WR of op takes an ORQ entry; qp.mu is held.
// +checklocks:qp.mu
func (qp *QP) needsORQ(op WROp) bool { return op.usesORQ() || qp.probesImm(op) }

// terminated handles a Terminate from the peer; op, when known, is the
// opcode of the message it names.
func (qp *QP) terminated(code TermCode, op Opcode, opKnown bool) {
	if qp.cfg.Stats != nil {
		qp.cfg.Stats.TermRecv.Add(1)
	}
	te := &TerminateError{Code: code, Received: true}
	qp.mu.Lock()
	qp.termOp, qp.termOpKnown = op, opKnown
	if qp.state < StateTerminate {
		qp.state = StateTerminate
	}
	if qp.termErr == nil {
		qp.termErr = te
		qp.err = te
	}
	qp.mu.Unlock()
	qp.event(Event{Type: EventTerminateReceived, Term: code, Err: te})
	// This runs inside the stream's read callback (netstack holds the
	// endpoint lock there), and closing the stream takes that lock:
	// fail from another goroutine. The receiver discards what follows.
	go qp.fail(te, false)
}

// termAnswers reports whether a Terminate naming a message of opcode op
// answers the outstanding request o.
func termAnswers(op Opcode, o *orqEntry) bool {
	switch op {
	case OpImmediate, OpImmediateSE:
		return o.probe
	case OpAtomicRequest:
		return o.op.IsAtomic()
	case OpReadRequest:
		return !o.probe && !o.op.IsAtomic()
	}
	return true
}

// fail moves the QP to ERROR: it closes (or resets) the stream, lets both
// goroutines end, and flushes every outstanding work request.
func (qp *QP) fail(err error, abort bool) {
	qp.mu.Lock()
	if qp.state == StateError {
		qp.mu.Unlock()
		return
	}
	qp.state = StateError
	if qp.err == nil {
		qp.err = err
	}
	s := qp.stream
	cancel := qp.cancel
	if qp.holdTimer != nil {
		// A QP destroyed during its first-FPDU hold sends nothing; the
		// timer must not keep it alive either.
		qp.holdTimer.Stop()
		qp.held = false
	}
	qp.mu.Unlock()
	if qp.segUntap != nil {
		qp.segUntap()
		qp.seg.stop()
	}
	if cancel != nil {
		cancel()
	}
	if s != nil {
		if abort {
			s.Abort()
		} else {
			s.Close()
		}
	}
	qp.wake()
	go qp.flush()
}

// flush completes every outstanding WR with an error once the goroutines
// have stopped, then closes Done.
func (qp *QP) flush() {
	if qp.txDone != nil {
		<-qp.txDone
		<-qp.rxDone
	}
	// A poster may still be transmitting in its own goroutine (postDirect,
	// postInline), and an application may be receiving in its own
	// (WaitProgress, Progress: a ManualProgress QP has no receive
	// goroutine) or the connection tap on the link's; the failed stream
	// ends the write and the read. The receiver may be completing a Read
	// or an atomic from the ORQ, which must not be flushed from under it.
	// Once flush is done, nothing of this QP touches registered memory
	// again.
	qp.txMu.Lock()
	qp.txMu.Unlock()
	qp.rxMu.Lock()
	qp.rxMu.Unlock()
	qp.mu.Lock()
	var term *TerminateError
	if qp.termErr != nil && qp.termErr.Received {
		term = qp.termErr
	}
	var out []Completion
	// Outstanding Reads, atomics and Immediate Data probes: the one the
	// peer's Terminate answers gets the remote error, the rest are
	// flushed. That is the oldest of the kind of message the Terminate
	// names (they are answered in order), or without a name the oldest.
	blame := -1
	if term != nil {
		for i := 0; i < qp.orqN && blame < 0; i++ {
			o := &qp.orq[(qp.orqHead+i)%len(qp.orq)]
			if !o.rtr && (!qp.termOpKnown || termAnswers(qp.termOp, o)) {
				blame = i
			}
		}
	}
	var orqOut []*Completion // nil: an RTR's, which reports nothing
	for i := 0; qp.orqN > 0; i++ {
		o := &qp.orq[qp.orqHead]
		qp.orqHead = (qp.orqHead + 1) % len(qp.orq)
		qp.orqN--
		if o.rtr {
			orqOut = append(orqOut, nil)
			continue
		}
		c := Completion{ID: o.id, Status: StatusWRFlush, Op: wrCompOp(o.op)}
		if i == blame {
			c.Status = statusForTerminate(term.Code)
			c.Term = term.Code
		}
		orqOut = append(orqOut, &c)
	}
	for qp.sqN > 0 {
		e := &qp.sq[qp.sqHead]
		qp.sqHead = (qp.sqHead + 1) % len(qp.sq)
		qp.sqN--
		out = append(out, Completion{ID: e.wr.ID, Status: StatusWRFlush, Op: wrCompOp(e.wr.Op)})
	}
	qp.mu.Unlock()
	// The outstanding ones first, each releasing the WRs held behind it,
	// then those never sent (posted after all of them).
	for _, c := range orqOut {
		qp.retireORQ(c)
	}
	for _, c := range out {
		qp.completeSQ(c)
	}
	qp.rxMu.Lock() // a manual-progress caller may still be in Progress
	if qp.rx.cur.active {
		qp.complete(qp.cfg.RecvCQ, Completion{ID: qp.rx.cur.wqe.id, Status: StatusWRFlush, Op: CompRecv})
		qp.rx.cur.active = false
	}
	qp.rx.state = rxDead
	qp.rxMu.Unlock()
	if !qp.cfg.SharedRQ {
		qp.cfg.RQ.flush(func(id uint64) {
			qp.complete(qp.cfg.RecvCQ, Completion{ID: id, Status: StatusWRFlush, Op: CompRecv})
		})
	}
	qp.unbindWindows()
	qp.mu.Lock()
	err, byPeer := qp.err, !qp.closing
	qp.mu.Unlock()
	qp.event(Event{Type: EventDisconnected, Err: err, ByPeer: err == nil && byPeer})
	qp.mu.Lock()
	if qp.termTimer != nil {
		// Done already: the timer would only keep the QP (and what it
		// references) alive for its two seconds.
		qp.termTimer.Stop()
		qp.termTimer = nil
	}
	qp.mu.Unlock()
	close(qp.done)
}

// statusForTerminate maps a received Terminate to the status of the Read
// or atomic it answers.
func statusForTerminate(c TermCode) Status {
	switch {
	case c.Layer == LayerRDMAP && c.EType == ETypeRemoteProtection:
		return StatusRemoteAccess
	case c.Layer == LayerDDP && c.EType == ETypeTaggedBuffer:
		return StatusRemoteAccess
	case c.Layer == LayerDDP && c.EType == ETypeUntaggedBuffer:
		return StatusRemoteInvalidRequest
	case c.Layer == LayerRDMAP && c.EType == ETypeRemoteOperation:
		return StatusRemoteOperation
	}
	return StatusFatal
}

func wrCompOp(op WROp) CompletionOp {
	switch op {
	case WRWrite, WRWriteImm:
		return CompWrite
	case WRRead, WRReadInv:
		return CompRead
	case WRLocalInv:
		return CompLocalInv
	case WRRegMR:
		return CompRegMR
	case WRBindMW, wrBindMW1:
		return CompBindMW
	case WRAtomicCmpSwap:
		return CompCmpSwap
	case WRAtomicFetchAdd:
		return CompFetchAdd
	}
	return CompSend
}

// Disconnect closes the stream gracefully: queued sends are transmitted,
// then a TCP FIN is sent; the QP reaches ERROR (flushing what remains, such
// as posted receives) when the peer closes too or ctx ends.
func (qp *QP) Disconnect(ctx context.Context) error {
	qp.mu.Lock()
	switch qp.state {
	case StateIdle:
		qp.state = StateError
		qp.closing = true // this end's doing (Event.ByPeer)
		qp.mu.Unlock()
		go qp.flush()
		<-qp.done
		return nil
	case StateRTS:
		qp.closing = true
		qp.state = StateClosing
	}
	qp.mu.Unlock()
	qp.wake()
	select {
	case <-qp.done:
		return nil
	case <-ctx.Done():
		qp.fail(ctx.Err(), true)
		<-qp.done
		return ctx.Err()
	}
}

// Close tears the QP down at once (abortive close: TCP RST) and flushes
// every outstanding work request. It is idempotent.
func (qp *QP) Close() error {
	qp.mu.Lock()
	st := qp.state
	qp.mu.Unlock()
	if st == StateIdle {
		return qp.Disconnect(context.Background())
	}
	qp.fail(ErrClosed, true)
	<-qp.done
	return nil
}

// LocalCatastrophicTermCode is the code of the Terminate a QP sends when
// it fails for a local reason the peer had no part in (RFC 5040 §7.1:
// RDMAP, local catastrophic error).
var LocalCatastrophicTermCode = TermCode{LayerRDMAP, ETypeRDMAPCatastrophic, CodeUnspecified}

// Fatal tears the QP down as an RNIC does on a local catastrophic error: a
// connected QP sends the peer a Terminate (LocalCatastrophicTermCode) and
// then closes the stream (a reset if the Terminate cannot go out within
// the Terminate timeout); outstanding work requests are flushed. It
// returns once the QP is done, as Close does, and is Close in any state
// but RTS. The Terminate touches no registered memory.
func (qp *QP) Fatal() error {
	qp.mu.Lock()
	st := qp.state
	qp.mu.Unlock()
	if st != StateRTS {
		return qp.Close()
	}
	qp.terminate(LocalCatastrophicTermCode, nil, 0)
	<-qp.done
	return nil
}

// Progress runs the receive path in the caller's goroutine: whatever the
// stream holds is parsed and placed now, completions included. It never
// blocks. A busy-polling application (perftest's write_lat polls memory)
// calls it in its loop and saves the hand-off to the RX goroutine.
func (qp *QP) Progress() {
	// No qp.mu here: a poller calls this once per message. After ERROR
	// the stream is closed and the read below just reports that.
	s, _ := qp.live.Load().(Stream)
	if s == nil || !qp.rxMu.TryLock() {
		return
	}
	_, err := s.TryReadTo(qp.rx.in, 0) // +checklocksforce: TryLock took rxMu
	qp.rx.afterRead()
	qp.rxMu.Unlock()
	if err != nil {
		qp.rx.streamErr(err)
	}
}

// WaitProgress blocks until the stream has bytes (or ctx ends), then runs
// the receive path on them in the caller's goroutine. With ManualProgress
// it is how an application waits: it reads the stream exactly as a TCP
// reader does (try, block for the stack's wake-up, read), so a message
// costs the same one hand-off. A Progress call from another goroutine
// meanwhile returns at once. With segment placement it waits without the
// receive path (waitProgressFed).
func (qp *QP) WaitProgress(ctx context.Context) error {
	s, _ := qp.live.Load().(Stream)
	if s == nil {
		return ErrInvalidState
	}
	select {
	case <-qp.done:
		return qp.doneErr()
	default:
	}
	if seg := qp.seg; seg != nil && seg.fedWake != nil {
		if ws, ok := s.(readableWaiter); ok {
			return qp.waitProgressFed(ctx, s, ws, seg)
		}
	}
	// Closing the QP closes the stream first, which ends the read, so
	// holding rxMu while blocked cannot hold up the flush.
	qp.rxMu.Lock()
	_, err := s.ReadTo(ctx, qp.rx.in, 0)
	qp.rx.afterRead()
	qp.rxMu.Unlock()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		qp.rx.streamErr(err)
		return qp.doneErr()
	}
	return nil
}

// readableWaiter is a Stream that can wait for readability and another
// wake-up at once (netstack.Conn).
type readableWaiter interface {
	WaitReadableOr(ctx context.Context, wake <-chan struct{}) error
}

// unreadWaiter is a Stream that can wait leaving the bytes the reader has
// had another way out of readability (netstack.Conn).
type unreadWaiter interface {
	WaitUnreadOr(ctx context.Context, wake <-chan struct{}, had func() int, spin time.Duration) error
}

// MaxWaitSpin bounds QPConfig.WaitSpin.
const MaxWaitSpin = 10 * time.Millisecond

// waitProgressFed is WaitProgress with segment placement: it waits without
// holding rxMu, so that the connection tap can feed the receiver, on the
// link's goroutine, the short segment in order (or the hole's filler) that
// the caller waits for, and it returns as soon as the tap has: the message
// completes without TCP's processor goroutine and a wake-up in between.
// It may return without progress; the caller checks its condition again.
// Woken by the tap, it returns without reading the stream: what was fed is
// placed and delivered, and what TCP holds of it is read on the next call.
func (qp *QP) waitProgressFed(ctx context.Context, s Stream, ws readableWaiter, seg *segPlacer) error {
	fed := seg.fedN.Load()
	if qp.rx.waitUnread != nil {
		// What TCP holds of the stream the tap has fed already (TCP's
		// processor takes a segment after the tap) is read only when
		// TCP holds more, or drainAfter of it (see receiver.fedHeld).
		if err := qp.rx.waitUnread(ctx, seg.fedWake, qp.rx.heldFn, qp.cfg.WaitSpin); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			qp.rx.streamErr(err)
			return qp.doneErr()
		}
		if seg.fedN.Load() != fed {
			return nil
		}
		// TCP holds more than the tap fed, or the connection is
		// ending: read it.
	}
	for waited := false; ; waited = true {
		if waited && seg.fedN.Load() != fed {
			return nil
		}
		qp.rxMu.Lock()
		n, err := s.TryReadTo(qp.rx.in, 0)
		qp.rx.afterRead()
		qp.rxMu.Unlock()
		if err != nil {
			qp.rx.streamErr(err)
			return qp.doneErr()
		}
		if n > 0 || waited {
			return nil
		}
		if err := ws.WaitReadableOr(ctx, seg.fedWake); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			qp.rx.streamErr(err)
			return qp.doneErr()
		}
	}
}

func (qp *QP) doneErr() error {
	if err := qp.Err(); err != nil {
		return err
	}
	return ErrClosed
}
