//go:build linux

package zerocopy

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestAllocSharedSealed: the memfd cannot change size, so another process
// that maps it cannot be faulted by a truncation.
func TestAllocSharedSealed(t *testing.T) {
	b, err := AllocShared("sealed", 8192)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	seals, err := unix.FcntlInt(uintptr(b.Fd()), unix.F_GET_SEALS, 0)
	if err != nil {
		t.Fatal(err)
	}
	if seals&(unix.F_SEAL_SHRINK|unix.F_SEAL_GROW) != unix.F_SEAL_SHRINK|unix.F_SEAL_GROW {
		t.Fatalf("seals %#x", seals)
	}
	if err := unix.Ftruncate(b.Fd(), 4096); err == nil {
		t.Fatal("a sealed memfd shrank")
	}
}

// TestBacking: a slice inside an open shared Buffer names its memfd and
// offset; anything else names nothing.
func TestBacking(t *testing.T) {
	a, err := AllocShared("a", 3*4096)
	if err != nil {
		t.Fatal(err)
	}
	b, err := AllocShared("b", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if fd, off, ok := Backing(a.Bytes()[4096+7 : 8192]); !ok || fd != a.Fd() || off != 4096+7 {
		t.Errorf("Backing(a[4103:8192]) = %d, %d, %v; want %d, 4103", fd, off, ok, a.Fd())
	}
	if fd, off, ok := Backing(b.Bytes()); !ok || fd != b.Fd() || off != 0 {
		t.Errorf("Backing(b) = %d, %d, %v", fd, off, ok)
	}
	if _, _, ok := Backing(make([]byte, 64)); ok {
		t.Error("Go memory has a backing")
	}
	// A slice running past the end of its Buffer, and an empty one.
	// (never touched: Backing looks at the address and length only)
	if _, _, ok := Backing(unsafe.Slice(&a.Bytes()[8192], 8192)); ok {
		t.Error("a slice past the Buffer's end has a backing")
	}
	if _, _, ok := Backing(a.Bytes()[:0]); ok {
		t.Error("an empty slice has a backing")
	}
	p, err := Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, _, ok := Backing(p.Bytes()); ok {
		t.Error("private memory has a backing")
	}
	a.Close()
	if _, _, ok := Backing(b.Bytes()); !ok {
		t.Error("closing one Buffer lost another's backing")
	}
}
