package capi_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rdmatap/rdmatap/capi"
	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
)

// cacheDir holds the built libraries, readable by every user (the
// unprivileged clients load them).
func cacheDir(t testing.TB) string {
	d := filepath.Join(os.TempDir(), "rdmatap-capi-test")
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

var (
	buildMu   sync.Mutex
	buildDirs = map[bool]string{}
)

// libs builds the libraries once per test binary and flavour.
func libs(t testing.TB, sanitize bool) string {
	t.Helper()
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skip("skipping: no C compiler (cc)")
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	if d, ok := buildDirs[sanitize]; ok {
		return d
	}
	d, err := capi.Build(cacheDir(t), sanitize)
	if err != nil {
		t.Fatal(err)
	}
	buildDirs[sanitize] = d
	return d
}

// world makes a temporary directory every user may enter.
func world(t testing.TB) string {
	dir, err := os.MkdirTemp("", "capi")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// service serves one end of an in-memory pair on a socket (group nogroup
// when root) and returns the socket's path and the other end's device.
type service struct {
	sock     string
	peer     *verbs.Device // the other end of the link, used from Go
	addr     string        // the service device's IP address
	peerAddr string
}

const nogroup = 65534

func startService(t testing.TB) *service {
	t.Helper()
	na, nb, err := netstack.NewPair(netstack.PairConfig{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := verbs.Open(na, verbs.DeviceConfig{Name: "rt0"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := verbs.Open(nb, verbs.DeviceConfig{Name: "rt1"})
	if err != nil {
		t.Fatal(err)
	}
	gid := -1
	if os.Geteuid() == 0 {
		gid = nogroup
	}
	sock := filepath.Join(world(t), "rt0.sock")
	ln, err := verbs.ListenSocket(sock, gid)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := verbs.Serve(a, ln, verbs.ServeConfig{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Close()
		a.Close()
		b.Close()
		na.Close()
		nb.Close()
	})
	return &service{sock: sock, peer: b, addr: "192.0.2.1", peerAddr: "192.0.2.2"}
}

// command runs a program with the libraries and the service, as the
// unprivileged user nobody when the test runs as root.
func command(t testing.TB, libdir, sock string, name string, args ...string) *exec.Cmd {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		path = name
	}
	var c *exec.Cmd
	if os.Geteuid() == 0 {
		setpriv, err := exec.LookPath("setpriv")
		if err != nil {
			t.Skip("skipping: setpriv not found")
		}
		c = exec.Command(setpriv, append([]string{"--reuid=65534", fmt.Sprintf("--regid=%d", nogroup), "--clear-groups", path}, args...)...)
	} else {
		c = exec.Command(path, args...)
	}
	c.Env = append(os.Environ(), "LD_LIBRARY_PATH="+libdir, "RDMATAP_SOCKET="+sock)
	return c
}

// installed returns the path of an installed program, or skips.
func installed(t testing.TB, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("skipping: %s not installed (Debian package %s)", name, pkg)
	}
	return p
}

// TestProgramsLink checks that Debian's RDMA programs find every
// libibverbs symbol they import, with its version, in the library built
// here (they are linked BIND_NOW: one missing symbol and they do not
// start). Libraries the build does not provide (yet) are reported, not
// failed.
func TestProgramsLink(t *testing.T) {
	dir := libs(t, false)
	provided, err := capi.Libraries()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built: %v", provided)
	progs := []struct{ name, pkg string }{
		{"ibv_devices", "ibverbs-utils"}, {"ibv_devinfo", "ibverbs-utils"}, {"ibv_asyncwatch", "ibverbs-utils"},
		{"rping", "rdmacm-utils"}, {"ucmatose", "rdmacm-utils"}, {"rdma_client", "rdmacm-utils"}, {"rdma_server", "rdmacm-utils"},
		{"ib_write_bw", "perftest"}, {"ib_send_bw", "perftest"}, {"ib_read_lat", "perftest"}, {"qperf", "qperf"},
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
		if !bytes.Contains(out, []byte(filepath.Join(dir, "libibverbs.so.1"))) {
			t.Errorf("%s does not load the built libibverbs:\n%s", p.name, out)
		}
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			line := sc.Text()
			if !strings.Contains(line, "undefined symbol") {
				continue
			}
			// "undefined symbol: NAME, version V\t(OBJECT)"
			obj := line[strings.LastIndex(line, "(")+1:]
			obj = strings.TrimSuffix(obj, ")")
			if obj == path || strings.HasPrefix(obj, dir+"/") {
				t.Errorf("%s: %s", p.name, strings.TrimSpace(line))
			} else {
				t.Logf("%s: not built here yet: %s", p.name, strings.TrimSpace(line))
			}
		}
	}
	if ran == 0 {
		t.Skip("skipping: none of the programs is installed (Debian packages ibverbs-utils, rdmacm-utils, perftest, qperf)")
	}
}

// TestDevinfo lists and queries the service's device with rdma-core's
// ibv_devices and ibv_devinfo -v, unprivileged.
func TestDevinfo(t *testing.T) {
	installed(t, "ibv_devinfo", "ibverbs-utils")
	dir := libs(t, false)
	s := startService(t)
	out, err := command(t, dir, s.sock, "ibv_devices").CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("rt0")) {
		t.Fatalf("ibv_devices: %v\n%s", err, out)
	}
	out, err = command(t, dir, s.sock, "ibv_devinfo", "-v").CombinedOutput()
	if err != nil {
		t.Fatalf("ibv_devinfo -v: %v\n%s", err, out)
	}
	for _, want := range []string{"hca_id:\trt0", "transport:\t\t\tiWARP (1)", "PORT_ACTIVE", "link_layer:\t\tEthernet", "max_qp:\t\t\t\t1024"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("ibv_devinfo -v: no %q in\n%s", want, out)
		}
	}
	// Without a service the device list is empty, not an error.
	out, _ = command(t, dir, filepath.Join(world(t), "none.sock"), "ibv_devices").CombinedOutput()
	if bytes.Contains(out, []byte("rt0")) {
		t.Errorf("ibv_devices without a service:\n%s", out)
	}
}
