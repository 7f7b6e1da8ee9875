package iwarp

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// connStream adapts a kernel TCP connection (loopback) to Stream, so the
// engine can be tested without netstack, and a test can play a raw peer.
type connStream struct {
	c      net.Conn
	buf    []byte
	mu     sync.Mutex
	maxPay int
	closed chan struct{}
	once   sync.Once
}

func newConnStream(c net.Conn) *connStream {
	return &connStream{c: c, buf: make([]byte, 64<<10), maxPay: 1420, closed: make(chan struct{})}
}

func (s *connStream) deadline(ctx context.Context, set func(time.Time) error) func() {
	stop := context.AfterFunc(ctx, func() { set(time.Unix(1, 0)) })
	return func() {
		stop()
		set(time.Time{})
	}
}

func (s *connStream) mapErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	select {
	case <-s.closed:
		return net.ErrClosed
	default:
	}
	return err
}

func (s *connStream) ReadTo(ctx context.Context, w io.Writer, max int) (int, error) {
	defer s.deadline(ctx, s.c.SetReadDeadline)()
	b := s.buf
	if max > 0 && max < len(b) {
		b = b[:max]
	}
	n, err := s.c.Read(b)
	if n > 0 {
		// Hand the bytes over in odd-sized pieces, as packet views are.
		p := b[:n]
		for len(p) > 0 {
			k := min(len(p), 1+len(p)%777)
			if _, werr := w.Write(p[:k]); werr != nil {
				return n, werr
			}
			p = p[k:]
		}
		return n, nil
	}
	return 0, s.mapErr(ctx, err)
}

func (s *connStream) TryReadTo(w io.Writer, max int) (int, error) {
	s.c.SetReadDeadline(time.Now().Add(time.Microsecond))
	defer s.c.SetReadDeadline(time.Time{})
	b := s.buf
	if max > 0 && max < len(b) {
		b = b[:max]
	}
	n, err := s.c.Read(b)
	if n > 0 {
		if _, werr := w.Write(b[:n]); werr != nil {
			return n, werr
		}
		return n, nil
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return 0, nil
	}
	return 0, s.mapErr(context.Background(), err)
}

// WaitReadable is approximated: kernel sockets give no readiness without
// reading, so the receive loop just tries again after a short pause.
func (s *connStream) WaitReadable(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-s.closed:
		return net.ErrClosed
	case <-time.After(50 * time.Microsecond):
		return nil
	}
}

func (s *connStream) ReadFull(ctx context.Context, p []byte) error {
	defer s.deadline(ctx, s.c.SetReadDeadline)()
	_, err := io.ReadFull(s.c, p)
	if err != nil {
		return s.mapErr(ctx, err)
	}
	return nil
}

func (s *connStream) Write(ctx context.Context, p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.deadline(ctx, s.c.SetWriteDeadline)()
	n, err := s.c.Write(p)
	if err != nil {
		return n, s.mapErr(ctx, err)
	}
	return n, nil
}

func (s *connStream) WritePayload(ctx context.Context, pl tcpip.Payloader) (int64, error) {
	var total int64
	buf := make([]byte, 32<<10)
	for pl.Len() > 0 {
		// Uneven chunk sizes exercise the payloader's resumption.
		k := min(len(buf), pl.Len(), 1000+int(total%3000))
		n, err := pl.Read(buf[:k])
		if n > 0 {
			if _, werr := s.Write(ctx, buf[:n]); werr != nil {
				return total, werr
			}
			total += int64(n)
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return total, err
		}
		if n == 0 {
			break
		}
	}
	return total, nil
}

func (s *connStream) MaxPayload() int { return s.maxPay }
func (s *connStream) CloseWrite() error {
	if tc, ok := s.c.(*net.TCPConn); ok {
		return tc.CloseWrite()
	}
	return nil
}
func (s *connStream) Abort() {
	if tc, ok := s.c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	s.Close()
}
func (s *connStream) Close() error {
	s.once.Do(func() { close(s.closed) })
	return s.c.Close()
}

// tcpPair returns two connected loopback TCP streams.
func tcpPair(t testing.TB) (*connStream, *connStream) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			ch <- nil
			return
		}
		ch <- c
	}()
	a, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b := <-ch
	if b == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return newConnStream(a), newConnStream(b)
}
