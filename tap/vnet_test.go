package tap

import (
	"encoding/binary"
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// buildPkt makes an outgoing Ethernet/IP/{TCP,UDP} packet the way the stack
// does with TX checksum offload: transport checksum left zero.
func buildPkt(t *testing.T, v6 bool, proto tcpip.TransportProtocolNumber, payload []byte) *stack.PacketBuffer {
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{
		ReserveHeaderBytes: 128,
		Payload:            buffer.MakeWithData(payload),
	})
	pkt.TransportProtocolNumber = proto
	var l4len int
	if proto == header.TCPProtocolNumber {
		tcp := header.TCP(pkt.TransportHeader().Push(header.TCPMinimumSize))
		tcp.Encode(&header.TCPFields{SrcPort: 1, DstPort: 2, SeqNum: 3, DataOffset: header.TCPMinimumSize, Flags: header.TCPFlagRst | header.TCPFlagAck, WindowSize: 9})
		l4len = header.TCPMinimumSize + len(payload)
	} else {
		udp := header.UDP(pkt.TransportHeader().Push(header.UDPMinimumSize))
		l4len = header.UDPMinimumSize + len(payload)
		udp.Encode(&header.UDPFields{SrcPort: 1, DstPort: 2, Length: uint16(l4len)})
	}
	if v6 {
		pkt.NetworkProtocolNumber = header.IPv6ProtocolNumber
		ip := header.IPv6(pkt.NetworkHeader().Push(header.IPv6MinimumSize))
		ip.Encode(&header.IPv6Fields{PayloadLength: uint16(l4len), TransportProtocol: proto, HopLimit: 64,
			SrcAddr: tcpip.AddrFrom16([16]byte{0xfd, 0, 0x99, 15: 2}), DstAddr: tcpip.AddrFrom16([16]byte{0xfd, 0, 0x99, 15: 1})})
	} else {
		pkt.NetworkProtocolNumber = header.IPv4ProtocolNumber
		ip := header.IPv4(pkt.NetworkHeader().Push(header.IPv4MinimumSize))
		ip.Encode(&header.IPv4Fields{TotalLength: uint16(header.IPv4MinimumSize + l4len), Protocol: uint8(proto), TTL: 64,
			SrcAddr: tcpip.AddrFrom4([4]byte{10, 99, 0, 2}), DstAddr: tcpip.AddrFrom4([4]byte{10, 99, 0, 1})})
		ip.SetChecksum(^ip.CalculateChecksum())
	}
	eth := header.Ethernet(pkt.LinkHeader().Push(header.EthernetMinimumSize))
	eth.Encode(&header.EthernetFields{Type: pkt.NetworkProtocolNumber})
	return pkt
}

func flatten(pkt *stack.PacketBuffer) []byte {
	var b []byte
	for _, s := range pkt.AsSlices() {
		b = append(b, s...)
	}
	return b
}

// TestPartialChecksum checks that the virtio header and pseudo-header sum
// written for non-GSO TCP/UDP packets let a NEEDS_CSUM consumer (the kernel)
// produce a valid checksum, and that rxChecksumOK agrees.
func TestPartialChecksum(t *testing.T) {
	payload := []byte("hello, partial checksum!!") // odd length
	for _, v6 := range []bool{false, true} {
		for _, proto := range []tcpip.TransportProtocolNumber{header.TCPProtocolNumber, header.UDPProtocolNumber} {
			pkt := buildPkt(t, v6, proto, payload)
			h, gso := txVnetHdr(pkt)
			if gso || h.flags != vnetFlagNeedsCsum {
				t.Fatalf("v6=%v proto=%d: hdr %+v gso %v", v6, proto, h, gso)
			}
			frame := flatten(pkt)
			pkt.DecRef()
			if rxChecksumOK(frame) {
				t.Errorf("v6=%v proto=%d: partial checksum accepted as complete", v6, proto)
			}
			// What the kernel does for CHECKSUM_PARTIAL.
			cs := int(h.csumStart)
			sum := ^checksum.Checksum(frame[cs:], 0)
			binary.BigEndian.PutUint16(frame[cs+int(h.csumOffset):], sum)
			if !rxChecksumOK(frame) {
				t.Errorf("v6=%v proto=%d: completed checksum invalid", v6, proto)
			}
			frame[len(frame)-1] ^= 0x40
			if rxChecksumOK(frame) {
				t.Errorf("v6=%v proto=%d: corrupted frame accepted", v6, proto)
			}
			if hl := headersLen(frame); proto == header.TCPProtocolNumber && hl != len(frame)-len(payload) {
				t.Errorf("headersLen = %d, want %d", hl, len(frame)-len(payload))
			}
		}
	}
}

func TestVnetHdrRoundTrip(t *testing.T) {
	in := vnetHdr{flags: 1, gsoType: vnetGSOTCPv6, hdrLen: 86, gsoSize: 1428, csumStart: 54, csumOffset: 16}
	var b [vnetHdrLen]byte
	in.encode(&b)
	var out vnetHdr
	out.decode(b[:])
	if in != out {
		t.Fatalf("%+v != %+v", in, out)
	}
}
