package interop

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"
)

// perftestTests are the six perftest programs, in the order a VM runs
// them.
var perftestTests = []struct{ name, kind, verb string }{
	{"write_bw", "bw", "write"}, {"read_bw", "bw", "read"}, {"send_bw", "bw", "send"},
	{"write_lat", "lat", "write"}, {"read_lat", "lat", "read"}, {"send_lat", "lat", "send"},
}

// perftestSweep is what every cell runs: perftest's -a (23 sizes, 2 B to
// 8 MiB) with 5 iterations a size (perftest's minimum). Under qemu's TCG
// an 8 MiB message takes about half a second each way, so one VM's six
// sweeps take 1.5 to 2 minutes. RDMATAP_INTEROP_SWEEP=short runs one size
// (-s 65536) instead, for a quick check.
func perftestSweep() (args []string, label string, rows int) {
	if os.Getenv("RDMATAP_INTEROP_SWEEP") == "short" {
		return []string{"-s", "65536", "-n", "5"}, "-s 65536 -n 5", 1
	}
	return []string{"-a", "-n", "5"}, "-a -n 5 (2 B–8 MiB)", 23
}

// perftestPlan is the cells one VM runs: perftestTests, or the ones
// RDMATAP_INTEROP_ONLY names (comma-separated, e.g. read_lat,send_lat),
// each RDMATAP_INTEROP_REPEAT times (default once). A repeat's name gets
// a suffix (read_lat_2, read_lat_3, ...), so that its log and result
// lines are its own. The two are for chasing a cell that fails rarely.
func perftestPlan(t *testing.T) []perftestCell {
	only := map[string]bool{}
	if s := os.Getenv("RDMATAP_INTEROP_ONLY"); s != "" {
		for _, n := range strings.Split(s, ",") {
			only[strings.TrimSpace(n)] = true
		}
	}
	repeat := 1
	if s := os.Getenv("RDMATAP_INTEROP_REPEAT"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 100 {
			t.Fatalf("RDMATAP_INTEROP_REPEAT=%q: want a count from 1 to 100", s)
		}
		repeat = n
	}
	var cells []perftestCell
	for _, c := range perftestTests {
		if len(only) > 0 && !only[c.name] {
			continue
		}
		for i := 1; i <= repeat; i++ {
			cell := perftestCell{name: c.name, test: c.name, kind: c.kind, verb: c.verb}
			if i > 1 {
				cell.name += "_" + strconv.Itoa(i)
			}
			cells = append(cells, cell)
		}
	}
	for n := range only {
		if !slices.ContainsFunc(perftestTests, func(c struct{ name, kind, verb string }) bool { return c.name == n }) {
			t.Fatalf("RDMATAP_INTEROP_ONLY names %q, which is not a perftest program", n)
		}
	}
	return cells
}

// perftestCell is one run of a perftest program: name is its label in
// the VM's plan (its log, its READY/DONE/RESULT lines), test the
// program (write_bw, ...).
type perftestCell struct{ name, test, kind, verb string }

// resultRow matches a perftest result line: size, iterations, numbers.
// A number may be "inf" or "-nan": the guest's perftest has printed a
// 2-byte row of infinities on a loaded host (its clock saw no time pass),
// after a run that was otherwise whole.
var resultRow = regexp.MustCompile(`(?m)^ \d+\s+\d+\s+(?:[\d.]+|inf|-?nan)\s+(?:[\d.]+|inf|-?nan)`)

// tableRows wants the number of result rows a side prints with a sweep
// of n sizes, or -1 when it prints a summary only: a client prints a
// row a size; so do the servers of write_lat and send_lat; ib_read_lat's
// server prints none, and a bw server the client's report (write, read)
// or its own rows (send), which is not checked.
func tableRows(client bool, test string, n int) int {
	switch {
	case client, test == "write_lat", test == "send_lat":
		return n
	case test == "read_lat":
		return 0
	}
	return -1
}

// TestSiwPerftest runs ib_{write,read,send}_{bw,lat} against siw in both
// roles, CRC off (the fix build) and on (the crc build, which requires
// it), each over perftest's whole size sweep. A cell passes only when
// both sides exit 0 and print a result row for every size.
func TestSiwPerftest(t *testing.T) {
	e := setup(t)
	start := time.Now()
	for _, variant := range []string{"fix", "crc"} {
		for _, role := range []string{"vm-server", "vm-client"} {
			t.Run(variant+"/"+role, func(t *testing.T) { e.perftestCells(t, variant, role) })
		}
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "peer\trole\toperation\tCRC\tMPA\tresult")
	for _, r := range e.results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.peer, r.role, r.op, r.crc, r.mpa, r.result)
	}
	tw.Flush()
	t.Logf("siw perftest matrix (%s):\n%s", time.Since(start).Round(time.Second), b.String())
	fmt.Print(b.String())
}

// perftestCells boots one VM that runs the six programs in one role.
func (e *env) perftestCells(t *testing.T, variant, role string) {
	crc, mpa, extra := variantFlags(variant)
	sweep, label, nrows := perftestSweep()
	vmServes := role == "vm-server"
	out := outDir(t)
	if os.Getenv("RDMATAP_INTEROP_PCAP") != "" {
		os.WriteFile(filepath.Join(out, "pcap"), nil, 0o644)
	}
	cells := perftestPlan(t)
	var plan strings.Builder
	for i, c := range cells {
		if i > 0 && os.Getenv("RDMATAP_INTEROP_NICRESET") != "" {
			// A check of the guest's NIC reset (guest/plan.sh).
			fmt.Fprintf(&plan, "nicreset %s\n", c.name)
		}
		cmd := "ib_" + c.test + " -R -d siw0 -F " + strings.Join(sweep, " ")
		if vmServes {
			fmt.Fprintf(&plan, "server %s 240 %s\n", c.name, cmd)
		} else {
			fmt.Fprintf(&plan, "client %s 240 %s %s\n", c.name, cmd, ourIP)
		}
	}
	if err := os.WriteFile(filepath.Join(out, "plan.txt"), []byte(plan.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	script, err := filepath.Abs("guest/plan.sh")
	if err != nil {
		t.Fatal(err)
	}
	v := e.bootVMIn(t, out, variant, 4096, "--script", script, "script")
	ourRole := "rdmatap client"
	if !vmServes {
		ourRole = "rdmatap server"
	}
	var rows []row
	// nicStalled marks the cells after which the VM's NIC had stopped
	// transmitting: the guest found it so and reset it ("NIC STALLED
	// name" on its console), or it answered none of the host's pings.
	nicStalled := map[int]string{}
	for i, c := range cells {
		r := row{peer: "siw (" + variant + ")", role: ourRole, op: "ib_" + c.test + " " + label, crc: crc, mpa: mpa, result: "FAIL"}
		if vmServes && !v.waitLine(regexp.MustCompile(`READY `+c.name+`\b`), 3*time.Minute) {
			r.result = "FAIL (VM server never ready)"
			t.Errorf("%s: VM server never ready:\n%s", c.name, tail(v.log.Bytes(), 30))
			rows = append(rows, r)
			continue
		}
		args := []string{c.kind, c.verb}
		if vmServes {
			args = append(args, vmIP)
		}
		args = append(append(append(args, "-F", "-R"), sweep...), "--timeout", "60s")
		if os.Getenv("RDMATAP_INTEROP_OURPCAP") != "" {
			args = append(args, "--pcap", filepath.Join(out, c.name+".rdmatap.pcap"))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		t0 := time.Now()
		got, err := e.ours(ctx, append(args, extra...)...)
		cancel()
		// Wait for the VM's side of the cell to end (a server rdmatap
		// failed against waits for its timeout), so that the next cell
		// starts on both sides.
		if !v.waitLine(regexp.MustCompile(`DONE `+c.name+`\b`), 5*time.Minute) {
			t.Errorf("%s: the VM's side never finished:\n%s", c.name, tail(v.log.Bytes(), 30))
		}
		n := len(resultRow.FindAllString(got, -1))
		switch want := tableRows(vmServes, c.test, nrows); {
		case err != nil:
			r.result = "FAIL (rdmatap: " + lastLine(got) + ")"
			t.Errorf("%s, rdmatap %s against siw %s: %v\n%s", c.name, ourRole, variant, err, tail([]byte(got), 15))
		case want >= 0 && n != want:
			r.result = fmt.Sprintf("FAIL (rdmatap printed %d rows, want %d)", n, want)
			t.Errorf("%s: rdmatap printed %d result rows, want %d:\n%s", c.name, n, want, tail([]byte(got), 30))
		default:
			r.result = "PASS"
			t.Logf("%s: rdmatap %s passed in %s", c.name, ourRole, time.Since(t0).Round(100*time.Millisecond))
		}
		switch con, _ := os.ReadFile(filepath.Join(out, "console.log")); {
		case regexp.MustCompile(`NIC STALLED ` + c.name + `\b`).Match(con):
			reset := "failed"
			if regexp.MustCompile(`NIC RESET ` + c.name + ` ok`).Match(con) {
				reset = "ok"
			}
			nicStalled[i] = "[VM NIC TX stalled; reset " + reset + "]"
			t.Errorf("%s: the VM's NIC had stopped transmitting (the guest could not reach the host's bridge); the guest reset it: %s", c.name, reset)
		case r.result != "PASS":
			if l := e.stallLabel(t, v, c.name); l != "" {
				nicStalled[i] = strings.TrimSpace(l)
			}
		}
		rows = append(rows, r)
	}
	select {
	case <-v.done:
	case <-time.After(3 * time.Minute):
		t.Errorf("the VM did not power off: stopping it")
		v.killQemu()
		<-v.done
	}
	res := v.results()
	// qemu's virtio NIC has stopped transmitting in some runs on a loaded
	// host (the guest logs a TX watchdog; siw's peer then sees silence):
	// say so next to the cells that failed.
	con, _ := os.ReadFile(filepath.Join(out, "console.log"))
	stalled := bytes.Contains(con, []byte("NETDEV WATCHDOG"))
	if stalled && len(nicStalled) == 0 {
		t.Errorf("the VM's NIC stopped transmitting (guest: NETDEV WATCHDOG, transmit queue timed out)")
	}
	for i, c := range cells {
		log, _ := os.ReadFile(filepath.Join(out, c.name+".log"))
		n := len(resultRow.FindAllString(string(log), -1))
		want := tableRows(!vmServes, c.test, nrows)
		switch {
		case res[c.name] != "PASS":
			t.Errorf("%s: siw side %q:\n%s", c.name, res[c.name], tail(log, 15))
			if rows[i].result == "PASS" {
				rows[i].result = "FAIL (siw side " + strings.ToLower(res[c.name]+" "+lastLine(string(log))) + ")"
			}
		case want >= 0 && n != want:
			t.Errorf("%s: siw printed %d result rows, want %d:\n%s", c.name, n, want, tail(log, 30))
			if rows[i].result == "PASS" {
				rows[i].result = fmt.Sprintf("FAIL (siw printed %d rows, want %d)", n, want)
			}
		}
	}
	for i := range rows {
		switch {
		case rows[i].result == "PASS":
		case nicStalled[i] != "":
			rows[i].result += " " + nicStalled[i]
		case stalled && len(nicStalled) == 0:
			rows[i].result += " [VM NIC TX stalled]"
		}
	}
	e.results = append(e.results, rows...)
}

// waitLine waits for a console line of the VM.
func (v *vm) waitLine(re *regexp.Regexp, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(filepath.Join(v.out, "console.log")); err == nil && re.Match(b) {
			return true
		}
		select {
		case <-v.done:
			b, _ := os.ReadFile(filepath.Join(v.out, "console.log"))
			return re.Match(b)
		case <-time.After(200 * time.Millisecond):
		}
	}
	return false
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 100 {
		s = s[:100] + "…"
	}
	return s
}
