package verbs_test

import (
	"encoding/binary"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rdmatap/rdmatap/verbs"
)

// TestOpenTXGate: an accepted QP sends nothing before the initiator's
// first message, unless its application opens the gate (as perftest's
// ib_write_lat server, which Writes first, needs against Linux siw);
// OpenTXGate on the initiator does nothing.
func TestOpenTXGate(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl, sv := connect(t, p, 4096, verbs.ConnParams{})
	cl.qp.OpenTXGate()
	fill(sv.buf[:256], 9)
	write := func(id uint64) {
		t.Helper()
		if err := sv.qp.PostSend(verbs.SendWR{ID: id, Op: verbs.OpWrite, Flags: verbs.Signaled,
			SGL: []verbs.SGE{sv.mr.SGE(0, 256)}, RemoteAddr: sv.remote.Addr, RKey: sv.remote.RKey}); err != nil {
			t.Fatal(err)
		}
	}
	// Gated: the Write waits for the initiator. An open QP's poster
	// transmits a small Write itself, before PostSend returns; a gated
	// one only queues it, so nothing has gone out when PostSend returns
	// (and the initiator, which has not spoken, cannot have opened it).
	sent := p.b.Stats().TxFPDUs
	write(1)
	if n := p.b.Stats().TxFPDUs; n != sent {
		t.Fatalf("a gated responder sent %d FPDUs", n-sent)
	}
	wc := make([]verbs.WC, 1)
	if n := sv.scq.Poll(wc); n != 0 {
		t.Fatalf("a responder's Write completed before the initiator spoke: %+v", wc[0])
	}
	if atomic.LoadUint32((*uint32)(unsafe.Pointer(&cl.buf[252]))) != 0 {
		t.Fatal("a responder's Write landed before the initiator spoke")
	}
	sv.qp.OpenTXGate()
	mustOK(t, wait1(t, sv.scq), verbs.WCWrite, 256)
	deadline := time.Now().Add(5 * time.Second)
	last := (*uint32)(unsafe.Pointer(&cl.buf[252])) // placed last, atomically
	want := binary.NativeEndian.Uint32(sv.buf[252:256])
	for atomic.LoadUint32(last) != want && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	checkPlaced(t, "write", cl.buf, 0, sv.buf[:256])
	// Opening an open gate is harmless; the connection works both ways.
	sv.qp.OpenTXGate()
	write(2)
	mustOK(t, wait1(t, sv.scq), verbs.WCWrite, 256)
	fill(cl.buf[1024:1280], 3)
	if err := cl.qp.PostSend(verbs.SendWR{ID: 3, Op: verbs.OpWrite, Flags: verbs.Signaled,
		SGL: []verbs.SGE{cl.mr.SGE(1024, 256)}, RemoteAddr: cl.remote.Addr + 1024, RKey: cl.remote.RKey}); err != nil {
		t.Fatal(err)
	}
	mustOK(t, wait1(t, cl.scq), verbs.WCWrite, 256)
}
