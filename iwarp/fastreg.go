package iwarp

import (
	"fmt"
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
// rdmatap maps an MR's Tagged Offsets onto one run of memory: the pages
// or SGEs given to Map must follow one another in one Go allocation (as
// pieces of one buffer, zerocopy.Alloc memory, or a registered MR do).
type FastRegMR struct {
	memObject
	maxPages int

	mu     sync.Mutex
	buf    []byte // what the next REG_MR maps
	mapped bool
}

// NewFastRegMR allocates a fast-register MR of protection domain pd that
// may map up to maxPages pages.
func NewFastRegMR(t *MemTable, pd uint32, maxPages int) (*FastRegMR, error) {
	if maxPages <= 0 || maxPages > MaxFastRegPages {
		return nil, fmt.Errorf("%w: fast-register MR of %d pages", ErrInvalidWR, maxPages)
	}
	m := &FastRegMR{maxPages: maxPages}
	if err := t.reserve(&m.memObject, KindFRMR, pd); err != nil {
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
// ib_map_mr_sg, with the first byte offset). The pages must follow one
// another in one allocation.
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
	run := pages[0]
	for i, p := range pages {
		if len(p) != pageSize {
			return fmt.Errorf("%w: page %d is %d bytes, not %d", ErrInvalidWR, i, len(p), pageSize)
		}
		if i > 0 {
			var ok bool
			if run, ok = follow(run, p); !ok {
				return fmt.Errorf("%w: page %d does not follow page %d in memory (rdmatap maps one run of memory)", ErrInvalidWR, i, i-1)
			}
		}
	}
	m.set(run[offset : offset+length])
	return nil
}

// MapSG sets the memory the next REG_MR maps: the bytes the SGEs name, in
// order, which must follow one another in memory and span at most
// MaxPages pages of pageSize (ib_map_mr_sg). Each SGE must lie in a
// regular MR of the MR's protection domain; the mapping takes the bytes,
// not those MRs: deregistering one later does not unmap them.
func (m *FastRegMR) MapSG(sgl []SGE, pageSize int) error {
	if pageSize < MinPageSize || pageSize > MaxPageSize || pageSize&(pageSize-1) != 0 {
		return fmt.Errorf("%w: page size %d", ErrInvalidWR, pageSize)
	}
	if len(sgl) == 0 {
		return fmt.Errorf("%w: empty SGE list", ErrInvalidWR)
	}
	var run []byte
	for i, s := range sgl {
		r := m.mem.Lookup(s.LKey)
		if r == nil || r.PD != m.pd || r.Kind != KindMR {
			return fmt.Errorf("%w: SGE %d: lkey %#x is no MR of the protection domain", ErrInvalidWR, i, s.LKey)
		}
		b, ok := r.Slice(s.Addr, uint64(s.Length))
		if !ok {
			return fmt.Errorf("%w: SGE %d lies outside its MR", ErrInvalidWR, i)
		}
		if i == 0 {
			run = b
		} else if run, ok = follow(run, b); !ok {
			return fmt.Errorf("%w: SGE %d does not follow SGE %d in memory (rdmatap maps one run of memory)", ErrInvalidWR, i, i-1)
		}
	}
	if len(run) > 0 {
		start := uintptr(unsafe.Pointer(unsafe.SliceData(run)))
		ps := uintptr(pageSize)
		first, end := start&^(ps-1), (start+uintptr(len(run))+ps-1)&^(ps-1)
		if n := int((end - first) / ps); n > m.maxPages {
			return fmt.Errorf("%w: the SGEs span %d pages, the MR maps %d", ErrInvalidWR, n, m.maxPages)
		}
	}
	m.set(run)
	return nil
}

func (m *FastRegMR) set(b []byte) {
	m.mu.Lock()
	m.buf, m.mapped = b, true
	m.mu.Unlock()
}

// mapping returns what the next REG_MR maps.
func (m *FastRegMR) mapping() ([]byte, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.buf, m.mapped
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
