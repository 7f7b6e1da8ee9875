package iwarp

import (
	"crypto/rand"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Access is a set of memory access rights (the ibv_access_flags values).
type Access uint32

// Access rights.
const (
	AccessLocalWrite   Access = 1
	AccessRemoteWrite  Access = 2
	AccessRemoteRead   Access = 4
	AccessRemoteAtomic Access = 8
	AccessMWBind       Access = 16
	// AccessZeroBased makes the region's Tagged Offsets start at 0 instead
	// of the buffer's virtual address.
	AccessZeroBased Access = 32
)

// RegionKind says what kind of memory object an STag names. Only memory
// regions exist today; the field leaves room for memory windows and
// fast-register MRs, which share the STag space (RFC 5040 §5.2).
type RegionKind uint8

// Region kinds.
const (
	KindMR RegionKind = iota
	KindMW
	KindFRMR
)

// Region is registered memory as the protocol engine sees it: the bytes,
// the Tagged Offset of the first byte, the access rights and the protection
// domain. A Region is immutable once registered, except for its validity.
type Region struct {
	Buf    []byte
	Base   uint64 // TO of Buf[0]
	Access Access
	PD     uint32
	Kind   RegionKind
	stag   uint32
	valid  atomic.Bool
}

// STag returns the region's Steering Tag (24-bit index, 8-bit key).
func (r *Region) STag() uint32 { return r.stag }

// Valid reports whether the region can still be accessed.
func (r *Region) Valid() bool { return r.valid.Load() }

// Invalidate makes the STag unusable (Send with Invalidate, deregistration).
func (r *Region) Invalidate() { r.valid.Store(false) }

// Slice returns the bytes [to, to+n) of the region, or ok=false when that
// range is not inside the region (the base-and-bounds check).
func (r *Region) Slice(to uint64, n uint64) ([]byte, bool) {
	if to < r.Base {
		return nil, false
	}
	off := to - r.Base
	size := uint64(len(r.Buf))
	if off > size || n > size-off {
		return nil, false
	}
	return r.Buf[off : off+n], true
}

// BufferAddr returns the virtual address of b's first byte, the default TO
// base of a region (libibverbs addresses registered memory by VA).
func BufferAddr(b []byte) uint64 {
	if cap(b) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}

// MemTable maps STags to regions. One table serves a device: every QP of
// the device looks STags up in it. The STag is a 24-bit index and an 8-bit
// key (as Linux siw does); index 0 is never used, so STag 0 and the STag 1
// that siw puts in zero-length RTR Writes are never valid.
type MemTable struct {
	mu    sync.RWMutex
	slots []*Region
	free  []uint32
	keys  uint32 // key generator state
}

// MaxRegions is the number of STag indices (24 bits, minus index 0).
const MaxRegions = 1<<24 - 1

// NewMemTable returns an empty table.
func NewMemTable() *MemTable {
	var seed [4]byte
	_, _ = rand.Read(seed[:])
	return &MemTable{slots: make([]*Region, 1, 64), keys: binary.LittleEndian.Uint32(seed[:])}
}

// Register adds r to the table, assigns its STag and marks it valid.
func (t *MemTable) Register(r *Region) (uint32, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var idx uint32
	if n := len(t.free); n > 0 {
		idx = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		if len(t.slots) > MaxRegions {
			return 0, ErrNoResources
		}
		idx = uint32(len(t.slots))
		t.slots = append(t.slots, nil)
	}
	t.keys = t.keys*1664525 + 1013904223
	key := t.keys >> 24
	r.stag = idx<<8 | key
	r.valid.Store(true)
	t.slots[idx] = r
	return r.stag, nil
}

// Deregister invalidates the region and frees its index.
func (t *MemTable) Deregister(r *Region) {
	t.mu.Lock()
	defer t.mu.Unlock()
	idx := r.stag >> 8
	if idx == 0 || int(idx) >= len(t.slots) || t.slots[idx] != r {
		return
	}
	r.Invalidate()
	t.slots[idx] = nil
	t.free = append(t.free, idx)
}

// Lookup returns the valid region named by stag, or nil.
func (t *MemTable) Lookup(stag uint32) *Region {
	idx := stag >> 8
	t.mu.RLock()
	var r *Region
	if int(idx) < len(t.slots) {
		r = t.slots[idx]
	}
	t.mu.RUnlock()
	if r == nil || r.stag != stag || !r.valid.Load() {
		return nil
	}
	return r
}

// Len returns the number of registered regions.
func (t *MemTable) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.slots) - 1 - len(t.free)
}
