package netstack

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// congestionRun sends 48 MiB of patterned data from stack A to stack B with
// A's congestion control cc, dropping A's data packet number loseAt once
// (never if loseAt is 0), and returns A's stats and the connection's
// algorithm at the end. Every byte is checked.
func congestionRun(t *testing.T, cc string, loseAt int32) (TCPStats, tcpip.CongestionControlOption) {
	t.Helper()
	const total = 48 << 20
	var seen atomic.Int32
	var dropped atomic.Bool
	filter := func(pkt *stack.PacketBuffer) bool {
		if loseAt == 0 || pkt.Data().Size() < 1000 {
			return false
		}
		return seen.Add(1) >= loseAt && dropped.CompareAndSwap(false, true)
	}
	// The link waits for room rather than drop, so that the one drop is
	// the impairment's; the link's repair is off, so that the stack's TCP
	// sees the loss (a repaired loss never reaches its congestion control).
	cfg := Config{CongestionControl: cc, MinRTO: 50 * time.Millisecond, NoLinkRepair: true}
	peer := cfg
	peer.CongestionControl = ""
	a, b, im := filteredPair(t, LinkConfig{MaxWait: time.Minute}, cfg, peer, filter)
	ca, cb := connect(t, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		buf := make([]byte, 1<<20)
		var off int64
		for off < total {
			if err := cb.ReadFull(ctx, buf); err != nil {
				errc <- err
				return
			}
			for j, c := range buf {
				if c != pattern(3, off+int64(j)) {
					t.Errorf("byte %d wrong", off+int64(j))
					break
				}
			}
			off += int64(len(buf))
		}
		errc <- nil
	}()
	buf := make([]byte, 256<<10)
	for off := int64(0); off < total; off += int64(len(buf)) {
		fillPattern(3, off, buf)
		if _, err := ca.Write(ctx, buf); err != nil {
			t.Fatalf("write at %d: %v", off, err)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if want := uint64(0); loseAt != 0 {
		want = 1
		if st := im.Stats(); st.Dropped != want {
			t.Fatalf("dropped %d packets, want %d", st.Dropped, want)
		}
	}
	var got tcpip.CongestionControlOption
	if terr := ca.Endpoint().GetSockOpt(&got); terr != nil {
		t.Fatalf("congestion control option: %v", terr)
	}
	return a.TCPStats(), got
}

// TestCongestionAutoChangesToRenoAtLoss: with "auto", a connection runs
// Cubic until it loses a packet, and Reno from then on; without loss it
// keeps Cubic.
func TestCongestionAutoChangesToRenoAtLoss(t *testing.T) {
	gvisorOnly(t)
	// Without a drop the connection keeps Cubic, unless its TCP
	// retransmitted all the same (a scheduling pause on a loaded machine
	// can fire a spurious recovery): it never changes without one.
	st, cc := congestionRun(t, CongestionAuto, 0)
	if st.CongestionChanges > 1 || (cc == "reno") != (st.CongestionChanges == 1) ||
		(st.CongestionChanges == 1 && st.Retransmits+st.Timeouts == 0) {
		t.Errorf("no drop: algorithm %q after %d changes (%+v)", cc, st.CongestionChanges, st)
	}
	st, cc = congestionRun(t, CongestionAuto, 5)
	if cc != "reno" || st.CongestionChanges != 1 {
		t.Errorf("one loss: algorithm %q after %d changes (%d retransmits, %d timeouts), want reno after one",
			cc, st.CongestionChanges, st.Retransmits, st.Timeouts)
	}
	// Plain Cubic stays Cubic.
	st, cc = congestionRun(t, "cubic", 5)
	if cc != "cubic" || st.CongestionChanges != 0 {
		t.Errorf("cubic with a loss: algorithm %q after %d changes, want cubic and none", cc, st.CongestionChanges)
	}
}
