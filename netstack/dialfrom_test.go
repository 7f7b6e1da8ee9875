package netstack

import (
	"context"
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"
)

// TestDialFrom: a connection from a chosen local port comes from that
// port (the peer sees it); the port in use, or an address not the
// stack's, is refused with the errno.
func TestDialFrom(t *testing.T) {
	a, b := newTestPair(t, PairConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := b.Listen(netip.AddrPortFrom(netip.Addr{}, 4000), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	raddr := netip.AddrPortFrom(b.Addrs()[0].Addr(), 4000)
	c, err := a.DialFrom(ctx, netip.AddrPortFrom(netip.Addr{}, 5123), raddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := netip.AddrPortFrom(a.Addrs()[0].Addr(), 5123)
	if c.LocalAddr() != want || s.RemoteAddr() != want {
		t.Fatalf("local %v, the peer sees %v, want %v", c.LocalAddr(), s.RemoteAddr(), want)
	}
	if _, err := a.DialFrom(ctx, netip.AddrPortFrom(a.Addrs()[0].Addr(), 5123), raddr); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("a second connection from port 5123: %v, want EADDRINUSE", err)
	}
	if _, err := a.DialFrom(ctx, netip.MustParseAddrPort("203.0.113.9:5124"), raddr); !errors.Is(err, syscall.EADDRNOTAVAIL) {
		t.Fatalf("from an address not the stack's: %v, want EADDRNOTAVAIL", err)
	}
}
