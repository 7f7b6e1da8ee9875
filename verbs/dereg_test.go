package verbs_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/zerocopy"
)

// after is the byte the application writes into a buffer once Dereg has
// returned; nothing the peer sends or reads ever contains it before.
const after = 0xee

// TestDeregFencesMemory: once MR.Dereg returns, rdmatap never touches the
// memory again, under a stream of the peer's RDMA Writes into it and RDMA
// Reads from it. Each round registers an mmap'd buffer, lets the peer
// stream at it, deregisters it at a random moment and then either unmaps
// it at once (a touch would crash the test with SIGSEGV) or refills it and
// checks that no Write lands in it afterwards and no successful Read
// returns the refill. RDMATAP_DEREG_ROUNDS sets the number of rounds (run
// it with -race and thousands of rounds for the full check).
func TestDeregFencesMemory(t *testing.T) {
	rounds := envInt("RDMATAP_DEREG_ROUNDS", 300)
	if testing.Short() {
		rounds = 30
	}
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl := newFenceSide(t, p.a)
	sv := newFenceSide(t, p.b)
	// One listener for every round: the side that sends the Terminate
	// closes first and keeps the connection in TIME-WAIT, and the
	// rounds also check that a redial to the same server port does not
	// meet it (netstack's TestRedialAfterServerClosesFirst).
	l, err := p.b.Listen(netip.AddrPort{}, verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	raddr := netip.AddrPortFrom(p.nb.Addrs()[0].Addr(), l.Addr().Port())
	rng := rand.New(rand.NewPCG(1, 2))
	var mid, terminated, ops int
	for i := 0; i < rounds; i++ {
		delay := time.Duration(rng.IntN(1500)) * time.Microsecond
		st := fenceRound(t, p, l, raddr, cl, sv, delay, i%2 == 1)
		if st.ok > 0 {
			mid++
		}
		if st.terminated {
			terminated++
		}
		ops += st.ok
	}
	t.Logf("%d rounds (half unmapped right after Dereg, half refilled): %d deregistered after the stream began (%d Writes and Reads completed before), %d ended with a Terminate, %d with a reset",
		rounds, mid, ops, terminated, rounds-terminated)
	if mid < rounds/2 {
		t.Fatalf("only %d of %d rounds deregistered after the stream began: the test does not test the fence", mid, rounds)
	}
}

// fenceSide is the PD, CQs and client buffer one side reuses across rounds.
type fenceSide struct {
	pd       *verbs.PD
	scq, rcq *verbs.CQ
	buf      []byte
	mr       *verbs.MR
}

const (
	fenceBuf   = 256 << 10 // the deregistered buffer
	fenceChunk = 16 << 10  // one Write or Read
	fenceDepth = 8         // WRs the client keeps outstanding
)

func newFenceSide(t *testing.T, d *verbs.Device) *fenceSide {
	t.Helper()
	var err error
	s := &fenceSide{}
	if s.pd, err = d.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if s.scq, err = d.CreateCQ(256); err != nil {
		t.Fatal(err)
	}
	if s.rcq, err = d.CreateCQ(256); err != nil {
		t.Fatal(err)
	}
	// Write sources (first half) and Read sinks (one slot per WR).
	s.buf = make([]byte, fenceDepth*fenceChunk*2)
	for i := range s.buf {
		s.buf[i] = byte(i % 199)
	}
	if s.mr, err = s.pd.RegMR(s.buf, verbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *fenceSide) qp(t *testing.T) *verbs.QP {
	t.Helper()
	qp, err := s.pd.CreateQP(verbs.QPConfig{SendCQ: s.scq, RecvCQ: s.rcq, MaxSendWR: 64, MaxRecvWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	return qp
}

type fenceStats struct {
	ok         int  // Writes and Reads completed before the QP failed
	terminated bool // the client's QP failed with a Terminate (else a reset)
}

func fenceRound(t *testing.T, p *pair, l *verbs.Listener, raddr netip.AddrPort, cl, sv *fenceSide, delay time.Duration, refill bool) fenceStats {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	mem, err := zerocopy.Alloc(fenceBuf)
	if err != nil {
		t.Fatal(err)
	}
	b := mem.Bytes()
	for i := range b {
		b[i] = byte(i % 211)
	}
	mr, err := sv.pd.RegMR(b, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	svQP, clQP := sv.qp(t), cl.qp(t)
	defer svQP.Close()
	defer clQP.Close()
	accepted := make(chan error, 1)
	go func() {
		req, err := l.GetRequest(ctx)
		if err == nil {
			pd, _ := mr.Remote().MarshalBinary()
			_, err = req.Accept(ctx, svQP, verbs.ConnParams{PrivateData: pd})
		}
		accepted <- err
	}()
	conn, err := p.a.Dial(ctx, clQP, raddr, verbs.ConnParams{})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	if err := <-accepted; err != nil {
		t.Fatalf("accept: %v", err)
	}
	var remote verbs.RemoteBuf
	if err := remote.UnmarshalBinary(conn.PeerPrivateData()); err != nil {
		t.Fatal(err)
	}

	// The server deregisters mid-stream, then unmaps or refills.
	deregDone := make(chan struct{})
	go func() {
		defer close(deregDone)
		time.Sleep(delay)
		mr.Dereg()
		if !refill {
			mem.Close()
			return
		}
		for i := range b {
			b[i] = after
		}
	}()

	// The client streams Writes and Reads until the QP fails.
	var st fenceStats
	posted, completed, next := 0, 0, 0
	var wc [16]verbs.WC
	failed := false
	// A Write completes once TCP has it, possibly before a Read posted
	// earlier: a Read sink slot is free again only at its own completion.
	free := make([]int, fenceDepth)
	for i := range free {
		free[i] = i
	}
	sinkOf := map[uint64]int{}
	for !failed || completed < posted {
		for !failed && posted-completed < fenceDepth {
			off := uint64(next*fenceChunk) % fenceBuf
			wr := verbs.SendWR{ID: uint64(next), Flags: verbs.Signaled, RemoteAddr: remote.Addr + off, RKey: remote.RKey}
			if next%2 == 0 || len(free) == 0 {
				wr.Op = verbs.OpWrite
				wr.SGL = []verbs.SGE{cl.mr.SGE(next%fenceDepth*fenceChunk, fenceChunk)}
			} else {
				wr.Op = verbs.OpRead
				slot := free[len(free)-1]
				free = free[:len(free)-1]
				sinkOf[wr.ID] = slot
				sink := fenceDepth*fenceChunk + slot*fenceChunk
				clear(cl.buf[sink : sink+fenceChunk])
				wr.SGL = []verbs.SGE{cl.mr.SGE(sink, fenceChunk)}
			}
			if err := clQP.PostSend(wr); err != nil {
				failed = true // the QP left RTS
				if wr.Op == verbs.OpRead {
					delete(sinkOf, wr.ID)
				}
				break
			}
			posted++
			next++
		}
		if failed && completed == posted {
			break
		}
		n, err := cl.scq.Wait(ctx, wc[:])
		if err != nil {
			t.Fatalf("waiting for completions (%d posted, %d completed): %v", posted, completed, err)
		}
		for _, c := range wc[:n] {
			completed++
			slot, read := sinkOf[c.ID]
			if read {
				delete(sinkOf, c.ID)
				free = append(free, slot)
			}
			if c.Status != verbs.StatusSuccess {
				failed = true
				continue
			}
			st.ok++
			if !read {
				continue
			}
			sink := cl.buf[fenceDepth*fenceChunk+slot*fenceChunk:][:fenceChunk]
			for i, v := range sink {
				if v == after {
					t.Fatalf("RDMA Read %d completed with the bytes written after Dereg returned (offset %d)", c.ID, i)
				}
			}
		}
	}
	<-deregDone
	select {
	case <-clQP.Done():
	case <-ctx.Done():
		t.Fatal("the client's QP did not fail after the server's MR went away")
	}
	var te *verbs.TerminateError
	st.terminated = errors.As(clQP.Err(), &te)
	if refill {
		// Let anything still in flight arrive before looking.
		select {
		case <-svQP.Done():
		case <-ctx.Done():
			t.Fatal("the server's QP did not fail")
		}
		for i, v := range b {
			if v != after {
				t.Fatalf("byte %d of the buffer written after Dereg returned", i)
			}
		}
		mem.Close()
	}
	for cl.scq.Poll(wc[:]) > 0 {
	}
	for sv.scq.Poll(wc[:]) > 0 {
	}
	return st
}
