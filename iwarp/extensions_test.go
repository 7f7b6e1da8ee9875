package iwarp

import (
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rdmatap/rdmatap/zerocopy"
)

// readFPDU reads the next FPDU from the raw peer's side and returns its
// ULPDU (checking the CRC when it is on).
func readFPDU(t *testing.T, s *connStream, crc bool) DDPHeader {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var l [2]byte
	if err := s.ReadFull(ctx, l[:]); err != nil {
		t.Fatalf("reading an FPDU: %v", err)
	}
	n := int(binary.BigEndian.Uint16(l[:]))
	rest := make([]byte, FPDULen(n)-MPALengthSize)
	if err := s.ReadFull(ctx, rest); err != nil {
		t.Fatalf("reading an FPDU: %v", err)
	}
	if crc {
		full := append(l[:], rest...)
		k := len(full) - MPACRCSize
		if got, want := binary.LittleEndian.Uint32(full[k:]), zerocopy.CRC32C(full[:k]); got != want {
			t.Fatalf("FPDU CRC %#x, want %#x", got, want)
		}
	}
	h := DDPHeader(rest[:n])
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}
	return h
}

// noFPDU checks that the raw peer receives nothing for d.
func noFPDU(t *testing.T, s *connStream, d time.Duration) {
	t.Helper()
	s.c.SetReadDeadline(time.Now().Add(d))
	var b [1]byte
	n, err := s.c.Read(b[:])
	s.c.SetReadDeadline(time.Time{})
	if n > 0 || err == nil {
		t.Fatal("an FPDU arrived that should have waited")
	}
}

// TestAtomicResponderWire plays the requester on the wire: Atomic Requests
// on queue 1 (after a Read Request on the same queue) are executed on the
// host's word, and their Atomic Responses come back on queue 3, in order
// behind the Read Response, with the request identifiers echoed and the
// original values in network byte order.
func TestAtomicResponderWire(t *testing.T) {
	for _, crc := range []bool{false, true} {
		v := newVictim(t, crc, 0, 8)
		word := (*uint64)(unsafe.Pointer(&v.atReg.Buf[64]))
		atomic.StoreUint64(word, 1000)
		to := v.atReg.Base + 64
		all := ^uint64(0)
		copy(v.reg.Buf, "read me")
		v.send(t,
			v.readReq(ReadRequestFields{SinkSTag: 0x4242, SinkTO: 0x99, Size: 7, SourceSTag: v.reg.STag(), SourceTO: v.reg.Base}),
			v.atomicReq(2, AtomicRequestFields{Op: AtomicFetchAdd, RequestID: 0xa1, RemoteSTag: v.atReg.STag(), RemoteTO: to, AddSwapData: 5}),
			v.atomicReq(3, AtomicRequestFields{Op: AtomicCmpSwap, RequestID: 0xa2, RemoteSTag: v.atReg.STag(), RemoteTO: to,
				AddSwapData: 77, AddSwapMask: all, CompareData: 1005, CompareMask: all}),
			v.atomicReq(4, AtomicRequestFields{Op: AtomicCmpSwap, RequestID: 0xa3, RemoteSTag: v.atReg.STag(), RemoteTO: to,
				AddSwapData: 88, AddSwapMask: all, CompareData: 1005, CompareMask: all}),
			// Masked: compare only the low byte (77 = 0x4d), replace the high byte.
			v.atomicReq(5, AtomicRequestFields{Op: AtomicCmpSwap, RequestID: 0xa4, RemoteSTag: v.atReg.STag(), RemoteTO: to,
				AddSwapData: 0xab << 56, AddSwapMask: 0xff << 56, CompareData: 0xffff_ff4d, CompareMask: 0xff}),
			v.atomicReq(6, AtomicRequestFields{Op: AtomicSwap, RequestID: 0xa5, RemoteSTag: v.atReg.STag(), RemoteTO: to,
				AddSwapData: 0x1122334455667788, AddSwapMask: all}),
			// Two 32-bit fields: the carry out of the low one is dropped.
			v.atomicReq(7, AtomicRequestFields{Op: AtomicFetchAdd, RequestID: 0xa6, RemoteSTag: v.atReg.STag(), RemoteTO: to,
				AddSwapData: 0x00000001_ffffffff, AddSwapMask: 1 << 31}),
		)
		h := readFPDU(t, v.peer, v.peerCRC)
		if !h.Tagged() || h.Opcode() != OpReadResponse || h.STag() != 0x4242 || string(h.Payload()) != "read me" {
			t.Fatalf("first response: %v", h.Opcode())
		}
		want := []struct {
			id   uint32
			orig uint64
		}{{0xa1, 1000}, {0xa2, 1005}, {0xa3, 77}, {0xa4, 77}, {0xa5, 0xab<<56 | 77}, {0xa6, 0x1122334455667788}}
		for i, w := range want {
			h := readFPDU(t, v.peer, v.peerCRC)
			if h.Tagged() || h.Opcode() != OpAtomicResp || h.QN() != QNAtomicResp || h.MSN() != uint32(i+1) || h.MO() != 0 || !h.Last() {
				t.Fatalf("response %d: %v QN %d MSN %d MO %d L %v", i, h.Opcode(), h.QN(), h.MSN(), h.MO(), h.Last())
			}
			if len(h.Payload()) != AtomicResponseSize {
				t.Fatalf("response %d: %d bytes", i, len(h.Payload()))
			}
			r := AtomicResponse(h.Payload())
			if r.RequestID() != w.id || r.OriginalValue() != w.orig {
				t.Fatalf("response %d: id %#x original %#x, want %#x %#x", i, r.RequestID(), r.OriginalValue(), w.id, w.orig)
			}
			// Network byte order on the wire.
			if binary.BigEndian.Uint64(h.Payload()[4:]) != w.orig {
				t.Fatalf("response %d: original value not big-endian on the wire", i)
			}
		}
		if got, want := atomic.LoadUint64(word), uint64(0x11223345_55667787); got != want {
			t.Fatalf("target %#x, want %#x", got, want)
		}
		// The word is the host's uint64: its bytes are in host order.
		if binary.NativeEndian.Uint64(v.atReg.Buf[64:]) != 0x11223345_55667787 {
			t.Fatal("target not in host byte order")
		}
		v.qp.Close()
	}
}

func TestMaskedAdd(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 10000; i++ {
		a, b := r.Uint64(), r.Uint64()
		if got := maskedAdd(a, b, 0); got != a+b {
			t.Fatalf("%#x + %#x = %#x", a, b, got)
		}
		// Fields of 8 bits: each byte adds on its own.
		const m = 0x8080808080808080
		got := maskedAdd(a, b, m)
		for k := 0; k < 64; k += 8 {
			if byte(got>>k) != byte(a>>k)+byte(b>>k) {
				t.Fatalf("byte %d of %#x + %#x fields: %#x", k/8, a, b, got)
			}
		}
		// A random mask: sum per field, fields ending at each 1 bit.
		mask := r.Uint64()
		got = maskedAdd(a, b, mask)
		lo := 0
		for hi := 0; hi < 64; hi++ {
			if mask>>hi&1 == 0 && hi != 63 {
				continue
			}
			w := hi - lo + 1
			f := uint64(1)<<w - 1
			if w == 64 {
				f = ^uint64(0)
			}
			if (got>>lo)&f != ((a>>lo)+(b>>lo))&f {
				t.Fatalf("field [%d,%d] of %#x + %#x mask %#x: %#x", lo, hi, a, b, mask, got)
			}
			lo = hi + 1
		}
	}
}

// TestORDBoundsReadsAndAtomics plays the responder on the wire: with ORD
// 2, a QP has at most two Reads and atomics outstanding, whatever the mix,
// and posts the next one only when a response arrives.
func TestORDBoundsReadsAndAtomics(t *testing.T) {
	v := newVictimORD(t, 2)
	// Open the victim's TX (it is the responder): a zero-length Write.
	v.send(t, v.fpdu(DDPFields{Opcode: OpWrite, Last: true, STag: 1}, nil))
	sink := v.atReg.Buf
	ops := []WROp{WRRead, WRAtomicFetchAdd, WRAtomicCmpSwap, WRRead, WRAtomicFetchAdd, WRRead}
	for i, op := range ops {
		wr := SendWR{ID: uint64(i), Op: op, Flags: FlagSignaled, RemoteAddr: 0x5000 + uint64(8*i), RKey: 0x777,
			SGL: []SGE{{Addr: v.atReg.Base + uint64(8*i), Length: 8, LKey: v.atReg.STag()}}, CompareAdd: uint64(i), Swap: 9}
		if _, err := v.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
	}
	respond := func(h DDPHeader, i int) {
		if h.Tagged() || h.QN() != QNReadReq {
			t.Fatalf("request %d: %v on QN %d", i, h.Opcode(), h.QN())
		}
		if h.MSN() != uint32(i+1) {
			t.Fatalf("request %d: MSN %d (Reads and atomics share queue 1's MSNs)", i, h.MSN())
		}
		switch ops[i] {
		case WRRead:
			rr := ReadRequest(h.Payload())
			if h.Opcode() != OpReadRequest || rr.Size() != 8 || rr.SourceTO() != 0x5000+uint64(8*i) {
				t.Fatalf("request %d: %v size %d", i, h.Opcode(), rr.Size())
			}
			data := make([]byte, 8)
			binary.BigEndian.PutUint64(data, 0xd00d+uint64(i))
			v.send(t, v.fpdu(DDPFields{Opcode: OpReadResponse, Last: true, STag: rr.SinkSTag(), TO: rr.SinkTO()}, data))
		default:
			ar := AtomicRequest(h.Payload())
			if h.Opcode() != OpAtomicRequest || ar.RemoteTO() != 0x5000+uint64(8*i) || ar.RemoteSTag() != 0x777 {
				t.Fatalf("request %d: %v", i, h.Opcode())
			}
			if ops[i] == WRAtomicFetchAdd && (ar.Op() != AtomicFetchAdd || ar.AddSwapData() != uint64(i) || ar.AddSwapMask() != 0) {
				t.Fatalf("request %d: %+v", i, ar.Fields())
			}
			if ops[i] == WRAtomicCmpSwap && (ar.Op() != AtomicCmpSwap || ar.CompareData() != uint64(i) || ar.AddSwapData() != 9 ||
				ar.CompareMask() != ^uint64(0) || ar.AddSwapMask() != ^uint64(0)) {
				t.Fatalf("request %d: %+v", i, ar.Fields())
			}
			rsp := make([]byte, AtomicResponseSize)
			AtomicResponse(rsp).Encode(ar.RequestID(), 0xa70+uint64(i))
			v.atomicMSN++
			v.send(t, v.fpdu(DDPFields{Opcode: OpAtomicResp, Last: true, QN: QNAtomicResp, MSN: v.atomicMSN}, rsp))
		}
	}
	// Two requests, then silence until a response frees a slot.
	reqs := []DDPHeader{readFPDU(t, v.peer, false), readFPDU(t, v.peer, false)}
	noFPDU(t, v.peer, 50*time.Millisecond)
	next := 2
	for i := 0; i < len(ops); i++ {
		respond(reqs[0], i)
		reqs = reqs[1:]
		c := v.scq.wait(t)
		if c.ID != uint64(i) || c.Status != StatusSuccess || c.Op != wrCompOp(ops[i]) || c.ByteLen != 8 {
			t.Fatalf("completion %d: %+v", i, c)
		}
		want := 0xd00d + uint64(i)
		got := binary.BigEndian.Uint64(sink[8*i:])
		if ops[i] != WRRead {
			want, got = 0xa70+uint64(i), binary.NativeEndian.Uint64(sink[8*i:])
		}
		if got != want {
			t.Fatalf("result %d: %#x, want %#x", i, got, want)
		}
		if next < len(ops) {
			reqs = append(reqs, readFPDU(t, v.peer, false))
			next++
			if len(reqs) == 2 {
				noFPDU(t, v.peer, 20*time.Millisecond)
			}
		}
	}
}

// newVictimORD is a victim whose ORD is ord (the raw peer grants that IRD).
func newVictimORD(t *testing.T, ord int) *victimORD {
	t.Helper()
	v := newVictimWith(t, false, 0, MPAConfig{IRD: 4, ORD: ord}, MPAConfig{IRD: ord, ORD: 4})
	return &victimORD{victim: v}
}

type victimORD struct {
	*victim
	atomicMSN uint32
}

// TestAtomicResponseChecks: an Atomic Response that answers a Read, or
// carries another request's identifier, ends the stream.
func TestAtomicResponseChecks(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first WROp
		id    func(got uint32) uint32
	}{
		{"answers-a-read", WRRead, func(got uint32) uint32 { return got }},
		{"wrong-request-id", WRAtomicFetchAdd, func(got uint32) uint32 { return got + 1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := newVictimORD(t, 2)
			v.send(t, v.fpdu(DDPFields{Opcode: OpWrite, Last: true, STag: 1}, nil))
			wr := SendWR{ID: 1, Op: tc.first, Flags: FlagSignaled, RemoteAddr: 0x5000, RKey: 0x777,
				SGL: []SGE{{Addr: v.atReg.Base, Length: 8, LKey: v.atReg.STag()}}}
			if _, err := v.qp.PostSend(wr); err != nil {
				t.Fatal(err)
			}
			h := readFPDU(t, v.peer, false)
			id := uint32(0)
			if h.Opcode() == OpAtomicRequest {
				id = AtomicRequest(h.Payload()).RequestID()
			}
			rsp := make([]byte, AtomicResponseSize)
			AtomicResponse(rsp).Encode(tc.id(id), 5)
			v.send(t, v.fpdu(DDPFields{Opcode: OpAtomicResp, Last: true, QN: QNAtomicResp, MSN: 1}, rsp))
			if got, want := readTerminate(t, v.peer, false), (TermCode{LayerRDMAP, ETypeRemoteOperation, CodeUnexpectedOpcode}); got != want {
				t.Fatalf("Terminate %v, want %v", got, want)
			}
			if c := v.scq.wait(t); c.ID != 1 || c.Status != StatusWRFlush || c.Op != wrCompOp(tc.first) {
				t.Fatalf("completion %+v", c)
			}
			if binary.NativeEndian.Uint64(v.atReg.Buf) != 0 {
				t.Fatal("a refused response was placed")
			}
		})
	}
}

// TestExtensionsOffRefusePosts: with the extensions off, atomics and
// immediate WRs are refused at post time.
func TestExtensionsOffRefusePosts(t *testing.T) {
	v := newVictimExt(t, false, 0, 1, true)
	for _, op := range []WROp{WRAtomicFetchAdd, WRAtomicCmpSwap, WRWriteImm, WRSendImm} {
		wr := SendWR{Op: op, SGL: []SGE{{Addr: v.atReg.Base, Length: 8, LKey: v.atReg.STag()}}}
		if _, err := v.qp.PostSend(wr); !errors.Is(err, ErrInvalidWR) {
			t.Fatalf("%v: %v", op, err)
		}
	}
}

// TestAtomicPostChecks: an atomic takes one 8-byte SGE and is never inline.
func TestAtomicPostChecks(t *testing.T) {
	v := newVictim(t, false, 0, 1)
	for _, sgl := range [][]SGE{nil, {{Length: 4}}, {{Length: 8}, {Length: 8}}, {{Length: 16}}} {
		if _, err := v.qp.PostSend(SendWR{Op: WRAtomicFetchAdd, SGL: sgl}); !errors.Is(err, ErrInvalidWR) {
			t.Fatalf("SGL %v: %v", sgl, err)
		}
	}
	if _, err := v.qp.PostSend(SendWR{Op: WRAtomicCmpSwap, Flags: FlagInline, SGL: []SGE{{Length: 8}}}); !errors.Is(err, ErrInvalidWR) {
		t.Fatalf("inline atomic: %v", err)
	}
}

// TestAtomicWithIRDZero: with IRD 0 granted, an Atomic Request, even as
// the stream's first FPDU (where a zero-length Read Request may be a Read
// RTR), exceeds it.
func TestAtomicWithIRDZero(t *testing.T) {
	v := newVictimWith(t, false, 2, MPAConfig{IRD: 0, ORD: 1}, MPAConfig{IRD: 1, ORD: 0})
	if p := v.qp.Params(); p.IRD != 0 {
		t.Fatalf("victim IRD %d", p.IRD)
	}
	v.send(t, v.atomicReq(1, AtomicRequestFields{Op: AtomicFetchAdd, RemoteSTag: v.atReg.STag(), RemoteTO: v.atReg.Base, AddSwapData: 1}))
	want := TermCode{LayerRDMAP, ETypeRemoteOperation, CodeCatastrophicStream}
	if got := readTerminate(t, v.peer, false); got != want {
		t.Fatalf("Terminate %v, want %v", got, want)
	}
	v.checkAftermath(t, want, []Status{StatusWRFlush, StatusWRFlush})
}
