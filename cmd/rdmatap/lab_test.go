package main

import (
	"bytes"
	"encoding/json"
	"io"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/netstack"
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
		if code := run(args, &out, &errOut); code != 0 {
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
	if code := run([]string{"demo", "--iters", "5", "--size", "4K"}, &out, &errOut); code != 0 {
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
			if code := run(args, &out, &errOut); code != 2 {
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
	_, pf, err := parsePingFlags(append([]string{"-c", "-a", "192.0.2.2", "-seed", "9"}, lab[:8]...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	_, bf, err := parsePerfFlags(perfBW, append([]string{"write"}, lab...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, ef := range []*endpointFlags{pf, bf} {
		ef.tap, ef.addr = "rtlab0", "192.0.2.1/24"
		if _, _, _, err := ef.check(); err != nil {
			t.Fatal(err)
		}
		l := ef.lab
		if l.mode != verbs.PlacementSegment || l.loss != 0.02 || l.reorder != 0.03 || l.dup != 0.04 || l.seed != 9 || !l.impaired() {
			t.Errorf("lab flags %+v", l)
		}
	}
	_, ef, err := parsePingFlags([]string{"-s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ef.tap, ef.addr = "rtlab0", "192.0.2.1/24"
	if _, _, _, err := ef.check(); err != nil {
		t.Fatal(err)
	}
	if l := ef.lab; l.mode != verbs.PlacementStream || l.impaired() || l.seed != 1 {
		t.Errorf("defaults %+v", l)
	}
	if _, im := ef.lab.wrap(nil); im != nil {
		t.Error("an impairment without a rate")
	}
}

// TestStatReportsPlacement: rdmatap stat prints the segment placement
// counters under stable names, copies per payload byte, and the
// impairment's counters of an impaired endpoint, all from the device.
func TestStatReportsPlacement(t *testing.T) {
	lab := labFlags{placement: "segment", loss: 0.01, reorder: 0.01, seed: 3}
	if err := lab.check(); err != nil {
		t.Fatal(err)
	}
	na, nb, im, err := labPair(netstack.LinkConfig{}, nil, &lab)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { na.Close(); nb.Close() })
	devA, err := verbs.Open(na, verbs.DeviceConfig{Name: "rtA", Placement: lab.mode})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { devA.Close() })
	devB, err := verbs.Open(nb, verbs.DeviceConfig{Name: "rtB", Placement: lab.mode})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { devB.Close() })
	o := demoOpts{size: 64 << 10, iters: 1, mpaRev: 2}
	e := &demoEnds{slots: 16, size: o.size, wc: make([]verbs.WC, 64), posted: make([]time.Time, 16)}
	if err := e.setup(devA, devB, o, 0); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		if err := e.writeRound(e.slots); err != nil {
			t.Fatal(err)
		}
	}
	want := settledStats(devB)
	if want.Segment.PlacedEarly == 0 {
		t.Fatalf("nothing placed from segments: %+v", want.Segment)
	}

	stat := func(ep *endpoint, args ...string) string {
		t.Helper()
		path := filepath.Join(t.TempDir(), "c.sock")
		s, err := serveControl(path, ep, defaultCtlLimits, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		var out, errOut bytes.Buffer
		if err := statCmd(append([]string{"--ctl", path}, args...), &out, &errOut); err != nil {
			t.Fatalf("stat: %v (%s)", err, errOut.String())
		}
		return out.String()
	}
	text := stat(&endpoint{Net: nb, Dev: devB, Addr: nb.Addrs()[0].Addr()})
	t.Logf("stat: %s", text)
	fields := strings.Fields(text)
	vals := map[string]string{}
	for i := 2; i+1 < len(fields); i += 2 {
		vals[fields[i]] = fields[i+1]
	}
	for _, kv := range segmentCounters(want) {
		if vals[kv.k] == "" {
			t.Errorf("stat lacks %s: %s", kv.k, text)
		}
	}
	for _, k := range []string{"seg_placed_early_bytes", "seg_out_of_order_bytes", "seg_fpdus_by_marker", "seg_fpdus_by_stream",
		"seg_fpdus_by_alignment", "seg_unframed_segments", "seg_refused_crc", "seg_refused_header", "seg_refused_stag",
		"seg_bad_tcp_checksum", "seg_out_of_window", "seg_duplicate_bytes", "seg_mismatches"} {
		if vals[k] == "" {
			t.Errorf("stat lacks %s: %s", k, text)
		}
	}
	// TCP's recovery counters, as ss -ti shows a kernel socket's.
	for _, kv := range tcpCounters(verbs.TCPStats{}) {
		if vals[kv.k] == "" {
			t.Errorf("stat lacks %s: %s", kv.k, text)
		}
	}
	if n, _ := strconv.ParseUint(vals["tcp_segs_out"], 10, 64); n == 0 {
		t.Errorf("stat counts no TCP segment sent after the traffic: %s", text)
	}
	if vals["seg_placed_early_bytes"] != strconv.FormatUint(want.Segment.PlacedEarly, 10) {
		t.Errorf("seg_placed_early_bytes %s, device %d", vals["seg_placed_early_bytes"], want.Segment.PlacedEarly)
	}
	if vals["copies_per_byte"] != "1.00" {
		t.Errorf("copies_per_byte %q: %s", vals["copies_per_byte"], text)
	}
	if strings.Contains(text, "impair_") {
		t.Errorf("impairment counters of an endpoint without one: %s", text)
	}

	// The impaired side reports its impairment, as text and as JSON.
	text = stat(&endpoint{Net: na, Dev: devA, Addr: na.Addrs()[0].Addr(), impair: im})
	if m := regexp.MustCompile(` impair_packets (\d+) impair_dropped \d+ impair_duplicated \d+ impair_reordered \d+`).FindStringSubmatch(text); m == nil || m[1] == "0" {
		t.Errorf("no impairment counters: %s", text)
	}
	var js statSet
	if err := json.Unmarshal([]byte(stat(&endpoint{Net: nb, Dev: devB}, "-j")), &js); err != nil {
		t.Fatal(err)
	}
	if js.Verbs.Segment.PlacedEarly != want.Segment.PlacedEarly {
		t.Errorf("JSON segment counters %+v, want %+v", js.Verbs.Segment, want.Segment)
	}
}
