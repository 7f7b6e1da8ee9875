package session

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"

	"github.com/rdmatap/rdmatap/verbs/internal/svc"

	"golang.org/x/sys/unix"
)

var errStatus = errors.New("status")

// statusErr is the tests' Config.Status: the status, wrapped.
type statusErr struct{ st uint32 }

func (e statusErr) Error() string { return fmt.Sprintf("status %d", e.st) }
func (e statusErr) Unwrap() error { return errStatus }

// fake is a service that the test drives message by message.
type fake struct {
	t    *testing.T
	conn *net.UnixConn
	buf  []byte
	oob  []byte
}

// listen serves one session on a socket in a temporary directory.
func listen(t *testing.T) (string, <-chan *fake) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s")
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ch := make(chan *fake, 1)
	go func() {
		c, err := l.AcceptUnix()
		if err != nil {
			close(ch)
			return
		}
		t.Cleanup(func() { c.Close() })
		ch <- &fake{t: t, conn: c, buf: make([]byte, svc.MaxMessage), oob: make([]byte, svc.OOBSpace)}
	}()
	return path, ch
}

// read reads the client's next message.
func (f *fake) read() svc.Msg {
	m, fds, err := svc.Read(f.conn, f.buf, f.oob, nil)
	if err == nil {
		err = m.Check()
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	if err != nil {
		f.t.Errorf("service: read: %v", err)
		return nil
	}
	return append(svc.Msg(nil), m...)
}

func (f *fake) write(b *svc.Builder, fds ...int) {
	if err := svc.Write(f.conn, b.Msg(), fds...); err != nil {
		f.t.Errorf("service: write: %v", err)
	}
}

// hello answers the client's HELLO with a control page and a doorbell.
func (f *fake) hello() {
	if m := f.read(); m == nil || m.Type() != svc.THello || m.Arg(1) != svc.Version {
		f.t.Errorf("service: got %v, want HELLO version %d", m, svc.Version)
		return
	}
	fd, ctl, err := svc.NewMemfd("ctl", svc.CtlSize)
	if err != nil {
		f.t.Error(err)
		return
	}
	defer unix.Close(fd)
	defer svc.Unmap(ctl)
	bell, err := svc.NewEventfd()
	if err != nil {
		f.t.Error(err)
		return
	}
	defer bell.Close()
	var b svc.Builder
	f.write(b.Reset(svc.THello, 0, svc.StatusOK).Args(svc.Version, 1, 7, svc.FeatureQueryDevice).String("dev0"), fd, bell.Fd())
}

type events struct {
	mu     sync.Mutex
	msgs   []svc.Type
	failed []error
}

func (e *events) config() Config {
	return Config{
		Status: func(m svc.Msg) error { return statusErr{m.Status()} },
		Message: func(m svc.Msg) {
			e.mu.Lock()
			e.msgs = append(e.msgs, m.Type())
			e.mu.Unlock()
		},
		Failed: func(err error) {
			e.mu.Lock()
			e.failed = append(e.failed, err)
			e.mu.Unlock()
		},
	}
}

func TestDialRefused(t *testing.T) {
	path, fc := listen(t)
	go func() {
		f := <-fc
		f.read()
		var b svc.Builder
		f.write(b.Reset(svc.THello, 0, svc.StatusLimit).String("too many clients"))
		f.conn.Close()
	}()
	var s Session
	var e events
	_, err := s.Dial(context.Background(), path, e.config())
	var se statusErr
	if !errors.As(err, &se) || se.st != svc.StatusLimit {
		t.Fatalf("Dial: %v, want the Status error of StatusLimit", err)
	}
}

func TestDialNotHello(t *testing.T) {
	path, fc := listen(t)
	go func() {
		f := <-fc
		f.read()
		var b svc.Builder
		f.write(b.Reset(svc.TStats, 0, svc.StatusOK))
	}()
	var s Session
	var e events
	if _, err := s.Dial(context.Background(), path, e.config()); err == nil {
		t.Fatal("Dial took a STATS answer to its HELLO")
	}
}

// TestCalls: replies reach their calls, a message that answers no call
// reaches Config.Message, a status reaches Config.Status, a canceled call
// gets its context's error, and the service's end fails the calls in
// flight, then Config.Failed, once.
func TestCalls(t *testing.T) {
	path, fc := listen(t)
	var s Session
	var e events
	served := make(chan struct{})
	go func() {
		defer close(served)
		f := <-fc
		f.hello()
		// A call: an EVENT first, then its reply (out of order with a
		// second call's).
		m1 := f.read()
		m2 := f.read()
		var b svc.Builder
		f.write(b.Reset(svc.TEvent, 0, svc.StatusOK).Args(1, 2))
		f.write(b.Reset(m2.Type(), m2.Seq(), svc.StatusBusy))
		f.write(b.Reset(m1.Type(), m1.Seq(), svc.StatusOK).Args(42))
		// A canceled call: the CANCEL names it.
		m3 := f.read()
		c := f.read()
		if c.Type() != svc.TCancel || c.Arg(0) != uint64(m3.Seq()) {
			t.Errorf("service: got %v arg %d after call %d, want CANCEL of it", c.Type(), c.Arg(0), m3.Seq())
		}
		f.write(b.Reset(m3.Type(), m3.Seq(), svc.StatusCanceled))
		// A call the service never answers: it closes.
		f.read()
		f.conn.Close()
	}()
	h, err := s.Dial(context.Background(), path, e.config())
	if err != nil {
		t.Fatal(err)
	}
	if h.Name != "dev0" || h.Flags != 1 || h.Features != svc.FeatureQueryDevice {
		t.Fatalf("Hello %+v", h)
	}
	s.Start()
	var wg sync.WaitGroup
	var rs [2]Reply
	var errs [2]error
	for i, typ := range []svc.Type{svc.TAllocPD, svc.TStats} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs[i], errs[i] = s.Do(context.Background(), typ, nil)
		}()
	}
	wg.Wait()
	// Which call the service read first is the scheduler's: that one is
	// answered OK, the other StatusBusy.
	ok, busy := 0, 1
	if errs[0] != nil {
		ok, busy = 1, 0
	}
	var se statusErr
	if errs[ok] != nil || rs[ok].M.Arg(0) != 42 || !errors.As(errs[busy], &se) || se.st != svc.StatusBusy {
		t.Fatalf("calls: %v and %v, want one OK with 42 and one StatusBusy", errs[0], errs[1])
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Do(ctx, svc.TAllocPD, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled call: %v, want context.Canceled", err)
	}
	if _, err := s.Do(context.Background(), svc.TAllocPD, nil); err == nil || err != s.Err() {
		t.Fatalf("call when the service closed: %v, want the session's end %v", err, s.Err())
	}
	<-s.Done()
	if _, err := s.Do(context.Background(), svc.TAllocPD, nil); err == nil || err != s.Err() {
		t.Fatalf("call after the end: %v, want %v", err, s.Err())
	}
	released := false
	s.Close(func() { released = true })
	<-served
	if !released {
		t.Error("Close did not run release")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.msgs) != 1 || e.msgs[0] != svc.TEvent {
		t.Errorf("Message got %v, want one EVENT", e.msgs)
	}
	if len(e.failed) != 1 || e.failed[0] != s.Err() {
		t.Errorf("Failed got %v, want once %v", e.failed, s.Err())
	}
}

func TestCallTooLarge(t *testing.T) {
	path, fc := listen(t)
	go func() { (<-fc).hello() }()
	var s Session
	var e events
	if _, err := s.Dial(context.Background(), path, e.config()); err != nil {
		t.Fatal(err)
	}
	s.Start()
	defer s.Close(nil)
	big := make([]byte, 2*svc.MaxMessage)
	_, err := s.Do(context.Background(), svc.TAllocPD, func(b *svc.Builder) { b.Bytes(big) })
	if !errors.Is(err, svc.ErrTooLarge) {
		t.Fatalf("too large a call: %v, want svc.ErrTooLarge", err)
	}
}

// FuzzSession: a hostile service's messages after HELLO (the input, each
// message a length byte and that many bytes, sent as they are), while a
// call waits. Whatever they are, the call returns its own reply or an
// error, only EVENT and QP_DONE reach Config.Message, the session ends
// once when the service closes, and Close returns.
func FuzzSession(f *testing.F) {
	var b svc.Builder
	seed := func(ms ...svc.Msg) []byte {
		var in []byte
		for _, m := range ms {
			in = append(in, byte(len(m)))
			in = append(in, m...)
		}
		return in
	}
	f.Add(seed(b.Reset(svc.TAllocPD, 1, svc.StatusOK).Args(3).Msg()))
	f.Add(seed(b.Reset(svc.TEvent, 0, svc.StatusOK).Args(1, 2, 3).Msg(), b.Reset(svc.TAllocPD, 2, svc.StatusOK).Msg()))
	f.Add(seed(b.Reset(svc.TQPDone, 0, svc.StatusOK).String("x").Msg(), b.Reset(svc.TAllocPD, 1, svc.StatusBusy).Msg()))
	f.Add([]byte{3, 1, 2, 3})
	f.Fuzz(func(t *testing.T, in []byte) {
		path, fc := listen(t)
		go func() {
			f := <-fc
			f.hello()
			f.read()
			for len(in) > 0 {
				n := min(int(in[0]), len(in)-1)
				f.conn.Write(in[1 : 1+n])
				in = in[1+n:]
			}
			f.conn.Close()
		}()
		var s Session
		var e events
		if _, err := s.Dial(context.Background(), path, e.config()); err != nil {
			t.Fatal(err)
		}
		s.Start()
		r, err := s.Do(context.Background(), svc.TAllocPD, nil)
		if err == nil && (r.M.Seq() != 1 || r.M.Status() != svc.StatusOK || r.M.Check() != nil) {
			t.Errorf("call 1 got seq %d status %d", r.M.Seq(), r.M.Status())
		}
		for _, fd := range r.FDs {
			unix.Close(fd)
		}
		<-s.Done()
		s.Close(nil)
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, typ := range e.msgs {
			if typ != svc.TEvent && typ != svc.TQPDone {
				t.Errorf("Message got %v", typ)
			}
		}
		if len(e.failed) != 1 {
			t.Errorf("Failed %d times, want once", len(e.failed))
		}
	})
}
