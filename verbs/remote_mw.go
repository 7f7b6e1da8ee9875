package verbs

import (
	"context"
	"fmt"
	"sync"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

// remoteMW is the client's side of a window of a service: the binding
// last posted.
//
// Locks: see the package documentation.
type remoteMW struct {
	cl  *client
	h   uint64
	typ MWType

	mu sync.Mutex
	// +checklocks:mu
	buf RemoteBuf
}

func (pd *PD) remoteAllocMW(t MWType) (*MW, error) {
	if t != MWType1 && t != MWType2 {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, fmt.Errorf("%w: window type %d", iwarp.ErrInvalidWR, t))
	}
	cl := pd.dev.client()
	r, err := pd.remoteAlloc(svc.TAllocMW, uint64(t))
	if err != nil {
		return nil, err
	}
	mw := &MW{pd: pd, w: &iwarp.Window{}, ops: &remoteMW{cl: cl, h: r.m.Arg(0), typ: t, buf: RemoteBuf{RKey: STag(r.m.Arg(1))}}}
	cl.mu.Lock()
	cl.mwt[mw.w] = mw
	cl.mu.Unlock()
	pd.mu.Lock()
	pd.mrs++
	pd.mu.Unlock()
	return mw, nil
}

func (r *remoteMW) binding() RemoteBuf {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf
}

// bound records a binding posted.
func (r *remoteMW) bound(stag STag, b *iwarp.MWBind) {
	r.mu.Lock()
	r.buf = RemoteBuf{Addr: b.Addr, Len: b.Length, RKey: stag}
	if Access(b.Access)&AccessZeroBased != 0 {
		r.buf.Addr = 0
	}
	r.mu.Unlock()
}

// remote returns a service's window's side; nil for an embedded window.
func (mw *MW) remote() *remoteMW {
	r, _ := mw.ops.(*remoteMW)
	return r
}

func (r *remoteMW) mwType() MWType { return r.typ }

func (r *remoteMW) rkey() STag { return r.binding().RKey }

func (r *remoteMW) valid() bool {
	rep, err := r.cl.do(context.Background(), svc.TQueryMem, func(b *svc.Builder) { b.Args(r.h) })
	return err == nil && rep.m.Arg(1) != 0
}

func (r *remoteMW) dealloc(mw *MW) {
	r.cl.do(context.Background(), svc.TDeallocMW, func(b *svc.Builder) { b.Args(r.h) })
	r.cl.mu.Lock()
	delete(r.cl.mwt, mw.w)
	r.cl.mu.Unlock()
}

func (rq *remoteQP) bindMW(mw *MW, id uint64, flags SendFlags, b BindInfo) (STag, error) {
	qp := rq.qp
	cl := qp.remote().cl
	if mw.remote() == nil || mw.remote().cl != cl {
		return 0, &PostError{Err: fmt.Errorf("%w: BIND_MW of a window of another device", iwarp.ErrInvalidWR)}
	}
	if mw.pd != qp.pd {
		return 0, &PostError{Err: fmt.Errorf("%w: BIND_MW of a window of another protection domain", iwarp.ErrInvalidWR)}
	}
	if mw.remote().typ != MWType1 {
		return 0, &PostError{Err: fmt.Errorf("%w: a type 2 window is bound by a BIND_MW work request", iwarp.ErrInvalidWR)}
	}
	bi := b.iwarp()
	if b.Access&^windowAccess != 0 {
		return 0, &PostError{Err: fmt.Errorf("%w: window access %#x (remote read, write, atomic, zero-based only)", iwarp.ErrInvalidWR, uint32(bi.Access))}
	}
	select {
	case <-qp.remote().done:
		return 0, &PostError{Err: iwarp.ErrInvalidState}
	default:
	}
	r, err := cl.do(context.Background(), svc.TBindMW, func(bb *svc.Builder) {
		bb.Args(uint64(qp.remote().num), mw.remote().h, id, uint64(flags), uint64(bi.MR), bi.Addr, bi.Length, uint64(bi.Access))
	})
	if err != nil {
		return 0, &PostError{Err: err}
	}
	stag := STag(r.m.Arg(0))
	if bi.Length > 0 {
		mw.remote().bound(stag, &bi)
	}
	return stag, nil
}

// windowAccess are the rights a window may grant (iwarp's).
const windowAccess = AccessRemoteRead | AccessRemoteWrite | AccessRemoteAtomic | AccessZeroBased

// checkLocal checks a memory registration WR as the engine does at post
// time, and returns the service's handle of its MR or window.
func (r *remoteQP) checkLocal(qp *QP, wr *SendWR) (uint64, error) {
	if len(wr.SGL) != 0 || wr.Flags&(Inline|Solicited) != 0 {
		return 0, fmt.Errorf("%w: %v takes no SGEs, inline data or solicited event", iwarp.ErrInvalidWR, wr.Op)
	}
	switch wr.Op {
	case OpRegMR:
		r.cl.mu.Lock()
		m := r.cl.frs[wr.mr]
		r.cl.mu.Unlock()
		switch {
		case m == nil:
			return 0, fmt.Errorf("%w: REG_MR without an MR", iwarp.ErrInvalidWR)
		case m.pd != qp.pd:
			return 0, fmt.Errorf("%w: REG_MR of an MR of another protection domain", iwarp.ErrInvalidWR)
		case wr.RKey>>8 != m.remote().stag>>8:
			return 0, fmt.Errorf("%w: REG_MR key %#x is not of the MR's STag %#x", iwarp.ErrInvalidWR, wr.RKey, m.stag())
		}
		all := AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic | AccessMWBind | AccessZeroBased
		switch {
		case wr.Access&^all != 0:
			return 0, fmt.Errorf("%w: access flags %#x", iwarp.ErrInvalidWR, uint32(wr.Access))
		case wr.Access&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && wr.Access&AccessLocalWrite == 0:
			return 0, fmt.Errorf("%w: remote write and atomic access require local write", iwarp.ErrInvalidWR)
		}
		return m.remote().h, nil
	case OpBindMW:
		r.cl.mu.Lock()
		w := r.cl.mwt[wr.mw]
		r.cl.mu.Unlock()
		switch {
		case w == nil:
			return 0, fmt.Errorf("%w: BIND_MW without a window", iwarp.ErrInvalidWR)
		case w.pd != qp.pd:
			return 0, fmt.Errorf("%w: BIND_MW of a window of another protection domain", iwarp.ErrInvalidWR)
		case w.remote().typ != MWType2:
			return 0, fmt.Errorf("%w: a type 1 window is bound by QP.BindMW, not a work request", iwarp.ErrInvalidWR)
		case wr.RKey>>8 != w.remote().binding().RKey>>8:
			return 0, fmt.Errorf("%w: BIND_MW key %#x is not of the window's STag %#x", iwarp.ErrInvalidWR, wr.RKey, w.remote().binding().RKey)
		case wr.bind.MR == 0:
			return 0, fmt.Errorf("%w: BIND_MW without an MR", iwarp.ErrInvalidWR)
		case Access(wr.bind.Access)&^windowAccess != 0:
			return 0, fmt.Errorf("%w: window access %#x (remote read, write, atomic, zero-based only)", iwarp.ErrInvalidWR, uint32(wr.bind.Access))
		}
		return w.remote().h, nil
	}
	return 0, nil
}

// posted records what a memory registration WR just posted will register.
func (r *remoteQP) posted(wr *SendWR) {
	switch wr.Op {
	case OpRegMR:
		r.cl.mu.Lock()
		m := r.cl.frs[wr.mr]
		r.cl.mu.Unlock()
		m.remote().fr.registered(wr.RKey, wr.Access)
	case OpBindMW:
		r.cl.mu.Lock()
		w := r.cl.mwt[wr.mw]
		r.cl.mu.Unlock()
		w.remote().bound(wr.RKey, &wr.bind)
	}
}
