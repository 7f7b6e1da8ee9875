package verbs_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
	"github.com/rdmatap/rdmatap/verbs/service"
	"github.com/rdmatap/rdmatap/zerocopy"
)

// TestServiceInlineData: inline Sends and RDMA Writes of a service's
// client carry their payload in the send ring entry (FlagInlineData): the
// source buffer is overwritten right after each post, and the peer still
// gets the bytes as they were when posted, at every size up to the QP's
// max inline. More than that is refused at post time.
func TestServiceInlineData(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startService(t, p.a, service.Limits{})
	d := connectService(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const maxInline, port = 256, 18600
	sizes := []int{0, 1, 17, 64, 65, 200, maxInline}

	// The peer: receives for every Send, a buffer for the Writes.
	l, err := p.b.Listen(netip.AddrPortFrom(netip.Addr{}, port), verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	pq, err := openTestQP(p.b)
	if err != nil {
		t.Fatal(err)
	}
	defer pq.close()
	pbuf := make([]byte, 2*len(sizes)*maxInline)
	pmr, err := pq.pd.RegMR(pbuf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	for i := range sizes {
		if err := pq.qp.PostRecv(verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{pmr.SGE(i*maxInline, maxInline)}}); err != nil {
			t.Fatal(err)
		}
	}
	accepted := make(chan error, 1)
	go func() {
		r, err := l.GetRequest(ctx)
		if err == nil {
			_, err = r.Accept(ctx, pq.qp, verbs.ConnParams{})
		}
		accepted <- err
	}()

	// The client, through the service.
	pd, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	cq, err := d.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	defer cq.Close()
	qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq, MaxInline: maxInline})
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Close()
	mem, err := zerocopy.AllocShared("inline", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	mr, err := pd.RegMR(mem.Bytes(), verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Dereg()
	if _, err := d.Dial(ctx, qp, netip.AddrPortFrom(p.nb.Addrs()[0].Addr(), port), verbs.ConnParams{}); err != nil {
		t.Fatal(err)
	}
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	src := mr.Bytes()
	pattern := func(i, n int) []byte {
		b := make([]byte, n)
		for j := range b {
			b[j] = byte(i*31 + j + 1)
		}
		return b
	}
	post := func(wr verbs.SendWR, comp verbs.WCOpcode, fill func()) {
		t.Helper()
		fill()
		if err := qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		for j := range src {
			src[j] = 0xff // the bytes went with the entry
		}
		if f := verbs.LastSendEntryFlags(qp); f&svc.FlagInlineData == 0 {
			t.Fatalf("send entry flags %#x: no inline data", f)
		}
		if _, err := waitWC(ctx, cq, comp, -1); err != nil {
			t.Fatal(err)
		}
	}
	for i, n := range sizes {
		want := pattern(i, n)
		woff := (len(sizes) + i) * maxInline
		post(verbs.SendWR{ID: uint64(i), Op: verbs.OpWrite, Flags: verbs.Signaled | verbs.Inline, SGL: []verbs.SGE{mr.SGE(0, n)},
			RemoteAddr: pmr.Addr() + uint64(woff), RKey: pmr.RKey()}, verbs.WCWrite, func() { copy(src, want) })
		// Two SGEs make one inline payload.
		h := n / 2
		post(verbs.SendWR{ID: uint64(i), Op: verbs.OpSend, Flags: verbs.Signaled | verbs.Inline,
			SGL: []verbs.SGE{mr.SGE(0, h), mr.SGE(2048+h, n-h)}}, verbs.WCSend,
			func() { copy(src, want[:h]); copy(src[2048+h:], want[h:]) })
		if _, err := waitWC(ctx, pq.rcq, verbs.WCRecv, n); err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if got := pbuf[i*maxInline : i*maxInline+n]; !bytes.Equal(got, want) {
			t.Fatalf("inline Send of %d bytes: %x, want %x", n, got, want)
		}
		if got := pbuf[woff : woff+n]; !bytes.Equal(got, want) {
			t.Fatalf("inline Write of %d bytes: %x, want %x", n, got, want)
		}
	}
	if err := qp.PostSend(verbs.SendWR{Op: verbs.OpSend, Flags: verbs.Inline, SGL: []verbs.SGE{mr.SGE(0, maxInline+1)}}); !errors.Is(err, iwarp.ErrInvalidWR) {
		t.Fatalf("an inline Send of %d bytes on a QP of %d: %v", maxInline+1, maxInline, err)
	}
}

// TestServiceQueryPort: a service's client sees the service device's port
// (QUERY_PORT) as the embedded device reports it, with siw's GID and node
// GUID made from the MAC; a port other than 1 is refused.
func TestServiceQueryPort(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startService(t, p.a, service.Limits{})
	d := connectService(t, path)
	want := p.a.Link()
	ip := p.na.Addrs()[0].Addr()
	if want.Addr != ip || !want.Up || want.MTU <= 0 {
		t.Fatalf("the embedded device's link %+v, want address %v, up", want, ip)
	}
	// An in-memory link has no Ethernet address: 02:00 and the IPv4 address.
	a4 := ip.As4()
	if !bytes.Equal(want.MAC, []byte{2, 0, a4[0], a4[1], a4[2], a4[3]}) {
		t.Fatalf("MAC %v of a link without one", want.MAC)
	}
	got := d.Link()
	if got.Addr != want.Addr || !bytes.Equal(got.MAC, want.MAC) || got.MTU != want.MTU || got.Up != want.Up {
		t.Fatalf("through the service: %+v, want %+v", got, want)
	}
	if g := got.GID(); !bytes.Equal(g[:6], want.MAC) || !bytes.Equal(g[6:], make([]byte, 10)) {
		t.Fatalf("GID %x", g)
	}
	if g := got.NodeGUID(); g != [8]byte{want.MAC[0] ^ 2, want.MAC[1], want.MAC[2], 0xff, 0xfe, want.MAC[3], want.MAC[4], want.MAC[5]} {
		t.Fatalf("node GUID %x", g)
	}
	if a := d.Query(); a.VendorID != verbs.VendorID {
		t.Fatalf("vendor ID %#x, want %#x", a.VendorID, verbs.VendorID)
	}
	r, m := dialRawFeatures(t, path, svc.Features)
	if m.Status() != svc.StatusOK || m.Arg(3) != svc.Features {
		t.Fatalf("HELLO: status %d, features %#x", m.Status(), m.Arg(3))
	}
	q, _ := r.call(svc.TQueryPort, []uint64{2}, nil)
	if q.Status() != svc.StatusInvalidArgument {
		t.Fatalf("QUERY_PORT of port 2: status %d", q.Status())
	}
	q, _ = r.call(svc.TQueryPort, []uint64{1}, nil)
	var f [svc.PortFields][]byte
	if n, err := svc.Fields(q.Payload(), f[:]); q.Status() != svc.StatusOK || q.NArgs() != svc.PortArgs || n != svc.PortFields || err != nil {
		t.Fatalf("QUERY_PORT: status %d, %d args, %d fields, %v", q.Status(), q.NArgs(), n, err)
	}
	if q.Arg(svc.PortState) != verbs.PortActive || q.Arg(svc.PortPhysState) != 5 || q.Arg(svc.PortActiveWidth) != 1 ||
		q.Arg(svc.PortActiveSpeed) != 1 || q.Arg(svc.PortActiveMTU) != uint64(want.ActiveMTU()) || len(f[svc.PortFieldGID]) != 16 {
		t.Fatalf("QUERY_PORT: args %v", []uint64{q.Arg(0), q.Arg(1), q.Arg(2), q.Arg(3), q.Arg(4), q.Arg(5)})
	}
}

// protoConn connects a QP of the service's client d to one of the
// embedded peer (the peer accepts); the QPs come with receives posted if
// recvs > 0 (16-byte buffers, WR IDs from 1).
func protoConn(t testing.TB, ctx context.Context, d, peer *verbs.Device, peerAddr netip.Addr, port uint16, p verbs.ConnParams, recvs int) (cq, pq *testQP, c *verbs.Conn, req *verbs.ConnRequest) {
	t.Helper()
	l, err := peer.Listen(netip.AddrPortFrom(netip.Addr{}, port), verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if pq, err = openTestQP(peer); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pq.close)
	if cq, err = openTestQP(d); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cq.close)
	if recvs > 0 {
		mem, err := zerocopy.AllocShared("recv", 4096)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { mem.Close() })
		mr, err := cq.pd.RegMR(mem.Bytes(), verbs.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { mr.Dereg() })
		for i := 0; i < recvs; i++ {
			if err := cq.qp.PostRecv(verbs.RecvWR{ID: uint64(i + 1), SGL: []verbs.SGE{mr.SGE(16*i, 16)}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	accepted := make(chan error, 1)
	go func() {
		var err error
		req, err = l.GetRequest(ctx)
		if err == nil {
			_, err = req.Accept(ctx, pq.qp, verbs.ConnParams{})
		}
		accepted <- err
	}()
	if c, err = d.Dial(ctx, cq.qp, netip.AddrPortFrom(peerAddr, port), p); err != nil {
		t.Fatal(err)
	}
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	return cq, pq, c, req
}

// TestServiceDialFrom: a service's client connects from the port it
// chose (rdma_bind_addr, then rdma_connect): its connection and the
// peer's request show that port; the same port again while the first
// connection lives is EADDRINUSE.
func TestServiceDialFrom(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startService(t, p.a, service.Limits{})
	d := connectService(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	peerAddr := p.nb.Addrs()[0].Addr()
	local := netip.AddrPortFrom(netip.Addr{}, 31337)
	_, _, c, req := protoConn(t, ctx, d, p.b, peerAddr, 18601, verbs.ConnParams{LocalAddr: local}, 0)
	want := netip.AddrPortFrom(p.na.Addrs()[0].Addr(), 31337)
	if c.LocalAddr() != want || req.RemoteAddr() != want {
		t.Fatalf("connection from %v, the peer's request from %v, want %v", c.LocalAddr(), req.RemoteAddr(), want)
	}
	q, err := openTestQP(d)
	if err != nil {
		t.Fatal(err)
	}
	defer q.close()
	l, err := p.b.Listen(netip.AddrPortFrom(netip.Addr{}, 18602), verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := d.Dial(ctx, q.qp, netip.AddrPortFrom(peerAddr, 18602), verbs.ConnParams{LocalAddr: want}); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("a second connection from %v: %v, want EADDRINUSE", want, err)
	}
}

// TestServiceQPError: QP_ERROR (QP.SetError) flushes a QP's receives, in
// IDLE and connected; the connected QP's peer sees its connection end in
// an error, and what the client posts afterwards completes flushed.
func TestServiceQPError(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startService(t, p.a, service.Limits{})
	d := connectService(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	flushed := func(cq *verbs.CQ, n int, op verbs.WCOpcode) {
		t.Helper()
		for i := 0; i < n; i++ {
			wc, err := waitWC(ctx, cq, op, -1)
			if wc.Status != verbs.StatusWRFlush {
				t.Fatalf("completion %d: %+v, %v; want flushed", i, wc, err)
			}
		}
	}
	// IDLE.
	idle, err := openTestQP(d)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.close()
	mem, err := zerocopy.AllocShared("recv", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	mr, err := idle.pd.RegMR(mem.Bytes(), verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := idle.qp.PostRecv(verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{mr.SGE(0, 16)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := idle.qp.SetError(); err != nil {
		t.Fatal(err)
	}
	flushed(idle.rcq, 3, verbs.WCRecv)
	if st := idle.qp.State(); st != verbs.QPError {
		t.Fatalf("state %v after SetError", st)
	}
	// Connected: the peer's connection ends in error.
	for len(p.b.Events()) > 0 {
		<-p.b.Events()
	}
	cq, pq, _, _ := protoConn(t, ctx, d, p.b, p.nb.Addrs()[0].Addr(), 18603, verbs.ConnParams{}, 4)
	if err := cq.qp.SetError(); err != nil {
		t.Fatal(err)
	}
	flushed(cq.rcq, 4, verbs.WCRecv)
	select {
	case <-pq.qp.Done():
	case <-ctx.Done():
		t.Fatal("the peer's QP did not end")
	}
	if pq.qp.Err() == nil {
		t.Fatal("the peer's connection ended without an error")
	}
	if err := cq.qp.PostSend(verbs.SendWR{ID: 9, Op: verbs.OpSend, Flags: verbs.Signaled}); !errors.Is(err, iwarp.ErrInvalidState) {
		t.Fatalf("a Send posted in ERROR: %v, want ErrInvalidState", err)
	}
}

// TestServiceDisconnectReason: a DISCONNECTED event of a service's client
// says whether the peer or this end closed gracefully, or an error ended
// the connection.
func TestServiceDisconnectReason(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startService(t, p.a, service.Limits{})
	d := connectService(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	peerAddr := p.nb.Addrs()[0].Addr()
	disconnected := func(qp *verbs.QP) verbs.AsyncEvent {
		t.Helper()
		for {
			select {
			case e := <-d.Events():
				if e.Type == verbs.EventDisconnected && e.QPNum == qp.Num() {
					return e
				}
			case <-ctx.Done():
				t.Fatal("no DISCONNECTED event")
			}
		}
	}
	// The peer closes (peer-to-peer mode: the responder may send, its
	// FIN too, before the initiator's first FPDU).
	yes := true
	cq, pq, _, _ := protoConn(t, ctx, d, p.b, peerAddr, 18604, verbs.ConnParams{PeerToPeer: &yes}, 0)
	if err := pq.qp.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
	if e := disconnected(cq.qp); !e.ByPeer || e.Err != nil {
		t.Fatalf("the peer's graceful close: %+v", e)
	}
	// This end closes.
	cq, _, _, _ = protoConn(t, ctx, d, p.b, peerAddr, 18605, verbs.ConnParams{}, 0)
	if err := cq.qp.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
	if e := disconnected(cq.qp); e.ByPeer || e.Err != nil {
		t.Fatalf("this end's graceful close: %+v", e)
	}
	// A QP that never connected, moved to ERROR: this end's doing.
	idle, err := openTestQP(d)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.close()
	if err := idle.qp.SetError(); err != nil {
		t.Fatal(err)
	}
	if e := disconnected(idle.qp); e.ByPeer || e.Err != nil {
		t.Fatalf("an IDLE QP moved to ERROR: %+v", e)
	}
	// The peer resets.
	cq, pq, _, _ = protoConn(t, ctx, d, p.b, peerAddr, 18606, verbs.ConnParams{}, 0)
	if err := pq.qp.SetError(); err != nil {
		t.Fatal(err)
	}
	if e := disconnected(cq.qp); e.ByPeer || e.Err == nil {
		t.Fatalf("the peer's reset: %+v", e)
	}
}

// TestServiceFeatureInterop: a client that names no features (one older
// than them) gets the send entries it knows, without room for inline
// data; one that names INLINE_DATA gets entries with room for its max
// inline bytes. Each is offered exactly what both know.
func TestServiceFeatureInterop(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startService(t, p.a, service.Limits{})
	for _, c := range []struct {
		features, esize uint64
	}{
		{0, uint64(svc.SendEntrySize(1))},
		{svc.FeatureQueryDevice, uint64(svc.SendEntrySize(1))},
		{svc.Features | 1<<40, uint64(svc.SendEntrySizeInline(1, 256))},
	} {
		r, m := dialRawFeatures(t, path, c.features)
		if m.Status() != svc.StatusOK || m.Arg(3) != c.features&svc.Features {
			t.Fatalf("HELLO with features %#x: status %d, offered %#x", c.features, m.Status(), m.Arg(3))
		}
		pd := r.alive()
		m, fds := r.call(svc.TCreateCQ, []uint64{16}, nil)
		closeAll(fds)
		cq := m.Arg(0)
		m, fds = r.call(svc.TCreateQP, []uint64{pd, cq, cq, 0, 4, 4, 1, 1, 256, 0}, nil)
		if m.Status() != svc.StatusOK || len(fds) != 1 {
			t.Fatalf("CREATE_QP: status %d", m.Status())
		}
		mem, err := svc.MapRing(fds[0])
		closeAll(fds)
		if err != nil {
			t.Fatal(err)
		}
		sq, err := svc.OpenRing(mem[:m.Arg(1)])
		if err != nil || uint64(sq.EntrySize()) != c.esize {
			t.Errorf("features %#x: SQ entries of %d bytes (%v), want %d", c.features, sq.EntrySize(), err, c.esize)
		}
		svc.Unmap(mem)
	}
}

// TestConnectVersionMismatch: a service of another protocol version
// refuses the Go client's HELLO, and Connect's error names both versions
// (the service's text) and matches svc.ErrVersion.
func TestConnectVersionMismatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		buf, oob := make([]byte, svc.MaxMessage), make([]byte, svc.OOBSpace)
		m, _, err := svc.Read(c, buf, oob, nil)
		if err != nil || m.Check() != nil {
			return
		}
		var b svc.Builder
		text := fmt.Sprintf("protocol version mismatch: service speaks %d, client %d", svc.Version+1, m.Arg(1))
		svc.Write(c, b.Reset(svc.THello, 0, svc.StatusVersion).Args(svc.Version+1).String(text).Msg())
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = verbs.Connect(ctx, path)
	want := fmt.Sprintf("service speaks %d, client %d", svc.Version+1, svc.Version)
	if !errors.Is(err, svc.ErrVersion) || err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Connect to a service of version %d: %v; want ErrVersion naming %q", svc.Version+1, err, want)
	}
}

func closeAll(fds []int) {
	for _, fd := range fds {
		syscall.Close(fd)
	}
}

// TestServiceHostileInlineData: send entries whose inline data the
// service must refuse complete in error with their WR IDs, and the session
// goes on: a length over the QP's max inline bytes (within the entry), a
// length past the entry, an RDMA Read with inline data, SGEs beside it.
func TestServiceHostileInlineData(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startService(t, p.a, service.Limits{})
	r, m := dialRawFeatures(t, path, svc.Features)
	if m.Status() != svc.StatusOK {
		t.Fatalf("HELLO: status %d", m.Status())
	}
	pd := r.alive()
	m, fds := r.call(svc.TCreateCQ, []uint64{16}, nil)
	if m.Status() != svc.StatusOK || len(fds) != 2 {
		t.Fatalf("CREATE_CQ: status %d", m.Status())
	}
	cqh := m.Arg(0)
	cqMem, err := svc.MapRing(fds[0])
	closeAll(fds)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Unmap(cqMem)
	cq, err := svc.OpenRing(cqMem)
	if err != nil {
		t.Fatal(err)
	}
	// 4 send SGEs (64 bytes of room in an entry), 16 inline bytes.
	m, fds = r.call(svc.TCreateQP, []uint64{pd, cqh, cqh, 0, 8, 8, 4, 1, 16, 0}, nil)
	if m.Status() != svc.StatusOK || len(fds) != 1 {
		t.Fatalf("CREATE_QP: status %d", m.Status())
	}
	qpMem, err := svc.MapRing(fds[0])
	closeAll(fds)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Unmap(qpMem)
	sq, err := svc.OpenRing(qpMem[:m.Arg(1)])
	if err != nil || sq.EntrySize() != svc.SendEntrySize(4) {
		t.Fatalf("SQ: %v, entries of %d bytes", err, sq.EntrySize())
	}
	put := func(i uint32, wr iwarp.SendWR, n int, spoil func(e []byte)) {
		e := sq.Entry(i)
		svc.PutSendData(e, &wr, make([]byte, n))
		if spoil != nil {
			spoil(e)
		}
	}
	put(0, iwarp.SendWR{ID: 1, Op: iwarp.WRSend}, 40, nil)
	put(1, iwarp.SendWR{ID: 2, Op: iwarp.WRSend}, 8, func(e []byte) { binary.LittleEndian.PutUint32(e[12:], 65) })
	put(2, iwarp.SendWR{ID: 3, Op: iwarp.WRRead}, 8, nil)
	put(3, iwarp.SendWR{ID: 4, Op: iwarp.WRWrite}, 8, func(e []byte) { binary.LittleEndian.PutUint16(e[10:], 1) })
	sq.Prod.Store(4)
	r.alive() // a call: the service takes the rings first
	want := map[uint64]iwarp.CompletionOp{1: iwarp.CompSend, 2: iwarp.CompSend, 3: iwarp.CompRead, 4: iwarp.CompWrite}
	for i := uint32(0); i < cq.Prod.Load(); i++ {
		var c iwarp.Completion
		svc.GetCompletion(cq.Entry(i), &c)
		if op, ok := want[c.ID]; !ok || c.Op != op || c.Status != iwarp.StatusLocalQPOp {
			t.Errorf("completion %+v, want %v in error", c, op)
		}
		delete(want, c.ID)
	}
	if len(want) != 0 {
		t.Errorf("no completion of WRs %v", want)
	}
}
