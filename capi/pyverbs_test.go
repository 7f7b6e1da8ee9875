package capi_test

import (
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// rdmaCoreTests is where Debian's python3-pyverbs ships rdma-core's own
// Python test suite (the larger files gzipped).
const rdmaCoreTests = "/usr/share/doc/rdma-core/tests"

// unpackTests copies the shipped suite into a directory every user may
// read, uncompressing the gzipped files.
func unpackTests(t *testing.T) string {
	t.Helper()
	ents, err := os.ReadDir(rdmaCoreTests)
	if err != nil || len(ents) == 0 {
		t.Skipf("skipping: rdma-core's Python tests not installed in %s (Debian package python3-pyverbs)", rdmaCoreTests)
	}
	dir := filepath.Join(world(t), "tests")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		in, err := os.Open(filepath.Join(rdmaCoreTests, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		var r io.Reader = in
		name := e.Name()
		if strings.HasSuffix(name, ".gz") {
			z, err := gzip.NewReader(in)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			r, name = z, strings.TrimSuffix(name, ".gz")
		}
		b, err := io.ReadAll(r)
		in.Close()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// suiteResult is one test's outcome as unittest reports it at verbosity
// 2, with the traceback of a failure or error.
type suiteResult struct {
	id, outcome, reason string
	trace               string // the traceback, and before it what the test printed
}

var (
	// "test_x (tests.mod.Class.test_x)", then maybe the docstring's first
	// line, then " ... ", maybe the test's own output, and the outcome.
	unittestName    = regexp.MustCompile(`^(test\w*) \(([\w.]+)\)`)
	unittestOutcome = regexp.MustCompile(`^(ok|FAIL|ERROR|skipped '(.*)'|skipped "(.*)"|expected failure|unexpected success)$`)
	unittestRan     = regexp.MustCompile(`(?m)^Ran (\d+) tests? in`)
	// "ERROR: test_x (tests.mod.Class.test_x)" heads a traceback, which
	// runs to the next separator line.
	unittestTrace = regexp.MustCompile(`(?ms)^(?:FAIL|ERROR): \S+ \(([\w.]+)\)\n(.*?)\n(?:={70}|-{70}\nRan )`)
)

func parseUnittest(out string) (ran int, rs []*suiteResult) {
	if m := unittestRan.FindStringSubmatch(out); m != nil {
		ran, _ = strconv.Atoi(m[1])
	}
	var cur *suiteResult
	for _, l := range strings.Split(out, "\n") {
		if m := unittestName.FindStringSubmatch(l); m != nil {
			cur = &suiteResult{id: m[2]}
		}
		if cur == nil {
			continue
		}
		if i := strings.Index(l, " ... "); i >= 0 {
			l = l[i+len(" ... "):]
		}
		if m := unittestOutcome.FindStringSubmatch(l); m != nil {
			cur.outcome, cur.reason = strings.Fields(m[1])[0], m[2]+m[3] // Python's repr of the reason
			rs = append(rs, cur)
			cur = nil
		} else {
			cur.trace += l + "\n"
		}
	}
	byID := map[string]*suiteResult{}
	for _, r := range rs {
		byID[r.id] = r
	}
	for _, m := range unittestTrace.FindAllStringSubmatch(out, -1) {
		if r := byID[m[1]]; r != nil {
			r.trace += m[2]
		}
	}
	return ran, rs
}

// pyverbsExpected are the errors the suite meets on rdmatap for a reason
// of iWARP's, not rdmatap's: the traceback's text (what the test printed
// included), the test's ID when the text alone would name more than the
// case meant, and why.
var pyverbsExpected = []struct{ id, trace, why string }{
	{"", "Failed to modify QP state to RTR. Errno: 22",
		"the test connects its RC QPs by modify_qp with the peer's QP number (INIT, RTR, RTS); an iWARP QP is connected only by the CM: " +
			"siw takes RTR as a no-op and refuses RTS without the CM's socket (EINVAL), rdmatap refuses RTR already"},
	{"", "Failed to Create QP. Errno: 95",
		"a UD QP (the CM's UDP port space): iWARP has none; siw's create_qp refuses any type but RC (EOPNOTSUPP)"},
	{"tests.test_rdmacm.CMTestCase.test_rdmacm_async_traffic_external_qp", "Completion status is WR flush error",
		"the test's traffic needs InfiniBand's RNR retry: its client posts its receive only once its Send has completed, and the " +
			"server's reply may arrive first; iWARP has no RNR retry (a Send that finds no receive is DDP's \"no buffer\" Terminate, " +
			"and both QPs flush), so any RNIC may lose the race, and the test passes when it does not"},
}

// expected is why an error is listed in pyverbsExpected, or "".
func expected(r *suiteResult) string {
	if r.outcome != "ERROR" {
		return ""
	}
	for _, e := range pyverbsExpected {
		if (e.id == "" || e.id == r.id) && strings.Contains(r.trace, e.trace) {
			return e.why
		}
	}
	return ""
}

// withNetdev reports whether the suite can run in a mount namespace of its
// own (root, and unshare(1) works here).
func withNetdev(t *testing.T) bool {
	if os.Geteuid() != 0 {
		return false
	}
	un, err := exec.LookPath("unshare")
	if err != nil {
		return false
	}
	return exec.Command(un, "-m", "sh", "-c", "mount -t tmpfs tmpfs /sys/class").Run() == nil
}

// TestPyverbsSuite runs rdma-core's own Python test suite (run_tests.py,
// pyverbs over the libraries) against a service, as the unprivileged
// user nobody when root. It names the device, port 1 and GID index 0 on
// the command line, as one does for siw: the suite otherwise drops every
// GID whose last 8 bytes are zero, and an iWARP GID (siw's and ours) is
// the interface's MAC address followed by zeros. It logs the counts and
// the skip reasons grouped, and fails on any failure or error not listed
// in pyverbsExpected. It then compares the outcomes with the suite's on
// the kernel's siw (compareSiw).
func TestPyverbsSuite(t *testing.T) {
	ran, rs, out := runPyverbs(t)
	counts := map[string]int{}
	skips := map[string][]string{}
	expect := map[string][]string{}
	for _, r := range rs {
		counts[r.outcome]++
		switch r.outcome {
		case "skipped":
			skips[r.reason] = append(skips[r.reason], r.id)
		case "FAIL", "ERROR", "unexpected success":
			if why := expected(r); why != "" {
				expect[why] = append(expect[why], r.id)
				continue
			}
			t.Errorf("%s: %s\n%s", r.outcome, r.id, r.trace)
		}
	}
	t.Logf("run %d, pass %d, fail %d, error %d, skip %d", ran, counts["ok"], counts["FAIL"], counts["ERROR"], counts["skipped"])
	reasons := make([]string, 0, len(skips))
	for r := range skips {
		reasons = append(reasons, r)
	}
	sort.Slice(reasons, func(i, j int) bool { return len(skips[reasons[i]]) > len(skips[reasons[j]]) })
	for _, r := range reasons {
		t.Logf("skipped %3d: %s", len(skips[r]), r)
	}
	for why, ids := range expect {
		t.Logf("expected error %3d: %s: %s", len(ids), why, strings.Join(ids, " "))
	}
	compareSiw(t, rs)
	if t.Failed() && !testing.Verbose() {
		t.Logf("output:\n%s", out)
	}
}

// runPyverbs runs the suite on rdmatap and parses its outcomes.
func runPyverbs(t *testing.T) (ran int, rs []*suiteResult, out []byte) {
	t.Helper()
	if _, err := os.Stat("/usr/lib/python3/dist-packages/pyverbs"); err != nil {
		t.Skip("skipping: pyverbs not installed (Debian package python3-pyverbs)")
	}
	// Debian's own interpreter: pyverbs is in its dist-packages.
	const py = "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skip("skipping: no /usr/bin/python3 (Debian package python3)")
	}
	tests := unpackTests(t)
	dir := libs(t, false)
	s := startService(t)
	c := command(t, dir, s.sock, py, filepath.Join(tests, "run_tests.py"), "-v", "--dev", "rt0", "--port", "1", "--gid", "0")
	c.Dir = tests
	if withNetdev(t) {
		// The CM tests find the device's IP address as rdma-core's
		// base.py does on Linux: the name of the interface in
		// /sys/class/infiniband/<dev>/device/net/ (read by Python, not
		// through libibverbs), then `ip -j addr show` of it. Root gives
		// the device that link in a mount namespace of its own: lo,
		// whose 127.0.0.1 the address map names the device's address.
		un, _ := exec.LookPath("unshare")
		c.Args = append([]string{un, "-m", "sh", "-c", "mount -t tmpfs tmpfs /sys/class && mkdir -p /sys/class/infiniband/rt0/device/net/lo && exec \"$@\"", "sh"}, c.Args...)
		c.Path = un
		c.Env = append(c.Env, "RDMATAP_ADDR_MAP=127.0.0.1="+s.addr)
	} else {
		t.Log("the CM tests skip: no /sys/class/infiniband/rt0/device/net/ (giving the device one takes root and unshare -m)")
	}
	start := time.Now()
	out, err := c.CombinedOutput()
	t.Logf("run_tests.py: %v in %v", err, time.Since(start).Round(time.Second))
	if testing.Verbose() {
		t.Logf("output:\n%s", out)
	}
	ran, rs = parseUnittest(string(out))
	if ran == 0 || len(rs) != ran {
		t.Fatalf("run_tests.py: %d tests ran, %d results parsed:\n%s", ran, len(rs), out)
	}
	return ran, rs, out
}
