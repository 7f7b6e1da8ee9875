package iwarp_test

// Encode/decode round trips for every wire view (mpa.go, ddp.go,
// terminate.go), plus byte-exact vectors taken from Linux siw captures so
// that they run without the captures.

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/klauspost/crc32"

	"github.com/rdmatap/rdmatap/iwarp"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Vectors from lo-crc-rping.pcap (siw, CRC negotiated): the initiator's
// MPA Request, its first Send, and a Read Response.
const (
	siwMPARequestCRC = "4d504120494420526571204672616d65 50 02 0004 00010001"
	siwSendCRC       = "0022 4143 00000000 00000000 00000001 00000000 000055c60a6e3d506fae4700000000 40 21809343"
	siwReadRespCRC   = "004e c142 2487ee00 000055a230e27f30 72646d612d70696e672d303a204142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f707172 00 cfca01bc"
)

// ---- MPA Request/Reply ----

func TestMPAFrameRoundTrip(t *testing.T) {
	pdLens := []int{0, 1, 3, 4, 5, 100, 508, 509, 512, 513, 600}
	v2s := []*iwarp.MPAv2Params{
		nil,
		{},
		{IRD: 1, ORD: 1},
		{IRD: iwarp.MPAMaxIRDORD, ORD: 128, PeerToPeer: true, RTR: iwarp.RTRWrite | iwarp.RTRRead},
		{IRD: 0, ORD: iwarp.MPAMaxIRDORD, PeerToPeer: true, RTR: iwarp.RTRSend | iwarp.RTRWrite | iwarp.RTRRead},
	}
	cases := 0
	for _, reply := range []bool{false, true} {
		for _, rev := range []uint8{1, 2} {
			for flags := 0; flags < 8; flags++ {
				for vi, v2 := range v2s {
					for _, pdl := range pdLens {
						pd := make([]byte, pdl)
						for i := range pd {
							pd[i] = byte(i*7 + pdl)
						}
						m := iwarp.MPAFrameFields{
							Reply: reply, Markers: flags&1 != 0, CRC: flags&2 != 0, Reject: flags&4 != 0,
							Revision: rev, V2: v2, PrivateData: pd,
						}
						enhanced := rev == 2 && v2 != nil
						name := fmt.Sprintf("reply=%v rev=%d flags=%d v2=%d pd=%d", reply, rev, flags, vi, pdl)
						wantLen := iwarp.MPAHeaderSize + pdl
						if enhanced {
							wantLen += iwarp.MPAv2PrefixSize
						}
						if m.Len() != wantLen {
							t.Fatalf("%s: Len %d, want %d", name, m.Len(), wantLen)
						}
						buf := make([]byte, m.Len())
						err := iwarp.MPAFrame(buf).Encode(&m)
						if wantLen-iwarp.MPAHeaderSize > iwarp.MPAMaxPrivateData {
							if !errors.Is(err, iwarp.ErrMPAPDLength) {
								t.Fatalf("%s: over-limit private data: err %v", name, err)
							}
							continue
						}
						if err != nil {
							t.Fatalf("%s: Encode: %v", name, err)
						}
						cases++
						checkMPAFrame(t, name, buf, &m)
					}
				}
			}
		}
	}
	t.Logf("%d frames round-tripped", cases)
}

// checkMPAFrame decodes buf and compares every accessor with m.
func checkMPAFrame(t *testing.T, name string, buf []byte, m *iwarp.MPAFrameFields) {
	t.Helper()
	// Trailing bytes (the first FPDU) must not confuse the decoder.
	f := iwarp.MPAFrame(append(bytes.Clone(buf), 0xde, 0xad))
	n, err := f.Validate()
	if err != nil || n != len(buf) {
		t.Fatalf("%s: Validate = %d, %v; want %d", name, n, err, len(buf))
	}
	key := iwarp.MPAKeyRequest
	if m.Reply {
		key = iwarp.MPAKeyReply
	}
	enhanced := m.Revision == 2 && m.V2 != nil
	var wantFlags uint8
	if m.Markers {
		wantFlags |= iwarp.MPAFlagMarkers
	}
	if m.CRC {
		wantFlags |= iwarp.MPAFlagCRC
	}
	if m.Reject {
		wantFlags |= iwarp.MPAFlagReject
	}
	if enhanced {
		wantFlags |= iwarp.MPAFlagEnhanced
	}
	if !bytes.Equal(f.Key(), key[:]) || f.IsReply() != m.Reply || f.IsRequest() == m.Reply ||
		f.Markers() != m.Markers || f.CRC() != m.CRC || f.Reject() != m.Reject || f.Flags() != wantFlags ||
		f.Revision() != m.Revision || f.Enhanced() != enhanced || int(f.PDLength()) != len(buf)-iwarp.MPAHeaderSize {
		t.Fatalf("%s: decoded key %q flags %#02x (M=%v C=%v R=%v enh=%v) rev %d pd_len %d; encoded from %+v",
			name, f.Key(), f.Flags(), f.Markers(), f.CRC(), f.Reject(), f.Enhanced(), f.Revision(), f.PDLength(), *m)
	}
	if !bytes.Equal(f.PrivateData(), buf[iwarp.MPAHeaderSize:]) {
		t.Fatalf("%s: PrivateData mismatch", name)
	}
	if !bytes.Equal(f.ULPPrivateData(), m.PrivateData) {
		t.Fatalf("%s: ULPPrivateData % x, want % x", name, f.ULPPrivateData(), m.PrivateData)
	}
	v, ok := f.IRDORD()
	if ok != enhanced {
		t.Fatalf("%s: IRDORD ok=%v, want %v", name, ok, enhanced)
	}
	if enhanced && v != *m.V2 {
		t.Fatalf("%s: IRDORD %+v, want %+v", name, v, *m.V2)
	}
	if !enhanced && v != (iwarp.MPAv2Params{}) {
		t.Fatalf("%s: IRDORD %+v without enhanced setup", name, v)
	}
}

func TestMPAFrameEncodeOverLimit(t *testing.T) {
	for _, c := range []struct {
		rev uint8
		v2  bool
		pd  int
		ok  bool
	}{
		{1, false, 512, true},
		{1, false, 513, false},
		{2, false, 512, true},
		{2, false, 513, false},
		{2, true, 508, true},
		{2, true, 509, false}, // 4 + 509 > 512
		{1, true, 512, true},  // the word is only sent with rev 2
		{1, true, 513, false},
	} {
		m := iwarp.MPAFrameFields{Revision: c.rev, PrivateData: make([]byte, c.pd)}
		if c.v2 {
			m.V2 = &iwarp.MPAv2Params{IRD: 1, ORD: 1}
		}
		err := iwarp.MPAFrame(make([]byte, m.Len())).Encode(&m)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, iwarp.ErrMPAPDLength)) {
			t.Errorf("rev %d v2 %v pd %d: err %v, want ok=%v", c.rev, c.v2, c.pd, err, c.ok)
		}
	}
}

func TestMPAFrameValidateRejects(t *testing.T) {
	good := func() []byte {
		m := iwarp.MPAFrameFields{Revision: 2, V2: &iwarp.MPAv2Params{IRD: 1, ORD: 1}, PrivateData: []byte("hi")}
		b := make([]byte, m.Len())
		if err := iwarp.MPAFrame(b).Encode(&m); err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, c := range []struct {
		name string
		mod  func([]byte) []byte
		want error
	}{
		{"empty", func(b []byte) []byte { return nil }, iwarp.ErrMPAShort},
		{"19 bytes", func(b []byte) []byte { return b[:19] }, iwarp.ErrMPAShort},
		{"bad key", func(b []byte) []byte { b[3] = 'x'; return b }, iwarp.ErrMPAKey},
		{"lower-case key", func(b []byte) []byte { copy(b, "mpa id req frame"); return b }, iwarp.ErrMPAKey},
		{"rev 0", func(b []byte) []byte { b[17] = 0; return b }, iwarp.ErrMPARevision},
		{"rev 3", func(b []byte) []byte { b[17] = 3; return b }, iwarp.ErrMPARevision},
		{"pd_len 513", func(b []byte) []byte {
			binary.BigEndian.PutUint16(b[18:], 513)
			return append(b, make([]byte, 600)...)
		}, iwarp.ErrMPAPDLength},
		{"pd_len 0xffff", func(b []byte) []byte { binary.BigEndian.PutUint16(b[18:], 0xffff); return b }, iwarp.ErrMPAPDLength},
		{"enhanced pd_len 3", func(b []byte) []byte { binary.BigEndian.PutUint16(b[18:], 3); return b }, iwarp.ErrMPAv2Prefix},
		{"enhanced pd_len 0", func(b []byte) []byte { binary.BigEndian.PutUint16(b[18:], 0); return b[:20] }, iwarp.ErrMPAv2Prefix},
		{"truncated private data", func(b []byte) []byte { return b[:len(b)-1] }, iwarp.ErrMPATruncated},
		{"header only", func(b []byte) []byte { return b[:20] }, iwarp.ErrMPATruncated},
	} {
		b := c.mod(good())
		if n, err := iwarp.MPAFrame(b).Validate(); !errors.Is(err, c.want) {
			t.Errorf("%s: Validate = %d, %v; want %v", c.name, n, err, c.want)
		}
	}
	// Rev 1 with the 0x10 bit and no private data is not enhanced, so it
	// is valid without the IRD/ORD word.
	b := good()[:20]
	b[17] = 1
	binary.BigEndian.PutUint16(b[18:], 0)
	if n, err := iwarp.MPAFrame(b).Validate(); err != nil || n != 20 || iwarp.MPAFrame(b).Enhanced() {
		t.Errorf("rev 1 with flag 0x10: %d, %v, enhanced=%v", n, err, iwarp.MPAFrame(b).Enhanced())
	}
}

func TestMPAv2Params(t *testing.T) {
	for _, ird := range []uint16{0, 1, 128, iwarp.MPAMaxIRDORD} {
		for _, ord := range []uint16{0, 2, iwarp.MPAMaxIRDORD} {
			for rtr := iwarp.RTR(0); rtr < 8; rtr++ {
				for _, p2p := range []bool{false, true} {
					p := iwarp.MPAv2Params{IRD: ird, ORD: ord, PeerToPeer: p2p, RTR: rtr}
					var b [4]byte
					p.Encode(b[:])
					w1, w2 := binary.BigEndian.Uint16(b[:]), binary.BigEndian.Uint16(b[2:])
					want1 := ird
					if p2p {
						want1 |= iwarp.MPAv2PeerToPeer
					}
					if rtr&iwarp.RTRSend != 0 {
						want1 |= iwarp.MPAv2SendRTR
					}
					want2 := ord
					if rtr&iwarp.RTRWrite != 0 {
						want2 |= iwarp.MPAv2WriteRTR
					}
					if rtr&iwarp.RTRRead != 0 {
						want2 |= iwarp.MPAv2ReadRTR
					}
					if w1 != want1 || w2 != want2 {
						t.Fatalf("%+v encoded % x, want %04x%04x", p, b, want1, want2)
					}
					if got := iwarp.DecodeMPAv2Params(b[:]); got != p {
						t.Fatalf("%+v decoded as %+v", p, got)
					}
				}
			}
		}
	}
	// Values over 14 bits are masked rather than spilling into the flags.
	var b [4]byte
	iwarp.MPAv2Params{IRD: 0xffff, ORD: 0x4001}.Encode(b[:])
	if got := hex.EncodeToString(b[:]); got != "3fff0001" {
		t.Errorf("over-range IRD/ORD encoded as %s, want 3fff0001", got)
	}
	// The words siw sends (README of the siw captures).
	for raw, want := range map[string]iwarp.MPAv2Params{
		"00010001": {IRD: 1, ORD: 1},
		"00800080": {IRD: 128, ORD: 128},
		"8001c001": {IRD: 1, ORD: 1, PeerToPeer: true, RTR: iwarp.RTRWrite | iwarp.RTRRead},
		"8000c001": {IRD: 0, ORD: 1, PeerToPeer: true, RTR: iwarp.RTRWrite | iwarp.RTRRead},
		"80018001": {IRD: 1, ORD: 1, PeerToPeer: true, RTR: iwarp.RTRWrite},
		"80018000": {IRD: 1, ORD: 0, PeerToPeer: true, RTR: iwarp.RTRWrite},
		"40004000": {RTR: iwarp.RTRSend | iwarp.RTRRead},
	} {
		if got := iwarp.DecodeMPAv2Params(unhex(t, raw)); got != want {
			t.Errorf("%s decoded as %+v, want %+v", raw, got, want)
		}
	}
}

func TestMPAFrameSiwVector(t *testing.T) {
	b := unhex(t, siwMPARequestCRC)
	f := iwarp.MPAFrame(b)
	n, err := f.Validate()
	if err != nil || n != len(b) {
		t.Fatalf("Validate = %d, %v", n, err)
	}
	v, ok := f.IRDORD()
	if !f.IsRequest() || f.Markers() || !f.CRC() || f.Reject() || f.Flags() != 0x50 || f.Revision() != 2 ||
		!f.Enhanced() || f.PDLength() != 4 || len(f.ULPPrivateData()) != 0 || !ok || v != (iwarp.MPAv2Params{IRD: 1, ORD: 1}) {
		t.Errorf("siw request decoded: req=%v flags %#x rev %d pd %d v2 %+v %v", f.IsRequest(), f.Flags(), f.Revision(), f.PDLength(), v, ok)
	}
	m := iwarp.MPAFrameFields{CRC: true, Revision: 2, V2: &iwarp.MPAv2Params{IRD: 1, ORD: 1}}
	enc := make([]byte, m.Len())
	if err := iwarp.MPAFrame(enc).Encode(&m); err != nil || !bytes.Equal(enc, b) {
		t.Errorf("encoded % x, siw sent % x (%v)", enc, b, err)
	}
}

func TestRTRString(t *testing.T) {
	for r, want := range map[iwarp.RTR]string{
		0: "none", iwarp.RTRSend: "send", iwarp.RTRWrite: "write", iwarp.RTRRead: "read",
		iwarp.RTRSend | iwarp.RTRWrite: "send|write", iwarp.RTRWrite | iwarp.RTRRead: "write|read",
		iwarp.RTRSend | iwarp.RTRRead: "send|read", iwarp.RTRSend | iwarp.RTRWrite | iwarp.RTRRead: "send|write|read",
	} {
		if got := r.String(); got != want {
			t.Errorf("RTR(%d).String() = %q, want %q", r, got, want)
		}
	}
	// Unknown bits are not named (and do not panic).
	if got := iwarp.RTR(0x80 | 2).String(); got != "write" {
		t.Errorf("RTR(0x82).String() = %q", got)
	}
}

// ---- FPDU framing ----

func TestFPDUPadLen(t *testing.T) {
	for n := 0; n <= 70; n++ {
		pad, l := iwarp.FPDUPad(n), iwarp.FPDULen(n)
		if pad < 0 || pad > 3 || (iwarp.MPALengthSize+n+pad)%4 != 0 {
			t.Errorf("FPDUPad(%d) = %d", n, pad)
		}
		if l != iwarp.MPALengthSize+n+pad+iwarp.MPACRCSize || l%4 != 0 {
			t.Errorf("FPDULen(%d) = %d", n, l)
		}
	}
	for n, want := range map[int][2]int{0: {2, 8}, 1: {1, 8}, 2: {0, 8}, 3: {3, 12}, 14: {0, 20}, 18: {0, 24}, 1428: {2, 1436}, iwarp.MaxULPDU: {3, 0x10008}} {
		if p, l := iwarp.FPDUPad(n), iwarp.FPDULen(n); p != want[0] || l != want[1] {
			t.Errorf("n=%d: pad %d len %d, want %v", n, p, l, want)
		}
	}
}

func TestFPDUView(t *testing.T) {
	for n := 0; n <= 70; n++ {
		l := iwarp.FPDULen(n)
		b := make([]byte, l+3) // trailing bytes belong to the next FPDU
		binary.BigEndian.PutUint16(b, uint16(n))
		for i := 0; i < n; i++ {
			b[2+i] = byte(i + 1)
		}
		binary.LittleEndian.PutUint32(b[l-4:], 0xa1b2c3d4) // CRC32c is sent LSB first
		copy(b[l:], "nxt")
		f := iwarp.FPDU(b)
		if f.ULPDULength() != n || f.Len() != l || len(f.ULPDU()) != n || f.CRC() != 0xa1b2c3d4 {
			t.Fatalf("n=%d: ULPDULength %d Len %d ULPDU %d CRC %#x", n, f.ULPDULength(), f.Len(), len(f.ULPDU()), f.CRC())
		}
		if n > 0 && (f.ULPDU()[0] != 1 || f.ULPDU()[n-1] != byte(n)) {
			t.Fatalf("n=%d: ULPDU % x", n, f.ULPDU())
		}
		// The views work on an exactly sized FPDU too.
		g := iwarp.FPDU(b[:l:l])
		if g.CRC() != 0xa1b2c3d4 || len(g.ULPDU()) != n {
			t.Fatalf("n=%d: exact-size view broken", n)
		}
	}
}

// TestFPDUCRCSiwVectors checks the CRC32c of FPDUs siw sent with CRC
// negotiated: the bytes of the field are the CRC least significant byte
// first (as in iSCSI, RFC 3720 B.4, and as tshark verifies them).
func TestFPDUCRCSiwVectors(t *testing.T) {
	for _, s := range []string{siwSendCRC, siwReadRespCRC} {
		f := iwarp.FPDU(unhex(t, s))
		if f.Len() != len(f) {
			t.Fatalf("FPDU of %d bytes has Len %d", len(f), f.Len())
		}
		want := crc32.Checksum(f[:len(f)-iwarp.MPACRCSize], castagnoli)
		if got := binary.LittleEndian.Uint32(f[len(f)-4:]); got != want {
			t.Fatalf("siw vector: field (LSB first) %#08x, CRC32c %#08x", got, want)
		}
		h := iwarp.DDPHeader(f.ULPDU())
		if err := checkDDP(h); err != nil {
			t.Errorf("siw %v: %v", h.Opcode(), err)
		}
	}
}

// TestFPDUCRCAccessorByteOrder checks that FPDU.CRC returns the CRC32c
// value of a real siw FPDU, i.e. that the accessor (and the engine, which
// writes and compares the field big-endian in tx.go and rx.go) uses the
// wire byte order siw and tshark use.
func TestFPDUCRCAccessorByteOrder(t *testing.T) {
	f := iwarp.FPDU(unhex(t, siwSendCRC))
	want := crc32.Checksum(f[:len(f)-iwarp.MPACRCSize], castagnoli)
	if got := f.CRC(); got != want {
		t.Errorf("FPDU.CRC() = %#08x on siw's FPDU whose CRC32c is %#08x: the CRC field is decoded big-endian, "+
			"but MPA (like iSCSI) sends CRC32c least significant byte first; rdmatap with CRC on will not interoperate with siw", got, want)
	}
}

// ---- DDP / RDMAP ----

func TestDDPHeaderRoundTrip(t *testing.T) {
	payload := []byte("payload!")
	for op := iwarp.Opcode(0); op <= iwarp.OpAtomicResp; op++ {
		for _, last := range []bool{false, true} {
			f := iwarp.DDPFields{
				Opcode: op, Last: last,
				STag: 0x11223344, TO: 0x8877665544332211,
				RsvdULP: 0xcafef00d, QN: 2, MSN: 0xfffffffe, MO: 0x01020304,
			}
			buf := make([]byte, iwarp.DDPUntaggedHeaderSize+len(payload))
			n := iwarp.DDPHeader(buf).Encode(&f)
			copy(buf[n:], payload)
			b := buf[: n+len(payload) : n+len(payload)]
			h := iwarp.DDPHeader(b)
			wantSize := iwarp.DDPUntaggedHeaderSize
			if op.Tagged() {
				wantSize = iwarp.DDPTaggedHeaderSize
			}
			name := fmt.Sprintf("%v last=%v", op, last)
			if n != wantSize || h.HeaderSize() != n {
				t.Fatalf("%s: Encode returned %d, HeaderSize %d, want %d", name, n, h.HeaderSize(), wantSize)
			}
			if err := h.Validate(); err != nil {
				t.Fatalf("%s: Validate: %v", name, err)
			}
			if h.Tagged() != op.Tagged() || h.Last() != last || h.DDPVersion() != iwarp.DDPVersion ||
				h.RDMAPVersion() != iwarp.RDMAPVersion || h.DDPReserved() != 0 || h.Opcode() != op || b[1]&0x30 != 0 {
				t.Fatalf("%s: decoded T=%v L=%v DV=%d RV=%d rsvd=%d op=%v", name, h.Tagged(), h.Last(), h.DDPVersion(), h.RDMAPVersion(), h.DDPReserved(), h.Opcode())
			}
			// Control bytes as siw's notes list them.
			wantCtl := byte(0x01)
			if op.Tagged() {
				wantCtl |= 0x80
			}
			if last {
				wantCtl |= 0x40
			}
			if b[0] != wantCtl || b[1] != 0x40|byte(op) {
				t.Fatalf("%s: control bytes % x, want %02x %02x", name, b[:2], wantCtl, 0x40|byte(op))
			}
			if op.Tagged() {
				if h.STag() != f.STag || h.TO() != f.TO {
					t.Fatalf("%s: STag %#x TO %#x", name, h.STag(), h.TO())
				}
			} else if h.InvalidateSTag() != f.RsvdULP || h.QN() != f.QN || h.MSN() != f.MSN || h.MO() != f.MO {
				t.Fatalf("%s: RsvdULP %#x QN %d MSN %#x MO %#x", name, h.InvalidateSTag(), h.QN(), h.MSN(), h.MO())
			}
			if !bytes.Equal(h.Payload(), payload) {
				t.Fatalf("%s: payload % x", name, h.Payload())
			}
			// Header only: valid, empty payload. One byte less: short.
			if err := h[:n].Validate(); err != nil || len(h[:n].Payload()) != 0 {
				t.Fatalf("%s: header-only segment: %v", name, err)
			}
			for k := 0; k < n; k++ {
				if err := h[:k].Validate(); !errors.Is(err, iwarp.ErrDDPShort) {
					t.Fatalf("%s: %d-byte segment: Validate = %v", name, k, err)
				}
			}
		}
	}
}

func TestOpcodePredicates(t *testing.T) {
	names := map[iwarp.Opcode]string{}
	for op := iwarp.Opcode(0); op < 16; op++ {
		s := op.String()
		if s == "" {
			t.Errorf("opcode %d has an empty name", op)
		}
		if op > iwarp.OpAtomicResp {
			if s != fmt.Sprintf("opcode %#x", uint8(op)) {
				t.Errorf("unknown opcode %d named %q", op, s)
			}
		} else if strings.HasPrefix(s, "opcode ") {
			t.Errorf("known opcode %d unnamed: %q", op, s)
		}
		if prev, dup := names[op]; dup {
			t.Errorf("duplicate %q", prev)
		}
		names[op] = s
		tagged := op == iwarp.OpWrite || op == iwarp.OpReadResponse
		isSend := op >= 3 && op <= 6
		inval := op == iwarp.OpSendInvalidate || op == iwarp.OpSendSEInval
		se := op == iwarp.OpSendSE || op == iwarp.OpSendSEInval
		if op.Tagged() != tagged || op.IsSend() != isSend || op.Invalidates() != inval || op.Solicited() != se {
			t.Errorf("%v: Tagged=%v IsSend=%v Invalidates=%v Solicited=%v", op, op.Tagged(), op.IsSend(), op.Invalidates(), op.Solicited())
		}
	}
	if got := iwarp.Opcode(0x1f).String(); got != "opcode 0x1f" {
		t.Errorf("Opcode(0x1f) = %q", got)
	}
}

func TestReadRequestRoundTrip(t *testing.T) {
	f := iwarp.ReadRequestFields{SinkSTag: 0x01020304, SinkTO: 0x1112131415161718, Size: 0xfffffff0, SourceSTag: 0xa0b0c0d0, SourceTO: 0xfedcba9876543210}
	b := make([]byte, iwarp.ReadRequestSize)
	iwarp.ReadRequest(b).Encode(&f)
	want := "01020304 1112131415161718 fffffff0 a0b0c0d0 fedcba9876543210"
	if got := hex.EncodeToString(b); got != strings.ReplaceAll(want, " ", "") {
		t.Fatalf("encoded %s, want %s", got, want)
	}
	r := iwarp.ReadRequest(b)
	if r.Fields() != f || r.SinkSTag() != f.SinkSTag || r.SinkTO() != f.SinkTO || r.Size() != f.Size ||
		r.SourceSTag() != f.SourceSTag || r.SourceTO() != f.SourceTO {
		t.Fatalf("decoded %+v, want %+v", r.Fields(), f)
	}
	// A whole Read Request segment.
	seg := make([]byte, iwarp.DDPUntaggedHeaderSize+iwarp.ReadRequestSize)
	n := iwarp.DDPHeader(seg).Encode(&iwarp.DDPFields{Opcode: iwarp.OpReadRequest, Last: true, QN: iwarp.QNReadReq, MSN: 1})
	iwarp.ReadRequest(seg[n:]).Encode(&f)
	h := iwarp.DDPHeader(seg)
	if err := checkDDP(h); err != nil {
		t.Fatal(err)
	}
	if got := iwarp.ReadRequest(h.Payload()).Fields(); got != f {
		t.Fatalf("segment payload decoded %+v", got)
	}
}

// ---- Terminate ----

func TestTerminateRoundTrip(t *testing.T) {
	rr := iwarp.ReadRequestFields{SinkSTag: 5, SinkTO: 6, Size: 7, SourceSTag: 8, SourceTO: 9}
	seg := func(f iwarp.DDPFields, payload []byte) []byte {
		b := make([]byte, iwarp.DDPUntaggedHeaderSize)
		n := iwarp.DDPHeader(b).Encode(&f)
		return append(b[:n], payload...)
	}
	rrBytes := make([]byte, iwarp.ReadRequestSize)
	iwarp.ReadRequest(rrBytes).Encode(&rr)
	code := iwarp.TermCode{Layer: iwarp.LayerDDP, EType: iwarp.ETypeUntaggedBuffer, Code: iwarp.CodeNoBuffer}
	for _, c := range []struct {
		name    string
		ulpdu   []byte
		segLen  int
		wantLen int
		d, r    bool
	}{
		{"no header", nil, 0, 4, false, false},
		{"short ULPDU", []byte{0x41}, 0, 4, false, false},
		{"truncated untagged header", seg(iwarp.DDPFields{Opcode: iwarp.OpSend}, nil)[:17], 0, 4, false, false},
		{"send", seg(iwarp.DDPFields{Opcode: iwarp.OpSend, Last: true, MSN: 3}, []byte("abc")), 21, 6 + 18, true, false},
		{"write", seg(iwarp.DDPFields{Opcode: iwarp.OpWrite, STag: 0x99, TO: 4}, []byte("abc")), 17, 6 + 14, true, false},
		{"read request", seg(iwarp.DDPFields{Opcode: iwarp.OpReadRequest, Last: true, QN: 1, MSN: 1}, rrBytes), 46, 6 + 18 + 28, true, true},
		{"short read request", seg(iwarp.DDPFields{Opcode: iwarp.OpReadRequest, Last: true, QN: 1, MSN: 1}, rrBytes[:27]), 45, 6 + 18, true, false},
	} {
		buf := make([]byte, iwarp.TerminateMaxSize)
		for i := range buf {
			buf[i] = 0xee // Encode must write every byte it counts
		}
		n := iwarp.Terminate(buf).Encode(&iwarp.TerminateFields{Code: code, ULPDU: c.ulpdu, SegmentLength: c.segLen})
		if n != c.wantLen {
			t.Errorf("%s: length %d, want %d", c.name, n, c.wantLen)
			continue
		}
		tm := iwarp.Terminate(buf[:n:n])
		if err := tm.Validate(); err != nil {
			t.Errorf("%s: Validate: %v", c.name, err)
			continue
		}
		if tm.Code() != code || tm.HasSegLen() != c.d || tm.HasDDPHeader() != c.d || tm.HasRDMAPHeader() != c.r || buf[3] != 0 || buf[2]&0x1f != 0 {
			t.Errorf("%s: code %v M=%v D=%v R=%v ctrl % x", c.name, tm.Code(), tm.HasSegLen(), tm.HasDDPHeader(), tm.HasRDMAPHeader(), buf[:4])
		}
		if got, swapped := iwarp.DecodeTerminateLenient(tm); got != code || swapped {
			t.Errorf("%s: lenient decode %v swapped=%v", c.name, got, swapped)
		}
		sl, ok := tm.SegmentLength()
		if ok != c.d || (ok && sl != c.segLen) {
			t.Errorf("%s: SegmentLength %d %v", c.name, sl, ok)
		}
		h, ok := tm.DDPHeader()
		if ok != c.d || (ok && !bytes.Equal(h, c.ulpdu[:h.HeaderSize()])) {
			t.Errorf("%s: DDPHeader % x %v", c.name, h, ok)
		}
		r, ok := tm.RDMAPHeader()
		if ok != c.r || (ok && r.Fields() != rr) {
			t.Errorf("%s: RDMAPHeader %v", c.name, ok)
		}
		for k := 0; k < n; k++ {
			if err := tm[:k].Validate(); !errors.Is(err, iwarp.ErrTerminateShort) {
				t.Errorf("%s: %d of %d bytes: Validate = %v", c.name, k, n, err)
			}
		}
	}
	// Every layer/etype/code survives the control word.
	for layer := iwarp.Layer(0); layer < 16; layer++ {
		for et := uint8(0); et < 16; et++ {
			for _, cd := range []uint8{0, 1, 0x7f, 0xff} {
				code := iwarp.TermCode{Layer: layer, EType: et, Code: cd}
				buf := make([]byte, iwarp.TerminateMaxSize)
				n := iwarp.Terminate(buf).Encode(&iwarp.TerminateFields{Code: code})
				if got := iwarp.Terminate(buf[:n]).Code(); n != 4 || got != code {
					t.Fatalf("%v: encoded % x, decoded %v", code, buf[:n], got)
				}
			}
		}
	}
}

func TestTerminateHandmadeFlags(t *testing.T) {
	rr := make([]byte, iwarp.ReadRequestSize)
	iwarp.ReadRequest(rr).Encode(&iwarp.ReadRequestFields{SinkSTag: 0xabcd})
	// R without M or D: the RDMAP header follows the control word.
	b := append([]byte{0x00, 0x01, 0x20, 0x00}, rr...)
	tm := iwarp.Terminate(b)
	if err := tm.Validate(); err != nil {
		t.Fatal(err)
	}
	if r, ok := tm.RDMAPHeader(); !ok || r.SinkSTag() != 0xabcd {
		t.Errorf("R only: %v %v", r, ok)
	}
	if _, ok := tm.DDPHeader(); ok {
		t.Error("R only: DDPHeader present")
	}
	if err := tm[:len(tm)-1].Validate(); !errors.Is(err, iwarp.ErrTerminateShort) {
		t.Errorf("R only, short: %v", err)
	}
	// M and R: the segment length field sits between them.
	b = append([]byte{0x00, 0x01, 0xa0, 0x00, 0x01, 0x02}, rr...)
	tm = iwarp.Terminate(b)
	if err := tm.Validate(); err != nil {
		t.Fatal(err)
	}
	if l, ok := tm.SegmentLength(); !ok || l != 0x102 {
		t.Errorf("M+R: segment length %d %v", l, ok)
	}
	if r, ok := tm.RDMAPHeader(); !ok || r.SinkSTag() != 0xabcd {
		t.Errorf("M+R: %v %v", r, ok)
	}
	// D with only the first byte of a DDP header.
	for _, b := range [][]byte{{0x10, 0x02, 0x40, 0x00, 0, 0}, {0x10, 0x02, 0x40, 0x00, 0, 0, 0x41}, {0x10, 0x02, 0x40, 0x00, 0, 0, 0xc1, 0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}} {
		if err := iwarp.Terminate(b).Validate(); !errors.Is(err, iwarp.ErrTerminateShort) {
			t.Errorf("% x: Validate = %v", b, err)
		}
	}
}

// siwTerminate lays out a Terminate control word the way Linux siw's
// little-endian bit-fields do: byte 0 = etype<<4 | layer, M/D/R at
// 0x01/0x02/0x04 of byte 2.
func siwTerminate(c iwarp.TermCode, m, d, r bool) []byte {
	b := []byte{c.EType<<4 | uint8(c.Layer)&0x0f, c.Code, 0, 0}
	if m {
		b[2] |= 0x01
	}
	if d {
		b[2] |= 0x02
	}
	if r {
		b[2] |= 0x04
	}
	return append(b, make([]byte, 2+iwarp.DDPUntaggedHeaderSize+iwarp.ReadRequestSize)...)
}

func TestDecodeTerminateLenient(t *testing.T) {
	for _, c := range []struct {
		code    iwarp.TermCode
		m, d, r bool
	}{
		{iwarp.TermCode{Layer: iwarp.LayerDDP, EType: iwarp.ETypeTaggedBuffer, Code: iwarp.CodeDDPInvalidSTag}, true, true, false},
		{iwarp.TermCode{Layer: iwarp.LayerDDP, EType: iwarp.ETypeUntaggedBuffer, Code: iwarp.CodeNoBuffer}, true, true, false},
		{iwarp.TermCode{Layer: iwarp.LayerDDP, EType: iwarp.ETypeUntaggedBuffer, Code: iwarp.CodeMSNRange}, true, true, false},
		{iwarp.TermCode{Layer: iwarp.LayerRDMAP, EType: iwarp.ETypeRemoteProtection, Code: iwarp.CodeInvalidSTag}, true, true, true},
		{iwarp.TermCode{Layer: iwarp.LayerRDMAP, EType: iwarp.ETypeRemoteOperation, Code: iwarp.CodeCatastrophicStream}, true, true, false},
		{iwarp.TermCode{Layer: iwarp.LayerLLP, EType: iwarp.ETypeMPA, Code: iwarp.CodeFPDUStart}, true, false, false},
	} {
		b := siwTerminate(c.code, c.m, c.d, c.r)
		got, swapped := iwarp.DecodeTerminateLenient(iwarp.Terminate(b))
		if got != c.code || !swapped {
			t.Errorf("siw layout % x of %v: decoded %v swapped=%v", b[:4], c.code, got, swapped)
		}
		if err := iwarp.Terminate(b).Validate(); err != nil {
			t.Errorf("siw layout % x: Validate: %v", b[:4], err)
		}
	}
	// An RFC layer above LLP with a plausible swapped one.
	if got, swapped := iwarp.DecodeTerminateLenient(iwarp.Terminate{0x31, 0x03, 0, 0}); got.Layer > iwarp.LayerLLP || !swapped {
		t.Errorf("impossible RFC layer: %v swapped=%v", got, swapped)
	}
	// RFC layout is never swapped, even when flags are set.
	for _, code := range []iwarp.TermCode{
		{Layer: iwarp.LayerLLP, EType: iwarp.ETypeMPA, Code: iwarp.CodeCRC},
		{Layer: iwarp.LayerRDMAP, EType: iwarp.ETypeRDMAPCatastrophic, Code: iwarp.CodeUnspecified},
		{Layer: iwarp.LayerDDP, EType: iwarp.ETypeTaggedBuffer, Code: iwarp.CodeDDPBaseBounds},
	} {
		for _, flags := range []byte{0, 0x80, 0xc0, 0xe0} {
			b := []byte{byte(code.Layer)<<4 | code.EType, code.Code, flags, 0}
			if got, swapped := iwarp.DecodeTerminateLenient(iwarp.Terminate(b)); got != code || swapped {
				t.Errorf("RFC % x: decoded %v swapped=%v", b, got, swapped)
			}
		}
	}
}

// TestDecodeTerminateLenientSiwNoHeader: siw attaches no header (M=D=R=0)
// to LLP errors, e.g. the Terminate it sends on a CRC error (LLP/MPA/0x02,
// siw_qp_rx.c), so the flag heuristic cannot fire. In siw's layout that is
// 02 02 00 00, which read as RFC is RDMAP/Remote Operation/0x02, a code RFC
// 5040 does not define, while the swapped reading is the well-known MPA CRC
// error. A decoder for siw's layout should decode it as such.
func TestDecodeTerminateLenientSiwNoHeader(t *testing.T) {
	for _, code := range []iwarp.TermCode{
		{Layer: iwarp.LayerLLP, EType: iwarp.ETypeMPA, Code: iwarp.CodeCRC},
		{Layer: iwarp.LayerLLP, EType: iwarp.ETypeMPA, Code: iwarp.CodeFPDUStart},
	} {
		b := siwTerminate(code, false, false, false)
		if got, _ := iwarp.DecodeTerminateLenient(iwarp.Terminate(b)); got != code {
			t.Errorf("siw Terminate % x (%v, no headers attached) decoded as %v", b[:4], code, got)
		}
	}
}

func TestTermCodeString(t *testing.T) {
	for _, c := range []struct {
		code iwarp.TermCode
		name string
	}{
		{iwarp.TermCode{Layer: iwarp.LayerLLP, EType: iwarp.ETypeMPA, Code: iwarp.CodeCRC}, "MPA CRC error"},
		{iwarp.TermCode{Layer: iwarp.LayerDDP, EType: iwarp.ETypeUntaggedBuffer, Code: iwarp.CodeInvalidQN}, "invalid QN"},
		{iwarp.TermCode{Layer: iwarp.LayerRDMAP, EType: iwarp.ETypeRemoteProtection, Code: iwarp.CodeInvalidSTag}, "invalid STag"},
		{iwarp.TermCode{Layer: iwarp.LayerRDMAP, EType: iwarp.ETypeRemoteOperation, Code: iwarp.CodeUnspecified}, "unspecified error"},
		{iwarp.TermCode{Layer: iwarp.LayerLLP, EType: iwarp.ETypeMPA, Code: iwarp.CodeNoMatchingRTR}, "no matching RTR option"},
	} {
		s := c.code.String()
		if !strings.HasPrefix(s, c.code.Layer.String()+"/") || !strings.HasSuffix(s, "("+c.name+")") {
			t.Errorf("%+v.String() = %q, want layer prefix and (%s)", c.code, s, c.name)
		}
		var et, cd uint8
		var layer string
		if _, err := fmt.Sscanf(strings.ReplaceAll(s, "/", " "), "%s %d %v", &layer, &et, &cd); err != nil || et != c.code.EType || cd != c.code.Code {
			t.Errorf("%q: etype/code do not parse back (%v: %d %d)", s, err, et, cd)
		}
	}
	for _, code := range []iwarp.TermCode{
		{Layer: iwarp.LayerRDMAP, EType: iwarp.ETypeRemoteOperation, Code: 0x02},
		{Layer: iwarp.LayerDDP, EType: 7, Code: 0x42},
		{Layer: 9, EType: 1, Code: 0},
	} {
		s := code.String()
		if strings.Contains(s, "(") || !strings.HasPrefix(s, code.Layer.String()+"/") {
			t.Errorf("unknown %+v.String() = %q", code, s)
		}
	}
	for l, want := range map[iwarp.Layer]string{iwarp.LayerRDMAP: "RDMAP", iwarp.LayerDDP: "DDP", iwarp.LayerLLP: "LLP", 3: "layer 3", 15: "layer 15"} {
		if got := l.String(); got != want {
			t.Errorf("Layer(%d) = %q, want %q", l, got, want)
		}
	}
}
