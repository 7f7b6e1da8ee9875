package iwarp

import "fmt"

// Memory registration work requests at the QP: they execute in send queue
// order in the transmitter (after every WR posted before them has gone to
// the stream, and after the outstanding Reads and atomics with FlagFence),
// send nothing, and complete at once. A failure completes the WR with
// StatusMWBind ("memory management operation error",
// IBV_WC_MW_BIND_ERR) and, as any local error, takes the QP down with a
// Terminate (RDMAP, local catastrophic error).

// checkLocalWR checks a memory registration WR at post time: what can be
// wrong whatever the state of the memory objects (ErrInvalidWR).
func (qp *QP) checkLocalWR(wr *SendWR) error {
	if len(wr.SGL) != 0 || wr.Flags&(FlagInline|FlagSolicited) != 0 {
		return fmt.Errorf("%w: %v takes no SGEs, inline data or solicited event", ErrInvalidWR, wr.Op)
	}
	switch wr.Op {
	case WRRegMR:
		m := wr.MR
		switch {
		case m == nil:
			return fmt.Errorf("%w: REG_MR without an MR", ErrInvalidWR)
		case m.pd != qp.cfg.PD || m.mem != qp.cfg.Mem:
			return fmt.Errorf("%w: REG_MR of an MR of another protection domain", ErrInvalidWR)
		case wr.RKey>>8 != m.idx:
			// (The index, not m.STag(): its atomic load would make the
			// poster's WR escape, see memRef.)
			return fmt.Errorf("%w: REG_MR key %#x is not of the MR's STag index %#x", ErrInvalidWR, wr.RKey, m.idx)
		}
		return checkAccess(wr.Access)
	case WRBindMW, wrBindMW1:
		w := wr.MW
		switch {
		case w == nil:
			return fmt.Errorf("%w: BIND_MW without a window", ErrInvalidWR)
		case w.pd != qp.cfg.PD || w.mem != qp.cfg.Mem:
			return fmt.Errorf("%w: BIND_MW of a window of another protection domain", ErrInvalidWR)
		case wr.Op == WRBindMW && w.typ != MWType2:
			return fmt.Errorf("%w: a type 1 window is bound by QP.BindMW, not a work request", ErrInvalidWR)
		case wr.Op == wrBindMW1 && w.typ != MWType1:
			return fmt.Errorf("%w: a type 2 window is bound by a BIND_MW work request", ErrInvalidWR)
		case wr.RKey>>8 != w.idx:
			return fmt.Errorf("%w: BIND_MW key %#x is not of the window's STag index %#x", ErrInvalidWR, wr.RKey, w.idx)
		case wr.Bind.MR == 0 && (wr.Op == WRBindMW || wr.Bind.Length > 0):
			return fmt.Errorf("%w: BIND_MW without an MR", ErrInvalidWR)
		case wr.Bind.Access&^windowAccess != 0:
			return fmt.Errorf("%w: window access %#x (remote read, write, atomic, zero-based only)", ErrInvalidWR, uint32(wr.Bind.Access))
		}
	}
	return nil
}

// checkAccess checks a registration's access flags (the ibv_reg_mr rules).
func checkAccess(acc Access) error {
	all := AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic | AccessMWBind | AccessZeroBased
	switch {
	case acc&^all != 0:
		return fmt.Errorf("%w: access flags %#x", ErrInvalidWR, uint32(acc))
	case acc&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && acc&AccessLocalWrite == 0:
		return fmt.Errorf("%w: remote write and atomic access require local write", ErrInvalidWR)
	}
	return nil
}

// execLocal executes a memory registration WR in send queue order; false
// ends TX (the QP failed).
// +checklocks:t.qp.txMu
func (t *transmitter) execLocal(w *sendWQE) bool {
	qp := t.qp
	var err error
	var op CompletionOp
	switch w.wr.Op {
	case WRLocalInv:
		op = CompLocalInv
		var r *Region
		if r, err = qp.invalidationTarget(w.wr.InvalidateRKey); err == nil && !qp.cfg.Mem.invalidateUnbound(r) {
			err = fmt.Errorf("%w: windows are bound to STag %#x", ErrMemBusy, w.wr.InvalidateRKey)
		}
	case WRRegMR:
		op = CompRegMR
		if m, _ := qp.cfg.Mem.owner(w.mr).(*FastRegMR); m != nil {
			err = qp.fastReg(m, &w.wr)
		} else {
			err = fmt.Errorf("%w: REG_MR of an MR released after it was posted", ErrMemFreed)
		}
	case WRBindMW, wrBindMW1:
		op = CompBindMW
		if mw, _ := qp.cfg.Mem.owner(w.mw).(*Window); mw != nil {
			err = mw.bind(qp, &w.wr.Bind, w.wr.RKey)
		} else {
			err = fmt.Errorf("%w: BIND_MW of a window released after it was posted", ErrMemFreed)
		}
	}
	if err != nil {
		qp.completeSQ(Completion{ID: w.wr.ID, Status: StatusMWBind, Op: op})
		qp.terminate(TermCode{LayerRDMAP, ETypeRDMAPCatastrophic, CodeUnspecified}, nil, 0)
		t.sendTerminate()
		return false
	}
	if w.signaled {
		qp.completeSQ(Completion{ID: w.wr.ID, Op: op})
	}
	return true
}

// fastReg executes a REG_MR of m: the MR's mapping becomes valid under the
// WR's STag with its access; the MR must be invalid.
func (qp *QP) fastReg(m *FastRegMR, wr *SendWR) error {
	buf, pages, iova, ok := m.mapping()
	if !ok {
		return fmt.Errorf("%w: REG_MR of an MR with no pages mapped", ErrInvalidWR)
	}
	r := &Region{Buf: buf, pages: pages, Base: iova, Access: wr.Access, PD: m.pd, Kind: KindFRMR}
	if wr.Access&AccessZeroBased != 0 {
		r.Base = 0
	}
	_, err := m.mem.rebind(&m.memObject, r, wr.RKey, false)
	return err
}

// invalidationTarget finds the registration a Local Invalidate (or a Read
// with local invalidate) names: a fast-register MR (valid or not), a
// regular MR, or a type 2 window this QP bound, all of this QP's PD. A
// type 1 window cannot be invalidated (the verbs unbind it with a
// zero-length bind).
func (qp *QP) invalidationTarget(stag uint32) (*Region, error) {
	r := qp.cfg.Mem.lookupAny(stag)
	switch {
	case r == nil:
		return nil, fmt.Errorf("%w: STag %#x names nothing", ErrInvalidWR, stag)
	case !r.Associated(qp.cfg.PD, qp.cfg.Num):
		return nil, fmt.Errorf("%w: STag %#x is not of this QP", ErrInvalidWR, stag)
	case r.Kind == KindMW && r.MWType != MWType2:
		// A type 1 window, or a window never bound.
		return nil, fmt.Errorf("%w: window STag %#x cannot be invalidated (type 1, or never bound)", ErrInvalidWR, stag)
	}
	return r, nil
}

// remoteInvalidate invalidates reg for a peer's Send with Invalidate
// received on qp, if the peer may: only an STag the peer may access
// itself can be invalidated remotely (RFC 5040's Send with Invalidate
// names an STag the peer was given; RFC 5042 asks that a peer reach
// nothing it was not granted): a registration of the QP's PD
// with remote access, associated with this QP (a type 2 window bound to
// another QP is not), and not a type 1 window. An MR with windows bound to
// it stays valid. The caller holds no access itself (the fence waits for
// other QPs' accesses).
func (qp *QP) remoteInvalidate(reg *Region) bool {
	if reg == nil || !reg.Associated(qp.cfg.PD, qp.cfg.Num) ||
		reg.Access&(AccessRemoteWrite|AccessRemoteRead|AccessRemoteAtomic) == 0 ||
		reg.Kind == KindMW && reg.MWType == MWType1 {
		return false
	}
	return qp.cfg.Mem.invalidateUnbound(reg)
}

// readInvalidate invalidates the STag of a Read with local invalidate once
// the Read's data has arrived, before the Read completes. The receiver
// drops its own holds first: the fence waits for accesses in progress, and
// the last Read Response segment placed into the sink is one of them.
// +checklocks:r.qp.rxMu
func (r *receiver) readInvalidate(reg *Region) bool {
	r.held.drop()
	return r.qp.cfg.Mem.invalidateUnbound(reg)
}

// trackWindow records a type 2 window binding made on qp, so that the QP's
// end invalidates it (a type 2 window lives with its QP, as in the verbs:
// nothing else may use it, and its MR must not stay held). Bindings
// already invalid are dropped as the list grows.
func (qp *QP) trackWindow(r *Region) {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if len(qp.windows) == cap(qp.windows) {
		live := qp.windows[:0]
		for _, w := range qp.windows {
			if w.Valid() {
				live = append(live, w)
			}
		}
		clear(qp.windows[len(live):])
		qp.windows = live
	}
	qp.windows = append(qp.windows, r)
}

// unbindWindows invalidates the type 2 windows bound on qp, once it is in
// ERROR and its goroutines have stopped.
func (qp *QP) unbindWindows() {
	qp.mu.Lock()
	ws := qp.windows
	qp.windows = nil
	qp.mu.Unlock()
	for _, w := range ws {
		w.Invalidate()
	}
}
