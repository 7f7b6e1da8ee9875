package pcapread

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
)

// LinkTypeEthernet is LINKTYPE_ETHERNET.
const LinkTypeEthernet = 1

// Packet is one captured frame.
type Packet struct {
	Index   int // 1-based frame number, as Wireshark counts
	Data    []byte
	OrigLen int
}

// File is a decoded classic pcap file.
type File struct {
	LinkType uint32
	SnapLen  uint32
	Packets  []Packet
}

// ReadFile reads a classic pcap file from disk.
func ReadFile(name string) (*File, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	return Parse(b)
}

// Read parses a classic pcap file from r.
func Read(r io.Reader) (*File, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	return Parse(b)
}

// Errors.
var (
	ErrMagic     = errors.New("pcapread: not a classic pcap file")
	ErrTruncated = errors.New("pcapread: truncated file")
)

// Parse parses a classic pcap file held in b. Microsecond and nanosecond
// magics in either byte order are accepted.
func Parse(b []byte) (*File, error) {
	if len(b) < 24 {
		return nil, ErrMagic
	}
	var bo binary.ByteOrder
	switch binary.LittleEndian.Uint32(b) {
	case 0xa1b2c3d4, 0xa1b23c4d:
		bo = binary.LittleEndian
	case 0xd4c3b2a1, 0x4d3cb2a1:
		bo = binary.BigEndian
	default:
		return nil, ErrMagic
	}
	f := &File{SnapLen: bo.Uint32(b[16:]), LinkType: bo.Uint32(b[20:]) & 0x0fffffff}
	b = b[24:]
	for len(b) > 0 {
		if len(b) < 16 {
			return nil, ErrTruncated
		}
		incl := bo.Uint32(b[8:])
		orig := bo.Uint32(b[12:])
		if uint64(incl) > uint64(len(b)-16) {
			return nil, ErrTruncated
		}
		data := b[16 : 16+incl : 16+incl]
		f.Packets = append(f.Packets, Packet{Index: len(f.Packets) + 1, Data: data, OrigLen: int(orig)})
		b = b[16+incl:]
	}
	return f, nil
}

// Endpoint is an IP address and TCP port.
type Endpoint struct {
	Addr netip.Addr
	Port uint16
}

func (e Endpoint) String() string { return netip.AddrPortFrom(e.Addr, e.Port).String() }

// Flow is one direction of a TCP connection.
type Flow struct {
	Src, Dst Endpoint
}

func (f Flow) String() string { return f.Src.String() + " -> " + f.Dst.String() }

// Reverse returns the opposite direction.
func (f Flow) Reverse() Flow { return Flow{f.Dst, f.Src} }

// TCP flag bits.
const (
	FIN = 0x01
	SYN = 0x02
	RST = 0x04
	PSH = 0x08
	ACK = 0x10
)

// Segment is a decoded TCP segment.
type Segment struct {
	Frame   int // the Packet's Index
	Flow    Flow
	Seq     uint32
	Ack     uint32
	Flags   uint8
	Payload []byte
}

// ErrNotTCP is returned by DecodeEthernet for frames that are not TCP over IP.
var ErrNotTCP = errors.New("pcapread: not a TCP/IP frame")

// DecodeEthernet decodes an Ethernet II frame (optionally 802.1Q tagged)
// carrying IPv4 or IPv6 and TCP. Ethernet padding is trimmed using the IP
// length.
func DecodeEthernet(frame []byte) (Segment, error) {
	if len(frame) < 14 {
		return Segment{}, fmt.Errorf("%w: short Ethernet header", ErrNotTCP)
	}
	etype := binary.BigEndian.Uint16(frame[12:])
	p := frame[14:]
	for etype == 0x8100 || etype == 0x88a8 {
		if len(p) < 4 {
			return Segment{}, fmt.Errorf("%w: short VLAN tag", ErrNotTCP)
		}
		etype = binary.BigEndian.Uint16(p[2:])
		p = p[4:]
	}
	var s Segment
	var proto uint8
	switch etype {
	case 0x0800:
		if len(p) < 20 || p[0]>>4 != 4 {
			return s, fmt.Errorf("%w: bad IPv4 header", ErrNotTCP)
		}
		ihl := int(p[0]&0x0f) * 4
		tot := int(binary.BigEndian.Uint16(p[2:]))
		if ihl < 20 || tot < ihl || tot > len(p) {
			return s, fmt.Errorf("%w: bad IPv4 lengths", ErrNotTCP)
		}
		if binary.BigEndian.Uint16(p[6:])&0x3fff != 0 {
			return s, fmt.Errorf("%w: IPv4 fragment", ErrNotTCP)
		}
		proto = p[9]
		s.Flow.Src.Addr = netip.AddrFrom4([4]byte(p[12:16]))
		s.Flow.Dst.Addr = netip.AddrFrom4([4]byte(p[16:20]))
		p = p[ihl:tot]
	case 0x86dd:
		if len(p) < 40 || p[0]>>4 != 6 {
			return s, fmt.Errorf("%w: bad IPv6 header", ErrNotTCP)
		}
		pl := int(binary.BigEndian.Uint16(p[4:]))
		if 40+pl > len(p) {
			return s, fmt.Errorf("%w: bad IPv6 length", ErrNotTCP)
		}
		proto = p[6] // extension headers are not supported
		s.Flow.Src.Addr = netip.AddrFrom16([16]byte(p[8:24]))
		s.Flow.Dst.Addr = netip.AddrFrom16([16]byte(p[24:40]))
		p = p[40 : 40+pl]
	default:
		return s, fmt.Errorf("%w: ethertype %#04x", ErrNotTCP, etype)
	}
	if proto != 6 {
		return s, fmt.Errorf("%w: IP protocol %d", ErrNotTCP, proto)
	}
	if len(p) < 20 {
		return s, fmt.Errorf("%w: short TCP header", ErrNotTCP)
	}
	off := int(p[12]>>4) * 4
	if off < 20 || off > len(p) {
		return s, fmt.Errorf("%w: bad TCP data offset", ErrNotTCP)
	}
	s.Flow.Src.Port = binary.BigEndian.Uint16(p[0:])
	s.Flow.Dst.Port = binary.BigEndian.Uint16(p[2:])
	s.Seq = binary.BigEndian.Uint32(p[4:])
	s.Ack = binary.BigEndian.Uint32(p[8:])
	s.Flags = p[13]
	s.Payload = p[off:len(p):len(p)]
	return s, nil
}

// Segments decodes every TCP frame of an Ethernet capture. Frames that are
// not TCP/IP are skipped.
func (f *File) Segments() ([]Segment, error) {
	if f.LinkType != LinkTypeEthernet {
		return nil, fmt.Errorf("pcapread: link type %d, only Ethernet (1) is supported", f.LinkType)
	}
	var segs []Segment
	for _, p := range f.Packets {
		s, err := DecodeEthernet(p.Data)
		if err != nil {
			continue
		}
		s.Frame = p.Index
		segs = append(segs, s)
	}
	return segs, nil
}

// Stream is one reassembled direction of a TCP connection.
type Stream struct {
	Flow       Flow
	ISN        uint32 // the SYN's sequence number, or the first seen minus one
	SawSYN     bool
	SawFIN     bool
	SawRST     bool
	FirstFrame int // the frame that opened this direction
	Data       []byte
	// Segments is the number of payload-carrying segments, retransmissions
	// included; Retransmitted counts those that carried only bytes already seen.
	Segments      int
	Retransmitted int
	frames        []int // per byte: the frame that first delivered it
}

// FrameOf returns the number of the frame that first delivered the byte at
// stream offset off, or 0 if off is outside the stream.
func (s *Stream) FrameOf(off int) int {
	if off < 0 || off >= len(s.frames) {
		return 0
	}
	return s.frames[off]
}

type chunk struct {
	off   int64
	data  []byte
	frame int
}

// Reassemble groups segments by flow and direction and reassembles each
// direction's byte stream in sequence order. Retransmitted and overlapping
// data is accepted once (the first copy in capture order wins; a later
// copy that differs is an error), and a hole in the sequence space is an
// error. A new SYN on a flow
// that already carried a connection starts a new Stream. Streams are
// returned in the order their first segment appears.
func Reassemble(segs []Segment) ([]*Stream, error) {
	type state struct {
		s      *Stream
		chunks []chunk
	}
	var all []*state
	cur := map[Flow]*state{}
	for _, sg := range segs {
		st := cur[sg.Flow]
		if sg.Flags&SYN != 0 && (st == nil || st.s.ISN != sg.Seq) {
			st = nil // a new connection on this 4-tuple
		}
		if st == nil {
			isn := sg.Seq
			syn := sg.Flags&SYN != 0
			if !syn {
				isn-- // no SYN seen: the first byte seen is offset 0
			}
			st = &state{s: &Stream{Flow: sg.Flow, ISN: isn, SawSYN: syn, FirstFrame: sg.Frame}}
			cur[sg.Flow] = st
			all = append(all, st)
		}
		if sg.Flags&RST != 0 {
			st.s.SawRST = true
		}
		if sg.Flags&FIN != 0 {
			st.s.SawFIN = true
		}
		if len(sg.Payload) == 0 {
			continue
		}
		seq := sg.Seq
		if sg.Flags&SYN != 0 {
			seq++
		}
		// Offset of the first payload byte relative to ISN+1; sequence
		// numbers wrap, so compute in uint32 and then widen. Data before
		// ISN+1 (impossible in a sane capture) shows up as a huge offset.
		off := int64(seq - (st.s.ISN + 1))
		if off > 1<<31 {
			return nil, fmt.Errorf("pcapread: %v frame %d: sequence %d before the stream start", sg.Flow, sg.Frame, seq)
		}
		st.s.Segments++
		st.chunks = append(st.chunks, chunk{off, sg.Payload, sg.Frame})
	}
	out := make([]*Stream, 0, len(all))
	for _, st := range all {
		// Lay the chunks down in capture order; the first copy of a byte
		// wins and later copies must agree with it.
		var size int64
		for _, c := range st.chunks {
			size = max(size, c.off+int64(len(c.data)))
		}
		data := make([]byte, size)
		frames := make([]int, size)
		for _, c := range st.chunks {
			fresh := false
			for i, b := range c.data {
				o := c.off + int64(i)
				if frames[o] == 0 {
					data[o], frames[o], fresh = b, c.frame, true
				} else if data[o] != b {
					return nil, fmt.Errorf("pcapread: %v frame %d: retransmitted byte at offset %d differs from frame %d", st.s.Flow, c.frame, o, frames[o])
				}
			}
			if !fresh {
				st.s.Retransmitted++
			}
		}
		for o, fr := range frames {
			if fr == 0 {
				return nil, fmt.Errorf("pcapread: %v: byte at offset %d never captured", st.s.Flow, o)
			}
		}
		st.s.Data, st.s.frames = data, frames
		out = append(out, st.s)
	}
	return out, nil
}
