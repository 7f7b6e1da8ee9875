package tcp_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/netstack"
	rtcp "github.com/rdmatap/rdmatap/netstack/tcp"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

var (
	addrA = tcpip.AddrFrom4([4]byte{10, 9, 0, 1})
	addrB = tcpip.AddrFrom4([4]byte{10, 9, 0, 2})
)

// stacks builds two gVisor stacks on an in-memory link: a runs this
// package's TCP, b gVisor's.
func stacks(t *testing.T, link netstack.LinkConfig, impair *netstack.ImpairConfig) (*rtcp.Protocol, *stack.Stack, *stack.Stack) {
	t.Helper()
	la, lb := netstack.NewLinkPair(link)
	if impair != nil {
		ib := *impair
		ib.Seed++
		la, lb = netstack.NewImpair(la, *impair), netstack.NewImpair(lb, ib)
		t.Cleanup(func() {
			for i, l := range []stack.LinkEndpoint{la, lb} {
				st := l.(*netstack.Impair).Stats()
				if st.Dropped == 0 || st.Reordered == 0 || st.Duplicated == 0 {
					t.Errorf("side %d's impairment did nothing: %+v", i, st)
				}
			}
		})
	}
	p := rtcp.NewProtocol(rtcp.Config{MinRTO: 20 * time.Millisecond})
	a := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{p.Factory()},
	})
	b := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol},
	})
	for _, x := range []struct {
		s    *stack.Stack
		l    stack.LinkEndpoint
		addr tcpip.Address
	}{{a, la, addrA}, {b, lb, addrB}} {
		if err := x.s.CreateNIC(1, x.l); err != nil {
			t.Fatal(err)
		}
		pa := tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber, AddressWithPrefix: x.addr.WithPrefix()}
		pa.AddressWithPrefix.PrefixLen = 24
		if err := x.s.AddProtocolAddress(1, pa, stack.AddressProperties{}); err != nil {
			t.Fatal(err)
		}
		x.s.SetRouteTable([]tcpip.Route{{Destination: pa.AddressWithPrefix.Subnet(), NIC: 1}})
	}
	t.Cleanup(func() {
		a.Close()
		b.Close()
		a.Wait()
		b.Wait()
	})
	return p, a, b
}

type stream interface {
	io.ReadWriter
	CloseWrite() error
}

// exchange writes n random bytes each way at once and checks that each
// side reads exactly the other's bytes, then EOF after the other's
// CloseWrite.
func exchange(t *testing.T, x, y stream, n int) {
	t.Helper()
	src := [2][]byte{make([]byte, n), make([]byte, n)}
	rand.Read(src[0])
	rand.Read(src[1])
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	got := [2][]byte{}
	for i, s := range []stream{x, y} {
		wg.Add(2)
		go func() {
			defer wg.Done()
			if _, err := s.Write(src[i]); err != nil {
				errs <- err
				return
			}
			if err := s.CloseWrite(); err != nil {
				errs <- err
			}
		}()
		go func() {
			defer wg.Done()
			b, err := io.ReadAll(s)
			got[1-i] = b
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := range src {
		if !bytes.Equal(got[i], src[i]) {
			t.Fatalf("side %d's %d bytes arrived as %d different ones", i, n, len(got[i]))
		}
	}
}

// TestWithGVisorTCP: this package's TCP talks to gVisor's over a link,
// in both roles, carrying data both ways at once with every byte
// checked, on links of MTU 1500 and 9000, and on one that loses,
// reorders and duplicates 1% of the packets each way.
func TestWithGVisorTCP(t *testing.T) {
	lossy := &netstack.ImpairConfig{Seed: 1, LossRate: 0.01, ReorderRate: 0.01, DupRate: 0.01}
	for _, tc := range []struct {
		mtu    uint32
		impair *netstack.ImpairConfig
	}{{1500, nil}, {9000, nil}, {1500, lossy}} {
		mtu := tc.mtu
		p, _, b := stacks(t, netstack.LinkConfig{MTU: mtu}, tc.impair)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()

		// Ours dials gVisor's.
		ln, err := gonet.ListenTCP(b, tcpip.FullAddress{NIC: 1, Addr: addrB, Port: 5000}, ipv4.ProtocolNumber)
		if err != nil {
			t.Fatal(err)
		}
		accepted := make(chan net.Conn, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				t.Error(err)
			}
			accepted <- c
		}()
		ea, err := p.Dial(ctx, 1, tcpip.FullAddress{Addr: addrA}, tcpip.FullAddress{Addr: addrB, Port: 5000}, ipv4.ProtocolNumber)
		if err != nil {
			t.Fatalf("MTU %d: Dial: %v", mtu, err)
		}
		cb := (<-accepted).(*gonet.TCPConn)
		exchange(t, ea, cb, 4<<20)
		ea.Close()
		cb.Close()
		ln.Close()

		// gVisor's dials ours.
		l, err := p.Listen(6000, 8)
		if err != nil {
			t.Fatal(err)
		}
		dialed := make(chan *gonet.TCPConn, 1)
		go func() {
			c, err := gonet.DialContextTCP(ctx, b, tcpip.FullAddress{NIC: 1, Addr: addrA, Port: 6000}, ipv4.ProtocolNumber)
			if err != nil {
				t.Error(err)
			}
			dialed <- c
		}()
		ea, err = l.Accept(ctx)
		if err != nil {
			t.Fatalf("MTU %d: Accept: %v", mtu, err)
		}
		cb = <-dialed
		exchange(t, ea, cb, 4<<20)
		ea.Close()
		cb.Close()
		l.Close()
	}
}

// TestRefusedByGVisorTCP: a SYN to a port nobody listens on is answered
// with a RST, and Dial says so; ours answers gVisor's likewise.
func TestRefusedByGVisorTCP(t *testing.T) {
	p, _, b := stacks(t, netstack.LinkConfig{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p.Dial(ctx, 1, tcpip.FullAddress{Addr: addrA}, tcpip.FullAddress{Addr: addrB, Port: 7}, ipv4.ProtocolNumber); !errors.Is(err, rtcp.ErrRefused) {
		t.Fatalf("Dial to a closed port: %v, want ErrRefused", err)
	}
	_, err := gonet.DialContextTCP(ctx, b, tcpip.FullAddress{NIC: 1, Addr: addrA, Port: 7}, ipv4.ProtocolNumber)
	if !errors.Is(err, syscall.ECONNREFUSED) && (err == nil || err.Error() == "") {
		t.Fatalf("gVisor's Dial to our closed port: %v", err)
	}
	if err == nil {
		t.Fatal("gVisor's Dial to our closed port succeeded")
	}
}

// TestResetToGVisorTCP: closing with unread data resets the connection,
// and gVisor's end sees the reset.
func TestResetToGVisorTCP(t *testing.T) {
	p, _, b := stacks(t, netstack.LinkConfig{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := p.Listen(6001, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cb, err := gonet.DialContextTCP(ctx, b, tcpip.FullAddress{NIC: 1, Addr: addrA, Port: 6001}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	ea, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Write([]byte("unread")); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ea.Buffered() < 6; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the bytes never arrived")
		}
	}
	ea.Close()
	cb.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := cb.Read(make([]byte, 10)); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("gVisor's read after our reset: %v, want a reset", err)
	}
}
