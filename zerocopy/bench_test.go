package zerocopy

import (
	"strconv"
	"testing"
)

var benchSizes = []int{1448, 16 << 10, 64 << 10, 1 << 20}

func benchName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.Itoa(n>>20) + "MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.Itoa(n>>10) + "KiB"
	}
	return strconv.Itoa(n) + "B"
}

func benchBufs(n int) (dst, src []byte) {
	src = make([]byte, n)
	for i := range src {
		src[i] = byte(i * 31)
	}
	return make([]byte, n), src
}

func BenchmarkCopy(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(benchName(n), func(b *testing.B) {
			dst, src := benchBufs(n)
			b.SetBytes(int64(n))
			for b.Loop() {
				copy(dst, src)
			}
		})
	}
}

func BenchmarkCRC32C(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(benchName(n), func(b *testing.B) {
			_, src := benchBufs(n)
			b.SetBytes(int64(n))
			var crc uint32
			for b.Loop() {
				crc = UpdateCRC32C(crc, src)
			}
			_ = crc
		})
	}
}

// BenchmarkCRC32COld is BenchmarkCRC32C through the previous implementation,
// klauspost/crc32 (SSE4.2 CRC32, 3 streams), for comparison.
func BenchmarkCRC32COld(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(benchName(n), func(b *testing.B) {
			_, src := benchBufs(n)
			b.SetBytes(int64(n))
			var crc uint32
			for b.Loop() {
				crc = updateCRC32CGeneric(crc, src)
			}
			_ = crc
		})
	}
}

// BenchmarkCRC32CSmall locates the crossover between the folding kernel and
// the SSE4.2 path (fold512Min).
func BenchmarkCRC32CSmall(b *testing.B) {
	for _, n := range []int{4, 16, 48, 64, 128, 192, 256, 320, 512, 1024, 1420} {
		_, src := benchBufs(n)
		b.Run(benchName(n)+"/new", func(b *testing.B) {
			b.SetBytes(int64(n))
			var crc uint32
			for b.Loop() {
				crc = UpdateCRC32C(crc, src)
			}
			_ = crc
		})
		b.Run(benchName(n)+"/old", func(b *testing.B) {
			b.SetBytes(int64(n))
			var crc uint32
			for b.Loop() {
				crc = updateCRC32CGeneric(crc, src)
			}
			_ = crc
		})
	}
}

// copyCRCOld is CopyCRC as it was before the folding kernel: 8 KiB chunks,
// klauspost/crc32. Kept for BenchmarkCopyCRCOld.
func copyCRCOld(dst, src []byte, crc uint32) (int, uint32) {
	const chunk = 8 << 10
	n := min(len(dst), len(src))
	dst, src = dst[:n], src[:n]
	for len(src) > chunk {
		copy(dst[:chunk], src[:chunk])
		crc = updateCRC32CGeneric(crc, dst[:chunk])
		dst, src = dst[chunk:], src[chunk:]
	}
	copy(dst, src)
	return n, updateCRC32CGeneric(crc, dst)
}

// copyCRCChunk is CopyCRC (non-overlapping) with a variable chunk size, for
// BenchmarkCopyCRCChunk.
func copyCRCChunk(dst, src []byte, crc uint32, chunk int) (int, uint32) {
	n := min(len(dst), len(src))
	dst, src = dst[:n], src[:n]
	for len(src) > chunk {
		copy(dst[:chunk], src[:chunk])
		crc = updateCRC32C(crc, dst[:chunk])
		dst, src = dst[chunk:], src[chunk:]
	}
	copy(dst, src)
	return n, updateCRC32C(crc, dst)
}

func BenchmarkCopyCRCOld(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(benchName(n), func(b *testing.B) {
			dst, src := benchBufs(n)
			b.SetBytes(int64(n))
			var crc uint32
			for b.Loop() {
				_, crc = copyCRCOld(dst, src, crc)
			}
			_ = crc
		})
	}
}

// BenchmarkCopyCRCChunk sweeps the chunk size of the copy-then-CRC loop
// (ChunkSize) with the current CRC kernel, against CopyCRC ("fused", the
// single-pass copy+fold kernel where available),
// L1/L2-resident (64 KiB), L3 (1 MiB: src+dst exceed L2) and DRAM (64 MiB).
func BenchmarkCopyCRCChunk(b *testing.B) {
	for _, n := range []int{64 << 10, 1 << 20, 64 << 20} {
		dst, src := benchBufs(n)
		for _, chunk := range []int{1 << 10, 2 << 10, 4 << 10, 8 << 10, 16 << 10, 64 << 10} {
			b.Run(benchName(n)+"/"+benchName(chunk), func(b *testing.B) {
				b.SetBytes(int64(n))
				var crc uint32
				for b.Loop() {
					_, crc = copyCRCChunk(dst, src, crc, chunk)
				}
				_ = crc
			})
		}
		b.Run(benchName(n)+"/fused", func(b *testing.B) {
			b.SetBytes(int64(n))
			var crc uint32
			for b.Loop() {
				_, crc = CopyCRC(dst, src, crc)
			}
			_ = crc
		})
	}
}

// BenchmarkCopyCRC is the fused kernel: copy a chunk, CRC it while hot.
func BenchmarkCopyCRC(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(benchName(n), func(b *testing.B) {
			dst, src := benchBufs(n)
			b.SetBytes(int64(n))
			var crc uint32
			for b.Loop() {
				_, crc = CopyCRC(dst, src, crc)
			}
			_ = crc
		})
	}
}

// BenchmarkCopyThenCRC is the unfused baseline: copy everything, then CRC
// the destination.
func BenchmarkCopyThenCRC(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(benchName(n), func(b *testing.B) {
			dst, src := benchBufs(n)
			b.SetBytes(int64(n))
			var crc uint32
			for b.Loop() {
				copy(dst, src)
				crc = UpdateCRC32C(crc, dst)
			}
			_ = crc
		})
	}
}

// BenchmarkSGListCopyToCRC gathers a 64 KiB message from MSS-sized segments.
func BenchmarkSGListCopyToCRC(b *testing.B) {
	const seg, nseg = 1448, 45
	l := make(SGList, nseg)
	for i := range l {
		l[i] = make([]byte, seg)
	}
	dst := make([]byte, seg*nseg)
	b.SetBytes(int64(len(dst)))
	var crc uint32
	for b.Loop() {
		_, crc = l.CopyToCRC(dst, 0, crc)
	}
	_ = crc
}

// BenchmarkStreamCopy models the data path's copies of 64 KiB pieces
// against plain memmove: "tx" reads a cold source cycling over 128 MiB into
// a hot (just cleared, like netstack's pooled chunks) 64 KiB destination;
// "rx" copies a hot 64 KiB packet into a destination cycling over 128 MiB.
func BenchmarkStreamCopy(b *testing.B) {
	const piece, span = 64 << 10, 128 << 20
	big := make([]byte, span)
	for i := range big {
		big[i] = byte(i * 7)
	}
	hot := make([]byte, piece+64)
	kernels := []struct {
		name string
		f    func(dst, src []byte)
	}{
		{"memmove", func(dst, src []byte) { copy(dst, src) }},
		{"copycrc", func(dst, src []byte) { CopyCRC(dst, src, 0) }},
		{"placecrc", func(dst, src []byte) { PlaceCRC(dst, src, 0) }},
	}
	// Offsets as in FPDUs: payload behind a 16-byte header, 4-aligned.
	for _, mis := range []struct {
		name string
		d, s int
	}{{"aligned", 0, 0}, {"mis16-20", 16, 20}, {"mis16-0", 16, 0}} {
		for _, k := range kernels {
			b.Run("tx/"+mis.name+"/"+k.name, func(b *testing.B) {
				b.SetBytes(piece)
				off := 0
				for b.Loop() {
					clear(hot)
					k.f(hot[mis.d:mis.d+piece-64], big[off+mis.s:off+mis.s+piece-64])
					off = (off + piece) % span
				}
			})
			b.Run("rx/"+mis.name+"/"+k.name, func(b *testing.B) {
				b.SetBytes(piece)
				off := 0
				for b.Loop() {
					k.f(big[off+mis.d:off+mis.d+piece-64], hot[mis.s:mis.s+piece-64])
					off = (off + piece) % span
				}
			})
		}
	}
}
