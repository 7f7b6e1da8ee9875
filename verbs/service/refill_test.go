package service

import (
	"bytes"
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

// refillRig is a client of a service connected to a peer on an embedded
// device, with the service's ring poller held off at will.
type refillRig struct {
	t      *testing.T
	ctx    context.Context
	srv    *Server
	client *verbs.Device
	cq     *verbs.CQ
	qp     *verbs.QP
	srq    *verbs.SRQ
	mr     *verbs.MR
	buf    []byte
	served *servedQP
	// The peer.
	pqp  *verbs.QP
	pcq  *verbs.CQ
	pmr  *verbs.MR
	pbuf []byte
}

func newRefillRig(t *testing.T, withSRQ bool) *refillRig {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	na, nb, err := netstack.NewPair(netstack.PairConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { na.Close(); nb.Close() })
	dev, err := verbs.Open(na, verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	peer, err := verbs.Open(nb, verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	path := filepath.Join(t.TempDir(), "rt0.sock")
	ln, err := ListenSocket(path, -1)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := Serve(dev, ln, Config{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	r := &refillRig{t: t, ctx: ctx, srv: srv}
	if r.client, err = verbs.Connect(ctx, path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.client.Close() })

	pd, err := r.client.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	if r.cq, err = r.client.CreateCQ(16); err != nil {
		t.Fatal(err)
	}
	cfg := verbs.QPConfig{SendCQ: r.cq, RecvCQ: r.cq}
	if withSRQ {
		if r.srq, err = pd.CreateSRQ(8, 1); err != nil {
			t.Fatal(err)
		}
		cfg.SRQ = r.srq
	}
	if r.qp, err = pd.CreateQP(cfg); err != nil {
		t.Fatal(err)
	}
	mem, err := r.client.AllocBuffer(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	r.buf = mem.Bytes()
	if r.mr, err = pd.RegMR(r.buf, verbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}

	ppd, _ := peer.AllocPD()
	r.pcq, _ = peer.CreateCQ(16)
	if r.pqp, err = ppd.CreateQP(verbs.QPConfig{SendCQ: r.pcq, RecvCQ: r.pcq}); err != nil {
		t.Fatal(err)
	}
	r.pbuf = make([]byte, 64<<10)
	if r.pmr, err = ppd.RegMR(r.pbuf, verbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}

	l, err := r.client.Listen(netip.AddrPortFrom(na.Addrs()[0].Addr(), 0), verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dialed := make(chan error, 1)
	go func() {
		_, err := peer.Dial(ctx, r.pqp, netip.AddrPortFrom(na.Addrs()[0].Addr(), l.Addr().Port()), verbs.ConnParams{})
		dialed <- err
	}()
	req, err := l.GetRequest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := req.Accept(ctx, r.qp, verbs.ConnParams{}); err != nil {
		t.Fatal(err)
	}
	if err := <-dialed; err != nil {
		t.Fatal(err)
	}
	x := r.session()
	x.mu.Lock()
	r.served = x.qps[r.qp.Num()]
	x.mu.Unlock()
	if r.served == nil {
		t.Fatal("the service has no QP of the client's number")
	}
	return r
}

// session is the rig's client's session.
func (r *refillRig) session() *session {
	r.srv.mu.Lock()
	defer r.srv.mu.Unlock()
	for x := range r.srv.sessions {
		return x
	}
	r.t.Fatal("no session")
	return nil
}

// holdPoller keeps the session's ring poller (and the reader's passes)
// from taking entries until the returned function runs (at the latest
// when the test ends).
func (r *refillRig) holdPoller() func() {
	x := r.session()
	x.pollMu.Lock()
	release := sync.OnceFunc(x.pollMu.Unlock)
	r.t.Cleanup(release)
	return release
}

// send has the peer Send n bytes of v from offset off of its buffer.
func (r *refillRig) send(off, n int, v byte) {
	copy(r.pbuf[off:off+n], bytes.Repeat([]byte{v}, n))
	if err := r.pqp.PostSend(verbs.SendWR{ID: 1, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{r.pmr.SGE(off, n)}}); err != nil {
		r.t.Fatal(err)
	}
}

// recvWC waits for the client's next completion, or fails the test when
// the service's QP ends first (a Terminate: no buffer).
func (r *refillRig) recvWC() verbs.WC {
	r.t.Helper()
	type res struct {
		wc  verbs.WC
		err error
	}
	ch := make(chan res, 1)
	go func() {
		var wc [1]verbs.WC
		_, err := r.cq.Wait(r.ctx, wc[:])
		ch <- res{wc[0], err}
	}()
	select {
	case x := <-ch:
		if x.err != nil {
			r.t.Fatalf("waiting for a completion: %v", x.err)
		}
		return x.wc
	case <-r.served.qp.Done():
		r.t.Fatalf("the QP ended before the receive completed: %v", r.served.qp.Err())
	}
	return verbs.WC{}
}

// checkRecv checks a successful receive of n bytes of v at off.
func (r *refillRig) checkRecv(wc verbs.WC, id uint64, off, n int, v byte) {
	r.t.Helper()
	if err := wc.Err(); err != nil || wc.Op != verbs.WCRecv || wc.ID != id || int(wc.ByteLen) != n {
		r.t.Fatalf("completion %+v (%v), want RECV %d of %d bytes", wc, err, id, n)
	}
	if !bytes.Equal(r.buf[off:off+n], bytes.Repeat([]byte{v}, n)) {
		r.t.Fatalf("receive %d: the bytes differ", id)
	}
}

func (r *refillRig) postRecv(id uint64, off, n int) {
	r.t.Helper()
	wr := verbs.RecvWR{ID: id, SGL: []verbs.SGE{r.mr.SGE(off, n)}}
	var err error
	if r.srq != nil {
		err = r.srq.PostRecv(wr)
	} else {
		err = r.qp.PostRecv(wr)
	}
	if err != nil {
		r.t.Fatal(err)
	}
}

// TestRefillOnMiss: a receive the client has published in its ring but
// the poller has not taken yet is there for a Send that arrives first:
// the engine takes it from the ring (the poller is held off throughout),
// the message lands in it, and the poller, let go, takes no entry twice.
func TestRefillOnMiss(t *testing.T) {
	for _, withSRQ := range []bool{false, true} {
		name := "RQ"
		if withSRQ {
			name = "SRQ"
		}
		t.Run(name, func(t *testing.T) {
			r := newRefillRig(t, withSRQ)
			release := r.holdPoller()
			r.postRecv(7, 0, 4096)
			r.send(0, 512, 0xa5)
			wc := r.recvWC()
			release()
			r.checkRecv(wc, 7, 0, 512, 0xa5)

			// The poller runs again: the next receive is taken once.
			r.postRecv(8, 4096, 4096)
			r.send(4096, 300, 0x5a)
			r.checkRecv(r.recvWC(), 8, 4096, 300, 0x5a)
			if err := r.served.qp.Err(); err != nil {
				t.Fatalf("QP: %v", err)
			}
		})
	}
}

// TestRefillMalformed: a malformed receive entry that the engine's refill
// finds completes in error, as the poller's would, and the valid one
// behind it takes the message.
func TestRefillMalformed(t *testing.T) {
	r := newRefillRig(t, false)
	r.holdPoller()
	// Write the ring as a hostile client would: an entry with more SGEs
	// than the QP's receives may have, then a valid one.
	ring := r.served.rq
	prod := ring.Prod.Load()
	svc.PutRecv(ring.Entry(prod), 5, make([]iwarp.SGE, 1))
	e := ring.Entry(prod)
	e[8], e[9] = 0xff, 0xff // the SGE count
	sge := r.mr.SGE(0, 4096)
	svc.PutRecv(ring.Entry(prod+1), 6, []iwarp.SGE{{Addr: sge.Addr, Length: sge.Length, LKey: uint32(sge.LKey)}})
	ring.Prod.Store(prod + 2)
	r.send(0, 100, 0x33)
	wc := r.recvWC()
	if wc.ID != 5 || wc.Status != verbs.StatusLocalQPOp || wc.Op != verbs.WCRecv {
		t.Fatalf("completion %+v, want RECV 5 with a local QP operation error", wc)
	}
	r.checkRecv(r.recvWC(), 6, 0, 100, 0x33)
}

// TestSRQMalformed: a malformed entry in an SRQ's ring is dropped with an
// SRQ_ERR event naming the SRQ, whether the engine's refill or the poller
// finds it; the entries behind it are taken.
func TestSRQMalformed(t *testing.T) {
	r := newRefillRig(t, true)
	x := r.session()
	x.mu.Lock()
	var s *servedSRQ
	for _, v := range x.srqs {
		s = v
	}
	x.mu.Unlock()
	// put writes a malformed entry and a valid one, as a hostile client
	// would.
	put := func(bad, valid uint64, off int) {
		prod := s.ring.Prod.Load()
		e := s.ring.Entry(prod)
		svc.PutRecv(e, bad, nil)
		e[8] = 2 // SGEs: the SRQ's receives have at most 1
		prod++
		{
			sge := r.mr.SGE(off, 4096)
			svc.PutRecv(s.ring.Entry(prod), valid, []iwarp.SGE{{Addr: sge.Addr, Length: sge.Length, LKey: uint32(sge.LKey)}})
			prod++
		}
		s.ring.Prod.Store(prod)
	}
	srqErr := func(id string) {
		t.Helper()
		for {
			select {
			case e := <-r.client.Events():
				if e.Type != verbs.EventSRQErr {
					continue
				}
				if e.SRQ != r.srq || e.Err == nil || !strings.Contains(e.Err.Error(), id) {
					t.Fatalf("SRQ_ERR event of SRQ %p (want %p): %v (want receive %s)", e.SRQ, r.srq, e.Err, id)
				}
				return
			case <-r.ctx.Done():
				t.Fatalf("no SRQ_ERR event for receive %s", id)
			}
		}
	}

	// The engine's refill finds the entries.
	release := r.holdPoller()
	put(0x51, 0x52, 0)
	r.send(0, 200, 0x44)
	r.checkRecv(r.recvWC(), 0x52, 0, 200, 0x44)
	srqErr("0x51")
	release()

	// The poller finds them (the client's own posts would now find its
	// producer index behind the ring's: the entries above were not its).
	put(0x61, 0x62, 4096)
	x.kick()
	srqErr("0x61")
	r.send(4096, 10, 0x55)
	r.checkRecv(r.recvWC(), 0x62, 4096, 10, 0x55)
}
