// Package perftest is `rdmatap bw` and `rdmatap lat`: perftest-compatible
// bandwidth and latency tests (the flags and output of ib_*_bw and
// ib_*_lat with -R), with their --plot SVGs.
package perftest

import (
	"context"
	"errors"
	"flag"
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
	"github.com/rdmatap/rdmatap/internal/units"
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

const perfSummaryFmt = "usage: rdmatap %s write|read|send|atomic [flags] [SERVER]\n" +
	"Server: rdmatap %[1]s VERB [flags]; client: the same with the server's address.\n" +
	"As perftest: the SAME flags must be given to both sides. Connections are\n" +
	"always rdma_cm-style (perftest -R); -F and -R are accepted. The endpoint\n" +
	"flags (--tap, --addr, ...) make this process's TAP endpoint. It runs on\n" +
	"one P (one thread of Go code, as perftest is one thread) unless GOMAXPROCS\n" +
	"is set.\n"

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

// ParsePerfFlags parses "VERB [flags] [SERVER] [flags]".
func ParsePerfFlags(test PerfTestKind, args []string, stderr io.Writer) (perfOpts, *cli.EndpointFlags, error) {
	name := map[PerfTestKind]string{PerfBW: "bw", PerfLat: "lat"}[test]
	o := perfOpts{test: test, allMax: perfMaxSize}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	ef := new(cli.EndpointFlags)
	ef.Register(fs)
	var (
		size, iters, dur, margin, qps, port, tx, rx, cqmod, inline, outs int
		all, gbits, cpuFreq, rdmaCM, noPeak                              bool
		bind, atomicType                                                 string
	)
	intVar := func(p *int, short, long string, def int, usage string) {
		fs.IntVar(p, short, def, usage)
		if long != "" {
			fs.IntVar(p, long, def, usage)
		}
	}
	boolVar := func(p *bool, short, long string, usage string) {
		if short != "" {
			fs.BoolVar(p, short, false, usage)
		}
		if long != "" {
			fs.BoolVar(p, long, false, usage)
		}
	}
	size = -1
	fs.Var(units.Int{P: &size, Max: 1 << 32}, "s", "message size (default 65536 for bw, 2 for lat; K, M, G suffixes)")
	fs.Var(units.Int{P: &size, Max: 1 << 32}, "size", "message size (default 65536 for bw, 2 for lat; K, M, G suffixes)")
	intVar(&iters, "n", "iters", -1, "number of exchanges (default 5000 for write bw, 1000 otherwise)")
	intVar(&dur, "D", "duration", 0, "run for this many seconds (duration mode)")
	intVar(&margin, "f", "margin", -1, "duration mode: measure within these margins (default duration/4)")
	intVar(&qps, "q", "qp", 1, "number of QPs (bw)")
	intVar(&port, "p", "port", perfDefPort, "port of the parameter exchange and the rdma_cm listener")
	intVar(&tx, "t", "tx-depth", -1, "size of the send queue (default 128 bw, 1 lat)")
	intVar(&rx, "r", "rx-depth", -1, "receive queue depth (send tests, default 512)")
	intVar(&cqmod, "Q", "cq-mod", -1, "generate a completion every N sends (default 100)")
	intVar(&inline, "I", "inline_size", -1, "max size of inline messages (default 0)")
	intVar(&outs, "o", "outs", -1, "outstanding reads or atomics (read and atomic tests, default the device's max)")
	fs.StringVar(&atomicType, "A", "FETCH_AND_ADD", "atomic tests: FETCH_AND_ADD or CMP_AND_SWAP")
	fs.StringVar(&atomicType, "atomic_type", "FETCH_AND_ADD", "atomic tests: FETCH_AND_ADD or CMP_AND_SWAP")
	boolVar(&all, "a", "all", "run sizes from 2 to 2^23")
	boolVar(&gbits, "", "report_gbits", "report Gb/sec instead of MB/sec")
	boolVar(&cpuFreq, "F", "CPU-freq", "accepted: no CPU frequency warning")
	boolVar(&rdmaCM, "R", "rdma_cm", "accepted: rdmatap always connects through rdma_cm (perftest -R)")
	boolVar(&noPeak, "N", "noPeak", "do not compute peak bandwidth")
	boolVar(&o.json, "j", "json", "print the results as JSON (perftest --out_json keys)")
	boolVar(&o.verify, "", "verify", "check every byte that arrives")
	fs.StringVar(&o.devName, "d", "", "RDMA device name shown in the banner (default the endpoint's)")
	fs.StringVar(&bind, "bind", "", "server: address to listen on (default any)")
	fs.DurationVar(&o.Timeout, "timeout", 20*time.Second, "give up on a peer that does not answer for this long")
	fs.StringVar(&o.plot, "plot", "", "client, with -a: draw message size against bandwidth or latency (log axes) into this SVG `file`")

	var pos []string
	rest := args
	for {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprintf(stderr, perfSummaryFmt, name)
				fs.SetOutput(stderr)
				fs.PrintDefaults()
				return o, nil, err
			}
			return o, nil, fmt.Errorf("%w: %v", cli.ErrUsage, err)
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if len(pos) == 0 {
		return o, nil, fmt.Errorf("%w: missing verb: rdmatap %s write|read|send|atomic [flags] [SERVER]", cli.ErrUsage, name)
	}
	switch pos[0] {
	case "write":
		o.verb = perfWrite
	case "read":
		o.verb = perfRead
	case "send":
		o.verb = perfSend
	case "atomic":
		o.verb = perfAtomic
	default:
		return o, nil, fmt.Errorf("%w: unknown verb %q (want write, read, send or atomic)", cli.ErrUsage, pos[0])
	}
	// perftest refuses what a test cannot use (perftest_parameters.c):
	// -A outside the atomic tests, -I on Reads and atomics (no inline
	// data), -o outside Reads and atomics.
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if test == PerfLat && !given["busy-poll"] && ef.Via == "" && !ef.NoOffload {
		ef.BusyPoll = cli.LatBusyPoll
	}
	if test == PerfLat && ef.Via == "" {
		o.waitSpin = min(ef.BusyPoll, verbs.MaxWaitSpin)
	}
	if test == PerfLat && !given["placement"] && ef.Via == "" {
		// The connection tap feeds a short message to the poster that
		// waits for it as its segment arrives, ahead of TCP's goroutine
		// (2-byte lat write over bridged TAPs: 5.8 µs one way against
		// 8.4 µs with stream placement).
		ef.Lab.Placement = cli.LatPlacement
	}
	switch {
	case (given["A"] || given["atomic_type"]) && o.verb != perfAtomic:
		return o, nil, fmt.Errorf("%w: -A: not an atomic test (the atomic operation is for rdmatap %s atomic)", cli.ErrUsage, name)
	case (given["I"] || given["inline_size"]) && (o.verb == perfRead || o.verb == perfAtomic):
		return o, nil, fmt.Errorf("%w: -I: Reads and atomics carry no inline data", cli.ErrUsage)
	case (given["o"] || given["outs"]) && o.verb != perfRead && o.verb != perfAtomic:
		return o, nil, fmt.Errorf("%w: -o: outstanding requests are for read and atomic tests", cli.ErrUsage)
	}
	switch atomicType {
	case "FETCH_AND_ADD":
		o.atomic = perfFetchAdd
	case "CMP_AND_SWAP":
		o.atomic = perfCmpSwap
	default:
		return o, nil, fmt.Errorf("%w: -A %q (want FETCH_AND_ADD or CMP_AND_SWAP)", cli.ErrUsage, atomicType)
	}
	if len(pos) > 2 {
		return o, nil, fmt.Errorf("%w: unexpected argument %q", cli.ErrUsage, pos[2])
	}
	if len(pos) == 2 {
		a, err := netip.ParseAddr(pos[1])
		if err != nil || a.Zone() != "" || a.IsUnspecified() {
			return o, nil, fmt.Errorf("%w: server %q is not an IP address (host names are not resolved)", cli.ErrUsage, pos[1])
		}
		o.server = a.Unmap()
	}
	if bind != "" {
		a, err := netip.ParseAddr(bind)
		if err != nil {
			return o, nil, fmt.Errorf("%w: --bind %q is not an IP address", cli.ErrUsage, bind)
		}
		o.bind = a.Unmap()
	}
	_ = cpuFreq
	_ = rdmaCM
	if err := o.setDefaults(size, iters, dur, margin, qps, port, tx, rx, cqmod, inline, outs, all, gbits, noPeak); err != nil {
		return o, nil, err
	}
	if err := o.checkPlotFlag(); err != nil {
		return o, nil, err
	}
	return o, ef, nil
}

// setDefaults validates the flags and applies perftest's defaults and
// force_dependecies rules. Negative values mean "not given".
func (o *perfOpts) setDefaults(size, iters, dur, margin, qps, port, tx, rx, cqmod, inline, outs int, all, gbits, noPeak bool) error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: "+f, append([]any{cli.ErrUsage}, a...)...) }
	if port < 1 || port > 65535 {
		return bad("invalid port %d (valid range is 1 to 65535)", port)
	}
	o.port = uint16(port)
	o.gbits, o.noPeak, o.all = gbits, noPeak, all
	if o.verb == perfAtomic {
		// ib_atomic_*: the message is the 8-byte word.
		if size != -1 && size != perfAtomicSize {
			return bad("-s %d: atomic tests move 8 bytes", size)
		}
		if all {
			return bad("-a: atomic tests have one size (8 bytes)")
		}
		size = perfAtomicSize
	}
	switch {
	case size == -1 && o.test == PerfBW:
		o.size = perfDefSizeBW
	case size == -1:
		o.size = perfDefSizeLat
	case size < 1 || size > 1<<31-1:
		return bad("-s %d: message size must be 1 to 2^31-1", size)
	default:
		o.size = size
	}
	switch {
	case iters == -1 && o.test == PerfBW && o.verb == perfWrite:
		o.iters = perfDefItersWB
	case iters == -1:
		o.iters = perfDefIters
	case iters < perfMinIter:
		return bad("-n %d: iterations must be at least %d", iters, perfMinIter)
	default:
		o.iters = iters
	}
	if dur < 0 {
		return bad("-D %d: duration must be positive", dur)
	}
	if dur > 0 {
		o.dur = time.Duration(dur) * time.Second
		if iters != -1 {
			return bad("-n and -D exclude each other")
		}
		if margin == -1 {
			o.margin = o.dur / 4
		} else {
			o.margin = time.Duration(margin) * time.Second
		}
		if !(o.dur > 2*o.margin) {
			return bad("please check that DURATION > 2*MARGIN")
		}
		if all {
			return bad("-a and -D exclude each other")
		}
		o.noPeak = true
	} else if margin != -1 {
		return bad("-f needs -D")
	}
	if qps < 1 || qps > 1024 {
		return bad("-q %d: number of QPs must be 1 to 1024", qps)
	}
	if o.test == PerfLat && qps != 1 {
		return bad("-q: latency tests use one QP")
	}
	o.qps = qps
	if tx == -1 {
		tx = perfDefTxBW
		if o.test == PerfLat {
			tx = perfDefTxLat
		}
	}
	if tx < 1 || tx > 1<<15 {
		return bad("-t %d: TX depth must be 1 to 32768", tx)
	}
	if rx == -1 {
		rx = perfDefRxSend
		if o.verb != perfSend {
			rx = 1
		}
	}
	if rx < 1 || rx > 1<<15 {
		return bad("-r %d: RX depth must be 1 to 32768", rx)
	}
	if o.dur == 0 {
		tx = min(tx, o.iters)
		if o.verb == perfSend {
			rx = min(rx, o.iters)
		}
	}
	if o.verb == perfSend && o.test == PerfBW && rx%2 == 1 && !all {
		rx++ // perftest's "WA for a bug when rx_depth is odd in SEND"
	}
	o.txDepth, o.rxDepth = tx, rx
	reqMod := cqmod != -1
	if cqmod == -1 {
		cqmod = perfDefCQMod
	}
	if cqmod < 1 {
		return bad("-Q %d: CQ moderation must be positive", cqmod)
	}
	if o.size > perfCQModLimit && !all && !reqMod {
		cqmod = 1
	}
	o.cqMod = min(cqmod, o.txDepth)
	if o.verb == perfSend && o.test == PerfBW {
		// The receiver answers with a credit every rx_depth/3 receives.
		o.cqMod = min(o.cqMod, max(1, o.rxDepth/3))
	}
	if inline == -1 || o.oneSided() {
		inline = 0
	}
	if inline < 0 || inline > 4096 {
		return bad("-I %d: inline size must be 0 to 4096", inline)
	}
	o.inline = inline
	if o.oneSided() && outs != -1 && (outs < 1 || outs > 128) {
		return bad("-o %d: outstanding reads or atomics must be 1 to 128", outs)
	}
	o.outs = outs
	if all {
		o.size = perfMaxSize
	}
	if o.dur == 0 && o.iters > perfNoPeakIters && o.test == PerfBW {
		o.noPeak = true
	}
	if o.Timeout <= 0 {
		return bad("--timeout must be positive")
	}
	return nil
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
