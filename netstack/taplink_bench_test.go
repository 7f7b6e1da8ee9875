package netstack

import (
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// BenchmarkTapInspect is the connection taps' look at one inbound packet
// on the link's delivery goroutine, ahead of IP and TCP: a 1,400-byte
// segment of a tapped connection, in order, in two views (headers and
// payload, as the TAP's read loop builds packets), to a handler that does
// nothing. Under loss a stream is held to TCP's window and its rate
// follows the round trip, which this cost is part of.
func BenchmarkTapInspect(b *testing.B) {
	sa, sb := newTestPair(b, PairConfig{})
	sb.EnableConnTaps()
	c1, c2 := connect(b, sa, sb)
	var handed int
	remove, err := c2.TapSegments(func(off uint64, v [][]byte) { handed++ }, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer remove()
	la, _ := NewLinkPair(LinkConfig{})
	l := newTapLink(la, 0, true, nil)
	src, dst := c1.LocalAddr(), c2.LocalAddr()
	// The next byte the application reads: in order.
	v, ok := sb.ctaps.taps.Load(connKey{local: c2.LocalAddr(), remote: c2.RemoteAddr()})
	if !ok {
		b.Fatal("no tap")
	}
	ct := v.(*connTap)
	raw := tcpPacket(src, dst, ct.isn+1+uint32(c2.readBytes.Load()), header.TCPFlagAck, make([]byte, 1400))
	hl := header.IPv4MinimumSize + header.TCPMinimumSize
	// Sub-benchmark "packet" only builds and frees the packet, for
	// subtraction.
	for _, look := range []bool{false, true} {
		name := "packet"
		if look {
			name = "inspect"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				buf := buffer.MakeWithView(buffer.NewViewWithData(raw[:hl]))
				buf.Append(buffer.NewViewWithData(raw[hl:]))
				pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buf})
				if look {
					l.inspect(sb.ctaps, tcpip.NetworkProtocolNumber(ipv4.ProtocolNumber), pkt)
				}
				pkt.DecRef()
			}
		})
	}
	if handed == 0 {
		b.Fatal("the tap was never called")
	}
}

// TestGatherData: gatherData hands over exactly the bytes PacketData.ReadTo
// does, in the same pieces, whatever headers the link consumed and however
// the payload is cut into views.
func TestGatherData(t *testing.T) {
	for _, tc := range []struct {
		cuts    []int // view sizes of the buffer
		consume int   // link header bytes consumed
	}{
		{[]int{1500}, 0},
		{[]int{1500}, 14},
		{[]int{54, 1400}, 14},
		{[]int{10, 4, 40, 1400}, 14},
		{[]int{14, 1400}, 14},
		{[]int{3, 3, 3}, 9},
		{[]int{7}, 0},
	} {
		var buf buffer.Buffer
		n := 0
		for _, c := range tc.cuts {
			b := make([]byte, c)
			for i := range b {
				b[i] = byte(n + i)
			}
			n += c
			buf.Append(buffer.NewViewWithData(b))
		}
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{ReserveHeaderBytes: 32, Payload: buf})
		if tc.consume > 0 {
			if _, ok := pkt.LinkHeader().Consume(tc.consume); !ok {
				t.Fatalf("%v: consume %d", tc.cuts, tc.consume)
			}
		}
		var want [][]byte
		pkt.Data().ReadTo(writerFunc(func(b []byte) (int, error) {
			if len(b) > 0 {
				want = append(want, append([]byte(nil), b...))
			}
			return len(b), nil
		}), true)
		got := gatherData(nil, pkt)
		if len(got) != len(want) {
			t.Fatalf("%v consume %d: %d pieces, ReadTo %d", tc.cuts, tc.consume, len(got), len(want))
		}
		for i := range got {
			if string(got[i]) != string(want[i]) {
				t.Fatalf("%v consume %d: piece %d differs", tc.cuts, tc.consume, i)
			}
		}
		pkt.DecRef()
	}
}
