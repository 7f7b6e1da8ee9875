package svc

import (
	"encoding/binary"
	"errors"
	"sync/atomic"
	"unsafe"

	"github.com/rdmatap/rdmatap/iwarp"
)

// The fast path: single-producer single-consumer rings in shared memory.
// The service makes each ring's memory (a sealed memfd it passes to the
// client), so the client can neither shrink it under the service nor hand
// it a file of its choosing.
//
//	SQ  client → service  send work requests    (SendEntry)
//	RQ  client → service  receive work requests (RecvEntry; an SRQ has one too)
//	CQ  service → client  work completions      (CQEntry)
//
// A ring is a 256-byte header and a power-of-two number of fixed-size
// entries. Prod and Cons are free-running 32-bit indexes, each on its own
// cache line and written by one side only: the producer fills entry
// Prod%cap and then stores Prod+1; the consumer reads entry Cons%cap and
// then stores Cons+1. Both are sync/atomic operations (sequentially
// consistent), which is what makes the sleep protocol below safe.
//
// Doorbells. A consumer that runs out of work and wants to sleep stores
// Waiting=1, looks at Prod once more, and only then blocks on its eventfd;
// a producer stores Prod and then loads Waiting, and writes the eventfd
// only when it is set. Either the consumer sees the new Prod or the
// producer sees Waiting: no lost wake-up, and no system call while the
// consumer is busy polling. The service's single sleep flag for all of a
// client's SQs and RQs lives in the client's control page (CtlSize).
//
// The service trusts nothing it reads from shared memory: it keeps its own
// copy of each ring's capacity and entry size and of the indexes it owns,
// rejects a producer index more than a capacity ahead of its consumer
// index, and checks every field of every entry (SGEs are checked against
// the client's registrations by the protocol engine, by STag, PD and
// bounds) before it acts on it.

// Header layout.
const (
	ringProd      = 0
	ringCons      = 64
	ringWaiting   = 128
	ringArm       = 132 // CQ: ArmAny or ArmSolicited, cleared by the event
	ringEvents    = 136 // CQ: completion events delivered
	ringOverflow  = 140 // CQ: a completion was lost to a full ring
	ringCap       = 192
	ringEntrySize = 196
	RingHeader    = 256
)

// CQ arm states (CQ.ReqNotify).
const (
	ArmNone      = 0
	ArmAny       = 1
	ArmSolicited = 2
)

// Control page layout (one per client).
const (
	CtlSleeping = 0 // the service's poller sleeps: ring the doorbell eventfd
	CtlSize     = 4096
)

// Entry sizes.
const (
	SendEntryBase = 64
	RecvEntryBase = 16
	SGESize       = 16
	CQEntrySize   = 32
)

// SendEntrySize is the size of an SQ entry with room for maxSGE SGEs.
func SendEntrySize(maxSGE int) int { return SendEntryBase + SGESize*maxSGE }

// SendEntrySizeInline is the size of an SQ entry of a session with
// FeatureInlineData: room for maxSGE SGEs or maxInline bytes of data
// (rounded up to 16), whichever is more.
func SendEntrySizeInline(maxSGE, maxInline int) int {
	return SendEntryBase + max(SGESize*maxSGE, (maxInline+SGESize-1)/SGESize*SGESize)
}

// FlagInlineData is the send entry flag (beside the engine's send flags
// in the Flags byte) of an entry that carries its payload itself: its
// length in bytes 12-15, the bytes from SendEntryBase, no SGEs.
const FlagInlineData = 0x80

// RecvEntrySize is the size of an RQ entry with room for maxSGE SGEs.
func RecvEntrySize(maxSGE int) int { return RecvEntryBase + SGESize*maxSGE }

// RingCap rounds n up to a power of two.
func RingCap(n int) int {
	c := 1
	for c < n {
		c <<= 1
	}
	return c
}

// RingBytes is the memory a ring of capacity entries of size esize takes,
// rounded up to whole pages.
func RingBytes(capacity, esize int) int {
	n := RingHeader + capacity*esize
	return (n + 4095) &^ 4095
}

// Errors of ring validation.
var (
	ErrRingIndex = errors.New("svc: ring producer index out of range")
	ErrRingEntry = errors.New("svc: malformed ring entry")
)

// U32 returns the shared 32-bit word at off of mem (4-byte aligned).
func U32(mem []byte, off int) *atomic.Uint32 {
	_ = mem[off+3]
	return (*atomic.Uint32)(unsafe.Pointer(&mem[off]))
}

// Ring is one end's view of a ring. The geometry is the creator's; the
// client reads it from the header, the service keeps what it wrote.
type Ring struct {
	mem     []byte
	mask    uint32
	esize   int
	Prod    *atomic.Uint32
	Cons    *atomic.Uint32
	Waiting *atomic.Uint32
	Arm     *atomic.Uint32
	Events  *atomic.Uint32
	// Overflow is set when a CQ lost a completion to a full ring.
	Overflow *atomic.Uint32
}

// InitRing lays a ring out in mem (the creator's side).
func InitRing(mem []byte, capacity, esize int) (*Ring, error) {
	if capacity <= 0 || capacity&(capacity-1) != 0 || esize <= 0 || RingHeader+capacity*esize > len(mem) {
		return nil, ErrRingEntry
	}
	binary.LittleEndian.PutUint32(mem[ringCap:], uint32(capacity))
	binary.LittleEndian.PutUint32(mem[ringEntrySize:], uint32(esize))
	return newRing(mem, capacity, esize), nil
}

// OpenRing attaches to a ring laid out by InitRing (the client's side).
func OpenRing(mem []byte) (*Ring, error) {
	if len(mem) < RingHeader {
		return nil, ErrRingEntry
	}
	capacity := int(binary.LittleEndian.Uint32(mem[ringCap:]))
	esize := int(binary.LittleEndian.Uint32(mem[ringEntrySize:]))
	if capacity <= 0 || capacity&(capacity-1) != 0 || esize <= 0 || RingHeader+capacity*esize > len(mem) {
		return nil, ErrRingEntry
	}
	return newRing(mem, capacity, esize), nil
}

func newRing(mem []byte, capacity, esize int) *Ring {
	return &Ring{mem: mem[:RingHeader+capacity*esize], mask: uint32(capacity - 1), esize: esize,
		Prod: U32(mem, ringProd), Cons: U32(mem, ringCons), Waiting: U32(mem, ringWaiting),
		Arm: U32(mem, ringArm), Events: U32(mem, ringEvents), Overflow: U32(mem, ringOverflow)}
}

// Cap returns the number of entries.
func (r *Ring) Cap() int { return int(r.mask) + 1 }

// EntrySize returns the entry size.
func (r *Ring) EntrySize() int { return r.esize }

// Entry returns entry i (taken modulo the capacity).
func (r *Ring) Entry(i uint32) []byte {
	off := RingHeader + int(i&r.mask)*r.esize
	return r.mem[off : off+r.esize : off+r.esize]
}

// Pending returns how many entries lie between cons (the consumer's own
// copy of its index) and the producer's index, or ErrRingIndex when the
// producer claims more than the ring holds.
func (r *Ring) Pending(cons uint32) (uint32, error) {
	n := r.Prod.Load() - cons
	if n > r.mask+1 {
		return 0, ErrRingIndex
	}
	return n, nil
}

// Free returns how many entries the producer (whose own index is prod)
// may still fill, or ErrRingIndex when the consumer's index is not within
// a capacity behind it.
func (r *Ring) Free(prod uint32) (uint32, error) {
	used := prod - r.Cons.Load()
	if used > r.mask+1 {
		return 0, ErrRingIndex
	}
	return r.mask + 1 - used, nil
}

// Send entry layout.
const (
	seID         = 0
	seOp         = 8
	seFlags      = 9
	seNSGE       = 10
	seDataLen    = 12
	seRemoteAddr = 16
	seRKey       = 24
	seInvRKey    = 28
	seImm        = 32
	seCompareAdd = 40
	seSwap       = 48
)

func putSGL(e []byte, sgl []iwarp.SGE) {
	for i, s := range sgl {
		o := i * SGESize
		binary.LittleEndian.PutUint64(e[o:], s.Addr)
		binary.LittleEndian.PutUint32(e[o+8:], s.Length)
		binary.LittleEndian.PutUint32(e[o+12:], s.LKey)
	}
}

func getSGL(e []byte, n int, dst []iwarp.SGE) []iwarp.SGE {
	dst = dst[:n]
	for i := range dst {
		o := i * SGESize
		dst[i] = iwarp.SGE{Addr: binary.LittleEndian.Uint64(e[o:]), Length: binary.LittleEndian.Uint32(e[o+8:]),
			LKey: binary.LittleEndian.Uint32(e[o+12:])}
	}
	return dst
}

// PutSend encodes wr into an SQ entry; the caller has checked that its
// SGL fits. obj is the service's handle of the fast-register MR a REG_MR
// registers or of the window a BIND_MW binds (0 for other operations).
//
// The memory registration operations reuse the data fields: REG_MR
// carries its access in Imm and the MR's handle in Swap; BIND_MW carries
// the window's handle in Swap and its binding in RemoteAddr (address),
// CompareAdd (length), InvRKey (the MR's STag) and Imm (access).
func PutSend(e []byte, wr *iwarp.SendWR, obj uint64) {
	binary.LittleEndian.PutUint64(e[seID:], wr.ID)
	e[seOp] = byte(wr.Op)
	e[seFlags] = byte(wr.Flags)
	binary.LittleEndian.PutUint16(e[seNSGE:], uint16(len(wr.SGL)))
	remote, inv, imm, cmp, swap := wr.RemoteAddr, wr.InvalidateRKey, wr.Imm, wr.CompareAdd, wr.Swap
	switch wr.Op {
	case iwarp.WRRegMR:
		imm, swap = uint32(wr.Access), obj
	case iwarp.WRBindMW:
		remote, cmp, inv, imm, swap = wr.Bind.Addr, wr.Bind.Length, wr.Bind.MR, uint32(wr.Bind.Access), obj
	}
	binary.LittleEndian.PutUint64(e[seRemoteAddr:], remote)
	binary.LittleEndian.PutUint32(e[seRKey:], wr.RKey)
	binary.LittleEndian.PutUint32(e[seInvRKey:], inv)
	binary.LittleEndian.PutUint32(e[seImm:], imm)
	binary.LittleEndian.PutUint64(e[seCompareAdd:], cmp)
	binary.LittleEndian.PutUint64(e[seSwap:], swap)
	putSGL(e[SendEntryBase:], wr.SGL)
}

// PutSendData encodes an inline Send or RDMA Write whose payload is data
// into an SQ entry (FlagInlineData): wr's SGL is not used. The caller has
// checked that data fits the entry (len(e) - SendEntryBase bytes).
func PutSendData(e []byte, wr *iwarp.SendWR, data []byte) {
	binary.LittleEndian.PutUint64(e[seID:], wr.ID)
	e[seOp] = byte(wr.Op)
	e[seFlags] = byte(wr.Flags|iwarp.FlagInline) | FlagInlineData
	binary.LittleEndian.PutUint16(e[seNSGE:], 0)
	binary.LittleEndian.PutUint32(e[seDataLen:], uint32(len(data)))
	binary.LittleEndian.PutUint64(e[seRemoteAddr:], wr.RemoteAddr)
	binary.LittleEndian.PutUint32(e[seRKey:], wr.RKey)
	binary.LittleEndian.PutUint32(e[seInvRKey:], wr.InvalidateRKey)
	binary.LittleEndian.PutUint32(e[seImm:], wr.Imm)
	binary.LittleEndian.PutUint64(e[seCompareAdd:], 0)
	binary.LittleEndian.PutUint64(e[seSwap:], 0)
	copy(e[SendEntryBase:], data)
}

// InlineDataOp reports whether op may carry its payload in its entry
// (FlagInlineData): the Sends and RDMA Writes.
func InlineDataOp(op iwarp.WROp) bool {
	switch op {
	case iwarp.WRSend, iwarp.WRSendInvalidate, iwarp.WRWrite, iwarp.WRWriteImm, iwarp.WRSendImm:
		return true
	}
	return false
}

// SendOpAllowed reports whether a client may post op through a ring: the
// data operations, Local Invalidate, RDMA Read with Invalidate, REG_MR
// and BIND_MW (whose MR or window the entry names by the service's
// handle; GetSend returns it).
func SendOpAllowed(op iwarp.WROp) bool {
	switch op {
	case iwarp.WRSend, iwarp.WRSendInvalidate, iwarp.WRWrite, iwarp.WRRead, iwarp.WRWriteImm, iwarp.WRSendImm,
		iwarp.WRAtomicCmpSwap, iwarp.WRAtomicFetchAdd, iwarp.WRLocalInv, iwarp.WRReadInv, iwarp.WRRegMR, iwarp.WRBindMW:
		return true
	}
	return false
}

// GetSend decodes an SQ entry into wr, reusing sgl (whose capacity is the
// QP's MaxSendSGE) for its SGL, and returns the handle of the MR or window
// a REG_MR or BIND_MW names (for the caller to resolve: wr.MR and wr.MW
// stay nil). It copies the entry's fields once, so a client changing the
// entry meanwhile cannot make the checks and the use disagree.
func GetSend(e []byte, wr *iwarp.SendWR, sgl []iwarp.SGE) (uint64, error) {
	if len(e) < SendEntryBase {
		return 0, ErrRingEntry
	}
	n := int(binary.LittleEndian.Uint16(e[seNSGE:]))
	op := iwarp.WROp(e[seOp])
	if n > cap(sgl) || SendEntryBase+n*SGESize > len(e) || !SendOpAllowed(op) {
		return 0, ErrRingEntry
	}
	*wr = iwarp.SendWR{
		ID: binary.LittleEndian.Uint64(e[seID:]), Op: op, Flags: iwarp.SendFlags(e[seFlags]),
		RemoteAddr: binary.LittleEndian.Uint64(e[seRemoteAddr:]), RKey: binary.LittleEndian.Uint32(e[seRKey:]),
		InvalidateRKey: binary.LittleEndian.Uint32(e[seInvRKey:]), Imm: binary.LittleEndian.Uint32(e[seImm:]),
		CompareAdd: binary.LittleEndian.Uint64(e[seCompareAdd:]), Swap: binary.LittleEndian.Uint64(e[seSwap:]),
	}
	if wr.Flags&FlagInlineData != 0 {
		// The payload is in the entry: no SGEs, a length within the
		// entry, an opcode that sends data. wr.Data points into e (the
		// engine copies it once, at post time).
		l := binary.LittleEndian.Uint32(e[seDataLen:])
		if n != 0 || uint64(l) > uint64(len(e)-SendEntryBase) || !InlineDataOp(op) {
			return 0, ErrRingEntry
		}
		wr.Flags = wr.Flags&^FlagInlineData | iwarp.FlagInline
		wr.Data = e[SendEntryBase : SendEntryBase+int(l) : SendEntryBase+int(l)]
	}
	if wr.Flags&^(iwarp.FlagSignaled|iwarp.FlagInline|iwarp.FlagSolicited|iwarp.FlagFence) != 0 {
		return 0, ErrRingEntry
	}
	wr.SGL = getSGL(e[SendEntryBase:], n, sgl)
	var obj uint64
	switch op {
	case iwarp.WRRegMR:
		wr.Access, obj = iwarp.Access(wr.Imm), wr.Swap
		wr.Imm, wr.Swap = 0, 0
	case iwarp.WRBindMW:
		wr.Bind = iwarp.MWBind{MR: wr.InvalidateRKey, Addr: wr.RemoteAddr, Length: wr.CompareAdd, Access: iwarp.Access(wr.Imm)}
		obj = wr.Swap
		wr.RemoteAddr, wr.CompareAdd, wr.InvalidateRKey, wr.Imm, wr.Swap = 0, 0, 0, 0, 0
	}
	return obj, nil
}

// PutRecv encodes a receive work request into an RQ entry.
func PutRecv(e []byte, id uint64, sgl []iwarp.SGE) {
	binary.LittleEndian.PutUint64(e, id)
	binary.LittleEndian.PutUint32(e[8:], uint32(len(sgl)))
	putSGL(e[RecvEntryBase:], sgl)
}

// GetRecv decodes an RQ entry, reusing sgl as GetSend does.
func GetRecv(e []byte, sgl []iwarp.SGE) (uint64, []iwarp.SGE, error) {
	if len(e) < RecvEntryBase {
		return 0, nil, ErrRingEntry
	}
	n := binary.LittleEndian.Uint32(e[8:])
	if n > uint32(cap(sgl)) || RecvEntryBase+int(n)*SGESize > len(e) {
		return binary.LittleEndian.Uint64(e), nil, ErrRingEntry // the ID, for the failed completion
	}
	return binary.LittleEndian.Uint64(e), getSGL(e[RecvEntryBase:], int(n), sgl), nil
}

// PutCompletion encodes a completion into a CQ entry.
func PutCompletion(e []byte, c *iwarp.Completion) {
	binary.LittleEndian.PutUint64(e, c.ID)
	e[8] = byte(c.Status)
	e[9] = byte(c.Op)
	e[10] = byte(c.Flags)
	e[11] = 0
	binary.LittleEndian.PutUint32(e[12:], c.ByteLen)
	binary.LittleEndian.PutUint32(e[16:], c.QPNum)
	binary.LittleEndian.PutUint32(e[20:], c.InvalidatedRKey)
	binary.LittleEndian.PutUint32(e[24:], c.Imm)
	e[28] = byte(c.Term.Layer)
	e[29] = c.Term.EType
	e[30] = c.Term.Code
	e[31] = 0
}

// GetCompletion decodes a CQ entry.
func GetCompletion(e []byte, c *iwarp.Completion) {
	_ = e[CQEntrySize-1]
	*c = iwarp.Completion{
		ID: binary.LittleEndian.Uint64(e), Status: iwarp.Status(e[8]), Op: iwarp.CompletionOp(e[9]),
		Flags: iwarp.CompletionFlags(e[10]), ByteLen: binary.LittleEndian.Uint32(e[12:]),
		QPNum: binary.LittleEndian.Uint32(e[16:]), InvalidatedRKey: binary.LittleEndian.Uint32(e[20:]),
		Imm:  binary.LittleEndian.Uint32(e[24:]),
		Term: iwarp.TermCode{Layer: iwarp.Layer(e[28]), EType: e[29], Code: e[30]},
	}
}

// EntryOp returns a send entry's opcode, also of an entry GetSend refused;
// ok is false when the opcode is not one a client may post.
func EntryOp(e []byte) (op iwarp.WROp, ok bool) {
	if len(e) <= seOp {
		return 0, false
	}
	op = iwarp.WROp(e[seOp])
	return op, SendOpAllowed(op)
}

// EntryID returns the work request ID of an SQ or RQ entry (its first
// field), for completing a malformed entry in error.
func EntryID(e []byte) uint64 {
	if len(e) < 8 {
		return 0
	}
	return binary.LittleEndian.Uint64(e)
}
