package netstack

import (
	"encoding/binary"
	"errors"
	"io"
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/nested"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// pcap link types.
const (
	LinkTypeEthernet = 1   // LINKTYPE_ETHERNET
	LinkTypeRaw      = 101 // LINKTYPE_RAW: the packet starts with an IPv4 or IPv6 header

	// CaptureSnapLen is the snapshot length of captures.
	CaptureSnapLen = 262144

	pcapMagicMicro = 0xa1b2c3d4
	pcapRecHdrLen  = 16
)

// Capture is a link endpoint wrapper that writes every frame it sends and
// receives to a classic pcap stream.
type Capture struct {
	nested.Endpoint

	linkType uint32
	linkHdr  int // bytes before the IP header in a captured frame

	mu  sync.Mutex
	w   io.Writer // nil once disabled
	err error
	buf []byte
}

var (
	_ stack.LinkEndpoint      = (*Capture)(nil)
	_ stack.GSOEndpoint       = (*Capture)(nil)
	_ stack.NetworkDispatcher = (*Capture)(nil)
)

// NewCapture wraps ep and captures its traffic to w (pcap, microsecond
// timestamps, snaplen 262144). The link type is LINKTYPE_ETHERNET when ep
// reports an Ethernet ARP hardware type, LINKTYPE_RAW otherwise. The pcap
// global header is written immediately. Writes are serialised; the first
// write error disables the capture and is reported by Err (traffic itself
// is never affected).
//
// GSO super-segments are captured as one large IP packet; the IPv4 total
// length / IPv6 payload length (and the IPv4 header checksum) of the
// captured copy are fixed up to match the bytes captured when they disagree,
// so decoders see consistent packets. TCP checksums of packets sent with
// checksum offload are partial and show as incorrect in Wireshark.
func NewCapture(ep stack.LinkEndpoint, w io.Writer) *Capture {
	lt := uint32(LinkTypeRaw)
	if ep.ARPHardwareType() == header.ARPHardwareEther {
		lt = LinkTypeEthernet
	}
	return NewCaptureLinkType(ep, w, lt)
}

// NewCaptureLinkType is NewCapture with an explicit link type
// (LinkTypeRaw or LinkTypeEthernet; other values are written as given but
// no IP length fix-up is done).
func NewCaptureLinkType(ep stack.LinkEndpoint, w io.Writer, linkType uint32) *Capture {
	c := &Capture{linkType: linkType, w: w, linkHdr: -1}
	switch linkType {
	case LinkTypeRaw:
		c.linkHdr = 0
	case LinkTypeEthernet:
		c.linkHdr = header.EthernetMinimumSize
	}
	c.Endpoint.Init(ep, c)
	if w == nil {
		c.w = nil
		c.err = errors.New("netstack: capture writer is nil")
		return c
	}
	var gh [24]byte
	binary.LittleEndian.PutUint32(gh[0:], pcapMagicMicro)
	binary.LittleEndian.PutUint16(gh[4:], 2)
	binary.LittleEndian.PutUint16(gh[6:], 4)
	// thiszone and sigfigs are 0 (UTC timestamps).
	binary.LittleEndian.PutUint32(gh[16:], CaptureSnapLen)
	binary.LittleEndian.PutUint32(gh[20:], linkType)
	if _, err := w.Write(gh[:]); err != nil {
		c.w = nil
		c.err = err
	}
	return c
}

// Err returns the write error that disabled the capture, if any.
func (c *Capture) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// LinkType returns the pcap link type written in the header.
func (c *Capture) LinkType() uint32 { return c.linkType }

// DeliverNetworkPacket implements stack.NetworkDispatcher: it captures an
// inbound frame and passes it up.
func (c *Capture) DeliverNetworkPacket(protocol tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	c.dump(pkt)
	c.Endpoint.DeliverNetworkPacket(protocol, pkt)
}

// WritePackets implements stack.LinkWriter: it captures outbound frames and
// passes them down.
func (c *Capture) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	for _, pkt := range pkts.AsSlice() {
		c.dump(pkt)
	}
	return c.Endpoint.WritePackets(pkts)
}

func (c *Capture) dump(pkt *stack.PacketBuffer) {
	ts := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.w == nil {
		return
	}
	skip := len(pkt.VirtioNetHeader().Slice())
	orig := pkt.Size() - skip
	if orig < 0 {
		orig = 0
	}
	capLen := min(orig, CaptureSnapLen)
	need := pcapRecHdrLen + capLen
	if cap(c.buf) < need {
		c.buf = make([]byte, need)
	}
	b := c.buf[:need]
	binary.LittleEndian.PutUint32(b[0:], uint32(ts.Unix()))
	binary.LittleEndian.PutUint32(b[4:], uint32(ts.Nanosecond()/1000))
	binary.LittleEndian.PutUint32(b[8:], uint32(capLen))
	binary.LittleEndian.PutUint32(b[12:], uint32(orig))
	data := b[pcapRecHdrLen:]
	off, pos := 0, 0
	for _, v := range pkt.AsSlices() {
		if pos >= capLen {
			break
		}
		if off+len(v) <= skip {
			off += len(v)
			continue
		}
		if off < skip {
			v = v[skip-off:]
			off = skip
		}
		pos += copy(data[pos:capLen], v)
		off += len(v)
	}
	if c.linkHdr >= 0 {
		fixIPLength(data[:capLen], c.linkHdr, orig)
	}
	if _, err := c.w.Write(b); err != nil {
		c.err = err
		c.w = nil
	}
}

// fixIPLength makes the IP length field of the captured frame consistent
// with the frame's original length: a larger field (or, on raw links, any
// mismatch: GSO super-segments) is set to the real length when it fits.
func fixIPLength(frame []byte, linkHdr, origLen int) {
	if len(frame) < linkHdr+1 {
		return
	}
	if linkHdr == header.EthernetMinimumSize {
		switch binary.BigEndian.Uint16(frame[12:14]) {
		case uint16(header.IPv4ProtocolNumber), uint16(header.IPv6ProtocolNumber):
		default:
			return
		}
	}
	ip := frame[linkHdr:]
	ipLen := origLen - linkHdr
	switch ip[0] >> 4 {
	case 4:
		if len(ip) < header.IPv4MinimumSize || ipLen > 0xffff {
			return
		}
		h := header.IPv4(ip)
		ihl := int(h.HeaderLength())
		if ihl < header.IPv4MinimumSize || len(ip) < ihl {
			return
		}
		tl := int(h.TotalLength())
		if tl == ipLen || (linkHdr != 0 && tl < ipLen) {
			return
		}
		h.SetTotalLength(uint16(ipLen))
		h.SetChecksum(0)
		h.SetChecksum(^h.CalculateChecksum())
	case 6:
		if len(ip) < header.IPv6MinimumSize {
			return
		}
		pl := ipLen - header.IPv6MinimumSize
		if pl < 0 || pl > 0xffff {
			return
		}
		h := header.IPv6(ip)
		cur := int(h.PayloadLength())
		if cur == pl || (linkHdr != 0 && cur < pl) {
			return
		}
		h.SetPayloadLength(uint16(pl))
	}
}

// CaptureOf returns the Capture wrapping s's link (as set up by NewPair with
// PcapA or New with a *Capture link), or nil.
func CaptureOf(s *Stack) *Capture {
	c, _ := s.link.(*Capture)
	return c
}
