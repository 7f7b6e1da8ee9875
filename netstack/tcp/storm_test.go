package tcp

import (
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/seqnum"
)

// TestACKStorm: a peer that floods a connection with segments carrying
// nothing new — duplicate ACKs, ACKs from before SND.UNA, ACKs of data
// never sent, zero-length probes below the window, old data — costs it a
// bounded answer: a duplicate with data gets its ACK (with a D-SACK
// block: its sender needs to hear), everything else is limited by the
// window and the challenge ACKs' rate limit, not by the flood's length;
// its state keeps its bounds, and a true ACK afterwards still moves it on.
func TestACKStorm(t *testing.T) {
	for _, sack := range []bool{false, true} {
		name := "no SACK"
		if sack {
			name = "SACK"
		}
		t.Run(name, func(t *testing.T) {
			p := established(t, Config{SndBuf: 1 << 20}, func(s *Segment) { s.SACKPermitted = sack })
			if _, err := p.c.Write(make([]byte, 256<<10), p.now); err != nil {
				t.Fatal(err)
			}
			first := p.take()
			if len(first) == 0 {
				t.Fatal("nothing sent")
			}
			una := p.c.sndUna
			const storm = 100_000
			lies := []func(i int) Segment{
				func(int) Segment { // a duplicate ACK
					return Segment{Seq: p.seq, Ack: una, Flags: header.TCPFlagAck, Window: 65535}
				},
				func(i int) Segment { // an ACK from long before SND.UNA
					return Segment{Seq: p.seq, Ack: una - seqnum.Value(1000+i%5000), Flags: header.TCPFlagAck, Window: 65535}
				},
				func(i int) Segment { // an ACK of data never sent
					return Segment{Seq: p.seq, Ack: p.c.sndMax + seqnum.Value(1+i%100000), Flags: header.TCPFlagAck, Window: 65535}
				},
				func(int) Segment { // a zero-length probe below the window
					return Segment{Seq: p.seq - 1, Ack: una, Flags: header.TCPFlagAck, Window: 65535}
				},
				func(i int) Segment { // old data, already taken
					return Segment{Seq: p.seq - seqnum.Value(100+i%900), Ack: una, Flags: header.TCPFlagAck, Window: 65535, Payload: []byte("old data")}
				},
			}
			sent, sentBytes, withData := 0, 0, 0
			for i := 0; i < storm; i++ {
				s := lies[i%len(lies)](i)
				if len(s.Payload) > 0 {
					withData++
				}
				if sack && i%len(lies) == 0 {
					// Blocks that claim what was never sent, or nothing.
					s.SACK = []header.SACKBlock{{Start: p.c.sndMax + 10, End: p.c.sndMax + 5000}, {Start: una + 7, End: una + 3}}
				}
				p.input(s)
				if i%1000 == 999 {
					p.now += 1e6 // 1 ms: timers may fire, the rate limit moves on
					p.c.Tick(p.now)
				}
				for _, o := range p.take() {
					sent++
					sentBytes += len(o.Payload)
				}
				if len(p.c.sacked) > maxSACKRanges || p.c.sndBuf.len() > 1<<20 {
					t.Fatalf("after %d segments: %d SACK ranges, %d bytes buffered", i+1, len(p.c.sacked), p.c.sndBuf.len())
				}
			}
			// Besides the answers to data, in 100 s of virtual time: at
			// most 2 challenge ACKs a second,
			// and data retransmitted at most a few times over (the
			// duplicate ACKs start one recovery, which the lies never end,
			// and the retransmission timer backs off).
			t.Logf("%d segments in: %d out, %d payload bytes; %+v", storm, sent, sentBytes, p.c.Info())
			if sent-withData > 2000 || sentBytes > 4*(256<<10) {
				t.Fatalf("the storm drew %d segments (%d answers to data) and %d payload bytes", sent, withData, sentBytes)
			}
			if p.c.State() != Established {
				t.Fatalf("after the storm: %v (%v)", p.c.State(), p.c.Err())
			}
			// Duplicate ACKs inflate the window by no more than what was
			// in flight when they began (at most the peer's window).
			if limit := p.c.ssthresh + 65535 + p.c.sndMSS; p.c.cwnd > limit {
				t.Fatalf("after %d duplicate ACKs: cwnd %d, more than ssthresh and a window (%d)", storm/len(lies), p.c.cwnd, limit)
			}
			// The true ACK of everything sent.
			max := p.c.sndMax
			p.input(Segment{Seq: p.seq, Ack: max, Flags: header.TCPFlagAck, Window: 65535})
			if p.c.sndUna != max {
				t.Fatalf("a true ACK after the storm: sndUna %d, want %d", p.c.sndUna, max)
			}
		})
	}
}
