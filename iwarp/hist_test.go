package iwarp

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestHistBuckets(t *testing.T) {
	// Every value falls in the bucket whose bounds hold it, and the
	// buckets tile the range without gaps.
	prevHi := uint64(0)
	for i := 0; i < histBuckets; i++ {
		lo, hi := histBounds(i)
		if lo != prevHi || hi <= lo {
			t.Fatalf("bucket %d: [%d, %d) after %d", i, lo, hi, prevHi)
		}
		prevHi = hi
		for _, v := range []uint64{lo, hi - 1, lo + (hi-lo)/2} {
			if i < histBuckets-1 && histBucket(v) != i {
				t.Fatalf("value %d: bucket %d, want %d", v, histBucket(v), i)
			}
		}
	}
	if histBucket(1<<62) != histBuckets-1 {
		t.Fatal("huge value not in the last bucket")
	}
}

func TestHistQuantile(t *testing.T) {
	var h DurationHist
	var empty Histogram
	if empty.Quantile(0.5) != 0 {
		t.Fatal("quantile of nothing")
	}
	r := rand.New(rand.NewPCG(1, 2))
	var v []time.Duration
	for i := 0; i < 10000; i++ {
		d := time.Duration(r.ExpFloat64() * 20e3) // mean 20 µs
		v = append(v, d)
		h.Add(d)
	}
	h.Add(-time.Second) // counts as zero
	v = append(v, 0)
	slices.Sort(v)
	s := h.Load()
	if s.Count() != uint64(len(v)) {
		t.Fatalf("count %d, want %d", s.Count(), len(v))
	}
	for _, q := range []float64{0, 0.1, 0.5, 0.9, 0.99, 1} {
		k := int(q*float64(len(v))+0.999999) - 1
		want := v[max(k, 0)]
		got := s.Quantile(q)
		if d := float64(got-want) / float64(max(want, 1)); d > 0.07 || d < -0.07 {
			if want > 16 { // exact below 16 ns
				t.Errorf("q %.2f: %v, want %v (within 7%%)", q, got, want)
			}
		}
	}
	// Sub and Add undo each other.
	var h2 DurationHist
	h2.Add(5 * time.Microsecond)
	a := h2.Load()
	h2.Add(7 * time.Millisecond)
	b := h2.Load()
	d := b.Sub(&a)
	if d.Count() != 1 || d.Quantile(0.5) < 6*time.Millisecond || d.Quantile(0.5) > 8*time.Millisecond {
		t.Fatalf("delta: count %d, median %v", d.Count(), d.Quantile(0.5))
	}
	d.Add(&a)
	if d != b {
		t.Fatal("Add(Sub) differs")
	}
}
