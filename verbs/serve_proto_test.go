package verbs_test

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
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
