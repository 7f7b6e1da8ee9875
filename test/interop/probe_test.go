package interop

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"text/tabwriter"
	"time"
)

// probeCells are the connected cells of probe/probe.c, each run with siw
// as the server and as the client; probeLocal are what siw's user library
// refuses outright (probe local).
var (
	probeCells = []struct{ name, what string }{
		{"sendinv_in", "Send with Invalidate, rdmatap → siw (siw's STag invalidated, a Read of it refused)"},
		{"sendinv_out", "Send with Invalidate, siw → rdmatap (rdmatap's STag invalidated, a Read of it refused)"},
		{"srq", "SRQ on both sides, four Sends each way"},
		{"solicited_in", "Send with Solicited Event, rdmatap → siw, siw's CQ armed solicited-only"},
		{"solicited_out", "Send with Solicited Event, siw → rdmatap (WCSolicited)"},
		{"atomic", "Fetch&Add posted by rdmatap (siw has no atomics: Terminate, both QPs fail, memory unchanged)"},
		{"fastreg", "rdmatap's fast-register MR (REG_MR over a page list, VA-based, then Local Invalidate and zero-based under IncRKey): siw's Writes and Read land in the right pages, the old STag refused"},
		{"read_inv", "RDMA Read with local invalidate by rdmatap from siw: data in the sink's pages, the sink's STag invalid, siw's Write to it refused"},
		{"solicited_notify", "rdmatap's CQ armed solicited-only: one event, for siw's Send with Solicited Event only"},
		{"imm_write", "RDMA Write with Immediate posted by rdmatap (siw has no Immediate Data: an error completion, never success; Terminate, both QPs fail)"},
		{"imm_send", "Send with Immediate posted by rdmatap (as imm_write)"},
	}
	probeLocal = []struct{ name, what string }{
		{"fastreg_siw", "fast registration and memory windows posted by siw's user library"},
		{"local_inv", "Local Invalidate posted by siw's user library"},
		{"read_inv_siw", "RDMA Read with Invalidate posted by siw's user library"},
	}
)

// buildProbe compiles probe.c on the host against Debian's libibverbs-dev
// and librdmacm-dev; the VM runs the binary from its share (same Debian
// release: glibc and rdma-core's libraries match the guest's).
func buildProbe(t *testing.T, dir string) string {
	t.Helper()
	for _, h := range []string{"/usr/include/infiniband/verbs.h", "/usr/include/rdma/rdma_cma.h"} {
		if !exists(h) {
			t.Skipf("skipping the probe: %s is missing (apt-get install libibverbs-dev librdmacm-dev, the rdma-core the VM runs)", h)
		}
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("skipping the probe: no gcc")
	}
	bin := filepath.Join(dir, "probe")
	if out, err := exec.Command("gcc", "-O2", "-Wall", "-Werror", "-Wno-missing-field-initializers", "-o", bin,
		"probe/probe.c", "-lrdmacm", "-libverbs").CombinedOutput(); err != nil {
		t.Fatalf("building probe.c: %v\n%s", err, out)
	}
	return bin
}

// probeLines parses "PREFIX cell STATUS details" lines.
func probeLines(b []byte, prefix string) map[string][2]string {
	m := map[string][2]string{}
	s := bufio.NewScanner(bytes.NewReader(b))
	for s.Scan() {
		f := strings.SplitN(s.Text(), " ", 4)
		if len(f) >= 3 && f[0] == prefix {
			d := ""
			if len(f) == 4 {
				d = f[3]
			}
			m[f[1]] = [2]string{f[2], d}
		}
	}
	return m
}

// TestSiwProbe runs probe.c in the siw VM against rdmatap's probepeer, with
// siw as the server and then as the client. A cell passes only if both
// sides say PASS; a side that cannot take part says SKIP with its reason,
// and the cell is skipped, never passed.
func TestSiwProbe(t *testing.T) {
	e := setup(t)
	start := time.Now()
	out := outDir(t)
	probe := buildProbe(t, out)
	peer := filepath.Join(t.TempDir(), "probepeer")
	if b, err := exec.Command("go", "build", "-o", peer, "./probepeer").CombinedOutput(); err != nil {
		t.Fatalf("building probepeer: %v\n%s", err, b)
	}
	var names []string
	for _, c := range probeCells {
		names = append(names, c.name)
	}
	cells := strings.Join(names, " ")
	plan := fmt.Sprintf("server probe-server 300 /host/%s server %s 18515 %s\n"+
		"exec probe-client 300 /host/%s client %s 18515 %s\n"+
		"exec probe-local 60 /host/%s local\n",
		filepath.Base(probe), vmIP, cells, filepath.Base(probe), ourIP, cells, filepath.Base(probe))
	if os.Getenv("RDMATAP_INTEROP_PCAP") != "" {
		os.WriteFile(filepath.Join(out, "pcap"), nil, 0o644)
	}
	if err := os.WriteFile(filepath.Join(out, "plan.txt"), []byte(plan), 0o644); err != nil {
		t.Fatal(err)
	}
	script, err := filepath.Abs("guest/plan.sh")
	if err != nil {
		t.Fatal(err)
	}
	v := e.bootVMIn(t, out, "fix", 4096, "--script", script, "script")

	runPeer := func(args ...string) []byte {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		full := append([]string{"netns", "exec", e.ns, peer, "-tap", ourTap, "-addr", ourIP + "/24"}, args...)
		b, _ := exec.CommandContext(ctx, "ip", full...).CombinedOutput()
		return b
	}
	// siw serves, rdmatap connects.
	var asClient, asServer []byte
	if v.waitLine(regexp.MustCompile(`READY probe-server\b`), 3*time.Minute) {
		asClient = runPeer(append([]string{"client", vmIP + ":18515"}, names...)...)
	} else {
		t.Errorf("the probe's server never listened:\n%s", tail(v.log.Bytes(), 30))
	}
	if !v.waitLine(regexp.MustCompile(`DONE probe-server\b`), 3*time.Minute) {
		t.Errorf("the probe's server never finished")
	}
	// rdmatap serves, siw connects.
	asServer = runPeer(append([]string{"server", "18515"}, names...)...)
	select {
	case <-v.done:
	case <-time.After(4 * time.Minute):
		t.Errorf("the VM did not power off")
	}
	read := func(name string) []byte { b, _ := os.ReadFile(filepath.Join(out, name+".log")); return b }
	vmServer, vmClient, vmLocal := probeLines(read("probe-server"), "PROBE"), probeLines(read("probe-client"), "PROBE"), probeLines(read("probe-local"), "PROBE")
	if rel, err := os.ReadFile(filepath.Join(out, "info.txt")); err == nil {
		if m := regexp.MustCompile(`rdma_core=(\S+)`).FindSubmatch(rel); m != nil {
			host, _ := exec.Command("dpkg-query", "-W", "-f", "${Version}", "libibverbs-dev").Output()
			t.Logf("rdma-core: VM %s, probe built against libibverbs-dev %s", m[1], host)
			if string(host) != string(m[1]) {
				t.Errorf("the probe was built against rdma-core %s, the VM runs %s", host, m[1])
			}
		}
	}

	type res struct{ role, cell, what, result string }
	var rows []res
	judge := func(role string, ours, theirs map[string][2]string, ourLog, theirLog []byte, cell, what string) {
		t.Run(role+"/"+cell, func(t *testing.T) {
			r := res{role: role, cell: cell, what: what}
			o, okO := ours[cell]
			s, okS := theirs[cell]
			switch {
			case !okO || !okS:
				r.result = "FAIL (no verdict)"
				rows = append(rows, r)
				t.Fatalf("no verdict: rdmatap %v, siw %v\nrdmatap:\n%s\nsiw:\n%s", okO, okS, tail(ourLog, 20), tail(theirLog, 20))
			case o[0] == "FAIL" || s[0] == "FAIL":
				r.result = "FAIL"
				rows = append(rows, r)
				t.Fatalf("rdmatap: %s %s\nsiw: %s %s", o[0], o[1], s[0], s[1])
			case o[0] == "SKIP" || s[0] == "SKIP":
				reason := o[1]
				if s[0] == "SKIP" {
					reason = "siw: " + s[1]
				}
				r.result = "skip: " + reason
				rows = append(rows, r)
				t.Skipf("rdmatap: %s %s; siw: %s %s", o[0], o[1], s[0], s[1])
			}
			r.result = "PASS"
			rows = append(rows, r)
			t.Logf("rdmatap: %s\nsiw: %s", o[1], s[1])
		})
	}
	for _, c := range probeCells {
		judge("siw server", probeLines(asClient, "PEER"), vmServer, asClient, read("probe-server"), c.name, c.what)
	}
	for _, c := range probeCells {
		judge("siw client", probeLines(asServer, "PEER"), vmClient, asServer, read("probe-client"), c.name, c.what)
	}
	// What siw's user library cannot post: its reason, no role.
	for _, c := range probeLocal {
		t.Run("local/"+c.name, func(t *testing.T) {
			var why []string
			if s, ok := vmLocal[c.name]; ok {
				why = append(why, "siw: "+s[1])
				if s[0] == "FAIL" {
					t.Errorf("siw: %s", s[1])
				}
			}
			if _, ok := vmLocal[c.name]; !ok {
				t.Errorf("siw's probe gave no word on %s", c.name)
			}
			rows = append(rows, res{role: "—", cell: c.name, what: c.what, result: "skip: " + strings.Join(why, "; ")})
			t.Skip(strings.Join(why, "; "))
		})
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "siw role\tcell\twhat\tresult")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.role, r.cell, r.what, r.result)
	}
	tw.Flush()
	t.Logf("siw probe (%s):\n%s", time.Since(start).Round(time.Second), b.String())
	fmt.Print(b.String())
}
