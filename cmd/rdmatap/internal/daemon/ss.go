package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
	"github.com/rdmatap/rdmatap/netstack"
)

func init() {
	cli.Register("ss", "TCP connections of a running endpoint, their state and counters (like ss -tni)", ssCmd)
}

// ssConn is one TCP connection as `rdmatap ss -j` reports it: the fields
// of `ss -tni`, times in microseconds. Fields the endpoint's TCP does not
// report (gVisor's: the byte counters, the windows, the options in use)
// are left out.
type ssConn struct {
	State        string  `json:"state"`
	Local        string  `json:"local"`
	Peer         string  `json:"peer"`
	RecvQ        int     `json:"recv_q"`
	SendQ        int     `json:"send_q"`
	TCP          string  `json:"tcp"`
	CC           string  `json:"cc,omitempty"`
	CCState      string  `json:"ca_state"`
	Timestamps   *bool   `json:"ts,omitempty"`
	SACK         *bool   `json:"sack,omitempty"`
	SndWScale    *int    `json:"snd_wscale,omitempty"`
	RcvWScale    *int    `json:"rcv_wscale,omitempty"`
	RTOUs        int64   `json:"rto_us"`
	RTTUs        int64   `json:"rtt_us"`
	RTTVarUs     int64   `json:"rttvar_us"`
	MSS          int     `json:"mss,omitempty"`
	RcvMSS       int     `json:"rcvmss,omitempty"`
	Cwnd         uint32  `json:"cwnd"`
	Ssthresh     uint32  `json:"ssthresh,omitempty"`
	SegsOut      uint64  `json:"segs_out"`
	SegsIn       uint64  `json:"segs_in"`
	Retrans      uint64  `json:"retrans"`
	Recoveries   uint64  `json:"recoveries"`
	Timeouts     uint64  `json:"timeouts"`
	BytesAcked   *uint64 `json:"bytes_acked,omitempty"`
	BytesRecv    *uint64 `json:"bytes_received,omitempty"`
	BytesRetrans *uint64 `json:"bytes_retrans,omitempty"`
	SndWnd       *int    `json:"snd_wnd,omitempty"`
	RcvWnd       *int    `json:"rcv_wnd,omitempty"`
	Unacked      *int    `json:"unacked_bytes,omitempty"`
	SACKed       *int    `json:"sacked_bytes,omitempty"`
	TLPs         *uint64 `json:"tlp,omitempty"`
	Undos        *uint64 `json:"undo,omitempty"`
	DSACKs       *uint64 `json:"dsack_dups,omitempty"`
	LostRetrans  *uint64 `json:"lost_retrans,omitempty"`
	ReorderSeen  bool    `json:"reord_seen,omitempty"`
}

// ccStates are the names of gVisor's congestion states as the kernel's
// tcp_info calls them (ca_state).
var ccStates = map[uint32]string{0: "open", 1: "loss", 2: "recovery", 3: "recovery", 4: "disorder"}

func toSSConn(c netstack.ConnTCP) ssConn {
	s := ssConn{State: c.State, Local: c.Local.String(), Peer: c.Remote.String(), RecvQ: c.RecvQ, SendQ: c.SendQ,
		TCP: c.TCP, CC: c.CongestionControl, CCState: ccStates[uint32(c.CongestionState)],
		RTOUs: c.RTO.Microseconds(), RTTUs: c.SRTT.Microseconds(), RTTVarUs: c.RTTVar.Microseconds(),
		MSS: c.SndMSS, RcvMSS: c.RcvMSS, Cwnd: c.Cwnd, Ssthresh: c.Ssthresh,
		SegsOut: c.SegmentsSent, SegsIn: c.SegmentsReceived, Retrans: c.Retransmits, Recoveries: c.FastRetransmits,
		Timeouts: c.Timeouts, ReorderSeen: c.ReorderSeen}
	if c.TCP == netstack.TCPRdmatap {
		// What only rdmatap's TCP reports.
		s.Timestamps, s.SACK = &c.Timestamps, &c.SACK
		if c.SndWScale >= 0 {
			s.SndWScale, s.RcvWScale = &c.SndWScale, &c.RcvWScale
		}
		s.BytesAcked, s.BytesRecv, s.BytesRetrans = &c.BytesAcked, &c.BytesReceived, &c.BytesRetrans
		s.SndWnd, s.RcvWnd, s.Unacked, s.SACKed = &c.SndWnd, &c.RcvWnd, &c.Unacked, &c.SACKed
		s.TLPs, s.Undos, s.DSACKs, s.LostRetrans = &c.TLPs, &c.Undos, &c.DSACKs, &c.LostRetrans
	}
	return s
}

// getConns is the endpoint's TCP connections, the busiest sender first.
func getConns(e *cli.Endpoint) []ssConn {
	out := []ssConn{}
	if e.Net == nil {
		return out
	}
	for _, c := range e.Net.ConnsTCP() {
		out = append(out, toSSConn(c))
	}
	return out
}

func ssCmd(args []string, stdout, stderr io.Writer) error {
	path, jsonOut, _, err := ctlFlags("ss", args, stderr, "Print the TCP connections of a running endpoint with their state and counters, as ss -tni does.")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rep, err := ctlCall(ctx, path, "ss")
	if err != nil {
		return err
	}
	if rep.Conns == nil {
		rep.Conns = []ssConn{} // none: omitted from the reply
	}
	if jsonOut {
		return json.NewEncoder(stdout).Encode(rep.Conns)
	}
	w := bufio.NewWriter(stdout)
	defer w.Flush()
	printSS(w, rep.Conns)
	return nil
}

// printSS prints conns as `ss -tni` does: a line of addresses and queues,
// then an indented line of the connection's TCP state.
func printSS(w io.Writer, conns []ssConn) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "State\tRecv-Q\tSend-Q\tLocal Address:Port\tPeer Address:Port")
	for _, c := range conns {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", c.State, c.RecvQ, c.SendQ, c.Local, c.Peer)
		tw.Flush()
		fmt.Fprintf(w, "\t %s\n", ssInfo(c))
	}
	tw.Flush()
}

// ssInfo is the second line of a connection in `ss -tni`'s words.
func ssInfo(c ssConn) string {
	var f []string
	add := func(format string, a ...any) { f = append(f, fmt.Sprintf(format, a...)) }
	if c.Timestamps != nil && *c.Timestamps {
		add("ts")
	}
	if c.SACK != nil && *c.SACK {
		add("sack")
	}
	if c.CC != "" {
		add("%s", c.CC)
	}
	if c.SndWScale != nil {
		add("wscale:%d,%d", *c.SndWScale, *c.RcvWScale)
	}
	ms := func(us int64) string {
		return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", float64(us)/1000), "0"), ".")
	}
	add("rto:%s", ms(c.RTOUs))
	add("rtt:%s/%s", ms(c.RTTUs), ms(c.RTTVarUs))
	if c.MSS > 0 {
		add("mss:%d", c.MSS)
	}
	if c.RcvMSS > 0 {
		add("rcvmss:%d", c.RcvMSS)
	}
	add("cwnd:%d", c.Cwnd)
	if c.Ssthresh > 0 {
		add("ssthresh:%d", c.Ssthresh)
	}
	opt := func(name string, v *uint64) {
		if v != nil {
			add("%s:%d", name, *v)
		}
	}
	opt("bytes_retrans", c.BytesRetrans)
	opt("bytes_acked", c.BytesAcked)
	opt("bytes_received", c.BytesRecv)
	add("segs_out:%d", c.SegsOut)
	add("segs_in:%d", c.SegsIn)
	if c.SndWnd != nil {
		add("snd_wnd:%d", *c.SndWnd)
		add("rcv_wnd:%d", *c.RcvWnd)
		add("unacked_bytes:%d", *c.Unacked)
		if *c.SACKed > 0 {
			add("sacked_bytes:%d", *c.SACKed)
		}
	}
	add("retrans:%d", c.Retrans)
	add("recoveries:%d", c.Recoveries)
	add("timeouts:%d", c.Timeouts)
	opt("tlp", c.TLPs)
	opt("undo", c.Undos)
	opt("dsack_dups", c.DSACKs)
	opt("lost_retrans", c.LostRetrans)
	if c.ReorderSeen {
		add("reord_seen")
	}
	add("ca_state:%s", c.CCState)
	add("tcp:%s", c.TCP)
	return strings.Join(f, " ")
}
