package tap

import (
	"encoding/binary"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// struct virtio_net_hdr (legacy, native endian; no num_buffers).
const (
	vnetHdrLen = 10

	vnetFlagNeedsCsum = 1 // VIRTIO_NET_HDR_F_NEEDS_CSUM: csum at csum_start+csum_offset is partial
	vnetFlagDataValid = 2 // VIRTIO_NET_HDR_F_DATA_VALID: checksum already verified

	vnetGSONone  = 0
	vnetGSOTCPv4 = 1
	vnetGSOUDP   = 3
	vnetGSOTCPv6 = 4
	vnetGSOECN   = 0x80

	// TUNSETOFFLOAD flags (linux/if_tun.h); not in x/sys.
	tunFCsum = 0x01
	tunFTSO4 = 0x02
	tunFTSO6 = 0x04

	udpChecksumOffset = 6
)

type vnetHdr struct {
	flags      uint8
	gsoType    uint8
	hdrLen     uint16
	gsoSize    uint16
	csumStart  uint16
	csumOffset uint16
}

func (h *vnetHdr) encode(b *[vnetHdrLen]byte) {
	b[0] = h.flags
	b[1] = h.gsoType
	binary.NativeEndian.PutUint16(b[2:], h.hdrLen)
	binary.NativeEndian.PutUint16(b[4:], h.gsoSize)
	binary.NativeEndian.PutUint16(b[6:], h.csumStart)
	binary.NativeEndian.PutUint16(b[8:], h.csumOffset)
}

func (h *vnetHdr) decode(b []byte) {
	h.flags = b[0]
	h.gsoType = b[1]
	h.hdrLen = binary.NativeEndian.Uint16(b[2:])
	h.gsoSize = binary.NativeEndian.Uint16(b[4:])
	h.csumStart = binary.NativeEndian.Uint16(b[6:])
	h.csumOffset = binary.NativeEndian.Uint16(b[8:])
}

// txVnetHdr builds the virtio header for an outgoing packet (Ethernet header
// already pushed). TCP segments from an endpoint with host GSO carry
// GSOOptions with NeedsCsum (pseudo-header sum already in the checksum
// field). Other TCP/UDP packets were built without a transport checksum
// because the link advertises TX checksum offload (e.g. RSTs for unknown
// connections, UDP): for those the pseudo-header sum is filled in here and
// the kernel is asked to complete the checksum.
func txVnetHdr(pkt *stack.PacketBuffer) (h vnetHdr, gso bool) {
	g := &pkt.GSOOptions
	if g.Type != stack.GSONone && g.Type != stack.GSOGvisor {
		h.hdrLen = uint16(pkt.HeaderSize())
		if g.NeedsCsum {
			h.flags = vnetFlagNeedsCsum
			h.csumStart = header.EthernetMinimumSize + g.L3HdrLen
			h.csumOffset = g.CsumOffset
		}
		if pkt.Data().Size() > int(g.MSS) {
			switch g.Type {
			case stack.GSOTCPv4:
				h.gsoType = vnetGSOTCPv4
			case stack.GSOTCPv6:
				h.gsoType = vnetGSOTCPv6
			}
			h.gsoSize = g.MSS
			gso = h.gsoType != vnetGSONone
		}
		return h, gso
	}
	fillPartialCsum(pkt, &h)
	return h, false
}

// fillPartialCsum handles a non-GSO TCP or UDP packet whose transport
// checksum the stack left to the link.
func fillPartialCsum(pkt *stack.PacketBuffer, h *vnetHdr) {
	var off uint16
	switch pkt.TransportProtocolNumber {
	case header.TCPProtocolNumber:
		off = header.TCPChecksumOffset
	case header.UDPProtocolNumber:
		off = udpChecksumOffset
	default:
		return
	}
	nh := pkt.NetworkHeader().Slice()
	th := pkt.TransportHeader().Slice()
	if len(th) < int(off)+2 {
		return
	}
	var src, dst tcpip.Address
	switch pkt.NetworkProtocolNumber {
	case header.IPv4ProtocolNumber:
		ip := header.IPv4(nh)
		if len(nh) < header.IPv4MinimumSize || ip.More() || ip.FragmentOffset() != 0 {
			return // a fragment: the checksum cannot be completed per frame
		}
		src, dst = ip.SourceAddress(), ip.DestinationAddress()
	case header.IPv6ProtocolNumber:
		if len(nh) < header.IPv6MinimumSize {
			return
		}
		ip := header.IPv6(nh)
		if ip.NextHeader() != uint8(pkt.TransportProtocolNumber) {
			return // extension headers (possibly a fragment header)
		}
		src, dst = ip.SourceAddress(), ip.DestinationAddress()
	default:
		return
	}
	l4len := len(th) + pkt.Data().Size()
	if l4len > 0xffff {
		return
	}
	// The pseudo-header sum (not complemented) goes into the checksum field;
	// the kernel adds the sum over csum_start..end and complements it.
	xsum := header.PseudoHeaderChecksum(pkt.TransportProtocolNumber, src, dst, uint16(l4len))
	binary.BigEndian.PutUint16(th[off:], xsum)
	h.flags = vnetFlagNeedsCsum
	h.csumStart = uint16(header.EthernetMinimumSize + len(nh))
	h.csumOffset = off
	h.hdrLen = uint16(pkt.HeaderSize())
}

// rxChecksumOK verifies the TCP/UDP checksum of an Ethernet frame that the
// kernel handed over without NEEDS_CSUM or DATA_VALID. The link advertises RX
// checksum offload (the NIC then skips all transport checksum checks), so
// frames the kernel did not vouch for are checked here. Anything that is not
// an unfragmented IPv4/IPv6 TCP/UDP packet passes (gVisor checks ICMP
// itself; malformed IP is rejected by the stack).
func rxChecksumOK(frame []byte) bool {
	if len(frame) < header.EthernetMinimumSize {
		return true
	}
	eth := header.Ethernet(frame)
	b := frame[header.EthernetMinimumSize:]
	var (
		proto    tcpip.TransportProtocolNumber
		src, dst tcpip.Address
		l4       []byte
	)
	switch eth.Type() {
	case header.IPv4ProtocolNumber:
		ip := header.IPv4(b)
		if len(b) < header.IPv4MinimumSize {
			return true
		}
		hl, tl := int(ip.HeaderLength()), int(ip.TotalLength())
		if hl < header.IPv4MinimumSize || tl < hl || tl > len(b) || ip.More() || ip.FragmentOffset() != 0 {
			return true
		}
		proto, src, dst, l4 = ip.TransportProtocol(), ip.SourceAddress(), ip.DestinationAddress(), b[hl:tl]
	case header.IPv6ProtocolNumber:
		if len(b) < header.IPv6MinimumSize {
			return true
		}
		ip := header.IPv6(b)
		pl := int(ip.PayloadLength())
		if header.IPv6MinimumSize+pl > len(b) {
			return true
		}
		proto, src, dst, l4 = tcpip.TransportProtocolNumber(ip.NextHeader()), ip.SourceAddress(), ip.DestinationAddress(), b[header.IPv6MinimumSize:header.IPv6MinimumSize+pl]
	default:
		return true
	}
	switch proto {
	case header.TCPProtocolNumber:
		if len(l4) < header.TCPMinimumSize {
			return true
		}
	case header.UDPProtocolNumber:
		if len(l4) < header.UDPMinimumSize {
			return true
		}
		if eth.Type() == header.IPv4ProtocolNumber && binary.BigEndian.Uint16(l4[udpChecksumOffset:]) == 0 {
			return true // IPv4 UDP without checksum
		}
	default:
		return true
	}
	xsum := header.PseudoHeaderChecksum(proto, src, dst, uint16(len(l4)))
	return checksum.Checksum(l4, xsum) == 0xffff
}
