package verbs_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/verbs"
)

func TestHundredQPs(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	const nqp = 100
	const size = 64 << 10
	cls := make([]*end, nqp)
	svs := make([]*end, nqp)
	for i := range cls {
		cls[i], svs[i] = connect(t, p, size, verbs.ConnParams{})
	}
	var wg sync.WaitGroup
	errs := make(chan error, nqp)
	for i := range cls {
		wg.Add(1)
		go func(cl, sv *end, seed uint64) {
			defer wg.Done()
			n := size / 2
			fill(cl.buf[:n], seed)
			// Write half the buffer, then Read it back into the other half.
			if err := cl.qp.PostSend(
				verbs.SendWR{ID: 1, Op: verbs.OpWrite, SGL: []verbs.SGE{cl.mr.SGE(0, n)}, RemoteAddr: cl.remote.Addr, RKey: cl.remote.RKey},
				verbs.SendWR{ID: 2, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(n, n)}, RemoteAddr: cl.remote.Addr, RKey: cl.remote.RKey},
			); err != nil {
				errs <- err
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var wc [1]verbs.WC
			if _, err := cl.scq.Wait(ctx, wc[:]); err != nil {
				errs <- err
				return
			}
			if wc[0].Status != verbs.StatusSuccess || wc[0].ID != 2 {
				errs <- wc[0].Err()
				return
			}
			if !bytes.Equal(cl.buf[:n], cl.buf[n:]) || !bytes.Equal(sv.buf[:n], cl.buf[:n]) {
				errs <- errors.New("data mismatch")
			}
		}(cls[i], svs[i], uint64(i))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestSharedReceiveQueue(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	pd, err := p.b.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	srq, err := pd.CreateSRQ(64, 2)
	if err != nil {
		t.Fatal(err)
	}
	const nqp, per = 4, 8
	rbuf := make([]byte, nqp*per*128)
	rmr, err := pd.RegMR(rbuf, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < nqp*per; i++ {
		// Two SGEs per receive: scatter.
		if err := srq.PostRecv(verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{rmr.SGE(i*128, 50), rmr.SGE(i*128+50, 78)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := srq.SetLimit(4); err != nil {
		t.Fatal(err)
	}
	rcq, err := p.b.CreateCQ(1024)
	if err != nil {
		t.Fatal(err)
	}
	var cls []*end
	for i := 0; i < nqp; i++ {
		cl := newEnd(t, p.a, 4096, nil, nil)
		sv := newEnd(t, p.b, 4096, srq, pd)
		// All server QPs complete into one receive CQ.
		if sv.qp, err = pd.CreateQP(verbs.QPConfig{SendCQ: sv.scq, RecvCQ: rcq, SRQ: srq}); err != nil {
			t.Fatal(err)
		}
		connectEnds(t, p, cl, sv, verbs.ConnParams{})
		cls = append(cls, cl)
	}
	msg := func(q, k int) []byte {
		b := make([]byte, 100)
		for i := range b {
			b[i] = byte(q*31 + k*7 + i)
		}
		return b
	}
	for k := 0; k < per; k++ {
		for q, cl := range cls {
			copy(cl.buf[k*100:], msg(q, k))
			if err := cl.qp.PostSend(verbs.SendWR{ID: uint64(k), Op: verbs.OpSend, SGL: []verbs.SGE{cl.mr.SGE(k*100, 100)}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	ids := map[uint64]bool{}
	for len(ids) < nqp*per {
		wc := wait1(t, rcq)
		mustOK(t, wc, verbs.WCRecv, 100)
		if ids[wc.ID] {
			t.Fatalf("receive %d completed twice", wc.ID)
		}
		ids[wc.ID] = true
	}
	// Every receive buffer holds one whole 100-byte message split over
	// its two SGEs, and every message arrived exactly once.
	want := map[string]bool{}
	for q := 0; q < nqp; q++ {
		for k := 0; k < per; k++ {
			want[string(msg(q, k))] = true
		}
	}
	for i := 0; i < nqp*per; i++ {
		m := string(rbuf[i*128 : i*128+100])
		if !want[m] {
			t.Fatalf("receive %d holds an unexpected message", i)
		}
		delete(want, m)
	}
	if srq.Len() != 0 {
		t.Fatalf("%d receives left in the SRQ", srq.Len())
	}
	ev := waitEvent(t, p.b, verbs.EventSRQLimitReached)
	if ev.SRQ != srq {
		t.Fatal("SRQ limit event for another SRQ")
	}
}

func waitEvent(t *testing.T, d *verbs.Device, typ verbs.AsyncEventType) verbs.AsyncEvent {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case e := <-d.Events():
			if e.Type == typ {
				return e
			}
		case <-timeout:
			t.Fatalf("no %v event", typ)
		}
	}
}

func TestRejectWithPrivateData(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl := newEnd(t, p.a, 64, nil, nil)
	l, err := p.b.Listen(netip.AddrPort{}, verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() {
		req, err := l.GetRequest(ctx)
		if err != nil {
			return
		}
		if string(req.PrivateData()) != "hello" || req.IRD() != 3 || req.ORD() != 5 {
			req.Reject([]byte("bad request"))
			return
		}
		req.Reject([]byte("go away"))
	}()
	raddr := netip.AddrPortFrom(p.nb.Addrs()[0].Addr(), l.Addr().Port())
	_, err = p.a.Dial(ctx, cl.qp, raddr, verbs.ConnParams{PrivateData: []byte("hello"), IRD: 3, ORD: 5})
	var rej *verbs.RejectedError
	if !errors.As(err, &rej) || !errors.Is(err, verbs.ErrRejected) {
		t.Fatalf("dial: %v, want a rejection", err)
	}
	if string(rej.PrivateData) != "go away" {
		t.Fatalf("reject private data %q", rej.PrivateData)
	}
	if cl.qp.State() != verbs.QPIdle {
		t.Fatalf("QP state after rejection: %v", cl.qp.State())
	}
}

func TestListenerCloseUnblocks(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	l, err := p.b.Listen(netip.AddrPort{}, verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := l.GetRequest(context.Background())
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	l.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("GetRequest after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("GetRequest still blocked after Close")
	}
	// A cancelled context unblocks too.
	l2, err := p.b.Listen(netip.AddrPort{}, verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := l2.GetRequest(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("GetRequest with expired ctx: %v", err)
	}
}

func TestDialRefusedAndCancelled(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl := newEnd(t, p.a, 64, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	raddr := netip.AddrPortFrom(p.nb.Addrs()[0].Addr(), 9)
	if _, err := p.a.Dial(ctx, cl.qp, raddr, verbs.ConnParams{}); err == nil {
		t.Fatal("dial to a closed port succeeded")
	}
	// A listener that never answers MPA: the dial's context ends it.
	ln, err := p.nb.Listen(netip.AddrPort{}, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept(context.Background())
		if err == nil {
			<-time.After(2 * time.Second)
			c.Close()
		}
	}()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	_, err = p.a.Dial(ctx2, cl.qp, netip.AddrPortFrom(p.nb.Addrs()[0].Addr(), ln.Addr().Port()), verbs.ConnParams{})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial to a silent peer: %v, want deadline exceeded", err)
	}
}

func TestCQWaitNoLostWakeups(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl, sv := connect(t, p, 4096, verbs.ConnParams{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wc [3]verbs.WC
	const batch = 200
	for round := 0; round < 10; round++ {
		for i := 0; i < batch; i++ {
			if err := sv.qp.PostRecv(verbs.RecvWR{ID: uint64(round*batch + i), SGL: []verbs.SGE{sv.mr.SGE(0, 8)}}); err != nil {
				t.Fatal(err)
			}
		}
		// The sender posts one WR at a time while the receiver blocks in
		// Wait: every completion must wake it.
		go func() {
			for i := 0; i < batch; i++ {
				for cl.qp.PostSend(verbs.SendWR{ID: uint64(i), Op: verbs.OpSend, SGL: []verbs.SGE{cl.mr.SGE(0, 8)}}) != nil {
					time.Sleep(10 * time.Microsecond)
				}
			}
		}()
		for got := 0; got < batch; {
			k, err := sv.rcq.Wait(ctx, wc[:])
			if err != nil {
				t.Fatalf("round %d after %d completions: %v", round, got, err)
			}
			for _, c := range wc[:k] {
				if c.ID != uint64(round*batch+got) || c.Status != verbs.StatusSuccess {
					t.Fatalf("completion %d: id %d status %v", got, c.ID, c.Status)
				}
				got++
			}
		}
	}
}

// TestTerminateOverNetstack: a Read with a bad rkey makes the peer send a
// Terminate; the requester receives it inside netstack's read callback and
// must complete the Read with "remote access error" and shut down without
// hanging (closing the stream from that callback would deadlock).
func TestTerminateOverNetstack(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl, sv := connect(t, p, 4096, verbs.ConnParams{})
	if err := cl.qp.PostSend(verbs.SendWR{ID: 7, Op: verbs.OpRead, Flags: verbs.Signaled,
		SGL: []verbs.SGE{cl.mr.SGE(0, 64)}, RemoteAddr: cl.remote.Addr, RKey: cl.remote.RKey ^ 0x100}); err != nil {
		t.Fatal(err)
	}
	wc := wait1(t, cl.scq)
	if wc.ID != 7 || wc.Status != verbs.StatusRemoteAccess || !errors.Is(wc.Err(), verbs.ErrTerminated) {
		t.Fatalf("read completion %+v (%v)", wc, wc.Err())
	}
	for _, qp := range []*verbs.QP{cl.qp, sv.qp} {
		select {
		case <-qp.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("QP %d did not reach ERROR", qp.Num())
		}
	}
	done := make(chan struct{})
	go func() {
		cl.qp.Close()
		sv.qp.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hung after a Terminate")
	}
	for _, c := range cl.buf {
		if c != 0 {
			t.Fatal("the Read's sink changed")
		}
	}
}

// TestSendWithInvalidate: Send with Invalidate (and with Solicited Event)
// invalidates the receiver's STag, reports it in the completion, and later
// remote access to that STag is refused with a Terminate.
func TestSendWithInvalidate(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl, sv := connect(t, p, 4096, verbs.ConnParams{})
	// A second MR at the server that the client will invalidate.
	extra, err := sv.pd.RegMR(make([]byte, 256), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	for i, flags := range []verbs.SendFlags{verbs.Signaled, verbs.Signaled | verbs.Solicited} {
		target := extra
		if i == 1 {
			if target, err = sv.pd.RegMR(make([]byte, 256), verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
				t.Fatal(err)
			}
		}
		copy(cl.buf, "invalidate me")
		if err := sv.qp.PostRecv(verbs.RecvWR{ID: 9, SGL: []verbs.SGE{sv.mr.SGE(0, 64)}}); err != nil {
			t.Fatal(err)
		}
		if err := cl.qp.PostSend(verbs.SendWR{ID: 1, Op: verbs.OpSendInvalidate, Flags: flags, InvalidateRKey: target.RKey(),
			SGL: []verbs.SGE{cl.mr.SGE(0, 13)}}); err != nil {
			t.Fatal(err)
		}
		mustOK(t, wait1(t, cl.scq), verbs.WCSend, 13)
		wc := wait1(t, sv.rcq)
		mustOK(t, wc, verbs.WCRecv, 13)
		if wc.Flags&verbs.WCWithInvalidate == 0 || wc.InvalidatedRKey != target.RKey() {
			t.Fatalf("completion %+v does not report the invalidated rkey %#x", wc, target.RKey())
		}
		if (wc.Flags&verbs.WCSolicited != 0) != (flags&verbs.Solicited != 0) {
			t.Fatalf("solicited flag %v", wc.Flags)
		}
		if target.Valid() || string(sv.buf[:13]) != "invalidate me" {
			t.Fatal("the STag is still valid or the message is wrong")
		}
	}
	// The invalidated STag can no longer be written.
	if err := cl.qp.PostSend(verbs.SendWR{ID: 2, Op: verbs.OpWrite, SGL: []verbs.SGE{cl.mr.SGE(0, 8)},
		RemoteAddr: extra.Addr(), RKey: extra.RKey()}); err != nil {
		t.Fatal(err)
	}
	ev := waitEvent(t, p.b, verbs.EventTerminateSent)
	if ev.Term.Layer != 1 || ev.Term.EType != 1 || ev.Term.Code != 0 { // DDP / tagged / invalid STag
		t.Fatalf("terminate %v, want DDP invalid STag", ev.Term)
	}
	for i, c := range extra.Bytes() {
		if c != 0 {
			t.Fatalf("byte %d of the invalidated region written", i)
		}
	}
}

// TestDataPathAllocatesNothing: posting sends and receives, delivering a
// completion and polling the CQ allocate nothing (measured on a QP that is not connected, so that no
// other goroutine allocates during the measurement), WRs and SGLs built in
// the calls included.
func TestDataPathAllocatesNothing(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	e := newEnd(t, p.a, 4096, nil, nil)
	wcs := make([]verbs.WC, 16)
	var posted int
	allocs := testing.AllocsPerRun(100, func() {
		if posted < 200 {
			// The WRs are built in the calls, their SGLs as literals:
			// PostSend and PostRecv keep no pointer of a WR, so the
			// literals stay on this stack.
			if err := e.qp.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{e.mr.SGE(0, 64)}}); err != nil {
				t.Fatal(err)
			}
			if err := e.qp.PostSend(verbs.SendWR{ID: 2, Op: verbs.OpWrite, SGL: []verbs.SGE{e.mr.SGE(0, 64)}, RemoteAddr: 0x1000, RKey: 0x100}); err != nil {
				t.Fatal(err)
			}
			posted++
		}
		// A completion goes in (the engine's side) and comes out.
		verbs.PushWC(e.scq, verbs.WC{ID: 3, Op: verbs.WCWrite, ByteLen: 64})
		if e.scq.Poll(wcs) != 1 || wcs[0].ID != 3 {
			t.Fatal("the pushed completion did not come out")
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per post+poll", allocs)
	}
}
