package test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The network tests run two rdmatap processes, each owning a TAP device;
// the TAPs sit on a Linux bridge in a network namespace the test makes
// (the kernel side of the bridge is 10.88.0.1, the endpoints .2 and .3).
// Nothing leaves the namespace. They need root; without it they skip.

var rdmatapBin string

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "rdmatap-test")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		rdmatapBin = filepath.Join(dir, "rdmatap")
		out, err := exec.Command("go", "build", "-o", rdmatapBin, "../cmd/rdmatap").CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "building rdmatap: %v\n%s", err, out)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

// needRoot skips a test that needs root, /dev/net/tun and iproute2.
func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: network-namespace tests need root (they create TAP devices, a bridge and a namespace)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skip("skipping: /dev/net/tun is missing")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("skipping: the ip command (iproute2) is missing")
	}
	if _, err := exec.LookPath("ping"); err != nil {
		t.Skip("skipping: the ping command (iputils-ping) is missing; .ci/run installs it")
	}
}

// netns is a namespace with a bridge and two TAPs on it.
type netns struct {
	name   string
	taps   [2]string
	addrs  [2]string // with prefix
	ips    [2]string
	bridge string
}

func run(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

var nsSeq struct {
	sync.Mutex
	n int
}

// newNetns makes the namespace, the bridge and two persistent TAPs on it;
// t.Cleanup deletes them all by name, even when the test fails.
func newNetns(t testing.TB, mtu int) *netns {
	t.Helper()
	needRoot(t)
	nsSeq.Lock()
	nsSeq.n++
	k := nsSeq.n
	nsSeq.Unlock()
	id := fmt.Sprintf("%d%d", os.Getpid()%10000, k)
	n := &netns{name: "rdt" + id, bridge: "rdbr" + id,
		taps:  [2]string{"rdta" + id, "rdtb" + id},
		addrs: [2]string{"10.88.0.2/24", "10.88.0.3/24"}, ips: [2]string{"10.88.0.2", "10.88.0.3"}}
	exec.Command("ip", "netns", "del", n.name).Run()
	run(t, "ip", "netns", "add", n.name)
	t.Cleanup(func() {
		// Deleting the namespace removes the bridge and TAPs in it; delete
		// them by name first in case a process still holds one open.
		for _, tp := range n.taps {
			exec.Command("ip", "netns", "exec", n.name, "ip", "link", "del", tp).Run()
		}
		exec.Command("ip", "netns", "exec", n.name, "ip", "link", "del", n.bridge).Run()
		exec.Command("ip", "netns", "del", n.name).Run()
	})
	ns := func(args ...string) { run(t, append([]string{"ip", "netns", "exec", n.name}, args...)...) }
	ns("ip", "link", "set", "lo", "up")
	ns("ip", "link", "add", n.bridge, "type", "bridge")
	ns("ip", "link", "set", n.bridge, "mtu", strconv.Itoa(mtu))
	ns("ip", "addr", "add", "10.88.0.1/24", "dev", n.bridge)
	for _, tp := range n.taps {
		ns("ip", "tuntap", "add", "dev", tp, "mode", "tap", "vnet_hdr")
		ns("ip", "link", "set", tp, "mtu", strconv.Itoa(mtu))
		ns("ip", "link", "set", tp, "master", n.bridge)
		ns("ip", "link", "set", tp, "up")
	}
	ns("ip", "link", "set", n.bridge, "up")
	return n
}

// proc is a running rdmatap process in the namespace.
type proc struct {
	cmd  *exec.Cmd
	args []string // rdmatap's
	out  lockedBuffer
	done chan error
}

// lockedBuffer is a process's output: the process writes it (through
// os/exec's copying goroutine) while a test reads what it has so far.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (n *netns) start(t testing.TB, args ...string) *proc {
	t.Helper()
	return n.startOn(t, "", args...)
}

// startOn is start with the process pinned to the CPUs of list (taskset
// -c syntax; "" for none).
func (n *netns) startOn(t testing.TB, list string, args ...string) *proc {
	t.Helper()
	return n.startWith(t, list, nil, args...)
}

// startWith is startOn with env added to the process's environment.
func (n *netns) startWith(t testing.TB, list string, env []string, args ...string) *proc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	p := &proc{done: make(chan error, 1), args: args}
	p.cmd = exec.CommandContext(ctx, "ip", append(append([]string{"netns", "exec", n.name}, pinned(list, rdmatapBin)...), args...)...)
	if env != nil {
		p.cmd.Env = append(os.Environ(), env...)
	}
	p.cmd.Stdout = &p.out
	p.cmd.Stderr = &p.out
	if err := p.cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	go func() {
		p.done <- p.cmd.Wait()
		cancel()
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		p.done <- nil
	})
	return p
}

func (p *proc) wait(t testing.TB, d time.Duration) (string, error) {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err
		return p.out.String(), err
	case <-time.After(d):
		t.Fatalf("rdmatap %v did not finish in %v; output:\n%s", p.args, d, p.out.String())
	}
	return "", nil
}

// endpointArgs are the endpoint flags of endpoint i.
func (n *netns) endpointArgs(i int, extra ...string) []string {
	return append([]string{"--tap", n.taps[i], "--addr", n.addrs[i]}, extra...)
}

// ready waits until the kernel can ping endpoint i: its netstack answers
// ARP and ICMP.
func (n *netns) ready(t testing.TB, i int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, err := exec.Command("ip", "netns", "exec", n.name, "ping", "-c", "1", "-W", "1", n.ips[i]).CombinedOutput()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("endpoint %s never answered the kernel's ping: %v\n%s", n.ips[i], err, out)
		}
	}
}

func TestKernelPingsBothEndpoints(t *testing.T) {
	n := newNetns(t, 1500)
	a := n.start(t, append([]string{"up", "--name", "rta", "--ctl", filepath.Join(t.TempDir(), "a.sock")}, n.endpointArgs(0)...)...)
	b := n.start(t, append([]string{"up", "--name", "rtb", "--ctl", filepath.Join(t.TempDir(), "b.sock")}, n.endpointArgs(1)...)...)
	n.ready(t, 0)
	n.ready(t, 1)
	out := run(t, "ip", "netns", "exec", n.name, "ping", "-c", "5", "-i", "0.2", "-W", "2", n.ips[0])
	if !strings.Contains(out, " 0% packet loss") {
		t.Fatalf("kernel ping of %s: %s", n.ips[0], out)
	}
	out = run(t, "ip", "netns", "exec", n.name, "ping", "-c", "5", "-i", "0.2", "-W", "2", n.ips[1])
	if !strings.Contains(out, " 0% packet loss") {
		t.Fatalf("kernel ping of %s: %s", n.ips[1], out)
	}
	_ = a
	_ = b
}

var pingLine = regexp.MustCompile(`(?m)^ping data: rdma-ping-\d+: `)

func TestPingAcrossBridge(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra []string
	}{
		{"default", nil},
		{"crc", []string{"--crc"}},
		{"no-offload", []string{"--no-offload"}},
		{"p2p-read", []string{"--p2p", "read"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNetns(t, 1500)
			srv := n.start(t, append([]string{"ping", "-s", "-a", n.ips[0]}, n.endpointArgs(0, tc.extra...)...)...)
			n.ready(t, 0)
			cl := n.start(t, append([]string{"ping", "-c", "-a", n.ips[0], "-C", "50", "-v", "-V"}, n.endpointArgs(1, tc.extra...)...)...)
			out, err := cl.wait(t, time.Minute)
			if err != nil {
				t.Fatalf("client: %v\n%s\nserver:\n%s", err, out, srv.out.String())
			}
			if got := len(pingLine.FindAllString(out, -1)); got != 50 {
				t.Fatalf("client printed %d ping data lines, want 50:\n%s", got, out)
			}
			if _, err := srv.wait(t, 30*time.Second); err != nil {
				t.Fatalf("server: %v\n%s", err, srv.out.String())
			}
		})
	}
}

func TestBandwidthAcrossBridge(t *testing.T) {
	for _, op := range []string{"write", "read", "send"} {
		t.Run(op, func(t *testing.T) {
			n := newNetns(t, 1500)
			srv := n.start(t, append([]string{"bw", op, "-n", "200", "-s", "65536", "--verify"}, n.endpointArgs(0)...)...)
			n.ready(t, 0)
			cl := n.start(t, append([]string{"bw", op, n.ips[0], "-n", "200", "-s", "65536", "--verify"}, n.endpointArgs(1)...)...)
			out, err := cl.wait(t, 2*time.Minute)
			if err != nil {
				t.Fatalf("client: %v\n%s\nserver:\n%s", err, out, srv.out.String())
			}
			sout, err := srv.wait(t, 30*time.Second)
			if err != nil {
				t.Fatalf("server: %v\n%s", err, sout)
			}
			for _, o := range []string{out, sout} {
				if !regexp.MustCompile(`(?m)^\s*65536\s+200\s+[\d.]+\s+[\d.]+\s+[\d.]+`).MatchString(o) {
					t.Fatalf("no result row for 65536 bytes x 200 in:\n%s", o)
				}
			}
		})
	}
}

func TestLatencyAcrossBridge(t *testing.T) {
	for _, op := range []string{"write", "read", "send"} {
		t.Run(op, func(t *testing.T) {
			n := newNetns(t, 1500)
			srv := n.start(t, append([]string{"lat", op, "-n", "500"}, n.endpointArgs(0)...)...)
			n.ready(t, 0)
			cl := n.start(t, append([]string{"lat", op, n.ips[0], "-n", "500"}, n.endpointArgs(1)...)...)
			out, err := cl.wait(t, time.Minute)
			if err != nil {
				t.Fatalf("client: %v\n%s\nserver:\n%s", err, out, srv.out.String())
			}
			if !regexp.MustCompile(`(?m)^\s*2\s+500\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+`).MatchString(out) {
				t.Fatalf("no latency row in:\n%s", out)
			}
			srv.wait(t, 30*time.Second)
		})
	}
}

// TestPcapDecodesInTshark: with --crc --pcap, tshark decodes the capture
// with zero malformed frames and a good CRC on every FPDU.
func TestPcapDecodesInTshark(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("skipping: tshark is not installed (.ci/run installs it)")
	}
	n := newNetns(t, 1500)
	pcap := filepath.Join(t.TempDir(), "client.pcap")
	srv := n.start(t, append([]string{"ping", "-s", "-a", n.ips[0], "-S", "3000"}, n.endpointArgs(0, "--crc")...)...)
	n.ready(t, 0)
	cl := n.start(t, append([]string{"ping", "-c", "-a", n.ips[0], "-C", "10", "-V", "-S", "3000"}, n.endpointArgs(1, "--crc", "--pcap", pcap)...)...)
	if out, err := cl.wait(t, time.Minute); err != nil {
		t.Fatalf("client: %v\n%s", err, out)
	}
	srv.wait(t, 30*time.Second)
	v, err := exec.Command(tshark, "-n", "--disable-heuristic", "rpcrdma_iwarp", "-r", pcap, "-O", "iwarp_mpa,iwarp_ddp_rdmap", "-V").Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	text := string(v)
	if c := strings.Count(text, "Malformed"); c != 0 {
		t.Fatalf("%d malformed frames", c)
	}
	if c := strings.Count(strings.ToLower(text), "bad crc"); c != 0 {
		t.Fatalf("%d FPDUs with a bad CRC", c)
	}
	// rping: per iteration the client sends 2 Sends and a Read Response
	// and receives a Read Request, a Write and 2 Sends: 6 FPDUs, 4 of
	// them carrying 3000 bytes or less... at least 6 FPDUs per iteration.
	if good := strings.Count(text, "Good CRC32"); good < 60 {
		t.Fatalf("tshark found %d FPDUs with a good CRC, want at least 60", good)
	}
}

// TestErrorsAreOneLine: bad flags, a missing peer and an unreachable
// server give a one-line error and a non-zero exit, never a stack trace.
func TestErrorsAreOneLine(t *testing.T) {
	check := func(t *testing.T, out string, err error, want string) {
		t.Helper()
		if err == nil {
			t.Fatalf("succeeded, want an error; output:\n%s", out)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 1 || strings.Contains(out, "goroutine ") || !strings.Contains(out, want) {
			t.Fatalf("want one line mentioning %q, got:\n%s", want, out)
		}
	}
	for _, args := range [][]string{
		{"up", "--tap", "x", "--addr", "300.1.1.1/24"},
		{"up", "--tap", "x"},
		{"up", "--addr", "10.1.1.1/24"},
		{"up", "--tap", "x", "--addr", "10.1.1.1/24", "--mtu", "9"},
		{"ping", "-c"},
		{"bw", "sideways"},
		{"lat", "write", "-s", "-5"},
	} {
		out, err := exec.Command(rdmatapBin, args...).CombinedOutput()
		var ee *exec.ExitError
		if err == nil {
			t.Fatalf("%v succeeded", args)
		}
		if errors.As(err, &ee) && ee.ExitCode() != 2 {
			t.Errorf("%v: exit %d, want 2", args, ee.ExitCode())
		}
		check(t, string(out), err, "rdmatap")
	}
	t.Run("peer-never-answers", func(t *testing.T) {
		n := newNetns(t, 1500)
		// Nothing listens at .3: its ARP is never answered.
		cl := n.start(t, append([]string{"ping", "-c", "-a", "10.88.0.9", "-C", "1"}, n.endpointArgs(0)...)...)
		out, err := cl.wait(t, 2*time.Minute)
		check(t, out, err, "10.88.0.9")
	})
	t.Run("not-root", func(t *testing.T) {
		needRoot(t)
		if _, err := exec.LookPath("setpriv"); err != nil {
			t.Skip("setpriv missing")
		}
		cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", rdmatapBin, "up", "--tap", "rdnoperm0", "--addr", "10.88.9.2/24")
		out, err := cmd.CombinedOutput()
		check(t, string(out), err, "permission")
	})
	t.Run("control-socket-in-use", func(t *testing.T) {
		n := newNetns(t, 1500)
		ctl := filepath.Join(t.TempDir(), "c.sock")
		n.start(t, append([]string{"up", "--ctl", ctl}, n.endpointArgs(0)...)...)
		n.ready(t, 0)
		second := n.start(t, append([]string{"up", "--ctl", ctl}, n.endpointArgs(1)...)...)
		out, err := second.wait(t, 30*time.Second)
		check(t, out, err, "already")
	})
}

// TestUpExitsWhenTAPDeleted: deleting the TAP under a running `rdmatap up`
// ends it with a one-line error that names the TAP, instead of leaving an
// endpoint up with no network.
func TestUpExitsWhenTAPDeleted(t *testing.T) {
	n := newNetns(t, 1500)
	p := n.start(t, append([]string{"up", "--name", "rtdel", "--ctl", filepath.Join(t.TempDir(), "del.sock")}, n.endpointArgs(0)...)...)
	n.ready(t, 0)
	run(t, "ip", "netns", "exec", n.name, "ip", "link", "del", n.taps[0])
	out, err := p.wait(t, 10*time.Second)
	if err == nil {
		t.Fatalf("up exited 0 after its TAP was deleted; output:\n%s", out)
	}
	if !strings.Contains(out, "TAP "+n.taps[0]+" is gone") {
		t.Fatalf("up's output does not say the TAP is gone:\n%s", out)
	}
}

// TestViaServiceAcrossBridge: a process without privileges (nobody, dropped
// with setpriv) runs ping, bw write and lat send with --via against a
// running `rdmatap up --socket` on one TAP, with a plain rdmatap endpoint
// on the other TAP of the bridge as the peer: the tools as clients of the
// service, across a network.
func TestViaServiceAcrossBridge(t *testing.T) {
	needRoot(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("skipping: setpriv (util-linux) is missing")
	}
	n := newNetns(t, 1500)
	// nobody must be able to run the binary and reach the socket.
	dir, err := os.MkdirTemp("", "rdmatap-via")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "rdmatap")
	if data, err := os.ReadFile(rdmatapBin); err != nil || os.WriteFile(bin, data, 0o755) != nil {
		t.Fatalf("copying rdmatap: %v", err)
	}
	sock := filepath.Join(dir, "svc.sock")
	up := n.start(t, append([]string{"up", "--socket", sock, "--socket-group", "65534", "--ctl", filepath.Join(dir, "ctl.sock")}, n.endpointArgs(0)...)...)
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no service socket after 15 s; up:\n%s", up.out.String())
		}
	}
	for _, tc := range []struct {
		name       string
		server     []string
		client     []string
		wantClient *regexp.Regexp
	}{
		{"ping", []string{"ping", "-s", "-a", n.ips[1]}, []string{"ping", "-c", "-a", n.ips[1], "-C", "20", "-v"}, nil},
		{"bw-write", []string{"bw", "write", "-n", "200", "-s", "65536", "--verify"}, []string{"bw", "write", n.ips[1], "-n", "200", "-s", "65536", "--verify"},
			regexp.MustCompile(`(?m)^\s*65536\s+200\s+[\d.]+\s+[\d.]+\s+[\d.]+`)},
		{"lat-send", []string{"lat", "send", "-n", "500", "-s", "2"}, []string{"lat", "send", n.ips[1], "-n", "500", "-s", "2"},
			regexp.MustCompile(`(?m)^\s*2\s+500\s+[\d.]+\s+[\d.]+\s+[\d.]+`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := n.start(t, append(tc.server, n.endpointArgs(1)...)...)
			n.ready(t, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			c := exec.CommandContext(ctx, setpriv, append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", bin}, append(tc.client, "--via", sock)...)...)
			out, err := c.CombinedOutput()
			if err != nil {
				t.Fatalf("client as nobody: %v\n%s\nserver:\n%s\nup:\n%s", err, out, srv.out.String(), up.out.String())
			}
			if tc.name == "ping" {
				if got := len(pingLine.FindAllString(string(out), -1)); got != 20 {
					t.Fatalf("client printed %d ping data lines, want 20:\n%s", got, out)
				}
			} else if !tc.wantClient.Match(out) {
				t.Fatalf("no result row in the client's output:\n%s", out)
			}
			sout, err := srv.wait(t, 30*time.Second)
			if err != nil {
				t.Fatalf("server: %v\n%s", err, sout)
			}
		})
	}
	if !strings.Contains(up.out.String(), "uid 65534") {
		t.Errorf("up did not log the client's uid:\n%s", up.out.String())
	}
}

// pinned is the command line that runs prog on the CPUs of list (taskset
// -c syntax), or prog alone when list is "".
func pinned(list, prog string) []string {
	if list == "" {
		return []string{prog}
	}
	return []string{"taskset", "-c", list, prog}
}
