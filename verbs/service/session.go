package service

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

// session is one client's connection. Its goroutines: the reader (run:
// HELLO, then each request; the non-blocking ones it handles itself), a
// goroutine per blocking call (dispatch), the poller, the event writer,
// a watcher per QP (watchQP), and at the end teardown (the reader's, with
// a goroutine per QP it releases). From outside: the engine's goroutines
// push into its CQ rings (servedCQ.push) and raise its events
// (sendEvent), and Server.ClientStats reads its counts.
//
// Locks: see the package documentation.
type session struct {
	srv  *Server
	dev  *verbs.Device
	conn *net.UnixConn
	id   uint64
	cred svc.Cred
	lim  Limits
	// features are those HELLO agreed on (svc.Features bits); set
	// before the session's first request.
	features uint64

	ctx    context.Context
	cancel context.CancelFunc

	wmu sync.Mutex // one writer at a time

	mu sync.Mutex
	// +checklocks:mu
	next uint64
	// +checklocks:mu
	pds map[uint64]*verbs.PD
	// +checklocks:mu
	cqs map[uint64]*servedCQ
	// +checklocks:mu
	mrs map[uint64]*servedMR
	// +checklocks:mu
	frmrs map[uint64]*servedFRMR
	// +checklocks:mu
	mws map[uint64]*verbs.MW
	// +checklocks:mu
	frPages int // pages the fast-register MRs may map, counted against Limits.FRPages
	// +checklocks:mu
	srqs map[uint64]*servedSRQ
	// +checklocks:mu
	qps map[uint32]*servedQP
	// +checklocks:mu
	lns map[uint64]servedListener
	// +checklocks:mu
	reqs map[uint64]*verbs.ConnRequest
	// +checklocks:mu
	inflight map[uint32]context.CancelFunc
	// +checklocks:mu
	mrBytes int64
	// +checklocks:mu
	mrPending int // registrations under way (counted against Limits.MRs)
	// +checklocks:mu
	ringBytes int64 // queue memory made for the client
	// +checklocks:mu
	memBytes int64 // service memory charged to the client (Limits.Memory)
	// +checklocks:mu
	conns int
	calls sync.WaitGroup

	// Fast path.
	ctl      []byte
	ctlFd    int
	sleeping *atomic.Uint32
	bell     *svc.Eventfd
	pollMu   sync.Mutex   // one pass over the rings at a time (pollOnce)
	ringMu   sync.RWMutex // a pass holds it for reading while it touches rings
	// +checklocks:ringMu
	pollQPs []*servedQP
	// +checklocks:ringMu
	pollSRQs []*servedSRQ
	stop     chan struct{}
	blocked  atomic.Int32 // ring entries waiting for room in a full queue
	pollWG   sync.WaitGroup

	events chan verbs.AsyncEvent
}

func newSession(s *Server, c *net.UnixConn, id uint64) *session {
	ctx, cancel := context.WithCancel(context.Background())
	return &session{srv: s, dev: s.dev, conn: c, id: id, lim: s.cfg.Limits, ctx: ctx, cancel: cancel,
		pds: map[uint64]*verbs.PD{}, cqs: map[uint64]*servedCQ{}, mrs: map[uint64]*servedMR{}, frmrs: map[uint64]*servedFRMR{},
		mws: map[uint64]*verbs.MW{}, srqs: map[uint64]*servedSRQ{},
		qps: map[uint32]*servedQP{}, lns: map[uint64]servedListener{}, reqs: map[uint64]*verbs.ConnRequest{},
		inflight: map[uint32]context.CancelFunc{}, ctlFd: -1, stop: make(chan struct{}),
		events: make(chan verbs.AsyncEvent, 256)}
}

func (x *session) logf(format string, args ...any) {
	x.srv.cfg.Logf("service: client %d (uid %d pid %d): "+format, append([]any{x.id, x.cred.UID, x.cred.PID}, args...)...)
}

// run is the session's reader (one per client).
func (x *session) run() {
	defer x.srv.wg.Done()
	defer x.teardown()
	buf, oob := make([]byte, svc.MaxMessage), make([]byte, svc.OOBSpace)
	var fdbuf [svc.MaxFDs]int
	ok := x.hello(buf, oob, fdbuf[:0])
	x.srv.helloDone(x.cred.UID)
	if !ok {
		return
	}
	x.logf("connected")
	x.pollWG.Add(1)
	go x.poller()
	x.calls.Add(1)
	go x.eventWriter()
	for {
		m, fds, err := svc.Read(x.conn, buf, oob, fdbuf[:0])
		if errors.Is(err, svc.ErrTruncated) || errors.Is(err, svc.ErrFDs) {
			// Too long, or too many descriptors (closed already): an
			// error for this message, and the session goes on.
			x.logf("malformed message: %v", err)
			x.reply(&svc.Builder{}, svc.TError, 0, nil, fmt.Errorf("%w: %v", verbs.ErrInvalidArgument, err))
			continue
		}
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				x.logf("socket: %v", err)
			}
			return
		}
		if err := m.Check(); err != nil {
			closeFDs(fds)
			x.logf("malformed message: %v", err)
			var seq uint32
			if len(m) >= svc.HeaderSize {
				seq = m.Seq()
			}
			x.reply(&svc.Builder{}, svc.TError, seq, nil, err)
			continue
		}
		x.dispatch(m, fds)
	}
}

// hello reads the client's HELLO, checks the version and answers with the
// control page and the doorbell.
func (x *session) hello(buf, oob []byte, fds []int) bool {
	x.conn.SetReadDeadline(time.Now().Add(x.srv.cfg.HelloTimeout))
	m, fds, err := svc.Read(x.conn, buf, oob, fds)
	x.conn.SetReadDeadline(time.Time{})
	if err != nil {
		x.logf("hello: %v", err)
		return false
	}
	closeFDs(fds)
	var b svc.Builder
	if err := m.Check(); err != nil || m.Type() != svc.THello || m.Arg(0) != svc.Magic {
		x.logf("hello: not an rdmatap client")
		svc.Write(x.conn, b.Reset(svc.THello, 0, svc.StatusVersion).String("not an rdmatap service HELLO").Msg())
		return false
	}
	if v := m.Arg(1); v != svc.Version {
		msg := fmt.Sprintf("protocol version mismatch: service speaks %d, client %d", svc.Version, v)
		x.logf("hello: %s", msg)
		svc.Write(x.conn, b.Reset(svc.THello, 0, svc.StatusVersion).Args(svc.Version).String(msg).Msg())
		return false
	}
	if err := x.srv.takeMap(x.cred.UID); err != nil {
		x.logf("hello: %v", err)
		st, text := errStatus(err)
		svc.Write(x.conn, b.Reset(svc.THello, 0, st).String(text).Msg())
		return false
	}
	fd, ctl, err := svc.NewMemfd("rdmatap-ctl", svc.CtlSize)
	if err != nil {
		x.srv.dropMap(x.cred.UID)
		x.logf("hello: control page: %v", err)
		return false
	}
	x.ctl, x.ctlFd, x.sleeping = ctl, fd, svc.U32(ctl, svc.CtlSleeping)
	x.mu.Lock()
	x.memBytes = memSession
	x.mu.Unlock()
	if x.bell, err = svc.NewEventfd(); err != nil {
		x.logf("hello: eventfd: %v", err)
		return false
	}
	var flags uint64
	if x.dev.Query().AtomicCap == verbs.AtomicNone { // DeviceConfig.NoExtensions
		flags |= 1
	}
	// The features both ends know (a client that lists none, as one
	// from before features, gets none).
	features := m.Arg(2) & svc.Features
	x.features = features
	var args [svc.HelloArgs]uint64
	args[svc.HelloVersion] = svc.Version
	args[svc.HelloFlags] = flags
	args[svc.HelloID] = x.id
	args[svc.HelloFeatures] = features
	err = svc.Write(x.conn, b.Reset(svc.THello, 0, 0).Args(args[:]...).String(x.dev.Name()).Msg(), x.ctlFd, x.bell.Fd())
	return err == nil
}

// reply sends a reply: err nil for success with b's arguments and
// payload (b already Reset by the caller unless err is set).
func (x *session) reply(b *svc.Builder, t svc.Type, seq uint32, fds []int, err error) {
	if err != nil {
		st, text := errStatus(err)
		b.Reset(t, seq, st)
		var rej *verbs.RejectedError
		var errno syscall.Errno
		switch {
		case errors.As(err, &rej):
			b.Args(bool64(rej.Markers)).Bytes(rej.PrivateData)
		case st == svc.StatusGeneral && errors.As(err, &errno):
			b.Reset(t, seq, svc.StatusErrno).Args(uint64(errno)).String(text)
		default:
			b.String(text)
		}
		fds = nil
	}
	x.wmu.Lock()
	werr := svc.Write(x.conn, b.Msg(), fds...)
	x.wmu.Unlock()
	if werr != nil && !errors.Is(werr, net.ErrClosed) {
		x.logf("reply %v: %v", t, werr)
	}
}

// errStatus maps an error to a reply status and text.
func errStatus(err error) (uint32, string) {
	text := err.Error()
	switch {
	case errors.Is(err, verbs.ErrRejected):
		return svc.StatusRejected, text
	case errors.Is(err, verbs.ErrLimit):
		return svc.StatusLimit, text
	case errors.Is(err, verbs.ErrQueueFull):
		return svc.StatusQueueFull, text
	case errors.Is(err, verbs.ErrTooManySGE):
		return svc.StatusTooManySGE, text
	case errors.Is(err, verbs.ErrMarkers):
		return svc.StatusMarkers, text
	case errors.Is(err, verbs.ErrNoMatchingRTR):
		return svc.StatusNoMatchingRTR, text
	case errors.Is(err, iwarp.ErrInvalidWR) && errors.Is(err, verbs.ErrInvalidArgument):
		return svc.StatusInvalidArgWR, text
	case errors.Is(err, iwarp.ErrInvalidWR):
		return svc.StatusInvalidWR, text
	case errors.Is(err, verbs.ErrInvalidArgument), errors.Is(err, verbs.ErrUnsupported), errors.Is(err, svc.ErrShort),
		errors.Is(err, svc.ErrLength), errors.Is(err, svc.ErrType), errors.Is(err, svc.ErrArgs), errors.Is(err, svc.ErrTooLarge),
		errors.Is(err, svc.ErrReserved):
		return svc.StatusInvalidArgument, text
	case errors.Is(err, verbs.ErrInvalidState), errors.Is(err, iwarp.ErrInvalidState):
		return svc.StatusInvalidState, text
	case errors.Is(err, verbs.ErrBusy):
		return svc.StatusBusy, text
	case errors.Is(err, os.ErrPermission):
		return svc.StatusPermission, text
	case errors.Is(err, net.ErrClosed):
		return svc.StatusClosed, text
	case errors.Is(err, context.Canceled):
		return svc.StatusCanceled, text
	case errors.Is(err, context.DeadlineExceeded):
		return svc.StatusTimeout, text
	}
	return svc.StatusGeneral, text
}

var errNoHandle = fmt.Errorf("%w: no such handle", verbs.ErrInvalidArgument)

// blocking reports whether a request may wait on the network or a peer.
func blocking(t svc.Type) bool {
	switch t {
	case svc.TDial, svc.TGetRequest, svc.TAccept, svc.TReject, svc.TDisconnect, svc.TDestroyQP, svc.TQPError:
		return true
	}
	return false
}

// dispatch runs one request; fds are the descriptors that came with it
// (dispatch owns them).
func (x *session) dispatch(m svc.Msg, fds []int) {
	t, seq := m.Type(), m.Seq()
	if t == svc.TCancel {
		closeFDs(fds)
		x.mu.Lock()
		if c := x.inflight[uint32(m.Arg(0))]; c != nil {
			c()
		}
		x.mu.Unlock()
		return
	}
	if t == svc.TEvent || t == svc.TQPDone || t == svc.THello || t == svc.TError {
		closeFDs(fds)
		x.reply(&svc.Builder{}, svc.TError, seq, nil, fmt.Errorf("%w: %v is not a request", verbs.ErrInvalidArgument, t))
		return
	}
	if t != svc.TRegMR && len(fds) > 0 {
		closeFDs(fds)
		x.reply(&svc.Builder{}, t, seq, nil, fmt.Errorf("%w: unexpected descriptors", verbs.ErrInvalidArgument))
		return
	}
	// What the client posted before this call is the engine's before the
	// call acts: a receive before Dial or Accept (the peer may send at
	// once), sends before Disconnect (they go out before the FIN) and
	// before DESTROY_QP (they complete flushed), as on an embedded device.
	x.pollOnce()
	if !blocking(t) {
		var b svc.Builder
		out, err := x.handle(x.ctx, &b, m, fds)
		x.reply(&b, t, seq, out, err)
		closeFDs(out)
		return
	}
	// The message buffer is reused by the reader: keep a copy.
	mc := append(svc.Msg(nil), m...)
	ctx, cancel := context.WithCancel(x.ctx)
	x.mu.Lock()
	if err := x.chargeLocked(memCall, "a call in progress"); err != nil {
		x.mu.Unlock()
		cancel()
		x.reply(&svc.Builder{}, t, seq, nil, err)
		return
	}
	x.inflight[seq] = cancel
	x.calls.Add(1)
	x.mu.Unlock()
	go func() {
		defer x.calls.Done()
		var b svc.Builder
		out, err := x.handle(ctx, &b, mc, nil)
		// The call leaves the client's stats, its count and its charge
		// together, before its reply: a client that has its answer is
		// charged for it no more.
		x.mu.Lock()
		delete(x.inflight, seq)
		x.memBytes -= memCall
		x.mu.Unlock()
		cancel()
		x.reply(&b, t, seq, out, err)
		closeFDs(out)
	}()
}

// handle runs a request and fills b with the reply; it returns
// descriptors to send (closed after sending) or an error.
func (x *session) handle(ctx context.Context, b *svc.Builder, m svc.Msg, fds []int) (out []int, err error) {
	t := m.Type()
	defer func() {
		if r := recover(); r != nil {
			// A bug reached by a hostile message must cost only this
			// request, never the service.
			err = fmt.Errorf("%w: internal error handling %v: %v", verbs.ErrInvalidArgument, t, r)
			x.logf("panic in %v: %v", t, r)
		}
	}()
	b.Reset(t, m.Seq(), 0)
	switch t {
	case svc.TAllocPD:
		return nil, x.allocPD(b)
	case svc.TDeallocPD:
		return nil, x.deallocPD(m.Arg(0))
	case svc.TCreateCQ:
		return x.createCQ(b, m.Arg(0))
	case svc.TDestroyCQ:
		return nil, x.destroyCQ(m.Arg(0))
	case svc.TRegMR:
		return nil, x.regMR(b, m, fds)
	case svc.TDeregMR:
		return nil, x.deregMR(m.Arg(0))
	case svc.TCreateSRQ:
		return x.createSRQ(b, m)
	case svc.TDestroySRQ:
		return nil, x.destroySRQ(m.Arg(0))
	case svc.TSRQLimit:
		return nil, x.srqLimit(m.Arg(0), m.Arg(1))
	case svc.TCreateQP:
		return x.createQP(b, m)
	case svc.TDestroyQP:
		return nil, x.destroyQP(uint32(m.Arg(0)))
	case svc.TQueryQP:
		q, err := x.qp(m.Arg(0))
		if err != nil {
			return nil, err
		}
		b.Args(uint64(q.qp.State()))
		return nil, nil
	case svc.TDisconnect:
		q, err := x.qp(m.Arg(0))
		if err != nil {
			return nil, err
		}
		return nil, q.qp.Disconnect(ctx)
	case svc.TQPError:
		q, err := x.qp(m.Arg(0))
		if err != nil {
			return nil, err
		}
		return nil, q.qp.SetError()
	case svc.TDial:
		return nil, x.dial(ctx, b, m)
	case svc.TListen:
		return nil, x.listen(b, m)
	case svc.TCloseListener:
		return nil, x.closeListener(m.Arg(0))
	case svc.TGetRequest:
		return nil, x.getRequest(ctx, b, m.Arg(0))
	case svc.TAccept:
		return nil, x.accept(ctx, b, m)
	case svc.TReject:
		return nil, x.reject(m)
	case svc.TAllocMR:
		return nil, x.allocMR(b, m)
	case svc.TMapMR:
		return nil, x.mapMR(b, m)
	case svc.TSetIOVA:
		f, err := x.frmr(m.Arg(0))
		if err != nil {
			return nil, err
		}
		return nil, f.mr.SetIOVA(m.Arg(1))
	case svc.TAllocMW:
		return nil, x.allocMW(b, m)
	case svc.TDeallocMW:
		return nil, x.deallocMW(m.Arg(0))
	case svc.TBindMW:
		return nil, x.bindMW(b, m)
	case svc.TQueryMem:
		return nil, x.queryMem(b, m.Arg(0))
	case svc.TQueryDevice:
		a := x.queryDevice()
		b.Args(encodeAttr(a)...).String(x.dev.Name())
		return nil, nil
	case svc.TQueryPort:
		if m.Arg(0) != 1 {
			return nil, fmt.Errorf("%w: port %d (the device has port 1)", verbs.ErrInvalidArgument, m.Arg(0))
		}
		encodePort(b, x.dev.Link())
		return nil, nil
	case svc.TStats:
		st := x.dev.Stats()
		pay, err := binary.Append(nil, binary.LittleEndian, &st)
		if err != nil {
			return nil, err
		}
		b.Bytes(pay)
		return nil, nil
	}
	closeFDs(fds)
	return nil, fmt.Errorf("%w: unknown request %v", verbs.ErrInvalidArgument, t)
}

// +checklocks:x.mu
func (x *session) handle64() uint64 {
	x.next++
	return x.next
}

// takeUnused removes handle h from m (under mu) and returns what it
// named: errNoHandle for an unknown handle, ErrBusy while refs reports QPs
// that still use it.
func takeUnused[T any](mu *sync.Mutex, m map[uint64]*T, h uint64, refs func(*T) int, what string) (*T, error) {
	mu.Lock()
	defer mu.Unlock()
	s := m[h]
	if s == nil {
		return nil, errNoHandle
	}
	if n := refs(s); n > 0 {
		return nil, fmt.Errorf("%w: %d QPs use the %s", verbs.ErrBusy, n, what)
	}
	delete(m, h)
	return s, nil
}

// String names the session in logs.
func (x *session) String() string { return "client " + strconv.FormatUint(x.id, 10) }

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

func closeFd(fd int) { unix.Close(fd) }
