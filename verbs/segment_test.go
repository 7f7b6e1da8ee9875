package verbs_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
)

// impairedPair is a pair whose side A (the client) sends through an
// impairment link: loss, reordering and duplication of what A sends.
func impairedPair(t testing.TB, icfg netstack.ImpairConfig, lcfg netstack.LinkConfig, ca, cb verbs.DeviceConfig) *pair {
	t.Helper()
	la, lb := netstack.NewLinkPair(lcfg)
	scfg := netstack.Config{MinRTO: 20 * time.Millisecond}
	scfg.Link, scfg.Addrs = netstack.NewImpair(la, icfg), []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}
	na, err := netstack.New(scfg)
	if err != nil {
		t.Fatal(err)
	}
	scfg.Link, scfg.Addrs = lb, []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}
	nb, err := netstack.New(scfg)
	if err != nil {
		t.Fatal(err)
	}
	return pairOn(t, na, nb, ca, cb)
}

// TestSegmentPlacementUnderImpairment: with segment placement on the
// receiving side and loss, reordering and duplication on the way, a
// stream of RDMA Writes of random sizes and places (each followed by a
// Send that tells the receiver it is complete, as RDMAP orders them) lands
// byte for byte where it belongs, nothing lands elsewhere, every payload
// byte is placed exactly once (placed bytes equal received bytes), and
// placement from segments did happen (before TCP delivered: beyond holes,
// or fed to the receiver with the segment that filled its hole).
func TestSegmentPlacementUnderImpairment(t *testing.T) {
	for _, tc := range []struct {
		crc, gso, markers bool
	}{{true, false, false}, {false, false, false}, {true, true, false}, {false, true, false},
		{false, false, true}, {true, false, true}, {false, true, true}, {true, true, true}} {
		crc := tc.crc
		t.Run(fmt.Sprintf("crc=%v,gso=%v,markers=%v", tc.crc, tc.gso, tc.markers), func(t *testing.T) {
			icfg := netstack.ImpairConfig{Seed: 11, LossRate: 0.01, ReorderRate: 0.01, DupRate: 0.01}
			// Without GSO every segment is one FPDU (aligned); with it,
			// 64 KB segments cut FPDUs anywhere.
			lcfg := netstack.LinkConfig{MTU: 1500, NoGSO: !tc.gso}
			p := impairedPair(t, icfg, lcfg, verbs.DeviceConfig{CRC: crc, Markers: tc.markers},
				verbs.DeviceConfig{CRC: crc, Markers: tc.markers, Placement: verbs.PlacementSegment})
			const size = 4 << 20
			cl, sv := connect(t, p, size, verbs.ConnParams{Markers: &tc.markers})
			if n := sv.conn.Negotiated(); n.MarkersRx != tc.markers {
				t.Fatalf("negotiated %+v", n)
			}
			rng := rand.New(rand.NewPCG(3, 4))
			fill(cl.buf, 99)
			want := make([]byte, size)
			var total uint64
			for i := 0; i < 60; i++ {
				n := 1 + rng.IntN(512<<10)
				total += uint64(n)
				src, dst := rng.IntN(size-n), rng.IntN(size-n)
				if err := sv.qp.PostRecv(verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{sv.mr.SGE(0, 0)}}); err != nil {
					t.Fatal(err)
				}
				if err := cl.qp.PostSend(
					verbs.SendWR{ID: 1, Op: verbs.OpWrite, SGL: []verbs.SGE{cl.mr.SGE(src, n)}, RemoteAddr: cl.remote.Addr + uint64(dst), RKey: cl.remote.RKey},
					verbs.SendWR{ID: 2, Op: verbs.OpSend, Flags: verbs.Signaled},
				); err != nil {
					t.Fatal(err)
				}
				mustOK(t, wait1(t, cl.scq), verbs.WCSend, 0)
				mustOK(t, wait1(t, sv.rcq), verbs.WCRecv, 0)
				copy(want[dst:dst+n], cl.buf[src:src+n])
				if !bytes.Equal(sv.buf, want) {
					for k := range want {
						if sv.buf[k] != want[k] {
							t.Fatalf("write %d (%d bytes at %d): byte %d is %#x, want %#x", i, n, dst, k, sv.buf[k], want[k])
						}
					}
				}
			}
			// The receive path adds its counters after each stream read:
			// let the last one land.
			st := p.b.Stats()
			for deadline := time.Now().Add(5 * time.Second); st.RxBytes < total && time.Now().Before(deadline); st = p.b.Stats() {
				time.Sleep(time.Millisecond)
			}
			g := st.Segment
			t.Logf("fed %d bytes, delivered %d FPDUs early", g.Fed, g.DeliveredEarly)
			t.Logf("placed %d bytes (%d from segments early, %d beyond holes), received %d; FPDUs by marker %d, by stream %d, by alignment %d; unframed segments %d; left in order %d; refused %d (crc %d, header %d, STag %d, marker %d); duplicates %d bytes; bad checksum %d, out of window %d",
				st.PlacedBytes, g.PlacedEarly, g.OutOfOrder, st.RxBytes, g.ByMarker, g.ByStream, g.ByAlignment, g.Unframed, g.LeftInOrder, g.Refused, g.RefusedCRC, g.RefusedHeader, g.RefusedSTag, g.RefusedMarker, g.Duplicates, g.BadChecksum, g.OutOfWindow)
			if st.PlacedBytes != total || st.RxBytes != total {
				t.Fatalf("placed %d bytes, received %d, sent %d: not every byte exactly once", st.PlacedBytes, st.RxBytes, total)
			}
			if g.Mismatches != 0 {
				t.Fatalf("%d placed FPDUs differed from what TCP delivered", g.Mismatches)
			}
			if g.PlacedEarly == 0 {
				t.Fatal("nothing was placed from segments")
			}
			// Beyond a hole, FPDUs are found by markers, or by alignment
			// with the CRC. (With GSO, the link drops whole 64 KB
			// super-segments: too few arrive beyond a hole in a run this
			// short for the count to be sure.)
			if (tc.markers || crc) && !tc.gso && g.OutOfOrder == 0 {
				t.Fatal("nothing was placed beyond a hole")
			}
			if tc.markers && !tc.gso && g.ByMarker == 0 {
				t.Fatal("no FPDU was located by a marker")
			}
			// With markers and without GSO, the sender sizes every
			// FPDU to fill its segment with the markers in it, so
			// nearly every segment beyond a hole starts with an FPDU
			// that its markers point to (measured: some 1,700 FPDUs
			// by marker against 0 to 2 unframed segments, and 13% of
			// the bytes placed beyond holes; before, 5 to 13 against
			// some 650, and under 0.1%).
			if tc.markers && !tc.gso && (g.ByMarker < 200 || g.ByMarker < 20*g.Unframed || g.OutOfOrder < total/50) {
				t.Fatalf("with markers: %d FPDUs located by marker, %d segments unframed, %d of %d bytes placed beyond holes; want the FPDUs by marker to outnumber the unframed segments twentyfold and 2%% of the bytes beyond holes",
					g.ByMarker, g.Unframed, g.OutOfOrder, total)
			}
			// A segment that fills the hole the receiver waits at is fed
			// to it from the tap (with markers, to the stripper in front
			// of it), and what was placed beyond the hole is delivered
			// then.
			if !tc.gso && (g.Fed == 0 || g.DeliveredEarly == 0) {
				t.Fatalf("fed %d bytes, delivered %d FPDUs early", g.Fed, g.DeliveredEarly)
			}
		})
	}
}

// TestSegmentPlacementMixed: Writes, Sends and Reads under loss, reordering
// and duplication, several in flight at once, with segment placement on
// the side that receives the impaired direction: the client's Writes and
// Sends, and the Read Responses to the server's Reads of the client's
// memory. Every byte lands where it belongs and nowhere else, receives
// complete in the order they were posted with the right lengths, every
// payload byte is placed exactly once, and the segment path placed each
// kind of message (with the CRC, FPDUs beyond holes are framed).
func TestSegmentPlacementMixed(t *testing.T) {
	for _, tc := range []struct {
		crc, gso, markers bool
	}{{true, false, false}, {false, false, false}, {false, false, true}, {true, false, true}} {
		// (Without GSO: with it, this workload on the impaired link
		// stalls for seconds in either placement mode now and then, in
		// TCP's retransmission backoff, and the writes-only test above
		// covers placement from 64 KB segments.)
		t.Run(fmt.Sprintf("crc=%v,gso=%v,markers=%v", tc.crc, tc.gso, tc.markers), func(t *testing.T) {
			icfg := netstack.ImpairConfig{Seed: 21, LossRate: 0.01, ReorderRate: 0.01, DupRate: 0.01}
			lcfg := netstack.LinkConfig{MTU: 1500, NoGSO: !tc.gso}
			p := impairedPair(t, icfg, lcfg, verbs.DeviceConfig{CRC: tc.crc, Markers: tc.markers},
				verbs.DeviceConfig{CRC: tc.crc, Markers: tc.markers, Placement: verbs.PlacementSegment})
			const size, slots = 4 << 20, 4
			const slot = size / slots
			cl, sv := connect(t, p, size, verbs.ConnParams{Markers: &tc.markers})
			rng := rand.New(rand.NewPCG(7, 8))
			fill(cl.buf, 5)
			want := make([]byte, size)
			var recvID uint64
			var sends, reads, writes int
			for round := 0; round < 40; round++ {
				// One operation per slot, all in flight together.
				var wantRecv []int // lengths of the receives posted this round, in order
				var readsOut int
				for s := 0; s < slots; s++ {
					n := 1 + rng.IntN(200<<10)
					dst := s*slot + rng.IntN(slot-n)
					src := rng.IntN(size - n)
					switch rng.IntN(3) {
					case 0:
						writes++
						if err := cl.qp.PostSend(verbs.SendWR{ID: 1, Op: verbs.OpWrite, SGL: []verbs.SGE{cl.mr.SGE(src, n)},
							RemoteAddr: cl.remote.Addr + uint64(dst), RKey: cl.remote.RKey}); err != nil {
							t.Fatal(err)
						}
					case 1:
						sends++
						// A receive larger than the message: what lies
						// beyond the message must stay untouched.
						if err := sv.qp.PostRecv(verbs.RecvWR{ID: recvID, SGL: []verbs.SGE{sv.mr.SGE(dst, min(n+100, s*slot+slot-dst))}}); err != nil {
							t.Fatal(err)
						}
						recvID++
						wantRecv = append(wantRecv, n)
						if err := cl.qp.PostSend(verbs.SendWR{ID: 2, Op: verbs.OpSend, SGL: []verbs.SGE{cl.mr.SGE(src, n)}}); err != nil {
							t.Fatal(err)
						}
					default:
						reads++
						if err := sv.qp.PostSend(verbs.SendWR{ID: 3, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{sv.mr.SGE(dst, n)},
							RemoteAddr: sv.remote.Addr + uint64(src), RKey: sv.remote.RKey}); err != nil {
							t.Fatal(err)
						}
						readsOut++
					}
					copy(want[dst:dst+n], cl.buf[src:src+n])
				}
				// A Send behind everything tells when the Writes are in.
				if err := sv.qp.PostRecv(verbs.RecvWR{ID: recvID, SGL: []verbs.SGE{sv.mr.SGE(0, 0)}}); err != nil {
					t.Fatal(err)
				}
				recvID++
				wantRecv = append(wantRecv, 0)
				if err := cl.qp.PostSend(verbs.SendWR{ID: 4, Op: verbs.OpSend, Flags: verbs.Signaled}); err != nil {
					t.Fatal(err)
				}
				first := recvID - uint64(len(wantRecv))
				for i, n := range wantRecv {
					wc := wait1(t, sv.rcq)
					mustOK(t, wc, verbs.WCRecv, n)
					if wc.ID != first+uint64(i) {
						t.Fatalf("receive %d completed in place of %d", wc.ID, first+uint64(i))
					}
				}
				for i := 0; i < readsOut; i++ {
					mustOK(t, wait1(t, sv.scq), verbs.WCRead, -1)
				}
				mustOK(t, wait1(t, cl.scq), verbs.WCSend, 0)
				if !bytes.Equal(sv.buf, want) {
					for k := range want {
						if sv.buf[k] != want[k] {
							t.Fatalf("round %d: byte %d is %#x, want %#x", round, k, sv.buf[k], want[k])
						}
					}
				}
			}
			st := p.b.Stats()
			for deadline := time.Now().Add(5 * time.Second); st.RxBytes < st.PlacedBytes && time.Now().Before(deadline); st = p.b.Stats() {
				time.Sleep(time.Millisecond)
			}
			g := st.Segment
			t.Logf("%d writes, %d sends, %d reads; placed %d bytes (%d from segments early: %d beyond holes, %d of Sends, %d of Read Responses, %d fed); received %d; delivered early %d FPDUs; mismatches %d",
				writes, sends, reads, st.PlacedBytes, g.PlacedEarly, g.OutOfOrder, g.EarlySends, g.EarlyReadResponses, g.Fed, st.RxBytes, g.DeliveredEarly, g.Mismatches)
			if g.Mismatches != 0 {
				t.Fatalf("%d placed FPDUs differed from what TCP delivered", g.Mismatches)
			}
			if tc.crc && !tc.markers && (g.OutOfOrder == 0 || g.EarlySends == 0 || g.EarlyReadResponses == 0) {
				t.Fatalf("placed from segments: %d bytes beyond holes, %d of Sends, %d of Read Responses; want each", g.OutOfOrder, g.EarlySends, g.EarlyReadResponses)
			}
		})
	}
}

// TestSegmentQuickFeed: with segment placement on both sides of a clean
// link, a ping-pong of short Sends (and short RDMA Writes with immediate
// data) completes from the tap: the short segments that arrive in order
// are fed to the waiting receiver (QuickFed counts them), every message
// lands intact and in order, and the bytes TCP hands over later are not
// placed again (placed early equals what was fed, and the receive
// completions carry each message once).
func TestSegmentQuickFeed(t *testing.T) {
	for _, crc := range []bool{false, true} {
		t.Run(fmt.Sprintf("crc=%v", crc), func(t *testing.T) {
			dc := verbs.DeviceConfig{CRC: crc, Placement: verbs.PlacementSegment}
			p := impairedPair(t, netstack.ImpairConfig{}, netstack.LinkConfig{MTU: 1500, NoGSO: true}, dc, dc)
			cl, sv := connect(t, p, 1<<16, verbs.ConnParams{CRC: &crc})
			var wc [4]verbs.WC
			const rounds = 300
			for i := 0; i < rounds; i++ {
				size := 1 + i%200
				for k := 0; k < size; k++ {
					cl.buf[k] = byte(i + k)
					sv.buf[4096+k] = byte(i*3 + k)
				}
				if err := sv.qp.PostRecv(verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{sv.mr.SGE(0, 256)}}); err != nil {
					t.Fatal(err)
				}
				if err := cl.qp.PostSend(verbs.SendWR{ID: uint64(i), Op: verbs.OpSend, SGL: []verbs.SGE{cl.mr.SGE(0, size)}}); err != nil {
					t.Fatal(err)
				}
				if err := waitOne(sv.rcq, wc[:], verbs.WCRecv); err != nil {
					t.Fatal(err)
				}
				if wc[0].ID != uint64(i) || int(wc[0].ByteLen) != size || !bytes.Equal(sv.buf[:size], cl.buf[:size]) {
					t.Fatalf("round %d: completion %+v, data %x want %x", i, wc[0], sv.buf[:size], cl.buf[:size])
				}
				// The reply: an RDMA Write with immediate data into the
				// client's buffer at 8 KiB.
				if err := cl.qp.PostRecv(verbs.RecvWR{ID: uint64(i)}); err != nil {
					t.Fatal(err)
				}
				if err := sv.qp.PostSend(verbs.SendWR{ID: uint64(i), Op: verbs.OpWriteImm, Imm: uint32(i),
					SGL: []verbs.SGE{sv.mr.SGE(4096, size)}, RemoteAddr: sv.remote.Addr + 8192, RKey: sv.remote.RKey}); err != nil {
					t.Fatal(err)
				}
				if err := waitOne(cl.rcq, wc[:], verbs.WCRecvRDMAWithImm); err != nil {
					t.Fatal(err)
				}
				if wc[0].Imm != uint32(i) || !bytes.Equal(cl.buf[8192:8192+size], sv.buf[4096:4096+size]) {
					t.Fatalf("round %d: reply %+v, data %x want %x", i, wc[0], cl.buf[8192:8192+size], sv.buf[4096:4096+size])
				}
				for sv.scq.Poll(wc[:]) > 0 {
				}
				for cl.scq.Poll(wc[:]) > 0 {
				}
			}
			for _, d := range []*verbs.Device{p.a, p.b} {
				g := d.Stats().Segment
				t.Logf("%s: quick-fed %d segments (%d bytes), placed early %d bytes, fed %d, delivered early %d FPDUs, duplicates %d, mismatches %d",
					d.Name(), g.QuickFed, g.QuickFedBytes, g.PlacedEarly, g.Fed, g.DeliveredEarly, g.Duplicates, g.Mismatches)
				if g.QuickFed == 0 || g.DeliveredEarly == 0 {
					t.Errorf("%s: no short segment was fed from the tap", d.Name())
				}
				if g.Mismatches != 0 || g.PlacedEarly != g.QuickFedBytes || g.Fed != 0 {
					t.Errorf("%s: placed early %d bytes, quick-fed %d, fed %d, mismatches %d", d.Name(), g.PlacedEarly, g.QuickFedBytes, g.Fed, g.Mismatches)
				}
			}
		})
	}
}

// waitOne waits for one successful completion of op into wc[0].
func waitOne(cq *verbs.CQ, wc []verbs.WC, op verbs.WCOpcode) error {
	if _, err := waitN(cq, wc[:1]); err != nil {
		return err
	}
	if wc[0].Status != verbs.StatusSuccess || wc[0].Op != op {
		return &verbs.CompletionError{WC: wc[0]}
	}
	return nil
}

// TestSegmentQuickFeedReads: with segment placement on a clean link, short
// Read Requests and atomic requests reach the responder's receiver from
// the tap (QuickFed counts them), which then sends the responses from the
// link's goroutine. Every Read returns the source's bytes, every FetchAdd
// the word's previous value, and a long Read (beyond what the link's
// goroutine sends) goes through the TX goroutine as before.
func TestSegmentQuickFeedReads(t *testing.T) {
	dc := verbs.DeviceConfig{Placement: verbs.PlacementSegment}
	p := impairedPair(t, netstack.ImpairConfig{}, netstack.LinkConfig{MTU: 1500, NoGSO: true}, dc, dc)
	cl, sv := connect(t, p, 1<<16, verbs.ConnParams{})
	target := atomicTarget(t, sv.pd, 64)
	w := word(target.Bytes(), 8)
	var wc [1]verbs.WC
	const rounds = 300
	for i := 0; i < rounds; i++ {
		size := 1 + i%200
		if i%50 == 49 {
			size = 20000 // longer than respondInlineMax
		}
		for k := 0; k < size; k++ {
			sv.buf[8192+k] = byte(i*7 + k)
		}
		if err := cl.qp.PostSend(verbs.SendWR{ID: uint64(i), Op: verbs.OpRead, Flags: verbs.Signaled,
			SGL: []verbs.SGE{cl.mr.SGE(8192, size)}, RemoteAddr: cl.remote.Addr + 8192, RKey: cl.remote.RKey}); err != nil {
			t.Fatal(err)
		}
		if err := waitOne(cl.scq, wc[:], verbs.WCRead); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if !bytes.Equal(cl.buf[8192:8192+size], sv.buf[8192:8192+size]) {
			t.Fatalf("round %d: the %d-byte Read returned other bytes", i, size)
		}
		if err := cl.qp.PostSend(verbs.SendWR{ID: uint64(i), Op: verbs.OpAtomicFetchAdd, Flags: verbs.Signaled,
			SGL: []verbs.SGE{cl.mr.SGE(0, 8)}, RemoteAddr: target.Addr() + 8, RKey: target.RKey(), CompareAdd: 3}); err != nil {
			t.Fatal(err)
		}
		if err := waitOne(cl.scq, wc[:], verbs.WCFetchAdd); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if got := *(*uint64)(unsafe.Pointer(&cl.buf[0])); got != uint64(3*i) {
			t.Fatalf("round %d: FetchAdd returned %d, want %d", i, got, 3*i)
		}
	}
	if v := atomic.LoadUint64(w); v != 3*rounds {
		t.Fatalf("target %d after %d adds of 3", v, rounds)
	}
	if g := p.b.Stats().Segment; g.QuickFed < rounds || g.Mismatches != 0 {
		t.Errorf("responder: quick-fed %d of %d requests, mismatches %d", g.QuickFed, 2*rounds, g.Mismatches)
	}
}
