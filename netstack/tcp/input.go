package tcp

import (
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/seqnum"
)

// Input processes one segment of the connection's (RFC 9293 §3.10.7),
// with RFC 5961's defenses against blind RST, SYN and data injection and
// RFC 7323's PAWS. It answers with what the segment calls for: an ACK,
// data the windows now allow, a challenge ACK, a RST. The segment's
// memory stays the caller's: Input copies the payload it keeps, but for
// the large pieces of a segment Protocol received, whose packet's chunks
// it keeps a reference to (recvQueue).
func (c *Conn) Input(s *Segment, now time.Duration) {
	c.now = now
	switch c.state {
	case Closed:
		return
	case SynSent:
		c.inputSynSent(s)
		c.output()
		c.armKeepalive()
		return
	}
	// Segments, not packets (Linux's segs_in): a large packet the link
	// took whole counts as the segments of our MSS it holds.
	c.n.segsIn += uint64(max(1, (s.PayloadLen()+c.cfg.MSS-1)/max(c.cfg.MSS, 1)))
	// Any segment shows the peer is there (keepalive).
	c.lastRecv, c.kaProbes, c.kaAt = now, 0, 0
	defer c.armKeepalive()
	rst := s.has(header.TCPFlagRst)
	if s.has(header.TCPFlagSyn) && s.Seq == c.irs && !rst {
		if c.state == SynReceived && !s.has(header.TCPFlagAck) {
			// The peer's SYN again: our SYN-ACK was lost.
			c.resendSyn()
			return
		}
		// The SYN of a SYN-ACK that crossed ours (simultaneous open),
		// or one sent again: its sequence number is behind us. What
		// follows it is processed as the segment it would be without
		// it (RFC 9293 §3.10.7.4: only the new part of a segment).
		t := *s
		t.Flags &^= header.TCPFlagSyn
		t.Seq = t.Seq.Add(1)
		s = &t
	}

	// PAWS (RFC 7323 §5.3): a segment whose timestamp is older than the
	// latest one in order is an old duplicate.
	if c.tsOK && s.TS && !rst && int32(s.TSVal-c.tsRecent) < 0 {
		c.ackOOW(s)
		return
	}
	// The sequence number check (§3.10.7.4, first).
	if !c.acceptable(s) {

		if !rst {
			if c.state == TimeWait && s.has(header.TCPFlagFin) {
				// The peer's FIN again: our ACK of it was lost.
				// Acknowledge it and wait 2·MSL from now.
				c.twAt = now + c.cfg.TimeWait
			}
			if s.PayloadLen() > 0 && s.Seq.Add(s.Len()).LessThanEq(c.rcvNxt) {
				c.noteDup(s.Seq, s.Seq.Add(seqnum.Size(s.PayloadLen())))
			}
			c.ackOOW(s)
		}
		return
	}
	if c.tsOK && s.TS && s.Seq.LessThanEq(c.lastAck) {
		c.tsRecent = s.TSVal // RFC 7323 §4.3
	}
	// RST (second): only one at exactly rcvNxt resets; one elsewhere in
	// the window gets a challenge ACK (RFC 5961 §3.2).
	if rst {
		switch {
		case c.state == TimeWait:
			// RFC 1337: TIME-WAIT ignores RSTs.
		case s.Seq == c.rcvNxt:
			err := ErrReset
			if c.state == SynReceived && !c.synAcked {
				err = ErrRefused
			}
			c.enterClosed(err)
		default:
			c.ackOOW(s) // the challenge ACK
		}
		return
	}
	// SYN (fourth). A SYN-RECEIVED connection that sees the peer's SYN
	// again lost its SYN-ACK: it resends it. Any other SYN here gets a
	// challenge ACK (RFC 5961 §4.2).
	if s.has(header.TCPFlagSyn) {
		c.ackOOW(s) // the challenge ACK
		return
	}
	// ACK (fifth).
	if !s.has(header.TCPFlagAck) {
		return
	}
	if c.state == SynReceived {
		if !c.sndUna.LessThan(s.Ack) || c.sndMax.LessThan(s.Ack) {
			c.seg = Segment{Seq: s.Ack, Flags: header.TCPFlagRst, WS: -1}
			c.out(&c.seg)
			return
		}
		c.established()
		c.sndWl1, c.sndWl2 = s.Seq, s.Ack
		c.sndWnd = int(s.Window) << c.sndShift
		c.maxSndWnd = max(c.maxSndWnd, c.sndWnd)
	}
	if !c.inputAck(s) {
		return
	}
	// Segment text (seventh) and FIN (eighth).
	if s.PayloadLen() > 0 {
		switch c.state {
		case Established, FinWait1, FinWait2:
			c.receive(s, now)
		default:
			// After the peer's FIN nothing more may come: ignore it.
		}
	}
	if s.has(header.TCPFlagFin) {
		at := s.Seq.Add(seqnum.Size(s.PayloadLen()))
		switch {
		case c.state == TimeWait:
			// The peer resent its FIN: our ACK was lost. Acknowledge
			// again and restart the 2·MSL wait.
			c.twAt = c.now + c.cfg.TimeWait
			c.ackNow = true
		case c.finRcvd:
			c.ackNow = true
		case at.InWindow(c.rcvNxt, c.rcvNxt.Size(c.rcvAdvEnd)+1):
			c.finPending, c.finAt = true, at
		}
	}
	c.takeFin()
	c.output()
}

// oowAckInterval is the least time between two ACKs that answer
// unacceptable segments without data, or challenge ACKs: two ends that
// each find the other's segments out of their window (one sent beyond a
// window the other shrank, say) would otherwise answer each other's ACKs
// for ever, and a blind attacker could make a connection send as many
// ACKs as it sends segments (RFC 5961 §7). Linux waits 500 ms too.
const oowAckInterval = 500 * time.Millisecond

// ackOOW answers a segment the connection does not take with an ACK of
// where it stands: at once for one with data (a retransmission the ACK
// was lost for, whose sender needs to hear), at most once per
// oowAckInterval otherwise (challenge ACKs to a SYN or RST included).
func (c *Conn) ackOOW(s *Segment) {
	if s.PayloadLen() == 0 || s.has(header.TCPFlagSyn) || s.has(header.TCPFlagRst) {
		c.challengeACK()
		return
	}
	c.ackNow = true
	c.output()
}

// challengeACK sends an ACK of where the connection stands, at most once
// per oowAckInterval: the answer to a segment it discards whose sender
// may be blind (RFC 5961 §7), an ACK of data never sent or one too old
// to be real among them.
func (c *Conn) challengeACK() {
	if c.oowAcked && c.now-c.lastOOWAck < oowAckInterval {
		return
	}
	c.oowAcked, c.lastOOWAck = true, c.now
	c.ackNow = true
	c.output()
}

// acceptable is RFC 9293's segment acceptability test (§3.10.7.4, its
// four cases) against the window we advertised: a segment is taken when
// its first or its last octet lies in the window; one without data when
// it lies in the window or at its right edge.
func (c *Conn) acceptable(s *Segment) bool {
	wnd := seqnum.Size(0)
	if c.rcvNxt.LessThan(c.rcvAdvEnd) {
		wnd = c.rcvNxt.Size(c.rcvAdvEnd)
	}
	n := s.Len()
	switch {
	case n == 0 && wnd == 0:
		return s.Seq == c.rcvNxt
	case n == 0:
		// Up to the right edge itself, as Linux takes it: the ACK of a
		// sender whose whole window is in flight (and lost) is numbered
		// at the edge, and its ACK must get through.
		return s.Seq.InWindow(c.rcvNxt, wnd+1)
	case wnd == 0:
		return false
	}
	return s.Seq.InWindow(c.rcvNxt, wnd) || s.Seq.Add(n-1).InWindow(c.rcvNxt, wnd)
}

// inputSynSent handles a segment in SYN-SENT (RFC 9293 §3.10.7.3).
func (c *Conn) inputSynSent(s *Segment) {
	ack := s.has(header.TCPFlagAck)
	if ack && (s.Ack.LessThanEq(c.iss) || c.sndMax.LessThan(s.Ack)) {
		if !s.has(header.TCPFlagRst) {
			c.seg = Segment{Seq: s.Ack, Flags: header.TCPFlagRst, WS: -1}
			c.out(&c.seg)
		}
		return
	}
	if s.has(header.TCPFlagRst) {
		if ack {
			c.enterClosed(ErrRefused)
		}
		return
	}
	if !s.has(header.TCPFlagSyn) {
		return
	}
	c.takeSyn(s)
	if !ack {
		// Simultaneous open: both SYNs crossed. Our SYN-ACK follows.
		c.state = SynReceived
		c.sndWnd = int(s.Window)
		c.resendSyn()
		return
	}
	c.sndWl1, c.sndWl2 = s.Seq, s.Ack
	c.ackSynOf(s.Ack)
	c.established()
	c.ackNow = true
}

// resendSyn sends the SYN-ACK again (its timer keeps running).
func (c *Conn) resendSyn() {
	c.sendSyn()
}

// ackSynOf takes the ACK of our SYN.
func (c *Conn) ackSynOf(ack seqnum.Value) {
	c.sndUna = ack
	c.synAcked = true
	if c.timing && !c.timedSeq.LessThanEq(c.iss) && c.timedSeq.LessThanEq(ack) && c.backoff == 0 {
		c.rtt.sample(c.now - c.timedAt)
	}
	c.timing = false
	c.backoff = 0
	c.rtoAt = 0
}

func (c *Conn) established() {
	c.state = Established
	if !c.synAcked {
		c.ackSynOf(c.iss.Add(1))
	}
}

// inputAck processes a segment's acknowledgment field; false drops the
// segment (an ACK of data never sent, RFC 5961 §5.2).
func (c *Conn) inputAck(s *Segment) bool {
	ack := s.Ack
	if c.sndMax.LessThan(ack) {
		c.challengeACK()
		return false
	}
	if c.maxSndWnd > 0 && ack.LessThan(c.sndUna-seqnum.Value(c.maxSndWnd)) {
		c.challengeACK() // RFC 5961 §5.2: too old to be real
		return false
	}
	wnd := int(s.Window) << c.sndShift
	if c.probing {
		c.retries = 0 // the peer answers the window probes
		c.unackedSince = c.now
		if wnd > 0 {
			c.probing = false
			if ack == c.sndUna && c.sndMax == c.sndUna.Add(1) {
				// The probe's byte was refused: it goes again, in
				// order, with the rest.
				c.sndNxt = c.sndUna
			}
		}
	}
	newSACK := false
	c.ackDelivered = 0
	if c.sackOK {
		before := c.sackedBytes()
		c.takeSACK(ack, s.SACK)
		after := c.sackedBytes()
		newSACK = after > before
		// RFC 6937's DeliveredData: the change in SND.UNA and in the
		// octets SACKed above it.
		c.ackDelivered = after - before
		if c.sndUna.LessThan(ack) {
			c.ackDelivered += int(c.sndUna.Size(ack))
		}
		// Never below 0: the scoreboard may forget ranges (it keeps
		// at most maxSACKRanges) that the peer still holds.
		c.ackDelivered = max(c.ackDelivered, 0)
		c.rackAck(ack)
	}
	if c.sndUna.LessThan(ack) {
		c.newAck(ack)
		if c.sackOK && !c.inRecovery && c.mayRecover() && c.sndUna.LessThan(c.lostBelow()) {
			c.enterRecovery() // RFC 6675 §5: IsLost(HighACK+1)
		}
	} else if ack == c.sndUna && s.PayloadLen() == 0 && !s.has(header.TCPFlagFin) &&
		wnd == c.sndWnd && wnd > 0 && !c.probing && c.sndUna != c.sndMax && (newSACK || !c.sackOK) {
		// A duplicate ACK (RFC 5681 §2); the answers to window probes
		// are not, and with SACK only one that SACKs new data is (RFC
		// 6675 §2: an ACK for a duplicate segment, with its D-SACK
		// block, says nothing was lost).
		c.dupAck()
	}
	if c.sackOK && !c.inRecovery && c.mayRecover() && c.probeShowsLoss() {
		// The tail loss probe arrived (SACKed, or reported twice in
		// a D-SACK when it resent what had come) and what was sent
		// before it, two round trips earlier, did not: that is lost
		// (RFC 8985 §7.4's conclusion, which RACK draws by time).
		c.lostFloor, c.floorOn = c.tlpSeq, true
		c.enterRecovery()
	}
	if c.sackOK {
		c.rackDetect(false)
	}
	// The window update (RFC 9293 §3.10.7.4, fifth, ESTABLISHED).
	if c.sndWl1.LessThan(s.Seq) || c.sndWl1 == s.Seq && c.sndWl2.LessThanEq(ack) {
		c.sndWnd = wnd
		c.maxSndWnd = max(c.maxSndWnd, wnd)
		c.sndWl1, c.sndWl2 = s.Seq, ack
	}
	return c.state != Closed
}

// finSeq is the sequence number of our FIN, once Close queued one.
func (c *Conn) finSeq() seqnum.Value { return c.sndUna.Add(seqnum.Size(c.sndBuf.len())) }

// newAck takes an acknowledgment that moves sndUna forward.
func (c *Conn) newAck(ack seqnum.Value) {
	acked := int(c.sndUna.Size(ack))
	finAcked := false
	if c.finQueued && !c.finAcked && c.finSeq().LessThan(ack) {
		finAcked = true
		c.finAcked = true
		acked-- // the FIN's sequence number is no byte of the buffer
	}
	c.sndBuf.drop(acked)
	c.sndUna = ack
	c.marks.ack(ack)
	c.n.bytesAcked += uint64(acked)
	if c.sndNxt.LessThan(ack) {
		c.sndNxt = ack
	}
	if c.timing && c.timedSeq.LessThanEq(ack) {
		c.rtt.sample(c.now - c.timedAt)
		c.timing = false
	}
	c.backoff, c.retries = 0, 0
	c.unackedSince = c.now
	c.tlpAcked(ack)
	c.congestionOnAck(ack, acked)
	if c.sndUna == c.sndMax {
		c.rtoAt = 0
	} else {
		c.rtoAt = c.now + c.rtt.rto
	}
	c.armTLP()
	if finAcked {
		switch c.state {
		case FinWait1:
			c.state = FinWait2
		case Closing:
			c.enterTimeWait()
		case LastAck:
			c.enterClosed(nil)
		}
	}
}

// congestionOnAck grows the congestion window for newly acknowledged
// data, or steps NewReno's recovery (RFC 6582) on a partial ACK.
func (c *Conn) congestionOnAck(ack seqnum.Value, acked int) {
	c.dupAcks = 0
	if c.inRecovery && c.sackOK {
		if c.recover.LessThanEq(ack) {
			c.inRecovery = false
			c.rtxs = c.rtxs[:0]
			c.floorOn = false
			c.cwnd = c.ssthresh // RFC 6937: the recovery ends at ssthresh
			c.ccRecovered()
			c.rackRecovered()
		} else {
			c.lostRetransmits()
			c.prrAck(c.ackDelivered)
			c.sackRecover()
		}
		return
	}
	if c.inRecovery {
		if c.recover.LessThanEq(ack) {
			// A full ACK ends the recovery.
			c.inRecovery = false
			c.cwnd = min(c.ssthresh, max(c.inFlight(), c.sndMSS)+c.sndMSS)
			c.ccRecovered()
			return
		}
		// A partial ACK: the next hole is lost too.
		c.retransmitHead()
		c.cwnd = max(c.cwnd-acked+c.sndMSS, c.sndMSS)
		return
	}
	if c.cwnd < c.ssthresh {
		c.cwnd += min(acked, 2*c.sndMSS) // slow start, RFC 3465's L = 2
	} else {
		c.ccAvoid(acked)
	}
}

// dupAck counts a duplicate ACK; the third starts fast retransmit (with
// SACK, RFC 6675's recovery, which also starts once the scoreboard shows
// the first octet in flight lost).
func (c *Conn) dupAck() {
	c.dupAcks++
	if c.sackOK {
		switch {
		case c.inRecovery:
			c.lostRetransmits()
			c.prrAck(c.ackDelivered)
			c.sackRecover()
		case c.mayRecover() && (c.dupAcks >= dupThresh && !c.rack.reordered || c.sndUna.LessThan(c.lostBelow())):
			c.enterRecovery()

		}
		return
	}
	switch {
	case c.inRecovery:
		// Each duplicate: a segment has left the network. No more can
		// leave than were in flight when the recovery began; duplicates
		// beyond those are a peer's lies, and inflate nothing.
		if c.cwnd < c.ssthresh+c.renoFlight {
			c.cwnd += c.sndMSS
		}
	case c.dupAcks == 3 && (c.recover.LessThan(c.sndUna) || c.stale(c.recover)):
		c.saveForUndo()
		c.renoFlight = c.inFlight()
		c.ccReduce(c.inFlight())
		c.recover = c.sndMax
		c.inRecovery = true
		c.n.recoveries++
		c.retransmitHead()
		c.cwnd = c.ssthresh + 3*c.sndMSS
	}
}

// mayRecover reports whether a SACK recovery may start: SND.UNA has
// reached the previous one's recovery point, the end of what was in
// flight when it began (RFC 6675 §5's HighACK > RecoveryPoint, with
// RecoveryPoint the last octet sent, where recover is the one after it),
// so that the loss is of data sent since.
func (c *Conn) mayRecover() bool { return !c.sndUna.LessThan(c.recover) || c.stale(c.recover) }

// stale reports whether a mark set at SND.MAX or below lies beyond SND.MAX
// in sequence space: it was set 2^31 octets or more before SND.UNA (a
// connection that moved that much since, a second or two at the rates a
// TAP carries), and only reads as ahead.
func (c *Conn) stale(mark seqnum.Value) bool { return c.sndMax.LessThan(mark) }

// rxtFrom is HighRxt, or SND.UNA when that is stale or behind SND.UNA.
func (c *Conn) rxtFrom() seqnum.Value {
	if c.highRxt.LessThan(c.sndUna) || c.stale(c.highRxt) {
		return c.sndUna
	}
	return c.highRxt
}

func (c *Conn) inFlight() int { return int(c.sndUna.Size(c.sndNxt)) }

// enterRecovery starts RFC 6675's loss recovery: the congestion control
// sets ssthresh, PRR takes the window there over the recovery, and the
// lost segments go again as it allows.
func (c *Conn) enterRecovery() {
	c.saveForUndo()
	c.ccReduce(int(c.sndUna.Size(c.sndMax)))
	c.prrStart()
	c.recover = c.sndMax
	// What the previous recovery retransmitted above SND.UNA is still
	// on its way: it does not go again.
	c.highRxt = c.rxtFrom()
	c.inRecovery = true
	c.n.recoveries++
	c.prrAck(c.ackDelivered)
	c.sackRecover()
}

// receive takes in-window payload: in order into the receive buffer
// (with what it lets follow from the out-of-order queue), beyond rcvNxt
// into the queue. Duplicates are reported back with D-SACK (RFC 2883).
func (c *Conn) receive(s *Segment, now time.Duration) {
	// The new bytes: n of the payload from off on.
	seq, off, n := s.Seq, 0, s.PayloadLen()
	end := seq.Add(seqnum.Size(n))
	if seq.LessThan(c.rcvNxt) {
		// Part old, part new: no D-SACK block (RFC 2883 allows one for
		// the old part), so that the sender counts as needless only
		// the retransmissions that brought nothing (undo.go).
		off = int(seq.Size(c.rcvNxt))
		n -= off
		seq = c.rcvNxt
	}
	if c.rcvAdvEnd.LessThan(end) {
		n = int(seq.Size(c.rcvAdvEnd))
		end = c.rcvAdvEnd
		c.ackNow = true // what lay beyond the window is gone: say where it is
	}
	if n <= 0 {
		return
	}
	if seq != c.rcvNxt {
		c.insertOOO(seq, s.payloadBytes()[off:off+n])
		c.ackNow = true
		return
	}
	before := c.rcvNxt
	s.keepTo(&c.rcvBuf, off, n)
	c.rcvNxt = end
	filled := false
	for len(c.ooo) > 0 && c.ooo[0].seq.LessThanEq(c.rcvNxt) {
		o := c.ooo[0]
		if c.rcvNxt.LessThan(o.end()) {
			c.rcvBuf.write(o.data[o.seq.Size(c.rcvNxt):])
			c.rcvNxt = o.end()
		}
		c.oooBytes -= len(o.data)
		c.ooo = c.ooo[1:]
		filled = true
	}
	if len(c.ooo) == 0 {
		c.ooo = nil
	}
	got := int(before.Size(c.rcvNxt))
	c.n.bytesRcvd += uint64(got)
	c.ackSegs++
	switch {
	case filled || c.ackSegs >= 2 || c.cfg.AckDelay < 0:
		c.ackNow = true // RFC 9293 §3.8.6.3, RFC 5681 §4.2
	case got >= 2*c.cfg.MSS:
		// A large frame (GRO) holds more than the two full-sized
		// segments an ACK may wait behind (RFC 5681 §4.2). It waits
		// only for the next frame, which a bulk sender has on the way
		// already: one ACK for two frames. A sender the congestion
		// window holds back waits for this ACK to send more.
		if at := now + min(c.cfg.AckDelay, gsoAckDelay); c.ackAt == 0 || at < c.ackAt {
			c.ackAt = at
		}
	case c.ackAt == 0:
		c.ackAt = now + c.cfg.AckDelay
	}
}

// gsoAckDelay is how long the ACK of a received frame of two full-sized
// segments or more waits for the next frame: about two frames' time at
// the rates a TAP carries (a 64 KiB frame every 15-30 µs).
const gsoAckDelay = 50 * time.Microsecond

// insertOOO adds a segment beyond rcvNxt to the out-of-order queue,
// keeping the queue's runs apart: what the queue holds already is a
// duplicate (D-SACK), the rest is copied in and adjacent runs merge.
func (c *Conn) insertOOO(seq seqnum.Value, data []byte) {
	end := seq.Add(seqnum.Size(len(data)))
	c.lastOOO = seq
	// Find the first run that ends at or after seq.
	i := 0
	for i < len(c.ooo) && c.ooo[i].end().LessThan(seq) {
		i++
	}
	// The common case, data that continues a run past its end into no
	// other: it is appended to the run, not copied again with it.
	if i < len(c.ooo) {
		if o := &c.ooo[i]; o.seq.LessThanEq(seq) && o.end().LessThan(end) &&
			(i+1 == len(c.ooo) || end.LessThan(c.ooo[i+1].seq)) {
			tail := data[seq.Size(o.end()):]
			o.data = append(o.data, tail...)
			c.oooBytes += len(tail)
			return
		}
	}
	// Merge with every run that touches [seq, end).
	j := i
	start, stop := seq, end
	for j < len(c.ooo) && c.ooo[j].seq.LessThanEq(end) {
		o := &c.ooo[j]
		if o.seq.LessThanEq(seq) && end.LessThanEq(o.end()) {
			c.noteDup(seq, end) // wholly held already
			return
		}
		if o.seq.LessThan(start) {
			start = o.seq
		}
		if stop.LessThan(o.end()) {
			stop = o.end()
		}
		j++
	}
	merged := make([]byte, start.Size(stop))
	for _, o := range c.ooo[i:j] {
		copy(merged[start.Size(o.seq):], o.data)
		c.oooBytes -= len(o.data)
	}
	copy(merged[start.Size(seq):], data)
	c.oooBytes += len(merged)
	run := oooSeg{seq: start, data: merged}
	c.ooo = append(c.ooo[:i], append([]oooSeg{run}, c.ooo[j:]...)...)
}

// noteDup records a duplicate range for the next ACK's D-SACK block.
func (c *Conn) noteDup(start, end seqnum.Value) {
	if c.sackOK && start.LessThan(end) {
		c.dsack = header.SACKBlock{Start: start, End: end}
		c.hasDSACK = true
	}
}

// takeFin processes the peer's FIN once every byte before it is here.
func (c *Conn) takeFin() {
	if !c.finPending || c.finAt != c.rcvNxt || c.finRcvd {
		return
	}
	c.finPending = false
	c.finRcvd = true
	c.rcvNxt = c.rcvNxt.Add(1)

	c.ackNow = true
	switch c.state {
	case SynReceived, Established:
		c.state = CloseWait
	case FinWait1:
		// Our FIN not acknowledged yet (newAck would have moved on).
		c.state = Closing
	case FinWait2:
		c.enterTimeWait()
	}
}
