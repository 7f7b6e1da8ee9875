package zerocopy

import (
	"bytes"
	stdcrc "hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestCRC32CEveryLengthAlignment compares with hash/crc32 for every length
// 0..2048 at every alignment 0..63, from zero and from a random crc.
func TestCRC32CEveryLengthAlignment(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	buf := make([]byte, 2048+64+64)
	fill(r, buf)
	// Align the base so that off is the address modulo 64.
	base := 64 - int(uintptrOf(buf)%64)
	for n := 0; n <= 2048; n++ {
		for off := range 64 {
			p := buf[base+off : base+off+n]
			if got, want := CRC32C(p), stdcrc.Checksum(p, stdCastagnoli); got != want {
				t.Fatalf("CRC32C(len %d, align %d) = %#08x, stdlib %#08x", n, off, got, want)
			}
			seed := r.Uint32()
			if got, want := UpdateCRC32C(seed, p), stdcrc.Update(seed, stdCastagnoli, p); got != want {
				t.Fatalf("UpdateCRC32C(%#08x, len %d, align %d) = %#08x, stdlib %#08x", seed, n, off, got, want)
			}
		}
	}
}

// TestCRC32CLarge checks random lengths up to 4 MiB at random alignments.
func TestCRC32CLarge(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	buf := make([]byte, 4<<20+64)
	fill(r, buf)
	lens := []int{4 << 20, 4<<20 - 1, 1 << 20, 1<<20 + 255, 65536, 65535, 65537}
	for range 60 {
		lens = append(lens, r.IntN(4<<20+1))
	}
	for _, n := range lens {
		off := r.IntN(64)
		p := buf[off : off+n]
		seed := r.Uint32()
		if got, want := UpdateCRC32C(seed, p), stdcrc.Update(seed, stdCastagnoli, p); got != want {
			t.Fatalf("UpdateCRC32C(%#08x, len %d, off %d) = %#08x, stdlib %#08x", seed, n, off, got, want)
		}
	}
}

// TestCRC32CSplits checks the running-update semantics across arbitrary
// splits: UpdateCRC32C(UpdateCRC32C(0, a), b) == CRC32C(a||b), and for
// many-way splits with pieces on both sides of the kernel threshold.
func TestCRC32CSplits(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	buf := make([]byte, 256<<10)
	fill(r, buf)
	for range 2000 {
		n := r.IntN(len(buf) + 1)
		if r.IntN(2) == 0 {
			n = r.IntN(4096)
		}
		p := buf[:n]
		want := stdcrc.Checksum(p, stdCastagnoli)
		h := r.IntN(n + 1)
		if got := UpdateCRC32C(UpdateCRC32C(0, p[:h]), p[h:]); got != want {
			t.Fatalf("split %d+%d: %#08x, want %#08x", h, n-h, got, want)
		}
		// Many pieces.
		crc := uint32(0)
		for q := p; len(q) > 0; {
			k := min(len(q), 1+r.IntN(1000))
			crc = UpdateCRC32C(crc, q[:k])
			q = q[k:]
		}
		if crc != want {
			t.Fatalf("multi-split of %d bytes: %#08x, want %#08x", n, crc, want)
		}
	}
}

// TestCRC32CLongVectors extends the RFC 3720 B.4 patterns to lengths the
// folding kernel handles; the reference is hash/crc32 (the 32-byte RFC
// values themselves are in TestCRC32CVectors).
func TestCRC32CLongVectors(t *testing.T) {
	for _, n := range []int{64, 256, 257, 1448, 4096, 65536 + 3} {
		for _, pat := range []func(i int) byte{
			func(int) byte { return 0 },
			func(int) byte { return 0xff },
			func(i int) byte { return byte(i) },
			func(i int) byte { return byte(31 - i) },
		} {
			p := make([]byte, n)
			for i := range p {
				p[i] = pat(i)
			}
			if got, want := CRC32C(p), stdcrc.Checksum(p, stdCastagnoli); got != want {
				t.Fatalf("len %d: %#08x, want %#08x", n, got, want)
			}
		}
	}
	// RFC 3720 B.4 "32 bytes of zeroes" through a split that lets the
	// kernel see a long prefix: CRC of 288 zero bytes via update of the
	// first 256 then 32.
	z := make([]byte, 288)
	if got, want := UpdateCRC32C(UpdateCRC32C(0, z[:256]), z[256:]), stdcrc.Checksum(z, stdCastagnoli); got != want {
		t.Fatalf("288 zeros: %#08x, want %#08x", got, want)
	}
	if !bytes.Equal(z, make([]byte, 288)) {
		t.Fatal("input modified")
	}
}

// FuzzCRC32C compares UpdateCRC32C, a two-way split and CopyCRC with
// hash/crc32.
func FuzzCRC32C(f *testing.F) {
	f.Add([]byte("123456789"), uint32(0), uint16(4), uint8(0))
	f.Add(make([]byte, 300), uint32(0xdeadbeef), uint16(256), uint8(3))
	f.Add(bytes.Repeat([]byte{0xa5}, 5000), uint32(1), uint16(1448), uint8(63))
	f.Fuzz(func(t *testing.T, data []byte, seed uint32, split uint16, align uint8) {
		// Re-home the data at the requested alignment.
		a := int(align % 64)
		buf := make([]byte, len(data)+128)
		base := 64 - int(uintptrOf(buf)%64)
		p := buf[base+a : base+a+len(data)]
		copy(p, data)
		want := stdcrc.Update(seed, stdCastagnoli, p)
		if got := UpdateCRC32C(seed, p); got != want {
			t.Fatalf("UpdateCRC32C(%#08x, len %d) = %#08x, want %#08x", seed, len(p), got, want)
		}
		h := int(split) % (len(p) + 1)
		if got := UpdateCRC32C(UpdateCRC32C(seed, p[:h]), p[h:]); got != want {
			t.Fatalf("split at %d of %d = %#08x, want %#08x", h, len(p), got, want)
		}
		dst := make([]byte, len(p))
		if n, got := CopyCRC(dst, p, seed); n != len(p) || got != want || !bytes.Equal(dst, p) {
			t.Fatalf("CopyCRC(len %d) = %d, %#08x, want %#08x", len(p), n, got, want)
		}
	})
}
