package service

import (
	"fmt"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

func (x *session) allocMW(b *svc.Builder, m svc.Msg) error {
	pd, err := x.pd(m.Arg(0))
	if err != nil {
		return err
	}
	x.mu.Lock()
	if x.memObjects()+x.mrPending >= x.lim.MRs {
		err := fmt.Errorf("%w: %d MRs", verbs.ErrLimit, x.memObjects())
		x.mu.Unlock()
		return err
	}
	x.mu.Unlock()
	if t := m.Arg(1); t != uint64(verbs.MWType1) && t != uint64(verbs.MWType2) {
		return fmt.Errorf("%w: window type %d", verbs.ErrInvalidArgument, t)
	}
	if err := x.charge(memSmall, "a memory window"); err != nil {
		return err
	}
	mw, err := pd.AllocMW(verbs.MWType(m.Arg(1)))
	if err != nil {
		x.uncharge(memSmall)
		return err
	}
	x.mu.Lock()
	h := x.handle64()
	x.mws[h] = mw
	x.mu.Unlock()
	b.Args(h, uint64(mw.RKey()))
	return nil
}

func (x *session) deallocMW(h uint64) error {
	x.mu.Lock()
	mw := x.mws[h]
	delete(x.mws, h)
	x.mu.Unlock()
	if mw == nil {
		return errNoHandle
	}
	x.uncharge(memSmall)
	return mw.Dealloc()
}

// bindMW is QP.BindMW of a type 1 window: args QP, window, WR ID, flags,
// the MR's STag, address, length, access. The engine checks the MR (it
// must be of the window's PD, which only this client's MRs are).
func (x *session) bindMW(b *svc.Builder, m svc.Msg) error {
	q, err := x.qp(m.Arg(0))
	if err != nil {
		return err
	}
	x.mu.Lock()
	mw := x.mws[m.Arg(1)]
	x.mu.Unlock()
	if mw == nil {
		return errNoHandle
	}
	if m.Arg(3) > 0xff || m.Arg(4) > 1<<32-1 || m.Arg(7) > 1<<32-1 {
		return fmt.Errorf("%w: BIND_MW arguments", verbs.ErrInvalidArgument)
	}
	stag, err := q.iw.BindMW1(m.Arg(2), iwarp.SendFlags(m.Arg(3)), engine.Window(mw),
		iwarp.MWBind{MR: uint32(m.Arg(4)), Addr: m.Arg(5), Length: m.Arg(6), Access: iwarp.Access(m.Arg(7))})
	if err != nil {
		return err
	}
	b.Args(uint64(stag))
	return nil
}

// queryMem reports a fast-register MR's or window's current (or last)
// registration: STag, valid, base, length.
func (x *session) queryMem(b *svc.Builder, h uint64) error {
	x.mu.Lock()
	f, mw := x.frmrs[h], x.mws[h]
	x.mu.Unlock()
	var r *iwarp.Region
	switch {
	case f != nil:
		r = engine.FastRegMR(f.mr).Current()
	case mw != nil:
		r = engine.Window(mw).Current()
	default:
		return errNoHandle
	}
	b.Args(uint64(r.STag()), bool64(r.Valid()), r.Base, r.Len())
	return nil
}
