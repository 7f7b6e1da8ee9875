//go:build amd64 && !purego

package zerocopy

import (
	"bytes"
	stdcrc "hash/crc32"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/rdmatap/rdmatap/zerocopy/internal/crcgen"
)

func TestFoldTable(t *testing.T) {
	if want := crcgen.Table(); crcFoldTable != want {
		t.Fatalf("crcFoldTable differs from internal/crcgen; regenerate:\n%s", crcgen.GoSource())
	}
}

// TestFoldKernelUsed: the AVX-512 kernel is chosen exactly when the
// kernel's CPU flags list every extension it uses.
func TestFoldKernelUsed(t *testing.T) {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Skipf("skipping: no /proc/cpuinfo: %v", err)
	}
	var flags map[string]bool
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "flags" {
			flags = map[string]bool{}
			for _, f := range strings.Fields(v) {
				flags[f] = true
			}
			break
		}
	}
	if flags == nil {
		t.Skip("skipping: /proc/cpuinfo lists no flags")
	}
	want := flags["avx512f"] && flags["avx512vl"] && flags["vpclmulqdq"] && flags["pclmulqdq"] && flags["avx2"] && flags["sse4_2"]
	if useFold512 != want {
		t.Fatalf("useFold512 = %v, but the CPU flags say %v", useFold512, want)
	}
	t.Logf("useFold512 = %v (fold512Min %d)", useFold512, fold512Min)
}

// TestFoldKernelDirect drives the assembly kernel for every length it
// accepts (>= 64) up to 4096, at every alignment, including the 64..255
// entry the dispatcher does not use, with random registers.
func TestFoldKernelDirect(t *testing.T) {
	if !useFold512 {
		t.Skip("CPU lacks AVX-512 VPCLMULQDQ")
	}
	r := rand.New(rand.NewPCG(13, 14))
	buf := make([]byte, 4096+128)
	fill(r, buf)
	base := 64 - int(uintptrOf(buf)%64)
	for n := 64; n <= 4096; n++ {
		for _, off := range []int{0, 1, 7, 8, 15, 16, 31, 33, 63} {
			p := buf[base+off : base+off+n]
			seed := r.Uint32()
			got := ^crc32cFold512(^seed, p, &crcFoldTable)
			if want := stdcrc.Update(seed, stdCastagnoli, p); got != want {
				t.Fatalf("crc32cFold512(len %d, align %d) = %#08x, want %#08x", n, off, got, want)
			}
		}
	}
}

// TestFallbackPath runs the public API with the kernel disabled.
func TestFallbackPath(t *testing.T) {
	old := useFold512
	useFold512 = false
	defer func() { useFold512 = old }()
	r := rand.New(rand.NewPCG(15, 16))
	buf := make([]byte, 70000)
	fill(r, buf)
	for _, n := range []int{0, 1, 255, 256, 1448, 70000} {
		seed := r.Uint32()
		if got, want := UpdateCRC32C(seed, buf[:n]), stdcrc.Update(seed, stdCastagnoli, buf[:n]); got != want {
			t.Fatalf("fallback len %d = %#08x, want %#08x", n, got, want)
		}
	}
}

// TestFoldKernelGuardPages places inputs flush against PROT_NONE pages on
// both sides so that any read outside p faults.
func TestFoldKernelGuardPages(t *testing.T) {
	guardPagesTest(t)
}

// TestCopyFoldKernelDirect drives the fused copy kernel for every length
// 64..4096 with independent src/dst alignments and checks the CRC, the copy
// and that no byte outside dst changed.
func TestCopyFoldKernelDirect(t *testing.T) {
	if !useFold512 {
		t.Skip("CPU lacks AVX-512 VPCLMULQDQ")
	}
	r := rand.New(rand.NewPCG(17, 18))
	src := make([]byte, 4096+128)
	dst := make([]byte, 4096+128)
	fill(r, src)
	sb := 64 - int(uintptrOf(src)%64)
	db := 64 - int(uintptrOf(dst)%64)
	for n := 64; n <= 4096; n++ {
		so, do := r.IntN(64), r.IntN(64)
		for i := range dst {
			dst[i] = 0xEE
		}
		s := src[sb+so : sb+so+n]
		d := dst[db+do : db+do+n]
		seed := r.Uint32()
		got := ^copyCRC32CFold512(d, s, ^seed, &crcFoldTable)
		if want := stdcrc.Update(seed, stdCastagnoli, s); got != want {
			t.Fatalf("copyCRC32CFold512(len %d, src %d, dst %d) = %#08x, want %#08x", n, so, do, got, want)
		}
		if !bytes.Equal(d, s) {
			t.Fatalf("copyCRC32CFold512(len %d, src %d, dst %d): copy mismatch", n, so, do)
		}
		for i, c := range dst {
			if (i < db+do || i >= db+do+n) && c != 0xEE {
				t.Fatalf("copyCRC32CFold512(len %d): wrote dst[%d] outside [%d,%d)", n, i, db+do, db+do+n)
			}
		}
	}
}

// TestCopyCRCShiftOffsets runs the both-aligned kernel
// (copyCRC32CFold512Shift) at every source offset it handles, through
// CopyCRC, against the standard library.
func TestCopyCRCShiftOffsets(t *testing.T) {
	if !useFold512 {
		t.Skip("no AVX-512 VPCLMULQDQ")
	}
	r := rand.New(rand.NewPCG(9, 10))
	src := make([]byte, 8192+256)
	fill(r, src)
	dst := make([]byte, len(src))
	for _, n := range []int{shiftMin, shiftMin + 1, 511, 512, 513, 1000, 4096 + 60, 8192} {
		for so := 0; so < 128; so += 4 {
			for _, do := range []int{0, 4, 16, 60, 64} {
				clear(dst)
				s, d := src[so:so+n], dst[do:do+n]
				k, crc := CopyCRC(d, s, 0x1234)
				if k != n || !bytes.Equal(d, s) {
					t.Fatalf("n %d src+%d dst+%d: data mismatch", n, so, do)
				}
				if want := stdcrc.Update(0x1234, stdCastagnoli, s); crc != want {
					t.Fatalf("n %d src+%d dst+%d: crc %#08x, want %#08x", n, so, do, crc, want)
				}
				if bytes.ContainsFunc(dst[:do], func(r rune) bool { return r != 0 }) ||
					bytes.ContainsFunc(dst[do+n:], func(r rune) bool { return r != 0 }) {
					t.Fatalf("n %d src+%d dst+%d: wrote outside dst", n, so, do)
				}
			}
		}
	}
}
