package verbs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"rdmatap/verbs"
	"rdmatap/zerocopy"
)

// startService serves d on a socket in a temporary directory.
func startService(t testing.TB, d *verbs.Device, lim verbs.Limits) (string, *verbs.Server) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rt0.sock")
	ln, err := verbs.ListenSocket(path, -1)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := verbs.Serve(d, ln, verbs.ServeConfig{Limits: lim, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return path, srv
}

func connectService(t testing.TB, path string) *verbs.Device {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := verbs.Connect(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// Sizes of the operations opsClient and opsPeer run.
const (
	opsSend  = 4096
	opsWrite = 64 << 10
	opsRead  = 48 << 10
	opsPeerW = 32 << 10
	opsBuf   = 256 << 10
)

// waitWC waits for one completion and checks it.
func waitWC(ctx context.Context, cq *verbs.CQ, op verbs.WCOpcode, n int) (verbs.WC, error) {
	var wc [1]verbs.WC
	if _, err := cq.Wait(ctx, wc[:]); err != nil {
		return verbs.WC{}, fmt.Errorf("waiting for %v: %w", op, err)
	}
	if err := wc[0].Err(); err != nil {
		return wc[0], err
	}
	if wc[0].Op != op || (n >= 0 && int(wc[0].ByteLen) != n) {
		return wc[0], fmt.Errorf("completion %v of %d bytes, want %v of %d", wc[0].Op, wc[0].ByteLen, op, n)
	}
	return wc[0], nil
}

// opsClient is application code written for the verbs API: it knows
// nothing of where d comes from. It connects to raddr, and runs Send and
// Receive both ways, an RDMA Write into the peer, an RDMA Read from it,
// and lets the peer write into its own memory, checking every byte. The
// test runs it unchanged on an embedded device and on a device of a
// service.
func opsClient(ctx context.Context, d *verbs.Device, raddr netip.AddrPort, seed uint64) error {
	pd, err := d.AllocPD()
	if err != nil {
		return err
	}
	defer pd.Close()
	scq, err := d.CreateCQ(64)
	if err != nil {
		return err
	}
	defer scq.Close()
	rcq, err := d.CreateCQ(64)
	if err != nil {
		return err
	}
	defer rcq.Close()
	qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: scq, RecvCQ: rcq})
	if err != nil {
		return err
	}
	defer qp.Close()
	mem, err := zerocopy.AllocShared("ops", opsBuf)
	if err != nil {
		return err
	}
	defer mem.Close()
	buf := mem.Bytes()
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	if err != nil {
		return err
	}
	defer mr.Dereg()

	// Receive buffers first: [0:4K) for the peer's Send, [4K:8K) for
	// its notices.
	if err := qp.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{mr.SGE(0, opsSend)}}); err != nil {
		return err
	}
	pdata, _ := mr.Remote().MarshalBinary()
	conn, err := d.Dial(ctx, qp, raddr, verbs.ConnParams{PrivateData: pdata})
	if err != nil {
		return err
	}
	var peer verbs.RemoteBuf
	if err := peer.UnmarshalBinary(conn.PeerPrivateData()); err != nil {
		return err
	}

	// 1. Send: the peer echoes it back into [0:4K).
	out := buf[opsBuf-opsSend:]
	fill(out, seed)
	if err := qp.PostSend(verbs.SendWR{ID: 10, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{mr.SGE(opsBuf-opsSend, opsSend)}}); err != nil {
		return err
	}
	if _, err := waitWC(ctx, scq, verbs.WCSend, opsSend); err != nil {
		return err
	}
	if _, err := waitWC(ctx, rcq, verbs.WCRecv, opsSend); err != nil {
		return err
	}
	if !bytes.Equal(buf[:opsSend], out) {
		return errors.New("echoed Send differs")
	}

	// 2. RDMA Write 64 KiB into the peer's [0:64K), then a Send naming
	// the seed, which the peer checks the written bytes against.
	src := buf[8<<10 : 8<<10+opsWrite]
	fill(src, seed+1)
	if err := qp.PostRecv(verbs.RecvWR{ID: 2, SGL: []verbs.SGE{mr.SGE(4<<10, 64)}}); err != nil {
		return err
	}
	if err := qp.PostSend(
		verbs.SendWR{ID: 11, Op: verbs.OpWrite, SGL: []verbs.SGE{mr.SGE(8<<10, opsWrite)}, RemoteAddr: peer.Addr, RKey: peer.RKey},
		verbs.SendWR{ID: 12, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{mr.SGE(0, 8)}},
	); err != nil {
		return err
	}
	if _, err := waitWC(ctx, scq, verbs.WCSend, 8); err != nil {
		return err
	}
	// The peer answers once it has checked the Write and has written
	// 32 KiB into our [96K:128K) and filled its own [64K:112K).
	if _, err := waitWC(ctx, rcq, verbs.WCRecv, 1); err != nil {
		return err
	}
	if buf[4<<10] != 'W' {
		return fmt.Errorf("peer reports %q after the RDMA Write", buf[4<<10])
	}
	want := make([]byte, opsPeerW)
	fill(want, seed+2)
	if !bytes.Equal(buf[96<<10:96<<10+opsPeerW], want) {
		return errors.New("peer's RDMA Write did not land in our memory")
	}

	// 3. RDMA Read the peer's [64K:112K) into our [128K:176K).
	rb, err := peer.Slice(64<<10, opsRead)
	if err != nil {
		return err
	}
	if err := qp.PostSend(verbs.SendWR{ID: 13, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{mr.SGE(128<<10, opsRead)},
		RemoteAddr: rb.Addr, RKey: rb.RKey}); err != nil {
		return err
	}
	if _, err := waitWC(ctx, scq, verbs.WCRead, opsRead); err != nil {
		return err
	}
	want = make([]byte, opsRead)
	fill(want, seed+3)
	if !bytes.Equal(buf[128<<10:128<<10+opsRead], want) {
		return errors.New("RDMA Read data differs")
	}
	return conn.Disconnect(ctx)
}

// opsPeer is the embedded peer of opsClient for one connection.
func opsPeer(ctx context.Context, l *verbs.Listener, d *verbs.Device, seed uint64) error {
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
	buf := make([]byte, opsBuf)
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	if err != nil {
		return err
	}
	defer mr.Dereg()
	req, err := l.GetRequest(ctx)
	if err != nil {
		return err
	}
	var cl verbs.RemoteBuf
	if err := cl.UnmarshalBinary(req.PrivateData()); err != nil {
		return err
	}
	if err := qp.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{mr.SGE(0, opsSend)}},
		verbs.RecvWR{ID: 2, SGL: []verbs.SGE{mr.SGE(opsBuf-64, 64)}}); err != nil {
		return err
	}
	pdata, _ := mr.Remote().MarshalBinary()
	if _, err := req.Accept(ctx, qp, verbs.ConnParams{PrivateData: pdata}); err != nil {
		return err
	}
	// 1. Echo the Send.
	if _, err := waitWC(ctx, cq, verbs.WCRecv, opsSend); err != nil {
		return err
	}
	if err := qp.PostSend(verbs.SendWR{ID: 20, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{mr.SGE(0, opsSend)}}); err != nil {
		return err
	}
	if _, err := waitWC(ctx, cq, verbs.WCSend, opsSend); err != nil {
		return err
	}
	// 2. The Write, announced by an 8-byte Send.
	if _, err := waitWC(ctx, cq, verbs.WCRecv, 8); err != nil {
		return err
	}
	want := make([]byte, opsWrite)
	fill(want, seed+1)
	verdict := byte('W')
	if !bytes.Equal(buf[:opsWrite], want) {
		verdict = 'X'
	}
	fill(buf[64<<10:64<<10+opsRead], seed+3)
	src := buf[128<<10 : 128<<10+opsPeerW]
	fill(src, seed+2)
	buf[200<<10] = verdict
	dst, err := cl.Slice(96<<10, opsPeerW)
	if err != nil {
		return err
	}
	if err := qp.PostSend(
		verbs.SendWR{ID: 21, Op: verbs.OpWrite, SGL: []verbs.SGE{mr.SGE(128<<10, opsPeerW)}, RemoteAddr: dst.Addr, RKey: dst.RKey},
		verbs.SendWR{ID: 22, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{mr.SGE(200<<10, 1)}},
	); err != nil {
		return err
	}
	if _, err := waitWC(ctx, cq, verbs.WCSend, 1); err != nil {
		return err
	}
	// 3. The client reads and disconnects.
	select {
	case <-qp.Done():
	case <-ctx.Done():
		return ctx.Err()
	}
	if verdict != 'W' {
		return errors.New("client's RDMA Write differs")
	}
	return nil
}

// runOps runs opsClient on d against an embedded peer device.
func runOps(t *testing.T, d, peer *verbs.Device, peerAddr netip.Addr, seed uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := peer.Listen(netip.AddrPort{}, verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	errc := make(chan error, 1)
	go func() { errc <- opsPeer(ctx, l, peer, seed) }()
	if err := opsClient(ctx, d, netip.AddrPortFrom(peerAddr, l.Addr().Port()), seed); err != nil {
		cancel()
		<-errc
		t.Fatalf("client: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("peer: %v", err)
	}
}

// TestServiceSameCode runs the same application code (opsClient) on an
// embedded device and on the same device through the service.
func TestServiceSameCode(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	peerAddr := p.nb.Addrs()[0].Addr()
	t.Run("embedded", func(t *testing.T) { runOps(t, p.a, p.b, peerAddr, 1) })
	path, srv := startService(t, p.a, verbs.Limits{})
	t.Run("service", func(t *testing.T) {
		d := connectService(t, path)
		runOps(t, d, p.b, peerAddr, 100)
		runOps(t, d, p.b, peerAddr, 200) // the same device again
	})
	deadline := time.Now().Add(5 * time.Second)
	for srv.Clients() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := srv.Clients(); n != 0 {
		t.Fatalf("%d clients still served after Close", n)
	}
}
