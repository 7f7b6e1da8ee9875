package service

import (
	"encoding/binary"
	"fmt"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

// servedFRMR is a client's fast-register MR. Its page lists name only
// the client's registered memory (the service's mappings of it), and it
// holds every regular MR whose pages it ever mapped until it is freed:
// a registration of those pages may outlive the next MapPages, and the
// pages must stay mapped while a peer may place into them.
type servedFRMR struct {
	mr *verbs.MR
	// +checklocksignore: under session.mu, another object's lock.
	used map[*servedMR]struct{}
	// A MAP_MR in several messages: the entries so far.
	pend []byte
}

func (x *session) frmr(h uint64) (*servedFRMR, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if f := x.frmrs[h]; f != nil {
		return f, nil
	}
	return nil, errNoHandle
}

// frmrMemory is a fast-register MR's charge: the MR with its page list at
// its longest, and a MAP_MR's entries gathered over several messages.
func frmrMemory(maxPages int) int64 {
	return memSmall + iwarp.FastRegFootprint(maxPages) + int64(maxPages)*svc.MapEntrySize
}

func (x *session) allocMR(b *svc.Builder, m svc.Msg) error {
	pd, err := x.pd(m.Arg(0))
	if err != nil {
		return err
	}
	maxPages := m.Arg(1)
	if maxPages == 0 || maxPages > iwarp.MaxFastRegPages {
		return fmt.Errorf("%w: fast-register MR of %d pages", verbs.ErrInvalidArgument, maxPages)
	}
	x.mu.Lock()
	if x.memObjects()+x.mrPending >= x.lim.MRs {
		err := fmt.Errorf("%w: %d MRs", verbs.ErrLimit, x.memObjects())
		x.mu.Unlock()
		return err
	}
	if x.frPages+int(maxPages) > x.lim.FRPages {
		err := fmt.Errorf("%w: fast-register MRs of %d pages, limit %d", verbs.ErrLimit, x.frPages, x.lim.FRPages)
		x.mu.Unlock()
		return err
	}
	cost := frmrMemory(int(maxPages))
	if err := x.chargeLocked(cost, "a fast-register MR"); err != nil {
		x.mu.Unlock()
		return err
	}
	x.frPages += int(maxPages)
	x.mu.Unlock()
	mr, err := pd.AllocMR(int(maxPages))
	if err != nil {
		x.mu.Lock()
		x.frPages -= int(maxPages)
		x.memBytes -= cost
		x.mu.Unlock()
		return err
	}
	x.mu.Lock()
	h := x.handle64()
	x.frmrs[h] = &servedFRMR{mr: mr, used: map[*servedMR]struct{}{}}
	x.mu.Unlock()
	b.Args(h, uint64(mr.RKey()))
	return nil
}

// releaseFRMR frees a fast-register MR (its STag invalidated and fenced)
// and lets go of the client's MRs it mapped.
func (x *session) releaseFRMR(f *servedFRMR) error {
	if err := f.mr.Dereg(); err != nil {
		return err
	}
	var unmap []*servedMR
	x.mu.Lock()
	x.frPages -= engine.FastRegMR(f.mr).MaxPages()
	x.memBytes -= frmrMemory(engine.FastRegMR(f.mr).MaxPages())
	for r := range f.used {
		r.refs--
		if r.refs == 0 && r.gone {
			unmap = append(unmap, r)
		}
	}
	f.used = nil
	x.mu.Unlock()
	for _, r := range unmap {
		x.unmapMR(r)
	}
	return nil
}

// clientMR finds the client's registered MR whose pages hold the client
// addresses [va, va+n); session.mu held.
// +checklocks:x.mu
func (x *session) clientMR(va, n uint64) *servedMR {
	for _, r := range x.mrs {
		if va >= r.va && va-r.va <= uint64(len(r.mr.Bytes())) && n <= uint64(len(r.mr.Bytes()))-(va-r.va) {
			return r
		}
	}
	return nil
}

// mapMR is MAP_MR: MapPages or MapSG of a fast-register MR, over the
// client's registered memory only. Page addresses are the client's: each
// run of pages must lie inside one of its MRs, and the service maps the
// same pages of its own mapping of that MR; SGEs name the client's MRs by
// STag, as embedded.
func (x *session) mapMR(b *svc.Builder, m svc.Msg) error {
	f, err := x.frmr(m.Arg(0))
	if err != nil {
		return err
	}
	mode, pageSize, offset, length := m.Arg(1), m.Arg(2), m.Arg(3), m.Arg(4)
	var fl [1][]byte
	if n, err := svc.Fields(m.Payload(), fl[:]); err != nil || n != 1 || len(fl[0])%svc.MapEntrySize != 0 {
		return fmt.Errorf("%w: MAP_MR entries", verbs.ErrInvalidArgument)
	}
	maxEntries := max(engine.FastRegMR(f.mr).MaxPages(), svc.MapEntries)
	if mode&svc.MapFirst != 0 {
		f.pend = f.pend[:0]
	}
	if (len(f.pend)+len(fl[0]))/svc.MapEntrySize > maxEntries {
		f.pend = nil
		return fmt.Errorf("%w: MAP_MR of more than %d entries", verbs.ErrInvalidArgument, maxEntries)
	}
	f.pend = append(f.pend, fl[0]...)
	if mode&svc.MapLast == 0 {
		return nil
	}
	ents := f.pend
	f.pend = nil
	if pageSize > iwarp.MaxPageSize || offset > iwarp.MaxPageSize || length > 1<<50 {
		return fmt.Errorf("%w: %v", verbs.ErrInvalidArgument, fmt.Errorf("%w: page size %d", iwarp.ErrInvalidWR, pageSize))
	}
	ps := int(pageSize)
	used := map[*servedMR]struct{}{}
	var iova uint64
	x.mu.Lock()
	switch mode & 0xff {
	case svc.MapPages:
		if pageSize < iwarp.MinPageSize || pageSize&(pageSize-1) != 0 {
			x.mu.Unlock()
			return fmt.Errorf("%w: %v", verbs.ErrInvalidArgument, fmt.Errorf("%w: page size %d", iwarp.ErrInvalidWR, pageSize))
		}
		var pages [][]byte
		for i := 0; i+svc.MapEntrySize <= len(ents); i += svc.MapEntrySize {
			va, np := binary.LittleEndian.Uint64(ents[i:]), uint64(binary.LittleEndian.Uint32(ents[i+8:]))
			if np == 0 || uint64(len(pages))+np > uint64(engine.FastRegMR(f.mr).MaxPages()) {
				x.mu.Unlock()
				return fmt.Errorf("%w: %v", verbs.ErrInvalidArgument, fmt.Errorf("%w: %d pages, the MR maps 1 to %d",
					iwarp.ErrInvalidWR, uint64(len(pages))+np, engine.FastRegMR(f.mr).MaxPages()))
			}
			r := x.clientMR(va, np*pageSize)
			if r == nil {
				x.mu.Unlock()
				return fmt.Errorf("%w: pages [%#x, +%d) are not in memory the client registered", verbs.ErrInvalidArgument, va, np*pageSize)
			}
			if len(pages) == 0 {
				iova = va + offset
			}
			used[r] = struct{}{}
			run := r.mr.Bytes()[va-r.va:]
			for k := 0; k < int(np); k++ {
				pages = append(pages, run[k*ps:(k+1)*ps])
			}
		}
		x.mu.Unlock()
		if err := f.mr.MapPages(pages, ps, int(offset), int(length)); err != nil {
			return err
		}
	case svc.MapSG:
		sgl := make([]verbs.SGE, 0, len(ents)/svc.MapEntrySize)
		for i := 0; i+svc.MapEntrySize <= len(ents); i += svc.MapEntrySize {
			s := verbs.SGE{Addr: binary.LittleEndian.Uint64(ents[i:]), Length: binary.LittleEndian.Uint32(ents[i+8:]),
				LKey: binary.LittleEndian.Uint32(ents[i+12:])}
			var r *servedMR
			for _, c := range x.mrs {
				if c.mr.LKey() == s.LKey && c.mr.PD() == f.mr.PD() {
					r = c
					break
				}
			}
			if r == nil {
				x.mu.Unlock()
				return fmt.Errorf("%w: %v", verbs.ErrInvalidArgument, fmt.Errorf("%w: SGE %d: lkey %#x is no MR of the protection domain",
					iwarp.ErrInvalidWR, len(sgl), s.LKey))
			}
			if len(sgl) == 0 {
				iova = r.va + (s.Addr - r.mr.Addr())
			}
			used[r] = struct{}{}
			sgl = append(sgl, s)
		}
		x.mu.Unlock()
		if err := f.mr.MapSG(sgl, ps); err != nil {
			return err
		}
		length = 0
		for _, s := range sgl {
			length += uint64(s.Length)
		}
	default:
		x.mu.Unlock()
		return fmt.Errorf("%w: MAP_MR mode %#x", verbs.ErrInvalidArgument, mode)
	}
	// The IOVA of the client's first byte, as embedded (the service's
	// mapping lies elsewhere).
	if err := f.mr.SetIOVA(iova); err != nil {
		return err
	}
	x.mu.Lock()
	for r := range used {
		if _, ok := f.used[r]; !ok && f.used != nil {
			f.used[r] = struct{}{}
			r.refs++
		}
	}
	x.mu.Unlock()
	b.Args(iova, length)
	return nil
}
