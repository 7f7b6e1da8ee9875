package verbs_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/service"
	"github.com/rdmatap/rdmatap/zerocopy"
)

// BenchmarkServiceInlineRate compares the rate at which a service's Go
// client streams 64-byte RDMA Writes, inline (the payload in the send ring
// entry, copied by the client and once more by the service) against from a
// registered buffer (the entry names it; the engine reads it when it
// sends), in alternating rounds (RDMATAP_BENCH_ROUNDS, default 5) of
// 20000×b.N Writes, every 32nd signaled. It reports the median time per
// Write of each, their ratio, inline over plain, and the best round of
// each. The whole path is CPU work (the client's post, the service's ring
// pass, the engine, netstack and the peer's placement): scheduling delays
// weigh on it less than on a round trip.
func BenchmarkServiceInlineRate(b *testing.B) {
	p := newPair(b, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startService(b, p.a, service.Limits{})
	d := connectService(b, path)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cq, pq, _, _ := protoConn(b, ctx, d, p.b, p.nb.Addrs()[0].Addr(), 18620, verbs.ConnParams{}, 0)
	target := make([]byte, 4096)
	pmr, err := pq.pd.RegMR(target, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		b.Fatal(err)
	}
	mem, err := zerocopy.AllocShared("rate", 4096)
	if err != nil {
		b.Fatal(err)
	}
	defer mem.Close()
	mr, err := cq.pd.RegMR(mem.Bytes(), verbs.AccessLocalWrite)
	if err != nil {
		b.Fatal(err)
	}
	defer mr.Dereg()
	const every, depth = 32, 128
	n := 20000 * max(b.N, 1)
	run := func(flags verbs.SendFlags) float64 {
		var wc [8]verbs.WC
		signaled, done := 0, 0
		wait := func(upto int) {
			for done < upto {
				k, err := cq.scq.Wait(ctx, wc[:])
				if err != nil {
					b.Fatal(err)
				}
				for _, c := range wc[:k] {
					if err := c.Err(); err != nil {
						b.Fatal(err)
					}
				}
				done += k
			}
		}
		start := time.Now()
		for i := 0; i < n; i++ {
			wr := verbs.SendWR{ID: uint64(i), Op: verbs.OpWrite, Flags: flags, SGL: []verbs.SGE{mr.SGE(64*(i%32), 64)},
				RemoteAddr: pmr.Addr() + uint64(64*(i%32)), RKey: pmr.RKey()}
			if i%every == every-1 {
				wr.Flags |= verbs.Signaled
				signaled++
			}
			// Keep the queue within its depth: wait for the signaled
			// WR that frees the oldest slots.
			if i-done*every >= depth-every {
				wait(done + 1)
			}
			for {
				err := cq.qp.PostSend(wr)
				if err == nil {
					break
				}
				if !errors.Is(err, verbs.ErrQueueFull) {
					b.Fatal(err)
				}
				wait(done + 1)
			}
		}
		wait(signaled)
		return float64(time.Since(start).Nanoseconds()) / float64(n)
	}
	rounds := 5
	if v, err := strconv.Atoi(os.Getenv("RDMATAP_BENCH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	var in, pl []float64
	b.ResetTimer()
	for r := 0; r < rounds; r++ {
		if r%2 == 0 {
			in = append(in, run(verbs.Inline))
			pl = append(pl, run(0))
		} else {
			pl = append(pl, run(0))
			in = append(in, run(verbs.Inline))
		}
		b.Logf("round %d: inline %.0f ns per Write, plain %.0f ns", r, in[r], pl[r])
	}
	b.StopTimer()
	mi, mp := medianOf(in), medianOf(pl)
	b.ReportMetric(mi, "inline-ns/write")
	b.ReportMetric(mp, "plain-ns/write")
	b.ReportMetric(mi/mp, "inline/plain")
	b.ReportMetric(slices.Min(in), "inline-best-ns/write")
	b.ReportMetric(slices.Min(pl), "plain-best-ns/write")
	b.ReportMetric(0, "ns/op")
}

func medianOf(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
