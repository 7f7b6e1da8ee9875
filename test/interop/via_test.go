package interop

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestSiwViaService runs rping and perftest's bandwidth programs against
// siw with rdmatap's side a process without privileges (nobody, dropped
// with setpriv) that uses, with --via, the device a running `rdmatap up
// --socket` serves on the harness's TAP: ping, bw and lat as clients of
// the service, against a real iWARP peer.
func TestSiwViaService(t *testing.T) {
	e := setup(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("skipping: setpriv (util-linux) is missing")
	}
	svc := e.startService(t)
	bin := filepath.Join(svc.dir, "rdmatap")
	if data, err := os.ReadFile(e.bin); err != nil || os.WriteFile(bin, data, 0o755) != nil {
		t.Fatalf("copying rdmatap: %v", err)
	}
	sock := svc.sock
	nobody := func(d time.Duration, args ...string) ([]byte, error) {
		cctx, ccancel := context.WithTimeout(context.Background(), d)
		defer ccancel()
		c := exec.CommandContext(cctx, setpriv, append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", bin}, append(args, "--via", sock)...)...)
		return c.CombinedOutput()
	}
	tests := []string{"rping", "write", "read", "send"}
	siwSide := func(v *vm) {
		select {
		case <-v.done:
		case <-time.After(3 * time.Minute):
		}
		for test, res := range v.results() {
			t.Logf("VM side %s: %s", test, res)
			if res != "PASS" {
				t.Errorf("VM side %s: %s", test, res)
			}
		}
	}
	t.Run("vm-server", func(t *testing.T) {
		v := e.bootVM(t, "fix", 4096, append([]string{"server"}, tests...)...)
		for _, test := range tests {
			if !v.waitReady(t, test) {
				t.Errorf("%s: VM server never ready:\n%s", test, tail(v.log.Bytes(), 30))
				continue
			}
			args := []string{"bw", test, vmIP, "-F", "-R", "-s", "4096", "-n", "20"}
			if test == "rping" {
				args = []string{"ping", "-c", "-a", vmIP, "-C", "5", "-v", "-V"}
			}
			if out, err := nobody(2*time.Minute, args...); err != nil {
				t.Errorf("%s as nobody through the service against siw: %v\n%s", test, err, out)
				continue
			}
			t.Logf("%s through the service, client: passed", test)
		}
		siwSide(v)
	})
	t.Run("vm-client", func(t *testing.T) {
		v := e.bootVM(t, "fix", 4096, append([]string{"client", ourIP}, tests...)...)
		for _, test := range tests {
			args := []string{"bw", test, "-F", "-R", "-s", "4096", "-n", "20"}
			if test == "rping" {
				args = []string{"ping", "-s", "-a", ourIP, "-C", "5", "-v"}
			}
			if out, err := nobody(3*time.Minute, args...); err != nil {
				t.Errorf("%s as nobody through the service, serving siw: %v\n%s", test, err, out)
				continue
			}
			t.Logf("%s through the service, server: passed", test)
		}
		siwSide(v)
	})
	svc.checkNobody(t)
}

// service is a running `rdmatap up --socket` on the harness's TAP, in the
// test's namespace, whose socket the user nobody may use.
type service struct {
	dir  string // world-readable; holds the socket
	sock string
	out  *syncBuilder // up's output
}

// startService starts `rdmatap up --socket` on sitap0 (10.77.0.3), the
// socket's group nobody's; the test's cleanup stops it.
func (e *env) startService(t *testing.T) *service {
	t.Helper()
	dir, err := os.MkdirTemp("", "rdmatap-via")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	s := &service{dir: dir, sock: filepath.Join(dir, "svc.sock"), out: &syncBuilder{}}
	ctx, cancel := context.WithCancel(context.Background())
	up := exec.CommandContext(ctx, "ip", "netns", "exec", e.ns, e.bin, "up", "--socket", s.sock, "--socket-group", "65534",
		"--ctl", filepath.Join(dir, "ctl.sock"), "--tap", ourTap, "--addr", ourIP+"/24")
	up.Stdout, up.Stderr = s.out, s.out
	if err := up.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		up.Wait()
	})
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(s.sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no service socket after 15 s:\n%s", s.out.String())
		}
	}
	return s
}

// checkNobody checks that up logged a client of uid nobody.
func (s *service) checkNobody(t *testing.T) {
	t.Helper()
	if !strings.Contains(s.out.String(), "uid 65534") {
		t.Errorf("up did not log the client's uid:\n%s", s.out.String())
	}
}

// syncBuilder is a strings.Builder two streams write to.
type syncBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuilder) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuilder) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
