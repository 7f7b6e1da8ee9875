package tcp

import (
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/seqnum"
)

// The sender's SACK scoreboard and RFC 6675's loss recovery.
//
// The scoreboard holds the ranges above SND.UNA the peer has reported
// received, merged and in order. Blocks that are not about data in flight
// (below SND.UNA, beyond SND.MAX, empty or inverted) are ignored, D-SACK
// blocks (RFC 2883) are recognized and not taken as new, and the board
// keeps at most maxSACKRanges ranges, so a peer that lies in its SACK
// blocks costs bounded memory and can at worst make the sender retransmit
// what it already had.

// dupThresh is RFC 6675's DupThresh.
const dupThresh = 3

// maxSACKRanges bounds the scoreboard; beyond it the highest ranges are
// dropped (they are reported again while they stay above a hole).
const maxSACKRanges = 64

type sackRange struct{ start, end seqnum.Value }

// takeSACK updates the scoreboard from a segment's SACK blocks, after
// dropping what ack now covers. It reports whether the first block was a
// D-SACK: a duplicate the peer received.
func (c *Conn) takeSACK(ack seqnum.Value, blocks []header.SACKBlock) (dsack bool) {
	c.sackPrune(ack)
	// An ACK the network delayed behind a later one acknowledges less
	// than SND.UNA: its blocks below SND.UNA are stale, not in flight.
	floor := ack
	if floor.LessThan(c.sndUna) {
		floor = c.sndUna
	}
	for i, b := range blocks {
		if !b.Start.LessThan(b.End) {
			continue
		}
		if i == 0 && (b.Start.LessThan(ack) || len(blocks) > 1 && blocks[1].Contains(b)) {
			dsack = true // RFC 2883 §4: below the ACK, or inside the next block
			c.n.dsacksIn++
			c.rackDSACK()
			c.dsackFor(b)
			continue
		}
		if b.Start.LessThan(floor) || c.sndMax.LessThan(b.End) {
			continue // not about data in flight: a lie or a stale block
		}
		c.sackAdd(b.Start, b.End)
	}
	return dsack
}

// sackAdd merges [start, end) into the board.
func (c *Conn) sackAdd(start, end seqnum.Value) {
	sb := c.sacked
	i := 0
	for i < len(sb) && sb[i].end.LessThan(start) {
		i++
	}
	j := i
	for j < len(sb) && sb[j].start.LessThanEq(end) {
		if sb[j].start.LessThan(start) {
			start = sb[j].start
		}
		if end.LessThan(sb[j].end) {
			end = sb[j].end
		}
		j++
	}
	if i == j {
		sb = append(sb, sackRange{})
		copy(sb[i+1:], sb[i:])
		sb[i] = sackRange{start, end}
	} else {
		sb[i] = sackRange{start, end}
		sb = append(sb[:i+1], sb[j:]...)
	}
	if len(sb) > maxSACKRanges {
		sb = sb[:maxSACKRanges]
	}
	c.sacked = sb
}

// sackPrune drops what lies below ack.
func (c *Conn) sackPrune(ack seqnum.Value) {
	sb := c.sacked
	k := 0
	for k < len(sb) && sb[k].end.LessThanEq(ack) {
		k++
	}
	sb = sb[k:]
	if len(sb) > 0 && sb[0].start.LessThan(ack) {
		sb[0].start = ack
	}
	if len(sb) == 0 {
		sb = c.sacked[:0]
	}
	c.sacked = sb
}

// sackedBytes is how many bytes the board holds.
func (c *Conn) sackedBytes() int {
	n := 0
	for _, r := range c.sacked {
		n += int(r.start.Size(r.end))
	}
	return n
}

// lostBelow is RFC 6675's IsLost boundary: every octet not SACKed below
// it has more than (DupThresh-1)·SMSS octets SACKed above it, and is
// lost. sndUna when none is.
func (c *Conn) lostBelow() seqnum.Value {
	b := c.sndUna
	if !c.rack.reordered {
		// Once the network has been seen to reorder, losses are
		// found by time (RACK), not by how much came after them.
		b = c.lostBelowSACK()
	}
	if r := c.rackBoundary(); b.LessThan(r) {
		b = r
	}
	if c.floorOn && c.inRecovery && b.LessThan(c.lostFloor) && c.lostFloor.LessThanEq(c.sndMax) {
		return c.lostFloor
	}
	return b
}

// lostBelowSACK is lostBelow by the SACKed octets alone.
func (c *Conn) lostBelowSACK() seqnum.Value {
	above := 0
	limit := (dupThresh - 1) * c.sndMSS
	for i := len(c.sacked) - 1; i >= 0; i-- {
		r := c.sacked[i]
		n := int(r.start.Size(r.end))
		if above+n > limit {
			// The boundary lies in this range: octets below the point
			// with limit+1 octets SACKed above it are lost.
			return r.end - seqnum.Value(limit-above+1)
		}
		above += n
	}
	return c.sndUna
}

// holes is how many octets in [from, to) are not SACKed.
func (c *Conn) holes(from, to seqnum.Value) int {
	if !from.LessThan(to) {
		return 0
	}
	n := int(from.Size(to))
	for _, r := range c.sacked {
		s, e := r.start, r.end
		if s.LessThan(from) {
			s = from
		}
		if to.LessThan(e) {
			e = to
		}
		if s.LessThan(e) {
			n -= int(s.Size(e))
		}
	}
	return n
}

// pipe is RFC 6675's estimate of the octets in the network: the holes not
// deemed lost, plus those retransmitted (below highRxt).
func (c *Conn) pipe() int {
	lost := c.lostBelow()
	rxt := c.rxtFrom()
	return c.holes(c.sndUna, c.sndMax) - c.holes(c.sndUna, lost) + c.holes(c.sndUna, rxt)
}

// nextLost is where the next retransmission of RFC 6675's NextSeg rule 1
// starts: the first octet at or above highRxt that is lost and not SACKed,
// and how many octets of the hole it opens follow it (the hole's end, a
// segment's start, where the loss boundary need not be). ok is false when
// there is none.
func (c *Conn) nextLost() (seq seqnum.Value, n int, ok bool) {
	lost := c.lostBelow()
	at := c.rxtFrom()
	for _, r := range c.sacked {
		if !at.LessThan(lost) {
			return 0, 0, false
		}
		if at.LessThan(r.start) {
			return at, int(at.Size(r.start)), true
		}
		if at.LessThan(r.end) {
			at = r.end
		}
	}
	return 0, 0, false
}

// sackRecover runs RFC 6675's transmission rule during recovery: while
// the congestion window has room beyond pipe, retransmit the next lost
// segment, or else send new data.
func (c *Conn) sackRecover() {
	for i := 0; i < 1000; i++ { // bounded: each pass sends a segment
		if c.cwnd-c.pipe() < c.sndMSS {
			return
		}
		seq, n, redo := c.rackRedo() // a retransmission RACK found lost
		ok := redo
		if !ok {
			seq, n, ok = c.nextLost()
		}
		if ok {
			n = c.cutLen(seq, min(n, c.sndMSS, c.sndBuf.len()-int(c.sndUna.Size(seq))))
			if n <= 0 {
				return
			}
			if c.timing && seq.LessThan(c.timedSeq) {
				c.timing = false // Karn
			}
			c.sendData(seq, n, 0, false)
			if redo {
				c.rackRedone(seq, n)
			} else {
				c.highRxt = seq.Add(seqnum.Size(n))
			}
			c.noteRetransmit(seq, seq.Add(seqnum.Size(n)))
			c.rtoAt = c.now + c.rtt.backedOff(c.backoff)
			continue
		}
		if !c.sendOne(sendNormal) {
			return
		}
	}
}

// A retransmission during SACK recovery, and the highest sequence number
// sent when it went: data sent after it that the peer SACKs well beyond
// that point shows it lost too (RACK's ordering argument, RFC 8985 §3.2,
// by transmission order instead of time). RFC 6675 alone retransmits a
// hole once per recovery, and a lost retransmission then waits for the
// retransmission timer.
type rtxRec struct{ start, end, after seqnum.Value }

// maxRtxRecs bounds the retransmissions remembered.
const maxRtxRecs = 128

func (c *Conn) noteRetransmit(start, end seqnum.Value) {
	if len(c.rtxs) == maxRtxRecs {
		copy(c.rtxs, c.rtxs[1:])
		c.rtxs = c.rtxs[:maxRtxRecs-1]
	}
	c.rtxs = append(c.rtxs, rtxRec{start, end, c.sndMax})
}

// lostRetransmits finds the retransmissions that data sent after them
// has overtaken by more than (DupThresh-1)·SMSS SACKed octets and lets
// the recovery send them again (highRxt goes back to the first).
func (c *Conn) lostRetransmits() {
	if len(c.rtxs) == 0 || len(c.sacked) == 0 || c.rack.reordered {
		return // with reordering seen, RACK finds them by time
	}
	high := c.sacked[len(c.sacked)-1].end
	keep := c.rtxs[:0]
	for _, r := range c.rtxs {
		switch {
		case r.end.LessThanEq(c.sndUna) || c.holes(r.start, r.end) == 0:
			// Arrived.
		case r.after.Add(seqnum.Size((dupThresh - 1) * c.sndMSS)).LessThan(high):
			c.highRxt = c.rxtFrom()
			if r.start.LessThan(c.highRxt) {
				c.highRxt = r.start
			}
			if c.highRxt.LessThan(c.sndUna) {
				c.highRxt = c.sndUna
			}
			c.n.lostRtx++
		default:
			keep = append(keep, r)
		}
	}
	c.rtxs = keep
}
