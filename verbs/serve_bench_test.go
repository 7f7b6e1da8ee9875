package verbs_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/service"
	"github.com/rdmatap/rdmatap/zerocopy"
)

// benchConn is one connection of the service benchmarks: the client end
// on the device under test (embedded or through the service), the peer
// end embedded on the other device.
type benchConn struct {
	qp     *verbs.QP
	cq     *verbs.CQ
	mr     *verbs.MR
	buf    []byte
	remote verbs.RemoteBuf

	pqp     *verbs.QP
	pbuf    []byte
	pmr     *verbs.MR
	premote verbs.RemoteBuf
}

// benchConnect connects a client end on d to a peer end on peer. The
// client code is the same for both kinds of device.
func benchConnect(b *testing.B, d, peer *verbs.Device, peerAddr netip.Addr, size int, manualPeer bool) *benchConn {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := &benchConn{}
	pd, err := d.AllocPD()
	if err != nil {
		b.Fatal(err)
	}
	if c.cq, err = d.CreateCQ(256); err != nil {
		b.Fatal(err)
	}
	if c.qp, err = pd.CreateQP(verbs.QPConfig{SendCQ: c.cq, RecvCQ: c.cq}); err != nil {
		b.Fatal(err)
	}
	mem, err := zerocopy.AllocShared("bench", size)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { mem.Close() })
	c.buf = mem.Bytes()
	if c.mr, err = pd.RegMR(c.buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead); err != nil {
		b.Fatal(err)
	}
	ppd, _ := peer.AllocPD()
	pcq, _ := peer.CreateCQ(256)
	if c.pqp, err = ppd.CreateQP(verbs.QPConfig{SendCQ: pcq, RecvCQ: pcq, ManualProgress: manualPeer}); err != nil {
		b.Fatal(err)
	}
	c.pbuf = make([]byte, size)
	if c.pmr, err = ppd.RegMR(c.pbuf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead); err != nil {
		b.Fatal(err)
	}
	l, err := peer.Listen(netip.AddrPort{}, verbs.ListenConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	errc := make(chan error, 1)
	go func() {
		req, err := l.GetRequest(ctx)
		if err == nil {
			err = c.premote.UnmarshalBinary(req.PrivateData())
		}
		if err == nil {
			pdata, _ := c.pmr.Remote().MarshalBinary()
			_, err = req.Accept(ctx, c.pqp, verbs.ConnParams{PrivateData: pdata})
		}
		errc <- err
	}()
	pdata, _ := c.mr.Remote().MarshalBinary()
	conn, err := d.Dial(ctx, c.qp, netip.AddrPortFrom(peerAddr, l.Addr().Port()), verbs.ConnParams{PrivateData: pdata})
	if err != nil {
		b.Fatal(err)
	}
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	if err := c.remote.UnmarshalBinary(conn.PeerPrivateData()); err != nil {
		b.Fatal(err)
	}
	return c
}

// writes posts n RDMA Writes of size bytes, eight in flight, and waits
// for all of them.
func (c *benchConn) writes(n, size int) error {
	ctx := context.Background()
	var wcs [16]verbs.WC
	out := 0
	for posted := 0; posted < n || out > 0; {
		for posted < n && out < 8 {
			if err := c.qp.PostSend(verbs.SendWR{Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{c.mr.SGE(0, size)},
				RemoteAddr: c.remote.Addr, RKey: c.remote.RKey}); err != nil {
				return err
			}
			posted++
			out++
		}
		k, err := c.cq.Wait(ctx, wcs[:])
		if err != nil {
			return err
		}
		for _, wc := range wcs[:k] {
			if err := wc.Err(); err != nil {
				return err
			}
		}
		out -= k
	}
	return nil
}

// startPonger runs the peer of pings: it waits for the flag word of its
// receive area to reach i and writes 64 bytes back (ib_write_lat).
func (c *benchConn) startPonger() {
	go func() {
		// One WR for all (a fresh SGL each time would be an allocation
		// per round trip: the garbage collector's work in the figures).
		wr := verbs.SendWR{Op: verbs.OpWrite, Flags: verbs.Inline, SGL: []verbs.SGE{c.pmr.SGE(64, 64)},
			RemoteAddr: c.premote.Addr, RKey: c.premote.RKey}
		for i := uint32(1); ; i++ {
			if waitFlag(c.pqp, flag(c.pbuf, 60), i) != nil {
				return
			}
			*flag(c.pbuf, 124) = i
			if c.pqp.PostSend(wr) != nil {
				return
			}
		}
	}()
}

// pings runs n 64-byte Write round trips, busy polling the flag word of
// the client's receive area (yielding to the goroutines that place).
func (c *benchConn) pings(next *uint32, n int) error {
	wr := verbs.SendWR{Op: verbs.OpWrite, Flags: verbs.Inline, SGL: []verbs.SGE{c.mr.SGE(64, 64)},
		RemoteAddr: c.remote.Addr, RKey: c.remote.RKey}
	for range n {
		*next++
		i := *next
		*flag(c.buf, 124) = i
		if err := c.qp.PostSend(wr); err != nil {
			return err
		}
		for atomic.LoadUint32(flag(c.buf, 60)) != i {
			runtime.Gosched()
		}
	}
	return nil
}

// BenchmarkServiceRatios runs the same client code on an embedded device
// and through the service in one process, alternating in rounds
// (RDMATAP_BENCH_ROUNDS, default 5), and reports the medians:
//
//	write-svc/emb    1 MiB RDMA Write MB/s through the service ÷ embedded (target ≥ 0.9)
//	pingpong-add-µs  64 B Write round trip through the service − embedded (target ≤ 2 µs)
//
// b.N scales the operations per round: b.N 1 MiB Writes and 20×b.N round
// trips on each side.
func BenchmarkServiceRatios(b *testing.B) {
	p := newPairLink(b, benchLink, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	peerAddr := p.nb.Addrs()[0].Addr()
	path, _ := startService(b, p.a, service.Limits{})
	svcDev := connectService(b, path)
	const size = 1 << 20
	embW := benchConnect(b, p.a, p.b, peerAddr, size, false)
	svcW := benchConnect(b, svcDev, p.b, peerAddr, size, false)
	embP := benchConnect(b, p.a, p.b, peerAddr, 128, true)
	svcP := benchConnect(b, svcDev, p.b, peerAddr, 128, true)
	embP.startPonger()
	svcP.startPonger()
	var embNext, svcNext uint32
	rounds := envInt("RDMATAP_BENCH_ROUNDS", 5)
	nw, np := max(b.N, 8), 20*max(b.N, 8)
	// Warm up both paths.
	for _, c := range []*benchConn{embW, svcW} {
		if err := c.writes(8, size); err != nil {
			b.Fatal(err)
		}
	}
	if err := embP.pings(&embNext, 200); err != nil {
		b.Fatal(err)
	}
	if err := svcP.pings(&svcNext, 200); err != nil {
		b.Fatal(err)
	}
	var wratio, padd, embMB, svcMB, embRTT, svcRTT []float64
	b.ResetTimer()
	for r := range rounds {
		timeIt := func(f func() error) time.Duration {
			t0 := time.Now()
			if err := f(); err != nil {
				b.Fatal(err)
			}
			return time.Since(t0)
		}
		var te, ts, pe, ps time.Duration
		emb := func() {
			te = timeIt(func() error { return embW.writes(nw, size) })
			pe = timeIt(func() error { return embP.pings(&embNext, np) })
		}
		svc := func() {
			ts = timeIt(func() error { return svcW.writes(nw, size) })
			ps = timeIt(func() error { return svcP.pings(&svcNext, np) })
		}
		if r%2 == 0 {
			emb()
			svc()
		} else {
			svc()
			emb()
		}
		mb := func(d time.Duration) float64 { return float64(nw) * size / d.Seconds() / 1e6 }
		rtt := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(np) }
		embMB, svcMB = append(embMB, mb(te)), append(svcMB, mb(ts))
		embRTT, svcRTT = append(embRTT, rtt(pe)), append(svcRTT, rtt(ps))
		wratio = append(wratio, mb(ts)/mb(te))
		padd = append(padd, rtt(ps)-rtt(pe))
	}
	b.StopTimer()
	b.ReportMetric(median(wratio), "write-svc/emb")
	b.ReportMetric(median(padd), "pingpong-add-µs")
	b.ReportMetric(median(embMB), "emb-MB/s")
	b.ReportMetric(median(svcMB), "svc-MB/s")
	b.ReportMetric(median(embRTT), "emb-rtt-µs")
	b.ReportMetric(median(svcRTT), "svc-rtt-µs")
	b.ReportMetric(0, "ns/op")
	if testing.Verbose() {
		fmt.Printf("write MB/s emb %.0f svc %.0f; round trip µs emb %.2f svc %.2f\n", median(embMB), median(svcMB), median(embRTT), median(svcRTT))
	}
}

// BenchmarkServiceFairness: RDMATAP_FAIR_CLIENTS clients (default 64) of
// one service, each with RDMATAP_FAIR_QPS QPs (default 16) connected to an
// embedded peer, post 64 KiB RDMA Writes (two in flight per QP) for
// RDMATAP_FAIR_MS milliseconds (default 2000) all at once. It reports the
// total rate, the slowest client's share of the fair share (the target: no
// client below 0.5) and Jain's fairness index over the clients.
// RDMATAP_FAIR_EMBEDDED=1 runs the same clients on the embedded device
// instead, as the control.
func BenchmarkServiceFairness(b *testing.B) {
	nClients := envInt("RDMATAP_FAIR_CLIENTS", 64)
	nQPs := envInt("RDMATAP_FAIR_QPS", 16)
	dur := time.Duration(envInt("RDMATAP_FAIR_MS", 2000)) * time.Millisecond
	const size = 64 << 10
	p := newPairLink(b, benchLink, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	peerAddr := p.nb.Addrs()[0].Addr()
	path, _ := startService(b, p.a, service.Limits{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sink, err := p.b.Listen(netip.AddrPort{}, verbs.ListenConfig{Backlog: 1024})
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	go sinkPeer(ctx, p.b, sink)
	sinkAddr := netip.AddrPortFrom(peerAddr, sink.Addr().Port())

	type client struct {
		cq    *verbs.CQ
		qps   []*verbs.QP
		mr    *verbs.MR
		rb    []verbs.RemoteBuf
		index map[uint32]int
		bytes int64
	}
	clients := make([]*client, nClients)
	embedded := os.Getenv("RDMATAP_FAIR_EMBEDDED") != "" // the control: the same clients on the embedded device
	for i := range clients {
		d := p.a
		if !embedded {
			d = connectService(b, path)
		}
		c := &client{index: map[uint32]int{}}
		pd, _ := d.AllocPD()
		if c.cq, err = d.CreateCQ(4 * nQPs); err != nil {
			b.Fatal(err)
		}
		mem, err := zerocopy.AllocShared("fair", size)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { mem.Close() })
		if c.mr, err = pd.RegMR(mem.Bytes(), verbs.AccessLocalWrite); err != nil {
			b.Fatal(err)
		}
		for j := 0; j < nQPs; j++ {
			qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: c.cq, RecvCQ: c.cq, MaxSendWR: 8, MaxRecvWR: 1})
			if err != nil {
				b.Fatal(err)
			}
			dctx, dcancel := context.WithTimeout(ctx, 20*time.Second)
			conn, err := d.Dial(dctx, qp, sinkAddr, verbs.ConnParams{})
			dcancel()
			if err != nil {
				b.Fatalf("client %d QP %d: %v", i, j, err)
			}
			var rb verbs.RemoteBuf
			rb.UnmarshalBinary(conn.PeerPrivateData())
			c.index[qp.Num()] = j
			c.qps = append(c.qps, qp)
			c.rb = append(c.rb, rb)
		}
		clients[i] = c
	}
	b.ResetTimer()
	start := make(chan struct{})
	stop := make(chan struct{})
	errc := make(chan error, nClients)
	for _, c := range clients {
		go func() {
			<-start
			out := make([]int, nQPs)
			wcs := make([]verbs.WC, 4*nQPs)
			for {
				select {
				case <-stop:
					errc <- nil
					return
				default:
				}
				for j, qp := range c.qps {
					for out[j] < 2 {
						if err := qp.PostSend(verbs.SendWR{Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{c.mr.SGE(0, size)},
							RemoteAddr: c.rb[j].Addr, RKey: c.rb[j].RKey}); err != nil {
							errc <- err
							return
						}
						out[j]++
					}
				}
				wctx, wcancel := context.WithTimeout(ctx, 100*time.Millisecond)
				n, err := c.cq.Wait(wctx, wcs)
				wcancel()
				if err != nil && wctx.Err() == nil {
					errc <- err
					return
				}
				for _, wc := range wcs[:n] {
					if err := wc.Err(); err != nil {
						errc <- err
						return
					}
					out[c.index[wc.QPNum]]--
					atomic.AddInt64(&c.bytes, size)
				}
			}
		}()
	}
	t0 := time.Now()
	close(start)
	time.Sleep(dur)
	counts := make([]float64, nClients)
	for i, c := range clients {
		counts[i] = float64(atomic.LoadInt64(&c.bytes))
	}
	elapsed := time.Since(t0)
	close(stop)
	for range clients {
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	var sum, sq, least float64
	least = counts[0]
	for _, v := range counts {
		sum += v
		sq += v * v
		least = min(least, v)
	}
	fair := sum / float64(nClients)
	b.ReportMetric(sum/elapsed.Seconds()/1e6, "total-MB/s")
	b.ReportMetric(least/fair, "min-share")
	b.ReportMetric(sum*sum/(float64(nClients)*sq), "jain")
	b.ReportMetric(0, "ns/op")
}

// pingEnv makes TestServiceChild's process run this many 64-byte Write
// round trips (after a warm-up) against the peer and print their time.
const pingEnv = "RDMATAP_SVC_CHILD_PINGS"

// pongPeer accepts one connection on l whose private data is the
// initiator's RemoteBuf and answers each 64-byte Write with one (the
// ponger of benchConn, for a client in another process).
func pongPeer(ctx context.Context, d *verbs.Device, l *verbs.Listener) error {
	c := &benchConn{}
	pd, _ := d.AllocPD()
	cq, _ := d.CreateCQ(16)
	var err error
	if c.pqp, err = pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq, ManualProgress: true}); err != nil {
		return err
	}
	c.pbuf = make([]byte, 128)
	if c.pmr, err = pd.RegMR(c.pbuf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		return err
	}
	req, err := l.GetRequest(ctx)
	if err != nil {
		return err
	}
	if err := c.premote.UnmarshalBinary(req.PrivateData()); err != nil {
		return err
	}
	pdata, _ := c.pmr.Remote().MarshalBinary()
	if _, err := req.Accept(ctx, c.pqp, verbs.ConnParams{PrivateData: pdata}); err != nil {
		return err
	}
	c.startPonger()
	go func() {
		<-ctx.Done()
		c.pqp.Close()
	}()
	return nil
}

// childPings is the client of BenchmarkServicePingPongProcess, in its own
// process: the same pings as benchConn's, through the service.
func childPings(t *testing.T, d *verbs.Device, raddr netip.AddrPort, n int) {
	ctx := context.Background()
	pd, _ := d.AllocPD()
	cq, _ := d.CreateCQ(16)
	c := &benchConn{cq: cq}
	var err error
	if c.qp, err = pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq}); err != nil {
		t.Fatal(err)
	}
	mem, err := zerocopy.AllocShared("ping", 4096)
	if err != nil {
		t.Fatal(err)
	}
	c.buf = mem.Bytes()
	if c.mr, err = pd.RegMR(c.buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	pdata, _ := c.mr.Remote().MarshalBinary()
	conn, err := d.Dial(ctx, c.qp, raddr, verbs.ConnParams{PrivateData: pdata})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.remote.UnmarshalBinary(conn.PeerPrivateData()); err != nil {
		t.Fatal(err)
	}
	var next uint32
	if err := c.pings(&next, 500); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := c.pings(&next, n); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("child: %d round trips in %d ns\n", n, time.Since(t0).Nanoseconds())
}

// BenchmarkServicePingPongProcess measures the 64 B RDMA Write round trip
// with the client in its own process (the test binary run again),
// through the service, against the same pings from an embedded client in
// this process, alternating (RDMATAP_BENCH_ROUNDS, default 5; 2000×b.N
// round trips a side per round). It reports the medians and their
// difference (the target: ≤ 2 µs added).
func BenchmarkServicePingPongProcess(b *testing.B) {
	p := newPairLink(b, benchLink, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	peerAddr := p.nb.Addrs()[0].Addr()
	path, _ := startService(b, p.a, service.Limits{})
	emb := benchConnect(b, p.a, p.b, peerAddr, 128, true)
	emb.startPonger()
	var embNext uint32
	if err := emb.pings(&embNext, 500); err != nil {
		b.Fatal(err)
	}
	exe, _ := os.Executable()
	n := 2000 * max(b.N, 1)
	var embRTT, svcRTT, add []float64
	b.ResetTimer()
	for r := range envInt("RDMATAP_BENCH_ROUNDS", 5) {
		embRound := func() float64 {
			t0 := time.Now()
			if err := emb.pings(&embNext, n); err != nil {
				b.Fatal(err)
			}
			return float64(time.Since(t0).Nanoseconds()) / float64(n) / 1e3
		}
		svcRound := func() float64 {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			l, err := p.b.Listen(netip.AddrPort{}, verbs.ListenConfig{})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			perr := make(chan error, 1)
			go func() { perr <- pongPeer(ctx, p.b, l) }()
			cmd := exec.Command(exe, "-test.run=^TestServiceChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), childEnv+"="+path, childPeerEnv+"="+netip.AddrPortFrom(peerAddr, l.Addr().Port()).String(),
				pingEnv+"="+strconv.Itoa(n))
			out, err := cmd.CombinedOutput()
			if err != nil {
				b.Fatalf("client process: %v\n%s", err, out)
			}
			if err := <-perr; err != nil {
				b.Fatal(err)
			}
			var k int
			var ns int64
			for _, line := range strings.Split(string(out), "\n") {
				if _, err := fmt.Sscanf(line, "child: %d round trips in %d ns", &k, &ns); err == nil {
					return float64(ns) / float64(k) / 1e3
				}
			}
			b.Fatalf("no timing from the client process:\n%s", out)
			return 0
		}
		var e, s float64
		if r%2 == 0 {
			e, s = embRound(), svcRound()
		} else {
			s, e = svcRound(), embRound()
		}
		embRTT, svcRTT, add = append(embRTT, e), append(svcRTT, s), append(add, s-e)
	}
	b.StopTimer()
	b.ReportMetric(median(embRTT), "emb-rtt-µs")
	b.ReportMetric(median(svcRTT), "svc-rtt-µs")
	b.ReportMetric(median(add), "add-µs")
	b.ReportMetric(0, "ns/op")
}
