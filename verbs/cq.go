package verbs

import (
	"context"
	"fmt"
	"net"
	"sync"

	"github.com/rdmatap/rdmatap/iwarp"
)

// Status is a work completion status: the ibv_wc_status values, and
// String gives ibv_wc_status_str.
type Status uint8

// Completion statuses (ibv_wc_status).
const (
	StatusSuccess              Status = 0
	StatusLocalLength          Status = 1
	StatusLocalQPOp            Status = 2
	StatusLocalProtection      Status = 4
	StatusWRFlush              Status = 5
	StatusLocalAccess          Status = 8
	StatusRemoteInvalidRequest Status = 9
	StatusRemoteAccess         Status = 10
	StatusRemoteOperation      Status = 11
	StatusFatal                Status = 19
	StatusGeneral              Status = 21
)

func (s Status) String() string { return iwarp.Status(s).String() }

// WCOpcode is the operation a completion reports (ibv_wc_opcode values).
type WCOpcode uint8

// Completion operations.
const (
	WCSend  WCOpcode = 0
	WCWrite WCOpcode = 1
	WCRead  WCOpcode = 2
	// RFC 7306 operations.
	WCCompSwap        WCOpcode = 3   // IBV_WC_COMP_SWAP
	WCFetchAdd        WCOpcode = 4   // IBV_WC_FETCH_ADD
	WCRecv            WCOpcode = 128 // IBV_WC_RECV
	WCRecvRDMAWithImm WCOpcode = 129 // IBV_WC_RECV_RDMA_WITH_IMM
)

func (o WCOpcode) String() string { return iwarp.CompletionOp(o).String() }

// WCFlags are ibv_wc_flags.
type WCFlags uint8

// WC flags.
const (
	WCWithInvalidate WCFlags = 1 << iota // InvalidatedRKey is valid (IBV_WC_WITH_INV)
	WCSolicited                          // the Send asked for a solicited event
	WCWithImm                            // Imm is valid (IBV_WC_WITH_IMM)
)

// WC is a work completion (ibv_wc).
type WC struct {
	ID      uint64 // the WR's wr_id
	Status  Status
	Op      WCOpcode
	Flags   WCFlags
	ByteLen uint32 // bytes received (receives) or transferred
	QPNum   uint32
	// InvalidatedRKey is the STag a Send with Invalidate invalidated
	// (Flags has WCWithInvalidate).
	InvalidatedRKey STag
	// Imm is the immediate data of a Write or Send with Immediate (Flags
	// has WCWithImm).
	Imm uint32
	// Term names the Terminate behind an error status, when there was one.
	Term TermCode
}

// Err returns nil for a successful completion and a *CompletionError
// otherwise.
func (wc WC) Err() error {
	if wc.Status == StatusSuccess {
		return nil
	}
	return &CompletionError{WC: wc}
}

// CQ is a completion queue. Poll may run concurrently with producers; one
// goroutine at a time should consume it.
//
// Locks: see the package documentation.
type CQ struct {
	dev *Device
	mu  sync.Mutex
	// +checklocks:mu
	ring []WC
	// +checklocks:mu
	head int
	// +checklocks:mu
	n int
	// +checklocks:mu
	over   bool
	notify chan struct{}
	closed chan struct{}
	once   sync.Once
	// Completion events (ibv_req_notify_cq / ibv_get_cq_event): armed
	// for the next completion, or the next solicited or failed one; the
	// event is delivered on events.
	// +checklocks:mu
	armed  armState
	events chan struct{}
	// ops: what the CQ does, by kind of device (engineCQ, remoteCQ).
	// sink: where the engine puts the completions of a CQ a service
	// offers a client (its ring; see verbs/service), instead of ring; nil
	// otherwise.
	ops  cqOps
	sink iwarp.CQ
	// qps counts the embedded QPs that complete into the CQ (once as
	// send CQ, once as receive CQ), under mu: Close refuses while any do.
	// +checklocks:mu
	qps int
}

// armState is what a CQ's next completion event waits for.
type armState uint8

const (
	armNone armState = iota
	armAny
	armSolicited
)

// CreateCQ makes a completion queue of cqe entries.
func (d *Device) CreateCQ(cqe int) (*CQ, error) {
	if cqe <= 0 || cqe > d.Query().MaxCQE {
		return nil, fmt.Errorf("%w: CQ of %d entries", ErrInvalidArgument, cqe)
	}
	return d.ops.createCQ(cqe)
}

// newCQ makes a CQ; ring is its entries for an embedded CQ (nil for a
// service's, whose entries are in the shared ring).
func newCQ(d *Device, ring []WC) *CQ {
	return &CQ{dev: d, ring: ring, notify: make(chan struct{}, 1), closed: make(chan struct{}), events: make(chan struct{}, 1)}
}

// cqOps is what a CQ does, one implementation per kind of device: the
// embedded CQ's ring (engineCQ), or a service's CQ, reached through its
// shared ring and socket (remoteCQ, remote_cq.go). Poll and Wait call theirs
// statically (see CQ.Poll).
type cqOps interface {
	poll(dst []WC) int
	wait(ctx context.Context, dst []WC) (int, error)
	reqNotify(solicitedOnly bool) error
	waitEvent(ctx context.Context) error
	pending() int
	overflowed() bool
	// destroy releases what the kind holds for the CQ; CQ.Close then
	// checks the QPs and wakes the waiters.
	destroy() error
}

// engineCQ is an embedded CQ: its own ring, which the engine pushes
// completions to (iwarp.CQ).
type engineCQ CQ

// engineSink returns what the engine's QPs complete into for cq.
func (cq *CQ) engineSink() iwarp.CQ {
	if cq.sink != nil {
		return cq.sink
	}
	return (*engineCQ)(cq)
}

// Push implements iwarp.CQ: it adds a completion; false: the CQ is full
// (it overflowed).
func (e *engineCQ) Push(c iwarp.Completion) bool {
	cq, wc := (*CQ)(e), verbsWC(&c)
	cq.mu.Lock()
	if cq.n == len(cq.ring) {
		cq.over = true
		cq.mu.Unlock()
		return false
	}
	cq.ring[(cq.head+cq.n)%len(cq.ring)] = *wc
	cq.n++
	event := cq.armed == armAny || cq.armed == armSolicited && (wc.Flags&WCSolicited != 0 || wc.Status != StatusSuccess)
	if event {
		cq.armed = armNone // one event per arming, as ibv_req_notify_cq
	}
	cq.mu.Unlock()
	select {
	case cq.notify <- struct{}{}:
	default:
	}
	if event {
		select {
		case cq.events <- struct{}{}:
		default:
		}
	}
	return true
}

func (e *engineCQ) reqNotify(solicitedOnly bool) error {
	cq := (*CQ)(e)
	select {
	case <-cq.closed:
		return net.ErrClosed
	default:
	}
	cq.mu.Lock()
	if solicitedOnly {
		if cq.armed != armAny {
			cq.armed = armSolicited
		}
	} else {
		cq.armed = armAny
	}
	cq.mu.Unlock()
	return nil
}

func (e *engineCQ) waitEvent(ctx context.Context) error {
	select {
	case <-e.events:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-e.closed:
		return net.ErrClosed
	}
}

func (e *engineCQ) poll(dst []WC) int {
	cq := (*CQ)(e)
	cq.mu.Lock()
	k := min(len(dst), cq.n)
	for i := 0; i < k; i++ {
		dst[i] = cq.ring[cq.head]
		cq.head++
		if cq.head == len(cq.ring) {
			cq.head = 0
		}
	}
	cq.n -= k
	left := cq.n
	cq.mu.Unlock()
	if k > 0 && left > 0 {
		// Hand the wake-up on to another waiter.
		select {
		case cq.notify <- struct{}{}:
		default:
		}
	}
	return k
}

func (e *engineCQ) wait(ctx context.Context, dst []WC) (int, error) {
	for {
		if n := e.poll(dst); n > 0 {
			return n, nil
		}
		select {
		case <-e.notify:
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-e.closed:
			if n := e.poll(dst); n > 0 {
				return n, nil
			}
			return 0, net.ErrClosed
		}
	}
}

func (e *engineCQ) pending() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n
}

func (e *engineCQ) overflowed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.over
}

func (e *engineCQ) destroy() error { return nil }

// ReqNotify arms the CQ for one completion event (ibv_req_notify_cq): the
// next completion added, or with solicitedOnly the next one that is
// solicited (a Send with Solicited Event, or Immediate Data with SE) or
// unsuccessful. WaitEvent returns when it comes. Completions already in
// the CQ do not count: poll them after arming, as with libibverbs.
func (cq *CQ) ReqNotify(solicitedOnly bool) error { return cq.ops.reqNotify(solicitedOnly) }

// WaitEvent blocks until the completion event ReqNotify armed for has
// happened (ibv_get_cq_event), ctx ends, or the CQ is closed. An event
// that happened before the call is returned at once.
func (cq *CQ) WaitEvent(ctx context.Context) error { return cq.ops.waitEvent(ctx) }

// Poll moves up to len(dst) completions into dst without blocking and
// returns how many. It allocates nothing.
func (cq *CQ) Poll(dst []WC) int {
	// The data path calls its implementation statically: through the
	// interface the compiler could not tell that dst is not kept, and a
	// caller's array of completions would move to the heap.
	if e, ok := cq.ops.(*engineCQ); ok {
		return e.poll(dst)
	}
	return cq.ops.(*remoteCQ).poll(dst)
}

// Wait blocks until at least one completion is available, moves up to
// len(dst) into dst and returns how many. It returns ctx's error when ctx
// ends first and net.ErrClosed once the CQ is closed. A completion pushed
// between the check and the wait is never missed: the notification is a
// buffered channel that Push fills after publishing.
func (cq *CQ) Wait(ctx context.Context, dst []WC) (int, error) {
	if len(dst) == 0 {
		return 0, fmt.Errorf("%w: empty completion slice", ErrInvalidArgument)
	}
	if e, ok := cq.ops.(*engineCQ); ok { // statically, as Poll
		return e.wait(ctx, dst)
	}
	return cq.ops.(*remoteCQ).wait(ctx, dst)
}

// Len returns the number of completions waiting.
func (cq *CQ) Len() int { return cq.ops.pending() }

// Overflowed reports whether a completion was ever lost to a full CQ.
func (cq *CQ) Overflowed() bool { return cq.ops.overflowed() }

// Close wakes every waiter with net.ErrClosed. It is idempotent. On a
// device of a service it fails with ErrBusy while a QP uses the CQ
// (ibv_destroy_cq's EBUSY), and frees the CQ's ring.
func (cq *CQ) Close() error {
	if err := cq.ops.destroy(); err != nil {
		return err
	}
	cq.mu.Lock()
	n := cq.qps
	cq.mu.Unlock()
	if n > 0 {
		return fmt.Errorf("%w: QPs use the CQ", ErrBusy)
	}
	cq.once.Do(func() { close(cq.closed) })
	return nil
}

// use counts (d 1) or uncounts (d -1) an embedded QP completing into the CQ.
func (cq *CQ) use(d int) {
	cq.mu.Lock()
	cq.qps += d
	cq.mu.Unlock()
}
