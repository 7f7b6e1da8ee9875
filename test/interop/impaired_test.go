package interop

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"
)

// The impairment of TestSiwImpaired's path. The guest's kernel impairs
// what siw sends with netem (loss, duplication, and reordering: a
// quarter of the frames skip the 1 ms delay the others wait); the host's
// kernel has no netem, so its bridge drops frames from rdmatap to siw at
// random (nft's numgen).
const (
	impairGuest   = "loss 1% duplicate 1% delay 1ms reorder 25% 50%"
	impairHostPer = 100 // frames from rdmatap dropped, per 10,000
)

// TestSiwImpaired runs Debian's programs between siw and rdmatap (as
// TestSiwPrograms: rping with every ping's bytes checked, and perftest's
// six programs, both roles each, rdmatap's side through `rdmatap exec`
// on the service) on a path that loses, duplicates and reorders frames
// both ways. perftest's bandwidth programs move 200 messages of 64 KiB
// so that recovery runs in every cell. The TCP is the service's default,
// or the one RDMATAP_TCP names (`rdmatap up` reads it).
func TestSiwImpaired(t *testing.T) {
	e := setup(t)
	cells := impairedCells()
	if len(cells) == 0 {
		t.Skip("skipping: neither rping (rdmacm-utils) nor perftest is installed")
	}
	run := e.programService(t)
	e.holdFirstSYNs(t)
	e.nft(t, fmt.Sprintf(`table bridge rdmatap_impair {
	chain forward {
		type filter hook forward priority 10; policy accept;
		ip saddr %s ip daddr %s numgen random mod 10000 < %d counter drop
	}
}
`, ourIP, vmIP, impairHostPer))
	tcp := os.Getenv("RDMATAP_TCP")
	if tcp == "" {
		tcp = "gvisor (the default)"
	}
	start := time.Now()
	run.guest = "exec netem-module 20 modprobe sch_netem\n" +
		"exec netem 20 /sbin/tc qdisc add dev eth0 root netem " + impairGuest + "\n"
	run.preCells = []string{"netem-module", "netem"}
	run.guestAfter = "exec netem-stats 20 /sbin/tc -s qdisc show dev eth0\n"
	var rows [][3]string
	var guestStats []byte
	t.Run("fix", func(t *testing.T) {
		out := run.boot(t, "fix", cells, &rows)
		guestStats, _ = os.ReadFile(filepath.Join(out, "netem-stats.log"))
	})
	drops := e.nsRun(t, "nft", "list", "table", "bridge", "rdmatap_impair")
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "program\troles\tresult")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r[0], r[1], r[2])
	}
	tw.Flush()
	t.Logf("siw ↔ rdmatap on an impaired path (siw sends through netem %q: %s; the bridge drops %d of 10,000 of rdmatap's frames: %s), rdmatap's TCP %s, %s:\n%s",
		impairGuest, netemSent(string(guestStats)), impairHostPer, strings.TrimSpace(counterLine(drops)), tcp, time.Since(start).Round(time.Second), b.String())
}

// impairedCells are programCells' rping and perftest cells, perftest's
// bandwidth programs with 200 messages of 64 KiB.
func impairedCells() []progCell {
	all, _ := programCells()
	var cells []progCell
	for _, c := range all {
		switch {
		case c.host[0] == "rping":
		case strings.HasPrefix(c.host[0], "ib_"):
			if strings.HasSuffix(c.host[0], "_bw") {
				c.vm = setArgs(c.vm, "-s", "65536", "-n", "200")
				c.host = setArgs(c.host, "-s", "65536", "-n", "200")
			}
		default:
			continue
		}
		cells = append(cells, c)
	}
	return cells
}

// setArgs returns a copy of args with the value after each flag of kv (a
// flag, its value, ...) replaced.
func setArgs(args []string, kv ...string) []string {
	out := slices.Clone(args)
	for i := 0; i+1 < len(kv); i += 2 {
		if j := slices.Index(out, kv[i]); j >= 0 && j+1 < len(out) {
			out[j+1] = kv[i+1]
		}
	}
	return out
}

// counterLine is the counter of nft's listing of a table.
func counterLine(list string) string {
	for _, l := range strings.Split(list, "\n") {
		if i := strings.Index(l, "counter "); i >= 0 {
			return l[i:]
		}
	}
	return "no counter"
}

// netemSent is the "Sent ... (dropped ...)" line of the netem qdisc in
// `tc -s qdisc show`'s output.
func netemSent(stats string) string {
	lines := strings.Split(stats, "\n")
	for i, l := range lines {
		if strings.Contains(l, "netem") {
			for _, m := range lines[i+1:] {
				if m = strings.TrimSpace(m); strings.HasPrefix(m, "Sent ") {
					return m
				}
			}
		}
	}
	return "no netem statistics"
}
