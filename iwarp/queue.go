package iwarp

import (
	"errors"
	"fmt"
	"sync"
)

// SGE is a scatter-gather element: Length bytes at virtual address Addr of
// the region whose STag is LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// WROp is the operation of a send work request.
type WROp uint8

// Send work request operations.
const (
	WRSend WROp = iota
	WRSendInvalidate
	WRWrite
	WRRead
	// RFC 7306. An RDMA Write with Immediate is an RDMA Write followed by
	// an Immediate Data message; a Send with Immediate is an Immediate
	// Data message (see ImmediateData) followed by the Send.
	WRWriteImm
	WRSendImm
	WRAtomicCmpSwap
	WRAtomicFetchAdd
	// Memory registration work requests (memwr.go). They put nothing on
	// the wire and execute in send queue order: Local Invalidate
	// (InvalidateRKey names the STag), REG_MR (MR, RKey with the new key,
	// Access), BIND_MW of a type 2 window (MW, RKey with the new key,
	// Bind), and an RDMA Read that invalidates the local STag
	// InvalidateRKey once its data has arrived (IB_WR_RDMA_READ_WITH_INV;
	// a local operation, RFC 5040 has no such message).
	WRLocalInv
	WRRegMR
	WRBindMW
	WRReadInv
	// wrBindMW1 binds a type 1 window (QP.BindMW1, ibv_bind_mw).
	wrBindMW1
)

// IsAtomic reports whether o is an atomic operation.
func (o WROp) IsAtomic() bool { return o == WRAtomicCmpSwap || o == WRAtomicFetchAdd }

// usesORQ reports whether o waits for a response, holding an ORQ entry
// (an outstanding RDMA Read or atomic, bounded by ORD).
func (o WROp) usesORQ() bool { return o == WRRead || o == WRReadInv || o.IsAtomic() }

// hasImm reports whether o sends an Immediate Data message (RFC 7306).
func (o WROp) hasImm() bool { return o == WRWriteImm || o == WRSendImm }

// local reports whether o is a memory registration operation, which
// executes at the QP and sends nothing.
func (o WROp) local() bool { return o == WRLocalInv || o == WRRegMR || o == WRBindMW || o == wrBindMW1 }

// extension reports whether o needs the RFC 7306 extensions.
func (o WROp) extension() bool { return o >= WRWriteImm && o <= WRAtomicFetchAdd }

func (o WROp) String() string {
	switch o {
	case WRSend:
		return "SEND"
	case WRSendInvalidate:
		return "SEND_WITH_INV"
	case WRWrite:
		return "RDMA_WRITE"
	case WRRead:
		return "RDMA_READ"
	case WRWriteImm:
		return "RDMA_WRITE_WITH_IMM"
	case WRSendImm:
		return "SEND_WITH_IMM"
	case WRAtomicCmpSwap:
		return "ATOMIC_CMP_AND_SWP"
	case WRAtomicFetchAdd:
		return "ATOMIC_FETCH_AND_ADD"
	case WRLocalInv:
		return "LOCAL_INV"
	case WRRegMR:
		return "REG_MR"
	case WRBindMW, wrBindMW1:
		return "BIND_MW"
	case WRReadInv:
		return "RDMA_READ_WITH_INV"
	}
	return fmt.Sprintf("WROp(%d)", uint8(o))
}

// SendFlags are the ibv_send_flags a work request carries.
type SendFlags uint8

// Send flags.
const (
	FlagSignaled  SendFlags = 1 << iota // generate a completion
	FlagInline                          // copy the data at post time
	FlagSolicited                       // Send (or Immediate Data) with Solicited Event
	FlagFence                           // wait for outstanding RDMA Reads first
)

// SendWR is a send queue work request.
type SendWR struct {
	ID    uint64
	Op    WROp
	Flags SendFlags
	SGL   []SGE
	// RDMA Write and Read: the remote buffer.
	RemoteAddr uint64
	RKey       uint32
	// Send with Invalidate: the remote STag to invalidate; Local
	// Invalidate and Read with Invalidate: the local one.
	InvalidateRKey uint32
	// Write and Send with Immediate: the 32-bit immediate data the peer's
	// receive completion carries (libibverbs' imm_data).
	Imm uint32
	// Atomics (RemoteAddr and RKey name the 8-byte aligned target; the SGL
	// is one 8-byte SGE that receives the target's original value, in host
	// byte order): FetchAdd adds CompareAdd; CmpSwap writes Swap if the
	// target equals CompareAdd (libibverbs' wr.atomic.compare_add, swap).
	CompareAdd uint64
	Swap       uint64
	// REG_MR: the fast-register MR, the STag it takes (RKey: its index
	// with a new key) and the access the registration grants.
	MR     *FastRegMR
	Access Access
	// BIND_MW: the window (bound under RKey) and where and how.
	MW   *Window
	Bind MWBind
	// Data is an inline WR's payload given as bytes instead of an SGL
	// (with FlagInline and no SGEs, for Send and RDMA Write opcodes), at
	// most the QP's MaxInline: PostSend copies it once, so the caller may
	// reuse it (or have it in memory another process may change) at once.
	Data []byte
}

// Status is a work completion status; the values and strings are
// libibverbs' ibv_wc_status and ibv_wc_status_str.
type Status uint8

// Completion statuses.
const (
	StatusSuccess Status = iota
	StatusLocalLength
	StatusLocalQPOp
	StatusLocalEECOp
	StatusLocalProtection
	StatusWRFlush
	StatusMWBind
	StatusBadResponse
	StatusLocalAccess
	StatusRemoteInvalidRequest
	StatusRemoteAccess
	StatusRemoteOperation
	StatusRetryExceeded
	StatusRNRRetryExceeded
	StatusLocalRDDViolation
	StatusRemoteInvalidRDRequest
	StatusRemoteAbort
	StatusInvalidEECN
	StatusInvalidEECState
	StatusFatal
	StatusResponseTimeout
	StatusGeneral
)

var statusStrings = [...]string{
	"success",
	"local length error",
	"local QP operation error",
	"local EE context operation error",
	"local protection error",
	"Work Request Flushed Error",
	"memory management operation error",
	"bad response error",
	"local access error",
	"remote invalid request error",
	"remote access error",
	"remote operation error",
	"transport retry counter exceeded",
	"RNR retry counter exceeded",
	"local RDD violation error",
	"remote invalid RD request",
	"aborted error",
	"invalid EE context number",
	"invalid EE context state",
	"fatal error",
	"response timeout error",
	"general error",
}

func (s Status) String() string {
	if int(s) < len(statusStrings) {
		return statusStrings[s]
	}
	return "unknown"
}

// CompletionOp is the operation a completion reports (ibv_wc_opcode).
type CompletionOp uint8

// Completion operations.
const (
	CompSend  CompletionOp = 0
	CompWrite CompletionOp = 1
	CompRead  CompletionOp = 2
	// CompCmpSwap and CompFetchAdd complete atomics (IBV_WC_COMP_SWAP,
	// IBV_WC_FETCH_ADD).
	CompCmpSwap  CompletionOp = 3
	CompFetchAdd CompletionOp = 4
	// Memory registration work requests (IBV_WC_BIND_MW, IBV_WC_LOCAL_INV;
	// REG_MR has no libibverbs completion, the kernel's IB_WC_REG_MR).
	CompBindMW   CompletionOp = 5
	CompLocalInv CompletionOp = 6
	CompRegMR    CompletionOp = 8
	CompRecv     CompletionOp = 128
	// CompRecvRDMAWithImm is the receive an RDMA Write with Immediate
	// consumes (IBV_WC_RECV_RDMA_WITH_IMM).
	CompRecvRDMAWithImm CompletionOp = 129
)

func (o CompletionOp) String() string {
	switch o {
	case CompSend:
		return "SEND"
	case CompWrite:
		return "RDMA_WRITE"
	case CompRead:
		return "RDMA_READ"
	case CompCmpSwap:
		return "COMP_SWAP"
	case CompFetchAdd:
		return "FETCH_ADD"
	case CompBindMW:
		return "BIND_MW"
	case CompLocalInv:
		return "LOCAL_INV"
	case CompRegMR:
		return "REG_MR"
	case CompRecv:
		return "RECV"
	case CompRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return fmt.Sprintf("CompletionOp(%d)", uint8(o))
}

// CompletionFlags are ibv_wc_flags.
type CompletionFlags uint8

// Completion flags.
const (
	CompWithInvalidate CompletionFlags = 1 << iota // InvalidatedRKey is valid
	CompSolicited                                  // the Send asked for a solicited event
	CompWithImm                                    // Imm is valid (IBV_WC_WITH_IMM)
)

// Completion is a work completion.
type Completion struct {
	ID              uint64
	Status          Status
	Op              CompletionOp
	Flags           CompletionFlags
	ByteLen         uint32
	QPNum           uint32
	InvalidatedRKey uint32
	// Imm is the immediate data of a receive with CompWithImm.
	Imm uint32
	// Term is the Terminate that caused an error status, when one did.
	Term TermCode
}

// CQ receives completions. Push must not block; it returns false when the
// queue overflowed. The completion is passed by value: a pointer through
// the interface would make every completion escape to the heap.
type CQ interface {
	Push(c Completion) bool
}

// Errors of the queue and QP API.
var (
	ErrQueueFull    = errors.New("iwarp: work queue full")
	ErrTooManySGE   = errors.New("iwarp: too many scatter-gather elements")
	ErrNoResources  = errors.New("iwarp: out of resources")
	ErrInvalidState = errors.New("iwarp: QP not in a state that allows this operation")
	ErrInvalidWR    = errors.New("iwarp: invalid work request")
	ErrCQOverflow   = errors.New("iwarp: completion queue overflow")
)

// recvWQE is a posted receive.
type recvWQE struct {
	id  uint64
	sgl []SGE // points into the queue's slab
}

// RecvQueue is a receive queue: a QP's own RQ, or a shared receive queue
// (SRQ) that several QPs take buffers from. It is safe for concurrent use.
//
// Its slots are allocated as they are first needed, doubling up to the
// depth: an idle connection holds none, and once a queue has grown to its
// working depth, posting allocates nothing.
//
// mu guards the ring, the SRQ limit and the refill function. It is a
// leaf: nothing is locked under it (onLimit and refill run after it is
// released). Its takers: posters (Post), the receive path (take, with
// QP.rxMu held, and with segment placement inside segPlacer.mu; refill,
// with QP.rxMu held), the segment placer (peek, inside segPlacer.mu), and
// a QP's flush. depth and maxSGE never change. The package's Locks
// section has the whole order.
//
// A queue whose receives are posted from somewhere the receive path
// cannot see (a service client's receive ring) has a refill function
// (SetRefill): an untagged message that finds the queue empty runs it,
// to take the receives posted meanwhile, before it declares no buffer
// available, as an RNIC sees a WQE at its doorbell.
type RecvQueue struct {
	mu sync.Mutex
	// +checklocks:mu
	ring []recvWQE
	// +checklocks:mu
	head int
	// +checklocks:mu
	n      int
	depth  int
	maxSGE int
	// limit is the SRQ limit: when the number of posted receives drops
	// below it, onLimit runs once and the limit disarms (ibv_modify_srq).
	// +checklocks:mu
	limit int
	// +checklocks:mu
	onLimit func()
	// +checklocks:mu
	refill func()
}

// NewRecvQueue returns a queue for depth receives of at most maxSGE SGEs.
func NewRecvQueue(depth, maxSGE int) (*RecvQueue, error) {
	if depth <= 0 || maxSGE <= 0 || depth > 1<<20 || maxSGE > 64 {
		return nil, fmt.Errorf("%w: receive queue depth %d, max SGE %d", ErrInvalidWR, depth, maxSGE)
	}
	return &RecvQueue{depth: depth, maxSGE: maxSGE}, nil
}

// queueGrowth is the first size of a lazily allocated work queue.
const queueGrowth = 4

// grow doubles the full ring (up to the depth), keeping the receives in
// order; q.mu is held.
// +checklocks:q.mu
func (q *RecvQueue) grow() {
	old := len(q.ring)
	n := min(max(2*old, queueGrowth), q.depth)
	ring := make([]recvWQE, n)
	for i := range q.n {
		ring[i] = q.ring[(q.head+i)%old]
	}
	slab := make([]SGE, (n-old)*q.maxSGE)
	for i := old; i < n; i++ {
		j := i - old
		ring[i].sgl = slab[j*q.maxSGE : j*q.maxSGE : (j+1)*q.maxSGE]
	}
	q.ring, q.head = ring, 0
}

// Post adds a receive. The SGL is copied; the caller may reuse it.
func (q *RecvQueue) Post(id uint64, sgl []SGE) error {
	if len(sgl) > q.maxSGE {
		return ErrTooManySGE
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == len(q.ring) {
		if q.n == q.depth {
			return ErrQueueFull
		}
		q.grow()
	}
	e := &q.ring[(q.head+q.n)%len(q.ring)]
	e.id = id
	e.sgl = append(e.sgl[:0], sgl...)
	q.n++
	return nil
}

// take removes the oldest receive into dst (whose sgl slice it reuses).
func (q *RecvQueue) take(dst *recvWQE) bool {
	q.mu.Lock()
	if q.n == 0 {
		q.mu.Unlock()
		return false
	}
	e := &q.ring[q.head]
	dst.id = e.id
	dst.sgl = append(dst.sgl[:0], e.sgl...)
	q.head = (q.head + 1) % len(q.ring)
	q.n--
	var fire func()
	if q.limit > 0 && q.n < q.limit {
		fire, q.onLimit, q.limit = q.onLimit, nil, 0
	}
	q.mu.Unlock()
	if fire != nil {
		fire()
	}
	return true
}

// SetRefill sets the function that an untagged message which finds the
// queue empty runs before it declares no buffer available: it posts the
// receives that are on their way to the queue (Post). It runs on the
// receive path of a QP using the queue, with that QP's rxMu held and no
// other engine lock, so it may take QP.mu (QP.PostRecv), the queue's
// mu and a CQ's lock, but no txMu or rxMu. nil: none.
func (q *RecvQueue) SetRefill(fn func()) {
	q.mu.Lock()
	q.refill = fn
	q.mu.Unlock()
}

// runRefill runs the refill function, if the queue has one, and reports
// whether it did.
func (q *RecvQueue) runRefill() bool {
	q.mu.Lock()
	fn := q.refill
	q.mu.Unlock()
	if fn == nil {
		return false
	}
	fn()
	return true
}

// peek copies the SGL of the oldest receive into sgl and returns it with
// the receive's ID, leaving the receive posted.
func (q *RecvQueue) peek(sgl []SGE) ([]SGE, uint64, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == 0 {
		return sgl, 0, false
	}
	e := &q.ring[q.head]
	return append(sgl, e.sgl...), e.id, true
}

// flush removes every posted receive, calling fn for each.
func (q *RecvQueue) flush(fn func(id uint64)) {
	q.mu.Lock()
	ids := make([]uint64, 0, q.n)
	for q.n > 0 {
		ids = append(ids, q.ring[q.head].id)
		q.head = (q.head + 1) % len(q.ring)
		q.n--
	}
	q.mu.Unlock()
	for _, id := range ids {
		fn(id)
	}
}

// Len returns the number of posted receives.
func (q *RecvQueue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// Cap returns the queue depth.
func (q *RecvQueue) Cap() int { return q.depth }

// MaxSGE returns the most SGEs a receive may have.
func (q *RecvQueue) MaxSGE() int { return q.maxSGE }

// SetLimit arms the SRQ limit event: fn runs once when fewer than limit
// receives remain posted. limit 0 disarms it.
func (q *RecvQueue) SetLimit(limit int, fn func()) {
	q.mu.Lock()
	q.limit, q.onLimit = limit, fn
	q.mu.Unlock()
}
