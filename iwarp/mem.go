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
//
// Lookups, one per tagged FPDU, take no lock: the table is a list of
// fixed-size chunks of atomic slots that only ever grows.
type MemTable struct {
	mu     sync.Mutex // serialises Register and Deregister
	chunks atomic.Pointer[[]*memChunk]
	next   uint32 // next never-used index
	free   []uint32
	keys   uint32 // key generator state
	n      int
}

const memChunkSize = 4096

type memChunk [memChunkSize]atomic.Pointer[Region]

// MaxRegions is the number of STag indices (24 bits, minus index 0).
const MaxRegions = 1<<24 - 1

// NewMemTable returns an empty table.
func NewMemTable() *MemTable {
	var seed [4]byte
	_, _ = rand.Read(seed[:])
	t := &MemTable{next: 1, keys: binary.LittleEndian.Uint32(seed[:])}
	cs := []*memChunk{new(memChunk)}
	t.chunks.Store(&cs)
	return t
}

func (t *MemTable) slot(idx uint32) *atomic.Pointer[Region] {
	cs := *t.chunks.Load()
	c := idx / memChunkSize
	if int(c) >= len(cs) {
		return nil
	}
	return &cs[c][idx%memChunkSize]
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
		if t.next > MaxRegions {
			return 0, ErrNoResources
		}
		idx = t.next
		t.next++
		if cs := *t.chunks.Load(); int(idx/memChunkSize) >= len(cs) {
			grown := append(append([]*memChunk(nil), cs...), new(memChunk))
			t.chunks.Store(&grown)
		}
	}
	t.keys = t.keys*1664525 + 1013904223
	key := t.keys >> 24
	r.stag = idx<<8 | key
	r.valid.Store(true)
	t.slot(idx).Store(r)
	t.n++
	return r.stag, nil
}

// Deregister invalidates the region and frees its index.
func (t *MemTable) Deregister(r *Region) {
	t.mu.Lock()
	defer t.mu.Unlock()
	idx := r.stag >> 8
	s := t.slot(idx)
	if idx == 0 || s == nil || s.Load() != r {
		return
	}
	r.Invalidate()
	s.Store(nil)
	t.free = append(t.free, idx)
	t.n--
}

// Lookup returns the valid region named by stag, or nil.
func (t *MemTable) Lookup(stag uint32) *Region {
	s := t.slot(stag >> 8)
	if s == nil {
		return nil
	}
	r := s.Load()
	if r == nil || r.stag != stag || !r.valid.Load() {
		return nil
	}
	return r
}

// Len returns the number of registered regions.
func (t *MemTable) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}
