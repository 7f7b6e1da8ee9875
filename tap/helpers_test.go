package tap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

const (
	tapName   = "rtap0" // namespace-local name
	kernelV4  = "10.99.0.1"
	gvisorV4  = "10.99.0.2"
	kernelV6  = "fd00:99::1"
	gvisorV6  = "fd00:99::2"
	nsPrefix  = "rdmatap-"
	bulkBytes = 64 << 20
)

func requireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("tap tests need root and /dev/net/tun (not root)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		tb.Skipf("tap tests need root and /dev/net/tun (%v)", err)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		tb.Skip("tap tests need the ip command")
	}
}

var nsSeq atomic.Int32

// netns is a network namespace created for one test; it is deleted (with
// every virtual device in it) in Cleanup.
type netns struct {
	name string
	fd   int
}

func newNetns(tb testing.TB) *netns {
	tb.Helper()
	requireRoot(tb)
	tag := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, tb.Name())
	if len(tag) > 60 {
		tag = tag[len(tag)-60:]
	}
	name := fmt.Sprintf("%s%s-%d-%d", nsPrefix, tag, os.Getpid(), nsSeq.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		tb.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	ns := &netns{name: name, fd: -1}
	tb.Cleanup(func() {
		if ns.fd >= 0 {
			unix.Close(ns.fd)
		}
		// Deleting the namespace destroys the TAPs in it.
		exec.Command("ip", "netns", "exec", name, "ip", "link", "del", tapName).Run()
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			tb.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	fd, err := unix.Open("/run/netns/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		tb.Fatalf("open netns: %v", err)
	}
	ns.fd = fd
	ns.mustRun(tb, "ip", "link", "set", "lo", "up")
	return ns
}

// do runs f on a locked OS thread switched into the namespace. Sockets and
// TAPs created in f stay in the namespace when used from other threads.
func (ns *netns) do(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return // thread stays locked and is discarded
		}
		defer unix.Close(orig)
		if err := unix.Setns(ns.fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns.name, err)
			return
		}
		err = f()
		if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		} // else: the locked thread dies with this goroutine
		errc <- err
	}()
	return <-errc
}

func (ns *netns) run(args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns.name}, args...)...).CombinedOutput()
	return string(out), err
}

func (ns *netns) mustRun(tb testing.TB, args ...string) string {
	tb.Helper()
	out, err := ns.run(args...)
	if err != nil {
		tb.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// nftRules loads nft rules in ns (they go with it), or skips without nft.
func (ns *netns) nftRules(tb testing.TB, rules string) {
	tb.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		tb.Skip("skipping: nft (Debian package nftables) is missing")
	}
	cmd := exec.Command("ip", "netns", "exec", ns.name, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("nft: %v\n%s\n%s", err, out, rules)
	}
}

func (ns *netns) linkExists(name string) bool {
	_, err := ns.run("ip", "link", "show", "dev", name)
	return err == nil
}

// openIn opens a TAP inside ns and closes it in Cleanup.
func openIn(tb testing.TB, ns *netns, cfg Config) *Device {
	tb.Helper()
	var d *Device
	err := ns.do(func() error {
		var err error
		d, err = Open(cfg)
		return err
	})
	if err != nil {
		tb.Fatalf("Open(%+v): %v", cfg, err)
	}
	tb.Cleanup(func() { d.Close() })
	return d
}

// rig is a TAP in a fresh namespace with the kernel side at .1 and a gVisor
// stack at .2 (IPv4 /24 and IPv6 /64).
type rig struct {
	ns  *netns
	dev *Device
	s   *stack.Stack
}

func newRig(tb testing.TB, offload bool, mtu int) *rig {
	tb.Helper()
	ns := newNetns(tb)
	d := openIn(tb, ns, Config{Name: tapName, MTU: mtu, NoOffload: !offload})
	if d.Offload() != offload || !d.Created() || d.Name() != tapName {
		tb.Fatalf("device: offload=%v created=%v name=%q", d.Offload(), d.Created(), d.Name())
	}
	ns.mustRun(tb, "ip", "addr", "add", kernelV4+"/24", "dev", tapName)
	ns.mustRun(tb, "ip", "-6", "addr", "add", kernelV6+"/64", "dev", tapName, "nodad")
	ns.mustRun(tb, "ip", "link", "set", tapName, "up")
	s := newGVisorStack(tb, d)
	return &rig{ns: ns, dev: d, s: s}
}

func newGVisorStack(tb testing.TB, d *Device) *stack.Stack {
	tb.Helper()
	s := stack.New(stack.Options{
		NetworkProtocols: []stack.NetworkProtocolFactory{
			ipv4.NewProtocol,
			ipv6.NewProtocolWithOptions(ipv6.Options{DADConfigs: stack.DADConfigurations{DupAddrDetectTransmits: 0}}),
			arp.NewProtocol,
		},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, icmp.NewProtocol4, icmp.NewProtocol6},
	})
	tb.Cleanup(func() {
		s.Close()
		s.Wait()
	})
	sack := tcpip.TCPSACKEnabled(true)
	s.SetTransportProtocolOption(tcp.ProtocolNumber, &sack)
	rcv := tcpip.TCPReceiveBufferSizeRangeOption{Min: 4 << 10, Default: 1 << 20, Max: 8 << 20}
	s.SetTransportProtocolOption(tcp.ProtocolNumber, &rcv)
	snd := tcpip.TCPSendBufferSizeRangeOption{Min: 4 << 10, Default: 1 << 20, Max: 8 << 20}
	s.SetTransportProtocolOption(tcp.ProtocolNumber, &snd)
	if err := s.CreateNIC(1, d.LinkEndpoint()); err != nil {
		tb.Fatalf("CreateNIC: %v", err)
	}
	for _, a := range []string{gvisorV4 + "/24", gvisorV6 + "/64"} {
		p := mustPrefix(a)
		proto := ipv4.ProtocolNumber
		if p.Addr().Is6() {
			proto = ipv6.ProtocolNumber
		}
		if err := s.AddProtocolAddress(1, tcpip.ProtocolAddress{
			Protocol: proto,
			AddressWithPrefix: tcpip.AddressWithPrefix{
				Address:   tcpip.AddrFromSlice(p.Addr().AsSlice()),
				PrefixLen: p.Bits(),
			},
		}, stack.AddressProperties{}); err != nil {
			tb.Fatalf("AddProtocolAddress %s: %v", a, err)
		}
	}
	s.SetRouteTable([]tcpip.Route{
		{Destination: mustSubnet(kernelV4 + "/24"), NIC: 1},
		{Destination: mustSubnet(kernelV6 + "/64"), NIC: 1},
	})
	return s
}

// dialKernel connects from gVisor to a kernel listener in the namespace and
// returns both ends: gv (gVisor) and kc (kernel).
func (r *rig) connect(tb testing.TB) (gv net.Conn, kc net.Conn) {
	tb.Helper()
	var ln net.Listener
	if err := r.ns.do(func() error {
		var err error
		ln, err = net.Listen("tcp4", kernelV4+":0")
		return err
	}); err != nil {
		tb.Fatalf("listen in netns: %v", err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			acc <- nil
			return
		}
		acc <- c
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	gc, err := gonet.DialContextTCP(ctx, r.s, tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFromSlice(net.ParseIP(kernelV4).To4()), Port: uint16(port)}, ipv4.ProtocolNumber)
	if err != nil {
		tb.Fatalf("gonet dial: %v", err)
	}
	k := <-acc
	if k == nil {
		gc.Close()
		tb.Fatalf("accept failed")
	}
	tb.Cleanup(func() { gc.Close(); k.Close() })
	return gc, k
}

// pattern is a deterministic stream: a random 1 MiB block whose first 8 bytes
// are replaced by the block number, so shifted, duplicated or reordered data
// is detected.
type pattern struct{ base []byte }

func newPattern() *pattern {
	b := make([]byte, 1<<20)
	rng := rand.NewChaCha8([32]byte{1, 2, 3})
	rng.Read(b)
	return &pattern{base: b}
}

func (p *pattern) block(i int, dst []byte) []byte {
	dst = append(dst[:0], p.base...)
	for k := 0; k < 8; k++ {
		dst[k] = byte(i >> (8 * k))
	}
	return dst
}

// send writes n bytes of the pattern in 1 MiB writes.
func (p *pattern) send(w io.Writer, n int) error {
	var buf []byte
	for i := 0; i*len(p.base) < n; i++ {
		buf = p.block(i, buf)
		m := min(len(buf), n-i*len(p.base))
		if _, err := w.Write(buf[:m]); err != nil {
			return fmt.Errorf("write block %d: %w", i, err)
		}
	}
	return nil
}

// verify reads exactly n bytes and compares them with the pattern.
func (p *pattern) verify(r io.Reader, n int) error {
	want := make([]byte, 0, len(p.base))
	got := make([]byte, len(p.base))
	for i := 0; i*len(p.base) < n; i++ {
		want = p.block(i, want)
		m := min(len(want), n-i*len(p.base))
		if _, err := io.ReadFull(r, got[:m]); err != nil {
			return fmt.Errorf("read block %d: %w", i, err)
		}
		if !bytes.Equal(got[:m], want[:m]) {
			for k := range m {
				if got[k] != want[k] {
					return fmt.Errorf("data mismatch at byte %d", i*len(p.base)+k)
				}
			}
		}
	}
	return nil
}

// transfer sends n pattern bytes from w to r and verifies them.
func transfer(w io.Writer, r io.Reader, n int) (time.Duration, error) {
	p := newPattern()
	start := time.Now()
	errc := make(chan error, 1)
	go func() { errc <- p.send(w, n) }()
	verr := p.verify(r, n)
	werr := <-errc
	if verr != nil {
		return 0, verr
	}
	return time.Since(start), werr
}

func gbps(n int, d time.Duration) float64 { return float64(n) * 8 / d.Seconds() / 1e9 }

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func mustSubnet(s string) tcpip.Subnet {
	p := netip.MustParsePrefix(s).Masked()
	sn, err := tcpip.NewSubnet(tcpip.AddrFromSlice(p.Addr().AsSlice()),
		tcpip.MaskFromBytes(net.CIDRMask(p.Bits(), p.Addr().BitLen())))
	if err != nil {
		panic(err)
	}
	return sn
}

// kernelPing sends count ICMP echo requests with size payload bytes from a
// raw socket in the namespace (the kernel side) to dst and waits for the
// replies, like `ping -c count -W 2 [-M do] -s size dst` (no ping binary
// needed).
func (ns *netns) kernelPing(tb testing.TB, dst string, count, size int, dontFrag bool) {
	tb.Helper()
	ip := netip.MustParseAddr(dst)
	var fd int
	err := ns.do(func() error {
		var err error
		if ip.Is4() {
			fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
			if err == nil && dontFrag {
				err = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
			}
		} else {
			fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6)
			if err == nil && dontFrag {
				err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
			}
		}
		return err
	})
	if err != nil {
		tb.Fatalf("ping socket: %v", err)
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval((2 * time.Second).Nanoseconds())
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	var sa unix.Sockaddr
	typ, replyTyp := byte(8), byte(0)
	if ip.Is4() {
		sa = &unix.SockaddrInet4{Addr: ip.As4()}
	} else {
		sa = &unix.SockaddrInet6{Addr: ip.As16()}
		typ, replyTyp = 128, 129
	}
	id := uint16(os.Getpid())
	rbuf := make([]byte, 70000)
	for seq := 1; seq <= count; seq++ {
		msg := make([]byte, 8+size)
		msg[0] = typ
		msg[4], msg[5] = byte(id>>8), byte(id)
		msg[6], msg[7] = byte(seq>>8), byte(seq)
		for i := 8; i < len(msg); i++ {
			msg[i] = byte(i)
		}
		if ip.Is4() { // the kernel fills in the ICMPv6 checksum itself
			var s uint32
			for i := 0; i+1 < len(msg); i += 2 {
				s += uint32(msg[i])<<8 | uint32(msg[i+1])
			}
			if len(msg)%2 == 1 {
				s += uint32(msg[len(msg)-1]) << 8
			}
			for s > 0xffff {
				s = s>>16 + s&0xffff
			}
			c := ^uint16(s)
			msg[2], msg[3] = byte(c>>8), byte(c)
		}
		if err := unix.Sendto(fd, msg, 0, sa); err != nil {
			tb.Fatalf("ping %s seq %d: send: %v", dst, seq, err)
		}
		deadline := time.Now().Add(2 * time.Second)
		for {
			if time.Now().After(deadline) {
				tb.Fatalf("ping %s seq %d: no reply within 2 s", dst, seq)
			}
			n, _, err := unix.Recvfrom(fd, rbuf, 0)
			if err != nil {
				if errors.Is(err, unix.EINTR) {
					continue
				}
				tb.Fatalf("ping %s seq %d: %v", dst, seq, err)
			}
			b := rbuf[:n]
			if ip.Is4() {
				if len(b) < 20 {
					continue
				}
				b = b[int(b[0]&0xf)*4:]
			}
			if len(b) >= 8 && b[0] == replyTyp && uint16(b[4])<<8|uint16(b[5]) == id &&
				int(uint16(b[6])<<8|uint16(b[7])) == seq {
				if len(b) != len(msg) || !bytes.Equal(b[8:], msg[8:]) {
					tb.Fatalf("ping %s seq %d: reply payload differs (%d bytes, want %d)", dst, seq, len(b), len(msg))
				}
				break
			}
		}
	}
}
