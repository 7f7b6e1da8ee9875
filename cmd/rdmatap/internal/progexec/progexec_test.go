package progexec

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
)

// TestExecWithoutTools: `rdmatap exec` on a machine that lacks what its
// libraries are built with says so in one line naming the Debian packages
// to install, not with a compiler's output. A cc on PATH that finds no
// librdmacm headers stands for a machine without librdmacm-dev; a PATH
// without cc for one without gcc.
func TestExecWithoutTools(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "svc.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	fake := filepath.Join(dir, "bin")
	if err := os.Mkdir(fake, 0o755); err != nil {
		t.Fatal(err)
	}
	// Fails (as cc does) on the headers of rdma/, finds all others.
	script := "#!/bin/sh\nPATH=/usr/bin:/bin\nif grep -q '<rdma/'; then\n" +
		"  echo '<stdin>:1:10: fatal error: rdma/rdma_cma.h: No such file or directory' >&2\n" +
		"  echo 'compilation terminated.' >&2\n  exit 1\nfi\nexit 0\n"
	if err := os.WriteFile(filepath.Join(fake, "cc"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, path string
		want       []string // packages named
		not        []string // packages not named
	}{
		{"no librdmacm-dev", fake, []string{"librdmacm-dev"}, []string{"libibverbs-dev", "gcc"}},
		{"no cc", empty, []string{"gcc"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("PATH", c.path)
			var out, errb bytes.Buffer
			code := cli.Run([]string{"exec", "--via", sock, "--cache", filepath.Join(dir, "cache"), "--", "true"}, &out, &errb)
			msg := errb.String()
			if code != 1 {
				t.Fatalf("exit %d, want 1; stderr %q", code, msg)
			}
			if strings.Count(msg, "\n") != 1 || !strings.HasPrefix(msg, "rdmatap exec: ") || !strings.Contains(msg, "apt-get install") {
				t.Fatalf("stderr %q: want one line naming the packages to install", msg)
			}
			for _, p := range c.want {
				if !strings.Contains(msg, p) {
					t.Errorf("stderr %q does not name %s", msg, p)
				}
			}
			for _, p := range c.not {
				if strings.Contains(msg, p) {
					t.Errorf("stderr %q names %s, which is there", msg, p)
				}
			}
			if strings.Contains(msg, "fatal error") {
				t.Errorf("stderr %q carries the compiler's output", msg)
			}
		})
	}
}
