package zerocopy

import (
	"bytes"
	stdcrc "hash/crc32"
	"math/rand/v2"
	"testing"
)

var stdCastagnoli = stdcrc.MakeTable(stdcrc.Castagnoli)

func TestCRC32CVectors(t *testing.T) {
	asc := make([]byte, 32)
	desc := make([]byte, 32)
	for i := range 32 {
		asc[i] = byte(i)
		desc[i] = byte(31 - i)
	}
	cases := []struct {
		name string
		in   []byte
		want uint32
	}{
		// RFC 3720 appendix B.4.
		{"32 zeros", make([]byte, 32), 0x8a9136aa},
		{"32 0xff", bytes.Repeat([]byte{0xff}, 32), 0x62a8ab43},
		{"ascending", asc, 0x46dd794e},
		{"descending", desc, 0x113fdb5c},
		// The CRC catalogue check value.
		{"123456789", []byte("123456789"), 0xe3069283},
		{"empty", nil, 0},
	}
	for _, c := range cases {
		if got := CRC32C(c.in); got != c.want {
			t.Errorf("CRC32C(%s) = %#08x, want %#08x", c.name, got, c.want)
		}
		// Running form, byte by byte and in two halves.
		crc := uint32(0)
		for i := range c.in {
			crc = UpdateCRC32C(crc, c.in[i:i+1])
		}
		if crc != c.want {
			t.Errorf("byte-wise UpdateCRC32C(%s) = %#08x, want %#08x", c.name, crc, c.want)
		}
		h := len(c.in) / 2
		if got := UpdateCRC32C(UpdateCRC32C(0, c.in[:h]), c.in[h:]); got != c.want {
			t.Errorf("split UpdateCRC32C(%s) = %#08x, want %#08x", c.name, got, c.want)
		}
		var dst [32]byte
		if n, got := CopyCRC(dst[:], c.in, 0); n != len(c.in) || got != c.want || !bytes.Equal(dst[:n], c.in) {
			t.Errorf("CopyCRC(%s) = %d, %#08x, want %d, %#08x", c.name, n, got, len(c.in), c.want)
		}
	}
}

func TestCRC32CMatchesStdlib(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 1<<20+64)
	fill(r, buf)
	for range 200 {
		off := r.IntN(64)
		n := r.IntN(len(buf) - off)
		p := buf[off : off+n]
		if got, want := CRC32C(p), stdcrc.Checksum(p, stdCastagnoli); got != want {
			t.Fatalf("CRC32C(len %d, off %d) = %#08x, stdlib %#08x", n, off, got, want)
		}
		seed := r.Uint32()
		if got, want := UpdateCRC32C(seed, p), stdcrc.Update(seed, stdCastagnoli, p); got != want {
			t.Fatalf("UpdateCRC32C(%#x, len %d) = %#08x, stdlib %#08x", seed, n, got, want)
		}
	}
	// Every short length at every alignment (the short-input path).
	for n := 0; n <= 200; n++ {
		for off := range 8 {
			p := buf[off : off+n]
			seed := r.Uint32()
			if got, want := UpdateCRC32C(seed, p), stdcrc.Update(seed, stdCastagnoli, p); got != want {
				t.Fatalf("UpdateCRC32C(%#x, len %d, off %d) = %#08x, stdlib %#08x", seed, n, off, got, want)
			}
		}
	}
}

// TestCopyCRCRandom checks CopyCRC, PlaceCRC and Place (whose kernels
// align the source or the destination to 64 bytes first) at random
// lengths and offsets against the standard library.
func TestCopyCRCRandom(t *testing.T) {
	kernels := []struct {
		name string
		f    func(dst, src []byte, crc uint32) (int, uint32)
		crc  bool
	}{
		{"CopyCRC", CopyCRC, true},
		{"PlaceCRC", PlaceCRC, true},
		{"Place", func(dst, src []byte, crc uint32) (int, uint32) { return Place(dst, src), 0 }, false},
	}
	for _, k := range kernels {
		t.Run(k.name, func(t *testing.T) { testCopyCRCRandom(t, k.f, k.crc) })
	}
}

func testCopyCRCRandom(t *testing.T, copyCRC func(dst, src []byte, crc uint32) (int, uint32), checkCRC bool) {
	r := rand.New(rand.NewPCG(3, 4))
	src := make([]byte, 1<<20+64)
	dst := make([]byte, 1<<20+64)
	fill(r, src)
	sizes := []int{0, 1, 7, 1448, ChunkSize - 1, ChunkSize, ChunkSize + 1, 3*ChunkSize + 5, PlaceMin - 1, PlaceMin, PlaceMin + 1, PlaceMin + 63, 1 << 20}
	for range 150 {
		sizes = append(sizes, r.IntN(1<<20+1))
	}
	for _, n := range sizes {
		so, do := r.IntN(64), r.IntN(64)
		s := src[so : so+n]
		// Sometimes make dst shorter or longer than src.
		dn := n
		switch r.IntN(4) {
		case 0:
			dn = r.IntN(n + 1)
		case 1:
			dn = min(n+r.IntN(64), len(dst)-do)
		}
		d := dst[do : do+dn]
		clear(dst)
		seed := r.Uint32()
		got, crc := copyCRC(d, s, seed)
		want := min(n, dn)
		if got != want {
			t.Fatalf("CopyCRC(dst %d, src %d) copied %d, want %d", dn, n, got, want)
		}
		if !bytes.Equal(d[:want], s[:want]) {
			t.Fatalf("CopyCRC(dst %d@%d, src %d@%d): data mismatch", dn, do, n, so)
		}
		if wcrc := stdcrc.Update(seed, stdCastagnoli, s[:want]); checkCRC && crc != wcrc {
			t.Fatalf("CopyCRC(dst %d@%d, src %d@%d) crc %#08x, want %#08x", dn, do, n, so, crc, wcrc)
		}
		if bytes.ContainsFunc(dst[:do], func(r rune) bool { return r != 0 }) ||
			bytes.ContainsFunc(dst[do+want:], func(r rune) bool { return r != 0 }) {
			t.Fatalf("CopyCRC wrote outside dst[%d:%d]", do, do+want)
		}
	}
}

func TestCopyCRCOverlap(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const size = 5*ChunkSize + 123
	orig := make([]byte, size)
	fill(r, orig)
	for _, shift := range []int{-ChunkSize - 1, -ChunkSize, -7, -1, 0, 1, 7, ChunkSize, ChunkSize + 1, 2*ChunkSize + 3} {
		buf := append([]byte(nil), orig...)
		ref := append([]byte(nil), orig...)
		n := size - max(shift, -shift)
		var d, s, rd, rs []byte
		if shift >= 0 {
			d, s, rd, rs = buf[shift:], buf[:n], ref[shift:], ref[:n]
		} else {
			d, s, rd, rs = buf[:n], buf[-shift:], ref[:n], ref[-shift:]
		}
		want := stdcrc.Checksum(rs, stdCastagnoli)
		copy(rd, rs)
		got, crc := CopyCRC(d, s, 0)
		if got != n || crc != want || !bytes.Equal(buf, ref) {
			t.Errorf("overlap shift %d: n=%d crc=%#08x equal=%v, want n=%d crc=%#08x", shift, got, crc, bytes.Equal(buf, ref), n, want)
		}
	}
}

func TestCRCNoAllocs(t *testing.T) {
	src := make([]byte, 256<<10)
	dst := make([]byte, 256<<10)
	var sink uint32
	if a := testing.AllocsPerRun(100, func() { sink += CRC32C(src) }); a != 0 {
		t.Errorf("CRC32C allocates %v times", a)
	}
	if a := testing.AllocsPerRun(100, func() { sink = UpdateCRC32C(sink, src[:1448]) }); a != 0 {
		t.Errorf("UpdateCRC32C allocates %v times", a)
	}
	if a := testing.AllocsPerRun(100, func() { _, sink = CopyCRC(dst, src, sink) }); a != 0 {
		t.Errorf("CopyCRC allocates %v times", a)
	}
	if a := testing.AllocsPerRun(100, func() { _, sink = CopyCRC(src[1:], src, sink) }); a != 0 {
		t.Errorf("overlapping CopyCRC allocates %v times", a)
	}
	_ = sink
}

func fill(r *rand.Rand, p []byte) {
	for i := range p {
		p[i] = byte(r.Uint32())
	}
}
