package netstack

import (
	"bytes"
	"io"
	"runtime"
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// viewCollector gathers a packet's data views without copying.
type viewCollector struct{ views *[][]byte }

func (c viewCollector) Write(b []byte) (int, error) {
	*c.views = append(*c.views, b)
	return len(b), nil
}

// TestKeptSurvivesRead: the payload views of a segment a tap kept
// (connTap.keep) keep their bytes after TCP, which gets the same packet
// after the tap, has handed the payload to the reader: the read trims the
// packet's own buffer, which lets the chunks it passed go back to the
// pool, where the next packets of their size overwrite them, however long
// the packet itself is kept. (On a lossy bridge, a tap that kept only the
// packet fed its receiver other packets' bytes.)
func TestKeptSurvivesRead(t *testing.T) {
	gvisorOnly(t)
	// One P: the pool hands a released chunk to the next allocation of
	// its size on the same P, so the overwrite is certain.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for round := 0; round < 20; round++ {
		hdr := bytes.Repeat([]byte{0x11}, 40)
		pay := make([]byte, 1400)
		for i := range pay {
			pay[i] = byte(i*7 + round)
		}
		buf := buffer.MakeWithView(buffer.NewViewWithData(hdr))
		buf.Append(buffer.NewViewWithData(pay))
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buf})
		var views [][]byte
		pkt.Data().ReadTo(viewCollector{&views}, true)
		ct := &connTap{cur: pkt}
		k := ct.keep()
		want := bytes.Join(views, nil)
		// TCP hands the payload to the reader: a read trims the
		// packet's own buffer, releasing the views it has passed.
		if _, err := pkt.Data().ReadTo(io.Discard, false); err != nil {
			t.Fatal(err)
		}
		// Packets of the same sizes take the released chunks.
		var others []*buffer.View
		for i := 0; i < 16; i++ {
			for _, n := range []int{len(hdr), len(pay)} {
				v := buffer.NewViewSize(n)
				copy(v.AsSlice(), bytes.Repeat([]byte{0xee}, n))
				others = append(others, v)
			}
		}
		pkt.DecRef()
		if got := bytes.Join(views, nil); !bytes.Equal(got, want) {
			t.Fatalf("round %d: the kept views changed after the packet's pull-up", round)
		}
		k.Release()
		for _, v := range others {
			v.Release()
		}
	}
}
