// Package crcgen computes the carry-less folding constants used by the
// amd64 VPCLMULQDQ CRC-32C kernel in package zerocopy (crc_amd64.s).
//
// Conventions (all derived here, see also zerocopy/crc_amd64.s):
//
//   - P is the Castagnoli polynomial x^32 + 0x1EDC6F41 (normal form), whose
//     bit-reflected 32-bit form is 0x82F63B78.
//   - A 16-byte little-endian block loaded into an XMM register holds the
//     polynomial sum(bit_i * x^(127-i)): the first message bit (bit 0 of byte
//     0) is the highest-degree coefficient. Its low quadword L (the earlier
//     8 bytes) and high quadword H satisfy X = L*x^64 + H, where a quadword
//     q stands for sum(q_i * x^(63-i)) ("reflected 64-bit").
//   - PCLMULQDQ of two reflected 64-bit values a, b returns c with
//     c_k = xor_{i+j=k} a_i*b_j; read as a reflected 128-bit value it is
//     x * A * B (the product has degree <= 126, reflected-128 puts bit k at
//     x^(127-k)).
//   - Folding a block X forward by D bits (onto data D bits later) needs
//     X*x^D mod P = L*x^(D+64) + H*x^D (mod P). Using the extra factor x of
//     PCLMULQDQ, multiply L by K1 = x^(D+63) mod P and H by K2 = x^(D-1) mod P,
//     both stored reflected-64 (coefficient of x^j at bit 63-j, i.e. the
//     reflected 32-bit value shifted left by 32). The products have degree
//     < 96, so their sum is a valid 128-bit block congruent to X*x^D.
//
// A pair {K1, K2} is laid out as one 128-bit lane: K1 in the low quadword
// (selected by imm8 0x00 together with L) and K2 in the high quadword
// (imm8 0x11 with H).
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
