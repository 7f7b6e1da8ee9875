package netstack

import (
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// CongestionAuto is the Config.CongestionControl value that starts every
// connection with Cubic and changes it to Reno once it has lost a segment.
//
// gVisor's TCP holds its smoothed round-trip time at 1 ms at least
// (tcp.MinSRTT), while a LAN's or a bridge's round trip is tens of
// microseconds. Cubic grows its window by time since the last loss, and its
// TCP-friendly estimate by half a segment per estimated round trip: after a
// loss on such a path it regains the window many times more slowly than the
// path allows, and with random loss its window stays at a few segments. Reno
// grows its window by acknowledgments, at the path's real pace. Without
// loss both stay in slow start, limited by the buffers.
//
// The change is made by the connection's writer when TCP's send buffer is
// full (the only writers that a window limits), once the endpoint counts a
// retransmission and is not in recovery: changing the algorithm resets the
// window to the initial window and slow start, and gVisor ends a recovery
// by setting the window to the slow-start threshold, which a change in
// recovery would have made unbounded.
const CongestionAuto = "auto"

var ccReno = tcpip.CongestionControlOption("reno")

// congestionAuto changes the connection to Reno if it has retransmitted and
// is not in recovery. Called by the writer with wsem held.
func (c *Conn) congestionAuto() {
	tep, ok := c.ep.(*tcp.Endpoint)
	if !ok {
		c.ccAuto = false
		return
	}
	st, ok := tep.Stats().(*tcp.Stats)
	if !ok {
		c.ccAuto = false
		return
	}
	if st.SendErrors.Retransmits.Value() == 0 && st.SendErrors.Timeouts.Value() == 0 {
		return
	}
	var info tcpip.TCPInfoOption
	if c.ep.GetSockOpt(&info) != nil {
		return
	}
	switch info.CcState {
	case tcpip.Open, tcpip.Disorder:
	default:
		return
	}
	opt := ccReno
	if c.ep.SetSockOpt(&opt) == nil {
		c.ccAuto = false
		c.s.ccChanges.Add(1)
	}
}
