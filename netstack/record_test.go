package netstack

import (
	"context"
	"fmt"
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

func (r *records) RecordFit(max int) int {
	if r.Len() <= max {
		return r.Len()
	}
	fit := 0
	for _, b := range r.bounds {
		if b > r.pos && b-r.pos <= max {
			fit = b - r.pos
		}
	}
	return fit
}

// plain hides RecordRest and RecordFit.
type plain struct{ *records }

func (p plain) RecordRest() {}
func (p plain) RecordFit()  {}

// TestRecordAlignment: records that fill a segment each arrive one per
// segment, each segment starting on a record boundary, even when the send
// buffer cuts the writes short (RecordPayloader): only the rest of a cut
// record starts elsewhere. A payloader without RecordRest loses the
// alignment at every cut until its message ends (logged, for contrast).
// On a GSO link, where the stack builds super-segments of many records
// (delivered unsplit here), every super-segment starts on a record
// boundary too (RecordFit): a write longer than the stack's largest
// super-segment is cut at one, which is no multiple of the record.
// rdmatap's TCP cuts its segments at the records' boundaries itself.
func TestRecordAlignment(t *testing.T) {
	for _, tcp := range []string{TCPGVisor, TCPRdmatap} {
		for _, gso := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/gso=%v", tcp, gso), func(t *testing.T) { recordAlignment(t, tcp, gso) })
		}
	}
}

func recordAlignment(t *testing.T, tcp string, gso bool) {
	const msgs, per, last = 12, 200, 300
	aligned := func(t *testing.T, record bool) (float64, int) {
		la, lb := NewLinkPair(LinkConfig{NoGSO: !gso, MTU: 1500})
		// A small send buffer: the writes (each a message of
		// many records) are cut short. (With GSO, one larger than a
		// super-segment: cut short or not, writes are longer than
		// one.)
		sndBuf := 48 << 10
		if gso {
			sndBuf = 1 << 20
		}
		scfg := Config{TCP: tcp, SndBufMax: sndBuf, Link: la, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}}
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
		if tcp == TCPGVisor {
			c1.ep.SocketOptions().SetSendBufferSize(int64(sndBuf), true)
		}
		size := c1.MaxPayload()
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
	if frac < 0.9 || gso && segs > msgs*per/2 {
		t.Fatalf("only %.3f of the segments start on a record boundary (%d segments)", frac, segs)
	}
}
