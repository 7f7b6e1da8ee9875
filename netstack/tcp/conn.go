package tcp

import (
	"errors"
	"io"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/seqnum"
)

// State is a connection's state (RFC 9293 §3.3.2). LISTEN is a
// listener's, not a connection's.
type State uint8

// The connection states.
const (
	Closed State = iota
	SynSent
	SynReceived
	Established
	FinWait1
	FinWait2
	CloseWait
	Closing
	LastAck
	TimeWait
)

var stateNames = [...]string{"CLOSED", "SYN-SENT", "SYN-RECEIVED", "ESTABLISHED", "FIN-WAIT-1",
	"FIN-WAIT-2", "CLOSE-WAIT", "CLOSING", "LAST-ACK", "TIME-WAIT"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "State(?)"
}

// synchronized reports whether the state is one of those after the
// handshake's SYNs were exchanged (RFC 9293's synchronized states).
func (s State) synchronized() bool { return s >= Established }

// Errors a connection ends with (Conn.Err).
var (
	ErrRefused = errors.New("tcp: connection refused")           // RST in answer to our SYN
	ErrReset   = errors.New("tcp: connection reset by peer")     // RST on a synchronized connection
	ErrTimeout = errors.New("tcp: connection timed out")         // retransmissions unanswered
	ErrAborted = errors.New("tcp: connection aborted")           // Abort
	ErrClosed  = errors.New("tcp: write after close")            // Write after Close
	ErrState   = errors.New("tcp: not in a state for this call") // Write before the handshake completed
)

// Config holds a connection's parameters; the zero value of each field
// means its default.
type Config struct {
	MSS int // the payload we take per segment (our MSS option); default 1460
	// GSOMax, when larger than a segment, is the most payload one
	// output may carry as several segments the link cuts
	// (Segment.SegSize); 0: every output is one segment.
	GSOMax     int
	RcvBuf     int           // receive buffer, bytes; default 1 MiB
	SndBuf     int           // send buffer, bytes; default 1 MiB
	InitialRTO time.Duration // default 1 s (RFC 6298 §2.1)
	MinRTO     time.Duration // default 200 ms
	MaxRTO     time.Duration // default 120 s
	// AckDelay is how long an ACK for in-order data may wait for a
	// segment of ours to ride on (or for a second segment to
	// acknowledge). Default 1 ms; negative: acknowledge at once.
	AckDelay   time.Duration
	SynRetries int // SYN (or SYN-ACK) retransmissions before ErrTimeout; default 6
	MaxRetries int // data retransmissions in a row before ErrTimeout; default 15
	// UserTimeout is how long sent data may go unacknowledged before
	// the connection ends with ErrTimeout (RFC 9293 §3.8.3's user
	// timeout, Linux's TCP_USER_TIMEOUT), however many retransmissions
	// that leaves; a peer that answers window probes keeps it. 0: only
	// MaxRetries ends it.
	UserTimeout time.Duration
	TimeWait    time.Duration // how long TIME-WAIT lasts (2·MSL); default 60 s

	// Keepalive (RFC 9293 §3.8.4): after KeepaliveIdle without a segment
	// from the peer (0: never), a probe goes every KeepaliveInterval
	// (default 75 s), and KeepaliveCount unanswered ones (default 9) end
	// the connection with ErrTimeout.
	KeepaliveIdle     time.Duration
	KeepaliveInterval time.Duration
	KeepaliveCount    int

	// CongestionControl is "cubic" (RFC 9438, the default) or "reno"
	// (RFC 5681); anything else is Cubic.
	CongestionControl string

	NoSACK        bool // neither offer nor accept SACK
	NoTimestamps  bool // neither offer nor accept timestamps
	NoWindowScale bool // neither offer nor accept window scaling

	// piecesOut: the output function reads a segment's payload from
	// Segment's send-buffer pieces (Protocol), so a payload that spans
	// two of the send buffer's blocks is not joined into Payload.
	piecesOut bool
}

func (c Config) withDefaults() Config {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.MSS, 1460)
	c.MSS = min(c.MSS, 0xffff)
	def(&c.RcvBuf, 1<<20)
	def(&c.SndBuf, 1<<20)
	c.RcvBuf = min(c.RcvBuf, 0xffff<<14) // what window scaling can advertise
	defD(&c.InitialRTO, time.Second)
	defD(&c.MinRTO, 200*time.Millisecond)
	defD(&c.MaxRTO, 120*time.Second)
	if c.AckDelay == 0 {
		c.AckDelay = time.Millisecond
	}
	def(&c.SynRetries, 6)
	def(&c.MaxRetries, 15)
	defD(&c.TimeWait, 60*time.Second)
	defD(&c.KeepaliveInterval, 75*time.Second)
	def(&c.KeepaliveCount, 9)
	return c
}

// Conn is one TCP connection's protocol engine. It owns no goroutine,
// timer or socket: its caller hands it segments (Input), the time
// (every call takes now, a monotonic clock reading), and the
// application's calls (Write, Read, Close), and runs its timers when
// Deadline says (Tick). Segments go out through the function given at
// creation, synchronously, inside those calls; a Segment's Payload and
// SACK alias the connection's memory and are valid only during the call
// (Protocol keeps the payload's bytes by reference instead, through the
// send buffer's reference-counted blocks: see sendQueue).
//
// A Conn is not safe for concurrent use: its caller serializes the calls.
type Conn struct {
	cfg   Config
	out   func(*Segment)
	now   time.Duration
	state State
	err   error

	// Send side. sndBuf holds the bytes from sndUna on: those in flight,
	// then those not sent yet. sndMax is the highest sequence number
	// sent (sndNxt goes back to sndUna after a timeout).
	iss                    seqnum.Value
	sndUna, sndNxt, sndMax seqnum.Value
	sndBuf                 sendQueue
	marks                  recordMarks // the records' boundaries (records.go)
	plan                   []int       // RecordPlan's scratch
	rtxs                   []rtxRec    // SACK recovery's retransmissions (sack.go)
	sndWnd                 int         // the peer's window, scaled
	maxSndWnd              int
	sndWl1, sndWl2         seqnum.Value
	sndShift, rcvShift     uint8
	sndMSS                 int  // payload per segment we send
	finQueued              bool // Close: a FIN follows the data
	finAcked               bool // the peer has acknowledged our FIN: nothing is left to send
	synAcked               bool

	cwnd, ssthresh int
	// renoFlight is what was in flight when a recovery without SACK
	// began: the most its duplicate ACKs may inflate cwnd by.
	renoFlight   int
	dupAcks      int
	inRecovery   bool
	recover      seqnum.Value
	sacked       []sackRange // the SACK scoreboard (sack.go)
	cb           cubicState  // Cubic (cubic.go)
	prr          prrState    // the recovery's window (prr.go)
	rack         rackState   // RACK's loss detection (rack.go)
	ackDelivered int         // what the ACK being processed reported delivered (RFC 6937's DeliveredData)

	// Undo (undo.go): the windows before the latest reduction, and how
	// many of its retransmissions the peer has not reported duplicate.
	priorCwnd, priorSsthresh int
	priorCubic               cubicState
	undoRetrans              int
	undoOK                   bool
	undoStart, undoEnd       seqnum.Value // SND.UNA and SND.MAX at the reduction
	highRxt                  seqnum.Value // RFC 6675's HighRxt: the end of the latest retransmission

	rtt      rttEstimator
	rtoAt    time.Duration // retransmission (or persist) timer; 0: stopped
	backoff  int           // timeouts in a row: the RTO's doubling
	retries  int           // timeouts without an answer: towards MaxRetries
	probing  bool          // the persist timer probes a zero window
	timing   bool          // a segment is being timed (Karn)
	timedSeq seqnum.Value  // the timed segment's end
	timedAt  time.Duration

	// Receive side.
	irs        seqnum.Value
	rcvNxt     seqnum.Value
	rcvBuf     recvQueue // in order, not read yet
	ooo        []oooSeg  // beyond rcvNxt, by sequence, apart from one another
	oooBytes   int
	rcvAdvEnd  seqnum.Value // the right edge of the window we advertised
	finRcvd    bool
	finPending bool // a FIN arrived out of order at finAt
	finAt      seqnum.Value
	ackNow     bool          // an ACK is due at once
	ackSegs    int           // in-order segments not acknowledged yet
	ackAt      time.Duration // delayed ACK timer; 0: stopped
	lastAck    seqnum.Value  // the ACK number last sent
	lastOOO    seqnum.Value  // where the latest out-of-order segment started
	dsack      header.SACKBlock
	hasDSACK   bool

	wsOK     bool // both SYNs carried a window scale option
	tsOK     bool
	tsRecent uint32
	tsOffset uint32
	sackOK   bool

	twAt time.Duration // TIME-WAIT's end

	tlpAt   time.Duration // the tail loss probe timer (tlp.go); 0: stopped
	tlpOut  bool          // a probe is outstanding
	tlpHigh seqnum.Value  // SND.MAX when it went
	tlpSeq  seqnum.Value  // where the probe's data starts
	// lostFloor, while floorOn: everything not SACKed below it is lost
	// (a recovery the probe's SACK started).
	lostFloor seqnum.Value
	floorOn   bool

	lastRecv time.Duration // when the peer's latest segment came
	// unackedSince is when the oldest data in flight was sent or the
	// peer last acknowledged some (Config.UserTimeout).
	unackedSince time.Duration
	kaAt         time.Duration // the keepalive timer; 0: stopped
	kaProbes     int           // probes unanswered

	// lastOOWAck is when the latest ACK answering an unacceptable
	// segment without data, or a challenge ACK, went out (ackOOW).
	lastOOWAck time.Duration
	oowAcked   bool

	n counters

	seg     Segment // the segment being sent
	joined  []byte  // a payload in several blocks, joined for Payload
	sackOut [maxSACKBlocks]header.SACKBlock
}

// counters are what Info reports of a connection's history.
type counters struct {
	segsOut, segsIn       uint64
	retransSegs, retrans  uint64 // segments and bytes sent again
	timeouts, recoveries  uint64
	undos                 uint64
	tlps                  uint64
	lostRtx               uint64 // retransmissions found lost and sent again
	rackLost              uint64 // transmissions RACK found lost
	reoTimeouts           uint64 // reorder timer expiries
	dsacksIn, dsacksOut   uint64
	bytesAcked, bytesRcvd uint64
}

// Info is a connection's state as `ss -ti` shows a Linux socket's.
type Info struct {
	State State
	// RecvQ is bytes received in order and not read; SendQ bytes written
	// and not acknowledged, sent or not.
	RecvQ, SendQ     int
	RTT, RTTVar, RTO time.Duration
	SndMSS, RcvMSS   int
	Cwnd, Ssthresh   int // bytes
	SndWnd, RcvWnd   int // bytes: the peer's window, and the one advertised
	InFlight, SACKed int // bytes sent and not acknowledged; of them, SACKed
	SndWScale        int // -1: no window scaling
	RcvWScale        int
	Timestamps, SACK bool
	InRecovery       bool
	SegsOut, SegsIn  uint64 // segments, as the link cuts a GSO packet (Linux's segs_out, segs_in)
	RetransSegs      uint64 // segments sent again (a GSO packet counts its segments)
	RetransBytes     uint64
	Timeouts         uint64 // retransmission timeouts
	Recoveries       uint64 // fast retransmits and SACK recoveries entered
	Undos            uint64 // reductions undone: D-SACKs showed them spurious
	TLPs             uint64 // tail loss probes sent
	LostRetransmits  uint64 // retransmissions found lost and sent again
	DSACKsIn         uint64 // D-SACK blocks the peer sent: duplicates it got
	DSACKsOut        uint64 // D-SACK blocks sent
	BytesAcked       uint64 // by the peer
	BytesReceived    uint64 // in order
	// InErrs is segments dropped for a bad header or checksum before a
	// connection saw them (Linux's TcpInErrs): Protocol.Stats only.
	InErrs uint64

	// CongestionControl is "cubic" or "reno" (Config.CongestionControl).
	CongestionControl string
	RACKLost          uint64 // transmissions RACK found lost by time (RFC 8985)
	ReorderTimeouts   uint64 // RACK's reorder timer expiries
	// MinRTT is the least RTT RACK measured, ReorderWindow its
	// reordering window now, ReorderSeen whether it has seen the network
	// reorder segments.
	MinRTT, ReorderWindow time.Duration
	ReorderSeen           bool
}

// addCounters adds the counters of o to i.
func (i *Info) addCounters(o Info) {
	i.SegsOut += o.SegsOut
	i.SegsIn += o.SegsIn
	i.RetransSegs += o.RetransSegs
	i.RetransBytes += o.RetransBytes
	i.Timeouts += o.Timeouts
	i.Recoveries += o.Recoveries
	i.Undos += o.Undos
	i.TLPs += o.TLPs
	i.LostRetransmits += o.LostRetransmits
	i.RACKLost += o.RACKLost
	i.ReorderTimeouts += o.ReorderTimeouts
	i.DSACKsIn += o.DSACKsIn
	i.DSACKsOut += o.DSACKsOut
	i.BytesAcked += o.BytesAcked
	i.BytesReceived += o.BytesReceived
}

// Info reports the connection's state.
func (c *Conn) Info() Info {
	i := Info{State: c.state, RecvQ: c.rcvBuf.len(), SendQ: c.sndBuf.len(), RTT: c.rtt.srtt, RTTVar: c.rtt.rttvar, RTO: c.rtt.rto,
		SndMSS: c.sndMSS, RcvMSS: c.cfg.MSS, Cwnd: c.cwnd, Ssthresh: c.ssthresh,
		SndWnd: c.sndWnd, InFlight: int(c.sndUna.Size(c.sndMax)), SACKed: c.sackedBytes(),
		SndWScale: -1, RcvWScale: -1, Timestamps: c.tsOK, SACK: c.sackOK, InRecovery: c.inRecovery,
		SegsOut: c.n.segsOut, SegsIn: c.n.segsIn, RetransSegs: c.n.retransSegs, RetransBytes: c.n.retrans,
		Timeouts: c.n.timeouts, Recoveries: c.n.recoveries, Undos: c.n.undos, TLPs: c.n.tlps, LostRetransmits: c.n.lostRtx,
		RACKLost: c.n.rackLost, ReorderTimeouts: c.n.reoTimeouts, CongestionControl: c.ccName(),
		MinRTT: c.rack.minRTT, ReorderWindow: c.rackReoWnd(), ReorderSeen: c.rack.reordered, DSACKsIn: c.n.dsacksIn, DSACKsOut: c.n.dsacksOut,
		BytesAcked: c.n.bytesAcked, BytesReceived: c.n.bytesRcvd}
	if c.ssthresh >= 1<<30 {
		i.Ssthresh = 0 // not set yet: slow start
	}
	if c.rcvNxt.LessThan(c.rcvAdvEnd) {
		i.RcvWnd = int(c.rcvNxt.Size(c.rcvAdvEnd))
	}
	if c.wsOK {
		i.SndWScale, i.RcvWScale = int(c.sndShift), int(c.rcvShift)
	}
	return i
}

type oooSeg struct {
	seq  seqnum.Value
	data []byte
}

func (o *oooSeg) end() seqnum.Value { return o.seq.Add(seqnum.Size(len(o.data))) }

func newConn(cfg Config, out func(*Segment), now time.Duration, iss seqnum.Value, tsOffset uint32) *Conn {
	cfg = cfg.withDefaults()
	c := &Conn{cfg: cfg, out: out, now: now, iss: iss, tsOffset: tsOffset}
	c.sndUna, c.sndNxt, c.sndMax = iss, iss, iss
	c.recover = iss // RFC 6582 §3.2
	c.highRxt, c.undoStart, c.undoEnd = iss, iss, iss
	c.rtt = newRTTEstimator(cfg.InitialRTO, cfg.MinRTO, cfg.MaxRTO)
	if !cfg.NoWindowScale {
		for c.rcvShift < 14 && cfg.RcvBuf > 0xffff<<c.rcvShift {
			c.rcvShift++
		}
	}
	c.sndMSS = 536 // RFC 9293 §3.7.1, until the peer's MSS option says more
	return c
}

// Dial starts an active open: the SYN goes out now.
func Dial(cfg Config, out func(*Segment), now time.Duration, iss seqnum.Value, tsOffset uint32) *Conn {
	c := newConn(cfg, out, now, iss, tsOffset)
	c.state = SynSent
	c.sendSyn()
	return c
}

// Accept starts a passive open from a listener's SYN: the SYN-ACK goes
// out now. syn must carry SYN and neither ACK nor RST (the listener's
// checks, RFC 9293 §3.10.7.2).
func Accept(cfg Config, out func(*Segment), syn *Segment, now time.Duration, iss seqnum.Value, tsOffset uint32) *Conn {
	c := newConn(cfg, out, now, iss, tsOffset)
	c.state = SynReceived
	c.takeSyn(syn)
	c.sendSyn()
	return c
}

// ResetFor is the RST that answers seg when no connection takes it (RFC
// 9293 §3.10.7.1), or false for a segment that is itself a RST.
func ResetFor(seg *Segment) (Segment, bool) {
	if seg.has(header.TCPFlagRst) {
		return Segment{}, false
	}
	if seg.has(header.TCPFlagAck) {
		return Segment{Seq: seg.Ack, Flags: header.TCPFlagRst, WS: -1}, true
	}
	return Segment{Ack: seg.Seq.Add(seg.Len()), Flags: header.TCPFlagRst | header.TCPFlagAck, WS: -1}, true
}

// State is the connection's state.
func (c *Conn) State() State { return c.state }

// Err is why the connection closed, nil while it is open or after a
// clean close.
func (c *Conn) Err() error { return c.err }

// Readable is how many bytes Read can return now.
func (c *Conn) Readable() int { return c.rcvBuf.len() }

// EOF reports whether the peer's FIN has arrived and every byte before it
// has been read.
func (c *Conn) EOF() bool { return c.finRcvd && c.rcvBuf.len() == 0 }

// Writable is how many bytes Write takes now.
func (c *Conn) Writable() int {
	if c.finQueued || !c.canSend() {
		return 0
	}
	return c.cfg.SndBuf - c.sndBuf.len()
}

// writeErr is why a write cannot queue bytes, nil when it can.
func (c *Conn) writeErr() error {
	switch {
	case c.err != nil:
		return c.err
	case c.finQueued:
		return ErrClosed
	case !c.canSend():
		return ErrState
	}
	return nil
}

func (c *Conn) canSend() bool {
	return c.state == Established || c.state == CloseWait
}

// Write queues bytes to send and sends what the windows allow; it takes
// as many as the send buffer has room for.
func (c *Conn) Write(p []byte, now time.Duration) (int, error) {
	c.now = now
	if err := c.writeErr(); err != nil {
		return 0, err
	}
	n := min(len(p), c.cfg.SndBuf-c.sndBuf.len())
	c.sndBuf.write(p[:n])
	c.marks.partial = false
	c.output()
	return n, nil
}

// Read takes in-order bytes out of the receive buffer. It returns io.EOF
// once the peer's FIN has come and everything before it has been read,
// the connection's error if it failed, and 0, nil when nothing is there
// yet.
func (c *Conn) Read(p []byte, now time.Duration) (int, error) {
	c.now = now
	if c.rcvBuf.len() == 0 {
		return 0, c.readErr()
	}
	before := c.rcvWindow()
	n := c.rcvBuf.read(p)
	c.windowOpened(before)
	return n, nil
}

// readErr is what a read of an empty receive buffer returns.
func (c *Conn) readErr() error {
	switch {
	case c.err != nil:
		return c.err
	case c.finRcvd:
		return io.EOF
	}
	return nil
}

// windowOpened sends a window update when reading opened the window by
// two segments or by half the buffer (RFC 9293 §3.8.6.2.2).
func (c *Conn) windowOpened(before int) {
	if after := c.rcvWindow(); c.state.synchronized() && after-before >= min(2*c.cfg.MSS, c.cfg.RcvBuf/2) {
		c.ackNow = true
		c.output()
	}
}

// ReadView returns the first in-order bytes not read yet, in the
// connection's own memory (the receive buffer's first piece: see
// recvQueue), and the error a read would return when there are none.
// The bytes stay where they are until ReadDone, whatever arrives in
// between: a reader may consume them without the connection's caller
// holding its lock, and without a copy. The caller makes no other read
// before ReadDone.
func (c *Conn) ReadView() ([]byte, error) {
	if c.rcvBuf.len() == 0 {
		return nil, c.readErr()
	}
	c.rcvBuf.pinned = true
	return c.rcvBuf.front(), nil
}

// ReadDone ends a ReadView: the first n of its bytes are read.
func (c *Conn) ReadDone(n int, now time.Duration) {
	before := c.rcvWindow()
	c.readDone(n, now)
	c.windowOpened(before)
}

// readDone is ReadDone without the window update: a reader that takes
// several views in a row sends one after the last (windowOpened).
func (c *Conn) readDone(n int, now time.Duration) {
	c.now = now
	if !c.rcvBuf.pinned {
		return
	}
	c.rcvBuf.pinned = false
	c.rcvBuf.drop(min(max(n, 0), c.rcvBuf.len()))
}

// fill reads up to n bytes from r straight onto the send buffer's end.
func (c *Conn) fill(r io.Reader, n int) (int, error) {
	return c.sndBuf.fill(r, n)
}

// WriteFrom is Write of up to n bytes read from r straight into the send
// buffer; an error of r's ends it, with the bytes r gave queued. rec,
// when not nil, tells where the records r produces end (Records).
func (c *Conn) WriteFrom(r io.Reader, n int, rec Records, now time.Duration) (int, error) {
	c.now = now
	if err := c.writeErr(); err != nil {
		return 0, err
	}
	n = min(n, c.cfg.SndBuf-c.sndBuf.len())
	if n <= 0 {
		return 0, nil
	}
	var k int
	var err error
	if rec != nil {
		k, err = c.writeRecords(r, n, rec)
	} else {
		k, err = c.fill(r, n)
		c.marks.partial = false
	}
	if k > 0 {
		c.output()
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return k, err
}

// Close sends a FIN after the data queued: the connection half-closes and
// ends once the peer has closed too.
func (c *Conn) Close(now time.Duration) {
	c.now = now
	switch c.state {
	case SynSent, Closed:
		c.enterClosed(nil)
		return
	case SynReceived, Established, CloseWait:
		if !c.finQueued {
			c.finQueued = true
			c.marks.partial = false // no rest is coming
			c.output()
		}
	}
}

// Abort resets the connection: a RST goes out (in a state that has a peer
// to tell) and it closes with ErrAborted.
func (c *Conn) Abort(now time.Duration) {
	c.now = now
	c.reset(ErrAborted)
}

// reset sends a RST (in a state that has a peer to tell) and closes with
// err.
func (c *Conn) reset(err error) {
	if c.state != Closed && c.state != SynSent && c.state != TimeWait {
		c.seg = Segment{Seq: c.sndNxt, Flags: header.TCPFlagRst, WS: -1}
		c.out(&c.seg)
	}
	c.enterClosed(err)
}

// Deadline is when Tick next has work to do, or 0 when no timer runs.
func (c *Conn) Deadline() time.Duration {
	d := time.Duration(0)
	for _, t := range [...]time.Duration{c.rtoAt, c.ackAt, c.twAt, c.kaAt, c.tlpAt, c.rack.at} {
		if t != 0 && (d == 0 || t < d) {
			d = t
		}
	}
	return d
}

// Tick runs the timers that are due at now.
func (c *Conn) Tick(now time.Duration) {
	c.now = now
	if c.twAt != 0 && now >= c.twAt {
		c.enterClosed(nil)
		return
	}
	if c.rtoAt != 0 && now >= c.rtoAt {
		c.rtoAt = 0
		c.onRTO()
	}
	if c.ackAt != 0 && now >= c.ackAt {
		c.ackAt = 0
		c.ackNow = true
	}
	if c.kaAt != 0 && now >= c.kaAt {
		c.kaAt = 0
		c.keepalive()
	}
	if c.tlpAt != 0 && now >= c.tlpAt && c.state != Closed {
		c.tlpAt = 0
		c.onTLP()
	}
	if c.rack.at != 0 && now >= c.rack.at && c.state != Closed {
		c.rack.at = 0
		c.onReorderTimer()
	}
	c.output()
	c.armKeepalive()
}

// armKeepalive sets the keepalive timer: KeepaliveIdle after the peer's
// latest segment, or KeepaliveInterval after the latest probe.
func (c *Conn) armKeepalive() {
	if c.cfg.KeepaliveIdle <= 0 || !c.state.synchronized() || c.state == TimeWait {
		c.kaAt = 0
		return
	}
	if c.kaProbes == 0 {
		c.kaAt = c.lastRecv + c.cfg.KeepaliveIdle
	} else if c.kaAt == 0 {
		c.kaAt = c.now + c.cfg.KeepaliveInterval
	}
}

// keepalive runs when the keepalive timer fires: with data in flight the
// retransmission timer watches the peer instead; otherwise a probe goes
// (a segment one before sndUna, which the peer answers with an ACK), or,
// after KeepaliveCount unanswered ones, the connection ends.
func (c *Conn) keepalive() {
	if c.sndUna != c.sndMax || c.now < c.lastRecv+c.cfg.KeepaliveIdle {
		return
	}
	if c.kaProbes >= c.cfg.KeepaliveCount {
		c.reset(ErrTimeout)
		return
	}
	c.kaProbes++
	s := c.header(c.sndUna - 1)
	c.out(s)
	c.kaAt = c.now + c.cfg.KeepaliveInterval
}

func (c *Conn) enterClosed(err error) {
	c.state = Closed
	if c.err == nil {
		c.err = err
	}
	c.rtoAt, c.ackAt, c.twAt, c.kaAt, c.tlpAt, c.rack.at = 0, 0, 0, 0, 0, 0
	c.ooo, c.oooBytes = nil, 0
	c.sndBuf.release() // nothing is sent again: the blocks go back
	c.joined = nil
}

func (c *Conn) enterTimeWait() {
	c.state = TimeWait
	c.rtoAt, c.ackAt, c.rack.at = 0, 0, 0
	c.twAt = c.now + c.cfg.TimeWait
}

// tsVal is our timestamp clock: milliseconds (RFC 7323 §5.4 wants ticks
// of 1 ms to 1 s), from a per-connection offset.
func (c *Conn) tsVal() uint32 { return uint32(c.now/time.Millisecond) + c.tsOffset }

// takeSyn records what the peer's SYN (or SYN-ACK) says of it.
func (c *Conn) takeSyn(s *Segment) {
	c.irs = s.Seq
	c.rcvNxt = s.Seq.Add(1)
	c.lastAck = c.rcvNxt
	c.lastRecv = c.now
	mss := 536
	if s.MSS != 0 {
		mss = int(s.MSS)
	}
	c.sndMSS = max(min(mss, c.cfg.MSS), 64)
	c.wsOK = s.WS >= 0 && !c.cfg.NoWindowScale
	if c.wsOK {
		c.sndShift = uint8(min(s.WS, 14))
	} else {
		c.sndShift, c.rcvShift = 0, 0
	}
	c.tsOK = s.TS && !c.cfg.NoTimestamps
	if c.tsOK {
		c.tsRecent = s.TSVal
		c.sndMSS -= 12 // the timestamp option every segment carries
	}
	c.sackOK = s.SACKPermitted && !c.cfg.NoSACK
	c.sndWnd = int(s.Window) // a SYN's window is never scaled
	c.maxSndWnd = c.sndWnd
	c.sndWl1, c.sndWl2 = s.Seq, s.Ack
	// The window our SYN or SYN-ACK advertised (never scaled) counts
	// from the peer's first byte.
	c.rcvAdvEnd = c.rcvNxt.Add(seqnum.Size(min(c.cfg.RcvBuf, 0xffff)))
	c.cwnd = 10 * c.sndMSS // RFC 6928
	c.ssthresh = 1 << 30
}

// sendSyn sends (or resends) our SYN, or SYN-ACK in SYN-RECEIVED.
func (c *Conn) sendSyn() {
	s := &c.seg
	*s = Segment{Seq: c.iss, Flags: header.TCPFlagSyn, WS: -1, MSS: uint16(c.cfg.MSS)}
	active := c.state == SynSent
	if c.state == SynReceived {
		s.Flags |= header.TCPFlagAck
		s.Ack = c.rcvNxt
	}
	// An active open offers every option; a passive one answers with
	// those the peer offered.
	if !c.cfg.NoWindowScale && (active || c.wsOK) {
		s.WS = int(c.rcvShift)
	}
	if !c.cfg.NoTimestamps && (active || c.tsOK) {
		s.TS, s.TSVal, s.TSEcr = true, c.tsVal(), c.tsRecent
	}
	if !c.cfg.NoSACK && (active || c.sackOK) {
		s.SACKPermitted = true
	}
	s.Window = uint16(min(c.cfg.RcvBuf, 0xffff))
	c.rcvAdvEnd = c.rcvNxt.Add(seqnum.Size(s.Window))
	if c.sndNxt == c.iss {
		c.sndNxt = c.iss.Add(1)
		c.sndMax = c.sndNxt
	}
	if c.rtoAt == 0 {
		c.rtoAt = c.now + c.rtt.backedOff(c.backoff)
	}
	if c.backoff == 0 {
		c.timing, c.timedSeq, c.timedAt = true, c.iss.Add(1), c.now
	}
	c.out(s)
}
