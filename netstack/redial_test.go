package netstack

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// TestRedialAfterServerClosesFirst dials one listener port again and again,
// each connection carrying more bytes from the client than gVisor's ISN
// clock (one tick per 64 ns) advances while it lasts, and the server
// closing first, so that it keeps every connection in TIME-WAIT. gVisor
// leaves TIME-WAIT for a SYN only if its sequence number is above the old
// connection's RcvNxt and drops any other SYN without a word, so a client
// port picked again for that server port made the dial wait for the SYN's
// retransmissions until the context ended. The client's ephemeral range
// is narrowed to 64 ports so that gVisor's random pick repeats a port
// within the rounds (with all 49 536 it did so in about a third of runs of
// verbs' TestDeregFencesMemory).
func TestRedialAfterServerClosesFirst(t *testing.T) {
	a, b := newTestPair(t, PairConfig{})
	if terr := a.s.SetPortRange(40000, 40063); terr != nil {
		t.Fatal(terr)
	}
	ln, err := b.Listen(netip.AddrPort{}, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	raddr := netip.AddrPortFrom(b.Addrs()[0].Addr(), ln.Addr().Port())
	msg := make([]byte, 64<<10)
	seen := map[uint16]int{}
	const rounds = 48
	for i := 0; i < rounds; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		acc := make(chan *Conn, 1)
		go func() {
			c, err := ln.Accept(ctx)
			if err != nil {
				c = nil
			}
			acc <- c
		}()
		cl, err := a.Dial(ctx, raddr)
		if err != nil {
			cancel()
			t.Fatalf("round %d: Dial: %v (client ports so far: %v)", i, err, seen)
		}
		seen[cl.LocalAddr().Port()]++
		sv := <-acc
		if sv == nil {
			cancel()
			t.Fatalf("round %d: Accept failed", i)
		}
		if _, err := cl.Write(ctx, msg); err != nil {
			t.Fatalf("round %d: Write: %v", i, err)
		}
		if err := sv.ReadFull(ctx, make([]byte, len(msg))); err != nil {
			t.Fatalf("round %d: server ReadFull: %v", i, err)
		}
		sv.Close() // the server closes first: TIME-WAIT is on its side
		if err := cl.ReadFull(ctx, make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("round %d: client read after server close: %v, want EOF", i, err)
		}
		cl.Close()
		cancel()
	}
}

// TestRedialSamePortTakesNewPort makes Dial pick, for the same server port,
// the local port of a connection the server still holds in TIME-WAIT: the
// SYN goes unanswered, and Dial sends another from a new port after
// dialFirstSYNWait; with a shorter context it fails saying so.
func TestRedialSamePortTakesNewPort(t *testing.T) {
	gvisorOnly(t)
	a, b := newTestPair(t, PairConfig{})
	ln, err := b.Listen(netip.AddrPort{}, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	raddr := netip.AddrPortFrom(b.Addrs()[0].Addr(), ln.Addr().Port())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	acc := make(chan *Conn, 2)
	go func() {
		for {
			c, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			acc <- c
		}
	}()
	cl, err := a.Dial(ctx, raddr)
	if err != nil {
		t.Fatal(err)
	}
	sv := <-acc
	// 64 MiB: the ISN clock needs 4.3 s to pass the old sequence numbers.
	const size = 64 << 20
	go cl.Write(ctx, make([]byte, size))
	if err := sv.ReadFull(ctx, make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	sv.Close()
	if err := cl.ReadFull(ctx, make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("client read after server close: %v, want EOF", err)
	}
	cl.Close()
	old := cl.LocalAddr().Port()
	// The client's side frees its port once the server's ACK of its FIN
	// is in and the endpoint is cleaned up.
	for {
		ep, terr := a.s.NewEndpoint(tcp.ProtocolNumber, ipv4.ProtocolNumber, new(waiter.Queue))
		if terr != nil {
			t.Fatal(terr)
		}
		terr = ep.Bind(tcpip.FullAddress{Addr: toTCPIPAddr(a.Addrs()[0].Addr()), Port: old})
		ep.Close()
		if terr == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("client port %d still in use: %v", old, terr)
		}
		time.Sleep(time.Millisecond)
	}

	// Rewind the port counter: the next pick is the old port again.
	a.portNext.Add(^uint32(0))
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = a.Dial(short, raddr)
	cancelShort()
	var se *synUnansweredError
	if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &se) || len(se.ports) != 1 || se.ports[0] != old {
		t.Fatalf("Dial from port %d with 300 ms: %v, want an unanswered SYN from that port and DeadlineExceeded", old, err)
	}
	t.Logf("short dial: %v", err)

	a.portNext.Add(^uint32(0)) // the old port again
	start := time.Now()
	cl2, err := a.Dial(ctx, raddr)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer cl2.Close()
	if p := cl2.LocalAddr().Port(); p == old {
		t.Fatalf("connected from port %d, which the server holds in TIME-WAIT", p)
	}
	// It waited out the first SYN (a timer: no load makes it shorter)
	// before it dialed from another port.
	if d := time.Since(start); d < dialFirstSYNWait {
		t.Errorf("Dial took %v, less than the %v it waits for an answer to the first SYN", d, dialFirstSYNWait)
	}
	<-acc
}

// TestDialNoRoute: Dial's own route lookup (for the source address it
// binds) fails as gVisor's Connect did, at once.
func TestDialNoRoute(t *testing.T) {
	a, _ := newTestPair(t, PairConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// A Dial that waited for an answer would end with the context's
	// deadline instead.
	_, err := a.Dial(ctx, netip.MustParseAddrPort("198.51.100.1:80"))
	if !errors.Is(err, syscall.ENETUNREACH) && !errors.Is(err, syscall.EHOSTUNREACH) {
		t.Fatalf("Dial without a route: %v, want ENETUNREACH or EHOSTUNREACH", err)
	}
	t.Logf("%v", err)
}

// TestRelistenAfterServerClosesFirst: a server that closed its connections
// first (they sit in TIME-WAIT for a minute) listens on the same port again
// at once, and is reached there; a second listener on a port in use is
// still refused.
func TestRelistenAfterServerClosesFirst(t *testing.T) {
	a, b := newTestPair(t, PairConfig{})
	const port = 18515
	for i := 0; i < 3; i++ {
		ln, err := b.Listen(netip.AddrPortFrom(netip.Addr{}, port), 4)
		if err != nil {
			t.Fatalf("round %d: listen: %v", i, err)
		}
		if _, err := b.Listen(netip.AddrPortFrom(netip.Addr{}, port), 4); err == nil {
			t.Fatalf("round %d: a second listener on port %d was accepted", i, port)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ch := make(chan *Conn, 1)
		go func() {
			c, _ := ln.Accept(ctx)
			ch <- c
		}()
		c, err := a.Dial(ctx, netip.AddrPortFrom(b.Addrs()[0].Addr(), port))
		if err != nil {
			t.Fatalf("round %d: dial: %v", i, err)
		}
		s := <-ch
		if s == nil {
			t.Fatalf("round %d: no connection accepted", i)
		}
		s.Close() // the server closes first: its side waits in TIME-WAIT
		c.Close()
		ln.Close()
		cancel()
		time.Sleep(10 * time.Millisecond)
	}
}
