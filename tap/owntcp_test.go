package tap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	rtcp "github.com/rdmatap/rdmatap/netstack/tcp"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// ownTCPStack is a stack on d whose TCP is rdmatap's (netstack/tcp).
func ownTCPStack(tb testing.TB, d *Device) *rtcp.Protocol {
	tb.Helper()
	return ownTCPStackWith(tb, d, rtcp.Config{})
}

// ownTCPStackWith is ownTCPStack with cfg's keepalive.
func ownTCPStackWith(tb testing.TB, d *Device, ka rtcp.Config) *rtcp.Protocol {
	tb.Helper()
	p := rtcp.NewProtocol(rtcp.Config{MinRTO: 20 * time.Millisecond, RcvBuf: 4 << 20, SndBuf: 4 << 20,
		KeepaliveIdle: ka.KeepaliveIdle, KeepaliveInterval: ka.KeepaliveInterval, KeepaliveCount: ka.KeepaliveCount})
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{p.Factory()},
	})
	tb.Cleanup(func() {
		s.Close()
		s.Wait()
	})
	if err := s.CreateNIC(1, d.LinkEndpoint()); err != nil {
		tb.Fatalf("CreateNIC: %v", err)
	}
	a := mustPrefix(gvisorV4 + "/24")
	if err := s.AddProtocolAddress(1, tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFromSlice(a.Addr().AsSlice()), PrefixLen: a.Bits()}},
		stack.AddressProperties{}); err != nil {
		tb.Fatalf("AddProtocolAddress: %v", err)
	}
	s.SetRouteTable([]tcpip.Route{{Destination: mustSubnet(kernelV4 + "/24"), NIC: 1}})
	return p
}

// TestOwnTCPWithKernel: rdmatap's own TCP against the Linux kernel's over
// a TAP, plain and with offloads (the kernel's TSO/GRO super-frames):
// 32 MiB each way with every byte checked, in both roles, and the
// kernel's half close read as EOF while data still flows the other way.
func TestOwnTCPWithKernel(t *testing.T) {
	for _, offload := range []bool{false, true} {
		name := "plain"
		if offload {
			name = "offload"
		}
		t.Run(name, func(t *testing.T) {
			ns := newNetns(t)
			d := openIn(t, ns, Config{Name: tapName, NoOffload: !offload})
			ns.mustRun(t, "ip", "addr", "add", kernelV4+"/24", "dev", tapName)
			ns.mustRun(t, "ip", "link", "set", tapName, "up")
			p := ownTCPStack(t, d)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			const n = 32 << 20

			// Ours dials the kernel.
			var ln net.Listener
			if err := ns.do(func() (err error) { ln, err = net.Listen("tcp4", kernelV4+":0"); return }); err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			acc := make(chan net.Conn, 1)
			go func() {
				c, _ := ln.Accept()
				acc <- c
			}()
			kaddr := tcpip.AddrFromSlice(net.ParseIP(kernelV4).To4())
			e, err := p.Dial(ctx, 1, tcpip.FullAddress{}, tcpip.FullAddress{Addr: kaddr, Port: uint16(ln.Addr().(*net.TCPAddr).Port)}, ipv4.ProtocolNumber)
			if err != nil {
				t.Fatalf("Dial the kernel: %v", err)
			}
			k := <-acc
			if k == nil {
				t.Fatal("the kernel accepted nothing")
			}
			for _, dir := range []struct {
				name string
				w    io.Writer
				r    io.Reader
			}{{"ours→kernel", e, k}, {"kernel→ours", k, e}} {
				dt, err := transfer(dir.w, dir.r, n)
				if err != nil {
					t.Fatalf("%s: %v", dir.name, err)
				}
				t.Logf("%s %d MiB: %.2f Gbit/s", dir.name, n>>20, gbps(n, dt))
			}
			// The kernel half-closes; ours reads EOF and keeps sending.
			k.(*net.TCPConn).CloseWrite()
			if b, err := io.ReadAll(e); err != nil || len(b) != 0 {
				t.Fatalf("after the kernel's FIN: %d bytes, %v", len(b), err)
			}
			if _, err := transfer(e, k, 1<<20); err != nil {
				t.Fatalf("ours→kernel after its FIN: %v", err)
			}
			e.Close()
			if b, err := io.ReadAll(k); err != nil || len(b) != 0 {
				t.Fatalf("the kernel after our FIN: %d bytes, %v", len(b), err)
			}
			k.Close()

			// The kernel dials ours.
			l, err := p.Listen(7000, 4)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			dialed := make(chan net.Conn, 1)
			go func() {
				var c net.Conn
				ns.do(func() (err error) { c, err = net.Dial("tcp4", gvisorV4+":7000"); return })
				dialed <- c
			}()
			e, err = l.Accept(ctx)
			if err != nil {
				t.Fatalf("Accept the kernel: %v", err)
			}
			k = <-dialed
			if k == nil {
				t.Fatal("the kernel's dial failed")
			}
			if _, err := transfer(k, e, n); err != nil {
				t.Fatalf("kernel→ours (accepted): %v", err)
			}
			if _, err := transfer(e, k, n); err != nil {
				t.Fatalf("ours→kernel (accepted): %v", err)
			}
			e.Close()
			k.Close()
			st := d.Stats()
			if st.TxErrors != 0 || st.RxErrors != 0 {
				t.Errorf("TAP errors: %+v", st)
			}
		})
	}
}

// TestOwnTCPKernelStallAndReset: against the kernel's TCP over a TAP, a
// kernel reader that stops reading closes its window; ours probes it (the
// persist timer) for seconds without giving up, and every byte arrives
// once the reader goes on. A kernel socket closed with unread data, or
// with SO_LINGER 0, resets: ours reads ErrReset. Ours aborting resets the
// kernel's socket (ECONNRESET).
func TestOwnTCPKernelStallAndReset(t *testing.T) {
	ns := newNetns(t)
	d := openIn(t, ns, Config{Name: tapName})
	ns.mustRun(t, "ip", "addr", "add", kernelV4+"/24", "dev", tapName)
	ns.mustRun(t, "ip", "link", "set", tapName, "up")
	p := ownTCPStack(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	kl := listenKernel(t, ns)
	dial := func() (*rtcp.Endpoint, *net.TCPConn) { return kl.dial(ctx, t, p) }

	// The stalled reader.
	e, k := dial()
	const n = 16 << 20
	pat := newPattern()
	werr := make(chan error, 1)
	go func() { werr <- pat.send(e, n) }()
	time.Sleep(3 * time.Second) // the kernel's buffer fills; its window closes
	i := e.Info()
	if i.SndWnd != 0 || i.State != rtcp.Established {
		t.Fatalf("after 3 s of a stalled reader: window %d, state %v", i.SndWnd, i.State)
	}
	if err := pat.verify(k, n); err != nil {
		t.Fatalf("reading after the stall: %v", err)
	}
	if err := <-werr; err != nil {
		t.Fatalf("writing through the stall: %v", err)
	}
	e.Close()
	k.Close()

	// The kernel resets (SO_LINGER 0).
	e, k = dial()
	k.SetLinger(0)
	k.Close()
	if _, err := e.Read(make([]byte, 10)); !errors.Is(err, rtcp.ErrReset) {
		t.Fatalf("read after the kernel's RST: %v, want ErrReset", err)
	}
	e.Close()

	// Ours aborts.
	e, k = dial()
	e.Abort()
	k.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := k.Read(make([]byte, 10)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the kernel's read after our abort: %v, want ECONNRESET", err)
	}
	k.Close()
}

// TestOwnTCPKernelKeepalive: keepalive each way against the kernel's TCP
// over a TAP (1 s idle, probes 1 s apart, 3 unanswered end the
// connection). The kernel's probes get our answers through 5 s of
// silence, so its socket lives and carries data after it. Our probes get
// the kernel's answers; once its answers are dropped (nft, in its
// namespace), ours ends the connection with ErrTimeout after three
// unanswered probes.
func TestOwnTCPKernelKeepalive(t *testing.T) {
	ka := net.KeepAliveConfig{Enable: true, Idle: time.Second, Interval: time.Second, Count: 3}
	for _, ours := range []bool{false, true} {
		name := "kernel probes"
		if ours {
			name = "ours probes"
		}
		t.Run(name, func(t *testing.T) {
			ns := newNetns(t)
			d := openIn(t, ns, Config{Name: tapName})
			ns.mustRun(t, "ip", "addr", "add", kernelV4+"/24", "dev", tapName)
			ns.mustRun(t, "ip", "link", "set", tapName, "up")
			var cfg rtcp.Config
			if ours {
				cfg = rtcp.Config{KeepaliveIdle: ka.Idle, KeepaliveInterval: ka.Interval, KeepaliveCount: ka.Count}
			}
			p := ownTCPStackWith(t, d, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			kl := listenKernel(t, ns)
			e, k := kl.dial(ctx, t, p)
			defer e.Close()
			defer k.Close()
			port := kl.port
			if !ours {
				if err := k.SetKeepAliveConfig(ka); err != nil {
					t.Fatal(err)
				}
			} else if err := k.SetKeepAlive(false); err != nil {
				t.Fatal(err)
			}
			before := e.Info()
			time.Sleep(5 * time.Second)
			after := e.Info()
			in, out := after.SegsIn-before.SegsIn, after.SegsOut-before.SegsOut
			t.Logf("5 s idle: %d segments in, %d out", in, out)
			// A probe a second after 1 s of idle time, each answered.
			if in < 3 || out < 3 || after.State != rtcp.Established {
				t.Fatalf("5 s idle with keepalive: %d segments in and %d out (want at least 3 each), %v", in, out, after.State)
			}
			if _, err := transfer(k, e, 1<<20); err != nil {
				t.Fatalf("kernel→ours after the idle time: %v", err)
			}
			if _, err := transfer(e, k, 1<<20); err != nil {
				t.Fatalf("ours→kernel after the idle time: %v", err)
			}
			if !ours {
				return
			}
			// The kernel goes silent: its answers are dropped.
			ns.nftRules(t, fmt.Sprintf(`table inet rdmatap_ka {
	chain out {
		type filter hook output priority 0; policy accept;
		tcp sport %d drop
	}
}
`, port))
			start := time.Now()
			done := make(chan error, 1)
			go func() {
				_, err := e.Read(make([]byte, 1))
				done <- err
			}()
			select {
			case err := <-done:
				// 1 s idle, then 3 probes 1 s apart: about 4 s.
				el := time.Since(start)
				t.Logf("silent kernel: %v after %v", err, el.Round(time.Millisecond))
				if !errors.Is(err, rtcp.ErrTimeout) || el < 3*time.Second || el > 8*time.Second {
					t.Fatalf("read on a silent kernel: %v after %v, want ErrTimeout after about 4 s", err, el)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("20 s without the kernel's answers: the connection is still up")
			}
		})
	}
}

// kernelListener is a kernel TCP listener in a test's namespace.
type kernelListener struct {
	ln   net.Listener
	port int
}

// listenKernel listens on the kernel's side of the TAP (closed in
// Cleanup).
func listenKernel(t *testing.T, ns *netns) *kernelListener {
	t.Helper()
	var ln net.Listener
	if err := ns.do(func() (err error) { ln, err = net.Listen("tcp4", kernelV4+":0"); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return &kernelListener{ln: ln, port: ln.Addr().(*net.TCPAddr).Port}
}

// dial connects rdmatap's TCP (p) to the listener and returns both ends.
func (kl *kernelListener) dial(ctx context.Context, t *testing.T, p *rtcp.Protocol) (*rtcp.Endpoint, *net.TCPConn) {
	t.Helper()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := kl.ln.Accept()
		acc <- c
	}()
	kaddr := tcpip.FullAddress{Addr: tcpip.AddrFromSlice(net.ParseIP(kernelV4).To4()), Port: uint16(kl.port)}
	e, err := p.Dial(ctx, 1, tcpip.FullAddress{}, kaddr, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatalf("Dial the kernel: %v", err)
	}
	k := <-acc
	if k == nil {
		t.Fatal("the kernel accepted nothing")
	}
	return e, k.(*net.TCPConn)
}
