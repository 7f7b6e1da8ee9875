package netstack

import (
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/seqnum"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// Repair of lost GSO packets at the link.
//
// With a GSO link, gVisor's TCP sends up to ~45 full-sized segments as one
// packet, and a network that drops packets drops all of them at once.
// gVisor recovers such a hole badly (docs/tcp-recovery.md): RACK marks
// the lost segment lost, but the recovery retransmits one MSS of it per
// ACK, and while the peer has SACKed less than two segments above the
// hole the pipe estimate counts every segment of the hole as in flight,
// so a hole larger than the congestion window left in recovery waits for
// the retransmission timeout (200 ms at least), then for the next.
//
// The NIC's link, through which every packet passes, repairs such holes
// itself, as a TSO sender does: it keeps a reference to each GSO data
// packet its stack sends (the packet's memory is the stack's own segment,
// shared, not copied) until the peer acknowledges it. When an ACK from the
// peer carries a SACK block above a kept packet that it does not cover —
// data sent after the packet arrived, the packet did not — the link sends
// the packet again, whole, once. The stack's own recovery goes on as
// before; where it retransmits the same data the peer reports a duplicate
// (D-SACK), which gVisor takes as a spurious recovery. A packet
// retransmitted by the stack itself (its sequence number below what the
// link already saw sent) is not kept. A tail probe (probe) covers a lost
// packet with nothing after it, and lost ACKs.
//
// The resent packet is the original, headers included: its timestamp is
// no newer than any the peer has taken as recent for in-order data (the
// packet fills the hole below everything the peer received after it), so
// PAWS passes it; its acknowledgment number and window are old, which the
// peer ignores for an acknowledgment and takes for the window until the
// next segment.
//
// Only packets the link finishes (host GSO with the transport checksum
// left to the link: NeedsCsum) are kept: their checksum does not depend
// on anything but their own bytes.

const (
	// repairKeep bounds the packets kept per connection.
	repairKeep = 128
	// repairConns bounds the connections tracked per link.
	repairConns = 4096
	// repairResends bounds how often one packet is sent again.
	repairResends = 2
	// repairMinGap is the least time between two resends of a packet,
	// besides twice the connection's smoothed round trip.
	repairMinGap = time.Millisecond
	// probeSlack is what the tail probe waits besides two round trips;
	// probeTick is how often it looks while packets are kept.
	probeSlack = 2 * time.Millisecond
	probeTick  = time.Millisecond
)

// RepairStats count what the link's repair of lost GSO packets did.
type RepairStats struct {
	Resent      uint64 // packets sent again
	ResentBytes uint64 // their payload bytes
}

type keptPkt struct {
	pkt      *stack.PacketBuffer
	seq, end uint32
	at       time.Duration // when sent (since repairEpoch)
	resent   int
	resentAt time.Duration
}

type repairConn struct {
	kept  []keptPkt // in sequence (= sending) order
	high  uint32    // the highest end sent
	known bool      // high is valid
	srtt  time.Duration
	// heard is when the peer's last ACK came (since repairEpoch).
	heard time.Duration
}

type repairer struct {
	write func(stack.PacketBufferList) (int, tcpip.Error)
	off   bool // Config.NoLinkRepair
	dead  bool // closed (mu)

	mu    sync.Mutex
	conns map[ackKey]*repairConn // keyed by the outbound direction
	n     atomic.Int32           // len(conns)

	resent, resentBytes atomic.Uint64

	// The tail probe's timer (tmu): armed while packets are kept.
	tmu   sync.Mutex
	timer *time.Timer
	armed bool
}

var repairEpoch = time.Now()

func newRepairer(write func(stack.PacketBufferList) (int, tcpip.Error)) *repairer {
	return &repairer{write: write, conns: make(map[ackKey]*repairConn)}
}

func (r *repairer) stats() RepairStats {
	return RepairStats{Resent: r.resent.Load(), ResentBytes: r.resentBytes.Load()}
}

// outbound keeps the GSO data packets of pkts, which the stack sends.
func (r *repairer) outbound(pkts stack.PacketBufferList) {
	if r.off {
		return
	}
	for _, pkt := range pkts.AsSlice() {
		g := &pkt.GSOOptions
		if !g.NeedsCsum || (g.Type != stack.GSOTCPv4 && g.Type != stack.GSOTCPv6) {
			if r.n.Load() > 0 && pkt.Data().Size() == 0 {
				// A reset ends the connection: what it kept goes.
				if k, th, ok := tcpOf(pkt); ok && th.Flags()&header.TCPFlagRst != 0 {
					r.forget(k)
				}
			}
			continue
		}
		size := pkt.Data().Size()
		if size == 0 {
			continue
		}
		k, th, ok := tcpOf(pkt)
		if !ok || th.Flags()&(header.TCPFlagSyn|header.TCPFlagRst) != 0 {
			continue
		}
		seq := th.SequenceNumber()
		end := seq + uint32(size)
		now := time.Since(repairEpoch)
		r.mu.Lock()
		if r.dead {
			r.mu.Unlock()
			return
		}
		c := r.conns[k]
		if c == nil {
			if len(r.conns) >= repairConns {
				r.sweepLocked()
			}
			if len(r.conns) >= repairConns {
				r.mu.Unlock()
				continue
			}
			c = &repairConn{}
			r.conns[k] = c
			r.n.Store(int32(len(r.conns)))
		}
		if c.known && !seqGT(end, c.high) {
			// A retransmission by the stack: not kept.
			r.mu.Unlock()
			continue
		}
		if c.known && seqGT(c.high, seq) {
			// Overlaps what was sent (a partial retransmission): keep
			// only packets that start where the last one ended.
			c.high = end
			r.mu.Unlock()
			continue
		}
		c.high, c.known = end, true
		if len(c.kept) == repairKeep {
			c.kept[0].pkt.DecRef()
			c.kept = append(c.kept[:0], c.kept[1:]...)
		}
		c.kept = append(c.kept, keptPkt{pkt: pkt.IncRef(), seq: seq, end: end, at: now})
		r.mu.Unlock()
		r.arm()
	}
}

// arm starts the tail probe's timer unless it runs.
func (r *repairer) arm() {
	r.tmu.Lock()
	if !r.armed {
		r.armed = true
		if r.timer == nil {
			r.timer = time.AfterFunc(probeTick, r.probe)
		} else {
			r.timer.Reset(probeTick)
		}
	}
	r.tmu.Unlock()
}

// probe sends again the oldest packet of each connection whose newest
// kept packet is overdue and whose peer has been silent as long: a lost
// tail (nothing sent after it, so no SACK tells) or lost ACKs. gVisor's
// own tail-loss probe waits two smoothed round trips of its millisecond
// clock, and 200 ms more when one segment is outstanding (RFC 8985's
// allowance for a delayed ACK); the link's round trip is measured in
// nanoseconds. The resent packet makes the peer acknowledge what it has.
func (r *repairer) probe() {
	now := time.Since(repairEpoch)
	var resend []*stack.PacketBuffer
	more := false
	r.mu.Lock()
	if r.dead {
		r.mu.Unlock()
		return
	}
	for _, c := range r.conns {
		if len(c.kept) == 0 {
			continue
		}
		more = true
		wait := 2*c.srtt + probeSlack
		last := &c.kept[len(c.kept)-1]
		if now-last.at < wait || now-c.heard < wait {
			continue
		}
		p := &c.kept[0]
		if p.resent >= repairResends || (p.resent > 0 && now-p.resentAt < 2*wait) {
			continue
		}
		p.resent++
		p.resentAt = now
		resend = append(resend, p.pkt.IncRef())
	}
	r.mu.Unlock()
	r.tmu.Lock()
	if more {
		r.timer.Reset(probeTick)
	} else {
		r.armed = false
	}
	r.tmu.Unlock()
	r.send(resend)
}

// send writes packets taken for resending and releases them.
func (r *repairer) send(resend []*stack.PacketBuffer) {
	if len(resend) == 0 {
		return
	}
	var l stack.PacketBufferList
	for _, p := range resend {
		l.PushBack(p)
		r.resentBytes.Add(uint64(p.Data().Size()))
	}
	r.resent.Add(uint64(len(resend)))
	r.write(l)
	l.Reset()
}

// inbound looks at a packet from the peer (views: its IP packet) before
// the stack does: acknowledged packets are released, and packets a SACK
// block shows lost are sent again.
func (r *repairer) inbound(proto tcpip.NetworkProtocolNumber, views [][]byte) {
	if r.n.Load() == 0 {
		return
	}
	var hb [header.IPv6MinimumSize + 60]byte
	hdr := headBytes(hb[:min(len(hb), headersLen(proto, views))], views)
	var k ackKey
	var ipLen int
	switch proto {
	case ipv4.ProtocolNumber:
		h := header.IPv4(hdr)
		if len(hdr) < header.IPv4MinimumSize || h.Protocol() != uint8(header.TCPProtocolNumber) || h.More() || h.FragmentOffset() != 0 {
			return
		}
		ipLen = int(h.HeaderLength())
		k.src, k.dst = h.DestinationAddress(), h.SourceAddress()
	case ipv6.ProtocolNumber:
		h := header.IPv6(hdr)
		if len(hdr) < header.IPv6MinimumSize || h.TransportProtocol() != header.TCPProtocolNumber {
			return
		}
		ipLen = header.IPv6MinimumSize
		k.src, k.dst = h.DestinationAddress(), h.SourceAddress()
	default:
		return
	}
	if ipLen < header.IPv4MinimumSize || len(hdr) < ipLen+header.TCPMinimumSize {
		return
	}
	th := header.TCP(hdr[ipLen:])
	off := int(th.DataOffset())
	if off < header.TCPMinimumSize || len(th) < off {
		return
	}
	th = th[:off]
	flags := th.Flags()
	k.sport, k.dport = th.DestinationPort(), th.SourcePort()
	if flags&(header.TCPFlagRst|header.TCPFlagSyn) != 0 {
		r.forget(k)
		return
	}
	if flags&header.TCPFlagAck == 0 {
		return
	}
	ack := th.AckNumber()
	var blocks [4]header.SACKBlock
	sacks := blocks[:0]
	if off > header.TCPMinimumSize+12 {
		sacks = parseSACK(th, sacks)
	}
	now := time.Since(repairEpoch)

	var resend []*stack.PacketBuffer
	r.mu.Lock()
	c := r.conns[k]
	if c == nil {
		r.mu.Unlock()
		return
	}
	c.heard = now
	// Release what the peer acknowledged.
	i := 0
	for ; i < len(c.kept) && !seqGT(c.kept[i].end, ack); i++ {
		p := &c.kept[i]
		if p.resent == 0 {
			rtt := now - p.at
			if c.srtt == 0 {
				c.srtt = rtt
			} else {
				c.srtt += (rtt - c.srtt) / 8
			}
		}
		p.pkt.DecRef()
		p.pkt = nil
	}
	if i > 0 {
		n := copy(c.kept, c.kept[i:])
		clear(c.kept[n:])
		c.kept = c.kept[:n]
	}
	gap := 2*c.srtt + repairMinGap
	if len(c.kept) > 0 {
		// An acknowledgment inside a packet: a GSO packet arrives whole,
		// so only a retransmission of its first part (a tail-loss probe)
		// got there. Once the packet is overdue, the rest goes again.
		p := &c.kept[0]
		if seqGT(ack, p.seq) && now-p.at >= gap && p.resent < repairResends && (p.resent == 0 || now-p.resentAt >= gap) {
			p.resent++
			p.resentAt = now
			resend = append(resend, p.pkt.IncRef())
		}
	}
	if len(sacks) > 0 {
		// The highest SACKed sequence: data sent up to there after any
		// packet below it.
		var high uint32
		for j, b := range sacks {
			if j == 0 || seqGT(uint32(b.End), high) {
				high = uint32(b.End)
			}
		}
		for j := range c.kept {
			p := &c.kept[j]
			if !seqGT(high, p.end) {
				break // nothing sent after p arrived
			}
			if !seqGE(p.seq, ack) || covered(sacks, p.seq, p.end) || !sackedAbove(sacks, p.end) {
				continue
			}
			if p.resent >= repairResends || (p.resent > 0 && now-p.resentAt < gap) {
				continue
			}
			p.resent++
			p.resentAt = now
			resend = append(resend, p.pkt.IncRef())
		}
	}
	r.mu.Unlock()
	r.send(resend)
}

// covered reports whether one SACK block covers [seq, end).
func covered(sacks []header.SACKBlock, seq, end uint32) bool {
	for _, b := range sacks {
		if seqGE(seq, uint32(b.Start)) && seqGE(uint32(b.End), end) {
			return true
		}
	}
	return false
}

// sackedAbove reports whether a SACK block starts at or above end: data
// sent after the packet ending there arrived.
func sackedAbove(sacks []header.SACKBlock, end uint32) bool {
	for _, b := range sacks {
		if seqGE(uint32(b.Start), end) {
			return true
		}
	}
	return false
}

// parseSACK appends the SACK blocks th carries to blocks.
func parseSACK(th header.TCP, blocks []header.SACKBlock) []header.SACKBlock {
	opts := th[header.TCPMinimumSize:]
	for i := 0; i < len(opts); {
		switch opts[i] {
		case header.TCPOptionEOL:
			return blocks
		case header.TCPOptionNOP:
			i++
			continue
		}
		if i+1 >= len(opts) || opts[i+1] < 2 || i+int(opts[i+1]) > len(opts) {
			return blocks
		}
		if opts[i] == header.TCPOptionSACK {
			b := opts[i+2 : i+int(opts[i+1])]
			for j := 0; j+8 <= len(b) && len(blocks) < cap(blocks); j += 8 {
				start := uint32(b[j])<<24 | uint32(b[j+1])<<16 | uint32(b[j+2])<<8 | uint32(b[j+3])
				end := uint32(b[j+4])<<24 | uint32(b[j+5])<<16 | uint32(b[j+6])<<8 | uint32(b[j+7])
				blocks = append(blocks, header.SACKBlock{Start: seqnum.Value(start), End: seqnum.Value(end)})
			}
			return blocks
		}
		i += int(opts[i+1])
	}
	return blocks
}

// forget drops a connection's kept packets (it was reset or restarts).
func (r *repairer) forget(k ackKey) {
	r.mu.Lock()
	if c := r.conns[k]; c != nil {
		for _, p := range c.kept {
			p.pkt.DecRef()
		}
		delete(r.conns, k)
		r.n.Store(int32(len(r.conns)))
	}
	r.mu.Unlock()
}

// sweepLocked drops the connections with nothing kept.
func (r *repairer) sweepLocked() {
	for k, c := range r.conns {
		if len(c.kept) == 0 {
			delete(r.conns, k)
		}
	}
	r.n.Store(int32(len(r.conns)))
}

// close releases everything kept.
func (r *repairer) close() {
	r.tmu.Lock()
	if r.timer != nil {
		r.timer.Stop()
	}
	r.tmu.Unlock()
	r.mu.Lock()
	r.dead = true
	for k, c := range r.conns {
		for _, p := range c.kept {
			p.pkt.DecRef()
		}
		delete(r.conns, k)
	}
	r.n.Store(0)
	r.mu.Unlock()
}
