package zerocopy

import (
	"strconv"
	"testing"
)

var benchSizes = []int{1448, 64 << 10, 1 << 20}

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
