package crcgen

import (
	"fmt"
	"math/bits"
	"strings"
)

// PolyNormal is P(x) - x^32 with bit j the coefficient of x^j.
const PolyNormal = 0x1EDC6F41

// PolyReflected is the bit-reversed PolyNormal (hash/crc32.Castagnoli).
const PolyReflected = 0x82F63B78

// XnModP returns x^n mod P in normal form (bit j = coefficient of x^j).
func XnModP(n int) uint32 {
	if n < 0 {
		panic("crcgen: negative exponent")
	}
	r := uint32(1)
	for range n {
		carry := r >> 31
		r <<= 1
		if carry != 0 {
			r ^= PolyNormal
		}
	}
	return r
}

// Reflected64 returns x^n mod P as a reflected 64-bit PCLMULQDQ operand:
// the coefficient of x^j is at bit 63-j.
func Reflected64(n int) uint64 {
	return uint64(bits.Reverse32(XnModP(n))) << 32
}

// FoldPair returns the {low, high} quadword constants that fold a 128-bit
// block forward by d bits (d >= 1).
func FoldPair(d int) [2]uint64 {
	return [2]uint64{Reflected64(d + 63), Reflected64(d - 1)}
}

// Table layout used by crc_amd64.s (byte offsets in brackets):
//
//	[0]   fold by 2048 bits: the 4 x 512-bit lane main loop (256 B/iter)
//	[16]  fold by 1536 bits: lane 0 onto lane 3 after the main loop
//	[32]  fold by 1024 bits: lane 1 onto lane 3
//	[48]  fold by  512 bits: lane 2 onto lane 3, and the 64 B/iter loop
//	[64]  fold by  384 bits: 128-bit lane 0 of a ZMM onto its lane 3
//	[80]  fold by  256 bits: lane 1 onto lane 3
//	[96]  fold by  128 bits: lane 2 onto lane 3, and the 16 B/iter loop
//	[112] zero: lane 3 is kept as is (XORed separately)
var tableFolds = []int{2048, 1536, 1024, 512, 384, 256, 128, 0}

// Table returns the constant table of crc_amd64.s.
func Table() [16]uint64 {
	var t [16]uint64
	for i, d := range tableFolds {
		if d == 0 {
			continue
		}
		p := FoldPair(d)
		t[2*i], t[2*i+1] = p[0], p[1]
	}
	return t
}

// GoSource renders Table as a Go composite literal body, for pasting into
// crc_amd64.go.
func GoSource() string {
	var b strings.Builder
	t := Table()
	for i, d := range tableFolds {
		fmt.Fprintf(&b, "\t%#016x, %#016x, // fold %d bits\n", t[2*i], t[2*i+1], d)
	}
	return b.String()
}
