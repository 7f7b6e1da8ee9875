package service

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

func connParamsFrom(m svc.Msg, at int, pdata []byte) verbs.ConnParams {
	return verbs.ConnParams{PrivateData: pdata, IRD: int(int64(m.Arg(at))), ORD: int(int64(m.Arg(at + 1))),
		CRC: svc.Untri(m.Arg(at + 2)), MPARevision: uint8(m.Arg(at + 3)), PeerToPeer: svc.Untri(m.Arg(at + 4)),
		RTR: verbs.RTR(m.Arg(at + 5)), Markers: svc.Untri(m.Arg(at + 6))}
}

func bool64(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func connReply(b *svc.Builder, c *verbs.Conn) {
	n := c.Negotiated()
	var a [svc.NegArgs]uint64
	a[svc.NegMPARevision] = uint64(n.MPARevision)
	a[svc.NegCRC] = bool64(n.CRC)
	a[svc.NegIRD] = uint64(n.IRD)
	a[svc.NegORD] = uint64(n.ORD)
	a[svc.NegPeerToPeer] = bool64(n.PeerToPeer)
	a[svc.NegRTR] = uint64(n.RTR)
	a[svc.NegMarkersTx] = bool64(n.MarkersTx)
	a[svc.NegMarkersRx] = bool64(n.MarkersRx)
	b.Args(a[:]...)
	// The fields in ConnField order.
	b.String(c.LocalAddr().String()).String(c.RemoteAddr().String()).Bytes(c.PeerPrivateData())
}

// takeConn counts a connection or listener against Limits.Conns and
// charges its memory.
func (x *session) takeConn(cost int64, what string) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.conns >= x.lim.Conns {
		return fmt.Errorf("%w: %d connections", verbs.ErrLimit, x.conns)
	}
	if err := x.chargeLocked(cost, what); err != nil {
		return err
	}
	x.conns++
	return nil
}

func (x *session) dropConn(cost int64) {
	x.mu.Lock()
	x.conns--
	x.memBytes -= cost
	x.mu.Unlock()
}

// listenerMemory is a listener's charge: itself and a full backlog of
// pending connection requests.
func listenerMemory(backlog int) int64 { return memListener + int64(backlog)*memRequest }

func (x *session) dial(ctx context.Context, b *svc.Builder, m svc.Msg) error {
	q, err := x.qp(m.Arg(0))
	if err != nil {
		return err
	}
	var f [3][]byte
	n, err := svc.Fields(m.Payload(), f[:])
	if err != nil || n < 2 {
		return fmt.Errorf("%w: DIAL needs an address and private data", verbs.ErrInvalidArgument)
	}
	raddr, err := netip.ParseAddrPort(string(f[0]))
	if err != nil {
		return fmt.Errorf("%w: %v", verbs.ErrInvalidArgument, err)
	}
	p := connParamsFrom(m, 1, f[1])
	if n == 3 {
		// The local address to connect from (rdma_bind_addr).
		if p.LocalAddr, err = svc.ParseLocalAddr(string(f[2])); err != nil {
			return fmt.Errorf("%w: local address: %v", verbs.ErrInvalidArgument, err)
		}
		if port := p.LocalAddr.Port(); port != 0 && port < privilegedPorts && x.cred.UID != 0 {
			return fmt.Errorf("%w: connecting from port %d needs root (ports below %d are privileged)", os.ErrPermission, port, privilegedPorts)
		}
	}
	cost := x.srv.connMemory()
	if err := x.takeConn(cost, "a connection"); err != nil {
		return err
	}
	c, err := x.dev.Dial(ctx, q.qp, raddr, p)
	if err != nil {
		x.dropConn(cost)
		return err
	}
	x.markConn(q, cost)
	connReply(b, c)
	return nil
}

// markConn records that q's connection counts against the limits
// (released with the QP).
func (x *session) markConn(q *servedQP, cost int64) {
	x.mu.Lock()
	if x.qps[q.num] == q && !q.conn {
		q.conn = true
		q.cost += cost
	} else {
		x.conns--
		x.memBytes -= cost
	}
	x.mu.Unlock()
}

// privilegedPorts: a client listens below this port only as root.
const privilegedPorts = 1024

func (x *session) listen(b *svc.Builder, m svc.Msg) error {
	var f [1][]byte
	if n, err := svc.Fields(m.Payload(), f[:]); err != nil || n != 1 {
		return fmt.Errorf("%w: LISTEN needs an address", verbs.ErrInvalidArgument)
	}
	// Empty: any address, any port; ":PORT": any address, that port.
	laddr, err := svc.ParseLocalAddr(string(f[0]))
	if err != nil {
		return fmt.Errorf("%w: listen address: %v", verbs.ErrInvalidArgument, err)
	}
	if p := laddr.Port(); p != 0 && p < privilegedPorts && x.cred.UID != 0 {
		// The service listens as root, on the address of the device:
		// a port below 1024 there is a claim to be a system service,
		// which only root may make, as on the host.
		return fmt.Errorf("%w: listening on port %d needs root (ports below %d are privileged)", os.ErrPermission, p, privilegedPorts)
	}
	backlog := int(min(m.Arg(0), 1024))
	if backlog <= 0 {
		backlog = defaultBacklog
	}
	cost := listenerMemory(backlog)
	if err := x.takeConn(cost, "a listener"); err != nil {
		return err
	}
	l, err := x.dev.Listen(laddr, verbs.ListenConfig{Backlog: backlog, MPATimeout: time.Duration(min(m.Arg(1), uint64(time.Minute)))})
	if err != nil {
		x.dropConn(cost)
		return err
	}
	x.mu.Lock()
	h := x.handle64()
	x.lns[h] = servedListener{l, cost}
	x.mu.Unlock()
	la := l.Addr()
	addr := ""
	if la.Addr().IsValid() {
		addr = la.Addr().String()
	}
	var a [svc.ListenArgs]uint64
	a[svc.ListenHandle] = h
	a[svc.ListenPort] = uint64(la.Port())
	b.Args(a[:]...).String(addr)
	return nil
}

// servedListener is a client's listener and what it is charged.
type servedListener struct {
	l    *verbs.Listener
	cost int64
}

func (x *session) closeListener(h uint64) error {
	x.mu.Lock()
	l, ok := x.lns[h]
	delete(x.lns, h)
	x.mu.Unlock()
	if !ok {
		return errNoHandle
	}
	l.l.Close()
	x.dropConn(l.cost)
	return nil
}

func (x *session) getRequest(ctx context.Context, b *svc.Builder, h uint64) error {
	x.mu.Lock()
	l, ok := x.lns[h]
	x.mu.Unlock()
	if !ok {
		return errNoHandle
	}
	r, err := l.l.GetRequest(ctx)
	if err != nil {
		return err
	}
	x.mu.Lock()
	if x.ctx.Err() != nil {
		x.mu.Unlock()
		r.Reject(nil)
		return net.ErrClosed
	}
	// Out of the backlog, the request is the client's to hold.
	if err := x.chargeLocked(memRequest, "a connection request"); err != nil {
		x.mu.Unlock()
		r.Reject(nil)
		return err
	}
	rh := x.handle64()
	x.reqs[rh] = r
	x.mu.Unlock()
	p2p, rtr := r.PeerToPeer()
	var a [svc.ReqArgs]uint64
	a[svc.ReqHandle] = rh
	a[svc.ReqMPARevision] = uint64(r.MPARevision())
	a[svc.ReqCRC] = bool64(r.CRC())
	a[svc.ReqIRD] = uint64(r.IRD())
	a[svc.ReqORD] = uint64(r.ORD())
	a[svc.ReqPeerToPeer] = bool64(p2p)
	a[svc.ReqRTR] = uint64(rtr)
	a[svc.ReqMarkers] = bool64(r.Markers())
	b.Args(a[:]...)
	// The fields in ReqField order.
	b.String(r.RemoteAddr().String()).Bytes(r.PrivateData())
	return nil
}

func (x *session) takeRequest(h uint64) (*verbs.ConnRequest, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	r := x.reqs[h]
	delete(x.reqs, h)
	if r == nil {
		return nil, errNoHandle
	}
	x.memBytes -= memRequest
	return r, nil
}

func (x *session) accept(ctx context.Context, b *svc.Builder, m svc.Msg) error {
	q, err := x.qp(m.Arg(1))
	if err != nil {
		return err
	}
	r, err := x.takeRequest(m.Arg(0))
	if err != nil {
		return err
	}
	var f [1][]byte
	if _, err := svc.Fields(m.Payload(), f[:]); err != nil {
		r.Reject(nil)
		return fmt.Errorf("%w: %v", verbs.ErrInvalidArgument, err)
	}
	if err := checkPrivateData(f[0]); err != nil {
		r.Reject(nil) // taken from the client's table: not to be left pending
		return err
	}
	cost := x.srv.connMemory()
	if err := x.takeConn(cost, "a connection"); err != nil {
		r.Reject(nil)
		return err
	}
	c, err := r.Accept(ctx, q.qp, connParamsFrom(m, 2, f[0]))
	if err != nil {
		x.dropConn(cost)
		return err
	}
	x.markConn(q, cost)
	connReply(b, c)
	return nil
}

func (x *session) reject(m svc.Msg) error {
	r, err := x.takeRequest(m.Arg(0))
	if err != nil {
		return err
	}
	var f [1][]byte
	svc.Fields(m.Payload(), f[:])
	if err := checkPrivateData(f[0]); err != nil {
		r.Reject(nil) // taken from the client's table: not to be left pending
		return err
	}
	return r.Reject(f[0])
}

// defaultBacklog is a listener's backlog when the client names none (the
// verbs' default).
const defaultBacklog = 64

// checkPrivateData refuses more private data than MPA carries.
func checkPrivateData(pd []byte) error {
	if len(pd) > iwarp.MPAMaxPrivateData {
		return fmt.Errorf("%w: %d bytes of private data, MPA carries at most %d", verbs.ErrInvalidArgument, len(pd), iwarp.MPAMaxPrivateData)
	}
	return nil
}
