package tcp

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"github.com/rdmatap/rdmatap/internal/lattrace"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/header/parse"
	"gvisor.dev/gvisor/pkg/tcpip/seqnum"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/waiter"
)

// Protocol runs connections of this package in a gVisor stack: it is a
// stack.TransportProtocol for TCP's number, registered with the stack in
// place of gVisor's TCP (stack.Options.TransportProtocols, through
// Factory). The stack hands it every TCP segment on the goroutine that
// delivered the frame, and it runs the segment's connection there; the
// connections' timers run on timer goroutines. Connections are made with
// Dial and Listen, not through tcpip.Endpoint.
type Protocol struct {
	cfg   Config
	stack *stack.Stack
	start time.Time // the connections' clock: time since start
	key   [32]byte  // the ISS and timestamp offset secret (RFC 6528)

	mu        sync.Mutex
	conns     map[stack.TransportEndpointID]*Endpoint
	bound     map[localPort]int // connections per local address and port
	listeners map[uint16]*Listener
	nextPort  uint16
	timeWait  atomic.Int64  // SetOption's TIME-WAIT; 0: cfg's
	malformed atomic.Uint64 // segments dropped for a bad header or checksum

	statsMu sync.Mutex
	closed  Info // the counters of the connections that have closed

	// Segments to this stack's own addresses (loop).
	loopMu     sync.Mutex
	loopQ      []loopPacket
	looping    bool // the loopback goroutine runs
	loopClosed bool
}

// localPort is a connection's local address and port.
type localPort struct {
	addr tcpip.Address
	port uint16
}

// addConn and dropConn keep conns and bound; p.mu is held.
func (p *Protocol) addConn(e *Endpoint) {
	p.conns[e.id] = e
	p.bound[localPort{e.id.LocalAddress, e.id.LocalPort}]++
}

func (p *Protocol) dropConn(e *Endpoint) {
	if p.conns[e.id] != e {
		return
	}
	delete(p.conns, e.id)
	k := localPort{e.id.LocalAddress, e.id.LocalPort}
	if p.bound[k]--; p.bound[k] <= 0 {
		delete(p.bound, k)
	}
}

// portInUse reports whether a connection from addr's port would share
// the port with another connection or a listener (bind's EADDRINUSE);
// p.mu is held.
func (p *Protocol) portInUse(addr tcpip.Address, port uint16) bool {
	return p.bound[localPort{addr, port}] > 0 || p.listeners[port] != nil
}

// NewProtocol makes a Protocol whose connections have cfg.
func NewProtocol(cfg Config) *Protocol {
	p := &Protocol{cfg: cfg, start: time.Now(), conns: map[stack.TransportEndpointID]*Endpoint{},
		bound: map[localPort]int{}, listeners: map[uint16]*Listener{}, nextPort: 49152}
	rand.Read(p.key[:])
	return p
}

// Factory is the factory to give stack.Options.TransportProtocols. A
// Protocol serves one stack.
func (p *Protocol) Factory() stack.TransportProtocolFactory {
	return func(s *stack.Stack) stack.TransportProtocol {
		p.stack = s
		return p
	}
}

func (p *Protocol) now() time.Duration { return time.Since(p.start) }

// iss is RFC 6528's initial sequence number: a keyed hash of the
// connection's addresses plus a 4 µs clock; the same hash gives the
// timestamp offset (RFC 7323 §5.4).
func (p *Protocol) iss(id stack.TransportEndpointID) (seqnum.Value, uint32) {
	h := sha256.New()
	h.Write(p.key[:])
	h.Write(id.LocalAddress.AsSlice())
	h.Write(id.RemoteAddress.AsSlice())
	var ports [4]byte
	binary.BigEndian.PutUint16(ports[:], id.LocalPort)
	binary.BigEndian.PutUint16(ports[2:], id.RemotePort)
	h.Write(ports[:])
	sum := h.Sum(nil)
	return seqnum.Value(binary.BigEndian.Uint32(sum) + uint32(p.now()/(4*time.Microsecond))),
		binary.BigEndian.Uint32(sum[4:])
}

// Number is TCP's protocol number.
func (*Protocol) Number() tcpip.TransportProtocolNumber { return header.TCPProtocolNumber }

// NewEndpoint is not offered: connections come from Dial and Listen.
func (*Protocol) NewEndpoint(tcpip.NetworkProtocolNumber, *waiter.Queue) (tcpip.Endpoint, tcpip.Error) {
	return nil, &tcpip.ErrNotSupported{}
}

// NewRawEndpoint is not offered.
func (*Protocol) NewRawEndpoint(tcpip.NetworkProtocolNumber, *waiter.Queue) (tcpip.Endpoint, tcpip.Error) {
	return nil, &tcpip.ErrNotSupported{}
}

// MinimumPacketSize is a TCP header's.
func (*Protocol) MinimumPacketSize() int { return header.TCPMinimumSize }

// ParsePorts reads a TCP header's ports.
func (*Protocol) ParsePorts(v []byte) (src, dst uint16, err tcpip.Error) {
	if len(v) < 4 {
		return 0, 0, &tcpip.ErrMalformedHeader{}
	}
	h := header.TCP(v)
	return h.SourcePort(), h.DestinationPort(), nil
}

// SetOption takes gVisor's TCP option for TIME-WAIT's length
// (tcpip.TCPTimeWaitTimeoutOption), for connections made from then on.
func (p *Protocol) SetOption(opt tcpip.SettableTransportProtocolOption) tcpip.Error {
	switch o := opt.(type) {
	case *tcpip.TCPTimeWaitTimeoutOption:
		if *o <= 0 {
			return &tcpip.ErrInvalidOptionValue{}
		}
		p.timeWait.Store(int64(*o))
		return nil
	}
	return &tcpip.ErrUnknownProtocolOption{}
}

// Option reads what SetOption sets.
func (p *Protocol) Option(opt tcpip.GettableTransportProtocolOption) tcpip.Error {
	switch o := opt.(type) {
	case *tcpip.TCPTimeWaitTimeoutOption:
		*o = tcpip.TCPTimeWaitTimeoutOption(p.connConfig(nil).TimeWait)
		return nil
	}
	return &tcpip.ErrUnknownProtocolOption{}
}

// Stats is the counters of Info (SegsOut to BytesReceived) summed over
// every connection the protocol has had, and the protocol's InErrs; the
// other fields are zero.
func (p *Protocol) Stats() Info {
	p.mu.Lock()
	eps := make([]*Endpoint, 0, len(p.conns))
	for _, e := range p.conns {
		eps = append(eps, e)
	}
	p.mu.Unlock()
	var sum Info
	for _, e := range eps {
		e.mu.Lock()
		if !e.released && e.c != nil {
			sum.addCounters(e.c.Info())
		}
		e.mu.Unlock()
	}
	p.statsMu.Lock()
	sum.addCounters(p.closed)
	p.statsMu.Unlock()
	sum.InErrs = p.malformed.Load()
	return sum
}

// Endpoints is how many connections and listeners the protocol has.
func (p *Protocol) Endpoints() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns) + len(p.listeners)
}

// Close resets every connection.
func (p *Protocol) Close() {
	p.mu.Lock()
	eps := make([]*Endpoint, 0, len(p.conns))
	for _, e := range p.conns {
		eps = append(eps, e)
	}
	p.mu.Unlock()
	for _, e := range eps {
		e.Abort()
	}
	p.loopMu.Lock()
	p.loopClosed = true
	p.loopMu.Unlock()
}

// Wait has nothing to wait for: the protocol has no goroutines.
func (*Protocol) Wait() {}

// Pause, Resume and Restore: nothing to do (no save/restore).
func (*Protocol) Pause()   {}
func (*Protocol) Resume()  {}
func (*Protocol) Restore() {}

// Parse sets the packet's transport header (the TCP header with its
// options).
func (*Protocol) Parse(pkt *stack.PacketBuffer) bool { return parse.TCP(pkt) }

// HandleUnknownDestinationPacket receives every segment that comes up
// through the stack's IP layer (this protocol registers no endpoints with
// the stack's demultiplexer): a segment of a connection goes to it, a SYN
// to a listener makes a connection, and anything else is answered with a
// RST.
func (p *Protocol) HandleUnknownDestinationPacket(id stack.TransportEndpointID, pkt *stack.PacketBuffer) stack.UnknownDestinationPacketDisposition {
	return p.receive(id, pkt, nil)
}

// DeliverFromLink takes a segment of one of the protocol's connections
// straight from the link, on the goroutine that read the frame, before
// the stack's IP layer would see it: the link has checked the IP header
// (version, lengths, checksum, no options, no fragment, no IPv6
// extension headers), whose first ipLen bytes lead pkt's data and which
// says the packet is total bytes long. id is the connection's 4-tuple as
// the header names it. It returns false, with pkt unchanged, when no
// connection has that 4-tuple or the lengths do not fit the packet: the
// link then delivers the packet to the
// stack as usual (a SYN to a listener, a segment to answer with a RST).
// Otherwise it consumes the IP and TCP headers and the connection takes
// the segment, or it is dropped as HandleUnknownDestinationPacket drops
// a malformed one.
func (p *Protocol) DeliverFromLink(id stack.TransportEndpointID, netProto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer, ipLen, total int) bool {
	if ipLen <= 0 || total < ipLen+header.TCPMinimumSize || total > pkt.Data().Size() {
		return false
	}
	p.mu.Lock()
	e := p.conns[id]
	p.mu.Unlock()
	if e == nil {
		return false
	}
	if _, ok := pkt.NetworkHeader().Consume(ipLen); !ok {
		return false // nothing consumed: shorter than ipLen
	}
	pkt.NetworkProtocolNumber = netProto
	pkt.Data().CapLength(total - ipLen) // an Ethernet frame's padding
	if !parse.TCP(pkt) {
		p.malformed.Add(1)
		return true
	}
	p.receive(id, pkt, e)
	return true
}

// receive handles one segment whose transport header pkt has: to e, when
// the link found its connection, else to the connection, listener or RST
// its 4-tuple calls for.
func (p *Protocol) receive(id stack.TransportEndpointID, pkt *stack.PacketBuffer, e *Endpoint) stack.UnknownDestinationPacketDisposition {
	hdr := pkt.TransportHeader().Slice() // the header with its options (Parse)
	if len(hdr) < header.TCPMinimumSize {
		p.malformed.Add(1)
		return stack.UnknownDestinationPacketMalformed
	}
	if !pkt.RXChecksumValidated {
		n := len(hdr) + pkt.Data().Size()
		if n > 0xffff {
			p.malformed.Add(1)
			return stack.UnknownDestinationPacketMalformed
		}
		xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, id.RemoteAddress, id.LocalAddress, uint16(n))
		xsum = checksum.Checksum(hdr, xsum) // a TCP header's length is even
		if checksum.Combine(xsum, pkt.Data().Checksum()) != 0xffff {
			p.malformed.Add(1)
			return stack.UnknownDestinationPacketMalformed
		}
	}
	rx := rxPool.Get().(*rxScratch)
	defer func() {
		*rx = rxScratch{} // no packet memory stays referenced
		rxPool.Put(rx)
	}()
	var err error
	seg := &rx.seg
	if *seg, err = Parse(hdr, rx.sack[:0]); err != nil || len(seg.Payload) != 0 {
		p.malformed.Add(1)
		return stack.UnknownDestinationPacketMalformed
	}
	// The payload in the packet's own memory: Input copies what it keeps
	// into the connection's buffers, or takes a reference to the
	// packet's chunks, before this returns the packet to the stack.
	seg.Payload, seg.pieces, seg.piecesLen, seg.views = payloadOf(pkt, rx.pieces[:0], rx.views[:0])
	nic := pkt.NICID
	if e == nil {
		p.mu.Lock()
		if e = p.conns[id]; e == nil {
			l := p.listeners[id.LocalPort]
			if l != nil && seg.Flags&(header.TCPFlagSyn|header.TCPFlagAck|header.TCPFlagRst) == header.TCPFlagSyn {
				e, ok := l.admit(p, id, nic, seg)
				p.mu.Unlock()
				if ok {
					e.mu.Lock()
					e.arm()
					e.mu.Unlock()
				}
				return stack.UnknownDestinationPacketHandled
			}
			p.mu.Unlock()
			if rst, ok := ResetFor(seg); ok {
				if r, err := p.stack.FindRoute(nic, id.LocalAddress, id.RemoteAddress, pkt.NetworkProtocolNumber, false); err == nil {
					p.send(r, id, &rst)
					r.Release()
				}
			}
			return stack.UnknownDestinationPacketHandled
		}
		p.mu.Unlock()
	}
	if tap := e.tap.Load(); tap != nil {
		(*tap)(seg, pkt)
	}
	e.input(seg)
	return stack.UnknownDestinationPacketHandled
}

// payloadOf is the packet's payload, read in place from its views: a
// PullUp would copy a chunk the packet shares with another (the sender's
// send buffer, on the in-memory link). A payload in one view is payload;
// one in several comes as those views' pieces (appended to pieces) and
// their total length. The views each piece lies in are appended to
// views.
func payloadOf(pkt *stack.PacketBuffer, pieces [][]byte, views []*buffer.View) (payload []byte, _ [][]byte, size int, _ []*buffer.View) {
	size = pkt.Data().Size()
	if size == 0 {
		return nil, nil, 0, nil
	}
	vl, _ := pkt.AsViewList()
	skip := -size // the headers' bytes before the payload
	for v := vl.Front(); v != nil; v = v.Next() {
		skip += v.Size()
	}
	for v := vl.Front(); v != nil; v = v.Next() {
		b := v.AsSlice()
		if skip >= len(b) {
			skip -= len(b)
			continue
		}
		b = b[skip:]
		skip = 0
		pieces = append(pieces, b[:len(b):len(b)])
		views = append(views, v)
	}
	if len(pieces) == 1 {
		return pieces[0], nil, size, views
	}
	return nil, pieces, size, views
}

// rxScratch is a received segment's memory, pooled: a segment on the
// heap per packet was garbage to collect.
type rxScratch struct {
	seg    Segment
	pieces [4][]byte
	views  [4]*buffer.View
	sack   [maxSACKBlocks]header.SACKBlock
}

var rxPool = sync.Pool{New: func() any { return new(rxScratch) }}

// send writes one segment to the route, with its checksum; a segment
// for the link to cut (Segment.SegSize) carries GSO options and the
// pseudo-header's partial checksum, which the link completes per segment.
func (p *Protocol) send(r *stack.Route, id stack.TransportEndpointID, s *Segment) {
	hl := s.HeaderLen()
	var payload buffer.Buffer
	if s.src != nil {
		// The send buffer's bytes by reference: the packet holds the
		// blocks' chunks until the link is done with it.
		s.src.appendTo(&payload, s.srcOff, s.srcLen)
	} else if len(s.Payload) > 0 {
		payload = buffer.MakeWithData(s.Payload)
	}
	n := s.PayloadLen()
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{
		ReserveHeaderBytes: int(r.MaxHeaderLength()) + hl,
		Payload:            payload,
	})
	defer pkt.DecRef()
	h := pkt.TransportHeader().Push(hl)
	s.Encode(h, id.LocalPort, id.RemotePort)
	pkt.TransportProtocolNumber = header.TCPProtocolNumber
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, id.LocalAddress, id.RemoteAddress, uint16(hl+n))
	if s.SegSize > 0 && n > s.SegSize {
		gso := stack.GSO{Type: stack.GSOTCPv4, NeedsCsum: true, CsumOffset: header.TCPChecksumOffset,
			MSS: uint16(s.SegSize), L3HdrLen: header.IPv4MinimumSize, MaxSize: r.GSOMaxSize()}
		if r.NetProto() == header.IPv6ProtocolNumber {
			gso.Type, gso.L3HdrLen = stack.GSOTCPv6, header.IPv6MinimumSize
		}
		pkt.GSOOptions = gso
		header.TCP(h).SetChecksum(xsum)
	} else if r.RequiresTXTransportChecksum() {
		// (A NIC that offloads the checksum fills it in, as it does for
		// gVisor's TCP; a route to this stack needs none.)
		xsum = checksum.Combine(xsum, pkt.Data().Checksum())
		header.TCP(h).SetChecksum(^header.TCP(h).CalculateChecksum(xsum))
	}
	if r.Loop()&stack.PacketLoop != 0 {
		// To an address of this stack: the stack would hand the
		// segment to its connection on this goroutine, inside this
		// connection's lock (or the protocol's). It goes from the
		// loopback goroutine instead.
		p.loop(r, pkt)
		return
	}
	r.WritePacket(stack.NetworkHeaderParams{Protocol: header.TCPProtocolNumber, TTL: r.DefaultTTL()}, pkt)
}

// loopPacket is a segment to an address of this stack, with its route.
type loopPacket struct {
	r   *stack.Route
	pkt *stack.PacketBuffer
}

// loop queues a looped-back segment for the loopback goroutine, which
// writes them in order; it starts with the first one.
func (p *Protocol) loop(r *stack.Route, pkt *stack.PacketBuffer) {
	r.Acquire()
	pkt.IncRef()
	p.loopMu.Lock()
	if p.loopClosed {
		p.loopMu.Unlock()
		pkt.DecRef()
		r.Release()
		return
	}
	p.loopQ = append(p.loopQ, loopPacket{r, pkt})
	if !p.looping {
		p.looping = true
		go p.loopback()
	}
	p.loopMu.Unlock()
}

func (p *Protocol) loopback() {
	var batch []loopPacket
	for {
		p.loopMu.Lock()
		batch, p.loopQ = p.loopQ, batch[:0]
		if len(batch) == 0 {
			p.looping = false
			p.loopMu.Unlock()
			return
		}
		p.loopMu.Unlock()
		for i, lp := range batch {
			lp.r.WritePacket(stack.NetworkHeaderParams{Protocol: header.TCPProtocolNumber, TTL: lp.r.DefaultTTL()}, lp.pkt)
			lp.pkt.DecRef()
			lp.r.Release()
			batch[i] = loopPacket{}
		}
	}
}

// RouteError is Dial's error when the stack has no route to the peer.
type RouteError struct{ Err tcpip.Error }

func (e *RouteError) Error() string { return "tcp: " + e.Err.String() }

// ErrAddrInUse is Dial's error for addresses and ports a connection holds.
var ErrAddrInUse = errors.New("tcp: address in use")

// Port is the port the listener takes connections on.
func (l *Listener) Port() uint16 { return l.port }

// Endpoint is a connection in a stack: a byte stream with blocking Read
// and Write.
type Endpoint struct {
	p     *Protocol
	id    stack.TransportEndpointID
	route *stack.Route

	mu       sync.Mutex
	cond     *sync.Cond
	l        *Listener // until accepted: told of state changes
	c        *Conn
	timer    *time.Timer
	appGone  bool // Close: the application reads and writes no more
	released bool

	// readMu is held by the one reader: a view of the receive buffer
	// (TryReadTo) is read without mu.
	readMu sync.Mutex
	// rdWake and wrWake get a wake-up whenever the connection may have
	// changed (a segment, a timer, a call); done is closed once it has
	// closed.
	rdWake, wrWake chan struct{}
	done           chan struct{}
	onClose        func() // SetOnClose
	finished       bool   // onClose has run

	tap atomic.Pointer[SegmentTap] // SetSegmentTap
}

func (p *Protocol) newEndpoint(id stack.TransportEndpointID, r *stack.Route) *Endpoint {
	e := &Endpoint{p: p, id: id, route: r, rdWake: make(chan struct{}, 1), wrWake: make(chan struct{}, 1), done: make(chan struct{})}
	e.cond = sync.NewCond(&e.mu)
	return e
}

func post(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// out is the connection's output: it runs with e.mu held.
func (e *Endpoint) out(s *Segment) { e.p.send(e.route, e.id, s) }

// arm sets the timer to the connection's deadline and wakes the waiters;
// e.mu is held. A connection that has closed leaves the protocol.
func (e *Endpoint) arm() {
	e.cond.Broadcast()
	post(e.rdWake)
	post(e.wrWake)
	if e.l != nil {
		e.l.notify()
	}
	if st := e.c.State(); (st == Closed || st == TimeWait) && !e.finished {
		e.finished = true
		if e.onClose != nil {
			e.onClose()
		}
	}
	if e.c.State() == Closed {
		if e.timer != nil {
			e.timer.Stop()
		}
		if !e.released {
			e.p.statsMu.Lock()
			e.p.closed.addCounters(e.c.Info())
			e.p.statsMu.Unlock()
			e.released = true
			close(e.done)
			e.p.mu.Lock()
			e.p.dropConn(e)
			e.p.mu.Unlock()
			e.route.Release()
		}
		return
	}
	d := e.c.Deadline()
	if d == 0 {
		return
	}
	wait := d - e.p.now()
	if e.timer == nil {
		e.timer = time.AfterFunc(wait, e.tick)
	} else {
		e.timer.Reset(wait)
	}
}

func (e *Endpoint) tick() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.released {
		return
	}
	now := e.p.now()
	if d := e.c.Deadline(); d != 0 && d <= now {
		e.c.Tick(now)
	}
	e.arm()
}

func (e *Endpoint) input(s *Segment) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.released || e.c == nil {
		return // closed, or Dial has published it and not made it yet
	}
	var had int
	if lattrace.Enabled {
		had = e.c.Readable()
	}
	e.c.Input(s, e.p.now())
	if lattrace.Enabled && e.c.Readable() > had {
		lattrace.Mark(lattrace.Readable)
	}
	if e.appGone && e.c.Readable() > 0 {
		// Data for an application that has closed: RFC 9293 §3.10.4
		// lets it reset, as Linux does.
		e.c.Abort(e.p.now())
	}
	e.arm()
}

// Dial opens a connection from laddr (its port 0: one is chosen) to
// raddr on NIC nic and waits until it is established, refused, timed
// out, or ctx ends.
func (p *Protocol) Dial(ctx context.Context, nic tcpip.NICID, laddr, raddr tcpip.FullAddress, netProto tcpip.NetworkProtocolNumber) (*Endpoint, error) {
	r, terr := p.stack.FindRoute(nic, laddr.Addr, raddr.Addr, netProto, false)
	if terr != nil {
		return nil, &RouteError{Err: terr}
	}
	id := stack.TransportEndpointID{LocalPort: laddr.Port, LocalAddress: r.LocalAddress(), RemotePort: raddr.Port, RemoteAddress: raddr.Addr}
	p.mu.Lock()
	if id.LocalPort == 0 {
		// An ephemeral port no other connection or listener has.
		for i := 0; i < 16384; i++ {
			id.LocalPort = p.nextPort
			p.nextPort++
			if p.nextPort == 0 {
				p.nextPort = 49152
			}
			if !p.portInUse(id.LocalAddress, id.LocalPort) {
				break
			}
		}
	}
	if _, used := p.conns[id]; used || laddr.Port != 0 && p.portInUse(id.LocalAddress, id.LocalPort) {
		p.mu.Unlock()
		r.Release()
		return nil, ErrAddrInUse
	}
	e := p.newEndpoint(id, r)
	p.addConn(e)
	p.mu.Unlock()
	iss, tso := p.iss(id)
	e.mu.Lock()
	cfg := p.connConfig(r)
	e.c = Dial(cfg, e.out, p.now(), iss, tso)
	e.arm()
	stop := context.AfterFunc(ctx, func() {
		e.mu.Lock()
		e.cond.Broadcast()
		e.mu.Unlock()
	})
	defer stop()
	for e.c.State() == SynSent || e.c.State() == SynReceived {
		if ctx.Err() != nil {
			e.c.Abort(p.now())
			e.arm()
			e.mu.Unlock()
			return nil, ctx.Err()
		}
		e.cond.Wait()
	}
	err := e.c.Err()
	e.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return e, nil
}

// connConfig is the configuration of a connection on route r: an MSS
// the route's MTU holds (the route's own when none is set), and GSO up to
// what the NIC takes when it cuts segments itself.
func (p *Protocol) connConfig(r *stack.Route) Config {
	cfg := p.cfg
	if tw := p.timeWait.Load(); tw > 0 {
		cfg.TimeWait = time.Duration(tw)
	}
	if r == nil {
		return cfg.withDefaults()
	}
	fit := int(r.MTU()) - header.TCPMinimumSize
	if cfg.MSS <= 0 || cfg.MSS > fit {
		cfg.MSS = fit
	}
	cfg.piecesOut = true // send reads Segment.src
	if cfg.GSOMax == 0 && r.HasHostGSOCapability() {
		// The packet's IP length field bounds it, headers included.
		cfg.GSOMax = min(int(r.GSOMaxSize()), 0xffff) - header.IPv6MinimumSize - header.TCPHeaderMaximumSize
	}
	return cfg
}

// Read reads what has arrived in order, waiting for something; io.EOF
// after the peer's FIN.
func (e *Endpoint) Read(b []byte) (int, error) {
	e.readMu.Lock()
	defer e.readMu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	for {
		if e.appGone {
			return 0, io.ErrClosedPipe
		}
		n, err := e.c.Read(b, e.p.now())
		if n > 0 || err != nil || len(b) == 0 {
			e.arm()
			return n, err
		}
		e.cond.Wait()
	}
}

// Write queues all of b, waiting for room in the send buffer.
func (e *Endpoint) Write(b []byte) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	done := 0
	for done < len(b) {
		if e.appGone {
			return done, io.ErrClosedPipe
		}
		if e.c.Writable() == 0 {
			if err := e.c.Err(); err != nil {
				return done, err
			}
			if s := e.c.State(); s != Established && s != CloseWait {
				return done, ErrState
			}
			e.cond.Wait()
			continue
		}
		n, err := e.c.Write(b[done:], e.p.now())
		done += n
		e.arm()
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// CloseWrite sends a FIN after the data written: the peer reads EOF, and
// this end may go on reading.
func (e *Endpoint) CloseWrite() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.c.Close(e.p.now())
	e.arm()
	return nil
}

// Close ends the application's use: the connection sends a FIN after
// the data written (or a RST, when data arrived that will never be read)
// and finishes on its own.
func (e *Endpoint) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.appGone = true
	if e.c.Readable() > 0 {
		e.c.Abort(e.p.now())
	} else {
		e.c.Close(e.p.now())
	}
	e.arm()
	return nil
}

// Abort resets the connection.
func (e *Endpoint) Abort() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.appGone = true
	e.c.Abort(e.p.now())
	e.arm()
}

// TryReadTo hands w the bytes that have arrived in order, at most max of
// them when max > 0, in the connection's own memory and without holding
// the connection's lock: w may take its time, and segments go on
// arriving. What w takes (its count, kept within what it was offered) is
// read; the rest stays. It never waits: (0, nil) when nothing has
// arrived, io.EOF after the peer's FIN, the connection's error once it
// failed. Readers are serialized.
func (e *Endpoint) TryReadTo(w io.Writer, max int) (int, error) {
	e.readMu.Lock()
	defer e.readMu.Unlock()
	e.mu.Lock()
	if e.appGone {
		e.mu.Unlock()
		return 0, io.ErrClosedPipe
	}
	total := 0
	before := e.c.rcvWindow()
	for {
		// The receive buffer's pieces one after another, while w
		// takes each whole.
		v, err := e.c.ReadView()
		if len(v) == 0 {
			if total > 0 {
				e.c.windowOpened(before)
				e.arm()
			}
			e.mu.Unlock()
			if total > 0 {
				return total, nil
			}
			return 0, err
		}
		e.mu.Unlock()
		if max > 0 && len(v) > max-total {
			v = v[:max-total]
		}
		n, werr := w.Write(v)
		if n < 0 {
			n = 0
		}
		n = min(n, len(v))
		total += n
		e.mu.Lock()
		e.c.readDone(n, e.p.now())
		if werr != nil || n < len(v) || total == max || e.appGone {
			e.c.windowOpened(before)
			e.arm()
			e.mu.Unlock()
			return total, werr
		}
	}
}

// TryWriteFrom queues up to n bytes read from r, as many as the send
// buffer has room for now, without waiting: (0, nil) when it is full.
// It fails with the connection's error, ErrClosed after CloseWrite, and
// ErrState before the handshake or after the peer's FIN was answered.
// rec, when not nil, tells where the records r produces end (Records).
func (e *Endpoint) TryWriteFrom(r io.Reader, n int, rec Records) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.appGone {
		return 0, io.ErrClosedPipe
	}
	if e.c.Writable() == 0 {
		if err := e.c.Err(); err != nil {
			return 0, err
		}
		if s := e.c.State(); s != Established && s != CloseWait {
			return 0, ErrState
		}
		return 0, nil
	}
	k, err := e.c.WriteFrom(r, n, rec, e.p.now())
	e.arm()
	return k, err
}

// ReadWake and WriteWake deliver a wake-up whenever the connection may
// have changed, for a reader and a writer waiting for it; Done is closed
// once the connection has closed.
func (e *Endpoint) ReadWake() <-chan struct{}  { return e.rdWake }
func (e *Endpoint) WriteWake() <-chan struct{} { return e.wrWake }
func (e *Endpoint) Done() <-chan struct{}      { return e.done }

// Readable reports whether a read would not wait: data, the peer's FIN or
// an error is there, or the connection has closed.
func (e *Endpoint) Readable() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.c.Readable() > 0 || e.c.EOF() || e.c.Err() != nil || e.c.State() == Closed
}

// Info is the connection's state, as Conn.Info.
func (e *Endpoint) Info() Info {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.c.Info()
}

// SetOnClose has fn called once the connection has closed or entered
// TIME-WAIT, both directions shut (at once when it has); fn runs with the
// connection locked and must not call it.
func (e *Endpoint) SetOnClose(fn func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.finished {
		fn()
		return
	}
	e.onClose = fn
}

// SegmentTap sees a connection's segments before the connection takes
// them (Endpoint.SetSegmentTap). A payload that lies in several pieces
// of the packet's memory comes as them too (Segment.Pieces).
type SegmentTap func(s *Segment, pkt *stack.PacketBuffer)

// SetSegmentTap has fn called with every segment of the connection whose
// checksum verified, before the connection takes it: on the goroutine
// that delivered the packet, without the connection's lock, so fn must
// not wait for the endpoint. The segment and its payload are valid during
// the call; pkt is the packet that holds them (a clone of its buffer
// keeps them: Payload's bytes when Pieces is nil, Pieces' otherwise).
// Segments of the connection may arrive on several
// goroutines at once. A tap set later replaces it; the returned
// function removes it (not a later one).
func (e *Endpoint) SetSegmentTap(fn SegmentTap) (remove func()) {
	p := &fn
	e.tap.Store(p)
	return func() { e.tap.CompareAndSwap(p, nil) }
}

// IRS is the peer's initial sequence number: byte 0 of the receive
// stream is IRS+1. ok is false before the peer's SYN has come and once
// the connection has closed.
func (e *Endpoint) IRS() (irs seqnum.Value, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.c.State()
	return e.c.irs, st != SynSent && st != Closed
}

// RcvBuf is the connection's receive buffer, in bytes: its window never
// reaches beyond it.
func (e *Endpoint) RcvBuf() int { return e.c.cfg.RcvBuf }

// ID is the connection's addresses and ports.
func (e *Endpoint) ID() stack.TransportEndpointID { return e.id }

// Buffered is how many bytes Read can return without waiting.
func (e *Endpoint) Buffered() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.c.Readable()
}

// State is the connection's state.
func (e *Endpoint) State() State {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.c.State()
}

// Listener takes connections on a port.
type Listener struct {
	p       *Protocol
	port    uint16
	backlog int
	wake    chan struct{} // a pending connection changed state
	done    chan struct{} // closed by Close

	mu      sync.Mutex
	pending []*Endpoint // handshakes under way or done, not accepted yet
	closed  bool
}

// Listen takes connections to port on every address of the stack, with
// at most backlog of them not accepted yet (more SYNs are dropped, and
// their senders retry).
func (p *Protocol) Listen(port uint16, backlog int) (*Listener, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, used := p.listeners[port]; used || port == 0 {
		return nil, errors.New("tcp: port in use or zero")
	}
	l := &Listener{p: p, port: port, backlog: max(backlog, 1), wake: make(chan struct{}, 1), done: make(chan struct{})}
	p.listeners[port] = l
	return l, nil
}

// admit makes a connection for a SYN; p.mu is held. The endpoint is not
// shared yet, so its own lock is not needed to set it up.
func (l *Listener) admit(p *Protocol, id stack.TransportEndpointID, nic tcpip.NICID, syn *Segment) (*Endpoint, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || len(l.pending) >= l.backlog {
		return nil, false
	}
	netProto := header.IPv4ProtocolNumber
	if id.LocalAddress.Len() == 16 {
		netProto = header.IPv6ProtocolNumber
	}
	r, err := p.stack.FindRoute(nic, id.LocalAddress, id.RemoteAddress, netProto, false)
	if err != nil {
		return nil, false
	}
	e := p.newEndpoint(id, r)
	e.l = l
	iss, tso := p.iss(id)
	cfg := p.connConfig(r)
	e.c = Accept(cfg, e.out, syn, p.now(), iss, tso)
	p.addConn(e)
	l.pending = append(l.pending, e)
	return e, true
}

// notify wakes Accept; it takes no lock (an endpoint calls it under its
// own).
func (l *Listener) notify() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Accept waits for a connection whose handshake has completed.
//
// Lock order: Protocol.mu → Listener.mu (admit) and Endpoint.mu →
// Protocol.mu (a closed connection leaving); Accept reads the endpoints'
// states holding neither of the others.
func (l *Listener) Accept(ctx context.Context) (*Endpoint, error) {
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return nil, io.ErrClosedPipe
		}
		pending := append([]*Endpoint(nil), l.pending...)
		l.mu.Unlock()
		var got *Endpoint
		var gone []*Endpoint
		for _, e := range pending {
			e.mu.Lock()
			st := e.c.State()
			if got == nil && st != SynReceived && st != Closed {
				got = e
				e.l = nil
			}
			e.mu.Unlock()
			if st == Closed {
				gone = append(gone, e) // reset or timed out before it was accepted
			}
		}
		l.mu.Lock()
		l.pending = slices.DeleteFunc(l.pending, func(e *Endpoint) bool {
			return e == got || slices.Contains(gone, e)
		})
		l.mu.Unlock()
		if got != nil {
			return got, nil
		}
		select {
		case <-l.wake:
		case <-l.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Close stops listening; connections not accepted are reset.
func (l *Listener) Close() {
	l.p.mu.Lock()
	delete(l.p.listeners, l.port)
	l.p.mu.Unlock()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	close(l.done)
	pending := l.pending
	l.pending = nil
	l.mu.Unlock()
	for _, e := range pending {
		e.Abort()
	}
}
