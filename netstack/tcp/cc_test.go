package tcp

import (
	"math"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/seqnum"
)

// sackPeer opens a connection with a scripted peer that offered SACK and
// a window scale of 7 (a window far beyond what the tests send), and
// runs rounds exchanges of one small segment answered after rtt, so that
// the connection's smoothed and minimum RTT are rtt.
func sackPeer(t *testing.T, cfg Config, rtt time.Duration, rounds int) *scripted {
	t.Helper()
	p := established(t, cfg, func(s *Segment) { s.WS, s.SACKPermitted = 7, true })
	for i := 0; i < rounds; i++ {
		if _, err := p.c.Write(make([]byte, 100), p.now); err != nil {
			t.Fatal(err)
		}
		p.take()
		p.now += rtt
		p.input(Segment{Seq: p.seq, Ack: p.c.sndNxt, Flags: header.TCPFlagAck, Window: 65535})
		p.take()
	}
	return p
}

// dataSegs counts the segments with data among s, and those of them that
// start at seq.
func dataSegs(s []Segment, seq seqnum.Value) (n, at int) {
	for _, x := range s {
		if len(x.Payload) > 0 {
			n++
			if x.Seq == seq {
				at++
			}
		}
	}
	return n, at
}

// TestCubicReduction: a congestion event takes Cubic's window to
// β_cubic = 0.7 of the window it happened at (Reno's to half), remembers
// that window as W_max, and with fast convergence a second event below
// W_max remembers less.
func TestCubicReduction(t *testing.T) {
	for _, cc := range []string{"", CCCubic, CCReno} {
		c := newConn(Config{CongestionControl: cc}, func(*Segment) {}, 0, 1, 0)
		c.sndMSS = 1000
		c.cwnd = 100 * 1000
		c.ccReduce(100 * 1000)
		want, name := 70*1000, CCCubic
		if cc == CCReno {
			want, name = 50*1000, CCReno
		}
		if c.ssthresh != want || c.Info().CongestionControl != name {
			t.Fatalf("%q: ssthresh %d (%s), want %d (%s)", cc, c.ssthresh, c.Info().CongestionControl, want, name)
		}
		if cc == CCReno {
			continue
		}
		if c.cb.wMax != 100 {
			t.Fatalf("W_max %v, want 100", c.cb.wMax)
		}
		// A window below W_max at the next event: fast convergence.
		c.cwnd = 80 * 1000
		c.ccReduce(80 * 1000)
		if c.cb.wMax != 80*1.7/2 || c.ssthresh != 56*1000 {
			t.Fatalf("after a second event at 80: W_max %v, ssthresh %d; want 68 and 56000", c.cb.wMax, c.ssthresh)
		}
		// The window in use, not a cwnd the application left unused.
		c.cwnd = 200 * 1000
		c.ccReduce(50 * 1000)
		if c.ssthresh != 35*1000 {
			t.Fatalf("cwnd 200 segments, 50 in flight: ssthresh %d, want 35000", c.ssthresh)
		}
	}
}

// avoid runs congestion avoidance on c for d of virtual time at its
// smoothed RTT: each RTT the window's worth of data is acknowledged, a
// segment per ACK.
func avoid(c *Conn, d time.Duration) {
	for end := c.now + d; c.now < end; {
		c.now += c.rtt.srtt
		for n := c.cwnd / c.sndMSS; n > 0; n-- {
			c.ccAvoid(c.sndMSS)
		}
	}
}

// TestCubicGrowth: after a recovery the window follows the cubic function
// from 0.7·W_max, reaching W_max K = ∛(W_max·0.3/C) seconds after the
// recovery's end, on a path whose RTT makes Reno slower; at a
// microsecond RTT it grows as the Reno-friendly estimate W_est does, α_cubic
// = 3(1−β)/(1+β) segments per RTT.
func TestCubicGrowth(t *testing.T) {
	const mss = 1000
	start := func(rtt time.Duration) *Conn {
		c := newConn(Config{}, func(*Segment) {}, 0, 1, 0)
		c.sndMSS = mss
		c.rtt.sample(rtt)
		c.cwnd = 100 * mss
		c.ccReduce(100 * mss)
		c.cwnd = c.ssthresh // as the recovery leaves it
		c.ccRecovered()
		return c
	}
	// 100 ms: Reno would add 0.53 segments per 100 ms; the cubic
	// function adds 30 segments in K.
	c := start(100 * time.Millisecond)
	k := math.Cbrt(100 * (1 - cubicBeta) / cubicC)
	avoid(c, time.Duration(k/2*float64(time.Second)))
	// W_cubic(K/2) = W_max − C·(K/2)³, the concave region, one RTT ahead
	// at most.
	tHalf := c.now.Seconds()
	lo := 100 - cubicC*math.Pow(k-tHalf, 3)
	hi := 100 - cubicC*math.Pow(k-tHalf-0.1, 3)
	if w := float64(c.cwnd) / mss; w < lo-1 || w > hi+1 {
		t.Fatalf("at %.2f s of K = %.2f s: %.1f segments, want W_cubic %.1f to %.1f", tHalf, k, w, lo, hi)
	}
	avoid(c, time.Duration(k/2*float64(time.Second)))
	if w := float64(c.cwnd) / mss; w < 99 || w > 103 {
		t.Fatalf("at K: %.1f segments, want W_max 100", w)
	}
	avoid(c, 2*time.Second)
	if w := float64(c.cwnd) / mss; w < 100+cubicC*1.5*1.5*1.5-2 {
		t.Fatalf("2 s past K: %.1f segments, want the convex region's %.1f", w, 100+cubicC*8)
	}

	// 50 µs: 1000 RTTs in 50 ms, W_est's 0.53 segments each up to the
	// prior window (100) and one each beyond.
	c = start(50 * time.Microsecond)
	avoid(c, 20*time.Millisecond) // 400 RTTs
	want := 70 + 400*cubicAlpha
	if want > 100 {
		want = 100 + (400 - 30/cubicAlpha)
	}
	if w := float64(c.cwnd) / mss; math.Abs(w-want) > 3 {
		t.Fatalf("after 400 RTTs of 50 µs: %.1f segments, want W_est's %.1f", w, want)
	}
}

// prrExample is how many segments PRR has sent after each of the 19 ACKs
// of TestPRR: none before the third starts the recovery, the
// retransmission on it, then ceil(prr_delivered·ssthresh/RecoverFS), half
// a segment per ACK, in whole segments, while pipe (19 − k segments
// SACKed or lost, plus those sent) is above ssthresh; from the 14th on,
// pipe is at ssthresh and PRR-SSRB sends what keeps it there, one per
// ACK.
var prrExample = [19]int{0, 0, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 5, 6, 7, 8, 9, 10}

// TestPRR: RFC 6937's example. Of 20 segments in flight the first is
// lost; Reno's ssthresh is 10 segments, and the 19 ACKs of the others
// each report one delivered. From the ACK that starts the recovery (the
// third) PRR sends ssthresh/RecoverFS of what is delivered, until pipe
// is down to ssthresh, then as much as is delivered (prrExample); RFC
// 6675's rule alone, with the window at ssthresh from the start, sends
// nothing until pipe falls below ssthresh.
func TestPRR(t *testing.T) {
	p := sackPeer(t, Config{CongestionControl: CCReno}, time.Millisecond, 4)
	c := p.c
	mss := c.sndMSS
	c.cwnd, c.ssthresh = 20*mss, 1<<30
	base := c.sndNxt
	if _, err := c.Write(make([]byte, 40*mss), p.now); err != nil {
		t.Fatal(err)
	}
	if n, _ := dataSegs(p.take(), 0); n != 20 {
		t.Fatalf("a window of 20 segments sent %d", n)
	}
	p.now += time.Millisecond
	sent := 0
	for k := 1; k <= 19; k++ {
		seg := seqnum.Size(mss)
		p.input(Segment{Seq: p.seq, Ack: base, Flags: header.TCPFlagAck, Window: 65535,
			SACK: []header.SACKBlock{{Start: base.Add(seg), End: base.Add(seg * seqnum.Size(k+1))}}})
		n, rtx := dataSegs(p.take(), base)
		sent += n
		if want := prrExample[k-1]; sent != want {
			t.Fatalf("after ACK %d: %d segments sent during the recovery, want %d (cwnd %d, pipe %d)", k, sent, want, c.cwnd, c.pipe())
		}
		if k == 3 && rtx != 1 {
			t.Fatalf("the ACK that starts the recovery did not retransmit the lost segment")
		}
	}
	if c.ssthresh != 10*mss || !c.inRecovery {
		t.Fatalf("ssthresh %d, in recovery %v", c.ssthresh, c.inRecovery)
	}
	// The retransmission's ACK ends the recovery at ssthresh.
	p.input(Segment{Seq: p.seq, Ack: base.Add(seqnum.Size(20 * mss)), Flags: header.TCPFlagAck, Window: 65535})
	if c.inRecovery || c.cwnd != 10*mss {
		t.Fatalf("after the full ACK: in recovery %v, cwnd %d, want %d", c.inRecovery, c.cwnd, 10*mss)
	}
}

// TestPRRSlowStartBound: when more was lost than the reduction asks for
// (pipe below ssthresh), PRR-SSRB lets the recovery send at most one
// segment more than each ACK reports delivered, not the burst up to
// ssthresh RFC 6675 alone allows.
func TestPRRSlowStartBound(t *testing.T) {
	p := sackPeer(t, Config{CongestionControl: CCReno}, time.Millisecond, 4)
	c := p.c
	mss := c.sndMSS
	c.cwnd, c.ssthresh = 20*mss, 1<<30
	base := c.sndNxt
	if _, err := c.Write(make([]byte, 40*mss), p.now); err != nil {
		t.Fatal(err)
	}
	p.take()
	p.now += time.Millisecond
	// Segments 0 to 15 are lost; 16 to 19 arrive.
	seg := seqnum.Size(mss)
	for k := 1; k <= 4; k++ {
		p.input(Segment{Seq: p.seq, Ack: base, Flags: header.TCPFlagAck, Window: 65535,
			SACK: []header.SACKBlock{{Start: base.Add(16 * seg), End: base.Add(seg * seqnum.Size(16+k))}}})
		n, _ := dataSegs(p.take(), 0)
		if !c.inRecovery {
			if n != 0 {
				t.Fatalf("ACK %d sent %d segments before the recovery", k, n)
			}
			continue
		}
		// Each ACK delivers one segment: at most two go out.
		if n > 2 {
			t.Fatalf("ACK %d (pipe %d, ssthresh %d) sent %d segments", k, c.pipe(), c.ssthresh, n)
		}
		if n == 0 {
			t.Fatalf("ACK %d in the recovery sent nothing", k)
		}
	}
	if !c.inRecovery {
		t.Fatal("no recovery")
	}
}

// TestRACKReorderWindow: a hole with a single segment SACKed after it
// (one duplicate ACK, far from DupThresh's three) is found lost by time:
// when the reordering window, a quarter of the minimum RTT, has passed
// beyond the RTT of the segment SACKed, the reorder timer fires and the
// hole goes again; not before.
func TestRACKReorderWindow(t *testing.T) {
	const rtt = time.Millisecond
	p := sackPeer(t, Config{}, rtt, 40)
	c := p.c
	mss := seqnum.Size(c.sndMSS)
	c.cwnd = 10 * int(mss)
	base := c.sndNxt
	if _, err := c.Write(make([]byte, 10*int(mss)), p.now); err != nil {
		t.Fatal(err)
	}
	p.take()
	sentAt := p.now
	p.now += rtt
	lost := base.Add(5 * mss)
	p.input(Segment{Seq: p.seq, Ack: lost, Flags: header.TCPFlagAck, Window: 65535})
	p.input(Segment{Seq: p.seq, Ack: lost, Flags: header.TCPFlagAck, Window: 65535,
		SACK: []header.SACKBlock{{Start: lost.Add(mss), End: lost.Add(2 * mss)}}})
	if _, at := dataSegs(p.take(), lost); at != 0 {
		t.Fatal("the hole went again at once: no reordering window")
	}
	i := c.Info()
	if i.MinRTT != rtt || i.ReorderWindow != rtt/4 || i.ReorderSeen {
		t.Fatalf("min RTT %v, reordering window %v (seen %v); want %v and %v", i.MinRTT, i.ReorderWindow, i.ReorderSeen, rtt, rtt/4)
	}
	due := sentAt + rtt + rtt/4
	if d := c.Deadline(); d != due {
		t.Fatalf("next timer at %v, want the reorder timer at %v (RTO at %v, probe at %v)", d, due, c.rtoAt, c.tlpAt)
	}
	p.now = due - time.Microsecond
	c.Tick(p.now)
	if _, at := dataSegs(p.take(), lost); at != 0 {
		t.Fatal("the hole went again before the reordering window passed")
	}
	p.now = due
	c.Tick(p.now)
	if _, at := dataSegs(p.take(), lost); at != 1 {
		t.Fatal("the reorder timer did not send the hole again")
	}
	i = c.Info()
	if i.RACKLost != 1 || i.ReorderTimeouts == 0 || i.Recoveries != 1 || i.Timeouts != 0 || i.TLPs != 0 {
		t.Fatalf("%d found lost by RACK, %d reorder timeouts, %d recoveries, %d timeouts, %d probes", i.RACKLost, i.ReorderTimeouts, i.Recoveries, i.Timeouts, i.TLPs)
	}
}

// TestRACKReordering: a segment the network delivers late, below one
// delivered after it, is reordering: the window stays a quarter of the
// minimum RTT with DupThresh segments SACKed, and each round trip with a
// D-SACK (a retransmission the peer did not need) widens it by a quarter
// more.
func TestRACKReordering(t *testing.T) {
	const rtt = time.Millisecond
	p := sackPeer(t, Config{}, rtt, 40)
	c := p.c
	mss := seqnum.Size(c.sndMSS)
	c.cwnd = 10 * int(mss)
	base := c.sndNxt
	if _, err := c.Write(make([]byte, 10*int(mss)), p.now); err != nil {
		t.Fatal(err)
	}
	p.take()
	p.now += rtt
	// Segment 0 comes after 1 and 2 (too few for a recovery).
	p.input(Segment{Seq: p.seq, Ack: base, Flags: header.TCPFlagAck, Window: 65535,
		SACK: []header.SACKBlock{{Start: base.Add(mss), End: base.Add(3 * mss)}}})
	p.input(Segment{Seq: p.seq, Ack: base.Add(4 * mss), Flags: header.TCPFlagAck, Window: 65535})
	i := c.Info()
	if !i.ReorderSeen {
		t.Fatal("a segment delivered below those after it: no reordering seen")
	}
	// Segment 5 missing, three SACKed above it: the window holds.
	p.input(Segment{Seq: p.seq, Ack: base.Add(5 * mss), Flags: header.TCPFlagAck, Window: 65535,
		SACK: []header.SACKBlock{{Start: base.Add(6 * mss), End: base.Add(9 * mss)}}})
	if w := c.Info().ReorderWindow; w != rtt/4 {
		t.Fatalf("reordering seen, 3 segments SACKed: window %v, want %v", w, rtt/4)
	}
	// A D-SACK: twice the window.
	p.input(Segment{Seq: p.seq, Ack: base.Add(5 * mss), Flags: header.TCPFlagAck, Window: 65535,
		SACK: []header.SACKBlock{{Start: base.Add(2 * mss), End: base.Add(3 * mss)}, {Start: base.Add(6 * mss), End: base.Add(9 * mss)}}})
	if w := c.Info().ReorderWindow; w != rtt/2 {
		t.Fatalf("after a D-SACK: window %v, want %v", w, rtt/2)
	}
}

// TestRecoveryAtRecoveryPoint: a segment lost at exactly the point where
// the previous recovery ended, the first sent after that recovery began,
// starts a recovery of its own at once, not at the timer.
func TestRecoveryAtRecoveryPoint(t *testing.T) {
	p := sackPeer(t, Config{}, time.Millisecond, 4)
	c := p.c
	mss := seqnum.Size(c.sndMSS)
	c.cwnd = 10 * int(mss)
	base := c.sndNxt
	if _, err := c.Write(make([]byte, 10*int(mss)), p.now); err != nil {
		t.Fatal(err)
	}
	p.take()
	p.now += time.Millisecond
	// Segment 0 lost, 1 to 3 SACKed: the first recovery.
	p.input(Segment{Seq: p.seq, Ack: base, Flags: header.TCPFlagAck, Window: 65535,
		SACK: []header.SACKBlock{{Start: base.Add(mss), End: base.Add(4 * mss)}}})
	if !c.inRecovery || c.recover != base.Add(10*mss) {
		t.Fatalf("in recovery %v, recovery point %d, want %d", c.inRecovery, c.recover, base.Add(10*mss))
	}
	// Everything up to the recovery point arrives: the recovery ends.
	point := c.recover
	p.take()
	p.input(Segment{Seq: p.seq, Ack: point, Flags: header.TCPFlagAck, Window: 65535})
	if c.inRecovery {
		t.Fatal("the ACK of the recovery point did not end the recovery")
	}
	if _, err := c.Write(make([]byte, 10*int(mss)), p.now); err != nil {
		t.Fatal(err)
	}
	p.take()
	p.now += time.Millisecond
	// The segment at the recovery point is lost, three after it come.
	p.input(Segment{Seq: p.seq, Ack: point, Flags: header.TCPFlagAck, Window: 65535,
		SACK: []header.SACKBlock{{Start: point.Add(mss), End: point.Add(4 * mss)}}})
	if _, at := dataSegs(p.take(), point); !c.inRecovery || at != 1 || c.Info().Recoveries != 2 {
		t.Fatalf("a loss at the recovery point: in recovery %v, %d retransmissions of it, %d recoveries", c.inRecovery, at, c.Info().Recoveries)
	}
}

// TestUndoCubic: a reduction undone (every retransmission reported a
// duplicate) restores Cubic's state with the windows: W_max and the
// epoch are those from before it.
func TestUndoCubic(t *testing.T) {
	p := sackPeer(t, Config{}, time.Millisecond, 4)
	c := p.c
	mss := seqnum.Size(c.sndMSS)
	c.cwnd = 10 * int(mss)
	c.cb = cubicState{wMax: 40, cwndPrior: 40, origin: 40, k: 1, epoch: p.now, epochOn: true, wEst: 10}
	before := c.cb
	base := c.sndNxt
	if _, err := c.Write(make([]byte, 10*int(mss)), p.now); err != nil {
		t.Fatal(err)
	}
	p.take()
	p.now += time.Millisecond
	p.input(Segment{Seq: p.seq, Ack: base, Flags: header.TCPFlagAck, Window: 65535,
		SACK: []header.SACKBlock{{Start: base.Add(mss), End: base.Add(4 * mss)}}})
	if !c.inRecovery || c.cb.wMax == before.wMax || c.ssthresh != 7*int(mss) {
		t.Fatalf("no reduction: in recovery %v, W_max %v, ssthresh %d", c.inRecovery, c.cb.wMax, c.ssthresh)
	}
	// Segment 0 had only been delayed: it and its retransmission both
	// arrive, and the peer reports the second a duplicate.
	p.input(Segment{Seq: p.seq, Ack: base.Add(4 * mss), Flags: header.TCPFlagAck, Window: 65535})
	p.input(Segment{Seq: p.seq, Ack: base.Add(4 * mss), Flags: header.TCPFlagAck, Window: 65535,
		SACK: []header.SACKBlock{{Start: base, End: base.Add(mss)}}})
	if i := c.Info(); i.Undos != 1 || c.cb != before || c.cwnd < 10*int(mss) {
		t.Fatalf("%d undone, cwnd %d, Cubic %+v, want %+v", i.Undos, c.cwnd, c.cb, before)
	}
}

// TestRACKReorderingPath: on a path that reorders and loses nothing, the
// first recovery the reordering provokes shows it (its retransmission
// comes back D-SACKed) and is undone; from then on RACK alone judges
// losses, by time with its reordering window, and the reordering makes
// no more recoveries, where DupThresh would count every late segment's
// successors as duplicates.
func TestRACKReorderingPath(t *testing.T) {
	for _, seed := range []int64{1, 2, 3} {
		p := newPath(t, seed)
		cfg := Config{GSOMax: 64 << 10, SndBuf: 4 << 20, RcvBuf: 4 << 20}
		p.connect(cfg, cfg, 1, 2)
		p.jitter = 20 * time.Microsecond
		p.transfer([2]int{16 << 20, 1 << 20}, 0)
		i := p.conns[0].Info()
		if i.Recoveries > 2 || i.RetransSegs > 20 || i.Timeouts != 0 || i.Recoveries > 0 && !i.ReorderSeen {
			t.Fatalf("seed %d: %d recoveries, %d segments sent again, %d timeouts, reordering seen %v", seed, i.Recoveries, i.RetransSegs, i.Timeouts, i.ReorderSeen)
		}
	}
}

// TestReorderTimerRecovery: a recovery the reorder timer starts takes
// what the ACKs that showed the loss delivered as its first ACK's: with
// 12 segments lost and 8 SACKed beyond them while RACK waited its
// reordering window, PRR-SSRB sends the 8 delivered and one more at once,
// not the single retransmission a recovery with nothing delivered would
// (whose loss would leave nothing to bring an ACK).
func TestReorderTimerRecovery(t *testing.T) {
	const rtt = time.Millisecond
	p := sackPeer(t, Config{}, rtt, 40)
	c := p.c
	mss := seqnum.Size(c.sndMSS)
	c.cwnd = 20 * int(mss)
	c.rack.reordered = true // as after a D-SACK: losses are found by time only
	base := c.sndNxt
	if _, err := c.Write(make([]byte, 20*int(mss)), p.now); err != nil {
		t.Fatal(err)
	}
	p.take()
	p.now += rtt
	p.input(Segment{Seq: p.seq, Ack: base, Flags: header.TCPFlagAck, Window: 65535,
		SACK: []header.SACKBlock{{Start: base.Add(12 * mss), End: base.Add(20 * mss)}}})
	if n, _ := dataSegs(p.take(), 0); n != 0 || c.inRecovery {
		t.Fatalf("before the reordering window passed: %d segments sent, in recovery %v", n, c.inRecovery)
	}
	p.now = c.Deadline()
	c.Tick(p.now)
	n, _ := dataSegs(p.take(), 0)
	if !c.inRecovery || n != 9 {
		t.Fatalf("the reorder timer: in recovery %v, %d segments sent, want 9", c.inRecovery, n)
	}
}

// TestStaleSACK: an ACK the network delayed behind a later one carries
// SACK blocks for data the later ACK already covered; the scoreboard does
// not take them (they would count as delivered again when pruned, and
// make the next ACK's delivery negative).
func TestStaleSACK(t *testing.T) {
	p := sackPeer(t, Config{}, time.Millisecond, 4)
	c := p.c
	mss := seqnum.Size(c.sndMSS)
	c.cwnd = 10 * int(mss)
	base := c.sndNxt
	if _, err := c.Write(make([]byte, 10*int(mss)), p.now); err != nil {
		t.Fatal(err)
	}
	p.take()
	p.now += time.Millisecond
	p.input(Segment{Seq: p.seq, Ack: base.Add(5 * mss), Flags: header.TCPFlagAck, Window: 65535})
	p.input(Segment{Seq: p.seq, Ack: base.Add(2 * mss), Flags: header.TCPFlagAck, Window: 65535,
		SACK: []header.SACKBlock{{Start: base.Add(3 * mss), End: base.Add(4 * mss)}}})
	if n := c.sackedBytes(); n != 0 {
		t.Fatalf("a delayed ACK's block below SND.UNA: %d bytes on the scoreboard", n)
	}
	p.input(Segment{Seq: p.seq, Ack: base.Add(6 * mss), Flags: header.TCPFlagAck, Window: 65535})
	if c.ackDelivered != int(mss) {
		t.Fatalf("the next ACK delivered %d, want %d", c.ackDelivered, mss)
	}
}
