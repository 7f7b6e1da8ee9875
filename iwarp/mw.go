package iwarp

import (
	"fmt"
	"sync/atomic"
)

// Window is a memory window (ibv_alloc_mw): an STag that, once bound,
// grants remote access to part of an MR, with rights no wider than the
// MR's. A window holds its STag index from allocation and starts unbound
// (invalid).
//
// RFC 5040's checks (and RFC 5042's rule that a peer reaches only what it
// was granted) apply as the receive path makes them for any STag: the
// window's PD, its remote access rights, its bounds (the window, not the
// MR) and its validity. A type 2 window adds its QP: used by the peer of
// any other QP, it is refused as "STag not associated with RDMAP Stream".
//
// Addressing: a window is VA-based by default (its first byte's Tagged
// Offset is its address in the MR's TO space), or zero-based with
// AccessZeroBased (its first byte has TO 0).
type Window struct {
	memObject
	typ MWType
	// next is the key of a type 1 window's next binding (ibv_bind_mw
	// advances the key by one).
	next atomic.Uint32
}

// MWBind says where and how a window is bound (ibv_mw_bind_info): Length
// bytes from Addr of the MR whose STag is MR (Addr in that MR's TO space),
// with Access (remote read, write, atomic; AccessZeroBased for a
// zero-based window).
type MWBind struct {
	MR     uint32
	Addr   uint64
	Length uint64
	Access Access
}

// NewWindow allocates a window of protection domain pd.
func NewWindow(t *MemTable, pd uint32, typ MWType) (*Window, error) {
	if typ != MWType1 && typ != MWType2 {
		return nil, fmt.Errorf("%w: memory window type %d", ErrInvalidWR, typ)
	}
	w := &Window{typ: typ}
	if err := t.reserve(&w.memObject, w, KindMW, pd); err != nil {
		return nil, err
	}
	w.next.Store(w.STag())
	return w, nil
}

// PD returns the window's protection domain.
func (w *Window) PD() uint32 { return w.pd }

// Type returns the window's type.
func (w *Window) Type() MWType { return w.typ }

// Release unbinds the window and frees its STag index.
func (w *Window) Release() { w.mem.release(&w.memObject) }

// NextType1Key returns the STag a type 1 window's next binding takes
// (the key advanced by one, as ibv_bind_mw does) and reserves it.
func (w *Window) NextType1Key() uint32 {
	for {
		cur := w.next.Load()
		n := cur&^0xff | (cur+1)&0xff
		if w.next.CompareAndSwap(cur, n) {
			return n
		}
	}
}

// windowAccess are the rights a window may grant.
const windowAccess = AccessRemoteRead | AccessRemoteWrite | AccessRemoteAtomic | AccessZeroBased

// bind binds w for the QP qp under stag; it runs in send queue order.
func (w *Window) bind(qp *QP, b *MWBind, stag uint32) error {
	t := w.mem
	if w.typ == MWType1 && b.Length == 0 {
		// A zero-length bind unbinds a type 1 window.
		r := w.cur.Load()
		r.invalidate()
		r.fence()
		return nil
	}
	mr := t.Lookup(b.MR)
	switch {
	case mr == nil || mr.Kind == KindMW:
		return fmt.Errorf("%w: STag %#x names no valid MR", ErrNoParent, b.MR)
	case mr.PD != w.pd:
		return fmt.Errorf("%w: the MR belongs to another protection domain", ErrInvalidWR)
	case mr.Access&AccessMWBind == 0:
		return fmt.Errorf("%w: the MR was not registered with MW_BIND access", ErrInvalidWR)
	case b.Access&^windowAccess != 0:
		return fmt.Errorf("%w: window access %#x", ErrInvalidWR, uint32(b.Access))
	case b.Access&(AccessRemoteRead|AccessRemoteWrite|AccessRemoteAtomic)&^mr.Access != 0:
		// RFC 5042: a window grants no more than its MR has.
		return fmt.Errorf("%w: window access %#x exceeds the MR's %#x", ErrInvalidWR, uint32(b.Access), uint32(mr.Access))
	}
	if b.Addr+b.Length < b.Addr {
		return fmt.Errorf("%w: window wraps", ErrInvalidWR)
	}
	off, ok := mr.InBounds(b.Addr, b.Length)
	if !ok {
		return fmt.Errorf("%w: window [%#x, +%d) outside the MR", ErrInvalidWR, b.Addr, b.Length)
	}
	r := &Region{Base: b.Addr, Access: b.Access, PD: w.pd, Kind: KindMW, MWType: w.typ, parent: mr}
	if mr.Paged() {
		r.pages = mr.pages.sub(off, b.Length) // the window's part of the pages
	} else {
		r.Buf = mr.Buf[off : off+b.Length]
	}
	if b.Access&AccessZeroBased != 0 {
		r.Base = 0
	}
	if w.typ == MWType2 {
		r.QP, r.QPOnly = qp.cfg.Num, true
	}
	old, err := t.rebind(&w.memObject, r, stag, w.typ == MWType1)
	if err != nil {
		return err
	}
	old.fence()
	if w.typ == MWType2 {
		qp.trackWindow(r)
	}
	return nil
}

// BindMW1 binds a type 1 window (ibv_bind_mw): it posts the bind to the
// send queue, where it executes in order, and returns the STag the
// binding takes (the window's key advanced by one; the current STag for a
// zero-length bind, which unbinds). The completion (CompBindMW) reports
// the outcome when the WR is signaled or fails.
func (qp *QP) BindMW1(id uint64, flags SendFlags, w *Window, b MWBind) (uint32, error) {
	if w == nil {
		return 0, fmt.Errorf("%w: BindMW without a window", ErrInvalidWR)
	}
	stag := w.STag()
	if b.Length > 0 {
		stag = w.NextType1Key()
	}
	wr := SendWR{ID: id, Op: wrBindMW1, Flags: flags, MW: w, RKey: stag, Bind: b}
	if _, err := qp.PostSend(wr); err != nil {
		return 0, err
	}
	return stag, nil
}
