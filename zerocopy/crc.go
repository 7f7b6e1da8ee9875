package zerocopy

import (
	"unsafe"

	"github.com/klauspost/crc32"
)

// castagnoliTable is the CRC-32C (Castagnoli) table. Passing the table
// returned by MakeTable(Castagnoli) to crc32.Update selects the hardware
// (SSE4.2 / ARMv8 CRC) implementation where the CPU has one.
var castagnoliTable = crc32.MakeTable(crc32.Castagnoli)

// ChunkSize is the granularity of the copy-then-CRC loop CopyCRC uses when the
// single-pass kernel is unavailable (non-amd64, purego, or no AVX-512
// VPCLMULQDQ): each chunk is copied and then checksummed from the
// destination while it is still in the L1 cache. With klauspost/crc32 (the
// CRC those targets use) 4–8 KiB chunks beat 64 KiB ones by ~10% cache-hot
// (1 MiB) and ~30% from DRAM. Re-measured on Zen 5 with the VPCLMULQDQ
// kernel as the CRC (BenchmarkCopyCRCChunk): 2 KiB would be best cache-hot
// (37 vs 33 GB/s at 64 KiB) but worst from DRAM (12 vs 15 GB/s, as memmove
// switches to REP MOVSQ at 2 KiB), and the single-pass kernel beats every
// chunk size (55 / 45 / 22 GB/s at 64 KiB / 1 MiB / 64 MiB), so on amd64
// the chunk loop is only a fallback and the value stays tuned for it.
const ChunkSize = 8 << 10

// CRC32C returns the CRC-32C (Castagnoli) checksum of p: initial value
// 0xFFFFFFFF, reflected, final xor 0xFFFFFFFF. This is the MPA (RFC 5044)
// FPDU CRC and the iSCSI (RFC 3720) digest.
func CRC32C(p []byte) uint32 {
	return updateCRC32C(0, p)
}

// UpdateCRC32C returns crc extended by the bytes of p. Starting from 0,
// crc = UpdateCRC32C(crc, chunk) over consecutive chunks yields CRC32C of their
// concatenation (the same semantics as hash/crc32.Update).
func UpdateCRC32C(crc uint32, p []byte) uint32 {
	return updateCRC32C(crc, p)
}

// updateCRC32CGeneric is the portable path: github.com/klauspost/crc32, which
// uses the SSE4.2 CRC32 instruction (3 interleaved streams) on amd64 and the
// ARMv8 CRC instructions on arm64. It is the fallback of the amd64 folding
// kernel (short inputs, CPUs without AVX-512 VPCLMULQDQ) and the reference
// the benchmarks compare against.
func updateCRC32CGeneric(crc uint32, p []byte) uint32 {
	return crc32.Update(crc, castagnoliTable, p)
}

// CopyCRC copies min(len(dst), len(src)) bytes from src to dst and returns the
// number of bytes copied and crc updated (as by UpdateCRC32C) over those bytes.
//
// It is the fused kernel. On amd64 with AVX-512 VPCLMULQDQ (and at least
// fold512Min bytes) it is a single pass: each 64-byte vector is loaded from
// src once, stored to dst and folded into the CRC from the register.
// Elsewhere the copy proceeds in ChunkSize pieces and each piece is
// checksummed from the destination immediately after it is written, while
// it is still cache-hot, so every byte is brought in from memory only once.
// Overlapping dst and src are handled like copy (memmove semantics); the CRC is
// then taken over the bytes as they end up in dst, i.e. the original src bytes.
func CopyCRC(dst, src []byte, crc uint32) (int, uint32) {
	n := min(len(dst), len(src))
	if n == 0 {
		return 0, crc
	}
	dst, src = dst[:n], src[:n]
	if overlap(dst, src) {
		// Chunk-wise forward copying could clobber source bytes not yet
		// copied; let memmove handle the whole range, then checksum.
		copy(dst, src)
		return n, UpdateCRC32C(crc, dst)
	}
	if c, ok := copyCRCFast(dst, src, crc); ok {
		return n, c
	}
	for len(src) > ChunkSize {
		copy(dst[:ChunkSize], src[:ChunkSize])
		crc = updateCRC32C(crc, dst[:ChunkSize])
		dst, src = dst[ChunkSize:], src[ChunkSize:]
	}
	copy(dst, src)
	crc = updateCRC32C(crc, dst)
	return n, crc
}

// PlaceMin is the shortest copy PlaceCRC and Place make with non-temporal
// stores; shorter ones are likely read again soon and stay in the cache.
const PlaceMin = 16 << 10

// PlaceCRC is CopyCRC for placing data into memory that will not be read
// soon, as an RNIC's DMA does when RDMA places a large message: copies of
// at least PlaceMin bytes use non-temporal stores on amd64 with AVX-512
// VPCLMULQDQ, which skip reading the destination's cache lines before
// writing them and do not evict the cache (BenchmarkStreamCopy/rx: 41–46
// GB/s against 29–31 for CopyCRC and memmove into a cold destination). The
// stores are fenced before it returns. Elsewhere it is CopyCRC.
func PlaceCRC(dst, src []byte, crc uint32) (int, uint32) {
	n := min(len(dst), len(src))
	if n >= PlaceMin && !overlap(dst[:n], src[:n]) {
		if c, ok := copyCRCFastNT(dst[:n], src[:n], crc); ok {
			return n, c
		}
	}
	return CopyCRC(dst, src, crc)
}

// Place is copy with PlaceCRC's non-temporal stores (the CRC it computes
// on the way costs nothing measurable next to the memory traffic).
func Place(dst, src []byte) int {
	n := min(len(dst), len(src))
	if n >= PlaceMin && !overlap(dst[:n], src[:n]) {
		if _, ok := copyCRCFastNT(dst[:n], src[:n], 0); ok {
			return n
		}
	}
	return copy(dst, src)
}

// overlap reports whether the non-empty slices a and b share any byte.
func overlap(a, b []byte) bool {
	pa := uintptr(unsafe.Pointer(unsafe.SliceData(a)))
	pb := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}
