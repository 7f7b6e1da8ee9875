package iwarp

import "testing"

// TestQueuesGrowInOrder: the receive and send queues allocate their slots
// as they fill (doubling up to the depth); a queue that grows while its
// ring has wrapped keeps its work requests in order, with their SGLs and
// inline data, and refuses the one past the depth.
func TestQueuesGrowInOrder(t *testing.T) {
	const depth = 13
	q, err := NewRecvQueue(depth, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(q.ring) != 0 || q.Cap() != depth {
		t.Fatalf("a new receive queue has %d slots, cap %d", len(q.ring), q.Cap())
	}
	next, want := uint64(0), uint64(0)
	post := func(k int) {
		for range k {
			if err := q.Post(next, []SGE{{Addr: next, Length: 1}, {Addr: next + 1, Length: 2}}); err != nil {
				t.Fatalf("post %d: %v", next, err)
			}
			next++
		}
	}
	take := func(k int) {
		var w recvWQE
		for range k {
			if !q.take(&w) || w.id != want || len(w.sgl) != 2 || w.sgl[0].Addr != want || w.sgl[1].Addr != want+1 {
				t.Fatalf("took %d %+v, want %d", w.id, w.sgl, want)
			}
			want++
		}
	}
	post(3)
	take(2)
	post(3) // wraps the 4-slot ring, then grows it
	take(1)
	post(depth - 3)
	if err := q.Post(99, nil); err != ErrQueueFull {
		t.Fatalf("post past the depth: %v", err)
	}
	take(depth)
	if len(q.ring) != depth {
		t.Fatalf("ring of %d slots, want the depth %d", len(q.ring), depth)
	}

	e := newTestEnd(t, 4096, AccessLocalWrite)
	qp := e.qp
	if len(qp.sq) != 0 {
		t.Fatalf("a new QP has %d send queue slots", len(qp.sq))
	}
	sid, swant := uint64(0), uint64(0)
	sends := func(k int) {
		for range k {
			wr := SendWR{ID: sid, Op: WRSend, SGL: []SGE{e.sge(int(sid), 1)}}
			if sid%2 == 1 {
				wr.Flags = FlagInline
			}
			if _, err := qp.PostSend(wr); err != nil {
				t.Fatalf("post %d: %v", sid, err)
			}
			sid++
		}
	}
	for i := range e.buf {
		e.buf[i] = byte(i)
	}
	dequeue := func(k int) { // as pick does
		qp.mu.Lock()
		defer qp.mu.Unlock()
		for range k {
			s := &qp.sq[qp.sqHead]
			ok := s.wr.ID == swant
			if s.inlined {
				ok = ok && len(s.inline) == 1 && s.inline[0] == byte(swant)
			} else {
				ok = ok && len(s.sgl) == 1 && s.sgl[0].Addr == e.reg.Base+swant
			}
			if !ok {
				t.Fatalf("send queue head %+v, want WR %d", s, swant)
			}
			qp.sqHead = (qp.sqHead + 1) % len(qp.sq)
			qp.sqN--
			swant++
		}
	}
	sends(3)
	dequeue(2)
	sends(3)
	dequeue(1)
	sends(128 - 3)
	if _, err := qp.PostSend(SendWR{Op: WRSend}); err != ErrQueueFull {
		t.Fatalf("post past MaxSendWR: %v", err)
	}
	dequeue(128)
}
