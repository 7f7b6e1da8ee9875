//go:build !amd64 || purego

package zerocopy

// Prefetch is a hint that does nothing off amd64.
func Prefetch(b []byte) {}
