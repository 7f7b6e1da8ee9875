package netstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"syscall"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	owntcp "github.com/rdmatap/rdmatap/netstack/tcp"
)

// The TCPs a Stack's connections can run on (Config.TCP).
const (
	// TCPGVisor is gVisor's TCP, the default.
	TCPGVisor = "gvisor"
	// TCPRdmatap is rdmatap's own TCP (package netstack/tcp), registered
	// with the stack in place of gVisor's.
	TCPRdmatap = "rdmatap"
)

// TCPEnv is the environment variable that names the TCP of a stack
// whose Config.TCP is empty.
const TCPEnv = "RDMATAP_TCP"

// ParseTCP checks the name of a TCP: "gvisor" or "rdmatap"; "" is the
// default, $RDMATAP_TCP when it is set, gVisor's otherwise.
func ParseTCP(name string) (string, error) {
	if name == "" {
		name = os.Getenv(TCPEnv)
	}
	switch name {
	case "", TCPGVisor:
		return TCPGVisor, nil
	case TCPRdmatap:
		return TCPRdmatap, nil
	}
	return "", errConfig(fmt.Sprintf("unknown TCP %q (want gvisor or rdmatap)", name))
}

// ownConfig is the configuration of the own TCP's connections.
func ownConfig(cfg Config, rcvMax, sndMax int, peerTimeout time.Duration) owntcp.Config {
	c := owntcp.Config{RcvBuf: rcvMax, SndBuf: sndMax, MinRTO: cfg.MinRTO, NoSACK: cfg.NoSACK}
	if cfg.CongestionControl == "reno" {
		c.CongestionControl = owntcp.CCReno // otherwise Cubic ("auto" too: it never changes)
	}
	if cfg.AckDelay < 0 {
		c.AckDelay = -1
	} else if cfg.AckDelay > 0 {
		c.AckDelay = cfg.AckDelay
	}
	if peerTimeout > 0 {
		c.KeepaliveIdle, c.KeepaliveInterval, c.KeepaliveCount = peerTimeout/2, peerTimeout/4, 2
		c.UserTimeout = peerTimeout
	}
	return c
}

// tapOwn is TapSegmentsRetain on the own TCP: the transport hands the
// tap each segment whose checksum verified, before it takes it.
func (c *Conn) tapOwn(fn func(off uint64, payload [][]byte, retain func() Kept), stats *ConnTapStats) (remove func(), err error) {
	irs, ok := c.own.IRS()
	if !ok {
		return nil, c.ownErr("tap", owntcp.ErrState)
	}
	ct := newConnTap(c, uint32(irs), fn, stats)
	untap := c.own.SetSegmentTap(func(s *owntcp.Segment, pkt *stack.PacketBuffer) {
		if s.PayloadLen() == 0 {
			return
		}
		ct.mu.Lock()
		defer ct.mu.Unlock()
		if ct.removed.Load() {
			return
		}
		if s.Flags&(header.TCPFlagSyn|header.TCPFlagRst) != 0 || s.Flags&header.TCPFlagAck == 0 {
			ct.stats.BadFlags.Add(1)
			return
		}
		if ps := s.Pieces(); ps != nil {
			// In several pieces of the packet's memory.
			ct.deliver(uint32(s.Seq), s.PayloadLen(), pkt, ps)
			return
		}
		one := [1][]byte{s.Payload}
		ct.deliver(uint32(s.Seq), len(s.Payload), pkt, one[:])
	})
	return ct.remover(untap), nil
}

// TCPName is the TCP the stack's connections run on: TCPGVisor or
// TCPRdmatap.
func (s *Stack) TCPName() string {
	if s.own != nil {
		return TCPRdmatap
	}
	return TCPGVisor
}

// ownTCPStats is TCPStats on the own TCP: its connections' counters
// summed. It tells recoveries apart by what started them only as far as
// the own TCP does (fast retransmits and SACK recoveries are one count).
func (s *Stack) ownTCPStats() TCPStats {
	i := s.own.Stats()
	r := s.nic.rp.stats()
	return TCPStats{
		SegmentsSent: i.SegsOut, SegmentsReceived: i.SegsIn, Retransmits: i.RetransSegs,
		FastRetransmits: i.Recoveries, Timeouts: i.Timeouts, SACKRecoveries: i.Recoveries,
		TLPRecoveries: i.TLPs, SpuriousRecoveries: i.Undos, DSACKs: i.DSACKsIn,
		FastRecoveries:    i.Recoveries,
		LinkResentPackets: r.Resent, LinkResentBytes: r.ResentBytes,
	}
}

// TransportEndpoints is how many transport endpoints (connections,
// TIME-WAIT included, and listeners) the stack holds: gVisor's registered
// endpoints, or the own TCP's.
func (s *Stack) TransportEndpoints() int {
	if s.own != nil {
		return s.own.Endpoints()
	}
	return len(s.s.RegisteredEndpoints())
}

// ownErr is ownError for a call on c: net.ErrClosed once c is closed.
func (c *Conn) ownErr(op string, err error) error {
	if c.closed.Load() {
		return closedError(op)
	}
	return ownError(op, c.RemoteAddr().String(), err)
}

// ownError maps an error of the own TCP to netstack's.
func ownError(op, addr string, err error) error {
	var mapped error
	switch {
	case errors.Is(err, owntcp.ErrReset), errors.Is(err, owntcp.ErrAborted):
		mapped = ErrReset
	case errors.Is(err, owntcp.ErrTimeout):
		mapped = ErrTimeout
	case errors.Is(err, owntcp.ErrRefused):
		return &OpError{Op: op, Addr: addr, Err: syscall.ECONNREFUSED}
	case errors.Is(err, owntcp.ErrClosed), errors.Is(err, owntcp.ErrState):
		return &OpError{Op: op, Addr: addr, Err: syscall.EPIPE}
	case errors.Is(err, io.ErrClosedPipe):
		return closedError(op)
	default:
		mapped = err
	}
	return &OpError{Op: op, Addr: addr, Err: mapped}
}

func newOwnConn(s *Stack, e *owntcp.Endpoint) *Conn {
	c := &Conn{s: s, own: e, closedCh: make(chan struct{}), done: make(chan struct{}), wsem: make(chan struct{}, 1)}
	id := e.ID()
	c.addrs.Store(&connAddrs{
		local:  netip.AddrPortFrom(fromTCPIPAddr(id.LocalAddress), id.LocalPort),
		remote: netip.AddrPortFrom(fromTCPIPAddr(id.RemoteAddress), id.RemotePort),
	})
	e.SetOnClose(c.markDone)
	return c
}

// dialOwn is Dial on the own TCP.
func (s *Stack) dialOwn(ctx context.Context, laddr, raddr netip.AddrPort) (*Conn, error) {
	proto := header.IPv4ProtocolNumber
	if raddr.Addr().Is6() {
		proto = header.IPv6ProtocolNumber
	}
	var la tcpip.FullAddress
	if a := laddr.Addr(); a.IsValid() && !a.IsUnspecified() {
		if !s.hasAddr(a) {
			return nil, &OpError{Op: "dial", Addr: raddr.String(), Err: syscall.EADDRNOTAVAIL}
		}
		la.Addr = toTCPIPAddr(a)
	}
	la.Port = laddr.Port()
	if s.isClosed() {
		return nil, closedError("dial")
	}
	e, err := s.own.Dial(ctx, nicID, la, tcpip.FullAddress{Addr: toTCPIPAddr(raddr.Addr()), Port: raddr.Port()}, proto)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return nil, err
		}
		var re *owntcp.RouteError
		if errors.As(err, &re) {
			return nil, opError("dial", raddr.String(), re.Err)
		}
		if errors.Is(err, owntcp.ErrAddrInUse) {
			return nil, &OpError{Op: "dial", Addr: raddr.String(), Err: syscall.EADDRINUSE}
		}
		return nil, ownError("dial", raddr.String(), err)
	}
	c := newOwnConn(s, e)
	if !s.trackConn(c) {
		e.Abort()
		return nil, closedError("dial")
	}
	return c, nil
}

// hasAddr reports whether a is one of the NIC's addresses.
func (s *Stack) hasAddr(a netip.Addr) bool {
	for _, p := range s.addrs {
		if p.Addr() == a.Unmap() {
			return true
		}
	}
	return false
}

// listenOwn is Listen on the own TCP, which listens on a port on every
// address of the stack.
func (s *Stack) listenOwn(laddr netip.AddrPort, backlog int) (*Listener, error) {
	addr := laddr.Addr()
	if addr.IsValid() && !addr.IsUnspecified() && !s.hasAddr(addr) {
		return nil, &OpError{Op: "listen", Addr: laddr.String(), Err: syscall.EADDRNOTAVAIL}
	}
	s.listenMu.Lock()
	defer s.listenMu.Unlock()
	var ol *owntcp.Listener
	var err error
	if port := laddr.Port(); port != 0 {
		if s.listenerOn(addr, port) {
			return nil, &OpError{Op: "listen", Addr: laddr.String(), Err: syscall.EADDRINUSE}
		}
		ol, err = s.own.Listen(port, backlog)
	} else {
		first, last := s.s.PortRange()
		n := int(last) - int(first) + 1
		off := rand.IntN(n)
		for i := 0; i < n; i++ {
			p := uint16(int(first) + (off+i)%n)
			if s.listenerOn(addr, p) {
				continue
			}
			if ol, err = s.own.Listen(p, backlog); err == nil {
				break
			}
		}
	}
	if err != nil || ol == nil {
		return nil, &OpError{Op: "listen", Addr: laddr.String(), Err: syscall.EADDRINUSE}
	}
	if !addr.IsValid() {
		addr = netip.IPv4Unspecified()
		if s.has6 && !s.has4 {
			addr = netip.IPv6Unspecified()
		}
	}
	l := &Listener{s: s, own: ol, addr: netip.AddrPortFrom(addr, ol.Port()), closedCh: make(chan struct{})}
	if !s.trackListener(l) {
		ol.Close()
		return nil, closedError("listen")
	}
	return l, nil
}

// acceptOwn is Accept on the own TCP (Close ends the own listener's
// Accept too). A connection to an address other than the listener's is
// reset.
func (l *Listener) acceptOwn(ctx context.Context) (*Conn, error) {
	for {
		e, err := l.own.Accept(ctx)
		if err != nil {
			select {
			case <-l.closedCh:
				return nil, closedError("accept")
			default:
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, &OpError{Op: "accept", Addr: l.addr.String(), Err: err}
		}
		if a := l.addr.Addr(); !a.IsUnspecified() && fromTCPIPAddr(e.ID().LocalAddress) != a {
			e.Abort()
			continue
		}
		c := newOwnConn(l.s, e)
		if !l.s.trackConn(c) {
			e.Abort()
			return nil, closedError("accept")
		}
		return c, nil
	}
}

// ownReadTo is readTo on the own TCP.
func (c *Conn) ownReadTo(ctx context.Context, w io.Writer, max int, block bool) (int, error) {
	// Pooled, as readTo's: the guard escapes through the io.Writer.
	st := readStatePool.Get().(*readState)
	defer func() {
		*st = readState{}
		readStatePool.Put(st)
	}()
	g := &st.guard
	g.w = w
	for {
		if c.closed.Load() {
			return 0, closedError("read")
		}
		n, err := c.own.TryReadTo(g, max)
		if n > 0 {
			c.readBytes.Add(uint64(n))
			if g.err != nil {
				return n, g.err
			}
			return n, nil
		}
		switch {
		case g.err != nil:
			return 0, g.err
		case g.short:
			return 0, io.ErrShortWrite
		case err == io.EOF:
			return 0, io.EOF
		case err != nil:
			return 0, c.ownErr("read", err)
		}
		if !block {
			return 0, nil
		}
		select {
		case <-c.own.ReadWake():
		case <-c.closedCh:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// ownWaitReadable is WaitReadableOr on the own TCP.
func (c *Conn) ownWaitReadable(ctx context.Context, wake <-chan struct{}) error {
	return c.ownWait(ctx, wake, c.own.Readable)
}

// ownWaitUnread is WaitUnreadOr on the own TCP (its spin is not used).
func (c *Conn) ownWaitUnread(ctx context.Context, wake <-chan struct{}, had func() int) error {
	return c.ownWait(ctx, wake, func() bool {
		if c.own.State() != owntcp.Established {
			return true
		}
		h := had()
		return h < 0 || c.own.Buffered() > h
	})
}

// ownWait returns nil once done reports true or wake delivers, checking
// done at each of the connection's wake-ups.
func (c *Conn) ownWait(ctx context.Context, wake <-chan struct{}, done func() bool) error {
	for {
		if c.closed.Load() {
			return closedError("read")
		}
		if done() {
			return nil
		}
		select {
		case <-c.own.ReadWake():
		case <-c.closedCh:
		case <-ctx.Done():
			return ctx.Err()
		case <-wake:
			return nil
		}
	}
}

// ownWrite is writePayload on the own TCP: the bytes go from pl straight
// into the connection's send buffer.
func (c *Conn) ownWrite(ctx context.Context, pl tcpip.Payloader, g *payloadGuard) (int64, error) {
	if err := c.lockWrite(ctx); err != nil {
		return 0, err
	}
	defer func() { <-c.wsem }()
	var total int64
	var rec owntcp.Records
	if g != nil {
		if rp, ok := g.pl.(RecordPayloader); ok {
			rec = rp
		}
	}
	for pl.Len() > 0 {
		if c.closed.Load() {
			return total, closedError("write")
		}
		n, err := c.own.TryWriteFrom(pl, pl.Len(), rec)
		total += int64(n)
		if err != nil {
			if g != nil && g.err != nil {
				return total, &OpError{Op: "write", Err: g.err}
			}
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return total, &OpError{Op: "write", Err: io.ErrUnexpectedEOF}
			}
			return total, c.ownErr("write", err)
		}
		if n > 0 {
			continue
		}
		select {
		case <-c.own.WriteWake():
		case <-c.closedCh:
		case <-ctx.Done():
			return total, ctx.Err()
		}
	}
	return total, nil
}

// ownTCP is TCP on the own TCP.
func (c *Conn) ownTCP() ConnTCP {
	i := c.own.Info()
	out := ConnTCP{Local: c.LocalAddr(), Remote: c.RemoteAddr(), State: ssState(i.State.String()),
		TCP: TCPRdmatap, CongestionControl: i.CongestionControl, RecvQ: i.RecvQ, SendQ: i.SendQ,
		SegmentsSent: i.SegsOut, SegmentsReceived: i.SegsIn, Retransmits: i.RetransSegs,
		FastRetransmits: i.Recoveries, Timeouts: i.Timeouts,
		SRTT: i.RTT, RTTVar: i.RTTVar, RTO: i.RTO, Alive: i.State != owntcp.Closed && i.State != owntcp.TimeWait,
		SndMSS: i.SndMSS, RcvMSS: i.RcvMSS, SndWScale: i.SndWScale, RcvWScale: i.RcvWScale,
		Timestamps: i.Timestamps, SACK: i.SACK, SndWnd: i.SndWnd, RcvWnd: i.RcvWnd, Unacked: i.InFlight, SACKed: i.SACKed,
		BytesAcked: i.BytesAcked, BytesReceived: i.BytesReceived, BytesRetrans: i.RetransBytes,
		TLPs: i.TLPs, Undos: i.Undos, DSACKs: i.DSACKsIn, LostRetrans: i.LostRetransmits}
	if mss := i.SndMSS; mss > 0 {
		out.Cwnd, out.Ssthresh = uint32(i.Cwnd/mss), uint32(i.Ssthresh/mss)
	}
	if i.InRecovery {
		out.CongestionState = tcpip.SACKRecovery
		if !i.SACK {
			out.CongestionState = tcpip.FastRecovery
		}
	}
	return out
}

// OwnInfo is the connection's state on the own TCP, as `ss -ti` shows it;
// false on gVisor's.
func (c *Conn) OwnInfo() (owntcp.Info, bool) {
	if c.own == nil {
		return owntcp.Info{}, false
	}
	return c.own.Info(), true
}
