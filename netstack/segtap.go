package netstack

import (
	"net/netip"
	"sync"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// Segment is a received TCP segment as seen by a segment tap.
type Segment struct {
	Src, Dst netip.AddrPort
	Seq      uint32
	Flags    uint8    // header.TCPFlags bits (FIN 0x01, SYN 0x02, RST 0x04, PSH 0x08, ACK 0x10, URG 0x20)
	Payload  [][]byte /* views into packet memory, valid only during the callback */

	Ack    uint32 // acknowledgment number (valid when Flags has ACK)
	Window uint16 // raw (unscaled) window field
}

// Len returns the payload length.
func (s *Segment) Len() int {
	n := 0
	for _, p := range s.Payload {
		n += len(p)
	}
	return n
}

// segTap is the raw transport endpoint behind TapSegments.
type segTap struct {
	fn   func(*Segment)
	pool sync.Pool
}

// payloadCollector gathers the payload views of a packet without copying.
type payloadCollector struct{ seg *Segment }

func (p payloadCollector) Write(b []byte) (int, error) {
	if len(b) > 0 {
		p.seg.Payload = append(p.seg.Payload, b)
	}
	return len(b), nil
}

// HandlePacket implements stack.RawTransportEndpoint.
func (t *segTap) HandlePacket(pkt *stack.PacketBuffer) {
	th, srcA, dstA, ok := tcpHeaders(pkt)
	if !ok {
		return // not parsed (e.g. a fragment): nothing reliable to report
	}
	src, dst := fromTCPIPAddr(srcA), fromTCPIPAddr(dstA)
	seg, _ := t.pool.Get().(*Segment)
	if seg == nil {
		seg = new(Segment)
	}
	payload := seg.Payload[:0]
	*seg = Segment{
		Src:     netip.AddrPortFrom(src, th.SourcePort()),
		Dst:     netip.AddrPortFrom(dst, th.DestinationPort()),
		Seq:     th.SequenceNumber(),
		Ack:     th.AckNumber(),
		Flags:   uint8(th.Flags()),
		Window:  th.WindowSize(),
		Payload: payload,
	}
	// Peek: the views stay in the packet; nothing is copied.
	pkt.Data().ReadTo(payloadCollector{seg: seg}, true)
	t.fn(seg)
	for i := range seg.Payload {
		seg.Payload[i] = nil
	}
	seg.Payload = seg.Payload[:0]
	t.pool.Put(seg)
}

// tcpHeaders returns a received packet's parsed TCP header and its IP
// source and destination; ok is false when they were not parsed.
func tcpHeaders(pkt *stack.PacketBuffer) (th header.TCP, src, dst tcpip.Address, ok bool) {
	th = header.TCP(pkt.TransportHeader().Slice())
	if len(th) < header.TCPMinimumSize {
		return nil, src, dst, false
	}
	nh := pkt.NetworkHeader().Slice()
	switch pkt.NetworkProtocolNumber {
	case header.IPv4ProtocolNumber:
		if len(nh) < header.IPv4MinimumSize {
			return nil, src, dst, false
		}
		h := header.IPv4(nh)
		return th, h.SourceAddress(), h.DestinationAddress(), true
	case header.IPv6ProtocolNumber:
		if len(nh) < header.IPv6MinimumSize {
			return nil, src, dst, false
		}
		h := header.IPv6(nh)
		return th, h.SourceAddress(), h.DestinationAddress(), true
	}
	return nil, src, dst, false
}

// TapSegments calls fn for every TCP segment the stack receives over IPv4
// and IPv6 (all connections, including out-of-order, duplicate and
// retransmitted segments and segments TCP will later reject), synchronously
// on the link's delivery goroutine and before TCP processes it. The TCP
// checksum has not been verified (links with RX checksum offload never
// verify it) and the segment is not checked against any connection's window.
// fn must be fast, must not block on the stack, and must not retain the
// Segment or its Payload slices (they point into packet memory and are
// recycled after fn returns). fn cannot alter or suppress delivery.
//
// The returned function removes the tap; it is idempotent. A nil fn
// installs nothing.
func (s *Stack) TapSegments(fn func(*Segment)) (remove func()) {
	if fn == nil {
		return func() {}
	}
	t := &segTap{fn: fn}
	var regs []tcpip.NetworkProtocolNumber
	for _, proto := range []tcpip.NetworkProtocolNumber{ipv4.ProtocolNumber, ipv6.ProtocolNumber} {
		// Registration only fails for protocols the stack lacks; New
		// always registers IPv4, IPv6 and TCP.
		if err := s.s.RegisterRawTransportEndpoint(proto, tcp.ProtocolNumber, t); err == nil {
			regs = append(regs, proto)
		}
	}
	s.nic.rawTaps.Add(1) // rdmatap's TCP's segments then go up through IP
	var once sync.Once
	return func() {
		once.Do(func() {
			s.nic.rawTaps.Add(-1)
			for _, proto := range regs {
				s.s.UnregisterRawTransportEndpoint(proto, tcp.ProtocolNumber, t)
			}
		})
	}
}
