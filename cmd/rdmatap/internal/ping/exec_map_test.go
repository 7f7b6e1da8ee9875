package ping

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
	"github.com/rdmatap/rdmatap/verbs"
)

// withMap gives an exec command made by execProgram the address map m
// (`rdmatap exec --map m`).
func withMap(c []string, m string) {
	for i, kv := range c {
		if v, ok := strings.CutPrefix(kv, upChildEnv+"=exec "); ok {
			c[i] = upChildEnv + "=exec --map " + m + " " + v
		}
	}
}

// TestExecAddrMap: qperf's client learns its server over the kernel's
// network (its control connection to 127.0.0.1, where the server
// listens), and connects its RC tests with rdma_cm to the same address,
// where no endpoint is. With `--map 127.0.0.1=B` (B the server's
// endpoint address) the library connects to B instead: rc_lat and
// rc_rdma_write_bw run without a network namespace, and without the map
// the client fails to connect rather than finding the server.
func TestExecAddrMap(t *testing.T) {
	needProgram(t, "qperf", "qperf")
	a, b, err := cli.EmbeddedPair(verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	sockA, sockB := serveOn(t, a), serveOn(t, b)
	prebuild(t, false)
	// A kernel port for qperf's control connection, free a moment ago.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	m := "127.0.0.1=" + b.Addr.String()
	srvCmd := execProgram(t, ctx, sockB, false, "qperf", "-lp", port)
	withMap(srvCmd.Env, m)
	// qperf's server forks a child per client, which holds its output
	// pipes: the cleanup ends the whole process group.
	srvCmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	srvCmd.WaitDelay = time.Second
	srv := startProgram(t, srvCmd)
	t.Cleanup(func() { syscall.Kill(-srvCmd.Process.Pid, syscall.SIGKILL) })
	var cl *program
	for i := 0; ; i++ {
		c := execProgram(t, ctx, sockA, false, "qperf", "127.0.0.1", "-lp", port, "-cm1", "-t", "1", "rc_lat", "rc_rdma_write_bw")
		withMap(c.Env, m)
		cl = startProgram(t, c)
		err := cl.wait(t, "qperf's client", 20*time.Second)
		if err == nil {
			break
		}
		if i == 20 || !strings.Contains(cl.out.String()+cl.errOut.String(), "failed to connect") {
			t.Fatalf("%v\nserver:\n%s%s", err, srv.out.String(), srv.errOut.String())
		}
		time.Sleep(100 * time.Millisecond) // the server is not listening yet
	}
	out := cl.out.String()
	if i := strings.Index(out, "rc_lat:"); i < 0 || !strings.Contains(out[i:], "latency  =") {
		t.Fatalf("no rc_lat latency:\n%s", out)
	}
	if i := strings.Index(out, "rc_rdma_write_bw:"); i < 0 || !strings.Contains(out[i:], "bw  =") {
		t.Fatalf("no rc_rdma_write_bw bandwidth:\n%s", out)
	}
	t.Logf("qperf through the map:\n%s", out)

	// Without the map the RC connection goes to 127.0.0.1, on the
	// endpoint's own stack, and fails (a timeout or a refusal), never
	// reaching the server's device.
	c := execProgram(t, ctx, sockA, false, "qperf", "127.0.0.1", "-lp", port, "-cm1", "-t", "1", "rc_lat")
	nomap := startProgram(t, c)
	if err := nomap.wait(t, "qperf's client without the map", 5*time.Second); err == nil && strings.Contains(nomap.out.String(), "latency  =") {
		t.Fatalf("qperf without the map measured a latency:\n%s", nomap.out.String())
	}
}

// TestExecMapFlag: a malformed --map is a usage error naming the entry,
// and a valid one reaches the program as RDMATAP_ADDR_MAP.
func TestExecMapFlag(t *testing.T) {
	sock := serveOn(t, mustPair(t))
	for _, bad := range []string{"10.0.0.1", "10.0.0.1=host", "10.0.0.1=fe80::1", "=10.0.0.2"} {
		var out, errOut bytes.Buffer
		if code := cli.Run([]string{"env", "--via", sock, "--map", bad}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "FROM=TO") {
			t.Errorf("--map %q: exit %d\n%s", bad, code, errOut.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := cli.Run([]string{"env", "--via", sock, "--cache", execCache(t), "--map", "192.168.1.20=10.77.0.3,fd00::1=fd77::3", "--map", "127.0.0.1=10.77.0.4"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d\n%s", code, errOut.String())
	}
	if want := "export RDMATAP_ADDR_MAP='192.168.1.20=10.77.0.3,fd00::1=fd77::3,127.0.0.1=10.77.0.4'\n"; !strings.Contains(out.String(), want) {
		t.Fatalf("env printed\n%s\nwant %s", out.String(), want)
	}
}

// TestExecMapMalformed: a malformed RDMATAP_ADDR_MAP set by hand (not
// through --map) makes the library say so in one line and refuse to bind
// or resolve (EINVAL) rather than connect somewhere unmapped.
func TestExecMapMalformed(t *testing.T) {
	needProgram(t, "rping", "rdmacm-utils")
	sock := serveOn(t, mustPair(t))
	prebuild(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := execProgram(t, ctx, sock, false, "rping", "-c", "-a", "192.0.2.2", "-C", "1")
	c.Env = append(c.Env, "RDMATAP_ADDR_MAP=192.0.2.2=10.0.0.1,nonsense")
	p := startProgram(t, c)
	err := p.wait(t, "rping", 20*time.Second)
	if err == nil {
		t.Fatalf("rping ran with a malformed map:\n%s", p.out.String())
	}
	if msg := p.errOut.String() + p.out.String(); strings.Count(msg, "RDMATAP_ADDR_MAP: entry nonsense") != 1 {
		t.Fatalf("want one line naming the entry:\n%s", msg)
	}
}

func mustPair(t *testing.T) *cli.Endpoint {
	t.Helper()
	a, b, err := cli.EmbeddedPair(verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a
}
