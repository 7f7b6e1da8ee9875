package verbs

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

func connArgs(b *svc.Builder, p ConnParams) {
	b.Args(uint64(int64(p.IRD)), uint64(int64(p.ORD)), svc.Tri(p.CRC), uint64(p.MPARevision), svc.Tri(p.PeerToPeer),
		uint64(p.RTR), svc.Tri(p.Markers))
}

// connFrom reads a DIAL or ACCEPT reply: negotiated parameters, the
// addresses and the peer's private data.
func connFrom(qp *QP, m svc.Msg) (*Conn, error) {
	var f [svc.ConnFields][]byte
	if n, err := svc.Fields(m.Payload(), f[:]); err != nil || n != svc.ConnFields {
		return nil, fmt.Errorf("verbs: malformed connection reply from the service")
	}
	la, err1 := netip.ParseAddrPort(string(f[svc.ConnFieldLocal]))
	ra, err2 := netip.ParseAddrPort(string(f[svc.ConnFieldRemote]))
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("verbs: malformed addresses from the service")
	}
	neg := Negotiated{MPARevision: uint8(m.Arg(svc.NegMPARevision)), CRC: m.Arg(svc.NegCRC) != 0, IRD: int(m.Arg(svc.NegIRD)),
		ORD: int(m.Arg(svc.NegORD)), PeerToPeer: m.Arg(svc.NegPeerToPeer) != 0, RTR: RTR(m.Arg(svc.NegRTR)),
		MarkersTx: m.Arg(svc.NegMarkersTx) != 0, MarkersRx: m.Arg(svc.NegMarkersRx) != 0}
	return &Conn{qp: qp, peerData: append([]byte(nil), f[svc.ConnFieldPrivateData]...), neg: neg, laddr: la, raddr: ra}, nil
}

func (cl *client) dial(ctx context.Context, qp *QP, raddr netip.AddrPort, p ConnParams) (*Conn, error) {
	d := cl.dev
	if qp == nil || qp.remote() == nil || qp.pd.dev != d {
		return nil, fmt.Errorf("%w: QP of another device", ErrInvalidArgument)
	}
	local := ""
	if p.LocalAddr.Port() != 0 {
		if cl.features&svc.FeatureCM == 0 {
			return nil, fmt.Errorf("%w: the service cannot connect from a chosen port (no CM feature)", ErrInvalidArgument)
		}
		local = svc.FormatLocalAddr(p.LocalAddr)
	}
	r, err := d.client().do(ctx, svc.TDial, func(b *svc.Builder) {
		b.Args(uint64(qp.remote().num))
		connArgs(b, p)
		b.String(raddr.String()).Bytes(p.PrivateData)
		if local != "" {
			b.String(local)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("verbs: connect %v: %w", raddr, err)
	}
	return connFrom(qp, r.m)
}

func (cl *client) listen(laddr netip.AddrPort, cfg ListenConfig) (*Listener, error) {
	d := cl.dev
	addr := "" // any address, any port
	switch {
	case laddr.IsValid():
		addr = laddr.String()
	case laddr.Port() != 0:
		addr = ":" + strconv.Itoa(int(laddr.Port())) // any address, this port (perftest's 18515)
	}
	r, err := d.client().do(context.Background(), svc.TListen, func(b *svc.Builder) {
		b.Args(uint64(cfg.Backlog), uint64(cfg.MPATimeout)).String(addr)
	})
	if err != nil {
		return nil, fmt.Errorf("verbs: listen %v: %w", laddr, err)
	}
	var f [1][]byte
	svc.Fields(r.m.Payload(), f[:])
	var ip netip.Addr // the unspecified address: listening on all
	if len(f[0]) > 0 {
		if ip, err = netip.ParseAddr(string(f[0])); err != nil {
			return nil, fmt.Errorf("verbs: malformed listen address from the service")
		}
	}
	l := &Listener{dev: d, closed: make(chan struct{})}
	l.ops = &remoteListener{l: l, h: r.m.Arg(svc.ListenHandle), laddr: netip.AddrPortFrom(ip, uint16(r.m.Arg(svc.ListenPort)))}
	d.mu.Lock()
	d.listeners[l] = struct{}{}
	d.mu.Unlock()
	return l, nil
}

// remoteListener is a listener of a service: its handle and address.
type remoteListener struct {
	l     *Listener
	h     uint64
	laddr netip.AddrPort
}

func (rl *remoteListener) addr() netip.AddrPort { return rl.laddr }

func (rl *remoteListener) getRequest(ctx context.Context) (*ConnRequest, error) {
	l := rl.l
	select {
	case <-l.closed:
		return nil, net.ErrClosed
	default:
	}
	r, err := l.dev.client().do(ctx, svc.TGetRequest, func(b *svc.Builder) { b.Args(rl.h) })
	if err != nil {
		return nil, err
	}
	m := r.m
	var f [svc.ReqFields][]byte
	if n, err := svc.Fields(m.Payload(), f[:]); err != nil || n != svc.ReqFields {
		return nil, fmt.Errorf("verbs: malformed connection request from the service")
	}
	ra, _ := netip.ParseAddrPort(string(f[svc.ReqFieldAddr]))
	req := &iwarp.MPARequest{Revision: uint8(m.Arg(svc.ReqMPARevision)), CRC: m.Arg(svc.ReqCRC) != 0,
		Enhanced: m.Arg(svc.ReqMPARevision) == 2,
		V2: iwarp.MPAv2Params{IRD: uint16(m.Arg(svc.ReqIRD)), ORD: uint16(m.Arg(svc.ReqORD)),
			PeerToPeer: m.Arg(svc.ReqPeerToPeer) != 0, RTR: iwarp.RTR(m.Arg(svc.ReqRTR))},
		PrivateData: append([]byte(nil), f[svc.ReqFieldPrivateData]...), Markers: m.Arg(svc.ReqMarkers) != 0}
	cr := &ConnRequest{l: l, req: req}
	cr.ops = &remoteRequest{r: cr, h: m.Arg(svc.ReqHandle), raddr: ra}
	return cr, nil
}

func (rl *remoteListener) close() error {
	l := rl.l
	l.once.Do(func() {
		close(l.closed)
		l.dev.client().do(context.Background(), svc.TCloseListener, func(b *svc.Builder) { b.Args(rl.h) })
		l.dev.mu.Lock()
		delete(l.dev.listeners, l)
		l.dev.mu.Unlock()
	})
	return nil
}

// remoteRequest is a connection request a service passed on: its handle
// and the initiator's address.
type remoteRequest struct {
	r     *ConnRequest
	h     uint64
	raddr netip.AddrPort
}

func (rr *remoteRequest) remoteAddr() netip.AddrPort { return rr.raddr }

func (rr *remoteRequest) accept(ctx context.Context, qp *QP, p ConnParams) (*Conn, error) {
	r := rr.r
	if qp == nil || qp.remote() == nil || qp.pd.dev != r.l.dev {
		return nil, fmt.Errorf("%w: QP of another device", ErrInvalidArgument)
	}
	if err := r.claim(); err != nil {
		return nil, err
	}
	rep, err := r.l.dev.client().do(ctx, svc.TAccept, func(b *svc.Builder) {
		b.Args(rr.h, uint64(qp.remote().num))
		connArgs(b, p)
		b.Bytes(p.PrivateData)
	})
	if err != nil {
		return nil, err
	}
	return connFrom(qp, rep.m)
}

func (rr *remoteRequest) reject(privateData []byte) error {
	r := rr.r
	if err := r.claim(); err != nil {
		return err
	}
	_, err := r.l.dev.client().do(context.Background(), svc.TReject, func(b *svc.Builder) { b.Args(rr.h).Bytes(privateData) })
	return err
}
