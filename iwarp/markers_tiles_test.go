package iwarp

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/rdmatap/rdmatap/zerocopy"
)

// TestMarkerTiles frames messages with the FPDU writer inside the marker
// inserter as the transmitter does, from random points of a marked
// stream, for random segment payloads, and checks the marked stream
// against refMark (markers and CRCs), the message against checkFPDUs, and
// the alignment that markerTiles promises: cut into segments of the
// payload from the message's first octet, every segment starts with an
// FPDU (or with the marker that points to the FPDU right after it), every
// FPDU but the message's last fills its segment to the end (or to a marker
// between FPDUs there), and no FPDU spills into the next segment. Len is
// exact; RecordRest always leads to the end of a segment (or of the
// message) where an FPDU ends; fpduEnd tells FPDU boundaries.
func TestMarkerTiles(t *testing.T) {
	rng := rand.New(rand.NewPCG(5044, 1))
	segs := []int{1420, 1448, 1460, 8960, 512, 516, 1024, 508, 64, 100, 65483, 65535}
	for iter := range 400 {
		seg := segs[iter%len(segs)]
		if iter%3 == 0 {
			seg = 64 + rng.IntN(9000)
		}
		n := rng.IntN(8 * seg)
		switch iter % 7 {
		case 0:
			n = 0
		case 1:
			n = 1 + rng.IntN(8)
		case 2:
			n = rng.IntN(200 << 10)
		}
		checkMarkerTiles(t, rng, fmt.Sprint("iter ", iter), seg, n, rng.IntN(6), rng.IntN(2) == 0, rng.IntN(2) == 0)
	}
}

// checkMarkerTiles frames a message of n random payload octets (tagged:
// an RDMA Write, else a Send) with the FPDU writer inside a marker
// inserter that has carried prefixFPDUs random FPDUs, tiled for segments
// of seg octets, reads it out in random pieces drawn from rng, and checks
// what TestMarkerTiles describes.
func checkMarkerTiles(t *testing.T, rng *rand.Rand, name string, seg, n, prefixFPDUs int, crcOn, tagged bool) {
	t.Helper()
	f := DDPFields{Opcode: OpWrite, STag: 7, TO: 1 << 20}
	if !tagged {
		f = DDPFields{Opcode: OpSend, QN: QNSend, MSN: 3}
	}
	msg := make([]byte, n)
	for k := range msg {
		msg[k] = byte(rng.Uint32())
	}
	var src zerocopy.SGList
	for rest := msg; len(rest) > 0; {
		k := min(len(rest), 1+rng.IntN(len(rest)))
		src, rest = append(src, rest[:k]), rest[k:]
	}

	// A stream that has carried a few FPDUs already.
	var m markerInserter
	m.reset(crcOn)
	prefix := randomFPDUs(rng, prefixFPDUs, 2000)
	m.inner = &testProducer{b: bytes.Clone(prefix)}
	pw := make([]byte, m.Len())
	if k, err := m.Read(pw); k != len(pw) || err != nil && len(pw) > 0 {
		t.Fatalf("prefix: %d of %d, %v", k, len(pw), err)
	}
	w0 := m.wire

	var w fpduWriter
	w.reset(&f, src, n, nil, MarkersMaxFPDU(seg), false, nil)
	tiles := m.tile(seg)
	w.tileMarked(tiles)
	m.inner = &w
	size := uint64(tiles.size)
	want := m.Len()
	out := make([]byte, 0, want)
	var rests [][2]int // (position, RecordRest) pairs
	var fits [][3]int  // (position, max, RecordFit(max))
	for m.Len() > 0 {
		rests = append(rests, [2]int{len(out), m.RecordRest()})
		mx := []int{1, seg - 1, seg, 3*seg + 7, 65375}[rng.IntN(5)]
		fits = append(fits, [3]int{len(out), mx, m.RecordFit(mx)})
		c := 1 + rng.IntN(3*seg)
		if rng.IntN(4) == 0 {
			c = 1 + rng.IntN(8)
		}
		p := make([]byte, c)
		k, err := m.Read(p)
		if err != nil || k == 0 {
			t.Fatalf("%s: Read(%d) after %d: %d, %v", name, c, len(out), k, err)
		}
		out = append(out, p[:k]...)
	}
	if len(out) != want {
		t.Fatalf("%s: produced %d octets, Len said %d", name, len(out), want)
	}

	// Markers and CRCs, independently.
	var fpdus []byte
	for i, b := range out {
		if (w0+uint64(i))%MPAMarkerInterval >= MPAMarkerSize {
			fpdus = append(fpdus, b)
		}
	}
	ref := refMark(append(bytes.Clone(prefix), fpdus...), crcOn)
	if !bytes.Equal(append(pw, out...), ref.wire) {
		t.Fatalf("%s (seg %d, %d bytes, CRC %v): marked stream differs from the reference", name, seg, n, crcOn)
	}
	// The message as the writer framed it (CRC fields zero).
	check := bytes.Clone(fpdus)
	for d := 0; d < len(check); d += FPDULen(int(binary.BigEndian.Uint16(check[d:]))) {
		e := d + FPDULen(int(binary.BigEndian.Uint16(check[d:])))
		clear(check[e-MPACRCSize : e])
	}
	checkFPDUs(t, check, f, msg, nil, seg, false)

	// The segments.
	end := w0 + uint64(len(out))
	var starts []uint64 // FPDU-stream offsets of the message's FPDUs, relative
	for d := 0; d < len(fpdus); d += FPDULen(int(binary.BigEndian.Uint16(fpdus[d:]))) {
		starts = append(starts, uint64(d))
	}
	d0 := uint64(len(prefix))
	startW := map[uint64]bool{} // the FPDUs' first octets
	for _, d := range starts {
		startW[MarkerWireOffset(d0+d)] = true
	}
	for i, d := range starts {
		ws := MarkerWireOffset(d0 + d) // the FPDU's first octet
		k := (ws - w0) / size
		if t0 := w0 + k*size; ws != t0 && !(ws == t0+MPAMarkerSize && t0%MPAMarkerInterval == 0) {
			t.Fatalf("%s (seg %d, %d bytes): FPDU %d starts %d octets into segment %d", name, seg, n, i, ws-t0, k)
		}
		de := uint64(len(fpdus))
		if i+1 < len(starts) {
			de = starts[i+1]
		}
		we := markerWireEnd(d0 + de) // after its last octet
		t1 := w0 + (k+1)*size
		if we > t1 {
			t.Fatalf("%s (seg %d, %d bytes): FPDU %d ends %d octets into segment %d", name, seg, n, i, we-t1, k+1)
		}
		if i+1 < len(starts) && we != t1 && !(we+MPAMarkerSize == t1 && we%MPAMarkerInterval == 0) {
			t.Fatalf("%s (seg %d, %d bytes): FPDU %d of %d leaves %d octets of its segment", name, seg, n, i, len(starts), t1-we)
		}
	}
	// RecordRest ends where an FPDU and a segment end, or at the
	// message's end.
	for _, r := range rests {
		rest := 0 // to the segment's end, or the message's
		if k := uint64(r[0]) % size; k != 0 {
			rest = min(int(size-k), len(out)-r[0])
		}
		if r[1] != rest {
			t.Fatalf("%s (seg %d): RecordRest %d at %d octets, want %d", name, seg, r[1], r[0], rest)
		}
		if r[1] == 0 {
			continue
		}
		at := w0 + uint64(r[0]+r[1])
		if at != end && ((at-w0)%size != 0 || !startW[at] && !(at%MPAMarkerInterval == 0 && startW[at+MPAMarkerSize])) {
			t.Fatalf("%s (seg %d): RecordRest %d at %d octets leads to neither a segment's FPDU nor the end", name, seg, r[1], r[0])
		}
	}
	// RecordFit reaches the last segment end (or the message's end)
	// within its max, or is 0 where there is none.
	for _, f := range fits {
		pos, mx := f[0], f[1]
		want := 0
		if rest := len(out) - pos; rest <= mx {
			want = rest
		} else if b := (pos + mx) / int(size) * int(size); b > pos {
			want = b - pos
		}
		if f[2] != want {
			t.Fatalf("%s (seg %d): RecordFit(%d) %d at %d octets, want %d", name, seg, mx, f[2], pos, want)
		}
	}
	// fpduEnd, at every FPDU-stream octet of the message.
	if n > 0 {
		bound := map[uint64]bool{uint64(len(fpdus)): true}
		for _, d := range starts {
			bound[d] = true
		}
		for d := 0; d <= len(fpdus); d += 1 + rng.IntN(64) {
			if w.fpduEnd(int64(d)) != bound[uint64(d)] {
				t.Fatalf("%s: fpduEnd(%d) = %v", name, d, !bound[uint64(d)])
			}
		}
		for _, d := range starts {
			if !w.fpduEnd(int64(d)) || d > 0 && w.fpduEnd(int64(d)-4) {
				t.Fatalf("%s: fpduEnd wrong around %d", name, d)
			}
		}
	}
}

// FuzzMarkerTiles: whatever the segment payload, the message's size and
// kind, where in the stream it starts and how netstack's reads cut it,
// the marked FPDUs of a message tile its segments (checkMarkerTiles).
func FuzzMarkerTiles(f *testing.F) {
	f.Add(uint16(1420), uint32(100000), uint8(3), true, true, uint64(1))
	f.Add(uint16(1448), uint32(1), uint8(0), false, false, uint64(2))
	f.Add(uint16(516), uint32(5000), uint8(1), true, false, uint64(3))
	f.Add(uint16(65535), uint32(200000), uint8(5), false, true, uint64(4))
	f.Fuzz(func(t *testing.T, seg uint16, n uint32, prefix uint8, crcOn, tagged bool, seed uint64) {
		// A segment payload holds at least one small FPDU (IPv4's
		// least MSS is 536 octets; markerTiles rounds up to 64).
		s := max(int(seg), minMarkerTile)
		checkMarkerTiles(t, rand.New(rand.NewPCG(seed, 5044)), "fuzz", s, int(n%(256<<10)), int(prefix%8), crcOn, tagged)
	})
}

// TestMarkerTilesAllocs: framing a tiled message, reading it out through
// the inserter, and asking RecordRest and fpduEnd allocate nothing.
func TestMarkerTilesAllocs(t *testing.T) {
	msg := make([]byte, 100<<10)
	src := zerocopy.SGList{msg}
	f := DDPFields{Opcode: OpWrite, STag: 1}
	var m markerInserter
	m.reset(true)
	var w fpduWriter
	buf := make([]byte, 64<<10)
	if n := testing.AllocsPerRun(20, func() {
		w.reset(&f, src, len(msg), nil, MarkersMaxFPDU(1420), false, nil)
		w.tileMarked(m.tile(1420))
		m.inner = &w
		for m.Len() > 0 {
			if _, err := m.Read(buf[:min(len(buf), m.Len(), 1000+m.RecordRest())]); err != nil {
				t.Fatal(err)
			}
		}
		if !w.fpduEnd(0) {
			t.Fatal("fpduEnd(0) is false")
		}
	}); n != 0 {
		t.Errorf("%v allocations per tiled message", n)
	}
}
