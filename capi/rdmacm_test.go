package capi_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/capi"
)

// TestProgramsLoad checks that Debian's RDMA programs load on the
// libraries built here and nothing else of rdma-core's: librdmacm.so.1,
// libibverbs.so.1 and perftest's libmlx5.so.1 and libefa.so.1 resolve to
// the build, and `ldd -r` finds no symbol unresolved (they are linked
// BIND_NOW: one missing symbol and they do not start).
func TestProgramsLoad(t *testing.T) {
	dir := libs(t, false)
	progs := []struct {
		name, pkg string
		libs      []string
	}{
		{"rping", "rdmacm-utils", []string{"librdmacm.so.1", "libibverbs.so.1"}},
		{"ucmatose", "rdmacm-utils", []string{"librdmacm.so.1", "libibverbs.so.1"}},
		{"cmtime", "rdmacm-utils", []string{"librdmacm.so.1"}},
		{"rdma_server", "rdmacm-utils", []string{"librdmacm.so.1", "libibverbs.so.1"}},
		{"rdma_client", "rdmacm-utils", []string{"librdmacm.so.1", "libibverbs.so.1"}},
		{"qperf", "qperf", []string{"librdmacm.so.1", "libibverbs.so.1"}},
		{"ibv_devices", "ibverbs-utils", []string{"libibverbs.so.1"}},
		{"ibv_devinfo", "ibverbs-utils", []string{"libibverbs.so.1"}},
		{"ibv_asyncwatch", "ibverbs-utils", []string{"libibverbs.so.1"}},
	}
	perf := []string{"librdmacm.so.1", "libibverbs.so.1", "libmlx5.so.1", "libefa.so.1"}
	for _, n := range []string{"ib_write_bw", "ib_write_lat", "ib_read_bw", "ib_read_lat", "ib_send_bw", "ib_send_lat", "ib_atomic_bw", "ib_atomic_lat"} {
		progs = append(progs, struct {
			name, pkg string
			libs      []string
		}{n, "perftest", perf})
	}
	ran := 0
	for _, p := range progs {
		path, err := exec.LookPath(p.name)
		if err != nil {
			t.Logf("%s not installed (Debian package %s)", p.name, p.pkg)
			continue
		}
		ran++
		c := exec.Command("ldd", "-r", path)
		c.Env = append(os.Environ(), "LD_LIBRARY_PATH="+dir)
		out, err := c.CombinedOutput()
		if err != nil {
			t.Errorf("ldd -r %s: %v\n%s", p.name, err, out)
			continue
		}
		for _, l := range p.libs {
			if !bytes.Contains(out, []byte(l+" => "+filepath.Join(dir, l))) {
				t.Errorf("%s does not load the built %s:\n%s", p.name, l, out)
			}
		}
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			if line := sc.Text(); strings.Contains(line, "undefined symbol") || strings.Contains(line, "not found") {
				t.Errorf("%s: %s", p.name, strings.TrimSpace(line))
			}
		}
	}
	if ran == 0 {
		t.Skip("skipping: none of the programs is installed (Debian packages rdmacm-utils, perftest, qperf, ibverbs-utils)")
	}
}

// compileCM builds a test program against both libraries.
func compileCM(t testing.TB, libdir, src string, sanitize bool) string {
	t.Helper()
	return compileLinked(t, libdir, src, sanitize, "-lrdmacm", "-libverbs")
}

// TestCM runs testdata/cm.c: both ends of connections in one process on
// the service's device, through librdmacm's every path a program meets;
// and testdata/cmbind.c: connections from a port chosen at bind and from
// one the service picked, QP-to-ERROR, and DISCONNECTED's status; and
// testdata/cmext.c: connections of QPs made outside the CM (see the
// programs' comments); each also with ASan and UBSan.
func TestCM(t *testing.T) {
	for _, src := range []string{"testdata/cm.c", "testdata/cmbind.c", "testdata/cmext.c"} {
		for _, sanitize := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/sanitize=%v", filepath.Base(src), sanitize), func(t *testing.T) {
				dir := libs(t, sanitize)
				prog := compileCM(t, dir, src, sanitize)
				s := startService(t)
				c := command(t, dir, s.sock, prog, s.addr)
				c.Env = append(c.Env, "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1", "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
				done := make(chan struct{})
				defer close(done)
				go func() {
					select {
					case <-done:
					case <-time.After(60 * time.Second):
						c.Process.Kill()
					}
				}()
				out, err := c.CombinedOutput()
				if err != nil || !bytes.Contains(out, []byte("ok\n")) {
					t.Fatalf("%v\n%s", err, out)
				}
			})
		}
	}
}

// FuzzCMAddr feeds librdmacm's parser of the service's addresses
// (testdata/cmaddr.c, built with ASan and UBSan) arbitrary bytes.
func FuzzCMAddr(f *testing.F) {
	for _, s := range []string{"192.0.2.1:7471", "[fe80::1]:1", "[::]:0", ":7471", "1.2.3.4:65536", "[1.2.3.4]:5", "a:b", ""} {
		f.Add([]byte(s))
	}
	if _, err := exec.LookPath("cc"); err != nil {
		f.Skip("skipping: no C compiler (cc)")
	}
	if _, err := os.Stat("/usr/include/rdma/rdma_cma.h"); err != nil {
		f.Skip("skipping: no librdmacm headers (Debian package librdmacm-dev)")
	}
	prog := filepath.Join(world(f), "cmaddr")
	args := append(append(append([]string{}, capi.CFlags...), "-O1"), capi.SanitizeFlags...)
	args = append(args, "-I", "rdmacm", "-o", prog, "testdata/cmaddr.c", "rdmacm/addr.c")
	if out, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
		f.Fatalf("cc cmaddr.c: %v\n%s", err, out)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c := exec.Command(prog)
		c.Stdin = bytes.NewReader(data)
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("parse %q: %v\n%s", data, err, out)
		}
	})
}
