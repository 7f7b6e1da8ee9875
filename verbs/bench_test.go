package verbs_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
)

// The benchmarks compare rdmatap with plain netstack TCP on the same
// in-memory link:
//
//	go test -run XXX -bench Ratios ./verbs/   # the ratios, interleaved rounds
//	go test -run XXX -bench . ./verbs/        # every workload on its own
//
// BenchmarkRDMAWrite/BenchmarkRDMARead move 1 MiB messages (CRC off and
// on) and BenchmarkTCPBulk moves 1 MiB writes read into a user buffer;
// compare their MB/s. BenchmarkRDMAWritePingPong64 and
// BenchmarkTCPPingPong64 report one round trip per op (ns/op).
// BenchmarkRatios runs them all in one process, alternating each RDMA
// workload with its TCP baseline, and reports the medians of the per-round
// ratios: on a shared 2-core machine absolute figures drift by ±15% within
// minutes, so only ratios taken side by side mean anything.

const benchMsg = 1 << 20

// benchLink is the in-memory link of the benchmarks: 64 KB packets, so that
// TCP segments and FPDUs are 64 KB (FPDUs follow the segment payload). Set
// RDMATAP_BENCH_MTU=1500 for 1420-byte FPDUs on a GSO link;
// RDMATAP_BENCH_QUEUE=N sets the link's packet queue (default 1,024).
var benchLink = netstack.LinkConfig{MTU: uint32(envInt("RDMATAP_BENCH_MTU", 65535)), QueueLen: envInt("RDMATAP_BENCH_QUEUE", 0)}

// benchStack is the benchmarks' stack configuration: RDMATAP_BENCH_ACK_DELAY
// (a duration; 0 for none) sets netstack.Config.AckDelay, for comparisons
// side by side.
var benchStack = netstack.Config{AckDelay: benchAckDelay()}

// baseStack is the configuration of the plain TCP pairs the RDMA figures
// are set against: RDMATAP_BENCH_BASE_TCP (gvisor or rdmatap) picks their
// TCP, so that RDMA over one TCP is timed beside TCP on the other in one
// run; by default it is the RDMA pairs' ($RDMATAP_TCP).
func baseStack() netstack.Config {
	cfg := benchStack
	cfg.TCP = os.Getenv("RDMATAP_BENCH_BASE_TCP")
	return cfg
}

func benchAckDelay() time.Duration {
	v := os.Getenv("RDMATAP_BENCH_ACK_DELAY")
	if v == "" {
		return 0 // the default
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		panic("RDMATAP_BENCH_ACK_DELAY: want a duration such as 50us or 0")
	}
	if d == 0 {
		return -1 // none
	}
	return d
}

// benchPair is newPairLink on the benchmarks' link and stack configuration.
func benchPair(b testing.TB, ca, cb verbs.DeviceConfig) *pair {
	b.Helper()
	na, nb, err := netstack.NewPair(netstack.PairConfig{Link: benchLink, Stack: benchStack})
	if err != nil {
		b.Fatal(err)
	}
	return pairOn(b, na, nb, ca, cb)
}

// workload is a benchmark body that can run n more operations on an
// established setup, so that a benchmark and the interleaved rounds of
// BenchmarkRatios share it.
type workload struct {
	bytes int64 // per operation; 0 for a latency workload
	do    func(n int) error
}

func drain(cq *verbs.CQ, wc []verbs.WC, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for n > 0 {
		k, err := cq.Wait(ctx, wc[:min(n, len(wc))])
		if err != nil {
			return err
		}
		for _, c := range wc[:k] {
			if c.Status != verbs.StatusSuccess {
				return c.Err()
			}
		}
		n -= k
	}
	return nil
}

// rdmaBulk keeps a window of 1 MiB RDMA Writes or Reads in flight between
// two endpoints, rotating over 16 slots of the peer's MR.
func rdmaBulk(b *testing.B, op verbs.Opcode, crc bool) workload {
	return rdmaBulkOn(b, benchPair(b, verbs.DeviceConfig{}, verbs.DeviceConfig{}), op, crc)
}

// rdmaBulkOn is rdmaBulk between the devices of p.
func rdmaBulkOn(b *testing.B, p *pair, op verbs.Opcode, crc bool) workload {
	cl, sv := connect(b, p, 16*benchMsg, verbs.ConnParams{CRC: &crc})
	// Real bytes in both buffers: memory never written reads as the
	// kernel's zero page, which stays in cache and makes the sender's
	// copies unrealistically cheap (tcpBulk fills its source alike).
	fill(cl.buf, 1)
	fill(sv.buf, 2)
	// Up to window WRs in flight; every mod-th is signaled (perftest's CQ
	// moderation, -Q), so the poster wakes once per mod messages.
	const window, mod = 16, 4
	wc := make([]verbs.WC, window)
	do := func(n int) error {
		inflight := 0 // signaled WRs outstanding
		for i := 0; i < n; i++ {
			slot := i % 16
			wr := verbs.SendWR{ID: uint64(i), Op: op,
				SGL: []verbs.SGE{cl.mr.SGE(slot*benchMsg, benchMsg)}, RemoteAddr: cl.remote.Addr + uint64(slot*benchMsg), RKey: cl.remote.RKey}
			if i%mod == mod-1 || i == n-1 {
				wr.Flags = verbs.Signaled
				if inflight == window/mod {
					if err := drain(cl.scq, wc, 1); err != nil {
						return err
					}
					inflight--
				}
				inflight++
			}
			if err := cl.qp.PostSend(wr); err != nil {
				return err
			}
		}
		if op == verbs.OpWrite {
			// A Send behind the Writes tells when the last one has
			// been placed.
			if err := sv.qp.PostRecv(verbs.RecvWR{ID: 1}); err != nil {
				return err
			}
			if err := cl.qp.PostSend(verbs.SendWR{ID: 1 << 40, Op: verbs.OpSend, Flags: verbs.Signaled}); err != nil {
				return err
			}
			inflight++
			if err := drain(sv.rcq, wc, 1); err != nil {
				return err
			}
		}
		return drain(cl.scq, wc, inflight)
	}
	return workload{bytes: benchMsg, do: do}
}

func BenchmarkRDMAWrite(b *testing.B) {
	for _, crc := range []bool{false, true} {
		b.Run(fmt.Sprintf("crc=%s", onOff(crc)), func(b *testing.B) { runWorkload(b, rdmaBulk(b, verbs.OpWrite, crc)) })
	}
}

func BenchmarkRDMARead(b *testing.B) {
	for _, crc := range []bool{false, true} {
		b.Run(fmt.Sprintf("crc=%s", onOff(crc)), func(b *testing.B) { runWorkload(b, rdmaBulk(b, verbs.OpRead, crc)) })
	}
}

func onOff(v bool) string {
	if v {
		return "on"
	}
	return "off"
}

func runWorkload(b *testing.B, w workload) {
	b.SetBytes(w.bytes)
	b.ResetTimer()
	if err := w.do(b.N); err != nil {
		b.Fatal(err)
	}
}

// copyWriter copies what netstack hands it into a user buffer.
type copyWriter struct {
	buf []byte
	off int
}

func (w *copyWriter) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		n := copy(w.buf[w.off:], p)
		w.off = (w.off + n) % len(w.buf)
		p = p[n:]
	}
	return total, nil
}

func tcpPair(b *testing.B) (*netstack.Conn, *netstack.Conn) {
	na, nb, err := netstack.NewPair(netstack.PairConfig{Link: benchLink, Stack: baseStack()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { na.Close(); nb.Close() })
	l, err := nb.Listen(netip.AddrPort{}, 4)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	ch := make(chan *netstack.Conn, 1)
	go func() {
		c, _ := l.Accept(ctx)
		ch <- c
	}()
	c, err := na.Dial(ctx, netip.AddrPortFrom(nb.Addrs()[0].Addr(), l.Addr().Port()))
	if err != nil {
		b.Fatal(err)
	}
	s := <-ch
	if s == nil {
		b.Fatal("accept failed")
	}
	return c, s
}

// tcpBulk writes 1 MiB at a time; a reader goroutine reads into a user
// buffer. The sender cycles over 16 MiB as the RDMA benchmarks do, so
// neither side of the comparison sends from a cache-hot buffer.
func tcpBulk(b *testing.B) workload {
	c, s := tcpPair(b)
	src := make([]byte, 16*benchMsg)
	fill(src, 3) // see rdmaBulkOn
	var got atomic.Int64
	progress := make(chan struct{}, 1)
	go func() {
		w := &copyWriter{buf: make([]byte, 16*benchMsg)}
		ctx := context.Background()
		for {
			n, err := s.ReadTo(ctx, w, 0)
			if err != nil {
				return
			}
			got.Add(int64(n))
			select {
			case progress <- struct{}{}:
			default:
			}
		}
	}()
	var sent int64
	do := func(n int) error {
		ctx := context.Background()
		for i := 0; i < n; i++ {
			slot := i % 16
			if _, err := c.Write(ctx, src[slot*benchMsg:(slot+1)*benchMsg]); err != nil {
				return err
			}
		}
		sent += int64(n) * benchMsg
		// Done when the reader has it all, as the RDMA side is done when
		// the last Write has been placed.
		for got.Load() < sent {
			select {
			case <-progress:
			case <-time.After(60 * time.Second):
				return errors.New("tcp bulk: reader stalled")
			}
		}
		return nil
	}
	return workload{bytes: benchMsg, do: do}
}

func BenchmarkTCPBulk(b *testing.B) { runWorkload(b, tcpBulk(b)) }

// tcpPingPong: 64 bytes there and back per operation.
func tcpPingPong(b *testing.B) workload {
	c, s := tcpPair(b)
	ctx := context.Background()
	go func() {
		buf := make([]byte, 64)
		for {
			if err := s.ReadFull(ctx, buf); err != nil {
				return
			}
			if _, err := s.Write(ctx, buf); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64)
	do := func(n int) error {
		for i := 0; i < n; i++ {
			if _, err := c.Write(ctx, buf); err != nil {
				return err
			}
			if err := c.ReadFull(ctx, buf); err != nil {
				return err
			}
		}
		return nil
	}
	return workload{do: do}
}

func BenchmarkTCPPingPong64(b *testing.B) { runWorkload(b, tcpPingPong(b)) }

// flag returns the word at buf[off:off+4], read atomically: perftest's
// write_lat polls the last bytes of its receive buffer the same way.
func flag(buf []byte, off int) *uint32 {
	return (*uint32)(unsafe.Pointer(&buf[off]))
}

// waitFlag waits until *p == v, running the QP's receive path in this
// goroutine (a ManualProgress QP): it blocks on the connection like a TCP
// reader, then places the Write itself and checks the flag word, as
// perftest's write_lat polls the last bytes of its buffer.
func waitFlag(qp *verbs.QP, p *uint32, v uint32) error {
	ctx := context.Background()
	for atomic.LoadUint32(p) != v {
		if err := qp.WaitProgress(ctx); err != nil {
			return err
		}
	}
	return nil
}

// rdmaPingPong: A writes 64 bytes into B's receive area; B sees the last
// word change and writes 64 bytes back (ib_write_lat). Each end's MR is
// [receive area 64 B | send area 64 B]. One operation is one round trip.
func rdmaPingPong(b *testing.B) workload {
	p := benchPair(b, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl := newEndCfg(b, p.a, 128, verbs.QPConfig{ManualProgress: true})
	sv := newEndCfg(b, p.b, 128, verbs.QPConfig{ManualProgress: true})
	connectEnds(b, p, cl, sv, verbs.ConnParams{})
	pong := func(e *end, i uint32) error {
		*flag(e.buf, 124) = i
		return e.qp.PostSend(verbs.SendWR{Op: verbs.OpWrite, Flags: verbs.Inline, SGL: []verbs.SGE{e.mr.SGE(64, 64)},
			RemoteAddr: e.remote.Addr, RKey: e.remote.RKey})
	}
	go func() {
		for i := uint32(1); ; i++ {
			if waitFlag(sv.qp, flag(sv.buf, 60), i) != nil || pong(sv, i) != nil {
				return
			}
		}
	}()
	var i uint32
	do := func(n int) error {
		for range n {
			i++
			if err := pong(cl, i); err != nil {
				return err
			}
			if err := waitFlag(cl.qp, flag(cl.buf, 60), i); err != nil {
				return err
			}
		}
		return nil
	}
	return workload{do: do}
}

func BenchmarkRDMAWritePingPong64(b *testing.B) { runWorkload(b, rdmaPingPong(b)) }

// BenchmarkRatios measures the ratios in one process: each RDMA
// workload against its TCP baseline, alternating in rounds
// (RDMATAP_BENCH_ROUNDS, default 15; each side runs for about
// RDMATAP_BENCH_SLICE_MS, default 500, per round; the order flips every
// round). It reports the median ratio of each pair:
//
//	write-crc/tcp, write/tcp, read-crc/tcp, read/tcp  RDMA MB/s ÷ TCP bulk MB/s (higher is better)
//	pingpong/tcp                                      RDMA round trip ÷ TCP round trip (lower is better)
func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func BenchmarkRatios(b *testing.B) {
	rounds := envInt("RDMATAP_BENCH_ROUNDS", 15)
	slice := time.Duration(envInt("RDMATAP_BENCH_SLICE_MS", 500)) * time.Millisecond
	// RDMATAP_BENCH_ONLY, a substring of the pair names, runs some of
	// them (e.g. "pingpong", "crc").
	only := os.Getenv("RDMATAP_BENCH_ONLY")
	var tcp, tpp *workload
	bulk := func() workload {
		if tcp == nil {
			w := tcpBulk(b)
			tcp = &w
		}
		return *tcp
	}
	type pair struct {
		name      string
		rdma, tcp workload
	}
	var pairs []pair
	add := func(name string, rdma func() workload, base func() workload) {
		if strings.Contains(name, only) {
			pairs = append(pairs, pair{name, rdma(), base()})
		}
	}
	add("write-crc/tcp", func() workload { return rdmaBulk(b, verbs.OpWrite, true) }, bulk)
	add("write/tcp", func() workload { return rdmaBulk(b, verbs.OpWrite, false) }, bulk)
	add("read-crc/tcp", func() workload { return rdmaBulk(b, verbs.OpRead, true) }, bulk)
	add("read/tcp", func() workload { return rdmaBulk(b, verbs.OpRead, false) }, bulk)
	add("pingpong/tcp", func() workload { return rdmaPingPong(b) }, func() workload {
		if tpp == nil {
			w := tcpPingPong(b)
			tpp = &w
		}
		return *tpp
	})
	if len(pairs) == 0 {
		b.Fatalf("RDMATAP_BENCH_ONLY=%q matches no pair", only)
	}
	// Calibrate: operations per slice, from a short run of each and then
	// a longer one (the first runs include TCP's slow start).
	ops := func(w workload) int {
		n := 8
		if w.bytes == 0 {
			n = 1000
		}
		for range 2 {
			start := time.Now()
			if err := w.do(n); err != nil {
				b.Fatal(err)
			}
			n = max(1, int(float64(n)*float64(slice/4)/float64(time.Since(start))))
		}
		return 4 * n
	}
	// timed returns seconds per operation.
	timed := func(w workload, n int) float64 {
		start := time.Now()
		if err := w.do(n); err != nil {
			b.Fatal(err)
		}
		return time.Since(start).Seconds() / float64(n)
	}
	nr, nt := make([]int, len(pairs)), make([]int, len(pairs))
	for i, pr := range pairs {
		nr[i], nt[i] = ops(pr.rdma), ops(pr.tcp)
	}
	// One pass whatever b.N is (the rounds are the repetitions); a first,
	// discarded round warms every connection up after the setup's large
	// allocations.
	runtime.GC()
	ratios := make([][]float64, len(pairs))
	// Seconds per operation of each side, for the absolute figures.
	secR, secT := make([][]float64, len(pairs)), make([][]float64, len(pairs))
	for r := -1; r < rounds; r++ {
		for i, pr := range pairs {
			var sr, st float64
			if r%2 == 0 {
				sr, st = timed(pr.rdma, nr[i]), timed(pr.tcp, nt[i])
			} else {
				st, sr = timed(pr.tcp, nt[i]), timed(pr.rdma, nr[i])
			}
			if r < 0 {
				continue
			}
			// Time per operation both ways: RDMA over TCP for latency,
			// TCP over RDMA for throughput.
			ratio := st / sr
			if pr.rdma.bytes == 0 {
				ratio = sr / st
			}
			ratios[i] = append(ratios[i], ratio)
			secR[i], secT[i] = append(secR[i], sr), append(secT[i], st)
		}
	}
	for i, pr := range pairs {
		slices.Sort(ratios[i])
		b.Logf("%-14s sorted rounds %.3f", pr.name, ratios[i])
		r, t := median(secR[i]), median(secT[i])
		if pr.rdma.bytes == 0 {
			b.Logf("%-14s medians: RDMA %.2f µs, TCP %.2f µs per round trip", pr.name, r*1e6, t*1e6)
		} else {
			b.Logf("%-14s medians: RDMA %.0f MB/s, TCP %.0f MB/s", pr.name, float64(pr.rdma.bytes)/r/1e6, float64(pr.tcp.bytes)/t/1e6)
		}
		b.ReportMetric(ratios[i][len(ratios[i])/2], pr.name)
	}
}
