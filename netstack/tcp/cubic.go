package tcp

import (
	"math"
	"time"
)

// Congestion control: Cubic (RFC 9438), the default, or Reno (RFC 5681)
// when Config.CongestionControl says "reno". Both share slow start
// (RFC 3465's byte counting) and the recovery's window (PRR, prr.go);
// they differ in the reduction a congestion event makes and in how the
// window grows in congestion avoidance.
//
// Cubic keeps its window in segments, as the RFC writes it. A congestion
// event remembers the window it happened at, W_max (less, with fast
// convergence, when the window had not regrown to the previous W_max), and
// reduces to β_cubic = 0.7 of the window in use. Congestion avoidance then
// follows W_cubic(t) = C·(t−K)³ + W_max, with C = 0.4, t the time since
// the epoch began (the end of the recovery, or the first ACK in
// congestion avoidance after slow start) and K the time it takes to
// regrow to W_max; each ACK moves the window towards W_cubic one RTT
// ahead, at most half the window per RTT. Beside it runs W_est, the
// window Reno would have (RFC 9438 §4.3), grown by α_cubic per window of
// ACKed data, and the window is never below it. At the microsecond RTTs
// of a LAN, Reno's growth of a segment per RTT is far faster than the
// cubic function's, whose time unit is the second: there the window is
// W_est's.

// The congestion controls Config.CongestionControl names.
const (
	CCCubic = "cubic"
	CCReno  = "reno"
)

// RFC 9438's constants.
const (
	cubicBeta = 0.7
	cubicC    = 0.4
	// α_cubic (§4.3): W_est's growth per RTT while below the window
	// of the latest congestion event, so that Cubic takes no more than
	// Reno on average.
	cubicAlpha = 3 * (1 - cubicBeta) / (1 + cubicBeta)
)

// cubicState is Cubic's state between congestion events. The windows are
// in segments.
type cubicState struct {
	wMax      float64       // the window at the latest congestion event (fast convergence applied)
	cwndPrior float64       // the window at the latest congestion event, as it was
	k         float64       // seconds from the epoch's start until W_cubic reaches origin
	origin    float64       // W_cubic's plateau: W_max, or the epoch's window when above it
	epoch     time.Duration // the epoch's start
	epochOn   bool
	wEst      float64 // the Reno-friendly estimate
	frac      float64 // bytes of growth not added to cwnd yet
}

// cubic reports whether the connection runs Cubic.
func (c *Conn) cubic() bool { return c.cfg.CongestionControl != CCReno }

// ccName is the congestion control's name (Info).
func (c *Conn) ccName() string {
	if c.cubic() {
		return CCCubic
	}
	return CCReno
}

// ccReduce sets the slow-start threshold at a congestion event (a
// recovery's start, a timeout) from flight, the octets in flight: half
// of it with Reno (RFC 5681 (4)); with Cubic β_cubic of the window in
// use, the smaller of cwnd and flight (RFC 9438 §4.6 allows the flight
// size: a window grown while the application sent less was never in
// use), which also becomes W_max (§4.7, fast convergence).
func (c *Conn) ccReduce(flight int) {
	if !c.cubic() {
		c.ssthresh = max(flight/2, 2*c.sndMSS)
		return
	}
	mss := float64(c.sndMSS)
	w := float64(min(c.cwnd, max(flight, c.sndMSS))) / mss
	cb := &c.cb
	cb.cwndPrior = w
	if w < cb.wMax {
		cb.wMax = w * (1 + cubicBeta) / 2 // fast convergence
	} else {
		cb.wMax = w
	}
	c.ssthresh = max(int(w*cubicBeta*mss), 2*c.sndMSS)
	cb.epochOn = false
	cb.frac = 0
}

// ccRecovered starts Cubic's epoch at the end of a recovery: the cubic
// function's time counts from here.
func (c *Conn) ccRecovered() {
	if c.cubic() {
		c.cubicEpoch()
	}
}

// cubicEpoch starts an epoch of congestion avoidance at the current window.
func (c *Conn) cubicEpoch() {
	cb := &c.cb
	w := float64(c.cwnd) / float64(c.sndMSS)
	cb.epoch, cb.epochOn = c.now, true
	cb.wEst = w
	cb.frac = 0
	if cb.wMax > w {
		cb.k = math.Cbrt((cb.wMax - w) / cubicC)
		cb.origin = cb.wMax
	} else {
		cb.k = 0
		cb.origin = w
	}
}

// ccAvoid grows the window in congestion avoidance for acked newly
// acknowledged octets.
func (c *Conn) ccAvoid(acked int) {
	if !c.cubic() {
		c.cwnd += max(1, c.sndMSS*c.sndMSS/c.cwnd)
		return
	}
	cb := &c.cb
	if !cb.epochOn {
		c.cubicEpoch()
	}
	mss := float64(c.sndMSS)
	w := float64(c.cwnd) / mss
	segs := float64(acked) / mss
	// W_est (§4.3): α_cubic segments per window ACKed, 1 once it has
	// passed the window of the latest congestion event.
	alpha := cubicAlpha
	if cb.wEst >= cb.cwndPrior {
		alpha = 1
	}
	cb.wEst += alpha * segs / w
	// The target (§4.2): W_cubic one RTT ahead, between the window and
	// 1.5 times it.
	t := (c.now - cb.epoch + c.rtt.srtt).Seconds()
	d := t - cb.k
	target := min(max(cb.origin+cubicC*d*d*d, w), 1.5*w)
	if target < cb.wEst {
		// The Reno-friendly region (§4.3).
		if n := int(cb.wEst * mss); n > c.cwnd {
			c.cwnd = n
		}
		cb.frac = 0
		return
	}
	// The concave and convex regions (§4.4, §4.5): (target − cwnd)/cwnd
	// segments per segment ACKed.
	cb.frac += (target - w) * float64(acked) / w
	if n := int(cb.frac); n > 0 {
		c.cwnd += n
		cb.frac -= float64(n)
	}
}
