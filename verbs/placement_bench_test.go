package verbs_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
)

// BenchmarkPlacement compares segment placement with stream placement on
// the in-memory link at MTU 1500 (no GSO unless RDMATAP_PLACEMENT_GSO=1:
// every packet is one segment, as on the wire), with 1% loss and 1%
// reordering of what the writer sends and without, in interleaved rounds:
//
//	go test -run XXX -bench Placement ./verbs/
//
// It reports the median over the rounds of each ratio segment/stream:
// throughput of a stream of 1 MiB RDMA Writes (rdmaBulk's; higher is
// better; stream placement's without the segment tap, as it runs), the
// mean time from the arrival of a segment that fills a hole to the
// completion of the Write it held back (lossy only; DeviceConfig.TimeHoleFills on
// both sides, which gives stream placement the tap, on a second stream of
// the same Writes; lower is better) and the median of that time (holefill-p50;
// a round's mean is set by its few slowest fills, which wait for a
// goroutine to be scheduled on a busy machine), p99
// completion latency of 64 KiB Writes (each followed by a Send; the time
// from posting to the receiver's completion; lower is better), and the
// 64-byte Send ping-pong round trip without impairment (lower is better).
// RDMATAP_PLACEMENT_MARKERS=1 negotiates MPA markers in both directions;
// RDMATAP_PLACEMENT_QUEUE=N sets the link's packet queue (default 1,024: a
// burst that overflows it loses packets even in the clean rounds, and
// gVisor's TCP then recovers slowly, see docs/tcp-recovery.md).
func BenchmarkPlacement(b *testing.B) {
	rounds := envInt("RDMATAP_BENCH_ROUNDS", 9)
	only := os.Getenv("RDMATAP_BENCH_ONLY")
	// MPA CRC on unless RDMATAP_PLACEMENT_CRC=0: without CRC or markers,
	// RFC 5044's rules frame no FPDU beyond a hole, and segment placement
	// can only place what arrives in order.
	crc := os.Getenv("RDMATAP_PLACEMENT_CRC") != "0"
	// MPA markers, both directions, with RDMATAP_PLACEMENT_MARKERS=1.
	markers := os.Getenv("RDMATAP_PLACEMENT_MARKERS") == "1"
	lossy := netstack.ImpairConfig{Seed: 17, LossRate: 0.01, ReorderRate: 0.01}
	link := netstack.LinkConfig{MTU: 1500, NoGSO: os.Getenv("RDMATAP_PLACEMENT_GSO") != "1", QueueLen: envInt("RDMATAP_PLACEMENT_QUEUE", 0)}
	type side struct {
		bulk, lat, pp workload
		p99           *[]float64
		rx            *verbs.Device // the receiver whose hole fills are timed
		// fills, for stream placement under loss, is the same stream of
		// Writes on a pair whose receiver times hole fills: timing them
		// needs the segment tap, which stream placement does not have
		// otherwise, so its throughput is taken on bulk, without it.
		fills workload
	}
	mk := func(pl verbs.Placement, impair bool) *side {
		icfg := netstack.ImpairConfig{}
		if impair {
			icfg = lossy
		}
		s := &side{}
		tx := verbs.DeviceConfig{Markers: markers}
		p := impairedPair(b, icfg, link, tx, verbs.DeviceConfig{Placement: pl, TimeHoleFills: impair, Markers: markers})
		s.bulk, s.rx = rdmaBulkOn(b, p, verbs.OpWrite, crc), p.b
		if impair && pl == verbs.PlacementStream {
			s.fills = s.bulk
			p := impairedPair(b, icfg, link, tx, verbs.DeviceConfig{Placement: pl, Markers: markers})
			s.bulk = rdmaBulkOn(b, p, verbs.OpWrite, crc)
		}
		s.lat, s.p99 = latStream(b, impairedPair(b, icfg, link, tx, verbs.DeviceConfig{Placement: pl, Markers: markers}), crc)
		if !impair {
			s.pp = rdmaPingPongOn(b, impairedPair(b, icfg, link, tx, verbs.DeviceConfig{Placement: pl, Markers: markers}), crc)
		}
		return s
	}
	type cmp struct {
		name             string
		seg              *side
		stream           *side
		vals             []float64
		absSeg           []float64
		absStr           []float64
		fillSeg, fillStr verbs.Histogram // hole fill times over the rounds
	}
	var cmps []*cmp
	for _, impair := range []bool{true, false} {
		name := "clean"
		if impair {
			name = "lossy"
		}
		if !strings.Contains(name, only) {
			continue
		}
		cmps = append(cmps, &cmp{name: name, seg: mk(verbs.PlacementSegment, impair), stream: mk(verbs.PlacementStream, impair)})
	}
	if len(cmps) == 0 {
		b.Fatalf("RDMATAP_BENCH_ONLY=%q matches nothing", only)
	}
	timed := func(w workload, n int) float64 {
		start := time.Now()
		if err := w.do(n); err != nil {
			b.Fatal(err)
		}
		return time.Since(start).Seconds() / float64(n)
	}
	// Every 64 KiB completion time of the timed rounds, per side.
	lats := map[*side][]float64{}
	p99 := func(s *side, n int, timed bool) float64 {
		if err := s.lat.do(n); err != nil {
			b.Fatal(err)
		}
		v := slices.Clone(*s.p99)
		if timed {
			lats[s] = append(lats[s], v...)
		}
		slices.Sort(v)
		return v[len(v)*99/100]
	}
	const bulkN, latN, ppN = 48, 400, 2000
	type figure struct {
		thr, lat, pp, fill, fill50 []float64 // ratios segment/stream
		tapped                     []float64 // stream placement's throughput with the observing tap over without
		fillSeg, fillStr           []float64 // mean hole fill to completion, µs
	}
	figs := make([]figure, len(cmps))
	for r := -1; r < rounds; r++ {
		runtime.GC()
		for i, c := range cmps {
			order := []*side{c.seg, c.stream}
			if r%2 == 1 {
				order = []*side{c.stream, c.seg}
			}
			res := map[*side][6]float64{}
			for _, s := range order {
				var f [6]float64
				before := s.rx.Stats().Segment
				f[0] = timed(s.bulk, bulkN)
				if s.fills.do != nil {
					f[5] = timed(s.fills, bulkN)
				}
				if after := s.rx.Stats().Segment; after.HoleFills > before.HoleFills {
					f[3] = (after.HoleFillTime - before.HoleFillTime).Seconds() / float64(after.HoleFills-before.HoleFills)
					h := after.HoleFillHist.Sub(&before.HoleFillHist)
					f[4] = h.Quantile(0.5).Seconds()
					if r >= 0 && s == c.seg {
						c.fillSeg.Add(&h)
					} else if r >= 0 {
						c.fillStr.Add(&h)
					}
				}
				f[1] = p99(s, latN, r >= 0)
				if s.pp.do != nil {
					f[2] = timed(s.pp, ppN)
				}
				res[s] = f
			}
			if r < 0 {
				continue
			}
			sg, st := res[c.seg], res[c.stream]
			figs[i].thr = append(figs[i].thr, st[0]/sg[0])
			if st[5] > 0 {
				figs[i].tapped = append(figs[i].tapped, st[0]/st[5])
			}
			figs[i].lat = append(figs[i].lat, sg[1]/st[1])
			if sg[2] > 0 {
				figs[i].pp = append(figs[i].pp, sg[2]/st[2])
			}
			if sg[3] > 0 && st[3] > 0 {
				figs[i].fill = append(figs[i].fill, sg[3]/st[3])
				figs[i].fillSeg = append(figs[i].fillSeg, sg[3]*1e6)
				figs[i].fillStr = append(figs[i].fillStr, st[3]*1e6)
				figs[i].fill50 = append(figs[i].fill50, sg[4]/st[4])
			}
			c.absSeg = append(c.absSeg, benchMsg/sg[0]/1e6, sg[1]*1e6)
			c.absStr = append(c.absStr, benchMsg/st[0]/1e6, st[1]*1e6)
		}
	}
	for i, c := range cmps {
		g := c.seg.rx.Stats().Segment
		b.Logf("%s: segment side: placed early %d bytes (%d beyond holes, %d fed), %d FPDUs delivered early, %d segments queued for the receive goroutine; FPDUs by marker %d, by stream %d, by alignment %d, unframed %d; hole fills %d timed, %d fed by the tap, %d bytes kept in front of them",
			c.name, g.PlacedEarly, g.OutOfOrder, g.Fed, g.DeliveredEarly, g.Queued, g.ByMarker, g.ByStream, g.ByAlignment, g.Unframed, g.HoleFills, g.FillsFed, g.Kept)
		f := figs[i]
		b.Logf("%s: throughput segment/stream rounds %.3f", c.name, sorted(f.thr))
		b.Logf("%s: p99 64 KiB completion segment/stream rounds %.3f", c.name, sorted(f.lat))
		b.ReportMetric(median(f.thr), c.name+"-throughput-x")
		if len(f.tapped) > 0 {
			b.Logf("%s: stream placement's throughput with the tap that times hole fills over without it, rounds %.3f", c.name, sorted(f.tapped))
		}
		b.ReportMetric(median(f.lat), c.name+"-p99lat-x")
		if len(f.fill) > 0 {
			b.Logf("%s: hole fill to completion segment/stream rounds %.3f (medians %.0f µs and %.0f µs)", c.name, sorted(f.fill), median(f.fillSeg), median(f.fillStr))
			b.ReportMetric(median(f.fill), c.name+"-holefill-x")
			b.Logf("%s: hole fill to completion, median fill segment/stream rounds %.3f", c.name, sorted(f.fill50))
			b.ReportMetric(median(f.fill50), c.name+"-holefill-p50-x")
			b.Logf("%s: hole fills of all rounds, segment: %d, p10 %v p50 %v p90 %v p99 %v; stream: %d, p10 %v p50 %v p90 %v p99 %v; p50 segment/stream %.3f", c.name,
				c.fillSeg.Count(), c.fillSeg.Quantile(.1), c.fillSeg.Quantile(.5), c.fillSeg.Quantile(.9), c.fillSeg.Quantile(.99),
				c.fillStr.Count(), c.fillStr.Quantile(.1), c.fillStr.Quantile(.5), c.fillStr.Quantile(.9), c.fillStr.Quantile(.99),
				c.fillSeg.Quantile(.5).Seconds()/c.fillStr.Quantile(.5).Seconds())
		}
		if len(f.pp) > 0 {
			b.Logf("%s: ping-pong segment/stream rounds %.3f", c.name, sorted(f.pp))
			b.ReportMetric(median(f.pp), c.name+"-pingpong-x")
		}
		q := func(s *side) string {
			v := slices.Clone(lats[s])
			slices.Sort(v)
			if len(v) == 0 {
				return "none"
			}
			at := func(f float64) float64 { return v[int(f*float64(len(v)-1))] * 1e6 }
			return fmt.Sprintf("p50 %.0f µs, p90 %.0f µs, p99 %.0f µs", at(.5), at(.9), at(.99))
		}
		b.Logf("%s: 64 KiB completions of all rounds: segment %s; stream %s", c.name, q(c.seg), q(c.stream))
		b.Logf("%s: medians segment %.0f MB/s, p99 %.0f µs; stream %.0f MB/s, p99 %.0f µs", c.name,
			median(every(c.absSeg, 0)), median(every(c.absSeg, 1)), median(every(c.absStr, 0)), median(every(c.absStr, 1)))
	}
}

func sorted(v []float64) []float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s
}

// every returns v[k], v[k+2], v[k+4], ...
func every(v []float64, k int) []float64 {
	var out []float64
	for i := k; i < len(v); i += 2 {
		out = append(out, v[i])
	}
	return out
}

// latStream is a stream of 64 KiB RDMA Writes, each followed by a Send, 8
// messages in flight; it records each message's time from posting to the
// receiver's completion of its Send into the returned slice (reset by each
// run).
func latStream(b *testing.B, p *pair, crc bool) (workload, *[]float64) {
	const size, depth = 64 << 10, 8
	cl, sv := connect(b, p, depth*size, verbs.ConnParams{CRC: &crc})
	lat := make([]float64, 0, 4096)
	w := workload{bytes: size}
	w.do = func(n int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		lat = lat[:0]
		posted := make([]time.Time, n)
		var wc [depth]verbs.WC
		sent, done := 0, 0
		for done < n {
			for sent < n && sent-done < depth {
				if err := sv.qp.PostRecv(verbs.RecvWR{ID: uint64(sent)}); err != nil {
					return err
				}
				slot := sent % depth
				posted[sent] = time.Now()
				send := verbs.SendWR{ID: uint64(sent), Op: verbs.OpSend}
				if sent%depth == depth-1 {
					send.Flags = verbs.Signaled
				}
				if err := cl.qp.PostSend(
					verbs.SendWR{ID: uint64(sent), Op: verbs.OpWrite, SGL: []verbs.SGE{cl.mr.SGE(slot*size, size)},
						RemoteAddr: cl.remote.Addr + uint64(slot*size), RKey: cl.remote.RKey}, send); err != nil {
					return err
				}
				sent++
			}
			k, err := sv.rcq.Wait(ctx, wc[:])
			if err != nil {
				return err
			}
			now := time.Now()
			for _, c := range wc[:k] {
				if c.Status != verbs.StatusSuccess {
					return c.Err()
				}
				lat = append(lat, now.Sub(posted[c.ID]).Seconds())
				done++
			}
			for cl.scq.Poll(wc[:]) > 0 {
			}
		}
		return nil
	}
	return w, &lat
}

// rdmaPingPongOn is rdmaPingPong on a given pair.
func rdmaPingPongOn(b *testing.B, p *pair, crc bool) workload {
	cl, sv := connect(b, p, 4096, verbs.ConnParams{CRC: &crc})
	var wc [4]verbs.WC
	return workload{do: func(n int) error {
		for i := 0; i < n; i++ {
			if err := sv.qp.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{sv.mr.SGE(0, 64)}}); err != nil {
				return err
			}
			if err := cl.qp.PostSend(verbs.SendWR{ID: 1, Op: verbs.OpSend, SGL: []verbs.SGE{cl.mr.SGE(0, 64)}}); err != nil {
				return err
			}
			if err := drain(sv.rcq, wc[:], 1); err != nil {
				return err
			}
			if err := cl.qp.PostRecv(verbs.RecvWR{ID: 2, SGL: []verbs.SGE{cl.mr.SGE(64, 64)}}); err != nil {
				return err
			}
			if err := sv.qp.PostSend(verbs.SendWR{ID: 2, Op: verbs.OpSend, SGL: []verbs.SGE{sv.mr.SGE(0, 64)}}); err != nil {
				return err
			}
			if err := drain(cl.rcq, wc[:], 1); err != nil {
				return err
			}
		}
		return nil
	}}
}
