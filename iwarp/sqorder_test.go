package iwarp

import (
	"encoding/binary"
	"testing"
	"time"
)

// sqOrderVictim opens a victim's TX and posts a Read followed by a
// signaled Send, an unsignaled Write and a signaled Send: the Sends and
// the Write go out (TCP has their bytes) while the Read waits for its
// response. It returns the Read Request.
func sqOrderVictim(t *testing.T) (*victimORD, DDPHeader) {
	t.Helper()
	v := newVictimORD(t, 2)
	v.send(t, v.fpdu(DDPFields{Opcode: OpWrite, Last: true, STag: 1}, nil))
	wrs := []SendWR{
		{ID: 1, Op: WRRead, Flags: FlagSignaled, RemoteAddr: 0x5000, RKey: 0x777, SGL: []SGE{v.sge(0, 8)}},
		{ID: 2, Op: WRSend, Flags: FlagSignaled, SGL: []SGE{v.sge(64, 16)}},
		{ID: 3, Op: WRWrite, RemoteAddr: 0x6000, RKey: 0x777, SGL: []SGE{v.sge(128, 8)}},
		{ID: 4, Op: WRSend, Flags: FlagSignaled, SGL: []SGE{v.sge(192, 16)}},
	}
	if _, err := v.qp.PostSend(wrs...); err != nil {
		t.Fatal(err)
	}
	req := readFPDU(t, v.peer, false)
	if req.Opcode() != OpReadRequest {
		t.Fatalf("first FPDU: %v, want the Read Request", req.Opcode())
	}
	for i, op := range []Opcode{OpSend, OpWrite, OpSend} {
		if h := readFPDU(t, v.peer, false); h.Opcode() != op {
			t.Fatalf("FPDU %d: %v, want %v", i+2, h.Opcode(), op)
		}
	}
	return v, req
}

// TestSendQueueCompletesInOrder: a Send that TCP has taken completes only
// after the Read posted before it, as on an RNIC (libfabric's verbs
// provider takes each send completion as its QP's oldest WR's).
func TestSendQueueCompletesInOrder(t *testing.T) {
	v, req := sqOrderVictim(t)
	v.scq.none(t, 50*time.Millisecond)
	rr := ReadRequest(req.Payload())
	data := make([]byte, 8)
	binary.BigEndian.PutUint64(data, 0xd00d)
	v.send(t, v.fpdu(DDPFields{Opcode: OpReadResponse, Last: true, STag: rr.SinkSTag(), TO: rr.SinkTO()}, data))
	for _, want := range []struct {
		id uint64
		op CompletionOp
	}{{1, CompRead}, {2, CompSend}, {4, CompSend}} {
		c := v.scq.wait(t)
		if c.ID != want.id || c.Op != want.op || c.Status != StatusSuccess {
			t.Fatalf("completion %+v, want WR %d (%v)", c, want.id, want.op)
		}
	}
	v.scq.none(t, 20*time.Millisecond)
	if got := binary.BigEndian.Uint64(v.buf[:8]); got != 0xd00d {
		t.Fatalf("Read placed %#x", got)
	}
	// Nothing outstanding: the next Send completes at once.
	if _, err := v.qp.PostSend(SendWR{ID: 5, Op: WRSend, Flags: FlagSignaled, SGL: []SGE{v.sge(256, 8)}}); err != nil {
		t.Fatal(err)
	}
	readFPDU(t, v.peer, false)
	if c := v.scq.wait(t); c.ID != 5 || c.Status != StatusSuccess {
		t.Fatalf("completion %+v, want WR 5", c)
	}
}

// TestSendQueueFlushesInOrder: when the QP goes down with a Read
// outstanding, the Read's flush comes first, then the Sends held behind
// it.
func TestSendQueueFlushesInOrder(t *testing.T) {
	v, _ := sqOrderVictim(t)
	v.scq.none(t, 50*time.Millisecond)
	v.qp.Close()
	for _, want := range []struct {
		id uint64
		st Status
	}{{1, StatusWRFlush}, {2, StatusSuccess}, {4, StatusSuccess}} {
		c := v.scq.wait(t)
		if c.ID != want.id || c.Status != want.st {
			t.Fatalf("completion %+v, want WR %d (%v)", c, want.id, want.st)
		}
	}
	v.scq.none(t, 20*time.Millisecond)
}
