package iwarp

import (
	"errors"
	"sync/atomic"
)

// Memory objects that are registered again and again under one STag
// index: fast-register MRs (fastreg.go) and memory windows (mw.go).
//
// Such an object holds its STag index from allocation to release. Each
// registration (REG_MR) or binding (BIND_MW, BindMW) makes a new Region
// with the object's index and a new key, and puts it in the index's slot;
// the previous one stays invalid for good. A receive path that looked up
// the previous registration and has not acquired it yet finds it invalid
// when it does, and refuses the FPDU as one naming an invalid STag: an
// access checked against one registration never lands in the next one's
// memory. The cost is one small allocation per registration.
//
// Keys. A regular MR's key is drawn at random among the keys its index
// never had (MemTable.Register). A fast-register MR's key is the
// consumer's choice, as in the verbs (ib_reg_wr.key, ib_inc_rkey), and a
// type 2 window's too (ibv_inc_rkey before IBV_WR_BIND_MW); a type 1
// window's key is advanced by one at each bind (ibv_bind_mw). The engine
// keeps what protection it can:
//   - the first key of an object is drawn at random among the keys its
//     index never had, like a regular MR's;
//   - a registration or binding must change the key (an immediate repeat
//     would let a peer holding the previous STag reach the new mapping);
//   - every key an object used is recorded in its index's key history,
//     so that after the object is released no later registration of the
//     index draws one of them (and an index that has had all 256 keys is
//     retired).
//
// Within one object's life, keys do repeat: its index has only 256 of
// them. That is the verbs' contract (the consumer rotates the key and
// invalidates before reusing a mapping).

// MWType is a memory window's type (ibv_mw_type).
type MWType uint8

// Memory window types.
const (
	// MWType1 is bound by a verb (ibv_bind_mw) that the QP executes in
	// send queue order; any QP of the window's PD may use it; it cannot
	// be invalidated (a zero-length bind unbinds it).
	MWType1 MWType = 1
	// MWType2 is bound by a work request (IBV_WR_BIND_MW) with the key
	// the consumer chooses; only the QP that bound it may use it (type
	// 2B); Local Invalidate or a Send with Invalidate invalidates it.
	MWType2 MWType = 2
)

// Errors of memory registration work requests.
var (
	// ErrMemFreed: the memory object was released.
	ErrMemFreed = errors.New("iwarp: memory object released")
	// ErrMemBusy: the memory object is still valid (a type 2 window or a
	// fast-register MR must be invalidated before it is bound again), or
	// an MR still has windows bound to it.
	ErrMemBusy = errors.New("iwarp: memory object still valid or in use")
	// ErrSameKey: a registration or binding must change the STag's key.
	ErrSameKey = errors.New("iwarp: STag key not changed")
	// ErrBadKey: the STag of a registration or binding names another
	// index than the object's.
	ErrBadKey = errors.New("iwarp: STag index does not match the memory object")
	// ErrNoParent: the MR a window is bound to is not valid.
	ErrNoParent = errors.New("iwarp: MR not valid")
)

// memObject is what fast-register MRs and windows share: an STag index
// held for life and the registration currently in it.
//
// It has no mutex of its own: mem, idx, pd, kind and serial are set by
// reserve and never change; cur is an atomic, stored under the table's
// lock (MemTable.mu) and loaded without it; used and freed are guarded by
// the table's lock (not annotated: the methods that touch them lock the
// table they are given, which checklocks cannot tie to o.mem).
type memObject struct {
	mem  *MemTable
	idx  uint32
	pd   uint32
	kind RegionKind
	// serial tells this object from a later one that takes its index
	// (memRef).
	serial uint64
	cur    atomic.Pointer[Region] // the current or last registration; never nil
	// Guarded by mem.mu:
	used  bool // a registration has been made
	freed bool
}

// STag returns the STag of the current (or last) registration.
func (o *memObject) STag() uint32 { return o.cur.Load().stag }

// Current returns the current (or last) registration; it may be invalid.
func (o *memObject) Current() *Region { return o.cur.Load() }

// reserve gives o, the memory object of owner (a *FastRegMR or a
// *Window), an index and a first key (drawn like a regular MR's), under
// which an invalid placeholder region stands.
func (t *MemTable) reserve(o *memObject, owner any, kind RegionKind, pd uint32) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	idx, err := t.index()
	if err != nil {
		return err
	}
	c := t.chunk(idx)
	key := c.keys[idx%memChunkSize].newKey()
	r := &Region{PD: pd, Kind: kind, stag: idx<<8 | key}
	c.regs[idx%memChunkSize].Store(r)
	t.serial++
	o.mem, o.idx, o.pd, o.kind, o.serial = t, idx, pd, kind, t.serial
	o.cur.Store(r)
	if t.owners == nil {
		t.owners = map[uint32]any{}
	}
	t.owners[idx] = owner
	t.n++
	return nil
}

// memRef names a memory object by value: its index and serial. A queued
// work request names its fast-register MR or window this way rather than
// keep the pointer the poster gave: a pointer read from a WR and kept
// would make the Go compiler put every SGL a caller builds for PostSend
// on the heap (an allocation per post).
type memRef struct {
	idx    uint32
	serial uint64
}

// ref returns o's memRef.
func (o *memObject) ref() memRef { return memRef{o.idx, o.serial} }

// owner returns the object ref names (a *FastRegMR or a *Window), or nil
// once it was released.
func (t *MemTable) owner(ref memRef) any {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch o := t.owners[ref.idx].(type) {
	case *FastRegMR:
		if o.serial == ref.serial {
			return o
		}
	case *Window:
		if o.serial == ref.serial {
			return o
		}
	}
	return nil
}

// rebind makes r the registration of o under stag (o's index, a new key)
// and marks it valid. The previous registration must be invalid unless
// replace is set; with replace, it is invalidated once r is in place, and
// returned so that the caller fences it outside the table's lock. A
// window's r.parent must be a valid MR in the table; it counts r among its
// bound windows.
func (t *MemTable) rebind(o *memObject, r *Region, stag uint32, replace bool) (old *Region, err error) {
	if stag>>8 != o.idx {
		return nil, ErrBadKey
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if o.freed {
		return nil, ErrMemFreed
	}
	old = o.cur.Load()
	if old.valid.Load() && !replace {
		return nil, ErrMemBusy
	}
	if o.used && stag == old.stag {
		return nil, ErrSameKey
	}
	if p := r.parent; p != nil {
		s := t.slot(p.stag >> 8)
		if !p.valid.Load() || s == nil || s.Load() != p {
			return nil, ErrNoParent
		}
		p.windows.Add(1)
	}
	h := &t.chunk(o.idx).keys[o.idx%memChunkSize]
	if k := stag & 0xff; h.used[k/64]&(1<<(k%64)) == 0 {
		h.used[k/64] |= 1 << (k % 64)
		h.n++
	}
	r.stag = stag
	r.valid.Store(true)
	t.slot(o.idx).Store(r)
	o.cur.Store(r)
	o.used = true
	old.invalidate()
	return old, nil
}

// release frees o's index: its registration is invalidated and, once no
// access to it is in progress, release returns (see Deregister). It does
// nothing and reports false while windows are bound to the registration.
func (t *MemTable) release(o *memObject) bool {
	t.mu.Lock()
	if o.freed || o.mem == nil {
		t.mu.Unlock()
		return true
	}
	r := o.cur.Load()
	if r.windows.Load() > 0 {
		t.mu.Unlock()
		return false
	}
	o.freed = true
	delete(t.owners, o.idx)
	r.invalidate()
	t.slot(o.idx).Store(nil)
	if t.chunk(o.idx).keys[o.idx%memChunkSize].n < 256 {
		t.free = append(t.free, o.idx)
	}
	t.n--
	t.mu.Unlock()
	r.fence()
	return true
}

// invalidateUnbound invalidates r (Local Invalidate, Send with
// Invalidate) unless windows are bound to it, and then waits for the
// accesses in progress to end. Under the table's lock, a bind either is
// counted first or finds r invalid.
func (t *MemTable) invalidateUnbound(r *Region) bool {
	t.mu.Lock()
	if r.windows.Load() > 0 {
		t.mu.Unlock()
		return false
	}
	r.invalidate()
	t.mu.Unlock()
	r.fence()
	return true
}

// DeregisterUnbound is Deregister for a regular MR, refused (false, and
// nothing done) while memory windows are bound to it: the windows would
// otherwise grant access to memory the consumer took back (the verbs
// refuse ibv_dereg_mr then too).
func (t *MemTable) DeregisterUnbound(r *Region) bool {
	// The check and the removal share the table's lock with rebind, so a
	// bind either is counted before or finds the MR gone.
	return t.deregister(r, true)
}

// lookupAny returns the region stag names, valid or not (Local Invalidate
// of an invalid fast-register MR is no error).
func (t *MemTable) lookupAny(stag uint32) *Region {
	s := t.slot(stag >> 8)
	if s == nil {
		return nil
	}
	r := s.Load()
	if r == nil || r.stag != stag {
		return nil
	}
	return r
}
