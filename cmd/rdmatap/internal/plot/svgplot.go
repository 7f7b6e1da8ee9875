// Package plot draws a message-size sweep as SVG: message size on a log2
// axis against a measured value on a log10 axis.
package plot

import (
	"encoding/xml"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// A small SVG writer for --plot: message size (log2 axis) against a
// measured value (log10 axis), one line with point markers and any number
// of marker-only series, a legend and a title. Text uses the generic
// font-family sans-serif, so a browser draws it with its own font and
// the file embeds none; label positions therefore do not depend on text
// widths (x labels are centred on their tick, y labels end at theirs).

// Series is one measured quantity of a sweep.
type Series struct {
	Name  string
	Color string // #rrggbb
	Line  bool   // joined by a line, else markers only
	Mark  plotMark
	Pts   []plotPoint
}

type plotPoint struct{ x, y float64 }

type plotMark int

const (
	MarkCircle plotMark = iota
	MarkPlus
	MarkCross
	MarkTriangle
)

// Add appends (size, v) unless v cannot be drawn on a log axis (a peak
// that was not measured is 0).
func (s *Series) Add(size uint64, v float64) {
	if size == 0 || !(v > 0) || math.IsInf(v, 0) {
		return
	}
	s.Pts = append(s.Pts, plotPoint{float64(size), v})
}

// axisTick is a tick of an axis; an empty label marks a minor tick.
type axisTick struct {
	value float64
	label string
}

// sizeTicks marks every power of two in [lo, hi] and labels enough of
// them (2, 8, 32, ..., 512K, 2M, 8M for a full sweep) that the labels
// do not run into each other: at most 12, every step-th from the first.
func sizeTicks(lo, hi float64) []axisTick {
	first := int(math.Ceil(math.Log2(lo)))
	last := int(math.Floor(math.Log2(hi)))
	step := 1
	for (last-first)/step+1 > 12 {
		step++
	}
	var t []axisTick
	for e := first; e <= last; e++ {
		tk := axisTick{value: math.Ldexp(1, e)}
		if (e-first)%step == 0 {
			tk.label = sizeLabel(e)
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

// logTicks marks k·10^d (k = 1..9) in [lo, hi]. It labels the decades,
// and 2 and 5 of each too when the range spans less than two decades (a
// latency sweep often stays within one); a range with fewer than two of
// those labels every tick, and one with fewer than two ticks its ends.
func logTicks(lo, hi float64) []axisTick {
	few := math.Log10(hi/lo) < 2
	var t []axisTick
	for d := math.Floor(math.Log10(lo)); d <= math.Ceil(math.Log10(hi)); d++ {
		dec := math.Pow(10, d)
		for k := 1; k <= 9; k++ {
			v := dec * float64(k)
			if v < lo*(1-1e-9) || v > hi*(1+1e-9) {
				continue
			}
			tk := axisTick{value: v}
			if k == 1 || few && (k == 2 || k == 5) {
				tk.label = valueLabel(v, 6)
			}
			t = append(t, tk)
		}
	}
	n := 0
	for _, tk := range t {
		if tk.label != "" {
			n++
		}
	}
	if n < 2 {
		for i := range t {
			t[i].label = valueLabel(t[i].value, 6)
		}
	}
	if len(t) < 2 {
		t = append(append([]axisTick{{lo, valueLabel(lo, 3)}}, t...), axisTick{hi, valueLabel(hi, 3)})
	}
	return t
}

// valueLabel writes v with at most sig significant digits, without an
// exponent (1000, not 1e+03).
func valueLabel(v float64, sig int) string {
	r, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'g', sig, 64), 64)
	return strconv.FormatFloat(r, 'f', -1, 64)
}

// valueRange is the y axis for values in [lo, hi]: a margin so no marker
// sits on the frame, and both ends rounded out to k·10^d, which are
// ticks, so even a flat series has a labelled range.
func valueRange(lo, hi float64) (float64, float64) {
	return roundTick(lo/1.2, math.Floor), roundTick(hi*1.2, math.Ceil)
}

// roundTick rounds v to k·10^d with round (math.Floor or math.Ceil).
func roundTick(v float64, round func(float64) float64) float64 {
	dec := math.Pow(10, math.Floor(math.Log10(v)))
	return dec * round(v/dec)
}

// logScale maps [lo, hi] logarithmically onto the pixels [p0, p1].
type logScale struct{ lo, hi, p0, p1 float64 }

func (s logScale) pos(v float64) float64 {
	return s.p0 + (s.p1-s.p0)*math.Log(v/s.lo)/math.Log(s.hi/s.lo)
}

// The page and the frame of the plot in it, in px.
const (
	svgW, svgH                     = 720, 480
	frameL, frameR, frameT, frameB = 78, svgW - 24, 62, svgH - 58
)

// SVG draws the series (those with points) against message size,
// under title (lines split at "\n").
func SVG(title, ylabel string, series ...Series) []byte {
	var drawn []Series
	xlo, xhi, ylo, yhi := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range series {
		if len(s.Pts) > 0 {
			drawn = append(drawn, s)
		}
		for _, p := range s.Pts {
			xlo, xhi, ylo, yhi = min(xlo, p.x), max(xhi, p.x), min(ylo, p.y), max(yhi, p.y)
		}
	}
	xs := logScale{xlo / 1.3, xhi * 1.3, frameL, frameR}
	ylo, yhi = valueRange(ylo, yhi)
	ys := logScale{ylo, yhi, frameB, frameT}
	// The legend, in the first corner that no point falls in: top left
	// first (small messages have the least bandwidth and the least
	// latency), then top right, bottom right, bottom left.
	wide := 0
	for _, s := range drawn {
		wide = max(wide, len([]rune(s.Name)))
	}
	lw, lh := 48+7*wide, 8+18*len(drawn)
	lx, ly, ok := legendCorner(lw, lh, func(x0, y0, x1, y1 float64) bool {
		for _, s := range drawn {
			for _, p := range s.Pts {
				if x, y := xs.pos(p.x), ys.pos(p.y); x > x0 && x < x1 && y > y0 && y < y1 {
					return true
				}
			}
		}
		return false
	})
	if !ok {
		// Every corner has points: raise the top of the y axis until
		// they all lie below a legend in the top left.
		free := float64(12 + lh + 5)
		ys.hi = roundTick(ys.lo*math.Pow(ys.hi/ys.lo, (frameB-frameT)/(frameB-frameT-free)), math.Ceil)
	}

	var b strings.Builder
	pf := func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }
	pf(`<?xml version="1.0" encoding="UTF-8"?>` + "\n")
	pf(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %[1]d %[2]d" font-family="sans-serif" font-size="12">`+"\n", svgW, svgH)
	pf(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	for i, line := range strings.Split(title, "\n") {
		size, weight := 12, "normal"
		if i == 0 {
			size, weight = 15, "bold"
		}
		pf(`<text x="%d" y="%d" text-anchor="middle" font-size="%d" font-weight="%s">%s</text>`+"\n",
			svgW/2, 24+20*i, size, weight, svgEscape(line))
	}

	// Grid lines, tick marks outside the frame and tick labels; labelled
	// ticks have the darker line and the longer mark.
	grid := func(tk axisTick) (string, int) {
		if tk.label != "" {
			return "#cccccc", 6
		}
		return "#ececec", 3
	}
	for _, tk := range sizeTicks(xs.lo, xs.hi) {
		x := xs.pos(tk.value)
		c, n := grid(tk)
		pf(`<path d="M%.1f %d V%d" stroke="%s"/>`, x, frameT, frameB, c)
		pf(`<path d="M%.1f %d v%d" stroke="black"/>`+"\n", x, frameB, n)
		if tk.label != "" {
			pf(`<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, frameB+20, tk.label)
		}
	}
	for _, tk := range logTicks(ys.lo, ys.hi) {
		y := ys.pos(tk.value)
		c, n := grid(tk)
		pf(`<path d="M%d %.1f H%d" stroke="%s"/>`, frameL, y, frameR, c)
		pf(`<path d="M%d %.1f h%d" stroke="black"/>`+"\n", frameL, y, -n)
		if tk.label != "" {
			pf(`<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", frameL-9, y+4, tk.label)
		}
	}
	pf(`<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="black"/>`+"\n", frameL, frameT, frameR-frameL, frameB-frameT)
	pf(`<text x="%d" y="%d" text-anchor="middle">message size [bytes] (log2)</text>`+"\n", (frameL+frameR)/2, svgH-14)
	pf(`<text transform="translate(20 %d) rotate(-90)" text-anchor="middle">%s</text>`+"\n", (frameT+frameB)/2, svgEscape(ylabel))

	// The series: lines first, then the markers, the line's on top.
	for _, s := range drawn {
		if s.Line {
			pf(`<polyline fill="none" stroke="%s" stroke-width="1.5" points="`, s.Color)
			for i, p := range s.Pts {
				if i > 0 {
					pf(" ")
				}
				pf("%.1f,%.1f", xs.pos(p.x), ys.pos(p.y))
			}
			pf(`"/>` + "\n")
		}
	}
	for i := len(drawn) - 1; i >= 0; i-- {
		for _, p := range drawn[i].Pts {
			svgMarker(&b, drawn[i].Mark, drawn[i].Color, xs.pos(p.x), ys.pos(p.y))
		}
	}

	// The legend, where it was placed above.
	pf(`<rect x="%d" y="%d" width="%d" height="%d" fill="white" stroke="#999999"/>`+"\n", lx, ly, lw, lh)
	for i, s := range drawn {
		y := float64(ly + 13 + 18*i)
		if s.Line {
			pf(`<path d="M%d %.1f h24" stroke="%s" stroke-width="1.5"/>`+"\n", lx+8, y, s.Color)
		}
		svgMarker(&b, s.Mark, s.Color, float64(lx+20), y)
		pf(`<text x="%d" y="%.1f">%s</text>`+"\n", lx+40, y+4, svgEscape(s.Name))
	}
	pf("</svg>\n")
	return []byte(b.String())
}

// legendCorner places a w×h legend 12 px inside a corner of the frame:
// the first whose box, with a marker's size around it, has no point
// (taken reports whether one lies in x0..x1, y0..y1); top left and
// false if none.
func legendCorner(w, h int, taken func(x0, y0, x1, y1 float64) bool) (int, int, bool) {
	left, top, right, bottom := frameL+12, frameT+12, frameR-12-w, frameB-12-h
	for _, c := range [][2]int{{left, top}, {right, top}, {right, bottom}, {left, bottom}} {
		if !taken(float64(c[0]-5), float64(c[1]-5), float64(c[0]+w+5), float64(c[1]+h+5)) {
			return c[0], c[1], true
		}
	}
	return left, top, false
}

// svgMarker draws one point: a filled circle, or a stroked plus, cross
// or triangle.
func svgMarker(b *strings.Builder, m plotMark, color string, x, y float64) {
	switch m {
	case MarkCircle:
		fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", x, y, color)
		return
	case MarkPlus:
		fmt.Fprintf(b, `<path d="M%.1f %.1f h8 M%.1f %.1f v8"`, x-4, y, x, y-4)
	case MarkCross:
		fmt.Fprintf(b, `<path d="M%.1f %.1f l7 7 M%.1f %.1f l7 -7"`, x-3.5, y-3.5, x-3.5, y+3.5)
	case MarkTriangle:
		fmt.Fprintf(b, `<path d="M%.1f %.1f l4 7 h-8 z"`, x, y-4.5)
	}
	fmt.Fprintf(b, ` fill="none" stroke="%s" stroke-width="1.5"/>`+"\n", color)
}

// svgEscape escapes s for text content.
func svgEscape(s string) string {
	var b strings.Builder
	xml.EscapeText(&b, []byte(s))
	return b.String()
}
