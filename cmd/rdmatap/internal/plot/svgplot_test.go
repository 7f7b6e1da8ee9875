package plot

import (
	"math"
	"strings"
	"testing"
)

func TestPlotSizeLabels(t *testing.T) {
	for e, want := range map[int]string{1: "2", 6: "64", 9: "512", 10: "1K", 16: "64K", 20: "1M", 23: "8M", 30: "1G"} {
		if got := sizeLabel(e); got != want {
			t.Errorf("sizeLabel(%d) = %q, want %q", e, got, want)
		}
	}
	// A full sweep marks every power of two and labels every other one,
	// both ends included.
	ticks := sizeTicks(2/1.3, (1<<23)*1.3)
	if len(ticks) != 23 || ticks[0].value != 2 || ticks[22].value != 1<<23 {
		t.Errorf("%d size ticks, %v", len(ticks), ticks)
	}
	if got := tickLabels(ticks); got != "2 8 32 128 512 2K 8K 32K 128K 512K 2M 8M" {
		t.Errorf("size labels %q", got)
	}
	// A short sweep labels every size.
	if got := tickLabels(sizeTicks(2/1.3, 64*1.3)); got != "2 4 8 16 32 64" {
		t.Errorf("2..64: size labels %q", got)
	}
}

func tickLabels(ticks []axisTick) string {
	var l []string
	for _, tk := range ticks {
		if tk.label != "" {
			l = append(l, tk.label)
		}
	}
	return strings.Join(l, " ")
}

// TestPlotValueTicks: the y axis marks 1..9 of each decade and labels
// the decades; a range of less than two decades is labelled at 1, 2 and
// 5 too, a narrower one at every tick or, with no two ticks, its ends.
func TestPlotValueTicks(t *testing.T) {
	for _, c := range []struct {
		lo, hi float64
		ticks  int
		labels string
	}{
		{1, 10000, 37, "1 10 100 1000 10000"},
		{2, 7000, 8 + 18 + 7, "10 100 1000"},
		{0.2, 3e6, 8 + 6*9 + 3, "1 10 100 1000 10000 100000 1000000"},
		{0.002, 0.05, 8 + 5, "0.002 0.005 0.01 0.02 0.05"}, // Gb/sec of small messages
		{15, 60, 5, "20 50"},
		{25, 45, 2, "30 40"},
		{21, 29, 2, "21 29"}, // no tick inside: the ends
		{9.5, 11, 3, "9.5 10 11"},
	} {
		ticks := logTicks(c.lo, c.hi)
		if len(ticks) != c.ticks || tickLabels(ticks) != c.labels {
			t.Errorf("logTicks(%g, %g): %d ticks labelled %q, want %d labelled %q",
				c.lo, c.hi, len(ticks), tickLabels(ticks), c.ticks, c.labels)
		}
		for _, tk := range ticks {
			if tk.value < c.lo*(1-1e-9) || tk.value > c.hi*(1+1e-9) {
				t.Errorf("logTicks(%g, %g): tick %g outside", c.lo, c.hi, tk.value)
			}
		}
	}
	// The axis range: a margin, ends rounded out to ticks, so a flat or
	// one-point series gets at least two labelled ticks.
	for _, c := range []struct{ lo, hi, wantLo, wantHi float64 }{
		{3.2, 5400, 2, 7000},
		{21, 29, 10, 40},
		{25, 25, 20, 30},
		{0.004, 0.04, 0.003, 0.05},
	} {
		lo, hi := valueRange(c.lo, c.hi)
		if math.Abs(lo/c.wantLo-1) > 1e-9 || math.Abs(hi/c.wantHi-1) > 1e-9 {
			t.Errorf("valueRange(%g, %g) = %g, %g, want %g, %g", c.lo, c.hi, lo, hi, c.wantLo, c.wantHi)
		}
		if n := len(strings.Fields(tickLabels(logTicks(lo, hi)))); n < 2 {
			t.Errorf("valueRange(%g, %g): %d labels", c.lo, c.hi, n)
		}
	}
	for v, want := range map[float64]string{1e6: "1000000", 0.1 * 3: "0.3", 1234.5678: "1234.57"} {
		if got := valueLabel(v, 6); got != want {
			t.Errorf("valueLabel(%v) = %q, want %q", v, got, want)
		}
	}
}
