package test

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkNetwork measures, in one run, rdmatap RDMA Write bandwidth
// between two processes whose TAPs sit on a bridge (MTU 1500, 1 MiB
// messages) and kernel TCP between two network namespaces over a veth pair
// (MTU 1500, 1 MiB writes), with the CPU seconds per GB of both processes
// of each pair (getrusage of the children: user + system):
//
//	sudo go test ./test/ -run XXX -bench Network -benchtime 1x
//
// It reports Gbit/s and CPU-s/GB for both and the ratio rdmatap/kernel,
// first with the processes where the kernel's scheduler puts them, as
// they run by default (rdmatap's bw and lat on one P each); then (suffix
// _2p) the same with GOMAXPROCS=2 in every process, a P per core; then
// (suffix _pinned) with each pair's receiver pinned to CPU 0 and its
// sender to CPU 1 (taskset), as one pins perftest's endpoints. On a
// 2-core machine that runs both ends, two Go processes with a P per core
// each hand goroutines to idle Ps the other process needs (wake-ups,
// spinning threads): with one P each they do not.
func BenchmarkNetwork(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("skipping: the network benchmark needs root (TAPs, bridge, namespaces)")
	}
	const total = 4 << 30 // bytes per measurement
	for _, c := range []netBenchConfig{
		{how: "unpinned (rdmatap: one P each)"},
		{how: "unpinned, GOMAXPROCS=2 each", suffix: "_2p", env: []string{"GOMAXPROCS=2"}},
		{how: "receivers on CPU 0, senders on CPU 1", suffix: "_pinned", srvCPU: "0", clCPU: "1"},
	} {
		if c.srvCPU != "" && runtime.NumCPU() < 2 {
			b.Log("one CPU: no pinned measurement")
			continue
		}
		suffix, how := c.suffix, c.how
		rg, rcpu := rdmatapWrite(b, total, c)
		kg, kcpu := kernelTCP(b, total, c)
		b.ReportMetric(rg, "rdmatap_Gbit/s"+suffix)
		b.ReportMetric(kg, "kernel_Gbit/s"+suffix)
		b.ReportMetric(rg/kg, "ratio"+suffix)
		b.ReportMetric(rcpu, "rdmatap_CPU-s/GB"+suffix)
		b.ReportMetric(kcpu, "kernel_CPU-s/GB"+suffix)
		fmt.Fprintf(os.Stderr, "%s: rdmatap bw write over bridged TAPs: %.2f Gbit/s, %.3f CPU-s/GB; kernel TCP over veth: %.2f Gbit/s, %.3f CPU-s/GB; ratio %.2f\n",
			how, rg, rcpu, kg, kcpu, rg/kg)
	}
}

// vethPair makes two namespaces joined by a veth pair at MTU 1500, with
// addresses 10.89.0.1 and 10.89.0.2; they are removed when b ends.
func vethPair(b *testing.B, a, c string) (string, string) {
	id := vethID()
	nsA, nsB := a+id, c+id
	devA, devB := vethDevs()
	for _, ns := range []string{nsA, nsB} {
		exec.Command("ip", "netns", "del", ns).Run()
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			b.Fatalf("%v %s", err, out)
		}
	}
	b.Cleanup(func() {
		exec.Command("ip", "netns", "del", nsA).Run()
		exec.Command("ip", "netns", "del", nsB).Run()
	})
	for _, cmd := range [][]string{
		{"ip", "link", "add", devA, "netns", nsA, "type", "veth", "peer", "name", devB, "netns", nsB},
		{"ip", "netns", "exec", nsA, "ip", "addr", "add", "10.89.0.1/24", "dev", devA},
		{"ip", "netns", "exec", nsB, "ip", "addr", "add", "10.89.0.2/24", "dev", devB},
		{"ip", "netns", "exec", nsA, "ip", "link", "set", devA, "up", "mtu", "1500"},
		{"ip", "netns", "exec", nsB, "ip", "link", "set", devB, "up", "mtu", "1500"},
		{"ip", "netns", "exec", nsA, "ip", "link", "set", "lo", "up"},
		{"ip", "netns", "exec", nsB, "ip", "link", "set", "lo", "up"},
	} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			b.Fatalf("%v: %v %s", cmd, err, out)
		}
	}
	return nsA, nsB
}

// vethID is the suffix of vethPair's namespaces and devices.
func vethID() string { return fmt.Sprintf("%d", os.Getpid()%100000) }

// vethDevs names vethPair's devices: a in the first namespace, b in the
// second.
func vethDevs() (a, b string) { return "rdva" + vethID(), "rdvb" + vethID() }

func cpuSeconds(ps *os.ProcessState) float64 {
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// netBenchConfig is where BenchmarkNetwork runs its processes: srvCPU and
// clCPU pin the receiver and the sender (taskset -c lists; "" for none),
// env is added to both's environment.
type netBenchConfig struct {
	how, suffix   string
	srvCPU, clCPU string
	env           []string
}

// rdmatapWrite runs rdmatap bw write with 1 MiB messages between two
// processes on bridged TAPs, placed as c says, and returns Gbit/s and
// CPU-s/GB.
func rdmatapWrite(b *testing.B, total int, c netBenchConfig) (float64, float64) {
	n := newNetns(b, 1500)
	iters := total >> 20
	srv := n.startWith(b, c.srvCPU, c.env, append([]string{"bw", "write", "-s", "1048576", "-n", strconv.Itoa(iters)}, benchEndpointArgs(n, 0)...)...)
	n.ready(b, 0)
	start := time.Now()
	cl := n.startWith(b, c.clCPU, c.env, append([]string{"bw", "write", n.ips[0], "-s", "1048576", "-n", strconv.Itoa(iters)}, benchEndpointArgs(n, 1)...)...)
	out, err := cl.wait(b, 5*time.Minute)
	el := time.Since(start).Seconds()
	if err != nil {
		b.Fatalf("client: %v\n%s\nserver:\n%s", err, out, srv.out.String())
	}
	if _, err := srv.wait(b, time.Minute); err != nil {
		b.Fatalf("server: %v\n%s", err, srv.out.String())
	}
	// Wall time of the client process, connection setup included: a
	// slight underestimate of the steady rate, never an overestimate.
	gbits := float64(total) * 8 / el / 1e9
	_ = out
	cpu := cpuSeconds(cl.cmd.ProcessState) + cpuSeconds(srv.cmd.ProcessState)
	return gbits, cpu / (float64(total) / 1e9)
}

// kernelTCP moves total bytes over kernel TCP between two namespaces
// joined by a veth pair, with this test binary as sender and receiver,
// placed as rdmatapWrite places its processes.
func kernelTCP(b *testing.B, total int, c netBenchConfig) (float64, float64) {
	nsA, nsB := vethPair(b, "rdka", "rdkb")
	self, _ := os.Executable()
	srv := exec.Command("ip", append(append([]string{"netns", "exec", nsB}, pinned(c.srvCPU, self)...), "-test.run", "^TestKernelTCPHelper$")...)
	srv.Env = append(append(os.Environ(), c.env...), "RDMATAP_TCP_HELPER=server", "RDMATAP_TCP_BYTES="+strconv.Itoa(total))
	srvOut, _ := srv.StdoutPipe()
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	// Wait for the listener.
	buf := make([]byte, 64)
	if n, _ := srvOut.Read(buf); n == 0 {
		b.Fatal("TCP helper server did not start")
	}
	cl := exec.Command("ip", append(append([]string{"netns", "exec", nsA}, pinned(c.clCPU, self)...), "-test.run", "^TestKernelTCPHelper$")...)
	cl.Env = append(append(os.Environ(), c.env...), "RDMATAP_TCP_HELPER=client", "RDMATAP_TCP_BYTES="+strconv.Itoa(total))
	start := time.Now()
	if out, err := cl.CombinedOutput(); err != nil {
		b.Fatalf("TCP client: %v %s", err, out)
	}
	io.Copy(io.Discard, srvOut)
	if err := srv.Wait(); err != nil {
		b.Fatalf("TCP server: %v", err)
	}
	el := time.Since(start).Seconds()
	cpu := cpuSeconds(cl.ProcessState) + cpuSeconds(srv.ProcessState)
	return float64(total) * 8 / el / 1e9, cpu / (float64(total) / 1e9)
}

// TestKernelTCPHelper is the kernel TCP sender/receiver of BenchmarkNetwork
// (run as a child process); it does nothing in a normal test run.
func TestKernelTCPHelper(t *testing.T) {
	role := os.Getenv("RDMATAP_TCP_HELPER")
	if role == "" {
		t.Skip("helper process for BenchmarkNetwork")
	}
	total, _ := strconv.Atoi(os.Getenv("RDMATAP_TCP_BYTES"))
	buf := make([]byte, 1<<20)
	switch role {
	case "server":
		l, err := net.Listen("tcp", "10.89.0.2:5201")
		if err != nil {
			t.Fatal(err)
		}
		fmt.Println("listening")
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for got < total {
			n, err := c.Read(buf)
			got += n
			if err != nil {
				break
			}
		}
		if got != total {
			t.Fatalf("received %d of %d", got, total)
		}
	case "client":
		c, err := net.Dial("tcp", "10.89.0.2:5201")
		if err != nil {
			t.Fatal(err)
		}
		for sent := 0; sent < total; sent += len(buf) {
			if _, err := c.Write(buf); err != nil {
				t.Fatal(err)
			}
		}
		c.Close()
	}
}

// benchEndpointArgs is endpointArgs with what the environment asks of the
// network benchmarks' endpoints: RDMATAP_BENCH_PLACEMENT (--placement,
// e.g. segment), RDMATAP_BENCH_ACK_DELAY (--ack-delay, e.g. 0 for none) and
// RDMATAP_BENCH_EXTRA (any more endpoint flags, e.g. --no-link-repair), for
// comparisons side by side.
func benchEndpointArgs(n *netns, i int) []string {
	var extra []string
	if pl := os.Getenv("RDMATAP_BENCH_PLACEMENT"); pl != "" {
		extra = append(extra, "--placement", pl)
	}
	if d := os.Getenv("RDMATAP_BENCH_ACK_DELAY"); d != "" {
		extra = append(extra, "--ack-delay", d)
	}
	extra = append(extra, strings.Fields(os.Getenv("RDMATAP_BENCH_EXTRA"))...)
	return n.endpointArgs(i, extra...)
}
