package verbs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/zerocopy"
)

// Access is a set of memory access rights (the ibv_access_flags values).
type Access uint32

// Access rights.
const (
	AccessLocalWrite  Access = 1 // IBV_ACCESS_LOCAL_WRITE
	AccessRemoteWrite Access = 2 // IBV_ACCESS_REMOTE_WRITE
	AccessRemoteRead  Access = 4 // IBV_ACCESS_REMOTE_READ
	// AccessRemoteAtomic lets peers run RFC 7306 atomics on the MR's
	// 8-byte aligned words (IBV_ACCESS_REMOTE_ATOMIC).
	AccessRemoteAtomic Access = 8
	// AccessMWBind lets memory windows be bound to the MR
	// (IBV_ACCESS_MW_BIND; see MW).
	AccessMWBind Access = 16
	// AccessZeroBased makes the region's remote addresses start at 0
	// (IBV_ACCESS_ZERO_BASED).
	AccessZeroBased Access = 32
)

// STag is an iWARP Steering Tag: on iWARP the lkey and the rkey are the
// same STag (24-bit index, 8-bit key).
type STag = uint32

// PD is a protection domain: MRs and QPs of different PDs cannot use each
// other.
//
// Locks: see the package documentation.
type PD struct {
	dev *Device
	id  uint32

	mu sync.Mutex
	// +checklocks:mu
	closed bool
	// +checklocks:mu
	mrs int // MRs and memory windows
	// +checklocks:mu
	qps int
	// +checklocks:mu
	srqs int
	ops  pdOps // enginePD or remotePD (remote_pd.go): what the PD does
}

// pdOps is what a PD does, one implementation per kind of device: an
// embedded device's (enginePD) or a service's (remotePD, remote_pd.go).
type pdOps interface {
	regMR(buf []byte, iova uint64, acc Access) (*MR, error)
	allocMR(maxPages int) (*MR, error)
	allocMW(t MWType) (*MW, error)
	createQP(cfg QPConfig) (*QP, error)
	createSRQ(maxWR, maxSGE int) (*SRQ, error)
	// destroy releases what the kind holds for the PD; PD.Close has
	// checked that nothing uses it.
	destroy() error
}

// enginePD is a PD of an embedded device.
type enginePD PD

func (e *enginePD) regMR(buf []byte, iova uint64, acc Access) (*MR, error) {
	return (*PD)(e).regMRAt(buf, iova, acc)
}

func (e *enginePD) destroy() error { return nil }

// Device returns the PD's device.
func (pd *PD) Device() *Device { return pd.dev }

// ID returns the PD number.
func (pd *PD) ID() uint32 { return pd.id }

// RegMR registers buf for RDMA with the given rights. The MR keeps buf
// reachable; the caller must not reuse it for anything else until Dereg.
// Go memory does not move, so no pinning is needed; memory from
// zerocopy.Alloc is page-aligned and can be shared between processes.
func (pd *PD) RegMR(buf []byte, acc Access) (*MR, error) {
	return pd.regMR(buf, iwarp.BufferAddr(buf), acc)
}

// RegMRIOVA registers buf as RegMR does, with iova as the address of its
// first byte (ibv_reg_mr_iova): SGEs and peers address byte i of buf as
// iova+i. With AccessZeroBased the addresses start at 0 whatever iova is.
// The address range must not wrap.
func (pd *PD) RegMRIOVA(buf []byte, iova uint64, acc Access) (*MR, error) {
	if iova+uint64(len(buf)) < iova {
		return nil, fmt.Errorf("%w: IOVA %#x + %d bytes wraps", ErrInvalidArgument, iova, len(buf))
	}
	return pd.regMR(buf, iova, acc)
}

func (pd *PD) regMR(buf []byte, iova uint64, acc Access) (*MR, error) {
	if acc&^(AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead|AccessRemoteAtomic|AccessZeroBased|AccessMWBind) != 0 {
		return nil, fmt.Errorf("%w: access flags %#x not supported", ErrInvalidArgument, uint32(acc))
	}
	if acc&AccessRemoteWrite != 0 && acc&AccessLocalWrite == 0 {
		// ibv_reg_mr: remote write requires local write.
		return nil, fmt.Errorf("%w: remote write requires local write", ErrInvalidArgument)
	}
	if acc&AccessRemoteAtomic != 0 && acc&AccessLocalWrite == 0 {
		// ibv_reg_mr: remote atomic requires local write too.
		return nil, fmt.Errorf("%w: remote atomic requires local write", ErrInvalidArgument)
	}
	return pd.ops.regMR(buf, iova, acc)
}

// regMRAt registers buf with base as the address of its first byte (a
// service registers a client's pages at the client's addresses).
func (pd *PD) regMRAt(buf []byte, base uint64, acc Access) (*MR, error) {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.closed {
		return nil, net.ErrClosed
	}
	r := &iwarp.Region{Buf: buf, Access: iwarp.Access(acc), PD: pd.id, Kind: iwarp.KindMR}
	if acc&AccessZeroBased == 0 {
		r.Base = base
	}
	if _, err := pd.dev.mem.Register(r); err != nil {
		return nil, err
	}
	pd.mrs++
	m := &MR{pd: pd, r: r}
	m.ops = (*engineMR)(m)
	return m, nil
}

// MR is a memory region: registered memory (RegMR), or a fast-register
// MR (AllocMR) whose memory, key and access a REG_MR work request sets.
// For a fast-register MR, the accessors report the current (or last)
// registration; on a device of a service, the registration last posted
// (the service executes it in send queue order).
//
// Locks: see the package documentation.
type MR struct {
	pd *PD
	r  *iwarp.Region    // RegMR
	fr *iwarp.FastRegMR // AllocMR

	mu sync.Mutex
	// +checklocks:mu
	freed bool

	// ops is what the MR does, by kind of device: engineMR, or remoteMR
	// (remote_mr.go), for which r describes the client's own mapping of a
	// regular MR and fr is a token that stands for a fast-register MR in
	// work requests.
	ops mrOps
}

// mrOps is what an MR does, one implementation per kind of device: an
// embedded device's registration in the engine's STag table (engineMR) or
// a service's MR (remoteMR, remote_mr.go).
type mrOps interface {
	// view returns the registered bytes (nil when paged), the first
	// byte's address, the length and the STag.
	view() ([]byte, uint64, uint64, STag)
	valid() bool
	// dereg deregisters the MR; false: windows are bound to it. MR.mu
	// is held.
	dereg() (bool, error)
	mapPages(pages [][]byte, pageSize, offset, length int) error
	mapSG(sgl []SGE, pageSize int) error
	setIOVA(iova uint64) error
}

// engineMR is an MR of an embedded device.
type engineMR MR

func (e *engineMR) view() ([]byte, uint64, uint64, STag) {
	r := (*MR)(e).reg()
	return r.Buf, r.Base, r.Len(), r.STag()
}

func (e *engineMR) valid() bool { return (*MR)(e).reg().Valid() }

func (e *engineMR) dereg() (bool, error) {
	if e.fr != nil {
		return e.fr.Release(), nil
	}
	return e.pd.dev.mem.DeregisterUnbound(e.r), nil
}

// stag returns the STag the MR's accessors report.
func (m *MR) stag() STag {
	_, _, _, stag := m.ops.view()
	return stag
}

// view returns the registered bytes (nil when paged), the first byte's
// address and the length.
func (m *MR) view() ([]byte, uint64, uint64) {
	buf, base, n, _ := m.ops.view()
	return buf, base, n
}

// reg returns the region the MR's STag names now (embedded).
func (m *MR) reg() *iwarp.Region {
	if m.fr != nil {
		return m.fr.Current()
	}
	return m.r
}

// PD returns the MR's protection domain.
func (m *MR) PD() *PD { return m.pd }

// Bytes returns the registered memory; nil for a fast-register MR mapped
// over pages that do not follow one another in memory (see MapPages).
func (m *MR) Bytes() []byte {
	b, _, _ := m.view()
	return b
}

// Len returns the region's length.
func (m *MR) Len() int {
	_, _, n := m.view()
	return int(n)
}

// Addr returns the address of the first byte as SGEs and remote peers use
// it: the virtual address, or 0 for a zero-based region.
func (m *MR) Addr() uint64 {
	_, base, _ := m.view()
	return base
}

// LKey returns the STag for local use (SGEs).
func (m *MR) LKey() STag { return m.stag() }

// RKey returns the STag for remote access.
func (m *MR) RKey() STag { return m.stag() }

// Valid reports whether the MR can still be used (a Send with Invalidate,
// a Local Invalidate or Dereg invalidates it).
// On a device of a service it reports whether Dereg has run (an
// invalidation by the peer is not seen), except for a fast-register MR,
// whose state it asks the service for.
func (m *MR) Valid() bool { return m.ops.valid() }

// SGE returns the scatter-gather element for bytes [off, off+n) of the MR.
// It panics if the range is outside the MR, like slicing does.
func (m *MR) SGE(off, n int) SGE {
	_, base, l := m.view()
	if off < 0 || n < 0 || uint64(off+n) > l {
		panic(fmt.Sprintf("verbs: SGE [%d:%d] outside MR of %d bytes", off, off+n, l))
	}
	return SGE{Addr: base + uint64(off), Length: uint32(n), LKey: m.stag()}
}

// Remote returns the descriptor a peer needs to access the whole MR.
func (m *MR) Remote() RemoteBuf {
	_, base, l := m.view()
	return RemoteBuf{Addr: base, Len: l, RKey: m.stag()}
}

// Dereg invalidates the MR and frees its STag. It is idempotent. It fails
// with ErrBusy, doing nothing, while memory windows are bound to the MR
// (ibv_dereg_mr's EBUSY): deallocate or invalidate them first.
func (m *MR) Dereg() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.freed {
		return nil
	}
	ok, err := m.ops.dereg()
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: memory windows are bound to the MR", ErrBusy)
	}
	m.freed = true
	m.pd.mu.Lock()
	m.pd.mrs--
	m.pd.mu.Unlock()
	return nil
}

// RemoteBuf describes a peer's memory: address, length and rkey. It is what
// applications exchange (in private data or a Send) before RDMA Read/Write.
type RemoteBuf struct {
	Addr uint64
	Len  uint64
	RKey STag
}

// RemoteBufSize is the size of a marshalled RemoteBuf.
const RemoteBufSize = 20

// Slice returns the descriptor of bytes [off, off+n) of r.
func (r RemoteBuf) Slice(off, n uint64) (RemoteBuf, error) {
	if off > r.Len || n > r.Len-off {
		return RemoteBuf{}, fmt.Errorf("%w: [%d:+%d] outside remote buffer of %d bytes", ErrInvalidArgument, off, n, r.Len)
	}
	return RemoteBuf{Addr: r.Addr + off, Len: n, RKey: r.RKey}, nil
}

// AppendBinary appends the 20-byte big-endian encoding addr|len|rkey.
func (r RemoteBuf) AppendBinary(b []byte) ([]byte, error) {
	b = binary.BigEndian.AppendUint64(b, r.Addr)
	b = binary.BigEndian.AppendUint64(b, r.Len)
	return binary.BigEndian.AppendUint32(b, r.RKey), nil
}

// MarshalBinary returns the 20-byte encoding.
func (r RemoteBuf) MarshalBinary() ([]byte, error) {
	return r.AppendBinary(make([]byte, 0, RemoteBufSize))
}

// ErrBadRemoteBuf reports a malformed RemoteBuf encoding.
var ErrBadRemoteBuf = errors.New("verbs: remote buffer descriptor must be 20 bytes")

// UnmarshalBinary decodes the 20-byte encoding.
func (r *RemoteBuf) UnmarshalBinary(b []byte) error {
	if len(b) != RemoteBufSize {
		return ErrBadRemoteBuf
	}
	r.Addr = binary.BigEndian.Uint64(b)
	r.Len = binary.BigEndian.Uint64(b[8:])
	r.RKey = binary.BigEndian.Uint32(b[16:])
	return nil
}

// Close releases the PD. It fails while MRs or QPs still use it.
func (pd *PD) Close() error {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.mrs > 0 || pd.qps > 0 || pd.srqs > 0 {
		return fmt.Errorf("%w: PD still has %d MRs, %d QPs and %d SRQs", ErrBusy, pd.mrs, pd.qps, pd.srqs)
	}
	if !pd.closed {
		if err := pd.ops.destroy(); err != nil {
			return err
		}
	}
	pd.closed = true
	return nil
}

func (pd *PD) remoteRegMRCounted(buf []byte, iova uint64, acc Access) (*MR, error) {
	pd.mu.Lock()
	closed := pd.closed
	pd.mu.Unlock()
	if closed {
		return nil, net.ErrClosed
	}
	m, err := pd.remoteRegMR(buf, iova, acc)
	if err != nil {
		return nil, err
	}
	pd.mu.Lock()
	pd.mrs++
	pd.mu.Unlock()
	return m, nil
}

// Buffer is memory for registration that AllocBuffer made.
type Buffer struct {
	b      []byte
	shared *zerocopy.Buffer // on a device of a service
}

// AllocBuffer returns n bytes of zeroed memory that a PD of d can register:
// Go memory on an embedded device, and on a device of a service a sealed
// memfd that the service maps too (zerocopy.AllocShared), as RegMR there
// requires. Code that allocates this way runs on either kind of device.
func (d *Device) AllocBuffer(n int) (*Buffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("%w: a buffer of %d bytes", ErrInvalidArgument, n)
	}
	return d.ops.allocBuffer(n)
}

func (cl *client) allocBuffer(n int) (*Buffer, error) {
	m, err := zerocopy.AllocShared("rdmatap-"+cl.dev.Name(), n)
	if err != nil {
		return nil, err
	}
	return &Buffer{b: m.Bytes()[:n], shared: m}, nil
}

// Bytes returns the buffer's memory.
func (b *Buffer) Bytes() []byte { return b.b }

// Close frees the buffer; deregister its MRs first. It is idempotent.
func (b *Buffer) Close() error {
	if b.shared != nil {
		return b.shared.Close()
	}
	return nil
}
