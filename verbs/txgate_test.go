package verbs_test

import (
	"context"
	"encoding/binary"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rdmatap/rdmatap/verbs"
)

// waitLastWord waits up to 5 s for dst's last 32-bit word, which a Write
// places last and atomically, to hold src's.
func waitLastWord(dst, src []byte) {
	n := len(src)
	last := (*uint32)(unsafe.Pointer(&dst[n-4]))
	want := binary.NativeEndian.Uint32(src[n-4:])
	for deadline := time.Now().Add(5 * time.Second); atomic.LoadUint32(last) != want && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
}

// TestResponderSpeaksFirst: by default an accepted QP transmits what its
// application posts before the initiator has sent anything, as Linux
// siw's responder does (ib_write_lat's and ucmatose's servers speak
// first), and the initiator's QP is established at once while the
// responder's waits for the initiator's first message (COMM_EST).
func TestResponderSpeaksFirst(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl, sv := connect(t, p, 4096, verbs.ConnParams{})
	fill(sv.buf[:256], 5)
	if err := sv.qp.PostSend(verbs.SendWR{ID: 1, Op: verbs.OpWrite, Flags: verbs.Signaled,
		SGL: []verbs.SGE{sv.mr.SGE(0, 256)}, RemoteAddr: sv.remote.Addr, RKey: sv.remote.RKey}); err != nil {
		t.Fatal(err)
	}
	mustOK(t, wait1(t, sv.scq), verbs.WCWrite, 256)
	waitLastWord(cl.buf[:256], sv.buf[:256])
	checkPlaced(t, "a responder's first Write", cl.buf, 0, sv.buf[:256])
	// The initiator answers; the responder's QP is then established.
	fill(cl.buf[1024:1280], 6)
	if err := cl.qp.PostSend(verbs.SendWR{ID: 2, Op: verbs.OpWrite, Flags: verbs.Signaled,
		SGL: []verbs.SGE{cl.mr.SGE(1024, 256)}, RemoteAddr: cl.remote.Addr + 1024, RKey: cl.remote.RKey}); err != nil {
		t.Fatal(err)
	}
	mustOK(t, wait1(t, cl.scq), verbs.WCWrite, 256)
	if e := waitEvent(t, p.b, verbs.EventEstablished); e.QPNum != sv.qp.Num() {
		t.Fatalf("ESTABLISHED for QP %d, want the responder's %d", e.QPNum, sv.qp.Num())
	}
}

// TestOpenTXGate: with MPAStrict, an accepted QP sends nothing before the
// initiator's first message, unless its application opens the gate (as
// perftest's ib_write_lat server, which Writes first, does); OpenTXGate on
// the initiator does nothing.
func TestOpenTXGate(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{MPAStrict: true})
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
	waitLastWord(cl.buf[:256], sv.buf[:256])
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

// TestGatedResponderDisconnects: a strict (MPAStrict) accepted QP whose
// initiator never spoke (Linux siw's initiator without peer-to-peer mode,
// whose application waits for the responder's first message) still
// closes when its application disconnects: its FIN goes out, the
// initiator closes too, and the Write it had queued behind the gate is
// flushed, never sent.
func TestGatedResponderDisconnects(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{MPAStrict: true})
	cl, sv := connect(t, p, 4096, verbs.ConnParams{})
	fill(sv.buf[:256], 7)
	if err := sv.qp.PostSend(verbs.SendWR{ID: 1, Op: verbs.OpWrite, Flags: verbs.Signaled,
		SGL: []verbs.SGE{sv.mr.SGE(0, 256)}, RemoteAddr: sv.remote.Addr, RKey: sv.remote.RKey}); err != nil {
		t.Fatal(err)
	}
	sent := p.b.Stats().TxFPDUs
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := sv.qp.Disconnect(ctx); err != nil {
		t.Fatalf("disconnecting a responder the initiator never spoke to: %v", err)
	}
	select {
	case <-cl.qp.Done():
	case <-ctx.Done():
		t.Fatal("the initiator never saw the responder's FIN")
	}
	if wc := wait1(t, sv.scq); wc.ID != 1 || wc.Status != verbs.StatusWRFlush {
		t.Fatalf("the gated Write completed %+v, want a flush", wc)
	}
	if n := p.b.Stats().TxFPDUs; n != sent {
		t.Fatalf("the responder sent %d FPDUs before the initiator spoke", n-sent)
	}
	for i, c := range cl.buf[:256] {
		if c != 0 {
			t.Fatalf("byte %d of the gated Write landed", i)
		}
	}
}
