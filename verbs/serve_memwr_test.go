package verbs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"rdmatap/iwarp"
	"rdmatap/verbs"
	"rdmatap/zerocopy"
)

// Memory registration through the service: memOpsClient is application
// code for the verbs API that uses fast registration, Local Invalidate,
// RDMA Read with Invalidate, memory windows of both types and RegMRIOVA;
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
	pd, err := d.AllocPD()
	if err != nil {
		return err
	}
	defer pd.Close()
	cq, err := d.CreateCQ(64)
	if err != nil {
		return err
	}
	defer cq.Close()
	qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		return err
	}
	defer qp.Close()
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
		if _, err := waitWC(ctx, cq, verbs.WCRecv, 1+verbs.RemoteBufSize); err != nil {
			return err
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
	pd, err := d.AllocPD()
	if err != nil {
		return err
	}
	defer pd.Close()
	cq, err := d.CreateCQ(64)
	if err != nil {
		return err
	}
	defer cq.Close()
	qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		return err
	}
	defer qp.Close()
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
		if _, err := waitWC(ctx, cq, verbs.WCRecv, memCmdSize); err != nil {
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
		if err := qp.PostSend(verbs.SendWR{ID: 4, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{mr.SGE(64<<10, 1+verbs.RemoteBufSize)}}); err != nil {
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
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := peer.Listen(netip.AddrPort{}, verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	errc := make(chan error, 1)
	go func() { errc <- memOpsPeer(ctx, l, peer) }()
	if err := memOpsClient(ctx, d, netip.AddrPortFrom(peerAddr, l.Addr().Port()), seed); err != nil {
		cancel()
		<-errc
		t.Fatalf("client: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("peer: %v", err)
	}
}
