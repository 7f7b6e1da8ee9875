package zerocopy

// Segment is one contiguous piece of an SGList.
type Segment = []byte

// SGList is a list of byte slices viewed as one logical buffer: logical byte
// 0 is the first byte of the first non-empty segment, and so on. Empty
// segments are allowed and are skipped.
//
// The methods never panic on out-of-range arguments: a negative offset or
// length, or an offset at or beyond Len, selects nothing and the copy methods
// return 0 (and the crc unchanged). None of the copy methods allocate.
type SGList [][]byte

// Len returns the total number of bytes in l.
func (l SGList) Len() int {
	n := 0
	for _, s := range l {
		n += len(s)
	}
	return n
}

// locate returns the index of the segment holding logical byte off and the
// offset inside it. ok is false if off is negative or not inside l.
func (l SGList) locate(off int) (i, o int, ok bool) {
	if off < 0 {
		return 0, 0, false
	}
	for i, s := range l {
		if off < len(s) {
			return i, off, true
		}
		off -= len(s)
	}
	return 0, 0, false
}

// CopyTo copies the logical bytes [off, off+len(dst)) of l into dst and
// returns the number of bytes copied, which is short if l ends first.
func (l SGList) CopyTo(dst []byte, off int) int {
	i, o, ok := l.locate(off)
	if !ok {
		return 0
	}
	n := 0
	for ; i < len(l) && n < len(dst); i++ {
		n += copy(dst[n:], l[i][o:])
		o = 0
	}
	return n
}

// CopyFrom copies src into the logical bytes of l starting at off and returns
// the number of bytes copied, which is short if l ends first.
func (l SGList) CopyFrom(off int, src []byte) int {
	n, _ := l.scatter(off, src, 0, copyNoCRC)
	return n
}

// CopyToCRC is CopyTo that also returns crc updated (as by UpdateCRC32C) over
// the copied bytes, using the fused copy+CRC kernel.
func (l SGList) CopyToCRC(dst []byte, off int, crc uint32) (int, uint32) {
	i, o, ok := l.locate(off)
	if !ok {
		return 0, crc
	}
	n := 0
	for ; i < len(l) && n < len(dst); i++ {
		var k int
		k, crc = CopyCRC(dst[n:], l[i][o:], crc)
		n += k
		o = 0
	}
	return n, crc
}

// CopyFromCRC is CopyFrom that also returns crc updated (as by UpdateCRC32C)
// over the copied bytes, using the fused copy+CRC kernel.
func (l SGList) CopyFromCRC(off int, src []byte, crc uint32) (int, uint32) {
	return l.scatter(off, src, crc, CopyCRC)
}

// UpdateCRC32C returns crc updated (as by the package-level UpdateCRC32C) over
// the logical bytes [off, off+n) of l, in place, and the number of bytes
// covered, which is short if l ends first.
func (l SGList) UpdateCRC32C(crc uint32, off, n int) (int, uint32) {
	if n <= 0 {
		return 0, crc
	}
	i, o, ok := l.locate(off)
	if !ok {
		return 0, crc
	}
	done := 0
	for ; i < len(l) && done < n; i++ {
		s := l[i][o:]
		if k := n - done; len(s) > k {
			s = s[:k]
		}
		crc = UpdateCRC32C(crc, s)
		done += len(s)
		o = 0
	}
	return done, crc
}

// Slice returns the sub-list covering the logical bytes [off, off+n) of l
// without copying them. The result is built by appending to dst[:0], so a
// caller that passes a dst with enough capacity gets no allocation. The
// returned segments alias l's memory and have their capacity clipped to their
// length, so appending to one of them cannot overwrite a neighbour. If l ends
// before off+n the result is short; an out-of-range off or a negative n gives
// an empty list. Empty segments are not copied into the result.
func (l SGList) Slice(dst SGList, off, n int) SGList {
	dst = dst[:0]
	if n <= 0 {
		return dst
	}
	i, o, ok := l.locate(off)
	if !ok {
		return dst
	}
	for ; i < len(l) && n > 0; i++ {
		s := l[i][o:]
		o = 0
		if len(s) == 0 {
			continue
		}
		if len(s) > n {
			s = s[:n]
		}
		dst = append(dst, s[:len(s):len(s)])
		n -= len(s)
	}
	return dst
}

// PlaceFrom is CopyFrom with Place's non-temporal stores for large pieces.
func (l SGList) PlaceFrom(off int, src []byte) int {
	n, _ := l.scatter(off, src, 0, placeNoCRC)
	return n
}

// PlaceFromCRC is CopyFromCRC with PlaceCRC's non-temporal stores for large
// pieces.
func (l SGList) PlaceFromCRC(off int, src []byte, crc uint32) (int, uint32) {
	return l.scatter(off, src, crc, PlaceCRC)
}

// scatter copies src into the logical bytes of l from off with kernel,
// threading crc through it.
func (l SGList) scatter(off int, src []byte, crc uint32, kernel func(dst, src []byte, crc uint32) (int, uint32)) (int, uint32) {
	i, o, ok := l.locate(off)
	if !ok {
		return 0, crc
	}
	n := 0
	for ; i < len(l) && n < len(src); i++ {
		var k int
		k, crc = kernel(l[i][o:], src[n:], crc)
		n += k
		o = 0
	}
	return n, crc
}

func copyNoCRC(dst, src []byte, crc uint32) (int, uint32)  { return copy(dst, src), crc }
func placeNoCRC(dst, src []byte, crc uint32) (int, uint32) { return Place(dst, src), crc }

// Prefetch hints the CPU to bring in the logical bytes [off, off+n) of l
// (see the package-level Prefetch); bytes beyond l are ignored.
func (l SGList) Prefetch(off, n int) {
	i, o, ok := l.locate(off)
	if !ok {
		return
	}
	for ; i < len(l) && n > 0; i++ {
		s := l[i][o:]
		s = s[:min(len(s), n)]
		Prefetch(s)
		n -= len(s)
		o = 0
	}
}
