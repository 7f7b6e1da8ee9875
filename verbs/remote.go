package verbs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/verbs/internal/session"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"

	"golang.org/x/sys/unix"
)

// The endpoint as a service: the client side.
//
// Connect returns a *Device like Open does, and every object made from it
// (PD, MR, CQ, QP, SRQ, Listener, ConnRequest, Conn) is the same struct
// type an embedded device makes, so code written against the verbs API
// runs unchanged on either. Each of those structs reaches what its kind
// does through an interface (Device.ops, PD.ops, CQ.ops, QP.ops, SRQ.ops,
// MR.ops, MW.ops, Listener.ops, ConnRequest.ops) with one implementation
// per kind: the engine's (engineDevice, enginePD, ...) and the service's,
// here (client, remotePD, remoteCQ, remoteQP, remoteSRQ, remoteMR,
// remoteMW, remoteListener, remoteRequest). The data path (QP.PostSend
// and PostRecv, SRQ.PostRecv, CQ.Poll and Wait) picks its implementation
// with a type switch and calls it statically, so that the compiler sees
// the work requests and completions stay on the caller's stack.
//
// What crosses to the service, and how (package verbs/service is the other side):
//
//   - Slow path: one SOCK_SEQPACKET message per call (svc.Msg), answered
//     by a reply with the same sequence number (package
//     verbs/internal/session keeps the session); a call whose context ends
//     sends a Cancel and still waits for the reply: the context's error
//     if the service abandoned the call, else what it did (so a
//     connection request it had taken is not lost). Alloc and destroy,
//     register and deregister, dial, listen, get request, accept, reject,
//     disconnect and QP state queries go this way.
//   - Memory: an MR's buffer must lie in a zerocopy.AllocShared (memfd)
//     buffer; RegMR passes the memfd (SCM_RIGHTS) with the offset, and the
//     service maps the same pages and registers them at this process's
//     addresses, so SGEs, RemoteBuf and the peer's Tagged Offsets are this
//     process's virtual addresses and placement lands in this process's
//     pages. Nothing is copied between processes.
//   - Fast path: the service makes each QP's SQ and RQ, each SRQ's queue
//     and each CQ's queue as rings in sealed memfds that both map
//     (svc.Ring). PostSend and PostRecv write ring entries and publish the
//     producer index; Poll reads completions and publishes the consumer
//     index. No system call happens per work request or completion,
//     except the eventfd doorbell write when the service's poller has
//     gone to sleep, and a CQ.Wait that finds nothing sleeps on the CQ's
//     eventfd.
//
// Differences from an embedded device, all documented where they show:
// PostSend and PostRecv check what they can (opcode, SGE counts, queue
// room) at once, but an error the protocol engine finds later (an SGE
// outside the client's registrations, a QP already in ERROR) arrives as
// an error completion instead of a *PostError; the service's queue and
// the ring each hold up to MaxSendWR (MaxRecvWR) WRs; a fast-register
// MR's and a window's accessors (RKey, Addr, Len, Remote) report the
// registration or binding last posted, Valid asks the service; the pages
// a fast-register MR maps must lie in memory the client registered (in
// MRs of its own; the service maps nothing else); Stats are the service
// device's, all its clients' traffic together; QP.Progress does nothing
// and WaitProgress only yields (the service progresses the QP;
// ManualProgress is ignored).
//
// Fast-register MRs and windows cross as handles: AllocMR, AllocMW,
// MapPages, MapSG, SetIOVA and QP.BindMW are slow-path calls; the MR's
// and window's fr and w fields are tokens that name them in REG_MR and
// BIND_MW work requests, which go through the ring with the service's
// handle in the entry (svc.PutSend).

// client is a device's connection to a service: its session (package
// verbs/internal/session: the socket, the control page and doorbell, the
// calls in flight and the session's end) and the tables of what the
// client made. s is set by Connect before the read loop starts.
//
// Locks: see the package documentation.
type client struct {
	dev *Device
	s   session.Session

	mu sync.Mutex
	// +checklocks:mu
	qps map[uint32]*QP
	// +checklocks:mu
	srqs map[uint64]*SRQ
	// +checklocks:mu
	cqs map[*CQ]struct{}
	// Memory objects: the fast-register MRs and windows by the tokens
	// their work requests carry, and the regular MRs by STag (MapSG).
	// +checklocks:mu
	frs map[*iwarp.FastRegMR]*MR
	// +checklocks:mu
	mwt map[*iwarp.Window]*MW
	// +checklocks:mu
	mrKeys map[STag]*MR
	// attr: the service device's limits for this client (QUERY_DEVICE),
	// set by Connect; nil from a service that does not answer it.
	attr *DeviceAttr
	// features: those HELLO agreed on (svc.Feature* bits).
	features uint64
}

type reply struct {
	m   svc.Msg
	fds []int
}

// Connect opens the device a running service (rdmatap up --socket PATH)
// offers on its unix socket. The device is used as one from Open is, and
// Close ends the session: the service then releases everything this
// process made.
func Connect(ctx context.Context, path string) (*Device, error) {
	cl := &client{qps: map[uint32]*QP{}, srqs: map[uint64]*SRQ{}, cqs: map[*CQ]struct{}{},
		frs: map[*iwarp.FastRegMR]*MR{}, mwt: map[*iwarp.Window]*MW{}, mrKeys: map[STag]*MR{}}
	h, err := cl.s.Dial(ctx, path, session.Config{Status: statusError, Message: cl.message, Failed: cl.failed})
	if err != nil {
		return nil, fmt.Errorf("verbs: connect to service %s: %w", path, err)
	}
	cfg := DeviceConfig{Name: h.Name, NoExtensions: h.Flags&1 != 0, EventQueue: 256}
	dev := &Device{cfg: cfg, ops: cl, events: make(chan AsyncEvent, cfg.EventQueue), qps: map[uint32]*QP{},
		listeners: map[*Listener]struct{}{}}
	cl.dev = dev
	cl.features = h.Features
	cl.s.Start()
	if h.Features&svc.FeatureQueryDevice != 0 {
		r, err := cl.do(ctx, svc.TQueryDevice, nil)
		if err != nil {
			dev.Close()
			return nil, fmt.Errorf("verbs: connect to service %s: %w", path, err)
		}
		a := decodeAttr(r.m)
		cl.attr = &a
	}
	return dev, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		closeFd(fd)
	}
}

// message handles what the service sends unasked (the session's
// Config.Message).
func (cl *client) message(m svc.Msg) {
	switch m.Type() {
	case svc.TEvent:
		cl.event(m)
	case svc.TQPDone:
		cl.qpDone(m)
	}
}

// failed learns the session's end (its Config.Failed): waiters on CQs
// and QPs wake.
func (cl *client) failed(err error) {
	cl.mu.Lock()
	qps := make([]*QP, 0, len(cl.qps))
	for _, q := range cl.qps {
		qps = append(qps, q)
	}
	cqs := make([]*remoteCQ, 0, len(cl.cqs))
	for cq := range cl.cqs {
		cqs = append(cqs, cq.ops.(*remoteCQ))
	}
	cl.mu.Unlock()
	for _, q := range qps {
		q.remote().finish(err)
	}
	// Wake CQ waiters: no service is left to ring their eventfds.
	for _, rc := range cqs {
		if !rc.dead.Load() {
			rc.ev.Signal()
		}
	}
}

// do sends a request of type t that build fills in, with fds, and waits
// for its reply (session.Session.Do).
func (cl *client) do(ctx context.Context, t svc.Type, build func(*svc.Builder), fds ...int) (reply, error) {
	r, err := cl.s.Do(ctx, t, build, fds...)
	if err != nil {
		if errors.Is(err, svc.ErrTooLarge) {
			// The service would get it cut off and could not tell
			// which call it was.
			return reply{}, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
		}
		return reply{}, err
	}
	return reply{m: r.M, fds: r.FDs}, nil
}

// statusError turns a reply's status and text into the verbs error.
func statusError(m svc.Msg) error {
	st := m.Status()
	var f [1][]byte
	svc.Fields(m.Payload(), f[:])
	text := string(f[0])
	wrap := func(e error) error {
		if text == "" {
			return e
		}
		return fmt.Errorf("%w: %s", e, text)
	}
	switch st {
	case svc.StatusInvalidArgument:
		return wrap(ErrInvalidArgument)
	case svc.StatusInvalidState:
		return wrap(ErrInvalidState)
	case svc.StatusBusy:
		return wrap(ErrBusy)
	case svc.StatusClosed:
		return wrap(net.ErrClosed)
	case svc.StatusQueueFull:
		return wrap(ErrQueueFull)
	case svc.StatusRejected:
		return &RejectedError{PrivateData: append([]byte(nil), f[0]...), Markers: m.Arg(0) != 0}
	case svc.StatusLimit:
		return wrap(ErrLimit)
	case svc.StatusPermission:
		return wrap(os.ErrPermission)
	case svc.StatusCanceled:
		return wrap(context.Canceled)
	case svc.StatusTimeout:
		return wrap(context.DeadlineExceeded)
	case svc.StatusVersion:
		return wrap(svc.ErrVersion)
	case svc.StatusTooManySGE:
		return wrap(ErrTooManySGE)
	case svc.StatusMarkers:
		return wrap(ErrMarkers)
	case svc.StatusNoMatchingRTR:
		return wrap(ErrNoMatchingRTR)
	case svc.StatusInvalidWR:
		return &svcError{text: text, errs: []error{iwarp.ErrInvalidWR}}
	case svc.StatusInvalidArgWR:
		return &svcError{text: text, errs: []error{ErrInvalidArgument, iwarp.ErrInvalidWR}}
	case svc.StatusErrno:
		if e := syscall.Errno(m.Arg(0)); e != 0 && m.Arg(0) < 4096 {
			return &svcError{text: text, errs: []error{e}}
		}
	}
	return errors.New("verbs: service: " + text)
}

// svcError is an error the service found, with its text as the service
// gave it (it names the sentinels already) and the sentinels it matches.
type svcError struct {
	text string
	errs []error
}

func (e *svcError) Error() string { return e.text }

func (e *svcError) Unwrap() []error { return e.errs }

func (cl *client) event(m svc.Msg) {
	e := AsyncEvent{Type: AsyncEventType(m.Arg(svc.EventArgType)), QPNum: uint32(m.Arg(svc.EventArgQPN)),
		Term: TermCode{Layer: TermLayer(m.Arg(svc.EventArgTermLayer)), EType: uint8(m.Arg(svc.EventArgTermType)),
			Code: uint8(m.Arg(svc.EventArgTermCode))}}
	if e.Type > EventSRQErr {
		return
	}
	if h := m.Arg(svc.EventArgSRQ); h != 0 {
		cl.mu.Lock()
		e.SRQ = cl.srqs[h]
		cl.mu.Unlock()
	}
	var f [1][]byte
	if n, _ := svc.Fields(m.Payload(), f[:]); n == 1 && len(f[0]) > 0 {
		e.Err = errors.New(string(f[0]))
	}
	if e.Type == EventDisconnected && m.Arg(svc.EventArgReason) == svc.DisconnectPeer && e.Err == nil {
		e.ByPeer = true
	}
	cl.dev.post(e)
}

func (cl *client) qpDone(m svc.Msg) {
	cl.mu.Lock()
	q := cl.qps[uint32(m.Arg(0))]
	cl.mu.Unlock()
	if q == nil {
		return
	}
	var err error
	var f [1][]byte
	if n, _ := svc.Fields(m.Payload(), f[:]); n == 1 && len(f[0]) > 0 {
		err = errors.New(string(f[0]))
	}
	q.remote().finish(err)
}

// close ends the session and releases this process's side of it.
func (cl *client) close() error {
	cl.s.Close(func() {
		cl.mu.Lock()
		cqs := make([]*CQ, 0, len(cl.cqs))
		for cq := range cl.cqs {
			cqs = append(cqs, cq)
		}
		qps := make([]*QP, 0, len(cl.qps))
		for _, q := range cl.qps {
			qps = append(qps, q)
		}
		srqs := make([]*SRQ, 0, len(cl.srqs))
		for _, s := range cl.srqs {
			srqs = append(srqs, s)
		}
		cl.mu.Unlock()
		for _, cq := range cqs {
			cq.ops.(*remoteCQ).release()
		}
		for _, q := range qps {
			q.remote().release()
		}
		for _, s := range srqs {
			s.ops.(*remoteSRQ).release()
		}
	})
	return nil
}

// query returns the limits this client may use.
func (cl *client) query() DeviceAttr {
	if cl.attr != nil {
		return *cl.attr
	}
	return defaultAttr(cl.dev.cfg)
}

// counters asks the service for its device's counters.
func (cl *client) counters() Stats {
	var st Stats
	r, err := cl.do(context.Background(), svc.TStats, nil)
	if err != nil {
		return st
	}
	var f [1][]byte
	if n, err := svc.Fields(r.m.Payload(), f[:]); err == nil && n == 1 {
		binary.Decode(f[0], binary.LittleEndian, &st)
	}
	return st
}

// ring rings the service's doorbell if its poller sleeps.
func (cl *client) ring() { cl.s.Ring() }

// client returns a service's device's connection; nil for an embedded
// device.
func (d *Device) client() *client {
	cl, _ := d.ops.(*client)
	return cl
}

func closeFd(fd int) { unix.Close(fd) }
