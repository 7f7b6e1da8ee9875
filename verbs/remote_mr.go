package verbs

import (
	"context"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
	"github.com/rdmatap/rdmatap/zerocopy"
)

func (pd *PD) remoteRegMR(buf []byte, iova uint64, acc Access) (*MR, error) {
	fd, off, ok := zerocopy.Backing(buf)
	if !ok {
		return nil, ErrNotShared
	}
	va := iwarp.BufferAddr(buf)
	cl := pd.dev.client()
	r, err := cl.do(context.Background(), svc.TRegMR, func(b *svc.Builder) {
		b.Args(pd.handle(), va, uint64(len(buf)), uint64(acc), uint64(off), iova)
	}, fd)
	if err != nil {
		return nil, err
	}
	reg := &iwarp.Region{Buf: buf, Access: iwarp.Access(acc), PD: pd.id, Kind: iwarp.KindMR}
	if acc&AccessZeroBased == 0 {
		reg.Base = iova
	}
	m := &MR{pd: pd, r: reg}
	m.ops = &remoteMR{m: m, h: r.m.Arg(0), stag: STag(r.m.Arg(1))}
	cl.mu.Lock()
	cl.mrKeys[m.remote().stag] = m
	cl.mu.Unlock()
	return m, nil
}

// remoteMR is an MR of a service: its handle and STag, and for a
// fast-register MR, what the client knows of its mapping and
// registration (fr).
type remoteMR struct {
	m    *MR
	h    uint64
	stag STag
	fr   *remoteFR
}

// remote returns an MR of a service's side; nil for an embedded MR.
func (m *MR) remote() *remoteMR {
	r, _ := m.ops.(*remoteMR)
	return r
}

func (r *remoteMR) view() ([]byte, uint64, uint64, STag) {
	if r.fr != nil {
		return r.fr.view()
	}
	g := r.m.r
	return g.Buf, g.Base, g.Len(), r.stag
}

// valid: a regular MR of a service is valid until Dereg (an invalidation
// by the peer is not seen); a fast-register MR's state is the service's.
func (r *remoteMR) valid() bool {
	r.m.mu.Lock()
	freed := r.m.freed
	r.m.mu.Unlock()
	if freed || r.fr == nil {
		return !freed
	}
	return r.m.remoteValid()
}

func (r *remoteMR) dereg() (bool, error) {
	cl := r.m.pd.dev.client()
	if _, err := cl.do(context.Background(), svc.TDeregMR, func(b *svc.Builder) { b.Args(r.h) }); err != nil {
		return false, err
	}
	cl.forget(r.m)
	return true, nil
}

func (r *remoteMR) mapPages(pages [][]byte, pageSize, offset, length int) error {
	return r.m.remoteMapPages(pages, pageSize, offset, length)
}

func (r *remoteMR) mapSG(sgl []SGE, pageSize int) error { return r.m.remoteMapSG(sgl, pageSize) }

func (r *remoteMR) setIOVA(iova uint64) error { return r.m.remoteSetIOVA(iova) }

// forget drops a freed MR from the client's tables.
func (cl *client) forget(m *MR) {
	r := m.remote()
	cl.mu.Lock()
	if r.fr != nil {
		delete(cl.frs, m.fr)
	} else if cl.mrKeys[r.stag] == m {
		delete(cl.mrKeys, r.stag)
	}
	cl.mu.Unlock()
}
