package iwarp

import (
	"bytes"
	"reflect"
	"testing"
)

// pagedModel builds npages separate pages of 1<<shift bytes, each byte
// numbered (its index in the list of all pages' bytes, mod 251), a page
// list over length bytes from offset, and the same bytes as one run.
func pagedModel(shift uint, npages, offset, length int) (*pageList, []byte) {
	ps := 1 << shift
	pages := make([][]byte, npages)
	var flat []byte
	for i := range pages {
		pages[i] = make([]byte, ps)
		for j := range pages[i] {
			pages[i][j] = byte((i*ps + j) % 251)
		}
		flat = append(flat, pages[i]...)
	}
	return newPageList(pages, ps, offset, length), flat[offset : offset+length]
}

// checkPageList compares every way into a page list with the flat model
// for the range [off, off+n) of a region based at base.
func checkPageList(t *testing.T, p *pageList, flat []byte, base, off, n uint64) {
	t.Helper()
	r := &Region{Base: base, pages: p}
	ref := &Region{Base: base, Buf: flat}
	to := base + off
	gotOff, ok := r.InBounds(to, n)
	wantOff, wantOK := ref.InBounds(to, n)
	if ok != wantOK || gotOff != wantOff {
		t.Fatalf("InBounds(%d, %d) = %d, %v; one run says %d, %v", off, n, gotOff, ok, wantOff, wantOK)
	}
	if r.Len() != uint64(len(flat)) {
		t.Fatalf("Len %d, want %d", r.Len(), len(flat))
	}
	pieces, ok := r.Pieces(nil, to, n)
	if ok != wantOK {
		t.Fatalf("Pieces(%d, %d) ok %v, want %v", off, n, ok, wantOK)
	}
	if !ok {
		if _, ok := r.Slice(to, n); ok {
			t.Fatalf("Slice(%d, %d) of a range outside", off, n)
		}
		return
	}
	want := flat[off : off+n]
	var got []byte
	for i, b := range pieces {
		if len(b) == 0 {
			t.Fatalf("piece %d is empty", i)
		}
		// Every piece but the first starts a page; every piece but the
		// last ends one.
		if pos := off + uint64(len(got)); i > 0 && (pos < p.first || (pos-p.first)&(1<<p.shift-1) != 0) {
			t.Fatalf("piece %d starts inside a page", i)
		}
		got = append(got, b...)
	}
	if uint64(len(pieces)) > n>>p.shift+2 {
		t.Fatalf("%d bytes in %d pieces of %d-byte pages", n, len(pieces), 1<<p.shift)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Pieces(%d, %d) hold other bytes", off, n)
	}
	if s, ok := r.Slice(to, n); ok != (len(pieces) <= 1) || ok && !bytes.Equal(s, want) {
		t.Fatalf("Slice(%d, %d): ok %v over %d pieces", off, n, ok, len(pieces))
	}
	out := make([]byte, n)
	if k := r.copyOut(out, to, n); k != int(n) || !bytes.Equal(out, want) {
		t.Fatalf("copyOut(%d, %d) copied %d bytes, equal %v", off, n, k, bytes.Equal(out, want))
	}
	if n > 0 {
		sub := p.sub(off, n)
		if sub.n != n {
			t.Fatalf("sub(%d, %d) has %d bytes", off, n, sub.n)
		}
		for _, k := range []uint64{0, n / 3, n - 1} {
			b, _ := (&Region{pages: sub}).Pieces(nil, k, n-k)
			if !bytes.Equal(bytes.Join(b, nil), want[k:]) {
				t.Fatalf("sub(%d, %d) from %d holds other bytes", off, n, k)
			}
		}
	}
}

func TestPageList(t *testing.T) {
	for _, tc := range []struct {
		shift                  uint
		npages, offset, length int
	}{
		{9, 4, 100, 4*512 - 150},
		{9, 1, 0, 512},
		{9, 3, 511, 2},
		{12, 5, 300, 5*4096 - 500},
		{12, 2, 0, 0},
	} {
		p, flat := pagedModel(tc.shift, tc.npages, tc.offset, tc.length)
		l := uint64(tc.length)
		for _, r := range [][2]uint64{{0, l}, {0, 0}, {l, 0}, {l, 1}, {1, l}, {l / 2, l / 3}, {l - min(l, 7), min(l, 7)}, {0, l + 1}} {
			checkPageList(t, p, flat, 0x10000, r[0], r[1])
		}
	}
}

// FuzzPageList: any range of any page list reads the same bytes through
// Pieces, Slice, copyOut and sub as through the same bytes in one run, and
// the bounds agree.
func FuzzPageList(f *testing.F) {
	f.Add(uint8(0), uint8(4), uint16(100), uint16(1800), uint16(0), uint16(1800))
	f.Add(uint8(3), uint8(5), uint16(300), uint16(20000), uint16(4000), uint16(9000))
	f.Add(uint8(1), uint8(2), uint16(1023), uint16(2), uint16(1), uint16(5))
	f.Fuzz(func(t *testing.T, shiftSel, npages uint8, offset, length, off, n uint16) {
		shift := 9 + uint(shiftSel%4)
		ps := 1 << shift
		np := 1 + int(npages%8)
		o := int(offset) % ps
		l := int(length) % (np*ps - o + 1)
		p, flat := pagedModel(shift, np, o, l)
		checkPageList(t, p, flat, 0x7000, uint64(off), uint64(n))
	})
}

// pagedFuzzMem registers the region the paged receiver fuzzer aims at:
// bytes 100 of the first to 50 before the end of the last of four separate
// 512-byte pages at 0x10000, under fuzzSTag. Each page sits in the middle
// of a guard buffer of three pages. With flat, the same TO range is one
// run, inside one guard buffer.
func pagedFuzzMem(flat bool) (*MemTable, *Region, [][]byte) {
	const ps, np, off, n = 512, 4, 100, 4*512 - 150
	mem := NewMemTable()
	reg := &Region{Base: 0x10000, Access: AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic, PD: 1}
	var guards [][]byte
	if flat {
		// At the same address modulo 8 as the pages' bytes, so that
		// atomics find the same words aligned.
		g := make([]byte, off+n+2*ps)
		reg.Buf = g[ps+off : ps+off+n]
		guards = append(guards, g)
	} else {
		pages := make([][]byte, np)
		for i := range pages {
			g := make([]byte, 3*ps)
			pages[i] = g[ps : 2*ps : 2*ps]
			guards = append(guards, g)
		}
		reg.pages = newPageList(pages, ps, off, n)
	}
	mem.Register(reg)
	reg.stag = reg.stag&^0xff | 0x5c
	return mem, reg, guards
}

// feedPaged runs data through a fresh QP whose region is pagedFuzzMem's,
// with four receives posted into it, and returns the outcome with the
// region's bytes (in TO order) as mem.
func feedPaged(t *testing.T, data []byte, crc, flat bool) (rxOutcome, [][]byte) {
	mem, reg, guards := pagedFuzzMem(flat)
	rq, _ := NewRecvQueue(4, 2)
	for i := 0; i < 4; i++ {
		rq.Post(uint64(i), []SGE{{Addr: reg.Base + uint64(i*400), Length: 400, LKey: reg.STag()}})
	}
	qp, s, rcq := startFuzzQP(t, mem, rq, crc)
	for p := data; len(p) > 0; {
		k := min(len(p), 1+int(p[0])%97)
		if n, err := fuzzWrite(qp, p[:k]); n != k || err != nil {
			t.Fatalf("Write took %d of %d: %v", n, k, err)
		}
		p = p[k:]
	}
	out := finishFeed(qp, s, rcq, nil)
	pieces, _ := reg.Pieces(nil, reg.Base, reg.Len())
	out.mem = bytes.Join(pieces, nil)
	return out, guards
}

// FuzzPagedReceiver: a stream aimed at a region over separate pages must
// do exactly what it does to the same TO range in one run of memory (the
// bytes placed, the Terminate, the counters, the completions), and write
// nothing outside the mapped bytes of the pages.
func FuzzPagedReceiver(f *testing.F) {
	add := func(crc bool, fpdus ...[]byte) { f.Add(bytes.Join(fpdus, nil), crc) }
	for _, crc := range []bool{false, true} {
		add(crc, rawFPDU(rawULPDU(DDPFields{Opcode: OpWrite, Last: true, STag: fuzzSTag, TO: 0x10000 + 300}, bytes.Repeat([]byte{7}, 900)), crc))
		add(crc, rawFPDU(rawULPDU(DDPFields{Opcode: OpWrite, Last: true, STag: fuzzSTag, TO: 0x10000 + 1800}, bytes.Repeat([]byte{8}, 100)), crc))
		add(crc, rawFPDU(rawULPDU(DDPFields{Opcode: OpSend, Last: true, QN: QNSend, MSN: 1}, bytes.Repeat([]byte{9}, 400)), crc),
			rawFPDU(rawULPDU(DDPFields{Opcode: OpSend, Last: true, QN: QNSend, MSN: 2}, []byte("across")), crc))
		rr := make([]byte, ReadRequestSize)
		ReadRequest(rr).Encode(&ReadRequestFields{SinkSTag: 0x100, Size: 1000, SourceSTag: fuzzSTag, SourceTO: 0x10000 + 200})
		add(crc, rawFPDU(rawULPDU(DDPFields{Opcode: OpReadRequest, Last: true, QN: QNReadReq, MSN: 1}, rr), crc))
		add(crc, extensionStream(crc))
	}
	f.Fuzz(func(t *testing.T, data []byte, crc bool) {
		if len(data) > 1<<13 {
			return
		}
		paged, guards := feedPaged(t, data, crc, false)
		flat, _ := feedPaged(t, data, crc, true)
		if !bytes.Equal(paged.mem, flat.mem) {
			t.Fatal("the pages hold other bytes than one run of memory")
		}
		if !reflect.DeepEqual(paged.term, flat.term) {
			t.Fatalf("terminate: %+v over pages, %+v in one run", paged.term, flat.term)
		}
		if paged.n != flat.n || paged.state != flat.state {
			t.Fatalf("counters/state: %+v/%d over pages, %+v/%d in one run", paged.n, paged.state, flat.n, flat.state)
		}
		if !reflect.DeepEqual(paged.comps, flat.comps) {
			t.Fatalf("completions: %+v over pages, %+v in one run", paged.comps, flat.comps)
		}
		// Outside the mapped bytes: the guards, the first 100 bytes of
		// page 0 and the last 50 of page 3.
		for i, g := range guards {
			lo, hi := 512, 1024
			switch i {
			case 0:
				lo += 100
			case 3:
				hi -= 50
			}
			for j, c := range g {
				if (j < lo || j >= hi) && c != 0 {
					t.Fatalf("byte %d of page %d's guard buffer written", j, i)
				}
			}
		}
	})
}
