package netstack

import (
	"net/netip"
	"slices"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// TCPStats count how a stack's TCP recovered from loss, over all its
// connections since the stack was made, and what its link repaired
// (repair.go).
type TCPStats struct {
	SegmentsSent uint64 // TCP segments sent (a GSO packet counts once)
	Retransmits  uint64 // segments retransmitted
	// FastRetransmits are segments retransmitted on entering recovery;
	// Timeouts are retransmission timeouts (RTOs).
	FastRetransmits, Timeouts uint64
	// Recoveries by SACK (RFC 6675 / RACK) and recoveries a tail-loss
	// probe started; recoveries and RTOs later found spurious.
	SACKRecoveries, TLPRecoveries        uint64
	SpuriousRecoveries, SpuriousRTOs     uint64
	LinkResentPackets, LinkResentBytes   uint64 // GSO packets the link sent again, and their payload
	SegmentsReceived, ChecksumErrors     uint64
	DSACKs                               uint64 // segments the peer reported received twice (D-SACK)
	FastRecoveries, SlowStartRetransmits uint64
	// CongestionChanges counts connections changed from Cubic to Reno at
	// their first loss (Config.CongestionControl "auto").
	CongestionChanges uint64
}

// TCPStats returns the stack's TCP recovery counters.
func (s *Stack) TCPStats() TCPStats {
	if s.own != nil {
		return s.ownTCPStats()
	}
	t := s.s.Stats().TCP
	r := s.nic.rp.stats()
	return TCPStats{
		SegmentsSent: t.SegmentsSent.Value(), Retransmits: t.Retransmits.Value(),
		FastRetransmits: t.FastRetransmit.Value(), Timeouts: t.Timeouts.Value(),
		SACKRecoveries: t.SACKRecovery.Value(), TLPRecoveries: t.TLPRecovery.Value(),
		SpuriousRecoveries: t.SpuriousRecovery.Value(), SpuriousRTOs: t.SpuriousRTORecovery.Value(),
		LinkResentPackets: r.Resent, LinkResentBytes: r.ResentBytes,
		SegmentsReceived: t.ValidSegmentsReceived.Value(), ChecksumErrors: t.ChecksumErrors.Value(),
		DSACKs:         t.SegmentsAckedWithDSACK.Value(),
		FastRecoveries: t.FastRecovery.Value(), SlowStartRetransmits: t.SlowStartRetransmits.Value(),
		CongestionChanges: s.ccChanges.Load(),
	}
}

// ConnTCP is one connection's TCP state, as `ss -ti` shows a kernel
// socket's: its own counters (gVisor keeps recoveries by kind per stack
// only: TCPStats) and its sender's current estimates. What a TCP does not
// report is left zero (gVisor's: the byte counters, the windows, the
// options in use).
type ConnTCP struct {
	Local, Remote netip.AddrPort
	// State is ss's name of the TCP state: ESTAB, SYN-SENT, SYN-RECV,
	// FIN-WAIT-1, FIN-WAIT-2, CLOSE-WAIT, CLOSING, LAST-ACK, TIME-WAIT,
	// CLOSED.
	State string
	// TCP is the transport: gvisor or rdmatap (Config.TCP);
	// CongestionControl its sender's algorithm.
	TCP, CongestionControl string
	// RecvQ is bytes received in order and not read; SendQ bytes written
	// and not acknowledged (sent or not).
	RecvQ, SendQ       int
	SegmentsSent       uint64
	SegmentsReceived   uint64
	Retransmits        uint64
	FastRetransmits    uint64
	Timeouts           uint64
	Cwnd, Ssthresh     uint32 // congestion window and slow-start threshold, in segments
	SRTT, RTTVar, RTO  time.Duration
	CongestionState    tcpip.CongestionControlState // Open, RTORecovery, FastRecovery, SACKRecovery, Disorder
	ReorderSeen, Alive bool                         // Alive: the connection is open
	// SndMSS is the largest segment sent, RcvMSS the one advertised.
	SndMSS, RcvMSS int
	// SndWScale and RcvWScale are the window scales (RFC 7323), -1
	// without; Timestamps and SACK the options in use.
	SndWScale, RcvWScale int
	Timestamps, SACK     bool
	// SndWnd is the peer's window, RcvWnd the one advertised; Unacked the
	// bytes in flight, of which SACKed the peer has SACKed.
	SndWnd, RcvWnd, Unacked, SACKed int
	// BytesAcked are the bytes the peer acknowledged, BytesReceived
	// those received in order, BytesRetrans those sent again.
	BytesAcked, BytesReceived, BytesRetrans uint64
	// TLPs are tail loss probes sent, Undos reductions undone as
	// spurious, DSACKs D-SACK blocks received (duplicates the peer got),
	// LostRetrans retransmissions found lost and sent again.
	TLPs, Undos, DSACKs, LostRetrans uint64
}

// ssState is ss's name of a TCP state (RFC 9293's names).
func ssState(rfc string) string {
	switch rfc {
	case "ESTABLISHED":
		return "ESTAB"
	case "SYN-RECEIVED":
		return "SYN-RECV"
	}
	return rfc
}

// gvisorStates are ss's names of gVisor's endpoint states.
var gvisorStates = map[tcp.EndpointState]string{
	tcp.StateEstablished: "ESTAB", tcp.StateSynSent: "SYN-SENT", tcp.StateSynRecv: "SYN-RECV",
	tcp.StateFinWait1: "FIN-WAIT-1", tcp.StateFinWait2: "FIN-WAIT-2", tcp.StateTimeWait: "TIME-WAIT",
	tcp.StateClose: "CLOSED", tcp.StateCloseWait: "CLOSE-WAIT", tcp.StateLastAck: "LAST-ACK",
	tcp.StateListen: "LISTEN", tcp.StateClosing: "CLOSING", tcp.StateError: "CLOSED",
}

// TCP returns the connection's TCP state.
func (c *Conn) TCP() ConnTCP {
	if c.own != nil {
		return c.ownTCP()
	}
	st := tcp.EndpointState(c.ep.State())
	out := ConnTCP{Local: c.LocalAddr(), Remote: c.RemoteAddr(), State: gvisorStates[st], TCP: TCPGVisor,
		SndWScale: -1, RcvWScale: -1}
	if out.State == "" {
		out.State = "CLOSED" // the states before a connection
	}
	if st, ok := c.ep.Stats().(*tcp.Stats); ok {
		out.SegmentsSent = st.SegmentsSent.Value()
		out.SegmentsReceived = st.SegmentsReceived.Value()
		out.Retransmits = st.SendErrors.Retransmits.Value()
		out.FastRetransmits = st.SendErrors.FastRetransmit.Value()
		out.Timeouts = st.SendErrors.Timeouts.Value()
	}
	var info tcpip.TCPInfoOption
	if c.ep.GetSockOpt(&info) == nil {
		out.Cwnd, out.Ssthresh = info.SndCwnd, info.SndSsthresh
		out.SRTT, out.RTTVar, out.RTO = info.RTT, info.RTTVar, info.RTO
		out.CongestionState, out.ReorderSeen = info.CcState, info.ReorderSeen
		out.Alive = !finishedState(tcp.EndpointState(info.State))
	}
	var cc tcpip.CongestionControlOption
	if c.ep.GetSockOpt(&cc) == nil {
		out.CongestionControl = string(cc)
	}
	if v, err := c.ep.GetSockOptInt(tcpip.ReceiveQueueSizeOption); err == nil {
		out.RecvQ = v
	}
	if v, err := c.ep.GetSockOptInt(tcpip.SendQueueSizeOption); err == nil {
		out.SendQ = v
	}
	if out.Ssthresh >= 1<<30 {
		out.Ssthresh = 0 // not set yet: slow start
	}
	out.SndMSS = c.MaxPayload()
	return out
}

// ConnsTCP returns the TCP state of the stack's open connections, the
// busiest sender first.
func (s *Stack) ConnsTCP() []ConnTCP {
	s.mu.Lock()
	conns := make([]*Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	out := make([]ConnTCP, 0, len(conns))
	for _, c := range conns {
		out = append(out, c.TCP())
	}
	slices.SortFunc(out, func(a, b ConnTCP) int {
		switch {
		case a.SegmentsSent > b.SegmentsSent:
			return -1
		case a.SegmentsSent < b.SegmentsSent:
			return 1
		}
		return 0
	})
	return out
}

// CongestionStateName names a ConnTCP.CongestionState.
func CongestionStateName(s tcpip.CongestionControlState) string {
	switch s {
	case tcpip.Open:
		return "open"
	case tcpip.RTORecovery:
		return "rto-recovery"
	case tcpip.FastRecovery:
		return "fast-recovery"
	case tcpip.SACKRecovery:
		return "sack-recovery"
	case tcpip.Disorder:
		return "disorder"
	}
	return "unknown"
}
