package netstack

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"syscall"
	"testing"
	"time"
)

func TestParseTCP(t *testing.T) {
	t.Setenv(TCPEnv, "")
	for in, want := range map[string]string{"": TCPGVisor, "gvisor": TCPGVisor, "rdmatap": TCPRdmatap} {
		if got, err := ParseTCP(in); err != nil || got != want {
			t.Errorf("ParseTCP(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseTCP("linux"); !errors.Is(err, ErrConfig) {
		t.Errorf("ParseTCP(linux): %v, want ErrConfig", err)
	}
	t.Setenv(TCPEnv, "rdmatap")
	if got, _ := ParseTCP(""); got != TCPRdmatap {
		t.Errorf("ParseTCP with %s=rdmatap: %q", TCPEnv, got)
	}
}

// TestOwnTCPConn runs Conn's calls on rdmatap's TCP, chosen in the
// configuration: bulk both ways with every byte checked, the peer's FIN,
// Done, a refused dial and a reset.
func TestOwnTCPConn(t *testing.T) {
	for _, mtu := range []uint32{1500, 9000} {
		a, b := newTestPair(t, PairConfig{Link: LinkConfig{MTU: mtu}, Stack: Config{TCP: TCPRdmatap}})
		if a.TCPName() != TCPRdmatap {
			t.Fatalf("TCPName = %q", a.TCPName())
		}
		c1, c2 := connect(t, a, b)
		if _, ok := c1.OwnInfo(); !ok {
			t.Fatal("OwnInfo: not on rdmatap's TCP")
		}
		if got, want := c1.MaxPayload(), int(mtu)-20-20-12; got != want {
			t.Errorf("MTU %d: MaxPayload %d, want %d", mtu, got, want)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		bothWays(t, ctx, c1, c2, 8<<20, 3000)
		if st := c1.TCP(); st.SegmentsSent == 0 || st.SegmentsReceived == 0 || !st.Alive {
			t.Errorf("TCP() = %+v", st)
		}
		if st := a.TCPStats(); st.SegmentsSent < c1.TCP().SegmentsSent || st.SegmentsReceived == 0 {
			t.Errorf("TCPStats() = %+v, connection's %+v", st, c1.TCP())
		}
		if err := c1.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		if _, err := c2.ReadTo(ctx, io.Discard, 0); err != io.EOF {
			t.Fatalf("read after the peer's FIN: %v, want EOF", err)
		}
		if _, err := c1.Write(ctx, []byte("x")); !errors.Is(err, syscall.EPIPE) {
			t.Errorf("write after CloseWrite: %v, want EPIPE", err)
		}
		c2.Close()
		select {
		case <-c1.Done():
		case <-ctx.Done():
			t.Fatal("Done not closed after both directions shut")
		}
		c1.Close()

		// Reset: the peer aborts; a blocked read sees ErrReset.
		c3, c4 := connect(t, a, b)
		rerr := make(chan error, 1)
		go func() {
			_, err := c3.ReadTo(ctx, io.Discard, 0)
			rerr <- err
		}()
		time.Sleep(10 * time.Millisecond)
		c4.Abort()
		if err := <-rerr; !errors.Is(err, ErrReset) || !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("read after the peer's reset: %v, want ErrReset", err)
		}
		c3.Close()

		// Refused: nothing listens.
		addr := b.Addrs()[0].Addr()
		if _, err := a.Dial(ctx, netip.AddrPortFrom(addr, 9)); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("dial to a closed port: %v, want ECONNREFUSED", err)
		}
		// A closed connection has no segments to hand over.
		if _, err := c3.TapSegments(func(uint64, [][]byte) {}, nil); err == nil {
			t.Error("TapSegments on a closed connection: no error")
		}
		cancel()
	}
}

// TestOwnTCPLoopback: a connection to the stack's own address (both ends
// on one stack, as a device connecting to itself) carries data both ways
// at once and closes; the segments between the two ends loop back through
// the stack without either end's lock held.
func TestOwnTCPLoopback(t *testing.T) {
	a, _ := newTestPair(t, PairConfig{Stack: Config{TCP: TCPRdmatap}})
	l, err := a.Listen(netip.AddrPort{}, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	acc := make(chan *Conn, 1)
	go func() {
		c, _ := l.Accept(ctx)
		acc <- c
	}()
	c1, err := a.Dial(ctx, netip.AddrPortFrom(a.Addrs()[0].Addr(), l.Addr().Port()))
	if err != nil {
		t.Fatal(err)
	}
	c2 := <-acc
	if c2 == nil {
		t.Fatal("no connection accepted")
	}
	bothWays(t, ctx, c1, c2, 4<<20, 1000)
	c1.Close()
	if _, err := c2.ReadTo(ctx, io.Discard, 0); err != io.EOF {
		t.Fatalf("read after the peer's close: %v, want EOF", err)
	}
	c2.Close()
}

// bothWays sends total pattern bytes each way at once, c1's in writes of
// 70000 bytes and c2's in writes of back, and checks every byte.
func bothWays(t *testing.T, ctx context.Context, c1, c2 *Conn, total int64, back int) {
	t.Helper()
	errc := make(chan error, 2)
	go func() { errc <- sendPattern(ctx, c1, 1, total, 70000) }()
	go func() { errc <- sendPattern(ctx, c2, 2, total, back) }()
	if _, err := recvPattern(ctx, c2, 1, total); err != nil {
		t.Fatal(err)
	}
	if _, err := recvPattern(ctx, c1, 2, total); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}
