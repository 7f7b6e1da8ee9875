package demo

import (
	"bytes"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
	_ "github.com/rdmatap/rdmatap/cmd/rdmatap/internal/daemon"
	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/perftest"
	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/ping"
	"github.com/rdmatap/rdmatap/verbs"
)

// TestDemoPlacementUnderImpairment: the placement lab in the demo. With
// segment placement and loss and reordering of what A sends, every
// operation still verifies its data, B placed bytes from segments before
// TCP delivered them, every received payload byte was copied exactly once,
// and the impairment report shows what was done to A's packets.
func TestDemoPlacementUnderImpairment(t *testing.T) {
	for _, extra := range [][]string{nil, {"--crc"}} {
		args := append([]string{"demo", "--placement", "segment", "--loss", "0.01", "--reorder", "0.01", "--seed", "3", "--iters", "50"}, extra...)
		var out, errOut bytes.Buffer
		if code := cli.Run(args, &out, &errOut); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut.String())
		}
		text := out.String()
		for _, op := range []string{"SEND/RECV", "RDMA WRITE", "RDMA READ"} {
			m := regexp.MustCompile(regexp.QuoteMeta(op) + `\s+\d+\s+(\d+)\s+\S+\s+\S+\s+\S+\s+(\d+)/(\d+)`).FindStringSubmatch(text)
			if m == nil || m[1] != m[2] || m[2] != m[3] {
				t.Fatalf("%v: %s row %q in\n%s", args, op, m, text)
			}
		}
		num := func(re string) uint64 {
			t.Helper()
			m := regexp.MustCompile(re).FindStringSubmatch(text)
			if m == nil {
				t.Fatalf("%v: no %q in\n%s", args, re, text)
			}
			n, _ := strconv.ParseUint(m[1], 10, 64)
			return n
		}
		if num(`(\d+) bytes placed before TCP delivered them`) == 0 {
			t.Errorf("%v: nothing placed from segments:\n%s", args, text)
		}
		if !strings.Contains(text, "placement segment at endpoint B") || !strings.Contains(text, " 1.00 copies per payload byte received") {
			t.Errorf("%v: want 1.00 copies per payload byte at B:\n%s", args, text)
		}
		if num(`(\d+) packets, \d+ dropped`) == 0 || !strings.Contains(text, "loss 0.01, reorder 0.01, dup 0, seed 3") {
			t.Errorf("%v: no impairment report:\n%s", args, text)
		}
		num(`(\d+) of them out of order`)
		num(`FPDUs located by marker (\d+)`)
		num(`refused by validation (\d+) \(CRC \d+, header \d+, STag \d+, marker \d+\)`)
		num(`(\d+) duplicate bytes skipped`)
		// Same seed, same impairment: the decisions follow the packet
		// sequence, which TCP's timing changes from run to run, so the
		// counts are not compared here (netstack's TestImpairDeterministic
		// checks the decisions).
	}
}

// TestDemoStreamPlacementReport: the default reports copies per byte only,
// and no impairment.
func TestDemoStreamPlacementReport(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := cli.Run([]string{"demo", "--iters", "5", "--size", "4K"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	text := out.String()
	if !strings.Contains(text, "placement stream at endpoint B") || !strings.Contains(text, " 1.00 copies per payload byte received") {
		t.Errorf("no placement line:\n%s", text)
	}
	if strings.Contains(text, "impairment") || strings.Contains(text, "placed before TCP") {
		t.Errorf("impairment or segment counters without --loss/--placement segment:\n%s", text)
	}
}

// TestLabBadFlags: out-of-range probabilities and unknown placement modes
// are one-line usage errors naming the flag, in demo and in every TAP
// endpoint command (checked before a TAP is touched).
func TestLabBadFlags(t *testing.T) {
	tapArgs := []string{"--tap", "rtlab0", "--addr", "10.77.9.1/24"}
	for _, bad := range [][]string{
		{"--loss", "2"}, {"--loss", "-0.1"}, {"--reorder", "1.5"}, {"--dup", "NaN"}, {"--dup", "-Inf"},
		{"--placement", "bogus"}, {"--placement", ""}, {"--loss", "lots"}, {"--seed", "x"},
	} {
		flagName := strings.TrimLeft(bad[0], "-")
		for _, cmd := range [][]string{
			{"demo"},
			append([]string{"up"}, tapArgs...),
			append([]string{"ping", "-c", "-a", "10.77.9.2"}, tapArgs...),
			append([]string{"bw", "write", "10.77.9.2"}, tapArgs...),
			append([]string{"lat", "read", "10.77.9.2"}, tapArgs...),
		} {
			args := append(append([]string{}, cmd...), bad...)
			var out, errOut bytes.Buffer
			if code := cli.Run(args, &out, &errOut); code != 2 {
				t.Errorf("%q: exit %d, want 2 (%s)", args, code, errOut.String())
			}
			lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
			if len(lines) != 1 || !strings.HasPrefix(lines[0], "rdmatap "+cmd[0]+": ") || !strings.Contains(lines[0], flagName) {
				t.Errorf("%q: want a one-line error naming -%s, got %q", args, flagName, errOut.String())
			}
		}
	}
}

// TestLabFlagsReachTheEndpoint: every TAP endpoint command takes the lab
// flags; the defaults are stream placement, no impairment, seed 1.
func TestLabFlagsReachTheEndpoint(t *testing.T) {
	lab := []string{"--placement", "segment", "--loss", "0.02", "--reorder", "0.03", "--dup", "0.04", "--seed", "9"}
	_, pf, err := ping.ParsePingFlags(append([]string{"-c", "-a", "192.0.2.2", "-seed", "9"}, lab[:8]...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	_, bf, err := perftest.ParsePerfFlags(perftest.PerfBW, append([]string{"write"}, lab...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, ef := range []*cli.EndpointFlags{pf, bf} {
		ef.Tap, ef.Addr = "rtlab0", "192.0.2.1/24"
		if _, _, _, err := ef.Check(); err != nil {
			t.Fatal(err)
		}
		l := ef.Lab
		if l.Mode != verbs.PlacementSegment || l.Loss != 0.02 || l.Reorder != 0.03 || l.Dup != 0.04 || l.Seed != 9 || !l.Impaired() {
			t.Errorf("lab flags %+v", l)
		}
	}
	_, ef, err := ping.ParsePingFlags([]string{"-s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ef.Tap, ef.Addr = "rtlab0", "192.0.2.1/24"
	if _, _, _, err := ef.Check(); err != nil {
		t.Fatal(err)
	}
	if l := ef.Lab; l.Mode != verbs.PlacementStream || l.Impaired() || l.Seed != 1 {
		t.Errorf("defaults %+v", l)
	}
	if _, im := ef.Lab.Wrap(nil); im != nil {
		t.Error("an impairment without a rate")
	}
}
