package svc

import (
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestEventfdWaitThread: WaitThread times out without a ring, reports and
// consumes a ring (also one made while it waits), allocates nothing, and
// fails once the eventfd is closed.
func TestEventfdWaitThread(t *testing.T) {
	e, err := NewEventfd()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if rang, err := e.WaitThread(2 * time.Millisecond); rang || err != nil {
		t.Fatalf("no ring: %v %v", rang, err)
	}
	if d := time.Since(t0); d < time.Millisecond {
		t.Errorf("returned after %v, want about 2 ms", d)
	}
	e.Signal()
	e.Signal()
	if rang, err := e.WaitThread(time.Second); !rang || err != nil {
		t.Fatalf("after two rings: %v %v", rang, err)
	}
	// Both rings were consumed.
	if rang, _ := e.WaitThread(time.Millisecond); rang {
		t.Fatal("a ring left over")
	}
	go func() {
		time.Sleep(5 * time.Millisecond)
		e.Signal()
	}()
	// rang: it woke for the ring, not for the timeout.
	if rang, err := e.WaitThread(time.Minute); !rang || err != nil {
		t.Fatalf("ring while waiting: %v %v", rang, err)
	}
	if n := testing.AllocsPerRun(100, func() {
		e.Signal()
		e.WaitThread(time.Second)
	}); n != 0 && !raceEnabled {
		t.Errorf("%.1f allocations per WaitThread", n)
	}
	e.Close()
	if _, err := e.WaitThread(time.Millisecond); err == nil {
		t.Fatal("WaitThread on a closed eventfd: no error")
	}
}

// A client that truncates its memfd and seals it only then, between the
// service's two checks, must be refused: the service would map pages past
// the file's end, and the first touch of one is a SIGBUS. The hook plays
// that client at the point between the checks, so the order of the checks
// decides the outcome, whatever the timing.
func TestMapFileShrinkThenSeal(t *testing.T) {
	const size = 1 << 20
	fd, err := unix.MemfdCreate("shrink-race", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	raced := false
	testHookSealsChecked = func(fd int) {
		if err := unix.Ftruncate(fd, 0); err != nil {
			return // sealed already: the race is lost
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK); err != nil {
			t.Errorf("sealing: %v", err)
		}
		raced = true
	}
	defer func() { testHookSealsChecked = nil }()
	mapping, part, err := MapFile(fd, 0, size, true)
	if err == nil {
		// Touching part now would kill the test binary with SIGBUS.
		Unmap(mapping)
		t.Fatalf("a %d-byte mapping of a file truncated and sealed during the checks was accepted (%d bytes; raced %v)", len(part), size, raced)
	}
	if !strings.Contains(err.Error(), "not sealed") {
		t.Fatalf("refused for another reason: %v", err)
	}
}

// Sealed the way zerocopy.AllocShared seals, the file maps, and the
// client can no longer shrink it under the mapping.
func TestMapFileSealed(t *testing.T) {
	const size = 1 << 16
	fd, err := unix.MemfdCreate("sealed", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	if _, _, err := MapFile(fd, 0, size, true); err == nil {
		t.Fatal("an unsealed memfd was mapped")
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK); err != nil {
		t.Fatal(err)
	}
	if _, _, err := MapFile(fd, 4096, size, true); err == nil {
		t.Fatal("a range past the file's end was mapped")
	}
	mapping, part, err := MapFile(fd, 4096, size-4096, true)
	if err != nil {
		t.Fatal(err)
	}
	defer Unmap(mapping)
	part[len(part)-1] = 1
	if err := unix.Ftruncate(fd, 0); err == nil {
		t.Fatal("a file sealed against shrinking was truncated")
	}
	if part[len(part)-1] != 1 {
		t.Fatal("the mapping lost its byte")
	}
}
