package verbs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/netstack"
)

// Connection management in the rdma_cm style: a Listener yields connection
// requests carrying the initiator's private data and IRD/ORD; the
// application accepts one onto a QP or rejects it with private data. Dial
// is the active side. Every blocking call takes a context; closing a
// Listener unblocks its waiters with net.ErrClosed.

// RTR is a set of RFC 6581 Ready-To-Receive message types.
type RTR uint8

// RTR types.
const (
	RTRSend  RTR = 1 << iota // zero-length Send (FPDU)
	RTRWrite                 // zero-length RDMA Write
	RTRRead                  // zero-length RDMA Read
)

func (r RTR) String() string { return iwarp.RTR(r).String() }

// ConnParams are a connection's parameters (rdma_conn_param and the MPA
// settings). Zero values take the device's defaults.
type ConnParams struct {
	PrivateData []byte
	// IRD: inbound RDMA Reads we accept at once (responder_resources);
	// ORD: RDMA Reads we issue at once (initiator_depth). Default 16.
	IRD, ORD int
	// MPA settings, overriding the device's.
	CRC         *bool
	MPARevision uint8
	PeerToPeer  *bool
	RTR         RTR
	// Markers asks the peer for MPA markers and honours its request for
	// them (see DeviceConfig.Markers). Linux siw rejects a connection
	// that asks: Dial then fails with an error matching both ErrRejected
	// and ErrMarkers.
	Markers *bool
	// LocalAddr (Dial only): connect from this port, and from this
	// address when it is valid (rdma_bind_addr before rdma_connect); a
	// zero port lets the device pick. A port in use fails with an error
	// matching syscall.EADDRINUSE.
	LocalAddr netip.AddrPort
}

// Negotiated are what both ends agreed on.
type Negotiated struct {
	MPARevision uint8
	CRC         bool
	IRD, ORD    int
	PeerToPeer  bool
	RTR         RTR
	// MarkersTx: this end inserts MPA markers (the peer asked);
	// MarkersRx: the peer inserts them (this end asked).
	MarkersTx, MarkersRx bool
}

const defaultIRDORD = 16

func (d *Device) mpaConfig(p ConnParams) iwarp.MPAConfig {
	c := iwarp.MPAConfig{Revision: d.cfg.MPARevision, CRC: d.cfg.CRC, Markers: d.cfg.Markers, PeerToPeer: d.cfg.PeerToPeer, RTR: iwarp.RTR(d.cfg.RTR),
		IRD: p.IRD, ORD: p.ORD, PrivateData: p.PrivateData,
		// With a first-FPDU hold to skip, ask the responder whether it
		// may be skipped (iwarp.MPAFlagEarlyFPDUQuery).
		EarlyFPDUQuery: d.cfg.FirstFPDUDelay > 0}
	if p.IRD == 0 {
		c.IRD = defaultIRDORD
	}
	if p.ORD == 0 {
		c.ORD = defaultIRDORD
	}
	if p.IRD < 0 {
		c.IRD = 0
	}
	if p.ORD < 0 {
		c.ORD = 0
	}
	if p.CRC != nil {
		c.CRC = *p.CRC
	}
	if p.Markers != nil {
		c.Markers = *p.Markers
	}
	if p.MPARevision != 0 {
		c.Revision = p.MPARevision
	}
	if p.PeerToPeer != nil {
		c.PeerToPeer = *p.PeerToPeer
	}
	if p.RTR != 0 {
		c.RTR = iwarp.RTR(p.RTR)
	}
	return c
}

// Conn is an established connection: a QP in RTS on a TCP stream.
type Conn struct {
	qp           *QP
	peerData     []byte
	neg          Negotiated
	laddr, raddr netip.AddrPort // the TCP connection's, when established
}

// QP returns the connected QP.
func (c *Conn) QP() *QP { return c.qp }

// PeerPrivateData returns the private data the peer sent.
func (c *Conn) PeerPrivateData() []byte { return c.peerData }

// Negotiated returns the negotiated parameters.
func (c *Conn) Negotiated() Negotiated { return c.neg }

// LocalAddr returns the local TCP address.
func (c *Conn) LocalAddr() netip.AddrPort { return c.laddr }

// RemoteAddr returns the peer's TCP address.
func (c *Conn) RemoteAddr() netip.AddrPort { return c.raddr }

// Done is closed when the connection is over and the QP flushed.
func (c *Conn) Done() <-chan struct{} { return c.qp.Done() }

// Disconnect closes gracefully (see QP.Disconnect).
func (c *Conn) Disconnect(ctx context.Context) error { return c.qp.Disconnect(ctx) }

// Close aborts the connection and destroys the QP.
func (c *Conn) Close() error { return c.qp.Close() }

func negotiated(p iwarp.ConnParams, m iwarp.MarkerDirs) Negotiated {
	return Negotiated{MPARevision: p.Revision, CRC: p.CRC, IRD: p.IRD, ORD: p.ORD, PeerToPeer: p.PeerToPeer, RTR: RTR(p.RTR),
		MarkersTx: m.Tx, MarkersRx: m.Rx}
}

// Dial connects qp to a listener at raddr (rdma_connect): TCP connect,
// MPA Request/Reply with p's private data and IRD/ORD, then RTS.
func (d *Device) Dial(ctx context.Context, qp *QP, raddr netip.AddrPort, p ConnParams) (*Conn, error) {
	if err := checkPrivateData(p.PrivateData); err != nil {
		return nil, err
	}
	return d.ops.dial(ctx, qp, raddr, p)
}

func (e *engineDevice) dial(ctx context.Context, qp *QP, raddr netip.AddrPort, p ConnParams) (*Conn, error) {
	d := (*Device)(e)
	if qp == nil || qp.pd.dev != d {
		return nil, fmt.Errorf("%w: QP of another device", ErrInvalidArgument)
	}
	if qp.State() != QPIdle {
		return nil, fmt.Errorf("%w: QP is %v, not IDLE", ErrInvalidState, qp.State())
	}
	cfg := d.mpaConfig(p)
	s, err := d.ns.DialFrom(ctx, p.LocalAddr, raddr)
	if err != nil {
		return nil, fmt.Errorf("verbs: connect %v: %w", raddr, err)
	}
	params, mk, pd, err := iwarp.InitiateMarkers(ctx, s, cfg)
	if err != nil {
		s.Abort()
		return nil, engineErr(fmt.Errorf("verbs: connect %v: %w", raddr, err))
	}
	params.MarkersTx, params.MarkersRx = mk.Tx, mk.Rx
	if err := qp.iw.Start(s, params); err != nil {
		s.Abort()
		return nil, err
	}
	return &Conn{qp: qp, peerData: pd, neg: negotiated(params, mk), laddr: s.LocalAddr(), raddr: s.RemoteAddr()}, nil
}

// Listener accepts connection requests.
type Listener struct {
	dev     *Device
	tcp     *netstack.Listener
	reqs    chan *ConnRequest
	closed  chan struct{}
	once    sync.Once
	timeout time.Duration
	wg      sync.WaitGroup
	// ops is what the listener does, by kind of device: engineListener
	// (tcp, reqs, timeout and wg are its) or remoteListener (remote_cm.go).
	ops listenerOps
}

// listenerOps is what a listener does, one implementation per kind of
// device: an embedded device's, on its netstack (engineListener), or a
// service's, reached through its socket (remoteListener, remote_cm.go).
type listenerOps interface {
	addr() netip.AddrPort
	getRequest(ctx context.Context) (*ConnRequest, error)
	close() error
}

// engineListener is a listener of an embedded device.
type engineListener Listener

func (e *engineListener) addr() netip.AddrPort { return e.tcp.Addr() }

// ListenConfig configures a Listener.
type ListenConfig struct {
	Backlog int // pending requests (default 64)
	// MPATimeout bounds the wait for an initiator's MPA Request (default
	// 5 s, as siw).
	MPATimeout time.Duration
}

// Listen listens for connections on laddr (rdma_listen).
func (d *Device) Listen(laddr netip.AddrPort, cfg ListenConfig) (*Listener, error) {
	if cfg.Backlog <= 0 {
		cfg.Backlog = defaultBacklog
	}
	if cfg.MPATimeout <= 0 {
		cfg.MPATimeout = 5 * time.Second
	}
	return d.ops.listen(laddr, cfg)
}

func (e *engineDevice) listen(laddr netip.AddrPort, cfg ListenConfig) (*Listener, error) {
	d := (*Device)(e)
	t, err := d.ns.Listen(laddr, cfg.Backlog)
	if err != nil {
		return nil, fmt.Errorf("verbs: listen %v: %w", laddr, err)
	}
	l := &Listener{dev: d, tcp: t, reqs: make(chan *ConnRequest, cfg.Backlog), closed: make(chan struct{}), timeout: cfg.MPATimeout}
	l.ops = (*engineListener)(l)
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		t.Close()
		return nil, net.ErrClosed
	}
	d.listeners[l] = struct{}{}
	d.mu.Unlock()
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

// Addr returns the listening address.
func (l *Listener) Addr() netip.AddrPort { return l.ops.addr() }

// acceptLoop accepts TCP connections and reads their MPA Requests (one
// goroutine per listener, one short-lived goroutine per connection).
func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-l.closed
		cancel()
	}()
	for {
		s, err := l.tcp.Accept(ctx)
		if err != nil {
			return
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			rctx, rcancel := context.WithTimeout(ctx, l.timeout)
			req, err := iwarp.AwaitMPARequest(rctx, s)
			rcancel()
			if err != nil {
				s.Abort()
				return
			}
			if req.Markers && !l.dev.cfg.Markers {
				// A device without Markers refuses a Request with M at
				// once, as siw does (R set, M cleared), before it
				// reaches the application.
				_ = req.Reject(ctx, s, nil)
				s.Close()
				return
			}
			r := &ConnRequest{l: l, stream: s, req: req}
			r.ops = (*engineRequest)(r)
			select {
			case l.reqs <- r:
			default:
				// Backlog full: refuse, as a full listen queue does.
				_ = req.Reject(ctx, s, nil)
				s.Close()
			}
		}()
	}
}

// GetRequest waits for the next connection request (rdma_get_request).
func (l *Listener) GetRequest(ctx context.Context) (*ConnRequest, error) {
	return l.ops.getRequest(ctx)
}

func (e *engineListener) getRequest(ctx context.Context) (*ConnRequest, error) {
	select {
	case r := <-e.reqs:
		return r, nil
	case <-e.closed:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Accept waits for a request and accepts it onto qp with p.
func (l *Listener) Accept(ctx context.Context, qp *QP, p ConnParams) (*Conn, error) {
	r, err := l.GetRequest(ctx)
	if err != nil {
		return nil, err
	}
	return r.Accept(ctx, qp, p)
}

// Close stops listening; pending requests are rejected and waiters get
// net.ErrClosed. It is idempotent.
func (l *Listener) Close() error { return l.ops.close() }

func (e *engineListener) close() error {
	l := (*Listener)(e)
	l.once.Do(func() {
		close(l.closed)
		l.tcp.Close()
		l.wg.Wait()
		for {
			select {
			case r := <-l.reqs:
				r.Reject(nil)
			default:
				l.dev.mu.Lock()
				delete(l.dev.listeners, l)
				l.dev.mu.Unlock()
				return
			}
		}
	})
	return nil
}

// ConnRequest is a connection request not yet accepted (a
// CONNECT_REQUEST event).
//
// Locks: see the package documentation.
type ConnRequest struct {
	l      *Listener
	stream *netstack.Conn
	req    *iwarp.MPARequest
	mu     sync.Mutex
	// +checklocks:mu
	used bool
	// ops is what the request does, by kind of device: engineRequest
	// (stream is its) or remoteRequest (remote_cm.go).
	ops requestOps
}

// requestOps is what a connection request does, one implementation per
// kind of device: an embedded device's, on its TCP connection
// (engineRequest), or a service's (remoteRequest, remote_cm.go).
type requestOps interface {
	remoteAddr() netip.AddrPort
	accept(ctx context.Context, qp *QP, p ConnParams) (*Conn, error)
	reject(privateData []byte) error
}

// engineRequest is a connection request of an embedded device.
type engineRequest ConnRequest

func (e *engineRequest) remoteAddr() netip.AddrPort { return e.stream.RemoteAddr() }

// PrivateData returns the initiator's private data.
func (r *ConnRequest) PrivateData() []byte { return r.req.PrivateData }

// IRD returns the initiator's IRD (0 without MPA v2 enhanced setup).
func (r *ConnRequest) IRD() int { return int(r.req.V2.IRD) }

// ORD returns the initiator's ORD.
func (r *ConnRequest) ORD() int { return int(r.req.V2.ORD) }

// MPARevision returns the request's MPA revision.
func (r *ConnRequest) MPARevision() uint8 { return r.req.Revision }

// CRC reports whether the initiator asked for CRC.
func (r *ConnRequest) CRC() bool { return r.req.CRC }

// PeerToPeer reports whether the initiator asked for peer-to-peer mode
// and the RTR types it offered.
func (r *ConnRequest) PeerToPeer() (bool, RTR) { return r.req.V2.PeerToPeer, RTR(r.req.V2.RTR) }

// Markers reports whether the initiator asked for MPA markers in what this
// end sends (only a device with Markers passes such a request on).
func (r *ConnRequest) Markers() bool { return r.req.Markers }

// RemoteAddr returns the initiator's address.
func (r *ConnRequest) RemoteAddr() netip.AddrPort { return r.ops.remoteAddr() }

var errRequestUsed = errors.New("verbs: connection request already accepted or rejected")

func (r *ConnRequest) claim() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.used {
		return errRequestUsed
	}
	r.used = true
	return nil
}

// Accept sends the MPA Reply and brings qp to RTS (rdma_accept). The QP
// transmits what its application posts, as Linux siw's does, its first
// FPDU once the initiator has spoken or FirstFPDUDelay has passed; with
// DeviceConfig.MPAStrict, and in peer-to-peer mode, it sends nothing until
// the initiator's first message arrives (RFC 5044's "the initiator speaks
// first"; peer-to-peer mode's RTR makes that automatic).
func (r *ConnRequest) Accept(ctx context.Context, qp *QP, p ConnParams) (*Conn, error) {
	if err := checkPrivateData(p.PrivateData); err != nil {
		return nil, err
	}
	return r.ops.accept(ctx, qp, p)
}

func (e *engineRequest) accept(ctx context.Context, qp *QP, p ConnParams) (*Conn, error) {
	r := (*ConnRequest)(e)
	if qp == nil || qp.pd.dev != r.l.dev {
		return nil, fmt.Errorf("%w: QP of another device", ErrInvalidArgument)
	}
	if qp.State() != QPIdle {
		return nil, fmt.Errorf("%w: QP is %v, not IDLE", ErrInvalidState, qp.State())
	}
	if err := r.claim(); err != nil {
		return nil, err
	}
	cfg := r.l.dev.mpaConfig(p)
	if r.l.dev.siwReply {
		r.req.EarlyFPDUQuery = false
	}
	params, mk, err := r.req.AcceptMarkers(ctx, r.stream, cfg)
	if err != nil {
		r.stream.Abort()
		return nil, err
	}
	params.MarkersTx, params.MarkersRx = mk.Tx, mk.Rx
	if err := qp.iw.Start(r.stream, params); err != nil {
		r.stream.Abort()
		return nil, err
	}
	return &Conn{qp: qp, peerData: r.req.PrivateData, neg: negotiated(params, mk), laddr: r.stream.LocalAddr(), raddr: r.stream.RemoteAddr()}, nil
}

// Reject refuses the request with private data (rdma_reject).
func (r *ConnRequest) Reject(privateData []byte) error {
	if err := checkPrivateData(privateData); err != nil {
		return err
	}
	return r.ops.reject(privateData)
}

func (e *engineRequest) reject(privateData []byte) error {
	r := (*ConnRequest)(e)
	if err := r.claim(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := r.req.Reject(ctx, r.stream, privateData)
	r.stream.Close()
	return err
}

// defaultBacklog is a listener's backlog when its configuration names none.
const defaultBacklog = 64

// checkPrivateData refuses private data longer than an MPA Request or
// Reply carries (RFC 5044's PD_Length limit), on either kind of device.
func checkPrivateData(pd []byte) error {
	if len(pd) > iwarp.MPAMaxPrivateData {
		return fmt.Errorf("%w: %d bytes of private data, MPA carries at most %d", ErrInvalidArgument, len(pd), iwarp.MPAMaxPrivateData)
	}
	return nil
}
