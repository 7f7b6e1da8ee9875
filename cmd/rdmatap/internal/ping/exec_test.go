package ping

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/capi"
	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
	_ "github.com/rdmatap/rdmatap/cmd/rdmatap/internal/progexec" // the exec command, for the test binary as rdmatap
	"github.com/rdmatap/rdmatap/internal/progtest"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/service"
)

// These tests run rdma-core's and perftest's programs, unmodified, through
// `rdmatap exec` on services of an in-memory link, as the user nobody when
// the test runs as root.

const nobody = 65534

// upChildEnv makes the test binary run rdmatap with the arguments in the
// variable (separated by spaces) instead of the tests.
const upChildEnv = "RDMATAP_UP_CHILD"

func TestMain(m *testing.M) {
	if a := os.Getenv(upChildEnv); a != "" {
		os.Exit(cli.Run(strings.Fields(a), os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// worldDir makes a temporary directory every user may enter.
func worldDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "rdmatap-exec")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(d, 0o755)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

var (
	libCacheOnce sync.Once
	libCache     string
)

// execCache is where the tests' `rdmatap exec` builds the libraries: one
// directory for the whole test binary, readable by every user.
func execCache(t *testing.T) string {
	libCacheOnce.Do(func() {
		libCache = filepath.Join(os.TempDir(), "rdmatap-exec-test-cache")
		os.MkdirAll(libCache, 0o755)
		os.Chmod(libCache, 0o755)
	})
	return libCache
}

// prebuild builds the libraries before programs start, so that a
// program's start takes no build time.
func prebuild(t *testing.T, sanitize bool) {
	t.Helper()
	if _, err := capi.Build(execCache(t), sanitize); err != nil {
		t.Fatal(err)
	}
}

// waitListen waits until a program listens on addr, probing it with TCP
// connections from the endpoint from (closed at once: a listener's
// service drops a connection that sends no MPA request, and the program
// never sees it).
func waitListen(t *testing.T, from *cli.Endpoint, addr netip.AddrPort, p *program) {
	t.Helper()
	p.waitFor(t, "listening on "+addr.String(), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		c, err := from.Net.Dial(ctx, addr)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
}

// needProgram skips unless the program is installed.
func needProgram(t *testing.T, name, pkg string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("skipping: %s not installed (Debian package %s)", name, pkg)
	}
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skip("skipping: no C compiler (cc) to build the libraries")
	}
}

// serveOn serves e's device on a socket the user nobody may use.
func serveOn(t *testing.T, e *cli.Endpoint) string {
	t.Helper()
	sock := filepath.Join(worldDir(t), "rt.sock")
	srv := serve(t, e, sock, 256, 1024)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// serve serves e's device on sock (group nobody when root), n of each
// object and clients clients at most.
func serve(t *testing.T, e *cli.Endpoint, sock string, n, clients int) *service.Server {
	t.Helper()
	gid := -1
	if os.Geteuid() == 0 {
		gid = nobody
	}
	ln, err := service.ListenSocket(sock, gid)
	if err != nil {
		t.Fatal(err)
	}
	lim := service.Limits{QPs: n, CQs: n, Conns: n, MRs: n, FRPages: 1024, MRBytes: 1 << 30, RingBytes: 64 << 20, Memory: 512 << 20}
	srv, err := service.Serve(e.Dev, ln, service.Config{Limits: lim, PollSpin: 50 * time.Microsecond,
		MaxClients: clients, MaxClientsPerUser: min(64, clients), MaxPendingPerUser: 16, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// execProgram runs `rdmatap exec --via sock -- prog args...` as a child
// (the test binary as rdmatap); the program runs as nobody when root.
func execProgram(t *testing.T, ctx context.Context, sock string, sanitize bool, prog string, args ...string) *exec.Cmd {
	t.Helper()
	path, err := exec.LookPath(prog)
	if err != nil {
		t.Fatal(err)
	}
	argv := []string{"exec", "--via", sock, "--cache", execCache(t)}
	if sanitize {
		argv = append(argv, "--sanitize")
	}
	argv = append(argv, "--")
	if os.Geteuid() == 0 {
		setpriv, err := exec.LookPath("setpriv")
		if err != nil {
			t.Skip("skipping: setpriv not found (Debian package util-linux)")
		}
		argv = append(argv, setpriv, fmt.Sprintf("--reuid=%d", nobody), fmt.Sprintf("--regid=%d", nobody), "--clear-groups")
	}
	argv = append(argv, path)
	argv = append(argv, args...)
	for _, a := range argv {
		if strings.ContainsAny(a, " \t\n") {
			t.Fatalf("argument %q has spaces", a)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := exec.CommandContext(ctx, self)
	c.Env = append(os.Environ(), upChildEnv+"="+strings.Join(argv, " "))
	if sanitize {
		// The programs leak by design at exit; the libraries' errors
		// are what the sanitizers are for.
		c.Env = append(c.Env, "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1", "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
	}
	return c
}

// program is a started child with its output.
type program struct {
	cmd         *exec.Cmd
	out, errOut syncBuf
	done        chan error
	exited      chan struct{} // closed once Wait has returned
}

func startProgram(t *testing.T, c *exec.Cmd) *program {
	t.Helper()
	p := &program{cmd: c, done: make(chan error, 1), exited: make(chan struct{})}
	c.Stdout = &p.out
	c.Stderr = &p.errOut
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.done <- c.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			c.Process.Kill()
			<-p.exited
		}
	})
	return p
}

func (p *program) wait(t *testing.T, what string, d time.Duration) error {
	t.Helper()
	select {
	case err := <-p.done:
		if err != nil {
			return fmt.Errorf("%s: %v\nstdout:\n%s\nstderr:\n%s", what, err, p.out.String(), p.errOut.String())
		}
		return nil
	case <-time.After(d):
		p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not finish in %v\nstdout:\n%s\nstderr:\n%s", what, d, p.out.String(), p.errOut.String())
	}
}

// waitFor polls until cond holds or the program ends.
func (p *program) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("%s: program ended (%v)\nstdout:\n%s\nstderr:\n%s", what, err, p.out.String(), p.errOut.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: timed out\nstdout:\n%s\nstderr:\n%s", what, p.out.String(), p.errOut.String())
		}
	}
}

// checkPingLines: every line is the expected ping data of its ping.
func checkPingLines(t *testing.T, who string, lines []string, prefix string, count, size int) {
	t.Helper()
	var got []string
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			got = append(got, strings.TrimPrefix(l, prefix))
		}
	}
	if len(got) != count {
		t.Fatalf("%s: %d %q lines, want %d:\n%s", who, len(got), prefix, count, strings.Join(lines, "\n"))
	}
	for i, g := range got {
		if want := expectedPing(i, size); g != want {
			t.Fatalf("%s: ping %d: got %q, want %q", who, i, g, want)
		}
	}
}

func TestExecRping(t *testing.T) {
	needProgram(t, "rping", "rdmacm-utils")
	a, b, err := cli.EmbeddedPair(verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	sockA := serveOn(t, a)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const count, size = 20, 100

	for i, sanitize := range []bool{false, true} {
		t.Run(fmt.Sprintf("sanitize=%v", sanitize), func(t *testing.T) {
			port := fmt.Sprint(7174 + 10*i)
			prebuild(t, sanitize)
			s := startServer(t, ctx, b, opts(t, "-s", "-v", "-p", port, "-S", fmt.Sprint(size)))
			p := startProgram(t, execProgram(t, ctx, sockA, sanitize, "rping", "-c", "-a", b.Addr.String(), "-p", port,
				"-C", fmt.Sprint(count), "-S", fmt.Sprint(size), "-V", "-v"))
			if err := p.wait(t, "rping -c", 60*time.Second); err != nil {
				t.Fatal(err)
			}
			checkPingLines(t, "rping -c", p.out.lines(), "ping data: ", count, size)
			if err := waitServer(t, s); err != nil {
				t.Fatal(err)
			}
			checkPingLines(t, "rdmatap ping -s", s.out.lines(), "server ping data: ", count, size)
		})
	}
}

func TestExecRpingServer(t *testing.T) {
	for _, sanitize := range []bool{false, true} {
		t.Run(fmt.Sprintf("sanitize=%v", sanitize), func(t *testing.T) {
			needProgram(t, "rping", "rdmacm-utils")
			a, b, err := cli.EmbeddedPair(verbs.DeviceConfig{})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			defer b.Close()
			sockA := serveOn(t, a)
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			const count, size = 20, 1000
			prebuild(t, sanitize)
			p := startProgram(t, execProgram(t, ctx, sockA, sanitize, "rping", "-s", "-a", a.Addr.String(), "-p", "7175",
				"-S", fmt.Sprint(size), "-v"))
			waitListen(t, b, netip.AddrPortFrom(a.Addr, 7175), p)
			c, err := runClient(b, opts(t, "-c", "-a", a.Addr.String(), "-p", "7175", "-C", fmt.Sprint(count),
				"-S", fmt.Sprint(size), "-V", "-v"))
			if err != nil {
				t.Fatalf("rdmatap ping -c: %v\n%s\nrping -s:\n%s\n%s", err, c.errOut.String(), p.out.String(), p.errOut.String())
			}
			checkPingLines(t, "rdmatap ping -c", c.out.lines(), "ping data: ", count, size)
			if err := p.wait(t, "rping -s", 60*time.Second); err != nil {
				t.Fatal(err)
			}
			checkPingLines(t, "rping -s", p.out.lines(), "server ping data: ", count, size)
		})
	}
}

// TestExecRpingBoth: rping -s and rping -c, each on its own service, the
// two services' devices linked.
func TestExecRpingBoth(t *testing.T) {
	needProgram(t, "rping", "rdmacm-utils")
	a, b, err := cli.EmbeddedPair(verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	sockA, sockB := serveOn(t, a), serveOn(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const count, size = 50, 4096
	prebuild(t, false)
	srv := startProgram(t, execProgram(t, ctx, sockB, false, "rping", "-s", "-a", b.Addr.String(), "-p", "7176",
		"-S", fmt.Sprint(size), "-v"))
	waitListen(t, a, netip.AddrPortFrom(b.Addr, 7176), srv)
	cl := startProgram(t, execProgram(t, ctx, sockA, false, "rping", "-c", "-a", b.Addr.String(), "-p", "7176",
		"-C", fmt.Sprint(count), "-S", fmt.Sprint(size), "-V", "-v"))
	if err := cl.wait(t, "rping -c", 60*time.Second); err != nil {
		t.Fatalf("%v\nserver:\n%s\n%s", err, srv.out.String(), srv.errOut.String())
	}
	checkPingLines(t, "rping -c", cl.out.lines(), "ping data: ", count, size)
	if err := srv.wait(t, "rping -s", 60*time.Second); err != nil {
		t.Fatal(err)
	}
	checkPingLines(t, "rping -s", srv.out.lines(), "server ping data: ", count, size)
}

// clientServer runs a server program on service B, listening on port,
// and once it listens its client on service A; it returns both once they
// exited 0. $A and $B in the arguments stand for the two addresses.
func clientServer(t *testing.T, sanitize bool, port uint16, server, client []string) (srv, cl *program) {
	return clientServerWait(t, sanitize, port, server, client, true)
}

// clientServerWait is clientServer; without waitServer the server (one
// that serves forever) is left running, to be killed at the test's end.
func clientServerWait(t *testing.T, sanitize bool, port uint16, server, client []string, waitServer bool) (srv, cl *program) {
	t.Helper()
	srv, cl, err := clientServerRun(t, sanitize, port, server, client, waitServer)
	if err != nil {
		t.Fatal(err)
	}
	return srv, cl
}

// clientServerRun is clientServerWait returning how the pair failed
// instead of failing the test.
func clientServerRun(t *testing.T, sanitize bool, port uint16, server, client []string, waitServer bool) (srv, cl *program, err error) {
	t.Helper()
	for _, p := range []string{server[0], client[0]} {
		needProgram(t, p, "rdmacm-utils, perftest or qperf")
	}
	a, b, err := cli.EmbeddedPair(verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	sockA, sockB := serveOn(t, a), serveOn(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	t.Cleanup(cancel)
	subst := func(args []string) []string {
		out := make([]string, len(args))
		for i, s := range args {
			out[i] = strings.NewReplacer("$A", a.Addr.String(), "$B", b.Addr.String()).Replace(s)
		}
		return out
	}
	server, client = subst(server), subst(client)
	prebuild(t, sanitize)
	srv = startProgram(t, execProgram(t, ctx, sockB, sanitize, server[0], server[1:]...))
	waitListen(t, a, netip.AddrPortFrom(b.Addr, port), srv)
	cl = startProgram(t, execProgram(t, ctx, sockA, sanitize, client[0], client[1:]...))
	if err := cl.wait(t, client[0], 60*time.Second); err != nil {
		return srv, cl, fmt.Errorf("%v\nserver:\n%s\n%s", err, srv.out.String(), srv.errOut.String())
	}
	if !waitServer {
		return srv, cl, nil
	}
	if err := srv.wait(t, server[0], 60*time.Second); err != nil {
		return srv, cl, fmt.Errorf("%v\nclient:\n%s\n%s", err, cl.out.String(), cl.errOut.String())
	}
	return srv, cl, nil
}

func TestExecUcmatose(t *testing.T) {
	for _, tc := range []struct {
		name     string
		extra    []string
		sanitize bool
	}{{"4 connections", nil, false}, {"migrate", []string{"-m"}, false}, {"sanitized", nil, true}} {
		t.Run(tc.name, func(t *testing.T) {
			srv, cl := clientServer(t, tc.sanitize, 7471,
				append([]string{"ucmatose", "-b", "$B", "-p", "7471", "-c", "4", "-C", "10", "-S", "1000"}, tc.extra...),
				append([]string{"ucmatose", "-s", "$B", "-p", "7471", "-c", "4", "-C", "10", "-S", "1000"}, tc.extra...))
			for _, p := range []*program{srv, cl} {
				if out := p.out.String(); !strings.Contains(out, "data transfers complete") || !strings.Contains(out, "test complete") {
					t.Fatalf("ucmatose:\n%s\n%s", out, p.errOut.String())
				}
			}
		})
	}
}

// TestExecRdmaServerClient: rdma-core's synchronous endpoint examples
// (rdma_create_ep, rdma_get_request, the rdma_verbs.h helpers).
func TestExecRdmaServerClient(t *testing.T) {
	srv, cl := clientServer(t, false, 7480,
		[]string{"rdma_server", "-p", "7480"},
		[]string{"rdma_client", "-s", "$B", "-p", "7480"})
	if !strings.Contains(srv.out.String(), "rdma_server: end 0") || !strings.Contains(cl.out.String(), "rdma_client: end 0") {
		t.Fatalf("server:\n%s\n%s\nclient:\n%s\n%s", srv.out.String(), srv.errOut.String(), cl.out.String(), cl.errOut.String())
	}
}

// TestExecCmtime: cmtime's 16 connections made and torn down at once (its
// server serves until killed).
// (Each connection is charged 16 MiB of the client's service memory:
// cmtime's default of 100 needs up --client-memory above 1.6 GB.)
func TestExecCmtime(t *testing.T) {
	srv, cl := clientServerWait(t, false, 7700,
		[]string{"cmtime", "-b", "$B", "-p", "7700"},
		[]string{"cmtime", "-s", "$B", "-p", "7700", "-c", "16"}, false)
	out := cl.out.String() + cl.errOut.String() + srv.out.String() + srv.errOut.String()
	if strings.Contains(out, "error") || !strings.Contains(cl.out.String(), "connect      :") {
		t.Fatalf("cmtime:\n%s", out)
	}
}

// TestExecPerftest: perftest's programs with rdma_cm (-R), server and
// client each on its own service.
func TestExecPerftest(t *testing.T) {
	for i, prog := range []string{"ib_write_bw", "ib_read_lat", "ib_send_bw"} {
		t.Run(prog, func(t *testing.T) {
			var srv, cl *program
			var err error
			for attempt := 0; ; attempt++ {
				port := 18515 + 10*attempt + i
				p := fmt.Sprint(port)
				srv, cl, err = clientServerRun(t, false, uint16(port),
					[]string{prog, "-R", "-p", p, "-n", "1000"},
					[]string{prog, "-R", "-p", p, "-n", "1000", "$B"}, true)
				if err != nil && attempt < 2 && progtest.PerftestListenRace([]byte(cl.out.String()+cl.errOut.String()), err) {
					t.Logf("%s: perftest's client connected before its server listened, and crashed in its retry; running the pair again\n%v", prog, err)
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				break
			}
			check := []*program{srv, cl}
			if strings.HasSuffix(prog, "_lat") {
				check = check[1:] // the client reports latency
			}
			for _, p := range check {
				if out := p.out.String(); !strings.Contains(out, "rdma_cm QPs\t : ON") || !strings.Contains(out, " 1000 ") {
					t.Fatalf("%s:\n%s\n%s", prog, out, p.errOut.String())
				}
			}
		})
	}
}

// TestExecQperf: qperf -cm1's RC tests (Send, Write, Read, atomics)
// between two services, each run with the CQs polled (-cp1) and waited
// for through completion channels (qperf then ends each test with a
// SIGALRM that must interrupt its wait). qperf's own control connection
// is kernel TCP to the server's address, so both ends run in a network
// namespace whose loopback holds that address (root only); the RDMA
// traffic goes through the services, whose sockets the namespace shares
// with the host.
func TestExecQperf(t *testing.T) {
	needProgram(t, "qperf", "qperf")
	if os.Geteuid() != 0 {
		t.Skip("skipping: qperf's control connection needs a network namespace (root)")
	}
	for _, p := range []string{"unshare", "ip", "bash"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("skipping: %s not found", p)
		}
	}
	a, b, err := cli.EmbeddedPair(verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	sockA, sockB := serveOn(t, a), serveOn(t, b)
	prebuild(t, false)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("skipping: setpriv not found (Debian package util-linux)")
	}
	qperf, _ := exec.LookPath("qperf")
	asNobody := fmt.Sprintf("%s --reuid=%d --regid=%d --clear-groups %s", setpriv, nobody, nobody, qperf)
	// rc_bw and rc_rdma_write_bw stream Sends and RDMA Writes with
	// Immediate, each taking a receive, with no flow control: their
	// client's WRs complete once TCP has the data, and iWARP has no
	// receiver-not-ready retry. A server that falls 1,024 messages (its
	// receives) behind ends the connection with a Terminate, as on any
	// iWARP RNIC, and a busy machine can hold a polling server off the
	// CPU for longer than the client takes to send them. So rc_bw sends
	// 1,000 messages (-n), which the receives its server posts before
	// the test starts hold (qperf then reports no bandwidth: the test
	// checks that all 1,000 arrived), and rc_rdma_write_bw, whose client
	// ignores -n, runs with 1 MiB messages.
	tests := "rc_lat rc_rdma_write_lat rc_rdma_read_bw rc_rdma_read_lat rc_compare_swap_mr rc_fetch_add_mr"
	received := regexp.MustCompile(`(?m)^rc_bw:\n(\s+\S+\s+=.*\n)*\s+recv_msgs\s+=\s+1,000\s*$`)
	for _, mode := range []struct{ name, flag string }{{"poll", "-cp1"}, {"event", ""}} {
		t.Run(mode.name, func(t *testing.T) {
			script := fmt.Sprintf(`set -u
ip link set lo up && ip addr add %[1]s/32 dev lo || exit 1
%[2]s="exec --via %[3]s --cache %[4]s -- %[5]s" %[6]s > "$1/server" 2>&1 &
for i in $(seq 100); do
	%[2]s="exec --via %[7]s --cache %[4]s -- %[5]s %[1]s -cm1 %[9]s -n 1000 -vv rc_bw" %[6]s > "$1/client" 2>&1
	rc=$?
	grep -q "failed to connect" "$1/client" || break
	sleep 0.1
done
[ $rc = 0 ] && %[2]s="exec --via %[7]s --cache %[4]s -- %[5]s %[1]s -cm1 %[9]s -t 1 -m 1m rc_rdma_write_bw" %[6]s >> "$1/client" 2>&1 &&
	%[2]s="exec --via %[7]s --cache %[4]s -- %[5]s %[1]s -cm1 %[9]s -t 1 %[8]s" %[6]s >> "$1/client" 2>&1
rc=$?
kill %%1
exit $rc
`, b.Addr, upChildEnv, sockB, execCache(t), asNobody, self, sockA, tests, mode.flag)
			dir := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			c := exec.CommandContext(ctx, "unshare", "-n", "bash", "-c", script, "qperf-test", dir)
			out, err := c.CombinedOutput()
			client, _ := os.ReadFile(filepath.Join(dir, "client"))
			server, _ := os.ReadFile(filepath.Join(dir, "server"))
			if err != nil {
				t.Fatalf("%v\n%s\nclient:\n%s\nserver:\n%s", err, out, client, server)
			}
			if !received.Match(client) {
				t.Fatalf("qperf rc_bw: not all 1,000 messages received\nclient:\n%s\nserver:\n%s", client, server)
			}
			for _, name := range strings.Fields("rc_rdma_write_bw " + tests) {
				want := "bw  ="
				switch {
				case strings.HasSuffix(name, "_lat"):
					want = "latency  ="
				case strings.HasSuffix(name, "_mr"):
					want = "msg_rate  ="
				}
				i := strings.Index(string(client), name+":")
				if i < 0 || !strings.Contains(string(client[i:]), want) {
					t.Fatalf("qperf %s: no %q\nclient:\n%s\nserver:\n%s", name, want, client, server)
				}
			}
			t.Logf("qperf:\n%s", client)
		})
	}
}

func TestExecEnvFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := cli.Run([]string{"exec", "--", "true"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "--via SOCKET is required") {
		t.Fatalf("exec without --via: exit %d\n%s", code, errOut.String())
	}
	errOut.Reset()
	if code := cli.Run([]string{"exec", "--via", "/nonexistent/rt.sock"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "no program") {
		t.Fatalf("exec without a program: exit %d\n%s", code, errOut.String())
	}
	errOut.Reset()
	notSock := filepath.Join(t.TempDir(), "file")
	os.WriteFile(notSock, nil, 0o644)
	if code := cli.Run([]string{"env", "--via", notSock}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "not a socket") {
		t.Fatalf("env --via a file: exit %d\n%s", code, errOut.String())
	}
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skip("skipping: no C compiler (cc) to build the libraries")
	}
	a, b, err := cli.EmbeddedPair(verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	sock := serveOn(t, a)
	out.Reset()
	errOut.Reset()
	if code := cli.Run([]string{"env", "--via", sock, "--cache", execCache(t)}, &out, &errOut); code != 0 {
		t.Fatalf("env: exit %d\n%s", code, errOut.String())
	}
	dir, err := capi.Build(execCache(t), false)
	if err != nil {
		t.Fatal(err)
	}
	lp := dir
	if old := os.Getenv("LD_LIBRARY_PATH"); old != "" {
		lp += ":" + old
	}
	want := fmt.Sprintf("export LD_LIBRARY_PATH='%s'\nexport RDMATAP_SOCKET='%s'\n", lp, sock)
	if out.String() != want {
		t.Fatalf("env printed\n%s\nwant\n%s", out.String(), want)
	}
}

// TestExecServiceGone: a server waiting for connections learns that the
// service stopped (RDMA_CM_EVENT_DEVICE_REMOVAL) and exits.
func TestExecServiceGone(t *testing.T) {
	needProgram(t, "rping", "rdmacm-utils")
	a, b, err := cli.EmbeddedPair(verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	sock := filepath.Join(worldDir(t), "rt.sock")
	srv := serve(t, a, sock, 16, 16)
	defer srv.Close()
	prebuild(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := startProgram(t, execProgram(t, ctx, sock, false, "rping", "-s", "-a", a.Addr.String(), "-p", "7190"))
	waitListen(t, b, netip.AddrPortFrom(a.Addr, 7190), p)
	srv.Close()
	err = p.wait(t, "rping -s", 20*time.Second)
	if err == nil || !strings.Contains(p.out.String()+p.errOut.String(), "device removal") {
		t.Fatalf("rping -s after the service stopped: %v\n%s\n%s", err, p.out.String(), p.errOut.String())
	}
}

// TestExecRpingPersistent: rping's persistent server (a thread per
// connection) serving three rping clients one after the other, every
// ping verified. (rdma-core 44's persistent server takes the ID of a
// request from a variable the next request overwrites, so clients that
// connect at the same moment can have one ID accepted twice; later
// rdma-core waits between requests.)
func TestExecRpingPersistent(t *testing.T) {
	needProgram(t, "rping", "rdmacm-utils")
	a, b, err := cli.EmbeddedPair(verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	sockA, sockB := serveOn(t, a), serveOn(t, b)
	prebuild(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	srv := startProgram(t, execProgram(t, ctx, sockB, false, "rping", "-s", "-P", "-a", b.Addr.String(), "-p", "7800", "-S", "1000"))
	waitListen(t, a, netip.AddrPortFrom(b.Addr, 7800), srv)
	for i := range 3 {
		c := startProgram(t, execProgram(t, ctx, sockA, false, "rping", "-c", "-a", b.Addr.String(),
			"-p", "7800", "-C", "50", "-S", "1000", "-V", "-v"))
		if err := c.wait(t, fmt.Sprintf("rping -c #%d", i), 60*time.Second); err != nil {
			t.Fatalf("%v\nserver:\n%s\n%s", err, srv.out.String(), srv.errOut.String())
		}
		checkPingLines(t, "rping -c", c.out.lines(), "ping data: ", 50, 1000)
	}
}
