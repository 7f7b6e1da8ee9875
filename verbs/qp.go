package verbs

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmatap/rdmatap/iwarp"
)

// SGE is a scatter-gather element: Length bytes at Addr of the MR whose
// STag is LKey (see MR.SGE).
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   STag
}

// Opcode is a send work request's operation (ibv_wr_opcode).
type Opcode uint8

// Send operations.
const (
	OpSend           Opcode = 0
	OpSendInvalidate Opcode = 1
	OpWrite          Opcode = 2
	OpRead           Opcode = 3
	// RFC 7306 (between rdmatap endpoints; see DeviceConfig.NoExtensions).
	OpWriteImm       Opcode = 4 // IBV_WR_RDMA_WRITE_WITH_IMM
	OpSendImm        Opcode = 5 // IBV_WR_SEND_WITH_IMM
	OpAtomicCmpSwap  Opcode = 6 // IBV_WR_ATOMIC_CMP_AND_SWP
	OpAtomicFetchAdd Opcode = 7 // IBV_WR_ATOMIC_FETCH_AND_ADD
	// Memory registration operations: see memwr.go.
)

func (o Opcode) String() string { return iwarp.WROp(o).String() }

// IsAtomic reports whether o is an atomic operation.
func (o Opcode) IsAtomic() bool { return o == OpAtomicCmpSwap || o == OpAtomicFetchAdd }

// SendFlags are ibv_send_flags.
type SendFlags uint8

// Send flags.
const (
	Signaled  SendFlags = 1 << iota // generate a completion (IBV_SEND_SIGNALED)
	Inline                          // copy the data at post time (IBV_SEND_INLINE)
	Solicited                       // Send (or Immediate Data) with Solicited Event
	Fence                           // wait for outstanding RDMA Reads first
)

// SendWR is a send work request (ibv_send_wr): ID is the wr_id; RDMA Write
// and Read name the remote buffer with RemoteAddr and RKey; Send with
// Invalidate names the peer's STag in InvalidateRKey. The SGL is read
// during PostSend only.
//
// OpWriteImm and OpSendImm carry Imm (imm_data) to the peer's receive
// completion, which consumes a posted receive (WCRecvRDMAWithImm with
// ByteLen 0 for a Write, WCRecv for a Send; Flags has WCWithImm). The
// atomics (OpAtomicFetchAdd, OpAtomicCmpSwap) act on the 8-byte aligned
// word at RemoteAddr of the peer's MR RKey, which needs AccessRemoteAtomic:
// FetchAdd adds CompareAdd; CmpSwap stores Swap if the word equals
// CompareAdd. The SGL is one 8-byte SGE (with local write access) that
// receives the word's original value in host byte order; the WR completes
// (WCFetchAdd, WCCompSwap) when the peer's response arrives. Atomics count
// against ORD, as RDMA Reads do.
//
// Memory registration WRs (OpRegMR, OpBindMW, OpLocalInv, OpReadInv) are
// described in memwr.go; MR.RegWR and MW.BindWR build the first two (they
// set the MR or window, and the binding, in unexported fields).
type SendWR struct {
	ID    uint64
	Op    Opcode
	Flags SendFlags
	SGL   []SGE
	// RDMA Write and Read, atomics: the remote buffer.
	RemoteAddr uint64
	RKey       STag
	// Send with Invalidate: the peer's STag to invalidate; Local
	// Invalidate and Read with Invalidate: the local one.
	InvalidateRKey STag
	// Write and Send with Immediate: the immediate data.
	Imm uint32
	// Atomics: FetchAdd's addend or CmpSwap's comparand, and CmpSwap's
	// new value.
	CompareAdd uint64
	Swap       uint64

	mr *iwarp.FastRegMR // REG_MR: the fast-register MR (RegWR)
	// Access is the access a REG_MR grants.
	Access Access
	mw     *iwarp.Window // BIND_MW: the window (BindWR)
	bind   iwarp.MWBind  // BIND_MW: where and how
	data   []byte        // the engine's inline Data (a service's ring entry; unused here)
}

// RecvWR is a receive work request.
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

// QPState is the QP's state.
type QPState uint8

// QP states.
const (
	QPIdle QPState = iota
	QPRTS
	QPClosing
	QPTerminate
	QPError
)

func (s QPState) String() string { return iwarp.QPState(s).String() }

// QPConfig are a QP's attributes (ibv_qp_init_attr).
type QPConfig struct {
	SendCQ, RecvCQ *CQ
	SRQ            *SRQ // receives come from the SRQ instead of an own RQ
	MaxSendWR      int  // default 128
	MaxRecvWR      int  // default 128
	MaxSendSGE     int  // default 4
	MaxRecvSGE     int  // default 4
	MaxInline      int  // default 64
	SignalAll      bool // sq_sig_all
	// ManualProgress: the QP has no receive goroutine; the application
	// drives receiving with Progress or WaitProgress (libfabric's
	// FI_PROGRESS_MANUAL). For polling applications: one goroutine hand-off
	// less per message.
	ManualProgress bool
	// WaitSpin: with ManualProgress on a device with segment placement,
	// WaitProgress keeps checking for a short message's arrival this long
	// before it sleeps, yielding its P in between (runtime.Gosched), as a
	// polling RDMA application spins on its CQ. Meant for a device whose
	// TAP link busy-polls (endpoint.Config.BusyPoll), whose read loop then
	// takes turns with it. A TAP that waits in Go's netpoller instead gets
	// no turn while the spin lasts on a process of one P, so its frames
	// wait out the spin. 0 (the default): sleep at once. At most
	// MaxWaitSpin; a service's QPs ignore it.
	WaitSpin time.Duration
}

// MaxWaitSpin bounds QPConfig.WaitSpin.
const MaxWaitSpin = iwarp.MaxWaitSpin

// QP is a reliable-connected queue pair.
//
// It has no mutex: its fields are set by CreateQP and never change. The
// engine's QP (iwarp.QP) and a service's QP (remoteQP) lock for
// themselves; CreateQP and Close take the device's, the PD's, the SRQ's
// and the CQs' locks one at a time, never nested.
type QP struct {
	pd  *PD
	cfg QPConfig
	ops qpOps // engineQP or remoteQP: what the QP does
	// An embedded QP's own state: the engine's QP and its receive queue
	// (a service's QP keeps its own in remoteQP).
	iw *iwarp.QP
	rq *iwarp.RecvQueue
}

// CreateQP makes an RC QP. It is connected through Dial or
// ConnRequest.Accept.
func (pd *PD) CreateQP(cfg QPConfig) (*QP, error) {
	if cfg.SendCQ == nil || cfg.RecvCQ == nil {
		return nil, fmt.Errorf("%w: QP needs a send and a receive CQ", ErrInvalidArgument)
	}
	if cfg.WaitSpin < 0 || cfg.WaitSpin > MaxWaitSpin {
		return nil, fmt.Errorf("%w: WaitSpin %v: want 0..%v", ErrInvalidArgument, cfg.WaitSpin, MaxWaitSpin)
	}
	if cfg.MaxSendWR == 0 {
		cfg.MaxSendWR = 128
	}
	if cfg.MaxRecvWR == 0 {
		cfg.MaxRecvWR = 128
	}
	if cfg.MaxSendSGE == 0 {
		cfg.MaxSendSGE = 4
	}
	if cfg.MaxRecvSGE == 0 {
		cfg.MaxRecvSGE = 4
	}
	if cfg.MaxInline == 0 {
		cfg.MaxInline = 64
	}
	return pd.ops.createQP(cfg)
}

func (e *enginePD) createQP(cfg QPConfig) (*QP, error) {
	pd := (*PD)(e)
	d := pd.dev
	qp := &QP{pd: pd, cfg: cfg}
	qp.ops = engineQP{qp}
	if cfg.SRQ != nil {
		if cfg.SRQ.pd != pd {
			return nil, fmt.Errorf("%w: SRQ belongs to another PD", ErrInvalidArgument)
		}
		if !cfg.SRQ.use() {
			return nil, fmt.Errorf("%w: the SRQ is closed", ErrInvalidArgument)
		}
		qp.rq = cfg.SRQ.rq
	} else {
		rq, err := iwarp.NewRecvQueue(cfg.MaxRecvWR, cfg.MaxRecvSGE)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
		}
		qp.rq = rq
	}
	num := d.nextQPN.Add(1)
	iw, err := iwarp.NewQP(iwarp.QPConfig{
		Num: num, PD: pd.id, Mem: d.mem, SendCQ: cfg.SendCQ.engineSink(), RecvCQ: cfg.RecvCQ.engineSink(),
		RQ: qp.rq, SharedRQ: cfg.SRQ != nil, MaxSendWR: cfg.MaxSendWR, MaxSendSGE: cfg.MaxSendSGE,
		MaxInline: cfg.MaxInline, SignalAll: cfg.SignalAll, MaxFPDU: d.cfg.MaxFPDU, ManualProgress: cfg.ManualProgress, WaitSpin: cfg.WaitSpin, FirstFPDUDelay: d.cfg.FirstFPDUDelay, MPAStrict: d.cfg.MPAStrict,
		Stats: &d.stats, OnEvent: func(e iwarp.Event) { d.post(qpEvent(e)) },
		Placement: iwarp.Placement(d.cfg.Placement), SegStats: &d.seg, TimeHoleFills: d.cfg.TimeHoleFills, NoExtensions: d.cfg.NoExtensions,
	})
	if err != nil {
		if cfg.SRQ != nil {
			cfg.SRQ.unuse()
		}
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	qp.iw = iw
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		iw.Close()
		if cfg.SRQ != nil {
			cfg.SRQ.unuse()
		}
		return nil, net.ErrClosed
	}
	d.qps[num] = qp
	d.mu.Unlock()
	pd.mu.Lock()
	pd.qps++
	pd.mu.Unlock()
	cfg.SendCQ.use(1)
	cfg.RecvCQ.use(1)
	return qp, nil
}

func qpEvent(e iwarp.Event) AsyncEvent {
	t := map[iwarp.EventType]AsyncEventType{
		iwarp.EventEstablished: EventEstablished, iwarp.EventDisconnected: EventDisconnected,
		iwarp.EventTerminateSent: EventTerminateSent, iwarp.EventTerminateReceived: EventTerminateReceived,
		iwarp.EventFatal: EventQPFatal,
	}[e.Type]
	return AsyncEvent{Type: t, QPNum: e.QPNum, Term: verbsTermCode(e.Term), Err: engineErr(e.Err), ByPeer: e.ByPeer}
}

// Num returns the QP number.
func (qp *QP) Num() uint32 { return qp.ops.qpNum() }

// PD returns the QP's protection domain.
func (qp *QP) PD() *PD { return qp.pd }

// State returns the QP state.
// On a device of a service it asks the service.
func (qp *QP) State() QPState { return qp.ops.qpState() }

// Err returns why the QP went to ERROR (nil after a clean disconnect).
func (qp *QP) Err() error { return qp.ops.qpErr() }

// Done is closed once the QP is in ERROR and every WR has completed.
func (qp *QP) Done() <-chan struct{} { return qp.ops.qpDone() }

// Progress runs the QP's receive path in the calling goroutine and never
// blocks: what the connection holds is placed and completed now. A
// busy-polling application (one that spins on memory, as perftest's
// write_lat does, or on CQ.Poll) calls it in its loop to skip the hand-off
// to the QP's receive goroutine, which otherwise does the same work.
// On a device of a service it does nothing: the service progresses the QP.
func (qp *QP) Progress() { qp.ops.progress() }

// WaitProgress blocks until the connection has data (or ctx ends) and runs
// the receive path in the calling goroutine. It is how a ManualProgress
// application waits for a peer's RDMA Write to land. Closing the QP ends
// it; a Progress call meanwhile returns at once. With segment placement
// (DeviceConfig.Placement) it also returns once the connection's segment
// tap has fed the receive path a short message in order, on the link's
// goroutine, ahead of TCP; it may return without progress, so callers
// check their condition and call again.
//
// On a device of a service, where the service runs the receive path, it
// yields once and returns (or returns the QP's end).
func (qp *QP) WaitProgress(ctx context.Context) error { return qp.ops.waitProgress(ctx) }

// OpenTXGate lets an accepted (responder) QP that waits for the
// initiator's first message (DeviceConfig.MPAStrict, or peer-to-peer
// mode; and the first-FPDU hold of FirstFPDUDelay) transmit before it has
// arrived, as Linux siw allows. Call it only once the initiator is known
// to have finished connecting, e.g. it has spoken on another connection
// since: an initiator that is still reading the MPA Reply (siw) resets a
// connection whose Reply is followed by early bytes. It does nothing on
// an initiator, nor on a device of a service.
func (qp *QP) OpenTXGate() { qp.ops.openTXGate() }

// Config returns the QP's attributes.
func (qp *QP) Config() QPConfig { return qp.cfg }

// PostSend posts send work requests in order. It copies what it needs,
// allocates nothing, and returns a *PostError naming the first WR not
// posted (ibv_post_send's bad_wr). It keeps no pointer of the WRs, so WRs
// and SGLs built in the call (qp.PostSend(SendWR{SGL: []SGE{...}})) stay
// on the caller's stack.
//
// On a device of a service the WRs go into the QP's send ring; an error
// the service finds later comes back as an error completion.
func (qp *QP) PostSend(wrs ...SendWR) error {
	// The data path calls its implementation statically: through the
	// interface the compiler could not tell that wrs is not kept, and
	// every post would allocate it.
	if r, ok := qp.ops.(*remoteQP); ok {
		return r.postSend(wrs)
	}
	return qp.ops.(engineQP).postSend(wrs)
}

// PostRecv posts receive work requests to the QP's own receive queue.
func (qp *QP) PostRecv(wrs ...RecvWR) error {
	if r, ok := qp.ops.(*remoteQP); ok { // statically, as PostSend
		return r.postRecv(wrs)
	}
	return qp.ops.(engineQP).postRecv(wrs)
}

// Disconnect closes the connection gracefully (rdma_disconnect): queued
// sends go out, then TCP FIN; it returns once the QP is in ERROR with every
// WR completed, or ctx ends (then it aborts).
func (qp *QP) Disconnect(ctx context.Context) error { return qp.ops.disconnect(ctx) }

// Close destroys the QP: the connection is reset and outstanding WRs
// complete with StatusWRFlush.
func (qp *QP) Close() error { return qp.ops.destroy() }

// SetError moves the QP to ERROR (ibv_modify_qp to IBV_QPS_ERR), in any
// state: a connection is reset (the peer sees it end), and every
// outstanding WR completes with StatusWRFlush; it returns once they have.
// The QP stays until Close; posting to it fails with ErrInvalidState.
func (qp *QP) SetError() error { return qp.ops.setError() }

// qpOps is what a QP does, one implementation per kind of device: the
// protocol engine's QP of an embedded device (engineQP), or a QP of a
// service, reached through its rings and socket (remoteQP, remote_qp.go).
type qpOps interface {
	qpNum() uint32
	qpState() QPState
	qpErr() error
	qpDone() <-chan struct{}
	progress()
	waitProgress(ctx context.Context) error
	openTXGate()
	postSend(wrs []SendWR) error
	postRecv(wrs []RecvWR) error
	disconnect(ctx context.Context) error
	setError() error
	destroy() error
	bindMW(mw *MW, id uint64, flags SendFlags, b BindInfo) (STag, error)
}

// engineQP is an embedded device's QP: the engine's.
type engineQP struct{ qp *QP }

func (e engineQP) qpNum() uint32           { return e.qp.iw.Num() }
func (e engineQP) qpState() QPState        { return QPState(e.qp.iw.State()) }
func (e engineQP) qpErr() error            { return engineErr(e.qp.iw.Err()) }
func (e engineQP) qpDone() <-chan struct{} { return e.qp.iw.Done() }
func (e engineQP) progress()               { e.qp.iw.Progress() }
func (e engineQP) waitProgress(ctx context.Context) error {
	return engineErr(e.qp.iw.WaitProgress(ctx))
}
func (e engineQP) openTXGate()                          { e.qp.iw.OpenTXGate() }
func (e engineQP) disconnect(ctx context.Context) error { return engineErr(e.qp.iw.Disconnect(ctx)) }
func (e engineQP) destroy() error                       { return e.qp.close(e.qp.iw.Close) }
func (e engineQP) setError() error                      { return engineErr(e.qp.iw.Close()) }

func (e engineQP) postSend(wrs []SendWR) error {
	if i, err := e.qp.iw.PostSend(engineWRs(wrs)...); err != nil {
		return &PostError{Index: i, Err: err}
	}
	return nil
}

func (e engineQP) postRecv(wrs []RecvWR) error {
	for i := range wrs {
		if err := e.qp.iw.PostRecv(wrs[i].ID, engineSGL(wrs[i].SGL)); err != nil {
			return &PostError{Index: i, Err: err}
		}
	}
	return nil
}

// fatal destroys an embedded QP as an RNIC does on a local catastrophic
// error: a connected QP sends the peer a Terminate (RDMAP, local
// catastrophic error) before its connection closes. The service uses it
// for the QPs of a client that died.
func (qp *QP) fatal() error { return qp.close(qp.iw.Fatal) }

func (qp *QP) close(how func() error) error {
	err := how()
	d := qp.pd.dev
	d.mu.Lock()
	_, ok := d.qps[qp.Num()]
	delete(d.qps, qp.Num())
	d.mu.Unlock()
	if ok {
		qp.pd.mu.Lock()
		qp.pd.qps--
		qp.pd.mu.Unlock()
		if qp.cfg.SRQ != nil {
			qp.cfg.SRQ.unuse()
		}
		qp.cfg.SendCQ.use(-1)
		qp.cfg.RecvCQ.use(-1)
	}
	return err
}

// SRQ is a shared receive queue.
//
// Locks: see the package documentation.
type SRQ struct {
	pd  *PD
	ops srqOps           // engineSRQ or remoteSRQ (remote_srq.go): what the SRQ does
	rq  *iwarp.RecvQueue // an embedded SRQ's queue

	mu sync.Mutex
	// +checklocks:mu
	qps    int         // QPs created on it and not closed
	closed atomic.Bool // Close succeeded; stored under mu
}

// use counts a QP that is being created on the SRQ; false: it is closed.
func (s *SRQ) use() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return false
	}
	s.qps++
	return true
}

// unuse undoes use when the QP is closed or its creation failed.
func (s *SRQ) unuse() {
	s.mu.Lock()
	s.qps--
	s.mu.Unlock()
}

// Close destroys the SRQ (ibv_destroy_srq). It fails with ErrBusy while a
// QP created on it is open, as ibv_destroy_srq fails with EBUSY. The
// receives still posted are discarded without completions; PostRecv and
// SetLimit then fail with net.ErrClosed. Close is idempotent.
func (s *SRQ) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return nil
	}
	if s.qps > 0 {
		return fmt.Errorf("%w: %d QPs use the SRQ", ErrBusy, s.qps)
	}
	if err := s.ops.destroy(); err != nil {
		return err
	}
	s.closed.Store(true)
	s.pd.mu.Lock()
	s.pd.srqs--
	s.pd.mu.Unlock()
	return nil
}

// CreateSRQ makes a shared receive queue.
func (pd *PD) CreateSRQ(maxWR, maxSGE int) (*SRQ, error) {
	pd.mu.Lock()
	closed := pd.closed
	pd.mu.Unlock()
	if closed {
		return nil, net.ErrClosed
	}
	s, err := pd.ops.createSRQ(maxWR, maxSGE)
	if err != nil {
		return nil, err
	}
	pd.mu.Lock()
	pd.srqs++
	pd.mu.Unlock()
	return s, nil
}

func (e *enginePD) createSRQ(maxWR, maxSGE int) (*SRQ, error) {
	rq, err := iwarp.NewRecvQueue(maxWR, maxSGE)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	s := &SRQ{pd: (*PD)(e), rq: rq}
	s.ops = (*engineSRQ)(s)
	return s, nil
}

// srqOps is what an SRQ does, one implementation per kind of device: the
// engine's receive queue (engineSRQ) or a service's SRQ, reached through
// its ring and socket (remoteSRQ, remote_srq.go). PostRecv calls its
// implementation statically (see QP.PostSend).
type srqOps interface {
	postRecv(wrs []RecvWR) error
	pending() int
	setLimit(limit int) error
	// destroy releases what the kind holds; SRQ.Close has checked that
	// no QP uses it.
	destroy() error
}

// engineSRQ is an SRQ of an embedded device.
type engineSRQ SRQ

func (e *engineSRQ) postRecv(wrs []RecvWR) error {
	for i := range wrs {
		if err := e.rq.Post(wrs[i].ID, engineSGL(wrs[i].SGL)); err != nil {
			return &PostError{Index: i, Err: err}
		}
	}
	return nil
}

func (e *engineSRQ) pending() int { return e.rq.Len() }

func (e *engineSRQ) setLimit(limit int) error {
	if limit < 0 || limit > e.rq.Cap() {
		return fmt.Errorf("%w: SRQ limit %d", ErrInvalidArgument, limit)
	}
	s := (*SRQ)(e)
	d := s.pd.dev
	s.rq.SetLimit(limit, func() { d.post(AsyncEvent{Type: EventSRQLimitReached, SRQ: s}) })
	return nil
}

func (e *engineSRQ) destroy() error { return nil }

// PostRecv posts receives to the SRQ.
func (s *SRQ) PostRecv(wrs ...RecvWR) error {
	if s.closed.Load() {
		return &PostError{Index: 0, Err: net.ErrClosed}
	}
	if r, ok := s.ops.(*remoteSRQ); ok { // statically, as QP.PostSend
		return r.postRecv(wrs)
	}
	return s.ops.(*engineSRQ).postRecv(wrs)
}

// Len returns the number of posted receives.
// On a device of a service: those the service has not yet taken from the
// ring are not counted.
func (s *SRQ) Len() int {
	if s.closed.Load() {
		return 0
	}
	return s.ops.pending()
}

// SetLimit arms the SRQ limit: when fewer than limit receives remain, the
// device reports EventSRQLimitReached once (ibv_modify_srq srq_limit).
func (s *SRQ) SetLimit(limit int) error {
	if s.closed.Load() {
		return net.ErrClosed
	}
	return s.ops.setLimit(limit)
}
