package iwarp

import (
	"fmt"
	"math/bits"
	"sync"
	"unsafe"
)

// FastRegMR is a fast-register MR (the kernel verbs' ib_alloc_mr with
// IB_MR_TYPE_MEM_REG): it holds an STag from allocation but no memory and
// starts invalid. Map (ib_map_mr_sg) sets the memory the next registration
// maps; a REG_MR work request (WRRegMR) then registers it, in send queue
// order, under a key the consumer chooses and with the access rights the
// work request gives. Local Invalidate, a peer's Send with Invalidate or an
// RDMA Read with local invalidate make it invalid again, ready for the
// next REG_MR. See memobj.go for how keys are chosen.
//
// The MR's Tagged Offsets are one contiguous space (RFC 5040: an STag
// names a TO range that maps onto the pages the registration lists, in
// order). Its memory is one run when the pages given to MapPages follow
// one another in memory, and a page list otherwise (separate buffers, as
// a REG_MR over a scattered page list is): placement that crosses a page
// boundary continues in the next page of the list. The SGEs given to
// MapSG make a page list where they leave gaps at page boundaries.
//
// mu guards the mapping the next REG_MR registers. It is a leaf, taken by
// the consumer (MapPages, MapSG, SetIOVA) and by the transmitter that
// executes a REG_MR (mapping, under QP.txMu). The registration itself is
// the memory object's, under the table's lock (see memObject and the
// package's Locks section).
type FastRegMR struct {
	memObject
	maxPages int

	mu sync.Mutex
	// +checklocks:mu
	buf []byte // what the next REG_MR maps: one run,
	// +checklocks:mu
	pages *pageList // or a page list
	// +checklocks:mu
	mapped bool
	// iova is the TO of the first byte of a VA-based registration: the
	// first byte's address unless SetIOVA changed it.
	// +checklocks:mu
	iova uint64
}

// NewFastRegMR allocates a fast-register MR of protection domain pd that
// may map up to maxPages pages.
func NewFastRegMR(t *MemTable, pd uint32, maxPages int) (*FastRegMR, error) {
	if maxPages <= 0 || maxPages > MaxFastRegPages {
		return nil, fmt.Errorf("%w: fast-register MR of %d pages", ErrInvalidWR, maxPages)
	}
	m := &FastRegMR{maxPages: maxPages}
	if err := t.reserve(&m.memObject, m, KindFRMR, pd); err != nil {
		return nil, err
	}
	return m, nil
}

// PD returns the MR's protection domain.
func (m *FastRegMR) PD() uint32 { return m.pd }

// MaxPages returns the most pages the MR may map.
func (m *FastRegMR) MaxPages() int { return m.maxPages }

// Release invalidates the MR and frees its STag index (see
// MemTable.Deregister); false: windows are bound to it, nothing was done.
func (m *FastRegMR) Release() bool { return m.mem.release(&m.memObject) }

// MaxFastRegPages is the most pages a fast-register MR maps.
const MaxFastRegPages = 1 << 20

// MinPageSize and MaxPageSize bound a fast-register MR's page size (a
// power of two).
const (
	MinPageSize = 512
	MaxPageSize = 1 << 30
)

// MapPages sets the memory the next REG_MR maps: length bytes from offset
// in the first page of pages, each pageSize bytes long (the page list of
// ib_map_mr_sg, with the first byte offset). The pages may lie anywhere;
// the TO space runs through them in order. The IOVA (the TO of the first
// byte, VA-based) becomes the first byte's address.
func (m *FastRegMR) MapPages(pages [][]byte, pageSize, offset, length int) error {
	if pageSize < MinPageSize || pageSize > MaxPageSize || pageSize&(pageSize-1) != 0 {
		return fmt.Errorf("%w: page size %d", ErrInvalidWR, pageSize)
	}
	if len(pages) == 0 || len(pages) > m.maxPages {
		return fmt.Errorf("%w: %d pages, the MR maps 1 to %d", ErrInvalidWR, len(pages), m.maxPages)
	}
	if offset < 0 || offset >= pageSize || length < 0 || offset+length > len(pages)*pageSize {
		return fmt.Errorf("%w: %d bytes at offset %d of %d pages of %d", ErrInvalidWR, length, offset, len(pages), pageSize)
	}
	run, contiguous := pages[0], true
	for i, p := range pages {
		if len(p) != pageSize {
			return fmt.Errorf("%w: page %d is %d bytes, not %d", ErrInvalidWR, i, len(p), pageSize)
		}
		if i > 0 && contiguous {
			run, contiguous = follow(run, p)
		}
	}
	if contiguous || length == 0 {
		m.set(run[offset:offset+length], nil)
		return nil
	}
	m.set(nil, newPageList(pages, pageSize, offset, length))
	return nil
}

// MapSG sets the memory the next REG_MR maps: the bytes the SGEs name, in
// order, spanning at most MaxPages pages of pageSize (ib_map_mr_sg). SGEs
// that follow one another in memory make one run; where one does not,
// the SGE before it must end and it must start on a page boundary (an
// address that is a multiple of pageSize), as ib_map_mr_sg requires, and
// the mapping becomes a page list over the runs. Each SGE must lie in a
// regular MR of the MR's protection domain; the mapping takes the bytes,
// not those MRs: deregistering one later does not unmap them.
func (m *FastRegMR) MapSG(sgl []SGE, pageSize int) error {
	if pageSize < MinPageSize || pageSize > MaxPageSize || pageSize&(pageSize-1) != 0 {
		return fmt.Errorf("%w: page size %d", ErrInvalidWR, pageSize)
	}
	if len(sgl) == 0 {
		return fmt.Errorf("%w: empty SGE list", ErrInvalidWR)
	}
	var runs [][]byte // the SGEs, merged where they follow one another
	for i, s := range sgl {
		r := m.mem.Lookup(s.LKey)
		if r == nil || r.PD != m.pd || r.Kind != KindMR {
			return fmt.Errorf("%w: SGE %d: lkey %#x is no MR of the protection domain", ErrInvalidWR, i, s.LKey)
		}
		b, ok := r.Slice(s.Addr, uint64(s.Length))
		if !ok {
			return fmt.Errorf("%w: SGE %d lies outside its MR", ErrInvalidWR, i)
		}
		switch {
		case len(runs) == 0:
			runs = append(runs, b)
		case len(b) == 0:
		default:
			last := &runs[len(runs)-1]
			if ext, ok := follow(*last, b); ok {
				*last = ext
			} else {
				runs = append(runs, b)
			}
		}
	}
	ps := uintptr(pageSize)
	if len(runs) == 1 {
		run := runs[0]
		if len(run) > 0 {
			start := addrOf(run)
			first, end := start&^(ps-1), (start+uintptr(len(run))+ps-1)&^(ps-1)
			if n := int((end - first) / ps); n > m.maxPages {
				return fmt.Errorf("%w: the SGEs span %d pages, the MR maps %d", ErrInvalidWR, n, m.maxPages)
			}
		}
		m.set(run, nil)
		return nil
	}
	// Separate runs: cut them into pages at page boundaries. Every run
	// but the first starts on a boundary and every run but the last ends
	// on one, so every piece but the first and the last is a whole page.
	var pieces [][]byte
	total := 0
	for i, run := range runs {
		start := addrOf(run)
		if i > 0 && start&(ps-1) != 0 {
			return fmt.Errorf("%w: SGE run %d does not start on a %d-byte page boundary after a gap", ErrInvalidWR, i, pageSize)
		}
		if i < len(runs)-1 && (start+uintptr(len(run)))&(ps-1) != 0 {
			return fmt.Errorf("%w: SGE run %d does not end on a %d-byte page boundary before a gap", ErrInvalidWR, i, pageSize)
		}
		for len(run) > 0 {
			k := min(len(run), int(ps-addrOf(run)&(ps-1)))
			pieces = append(pieces, run[:k:k])
			run = run[k:]
		}
		total += len(runs[i])
	}
	if len(pieces) > m.maxPages {
		return fmt.Errorf("%w: the SGEs span %d pages, the MR maps %d", ErrInvalidWR, len(pieces), m.maxPages)
	}
	m.set(nil, &pageList{pieces: pieces, first: uint64(len(pieces[0])), shift: uint(bits.TrailingZeros(uint(pageSize))), n: uint64(total)})
	return nil
}

// addrOf returns the address of b's first byte.
func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

func (m *FastRegMR) set(b []byte, p *pageList) {
	m.mu.Lock()
	m.buf, m.pages, m.mapped = b, p, true
	if p != nil {
		m.iova = BufferAddr(p.pieces[0])
	} else {
		m.iova = BufferAddr(b)
	}
	m.mu.Unlock()
}

// SetIOVA sets the Tagged Offset of the first mapped byte for the next
// VA-based REG_MR (the kernel verbs' mr->iova after ib_map_mr_sg, which a
// consumer may change before posting the registration; ibv_reg_mr_iova
// for a regular MR). Map resets it to the first byte's address; a
// zero-based registration (AccessZeroBased) starts at 0 whatever it is.
// The TO range must not wrap.
func (m *FastRegMR) SetIOVA(iova uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.mapped {
		return fmt.Errorf("%w: IOVA of an MR with nothing mapped", ErrInvalidWR)
	}
	n := uint64(len(m.buf))
	if m.pages != nil {
		n = m.pages.n
	}
	if iova+n < iova {
		return fmt.Errorf("%w: IOVA %#x + %d bytes wraps", ErrInvalidWR, iova, n)
	}
	m.iova = iova
	return nil
}

// mapping returns what the next REG_MR maps and its IOVA.
func (m *FastRegMR) mapping() ([]byte, *pageList, uint64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.buf, m.pages, m.iova, m.mapped
}

// follow returns a extended by b when b's bytes directly follow a's in the
// same allocation (a's capacity reaches over them).
func follow(a, b []byte) ([]byte, bool) {
	if len(b) == 0 {
		return a, true
	}
	if len(a) == 0 {
		return b, true
	}
	if cap(a)-len(a) < len(b) {
		return nil, false
	}
	ext := a[:len(a)+len(b)]
	if unsafe.SliceData(ext[len(a):]) != unsafe.SliceData(b) {
		return nil, false
	}
	return ext, true
}
