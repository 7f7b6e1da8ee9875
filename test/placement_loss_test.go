package test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/tap"
	"github.com/rdmatap/rdmatap/verbs"
)

// Segment against stream placement on the lossy bridge: devices of this
// process, each on its own TAP, the TAPs on a Linux bridge in a namespace
// whose bridge table drops a random fraction of the IPv4 frames it forwards
// (the loss lab's rule, lossRule). GSO packets cross the bridge whole, so a
// drop takes a whole TSO packet, as in BenchmarkLossLab.

// bridgeLab is a namespace with a bridge and TAP endpoints on it.
type bridgeLab struct {
	ns     string
	bridge string
	mu     sync.Mutex
	n      int // endpoints made
}

// newBridgeLab makes the namespace and the bridge (MTU 1500); t.Cleanup
// removes them and every TAP made on them.
func newBridgeLab(t testing.TB) *bridgeLab {
	t.Helper()
	needRoot(t)
	needNft(t)
	nsSeq.Lock()
	nsSeq.n++
	k := nsSeq.n
	nsSeq.Unlock()
	id := fmt.Sprintf("%d%d", os.Getpid()%10000, k)
	l := &bridgeLab{ns: "rdp" + id, bridge: "rdpb" + id}
	run(t, "ip", "netns", "add", l.ns)
	t.Cleanup(func() {
		run(t, "ip", "netns", "del", l.ns)
	})
	l.in(t, "ip", "link", "set", "lo", "up")
	l.in(t, "ip", "link", "add", l.bridge, "type", "bridge")
	l.in(t, "ip", "link", "set", l.bridge, "mtu", "1500")
	l.in(t, "ip", "link", "set", l.bridge, "up")
	return l
}

func (l *bridgeLab) in(t testing.TB, args ...string) {
	t.Helper()
	run(t, append([]string{"ip", "netns", "exec", l.ns}, args...)...)
}

// setLoss replaces the drop rule: rate is a fraction (0: no rule).
func (l *bridgeLab) setLoss(t testing.TB, rate float64) {
	t.Helper()
	// The table may not exist yet: the error is ignored.
	exec.Command("ip", "netns", "exec", l.ns, "nft", "delete", "table", "bridge", "lossl").Run()
	lossRule(t, l.ns, "bridge", "", rate)
}

// labEnd is one device of the lab on its own TAP and stack.
type labEnd struct {
	td   *tap.Device
	ns   *netstack.Stack
	dev  *verbs.Device
	addr netip.Addr
}

// endpoint makes a TAP on the bridge and opens a stack and a device on it.
// The TAP is opened from a thread that has entered the namespace; the
// process's other threads stay where they are.
func (l *bridgeLab) endpoint(t testing.TB, cfg verbs.DeviceConfig) *labEnd {
	t.Helper()
	l.mu.Lock()
	l.n++
	k := l.n
	l.mu.Unlock()
	name := fmt.Sprintf("%st%d", l.ns, k)
	l.in(t, "ip", "tuntap", "add", "dev", name, "mode", "tap", "vnet_hdr")
	l.in(t, "ip", "link", "set", name, "mtu", "1500")
	l.in(t, "ip", "link", "set", name, "master", l.bridge)
	l.in(t, "ip", "link", "set", name, "up")
	td, err := openTapIn(l.ns, tap.Config{Name: name, MTU: 1500})
	if err != nil {
		t.Fatalf("TAP %s in %s: %v", name, l.ns, err)
	}
	e := &labEnd{td: td, addr: netip.AddrFrom4([4]byte{10, 87, byte(k / 250), byte(2 + k%250)})}
	e.ns, err = netstack.New(netstack.Config{Link: td.LinkEndpoint(), Addrs: []netip.Prefix{netip.PrefixFrom(e.addr, 16)},
		CongestionControl: os.Getenv("RDMATAP_PLACEMENT_LOSS_CC")})
	if err != nil {
		td.Close()
		t.Fatal(err)
	}
	if e.dev, err = verbs.Open(e.ns, cfg); err != nil {
		e.ns.Close()
		td.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.dev.Close()
		e.ns.Close()
		e.td.Close()
	})
	return e
}

// openTapIn opens a TAP that exists in namespace ns.
func openTapIn(ns string, cfg tap.Config) (*tap.Device, error) {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer orig.Close()
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	td, err := tap.Open(cfg)
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays locked, so it ends with the goroutine and
		// no other goroutine runs in the namespace.
		return nil, fmt.Errorf("leaving namespace %s: %w", ns, err)
	}
	runtime.UnlockOSThread()
	return td, err
}

// labSide is one side of a lab connection: a QP with its CQs and one MR.
type labSide struct {
	pd     *verbs.PD
	scq    *verbs.CQ
	rcq    *verbs.CQ
	qp     *verbs.QP
	conn   *verbs.Conn
	buf    []byte
	mr     *verbs.MR
	remote verbs.RemoteBuf // the peer's MR
}

func newLabSide(t testing.TB, d *verbs.Device, size int) *labSide {
	t.Helper()
	s := &labSide{}
	var err error
	if s.pd, err = d.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if s.scq, err = d.CreateCQ(1024); err != nil {
		t.Fatal(err)
	}
	if s.rcq, err = d.CreateCQ(1024); err != nil {
		t.Fatal(err)
	}
	if s.qp, err = s.pd.CreateQP(verbs.QPConfig{SendCQ: s.scq, RecvCQ: s.rcq, MaxSendWR: 256, MaxRecvWR: 256}); err != nil {
		t.Fatal(err)
	}
	s.buf = make([]byte, size)
	if s.mr, err = s.pd.RegMR(s.buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	return s
}

// labConnect connects a client QP on a to a server QP on b, each with an
// MR of size bytes.
func labConnect(t testing.TB, a, b *labEnd, size int, p verbs.ConnParams) (cl, sv *labSide) {
	t.Helper()
	cl, sv = newLabSide(t, a.dev, size), newLabSide(t, b.dev, size)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := b.dev.Listen(netip.AddrPort{}, verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var wg sync.WaitGroup
	var serr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		req, err := l.GetRequest(ctx)
		if err != nil {
			serr = err
			return
		}
		sv.conn, serr = req.Accept(ctx, sv.qp, p)
	}()
	cl.conn, err = a.dev.Dial(ctx, cl.qp, netip.AddrPortFrom(b.addr, l.Addr().Port()), p)
	wg.Wait()
	if err != nil || serr != nil {
		t.Fatalf("connect: dial %v, accept %v", err, serr)
	}
	// Both ends are in this process: each learns the other's MR directly.
	cl.remote, sv.remote = sv.mr.Remote(), cl.mr.Remote()
	return cl, sv
}

// waitOne waits for one completion on cq and checks it succeeded.
func waitOne(ctx context.Context, cq *verbs.CQ) (verbs.WC, error) {
	var wc [1]verbs.WC
	n, err := cq.Wait(ctx, wc[:])
	if err != nil {
		return verbs.WC{}, err
	}
	if n != 1 || wc[0].Status != verbs.StatusSuccess {
		return wc[0], fmt.Errorf("completion %+v: %v", wc[0], wc[0].Err())
	}
	return wc[0], nil
}

// labSpan is one message of a batch: n bytes at off in both MRs.
type labSpan struct{ off, n int }

// labBatch moves a batch of messages by op, all in flight at once, from
// the client's MR to the server's at the same offsets (Read: from the
// server's into the client's), and waits until the data receiver has them
// all: each Write's following Send completes at the server, each Send at
// the server, each Read at the client.
func labBatch(ctx context.Context, cl, sv *labSide, op string, msgs []labSpan) error {
	for i, m := range msgs {
		id := uint64(i)
		var err error
		switch op {
		case "write":
			if err = sv.qp.PostRecv(verbs.RecvWR{ID: id}); err == nil {
				err = cl.qp.PostSend(
					verbs.SendWR{ID: id, Op: verbs.OpWrite, SGL: []verbs.SGE{cl.mr.SGE(m.off, m.n)}, RemoteAddr: cl.remote.Addr + uint64(m.off), RKey: cl.remote.RKey},
					verbs.SendWR{ID: id, Op: verbs.OpSend, Flags: verbs.Signaled})
			}
		case "send":
			if err = sv.qp.PostRecv(verbs.RecvWR{ID: id, SGL: []verbs.SGE{sv.mr.SGE(m.off, m.n)}}); err == nil {
				err = cl.qp.PostSend(verbs.SendWR{ID: id, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(m.off, m.n)}})
			}
		case "read":
			err = cl.qp.PostSend(verbs.SendWR{ID: id, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(m.off, m.n)},
				RemoteAddr: cl.remote.Addr + uint64(m.off), RKey: cl.remote.RKey})
		default:
			err = fmt.Errorf("unknown op %q", op)
		}
		if err != nil {
			return err
		}
	}
	for range msgs {
		if op != "read" {
			wc, err := waitOne(ctx, sv.rcq)
			if err != nil {
				return err
			}
			if op == "send" && wc.ByteLen != uint32(msgs[wc.ID].n) {
				return fmt.Errorf("Send of %d bytes received as %d", msgs[wc.ID].n, wc.ByteLen)
			}
		}
		if _, err := waitOne(ctx, cl.scq); err != nil {
			return err
		}
	}
	return nil
}

// TestPlacementBridgeLoss: on the lossy bridge, at 0.1, 1 and 2 % loss,
// batches of 8 RDMA Writes, Sends and Reads in flight at once, of sizes
// from one byte to 300 KB, each with fresh random content, arrive byte
// for byte with stream placement and with segment placement (with and
// without the MPA CRC, which segment placement needs to frame FPDUs beyond
// a hole): every message's destination is compared with its source once
// the batch's completions are in, and the bytes between the destinations
// are checked untouched. Segment placement with the CRC must have placed
// bytes beyond holes.
func TestPlacementBridgeLoss(t *testing.T) {
	l := newBridgeLab(t)
	type cell struct {
		pl  verbs.Placement
		crc bool
	}
	cells := []cell{{verbs.PlacementStream, false}, {verbs.PlacementSegment, false}, {verbs.PlacementSegment, true}}
	const size = 4 << 20
	type conn struct {
		cl, sv *labSide
		a, b   *labEnd
	}
	conns := map[cell]conn{}
	for _, c := range cells {
		cfg := verbs.DeviceConfig{Placement: c.pl}
		a, b := l.endpoint(t, cfg), l.endpoint(t, cfg)
		crc := c.crc
		cl, sv := labConnect(t, a, b, size, verbs.ConnParams{CRC: &crc})
		conns[c] = conn{cl, sv, a, b}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, rate := range []float64{0.001, 0.01, 0.02} {
		l.setLoss(t, rate)
		for _, c := range cells {
			cn := conns[c]
			for _, op := range []string{"write", "send", "read"} {
				src, dst := cn.cl, cn.sv
				if op == "read" {
					src, dst = cn.sv, cn.cl
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				for batch := 0; batch < 6; batch++ {
					var msgs []labSpan
					off := 4
					for i := 0; i < 8; i++ {
						n := 1 + rng.IntN(300_000)
						if i%4 == 0 {
							n = 64 << 10
						}
						msgs = append(msgs, labSpan{off, n})
						off += n + 4
					}
					// Fresh content in the sources; a guard value in
					// the destinations' gaps.
					rnd := src.buf[:off]
					for j := range rnd {
						rnd[j] = byte(rng.Uint32())
					}
					guard := byte(rng.Uint32())
					for j := range dst.buf[:off] {
						dst.buf[j] = guard
					}
					if err := labBatch(ctx, cn.cl, cn.sv, op, msgs); err != nil {
						cancel()
						t.Fatalf("%v crc=%v loss %g %%: %s batch %d: %v", c.pl, c.crc, rate*100, op, batch, err)
					}
					prev := 0
					for i, m := range msgs {
						for j := prev; j < m.off; j++ {
							if dst.buf[j] != guard {
								cancel()
								t.Fatalf("%v crc=%v loss %g %%: %s batch %d: byte %d, between destinations, was written", c.pl, c.crc, rate*100, op, batch, j)
							}
						}
						if !bytes.Equal(dst.buf[m.off:m.off+m.n], src.buf[m.off:m.off+m.n]) {
							k := 0
							for dst.buf[m.off+k] == src.buf[m.off+k] {
								k++
							}
							cancel()
							t.Fatalf("%v crc=%v loss %g %%: %s batch %d message %d (%d bytes): first wrong byte at %d", c.pl, c.crc, rate*100, op, batch, i, m.n, k)
						}
						prev = m.off + m.n
					}
				}
				cancel()
			}
		}
	}
	for _, c := range cells {
		cn := conns[c]
		sa, sb := cn.a.dev.Stats(), cn.b.dev.Stats()
		if sa.RxBytes+sb.RxBytes != sa.PlacedBytes+sb.PlacedBytes {
			t.Errorf("%v crc=%v: %d payload bytes received, %d placed", c.pl, c.crc, sa.RxBytes+sb.RxBytes, sa.PlacedBytes+sb.PlacedBytes)
		}
		t.Logf("%v crc=%v: placed beyond holes %d bytes, fed %d, kept and fed %d; TCP retransmissions %d", c.pl, c.crc,
			sa.Segment.OutOfOrder+sb.Segment.OutOfOrder, sa.Segment.Fed+sb.Segment.Fed, sa.Segment.Kept+sb.Segment.Kept, sa.TCP.Retransmits+sb.TCP.Retransmits)
		if c.pl == verbs.PlacementSegment && c.crc && sa.Segment.OutOfOrder+sb.Segment.OutOfOrder == 0 {
			t.Errorf("segment placement with the CRC placed nothing beyond a hole under loss")
		}
	}
}

// labRun is what one placement mode measures for one operation.
type labRun struct {
	mbs        float64         // throughput of 1 MiB messages
	lat        []float64       // 64 KiB completion latencies, s
	fills      verbs.Histogram // hole fill to completion
	fillTime   time.Duration
	fillsCount uint64
}

// labBulk keeps up to 16 messages of 1 MiB of op in flight for d and
// returns MB/s completed. Sends find receives posted ahead.
func labBulk(ctx context.Context, cl, sv *labSide, op string, d time.Duration) (float64, error) {
	const msg, slots, window = 1 << 20, 8, 8
	opc := map[string]verbs.Opcode{"write": verbs.OpWrite, "send": verbs.OpSend, "read": verbs.OpRead}[op]
	var wc [16]verbs.WC
	posted, done, received := 0, 0, 0
	start := time.Now()
	end := start.Add(d)
	for {
		for posted-done < window && time.Now().Before(end) {
			slot := posted % slots
			if op == "send" {
				if err := sv.qp.PostRecv(verbs.RecvWR{ID: uint64(posted), SGL: []verbs.SGE{sv.mr.SGE(slot*msg, msg)}}); err != nil {
					return 0, err
				}
			}
			wr := verbs.SendWR{ID: uint64(posted), Op: opc, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(slot*msg, msg)}}
			if op != "send" {
				wr.RemoteAddr, wr.RKey = cl.remote.Addr+uint64(slot*msg), cl.remote.RKey
			}
			if err := cl.qp.PostSend(wr); err != nil {
				return 0, err
			}
			posted++
		}
		if done == posted {
			break
		}
		k, err := cl.scq.Wait(ctx, wc[:])
		if err != nil {
			return 0, err
		}
		for _, c := range wc[:k] {
			if c.Status != verbs.StatusSuccess {
				return 0, c.Err()
			}
		}
		done += k
		for {
			k := sv.rcq.Poll(wc[:])
			if k == 0 {
				break
			}
			for _, c := range wc[:k] {
				if c.Status != verbs.StatusSuccess {
					return 0, c.Err()
				}
			}
			received += k
		}
	}
	// A Send's or a Write's send completion means the data left: the
	// Sends' receives, or a Send behind the Writes, tell when the
	// receiver has placed them all.
	for op == "send" && received < done {
		k, err := sv.rcq.Wait(ctx, wc[:])
		if err != nil {
			return 0, err
		}
		for _, c := range wc[:k] {
			if c.Status != verbs.StatusSuccess {
				return 0, c.Err()
			}
		}
		received += k
	}
	if op == "write" {
		if err := sv.qp.PostRecv(verbs.RecvWR{ID: 1 << 40}); err != nil {
			return 0, err
		}
		if err := cl.qp.PostSend(verbs.SendWR{ID: 1 << 40, Op: verbs.OpSend, Flags: verbs.Signaled}); err != nil {
			return 0, err
		}
		for {
			k, err := sv.rcq.Wait(ctx, wc[:1])
			if err != nil {
				return 0, err
			}
			if k == 1 && wc[0].ID == 1<<40 {
				break
			}
		}
		if _, err := waitOne(ctx, cl.scq); err != nil {
			return 0, err
		}
	}
	return float64(done) * msg / time.Since(start).Seconds() / 1e6, nil
}

// labLatency moves 64 KiB messages of op, 8 in flight, for up to n
// messages or d, and returns each one's time from posting to the data
// receiver's completion (a Write is followed by a Send whose receive
// completes it; a Read completes at the client).
func labLatency(ctx context.Context, cl, sv *labSide, op string, n int, d time.Duration) ([]float64, error) {
	const size, depth = 64 << 10, 8
	lat := make([]float64, 0, n)
	posted := make([]time.Time, n)
	var wc [depth]verbs.WC
	sent, done := 0, 0
	end := time.Now().Add(d)
	for done < sent || (sent < n && time.Now().Before(end)) {
		for sent < n && sent-done < depth && time.Now().Before(end) {
			slot := sent % depth
			posted[sent] = time.Now()
			switch op {
			case "write":
				if err := sv.qp.PostRecv(verbs.RecvWR{ID: uint64(sent)}); err != nil {
					return nil, err
				}
				if err := cl.qp.PostSend(
					verbs.SendWR{ID: uint64(sent), Op: verbs.OpWrite, SGL: []verbs.SGE{cl.mr.SGE(slot*size, size)}, RemoteAddr: cl.remote.Addr + uint64(slot*size), RKey: cl.remote.RKey},
					verbs.SendWR{ID: uint64(sent), Op: verbs.OpSend, Flags: signal(sent)}); err != nil {
					return nil, err
				}
			case "send":
				if err := sv.qp.PostRecv(verbs.RecvWR{ID: uint64(sent), SGL: []verbs.SGE{sv.mr.SGE(slot*size, size)}}); err != nil {
					return nil, err
				}
				if err := cl.qp.PostSend(verbs.SendWR{ID: uint64(sent), Op: verbs.OpSend, Flags: signal(sent), SGL: []verbs.SGE{cl.mr.SGE(slot*size, size)}}); err != nil {
					return nil, err
				}
			case "read":
				if err := cl.qp.PostSend(verbs.SendWR{ID: uint64(sent), Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(slot*size, size)},
					RemoteAddr: cl.remote.Addr + uint64(slot*size), RKey: cl.remote.RKey}); err != nil {
					return nil, err
				}
			}
			sent++
		}
		cq := sv.rcq
		if op == "read" {
			cq = cl.scq
		}
		k, err := cq.Wait(ctx, wc[:])
		if err != nil {
			return nil, err
		}
		now := time.Now()
		for _, c := range wc[:k] {
			if c.Status != verbs.StatusSuccess {
				return nil, c.Err()
			}
			lat = append(lat, now.Sub(posted[c.ID]).Seconds())
		}
		done += k
		// Every depth-th Send is signaled, so that the send queue
		// retires the unsignaled ones; their completions are dropped.
		for op != "read" && cl.scq.Poll(wc[:]) > 0 {
		}
	}
	return lat, nil
}

// signal signals every eighth send of a latency run.
func signal(i int) verbs.SendFlags {
	if i%8 == 7 {
		return verbs.Signaled
	}
	return 0
}

func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

// BenchmarkPlacementLoss compares segment placement with stream placement
// on the lossy bridge, in one run:
//
//	sudo go test ./test/ -run XXX -bench PlacementLoss -benchtime 1x -timeout 30m
//
// For each loss rate (clean first, then 0.1, 1 and 2 %, both directions
// lossy) and each operation (RDMA Write, Send, Read), it measures on each
// mode: the throughput of 1 MiB messages (8 in flight; pairs without the
// hole-fill timing), the median and 99th percentile of the time from
// posting a 64 KiB message to its completion at the data's receiver (8 in
// flight), and, on a second pair that times hole fills
// (DeviceConfig.TimeHoleFills, which gives stream placement the observing
// tap), the time from the arrival of the segment that fills a hole to the
// completion it held back (median and mean) during the same bulk
// transfer. It prints each figure with its ratio segment/stream. Rounds
// alternate which mode goes first. Environment: RDMATAP_PLACEMENT_LOSS_RATES
// (percent, default 0,0.1,1,2), _OPS (default write,send,read), _CRC
// (1: negotiate the MPA CRC, which segment placement needs to frame FPDUs
// beyond a hole; default 0,1: both), _SECONDS (per bulk run, default 2),
// _ROUNDS (default 2), _CC (reno or cubic; default netstack's).
func BenchmarkPlacementLoss(b *testing.B) {
	l := newBridgeLab(b)
	secs := 2
	if v, err := strconv.Atoi(os.Getenv("RDMATAP_PLACEMENT_LOSS_SECONDS")); err == nil && v > 0 {
		secs = v
	}
	rounds := 2
	if v, err := strconv.Atoi(os.Getenv("RDMATAP_PLACEMENT_LOSS_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	var rates []float64
	for _, s := range envList("RDMATAP_PLACEMENT_LOSS_RATES", "0,0.1,1,2") {
		p, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil {
			b.Fatalf("RDMATAP_PLACEMENT_LOSS_RATES: %v", err)
		}
		rates = append(rates, p/100)
	}
	ops := envList("RDMATAP_PLACEMENT_LOSS_OPS", "write,send,read")
	say := func(format string, a ...any) { fmt.Fprintf(os.Stderr, format+"\n", a...) }
	modes := []verbs.Placement{verbs.PlacementSegment, verbs.PlacementStream}
	for _, crcS := range envList("RDMATAP_PLACEMENT_LOSS_CRC", "0,1") {
		crc := crcS == "1"
		type pairs struct {
			a, c             *labEnd
			cl, sv, tcl, tsv *labSide
			ta, tb           *labEnd
		}
		conn := map[verbs.Placement]pairs{}
		for _, m := range modes {
			a, c := l.endpoint(b, verbs.DeviceConfig{Placement: m}), l.endpoint(b, verbs.DeviceConfig{Placement: m})
			ta, tb := l.endpoint(b, verbs.DeviceConfig{Placement: m, TimeHoleFills: true}), l.endpoint(b, verbs.DeviceConfig{Placement: m, TimeHoleFills: true})
			cl, sv := labConnect(b, a, c, 8<<20, verbs.ConnParams{CRC: &crc})
			tcl, tsv := labConnect(b, ta, tb, 8<<20, verbs.ConnParams{CRC: &crc})
			for _, s := range []*labSide{cl, sv, tcl, tsv} {
				for i := range s.buf {
					s.buf[i] = byte(i*7 + 3)
				}
			}
			conn[m] = pairs{a, c, cl, sv, tcl, tsv, ta, tb}
		}
		for _, rate := range rates {
			l.setLoss(b, rate)
			for _, op := range ops {
				res := map[verbs.Placement]*labRun{}
				for _, m := range modes {
					res[m] = &labRun{}
				}
				var thr [2][]float64
				for r := 0; r < rounds; r++ {
					order := modes
					if r%2 == 1 {
						order = []verbs.Placement{modes[1], modes[0]}
					}
					for _, m := range order {
						p := conn[m]
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
						mbs, err := labBulk(ctx, p.cl, p.sv, op, time.Duration(secs)*time.Second)
						if err != nil {
							cancel()
							b.Fatalf("%v %s bulk at %g %%: %v (client QP: %v; server QP: %v)\nclient %+v\nserver %+v", m, op, rate*100, err, p.cl.qp.Err(), p.sv.qp.Err(), p.a.dev.Stats().Segment, p.c.dev.Stats().Segment)
						}
						i := 0
						if m == verbs.PlacementStream {
							i = 1
						}
						thr[i] = append(thr[i], mbs)
						lat, err := labLatency(ctx, p.cl, p.sv, op, 2000, time.Duration(secs)*time.Second)
						if err != nil {
							cancel()
							b.Fatalf("%v %s latency at %g %%: %v", m, op, rate*100, err)
						}
						res[m].lat = append(res[m].lat, lat...)
						if rate > 0 {
							ga, gb := p.ta.dev.Stats().Segment, p.tb.dev.Stats().Segment
							if _, err := labBulk(ctx, p.tcl, p.tsv, op, time.Duration(secs)*time.Second); err != nil {
								cancel()
								b.Fatalf("%v %s timed bulk at %g %%: %v", m, op, rate*100, err)
							}
							ha, hb := p.ta.dev.Stats().Segment, p.tb.dev.Stats().Segment
							d1, d2 := ha.HoleFillHist.Sub(&ga.HoleFillHist), hb.HoleFillHist.Sub(&gb.HoleFillHist)
							res[m].fills.Add(&d1)
							res[m].fills.Add(&d2)
							res[m].fillTime += ha.HoleFillTime - ga.HoleFillTime + hb.HoleFillTime - gb.HoleFillTime
							res[m].fillsCount += ha.HoleFills - ga.HoleFills + hb.HoleFills - gb.HoleFills
						}
						cancel()
					}
				}
				sg, st := res[verbs.PlacementSegment], res[verbs.PlacementStream]
				sgT, stT := quantile(thr[0], 0.5), quantile(thr[1], 0.5)
				us := func(v float64) float64 { return v * 1e6 }
				line := fmt.Sprintf("crc=%v loss %.1f%% %s: throughput seg %.0f / stream %.0f MB/s = %.2f; 64 KiB p50 %.0f / %.0f µs = %.2f, p99 %.0f / %.0f µs = %.2f",
					crc, rate*100, op, sgT, stT, sgT/stT,
					us(quantile(sg.lat, .5)), us(quantile(st.lat, .5)), quantile(sg.lat, .5)/quantile(st.lat, .5),
					us(quantile(sg.lat, .99)), us(quantile(st.lat, .99)), quantile(sg.lat, .99)/quantile(st.lat, .99))
				tag := fmt.Sprintf("crc%v_%s_%g%%", crc, op, rate*100)
				b.ReportMetric(sgT/stT, "thr-x_"+tag)
				b.ReportMetric(quantile(sg.lat, .5)/quantile(st.lat, .5), "p50-x_"+tag)
				b.ReportMetric(quantile(sg.lat, .99)/quantile(st.lat, .99), "p99-x_"+tag)
				if sg.fillsCount > 0 && st.fillsCount > 0 {
					sgM := sg.fillTime.Seconds() / float64(sg.fillsCount)
					stM := st.fillTime.Seconds() / float64(st.fillsCount)
					line += fmt.Sprintf("; hole fill to completion p50 %.0f / %.0f µs = %.2f, mean %.0f / %.0f µs = %.2f (%d / %d fills)",
						us(sg.fills.Quantile(.5).Seconds()), us(st.fills.Quantile(.5).Seconds()), sg.fills.Quantile(.5).Seconds()/st.fills.Quantile(.5).Seconds(),
						us(sgM), us(stM), sgM/stM, sg.fillsCount, st.fillsCount)
					b.ReportMetric(sg.fills.Quantile(.5).Seconds()/st.fills.Quantile(.5).Seconds(), "fill-p50-x_"+tag)
				} else if rate > 0 {
					line += fmt.Sprintf("; hole fills timed: %d / %d", sg.fillsCount, st.fillsCount)
				}
				say("%s", line)
			}
		}
		l.setLoss(b, 0)
	}
}
