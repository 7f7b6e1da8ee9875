package netstack

import (
	"context"
	"io"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// records is a RecordPayloader of one message: records of a fixed size
// and a shorter last one, as an MPA sender frames a message in FPDUs.
type records struct {
	data   []byte
	pos    int
	bounds []int // record ends, ascending
}

func newRecords(n, size, last int) *records {
	r := &records{data: make([]byte, n*size+last)}
	for i := 1; i <= n; i++ {
		r.bounds = append(r.bounds, i*size)
	}
	if last > 0 {
		r.bounds = append(r.bounds, n*size+last)
	}
	return r
}

func (r *records) Len() int { return len(r.data) - r.pos }

func (r *records) Read(p []byte) (int, error) {
	if r.pos == len(r.data) {
		return 0, io.EOF
	}
	n := copy(p, r.data[r.pos:])
	r.pos += n
	return n, nil
}

func (r *records) RecordRest() int {
	for _, b := range r.bounds {
		if b > r.pos {
			return b - r.pos
		}
	}
	return 0
}

// plain hides RecordRest.
type plain struct{ *records }

func (p plain) RecordRest() {}

// TestRecordAlignment: records that fill a segment each arrive one per
// segment, each segment starting on a record boundary, even when the send
// buffer cuts the writes short (RecordPayloader): only the rest of a cut
// record starts elsewhere. A payloader without RecordRest loses the
// alignment at every cut until its message ends (logged, for contrast).
func TestRecordAlignment(t *testing.T) {
	aligned := func(t *testing.T, record bool) (float64, int) {
		la, lb := NewLinkPair(LinkConfig{NoGSO: true, MTU: 1500})
		scfg := Config{Link: la, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}}
		a, err := New(scfg)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		scfg.Link, scfg.Addrs = lb, []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}
		b, err := New(scfg)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		b.EnableConnTaps()
		c1, c2 := connect(t, a, b)
		// A small send buffer: the writes (each a message of
		// many records) are cut short.
		c1.ep.SocketOptions().SetSendBufferSize(48<<10, true)
		size := c1.MaxPayload()
		const msgs, per, last = 12, 60, 300
		msgLen := per*size + last
		starts := map[uint64]bool{}
		for m := 0; m < msgs; m++ {
			for i := 0; i < per; i++ {
				starts[uint64(m*msgLen+i*size)] = true
			}
			starts[uint64(m*msgLen+per*size)] = true
		}
		var mu sync.Mutex
		var segs, good int
		if _, err := c2.TapSegments(func(off uint64, v [][]byte) {
			mu.Lock()
			segs++
			if starts[off] {
				good++
			}
			mu.Unlock()
		}, nil); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() {
			for m := 0; m < msgs; m++ {
				var pl interface {
					Len() int
					Read([]byte) (int, error)
				} = newRecords(per, size, last)
				if !record {
					pl = plain{pl.(*records)}
				}
				if _, err := c1.WritePayload(ctx, pl); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		for got := 0; got < msgs*msgLen; {
			n, err := c2.ReadTo(ctx, io.Discard, 0)
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		return float64(good) / float64(segs), segs
	}
	frac, segs := aligned(t, true)
	ctl, _ := aligned(t, false)
	t.Logf("segments starting on a record boundary: %.3f of %d with RecordRest, %.3f without", frac, segs, ctl)
	if frac < 0.9 {
		t.Fatalf("only %.3f of the segments start on a record boundary", frac)
	}
}
