package netstack

import (
	"slices"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/rdmatap/rdmatap/internal/lattrace"
	owntcp "github.com/rdmatap/rdmatap/netstack/tcp"
)

// tapLink is the NIC's link endpoint as the stack sees it: the configured
// link, with the connection taps (EnableConnTaps) looking at each inbound
// packet on its way up. Watching here, at the link we own, rather than
// through a raw transport endpoint costs no copy of the packet (gVisor
// clones every packet for each raw endpoint) and nothing at all while no
// tap is enabled. The packet is only read: its headers are parsed here
// again, as IP and TCP will parse them.
type tapLink struct {
	stack.LinkEndpoint
	d    atomic.Pointer[stack.NetworkDispatcher]
	taps atomic.Pointer[connTaps]
	// acks delays pure ACKs (see ackdelay.go); nil: off.
	acks *ackDelay
	// views gathers a packet's views (one packet at a time: a link
	// delivers from one goroutine; the taps serialize per connection).
	views [][]byte
	// last is the tap the link's previous data segment went to (the
	// same goroutine, as views).
	last tapCache
	// rp repairs lost GSO packets (see repair.go).
	rp *repairer
	// own is rdmatap's TCP, which takes its connections' segments from
	// here (ownSegment); nil on gVisor's.
	own *owntcp.Protocol
	// rawTaps counts the stack's raw segment taps (Stack.TapSegments):
	// they are served by gVisor's IP layer, so while one is installed
	// every packet goes up through it.
	rawTaps atomic.Int32
	// notPeer is the stack's addresses and their IPv4 subnets' broadcast
	// addresses (set once, before the NIC is made): a segment from one
	// of them is a spoof IP would drop.
	notPeer []tcpip.Address
}

func newTapLink(l stack.LinkEndpoint, ackDelay time.Duration, repair bool, own *owntcp.Protocol) *tapLink {
	t := &tapLink{LinkEndpoint: l, own: own}
	t.rp = newRepairer(l.WritePackets)
	t.rp.off = !repair
	if ackDelay > 0 {
		t.acks = newAckDelay(l, ackDelay)
	}
	return t
}

// WritePackets implements stack.LinkEndpoint: outbound packets pass the
// repair of lost GSO packets (which keeps them) and the ACK delaying,
// when it is on.
func (l *tapLink) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	if lattrace.Enabled && pkts.Len() > 0 && pkts.AsSlice()[0].Data().Size() > 0 {
		lattrace.Mark(lattrace.LinkEnter)
	}
	l.rp.outbound(pkts)
	if l.acks != nil {
		return l.acks.writePackets(pkts)
	}
	return l.LinkEndpoint.WritePackets(pkts)
}

// Close implements stack.LinkEndpoint: held ACKs are dropped first.
func (l *tapLink) Close() {
	if l.acks != nil {
		l.acks.close()
	}
	l.LinkEndpoint.Close()
	l.rp.close()
}

// Attach implements stack.LinkEndpoint: the link delivers to tapLink,
// which delivers to the stack.
func (l *tapLink) Attach(d stack.NetworkDispatcher) {
	if d == nil {
		l.d.Store(nil)
		l.LinkEndpoint.Attach(nil)
		return
	}
	l.d.Store(&d)
	l.LinkEndpoint.Attach(l)
}

// IsAttached implements stack.LinkEndpoint.
func (l *tapLink) IsAttached() bool { return l.d.Load() != nil }

// DeliverNetworkPacket implements stack.NetworkDispatcher.
// The taps look first: a short message they place is on its way to its
// receiver before the repair reads the acknowledgment the packet carries.
func (l *tapLink) DeliverNetworkPacket(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	if t := l.taps.Load(); t != nil {
		l.inspect(t, proto, pkt)
	}
	if l.rp.n.Load() > 0 {
		l.views = gatherData(l.views[:0], pkt)
		l.rp.inbound(proto, l.views)
		clear(l.views)
	}
	if l.own != nil && l.ownSegment(proto, pkt) {
		return
	}
	if d := l.d.Load(); d != nil {
		(*d).DeliverNetworkPacket(proto, pkt)
	}
}

// ownSegment hands an inbound TCP segment of one of rdmatap's TCP's
// connections to it on this goroutine, past gVisor's IP layer
// (owntcp.Protocol.DeliverFromLink): the checks IP would make of such
// a packet are made here. It returns false for anything else — another
// protocol, a packet not addressed to this host's link address, IPv4
// options, a fragment, IPv6 extension headers, a header IP would refuse,
// a segment of no connection (a SYN, one to answer with a RST) — which
// then goes up through IP as usual.
func (l *tapLink) ownSegment(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) bool {
	if pkt.PktType != tcpip.PacketHost || l.rawTaps.Load() > 0 {
		return false
	}
	const need = header.IPv6MinimumSize + 4 // the longest IP header taken here, and the ports
	l.views = gatherData(l.views[:0], pkt)
	var hb [need]byte
	hdr := headBytes(hb[:min(need, pkt.Data().Size())], l.views)
	clear(l.views)
	validated := pkt.RXChecksumValidated || l.Capabilities()&stack.CapabilityRXChecksumOffload != 0
	var id stack.TransportEndpointID
	var ipLen, total int
	switch proto {
	case ipv4.ProtocolNumber:
		h := header.IPv4(hdr)
		if len(hdr) < header.IPv4MinimumSize+4 || h.HeaderLength() != header.IPv4MinimumSize || !h.IsValid(pkt.Data().Size()) {
			return false
		}
		if h.Protocol() != uint8(header.TCPProtocolNumber) || h.More() || h.FragmentOffset() != 0 {
			return false
		}
		if !validated && !h.IsChecksumValid() {
			return false
		}
		ipLen, total = header.IPv4MinimumSize, int(h.TotalLength())
		id.LocalAddress, id.RemoteAddress = h.DestinationAddress(), h.SourceAddress()
	case ipv6.ProtocolNumber:
		h := header.IPv6(hdr)
		if len(hdr) < header.IPv6MinimumSize+4 || header.IPVersion(hdr) != header.IPv6Version || h.NextHeader() != uint8(header.TCPProtocolNumber) {
			return false
		}
		ipLen, total = header.IPv6MinimumSize, header.IPv6MinimumSize+int(h.PayloadLength()) // DeliverFromLink checks it against the packet
		id.LocalAddress, id.RemoteAddress = h.DestinationAddress(), h.SourceAddress()
	default:
		return false
	}
	if !l.unicastPeer(id.RemoteAddress) {
		return false
	}
	th := header.TCP(hdr[ipLen:])
	id.RemotePort, id.LocalPort = th.SourcePort(), th.DestinationPort()
	pkt.NICID = nicID
	pkt.RXChecksumValidated = validated
	return l.own.DeliverFromLink(id, proto, pkt, ipLen, total)
}

// unicastPeer reports whether a packet from src passes IP's checks of its
// source: not multicast, broadcast or loopback, and none of this host's
// own addresses.
func (l *tapLink) unicastPeer(src tcpip.Address) bool {
	if src.Len() == header.IPv4AddressSize {
		if src == header.IPv4Broadcast || header.IsV4MulticastAddress(src) || header.IsV4LoopbackAddress(src) {
			return false
		}
	} else if header.IsV6MulticastAddress(src) || src == header.IPv6Loopback {
		return false
	}
	return !slices.Contains(l.notPeer, src)
}

// DeliverLinkPacket implements stack.NetworkDispatcher.
func (l *tapLink) DeliverLinkPacket(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	if d := l.d.Load(); d != nil {
		(*d).DeliverLinkPacket(proto, pkt)
	}
}

// inspect parses an inbound IP packet as far as the taps need it and hands
// a TCP segment to them. What IP would drop (a bad header, a fragment,
// IPv6 extension headers, a short packet) is left alone.
func (l *tapLink) inspect(t *connTaps, proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	l.views = gatherData(l.views[:0], pkt)
	defer clear(l.views)
	var hb [header.IPv4MaximumHeaderSize + 60]byte // the largest IP and TCP headers
	hdr := headBytes(hb[:min(len(hb), headersLen(proto, l.views))], l.views)
	validated := pkt.RXChecksumValidated || l.Capabilities()&stack.CapabilityRXChecksumOffload != 0
	var src, dst tcpip.Address
	var ipLen, total int
	switch proto {
	case ipv4.ProtocolNumber:
		h := header.IPv4(hdr)
		if len(hdr) < header.IPv4MinimumSize || h.HeaderLength() < header.IPv4MinimumSize || len(hdr) < int(h.HeaderLength()) {
			return
		}
		if h.Protocol() != uint8(header.TCPProtocolNumber) || h.More() || h.FragmentOffset() != 0 {
			return
		}
		if !validated && !h.IsChecksumValid() {
			return
		}
		ipLen, total = int(h.HeaderLength()), int(h.TotalLength())
		src, dst = h.SourceAddress(), h.DestinationAddress()
	case ipv6.ProtocolNumber:
		h := header.IPv6(hdr)
		if len(hdr) < header.IPv6MinimumSize || h.TransportProtocol() != header.TCPProtocolNumber {
			return
		}
		ipLen, total = header.IPv6MinimumSize, header.IPv6MinimumSize+int(h.PayloadLength())
		src, dst = h.SourceAddress(), h.DestinationAddress()
	default:
		return
	}
	size := pkt.Data().Size()
	if total > size || total < ipLen+header.TCPMinimumSize {
		return
	}
	th := header.TCP(hdr[ipLen:])
	off := int(th.DataOffset())
	if off < header.TCPMinimumSize || len(th) < off || ipLen+off > total {
		return
	}
	seg := tapSegment{th: th[:off], src: src, dst: dst, validated: validated, size: total - ipLen - off}
	t.segment(&seg, pkt, trimViews(l.views, ipLen+off, total), &l.last)
}

// tapSegment is an inbound TCP segment as the taps see it: its header, its
// addresses. Its packet and its payload (in packet memory, valid during
// the call) travel beside it: kept out of it, the struct and the headers
// it points to stay on inspect's stack.
type tapSegment struct {
	th        header.TCP
	src, dst  tcpip.Address
	size      int
	validated bool // the link verified the checksums
}

// valid checks the header's length and, unless the link verified it, the
// TCP checksum, as TCP itself will.
func (s *tapSegment) valid(views [][]byte) bool {
	// header.TCPValid's checks, without its payload-checksum callback (a
	// method value of the segment would make it escape).
	if off := int(s.th.DataOffset()); off < header.TCPMinimumSize || off > len(s.th) {
		return false
	}
	return s.validated || s.th.IsChecksumValid(s.src, s.dst, payloadChecksum(views), uint16(s.size))
}

func payloadChecksum(views [][]byte) uint16 {
	var c checksum.Checksumer
	for _, b := range views {
		c.Add(b)
	}
	return c.Checksum()
}

// headBytes returns the packet's first bytes (up to len(buf)): the first
// view itself when it holds them, else a copy into buf.
func headBytes(buf []byte, views [][]byte) []byte {
	if len(views) > 0 && len(views[0]) >= len(buf) {
		return views[0][:len(buf)]
	}
	n := 0
	for _, v := range views {
		n += copy(buf[n:], v)
		if n == len(buf) {
			break
		}
	}
	return buf[:n]
}

// headersLen returns how long the IP and TCP headers of the packet in
// views say they are (reading only their length fields), so that the
// payload's bytes are not touched here: the receiver that copies them may
// run on another core. Lengths below the minimum count as the minimum
// (inspect refuses such packets); a packet too short to tell gets its
// whole length (what is there is all inspect can check).
func headersLen(proto tcpip.NetworkProtocolNumber, views [][]byte) int {
	at := func(off int) (byte, bool) {
		for _, v := range views {
			if off < len(v) {
				return v[off], true
			}
			off -= len(v)
		}
		return 0, false
	}
	ip := header.IPv6MinimumSize
	if proto == ipv4.ProtocolNumber {
		b, ok := at(0)
		if !ok {
			return 0
		}
		ip = max(int(b&0xf)*4, header.IPv4MinimumSize)
	}
	b, ok := at(ip + 12) // the TCP data offset
	if !ok {
		return 1 << 16
	}
	return ip + max(int(b>>4)*4, header.TCPMinimumSize)
}

// gatherData appends the slices of the packet's data (what follows the
// headers the link consumed) to views, without copying and without
// cloning its views (PacketData.ReadTo clones each one): the slices are
// the packet's own memory, valid while the caller holds the packet, as
// ReadTo's would be after its clones are released.
func gatherData(views [][]byte, pkt *stack.PacketBuffer) [][]byte {
	// The views hold the reserved room, then the headers (from off), then
	// the data, which runs to the end.
	vl, off := pkt.AsViewList()
	rest := pkt.Data().Size()
	skip := off + pkt.Size() - rest
	for v := vl.Front(); v != nil && rest > 0; v = v.Next() {
		b := v.AsSlice()
		if skip >= len(b) {
			skip -= len(b)
			continue
		}
		b = b[skip:]
		skip = 0
		if len(b) > rest {
			b = b[:rest]
		}
		views = append(views, b)
		rest -= len(b)
	}
	return views
}

// GSOMaxSize implements stack.GSOEndpoint for a link that has it.
func (l *tapLink) GSOMaxSize() uint32 {
	if g, ok := l.LinkEndpoint.(stack.GSOEndpoint); ok {
		return g.GSOMaxSize()
	}
	return 0
}

// SupportedGSO implements stack.GSOEndpoint for a link that has it.
func (l *tapLink) SupportedGSO() stack.SupportedGSO {
	if g, ok := l.LinkEndpoint.(stack.GSOEndpoint); ok {
		return g.SupportedGSO()
	}
	return stack.GSONotSupported
}
