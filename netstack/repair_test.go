package netstack

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// gsoTailLoss runs request/response rounds over a GSO link: A sends a
// message that fits one GSO packet (45 segments), B answers one byte, so
// that the message is all A has in flight. The first packet carrying a
// whole message from round lose on is dropped, once. It returns A's
// connection counters and stack stats.
func gsoTailLoss(t *testing.T, repair bool) (ConnTCP, TCPStats) {
	return tailLoss(t, repair, 64000)
}

// tailLoss is gsoTailLoss with messages of msg bytes.
func tailLoss(t *testing.T, repair bool, msg int) (ConnTCP, TCPStats) {
	t.Helper()
	const (
		rounds = 24
		lose   = 6
	)
	var round atomic.Int32
	var dropped atomic.Bool
	filter := func(pkt *stack.PacketBuffer) bool {
		// Only the message's packet (a message cut by the congestion
		// window, and retransmissions, the stack's of one segment each
		// or the link's of the same packet, pass).
		return pkt.Data().Size() == msg && round.Load() >= lose && dropped.CompareAndSwap(false, true)
	}
	// A minimum RTO of 50 ms keeps the test short; a shorter one lets a
	// scheduling pause between rounds shrink the window to the initial one
	// (RFC 5681 restart), and messages are then cut.
	cfg := Config{MinRTO: 50 * time.Millisecond, NoLinkRepair: !repair}
	a, b, im := filteredPair(t, LinkConfig{}, cfg, cfg, filter)
	ca, cb := connect(t, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		buf := make([]byte, msg)
		for i := range rounds {
			if err := cb.ReadFull(ctx, buf); err != nil {
				errc <- err
				return
			}
			for j, c := range buf {
				if c != pattern(byte(i), int64(j)) {
					t.Errorf("round %d: byte %d wrong", i, j)
					break
				}
			}
			if _, err := cb.Write(ctx, buf[:1]); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	buf := make([]byte, msg)
	one := make([]byte, 1)
	for i := range rounds {
		round.Store(int32(i))
		fillPattern(byte(i), 0, buf)
		if _, err := ca.Write(ctx, buf); err != nil {
			t.Fatalf("round %d: write: %v", i, err)
		}
		if err := ca.ReadFull(ctx, one); err != nil {
			t.Fatalf("round %d: read the answer: %v", i, err)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if st := im.Stats(); st.Dropped != 1 {
		t.Fatalf("dropped %d packets, want 1 (no message went as one packet)", st.Dropped)
	}
	return ca.TCP(), a.TCPStats()
}

// TestGSOTailLossRepaired: a GSO packet lost at the tail of what a
// connection has in flight is recovered without a retransmission timeout:
// the link sends the packet again when the peer's acknowledgment of the
// stack's tail-loss probe lands inside it.
func TestGSOTailLossRepaired(t *testing.T) {
	gvisorOnly(t)
	c, s := gsoTailLoss(t, true)
	t.Logf("conn %+v", c)
	t.Logf("stack %+v", s)
	if c.Timeouts != 0 {
		t.Errorf("%d retransmission timeouts, want 0", c.Timeouts)
	}
	if s.LinkResentPackets == 0 {
		t.Errorf("the link resent nothing")
	}
}

// TestGVisorGSOTailLossWaitsForTimeouts reproduces the gVisor behaviour
// the link's repair works around (docs/tcp-recovery.md): with the repair
// off, the same lost packet is recovered by retransmission timeouts, two
// segments per timeout. If this test fails, gVisor recovers such losses by
// itself now, and the repair may be unnecessary.
func TestGVisorGSOTailLossWaitsForTimeouts(t *testing.T) {
	gvisorOnly(t)
	c, s := gsoTailLoss(t, false)
	t.Logf("conn %+v", c)
	t.Logf("stack %+v", s)
	if c.Timeouts == 0 {
		t.Errorf("no retransmission timeout: gVisor recovered the lost GSO packet by itself")
	}
	if s.LinkResentPackets != 0 {
		t.Errorf("the link resent %d packets with the repair off", s.LinkResentPackets)
	}
}

// TestShortTailLossProbed: a short message lost at the tail (one segment
// in flight, nothing after it to be SACKed) is sent again by the link's
// probe a few milliseconds later, before gVisor's own tail-loss probe
// (two smoothed round trips plus 200 ms for one outstanding segment,
// capped by the RTO): the stack retransmits nothing.
func TestShortTailLossProbed(t *testing.T) {
	gvisorOnly(t)
	c, s := tailLoss(t, true, 100)
	t.Logf("conn %+v", c)
	t.Logf("stack %+v", s)
	if s.LinkResentPackets == 0 {
		t.Errorf("the link resent nothing")
	}
	if c.Retransmits != 0 || c.Timeouts != 0 {
		t.Errorf("the stack retransmitted %d segments (%d timeouts): the link's probe came late", c.Retransmits, c.Timeouts)
	}
}

// filteredPair makes stacks A (cfgA) and B (cfgB) on an in-memory link
// pair (lc) whose A side drops the packets filter picks. The stacks close
// when the test ends.
func filteredPair(t *testing.T, lc LinkConfig, cfgA, cfgB Config, filter func(*stack.PacketBuffer) bool) (a, b *Stack, im *Impair) {
	t.Helper()
	la, lb := NewLinkPair(lc)
	im = NewImpair(la, ImpairConfig{Seed: 1, LossRate: 1, Filter: filter}).(*Impair)
	cfgA.Link, cfgA.Addrs = im, []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}
	a, err := New(cfgA)
	if err != nil {
		t.Fatal(err)
	}
	cfgB.Link, cfgB.Addrs = lb, []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}
	b, err = New(cfgB)
	if err != nil {
		a.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close()
		b.Close()
	})
	return a, b, im
}
