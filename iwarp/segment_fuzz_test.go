package iwarp

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/rdmatap/rdmatap/netstack"
)

// feedSegments runs data through a fresh QP's receive path as segment
// placement sees it: data is cut into segments at the cut points seed
// draws, the tap sees them in a shuffled order (out of order, duplicated
// now and then), and TCP hands the receiver the contiguous prefix of what
// the tap has seen, sometimes at once, sometimes later (so that the tap
// finds the receiver waiting at a hole it fills, or busy elsewhere).
//
// With markers the stream is marked first (RFC 5044 §5; a trailing partial
// FPDU is dropped) and the tap and TCP see the marked stream; mflip, when
// not zero, corrupts the FPDUPTR of one of its markers.
func feedSegments(t *testing.T, data []byte, crc bool, seed uint64, segment, markers bool, mflip uint16) rxOutcome {
	// guard: the fuzzers' region (remote access, at 0x10000) between
	// guard pages, then the receive buffers' region (local access only,
	// at 0x20000) between guard pages: Sends and Writes never overlap.
	guard := make([]byte, 5*4096)
	mem, _ := fuzzMem(guard[:3*4096])
	rbuf := &Region{Buf: guard[3*4096 : 4*4096], Base: 0x20000, Access: AccessLocalWrite, PD: 1}
	mem.Register(rbuf)
	rq, _ := NewRecvQueue(4, 2)
	for i := 0; i < 4; i++ {
		rq.Post(uint64(i), []SGE{{Addr: rbuf.Base + uint64(i*1024), Length: 1024, LKey: rbuf.STag()}})
	}
	var rm refMarked
	if markers {
		data = wholeFPDUs(data)
		rm = refMark(data, crc)
		data = rm.wire
		if n := (len(data) + MPAMarkerInterval - 1) / MPAMarkerInterval; mflip != 0 && n > 0 {
			data[int(mflip)%n*MPAMarkerInterval+2+int(mflip>>15)] ^= byte(mflip>>7) | 1
		}
	}
	qp, s, rcq := startFuzzQPWith(t, mem, rq, ConnParams{CRC: crc, IRD: 2, ORD: 2, MarkersRx: markers})
	if !segment {
		qp.rxMu.Lock()
		qp.rx.in.Write(data)
		qp.rxMu.Unlock()
		return finishFeed(qp, s, rcq, guard)
	}
	seg := attachSegPlacer(qp, crc, markers)

	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	type piece struct{ off, end int }
	var pieces []piece
	if rng.IntN(2) == 0 {
		// Cut where FPDUs end, one to three FPDUs a segment, as an aligned
		// sender does (RFC 5044 Appendix A): the tap can frame them.
		// (With markers: where they end in the marked stream, each
		// marker at a boundary sent with the FPDU it precedes.)
		fpdus := data
		if markers {
			fpdus = rm.fpdus
		}
		wireAt := func(d int) int {
			if markers {
				return rm.wireEnd(d)
			}
			return d
		}
		off, start, k := 0, 0, 1+rng.IntN(3)
		for off+MPALengthSize <= len(fpdus) {
			off += FPDULen(int(fpdus[off])<<8 | int(fpdus[off+1]))
			if k--; k == 0 || off >= len(fpdus) {
				end := wireAt(min(off, len(fpdus)))
				pieces = append(pieces, piece{start, end})
				start, k = end, 1+rng.IntN(3)
			}
		}
		if start < len(data) {
			pieces = append(pieces, piece{start, len(data)})
		}
	} else {
		for off := 0; off < len(data); {
			n := min(len(data)-off, 1+rng.IntN(200))
			pieces = append(pieces, piece{off, off + n})
			off += n
		}
	}
	order := rng.Perm(len(pieces))
	seen := make([]bool, len(pieces))
	tcp := 0 // pieces handed over by TCP
	deliver := func() {
		k := tcp
		for k < len(pieces) && seen[k] {
			k++
		}
		if k == tcp {
			return
		}
		qp.rxMu.Lock()
		qp.rx.in.Write(data[pieces[tcp].off:pieces[k-1].end])
		qp.rx.afterRead()
		qp.rxMu.Unlock()
		tcp = k
	}
	// Half the time, segments beyond a hole are queued for the receive
	// goroutine (here: work at random moments), as with netstack's taps.
	var retain func() netstack.Kept
	if rng.IntN(2) == 0 {
		retain = func() netstack.Kept { return netstack.Kept{} } // data stays valid
	}
	for _, i := range order {
		p := pieces[i]
		seg.placeRetain(uint64(p.off), [][]byte{data[p.off:p.end]}, retain)
		if rng.IntN(8) == 0 { // a duplicate
			seg.placeRetain(uint64(p.off), [][]byte{data[p.off:p.end]}, retain)
		}
		seen[i] = true
		if rng.IntN(3) == 0 {
			seg.work()
		}
		if rng.IntN(2) == 0 {
			deliver()
		}
	}
	seg.work()
	deliver()
	out := finishFeed(qp, s, rcq, guard)
	out.seg = seg.stats
	return out
}

// attachSegPlacer gives a started QP the segment placer that QP.Start sets
// up for a stream that hands over its segments (the tests feed both sides
// by hand).
func attachSegPlacer(qp *QP, crc, markers bool) *segPlacer {
	seg := newSegPlacer(qp, crc, markers)
	seg.rx = &qp.rx
	seg.rxNext = qp.rx.expect[QNSend]
	qp.rxMu.Lock()
	qp.rx.seg = seg
	qp.rx.pubExpect = qp.rx.expect[QNSend]
	qp.rx.tcp = tcpFeed{r: &qp.rx}
	qp.rx.in = &qp.rx.tcp
	qp.rxMu.Unlock()
	return seg
}

// finishFeed ends a fed QP and collects what it did.
func finishFeed(qp *QP, s *nullStream, rcq *testCQ, guard []byte) rxOutcome {
	var out rxOutcome
	qp.rxMu.Lock()
	out.n, out.state = qp.rx.n, qp.rx.state
	qp.rxMu.Unlock()
	qp.mu.Lock()
	out.term = qp.term
	qp.mu.Unlock()
	close(s.closed)
	qp.Close()
	<-qp.Done()
	for {
		select {
		case c := <-rcq.ch:
			out.comps = append(out.comps, c)
			continue
		default:
		}
		break
	}
	out.mem = guard
	return out
}

// writesOverlap reports whether two RDMA Write FPDUs of the stream target
// overlapping bytes.
func writesOverlap(data []byte) bool {
	type span struct {
		stag     uint32
		from, to uint64
	}
	var spans []span
	for off := 0; off+MPALengthSize+DDPTaggedHeaderSize <= len(data); {
		ulpdu := int(data[off])<<8 | int(data[off+1])
		h := DDPHeader(data[off+MPALengthSize:])
		if h.Tagged() && ulpdu > DDPTaggedHeaderSize {
			sp := span{h.STag(), h.TO(), h.TO() + uint64(ulpdu-DDPTaggedHeaderSize)}
			for _, o := range spans {
				if o.stag == sp.stag && sp.from < o.to && o.from < sp.to {
					return true
				}
			}
			spans = append(spans, sp)
		}
		off += FPDULen(ulpdu)
	}
	return false
}

// FuzzSegmentDelivery: whatever the stream, segment placement with its
// deliveries from the tap never panics and never writes outside the
// registered region; and a stream the in-order path takes without error
// comes out of segment placement exactly as out of stream placement —
// memory and completions — however the segments were cut, ordered and
// duplicated.
// wholeFPDUs returns the whole FPDUs data begins with.
func wholeFPDUs(data []byte) []byte {
	off := 0
	for off+MPALengthSize <= len(data) {
		n := FPDULen(int(data[off])<<8 | int(data[off+1]))
		if off+n > len(data) {
			break
		}
		off += n
	}
	return data[:off]
}

func FuzzSegmentDelivery(f *testing.F) {
	var stream []byte
	for i := 0; i < 6; i++ {
		stream = append(stream, rawFPDU(rawULPDU(DDPFields{Opcode: OpWrite, Last: i%3 == 2, STag: fuzzSTag, TO: 0x10000 + uint64(100*i)}, bytes.Repeat([]byte{byte(i + 1)}, 100)), true)...)
	}
	stream = append(stream, rawFPDU(rawULPDU(DDPFields{Opcode: OpSend, Last: false, QN: QNSend, MSN: 1}, bytes.Repeat([]byte{'a'}, 90)), true)...)
	stream = append(stream, rawFPDU(rawULPDU(DDPFields{Opcode: OpSend, Last: true, QN: QNSend, MSN: 1, MO: 90}, bytes.Repeat([]byte{'b'}, 90)), true)...)
	stream = append(stream, rawFPDU(rawULPDU(DDPFields{Opcode: OpSend, Last: true, QN: QNSend, MSN: 2}, nil), true)...)
	stream = append(stream, rawFPDU(rawULPDU(DDPFields{Opcode: OpSend, Last: true, QN: QNSend, MSN: 3}, bytes.Repeat([]byte{'c'}, 70)), true)...)
	f.Add(stream, true, uint64(1), false, uint16(0))
	f.Add(stream, true, uint64(7), false, uint16(0))
	f.Add(stream, true, uint64(7), true, uint16(0))
	f.Add(stream, false, uint64(4), true, uint16(0))
	f.Add(stream, true, uint64(9), true, uint16(0x8101))
	var plain []byte
	for i := 0; i < 4; i++ {
		plain = append(plain, rawFPDU(rawULPDU(DDPFields{Opcode: OpWrite, Last: i == 3, STag: fuzzSTag, TO: 0x10400 + uint64(64*i)}, bytes.Repeat([]byte{9}, 64)), false)...)
	}
	f.Add(plain, false, uint64(3), false, uint16(0))
	f.Add(plain, false, uint64(3), true, uint16(2))
	bad := append([]byte(nil), stream...)
	bad[200] ^= 0x40
	f.Add(bad, true, uint64(5), false, uint16(0))
	f.Add(extensionStream(false), false, uint64(2), false, uint16(0))
	f.Add(extensionStream(false), false, uint64(2), true, uint16(0))
	f.Fuzz(func(t *testing.T, data []byte, crc bool, seed uint64, markers bool, mflip uint16) {
		got := feedSegments(t, data, crc, seed, true, markers, mflip)
		for _, g := range [][2]int{{0, 4096}, {8192, 3 * 4096}, {4 * 4096, 5 * 4096}} {
			for i, c := range got.mem[g[0]:g[1]] {
				if c != 0 {
					t.Fatalf("guard byte %d written", g[0]+i)
				}
			}
		}
		want := feedSegments(t, data, crc, seed, false, markers, mflip)
		if want.term != nil && want.term.Code.Layer == LayerLLP && got.term == nil {
			// A bad marker is never delivered from the tap unchecked.
			t.Fatalf("stream placement terminated (%+v), segment placement did not", want.term.Code)
		}
		if want.term != nil || want.state == rxDead || writesOverlap(data) {
			// Placed early beyond the error, or two Writes to the same
			// bytes (which RFC 5041 places in either order): allowed to
			// differ.
			return
		}
		if got.term != nil {
			t.Fatalf("segment placement terminated (%+v) a stream stream placement took", got.term.Code)
		}
		if !bytes.Equal(got.mem, want.mem) {
			for i := range got.mem {
				if got.mem[i] != want.mem[i] {
					t.Fatalf("memory differs at %d: %#x, stream placement %#x", i-4096, got.mem[i], want.mem[i])
				}
			}
		}
		if len(got.comps) != len(want.comps) {
			t.Fatalf("%d completions, stream placement %d", len(got.comps), len(want.comps))
		}
		for i := range got.comps {
			if got.comps[i] != want.comps[i] {
				t.Fatalf("completion %d: %+v, stream placement %+v", i, got.comps[i], want.comps[i])
			}
		}
	})
}

// TestSegmentMarkerChecked: a marker that points elsewhere, inside an FPDU
// the tap could place and deliver, is caught: the tap refuses the FPDU,
// and the in-order path meets the marker and terminates with the LLP
// layer's MPA "marker and ULP PDU pointer mismatch" (RFC 5044 §8), as
// stream placement does; nothing lands outside the region.
func TestSegmentMarkerChecked(t *testing.T) {
	var stream []byte
	for i := 0; i < 6; i++ {
		stream = append(stream, rawFPDU(rawULPDU(DDPFields{Opcode: OpWrite, Last: true, STag: fuzzSTag, TO: 0x10000 + uint64(300*i)}, bytes.Repeat([]byte{byte(i + 1)}, 300)), true)...)
	}
	refused := uint64(0)
	for _, crc := range []bool{false, true} {
		for seed := uint64(1); seed <= 40; seed++ {
			// The marker at 1024 (the third) lies inside the fourth FPDU.
			for _, flip := range []uint16{2, 2 | 1<<15} {
				want := feedSegments(t, stream, crc, seed, false, true, flip)
				got := feedSegments(t, stream, crc, seed, true, true, flip)
				for _, o := range []rxOutcome{want, got} {
					if o.term == nil || o.term.Code != (TermCode{LayerLLP, ETypeMPA, CodeFPDUStart}) {
						t.Fatalf("crc %v seed %d flip %#x: terminate %+v, want the marker mismatch", crc, seed, flip, o.term)
					}
				}
				for _, g := range [][2]int{{0, 4096}, {8192, 3 * 4096}, {4 * 4096, 5 * 4096}} {
					if bytes.IndexFunc(got.mem[g[0]:g[1]], func(r rune) bool { return r != 0 }) >= 0 {
						t.Fatal("guard written")
					}
				}
				refused += got.seg.RefusedMarker.Load()
			}
			// Unflipped, the same cuts go through whole.
			if o := feedSegments(t, stream, crc, seed, true, true, 0); o.term != nil || o.seg.RefusedMarker.Load() != 0 {
				t.Fatalf("crc %v seed %d: good markers: terminate %+v, %d refused", crc, seed, o.term, o.seg.RefusedMarker.Load())
			}
		}
	}
	if refused == 0 {
		t.Fatal("the tap never met the bad marker")
	}
	t.Logf("FPDUs refused for their marker: %d", refused)
}
