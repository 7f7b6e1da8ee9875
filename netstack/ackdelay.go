package netstack

import (
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// Delayed ACKs at the link.
//
// gVisor's TCP acknowledges every batch of received segments at once (one
// pure ACK per wake of its processor goroutine, no delayed-ACK timer, and
// TCP_QUICKACK is accepted but not acted on). In a request/response
// exchange — an RDMA ping-pong, perftest's lat tests, a Read Request and
// its Response — the receiver's response follows its pure ACK a few
// microseconds later and carries the same acknowledgment, so every message
// costs two packets each way: a write and a read system call on a TAP, and
// the peer's stack processing a segment that says nothing new. Linux
// delays such ACKs (RFC 1122 §4.2.3.2, RFC 5681 §4.2); measured on bridged
// TAPs, dropping them took rdmatap's 2-byte one-way latency from 23–24 µs
// to 15–20 µs.
//
// The NIC's link endpoint, which rdmatap owns, does the delaying without
// changing gVisor: a pure ACK (ACK flag only, no payload, no SACK blocks)
// that acknowledges less than a full-sized segment since the last ACK that
// went out on its connection is held back for at most AckDelay. The next
// segment that connection sends carries an acknowledgment at least as new,
// and the held one is dropped; if none comes in time, it goes out. Window
// updates (no new data acknowledged), duplicate ACKs and SACKs, and ACKs
// of a full segment or more go out at once, so loss recovery and bulk
// ACK clocking are untouched. A peer's tail-loss probe waits at least 200
// ms more than its RTT when one segment is outstanding (RFC 8985 §7.2, as
// gVisor and Linux implement it), far above the hold.

// DefaultAckDelay is Config.AckDelay's default.
const DefaultAckDelay = 50 * time.Microsecond

const (
	ackSlots   = 4096 // connections tracked (direct-mapped by 4-tuple hash)
	ackStripes = 64   // locks over the slots
	// maxAckHold bounds the acknowledged bytes a held ACK may cover, below
	// a full segment: on links with large (GSO) MTUs a bulk receiver's
	// ACKs stay immediate.
	maxAckHold = 4096
)

// AckDelayStats count what the delaying did.
type AckDelayStats struct {
	Held      uint64 // pure ACKs held back
	Coalesced uint64 // ... dropped because a later segment carried their acknowledgment
	Flushed   uint64 // ... sent when their time ran out (or their slot was taken)
}

type ackKey struct {
	src, dst     tcpip.Address
	sport, dport uint16
}

// ackSlot is one connection's state (direct-mapped: a colliding connection
// takes the slot over, and its held ACK goes out first).
type ackSlot struct {
	key     ackKey
	used    bool
	known   bool   // lastAck is valid
	lastAck uint32 // the newest acknowledgment that went out
	held    *stack.PacketBuffer
	heldAck uint32
	since   time.Time // when the held ACK (or the one it replaced) was held
}

type ackDelay struct {
	next  stack.LinkEndpoint
	delay time.Duration
	// ACKs covering fewer bytes than this are held: less than a full
	// segment over IPv4 and over IPv6.
	threshold4, threshold6 uint32

	stripes [ackStripes]sync.Mutex
	slots   [ackSlots]ackSlot

	nheld  atomic.Int64 // held ACKs
	closed atomic.Bool
	tmu    sync.Mutex
	timer  *time.Timer
	armed  bool
	dirty  []int // slots that may hold an ACK (tmu)
	dead   bool  // closed (tmu)

	held, coalesced, flushed atomic.Uint64
}

func newAckDelay(next stack.LinkEndpoint, delay time.Duration) *ackDelay {
	a := &ackDelay{next: next, delay: delay}
	mtu := next.MTU()
	// A full segment: the MTU less the IP and TCP headers (with
	// timestamps; without them a full segment is 12 bytes longer, and
	// still not held).
	a.threshold4, a.threshold6 = fullSegment(mtu, 20+32), fullSegment(mtu, 40+32)
	return a
}

func fullSegment(mtu, headers uint32) uint32 {
	if mtu > headers && mtu-headers < maxAckHold {
		return mtu - headers
	}
	return maxAckHold
}

func (a *ackDelay) stats() AckDelayStats {
	return AckDelayStats{Held: a.held.Load(), Coalesced: a.coalesced.Load(), Flushed: a.flushed.Load()}
}

// tcpOf returns a packet's connection key, TCP header and payload size;
// ok is false for anything but TCP over IPv4 or IPv6.
func tcpOf(pkt *stack.PacketBuffer) (k ackKey, th header.TCP, ok bool) {
	nh := pkt.NetworkHeader().Slice()
	switch {
	case len(nh) >= header.IPv4MinimumSize && header.IPVersion(nh) == header.IPv4Version:
		h := header.IPv4(nh)
		if h.Protocol() != uint8(header.TCPProtocolNumber) {
			return k, nil, false
		}
		k.src, k.dst = h.SourceAddress(), h.DestinationAddress()
	case len(nh) >= header.IPv6MinimumSize && header.IPVersion(nh) == header.IPv6Version:
		h := header.IPv6(nh)
		if h.TransportProtocol() != header.TCPProtocolNumber {
			return k, nil, false
		}
		k.src, k.dst = h.SourceAddress(), h.DestinationAddress()
	default:
		return k, nil, false
	}
	th = header.TCP(pkt.TransportHeader().Slice())
	if len(th) < header.TCPMinimumSize || int(th.DataOffset()) > len(th) || th.DataOffset() < header.TCPMinimumSize {
		return k, nil, false
	}
	k.sport, k.dport = th.SourcePort(), th.DestinationPort()
	return k, th, true
}

// hasSACK reports whether the TCP options carry SACK blocks.
func hasSACK(th header.TCP) bool {
	opts := th[header.TCPMinimumSize:th.DataOffset()]
	for i := 0; i < len(opts); {
		switch opts[i] {
		case header.TCPOptionEOL:
			return false
		case header.TCPOptionNOP:
			i++
			continue
		case header.TCPOptionSACK:
			return true
		}
		if i+1 >= len(opts) || opts[i+1] < 2 {
			return false
		}
		i += int(opts[i+1])
	}
	return false
}

func (k *ackKey) slot() int {
	h := uint32(k.sport)<<16 | uint32(k.dport)
	for _, b := range k.src.AsSlice() {
		h = h*31 + uint32(b)
	}
	for _, b := range k.dst.AsSlice() {
		h = h*31 + uint32(b)
	}
	h ^= h >> 15
	h *= 0x2c1b3c6d
	h ^= h >> 12
	return int(h % ackSlots)
}

// writePackets passes pkts on, holding back the pure ACKs it may delay and
// dropping held ones that pkts supersede. It reports every packet of pkts
// as written when the link takes the rest.
func (a *ackDelay) writePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	// out comes from a pool (a list of its own would escape into the
	// next link's WritePackets: an allocation per call); it holds a
	// reference of its own to each packet, which Reset drops.
	out := pktLists.Get().(*stack.PacketBufferList)
	var sendHeld []*stack.PacketBuffer // taken over slots' held ACKs: sent first, then released
	// Held ACKs a segment now carries, released after the write (as is
	// the timer's disarming): the segment goes out first.
	var dropBuf [4]*stack.PacketBuffer
	dropped := dropBuf[:0]
	coalesced := false
	for _, pkt := range pkts.AsSlice() {
		k, th, ok := tcpOf(pkt)
		if !ok {
			out.PushBack(pkt.IncRef())
			continue
		}
		i := k.slot()
		mu := &a.stripes[i%ackStripes]
		mu.Lock()
		s := &a.slots[i]
		if s.used && s.key != k {
			if s.held != nil {
				sendHeld = append(sendHeld, s.held)
				out.PushBack(s.held.IncRef())
				a.flushed.Add(1)
				a.nheld.Add(-1)
			}
			*s = ackSlot{}
		}
		s.key, s.used = k, true
		flags := th.Flags()
		if flags&header.TCPFlagAck == 0 {
			// A RST without an acknowledgment (or a SYN): the connection
			// starts or ends here; a held ACK has nothing left to say.
			a.dropHeld(s)
			s.known = false
			mu.Unlock()
			out.PushBack(pkt.IncRef())
			continue
		}
		ack := th.AckNumber()
		since := time.Time{}
		if s.held != nil {
			if seqGE(ack, s.heldAck) {
				since = s.since
				dropped = append(dropped, s.held)
				s.held = nil
				a.nheld.Add(-1)
				a.coalesced.Add(1)
				coalesced = true
			} else {
				// Older than the held one (not sent by gVisor's TCP,
				// which acknowledges in order): the held one goes
				// first.
				sendHeld = append(sendHeld, s.held)
				out.PushBack(s.held.IncRef())
				s.held = nil
				a.nheld.Add(-1)
				a.flushed.Add(1)
			}
		}
		if flags == header.TCPFlagAck && pkt.Data().Size() == 0 && s.known && !a.closed.Load() &&
			seqGT(ack, s.lastAck) && ack-s.lastAck < a.threshold(k) && !hasSACK(th) {
			if since.IsZero() {
				since = time.Now()
			}
			s.held, s.heldAck, s.since = pkt.Clone(), ack, since
			a.nheld.Add(1)
			a.held.Add(1)
			mu.Unlock()
			a.arm(i, since)
			continue
		}
		if !s.known || seqGT(ack, s.lastAck) {
			s.lastAck, s.known = ack, true
		}
		mu.Unlock()
		out.PushBack(pkt.IncRef())
	}
	n := 0
	var err tcpip.Error
	if out.Len() > 0 {
		n, err = a.next.WritePackets(*out)
	}
	if coalesced && a.nheld.Load() == 0 {
		a.disarm()
	}
	out.Reset()
	pktLists.Put(out)
	for _, p := range sendHeld {
		p.DecRef()
	}
	for _, p := range dropped {
		p.DecRef()
	}
	if n == 0 && err != nil {
		return 0, err
	}
	return pkts.Len(), nil
}

// threshold is the acknowledged bytes below which an ACK of k's
// connection may be held.
func (a *ackDelay) threshold(k ackKey) uint32 {
	if k.src.Len() == 16 {
		return a.threshold6
	}
	return a.threshold4
}

// dropHeld releases s's held ACK, if any; its stripe is locked.
func (a *ackDelay) dropHeld(s *ackSlot) {
	if s.held != nil {
		s.held.DecRef()
		s.held = nil
		a.nheld.Add(-1)
	}
}

// arm makes sure the timer will look at slot i by since+delay.
func (a *ackDelay) arm(i int, since time.Time) {
	a.tmu.Lock()
	defer a.tmu.Unlock()
	if a.dead {
		return
	}
	a.dirty = append(a.dirty, i)
	if a.armed {
		return
	}
	a.armed = true
	d := time.Until(since.Add(a.delay))
	if a.timer == nil {
		a.timer = time.AfterFunc(d, a.flush)
	} else {
		a.timer.Reset(d)
	}
}

// disarm stops the timer when no ACK is held (the usual end of a hold: a
// response carried it), sparing a wake-up that would find nothing.
func (a *ackDelay) disarm() {
	a.tmu.Lock()
	if a.armed && a.nheld.Load() == 0 {
		a.timer.Stop()
		a.armed = false
		a.dirty = a.dirty[:0]
	}
	a.tmu.Unlock()
}

// flush sends the held ACKs whose time is up, and rearms for the rest.
// They are written with their stripe locked, so that none can overtake a
// newer segment of its connection on the way to the link.
func (a *ackDelay) flush() {
	a.tmu.Lock()
	dirty := a.dirty
	a.dirty = nil
	a.armed = false
	a.tmu.Unlock()
	now := time.Now()
	var next time.Time
	var keep []int
	for _, i := range dirty {
		mu := &a.stripes[i%ackStripes]
		mu.Lock()
		s := &a.slots[i]
		if s.held == nil {
			mu.Unlock()
			continue
		}
		if due := s.since.Add(a.delay); due.After(now) {
			keep = append(keep, i)
			if next.IsZero() || due.Before(next) {
				next = due
			}
			mu.Unlock()
			continue
		}
		p := s.held
		s.held = nil
		s.lastAck = s.heldAck
		a.nheld.Add(-1)
		a.flushed.Add(1)
		var l stack.PacketBufferList
		l.PushBack(p)
		a.next.WritePackets(l)
		p.DecRef()
		mu.Unlock()
	}
	if len(keep) > 0 {
		for _, i := range keep {
			a.arm(i, next.Add(-a.delay))
		}
	}
}

// close drops every held ACK (the link is going away).
func (a *ackDelay) close() {
	a.closed.Store(true)
	a.tmu.Lock()
	a.dead = true
	if a.timer != nil {
		a.timer.Stop()
	}
	a.tmu.Unlock()
	for i := range a.slots {
		mu := &a.stripes[i%ackStripes]
		mu.Lock()
		a.dropHeld(&a.slots[i])
		mu.Unlock()
	}
}

// seqGT reports a > b in TCP sequence space (RFC 793 §3.3).
func seqGT(a, b uint32) bool { return int32(a-b) > 0 }

// seqGE reports a >= b in TCP sequence space.
func seqGE(a, b uint32) bool { return int32(a-b) >= 0 }
