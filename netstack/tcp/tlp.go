package tcp

import (
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/seqnum"
)

// Tail loss probes (RFC 8985 §7). A loss among the last segments of a
// burst leaves too few segments behind it for duplicate ACKs or the SACK
// scoreboard to show it, and would wait for the retransmission timer
// (Config.MinRTO at least). Instead, two smoothed RTTs after the latest
// transmission without an ACK, the connection sends one probe: a new
// segment if it has one the windows allow, the last segment sent
// otherwise. The probe's ACK either repairs the tail (the lost segment
// was the last) or, SACKing the probe, starts the recovery.

// tlpDelAck is added to the probe timeout when a single segment is in
// flight (RFC 8985 §7.2's WCDelAckT): its ACK may be a delayed one.
const tlpDelAck = 40 * time.Millisecond

// armTLP sets the probe timer after a transmission, when a probe may go:
// SACK agreed, an RTT measured, no recovery under way, data in flight,
// and no probe outstanding.
func (c *Conn) armTLP() {
	if !c.sackOK || !c.rtt.sampled || c.inRecovery || c.tlpOut || c.sndUna == c.sndMax || c.backoff > 0 ||
		c.state != Established && c.state != CloseWait && c.state != FinWait1 && c.state != LastAck {
		c.tlpAt = 0
		return
	}
	pto := 2 * c.rtt.srtt
	if int(c.sndUna.Size(c.sndMax)) <= c.sndMSS {
		pto += tlpDelAck
	}
	pto = max(pto, granularity)
	at := c.now + pto
	if c.rtoAt != 0 && c.rtoAt <= at {
		c.tlpAt = 0 // the retransmission timer comes first
		return
	}
	c.tlpAt = at
}

// onTLP sends the probe (RFC 8985 §7.3).
func (c *Conn) onTLP() {
	if c.inRecovery || c.sndUna == c.sndMax || c.tlpOut {
		return
	}
	c.tlpOut, c.tlpHigh = true, c.sndMax
	c.n.tlps++
	c.tlpSeq = c.sndNxt
	if c.sendOne(sendProbe) {
		c.tlpHigh = c.sndMax
	} else {
		// No new data: the last segment sent goes again.
		sent := min(int(c.sndUna.Size(c.sndMax)), c.sndBuf.len()) // data bytes in flight
		n := min(c.sndMSS, sent)
		fin := c.finQueued && !c.finAcked && c.finSeq().LessThan(c.sndMax)
		seq := c.sndUna.Add(seqnum.Size(sent - n))
		if q := &c.marks; q.len() > 0 {
			// From the first record that starts in it.
			if i := q.after(seq.Add(^seqnum.Size(0))); i < len(q.m) && q.m[i].LessThan(c.sndMax) && q.m[i] != seq {
				n -= int(seq.Size(q.m[i]))
				seq = q.m[i]
			}
		}
		if fin || n > 0 {
			c.tlpSeq = seq
			c.sendData(seq, n, 0, fin)
		}
	}
	c.rtoAt = c.now + c.rtt.backedOff(c.backoff)
}

// tlpAcked ends an outstanding probe once the ACK covers what it probed.
func (c *Conn) tlpAcked(ack seqnum.Value) {
	if c.tlpOut && c.tlpHigh.LessThanEq(ack) {
		c.tlpOut = false
	}
}

// probeShowsLoss reports whether the outstanding probe's data has been
// SACKed above a hole that starts at SND.UNA.
func (c *Conn) probeShowsLoss() bool {
	return c.tlpOut && c.sndUna.LessThan(c.tlpSeq) && len(c.sacked) > 0 &&
		c.tlpSeq.LessThan(c.sacked[len(c.sacked)-1].end) && c.holes(c.sndUna, c.tlpSeq) > 0
}
