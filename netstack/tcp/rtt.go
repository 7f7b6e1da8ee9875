package tcp

import "time"

// rttEstimator keeps the smoothed round-trip time and its variation and
// computes the retransmission timeout, as RFC 6298 §2 does, at the clock's
// full resolution: a LAN's RTT of tens of microseconds is kept as it is,
// not rounded up to a millisecond.
type rttEstimator struct {
	srtt, rttvar time.Duration
	min, max     time.Duration // RTO bounds
	rto          time.Duration
	sampled      bool
}

// granularity is the G of RFC 6298: the engine's clock ticks in
// nanoseconds, so a microsecond stands for "no less than one tick".
const granularity = time.Microsecond

func newRTTEstimator(initial, minRTO, maxRTO time.Duration) rttEstimator {
	return rttEstimator{min: minRTO, max: maxRTO, rto: min(max(initial, minRTO), maxRTO)}
}

// sample takes one RTT measurement (RFC 6298 §2.2 and §2.3, α = 1/8,
// β = 1/4, K = 4) and recomputes the RTO.
func (e *rttEstimator) sample(r time.Duration) {
	if r <= 0 {
		r = granularity
	}
	if !e.sampled {
		e.srtt, e.rttvar, e.sampled = r, r/2, true
	} else {
		d := e.srtt - r
		if d < 0 {
			d = -d
		}
		e.rttvar = (3*e.rttvar + d) / 4
		e.srtt = (7*e.srtt + r) / 8
	}
	e.rto = min(max(e.srtt+max(granularity, 4*e.rttvar), e.min), e.max)
}

// backedOff is the RTO after n timeouts in a row (RFC 6298 §5.5): doubled
// each time, at most the maximum.
func (e *rttEstimator) backedOff(n int) time.Duration {
	d := e.rto
	for i := 0; i < n && d < e.max; i++ {
		d *= 2
	}
	return min(d, e.max)
}
