package verbs_test

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/link/nested"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
)

// cuttable is a link that can be cut: from then on it carries nothing, as
// when the process at the other end is killed (no kernel is left to reset
// its connections: the survivor hears nothing at all).
type cuttable struct {
	nested.Endpoint
	cut atomic.Bool
}

func newCuttable(ep stack.LinkEndpoint) *cuttable {
	c := &cuttable{}
	c.Endpoint.Init(ep, c)
	return c
}

func (c *cuttable) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	if c.cut.Load() {
		return pkts.Len(), nil // lost on the wire
	}
	return c.Endpoint.WritePackets(pkts)
}

// DeliverNetworkPacket drops what arrives once cut, too.
func (c *cuttable) DeliverNetworkPacket(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	if c.cut.Load() {
		return
	}
	c.Endpoint.DeliverNetworkPacket(proto, pkt)
}

// usage is what a process holds: goroutines, descriptors, heap.
type usage struct {
	goroutines, fds int
	heap            uint64
}

func measure() usage {
	var u usage
	for i := 0; i < 3; i++ {
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
	}
	u.goroutines = runtime.NumGoroutine()
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		u.fds = len(ents)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	u.heap = ms.HeapInuse
	return u
}

// TestPeerKilled: the peer's process dies mid-transfer (its link goes
// silent; nothing resets the connection), in both roles. Every work request
// the survivor has outstanding — RDMA Writes, an RDMA Read, posted
// receives — completes with an error within the peer timeout, the QP
// reaches ERROR, and cycle after cycle no goroutine, descriptor or memory
// is left behind. RDMATAP_KILL_CYCLES sets the cycles per role (the fault
// campaign ran 10,000).
func TestPeerKilled(t *testing.T) {
	cycles := envInt("RDMATAP_KILL_CYCLES", 30)
	if testing.Short() {
		cycles = 5
	}
	for _, role := range []string{"server killed", "client killed"} {
		t.Run(role, func(t *testing.T) {
			killCycle(t, role == "client killed") // warm up pools and caches
			before := measure()
			start := time.Now()
			var worst time.Duration
			for i := 0; i < cycles; i++ {
				worst = max(worst, killCycle(t, role == "client killed"))
			}
			after := measure()
			t.Logf("%d cycles in %v, slowest flush %v after the kill; goroutines %d -> %d, descriptors %d -> %d, heap %.1f -> %.1f MiB",
				cycles, time.Since(start).Round(time.Millisecond), worst.Round(time.Millisecond), before.goroutines, after.goroutines,
				before.fds, after.fds, float64(before.heap)/(1<<20), float64(after.heap)/(1<<20))
			if after.goroutines > before.goroutines+5 {
				t.Fatalf("goroutines %d -> %d over %d cycles", before.goroutines, after.goroutines, cycles)
			}
			if after.fds > before.fds {
				t.Fatalf("descriptors %d -> %d over %d cycles", before.fds, after.fds, cycles)
			}
			if after.heap > before.heap+64<<20 {
				t.Fatalf("heap %d -> %d bytes over %d cycles", before.heap, after.heap, cycles)
			}
		})
	}
}

// peerTimeout is the stacks' PeerTimeout (RDMATAP_KILL_TIMEOUT_MS).
var peerTimeout = time.Duration(envInt("RDMATAP_KILL_TIMEOUT_MS", 200)) * time.Millisecond

// killCycle connects, starts a transfer, kills one side and checks the
// survivor; it returns how long the survivor took to flush after the kill.
func killCycle(t *testing.T, killClient bool) time.Duration {
	t.Helper()
	la, lb := netstack.NewLinkPair(netstack.LinkConfig{})
	ca, cb := newCuttable(la), newCuttable(lb)
	mk := func(link stack.LinkEndpoint, addr string) *netstack.Stack {
		s, err := netstack.New(netstack.Config{Link: link, Addrs: []netip.Prefix{netip.MustParsePrefix(addr)},
			MinRTO: 20 * time.Millisecond, PeerTimeout: peerTimeout})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	na, nb := mk(ca, "192.0.2.1/24"), mk(cb, "192.0.2.2/24")
	da, err := verbs.Open(na, verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	db, err := verbs.Open(nb, verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	p := &pair{a: da, b: db, na: na, nb: nb}
	const size = 4 << 20
	cl, sv := newEnd(t, da, size, nil, nil), newEnd(t, db, size, nil, nil)
	connectEnds(t, p, cl, sv, verbs.ConnParams{})

	// The survivor has Writes, a Read and receives outstanding, and the
	// victim sends it a stream too.
	survivor, victim := cl, sv
	sDev, vDev, sStack, vStack := da, db, na, nb
	if killClient {
		survivor, victim = sv, cl
		sDev, vDev, sStack, vStack = db, da, nb, na
	}
	posted := 0
	for i := 0; i < 4; i++ {
		if err := survivor.qp.PostRecv(verbs.RecvWR{ID: uint64(100 + i), SGL: []verbs.SGE{survivor.mr.SGE(3<<20+i*4096, 4096)}}); err != nil {
			t.Fatal(err)
		}
	}
	// Memory is laid out so that no buffer is both read and written at
	// once: the survivor writes from its first MiB into the victim's
	// first, reads the victim's second MiB into its own second, and the
	// victim writes from its upper half into the survivor's.
	for i := 0; i < 6; i++ {
		wr := verbs.SendWR{ID: uint64(i), Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{survivor.mr.SGE(0, 1<<20)},
			RemoteAddr: survivor.remote.Addr, RKey: survivor.remote.RKey}
		if i == 3 {
			wr = verbs.SendWR{ID: uint64(i), Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{survivor.mr.SGE(1<<20, 1<<20)},
				RemoteAddr: survivor.remote.Addr + 1<<20, RKey: survivor.remote.RKey}
		}
		if err := survivor.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		posted++
	}
	_ = victim.qp.PostSend(verbs.SendWR{ID: 9, Op: verbs.OpWrite, SGL: []verbs.SGE{victim.mr.SGE(2<<20, 2<<20)},
		RemoteAddr: victim.remote.Addr + 2<<20, RKey: victim.remote.RKey})

	// Kill: the victim's link goes silent both ways, then its process's
	// stack and device vanish (closing them now sends nothing).
	time.Sleep(time.Duration(len(survivor.buf)%3) * time.Millisecond)
	ca.cut.Store(true)
	cb.cut.Store(true)
	killed := time.Now()
	vDev.Close()
	vStack.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*peerTimeout+5*time.Second)
	defer cancel()
	select {
	case <-survivor.qp.Done():
	case <-ctx.Done():
		t.Fatalf("the survivor's QP did not fail within %v of the kill (state %v)", 10*peerTimeout+5*time.Second, survivor.qp.State())
	}
	flushed := time.Since(killed)
	var wc [16]verbs.WC
	sends, recvs := 0, 0
	for sends < posted {
		n, err := survivor.scq.Wait(ctx, wc[:])
		if err != nil {
			t.Fatalf("%d of %d send WRs completed: %v", sends, posted, err)
		}
		sends += n
	}
	for recvs < 4 {
		n, err := survivor.rcq.Wait(ctx, wc[:])
		if err != nil {
			t.Fatalf("%d of 4 receives completed: %v", recvs, err)
		}
		for _, c := range wc[:n] {
			if c.Status == verbs.StatusSuccess {
				t.Fatalf("receive %d completed successfully: nothing was sent to it", c.ID)
			}
		}
		recvs += n
	}
	if survivor.qp.State() != verbs.QPError {
		t.Fatalf("survivor QP in %v", survivor.qp.State())
	}
	survivor.qp.Close()
	victim.qp.Close()
	survivor.mr.Dereg()
	victim.mr.Dereg()
	sDev.Close()
	sStack.Close()
	return flushed
}

// TestLinkDropRecovers: the link goes dead for 3 s mid-transfer (less
// than the peer timeout) and comes back: TCP retransmits, nothing fails,
// and every byte of the Writes and Sends in flight arrives intact.
func TestLinkDropRecovers(t *testing.T) {
	la, lb := netstack.NewLinkPair(netstack.LinkConfig{})
	ca, cb := newCuttable(la), newCuttable(lb)
	mk := func(link stack.LinkEndpoint, addr string) *netstack.Stack {
		s, err := netstack.New(netstack.Config{Link: link, Addrs: []netip.Prefix{netip.MustParsePrefix(addr)},
			MinRTO: 20 * time.Millisecond, PeerTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	na, nb := mk(ca, "192.0.2.1/24"), mk(cb, "192.0.2.2/24")
	da, err := verbs.Open(na, verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer da.Close()
	db, err := verbs.Open(nb, verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	p := &pair{a: da, b: db, na: na, nb: nb}
	const size = 8 << 20
	cl, sv := newEnd(t, da, size, nil, nil), newEnd(t, db, size, nil, nil)
	connectEnds(t, p, cl, sv, verbs.ConnParams{})
	fill(cl.buf, 7)
	for i := 0; i < 4; i++ {
		if err := sv.qp.PostRecv(verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{sv.mr.SGE(size/2+i*4096, 4096)}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 4; i++ {
		if err := cl.qp.PostSend(
			verbs.SendWR{ID: uint64(i), Op: verbs.OpWrite, SGL: []verbs.SGE{cl.mr.SGE(i<<20, 1<<20)}, RemoteAddr: cl.remote.Addr + uint64(i)<<20, RKey: cl.remote.RKey},
			verbs.SendWR{ID: uint64(10 + i), Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(size/2+i*4096, 4096)}},
		); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			ca.cut.Store(true)
			cb.cut.Store(true)
			time.Sleep(3 * time.Second)
			ca.cut.Store(false)
			cb.cut.Store(false)
		}
	}
	for i := 0; i < 4; i++ {
		mustOK(t, wait1(t, sv.rcq), verbs.WCRecv, 4096)
	}
	for i := 0; i < 4; i++ {
		mustOK(t, wait1(t, cl.scq), verbs.WCSend, 4096)
	}
	if !bytes.Equal(sv.buf[:4<<20], cl.buf[:4<<20]) {
		t.Fatal("the Writes across the outage did not arrive intact")
	}
	if !bytes.Equal(sv.buf[size/2:size/2+4*4096], cl.buf[size/2:size/2+4*4096]) {
		t.Fatal("the Sends across the outage did not arrive intact")
	}
	if cl.qp.State() != verbs.QPRTS || sv.qp.State() != verbs.QPRTS {
		t.Fatalf("QPs left RTS: %v, %v", cl.qp.State(), sv.qp.State())
	}
}
