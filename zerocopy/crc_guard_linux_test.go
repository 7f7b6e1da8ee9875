//go:build linux

package zerocopy

import (
	"bytes"
	stdcrc "hash/crc32"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// guardPagesTest checks UpdateCRC32C, CopyCRC and PlaceCRC on buffers that start
// right after and end right before inaccessible pages.
func guardPagesTest(t *testing.T) {
	pg := unix.Getpagesize()
	const dataPages = 8 // more than PlaceMin
	mem, err := unix.Mmap(-1, 0, (dataPages+2)*pg, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		t.Skip("mmap:", err)
	}
	defer unix.Munmap(mem)
	if err := unix.Mprotect(mem[:pg], unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mprotect(mem[(dataPages+1)*pg:], unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	data := mem[pg : (dataPages+1)*pg]
	for i := range data {
		data[i] = byte(i*7 + 3)
	}
	dst := make([]byte, len(data))
	for n := 0; n <= len(data); n += 1 + n/64 {
		for _, p := range [][]byte{data[:n], data[len(data)-n:]} {
			want := stdcrc.Update(0x1234, stdCastagnoli, p)
			if got := UpdateCRC32C(0x1234, p); got != want {
				t.Fatalf("guarded len %d = %#08x, want %#08x", n, got, want)
			}
			if _, got := CopyCRC(dst, p, 0x1234); got != want {
				t.Fatalf("guarded CopyCRC len %d = %#08x, want %#08x", n, got, want)
			}
			if _, got := PlaceCRC(dst, p, 0x1234); got != want {
				t.Fatalf("guarded PlaceCRC len %d = %#08x, want %#08x", n, got, want)
			}
		}
	}
	// Guarded destinations (writes outside dst fault).
	src := make([]byte, len(data))
	for i := range src {
		src[i] = byte(i*13 + 1)
	}
	for n := 0; n <= len(data); n += 1 + n/64 {
		want := stdcrc.Update(0x5678, stdCastagnoli, src[:n])
		for _, d := range [][]byte{data[:n], data[len(data)-n:]} {
			if k, got := CopyCRC(d, src[:n], 0x5678); k != n || got != want || !bytes.Equal(d, src[:n]) {
				t.Fatalf("CopyCRC into guarded len %d = %d, %#08x, want %#08x", n, k, got, want)
			}
			clear(d)
			if k, got := PlaceCRC(d, src[:n], 0x5678); k != n || got != want || !bytes.Equal(d, src[:n]) {
				t.Fatalf("PlaceCRC into guarded len %d = %d, %#08x, want %#08x", n, k, got, want)
			}
		}
	}
}
