package capi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/internal/progtest"
	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/service"
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

var (
	rdmatapOnce sync.Once
	rdmatapPath string
	rdmatapErr  error
)

// rdmatapBinary builds the rdmatap command once per test binary into a
// directory every user may read.
func rdmatapBinary(tb testing.TB) string {
	tb.Helper()
	rdmatapOnce.Do(func() {
		dir, err := os.MkdirTemp("", "capi-rdmatap")
		if err != nil {
			rdmatapErr = err
			return
		}
		os.Chmod(dir, 0o755)
		rdmatapPath = filepath.Join(dir, "rdmatap")
		out, err := exec.Command("go", "build", "-o", rdmatapPath, "github.com/rdmatap/rdmatap/cmd/rdmatap").CombinedOutput()
		if err != nil {
			rdmatapErr = fmt.Errorf("building rdmatap: %v\n%s", err, out)
		}
	})
	if rdmatapErr != nil {
		tb.Fatal(rdmatapErr)
	}
	return rdmatapPath
}

// linkedServices serves both ends of one in-memory link, each on its own
// socket (group nogroup when root): A at 192.0.2.1, B at 192.0.2.2.
type linkedServices struct {
	sockA, sockB string
	stackA       *netstack.Stack
	addrA, addrB netip.Addr
}

func startLinkedServices(tb testing.TB, logf func(string, ...any)) *linkedServices {
	tb.Helper()
	return startLinkedServicesPair(tb, logf, netstack.PairConfig{})
}

// startLinkedServicesPair is startLinkedServices on a pair of cfg's
// addresses.
func startLinkedServicesPair(tb testing.TB, logf func(string, ...any), cfg netstack.PairConfig) *linkedServices {
	tb.Helper()
	na, nb, err := netstack.NewPair(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	gid := -1
	if os.Geteuid() == 0 {
		gid = nogroup
	}
	dir := world(tb)
	var socks [2]string
	for i, n := range []*netstack.Stack{na, nb} {
		d, err := verbs.Open(n, verbs.DeviceConfig{Name: fmt.Sprintf("rt%d", i)})
		if err != nil {
			tb.Fatal(err)
		}
		socks[i] = filepath.Join(dir, fmt.Sprintf("rt%d.sock", i))
		ln, err := service.ListenSocket(socks[i], gid)
		if err != nil {
			tb.Fatal(err)
		}
		srv, err := service.Serve(d, ln, service.Config{Logf: logf})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() {
			srv.Close()
			d.Close()
			n.Close()
		})
	}
	return &linkedServices{sockA: socks[0], sockB: socks[1], stackA: na, addrA: na.Addrs()[0].Addr(), addrB: nb.Addrs()[0].Addr()}
}

// waitListen waits until something listens on B's port, probing with TCP
// connections from A (a listener's service drops a connection that sends
// no MPA request; the program never sees it), or until the server ends.
func (l *linkedServices) waitListen(tb testing.TB, port int, done <-chan error) error {
	tb.Helper()
	addr := netip.AddrPortFrom(l.addrB, uint16(port))
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			return fmt.Errorf("the server ended before it listened: %v", err)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		c, err := l.stackA.Dial(ctx, addr)
		cancel()
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("nothing listens on %v", addr)
}

// runPerfPair runs a perftest-style server on service B and, once it
// listens, its client on service A; it returns the client's output.
func (l *linkedServices) runPerfPair(tb testing.TB, libdir string, port int, server, client []string) (string, error) {
	tb.Helper()
	srv := command(tb, libdir, l.sockB, server[0], server[1:]...)
	var srvOut bytes.Buffer
	srv.Stdout, srv.Stderr = &srvOut, &srvOut
	if err := srv.Start(); err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	if err := l.waitListen(tb, port, done); err != nil {
		srv.Process.Kill()
		return "", fmt.Errorf("%s: %v\n%s", server[0], err, srvOut.String())
	}
	cl := command(tb, libdir, l.sockA, client[0], client[1:]...)
	var out bytes.Buffer
	cl.Stdout, cl.Stderr = &out, &out
	cl.Start()
	cdone := make(chan error, 1)
	go func() { cdone <- cl.Wait() }()
	cerr := waitExit(cl, cdone, 5*time.Minute, client[0])
	if progtest.PerftestListenRace(out.Bytes(), cerr) {
		srv.Process.Kill()
		<-done
		return out.String(), errRaced
	}
	serr := waitExit(srv, done, time.Minute, server[0])
	if cerr != nil || serr != nil {
		return out.String(), fmt.Errorf("client %v, server %v\nclient:\n%s\nserver:\n%s", cerr, serr, out.String(), srvOut.String())
	}
	return out.String(), nil
}

// waitExit waits up to d for a started program's end (done is its
// Wait's result), killing it after that.
func waitExit(c *exec.Cmd, done <-chan error, d time.Duration, name string) error {
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		c.Process.Kill()
		return fmt.Errorf("%s did not finish: %v", name, <-done)
	}
}

// errRaced: the client lost perftest's setup race (progtest.PerftestListenRace).
var errRaced = errors.New("the client lost perftest's setup race")

// perfRow returns field i (0: the first after #iterations) of the result
// row of size in perftest's table.
func perfRow(out string, size, i int) (float64, error) {
	re := regexp.MustCompile(`(?m)^\s*` + strconv.Itoa(size) + `\s+\d+\s+(.*)$`)
	m := re.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("no result row of %d bytes in\n%s", size, out)
	}
	f := strings.Fields(m[1])
	if i >= len(f) {
		return 0, fmt.Errorf("result row %q: no field %d", m[0], i)
	}
	return strconv.ParseFloat(f[i], 64)
}

var benchPort = 19100

// BenchmarkPerftest runs perftest's ib_write_bw -R (1 MiB messages) and
// ib_write_lat -R (64 bytes) on the C libraries beside rdmatap's bw write
// and lat write --via (the Go client of the service), server and client
// each on its own service of one in-memory link, every program in its own
// process (as nobody when root), in alternating rounds
// (RDMATAP_BENCH_ROUNDS, default 5). It reports the medians of the
// per-round ratios: bandwidth C ÷ Go, and the typical latency C − Go.
func BenchmarkPerftest(b *testing.B) {
	installed(b, "ib_write_bw", "perftest")
	dir := libs(b, false)
	rt := rdmatapBinary(b)
	l := startLinkedServices(b, nil)
	rounds := 5
	if v, err := strconv.Atoi(os.Getenv("RDMATAP_BENCH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	const bwSize, latSize = 1 << 20, 64
	bwIters, latIters := strconv.Itoa(2000*max(b.N, 1)), strconv.Itoa(10000*max(b.N, 1))
	var run func(c bool, lat bool) float64
	run = func(c bool, lat bool) float64 {
		benchPort++
		port := strconv.Itoa(benchPort)
		size, iters, prog, verb := bwSize, bwIters, "ib_write_bw", []string{rt, "bw", "write"}
		if lat {
			size, iters, prog, verb = latSize, latIters, "ib_write_lat", []string{rt, "lat", "write"}
		}
		args := []string{"-s", strconv.Itoa(size), "-n", iters, "-p", port}
		var server, client []string
		if c {
			server = append([]string{prog, "-R"}, args...)
			client = append(append([]string{prog, "-R"}, args...), l.addrB.String())
		} else {
			server = append(append(append([]string{}, verb...), args...), "--via", l.sockB)
			client = append(append(append([]string{}, verb...), args...), l.addrB.String(), "--via", l.sockA)
		}
		out, err := l.runPerfPair(b, dir, benchPort, server, client)
		if errors.Is(err, errRaced) {
			b.Logf("%s: %v; again", prog, err)
			return run(c, lat)
		}
		if err != nil {
			b.Fatal(err)
		}
		field := 1 // BW average
		if lat {
			field = 2 // t_typical
		}
		v, err := perfRow(out, size, field)
		if err != nil {
			b.Fatal(err)
		}
		return v
	}
	var bwC, bwGo, bwRatio, latC, latGo, latDiff []float64
	b.ResetTimer()
	for r := 0; r < rounds; r++ {
		order := []bool{true, false}
		if r%2 == 1 {
			order = []bool{false, true}
		}
		var bw, lat [2]float64
		for _, c := range order {
			i := 0
			if !c {
				i = 1
			}
			bw[i] = run(c, false)
			lat[i] = run(c, true)
		}
		bwC, bwGo, bwRatio = append(bwC, bw[0]), append(bwGo, bw[1]), append(bwRatio, bw[0]/bw[1])
		latC, latGo, latDiff = append(latC, lat[0]), append(latGo, lat[1]), append(latDiff, lat[0]-lat[1])
		b.Logf("round %d: 1 MiB write bw: ib_write_bw %.0f MB/s, bw write --via %.0f MB/s (%.2f); 64 B write lat: ib_write_lat %.2f µs, lat write --via %.2f µs (%+.2f)",
			r, bw[0], bw[1], bw[0]/bw[1], lat[0], lat[1], lat[0]-lat[1])
	}
	b.StopTimer()
	b.ReportMetric(median(bwC), "c-MB/s")
	b.ReportMetric(median(bwGo), "go-MB/s")
	b.ReportMetric(median(bwRatio), "bw-c/go")
	b.ReportMetric(median(latC), "c-lat-µs")
	b.ReportMetric(median(latGo), "go-lat-µs")
	b.ReportMetric(median(latDiff), "lat-c-go-µs")
	b.ReportMetric(0, "ns/op")
}
