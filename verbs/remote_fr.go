package verbs

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"unsafe"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

// remoteFR is the client's side of a fast-register MR of a service: what
// its next REG_MR maps and the registration last posted.
//
// Locks: see the package documentation.
type remoteFR struct {
	maxPages int

	mu sync.Mutex
	// +checklocks:mu
	mapped bool
	// +checklocks:mu
	mapLen uint64
	// +checklocks:mu
	iova uint64
	// +checklocks:mu
	buf []byte // the mapped bytes when they are one run
	// The registration last posted (the first STag until then).
	// +checklocks:mu
	stag STag
	// +checklocks:mu
	base uint64
	// +checklocks:mu
	n uint64
	// +checklocks:mu
	rbuf []byte
}

func (f *remoteFR) view() ([]byte, uint64, uint64, STag) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rbuf, f.base, f.n, f.stag
}

// registered records a REG_MR posted with rkey and acc.
func (f *remoteFR) registered(rkey STag, acc Access) {
	f.mu.Lock()
	f.stag, f.n, f.rbuf, f.base = rkey, f.mapLen, f.buf, f.iova
	if acc&AccessZeroBased != 0 {
		f.base = 0
	}
	f.mu.Unlock()
}

// remoteAlloc asks the service for a memory object (t) of the PD, unless
// the PD is closed; arg is the object's size or type.
func (pd *PD) remoteAlloc(t svc.Type, arg uint64) (reply, error) {
	pd.mu.Lock()
	closed := pd.closed
	pd.mu.Unlock()
	if closed {
		return reply{}, net.ErrClosed
	}
	return pd.dev.client().do(context.Background(), t, func(b *svc.Builder) { b.Args(pd.handle(), arg) })
}

func (pd *PD) remoteAllocMR(maxPages int) (*MR, error) {
	if maxPages <= 0 || maxPages > iwarp.MaxFastRegPages {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, fmt.Errorf("%w: fast-register MR of %d pages", iwarp.ErrInvalidWR, maxPages))
	}
	cl := pd.dev.client()
	r, err := pd.remoteAlloc(svc.TAllocMR, uint64(maxPages))
	if err != nil {
		return nil, err
	}
	m := &MR{pd: pd, fr: &iwarp.FastRegMR{}}
	m.ops = &remoteMR{m: m, h: r.m.Arg(0), stag: STag(r.m.Arg(1)), fr: &remoteFR{maxPages: maxPages, stag: STag(r.m.Arg(1))}}
	cl.mu.Lock()
	cl.frs[m.fr] = m
	cl.mu.Unlock()
	pd.mu.Lock()
	pd.mrs++
	pd.mu.Unlock()
	return m, nil
}

// invalidWR is the error an embedded MR's map calls return for what
// iwarp refuses.
func invalidWR(format string, args ...any) error {
	return fmt.Errorf("%w: %v", ErrInvalidArgument, fmt.Errorf("%w: "+format, append([]any{iwarp.ErrInvalidWR}, args...)...))
}

func checkPageSize(pageSize int) error {
	if pageSize < iwarp.MinPageSize || pageSize > iwarp.MaxPageSize || pageSize&(pageSize-1) != 0 {
		return invalidWR("page size %d", pageSize)
	}
	return nil
}

// mapEntries sends a MAP_MR's entries, as many messages as they need,
// and returns the IOVA and length of the mapping.
func (m *MR) mapEntries(mode uint64, pageSize, offset, length int, ents []byte) (uint64, uint64, error) {
	cl := m.pd.dev.client()
	flags := uint64(svc.MapFirst)
	for {
		k := min(len(ents), svc.MapEntries*svc.MapEntrySize)
		chunk := ents[:k]
		ents = ents[k:]
		if len(ents) == 0 {
			flags |= svc.MapLast
		}
		r, err := cl.do(context.Background(), svc.TMapMR, func(b *svc.Builder) {
			b.Args(m.remote().h, mode|flags, uint64(pageSize), uint64(offset), uint64(length)).Bytes(chunk)
		})
		if err != nil {
			return 0, 0, err
		}
		if flags&svc.MapLast != 0 {
			return r.m.Arg(0), r.m.Arg(1), nil
		}
		flags = 0
	}
}

func (m *MR) remoteMapPages(pages [][]byte, pageSize, offset, length int) error {
	f := m.remote().fr
	if err := checkPageSize(pageSize); err != nil {
		return err
	}
	if len(pages) == 0 || len(pages) > f.maxPages {
		return invalidWR("%d pages, the MR maps 1 to %d", len(pages), f.maxPages)
	}
	if offset < 0 || offset >= pageSize || length < 0 || offset+length > len(pages)*pageSize {
		return invalidWR("%d bytes at offset %d of %d pages of %d", length, offset, len(pages), pageSize)
	}
	// Runs of pages that follow one another in memory.
	var ents []byte
	var runAddr, runEnd uint64
	var runN uint32
	flush := func() {
		if runN > 0 {
			ents = binary.LittleEndian.AppendUint64(ents, runAddr)
			ents = binary.LittleEndian.AppendUint64(ents, uint64(runN))
		}
	}
	for i, p := range pages {
		if len(p) != pageSize {
			return invalidWR("page %d is %d bytes, not %d", i, len(p), pageSize)
		}
		a := iwarp.BufferAddr(p)
		if runN > 0 && a == runEnd && runN < 1<<31 {
			runN++
		} else {
			flush()
			runAddr, runN = a, 1
		}
		runEnd = a + uint64(pageSize)
	}
	flush()
	iova, n, err := m.mapEntries(svc.MapPages, pageSize, offset, length, ents)
	if err != nil {
		return err
	}
	var buf []byte
	if len(ents) == svc.MapEntrySize {
		buf = unsafe.Slice(unsafe.SliceData(pages[0]), len(pages)*pageSize)[offset : offset+length : offset+length]
	}
	f.setMapping(iova, n, buf)
	return nil
}

func (f *remoteFR) setMapping(iova, n uint64, buf []byte) {
	f.mu.Lock()
	f.mapped, f.iova, f.mapLen, f.buf = true, iova, n, buf
	f.mu.Unlock()
}

func (m *MR) remoteMapSG(sgl []SGE, pageSize int) error {
	if err := checkPageSize(pageSize); err != nil {
		return err
	}
	if len(sgl) == 0 {
		return invalidWR("empty SGE list")
	}
	ents := make([]byte, 0, len(sgl)*svc.MapEntrySize)
	for _, s := range sgl {
		ents = binary.LittleEndian.AppendUint64(ents, s.Addr)
		ents = binary.LittleEndian.AppendUint32(ents, s.Length)
		ents = binary.LittleEndian.AppendUint32(ents, s.LKey)
	}
	iova, n, err := m.mapEntries(svc.MapSG, pageSize, 0, 0, ents)
	if err != nil {
		return err
	}
	// The bytes, when the SGEs make one run of this process's memory.
	cl := m.pd.dev.client()
	var buf []byte
	one := true
	for i, s := range sgl {
		cl.mu.Lock()
		mr := cl.mrKeys[s.LKey]
		cl.mu.Unlock()
		var b []byte
		if mr != nil {
			b, _ = mr.r.Slice(s.Addr, uint64(s.Length))
		}
		switch {
		case b == nil && s.Length > 0:
			one = false
		case i == 0:
			buf = b
		case len(b) == 0:
		case len(buf) > 0 && cap(buf)-len(buf) >= len(b) && unsafe.SliceData(buf[len(buf):len(buf)+1]) == unsafe.SliceData(b):
			buf = buf[:len(buf)+len(b)]
		default:
			one = false
		}
	}
	if !one {
		buf = nil
	}
	m.remote().fr.setMapping(iova, n, buf)
	return nil
}

func (m *MR) remoteSetIOVA(iova uint64) error {
	_, err := m.pd.dev.client().do(context.Background(), svc.TSetIOVA, func(b *svc.Builder) { b.Args(m.remote().h, iova) })
	if err != nil {
		return err
	}
	fr := m.remote().fr
	fr.mu.Lock()
	fr.iova = iova
	fr.mu.Unlock()
	return nil
}

// remoteValid asks the service whether a fast-register MR is valid.
func (m *MR) remoteValid() bool {
	r, err := m.pd.dev.client().do(context.Background(), svc.TQueryMem, func(b *svc.Builder) { b.Args(m.remote().h) })
	return err == nil && r.m.Arg(1) != 0
}
