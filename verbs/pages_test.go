package verbs_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/zerocopy"
)

// Fast registration over scattered pages: a REG_MR over a page list of
// separate buffers maps one contiguous Tagged Offset space onto the pages
// in list order (RFC 5040 §5.2, RFC 5042's STag over a set of pages).

var termReadBaseBounds = verbs.TermCode{Layer: verbs.TermRDMAP, EType: iwarp.ETypeRemoteProtection, Code: iwarp.CodeBaseBounds}

// scattered returns n pages of ps bytes, each its own allocation: no page
// follows another in memory as far as Go slices can tell.
func scattered(n, ps int) [][]byte {
	pgs := make([][]byte, n)
	for i := range pgs {
		pgs[i] = make([]byte, ps)
	}
	return pgs
}

// pageView returns n bytes at byte off of the pages taken in order.
func pageView(pgs [][]byte, off, n int) []byte {
	var b []byte
	for _, p := range pgs {
		b = append(b, p...)
	}
	return b[off : off+n]
}

// checkPages fails unless the pages hold want at byte off (in list order)
// and zeros everywhere else.
func checkPages(t *testing.T, what string, pgs [][]byte, off int, want []byte) {
	t.Helper()
	all := pageView(pgs, 0, len(pgs)*len(pgs[0]))
	for i, c := range all {
		w := byte(0)
		if i >= off && i < off+len(want) {
			w = want[i-off]
		}
		if c != w {
			t.Fatalf("%s: byte %d of the page list (page %d, byte %d) is %#x, want %#x", what, i, i/len(pgs[0]), i%len(pgs[0]), c, w)
		}
	}
}

// regScattered maps frmr onto length bytes from offset in pgs and
// registers it under the next key; iova, when not 0, is set first.
func regScattered(t *testing.T, e *end, frmr *verbs.MR, pgs [][]byte, offset, length int, iova uint64, acc verbs.Access) {
	t.Helper()
	if err := frmr.MapPages(pgs, 4096, offset, length); err != nil {
		t.Fatal(err)
	}
	if iova != 0 {
		if err := frmr.SetIOVA(iova); err != nil {
			t.Fatal(err)
		}
	}
	post(t, e, frmr.RegWR(70, verbs.Signaled, verbs.IncRKey(frmr.RKey()), acc))
	mustOK(t, wait1(t, e.scq), verbs.WCRegMR, 0)
}

// TestFastRegisterScatteredPages: a fast-register MR over five separate
// pages (from byte 300 of the first to 200 bytes before the end of the
// last), VA-based, zero-based and with an IOVA set: a peer's Write and
// Read spanning four pages land in and come from the right pages; a Send
// from and a receive into the MR's lkey span pages; a Read into it as the
// sink spans pages; an atomic lands in its page; a window bound inside it
// spans pages; and a Read with local invalidate into it invalidates it.
func TestFastRegisterScatteredPages(t *testing.T) {
	for _, tc := range []struct {
		name string
		acc  verbs.Access
		iova uint64
	}{{"va", 0, 0}, {"zero-based", verbs.AccessZeroBased, 0}, {"iova", 0, 0x7000_0000_0123}} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
			cl, sv := connect(t, p, 1<<16, verbs.ConnParams{})
			frmr, err := sv.pd.AllocMR(6)
			if err != nil {
				t.Fatal(err)
			}
			pgs := scattered(5, 4096)
			const off, length = 300, 5*4096 - 300 - 200
			regScattered(t, sv, frmr, pgs, off, length, tc.iova, remoteRW|verbs.AccessRemoteAtomic|verbs.AccessMWBind|tc.acc)
			r := frmr.Remote()
			wantAddr := iwarp.BufferAddr(pgs[0][off:])
			switch {
			case tc.acc&verbs.AccessZeroBased != 0:
				wantAddr = 0
			case tc.iova != 0:
				wantAddr = tc.iova
			}
			if r.Addr != wantAddr || r.Len != length || frmr.Len() != length || frmr.Bytes() != nil {
				t.Fatalf("registration %+v, Len %d, Bytes %v; want address %#x, %d bytes, no Bytes", r, frmr.Len(), frmr.Bytes() != nil, wantAddr, length)
			}

			// A Write across pages 0 to 3.
			msg := make([]byte, 3*4096+777)
			fill(msg, 1)
			dst, _ := r.Slice(2000, uint64(len(msg)))
			writeAndSync(t, cl, sv, msg, dst)
			checkPages(t, "Write across pages", pgs, off+2000, msg)

			// A Read across pages 0 to 4.
			src, _ := r.Slice(100, 4*4096)
			if got := readInto(t, cl, src, 4*4096); !bytes.Equal(got, pageView(pgs, off+100, 4*4096)) {
				t.Fatal("a Read across pages returned other bytes")
			}

			// A Send from the lkey across pages 0 and 1.
			if err := cl.qp.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{cl.mr.SGE(0, 5000)}}); err != nil {
				t.Fatal(err)
			}
			post(t, sv, verbs.SendWR{ID: 2, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{frmr.SGE(3000, 5000)}})
			mustOK(t, wait1(t, sv.scq), verbs.WCSend, 5000)
			mustOK(t, wait1(t, cl.rcq), verbs.WCRecv, 5000)
			if !bytes.Equal(cl.buf[:5000], pageView(pgs, off+3000, 5000)) {
				t.Fatal("a Send from the MR across pages sent other bytes")
			}

			// A receive into the lkey across pages 1 to 3, then a Read
			// into it as the sink across pages 3 and 4.
			for _, pg := range pgs {
				clear(pg)
			}
			if err := sv.qp.PostRecv(verbs.RecvWR{ID: 3, SGL: []verbs.SGE{frmr.SGE(4000, 7000)}}); err != nil {
				t.Fatal(err)
			}
			fill(cl.buf[:7000], 2)
			post(t, cl, verbs.SendWR{ID: 4, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(0, 7000)}})
			mustOK(t, wait1(t, cl.scq), verbs.WCSend, 7000)
			mustOK(t, wait1(t, sv.rcq), verbs.WCRecv, 7000)
			checkPages(t, "a receive across pages", pgs, off+4000, cl.buf[:7000])
			for _, pg := range pgs {
				clear(pg)
			}
			fill(cl.buf[:5000], 3)
			post(t, sv, verbs.SendWR{ID: 5, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{frmr.SGE(12000, 5000)},
				RemoteAddr: sv.remote.Addr, RKey: sv.remote.RKey})
			mustOK(t, wait1(t, sv.scq), verbs.WCRead, 5000)
			checkPages(t, "a Read into the MR across pages", pgs, off+12000, cl.buf[:5000])

			// A Fetch&Add on a word of page 2.
			for _, pg := range pgs {
				clear(pg)
			}
			wordTO := 2*4096 - off + 16 // byte 16 of page 2
			pgs[2][16] = 40
			word, _ := r.Slice(uint64(wordTO), 8)
			post(t, cl, verbs.SendWR{ID: 6, Op: verbs.OpAtomicFetchAdd, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(0, 8)},
				RemoteAddr: word.Addr, RKey: word.RKey, CompareAdd: 2})
			mustOK(t, wait1(t, cl.scq), verbs.WCFetchAdd, 8)
			if pgs[2][16] != 42 || cl.buf[0] != 40 {
				t.Fatalf("Fetch&Add: the word is %d, the original %d; want 42 and 40", pgs[2][16], cl.buf[0])
			}
			pgs[2][16] = 0

			// A type 2 window over pages 1 to 4, written across them.
			mw := bindType2(t, sv, frmr, frmr.Addr()+4000, 12000, verbs.AccessRemoteWrite)
			fill(msg, 4)
			wdst, _ := mw.Remote().Slice(500, 11000)
			writeAndSync(t, cl, sv, msg[:11000], wdst)
			checkPages(t, "a Write through a window across pages", pgs, off+4500, msg[:11000])
			post(t, sv, verbs.SendWR{ID: 7, Op: verbs.OpLocalInv, Flags: verbs.Signaled, InvalidateRKey: mw.RKey()})
			mustOK(t, wait1(t, sv.scq), verbs.WCLocalInv, 0)

			// A Read with local invalidate into it across pages 0 and 1.
			for _, pg := range pgs {
				clear(pg)
			}
			fill(cl.buf[:6000], 5)
			post(t, sv, verbs.SendWR{ID: 8, Op: verbs.OpReadInv, Flags: verbs.Signaled, SGL: []verbs.SGE{frmr.SGE(10, 6000)},
				RemoteAddr: sv.remote.Addr, RKey: sv.remote.RKey, InvalidateRKey: frmr.LKey()})
			mustOK(t, wait1(t, sv.scq), verbs.WCRead, 6000)
			if frmr.Valid() {
				t.Fatal("the MR is valid after a Read with local invalidate into it")
			}
			checkPages(t, "a Read with invalidate across pages", pgs, off+10, cl.buf[:6000])
		})
	}
}

// TestFastRegisterScatteredBounds: an access that runs past the last
// mapped byte of a page-list registration is refused with a Terminate
// (Write: DDP / Tagged Buffer / Base or Bounds; Read: RDMAP / Remote
// Protection / Base or Bounds), though the last page has bytes there, and
// nothing is placed.
func TestFastRegisterScatteredBounds(t *testing.T) {
	for _, tc := range []struct {
		name string
		read bool
		to   uint64 // from the registration's start
		n    int
	}{
		{"write-across-the-end", false, 3*4096 - 300 - 500 - 100, 200},
		{"write-after-the-end", false, 3*4096 - 300 - 500, 8},
		{"read-across-the-end", true, 3*4096 - 300 - 500 - 4000, 4001},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
			cl, sv := connect(t, p, 1<<16, verbs.ConnParams{})
			frmr, err := sv.pd.AllocMR(3)
			if err != nil {
				t.Fatal(err)
			}
			pgs := scattered(3, 4096)
			regScattered(t, sv, frmr, pgs, 300, 3*4096-300-500, 0, remoteRW)
			r := frmr.Remote()
			if tc.read {
				post(t, cl, verbs.SendWR{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(0, tc.n)},
					RemoteAddr: r.Addr + tc.to, RKey: r.RKey})
				wc := wait1(t, cl.scq)
				if wc.Status != verbs.StatusRemoteAccess || wc.Term != termReadBaseBounds {
					t.Fatalf("Read past the end: %v %v", wc.Status, wc.Term)
				}
				expectTerminate(t, p.b, cl, termReadBaseBounds)
				return
			}
			fill(cl.buf[:tc.n], 9)
			post(t, cl, verbs.SendWR{ID: 1, Op: verbs.OpWrite, SGL: []verbs.SGE{cl.mr.SGE(0, tc.n)}, RemoteAddr: r.Addr + tc.to, RKey: r.RKey})
			expectTerminate(t, p.b, cl, termBaseBounds)
			checkPages(t, "after the refused Write", pgs, 0, nil)
		})
	}
}

// TestScatteredPagesUnderSegmentPlacement: with segment placement on a
// lossy, reordering link, Writes into a registration over 64 separate
// pages are left to the stream by the placer and land in order.
func TestScatteredPagesUnderSegmentPlacement(t *testing.T) {
	icfg := netstack.ImpairConfig{Seed: 7, LossRate: 0.02, ReorderRate: 0.02}
	p := impairedPair(t, icfg, netstack.LinkConfig{MTU: 1500, NoGSO: true}, verbs.DeviceConfig{},
		verbs.DeviceConfig{Placement: verbs.PlacementSegment})
	const size = 256 << 10
	cl, sv := connect(t, p, size, verbs.ConnParams{})
	frmr, err := sv.pd.AllocMR(size / 4096)
	if err != nil {
		t.Fatal(err)
	}
	pgs := scattered(size/4096, 4096)
	regScattered(t, sv, frmr, pgs, 0, size, 0, remoteRW)
	msg := make([]byte, size)
	fill(msg, 11)
	writeAndSync(t, cl, sv, msg, frmr.Remote())
	checkPages(t, "a Write across 64 pages", pgs, 0, msg)
	if got := readInto(t, cl, frmr.Remote(), size); !bytes.Equal(got, msg) {
		t.Fatal("a Read across 64 pages returned other bytes")
	}
	// A Send into a receive across the pages: the placer may place it
	// beyond holes, piece by piece.
	for _, pg := range pgs {
		clear(pg)
	}
	if err := sv.qp.PostRecv(verbs.RecvWR{ID: 9, SGL: []verbs.SGE{frmr.SGE(0, size)}}); err != nil {
		t.Fatal(err)
	}
	fill(cl.buf[:size], 12)
	post(t, cl, verbs.SendWR{ID: 10, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(0, size)}})
	mustOK(t, wait1(t, cl.scq), verbs.WCSend, size)
	mustOK(t, wait1(t, sv.rcq), verbs.WCRecv, size)
	checkPages(t, "a Send across 64 pages", pgs, 0, cl.buf[:size])
	t.Logf("placed from segments: %d bytes", p.b.Stats().Segment.PlacedEarly)
}

// TestRegMRIOVA: a regular MR registered with an IOVA (ibv_reg_mr_iova) is
// addressed from it by peers and SGEs; below it or past its end is
// refused.
func TestRegMRIOVA(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl, sv := connect(t, p, 1<<16, verbs.ConnParams{})
	buf := make([]byte, 8192)
	const iova = 0x10_0000_0000
	mr, err := sv.pd.RegMRIOVA(buf, iova, remoteRW)
	if err != nil {
		t.Fatal(err)
	}
	if mr.Addr() != iova || mr.SGE(10, 1).Addr != iova+10 {
		t.Fatalf("address %#x, SGE at %#x", mr.Addr(), mr.SGE(10, 1).Addr)
	}
	msg := bytes.Repeat([]byte("iova"), 100)
	dst, _ := mr.Remote().Slice(1000, uint64(len(msg)))
	writeAndSync(t, cl, sv, msg, dst)
	checkPlaced(t, "a Write at the IOVA", buf, 1000, msg)
	post(t, cl, verbs.SendWR{ID: 1, Op: verbs.OpWrite, SGL: []verbs.SGE{cl.mr.SGE(0, 8)}, RemoteAddr: iova - 4, RKey: mr.RKey()})
	expectTerminate(t, p.b, cl, termBaseBounds)
}

// TestFastRegisterSGGaps: MapSG over SGEs that leave gaps at page
// boundaries (ib_map_mr_sg's rule) maps them as one TO space: a Write
// across all of them lands in them and in nothing between; a gap that is
// not at a page boundary is refused.
func TestFastRegisterSGGaps(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl, sv := connect(t, p, 1<<16, verbs.ConnParams{})
	zb, err := zerocopy.Alloc(8 * 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer zb.Close()
	pool := zb.Bytes()
	local, err := sv.pd.RegMR(pool, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Dereg()
	frmr, err := sv.pd.AllocMR(5)
	if err != nil {
		t.Fatal(err)
	}
	for name, sgl := range map[string][]verbs.SGE{
		"gap after an SGE ending inside a page":    {local.SGE(100, 3000), local.SGE(2*4096, 100)},
		"gap before an SGE starting inside a page": {local.SGE(100, 3996), local.SGE(2*4096+8, 100)},
		"more pages than the MR maps":              {local.SGE(0, 4096), local.SGE(2*4096, 5*4096)},
	} {
		if err := frmr.MapSG(sgl, 4096); !errors.Is(err, verbs.ErrInvalidArgument) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Bytes 100..4096 of page 0, pages 2 and 3, the first 10 bytes of
	// page 6 (and an SGE that follows the one before it: merged).
	sgl := []verbs.SGE{local.SGE(100, 3996), local.SGE(2*4096, 4096), local.SGE(3*4096, 4096), local.SGE(6*4096, 10)}
	if err := frmr.MapSG(sgl, 4096); err != nil {
		t.Fatal(err)
	}
	post(t, sv, frmr.RegWR(1, verbs.Signaled, verbs.IncRKey(frmr.RKey()), remoteRW))
	mustOK(t, wait1(t, sv.scq), verbs.WCRegMR, 0)
	const n = 3996 + 2*4096 + 10
	if frmr.Len() != n || frmr.Addr() != local.Addr()+100 {
		t.Fatalf("mapping of %d bytes at %#x", frmr.Len(), frmr.Addr())
	}
	msg := make([]byte, n)
	fill(msg, 21)
	writeAndSync(t, cl, sv, msg, frmr.Remote())
	want := make([]byte, len(pool))
	copy(want[100:4096], msg)
	copy(want[2*4096:4*4096], msg[3996:])
	copy(want[6*4096:6*4096+10], msg[3996+2*4096:])
	for i := range pool {
		if pool[i] != want[i] {
			t.Fatalf("byte %d (page %d) is %#x, want %#x", i, i/4096, pool[i], want[i])
		}
	}
	if got := readInto(t, cl, frmr.Remote(), n); !bytes.Equal(got, msg) {
		t.Fatal("a Read across the SGEs returned other bytes")
	}
	// One byte past the end: refused.
	post(t, cl, verbs.SendWR{ID: 2, Op: verbs.OpWrite, SGL: []verbs.SGE{cl.mr.SGE(0, 2)}, RemoteAddr: frmr.Addr() + n - 1, RKey: frmr.RKey()})
	expectTerminate(t, p.b, cl, termBaseBounds)
	if pool[6*4096+10] != 0 {
		t.Fatal("the refused Write placed a byte past the mapping")
	}
}
