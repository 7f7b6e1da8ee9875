package iwarp

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/zerocopy"
)

// rawFPDU frames a ULPDU (DDP header + payload) as an FPDU.
func rawFPDU(ulpdu []byte, crc bool) []byte {
	b := make([]byte, FPDULen(len(ulpdu)))
	binary.BigEndian.PutUint16(b, uint16(len(ulpdu)))
	copy(b[MPALengthSize:], ulpdu)
	if crc {
		n := len(b) - MPACRCSize
		binary.LittleEndian.PutUint32(b[n:], zerocopy.CRC32C(b[:n]))
	}
	return b
}

// rawULPDU builds a DDP segment.
func rawULPDU(f DDPFields, payload []byte) []byte {
	b := make([]byte, DDPUntaggedHeaderSize+len(payload))
	n := DDPHeader(b).Encode(&f)
	return append(b[:n], payload...)
}

// readTerminate reads FPDUs from the raw peer's side until a Terminate and
// returns its code.
func readTerminate(t *testing.T, s *connStream, crc bool) TermCode {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		var l [2]byte
		if err := s.ReadFull(ctx, l[:]); err != nil {
			t.Fatalf("reading the Terminate: %v", err)
		}
		n := int(binary.BigEndian.Uint16(l[:]))
		rest := make([]byte, FPDULen(n)-MPALengthSize)
		if err := s.ReadFull(ctx, rest); err != nil {
			t.Fatalf("reading the Terminate: %v", err)
		}
		full := append(l[:], rest...)
		if crc {
			k := len(full) - MPACRCSize
			if got, want := binary.LittleEndian.Uint32(full[k:]), zerocopy.CRC32C(full[:k]); got != want {
				t.Fatalf("FPDU CRC %#x, want %#x", got, want)
			}
		}
		h := DDPHeader(rest[:n])
		if err := h.Validate(); err != nil {
			t.Fatal(err)
		}
		if h.Tagged() || h.Opcode() != OpTerminate {
			continue // e.g. a Read Response that was already under way
		}
		if h.QN() != QNTerminate || h.MSN() != 1 || h.MO() != 0 || !h.Last() {
			t.Fatalf("Terminate with QN %d MSN %d MO %d L %v", h.QN(), h.MSN(), h.MO(), h.Last())
		}
		term := Terminate(h.Payload())
		if err := term.Validate(); err != nil {
			t.Fatal(err)
		}
		// After the Terminate the stream is closed.
		var one [1]byte
		if _, err := s.c.Read(one[:]); !errors.Is(err, io.EOF) && err == nil {
			t.Fatal("bytes after the Terminate")
		}
		return term.Code()
	}
}

// victim is our QP facing a raw peer: its target MR sits between guard
// zones that must never change.
type victim struct {
	*testEnd
	guard    []byte // whole allocation: guard | MR | guard
	roReg    *Region
	otherPD  *Region
	atReg    *Region // remote atomic access, 8-byte aligned
	noExt    bool
	peer     *connStream
	peerCRC  bool
	recvSize int
}

const guardSize = 4096

func newVictim(t *testing.T, crc bool, recvs int, ird int) *victim {
	t.Helper()
	return newVictimExt(t, crc, recvs, ird, false)
}

// newVictimExt is newVictim with the RFC 7306 extensions off (noExt).
func newVictimExt(t *testing.T, crc bool, recvs int, ird int, noExt bool) *victim {
	t.Helper()
	return newVictimWith(t, noExt, recvs, MPAConfig{IRD: ird, ORD: 1}, MPAConfig{CRC: crc, IRD: 1, ORD: 1})
}

// newVictimWith negotiates the victim's MPA with mine and the raw peer's
// with peer.
func newVictimWith(t *testing.T, noExt bool, recvs int, mine, peer MPAConfig) *victim {
	t.Helper()
	e := &testEnd{scq: newTestCQ(), rcq: newTestCQ(), mem: NewMemTable(), events: make(chan Event, 64)}
	rq, _ := NewRecvQueue(16, 2)
	var err error
	e.qp, err = NewQP(QPConfig{Num: 9, PD: 7, Mem: e.mem, SendCQ: e.scq, RecvCQ: e.rcq, RQ: rq, Stats: &e.stats, NoExtensions: noExt,
		OnEvent: func(ev Event) {
			select {
			case e.events <- ev:
			default:
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.qp.Close() })
	v := &victim{testEnd: e, guard: make([]byte, 3*guardSize), recvSize: 64, noExt: noExt}
	e.buf = v.guard[guardSize : 2*guardSize]
	e.reg = &Region{Buf: e.buf, Base: 0x100000, Access: AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead, PD: 7}
	v.roReg = &Region{Buf: make([]byte, 4096), Base: 0x200000, Access: AccessLocalWrite, PD: 7}
	v.otherPD = &Region{Buf: make([]byte, 4096), Base: 0x300000, Access: AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic, PD: 8}
	v.atReg = &Region{Buf: make([]byte, 4096), Base: 0x400000, Access: AccessLocalWrite | AccessRemoteAtomic, PD: 7}
	for _, r := range []*Region{e.reg, v.roReg, v.otherPD, v.atReg} {
		if _, err := e.mem.Register(r); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < recvs; i++ {
		if err := e.qp.PostRecv(uint64(100+i), []SGE{e.sge(i*v.recvSize, v.recvSize)}); err != nil {
			t.Fatal(err)
		}
	}
	// The raw peer is the initiator; the victim accepts.
	sa, sb := tcpPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		req, err := AwaitMPARequest(ctx, sb)
		if err != nil {
			done <- err
			return
		}
		p, err := req.Accept(ctx, sb, mine)
		if err == nil {
			err = e.qp.Start(sb, p)
		}
		done <- err
	}()
	p, _, err := Initiate(ctx, sa, peer)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	v.peer, v.peerCRC = sa, p.CRC
	return v
}

func (v *victim) send(t *testing.T, fpdus ...[]byte) {
	t.Helper()
	var all []byte
	for _, f := range fpdus {
		all = append(all, f...)
	}
	if _, err := v.peer.Write(context.Background(), all); err != nil {
		t.Fatal(err)
	}
}

func (v *victim) fpdu(f DDPFields, payload []byte) []byte {
	return rawFPDU(rawULPDU(f, payload), v.peerCRC)
}

// writeRun frames n FPDUs of one RDMA Write (none the last) into the
// victim's MR, each with size payload bytes, from TO to on.
func (v *victim) writeRun(n, size int, to uint64) [][]byte {
	var fs [][]byte
	for i := range n {
		p := make([]byte, size)
		for j := range p {
			p[j] = byte(i + 1)
		}
		fs = append(fs, v.fpdu(DDPFields{Opcode: OpWrite, STag: v.reg.STag(), TO: to + uint64(i*size)}, p))
	}
	return fs
}

// atomicReq frames an Atomic Request on queue 1 with the given MSN.
func (v *victim) atomicReq(msn uint32, f AtomicRequestFields) []byte {
	ar := make([]byte, AtomicRequestSize)
	AtomicRequest(ar).Encode(&f)
	return v.fpdu(DDPFields{Opcode: OpAtomicRequest, Last: true, QN: QNReadReq, MSN: msn}, ar)
}

// immediate frames an Immediate Data message on queue 0.
func (v *victim) immediate(op Opcode, msn uint32, value uint64) []byte {
	d := make([]byte, ImmediateDataSize)
	ImmediateData(d).Encode(value)
	return v.fpdu(DDPFields{Opcode: op, Last: true, QN: QNSend, MSN: msn}, d)
}

func (v *victim) readReq(f ReadRequestFields) []byte {
	rr := make([]byte, ReadRequestSize)
	ReadRequest(rr).Encode(&f)
	return v.fpdu(DDPFields{Opcode: OpReadRequest, Last: true, QN: QNReadReq, MSN: 1}, rr)
}

// checkAftermath checks the guard zones, the QP's error and the flushed
// receives.
func (v *victim) checkAftermath(t *testing.T, code TermCode, recvStatus []Status) {
	t.Helper()
	select {
	case <-v.qp.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("QP did not reach ERROR")
	}
	if v.qp.State() != StateError {
		t.Fatalf("QP state %v", v.qp.State())
	}
	var te *TerminateError
	if err := v.qp.Err(); !errors.As(err, &te) || te.Received || te.Code != code {
		t.Fatalf("QP error %v, want terminate sent %v", err, code)
	}
	for i, c := range v.guard[:guardSize] {
		if c != 0 {
			t.Fatalf("guard byte %d before the MR changed", i)
		}
	}
	for i, c := range v.guard[2*guardSize:] {
		if c != 0 {
			t.Fatalf("guard byte %d after the MR changed", i)
		}
	}
	for _, r := range []*Region{v.roReg, v.otherPD, v.atReg} {
		for i, c := range r.Buf {
			if c != 0 {
				t.Fatalf("byte %d of a region the peer may not write changed", i)
			}
		}
	}
	for i, want := range recvStatus {
		c := v.rcq.wait(t)
		if c.Status != want || c.Op != CompRecv {
			t.Fatalf("receive completion %d: %v (id %d), want %v", i, c.Status, c.ID, want)
		}
	}
	v.rcq.none(t, 10*time.Millisecond)
	if v.stats.TermSent.Load() != 1 {
		t.Fatalf("%d Terminates counted", v.stats.TermSent.Load())
	}
}

func TestTerminateCauses(t *testing.T) {
	flush2 := []Status{StatusWRFlush, StatusWRFlush}
	type tc struct {
		name   string
		crc    bool
		recvs  int
		build  func(v *victim) [][]byte
		code   TermCode
		status []Status
	}
	// Cases whose victim has the RFC 7306 extensions off.
	noExt := map[string]bool{"atomic-unsupported": true, "atomic-unsupported-qn1": true, "immediate-unsupported": true}
	payload := make([]byte, 100)
	for i := range payload {
		payload[i] = 0xee
	}
	cases := []tc{
		{"write-invalid-stag", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.fpdu(DDPFields{Opcode: OpWrite, Last: true, STag: v.reg.STag() ^ 0x100, TO: v.reg.Base}, payload)}
		}, TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPInvalidSTag}, flush2},
		{"write-stale-key", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.fpdu(DDPFields{Opcode: OpWrite, Last: true, STag: v.reg.STag() ^ 0x1, TO: v.reg.Base}, payload)}
		}, TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPInvalidSTag}, flush2},
		{"write-past-end", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.fpdu(DDPFields{Opcode: OpWrite, Last: true, STag: v.reg.STag(), TO: v.reg.Base + 4096 - 50}, payload)}
		}, TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPBaseBounds}, flush2},
		{"write-before-start", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.fpdu(DDPFields{Opcode: OpWrite, Last: true, STag: v.reg.STag(), TO: v.reg.Base - 1}, payload)}
		}, TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPBaseBounds}, flush2},
		{"write-to-wrap", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.fpdu(DDPFields{Opcode: OpWrite, Last: true, STag: v.reg.STag(), TO: ^uint64(0) - 10}, payload)}
		}, TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPTOWrap}, flush2},
		{"write-no-remote-write", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.fpdu(DDPFields{Opcode: OpWrite, Last: true, STag: v.roReg.STag(), TO: v.roReg.Base}, payload)}
		}, TermCode{LayerRDMAP, ETypeRemoteProtection, CodeAccessRights}, flush2},
		{"write-other-pd", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.fpdu(DDPFields{Opcode: OpWrite, Last: true, STag: v.otherPD.STag(), TO: v.otherPD.Base}, payload)}
		}, TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPSTagNotAssociated}, flush2},
		{"read-invalid-stag", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.readReq(ReadRequestFields{SinkSTag: 5, Size: 10, SourceSTag: 0x77700, SourceTO: 0})}
		}, TermCode{LayerRDMAP, ETypeRemoteProtection, CodeInvalidSTag}, flush2},
		{"read-past-end", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.readReq(ReadRequestFields{SinkSTag: 5, Size: 4097, SourceSTag: v.reg.STag(), SourceTO: v.reg.Base})}
		}, TermCode{LayerRDMAP, ETypeRemoteProtection, CodeBaseBounds}, flush2},
		{"read-no-remote-read", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.readReq(ReadRequestFields{SinkSTag: 5, Size: 10, SourceSTag: v.roReg.STag(), SourceTO: v.roReg.Base})}
		}, TermCode{LayerRDMAP, ETypeRemoteProtection, CodeAccessRights}, flush2},
		{"read-other-pd", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.readReq(ReadRequestFields{SinkSTag: 5, Size: 10, SourceSTag: v.otherPD.STag(), SourceTO: v.otherPD.Base})}
		}, TermCode{LayerRDMAP, ETypeRemoteProtection, CodeSTagNotAssociated}, flush2},
		{"send-msn-out-of-range", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.fpdu(DDPFields{Opcode: OpSend, Last: true, QN: QNSend, MSN: 5}, payload[:10])}
		}, TermCode{LayerDDP, ETypeUntaggedBuffer, CodeMSNRange}, flush2},
		{"send-no-receive-posted", false, 0, func(v *victim) [][]byte {
			return [][]byte{v.fpdu(DDPFields{Opcode: OpSend, Last: true, QN: QNSend, MSN: 1}, payload[:10])}
		}, TermCode{LayerDDP, ETypeUntaggedBuffer, CodeNoBuffer}, nil},
		{"send-too-long", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.fpdu(DDPFields{Opcode: OpSend, Last: true, QN: QNSend, MSN: 1}, payload)}
		}, TermCode{LayerDDP, ETypeUntaggedBuffer, CodeMessageTooLong}, []Status{StatusLocalLength, StatusWRFlush}},
		{"send-too-long-second-segment", false, 2, func(v *victim) [][]byte {
			return [][]byte{
				v.fpdu(DDPFields{Opcode: OpSend, QN: QNSend, MSN: 1}, payload[:40]),
				v.fpdu(DDPFields{Opcode: OpSend, Last: true, QN: QNSend, MSN: 1, MO: 40}, payload[:40]),
			}
		}, TermCode{LayerDDP, ETypeUntaggedBuffer, CodeMessageTooLong}, []Status{StatusLocalLength, StatusWRFlush}},
		{"send-bad-mo", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.fpdu(DDPFields{Opcode: OpSend, Last: true, QN: QNSend, MSN: 1, MO: 8}, payload[:10])}
		}, TermCode{LayerDDP, ETypeUntaggedBuffer, CodeInvalidMO}, flush2},
		{"send-bad-qn", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.fpdu(DDPFields{Opcode: OpSend, Last: true, QN: 9, MSN: 1}, payload[:10])}
		}, TermCode{LayerDDP, ETypeUntaggedBuffer, CodeInvalidQN}, flush2},
		{"crc-error", true, 2, func(v *victim) [][]byte {
			f := v.fpdu(DDPFields{Opcode: OpSend, Last: true, QN: QNSend, MSN: 1}, payload[:10])
			f[len(f)-1] ^= 1
			return [][]byte{f}
		}, TermCode{LayerLLP, ETypeMPA, CodeCRC}, flush2},
		// An RDMA Write's FPDUs after its first take the receiver's
		// continuation path (receiver.wholeCont), which leaves a bad
		// CRC or bounds to the checks of the byte-wise path.
		{"crc-error-mid-write", true, 2, func(v *victim) [][]byte {
			fs := v.writeRun(3, 1000, v.reg.Base)
			f := fs[2]
			f[100] ^= 1
			return fs
		}, TermCode{LayerLLP, ETypeMPA, CodeCRC}, flush2},
		{"write-beyond-bounds-mid-write", false, 2, func(v *victim) [][]byte {
			return v.writeRun(5, 1000, v.reg.Base) // the fifth ends 904 bytes past the MR
		}, TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPBaseBounds}, flush2},
		{"write-beyond-bounds-mid-write-crc", true, 2, func(v *victim) [][]byte {
			return v.writeRun(5, 1000, v.reg.Base)
		}, TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPBaseBounds}, flush2},
		{"bad-opcode", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.fpdu(DDPFields{Opcode: 0xc, Last: true, QN: QNSend, MSN: 1}, payload[:10])}
		}, TermCode{LayerRDMAP, ETypeRemoteOperation, CodeUnexpectedOpcode}, flush2},
		// With the RFC 7306 extensions off, their opcodes are refused
		// before anything else is looked at, as Linux siw refuses them.
		{"atomic-unsupported", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.fpdu(DDPFields{Opcode: OpAtomicRequest, Last: true, QN: 3, MSN: 1}, payload[:52])}
		}, TermCode{LayerRDMAP, ETypeRemoteOperation, CodeUnexpectedOpcode}, flush2},
		{"atomic-unsupported-qn1", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.atomicReq(1, AtomicRequestFields{Op: AtomicFetchAdd, RemoteSTag: v.atReg.STag(), RemoteTO: v.atReg.Base, AddSwapData: 1})}
		}, TermCode{LayerRDMAP, ETypeRemoteOperation, CodeUnexpectedOpcode}, flush2},
		{"immediate-unsupported", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.immediate(OpImmediate, 1, 7)}
		}, TermCode{LayerRDMAP, ETypeRemoteOperation, CodeUnexpectedOpcode}, flush2},
		// With them on (the default): Atomic Requests belong on queue 1.
		{"atomic-request-on-qn3", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.fpdu(DDPFields{Opcode: OpAtomicRequest, Last: true, QN: 3, MSN: 1}, payload[:52])}
		}, TermCode{LayerDDP, ETypeUntaggedBuffer, CodeInvalidQN}, flush2},
		{"atomic-invalid-stag", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.atomicReq(1, AtomicRequestFields{Op: AtomicFetchAdd, RemoteSTag: v.atReg.STag() ^ 0x100, RemoteTO: v.atReg.Base, AddSwapData: 1})}
		}, TermCode{LayerRDMAP, ETypeRemoteProtection, CodeInvalidSTag}, flush2},
		{"atomic-no-atomic-access", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.atomicReq(1, AtomicRequestFields{Op: AtomicFetchAdd, RemoteSTag: v.reg.STag(), RemoteTO: v.reg.Base, AddSwapData: 1})}
		}, TermCode{LayerRDMAP, ETypeRemoteProtection, CodeAccessRights}, flush2},
		{"atomic-other-pd", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.atomicReq(1, AtomicRequestFields{Op: AtomicFetchAdd, RemoteSTag: v.otherPD.STag(), RemoteTO: v.otherPD.Base, AddSwapData: 1})}
		}, TermCode{LayerRDMAP, ETypeRemoteProtection, CodeSTagNotAssociated}, flush2},
		{"atomic-past-end", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.atomicReq(1, AtomicRequestFields{Op: AtomicCmpSwap, RemoteSTag: v.atReg.STag(), RemoteTO: v.atReg.Base + 4096, AddSwapData: 1, AddSwapMask: ^uint64(0), CompareMask: ^uint64(0)})}
		}, TermCode{LayerRDMAP, ETypeRemoteProtection, CodeBaseBounds}, flush2},
		{"atomic-straddles-end", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.atomicReq(1, AtomicRequestFields{Op: AtomicFetchAdd, RemoteSTag: v.atReg.STag(), RemoteTO: v.atReg.Base + 4092, AddSwapData: 1})}
		}, TermCode{LayerRDMAP, ETypeRemoteProtection, CodeBaseBounds}, flush2},
		{"atomic-before-start", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.atomicReq(1, AtomicRequestFields{Op: AtomicFetchAdd, RemoteSTag: v.atReg.STag(), RemoteTO: v.atReg.Base - 8, AddSwapData: 1})}
		}, TermCode{LayerRDMAP, ETypeRemoteProtection, CodeBaseBounds}, flush2},
		{"atomic-to-wrap", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.atomicReq(1, AtomicRequestFields{Op: AtomicFetchAdd, RemoteSTag: v.atReg.STag(), RemoteTO: ^uint64(0) - 3, AddSwapData: 1})}
		}, TermCode{LayerRDMAP, ETypeRemoteProtection, CodeTOWrap}, flush2},
		{"atomic-misaligned", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.atomicReq(1, AtomicRequestFields{Op: AtomicFetchAdd, RemoteSTag: v.atReg.STag(), RemoteTO: v.atReg.Base + 4, AddSwapData: 1})}
		}, TermCode{LayerRDMAP, ETypeRemoteOperation, CodeUnspecified}, flush2},
		{"atomic-unknown-op", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.atomicReq(1, AtomicRequestFields{Op: 3, RemoteSTag: v.atReg.STag(), RemoteTO: v.atReg.Base, AddSwapData: 1})}
		}, TermCode{LayerRDMAP, ETypeRemoteOperation, CodeUnexpectedOpcode}, flush2},
		{"atomic-msn-out-of-range", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.atomicReq(2, AtomicRequestFields{Op: AtomicFetchAdd, RemoteSTag: v.atReg.STag(), RemoteTO: v.atReg.Base, AddSwapData: 1})}
		}, TermCode{LayerDDP, ETypeUntaggedBuffer, CodeMSNRange}, flush2},
		{"atomic-not-last", false, 2, func(v *victim) [][]byte {
			ar := make([]byte, AtomicRequestSize)
			AtomicRequest(ar).Encode(&AtomicRequestFields{Op: AtomicFetchAdd, RemoteSTag: v.atReg.STag(), RemoteTO: v.atReg.Base, AddSwapData: 1})
			return [][]byte{v.fpdu(DDPFields{Opcode: OpAtomicRequest, QN: QNReadReq, MSN: 1}, ar)}
		}, TermCode{LayerDDP, ETypeUntaggedBuffer, CodeInvalidMO}, flush2},
		{"atomic-short-header", false, 2, func(v *victim) [][]byte {
			// A ULPDU shorter than DDP header + Atomic Request header.
			return [][]byte{v.fpdu(DDPFields{Opcode: OpAtomicRequest, Last: true, QN: QNReadReq, MSN: 1}, payload[:40])}
		}, TermCode{LayerLLP, ETypeMPA, CodeFPDUStart}, flush2},
		{"ird-exceeded-atomics", false, 2, func(v *victim) [][]byte {
			var out [][]byte
			for i := 0; i < 256; i++ {
				out = append(out, v.atomicReq(uint32(i+1), AtomicRequestFields{Op: AtomicFetchAdd, RequestID: uint32(i), RemoteSTag: v.atReg.STag(), RemoteTO: v.atReg.Base + 4088}))
			}
			return out
		}, TermCode{LayerRDMAP, ETypeRemoteOperation, CodeCatastrophicStream}, flush2},
		{"unsolicited-atomic-response", false, 2, func(v *victim) [][]byte {
			rsp := make([]byte, AtomicResponseSize)
			AtomicResponse(rsp).Encode(1, 42)
			return [][]byte{v.fpdu(DDPFields{Opcode: OpAtomicResp, Last: true, QN: QNAtomicResp, MSN: 1}, rsp)}
		}, TermCode{LayerRDMAP, ETypeRemoteOperation, CodeUnexpectedOpcode}, flush2},
		{"atomic-response-on-qn1", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.fpdu(DDPFields{Opcode: OpAtomicResp, Last: true, QN: QNReadReq, MSN: 1}, payload[:AtomicResponseSize])}
		}, TermCode{LayerDDP, ETypeUntaggedBuffer, CodeInvalidQN}, flush2},
		{"immediate-no-receive-posted", false, 0, func(v *victim) [][]byte {
			return [][]byte{v.immediate(OpImmediate, 1, 7)}
		}, TermCode{LayerDDP, ETypeUntaggedBuffer, CodeNoBuffer}, nil},
		{"immediate-se-no-receive-posted", false, 0, func(v *victim) [][]byte {
			return [][]byte{v.immediate(OpImmediateSE, 1, 7)}
		}, TermCode{LayerDDP, ETypeUntaggedBuffer, CodeNoBuffer}, nil},
		{"send-with-immediate-no-receive-posted", false, 0, func(v *victim) [][]byte {
			return [][]byte{v.immediate(OpImmediate, 1, ImmFlagForSend|7), v.fpdu(DDPFields{Opcode: OpSend, Last: true, QN: QNSend, MSN: 2}, payload[:10])}
		}, TermCode{LayerDDP, ETypeUntaggedBuffer, CodeNoBuffer}, nil},
		{"immediate-msn-out-of-range", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.immediate(OpImmediate, 3, 7)}
		}, TermCode{LayerDDP, ETypeUntaggedBuffer, CodeMSNRange}, flush2},
		{"immediate-on-qn1", false, 2, func(v *victim) [][]byte {
			d := make([]byte, ImmediateDataSize)
			return [][]byte{v.fpdu(DDPFields{Opcode: OpImmediate, Last: true, QN: QNReadReq, MSN: 1}, d)}
		}, TermCode{LayerDDP, ETypeUntaggedBuffer, CodeInvalidQN}, flush2},
		{"immediate-with-payload", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.fpdu(DDPFields{Opcode: OpImmediate, Last: true, QN: QNSend, MSN: 1}, payload[:16])}
		}, TermCode{LayerDDP, ETypeUntaggedBuffer, CodeInvalidMO}, flush2},
		{"immediate-inside-send", false, 2, func(v *victim) [][]byte {
			return [][]byte{
				v.fpdu(DDPFields{Opcode: OpSend, QN: QNSend, MSN: 1}, payload[:8]),
				v.immediate(OpImmediate, 2, 7),
			}
		}, TermCode{LayerDDP, ETypeUntaggedBuffer, CodeMSNRange}, []Status{StatusWRFlush, StatusWRFlush}},
		{"two-immediates-for-one-send", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.immediate(OpImmediate, 1, ImmFlagForSend|7), v.immediate(OpImmediate, 2, ImmFlagForSend|8)}
		}, TermCode{LayerRDMAP, ETypeRemoteOperation, CodeUnexpectedOpcode}, flush2},
		{"unsolicited-read-response", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.fpdu(DDPFields{Opcode: OpReadResponse, Last: true, STag: v.reg.STag(), TO: v.reg.Base}, payload[:10])}
		}, TermCode{LayerRDMAP, ETypeRemoteOperation, CodeUnexpectedOpcode}, flush2},
		{"bad-rdmap-version", false, 2, func(v *victim) [][]byte {
			f := v.fpdu(DDPFields{Opcode: OpSend, Last: true, QN: QNSend, MSN: 1}, payload[:8])
			f[MPALengthSize+1] = 2<<6 | byte(OpSend)
			return [][]byte{f}
		}, TermCode{LayerRDMAP, ETypeRemoteOperation, CodeInvalidRDMAPVersion}, flush2},
		{"bad-ddp-version-untagged", false, 2, func(v *victim) [][]byte {
			f := v.fpdu(DDPFields{Opcode: OpSend, Last: true, QN: QNSend, MSN: 1}, payload[:8])
			f[MPALengthSize] = f[MPALengthSize]&^3 | 2
			return [][]byte{f}
		}, TermCode{LayerDDP, ETypeUntaggedBuffer, CodeDDPUntaggedVersion}, flush2},
		{"bad-ddp-version-tagged", false, 2, func(v *victim) [][]byte {
			f := v.fpdu(DDPFields{Opcode: OpWrite, Last: true, STag: v.reg.STag(), TO: v.reg.Base}, payload[:8])
			f[MPALengthSize] = f[MPALengthSize]&^3 | 0
			return [][]byte{f}
		}, TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPTaggedVersion}, flush2},
		{"mpa-framing", false, 2, func(v *victim) [][]byte {
			// A ULPDU_Length shorter than the DDP header it precedes.
			f := v.fpdu(DDPFields{Opcode: OpSend, Last: true, QN: QNSend, MSN: 1}, payload[:8])
			binary.BigEndian.PutUint16(f, 6)
			return [][]byte{f}
		}, TermCode{LayerLLP, ETypeMPA, CodeFPDUStart}, flush2},
		{"send-invalidate-bad-stag", false, 2, func(v *victim) [][]byte {
			return [][]byte{v.fpdu(DDPFields{Opcode: OpSendInvalidate, Last: true, QN: QNSend, MSN: 1, RsvdULP: 0xabcdef00}, payload[:10])}
		}, TermCode{LayerRDMAP, ETypeRemoteOperation, CodeCannotInvalidate}, []Status{StatusRemoteInvalidRequest, StatusWRFlush}},
		{"ird-exceeded", false, 2, func(v *victim) [][]byte {
			var out [][]byte
			for i := 0; i < 6; i++ {
				rr := make([]byte, ReadRequestSize)
				ReadRequest(rr).Encode(&ReadRequestFields{SinkSTag: 5, Size: 4096, SourceSTag: v.reg.STag(), SourceTO: v.reg.Base})
				out = append(out, v.fpdu(DDPFields{Opcode: OpReadRequest, Last: true, QN: QNReadReq, MSN: uint32(i + 1)}, rr))
			}
			return out
		}, TermCode{LayerRDMAP, ETypeRemoteOperation, CodeCatastrophicStream}, flush2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := newVictimExt(t, c.crc, c.recvs, 1, noExt[c.name])
			v.send(t, c.build(v)...)
			if got := readTerminate(t, v.peer, v.peerCRC); got != c.code {
				t.Fatalf("Terminate %v, want %v", got, c.code)
			}
			v.checkAftermath(t, c.code, c.status)
		})
	}
}

// TestTerminateReceived checks the requester's side: a Read of a bad STag
// completes with "remote access error" carrying the peer's Terminate, and
// the WRs behind it are flushed.
func TestTerminateReceived(t *testing.T) {
	acc := AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead
	a, b := newTestEnd(t, 4096, acc), newTestEnd(t, 4096, acc)
	connectQPs(t, a, b, MPAConfig{IRD: 2, ORD: 2}, MPAConfig{IRD: 2, ORD: 2})
	if _, err := a.qp.PostSend(
		SendWR{ID: 1, Op: WRRead, Flags: FlagSignaled, SGL: []SGE{a.sge(0, 100)}, RemoteAddr: b.reg.Base, RKey: b.reg.STag() ^ 0x100},
	); err != nil {
		t.Fatal(err)
	}
	c := a.scq.wait(t)
	want := TermCode{LayerRDMAP, ETypeRemoteProtection, CodeInvalidSTag}
	if c.ID != 1 || c.Status != StatusRemoteAccess || c.Term != want {
		t.Fatalf("read completion %+v, want remote access error with %v", c, want)
	}
	<-a.qp.Done()
	var te *TerminateError
	if !errors.As(a.qp.Err(), &te) || !te.Received || te.Code != want || !errors.Is(a.qp.Err(), ErrTerminated) {
		t.Fatalf("requester error %v", a.qp.Err())
	}
	if _, err := a.qp.PostSend(SendWR{ID: 2, Op: WRSend}); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("post after terminate: %v", err)
	}
	for _, r := range a.buf {
		if r != 0 {
			t.Fatal("read sink changed")
		}
	}
}

// TestSiwTerminateLayout feeds our receiver a Terminate laid out the way
// Linux siw's little-endian bit-fields put it on the wire.
func TestSiwTerminateLayout(t *testing.T) {
	acc := AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead
	v := newVictim(t, false, 1, 1)
	_ = acc
	body := []byte{0x02 << 4 >> 4, CodeCRC, 0x00, 0x00} // siw: etype<<4 | layer = 0x02 for LLP/MPA
	body[0] = ETypeMPA<<4 | byte(LayerLLP)
	body[2] = 0x01 // siw's M bit position
	body = append(body, 0, 0)
	v.send(t, v.fpdu(DDPFields{Opcode: OpTerminate, Last: true, QN: QNTerminate, MSN: 1}, body))
	select {
	case <-v.qp.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("QP ignored the Terminate")
	}
	var te *TerminateError
	if !errors.As(v.qp.Err(), &te) || !te.Received || te.Code != (TermCode{LayerLLP, ETypeMPA, CodeCRC}) {
		t.Fatalf("error %v, want a received LLP/MPA CRC Terminate", v.qp.Err())
	}
}

// TestP2PRTRIsFirstFPDU: in peer-to-peer mode the initiator's first FPDU
// is the RTR, even when the application posts a Send the moment the
// connection is up (siw stalls otherwise: seen against its p2p build).
func TestP2PRTRIsFirstFPDU(t *testing.T) {
	for _, rtr := range []RTR{RTRWrite, RTRRead, RTRSend} {
		a := newTestEnd(t, 4096, AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead)
		sa, sb := tcpPair(t)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		done := make(chan error, 1)
		go func() {
			req, err := AwaitMPARequest(ctx, sb)
			if err == nil {
				_, err = req.Accept(ctx, sb, MPAConfig{IRD: 1, ORD: 1})
			}
			done <- err
		}()
		p, _, err := Initiate(ctx, sa, MPAConfig{PeerToPeer: true, RTR: rtr, IRD: 1, ORD: 1})
		if err != nil || <-done != nil {
			t.Fatal(err)
		}
		if err := a.qp.Start(sa, p); err != nil {
			t.Fatal(err)
		}
		if _, err := a.qp.PostSend(SendWR{Op: WRSend, Flags: FlagInline, SGL: []SGE{a.sge(0, 16)}}); err != nil {
			t.Fatal(err)
		}
		var l [2]byte
		if err := sb.ReadFull(ctx, l[:]); err != nil {
			t.Fatal(err)
		}
		rest := make([]byte, FPDULen(int(binary.BigEndian.Uint16(l[:])))-2)
		if err := sb.ReadFull(ctx, rest); err != nil {
			t.Fatal(err)
		}
		h := DDPHeader(rest)
		switch rtr {
		case RTRWrite:
			if h.Opcode() != OpWrite || binary.BigEndian.Uint16(l[:]) != DDPTaggedHeaderSize || h.STag() != 1 {
				t.Fatalf("first FPDU %v STag %#x, want the zero-length Write RTR", h.Opcode(), h.STag())
			}
		case RTRRead:
			if h.Opcode() != OpReadRequest || ReadRequest(h.Payload()).Size() != 0 {
				t.Fatalf("first FPDU %v, want the zero-length Read RTR", h.Opcode())
			}
		case RTRSend:
			if h.Opcode() != OpSend || binary.BigEndian.Uint16(l[:]) != DDPUntaggedHeaderSize {
				t.Fatalf("first FPDU %v of %d bytes, want the zero-length Send RTR", h.Opcode(), binary.BigEndian.Uint16(l[:]))
			}
		}
		cancel()
	}
}

// TestSiwPicksUnofferedRTR names a siw quirk: offered only a Send RTR,
// siw's responder replies Write RTR instead of rejecting. The initiator
// copes by sending the Write RTR the responder asked for.
func TestSiwPicksUnofferedRTR(t *testing.T) {
	sa, sb := tcpPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go func() {
		if _, err := readMPAFrame(ctx, sb); err != nil {
			return
		}
		// siw's reply to an offer of {Send}: P2P, Write RTR.
		writeMPAFrame(ctx, sb, &MPAFrameFields{Reply: true, Revision: 2, V2: &MPAv2Params{IRD: 1, ORD: 1, PeerToPeer: true, RTR: RTRWrite}})
	}()
	p, _, err := Initiate(ctx, sa, MPAConfig{PeerToPeer: true, RTR: RTRSend, IRD: 1, ORD: 1})
	if err != nil {
		t.Fatalf("initiator gave up on siw's Write RTR: %v", err)
	}
	if !p.PeerToPeer || p.RTR != RTRWrite {
		t.Fatalf("negotiated %+v, want peer-to-peer with the Write RTR siw chose", p)
	}
}

// TestSiwEnhancedFlag names how rdmatap treats the MPA flag bit 0x10 that
// Linux siw (and RNICs) set with revision 2 for RFC 6581 enhanced setup:
// RFC 5044 calls it reserved, tshark warns about it. rdmatap sets it on
// every revision-2 frame it sends, reads the IRD/ORD word only when it is
// set, and a siw initiator fails unless the reply carries it.
func TestSiwEnhancedFlag(t *testing.T) {
	sa, sb := tcpPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got := make(chan MPAFrame, 2)
	go func() {
		req, err := readMPAFrame(ctx, sb)
		if err != nil {
			return
		}
		got <- req
		r := &MPARequest{Revision: req.Revision(), Enhanced: req.Enhanced()}
		if v, ok := req.IRDORD(); ok {
			r.V2 = v
		}
		r.Accept(ctx, sb, MPAConfig{IRD: 2, ORD: 2})
	}()
	if _, _, err := Initiate(ctx, sa, MPAConfig{IRD: 2, ORD: 2}); err != nil {
		t.Fatal(err)
	}
	req := <-got
	if req.Flags()&MPAFlagEnhanced == 0 || req.Revision() != 2 || req.PDLength() != 4 {
		t.Fatalf("request flags %#x rev %d pd %d: want siw's 0x10 with the IRD/ORD word", req.Flags(), req.Revision(), req.PDLength())
	}
	// Revision 2 without the flag: the private data is all the
	// application's, no IRD/ORD word is taken from it.
	b := make([]byte, MPAHeaderSize+4)
	MPAFrame(b).Encode(&MPAFrameFields{Revision: 2, PrivateData: []byte{0x80, 1, 0xc0, 1}})
	if f := MPAFrame(b); f.Enhanced() || len(f.ULPPrivateData()) != 4 {
		t.Fatal("revision 2 without the enhanced flag was read as enhanced")
	}
}

// TestSiwEarlyDataRace names siw's accept race: an unpatched siw responder
// stops reading a connection whose first FPDU arrives while it is still
// handing the socket from connection setup to the QP. rdmatap's initiator
// holds its first FPDU for FirstFPDUDelay after the MPA Reply.
func TestSiwEarlyDataRace(t *testing.T) {
	const delay = 50 * time.Millisecond
	a := &testEnd{scq: newTestCQ(), rcq: newTestCQ(), mem: NewMemTable()}
	rq, _ := NewRecvQueue(4, 1)
	var err error
	if a.qp, err = NewQP(QPConfig{Num: 1, PD: 7, Mem: a.mem, SendCQ: a.scq, RecvCQ: a.rcq, RQ: rq, MaxInline: 64, FirstFPDUDelay: delay}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.qp.Close() })
	a.buf = make([]byte, 64)
	a.reg = &Region{Buf: a.buf, Base: 0x1000, Access: AccessLocalWrite, PD: 7}
	a.mem.Register(a.reg)
	sa, sb := tcpPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	replied := make(chan time.Time, 1)
	go func() {
		req, err := AwaitMPARequest(ctx, sb)
		if err == nil {
			_, err = req.Accept(ctx, sb, MPAConfig{IRD: 1, ORD: 1})
		}
		replied <- time.Now()
	}()
	p, _, err := Initiate(ctx, sa, MPAConfig{PeerToPeer: true, RTR: RTRWrite, IRD: 1, ORD: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.qp.Start(sa, p); err != nil {
		t.Fatal(err)
	}
	a.qp.PostSend(SendWR{Op: WRSend, Flags: FlagInline, SGL: []SGE{a.sge(0, 8)}})
	var first [2]byte
	if err := sb.ReadFull(ctx, first[:]); err != nil {
		t.Fatal(err)
	}
	if gap := time.Since(<-replied); gap < delay {
		t.Fatalf("first FPDU %v after the MPA Reply, want at least %v", gap, delay)
	}
}

// TestReadResponseRun sends a Read's response as several FPDUs, whose
// continuations take the receiver's continuation path (wholeCont): whole,
// with a bad CRC in the middle, and running past the Read's size.
func TestReadResponseRun(t *testing.T) {
	const size, seg = 3000, 1000
	for _, tc := range []struct {
		name  string
		crc   bool
		fpdus int // of seg bytes, the last with Last set unless beyond
		bad   int // FPDU whose payload is corrupted, -1 for none
		code  TermCode
	}{
		{"whole", false, 3, -1, TermCode{}},
		{"whole-crc", true, 3, -1, TermCode{}},
		{"crc-error-mid-response", true, 3, 1, TermCode{LayerLLP, ETypeMPA, CodeCRC}},
		{"beyond-the-read", false, 4, -1, TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPBaseBounds}},
		{"beyond-the-read-crc", true, 4, -1, TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPBaseBounds}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := newVictim(t, tc.crc, 0, 1)
			// The victim accepted: it sends once the peer's first FPDU,
			// a zero-length Write, has come.
			v.send(t, v.fpdu(DDPFields{Opcode: OpWrite, Last: true, STag: 1}, nil))
			if _, err := v.qp.PostSend(SendWR{ID: 5, Op: WRRead, Flags: FlagSignaled, SGL: []SGE{v.sge(0, size)}, RemoteAddr: 0x9000, RKey: 0x4242}); err != nil {
				t.Fatal(err)
			}
			h := readFPDU(t, v.peer, v.peerCRC)
			if h.Opcode() != OpReadRequest {
				t.Fatalf("got opcode %v, want a Read Request", h.Opcode())
			}
			rr := ReadRequest(h.Payload())
			var fs [][]byte
			for i := range tc.fpdus {
				p := make([]byte, seg)
				for j := range p {
					p[j] = byte(i + 1)
				}
				last := tc.fpdus*seg == size && i == tc.fpdus-1
				f := v.fpdu(DDPFields{Opcode: OpReadResponse, Last: last, STag: rr.SinkSTag(), TO: rr.SinkTO() + uint64(i*seg)}, p)
				if i == tc.bad {
					f[MPALengthSize+DDPTaggedHeaderSize+7] ^= 1
				}
				fs = append(fs, f)
			}
			v.send(t, fs...)
			if tc.code == (TermCode{}) {
				c := v.scq.wait(t)
				if c.Status != StatusSuccess || c.Op != CompRead || c.ByteLen != size {
					t.Fatalf("completion %+v", c)
				}
				for i, b := range v.buf[:size] {
					if b != byte(i/seg+1) {
						t.Fatalf("byte %d is %d, want %d", i, b, i/seg+1)
					}
				}
				if b := v.buf[size]; b != 0 {
					t.Fatalf("byte after the Read is %d", b)
				}
				return
			}
			v.checkAftermath(t, tc.code, nil)
			for i, b := range v.buf[seg*2:] { // the third FPDU's is never placed whole
				if i >= seg && b != 0 {
					t.Fatalf("byte %d past the Read's first %d changed", seg*2+i, seg*2)
				}
			}
		})
	}
}
