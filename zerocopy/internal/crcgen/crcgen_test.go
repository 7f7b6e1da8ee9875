package crcgen

import (
	"hash/crc32"
	"testing"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// TestXnModPAgainstStdlib checks XnModP independently through hash/crc32:
// with the initial and final inversions cancelled, the CRC register after a
// message M of m bits is M(x)*x^32 mod P (reflected). A message whose only
// set bit is bit b of byte 0, followed by k zero bytes, is x^(8(k+1)-1-b), so
// its register is x^(8(k+1)-1-b+32) mod P.
func TestXnModPAgainstStdlib(t *testing.T) {
	for k := range 300 {
		msg := make([]byte, k+1)
		for b := range 8 {
			msg[0] = 1 << b
			reg := ^crc32.Update(0xFFFFFFFF, castagnoli, msg) // raw register
			n := 8*(k+1) - 1 - b + 32
			if got, want := XnModP(n), reverse32(reg); got != want {
				t.Fatalf("XnModP(%d) = %#08x, via hash/crc32 %#08x", n, got, want)
			}
		}
	}
	if XnModP(32) != PolyNormal {
		t.Fatalf("x^32 mod P = %#x, want %#x", XnModP(32), PolyNormal)
	}
	for n := range 32 {
		if XnModP(n) != 1<<n {
			t.Fatalf("x^%d mod P = %#x", n, XnModP(n))
		}
	}
}

func reverse32(v uint32) uint32 {
	var r uint32
	for i := range 32 {
		r |= (v >> i & 1) << (31 - i)
	}
	return r
}

// clmul is a bitwise carry-less 64x64 -> 128 multiply (lo, hi), as PCLMULQDQ.
func clmul(a, b uint64) (lo, hi uint64) {
	for i := range 64 {
		if b>>i&1 != 0 {
			lo ^= a << i
			if i > 0 {
				hi ^= a >> (64 - i)
			}
		}
	}
	return
}

// TestFoldModel simulates the kernel's folding on random data with a
// software PCLMULQDQ and checks that folding a block forward by d bits and
// XORing it onto the block d bits later, then finishing with the CRC
// register update, matches hash/crc32.
func TestFoldModel(t *testing.T) {
	for _, d := range []int{128, 256, 384, 512, 1024, 1536, 2048} {
		n := d/8 + 16 // block X, then data up to and including block Y
		msg := make([]byte, n)
		for i := range msg {
			msg[i] = byte(i*131 + d)
		}
		le := func(p []byte) uint64 {
			var v uint64
			for i := 7; i >= 0; i-- {
				v = v<<8 | uint64(p[i])
			}
			return v
		}
		L, H := le(msg[0:8]), le(msg[8:16])
		k := FoldPair(d)
		l0, h0 := clmul(L, k[0])
		l1, h1 := clmul(H, k[1])
		folded := append([]byte(nil), msg[16:]...)
		// XOR the folded 128-bit value onto the last 16 bytes (block Y).
		y := folded[len(folded)-16:]
		for i := range 8 {
			y[i] ^= byte((l0 ^ l1) >> (8 * i))
			y[8+i] ^= byte((h0 ^ h1) >> (8 * i))
		}
		// The zero-register CRC of msg and of folded must agree (both are
		// M*x^32 mod P and folding preserves M mod P up to the length).
		want := ^crc32.Update(0xFFFFFFFF, castagnoli, msg)
		got := ^crc32.Update(0xFFFFFFFF, castagnoli, folded)
		if got != want {
			t.Errorf("fold by %d bits: register %#08x, want %#08x", d, got, want)
		}
	}
}

func TestTableLayout(t *testing.T) {
	tab := Table()
	if tab[14] != 0 || tab[15] != 0 {
		t.Fatal("last lane must be zero")
	}
	if p := FoldPair(512); tab[6] != p[0] || tab[7] != p[1] {
		t.Fatal("fold-512 entry misplaced")
	}
	t.Logf("table:\n%s", GoSource())
}
