package verbs

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

// DeviceConfig configures a Device. Zero values take the defaults.
type DeviceConfig struct {
	Name string // default "rt0"
	// MPA defaults for every connection of the device; ConnParams may
	// override them per connection.
	MPARevision uint8 // 1 or 2 (default 2, enhanced setup, as siw)
	CRC         bool  // ask for CRC32c (siw's default is off)
	PeerToPeer  bool  // RFC 6581 peer-to-peer mode (siw's default is off)
	RTR         RTR   // RFC 6581 Ready-To-Receive types offered (with PeerToPeer)
	// Markers enables MPA markers (RFC 5044 §5), off by default: a
	// connection asks the peer to insert them (M bit) and honours a
	// peer's request, and listeners pass requests for them on to the
	// application instead of rejecting them at once. Linux siw rejects
	// any request for markers.
	Markers bool
	// NoExtensions turns the RFC 7306 extensions off: atomics and Write
	// and Send with Immediate cannot be posted, a peer's atomic and
	// Immediate Data messages are answered with a Terminate (RDMAP Remote
	// Operation / Unexpected OpCode) as Linux siw does, and atomic_cap
	// reads ATOMIC_NONE. Nothing negotiates them on the wire: with them
	// on (the default), an application learns out of band that its peer
	// has them.
	NoExtensions bool
	// MaxFPDU caps FPDU size; 0 keeps one FPDU per TCP segment.
	MaxFPDU int
	// FirstFPDUDelay holds the first FPDU of a connection this device
	// initiates for this long after the MPA Reply (default 10 ms, negative
	// for none): unpatched Linux siw stalls a connection whose first FPDU
	// arrives in the instant after its Reply (its accept race). Dial does
	// not wait for it (work posted meanwhile queues), and there is no hold
	// when the responder says it needs none: with a hold configured, the
	// MPA Request asks (reserved bit 0x01) and an rdmatap responder
	// answers (0x02), which siw never does.
	FirstFPDUDelay time.Duration
	// MPAStrict keeps RFC 5044's startup rule on the connections the
	// device accepts: the responder transmits nothing before the
	// initiator's first FPDU has arrived (QP.OpenTXGate lifts it for one
	// QP). By default a responder transmits whenever its application
	// posts, as Linux siw's does, so that a server that speaks first
	// (ib_write_lat, ucmatose) works with siw's initiator, which sends
	// nothing before its application does; only its first FPDU waits,
	// for the initiator's first or for FirstFPDUDelay after the MPA
	// Reply, whichever comes first (none when the initiator is
	// rdmatap's, which says it takes FPDUs right behind the Reply). In
	// peer-to-peer mode (RFC 6581) a responder always waits for the
	// initiator's RTR.
	MPAStrict bool
	// EventQueue is the depth of the async event channel (default 256).
	EventQueue int
	// TimeHoleFills times, in either placement mode, how long a message
	// takes to complete after the segment that filled a hole in its
	// stream arrived (Stats.Segment.HoleFills, HoleFillTime); it installs
	// the segment tap (its per-segment cost) with stream placement too.
	TimeHoleFills bool
	// Placement: PlacementSegment also places RDMA Write, Read
	// Response and Send payload from TCP segments that arrive beyond a
	// hole, and delivers from the segment that fills it, before TCP hands
	// the stream over (the netstack must not have connections yet); the
	// default places from TCP's in-order stream only.
	Placement Placement
}

// Placement is where a device places incoming payload from.
type Placement uint8

// Placement modes.
const (
	// PlacementStream places payload from TCP's in-order stream only.
	PlacementStream Placement = iota
	// PlacementSegment also places payload from TCP segments as they
	// arrive beyond a hole, and delivers from them when a hole fills.
	PlacementSegment
)

func (p Placement) String() string { return iwarp.Placement(p).String() }

// Device is an RDMA device: one iWARP RNIC on one netstack. It owns the
// STag table, the QP numbers and the counters.
//
// Locks: see the package documentation.
type Device struct {
	cfg    DeviceConfig
	ns     *netstack.Stack
	mem    *iwarp.MemTable
	stats  iwarp.Stats
	seg    iwarp.SegmentStats
	events chan AsyncEvent
	lost   atomic.Uint64

	nextQPN atomic.Uint32
	nextPD  atomic.Uint32

	// siwReply: the device's Replies leave an initiator's early-FPDU
	// query unanswered, as Linux siw's do (tests and benchmarks).
	siwReply bool

	mu sync.Mutex
	// +checklocks:mu
	closed bool
	// +checklocks:mu
	qps map[uint32]*QP
	// +checklocks:mu
	listeners map[*Listener]struct{}

	// ops is what the device does, by kind: engineDevice (Open) or the
	// connection to a service (*client, remote.go; Connect).
	ops deviceOps
	// hook, when set (service.Serve, through verbs/internal/bridge),
	// sees each QP event first and keeps those of a service's clients
	// from the device's own channel.
	hook atomic.Pointer[func(AsyncEvent) bool]
}

// Open makes a device on a netstack.
func Open(ns *netstack.Stack, cfg DeviceConfig) (*Device, error) {
	if ns == nil {
		return nil, fmt.Errorf("%w: nil netstack", ErrInvalidArgument)
	}
	if cfg.Name == "" {
		cfg.Name = "rt0"
	}
	if cfg.MPARevision == 0 {
		cfg.MPARevision = 2
	}
	if cfg.MPARevision > 2 {
		return nil, fmt.Errorf("%w: MPA revision %d", ErrInvalidArgument, cfg.MPARevision)
	}
	if cfg.MaxFPDU < 0 {
		return nil, fmt.Errorf("%w: MaxFPDU %d", ErrInvalidArgument, cfg.MaxFPDU)
	}
	if cfg.FirstFPDUDelay == 0 {
		cfg.FirstFPDUDelay = 10 * time.Millisecond
	}
	if cfg.FirstFPDUDelay < 0 {
		cfg.FirstFPDUDelay = 0
	}
	if cfg.EventQueue <= 0 {
		cfg.EventQueue = 256
	}
	switch cfg.Placement {
	case PlacementStream:
	case PlacementSegment:
		ns.EnableConnTaps()
	default:
		return nil, fmt.Errorf("%w: placement %v", ErrInvalidArgument, cfg.Placement)
	}
	if cfg.TimeHoleFills {
		ns.EnableConnTaps()
	}
	d := &Device{cfg: cfg, ns: ns, mem: iwarp.NewMemTable(), events: make(chan AsyncEvent, cfg.EventQueue),
		qps: map[uint32]*QP{}, listeners: map[*Listener]struct{}{}}
	d.ops = (*engineDevice)(d)
	d.nextQPN.Store(16) // QP numbers below 16 are reserved, as on RNICs
	return d, nil
}

// deviceOps is what a device does, one implementation per kind: an
// embedded device, the protocol engine on this process's netstack
// (engineDevice), or a service's device, reached through its socket
// (*client, remote.go). The objects a device makes carry the same kind
// (cqOps, pdOps, qpOps, srqOps, mrOps, mwOps, listenerOps, requestOps).
type deviceOps interface {
	query() DeviceAttr
	counters() Stats
	allocPD() (*PD, error)
	createCQ(cqe int) (*CQ, error)
	dial(ctx context.Context, qp *QP, raddr netip.AddrPort, p ConnParams) (*Conn, error)
	listen(laddr netip.AddrPort, cfg ListenConfig) (*Listener, error)
	allocBuffer(n int) (*Buffer, error)
	// close ends what the kind holds once the device's QPs and listeners
	// are closed.
	close() error
}

// engineDevice is an embedded device.
type engineDevice Device

func (e *engineDevice) query() DeviceAttr { return defaultAttr(e.cfg) }

func (e *engineDevice) allocPD() (*PD, error) {
	d := (*Device)(e)
	pd := &PD{dev: d, id: d.nextPD.Add(1)}
	pd.ops = (*enginePD)(pd)
	return pd, nil
}

func (e *engineDevice) createCQ(cqe int) (*CQ, error) {
	cq := newCQ((*Device)(e), make([]WC, cqe))
	cq.ops = (*engineCQ)(cq)
	return cq, nil
}

func (e *engineDevice) allocBuffer(n int) (*Buffer, error) { return &Buffer{b: make([]byte, n)}, nil }

func (e *engineDevice) close() error { return nil }

// Name returns the device name.
func (d *Device) Name() string { return d.cfg.Name }

// Netstack returns the stack the device runs on (nil for a device of a
// service).
func (d *Device) Netstack() *netstack.Stack { return d.ns }

// DeviceAttr are the device's limits (the ibv_device_attr names).
type DeviceAttr struct {
	Transport    string `json:"transport"`
	MaxQP        int    `json:"max_qp"`
	MaxQPWR      int    `json:"max_qp_wr"`
	MaxSGE       int    `json:"max_sge"`
	MaxSGERd     int    `json:"max_sge_rd"`
	MaxCQ        int    `json:"max_cq"`
	MaxCQE       int    `json:"max_cqe"`
	MaxMR        int    `json:"max_mr"`
	MaxMRSize    uint64 `json:"max_mr_size"`
	MaxPD        int    `json:"max_pd"`
	MaxQPRdAtom  int    `json:"max_qp_rd_atom"`      // IRD
	MaxQPInitRd  int    `json:"max_qp_init_rd_atom"` // ORD
	MaxSRQ       int    `json:"max_srq"`
	MaxSRQWR     int    `json:"max_srq_wr"`
	MaxSRQSGE    int    `json:"max_srq_sge"`
	MaxInline    int    `json:"max_inline_data"`
	MaxPrivData  int    `json:"max_private_data"`
	MaxMsgSize   uint64 `json:"max_msg_size"`
	AtomicCap    string `json:"atomic_cap"`
	PageSizeCap  uint64 `json:"page_size_cap"`
	MaxMW        int    `json:"max_mw"`                     // windows share the STag space with MRs
	MaxFRPages   int    `json:"max_fast_reg_page_list_len"` // pages a fast-register MR maps
	VendorPartID uint32 `json:"vendor_part_id"`
	VendorID     uint32 `json:"vendor_id"` // siw's (VendorID)
}

// Atomic capabilities (ibv_atomic_cap).
const (
	AtomicNone = "ATOMIC_NONE" // IBV_ATOMIC_NONE (0)
	AtomicHCA  = "ATOMIC_HCA"  // IBV_ATOMIC_HCA (1)
	// AtomicGlob (IBV_ATOMIC_GLOB, 2): a peer's atomic is atomic against
	// every other atomic of the device and against the host program's
	// sync/atomic operations on the same word (rdmatap runs it with
	// sync/atomic on the registered memory).
	AtomicGlob = "ATOMIC_GLOB"
)

// Query returns the device's limits. On a device of a service they are the
// limits this client may use: the device's, lowered to the service's
// limits for a client.
func (d *Device) Query() DeviceAttr { return d.ops.query() }

// defaultAttr returns the limits of an embedded device of configuration
// cfg.
func defaultAttr(cfg DeviceConfig) DeviceAttr {
	atomicCap := AtomicGlob
	if cfg.NoExtensions {
		atomicCap = AtomicNone
	}
	return DeviceAttr{
		Transport: "iWARP", MaxQP: 1 << 16, MaxQPWR: 1 << 20, MaxSGE: 64, MaxSGERd: 1,
		MaxCQ: 1 << 16, MaxCQE: 1 << 22, MaxMR: iwarp.MaxRegions, MaxMRSize: 1 << 40, MaxPD: 1 << 16,
		MaxQPRdAtom: iwarp.MaxIRDORD, MaxQPInitRd: iwarp.MaxIRDORD, MaxSRQ: 1 << 16, MaxSRQWR: 1 << 20,
		MaxSRQSGE: 64, MaxInline: 4096, MaxPrivData: iwarp.MPAMaxPrivateData - iwarp.MPAv2PrefixSize,
		MaxMsgSize: 1<<32 - 1, AtomicCap: atomicCap, PageSizeCap: 4096,
		MaxMW: iwarp.MaxRegions, MaxFRPages: iwarp.MaxFastRegPages, VendorID: VendorID,
	}
}

// Stats returns a snapshot of the device counters. On a device of a
// service they are the service's device's: the traffic of all its
// clients together (and of the service's own use of it), not this
// client's alone; zero when the service cannot be asked (it is gone).
func (d *Device) Stats() Stats { return d.ops.counters() }

func (e *engineDevice) counters() Stats {
	d := (*Device)(e)
	s := &d.stats
	out := Stats{
		TxFPDUs: s.TxFPDUs.Load(), RxFPDUs: s.RxFPDUs.Load(),
		TxBytes: s.TxBytes.Load(), RxBytes: s.RxBytes.Load(),
		PlacedBytes: s.PlacedBytes.Load(), PlacementCopies: s.PlacementCopies.Load(),
		CRCErrors: s.CRCErrors.Load(), TerminatesSent: s.TermSent.Load(), TerminatesReceived: s.TermRecv.Load(),
		EventsLost: d.lost.Load(),
	}
	g := &d.seg
	out.Segment = SegmentStats{
		PlacedEarly: g.PlacedBytes.Load(), OutOfOrder: g.OutOfOrderBytes.Load(),
		EarlySends: g.SendBytes.Load(), EarlyReadResponses: g.ReadRespBytes.Load(),
		ByMarker: g.ByMarker.Load(), ByStream: g.ByStream.Load(), ByAlignment: g.ByAlignment.Load(), Unframed: g.Unframed.Load(),
		LeftInOrder: g.LeftInOrder.Load(),
		Refused:     g.Refused.Load(), RefusedCRC: g.RefusedCRC.Load(), RefusedHeader: g.RefusedHeader.Load(), RefusedSTag: g.RefusedSTag.Load(), RefusedMarker: g.RefusedMarker.Load(),
		BadChecksum: g.BadChecksum.Load(), OutOfWindow: g.OutOfWindow.Load(), BadFlags: g.BadFlags.Load(),
		Duplicates: g.Duplicates.Load(), Mismatches: g.Mismatches.Load(),
		Fed: g.FedBytes.Load(), DeliveredEarly: g.DeliveredEarly.Load(), Queued: g.Queued.Load(), QuickFed: g.QuickFed.Load(), QuickFedBytes: g.QuickFedBytes.Load(),
		Kept: g.KeptBytes.Load(), FillsFed: g.FillsFed.Load(),
		HoleFills: g.HoleFills.Load(), HoleFillTime: time.Duration(g.HoleFillNanos.Load()),
		HoleFillHist: Histogram(g.HoleFillHist.Load()),
	}
	for i := range s.RxOps {
		out.RxOps[i] = s.RxOps[i].Load()
		out.TxOps[i] = s.TxOps[i].Load()
	}
	out.TCP = tcpStats(d.ns)
	return out
}

// Stats are device counters.
type Stats struct {
	TxFPDUs, RxFPDUs             uint64
	TxBytes, RxBytes             uint64 // message payload bytes
	PlacedBytes, PlacementCopies uint64
	CRCErrors                    uint64
	TerminatesSent               uint64
	TerminatesReceived           uint64
	EventsLost                   uint64
	// Messages by RDMAP opcode (indexed by RDMAPOpcode).
	RxOps, TxOps [16]uint64
	// Segment placement (DeviceConfig.Placement).
	Segment SegmentStats
	// TCP's loss recovery under the device's connections.
	TCP TCPStats
}

// TCPStats are the TCP counters of a device's stack since it was made
// (netstack.TCPStats: how its connections recovered from loss, and what
// its link repaired), and the state of its busiest open connection (the
// most segments sent), as `ss -ti` shows a kernel socket's. Fixed-size
// fields only: a service sends them as they are.
type TCPStats struct {
	SegmentsSent, Retransmits uint64
	// Segments retransmitted on entering recovery; retransmission
	// timeouts (RTOs).
	FastRetransmits, Timeouts uint64
	// Recoveries by SACK (RACK) and those a tail-loss probe started;
	// recoveries and RTOs found spurious; segments the peer reported
	// received twice (D-SACK).
	SACKRecoveries, TLPRecoveries, SpuriousRecoveries, SpuriousRTOs, DSACKs uint64
	// Lost GSO packets the link sent again, and their payload bytes.
	LinkResentPackets, LinkResentBytes uint64
	Conns                              uint64 // open connections
	// The busiest open connection's own counters, congestion window and
	// slow-start threshold (segments), smoothed round trip, its
	// variation, and retransmission timeout.
	ConnSegmentsSent, ConnRetransmits, ConnFastRetransmits, ConnTimeouts uint64
	Cwnd, Ssthresh                                                       uint64
	SRTT, RTTVar, RTO                                                    time.Duration
}

func tcpStats(ns *netstack.Stack) TCPStats {
	t := ns.TCPStats()
	out := TCPStats{
		SegmentsSent: t.SegmentsSent, Retransmits: t.Retransmits,
		FastRetransmits: t.FastRetransmits, Timeouts: t.Timeouts,
		SACKRecoveries: t.SACKRecoveries, TLPRecoveries: t.TLPRecoveries,
		SpuriousRecoveries: t.SpuriousRecoveries, SpuriousRTOs: t.SpuriousRTOs, DSACKs: t.DSACKs,
		LinkResentPackets: t.LinkResentPackets, LinkResentBytes: t.LinkResentBytes,
	}
	conns := ns.ConnsTCP()
	out.Conns = uint64(len(conns))
	if len(conns) > 0 {
		c := conns[0]
		out.ConnSegmentsSent, out.ConnRetransmits, out.ConnFastRetransmits, out.ConnTimeouts = c.SegmentsSent, c.Retransmits, c.FastRetransmits, c.Timeouts
		out.Cwnd, out.Ssthresh = uint64(c.Cwnd), uint64(c.Ssthresh)
		out.SRTT, out.RTTVar, out.RTO = c.SRTT, c.RTTVar, c.RTO
	}
	return out
}

// SegmentStats count segment placement. Copies per payload byte received
// are PlacementCopies over RxBytes' FPDUs as before: an FPDU placed from
// its segment is not copied again in order.
type SegmentStats struct {
	PlacedEarly uint64 // payload bytes placed from segments before TCP delivered them in order
	OutOfOrder  uint64 // ... of which arrived beyond a hole in the stream
	// ... of which Send and Read Response payload (the rest is RDMA
	// Writes'; bytes fed with a hole-filling segment are not split up).
	EarlySends, EarlyReadResponses uint64
	// FPDUs located by an MPA marker, by the boundary the stream knew,
	// and by RFC 5044 Appendix A alignment (with the MPA CRC); segments
	// whose FPDU boundaries could not be established (left to the stream).
	ByMarker, ByStream, ByAlignment, Unframed uint64
	// FPDUs left to the stream by design (untagged ones but short ones
	// kept for delivery, Read Responses), and by a failed check, in all
	// and by reason.
	LeftInOrder                                                    uint64
	Refused, RefusedCRC, RefusedHeader, RefusedSTag, RefusedMarker uint64
	// Segments refused before DDP saw them: TCP checksum, outside the
	// receive window, flags.
	BadChecksum, OutOfWindow, BadFlags uint64
	Duplicates                         uint64 // payload bytes not placed twice (retransmitted, duplicated, or reached in order)
	Mismatches                         uint64 // placed FPDUs TCP delivered differently (stream terminated)
	// Payload bytes of segments that filled the hole the receiver waited
	// at, fed to it by the tap (counted in PlacedEarly too), and FPDUs the
	// tap delivered in order before TCP handed them over (the fed ones and
	// those placed beyond the hole): their messages completed then.
	Fed, DeliveredEarly uint64
	// Segments beyond a hole placed by the QP's receive goroutine (idle
	// while the hole holds the stream back) rather than on the link's.
	Queued uint64
	// Short segments that arrived in order and were fed to the idle
	// receiver by the tap: their messages completed without waiting for
	// TCP's goroutine and a wake-up of the receive goroutine; and their
	// payload bytes (counted in PlacedEarly too).
	QuickFed, QuickFedBytes uint64
	// Payload bytes of segments that had reached the tap in order but not
	// yet TCP's receive queue, which the tap kept and fed the receiver
	// when a hole filled behind them (counted in PlacedEarly too), and
	// the hole-filling segments the receiver had from the tap rather than
	// from TCP.
	Kept, FillsFed uint64
	// Hole fills timed (DeviceConfig.TimeHoleFills) and their total time
	// from the filling segment's arrival to the next message completed.
	HoleFills    uint64
	HoleFillTime time.Duration
	// HoleFillHist holds the same times by size (HoleFillHist.Quantile(0.5)
	// is the median; Sub of an earlier snapshot, what came in between).
	HoleFillHist Histogram
}

// RDMAPOpcode is an RDMAP message's opcode (RFC 5040 §4.2, RFC 7306 §8):
// Stats.RxOps and TxOps count messages by it.
type RDMAPOpcode uint8

// RDMAP opcodes.
const (
	RDMAPWrite            RDMAPOpcode = 0x0
	RDMAPReadRequest      RDMAPOpcode = 0x1
	RDMAPReadResponse     RDMAPOpcode = 0x2
	RDMAPSend             RDMAPOpcode = 0x3
	RDMAPSendInvalidate   RDMAPOpcode = 0x4
	RDMAPSendSE           RDMAPOpcode = 0x5
	RDMAPSendSEInvalidate RDMAPOpcode = 0x6
	RDMAPTerminate        RDMAPOpcode = 0x7
	// RFC 7306 extensions.
	RDMAPImmediate      RDMAPOpcode = 0x8
	RDMAPImmediateSE    RDMAPOpcode = 0x9
	RDMAPAtomicRequest  RDMAPOpcode = 0xa
	RDMAPAtomicResponse RDMAPOpcode = 0xb
)

func (o RDMAPOpcode) String() string { return iwarp.Opcode(o).String() }

// Histogram counts durations in log-linear buckets: one per nanosecond
// below 16 ns, then eight per power of two (a quantile read from it is
// within about 6 % of the true value), up to about 68 s.
type Histogram [272]uint64

// Count returns the number of durations counted.
func (h *Histogram) Count() uint64 { return (*iwarp.Histogram)(h).Count() }

// Sub returns the counts of h less those of an earlier snapshot o of the
// same histogram (what was counted in between).
func (h *Histogram) Sub(o *Histogram) Histogram {
	return Histogram((*iwarp.Histogram)(h).Sub((*iwarp.Histogram)(o)))
}

// Add adds o's counts to h.
func (h *Histogram) Add(o *Histogram) { (*iwarp.Histogram)(h).Add((*iwarp.Histogram)(o)) }

// Quantile returns the q-quantile (0 <= q <= 1) of the durations counted:
// the middle of the bucket it falls in. It returns 0 when none were.
func (h *Histogram) Quantile(q float64) time.Duration { return (*iwarp.Histogram)(h).Quantile(q) }

// AsyncEventType is the kind of an asynchronous event.
type AsyncEventType uint8

// Asynchronous events (the ibv_event_type names where they exist).
const (
	EventEstablished AsyncEventType = iota
	EventDisconnected
	EventTerminateSent
	EventTerminateReceived
	EventQPFatal
	EventSRQLimitReached
	// EventSRQErr: a receive posted to an SRQ of a service was dropped
	// (a malformed ring entry); Err says why.
	EventSRQErr
)

func (t AsyncEventType) String() string {
	return [...]string{"ESTABLISHED", "DISCONNECTED", "TERMINATE_SENT", "TERMINATE_RECEIVED", "QP_FATAL", "SRQ_LIMIT_REACHED", "SRQ_ERR"}[t]
}

// AsyncEvent is an asynchronous device event.
type AsyncEvent struct {
	Type  AsyncEventType
	QPNum uint32
	SRQ   *SRQ
	Term  TermCode // the Terminate of EventTerminateSent, EventTerminateReceived
	Err   error
	// ByPeer (EventDisconnected without Err): the peer closed the
	// connection gracefully first; else this end did (Disconnect). With
	// Err an error ended it (a reset, a Terminate, a failure).
	ByPeer bool
}

// Events returns the device's asynchronous events. Events that find the
// channel full are counted in Stats.EventsLost, never block the data path.
func (d *Device) Events() <-chan AsyncEvent { return d.events }

func (d *Device) post(e AsyncEvent) {
	if h := d.hook.Load(); h != nil && (*h)(e) {
		return
	}
	select {
	case d.events <- e:
	default:
		d.lost.Add(1)
	}
}

// AllocPD allocates a protection domain.
func (d *Device) AllocPD() (*PD, error) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, net.ErrClosed
	}
	d.mu.Unlock()
	return d.ops.allocPD()
}

// Close closes every listener and QP of the device.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	ls := make([]*Listener, 0, len(d.listeners))
	for l := range d.listeners {
		ls = append(ls, l)
	}
	qps := make([]*QP, 0, len(d.qps))
	for _, q := range d.qps {
		qps = append(qps, q)
	}
	d.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	for _, q := range qps {
		q.Close()
	}
	return d.ops.close()
}

// atomicCapValues are the ibv_atomic_cap values of DeviceAttr.AtomicCap.
var atomicCapValues = [...]string{AtomicNone, AtomicHCA, AtomicGlob}

// decodeAttr reads QUERY_DEVICE's reply arguments. Counts are bounded to
// what an int holds on this machine, and an unknown atomic capability
// reads as none.
func decodeAttr(m svc.Msg) DeviceAttr {
	n := func(i int) int { return int(min(m.Arg(i), math.MaxInt32)) }
	capName := AtomicNone
	if c := m.Arg(svc.QueryAtomicCap); c < uint64(len(atomicCapValues)) {
		capName = atomicCapValues[c]
	}
	return DeviceAttr{Transport: "iWARP",
		MaxQP: n(svc.QueryMaxQP), MaxQPWR: n(svc.QueryMaxQPWR), MaxSGE: n(svc.QueryMaxSGE), MaxSGERd: n(svc.QueryMaxSGERd),
		MaxCQ: n(svc.QueryMaxCQ), MaxCQE: n(svc.QueryMaxCQE), MaxMR: n(svc.QueryMaxMR), MaxMRSize: m.Arg(svc.QueryMaxMRSize),
		MaxPD: n(svc.QueryMaxPD), MaxQPRdAtom: n(svc.QueryMaxQPRdAtom), MaxQPInitRd: n(svc.QueryMaxQPInitRd),
		MaxSRQ: n(svc.QueryMaxSRQ), MaxSRQWR: n(svc.QueryMaxSRQWR), MaxSRQSGE: n(svc.QueryMaxSRQSGE),
		MaxInline: n(svc.QueryMaxInline), MaxPrivData: n(svc.QueryMaxPrivData), MaxMsgSize: m.Arg(svc.QueryMaxMsgSize),
		AtomicCap: capName, PageSizeCap: m.Arg(svc.QueryPageSizeCap), MaxMW: n(svc.QueryMaxMW),
		MaxFRPages: n(svc.QueryMaxFRPages), VendorPartID: uint32(m.Arg(svc.QueryVendorPartID)),
		VendorID: uint32(m.Arg(svc.QueryVendorID)),
	}
}
