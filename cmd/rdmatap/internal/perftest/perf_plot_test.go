package perftest

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
)

// svgDoc is what the tests read from a plot: the text of every <text>
// element, every element with its attributes, and the root's attributes.
type svgDoc struct {
	texts []string
	elems []svgElem
	root  map[string]string
}

type svgElem struct {
	name  string
	attrs map[string]string
}

// parseSVG parses b strictly with encoding/xml: one <svg> root in the SVG
// namespace, well-formed to the end.
func parseSVG(t *testing.T, b []byte) svgDoc {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(b))
	d.Strict = true
	var doc svgDoc
	var stack []string
	var text strings.Builder
	roots := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			e := svgElem{name: tok.Name.Local, attrs: map[string]string{}}
			for _, a := range tok.Attr {
				e.attrs[a.Name.Local] = a.Value
			}
			if len(stack) == 0 {
				roots++
				if tok.Name.Local != "svg" || tok.Name.Space != "http://www.w3.org/2000/svg" {
					t.Fatalf("root element %v, want svg in the SVG namespace", tok.Name)
				}
				doc.root = e.attrs
			}
			doc.elems = append(doc.elems, e)
			stack = append(stack, tok.Name.Local)
			text.Reset()
		case xml.CharData:
			text.Write(tok)
		case xml.EndElement:
			if stack[len(stack)-1] == "text" {
				doc.texts = append(doc.texts, text.String())
			}
			stack = stack[:len(stack)-1]
		}
	}
	if roots != 1 || len(stack) != 0 {
		t.Fatalf("%d root elements, %d left open", roots, len(stack))
	}
	return doc
}

func (d svgDoc) hasText(s string) bool {
	for _, t := range d.texts {
		if t == s {
			return true
		}
	}
	return false
}

// count counts the elements called name whose attribute attr is val.
func (d svgDoc) count(name, attr, val string) int {
	n := 0
	for _, e := range d.elems {
		if e.name == name && e.attrs[attr] == val {
			n++
		}
	}
	return n
}

// glyphs counts the filled circles of color c: the points of the line
// series, and its legend entry.
func (d svgDoc) glyphs(c string) int { return d.count("circle", "fill", c) }

// inLegend counts the elements called name with attr val whose position
// (a circle's centre, a path's first point) lies in the legend's box.
func (d svgDoc) inLegend(name, attr, val string) int {
	f := func(e svgElem, a string) float64 { v, _ := strconv.ParseFloat(e.attrs[a], 64); return v }
	var x0, y0, x1, y1 float64
	for _, e := range d.elems {
		if e.name == "rect" && e.attrs["stroke"] == "#999999" {
			x0, y0 = f(e, "x"), f(e, "y")
			x1, y1 = x0+f(e, "width"), y0+f(e, "height")
		}
	}
	n := 0
	for _, e := range d.elems {
		if e.name != name || e.attrs[attr] != val {
			continue
		}
		var x, y float64
		if name == "circle" {
			x, y = f(e, "cx"), f(e, "cy")
		} else if _, err := fmt.Sscanf(e.attrs["d"], "M%g %g", &x, &y); err != nil {
			continue
		}
		if x >= x0 && x <= x1 && y >= y0 && y <= y1 {
			n++
		}
	}
	return n
}

// linePoints is the number of points of each polyline.
func (d svgDoc) linePoints() []int {
	var n []int
	for _, e := range d.elems {
		if e.name == "polyline" {
			n = append(n, len(strings.Fields(e.attrs["points"])))
		}
	}
	return n
}

const plotMainFill = plotColorMain

func syntheticSweep(maxExp int) ([]perfBWReport, []perfLatReport) {
	var bw []perfBWReport
	var lat []perfLatReport
	for e := 1; e <= maxExp; e++ {
		s := uint64(1) << e
		bw = append(bw, perfBWReport{Size: s, Iters: 1000,
			Avg: float64(s) / (float64(s) + 4096) * 5000, Peak: float64(s) / (float64(s) + 3000) * 5400})
		l := 20 + float64(s)/2000
		lat = append(lat, perfLatReport{Size: s, Iters: 1000, Typical: l, Min: l * 0.8, P99: l * 1.5, Max: l * 4})
	}
	return bw, lat
}

var plotTestInfo = plotInfo{verb: perfWrite, local: "rt0", remote: "10.77.0.3:18515",
	when: time.Date(2026, 11, 23, 11, 0, 0, 0, time.UTC)}

// TestPlotSweepSVG draws a synthetic full sweep (2 B to 8 MiB) of each
// kind and reads the SVG back: well-formed, titled, both axes labelled,
// size ticks named 2 ... 8M, and one point per size on the line.
func TestPlotSweepSVG(t *testing.T) {
	bw, lat := syntheticSweep(23)
	b, err := plotBW(plotTestInfo, bw)
	if err != nil {
		t.Fatal(err)
	}
	doc := parseSVG(t, b)
	for _, want := range []string{"RDMA Write bandwidth", "rt0 to 10.77.0.3:18515, 2026-11-23 11:00 UTC",
		"message size [bytes] (log2)", "BW [MB/sec] (log)", "BW average", "BW peak",
		"2", "8", "2K", "512K", "8M", "10", "100", "1000"} {
		if !doc.hasText(want) {
			t.Errorf("bw plot: no text %q in %q", want, doc.texts)
		}
	}
	// One circle per size, and the legend's; one line through them; a
	// marker per size for the peak, and the legend's.
	if n := doc.glyphs(plotMainFill); n != len(bw)+1 {
		t.Errorf("bw plot: %d points of BW average, want %d sizes + 1 in the legend", n, len(bw))
	}
	if n := doc.linePoints(); len(n) != 1 || n[0] != len(bw) {
		t.Errorf("bw plot: polylines of %v points, want one of %d", n, len(bw))
	}
	if n := doc.count("path", "stroke", plotColorPeak); n != len(bw)+1 {
		t.Errorf("bw plot: %d BW peak markers, want %d sizes + 1 in the legend", n, len(bw))
	}
	// A generic font, nothing embedded.
	if f := doc.root["font-family"]; f != "sans-serif" || doc.count("style", "", "") > 0 || doc.count("font", "", "") > 0 {
		t.Errorf("bw plot: font-family %q", f)
	}

	pi := plotTestInfo
	pi.gbits, pi.verb = true, perfRead
	b, err = plotBW(pi, bw)
	if err != nil {
		t.Fatal(err)
	}
	if doc := parseSVG(t, b); !doc.hasText("BW [Gb/sec] (log)") || !doc.hasText("RDMA Read bandwidth") {
		t.Errorf("--report_gbits read plot: %q", doc.texts)
	}

	b, err = plotLat(plotTestInfo, lat)
	if err != nil {
		t.Fatal(err)
	}
	doc = parseSVG(t, b)
	for _, want := range []string{"RDMA Write latency", "message size [bytes] (log2)", "latency [µs] (log)",
		"t_typical (median)", "t_min", "99% percentile", "t_max", "2", "8M", "100", "1000"} {
		if !doc.hasText(want) {
			t.Errorf("lat plot: no text %q in %q", want, doc.texts)
		}
	}
	if n := doc.glyphs(plotMainFill); n != len(lat)+1 {
		t.Errorf("lat plot: %d points of t_typical, want %d sizes + 1 in the legend", n, len(lat))
	}
	for _, c := range []string{plotColorMin, plotColorP99, plotColorPeak} {
		if n := doc.count("path", "stroke", c); n != len(lat)+1 {
			t.Errorf("lat plot: %d markers of %s, want %d sizes + 1 in the legend", n, c, len(lat))
		}
	}

	// Text is escaped.
	pi.local = `<dev&"0">`
	b, err = plotLat(pi, lat)
	if err != nil {
		t.Fatal(err)
	}
	if doc := parseSVG(t, b); !doc.hasText(`<dev&"0"> to 10.77.0.3:18515, 2026-11-23 11:00 UTC`) {
		t.Errorf("escaped title: %q", doc.texts)
	}
}

// TestPlotEdgeCases: sweeps that a log axis cannot take whole are drawn
// without what cannot be drawn, or refused with an error, never a panic.
func TestPlotEdgeCases(t *testing.T) {
	bw, lat := syntheticSweep(4)
	// -N (no peak): the peak is 0 and gets no markers, no legend entry.
	for i := range bw {
		bw[i].Peak = 0
	}
	b, err := plotBW(plotTestInfo, bw)
	if err != nil {
		t.Fatal(err)
	}
	if doc := parseSVG(t, b); doc.hasText("BW peak") || doc.glyphs(plotMainFill) != len(bw)+1 {
		t.Errorf("no-peak plot: texts %q, %d points", doc.texts, doc.glyphs(plotMainFill))
	}
	// One size, a flat line: still a range on both axes.
	if b, err := plotLat(plotTestInfo, lat[:1]); err != nil {
		t.Error(err)
	} else if doc := parseSVG(t, b); doc.glyphs(plotMainFill) != 2 {
		t.Errorf("one-size plot: %d points", doc.glyphs(plotMainFill))
	}
	// A flat sweep has points in every corner: the legend still covers
	// none (only its own samples lie in its box).
	_, flat := syntheticSweep(8)
	b, err = plotLat(plotTestInfo, flat)
	if err != nil {
		t.Fatal(err)
	}
	doc := parseSVG(t, b)
	if n := doc.inLegend("circle", "fill", plotColorMain); n != 1 {
		t.Errorf("flat sweep: %d t_typical points in the legend's box, want its sample only", n)
	}
	for _, c := range []string{plotColorMin, plotColorP99, plotColorPeak} {
		if n := doc.inLegend("path", "stroke", c); n != 1 {
			t.Errorf("flat sweep: %d markers of %s in the legend's box, want its sample only", n, c)
		}
	}

	// Nothing above zero: an error.
	for i := range bw {
		bw[i].Avg = 0
	}
	if _, err := plotBW(plotTestInfo, bw); err == nil {
		t.Error("all-zero bandwidth: no error")
	}
	if _, err := plotLat(plotTestInfo, []perfLatReport{{Size: 2}}); err == nil {
		t.Error("all-zero latency: no error")
	}
}

// TestPerfPlotCLI runs bw write -a and lat send -a between two in-process
// endpoints with --plot on the client and checks the files: SVG with a
// point for each size of the sweep (2 .. perfTestAllMax).
func TestPerfPlotCLI(t *testing.T) {
	dir := t.TempDir()
	sizes := 0
	for s := 2; s <= perfTestAllMax; s *= 2 {
		sizes++
	}
	for _, c := range []struct {
		test  PerfTestKind
		args  []string
		title string
	}{
		{PerfBW, []string{"write", "-a", "-n", "20"}, "RDMA Write bandwidth"},
		{PerfLat, []string{"send", "-a", "-n", "10"}, "Send latency"},
	} {
		file := filepath.Join(dir, c.args[0]+".svg")
		cargs := append(append([]string(nil), c.args...), "--plot", file)
		cout, srv, cerr, serr := perfRunSides(t, c.test, c.args, cargs)
		if cerr != nil || serr != nil {
			t.Fatalf("%v: client %v, server %v\n%s\n%s", cargs, cerr, serr, cout, srv)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatalf("%v: %v", cargs, err)
		}
		doc := parseSVG(t, b)
		if !doc.hasText(c.title) || !doc.hasText("message size [bytes] (log2)") {
			t.Errorf("%v: texts %q", cargs, doc.texts)
		}
		if n := doc.glyphs(plotMainFill); n != sizes+1 {
			t.Errorf("%v: %d points, want %d sizes + 1 in the legend", cargs, n, sizes)
		}
	}
	// The temporary files of the check and the write are gone.
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Errorf("%d files in the plot directory, want 2: %v", len(ents), ents)
	}
}

// TestPerfPlotFlags: --plot's errors, each one line, before the test runs.
func TestPerfPlotFlags(t *testing.T) {
	dir := t.TempDir()
	svg := filepath.Join(dir, "p.svg")
	for _, c := range []struct {
		test PerfTestKind
		args []string
		want string
	}{
		{PerfBW, []string{"write", "10.0.0.1", "--plot", svg}, "needs -a"},
		{PerfLat, []string{"write", "10.0.0.1", "-s", "64", "--plot", svg}, "needs -a"},
		{PerfBW, []string{"write", "10.0.0.1", "-a", "--plot", filepath.Join(dir, "p.png")}, "*.svg"},
		{PerfBW, []string{"write", "10.0.0.1", "-a", "--plot", dir}, "*.svg"},
		{PerfBW, []string{"write", "-a", "--plot", svg}, "the client draws"},
		{PerfBW, []string{"atomic", "10.0.0.1", "--plot", svg}, "needs -a"},
	} {
		_, _, err := ParsePerfFlags(c.test, c.args, io.Discard)
		if !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: err %v, want a one-line usage error with %q", c.args, err, c.want)
		}
	}
	if _, _, err := ParsePerfFlags(PerfLat, []string{"read", "-a", "10.0.0.1", "--plot", "lat.SVG"}, io.Discard); err != nil {
		t.Errorf("lat read -a --plot lat.SVG: %v", err)
	}

	// The file system, checked up front.
	notDir := filepath.Join(dir, "file")
	os.WriteFile(notDir, nil, 0o644)
	os.Mkdir(filepath.Join(dir, "d.svg"), 0o755)
	for path, want := range map[string]string{
		filepath.Join(dir, "missing", "p.svg"): "no such file or directory",
		filepath.Join(notDir, "p.svg"):         "not a directory",
		filepath.Join(dir, "d.svg"):            "not a regular file",
	} {
		err := checkPlotFile(path)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "--plot") {
			t.Errorf("checkPlotFile(%s): %v, want an error with %q", path, err, want)
		}
	}
	for _, ok := range []string{svg, notDir} { // new, and existing
		if err := checkPlotFile(ok); err != nil {
			t.Errorf("checkPlotFile(%s): %v", ok, err)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Errorf("the check left files: %v", ents)
	}

	// Through the command: exit 1, one line naming --plot, and the TAP
	// is not opened (no root needed to see it).
	var stderr bytes.Buffer
	missing := filepath.Join(dir, "missing", "bw.svg")
	rc := cli.Run([]string{"bw", "write", "-a", "10.0.0.1", "--plot", missing, "--tap", "rdmatapnone0", "--addr", "10.0.0.2/24"}, io.Discard, &stderr)
	if rc != 1 || strings.Count(stderr.String(), "\n") != 1 || !strings.Contains(stderr.String(), "--plot "+missing) {
		t.Errorf("missing directory: exit %d, stderr %q", rc, stderr.String())
	}
	stderr.Reset()
	rc = cli.Run([]string{"lat", "write", "10.0.0.1", "--plot", svg, "--tap", "rdmatapnone0", "--addr", "10.0.0.2/24"}, io.Discard, &stderr)
	if rc != 2 || strings.Count(stderr.String(), "\n") != 1 || !strings.Contains(stderr.String(), "needs -a") {
		t.Errorf("no -a: exit %d, stderr %q", rc, stderr.String())
	}
}
