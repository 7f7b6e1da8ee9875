package iwarp

import (
	"crypto/rand"
	"encoding/binary"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rdmatap/rdmatap/zerocopy"
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

// RegionKind says what kind of memory object an STag names: memory
// regions, fast-register MRs and memory windows share the STag space
// (RFC 5040 §5.2; see fastreg.go and mw.go).
type RegionKind uint8

// Region kinds.
const (
	KindMR RegionKind = iota
	KindMW
	KindFRMR
)

// Region is registered memory as the protocol engine sees it: the bytes,
// the Tagged Offset of the first byte, the access rights and the protection
// domain. A Region is immutable once registered, except for its validity:
// a fast-register MR or a memory window that is registered or bound again
// gets a new Region under its STag index (see MemTable.rebind), so that an
// access checked against one registration can never land in the next.
//
// The engine touches a region's bytes only between a successful acquire and
// its release, and never waits for anything in between (a lock held for
// long, a fence, the network). Invalidation clears valid first and then
// waits for the accesses in progress to end (fence), so once Invalidate or
// MemTable.Deregister returns, no goroutine of the engine touches the bytes
// again: an access that began before sees the region valid and ends, one
// that begins after sees it invalid (valid and users are sequentially
// consistent atomics, so one of the two always sees the other's store).
//
// A Region has no mutex: its exported fields, pages, stag and parent are
// set before the table publishes it (Register, rebind, under MemTable.mu)
// and never change after; valid, users and windows are atomics.
type Region struct {
	// Buf is the region's memory, one run of bytes; it is nil for a
	// region over a page list of separate buffers (see pages, Pieces).
	Buf    []byte
	Base   uint64 // TO of the first byte
	Access Access
	PD     uint32
	Kind   RegionKind
	// QP, with QPOnly, is the only QP whose peer may use the STag: a type
	// 2 memory window is associated with the QP that bound it.
	QP     uint32
	QPOnly bool
	// MWType is a window's type (KindMW only).
	MWType MWType

	// pages, when not nil, holds the region's bytes instead of Buf.
	pages *pageList

	stag  uint32
	valid atomic.Bool
	users atomic.Int32 // accesses in progress
	// parent is the MR a window binding lies in; windows counts the valid
	// window bindings that lie in this region (see MemTable.rebind).
	parent  *Region
	windows atomic.Int32
}

// Associated reports whether a peer on the QP num of protection domain pd
// may use the region: same PD, and for a type 2 window, the QP it is bound
// to (RFC 5040's "STag not associated with RDMAP Stream" otherwise).
func (r *Region) Associated(pd, num uint32) bool {
	return r.PD == pd && (!r.QPOnly || r.QP == num)
}

// STag returns the region's Steering Tag (24-bit index, 8-bit key).
func (r *Region) STag() uint32 { return r.stag }

// Valid reports whether the region can still be accessed.
func (r *Region) Valid() bool { return r.valid.Load() }

// Invalidate makes the STag unusable (Send with Invalidate) and returns once
// no access to the region's bytes is in progress. The caller must hold no
// access itself (see Region).
func (r *Region) Invalidate() {
	r.invalidate()
	r.fence()
}

// invalidate clears valid; the first call also ends a window binding's
// count in its MR.
func (r *Region) invalidate() {
	if r.valid.Swap(false) && r.parent != nil {
		r.parent.windows.Add(-1)
	}
}

// acquire starts an access to the region's bytes; false means the region
// is no longer valid and its bytes must not be touched.
func (r *Region) acquire() bool {
	r.users.Add(1)
	if r.valid.Load() {
		return true
	}
	r.users.Add(-1)
	return false
}

// release ends an access that acquire started.
func (r *Region) release() { r.users.Add(-1) }

// fence waits until no access is in progress. An access lasts one copy of
// at most a netstack chunk, so the wait is short: yield first, then sleep.
func (r *Region) fence() {
	for i := 0; r.users.Load() != 0; i++ {
		if i < 100 {
			runtime.Gosched()
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// holds is the set of regions one goroutine of the engine is accessing
// (the RX path during one read of the stream, the TX path during one
// Payloader read). Taking a region already held costs a compare; drop
// ends every access at once.
type holds struct {
	regs []*Region
}

// hold acquires r unless it is already held; false: r is invalid.
func (h *holds) hold(r *Region) bool {
	for _, x := range h.regs {
		if x == r {
			return true
		}
	}
	if !r.acquire() {
		return false
	}
	h.regs = append(h.regs, r)
	return true
}

// holdAll acquires every region of rs; false: one is invalid (those
// acquired stay held until drop).
func (h *holds) holdAll(rs []*Region) bool {
	for _, r := range rs {
		if !h.hold(r) {
			return false
		}
	}
	return true
}

// drop releases every held region.
func (h *holds) drop() {
	for i, r := range h.regs {
		r.release()
		h.regs[i] = nil
	}
	h.regs = h.regs[:0]
}

// Len returns the region's length in bytes.
func (r *Region) Len() uint64 {
	if r.pages != nil {
		return r.pages.n
	}
	return uint64(len(r.Buf))
}

// Paged reports whether the region's bytes are a page list of separate
// buffers (Buf is nil): reach them with Pieces.
func (r *Region) Paged() bool { return r.pages != nil }

// InBounds returns the offset in the region of TO to, or ok=false when
// [to, to+n) is not inside the region (the base-and-bounds check).
func (r *Region) InBounds(to, n uint64) (uint64, bool) {
	if to < r.Base {
		return 0, false
	}
	off := to - r.Base
	size := r.Len()
	if off > size || n > size-off {
		return 0, false
	}
	return off, true
}

// Slice returns the bytes [to, to+n) of the region, or ok=false when that
// range is not inside the region (the base-and-bounds check) or, in a
// region over separate pages, not inside one page (see Pieces).
func (r *Region) Slice(to uint64, n uint64) ([]byte, bool) {
	off, ok := r.InBounds(to, n)
	if !ok {
		return nil, false
	}
	if r.pages != nil {
		return r.pages.slice(off, n)
	}
	return r.Buf[off : off+n], true
}

// copyOut copies bytes [to, to+n) of the region, which the caller has
// checked lie inside it, into dst and returns how many it copied.
func (r *Region) copyOut(dst []byte, to, n uint64) int {
	off := to - r.Base
	if r.pages == nil {
		return copy(dst, r.Buf[off:off+n])
	}
	k := 0
	i, o := r.pages.locate(off)
	for n > 0 && k < len(dst) {
		b := r.pages.pieces[i][o:]
		if uint64(len(b)) > n {
			b = b[:n]
		}
		c := copy(dst[k:], b)
		k += c
		n -= uint64(c)
		i, o = i+1, 0
	}
	return k
}

// Pieces appends to dst the bytes [to, to+n) of the region, in as many
// pieces as the pages they lie in (one for a region of one run), or
// returns ok=false when the range is not inside the region.
func (r *Region) Pieces(dst zerocopy.SGList, to, n uint64) (zerocopy.SGList, bool) {
	off, ok := r.InBounds(to, n)
	switch {
	case !ok:
		return dst, false
	case r.pages != nil:
		return r.pages.appendPieces(dst, off, n), true
	case n > 0:
		dst = append(dst, r.Buf[off:off+n])
	}
	return dst, true
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
// STags are hard to predict and are not recycled while a stale one may
// still be in use (RFC 5042, on STag exposure): each registration draws its key
// at random (crypto/rand) among the keys its index has not had yet, so an
// STag never names two registrations; an index that has had all 256 keys
// is retired; and a freed index rests in a FIFO behind memQuarantine
// others before it is used again, so a peer that kept an old STag finds
// its index empty for a long while and then under a key it cannot know.
//
// Lookups, one per tagged FPDU, take no lock: the table is a list of
// fixed-size chunks of atomic slots that only ever grows.
//
// mu serialises every change: Register, Deregister, and the memory
// objects' reserve, rebind, release and invalidateUnbound. It guards the
// index allocator and the counters below, each chunk's key histories
// (memChunk.keys) and the memory objects' used and freed flags; slots
// and the chunk list are atomics, stored under it and loaded without it.
// mu is a leaf: nothing is locked under it, and the fences that wait for
// accesses in progress run after it is released. It is taken inside
// QP.txMu (registration and invalidation work requests), QP.rxMu (a
// Send with Invalidate, a Read with local invalidate), and verbs' PD.mu
// and MR.mu (registration, Dereg); the package's Locks section has the
// whole order.
type MemTable struct {
	mu     sync.Mutex
	chunks atomic.Pointer[[]*memChunk]
	// +checklocks:mu
	next uint32 // next never-used index
	// +checklocks:mu
	free []uint32 // freed indices, oldest first from freeHead
	// +checklocks:mu
	freeHead int
	// +checklocks:mu
	n int
	// owners are the fast-register MRs and windows by index, serial the
	// last serial given to one (memRef).
	// +checklocks:mu
	owners map[uint32]any
	// +checklocks:mu
	serial uint64
}

const memChunkSize = 4096

type memChunk struct {
	regs [memChunkSize]atomic.Pointer[Region]
	keys [memChunkSize]keyHistory // guarded by MemTable.mu
}

// keyHistory is the set of keys an index has had.
type keyHistory struct {
	used [4]uint64 // bit k: key k was used
	n    uint16
}

// memQuarantine is how many freed indices wait ahead of a newly freed one
// before it is used again; until the free list is that long, new indices
// are taken instead.
const memQuarantine = 4096

// MaxRegions is the number of STag indices (24 bits, minus index 0).
const MaxRegions = 1<<24 - 1

// NewMemTable returns an empty table.
func NewMemTable() *MemTable {
	t := &MemTable{next: 1}
	cs := []*memChunk{new(memChunk)}
	t.chunks.Store(&cs)
	return t
}

func (t *MemTable) chunk(idx uint32) *memChunk {
	cs := *t.chunks.Load()
	c := idx / memChunkSize
	if int(c) >= len(cs) {
		return nil
	}
	return cs[c]
}

func (t *MemTable) slot(idx uint32) *atomic.Pointer[Region] {
	c := t.chunk(idx)
	if c == nil {
		return nil
	}
	return &c.regs[idx%memChunkSize]
}

// index returns the index for a new registration; t.mu is held.
// +checklocks:t.mu
func (t *MemTable) index() (uint32, error) {
	if len(t.free)-t.freeHead > memQuarantine || t.next > MaxRegions && t.freeHead < len(t.free) {
		idx := t.free[t.freeHead]
		t.freeHead++
		if t.freeHead >= 1024 && t.freeHead*2 >= len(t.free) {
			t.free = append(t.free[:0], t.free[t.freeHead:]...)
			t.freeHead = 0
		}
		return idx, nil
	}
	if t.next > MaxRegions {
		return 0, ErrNoResources
	}
	idx := t.next
	t.next++
	if cs := *t.chunks.Load(); int(idx/memChunkSize) >= len(cs) {
		grown := append(append([]*memChunk(nil), cs...), new(memChunk))
		t.chunks.Store(&grown)
	}
	return idx, nil
}

// newKey draws a random key that h has not had and records it.
func (h *keyHistory) newKey() uint32 {
	var b [2]byte
	_, _ = rand.Read(b[:])
	k := int(binary.LittleEndian.Uint16(b[:])) % (256 - int(h.n))
	for key := 0; key < 256; key++ {
		if h.used[key/64]&(1<<(key%64)) != 0 {
			continue
		}
		if k == 0 {
			h.used[key/64] |= 1 << (key % 64)
			h.n++
			return uint32(key)
		}
		k--
	}
	panic("iwarp: STag index has no key left") // Deregister retires it first
}

// Register adds r to the table, assigns its STag and marks it valid.
func (t *MemTable) Register(r *Region) (uint32, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	idx, err := t.index()
	if err != nil {
		return 0, err
	}
	c := t.chunk(idx)
	key := c.keys[idx%memChunkSize].newKey()
	r.stag = idx<<8 | key
	r.valid.Store(true)
	c.regs[idx%memChunkSize].Store(r)
	t.n++
	return r.stag, nil
}

// Deregister invalidates the region and frees its index. It returns once
// no access to the region's bytes is in progress: from then on the engine
// never touches them (placement into them and Read Responses from them
// that were under way are cut off, and later FPDUs naming the STag are
// refused). The caller must hold no access itself (see Region).
func (t *MemTable) Deregister(r *Region) { t.deregister(r, false) }

// deregister is Deregister; with unboundOnly it does nothing and reports
// false while windows are bound to r.
func (t *MemTable) deregister(r *Region, unboundOnly bool) bool {
	t.mu.Lock()
	if unboundOnly && r.windows.Load() > 0 {
		t.mu.Unlock()
		return false
	}
	idx := r.stag >> 8
	s := t.slot(idx)
	if idx == 0 || s == nil || s.Load() != r {
		t.mu.Unlock()
		// Not (or no longer) in the table; a Send with Invalidate may
		// have invalidated it, and its fence may still be under way.
		r.Invalidate()
		return true
	}
	r.invalidate()
	s.Store(nil)
	if t.chunk(idx).keys[idx%memChunkSize].n < 256 {
		t.free = append(t.free, idx)
	} // else: every key used, the index is retired
	t.n--
	t.mu.Unlock()
	r.fence()
	return true
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
