package tcp

import (
	"bytes"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/seqnum"
)

// A scripted peer: the test crafts each segment the connection gets and
// reads what it answers.
type scripted struct {
	t    *testing.T
	c    *Conn
	now  time.Duration
	sent []Segment // what the connection sent, copied
	// the peer's side of the sequence space
	seq seqnum.Value // the peer's next sequence number
}

func (p *scripted) out(s *Segment) {
	cp := *s
	cp.Payload = bytes.Clone(s.Payload)
	cp.SACK = append([]header.SACKBlock(nil), s.SACK...)
	p.sent = append(p.sent, cp)
}

// take returns what the connection sent since the last take.
func (p *scripted) take() []Segment {
	s := p.sent
	p.sent = nil
	return s
}

const peerISS = seqnum.Value(0x7fff_fff0)

// established opens a connection passively from a crafted SYN (no
// options unless opts adds them) and completes the handshake.
func established(t *testing.T, cfg Config, opts func(*Segment)) *scripted {
	t.Helper()
	p := &scripted{t: t}
	syn := Segment{Seq: peerISS, Flags: header.TCPFlagSyn, Window: 65535, WS: -1, MSS: 1460}
	if opts != nil {
		opts(&syn)
	}
	p.c = Accept(cfg, p.out, &syn, p.now, 1000, 0)
	sa := p.take()
	if len(sa) != 1 || sa[0].Flags != header.TCPFlagSyn|header.TCPFlagAck || sa[0].Ack != peerISS+1 {
		t.Fatalf("SYN answered with %v", sa)
	}
	p.seq = peerISS + 1
	p.input(Segment{Seq: p.seq, Ack: 1001, Flags: header.TCPFlagAck, Window: 65535})
	if p.c.State() != Established {
		t.Fatalf("after the handshake: %v", p.c.State())
	}
	if s := p.take(); len(s) != 0 {
		t.Fatalf("the handshake's ACK answered with %v", s)
	}
	return p
}

func (p *scripted) input(s Segment) {
	if s.WS == 0 {
		s.WS = -1
	}
	p.c.Input(&s, p.now)
}

// wantOnly fails unless the connection sent exactly one segment, a pure
// ACK of ack, and returns it.
func (p *scripted) wantACK(what string, ack seqnum.Value) Segment {
	p.t.Helper()
	s := p.take()
	if len(s) != 1 || s[0].Flags != header.TCPFlagAck || s[0].Ack != ack || len(s[0].Payload) != 0 {
		p.t.Fatalf("%s: sent %v, want one ACK of %d", what, s, ack)
	}
	return s[0]
}

func (p *scripted) wantNothing(what string) {
	p.t.Helper()
	if s := p.take(); len(s) != 0 {
		p.t.Fatalf("%s: sent %v, want nothing", what, s)
	}
}

func (p *scripted) ack() seqnum.Value { return p.c.sndNxt }

// data is the peer's next segment, in order, with n bytes.
func (p *scripted) data(n int) Segment {
	s := Segment{Seq: p.seq, Ack: p.ack(), Flags: header.TCPFlagAck, Window: 65535, Payload: make([]byte, n)}
	p.seq = p.seq.Add(seqnum.Size(n))
	return s
}

// TestRST: only a RST at exactly rcvNxt resets; one elsewhere in the
// window gets a challenge ACK, one outside it nothing (RFC 5961 §3).
func TestRST(t *testing.T) {
	p := established(t, Config{}, nil)
	p.input(Segment{Seq: p.seq + 100, Flags: header.TCPFlagRst})
	p.wantACK("a RST inside the window", p.seq)
	p.input(Segment{Seq: p.seq + 10_000_000, Flags: header.TCPFlagRst})
	p.wantNothing("a RST outside the window")
	p.input(Segment{Seq: p.seq - 1, Flags: header.TCPFlagRst})
	p.wantNothing("a RST just before the window")
	if p.c.State() != Established {
		t.Fatalf("after stray RSTs: %v", p.c.State())
	}
	p.input(Segment{Seq: p.seq, Flags: header.TCPFlagRst})
	if p.c.State() != Closed || p.c.Err() != ErrReset {
		t.Fatalf("after a RST at rcvNxt: %v, %v", p.c.State(), p.c.Err())
	}
	if _, err := p.c.Write([]byte("x"), p.now); err != ErrReset {
		t.Fatalf("Write after the reset: %v", err)
	}
}

// TestSYNInWindow: a SYN on an established connection (a new one from a
// restarted peer, or an attacker's) gets a challenge ACK and changes
// nothing (RFC 5961 §4).
func TestSYNInWindow(t *testing.T) {
	p := established(t, Config{}, nil)
	p.input(Segment{Seq: p.seq + 5, Flags: header.TCPFlagSyn, Window: 1000})
	p.wantACK("a SYN in the window", p.seq)
	if p.c.State() != Established || p.c.sndWnd != 65535 {
		t.Fatalf("after a SYN: %v, window %d", p.c.State(), p.c.sndWnd)
	}
}

// TestOutOfWindowData: data beyond the window or long before it is not
// taken; the connection answers with an ACK of where it is.
func TestOutOfWindowData(t *testing.T) {
	p := established(t, Config{RcvBuf: 4096}, nil)
	p.input(Segment{Seq: p.seq + 4096, Ack: p.ack(), Flags: header.TCPFlagAck, Window: 65535, Payload: []byte("beyond")})
	p.wantACK("data just beyond the window", p.seq)
	p.input(Segment{Seq: p.seq - 1000, Ack: p.ack(), Flags: header.TCPFlagAck, Window: 65535, Payload: []byte("old")})
	p.wantACK("old data", p.seq)
	if p.c.Readable() != 0 || len(p.c.ooo) != 0 {
		t.Fatalf("took %d bytes and %d runs out of order", p.c.Readable(), len(p.c.ooo))
	}
	// Data straddling the window's right edge: what lies inside is
	// taken, out of order, and the rest dropped.
	big := bytes.Repeat([]byte{7}, 5000)
	p.input(Segment{Seq: p.seq + 1, Ack: p.ack(), Flags: header.TCPFlagAck, Window: 65535, Payload: big})
	p.take()
	if p.c.oooBytes != 4095 {
		t.Fatalf("out of order: %d bytes, want the 4095 inside the window", p.c.oooBytes)
	}
}

// TestACKOfUnsentData: an ACK beyond what was sent is answered with an
// ACK and changes nothing (RFC 5961 §5.2, RFC 9293 §3.10.7.4); the data
// in flight stays in flight.
func TestACKOfUnsentData(t *testing.T) {
	p := established(t, Config{}, nil)
	if _, err := p.c.Write([]byte("hello"), p.now); err != nil {
		t.Fatal(err)
	}
	p.take()
	p.input(Segment{Seq: p.seq, Ack: p.ack() + 100, Flags: header.TCPFlagAck, Window: 65535})
	p.wantACK("an ACK of unsent data", p.seq)
	if p.c.sndUna != 1001 || p.c.sndBuf.len() != 5 {
		t.Fatalf("after a lying ACK: sndUna %d, %d bytes buffered", p.c.sndUna, p.c.sndBuf.len())
	}
	// The real ACK still works.
	p.input(Segment{Seq: p.seq, Ack: p.ack(), Flags: header.TCPFlagAck, Window: 65535})
	if p.c.sndUna != 1006 || p.c.sndBuf.len() != 0 || p.c.Deadline() != 0 {
		t.Fatalf("after the ACK: sndUna %d, %d buffered, deadline %v", p.c.sndUna, p.c.sndBuf.len(), p.c.Deadline())
	}
}

// TestOverlappingData: retransmissions that overlap what came before, in
// order and out of it, deliver each byte once and in place, and report
// the duplicates in D-SACK blocks (RFC 2883).
func TestOverlappingData(t *testing.T) {
	p := established(t, Config{}, func(s *Segment) { s.SACKPermitted = true })
	msg := []byte("0123456789abcdefghijklmnopqrstuvwxyz")
	at := func(i, j int) Segment {
		return Segment{Seq: p.seq + seqnum.Value(i), Ack: p.ack(), Flags: header.TCPFlagAck, Window: 65535, Payload: msg[i:j]}
	}
	p.input(at(20, 30))
	s := p.wantACK("a segment beyond a hole", p.seq)
	if len(s.SACK) != 1 || s.SACK[0] != (header.SACKBlock{Start: p.seq + 20, End: p.seq + 30}) {
		t.Fatalf("SACK %v", s.SACK)
	}
	p.input(at(25, 28))
	s = p.wantACK("a duplicate beyond the hole", p.seq)
	if len(s.SACK) != 2 || s.SACK[0] != (header.SACKBlock{Start: p.seq + 25, End: p.seq + 28}) {
		t.Fatalf("D-SACK: %v", s.SACK)
	}
	p.input(at(15, 22)) // overlaps the run's front
	p.input(at(28, 36)) // and its back, to the end
	p.take()
	if len(p.c.ooo) != 1 || p.c.oooBytes != 21 {
		t.Fatalf("runs %d, %d bytes; want one of 21", len(p.c.ooo), p.c.oooBytes)
	}
	p.input(at(0, 10))
	p.input(at(5, 16)) // fills the hole, overlapping both sides
	p.take()
	got := make([]byte, 100)
	n, _ := p.c.Read(got, p.now)
	if !bytes.Equal(got[:n], msg) {
		t.Fatalf("read %q, want %q", got[:n], msg)
	}
	p.input(at(0, 10))
	s = p.wantACK("old data again", p.seq+36)
	if len(s.SACK) != 1 || s.SACK[0] != (header.SACKBlock{Start: p.seq, End: p.seq + 10}) {
		t.Fatalf("D-SACK for old data: %v", s.SACK)
	}
}

// TestZeroWindow: a peer that closes its window is probed with one byte
// at growing intervals; a peer that answers the probes keeps the
// connection however long it stalls, and data flows once it opens.
func TestZeroWindow(t *testing.T) {
	p := established(t, Config{MaxRetries: 4}, nil)
	p.input(Segment{Seq: p.seq, Ack: p.ack(), Flags: header.TCPFlagAck, Window: 0})
	data := bytes.Repeat([]byte("z"), 3000)
	p.c.Write(data, p.now)
	p.wantNothing("data into a zero window")
	var gaps []time.Duration
	last := p.now
	for i := 0; i < 8; i++ {
		p.now = p.c.Deadline()
		if p.now == 0 {
			t.Fatal("no persist timer")
		}
		p.c.Tick(p.now)
		s := p.take()
		if len(s) != 1 || len(s[0].Payload) != 1 || s[0].Seq != 1001 {
			t.Fatalf("probe %d: %v", i, s)
		}
		gaps = append(gaps, p.now-last)
		last = p.now
		// The peer answers: still no room.
		p.input(Segment{Seq: p.seq, Ack: 1001, Flags: header.TCPFlagAck, Window: 0})
	}
	for i := 1; i < len(gaps); i++ {
		if gaps[i] < gaps[i-1] {
			t.Fatalf("probe intervals %v do not back off", gaps)
		}
	}
	if p.c.State() != Established {
		t.Fatalf("after 8 answered probes (MaxRetries 4): %v, %v", p.c.State(), p.c.Err())
	}
	p.input(Segment{Seq: p.seq, Ack: 1001, Flags: header.TCPFlagAck, Window: 65535})
	var got int
	for _, s := range p.take() {
		got += len(s.Payload)
	}
	if got != 3000 {
		t.Fatalf("after the window opened: %d bytes sent, want 3000", got)
	}
}

// TestUnansweredRetransmissions: data nobody acknowledges is sent again
// MaxRetries times, each after a doubled RTO, then the connection resets
// with ErrTimeout.
func TestUnansweredRetransmissions(t *testing.T) {
	p := established(t, Config{MaxRetries: 3, MinRTO: time.Millisecond}, nil)
	p.c.Write([]byte("lost"), p.now)
	p.take()
	var rsts int
	for p.c.State() != Closed {
		p.now = p.c.Deadline()
		if p.now == 0 {
			t.Fatal("no retransmission timer")
		}
		p.c.Tick(p.now)
		for _, s := range p.take() {
			if s.has(header.TCPFlagRst) {
				rsts++
			} else if string(s.Payload) != "lost" {
				t.Fatalf("retransmitted %v", s)
			}
		}
	}
	if p.c.Err() != ErrTimeout || rsts != 1 {
		t.Fatalf("ended with %v, %d RSTs", p.c.Err(), rsts)
	}
}

// TestUserTimeout: data unacknowledged for UserTimeout ends the
// connection with ErrTimeout at that time, long before MaxRetries would;
// an ACK of some of it in between starts the wait over.
func TestUserTimeout(t *testing.T) {
	const ut = 3 * time.Second
	p := established(t, Config{UserTimeout: ut, MinRTO: 200 * time.Millisecond}, nil)
	start := p.now
	p.c.Write([]byte("first"), p.now)
	p.take()
	// Half the user timeout on, the peer acknowledges it; more goes.
	for d := p.c.Deadline(); d != 0 && d < start+ut/2; d = p.c.Deadline() {
		p.now = d
		p.c.Tick(p.now)
		p.take()
	}
	p.now = start + ut/2
	p.input(Segment{Seq: p.seq, Ack: 1006, Flags: header.TCPFlagAck, Window: 65535})
	acked := p.now
	p.c.Write([]byte("second"), p.now)
	p.take()
	for p.c.State() != Closed {
		p.now = p.c.Deadline()
		if p.now == 0 {
			t.Fatal("no timer")
		}
		p.c.Tick(p.now)
		p.take()
	}
	if p.c.Err() != ErrTimeout {
		t.Fatalf("ended with %v", p.c.Err())
	}
	if d := p.now - acked; d < ut || d > ut+time.Millisecond {
		t.Fatalf("ended %v after the last ACK, want the user timeout %v", d, ut)
	}
}

// TestPAWS: a segment whose timestamp is older than the latest in order
// is dropped and answered with an ACK (RFC 7323 §5).
func TestPAWS(t *testing.T) {
	p := established(t, Config{}, func(s *Segment) { s.TS, s.TSVal = true, 1000 })
	if !p.c.tsOK {
		t.Fatal("timestamps not agreed")
	}
	p.input(Segment{Seq: p.seq, Ack: p.ack(), Flags: header.TCPFlagAck, Window: 65535, TS: true, TSVal: 2000, Payload: []byte("new")})
	p.input(Segment{Seq: p.seq + 3, Ack: p.ack(), Flags: header.TCPFlagAck, Window: 65535, TS: true, TSVal: 1500, Payload: []byte("old")})
	p.take()
	if p.c.Readable() != 3 {
		t.Fatalf("readable %d, want the 3 bytes before the old timestamp", p.c.Readable())
	}
	// Timestamps wrap: one "older" by more than 2^31 is newer.
	p.input(Segment{Seq: p.seq + 3, Ack: p.ack(), Flags: header.TCPFlagAck, Window: 65535, TS: true, TSVal: 2000 + 1<<31 - 1, Payload: []byte("wrp")})
	if p.c.Readable() != 6 {
		t.Fatalf("readable %d after a timestamp ahead by 2^31-1", p.c.Readable())
	}
}

// TestRefused: a RST answering our SYN refuses the connection; one that
// acknowledges something else is ignored.
func TestRefused(t *testing.T) {
	var sent []Segment
	c := Dial(Config{}, func(s *Segment) { sent = append(sent, *s) }, 0, 500, 0)
	c.Input(&Segment{Seq: 0, Ack: 9999, Flags: header.TCPFlagRst | header.TCPFlagAck, WS: -1}, 0)
	if c.State() != SynSent {
		t.Fatalf("a RST acknowledging another SYN: %v", c.State())
	}
	c.Input(&Segment{Seq: 0, Ack: 501, Flags: header.TCPFlagRst | header.TCPFlagAck, WS: -1}, 0)
	if c.State() != Closed || c.Err() != ErrRefused {
		t.Fatalf("after the RST: %v, %v", c.State(), c.Err())
	}
}

// TestResetFor: the RST for a segment no connection takes.
func TestResetFor(t *testing.T) {
	r, ok := ResetFor(&Segment{Seq: 10, Ack: 77, Flags: header.TCPFlagAck, Payload: []byte("abc")})
	if !ok || r.Seq != 77 || r.Flags != header.TCPFlagRst {
		t.Fatalf("for an ACK: %v", &r)
	}
	r, ok = ResetFor(&Segment{Seq: 10, Flags: header.TCPFlagSyn})
	if !ok || r.Seq != 0 || r.Ack != 11 || r.Flags != header.TCPFlagRst|header.TCPFlagAck {
		t.Fatalf("for a SYN: %v", &r)
	}
	if _, ok := ResetFor(&Segment{Flags: header.TCPFlagRst}); ok {
		t.Fatal("a RST answered with a RST")
	}
}

// TestKeepalive: an idle connection probes its peer after KeepaliveIdle
// with a segment just before sndUna; an answer keeps it, and
// KeepaliveCount probes without one end it with ErrTimeout.
func TestKeepalive(t *testing.T) {
	p := established(t, Config{KeepaliveIdle: 10 * time.Second, KeepaliveInterval: time.Second, KeepaliveCount: 3}, nil)
	start := p.now
	p.now = p.c.Deadline()
	if p.now != start+10*time.Second {
		t.Fatalf("keepalive timer at %v, want %v", p.now, start+10*time.Second)
	}
	p.c.Tick(p.now)
	s := p.wantACK("the first probe", p.seq)
	if s.Seq != p.c.sndUna-1 {
		t.Fatalf("probe numbered %d, want sndUna-1 = %d", s.Seq, p.c.sndUna-1)
	}
	// The peer answers: the idle time starts over.
	p.input(Segment{Seq: p.seq, Ack: p.ack(), Flags: header.TCPFlagAck, Window: 65535})
	p.take()
	if d := p.c.Deadline(); d != p.now+10*time.Second {
		t.Fatalf("after an answer the timer is at %v, want %v", d, p.now+10*time.Second)
	}
	// Now nobody answers: three probes a second apart, then the end.
	var probes []time.Duration
	for p.c.State() != Closed {
		p.now = p.c.Deadline()
		if p.now == 0 {
			t.Fatal("no timer")
		}
		p.c.Tick(p.now)
		for _, s := range p.take() {
			if !s.has(header.TCPFlagRst) {
				probes = append(probes, p.now)
			}
		}
	}
	if len(probes) != 3 || probes[1]-probes[0] != time.Second || p.c.Err() != ErrTimeout {
		t.Fatalf("probes at %v, then %v; want 3 a second apart, then ErrTimeout", probes, p.c.Err())
	}
}

// TestKeepaliveBetweenPeers: two idle connections with keepalive stay
// open for a virtual hour, each answering the other's probes.
func TestKeepaliveBetweenPeers(t *testing.T) {
	p := newPath(t, 1)
	cfg := Config{KeepaliveIdle: 30 * time.Second, KeepaliveInterval: 5 * time.Second, KeepaliveCount: 2}
	p.connect(cfg, cfg, 1, 2)
	for p.now < time.Hour {
		if !p.step() {
			t.Fatal("no timer on idle keepalive connections")
		}
	}
	if p.conns[0].State() != Established || p.conns[1].State() != Established {
		t.Fatalf("after an hour: %v %v (%v %v)", p.conns[0].State(), p.conns[1].State(), p.conns[0].Err(), p.conns[1].Err())
	}
	if p.sent[0] < 100 || p.sent[1] < 100 {
		t.Fatalf("probes sent: %v", p.sent)
	}
	p.transfer([2]int{1000, 1000}, 0)
}

// TestRSTInEveryState: a RST at RCV.NXT resets a connection in every
// synchronized state but TIME-WAIT (RFC 1337), and a SYN in each gets a
// challenge ACK and changes nothing.
func TestRSTInEveryState(t *testing.T) {
	// to brings an established connection to a state: by our Close, the
	// peer's FIN, or both.
	to := map[State]func(p *scripted){
		Established: func(*scripted) {},
		CloseWait: func(p *scripted) {
			p.input(Segment{Seq: p.seq, Ack: p.ack(), Flags: header.TCPFlagFin | header.TCPFlagAck, Window: 65535})
			p.seq++
		},
		FinWait1: func(p *scripted) { p.c.Close(p.now) },
		FinWait2: func(p *scripted) {
			p.c.Close(p.now)
			p.input(Segment{Seq: p.seq, Ack: p.ack(), Flags: header.TCPFlagAck, Window: 65535})
		},
		Closing: func(p *scripted) {
			p.c.Close(p.now)
			p.input(Segment{Seq: p.seq, Ack: p.ack() - 1, Flags: header.TCPFlagFin | header.TCPFlagAck, Window: 65535})
			p.seq++
		},
		LastAck: func(p *scripted) {
			p.input(Segment{Seq: p.seq, Ack: p.ack(), Flags: header.TCPFlagFin | header.TCPFlagAck, Window: 65535})
			p.seq++
			p.c.Close(p.now)
		},
		TimeWait: func(p *scripted) {
			p.c.Close(p.now)
			p.input(Segment{Seq: p.seq, Ack: p.ack(), Flags: header.TCPFlagFin | header.TCPFlagAck, Window: 65535})
			p.seq++
		},
	}
	for st, f := range to {
		t.Run(st.String(), func(t *testing.T) {
			p := established(t, Config{}, nil)
			f(p)
			if p.c.State() != st {
				t.Fatalf("reached %v, not %v", p.c.State(), st)
			}
			p.take()
			p.input(Segment{Seq: p.seq + 3, Flags: header.TCPFlagSyn, Window: 100})
			if p.c.State() != st {
				t.Fatalf("a SYN moved %v to %v", st, p.c.State())
			}
			if s := p.take(); len(s) != 1 || s[0].Flags != header.TCPFlagAck {
				t.Fatalf("a SYN in %v was answered with %v, want a challenge ACK", st, s)
			}
			p.now += time.Second // past the challenge ACKs' rate limit
			p.input(Segment{Seq: p.seq, Flags: header.TCPFlagRst})
			switch {
			case st == TimeWait && p.c.State() != TimeWait:
				t.Fatalf("a RST moved TIME-WAIT to %v", p.c.State())
			case st != TimeWait && (p.c.State() != Closed || p.c.Err() != ErrReset):
				t.Fatalf("a RST in %v: %v, %v", st, p.c.State(), p.c.Err())
			}
		})
	}
}

// TestDelayedAck: one in-order segment's ACK waits for AckDelay (or for
// a reply to ride on), and a second segment's goes at once.
func TestDelayedAck(t *testing.T) {
	p := established(t, Config{AckDelay: time.Millisecond}, nil)
	p.input(p.data(1000))
	p.wantNothing("one segment")
	if d := p.c.Deadline(); d != p.now+time.Millisecond {
		t.Fatalf("ACK timer at %v, want %v", d, p.now+time.Millisecond)
	}
	p.now = p.c.Deadline()
	p.c.Tick(p.now)
	p.wantACK("the delayed ACK", p.seq)

	p.input(p.data(1000))
	p.wantNothing("one segment")
	p.input(p.data(1000))
	p.wantACK("the second segment", p.seq)

	// A reply carries the pending ACK.
	p.input(p.data(100))
	p.wantNothing("one segment")
	p.c.Write([]byte("reply"), p.now)
	s := p.take()
	if len(s) != 1 || string(s[0].Payload) != "reply" || s[0].Ack != p.seq {
		t.Fatalf("the reply: %v, want it with the ACK of %d", s, p.seq)
	}
}

// TestLargeSegmentAcked: the ACK of a received frame that holds several
// full-sized segments (GRO) waits for the next frame only briefly
// (gsoAckDelay), where one segment's waits for AckDelay; a second frame
// is acknowledged at once.
func TestLargeSegmentAcked(t *testing.T) {
	p := established(t, Config{AckDelay: time.Millisecond}, nil)
	p.input(p.data(20 * 1448))
	p.wantNothing("a frame of 20 segments")
	if d := p.c.Deadline(); d != p.now+gsoAckDelay {
		t.Fatalf("ACK timer at %v, want %v", d, p.now+gsoAckDelay)
	}
	p.now = p.c.Deadline()
	p.c.Tick(p.now)
	p.wantACK("the frame's ACK", p.seq)
	p.input(p.data(1448))
	p.wantNothing("a frame of one segment")
	if d := p.c.Deadline(); d != p.now+time.Millisecond {
		t.Fatalf("ACK timer at %v, want %v", d, p.now+time.Millisecond)
	}
	p.input(p.data(20 * 1448))
	p.wantACK("the next frame", p.seq)
	p.input(p.data(1448))
	p.input(p.data(20 * 1448))
	p.wantACK("a large frame after a small one", p.seq)
}

// TestTSODeferral: a sender with GSO that the congestion window holds
// back answers an ACK that opens less than a third of the window with
// nothing while the next ACK is due (Linux's TSO deferral), sends once
// the room is a third of the window, does not defer when the data in
// flight went less than half an RTT ago, and never strands what is left.
func TestTSODeferral(t *testing.T) {
	sackTS := func(s *Segment) { s.SACKPermitted, s.TS, s.TSVal, s.WS = true, true, 1, 7 }
	p := established(t, Config{GSOMax: 65536, SndBuf: 4 << 20, AckDelay: time.Millisecond}, sackTS)
	mss := p.c.sndMSS
	// The scripted handshake took no time: the path's RTT is 100 µs.
	p.c.rtt.srtt = 100 * time.Microsecond
	ack := func(n int) int {
		p.input(Segment{Seq: p.seq, Ack: p.c.sndUna.Add(seqnum.Size(n)), Flags: header.TCPFlagAck, Window: 65535, TS: true, TSVal: 2, TSEcr: p.c.tsVal()})
		sent := 0
		for _, s := range p.take() {
			sent += len(s.Payload)
		}
		return sent
	}
	if _, err := p.c.Write(make([]byte, 1<<20), p.now); err != nil {
		t.Fatal(err)
	}
	if s := p.take(); len(s) != 1 || len(s[0].Payload) != 10*mss {
		t.Fatalf("the initial window: %v, want one GSO packet of %d bytes", s, 10*mss)
	}
	// The first ACK comes an RTT (100 µs) later: it opens one segment
	// and slow start another, less than a third of the 11-segment window.
	p.now += 100 * time.Microsecond
	if n := ack(mss); n != 0 {
		t.Fatalf("an ACK that opened 2 of %d segments: sent %d bytes, want none", p.c.cwnd/mss, n)
	}
	// The next opens 4 more: 6 of 13 segments.
	if n := ack(2 * mss); n != 6*mss {
		t.Fatalf("an ACK that opened a third of the window: sent %d bytes, want %d", n, 6*mss)
	}
	// Congestion avoidance from here (the window stays), and the rest of
	// the first packet acknowledged: 7 segments go, and every byte in
	// flight went at this instant.
	p.c.ssthresh = p.c.cwnd
	if n := ack(7 * mss); n < 7*mss {
		t.Fatalf("an ACK of the rest of the first packet: sent %d bytes, want %d or more", n, 7*mss)
	}
	p.now += 20 * time.Microsecond
	if n := ack(mss); n < mss {
		t.Fatalf("one segment opened 20 µs after what is in flight went: sent %d bytes, want %d or more (srtt %v, cwnd %d, flight %d, xmits %+v)", n, mss, p.c.rtt.srtt, p.c.cwnd, p.c.sndUna.Size(p.c.sndNxt), p.c.rack.xmits)
	}
	p.now += 60 * time.Microsecond
	if n := ack(mss); n != 0 {
		t.Fatalf("one segment opened 80 µs after: sent %d bytes, want none", n)
	}
	// What is left goes to the end however the ACKs come.
	for i := 0; p.c.sndBuf.len() > 0 && i < 100_000; i++ {
		p.now += 10 * time.Microsecond
		ack(min(mss, int(p.c.sndUna.Size(p.c.sndNxt))))
	}
	if p.c.sndBuf.len() != 0 {
		t.Fatalf("%d bytes left unacknowledged, %d of them unsent", p.c.sndBuf.len(), p.c.sndBuf.len()-int(p.c.sndUna.Size(p.c.sndNxt)))
	}
}
