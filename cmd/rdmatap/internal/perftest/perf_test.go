package perftest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
	"github.com/rdmatap/rdmatap/verbs"
)

// perfRun runs a server and a client of "rdmatap KIND args..." between two
// in-process endpoints and returns their outputs.
func perfRun(t *testing.T, test PerfTestKind, args ...string) (cout, srv string) {
	t.Helper()
	cout, srv, cerr, serr := perfRunErr(t, test, args...)
	// A failed client closes its side, so the server's error is often only
	// the echo of the client's: report both.
	if serr != nil || cerr != nil {
		t.Fatalf("client: %v\nserver: %v\n--- client output:\n%s\n--- server output:\n%s", cerr, serr, cout, srv)
	}
	return cout, srv
}

func perfRunErr(t *testing.T, test PerfTestKind, args ...string) (cout, srv string, cerr, serr error) {
	t.Helper()
	return perfRunSidesWith(t, test, nil, args, args)
}

// perfRunSides is perfRunErr with flags of each side's own (the client's
// get the server's address appended).
func perfRunSides(t *testing.T, test PerfTestKind, srvArgs, cliArgs []string) (cout, srv string, cerr, serr error) {
	t.Helper()
	return perfRunSidesWith(t, test, nil, srvArgs, cliArgs)
}

// perfRunWith is perfRunErr with a hook that adjusts both sides' options.
func perfRunWith(t *testing.T, test PerfTestKind, adjust func(so, co *perfOpts), args ...string) (cout, srv string, cerr, serr error) {
	t.Helper()
	return perfRunSidesWith(t, test, adjust, args, args)
}

// perfRunSidesWith runs a server with srvArgs and a client with cliArgs,
// adjust (if not nil) changing both sides' options before they start.
func perfRunSidesWith(t *testing.T, test PerfTestKind, adjust func(so, co *perfOpts), srvArgs, cliArgs []string) (cout, srv string, cerr, serr error) {
	t.Helper()
	a, b, err := cli.EmbeddedPair(verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	so, _, err := ParsePerfFlags(test, srvArgs, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	co, _, err := ParsePerfFlags(test, append(append([]string(nil), cliArgs...), b.Addr.String()), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	so.allMax, co.allMax = perfTestAllMax, perfTestAllMax
	so.Timeout, co.Timeout = 10*time.Second, 10*time.Second
	if adjust != nil {
		adjust(&so, &co)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	listening := make(chan struct{})
	so.Listening = func(netip.AddrPort) { close(listening) }
	var sb, cb bytes.Buffer
	sdone := make(chan error, 1)
	go func() { sdone <- RunPerf(ctx, b.Dev, so, &sb) }()
	select {
	case <-listening:
	case err := <-sdone:
		return "", sb.String(), nil, err
	}
	cerr = RunPerf(ctx, a.Dev, co, &cb)
	if cerr != nil {
		// The server would wait for a peer that is gone.
		a.Close()
	}
	serr = <-sdone
	return cb.String(), sb.String(), cerr, serr
}

var perfTestAllMax = 1 << 14

var (
	bwRowRE  = regexp.MustCompile(`^ (\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$`)
	latRowRE = regexp.MustCompile(`^ (\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$`)
)

// tableRows returns the rows under the header line.
func tableRows(t *testing.T, out, header string, re *regexp.Regexp) [][]float64 {
	t.Helper()
	lines := strings.Split(out, "\n")
	var rows [][]float64
	in := false
	for _, l := range lines {
		if l == header {
			in = true
			continue
		}
		if !in {
			continue
		}
		if strings.HasPrefix(l, "-----") {
			break
		}
		m := re.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("row %q does not match the table format\n%s", l, out)
		}
		var row []float64
		for _, f := range m[1:] {
			v, _ := strconv.ParseFloat(f, 64)
			row = append(row, v)
		}
		rows = append(rows, row)
	}
	if !in {
		t.Fatalf("no table header %q in\n%s", header, out)
	}
	return rows
}

func checkBanner(t *testing.T, out, title string, client bool) {
	t.Helper()
	for _, want := range []string{perfResultLine + "                    " + title + "\n",
		" Dual-port       : OFF\t\tDevice         : rt0\n", " Connection type : RC\t\tUsing SRQ      : OFF\n",
		" Mtu             : 1024[B]\n", " Link type       : Ethernet\n", " rdma_cm QPs\t : ON\n", " Data ex. method : rdma_cm",
		" local address: LID 0000 QPN 0x", " remote address: LID 0000 QPN 0x", " GID: 00:00:"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if got := strings.Contains(out, " TX depth        : "); got != client {
		t.Errorf("TX depth line present=%v, want %v:\n%s", got, client, out)
	}
	if !client && !strings.Contains(out, "* Waiting for client to connect... *") {
		t.Errorf("server output lacks the waiting banner:\n%s", out)
	}
}

func TestPerfBW(t *testing.T) {
	for _, verb := range []string{"write", "read", "send"} {
		t.Run(verb, func(t *testing.T) {
			cout, srv := perfRun(t, PerfBW, verb, "-s", "4096", "-n", "200", "--verify", "-F", "-R")
			title := map[string]string{"write": "RDMA_Write BW Test", "read": "RDMA_Read BW Test", "send": "Send BW Test"}[verb]
			checkBanner(t, cout, title, true)
			checkBanner(t, srv, title, false)
			cr := tableRows(t, cout, perfResultFmt, bwRowRE)
			sr := tableRows(t, srv, perfResultFmt, bwRowRE)
			if len(cr) != 1 || len(sr) != 1 {
				t.Fatalf("rows: client %d, server %d", len(cr), len(sr))
			}
			for _, r := range [][]float64{cr[0], sr[0]} {
				if r[0] != 4096 || r[1] != 200 {
					t.Errorf("row %v: want 4096 bytes, 200 iterations", r)
				}
				if r[3] <= 0 || r[4] <= 0 {
					t.Errorf("row %v: zero bandwidth", r)
				}
				// MsgRate[Mpps] × size = BW average × 2^20.
				if bw := r[4] * 1e6 * r[0] / (1 << 20); bw < r[3]*0.98-0.02 || bw > r[3]*1.02+0.02 {
					t.Errorf("row %v: message rate × size = %.2f MB/s, BW average %.2f", r, bw, r[3])
				}
				if verb != "send" && r[2] < r[3]*0.99 {
					t.Errorf("row %v: peak below average", r)
				}
			}
			// The table and what follows, but the tcp line (each side's own).
			table := func(out string) string {
				out = out[strings.Index(out, perfResultFmt):]
				if i := strings.Index(out, "\ntcp: "); i >= 0 {
					out = out[:i+1]
				}
				return out
			}
			if verb != "send" && table(cout) != table(srv) {
				t.Errorf("the server does not print the client's table:\n%s\n%s", cout, srv)
			}
		})
	}
}

func TestPerfLat(t *testing.T) {
	for _, verb := range []string{"write", "read", "send"} {
		t.Run(verb, func(t *testing.T) {
			cout, srv := perfRun(t, PerfLat, verb, "-n", "300", "--verify", "-s", "64")
			title := map[string]string{"write": "RDMA_Write Latency Test", "read": "RDMA_Read Latency Test", "send": "Send Latency Test"}[verb]
			checkBanner(t, cout, title, true)
			checkBanner(t, srv, title, false)
			cr := tableRows(t, cout, perfResultLat, latRowRE)
			if len(cr) != 1 {
				t.Fatalf("client rows %d", len(cr))
			}
			rows := [][]float64{cr[0]}
			if verb != "read" { // ib_read_lat's server prints no table
				sr := tableRows(t, srv, perfResultLat, latRowRE)
				if len(sr) != 1 {
					t.Fatalf("server rows %d", len(sr))
				}
				rows = append(rows, sr[0])
			}
			for _, r := range rows {
				if r[0] != 64 || r[1] != 300 {
					t.Errorf("row %v: want 64 bytes, 300 iterations", r)
				}
				min, max, typ, avg := r[2], r[3], r[4], r[5]
				if !(min > 0 && min <= typ && typ <= max && min <= avg && avg <= max && r[7] <= r[8]) {
					t.Errorf("row %v: inconsistent statistics", r)
				}
			}
		})
	}
}

func TestPerfAll(t *testing.T) {
	cout, srv := perfRun(t, PerfBW, "write", "-a", "-n", "20", "--verify")
	rows := tableRows(t, cout, perfResultFmt, bwRowRE)
	if len(rows) != 13 { // 2 .. 2^13 with the tests' max of 2^14? 2..16384 is 14 sizes
		if len(rows) != 14 {
			t.Fatalf("%d rows, want 14:\n%s", len(rows), cout)
		}
	}
	for i, r := range rows {
		if r[0] != float64(int(2)<<i) || r[1] != 20 {
			t.Errorf("row %d: %v", i, r)
		}
	}
	if sr := tableRows(t, srv, perfResultFmt, bwRowRE); len(sr) != 1 || sr[0][0] != perfTestAllMax_f() {
		t.Errorf("server rows %v", sr)
	}
	cout, _ = perfRun(t, PerfBW, "send", "-a", "-n", "20", "--verify")
	if rows := tableRows(t, cout, perfResultFmt, bwRowRE); len(rows) != 14 {
		t.Errorf("send -a: %d rows", len(rows))
	}
	cout, srv = perfRun(t, PerfLat, "write", "-a", "-n", "10", "--verify")
	if rows := tableRows(t, cout, perfResultLat, latRowRE); len(rows) != 14 {
		t.Errorf("lat write -a: %d rows", len(rows))
	}
	if rows := tableRows(t, srv, perfResultLat, latRowRE); len(rows) != 14 {
		t.Errorf("lat write -a server: %d rows", len(rows))
	}
}

func perfTestAllMax_f() float64 { return float64(perfTestAllMax) }

func TestPerfMultiQP(t *testing.T) {
	for _, verb := range []string{"write", "send"} {
		cout, srv := perfRun(t, PerfBW, verb, "-q", "4", "-s", "8192", "-n", "100", "--verify")
		if n := strings.Count(cout, " local address:"); n != 4 {
			t.Errorf("%s: %d local address lines, want 4", verb, n)
		}
		if !strings.Contains(cout, " Number of qps   : 4\t\t") {
			t.Errorf("banner lacks 4 QPs")
		}
		r := tableRows(t, cout, perfResultFmt, bwRowRE)
		if r[0][1] != 400 {
			t.Errorf("%s: iterations %v, want 400 (100 × 4 QPs)", verb, r[0][1])
		}
		_ = srv
	}
}

func TestPerfDuration(t *testing.T) {
	cout, srv := perfRun(t, PerfBW, "send", "-D", "1", "-s", "4096")
	r := tableRows(t, cout, perfResultFmt, bwRowRE)
	if len(r) != 1 || r[0][1] < 10 || r[0][2] != 0 {
		t.Errorf("send -D 1: rows %v (want iterations counted, no peak)", r)
	}
	if sr := tableRows(t, srv, perfResultFmt, bwRowRE); len(sr) != 1 || sr[0][1] < 10 {
		t.Errorf("server: %v", sr)
	}
	cout, _ = perfRun(t, PerfBW, "write", "-D", "1", "-s", "65536")
	if r := tableRows(t, cout, perfResultFmt, bwRowRE); len(r) != 1 || r[0][1] < 10 {
		t.Errorf("write -D 1: %v", r)
	}
	// send: the server stops at the client's closing handshake; write
	// (no closing handshake): each side at its own deadline.
	for _, verb := range []string{"send", "write"} {
		cout, srv = perfRun(t, PerfLat, verb, "-D", "1")
		for _, out := range []string{cout, srv} {
			re := regexp.MustCompile(`^ (\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s*$`)
			r := tableRows(t, out, perfResultLatD, re)
			if len(r) != 1 || r[0][1] < 10 {
				t.Errorf("lat %s -D 1: %v", verb, r)
				continue
			}
			// t_avg × tps ≈ 1e6 / 2 (half round trips).
			if p := r[0][2] * r[0][3]; p < 0.45e6 || p > 0.55e6 {
				t.Errorf("lat %s -D: t_avg %.2f × tps %.2f = %.0f, want 5e5", verb, r[0][2], r[0][3], p)
			}
		}
	}
}

func TestPerfJSON(t *testing.T) {
	cout, srv := perfRun(t, PerfBW, "write", "-n", "50", "-s", "1024", "-j")
	for _, out := range []string{cout, srv} {
		var doc struct {
			TestInfo map[string]any `json:"test_info"`
			Results  perfBWReport   `json:"results"`
		}
		if err := json.Unmarshal([]byte(out), &doc); err != nil {
			t.Fatalf("not JSON: %v\n%s", err, out)
		}
		r := doc.Results
		if doc.TestInfo["test"] != "RDMA_Write_BW_Test" || r.Size != 1024 || r.Iters != 50 || r.Avg <= 0 {
			t.Errorf("JSON %+v", doc)
		}
	}
	var doc struct {
		Results perfBWReport `json:"results"`
	}
	json.Unmarshal([]byte(cout), &doc)
	r := doc.Results
	// bytes × iterations / time = BW average.
	if got := float64(r.Size*r.Iters) / r.Seconds / (1 << 20); got < r.Avg*0.999 || got > r.Avg*1.001 {
		t.Errorf("size × iters / seconds = %.3f MB/s, BW average %.3f", got, r.Avg)
	}
	cout, _ = perfRun(t, PerfLat, "read", "-n", "50", "-j")
	var ld struct {
		Results perfLatReport `json:"results"`
	}
	if err := json.Unmarshal([]byte(cout), &ld); err != nil || ld.Results.Iters != 50 || ld.Results.Avg <= 0 {
		t.Errorf("lat JSON %v %+v\n%s", err, ld, cout)
	}
}

func TestPerfReportGbits(t *testing.T) {
	cout, _ := perfRun(t, PerfBW, "read", "-n", "20", "--report_gbits")
	if !strings.Contains(cout, perfResultFmtG+"\n") {
		t.Errorf("no Gb/sec header:\n%s", cout)
	}
}

func TestPerfBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{}, {"copy"}, {"write", "-s", "0"}, {"write", "-n", "2"}, {"write", "-p", "70000"},
		{"write", "-q", "0"}, {"write", "-D", "1", "-n", "100"}, {"write", "-D", "2", "-f", "1"},
		{"write", "nohost"}, {"write", "10.0.0.1", "10.0.0.2"}, {"write", "--bogus"}, {"write", "-s", "x"},
	} {
		_, _, err := ParsePerfFlags(PerfBW, args, io.Discard)
		if !errors.Is(err, cli.ErrUsage) {
			t.Errorf("%q: err %v, want a usage error", args, err)
		}
	}
	if _, _, err := ParsePerfFlags(PerfLat, []string{"write", "-q", "2"}, io.Discard); !errors.Is(err, cli.ErrUsage) {
		t.Errorf("lat -q 2: %v", err)
	}
	var stderr bytes.Buffer
	if rc := cli.Run([]string{"bw", "write", "-s", "-5"}, io.Discard, &stderr); rc != 2 || strings.Count(stderr.String(), "\n") != 1 {
		t.Errorf("bad flag: exit %d, stderr %q", rc, stderr.String())
	}
	// Defaults as perftest's.
	o, _, _ := ParsePerfFlags(PerfBW, []string{"write"}, io.Discard)
	if o.size != 65536 || o.iters != 5000 || o.port != 18515 || o.txDepth != 128 || o.cqMod != 1 {
		t.Errorf("bw write defaults %+v", o)
	}
	// Above 8 KiB perftest turns CQ moderation off unless -Q is given.
	if o, _, _ = ParsePerfFlags(PerfBW, []string{"read", "-s", "4096"}, io.Discard); o.cqMod != 100 || o.iters != 1000 {
		t.Errorf("bw read -s 4096: %+v", o)
	}
	// Sizes take K, M, G as every size flag does.
	if o, _, err := ParsePerfFlags(PerfBW, []string{"write", "-s", "64K"}, io.Discard); err != nil || o.size != 64<<10 {
		t.Errorf("bw write -s 64K: size %d, %v", o.size, err)
	}
	if o, _, err := ParsePerfFlags(PerfBW, []string{"write", "--size", "1M"}, io.Discard); err != nil || o.size != 1<<20 {
		t.Errorf("bw write --size 1M: size %d, %v", o.size, err)
	}
	o, _, _ = ParsePerfFlags(PerfBW, []string{"send", "-n", "20"}, io.Discard)
	if o.iters != 20 || o.txDepth != 20 || o.rxDepth != 20 {
		t.Errorf("bw send -n 20: %+v", o)
	}
	o, _, _ = ParsePerfFlags(PerfLat, []string{"read", "-s", "8", "10.1.2.3", "-n", "7"}, io.Discard)
	if o.size != 8 || o.iters != 7 || o.server != netip.MustParseAddr("10.1.2.3") || o.txDepth != 1 {
		t.Errorf("lat read flags after the server: %+v", o)
	}
}

func TestPerfUnreachable(t *testing.T) {
	a, b, err := cli.EmbeddedPair(verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	o, _, err := ParsePerfFlags(PerfBW, []string{"write", "-n", "10", b.Addr.String()}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	o.Timeout = 2 * time.Second
	var out bytes.Buffer
	err = RunPerf(context.Background(), a.Dev, o, &out)
	if err == nil || strings.Contains(err.Error(), "\n") {
		t.Fatalf("unreachable server: %v", err)
	}
	t.Log(err)
}

func TestPerfCHex(t *testing.T) {
	for _, c := range []struct {
		v    uint64
		w    int
		want string
	}{{0, 4, "0000"}, {3, 6, "0x0003"}, {0xe7104e, 6, "0xe7104e"}, {0x1234567, 6, "0x1234567"}} {
		if got := cHex(c.v, c.w); got != c.want {
			t.Errorf("cHex(%#x, %d) = %q, want %q", c.v, c.w, got, c.want)
		}
	}
	// The row format of the siw log.
	o := perfOpts{}
	if got := o.bwRow(perfBWReport{Size: 4096, Iters: 20, Peak: 15.22, Avg: 7.55, MsgRate: 0.001934}); got != " 4096       20               15.22              7.55   \t\t   0.001934\n" {
		t.Errorf("row %q", got)
	}
}

// TestPerfSendVerifyMemoryBound: send --verify gives each posted receive
// its own buffer; a depth and size that would need more than 1 GiB per QP
// get a one-line error naming the way out instead of an allocation.
func TestPerfSendVerifyMemoryBound(t *testing.T) {
	_, _, cerr, serr := perfRunErr(t, PerfBW, "send", "-s", "4194304", "-r", "512", "-n", "600", "--verify")
	if serr == nil || !strings.Contains(serr.Error(), "--rx-depth") || strings.Contains(serr.Error(), "\n") {
		t.Fatalf("server error %v (client %v), want a one-line error about --rx-depth", serr, cerr)
	}
}

// TestPerfAtomic: bw and lat atomic (ib_atomic_bw/lat) with both -A types
// and --verify, between rdmatap endpoints; two QPs for bw.
func TestPerfAtomic(t *testing.T) {
	for _, typ := range []string{"FETCH_AND_ADD", "CMP_AND_SWAP"} {
		t.Run(typ, func(t *testing.T) {
			cout, srv := perfRun(t, PerfBW, "atomic", "-A", typ, "-n", "300", "-q", "2", "-o", "4", "--verify")
			title := "Atomic " + typ + " BW Test"
			checkBanner(t, cout, title, true)
			checkBanner(t, srv, title, false)
			if !strings.Contains(cout, " Outstand reads  : 4\n") {
				t.Errorf("no outstanding-reads line:\n%s", cout)
			}
			for _, out := range []string{cout, srv} {
				r := tableRows(t, out, perfResultFmt, bwRowRE)
				if len(r) != 1 || r[0][0] != 8 || r[0][1] != 600 || r[0][4] <= 0 {
					t.Errorf("rows %v: want 8 bytes, 600 iterations", r)
				}
			}
			cout, srv = perfRun(t, PerfLat, "atomic", "-A", typ, "-n", "200", "--verify")
			checkBanner(t, cout, "Atomic "+typ+" Latency Test", true)
			checkBanner(t, srv, "Atomic "+typ+" Latency Test", false)
			if r := tableRows(t, cout, perfResultLat, latRowRE); len(r) != 1 || r[0][0] != 8 || r[0][1] != 200 {
				t.Errorf("lat rows %v", r)
			}
		})
	}
	// perftest refuses these (perftest_parameters.c): a size for an
	// atomic, -A outside the atomic tests, -I on Reads and atomics, -o
	// outside Reads and atomics.
	for _, args := range [][]string{{"atomic", "-s", "16"}, {"atomic", "-a"}, {"atomic", "-A", "SWAP"},
		{"write", "-A", "CMP_AND_SWAP"}, {"read", "--atomic_type", "FETCH_AND_ADD"},
		{"atomic", "-I", "8"}, {"read", "-I", "0"}, {"send", "-o", "4"}, {"write", "--outs", "1"}} {
		for _, test := range []PerfTestKind{PerfBW, PerfLat} {
			if _, _, err := ParsePerfFlags(test, args, io.Discard); !errors.Is(err, cli.ErrUsage) {
				t.Errorf("%v: %v", args, err)
			}
		}
	}
	for _, args := range [][]string{{"read", "-o", "4"}, {"atomic", "-o", "4", "-A", "CMP_AND_SWAP"}, {"write", "-I", "64"}} {
		if _, _, err := ParsePerfFlags(PerfBW, args, io.Discard); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
}

// TestPerfAtomicJSON: perftest's JSON names the atomic operation in the
// test (Atomic_FETCH_AND_ADD_BW_Test, Atomic_CMP_AND_SWAP_Latency_Test).
func TestPerfAtomicJSON(t *testing.T) {
	for _, c := range []struct {
		test PerfTestKind
		typ  string
		want string
	}{{PerfBW, "FETCH_AND_ADD", "Atomic_FETCH_AND_ADD_BW_Test"}, {PerfLat, "CMP_AND_SWAP", "Atomic_CMP_AND_SWAP_Latency_Test"}} {
		cout, srv := perfRun(t, c.test, "atomic", "-A", c.typ, "-n", "20", "-j")
		outs := []string{cout, srv}
		if c.test == PerfLat {
			outs = outs[:1] // a one-sided lat server reports nothing
		}
		for _, out := range outs {
			var doc struct {
				TestInfo map[string]any `json:"test_info"`
			}
			if err := json.Unmarshal([]byte(out), &doc); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, out)
			}
			if doc.TestInfo["test"] != c.want {
				t.Errorf("test %q, want %q", doc.TestInfo["test"], c.want)
			}
		}
	}
}

// TestPerfExchangeShape checks the handshakes around each latency test
// (and send bw's)
// against perftest 4.5's sources, since two rdmatap endpoints agree on any
// symmetric sequence and only a real perftest notices a difference (two
// in create_rdma_cm_connection, around the test connections, then):
//
//	write_lat.c: hs, per-QP hs, per-QP hs, hs; the sizes back to back; no
//	  closing handshake (the server's first Write opens the test)
//	read_lat.c, atomic_lat.c: the same four; the server closes at once
//	  (ctx_close_connection), the client after the sizes
//	send_lat.c: per-QP hs, hs, per-QP hs; a handshake before each size
//	  (after posting its receives); ctx_close_connection at the end
func TestPerfExchangeShape(t *testing.T) {
	for _, c := range []struct {
		test      PerfTestKind
		verb      string
		args      []string
		cout, srv string
	}{
		{PerfLat, "write", nil, "hs hs hs hs hs hs lat lat lat", "hs hs hs hs hs hs lat lat lat"},
		{PerfLat, "read", nil, "hs hs hs hs hs hs lat lat lat hs", "hs hs hs hs hs hs hs"},
		{PerfLat, "atomic", []string{"-A", "CMP_AND_SWAP"}, "hs hs hs hs hs hs lat hs", "hs hs hs hs hs hs hs"},
		{PerfLat, "send", nil, "hs hs hs hs hs hs lat hs lat hs lat hs", "hs hs hs hs hs hs lat hs lat hs lat hs"},
		// send_bw.c -a: per-QP hs, hs, per-QP hs; a handshake before and
		// after each size; ctx_close_connection.
		{PerfBW, "send", nil, "hs hs hs hs hs hs hs hs hs hs hs hs", "hs hs hs hs hs hs hs hs hs hs hs hs"},
	} {
		t.Run(map[PerfTestKind]string{PerfBW: "bw-", PerfLat: "lat-"}[c.test]+c.verb, func(t *testing.T) {
			var mu sync.Mutex
			var cout, srv []string
			args := append([]string{c.verb, "-n", "20"}, c.args...)
			if c.verb != "atomic" {
				args = append(args, "-a")
			}
			_, _, cerr, serr := perfRunWith(t, c.test, func(so, co *perfOpts) {
				so.allMax, co.allMax = 8, 8 // sizes 2, 4, 8
				so.trace = func(e string) { mu.Lock(); srv = append(srv, e); mu.Unlock() }
				co.trace = func(e string) { mu.Lock(); cout = append(cout, e); mu.Unlock() }
			}, args...)
			if cerr != nil || serr != nil {
				t.Fatalf("client %v, server %v", cerr, serr)
			}
			mu.Lock()
			defer mu.Unlock()
			if got := strings.Join(cout, " "); got != c.cout {
				t.Errorf("client: %s\nwant:   %s", got, c.cout)
			}
			if got := strings.Join(srv, " "); got != c.srv {
				t.Errorf("server: %s\nwant:   %s", got, c.srv)
			}
		})
	}
}

// TestBusyPollFlag: --busy-poll reaches the endpoint; lat busy-polls the
// TAP unless told otherwise (as perftest's lat tests busy-poll their CQs),
// bw does not; bad values and combinations are usage errors.
func TestBusyPollFlag(t *testing.T) {
	// checked parses a perf command line and checks its endpoint flags.
	checked := func(test PerfTestKind, args []string) *cli.EndpointFlags {
		t.Helper()
		_, ef, err := ParsePerfFlags(test, args, io.Discard)
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		ef.Tap, ef.Addr = "rtbp0", "192.0.2.1/24"
		if _, _, _, err := ef.Check(); err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		return ef
	}
	for _, c := range []struct {
		test PerfTestKind
		args []string
		want time.Duration
	}{
		{PerfLat, []string{"write"}, cli.LatBusyPoll},
		{PerfLat, []string{"write", "--busy-poll", "0"}, 0},
		{PerfLat, []string{"send", "--busy-poll", "1ms"}, time.Millisecond},
		{PerfLat, []string{"write", "--no-offload"}, 0},
		{PerfBW, []string{"write"}, 0},
		{PerfBW, []string{"write", "--busy-poll", "50us"}, 50 * time.Microsecond},
	} {
		if ef := checked(c.test, c.args); ef.BusyPoll != c.want {
			t.Errorf("%q: busy poll %v, want %v", c.args, ef.BusyPoll, c.want)
		}
	}
	// lat places from segments unless told otherwise; bw does not.
	for _, c := range []struct {
		test PerfTestKind
		args []string
		want verbs.Placement
	}{
		{PerfLat, []string{"write"}, verbs.PlacementSegment},
		{PerfLat, []string{"send", "--placement", "stream"}, verbs.PlacementStream},
		{PerfBW, []string{"write"}, verbs.PlacementStream},
		{PerfBW, []string{"write", "--placement", "segment"}, verbs.PlacementSegment},
	} {
		if ef := checked(c.test, c.args); ef.Lab.Mode != c.want {
			t.Errorf("%q: placement %v, want %v", c.args, ef.Lab.Mode, c.want)
		}
	}
	for _, args := range [][]string{
		{"write", "--busy-poll", "-1ms"}, {"write", "--busy-poll", "2s"}, {"write", "--busy-poll", "1ms", "--no-offload"},
	} {
		_, ef, err := ParsePerfFlags(PerfBW, args, io.Discard)
		if err == nil {
			ef.Tap, ef.Addr = "rtbp0", "192.0.2.1/24"
			_, _, _, err = ef.Check()
		}
		if !errors.Is(err, cli.ErrUsage) {
			t.Errorf("%q: err %v, want a usage error", args, err)
		}
	}
	_, ef, err := ParsePerfFlags(PerfBW, []string{"write", "--via", "/run/x.sock", "--busy-poll", "1ms"}, io.Discard)
	if err == nil {
		_, _, _, err = ef.Check()
	}
	if !errors.Is(err, cli.ErrUsage) {
		t.Errorf("--via with --busy-poll: err %v, want a usage error", err)
	}
}
