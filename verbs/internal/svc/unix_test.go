package svc

import (
	"testing"
	"time"
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
	t0 = time.Now()
	if rang, err := e.WaitThread(5 * time.Second); !rang || err != nil {
		t.Fatalf("ring while waiting: %v %v", rang, err)
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("woke after %v", d)
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
