package zerocopy

import (
	"bytes"
	stdcrc "hash/crc32"
	"math"
	"math/rand/v2"
	"testing"
)

// randomSGL splits a fresh random buffer of total bytes into segments (some
// empty) and returns the list and the flat reference copy.
func randomSGL(r *rand.Rand, total int) (SGList, []byte) {
	flat := make([]byte, total)
	fill(r, flat)
	var l SGList
	for rest := total; rest > 0 || r.IntN(3) == 0; {
		if rest == 0 {
			l = append(l, []byte{}) // trailing empty segment
			break
		}
		n := 0
		switch r.IntN(5) {
		case 0: // empty segment
		case 1:
			n = 1
		default:
			n = 1 + r.IntN(rest)
		}
		n = min(n, rest)
		// Give each segment spare capacity to catch writes past its length.
		seg := make([]byte, n, n+8)
		copy(seg, flat[total-rest:])
		l = append(l, seg)
		rest -= n
	}
	return l, flat
}

// window returns flat[off:off+n], or nil when n is 0 (off may then be out of
// range).
func window(flat []byte, off, n int) []byte {
	if n == 0 {
		return nil
	}
	return flat[off : off+n]
}

// flatten returns the logical content of l.
func flatten(l SGList) []byte {
	var out []byte
	for _, s := range l {
		out = append(out, s...)
	}
	return out
}

// spare reports whether any segment's spare capacity was written.
func spare(l SGList) bool {
	for _, s := range l {
		for _, b := range s[len(s):cap(s)] {
			if b != 0 {
				return true
			}
		}
	}
	return false
}

func TestSGListProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for iter := range 3000 {
		total := r.IntN(300)
		if iter%50 == 0 {
			total = r.IntN(3 * ChunkSize)
		}
		if iter%50 == 1 {
			total = r.IntN(4 * PlaceMin) // pieces long enough for Place's kernel
		}
		l, flat := randomSGL(r, total)
		if l.Len() != total {
			t.Fatalf("Len = %d, want %d", l.Len(), total)
		}
		off := r.IntN(total+20) - 10 // includes negative and past-the-end
		n := r.IntN(total + 20)
		want := 0
		if off >= 0 && off < total {
			want = min(n, total-off)
		}
		seed := r.Uint32()

		// CopyTo / CopyToCRC.
		dst := make([]byte, n)
		if got := l.CopyTo(dst, off); got != want || !bytes.Equal(dst[:got], window(flat, off, got)) {
			t.Fatalf("CopyTo(len %d, off %d) over %d bytes = %d, want %d (or data mismatch)", n, off, total, got, want)
		}
		clear(dst)
		got, crc := l.CopyToCRC(dst, off, seed)
		if got != want || !bytes.Equal(dst[:got], window(flat, off, got)) {
			t.Fatalf("CopyToCRC(len %d, off %d) over %d bytes = %d, want %d (or data mismatch)", n, off, total, got, want)
		}
		wcrc := stdcrc.Update(seed, stdCastagnoli, window(flat, off, want))
		if crc != wcrc {
			t.Fatalf("CopyToCRC crc %#08x, want %#08x", crc, wcrc)
		}
		if got, crc := l.UpdateCRC32C(seed, off, n); got != want || crc != wcrc {
			t.Fatalf("SGList.UpdateCRC32C(off %d, n %d) = %d, %#08x, want %d, %#08x", off, n, got, crc, want, wcrc)
		}

		// Slice.
		sub := l.Slice(nil, off, n)
		if sub.Len() != want || !bytes.Equal(flatten(sub), window(flat, off, want)) {
			t.Fatalf("Slice(off %d, n %d) gives %d bytes, want %d (or data mismatch)", off, n, sub.Len(), want)
		}
		for _, s := range sub {
			if len(s) == 0 || cap(s) != len(s) {
				t.Fatalf("Slice produced a segment with len %d cap %d", len(s), cap(s))
			}
		}

		// CopyFrom / CopyFromCRC.
		src := make([]byte, n)
		fill(r, src)
		ref := append([]byte(nil), flat...)
		if want > 0 {
			copy(ref[off:], src[:want])
		}
		if got := l.CopyFrom(off, src); got != want || !bytes.Equal(flatten(l), ref) || spare(l) {
			t.Fatalf("CopyFrom(off %d, len %d) over %d bytes = %d, want %d (or data mismatch)", off, n, total, got, want)
		}
		fill(r, src)
		if want > 0 {
			copy(ref[off:], src[:want])
		}
		got, crc = l.CopyFromCRC(off, src, seed)
		if got != want || !bytes.Equal(flatten(l), ref) || spare(l) {
			t.Fatalf("CopyFromCRC(off %d, len %d) over %d bytes = %d, want %d (or data mismatch)", off, n, total, got, want)
		}
		if wcrc := stdcrc.Update(seed, stdCastagnoli, src[:want]); crc != wcrc {
			t.Fatalf("CopyFromCRC crc %#08x, want %#08x", crc, wcrc)
		}

		// PlaceFrom / PlaceFromCRC.
		fill(r, src)
		if want > 0 {
			copy(ref[off:], src[:want])
		}
		if got := l.PlaceFrom(off, src); got != want || !bytes.Equal(flatten(l), ref) || spare(l) {
			t.Fatalf("PlaceFrom(off %d, len %d) over %d bytes = %d, want %d (or data mismatch)", off, n, total, got, want)
		}
		fill(r, src)
		if want > 0 {
			copy(ref[off:], src[:want])
		}
		got, crc = l.PlaceFromCRC(off, src, seed)
		if got != want || !bytes.Equal(flatten(l), ref) || spare(l) {
			t.Fatalf("PlaceFromCRC(off %d, len %d) over %d bytes = %d, want %d (or data mismatch)", off, n, total, got, want)
		}
		if wcrc := stdcrc.Update(seed, stdCastagnoli, src[:want]); crc != wcrc {
			t.Fatalf("PlaceFromCRC crc %#08x, want %#08x", crc, wcrc)
		}
	}
}

func TestSGListEdgeCases(t *testing.T) {
	var empty SGList
	if empty.Len() != 0 || empty.CopyTo(make([]byte, 4), 0) != 0 || empty.CopyFrom(0, []byte{1}) != 0 {
		t.Error("nil SGList should be empty")
	}
	if s := empty.Slice(nil, 0, 10); len(s) != 0 {
		t.Errorf("nil.Slice = %v", s)
	}
	l := SGList{[]byte("ab"), nil, []byte("cde"), {}, []byte("f")}
	dst := make([]byte, 10)
	if n := l.CopyTo(dst, 1); n != 5 || string(dst[:n]) != "bcdef" {
		t.Errorf("CopyTo = %d %q", n, dst[:n])
	}
	if n := l.CopyTo(dst, 6); n != 0 {
		t.Errorf("CopyTo at end = %d", n)
	}
	if n := l.CopyTo(dst, -1); n != 0 {
		t.Errorf("CopyTo at -1 = %d", n)
	}
	if n, crc := l.CopyToCRC(dst, -5, 42); n != 0 || crc != 42 {
		t.Errorf("CopyToCRC at -5 = %d %#x", n, crc)
	}
	if n, crc := l.CopyFromCRC(99, dst, 42); n != 0 || crc != 42 {
		t.Errorf("CopyFromCRC at 99 = %d %#x", n, crc)
	}
	if s := l.Slice(nil, 1, -3); len(s) != 0 {
		t.Errorf("Slice with negative n = %q", s)
	}
	if s := l.Slice(nil, 1, int(^uint(0)>>1)); string(flatten(s)) != "bcdef" || len(s) != 3 {
		t.Errorf("Slice(1, MaxInt) = %q", s)
	}
	if n, crc := l.UpdateCRC32C(0, 0, math.MaxInt); n != 6 || crc != CRC32C([]byte("abcdef")) {
		t.Errorf("UpdateCRC32C over all = %d %#x", n, crc)
	}
	// Slice reuses dst's backing array.
	buf := make(SGList, 0, 8)
	s := l.Slice(buf, 1, 3)
	if &s[:1][0] != &buf[:1][0] || string(flatten(s)) != "bcd" {
		t.Errorf("Slice did not reuse dst: %q", s)
	}
	// Slice aliases the original memory.
	s[1][0] = 'X'
	if string(l[2]) != "Xde" {
		t.Errorf("Slice does not alias: %q", l[2])
	}
}

func TestSGListNoAllocs(t *testing.T) {
	l := SGList{make([]byte, 1000), make([]byte, 70000), nil, make([]byte, 3), make([]byte, 50000)}
	buf := make([]byte, 100000)
	sub := make(SGList, 0, len(l))
	var crc uint32
	checks := map[string]func(){
		"CopyTo":          func() { l.CopyTo(buf, 500) },
		"CopyFrom":        func() { l.CopyFrom(500, buf) },
		"CopyToCRC":       func() { _, crc = l.CopyToCRC(buf, 500, crc) },
		"CopyFromCRC":     func() { _, crc = l.CopyFromCRC(500, buf, crc) },
		"PlaceFromCRC":    func() { _, crc = l.PlaceFromCRC(500, buf, crc) },
		"UpdateCRC32C":    func() { _, crc = l.UpdateCRC32C(crc, 500, 100000) },
		"Slice":           func() { sub = l.Slice(sub, 999, 71000) },
		"Len":             func() { _ = l.Len() },
		"CopyTo past end": func() { l.CopyTo(buf, 1<<30) },
		"Prefetch":        func() { l.Prefetch(500, 100000) },
	}
	for name, f := range checks {
		if a := testing.AllocsPerRun(100, f); a != 0 {
			t.Errorf("%s allocates %v times", name, a)
		}
	}
}

// TestSGListPrefetch: a prefetch of any range, inside the list, across
// its segments, past its end or before its start, at any alignment, leaves
// every byte as it was (it is a hint) and does not fault.
func TestSGListPrefetch(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for range 200 {
		total := r.IntN(20000)
		l, flat := randomSGL(r, total)
		for range 20 {
			off, n := r.IntN(total+200)-100, r.IntN(total+200)-50
			l.Prefetch(off, n)
		}
		l.Prefetch(total, 1)
		l.Prefetch(0, total)
		got := make([]byte, total)
		l.CopyTo(got, 0)
		if !bytes.Equal(got, flat) {
			t.Fatal("Prefetch changed the list's bytes")
		}
	}
	// Every length and alignment of the kernel itself, up to a few lines.
	buf := make([]byte, 512)
	for i := range buf {
		buf[i] = byte(i)
	}
	for off := range 130 {
		for n := range 260 {
			Prefetch(buf[off : off+n])
		}
	}
	for i := range buf {
		if buf[i] != byte(i) {
			t.Fatalf("Prefetch changed byte %d", i)
		}
	}
}

func FuzzSGList(f *testing.F) {
	f.Add([]byte{3, 0, 5, 1}, []byte("hello, scatter gather"), 2, 9)
	f.Add([]byte{}, []byte{}, 0, 0)
	f.Add([]byte{0, 0, 200}, []byte("x"), -1, 5)
	f.Fuzz(func(t *testing.T, cuts []byte, data []byte, off, n int) {
		var l SGList
		rest := data
		for _, c := range cuts {
			k := min(int(c), len(rest))
			l = append(l, append([]byte(nil), rest[:k]...))
			rest = rest[k:]
		}
		l = append(l, append([]byte(nil), rest...))
		flat := data
		want := 0
		if off >= 0 && off < len(flat) && n > 0 {
			want = min(n, len(flat)-off)
		}
		if n < 0 || n > 1<<16 {
			n = 1 << 16
			if off >= 0 && off < len(flat) {
				want = min(n, len(flat)-off)
			}
		}
		dst := make([]byte, n)
		got, crc := l.CopyToCRC(dst, off, 0)
		if got != want {
			t.Fatalf("CopyToCRC = %d, want %d", got, want)
		}
		if want > 0 {
			if !bytes.Equal(dst[:got], flat[off:off+got]) || crc != CRC32C(flat[off:off+got]) {
				t.Fatal("CopyToCRC mismatch")
			}
		}
		if s := l.Slice(nil, off, n); s.Len() != want {
			t.Fatalf("Slice len %d, want %d", s.Len(), want)
		}
		if got := l.CopyFrom(off, dst); got != want || !bytes.Equal(flatten(l), flat) {
			t.Fatalf("CopyFrom round trip = %d, want %d", got, want)
		}
	})
}
