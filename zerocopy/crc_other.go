//go:build !amd64 || purego

package zerocopy

// updateCRC32C is the CRC-32C update used by UpdateCRC32C and CopyCRC. Off
// amd64 it is the klauspost/crc32 path (ARMv8 CRC instructions on arm64).
func updateCRC32C(crc uint32, p []byte) uint32 {
	return updateCRC32CGeneric(crc, p)
}

// copyCRCFast is the fused single-pass copy+CRC kernel; there is none off
// amd64, so CopyCRC uses its chunked copy-then-CRC loop.
func copyCRCFast(dst, src []byte, crc uint32) (uint32, bool) { return 0, false }

// copyCRCFastNT is copyCRCFast with non-temporal stores; none off amd64.
func copyCRCFastNT(dst, src []byte, crc uint32) (uint32, bool) { return 0, false }
