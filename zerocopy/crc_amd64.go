//go:build amd64 && !purego

package zerocopy

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// useFold512 reports whether the CPU (and OS, via XCR0: x/sys/cpu only sets
// the AVX-512 flags when the ZMM and opmask state is enabled) supports the
// VPCLMULQDQ folding kernel in crc_amd64.s. The kernel uses AVX-512F (ZMM
// loads, VPTERNLOGD, 128/256-bit lane extracts), VPCLMULQDQ on ZMM,
// VEX-encoded AVX/AVX2 and PCLMULQDQ on XMM/YMM, and the SSE4.2 CRC32
// instruction for the final reduction and the tail.
var useFold512 = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL &&
	cpu.X86.HasAVX512VPCLMULQDQ && cpu.X86.HasPCLMULQDQ &&
	cpu.X86.HasAVX2 && cpu.X86.HasSSE42

// fold512Min is the shortest input handed to the folding kernel. Below it
// the SSE4.2 CRC32 instruction in klauspost/crc32 is as fast or faster (the
// kernel's fixed cost is the lane reduction at the end). Measured with
// BenchmarkCRC32CSmall.
const fold512Min = 128

// crcFoldTable holds the folding constants x^n mod P for crc_amd64.s, laid
// out as documented in internal/crcgen (Table), which generates them;
// TestFoldTable checks this literal against the generator.
var crcFoldTable = [16]uint64{
	0xe9a5d8be00000000, 0x1426a81500000000, // fold 2048 bits
	0x7ccbbbf200000000, 0x31c9460800000000, // fold 1536 bits
	0x6577b24500000000, 0x7417153f00000000, // fold 1024 bits
	0x1c19243b00000000, 0x75bba45b00000000, // fold 512 bits
	0xa46ef4aa00000000, 0x6051243f00000000, // fold 384 bits
	0x33ccbbbc00000000, 0xa2158b3400000000, // fold 256 bits
	0x3743f7bd00000000, 0x3171d43000000000, // fold 128 bits
	0x0000000000000000, 0x0000000000000000, // fold 0 bits
}

// updateCRC32C is the CRC-32C update used by UpdateCRC32C and CopyCRC.
func updateCRC32C(crc uint32, p []byte) uint32 {
	if useFold512 {
		if len(p) >= fold512Min {
			return ^crc32cFold512(^crc, p, &crcFoldTable)
		}
		if len(p) <= shortMax {
			return ^crc32cShort(^crc, p)
		}
	}
	return updateCRC32CGeneric(crc, p)
}

// shortMax is the longest input crc32cShort takes: FPDU headers, pads and
// alignment heads, where klauspost/crc32's setup costs more than the bytes
// (BenchmarkCRC32CSmall: 16 bytes in ~2 ns against ~6.6).
const shortMax = 64

// crc32cShort returns the raw CRC-32C register after p by the SSE4.2
// CRC32 instruction, 8 bytes at a time.
//
//go:noescape
func crc32cShort(crc uint32, p []byte) uint32

// crc32cFold512 returns the raw (uninverted) CRC-32C register after
// processing p starting from register crc. len(p) must be >= 64.
//
//go:noescape
func crc32cFold512(crc uint32, p []byte, k *[16]uint64) uint32

// copyCRC32CFold512 copies len(dst) bytes from src to dst and returns the raw
// CRC-32C register after processing them starting from register crc, reading
// each byte once (the CRC is folded from the loaded registers). It requires
// len(src) >= len(dst) >= 64 and non-overlapping dst and src.
//
//go:noescape
func copyCRC32CFold512(dst, src []byte, crc uint32, k *[16]uint64) uint32

// copyCRCFast is the amd64 fast path of CopyCRC for non-overlapping,
// equal-length dst and src; it reports false when the kernel is unavailable
// or the input is short.
func copyCRCFast(dst, src []byte, crc uint32) (uint32, bool) {
	if !useFold512 || len(dst) < fold512Min {
		return 0, false
	}
	d := uintptr(unsafe.Pointer(unsafe.SliceData(dst)))
	sp := uintptr(unsafe.Pointer(unsafe.SliceData(src)))
	if (sp-d)&3 == 0 && len(dst) >= shiftMin && len(dst) >= alignMin {
		// dst and src 4-byte aligned to each other (FPDU payloads):
		// align dst, then every load and store is an aligned 64-byte
		// access (copyCRC32CFold512Shift). Measured with
		// BenchmarkStreamCopy/*/mis16-20: rx 23 -> 30 GB/s (memmove:
		// 30), tx from a cold source 19.4 -> 20.5 (memmove: 25).
		if h := int(-d & 63); h != 0 {
			copy(dst[:h], src[:h])
			crc = updateCRC32C(crc, dst[:h])
			dst, src = dst[h:], src[h:]
			sp += uintptr(h)
		}
		if s := sp & 63; s != 0 {
			return ^copyCRC32CFold512Shift(dst, src, ^crc, &crcFoldTable, &permIdx[s/4]), true
		}
		return ^copyCRC32CFold512(dst, src, ^crc, &crcFoldTable), true
	}
	if len(dst) < alignMin {
		return ^copyCRC32CFold512(dst, src, ^crc, &crcFoldTable), true
	}
	// Start the kernel at a 64-byte aligned source: an FPDU's payload
	// sits at 4-byte offsets, and a ZMM load that straddles two cache
	// lines costs two. The head (under 64 bytes) goes through CRC32.
	// Measured with BenchmarkStreamCopy/tx (cold source): 20 -> 22 GB/s.
	if h := int(-sp & 63); h != 0 {
		copy(dst[:h], src[:h])
		crc = updateCRC32C(crc, dst[:h])
		dst, src = dst[h:], src[h:]
		if len(dst) < fold512Min {
			copy(dst, src)
			return updateCRC32C(crc, dst), true
		}
	}
	return ^copyCRC32CFold512(dst, src, ^crc, &crcFoldTable), true
}

// alignMin is the shortest copy worth aligning first: below it the head
// costs more than the aligned accesses save (in situ at MTU 1500, 1420-byte
// FPDUs: RDMA Write throughput +4% without it).
const alignMin = 4096

// shiftMin is the shortest copy that takes the both-aligned path: the
// 63-byte head plus the 256 bytes copyCRC32CFold512Shift needs.
const shiftMin = 64 + 256

// permIdx[k] are the VPERMT2D dword indices k, k+1, ..., k+15: an output
// block starting k dwords into the first of two aligned source blocks.
var permIdx = func() (t [16][16]uint32) {
	for k := range t {
		for j := range t[k] {
			t[k][j] = uint32(k + j)
		}
	}
	return t
}()

// copyCRC32CFold512Shift is copyCRC32CFold512 for a 64-byte aligned dst
// and a src at a 4-byte multiple (not 0) past a 64-byte boundary, idx
// being permIdx[(src&63)/4]. It requires len(dst) >= 256 and
// len(src) >= len(dst).
//
//go:noescape
func copyCRC32CFold512Shift(dst, src []byte, crc uint32, k *[16]uint64, idx *[16]uint32) uint32

// copyCRC32CFold512NT is copyCRC32CFold512 with non-temporal stores; dst
// must be 64-byte aligned.
//
//go:noescape
func copyCRC32CFold512NT(dst, src []byte, crc uint32, k *[16]uint64) uint32

// copyCRCFastNT is copyCRCFast with non-temporal stores to dst.
func copyCRCFastNT(dst, src []byte, crc uint32) (uint32, bool) {
	if !useFold512 || len(dst) < fold512Min+64 {
		return 0, false
	}
	if h := int(-uintptr(unsafe.Pointer(unsafe.SliceData(dst))) & 63); h != 0 {
		copy(dst[:h], src[:h])
		crc = updateCRC32C(crc, dst[:h])
		dst, src = dst[h:], src[h:]
	}
	return ^copyCRC32CFold512NT(dst, src, ^crc, &crcFoldTable), true
}
