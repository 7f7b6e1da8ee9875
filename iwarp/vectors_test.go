package iwarp_test

// Test vectors from real Linux siw traffic: the captures in
// testdata/siw-pcaps at the repository root are
// reassembled into TCP byte streams and decoded with the wire views. The
// expected values come from the captures' README and from ANALYSIS.txt,
// which tshark produced independently.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/klauspost/crc32"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/iwarp/internal/pcapread"
)

// siwPcapDir is where the siw captures live, relative to this package's
// directory (go test runs in iwarp/; the captures are the repository's testdata).
var siwPcapDir = filepath.Join("..", "testdata", "siw-pcaps")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// crcMode says what parseFPDUs expects of the CRC field.
type crcMode int

const (
	crcIgnore crcMode = iota // anything goes (fuzzing)
	crcZero                  // CRC not negotiated: the field is 0
	crcCheck                 // CRC negotiated: the field is CRC32c
)

// fpduRec is one decoded FPDU of a stream.
type fpduRec struct {
	Off  int             // offset of the FPDU in the parsed bytes
	FPDU iwarp.FPDU      // the whole FPDU, capacity clipped to its length
	Hdr  iwarp.DDPHeader // the ULPDU (DDP header + payload), capacity clipped
}

// errFPDUTruncated reports a stream that ends inside an FPDU.
var errFPDUTruncated = errors.New("stream ends inside an FPDU")

// parseFPDUs parses b as back-to-back FPDUs (no markers) and checks every
// header the way a strict receiver would. It returns the FPDUs decoded
// before the first problem. Every view it hands out has its capacity
// clipped to its length, so a view that reached past its bounds would
// panic rather than read neighbouring bytes.
func parseFPDUs(b []byte, mode crcMode) ([]fpduRec, error) {
	b = b[:len(b):len(b)]
	var out []fpduRec
	for off := 0; off < len(b); {
		rest := b[off:]
		if len(rest) < iwarp.MPALengthSize {
			return out, fmt.Errorf("offset %d: %w (%d bytes left)", off, errFPDUTruncated, len(rest))
		}
		l := iwarp.FPDU(rest).Len()
		if l > len(rest) {
			return out, fmt.Errorf("offset %d: %w (FPDU of %d bytes, %d left)", off, errFPDUTruncated, l, len(rest))
		}
		f := iwarp.FPDU(rest[:l:l])
		n := f.ULPDULength()
		ulpdu := f.ULPDU()
		if len(ulpdu) != n || l != iwarp.MPALengthSize+n+iwarp.FPDUPad(n)+iwarp.MPACRCSize {
			return out, fmt.Errorf("offset %d: FPDU view inconsistent: ULPDU %d bytes, length field %d, FPDU %d", off, len(ulpdu), n, l)
		}
		// The pad is not checked: RFC 5044 has receivers ignore it, and
		// siw sends whatever follows the payload in its buffer there.
		switch mode {
		case crcCheck:
			// CRC32c goes on the wire least significant byte first, as
			// in iSCSI (RFC 3720 B.4) and SCTP; this is what siw sends
			// and what tshark checks as "Good CRC32".
			if got, want := wireCRC(f), crc32.Checksum(f[:l-iwarp.MPACRCSize], castagnoli); got != want {
				return out, fmt.Errorf("offset %d: CRC field %#08x, CRC32c %#08x", off, got, want)
			}
		case crcZero:
			if c := f.CRC(); c != 0 {
				return out, fmt.Errorf("offset %d: CRC field %#08x without CRC negotiated", off, c)
			}
		}
		h := iwarp.DDPHeader(clip(ulpdu))
		if err := checkDDP(h); err != nil {
			return out, fmt.Errorf("offset %d: %w", off, err)
		}
		out = append(out, fpduRec{Off: off, FPDU: f, Hdr: h})
		off += l
	}
	return out, nil
}

// wireCRC returns the CRC32c an FPDU's trailer carries, decoded in wire
// (least significant byte first) order.
func wireCRC(f iwarp.FPDU) uint32 {
	return binary.LittleEndian.Uint32(f[len(f)-iwarp.MPACRCSize:])
}

// checkDDP validates a DDP segment's header and, for Read Requests and
// Terminates, the RDMAP header after it.
func checkDDP(h iwarp.DDPHeader) error {
	if err := h.Validate(); err != nil {
		return err
	}
	if v := h.DDPVersion(); v != iwarp.DDPVersion {
		return fmt.Errorf("DDP version %d", v)
	}
	if v := h.RDMAPVersion(); v != iwarp.RDMAPVersion {
		return fmt.Errorf("RDMAP version %d", v)
	}
	if r := h.DDPReserved(); r != 0 {
		return fmt.Errorf("DDP reserved bits %#x", r)
	}
	if r := h[1] & 0x30; r != 0 {
		return fmt.Errorf("RDMAP reserved bits %#x", r)
	}
	op := h.Opcode()
	if op > iwarp.OpAtomicResp {
		return fmt.Errorf("unknown opcode %#x", uint8(op))
	}
	if h.Tagged() != op.Tagged() {
		return fmt.Errorf("%v with T=%v", op, h.Tagged())
	}
	if len(h.Payload()) != len(h)-h.HeaderSize() {
		return fmt.Errorf("payload %d bytes in a %d-byte segment", len(h.Payload()), len(h))
	}
	if h.Tagged() {
		return nil
	}
	qn := h.QN()
	if qn > iwarp.QNTerminate {
		return fmt.Errorf("QN %d", qn)
	}
	want := uint32(iwarp.QNSend)
	switch op {
	case iwarp.OpReadRequest:
		want = iwarp.QNReadReq
	case iwarp.OpTerminate:
		want = iwarp.QNTerminate
	}
	if op.IsSend() || op == iwarp.OpReadRequest || op == iwarp.OpTerminate {
		if qn != want {
			return fmt.Errorf("%v on QN %d", op, qn)
		}
	}
	switch op {
	case iwarp.OpReadRequest:
		if len(h.Payload()) != iwarp.ReadRequestSize {
			return fmt.Errorf("Read Request with %d payload bytes", len(h.Payload()))
		}
		if !h.Last() || h.MO() != 0 {
			return fmt.Errorf("Read Request with L=%v MO=%d", h.Last(), h.MO())
		}
	case iwarp.OpTerminate:
		if err := iwarp.Terminate(h.Payload()).Validate(); err != nil {
			return err
		}
	}
	return nil
}

// ---- ANALYSIS.txt ----

type segKey struct {
	Op     iwarp.Opcode
	Tagged bool
	Last   bool
}

func (k segKey) String() string {
	return fmt.Sprintf("op=%#02x tagged=%d last=%d", uint8(k.Op), b2i(k.Tagged), b2i(k.Last))
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// analysisMPA is one "MPA Request/Reply" line of ANALYSIS.txt.
type analysisMPA struct {
	Request          bool
	Frame            int
	Flow             string // "10.77.0.4:33272 -> 10.77.0.2:18515"
	M, C, R          int
	Res              int
	Rev, PDLen       int
	PD               string // hex
	IRD, ORD         int
	P2P              int
	SendRTR, WrRTR   int
	ReadRTR          int
	HasIRDORDColumns bool
}

type analysis struct {
	MPA          []analysisMPA
	CRCGood      int
	CRCBad       int
	CRCZero      int
	Segments     map[segKey]int
	PayloadSizes map[int]int // size -> count (the top 8 only)
	Frames       int
	MaxFrame     int
	Malformed    int
}

var (
	reCapture = regexp.MustCompile(`^=== (\S+)$`)
	reMPA     = regexp.MustCompile(`^MPA (Request|Reply)\s+frame (\d+) (\S+) -> (\S+)\s+M=(\d) C=(\d) R=(\d) res=0x([0-9a-f]+)\S* rev=(\d+) pd_len=(\d+) pd=(\S+)(?:\s+IRD=(\d+) ORD=(\d+) P2P=(\d) ZERO_LEN_RTR=(\d) WRITE_RTR=(\d) READ_RTR=(\d))?\s*$`)
	reCRC     = regexp.MustCompile(`^CRC: FPDUs with CRC verified good by tshark=(\d+) bad=(\d+); FPDUs carrying CRC field 0 \(CRC not negotiated\)=(\d+)$`)
	reSeg     = regexp.MustCompile(`^\s*(\d+)\s+DDP segments op=0x([0-9a-f]+) tagged=([01]) last=([01])$`)
	reSize    = regexp.MustCompile(`^\s+(\d+) (\d+)$`)
	reFrames  = regexp.MustCompile(`^frames: (\d+), max frame (\d+) bytes, malformed: (\d+)$`)
)

func atoi(t testing.TB, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("ANALYSIS.txt: %v", err)
	}
	return n
}

// parseAnalysis parses ANALYSIS.txt into per-capture summaries.
func parseAnalysis(t testing.TB, name string) map[string]*analysis {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatalf("reading ANALYSIS.txt: %v", err)
	}
	out := map[string]*analysis{}
	var cur *analysis
	inSizes := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if m := reCapture.FindStringSubmatch(line); m != nil {
			cur = &analysis{Segments: map[segKey]int{}, PayloadSizes: map[int]int{}, Frames: -1}
			out[m[1]] = cur
			inSizes = false
			continue
		}
		if cur == nil {
			continue
		}
		switch {
		case strings.HasPrefix(line, "MPA "):
			m := reMPA.FindStringSubmatch(line)
			if m == nil {
				t.Fatalf("ANALYSIS.txt: unparsed MPA line %q", line)
			}
			a := analysisMPA{
				Request: m[1] == "Request", Frame: atoi(t, m[2]), Flow: m[3] + " -> " + m[4],
				M: atoi(t, m[5]), C: atoi(t, m[6]), R: atoi(t, m[7]),
				Rev: atoi(t, m[9]), PDLen: atoi(t, m[10]), PD: m[11],
			}
			res, err := strconv.ParseUint(m[8], 16, 8)
			if err != nil {
				t.Fatalf("ANALYSIS.txt: res in %q: %v", line, err)
			}
			a.Res = int(res)
			if m[12] != "" {
				a.HasIRDORDColumns = true
				a.IRD, a.ORD, a.P2P = atoi(t, m[12]), atoi(t, m[13]), atoi(t, m[14])
				a.SendRTR, a.WrRTR, a.ReadRTR = atoi(t, m[15]), atoi(t, m[16]), atoi(t, m[17])
			}
			cur.MPA = append(cur.MPA, a)
		case strings.HasPrefix(line, "CRC: "):
			m := reCRC.FindStringSubmatch(line)
			if m == nil {
				t.Fatalf("ANALYSIS.txt: unparsed CRC line %q", line)
			}
			cur.CRCGood, cur.CRCBad, cur.CRCZero = atoi(t, m[1]), atoi(t, m[2]), atoi(t, m[3])
		case strings.Contains(line, "DDP segments op="):
			m := reSeg.FindStringSubmatch(line)
			if m == nil {
				t.Fatalf("ANALYSIS.txt: unparsed segment line %q", line)
			}
			op, err := strconv.ParseUint(m[2], 16, 8)
			if err != nil {
				t.Fatalf("ANALYSIS.txt: opcode in %q: %v", line, err)
			}
			cur.Segments[segKey{iwarp.Opcode(op), m[3] == "1", m[4] == "1"}] += atoi(t, m[1])
		case strings.HasPrefix(line, "TCP payload sizes"):
			inSizes = true
		case strings.HasPrefix(line, "frames: "):
			inSizes = false
			m := reFrames.FindStringSubmatch(line)
			if m == nil {
				t.Fatalf("ANALYSIS.txt: unparsed frames line %q", line)
			}
			cur.Frames, cur.MaxFrame, cur.Malformed = atoi(t, m[1]), atoi(t, m[2]), atoi(t, m[3])
		case inSizes:
			if m := reSize.FindStringSubmatch(line); m != nil {
				cur.PayloadSizes[atoi(t, m[2])] = atoi(t, m[1])
			}
		}
	}
	return out
}

// ---- loading captures ----

// siwCapture is a capture reassembled into streams.
type siwCapture struct {
	Name    string
	File    *pcapread.File
	Segs    []pcapread.Segment
	Streams []*pcapread.Stream
}

// siwCaptures loads every capture in siwPcapDir, or skips the test if the
// directory is missing.
func siwCaptures(t testing.TB) []*siwCapture {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(siwPcapDir, "*.pcap"))
	if err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Fatalf("siw captures not found in %s", siwPcapDir)
	}
	sort.Strings(names)
	var out []*siwCapture
	for _, n := range names {
		c, err := loadCapture(n)
		if err != nil {
			t.Fatalf("%s: %v", filepath.Base(n), err)
		}
		out = append(out, c)
	}
	return out
}

func loadCapture(name string) (*siwCapture, error) {
	f, err := pcapread.ReadFile(name)
	if err != nil {
		return nil, err
	}
	segs, err := f.Segments()
	if err != nil {
		return nil, err
	}
	streams, err := pcapread.Reassemble(segs)
	if err != nil {
		return nil, err
	}
	return &siwCapture{Name: filepath.Base(name), File: f, Segs: segs, Streams: streams}, nil
}

// initiator reports whether s is the direction of the connection's
// initiator (its first segment is a SYN without ACK).
func initiator(c *siwCapture, s *pcapread.Stream) bool {
	for _, sg := range c.Segs {
		if sg.Flow == s.Flow && sg.Frame >= s.FirstFrame {
			return sg.Flags&(pcapread.SYN|pcapread.ACK) == pcapread.SYN
		}
	}
	return false
}

// sameConn reports whether two flows are directions of one connection.
func sameConn(a, b pcapread.Flow) bool { return a == b || a == b.Reverse() }

// ---- the test ----

// readReq is a Read Request seen on the wire, in the order sent.
type readReq struct {
	frame int // frame that completed the request
	f     iwarp.ReadRequestFields
	got   uint32 // response bytes seen so far
}

func TestSiwCaptureVectors(t *testing.T) {
	caps := siwCaptures(t)
	an := parseAnalysis(t, filepath.Join(siwPcapDir, "ANALYSIS.txt"))

	var totCaps, totStreams, totFPDUs, totCRC, totReadReq, totReadResp int
	for _, c := range caps {
		t.Run(strings.TrimSuffix(c.Name, ".pcap"), func(t *testing.T) {
			a := an[c.Name]
			if a == nil {
				t.Fatalf("%s has no section in ANALYSIS.txt", c.Name)
			}
			if c.File.LinkType != pcapread.LinkTypeEthernet {
				t.Fatalf("link type %d, want Ethernet", c.File.LinkType)
			}
			family := strings.SplitN(c.Name, "-", 3)
			lo, crcFam, p2p := family[0] == "lo", family[1] == "crc", family[1] == "p2p"
			tool := strings.TrimSuffix(family[2], ".pcap")

			// Frame-level cross-checks against tshark.
			if len(c.File.Packets) != a.Frames {
				t.Errorf("%d frames, ANALYSIS.txt says %d", len(c.File.Packets), a.Frames)
			}
			maxFrame := 0
			for _, p := range c.File.Packets {
				maxFrame = max(maxFrame, len(p.Data))
				if p.OrigLen != len(p.Data) {
					t.Errorf("frame %d truncated by the capture (%d of %d bytes)", p.Index, len(p.Data), p.OrigLen)
				}
				if lo && !bytes.Equal(p.Data[:12], make([]byte, 12)) {
					t.Errorf("frame %d: lo capture with non-zero MACs % x", p.Index, p.Data[:12])
				}
			}
			if maxFrame != a.MaxFrame {
				t.Errorf("largest frame %d bytes, ANALYSIS.txt says %d", maxFrame, a.MaxFrame)
			}
			if len(c.Segs) != len(c.File.Packets) {
				t.Errorf("%d of %d frames are TCP/IP; the captures hold only TCP", len(c.Segs), len(c.File.Packets))
			}
			sizes := map[int]int{}
			for _, sg := range c.Segs {
				if len(sg.Payload) > 0 {
					sizes[len(sg.Payload)]++
				}
			}
			for size, n := range a.PayloadSizes {
				if sizes[size] != n {
					t.Errorf("%d TCP segments with %d payload bytes, ANALYSIS.txt says %d", sizes[size], size, n)
				}
			}

			// MPA lines by flow.
			mpaByFlow := map[string]analysisMPA{}
			for _, m := range a.MPA {
				mpaByFlow[m.Flow] = m
			}

			segCount := map[segKey]int{}
			endFrames := map[int]bool{} // frames in which an FPDU completes
			var fpdus, crcs int
			var reqs = map[pcapread.Flow][]*readReq{} // by the flow that sent them
			type resp struct {
				flow  pcapread.Flow
				frame int
				h     iwarp.DDPHeader
			}
			var resps []resp
			streams := 0
			for _, s := range c.Streams {
				if !s.SawSYN {
					t.Errorf("%v: capture misses the SYN", s.Flow)
				}
				if len(s.Data) == 0 {
					t.Errorf("%v: empty stream", s.Flow)
					continue
				}
				streams++
				init := initiator(c, s)

				// The MPA Request or Reply.
				mf := iwarp.MPAFrame(s.Data)
				n, err := mf.Validate()
				if err != nil {
					t.Fatalf("%v: MPA frame: %v", s.Flow, err)
				}
				mf = mf[:n:n]
				if init != mf.IsRequest() || init == mf.IsReply() {
					t.Errorf("%v: initiator=%v but key %q", s.Flow, init, mf.Key())
				}
				v2, ok := mf.IRDORD()
				if !ok {
					t.Fatalf("%v: no IRD/ORD word (flags %#02x rev %d)", s.Flow, mf.Flags(), mf.Revision())
				}
				if mf.Revision() != 2 || mf.Flags()&^iwarp.MPAFlagCRC != iwarp.MPAFlagEnhanced || !mf.Enhanced() ||
					mf.Markers() || mf.Reject() || mf.CRC() != crcFam || mf.PDLength() != 4 || len(mf.ULPPrivateData()) != 0 {
					t.Errorf("%v: MPA rev %d flags %#02x (M=%v C=%v R=%v enhanced=%v) pd_len %d ULP pd %d bytes; README: rev 2, flags 0x10|C (C=%v), pd_len 4",
						s.Flow, mf.Revision(), mf.Flags(), mf.Markers(), mf.CRC(), mf.Reject(), mf.Enhanced(), mf.PDLength(), len(mf.ULPPrivateData()), crcFam)
				}
				// The README's IRD/ORD values.
				raw := hex.EncodeToString(mf.PrivateData())
				var want string
				switch {
				case p2p && tool == "rping" && init:
					want = "8001c001"
				case p2p && tool == "rping":
					want = "80018001"
				case p2p && init:
					want = "8000c001"
				case p2p:
					want = "80018000"
				case tool == "rping":
					want = "00010001"
				case tool == "ib_read_bw" && !sameConn(s.Flow, c.Streams[0].Flow):
					want = "00800080" // the test connection: 128/128
				default:
					want = "00000000"
				}
				if raw != want {
					t.Errorf("%v: IRD/ORD word %s, README says %s", s.Flow, raw, want)
				}
				if p2p {
					wantRTR := iwarp.RTRWrite
					if init {
						wantRTR = iwarp.RTRWrite | iwarp.RTRRead
					}
					if !v2.PeerToPeer || v2.RTR != wantRTR {
						t.Errorf("%v: P2P=%v RTR=%v, want P2P RTR=%v", s.Flow, v2.PeerToPeer, v2.RTR, wantRTR)
					}
				} else if v2.PeerToPeer || v2.RTR != 0 {
					t.Errorf("%v: stock siw set P2P=%v RTR=%v", s.Flow, v2.PeerToPeer, v2.RTR)
				}
				// Round trip through the encoder.
				fl := iwarp.MPAFrameFields{
					Reply: mf.IsReply(), Markers: mf.Markers(), CRC: mf.CRC(), Reject: mf.Reject(),
					Revision: mf.Revision(), V2: &v2, PrivateData: mf.ULPPrivateData(),
				}
				enc := make([]byte, fl.Len())
				if err := iwarp.MPAFrame(enc).Encode(&fl); err != nil || !bytes.Equal(enc, mf) {
					t.Errorf("%v: re-encoded MPA frame % x (err %v), captured % x", s.Flow, enc, err, []byte(mf))
				}
				// Against tshark.
				am, ok := mpaByFlow[s.Flow.String()]
				if !ok {
					t.Errorf("%v: no MPA line in ANALYSIS.txt", s.Flow)
				} else {
					flags := am.M<<7 | am.C<<6 | am.R<<5 | am.Res
					if am.Request != mf.IsRequest() || int(mf.Flags()) != flags || int(mf.Revision()) != am.Rev ||
						int(mf.PDLength()) != am.PDLen || raw != am.PD || s.FrameOf(0) != am.Frame {
						t.Errorf("%v: MPA frame %d req=%v flags %#02x rev %d pd_len %d pd %s; ANALYSIS.txt: frame %d %+v",
							s.Flow, s.FrameOf(0), mf.IsRequest(), mf.Flags(), mf.Revision(), mf.PDLength(), raw, am.Frame, am)
					}
					if !am.HasIRDORDColumns || int(v2.IRD) != am.IRD || int(v2.ORD) != am.ORD || b2i(v2.PeerToPeer) != am.P2P ||
						b2i(v2.RTR&iwarp.RTRSend != 0) != am.SendRTR || b2i(v2.RTR&iwarp.RTRWrite != 0) != am.WrRTR ||
						b2i(v2.RTR&iwarp.RTRRead != 0) != am.ReadRTR {
						t.Errorf("%v: IRD/ORD %+v; ANALYSIS.txt: %+v", s.Flow, v2, am)
					}
				}

				// The FPDUs.
				mode := crcZero
				if crcFam {
					mode = crcCheck
				}
				recs, err := parseFPDUs(s.Data[n:], mode)
				if err != nil {
					t.Errorf("%v: after %d FPDUs: %v", s.Flow, len(recs), err)
				}
				for i, r := range recs {
					h := r.Hdr
					segCount[segKey{h.Opcode(), h.Tagged(), h.Last()}]++
					fpdus++
					if crcFam {
						crcs++
					}
					off := n + r.Off
					endFrames[s.FrameOf(off+len(r.FPDU)-1)] = true
					switch h.Opcode() {
					case iwarp.OpReadRequest:
						rr := iwarp.ReadRequest(h.Payload())
						reqs[s.Flow] = append(reqs[s.Flow], &readReq{frame: s.FrameOf(off + len(r.FPDU) - 1), f: rr.Fields()})
					case iwarp.OpReadResponse:
						resps = append(resps, resp{s.Flow, s.FrameOf(off), h})
					case iwarp.OpTerminate:
						t.Errorf("%v: unexpected Terminate (README: teardown is a TCP FIN)", s.Flow)
					}
					// P2P: siw's RTR is a zero-length tagged Write, STag 1, TO 0.
					if p2p && init && i == 0 {
						if h.Opcode() != iwarp.OpWrite || !h.Last() || len(h.Payload()) != 0 || h.STag() != 1 || h.TO() != 0 {
							t.Errorf("%v: first FPDU %v L=%v len %d STag %#x TO %d, want a zero-length Write RTR, STag 1, TO 0",
								s.Flow, h.Opcode(), h.Last(), len(h.Payload()), h.STag(), h.TO())
						}
					}
				}
			}

			// Read Responses answer the Read Requests of the other
			// direction in order: same STag as the request's sink, TO
			// running from the sink TO, exactly Size bytes.
			wantSize := map[string]uint32{"rping": 64, "ib_read_bw": 4096}[tool]
			for flow, rs := range reqs {
				for _, r := range rs {
					if r.f.Size != wantSize {
						t.Errorf("%v: Read Request size %d, want %d for %s", flow, r.f.Size, wantSize, tool)
					}
				}
			}
			sort.SliceStable(resps, func(i, j int) bool { return resps[i].frame < resps[j].frame })
			for _, r := range resps {
				q := reqs[r.flow.Reverse()]
				if len(q) == 0 {
					t.Errorf("%v frame %d: Read Response STag %#x with no outstanding Read Request", r.flow, r.frame, r.h.STag())
					continue
				}
				rq := q[0]
				if rq.frame >= r.frame {
					t.Errorf("%v frame %d: Read Response before its Read Request (frame %d)", r.flow, r.frame, rq.frame)
				}
				if r.h.STag() != rq.f.SinkSTag || r.h.TO() != rq.f.SinkTO+uint64(rq.got) {
					t.Errorf("%v frame %d: Read Response STag %#x TO %#x, Read Request sink STag %#x TO %#x (+%d)",
						r.flow, r.frame, r.h.STag(), r.h.TO(), rq.f.SinkSTag, rq.f.SinkTO, rq.got)
				}
				rq.got += uint32(len(r.h.Payload()))
				if r.h.Last() {
					if rq.got != rq.f.Size {
						t.Errorf("%v frame %d: Read Response of %d bytes for a %d-byte Read Request", r.flow, r.frame, rq.got, rq.f.Size)
					}
					reqs[r.flow.Reverse()] = q[1:]
					totReadResp++
				}
			}
			for flow, q := range reqs {
				if len(q) != 0 {
					t.Errorf("%v: %d Read Requests never answered", flow, len(q))
				}
			}
			totReadReq += segCount[segKey{iwarp.OpReadRequest, false, true}]

			// Segment counts against tshark.
			keys := map[segKey]bool{}
			for k := range segCount {
				keys[k] = true
			}
			for k := range a.Segments {
				keys[k] = true
			}
			for k := range keys {
				if segCount[k] != a.Segments[k] {
					t.Errorf("DDP segments %v: decoded %d, ANALYSIS.txt %d", k, segCount[k], a.Segments[k])
				}
			}
			// tshark's "Good CRC32" count is per FPDU; its zero-CRC count
			// is per frame (a display filter), i.e. the frames in which
			// at least one FPDU completes.
			if crcFam {
				if fpdus != a.CRCGood || a.CRCBad != 0 || a.CRCZero != 0 {
					t.Errorf("%d FPDUs with good CRC32c, ANALYSIS.txt: %d good, %d bad, %d with a zero CRC field", fpdus, a.CRCGood, a.CRCBad, a.CRCZero)
				}
			} else if len(endFrames) != a.CRCZero || a.CRCGood != 0 || a.CRCBad != 0 {
				t.Errorf("%d FPDUs with zero CRC ending in %d frames, ANALYSIS.txt: %d frames with a zero CRC field, %d good, %d bad",
					fpdus, len(endFrames), a.CRCZero, a.CRCGood, a.CRCBad)
			}
			wantStreams := 4
			if tool == "rping" {
				wantStreams = 2
			}
			if streams != wantStreams || len(a.MPA) != streams {
				t.Errorf("%d stream directions, %d MPA frames in ANALYSIS.txt, want %d", streams, len(a.MPA), wantStreams)
			}
			t.Logf("%d streams, %d FPDUs, %d CRCs verified, segments %v", streams, fpdus, crcs, segCount)
			totCaps++
			totStreams += streams
			totFPDUs += fpdus
			totCRC += crcs
		})
	}
	t.Logf("%d captures, %d stream directions, %d FPDUs decoded, %d CRC32c verified, %d Read Requests, %d Read Responses matched",
		totCaps, totStreams, totFPDUs, totCRC, totReadReq, totReadResp)
}

// TestParseFPDUsRejects checks that the stream parser the capture test
// relies on notices broken streams.
func TestParseFPDUsRejects(t *testing.T) {
	seg := func(f iwarp.DDPFields, payload int) []byte {
		b := make([]byte, iwarp.DDPUntaggedHeaderSize+payload)
		n := iwarp.DDPHeader(b).Encode(&f)
		return b[:n+payload]
	}
	fpdu := func(ulpdu []byte, crc bool) []byte {
		b := make([]byte, iwarp.FPDULen(len(ulpdu)))
		b[0], b[1] = byte(len(ulpdu)>>8), byte(len(ulpdu))
		copy(b[2:], ulpdu)
		if crc {
			c := crc32.Checksum(b[:len(b)-4], castagnoli)
			binary.LittleEndian.PutUint32(b[len(b)-4:], c)
		}
		return b
	}
	send := seg(iwarp.DDPFields{Opcode: iwarp.OpSend, Last: true, QN: 0, MSN: 1}, 5)
	write := seg(iwarp.DDPFields{Opcode: iwarp.OpWrite, Last: true, STag: 7, TO: 9}, 3)
	good := append(fpdu(send, true), fpdu(write, true)...)
	if recs, err := parseFPDUs(good, crcCheck); err != nil || len(recs) != 2 {
		t.Fatalf("good stream: %d FPDUs, %v", len(recs), err)
	}
	if _, err := parseFPDUs(good, crcZero); err == nil {
		t.Error("non-zero CRC accepted in crcZero mode")
	}
	if _, err := parseFPDUs(good[:len(good)-1], crcCheck); !errors.Is(err, errFPDUTruncated) {
		t.Errorf("truncated stream: %v", err)
	}
	bad := bytes.Clone(good)
	bad[5] ^= 1
	if _, err := parseFPDUs(bad, crcCheck); err == nil {
		t.Error("corrupted FPDU passed the CRC check")
	}
	for name, u := range map[string][]byte{
		"bad QN":        seg(iwarp.DDPFields{Opcode: iwarp.OpSend, QN: 3}, 0),
		"send on QN1":   seg(iwarp.DDPFields{Opcode: iwarp.OpSend, QN: 1}, 0),
		"short header":  send[:10],
		"short readreq": seg(iwarp.DDPFields{Opcode: iwarp.OpReadRequest, Last: true, QN: 1}, 20),
		"opcode 0xc":    append([]byte{0x41, 0x4c}, send[2:]...),
		"DDP v0":        append([]byte{0x40, 0x43}, send[2:]...),
		"RDMAP v2":      append([]byte{0x41, 0x83}, send[2:]...),
		"T on Send":     append([]byte{0xc1, 0x43}, send[2:]...),
	} {
		if recs, err := parseFPDUs(fpdu(u, false), crcZero); err == nil {
			t.Errorf("%s: accepted (%d FPDUs)", name, len(recs))
		}
	}
}
