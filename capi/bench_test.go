package capi_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/verbs"
)

// echoPeer accepts one connection on the service's peer device and sends
// every message it receives back, until ctx ends.
func echoPeer(ctx context.Context, tb testing.TB, s *testService, size int) (netip.AddrPort, <-chan error) {
	pd, err := s.peer.AllocPD()
	if err != nil {
		tb.Fatal(err)
	}
	scq, _ := s.peer.CreateCQ(64)
	rcq, _ := s.peer.CreateCQ(64)
	qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: scq, RecvCQ: rcq, MaxSendWR: 16, MaxRecvWR: 16})
	if err != nil {
		tb.Fatal(err)
	}
	buf := make([]byte, 16*(size+1))
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite)
	if err != nil {
		tb.Fatal(err)
	}
	for i := 0; i < 16; i++ {
		if err := qp.PostRecv(verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{mr.SGE(i*(size+1), size+1)}}); err != nil {
			tb.Fatal(err)
		}
	}
	ln, err := s.peer.Listen(netip.MustParseAddrPort(s.peerAddr+":0"), verbs.ListenConfig{})
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		defer ln.Close()
		defer qp.Close()
		req, err := ln.GetRequest(ctx)
		if err != nil {
			done <- err
			return
		}
		if _, err := req.Accept(ctx, qp, verbs.ConnParams{}); err != nil {
			done <- err
			return
		}
		var wc [1]verbs.WC
		for {
			// Blocking: a spinning goroutine would take a CPU from the
			// clients being measured.
			if _, err := rcq.Wait(ctx, wc[:]); err != nil {
				done <- nil
				return
			}
			if err := wc[0].Err(); err != nil {
				done <- nil // the client went away
				return
			}
			i := int(wc[0].ID)
			if err := qp.PostRecv(verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{mr.SGE(i*(size+1), size+1)}}); err != nil {
				done <- err
				return
			}
			if err := qp.PostSend(verbs.SendWR{Op: verbs.OpSend, SGL: []verbs.SGE{mr.SGE(i*(size+1), size)}}); err != nil {
				done <- err
				return
			}
		}
	}()
	return ln.Addr(), done
}

// BenchmarkPingPong measures a Send ping-pong of 64 bytes through one
// service, from a C program on the library and from the Go client of the
// service (verbs.Connect), against the same kind of Go peer, in
// alternating rounds (RDMATAP_BENCH_ROUNDS, default 5; 2000×b.N round
// trips a side per round). It reports the median round trips and their
// ratio, C over Go.
func BenchmarkPingPong(b *testing.B) {
	const size = 64
	dir := libs(b, false)
	prog := compile(b, dir, "testdata/pingpong.c", false)
	s := startService(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	n := 2000 * max(b.N, 1)

	cRound := func() float64 {
		pctx, pcancel := context.WithCancel(ctx)
		defer pcancel()
		addr, _ := echoPeer(pctx, b, s, size)
		out, err := command(b, dir, s.sock, prog, addr.String(), strconv.Itoa(n), strconv.Itoa(size)).CombinedOutput()
		if err != nil {
			b.Fatalf("pingpong: %v\n%s", err, out)
		}
		var ns float64
		if _, err := fmt.Sscanf(strings.TrimSpace(string(out)), "pingpong: %g ns per round trip", &ns); err != nil {
			b.Fatalf("pingpong's output %q: %v", out, err)
		}
		return ns / 1e3
	}

	d, err := verbs.Connect(ctx, s.sock)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	pd, err := d.AllocPD()
	if err != nil {
		b.Fatal(err)
	}
	buf, err := d.AllocBuffer(4096)
	if err != nil {
		b.Fatal(err)
	}
	defer buf.Close()
	mr, err := pd.RegMR(buf.Bytes(), verbs.AccessLocalWrite)
	if err != nil {
		b.Fatal(err)
	}
	goRound := func() float64 {
		pctx, pcancel := context.WithCancel(ctx)
		defer pcancel()
		addr, _ := echoPeer(pctx, b, s, size)
		scq, err := d.CreateCQ(64)
		if err != nil {
			b.Fatal(err)
		}
		defer scq.Close()
		rcq, err := d.CreateCQ(64)
		if err != nil {
			b.Fatal(err)
		}
		defer rcq.Close()
		qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: scq, RecvCQ: rcq, MaxSendWR: 16, MaxRecvWR: 16})
		if err != nil {
			b.Fatal(err)
		}
		defer qp.Close()
		rwr := verbs.RecvWR{SGL: []verbs.SGE{mr.SGE(size, size+1)}}
		for i := 0; i < 8; i++ {
			if err := qp.PostRecv(rwr); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := d.Dial(pctx, qp, addr, verbs.ConnParams{}); err != nil {
			b.Fatal(err)
		}
		swr := verbs.SendWR{Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{mr.SGE(0, size)}}
		var wc [1]verbs.WC
		poll := func(cq *verbs.CQ) {
			for cq.Poll(wc[:]) == 0 {
			}
			if err := wc[0].Err(); err != nil {
				b.Fatal(err)
			}
		}
		start := time.Now()
		for i := 0; i < n; i++ {
			if err := qp.PostSend(swr); err != nil {
				b.Fatal(err)
			}
			poll(rcq)
			if err := qp.PostRecv(rwr); err != nil {
				b.Fatal(err)
			}
			poll(scq)
		}
		return float64(time.Since(start).Nanoseconds()) / float64(n) / 1e3
	}

	var cs, gos, ratio []float64
	b.ResetTimer()
	rounds := 5
	if v, err := strconv.Atoi(os.Getenv("RDMATAP_BENCH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	for r := 0; r < rounds; r++ {
		var c, g float64
		if r%2 == 0 {
			c, g = cRound(), goRound()
		} else {
			g, c = goRound(), cRound()
		}
		cs, gos, ratio = append(cs, c), append(gos, g), append(ratio, c/g)
		b.Logf("round %d: C %.1f µs, Go %.1f µs", r, c, g)
	}
	b.StopTimer()
	b.ReportMetric(median(cs), "c-rtt-µs")
	b.ReportMetric(median(gos), "go-rtt-µs")
	b.ReportMetric(median(ratio), "c/go")
	b.ReportMetric(0, "ns/op")
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}
