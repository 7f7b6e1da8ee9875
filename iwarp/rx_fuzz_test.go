package iwarp

import (
	"bytes"
	"context"
	"io"
	"reflect"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// nullStream is a Stream whose reads block until the QP ends and whose
// writes are discarded: the fuzzer drives the receiver directly.
type nullStream struct{ closed chan struct{} }

func (s *nullStream) ReadTo(ctx context.Context, w io.Writer, max int) (int, error) {
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-s.closed:
		return 0, io.EOF
	}
}
func (s *nullStream) TryReadTo(w io.Writer, max int) (int, error) { return 0, nil }
func (s *nullStream) WaitReadable(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-s.closed:
		return io.EOF
	}
}
func (s *nullStream) ReadFull(ctx context.Context, p []byte) error { return io.EOF }
func (s *nullStream) Write(ctx context.Context, p []byte) (int, error) {
	return len(p), nil
}
func (s *nullStream) WritePayload(ctx context.Context, pl tcpip.Payloader) (int64, error) {
	n, err := io.Copy(io.Discard, io.LimitReader(pl, int64(pl.Len())))
	return n, err
}
func (s *nullStream) MaxPayload() int   { return 1420 }
func (s *nullStream) CloseWrite() error { return nil }
func (s *nullStream) Abort()            {}
func (s *nullStream) Close() error      { return nil }

// fuzzMem registers the fuzzers' region, guard[4096:8192] at 0x10000, and
// gives it a fixed key instead of its random one, so that seeds (and the
// fuzzer) can name it: its STag is fuzzSTag.
func fuzzMem(guard []byte) (*MemTable, *Region) {
	mem := NewMemTable()
	reg := &Region{Buf: guard[4096:8192], Base: 0x10000, Access: AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic, PD: 1}
	mem.Register(reg)
	reg.stag = reg.stag&^0xff | 0x5c
	return mem, reg
}

var fuzzSTag = func() uint32 {
	_, reg := fuzzMem(make([]byte, 3*4096))
	return reg.STag()
}()

// FuzzReceiver feeds arbitrary stream bytes to a QP's receive path: it
// must never panic and never write outside the registered region.
func FuzzReceiver(f *testing.F) {
	seeds := [][]byte{
		rawFPDU(rawULPDU(DDPFields{Opcode: OpSend, Last: true, QN: QNSend, MSN: 1}, []byte("hello")), false),
		rawFPDU(rawULPDU(DDPFields{Opcode: OpWrite, Last: true, STag: fuzzSTag, TO: 0x10000}, make([]byte, 40)), false),
		rawFPDU(rawULPDU(DDPFields{Opcode: OpWrite, Last: true, STag: fuzzSTag, TO: 0x10ff0}, make([]byte, 40)), false),
		rawFPDU(rawULPDU(DDPFields{Opcode: OpReadRequest, Last: true, QN: QNReadReq, MSN: 1}, make([]byte, ReadRequestSize)), false),
		rawFPDU(rawULPDU(DDPFields{Opcode: OpTerminate, Last: true, QN: QNTerminate, MSN: 1}, []byte{0x20, 2, 0, 0}), false),
		{0, 0, 0, 0},
		{0xff, 0xff, 0x41, 0x43},
	}
	seeds = append(seeds, extensionStream(false))
	for _, b := range extensionFPDUs(false) {
		seeds = append(seeds, b)
	}
	for _, s := range seeds {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, data []byte, crc bool) {
		guard := make([]byte, 3*4096)
		mem, reg := fuzzMem(guard)
		rq, _ := NewRecvQueue(4, 2)
		for i := 0; i < 4; i++ {
			rq.Post(uint64(i), []SGE{{Addr: reg.Base + uint64(i*1024), Length: 1024, LKey: reg.STag()}})
		}
		qp, err := NewQP(QPConfig{Num: 1, PD: 1, Mem: mem, SendCQ: newTestCQ(), RecvCQ: newTestCQ(), RQ: rq})
		if err != nil {
			t.Fatal(err)
		}
		s := &nullStream{closed: make(chan struct{})}
		if err := qp.Start(s, ConnParams{CRC: crc, IRD: 2, ORD: 2}); err != nil {
			t.Fatal(err)
		}
		// Feed in a few uneven pieces, as packet views arrive.
		for len(data) > 0 {
			k := min(len(data), 1+int(data[0])%97)
			if n, err := fuzzWrite(qp, data[:k]); n != k || err != nil {
				t.Fatalf("Write took %d of %d: %v", n, k, err)
			}
			data = data[k:]
		}
		close(s.closed)
		qp.Close()
		for i, c := range guard[:4096] {
			if c != 0 {
				t.Fatalf("byte %d before the region written", i)
			}
		}
		for i, c := range guard[8192:] {
			if c != 0 {
				t.Fatalf("byte %d after the region written", i)
			}
		}
	})
}

// rxOutcome is what a receiver made of a stream: the registered memory
// (with guard pages), the Terminate it raised, its counters and every
// completion, flushes included.
type rxOutcome struct {
	mem   []byte
	term  *TerminateFields
	n     rxCounts
	state int
	comps []Completion
	seg   *SegmentStats // segment placement's (feedSegments)
}

// feedReceiver runs data through a fresh QP's receive path in pieces of
// at most piece bytes (0: in one piece), as FuzzReceiver does.
func feedReceiver(t *testing.T, data []byte, crc bool, piece int) rxOutcome {
	guard := make([]byte, 3*4096)
	mem, reg := fuzzMem(guard)
	rq, _ := NewRecvQueue(4, 2)
	for i := 0; i < 4; i++ {
		rq.Post(uint64(i), []SGE{{Addr: reg.Base + uint64(i*1024), Length: 1024, LKey: reg.STag()}})
	}
	qp, s, rcq := startFuzzQP(t, mem, rq, crc)
	for p := data; len(p) > 0; {
		k := len(p)
		if piece > 0 {
			k = min(k, piece)
		}
		if n, err := fuzzWrite(qp, p[:k]); n != k || err != nil {
			t.Fatalf("Write took %d of %d: %v", n, k, err)
		}
		p = p[k:]
	}
	return finishFeed(qp, s, rcq, guard)
}

// startFuzzQP starts a QP of PD 1 on mem with receive queue rq over a
// nullStream, for the fuzzers to feed.
func startFuzzQP(t *testing.T, mem *MemTable, rq *RecvQueue, crc bool) (*QP, *nullStream, *testCQ) {
	return startFuzzQPWith(t, mem, rq, ConnParams{CRC: crc, IRD: 2, ORD: 2})
}

// startFuzzQPWith is startFuzzQP with the given connection parameters.
func startFuzzQPWith(t *testing.T, mem *MemTable, rq *RecvQueue, p ConnParams) (*QP, *nullStream, *testCQ) {
	rcq := newTestCQ()
	qp, err := NewQP(QPConfig{Num: 1, PD: 1, Mem: mem, SendCQ: newTestCQ(), RecvCQ: rcq, RQ: rq})
	if err != nil {
		t.Fatal(err)
	}
	s := &nullStream{closed: make(chan struct{})}
	if err := qp.Start(s, p); err != nil {
		t.Fatal(err)
	}
	return qp, s, rcq
}

// FuzzReceiverSplits: a stream handed over in one piece (whole FPDUs take
// the receiver's one-pass path) and byte by byte (every FPDU gathered
// piece by piece) must come out the same: memory, Terminate, counters
// (but the number of placement copies), completions.
func FuzzReceiverSplits(f *testing.F) {
	var stream []byte
	stream = append(stream, rawFPDU(rawULPDU(DDPFields{Opcode: OpWrite, Last: true, STag: fuzzSTag, TO: 0x10010}, bytes.Repeat([]byte{7}, 301)), false)...)
	stream = append(stream, rawFPDU(rawULPDU(DDPFields{Opcode: OpSend, Last: false, QN: QNSend, MSN: 1}, []byte("hello ")), false)...)
	stream = append(stream, rawFPDU(rawULPDU(DDPFields{Opcode: OpSend, Last: true, QN: QNSend, MSN: 1, MO: 6}, []byte("world")), false)...)
	f.Add(stream, false)
	var crcStream []byte
	crcStream = append(crcStream, rawFPDU(rawULPDU(DDPFields{Opcode: OpWrite, Last: true, STag: fuzzSTag, TO: 0x10100}, bytes.Repeat([]byte{9}, 333)), true)...)
	crcStream = append(crcStream, rawFPDU(rawULPDU(DDPFields{Opcode: OpSend, Last: true, QN: QNSend, MSN: 1}, []byte("crc")), true)...)
	f.Add(crcStream, true)
	bad := append([]byte(nil), stream...)
	bad[len(bad)-1] ^= 1
	f.Add(bad, true)
	f.Add(rawFPDU(rawULPDU(DDPFields{Opcode: OpWrite, Last: true, STag: 0x999, TO: 0x10000}, make([]byte, 40)), false), false)
	f.Add(rawFPDU(rawULPDU(DDPFields{Opcode: OpReadRequest, Last: true, QN: QNReadReq, MSN: 1}, make([]byte, ReadRequestSize)), false), false)
	f.Add(extensionStream(false), false)
	f.Add(extensionStream(true), true)
	f.Fuzz(func(t *testing.T, data []byte, crc bool) {
		if len(data) > 1<<14 {
			return
		}
		a, b := feedReceiver(t, data, crc, 0), feedReceiver(t, data, crc, 1)
		if !bytes.Equal(a.mem, b.mem) {
			t.Fatal("memory differs")
		}
		if !reflect.DeepEqual(a.term, b.term) {
			t.Fatalf("terminate: %+v in one piece, %+v byte by byte", a.term, b.term)
		}
		// Placement copies count the pieces placed, which the split
		// decides; everything else must agree.
		a.n.copies, b.n.copies = 0, 0
		if a.n != b.n || a.state != b.state {
			t.Fatalf("counters/state: %+v/%d in one piece, %+v/%d byte by byte", a.n, a.state, b.n, b.state)
		}
		if !reflect.DeepEqual(a.comps, b.comps) {
			t.Fatalf("completions: %+v in one piece, %+v byte by byte", a.comps, b.comps)
		}
	})
}

// extensionFPDUs are RFC 7306 messages aimed at the fuzzers' region: a
// FetchAdd and a CmpSwap (queue 1, after nothing else), an Atomic
// Response nobody asked for, an Immediate Data, and a Send with Immediate.
func extensionFPDUs(crc bool) [][]byte {
	ar := func(msn uint32, f AtomicRequestFields) []byte {
		b := make([]byte, AtomicRequestSize)
		AtomicRequest(b).Encode(&f)
		return rawFPDU(rawULPDU(DDPFields{Opcode: OpAtomicRequest, Last: true, QN: QNReadReq, MSN: msn}, b), crc)
	}
	imm := func(op Opcode, msn uint32, v uint64) []byte {
		b := make([]byte, ImmediateDataSize)
		ImmediateData(b).Encode(v)
		return rawFPDU(rawULPDU(DDPFields{Opcode: op, Last: true, QN: QNSend, MSN: msn}, b), crc)
	}
	rsp := make([]byte, AtomicResponseSize)
	AtomicResponse(rsp).Encode(1, 2)
	return [][]byte{
		ar(1, AtomicRequestFields{Op: AtomicFetchAdd, RemoteSTag: fuzzSTag, RemoteTO: 0x10008, AddSwapData: 3}),
		ar(2, AtomicRequestFields{Op: AtomicCmpSwap, RemoteSTag: fuzzSTag, RemoteTO: 0x10008, AddSwapData: 9, AddSwapMask: ^uint64(0), CompareData: 3, CompareMask: ^uint64(0)}),
		imm(OpImmediateSE, 1, 0xabc),
		imm(OpImmediate, 2, ImmFlagForSend|5),
		rawFPDU(rawULPDU(DDPFields{Opcode: OpSend, Last: true, QN: QNSend, MSN: 3}, []byte("imm")), crc),
		rawFPDU(rawULPDU(DDPFields{Opcode: OpAtomicResp, Last: true, QN: QNAtomicResp, MSN: 1}, rsp), crc),
	}
}

// extensionStream is extensionFPDUs back to back.
func extensionStream(crc bool) []byte {
	var s []byte
	for _, b := range extensionFPDUs(crc) {
		s = append(s, b...)
	}
	return s
}

// fuzzWrite feeds the receiver with rxMu held, as the receive paths do (a
// Terminate's flush marks the receiver dead under it).
func fuzzWrite(qp *QP, b []byte) (int, error) {
	qp.rxMu.Lock()
	defer qp.rxMu.Unlock()
	return qp.rx.Write(b)
}
