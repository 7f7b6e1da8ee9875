package daemon

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
	"github.com/rdmatap/rdmatap/verbs"
)

// ctlEndpoint is an embedded endpoint for the control server to report on.
func ctlEndpoint(t testing.TB) *cli.Endpoint {
	t.Helper()
	a, b, err := cli.EmbeddedPair(verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a
}

// ctlListen listens on a fresh unix socket in a temporary directory.
func ctlListen(t testing.TB) (net.Listener, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	return ln, path
}

// ctlStat is ctlCall("stat") with a bound on the whole call.
func ctlStat(t testing.TB, path string, within time.Duration) (ctlReply, time.Duration, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	start := time.Now()
	rep, err := ctlCall(ctx, path, "stat")
	return rep, time.Since(start), err
}

// flakyListener fails its first Accepts with the given errors.
type flakyListener struct {
	net.Listener
	mu    sync.Mutex
	errs  []error
	calls int
}

func (l *flakyListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	l.calls++
	if len(l.errs) > 0 {
		err := l.errs[0]
		l.errs = l.errs[1:]
		l.mu.Unlock()
		return nil, err
	}
	l.mu.Unlock()
	return l.Listener.Accept()
}

func acceptErr(errno syscall.Errno) error {
	return &net.OpError{Op: "accept", Net: "unix", Err: os.NewSyscallError("accept4", errno)}
}

// An Accept error (EMFILE above all) must not end the accept loop: it backs
// off and serves again once the error is gone.
func TestCtlAcceptErrorsBackOff(t *testing.T) {
	e := ctlEndpoint(t)
	ln, path := ctlListen(t)
	fl := &flakyListener{Listener: ln, errs: []error{
		acceptErr(syscall.EMFILE), acceptErr(syscall.EMFILE), acceptErr(syscall.EMFILE),
		acceptErr(syscall.ENFILE), acceptErr(syscall.ECONNABORTED), acceptErr(syscall.ENOBUFS),
		&net.OpError{Op: "accept", Net: "unix", Err: os.ErrDeadlineExceeded},
	}}
	var logMu sync.Mutex
	var logs []string
	logf := func(format string, args ...any) {
		logMu.Lock()
		defer logMu.Unlock()
		logs = append(logs, fmt.Sprintf(format, args...))
	}
	s := startCtlServer(fl, "", e, defaultCtlLimits, logf)
	defer s.Close()

	rep, took, err := ctlStat(t, path, 4*time.Second)
	if err != nil {
		t.Fatalf("stat after 7 failed Accepts: %v (the accept loop stopped at the first error?)", err)
	}
	if rep.Stat == nil || rep.Stat.Device != e.Dev.Name() {
		t.Fatalf("stat reply %+v, want the counters of %s", rep, e.Dev.Name())
	}
	fl.mu.Lock()
	calls := fl.calls
	fl.mu.Unlock()
	if calls < 8 {
		t.Fatalf("Accept called %d times, want the 7 failures and a success", calls)
	}
	// 5+10+20+40+80+160+320 ms of back-off before the good Accept.
	if took < 600*time.Millisecond {
		t.Errorf("stat answered after %v: the loop did not back off (want >= 635 ms)", took)
	}
	logMu.Lock()
	if len(logs) != 1 || !strings.Contains(logs[0], "too many open files") {
		t.Errorf("logged %q, want one line for the 7 errors (one per 10 s at most), naming the first", logs)
	}
	logMu.Unlock()

	// The backoff doubles from 5 ms to 1 s; an unknown error waits 1 s.
	var d time.Duration
	want := []time.Duration{5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000}
	for i, w := range want {
		d = acceptBackoff(d, acceptErr(syscall.EMFILE))
		if d != w*time.Millisecond {
			t.Fatalf("backoff %d = %v, want %v", i, d, w*time.Millisecond)
		}
	}
	if d := acceptBackoff(0, errors.New("something else")); d != time.Second {
		t.Errorf("backoff after an unknown error = %v, want 1s", d)
	}

	// Close ends the loop even in the middle of a back-off.
	ln2, _ := ctlListen(t)
	fl2 := &flakyListener{Listener: ln2}
	for range 100 {
		fl2.errs = append(fl2.errs, acceptErr(syscall.EINVAL))
	}
	s2 := startCtlServer(fl2, "", e, defaultCtlLimits, nil)
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	s2.Close()
	if el := time.Since(start); el > 500*time.Millisecond {
		t.Errorf("Close during a 1 s back-off took %v", el)
	}
}

const nofileChildEnv = "RDMATAP_CTL_NOFILE_CHILD"

// The case with real descriptors: up with a low descriptor limit
// and 80 clients holding connections. Accept fails with EMFILE; stat must
// still answer. The endpoint runs in a child process (this test binary
// again) so that only it has the low limit.
func TestCtlSurvivesDescriptorExhaustion(t *testing.T) {
	if path := os.Getenv(nofileChildEnv); path != "" {
		nofileChild(t, path)
		return
	}
	if _, err := os.Stat("/proc/self/fd"); err != nil {
		t.Skip("skipping: /proc/self/fd is missing (the child counts its descriptors there)")
	}
	path := filepath.Join(t.TempDir(), "c.sock")
	cmd := exec.Command(os.Args[0], "-test.run=^TestCtlSurvivesDescriptorExhaustion$", "-test.count=1")
	cmd.Env = append(os.Environ(), nofileChildEnv+"="+path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	var childOut strings.Builder
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			childOut.WriteString(sc.Text() + "\n")
			if sc.Text() == "ready" {
				close(ready)
			}
		}
		exited <- cmd.Wait()
	}()
	defer func() {
		stdin.Close()
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("child: %v\n%s%s", err, childOut.String(), stderr.String())
			}
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			t.Errorf("child did not exit")
		}
	}()
	select {
	case <-ready:
	case err := <-exited:
		t.Fatalf("child exited before serving: %v\n%s%s", err, childOut.String(), stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("child never served")
	}

	// 80 clients connect; the kernel queues them all, and the child runs
	// out of descriptors accepting them. Half send part of a request.
	var clients []net.Conn
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for i := range 80 {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		if i%2 == 1 {
			c.Write([]byte(`{"cmd":"st`))
		}
		clients = append(clients, c)
	}
	rep, took, err := ctlStat(t, path, 4*time.Second)
	if err != nil {
		t.Fatalf("stat with 80 clients and the descriptor limit reached: %v", err)
	}
	if rep.Stat == nil {
		t.Fatalf("stat reply %+v has no counters", rep)
	}
	t.Logf("stat answered in %v with 80 clients holding connections", took)
	for _, c := range clients {
		c.Close()
	}
	clients = nil
	if _, _, err := ctlStat(t, path, 4*time.Second); err != nil {
		t.Fatalf("stat after the clients left: %v", err)
	}
}

// nofileChild serves path with a descriptor limit a few above what it has
// open, until its stdin closes.
func nofileChild(t *testing.T, path string) {
	e := ctlEndpoint(t)
	s, err := serveControl(path, e, defaultCtlLimits, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	lim.Cur = uint64(len(fds) + 4)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("ready\n")
	io.Copy(io.Discard, os.Stdin)
}

// idleClients opens n connections to path; partial ones send half a request.
func idleClients(t *testing.T, path string, n int, partial bool) []net.Conn {
	t.Helper()
	var cs []net.Conn
	for i := range n {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		if partial {
			if _, err := c.Write([]byte(`{"cmd":"sta`)); err != nil {
				t.Fatalf("client %d: %v", i, err)
			}
		}
		cs = append(cs, c)
	}
	return cs
}

func waitAccepted(t *testing.T, s *ctlServer, n uint64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for s.accepted.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("server accepted %d connections, want %d", s.accepted.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// 90 clients that connect and then send nothing, or half a request, hold
// their connections; with a read deadline far away, stat and devinfo must
// still answer at once, and no more than maxConns handlers may run.
func TestCtlIdleClientsDoNotStarveStat(t *testing.T) {
	e := ctlEndpoint(t)
	ln, path := ctlListen(t)
	lim := ctlLimits{maxConns: 64, readTimeout: time.Minute, writeTimeout: 2 * time.Second}
	s := startCtlServer(ln, "", e, lim, nil)
	defer s.Close()

	idle := idleClients(t, path, 45, false)
	idleClients(t, path, 45, true)
	waitAccepted(t, s, 90)

	rep, took, err := ctlStat(t, path, 3*time.Second)
	if err != nil {
		t.Fatalf("stat with 90 idle and partial clients connected: %v", err)
	}
	if rep.Stat == nil || rep.Stat.Device != e.Dev.Name() {
		t.Fatalf("stat reply %+v", rep)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if rep, err := ctlCall(ctx, path, "devinfo"); err != nil || rep.DevInfo == nil {
		t.Fatalf("devinfo with 90 idle and partial clients connected: %+v, %v", rep, err)
	}
	t.Logf("stat answered in %v", took)

	s.mu.Lock()
	peak := s.peak
	s.mu.Unlock()
	if peak > lim.maxConns {
		t.Errorf("%d connections were served at once, the cap is %d", peak, lim.maxConns)
	}
	// stat, the 91st connection, found every slot taken by an idle client.
	if ev := s.evicted.Load(); ev < 91-uint64(lim.maxConns) {
		t.Errorf("%d idle connections were dropped to make room, want at least %d", ev, 91-lim.maxConns)
	}
	// The oldest idle client was the first to go: it sees the connection closed.
	idle[0].SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := idle[0].Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("oldest idle client: read %d, %v; want EOF (dropped to make room)", n, err)
	}

	// Close drops the idle clients: it does not wait out their minute's
	// read deadline (the test would hang past its own timeout).
	s.Close()
}

// The read deadline drops clients that send nothing or half a request.
func TestCtlDeadlinesDropIdleClients(t *testing.T) {
	e := ctlEndpoint(t)
	ln, path := ctlListen(t)
	lim := ctlLimits{maxConns: 64, readTimeout: 200 * time.Millisecond, writeTimeout: time.Second}
	s := startCtlServer(ln, "", e, lim, nil)
	defer s.Close()

	cs := append(idleClients(t, path, 10, false), idleClients(t, path, 10, true)...)
	start := time.Now()
	for i, c := range cs {
		c.SetReadDeadline(start.Add(2 * time.Second))
		n, err := c.Read(make([]byte, 64))
		if !errors.Is(err, io.EOF) {
			t.Fatalf("client %d (partial %v): read %d, %v; want EOF: the server keeps a silent client past its read deadline",
				i, i >= 10, n, err)
		}
	}
	if s.evicted.Load() != 0 {
		t.Errorf("%d connections evicted below the cap", s.evicted.Load())
	}
	if _, _, err := ctlStat(t, path, 3*time.Second); err != nil {
		t.Fatal(err)
	}
}

// useCtlDir points the default control socket directory at dir.
func useCtlDir(t *testing.T, dir func() string) {
	old := defaultCtlDir
	defaultCtlDir = dir
	t.Cleanup(func() { defaultCtlDir = old })
}

// fakeCtl serves fake counters at path, as another user would.
func fakeCtl(t *testing.T, path string) *atomic.Int32 {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			bufio.NewReader(c).ReadBytes('\n')
			c.Write([]byte(`{"stat":{"device":"fake","verbs":{},"ops":{"rx_send":999}}}` + "\n"))
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return &conns
}

func wantUntrusted(t *testing.T, err error, dir, reason string) {
	t.Helper()
	var de *ctlDirError
	if !errors.As(err, &de) {
		t.Errorf("got %v, want the directory refused (%s)", err, reason)
		return
	}
	if de.Dir != dir || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), reason) {
		t.Errorf("error %q, want it to name %s and say %q", err, dir, reason)
	}
}

// The default control socket directory is refused, by up and by its
// clients, unless it is a real directory owned by this user with mode 0700.
func TestCtlDirTrust(t *testing.T) {
	euid := os.Geteuid()
	refused := func(t *testing.T, dir, reason string) {
		t.Helper()
		useCtlDir(t, func() string { return dir })
		_, err := upCtlPath("", "rt0")
		wantUntrusted(t, err, dir, reason)
		// A client does not talk to a socket in it, whoever serves it.
		var conns *atomic.Int32
		if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
			conns = fakeCtl(t, filepath.Join(dir, "rt0.sock"))
		}
		var out, errOut bytes.Buffer
		err = statCmd([]string{"-d", "rt0"}, &out, &errOut)
		if out.Len() > 0 {
			t.Errorf("stat printed counters from a socket in an untrusted directory: %s", out.String())
		}
		wantUntrusted(t, err, dir, reason)
		if conns != nil && conns.Load() != 0 {
			t.Errorf("stat connected to the socket in the untrusted directory")
		}
		if _, err := clientCtlPath("", "rt0"); err == nil {
			t.Error("clientCtlPath accepted the directory")
		}
	}
	t.Run("mode-0755", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "ctl")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		refused(t, dir, "mode 0755")
	})
	t.Run("mode-0710", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "ctl")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o710); err != nil {
			t.Fatal(err)
		}
		refused(t, dir, "mode 0710")
	})
	t.Run("symlink", func(t *testing.T) {
		base := t.TempDir()
		real := filepath.Join(base, "real")
		if err := os.Mkdir(real, 0o700); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(base, "ctl")
		if err := os.Symlink(real, link); err != nil {
			t.Fatal(err)
		}
		refused(t, link, "symbolic link")
	})
	t.Run("not-a-directory", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "ctl")
		if err := os.WriteFile(file, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		refused(t, file, "not a directory")
	})
	t.Run("other-owner", func(t *testing.T) {
		if euid != 0 {
			t.Skip("skipping: a directory owned by another user needs root to make (chown)")
		}
		dir := filepath.Join(t.TempDir(), "ctl")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dir, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		refused(t, dir, "owned by uid 65534")
	})
	t.Run("created-0700", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "ctl")
		useCtlDir(t, func() string { return dir })
		// No directory yet: a client says no endpoint runs.
		var out, errOut bytes.Buffer
		if err := statCmd([]string{"-d", "rt0"}, &out, &errOut); err == nil || !strings.Contains(err.Error(), "no endpoint is running") {
			t.Fatalf("stat without the directory: %v", err)
		}
		path, err := upCtlPath("", "rt0")
		if err != nil {
			t.Fatal(err)
		}
		if path != filepath.Join(dir, "rt0.sock") {
			t.Fatalf("socket %s, want it in %s", path, dir)
		}
		fi, err := os.Lstat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o700 || !fi.IsDir() {
			t.Fatalf("up made %s with mode %v, want a directory with 0700", dir, fi.Mode())
		}
		if uid := fi.Sys().(*syscall.Stat_t).Uid; int(uid) != euid {
			t.Fatalf("%s is owned by %d, want %d", dir, uid, euid)
		}
		// Again, with the directory there: accepted, and stat reaches up.
		if _, err := upCtlPath("", "rt0"); err != nil {
			t.Fatal(err)
		}
		e := ctlEndpoint(t)
		s, err := serveControl(path, e, defaultCtlLimits, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		out.Reset()
		if err := statCmd([]string{"-d", "rt0"}, &out, &errOut); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(out.String(), "link "+e.Dev.Name()+"/1 ") {
			t.Fatalf("stat printed %q", out.String())
		}
	})
	t.Run("bad-device-name", func(t *testing.T) {
		useCtlDir(t, func() string { return t.TempDir() })
		for _, name := range []string{"../x", "a/b", "..", ""} {
			if _, err := upCtlPath("", name); !errors.Is(err, cli.ErrUsage) {
				t.Errorf("up with device name %q: %v, want a usage error", name, err)
			}
			if _, err := clientCtlPath("", name); !errors.Is(err, cli.ErrUsage) {
				t.Errorf("stat with device name %q: %v, want a usage error", name, err)
			}
		}
	})
	t.Run("explicit-ctl", func(t *testing.T) {
		// --ctl is the user's choice: used as given, whatever its directory.
		dir := t.TempDir()
		os.Chmod(dir, 0o755)
		p := filepath.Join(dir, "x.sock")
		if got, err := upCtlPath(p, "rt0"); err != nil || got != p {
			t.Fatalf("upCtlPath(%s) = %s, %v", p, got, err)
		}
		if got, err := clientCtlPath(p, "rt0"); err != nil || got != p {
			t.Fatalf("clientCtlPath(%s) = %s, %v", p, got, err)
		}
	})
}

// Without root, the directory is $XDG_RUNTIME_DIR/rdmatap when that is set,
// else /tmp/rdmatap-UID; root's is /run/rdmatap.
func TestCtlDirXDG(t *testing.T) {
	for _, c := range []struct {
		euid     int
		xdg, tmp string
		want     string
	}{
		{1000, "/run/user/1000", "/tmp", "/run/user/1000/rdmatap"},
		{1000, "", "/tmp", "/tmp/rdmatap-1000"},
		{1000, "relative/dir", "/tmp", "/tmp/rdmatap-1000"},
		{0, "/run/user/0", "/tmp", "/run/rdmatap"},
	} {
		if got := ctlDirFor(c.euid, c.euid, c.xdg, c.tmp); got != c.want {
			t.Errorf("ctlDirFor(%d, xdg %q) = %s, want %s", c.euid, c.xdg, got, c.want)
		}
	}
	xdg := t.TempDir()
	t.Setenv("XDG_RUNTIME_DIR", xdg)
	if os.Geteuid() != 0 {
		if got := defaultCtlDir(); got != filepath.Join(xdg, "rdmatap") {
			t.Fatalf("defaultCtlDir() = %s with XDG_RUNTIME_DIR=%s", got, xdg)
		}
	} else if got := defaultCtlDir(); got != "/run/rdmatap" {
		t.Fatalf("defaultCtlDir() = %s as root, want /run/rdmatap", got)
	}
	// As a user would: up makes $XDG_RUNTIME_DIR/rdmatap private and serves there.
	useCtlDir(t, func() string {
		return ctlDirFor(1000, 1000, os.Getenv("XDG_RUNTIME_DIR"), os.TempDir())
	})
	path, err := upCtlPath("", "rt0")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(xdg, "rdmatap", "rt0.sock"); path != want {
		t.Fatalf("socket %s, want %s", path, want)
	}
	fi, err := os.Lstat(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Fatalf("%s has mode %v, want 0700", filepath.Dir(path), fi.Mode())
	}
	if err := checkCtlDir(filepath.Dir(path)); err != nil {
		t.Fatal(err)
	}
	if err := checkCtlDir(filepath.Join(xdg, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("checkCtlDir(missing) = %v, want fs.ErrNotExist", err)
	}
}
