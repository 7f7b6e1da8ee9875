package netstack

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// tcpPacket builds an IPv4 packet carrying a TCP segment from src to dst
// with good checksums.
func tcpPacket(src, dst netip.AddrPort, seq uint32, flags header.TCPFlags, payload []byte) []byte {
	b := make([]byte, header.IPv4MinimumSize+header.TCPMinimumSize+len(payload))
	ip := header.IPv4(b)
	ip.Encode(&header.IPv4Fields{TotalLength: uint16(len(b)), TTL: 64, Protocol: uint8(header.TCPProtocolNumber),
		SrcAddr: toTCPIPAddr(src.Addr()), DstAddr: toTCPIPAddr(dst.Addr())})
	ip.SetChecksum(^ip.CalculateChecksum())
	th := header.TCP(b[header.IPv4MinimumSize:])
	th.Encode(&header.TCPFields{SrcPort: src.Port(), DstPort: dst.Port(), SeqNum: seq, AckNum: 1,
		DataOffset: header.TCPMinimumSize, Flags: flags, WindowSize: 65535})
	copy(b[header.IPv4MinimumSize+header.TCPMinimumSize:], payload)
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, toTCPIPAddr(src.Addr()), toTCPIPAddr(dst.Addr()), uint16(len(th)))
	xsum = checksum.Checksum(payload, xsum)
	th.SetChecksum(^th.CalculateChecksum(xsum))
	return b
}

// fuzzPacket is a fuzzer's packet as a link delivers it: IPv4's or, with
// v6, IPv6's, in two views cut at cut when it falls inside data.
func fuzzPacket(data []byte, v6 bool, cut uint16) (tcpip.NetworkProtocolNumber, *stack.PacketBuffer) {
	proto := tcpip.NetworkProtocolNumber(ipv4.ProtocolNumber)
	if v6 {
		proto = ipv6.ProtocolNumber
	}
	payload := buffer.MakeWithData(data)
	if c := int(cut); c > 0 && c < len(data) {
		payload = buffer.MakeWithData(data[:c])
		payload.Append(buffer.NewViewWithData(data[c:]))
	}
	return proto, stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: payload})
}

// FuzzTapLinkInspect: whatever arrives on the link, the taps' parser never
// panics, never hands over more than the packet holds, and hands over
// only segments of the tapped connection. The packet comes in two views
// cut at cut (when it falls inside), as the TAP's read loop builds them,
// and gatherData's pieces are PacketData.ReadTo's.
func FuzzTapLinkInspect(f *testing.F) {
	gvisorOnly(f)
	a, b := newTestPair(f, PairConfig{})
	b.EnableConnTaps()
	c1, c2 := connect(f, a, b)
	var handed int
	var tooMuch bool
	remove, err := c2.TapSegments(func(off uint64, v [][]byte) {
		n := 0
		for _, p := range v {
			n += len(p)
		}
		if n > 1<<16 {
			tooMuch = true
		}
		handed++
	}, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(remove)
	// A link of its own without checksum offload, so that checksums are
	// checked; the taps are the stack's.
	la, _ := NewLinkPair(LinkConfig{})
	l := newTapLink(newChecksummed(la, 0), 0, true, nil)
	l.taps.Store(b.ctaps)

	src, dst := c1.LocalAddr(), c2.LocalAddr()
	f.Add(tcpPacket(src, dst, 1000, header.TCPFlagAck, []byte("payload")), false, uint16(0))
	f.Add(tcpPacket(src, dst, 1, header.TCPFlagSyn, nil), false, uint16(0))
	f.Add(tcpPacket(src, dst, 7, header.TCPFlagAck|header.TCPFlagPsh, make([]byte, 1400)), false, uint16(40))
	f.Add(tcpPacket(src, dst, 7, header.TCPFlagAck|header.TCPFlagPsh, make([]byte, 1400)), false, uint16(10))
	bad := tcpPacket(src, dst, 9, header.TCPFlagAck, []byte("x"))
	bad[len(bad)-1] ^= 1
	f.Add(bad, false, uint16(0))
	frag := tcpPacket(src, dst, 9, header.TCPFlagAck, []byte("frag"))
	binary.BigEndian.PutUint16(frag[6:], 0x2000) // more fragments
	f.Add(frag, false, uint16(0))
	f.Add(make([]byte, 60), true, uint16(30))
	f.Fuzz(func(t *testing.T, data []byte, v6 bool, cut uint16) {
		proto, pkt := fuzzPacket(data, v6, cut)
		var whole []byte
		for _, v := range gatherData(nil, pkt) {
			whole = append(whole, v...)
		}
		if string(whole) != string(data) {
			t.Fatalf("gatherData: %d bytes, not the packet's %d", len(whole), len(data))
		}
		l.inspect(b.ctaps, proto, pkt)
		pkt.DecRef()
		if tooMuch {
			t.Fatal("handed over more than a packet holds")
		}
	})
}
