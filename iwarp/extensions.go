package iwarp

import (
	"encoding/binary"
	"fmt"
)

// RFC 7306 RDMAP extensions on the wire: the Atomic Request and Atomic
// Response headers and the Immediate Data header. Each is the payload of an
// untagged DDP segment, right after the DDP header, as the Read Request
// header is (RFC 5040). Every field travels in network byte order.
//
// Queues (untagged): an Atomic Request goes on queue 1, the queue of RDMA
// Read Requests, and takes the next MSN of that queue, so that Reads and
// atomics are answered in the order they were asked and share the IRD and
// ORD limits; an Atomic Response goes on queue 3 (QNAtomicResp), with MSNs
// of its own; Immediate Data goes on queue 0, the Send queue, and takes
// the next Send MSN (it consumes a receive, as a Send does). urdma, the
// other software iWARP with RFC 7306 atomics, uses the same queues; the
// header layouts and Atomic Operation Codes are those Wireshark's iWARP
// dissector decodes.

// QNAtomicResp is the untagged queue of Atomic Responses (RFC 7306).
const QNAtomicResp = 3

// AtomicOp is the Atomic Operation Code of an Atomic Request.
type AtomicOp uint8

// Atomic operations (RFC 7306).
const (
	AtomicFetchAdd AtomicOp = 0x0
	AtomicSwap     AtomicOp = 0x1
	AtomicCmpSwap  AtomicOp = 0x2
)

func (o AtomicOp) String() string {
	switch o {
	case AtomicFetchAdd:
		return "FetchAdd"
	case AtomicSwap:
		return "Swap"
	case AtomicCmpSwap:
		return "CmpSwap"
	}
	return fmt.Sprintf("atomic op %#x", uint8(o))
}

// AtomicRequest is a view of the Atomic Request header (RFC 7306), the
// 52-byte payload of an untagged segment on queue 1.
//
//	| Reserved (28)                                      | AtomicOp (4) |
//	| Request Identifier                                                |
//	| Remote STag                                                       |
//	| Remote Tagged Offset (64)                                         |
//	| Add or Swap Data (64)                                             |
//	| Add or Swap Mask (64)                                             |
//	| Compare Data (64)                                                 |
//	| Compare Mask (64)                                                 |
type AtomicRequest []byte

const (
	arOpWord    = 0
	arReqID     = 4
	arSTag      = 8
	arTO        = 12
	arData      = 20
	arDataMask  = 28
	arCmp       = 36
	arCmpMask   = 44
	arOpMask    = 0x0000000f
	arRsvdMask  = 0xfffffff0
	atomicWidth = 8

	// AtomicRequestSize is the size of the Atomic Request header.
	AtomicRequestSize = 52
	// AtomicResponseSize is the size of the Atomic Response header.
	AtomicResponseSize = 12
	// ImmediateDataSize is the size of the Immediate Data header.
	ImmediateDataSize = 8
	// AtomicTargetSize is the size (and alignment) of an atomic target.
	AtomicTargetSize = atomicWidth
)

// Op returns the Atomic Operation Code (the low 4 bits of the first word).
func (a AtomicRequest) Op() AtomicOp {
	return AtomicOp(binary.BigEndian.Uint32(a[arOpWord:]) & arOpMask)
}

// Reserved returns the 28 reserved bits before the Atomic Operation Code.
func (a AtomicRequest) Reserved() uint32 {
	return (binary.BigEndian.Uint32(a[arOpWord:]) & arRsvdMask) >> 4
}

// RequestID returns the Request Identifier, which the Atomic Response
// echoes as its Original Request Identifier.
func (a AtomicRequest) RequestID() uint32 { return binary.BigEndian.Uint32(a[arReqID:]) }

// RemoteSTag returns the Remote STag of the target.
func (a AtomicRequest) RemoteSTag() uint32 { return binary.BigEndian.Uint32(a[arSTag:]) }

// RemoteTO returns the Remote Tagged Offset of the 8-byte target.
func (a AtomicRequest) RemoteTO() uint64 { return binary.BigEndian.Uint64(a[arTO:]) }

// AddSwapData returns the Add Data (FetchAdd) or Swap Data (Swap, CmpSwap).
func (a AtomicRequest) AddSwapData() uint64 { return binary.BigEndian.Uint64(a[arData:]) }

// AddSwapMask returns the Add Mask (FetchAdd: a 1 bit ends a field, the
// carry out of it is dropped) or the Swap Mask (Swap, CmpSwap: the bits
// that are replaced).
func (a AtomicRequest) AddSwapMask() uint64 { return binary.BigEndian.Uint64(a[arDataMask:]) }

// CompareData returns the Compare Data (CmpSwap).
func (a AtomicRequest) CompareData() uint64 { return binary.BigEndian.Uint64(a[arCmp:]) }

// CompareMask returns the Compare Mask (CmpSwap: the bits compared).
func (a AtomicRequest) CompareMask() uint64 { return binary.BigEndian.Uint64(a[arCmpMask:]) }

// AtomicRequestFields describes an Atomic Request header.
type AtomicRequestFields struct {
	Op          AtomicOp
	RequestID   uint32
	RemoteSTag  uint32
	RemoteTO    uint64
	AddSwapData uint64
	AddSwapMask uint64
	CompareData uint64
	CompareMask uint64
}

// Encode writes the header; the reserved bits are zero.
func (a AtomicRequest) Encode(f *AtomicRequestFields) {
	binary.BigEndian.PutUint32(a[arOpWord:], uint32(f.Op)&arOpMask)
	binary.BigEndian.PutUint32(a[arReqID:], f.RequestID)
	binary.BigEndian.PutUint32(a[arSTag:], f.RemoteSTag)
	binary.BigEndian.PutUint64(a[arTO:], f.RemoteTO)
	binary.BigEndian.PutUint64(a[arData:], f.AddSwapData)
	binary.BigEndian.PutUint64(a[arDataMask:], f.AddSwapMask)
	binary.BigEndian.PutUint64(a[arCmp:], f.CompareData)
	binary.BigEndian.PutUint64(a[arCmpMask:], f.CompareMask)
}

// Fields decodes the header (the reserved bits are dropped).
func (a AtomicRequest) Fields() AtomicRequestFields {
	return AtomicRequestFields{a.Op(), a.RequestID(), a.RemoteSTag(), a.RemoteTO(),
		a.AddSwapData(), a.AddSwapMask(), a.CompareData(), a.CompareMask()}
}

// AtomicResponse is a view of the Atomic Response header (RFC 7306), the
// 12-byte payload of an untagged segment on queue 3.
//
//	| Original Request Identifier                                       |
//	| Original Remote Data Value (64)                                   |
type AtomicResponse []byte

const (
	arspReqID = 0
	arspValue = 4
)

// RequestID returns the Original Request Identifier.
func (a AtomicResponse) RequestID() uint32 { return binary.BigEndian.Uint32(a[arspReqID:]) }

// OriginalValue returns the Original Remote Data Value: the target's value
// before the operation.
func (a AtomicResponse) OriginalValue() uint64 { return binary.BigEndian.Uint64(a[arspValue:]) }

// Encode writes the header.
func (a AtomicResponse) Encode(reqID uint32, original uint64) {
	binary.BigEndian.PutUint32(a[arspReqID:], reqID)
	binary.BigEndian.PutUint64(a[arspValue:], original)
}

// ImmediateData is a view of the Immediate Data header (RFC 7306): 8 bytes
// of data for the peer's ULP, the payload of an untagged segment on queue 0
// (Immediate Data, or Immediate Data with Solicited Event).
//
// rdmatap carries libibverbs' 32-bit imm_data in the low 32 bits (the last
// four bytes) and uses bit 0 of the first four bytes (ImmFlagForSend) to
// say that the value belongs to the Send message right behind it (Send with
// Immediate); the other 31 bits are zero. A peer that knows nothing of the
// flag still sees a well-formed Immediate Data message.
type ImmediateData []byte

// ImmFlagForSend marks an Immediate Data message whose value is delivered
// with the Send that follows it, in one receive completion.
const ImmFlagForSend = 1 << 32

// Value returns the 64-bit Immediate Data.
func (d ImmediateData) Value() uint64 { return binary.BigEndian.Uint64(d) }

// Imm returns the low 32 bits, libibverbs' imm_data.
func (d ImmediateData) Imm() uint32 { return uint32(d.Value()) }

// ForSend reports rdmatap's Send with Immediate flag.
func (d ImmediateData) ForSend() bool { return d.Value()&ImmFlagForSend != 0 }

// Encode writes the 64-bit Immediate Data.
func (d ImmediateData) Encode(v uint64) { binary.BigEndian.PutUint64(d, v) }

// extHeaderSize is the RDMAP header an untagged opcode carries after the
// DDP header (0 for none).
func extHeaderSize(op Opcode) int {
	switch op {
	case OpReadRequest:
		return ReadRequestSize
	case OpAtomicRequest:
		return AtomicRequestSize
	case OpAtomicResp:
		return AtomicResponseSize
	case OpImmediate, OpImmediateSE:
		return ImmediateDataSize
	}
	return 0
}

// maskedAdd adds a and b in fields: a 1 bit in mask ends a field, and the
// carry out of that bit is dropped instead of entering the next field
// (mask 0 is a plain 64-bit add).
func maskedAdd(a, b, mask uint64) uint64 {
	sum := a ^ b
	carry := (a & b &^ mask) << 1
	for carry != 0 {
		next := (sum & carry &^ mask) << 1
		sum ^= carry
		carry = next
	}
	return sum
}
