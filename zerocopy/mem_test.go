//go:build linux

package zerocopy

import (
	"errors"
	"math"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestAlloc(t *testing.T) {
	page := PageSize()
	for _, n := range []int{1, 100, page - 1, page, page + 1, 3 << 20} {
		b, err := Alloc(n)
		if err != nil {
			t.Fatalf("Alloc(%d): %v", n, err)
		}
		p := b.Bytes()
		if len(p) != n || cap(p) != n || b.Len() != n {
			t.Fatalf("Alloc(%d): len %d cap %d", n, len(p), cap(p))
		}
		if addr := uintptr(unsafe.Pointer(unsafe.SliceData(p))); addr%uintptr(page) != 0 {
			t.Fatalf("Alloc(%d) at %#x, not page-aligned", n, addr)
		}
		if b.Fd() != -1 {
			t.Fatalf("private Fd = %d", b.Fd())
		}
		for i := range p {
			if p[i] != 0 {
				t.Fatalf("Alloc(%d): byte %d not zero", n, i)
			}
			p[i] = byte(i * 7)
		}
		for i := range p {
			if p[i] != byte(i*7) {
				t.Fatalf("Alloc(%d): byte %d reads back %d", n, i, p[i])
			}
		}
		if err := b.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := b.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if b.Bytes() != nil || b.Len() != 0 || b.Fd() != -1 {
			t.Fatal("Buffer still usable after Close")
		}
	}
	var nilBuf *Buffer
	if nilBuf.Close() != nil || nilBuf.Bytes() != nil || nilBuf.Fd() != -1 {
		t.Error("nil Buffer methods misbehave")
	}
}

func TestBadSizes(t *testing.T) {
	sizes := []int{0, -1, math.MinInt}
	if strconv.IntSize == 64 {
		tooBig := uint64(MaxAlloc + 1) // a variable, so this compiles where int is 32 bits
		sizes = append(sizes, int(tooBig), math.MaxInt)
	}
	fd, err := unix.MemfdCreate("zerocopy-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	for _, n := range sizes {
		for name, f := range map[string]func() (*Buffer, error){
			"Alloc":       func() (*Buffer, error) { return Alloc(n) },
			"AllocShared": func() (*Buffer, error) { return AllocShared("x", n) },
			"MapShared":   func() (*Buffer, error) { return MapShared(fd, n) },
		} {
			b, err := f()
			if b != nil || !errors.Is(err, ErrInvalidSize) {
				t.Errorf("%s(%d) = %v, %v; want ErrInvalidSize", name, n, b, err)
			}
			var me *MemError
			if !errors.As(err, &me) || me.Size != n {
				t.Errorf("%s(%d): error %v is not a *MemError with the size", name, n, err)
			}
		}
	}
}

func TestMapSharedErrors(t *testing.T) {
	if _, err := MapShared(-1, 4096); !errors.Is(err, ErrInvalidFd) {
		t.Errorf("MapShared(-1) = %v", err)
	}
	// A descriptor that is not open.
	if _, err := MapShared(1<<20, 4096); !errors.Is(err, unix.EBADF) {
		t.Errorf("MapShared(closed fd) = %v", err)
	}
	// A pipe cannot be mapped.
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	if _, err := MapShared(p[0], 4096); !errors.Is(err, ErrNotMappable) {
		t.Errorf("MapShared(pipe) = %v", err)
	}
	// Mapping more than the file holds would SIGBUS on access.
	b, err := AllocShared("small", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := MapShared(b.Fd(), 4097); !errors.Is(err, ErrFileTooSmall) {
		t.Errorf("MapShared beyond EOF = %v", err)
	}
	if _, err := AllocShared("bad\x00name", 4096); !errors.Is(err, ErrInvalidName) {
		t.Errorf("AllocShared(NUL name) = %v", err)
	}
	if _, err := AllocShared(string(make([]byte, 300)), 4096); !errors.Is(err, ErrInvalidName) {
		t.Errorf("AllocShared(long name) = %v", err)
	}
}

func TestSharedSameProcess(t *testing.T) {
	const n = 3*4096 + 100
	a, err := AllocShared("zerocopy-test", n)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.Fd() < 0 {
		t.Fatalf("shared Fd = %d", a.Fd())
	}
	if addr := uintptr(unsafe.Pointer(unsafe.SliceData(a.Bytes()))); addr%uintptr(PageSize()) != 0 {
		t.Fatalf("AllocShared at %#x, not page-aligned", addr)
	}
	b, err := MapShared(a.Fd(), n)
	if err != nil {
		t.Fatal(err)
	}
	if b.Fd() < 0 || b.Fd() == a.Fd() {
		t.Fatalf("MapShared Fd = %d (original %d); want an owned duplicate", b.Fd(), a.Fd())
	}
	pa, pb := a.Bytes(), b.Bytes()
	if &pa[0] == &pb[0] {
		t.Fatal("MapShared returned the same address; want a second mapping")
	}
	for i := range pa {
		pa[i] = byte(i)
	}
	for i := range pb {
		if pb[i] != byte(i) {
			t.Fatalf("byte %d: second mapping sees %d, want %d", i, pb[i], byte(i))
		}
		pb[i] = ^byte(i)
	}
	for i := range pa {
		if pa[i] != ^byte(i) {
			t.Fatalf("byte %d: first mapping sees %d, want %d", i, pa[i], ^byte(i))
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// Closing the second mapping leaves the original descriptor open.
	var st unix.Stat_t
	if err := unix.Fstat(a.Fd(), &st); err != nil {
		t.Fatalf("original fd closed by MapShared's Close: %v", err)
	}
}

// TestSharedOtherProcess hands the memfd to a child process (this test binary
// re-executed), which maps it, checks the parent's pattern and writes a reply.
func TestSharedOtherProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a process")
	}
	const n = 64 << 10
	a, err := AllocShared("zerocopy-child", n)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	p := a.Bytes()
	for i := range p {
		p[i] = byte(i % 251)
	}
	f := os.NewFile(uintptr(a.Fd()), "memfd")
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperChild$")
	cmd.Env = append(os.Environ(), "ZEROCOPY_HELPER_CHILD="+strconv.Itoa(n))
	cmd.ExtraFiles = []*os.File{f} // fd 3 in the child
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	for i := range p {
		if p[i] != byte(i%13) {
			t.Fatalf("byte %d: parent sees %d after child wrote %d", i, p[i], byte(i%13))
		}
	}
}

func TestHelperChild(t *testing.T) {
	s := os.Getenv("ZEROCOPY_HELPER_CHILD")
	if s == "" {
		t.Skip("helper for TestSharedOtherProcess")
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	b, err := MapShared(3, n)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	p := b.Bytes()
	for i := range p {
		if p[i] != byte(i%251) {
			t.Fatalf("child: byte %d is %d, want %d", i, p[i], byte(i%251))
		}
		p[i] = byte(i % 13)
	}
}
