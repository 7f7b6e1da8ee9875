package netstack

import (
	"bytes"
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/nested"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// checksummed is a link without checksum offload: the sender computes TCP
// checksums and the receiver's TCP (and the connection tap) verifies them.
// Every corruptEvery-th data packet it sends gets a wrong TCP checksum.
type checksummed struct {
	nested.Endpoint
	corruptEvery int
	mu           sync.Mutex
	n            int
	corrupted    int
}

func newChecksummed(ep stack.LinkEndpoint, corruptEvery int) *checksummed {
	c := &checksummed{corruptEvery: corruptEvery}
	c.Endpoint.Init(ep, c)
	return c
}

func (c *checksummed) Capabilities() stack.LinkEndpointCapabilities {
	return c.Endpoint.Capabilities() &^ (stack.CapabilityRXChecksumOffload | stack.CapabilityTXChecksumOffload)
}

func (c *checksummed) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	if c.corruptEvery > 0 {
		c.mu.Lock()
		for _, pkt := range pkts.AsSlice() {
			if pkt.Data().Size() == 0 {
				continue
			}
			if c.n++; c.n%c.corruptEvery == 0 {
				// The header is built per transmission: a
				// retransmission gets a good one again.
				th := header.TCP(pkt.TransportHeader().Slice())
				th.SetChecksum(^th.Checksum())
				c.corrupted++
			}
		}
		c.mu.Unlock()
	}
	return c.Endpoint.WritePackets(pkts)
}

// TestConnTapSegments: a connection tap hands over segments with their
// place in the receive stream (their bytes are the stream's bytes there),
// out-of-order ones included, and never one with a bad TCP checksum.
// On rdmatap's TCP the transport hands them over itself, after it has
// verified the checksum.
func TestConnTapSegments(t *testing.T) {
	for _, tcp := range []string{TCPGVisor, TCPRdmatap} {
		t.Run(tcp, func(t *testing.T) { testConnTapSegments(t, tcp) })
	}
}

func testConnTapSegments(t *testing.T, tcp string) {
	la, lb := NewLinkPair(LinkConfig{NoGSO: true})
	isData := func(pkt *stack.PacketBuffer) bool { return pkt.Data().Size() > 0 }
	bad := newChecksummed(NewImpair(la, ImpairConfig{Seed: 5, LossRate: 0.01, ReorderRate: 0.02, DupRate: 0.01, Filter: isData}), 50)
	scfg := Config{TCP: tcp, MinRTO: 20 * time.Millisecond, Link: bad, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}}
	a, err := New(scfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	scfg.Link, scfg.Addrs = newChecksummed(lb, 0), []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}
	b, err := New(scfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	own := b.TCPName() == TCPRdmatap
	if !own {
		b.EnableConnTaps()
	}
	c1, c2 := connect(t, a, b)
	if !own {
		if _, err := c1.TapSegments(func(uint64, [][]byte) {}, nil); err == nil {
			t.Fatal("a tap on a stack without connection taps")
		}
		a.EnableConnTaps()
		if _, err := c1.TapSegments(func(uint64, [][]byte) {}, nil); err != ErrNoISN {
			t.Fatalf("tap on a connection made before taps were enabled: %v, want ErrNoISN", err)
		}
	}

	var mu sync.Mutex
	var segs, ooo, wrong int
	var high uint64
	var stats ConnTapStats
	want := make([]byte, 0, 1<<16)
	remove, err := c2.TapSegments(func(off uint64, payload [][]byte) {
		mu.Lock()
		defer mu.Unlock()
		segs++
		if off > high {
			ooo++
		}
		pos := off
		for _, p := range payload {
			want = want[:len(p)]
			fillPattern(9, int64(pos), want)
			if !bytes.Equal(p, want) {
				wrong++
			}
			pos += uint64(len(p))
		}
		high = max(high, pos)
	}, &stats)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const total = 4 << 20
	errc := make(chan error, 1)
	go func() { errc <- sendPattern(ctx, c1, 9, total, 64<<10) }()
	if _, err := recvPattern(ctx, c2, 9, total); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	remove()
	mu.Lock()
	defer mu.Unlock()
	bad.mu.Lock()
	corrupted := bad.corrupted
	bad.mu.Unlock()
	t.Logf("%d segments handed over (%d beyond the highest before), %d corrupted on the way; refused: %d bad checksum, %d out of window, %d flags",
		segs, ooo, corrupted, stats.BadChecksum.Load(), stats.OutOfWindow.Load(), stats.BadFlags.Load())
	if wrong != 0 {
		t.Fatalf("%d segment pieces did not hold the stream's bytes at their offset", wrong)
	}
	// gVisor's TCP's tap sees the packet before TCP and checks the
	// checksum itself; rdmatap's TCP checks it before the tap sees it.
	if corrupted == 0 || (stats.BadChecksum.Load() == 0) != own {
		t.Fatalf("%d packets corrupted, %d refused for their checksum by the tap", corrupted, stats.BadChecksum.Load())
	}
	if ooo == 0 || segs < total/1460 {
		t.Fatalf("%d segments, %d out of order", segs, ooo)
	}
}

// TestConnTapRemoveAndSwitch: a link remembers the tap of its last data
// segment; segments of two connections taken in turn each reach their own
// tap, and a removed tap gets nothing more, though the link had it
// remembered.
func TestConnTapRemoveAndSwitch(t *testing.T) {
	a, b := newTestPair(t, PairConfig{})
	if b.TCPName() == TCPGVisor {
		b.EnableConnTaps()
	}
	x1, x2 := connect(t, a, b)
	y1, y2 := connect(t, a, b)
	var mu sync.Mutex
	got := map[string]int{}
	// What each tap saw, as the end of the stream it covers: a segment
	// sent again (a tail loss probe after a delayed ACK) is seen again.
	tap := func(name string) func(uint64, [][]byte) {
		return func(off uint64, payload [][]byte) {
			mu.Lock()
			defer mu.Unlock()
			end := int(off)
			for _, p := range payload {
				end += len(p)
			}
			got[name] = max(got[name], end)
		}
	}
	removeX, err := x2.TapSegments(tap("x"), nil)
	if err != nil {
		t.Fatal(err)
	}
	removeY, err := y2.TapSegments(tap("y"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer removeY()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Alternate the two connections' data, each read before the next.
	send := func(c1, c2 *Conn, n int) {
		t.Helper()
		if _, err := c1.Write(ctx, make([]byte, n)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, n)
		if err := c2.ReadFull(ctx, buf); err != nil {
			t.Fatal(err)
		}
	}
	for range 4 {
		send(x1, x2, 3000)
		send(y1, y2, 5000)
	}
	mu.Lock()
	if got["x"] != 4*3000 || got["y"] != 4*5000 {
		t.Fatalf("taps got x %d, y %d bytes; want %d and %d", got["x"], got["y"], 4*3000, 4*5000)
	}
	mu.Unlock()
	// x's segments last, then x's tap removed: the link remembers it.
	send(x1, x2, 1000)
	removeX()
	send(x1, x2, 2000)
	send(y1, y2, 700)
	mu.Lock()
	defer mu.Unlock()
	if got["x"] != 4*3000+1000 || got["y"] != 4*5000+700 {
		t.Fatalf("after removing x's tap: x %d, y %d bytes; want %d and %d", got["x"], got["y"], 4*3000+1000, 4*5000+700)
	}
}
