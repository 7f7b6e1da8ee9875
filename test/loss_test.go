package test

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The loss lab: rdmatap between two processes whose TAPs sit on a bridge,
// and kernel TCP between two network namespaces over a veth pair, with the
// same nftables rule dropping a random fraction of the packets on both:
// `numgen random mod 10000 < N drop` in a bridge table's forward chain
// (TAPs; IPv4 frames only) or in an inet table's input chain of the
// receiving namespace, or of both (veth). On both paths the rule sees what the sender's TCP sent:
// GSO packets cross the bridge and the veth whole, so a drop takes a whole
// TSO packet (up to 64 KB), as a switch's would on a real link only
// segment by segment.
//
//	sudo go test ./test/ -run XXX -bench LossLab -benchtime 1x
//
// For each loss rate (clean first, as each side's baseline), each
// direction setting (both: every packet either way may be dropped; data:
// only the packets from the data's sender) and each operation (rdmatap bw
// write, read and send with 1 MiB messages; kernel TCP with 1 MiB writes),
// it prints the throughput and its fraction of the same side's clean
// throughput in this run, then the 99th percentile of 64-byte lat write
// and of a kernel TCP 64-byte ping-pong under each rate. bw checks its
// completions and sizes; the netstack and verbs tests verify every byte
// under loss. Environment: RDMATAP_LOSS_SECONDS (per run, default
// 4), RDMATAP_LOSS_RATES (percent, default 0.1,1,2), RDMATAP_LOSS_OPS
// (default write,read,send), RDMATAP_LOSS_DIRS (default both,data),
// RDMATAP_LOSS_EXTRA (more endpoint flags for bw, e.g. --no-offload or
// --no-link-repair), RDMATAP_LOSS_BURST (packets a drop takes in a row,
// default 1: see lossBurst), RDMATAP_LOSS_KERNEL_RTO_MIN (kernel TCP's
// minimum RTO, `ip route ... rto_min`, e.g. 20ms beside --min-rto 20ms;
// default the kernel's 200ms).

// lossRule installs the drop rule in namespace ns: family bridge (forward
// chain) or inet (input chain); iif, when set, limits it to packets that
// came in on that interface. rate is a fraction (0.01 = 1 %); 0 removes
// nothing and adds nothing.
func lossRule(t testing.TB, ns, family, iif string, rate float64) {
	t.Helper()
	if rate <= 0 {
		return
	}
	drop := fmt.Sprintf("numgen random mod 10000 < %d drop", int(rate*10000+0.5))
	if k := lossBurst(t); k > 1 {
		// Bursts of k packets in a row, rate of them in all: the rule's
		// counter drops the last k of every k/rate packets it sees (not
		// the first: those open the connection).
		n := int(float64(k)/rate + 0.5)
		drop = fmt.Sprintf("numgen inc mod %d >= %d drop", n, n-k)
	}
	hook := "input"
	if family == "bridge" {
		hook = "forward"
	}
	// IP only, as the inet family's input chain sees it: a lost ARP
	// reply would stall the endpoints' neighbour resolution, a loss the
	// kernel's side never meets.
	match := ""
	if family == "bridge" {
		match = "ether type ip "
	}
	if iif != "" {
		match += fmt.Sprintf("iifname %q ", iif)
	}
	script := fmt.Sprintf("table %s lossl {\n chain c {\n  type filter hook %s priority 0; policy accept;\n  %s%s\n }\n}\n", family, hook, match, drop)
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft in %s: %v\n%s\n%s", ns, err, out, script)
	}
}

// lossBurst is RDMATAP_LOSS_BURST: how many packets in a row a drop
// takes (1, the default: each packet is dropped by chance on its own;
// more: periodic bursts of that many, at the same rate in all).
func lossBurst(t testing.TB) int {
	v := os.Getenv("RDMATAP_LOSS_BURST")
	if v == "" {
		return 1
	}
	k, err := strconv.Atoi(v)
	if err != nil || k < 1 {
		t.Fatalf("RDMATAP_LOSS_BURST=%q: want a count of packets, 1 or more", v)
	}
	return k
}

func needNft(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("skipping: the nft command (nftables) is missing; .ci/run installs it")
	}
}

func envList(name, def string) []string {
	v := os.Getenv(name)
	if v == "" {
		v = def
	}
	return strings.Split(v, ",")
}

// lossBW runs rdmatap bw op (1 MiB messages, secs seconds) between two
// endpoints on a fresh bridge with the drop rule at rate, and returns MB/s
// (bw's BW average) and the client's tcp line.
func lossBW(b *testing.B, op string, rate float64, dataOnly bool, secs int) (float64, string) {
	n := newNetns(b, 1500)
	iif := ""
	if dataOnly {
		// The data's sender: the client (endpoint 1) for write and send,
		// the server (endpoint 0) for read.
		iif = n.taps[1]
		if op == "read" {
			iif = n.taps[0]
		}
	}
	lossRule(b, n.name, "bridge", iif, rate)
	args := []string{"bw", op, "-s", "1048576", "-D", strconv.Itoa(secs)}
	extra := strings.Fields(os.Getenv("RDMATAP_LOSS_EXTRA"))
	srv := n.start(b, append(append(args, benchEndpointArgs(n, 0)...), extra...)...)
	n.ready(b, 0)
	cl := n.start(b, append(append([]string{"bw", op, n.ips[0], "-s", "1048576", "-D", strconv.Itoa(secs)}, benchEndpointArgs(n, 1)...), extra...)...)
	out, err := cl.wait(b, time.Duration(secs)*time.Second+2*time.Minute)
	if err != nil {
		b.Fatalf("client: %v\n%s\nserver:\n%s", err, out, srv.out.String())
	}
	if _, err := srv.wait(b, time.Minute); err != nil {
		b.Fatalf("server: %v\n%s", err, srv.out.String())
	}
	mbs := -1.0
	var tcp string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 && f[0] == "1048576" {
			mbs, _ = strconv.ParseFloat(f[3], 64)
		}
		if strings.HasPrefix(line, "tcp:") {
			tcp = line
		}
	}
	if mbs < 0 {
		b.Fatalf("no bandwidth in the client's output:\n%s", out)
	}
	// 0: no message completed within the measured part of the run.
	return mbs, tcp
}

// lossKernel moves data over kernel TCP for secs seconds (1 MiB writes)
// between two namespaces joined by a veth pair, the drop rule at rate in
// the receiver's input chain (and, unless dataOnly, the sender's), and
// returns MB/s as the receiver counted it.
func lossKernel(b *testing.B, rate float64, dataOnly bool, secs int) float64 {
	nsA, nsB := vethPair(b, "rdla", "rdlb")
	if v := os.Getenv("RDMATAP_LOSS_KERNEL_RTO_MIN"); v != "" {
		// The kernel's minimum RTO per route, as `--min-rto` sets
		// rdmatap's: the connected route of each side gets rto_min.
		devA, devB := vethDevs()
		for _, side := range []struct{ ns, dev string }{{nsA, devA}, {nsB, devB}} {
			cmd := []string{"ip", "netns", "exec", side.ns, "ip", "route", "replace", "10.89.0.0/24", "dev", side.dev, "rto_min", v}
			if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
				b.Fatalf("%v: %v %s", cmd, err, out)
			}
		}
	}
	lossRule(b, nsB, "inet", "", rate)
	if !dataOnly {
		lossRule(b, nsA, "inet", "", rate)
	}
	out := lossHelper(b, nsA, nsB, "bulk", secs, 0)
	var mbs float64
	if _, err := fmt.Sscanf(out, "mbs=%g", &mbs); err != nil {
		b.Fatalf("kernel TCP receiver said %q", out)
	}
	return mbs
}

// lossHelper runs TestLossTCPHelper's server in nsB and client in nsA and
// returns the line the role that measures printed.
func lossHelper(b *testing.B, nsA, nsB, mode string, secs, iters int) string {
	self, _ := os.Executable()
	env := []string{"RDMATAP_LOSS_MODE=" + mode, "RDMATAP_LOSS_SECONDS=" + strconv.Itoa(secs), "RDMATAP_LOSS_ITERS=" + strconv.Itoa(iters)}
	srv := exec.Command("ip", "netns", "exec", nsB, self, "-test.run", "^TestLossTCPHelper$")
	srv.Env = append(append(os.Environ(), env...), "RDMATAP_LOSS_HELPER=server")
	srvOut, _ := srv.StdoutPipe()
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 4096)
	n, _ := srvOut.Read(buf)
	if n == 0 {
		b.Fatal("TCP helper server did not start")
	}
	buf = buf[:n]
	cl := exec.Command("ip", "netns", "exec", nsA, self, "-test.run", "^TestLossTCPHelper$")
	cl.Env = append(append(os.Environ(), env...), "RDMATAP_LOSS_HELPER=client")
	clOut, err := cl.CombinedOutput()
	if err != nil {
		b.Fatalf("TCP client: %v %s", err, clOut)
	}
	rest, _ := io.ReadAll(srvOut)
	if err := srv.Wait(); err != nil {
		b.Fatalf("TCP server: %v %s", err, rest)
	}
	all := string(buf) + string(rest) + string(clOut)
	for _, line := range strings.Split(all, "\n") {
		if strings.HasPrefix(line, "mbs=") || strings.HasPrefix(line, "p99_us=") {
			return line
		}
	}
	b.Fatalf("no result from the TCP helper:\n%s", all)
	return ""
}

// TestLossTCPHelper is the kernel TCP side of BenchmarkLossLab (run as a
// child process); it does nothing in a normal test run.
func TestLossTCPHelper(t *testing.T) {
	role := os.Getenv("RDMATAP_LOSS_HELPER")
	if role == "" {
		t.Skip("helper process for BenchmarkLossLab")
	}
	mode := os.Getenv("RDMATAP_LOSS_MODE")
	secs, _ := strconv.Atoi(os.Getenv("RDMATAP_LOSS_SECONDS"))
	iters, _ := strconv.Atoi(os.Getenv("RDMATAP_LOSS_ITERS"))
	const addr = "10.89.0.2:5203"
	switch role {
	case "server":
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Println("listening")
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if mode == "pingpong" {
			b := make([]byte, 64)
			for {
				if _, err := io.ReadFull(c, b); err != nil {
					return
				}
				if _, err := c.Write(b); err != nil {
					return
				}
			}
		}
		buf := make([]byte, 1<<20)
		var got int64
		var start time.Time
		for {
			n, err := c.Read(buf)
			if got == 0 && n > 0 {
				start = time.Now()
			}
			got += int64(n)
			if err != nil {
				break
			}
		}
		fmt.Printf("mbs=%.1f\n", float64(got)/time.Since(start).Seconds()/1e6)
	case "client":
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if mode == "pingpong" {
			c.(*net.TCPConn).SetNoDelay(true)
			b := make([]byte, 64)
			rtts := make([]float64, 0, iters)
			for i := 0; i < iters+100; i++ {
				start := time.Now()
				if _, err := c.Write(b); err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(c, b); err != nil {
					t.Fatal(err)
				}
				if i >= 100 {
					rtts = append(rtts, float64(time.Since(start).Nanoseconds())/1e3)
				}
			}
			c.Close()
			slices.Sort(rtts)
			fmt.Printf("p99_us=%.1f\n", rtts[len(rtts)*99/100])
			return
		}
		buf := make([]byte, 1<<20)
		end := time.Now().Add(time.Duration(secs) * time.Second)
		for time.Now().Before(end) {
			if _, err := c.Write(buf); err != nil {
				t.Fatal(err)
			}
		}
		c.Close()
	}
}

// lossLat runs rdmatap lat write with 64-byte messages on a fresh bridge
// with the drop rule at rate (both directions) and returns the 99th
// percentile (µs).
func lossLat(b *testing.B, rate float64, iters int) float64 {
	n := newNetns(b, 1500)
	lossRule(b, n.name, "bridge", "", rate)
	args := []string{"lat", "write", "-s", "64", "-n", strconv.Itoa(iters)}
	srv := n.start(b, append(args, benchEndpointArgs(n, 0)...)...)
	n.ready(b, 0)
	cl := n.start(b, append([]string{"lat", "write", n.ips[0], "-s", "64", "-n", strconv.Itoa(iters)}, benchEndpointArgs(n, 1)...)...)
	out, err := cl.wait(b, 3*time.Minute)
	if err != nil {
		b.Fatalf("client: %v\n%s\nserver:\n%s", err, out, srv.out.String())
	}
	srv.wait(b, time.Minute)
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 8 && f[0] == "64" {
			p99, _ := strconv.ParseFloat(f[7], 64)
			return p99
		}
	}
	b.Fatalf("no latency in the client's output:\n%s", out)
	return 0
}

func BenchmarkLossLab(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("skipping: the loss lab needs root (TAPs, bridge, namespaces, nftables)")
	}
	needNft(b)
	secs := 4
	if v, err := strconv.Atoi(os.Getenv("RDMATAP_LOSS_SECONDS")); err == nil && v > 0 {
		secs = v
	}
	var rates []float64
	for _, s := range envList("RDMATAP_LOSS_RATES", "0.1,1,2") {
		p, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil {
			b.Fatalf("RDMATAP_LOSS_RATES: %v", err)
		}
		rates = append(rates, p/100)
	}
	ops := envList("RDMATAP_LOSS_OPS", "write,read,send")
	dirs := envList("RDMATAP_LOSS_DIRS", "both,data")
	say := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, format+"\n", a...)
	}
	burst := ""
	if k := lossBurst(b); k > 1 {
		burst = fmt.Sprintf("_burst%d", k)
		say("drops in bursts of %d packets in a row", k)
	}

	// Clean baselines, measured in this run.
	clean := map[string]float64{}
	for _, op := range ops {
		v, tcp := lossBW(b, op, 0, false, secs)
		clean[op] = v
		say("clean rdmatap bw %s: %.0f MB/s  [%s]", op, v, tcp)
	}
	kclean := lossKernel(b, 0, false, secs)
	say("clean kernel TCP: %.0f MB/s", kclean)

	for _, dir := range dirs {
		dataOnly := dir == "data"
		for _, r := range rates {
			k := lossKernel(b, r, dataOnly, secs)
			kf := k / kclean
			say("loss %.1f%% (%s): kernel TCP %.0f MB/s = %.2f of clean", r*100, dir, k, kf)
			b.ReportMetric(kf, fmt.Sprintf("kernel_%s_%g%%%s_retained", dir, r*100, burst))
			for _, op := range ops {
				v, tcp := lossBW(b, op, r, dataOnly, secs)
				f := v / clean[op]
				say("loss %.1f%% (%s): rdmatap bw %s %.0f MB/s = %.2f of clean (kernel %.2f; ratio %.2f)  [%s]", r*100, dir, op, v, f, kf, f/kf, tcp)
				b.ReportMetric(f, fmt.Sprintf("rdmatap_%s_%s_%g%%%s_retained", op, dir, r*100, burst))
			}
		}
	}

	// 64-byte latency's 99th percentile, both directions lossy.
	const iters = 3000
	for _, r := range append([]float64{0}, rates...) {
		lp := lossLat(b, r, iters)
		nsA, nsB := vethPair(b, "rdma", "rdmb")
		lossRule(b, nsB, "inet", "", r)
		lossRule(b, nsA, "inet", "", r)
		line := lossHelper(b, nsA, nsB, "pingpong", 0, iters)
		var kp float64
		fmt.Sscanf(line, "p99_us=%g", &kp)
		say("loss %.1f%%: 64 B lat write p99 %.1f µs (one way); kernel TCP 64 B ping-pong p99 %.1f µs (round trip)", r*100, lp, kp)
		b.ReportMetric(lp, fmt.Sprintf("lat_write_p99_us_%g%%%s", r*100, burst))
		b.ReportMetric(kp, fmt.Sprintf("kernel_pingpong_p99_us_%g%%%s", r*100, burst))
	}
}
