package service

import (
	"fmt"

	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

// servedMR is a client's registration: the service's mapping of the
// client's memfd pages, registered at the client's addresses.
type servedMR struct {
	mr      *verbs.MR
	mapping []byte
	n       int64
	va      uint64 // the client's address of the first byte
	// The fast-register MRs that mapped pages of it (they may place
	// into them until they are freed), and whether it has been
	// deregistered; the pages are unmapped when both are done.
	// +checklocksignore: under session.mu, another object's lock.
	refs int
	// +checklocksignore: under session.mu, another object's lock.
	gone bool
}

func (x *session) regMR(b *svc.Builder, m svc.Msg, fds []int) error {
	defer closeFDs(fds)
	if len(fds) != 1 {
		return fmt.Errorf("%w: REG_MR needs one memory file descriptor, got %d", verbs.ErrInvalidArgument, len(fds))
	}
	pd, err := x.pd(m.Arg(0))
	if err != nil {
		return err
	}
	va, n, acc, off, iova := m.Arg(1), m.Arg(2), verbs.Access(m.Arg(3)), m.Arg(4), m.Arg(5)
	if n == 0 || n > 1<<40 || off > 1<<50 || va+n < va {
		return fmt.Errorf("%w: region of %d bytes at offset %d", verbs.ErrInvalidArgument, n, off)
	}
	if iova+n < iova {
		return fmt.Errorf("%w: IOVA %#x + %d bytes wraps", verbs.ErrInvalidArgument, iova, n)
	}
	if va%4096 != off%4096 {
		// The client maps the file from a page boundary, so its address
		// and the file offset agree within the page; a claim that they do
		// not would misalign the Tagged Offsets against the service's
		// mapping (atomics need 8-byte aligned words).
		return fmt.Errorf("%w: address %#x does not sit at file offset %d within its page", verbs.ErrInvalidArgument, va, off)
	}
	x.mu.Lock()
	if x.mrBytes+int64(n) > x.lim.MRBytes {
		err := fmt.Errorf("%w: %d MR bytes registered, limit %d", verbs.ErrLimit, x.mrBytes, x.lim.MRBytes)
		x.mu.Unlock()
		return err
	}
	if x.memObjects()+x.mrPending >= x.lim.MRs {
		err := fmt.Errorf("%w: %d MRs", verbs.ErrLimit, x.memObjects())
		x.mu.Unlock()
		return err
	}
	if err := x.chargeLocked(memSmall, "an MR"); err != nil {
		x.mu.Unlock()
		return err
	}
	x.mrPending++
	defer func() {
		x.mu.Lock()
		x.mrPending--
		x.mu.Unlock()
	}()
	x.mrBytes += int64(n)
	x.mu.Unlock()
	if err := x.srv.takeMap(x.cred.UID); err != nil {
		x.mu.Lock()
		x.mrBytes -= int64(n)
		x.memBytes -= memSmall
		x.mu.Unlock()
		return err
	}
	mapping, part, err := svc.MapFile(fds[0], int64(off), int(n), true)
	if err == nil {
		var mr *verbs.MR
		if mr, err = regMRChecked(pd, part, iova, acc); err == nil {
			x.mu.Lock()
			h := x.handle64()
			x.mrs[h] = &servedMR{mr: mr, mapping: mapping, n: int64(n), va: va}
			x.mu.Unlock()
			b.Args(h, uint64(mr.RKey()))
			return nil
		}
		svc.Unmap(mapping)
	} else {
		err = fmt.Errorf("%w: %v", verbs.ErrInvalidArgument, err)
	}
	x.srv.dropMap(x.cred.UID)
	x.mu.Lock()
	x.mrBytes -= int64(n)
	x.memBytes -= memSmall
	x.mu.Unlock()
	return err
}

// regMRChecked registers a client's pages at its addresses, base on.
func regMRChecked(pd *verbs.PD, buf []byte, base uint64, acc verbs.Access) (*verbs.MR, error) {
	if acc&^(verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead|verbs.AccessRemoteAtomic|verbs.AccessZeroBased|verbs.AccessMWBind) != 0 {
		return nil, fmt.Errorf("%w: access flags %#x not supported", verbs.ErrInvalidArgument, uint32(acc))
	}
	if acc&(verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic) != 0 && acc&verbs.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("%w: remote write and atomic require local write", verbs.ErrInvalidArgument)
	}
	return pd.RegMRIOVA(buf, base, acc)
}

// memObjects counts the STags the client holds (session.mu held).
// +checklocks:x.mu
func (x *session) memObjects() int { return len(x.mrs) + len(x.frmrs) + len(x.mws) }

func (x *session) deregMR(h uint64) error {
	x.mu.Lock()
	r := x.mrs[h]
	delete(x.mrs, h)
	f := x.frmrs[h]
	delete(x.frmrs, h)
	x.mu.Unlock()
	switch {
	case f != nil:
		if err := x.releaseFRMR(f); err != nil {
			x.mu.Lock()
			x.frmrs[h] = f
			x.mu.Unlock()
			return err
		}
		return nil
	case r != nil:
		if err := x.releaseMR(r); err != nil {
			x.mu.Lock()
			x.mrs[h] = r
			x.mu.Unlock()
			return err
		}
		return nil
	}
	return errNoHandle
}

// releaseMR invalidates the STag, waits out placements in progress, and
// only then unmaps the client's pages, unless a fast-register MR still
// maps some of them (then the last one freed unmaps them). It fails,
// doing nothing, while windows are bound to the MR.
func (x *session) releaseMR(r *servedMR) error {
	if err := r.mr.Dereg(); err != nil {
		return err
	}
	x.mu.Lock()
	r.gone = true
	unmap := r.refs == 0
	x.mu.Unlock()
	if unmap {
		x.unmapMR(r)
	}
	return nil
}

func (x *session) unmapMR(r *servedMR) {
	svc.Unmap(r.mapping)
	x.srv.dropMap(x.cred.UID)
	x.mu.Lock()
	x.mrBytes -= r.n
	x.memBytes -= memSmall
	x.mu.Unlock()
}
