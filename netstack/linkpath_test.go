package netstack

import (
	"context"
	"encoding/binary"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// padLink pads every inbound packet with bytes that are not the packet's,
// as Ethernet pads a short frame: IP's length, not the packet's, says
// where the segment ends.
type padLink struct {
	stack.LinkEndpoint
	pad []byte
}

func (l *padLink) Attach(d stack.NetworkDispatcher) {
	if d == nil {
		l.LinkEndpoint.Attach(nil)
		return
	}
	l.LinkEndpoint.Attach(&padDispatcher{d: d, pad: l.pad})
}

type padDispatcher struct {
	d   stack.NetworkDispatcher
	pad []byte
}

func (p *padDispatcher) DeliverNetworkPacket(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	b := append(pkt.Data().AsRange().ToSlice(), p.pad...)
	np := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(b)})
	np.RXChecksumValidated = pkt.RXChecksumValidated
	p.d.DeliverNetworkPacket(proto, np)
	np.DecRef()
}

func (p *padDispatcher) DeliverLinkPacket(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	p.d.DeliverLinkPacket(proto, pkt)
}

// ipReceived is how many packets the stack's IP layer has taken.
func ipReceived(s *Stack) uint64 { return s.s.Stats().IP.PacketsReceived.Value() }

// TestOwnTCPFromLink: rdmatap's TCP takes its connections' segments
// straight from the link, not through gVisor's IP layer. Bulk both ways
// arrives whole over IPv4 and IPv6, with and without padding after each
// packet, while IP sees only the handshake; while a raw segment tap is
// installed, segments go up through IP, where the tap sees them.
func TestOwnTCPFromLink(t *testing.T) {
	for _, tc := range []struct {
		name         string
		addrA, addrB string
		pad          int
	}{
		{"ipv4", "192.0.2.1/24", "192.0.2.2/24", 0},
		{"ipv4 padded", "192.0.2.1/24", "192.0.2.2/24", 13},
		{"ipv6", "fd00::1/64", "fd00::2/64", 0},
		{"ipv6 padded", "fd00::1/64", "fd00::2/64", 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			la, lb := NewLinkPair(LinkConfig{})
			pad := make([]byte, tc.pad)
			for i := range pad {
				pad[i] = 0xa5
			}
			var a, b *Stack
			for i, l := range []stack.LinkEndpoint{la, lb} {
				addr := tc.addrA
				if i == 1 {
					addr = tc.addrB
				}
				if tc.pad > 0 {
					l = &padLink{LinkEndpoint: l, pad: pad}
				}
				s, err := New(Config{Link: l, Addrs: []netip.Prefix{netip.MustParsePrefix(addr)}, TCP: TCPRdmatap})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(s.Close)
				if i == 0 {
					a = s
				} else {
					b = s
				}
			}
			c1, c2 := connect(t, a, b)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ipA, ipB := ipReceived(a), ipReceived(b)
			bothWays(t, ctx, c1, c2, 2<<20, 3000)
			if n := ipReceived(a) - ipA + ipReceived(b) - ipB; n != 0 {
				t.Errorf("IP took %d of the connection's packets; the TCP takes them from the link", n)
			}
			if st := b.TCPStats(); st.SegmentsReceived < 10 {
				t.Errorf("b's TCP received %d segments", st.SegmentsReceived)
			}

			var tapped atomic.Int64
			remove := b.TapSegments(func(s *Segment) {
				if s.Len() > 0 {
					tapped.Add(1)
				}
			})
			ipB = ipReceived(b)
			bothWays(t, ctx, c1, c2, 256<<10, 1000)
			remove()
			if tapped.Load() == 0 || ipReceived(b)-ipB < uint64(tapped.Load()) {
				t.Errorf("raw tap installed: it saw %d data segments, IP took %d packets", tapped.Load(), ipReceived(b)-ipB)
			}
			ipB = ipReceived(b)
			bothWays(t, ctx, c1, c2, 256<<10, 1000)
			if n := ipReceived(b) - ipB; n != 0 {
				t.Errorf("raw tap removed: IP still took %d packets", n)
			}
			if st := b.own.Stats(); st.InErrs != 0 {
				t.Errorf("InErrs = %d", st.InErrs)
			}
		})
	}
}

// TestOwnSegmentRefuses: what the link hands past IP is only what IP
// would take as it stands: anything else goes up through IP untouched.
func TestOwnSegmentRefuses(t *testing.T) {
	a, b := newTestPair(t, PairConfig{Stack: Config{TCP: TCPRdmatap}})
	c1, c2 := connect(t, a, b)
	src, dst := c1.LocalAddr(), c2.LocalAddr()
	l := b.nic

	// A connection of b's to itself, for a spoof from b's own address.
	ln, err := b.Listen(netip.AddrPort{}, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go ln.Accept(ctx)
	self, err := b.Dial(ctx, netip.AddrPortFrom(dst.Addr(), ln.Addr().Port()))
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()

	good := func() []byte { return tcpPacket(src, dst, 1, header.TCPFlagAck, []byte("x")) }
	with := func(f func(b []byte)) []byte { p := good(); f(p); return p }
	ipsum := func(p []byte) {
		h := header.IPv4(p)
		h.SetChecksum(0)
		h.SetChecksum(^h.CalculateChecksum())
	}
	cases := []struct {
		name  string
		proto tcpip.NetworkProtocolNumber
		pkt   []byte
		typ   tcpip.PacketType
	}{
		{"no connection", ipv4.ProtocolNumber, tcpPacket(src, netip.AddrPortFrom(dst.Addr(), 9), 1, header.TCPFlagAck, nil), tcpip.PacketHost},
		{"from this host's own address", ipv4.ProtocolNumber, tcpPacket(self.LocalAddr(), self.RemoteAddr(), 1, header.TCPFlagAck, nil), tcpip.PacketHost},
		{"broadcast frame", ipv4.ProtocolNumber, good(), tcpip.PacketBroadcast},
		{"fragment", ipv4.ProtocolNumber, with(func(p []byte) { binary.BigEndian.PutUint16(p[6:], 0x2000); ipsum(p) }), tcpip.PacketHost},
		{"later fragment", ipv4.ProtocolNumber, with(func(p []byte) { binary.BigEndian.PutUint16(p[6:], 0x0010); ipsum(p) }), tcpip.PacketHost},
		{"IP options", ipv4.ProtocolNumber, with(func(p []byte) { p[0] = 0x46; ipsum(p) }), tcpip.PacketHost},
		{"IP version 6 in an IPv4 frame", ipv4.ProtocolNumber, with(func(p []byte) { p[0] = 0x65; ipsum(p) }), tcpip.PacketHost},
		{"UDP", ipv4.ProtocolNumber, with(func(p []byte) { p[9] = uint8(header.UDPProtocolNumber); ipsum(p) }), tcpip.PacketHost},
		{"longer than the packet", ipv4.ProtocolNumber, with(func(p []byte) { binary.BigEndian.PutUint16(p[2:], uint16(len(p)+1)); ipsum(p) }), tcpip.PacketHost},
		{"IP length shorter than a TCP header", ipv4.ProtocolNumber, with(func(p []byte) { binary.BigEndian.PutUint16(p[2:], 30); ipsum(p) }), tcpip.PacketHost},
		{"short", ipv4.ProtocolNumber, good()[:22], tcpip.PacketHost},
		{"IPv4 as IPv6", ipv6.ProtocolNumber, good(), tcpip.PacketHost},
	}
	for _, c := range cases {
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(c.pkt)})
		pkt.PktType = c.typ
		if l.ownSegment(c.proto, pkt) {
			t.Errorf("%s: taken past IP", c.name)
		} else if got := pkt.Data().AsRange().ToSlice(); string(got) != string(c.pkt) || pkt.NetworkHeader().View() != nil {
			t.Errorf("%s: refused, but the packet was changed", c.name)
		}
		pkt.DecRef()
	}
	// The segment as it should be: the connection takes it (an
	// unacceptable one, answered with an ACK).
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(good())})
	if !l.ownSegment(ipv4.ProtocolNumber, pkt) {
		t.Error("a segment of the connection was not taken")
	}
	pkt.DecRef()
	bad := with(func(p []byte) { p[len(p)-1] ^= 1 })
	in := b.own.Stats().InErrs
	ck := &tapLink{LinkEndpoint: newChecksummed(l.LinkEndpoint, 0), own: l.own, notPeer: l.notPeer}
	pkt = stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(bad)})
	if !ck.ownSegment(ipv4.ProtocolNumber, pkt) || b.own.Stats().InErrs != in+1 {
		t.Errorf("a segment with a bad TCP checksum: not dropped and counted (InErrs %d, was %d)", b.own.Stats().InErrs, in)
	}
	pkt.DecRef()
	if _, err := c1.Write(ctx, []byte("still")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if err := c2.ReadFull(ctx, buf); err != nil || string(buf) != "still" {
		t.Fatalf("after the crafted segments: %q, %v", buf, err)
	}
}

// FuzzOwnSegment: whatever arrives on the link, the way past IP to
// rdmatap's TCP never panics, and a packet it refuses goes on up
// unchanged. The connection the packets may name goes on working.
func FuzzOwnSegment(f *testing.F) {
	a, b := newTestPair(f, PairConfig{Stack: Config{TCP: TCPRdmatap}})
	c1, c2 := connect(f, a, b)
	src, dst := c1.LocalAddr(), c2.LocalAddr()
	f.Add(tcpPacket(src, dst, 1000, header.TCPFlagAck, []byte("payload")), false, uint16(0))
	f.Add(tcpPacket(src, dst, 1, header.TCPFlagSyn, nil), false, uint16(0))
	f.Add(tcpPacket(src, dst, 1, header.TCPFlagRst, nil), false, uint16(0))
	f.Add(tcpPacket(src, dst, 7, header.TCPFlagAck|header.TCPFlagPsh, make([]byte, 1400)), false, uint16(30))
	f.Add(make([]byte, 64), true, uint16(30))
	f.Fuzz(func(t *testing.T, data []byte, v6 bool, cut uint16) {
		proto, pkt := fuzzPacket(data, v6, cut)
		defer pkt.DecRef()
		if !b.nic.ownSegment(proto, pkt) {
			if got := pkt.Data().AsRange().ToSlice(); string(got) != string(data) {
				t.Fatal("refused, but the packet was changed")
			}
		}
	})
}
