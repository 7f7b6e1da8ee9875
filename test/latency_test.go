package test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkNetworkLatency measures, side by side in one run, rdmatap's
// one-way latency of 2-byte RDMA Writes, Sends and Reads between two
// processes on bridged TAPs (lat write / lat send / lat read: t_typical,
// perftest's median of half round trips, and the 99th percentile) and the
// half round trip of a 2-byte kernel TCP ping-pong (TCP_NODELAY) between
// two network namespaces, with both ends busy-polling a non-blocking
// socket, as rdmatap's lat busy-polls its TAP: over a veth pair, and over
// two veth pairs through a bridge (the TAPs' path has the bridge hop too).
// The blocking ping-pong (each end sleeps in read) is kept for reference:
// its round trip swings with the CPUs' wake-up latency from run to run.
//
//	sudo go test ./test/ -run XXX -bench NetworkLatency -benchtime 1x
//
// write_ratio is t_typical over the bridged busy-polling kernel's one-way
// time (the target: at most 1.25).
//
// With RDMATAP_BENCH_PIN=1 every pair runs pinned, server on CPU 0 and
// client on CPU 1 (taskset), rdmatap's and the kernel ping-pong's alike:
// unpinned, a machine with other work on it may run both ends on one core
// for a whole run.
func BenchmarkNetworkLatency(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("skipping: the network benchmark needs root (TAPs, bridge, namespaces)")
	}
	const iters = 5000
	type rdmaLat struct{ typical, p99 float64 }
	lat := map[string]rdmaLat{}
	for _, op := range []string{"write", "send", "read"} {
		t, p := rdmatapLat(b, op, iters)
		lat[op] = rdmaLat{t, p}
		b.ReportMetric(t, op+"_t_typical_us")
		b.ReportMetric(p, op+"_p99_us")
	}
	veth := kernelPingPong(b, iters, false, true)
	bridged := kernelPingPong(b, iters, true, true)
	blocking := kernelPingPong(b, iters, true, false)
	for _, k := range []struct {
		name string
		r    pingPong
	}{{"kernel_busy_veth", veth}, {"kernel_busy_bridge", bridged}, {"kernel_blocking_bridge", blocking}} {
		b.ReportMetric(k.r.median/2, k.name+"_oneway_us")
		b.ReportMetric(k.r.p99/2, k.name+"_p99_oneway_us")
	}
	b.ReportMetric(lat["write"].typical/(bridged.median/2), "write_ratio")
	b.ReportMetric(lat["read"].typical/lat["write"].typical, "read_over_write")
	fmt.Fprintf(os.Stderr, "2-byte latency, one way, µs (median / p99):\n"+
		"  rdmatap over bridged TAPs: lat write %.2f / %.2f, lat send %.2f / %.2f, lat read %.2f / %.2f\n"+
		"  kernel TCP, busy-polling: veth %.2f / %.2f, veth through a bridge %.2f / %.2f\n"+
		"  kernel TCP, blocking, veth through a bridge: %.2f / %.2f\n"+
		"  write over the bridged busy-polling kernel: %.2f (target <= 1.25); read over write: %.2f (target <= 2)\n",
		lat["write"].typical, lat["write"].p99, lat["send"].typical, lat["send"].p99, lat["read"].typical, lat["read"].p99,
		veth.median/2, veth.p99/2, bridged.median/2, bridged.p99/2, blocking.median/2, blocking.p99/2,
		lat["write"].typical/(bridged.median/2), lat["read"].typical/lat["write"].typical)
}

// rdmatapLat runs rdmatap lat op with 2-byte messages between two
// processes on bridged TAPs and returns t_typical and the 99th percentile
// in µs.
func rdmatapLat(b *testing.B, op string, iters int) (typical, p99 float64) {
	n := newNetns(b, 1500)
	args := []string{"lat", op, "-s", "2", "-n", strconv.Itoa(iters)}
	srvCPU, clCPU := latPin()
	srv := n.startOn(b, srvCPU, append(args, benchEndpointArgs(n, 0)...)...)
	n.ready(b, 0)
	cl := n.startOn(b, clCPU, append(append([]string{args[0], args[1], n.ips[0]}, args[2:]...), benchEndpointArgs(n, 1)...)...)
	out, err := cl.wait(b, 2*time.Minute)
	if err != nil {
		b.Fatalf("client: %v\n%s\nserver:\n%s", err, out, srv.out.String())
	}
	srv.wait(b, 30*time.Second)
	// #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%
	f := `\s+([\d.]+)`
	m := regexp.MustCompile(`(?m)^\s*2\s+` + strconv.Itoa(iters) + f + f + f + f + f + f).FindStringSubmatch(out)
	if m == nil {
		b.Fatalf("no latency row in:\n%s", out)
	}
	typical, _ = strconv.ParseFloat(m[3], 64)
	p99, _ = strconv.ParseFloat(m[6], 64)
	return typical, p99
}

// latPin returns the CPUs (taskset -c lists) of a latency pair's server
// and client: CPU 0 and CPU 1 with RDMATAP_BENCH_PIN=1, none otherwise.
func latPin() (srv, cl string) {
	if os.Getenv("RDMATAP_BENCH_PIN") == "1" {
		return "0", "1"
	}
	return "", ""
}

// pingPong is a ping-pong's round trip in µs.
type pingPong struct{ median, p99 float64 }

// kernelPingPong runs a 2-byte TCP ping-pong (TCP_NODELAY) between two
// namespaces, over a veth pair or through a bridge, with this test binary
// on both ends, busy-polling or blocking in read.
func kernelPingPong(b *testing.B, iters int, bridged, busy bool) pingPong {
	var nsA, nsB string
	if bridged {
		nsA, nsB = bridgedVeths(b, "rdla", "rdlb", "rdlc")
	} else {
		nsA, nsB = vethPair(b, "rdla", "rdlb")
	}
	self, _ := os.Executable()
	mode := "block"
	if busy {
		mode = "busy"
	}
	srvCPU, clCPU := latPin()
	srv := exec.Command("ip", append([]string{"netns", "exec", nsB}, append(pinned(srvCPU, self), "-test.run", "^TestKernelPingPongHelper$")...)...)
	srv.Env = append(os.Environ(), "RDMATAP_PINGPONG=echo", "RDMATAP_PINGPONG_MODE="+mode)
	srvOut, _ := srv.StdoutPipe()
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	defer srv.Wait()
	buf := make([]byte, 64)
	if n, _ := srvOut.Read(buf); n == 0 {
		b.Fatal("ping-pong helper server did not start")
	}
	cl := exec.Command("ip", append([]string{"netns", "exec", nsA}, append(pinned(clCPU, self), "-test.run", "^TestKernelPingPongHelper$", "-test.v")...)...)
	cl.Env = append(os.Environ(), "RDMATAP_PINGPONG=ping", "RDMATAP_PINGPONG_MODE="+mode, "RDMATAP_PINGPONG_ITERS="+strconv.Itoa(iters))
	out, err := cl.CombinedOutput()
	if err != nil {
		b.Fatalf("ping-pong client: %v %s", err, out)
	}
	m := regexp.MustCompile(`median_rtt_us=([\d.]+) p99_rtt_us=([\d.]+)`).FindSubmatch(out)
	if m == nil {
		b.Fatalf("no round trip in:\n%s", out)
	}
	var r pingPong
	r.median, _ = strconv.ParseFloat(string(m[1]), 64)
	r.p99, _ = strconv.ParseFloat(string(m[2]), 64)
	return r
}

// bridgedVeths makes namespaces a and c, each joined by a veth pair to a
// bridge in namespace br, with addresses 10.89.0.1 (a) and 10.89.0.2 (c);
// they are removed when b ends.
func bridgedVeths(b *testing.B, a, br, c string) (string, string) {
	id := fmt.Sprintf("%d", os.Getpid()%100000)
	nsA, nsBr, nsC := a+id, br+id, c+id
	for _, ns := range []string{nsA, nsBr, nsC} {
		exec.Command("ip", "netns", "del", ns).Run()
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			b.Fatalf("%v %s", err, out)
		}
	}
	b.Cleanup(func() {
		for _, ns := range []string{nsA, nsBr, nsC} {
			exec.Command("ip", "netns", "del", ns).Run()
		}
	})
	in := func(ns string, args ...string) []string { return append([]string{"ip", "netns", "exec", ns}, args...) }
	cmds := [][]string{
		in(nsBr, "ip", "link", "add", "br0", "type", "bridge"),
		in(nsBr, "ip", "link", "set", "br0", "up"),
		{"ip", "link", "add", "rdba" + id, "netns", nsA, "type", "veth", "peer", "name", "pa", "netns", nsBr},
		{"ip", "link", "add", "rdbc" + id, "netns", nsC, "type", "veth", "peer", "name", "pc", "netns", nsBr},
		in(nsBr, "ip", "link", "set", "pa", "master", "br0", "up"),
		in(nsBr, "ip", "link", "set", "pc", "master", "br0", "up"),
		in(nsA, "ip", "addr", "add", "10.89.0.1/24", "dev", "rdba"+id),
		in(nsC, "ip", "addr", "add", "10.89.0.2/24", "dev", "rdbc"+id),
		in(nsA, "ip", "link", "set", "rdba"+id, "up", "mtu", "1500"),
		in(nsC, "ip", "link", "set", "rdbc"+id, "up", "mtu", "1500"),
		in(nsA, "ip", "link", "set", "lo", "up"),
		in(nsC, "ip", "link", "set", "lo", "up"),
	}
	for _, cmd := range cmds {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			b.Fatalf("%v: %v %s", cmd, err, out)
		}
	}
	return nsA, nsC
}

// TestKernelPingPongHelper is the two ends of kernelPingPong, run in the
// namespaces (RDMATAP_PINGPONG=echo or ping; RDMATAP_PINGPONG_MODE=busy
// spins on a non-blocking socket, block sleeps in read).
func TestKernelPingPongHelper(t *testing.T) {
	role := os.Getenv("RDMATAP_PINGPONG")
	if role == "" {
		t.Skip("helper process for BenchmarkNetworkLatency")
	}
	busy := os.Getenv("RDMATAP_PINGPONG_MODE") == "busy"
	var c *net.TCPConn
	switch role {
	case "echo":
		l, err := net.Listen("tcp", "10.89.0.2:5203")
		if err != nil {
			t.Fatal(err)
		}
		fmt.Println("listening")
		nc, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		c = nc.(*net.TCPConn)
	case "ping":
		nc, err := net.Dial("tcp", "10.89.0.2:5203")
		if err != nil {
			t.Fatal(err)
		}
		c = nc.(*net.TCPConn)
	default:
		t.Fatalf("unknown role %q", role)
	}
	c.SetNoDelay(true)
	rw := pingPongIO{c: c}
	if busy {
		f, err := c.File() // a blocking-mode duplicate: set it non-blocking
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		rw.fd = int(f.Fd())
		if err := unix.SetNonblock(rw.fd, true); err != nil {
			t.Fatal(err)
		}
	}
	msg := make([]byte, 2)
	if role == "echo" {
		for {
			if err := rw.readFull(msg); err != nil {
				return
			}
			if err := rw.write(msg); err != nil {
				return
			}
		}
	}
	iters, _ := strconv.Atoi(os.Getenv("RDMATAP_PINGPONG_ITERS"))
	rtts := make([]float64, 0, iters)
	for i := 0; i < iters+100; i++ {
		start := time.Now()
		if err := rw.write(msg); err != nil {
			t.Fatal(err)
		}
		if err := rw.readFull(msg); err != nil {
			t.Fatal(err)
		}
		if i >= 100 { // warm-up
			rtts = append(rtts, float64(time.Since(start).Nanoseconds())/1e3)
		}
	}
	c.Close()
	slices.Sort(rtts)
	fmt.Printf("median_rtt_us=%.2f p99_rtt_us=%.2f\n", rtts[len(rtts)/2], rtts[len(rtts)*99/100])
}

// pingPongIO reads and writes a ping-pong's messages: through the Go
// connection (blocking: the goroutine sleeps until data comes), or with
// fd >= 0 by read(2) and write(2) on a non-blocking descriptor, spinning
// while there is nothing to read.
type pingPongIO struct {
	c  *net.TCPConn
	fd int
}

func (p *pingPongIO) readFull(b []byte) error {
	if p.fd == 0 {
		_, err := io.ReadFull(p.c, b)
		return err
	}
	for got := 0; got < len(b); {
		n, err := unix.Read(p.fd, b[got:])
		switch {
		case errors.Is(err, unix.EAGAIN):
			continue
		case err != nil:
			return err
		case n == 0:
			return io.EOF
		}
		got += n
	}
	return nil
}

func (p *pingPongIO) write(b []byte) error {
	if p.fd == 0 {
		_, err := p.c.Write(b)
		return err
	}
	for len(b) > 0 {
		n, err := unix.Write(p.fd, b)
		if errors.Is(err, unix.EAGAIN) {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}
