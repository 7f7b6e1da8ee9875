package iwarp

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/rdmatap/rdmatap/netstack"
)

// segRig is a segment placer of a QP of PD 7 with one remote-writable
// region between guard zones.
type segRig struct {
	p     *segPlacer
	stats *Stats
	mem   *MemTable
	reg   *Region
	guard []byte
}

func newSegRig(crc bool) *segRig {
	g := make([]byte, 3*4096)
	mem := NewMemTable()
	reg := &Region{Buf: g[4096:8192], Base: 0x10000, Access: AccessLocalWrite | AccessRemoteWrite, PD: 7}
	mem.Register(reg)
	st := new(Stats)
	qp := &QP{cfg: QPConfig{Mem: mem, PD: 7, Stats: st}}
	p := newSegPlacer(qp, crc, false)
	p.eager = true // no receiver: every segment is the placer's
	return &segRig{p: p, stats: st, mem: mem, reg: reg, guard: g}
}

// writeFPDU frames a non-last RDMA Write segment of payload at TO.
func (r *segRig) writeFPDU(stag uint32, to uint64, payload []byte, last bool) []byte {
	return rawFPDU(rawULPDU(DDPFields{Opcode: OpWrite, STag: stag, TO: to, Last: last}, payload), r.p.crcOn)
}

func (r *segRig) guardsClean(t *testing.T) {
	t.Helper()
	for i, c := range append(append([]byte(nil), r.guard[:4096]...), r.guard[8192:]...) {
		if c != 0 {
			t.Fatalf("guard byte %d written", i)
		}
	}
}

// TestSegmentPlacerChecks: what the placer places and what it leaves to the
// in-order path.
func TestSegmentPlacerChecks(t *testing.T) {
	payload := pattern(1024, 3)
	t.Run("known start", func(t *testing.T) {
		r := newSegRig(false)
		r.p.place(0, [][]byte{r.writeFPDU(r.reg.STag(), 0x10000, payload, false)})
		if !bytes.Equal(r.reg.Buf[:1024], payload) || r.p.stats.PlacedBytes.Load() != 1024 || r.p.stats.ByStream.Load() != 1 {
			t.Fatalf("not placed: stats %+v", r.p.stats)
		}
		// The same segment again (a retransmission) is not placed twice.
		clear(r.reg.Buf)
		r.p.place(0, [][]byte{r.writeFPDU(r.reg.STag(), 0x10000, payload, false)})
		if r.reg.Buf[0] != 0 || r.p.stats.Duplicates.Load() != 1024 {
			t.Fatal("a duplicate was placed again")
		}
		r.guardsClean(t)
	})
	t.Run("unknown start without CRC", func(t *testing.T) {
		// No marker, no CRC: a segment at a start nobody told is never
		// trusted, however much it looks like an FPDU.
		r := newSegRig(false)
		r.p.place(4096, [][]byte{r.writeFPDU(r.reg.STag(), 0x10000, payload, false)})
		if r.reg.Buf[0] != 0 || r.p.stats.Unframed.Load() != 1 {
			t.Fatal("placed from a guessed header without CRC")
		}
	})
	t.Run("aligned with CRC", func(t *testing.T) {
		r := newSegRig(true)
		seg := append(r.writeFPDU(r.reg.STag(), 0x10000, payload[:512], false), r.writeFPDU(r.reg.STag(), 0x10200, payload[512:], false)...)
		r.p.place(4096, [][]byte{seg[:100], seg[100:]})
		if !bytes.Equal(r.reg.Buf[:1024], payload) || r.p.stats.ByAlignment.Load() != 2 {
			t.Fatalf("aligned FPDUs with good CRCs not placed: %+v", r.p.stats)
		}
	})
	t.Run("bad CRC", func(t *testing.T) {
		r := newSegRig(true)
		fp := r.writeFPDU(r.reg.STag(), 0x10000, payload, false)
		fp[len(fp)-1] ^= 1
		r.p.place(0, [][]byte{fp})
		fp = r.writeFPDU(r.reg.STag(), 0x10000, payload, false)
		fp[100] ^= 1 // payload changed after the CRC
		r.p.place(8192, [][]byte{fp})
		if r.reg.Buf[0] != 0 || r.p.stats.RefusedCRC.Load() != 2 || r.p.stats.ByAlignment.Load() != 0 {
			t.Fatalf("an FPDU with a bad CRC was placed: %+v", r.p.stats)
		}
	})
	t.Run("checks", func(t *testing.T) {
		r := newSegRig(false)
		other := &Region{Buf: make([]byte, 4096), Base: 0x20000, Access: AccessRemoteWrite, PD: 8}
		r.mem.Register(other)
		ro := &Region{Buf: make([]byte, 4096), Base: 0x30000, Access: AccessLocalWrite, PD: 7}
		r.mem.Register(ro)
		var off uint64
		for _, fp := range [][]byte{
			r.writeFPDU(other.STag(), 0x20000, payload, false),      // another PD
			r.writeFPDU(ro.STag(), 0x30000, payload, false),         // no remote write
			r.writeFPDU(r.reg.STag(), 0x10000+3500, payload, false), // out of bounds
			r.writeFPDU(r.reg.STag()^0xff, 0x10000, payload, false), // wrong key
		} {
			r.p.place(off, [][]byte{fp})
			off += uint64(len(fp))
		}
		for _, b := range [][]byte{r.reg.Buf, other.Buf, ro.Buf} {
			if bytes.IndexFunc(b, func(c rune) bool { return c != 0 }) >= 0 {
				t.Fatal("a refused FPDU was placed")
			}
		}
		// The last FPDU of a Write is placed but for its last aligned
		// word, which waits for the Write's delivery in order; a Send
		// is left in order.
		last := r.writeFPDU(r.reg.STag(), 0x10000, payload, true)
		r.p.place(off, [][]byte{last})
		off += uint64(len(last))
		send := rawFPDU(rawULPDU(DDPFields{Opcode: OpSend, QN: QNSend, MSN: 1}, payload), false)
		r.p.place(off, [][]byte{send})
		if r.p.stats.RefusedSTag.Load() != 4 || r.p.stats.LeftInOrder.Load() != 1 || r.p.stats.PlacedBytes.Load() != 1024 {
			t.Fatalf("stats %+v", r.p.stats)
		}
		if !bytes.Equal(r.reg.Buf[:1020], payload[:1020]) || !bytes.Equal(r.reg.Buf[1020:1024], make([]byte, 4)) {
			t.Fatal("the last FPDU was not placed up to its last word")
		}
		for _, b := range [][]byte{other.Buf, ro.Buf} {
			if bytes.IndexFunc(b, func(c rune) bool { return c != 0 }) >= 0 {
				t.Fatal("a refused FPDU was placed")
			}
		}
		r.guardsClean(t)
	})
	t.Run("in order first", func(t *testing.T) {
		// An FPDU the in-order path has reached is its own.
		r := newSegRig(false)
		fp := r.writeFPDU(r.reg.STag(), 0x10000, payload, false)
		if e, _ := r.p.claimInOrder(0, uint64(len(fp))); e != nil {
			t.Fatal("claimed an FPDU nobody placed")
		}
		r.p.place(0, [][]byte{fp})
		if r.reg.Buf[0] != 0 {
			t.Fatal("placed an FPDU the in-order path had reached")
		}
		// Its successor's start is known now.
		fp2 := r.writeFPDU(r.reg.STag(), 0x10400, payload[:64], false)
		r.p.place(uint64(len(fp)), [][]byte{fp2})
		e, stale := r.p.claimInOrder(uint64(len(fp)), uint64(len(fp)+len(fp2)))
		if e == nil || stale || !e.done || e.payLen != 64 || !bytes.Equal(r.reg.Buf[1024:1088], payload[:64]) {
			t.Fatalf("successor not placed early: %+v", e)
		}
	})
	t.Run("stale", func(t *testing.T) {
		// An FPDU placed at a start the stream then passes without an
		// FPDU beginning there was never the stream's.
		r := newSegRig(true)
		r.p.place(64, [][]byte{r.writeFPDU(r.reg.STag(), 0x10000, payload, false)})
		if r.p.stats.PlacedBytes.Load() == 0 {
			t.Fatal("aligned FPDU not placed")
		}
		if _, stale := r.p.claimInOrder(0, 128); stale {
			t.Fatal("stale before the stream passed it")
		}
		if _, stale := r.p.claimInOrder(128, 256); !stale {
			t.Fatal("a placed FPDU the stream passed was not reported")
		}
	})
}

// FuzzSegmentPlacer feeds arbitrary segments at arbitrary offsets to the
// segment placer, with and without markers: it never panics, never writes
// outside its region, and without CRC or markers places only from a start
// it was told.
func FuzzSegmentPlacer(f *testing.F) {
	r := newSegRig(true)
	f.Add(r.writeFPDU(r.reg.STag(), 0x10000, pattern(100, 1), false), uint64(0), true, 7, false)
	f.Add(r.writeFPDU(r.reg.STag(), 0x10ff0, pattern(100, 1), false), uint64(4), true, 1, false)
	f.Add(refMark(r.writeFPDU(r.reg.STag(), 0x10000, pattern(1000, 1), false), true).wire, uint64(0), true, 3, true)
	r = newSegRig(false)
	f.Add(r.writeFPDU(r.reg.STag(), 0x10000, pattern(100, 1), false), uint64(0), false, 0, false)
	f.Add(refMark(r.writeFPDU(r.reg.STag(), 0x10000, pattern(1000, 1), false), false).wire, uint64(0), false, 0, true)
	f.Fuzz(func(t *testing.T, seg []byte, off uint64, crc bool, cut int, markers bool) {
		r := newSegRig(crc)
		r.p.markers = markers
		// Seeds name the region by its STag: keep the fuzzer's.
		if len(seg) >= MPALengthSize+DDPTaggedHeaderSize {
			h := DDPHeader(seg[MPALengthSize:])
			if h.Tagged() && h.STag()&0xffffff00 == r.reg.STag()&0xffffff00 {
				binary.BigEndian.PutUint32(seg[MPALengthSize+2:], r.reg.STag())
			}
		}
		views := [][]byte{seg}
		if cut > 0 && cut < len(seg) {
			views = [][]byte{seg[:cut], seg[cut:]}
		}
		r.p.place(off, views)
		r.guardsClean(t)
		if !crc && !markers && off != 0 && r.p.stats.PlacedBytes.Load() != 0 {
			t.Fatal("placed without CRC from a start nobody told")
		}
		if r.stats.PlacedBytes.Load() != r.p.stats.PlacedBytes.Load() {
			t.Fatal("device and placer counts differ")
		}
	})
}

// TestSegmentPlacerMarkers: with markers, FPDUs are found by the markers in
// segments cut anywhere and fed in any order; every RDMA Write FPDU wholly
// in some segment is placed where it belongs (CRC off and on, the CRC over
// the FPDU with its markers), nothing else is written.
func TestSegmentPlacerMarkers(t *testing.T) {
	for _, crc := range []bool{false, true} {
		r := newSegRig(crc)
		r.p.markers = true
		rng := rand.New(rand.NewPCG(8, 9))
		// 24 non-last Writes of 100 octets each, 128 octets apart.
		var fpdus []byte
		want := make([]byte, len(r.reg.Buf))
		for i := 0; i < 24; i++ {
			pl := pattern(100, byte(i))
			to := uint64(0x10000 + 128*i)
			copy(want[128*i:], pl)
			fpdus = append(fpdus, rawFPDU(rawULPDU(DDPFields{Opcode: OpWrite, STag: r.reg.STag(), TO: to}, pl), false)...)
		}
		wire := refMark(fpdus, crc).wire
		// Cut into segments of random sizes, fed last first.
		var cuts []int
		for pos := 0; pos < len(wire); pos += 300 + rng.IntN(700) {
			cuts = append(cuts, pos)
		}
		cuts = append(cuts, len(wire))
		for i := len(cuts) - 2; i >= 0; i-- {
			seg := wire[cuts[i]:cuts[i+1]]
			k := rng.IntN(len(seg) + 1)
			r.p.place(uint64(cuts[i]), [][]byte{seg[:k], seg[k:]})
		}
		if r.p.stats.ByMarker.Load() == 0 || r.p.stats.PlacedBytes.Load() == 0 {
			t.Fatalf("crc %v: nothing located by a marker: %+v", crc, r.p.stats)
		}
		for i := 0; i < 24; i++ {
			got := r.reg.Buf[128*i : 128*i+100]
			if !bytes.Equal(got, want[128*i:128*i+100]) && bytes.IndexFunc(got, func(c rune) bool { return c != 0 }) >= 0 {
				t.Fatalf("crc %v: Write %d placed wrong", crc, i)
			}
			if rest := r.reg.Buf[128*i+100 : 128*i+128]; bytes.IndexFunc(rest, func(c rune) bool { return c != 0 }) >= 0 {
				t.Fatalf("crc %v: bytes written between Writes", crc)
			}
		}
		if r.p.stats.RefusedCRC.Load() != 0 {
			t.Fatalf("crc %v: %d good FPDUs failed their CRC", crc, r.p.stats.RefusedCRC.Load())
		}
		t.Logf("crc %v: %d bytes placed, %d FPDUs by marker, %d chained", crc, r.p.stats.PlacedBytes.Load(), r.p.stats.ByMarker.Load(), r.p.stats.ByStream.Load())
		r.guardsClean(t)
	}
}

// TestSpans: the ranges seen beyond the contiguous data merge as they
// come, and the contiguous data takes up those that join it.
func TestSpans(t *testing.T) {
	var s spans
	s.add(10, 20)
	s.add(30, 40)
	s.add(20, 25) // adjacent to the first
	s.add(50, 60)
	s.add(35, 52) // bridges two
	if want := (spans{{10, 25}, {30, 60}}); !slices.Equal(s, want) {
		t.Fatalf("spans %v, want %v", s, want)
	}
	if c := s.advance(5); c != 5 || len(s) != 2 {
		t.Fatalf("advance(5) = %d, %v", c, s)
	}
	if c := s.advance(10); c != 25 || len(s) != 1 {
		t.Fatalf("advance(10) = %d, %v", c, s)
	}
	if c := s.advance(40); c != 60 || len(s) != 0 {
		t.Fatalf("advance(40) = %d, %v", c, s)
	}
	for i := 0; i < 2*maxSpans; i++ {
		s.add(uint64(100+10*i), uint64(105+10*i))
	}
	if len(s) != maxSpans || s[0][0] != 100 {
		t.Fatalf("%d spans from %v: want the nearest %d", len(s), s[0], maxSpans)
	}
}

// TestSegmentPlacerLateTap: bytes the receiver parsed count as seen even
// when the tap never saw their segments (they arrived before it was
// installed, or it refused one TCP took): the segment after them is in
// order, not beyond a hole.
func TestSegmentPlacerLateTap(t *testing.T) {
	payload := pattern(1024, 5)
	for _, parsed := range []bool{false, true} {
		r := newSegRig(true)
		r.p.eager = false
		first := r.writeFPDU(r.reg.STag(), 0x10000, payload, false)
		next := r.writeFPDU(r.reg.STag(), 0x10000+1024, payload, false)
		if parsed {
			r.p.parsed.Store(uint64(len(first))) // the receiver had the first FPDU from TCP
		}
		r.p.place(uint64(len(first)), [][]byte{next})
		ooo := r.p.stats.OutOfOrderBytes.Load()
		if parsed && ooo != 0 {
			t.Fatalf("a segment right after what the receiver parsed was taken as beyond a hole (%d bytes)", ooo)
		}
		if !parsed && ooo != 1024 {
			t.Fatalf("a segment after bytes nobody saw: %d bytes beyond a hole, want 1024", ooo)
		}
	}
}

// TestSegmentKeptFeedsFill: segments that reached the tap in order but not
// yet TCP's receive queue (TCP's processor goroutine runs behind the link's)
// are kept, so that when a later segment fills a hole behind them the tap
// feeds the receiver all of it and the held-back message completes at
// once; TCP's copy, when it comes, is skipped. The tap keeps segments only
// while holes come (after one, keepAfterHole segments): on a clean stream,
// and without kept segments at all (retain nil: a source that cannot keep
// packets), the fill waits for TCP.
func TestSegmentKeptFeedsFill(t *testing.T) {
	for _, tc := range []struct {
		name         string
		retain, hole bool
	}{{"after a hole", true, true}, {"clean stream", true, false}, {"no retain", false, true}} {
		keep := tc.retain && tc.hole
		guard := make([]byte, 5*4096)
		mem, reg := fuzzMem(guard[:3*4096])
		rbuf := &Region{Buf: guard[3*4096 : 4*4096], Base: 0x20000, Access: AccessLocalWrite, PD: 1}
		mem.Register(rbuf)
		rq, _ := NewRecvQueue(4, 2)
		rq.Post(9, []SGE{{Addr: rbuf.Base, Length: 1024, LKey: rbuf.STag()}})
		st := new(Stats)
		rcq := newTestCQ()
		qp, err := NewQP(QPConfig{Num: 1, PD: 1, Mem: mem, SendCQ: newTestCQ(), RecvCQ: rcq, RQ: rq, Stats: st})
		if err != nil {
			t.Fatal(err)
		}
		s := &nullStream{closed: make(chan struct{})}
		if err := qp.Start(s, ConnParams{CRC: true, IRD: 2, ORD: 2}); err != nil {
			t.Fatal(err)
		}
		seg := attachSegPlacer(qp, true, false)

		// A two-FPDU Write, then a Send: each FPDU a segment, longer
		// than the quick feed takes.
		pa, pb := pattern(700, 1), pattern(700, 2)
		a := rawFPDU(rawULPDU(DDPFields{Opcode: OpWrite, STag: reg.STag(), TO: reg.Base}, pa), true)
		b := rawFPDU(rawULPDU(DDPFields{Opcode: OpWrite, Last: true, STag: reg.STag(), TO: reg.Base + 700}, pb), true)
		c := rawFPDU(rawULPDU(DDPFields{Opcode: OpSend, Last: true, QN: QNSend, MSN: 1}, []byte("done")), true)
		var retain func() netstack.Kept
		if tc.retain {
			retain = func() netstack.Kept { return netstack.Kept{} }
		}
		if tc.hole {
			seg.keepFor = keepAfterHole // holes came before
		}
		// The tap sees a (in order; TCP has not taken it), then c (beyond
		// the hole b leaves), then b.
		seg.placeRetain(0, [][]byte{a}, retain)
		seg.placeRetain(uint64(len(a)+len(b)), [][]byte{c}, retain)
		seg.placeRetain(uint64(len(a)), [][]byte{b}, retain)
		early := len(rcq.ch)
		if keep && early != 1 {
			t.Fatalf("%s: %d completions before TCP handed the stream over, want the Send's", tc.name, early)
		}
		if !keep && early != 0 {
			t.Fatalf("%s: %d completions before TCP handed the stream over", tc.name, early)
		}
		if g := seg.stats; !keep && g.KeptBytes.Load() != 0 {
			t.Fatalf("%s: kept %d bytes", tc.name, g.KeptBytes.Load())
		}
		if g := seg.stats; keep && (g.KeptBytes.Load() != 700 || g.FillsFed.Load() != 1) {
			t.Fatalf("kept %d bytes (want 700), fills fed %d (want 1)", g.KeptBytes.Load(), g.FillsFed.Load())
		}
		// TCP hands the stream over.
		qp.rxMu.Lock()
		qp.rx.in.Write(slices.Concat(a, b, c))
		qp.rx.afterRead()
		qp.rxMu.Unlock()
		if n := len(rcq.ch); n != 1 {
			t.Fatalf("%s: %d completions, want 1", tc.name, n)
		}
		if cpl := <-rcq.ch; cpl.Status != StatusSuccess || cpl.ID != 9 || cpl.ByteLen != 4 {
			t.Fatalf("%s: completion %+v", tc.name, cpl)
		}
		if !bytes.Equal(reg.Buf[:1400], slices.Concat(pa, pb)) || string(rbuf.Buf[:4]) != "done" {
			t.Fatalf("%s: the payload did not land where it belongs", tc.name)
		}
		if got := st.PlacementCopies.Load(); got != 3 {
			t.Fatalf("%s: %d placement copies for 3 FPDUs", tc.name, got)
		}
		close(s.closed)
		qp.Close()
		<-qp.Done()
	}
}

// TestStartQueue: the placer's queue of FPDU starts yields them lowest
// first whatever order they came in.
func TestStartQueue(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for round := 0; round < 200; round++ {
		var q startQueue
		var want []uint64
		next := uint64(0)
		for i := rng.IntN(1000); i > 0; i-- {
			// Mostly ascending, now and then out of order.
			x := next
			if rng.IntN(8) == 0 {
				x = rng.Uint64N(next + 1)
			} else {
				next += 1 + rng.Uint64N(3)
			}
			q.push(x)
			want = append(want, x)
			if rng.IntN(3) == 0 {
				slices.Sort(want)
				if q.min() != want[0] {
					t.Fatalf("min %d, want %d", q.min(), want[0])
				}
				q.pop()
				want = want[1:]
			}
		}
		slices.Sort(want)
		for _, w := range want {
			if q.min() != w {
				t.Fatalf("popped %d, want %d", q.min(), w)
			}
			q.pop()
		}
		if q.len() != 0 {
			t.Fatalf("%d left", q.len())
		}
	}
}
