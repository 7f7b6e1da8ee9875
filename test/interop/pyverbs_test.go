package interop

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// capiLogLine is a line capi's pyverbs tests log (go test -v), not the
// suite's output they log with it.
var capiLogLine = regexp.MustCompile(`^\s+pyverbs_(siw_)?test\.go:\d+: |^(---|===|FAIL|ok|PASS)\b`)

// TestSiwPyverbs runs rdma-core's Python test suite (python3-pyverbs'
// run_tests.py -v) on siw in the VM (the pyverbs initramfs, guest/
// pyverbs.sh: as nobody, siw0 given device/net/eth0), then capi's
// TestPyverbsSuite, the suite on rdmatap, with that output as its siw
// column (RDMATAP_PYVERBS_SIW): it logs both columns and every test whose
// outcome or skip reason differs, and fails when a test that passes on
// siw does not pass on rdmatap (unless capi's pyverbsSiwOnly lists it).
// RDMATAP_INTEROP_PYVERBS_UPDATE=1 also copies the output to capi's
// recorded column, capi/testdata/pyverbs-siw.log.
func TestSiwPyverbs(t *testing.T) {
	e := setup(t)
	b := exec.Command("bash", filepath.Join(e.harness, "build.sh"))
	b.Env = append(os.Environ(), "SIWVM_PYVERBS=1")
	if out, err := b.CombinedOutput(); err != nil {
		t.Fatalf("building the pyverbs initramfs: %v\n%s", err, tail(out, 20))
	}
	v := e.bootVMIn(t, outDir(t), "fix", 4096, "--pyverbs", "--wait", "480", "pyverbs")
	<-v.done
	log := filepath.Join(v.out, "pyverbs.log")
	res, _ := os.ReadFile(filepath.Join(v.out, "results.txt"))
	var summary string
	for _, l := range strings.Split(string(res), "\n") {
		if strings.HasPrefix(l, "RESULT pyverbs ") {
			summary = l
		}
	}
	t.Logf("siw: %s", summary)
	if !strings.HasPrefix(summary, "RESULT pyverbs PASS ") || !exists(log) {
		t.Fatalf("the suite did not run to its end on siw:\n%s", tail(v.log.Bytes(), 40))
	}
	if os.Getenv("RDMATAP_INTEROP_PYVERBS_UPDATE") != "" {
		data, err := os.ReadFile(log)
		if err == nil {
			err = os.WriteFile(filepath.Join("..", "..", "capi", "testdata", "pyverbs-siw.log"), data, 0o644)
		}
		if err != nil {
			t.Fatalf("updating capi's siw column: %v", err)
		}
	}

	c := exec.Command("go", "test", "-count=1", "-run", "^TestPyverbsSuite$", "-v", "../../capi")
	c.Env = append(os.Environ(), "RDMATAP_PYVERBS_SIW="+log)
	out, err := c.CombinedOutput()
	var skip string
	s := bufio.NewScanner(bytes.NewReader(out))
	s.Buffer(nil, 1<<24)
	for s.Scan() {
		l := s.Text()
		if !capiLogLine.MatchString(l) || strings.Contains(l, ": output:") {
			continue
		}
		t.Log(strings.TrimSpace(l))
		if strings.Contains(l, "skipping: ") {
			skip = l
		}
	}
	switch {
	case bytes.Contains(out, []byte("--- SKIP: TestPyverbsSuite")):
		t.Skipf("rdmatap's column: %s", strings.TrimSpace(skip))
	case err != nil:
		t.Errorf("capi's TestPyverbsSuite against siw's column: %v\n%s", err, tail(out, 40))
	}
}
