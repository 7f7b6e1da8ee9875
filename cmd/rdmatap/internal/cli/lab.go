package cli

import (
	"flag"
	"fmt"
	"io"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
)

// LabFlags are the placement lab's flags, shared by demo and every TAP
// endpoint command: the device's placement mode and a deterministic
// impairment of the endpoint's transmit side, so that placement under
// loss can be watched without a special network.
type LabFlags struct {
	Placement          string
	Loss, Reorder, Dup float64
	Seed               int64

	Mode verbs.Placement // parsed by check
}

// labHelp words the impairment flags' help for the side they impair.
type labHelp struct {
	side string // whose packets are impaired
	why  string // what that shows
}

var (
	tapLabHelp  = labHelp{side: "this endpoint sends (its transmit side)", why: "the peer receives them impaired"}
	DemoLabHelp = labHelp{side: "endpoint A sends", why: "A sends the Sends and Writes, so B receives and places them under loss and out of order"}
)

func (l *LabFlags) Register(fs *flag.FlagSet, h labHelp) {
	fs.StringVar(&l.Placement, "placement", "stream",
		"placement of received payload: stream (from TCP's in-order stream) or segment (also from TCP segments beyond a hole, delivered when the hole fills; a short message in order is fed to the waiting poster as its segment arrives); lat's default: "+LatPlacement)
	fs.Float64Var(&l.Loss, "loss", 0, "drop this fraction (0 to 1, e.g. 0.01) of the packets "+h.side+"; "+h.why)
	fs.Float64Var(&l.Reorder, "reorder", 0, "hold back this fraction (0 to 1) of the packets "+h.side+" and send each after the next one")
	fs.Float64Var(&l.Dup, "dup", 0, "send this fraction (0 to 1) of the packets "+h.side+" twice")
	fs.Int64Var(&l.Seed, "seed", 1, "seed of the impairment: the same seed makes the same decisions for the same sequence of packets")
}

// Check validates the flags and parses --placement.
func (l *LabFlags) Check() error {
	mode, err := iwarp.ParsePlacement(l.Placement)
	if err != nil || l.Placement == "" {
		return fmt.Errorf("%w: --placement %q: want stream or segment", ErrUsage, l.Placement)
	}
	l.Mode = verbs.Placement(mode)
	for _, p := range []struct {
		name string
		v    float64
	}{{"loss", l.Loss}, {"reorder", l.Reorder}, {"dup", l.Dup}} {
		if math.IsNaN(p.v) || p.v < 0 || p.v > 1 {
			return fmt.Errorf("%w: --%s %v: want a probability from 0 to 1 (e.g. 0.01)", ErrUsage, p.name, p.v)
		}
	}
	return nil
}

// Impaired reports whether any impairment rate is set.
func (l *LabFlags) Impaired() bool { return l.Loss > 0 || l.Reorder > 0 || l.Dup > 0 }

// ImpairConfig is the impairment the flags ask for; nil when no rate is
// set.
func (l *LabFlags) ImpairConfig() *netstack.ImpairConfig {
	if !l.Impaired() {
		return nil
	}
	return &netstack.ImpairConfig{Seed: l.Seed, LossRate: l.Loss, ReorderRate: l.Reorder, DupRate: l.Dup}
}

// Wrap puts the impairment around link when a rate is set; im is nil
// otherwise.
func (l *LabFlags) Wrap(link stack.LinkEndpoint) (stack.LinkEndpoint, *netstack.Impair) {
	ic := l.ImpairConfig()
	if ic == nil {
		return link, nil
	}
	ep := netstack.NewImpair(link, *ic)
	im, _ := ep.(*netstack.Impair)
	return ep, im
}

// LabPair builds the demo's two stacks on an in-memory link: side A's link
// is captured to pcapA (when set), as it is on the wire, and impaired per
// the lab flags (what A sends). With impairment, TCP's minimum RTO is
// 20 ms, so that a lost segment costs a short stall on the in-memory link
// rather than the default 200 ms.
func LabPair(lc netstack.LinkConfig, pcapA io.Writer, lab *LabFlags) (a, b *netstack.Stack, im *netstack.Impair, err error) {
	la, lb := netstack.NewLinkPair(lc)
	if pcapA != nil {
		la = netstack.NewCapture(la, pcapA)
	}
	la, im = lab.Wrap(la)
	var sc netstack.Config
	if im != nil {
		sc.MinRTO = 20 * time.Millisecond
	}
	ca := sc
	ca.Link, ca.Addrs = la, []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}
	if a, err = netstack.New(ca); err != nil {
		la.Close()
		lb.Close()
		return nil, nil, nil, err
	}
	cb := sc
	cb.Link, cb.Addrs = lb, []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}
	if b, err = netstack.New(cb); err != nil {
		a.Close()
		lb.Close()
		return nil, nil, nil, err
	}
	return a, b, im, nil
}

// statKV is one named counter.
type statKV struct {
	K string
	V uint64
}

// SegmentCounters are the segment placement counters under the names
// rdmatap stat prints.
func SegmentCounters(v verbs.Stats) []statKV {
	g := v.Segment
	return []statKV{
		{"seg_placed_early_bytes", g.PlacedEarly}, {"seg_out_of_order_bytes", g.OutOfOrder},
		{"seg_placed_early_send_bytes", g.EarlySends}, {"seg_placed_early_read_response_bytes", g.EarlyReadResponses},
		{"seg_fpdus_by_marker", g.ByMarker}, {"seg_fpdus_by_stream", g.ByStream}, {"seg_fpdus_by_alignment", g.ByAlignment},
		{"seg_unframed_segments", g.Unframed}, {"seg_fpdus_left_in_order", g.LeftInOrder},
		{"seg_refused", g.Refused}, {"seg_refused_crc", g.RefusedCRC}, {"seg_refused_header", g.RefusedHeader}, {"seg_refused_stag", g.RefusedSTag}, {"seg_refused_marker", g.RefusedMarker},
		{"seg_bad_tcp_checksum", g.BadChecksum}, {"seg_out_of_window", g.OutOfWindow}, {"seg_bad_tcp_flags", g.BadFlags},
		{"seg_duplicate_bytes", g.Duplicates}, {"seg_mismatches", g.Mismatches},
		{"seg_fed_bytes", g.Fed}, {"seg_fpdus_delivered_early", g.DeliveredEarly}, {"seg_segments_queued", g.Queued}, {"seg_quick_fed", g.QuickFed}, {"seg_quick_fed_bytes", g.QuickFedBytes},
		{"seg_kept_fed_bytes", g.Kept}, {"seg_fills_fed", g.FillsFed},
		{"seg_hole_fills", g.HoleFills}, {"seg_hole_fill_p50_ns", uint64(g.HoleFillHist.Quantile(0.5))}, {"seg_hole_fill_p99_ns", uint64(g.HoleFillHist.Quantile(0.99))},
	}
}

// ImpairCounters are an impairment's counters under the names rdmatap
// stat prints.
func ImpairCounters(s netstack.ImpairStats) []statKV {
	return []statKV{{"impair_packets", s.Packets}, {"impair_dropped", s.Dropped},
		{"impair_duplicated", s.Duplicated}, {"impair_reordered", s.Reordered}}
}

// CopiesPerByte is how many times each received payload byte was copied
// (placed), with two decimals: 1.00 when every byte is copied once.
func CopiesPerByte(v verbs.Stats) string {
	if v.RxBytes == 0 {
		return "0.00"
	}
	return fmt.Sprintf("%.2f", float64(v.PlacedBytes)/float64(v.RxBytes))
}

// PlacementReport says in words how a device placed what it received.
func PlacementReport(mode verbs.Placement, who string, v verbs.Stats) string {
	var b strings.Builder
	fmt.Fprintf(&b, "placement %v at %s: %d payload bytes received, %d placed, %s copies per payload byte received", mode, who, v.RxBytes, v.PlacedBytes, CopiesPerByte(v))
	if mode != verbs.PlacementSegment {
		return b.String()
	}
	g := v.Segment
	fmt.Fprintf(&b, "\n  %d bytes placed before TCP delivered them, %d of them out of order (beyond a hole), %d fed to the receiver with the segment that filled its hole; %d duplicate bytes skipped", g.PlacedEarly, g.OutOfOrder, g.Fed, g.Duplicates)
	fmt.Fprintf(&b, "\n  %d FPDUs delivered in order before TCP handed them over (their messages completed then); %d segments beyond holes placed by the receive goroutine; %d short segments in order (%d bytes) fed to the waiting receiver", g.DeliveredEarly, g.Queued, g.QuickFed, g.QuickFedBytes)
	fmt.Fprintf(&b, "\n  %d hole-filling segments fed to the receiver by the tap, with %d bytes in front of them that TCP had not yet taken", g.FillsFed, g.Kept)
	fmt.Fprintf(&b, "\n  FPDUs located by marker %d, by alignment %d, by the stream %d; %d left in order; %d segments unframed", g.ByMarker, g.ByAlignment, g.ByStream, g.LeftInOrder, g.Unframed)
	fmt.Fprintf(&b, "\n  refused by validation %d (CRC %d, header %d, STag %d, marker %d); segments refused by TCP: bad checksum %d, out of window %d, bad flags %d; mismatches %d",
		g.Refused, g.RefusedCRC, g.RefusedHeader, g.RefusedSTag, g.RefusedMarker, g.BadChecksum, g.OutOfWindow, g.BadFlags, g.Mismatches)
	if g.HoleFills > 0 {
		h := &g.HoleFillHist
		fmt.Fprintf(&b, "\n  %d hole fills timed, from the filling segment's arrival to the completion it held back: p50 %v, p90 %v, p99 %v, mean %v",
			g.HoleFills, h.Quantile(0.5), h.Quantile(0.9), h.Quantile(0.99), g.HoleFillTime/time.Duration(g.HoleFills))
	}
	return b.String()
}

// ImpairReport says what an impairment did.
func ImpairReport(im *netstack.Impair, who string, l *LabFlags) string {
	s := im.Stats()
	return fmt.Sprintf("impairment of %s (loss %g, reorder %g, dup %g, seed %d): %d packets, %d dropped, %d duplicated, %d reordered",
		who, l.Loss, l.Reorder, l.Dup, l.Seed, s.Packets, s.Dropped, s.Duplicated, s.Reordered)
}

// SettledStats returns a device's counters once they stop changing: the
// receive path adds its counters after each stream read, so the last ones
// may land just after the completion that ended a run.
func SettledStats(d *verbs.Device) verbs.Stats {
	st := d.Stats()
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		time.Sleep(2 * time.Millisecond)
		next := d.Stats()
		if next == st {
			break
		}
		st = next
	}
	return st
}

// TCPReport words what TCP did during a test (the counters' change from
// before) and the state of the busiest connection at its end, as `ss -ti`
// shows a kernel socket's: segments sent and retransmitted, fast
// retransmits, retransmission timeouts, recoveries by SACK and by
// tail-loss probe, spurious ones, D-SACKs, lost GSO packets the link sent
// again; congestion window, slow-start threshold, round trip, RTO.
func TCPReport(a, b verbs.TCPStats) string {
	ssthresh := "-"
	if b.Ssthresh < 1<<31 {
		ssthresh = strconv.FormatUint(b.Ssthresh, 10)
	}
	return fmt.Sprintf("tcp: segs_out %d retrans %d fast_retrans %d rto_timeouts %d sack_recoveries %d tlp_recoveries %d spurious %d dsack %d link_resent %d (%d B); cwnd %d ssthresh %s rtt %.3f/%.3f ms rto %.0f ms",
		b.SegmentsSent-a.SegmentsSent, b.Retransmits-a.Retransmits, b.FastRetransmits-a.FastRetransmits, b.Timeouts-a.Timeouts,
		b.SACKRecoveries-a.SACKRecoveries, b.TLPRecoveries-a.TLPRecoveries,
		(b.SpuriousRecoveries+b.SpuriousRTOs)-(a.SpuriousRecoveries+a.SpuriousRTOs), b.DSACKs-a.DSACKs,
		b.LinkResentPackets-a.LinkResentPackets, b.LinkResentBytes-a.LinkResentBytes,
		b.Cwnd, ssthresh, float64(b.SRTT)/1e6, float64(b.RTTVar)/1e6, float64(b.RTO)/1e6)
}
