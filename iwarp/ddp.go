package iwarp

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// DDP segment headers (RFC 5041 §4), with the RDMAP control byte (RFC 5040
// §4.2) in DDP's first ULP-reserved byte.
//
// Tagged buffer model (14 bytes):
//
//	|T|L| Rsvd  |DV | RV|R| Opcode|            STag ...           |
//	|     ... STag                |   TO (64 bits) ...            |
//
// Untagged buffer model (18 bytes):
//
//	|T|L| Rsvd  |DV | RV|R| Opcode|   RsvdULP / Invalidate STag   |
//	|             QN              |             MSN               |
//	|             MO              |
const (
	ddpControl = 0
	rdmapCtrl  = 1
	ddpSTag    = 2
	ddpTO      = 6
	ddpRsvdULP = 2
	ddpQN      = 6
	ddpMSN     = 10
	ddpMO      = 14

	// DDPTaggedHeaderSize is the size of a tagged DDP header.
	DDPTaggedHeaderSize = 14
	// DDPUntaggedHeaderSize is the size of an untagged DDP header.
	DDPUntaggedHeaderSize = 18
	// DDPVersion is the DDP version of RFC 5041.
	DDPVersion = 1
	// RDMAPVersion is the RDMAP version of RFC 5040.
	RDMAPVersion = 1

	ddpFlagTagged = 0x80
	ddpFlagLast   = 0x40
	ddpRsvdMask   = 0x3c
	ddpDVMask     = 0x03
	rdmapRVMask   = 0xc0
	rdmapRsvdMask = 0x30
	rdmapOpMask   = 0x0f
)

// Untagged queue numbers RDMAP uses (RFC 5040 §5.1).
const (
	QNSend      = 0 // Send and its variants
	QNReadReq   = 1 // RDMA Read Request
	QNTerminate = 2 // Terminate
	// QNAtomicResp (3, RFC 7306) is in extensions.go.
	numQN = 4
)

// Opcode is the RDMAP opcode (RFC 5040 §4.2, RFC 7306 §8).
type Opcode uint8

// RDMAP opcodes.
const (
	OpWrite          Opcode = 0x0
	OpReadRequest    Opcode = 0x1
	OpReadResponse   Opcode = 0x2
	OpSend           Opcode = 0x3
	OpSendInvalidate Opcode = 0x4
	OpSendSE         Opcode = 0x5
	OpSendSEInval    Opcode = 0x6
	OpTerminate      Opcode = 0x7
	// RFC 7306 extensions (extensions.go).
	OpImmediate     Opcode = 0x8
	OpImmediateSE   Opcode = 0x9
	OpAtomicRequest Opcode = 0xa
	OpAtomicResp    Opcode = 0xb
)

var opcodeNames = [...]string{
	"RDMA Write", "RDMA Read Request", "RDMA Read Response", "Send",
	"Send with Invalidate", "Send with SE", "Send with SE and Invalidate",
	"Terminate", "Immediate Data", "Immediate Data with SE",
	"Atomic Request", "Atomic Response",
}

func (o Opcode) String() string {
	if int(o) < len(opcodeNames) {
		return opcodeNames[o]
	}
	return fmt.Sprintf("opcode %#x", uint8(o))
}

// Tagged reports whether the opcode travels in the tagged buffer model.
func (o Opcode) Tagged() bool { return o == OpWrite || o == OpReadResponse }

// IsSend reports whether o is one of the four Send opcodes.
func (o Opcode) IsSend() bool { return o >= OpSend && o <= OpSendSEInval }

// Invalidates reports whether o is a Send with Invalidate.
func (o Opcode) Invalidates() bool { return o == OpSendInvalidate || o == OpSendSEInval }

// Solicited reports whether o carries a solicited event.
func (o Opcode) Solicited() bool { return o == OpSendSE || o == OpSendSEInval }

// DDPHeader is a view of a DDP segment, starting at the DDP control byte
// (the start of the MPA ULPDU).
type DDPHeader []byte

// Tagged returns the T bit.
func (h DDPHeader) Tagged() bool { return h[ddpControl]&ddpFlagTagged != 0 }

// Last returns the L bit: this segment ends its DDP message.
func (h DDPHeader) Last() bool { return h[ddpControl]&ddpFlagLast != 0 }

// DDPVersion returns the DV field.
func (h DDPHeader) DDPVersion() uint8 { return h[ddpControl] & ddpDVMask }

// DDPReserved returns the reserved bits of the DDP control byte.
func (h DDPHeader) DDPReserved() uint8 { return (h[ddpControl] & ddpRsvdMask) >> 2 }

// RDMAPVersion returns RDMAP's RV field.
func (h DDPHeader) RDMAPVersion() uint8 { return h[rdmapCtrl] >> 6 }

// Opcode returns the RDMAP opcode.
func (h DDPHeader) Opcode() Opcode { return Opcode(h[rdmapCtrl] & rdmapOpMask) }

// HeaderSize returns 14 for tagged and 18 for untagged segments.
func (h DDPHeader) HeaderSize() int {
	if h.Tagged() {
		return DDPTaggedHeaderSize
	}
	return DDPUntaggedHeaderSize
}

// STag returns the Steering Tag of a tagged segment.
func (h DDPHeader) STag() uint32 { return binary.BigEndian.Uint32(h[ddpSTag:]) }

// TO returns the Tagged Offset of a tagged segment.
func (h DDPHeader) TO() uint64 { return binary.BigEndian.Uint64(h[ddpTO:]) }

// InvalidateSTag returns the RsvdULP word of an untagged segment, which a
// Send with Invalidate uses for the STag to invalidate.
func (h DDPHeader) InvalidateSTag() uint32 { return binary.BigEndian.Uint32(h[ddpRsvdULP:]) }

// QN returns the Queue Number of an untagged segment.
func (h DDPHeader) QN() uint32 { return binary.BigEndian.Uint32(h[ddpQN:]) }

// MSN returns the Message Sequence Number of an untagged segment.
func (h DDPHeader) MSN() uint32 { return binary.BigEndian.Uint32(h[ddpMSN:]) }

// MO returns the Message Offset of an untagged segment.
func (h DDPHeader) MO() uint32 { return binary.BigEndian.Uint32(h[ddpMO:]) }

// Payload returns the bytes after the DDP header (which for a Read Request
// or a Terminate start with that message's RDMAP header).
func (h DDPHeader) Payload() []byte { return h[h.HeaderSize():] }

// ErrDDPShort reports a ULPDU too short for the header it announces.
var ErrDDPShort = errors.New("ddp: segment shorter than its header")

// Validate checks that h is at least as long as its header.
func (h DDPHeader) Validate() error {
	if len(h) < 2 || len(h) < h.HeaderSize() {
		return ErrDDPShort
	}
	return nil
}

// DDPFields describes a DDP segment header to encode.
type DDPFields struct {
	Opcode Opcode
	Last   bool
	// Tagged buffer model.
	STag uint32
	TO   uint64
	// Untagged buffer model.
	RsvdULP uint32 // Invalidate STag for Send with Invalidate
	QN      uint32
	MSN     uint32
	MO      uint32
}

// Encode writes the header described by f (tagged if f.Opcode is Write or
// Read Response) and returns its size. h must be long enough.
func (h DDPHeader) Encode(f *DDPFields) int {
	c := uint8(DDPVersion)
	if f.Last {
		c |= ddpFlagLast
	}
	h[rdmapCtrl] = RDMAPVersion<<6 | uint8(f.Opcode)&rdmapOpMask
	if f.Opcode.Tagged() {
		h[ddpControl] = c | ddpFlagTagged
		binary.BigEndian.PutUint32(h[ddpSTag:], f.STag)
		binary.BigEndian.PutUint64(h[ddpTO:], f.TO)
		return DDPTaggedHeaderSize
	}
	h[ddpControl] = c
	binary.BigEndian.PutUint32(h[ddpRsvdULP:], f.RsvdULP)
	binary.BigEndian.PutUint32(h[ddpQN:], f.QN)
	binary.BigEndian.PutUint32(h[ddpMSN:], f.MSN)
	binary.BigEndian.PutUint32(h[ddpMO:], f.MO)
	return DDPUntaggedHeaderSize
}

// ReadRequest is a view of the RDMA Read Request header (RFC 5040 §4.4),
// the 28-byte payload of an untagged segment on queue 1.
//
//	| Data Sink STag | Data Sink Tagged Offset (64) | RDMA Read Message Size |
//	| Data Source STag | Data Source Tagged Offset (64) |
type ReadRequest []byte

const (
	rrSinkSTag = 0
	rrSinkTO   = 4
	rrSize     = 12
	rrSrcSTag  = 16
	rrSrcTO    = 20
	// ReadRequestSize is the size of the RDMA Read Request header.
	ReadRequestSize = 28
)

// SinkSTag returns the Data Sink STag (the requester's buffer).
func (r ReadRequest) SinkSTag() uint32 { return binary.BigEndian.Uint32(r[rrSinkSTag:]) }

// SinkTO returns the Data Sink Tagged Offset.
func (r ReadRequest) SinkTO() uint64 { return binary.BigEndian.Uint64(r[rrSinkTO:]) }

// Size returns the RDMA Read Message Size.
func (r ReadRequest) Size() uint32 { return binary.BigEndian.Uint32(r[rrSize:]) }

// SourceSTag returns the Data Source STag (the responder's buffer).
func (r ReadRequest) SourceSTag() uint32 { return binary.BigEndian.Uint32(r[rrSrcSTag:]) }

// SourceTO returns the Data Source Tagged Offset.
func (r ReadRequest) SourceTO() uint64 { return binary.BigEndian.Uint64(r[rrSrcTO:]) }

// ReadRequestFields describes an RDMA Read Request header.
type ReadRequestFields struct {
	SinkSTag   uint32
	SinkTO     uint64
	Size       uint32
	SourceSTag uint32
	SourceTO   uint64
}

// Encode writes the Read Request header.
func (r ReadRequest) Encode(f *ReadRequestFields) {
	binary.BigEndian.PutUint32(r[rrSinkSTag:], f.SinkSTag)
	binary.BigEndian.PutUint64(r[rrSinkTO:], f.SinkTO)
	binary.BigEndian.PutUint32(r[rrSize:], f.Size)
	binary.BigEndian.PutUint32(r[rrSrcSTag:], f.SourceSTag)
	binary.BigEndian.PutUint64(r[rrSrcTO:], f.SourceTO)
}

// Fields decodes the header.
func (r ReadRequest) Fields() ReadRequestFields {
	return ReadRequestFields{r.SinkSTag(), r.SinkTO(), r.Size(), r.SourceSTag(), r.SourceTO()}
}
