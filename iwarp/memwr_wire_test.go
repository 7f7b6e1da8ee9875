package iwarp

import (
	"bytes"
	"testing"
)

// Memory windows and fast-register MRs facing a raw peer: the Terminate
// each refusal sends is read from the wire and decoded here, and the
// memory behind the refused STag is checked unchanged.

// winVictim is a victim whose PD holds an MR with MW_BIND access, a type 2
// window bound on the victim's QP (zero-based, bytes [1024, 1088) of the
// MR), one bound on another QP of the PD, a type 1 window and a
// fast-register MR registered twice (its first STag stale).
type winVictim struct {
	*victim
	mr                  *Region
	own, other, type1   *Window
	frmr                *FastRegMR
	staleFRMR, frmrSTag uint32
	staleBase, frmrBase uint64
	frmrBuf, frmrOldBuf []byte
}

func newWinVictim(t *testing.T, recvs int) *winVictim {
	t.Helper()
	v := &winVictim{victim: newVictim(t, true, recvs, 1)}
	mem := v.mem
	v.mr = &Region{Buf: make([]byte, 4096), Base: 0x500000, Access: AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessMWBind, PD: 7}
	if _, err := mem.Register(v.mr); err != nil {
		t.Fatal(err)
	}
	bind := func(qp *QP, typ MWType, b MWBind) *Window {
		w, err := NewWindow(mem, 7, typ)
		if err != nil {
			t.Fatal(err)
		}
		stag := incKey(w.STag())
		if typ == MWType1 {
			stag = w.NextType1Key()
		}
		if err := w.bind(qp, &b, stag); err != nil {
			t.Fatal(err)
		}
		return w
	}
	rw := AccessRemoteWrite | AccessRemoteRead
	v.own = bind(v.qp, MWType2, MWBind{MR: v.mr.STag(), Addr: 0x500000 + 1024, Length: 64, Access: rw | AccessZeroBased})
	other := &QP{cfg: QPConfig{PD: 7, Num: 10, Mem: mem}}
	v.other = bind(other, MWType2, MWBind{MR: v.mr.STag(), Addr: 0x500000 + 2048, Length: 64, Access: rw})
	v.type1 = bind(v.qp, MWType1, MWBind{MR: v.mr.STag(), Addr: 0x500000 + 3072, Length: 64, Access: rw})

	var err error
	if v.frmr, err = NewFastRegMR(mem, 7, 1); err != nil {
		t.Fatal(err)
	}
	reg := func(buf []byte) {
		if err := v.frmr.MapPages([][]byte{buf}, 4096, 0, 4096); err != nil {
			t.Fatal(err)
		}
		stag := incKey(v.frmr.STag())
		if err := v.qp.fastReg(v.frmr, &SendWR{RKey: stag, Access: AccessLocalWrite | rw}); err != nil {
			t.Fatal(err)
		}
	}
	v.frmrOldBuf, v.frmrBuf = make([]byte, 4096), make([]byte, 4096)
	reg(v.frmrOldBuf)
	v.staleFRMR, v.staleBase = v.frmr.STag(), v.frmr.Current().Base
	v.frmr.Current().Invalidate()
	reg(v.frmrBuf)
	v.frmrSTag, v.frmrBase = v.frmr.STag(), v.frmr.Current().Base
	return v
}

func (v *winVictim) write(t *testing.T, stag uint32, to uint64, payload []byte) {
	t.Helper()
	v.send(t, v.fpdu(DDPFields{Opcode: OpWrite, Last: true, STag: stag, TO: to}, payload))
}

// unchanged checks that the MR outside the victim's own window, and both
// fast-register buffers, hold nothing.
func (v *winVictim) unchanged(t *testing.T) {
	t.Helper()
	for i, c := range v.mr.Buf {
		if c != 0 && (i < 1024 || i >= 1088) {
			t.Fatalf("MR byte %d changed", i)
		}
	}
	if !bytes.Equal(v.frmrOldBuf, make([]byte, 4096)) || !bytes.Equal(v.frmrBuf, make([]byte, 4096)) {
		t.Fatal("a fast-register MR's memory changed")
	}
}

func TestMemoryObjectTerminatesOnWire(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, v *winVictim)
		want TermCode
	}{
		{"write-other-qps-window", func(t *testing.T, v *winVictim) {
			v.write(t, v.other.STag(), 0x500000+2048, []byte("12345678"))
		}, TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPSTagNotAssociated}},
		{"read-other-qps-window", func(t *testing.T, v *winVictim) {
			v.send(t, v.readReq(ReadRequestFields{SinkSTag: 0x1234, Size: 8, SourceSTag: v.other.STag(), SourceTO: 0x500000 + 2048}))
		}, TermCode{LayerRDMAP, ETypeRemoteProtection, CodeSTagNotAssociated}},
		{"write-past-own-window", func(t *testing.T, v *winVictim) {
			// The window is 64 bytes at TO 0; the MR goes on behind it.
			v.write(t, v.own.STag(), 60, []byte("12345678"))
		}, TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPBaseBounds}},
		{"write-stale-fastreg-stag", func(t *testing.T, v *winVictim) {
			v.write(t, v.staleFRMR, v.staleBase, []byte("12345678"))
		}, TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPInvalidSTag}},
		{"read-stale-fastreg-stag", func(t *testing.T, v *winVictim) {
			v.send(t, v.readReq(ReadRequestFields{SinkSTag: 0x1234, Size: 8, SourceSTag: v.staleFRMR, SourceTO: v.staleBase}))
		}, TermCode{LayerRDMAP, ETypeRemoteProtection, CodeInvalidSTag}},
		{"invalidate-type1-window", func(t *testing.T, v *winVictim) {
			v.send(t, v.fpdu(DDPFields{Opcode: OpSendInvalidate, Last: true, QN: QNSend, MSN: 1, RsvdULP: v.type1.STag()}, nil))
			if c := v.rcq.wait(t); c.Status != StatusRemoteInvalidRequest {
				t.Fatalf("receive %v", c.Status)
			}
			if !v.type1.Current().Valid() {
				t.Fatal("the type 1 window was invalidated")
			}
		}, TermCode{LayerRDMAP, ETypeRemoteOperation, CodeCannotInvalidate}},
		{"invalidate-other-qps-window", func(t *testing.T, v *winVictim) {
			v.send(t, v.fpdu(DDPFields{Opcode: OpSendInvalidate, Last: true, QN: QNSend, MSN: 1, RsvdULP: v.other.STag()}, nil))
			if c := v.rcq.wait(t); c.Status != StatusRemoteInvalidRequest {
				t.Fatalf("receive %v", c.Status)
			}
		}, TermCode{LayerRDMAP, ETypeRemoteOperation, CodeCannotInvalidate}},
		{"invalidate-mr-with-windows", func(t *testing.T, v *winVictim) {
			v.send(t, v.fpdu(DDPFields{Opcode: OpSendInvalidate, Last: true, QN: QNSend, MSN: 1, RsvdULP: v.mr.STag()}, nil))
			if c := v.rcq.wait(t); c.Status != StatusRemoteInvalidRequest {
				t.Fatalf("receive %v", c.Status)
			}
			if !v.mr.Valid() {
				t.Fatal("the MR was invalidated")
			}
		}, TermCode{LayerRDMAP, ETypeRemoteOperation, CodeCannotInvalidate}},
		{"write-own-window-then-invalidated", func(t *testing.T, v *winVictim) {
			// Allowed: a Write through the own window (zero-based), a
			// Send with Invalidate of it and of the fast-register MR;
			// then a Write through the window.
			stag := v.own.STag()
			v.write(t, stag, 8, []byte("window!!"))
			v.send(t,
				v.fpdu(DDPFields{Opcode: OpSendInvalidate, Last: true, QN: QNSend, MSN: 1, RsvdULP: stag}, nil),
				v.fpdu(DDPFields{Opcode: OpSendInvalidate, Last: true, QN: QNSend, MSN: 2, RsvdULP: v.frmrSTag}, nil))
			for _, want := range []uint32{stag, v.frmrSTag} {
				c := v.rcq.wait(t)
				if c.Status != StatusSuccess || c.Flags&CompWithInvalidate == 0 || c.InvalidatedRKey != want {
					t.Fatalf("receive %+v, want %#x invalidated", c, want)
				}
			}
			if string(v.mr.Buf[1024+8:1024+16]) != "window!!" {
				t.Fatalf("the Write through the window placed %q", v.mr.Buf[1024:1040])
			}
			v.write(t, stag, 16, []byte("too late"))
		}, TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPInvalidSTag}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := newWinVictim(t, 2)
			tc.run(t, v)
			if got := readTerminate(t, v.peer, v.peerCRC); got != tc.want {
				t.Fatalf("Terminate on the wire %v, want %v", got, tc.want)
			}
			<-v.qp.Done()
			v.unchanged(t)
			if tc.name != "write-own-window-then-invalidated" {
				for i, c := range v.mr.Buf[1024:1088] {
					if c != 0 {
						t.Fatalf("own window byte %d changed", i)
					}
				}
			}
		})
	}
}
