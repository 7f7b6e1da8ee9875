package iwarp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// testCQ is a CQ that keeps completions in a channel.
type testCQ struct{ ch chan Completion }

func newTestCQ() *testCQ { return &testCQ{ch: make(chan Completion, 4096)} }

func (c *testCQ) Push(x Completion) bool {
	select {
	case c.ch <- x:
		return true
	default:
		return false
	}
}

func (c *testCQ) wait(t testing.TB) Completion {
	t.Helper()
	select {
	case x := <-c.ch:
		return x
	case <-time.After(10 * time.Second):
		t.Fatal("no completion within 10 s")
	}
	return Completion{}
}

func (c *testCQ) none(t testing.TB, d time.Duration) {
	t.Helper()
	select {
	case x := <-c.ch:
		t.Fatalf("unexpected completion %+v", x)
	case <-time.After(d):
	}
}

// testEnd is a QP with its CQs, memory and events.
type testEnd struct {
	qp     *QP
	scq    *testCQ
	rcq    *testCQ
	mem    *MemTable
	buf    []byte
	reg    *Region
	events chan Event
	stats  Stats
}

func newTestEnd(t testing.TB, size int, access Access) *testEnd {
	t.Helper()
	e := &testEnd{scq: newTestCQ(), rcq: newTestCQ(), mem: NewMemTable(), events: make(chan Event, 64)}
	rq, err := NewRecvQueue(64, 4)
	if err != nil {
		t.Fatal(err)
	}
	e.qp, err = NewQP(QPConfig{Num: 1, PD: 7, Mem: e.mem, SendCQ: e.scq, RecvCQ: e.rcq, RQ: rq,
		MaxInline: 64, Stats: &e.stats, OnEvent: func(ev Event) {
			select {
			case e.events <- ev:
			default:
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	e.buf = make([]byte, size)
	e.reg = &Region{Buf: e.buf, Base: 0x10000, Access: access, PD: 7}
	if _, err := e.mem.Register(e.reg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.qp.Close() })
	return e
}

func (e *testEnd) sge(off, n int) SGE {
	return SGE{Addr: e.reg.Base + uint64(off), Length: uint32(n), LKey: e.reg.STag()}
}

// connectQPs negotiates MPA between two ends over loopback TCP.
func connectQPs(t testing.TB, a, b *testEnd, ca, cb MPAConfig) (ConnParams, ConnParams) {
	t.Helper()
	sa, sb := tcpPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var pb ConnParams
	var errB error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		req, err := AwaitMPARequest(ctx, sb)
		if err != nil {
			errB = err
			return
		}
		pb, errB = req.Accept(ctx, sb, cb)
	}()
	pa, _, errA := Initiate(ctx, sa, ca)
	wg.Wait()
	if errA != nil || errB != nil {
		t.Fatalf("MPA: initiator %v, responder %v", errA, errB)
	}
	if err := a.qp.Start(sa, pa); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Start(sb, pb); err != nil {
		t.Fatal(err)
	}
	return pa, pb
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ seed
	}
	return b
}

func TestEngineOperations(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ca, cb MPAConfig
	}{
		{"rev2", MPAConfig{IRD: 4, ORD: 4}, MPAConfig{IRD: 4, ORD: 4}},
		{"rev2-crc", MPAConfig{CRC: true, IRD: 4, ORD: 4}, MPAConfig{IRD: 4, ORD: 4}},
		{"rev1", MPAConfig{Revision: 1, IRD: 4, ORD: 4}, MPAConfig{IRD: 4, ORD: 4}},
		{"responder-crc", MPAConfig{IRD: 4, ORD: 4}, MPAConfig{CRC: true, IRD: 4, ORD: 4}},
		{"p2p-write", MPAConfig{PeerToPeer: true, RTR: RTRWrite, IRD: 4, ORD: 4}, MPAConfig{IRD: 4, ORD: 4}},
		{"p2p-read", MPAConfig{PeerToPeer: true, RTR: RTRRead, IRD: 4, ORD: 4}, MPAConfig{IRD: 4, ORD: 4}},
		{"p2p-send", MPAConfig{PeerToPeer: true, RTR: RTRSend, IRD: 4, ORD: 4}, MPAConfig{IRD: 4, ORD: 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const size = 256 << 10
			acc := AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead
			a, b := newTestEnd(t, size, acc), newTestEnd(t, size, acc)
			pa, pb := connectQPs(t, a, b, tc.ca, tc.cb)
			if pa.CRC != pb.CRC || pa.CRC != (tc.ca.CRC || tc.cb.CRC) {
				t.Fatalf("CRC negotiated %v/%v", pa.CRC, pb.CRC)
			}
			if tc.ca.PeerToPeer && (!pa.PeerToPeer || pa.RTR != tc.ca.RTR || pb.RTR != tc.ca.RTR) {
				t.Fatalf("p2p: %+v / %+v", pa, pb)
			}
			for _, n := range []int{0, 1, 5, 1395, 1396, 1397, 4096, 100000} {
				// Send a -> b, received at offset 3.
				src := pattern(n, byte(n))
				copy(a.buf, src)
				clear(b.buf)
				if err := b.qp.PostRecv(uint64(n), []SGE{b.sge(3, n)}); err != nil {
					t.Fatal(err)
				}
				if _, err := a.qp.PostSend(SendWR{ID: 1, Op: WRSend, Flags: FlagSignaled, SGL: []SGE{a.sge(0, n)}}); err != nil {
					t.Fatal(err)
				}
				if c := a.scq.wait(t); c.Status != StatusSuccess || c.Op != CompSend {
					t.Fatalf("send completion %+v", c)
				}
				c := b.rcq.wait(t)
				if c.Status != StatusSuccess || c.ID != uint64(n) || int(c.ByteLen) != n {
					t.Fatalf("recv completion %+v", c)
				}
				want := make([]byte, size)
				copy(want[3:], src)
				if !bytes.Equal(b.buf, want) {
					t.Fatalf("send %d: receive buffer wrong", n)
				}
				// Write b -> a at offset 11, then Read it back a <- b.
				copy(b.buf, pattern(n, 0x5a))
				clear(a.buf)
				if _, err := b.qp.PostSend(SendWR{ID: 2, Op: WRWrite, Flags: FlagSignaled, SGL: []SGE{b.sge(0, n)}, RemoteAddr: a.reg.Base + 11, RKey: a.reg.STag()}); err != nil {
					t.Fatal(err)
				}
				if c := b.scq.wait(t); c.Status != StatusSuccess || c.Op != CompWrite {
					t.Fatalf("write completion %+v", c)
				}
				if _, err := a.qp.PostSend(SendWR{ID: 3, Op: WRRead, Flags: FlagSignaled, SGL: []SGE{a.sge(size/2, n)}, RemoteAddr: b.reg.Base, RKey: b.reg.STag()}); err != nil {
					t.Fatal(err)
				}
				if c := a.scq.wait(t); c.Status != StatusSuccess || c.Op != CompRead || int(c.ByteLen) != n {
					t.Fatalf("read completion %+v", c)
				}
				// The Read Response follows the Write on b's stream, so the
				// Write is placed by now.
				want = make([]byte, size)
				copy(want[11:], pattern(n, 0x5a))
				copy(want[size/2:], pattern(n, 0x5a))
				if !bytes.Equal(a.buf, want) {
					t.Fatalf("write/read %d: buffer wrong", n)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := a.qp.Disconnect(ctx); err != nil {
				t.Fatal(err)
			}
			<-b.qp.Done()
			if a.qp.Err() != nil || b.qp.Err() != nil {
				t.Fatalf("errors after a clean close: %v / %v", a.qp.Err(), b.qp.Err())
			}
		})
	}
}

func TestEngineFlushOnClose(t *testing.T) {
	acc := AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead
	a, b := newTestEnd(t, 4096, acc), newTestEnd(t, 4096, acc)
	connectQPs(t, a, b, MPAConfig{IRD: 1, ORD: 1}, MPAConfig{IRD: 1, ORD: 1})
	for i := 0; i < 5; i++ {
		if err := b.qp.PostRecv(uint64(i), []SGE{b.sge(0, 64)}); err != nil {
			t.Fatal(err)
		}
	}
	b.qp.Close()
	seen := map[uint64]bool{}
	for i := 0; i < 5; i++ {
		c := b.rcq.wait(t)
		if c.Status != StatusWRFlush || c.Op != CompRecv {
			t.Fatalf("completion after close: %+v", c)
		}
		seen[c.ID] = true
	}
	if len(seen) != 5 {
		t.Fatalf("flushed %v", seen)
	}
	if _, err := b.qp.PostSend(SendWR{Op: WRSend}); err == nil {
		t.Fatal("post after close succeeded")
	}
	// The peer sees the reset and goes to ERROR too.
	select {
	case <-a.qp.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("peer did not notice the reset")
	}
}

func TestEngineStatusStrings(t *testing.T) {
	for s, want := range map[Status]string{StatusSuccess: "success", StatusWRFlush: "Work Request Flushed Error",
		StatusRemoteAccess: "remote access error", StatusLocalLength: "local length error", StatusGeneral: "general error"} {
		if s.String() != want {
			t.Errorf("%d: %q, want %q", s, s.String(), want)
		}
	}
	_ = fmt.Sprint(Status(200))
}

// sliceCQ is a CQ that stores completions in a fixed ring.
type sliceCQ struct {
	ring [8]Completion
	n    int
}

func (c *sliceCQ) Push(x Completion) bool {
	c.ring[c.n%len(c.ring)] = x
	c.n++
	return true
}

// TestCompletionAllocatesNothing: handing a completion to the CQ (once per
// message on the data path) allocates nothing.
func TestCompletionAllocatesNothing(t *testing.T) {
	e := newTestEnd(t, 64, AccessLocalWrite)
	cq := &sliceCQ{}
	allocs := testing.AllocsPerRun(1000, func() {
		e.qp.complete(cq, Completion{ID: 1, Op: CompRecv, ByteLen: 8})
	})
	if allocs != 0 || cq.n == 0 || cq.ring[0].QPNum != e.qp.Num() {
		t.Fatalf("%v allocations per completion (pushed %d)", allocs, cq.n)
	}
}

// TestPostDirectAllocatesNothing: an inline RDMA Write posted on an idle
// QP, which the poster frames and writes itself (postDirect), allocates
// nothing, its WR and SGL built in the call: PostSend keeps no pointer of
// a WR (sendWQE.set), so the literal stays on the poster's stack. (Should
// the TX goroutine take a post instead, it must not allocate either; the
// sink counts what either writes.)
func TestPostDirectAllocatesNothing(t *testing.T) {
	acc := AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead
	a, r := newTestEnd(t, 4096, acc), newTestEnd(t, 4096, acc)
	s := &countingSink{}
	if err := a.qp.Start(s, ConnParams{Initiator: true, IRD: 1, ORD: 1}); err != nil {
		t.Fatal(err)
	}
	var want int64
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := a.qp.PostSend(SendWR{Op: WRWrite, Flags: FlagInline, SGL: []SGE{a.sge(64, 64)},
			RemoteAddr: r.reg.Base, RKey: r.reg.STag()}); err != nil {
			t.Fatal(err)
		}
		want += 84
		for s.total.Load() < want {
			runtime.Gosched()
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per post", allocs)
	}
	if got := s.total.Load(); got != want {
		t.Fatalf("%d bytes written, want %d", got, want)
	}
}

// countingSink is a Stream that discards what is written, counting it; the
// writer may be a poster or the TX goroutine.
type countingSink struct {
	sinkStream
	mu    sync.Mutex
	buf   [4096]byte
	total atomic.Int64
}

func (s *countingSink) WritePayload(ctx context.Context, pl tcpip.Payloader) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for pl.Len() > 0 {
		k, err := pl.Read(s.buf[:])
		n += int64(k)
		if err != nil {
			break
		}
	}
	s.total.Add(n)
	return n, nil
}

// TestInlineSendSemantics: an inline WR's bytes are taken at post time,
// whether the poster transmits it itself (one WR, idle QP) or queues it (a
// batch), and a bad inline SGE is an error from PostSend, not a completion.
func TestInlineSendSemantics(t *testing.T) {
	acc := AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead
	a, b := newTestEnd(t, 4096, acc), newTestEnd(t, 4096, acc)
	connectQPs(t, a, b, MPAConfig{IRD: 4, ORD: 4}, MPAConfig{IRD: 4, ORD: 4})
	for _, batch := range []int{1, 2} {
		for i := range batch {
			if err := b.qp.PostRecv(uint64(i), []SGE{b.sge(1024+64*i, 64)}); err != nil {
				t.Fatal(err)
			}
		}
		wrs := make([]SendWR, batch)
		for i := range wrs {
			copy(a.buf[64*i:], pattern(48, byte(batch*10+i)))
			wrs[i] = SendWR{ID: uint64(i), Op: WRSend, Flags: FlagInline | FlagSignaled, SGL: []SGE{a.sge(64*i, 48)}}
		}
		if n, err := a.qp.PostSend(wrs...); err != nil || n != batch {
			t.Fatalf("PostSend(%d inline) = %d, %v", batch, n, err)
		}
		clear(a.buf[:64*batch]) // inline: the buffer is free once PostSend returns
		for i := range batch {
			if c := a.scq.wait(t); c.Status != StatusSuccess || c.ID != uint64(i) {
				t.Fatalf("batch %d: send completion %+v", batch, c)
			}
			if c := b.rcq.wait(t); c.Status != StatusSuccess || c.ByteLen != 48 {
				t.Fatalf("batch %d: recv completion %+v", batch, c)
			}
			if got := b.buf[1024+64*i : 1024+64*i+48]; !bytes.Equal(got, pattern(48, byte(batch*10+i))) {
				t.Fatalf("batch %d: WR %d received % x", batch, i, got[:8])
			}
		}
	}
	bad := SendWR{Op: WRSend, Flags: FlagInline, SGL: []SGE{{Addr: a.reg.Base, Length: 8, LKey: a.reg.STag() ^ 0x100}}}
	for _, wrs := range [][]SendWR{{bad}, {bad, bad}} {
		if n, err := a.qp.PostSend(wrs...); !errors.Is(err, ErrInvalidWR) || n != 0 {
			t.Fatalf("PostSend(%d with a bad inline lkey) = %d, %v; want 0, ErrInvalidWR", len(wrs), n, err)
		}
	}
	a.scq.none(t, 50*time.Millisecond)
	// The QP is still usable.
	if err := b.qp.PostRecv(9, []SGE{b.sge(0, 64)}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.qp.PostSend(SendWR{ID: 9, Op: WRSend, Flags: FlagSignaled, SGL: []SGE{a.sge(0, 8)}}); err != nil {
		t.Fatal(err)
	}
	if c := b.rcq.wait(t); c.Status != StatusSuccess || c.ID != 9 {
		t.Fatalf("recv after bad posts: %+v", c)
	}
}

// failStream is a stream whose writes fail.
type failStream struct{ sinkStream }

func (*failStream) WritePayload(context.Context, tcpip.Payloader) (int64, error) {
	return 0, errors.New("broken pipe")
}

// TestStartRTRFailure: when the peer-to-peer RTR cannot be sent, the QP
// fails and still reaches Done. Start does not wait for the RTR (it goes
// out from the transmitter, after the first-FPDU hold when there is one),
// so the failure shows in Err and Done, not in Start's result.
func TestStartRTRFailure(t *testing.T) {
	e := newTestEnd(t, 4096, AccessLocalWrite)
	if err := e.qp.Start(&failStream{}, ConnParams{Initiator: true, PeerToPeer: true, RTR: RTRSend, IRD: 1, ORD: 1}); err != nil {
		t.Fatalf("Start: %v", err)
	}
	select {
	case <-e.qp.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the QP never reached Done after a failed RTR")
	}
	if e.qp.Err() == nil {
		t.Fatal("a QP whose RTR failed reports no error")
	}
}

// TestEngineFatal: Fatal sends the peer a Terminate (RDMAP, local
// catastrophic error) before the close; the peer reports it and flushes
// its WRs; the failing side flushes its own and reports the Terminate
// sent. Fatal of a QP never started is Close.
func TestEngineFatal(t *testing.T) {
	acc := AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead
	a, b := newTestEnd(t, 4096, acc), newTestEnd(t, 4096, acc)
	connectQPs(t, a, b, MPAConfig{IRD: 1, ORD: 1}, MPAConfig{IRD: 1, ORD: 1})
	for i := 0; i < 3; i++ {
		if err := a.qp.PostRecv(uint64(i), []SGE{a.sge(0, 64)}); err != nil {
			t.Fatal(err)
		}
		if err := b.qp.PostRecv(uint64(10+i), []SGE{b.sge(0, 64)}); err != nil {
			t.Fatal(err)
		}
	}
	// The peer speaks first (the responder waits for the initiator's
	// first FPDU).
	if _, err := a.qp.PostSend(SendWR{ID: 1, Op: WRSend, Flags: FlagSignaled, SGL: []SGE{a.sge(0, 8)}}); err != nil {
		t.Fatal(err)
	}
	if c := a.scq.wait(t); c.Status != StatusSuccess {
		t.Fatalf("send: %+v", c)
	}
	if c := b.rcq.wait(t); c.Status != StatusSuccess || c.ID != 10 {
		t.Fatalf("receive: %+v", c)
	}
	if err := b.qp.Fatal(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if c := b.rcq.wait(t); c.Status != StatusWRFlush {
			t.Fatalf("failing side's receive: %+v", c)
		}
	}
	var sent bool
	for !sent {
		select {
		case ev := <-b.events:
			sent = ev.Type == EventTerminateSent && ev.Term == LocalCatastrophicTermCode
		default:
			t.Fatal("no TERMINATE_SENT event with the local catastrophic code")
		}
	}
	select {
	case <-a.qp.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("peer did not end")
	}
	var te *TerminateError
	if !errors.As(a.qp.Err(), &te) || !te.Received || te.Code != LocalCatastrophicTermCode {
		t.Fatalf("peer's error: %v", a.qp.Err())
	}
	var got bool
	for !got {
		select {
		case ev := <-a.events:
			got = ev.Type == EventTerminateReceived && ev.Term == LocalCatastrophicTermCode
		default:
			t.Fatal("peer: no TERMINATE_RECEIVED event with the local catastrophic code")
		}
	}
	for i := 0; i < 3; i++ {
		if c := a.rcq.wait(t); c.Status != StatusWRFlush {
			t.Fatalf("peer's receive: %+v", c)
		}
	}
	// Never started: Fatal is Close.
	c := newTestEnd(t, 64, acc)
	if err := c.qp.Fatal(); err != nil || c.qp.State() != StateError {
		t.Fatalf("idle QP: %v, state %v", err, c.qp.State())
	}
}
