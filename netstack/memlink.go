package netstack

import (
	"cmp"
	"io"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// Link defaults and limits.
const (
	DefaultMTU      = 1500
	DefaultGSOMax   = 1 << 16
	DefaultQueueLen = 1024

	minLinkMTU = header.IPv4MinimumProcessableDatagramSize // 68
	maxLinkMTU = 65535
)

// LinkConfig configures NewLinkPair.
type LinkConfig struct {
	MTU      uint32 // default 1500; clamped to [68, 65535]
	GSOMax   uint32 // default 65536; 0 from user = default; set NoGSO to turn off. Clamped to [MTU, 65536].
	NoGSO    bool
	QueueLen int // per-direction packet queue, default 1024
	// TailDrop makes a full queue drop what is written to it, as a
	// router's does. By default a writer that finds the queue full waits
	// for room instead (up to MaxWait, then the packet is dropped),
	// as a NIC whose ring is full holds packets in its qdisc: a wire in
	// memory loses nothing, and TCP's flows share it the way their
	// windows do. (With tail drop, 1,024 connections writing at once
	// lost packets to the full queue, retransmission timeouts backed some
	// off for hundreds of milliseconds, and the slowest got a quarter of
	// its fair share.)
	TailDrop bool
	// MaxWait bounds how long a write waits for room in a full queue
	// before it drops (default DefaultMaxLinkWait): a packet the stack
	// sends from the other end's delivery goroutine (a reset, an ICMP
	// reply) must not wait long on a queue that goroutine would drain.
	// 0: the default.
	MaxWait time.Duration
}

// DefaultMaxLinkWait is LinkConfig.MaxWait's default.
const DefaultMaxLinkWait = 20 * time.Millisecond

// memLink is one end of an in-memory, pure-IP link. Packets written to it are
// queued (as refcounted clones, no payload copy) and delivered to the peer's
// dispatcher by this end's delivery goroutine.
type memLink struct {
	peer   *memLink
	mtu    atomic.Uint32
	gsoMax uint32
	gso    bool

	q        chan memPacket
	tailDrop bool
	maxWait  time.Duration
	stop     chan struct{}
	exited   chan struct{}
	dropped  atomic.Uint64

	mu sync.RWMutex
	// Guarded by mu.
	dispatcher stack.NetworkDispatcher
	closed     bool
	onClose    func()
}

type memPacket struct {
	proto tcpip.NetworkProtocolNumber
	pkt   *stack.PacketBuffer
}

var (
	_ stack.LinkEndpoint = (*memLink)(nil)
	_ stack.GSOEndpoint  = (*memLink)(nil)
)

// NewLinkPair returns two connected in-memory link endpoints: pure IP (no L2
// header, ARPHardwareNone), RX and TX checksum offload, and (unless
// cfg.NoGSO) host GSO, so TCP hands the link super-segments of up to GSOMax
// bytes which are delivered unsplit to the peer stack. Packets are passed by
// reference (the payload is not copied) through a bounded queue per
// direction; a writer that finds it full waits for room (see
// LinkConfig.TailDrop; what is dropped is counted by LinkDrops). Each end
// runs one delivery goroutine, started here and stopped by Close (which
// waits for it); Wait returns at once until Close has been called, as
// gVisor's Stack.Wait calls it before closing the link.
//
// Because of TX checksum offload the TCP checksum of delivered packets is
// left partial; the receiving end advertises RX checksum offload so its
// stack treats them as validated. Do not bridge these endpoints to a real
// network without recomputing checksums.
func NewLinkPair(cfg LinkConfig) (a, b stack.LinkEndpoint) {
	mtu := cfg.MTU
	switch {
	case mtu == 0:
		mtu = DefaultMTU
	case mtu < minLinkMTU:
		mtu = minLinkMTU
	case mtu > maxLinkMTU:
		mtu = maxLinkMTU
	}
	gsoMax := cfg.GSOMax
	if gsoMax == 0 || gsoMax > DefaultGSOMax {
		gsoMax = DefaultGSOMax
	}
	if gsoMax < mtu {
		gsoMax = mtu
	}
	qlen := cfg.QueueLen
	if qlen <= 0 {
		qlen = DefaultQueueLen
	}
	mk := func() *memLink {
		l := &memLink{
			gsoMax:   gsoMax,
			gso:      !cfg.NoGSO,
			q:        make(chan memPacket, qlen),
			tailDrop: cfg.TailDrop,
			maxWait:  cmp.Or(cfg.MaxWait, DefaultMaxLinkWait),
			stop:     make(chan struct{}),
			exited:   make(chan struct{}),
		}
		l.mtu.Store(mtu)
		return l
	}
	la, lb := mk(), mk()
	la.peer, lb.peer = lb, la
	go la.run()
	go lb.run()
	return la, lb
}

// LinkDrops returns how many packets an endpoint made by NewLinkPair dropped
// because its queue was full (0 for other endpoints).
func LinkDrops(ep stack.LinkEndpoint) uint64 {
	if l, ok := ep.(*memLink); ok {
		return l.dropped.Load()
	}
	return 0
}

func (l *memLink) run() {
	defer close(l.exited)
	for {
		select {
		case mp := <-l.q:
			l.peer.deliver(mp)
		case <-l.stop:
			for {
				select {
				case mp := <-l.q:
					mp.pkt.DecRef()
				default:
					return
				}
			}
		}
	}
}

// deliver hands a packet to this end's stack and releases it.
func (l *memLink) deliver(mp memPacket) {
	l.mu.RLock()
	d := l.dispatcher
	l.mu.RUnlock()
	if d != nil {
		d.DeliverNetworkPacket(mp.proto, mp.pkt)
	}
	mp.pkt.DecRef()
}

// WritePackets implements stack.LinkWriter.
func (l *memLink) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return 0, &tcpip.ErrClosedForSend{}
	}
	n := 0
	for _, pkt := range pkts.AsSlice() {
		// A fresh packet sharing pkt's memory (header and payload views are
		// refcounted, nothing is copied) but none of its metadata, so the
		// receiving stack parses it from scratch.
		np := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: pkt.ToBuffer()})
		mp := memPacket{proto: pkt.NetworkProtocolNumber, pkt: np}
		select {
		case l.q <- mp:
			n++
			continue
		default:
		}
		if !l.tailDrop && l.wait(mp) {
			n++
			continue
		}
		np.DecRef()
		l.dropped.Add(uint64(pkts.Len() - n))
		return n, &tcpip.ErrNoBufferSpace{}
	}
	return n, nil
}

// wait queues mp once the full queue has room, unless maxWait passes
// or the link closes first; it reports whether mp was queued.
func (l *memLink) wait(mp memPacket) bool {
	t := waitTimers.Get().(*time.Timer)
	t.Reset(l.maxWait)
	defer func() {
		t.Stop() // (since Go 1.23 a stopped timer's channel holds no stale tick)
		waitTimers.Put(t)
	}()
	select {
	case l.q <- mp:
		return true
	case <-l.stop:
	case <-t.C:
	}
	return false
}

// waitTimers are the stopped timers of wait: with many writers against
// full queues (a thousand connections at once), one fresh timer per wait
// was garbage the collector had to find.
var waitTimers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

// Attach implements stack.NetworkLinkEndpoint.
func (l *memLink) Attach(d stack.NetworkDispatcher) {
	l.mu.Lock()
	l.dispatcher = d
	l.mu.Unlock()
}

// IsAttached implements stack.NetworkLinkEndpoint.
func (l *memLink) IsAttached() bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.dispatcher != nil
}

// MTU implements stack.NetworkLinkEndpoint.
func (l *memLink) MTU() uint32 { return l.mtu.Load() }

// SetMTU implements stack.NetworkLinkEndpoint. Values are clamped like
// LinkConfig.MTU.
func (l *memLink) SetMTU(mtu uint32) {
	l.mtu.Store(min(max(mtu, minLinkMTU), maxLinkMTU))
}

// MaxHeaderLength implements stack.NetworkLinkEndpoint: no link header.
func (*memLink) MaxHeaderLength() uint16 { return 0 }

// LinkAddress implements stack.NetworkLinkEndpoint: none.
func (*memLink) LinkAddress() tcpip.LinkAddress { return "" }

// SetLinkAddress implements stack.NetworkLinkEndpoint; a pure-IP link has no
// link address, so it is ignored.
func (*memLink) SetLinkAddress(tcpip.LinkAddress) {}

// Capabilities implements stack.NetworkLinkEndpoint.
func (*memLink) Capabilities() stack.LinkEndpointCapabilities {
	return stack.CapabilityRXChecksumOffload | stack.CapabilityTXChecksumOffload
}

// GSOMaxSize implements stack.GSOEndpoint.
func (l *memLink) GSOMaxSize() uint32 {
	if !l.gso {
		return 0
	}
	return l.gsoMax
}

// SupportedGSO implements stack.GSOEndpoint.
func (l *memLink) SupportedGSO() stack.SupportedGSO {
	if !l.gso {
		return stack.GSONotSupported
	}
	return stack.HostGSOSupported
}

// ARPHardwareType implements stack.NetworkLinkEndpoint.
func (*memLink) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareNone }

// AddHeader implements stack.NetworkLinkEndpoint.
func (*memLink) AddHeader(*stack.PacketBuffer) {}

// ParseHeader implements stack.NetworkLinkEndpoint.
func (*memLink) ParseHeader(*stack.PacketBuffer) bool { return true }

// Wait implements stack.NetworkLinkEndpoint: after Close it waits for the
// delivery goroutine; before Close it returns immediately.
func (l *memLink) Wait() {
	l.mu.RLock()
	closed := l.closed
	l.mu.RUnlock()
	if closed {
		<-l.exited
	}
}

// Close implements stack.NetworkLinkEndpoint: it stops this end's delivery
// goroutine (dropping queued packets) and waits for it. The peer keeps
// running but its packets are no longer delivered here once this end is
// detached.
func (l *memLink) Close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		<-l.exited
		return
	}
	l.closed = true
	action := l.onClose
	l.onClose = nil
	close(l.stop)
	l.mu.Unlock()
	if action != nil {
		action()
	}
	<-l.exited
}

// SetOnCloseAction implements stack.NetworkLinkEndpoint.
func (l *memLink) SetOnCloseAction(f func()) {
	l.mu.Lock()
	l.onClose = f
	l.mu.Unlock()
}

// PairConfig configures NewPair.
type PairConfig struct {
	Link         LinkConfig
	AddrA, AddrB netip.Prefix // default 192.0.2.1/24 and 192.0.2.2/24 (documentation range; the pair is in-memory only)
	Stack        Config       // template for both (Link/Addrs filled in per side)
	PcapA        io.Writer    // optional: capture side A's link to this writer (pcap)
}

// NewPair builds two stacks connected by NewLinkPair. Side A's link is
// wrapped in a Capture when PcapA is set (its errors are reported through
// CaptureOf(a)). AddrA and AddrB must be of the same family. Closing a stack
// closes its end of the link.
func NewPair(cfg PairConfig) (a, b *Stack, err error) {
	addrA, addrB := cfg.AddrA, cfg.AddrB
	if !addrA.IsValid() {
		addrA = netip.MustParsePrefix("192.0.2.1/24")
	}
	if !addrB.IsValid() {
		addrB = netip.MustParsePrefix("192.0.2.2/24")
	}
	if addrA.Addr().Is4() != addrB.Addr().Is4() {
		return nil, nil, errConfig("PairConfig: AddrA and AddrB are of different address families")
	}
	if addrA.Addr() == addrB.Addr() {
		return nil, nil, errConfig("PairConfig: AddrA and AddrB are equal")
	}
	la, lb := NewLinkPair(cfg.Link)
	if cfg.PcapA != nil {
		la = NewCapture(la, cfg.PcapA)
	}
	ca := cfg.Stack
	ca.Link, ca.Addrs = la, []netip.Prefix{addrA}
	a, err = New(ca)
	if err != nil {
		la.Close()
		lb.Close()
		return nil, nil, err
	}
	cb := cfg.Stack
	cb.Link, cb.Addrs = lb, []netip.Prefix{addrB}
	b, err = New(cb)
	if err != nil {
		a.Close()
		lb.Close()
		return nil, nil, err
	}
	return a, b, nil
}
