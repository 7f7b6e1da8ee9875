package iwarp

import (
	"math/bits"

	"github.com/rdmatap/rdmatap/zerocopy"
)

// pageList is the memory of a region mapped from a page list whose pages
// do not follow one another in memory (a fast-register MR over separate
// buffers, RFC 5040's STag over "a set of physical pages", or a window
// inside one). The region's Tagged Offset space is contiguous; its bytes
// are not: piece 0 holds the region's first bytes up to the end of their
// page, every further piece one whole page of 1<<shift bytes, and the last
// piece ends where the region ends. Byte off of the region is found by
// arithmetic, without a search.
type pageList struct {
	pieces [][]byte
	first  uint64 // len(pieces[0])
	shift  uint
	n      uint64 // the region's length
}

// newPageList maps length bytes from offset in the first of pages, each
// pageSize bytes (a power of two), onto one TO space. The caller has
// checked the sizes.
func newPageList(pages [][]byte, pageSize, offset, length int) *pageList {
	p := &pageList{shift: uint(bits.TrailingZeros(uint(pageSize))), n: uint64(length)}
	left := length
	for i, pg := range pages {
		if left == 0 {
			break
		}
		if i == 0 {
			pg = pg[offset:]
		}
		pg = pg[:min(len(pg), left):min(len(pg), left)]
		p.pieces = append(p.pieces, pg)
		left -= len(pg)
	}
	if len(p.pieces) == 0 {
		p.pieces = [][]byte{pages[0][offset:offset:offset]} // nothing mapped
	}
	p.first = uint64(len(p.pieces[0]))
	return p
}

// locate returns the piece holding byte off (< p.n) and the offset in it.
func (p *pageList) locate(off uint64) (int, int) {
	if off < p.first {
		return 0, int(off)
	}
	k := off - p.first
	return 1 + int(k>>p.shift), int(k & (1<<p.shift - 1))
}

// appendPieces appends to dst the pieces that hold bytes [off, off+n) of
// the region, which the caller has checked lie inside it.
func (p *pageList) appendPieces(dst zerocopy.SGList, off, n uint64) zerocopy.SGList {
	if n == 0 {
		return dst
	}
	i, o := p.locate(off)
	for n > 0 {
		b := p.pieces[i][o:]
		if uint64(len(b)) > n {
			b = b[:n]
		}
		dst = append(dst, b)
		n -= uint64(len(b))
		i, o = i+1, 0
	}
	return dst
}

// slice returns bytes [off, off+n) when they lie in one piece.
func (p *pageList) slice(off, n uint64) ([]byte, bool) {
	if n == 0 {
		return p.pieces[0][:0], true
	}
	i, o := p.locate(off)
	b := p.pieces[i][o:]
	if uint64(len(b)) < n {
		return nil, false
	}
	return b[:n], true
}

// sub returns the page list of bytes [off, off+n) of the region (a window
// inside it), which the caller has checked lie inside it.
func (p *pageList) sub(off, n uint64) *pageList {
	s := &pageList{shift: p.shift, n: n}
	s.pieces = p.appendPieces(nil, off, n)
	if len(s.pieces) > 0 {
		s.first = uint64(len(s.pieces[0]))
	} else {
		s.pieces = [][]byte{p.pieces[0][:0]}
	}
	return s
}
