package tcp

import (
	"bytes"
	"io"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/seqnum"
)

// recordSource produces records of the given sizes, back to back, and
// tells their boundaries (Records).
type recordSource struct {
	data []byte
	pos  int
	ends []int // ascending
}

func newRecordSource(sizes []int, fill byte) *recordSource {
	r := &recordSource{}
	for i, n := range sizes {
		for j := 0; j < n; j++ {
			r.data = append(r.data, fill+byte(i)+byte(j*7))
		}
		r.ends = append(r.ends, len(r.data))
	}
	return r
}

func (r *recordSource) Read(p []byte) (int, error) {
	if r.pos == len(r.data) {
		return 0, io.EOF
	}
	n := copy(p, r.data[r.pos:])
	r.pos += n
	return n, nil
}

func (r *recordSource) RecordRest() int {
	for _, e := range r.ends {
		if e > r.pos {
			return e - r.pos
		}
	}
	return 0
}

func (r *recordSource) RecordFit(max int) int {
	fit := 0
	for _, e := range r.ends {
		if e > r.pos && e-r.pos <= max {
			fit = e - r.pos
		}
	}
	return fit
}

// plannedSource is a recordSource that plans (RecordPlanner).
type plannedSource struct{ *recordSource }

func (r plannedSource) RecordPlan(max int, ls []int) []int {
	pos := r.pos
	for _, e := range r.ends {
		if e > pos && e-r.pos <= max {
			ls = append(ls, e-pos)
			pos = e
		}
	}
	return ls
}

// TestRecordCuts: with the records' boundaries known, every data segment,
// first transmission or retransmission, under loss, reordering and
// duplication, starts on a boundary unless the record before it was
// longer than a segment, and none ends inside a record's last 4 bytes
// (the MPA CRC, which Linux siw cannot take split); a run of equal records
// leaves as a super-segment cut at the record's length. The bytes arrive
// whole.
func TestRecordCuts(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sizes   func(i int) int
		gso     bool
		planned bool
	}{
		{"full", func(int) int { return 1448 }, false, false},
		{"short", func(int) int { return 1000 }, true, false},
		{"mixed", func(i int) int { return []int{1448, 64, 300, 1448, 1448, 24, 3000, 1447, 1449}[i%9] }, true, false},
		{"mixed-planned", func(i int) int { return []int{1448, 64, 300, 1448, 1448, 24, 3000, 1447, 1449}[i%9] }, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPath(t, 3)
			p.loss, p.dup, p.jitter = 0.02, 0.01, 200*time.Microsecond
			type seg struct {
				seq          seqnum.Value
				n, segSize   int
				retransmit   bool
				highestSoFar seqnum.Value
			}
			var segs []seg
			var high seqnum.Value
			p.drop = func(from int, s *Segment) bool {
				if from == 0 && len(s.Payload) > 0 {
					end := s.Seq.Add(seqnum.Size(len(s.Payload)))
					segs = append(segs, seg{seq: s.Seq, n: len(s.Payload), segSize: s.SegSize, retransmit: s.Seq.LessThan(high)})
					if high.LessThan(end) {
						high = end
					}
				}
				return false
			}
			cfg := Config{MSS: 1460, MinRTO: 10 * time.Millisecond}
			if tc.gso {
				cfg.GSOMax = 64 << 10
			}
			p.connect(cfg, cfg, 1000, 5000)
			high = p.conns[0].sndNxt
			var sizes []int
			for i := 0; i < 900; i++ {
				sizes = append(sizes, tc.sizes(i))
			}
			src := newRecordSource(sizes, 1)
			starts, ends := map[int]bool{0: true}, map[int]bool{}
			long := map[int]bool{} // starts of records longer than a segment
			prev := 0
			for _, e := range src.ends {
				starts[e], ends[e] = true, true
				if e-prev > 1448 {
					long[prev] = true
				}
				prev = e
			}
			var got bytes.Buffer
			buf := make([]byte, 64<<10)
			a, b := p.conns[0], p.conns[1]
			for steps := 0; got.Len() < len(src.data); steps++ {
				if steps > 5_000_000 {
					t.Fatalf("stalled: %d of %d bytes", got.Len(), len(src.data))
				}
				var rec Records = src
				if tc.planned {
					rec = plannedSource{src}
				}
				if src.pos < len(src.data) && a.Writable() > 0 {
					if _, err := a.WriteFrom(src, len(src.data)-src.pos, rec, p.now); err != nil {
						t.Fatal(err)
					}
				}
				for {
					k, _ := b.Read(buf, p.now)
					got.Write(buf[:k])
					if k == 0 {
						break
					}
				}
				if !p.step() && got.Len() < len(src.data) {
					t.Fatalf("no event: %d of %d bytes", got.Len(), len(src.data))
				}
			}
			if !bytes.Equal(got.Bytes(), src.data) {
				t.Fatalf("received bytes differ at %d", firstDiff(got.Bytes(), src.data))
			}
			iss := seqnum.Value(1001)
			var off, rtx, supers int
			for _, s := range segs {
				at := int(iss.Size(s.seq))
				if s.retransmit {
					rtx++
				}
				parts := []int{s.n}
				if s.segSize > 0 && s.n > s.segSize {
					supers++
					parts = parts[:0]
					for k := 0; k < s.n; k += s.segSize {
						parts = append(parts, min(s.segSize, s.n-k))
					}
				}
				for _, n := range parts {
					if !starts[at] && !long[lastStart(src.ends, at)] {
						off++
						if off < 5 {
							t.Errorf("segment at %d (%d bytes, retransmission %v) starts inside a record", at, n, s.retransmit)
						}
					}
					end := at + n
					for d := 1; d < trailerSize; d++ {
						if ends[end+d] {
							t.Errorf("segment at %d (%d bytes) ends %d bytes before a record's end: its trailer is split", at, n, d)
						}
					}
					at = end
				}
			}
			t.Logf("%d data segments (%d retransmissions, %d super-segments), %d starting inside a record", len(segs), rtx, supers, off)
			if off > 0 {
				t.Fatalf("%d segments start inside a record", off)
			}
			if rtx == 0 {
				t.Fatal("no retransmission: the loss did not come into play")
			}
			if tc.gso && supers == 0 {
				t.Fatal("no super-segment")
			}
		})
	}
}

// lastStart is the start of the record that holds offset at.
func lastStart(ends []int, at int) int {
	start := 0
	for _, e := range ends {
		if e > at {
			return start
		}
		start = e
	}
	return start
}

// TestRecordRestWait: a write that ends inside a record holds that
// record's start back for its rest; the rest's write sends it whole, and a
// Close, after which no rest can come, sends what there is at once.
func TestRecordRestWait(t *testing.T) {
	p := established(t, Config{}, nil)
	src := newRecordSource([]int{1000, 1448}, 1)
	if n, err := p.c.WriteFrom(src, 1500, src, p.now); n != 1500 || err != nil {
		t.Fatalf("WriteFrom: %d, %v", n, err)
	}
	segs := p.take()
	if len(segs) != 1 || len(segs[0].Payload) != 1000 {
		t.Fatalf("sent %v, want only the whole first record", segs)
	}
	// The rest of the second record completes it.
	if n, err := p.c.WriteFrom(src, 948, src, p.now); n != 948 || err != nil {
		t.Fatalf("WriteFrom: %d, %v", n, err)
	}
	if segs := p.take(); len(segs) != 1 || segs[0].Seq != 2001 || len(segs[0].Payload) != 1448 {
		t.Fatalf("sent %v, want the second record whole", segs)
	}
	// A record cut short, then Close: it goes with the FIN.
	src = newRecordSource([]int{1448}, 3)
	p.c.WriteFrom(src, 700, src, p.now)
	if segs := p.take(); len(segs) != 0 {
		t.Fatalf("sent %v of a record's start", segs)
	}
	p.c.Close(p.now)
	segs = p.take()
	if len(segs) != 1 || len(segs[0].Payload) != 700 || !segs[0].has(header.TCPFlagFin) {
		t.Fatalf("after Close: %v, want the 700 bytes with the FIN", segs)
	}
}
