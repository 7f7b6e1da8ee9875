// Package session is the client's end of a service's socket session
// (docs/service-protocol.md): dialing and HELLO, the control page and the
// doorbell, matching replies to calls, the read loop and the session's
// end. What the session carries (the objects a client makes, the events
// it gets) is package verbs', which reaches it through a Config's
// callbacks.
package session

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmatap/rdmatap/verbs/internal/svc"

	"golang.org/x/sys/unix"
)

// Config is what a session asks of its owner.
type Config struct {
	// Status turns a reply whose status is not StatusOK (a HELLO's
	// refusal too) into the error its call returns. It must be set.
	Status func(svc.Msg) error
	// Message handles a message that answers no call (EVENT, QP_DONE),
	// on the read loop's goroutine; the descriptors it carried are
	// closed after it returns.
	Message func(svc.Msg)
	// Failed learns the session's end, once, after every call in
	// progress has been woken with err, and is called by the goroutine
	// that ends it (the read loop, or Close).
	Failed func(err error)
}

// Hello is what the service's HELLO answer tells.
type Hello struct {
	Name     string // the service device's name
	Flags    uint64 // bit 0: the device runs without extensions
	Features uint64 // the svc.Feature* bits the service offers
}

// Reply is a call's answer: its message and the descriptors it carried,
// which the caller now owns.
type Reply struct {
	M   svc.Msg
	FDs []int
}

// Session is a client's connection to a service. Its zero value is made
// ready by Dial and Start; it must not be copied.
//
// mu guards the calls in flight and the session's end (the fields marked
// +checklocks:mu). It is a leaf: held only to look them up or update
// them, never across a callback, a write or a channel operation. It is
// taken by any caller's goroutine (Call) and the read loop (a reply's
// lookup). Each request is one message on the socket, written by its
// caller's goroutine (the conn is safe for concurrent writes); its reply
// comes back on the channel the read loop finds under mu. conn, ctl,
// sleeping, bell and cfg are set by Dial before the read loop starts;
// done is closed once, by fail.
type Session struct {
	conn *net.UnixConn
	cfg  Config

	ctl      []byte
	sleeping *atomic.Uint32 // the service's poller sleeps
	bell     *svc.Eventfd   // its doorbell

	mu sync.Mutex
	// +checklocks:mu
	seq uint32
	// +checklocks:mu
	pending map[uint32]chan Reply
	// +checklocks:mu
	closed bool
	// +checklocks:mu
	err error

	done chan struct{}
	wg   sync.WaitGroup
}

// Dial connects to the service on the unix socket at path and exchanges
// HELLO: it offers svc.Version and svc.Features, and maps the control
// page and opens the doorbell the answer passes. A service that refuses
// the client (a limit, a version) answers with a status, which Dial
// returns as cfg.Status makes it, also when the service closed the
// socket before reading the HELLO. The read loop starts with Start.
func (s *Session) Dial(ctx context.Context, path string, cfg Config) (Hello, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unixpacket", path)
	if err != nil {
		return Hello{}, err
	}
	conn := c.(*net.UnixConn)
	var b svc.Builder
	werr := svc.Write(conn, b.Reset(svc.THello, 0, 0).Args(svc.Magic, svc.Version, svc.Features).Msg())
	if dl, ok := ctx.Deadline(); ok {
		conn.SetReadDeadline(dl)
	}
	if werr != nil {
		// A service that refuses a client (a limit) answers before the
		// HELLO and closes: its reason may wait in the socket still.
		conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	}
	buf, oob := make([]byte, svc.MaxMessage), make([]byte, svc.OOBSpace)
	m, fds, err := svc.Read(conn, buf, oob, nil)
	conn.SetReadDeadline(time.Time{})
	if err != nil && werr != nil {
		err = werr
	}
	if err == nil {
		err = m.Check()
	}
	if err == nil && m.Type() != svc.THello {
		err = fmt.Errorf("service answered HELLO with %v", m.Type())
	}
	if err == nil && m.Status() != svc.StatusOK {
		err = cfg.Status(m)
	}
	if err == nil && len(fds) != 2 {
		err = fmt.Errorf("service's HELLO carried %d descriptors, want 2", len(fds))
	}
	if err != nil {
		closeFDs(fds)
		conn.Close()
		return Hello{}, err
	}
	ctl, err := svc.MapRing(fds[0])
	closeFDs(fds[:1])
	if err == nil && len(ctl) < svc.CtlSize {
		svc.Unmap(ctl)
		err = fmt.Errorf("%d bytes, want %d", len(ctl), svc.CtlSize)
	}
	if err != nil {
		closeFDs(fds[1:])
		conn.Close()
		return Hello{}, fmt.Errorf("control page: %w", err)
	}
	bell, err := svc.OpenEventfd(fds[1])
	if err != nil {
		svc.Unmap(ctl)
		conn.Close()
		return Hello{}, err
	}
	var f [1][]byte
	svc.Fields(m.Payload(), f[:])
	s.conn, s.cfg = conn, cfg
	s.ctl, s.sleeping, s.bell = ctl, svc.U32(ctl, svc.CtlSleeping), bell
	s.done = make(chan struct{})
	s.mu.Lock()
	s.pending = map[uint32]chan Reply{}
	s.mu.Unlock()
	return Hello{Name: string(f[0]), Flags: m.Arg(svc.HelloFlags), Features: m.Arg(svc.HelloFeatures)}, nil
}

// Start starts the read loop, which delivers replies to their calls and
// the other messages to cfg.Message until the session ends.
func (s *Session) Start() {
	s.wg.Add(1)
	go s.readLoop()
}

// readLoop dispatches the service's replies and events (one goroutine per
// session).
func (s *Session) readLoop() {
	defer s.wg.Done()
	oob := make([]byte, svc.OOBSpace)
	var fdbuf [svc.MaxFDs]int
	for {
		buf := make([]byte, svc.MaxMessage)
		m, fds, err := svc.Read(s.conn, buf, oob, fdbuf[:0])
		if err == nil {
			err = m.Check()
			if err != nil {
				closeFDs(fds)
			}
		}
		if err != nil {
			s.fail(fmt.Errorf("verbs: service connection: %w", err))
			return
		}
		switch m.Type() {
		case svc.TEvent, svc.TQPDone:
			s.cfg.Message(m)
			closeFDs(fds)
			continue
		}
		s.mu.Lock()
		ch := s.pending[m.Seq()]
		delete(s.pending, m.Seq())
		s.mu.Unlock()
		if ch == nil {
			closeFDs(fds) // a canceled call's late reply
			continue
		}
		ch <- Reply{M: m, FDs: append([]int(nil), fds...)}
	}
}

// fail ends the session: every call in progress and every later one
// returns err; then cfg.Failed learns it.
func (s *Session) fail(err error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed, s.err = true, err
	pend := s.pending
	s.pending = map[uint32]chan Reply{}
	s.mu.Unlock()
	close(s.done)
	for _, ch := range pend {
		close(ch)
	}
	s.cfg.Failed(err)
}

// Close ends the session (cfg.Failed learns net.ErrClosed if it had not
// ended yet) and waits for the read loop; then release runs, and the
// control page and the doorbell go: release must stop what uses them
// (Ring).
func (s *Session) Close(release func()) {
	s.conn.Close()
	s.wg.Wait()
	s.fail(net.ErrClosed)
	if release != nil {
		release()
	}
	s.bell.Close()
	svc.Unmap(s.ctl)
}

// Done is closed when the session ends.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err returns why the session ended: net.ErrClosed if it has not (or was
// closed).
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	return net.ErrClosed
}

// Ring rings the service's doorbell if its poller sleeps.
func (s *Session) Ring() {
	if s.sleeping.Load() != 0 {
		s.bell.Signal()
	}
}

// Call sends a request and waits for its reply. seqSet builds the message
// in b with the sequence number it is given; fds are sent with it (the
// caller keeps its own copies). A reply whose status is not StatusOK
// returns cfg.Status's error. A message too large for the socket returns
// an error that wraps svc.ErrTooLarge, and is not sent. A call whose
// context ends sends a CANCEL and still waits for the reply: the
// context's error if the service abandoned the call, else what it did (so
// that a connection request it had taken is not lost).
func (s *Session) Call(ctx context.Context, b *svc.Builder, seqSet func(*svc.Builder, uint32), fds ...int) (Reply, error) {
	ch := make(chan Reply, 1)
	s.mu.Lock()
	if s.closed {
		err := s.err
		s.mu.Unlock()
		return Reply{}, err
	}
	s.seq++
	if s.seq == 0 {
		s.seq = 1
	}
	seq := s.seq
	s.pending[seq] = ch
	s.mu.Unlock()
	seqSet(b, seq)
	m := b.Msg()
	err := svc.CheckSize(m)
	if err == nil {
		err = svc.Write(s.conn, m, fds...)
	}
	if err != nil {
		s.mu.Lock()
		delete(s.pending, seq)
		s.mu.Unlock()
		if errors.Is(err, svc.ErrTooLarge) {
			// The service would get it cut off and could not tell
			// which call it was.
			return Reply{}, err
		}
		return Reply{}, fmt.Errorf("verbs: service: %w", err)
	}
	var r Reply
	var ok bool
	select {
	case r, ok = <-ch:
	case <-ctx.Done():
		// Ask the service to abandon the call, and take its answer all
		// the same: what it did (a request it had already taken, a
		// connection it had made) must not be lost between the two.
		var cb svc.Builder
		svc.Write(s.conn, cb.Reset(svc.TCancel, 0, 0).Args(uint64(seq)).Msg())
		r, ok = <-ch
		if ok && (r.M.Status() == svc.StatusCanceled || r.M.Status() == svc.StatusTimeout) {
			closeFDs(r.FDs)
			return Reply{}, ctx.Err()
		}
	}
	if !ok {
		return Reply{}, s.Err()
	}
	if st := r.M.Status(); st != svc.StatusOK {
		closeFDs(r.FDs)
		return Reply{}, s.cfg.Status(r.M)
	}
	return r, nil
}

// Do is Call with a message of type t that build fills in (its arguments
// and payload; nil for none).
func (s *Session) Do(ctx context.Context, t svc.Type, build func(*svc.Builder), fds ...int) (Reply, error) {
	var b svc.Builder
	return s.Call(ctx, &b, func(b *svc.Builder, seq uint32) {
		b.Reset(t, seq, 0)
		if build != nil {
			build(b)
		}
	}, fds...)
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
