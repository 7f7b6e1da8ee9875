package verbs_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
	"github.com/rdmatap/rdmatap/verbs/service"
	"github.com/rdmatap/rdmatap/zerocopy"
)

// Memory registration through the service: memOpsClient is application
// code for the verbs API that uses fast registration, Local Invalidate,
// RDMA Read with Invalidate, memory windows of both types (bound,
// invalidated locally and by the peer's Send with Invalidate) and
// RegMRIOVA;
// TestServiceSameCode runs it on an embedded device and through the
// service.

// memOps commands, each a Send of memCmdSize bytes to memOpsPeer: the
// command, a RemoteBuf and a seed. The peer answers each with a one-byte
// Send: memAck, or memBad when a Read did not find what it should, and
// the descriptor of its own buffer of fill(len, seed) after a Write
// command that names no buffer (RKey 0).
const (
	memWrite   = 'W' // RDMA Write fill(len, seed) to the buffer
	memRead    = 'R' // RDMA Read the buffer and compare it with fill(len, seed)
	memInv     = 'I' // answer with a Send with Invalidate of the buffer's STag
	memQuit    = 'Q'
	memAck     = 'A'
	memBad     = 'X'
	memCmdSize = 22
	memBufSize = 256 << 10
)

// memOpsClient connects to raddr (memOpsPeer) and has the peer write into
// and read from memory it registers by every means but RegMR, checking
// every byte and the objects' state as it goes.
func memOpsClient(ctx context.Context, d *verbs.Device, raddr netip.AddrPort, seed uint64) error {
	q, err := openTestQP(d)
	if err != nil {
		return err
	}
	defer q.close()
	// Send and receive completions come in no set order between the two
	// queues: one CQ each.
	pd, cq, rcq, qp := q.pd, q.scq, q.rcq, q.qp
	mem, err := zerocopy.AllocShared("memops", memBufSize)
	if err != nil {
		return err
	}
	defer mem.Close()
	buf := mem.Bytes()
	// [0:64K) commands and answers, [64K:128K) pages for MapPages (a
	// fast-register MR of a service maps only registered memory); the MR
	// for windows and MapSG is [128K:256K).
	ctl, err := pd.RegMR(buf[:128<<10], verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	defer ctl.Dereg()
	mr, err := pd.RegMR(buf[128<<10:], verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead|verbs.AccessMWBind)
	if err != nil {
		return err
	}
	defer mr.Dereg()
	conn, err := d.Dial(ctx, qp, raddr, verbs.ConnParams{})
	if err != nil {
		return err
	}
	var id uint64
	// wait waits for the next completion, which must be op.
	wait := func(op verbs.WCOpcode) error {
		_, err := waitWC(ctx, cq, op, -1)
		return err
	}
	// command sends a command and waits for the answer.
	var answer verbs.WC
	command := func(c byte, rb verbs.RemoteBuf, s uint64) error {
		id++
		if err := qp.PostRecv(verbs.RecvWR{ID: id, SGL: []verbs.SGE{ctl.SGE(1<<10, 1+verbs.RemoteBufSize)}}); err != nil {
			return err
		}
		cmd := buf[:memCmdSize]
		cmd[0] = c
		rb.AppendBinary(cmd[1:1])
		cmd[21] = byte(s)
		if err := qp.PostSend(verbs.SendWR{ID: id, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{ctl.SGE(0, memCmdSize)}}); err != nil {
			return err
		}
		if err := wait(verbs.WCSend); err != nil {
			return err
		}
		if answer, err = waitWC(ctx, rcq, verbs.WCRecv, 1+verbs.RemoteBufSize); err != nil {
			return fmt.Errorf("command %c: %w (QP: %v)", c, err, qp.Err())
		}
		if buf[1<<10] != memAck {
			return fmt.Errorf("command %c: the peer answers %q", c, buf[1<<10])
		}
		return nil
	}
	want := func(n int, s uint64) []byte {
		w := make([]byte, n)
		fill(w, s)
		return w
	}

	// 1. Fast registration over four separate pages of the first 64 KiB
	// of [64K:128K), mapped by MapPages from byte 100; the peer writes
	// 12000 bytes through it.
	frmr, err := pd.AllocMR(8)
	if err != nil {
		return err
	}
	defer frmr.Dereg()
	var pgs [][]byte
	for i := 0; i < 4; i++ {
		off := 64<<10 + i*8<<10 // every other 4 KiB page: a page list
		pgs = append(pgs, buf[off:off+4096:off+4096])
	}
	if err := frmr.MapPages(pgs, 4096, 100, 12000); err != nil {
		return err
	}
	rkey := verbs.IncRKey(frmr.RKey())
	id++
	if err := qp.PostSend(frmr.RegWR(id, verbs.Signaled, rkey, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)); err != nil {
		return err
	}
	if err := wait(verbs.WCRegMR); err != nil {
		return err
	}
	if !frmr.Valid() || frmr.RKey() != rkey || frmr.Len() != 12000 || frmr.Addr() != iwarp.BufferAddr(pgs[0])+100 {
		return fmt.Errorf("after REG_MR: valid %v, rkey %#x (want %#x), len %d, addr %#x", frmr.Valid(), frmr.RKey(), rkey, frmr.Len(), frmr.Addr())
	}
	if err := command(memWrite, frmr.Remote(), seed); err != nil {
		return err
	}
	got := bytes.Join(pgs, nil)[100 : 100+12000]
	if !bytes.Equal(got, want(12000, seed)) {
		return errors.New("the peer's Write through the fast-register MR did not land in its pages")
	}

	// 2. Local Invalidate, then register it again (the next key) over
	// 32 KiB of the MR by MapSG, zero-based, with a new IOVA ignored.
	id++
	if err := qp.PostSend(verbs.SendWR{ID: id, Op: verbs.OpLocalInv, Flags: verbs.Signaled, InvalidateRKey: rkey}); err != nil {
		return err
	}
	if err := wait(verbs.WCLocalInv); err != nil {
		return err
	}
	if frmr.Valid() {
		return errors.New("fast-register MR valid after Local Invalidate")
	}
	if err := frmr.MapSG([]verbs.SGE{mr.SGE(0, 16<<10), mr.SGE(16<<10, 16<<10)}, 4096); err != nil {
		return err
	}
	if err := frmr.SetIOVA(1 << 44); err != nil {
		return err
	}
	rkey = verbs.IncRKey(rkey)
	id++
	if err := qp.PostSend(frmr.RegWR(id, verbs.Signaled, rkey, verbs.AccessLocalWrite|verbs.AccessZeroBased)); err != nil {
		return err
	}
	if err := wait(verbs.WCRegMR); err != nil {
		return err
	}
	if frmr.Addr() != 0 || frmr.Len() != 32<<10 || !bytes.Equal(frmr.Bytes(), buf[128<<10:160<<10]) {
		return fmt.Errorf("after the second REG_MR: addr %#x, len %d", frmr.Addr(), frmr.Len())
	}

	// 3. RDMA Read with Invalidate into it: the peer's memory (which it
	// fills with fill(32K, seed+1) when asked to write there) lands at
	// zero-based offset 0, and the MR is invalid when the Read completes.
	if err := command(memWrite, verbs.RemoteBuf{Len: 32 << 10}, seed+1); err != nil {
		return err
	}
	var peerMR verbs.RemoteBuf
	if err := peerMR.UnmarshalBinary(buf[1<<10+1 : 1<<10+1+verbs.RemoteBufSize]); err != nil {
		return err
	}
	id++
	if err := qp.PostSend(verbs.SendWR{ID: id, Op: verbs.OpReadInv, Flags: verbs.Signaled, SGL: []verbs.SGE{frmr.SGE(0, 32<<10)},
		RemoteAddr: peerMR.Addr, RKey: peerMR.RKey, InvalidateRKey: rkey}); err != nil {
		return err
	}
	if err := wait(verbs.WCRead); err != nil {
		return err
	}
	if frmr.Valid() {
		return errors.New("fast-register MR valid after a Read with Invalidate")
	}
	if !bytes.Equal(buf[128<<10:160<<10], want(32<<10, seed+1)) {
		return errors.New("Read with Invalidate data differs")
	}

	// 4. A type 1 window over [160K:164K) of the MR for the peer to
	// write, then unbound.
	mw1, err := pd.AllocMW(verbs.MWType1)
	if err != nil {
		return err
	}
	defer mw1.Dealloc()
	id++
	stag, err := qp.BindMW(mw1, id, verbs.Signaled, verbs.BindInfo{MR: mr, Addr: mr.SGE(32<<10, 0).Addr, Length: 4096, Access: verbs.AccessRemoteWrite})
	if err != nil {
		return err
	}
	if err := wait(verbs.WCBindMW); err != nil {
		return err
	}
	if !mw1.Valid() || mw1.RKey() != stag || mw1.Type() != verbs.MWType1 || mw1.Remote().Len != 4096 {
		return fmt.Errorf("type 1 window after bind: valid %v, rkey %#x (bound %#x), %+v", mw1.Valid(), mw1.RKey(), stag, mw1.Remote())
	}
	if err := command(memWrite, mw1.Remote(), seed+2); err != nil {
		return err
	}
	if !bytes.Equal(buf[160<<10:164<<10], want(4096, seed+2)) {
		return errors.New("the peer's Write through the type 1 window did not land")
	}
	id++
	if _, err := qp.BindMW(mw1, id, verbs.Signaled, verbs.BindInfo{MR: mr}); err != nil {
		return err
	}
	if err := wait(verbs.WCBindMW); err != nil {
		return err
	}
	if mw1.Valid() {
		return errors.New("type 1 window valid after a zero-length bind")
	}

	// 5. A type 2 window over [168K:176K), zero-based, read-only, bound
	// by a work request; the peer reads it; Local Invalidate.
	fill(buf[168<<10:176<<10], seed+3)
	mw2, err := pd.AllocMW(verbs.MWType2)
	if err != nil {
		return err
	}
	defer mw2.Dealloc()
	wkey := verbs.IncRKey(mw2.RKey())
	id++
	if err := qp.PostSend(mw2.BindWR(id, verbs.Signaled, wkey, verbs.BindInfo{MR: mr, Addr: mr.SGE(40<<10, 0).Addr, Length: 8 << 10,
		Access: verbs.AccessRemoteRead | verbs.AccessZeroBased})); err != nil {
		return err
	}
	if err := wait(verbs.WCBindMW); err != nil {
		return err
	}
	if !mw2.Valid() || mw2.RKey() != wkey || mw2.Remote() != (verbs.RemoteBuf{Addr: 0, Len: 8 << 10, RKey: wkey}) {
		return fmt.Errorf("type 2 window after bind: valid %v, %+v", mw2.Valid(), mw2.Remote())
	}
	if err := command(memRead, mw2.Remote(), seed+3); err != nil {
		return err
	}
	id++
	if err := qp.PostSend(verbs.SendWR{ID: id, Op: verbs.OpLocalInv, Flags: verbs.Signaled, InvalidateRKey: wkey}); err != nil {
		return err
	}
	if err := wait(verbs.WCLocalInv); err != nil {
		return err
	}
	if mw2.Valid() {
		return errors.New("type 2 window valid after Local Invalidate")
	}
	// Bound again (the next key), and invalidated by the peer's Send
	// with Invalidate.
	wkey = verbs.IncRKey(wkey)
	id++
	if err := qp.PostSend(mw2.BindWR(id, verbs.Signaled, wkey, verbs.BindInfo{MR: mr, Addr: mr.SGE(40<<10, 0).Addr, Length: 8 << 10,
		Access: verbs.AccessRemoteRead})); err != nil {
		return err
	}
	if err := wait(verbs.WCBindMW); err != nil {
		return err
	}
	if !mw2.Valid() || mw2.Remote().Addr != mr.SGE(40<<10, 0).Addr {
		return fmt.Errorf("type 2 window bound again: valid %v, %+v", mw2.Valid(), mw2.Remote())
	}
	if err := command(memInv, mw2.Remote(), 0); err != nil {
		return err
	}
	if answer.Flags&verbs.WCWithInvalidate == 0 || answer.InvalidatedRKey != wkey || mw2.Valid() {
		return fmt.Errorf("after the peer's Send with Invalidate: flags %v, invalidated %#x (window %#x), valid %v",
			answer.Flags, answer.InvalidatedRKey, wkey, mw2.Valid())
	}

	// 6. RegMRIOVA: the peer writes through an IOVA of our choosing.
	iovaMR, err := pd.RegMRIOVA(buf[192<<10:200<<10], 0x7000_0000_0000, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		return err
	}
	defer iovaMR.Dereg()
	if iovaMR.Addr() != 0x7000_0000_0000 {
		return fmt.Errorf("RegMRIOVA: address %#x", iovaMR.Addr())
	}
	if err := command(memWrite, iovaMR.Remote(), seed+4); err != nil {
		return err
	}
	if !bytes.Equal(buf[192<<10:200<<10], want(8<<10, seed+4)) {
		return errors.New("the peer's Write through the IOVA did not land")
	}
	if err := command(memQuit, verbs.RemoteBuf{}, 0); err != nil {
		return err
	}
	return conn.Disconnect(ctx)
}

// memOpsPeer serves memOpsClient's commands on one connection.
func memOpsPeer(ctx context.Context, l *verbs.Listener, d *verbs.Device) error {
	q, err := openTestQP(d)
	if err != nil {
		return err
	}
	defer q.close()
	pd, cq, rcq, qp := q.pd, q.scq, q.rcq, q.qp
	buf := make([]byte, 128<<10)
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err != nil {
		return err
	}
	defer mr.Dereg()
	req, err := l.GetRequest(ctx)
	if err != nil {
		return err
	}
	post := func() error {
		return qp.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{mr.SGE(0, memCmdSize)}})
	}
	if err := post(); err != nil {
		return err
	}
	if _, err := req.Accept(ctx, qp, verbs.ConnParams{}); err != nil {
		return err
	}
	for {
		if _, err := waitWC(ctx, rcq, verbs.WCRecv, memCmdSize); err != nil {
			return err
		}
		var rb verbs.RemoteBuf
		if err := rb.UnmarshalBinary(buf[1:21]); err != nil {
			return err
		}
		c, s := buf[0], uint64(buf[21])
		if err := post(); err != nil {
			return err
		}
		ans := byte(memAck)
		switch c {
		case memWrite:
			data := buf[32<<10 : 32<<10+rb.Len]
			fill(data, s)
			if rb.RKey == 0 {
				own, err := mr.Remote().Slice(32<<10, rb.Len)
				if err != nil {
					return err
				}
				own.AppendBinary(buf[64<<10+1 : 64<<10+1])
				break
			}
			if err := qp.PostSend(verbs.SendWR{ID: 2, Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{mr.SGE(32<<10, int(rb.Len))},
				RemoteAddr: rb.Addr, RKey: rb.RKey}); err != nil {
				return err
			}
			if _, err := waitWC(ctx, cq, verbs.WCWrite, -1); err != nil {
				return err
			}
		case memRead:
			if err := qp.PostSend(verbs.SendWR{ID: 3, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{mr.SGE(96<<10, int(rb.Len))},
				RemoteAddr: rb.Addr, RKey: rb.RKey}); err != nil {
				return err
			}
			if _, err := waitWC(ctx, cq, verbs.WCRead, -1); err != nil {
				return err
			}
			w := make([]byte, rb.Len)
			fill(w, s)
			if !bytes.Equal(buf[96<<10:96<<10+rb.Len], w) {
				ans = memBad
			}
		}
		buf[64<<10] = ans
		wr := verbs.SendWR{ID: 4, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{mr.SGE(64<<10, 1+verbs.RemoteBufSize)}}
		if c == memInv {
			wr.Op, wr.InvalidateRKey = verbs.OpSendInvalidate, rb.RKey
		}
		if err := qp.PostSend(wr); err != nil {
			return err
		}
		if _, err := waitWC(ctx, cq, verbs.WCSend, 1+verbs.RemoteBufSize); err != nil {
			return err
		}
		if c == memQuit {
			select {
			case <-qp.Done():
			case <-ctx.Done():
				return ctx.Err()
			}
			return nil
		}
	}
}

// runMemOps runs memOpsClient on d against an embedded peer device.
func runMemOps(t *testing.T, d, peer *verbs.Device, peerAddr netip.Addr, seed uint64) {
	t.Helper()
	runAgainstPeer(t, d, peer, peerAddr, seed,
		func(ctx context.Context, l *verbs.Listener) error { return memOpsPeer(ctx, l, peer) }, memOpsClient)
}

// TestServiceFastRegIsolation: a fast-register MR of a service maps only
// memory its own client registered. Pages outside the client's MRs —
// unregistered pages of its own memfd, Go memory, another client's
// registered pages, a run that leaves an MR, addresses of the service's
// own memory — are refused with ErrInvalidArgument; so is an SGE naming
// another client's MR, and a window bound to another client's MR fails.
// Pages a registration maps stay mapped in the service while it may use
// them, even after the client deregisters the MR they came from, and are
// unmapped when the fast-register MR is freed.
func TestServiceFastRegIsolation(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	peerAddr := p.nb.Addrs()[0].Addr()
	path, _ := startService(t, p.a, service.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sink, err := p.b.Listen(netip.AddrPort{}, verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	sinkDone := make(chan struct{})
	go func() { defer close(sinkDone); sinkPeer(ctx, p.b, sink) }()
	defer func() { cancel(); <-sinkDone }()
	sinkAddr := netip.AddrPortFrom(peerAddr, sink.Addr().Port())

	a := connectService(t, path)
	apd, _ := a.AllocPD()
	amem, err := zerocopy.AllocShared("frisolation-a", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer amem.Close()
	abuf := amem.Bytes()
	for i := range abuf {
		abuf[i] = 0xAA
	}
	// Only the first half is registered.
	amr, err := apd.RegMR(abuf[:512<<10], verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	b := connectService(t, path)
	bpd, _ := b.AllocPD()
	bmem, err := zerocopy.AllocShared("b", 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer bmem.Close()
	bmr, err := bpd.RegMR(bmem.Bytes(), verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	frmr, err := apd.AllocMR(16)
	if err != nil {
		t.Fatal(err)
	}
	goMem := make([]byte, 3*4096)
	aligned := goMem[4096-int(iwarp.BufferAddr(goMem)%4096):]
	for _, c := range []struct {
		name  string
		pages [][]byte
	}{
		{"unregistered pages of its own memfd", [][]byte{abuf[600<<10 : 604<<10]}},
		{"Go memory", [][]byte{aligned[:4096]}},
		{"another client's registered pages", [][]byte{bmem.Bytes()[:4096]}},
		{"a run that leaves its MR", [][]byte{abuf[508<<10 : 512<<10], abuf[512<<10 : 516<<10]}},
		{"a registered page, then an unregistered one", [][]byte{abuf[:4096], abuf[700<<10 : 704<<10]}},
	} {
		if err := frmr.MapPages(c.pages, 4096, 0, 4096*len(c.pages)); !errors.Is(err, verbs.ErrInvalidArgument) {
			t.Errorf("MapPages over %s: %v", c.name, err)
		}
	}
	if err := frmr.MapSG([]verbs.SGE{bmr.SGE(0, 4096)}, 4096); !errors.Is(err, verbs.ErrInvalidArgument) {
		t.Errorf("MapSG over another client's MR: %v", err)
	}

	// A raw client names addresses of the service's own memory.
	r, m := dialRaw(t, path, svc.Version)
	if m.Status() != svc.StatusOK {
		t.Fatalf("HELLO: %d", m.Status())
	}
	pdh := r.alive()
	m, _ = r.call(svc.TAllocMR, []uint64{pdh, 16}, nil)
	if m.Status() != svc.StatusOK {
		t.Fatalf("ALLOC_MR: %d", m.Status())
	}
	frh := m.Arg(0)
	run := func(addr, n uint64) []byte {
		e := binary.LittleEndian.AppendUint64(nil, addr)
		return binary.LittleEndian.AppendUint64(e, n)
	}
	for _, c := range []struct {
		name string
		ents []byte
	}{
		{"the service's heap", run(iwarp.BufferAddr(goMem)&^4095, 1)},
		{"the service's client A's pages", run(iwarp.BufferAddr(abuf), 1)},
		{"page zero", run(0, 1)},
		{"2^31 pages", run(iwarp.BufferAddr(abuf), 1<<31)},
		{"a run that wraps", run(1<<64-4096, 2)},
	} {
		m, _ := r.call(svc.TMapMR, []uint64{frh, svc.MapPages | svc.MapFirst | svc.MapLast, 4096, 0, 4096}, [][]byte{c.ents})
		if m.Status() != svc.StatusInvalidArgument {
			t.Errorf("MAP_MR over %s: status %d", c.name, m.Status())
		}
	}
	sg := binary.LittleEndian.AppendUint64(nil, bmr.SGE(0, 0).Addr)
	sg = binary.LittleEndian.AppendUint32(sg, 4096)
	sg = binary.LittleEndian.AppendUint32(sg, bmr.LKey())
	if m, _ := r.call(svc.TMapMR, []uint64{frh, svc.MapSG | svc.MapFirst | svc.MapLast, 4096, 0, 0}, [][]byte{sg}); m.Status() != svc.StatusInvalidArgument {
		t.Errorf("MAP_MR over client B's lkey: status %d", m.Status())
	}
	// Entries without end, past what the MR could map.
	big := make([]byte, svc.MapEntries*svc.MapEntrySize)
	var st uint32
	for i := 0; i < 3 && st == svc.StatusOK; i++ {
		m, _ := r.call(svc.TMapMR, []uint64{frh, svc.MapPages, 4096, 0, 0}, [][]byte{big})
		st = m.Status()
	}
	if st != svc.StatusInvalidArgument {
		t.Errorf("MAP_MR entries beyond the MR's pages: status %d", st)
	}
	r.alive()

	// A window of client A bound to client B's MR fails.
	acq, _ := a.CreateCQ(16)
	aqp, err := apd.CreateQP(verbs.QPConfig{SendCQ: acq, RecvCQ: acq})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Dial(ctx, aqp, sinkAddr, verbs.ConnParams{}); err != nil {
		t.Fatal(err)
	}
	mw, err := apd.AllocMW(verbs.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := aqp.BindMW(mw, 1, verbs.Signaled, verbs.BindInfo{MR: bmr, Addr: bmr.Addr(), Length: 4096, Access: verbs.AccessRemoteWrite}); err == nil {
		wc, err := waitWC(ctx, acq, verbs.WCBindMW, -1)
		if err == nil || wc.Status != verbs.StatusMWBind {
			t.Errorf("a window bound to another client's MR: %v, %v", wc.Status, err)
		}
	} else if !errors.Is(err, iwarp.ErrInvalidWR) {
		t.Errorf("a window bound to another client's MR: %v", err)
	}
	if mw.Valid() {
		t.Error("the window is valid")
	}
	mw.Dealloc()

	// The registered pages: 64 KiB of A's MR, which the sink writes into
	// over a second connection; A deregisters the MR meanwhile.
	if err := frmr.MapPages(pages(abuf[64<<10:128<<10], 4096), 4096, 0, 64<<10); err != nil {
		t.Fatal(err)
	}
	// (The failed bind took aqp to ERROR: another QP registers.)
	cq3, _ := a.CreateCQ(16)
	qp3, err := apd.CreateQP(verbs.QPConfig{SendCQ: cq3, RecvCQ: cq3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Dial(ctx, qp3, sinkAddr, verbs.ConnParams{}); err != nil {
		t.Fatal(err)
	}
	rkey := verbs.IncRKey(frmr.RKey())
	if err := qp3.PostSend(frmr.RegWR(2, verbs.Signaled, rkey, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)); err != nil {
		t.Fatal(err)
	}
	if _, err := waitWC(ctx, cq3, verbs.WCRegMR, -1); err != nil {
		t.Fatal(err)
	}
	cq2, _ := a.CreateCQ(16)
	qp2, err := apd.CreateQP(verbs.QPConfig{SendCQ: cq2, RecvCQ: cq2})
	if err != nil {
		t.Fatal(err)
	}
	target, _ := frmr.Remote().MarshalBinary()
	c2, err := a.Dial(ctx, qp2, sinkAddr, verbs.ConnParams{PrivateData: target})
	if err != nil {
		t.Fatal(err)
	}
	// The sink, the responder, sends once we have (MPA's first FPDU).
	var sinkMR verbs.RemoteBuf
	if err := sinkMR.UnmarshalBinary(c2.PeerPrivateData()); err != nil {
		t.Fatal(err)
	}
	if err := qp2.PostSend(verbs.SendWR{ID: 3, Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{amr.SGE(0, 8)},
		RemoteAddr: sinkMR.Addr, RKey: sinkMR.RKey}); err != nil {
		t.Fatal(err)
	}
	if _, err := waitWC(ctx, cq2, verbs.WCWrite, -1); err != nil {
		t.Fatal(err)
	}
	if err := amr.Dereg(); err != nil {
		t.Fatal(err)
	}
	// The sink's Writes (of zeros) go on landing in the pages.
	deadline := time.Now().Add(5 * time.Second)
	for abuf[128<<10-1] != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if abuf[128<<10-1] != 0 || abuf[64<<10-1] != 0xAA || abuf[128<<10] != 0xAA {
		t.Fatalf("the sink's Writes through the fast-register MR: last byte %#x, bytes around %#x %#x", abuf[128<<10-1], abuf[64<<10-1], abuf[128<<10])
	}
	// A's memfd is mapped twice: by this process as the client, and by
	// the service, which still holds the pages.
	if n := memfdMaps(t, "frisolation-a"); n != 2 {
		t.Fatalf("A's memory is mapped %d times while the fast-register MR maps it, want 2", n)
	}
	if err := frmr.Dereg(); err != nil {
		t.Fatal(err)
	}
	// Freed: the service has let the pages go.
	deadline = time.Now().Add(5 * time.Second)
	for memfdMaps(t, "frisolation-a") != 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := memfdMaps(t, "frisolation-a"); n != 1 {
		t.Errorf("A's memory is mapped %d times after the fast-register MR was freed, want 1 (the client's)", n)
	}
}

// memfdMaps counts this process's mappings of memfds named name.
func memfdMaps(t *testing.T, name string) int {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(maps, []byte("/memfd:"+name+" "))
}

// memErrs is application code that makes the memory registration calls
// and work requests fail in every way it can without a connection, and
// returns what each failure matched, for TestServiceMemErrors to compare
// between an embedded device and a device of a service.
func memErrs(d *verbs.Device) ([]string, error) {
	pd, err := d.AllocPD()
	if err != nil {
		return nil, err
	}
	defer pd.Close()
	cq, err := d.CreateCQ(16)
	if err != nil {
		return nil, err
	}
	defer cq.Close()
	qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendSGE: 2})
	if err != nil {
		return nil, err
	}
	defer qp.Close()
	mem, err := zerocopy.AllocShared("memerrs", 64<<10)
	if err != nil {
		return nil, err
	}
	defer mem.Close()
	buf := mem.Bytes()
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessMWBind)
	if err != nil {
		return nil, err
	}
	defer mr.Dereg()
	frmr, err := pd.AllocMR(4)
	if err != nil {
		return nil, err
	}
	defer frmr.Dereg()
	mw1, err := pd.AllocMW(verbs.MWType1)
	if err != nil {
		return nil, err
	}
	defer mw1.Dealloc()
	mw2, err := pd.AllocMW(verbs.MWType2)
	if err != nil {
		return nil, err
	}
	defer mw2.Dealloc()
	var out []string
	note := func(name string, err error) {
		s := name + ":"
		for _, c := range []struct {
			n string
			e error
		}{{"invalid-argument", verbs.ErrInvalidArgument}, {"invalid-wr", iwarp.ErrInvalidWR}, {"too-many-sge", verbs.ErrTooManySGE},
			{"busy", verbs.ErrBusy}, {"unsupported", verbs.ErrUnsupported}} {
			if errors.Is(err, c.e) {
				s += " " + c.n
			}
		}
		var pe *verbs.PostError
		if errors.As(err, &pe) {
			s += fmt.Sprintf(" post-error@%d", pe.Index)
		}
		if err == nil {
			s += " ok"
		}
		out = append(out, s)
	}
	_, err = pd.AllocMR(0)
	note("AllocMR(0)", err)
	_, err = pd.AllocMR(iwarp.MaxFastRegPages + 1)
	note("AllocMR(too many)", err)
	note("SetIOVA before a mapping", frmr.SetIOVA(1))
	pg := pages(buf[:5*4096], 4096)
	note("MapPages(none)", frmr.MapPages(nil, 4096, 0, 0))
	note("MapPages(page size 1000)", frmr.MapPages(pg[:1], 1000, 0, 10))
	note("MapPages(offset past the page)", frmr.MapPages(pg[:1], 4096, 4096, 0))
	note("MapPages(length past the pages)", frmr.MapPages(pg[:1], 4096, 0, 4097))
	note("MapPages(a short page)", frmr.MapPages([][]byte{buf[:100]}, 4096, 0, 10))
	note("MapPages(5 pages of 4)", frmr.MapPages(pg, 4096, 0, 10))
	note("MapSG(none)", frmr.MapSG(nil, 4096))
	note("MapSG(page size 3)", frmr.MapSG([]verbs.SGE{mr.SGE(0, 10)}, 3))
	note("MapSG(no MR)", frmr.MapSG([]verbs.SGE{{Addr: mr.Addr(), Length: 10, LKey: mr.LKey() ^ 0xffff00}}, 4096))
	note("MapSG(outside the MR)", frmr.MapSG([]verbs.SGE{{Addr: mr.Addr() + 60<<10, Length: 8 << 10, LKey: mr.LKey()}}, 4096))
	note("MapPages", frmr.MapPages(pg[:2], 4096, 0, 8192))
	note("SetIOVA(wraps)", frmr.SetIOVA(1<<64-4096))
	note("MapPages(a regular MR)", mr.MapPages(pg[:1], 4096, 0, 10))
	note("SetIOVA(a regular MR)", mr.SetIOVA(0))
	_, err = pd.RegMRIOVA(buf, 1<<64-100, verbs.AccessLocalWrite)
	note("RegMRIOVA(wraps)", err)
	rkey := verbs.IncRKey(frmr.RKey())
	note("REG_MR(another index)", qp.PostSend(frmr.RegWR(1, 0, rkey+0x100, verbs.AccessLocalWrite)))
	note("REG_MR(remote write alone)", qp.PostSend(frmr.RegWR(1, 0, rkey, verbs.AccessRemoteWrite)))
	wr := frmr.RegWR(1, 0, rkey, verbs.AccessLocalWrite)
	wr.SGL = []verbs.SGE{mr.SGE(0, 8)}
	note("REG_MR(with an SGE)", qp.PostSend(wr))
	note("REG_MR(no MR)", qp.PostSend(verbs.SendWR{ID: 1, Op: verbs.OpRegMR, RKey: rkey, Access: verbs.AccessLocalWrite}))
	_, err = pd.AllocMW(3)
	note("AllocMW(type 3)", err)
	bi := verbs.BindInfo{MR: mr, Addr: mr.Addr(), Length: 4096, Access: verbs.AccessRemoteWrite}
	note("BIND_MW(type 1)", qp.PostSend(mw1.BindWR(1, 0, verbs.IncRKey(mw1.RKey()), bi)))
	_, err = qp.BindMW(mw2, 1, 0, bi)
	note("BindMW(type 2)", err)
	_, err = qp.BindMW(nil, 1, 0, bi)
	note("BindMW(no window)", err)
	note("BIND_MW(another index)", qp.PostSend(mw2.BindWR(1, 0, verbs.IncRKey(mw2.RKey())+0x100, bi)))
	note("BIND_MW(no MR)", qp.PostSend(mw2.BindWR(1, 0, verbs.IncRKey(mw2.RKey()), verbs.BindInfo{Length: 10})))
	note("BIND_MW(local write)", qp.PostSend(mw2.BindWR(1, 0, verbs.IncRKey(mw2.RKey()),
		verbs.BindInfo{MR: mr, Addr: mr.Addr(), Length: 10, Access: verbs.AccessLocalWrite})))
	note("LOCAL_INV(with an SGE)", qp.PostSend(verbs.SendWR{Op: verbs.OpLocalInv, SGL: []verbs.SGE{mr.SGE(0, 8)}, InvalidateRKey: mr.RKey()}))
	note("LOCAL_INV(solicited)", qp.PostSend(verbs.SendWR{Op: verbs.OpLocalInv, Flags: verbs.Solicited, InvalidateRKey: mr.RKey()}))
	note("READ_INV(two SGEs)", qp.PostSend(verbs.SendWR{Op: verbs.OpReadInv, SGL: []verbs.SGE{mr.SGE(0, 8), mr.SGE(8, 8)}, InvalidateRKey: mr.RKey()}))
	return out, nil
}

// TestServiceMemErrors: memory registration calls and work requests fail
// the same way through the service as embedded.
func TestServiceMemErrors(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	emb, err := memErrs(p.a)
	if err != nil {
		t.Fatal(err)
	}
	path, _ := startService(t, p.a, service.Limits{})
	d := connectService(t, path)
	got, err := memErrs(d)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(emb) {
		t.Fatalf("%d outcomes through the service, %d embedded", len(got), len(emb))
	}
	for i := range emb {
		if got[i] != emb[i] {
			t.Errorf("embedded %q, through the service %q", emb[i], got[i])
		}
	}
	t.Logf("%d outcomes alike:\n%s", len(emb), strings.Join(emb, "\n"))
}

// TestServiceMemObjectsOtherDevice: a fast-register MR or window of a
// service used with an embedded QP, and the other way round, is refused
// (never a crash: on a device of a service they are tokens).
func TestServiceMemObjectsOtherDevice(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startService(t, p.a, service.Limits{})
	d := connectService(t, path)
	type side struct {
		qp   *verbs.QP
		frmr *verbs.MR
		mw1  *verbs.MW
		mw2  *verbs.MW
		mr   *verbs.MR
	}
	mk := func(dev *verbs.Device) side {
		pd, _ := dev.AllocPD()
		cq, _ := dev.CreateCQ(16)
		qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
		if err != nil {
			t.Fatal(err)
		}
		mem, _ := zerocopy.AllocShared("other", 8192)
		t.Cleanup(func() { mem.Close() })
		mr, err := pd.RegMR(mem.Bytes(), verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessMWBind)
		if err != nil {
			t.Fatal(err)
		}
		frmr, err := pd.AllocMR(2)
		if err != nil {
			t.Fatal(err)
		}
		mw1, _ := pd.AllocMW(verbs.MWType1)
		mw2, _ := pd.AllocMW(verbs.MWType2)
		return side{qp, frmr, mw1, mw2, mr}
	}
	emb, svc := mk(p.a), mk(d)
	for _, c := range []struct{ from, to side }{{emb, svc}, {svc, emb}} {
		bi := verbs.BindInfo{MR: c.from.mr, Addr: c.from.mr.Addr(), Length: 64, Access: verbs.AccessRemoteWrite}
		if err := c.to.qp.PostSend(c.from.frmr.RegWR(1, 0, verbs.IncRKey(c.from.frmr.RKey()), verbs.AccessLocalWrite)); !errors.Is(err, iwarp.ErrInvalidWR) {
			t.Errorf("REG_MR of another device's MR: %v", err)
		}
		if err := c.to.qp.PostSend(c.from.mw2.BindWR(1, 0, verbs.IncRKey(c.from.mw2.RKey()), bi)); !errors.Is(err, iwarp.ErrInvalidWR) {
			t.Errorf("BIND_MW of another device's window: %v", err)
		}
		if _, err := c.to.qp.BindMW(c.from.mw1, 1, 0, bi); !errors.Is(err, iwarp.ErrInvalidWR) {
			t.Errorf("BindMW of another device's window: %v", err)
		}
	}
}
