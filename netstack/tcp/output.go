package tcp

import (
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/seqnum"
)

// output sends what may go now: new data and our FIN as the windows
// allow, and otherwise a pure ACK when one is due. Every segment carries
// the ACK, so data takes the place of a pending ACK.
func (c *Conn) output() {
	switch c.state {
	case Closed, SynSent, SynReceived:
		return
	case TimeWait:
		if c.ackNow {
			c.sendAck()
		}
		return
	}
	sent := false
	for c.sendOne(sendNormal) {
		sent = true
	}
	if !sent && c.ackNow {
		c.sendAck()
	}
}

// How sendOne decides.
type sendMode uint8

const (
	sendNormal sendMode = iota
	// sendForce overrides the silly window avoidance (its timeout: the
	// window update that would end it may have been lost) and a
	// record's wait for its rest.
	sendForce
	// sendProbe is a tail loss probe's new segment: one, as the peer's
	// window allows, whatever the congestion window (RFC 8985 §7.3).
	sendProbe
)

// sendOne sends the next new segment if the windows, the sender's silly
// window avoidance (RFC 9293 §3.8.6.2.1) and the records allow it.
func (c *Conn) sendOne(mode sendMode) bool {
	force := mode != sendNormal
	off := int(c.sndUna.Size(c.sndNxt))
	unsent := c.sndBuf.len() - off
	if unsent < 0 || c.finAcked {
		return false // the FIN is out
	}
	flight := off
	if c.inRecovery && c.sackOK {
		flight = c.pipe() // RFC 6675: the octets still in the network
	}
	usable := max(min(c.cwnd-flight, c.sndWnd-off), 0)
	if mode == sendProbe {
		usable = max(min(c.sndMSS, c.sndWnd-off), 0)
	}
	avail := unsent
	if c.marks.partial && !force {
		// The buffer ends inside a record, whose rest the writer
		// adds as soon as there is room: the record's start waits
		// for it rather than leave the next segment starting inside
		// it (the timer below sends it if the rest does not come).
		avail = c.marks.marked(c.sndNxt)
	}
	n := min(avail, c.maxOut(), usable)
	if mode == sendNormal && c.deferOutput(n, avail) {
		return false
	}
	fin := c.finQueued && n == unsent
	if n < avail && n < c.sndMSS {
		// Only a full segment, or one the peer's largest window would
		// take half of, is worth sending short of the rest.
		if n <= 0 || n < c.maxSndWnd/2 && !force {
			n = 0
			fin = false
		}
	}
	if n == 0 && !fin {
		if unsent > 0 && c.sndUna == c.sndNxt && c.rtoAt == 0 {
			// Nothing in flight, so no ACK is coming: the persist
			// timer probes a zero window, or overrides the avoidance.
			c.rtoAt = c.now + c.rtt.backedOff(c.backoff)
		}
		return false
	}
	seg := 0
	if n > 0 {
		n, seg = c.cut(c.sndNxt, n)
		fin = fin && n == unsent
	}
	if c.sndUna == c.sndMax {
		c.unackedSince = c.now // the first in flight
	}
	c.sendData(c.sndNxt, n, seg, fin)
	c.sndNxt = c.sndNxt.Add(seqnum.Size(n))
	if fin {
		c.sndNxt = c.sndNxt.Add(1)
		switch c.state {
		case Established:
			c.state = FinWait1
		case CloseWait:
			c.state = LastAck
		}
	}
	if c.sndMax.LessThan(c.sndNxt) {
		if !c.timing && c.backoff == 0 {
			c.timing, c.timedSeq, c.timedAt = true, c.sndNxt, c.now
		}
		c.sndMax = c.sndNxt
	}
	if c.rtoAt == 0 {
		c.rtoAt = c.now + c.rtt.backedOff(c.backoff)
	}
	c.armTLP()
	return true
}

// sendData sends n bytes of the send buffer from seq on, with our FIN
// after them when fin is set; segSize, when n is more, is the payload of
// each segment the link cuts it into.
func (c *Conn) sendData(seq seqnum.Value, n, segSize int, fin bool) {
	// The counters count segments, not packets, as Linux's do (a GSO
	// packet is as many as the link cuts it into); header counts one.
	segs := 1
	if segSize > 0 && n > segSize {
		segs = (n + segSize - 1) / segSize
	}
	c.n.segsOut += uint64(segs - 1)
	if seq.LessThan(c.sndMax) {
		c.n.retransSegs += uint64(segs)
		c.n.retrans += uint64(n)
		if c.undoOK {
			c.undoRetrans++
		}
	}
	c.prrSent(n)
	c.rackSent(seq, n)
	off := int(c.sndUna.Size(seq))
	s := c.header(seq)
	c.payload(s, off, n)
	// The MSS leaves room for the timestamps only: SACK blocks that
	// would take the segment past it are left to a pure ACK after it.
	seg := n
	if segSize > 0 {
		seg = segSize
	}
	keep := max((c.sndMSS-seg-4)/8, 0)
	later := len(s.SACK) > keep
	if later {
		s.SACK = s.SACK[:keep]
		if keep == 0 {
			s.SACK = nil
		}
	}
	if fin {
		s.Flags |= header.TCPFlagFin
	}
	if n > 0 {
		s.Flags |= header.TCPFlagPsh
	}
	if segSize > 0 && n > segSize {
		s.SegSize = segSize
	}
	c.out(s)
	if later {
		c.sendAck()
	}
}

// payload sets s's payload: n bytes of the send buffer from off on. The
// packet takes them by reference (Segment.src); Payload is their slice
// when they lie in one block, and otherwise they are joined into it
// unless the output reads the pieces.
func (c *Conn) payload(s *Segment, off, n int) {
	if n == 0 {
		return
	}
	s.src, s.srcOff, s.srcLen = &c.sndBuf, off, n
	if p, ok := c.sndBuf.contiguous(off, n); ok {
		s.Payload = p
		return
	}
	if c.cfg.piecesOut {
		return
	}
	if cap(c.joined) < n {
		c.joined = make([]byte, n)
	}
	s.Payload = c.joined[:n]
	c.sndBuf.copyOut(s.Payload, off, n)
}

// tsoDivisor is the share of the congestion window below which an output
// the window holds short of a whole GSO packet waits for more room
// (Linux's tcp_tso_win_divisor).
const tsoDivisor = 3

// deferOutput reports whether an output of n bytes, where avail are ready
// to go, waits for the next ACK (Linux's TSO deferral): the congestion
// window is what holds it short of a whole GSO packet and of what is
// ready, it is less than a third of the window, and an ACK is due soon
// (the oldest data in flight went half a smoothed RTT ago or earlier). A
// sender the window holds back otherwise answers each ACK with the
// little room it opened, and sends many small packets where a few large
// ones would do: more per-packet work, and more packets for a network
// that drops packets to drop.
func (c *Conn) deferOutput(n, avail int) bool {
	full := c.maxOut()
	if full <= c.sndMSS || n >= full || n >= avail || n >= c.cwnd/tsoDivisor ||
		c.inRecovery || c.sndUna == c.sndNxt || c.sndWnd-int(c.sndUna.Size(c.sndNxt)) <= n {
		return false
	}
	// RACK's list of transmissions (kept with SACK only) tells when the
	// oldest in flight went; without it nothing is deferred.
	for _, x := range c.rack.xmits {
		if c.sndUna.LessThan(x.end) {
			// The oldest transmission in flight: its ACK is the next.
			return c.now-x.at >= c.rtt.srtt/2
		}
	}
	return false
}

// maxOut is the most payload one output of new data carries: a segment,
// or as many whole segments as GSO takes.
func (c *Conn) maxOut() int {
	if c.cfg.GSOMax > 2*c.sndMSS {
		return c.cfg.GSOMax / c.sndMSS * c.sndMSS
	}
	return c.sndMSS
}

// retransmitHead resends the first unacknowledged segment (fast
// retransmit, a partial ACK's next hole), leaving sndNxt where it is.
func (c *Conn) retransmitHead() {
	n := c.cutLen(c.sndUna, min(c.sndBuf.len(), c.sndMSS, int(c.sndUna.Size(c.sndMax))))
	fin := c.finQueued && !c.finAcked && n == c.sndBuf.len() && c.finSeq().LessThan(c.sndMax)
	if n == 0 && !fin {
		return
	}
	if c.timing && c.sndUna.LessThan(c.timedSeq) {
		c.timing = false // Karn: no sample from a retransmitted range
	}
	c.sendData(c.sndUna, n, 0, fin)
	c.rtoAt = c.now + c.rtt.backedOff(c.backoff)
}

// onRTO handles the retransmission timer: a SYN goes again, a zero
// window is probed, and data in flight starts over from sndUna with a
// congestion window of one segment (RFC 5681 §3.1, RFC 6298 §5).
func (c *Conn) onRTO() {
	switch c.state {
	case Closed, TimeWait:
		return
	case SynSent, SynReceived:
		if c.backoff >= c.cfg.SynRetries {
			c.enterClosed(ErrTimeout)
			return
		}
		c.backoff++
		c.timing = false
		c.sendSyn()
		return
	}
	persist := c.sndWnd == 0 && c.sndUna.Size(c.sndMax) <= 1 && (c.sndBuf.len() > 0 || c.finQueued && !c.finAcked)
	if !persist && c.sndUna == c.sndMax {
		// Nothing in flight: the silly window avoidance's timeout,
		// or a stale timer.
		c.sendOne(sendForce)
		c.output()
		return
	}
	if c.retries >= c.cfg.MaxRetries || c.cfg.UserTimeout > 0 && c.now-c.unackedSince >= c.cfg.UserTimeout {
		c.reset(ErrTimeout)
		return
	}
	c.retries++
	c.backoff++
	c.timing = false
	if !persist {
		c.n.timeouts++
	}
	if persist {
		// The persist timer: a byte beyond the peer's zero window
		// makes it answer with its window (RFC 9293 §3.8.6.1). It
		// costs no congestion window, and a peer that answers keeps
		// the connection (inputAck resets the retries).
		c.probing = true
		c.probe()
		return
	}
	c.saveForUndo()
	c.ccReduce(c.inFlight())
	c.cwnd = c.sndMSS
	c.rackTimeout()
	c.inRecovery = false
	c.sacked = c.sacked[:0] // RFC 2018 §8: the peer may have dropped what it SACKed
	c.rtxs = c.rtxs[:0]
	c.floorOn = false
	c.highRxt = c.sndUna // everything goes again from here
	c.dupAcks = 0
	c.recover = c.sndMax
	c.sndNxt = c.sndUna
	c.rtoAt = c.now + c.rtt.backedOff(c.backoff)
	c.sendOne(sendForce) // the retransmission goes, whatever the avoidance says
	c.output()
	c.userDeadline()
}

// userDeadline keeps the retransmission timer from running past the user
// timeout, so that the connection ends when it says.
func (c *Conn) userDeadline() {
	if c.cfg.UserTimeout <= 0 || c.rtoAt == 0 {
		return
	}
	if at := c.unackedSince + c.cfg.UserTimeout; at < c.rtoAt {
		c.rtoAt = max(at, c.now)
	}
}

// probe sends one byte at sndUna (the persist timer's window probe).
func (c *Conn) probe() {
	if c.sndBuf.len() > 0 {
		c.sendData(c.sndUna, 1, 0, false)
		if c.sndNxt == c.sndUna {
			c.sndNxt = c.sndUna.Add(1)
			if c.sndMax.LessThan(c.sndNxt) {
				c.sndMax = c.sndNxt
			}
		}
	} else if c.finQueued && !c.finAcked {
		c.sendData(c.sndUna, 0, 0, true)
	}
	c.rtoAt = c.now + c.rtt.backedOff(c.backoff)
	c.userDeadline()
}

// sendAck sends a segment with no data: the ACK, our window, and the
// SACK blocks. Its sequence number is the highest we sent, not sndNxt
// (after a timeout sndNxt goes back to resend, and an ACK numbered
// behind what the peer has received fails its acceptability test, ACK
// and all), or the right edge of the peer's window when that is lower
// (a FIN or a window probe went beyond it).
func (c *Conn) sendAck() {
	seq := c.sndMax
	if edge := c.sndWl2.Add(seqnum.Size(c.sndWnd)); edge.LessThan(seq) && c.sndUna.LessThanEq(edge) {
		seq = edge
	}
	s := c.header(seq)
	c.out(s)
}

// header fills c.seg with the fields every segment of a synchronized
// connection carries; the pending ACK goes with it.
func (c *Conn) header(seq seqnum.Value) *Segment {
	s := &c.seg
	*s = Segment{Seq: seq, Ack: c.rcvNxt, Flags: header.TCPFlagAck, WS: -1}
	s.Window = c.windowField()
	if c.tsOK {
		s.TS, s.TSVal, s.TSEcr = true, c.tsVal(), c.tsRecent
	}
	if c.sackOK {
		s.SACK = c.sackBlocks()
	}
	c.lastAck = c.rcvNxt
	c.ackNow, c.ackSegs, c.ackAt = false, 0, 0
	c.n.segsOut++
	return s
}

// rcvWindow is the receive window the buffer has room for.
func (c *Conn) rcvWindow() int { return max(c.cfg.RcvBuf-c.rcvBuf.len(), 0) }

// windowField is the window to advertise, scaled for the header. The
// right edge never moves back (RFC 9293 §3.8.6.2.2's SWS avoidance: it
// moves on only by a segment or half the buffer at a time).
func (c *Conn) windowField() uint16 {
	free := min(c.rcvWindow(), 0xffff<<c.rcvShift)
	edge := c.rcvNxt.Add(seqnum.Size(free))
	if c.rcvAdvEnd.LessThan(edge) && int(c.rcvAdvEnd.Size(edge)) >= min(c.cfg.MSS, c.cfg.RcvBuf/2) {
		c.rcvAdvEnd = edge
	}
	adv := 0
	if c.rcvNxt.LessThan(c.rcvAdvEnd) {
		adv = int(c.rcvNxt.Size(c.rcvAdvEnd))
	}
	// Rounded up to the scale's unit, so that the edge the peer sees is
	// never left of one it saw before (at most a unit beyond the buffer).
	unit := 1 << c.rcvShift
	field := min((adv+unit-1)>>c.rcvShift, 0xffff)
	if e := c.rcvNxt.Add(seqnum.Size(field << c.rcvShift)); c.rcvAdvEnd.LessThan(e) {
		c.rcvAdvEnd = e
	}
	return uint16(field)
}

// sackBlocks is the SACK option's blocks (RFC 2018 §4): a D-SACK block
// first when a duplicate came (RFC 2883), then the run holding the latest
// out-of-order segment, then the others from the highest down.
func (c *Conn) sackBlocks() []header.SACKBlock {
	room := maxSACKBlocks
	if c.tsOK {
		room = 3
	}
	b := c.sackOut[:0]
	if c.hasDSACK {
		b = append(b, c.dsack)
		c.hasDSACK = false
		c.n.dsacksOut++
	}
	latest := -1
	for i := range c.ooo {
		if c.ooo[i].seq.LessThanEq(c.lastOOO) && c.lastOOO.LessThan(c.ooo[i].end()) {
			latest = i
			b = append(b, header.SACKBlock{Start: c.ooo[i].seq, End: c.ooo[i].end()})
			break
		}
	}
	for i := len(c.ooo) - 1; i >= 0 && len(b) < room; i-- {
		if i != latest {
			b = append(b, header.SACKBlock{Start: c.ooo[i].seq, End: c.ooo[i].end()})
		}
	}
	if len(b) == 0 {
		return nil
	}
	return b[:min(len(b), room)]
}
