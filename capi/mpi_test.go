package capi_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"
)

var mpiRow = regexp.MustCompile(`(?m)^(lat|bw) (\d+) ([0-9.]+)$`)

// mpiFigures runs testdata/mpipingpong.c's two ranks under Open MPI's
// mpirun (as the user nobody when the test runs as root), each rank a
// program of rdmatap exec on its own service, over libfabric provider
// prov through Open MPI's ofi MTL, and returns its figures by kind and
// size: latency in µs, bandwidth in MB/s.
func mpiFigures(t *testing.T, mpirun, rdmatap, prog, cache string, l *linkedServices, k fmt.Stringer, prov string, env ...string) map[string]map[int]float64 {
	t.Helper()
	args := []string{"--oversubscribe", "--mca", "pml", "cm", "--mca", "mtl", "ofi", "--mca", "btl", "self",
		"--mca", "mtl_ofi_provider_include", prov}
	for i, s := range []fabricSide{{l.sockA, l.addrA}, {l.sockB, l.addrB}} {
		if i > 0 {
			args = append(args, ":")
		}
		// -x belongs to the application context it is given in: before
		// the first, it reaches the first rank only.
		for _, e := range append([]string{"FI_PROVIDER=" + prov}, env...) {
			args = append(args, "-x", e)
		}
		// The verbs provider finds its device by the kernel's address
		// and 127.0.0.1 (vrb_getifaddrs, the rxm listener's lookup): both
		// stand for the rank's own endpoint; the ranks exchange their
		// endpoints' addresses through Open MPI's runtime.
		args = append(args, "-np", "1", rdmatap, "exec", "--cache", cache, "--via", s.sock,
			"--map", fmt.Sprintf("%s=%s,127.0.0.1=%s", k, s.addr, s.addr), "--", prog)
	}
	var c *exec.Cmd
	if os.Geteuid() == 0 {
		setpriv, err := exec.LookPath("setpriv")
		if err != nil {
			t.Skip("skipping: setpriv not found")
		}
		c = exec.Command(setpriv, append([]string{"--reuid=65534", fmt.Sprintf("--regid=%d", nogroup), "--clear-groups", mpirun}, args...)...)
		c.Env = append(os.Environ(), "HOME="+filepath.Dir(prog))
	} else {
		c = exec.Command(mpirun, args...)
	}
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	err := waitExit(c, done, 5*time.Minute, "mpirun")
	if err != nil {
		t.Fatalf("mpirun over %s: %v\n%s", prov, err, out.String())
	}
	if !bytes.Contains(out.Bytes(), []byte("mpipingpong: every byte checked")) {
		t.Fatalf("mpirun over %s: no end line:\n%s", prov, out.String())
	}
	figs := map[string]map[int]float64{"lat": {}, "bw": {}}
	for _, m := range mpiRow.FindAllStringSubmatch(out.String(), -1) {
		n, _ := strconv.Atoi(m[2])
		v, _ := strconv.ParseFloat(m[3], 64)
		figs[m[1]][n] = v
	}
	// lat: 0 and 1 to 1 MiB doubling; bw: 1 to 1 MiB.
	if len(figs["lat"]) != 22 || len(figs["bw"]) != 21 {
		t.Fatalf("mpirun over %s: %d latency and %d bandwidth rows, want 22 and 21:\n%s", prov, len(figs["lat"]), len(figs["bw"]), out.String())
	}
	return figs
}

// TestMPI runs an MPI job of two unprivileged ranks, each through rdmatap
// exec on its own service of one link, over libfabric's verbs provider
// with ofi_rxm (Open MPI's ofi MTL): testdata/mpipingpong.c's ping-pong
// and bandwidth sweep to 1 MiB, every byte checked; then the same job
// over libfabric's tcp provider (kernel TCP) on the same path, and logs
// both and their ratios.
func TestMPI(t *testing.T) {
	mpirun := installed(t, "mpirun.openmpi", "openmpi-bin")
	mpicc := installed(t, "mpicc.openmpi", "libopenmpi-dev")
	libs(t, false)
	rdmatap := rdmatapBinary(t)
	prog := filepath.Join(world(t), "mpipingpong")
	if out, err := exec.Command(mpicc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-o", prog, "testdata/mpipingpong.c").CombinedOutput(); err != nil {
		t.Fatalf("mpicc mpipingpong.c: %v\n%s", err, out)
	}
	l, k := fabricServices(t)
	// Messages over 128 KiB go by ofi_rxm's rendezvous protocol: the
	// receiver RDMA Reads them.
	verbs := mpiFigures(t, mpirun, rdmatap, prog, cacheDir(t), l, k, "verbs;ofi_rxm")
	tcp := mpiFigures(t, mpirun, rdmatap, prog, cacheDir(t), l, k, "tcp;ofi_rxm")
	for _, n := range []int{0, 8, 64, 1024, 65536, 1 << 20} {
		t.Logf("latency %7d B: verbs %8.2f µs, tcp %8.2f µs, verbs/tcp %.2f×", n, verbs["lat"][n], tcp["lat"][n], verbs["lat"][n]/tcp["lat"][n])
	}
	for _, n := range []int{1024, 65536, 1 << 20} {
		t.Logf("bandwidth %7d B: verbs %8.1f MB/s, tcp %8.1f MB/s, verbs/tcp %.2f×", n, verbs["bw"][n], tcp["bw"][n], verbs["bw"][n]/tcp["bw"][n])
	}
}
