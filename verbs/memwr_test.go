package verbs_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
)

// Memory registration work requests end to end: fast registration, Local
// Invalidate, Read with local invalidate, Send with Invalidate both ways,
// memory windows of type 1 and 2. Every refusal is checked on the wire:
// the Terminate the refusing side sends (its TERMINATE_SENT event) and the
// one the other side decodes from the stream (its QP's error).

var (
	termInvalidSTag     = verbs.TermCode{Layer: verbs.TermDDP, EType: iwarp.ETypeTaggedBuffer, Code: iwarp.CodeDDPInvalidSTag}
	termBaseBounds      = verbs.TermCode{Layer: verbs.TermDDP, EType: iwarp.ETypeTaggedBuffer, Code: iwarp.CodeDDPBaseBounds}
	termNotAssociated   = verbs.TermCode{Layer: verbs.TermDDP, EType: iwarp.ETypeTaggedBuffer, Code: iwarp.CodeDDPSTagNotAssociated}
	termReadInvalidSTag = verbs.TermCode{Layer: verbs.TermRDMAP, EType: iwarp.ETypeRemoteProtection, Code: iwarp.CodeInvalidSTag}
	termReadNotAssoc    = verbs.TermCode{Layer: verbs.TermRDMAP, EType: iwarp.ETypeRemoteProtection, Code: iwarp.CodeSTagNotAssociated}
	termAccessRights    = verbs.TermCode{Layer: verbs.TermRDMAP, EType: iwarp.ETypeRemoteProtection, Code: iwarp.CodeAccessRights}
	termCannotInval     = verbs.TermCode{Layer: verbs.TermRDMAP, EType: iwarp.ETypeRemoteOperation, Code: iwarp.CodeCannotInvalidate}
	termLocalCatastroph = verbs.TermCode{Layer: verbs.TermRDMAP, EType: iwarp.ETypeRDMAPCatastrophic, Code: iwarp.CodeUnspecified}
)

// expectTerminate checks that dev (the refusing side) sent a Terminate
// with code and that the peer's QP received exactly that from the wire.
func expectTerminate(t *testing.T, dev *verbs.Device, peer *end, code verbs.TermCode) {
	t.Helper()
	ev := waitEvent(t, dev, verbs.EventTerminateSent)
	if ev.Term != code {
		t.Fatalf("Terminate sent: %v (layer %d type %d code %#x), want %v", ev.Term, ev.Term.Layer, ev.Term.EType, ev.Term.Code, code)
	}
	select {
	case <-peer.qp.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the peer's QP did not reach ERROR")
	}
	var te *verbs.TerminateError
	if !errors.As(peer.qp.Err(), &te) || !te.Received || te.Code != code {
		t.Fatalf("the peer's QP error %v, want the Terminate %v received", peer.qp.Err(), code)
	}
}

// post posts one WR and fails the test on error.
func post(t *testing.T, e *end, wr verbs.SendWR) {
	t.Helper()
	if err := e.qp.PostSend(wr); err != nil {
		t.Fatal(err)
	}
}

// writeAndSync RDMA Writes src to the peer's remote buffer and makes sure it
// was placed: a Send behind it (RDMAP orders them) completes a receive.
func writeAndSync(t *testing.T, from, to *end, src []byte, dst verbs.RemoteBuf) {
	t.Helper()
	copy(from.buf, src)
	post(t, from, verbs.SendWR{ID: 50, Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{from.mr.SGE(0, len(src))},
		RemoteAddr: dst.Addr, RKey: dst.RKey})
	mustOK(t, wait1(t, from.scq), verbs.WCWrite, len(src))
	if err := to.qp.PostRecv(verbs.RecvWR{ID: 51, SGL: []verbs.SGE{to.mr.SGE(len(to.buf)-4, 4)}}); err != nil {
		t.Fatal(err)
	}
	post(t, from, verbs.SendWR{ID: 52, Op: verbs.OpSend, Flags: verbs.Signaled})
	mustOK(t, wait1(t, from.scq), verbs.WCSend, 0)
	mustOK(t, wait1(t, to.rcq), verbs.WCRecv, 0)
}

// readInto RDMA Reads n bytes of src into the start of e's MR.
func readInto(t *testing.T, e *end, src verbs.RemoteBuf, n int) []byte {
	t.Helper()
	clear(e.buf[:n])
	post(t, e, verbs.SendWR{ID: 60, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{e.mr.SGE(0, n)},
		RemoteAddr: src.Addr, RKey: src.RKey})
	mustOK(t, wait1(t, e.scq), verbs.WCRead, n)
	return e.buf[:n]
}

// pages cuts n pages of size ps out of one buffer.
func pages(buf []byte, ps int) [][]byte {
	var p [][]byte
	for off := 0; off+ps <= len(buf); off += ps {
		p = append(p, buf[off:off+ps:len(buf)])
	}
	return p
}

// fastReg maps frmr onto pgs[off:off+n] and registers it under the next key.
func fastReg(t *testing.T, e *end, frmr *verbs.MR, pgs [][]byte, off, n int, acc verbs.Access) {
	t.Helper()
	if err := frmr.MapPages(pgs, 4096, off, n); err != nil {
		t.Fatal(err)
	}
	post(t, e, frmr.RegWR(70, verbs.Signaled, verbs.IncRKey(frmr.RKey()), acc))
	mustOK(t, wait1(t, e.scq), verbs.WCRegMR, 0)
	if !frmr.Valid() {
		t.Fatal("the MR is not valid after REG_MR")
	}
}

const remoteRW = verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead

// TestFastRegister: a fast-register MR starts invalid; REG_MR over a page
// list makes it reachable (VA-based and zero-based) for Writes and Reads;
// after Local Invalidate and a REG_MR with the next key, the new STag
// reaches the new mapping and the old STag is refused (Write: DDP invalid
// STag; Read: RDMAP invalid STag).
func TestFastRegister(t *testing.T) {
	for _, tc := range []struct {
		name string
		zero bool
		read bool
	}{{"va-write", false, false}, {"zero-based-write", true, false}, {"va-read", false, true}, {"zero-based-read", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
			cl, sv := connect(t, p, 1<<16, verbs.ConnParams{})
			frmr, err := sv.pd.AllocMR(4)
			if err != nil {
				t.Fatal(err)
			}
			if frmr.Valid() || frmr.Len() != 0 {
				t.Fatal("a new fast-register MR is valid or has memory")
			}
			pool := make([]byte, 8*4096)
			pgs := pages(pool, 4096)
			acc := remoteRW
			if tc.zero {
				acc |= verbs.AccessZeroBased
			}
			first := frmr.RKey()
			fastReg(t, sv, frmr, pgs[:4], 100, 10000, acc)
			r := frmr.Remote()
			if r.RKey != verbs.IncRKey(first) || r.Len != 10000 || (r.Addr == 0) != tc.zero {
				t.Fatalf("registration %+v (first STag %#x)", r, first)
			}
			msg := bytes.Repeat([]byte("fastreg!"), 600)
			dst, _ := r.Slice(5000, uint64(len(msg)))
			writeAndSync(t, cl, sv, msg, dst)
			checkPlaced(t, "write through the fast-register MR", pool, 100+5000, msg)
			if got := readInto(t, cl, dst, len(msg)); !bytes.Equal(got, msg) {
				t.Fatal("read through the fast-register MR returned other bytes")
			}
			// The MR's lkey serves local SGEs too: a Send from it.
			if err := cl.qp.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{cl.mr.SGE(0, 64)}}); err != nil {
				t.Fatal(err)
			}
			post(t, sv, verbs.SendWR{ID: 2, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{frmr.SGE(5000, 64)}})
			mustOK(t, wait1(t, sv.scq), verbs.WCSend, 64)
			mustOK(t, wait1(t, cl.rcq), verbs.WCRecv, 64)
			if !bytes.Equal(cl.buf[:64], msg[:64]) {
				t.Fatal("send from the fast-register MR's lkey")
			}

			// Invalidate, map other pages, register under the next key.
			old := frmr.Remote()
			post(t, sv, verbs.SendWR{ID: 3, Op: verbs.OpLocalInv, Flags: verbs.Signaled, InvalidateRKey: old.RKey})
			mustOK(t, wait1(t, sv.scq), verbs.WCLocalInv, 0)
			if frmr.Valid() {
				t.Fatal("valid after Local Invalidate")
			}
			clear(pool)
			fastReg(t, sv, frmr, pgs[4:], 0, 4*4096, acc)
			if frmr.RKey() != verbs.IncRKey(old.RKey) {
				t.Fatalf("STag %#x after %#x", frmr.RKey(), old.RKey)
			}
			dst2, _ := frmr.Remote().Slice(0, 64)
			writeAndSync(t, cl, sv, msg[:64], dst2)
			checkPlaced(t, "write through the new registration", pool, 4*4096, msg[:64])

			// The old STag (the same index, the old key) is refused.
			clear(pool)
			if tc.read {
				post(t, cl, verbs.SendWR{ID: 4, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(0, 64)},
					RemoteAddr: old.Addr, RKey: old.RKey})
				wc := wait1(t, cl.scq)
				if wc.Status != verbs.StatusRemoteAccess || wc.Term != termReadInvalidSTag {
					t.Fatalf("read with the old STag: %v %v", wc.Status, wc.Term)
				}
				expectTerminate(t, p.b, cl, termReadInvalidSTag)
			} else {
				post(t, cl, verbs.SendWR{ID: 4, Op: verbs.OpWrite, SGL: []verbs.SGE{cl.mr.SGE(0, 64)}, RemoteAddr: old.Addr, RKey: old.RKey})
				expectTerminate(t, p.b, cl, termInvalidSTag)
			}
			for i, c := range pool {
				if c != 0 {
					t.Fatalf("byte %d of the pages changed through the old STag", i)
				}
			}
		})
	}
}

// TestFastRegisterSG: REG_MR over SGEs of a registered buffer (adjacent
// pieces of it), then reached by the peer.
func TestFastRegisterSG(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl, sv := connect(t, p, 1<<16, verbs.ConnParams{})
	pool := make([]byte, 4*4096)
	local, err := sv.pd.RegMR(pool, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	frmr, err := sv.pd.AllocMR(3)
	if err != nil {
		t.Fatal(err)
	}
	if err := frmr.MapSG([]verbs.SGE{local.SGE(4000, 96), local.SGE(4096, 4096), local.SGE(8192, 10)}, 4096); err != nil {
		t.Fatal(err)
	}
	post(t, sv, frmr.RegWR(1, verbs.Signaled, verbs.IncRKey(frmr.RKey()), remoteRW))
	mustOK(t, wait1(t, sv.scq), verbs.WCRegMR, 0)
	if frmr.Len() != 96+4096+10 || frmr.Addr() != local.Addr()+4000 {
		t.Fatalf("mapping of %d bytes at %#x", frmr.Len(), frmr.Addr())
	}
	msg := bytes.Repeat([]byte{0xa5}, frmr.Len())
	writeAndSync(t, cl, sv, msg, frmr.Remote())
	checkPlaced(t, "write through the SG registration", pool, 4000, msg)
	// Local Invalidate of the registered buffer's own MR is no concern of
	// the fast-register MR: the mapping takes the bytes.
	if err := local.Dereg(); err != nil {
		t.Fatal(err)
	}
	if !frmr.Valid() {
		t.Fatal("deregistering the SGEs' MR invalidated the fast-register MR")
	}
}

// TestFastRegisterPostErrors: bad fast registrations given to the API are
// typed errors, at once.
func TestFastRegisterPostErrors(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl, sv := connect(t, p, 4096, verbs.ConnParams{})
	frmr, err := sv.pd.AllocMR(2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sv.pd.AllocMR(0); !errors.Is(err, verbs.ErrInvalidArgument) {
		t.Fatalf("AllocMR(0): %v", err)
	}
	buf := make([]byte, 4*4096)
	fresh, err := sv.pd.AllocMR(2)
	if err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"IOVA before mapping": fresh.SetIOVA(0x1000),
		"IOVA that wraps": func() error {
			if err := fresh.MapPages(pages(buf, 4096)[:1], 4096, 0, 4096); err != nil {
				return err
			}
			return fresh.SetIOVA(1<<64 - 4096)
		}(),
		"IOVA of a regular MR": sv.mr.SetIOVA(0x1000),
		"regular MR IOVA that wraps": func() error {
			_, err := sv.pd.RegMRIOVA(buf, 1<<64-4096, verbs.AccessLocalWrite)
			return err
		}(),
		"too many pages":     frmr.MapPages(pages(buf, 4096), 4096, 0, 4096),
		"page size":          frmr.MapPages(pages(buf, 4096)[:2], 3000, 0, 100),
		"offset past a page": frmr.MapPages(pages(buf, 4096)[:2], 4096, 4096, 1),
		"length past pages":  frmr.MapPages(pages(buf, 4096)[:2], 4096, 10, 8190),
		"short page":         frmr.MapPages([][]byte{buf[:100]}, 4096, 0, 10),
		"SGE of no MR":       frmr.MapSG([]verbs.SGE{{Addr: 1, Length: 1, LKey: 0xffffff00}}, 4096),
		"not fast-register":  sv.mr.MapPages(pages(buf, 4096)[:1], 4096, 0, 1),
	} {
		if !errors.Is(err, verbs.ErrInvalidArgument) {
			t.Errorf("%s: %v", name, err)
		}
	}
	pd2, err := p.b.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	other, err := pd2.AllocMR(2)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := cl.pd.AllocMR(2)
	if err != nil {
		t.Fatal(err)
	}
	for name, wr := range map[string]verbs.SendWR{
		"no MR":                            {Op: verbs.OpRegMR, RKey: 0x100},
		"another PD's MR":                  other.RegWR(1, 0, verbs.IncRKey(other.RKey()), remoteRW),
		"another device's MR":              foreign.RegWR(1, 0, verbs.IncRKey(foreign.RKey()), remoteRW),
		"another index":                    frmr.RegWR(1, 0, frmr.RKey()+0x100, remoteRW),
		"remote write without local write": frmr.RegWR(1, 0, verbs.IncRKey(frmr.RKey()), verbs.AccessRemoteWrite),
		"with an SGE": func() verbs.SendWR {
			wr := frmr.RegWR(1, 0, verbs.IncRKey(frmr.RKey()), remoteRW)
			wr.SGL = []verbs.SGE{sv.mr.SGE(0, 1)}
			return wr
		}(),
	} {
		err := sv.qp.PostSend(wr)
		var pe *verbs.PostError
		if !errors.As(err, &pe) || !errors.Is(err, iwarp.ErrInvalidWR) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := sv.qp.PostSend(verbs.SendWR{Op: verbs.OpLocalInv, SGL: []verbs.SGE{sv.mr.SGE(0, 1)}}); !errors.Is(err, iwarp.ErrInvalidWR) {
		t.Errorf("Local Invalidate with an SGE: %v", err)
	}
	if sv.qp.State() != verbs.QPRTS {
		t.Fatalf("QP in %v after refused posts", sv.qp.State())
	}
}

// TestFastRegisterCompletionErrors: a REG_MR the MR's state refuses
// completes with StatusMWBind, and the QP goes down with a Terminate
// (RDMAP, local catastrophic error) on the wire.
func TestFastRegisterCompletionErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, sv *end, frmr *verbs.MR, pgs [][]byte) verbs.SendWR
	}{
		{"still-valid", func(t *testing.T, sv *end, frmr *verbs.MR, pgs [][]byte) verbs.SendWR {
			fastReg(t, sv, frmr, pgs, 0, 4096, remoteRW)
			return frmr.RegWR(9, verbs.Signaled, verbs.IncRKey(frmr.RKey()), remoteRW)
		}},
		{"same-key", func(t *testing.T, sv *end, frmr *verbs.MR, pgs [][]byte) verbs.SendWR {
			fastReg(t, sv, frmr, pgs, 0, 4096, remoteRW)
			post(t, sv, verbs.SendWR{ID: 8, Op: verbs.OpLocalInv, InvalidateRKey: frmr.RKey()})
			return frmr.RegWR(9, verbs.Signaled, frmr.RKey(), remoteRW)
		}},
		{"nothing-mapped", func(t *testing.T, sv *end, frmr *verbs.MR, pgs [][]byte) verbs.SendWR {
			return frmr.RegWR(9, verbs.Signaled, verbs.IncRKey(frmr.RKey()), remoteRW)
		}},
		{"local-inv-type1-window", func(t *testing.T, sv *end, frmr *verbs.MR, pgs [][]byte) verbs.SendWR {
			mw, err := sv.pd.AllocMW(verbs.MWType1)
			if err != nil {
				t.Fatal(err)
			}
			mr, err := sv.pd.RegMR(make([]byte, 64), remoteRW|verbs.AccessMWBind)
			if err != nil {
				t.Fatal(err)
			}
			stag, err := sv.qp.BindMW(mw, 8, verbs.Signaled, verbs.BindInfo{MR: mr, Addr: mr.Addr(), Length: 64, Access: verbs.AccessRemoteRead})
			if err != nil {
				t.Fatal(err)
			}
			mustOK(t, wait1(t, sv.scq), verbs.WCBindMW, 0)
			return verbs.SendWR{ID: 9, Op: verbs.OpLocalInv, InvalidateRKey: stag}
		}},
		{"local-inv-unbound-type2-window", func(t *testing.T, sv *end, frmr *verbs.MR, pgs [][]byte) verbs.SendWR {
			mw, err := sv.pd.AllocMW(verbs.MWType2)
			if err != nil {
				t.Fatal(err)
			}
			return verbs.SendWR{ID: 9, Op: verbs.OpLocalInv, InvalidateRKey: mw.RKey()}
		}},
		{"local-inv-unknown", func(t *testing.T, sv *end, frmr *verbs.MR, pgs [][]byte) verbs.SendWR {
			return verbs.SendWR{ID: 9, Op: verbs.OpLocalInv, InvalidateRKey: frmr.RKey() ^ 0x5a}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
			cl, sv := connect(t, p, 4096, verbs.ConnParams{})
			frmr, err := sv.pd.AllocMR(1)
			if err != nil {
				t.Fatal(err)
			}
			pgs := pages(make([]byte, 4096), 4096)
			wr := tc.setup(t, sv, frmr, pgs)
			post(t, sv, wr)
			wc := wait1(t, sv.scq)
			if wc.ID != 9 || wc.Status != verbs.StatusMWBind {
				t.Fatalf("completion %+v, want %v", wc, verbs.StatusMWBind)
			}
			if wc.Status.String() != "memory management operation error" {
				t.Fatalf("status string %q", wc.Status)
			}
			expectTerminate(t, p.b, cl, termLocalCatastroph)
		})
	}
}

// TestLocalInvalidateRefusesPeer: after a Local Invalidate of each kind of
// STag (fast-register MR, regular MR, type 2 window), the peer's Write,
// Read and atomic are refused with the Terminate each one calls for.
func TestLocalInvalidateRefusesPeer(t *testing.T) {
	type target struct {
		name string
		make func(t *testing.T, sv *end) verbs.RemoteBuf
	}
	targets := []target{
		{"fastreg", func(t *testing.T, sv *end) verbs.RemoteBuf {
			frmr, err := sv.pd.AllocMR(1)
			if err != nil {
				t.Fatal(err)
			}
			fastReg(t, sv, frmr, pages(alignedBuf(4096), 4096), 0, 4096, remoteRW|verbs.AccessRemoteAtomic)
			return frmr.Remote()
		}},
		{"mr", func(t *testing.T, sv *end) verbs.RemoteBuf {
			mr, err := sv.pd.RegMR(alignedBuf(4096), remoteRW|verbs.AccessRemoteAtomic)
			if err != nil {
				t.Fatal(err)
			}
			return mr.Remote()
		}},
		{"window2", func(t *testing.T, sv *end) verbs.RemoteBuf {
			mr, err := sv.pd.RegMR(alignedBuf(4096), remoteRW|verbs.AccessRemoteAtomic|verbs.AccessMWBind)
			if err != nil {
				t.Fatal(err)
			}
			mw := bindType2(t, sv, mr, mr.Addr(), 4096, verbs.AccessRemoteRead|verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic)
			return mw.Remote()
		}},
	}
	for _, tg := range targets {
		for _, op := range []verbs.Opcode{verbs.OpWrite, verbs.OpRead, verbs.OpAtomicFetchAdd} {
			t.Run(tg.name+"/"+op.String(), func(t *testing.T) {
				p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
				cl, sv := connect(t, p, 4096, verbs.ConnParams{})
				r := tg.make(t, sv)
				// Reachable before.
				writeAndSync(t, cl, sv, []byte("before!!"), r)
				post(t, sv, verbs.SendWR{ID: 1, Op: verbs.OpLocalInv, Flags: verbs.Signaled, InvalidateRKey: r.RKey})
				mustOK(t, wait1(t, sv.scq), verbs.WCLocalInv, 0)
				wr := verbs.SendWR{ID: 2, Op: op, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(0, 8)}, RemoteAddr: r.Addr, RKey: r.RKey, CompareAdd: 1}
				post(t, cl, wr)
				want := termInvalidSTag
				if op != verbs.OpWrite {
					want = termReadInvalidSTag
					wc := wait1(t, cl.scq)
					if wc.Status != verbs.StatusRemoteAccess || wc.Term != want {
						t.Fatalf("%v completion %v %v", op, wc.Status, wc.Term)
					}
				}
				expectTerminate(t, p.b, cl, want)
			})
		}
	}
}

// TestReadWithLocalInvalidate: an RDMA Read with local invalidate brings
// the data, then its sink STag (a fast-register MR) is invalid before the
// Read completes; the peer's later Write to that STag is refused.
func TestReadWithLocalInvalidate(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl, sv := connect(t, p, 1<<16, verbs.ConnParams{})
	sink, err := cl.pd.AllocMR(4)
	if err != nil {
		t.Fatal(err)
	}
	pool := make([]byte, 4*4096)
	fastReg(t, cl, sink, pages(pool, 4096), 0, len(pool), remoteRW)
	fill(sv.buf[:10000], 7)
	post(t, cl, verbs.SendWR{ID: 1, Op: verbs.OpReadInv, Flags: verbs.Signaled, SGL: []verbs.SGE{sink.SGE(10, 10000)},
		RemoteAddr: cl.remote.Addr, RKey: cl.remote.RKey, InvalidateRKey: sink.LKey()})
	mustOK(t, wait1(t, cl.scq), verbs.WCRead, 10000)
	if sink.Valid() {
		t.Fatal("the sink is still valid after the Read with local invalidate completed")
	}
	checkPlaced(t, "read with invalidate", pool, 10, sv.buf[:10000])
	// The sink can be registered again with the next key at once.
	old := sink.Remote()
	fastReg(t, cl, sink, pages(pool, 4096), 0, 4096, remoteRW)
	// The peer writes to the sink's old STag: refused.
	post(t, sv, verbs.SendWR{ID: 2, Op: verbs.OpWrite, SGL: []verbs.SGE{sv.mr.SGE(0, 8)}, RemoteAddr: old.Addr, RKey: old.RKey})
	expectTerminate(t, p.a, sv, termInvalidSTag)
}

// bindType2 binds a new type 2 window on e's QP.
func bindType2(t *testing.T, e *end, mr *verbs.MR, addr, n uint64, acc verbs.Access) *verbs.MW {
	t.Helper()
	mw, err := e.pd.AllocMW(verbs.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	post(t, e, mw.BindWR(80, verbs.Signaled, verbs.IncRKey(mw.RKey()), verbs.BindInfo{MR: mr, Addr: addr, Length: n, Access: acc}))
	mustOK(t, wait1(t, e.scq), verbs.WCBindMW, 0)
	if !mw.Valid() {
		t.Fatal("the window is not bound")
	}
	return mw
}

// TestSendWithInvalidateBothWays: each side invalidates an STag of the
// other with a Send with Invalidate (the client a fast-register MR of the
// server, the server a type 2 window of the client); each receive reports
// the STag; then both STags are refused.
func TestSendWithInvalidateBothWays(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl, sv := connect(t, p, 4096, verbs.ConnParams{})
	frmr, err := sv.pd.AllocMR(1)
	if err != nil {
		t.Fatal(err)
	}
	fastReg(t, sv, frmr, pages(make([]byte, 4096), 4096), 0, 4096, remoteRW)
	base, err := cl.pd.RegMR(make([]byte, 4096), remoteRW|verbs.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	mw := bindType2(t, cl, base, base.Addr()+1024, 1024, verbs.AccessRemoteWrite)

	for _, d := range []struct {
		from, to *end
		stag     verbs.STag
	}{{cl, sv, frmr.RKey()}, {sv, cl, mw.RKey()}} {
		if err := d.to.qp.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{d.to.mr.SGE(0, 64)}}); err != nil {
			t.Fatal(err)
		}
		copy(d.from.buf, "invalidate")
		post(t, d.from, verbs.SendWR{ID: 2, Op: verbs.OpSendInvalidate, Flags: verbs.Signaled, InvalidateRKey: d.stag, SGL: []verbs.SGE{d.from.mr.SGE(0, 10)}})
		mustOK(t, wait1(t, d.from.scq), verbs.WCSend, 10)
		wc := wait1(t, d.to.rcq)
		mustOK(t, wc, verbs.WCRecv, 10)
		if wc.Flags&verbs.WCWithInvalidate == 0 || wc.InvalidatedRKey != d.stag {
			t.Fatalf("receive %+v does not report STag %#x invalidated", wc, d.stag)
		}
	}
	if frmr.Valid() || mw.Valid() {
		t.Fatal("an STag is still valid")
	}
	// Both are ready for the next key; the server's old STag is refused.
	old := frmr.Remote()
	fastReg(t, sv, frmr, pages(make([]byte, 4096), 4096), 0, 4096, remoteRW)
	post(t, cl, verbs.SendWR{ID: 3, Op: verbs.OpWrite, SGL: []verbs.SGE{cl.mr.SGE(0, 8)}, RemoteAddr: old.Addr, RKey: old.RKey})
	expectTerminate(t, p.b, cl, termInvalidSTag)
}

// TestSendWithInvalidateRefused: a peer may not invalidate a type 1
// window, a type 2 window bound to another QP, or an MR with windows
// bound to it: RDMAP, Remote Operation, cannot invalidate.
func TestSendWithInvalidateRefused(t *testing.T) {
	for _, tc := range []string{"type1", "type2-other-qp", "mr-with-window"} {
		t.Run(tc, func(t *testing.T) {
			p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
			cl, sv := connect(t, p, 4096, verbs.ConnParams{})
			mr, err := sv.pd.RegMR(make([]byte, 4096), remoteRW|verbs.AccessMWBind)
			if err != nil {
				t.Fatal(err)
			}
			var stag verbs.STag
			switch tc {
			case "type1", "mr-with-window":
				mw, err := sv.pd.AllocMW(verbs.MWType1)
				if err != nil {
					t.Fatal(err)
				}
				if stag, err = sv.qp.BindMW(mw, 1, verbs.Signaled, verbs.BindInfo{MR: mr, Addr: mr.Addr(), Length: 64, Access: verbs.AccessRemoteWrite}); err != nil {
					t.Fatal(err)
				}
				mustOK(t, wait1(t, sv.scq), verbs.WCBindMW, 0)
				if tc == "mr-with-window" {
					stag = mr.RKey()
				}
			case "type2-other-qp":
				// Bound on a second connection's QP of the same PD.
				_, sv2 := connectSamePD(t, p, sv)
				stag = bindType2(t, sv2, mr, mr.Addr(), 64, verbs.AccessRemoteWrite).RKey()
			}
			if err := sv.qp.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{sv.mr.SGE(0, 64)}}); err != nil {
				t.Fatal(err)
			}
			post(t, cl, verbs.SendWR{ID: 2, Op: verbs.OpSendInvalidate, InvalidateRKey: stag})
			wc := wait1(t, sv.rcq)
			if wc.Status != verbs.StatusRemoteInvalidRequest {
				t.Fatalf("receive %v", wc.Status)
			}
			expectTerminate(t, p.b, cl, termCannotInval)
			if !mr.Valid() {
				t.Fatal("the MR was invalidated")
			}
		})
	}
}

// connectSamePD connects a second pair of ends whose server end shares
// sv's PD.
func connectSamePD(t *testing.T, p *pair, sv *end) (cl2, sv2 *end) {
	t.Helper()
	cl2 = newEnd(t, p.a, 4096, nil, nil)
	sv2 = newEnd(t, p.b, 4096, nil, sv.pd)
	connectEnds(t, p, cl2, sv2, verbs.ConnParams{})
	return cl2, sv2
}

// TestMemoryWindowType1: a type 1 window bound by the verb grants part of
// an MR, VA-based or zero-based, to the peers of every QP of the PD; its
// bounds and rights are the window's; binding again changes the key and
// the old STag is refused; the MR cannot be deregistered while bound.
func TestMemoryWindowType1(t *testing.T) {
	for _, zero := range []bool{false, true} {
		name := "va"
		if zero {
			name = "zero-based"
		}
		t.Run(name, func(t *testing.T) {
			p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
			cl, sv := connect(t, p, 4096, verbs.ConnParams{})
			cl2, _ := connectSamePD(t, p, sv)
			buf := make([]byte, 4096)
			mr, err := sv.pd.RegMR(buf, remoteRW|verbs.AccessMWBind)
			if err != nil {
				t.Fatal(err)
			}
			mw, err := sv.pd.AllocMW(verbs.MWType1)
			if err != nil {
				t.Fatal(err)
			}
			if mw.Valid() {
				t.Fatal("a new window is bound")
			}
			acc := verbs.AccessRemoteWrite | verbs.AccessRemoteRead
			if zero {
				acc |= verbs.AccessZeroBased
			}
			first := mw.RKey()
			stag, err := sv.qp.BindMW(mw, 1, verbs.Signaled, verbs.BindInfo{MR: mr, Addr: mr.Addr() + 256, Length: 512, Access: acc})
			if err != nil {
				t.Fatal(err)
			}
			mustOK(t, wait1(t, sv.scq), verbs.WCBindMW, 0)
			r := mw.Remote()
			if stag != verbs.IncRKey(first) || r.RKey != stag || r.Len != 512 || (r.Addr == 0) != zero || !zero && r.Addr != mr.Addr()+256 {
				t.Fatalf("window %+v, STag %#x (first %#x)", r, stag, first)
			}
			if err := mr.Dereg(); !errors.Is(err, verbs.ErrBusy) {
				t.Fatalf("Dereg of an MR with a window bound: %v", err)
			}
			// Through the first connection: Write, then Read back.
			dst, _ := r.Slice(500, 12)
			writeAndSync(t, cl, sv, []byte("window one!!"), dst)
			checkPlaced(t, "write through the window", buf, 256+500, []byte("window one!!"))
			if got := readInto(t, cl, dst, 12); string(got) != "window one!!" {
				t.Fatalf("read through the window: %q", got)
			}
			// Through a second QP of the PD: a type 1 window serves it too.
			if got := readInto(t, cl2, dst, 12); string(got) != "window one!!" {
				t.Fatalf("read through the window on another QP: %q", got)
			}
			// Bind again: a new key; the old STag is refused.
			stag2, err := sv.qp.BindMW(mw, 2, verbs.Signaled, verbs.BindInfo{MR: mr, Addr: mr.Addr(), Length: 64, Access: verbs.AccessRemoteRead})
			if err != nil {
				t.Fatal(err)
			}
			mustOK(t, wait1(t, sv.scq), verbs.WCBindMW, 0)
			if stag2 != verbs.IncRKey(stag) {
				t.Fatalf("rebind STag %#x after %#x", stag2, stag)
			}
			// Unbind (a zero-length bind); then the MR may go.
			if _, err := sv.qp.BindMW(mw, 3, verbs.Signaled, verbs.BindInfo{}); err != nil {
				t.Fatal(err)
			}
			mustOK(t, wait1(t, sv.scq), verbs.WCBindMW, 0)
			if mw.Valid() {
				t.Fatal("the window is still bound")
			}
			if err := mr.Dereg(); err != nil {
				t.Fatal(err)
			}
			// The first binding's STag is refused.
			post(t, cl, verbs.SendWR{ID: 4, Op: verbs.OpWrite, SGL: []verbs.SGE{cl.mr.SGE(0, 8)}, RemoteAddr: r.Addr, RKey: r.RKey})
			expectTerminate(t, p.b, cl, termInvalidSTag)
		})
	}
}

// TestMemoryWindowChecks: a window's own bounds and rights are enforced
// (not its MR's), with the Terminates RFC 5040/5041 give.
func TestMemoryWindowChecks(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   verbs.Opcode
		off  uint64
		want verbs.TermCode
	}{
		{"write-past-window", verbs.OpWrite, 60, termBaseBounds},
		{"write-before-window", verbs.OpWrite, ^uint64(0) - 7, termBaseBounds},
		{"read-without-read-access", verbs.OpRead, 0, termAccessRights},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
			cl, sv := connect(t, p, 4096, verbs.ConnParams{})
			buf := make([]byte, 4096)
			mr, err := sv.pd.RegMR(buf, remoteRW|verbs.AccessMWBind)
			if err != nil {
				t.Fatal(err)
			}
			mw := bindType2(t, sv, mr, mr.Addr()+1024, 64, verbs.AccessRemoteWrite)
			r := mw.Remote()
			post(t, cl, verbs.SendWR{ID: 1, Op: tc.op, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(0, 8)}, RemoteAddr: r.Addr + tc.off, RKey: r.RKey})
			if tc.op == verbs.OpRead {
				if wc := wait1(t, cl.scq); wc.Term != tc.want {
					t.Fatalf("read completion %v %v", wc.Status, wc.Term)
				}
			}
			expectTerminate(t, p.b, cl, tc.want)
			for i, c := range buf {
				if c != 0 {
					t.Fatalf("MR byte %d changed", i)
				}
			}
		})
	}
}

// TestMemoryWindowType2: a type 2 window bound by a work request serves
// the peer of its QP only (Write and Read from another QP's peer:
// STag not associated), VA-based or zero-based; it must be invalidated
// before it is bound again, under a new key.
func TestMemoryWindowType2(t *testing.T) {
	for _, tc := range []struct {
		name string
		zero bool
		op   verbs.Opcode
		want verbs.TermCode
	}{
		{"va-write", false, verbs.OpWrite, termNotAssociated},
		{"zero-based-read", true, verbs.OpRead, termReadNotAssoc},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
			cl, sv := connect(t, p, 4096, verbs.ConnParams{})
			cl2, sv2 := connectSamePD(t, p, sv)
			buf := make([]byte, 4096)
			mr, err := sv.pd.RegMR(buf, remoteRW|verbs.AccessMWBind)
			if err != nil {
				t.Fatal(err)
			}
			acc := verbs.AccessRemoteWrite | verbs.AccessRemoteRead
			if tc.zero {
				acc |= verbs.AccessZeroBased
			}
			mw := bindType2(t, sv, mr, mr.Addr()+2048, 100, acc)
			r := mw.Remote()
			if (r.Addr == 0) != tc.zero || r.Len != 100 {
				t.Fatalf("window %+v", r)
			}
			writeAndSync(t, cl, sv, []byte("type two"), r)
			checkPlaced(t, "write through the type 2 window", buf, 2048, []byte("type two"))
			if got := readInto(t, cl, r, 8); string(got) != "type two" {
				t.Fatalf("read through the type 2 window: %q", got)
			}
			// Bound again while valid: refused when it executes. (On sv2,
			// to keep sv's connection; sv2's QP goes down.)
			post(t, sv2, mw.BindWR(5, verbs.Signaled, verbs.IncRKey(mw.RKey()), verbs.BindInfo{MR: mr, Addr: mr.Addr(), Length: 8, Access: verbs.AccessRemoteRead}))
			if wc := wait1(t, sv2.scq); wc.Status != verbs.StatusMWBind || wc.Op != verbs.WCBindMW {
				t.Fatalf("bind of a bound type 2 window: %v %v", wc.Op, wc.Status)
			}
			expectTerminate(t, p.b, cl2, termLocalCatastroph)
			if !mw.Valid() || mw.RKey() != r.RKey {
				t.Fatal("the failed bind changed the window")
			}
			// Local Invalidate, bind again under the next key on sv.
			post(t, sv, verbs.SendWR{ID: 6, Op: verbs.OpLocalInv, Flags: verbs.Signaled, InvalidateRKey: r.RKey})
			mustOK(t, wait1(t, sv.scq), verbs.WCLocalInv, 0)
			post(t, sv, mw.BindWR(7, verbs.Signaled, verbs.IncRKey(r.RKey), verbs.BindInfo{MR: mr, Addr: mr.Addr(), Length: 64, Access: acc}))
			mustOK(t, wait1(t, sv.scq), verbs.WCBindMW, 0)
			if mw.RKey() != verbs.IncRKey(r.RKey) {
				t.Fatalf("STag %#x after %#x", mw.RKey(), r.RKey)
			}
			// A third connection of the PD: its peer may not use the
			// window bound on sv's QP.
			cl3, _ := connectSamePD(t, p, sv)
			post(t, cl3, verbs.SendWR{ID: 8, Op: tc.op, Flags: verbs.Signaled, SGL: []verbs.SGE{cl3.mr.SGE(0, 8)}, RemoteAddr: mw.Remote().Addr, RKey: mw.RKey()})
			if tc.op == verbs.OpRead {
				if wc := wait1(t, cl3.scq); wc.Status != verbs.StatusRemoteAccess || wc.Term != tc.want {
					t.Fatalf("read from another QP: %v %v", wc.Status, wc.Term)
				}
			}
			expectTerminate(t, p.b, cl3, tc.want)
			// sv's own peer still may.
			clear(buf)
			writeAndSync(t, cl, sv, []byte("still ok"), mw.Remote())
			checkPlaced(t, "write through the rebound window", buf, 0, []byte("still ok"))
		})
	}
}

// TestMemoryWindowBindErrors: binds the MR does not allow complete with
// StatusMWBind (IBV_WC_MW_BIND_ERR) and take the QP down with a Terminate
// (RDMAP, local catastrophic error), for both window types; malformed
// binds are typed errors at post time.
func TestMemoryWindowBindErrors(t *testing.T) {
	type bind struct {
		name string
		info func(mr, noBind, readOnly, otherPD *verbs.MR) verbs.BindInfo
	}
	binds := []bind{
		{"past-mr-end", func(mr, _, _, _ *verbs.MR) verbs.BindInfo {
			return verbs.BindInfo{MR: mr, Addr: mr.Addr() + 4000, Length: 100, Access: verbs.AccessRemoteRead}
		}},
		{"before-mr", func(mr, _, _, _ *verbs.MR) verbs.BindInfo {
			return verbs.BindInfo{MR: mr, Addr: mr.Addr() - 1, Length: 10, Access: verbs.AccessRemoteRead}
		}},
		{"more-access-than-mr", func(_, _, ro, _ *verbs.MR) verbs.BindInfo {
			return verbs.BindInfo{MR: ro, Addr: ro.Addr(), Length: 10, Access: verbs.AccessRemoteWrite}
		}},
		{"atomic-beyond-mr", func(mr, _, _, _ *verbs.MR) verbs.BindInfo {
			return verbs.BindInfo{MR: mr, Addr: mr.Addr(), Length: 8, Access: verbs.AccessRemoteAtomic}
		}},
		{"mr-without-mw-bind", func(_, nb, _, _ *verbs.MR) verbs.BindInfo {
			return verbs.BindInfo{MR: nb, Addr: nb.Addr(), Length: 10, Access: verbs.AccessRemoteRead}
		}},
		{"mr-of-another-pd", func(_, _, _, o *verbs.MR) verbs.BindInfo {
			return verbs.BindInfo{MR: o, Addr: o.Addr(), Length: 10, Access: verbs.AccessRemoteRead}
		}},
	}
	for _, typ := range []verbs.MWType{verbs.MWType1, verbs.MWType2} {
		for _, b := range binds {
			t.Run(b.name+"/type"+string(rune('0'+typ)), func(t *testing.T) {
				p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
				cl, sv := connect(t, p, 4096, verbs.ConnParams{})
				reg := func(pd *verbs.PD, acc verbs.Access) *verbs.MR {
					mr, err := pd.RegMR(make([]byte, 4096), acc)
					if err != nil {
						t.Fatal(err)
					}
					return mr
				}
				otherPD, err := p.b.AllocPD()
				if err != nil {
					t.Fatal(err)
				}
				mr := reg(sv.pd, remoteRW|verbs.AccessMWBind)
				info := b.info(mr, reg(sv.pd, remoteRW), reg(sv.pd, verbs.AccessRemoteRead|verbs.AccessMWBind), reg(otherPD, remoteRW|verbs.AccessMWBind))
				mw, err := sv.pd.AllocMW(typ)
				if err != nil {
					t.Fatal(err)
				}
				before := mw.RKey()
				if typ == verbs.MWType1 {
					if _, err := sv.qp.BindMW(mw, 9, 0, info); err != nil {
						t.Fatal(err)
					}
				} else {
					post(t, sv, mw.BindWR(9, 0, verbs.IncRKey(mw.RKey()), info))
				}
				wc := wait1(t, sv.scq)
				if wc.ID != 9 || wc.Op != verbs.WCBindMW || wc.Status != verbs.StatusMWBind {
					t.Fatalf("bind completion %+v", wc)
				}
				expectTerminate(t, p.b, cl, termLocalCatastroph)
				if mw.Valid() || mw.RKey() != before {
					t.Fatal("the failed bind bound the window")
				}
			})
		}
	}
	t.Run("post-errors", func(t *testing.T) {
		p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
		cl, sv := connect(t, p, 4096, verbs.ConnParams{})
		mr, err := sv.pd.RegMR(make([]byte, 4096), remoteRW|verbs.AccessMWBind)
		if err != nil {
			t.Fatal(err)
		}
		mw1, _ := sv.pd.AllocMW(verbs.MWType1)
		mw2, _ := sv.pd.AllocMW(verbs.MWType2)
		other, _ := cl.pd.AllocMW(verbs.MWType2)
		info := verbs.BindInfo{MR: mr, Addr: mr.Addr(), Length: 8, Access: verbs.AccessRemoteRead}
		bad := info
		bad.Access |= verbs.AccessLocalWrite
		for name, wr := range map[string]verbs.SendWR{
			"type 1 by a work request": mw1.BindWR(1, 0, verbs.IncRKey(mw1.RKey()), info),
			"another PD's window":      other.BindWR(1, 0, verbs.IncRKey(other.RKey()), info),
			"another index":            mw2.BindWR(1, 0, mw2.RKey()+0x100, info),
			"local access":             mw2.BindWR(1, 0, verbs.IncRKey(mw2.RKey()), bad),
			"no MR":                    mw2.BindWR(1, 0, verbs.IncRKey(mw2.RKey()), verbs.BindInfo{Length: 8}),
		} {
			if err := sv.qp.PostSend(wr); !errors.Is(err, iwarp.ErrInvalidWR) {
				t.Errorf("%s: %v", name, err)
			}
		}
		if _, err := sv.qp.BindMW(mw2, 1, 0, info); !errors.Is(err, iwarp.ErrInvalidWR) {
			t.Errorf("type 2 by BindMW: %v", err)
		}
		if _, err := sv.qp.BindMW(nil, 1, 0, info); !errors.Is(err, verbs.ErrInvalidArgument) {
			t.Errorf("BindMW without a window: %v", err)
		}
		if _, err := sv.pd.AllocMW(3); !errors.Is(err, verbs.ErrInvalidArgument) {
			t.Errorf("AllocMW(3): %v", err)
		}
		if _, err := sv.pd.RegMR(make([]byte, 8), verbs.AccessMWBind); err != nil {
			t.Errorf("RegMR with MW_BIND: %v", err)
		}
		if sv.qp.State() != verbs.QPRTS {
			t.Fatalf("QP in %v after refused posts", sv.qp.State())
		}
	})
}

// TestMemoryWRsAllocateNothingToPost: posting REG_MR, Local Invalidate and
// BIND_MW work requests and binding a type 1 window allocate nothing
// (measured on a QP that is not connected, where they queue).
func TestMemoryWRsAllocateNothingToPost(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	e := newEnd(t, p.a, 4096, nil, nil)
	mr, err := e.pd.RegMR(make([]byte, 4096), remoteRW|verbs.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	mw, _ := e.pd.AllocMW(verbs.MWType2)
	frmr, _ := e.pd.AllocMR(1)
	bind := mw.BindWR(1, verbs.Signaled, verbs.IncRKey(mw.RKey()), verbs.BindInfo{MR: mr, Addr: mr.Addr(), Length: 8, Access: verbs.AccessRemoteRead})
	inv := verbs.SendWR{ID: 2, Op: verbs.OpLocalInv, InvalidateRKey: mw.RKey()}
	reg := frmr.RegWR(3, 0, verbs.IncRKey(frmr.RKey()), remoteRW)
	mw1, _ := e.pd.AllocMW(verbs.MWType1)
	info := verbs.BindInfo{MR: mr, Addr: mr.Addr(), Length: 8, Access: verbs.AccessRemoteRead}
	n := 0
	allocs := testing.AllocsPerRun(50, func() {
		if n < 60 {
			if err := e.qp.PostSend(bind, inv, reg); err != nil {
				t.Fatal(err)
			}
			if _, err := e.qp.BindMW(mw1, 4, 0, info); err != nil {
				t.Fatal(err)
			}
			n++
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per post", allocs)
	}
}

// TestMemoryWindowsUnderSegmentPlacement: with segment placement and a
// lossy, reordering link, a type 2 window and a fast-register MR take
// Writes placed from segments as they arrive; the peer of another QP,
// whose segments the placer sees too, places nothing into the window and
// is refused (DDP STag not associated).
func TestMemoryWindowsUnderSegmentPlacement(t *testing.T) {
	icfg := netstack.ImpairConfig{Seed: 5, LossRate: 0.02, ReorderRate: 0.02}
	p := impairedPair(t, icfg, netstack.LinkConfig{MTU: 1500, NoGSO: true}, verbs.DeviceConfig{},
		verbs.DeviceConfig{Placement: verbs.PlacementSegment})
	const size = 512 << 10
	cl, sv := connect(t, p, size, verbs.ConnParams{})
	cl3, _ := connectSamePD(t, p, sv)
	buf := make([]byte, size)
	mr, err := sv.pd.RegMR(buf, remoteRW|verbs.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	mw := bindType2(t, sv, mr, mr.Addr(), size/2, verbs.AccessRemoteWrite|verbs.AccessZeroBased)
	frmr, err := sv.pd.AllocMR(size / 2 / 4096)
	if err != nil {
		t.Fatal(err)
	}
	fastReg(t, sv, frmr, pages(buf[size/2:], 4096), 0, size/2, remoteRW)

	msg := make([]byte, size/2)
	fill(msg, 42)
	writeAndSync(t, cl, sv, msg, mw.Remote())
	fill(msg, 43)
	writeAndSync(t, cl, sv, msg, frmr.Remote())
	want := append([]byte(nil), buf...)
	fill(msg, 42)
	if !bytes.Equal(want[:size/2], msg) {
		t.Fatal("the Write through the window placed other bytes")
	}
	fill(msg, 43)
	if !bytes.Equal(want[size/2:], msg) {
		t.Fatal("the Write through the fast-register MR placed other bytes")
	}
	t.Logf("placed from segments: %d bytes", p.b.Stats().Segment.PlacedEarly)

	// The other connection's peer writes the window: refused, nothing placed.
	fill(cl3.buf, 44)
	post(t, cl3, verbs.SendWR{ID: 1, Op: verbs.OpWrite, SGL: []verbs.SGE{cl3.mr.SGE(0, 4096)}, RemoteAddr: 0, RKey: mw.RKey()})
	expectTerminate(t, p.b, cl3, termNotAssociated)
	if !bytes.Equal(buf, want) {
		t.Fatal("the other QP's Write changed the window's memory")
	}
}

// TestLocalInvalidateFences: a Local Invalidate issued while the peer's
// Writes stream into a fast-register MR completes only once no placement
// into it is in progress: from its completion on, the memory never
// changes again (and -race sees no write after the snapshot); the peer is
// refused with DDP invalid STag (a Write posted after the invalidation
// makes sure there is one).
func TestLocalInvalidateFences(t *testing.T) {
	cut := 0
	const rounds = 8
	for round := 0; round < rounds; round++ {
		p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
		cl, sv := connect(t, p, 1<<20, verbs.ConnParams{})
		frmr, err := sv.pd.AllocMR(256)
		if err != nil {
			t.Fatal(err)
		}
		pool := make([]byte, 1<<20)
		fastReg(t, sv, frmr, pages(pool, 4096), 0, len(pool), remoteRW)
		r := frmr.Remote()
		fill(cl.buf, uint64(round))
		final := make([]byte, len(pool)) // the pool once every Write is placed
		for i := 0; i < 200; i++ {
			off, src := (i%16)*(64<<10), (i*4096)%(len(cl.buf)-64<<10)
			copy(final[off:off+64<<10], cl.buf[src:])
			post(t, cl, verbs.SendWR{ID: uint64(i), Op: verbs.OpWrite, SGL: []verbs.SGE{cl.mr.SGE(src, 64<<10)}, RemoteAddr: r.Addr + uint64(off), RKey: r.RKey})
		}
		time.Sleep(time.Duration(round) * 300 * time.Microsecond)
		post(t, sv, verbs.SendWR{ID: 100, Op: verbs.OpLocalInv, Flags: verbs.Signaled, InvalidateRKey: r.RKey})
		mustOK(t, wait1(t, sv.scq), verbs.WCLocalInv, 0)
		snap := append([]byte(nil), pool...)
		if !bytes.Equal(snap, final) {
			cut++
		}
		// Refused already, or refused now. (The peer may still be
		// writing when the Terminate closes the stream: its own error may
		// then be the failed write rather than the Terminate it had no
		// time to read.)
		_ = cl.qp.PostSend(verbs.SendWR{ID: 101, Op: verbs.OpWrite, SGL: []verbs.SGE{cl.mr.SGE(0, 64)}, RemoteAddr: r.Addr, RKey: r.RKey})
		if ev := waitEvent(t, p.b, verbs.EventTerminateSent); ev.Term != termInvalidSTag {
			t.Fatalf("Terminate sent: %v, want %v", ev.Term, termInvalidSTag)
		}
		<-cl.qp.Done()
		if !bytes.Equal(pool, snap) {
			t.Fatalf("round %d: the memory changed after the Local Invalidate completed", round)
		}
	}
	t.Logf("%d of %d rounds invalidated while the Writes were still being placed", cut, rounds)
}

// TestType2WindowEndsWithQP: closing the QP a type 2 window is bound to
// invalidates the window, which releases its MR; a type 1 window outlives
// the QP that bound it.
func TestType2WindowEndsWithQP(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	_, sv := connect(t, p, 4096, verbs.ConnParams{})
	_, sv2 := connectSamePD(t, p, sv)
	mr, err := sv.pd.RegMR(make([]byte, 4096), remoteRW|verbs.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	mw2 := bindType2(t, sv2, mr, mr.Addr(), 64, verbs.AccessRemoteRead)
	mw1, err := sv.pd.AllocMW(verbs.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sv2.qp.BindMW(mw1, 1, verbs.Signaled, verbs.BindInfo{MR: mr, Addr: mr.Addr() + 64, Length: 64, Access: verbs.AccessRemoteRead}); err != nil {
		t.Fatal(err)
	}
	mustOK(t, wait1(t, sv2.scq), verbs.WCBindMW, 0)
	if err := sv2.qp.Close(); err != nil {
		t.Fatal(err)
	}
	if mw2.Valid() || !mw1.Valid() {
		t.Fatalf("after the QP closed: type 2 window valid %v, type 1 window valid %v", mw2.Valid(), mw1.Valid())
	}
	if err := mr.Dereg(); !errors.Is(err, verbs.ErrBusy) {
		t.Fatalf("Dereg with the type 1 window bound: %v", err)
	}
	mw1.Dealloc()
	mw2.Dealloc()
	if err := mr.Dereg(); err != nil {
		t.Fatal(err)
	}
}

// TestMemoryWRLocalErrors: a Read with local invalidate naming an STag
// that cannot be invalidated completes with StatusMWBind, and a window's
// STag used as an lkey with StatusLocalProtection; both take the QP down
// with a Terminate (RDMAP, local catastrophic error) on the wire.
func TestMemoryWRLocalErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status verbs.Status
		wr     func(cl *end, mw *verbs.MW) verbs.SendWR
	}{
		{"read-invalidating-type1-window", verbs.StatusMWBind, func(cl *end, mw *verbs.MW) verbs.SendWR {
			return verbs.SendWR{ID: 9, Op: verbs.OpReadInv, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(0, 8)},
				RemoteAddr: cl.remote.Addr, RKey: cl.remote.RKey, InvalidateRKey: mw.RKey()}
		}},
		{"window-as-lkey", verbs.StatusLocalProtection, func(cl *end, mw *verbs.MW) verbs.SendWR {
			r := mw.Remote()
			return verbs.SendWR{ID: 9, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{{Addr: r.Addr, Length: 8, LKey: r.RKey}}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
			cl, sv := connect(t, p, 4096, verbs.ConnParams{})
			mr, err := cl.pd.RegMR(make([]byte, 64), remoteRW|verbs.AccessMWBind)
			if err != nil {
				t.Fatal(err)
			}
			mw, err := cl.pd.AllocMW(verbs.MWType1)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cl.qp.BindMW(mw, 1, verbs.Signaled, verbs.BindInfo{MR: mr, Addr: mr.Addr(), Length: 64, Access: verbs.AccessRemoteRead}); err != nil {
				t.Fatal(err)
			}
			mustOK(t, wait1(t, cl.scq), verbs.WCBindMW, 0)
			post(t, cl, tc.wr(cl, mw))
			if wc := wait1(t, cl.scq); wc.ID != 9 || wc.Status != tc.status {
				t.Fatalf("completion %+v, want %v", wc, tc.status)
			}
			expectTerminate(t, p.a, sv, termLocalCatastroph)
		})
	}
}

// TestLocalInvalidateInSendQueueOrder: a Local Invalidate posted behind a
// Send from the MR it invalidates lets the Send go out first; with Fence,
// one posted behind a Read into the MR waits for the Read's data. The
// completions come in send queue order.
func TestLocalInvalidateInSendQueueOrder(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl, sv := connect(t, p, 1<<16, verbs.ConnParams{})
	frmr, err := cl.pd.AllocMR(16)
	if err != nil {
		t.Fatal(err)
	}
	pool := make([]byte, 16*4096)
	fill(pool, 9)
	fastReg(t, cl, frmr, pages(pool, 4096), 0, len(pool), remoteRW)
	if err := sv.qp.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{sv.mr.SGE(0, 1<<16)}}); err != nil {
		t.Fatal(err)
	}
	if err := cl.qp.PostSend(
		verbs.SendWR{ID: 1, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{frmr.SGE(0, 1<<16)}},
		verbs.SendWR{ID: 2, Op: verbs.OpLocalInv, Flags: verbs.Signaled, InvalidateRKey: frmr.LKey()},
	); err != nil {
		t.Fatal(err)
	}
	mustOK(t, wait1(t, cl.scq), verbs.WCSend, 1<<16)
	mustOK(t, wait1(t, cl.scq), verbs.WCLocalInv, 0)
	mustOK(t, wait1(t, sv.rcq), verbs.WCRecv, 1<<16)
	if !bytes.Equal(sv.buf, pool[:1<<16]) {
		t.Fatal("the Send ahead of the Local Invalidate carried other bytes")
	}

	fastReg(t, cl, frmr, pages(pool, 4096), 0, len(pool), remoteRW)
	clear(pool)
	fill(sv.buf, 10)
	if err := cl.qp.PostSend(
		verbs.SendWR{ID: 3, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{frmr.SGE(0, 1<<16)}, RemoteAddr: cl.remote.Addr, RKey: cl.remote.RKey},
		verbs.SendWR{ID: 4, Op: verbs.OpLocalInv, Flags: verbs.Signaled | verbs.Fence, InvalidateRKey: frmr.LKey()},
	); err != nil {
		t.Fatal(err)
	}
	mustOK(t, wait1(t, cl.scq), verbs.WCRead, 1<<16)
	mustOK(t, wait1(t, cl.scq), verbs.WCLocalInv, 0)
	if !bytes.Equal(pool[:1<<16], sv.buf) || frmr.Valid() {
		t.Fatal("the Read ahead of the fenced Local Invalidate did not land, or the MR is valid")
	}
}
