//go:build amd64 && !purego

#include "textflag.h"

// The copy kernels share their code through two macros: COPY_FOLD_HEAD
// (load, store with STORE, fold, down to one 512-bit accumulator in Z3) and
// COPY_FOLD_TAIL (Z3 down to 128 bits, the last len%16 bytes, the raw CRC in
// AX). Registers: SI src, DI dst, CX bytes left, DX fold table, AX crc,
// Z9 initial crc, Z0-Z3 accumulators, Z4-Z7 products, Z8 fold constants,
// Z10-Z13 data.
#define COPY_FOLD_HEAD(STORE) \
	VMOVD AX, X9; \
	CMPQ CX, $256; \
	JB   start64; \
	VMOVDQU64 0(SI), Z0; \
	STORE Z0, 0(DI); \
	VMOVDQU64 64(SI), Z1; \
	STORE Z1, 64(DI); \
	VMOVDQU64 128(SI), Z2; \
	STORE Z2, 128(DI); \
	VMOVDQU64 192(SI), Z3; \
	STORE Z3, 192(DI); \
	VPXORQ    Z9, Z0, Z0; \
	ADDQ      $256, SI; \
	ADDQ      $256, DI; \
	SUBQ      $256, CX; \
	CMPQ      CX, $256; \
	JB        reduce4; \
	VBROADCASTI32X4 0(DX), Z8; \
loop256: \
	VMOVDQU64  0(SI), Z10; \
	STORE Z10, 0(DI); \
	VMOVDQU64  64(SI), Z11; \
	STORE Z11, 64(DI); \
	VMOVDQU64  128(SI), Z12; \
	STORE Z12, 128(DI); \
	VMOVDQU64  192(SI), Z13; \
	STORE Z13, 192(DI); \
	VPCLMULQDQ $0x00, Z8, Z0, Z4; \
	VPCLMULQDQ $0x11, Z8, Z0, Z0; \
	VPCLMULQDQ $0x00, Z8, Z1, Z5; \
	VPCLMULQDQ $0x11, Z8, Z1, Z1; \
	VPCLMULQDQ $0x00, Z8, Z2, Z6; \
	VPCLMULQDQ $0x11, Z8, Z2, Z2; \
	VPCLMULQDQ $0x00, Z8, Z3, Z7; \
	VPCLMULQDQ $0x11, Z8, Z3, Z3; \
	VPTERNLOGD $0x96, Z10, Z4, Z0; \
	VPTERNLOGD $0x96, Z11, Z5, Z1; \
	VPTERNLOGD $0x96, Z12, Z6, Z2; \
	VPTERNLOGD $0x96, Z13, Z7, Z3; \
	ADDQ       $256, SI; \
	ADDQ       $256, DI; \
	SUBQ       $256, CX; \
	CMPQ       CX, $256; \
	JAE        loop256; \
reduce4: \
	VBROADCASTI32X4 16(DX), Z8; \
	VPCLMULQDQ      $0x00, Z8, Z0, Z4; \
	VPCLMULQDQ      $0x11, Z8, Z0, Z0; \
	VPTERNLOGD      $0x96, Z4, Z0, Z3; \
	VBROADCASTI32X4 32(DX), Z8; \
	VPCLMULQDQ      $0x00, Z8, Z1, Z5; \
	VPCLMULQDQ      $0x11, Z8, Z1, Z1; \
	VPTERNLOGD      $0x96, Z5, Z1, Z3; \
	VBROADCASTI32X4 48(DX), Z8; \
	VPCLMULQDQ      $0x00, Z8, Z2, Z6; \
	VPCLMULQDQ      $0x11, Z8, Z2, Z2; \
	VPTERNLOGD      $0x96, Z6, Z2, Z3; \
	JMP             tail64; \
start64: \
	VMOVDQU64       0(SI), Z3; \
	STORE Z3, 0(DI); \
	VPXORQ          Z9, Z3, Z3; \
	ADDQ            $64, SI; \
	ADDQ            $64, DI; \
	SUBQ            $64, CX; \
	VBROADCASTI32X4 48(DX), Z8; \
tail64: \
	CMPQ CX, $64; \
	JB   reduce1; \
loop64: \
	VMOVDQU64  0(SI), Z10; \
	STORE Z10, 0(DI); \
	VPCLMULQDQ $0x00, Z8, Z3, Z4; \
	VPCLMULQDQ $0x11, Z8, Z3, Z3; \
	VPTERNLOGD $0x96, Z10, Z4, Z3; \
	ADDQ       $64, SI; \
	ADDQ       $64, DI; \
	SUBQ       $64, CX; \
	CMPQ       CX, $64; \
	JAE        loop64;

#define COPY_FOLD_TAIL \
reduce1: \
	VMOVDQU64     64(DX), Z8; \
	VPCLMULQDQ    $0x00, Z8, Z3, Z4; \
	VPCLMULQDQ    $0x11, Z8, Z3, Z5; \
	VEXTRACTI32X4 $3, Z3, X6; \
	VPXORQ        Z4, Z5, Z4; \
	VEXTRACTI64X4 $1, Z4, Y5; \
	VPXOR         Y5, Y4, Y4; \
	VEXTRACTI128  $1, Y4, X5; \
	VPTERNLOGD    $0x96, X5, X4, X6; \
	CMPQ    CX, $16; \
	JB      finish; \
	VMOVDQU 96(DX), X8; \
loop16: \
	VPCLMULQDQ $0x00, X8, X6, X4; \
	VPCLMULQDQ $0x11, X8, X6, X6; \
	VMOVDQU    0(SI), X10; \
	VMOVDQU    X10, 0(DI); \
	VPTERNLOGD $0x96, X10, X4, X6; \
	ADDQ       $16, SI; \
	ADDQ       $16, DI; \
	SUBQ       $16, CX; \
	CMPQ       CX, $16; \
	JAE        loop16; \
finish: \
	XORL   AX, AX; \
	VMOVQ  X6, BX; \
	CRC32Q BX, AX; \
	VPEXTRQ $1, X6, BX; \
	CRC32Q BX, AX; \
	CMPQ   CX, $8; \
	JB     tail4; \
	MOVQ   0(SI), BX; \
	MOVQ   BX, 0(DI); \
	CRC32Q BX, AX; \
	ADDQ   $8, SI; \
	ADDQ   $8, DI; \
	SUBQ   $8, CX; \
tail4: \
	CMPQ   CX, $4; \
	JB     tail1; \
	MOVL   0(SI), BX; \
	MOVL   BX, 0(DI); \
	CRC32L BX, AX; \
	ADDQ   $4, SI; \
	ADDQ   $4, DI; \
	SUBQ   $4, CX; \
tail1: \
	TESTQ CX, CX; \
	JZ    done; \
loop1: \
	MOVBLZX 0(SI), BX; \
	MOVB   BX, 0(DI); \
	CRC32B BX, AX; \
	INCQ   SI; \
	INCQ   DI; \
	DECQ   CX; \
	JNZ    loop1; \
done: \
	VZEROUPPER;

// CRC-32C by carry-less multiplication folding (VPCLMULQDQ on ZMM).
//
// Math (derived and checked in internal/crcgen): a 16-byte little-endian
// block is the polynomial X = L*x^64 + H (L = low quadword = earlier bytes,
// bits reflected). X*x^D mod P = L*K1 ^ H*K2 with K1 = x^(D+63) mod P,
// K2 = x^(D-1) mod P stored reflected in the high 32 bits of a quadword (the
// "-1" absorbs the extra factor x of a reflected PCLMULQDQ). Folding keeps
// everything congruent mod P; the result is a 128-bit block X' with
// crc-register(message) = X' * x^32 mod P, which is exactly what two CRC32Q
// instructions starting from register 0 compute (CRC32Q r, q computes
// (r*x^64 + q*x^32) mod P). The initial register is XORed into the first 4
// message bytes: r0*x^(8n) + M*x^32 = (r0*x^(8n-32) + M)*x^32.
//
// Table k (see internal/crcgen.Table), byte offsets:
//	0: fold 2048   16: fold 1536   32: fold 1024   48: fold 512
//	64..127: per-128-bit-lane fold 384, 256, 128, 0 (ZMM -> XMM reduction)

// Each fold step computes, per 128-bit lane, clmul(x.lo, k.lo) ^
// clmul(x.hi, k.hi) ^ data with two VPCLMULQDQ and one VPTERNLOGD (0x96 is
// the three-way XOR). The caller (crc_amd64.go) passes the inverted crc
// register and inverts the result; it guarantees len(p) >= 64.

// func crc32cFold512(crc uint32, p []byte, k *[16]uint64) uint32
TEXT ·crc32cFold512(SB), NOSPLIT, $0-44
	MOVL crc+0(FP), AX
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX
	MOVQ k+32(FP), DX

	VMOVD AX, X9 // VEX: zeroes bits 32..511 of Z9

	CMPQ CX, $256
	JB   start64

	// Four 512-bit accumulators over the first 256 bytes.
	VMOVDQU64 0(SI), Z0
	VMOVDQU64 64(SI), Z1
	VMOVDQU64 128(SI), Z2
	VMOVDQU64 192(SI), Z3
	VPXORQ    Z9, Z0, Z0
	ADDQ      $256, SI
	SUBQ      $256, CX
	CMPQ      CX, $256
	JB        reduce4

	VBROADCASTI32X4 0(DX), Z8 // fold 2048 bits

loop256:
	VMOVDQU64  0(SI), Z10
	VMOVDQU64  64(SI), Z11
	VMOVDQU64  128(SI), Z12
	VMOVDQU64  192(SI), Z13
	VPCLMULQDQ $0x00, Z8, Z0, Z4
	VPCLMULQDQ $0x11, Z8, Z0, Z0
	VPCLMULQDQ $0x00, Z8, Z1, Z5
	VPCLMULQDQ $0x11, Z8, Z1, Z1
	VPCLMULQDQ $0x00, Z8, Z2, Z6
	VPCLMULQDQ $0x11, Z8, Z2, Z2
	VPCLMULQDQ $0x00, Z8, Z3, Z7
	VPCLMULQDQ $0x11, Z8, Z3, Z3
	VPTERNLOGD $0x96, Z10, Z4, Z0
	VPTERNLOGD $0x96, Z11, Z5, Z1
	VPTERNLOGD $0x96, Z12, Z6, Z2
	VPTERNLOGD $0x96, Z13, Z7, Z3
	ADDQ       $256, SI
	SUBQ       $256, CX
	CMPQ       CX, $256
	JAE        loop256

reduce4:
	// Fold Z0, Z1, Z2 onto Z3 (192, 128, 64 bytes ahead).
	VBROADCASTI32X4 16(DX), Z8
	VPCLMULQDQ      $0x00, Z8, Z0, Z4
	VPCLMULQDQ      $0x11, Z8, Z0, Z0
	VPTERNLOGD      $0x96, Z4, Z0, Z3
	VBROADCASTI32X4 32(DX), Z8
	VPCLMULQDQ      $0x00, Z8, Z1, Z5
	VPCLMULQDQ      $0x11, Z8, Z1, Z1
	VPTERNLOGD      $0x96, Z5, Z1, Z3
	VBROADCASTI32X4 48(DX), Z8
	VPCLMULQDQ      $0x00, Z8, Z2, Z6
	VPCLMULQDQ      $0x11, Z8, Z2, Z2
	VPTERNLOGD      $0x96, Z6, Z2, Z3
	JMP             tail64

start64:
	// 64 <= len < 256: a single 512-bit accumulator.
	VMOVDQU64       0(SI), Z3
	VPXORQ          Z9, Z3, Z3
	ADDQ            $64, SI
	SUBQ            $64, CX
	VBROADCASTI32X4 48(DX), Z8

tail64:
	// Z8 = fold 512 bits.
	CMPQ CX, $64
	JB   reduce1

loop64:
	VMOVDQU64  0(SI), Z10
	VPCLMULQDQ $0x00, Z8, Z3, Z4
	VPCLMULQDQ $0x11, Z8, Z3, Z3
	VPTERNLOGD $0x96, Z10, Z4, Z3
	ADDQ       $64, SI
	SUBQ       $64, CX
	CMPQ       CX, $64
	JAE        loop64

reduce1:
	// Fold 128-bit lanes 0, 1, 2 of Z3 onto lane 3 (lane 3's constants
	// are zero, so its products vanish and it is XORed in unchanged).
	VMOVDQU64     64(DX), Z8
	VPCLMULQDQ    $0x00, Z8, Z3, Z4
	VPCLMULQDQ    $0x11, Z8, Z3, Z5
	VEXTRACTI32X4 $3, Z3, X6
	VPXORQ        Z4, Z5, Z4
	VEXTRACTI64X4 $1, Z4, Y5
	VPXOR         Y5, Y4, Y4
	VEXTRACTI128  $1, Y4, X5
	VPTERNLOGD    $0x96, X5, X4, X6 // X6 = 128-bit accumulator

	CMPQ    CX, $16
	JB      finish
	VMOVDQU 96(DX), X8 // fold 128 bits

loop16:
	VPCLMULQDQ $0x00, X8, X6, X4
	VPCLMULQDQ $0x11, X8, X6, X6
	VMOVDQU    0(SI), X10
	VPTERNLOGD $0x96, X10, X4, X6
	ADDQ       $16, SI
	SUBQ       $16, CX
	CMPQ       CX, $16
	JAE        loop16

finish:
	// register = X6 * x^32 mod P: two CRC32Q from a zero register.
	XORL   AX, AX
	VMOVQ  X6, BX
	CRC32Q BX, AX
	VPEXTRQ $1, X6, BX
	CRC32Q BX, AX

	// The last len%16 bytes.
	CMPQ   CX, $8
	JB     tail4
	CRC32Q 0(SI), AX
	ADDQ   $8, SI
	SUBQ   $8, CX

tail4:
	CMPQ   CX, $4
	JB     tail1
	CRC32L 0(SI), AX
	ADDQ   $4, SI
	SUBQ   $4, CX

tail1:
	TESTQ CX, CX
	JZ    done

loop1:
	CRC32B 0(SI), AX
	INCQ   SI
	DECQ   CX
	JNZ    loop1

done:
	VZEROUPPER
	MOVL AX, ret+40(FP)
	RET

// func copyCRC32CFold512(dst, src []byte, crc uint32, k *[16]uint64) uint32
//
// copyCRC32CFold512 is crc32cFold512 fused with a copy: every vector is
// stored to dst right after it is loaded from src, so the CRC is computed
// from registers and dst is never read back. len(src) must be >= len(dst)
// >= 64, and dst and src must not overlap.
TEXT ·copyCRC32CFold512(SB), NOSPLIT, $0-68
	MOVL crc+48(FP), AX
	MOVQ src_base+24(FP), SI
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVQ k+56(FP), DX
	COPY_FOLD_HEAD(VMOVDQU64)
	COPY_FOLD_TAIL
	MOVL AX, ret+64(FP)
	RET

// func copyCRC32CFold512NT(dst, src []byte, crc uint32, k *[16]uint64) uint32
//
// copyCRC32CFold512 with non-temporal 512-bit stores (VMOVNTDQ) for
// placement into cold memory: no read-for-ownership of the destination
// lines, and the data does not evict the cache. dst must be 64-byte aligned.
// SFENCE orders the stores before the return.
TEXT ·copyCRC32CFold512NT(SB), NOSPLIT, $0-68
	MOVL crc+48(FP), AX
	MOVQ src_base+24(FP), SI
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVQ k+56(FP), DX
	COPY_FOLD_HEAD(VMOVNTDQ)
	COPY_FOLD_TAIL
	SFENCE
	MOVL AX, ret+64(FP)
	RET

// func copyCRC32CFold512Shift(dst, src []byte, crc uint32, k *[16]uint64, idx *[16]uint32) uint32
//
// copyCRC32CFold512 for a 64-byte aligned dst and a src that is not, but
// is 4-byte aligned relative to it (FPDU payloads are): every load and every
// store is an aligned 64-byte access. The source is read as aligned blocks
// and each output block is cut from two neighbours with VPERMT2D (idx holds
// the dword indices s/4, s/4+1, ..., s/4+15 for s = src&63). An aligned
// block is read only when it holds a needed byte, so no load crosses into a
// page the slice does not touch. It requires len(dst) >= 256 and
// len(src) >= len(dst).
TEXT ·copyCRC32CFold512Shift(SB), NOSPLIT, $0-76
	MOVL crc+48(FP), AX
	MOVQ src_base+24(FP), SI
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVQ k+56(FP), DX
	MOVQ idx+64(FP), BX

	VMOVD     AX, X9 // VEX: zeroes bits 32..511 of Z9
	VMOVDQU64 0(BX), Z14
	MOVQ      SI, R8
	ANDQ      $63, R8  // R8 = s
	SUBQ      R8, SI   // SI = aligned block holding src[0]
	VMOVDQA64 0(SI), Z15

	// First 256 bytes: four accumulators.
	VMOVDQA64 64(SI), Z10
	VMOVDQA64 128(SI), Z11
	VMOVDQA64 192(SI), Z12
	VMOVDQA64 256(SI), Z13
	VPERMT2D  Z10, Z14, Z15
	VPERMT2D  Z11, Z14, Z10
	VPERMT2D  Z12, Z14, Z11
	VPERMT2D  Z13, Z14, Z12
	VMOVDQA64 Z15, 0(DI)
	VMOVDQA64 Z10, 64(DI)
	VMOVDQA64 Z11, 128(DI)
	VMOVDQA64 Z12, 192(DI)
	VPXORQ    Z9, Z15, Z0
	VMOVDQA64 Z10, Z1
	VMOVDQA64 Z11, Z2
	VMOVDQA64 Z12, Z3
	VMOVDQA64 Z13, Z15
	ADDQ      $256, SI
	ADDQ      $256, DI
	SUBQ      $256, CX
	CMPQ      CX, $256
	JB        sreduce4

	VBROADCASTI32X4 0(DX), Z8 // fold 2048 bits

sloop256:
	VMOVDQA64  64(SI), Z10
	VMOVDQA64  128(SI), Z11
	VMOVDQA64  192(SI), Z12
	VMOVDQA64  256(SI), Z13
	VPERMT2D   Z10, Z14, Z15
	VPERMT2D   Z11, Z14, Z10
	VPERMT2D   Z12, Z14, Z11
	VPERMT2D   Z13, Z14, Z12
	VMOVDQA64  Z15, 0(DI)
	VMOVDQA64  Z10, 64(DI)
	VMOVDQA64  Z11, 128(DI)
	VMOVDQA64  Z12, 192(DI)
	VPCLMULQDQ $0x00, Z8, Z0, Z4
	VPCLMULQDQ $0x11, Z8, Z0, Z0
	VPCLMULQDQ $0x00, Z8, Z1, Z5
	VPCLMULQDQ $0x11, Z8, Z1, Z1
	VPCLMULQDQ $0x00, Z8, Z2, Z6
	VPCLMULQDQ $0x11, Z8, Z2, Z2
	VPCLMULQDQ $0x00, Z8, Z3, Z7
	VPCLMULQDQ $0x11, Z8, Z3, Z3
	VPTERNLOGD $0x96, Z15, Z4, Z0
	VPTERNLOGD $0x96, Z10, Z5, Z1
	VPTERNLOGD $0x96, Z11, Z6, Z2
	VPTERNLOGD $0x96, Z12, Z7, Z3
	VMOVDQA64  Z13, Z15
	ADDQ       $256, SI
	ADDQ       $256, DI
	SUBQ       $256, CX
	CMPQ       CX, $256
	JAE        sloop256

sreduce4:
	// Fold Z0, Z1, Z2 onto Z3 (192, 128, 64 bytes ahead).
	VBROADCASTI32X4 16(DX), Z8
	VPCLMULQDQ      $0x00, Z8, Z0, Z4
	VPCLMULQDQ      $0x11, Z8, Z0, Z0
	VPTERNLOGD      $0x96, Z4, Z0, Z3
	VBROADCASTI32X4 32(DX), Z8
	VPCLMULQDQ      $0x00, Z8, Z1, Z5
	VPCLMULQDQ      $0x11, Z8, Z1, Z1
	VPTERNLOGD      $0x96, Z5, Z1, Z3
	VBROADCASTI32X4 48(DX), Z8
	VPCLMULQDQ      $0x00, Z8, Z2, Z6
	VPCLMULQDQ      $0x11, Z8, Z2, Z2
	VPTERNLOGD      $0x96, Z6, Z2, Z3

	// Z8 = fold 512 bits.
	CMPQ CX, $64
	JB   sdone64

sloop64:
	VMOVDQA64  64(SI), Z10
	VPERMT2D   Z10, Z14, Z15
	VMOVDQA64  Z15, 0(DI)
	VPCLMULQDQ $0x00, Z8, Z3, Z4
	VPCLMULQDQ $0x11, Z8, Z3, Z3
	VPTERNLOGD $0x96, Z15, Z4, Z3
	VMOVDQA64  Z10, Z15
	ADDQ       $64, SI
	ADDQ       $64, DI
	SUBQ       $64, CX
	CMPQ       CX, $64
	JAE        sloop64

sdone64:
	// Back to the unaligned source pointer for the last len%64 bytes.
	ADDQ R8, SI
	COPY_FOLD_TAIL
	MOVL AX, ret+72(FP)
	RET

// func crc32cShort(crc uint32, p []byte) uint32
//
// The raw (uninverted) CRC-32C register after p, by the SSE4.2 CRC32
// instruction, 8 bytes at a time: for the short inputs of FPDU headers,
// pads and alignment heads, where a general-purpose routine's setup costs
// more than the bytes.
TEXT ·crc32cShort(SB), NOSPLIT, $0-36
	MOVL crc+0(FP), AX
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX

short8:
	CMPQ   CX, $8
	JB     short4
	CRC32Q 0(SI), AX
	ADDQ   $8, SI
	SUBQ   $8, CX
	JMP    short8

short4:
	CMPQ   CX, $4
	JB     short1
	CRC32L 0(SI), AX
	ADDQ   $4, SI
	SUBQ   $4, CX

short1:
	TESTQ CX, CX
	JZ    shortdone

short1loop:
	CRC32B 0(SI), AX
	INCQ   SI
	DECQ   CX
	JNZ    short1loop

shortdone:
	MOVL AX, ret+32(FP)
	RET
