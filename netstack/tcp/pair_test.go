package tcp

import (
	"bytes"
	"container/heap"
	"fmt"
	"io"
	"math/rand"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/seqnum"
)

// A simulated path between two connections: every segment is encoded and
// parsed again (the codec sees all traffic), and is lost, duplicated or
// delayed by chance, on a virtual clock.
type path struct {
	t       *testing.T
	now     time.Duration
	rng     *rand.Rand
	loss    float64
	dup     float64
	jitter  time.Duration // extra delay up to this: reordering
	delay   time.Duration
	q       flights
	seq     int
	conns   [2]*Conn
	sent    [2]int // segments each side sent
	dropped int
	// wake, when ahead, is a time the application acts at: step stops
	// there.
	wake time.Duration
	// drop, if set, decides a segment's fate before chance does.
	drop func(from int, s *Segment) bool
}

type flight struct {
	at   time.Duration
	n    int // FIFO among equal times
	to   int
	wire []byte
}

type flights []flight

func (f flights) Len() int { return len(f) }
func (f flights) Less(i, j int) bool {
	return f[i].at < f[j].at || f[i].at == f[j].at && f[i].n < f[j].n
}
func (f flights) Swap(i, j int) { f[i], f[j] = f[j], f[i] }
func (f *flights) Push(x any)   { *f = append(*f, x.(flight)) }
func (f *flights) Pop() any {
	old := *f
	x := old[len(old)-1]
	*f = old[:len(old)-1]
	return x
}

func newPath(t *testing.T, seed int64) *path {
	return &path{t: t, rng: rand.New(rand.NewSource(seed)), delay: 50 * time.Microsecond}
}

// out is side from's output function.
func (p *path) out(from int) func(*Segment) {
	return func(s *Segment) {
		p.sent[from]++
		if p.drop != nil && p.drop(from, s) || p.rng.Float64() < p.loss {
			p.dropped++
			return
		}
		b := make([]byte, s.HeaderLen()+len(s.Payload))
		hl := s.Encode(b, 1000, 2000)
		if hl != s.HeaderLen() {
			p.t.Fatalf("Encode wrote %d header bytes, HeaderLen says %d", hl, s.HeaderLen())
		}
		copy(b[hl:], s.Payload)
		n := 1
		if p.rng.Float64() < p.dup {
			n = 2
		}
		for i := 0; i < n; i++ {
			at := p.now + p.delay
			if p.jitter > 0 {
				at += time.Duration(p.rng.Int63n(int64(p.jitter)))
			}
			p.seq++
			heap.Push(&p.q, flight{at: at, n: p.seq, to: 1 - from, wire: b})
		}
	}
}

// step runs the next event (a delivery or a timer) and reports whether
// there was one.
func (p *path) step() bool {
	next := time.Duration(-1)
	if len(p.q) > 0 {
		next = p.q[0].at
	}
	for _, c := range p.conns {
		if d := c.Deadline(); d != 0 && (next < 0 || d < next) {
			next = d
		}
	}
	if next < 0 {
		return false
	}
	if p.wake > p.now && p.wake < next {
		p.now = p.wake // the application's turn (a slow reader)
		return true
	}
	if next > p.now {
		p.now = next
	}
	if len(p.q) > 0 && p.q[0].at <= p.now {
		f := heap.Pop(&p.q).(flight)
		s, err := Parse(f.wire, nil)
		if err != nil {
			p.t.Fatalf("Parse of an encoded segment: %v", err)
		}
		p.conns[f.to].Input(&s, p.now)
		return true
	}
	for _, c := range p.conns {
		if d := c.Deadline(); d != 0 && d <= p.now {
			c.Tick(p.now)
		}
	}
	return true
}

// connect runs a handshake: a dials, b is accepted from a's SYN.
func (p *path) connect(ca, cb Config, issA, issB seqnum.Value) {
	p.t.Helper()
	var syn *Segment
	p.conns[0] = Dial(ca, func(s *Segment) {
		if syn == nil && p.conns[1] == nil {
			cp := *s
			syn = &cp
			return
		}
		p.out(0)(s)
	}, p.now, issA, 7)
	if syn == nil {
		p.t.Fatal("Dial sent no SYN")
	}
	p.conns[1] = Accept(cb, p.out(1), syn, p.now, issB, 1<<31)
	p.conns[0].out = p.out(0)
	for i := 0; i < 1000 && (p.conns[0].State() != Established || p.conns[1].State() != Established); i++ {
		if !p.step() {
			break
		}
	}
	if p.conns[0].State() != Established || p.conns[1].State() != Established {
		p.t.Fatalf("handshake: %v and %v", p.conns[0].State(), p.conns[1].State())
	}
}

// transfer sends n[i] bytes from side i to the other at once in both
// directions, closes each side when it has written everything, and
// checks that each side reads exactly the other's bytes and EOF.
// readEvery > 0 makes the readers slow: they read only every so often.
func (p *path) transfer(n [2]int, readEvery time.Duration) {
	p.t.Helper()
	var src [2][]byte
	for i := range src {
		src[i] = make([]byte, n[i])
		p.rng.Read(src[i])
	}
	var wrote [2]int
	var got [2]bytes.Buffer
	var eof, closed [2]bool
	buf := make([]byte, 64<<10)
	lastRead := time.Duration(0)
	for steps := 0; ; steps++ {
		if steps > 20_000_000 {
			p.t.Fatalf("no end after %d steps at %v: states %v %v, wrote %v, read %d %d", steps, p.now,
				p.conns[0].State(), p.conns[1].State(), wrote, got[0].Len(), got[1].Len())
		}
		for i, c := range p.conns {
			for !closed[i] && wrote[i] < n[i] && c.Writable() > 0 {
				k, err := c.Write(src[i][wrote[i]:], p.now)
				if err != nil {
					p.t.Fatalf("side %d Write: %v", i, err)
				}
				wrote[i] += k
			}
			if !closed[i] && wrote[i] == n[i] {
				c.Close(p.now)
				closed[i] = true
			}
			if readEvery == 0 || p.now-lastRead >= readEvery {
				for !eof[i] {
					k, err := c.Read(buf, p.now)
					got[i].Write(buf[:k])
					if err == io.EOF {
						eof[i] = true
					} else if err != nil {
						p.t.Fatalf("side %d Read: %v (state %v)", i, err, c.State())
					}
					if k == 0 {
						break
					}
				}
			}
		}
		if readEvery > 0 && p.now-lastRead >= readEvery {
			lastRead = p.now
		}
		if readEvery > 0 {
			p.wake = lastRead + readEvery
		}
		if eof[0] && eof[1] && done(p.conns[0]) && done(p.conns[1]) {
			break
		}
		if !p.step() {
			if readEvery > 0 {
				p.now += readEvery // only the slow readers are left to act
				continue
			}
			p.t.Fatalf("stalled at %v: states %v %v, wrote %v, read %d %d, eof %v", p.now,
				p.conns[0].State(), p.conns[1].State(), wrote, got[0].Len(), got[1].Len(), eof)
		}
	}
	for i := range src {
		if !bytes.Equal(got[1-i].Bytes(), src[i]) {
			p.t.Fatalf("side %d read %d bytes, not the %d side %d wrote (first difference at %d)",
				1-i, got[1-i].Len(), n[i], i, firstDiff(got[1-i].Bytes(), src[i]))
		}
	}
	for i, c := range p.conns {
		if c.Err() != nil {
			p.t.Fatalf("side %d ended with %v", i, c.Err())
		}
	}
}

func done(c *Conn) bool { return c.State() == Closed || c.State() == TimeWait }

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestTransfer moves data both ways at once over clean, lossy,
// reordering and duplicating paths, with and without options, and across
// the wrap of the sequence space; every byte is checked and both ends
// close cleanly.
func TestTransfer(t *testing.T) {
	type tc struct {
		name       string
		loss, dup  float64
		jitter     time.Duration
		ca, cb     Config
		issA, issB seqnum.Value
		n          [2]int
		readEvery  time.Duration
	}
	small := Config{RcvBuf: 8 << 10, SndBuf: 8 << 10, MSS: 1000}
	bare := Config{NoSACK: true, NoTimestamps: true, NoWindowScale: true}
	cases := []tc{
		{name: "clean", n: [2]int{1 << 20, 300 << 10}},
		{name: "one way", n: [2]int{2 << 20, 0}},
		{name: "empty", n: [2]int{0, 0}},
		{name: "loss 1%", loss: 0.01, n: [2]int{1 << 20, 200 << 10}},
		{name: "loss 10%", loss: 0.10, n: [2]int{200 << 10, 100 << 10}},
		{name: "reorder", jitter: 200 * time.Microsecond, n: [2]int{1 << 20, 1 << 20}},
		{name: "duplicates", dup: 0.2, n: [2]int{500 << 10, 500 << 10}},
		{name: "everything", loss: 0.03, dup: 0.05, jitter: 150 * time.Microsecond, n: [2]int{500 << 10, 300 << 10}},
		{name: "wrap", issA: 0xffffffff - 5000, issB: 0xfffffff0, n: [2]int{300 << 10, 300 << 10}},
		{name: "no options", ca: bare, cb: bare, loss: 0.02, n: [2]int{300 << 10, 100 << 10}},
		{name: "options one side", ca: bare, loss: 0.02, jitter: 100 * time.Microsecond, n: [2]int{300 << 10, 100 << 10}},
		{name: "small buffers", ca: small, cb: small, loss: 0.02, n: [2]int{200 << 10, 200 << 10}},
		{name: "slow reader", ca: small, cb: small, n: [2]int{100 << 10, 10 << 10}, readEvery: 3 * time.Millisecond},
		{name: "slow reader lossy", ca: small, cb: small, loss: 0.05, n: [2]int{60 << 10, 10 << 10}, readEvery: 2 * time.Millisecond},
	}
	for _, c := range cases {
		for seed := int64(1); seed <= 8; seed++ {
			t.Run(fmt.Sprintf("%s/%d", c.name, seed), func(t *testing.T) {
				p := newPath(t, seed)
				p.connect(c.ca, c.cb, c.issA, c.issB)
				p.loss, p.dup, p.jitter = c.loss, c.dup, c.jitter
				start := p.now
				p.transfer(c.n, c.readEvery)
				t.Logf("%v of virtual time, %d and %d segments sent, %d lost", p.now-start, p.sent[0], p.sent[1], p.dropped)
			})
		}
	}
}

// TestHandshakeLoss: SYNs and SYN-ACKs lost on the way are sent again
// and the connection opens.
func TestHandshakeLoss(t *testing.T) {
	p := newPath(t, 1)
	lost := map[int]int{}
	p.drop = func(from int, s *Segment) bool {
		if s.has(header.TCPFlagSyn) && lost[from] < 2 {
			lost[from]++
			return true
		}
		return false
	}
	p.connect(Config{}, Config{}, 100, 200)
	if lost[1] != 2 {
		t.Fatalf("SYN-ACKs lost: %d, want 2", lost[1])
	}
	p.drop = nil
	p.transfer([2]int{10 << 10, 10 << 10}, 0)
}

// TestSynTimeout: a SYN nobody answers is sent SynRetries more times,
// backing off, and the connection fails with ErrTimeout.
func TestSynTimeout(t *testing.T) {
	var sent []time.Duration
	now := time.Duration(0)
	c := Dial(Config{SynRetries: 3, InitialRTO: time.Second}, func(s *Segment) {
		if !s.has(header.TCPFlagSyn) {
			t.Fatalf("sent %v", s)
		}
		sent = append(sent, now)
	}, now, 1, 0)
	for c.State() != Closed {
		now = c.Deadline()
		if now == 0 {
			t.Fatal("no timer while in SYN-SENT")
		}
		c.Tick(now)
	}
	want := []time.Duration{0, 1 * time.Second, 3 * time.Second, 7 * time.Second}
	if fmt.Sprint(sent) != fmt.Sprint(want) {
		t.Fatalf("SYNs at %v, want %v", sent, want)
	}
	if c.Err() != ErrTimeout || now != 15*time.Second {
		t.Fatalf("ended with %v at %v, want ErrTimeout at 15s", c.Err(), now)
	}
}

// TestSimultaneousOpen: two SYNs cross; both ends go through
// SYN-RECEIVED to ESTABLISHED and carry data.
func TestSimultaneousOpen(t *testing.T) {
	p := newPath(t, 1)
	p.conns[0] = Dial(Config{}, p.out(0), 0, 1000, 0)
	p.conns[1] = Dial(Config{}, p.out(1), 0, 5000, 0)
	for i := 0; i < 100 && !(p.conns[0].State() == Established && p.conns[1].State() == Established); i++ {
		p.step()
	}
	if p.conns[0].State() != Established || p.conns[1].State() != Established {
		t.Fatalf("states %v %v", p.conns[0].State(), p.conns[1].State())
	}
	p.transfer([2]int{50 << 10, 50 << 10}, 0)
}

// TestHalfClose: one side closes at once and goes on reading everything
// the other sends before it closes too.
func TestHalfClose(t *testing.T) {
	p := newPath(t, 1)
	p.connect(Config{}, Config{}, 1, 2)
	p.transfer([2]int{0, 1 << 20}, 0)
}

// TestTimeWait: the side that closes first waits in TIME-WAIT, answers a
// FIN sent again there with its ACK, and closes when the wait is over.
func TestTimeWait(t *testing.T) {
	p := newPath(t, 1)
	p.connect(Config{TimeWait: time.Second}, Config{}, 1, 2)
	p.transfer([2]int{1000, 1 << 20}, 0)
	a, b := p.conns[0], p.conns[1]
	if a.State() != TimeWait || b.State() != Closed {
		t.Fatalf("states %v %v, want TIME-WAIT and CLOSED", a.State(), b.State())
	}
	var acks int
	fin := Segment{Seq: b.sndMax - 1, Ack: a.sndMax, Flags: header.TCPFlagFin | header.TCPFlagAck, WS: -1}
	if b.tsOK {
		fin.TS, fin.TSVal, fin.TSEcr = true, a.tsRecent, 0
	}
	a.out = func(s *Segment) {
		if s.Flags != header.TCPFlagAck || s.Ack != a.rcvNxt {
			t.Fatalf("TIME-WAIT answered the FIN with %v", s)
		}
		acks++
	}
	at := p.now + 500*time.Millisecond
	a.Input(&fin, at)
	if acks != 1 || a.Deadline() != at+time.Second {
		t.Fatalf("after a FIN again: %d ACKs, deadline %v, want 1 and %v", acks, a.Deadline(), at+time.Second)
	}
	a.Tick(at + time.Second)
	if a.State() != Closed || a.Err() != nil {
		t.Fatalf("after TIME-WAIT: %v, %v", a.State(), a.Err())
	}
}

// TestSegmentCounts: the counters count segments as Linux's segs_out and
// segs_in do, a GSO packet as the segments the link cuts it into and a
// large packet taken whole as the segments it holds, not as one.
func TestSegmentCounts(t *testing.T) {
	p := newPath(t, 1)
	cfg := Config{GSOMax: 64 << 10, SndBuf: 1 << 20, RcvBuf: 1 << 20}
	p.connect(cfg, cfg, 1, 2)
	const n = 4 << 20
	p.transfer([2]int{n, 0}, 0)
	s, r := p.conns[0].Info(), p.conns[1].Info()
	min := uint64(n / s.SndMSS)
	if s.SegsOut < min || r.SegsIn < min {
		t.Fatalf("%d bytes in segments of %d: sender counted %d out, receiver %d in; want %d at least", n, s.SndMSS, s.SegsOut, r.SegsIn, min)
	}
	if uint64(p.sent[0]) >= s.SegsOut {
		t.Fatalf("the sender sent %d packets for %d segments: no GSO packet", p.sent[0], s.SegsOut)
	}
	if s.RetransSegs != 0 {
		t.Fatalf("%d segments counted as sent again on a lossless path", s.RetransSegs)
	}
}
