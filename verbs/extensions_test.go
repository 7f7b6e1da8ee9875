package verbs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/verbs"
)

// alignedBuf returns n bytes starting at an 8-byte aligned address.
func alignedBuf(n int) []byte {
	w := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), n)
}

// word returns the 64-bit word at off of b.
func word(b []byte, off int) *uint64 { return (*uint64)(unsafe.Pointer(&b[off])) }

// atomicTarget is an MR with remote atomic access in pd.
func atomicTarget(t testing.TB, pd *verbs.PD, n int) *verbs.MR {
	t.Helper()
	mr, err := pd.RegMR(alignedBuf(n), verbs.AccessLocalWrite|verbs.AccessRemoteAtomic)
	if err != nil {
		t.Fatal(err)
	}
	return mr
}

// result reads an atomic's original value from its 8-byte sink.
func result(e *end, off int) uint64 { return atomic.LoadUint64(word(e.buf, off)) }

func postAtomic(t testing.TB, e *end, id uint64, op verbs.Opcode, sink int, target *verbs.MR, off int, cmpAdd, swap uint64) {
	t.Helper()
	if err := e.qp.PostSend(verbs.SendWR{ID: id, Op: op, Flags: verbs.Signaled, SGL: []verbs.SGE{e.mr.SGE(sink, 8)},
		RemoteAddr: target.Addr() + uint64(off), RKey: target.RKey(), CompareAdd: cmpAdd, Swap: swap}); err != nil {
		t.Fatal(err)
	}
}

func TestAtomics(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl, sv := connect(t, p, 4096, verbs.ConnParams{})
	cl.buf = cl.mr.Bytes()
	target := atomicTarget(t, sv.pd, 64)
	w := word(target.Bytes(), 16)
	atomic.StoreUint64(w, 100)
	steps := []struct {
		op          verbs.Opcode
		cmpAdd      uint64
		swap        uint64
		orig, after uint64
	}{
		{verbs.OpAtomicFetchAdd, 5, 0, 100, 105},
		{verbs.OpAtomicCmpSwap, 105, 7, 105, 7},       // equal: swapped
		{verbs.OpAtomicCmpSwap, 105, 9, 7, 7},         // not equal: unchanged
		{verbs.OpAtomicFetchAdd, ^uint64(0), 0, 7, 6}, // adding -1
		{verbs.OpAtomicFetchAdd, 1 << 63, 0, 6, 6 + 1<<63},
		{verbs.OpAtomicCmpSwap, 6 + 1<<63, 0xfedcba9876543210, 6 + 1<<63, 0xfedcba9876543210},
	}
	for i, s := range steps {
		// Sinks at unaligned offsets work too (the value is stored in
		// host byte order either way).
		sink := 8*i + i%2
		postAtomic(t, cl, uint64(i), s.op, sink, target, 16, s.cmpAdd, s.swap)
		wc := wait1(t, cl.scq)
		want := verbs.WCFetchAdd
		if s.op == verbs.OpAtomicCmpSwap {
			want = verbs.WCCompSwap
		}
		mustOK(t, wc, want, 8)
		if wc.ID != uint64(i) {
			t.Fatalf("step %d: completion for WR %d", i, wc.ID)
		}
		got := *(*uint64)(unsafe.Pointer(&cl.buf[sink]))
		if got != s.orig {
			t.Fatalf("step %d (%v): original %#x, want %#x", i, s.op, got, s.orig)
		}
		if v := atomic.LoadUint64(w); v != s.after {
			t.Fatalf("step %d (%v): target %#x, want %#x", i, s.op, v, s.after)
		}
	}
	for i, b := range target.Bytes() {
		if (i < 16 || i >= 24) && b != 0 {
			t.Fatalf("byte %d next to the target changed", i)
		}
	}
	if a := p.b.Query().AtomicCap; a != verbs.AtomicGlob {
		t.Fatalf("atomic_cap %s", a)
	}
}

// TestAtomicsConcurrent: several QPs run FetchAdd (pipelined up to ORD)
// and CmpSwap increments on one word while a goroutine of the target's
// process adds to it with sync/atomic. The final value is exact, and the
// original values the FetchAdds and the local adds saw are all different:
// every increment saw a different predecessor.
func TestAtomicsConcurrent(t *testing.T) {
	const qps, perQP, casPerQP, batch = 4, 400, 40, 16
	const minLocal, maxLocal = 20000, 1 << 20
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	spd, err := p.b.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	target := atomicTarget(t, spd, 64)
	w := word(target.Bytes(), 8)
	const base = 1 << 40
	atomic.StoreUint64(w, base)
	var cls []*end
	for i := 0; i < qps; i++ {
		cl := newEnd(t, p.a, 8*batch, nil, nil)
		sv := newEnd(t, p.b, 64, nil, spd)
		connectEnds(t, p, cl, sv, verbs.ConnParams{})
		cls = append(cls, cl)
	}
	var mu sync.Mutex
	var seen []uint64
	var wg sync.WaitGroup
	errs := make(chan error, qps+1)
	for _, cl := range cls {
		wg.Add(1)
		go func(cl *end) {
			defer wg.Done()
			mine := make([]uint64, 0, perQP)
			wcs := make([]verbs.WC, batch)
			for done := 0; done < perQP; done += batch {
				for k := 0; k < batch; k++ {
					if err := cl.qp.PostSend(verbs.SendWR{ID: uint64(k), Op: verbs.OpAtomicFetchAdd, Flags: verbs.Signaled,
						SGL: []verbs.SGE{cl.mr.SGE(8*k, 8)}, RemoteAddr: target.Addr() + 8, RKey: target.RKey(), CompareAdd: 1}); err != nil {
						errs <- err
						return
					}
				}
				if err := drainOK(cl.scq, wcs, batch, verbs.WCFetchAdd); err != nil {
					errs <- err
					return
				}
				for k := 0; k < batch; k++ {
					mine = append(mine, atomic.LoadUint64(word(cl.buf, 8*k)))
				}
			}
			// CmpSwap increments: retry with the value the last one saw.
			expect := uint64(base)
			for n := 0; n < casPerQP; {
				if err := cl.qp.PostSend(verbs.SendWR{ID: 1, Op: verbs.OpAtomicCmpSwap, Flags: verbs.Signaled,
					SGL: []verbs.SGE{cl.mr.SGE(0, 8)}, RemoteAddr: target.Addr() + 8, RKey: target.RKey(),
					CompareAdd: expect, Swap: expect + 1}); err != nil {
					errs <- err
					return
				}
				if err := drainOK(cl.scq, wcs, 1, verbs.WCCompSwap); err != nil {
					errs <- err
					return
				}
				orig := atomic.LoadUint64(word(cl.buf, 0))
				if orig == expect {
					mine = append(mine, orig)
					n++
					expect++
				} else {
					expect = orig
				}
			}
			mu.Lock()
			seen = append(seen, mine...)
			mu.Unlock()
		}(cl)
	}
	// The local adder runs for as long as the QPs do; it keeps the first
	// maxLocal original values it saw (for the duplicate check) and
	// counts the rest.
	var remoteDone atomic.Bool
	var localN uint64
	localDone := make(chan struct{})
	go func() {
		defer close(localDone)
		mine := make([]uint64, 0, maxLocal)
		for !remoteDone.Load() || localN < minLocal {
			for k := 0; k < 64; k++ {
				v := atomic.AddUint64(w, 1) - 1
				if len(mine) < maxLocal {
					mine = append(mine, v)
				}
			}
			localN += 64
			runtime.Gosched()
		}
		mu.Lock()
		seen = append(seen, mine...)
		mu.Unlock()
	}()
	wg.Wait()
	remoteDone.Store(true)
	<-localDone
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	remote := qps * (perQP + casPerQP)
	total := remote + int(localN)
	t.Logf("%d remote atomics, %d local adds", remote, localN)
	if got := atomic.LoadUint64(w); got != base+uint64(total) {
		t.Fatalf("final value %d, want %d (lost %d updates)", got-base, total, int64(total)-int64(got-base))
	}
	if len(seen) != remote+min(int(localN), maxLocal) {
		t.Fatalf("%d originals, want %d", len(seen), remote+min(int(localN), maxLocal))
	}
	sort.Slice(seen, func(i, j int) bool { return seen[i] < seen[j] })
	for i, v := range seen {
		if v < base || v >= base+uint64(total) || i > 0 && v == seen[i-1] {
			t.Fatalf("original value %d seen twice or out of range", v-base)
		}
	}
	if localN <= maxLocal && (seen[0] != base || seen[len(seen)-1] != base+uint64(total)-1) {
		t.Fatalf("original values span [%d, %d], want [0, %d]", seen[0]-base, seen[len(seen)-1]-base, total-1)
	}
}

func samePlaced(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: placed bytes differ", what)
	}
}

// drainOK waits for n successful completions of op.
func drainOK(cq *verbs.CQ, wcs []verbs.WC, n int, op verbs.WCOpcode) error {
	for got := 0; got < n; {
		k, err := waitN(cq, wcs[:n-got])
		if err != nil {
			return err
		}
		for _, wc := range wcs[:k] {
			if wc.Status != verbs.StatusSuccess || wc.Op != op || wc.ByteLen != 8 {
				return &verbs.CompletionError{WC: wc}
			}
		}
		got += k
	}
	return nil
}

func waitN(cq *verbs.CQ, wcs []verbs.WC) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return cq.Wait(ctx, wcs)
}

// TestAtomicErrors: a misaligned target, an MR without remote atomic
// access, a bad rkey and a target past the MR's end each complete the
// atomic with an error status naming the peer's Terminate, whose layer,
// type and code the peer reports too; the WRs behind it are flushed.
func TestAtomicErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		remote func(target, plain *verbs.MR) (uint64, uint32)
		status verbs.Status
		code   verbs.TermCode
	}{
		{"misaligned", func(m, _ *verbs.MR) (uint64, uint32) { return m.Addr() + 4, m.RKey() },
			verbs.StatusRemoteOperation, verbs.TermCode{Layer: verbs.TermRDMAP, EType: iwarp.ETypeRemoteOperation, Code: iwarp.CodeUnspecified}},
		{"no-atomic-access", func(_, plain *verbs.MR) (uint64, uint32) { return plain.Addr(), plain.RKey() },
			verbs.StatusRemoteAccess, verbs.TermCode{Layer: verbs.TermRDMAP, EType: iwarp.ETypeRemoteProtection, Code: iwarp.CodeAccessRights}},
		{"bad-rkey", func(m, _ *verbs.MR) (uint64, uint32) { return m.Addr(), m.RKey() ^ 0x100 },
			verbs.StatusRemoteAccess, verbs.TermCode{Layer: verbs.TermRDMAP, EType: iwarp.ETypeRemoteProtection, Code: iwarp.CodeInvalidSTag}},
		{"out-of-bounds", func(m, _ *verbs.MR) (uint64, uint32) { return m.Addr() + 64, m.RKey() },
			verbs.StatusRemoteAccess, verbs.TermCode{Layer: verbs.TermRDMAP, EType: iwarp.ETypeRemoteProtection, Code: iwarp.CodeBaseBounds}},
		{"straddles-end", func(m, _ *verbs.MR) (uint64, uint32) { return m.Addr() + 60, m.RKey() },
			verbs.StatusRemoteAccess, verbs.TermCode{Layer: verbs.TermRDMAP, EType: iwarp.ETypeRemoteProtection, Code: iwarp.CodeBaseBounds}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
			cl, sv := connect(t, p, 4096, verbs.ConnParams{})
			target := atomicTarget(t, sv.pd, 64)
			addr, rkey := tc.remote(target, sv.mr)
			for i := range cl.buf[:8] {
				cl.buf[i] = 0xcc
			}
			if err := cl.qp.PostSend(
				verbs.SendWR{ID: 1, Op: verbs.OpAtomicFetchAdd, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(0, 8)},
					RemoteAddr: addr, RKey: rkey, CompareAdd: 1},
				verbs.SendWR{ID: 2, Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(8, 8)},
					RemoteAddr: sv.mr.Addr(), RKey: sv.mr.RKey()},
			); err != nil {
				t.Fatal(err)
			}
			var atomicWC verbs.WC
			for i := 0; i < 2; i++ {
				wc := wait1(t, cl.scq)
				if wc.ID == 1 {
					atomicWC = wc
				} else if wc.Status != verbs.StatusSuccess && wc.Status != verbs.StatusWRFlush {
					t.Fatalf("write completion %+v", wc)
				}
			}
			if atomicWC.Status != tc.status || atomicWC.Term != tc.code || atomicWC.Op != verbs.WCFetchAdd {
				t.Fatalf("atomic completion %v %v %v, want %v with %v", atomicWC.Op, atomicWC.Status, atomicWC.Term, tc.status, tc.code)
			}
			if !errors.Is(atomicWC.Err(), verbs.ErrTerminated) {
				t.Fatalf("completion error %v", atomicWC.Err())
			}
			ev := waitEvent(t, p.b, verbs.EventTerminateSent)
			if ev.Term != tc.code {
				t.Fatalf("peer sent %v, want %v", ev.Term, tc.code)
			}
			for i, b := range cl.buf[:8] {
				if b != 0xcc {
					t.Fatalf("sink byte %d changed", i)
				}
			}
			for i, b := range target.Bytes() {
				if b != 0 {
					t.Fatalf("target byte %d changed", i)
				}
			}
			<-cl.qp.Done()
			var te *verbs.TerminateError
			if !errors.As(cl.qp.Err(), &te) || !te.Received || te.Code != tc.code {
				t.Fatalf("requester error %v", cl.qp.Err())
			}
		})
	}
}

// TestORDCountsAtomics: with IRD and ORD 2, a burst of Reads and atomics
// mixed completes in order without the responder ever seeing a third
// request outstanding (it would Terminate: its IRD is strict).
func TestORDCountsAtomics(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl, sv := connect(t, p, 1<<16, verbs.ConnParams{IRD: 2, ORD: 2})
	if n := cl.conn.Negotiated(); n.ORD != 2 || sv.conn.Negotiated().IRD != 2 {
		t.Fatalf("negotiated %+v / %+v", n, sv.conn.Negotiated())
	}
	target := atomicTarget(t, sv.pd, 64)
	fill(sv.buf, 3)
	const n = 120
	wrs := make([]verbs.SendWR, 0, n)
	for i := 0; i < n; i++ {
		wr := verbs.SendWR{ID: uint64(i), Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(64*i, 8)}}
		switch i % 3 {
		case 0:
			wr.Op, wr.RemoteAddr, wr.RKey = verbs.OpRead, sv.mr.Addr()+uint64(64*i), sv.mr.RKey()
		case 1:
			wr.Op, wr.RemoteAddr, wr.RKey, wr.CompareAdd = verbs.OpAtomicFetchAdd, target.Addr(), target.RKey(), 1
		case 2:
			wr.Op, wr.RemoteAddr, wr.RKey, wr.CompareAdd, wr.Swap = verbs.OpAtomicCmpSwap, target.Addr()+8, target.RKey(), uint64(i-2)/3, uint64(i+1)/3
		}
		wrs = append(wrs, wr)
	}
	if err := cl.qp.PostSend(wrs...); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		wc := wait1(t, cl.scq)
		if wc.ID != uint64(i) || wc.Status != verbs.StatusSuccess {
			t.Fatalf("completion %d: %+v (%v); requester %v, responder %v", i, wc, wc.Err(), cl.qp.Err(), sv.qp.Err())
		}
		switch i % 3 {
		case 0:
			samePlaced(t, "read", cl.buf[64*i:64*i+8], sv.buf[64*i:64*i+8])
		case 1:
			if got := result(cl, 64*i); got != uint64(i/3) {
				t.Fatalf("FetchAdd %d saw %d", i, got)
			}
		case 2:
			if got := result(cl, 64*i); got != uint64(i-2)/3 {
				t.Fatalf("CmpSwap %d saw %d", i, got)
			}
		}
	}
	if v := atomic.LoadUint64(word(target.Bytes(), 0)); v != n/3 {
		t.Fatalf("FetchAdd target %d", v)
	}
	if v := atomic.LoadUint64(word(target.Bytes(), 8)); v != n/3 {
		t.Fatalf("CmpSwap target %d", v)
	}
	if s := p.b.Stats(); s.TerminatesSent != 0 || s.RxOps[verbs.RDMAPAtomicRequest] != 2*n/3 || s.RxOps[verbs.RDMAPReadRequest] != n/3 {
		t.Fatalf("responder stats: %d Terminates, %d atomics, %d reads", s.TerminatesSent, s.RxOps[verbs.RDMAPAtomicRequest], s.RxOps[verbs.RDMAPReadRequest])
	}
}

// TestWriteWithImmediate: the Write lands, and the peer's posted receive
// completes as RECV_RDMA_WITH_IMM with byte_len 0 and the immediate value;
// with Solicited, the completion says so. Each consumes one receive.
func TestWriteWithImmediate(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl, sv := connect(t, p, 8192, verbs.ConnParams{})
	for i := 0; i < 3; i++ {
		if err := sv.qp.PostRecv(verbs.RecvWR{ID: uint64(10 + i), SGL: []verbs.SGE{sv.mr.SGE(4096+64*i, 64)}}); err != nil {
			t.Fatal(err)
		}
	}
	fill(cl.buf, 7)
	for i, tc := range []struct {
		n     int
		flags verbs.SendFlags
		imm   uint32
	}{{1000, verbs.Signaled, 0xdeadbeef}, {0, verbs.Signaled | verbs.Solicited, 1}} {
		if err := cl.qp.PostSend(verbs.SendWR{ID: uint64(i), Op: verbs.OpWriteImm, Flags: tc.flags, Imm: tc.imm,
			SGL: []verbs.SGE{cl.mr.SGE(0, tc.n)}, RemoteAddr: sv.mr.Addr() + 8, RKey: sv.mr.RKey()}); err != nil {
			t.Fatal(err)
		}
		mustOK(t, wait1(t, cl.scq), verbs.WCWrite, tc.n)
		wc := wait1(t, sv.rcq)
		mustOK(t, wc, verbs.WCRecvRDMAWithImm, 0)
		if wc.ID != uint64(10+i) || wc.Flags&verbs.WCWithImm == 0 || wc.Imm != tc.imm {
			t.Fatalf("receive completion %+v, want ID %d with imm %#x", wc, 10+i, tc.imm)
		}
		if (wc.Flags&verbs.WCSolicited != 0) != (tc.flags&verbs.Solicited != 0) {
			t.Fatalf("solicited flag %v", wc.Flags)
		}
		if tc.n > 0 {
			samePlaced(t, "write with imm", sv.buf[8:8+tc.n], cl.buf[:tc.n])
		}
	}
	// The receive buffers were not written, and the third receive is
	// still posted: a plain Send takes it.
	for i, b := range sv.buf[4096 : 4096+128] {
		if b != 0 {
			t.Fatalf("receive buffer byte %d written", i)
		}
	}
	copy(cl.buf, "hello")
	if err := cl.qp.PostSend(verbs.SendWR{ID: 9, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(0, 5)}}); err != nil {
		t.Fatal(err)
	}
	mustOK(t, wait1(t, cl.scq), verbs.WCSend, 5)
	wc := wait1(t, sv.rcq)
	mustOK(t, wc, verbs.WCRecv, 5)
	if wc.ID != 12 || wc.Flags&verbs.WCWithImm != 0 {
		t.Fatalf("plain send completion %+v", wc)
	}
}

// TestSendWithImmediate: one receive per Send with Immediate, with the
// message, the value and the flags.
func TestSendWithImmediate(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl, sv := connect(t, p, 8192, verbs.ConnParams{})
	for i := 0; i < 3; i++ {
		if err := sv.qp.PostRecv(verbs.RecvWR{ID: uint64(20 + i), SGL: []verbs.SGE{sv.mr.SGE(2048*i, 2048)}}); err != nil {
			t.Fatal(err)
		}
	}
	fill(cl.buf, 9)
	for i, tc := range []struct {
		n     int
		flags verbs.SendFlags
		imm   uint32
	}{{13, verbs.Signaled, 42}, {2000, verbs.Signaled | verbs.Solicited, 0xffffffff}, {0, verbs.Signaled, 0}} {
		if err := cl.qp.PostSend(verbs.SendWR{ID: uint64(i), Op: verbs.OpSendImm, Flags: tc.flags, Imm: tc.imm,
			SGL: []verbs.SGE{cl.mr.SGE(0, tc.n)}}); err != nil {
			t.Fatal(err)
		}
		mustOK(t, wait1(t, cl.scq), verbs.WCSend, tc.n)
		wc := wait1(t, sv.rcq)
		mustOK(t, wc, verbs.WCRecv, tc.n)
		if wc.ID != uint64(20+i) || wc.Flags&verbs.WCWithImm == 0 || wc.Imm != tc.imm {
			t.Fatalf("receive completion %+v, want ID %d with imm %#x", wc, 20+i, tc.imm)
		}
		if (wc.Flags&verbs.WCSolicited != 0) != (tc.flags&verbs.Solicited != 0) {
			t.Fatalf("solicited flag %v", wc.Flags)
		}
		samePlaced(t, "send with imm", sv.buf[2048*i:2048*i+tc.n], cl.buf[:tc.n])
	}
	if n := sv.rcq.Len(); n != 0 {
		t.Fatalf("%d extra receive completions", n)
	}
}

// TestImmediateWithoutReceive: a Write with Immediate that finds no posted
// receive ends the connection with DDP "no buffer available", as a Send
// does.
func TestImmediateWithoutReceive(t *testing.T) {
	for _, op := range []verbs.Opcode{verbs.OpWriteImm, verbs.OpSendImm} {
		t.Run(op.String(), func(t *testing.T) {
			p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
			cl, sv := connect(t, p, 4096, verbs.ConnParams{})
			if err := cl.qp.PostSend(verbs.SendWR{ID: 1, Op: op, Imm: 5, SGL: []verbs.SGE{cl.mr.SGE(0, 16)},
				RemoteAddr: sv.mr.Addr(), RKey: sv.mr.RKey()}); err != nil {
				t.Fatal(err)
			}
			want := verbs.TermCode{Layer: verbs.TermDDP, EType: iwarp.ETypeUntaggedBuffer, Code: iwarp.CodeNoBuffer}
			if ev := waitEvent(t, p.b, verbs.EventTerminateSent); ev.Term != want {
				t.Fatalf("peer sent %v, want %v", ev.Term, want)
			}
			<-cl.qp.Done()
			var te *verbs.TerminateError
			if !errors.As(cl.qp.Err(), &te) || !te.Received || te.Code != want {
				t.Fatalf("requester error %v", cl.qp.Err())
			}
		})
	}
}

// TestPeerWithoutExtensions: against a peer that lacks RFC 7306 (as Linux
// siw does; here a device with NoExtensions), an atomic, a Write with
// Immediate and a Send with Immediate, signaled or not, complete with
// "remote operation error" naming the peer's Terminate (RDMAP Remote
// Operation / Unexpected OpCode), which takes the QP down. The device
// without them reports ATOMIC_NONE and refuses to post them.
func TestPeerWithoutExtensions(t *testing.T) {
	want := verbs.TermCode{Layer: verbs.TermRDMAP, EType: iwarp.ETypeRemoteOperation, Code: iwarp.CodeUnexpectedOpcode}
	for _, tc := range []struct {
		op       verbs.Opcode
		signaled bool
	}{{verbs.OpAtomicFetchAdd, true}, {verbs.OpWriteImm, true}, {verbs.OpSendImm, true}, {verbs.OpWriteImm, false}, {verbs.OpSendImm, false}} {
		op := tc.op
		t.Run(fmt.Sprintf("%v/signaled=%v", op, tc.signaled), func(t *testing.T) {
			p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{NoExtensions: true})
			if a := p.b.Query().AtomicCap; a != verbs.AtomicNone {
				t.Fatalf("atomic_cap %s", a)
			}
			cl, sv := connect(t, p, 4096, verbs.ConnParams{})
			if err := sv.qp.PostRecv(verbs.RecvWR{ID: 3, SGL: []verbs.SGE{sv.mr.SGE(0, 64)}}); err != nil {
				t.Fatal(err)
			}
			err := sv.qp.PostSend(verbs.SendWR{Op: op, SGL: []verbs.SGE{sv.mr.SGE(0, 8)}, RemoteAddr: cl.mr.Addr(), RKey: cl.mr.RKey()})
			if !errors.Is(err, iwarp.ErrInvalidWR) {
				t.Fatalf("post on the device without extensions: %v", err)
			}
			flags := verbs.SendFlags(0)
			if tc.signaled {
				flags = verbs.Signaled
			}
			if err := cl.qp.PostSend(verbs.SendWR{ID: 1, Op: op, Flags: flags, SGL: []verbs.SGE{cl.mr.SGE(0, 8)},
				RemoteAddr: sv.mr.Addr(), RKey: sv.mr.RKey(), CompareAdd: 1, Imm: 5}); err != nil {
				t.Fatal(err)
			}
			if ev := waitEvent(t, p.b, verbs.EventTerminateSent); ev.Term != want {
				t.Fatalf("peer sent %v, want %v", ev.Term, want)
			}
			// Never a success: the error the peer's Terminate names,
			// signaled or not (an error always completes).
			wc := wait1(t, cl.scq)
			if wc.ID != 1 || wc.Status != verbs.StatusRemoteOperation || wc.Term != want {
				t.Fatalf("completion %+v (status %v, terminate %v)", wc, wc.Status, wc.Term)
			}
			<-cl.qp.Done()
			var te *verbs.TerminateError
			if !errors.As(cl.qp.Err(), &te) || !te.Received || te.Code != want {
				t.Fatalf("requester error %v", cl.qp.Err())
			}
			// The peer's receive was not consumed by the refused message.
			if wc := wait1(t, sv.rcq); wc.ID != 3 || wc.Status != verbs.StatusWRFlush {
				t.Fatalf("peer's receive %+v", wc)
			}
		})
	}
}

// TestImmediateProbe: against a peer that takes Immediate Data, the first
// WRs with Immediate complete once the zero-length Read sent behind them
// is answered (what tells a peer without them, see
// TestPeerWithoutExtensions); after that, no Read follows them. Every WR
// completes successfully, in order, with its byte count, and the peer gets
// every immediate value.
func TestImmediateProbe(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl, sv := connect(t, p, 4096, verbs.ConnParams{})
	const n = 12
	for i := 0; i < n; i++ {
		if err := sv.qp.PostRecv(verbs.RecvWR{ID: uint64(100 + i), SGL: []verbs.SGE{sv.mr.SGE(2048, 64)}}); err != nil {
			t.Fatal(err)
		}
	}
	post := func(i int) {
		op := verbs.OpWriteImm
		if i%2 == 1 {
			op = verbs.OpSendImm
		}
		if err := cl.qp.PostSend(verbs.SendWR{ID: uint64(i), Op: op, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(0, 16+i)},
			RemoteAddr: sv.mr.Addr(), RKey: sv.mr.RKey(), Imm: uint32(1000 + i)}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(i int) {
		wc := wait1(t, cl.scq)
		if wc.ID != uint64(i) || wc.Status != verbs.StatusSuccess || wc.ByteLen != uint32(16+i) {
			t.Fatalf("WR %d: completion %+v", i, wc)
		}
		rc := wait1(t, sv.rcq)
		if rc.Status != verbs.StatusSuccess || rc.Flags&verbs.WCWithImm == 0 || rc.Imm != uint32(1000+i) {
			t.Fatalf("WR %d: receive %+v", i, rc)
		}
	}
	post(0)
	check(0)
	reads := p.a.Stats().TxOps[verbs.RDMAPReadRequest]
	if reads != 1 {
		t.Fatalf("%d Read Requests behind the first WR with Immediate, want 1", reads)
	}
	for i := 1; i < n; i++ {
		post(i)
	}
	for i := 1; i < n; i++ {
		check(i)
	}
	if r := p.a.Stats().TxOps[verbs.RDMAPReadRequest]; r != reads {
		t.Fatalf("%d more Read Requests once the peer answered one", r-reads)
	}
}

// TestTerminateBlamesItsMessage: with a Read outstanding before it, a WR
// with Immediate that a peer without RFC 7306 refuses gets the error its
// Terminate names (the Terminate carries the refused message's header),
// and the Read is flushed.
func TestTerminateBlamesItsMessage(t *testing.T) {
	want := verbs.TermCode{Layer: verbs.TermRDMAP, EType: iwarp.ETypeRemoteOperation, Code: iwarp.CodeUnexpectedOpcode}
	for _, op := range []verbs.Opcode{verbs.OpWriteImm, verbs.OpAtomicFetchAdd} {
		t.Run(op.String(), func(t *testing.T) {
			p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{NoExtensions: true})
			cl, sv := connect(t, p, 1<<20, verbs.ConnParams{})
			// The Read and the refused WR touch separate bytes on both
			// sides: the Write part of a Write with Immediate is placed
			// before its Immediate Data message is refused, and would
			// race with the Read Response's copy of the same bytes.
			const readLen = 1<<20 - 4096
			if err := cl.qp.PostSend(
				verbs.SendWR{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(0, readLen)}, RemoteAddr: sv.mr.Addr(), RKey: sv.mr.RKey()},
				verbs.SendWR{ID: 2, Op: op, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(1<<20-8, 8)}, RemoteAddr: sv.mr.Addr() + 1<<20 - 8, RKey: sv.mr.RKey(), CompareAdd: 1},
			); err != nil {
				t.Fatal(err)
			}
			got := map[uint64]verbs.WC{}
			for len(got) < 2 {
				wc := wait1(t, cl.scq)
				got[wc.ID] = wc
			}
			if wc := got[2]; wc.Status != verbs.StatusRemoteOperation || wc.Term != want {
				t.Fatalf("refused WR: %+v", wc)
			}
			// The Read: flushed, or answered if its response beat the
			// Terminate; never blamed.
			if wc := got[1]; wc.Status != verbs.StatusWRFlush && wc.Status != verbs.StatusSuccess {
				t.Fatalf("Read: %+v", wc)
			}
		})
	}
}

func TestRegMRAtomicAccess(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	pd, err := p.a.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pd.RegMR(alignedBuf(64), verbs.AccessRemoteAtomic); !errors.Is(err, verbs.ErrInvalidArgument) {
		t.Fatalf("remote atomic without local write: %v", err)
	}
	if _, err := pd.RegMR(alignedBuf(64), verbs.AccessRemoteAtomic|verbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
}

// TestExtensionPostsAllocateNothing: posting atomics and immediate WRs
// allocates nothing (on an unconnected QP, as TestDataPathAllocatesNothing).
func TestExtensionPostsAllocateNothing(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	e := newEnd(t, p.a, 4096, nil, nil)
	sgl := []verbs.SGE{e.mr.SGE(0, 8)}
	wrs := []verbs.SendWR{
		{ID: 1, Op: verbs.OpAtomicFetchAdd, SGL: sgl, RemoteAddr: 0x1000, RKey: 0x100, CompareAdd: 1},
		{ID: 2, Op: verbs.OpAtomicCmpSwap, SGL: sgl, RemoteAddr: 0x1000, RKey: 0x100, CompareAdd: 1, Swap: 2},
		{ID: 3, Op: verbs.OpWriteImm, SGL: sgl, RemoteAddr: 0x1000, RKey: 0x100, Imm: 7},
		{ID: 4, Op: verbs.OpSendImm, SGL: sgl, Imm: 8},
	}
	posted := 0
	allocs := testing.AllocsPerRun(40, func() {
		if posted < 50 {
			if err := e.qp.PostSend(wrs[posted%len(wrs)]); err != nil {
				t.Fatal(err)
			}
			posted++
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per post", allocs)
	}
}

// TestExtensionsAcrossModes: atomics and immediate data with the MPA CRC,
// with MPA markers, and with segment placement (its tap sees the new
// messages go by).
func TestExtensionsAcrossModes(t *testing.T) {
	yes := true
	for _, tc := range []struct {
		name string
		dc   verbs.DeviceConfig
	}{
		{"crc", verbs.DeviceConfig{CRC: true}},
		{"markers", verbs.DeviceConfig{Markers: true}},
		{"markers-crc", verbs.DeviceConfig{Markers: true, CRC: true}},
		{"segment", verbs.DeviceConfig{Placement: verbs.PlacementSegment}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, tc.dc, tc.dc)
			params := verbs.ConnParams{}
			if tc.dc.Markers {
				params.Markers = &yes
			}
			cl, sv := connect(t, p, 1<<14, params)
			if tc.dc.Markers && !cl.conn.Negotiated().MarkersRx {
				t.Fatal("no markers negotiated")
			}
			target := atomicTarget(t, sv.pd, 64)
			atomic.StoreUint64(word(target.Bytes(), 8), 41)
			postAtomic(t, cl, 1, verbs.OpAtomicFetchAdd, 0, target, 8, 1, 0)
			mustOK(t, wait1(t, cl.scq), verbs.WCFetchAdd, 8)
			postAtomic(t, cl, 2, verbs.OpAtomicCmpSwap, 8, target, 8, 42, 7)
			mustOK(t, wait1(t, cl.scq), verbs.WCCompSwap, 8)
			if result(cl, 0) != 41 || result(cl, 8) != 42 || atomic.LoadUint64(word(target.Bytes(), 8)) != 7 {
				t.Fatalf("originals %d %d, target %d", result(cl, 0), result(cl, 8), atomic.LoadUint64(word(target.Bytes(), 8)))
			}
			for i := 0; i < 2; i++ {
				if err := sv.qp.PostRecv(verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{sv.mr.SGE(8192, 8192)}}); err != nil {
					t.Fatal(err)
				}
			}
			fill(cl.buf[16:], 5)
			if err := cl.qp.PostSend(
				verbs.SendWR{ID: 3, Op: verbs.OpWriteImm, Flags: verbs.Signaled, Imm: 0x1234, SGL: []verbs.SGE{cl.mr.SGE(16, 5000)},
					RemoteAddr: sv.mr.Addr(), RKey: sv.mr.RKey()},
				verbs.SendWR{ID: 4, Op: verbs.OpSendImm, Flags: verbs.Signaled | verbs.Solicited, Imm: 0x5678, SGL: []verbs.SGE{cl.mr.SGE(16, 3000)}},
			); err != nil {
				t.Fatal(err)
			}
			mustOK(t, wait1(t, cl.scq), verbs.WCWrite, 5000)
			mustOK(t, wait1(t, cl.scq), verbs.WCSend, 3000)
			wc := wait1(t, sv.rcq)
			mustOK(t, wc, verbs.WCRecvRDMAWithImm, 0)
			if wc.ID != 0 || wc.Imm != 0x1234 || wc.Flags&verbs.WCWithImm == 0 {
				t.Fatalf("write imm completion %+v", wc)
			}
			samePlaced(t, "write with imm", sv.buf[:5000], cl.buf[16:5016])
			wc = wait1(t, sv.rcq)
			mustOK(t, wc, verbs.WCRecv, 3000)
			if wc.ID != 1 || wc.Imm != 0x5678 || wc.Flags&(verbs.WCWithImm|verbs.WCSolicited) != verbs.WCWithImm|verbs.WCSolicited {
				t.Fatalf("send imm completion %+v", wc)
			}
			samePlaced(t, "send with imm", sv.buf[8192:8192+3000], cl.buf[16:3016])
		})
	}
}
