package tcp

import (
	"errors"
	"fmt"

	"gvisor.dev/gvisor/pkg/buffer"

	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/seqnum"
)

// Segment is one TCP segment as the connection engine sees it: the header
// fields a connection uses, its options decoded, and its payload. Ports,
// addresses and the checksum belong to whoever carries the segment (the
// stack's endpoint): a Segment is already demultiplexed and verified.
type Segment struct {
	Seq    seqnum.Value
	Ack    seqnum.Value
	Flags  header.TCPFlags
	Window uint16 // as on the wire: not yet scaled

	// Options. MSS, WS and SACKPermitted mean something on a SYN only;
	// WS is -1 when the segment carries no window scale option.
	MSS           uint16
	WS            int
	SACKPermitted bool
	TS            bool
	TSVal         uint32
	TSEcr         uint32
	SACK          []header.SACKBlock

	// SegSize, when the payload is longer, is the payload of each segment
	// the link cuts it into (GSO: one header for many segments, which
	// the NIC or the kernel's TAP driver splits). 0: one segment.
	SegSize int

	// Payload is the segment's payload. It is nil when the payload lies
	// in several pieces of memory that the segment's consumer reads
	// instead: a segment Protocol received whose payload spans the
	// packet's views (Pieces), and a Conn's output whose payload spans
	// two blocks of the send buffer, when the output is Protocol's (src).
	Payload []byte

	// src, on a Conn's output, is where the payload lies in the send
	// buffer: srcLen bytes from srcOff on, which Protocol puts in the
	// packet by reference (sendQueue.appendTo).
	src            *sendQueue
	srcOff, srcLen int

	// pieces, on a segment Protocol received whose payload lies in
	// several of the packet's views, are those views' bytes (Pieces).
	pieces    [][]byte
	piecesLen int
	// views are the packet's views the payload lies in, one for each
	// piece (Payload's, when pieces is nil), borrowed during the call:
	// the receive buffer keeps large pieces by reference (keepTo).
	views []*buffer.View
}

// keepTo appends n bytes of the payload from off on to q: from the
// packet's views when the segment came in them, by reference where q's
// rule allows, and otherwise by copy.
func (s *Segment) keepTo(q *recvQueue, off, n int) {
	if len(s.views) == 0 {
		q.write(s.payloadBytes()[off : off+n])
		return
	}
	one := [1][]byte{s.Payload}
	pieces := s.pieces
	if pieces == nil {
		pieces = one[:]
	}
	for i, p := range pieces {
		if n == 0 {
			break
		}
		if off >= len(p) {
			off -= len(p)
			continue
		}
		k := min(len(p)-off, n)
		q.take(s.views[i], p[off:off+k])
		n -= k
		off = 0
	}
}

// Pieces is the payload as the pieces of the packet's memory it lies
// in, when it lies in several (a segment Protocol received; Payload is
// then nil), valid during the call only. nil when Payload holds it.
func (s *Segment) Pieces() [][]byte { return s.pieces }

// PayloadLen is the payload's length, wherever it lies.
func (s *Segment) PayloadLen() int {
	switch {
	case s.src != nil:
		return s.srcLen
	case s.pieces != nil:
		return s.piecesLen
	}
	return len(s.Payload)
}

// payloadBytes is the payload in one slice: Payload, or the pieces
// joined in new memory.
func (s *Segment) payloadBytes() []byte {
	if s.pieces == nil {
		return s.Payload
	}
	b := make([]byte, 0, s.piecesLen)
	for _, p := range s.pieces {
		b = append(b, p...)
	}
	return b
}

// Len is the sequence space the segment occupies: its payload, plus one
// for a SYN and one for a FIN.
func (s *Segment) Len() seqnum.Size {
	n := seqnum.Size(s.PayloadLen())
	if s.Flags&header.TCPFlagSyn != 0 {
		n++
	}
	if s.Flags&header.TCPFlagFin != 0 {
		n++
	}
	return n
}

func (s *Segment) has(f header.TCPFlags) bool { return s.Flags&f != 0 }

// String is the segment in tcpdump's terms, for test failures and traces.
func (s *Segment) String() string {
	return fmt.Sprintf("%v seq %d ack %d win %d len %d", s.Flags, s.Seq, s.Ack, s.Window, s.PayloadLen())
}

// ErrMalformed is the error Parse returns for bytes that are not a TCP
// segment: too short for its header, or a data offset outside the bytes.
var ErrMalformed = errors.New("tcp: malformed segment")

// maxSACKBlocks is the most SACK blocks a segment carries: four fit in
// the 40 bytes of options, three beside a timestamp.
const maxSACKBlocks = 4

// Parse decodes a TCP header and its payload (the bytes after the IP
// header; the checksum is the caller's to have checked). The segment's
// Payload and SACK alias b's memory and sack's (which Parse reuses for
// the SACK blocks, up to its capacity or maxSACKBlocks).
func Parse(b []byte, sack []header.SACKBlock) (Segment, error) {
	if len(b) < header.TCPMinimumSize {
		return Segment{}, ErrMalformed
	}
	h := header.TCP(b)
	off := int(h.DataOffset())
	if off < header.TCPMinimumSize || off > len(b) {
		return Segment{}, ErrMalformed
	}
	s := Segment{
		Seq:     seqnum.Value(h.SequenceNumber()),
		Ack:     seqnum.Value(h.AckNumber()),
		Flags:   h.Flags(),
		Window:  h.WindowSize(),
		WS:      -1,
		Payload: b[off:],
	}
	opts := b[header.TCPMinimumSize:off]
	if s.has(header.TCPFlagSyn) {
		o := header.ParseSynOptions(opts, s.has(header.TCPFlagAck))
		s.MSS, s.WS, s.SACKPermitted = o.MSS, o.WS, o.SACKPermitted
		s.TS, s.TSVal, s.TSEcr = o.TS, o.TSVal, o.TSEcr
		if !hasMSSOption(opts) {
			s.MSS = 0
		}
		return s, nil
	}
	o := header.ParseTCPOptions(opts)
	s.TS, s.TSVal, s.TSEcr = o.TS, o.TSVal, o.TSEcr
	if n := len(o.SACKBlocks); n > 0 {
		s.SACK = append(sack[:0], o.SACKBlocks[:min(n, maxSACKBlocks)]...)
	}
	return s, nil
}

// hasMSSOption reports whether a SYN's options hold an MSS option
// (ParseSynOptions answers the RFC 9293 default when there is none).
func hasMSSOption(opts []byte) bool {
	for i := 0; i < len(opts); {
		switch opts[i] {
		case header.TCPOptionEOL:
			return false
		case header.TCPOptionNOP:
			i++
			continue
		}
		if i+1 >= len(opts) || opts[i+1] < 2 {
			return false
		}
		if opts[i] == header.TCPOptionMSS {
			return opts[i+1] == header.TCPOptionMSSLength && i+int(header.TCPOptionMSSLength) <= len(opts)
		}
		i += int(opts[i+1])
	}
	return false
}

// HeaderLen is the length of s's TCP header with its options.
func (s *Segment) HeaderLen() int {
	n := 0
	if s.has(header.TCPFlagSyn) {
		if s.MSS != 0 {
			n += header.TCPOptionMSSLength
		}
		if s.WS >= 0 {
			n += 1 + header.TCPOptionWSLength // NOP, WS
		}
		if s.SACKPermitted {
			n += 2 + header.TCPOptionSackPermittedLength // NOP, NOP, SACK-permitted
		}
	}
	if s.TS {
		n += 2 + header.TCPOptionTSLength // NOP, NOP, TS
	}
	if k := len(s.SACK); k > 0 && !s.has(header.TCPFlagSyn) {
		n += 2 + 2 + 8*k // NOP, NOP, kind, length, blocks
	}
	return header.TCPMinimumSize + (n+3)&^3
}

// Encode writes s's TCP header with its options into b (HeaderLen bytes
// at least), ports included, and returns the header's length. The
// checksum is left zero for the carrier to fill; the payload is not
// copied.
func (s *Segment) Encode(b []byte, srcPort, dstPort uint16) int {
	hl := s.HeaderLen()
	opts := b[header.TCPMinimumSize:hl]
	clear(opts)
	i := 0
	if s.has(header.TCPFlagSyn) {
		if s.MSS != 0 {
			i += header.EncodeMSSOption(uint32(s.MSS), opts[i:])
		}
		if s.WS >= 0 {
			i += header.EncodeNOP(opts[i:])
			i += header.EncodeWSOption(s.WS, opts[i:])
		}
		if s.SACKPermitted {
			i += header.EncodeNOP(opts[i:])
			i += header.EncodeNOP(opts[i:])
			i += header.EncodeSACKPermittedOption(opts[i:])
		}
	}
	if s.TS {
		i += header.EncodeNOP(opts[i:])
		i += header.EncodeNOP(opts[i:])
		i += header.EncodeTSOption(s.TSVal, s.TSEcr, opts[i:])
	}
	if len(s.SACK) > 0 && !s.has(header.TCPFlagSyn) {
		i += header.EncodeNOP(opts[i:])
		i += header.EncodeNOP(opts[i:])
		opts[i] = header.TCPOptionSACK
		opts[i+1] = byte(2 + 8*len(s.SACK))
		i += 2
		for _, blk := range s.SACK {
			putU32(opts[i:], uint32(blk.Start))
			putU32(opts[i+4:], uint32(blk.End))
			i += 8
		}
	}
	for ; i < len(opts); i++ {
		opts[i] = header.TCPOptionNOP
	}
	header.TCP(b).Encode(&header.TCPFields{
		SrcPort:    srcPort,
		DstPort:    dstPort,
		SeqNum:     uint32(s.Seq),
		AckNum:     uint32(s.Ack),
		DataOffset: uint8(hl),
		Flags:      s.Flags,
		WindowSize: s.Window,
	})
	return hl
}

func putU32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
}
