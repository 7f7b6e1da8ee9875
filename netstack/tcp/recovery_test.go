package tcp

import (
	"fmt"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/seqnum"
)

// TestRecoveryWithoutTimeout: segments lost from the middle of a window
// are recovered by fast retransmit, with SACK (RFC 6675) and without it
// (NewReno), with no retransmission timeout; with SACK each lost segment
// goes once more and nothing else does.
func TestRecoveryWithoutTimeout(t *testing.T) {
	for _, lose := range [][]int{{40}, {40, 43, 47}} {
		for _, sack := range []bool{true, false} {
			t.Run(fmt.Sprintf("lose %v sack %v", lose, sack), func(t *testing.T) {
				p := newPath(t, 1)
				cfg := Config{NoSACK: !sack}
				p.connect(cfg, cfg, 1, 2)
				data := 0
				p.drop = func(from int, s *Segment) bool {
					if from != 0 || len(s.Payload) == 0 || s.Seq.LessThan(p.conns[0].sndMax) {
						return false // only first transmissions of side 0's data
					}
					data++
					for _, k := range lose {
						if data == k {
							return true
						}
					}
					return false
				}
				p.transfer([2]int{1 << 20, 0}, 0)
				i := p.conns[0].Info()
				if i.Timeouts != 0 || i.Recoveries != 1 {
					t.Fatalf("%d timeouts and %d recoveries, want 0 and 1: %+v", i.Timeouts, i.Recoveries, i)
				}
				if sack && i.RetransSegs != uint64(len(lose)) {
					t.Fatalf("with SACK, %d segments sent again for %d lost", i.RetransSegs, len(lose))
				}
				if r := p.conns[1].Info(); r.BytesReceived != 1<<20 || i.BytesAcked != 1<<20 {
					t.Fatalf("received %d, acknowledged %d", r.BytesReceived, i.BytesAcked)
				}
			})
		}
	}
}

// TestDSACK: duplicated segments are reported with D-SACK blocks, the
// sender counts them, and they start no recovery.
func TestDSACK(t *testing.T) {
	p := newPath(t, 1)
	p.connect(Config{}, Config{}, 1, 2)
	p.dup = 0.1
	p.transfer([2]int{256 << 10, 0}, 0)
	if out, in := p.conns[1].Info().DSACKsOut, p.conns[0].Info().DSACKsIn; out == 0 || in == 0 {
		t.Fatalf("D-SACK blocks sent %d, received %d", out, in)
	}
	if i := p.conns[0].Info(); i.Recoveries != 0 || i.RetransSegs != 0 {
		t.Fatalf("duplicates made the sender recover: %+v", i)
	}
}

// TestLyingSACK: a receiver whose ACKs carry made-up SACK blocks (data it
// never got, ranges beyond what was sent, inverted ones) costs the
// sender a bounded scoreboard and time, never data: the transfer
// completes with every byte in place.
func TestLyingSACK(t *testing.T) {
	p := newPath(t, 1)
	p.connect(Config{}, Config{}, 1, 2)
	p.loss = 0.01
	maxRanges := 0
	p.drop = func(from int, s *Segment) bool {
		if from == 1 && s.has(header.TCPFlagAck) {
			a := p.conns[0]
			span := int(a.sndUna.Size(a.sndMax)) + 1
			s.SACK = s.SACK[:0:0]
			for k := 0; k < 4; k++ {
				start := a.sndUna.Add(seqnum.Size(p.rng.Intn(span)))
				s.SACK = append(s.SACK, header.SACKBlock{Start: start, End: start.Add(seqnum.Size(p.rng.Intn(3000) - 500))})
			}
			if s.TS {
				s.SACK = s.SACK[:3]
			}
		}
		maxRanges = max(maxRanges, len(p.conns[0].sacked))
		return false
	}
	p.transfer([2]int{1 << 20, 0}, 0)
	if maxRanges > maxSACKRanges {
		t.Fatalf("the scoreboard grew to %d ranges", maxRanges)
	}
	t.Logf("%+v", p.conns[0].Info())
}

// TestUndo: on a path that only reorders, the fast retransmits it
// provokes come back as D-SACKed duplicates and their reductions are
// undone; on one that only loses data, no reduction is.
func TestUndo(t *testing.T) {
	p := newPath(t, 1)
	p.connect(Config{}, Config{}, 1, 2)
	p.jitter = 200 * time.Microsecond
	p.transfer([2]int{1 << 20, 0}, 0)
	if i := p.conns[0].Info(); i.Recoveries == 0 || i.Undos == 0 || i.Undos > i.Recoveries+i.Timeouts {
		t.Fatalf("reordering: %d recoveries, %d timeouts, %d undone", i.Recoveries, i.Timeouts, i.Undos)
	}
	// Data lost on the way (the ACKs all arrive, so no timeout is
	// spurious either).
	p = newPath(t, 2)
	p.connect(Config{}, Config{}, 1, 2)
	p.drop = func(from int, s *Segment) bool { return from == 0 && len(s.Payload) > 0 && p.rng.Float64() < 0.01 }
	p.transfer([2]int{1 << 20, 0}, 0)
	if i := p.conns[0].Info(); i.Recoveries == 0 || i.Undos != 0 {
		t.Fatalf("loss: %d recoveries, %d undone", i.Recoveries, i.Undos)
	}
}

// TestTailLossProbe: the last segment of a burst lost is repaired by a
// tail loss probe, two RTTs after it went, not by the retransmission
// timer.
func TestTailLossProbe(t *testing.T) {
	for _, n := range []int{100 << 10, 1000} {
		p := newPath(t, 1)
		p.connect(Config{}, Config{}, 1, 2)
		// An RTT sample first, so that a probe may go.
		p.transfer2(t, 1000)
		dropped := false
		p.drop = func(from int, s *Segment) bool {
			a := p.conns[0]
			if from == 0 && !dropped && len(s.Payload) > 0 && s.Seq.Add(seqnum.Size(len(s.Payload))) == a.sndUna.Add(seqnum.Size(a.sndBuf.len())) {
				dropped = true // the last data segment, its first time
				return true
			}
			return false
		}
		start := p.now
		p.transfer([2]int{n, 0}, 0)
		i := p.conns[0].Info()
		if !dropped || i.TLPs == 0 || i.Timeouts != 0 {
			t.Fatalf("%d bytes: dropped %v, %d probes, %d timeouts", n, dropped, i.TLPs, i.Timeouts)
		}
		if d := p.now - start; d >= 200*time.Millisecond {
			t.Fatalf("%d bytes took %v: the timer, not a probe, repaired the tail", n, d)
		}
	}
}

// transfer2 moves n bytes from side 0 to side 1 on an open connection
// and reads them.
func (p *path) transfer2(t *testing.T, n int) {
	t.Helper()
	if _, err := p.conns[0].Write(make([]byte, n), p.now); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, n)
	for got := 0; got < n; {
		if !p.step() {
			t.Fatal("stalled")
		}
		k, _ := p.conns[1].Read(buf, p.now)
		got += k
	}
	for i := 0; i < 100 && p.conns[0].sndUna != p.conns[0].sndMax; i++ {
		p.step()
	}
}

// TestTailBurstLoss: a burst of segments lost at the end of a flight (a
// GSO packet the link dropped whole), too few after it for three
// duplicates, is repaired without the timer: when nothing after it
// arrives, after the tail loss probe, whose SACK (or D-SACK, when it
// resent what had come) above the hole shows the hole lost; when the
// last segment arrives, by RACK, its SACK a reordering window after the
// hole was due.
func TestTailBurstLoss(t *testing.T) {
	for _, keepLast := range []bool{false, true} {
		p := newPath(t, 1)
		p.connect(Config{}, Config{}, 1, 2)
		p.transfer2(t, 1000)
		const n = 100 << 10
		base := p.conns[0].sndUna
		var dropped int
		p.drop = func(from int, s *Segment) bool {
			a := p.conns[0]
			if from != 0 || len(s.Payload) == 0 || s.Seq.LessThan(a.sndMax) && s.Seq != a.sndNxt {
				return false
			}
			end := int(base.Size(s.Seq.Add(seqnum.Size(len(s.Payload)))))
			last := end == n
			if end > n-30*1448 && (!last || !keepLast) && s.Seq.LessThan(a.sndMax) == false {
				dropped++
				return true // first transmissions of the flight's last 30 segments
			}
			return false
		}
		start := p.now
		p.transfer([2]int{n, 0}, 0)
		i := p.conns[0].Info()
		repairs := i.TLPs
		if keepLast {
			repairs = i.RACKLost
		}
		if dropped < 20 || repairs == 0 || i.Timeouts != 0 {
			t.Fatalf("last kept %v: %d dropped, %d probes, %d found lost by RACK, %d timeouts", keepLast, dropped, i.TLPs, i.RACKLost, i.Timeouts)
		}
		if d := p.now - start; d >= 200*time.Millisecond {
			t.Fatalf("last kept %v: took %v: the timer, not recovery, repaired the tail", keepLast, d)
		}
	}
}

// TestLostRetransmission: a segment lost, and its retransmission lost
// too, goes a third time once data sent after the retransmission is
// SACKed well beyond it, not after the retransmission timer.
func TestLostRetransmission(t *testing.T) {
	p := newPath(t, 1)
	p.connect(Config{}, Config{}, 1, 2)
	p.transfer2(t, 1000)
	const n = 2 << 20
	target := p.conns[0].sndUna.Add(100 * 1448)
	sends := 0
	p.drop = func(from int, s *Segment) bool {
		if from == 0 && s.Seq == target && len(s.Payload) > 0 {
			sends++
			return sends <= 2 // the first transmission and the first retransmission
		}
		return false
	}
	p.transfer([2]int{n, 0}, 0)
	i := p.conns[0].Info()
	if sends < 3 || i.Timeouts != 0 || i.LostRetransmits == 0 {
		t.Fatalf("the segment went %d times, %d timeouts, %d retransmissions found lost", sends, i.Timeouts, i.LostRetransmits)
	}
}

// TestRecoveryWithStaleMarks: a loss is recovered without the timer
// whatever the sequence numbers the last recovery left behind. A mark
// 2^31 octets or more behind SND.UNA (a connection that moved 2 GB
// without a loss since, a second or two at the rates here; or the zero
// value of one never set, with an initial sequence number past 2^31)
// reads as ahead of it in sequence space, where it must not hold back
// the next recovery or count its holes as retransmitted.
func TestRecoveryWithStaleMarks(t *testing.T) {
	for _, sack := range []bool{true, false} {
		for _, c := range []struct {
			name  string
			iss   seqnum.Value
			stale bool
		}{{"iss past 2^31", 0x8000_0100, false}, {"marks 2^31 behind", 1, true}} {
			t.Run(fmt.Sprintf("%s sack %v", c.name, sack), func(t *testing.T) {
				p := newPath(t, 1)
				cfg := Config{NoSACK: !sack}
				p.connect(cfg, cfg, c.iss, 2)
				a := p.conns[0]
				if c.stale {
					m := a.sndUna.Add(1<<31 - 1<<20) // set 2^31 + 1 MiB octets ago
					a.highRxt, a.recover, a.undoEnd, a.undoStart, a.undoOK = m, m, m, m, true
				}
				data := 0
				p.drop = func(from int, s *Segment) bool {
					if from != 0 || len(s.Payload) == 0 || s.Seq.LessThan(a.sndMax) {
						return false
					}
					data++
					return data == 40
				}
				p.transfer([2]int{1 << 20, 0}, 0)
				i := a.Info()
				if i.Timeouts != 0 || i.Recoveries != 1 {
					t.Fatalf("%d timeouts and %d recoveries, want 0 and 1: %+v", i.Timeouts, i.Recoveries, i)
				}
				if sack && i.RetransSegs != 1 {
					t.Fatalf("with SACK, %d segments sent again for 1 lost", i.RetransSegs)
				}
			})
		}
	}
}
