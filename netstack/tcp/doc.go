// Package tcp is rdmatap's own TCP connection engine, written from the
// RFCs for the iWARP stack: one connection's protocol state, driven by
// its caller (segments in, the time, the application's calls) and
// sending through a function it is given. It owns no goroutine, timer or
// socket, so whoever reads a frame can run the connection on that same
// goroutine, and a test can run two of them on a virtual clock.
//
// What a connection does:
//
//   - RFC 9293's state machine: active, passive and simultaneous open,
//     SYN retransmission with backoff (Config.SynRetries), half close,
//     TIME-WAIT (Config.TimeWait) with the peer's FIN acknowledged again
//     there, RST processing; ResetFor answers a segment no connection
//     takes.
//   - RFC 5961's defenses: only a RST at exactly RCV.NXT resets, a RST or
//     SYN elsewhere in the window gets a challenge ACK, and so does an
//     ACK of data never sent or one older than the largest window, which
//     is ignored. ACKs to segments without data that it does not take,
//     challenge ACKs among them, go out at most once per 500 ms, so two
//     ends cannot answer each other's ACKs for ever, nor a flood of lies
//     draw an answer each.
//   - RFC 7323: window scaling and timestamps (PAWS), offered by an
//     active open and answered by a passive one. The timestamp clock
//     ticks in milliseconds; RTTs are measured per segment at the
//     clock's full resolution (Karn's rule), and RFC 6298's RTO follows
//     them without a floor beyond Config.MinRTO.
//   - Receiving: an out-of-order queue bounded by the window it
//     advertised, SACK blocks (RFC 2018) with a D-SACK block for
//     duplicates (RFC 2883), an advertised right edge that never moves
//     back, receiver and sender silly window avoidance (RFC 9293
//     §3.8.6.2), delayed ACKs (Config.AckDelay; every second segment
//     and every out-of-order one at once), and data taken from a
//     segment that overlaps what came before only where it is new.
//   - Sending: slow start with RFC 6928's initial window and RFC 3465's
//     byte counting; congestion avoidance and the reduction at a loss by
//     Cubic (RFC 9438: β_cubic 0.7, C 0.4, fast convergence, the
//     Reno-friendly estimate, at the RTT's full resolution), or Reno
//     (Config.CongestionControl); loss recovery: with SACK, RFC 6675's (a
//     scoreboard of the peer's SACK blocks, bounded and checked against
//     what is in flight, D-SACK blocks told apart and counted, pipe and
//     the lost-segment rule) with PRR's window (RFC 6937, PRR-SSRB),
//     without it fast retransmit and NewReno (RFC 5681, RFC 6582); undo
//     of a reduction whose every retransmission the peer reports
//     duplicate in D-SACK blocks (RFC 2883 §5, with RFC 4015's response,
//     Cubic's state included); the retransmission timer with backoff and
//     go-back on timeout, zero-window probes that keep the connection as
//     long as the peer answers them, and ErrTimeout after
//     Config.MaxRetries unanswered retransmissions.
//   - RACK's time-based loss detection (RFC 8985 §6) beside the
//     order-based rules, with SACK: a segment not delivered an RTT and a
//     reordering window (a quarter of the minimum RTT, widened by
//     D-SACKs) after one sent later was is lost, found on an ACK or by
//     the reorder timer; lost retransmissions are found the same way.
//   - Tail loss probes (RFC 8985 §7): two smoothed RTTs after a
//     transmission without an ACK, one new segment or the last one sent
//     goes again, so that a lost tail is repaired before the
//     retransmission timer.
//   - Keepalive (RFC 9293 §3.8.4, Config.KeepaliveIdle): probes one
//     before SND.UNA after an idle time, and ErrTimeout after
//     KeepaliveCount unanswered ones.
//   - Buffers of gVisor's pooled, reference-counted chunks: packets carry
//     the send buffer's bytes by reference, and the receive buffer keeps
//     a large in-order payload in its packet's chunk, so a byte is copied
//     once into the send buffer and once out of the receive buffer.
//
// Protocol runs connections in a gVisor stack, registered in place of
// gVisor's TCP as the stack's transport protocol for TCP's number
// (stack.Options.TransportProtocols): the stack hands it each segment on
// the goroutine that delivered the frame. On a NIC that cuts segments
// itself, new data goes out in GSO packets of up to 64 KB
// (Config.GSOMax, Segment.SegSize). Endpoint and Listener give blocking
// byte streams (Dial, Listen).
//
// Conn.Info reports a connection's state and counters as `ss -ti` shows
// a Linux socket's, with the congestion control's name. It has neither
// HyStart nor timestamp-based detection of spurious recovery (RFC 3522),
// and without SACK neither PRR nor RACK. rdmatap's endpoints run on it
// with --tcp rdmatap (netstack.Config.TCP, $RDMATAP_TCP); gVisor's TCP is
// their default.
package tcp
