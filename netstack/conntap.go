package netstack

import (
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// Connection segment taps: a connection's received TCP segments, handed to
// its owner before TCP reassembles them, each placed in the connection's
// receive stream. This is what lets DDP place out-of-order payload.
//
//  1. EnableConnTaps turns on the taps in the NIC's link endpoint (the
//     stack's own wrapper of the configured link, tapLink). From then on
//     they see every inbound TCP segment before IP and TCP do, without a
//     copy of the packet (stack-wide).
//  2. It remembers the initial sequence number the peer chose in each SYN
//     and SYN-ACK it sees, which is how a stream offset is later told from
//     a sequence number (TCP's own RCV.NXT is not exported).
//  3. Conn.TapSegments installs a handler for one connection: from then on
//     the connection's segments are looked up by their 4-tuple, checked
//     (flags, TCP checksum unless the link verified it, the part that lies
//     between what the application has read and the receive buffer's end),
//     and handed over with their stream offset.

// ConnTapStats count what a connection's segment tap refused before its
// handler saw it.
type ConnTapStats struct {
	BadChecksum atomic.Uint64 // TCP checksum wrong
	OutOfWindow atomic.Uint64 // no byte between the read point and the receive buffer's end
	BadFlags    atomic.Uint64 // SYN or RST set, or no ACK
}

// connKey names a connection from this stack's side.
type connKey struct{ local, remote netip.AddrPort }

// connTaps are the connection taps behind EnableConnTaps (tapLink calls them).
type connTaps struct {
	mu   sync.Mutex
	isn  map[connKey]uint32 // the peer's ISN, from its SYN or SYN-ACK
	taps sync.Map           // connKey -> *connTap
}

// maxISNs bounds the remembered ISNs: a SYN flood may not grow the map
// without bound; the oldest entries are then simply forgotten (a tap on
// such a connection fails with ErrNoISN).
const maxISNs = 1 << 16

type connTap struct {
	mu     sync.Mutex // one segment at a time: senders may run concurrently
	c      *Conn
	isn    uint32 // peer's ISN: sequence number isn+1 is stream byte 0
	origin uint64 // bytes read when the tap was installed
	fn     func(off uint64, payload [][]byte, retain func() Kept)
	stats  *ConnTapStats
	views  [][]byte
	cur    *stack.PacketBuffer // the packet being handed over (mu)
	retain func() Kept         // ct.keep, made once
	// removed is set when the tap is removed: a link's cache of it
	// (tapCache) then looks the connection up again.
	removed atomic.Bool
}

// Kept is a segment's packet memory kept past its tap's call (see
// TapSegmentsRetain) until Release. Its zero value keeps nothing.
//
// It holds references to the memory chunks the payload views lie in, not
// to the packet: TCP, which gets the same packet after the tap, trims the
// packet's own buffer as the reader takes the payload, and a pull-up of
// headers across views moves the packet onto a new chunk; either lets the
// chunks go back to the pool, where the next packets overwrite them,
// however long the packet itself is kept. Chunks are only written while
// not shared, so a reference to them keeps the views' bytes as they were.
type Kept struct{ buf buffer.Buffer }

// Release lets the memory go; the payload views it kept are invalid after
// it. It is called once.
func (k Kept) Release() { k.buf.Release() }

// keep retains the memory of the packet being handed over: a clone of its
// buffer, which takes a reference to each chunk and copies no bytes (its
// views come from a pool, so a handler may keep every segment).
func (ct *connTap) keep() Kept { return Kept{ct.cur.ToBuffer()} }

// ErrNoISN reports a connection whose peer's initial sequence number was
// never seen: connection taps were enabled after it was made.
var ErrNoISN = errors.New("netstack: the connection's initial sequence number was not seen (enable connection taps before connecting)")

// EnableConnTaps makes the stack watch TCP segments for Conn.TapSegments.
// Connections made before it cannot be tapped. It is idempotent. On
// rdmatap's TCP, which hands a tap its segments itself, it does nothing.
func (s *Stack) EnableConnTaps() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctaps != nil || s.own != nil {
		return
	}
	t := &connTaps{isn: make(map[connKey]uint32)}
	s.ctaps = t
	s.nic.taps.Store(t)
}

// tapCache remembers the tap of the last data segment a link handed over,
// by the segment's raw addresses and ports: a link carries mostly one
// connection's segments at a time, and the lookup by connKey (two
// netip.AddrPorts, hashed through an interface) costs more than the rest
// of a segment's look.
type tapCache struct {
	src, dst     tcpip.Address
	sport, dport uint16
	ct           *connTap
}

// segment handles one inbound TCP segment (tapLink.inspect). It runs on
// the link's delivery goroutine, before IP and TCP see the packet. cache
// is the link's own.
func (t *connTaps) segment(seg *tapSegment, pkt *stack.PacketBuffer, views [][]byte, cache *tapCache) {
	th := seg.th
	flags := th.Flags()
	if flags&header.TCPFlagSyn != 0 {
		k := connKey{
			local:  netip.AddrPortFrom(fromTCPIPAddr(seg.dst), th.DestinationPort()),
			remote: netip.AddrPortFrom(fromTCPIPAddr(seg.src), th.SourcePort()),
		}
		if flags&header.TCPFlagRst == 0 && seg.valid(views) {
			t.mu.Lock()
			if len(t.isn) >= maxISNs {
				for old := range t.isn {
					delete(t.isn, old)
					break
				}
			}
			t.isn[k] = th.SequenceNumber()
			t.mu.Unlock()
		}
		return
	}
	if seg.size == 0 {
		return
	}
	sport, dport := th.SourcePort(), th.DestinationPort()
	ct := cache.ct
	if ct == nil || ct.removed.Load() || cache.sport != sport || cache.dport != dport || cache.src != seg.src || cache.dst != seg.dst {
		k := connKey{
			local:  netip.AddrPortFrom(fromTCPIPAddr(seg.dst), dport),
			remote: netip.AddrPortFrom(fromTCPIPAddr(seg.src), sport),
		}
		v, ok := t.taps.Load(k)
		if !ok {
			return
		}
		ct = v.(*connTap)
		*cache = tapCache{src: seg.src, dst: seg.dst, sport: sport, dport: dport, ct: ct}
	}
	ct.mu.Lock()
	defer ct.mu.Unlock()
	if flags&header.TCPFlagRst != 0 || flags&header.TCPFlagAck == 0 {
		ct.stats.BadFlags.Add(1)
		return
	}
	if !seg.valid(views) {
		ct.stats.BadChecksum.Add(1)
		return
	}
	ct.deliver(th.SequenceNumber(), seg.size, pkt, views)
}

// deliver hands the part of the segment TCP may still take to the handler.
// The views are the packet's own memory (no copy), valid during the call.
func (ct *connTap) deliver(seq uint32, n int, pkt *stack.PacketBuffer, views [][]byte) {
	size := int64(n)
	read := ct.c.readBytes.Load()
	// The sequence number of the next byte the application reads.
	next := ct.isn + 1 + uint32(read)
	delta := int64(int32(seq - next))
	skip := int64(0)
	if delta < 0 {
		skip = -delta // already read: TCP has it
	}
	limit := ct.c.rcvBufMax()
	if skip >= size || delta >= limit {
		ct.stats.OutOfWindow.Add(1)
		return
	}
	ct.views = append(ct.views[:0], views...)
	payload := trimViews(ct.views, int(skip), int(min(size, limit-delta)))
	ct.cur = pkt
	ct.fn(read-ct.origin+uint64(delta+skip), payload, ct.retain)
	ct.cur = nil
	clear(ct.views)
}

// trimViews returns the bytes [from, to) of the concatenated views,
// re-slicing them in place.
func trimViews(vs [][]byte, from, to int) [][]byte {
	out := vs[:0]
	pos := 0
	for _, v := range vs {
		start, end := pos, pos+len(v)
		pos = end
		if end <= from || start >= to {
			continue
		}
		out = append(out, v[max(from-start, 0):min(to, end)-start])
	}
	return out
}

// rcvBufMax bounds how far beyond what the application has read TCP can
// take a segment: its window never exceeds the receive buffer (twice it,
// for the out-of-order queue and auto-tuning between two reads; rdmatap's
// TCP keeps nothing beyond its buffer).
func (c *Conn) rcvBufMax() int64 {
	if c.own != nil {
		return int64(c.own.RcvBuf())
	}
	return c.ep.SocketOptions().GetReceiveBufferSize() * 2
}

// TapSegments calls fn with every received segment of the connection that
// TCP may still take, before TCP does: out-of-order, duplicate and
// retransmitted segments included. off is the offset of the payload's
// first byte in the receive stream, counted from the next byte the
// application reads at the time of the call (so a reader that installs
// the tap between two reads knows where it stands). Bytes already read are
// trimmed off; segments with a bad TCP checksum (unless the link verified
// it), SYN or RST set, or lying wholly beyond the receive buffer are
// refused and counted in stats. A segment that passes may still be dropped
// by TCP (a full receive queue, an advertised window smaller than the
// buffer): the stream remains the authority on what the bytes are.
//
// fn runs on the link's delivery goroutine: it must be fast, must not block
// on the stack, and must not retain payload (it points into packet memory).
// The returned function removes the tap; it is idempotent.
//
// On rdmatap's TCP the tap needs no link wrapper (EnableConnTaps): the
// transport hands the handler its segments itself, checksum verified.
func (c *Conn) TapSegments(fn func(off uint64, payload [][]byte), stats *ConnTapStats) (remove func(), err error) {
	return c.TapSegmentsRetain(func(off uint64, payload [][]byte, _ func() Kept) { fn(off, payload) }, stats)
}

// TapSegmentsRetain is TapSegments for a handler that may keep a segment's
// payload past its call: retain, called during the call, keeps the
// packet's memory (the payload views stay valid) until the Kept it
// returns is released.
func (c *Conn) TapSegmentsRetain(fn func(off uint64, payload [][]byte, retain func() Kept), stats *ConnTapStats) (remove func(), err error) {
	if c.own != nil {
		return c.tapOwn(fn, stats)
	}
	s := c.s
	s.mu.Lock()
	t := s.ctaps
	s.mu.Unlock()
	if t == nil {
		return nil, errConfig("connection taps are not enabled on this stack (EnableConnTaps)")
	}
	k := connKey{local: c.LocalAddr(), remote: c.RemoteAddr()}
	t.mu.Lock()
	isn, ok := t.isn[k]
	delete(t.isn, k)
	t.mu.Unlock()
	if !ok {
		return nil, ErrNoISN
	}
	ct := newConnTap(c, isn, fn, stats)
	t.taps.Store(k, ct)
	return ct.remover(func() { t.taps.CompareAndDelete(k, ct) }), nil
}

// newConnTap is a tap on c whose stream starts after the peer's ISN isn,
// from the bytes c has read so far.
func newConnTap(c *Conn, isn uint32, fn func(off uint64, payload [][]byte, retain func() Kept), stats *ConnTapStats) *connTap {
	if stats == nil {
		stats = new(ConnTapStats)
	}
	ct := &connTap{c: c, isn: isn, origin: c.readBytes.Load(), fn: fn, stats: stats}
	ct.retain = ct.keep
	return ct
}

// remover is the tap's idempotent remove function: it marks the tap
// removed and then uninstalls it.
func (ct *connTap) remover(uninstall func()) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			ct.removed.Store(true)
			uninstall()
		})
	}
}
