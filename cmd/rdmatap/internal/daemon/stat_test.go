package daemon

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

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/demo"
	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
)

// TestStatReportsPlacement: rdmatap stat prints the segment placement
// counters under stable names, copies per payload byte, and the
// impairment's counters of an impaired endpoint, all from the device.
func TestStatReportsPlacement(t *testing.T) {
	lab := cli.LabFlags{Placement: "segment", Loss: 0.01, Reorder: 0.01, Seed: 3}
	if err := lab.Check(); err != nil {
		t.Fatal(err)
	}
	na, nb, im, err := cli.LabPair(netstack.LinkConfig{}, nil, &lab)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { na.Close(); nb.Close() })
	devA, err := verbs.Open(na, verbs.DeviceConfig{Name: "rtA", Placement: lab.Mode})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { devA.Close() })
	devB, err := verbs.Open(nb, verbs.DeviceConfig{Name: "rtB", Placement: lab.Mode})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { devB.Close() })
	o := demo.DemoOpts{Size: 64 << 10, Iters: 1, MpaRev: 2}
	e := &demo.DemoEnds{Slots: 16, Size: o.Size, Wc: make([]verbs.WC, 64), Posted: make([]time.Time, 16)}
	if err := e.Setup(devA, devB, o, 0); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		if err := e.WriteRound(e.Slots); err != nil {
			t.Fatal(err)
		}
	}
	want := cli.SettledStats(devB)
	if want.Segment.PlacedEarly == 0 {
		t.Fatalf("nothing placed from segments: %+v", want.Segment)
	}

	stat := func(ep *cli.Endpoint, args ...string) string {
		t.Helper()
		return ctlCommand(t, ep, statCmd, args...)
	}
	text := stat(&cli.Endpoint{Net: nb, Dev: devB, Addr: nb.Addrs()[0].Addr()})
	t.Logf("stat: %s", text)
	fields := strings.Fields(text)
	vals := map[string]string{}
	for i := 2; i+1 < len(fields); i += 2 {
		vals[fields[i]] = fields[i+1]
	}
	for _, kv := range cli.SegmentCounters(want) {
		if vals[kv.K] == "" {
			t.Errorf("stat lacks %s: %s", kv.K, text)
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
	text = stat(&cli.Endpoint{Net: na, Dev: devA, Addr: na.Addrs()[0].Addr(), Impair: im})
	if m := regexp.MustCompile(` impair_packets (\d+) impair_dropped \d+ impair_duplicated \d+ impair_reordered \d+`).FindStringSubmatch(text); m == nil || m[1] == "0" {
		t.Errorf("no impairment counters: %s", text)
	}
	var js statSet
	if err := json.Unmarshal([]byte(stat(&cli.Endpoint{Net: nb, Dev: devB}, "-j")), &js); err != nil {
		t.Fatal(err)
	}
	if js.Verbs.Segment.PlacedEarly != want.Segment.PlacedEarly {
		t.Errorf("JSON segment counters %+v, want %+v", js.Verbs.Segment, want.Segment)
	}
}

// ctlCommand runs a control-socket command (statCmd, ssCmd) against ep
// served on a socket of its own, and returns what it printed.
func ctlCommand(t *testing.T, ep *cli.Endpoint, cmd func([]string, io.Writer, io.Writer) error, args ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.sock")
	s, err := serveControl(path, ep, defaultCtlLimits, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out, errOut bytes.Buffer
	if err := cmd(append([]string{"--ctl", path}, args...), &out, &errOut); err != nil {
		t.Fatalf("%v: %v (%s)", args, err, errOut.String())
	}
	return out.String()
}
