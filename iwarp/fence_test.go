package iwarp

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// deregistered waits until Deregister(r) has returned, failing the test if
// it blocks (the fence waits only for accesses in progress, and between
// two stream reads the receiver holds none).
func deregistered(t *testing.T, mem *MemTable, r *Region) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		mem.Deregister(r)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Deregister did not return")
	}
}

// waitPlaced waits until the receiver has counted n placed bytes (the
// counters are flushed after each stream read, which orders the placement
// before this goroutine's next look at the memory), then checks that b
// reads want.
func waitPlaced(t *testing.T, st *Stats, n uint64, b, want []byte) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for st.PlacedBytes.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes placed, waiting for %d", st.PlacedBytes.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
	if !bytes.Equal(b, want) {
		t.Fatal("the placed bytes are not the FPDU's")
	}
}

// TestDeregisterMidWrite: a region deregistered while an RDMA Write FPDU
// into it is half placed gets none of the rest; the stream is terminated
// as if the FPDU had named an invalid STag (DDP, tagged buffer, 0x00).
func TestDeregisterMidWrite(t *testing.T) {
	for _, crc := range []bool{false, true} {
		v := newVictim(t, crc, 0, 1)
		payload := pattern(1024, 0x5a)
		fp := v.fpdu(DDPFields{Opcode: OpWrite, Last: true, STag: v.reg.STag(), TO: v.reg.Base + 64}, payload)
		cut := MPALengthSize + DDPTaggedHeaderSize + 512
		v.send(t, fp[:cut])
		waitPlaced(t, &v.stats, 512, v.buf[64:64+512], payload[:512])
		deregistered(t, v.mem, v.reg)
		// The application takes the memory back: what it writes there
		// now must stay.
		for i := range v.buf {
			v.buf[i] = 0xee
		}
		v.send(t, fp[cut:])
		if code := readTerminate(t, v.peer, v.peerCRC); code != (TermCode{LayerDDP, ETypeTaggedBuffer, CodeDDPInvalidSTag}) {
			t.Fatalf("crc %v: terminate %v, want DDP invalid STag", crc, code)
		}
		<-v.qp.Done()
		for i, c := range v.buf {
			if c != 0xee {
				t.Fatalf("crc %v: byte %d written after Deregister returned", crc, i)
			}
		}
	}
}

// TestDeregisterMidSend: a receive buffer deregistered while a Send is
// being placed into it gets none of the rest; the receive completes with
// a local protection error and the stream is terminated.
func TestDeregisterMidSend(t *testing.T) {
	v := newVictim(t, false, 2, 1)
	v.recvSize = 64
	payload := pattern(48, 0x33)
	fp := v.fpdu(DDPFields{Opcode: OpSend, Last: true, QN: QNSend, MSN: 1}, payload)
	cut := MPALengthSize + DDPUntaggedHeaderSize + 16
	v.send(t, fp[:cut])
	waitPlaced(t, &v.stats, 16, v.buf[:16], payload[:16])
	deregistered(t, v.mem, v.reg)
	for i := range v.buf {
		v.buf[i] = 0xee
	}
	v.send(t, fp[cut:])
	if code := readTerminate(t, v.peer, v.peerCRC); code != (TermCode{LayerDDP, ETypeDDPCatastrophic, 0}) {
		t.Fatalf("terminate %v, want DDP catastrophic", code)
	}
	if c := v.rcq.wait(t); c.ID != 100 || c.Status != StatusLocalProtection {
		t.Fatalf("receive completion %+v, want id 100 with a local protection error", c)
	}
	<-v.qp.Done()
	for i, c := range v.buf {
		if c != 0xee {
			t.Fatalf("byte %d written after Deregister returned", i)
		}
	}
}

// fenceWriter returns an fpduWriter for an n-byte Write whose source is a
// registered region, and the table it is registered in.
func fenceWriter(t *testing.T, n, maxFPDU int) (*fpduWriter, *MemTable, *Region) {
	t.Helper()
	mem := NewMemTable()
	r := &Region{Buf: pattern(n, 9), Access: AccessLocalWrite}
	if _, err := mem.Register(r); err != nil {
		t.Fatal(err)
	}
	w := &fpduWriter{}
	w.reset(&DDPFields{Opcode: OpWrite, STag: 0x100, TO: 0}, [][]byte{r.Buf}, n, nil, maxFPDU, true, nil)
	w.regs = []*Region{r}
	return w, mem, r
}

// TestFPDUWriterCutOff: once its source region is deregistered, the FPDU
// writer reads no more of it: its next Read fails with ErrCutOff (netstack
// then drops what that endpoint Write read), and whether the bytes netstack
// kept end at an FPDU boundary decides between a Terminate and a reset.
func TestFPDUWriterCutOff(t *testing.T) {
	const maxFPDU = 1024
	fpdu := FPDULen(DDPTaggedHeaderSize + (maxFPDU-MPALengthSize-DDPTaggedHeaderSize-MPACRCSize)&^3)
	for _, tc := range []struct {
		name  string
		first int // bytes read before the deregistration
		end   bool
	}{
		{"boundary", 2 * fpdu, true},
		{"inside payload", fpdu + 100, false},
		{"inside header", fpdu + 3, false},
		{"inside trailer", 2*fpdu - 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, mem, r := fenceWriter(t, 8*fpdu, maxFPDU)
			p := make([]byte, tc.first)
			got := 0
			for got < tc.first {
				k, err := w.Read(p[got:])
				if err != nil {
					t.Fatal(err)
				}
				got += k
			}
			deregistered(t, mem, r)
			for _, size := range []int{0, 4 * fpdu} { // netstack probes with empty reads too
				if k, err := w.Read(make([]byte, size)); k != 0 || !errors.Is(err, ErrCutOff) {
					t.Fatalf("Read(%d bytes) after Deregister: %d, %v; want 0, ErrCutOff", size, k, err)
				}
			}
			if !w.cut || w.Len() != 0 {
				t.Fatalf("cut %v, Len %d; want cut, Len 0", w.cut, w.Len())
			}
			if w.fpduEnd(int64(tc.first)) != tc.end {
				t.Fatalf("fpduEnd(%d) = %v", tc.first, !tc.end)
			}
			if r.users.Load() != 0 {
				t.Fatal("the writer still holds the region")
			}
		})
	}
}

// TestHoldsBlockDeregister: Deregister waits for an access in progress and
// no new access starts once it has begun.
func TestHoldsBlockDeregister(t *testing.T) {
	mem := NewMemTable()
	r := &Region{Buf: make([]byte, 64)}
	if _, err := mem.Register(r); err != nil {
		t.Fatal(err)
	}
	var h holds
	if !h.hold(r) || !h.hold(r) || len(h.regs) != 1 {
		t.Fatal("holding a valid region twice")
	}
	done := make(chan struct{})
	go func() {
		mem.Deregister(r)
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("Deregister returned while the region was held")
	case <-time.After(50 * time.Millisecond):
	}
	var other holds
	if other.hold(r) {
		t.Fatal("a new access began during Deregister")
	}
	h.drop()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Deregister did not return after the access ended")
	}
	if r.users.Load() != 0 || mem.Lookup(r.STag()) != nil {
		t.Fatal("region still in use or still found")
	}
}

// TestRemoteInvalidateOnlyRemoteSTags: a Send with Invalidate naming a
// region registered for local access only (here the one behind a posted
// receive) is refused with RDMAP Remote Operation / cannot invalidate, and
// the region stays valid.
func TestRemoteInvalidateOnlyRemoteSTags(t *testing.T) {
	v := newVictim(t, false, 0, 1)
	if err := v.qp.PostRecv(7, []SGE{{Addr: v.roReg.Base, Length: 64, LKey: v.roReg.STag()}}); err != nil {
		t.Fatal(err)
	}
	v.send(t, v.fpdu(DDPFields{Opcode: OpSendInvalidate, Last: true, QN: QNSend, MSN: 1, RsvdULP: v.roReg.STag()}, pattern(10, 1)))
	if code := readTerminate(t, v.peer, v.peerCRC); code != (TermCode{LayerRDMAP, ETypeRemoteOperation, CodeCannotInvalidate}) {
		t.Fatalf("terminate %v, want cannot invalidate", code)
	}
	if c := v.rcq.wait(t); c.ID != 7 || c.Status != StatusRemoteInvalidRequest {
		t.Fatalf("receive completion %+v", c)
	}
	if !v.roReg.Valid() || v.mem.Lookup(v.roReg.STag()) != v.roReg {
		t.Fatal("the peer invalidated a local-only region")
	}
}

// TestSTagsNotRecycled: a peer that kept an STag never reaches a later
// registration through it, however often regions come and go (with
// last-in-first-out indices and a counter for keys it did within a few
// hundred), and no STag is ever handed out twice.
func TestSTagsNotRecycled(t *testing.T) {
	mem := NewMemTable()
	seen := map[uint32]bool{}
	var stale []uint32
	for i := 0; i < 20000; i++ {
		r := &Region{Buf: make([]byte, 8), Access: AccessRemoteWrite}
		stag, err := mem.Register(r)
		if err != nil {
			t.Fatal(err)
		}
		if seen[stag] {
			t.Fatalf("registration %d got STag %#x again", i, stag)
		}
		seen[stag] = true
		for _, s := range stale {
			if mem.Lookup(s) != nil {
				t.Fatalf("registration %d: stale STag %#x names the new region", i, s)
			}
		}
		if i%500 == 0 {
			stale = append(stale, stag)
		}
		mem.Deregister(r)
	}
	// A freed index waits behind memQuarantine others.
	if mem.next < memQuarantine {
		t.Fatalf("only %d indices used over 20000 registrations", mem.next)
	}
}

// TestSTagKeysSpread: the keys of fresh indices look uniformly random
// (4096 draws over 256 values: each should turn up about 16 times), and
// one index's keys never repeat until it is retired.
func TestSTagKeysSpread(t *testing.T) {
	mem := NewMemTable()
	var count [256]int
	regs := make([]*Region, 4096)
	for i := range regs {
		regs[i] = &Region{Buf: make([]byte, 8)}
		stag, err := mem.Register(regs[i])
		if err != nil {
			t.Fatal(err)
		}
		count[stag&0xff]++
	}
	for k, c := range count {
		if c == 0 || c > 48 {
			t.Fatalf("key %#x drawn %d times in 4096 (expected about 16)", k, c)
		}
	}
	var h keyHistory
	var got [256]bool
	for i := 0; i < 256; i++ {
		k := h.newKey()
		if got[k] {
			t.Fatalf("key %#x drawn twice for one index", k)
		}
		got[k] = true
	}
}

// TestDeregisterBeforeReadRequestEnds: the source of a Read Request
// deregistered between the request's headers and its trailer gets the
// Terminate for an invalid STag (the offending headers cut from the
// buffer went out of range and panicked before).
func TestDeregisterBeforeReadRequestEnds(t *testing.T) {
	v := newVictim(t, true, 0, 1)
	fp := v.readReq(ReadRequestFields{SinkSTag: 0x1234, SinkTO: 0, Size: 64, SourceSTag: v.reg.STag(), SourceTO: v.reg.Base})
	v.send(t, fp[:len(fp)-MPACRCSize])
	deadline := time.Now().Add(5 * time.Second)
	for v.stats.RxFPDUs.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the Read Request's headers were never taken")
		}
		time.Sleep(time.Millisecond)
	}
	deregistered(t, v.mem, v.reg)
	v.send(t, fp[len(fp)-MPACRCSize:])
	if code := readTerminate(t, v.peer, v.peerCRC); code != (TermCode{LayerRDMAP, ETypeRemoteProtection, CodeInvalidSTag}) {
		t.Fatalf("terminate %v, want invalid STag", code)
	}
}

// TestStatsCountSplitFPDU: an FPDU whose tail arrives in a read of its own
// (no FPDU header in that read) still counts its bytes; such reads were
// dropped from RxBytes and PlacedBytes.
func TestStatsCountSplitFPDU(t *testing.T) {
	v := newVictim(t, true, 0, 1)
	payload := pattern(1000, 4)
	fp := v.fpdu(DDPFields{Opcode: OpWrite, Last: true, STag: v.reg.STag(), TO: v.reg.Base}, payload)
	v.send(t, fp[:100])
	first := uint64(100 - MPALengthSize - DDPTaggedHeaderSize)
	waitPlaced(t, &v.stats, first, v.buf[:first], payload[:first])
	v.send(t, fp[100:])
	deadline := time.Now().Add(5 * time.Second)
	for v.stats.RxBytes.Load() != 1000 || v.stats.PlacedBytes.Load() != 1000 {
		if time.Now().After(deadline) {
			t.Fatalf("RxBytes %d, PlacedBytes %d; want 1000 each", v.stats.RxBytes.Load(), v.stats.PlacedBytes.Load())
		}
		time.Sleep(time.Millisecond)
	}
}
