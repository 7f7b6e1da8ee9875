package verbs_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/verbs"
)

// TestManualProgress: a ManualProgress QP receives only when its
// application drives it (Progress, WaitProgress); WaitProgress gives up
// with its context, returns when the QP is closed under it, and does not
// hold up a concurrent Progress.
func TestManualProgress(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl := newEnd(t, p.a, 4096, nil, nil)
	sv := newEndCfg(t, p.b, 4096, verbs.QPConfig{ManualProgress: true})
	connectEnds(t, p, cl, sv, verbs.ConnParams{})

	fill(cl.buf[:100], 5)
	if err := sv.qp.PostRecv(verbs.RecvWR{ID: 7, SGL: []verbs.SGE{sv.mr.SGE(0, 100)}}); err != nil {
		t.Fatal(err)
	}
	if err := cl.qp.PostSend(verbs.SendWR{ID: 1, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(0, 100)}}); err != nil {
		t.Fatal(err)
	}
	mustOK(t, wait1(t, cl.scq), verbs.WCSend, 100)
	time.Sleep(20 * time.Millisecond)
	wc := make([]verbs.WC, 1)
	if n := sv.rcq.Poll(wc); n != 0 {
		t.Fatalf("a ManualProgress QP completed a receive on its own: %+v", wc[0])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sv.qp.WaitProgress(ctx); err != nil {
		t.Fatal(err)
	}
	mustOK(t, wait1(t, sv.rcq), verbs.WCRecv, 100)
	checkPlaced(t, "send", sv.buf, 0, cl.buf[:100])

	// Nothing to read: WaitProgress ends with its context.
	short, cancelShort := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancelShort()
	if err := sv.qp.WaitProgress(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitProgress with an expiring context = %v", err)
	}

	// A blocked WaitProgress lets Progress through and returns on Close.
	errc := make(chan error, 1)
	go func() { errc <- sv.qp.WaitProgress(context.Background()) }()
	time.Sleep(20 * time.Millisecond)
	done := make(chan struct{})
	go func() { sv.qp.Progress(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Progress blocked behind WaitProgress")
	}
	if err := sv.qp.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("WaitProgress on a closed QP returned nil")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end WaitProgress")
	}
	if err := sv.qp.WaitProgress(context.Background()); err == nil {
		t.Fatal("WaitProgress after Close returned nil")
	}
}

// TestManualProgressWritePingPong is BenchmarkRDMAWritePingPong64 checked
// byte for byte: each side waits in WaitProgress for the flag word at the
// end of its receive area, then checks the payload in front of it. With
// segment placement, WaitProgress waits without holding the receive path,
// so the connection tap feeds each short Write to the receiver as its
// segment arrives (rdmatap lat's one-way time over TAPs: 5.8 µs against
// 8.8 µs when the waiter held it): most Writes must be quick-fed, and none
// placed twice.
func TestManualProgressWritePingPong(t *testing.T) {
	for _, pl := range []verbs.Placement{verbs.PlacementStream, verbs.PlacementSegment} {
		t.Run(pl.String(), func(t *testing.T) { testManualProgressWritePingPong(t, pl) })
	}
}

func testManualProgressWritePingPong(t *testing.T, pl verbs.Placement) {
	dc := verbs.DeviceConfig{Placement: pl}
	p := newPair(t, dc, dc)
	cl := newEndCfg(t, p.a, 128, verbs.QPConfig{ManualProgress: true})
	sv := newEndCfg(t, p.b, 128, verbs.QPConfig{ManualProgress: true})
	connectEnds(t, p, cl, sv, verbs.ConnParams{})
	const rounds = 2000
	pong := func(e *end, i uint32) error {
		fill(e.buf[64:124], uint64(i))
		*flag(e.buf, 124) = i
		return e.qp.PostSend(verbs.SendWR{Op: verbs.OpWrite, Flags: verbs.Inline, SGL: []verbs.SGE{e.mr.SGE(64, 64)},
			RemoteAddr: e.remote.Addr, RKey: e.remote.RKey})
	}
	check := func(e *end, i uint32) error {
		want := make([]byte, 60)
		fill(want, uint64(i))
		if string(e.buf[:60]) != string(want) {
			return fmt.Errorf("round %d: payload before the flag is wrong", i)
		}
		return nil
	}
	errc := make(chan error, 1)
	go func() {
		for i := uint32(1); i <= rounds; i++ {
			if err := waitFlag(sv.qp, flag(sv.buf, 60), i); err != nil {
				errc <- err
				return
			}
			if err := check(sv, i); err != nil {
				errc <- err
				return
			}
			if err := pong(sv, i); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for i := uint32(1); i <= rounds; i++ {
		if err := pong(cl, i); err != nil {
			t.Fatal(err)
		}
		if err := waitFlag(cl.qp, flag(cl.buf, 60), i); err != nil {
			t.Fatal(err)
		}
		if err := check(cl, i); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if pl != verbs.PlacementSegment {
		return
	}
	for _, d := range []*verbs.Device{p.a, p.b} {
		g := d.Stats().Segment
		t.Logf("%s: quick-fed %d of %d Writes, placed early %d bytes, duplicates %d, mismatches %d", d.Name(), g.QuickFed, rounds, g.PlacedEarly, g.Duplicates, g.Mismatches)
		if g.QuickFed < rounds/2 || g.Mismatches != 0 || g.PlacedEarly != g.QuickFedBytes {
			t.Errorf("%s: quick-fed %d of %d Writes (want at least half), placed early %d bytes against %d fed, mismatches %d",
				d.Name(), g.QuickFed, rounds, g.PlacedEarly, g.QuickFedBytes, g.Mismatches)
		}
	}
}

// TestWritePollLastWord: the receive goroutine places Writes while the
// application polls the last word of the target with sync/atomic, as
// perftest's write_lat and credit schemes poll memory. The last aligned
// word of a Write is stored last and atomically, so once the new word is
// seen every other byte of that Write is there (and go test -race agrees).
func TestWritePollLastWord(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	const size = 256 << 10
	cl, sv := connect(t, p, 2*size, verbs.ConnParams{})
	sizes := []int{4, 8, 12, 64, 1400, 4096, 65540, size}
	for i, n := range sizes {
		seq := uint32(i + 1)
		fill(cl.buf[:n-4], uint64(n))
		*flag(cl.buf, n-4) = seq
		if err := cl.qp.PostSend(verbs.SendWR{Op: verbs.OpWrite, SGL: []verbs.SGE{cl.mr.SGE(0, n)},
			RemoteAddr: cl.remote.Addr + uint64(size-n), RKey: cl.remote.RKey}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for atomic.LoadUint32(flag(sv.buf, size-4)) != seq {
			if time.Now().After(deadline) {
				t.Fatalf("write of %d bytes: flag never seen", n)
			}
			runtime.Gosched()
		}
		want := make([]byte, n-4)
		fill(want, uint64(n))
		if got := sv.buf[size-n : size-4]; string(got) != string(want) {
			t.Fatalf("write of %d bytes: payload incomplete when its last word was seen", n)
		}
	}
}

// TestManualProgressDeferredDrain: with segment placement, a WaitProgress
// caller that the tap has fed leaves the bytes TCP holds of those messages
// unread for a while (it reads them now and then, not after every
// message). It must still wake for what the tap does not feed — a Write
// too long for the quick feed, arriving in several segments — and for the
// peer's disconnect while TCP holds such bytes.
//
// With WaitSpin, WaitProgress spins before it sleeps: the same holds.
func TestManualProgressDeferredDrain(t *testing.T) {
	for _, spin := range []time.Duration{0, 50 * time.Microsecond} {
		t.Run(fmt.Sprintf("spin=%v", spin), func(t *testing.T) { testManualProgressDeferredDrain(t, spin) })
	}
}

func testManualProgressDeferredDrain(t *testing.T, spin time.Duration) {
	dc := verbs.DeviceConfig{Placement: verbs.PlacementSegment}
	p := newPair(t, dc, dc)
	cl := newEndCfg(t, p.a, 8192, verbs.QPConfig{ManualProgress: true, WaitSpin: spin})
	sv := newEndCfg(t, p.b, 8192, verbs.QPConfig{ManualProgress: true, WaitSpin: spin})
	connectEnds(t, p, cl, sv, verbs.ConnParams{})
	write := func(e *end, off, n int) error {
		return e.qp.PostSend(verbs.SendWR{Op: verbs.OpWrite, SGL: []verbs.SGE{e.mr.SGE(off, n)},
			RemoteAddr: e.remote.Addr + uint64(off), RKey: e.remote.RKey})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	waitFlag := func(qp *verbs.QP, p *uint32, v uint32) error {
		for atomic.LoadUint32(p) != v {
			if err := qp.WaitProgress(ctx); err != nil {
				return err
			}
		}
		return nil
	}
	const rounds = 300
	for i := uint32(1); i <= rounds; i++ {
		*flag(cl.buf, 124) = i
		if err := write(cl, 64, 64); err != nil {
			t.Fatal(err)
		}
		if err := waitFlag(sv.qp, flag(sv.buf, 124), i); err != nil {
			t.Fatal(err)
		}
		*flag(sv.buf, 60) = i
		if err := write(sv, 0, 64); err != nil {
			t.Fatal(err)
		}
		if err := waitFlag(cl.qp, flag(cl.buf, 60), i); err != nil {
			t.Fatal(err)
		}
	}
	// 4 KiB: longer than the quick feed, so TCP hands it over.
	fill(cl.buf[4096:8188], 7)
	*flag(cl.buf, 8188) = 1
	if err := write(cl, 4096, 4096); err != nil {
		t.Fatal(err)
	}
	if err := waitFlag(sv.qp, flag(sv.buf, 8188), 1); err != nil {
		t.Fatalf("waiting for the 4 KiB Write: %v", err)
	}
	if string(sv.buf[4096:8188]) != string(cl.buf[4096:8188]) {
		t.Fatal("the 4 KiB Write's payload differs")
	}
	// One more short Write, fed by the tap, then the client goes: the
	// server, waiting with those bytes unread in TCP, sees it go.
	*flag(cl.buf, 124) = rounds + 1
	if err := write(cl, 64, 64); err != nil {
		t.Fatal(err)
	}
	if err := waitFlag(sv.qp, flag(sv.buf, 124), rounds+1); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		for {
			if err := sv.qp.WaitProgress(ctx); err != nil {
				errc <- err
				return
			}
		}
	}()
	time.Sleep(20 * time.Millisecond)
	if err := cl.qp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; ctx.Err() != nil {
		t.Fatalf("the server's WaitProgress did not see the client go: %v", err)
	}
	for _, d := range []*verbs.Device{p.a, p.b} {
		if g := d.Stats().Segment; g.QuickFed < rounds/2 || g.Mismatches != 0 {
			t.Errorf("%s: quick-fed %d of %d Writes, mismatches %d", d.Name(), g.QuickFed, rounds, g.Mismatches)
		}
	}
}

// TestWaitSpinBounds: a WaitSpin below 0 or above MaxWaitSpin is refused
// with ErrInvalidArgument.
func TestWaitSpinBounds(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	pd, err := p.a.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := p.a.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	for _, spin := range []time.Duration{-1, verbs.MaxWaitSpin + 1} {
		_, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq, ManualProgress: true, WaitSpin: spin})
		if !errors.Is(err, verbs.ErrInvalidArgument) {
			t.Errorf("WaitSpin %v: %v, want ErrInvalidArgument", spin, err)
		}
	}
	qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq, ManualProgress: true, WaitSpin: verbs.MaxWaitSpin})
	if err != nil {
		t.Fatalf("WaitSpin MaxWaitSpin: %v", err)
	}
	qp.Close()
}
