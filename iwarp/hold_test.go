package iwarp

import (
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"testing"
	"time"
)

// The first-FPDU hold (QPConfig.FirstFPDUDelay), the guard against Linux
// siw's accept race: an initiator whose responder may be siw sends
// nothing for the delay after the MPA Reply, without blocking Start or
// its posters; one whose responder answered the early-FPDU query sends at
// once.

// holdEnd is an initiator QP with a first-FPDU hold of delay.
func holdEnd(t *testing.T, delay time.Duration) *testEnd {
	t.Helper()
	e := &testEnd{scq: newTestCQ(), rcq: newTestCQ(), mem: NewMemTable(), events: make(chan Event, 64)}
	rq, err := NewRecvQueue(8, 1)
	if err != nil {
		t.Fatal(err)
	}
	if e.qp, err = NewQP(QPConfig{Num: 1, PD: 7, Mem: e.mem, SendCQ: e.scq, RecvCQ: e.rcq, RQ: rq, MaxInline: 64,
		FirstFPDUDelay: delay, OnEvent: func(ev Event) {
			select {
			case e.events <- ev:
			default:
			}
		}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.qp.Close() })
	e.buf = make([]byte, 4096)
	e.reg = &Region{Buf: e.buf, Base: 0x10000, Access: AccessLocalWrite, PD: 7}
	if _, err := e.mem.Register(e.reg); err != nil {
		t.Fatal(err)
	}
	return e
}

// siwReply answers the Request in sb as Linux siw does: its Reply is the
// Request's header with the key changed, so every reserved bit the
// Request carried comes back (siw_proc_mpareq, siw_accept), followed by
// siw's own IRD/ORD word (a Write RTR when peer-to-peer was offered). It
// returns when the Reply is written.
func siwReply(ctx context.Context, sb *connStream) error {
	req, err := readMPAFrame(ctx, sb)
	if err != nil {
		return err
	}
	rep := make([]byte, MPAHeaderSize, MPAHeaderSize+MPAv2PrefixSize)
	copy(rep, req[:MPAHeaderSize])
	copy(rep, MPAKeyReply[:])
	binary.BigEndian.PutUint16(rep[mpaPDLength:], 0)
	if v, ok := req.IRDORD(); ok {
		w := MPAv2Params{IRD: 1, ORD: 1}
		if v.PeerToPeer {
			w.PeerToPeer, w.RTR = true, RTRWrite
		}
		rep = rep[:MPAHeaderSize+MPAv2PrefixSize]
		w.Encode(rep[MPAHeaderSize:])
		binary.BigEndian.PutUint16(rep[mpaPDLength:], MPAv2PrefixSize)
	}
	_, err = sb.Write(ctx, rep)
	return err
}

// readFPDU reads one FPDU from s and returns its DDP header.
func readFPDUCtx(ctx context.Context, t *testing.T, s *connStream) DDPHeader {
	t.Helper()
	var l [2]byte
	if err := s.ReadFull(ctx, l[:]); err != nil {
		t.Fatalf("reading an FPDU: %v", err)
	}
	rest := make([]byte, FPDULen(int(binary.BigEndian.Uint16(l[:])))-2)
	if err := s.ReadFull(ctx, rest); err != nil {
		t.Fatalf("reading an FPDU: %v", err)
	}
	return DDPHeader(rest)
}

// TestFirstFPDUHeld: facing a siw Reply (which echoes the early-FPDU query
// instead of answering it), the initiator holds its first FPDU for the
// delay after the Reply — measured in the responder's stream: no byte
// arrives sooner — while Start and PostSend return at once; then the RTR
// goes first and the queued Send after it.
func TestFirstFPDUHeld(t *testing.T) {
	const delay = 200 * time.Millisecond
	a := holdEnd(t, delay)
	sa, sb := tcpPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	replied := make(chan time.Time, 1)
	go func() {
		if err := siwReply(ctx, sb); err != nil {
			t.Error(err)
		}
		replied <- time.Now() // after the Reply's write: an upper bound of when it left
	}()
	p, _, err := Initiate(ctx, sa, MPAConfig{PeerToPeer: true, RTR: RTRWrite, IRD: 1, ORD: 1, EarlyFPDUQuery: true})
	if err != nil {
		t.Fatal(err)
	}
	if p.EarlyFPDUOK {
		t.Fatal("a siw Reply echoing the query was taken for an answer")
	}
	t0 := time.Now()
	if err := a.qp.Start(sa, p); err != nil {
		t.Fatal(err)
	}
	if _, err := a.qp.PostSend(SendWR{ID: 5, Op: WRSend, Flags: FlagSignaled, SGL: []SGE{a.sge(0, 8)}}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took > delay/2 {
		t.Fatalf("Start and PostSend took %v: they waited for the %v hold", took, delay)
	}
	rtr := readFPDUCtx(ctx, t, sb)
	gap := time.Since(<-replied)
	if gap < delay {
		t.Fatalf("first FPDU %v after the MPA Reply, want at least %v", gap, delay)
	}
	if rtr.Opcode() != OpWrite || rtr.STag() != 1 {
		t.Fatalf("first FPDU %v STag %#x, want the Write RTR", rtr.Opcode(), rtr.STag())
	}
	if h := readFPDUCtx(ctx, t, sb); h.Opcode() != OpSend || h.MSN() != 1 {
		t.Fatalf("second FPDU %v MSN %d, want the queued Send", h.Opcode(), h.MSN())
	}
	if c := a.scq.wait(t); c.ID != 5 || c.Status != StatusSuccess {
		t.Fatalf("send completion %+v", c)
	}
}

// TestFirstFPDUHoldSkipped: a responder that answers the early-FPDU query
// (rdmatap's) gets the first FPDU at once, even with a hold of a minute.
// An answer the initiator did not ask for does not count.
func TestFirstFPDUHoldSkipped(t *testing.T) {
	for _, query := range []bool{true, false} {
		a := holdEnd(t, time.Minute)
		sa, sb := tcpPair(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		go func() {
			if query {
				req, err := AwaitMPARequest(ctx, sb)
				if err == nil && !req.EarlyFPDUQuery {
					err = errors.New("the Request did not carry the query")
				}
				if err == nil {
					_, err = req.Accept(ctx, sb, MPAConfig{IRD: 1, ORD: 1})
				}
				if err != nil {
					t.Error(err)
				}
				return
			}
			// An unsolicited answer.
			if _, err := readMPAFrame(ctx, sb); err != nil {
				t.Error(err)
				return
			}
			writeMPAFrame(ctx, sb, &MPAFrameFields{Reply: true, Revision: 2, V2: &MPAv2Params{IRD: 1, ORD: 1}, EarlyFPDUOK: true})
		}()
		p, _, err := Initiate(ctx, sa, MPAConfig{IRD: 1, ORD: 1, EarlyFPDUQuery: query})
		if err != nil {
			t.Fatal(err)
		}
		if p.EarlyFPDUOK != query {
			t.Fatalf("query %v: EarlyFPDUOK %v", query, p.EarlyFPDUOK)
		}
		if err := a.qp.Start(sa, p); err != nil {
			t.Fatal(err)
		}
		if _, err := a.qp.PostSend(SendWR{ID: 1, Op: WRSend, Flags: FlagInline, SGL: []SGE{a.sge(0, 8)}}); err != nil {
			t.Fatal(err)
		}
		if query {
			if h := readFPDUCtx(ctx, t, sb); h.Opcode() != OpSend {
				t.Fatalf("first FPDU %v, want the Send", h.Opcode())
			}
		} else {
			short, c := context.WithTimeout(ctx, 200*time.Millisecond)
			var l [2]byte
			if err := sb.ReadFull(short, l[:]); err == nil {
				t.Fatal("an unsolicited answer skipped the hold")
			}
			c()
		}
		cancel()
	}
}

// TestQPDestroyedDuringHold: a QP closed, disconnected or failed while it
// holds its first FPDU sends nothing it should not, flushes what was
// posted, leaves no goroutine or timer behind, and does not panic when the
// hold would have ended.
func TestQPDestroyedDuringHold(t *testing.T) {
	const delay = 300 * time.Millisecond
	for _, how := range []string{"close", "disconnect", "peer-reset"} {
		t.Run(how, func(t *testing.T) {
			g0 := runtime.NumGoroutine()
			a := holdEnd(t, delay)
			sa, sb := tcpPair(t)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			replied := make(chan time.Time, 1)
			go func() {
				siwReply(ctx, sb)
				replied <- time.Now()
			}()
			p, _, err := Initiate(ctx, sa, MPAConfig{IRD: 1, ORD: 1, EarlyFPDUQuery: true})
			if err != nil {
				t.Fatal(err)
			}
			if err := a.qp.Start(sa, p); err != nil {
				t.Fatal(err)
			}
			t0 := <-replied
			for i := range 3 {
				if _, err := a.qp.PostSend(SendWR{ID: uint64(i), Op: WRSend, Flags: FlagSignaled, SGL: []SGE{a.sge(0, 8)}}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := a.qp.PostSend(SendWR{ID: 3, Op: WRRead, Flags: FlagSignaled, SGL: []SGE{a.sge(64, 8)}, RKey: 0x1234}); err != nil {
				t.Fatal(err)
			}
			if err := a.qp.PostRecv(9, []SGE{a.sge(128, 8)}); err != nil {
				t.Fatal(err)
			}
			switch how {
			case "close":
				a.qp.Close()
				if took := time.Since(t0); took > delay/2 {
					t.Fatalf("Close during the hold took %v", took)
				}
			case "peer-reset":
				sb.Abort()
			case "disconnect":
				// Queued sends still go, after the hold, then the FIN.
				go func() {
					for range 3 {
						readFPDUCtx(ctx, t, sb)
					}
					if gap := time.Since(t0); gap < delay {
						t.Errorf("first FPDUs %v after the Reply, want at least %v", gap, delay)
					}
				}()
			}
			if how == "disconnect" {
				// The Read and three Sends complete, the receive is flushed
				// once the peer closes too.
				done := make(chan error, 1)
				go func() { done <- a.qp.Disconnect(ctx) }()
				for range 3 {
					if c := a.scq.wait(t); c.Status != StatusSuccess || c.Op != CompSend {
						t.Fatalf("send completion %+v", c)
					}
				}
				// The Read's request went out; the peer never answers it
				// and closes.
				time.Sleep(50 * time.Millisecond)
				sb.Close()
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				if c := a.scq.wait(t); c.ID != 3 || c.Status != StatusWRFlush {
					t.Fatalf("read completion %+v, want flushed", c)
				}
			} else {
				select {
				case <-a.qp.Done():
				case <-time.After(5 * time.Second):
					t.Fatal("the QP never reached Done")
				}
				// Nothing was sent, everything is flushed.
				for range 4 {
					if c := a.scq.wait(t); c.Status != StatusWRFlush {
						t.Fatalf("completion %+v, want flushed", c)
					}
				}
				time.Sleep(delay + 50*time.Millisecond) // past the hold's end
				var b [1]byte
				short, c := context.WithTimeout(ctx, 100*time.Millisecond)
				if err := sb.ReadFull(short, b[:]); err == nil {
					t.Fatal("a byte reached the responder from a QP destroyed during its hold")
				}
				c()
				if a.qp.State() != StateError {
					t.Fatalf("state %v", a.qp.State())
				}
			}
			if c := a.rcq.wait(t); c.ID != 9 || c.Status != StatusWRFlush {
				t.Fatalf("receive completion %+v, want flushed", c)
			}
			a.qp.Close()
			sa.Close()
			sb.Close()
			deadline := time.Now().Add(2 * time.Second)
			for runtime.NumGoroutine() > g0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if g := runtime.NumGoroutine(); g > g0 {
				t.Fatalf("goroutines %d -> %d", g0, g)
			}
		})
	}
}
