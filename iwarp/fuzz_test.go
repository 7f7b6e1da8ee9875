package iwarp_test

// Fuzz targets for every decoder that sees peer bytes. Each is seeded with
// real frames from the siw captures (testdata/siw-pcaps) and with
// handmade frames. Run one with, e.g.,
//
//	go test -run XXX -fuzz FuzzMPAFrame -fuzztime 20s ./iwarp/
//
// Every input is handed to the views with its capacity clipped to its
// length, so a view that reached past the bytes it was given would panic
// instead of silently reading the caller's neighbouring memory.

import (
	"bytes"
	"encoding/binary"
	"path/filepath"
	"sort"
	"sync"
	"testing"

	"github.com/rdmatap/rdmatap/iwarp"
)

// clip returns b with its capacity cut to its length.
func clip(b []byte) []byte { return b[:len(b):len(b)] }

// fuzzSeeds holds byte strings cut out of the siw captures.
type fuzzSeeds struct {
	mpa     [][]byte // MPA Request/Reply frames
	ulpdus  [][]byte // DDP segments (truncated to 96 bytes)
	streams [][]byte // FPDU streams after the MPA frame (truncated)
}

var (
	seedsOnce sync.Once
	seeds     fuzzSeeds
)

// captureSeeds extracts seeds from the captures, or returns none when
// the captures are missing or unreadable.
func captureSeeds() *fuzzSeeds {
	seedsOnce.Do(func() {
		names, _ := filepath.Glob(filepath.Join(siwPcapDir, "*.pcap"))
		sort.Strings(names)
		seen := map[string]bool{}
		add := func(dst *[][]byte, b []byte) {
			if !seen[string(b)] {
				seen[string(b)] = true
				*dst = append(*dst, bytes.Clone(b))
			}
		}
		kinds := map[string]int{}
		for _, name := range names {
			c, err := loadCapture(name)
			if err != nil {
				continue
			}
			for _, s := range c.Streams {
				n, err := iwarp.MPAFrame(s.Data).Validate()
				if err != nil {
					continue
				}
				add(&seeds.mpa, s.Data[:n])
				rest := s.Data[n:]
				add(&seeds.streams, rest[:min(len(rest), 3200)])
				recs, _ := parseFPDUs(rest, crcIgnore)
				for _, r := range recs {
					h := r.Hdr
					// A few of each kind and size class are plenty.
					k := string([]byte{h[0], h[1], byte(min(len(h), 255))})
					if kinds[k] >= 2 {
						continue
					}
					kinds[k]++
					add(&seeds.ulpdus, h[:min(len(h), 96)])
				}
			}
		}
	})
	return &seeds
}

// handmadeMPA returns a few frames built with the encoder.
func handmadeMPA() [][]byte {
	var out [][]byte
	for _, m := range []iwarp.MPAFrameFields{
		{Revision: 1},
		{Reply: true, Revision: 1, CRC: true, PrivateData: []byte("hello")},
		{Revision: 2, V2: &iwarp.MPAv2Params{IRD: 1, ORD: 1}},
		{Reply: true, Revision: 2, CRC: true, V2: &iwarp.MPAv2Params{IRD: 128, ORD: 128, PeerToPeer: true, RTR: iwarp.RTRWrite}, PrivateData: []byte{1, 2, 3}},
		{Reply: true, Reject: true, Markers: true, Revision: 2, PrivateData: make([]byte, 512)},
	} {
		b := make([]byte, m.Len())
		if err := iwarp.MPAFrame(b).Encode(&m); err != nil {
			panic(err)
		}
		out = append(out, b)
	}
	return out
}

// handmadeULPDUs returns a DDP segment of every opcode, tagged and untagged.
func handmadeULPDUs() [][]byte {
	var out [][]byte
	for op := iwarp.Opcode(0); op <= iwarp.OpAtomicResp; op++ {
		b := make([]byte, iwarp.DDPUntaggedHeaderSize+iwarp.TerminateMaxSize)
		n := iwarp.DDPHeader(b).Encode(&iwarp.DDPFields{Opcode: op, Last: true, STag: 1, TO: 2, QN: 1, MSN: 1})
		switch op {
		case iwarp.OpReadRequest:
			iwarp.ReadRequest(b[n:]).Encode(&iwarp.ReadRequestFields{SinkSTag: 3, Size: 64, SourceSTag: 4})
			n += iwarp.ReadRequestSize
		case iwarp.OpTerminate:
			n += iwarp.Terminate(b[n:]).Encode(&iwarp.TerminateFields{
				Code:  iwarp.TermCode{Layer: iwarp.LayerDDP, EType: iwarp.ETypeUntaggedBuffer, Code: iwarp.CodeInvalidQN},
				ULPDU: b[:iwarp.DDPUntaggedHeaderSize], SegmentLength: 18,
			})
		default:
			n += copy(b[n:], "data")
		}
		out = append(out, b[:n])
	}
	return out
}

// handmadeTerminates returns Terminate payloads in RFC and siw layouts.
func handmadeTerminates() [][]byte {
	var out [][]byte
	rr := make([]byte, iwarp.DDPUntaggedHeaderSize+iwarp.ReadRequestSize)
	iwarp.DDPHeader(rr).Encode(&iwarp.DDPFields{Opcode: iwarp.OpReadRequest, Last: true, QN: 1, MSN: 1})
	wr := make([]byte, iwarp.DDPTaggedHeaderSize+4)
	iwarp.DDPHeader(wr).Encode(&iwarp.DDPFields{Opcode: iwarp.OpWrite, STag: 9})
	for _, tf := range []iwarp.TerminateFields{
		{Code: iwarp.TermCode{Layer: iwarp.LayerLLP, EType: iwarp.ETypeMPA, Code: iwarp.CodeCRC}},
		{Code: iwarp.TermCode{Layer: iwarp.LayerRDMAP, EType: iwarp.ETypeRemoteProtection, Code: iwarp.CodeInvalidSTag}, ULPDU: rr, SegmentLength: len(rr)},
		{Code: iwarp.TermCode{Layer: iwarp.LayerDDP, EType: iwarp.ETypeTaggedBuffer, Code: iwarp.CodeDDPBaseBounds}, ULPDU: wr, SegmentLength: len(wr)},
	} {
		b := make([]byte, iwarp.TerminateMaxSize)
		out = append(out, b[:iwarp.Terminate(b).Encode(&tf)])
	}
	out = append(out,
		siwTerminate(iwarp.TermCode{Layer: iwarp.LayerDDP, EType: iwarp.ETypeUntaggedBuffer, Code: iwarp.CodeNoBuffer}, true, true, false),
		[]byte{0x02, 0x02, 0x00, 0x00},
		[]byte{0x00, 0x01, 0xe0, 0x00, 0x00, 0x10, 0xc1},
		[]byte{0x00, 0x01, 0x20, 0x00},
	)
	return out
}

func FuzzMPAFrame(f *testing.F) {
	for _, b := range handmadeMPA() {
		f.Add(b)
	}
	f.Add([]byte("MPA ID Req Frame"))
	f.Add(append(unhex(f, siwMPARequestCRC), 0x00, 0x22))
	for _, b := range captureSeeds().mpa {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fr := iwarp.MPAFrame(clip(data))
		n, err := fr.Validate()
		if err != nil {
			return
		}
		if n < iwarp.MPAHeaderSize || n > len(data) {
			t.Fatalf("Validate returned %d for %d bytes", n, len(data))
		}
		fr = fr[:n:n]
		pd := int(fr.PDLength())
		if n != iwarp.MPAHeaderSize+pd || pd > iwarp.MPAMaxPrivateData {
			t.Fatalf("frame of %d bytes with pd_len %d", n, pd)
		}
		if fr.IsRequest() == fr.IsReply() || len(fr.Key()) != 16 {
			t.Fatalf("key %q is both or neither", fr.Key())
		}
		_ = fr.Flags()
		_, _, _ = fr.Markers(), fr.CRC(), fr.Reject()
		rev := fr.Revision()
		if rev != 1 && rev != 2 {
			t.Fatalf("Validate accepted revision %d", rev)
		}
		if len(fr.PrivateData()) != pd {
			t.Fatalf("PrivateData %d bytes, pd_len %d", len(fr.PrivateData()), pd)
		}
		ulp := fr.ULPPrivateData()
		v, ok := fr.IRDORD()
		if ok != fr.Enhanced() {
			t.Fatalf("IRDORD ok=%v, Enhanced=%v", ok, fr.Enhanced())
		}
		wantULP := pd
		if ok {
			wantULP -= iwarp.MPAv2PrefixSize
		}
		if len(ulp) != wantULP {
			t.Fatalf("ULPPrivateData %d bytes, want %d", len(ulp), wantULP)
		}
		_ = v.RTR.String()

		// Canonical frames (no bits the encoder cannot produce) re-encode
		// to the same bytes.
		flags := fr.Flags()
		canonical := flags&0x0f == 0 && (flags&iwarp.MPAFlagEnhanced == 0 || rev == 2)
		if !canonical {
			return
		}
		m := iwarp.MPAFrameFields{
			Reply: fr.IsReply(), Markers: fr.Markers(), CRC: fr.CRC(), Reject: fr.Reject(),
			Revision: rev, PrivateData: ulp,
		}
		if ok {
			m.V2 = &v
		}
		if m.Len() != n {
			t.Fatalf("re-encoding needs %d bytes, frame is %d", m.Len(), n)
		}
		enc := make([]byte, m.Len())
		if err := iwarp.MPAFrame(enc).Encode(&m); err != nil {
			t.Fatalf("re-encoding a valid frame: %v", err)
		}
		if !bytes.Equal(enc, fr) {
			t.Fatalf("re-encoded\n% x\nfrom\n% x", enc, []byte(fr))
		}
	})
}

// exerciseDDP calls every accessor that applies to a validated segment and
// checks the re-encoding of canonical headers.
func exerciseDDP(t *testing.T, h iwarp.DDPHeader) {
	hs := h.HeaderSize()
	if hs != iwarp.DDPTaggedHeaderSize && hs != iwarp.DDPUntaggedHeaderSize || len(h) < hs {
		t.Fatalf("validated segment of %d bytes with header size %d", len(h), hs)
	}
	_, _, _, _, _ = h.Tagged(), h.Last(), h.DDPVersion(), h.DDPReserved(), h.RDMAPVersion()
	op := h.Opcode()
	_, _ = op.String(), op.IsSend()
	if len(h.Payload()) != len(h)-hs {
		t.Fatalf("payload %d bytes of %d", len(h.Payload()), len(h))
	}
	f := iwarp.DDPFields{Opcode: op, Last: h.Last()}
	if h.Tagged() {
		f.STag, f.TO = h.STag(), h.TO()
	} else {
		f.RsvdULP, f.QN, f.MSN, f.MO = h.InvalidateSTag(), h.QN(), h.MSN(), h.MO()
		switch op {
		case iwarp.OpReadRequest:
			if p := h.Payload(); len(p) >= iwarp.ReadRequestSize {
				_ = iwarp.ReadRequest(clip(p[:iwarp.ReadRequestSize])).Fields()
			}
		case iwarp.OpTerminate:
			exerciseTerminate(t, clip(h.Payload()))
		}
	}
	canonical := h.DDPVersion() == iwarp.DDPVersion && h.RDMAPVersion() == iwarp.RDMAPVersion &&
		h.DDPReserved() == 0 && h[1]&0x30 == 0 && h.Tagged() == op.Tagged()
	if !canonical {
		return
	}
	enc := make([]byte, iwarp.DDPUntaggedHeaderSize)
	if n := iwarp.DDPHeader(enc).Encode(&f); n != hs || !bytes.Equal(enc[:n], h[:hs]) {
		t.Fatalf("re-encoded header % x, decoded from % x", enc[:n], []byte(h[:hs]))
	}
}

func FuzzDDPHeader(f *testing.F) {
	for _, b := range handmadeULPDUs() {
		f.Add(b)
	}
	f.Add([]byte{0xc1, 0x40})
	f.Add([]byte{0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0x10, 0x02, 0x40, 0x00})
	for _, b := range captureSeeds().ulpdus {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		h := iwarp.DDPHeader(clip(data))
		if err := h.Validate(); err != nil {
			return
		}
		exerciseDDP(t, h)
	})
}

// exerciseTerminate validates a Terminate payload and, if it is valid,
// calls every accessor.
func exerciseTerminate(t *testing.T, tm iwarp.Terminate) {
	if err := tm.Validate(); err != nil {
		return
	}
	if len(tm) < 4 {
		t.Fatalf("Validate accepted %d bytes", len(tm))
	}
	c := tm.Code()
	_ = c.String()
	lc, _ := iwarp.DecodeTerminateLenient(tm)
	_ = lc.String()
	_, _, _ = tm.HasSegLen(), tm.HasDDPHeader(), tm.HasRDMAPHeader()
	sl, ok := tm.SegmentLength()
	if ok != tm.HasSegLen() || sl < 0 {
		t.Fatalf("SegmentLength %d %v", sl, ok)
	}
	end := 4
	if tm.HasSegLen() || tm.HasDDPHeader() {
		end = 6
	}
	if h, ok := tm.DDPHeader(); ok != tm.HasDDPHeader() {
		t.Fatalf("DDPHeader ok=%v, D=%v", ok, tm.HasDDPHeader())
	} else if ok {
		if len(h) != h.HeaderSize() {
			t.Fatalf("terminated DDP header of %d bytes, header size %d", len(h), h.HeaderSize())
		}
		_, _, _ = h.Opcode(), h.Tagged(), h.Last()
		if h.Tagged() {
			_, _ = h.STag(), h.TO()
		} else {
			_, _, _, _ = h.InvalidateSTag(), h.QN(), h.MSN(), h.MO()
		}
		end += len(h)
	}
	if r, ok := tm.RDMAPHeader(); ok != tm.HasRDMAPHeader() {
		t.Fatalf("RDMAPHeader ok=%v, R=%v", ok, tm.HasRDMAPHeader())
	} else if ok {
		if len(r) != iwarp.ReadRequestSize {
			t.Fatalf("terminated RDMAP header of %d bytes", len(r))
		}
		_ = r.Fields()
		end += len(r)
	}
	if end > len(tm) {
		t.Fatalf("headers end at %d of %d bytes", end, len(tm))
	}
}

func FuzzTerminate(f *testing.F) {
	for _, b := range handmadeTerminates() {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		exerciseTerminate(t, iwarp.Terminate(clip(data)))
		if len(data) >= iwarp.TerminateMaxSize {
			// Whatever a peer's bytes say, our encoder stays in bounds.
			buf := make([]byte, iwarp.TerminateMaxSize)
			n := iwarp.Terminate(buf).Encode(&iwarp.TerminateFields{
				Code: iwarp.TermCode{Layer: iwarp.Layer(data[0] & 0x0f), EType: data[1] & 0x0f, Code: data[2]}, ULPDU: clip(data[3:]),
				SegmentLength: int(binary.BigEndian.Uint16(data)),
			})
			if n > len(buf) {
				t.Fatalf("Encode returned %d", n)
			}
			tm := iwarp.Terminate(buf[:n:n])
			if err := tm.Validate(); err != nil {
				t.Fatalf("our own Terminate % x fails Validate: %v", []byte(tm), err)
			}
			exerciseTerminate(t, tm)
		}
	})
}

func FuzzFPDUStream(f *testing.F) {
	var hand []byte
	for _, u := range handmadeULPDUs() {
		b := make([]byte, iwarp.FPDULen(len(u)))
		binary.BigEndian.PutUint16(b, uint16(len(u)))
		copy(b[2:], u)
		hand = append(hand, b...)
	}
	f.Add(hand)
	f.Add(append(unhex(f, siwSendCRC), unhex(f, siwReadRespCRC)...))
	f.Add([]byte{0x00, 0x00, 0x00, 0x00, 0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xc1})
	for _, b := range captureSeeds().streams {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, mode := range []crcMode{crcIgnore, crcZero, crcCheck} {
			recs, err := parseFPDUs(data, mode)
			off := 0
			for _, r := range recs {
				if r.Off != off || len(r.FPDU) != r.FPDU.Len() || cap(r.FPDU) != len(r.FPDU) ||
					off+len(r.FPDU) > len(data) || !bytes.Equal(r.FPDU, data[off:off+len(r.FPDU)]) {
					t.Fatalf("FPDU at %d (%d bytes, cap %d) is not the next %d input bytes at %d", r.Off, len(r.FPDU), cap(r.FPDU), len(r.FPDU), off)
				}
				if len(r.Hdr) != r.FPDU.ULPDULength() || !bytes.Equal(r.Hdr, r.FPDU[2:2+len(r.Hdr)]) {
					t.Fatalf("ULPDU view outside its FPDU")
				}
				exerciseDDP(t, r.Hdr)
				off += len(r.FPDU)
			}
			if err == nil && off != len(data) {
				t.Fatalf("parsed %d of %d bytes without error", off, len(data))
			}
		}
	})
}
