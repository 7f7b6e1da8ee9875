package perftest

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
	"github.com/rdmatap/rdmatap/internal/units"
	"github.com/rdmatap/rdmatap/verbs"
)

// The flags of rdmatap bw and lat: perftest's (perftest_parameters.c),
// the same for both tests, parsed into perfOpts with perftest's defaults
// and its force_dependecies rules.

const perfSummaryFmt = "usage: rdmatap %s write|read|send|atomic [flags] [SERVER]\n" +
	"Server: rdmatap %[1]s VERB [flags]; client: the same with the server's address.\n" +
	"As perftest: the SAME flags must be given to both sides. Connections are\n" +
	"always rdma_cm-style (perftest -R); -F and -R are accepted. The endpoint\n" +
	"flags (--tap, --addr, ...) make this process's TAP endpoint. It runs on\n" +
	"one P (one thread of Go code, as perftest is one thread) unless GOMAXPROCS\n" +
	"is set.\n"

// perfFlags are the values of the flags that setDefaults turns into
// perfOpts. A negative number is a flag not given.
type perfFlags struct {
	size, iters, dur, margin, qps, port, tx, rx, cqmod, inline, outs int
	all, gbits, noPeak                                               bool
	cpuFreq, rdmaCM                                                  bool // accepted, no effect
	bind, atomicType                                                 string
}

// ParsePerfFlags parses "VERB [flags] [SERVER] [flags]".
func ParsePerfFlags(test PerfTestKind, args []string, stderr io.Writer) (perfOpts, *cli.EndpointFlags, error) {
	name := map[PerfTestKind]string{PerfBW: "bw", PerfLat: "lat"}[test]
	o := perfOpts{test: test, allMax: perfMaxSize}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	ef := new(cli.EndpointFlags)
	ef.Register(fs)
	var v perfFlags
	v.registerRun(fs)
	v.registerQueues(fs)
	v.registerOutput(fs, &o)
	v.registerConn(fs, &o)
	pos, err := parsePerfArgs(fs, args, stderr)
	if err != nil {
		return o, nil, err
	}
	if o.verb, err = parsePerfVerb(pos, name); err != nil {
		return o, nil, err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if test == PerfLat {
		o.latEndpoint(ef, given)
	}
	if err := o.checkVerbFlags(given, name); err != nil {
		return o, nil, err
	}
	if o.atomic, err = parseAtomicType(v.atomicType); err != nil {
		return o, nil, err
	}
	if err := o.parseAddrs(pos, v.bind); err != nil {
		return o, nil, err
	}
	if err := o.setDefaults(v); err != nil {
		return o, nil, err
	}
	if err := o.checkPlotFlag(); err != nil {
		return o, nil, err
	}
	return o, ef, nil
}

// intFlag defines an int flag under its short name and, if any, its long.
func intFlag(fs *flag.FlagSet, p *int, short, long string, def int, usage string) {
	fs.IntVar(p, short, def, usage)
	if long != "" {
		fs.IntVar(p, long, def, usage)
	}
}

// boolFlag defines a bool flag under its short and long names (either may
// be empty).
func boolFlag(fs *flag.FlagSet, p *bool, short, long string, usage string) {
	if short != "" {
		fs.BoolVar(p, short, false, usage)
	}
	if long != "" {
		fs.BoolVar(p, long, false, usage)
	}
}

// registerRun defines what is measured: size, count or duration, sweep.
func (v *perfFlags) registerRun(fs *flag.FlagSet) {
	v.size = -1
	fs.Var(units.Int{P: &v.size, Max: 1 << 32}, "s", "message size (default 65536 for bw, 2 for lat; K, M, G suffixes)")
	fs.Var(units.Int{P: &v.size, Max: 1 << 32}, "size", "message size (default 65536 for bw, 2 for lat; K, M, G suffixes)")
	intFlag(fs, &v.iters, "n", "iters", -1, "number of exchanges (default 5000 for write bw, 1000 otherwise)")
	intFlag(fs, &v.dur, "D", "duration", 0, "run for this many seconds (duration mode)")
	intFlag(fs, &v.margin, "f", "margin", -1, "duration mode: measure within these margins (default duration/4)")
	boolFlag(fs, &v.all, "a", "all", "run sizes from 2 to 2^23")
}

// registerQueues defines the QPs, their queues and their work requests.
func (v *perfFlags) registerQueues(fs *flag.FlagSet) {
	intFlag(fs, &v.qps, "q", "qp", 1, "number of QPs (bw)")
	intFlag(fs, &v.tx, "t", "tx-depth", -1, "size of the send queue (default 128 bw, 1 lat)")
	intFlag(fs, &v.rx, "r", "rx-depth", -1, "receive queue depth (send tests, default 512)")
	intFlag(fs, &v.cqmod, "Q", "cq-mod", -1, "generate a completion every N sends (default 100)")
	intFlag(fs, &v.inline, "I", "inline_size", -1, "max size of inline messages (default 0)")
	intFlag(fs, &v.outs, "o", "outs", -1, "outstanding reads or atomics (read and atomic tests, default the device's max)")
	fs.StringVar(&v.atomicType, "A", "FETCH_AND_ADD", "atomic tests: FETCH_AND_ADD or CMP_AND_SWAP")
	fs.StringVar(&v.atomicType, "atomic_type", "FETCH_AND_ADD", "atomic tests: FETCH_AND_ADD or CMP_AND_SWAP")
}

// registerOutput defines what is reported and checked.
func (v *perfFlags) registerOutput(fs *flag.FlagSet, o *perfOpts) {
	boolFlag(fs, &v.gbits, "", "report_gbits", "report Gb/sec instead of MB/sec")
	boolFlag(fs, &v.noPeak, "N", "noPeak", "do not compute peak bandwidth")
	boolFlag(fs, &o.json, "j", "json", "print the results as JSON (perftest --out_json keys)")
	boolFlag(fs, &o.verify, "", "verify", "check every byte that arrives")
	fs.StringVar(&o.devName, "d", "", "RDMA device name shown in the banner (default the endpoint's)")
	fs.StringVar(&o.plot, "plot", "", "client, with -a: draw message size against bandwidth or latency (log axes) into this SVG `file`")
}

// registerConn defines the connection's flags.
func (v *perfFlags) registerConn(fs *flag.FlagSet, o *perfOpts) {
	intFlag(fs, &v.port, "p", "port", perfDefPort, "port of the parameter exchange and the rdma_cm listener")
	boolFlag(fs, &v.cpuFreq, "F", "CPU-freq", "accepted: no CPU frequency warning")
	boolFlag(fs, &v.rdmaCM, "R", "rdma_cm", "accepted: rdmatap always connects through rdma_cm (perftest -R)")
	fs.StringVar(&v.bind, "bind", "", "server: address to listen on (default any)")
	fs.DurationVar(&o.Timeout, "timeout", 20*time.Second, "give up on a peer that does not answer for this long")
}

// parsePerfArgs parses flags that may stand before, between and after
// the positional arguments, and returns those. -h prints the usage.
func parsePerfArgs(fs *flag.FlagSet, args []string, stderr io.Writer) ([]string, error) {
	var pos []string
	rest := args
	for {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprintf(stderr, perfSummaryFmt, fs.Name())
				fs.SetOutput(stderr)
				fs.PrintDefaults()
				return nil, err
			}
			return nil, fmt.Errorf("%w: %v", cli.ErrUsage, err)
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
}

// parsePerfVerb reads the verb, the first positional argument.
func parsePerfVerb(pos []string, name string) (perfVerb, error) {
	if len(pos) == 0 {
		return 0, fmt.Errorf("%w: missing verb: rdmatap %s write|read|send|atomic [flags] [SERVER]", cli.ErrUsage, name)
	}
	switch pos[0] {
	case "write":
		return perfWrite, nil
	case "read":
		return perfRead, nil
	case "send":
		return perfSend, nil
	case "atomic":
		return perfAtomic, nil
	}
	return 0, fmt.Errorf("%w: unknown verb %q (want write, read, send or atomic)", cli.ErrUsage, pos[0])
}

// latEndpoint applies the latency tests' endpoint defaults to a TAP
// endpoint of their own (not --via): the TAP busy-polls, the waiting
// poster spins beside it, and short messages are placed as they arrive.
func (o *perfOpts) latEndpoint(ef *cli.EndpointFlags, given map[string]bool) {
	if !given["busy-poll"] && ef.Via == "" && !ef.NoOffload {
		ef.BusyPoll = cli.LatBusyPoll
	}
	if ef.Via == "" {
		o.waitSpin = min(ef.BusyPoll, verbs.MaxWaitSpin)
	}
	if !given["placement"] && ef.Via == "" {
		// The connection tap feeds a short message to the poster that
		// waits for it as its segment arrives, ahead of TCP's goroutine
		// (2-byte lat write over bridged TAPs: 5.8 µs one way against
		// 8.4 µs with stream placement).
		ef.Lab.Placement = cli.LatPlacement
	}
}

// checkVerbFlags refuses, as perftest does (perftest_parameters.c), what
// the test cannot use: -A outside the atomic tests, -I on Reads and
// atomics (no inline data), -o outside Reads and atomics.
func (o *perfOpts) checkVerbFlags(given map[string]bool, name string) error {
	switch {
	case (given["A"] || given["atomic_type"]) && o.verb != perfAtomic:
		return fmt.Errorf("%w: -A: not an atomic test (the atomic operation is for rdmatap %s atomic)", cli.ErrUsage, name)
	case (given["I"] || given["inline_size"]) && (o.verb == perfRead || o.verb == perfAtomic):
		return fmt.Errorf("%w: -I: Reads and atomics carry no inline data", cli.ErrUsage)
	case (given["o"] || given["outs"]) && o.verb != perfRead && o.verb != perfAtomic:
		return fmt.Errorf("%w: -o: outstanding requests are for read and atomic tests", cli.ErrUsage)
	}
	return nil
}

// parseAtomicType reads -A.
func parseAtomicType(s string) (perfAtomicType, error) {
	switch s {
	case "FETCH_AND_ADD":
		return perfFetchAdd, nil
	case "CMP_AND_SWAP":
		return perfCmpSwap, nil
	}
	return 0, fmt.Errorf("%w: -A %q (want FETCH_AND_ADD or CMP_AND_SWAP)", cli.ErrUsage, s)
}

// parseAddrs reads the server's address (the positional argument after
// the verb: we are the client) and --bind.
func (o *perfOpts) parseAddrs(pos []string, bind string) error {
	if len(pos) > 2 {
		return fmt.Errorf("%w: unexpected argument %q", cli.ErrUsage, pos[2])
	}
	if len(pos) == 2 {
		a, err := netip.ParseAddr(pos[1])
		if err != nil || a.Zone() != "" || a.IsUnspecified() {
			return fmt.Errorf("%w: server %q is not an IP address (host names are not resolved)", cli.ErrUsage, pos[1])
		}
		o.server = a.Unmap()
	}
	if bind != "" {
		a, err := netip.ParseAddr(bind)
		if err != nil {
			return fmt.Errorf("%w: --bind %q is not an IP address", cli.ErrUsage, bind)
		}
		o.bind = a.Unmap()
	}
	return nil
}

// perfUsage is a usage error.
func perfUsage(f string, a ...any) error {
	return fmt.Errorf("%w: "+f, append([]any{cli.ErrUsage}, a...)...)
}

// setDefaults validates the flags and applies perftest's defaults and
// force_dependecies rules, a step for each concern.
func (o *perfOpts) setDefaults(v perfFlags) error {
	if v.port < 1 || v.port > 65535 {
		return perfUsage("invalid port %d (valid range is 1 to 65535)", v.port)
	}
	o.port = uint16(v.port)
	o.gbits, o.noPeak, o.all = v.gbits, v.noPeak, v.all
	for _, step := range []func(perfFlags) error{o.setSize, o.setIters, o.setDuration, o.setQPs, o.setDepths, o.setCQMod, o.setInlineOuts} {
		if err := step(v); err != nil {
			return err
		}
	}
	if v.all {
		o.size = perfMaxSize
	}
	if o.dur == 0 && o.iters > perfNoPeakIters && o.test == PerfBW {
		o.noPeak = true
	}
	if o.Timeout <= 0 {
		return perfUsage("--timeout must be positive")
	}
	return nil
}

// setSize applies -s: perftest's default of the test; atomics move their
// 8-byte word.
func (o *perfOpts) setSize(v perfFlags) error {
	size := v.size
	if o.verb == perfAtomic {
		if size != -1 && size != perfAtomicSize {
			return perfUsage("-s %d: atomic tests move 8 bytes", size)
		}
		if v.all {
			return perfUsage("-a: atomic tests have one size (8 bytes)")
		}
		size = perfAtomicSize
	}
	switch {
	case size == -1 && o.test == PerfBW:
		o.size = perfDefSizeBW
	case size == -1:
		o.size = perfDefSizeLat
	case size < 1 || size > 1<<31-1:
		return perfUsage("-s %d: message size must be 1 to 2^31-1", size)
	default:
		o.size = size
	}
	return nil
}

// setIters applies -n.
func (o *perfOpts) setIters(v perfFlags) error {
	switch {
	case v.iters == -1 && o.test == PerfBW && o.verb == perfWrite:
		o.iters = perfDefItersWB
	case v.iters == -1:
		o.iters = perfDefIters
	case v.iters < perfMinIter:
		return perfUsage("-n %d: iterations must be at least %d", v.iters, perfMinIter)
	default:
		o.iters = v.iters
	}
	return nil
}

// setDuration applies -D and its margin -f; a timed run has no peak.
func (o *perfOpts) setDuration(v perfFlags) error {
	if v.dur < 0 {
		return perfUsage("-D %d: duration must be positive", v.dur)
	}
	if v.dur == 0 {
		if v.margin != -1 {
			return perfUsage("-f needs -D")
		}
		return nil
	}
	o.dur = time.Duration(v.dur) * time.Second
	if v.iters != -1 {
		return perfUsage("-n and -D exclude each other")
	}
	if v.margin == -1 {
		o.margin = o.dur / 4
	} else {
		o.margin = time.Duration(v.margin) * time.Second
	}
	if !(o.dur > 2*o.margin) {
		return perfUsage("please check that DURATION > 2*MARGIN")
	}
	if v.all {
		return perfUsage("-a and -D exclude each other")
	}
	o.noPeak = true
	return nil
}

// setQPs applies -q.
func (o *perfOpts) setQPs(v perfFlags) error {
	if v.qps < 1 || v.qps > 1024 {
		return perfUsage("-q %d: number of QPs must be 1 to 1024", v.qps)
	}
	if o.test == PerfLat && v.qps != 1 {
		return perfUsage("-q: latency tests use one QP")
	}
	o.qps = v.qps
	return nil
}

// setDepths applies -t and -r: the defaults of the test and the verb, no
// deeper than the iterations.
func (o *perfOpts) setDepths(v perfFlags) error {
	tx, rx := v.tx, v.rx
	if tx == -1 {
		tx = perfDefTxBW
		if o.test == PerfLat {
			tx = perfDefTxLat
		}
	}
	if tx < 1 || tx > 1<<15 {
		return perfUsage("-t %d: TX depth must be 1 to 32768", tx)
	}
	if rx == -1 {
		rx = perfDefRxSend
		if o.verb != perfSend {
			rx = 1
		}
	}
	if rx < 1 || rx > 1<<15 {
		return perfUsage("-r %d: RX depth must be 1 to 32768", rx)
	}
	if o.dur == 0 {
		tx = min(tx, o.iters)
		if o.verb == perfSend {
			rx = min(rx, o.iters)
		}
	}
	if o.verb == perfSend && o.test == PerfBW && rx%2 == 1 && !v.all {
		rx++ // perftest's "WA for a bug when rx_depth is odd in SEND"
	}
	o.txDepth, o.rxDepth = tx, rx
	return nil
}

// setCQMod applies -Q: off above perftest's size limit unless given, no
// more than the TX depth, and for send bw no more than the credit step.
func (o *perfOpts) setCQMod(v perfFlags) error {
	cqmod := v.cqmod
	reqMod := cqmod != -1
	if cqmod == -1 {
		cqmod = perfDefCQMod
	}
	if cqmod < 1 {
		return perfUsage("-Q %d: CQ moderation must be positive", cqmod)
	}
	if o.size > perfCQModLimit && !v.all && !reqMod {
		cqmod = 1
	}
	o.cqMod = min(cqmod, o.txDepth)
	if o.verb == perfSend && o.test == PerfBW {
		// The receiver answers with a credit every rx_depth/3 receives.
		o.cqMod = min(o.cqMod, max(1, o.rxDepth/3))
	}
	return nil
}

// setInlineOuts applies -I (none on Reads and atomics) and -o.
func (o *perfOpts) setInlineOuts(v perfFlags) error {
	inline := v.inline
	if inline == -1 || o.oneSided() {
		inline = 0
	}
	if inline < 0 || inline > 4096 {
		return perfUsage("-I %d: inline size must be 0 to 4096", inline)
	}
	o.inline = inline
	if o.oneSided() && v.outs != -1 && (v.outs < 1 || v.outs > 128) {
		return perfUsage("-o %d: outstanding reads or atomics must be 1 to 128", v.outs)
	}
	o.outs = v.outs
	return nil
}
