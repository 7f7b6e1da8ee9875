//go:build amd64 && !purego

package zerocopy

//go:noescape
func prefetch(p *byte, n int)

// Prefetch asks the CPU to bring b's cache lines in (PREFETCHT0) without
// waiting for them: a hint, with no effect on b's contents.
func Prefetch(b []byte) {
	if len(b) > 0 {
		prefetch(&b[0], len(b))
	}
}
