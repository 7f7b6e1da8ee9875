package iwarp

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// Histogram buckets: one per nanosecond below 16 ns, then histSub per
// power of two (a bucket spans 1/8 of its octave, so a quantile read from
// it is within about 6 % of the true value), up to 2^histMaxExp ns (~68 s);
// longer durations share the last bucket.
const (
	histSub     = 8
	histMaxExp  = 36
	histBuckets = 16 + (histMaxExp-4)*histSub
)

// DurationHist counts durations in log-linear buckets; Add is safe for
// concurrent use and allocates nothing.
type DurationHist struct {
	b [histBuckets]atomic.Uint64
}

// Add counts d (negative counts as zero).
func (h *DurationHist) Add(d time.Duration) {
	h.b[histBucket(uint64(max(d, 0)))].Add(1)
}

// Load returns a snapshot of the counts.
func (h *DurationHist) Load() Histogram {
	var s Histogram
	for i := range h.b {
		s[i] = h.b[i].Load()
	}
	return s
}

// Histogram is a snapshot of a DurationHist: counts per bucket.
type Histogram [histBuckets]uint64

func histBucket(v uint64) int {
	if v < 16 {
		return int(v)
	}
	e := bits.Len64(v) // v's leading one is bit e-1, e >= 5
	if e > histMaxExp {
		return histBuckets - 1
	}
	sub := int(v>>(e-4)) & (histSub - 1)
	return 16 + (e-5)*histSub + sub
}

// histBounds returns the durations bucket i counts, [lo, hi).
func histBounds(i int) (lo, hi uint64) {
	if i < 16 {
		return uint64(i), uint64(i) + 1
	}
	e := (i-16)/histSub + 5
	sub := uint64((i - 16) % histSub)
	w := uint64(1) << (e - 4)
	return (histSub + sub) * w, (histSub + sub + 1) * w
}

// Count returns the number of durations counted.
func (h *Histogram) Count() uint64 {
	var n uint64
	for _, c := range h {
		n += c
	}
	return n
}

// Sub returns the counts of h less those of an earlier snapshot o of the
// same histogram (what was counted in between).
func (h *Histogram) Sub(o *Histogram) Histogram {
	var d Histogram
	for i := range h {
		d[i] = h[i] - o[i]
	}
	return d
}

// Add adds o's counts to h.
func (h *Histogram) Add(o *Histogram) {
	for i := range h {
		h[i] += o[i]
	}
}

// Quantile returns the q-quantile (0 <= q <= 1) of the durations counted:
// the middle of the bucket it falls in. It returns 0 when none were.
func (h *Histogram) Quantile(q float64) time.Duration {
	n := h.Count()
	if n == 0 {
		return 0
	}
	q = min(max(q, 0), 1)
	// The rank of the quantile, 1-based: the smallest k with k >= q*n.
	rank := uint64(q * float64(n))
	if float64(rank) < q*float64(n) || rank == 0 {
		rank++
	}
	var seen uint64
	for i, c := range h {
		seen += c
		if seen >= rank {
			lo, hi := histBounds(i)
			return time.Duration(lo + (hi-lo)/2)
		}
	}
	return 0 // not reached
}
