package tcp

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/seqnum"
)

// FuzzParse: Parse never panics, and what it decodes encodes back to a
// header it decodes the same way.
func FuzzParse(f *testing.F) {
	s := Segment{Seq: 1, Ack: 2, Flags: header.TCPFlagAck, Window: 9, WS: -1, TS: true, TSVal: 5, TSEcr: 6,
		SACK: []header.SACKBlock{{Start: 10, End: 20}}, Payload: []byte("data")}
	b := make([]byte, s.HeaderLen()+4)
	copy(b[s.Encode(b, 1, 2):], s.Payload)
	f.Add(b)
	syn := Segment{Seq: 7, Flags: header.TCPFlagSyn, MSS: 1460, WS: 7, SACKPermitted: true, TS: true, TSVal: 1}
	b = make([]byte, syn.HeaderLen())
	syn.Encode(b, 1, 2)
	f.Add(b)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Parse(b, nil)
		if err != nil {
			return
		}
		if len(s.SACK) > maxSACKBlocks {
			t.Fatalf("%d SACK blocks", len(s.SACK))
		}
		if s.WS > 14 && s.has(header.TCPFlagSyn) {
			// gVisor clamps; anything larger would be a bug there.
			t.Fatalf("window scale %d", s.WS)
		}
		if s.TS && len(s.SACK) > 3 && !s.has(header.TCPFlagSyn) {
			s.SACK = s.SACK[:3] // 40 option bytes hold three beside a timestamp
		}
		if !s.has(header.TCPFlagSyn) {
			s.MSS, s.WS, s.SACKPermitted = 0, -1, false
		}
		if s.has(header.TCPFlagSyn) {
			s.SACK = nil
		}
		out := make([]byte, s.HeaderLen()+len(s.Payload))
		copy(out[s.Encode(out, 1, 2):], s.Payload)
		r, err := Parse(out, nil)
		if err != nil {
			t.Fatalf("Parse of Encode: %v", err)
		}
		if r.Seq != s.Seq || r.Ack != s.Ack || r.Flags != s.Flags || r.Window != s.Window ||
			r.TS != s.TS || r.TSVal != s.TSVal || r.TSEcr != s.TSEcr || len(r.SACK) != len(s.SACK) ||
			!bytes.Equal(r.Payload, s.Payload) {
			t.Fatalf("round trip:\n%+v\n%+v", s, r)
		}
	})
}

// FuzzInput: whatever segments a peer sends an established connection,
// in whatever order, the connection does not panic or hang, keeps its
// memory within its buffers, sends nothing beyond the sequence space it
// has used, and delivers only the bytes the peer's segments put at each
// offset of the stream.
func FuzzInput(f *testing.F) {
	f.Add([]byte{0x10, 0, 0, 0, 0, 4, 'a', 'b', 'c', 'd'})
	f.Add([]byte{0x04, 0, 0, 0, 1, 0, 0x02, 0xff, 0, 0, 0, 0, 0x11, 0, 0, 0, 0, 0})
	f.Fuzz(runFuzzInput)
}

func runFuzzInput(t *testing.T, b []byte) {
	in := append([]byte(nil), b...)
	wd := time.AfterFunc(3*time.Second, func() { panic(fmt.Sprintf("FuzzInput: no end after 3 s on input %x", in)) })
	defer wd.Stop()
	{
		p := established(t, Config{RcvBuf: 16 << 10, SndBuf: 16 << 10}, func(s *Segment) {
			s.SACKPermitted, s.TS, s.TSVal, s.WS = true, true, 100, 2
		})
		p.c.Write(bytes.Repeat([]byte("x"), 20000), p.now)
		// The peer's stream as it sends it: byte i is byte(i).
		want := func(off int) byte { return byte(off * 7) }
		var got []byte
		buf := make([]byte, 4096)
		for len(b) >= 6 {
			// One segment per 6 bytes: flags, a sequence offset, an ACK
			// offset, a length, a window, a time step.
			flags := header.TCPFlags(b[0]) & (header.TCPFlagFin | header.TCPFlagSyn | header.TCPFlagRst | header.TCPFlagAck | header.TCPFlagPsh)
			seqOff := int(int8(b[1])) * 97
			ackOff := int(int8(b[2])) * 131
			n := int(b[3]) * 13
			wnd := uint16(b[4]) << 6
			p.now += time.Duration(b[5]) * 100 * time.Microsecond
			b = b[6:]
			start := int(p.c.rcvNxt-(peerISS+1)) + seqOff
			first := start // the stream offset of the payload's first byte
			if flags&header.TCPFlagSyn != 0 {
				first++ // a SYN takes the first sequence number
			}
			payload := make([]byte, n)
			for i := range payload {
				payload[i] = want(first + i)
			}
			seg := Segment{Seq: peerISS + 1 + seqnum.Value(start), Ack: p.c.sndUna + seqnum.Value(ackOff),
				Flags: flags, Window: wnd, WS: -1, TS: true, TSVal: 100 + uint32(p.now/time.Millisecond),
				Payload: payload}
			if len(b) >= 8 && b[0]&0x80 != 0 {
				seg.SACK = []header.SACKBlock{{Start: seqnum.Value(uint32(b[1]) << 24), End: seqnum.Value(uint32(b[2]) << 8)}}
			}
			p.c.Input(&seg, p.now)
			if d := p.c.Deadline(); d != 0 && d <= p.now {
				p.c.Tick(p.now)
			}
			for _, s := range p.take() {
				if s.Seq.Add(seqnum.Size(len(s.Payload))).LessThan(s.Seq) || p.c.sndMax.LessThan(s.Seq) {
					t.Fatalf("sent %v beyond sndMax %d", &s, p.c.sndMax)
				}
			}
			for {
				k, _ := p.c.Read(buf, p.now)
				if k == 0 {
					break
				}
				got = append(got, buf[:k]...)
			}
			if p.c.oooBytes > p.c.cfg.RcvBuf+(1<<p.c.rcvShift) || p.c.rcvBuf.len() > p.c.cfg.RcvBuf+(1<<p.c.rcvShift) {
				t.Fatalf("holds %d bytes out of order and %d in order, buffer %d", p.c.oooBytes, p.c.rcvBuf.len(), p.c.cfg.RcvBuf)
			}
			if p.c.sndBuf.len() > p.c.cfg.SndBuf {
				t.Fatalf("send buffer %d", p.c.sndBuf.len())
			}
		}
		for i, c := range got {
			if c != want(i) {
				t.Fatalf("byte %d delivered is %d, the peer sent %d there", i, c, want(i))
			}
		}
	}
}
