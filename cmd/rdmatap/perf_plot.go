package main

import (
	"bytes"
	"errors"
	"fmt"
	"image/color"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// --plot FILE.svg: the client of a -a sweep draws message size against
// bandwidth (bw) or latency (lat) on log-log axes with gonum/plot.
//
// Both axes are logarithmic: a sweep spans 2 B to 8 MiB (22 octaves) and
// its bandwidth three to four decades (a 2-byte Write moves a few MB/s,
// an 8 MiB one thousands), so on a linear y axis every size below ~64 KiB
// would lie on the floor. Latency is flat for small messages and grows
// with size for large ones; a log y axis keeps both parts readable.
//
// Only the client draws: it measures every size of a write or read sweep
// (the server of those prints only the last row), and with the same flags
// on both sides two processes in one directory would race for the file.
//
// The SVG names its font (Liberation Serif) without embedding it; a
// browser without it uses its default serif, Times-like and of the same
// metrics, so labels keep the widths gonum/plot laid them out with.

// plotColors: the measured line and its markers.
var (
	plotColorMain = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff} // the line: BW average, t_typical
	plotColorPeak = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff} // BW peak, t_max
	plotColorMin  = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff} // t_min
	plotColorP99  = color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff} // 99% percentile
)

// checkPlotFlag checks --plot against the other flags (no file system
// access).
func (o *perfOpts) checkPlotFlag() error {
	if o.plot == "" {
		return nil
	}
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: --plot: "+f, append([]any{errUsage}, a...)...) }
	if !strings.EqualFold(filepath.Ext(o.plot), ".svg") {
		return bad("%q: the plot is SVG, name the file *.svg", o.plot)
	}
	if !o.all {
		return bad("needs -a (one message size is not a sweep)")
	}
	if !o.client() {
		return bad("the client draws the sweep: give --plot to the side with the server's address")
	}
	return nil
}

// checkPlotFile checks, before the test runs, that the plot can be
// written: path is not a directory, and its directory exists and takes a
// new file (or the file exists and opens for writing).
func checkPlotFile(path string) error {
	if path == "" {
		return nil
	}
	fi, err := os.Stat(path)
	switch {
	case err == nil && !fi.Mode().IsRegular():
		return fmt.Errorf("--plot %s: not a regular file", path)
	case err == nil:
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return fmt.Errorf("--plot: %v", err)
		}
		return f.Close()
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("--plot: %v", err)
	}
	dir := filepath.Dir(path)
	if fi, err := os.Stat(dir); err != nil {
		return fmt.Errorf("--plot %s: directory %s: %v", path, dir, errors.Unwrap(err))
	} else if !fi.IsDir() {
		return fmt.Errorf("--plot %s: %s is not a directory", path, dir)
	}
	f, err := os.CreateTemp(dir, ".rdmatap-plot-*")
	if err != nil {
		return fmt.Errorf("--plot %s: cannot create files in %s: %v", path, dir, errors.Unwrap(err))
	}
	f.Close()
	return os.Remove(f.Name())
}

// plotInfo is what the title says besides the measurement.
type plotInfo struct {
	verb   perfVerb
	gbits  bool
	local  string    // this endpoint (the device name)
	remote string    // the server, address:port
	when   time.Time // when the sweep ran
}

func (o *perfOpts) plotInfo(when time.Time) plotInfo {
	return plotInfo{verb: o.verb, gbits: o.gbits, local: o.devName,
		remote: netip.AddrPortFrom(o.server, o.port).String(), when: when}
}

// plotVerbName is the operation as a title says it.
var plotVerbName = [...]string{perfSend: "Send", perfWrite: "RDMA Write", perfRead: "RDMA Read", perfAtomic: "Atomic"}

func (pi plotInfo) title(what string) string {
	return fmt.Sprintf("%s %s\n%s to %s, %s", plotVerbName[pi.verb], what, pi.local, pi.remote,
		pi.when.Format("2006-01-02 15:04 MST"))
}

// plotBW draws a bandwidth sweep as SVG: BW average as the line, BW peak
// (when measured) as markers, in the unit of the table (MB/sec or
// Gb/sec).
func plotBW(pi plotInfo, reps []perfBWReport) ([]byte, error) {
	unit := "MB/sec"
	if pi.gbits {
		unit = "Gb/sec"
	}
	avg := make(plotter.XYs, 0, len(reps))
	peak := make(plotter.XYs, 0, len(reps))
	for _, r := range reps {
		avg = appendPositive(avg, r.Size, r.Avg)
		peak = appendPositive(peak, r.Size, r.Peak)
	}
	if len(avg) == 0 {
		return nil, errors.New("plot: no size has a bandwidth above zero")
	}
	p := newSweepPlot(pi.title("bandwidth"), "BW ["+unit+"] (log)")
	if err := addLine(p, avg, "BW average", plotColorMain); err != nil {
		return nil, err
	}
	if len(peak) > 0 {
		if err := addMarkers(p, peak, "BW peak", plotColorPeak, draw.PlusGlyph{}); err != nil {
			return nil, err
		}
	}
	return renderSweep(p, reps2sizes(avg), avg, peak)
}

// plotLat draws a latency sweep as SVG: t_typical (the median) as the
// line, t_min, the 99% percentile and t_max as markers.
func plotLat(pi plotInfo, reps []perfLatReport) ([]byte, error) {
	var typ, lo, p99, hi plotter.XYs
	for _, r := range reps {
		typ = appendPositive(typ, r.Size, r.Typical)
		lo = appendPositive(lo, r.Size, r.Min)
		p99 = appendPositive(p99, r.Size, r.P99)
		hi = appendPositive(hi, r.Size, r.Max)
	}
	if len(typ) == 0 {
		return nil, errors.New("plot: no size has a latency above zero")
	}
	p := newSweepPlot(pi.title("latency"), "latency [µs] (log)")
	if err := addLine(p, typ, "t_typical (median)", plotColorMain); err != nil {
		return nil, err
	}
	for _, m := range []struct {
		xys   plotter.XYs
		name  string
		c     color.Color
		shape draw.GlyphDrawer
	}{
		{lo, "t_min", plotColorMin, draw.TriangleGlyph{}},
		{p99, "99% percentile", plotColorP99, draw.CrossGlyph{}},
		{hi, "t_max", plotColorPeak, draw.PlusGlyph{}},
	} {
		if len(m.xys) == 0 {
			continue
		}
		if err := addMarkers(p, m.xys, m.name, m.c, m.shape); err != nil {
			return nil, err
		}
	}
	return renderSweep(p, reps2sizes(typ), typ, lo, p99, hi)
}

// appendPositive appends (size, v) unless v cannot be drawn on a log
// axis (a peak that was not measured is 0).
func appendPositive(xys plotter.XYs, size uint64, v float64) plotter.XYs {
	if size == 0 || !(v > 0) || math.IsInf(v, 0) {
		return xys
	}
	return append(xys, plotter.XY{X: float64(size), Y: v})
}

func reps2sizes(xys plotter.XYs) []float64 {
	s := make([]float64, len(xys))
	for i, p := range xys {
		s[i] = p.X
	}
	return s
}

func newSweepPlot(title, ylabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "message size [bytes] (log2)"
	p.Y.Label.Text = ylabel
	p.X.Scale = plot.LogScale{}
	p.Y.Scale = plot.LogScale{}
	p.Add(plotter.NewGrid())
	// Top left is empty in both kinds of sweep: small messages have the
	// least bandwidth and the least latency.
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(12)
	return p
}

func addLine(p *plot.Plot, xys plotter.XYs, name string, c color.Color) error {
	l, s, err := plotter.NewLinePoints(xys)
	if err != nil {
		return err
	}
	l.Color = c
	l.Width = vg.Points(1.5)
	s.Color = c
	s.Shape = draw.CircleGlyph{}
	s.Radius = vg.Points(2.5)
	p.Add(l, s)
	p.Legend.Add(name, l, s)
	return nil
}

func addMarkers(p *plot.Plot, xys plotter.XYs, name string, c color.Color, shape draw.GlyphDrawer) error {
	s, err := plotter.NewScatter(xys)
	if err != nil {
		return err
	}
	s.Color = c
	s.Shape = shape
	s.Radius = vg.Points(3)
	p.Add(s)
	p.Legend.Add(name, s)
	return nil
}

// renderSweep sets the axes' ranges and ticks and renders p as SVG.
func renderSweep(p *plot.Plot, sizes []float64, series ...plotter.XYs) ([]byte, error) {
	xmin, xmax := sizes[0], sizes[0]
	for _, s := range sizes {
		xmin, xmax = min(xmin, s), max(xmax, s)
	}
	ymin, ymax := math.Inf(1), math.Inf(-1)
	for _, xys := range series {
		for _, q := range xys {
			ymin, ymax = min(ymin, q.Y), max(ymax, q.Y)
		}
	}
	// A little room around the points, so no marker sits on an axis; a
	// one-point or flat series still gets a range.
	p.X.Min, p.X.Max = xmin/1.3, xmax*1.3
	p.Y.Min, p.Y.Max = ymin/1.4, ymax*1.4
	p.X.Tick.Marker = sizeTicks{}
	p.Y.Tick.Marker = logValueTicks{}
	w := vg.Length(18) * vg.Centimeter
	h := vg.Length(12) * vg.Centimeter
	// vgsvg directly rather than p.WriterTo(..., "svg"): the format
	// registry lacks svg when gonum/plot is built with -tags minimal.
	c := vgsvg.New(w, h)
	p.Draw(draw.New(c))
	var b bytes.Buffer
	if _, err := c.WriteTo(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// writePlot writes svg to path through a temporary file in the same
// directory, so an interrupted run leaves no half-written plot.
func writePlot(path string, svg []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".rdmatap-plot-*")
	if err != nil {
		return fmt.Errorf("--plot: %v", err)
	}
	_, err = f.Write(svg)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("--plot: %v", err)
	}
	return nil
}

// sizeTicks marks every power of two in the range and labels enough of
// them (2, 8, 32, ..., 512K, 2M, 8M for a full sweep) that the labels
// do not run into each other.
type sizeTicks struct{}

func (sizeTicks) Ticks(lo, hi float64) []plot.Tick {
	first := int(math.Ceil(math.Log2(lo)))
	last := int(math.Floor(math.Log2(hi)))
	step := 1
	for (last-first)/step+1 > 12 {
		step++
	}
	var t []plot.Tick
	for e := first; e <= last; e++ {
		tk := plot.Tick{Value: math.Ldexp(1, e)}
		if (e-first)%step == 0 {
			tk.Label = sizeLabel(e)
		}
		t = append(t, tk)
	}
	return t
}

// sizeLabel names 2^e bytes as 2, 64, 1K, 64K, 1M, 8M.
func sizeLabel(e int) string {
	switch {
	case e < 0:
		return strconv.FormatFloat(math.Ldexp(1, e), 'g', -1, 64)
	case e < 10:
		return strconv.Itoa(1 << e)
	case e < 20:
		return strconv.Itoa(1<<(e-10)) + "K"
	case e < 30:
		return strconv.Itoa(1<<(e-20)) + "M"
	default:
		return strconv.Itoa(1<<(e-30)) + "G"
	}
}

// logValueTicks marks 1..9 of each decade; it labels the decades, and
// 2 and 5 of each too when the range spans less than two decades (a
// latency sweep often stays within one).
type logValueTicks struct{}

func (logValueTicks) Ticks(lo, hi float64) []plot.Tick {
	labelled := map[int]bool{1: true}
	if math.Log10(hi/lo) < 2 {
		labelled[2], labelled[5] = true, true
	}
	var t []plot.Tick
	for d := math.Floor(math.Log10(lo)); d <= math.Ceil(math.Log10(hi)); d++ {
		dec := math.Pow(10, d)
		for i := 1; i <= 9; i++ {
			v := dec * float64(i)
			if v < lo || v > hi {
				continue
			}
			tk := plot.Tick{Value: v}
			if labelled[i] {
				tk.Label = strconv.FormatFloat(v, 'g', 6, 64)
			}
			t = append(t, tk)
		}
	}
	if countLabels(t) < 2 {
		// Too narrow for 1-2-5 to label two ticks: label every one, and
		// the ends.
		for i := range t {
			t[i].Label = strconv.FormatFloat(t[i].Value, 'g', 6, 64)
		}
		t = append(t, plot.Tick{Value: lo, Label: strconv.FormatFloat(lo, 'g', 3, 64)},
			plot.Tick{Value: hi, Label: strconv.FormatFloat(hi, 'g', 3, 64)})
	}
	return t
}

func countLabels(t []plot.Tick) int {
	n := 0
	for _, tk := range t {
		if tk.Label != "" {
			n++
		}
	}
	return n
}
