package netstack

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	owntcp "github.com/rdmatap/rdmatap/netstack/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// Defaults applied by New.
const (
	DefaultBufMax     = 8 << 20 // TCP receive/send buffer maximum
	defaultBufDefault = 1 << 20 // initial buffer size of a new connection
	minBuf            = 4 << 10 // buffer minimum (gVisor's own minimum)

	// nicID is the ID of the single NIC of a Stack.
	nicID tcpip.NICID = 1
)

// Config configures a Stack.
type Config struct {
	Link    stack.LinkEndpoint // required: the NIC's link endpoint
	Addrs   []netip.Prefix     // IPv4 and/or IPv6 addresses of the NIC; routes for their subnets
	Gateway netip.Addr         // optional default gateway
	// CongestionControl is "reno" (the default), "cubic", or "auto": each
	// connection starts with Cubic and changes to Reno once it has
	// retransmitted (see CongestionAuto). Anything else is an error. On
	// rdmatap's TCP, "reno" is Reno and the others (the empty default
	// too) are Cubic, which stays.
	CongestionControl string
	RcvBufMax         int           // TCP receive buffer max, default 8 MiB
	SndBufMax         int           // TCP send buffer max, default 8 MiB
	NoSACK            bool          // SACK is on unless set
	MinRTO            time.Duration // optional TCPMinRTOOption
	// PeerTimeout is how long a connection may go without hearing from its
	// peer before it fails with ErrTimeout: keepalive probes start after
	// half of it and a quarter of it apart, and data unacknowledged for
	// that long ends the connection too (TCP user timeout). A peer whose
	// process died leaves no kernel to reset its connections: without
	// this, a connection waiting for it would wait forever. Default 30 s;
	// negative: never.
	PeerTimeout time.Duration
	// AckDelay is how long a pure ACK that acknowledges less than a full
	// segment may wait for the connection's next segment to carry it
	// (see ackdelay.go). Default DefaultAckDelay; negative: never delay.
	AckDelay time.Duration
	// NoLinkRepair turns off the link's repair of lost GSO packets
	// (repair.go): the stack's TCP alone recovers them.
	NoLinkRepair bool
	// TCP is the TCP the connections run on: TCPGVisor (the default) or
	// TCPRdmatap; empty: $RDMATAP_TCP, else gVisor's (ParseTCP). On
	// rdmatap's TCP, delayed ACKs are its own (AckDelay), the link
	// repairs nothing, and connection taps are not available.
	TCP string
}

// DefaultPeerTimeout is Config.PeerTimeout's default.
const DefaultPeerTimeout = 30 * time.Second

// Stack is a gVisor network stack with one NIC (ID 1) and TCP over IPv4 and
// IPv6. It tracks the connections and listeners it created so Close can tear
// everything down.
type Stack struct {
	s *stack.Stack
	// own is rdmatap's TCP when Config.TCP chose it; nil: gVisor's.
	own *owntcp.Protocol
	// ccAuto: connections change from Cubic to Reno at their first loss
	// (Config.CongestionControl "auto").
	ccAuto    bool
	ccChanges atomic.Uint64 // connections changed to Reno (TCPStats.CongestionChanges)
	link      stack.LinkEndpoint
	addrs     []netip.Prefix
	has4      bool
	has6      bool

	peerTimeout time.Duration

	mu        sync.Mutex
	closed    bool
	ctaps     *connTaps // EnableConnTaps
	nic       *tapLink  // the NIC's link: cfg.Link, watched by the taps
	conns     map[*Conn]struct{}
	listeners map[*Listener]struct{}
	listenMu  sync.Mutex // one Listen at a time: its port check and bind go together
	closeOnce sync.Once

	portSeed maphash.Seed  // bindLocalPort's secret
	portNext atomic.Uint32 // bindLocalPort's counter
}

// New builds a stack: IPv4, IPv6 (duplicate address detection off: the
// addresses are static), ARP (only used on Ethernet links), TCP; NIC 1 on
// cfg.Link; the addresses; a route for each address's subnet and, when
// cfg.Gateway is set, a default route through it. Invalid configuration
// yields an error matching ErrConfig.
func New(cfg Config) (*Stack, error) {
	if cfg.Link == nil {
		return nil, errConfig("Config.Link is nil")
	}
	cc := cfg.CongestionControl
	switch cc {
	case "":
		cc = "reno"
	case "reno", "cubic":
	case CongestionAuto:
		cc = "cubic"
	default:
		return nil, errConfig(fmt.Sprintf("unknown congestion control %q (want reno, cubic or auto)", cfg.CongestionControl))
	}
	rcvMax, err := bufMax("RcvBufMax", cfg.RcvBufMax)
	if err != nil {
		return nil, err
	}
	sndMax, err := bufMax("SndBufMax", cfg.SndBufMax)
	if err != nil {
		return nil, err
	}
	if cfg.MinRTO < 0 {
		return nil, errConfig("negative MinRTO")
	}
	tcpName, err := ParseTCP(cfg.TCP)
	if err != nil {
		return nil, err
	}
	pt := cfg.PeerTimeout
	if pt == 0 {
		pt = DefaultPeerTimeout
	}
	transport := tcp.NewProtocol
	var own *owntcp.Protocol
	if tcpName == TCPRdmatap {
		own = owntcp.NewProtocol(ownConfig(cfg, rcvMax, sndMax, pt))
		transport = own.Factory()
	}

	addrs := make([]netip.Prefix, 0, len(cfg.Addrs))
	var has4, has6 bool
	for _, p := range cfg.Addrs {
		if !p.IsValid() {
			return nil, errConfig(fmt.Sprintf("invalid address prefix %v", p))
		}
		a := p.Addr()
		if a.Zone() != "" || a.Is4In6() || a.IsUnspecified() || a.IsMulticast() {
			return nil, errConfig(fmt.Sprintf("address %v is not usable as a NIC address", p))
		}
		if a.Is4() {
			has4 = true
		} else {
			has6 = true
		}
		addrs = append(addrs, p)
	}
	if cfg.Gateway.IsValid() {
		gw := cfg.Gateway
		if gw.Zone() != "" || gw.Is4In6() || gw.IsUnspecified() {
			return nil, errConfig(fmt.Sprintf("invalid gateway %v", gw))
		}
		if (gw.Is4() && !has4) || (gw.Is6() && !has6) {
			return nil, errConfig(fmt.Sprintf("gateway %v has no address of its family on the NIC", gw))
		}
	}

	s := stack.New(stack.Options{
		NetworkProtocols: []stack.NetworkProtocolFactory{
			ipv4.NewProtocol,
			ipv6.NewProtocolWithOptions(ipv6.Options{}), // zero DADConfigs: no DAD
			arp.NewProtocol,
		},
		TransportProtocols: []stack.TransportProtocolFactory{transport},
		HandleLocal:        true,
	})
	fail := func(what string, terr tcpip.Error) (*Stack, error) {
		s.Close()
		s.Wait()
		return nil, &OpError{Op: "new stack: " + what, TCPIP: terr, Err: MapError(terr)}
	}

	if own == nil {
		if st, err := setGVisorTCP(s, cfg, cc, rcvMax, sndMax); err != nil {
			return fail(st, err)
		}
	}
	ackDelay := cfg.AckDelay
	if ackDelay == 0 {
		ackDelay = DefaultAckDelay
	}
	repair := !cfg.NoLinkRepair
	if own != nil {
		ackDelay, repair = -1, false // the TCP delays its own ACKs and recovers alone
	}
	nic := newTapLink(cfg.Link, ackDelay, repair, own)
	for _, p := range addrs {
		a := tcpip.AddressWithPrefix{Address: toTCPIPAddr(p.Addr()), PrefixLen: p.Bits()}
		nic.notPeer = append(nic.notPeer, a.Address)
		if p.Addr().Is4() && p.Bits() < 31 {
			sn := a.Subnet()
			nic.notPeer = append(nic.notPeer, sn.Broadcast())
		}
	}

	if terr := s.CreateNICWithOptions(nicID, nic, stack.NICOptions{QDisc: directQDisc{link: nic}}); terr != nil {
		return fail("create NIC", terr)
	}
	var routes []tcpip.Route
	for _, p := range addrs {
		a := toTCPIPAddr(p.Addr())
		proto := ipv4.ProtocolNumber
		if p.Addr().Is6() {
			proto = ipv6.ProtocolNumber
		}
		pa := tcpip.ProtocolAddress{
			Protocol:          proto,
			AddressWithPrefix: tcpip.AddressWithPrefix{Address: a, PrefixLen: p.Bits()},
		}
		if terr := s.AddProtocolAddress(nicID, pa, stack.AddressProperties{}); terr != nil {
			return fail(fmt.Sprintf("add address %v", p), terr)
		}
		routes = append(routes, tcpip.Route{Destination: pa.AddressWithPrefix.Subnet(), NIC: nicID})
	}
	if gw := cfg.Gateway; gw.IsValid() {
		dst := header.IPv4EmptySubnet
		if gw.Is6() {
			dst = header.IPv6EmptySubnet
		}
		routes = append(routes, tcpip.Route{Destination: dst, Gateway: toTCPIPAddr(gw), NIC: nicID})
	}
	s.SetRouteTable(routes)

	return &Stack{
		s:           s,
		own:         own,
		ccAuto:      cfg.CongestionControl == CongestionAuto,
		peerTimeout: pt,
		link:        cfg.Link,
		nic:         nic,
		addrs:       addrs,
		has4:        has4,
		has6:        has6,
		conns:       make(map[*Conn]struct{}),
		listeners:   make(map[*Listener]struct{}),
		portSeed:    maphash.MakeSeed(),
	}, nil
}

// setGVisorTCP sets gVisor's TCP options for cfg; on failure it names
// the option.
func setGVisorTCP(s *stack.Stack, cfg Config, cc string, rcvMax, sndMax int) (string, tcpip.Error) {
	sack := tcpip.TCPSACKEnabled(!cfg.NoSACK)
	if terr := s.SetTransportProtocolOption(tcp.ProtocolNumber, &sack); terr != nil {
		return "SACK option", terr
	}
	ccOpt := tcpip.CongestionControlOption(cc)
	if terr := s.SetTransportProtocolOption(tcp.ProtocolNumber, &ccOpt); terr != nil {
		return "congestion control option", terr
	}
	rcv := tcpip.TCPReceiveBufferSizeRangeOption{Min: minBuf, Default: min(defaultBufDefault, rcvMax), Max: rcvMax}
	if terr := s.SetTransportProtocolOption(tcp.ProtocolNumber, &rcv); terr != nil {
		return "receive buffer option", terr
	}
	snd := tcpip.TCPSendBufferSizeRangeOption{Min: minBuf, Default: min(defaultBufDefault, sndMax), Max: sndMax}
	if terr := s.SetTransportProtocolOption(tcp.ProtocolNumber, &snd); terr != nil {
		return "send buffer option", terr
	}
	moderate := tcpip.TCPModerateReceiveBufferOption(true)
	if terr := s.SetTransportProtocolOption(tcp.ProtocolNumber, &moderate); terr != nil {
		return "receive buffer moderation option", terr
	}
	delay := tcpip.TCPDelayEnabled(false)
	if terr := s.SetTransportProtocolOption(tcp.ProtocolNumber, &delay); terr != nil {
		return "delay option", terr
	}
	if cfg.MinRTO > 0 {
		rto := tcpip.TCPMinRTOOption(cfg.MinRTO)
		if terr := s.SetTransportProtocolOption(tcp.ProtocolNumber, &rto); terr != nil {
			return "min RTO option", terr
		}
	}

	return "", nil
}

func bufMax(name string, v int) (int, error) {
	switch {
	case v == 0:
		return DefaultBufMax, nil
	case v < minBuf:
		return 0, errConfig(fmt.Sprintf("%s %d is below the minimum %d", name, v, minBuf))
	case v > 1<<30:
		return 0, errConfig(fmt.Sprintf("%s %d is above 1 GiB", name, v))
	}
	return v, nil
}

// Stack returns the underlying gVisor stack.
func (s *Stack) Stack() *stack.Stack { return s.s }

// NIC returns the ID of the stack's NIC.
func (s *Stack) NIC() tcpip.NICID { return nicID }

// Addrs returns the NIC's configured addresses (a copy).
func (s *Stack) Addrs() []netip.Prefix { return append([]netip.Prefix(nil), s.addrs...) }

// Close closes every connection (gracefully, but the stack goes away right
// after, so in practice they are aborted) and listener created by this Stack,
// then closes the gVisor stack and waits for its goroutines, including the
// link endpoint's (the NIC is removed, which closes the link endpoint).
// Close is idempotent.
func (s *Stack) Close() {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		conns := make([]*Conn, 0, len(s.conns))
		for c := range s.conns {
			conns = append(conns, c)
		}
		ls := make([]*Listener, 0, len(s.listeners))
		for l := range s.listeners {
			ls = append(ls, l)
		}
		s.mu.Unlock()
		for _, l := range ls {
			l.Close()
		}
		for _, c := range conns {
			c.Abort()
		}
		s.s.Close()
		s.s.Wait()
	})
}

// track registers c; it fails if the stack is closed.
func (s *Stack) trackConn(c *Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Stack) untrackConn(c *Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

func (s *Stack) trackListener(l *Listener) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.listeners[l] = struct{}{}
	return true
}

func (s *Stack) untrackListener(l *Listener) {
	s.mu.Lock()
	delete(s.listeners, l)
	s.mu.Unlock()
}

func (s *Stack) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// setPeerTimeout arms keepalive and the user timeout (Config.PeerTimeout).
// These options cannot fail on a TCP endpoint.
func (s *Stack) setPeerTimeout(ep tcpip.Endpoint) {
	t := s.peerTimeout
	if t <= 0 {
		return
	}
	idle, interval := tcpip.KeepaliveIdleOption(t/2), tcpip.KeepaliveIntervalOption(t/4)
	ut := tcpip.TCPUserTimeoutOption(t)
	_ = ep.SetSockOpt(&idle)
	_ = ep.SetSockOpt(&interval)
	_ = ep.SetSockOptInt(tcpip.KeepaliveCountOption, 2)
	_ = ep.SetSockOpt(&ut)
	ep.SocketOptions().SetKeepAlive(true)
}

// Dial opens a TCP connection to raddr. ctx cancels the wait for the
// handshake (the half-open endpoint is then closed and an error wrapping
// ctx.Err() returned; when a SYN was out, it says so).
// The connection has Nagle's algorithm off. Errors: *OpError matching
// syscall.ECONNREFUSED, ErrTimeout, syscall.ENETUNREACH..., or ctx.Err().
//
// Dial picks the local port itself rather than leaving it to gVisor, and
// abandons a SYN that stays unanswered for another from a new port; both
// are for a peer that holds an earlier connection with the same ports in
// TIME-WAIT, see localPort and dialNewPortTries.
func (s *Stack) Dial(ctx context.Context, raddr netip.AddrPort) (*Conn, error) {
	return s.DialFrom(ctx, netip.AddrPort{}, raddr)
}

// DialFrom is Dial from a local address: with laddr's port nonzero, the
// connection is made from that port (and from laddr's address, when it is
// valid and not unspecified), once: a port in use is an *OpError matching
// syscall.EADDRINUSE, an address not the stack's one matching
// syscall.EADDRNOTAVAIL, and an unanswered SYN is retransmitted from the
// same port. A zero laddr is Dial.
func (s *Stack) DialFrom(ctx context.Context, laddr, raddr netip.AddrPort) (*Conn, error) {
	addr := raddr.Addr().Unmap()
	if !addr.IsValid() || addr.IsUnspecified() || raddr.Port() == 0 || addr.Zone() != "" {
		return nil, &OpError{Op: "dial", Addr: raddr.String(), Err: errConfig("invalid remote address")}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	raddr = netip.AddrPortFrom(addr, raddr.Port())
	if s.own != nil {
		la := laddr.Addr().Unmap()
		if la.IsValid() && !la.IsUnspecified() && la.Is4() != addr.Is4() {
			return nil, &OpError{Op: "dial", Addr: raddr.String(), Err: errConfig("local and remote address of different families")}
		}
		return s.dialOwn(ctx, netip.AddrPortFrom(la, laddr.Port()), raddr)
	}
	if laddr.Port() != 0 {
		la := laddr.Addr().Unmap()
		if la.IsValid() && !la.IsUnspecified() && la.Is4() != addr.Is4() {
			return nil, &OpError{Op: "dial", Addr: raddr.String(), Err: errConfig("local and remote address of different families")}
		}
		c, _, err := s.dialOnce(ctx, netip.AddrPortFrom(la, laddr.Port()), raddr, 0)
		return c, err
	}
	var ports []uint16 // local ports whose SYN went unanswered
	wait := dialFirstSYNWait
	for try := 0; ; try++ {
		if try == dialNewPortTries {
			wait = 0 // the last try leaves the retransmissions to gVisor
		}
		c, port, err := s.dialOnce(ctx, netip.AddrPort{}, raddr, wait)
		if err == errSYNUnanswered {
			ports = append(ports, port)
			wait *= 2
			continue
		}
		if err != nil && port != 0 && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			ports = append(ports, port)
			return nil, &OpError{Op: "dial", Addr: raddr.String(), Err: &synUnansweredError{ports: ports, err: err}}
		}
		return c, err
	}
}

// dialFirstSYNWait is how long Dial waits for the answer to its first SYN
// before it sends another from a new local port: gVisor's initial
// retransmission timeout, when gVisor would send the same SYN again.
const dialFirstSYNWait = time.Second

// dialNewPortTries is how many times Dial gives up an unanswered SYN for one
// from a new local port (waiting 1, 2, 4 s), before it leaves the last one
// to gVisor's own retransmissions and timeout. A SYN that meets a gVisor
// peer's TIME-WAIT for the same ports is dropped without an answer unless
// its sequence number is above the old connection's last one (RFC 1122
// 4.2.2.13; gVisor's ISN clock ticks every 64 ns, so a connection that
// carried more bytes than 15.6 per microsecond of its life leaves the next
// ISN for its ports below), and its retransmissions are the same SYN: only
// a new port ends the wait before the peer's TIME-WAIT does (60 s).
const dialNewPortTries = 3

// errSYNUnanswered is dialOnce's report of a SYN that got no answer in time.
var errSYNUnanswered = errors.New("netstack: SYN unanswered")

// synUnansweredError is the error of a Dial whose context ended while its
// SYN was unanswered.
type synUnansweredError struct {
	ports []uint16
	err   error // ctx.Err()
}

func (e *synUnansweredError) Error() string {
	return fmt.Sprintf("no answer to the SYN from local port(s) %v (peer down or unreachable, or holding each port's earlier connection in TIME-WAIT): %v", e.ports, e.err)
}

func (e *synUnansweredError) Unwrap() error { return e.err }

func (e *synUnansweredError) Timeout() bool { return errors.Is(e.err, context.DeadlineExceeded) }

// dialOnce makes one connection attempt from a local port it picks, or
// from laddr when its port is nonzero. With wait > 0 an attempt whose SYN
// is still unanswered after wait is aborted and returns errSYNUnanswered.
// port is the local port used (0 if none was bound).
func (s *Stack) dialOnce(ctx context.Context, laddr, raddr netip.AddrPort, wait time.Duration) (_ *Conn, port uint16, _ error) {
	addr := raddr.Addr()
	proto := ipv4.ProtocolNumber
	if addr.Is6() {
		proto = ipv6.ProtocolNumber
	}
	wq := new(waiter.Queue)
	ep, terr := s.s.NewEndpoint(tcp.ProtocolNumber, proto, wq)
	if terr != nil {
		return nil, 0, opError("dial", raddr.String(), terr)
	}
	ep.SocketOptions().SetDelayOption(false)
	s.setPeerTimeout(ep)
	c := newConn(s, ep, wq)
	if !s.trackConn(c) {
		c.release()
		ep.Close()
		return nil, 0, closedError("dial")
	}
	if laddr.Port() != 0 {
		port, terr = laddr.Port(), s.bindPort(ep, proto, laddr, raddr)
	} else {
		port, terr = s.bindLocalPort(ep, proto, raddr)
	}
	if terr != nil {
		c.Abort()
		return nil, 0, opError("dial", raddr.String(), terr)
	}

	terr = ep.Connect(tcpip.FullAddress{NIC: nicID, Addr: toTCPIPAddr(addr), Port: raddr.Port()})
	if _, ok := terr.(*tcpip.ErrConnectStarted); ok {
		terr = nil
		var timeout <-chan time.Time
		if wait > 0 {
			t := time.NewTimer(wait)
			defer t.Stop()
			timeout = t.C
		}
		for waiting := true; waiting; {
			select {
			case <-ctx.Done():
				c.Abort()
				return nil, port, ctx.Err()
			case <-c.closedCh:
				return nil, port, closedError("dial")
			case <-timeout:
				if tcp.EndpointState(ep.State()) == tcp.StateSynSent {
					c.Abort()
					return nil, port, errSYNUnanswered
				}
				continue // answered: the handshake is ending
			case <-c.writeCh:
			}
			if terr = ep.LastError(); terr != nil {
				break
			}
			switch tcp.EndpointState(ep.State()) {
			case tcp.StateConnecting, tcp.StateSynSent, tcp.StateSynRecv, tcp.StateInitial, tcp.StateBound:
				// Spurious wake-up: keep waiting.
			case tcp.StateError, tcp.StateClose:
				terr = &tcpip.ErrConnectionAborted{}
				waiting = false
			default:
				waiting = false
			}
		}
	}
	if terr != nil {
		c.Abort()
		return nil, port, opError("dial", raddr.String(), terr)
	}
	c.initAddrs()
	return c, port, nil
}

// bindLocalPort binds ep to the next free local port for raddr (RFC 6056
// section 3.3.3, Algorithm 3): the ports for one destination follow each
// other from an offset hashed from it, and a stack-wide counter moves on
// with every pick, so a port comes back for the same destination only
// after the whole ephemeral range has been used. gVisor's own pick is
// random (Algorithm 1), and a port picked again for the same server port
// within a minute meets the server's TIME-WAIT if the server closed first
// (it does after sending a Terminate), which drops the SYN unless its
// sequence number is higher than the old connection's (see
// dialNewPortTries). A port this stack still holds (a connection of its own
// in TIME-WAIT, a listener) is skipped. A bound port is not shared between
// destinations, as gVisor's own pick shares it: the stack's outgoing
// connections take at most the whole ephemeral range at once.
func (s *Stack) bindLocalPort(ep tcpip.Endpoint, proto tcpip.NetworkProtocolNumber, raddr netip.AddrPort) (uint16, tcpip.Error) {
	// Bind the source address the route gives, as Connect would pick: a
	// port bound to the unspecified address is reserved under it, but
	// gVisor releases a connected endpoint's port under its local
	// address, and the reservation would never be freed.
	r, terr := s.s.FindRoute(nicID, tcpip.Address{}, toTCPIPAddr(raddr.Addr()), proto, false)
	if terr != nil {
		return 0, terr
	}
	laddr := r.LocalAddress()
	r.Release()
	first, last := s.s.PortRange()
	n := uint32(last) - uint32(first) + 1
	off := uint32(maphash.Comparable(s.portSeed, raddr))
	for i := uint32(0); i < n; i++ {
		p := uint16(uint32(first) + (off+s.portNext.Add(1))%n)
		terr := ep.Bind(tcpip.FullAddress{Addr: laddr, Port: p})
		if terr == nil {
			return p, nil
		}
		if _, ok := terr.(*tcpip.ErrPortInUse); !ok {
			return 0, terr
		}
	}
	return 0, &tcpip.ErrNoPortAvailable{}
}

// bindPort binds ep to laddr, whose address may be left unspecified for
// the one the route to raddr gives (bindLocalPort says why a port is not
// bound to the unspecified address).
func (s *Stack) bindPort(ep tcpip.Endpoint, proto tcpip.NetworkProtocolNumber, laddr, raddr netip.AddrPort) tcpip.Error {
	var la tcpip.Address
	if a := laddr.Addr(); a.IsValid() && !a.IsUnspecified() {
		la = toTCPIPAddr(a)
	} else {
		r, terr := s.s.FindRoute(nicID, tcpip.Address{}, toTCPIPAddr(raddr.Addr()), proto, false)
		if terr != nil {
			return terr
		}
		la = r.LocalAddress()
		r.Release()
	}
	return ep.Bind(tcpip.FullAddress{Addr: la, Port: laddr.Port()})
}

// Listener is a listening TCP endpoint.
type Listener struct {
	s         *Stack
	own       *owntcp.Listener // rdmatap's TCP; ep and wq are then nil
	ep        tcpip.Endpoint
	wq        *waiter.Queue
	entry     waiter.Entry
	notify    chan struct{}
	addr      netip.AddrPort
	closedCh  chan struct{}
	closeOnce sync.Once
}

// Listen listens on laddr. An invalid or unspecified laddr address listens on
// all addresses (dual-stack when the NIC has an IPv6 address); port 0 picks an
// ephemeral port (see Listener.Addr). A port in use yields an *OpError
// matching syscall.EADDRINUSE. backlog is listen(2)'s: handshakes beyond it
// pending at once get SYN cookies; backlog <= 0 selects a default of 128.
func (s *Stack) Listen(laddr netip.AddrPort, backlog int) (*Listener, error) {
	if backlog <= 0 {
		backlog = 128
	}
	addr := laddr.Addr()
	if addr.IsValid() {
		addr = addr.Unmap()
		if addr.Zone() != "" {
			return nil, &OpError{Op: "listen", Addr: laddr.String(), Err: errConfig("zoned addresses are not supported")}
		}
	}
	if s.own != nil {
		return s.listenOwn(netip.AddrPortFrom(addr, laddr.Port()), backlog)
	}
	var proto tcpip.NetworkProtocolNumber
	var bindAddr tcpip.Address
	switch {
	case addr.IsValid() && !addr.IsUnspecified():
		bindAddr = toTCPIPAddr(addr)
		proto = ipv4.ProtocolNumber
		if addr.Is6() {
			proto = ipv6.ProtocolNumber
		}
	case addr.IsValid() && addr.Is4():
		proto = ipv4.ProtocolNumber
	case s.has6:
		proto = ipv6.ProtocolNumber // dual-stack any
	default:
		proto = ipv4.ProtocolNumber
	}

	wq := new(waiter.Queue)
	ep, terr := s.s.NewEndpoint(tcp.ProtocolNumber, proto, wq)
	if terr != nil {
		return nil, opError("listen", laddr.String(), terr)
	}
	if proto == ipv6.ProtocolNumber && bindAddr.Len() == 0 {
		ep.SocketOptions().SetV6Only(false)
	}
	// SO_REUSEADDR, as Go's net package and most servers set it: a port
	// whose last connection this side closed first (its TIME-WAIT lasts a
	// minute) can be listened on again at once. Without it a server that
	// restarts on its port — perftest's 18515, a second client of the
	// service — got "port is in use". gVisor then lets a listener share a
	// port with another listener too, which Linux refuses: listenerOn
	// keeps that refusal. Only a listener on a given port needs it: with
	// the flag, gVisor's pick of an ephemeral port may hand out one that
	// another flagged listener holds.
	s.listenMu.Lock()
	defer s.listenMu.Unlock()
	if laddr.Port() != 0 {
		if s.listenerOn(addr, laddr.Port()) {
			ep.Close()
			return nil, opError("listen", laddr.String(), &tcpip.ErrPortInUse{})
		}
		ep.SocketOptions().SetReuseAddress(true)
	}
	l := &Listener{s: s, ep: ep, wq: wq, closedCh: make(chan struct{})}
	l.entry, l.notify = waiter.NewChannelEntry(waiter.ReadableEvents | waiter.EventHUp | waiter.EventErr)
	wq.EventRegister(&l.entry)

	if terr := ep.Bind(tcpip.FullAddress{Addr: bindAddr, Port: laddr.Port()}); terr != nil {
		l.closeEndpoint()
		return nil, opError("listen", laddr.String(), terr)
	}
	// One more than backlog, as gVisor's listen(2) passes for Linux's
	// queue: gVisor answers a SYN with a cookie while capacity-1
	// handshakes are pending, and a cookie's connection has no window
	// scaling (a receive window of 64 KiB). With a capacity of backlog, a
	// listener of backlog 1 (perftest's rdma_listen) would answer every
	// SYN with one.
	if terr := ep.Listen(backlog + 1); terr != nil {
		l.closeEndpoint()
		return nil, opError("listen", laddr.String(), terr)
	}
	fa, terr := ep.GetLocalAddress()
	if terr != nil {
		l.closeEndpoint()
		return nil, opError("listen", laddr.String(), terr)
	}
	l.addr = netip.AddrPortFrom(fromTCPIPAddr(fa.Addr), fa.Port)
	if !s.trackListener(l) {
		l.closeEndpoint()
		return nil, closedError("listen")
	}
	return l, nil
}

// listenerOn reports whether a listener of this stack holds port on addr
// (or on all addresses, or addr is unspecified: they overlap).
func (s *Stack) listenerOn(addr netip.Addr, port uint16) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	any := !addr.IsValid() || addr.IsUnspecified()
	for l := range s.listeners {
		la := l.addr.Addr()
		if l.addr.Port() == port && (any || !la.IsValid() || la.IsUnspecified() || la == addr) {
			return true
		}
	}
	return false
}

func (l *Listener) closeEndpoint() {
	if l.own != nil {
		l.own.Close()
		return
	}
	l.wq.EventUnregister(&l.entry)
	l.ep.Close()
}

// Accept waits for and returns the next connection (Nagle off). Close
// unblocks it with an error matching net.ErrClosed; ctx cancellation returns
// ctx.Err().
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	if l.own != nil {
		return l.acceptOwn(ctx)
	}
	for {
		select {
		case <-l.closedCh:
			return nil, closedError("accept")
		default:
		}
		nep, nwq, terr := l.ep.Accept(nil)
		if terr == nil {
			nep.SocketOptions().SetDelayOption(false)
			l.s.setPeerTimeout(nep)
			c := newConn(l.s, nep, nwq)
			c.initAddrs()
			if !l.s.trackConn(c) {
				c.release()
				nep.Abort()
				return nil, closedError("accept")
			}
			// Pass the notification on: more connections may be queued for
			// another Accept caller.
			select {
			case l.notify <- struct{}{}:
			default:
			}
			return c, nil
		}
		if _, ok := terr.(*tcpip.ErrWouldBlock); !ok {
			select {
			case <-l.closedCh:
				return nil, closedError("accept")
			default:
			}
			return nil, opError("accept", l.addr.String(), terr)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-l.closedCh:
			return nil, closedError("accept")
		case <-l.notify:
		}
	}
}

// Addr returns the bound address (with the actual port). For an any-address
// listener the address is the unspecified address of its family.
func (l *Listener) Addr() netip.AddrPort { return l.addr }

// Close stops listening, resets connections that were not accepted yet and
// unblocks Accept callers. It is idempotent and always returns nil.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		close(l.closedCh)
		l.closeEndpoint()
		l.s.untrackListener(l)
	})
	return nil
}

func toTCPIPAddr(a netip.Addr) tcpip.Address {
	a = a.Unmap()
	if a.Is4() {
		return tcpip.AddrFrom4(a.As4())
	}
	return tcpip.AddrFrom16(a.As16())
}

func fromTCPIPAddr(a tcpip.Address) netip.Addr {
	switch a.Len() {
	case 4:
		return netip.AddrFrom4(a.As4())
	case 16:
		return netip.AddrFrom16(a.As16()).Unmap()
	}
	return netip.Addr{}
}

// AckDelayStats reports what the link's ACK delaying did (Config.AckDelay).
func (s *Stack) AckDelayStats() AckDelayStats {
	if s.nic.acks == nil {
		return AckDelayStats{}
	}
	return s.nic.acks.stats()
}
