package test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/internal/lattrace"
)

// BenchmarkLatencyBreakdown shows where the microseconds of one small RDMA
// Write go between two processes on bridged TAPs: it runs `lat write -s 2`
// with an rdmatap built with the rdmatrace tag, whose marks
// (internal/lattrace) stamp each message at every stage with the host's
// monotonic clock, and lines up the sender's and the receiver's marks
// message by message. It prints each step's median (and the whole way's
// median and 99th percentile) in µs. RDMATAP_BENCH_PIN=1 pins the two
// processes as in BenchmarkNetworkLatency.
//
//	sudo go test ./test/ -run XXX -bench LatencyBreakdown -benchtime 1x
func BenchmarkLatencyBreakdown(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("skipping: the latency breakdown needs root (TAPs, bridge, namespaces)")
	}
	dir := b.TempDir()
	bin := filepath.Join(dir, "rdmatap-trace")
	if out, err := exec.Command("go", "build", "-tags", "rdmatrace", "-o", bin, "../cmd/rdmatap").CombinedOutput(); err != nil {
		b.Fatalf("building the traced rdmatap: %v\n%s", err, out)
	}
	plain := rdmatapBin
	rdmatapBin = bin
	defer func() { rdmatapBin = plain }()

	const iters = 5000
	n := newNetns(b, 1500)
	args := []string{"lat", "write", "-s", "2", "-n", strconv.Itoa(iters)}
	srvTrace, clTrace := filepath.Join(dir, "server.trace"), filepath.Join(dir, "client.trace")
	srvCPU, clCPU := latPin()
	srv := n.startWith(b, srvCPU, []string{"RDMATAP_TRACE=" + srvTrace}, append(args, benchEndpointArgs(n, 0)...)...)
	n.ready(b, 0)
	cl := n.startWith(b, clCPU, []string{"RDMATAP_TRACE=" + clTrace}, append(append([]string{args[0], args[1], n.ips[0]}, args[2:]...), benchEndpointArgs(n, 1)...)...)
	if out, err := cl.wait(b, 2*time.Minute); err != nil {
		b.Fatalf("client: %v\n%s\nserver:\n%s", err, out, srv.out.String())
	}
	if out, err := srv.wait(b, 30*time.Second); err != nil {
		b.Fatalf("server: %v\n%s", err, out)
	}
	st, ct := readTrace(b, srvTrace), readTrace(b, clTrace)
	ways := append(messageWays(st, ct), messageWays(ct, st)...)
	if len(ways) < iters {
		b.Fatalf("only %d of about %d messages could be followed through both traces", len(ways), 2*iters)
	}
	type step struct {
		name     string
		from, to lattrace.Stage
	}
	sender := []step{
		{"post -> engine writes to TCP", lattrace.Post, lattrace.TCPWrite},
		{"engine write -> TCP hands the segment to the link (gVisor TCP send)", lattrace.TCPWrite, lattrace.LinkEnter},
		{"link -> TAP write begins (repair, ACK delay, TAP link)", lattrace.LinkEnter, lattrace.LinkWrite},
		{"TAP write (writev)", lattrace.LinkWrite, lattrace.TAPWritten},
		{"engine write -> it returns", lattrace.TCPWrite, lattrace.TCPWritten},
		{"TAP write begins -> peer's TAP read returns (kernel, bridge, wake-up)", lattrace.LinkWrite, lattrace.TAPRead},
		{"TAP read -> the stack's processing on the reader returns", lattrace.TAPRead, lattrace.Delivered},
		{"TAP read -> TCP makes the connection readable", lattrace.TAPRead, lattrace.Readable},
	}
	paths := []struct {
		name  string
		fed   bool
		steps []step
	}{
		{"segment placement: the link's goroutine places the message", true, []step{
			{"TAP read -> placed from the segment tap", lattrace.TAPRead, lattrace.Fed},
			{"placed -> the application sees it (wake-up)", lattrace.Fed, lattrace.AppSaw},
		}},
		{"TCP's stream: the reader reads and places the message", false, []step{
			{"readable -> the reader's read begins (hand-off)", lattrace.Readable, lattrace.ReadStart},
			{"read begins -> parsed and placed (gVisor Read, engine)", lattrace.ReadStart, lattrace.ReadDone},
			{"placed -> the application sees it", lattrace.ReadDone, lattrace.AppSaw},
		}},
	}
	median := func(ws [][lattrace.NumStages]int64, from, to lattrace.Stage, q int) float64 {
		d := make([]float64, len(ws))
		for i, w := range ws {
			d[i] = float64(w[to]-w[from]) / 1e3
		}
		slices.Sort(d)
		return d[len(d)*q/100]
	}
	fmt.Fprintf(os.Stderr, "2-byte RDMA Write over bridged TAPs, %d messages followed; µs, median:\n", len(ways))
	for _, s := range sender {
		fmt.Fprintf(os.Stderr, "  %-72s %7.2f\n", s.name, median(ways, s.from, s.to, 50))
	}
	for _, p := range paths {
		var ws [][lattrace.NumStages]int64
		for _, w := range ways {
			if (w[lattrace.Fed] != 0) == p.fed {
				ws = append(ws, w)
			}
		}
		if len(ws) == 0 {
			continue
		}
		fmt.Fprintf(os.Stderr, "  %s (%d messages):\n", p.name, len(ws))
		for _, s := range p.steps {
			fmt.Fprintf(os.Stderr, "    %-70s %7.2f\n", s.name, median(ws, s.from, s.to, 50))
		}
	}
	med, p99 := median(ways, lattrace.Post, lattrace.AppSaw, 50), median(ways, lattrace.Post, lattrace.AppSaw, 99)
	fmt.Fprintf(os.Stderr, "  %-72s %7.2f\n  %-72s %7.2f\n", "post -> the application sees it (one way)", med, "  99th percentile", p99)
	b.ReportMetric(med, "oneway_us")
	b.ReportMetric(p99, "oneway_p99_us")
}

// trace is one process's marks, each stage's sorted.
type trace [lattrace.NumStages][]int64

func readTrace(b *testing.B, path string) *trace {
	f, err := os.Open(path)
	if err != nil {
		b.Fatalf("latency trace: %v", err)
	}
	defer f.Close()
	var t trace
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		s, known := lattrace.ParseStage(name)
		ns, err := strconv.ParseInt(v, 10, 64)
		if !ok || !known || err != nil {
			b.Fatalf("latency trace %s: bad line %q", path, sc.Text())
		}
		t[s] = append(t[s], ns)
	}
	if err := sc.Err(); err != nil {
		b.Fatalf("latency trace: %v", err)
	}
	for s := range t {
		slices.Sort(t[s])
	}
	return &t
}

// messageWays follows each message snd posted through both traces: from
// each Post, the sender's next marks of its stages, then the receiver's
// next marks after the frame's write began. The read's start is the one
// recorded with its end. A message whose way is not complete, or longer
// than a millisecond (the connection's setup, a retransmission), is left
// out.
func messageWays(snd, rcv *trace) [][lattrace.NumStages]int64 {
	next := func(ts []int64, after int64) (int64, int) {
		i := sort.Search(len(ts), func(i int) bool { return ts[i] >= after })
		if i == len(ts) {
			return 0, -1
		}
		return ts[i], i
	}
	var ways [][lattrace.NumStages]int64
	for _, p := range snd[lattrace.Post] {
		var w [lattrace.NumStages]int64
		w[lattrace.Post] = p
		ok := true
		at := p
		for _, s := range []lattrace.Stage{lattrace.TCPWrite, lattrace.LinkEnter, lattrace.LinkWrite, lattrace.TAPWritten, lattrace.TCPWritten} {
			if w[s], _ = next(snd[s], at); w[s] == 0 {
				ok = false
				break
			}
			if s != lattrace.TAPWritten && s != lattrace.TCPWritten {
				at = w[s]
			}
		}
		if !ok {
			continue
		}
		if w[lattrace.TAPRead], _ = next(rcv[lattrace.TAPRead], w[lattrace.LinkWrite]); w[lattrace.TAPRead] == 0 {
			continue
		}
		w[lattrace.Delivered], _ = next(rcv[lattrace.Delivered], w[lattrace.TAPRead])
		w[lattrace.Readable], _ = next(rcv[lattrace.Readable], w[lattrace.TAPRead])
		fed, _ := next(rcv[lattrace.Fed], w[lattrace.TAPRead])
		done, i := next(rcv[lattrace.ReadDone], w[lattrace.TAPRead])
		switch {
		case fed != 0 && (done == 0 || fed < done) && fed < w[lattrace.Delivered]:
			// Placed from the segment tap, on the link's goroutine,
			// while the stack processed the frame.
			w[lattrace.Fed] = fed
			w[lattrace.AppSaw], _ = next(rcv[lattrace.AppSaw], fed)
		case done != 0 && i < len(rcv[lattrace.ReadStart]):
			// ReadStart and ReadDone are marked together, so their i-th
			// marks belong together once each stage is sorted (reads
			// do not overlap).
			w[lattrace.ReadDone], w[lattrace.ReadStart] = done, rcv[lattrace.ReadStart][i]
			w[lattrace.AppSaw], _ = next(rcv[lattrace.AppSaw], done)
		default:
			continue
		}
		if w[lattrace.Delivered] == 0 || w[lattrace.Readable] == 0 || w[lattrace.AppSaw] == 0 ||
			w[lattrace.AppSaw]-p > int64(time.Millisecond) {
			continue
		}
		ways = append(ways, w)
	}
	return ways
}
