package verbs_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
)

// testLink is the in-memory link the tests and benchmarks use.
var testLink = netstack.LinkConfig{MTU: uint32(envInt("RDMATAP_TEST_MTU", 1500))}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// pair is two devices on an in-memory link.
type pair struct {
	a, b   *verbs.Device
	na, nb *netstack.Stack
}

func newPair(t testing.TB, ca, cb verbs.DeviceConfig) *pair {
	t.Helper()
	return newPairLink(t, testLink, ca, cb)
}

func newPairLink(t testing.TB, link netstack.LinkConfig, ca, cb verbs.DeviceConfig) *pair {
	t.Helper()
	na, nb, err := netstack.NewPair(netstack.PairConfig{Link: link})
	if err != nil {
		t.Fatal(err)
	}
	return pairOn(t, na, nb, ca, cb)
}

// pairOn opens a device on each stack; the test's end closes them all.
func pairOn(t testing.TB, na, nb *netstack.Stack, ca, cb verbs.DeviceConfig) *pair {
	t.Helper()
	a, err := verbs.Open(na, ca)
	if err != nil {
		t.Fatal(err)
	}
	b, err := verbs.Open(nb, cb)
	if err != nil {
		t.Fatal(err)
	}
	p := &pair{a: a, b: b, na: na, nb: nb}
	t.Cleanup(func() {
		a.Close()
		b.Close()
		na.Close()
		nb.Close()
	})
	return p
}

// end is one side of a connection.
type end struct {
	pd     *verbs.PD
	scq    *verbs.CQ
	rcq    *verbs.CQ
	qp     *verbs.QP
	conn   *verbs.Conn
	buf    []byte
	mr     *verbs.MR
	remote verbs.RemoteBuf // the peer's MR
}

func newEnd(t testing.TB, d *verbs.Device, size int, srq *verbs.SRQ, pd *verbs.PD) *end {
	t.Helper()
	return newEndWith(t, d, size, pd, verbs.QPConfig{SRQ: srq})
}

func newEndCfg(t testing.TB, d *verbs.Device, size int, qc verbs.QPConfig) *end {
	t.Helper()
	return newEndWith(t, d, size, nil, qc)
}

func newEndWith(t testing.TB, d *verbs.Device, size int, pd *verbs.PD, qc verbs.QPConfig) *end {
	t.Helper()
	var err error
	e := &end{pd: pd}
	if e.pd == nil {
		if e.pd, err = d.AllocPD(); err != nil {
			t.Fatal(err)
		}
	}
	if e.scq, err = d.CreateCQ(1024); err != nil {
		t.Fatal(err)
	}
	if e.rcq, err = d.CreateCQ(1024); err != nil {
		t.Fatal(err)
	}
	qc.SendCQ, qc.RecvCQ, qc.MaxSendWR, qc.MaxRecvWR = e.scq, e.rcq, 256, 256
	if e.qp, err = e.pd.CreateQP(qc); err != nil {
		t.Fatal(err)
	}
	e.buf = make([]byte, size)
	if e.mr, err = e.pd.RegMR(e.buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	return e
}

// connect makes a connected (client, server) pair of ends with MRs of size
// bytes, and exchanges the MR descriptors through the private data.
func connect(t testing.TB, p *pair, size int, params verbs.ConnParams) (cl, sv *end) {
	t.Helper()
	cl = newEnd(t, p.a, size, nil, nil)
	sv = newEnd(t, p.b, size, nil, nil)
	connectEnds(t, p, cl, sv, params)
	return cl, sv
}

func connectEnds(t testing.TB, p *pair, cl, sv *end, params verbs.ConnParams) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := p.b.Listen(netip.AddrPort{}, verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	raddr := netip.AddrPortFrom(p.nb.Addrs()[0].Addr(), l.Addr().Port())
	var wg sync.WaitGroup
	var serr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		req, err := l.GetRequest(ctx)
		if err != nil {
			serr = err
			return
		}
		if err := sv.remote.UnmarshalBinary(req.PrivateData()); err != nil {
			serr = err
			return
		}
		sp := params
		sp.PrivateData, _ = sv.mr.Remote().MarshalBinary()
		sv.conn, serr = req.Accept(ctx, sv.qp, sp)
	}()
	cp := params
	cp.PrivateData, _ = cl.mr.Remote().MarshalBinary()
	cl.conn, err = p.a.Dial(ctx, cl.qp, raddr, cp)
	wg.Wait()
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	if serr != nil {
		t.Fatalf("accept: %v", serr)
	}
	if err := cl.remote.UnmarshalBinary(cl.conn.PeerPrivateData()); err != nil {
		t.Fatal(err)
	}
	// Each end's addresses are the other's, the dialled one among them.
	if cl.conn.RemoteAddr() != raddr || sv.conn.LocalAddr() != raddr || cl.conn.LocalAddr() != sv.conn.RemoteAddr() ||
		cl.conn.LocalAddr().Addr() != p.na.Addrs()[0].Addr() {
		t.Fatalf("client %v -> %v, server %v <- %v; dialled %v", cl.conn.LocalAddr(), cl.conn.RemoteAddr(),
			sv.conn.LocalAddr(), sv.conn.RemoteAddr(), raddr)
	}
}

func wait1(t testing.TB, cq *verbs.CQ) verbs.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wc [1]verbs.WC
	if _, err := cq.Wait(ctx, wc[:]); err != nil {
		t.Fatalf("waiting for a completion: %v", err)
	}
	return wc[0]
}

func mustOK(t testing.TB, wc verbs.WC, op verbs.WCOpcode, n int) {
	t.Helper()
	if wc.Status != verbs.StatusSuccess {
		t.Fatalf("completion %d (%v): %v", wc.ID, wc.Op, wc.Status)
	}
	if wc.Op != op {
		t.Fatalf("completion op %v, want %v", wc.Op, op)
	}
	if n >= 0 && int(wc.ByteLen) != n {
		t.Fatalf("completion byte_len %d, want %d", wc.ByteLen, n)
	}
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := len(b) &^ 7; i < len(b); i++ {
		b[i] = byte(r.Uint32())
	}
}

// exercise runs Send, Send with SE, Write and Read of each size over the
// connection, checking every byte and that nothing outside the target
// range changed.
func exercise(t *testing.T, cl, sv *end, sizes []int) {
	t.Helper()
	for _, n := range sizes {
		// Send: the server posts a receive at offset 8, the client sends.
		fill(cl.buf[:n], uint64(n))
		clear(sv.buf)
		if err := sv.qp.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{sv.mr.SGE(8, n)}}); err != nil {
			t.Fatal(err)
		}
		op := verbs.OpSend
		flags := verbs.Signaled
		if n%2 == 1 {
			flags |= verbs.Solicited
		}
		if err := cl.qp.PostSend(verbs.SendWR{ID: 2, Op: op, Flags: flags, SGL: []verbs.SGE{cl.mr.SGE(0, n)}}); err != nil {
			t.Fatal(err)
		}
		mustOK(t, wait1(t, cl.scq), verbs.WCSend, n)
		wc := wait1(t, sv.rcq)
		mustOK(t, wc, verbs.WCRecv, n)
		if got := wc.Flags&verbs.WCSolicited != 0; got != (n%2 == 1) {
			t.Fatalf("send %d: solicited flag %v", n, got)
		}
		checkPlaced(t, fmt.Sprintf("send %d", n), sv.buf, 8, cl.buf[:n])

		// RDMA Write from the server into the client's MR at offset 16.
		fill(sv.buf[:n], uint64(n)+1)
		clear(cl.buf)
		dst, _ := sv.remote.Slice(16, uint64(n))
		if err := sv.qp.PostSend(verbs.SendWR{ID: 3, Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{sv.mr.SGE(0, n)}, RemoteAddr: dst.Addr, RKey: dst.RKey}); err != nil {
			t.Fatal(err)
		}
		mustOK(t, wait1(t, sv.scq), verbs.WCWrite, n)
		// Writes have no completion at the target: a Send behind it
		// proves the Write was placed (RDMAP orders them).
		if err := cl.qp.PostRecv(verbs.RecvWR{ID: 4, SGL: []verbs.SGE{cl.mr.SGE(len(cl.buf)-4, 4)}}); err != nil {
			t.Fatal(err)
		}
		if err := sv.qp.PostSend(verbs.SendWR{ID: 5, Op: verbs.OpSend, Flags: verbs.Signaled}); err != nil {
			t.Fatal(err)
		}
		mustOK(t, wait1(t, sv.scq), verbs.WCSend, 0)
		mustOK(t, wait1(t, cl.rcq), verbs.WCRecv, 0)
		checkPlaced(t, fmt.Sprintf("write %d", n), cl.buf, 16, sv.buf[:n])

		// RDMA Read by the client of the server's MR at offset 24 into
		// its own MR at offset 32.
		fill(sv.buf[24:24+n], uint64(n)+2)
		want := append([]byte(nil), sv.buf[24:24+n]...)
		clear(cl.buf)
		src, _ := cl.remote.Slice(24, uint64(n))
		if err := cl.qp.PostSend(verbs.SendWR{ID: 6, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(32, n)}, RemoteAddr: src.Addr, RKey: src.RKey}); err != nil {
			t.Fatal(err)
		}
		mustOK(t, wait1(t, cl.scq), verbs.WCRead, n)
		checkPlaced(t, fmt.Sprintf("read %d", n), cl.buf, 32, want)
	}
}

// checkPlaced checks buf[off:off+len(want)] == want and every other byte
// of buf is zero.
func checkPlaced(t testing.TB, what string, buf []byte, off int, want []byte) {
	t.Helper()
	if !bytes.Equal(buf[off:off+len(want)], want) {
		for i := range want {
			if buf[off+i] != want[i] {
				t.Fatalf("%s: byte %d is %#x, want %#x", what, i, buf[off+i], want[i])
			}
		}
	}
	for i, c := range buf[:off] {
		if c != 0 {
			t.Fatalf("%s: byte %d before the target changed", what, i)
		}
	}
	for i, c := range buf[off+len(want):] {
		if c != 0 {
			t.Fatalf("%s: byte %d after the target changed", what, off+len(want)+i)
		}
	}
}

var sizes = []int{0, 1, 3, 4, 63, 64, 1399, 1400, 1401, 4096, 65535, 65536, 1 << 20}

func TestEndToEndOperations(t *testing.T) {
	yes, no := true, false
	for _, tc := range []struct {
		name string
		p    verbs.ConnParams
	}{
		{"rev2", verbs.ConnParams{}},
		{"rev2-crc", verbs.ConnParams{CRC: &yes}},
		{"rev1", verbs.ConnParams{MPARevision: 1}},
		{"rev1-crc", verbs.ConnParams{MPARevision: 1, CRC: &yes}},
		{"p2p-write", verbs.ConnParams{PeerToPeer: &yes, RTR: verbs.RTRWrite}},
		{"p2p-read", verbs.ConnParams{PeerToPeer: &yes, RTR: verbs.RTRRead}},
		{"p2p-send", verbs.ConnParams{PeerToPeer: &yes, RTR: verbs.RTRSend}},
		{"no-p2p", verbs.ConnParams{PeerToPeer: &no}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
			cl, sv := connect(t, p, 2<<20, tc.p)
			neg := cl.conn.Negotiated()
			if tc.p.CRC != nil && *tc.p.CRC != neg.CRC {
				t.Fatalf("CRC negotiated %v", neg.CRC)
			}
			if tc.p.MPARevision != 0 && neg.MPARevision != tc.p.MPARevision {
				t.Fatalf("revision %d", neg.MPARevision)
			}
			if tc.p.PeerToPeer != nil && *tc.p.PeerToPeer && (neg.RTR != tc.p.RTR || !neg.PeerToPeer || sv.conn.Negotiated().RTR != tc.p.RTR) {
				t.Fatalf("p2p negotiated %+v / %+v", neg, sv.conn.Negotiated())
			}
			exercise(t, cl, sv, sizes)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := cl.conn.Disconnect(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case <-sv.qp.Done():
			case <-ctx.Done():
				t.Fatal("server QP did not see the disconnect")
			}
			if cl.qp.Err() != nil || sv.qp.Err() != nil {
				t.Fatalf("clean disconnect reported errors: %v / %v", cl.qp.Err(), sv.qp.Err())
			}
		})
	}
}

func TestLargeMessages64MiB(t *testing.T) {
	if testing.Short() {
		t.Skip("64 MiB transfers skipped in -short mode")
	}
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl, sv := connect(t, p, 64<<20+64, verbs.ConnParams{})
	exercise(t, cl, sv, []int{64 << 20})
}
