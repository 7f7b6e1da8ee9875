package verbs_test

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/verbs"
)

// Connection setup and QP scale, the "connection rate" and
// "connected QPs" rows:
//
//	go test ./verbs/ -run XXX -bench ConnRate -benchtime 5000x
//	go test ./verbs/ -run XXX -bench IdleQP -benchtime 1x                            # 1,000 QPs
//	RDMATAP_IDLE_QPS=10000 go test ./verbs/ -run XXX -bench IdleQP -benchtime 1x    # 10,000
//
// Both connect two devices on the in-memory link with the default device
// configuration (so the initiator holds its first FPDU for the siw
// accept-race guard, DeviceConfig.FirstFPDUDelay), one PD, CQ and MR per
// side shared by every QP, as an application with many connections has.

// cmSide is what one device's connections share.
type cmSide struct {
	pd       *verbs.PD
	scq, rcq *verbs.CQ
	buf      []byte
	mr       *verbs.MR
}

func newCMSide(t testing.TB, d *verbs.Device, cqe int) *cmSide {
	t.Helper()
	s := &cmSide{buf: make([]byte, 4096)}
	var err error
	if s.pd, err = d.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if s.scq, err = d.CreateCQ(cqe); err != nil {
		t.Fatal(err)
	}
	if s.rcq, err = d.CreateCQ(cqe); err != nil {
		t.Fatal(err)
	}
	if s.mr, err = s.pd.RegMR(s.buf, verbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *cmSide) qp(t testing.TB) *verbs.QP {
	t.Helper()
	qp, err := s.pd.CreateQP(verbs.QPConfig{SendCQ: s.scq, RecvCQ: s.rcq})
	if err != nil {
		t.Fatal(err)
	}
	return qp
}

// cmBench dials connections from p.a to a listener on p.b one at a time;
// the accepting side posts a receive on each QP before accepting it.
type cmBench struct {
	p      *pair
	cl, sv *cmSide
	l      *verbs.Listener
	raddr  netip.AddrPort
	accept chan *verbs.Conn
	errs   chan error
	stop   context.CancelFunc
}

func newCMBench(t testing.TB, p *pair, cqe int) *cmBench {
	t.Helper()
	c := &cmBench{p: p, cl: newCMSide(t, p.a, cqe), sv: newCMSide(t, p.b, cqe),
		accept: make(chan *verbs.Conn, 1), errs: make(chan error, 1)}
	var err error
	if c.l, err = p.b.Listen(netip.AddrPort{}, verbs.ListenConfig{}); err != nil {
		t.Fatal(err)
	}
	c.raddr = netip.AddrPortFrom(p.nb.Addrs()[0].Addr(), c.l.Addr().Port())
	ctx, cancel := context.WithCancel(context.Background())
	c.stop = cancel
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			req, err := c.l.GetRequest(ctx)
			if err != nil {
				return
			}
			qp, err := c.sv.pd.CreateQP(verbs.QPConfig{SendCQ: c.sv.scq, RecvCQ: c.sv.rcq})
			if err == nil {
				err = qp.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{c.sv.mr.SGE(0, 64)}})
			}
			var conn *verbs.Conn
			if err == nil {
				conn, err = req.Accept(ctx, qp, verbs.ConnParams{})
			}
			if err != nil {
				c.errs <- fmt.Errorf("accept: %w", err)
				return
			}
			c.accept <- conn
		}
	}()
	t.Cleanup(func() {
		cancel()
		c.l.Close()
		<-done
	})
	return c
}

// dial connects one QP and returns both ends.
func (c *cmBench) dial(t testing.TB) (cl, sv *verbs.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := c.p.a.Dial(ctx, c.cl.qp(t), c.raddr, verbs.ConnParams{})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	select {
	case sv = <-c.accept:
	case err := <-c.errs:
		t.Fatal(err)
	case <-ctx.Done():
		t.Fatal("no accepted connection")
	}
	return cl, sv
}

// exchange sends one 8-byte message on cl and waits until it has been
// received on sv (whose QP has a receive posted).
func (c *cmBench) exchange(t testing.TB, cl *verbs.Conn, id uint64) {
	if err := cl.QP().PostSend(verbs.SendWR{ID: id, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{c.cl.mr.SGE(0, 8)}}); err != nil {
		t.Fatalf("send: %v", err)
	}
	var wc [1]verbs.WC
	if err := drain(c.cl.scq, wc[:], 1); err != nil {
		t.Fatalf("send completion: %v", err)
	}
	if err := drain(c.sv.rcq, wc[:], 1); err != nil {
		t.Fatalf("receive completion: %v", err)
	}
}

// BenchmarkConnRate sets up connections one after the other — create a QP
// on each side, dial, accept, and one Send received, so that each
// connection is known to be usable — and reports connections per second.
// Connections are closed in batches of 256 with the timer stopped.
//
// peer=rdmatap: the responder answers the early-FPDU query, so the
// initiator sends at once. peer=siw: the responder leaves it unanswered,
// as Linux siw does, so each initiator holds its first FPDU for
// FirstFPDUDelay (10 ms); Dial and Accept do not wait for that, and the
// first Send of each connection is posted at once and checked for
// arrival at the end of its batch (timer stopped): the rate is that of
// setting up connections whose first message is under way.
func BenchmarkConnRate(b *testing.B) {
	for _, siw := range []bool{false, true} {
		name := "peer=rdmatap"
		if siw {
			name = "peer=siw"
		}
		b.Run(name, func(b *testing.B) { connRate(b, siw) })
	}
}

func connRate(b *testing.B, siw bool) {
	p := newPair(b, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	verbs.SetSiwReply(p.b, siw)
	c := newCMBench(b, p, 1024)
	const batch = 256
	open := make([]*verbs.Conn, 0, 2*batch)
	wc := make([]verbs.WC, 64)
	closeAll := func() {
		if siw {
			// The first messages, held and then sent.
			if err := drain(c.cl.scq, wc, len(open)/2); err != nil {
				b.Fatalf("send completions: %v", err)
			}
			if err := drain(c.sv.rcq, wc, len(open)/2); err != nil {
				b.Fatalf("receive completions: %v", err)
			}
		}
		for _, conn := range open {
			conn.Close()
		}
		open = open[:0]
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		cl, sv := c.dial(b)
		if siw {
			if err := cl.QP().PostSend(verbs.SendWR{ID: uint64(i), Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{c.cl.mr.SGE(0, 8)}}); err != nil {
				b.Fatalf("send: %v", err)
			}
		} else {
			c.exchange(b, cl, uint64(i))
		}
		open = append(open, cl, sv)
		if len(open) == 2*batch {
			b.StopTimer()
			closeAll()
			b.StartTimer()
		}
	}
	b.StopTimer()
	closeAll()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "conns/s")
}

// memNow returns the heap in use and the goroutine stacks, after a GC,
// and the goroutines.
func memNow() (heap, stacks uint64, goroutines int) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse, ms.StackInuse, runtime.NumGoroutine()
}

// BenchmarkIdleQPMemory connects RDMATAP_IDLE_QPS QPs (default 1,000)
// between two devices, measures what the idle connections hold (heap and
// goroutine stacks after a GC, and goroutines), then sends one message on
// every QP and checks each arrived: every connection still moves data.
// Both ends are in this process, so a connection is two QPs; the figures
// are per QP (one end), the whole connection costs twice as much.
func BenchmarkIdleQPMemory(b *testing.B) {
	n := envInt("RDMATAP_IDLE_QPS", 1000)
	for iter := 0; iter < b.N; iter++ {
		p := newPair(b, verbs.DeviceConfig{}, verbs.DeviceConfig{})
		c := newCMBench(b, p, 2*n+16)
		// One connection first, so that what every stack, device and
		// listener sets up once is in the baseline.
		cl0, _ := c.dial(b)
		c.exchange(b, cl0, 0)
		h0, s0, g0 := memNow()
		start := time.Now()
		cls := make([]*verbs.Conn, n)
		svs := make([]*verbs.Conn, n)
		for i := range cls {
			cls[i], svs[i] = c.dial(b)
		}
		setup := time.Since(start)
		h1, s1, g1 := memNow()
		before, after := h0+s0, h1+s1
		perQP := float64(after-before) / float64(2*n)
		stackPerQP := float64(s1-s0) / float64(2*n)
		gPerQP := float64(g1-g0) / float64(2*n)
		b.ReportMetric(perQP, "B/idle-QP")
		b.ReportMetric(gPerQP, "goroutines/QP")
		b.ReportMetric(float64(n)/setup.Seconds(), "conns/s")
		// Every connection still moves data: a Send on each.
		for i, cl := range cls {
			if err := cl.QP().PostSend(verbs.SendWR{ID: uint64(i), Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{c.cl.mr.SGE(0, 8)}}); err != nil {
				b.Fatalf("send on QP %d: %v", i, err)
			}
		}
		wc := make([]verbs.WC, 256)
		if err := drain(c.cl.scq, wc, n); err != nil {
			b.Fatalf("send completions: %v", err)
		}
		if err := drain(c.sv.rcq, wc, n); err != nil {
			b.Fatalf("receive completions: %v", err)
		}
		b.Logf("%d connected QP pairs in %v (%.0f/s): %.0f bytes (%.0f of them goroutine stacks) and %.2f goroutines per idle QP (heap+stacks %.1f -> %.1f MiB, goroutines %d -> %d); a Send on each arrived",
			n, setup.Round(time.Millisecond), float64(n)/setup.Seconds(), perQP, stackPerQP, gPerQP,
			float64(before)/(1<<20), float64(after)/(1<<20), g0, g1)
		for i := range cls {
			cls[i].Close()
			svs[i].Close()
		}
	}
}
