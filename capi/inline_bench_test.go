package capi_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/verbs"
)

// inlinePeer accepts one connection on the service's peer device, offering
// a 64-byte buffer for RDMA Writes (its address and rkey in the accept's
// private data), and answers every Send, and every RDMA Write with
// Immediate, with a Send of the 64 bytes it brought, until ctx ends.
func inlinePeer(ctx context.Context, tb testing.TB, s *testService) netip.AddrPort {
	const size = 64
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
	buf := make([]byte, 17*size) // 16 receive slots, then the Write target
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		tb.Fatal(err)
	}
	for i := 0; i < 16; i++ {
		if err := qp.PostRecv(verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{mr.SGE(i*size, size)}}); err != nil {
			tb.Fatal(err)
		}
	}
	ln, err := s.peer.Listen(netip.MustParseAddrPort(s.peerAddr+":0"), verbs.ListenConfig{})
	if err != nil {
		tb.Fatal(err)
	}
	go func() {
		defer ln.Close()
		defer qp.Close()
		req, err := ln.GetRequest(ctx)
		if err != nil {
			return
		}
		pdata := binary.LittleEndian.AppendUint64(nil, mr.Addr()+16*size)
		pdata = binary.LittleEndian.AppendUint32(pdata, uint32(mr.RKey()))
		if _, err := req.Accept(ctx, qp, verbs.ConnParams{PrivateData: pdata}); err != nil {
			return
		}
		var wc [1]verbs.WC
		for {
			// Blocking: a spinning goroutine would take a CPU from the
			// client being measured.
			if _, err := rcq.Wait(ctx, wc[:]); err != nil || wc[0].Err() != nil {
				return
			}
			i := int(wc[0].ID)
			from := mr.SGE(i*size, size)
			if wc[0].Op == verbs.WCRecvRDMAWithImm {
				from = mr.SGE(16*size, size)
			}
			if qp.PostRecv(verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{mr.SGE(i*size, size)}}) != nil ||
				qp.PostSend(verbs.SendWR{Op: verbs.OpSend, SGL: []verbs.SGE{from}}) != nil {
				return
			}
		}
	}()
	return ln.Addr()
}

// BenchmarkInlineLatency compares 64-byte round trips from a C program on
// the library (testdata/inlinelat.c) with IBV_SEND_INLINE (the payload in
// the send ring entry) and without (the entry names a registered buffer),
// for a Send and for an RDMA Write with Immediate, each answered by a
// 64-byte Send from a Go peer on the other end of the link, in alternating
// rounds (RDMATAP_BENCH_ROUNDS, default 5) of 2000×b.N round trips. It
// reports the median round trip of each, their ratios, inline over plain,
// and the best round of each.
func BenchmarkInlineLatency(b *testing.B) {
	dir := libs(b, false)
	prog := compile(b, dir, "testdata/inlinelat.c", false)
	s := startService(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	n := 2000 * max(b.N, 1)
	round := func(op, mode string) float64 {
		pctx, pcancel := context.WithCancel(ctx)
		defer pcancel()
		addr := inlinePeer(pctx, b, s)
		out, err := command(b, dir, s.sock, prog, addr.String(), strconv.Itoa(n), op, mode).CombinedOutput()
		if err != nil {
			b.Fatalf("inlinelat %s %s: %v\n%s", op, mode, err, out)
		}
		var ns float64
		if _, err := fmt.Sscanf(strings.TrimSpace(string(out)), "inlinelat: %g ns per round trip", &ns); err != nil {
			b.Fatalf("inlinelat's output %q: %v", out, err)
		}
		return ns / 1e3
	}
	rounds := 5
	if v, err := strconv.Atoi(os.Getenv("RDMATAP_BENCH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	b.ResetTimer()
	res := map[string][]float64{}
	for r := 0; r < rounds; r++ {
		for _, op := range []string{"send", "write"} {
			modes := []string{"inline", "plain"}
			if r%2 == 1 {
				modes[0], modes[1] = modes[1], modes[0]
			}
			for _, mode := range modes {
				res[op+"-"+mode] = append(res[op+"-"+mode], round(op, mode))
			}
		}
		b.Logf("round %d: Send inline %.1f µs, plain %.1f µs; Write inline %.1f µs, plain %.1f µs", r,
			res["send-inline"][r], res["send-plain"][r], res["write-inline"][r], res["write-plain"][r])
	}
	b.StopTimer()
	for _, op := range []string{"send", "write"} {
		in, pl := median(res[op+"-inline"]), median(res[op+"-plain"])
		b.ReportMetric(in, op+"-inline-rtt-µs")
		b.ReportMetric(pl, op+"-plain-rtt-µs")
		b.ReportMetric(in/pl, op+"-inline/plain")
		// The best round of each: on a shared machine the median carries
		// the other load's scheduling delays.
		b.ReportMetric(slices.Min(res[op+"-inline"]), op+"-inline-best-µs")
		b.ReportMetric(slices.Min(res[op+"-plain"]), op+"-plain-best-µs")
	}
	b.ReportMetric(0, "ns/op")
}

// TestInline runs testdata/inlinelat.c for a few hundred round trips of
// each kind: inline Sends and RDMA Writes with Immediate from the stack
// (unregistered memory, the payload in the send ring entry) and from a
// registered buffer, every answer's bytes checked against what was
// posted; also with ASan and UBSan.
func TestInline(t *testing.T) {
	for _, san := range []bool{false, true} {
		t.Run(fmt.Sprintf("sanitize=%v", san), func(t *testing.T) {
			dir := libs(t, san)
			prog := compile(t, dir, "testdata/inlinelat.c", san)
			s := startService(t)
			for _, op := range []string{"send", "write"} {
				for _, mode := range []string{"inline", "plain"} {
					ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
					addr := inlinePeer(ctx, t, s)
					out, err := command(t, dir, s.sock, prog, addr.String(), "300", op, mode).CombinedOutput()
					cancel()
					if err != nil || !strings.HasPrefix(string(out), "inlinelat: ") {
						t.Fatalf("inlinelat %s %s: %v\n%s", op, mode, err, out)
					}
				}
			}
		})
	}
}
