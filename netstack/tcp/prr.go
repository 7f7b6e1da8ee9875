package tcp

// Proportional Rate Reduction (RFC 6937), the congestion window during
// SACK recovery. Rather than cut the window to ssthresh at once (and send
// nothing until pipe has drained below it) or inflate it per duplicate
// ACK, PRR spreads the reduction over the recovery's round trip: while
// pipe is above ssthresh, each ACK lets out ssthresh/RecoverFS of what it
// reports delivered, so that the window arrives at ssthresh as the
// recovery ends; once pipe is below ssthresh (more was lost than the
// reduction asks for), slow-start reduction bound (PRR-SSRB) lets it
// grow back towards ssthresh by at most one segment more than was
// delivered per ACK.

type prrState struct {
	delivered int // prr_delivered: octets the peer reported received since the recovery began
	out       int // prr_out: octets sent since the recovery began
	recoverFS int // RecoverFS: the flight when the recovery began
}

// prrStart begins a recovery's reduction (RFC 6937 §3.1's
// initialization); ssthresh is set already.
func (c *Conn) prrStart() {
	c.prr = prrState{recoverFS: max(int(c.sndUna.Size(c.sndMax)), 1)}
}

// prrAck sets the congestion window for an ACK during the recovery that
// reported delivered octets received (RFC 6937 §3.1's per-ACK step):
// cwnd = pipe + sndcnt, so that RFC 6675's transmission rule, which
// sends while cwnd − pipe allows a segment, sends sndcnt.
func (c *Conn) prrAck(delivered int) {
	p := &c.prr
	p.delivered += max(delivered, 0)
	pipe := c.pipe()
	var sndcnt int
	if pipe > c.ssthresh {
		// Proportional: ceil(prr_delivered·ssthresh/RecoverFS) − prr_out.
		n := int64(p.delivered)*int64(c.ssthresh) + int64(p.recoverFS) - 1
		sndcnt = int(n/int64(p.recoverFS)) - p.out
	} else {
		// PRR-SSRB.
		limit := max(p.delivered-p.out, delivered) + c.sndMSS
		sndcnt = min(c.ssthresh-pipe, limit)
	}
	if p.out == 0 {
		// The fast retransmit goes on the ACK that starts the
		// recovery, whatever the proportion allows.
		sndcnt = max(sndcnt, c.sndMSS)
	}
	c.cwnd = pipe + max(sndcnt, 0)
}

// prrSent counts octets sent during a recovery (prr_out).
func (c *Conn) prrSent(n int) {
	if c.inRecovery && c.sackOK {
		c.prr.out += n
	}
}
