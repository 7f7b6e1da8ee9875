// Package perftest is `rdmatap bw` and `rdmatap lat`: perftest-compatible
// bandwidth and latency tests (the flags and output of ib_*_bw and
// ib_*_lat with -R), with their --plot SVGs.
package perftest

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
	"github.com/rdmatap/rdmatap/verbs"
)

// rdmatap bw / rdmatap lat: perftest's ib_{write,read,send}_{bw,lat}
// (linux-rdma/perftest 4.5) with its flags, defaults, banner and result
// table. The connection setup is perftest's -R (rdma_cm) mode: a
// parameter-exchange connection whose Sends carry perftest's messages
// (version, system data, MTU, struct pingpong_dest, bw reports), then one
// test connection per QP to the same port. See perf_exchange.go.

func init() {
	cli.Register("bw", "perftest-style bandwidth test: rdmatap bw write|read|send|atomic [flags] [SERVER]\n"+
		"            (ib_write_bw/ib_read_bw/ib_send_bw/ib_atomic_bw -R flags and output)", func(a []string, o, e io.Writer) error { return perfCmd(PerfBW, a, o, e) })
	cli.Register("lat", "perftest-style latency test: rdmatap lat write|read|send|atomic [flags] [SERVER]\n"+
		"            (ib_write_lat/ib_read_lat/ib_send_lat/ib_atomic_lat -R flags and output)", func(a []string, o, e io.Writer) error { return perfCmd(PerfLat, a, o, e) })
}

type PerfTestKind int

const (
	PerfBW PerfTestKind = iota
	PerfLat
)

type perfVerb int

const (
	perfSend perfVerb = iota
	perfWrite
	perfRead
	perfAtomic // RFC 7306 atomics, between rdmatap endpoints (ib_atomic_*)
)

// testsStr of perftest_parameters.c, indexed by verb.
var perfVerbStr = [...]string{"Send", "RDMA_Write", "RDMA_Read", "Atomic"}

// perfAtomicType is perftest's -A: the atomic operation of atomic tests.
type perfAtomicType int

const (
	perfCmpSwap  perfAtomicType = iota // CMP_AND_SWAP
	perfFetchAdd                       // FETCH_AND_ADD (perftest's default)
)

// atomicTypesStr of perftest_parameters.c.
var perfAtomicStr = [...]string{"CMP_AND_SWAP", "FETCH_AND_ADD"}

// oneSided reports whether the client's WRs wait for the server's
// response (Reads and atomics): the server only serves, and the client's
// outstanding requests are bounded by -o (ORD).
func (o *perfOpts) oneSided() bool { return o.verb == perfRead || o.verb == perfAtomic }

// perfAtomicSize is the message size of atomic tests (perftest forces 8).
const perfAtomicSize = 8

// perftest constants (perftest_parameters.h, perftest_communication.h).
const (
	perfDefPort     = 18515
	perfDefSizeBW   = 65536
	perfDefSizeLat  = 2
	perfDefIters    = 1000
	perfDefItersWB  = 5000
	perfDefTxBW     = 128
	perfDefTxLat    = 1
	perfDefRxSend   = 512
	perfDefCQMod    = 100
	perfDefDuration = 5
	perfMaxSize     = 1 << 23 // MAX_SIZE: -a runs 2..2^23
	perfMinIter     = 5
	perfCQModLimit  = 8192 // MSG_SIZE_CQ_MOD_LIMIT: no CQ moderation above
	perfNoPeakIters = 20000
	perfResultLine  = "---------------------------------------------------------------------------------------\n"
	perfResultFmt   = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
	perfResultFmtG  = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
	perfResultLat   = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
	perfResultLatD  = " #bytes        #iterations       t_avg[usec]    tps average"
	perfReportFmt   = " %-7d    %-10d       %-7.2f            %-7.2f\t\t   %-7.6f\n"
	perfReportExt   = " %-7d    %d           %-7.6f            %-7.6f            %-7.6f\n"
	perfReportLat   = " %-7d %d          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f\n"
	perfReportLatD  = " %-7d       %d            %-7.2f        %-7.2f\n"
	perfMTU         = 1024 // what siw reports as the active MTU (IBV_MTU_1024)
	perfMTUEnum     = 3
)

// perfOpts are the parsed flags.
type perfOpts struct {
	test    PerfTestKind
	verb    perfVerb
	server  netip.Addr // client: the server's address; invalid: we are the server
	bind    netip.Addr // server: address to listen on (default: any)
	port    uint16
	size    int
	iters   int
	dur     time.Duration // -D: duration mode
	margin  time.Duration // -f
	qps     int
	all     bool
	allMax  int // largest -a size (perfMaxSize; tests lower it)
	txDepth int
	rxDepth int
	cqMod   int
	inline  int
	outs    int
	noPeak  bool
	gbits   bool
	json    bool
	verify  bool
	atomic  perfAtomicType // -A, atomic tests
	devName string
	Timeout time.Duration
	plot    string // --plot: the client draws the -a sweep into this SVG file
	// waitSpin is the latency tests' QPConfig.WaitSpin: the TAP's busy
	// poll, so that the waiting poster spins beside the read loop.
	waitSpin time.Duration

	// progress receives the terminal progress line (nil: none).
	progress io.Writer
	// Listening is called once the server listens (tests).
	Listening func(netip.AddrPort)
	// trace, if set, is told of each handshake ("hs") and of each size
	// the latency loop starts ("lat"): the exchange's shape (tests).
	trace func(string)
}

func (o *perfOpts) client() bool { return o.server.IsValid() }

func perfCmd(test PerfTestKind, args []string, stdout, stderr io.Writer) error {
	o, ef, err := ParsePerfFlags(test, args, stderr)
	if err != nil {
		return err
	}
	if _, _, _, err := ef.Check(); err != nil {
		return err
	}
	if err := checkPlotFile(o.plot); err != nil {
		return err // before the TAP opens: a sweep must not run for nothing
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if f, ok := stderr.(*os.File); ok && isTTY(f) {
		o.progress = stderr
	}
	if os.Getenv("GOMAXPROCS") == "" {
		// perftest's programs are one thread each; bw and lat run on one
		// P. Every step of a message (the TAP's read loop, TCP's
		// processor, the QP's reader or writer, the poster) is a
		// goroutine that the one before makes runnable: on one P it runs
		// next in the same thread, with more a hand-over can wake another
		// thread on another core. lat has one message in flight and so
		// nothing to overlap (2-byte lat write over bridged TAPs on a
		// 2-core machine: 45 µs one way with GOMAXPROCS=2, 25 µs with
		// 1). bw over bridged TAPs between two processes on a 2-core
		// machine: 1 MiB Writes at 13–27 Gbit/s and 0.55–0.9 CPU-s/GB with
		// one P each, 9–16 Gbit/s and 0.9–1.25 with a P per core, whose
		// idle Ps wake threads the other endpoint's core needs. The
		// environment's GOMAXPROCS still wins: an endpoint with cores to
		// itself may overlap its steps on more Ps.
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	}
	e, err := ef.Open()
	if err != nil {
		return err
	}
	defer e.Close()
	if o.devName == "" {
		o.devName = e.Dev.Name()
	}
	return RunPerf(ctx, e.Dev, o, stdout)
}

// sizes returns the message sizes of the run.
func (o *perfOpts) sizes() []int {
	if !o.all {
		return []int{o.size}
	}
	var s []int
	for i := 1; i < 24 && 1<<i <= o.allMax; i++ {
		s = append(s, 1<<i)
	}
	return s
}

// bufSize is the per-QP buffer size: the largest message, at least a page
// (perftest's BUFF_SIZE with cycle_buffer = page size).
func (o *perfOpts) bufSize() int {
	n := o.size
	if o.all {
		n = o.allMax
	}
	return max(n, 4096)
}

// cHex formats v as C's printf("%#0<w>x") does: "0x" counts in the
// width, and zero prints without the prefix.
func cHex(v uint64, w int) string {
	if v == 0 {
		return fmt.Sprintf("%0*x", w, 0)
	}
	h := strconv.FormatUint(v, 16)
	if len(h)+2 < w {
		h = strings.Repeat("0", w-2-len(h)) + h
	}
	return "0x" + h
}

// printBanner prints ctx_print_test_info as perftest 4.5 does for an
// iWARP device in -R mode.
func (o *perfOpts) printBanner(w io.Writer) {
	var b strings.Builder
	b.WriteString(perfResultLine)
	b.WriteString("                    " + perfVerbStr[o.verb] + " ")
	if o.verb == perfAtomic {
		b.WriteString(perfAtomicStr[o.atomic] + " ")
	}
	if o.test == PerfBW {
		b.WriteString("BW ")
	} else {
		b.WriteString("Latency ")
	}
	b.WriteString("Test\n")
	fmt.Fprintf(&b, " Dual-port       : OFF\t\tDevice         : %s\n", o.devName)
	fmt.Fprintf(&b, " Number of qps   : %d\t\tTransport type : IW\n", o.qps)
	b.WriteString(" Connection type : RC\t\tUsing SRQ      : OFF\n")
	b.WriteString(" PCIe relax order: ON\n")
	b.WriteString(" ibv_wr* API     : OFF\n")
	if o.client() {
		fmt.Fprintf(&b, " TX depth        : %d\n", o.txDepth)
	}
	if o.verb == perfSend && !o.client() {
		fmt.Fprintf(&b, " RX depth        : %d\n", o.rxDepth)
	}
	if o.test == PerfBW {
		fmt.Fprintf(&b, " CQ Moderation   : %d\n", o.cqMod)
	}
	fmt.Fprintf(&b, " Mtu             : %d[B]\n", perfMTU)
	b.WriteString(" Link type       : Ethernet\n")
	b.WriteString(" GID index       : 0\n")
	if !o.oneSided() {
		fmt.Fprintf(&b, " Max inline data : %d[B]\n", o.inline)
	} else {
		fmt.Fprintf(&b, " Outstand reads  : %d\n", o.outs)
	}
	b.WriteString(" rdma_cm QPs\t : ON\n")
	b.WriteString(" Data ex. method : rdma_cm")
	if !o.client() {
		b.WriteString("\n" + perfResultLine)
		b.WriteString(" Waiting for client rdma_cm QP to connect\n")
		b.WriteString(" Please run the same command with the IB/RoCE interface IP")
	}
	b.WriteString("\n" + perfResultLine)
	io.WriteString(w, b.String())
}

// printDest prints ctx_print_pingpong_data for the rdma_cm exchange
// (whose verb is SEND, so no RKey/VAddr), with the GID line.
func printDest(w io.Writer, side string, d perfDest) {
	fmt.Fprintf(w, " %s address: LID %s QPN %s PSN %s\n", side, cHex(uint64(d.LID), 4), cHex(uint64(d.QPN), 6), cHex(uint64(d.PSN), 6))
	g := d.GID
	fmt.Fprintf(w, " GID: %02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d\n",
		g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11], g[12], g[13], g[14], g[15])
}

// perfBWReport is struct bw_report_data (the fields that cross the wire).
type perfBWReport struct {
	Size    uint64  `json:"MsgSize"`
	Iters   uint64  `json:"n_iterations"`
	Peak    float64 `json:"BW_peak"`
	Avg     float64 `json:"BW_average"`
	MsgRate float64 `json:"MsgRate"`
	// Not on the wire: for the JSON report and tests.
	Bytes   uint64  `json:"bytes"`
	Seconds float64 `json:"seconds"`
}

func (o *perfOpts) bwHeader() string {
	if o.gbits {
		return perfResultFmtG + "\n"
	}
	return perfResultFmt + "\n"
}

func (o *perfOpts) bwRow(r perfBWReport) string {
	if o.gbits && r.Avg < 0.1 {
		return fmt.Sprintf(perfReportExt, r.Size, r.Iters, r.Peak, r.Avg, r.MsgRate)
	}
	return fmt.Sprintf(perfReportFmt, r.Size, r.Iters, r.Peak, r.Avg, r.MsgRate)
}

// perfLatReport is print_report_lat's result.
type perfLatReport struct {
	Size     uint64  `json:"MsgSize"`
	Iters    uint64  `json:"n_iterations"`
	Min      float64 `json:"t_min,omitempty"`
	Max      float64 `json:"t_max,omitempty"`
	Typical  float64 `json:"t_typical,omitempty"`
	Avg      float64 `json:"t_avg"`
	Stdev    float64 `json:"t_stdev,omitempty"`
	P99      float64 `json:"percentile_99,omitempty"`
	P999     float64 `json:"percentile_99.9,omitempty"`
	TPS      float64 `json:"tps_average,omitempty"`
	Duration bool    `json:"-"`
}

func (o *perfOpts) latHeader() string {
	if o.dur > 0 {
		return perfResultLatD + "\n"
	}
	return perfResultLat + "\n"
}

func latRow(r perfLatReport) string {
	if r.Duration {
		return fmt.Sprintf(perfReportLatD, r.Size, r.Iters, r.Avg, r.TPS)
	}
	return fmt.Sprintf(perfReportLat, r.Size, r.Iters, r.Min, r.Max, r.Typical, r.Avg, r.Stdev, r.P99, r.P999)
}

// perfJSON is the -j document: perftest's --out_json test_info and
// results, as real JSON.
type perfJSON struct {
	TestInfo map[string]any `json:"test_info"`
	Results  any            `json:"results"`
}

func (o *perfOpts) testInfo() map[string]any {
	kind := "BW"
	if o.test == PerfLat {
		kind = "Latency"
	}
	test := perfVerbStr[o.verb] + "_"
	if o.verb == perfAtomic {
		// perftest names the operation in the test: Atomic_FETCH_AND_ADD_BW_Test.
		test += perfAtomicStr[o.atomic] + "_"
	}
	m := map[string]any{
		"test":            test + kind + "_Test",
		"Dual_port":       "OFF",
		"Device":          o.devName,
		"Number_of_qps":   o.qps,
		"Transport_type":  "IW",
		"Connection_type": "RC",
		"Using_SRQ":       "OFF",
		"Mtu":             perfMTU,
		"Link_type":       "Ethernet",
		"GID_index":       0,
		"rdma_cm_QPs":     "ON",
		"Data_ex_method":  "rdma_cm",
		"side":            map[bool]string{true: "client", false: "server"}[o.client()],
	}
	if o.client() {
		m["TX_depth"] = o.txDepth
	}
	if o.verb == perfSend && !o.client() {
		m["RX_depth"] = o.rxDepth
	}
	if o.test == PerfBW {
		m["CQ_Moderation"] = o.cqMod
	}
	if o.oneSided() {
		m["Outstand_reads"] = o.outs
	} else {
		m["Max_inline_data"] = o.inline
	}
	if o.dur > 0 {
		m["Duration"] = o.dur.Seconds()
	}
	return m
}

// progressLine shows how far a long run is (a TTY only).
type progressLine struct {
	w    io.Writer
	last time.Time
	used bool
}

func (p *progressLine) show(format string, a ...any) {
	if p == nil || p.w == nil {
		return
	}
	now := time.Now()
	if now.Sub(p.last) < 200*time.Millisecond {
		return
	}
	p.last = now
	p.used = true
	fmt.Fprintf(p.w, "\r\033[K"+format, a...)
}

func (p *progressLine) done() {
	if p != nil && p.w != nil && p.used {
		fmt.Fprint(p.w, "\r\033[K")
		p.used = false
	}
}

// RunPerf runs one side of a bw or lat test on dev.
func RunPerf(ctx context.Context, dev *verbs.Device, o perfOpts, stdout io.Writer) error {
	if o.devName == "" {
		o.devName = dev.Name()
	}
	if o.oneSided() && o.outs == -1 {
		o.outs = min(dev.Query().MaxQPInitRd, 128)
	}
	if o.outs == -1 {
		o.outs = 0
	}
	if err := checkPlotFile(o.plot); err != nil {
		return err
	}
	human := stdout
	if o.json {
		human = io.Discard
	}
	s, err := perfSetup(ctx, dev, &o, human)
	if err != nil {
		return err
	}
	defer s.close()
	if o.json {
		s.jsonOut = stdout
	}
	before := dev.Stats().TCP
	if o.test == PerfBW {
		err = s.runBW(ctx, human)
	} else {
		err = s.runLat(ctx, human)
	}
	if err == nil {
		fmt.Fprintln(human, cli.TCPReport(before, dev.Stats().TCP))
	}
	return err
}

// plotSweep draws the client's sweep into --plot's file (no flag: nothing).
func (s *perfSession) plotSweep(bw []perfBWReport, lat []perfLatReport) error {
	o := s.o
	if o.plot == "" || !o.client() {
		return nil
	}
	pi := o.plotInfo(time.Now())
	var svg []byte
	var err error
	if o.test == PerfBW {
		svg, err = plotBW(pi, bw)
	} else {
		svg, err = plotLat(pi, lat)
	}
	if err != nil {
		return err
	}
	return writePlot(o.plot, svg)
}

// isTTY reports whether f is a terminal.
func isTTY(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
