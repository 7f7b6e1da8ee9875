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
