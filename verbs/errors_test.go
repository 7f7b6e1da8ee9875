package verbs_test

import (
	"context"
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/service"
	"github.com/rdmatap/rdmatap/zerocopy"
)

// TestErrorsAlike: every error case gives an error that errors.Is matches
// against the same verbs sentinel on an embedded device and on a device of
// a service, whichever layer found it.
func TestErrorsAlike(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startService(t, p.a, service.Limits{})
	// Listeners that refuse requests for markers, as Linux siw does.
	for _, d := range []*verbs.Device{p.a, p.b} {
		l, err := d.Listen(netip.AddrPortFrom(netip.Addr{}, 7002), verbs.ListenConfig{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
	}
	kinds := []struct {
		name string
		dev  *verbs.Device
		peer netip.AddrPort
	}{{"embedded", p.b, netip.AddrPortFrom(p.na.Addrs()[0].Addr(), 7001)}, {"service", connectService(t, path), netip.AddrPortFrom(p.nb.Addrs()[0].Addr(), 7001)}}
	cases := []struct {
		name string
		want error
		run  func(e *errEnv) error
	}{
		{"CQ of no entries", verbs.ErrInvalidArgument, func(e *errEnv) error { _, err := e.d.CreateCQ(0); return err }},
		{"QP of 100 SGEs", verbs.ErrInvalidArgument, func(e *errEnv) error {
			_, err := e.pd.CreateQP(verbs.QPConfig{SendCQ: e.cq, RecvCQ: e.cq, MaxSendSGE: 100})
			return err
		}},
		{"MR with unknown access flags", verbs.ErrInvalidArgument, func(e *errEnv) error {
			_, err := e.pd.RegMR(e.mem[:4096], verbs.Access(1<<30))
			return err
		}},
		{"MR with remote write but not local write", verbs.ErrInvalidArgument, func(e *errEnv) error {
			_, err := e.pd.RegMR(e.mem[:4096], verbs.AccessRemoteWrite)
			return err
		}},
		{"send of an unknown opcode", verbs.ErrInvalidWR, func(e *errEnv) error {
			return e.qp.PostSend(verbs.SendWR{Op: verbs.Opcode(200), SGL: []verbs.SGE{e.mr.SGE(0, 8)}})
		}},
		{"send of too many SGEs", verbs.ErrTooManySGE, func(e *errEnv) error {
			sgl := make([]verbs.SGE, 5)
			for i := range sgl {
				sgl[i] = e.mr.SGE(i*8, 8)
			}
			return e.qp.PostSend(verbs.SendWR{Op: verbs.OpSend, SGL: sgl})
		}},
		{"inline send beyond MaxInline", verbs.ErrInvalidWR, func(e *errEnv) error {
			return e.qp.PostSend(verbs.SendWR{Op: verbs.OpSend, Flags: verbs.Inline, SGL: []verbs.SGE{e.mr.SGE(0, 1024)}})
		}},
		{"RDMA Read of two SGEs", verbs.ErrTooManySGE, func(e *errEnv) error {
			return e.qp.PostSend(verbs.SendWR{Op: verbs.OpRead, SGL: []verbs.SGE{e.mr.SGE(0, 8), e.mr.SGE(8, 8)}})
		}},
		{"receive of too many SGEs", verbs.ErrTooManySGE, func(e *errEnv) error {
			sgl := make([]verbs.SGE, 5)
			for i := range sgl {
				sgl[i] = e.mr.SGE(i*8, 8)
			}
			return e.qp.PostRecv(verbs.RecvWR{SGL: sgl})
		}},
		{"send on a closed QP", verbs.ErrInvalidState, func(e *errEnv) error {
			qp, err := e.pd.CreateQP(verbs.QPConfig{SendCQ: e.cq, RecvCQ: e.cq})
			if err != nil {
				return err
			}
			qp.Close()
			return qp.PostSend(verbs.SendWR{Op: verbs.OpSend, SGL: []verbs.SGE{e.mr.SGE(0, 8)}})
		}},
		{"receive on a closed QP", verbs.ErrInvalidState, func(e *errEnv) error {
			qp, err := e.pd.CreateQP(verbs.QPConfig{SendCQ: e.cq, RecvCQ: e.cq})
			if err != nil {
				return err
			}
			qp.Close()
			return qp.PostRecv(verbs.RecvWR{SGL: []verbs.SGE{e.mr.SGE(0, 8)}})
		}},
		{"closing a CQ a QP uses", verbs.ErrBusy, func(e *errEnv) error { return e.cq.Close() }},
		{"freeing a PD that holds objects", verbs.ErrBusy, func(e *errEnv) error { return e.pd.Close() }},
		{"listening on an address not the device's", syscall.EADDRNOTAVAIL, func(e *errEnv) error {
			_, err := e.d.Listen(netip.MustParseAddrPort("198.51.100.1:7000"), verbs.ListenConfig{})
			return err
		}},
		{"dialing with more private data than MPA carries", verbs.ErrInvalidArgument, func(e *errEnv) error {
			return e.dial(e.peer, verbs.ConnParams{PrivateData: make([]byte, 5000)})
		}},
		{"dialing with markers a peer that refuses them", verbs.ErrMarkers, func(e *errEnv) error {
			yes := true
			return e.dial(netip.AddrPortFrom(e.peer.Addr(), 7002), verbs.ConnParams{Markers: &yes})
		}},
		{"dialing a port no one listens on", syscall.ECONNREFUSED, func(e *errEnv) error {
			return e.dial(e.peer, verbs.ConnParams{})
		}},
	}
	for _, k := range kinds {
		pd, err := k.dev.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		cq, err := k.dev.CreateCQ(16)
		if err != nil {
			t.Fatal(err)
		}
		qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
		if err != nil {
			t.Fatal(err)
		}
		buf, err := zerocopy.AllocShared("errs", 1<<16)
		if err != nil {
			t.Fatal(err)
		}
		defer buf.Close()
		mr, err := pd.RegMR(buf.Bytes(), verbs.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		e := &errEnv{d: k.dev, pd: pd, cq: cq, qp: qp, mr: mr, mem: buf.Bytes(), peer: k.peer}
		for _, c := range cases {
			err := c.run(e)
			if !errors.Is(err, c.want) {
				t.Errorf("%s device, %s: %v, want an error matching %v", k.name, c.name, err, c.want)
			}
		}
	}
}

// errEnv is what TestErrorsAlike's cases work on, on one kind of device.
type errEnv struct {
	d    *verbs.Device
	pd   *verbs.PD
	cq   *verbs.CQ
	qp   *verbs.QP
	mr   *verbs.MR
	mem  []byte
	peer netip.AddrPort // an address of the other device, a port no one listens on
}

// dial connects a new QP of the environment's to raddr and returns the
// error.
func (e *errEnv) dial(raddr netip.AddrPort, p verbs.ConnParams) error {
	qp, err := e.pd.CreateQP(verbs.QPConfig{SendCQ: e.cq, RecvCQ: e.cq})
	if err != nil {
		return err
	}
	defer qp.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = e.d.Dial(ctx, qp, raddr, p)
	return err
}
