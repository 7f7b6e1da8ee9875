package iwarp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/rdmatap/rdmatap/iwarp/internal/pcapread"
)

var markerCRCTable = crc32.MakeTable(crc32.Castagnoli)

// refMarked is a marked stream built by refMark.
type refMarked struct {
	wire   []byte // the marked stream
	fpdus  []byte // the FPDU stream it carries, CRC fields as on the wire
	wireOf []int  // stream offset of each FPDU-stream octet
	starts []int  // FPDU-stream offsets of the FPDUs
}

// refMark marks an FPDU stream one octet at a time, spelling out the rules
// independently of markerInserter: before any octet that falls on a
// multiple of 512 of the stream goes a marker, pointing back to the
// ULPDU_Length field of the FPDU the octet continues, or zero if the octet
// starts an FPDU; with crcOn each CRC field becomes the CRC32c of the
// FPDU's octets on the wire before it, markers within included.
func refMark(fpdus []byte, crcOn bool) refMarked {
	r := refMarked{fpdus: bytes.Clone(fpdus), wireOf: make([]int, len(fpdus))}
	for d := 0; d < len(fpdus); d += FPDULen(int(binary.BigEndian.Uint16(fpdus[d:]))) {
		r.starts = append(r.starts, d)
	}
	startWire := make([]int, len(r.starts))
	fi := 0
	for d, c := range fpdus {
		for fi+1 < len(r.starts) && r.starts[fi+1] <= d {
			fi++
		}
		if len(r.wire)%MPAMarkerInterval == 0 {
			ptr := 0
			if d != r.starts[fi] {
				ptr = len(r.wire) - startWire[fi]
			}
			r.wire = append(r.wire, 0, 0, byte(ptr>>8), byte(ptr))
		}
		if d == r.starts[fi] {
			startWire[fi] = len(r.wire)
		}
		r.wireOf[d] = len(r.wire)
		r.wire = append(r.wire, c)
	}
	if crcOn {
		for i, s := range r.starts {
			c := s + FPDULen(int(binary.BigEndian.Uint16(fpdus[s:]))) - MPACRCSize
			w := r.wireOf[c]
			crc := crc32.Checksum(r.wire[startWire[i]:w], markerCRCTable)
			binary.LittleEndian.PutUint32(r.wire[w:], crc)
			binary.LittleEndian.PutUint32(r.fpdus[c:], crc)
		}
	}
	return r
}

// wireEnd returns the length of the marked stream that carries the first d
// FPDU-stream octets.
func (r *refMarked) wireEnd(d int) int {
	if d == 0 {
		return 0
	}
	return r.wireOf[d-1] + 1
}

// randomFPDUs returns n FPDUs with random ULPDUs of up to maxULPDU octets,
// zero pads and random CRC fields (which an inserter with CRC on must
// overwrite, and one without must leave alone).
func randomFPDUs(rng *rand.Rand, n, maxULPDU int) []byte {
	var b []byte
	for range n {
		u := rng.IntN(maxULPDU + 1)
		if rng.IntN(4) == 0 {
			u = rng.IntN(40)
		}
		f := make([]byte, FPDULen(u))
		binary.BigEndian.PutUint16(f, uint16(u))
		for i := MPALengthSize; i < MPALengthSize+u; i++ {
			f[i] = byte(rng.Uint32())
		}
		binary.LittleEndian.PutUint32(f[len(f)-MPACRCSize:], rng.Uint32())
		b = append(b, f...)
	}
	return b
}

// testProducer is an FPDU producer for markerInserter: a Payloader over a
// byte string that, when short is set, returns fewer octets than asked.
type testProducer struct {
	b     []byte
	rng   *rand.Rand
	short bool
}

func (p *testProducer) Len() int { return len(p.b) }

func (p *testProducer) Read(q []byte) (int, error) {
	if len(p.b) == 0 {
		return 0, io.EOF
	}
	n := min(len(q), len(p.b))
	if p.short && n > 1 {
		n = 1 + p.rng.IntN(n)
	}
	copy(q, p.b[:n])
	p.b = p.b[n:]
	return n, nil
}

// insertAll runs an FPDU stream through a markerInserter as a series of
// messages read in chunks of random size, as netstack reads a Payloader,
// checking Len against the reference before every Read.
func insertAll(t *testing.T, rng *rand.Rand, ref *refMarked, crcOn bool) []byte {
	t.Helper()
	var m markerInserter
	m.reset(crcOn)
	var out []byte
	buf := make([]byte, 70000)
	for i := 0; i < len(ref.starts); {
		j := min(len(ref.starts), i+1+rng.IntN(4))
		end := len(ref.fpdus)
		if j < len(ref.starts) {
			end = ref.starts[j]
		}
		m.inner = &testProducer{b: bytes.Clone(ref.fpdus[ref.starts[i]:end]), rng: rng, short: rng.IntN(3) == 0}
		for {
			want := ref.wireEnd(end) - len(out)
			if got := m.Len(); got != want {
				t.Fatalf("Len %d at stream offset %d, want %d", got, len(out), want)
			}
			var p []byte
			switch rng.IntN(4) {
			case 0:
				p = buf[:1+rng.IntN(5)]
			case 1:
				p = buf[:1+rng.IntN(1500)]
			case 2:
				p = buf[:1+rng.IntN(9000)]
			default:
				p = buf[:65536]
			}
			n, err := m.Read(p)
			out = append(out, p[:n]...)
			if err == io.EOF {
				if want != 0 {
					t.Fatalf("EOF with %d octets due", want)
				}
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if n > want {
				t.Fatalf("Read gave %d octets, %d due", n, want)
			}
		}
		i = j
	}
	return out
}

// stripRecorder is the receiver behind a markerStripper in the tests: it
// collects the FPDU stream and the pieces it came in, for check.
type stripRecorder struct {
	t      *testing.T
	out    []byte
	p      []byte // the slice the stripper is writing
	pWire  uint64 // its stream offset
	pieces [][2]int
}

func (r *stripRecorder) Write(q []byte) (int, error) {
	r.t.Helper()
	if len(q) == 0 {
		r.t.Fatal("empty piece")
	}
	off := int(uintptr(unsafe.Pointer(&q[0])) - uintptr(unsafe.Pointer(&r.p[0])))
	if off < 0 || off+len(q) > len(r.p) || &r.p[off] != &q[0] {
		r.t.Fatalf("piece is not a sub-slice of the stream's bytes")
	}
	r.pieces = append(r.pieces, [2]int{off, off + len(q)})
	r.out = append(r.out, q...)
	return len(q), nil
}

// check verifies, after a Write of r.p, that its pieces were maximal runs
// between markers: each starts at the slice's start or right after a
// marker and ends at the slice's end or at a marker, save the last one
// before an error.
func (r *stripRecorder) check(failed bool) {
	r.t.Helper()
	for i, pc := range r.pieces {
		start, end := r.pWire+uint64(pc[0]), r.pWire+uint64(pc[1])
		if pc[0] != 0 && start%MPAMarkerInterval != MPAMarkerSize {
			r.t.Fatalf("piece at stream offset %d does not start right after a marker or at the slice's start", start)
		}
		if pc[1] != len(r.p) && end%MPAMarkerInterval != 0 && !(failed && i == len(r.pieces)-1) {
			r.t.Fatalf("piece ending at stream offset %d stops short of a marker and of the slice's end", end)
		}
	}
	r.pieces = r.pieces[:0]
}

// stripAll feeds a marked stream to a markerStripper in cuts of random
// size (every cut one octet long if oneByte) and returns what it
// forwarded and the error it stopped with.
func stripAll(t *testing.T, rng *rand.Rand, wire []byte, crcOn, oneByte bool) ([]byte, error) {
	t.Helper()
	rec := &stripRecorder{t: t}
	var s markerStripper
	s.reset(rec, crcOn, nil)
	for w := 0; w < len(wire); {
		n := 1
		if !oneByte {
			switch rng.IntN(3) {
			case 0:
				n = 1 + rng.IntN(7)
			case 1:
				n = 1 + rng.IntN(2000)
			default:
				n = 1 + rng.IntN(66000)
			}
		}
		p := wire[w:min(len(wire), w+n)]
		rec.p, rec.pWire = p, uint64(w)
		k, err := s.Write(p)
		rec.check(err != nil)
		if err != nil {
			return rec.out, err
		}
		if k != len(p) {
			t.Fatalf("Write took %d of %d octets without an error", k, len(p))
		}
		w += len(p)
	}
	return rec.out, nil
}

// TestMarkerOffsets checks the offset arithmetic against a walk of the
// layout: marker j at [512j, 512j+4), FPDU-stream octets in between.
func TestMarkerOffsets(t *testing.T) {
	d := uint64(0)
	for w := uint64(0); w < 5*MPAMarkerInterval+7; w++ {
		if got := MarkerDataOffset(w); got != d {
			t.Fatalf("MarkerDataOffset(%d) = %d, want %d", w, got, d)
		}
		if w%MPAMarkerInterval < MPAMarkerSize {
			continue
		}
		if got := MarkerWireOffset(d); got != w {
			t.Fatalf("MarkerWireOffset(%d) = %d, want %d", d, got, w)
		}
		d++
		if got := markerWireEnd(d); got != w+1 {
			t.Fatalf("markerWireEnd(%d) = %d, want %d", d, got, w+1)
		}
	}
	if markerWireEnd(0) != 0 || markerWireEnd(markerRun) != MPAMarkerInterval {
		t.Fatal("a stream ending on a marker position must not end with that marker")
	}
	var m [4]byte
	MPAMarker(m[:]).Encode(12)
	if MarkerFPDUStart(512, m[:]) != 500 || MarkerFPDUStart(1024, make([]byte, 4)) != 1028 {
		t.Fatal("MarkerFPDUStart")
	}
}

// TestMarkersMaxFPDU checks that an FPDU of MarkersMaxFPDU(seg) octets fits
// seg octets with its markers wherever it starts (a marker before it
// included, as it goes out with the FPDU), that it is RFC 5044's MULPDU
// with markers plus 6, and that every FPDUPTR stays within 16 bits.
func TestMarkersMaxFPDU(t *testing.T) {
	for _, seg := range []int{64, 536, 1000, 1420, 1460, 1461, 8960, 9000, 65495, 65535, 1 << 20} {
		f := MarkersMaxFPDU(seg)
		emss := min(seg, maxMarkedFPDU)
		if mulpdu := emss - (6 + 4*((emss+511)/512) + emss%4); f != mulpdu+6 {
			t.Errorf("MarkersMaxFPDU(%d) = %d, RFC 5044 MULPDU+6 = %d", seg, f, mulpdu+6)
		}
		worst := 0
		for s := uint64(0); s < 2*markerRun; s += 4 {
			worst = max(worst, int(markerWireEnd(s+uint64(f))-markerWireEnd(s)))
		}
		if worst > emss {
			t.Errorf("seg %d: an FPDU of %d octets takes %d with its markers", seg, f, worst)
		}
		if seg >= maxMarkedFPDU && worst > 0xffff {
			t.Errorf("seg %d: marked FPDU of %d octets, beyond FPDUPTR's reach", seg, worst)
		}
	}
}

// TestMarkerRFCExample builds RFC 5044's example of a marker in an FPDU (a
// 16-octet ULPDU whose marker falls after ULPDU octet 9, FPDUPTR 12) and a
// marker between two FPDUs, and checks them octet by octet, CRC included.
func TestMarkerRFCExample(t *testing.T) {
	mk := func(u int, fill byte) []byte {
		f := make([]byte, FPDULen(u))
		binary.BigEndian.PutUint16(f, uint16(u))
		for i := range u {
			f[MPALengthSize+i] = fill + byte(i)
		}
		return f
	}
	// FPDU A: stream [4, 500); FPDU B (ULPDU 16): [500, 528) with the
	// marker at 512, 12 octets in.
	a, b := mk(490, 0x10), mk(16, 0xa0)
	stream := append(bytes.Clone(a), b...)
	var m markerInserter
	m.reset(true)
	m.inner = &testProducer{b: bytes.Clone(stream)}
	if m.Len() != 528 {
		t.Fatalf("Len %d, want 528", m.Len())
	}
	wire := make([]byte, 528)
	if n, err := m.Read(wire); n != 528 || err != nil {
		t.Fatalf("Read: %d, %v", n, err)
	}
	check := func(off int, want []byte, what string) {
		t.Helper()
		if !bytes.Equal(wire[off:off+len(want)], want) {
			t.Errorf("%s at %d: % x, want % x", what, off, wire[off:off+len(want)], want)
		}
	}
	check(0, []byte{0, 0, 0, 0}, "first marker (FPDUPTR 0)")
	check(4, []byte{0x01, 0xea}, "A's ULPDU_Length")
	check(500, []byte{0x00, 0x10}, "B's ULPDU_Length")
	check(502, b[2:12], "B's ULPDU octets 0-9")
	check(512, []byte{0, 0, 0, 0x0c}, "marker in B (FPDUPTR 0x000C)")
	check(516, b[12:18], "B's ULPDU octets 10-15")
	check(522, []byte{0, 0}, "B's pad")
	crcA := crc32.Checksum(wire[4:496], markerCRCTable) // the first marker is not A's
	crcB := crc32.Checksum(wire[500:524], markerCRCTable)
	check(496, binary.LittleEndian.AppendUint32(nil, crcA), "A's CRC")
	check(524, binary.LittleEndian.AppendUint32(nil, crcB), "B's CRC (over its marker too)")

	// An FPDU that ends on a marker position: the stream ends there (the
	// marker goes out with the next FPDU), then a marker of FPDUPTR 0
	// that no CRC covers.
	m.reset(true)
	c := mk(502, 1) // stream [4, 512)
	m.inner = &testProducer{b: bytes.Clone(c)}
	out := make([]byte, 600)
	if n, _ := m.Read(out); n != 512 || m.Len() != 0 {
		t.Fatalf("FPDU ending at 512: Read %d, Len %d; want 512, 0", n, m.Len())
	}
	m.inner = &testProducer{b: mk(0, 0)}
	if n, _ := m.Read(out); n != 12 || !bytes.Equal(out[:4], []byte{0, 0, 0, 0}) {
		t.Fatalf("next FPDU: %d octets % x, want a zero marker and 8 octets", n, out[:n])
	}
	if crc := crc32.Checksum(out[4:8], markerCRCTable); binary.LittleEndian.Uint32(out[8:]) != crc {
		t.Fatal("the CRC of an FPDU after a boundary marker must not cover the marker")
	}
}

// TestMarkerRoundTrip runs random FPDU streams (ULPDUs of 0 to 9000
// octets, CRC on and off) through markerInserter, in random messages and
// chunks, and compares the result with the reference marking; then through
// markerStripper in random cuts (one octet at a time too), which must give
// back the FPDU stream.
func TestMarkerRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(5044, 512))
	for iter := range 60 {
		crcOn := iter%2 == 0
		fpdus := randomFPDUs(rng, 1+rng.IntN(40), 9000)
		ref := refMark(fpdus, crcOn)
		wire := insertAll(t, rng, &ref, crcOn)
		if !bytes.Equal(wire, ref.wire) {
			i := 0
			for i < len(wire) && i < len(ref.wire) && wire[i] == ref.wire[i] {
				i++
			}
			t.Fatalf("iter %d (crc %v): inserter output differs from the reference at stream offset %d (%d vs %d octets)", iter, crcOn, i, len(wire), len(ref.wire))
		}
		if !crcOn && len(ref.starts) > 0 {
			// Without CRC the producer's CRC fields pass untouched.
			if !bytes.Equal(ref.fpdus, fpdus) {
				t.Fatal("reference changed CRC fields with CRC off")
			}
		}
		got, err := stripAll(t, rng, wire, crcOn, iter%10 == 1)
		if err != nil {
			t.Fatalf("iter %d: strip: %v", iter, err)
		}
		if !bytes.Equal(got, ref.fpdus) {
			t.Fatalf("iter %d (crc %v): stripped stream differs from the FPDU stream (%d vs %d octets)", iter, crcOn, len(got), len(ref.fpdus))
		}
	}
}

// TestMarkerRoundTripSiw runs the FPDU streams of the siw captures (real
// FPDUs, real CRCs) through inserter and stripper. None of the captures
// has markers (siw refuses them), so this is the nearest golden check.
func TestMarkerRoundTripSiw(t *testing.T) {
	dir := filepath.Join("..", "testdata", "siw-pcaps")
	names, _ := filepath.Glob(filepath.Join(dir, "lo-crc-*.pcap"))
	if len(names) == 0 {
		t.Fatalf("siw captures not found in %s", dir)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	streams := 0
	for _, name := range names {
		f, err := pcapread.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		segs, err := f.Segments()
		if err != nil {
			t.Fatal(err)
		}
		ss, err := pcapread.Reassemble(segs)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range ss {
			n, err := MPAFrame(s.Data).Validate()
			if err != nil || MPAFrame(s.Data).Markers() {
				continue
			}
			rest := s.Data[n:]
			d := 0
			for d+MPALengthSize <= len(rest) && d+FPDULen(int(binary.BigEndian.Uint16(rest[d:]))) <= len(rest) {
				d += FPDULen(int(binary.BigEndian.Uint16(rest[d:])))
			}
			if d == 0 {
				continue
			}
			streams++
			ref := refMark(rest[:d], true)
			wire := insertAll(t, rng, &ref, true)
			if !bytes.Equal(wire, ref.wire) {
				t.Fatalf("%s: inserter output differs from the reference", filepath.Base(name))
			}
			got, err := stripAll(t, rng, wire, true, false)
			if err != nil || !bytes.Equal(got, ref.fpdus) {
				t.Fatalf("%s: strip: %v", filepath.Base(name), err)
			}
			// Without CRC the stream comes back exactly as siw sent it.
			ref = refMark(rest[:d], false)
			if got, err := stripAll(t, rng, insertAll(t, rng, &ref, false), false, false); err != nil || !bytes.Equal(got, rest[:d]) {
				t.Fatalf("%s: CRC off round trip: %v", filepath.Base(name), err)
			}
		}
	}
	if streams == 0 {
		t.Fatal("no FPDU stream in the captures")
	}
}

// markerStream returns a marked stream of random FPDUs with at least one
// marker inside an FPDU and one between two FPDUs, and their positions.
func markerStream(t *testing.T, crcOn bool) (ref refMarked, inside, between int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, 7))
	for range 1000 {
		ref = refMark(randomFPDUs(rng, 30, 700), crcOn)
		inside, between = -1, -1
		for w := MPAMarkerInterval; w+MPAMarkerSize < len(ref.wire); w += MPAMarkerInterval {
			ptr := binary.BigEndian.Uint16(ref.wire[w+2:])
			if ptr != 0 && inside < 0 {
				inside = w
			}
			if ptr == 0 && between < 0 {
				between = w
			}
		}
		if inside > 0 && between > 0 {
			return ref, inside, between
		}
	}
	t.Fatal("no stream with both kinds of marker")
	return
}

// TestMarkerStripperErrors corrupts markers and CRCs: a wrong FPDUPTR is a
// marker error (Terminate LLP/MPA 0x03) after the octets before the marker
// went through; RESERVED is not checked, but is covered by the CRC when the
// marker lies within an FPDU; a CRC error stops before the CRC octet that
// differs, so the receiver never completes the FPDU.
func TestMarkerStripperErrors(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, crcOn := range []bool{false, true} {
		ref, inside, between := markerStream(t, crcOn)
		for _, c := range []struct {
			name   string
			off    int // octet to change
			val    byte
			code   uint8 // 0: no error
			prefix int   // FPDU-stream octets forwarded before the error
		}{
			{"FPDUPTR within an FPDU", inside + 3, ref.wire[inside+3] ^ 4, CodeFPDUStart, int(MarkerDataOffset(uint64(inside)))},
			{"FPDUPTR between FPDUs", between + 3, 8, CodeFPDUStart, int(MarkerDataOffset(uint64(between)))},
			{"RESERVED within an FPDU", inside, 0x80, map[bool]uint8{true: CodeCRC}[crcOn], -1},
			{"RESERVED between FPDUs", between + 1, 1, 0, -1},
		} {
			wire := bytes.Clone(ref.wire)
			wire[c.off] = c.val
			got, err := stripAll(t, rng, wire, crcOn, false)
			var me *MarkerError
			switch {
			case c.code == 0:
				if err != nil {
					t.Errorf("crc %v, %s: %v, want no error", crcOn, c.name, err)
				}
			case !errors.As(err, &me) || me.Code != (TermCode{LayerLLP, ETypeMPA, c.code}):
				t.Errorf("crc %v, %s: %v, want LLP/MPA code %#x", crcOn, c.name, err, c.code)
			case c.code == CodeFPDUStart && (!errors.Is(err, ErrMarker) || len(got) != c.prefix || !bytes.Equal(got, ref.fpdus[:c.prefix])):
				t.Errorf("crc %v, %s: forwarded %d octets (want %d) or not ErrMarker: %v", crcOn, c.name, len(got), c.prefix, err)
			}
		}
		if !crcOn {
			continue
		}
		// A payload octet changed: the CRC field's first octet differs
		// (with overwhelming likelihood), so the forwarded stream ends
		// right before the CRC field.
		fi := len(ref.starts) / 2
		s := ref.starts[fi]
		end := s + FPDULen(int(binary.BigEndian.Uint16(ref.fpdus[s:])))
		wire := bytes.Clone(ref.wire)
		wire[ref.wireOf[s+MPALengthSize]] ^= 1
		got, err := stripAll(t, rng, wire, true, false)
		var me *MarkerError
		if !errors.As(err, &me) || me.Code.Code != CodeCRC || errors.Is(err, ErrMarker) {
			t.Fatalf("corrupt payload: %v, want a CRC error", err)
		}
		crcAt := end - MPACRCSize
		if len(got) < crcAt || len(got) >= end {
			t.Fatalf("corrupt payload: forwarded %d octets, want the FPDU up to its CRC field [%d, %d)", len(got), crcAt, end)
		}
		// With onErr the error goes there once and the rest is swallowed.
		calls := 0
		var s2 markerStripper
		s2.reset(io.Discard, true, func(e *MarkerError) {
			calls++
			if e.Code.Code != CodeCRC {
				t.Errorf("onErr got %v", e)
			}
		})
		for w := 0; w < len(wire); w += 100 {
			if n, err := s2.Write(wire[w:min(len(wire), w+100)]); err != nil || n != min(len(wire), w+100)-w {
				t.Fatalf("Write with onErr: %d, %v", n, err)
			}
		}
		if calls != 1 {
			t.Fatalf("onErr called %d times", calls)
		}
	}
}

// TestMarkerInserterStripperAllocs checks that neither side allocates per
// call.
func TestMarkerInserterStripperAllocs(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	fpdus := randomFPDUs(rng, 8, 3000)
	ref := refMark(fpdus, true)
	var m markerInserter
	prod := &testProducer{}
	buf := make([]byte, 4000)
	m.reset(true)
	if n := testing.AllocsPerRun(50, func() {
		prod.b = fpdus
		m.inner = prod
		for {
			if _, err := m.Read(buf[:1+len(prod.b)%4000]); err != nil {
				break
			}
		}
	}); n != 0 {
		t.Errorf("markerInserter.Read: %v allocations per run", n)
	}
	var s markerStripper
	if n := testing.AllocsPerRun(50, func() {
		s.reset(io.Discard, true, nil)
		for w := 0; w < len(ref.wire); w += 1448 {
			if _, err := s.Write(ref.wire[w:min(len(ref.wire), w+1448)]); err != nil {
				t.Fatal(err)
			}
		}
	}); n != 0 {
		t.Errorf("markerStripper.Write: %v allocations per run", n)
	}
}

// TestMarkerInserterResync checks resync after netstack dropped the octets
// of a failed Read: the stream continues from what TCP kept, a marker cut
// in two included.
func TestMarkerInserterResync(t *testing.T) {
	a := make([]byte, FPDULen(502)) // stream [4, 512)
	binary.BigEndian.PutUint16(a, 502)
	b := make([]byte, FPDULen(8))
	binary.BigEndian.PutUint16(b, 8)
	ref := refMark(append(bytes.Clone(a), b...), true)
	for _, kept := range []int{512, 514} {
		var m markerInserter
		m.reset(true)
		m.inner = &testProducer{b: bytes.Clone(a)}
		out := make([]byte, 1024)
		n, _ := m.Read(out)
		m.inner = &testProducer{b: bytes.Clone(b)}
		k, _ := m.Read(out[n:])
		if n+k != len(ref.wire) {
			t.Fatalf("produced %d, want %d", n+k, len(ref.wire))
		}
		// TCP kept only kept octets; the next FPDU is B again.
		if d := m.resync(uint64(kept)); d != uint64(len(a)) {
			t.Fatalf("resync(%d) = %d, want %d", kept, d, len(a))
		}
		m.inner = &testProducer{b: bytes.Clone(b)}
		k, _ = m.Read(out[kept:])
		if kept+k != len(ref.wire) || !bytes.Equal(out[:kept+k], ref.wire) {
			t.Fatalf("kept %d: stream after resync differs", kept)
		}
	}
}
