package iwarp

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/rdmatap/rdmatap/zerocopy"
)

var castagnoliTable = crc32.MakeTable(crc32.Castagnoli)

// drainFPDUs reads a framed message out of w with reads of the sizes
// next returns, as netstack reads a payloader into its chunks.
func drainFPDUs(t *testing.T, w *fpduWriter, next func() int) []byte {
	t.Helper()
	want := w.Len()
	var out []byte
	for w.Len() > 0 {
		p := make([]byte, next())
		k, err := w.Read(p)
		if err != nil {
			t.Fatalf("Read(%d bytes) after %d: %v", len(p), len(out), err)
		}
		if k == 0 && len(p) > 0 {
			t.Fatalf("Read(%d bytes) after %d: no progress", len(p), len(out))
		}
		out = append(out, p[:k]...)
	}
	if len(out) != want {
		t.Fatalf("produced %d bytes, Len said %d", len(out), want)
	}
	if k, err := w.Read(make([]byte, 16)); k != 0 || err != io.EOF {
		t.Fatalf("Read after the end: %d, %v; want 0, EOF", k, err)
	}
	return out
}

// checkFPDUs decodes a framed message independently of the receiver: FPDU
// lengths, header fields of each FPDU, payload, zero pad, CRC (or zero).
func checkFPDUs(t *testing.T, stream []byte, f DDPFields, msg, extra []byte, maxFPDU int, crcOn bool) {
	t.Helper()
	off := 0
	for first := true; first || off < len(msg); first = false {
		if len(stream) < MPALengthSize {
			t.Fatalf("stream ends at message offset %d", off)
		}
		fp := FPDU(stream)
		if fp.Len() > len(stream) {
			t.Fatalf("FPDU of %d bytes, %d left", fp.Len(), len(stream))
		}
		if fp.Len() > maxFPDU && len(msg) > 0 {
			t.Fatalf("FPDU of %d bytes, segment allows %d", fp.Len(), maxFPDU)
		}
		if fp.Len()%4 != 0 {
			t.Fatalf("FPDU of %d bytes is not a multiple of 4", fp.Len())
		}
		h := DDPHeader(fp.ULPDU())
		if err := h.Validate(); err != nil {
			t.Fatalf("header at offset %d: %v", off, err)
		}
		if h.Opcode() != f.Opcode {
			t.Fatalf("opcode %v, want %v", h.Opcode(), f.Opcode)
		}
		pay := h.Payload()
		if first && len(extra) > 0 {
			if !bytes.Equal(pay[:len(extra)], extra) {
				t.Fatalf("first FPDU lacks the header extension")
			}
			pay = pay[len(extra):]
		}
		if f.Opcode.Tagged() {
			if h.STag() != f.STag || h.TO() != f.TO+uint64(off) {
				t.Fatalf("STag %#x TO %d, want %#x %d", h.STag(), h.TO(), f.STag, f.TO+uint64(off))
			}
		} else if h.QN() != f.QN || h.MSN() != f.MSN || h.MO() != uint32(off) {
			t.Fatalf("QN %d MSN %d MO %d, want %d %d %d", h.QN(), h.MSN(), h.MO(), f.QN, f.MSN, off)
		}
		if !bytes.Equal(pay, msg[off:off+len(pay)]) {
			t.Fatalf("payload at offset %d differs", off)
		}
		off += len(pay)
		if h.Last() != (off == len(msg)) {
			t.Fatalf("L bit %v at offset %d of %d", h.Last(), off, len(msg))
		}
		n := fp.ULPDULength()
		for _, b := range fp[MPALengthSize+n : MPALengthSize+n+FPDUPad(n)] {
			if b != 0 {
				t.Fatalf("pad not zero")
			}
		}
		want := uint32(0)
		if crcOn {
			want = crc32.Checksum(fp[:fp.Len()-MPACRCSize], castagnoliTable)
		}
		if fp.CRC() != want {
			t.Fatalf("CRC %#x, want %#x", fp.CRC(), want)
		}
		stream = stream[fp.Len():]
	}
	if len(stream) != 0 {
		t.Fatalf("%d bytes after the last FPDU", len(stream))
	}
}

// TestFPDUWriterReadSizes frames random messages and reads them out in one
// large read (each FPDU written whole), byte by byte (each FPDU staged
// piece by piece) and in random sizes (both, FPDUs cut anywhere): the
// three streams must be identical and decode to the message.
func TestFPDUWriterReadSizes(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for i := 0; i < 300; i++ {
		n := rng.IntN(9000)
		if i%10 == 0 {
			n = 0
		}
		msg := make([]byte, n)
		for k := range msg {
			msg[k] = byte(rng.Uint32())
		}
		// The message in 1 to 4 scatter-gather pieces.
		var src zerocopy.SGList
		for rest := msg; len(rest) > 0 || len(src) == 0; {
			k := len(rest)
			if rng.IntN(2) == 0 {
				k = rng.IntN(len(rest) + 1)
			}
			src = append(src, rest[:k])
			rest = rest[k:]
			if len(src) == 3 {
				src = append(src, rest)
				break
			}
		}
		f := DDPFields{Opcode: OpWrite, STag: rng.Uint32(), TO: rng.Uint64() >> 8}
		var extra []byte
		switch rng.IntN(4) {
		case 1:
			f = DDPFields{Opcode: OpSend, QN: QNSend, MSN: rng.Uint32()}
		case 2:
			f = DDPFields{Opcode: OpReadResponse, STag: rng.Uint32(), TO: rng.Uint64() >> 8}
		case 3:
			// A Read Request: no payload, its body rides as the extension.
			f = DDPFields{Opcode: OpReadRequest, QN: QNReadReq, MSN: rng.Uint32()}
			extra = make([]byte, ReadRequestSize)
			for k := range extra {
				extra[k] = byte(rng.Uint32())
			}
			msg, src, n = nil, nil, 0
		}
		maxFPDU := 64 + rng.IntN(1500)
		crcOn := rng.IntN(2) == 0
		var streams [3][]byte
		for mode := range streams {
			var w fpduWriter
			w.reset(&f, src, n, extra, maxFPDU, crcOn, nil)
			next := func() int { return 1 << 17 }
			switch mode {
			case 1:
				next = func() int { return 1 }
			case 2:
				next = func() int { return 1 + rng.IntN(2*maxFPDU) }
			}
			streams[mode] = drainFPDUs(t, &w, next)
		}
		if !bytes.Equal(streams[0], streams[1]) || !bytes.Equal(streams[0], streams[2]) {
			t.Fatalf("case %d (%d bytes, %v, max FPDU %d, CRC %v): the streams differ with the read sizes", i, n, f.Opcode, maxFPDU, crcOn)
		}
		checkFPDUs(t, streams[0], f, msg, extra, maxFPDU, crcOn)
	}
}

// TestFPDUWriterRecordFit: at every point of a message, RecordFit(max) is
// the way to the last FPDU boundary within max bytes (the message's end
// included), or 0 where none lies within them: netstack cuts writes with
// it to keep a GSO link's super-segments FPDU-aligned.
func TestFPDUWriterRecordFit(t *testing.T) {
	for _, n := range []int{0, 1, 1396, 1397, 3*1396 + 100, 5 * 1396, 200 << 10} {
		for _, tagged := range []bool{true, false} {
			f := DDPFields{Opcode: OpWrite, STag: 1}
			if !tagged {
				f = DDPFields{Opcode: OpSend, QN: QNSend}
			}
			src := zerocopy.SGList{make([]byte, n)}
			var w fpduWriter
			w.reset(&f, src, n, nil, 1420, true, nil)
			stream := make([]byte, w.Len())
			var ref fpduWriter
			ref.reset(&f, src, n, nil, 1420, true, nil)
			if k, err := ref.Read(stream); k != len(stream) || err != nil {
				t.Fatal(k, err)
			}
			bounds := map[int]bool{}
			for end := 0; end < len(stream); {
				end += FPDULen(int(binary.BigEndian.Uint16(stream[end:])))
				bounds[end] = true
			}
			buf := make([]byte, len(stream))
			for pos := 0; pos < len(stream); {
				for _, mx := range []int{1, 1419, 1420, 1421, 5000, 65375} {
					want := 0
					for b := min(pos+mx, len(stream)); b > pos; b-- {
						if bounds[b] {
							want = b - pos
							break
						}
					}
					if got := w.RecordFit(mx); got != want {
						t.Fatalf("message of %d bytes (tagged %v), %d produced: RecordFit(%d) %d, want %d", n, tagged, pos, mx, got, want)
					}
					// RecordPlan: every boundary within mx, in order.
					var plan []int
					for b := pos + 1; b <= min(pos+mx, len(stream)); b++ {
						if bounds[b] {
							plan = append(plan, b-pos-sum(plan))
						}
					}
					if got := w.RecordPlan(mx, nil); !slices.Equal(got, plan) {
						t.Fatalf("message of %d bytes (tagged %v), %d produced: RecordPlan(%d) %v, want %v", n, tagged, pos, mx, got, plan)
					}
				}
				k := min(1+pos%977, len(stream)-pos)
				if _, err := w.Read(buf[pos : pos+k]); err != nil {
					t.Fatal(err)
				}
				pos += k
			}
		}
	}
}

// TestFPDUWriterRecordRest: at every point of a message, RecordRest is
// what is left of the FPDU being produced, so that a write cut there can
// end exactly at the FPDU's end.
func TestFPDUWriterRecordRest(t *testing.T) {
	for _, n := range []int{0, 1, 1396, 1397, 3*1396 + 100, 5 * 1396} {
		src := zerocopy.SGList{make([]byte, n)}
		var w fpduWriter
		w.reset(&DDPFields{Opcode: OpWrite, STag: 1}, src, n, nil, 1420, true, nil)
		stream := make([]byte, w.Len())
		for pos := 0; pos < len(stream); {
			k := min(1+pos%977, len(stream)-pos)
			if _, err := w.Read(stream[pos : pos+k]); err != nil {
				t.Fatal(err)
			}
			pos += k
			// The FPDU boundaries of what was produced: walk the lengths.
			end := 0
			for end < pos && pos-end >= MPALengthSize {
				end += FPDULen(int(binary.BigEndian.Uint16(stream[end:])))
			}
			if end < pos {
				continue // the FPDU's length is not out yet
			}
			want := end - pos
			if got := w.RecordRest(); got != want {
				t.Fatalf("message of %d bytes, %d produced: RecordRest %d, want %d", n, pos, got, want)
			}
		}
	}
}

func sum(ls []int) int {
	n := 0
	for _, l := range ls {
		n += l
	}
	return n
}
