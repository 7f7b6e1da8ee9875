package tcp

import (
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// Undo of spurious window reductions, with D-SACK (RFC 2883 §5, as Linux
// does it; RFC 3708 describes the detection): a fast retransmit or a
// timeout on a path that only reordered or delayed segments sends again
// what the peer already had, and the peer reports each such duplicate in
// a D-SACK block. Once every retransmission of a reduction has come back
// as a duplicate, nothing was lost: the congestion window and threshold
// return to what they were before it (RFC 4015's response, without its
// timestamp detection).

// saveForUndo remembers the windows before a reduction and starts
// counting its retransmissions.
func (c *Conn) saveForUndo() {
	if !c.sackOK {
		return
	}
	if !c.undoOK || c.undoRetrans > 0 || c.undoEnd.LessThan(c.sndUna) || c.stale(c.undoEnd) {
		// A new episode (one still open keeps the windows from before
		// its first reduction).
		c.priorCwnd, c.priorSsthresh = c.cwnd, c.ssthresh
		c.priorCubic = c.cb
		c.undoRetrans = 0
	}
	if c.undoRetrans == 0 {
		c.undoStart = c.sndUna
	}
	c.undoOK = true
	c.undoEnd = c.sndMax
}

// dsackFor takes a D-SACK block: a duplicate of data the episode
// retransmitted is one retransmission the peer did not need.
func (c *Conn) dsackFor(b header.SACKBlock) {
	if !c.undoOK || c.undoRetrans == 0 || b.Start.LessThan(c.undoStart) || !b.Start.LessThan(c.undoEnd) || c.stale(c.undoEnd) {
		return
	}
	c.undoRetrans--
	if c.undoRetrans > 0 {
		return
	}
	// Every retransmission was a duplicate: undo.
	c.undoOK = false
	c.n.undos++
	c.cwnd = max(c.cwnd, c.priorCwnd)
	c.ssthresh = max(c.ssthresh, c.priorSsthresh)
	c.cb = c.priorCubic // Cubic's W_max, K and epoch too (RFC 9438 §4.9)
	c.inRecovery = false
	c.dupAcks = 0
}
