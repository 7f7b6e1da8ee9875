package capi_test

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
)

// pyverbsSiwLog is the suite's verbose output on the kernel's siw: Debian's
// 6.1 kernel, rdma-core 44.0-2, as the user nobody, run_tests.py -v --dev
// siw0 --port 1 --gid 0, with siw0 given /sys/class/infiniband/siw0/
// device/net/eth0 as TestPyverbsSuite gives rdmatap's device its
// interface. test/interop's TestSiwPyverbs records it in the siw VM
// (RDMATAP_INTEROP_PYVERBS_UPDATE=1); RDMATAP_PYVERBS_SIW names another.
const pyverbsSiwLog = "testdata/pyverbs-siw.log"

// pyverbsSiwOnly lists, by ID and with the reason, the tests that may
// pass on siw and not on rdmatap. Any other such test fails
// TestPyverbsSuite.
var pyverbsSiwOnly = map[string]string{}

// outcomeDiff is a test whose outcome, or whose reason to skip, differs
// between two runs; nil is a test one run does not have.
type outcomeDiff struct {
	id        string
	siw, ours *suiteResult
}

// siwOnly reports whether the test passes on siw and not on rdmatap.
func (d outcomeDiff) siwOnly() bool {
	return d.siw != nil && d.siw.outcome == "ok" && (d.ours == nil || d.ours.outcome != "ok")
}

// compareOutcomes returns the tests whose outcomes differ, by ID.
func compareOutcomes(siw, ours []*suiteResult) []outcomeDiff {
	by := map[string]*outcomeDiff{}
	for _, r := range siw {
		by[r.id] = &outcomeDiff{id: r.id, siw: r}
	}
	for _, r := range ours {
		if d := by[r.id]; d != nil {
			d.ours = r
		} else {
			by[r.id] = &outcomeDiff{id: r.id, ours: r}
		}
	}
	var ds []outcomeDiff
	for _, d := range by {
		if d.siw != nil && d.ours != nil && d.siw.outcome == d.ours.outcome && d.siw.reason == d.ours.reason {
			continue
		}
		ds = append(ds, *d)
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i].id < ds[j].id })
	return ds
}

// column is a run's counts.
func column(rs []*suiteResult) string {
	n := map[string]int{}
	for _, r := range rs {
		n[r.outcome]++
	}
	return fmt.Sprintf("run %d, pass %d, fail %d, error %d, skip %d", len(rs), n["ok"], n["FAIL"], n["ERROR"], n["skipped"])
}

// describe is an outcome with its reason: the skip's, or a failure's
// exception and what the suite's CM players reported.
func describe(r *suiteResult) string {
	switch {
	case r == nil:
		return "not run"
	case r.outcome == "skipped":
		return fmt.Sprintf("skipped %q", r.reason)
	case r.outcome == "ok":
		return "ok"
	}
	var why []string
	last := ""
	for _, l := range strings.Split(r.trace, "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "Player ") {
			why = append(why, l)
		}
		if l != "" {
			last = l
		}
	}
	why = append(why, last)
	return r.outcome + " (" + strings.Join(why, "; ") + ")"
}

// compareSiw compares rdmatap's outcomes with siw's (pyverbsSiwLog): it
// logs both columns and every test whose outcome or skip reason differs,
// and fails for a test that passes on siw and not on rdmatap unless
// pyverbsSiwOnly lists it.
func compareSiw(t *testing.T, ours []*suiteResult) {
	path := os.Getenv("RDMATAP_PYVERBS_SIW")
	if path == "" {
		path = pyverbsSiwLog
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("the siw column: %v", err)
		return
	}
	ran, siw := parseUnittest(string(b))
	if ran == 0 || len(siw) != ran {
		t.Errorf("the siw column (%s): %d tests ran, %d results parsed", path, ran, len(siw))
		return
	}
	t.Logf("siw:     %s (%s)", column(siw), path)
	t.Logf("rdmatap: %s", column(ours))
	for _, d := range compareOutcomes(siw, ours) {
		line := fmt.Sprintf("%s: siw %s, rdmatap %s", d.id, describe(d.siw), describe(d.ours))
		switch why, listed := pyverbsSiwOnly[d.id]; {
		case d.siwOnly() && listed:
			t.Logf("passes on siw only (%s): %s", why, line)
		case d.siwOnly():
			t.Errorf("passes on siw, not on rdmatap: %s", line)
		default:
			t.Logf("differs: %s", line)
		}
	}
}

// TestCompareOutcomes compares two small runs: a different skip reason,
// a pass on one side only each way, a test one side lacks.
func TestCompareOutcomes(t *testing.T) {
	siwOut := `test_a (tests.m.C.test_a) ... ok
test_b (tests.m.C.test_b) ... skipped 'Atomic operations are not supported'
test_c (tests.m.C.test_c)
Doc line ... ok
test_d (tests.m.C.test_d) ... Player active got: boom
ERROR
test_e (tests.m.C.test_e) ... ok

======================================================================
ERROR: test_d (tests.m.C.test_d)
----------------------------------------------------------------------
Traceback (most recent call last):
Exception: Exception in active/passive side occurred

----------------------------------------------------------------------
Ran 5 tests in 0.1s
`
	oursOut := `test_a (tests.m.C.test_a) ... ok
test_b (tests.m.C.test_b) ... skipped 'Create XRCD is not supported'
test_c (tests.m.C.test_c)
Doc line ... ERROR
test_d (tests.m.C.test_d) ... ok

======================================================================
ERROR: test_c (tests.m.C.test_c)
----------------------------------------------------------------------
Traceback (most recent call last):
pyverbs.pyverbs_error.PyverbsRDMAError: Failed to modify QP state to RTR. Errno: 22, Invalid argument

----------------------------------------------------------------------
Ran 4 tests in 0.1s
`
	_, siw := parseUnittest(siwOut)
	_, ours := parseUnittest(oursOut)
	var got []string
	for _, d := range compareOutcomes(siw, ours) {
		got = append(got, fmt.Sprintf("%s siwOnly=%v: siw %s, rdmatap %s", d.id, d.siwOnly(), describe(d.siw), describe(d.ours)))
	}
	want := []string{
		`tests.m.C.test_b siwOnly=false: siw skipped "Atomic operations are not supported", rdmatap skipped "Create XRCD is not supported"`,
		`tests.m.C.test_c siwOnly=true: siw ok, rdmatap ERROR (pyverbs.pyverbs_error.PyverbsRDMAError: Failed to modify QP state to RTR. Errno: 22, Invalid argument)`,
		`tests.m.C.test_d siwOnly=false: siw ERROR (Player active got: boom; Exception: Exception in active/passive side occurred), rdmatap ok`,
		`tests.m.C.test_e siwOnly=true: siw ok, rdmatap not run`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if c := column(siw); c != "run 5, pass 3, fail 0, error 1, skip 1" {
		t.Errorf("siw column: %s", c)
	}
}
