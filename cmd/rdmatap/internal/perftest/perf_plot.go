package perftest

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/plot"
)

// --plot FILE.svg: the client of a -a sweep draws message size against
// bandwidth (bw) or latency (lat) on log-log axes, as an SVG that rdmatap
// writes itself (svgplot.go; no plotting library).
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

// The colors of the measured line and its markers.
const (
	plotColorMain = "#1f77b4" // the line: BW average, t_typical
	plotColorPeak = "#d62728" // BW peak, t_max
	plotColorMin  = "#2ca02c" // t_min
	plotColorP99  = "#ff7f0e" // 99% percentile
)

// checkPlotFlag checks --plot against the other flags (no file system
// access).
func (o *perfOpts) checkPlotFlag() error {
	if o.plot == "" {
		return nil
	}
	bad := func(f string, a ...any) error {
		return fmt.Errorf("%w: --plot: "+f, append([]any{cli.ErrUsage}, a...)...)
	}
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
	avg := plot.Series{Name: "BW average", Color: plotColorMain, Line: true, Mark: plot.MarkCircle}
	peak := plot.Series{Name: "BW peak", Color: plotColorPeak, Mark: plot.MarkPlus}
	for _, r := range reps {
		avg.Add(r.Size, r.Avg)
		peak.Add(r.Size, r.Peak)
	}
	if len(avg.Pts) == 0 {
		return nil, errors.New("plot: no size has a bandwidth above zero")
	}
	return plot.SVG(pi.title("bandwidth"), "BW ["+unit+"] (log)", avg, peak), nil
}

// plotLat draws a latency sweep as SVG: t_typical (the median) as the
// line, t_min, the 99% percentile and t_max as markers.
func plotLat(pi plotInfo, reps []perfLatReport) ([]byte, error) {
	typ := plot.Series{Name: "t_typical (median)", Color: plotColorMain, Line: true, Mark: plot.MarkCircle}
	lo := plot.Series{Name: "t_min", Color: plotColorMin, Mark: plot.MarkTriangle}
	p99 := plot.Series{Name: "99% percentile", Color: plotColorP99, Mark: plot.MarkCross}
	hi := plot.Series{Name: "t_max", Color: plotColorPeak, Mark: plot.MarkPlus}
	for _, r := range reps {
		typ.Add(r.Size, r.Typical)
		lo.Add(r.Size, r.Min)
		p99.Add(r.Size, r.P99)
		hi.Add(r.Size, r.Max)
	}
	if len(typ.Pts) == 0 {
		return nil, errors.New("plot: no size has a latency above zero")
	}
	return plot.SVG(pi.title("latency"), "latency [µs] (log)", typ, lo, p99, hi), nil
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
