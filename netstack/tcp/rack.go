package tcp

import (
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/seqnum"
)

// RACK's time-based loss detection (RFC 8985 §6), beside the order-based
// rules of sack.go (RFC 6675's DupThresh, the retransmissions overtaken,
// the tail loss probe's SACK). With SACK, every transmission is
// remembered with the time it went; each ACK finds the latest-sent of the
// transmissions it reports delivered (RACK.xmit_ts, RACK.end_seq) and the
// RTT it took (RACK.rtt), and a transmission sent before it that is still
// not delivered RACK.rtt plus the reordering window after it went is
// lost: a hole need not wait for three segments' worth of SACKs above it,
// and a lost retransmission is found like any other segment. One that is
// not due yet arms the reorder timer for when it will be.
//
// The reordering window is a quarter of the minimum RTT (at most the
// smoothed RTT); it is 0 until reordering has been seen (a segment never
// sent again delivered below the highest one delivered, or a D-SACK),
// during recovery or once DupThresh segments are SACKed. Once reordering
// has been seen, RACK alone finds the losses: DupThresh and the
// retransmissions overtaken by SACKed data (sack.go) no longer count. Each round trip with D-SACKs
// (the window was too small: a segment went again needlessly) widens it
// by another quarter of the minimum RTT, and it returns to one quarter
// after 16 recoveries without.
//
// A first transmission found lost moves RACK's loss boundary, which
// lostBelow joins to RFC 6675's: every octet not SACKed below it is lost
// (the transmissions before it in sequence went before it in time, or
// went again). A retransmission found lost lets the recovery send its
// range again, apart from RFC 6675's retransmissions, which go on from
// HighRxt. The order of transmission, not the clock, tells which of two
// transmissions went first: they may share a clock reading.

// A transmission: [start, end) sent at at.
type rackXmit struct {
	start, end seqnum.Value
	at         time.Duration
	id         uint64 // its place in the order sent
	rtx        bool   // a retransmission
	counted    bool   // a part of it was delivered and taken into RACK's state
	lost       bool   // RACK found it lost
}

// maxRackXmits bounds the transmissions remembered; beyond it the oldest
// are forgotten (the order-based rules still see them).
const maxRackXmits = 1024

// rackReoPersist is how many recoveries a widened reordering window
// lasts without a D-SACK (RFC 8985 §6.2).
const rackReoPersist = 16

type rackState struct {
	xmits  []rackXmit // in the order sent
	rtxs   int        // how many of them are retransmissions (at least)
	nextID uint64
	id     uint64 // the latest-sent delivered transmission's place

	on     bool          // a delivery has set xmitAt, end and rtt
	xmitAt time.Duration // RACK.xmit_ts
	end    seqnum.Value  // RACK.end_seq
	rtt    time.Duration // RACK.rtt
	minRTT time.Duration // the least RTT of a first transmission
	fack   seqnum.Value  // the highest end delivered
	fackOn bool

	reordered  bool // RACK.reord: reordering has been seen
	mult       int  // quarters of the minimum RTT the reordering window has beyond the first
	persist    int
	dsack      bool // this ACK carried a D-SACK
	dsackRound seqnum.Value
	roundOn    bool

	lostBelow seqnum.Value // every octet not SACKed below it is lost
	// waited is what the ACKs reported delivered while the reorder
	// timer ran outside a recovery, and the latest ACK's: the recovery
	// RACK starts takes it as its first ACK's (PRR's DeliveredData).
	waited int
	redo   []sackRange   // retransmissions found lost: to send again
	at     time.Duration // the reorder timer; 0: stopped
}

// rackSent records a transmission of n octets at seq.
func (c *Conn) rackSent(seq seqnum.Value, n int) {
	if !c.sackOK || n <= 0 {
		return
	}
	r := &c.rack
	end := seq.Add(seqnum.Size(n))
	rtx := seq.LessThan(c.sndMax)
	if rtx {
		r.forget(seq, end)
		r.rtxs++
	}
	if len(r.xmits) >= maxRackXmits {
		r.xmits = append(r.xmits[:0], r.xmits[1:]...)
	}
	r.nextID++
	r.xmits = append(r.xmits, rackXmit{start: seq, end: end, at: c.now, id: r.nextID, rtx: rtx})
}

// forget removes [start, end) from the transmissions remembered: it goes
// again.
func (r *rackState) forget(start, end seqnum.Value) {
	for i := 0; i < len(r.xmits); i++ {
		x := r.xmits[i]
		if !x.start.LessThan(end) || !start.LessThan(x.end) {
			continue
		}
		left, right := x, x
		left.end, right.start = start, end
		switch hasL, hasR := x.start.LessThan(start), end.LessThan(x.end); {
		case hasL && hasR:
			// Cut in two, in the same place in time.
			r.xmits = append(r.xmits, rackXmit{})
			copy(r.xmits[i+2:], r.xmits[i+1:])
			r.xmits[i], r.xmits[i+1] = left, right
			i++
		case hasL:
			r.xmits[i] = left
		case hasR:
			r.xmits[i] = right
		default:
			r.xmits = append(r.xmits[:i], r.xmits[i+1:]...)
			i--
		}
	}
}

// delivered reports whether none of x is left to deliver (the ACK covers
// it or it is SACKed), and whether any of it was: it is about the
// scoreboard as it stands.
func (c *Conn) rackDelivered(x *rackXmit, ack seqnum.Value) (all, some bool) {
	if x.end.LessThanEq(ack) {
		return true, true
	}
	from := x.start
	if from.LessThan(ack) {
		from = ack
	}
	h := c.holes(from, x.end)
	return h == 0, h < int(x.start.Size(x.end))
}

// rackAck takes an ACK (ack, with the scoreboard it updated; SND.UNA not
// moved yet) into RACK's state (RFC 8985 §6.2 steps 1 to 4): the latest
// transmission delivered, the RTT, reordering and the D-SACK rounds.
func (c *Conn) rackAck(ack seqnum.Value) {
	r := &c.rack
	if r.roundOn && r.dsackRound.LessThanEq(ack) {
		r.roundOn = false
	}
	if r.dsack && !r.roundOn {
		r.roundOn, r.dsackRound = true, c.sndMax
		r.mult++
		r.persist = rackReoPersist
	}
	r.dsack = false
	// Keep the sequence numbers near the window, so that none lies in
	// it again after the numbers wrapped.
	if r.lostBelow.LessThan(ack) || c.sndMax.LessThan(r.lostBelow) {
		r.lostBelow = ack
	}
	// Without SACK blocks or retransmissions in the list, the list is
	// in sequence order too: the ACK delivers a prefix of it.
	ordered := len(c.sacked) == 0 && r.rtxs == 0
	keep := r.xmits[:0]
	rtxs := 0
	for i := range r.xmits {
		x := r.xmits[i]
		if ordered && !x.start.LessThan(ack) {
			keep = append(keep, r.xmits[i:]...)
			break
		}
		all, some := c.rackDelivered(&x, ack)
		if some {
			c.rackTake(&x, ack, all)
			x.counted = true
		}
		if !all {
			keep = append(keep, x)
			if x.rtx {
				rtxs++
			}
		}
	}
	r.xmits = keep
	if !ordered {
		r.rtxs = rtxs
	}
	if r.fack.LessThan(ack) || c.sndMax.LessThan(r.fack) {
		r.fack = ack
	}
}

// rackTake updates RACK's state for a transmission the ACK reports
// (partly) delivered: the first time, its RTT and whether it was
// reordered; each time, how far it was delivered.
func (c *Conn) rackTake(x *rackXmit, ack seqnum.Value, all bool) {
	r := &c.rack
	end := x.end
	if !all {
		// Partly delivered: up to the ACK, or to the highest SACKed
		// octet in it.
		end = x.start
		if x.start.LessThan(ack) {
			end = ack
		}
		for _, s := range c.sacked {
			if x.start.LessThan(s.end) && s.start.LessThan(x.end) && end.LessThan(s.end) {
				end = s.end
				if x.end.LessThan(end) {
					end = x.end
				}
			}
		}
	}
	if x.counted {
		if r.on && r.id == x.id && r.end.LessThan(end) {
			r.end = end
		}
		return
	}
	rtt := c.now - x.at
	if x.rtx && rtt < r.minRTT {
		// Too soon for the retransmission: the original was delivered
		// (RFC 8985 §6.2 step 2).
		return
	}
	if !x.rtx && (r.minRTT == 0 || rtt < r.minRTT) {
		r.minRTT = max(rtt, granularity)
	}
	if !r.on || r.id < x.id || r.id == x.id && r.end.LessThan(end) {
		r.on, r.id, r.xmitAt, r.end, r.rtt = true, x.id, x.at, end, rtt
	}
	// Step 3: delivered below the highest delivered, never sent again:
	// the network reordered it.
	if !x.rtx && r.fackOn && end.LessThan(r.fack) {
		r.reordered = true
	}
	if !r.fackOn || r.fack.LessThan(end) {
		r.fack, r.fackOn = end, true
	}
}

// rackReoWnd is the reordering window (RFC 8985 §6.2 step 4).
func (c *Conn) rackReoWnd() time.Duration {
	r := &c.rack
	if !r.reordered && (c.inRecovery || c.sackedBytes() >= dupThresh*c.sndMSS) {
		return 0
	}
	return min(time.Duration(1+r.mult)*r.minRTT/4, c.rtt.srtt)
}

// rackDetect, on an ACK or when the reorder timer fired, marks lost the
// transmissions sent before RACK.xmit_ts that are overdue (RFC 8985 §6.2
// step 5), starts or feeds the recovery with them, and arms the reorder
// timer for the first that is not due yet.
func (c *Conn) rackDetect(timer bool) {
	r := &c.rack
	if !timer && r.at == 0 || c.inRecovery {
		r.waited = 0
	}
	r.waited += c.ackDelivered
	r.at = 0
	if !r.on || c.sndUna == c.sndMax {
		return
	}
	reo := c.rackReoWnd()
	var wait time.Duration
	lost := false
	keep := r.xmits[:0]
	for i := range r.xmits {
		x := &r.xmits[i]
		if x.id > r.id {
			// Sent after the latest delivered, as all that follow.
			keep = append(keep, r.xmits[i:]...)
			break
		}
		if x.end.LessThanEq(c.sndUna) {
			continue
		}
		keep = append(keep, *x)
		if x.lost || x.id == r.id && !x.start.LessThan(r.end) {
			continue // marked already, or not sent before the latest delivered
		}
		left := x.at + r.rtt + reo - c.now
		if left > 0 {
			wait = max(wait, left)
			continue
		}
		keep[len(keep)-1].lost = true
		lost = true
		c.n.rackLost++
		if x.rtx {
			if len(r.redo) < maxRackXmits {
				r.redo = append(r.redo, sackRange{x.start, x.end})
			}
			c.n.lostRtx++
			continue
		}
		end := x.end
		if x.id == r.id && r.end.LessThan(end) {
			end = r.end // the same transmission: only what lies below the delivered part
		}
		if r.lostBelow.LessThan(end) || r.lostBelow.LessThan(c.sndUna) {
			r.lostBelow = end
		}
	}
	r.xmits = keep
	if wait > 0 {
		r.at = c.now + wait
	}
	if !lost {
		return
	}
	switch {
	case c.inRecovery:
		c.sackRecover()
	case c.mayRecover() && c.sndUna.LessThan(c.lostBelow()):
		// The recovery takes what the ACKs delivered while RACK waited
		// for the loss to be due, the ACKs that showed it, as its first
		// ACK's: the ACK or timer that finds it due may deliver
		// nothing.
		c.ackDelivered = max(c.ackDelivered, r.waited)
		c.enterRecovery()
	}
}

// rackRedo is the next retransmission RACK found lost that is still to
// send again: where it starts and how many octets until its end or the
// next SACKed range. ok is false when there is none.
func (c *Conn) rackRedo() (seq seqnum.Value, n int, ok bool) {
	r := &c.rack
	for len(r.redo) > 0 {
		x := &r.redo[0]
		if x.start.LessThan(c.sndUna) {
			x.start = c.sndUna
		}
		// Skip what the peer has SACKed since.
		for _, s := range c.sacked {
			if s.start.LessThanEq(x.start) && x.start.LessThan(s.end) {
				x.start = s.end
			}
		}
		if !x.start.LessThan(x.end) {
			r.redo = r.redo[1:]
			continue
		}
		end := x.end
		for _, s := range c.sacked {
			if x.start.LessThan(s.start) && s.start.LessThan(end) {
				end = s.start
			}
		}
		return x.start, int(x.start.Size(end)), true
	}
	r.redo = r.redo[:0]
	return 0, 0, false
}

// rackRedone takes [seq, seq+n) off the retransmissions to send again.
func (c *Conn) rackRedone(seq seqnum.Value, n int) {
	if r := &c.rack; len(r.redo) > 0 && r.redo[0].start == seq {
		r.redo[0].start = seq.Add(seqnum.Size(n))
	}
}

// rackBoundary is RACK's loss boundary, or SND.UNA when it has none
// above it.
func (c *Conn) rackBoundary() seqnum.Value {
	b := c.rack.lostBelow
	if b.LessThan(c.sndUna) || c.sndMax.LessThan(b) {
		return c.sndUna
	}
	return b
}

// onReorderTimer runs the detection again when the reorder timer fires
// (RFC 8985 §6.3): what was not due at the latest ACK may be now. During
// a recovery PRR's window follows the pipe it leaves.
func (c *Conn) onReorderTimer() {
	c.n.reoTimeouts++
	c.ackDelivered = 0 // no ACK came
	if c.inRecovery {
		before := c.n.rackLost
		c.rackDetect(true)
		if c.n.rackLost != before && c.inRecovery {
			c.prrAck(0)
			c.sackRecover()
		}
		return
	}
	c.rackDetect(true)
}

// rackDSACK notes a D-SACK block for the reordering window's adaptation.
// It shows reordering too: a retransmission the peer already had means
// the original came late (or its ACK was lost), which is how reordering
// shows when the late segment's own delivery, taken by its
// retransmission, cannot.
func (c *Conn) rackDSACK() { c.rack.dsack, c.rack.reordered = true, true }

// rackRecovered counts a recovery's end towards the widened reordering
// window's return.
func (c *Conn) rackRecovered() {
	r := &c.rack
	if r.persist > 0 {
		r.persist--
		if r.persist == 0 {
			r.mult = 0
		}
	}
}

// rackTimeout forgets the transmissions at a retransmission timeout:
// everything goes again from SND.UNA.
func (c *Conn) rackTimeout() {
	r := &c.rack
	r.xmits = r.xmits[:0]
	r.rtxs = 0
	r.redo = r.redo[:0]
	r.lostBelow = c.sndUna
	r.at = 0
}
