package service

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

// kick wakes the poller if it sleeps: the service rings the client's
// doorbell itself.
func (x *session) kick() {
	if x.sleeping.Load() != 0 {
		x.bell.Signal()
	}
}

// threadWait is how long a sleeping poller waits for its doorbell in a
// system call before it waits through the Go poller.
const threadWait = time.Millisecond

// blockedNap bounds the poller's sleep while entries wait for room in a
// full queue (an unsignaled WR frees its slot without a completion to
// wake the poller).
const blockedNap = 200 * time.Microsecond

// poller drains the client's rings into its QPs and SRQs (one per
// client). It polls while there is work and for up to PollSpin after
// (adaptive, see woke), then
// sleeps on the doorbell eventfd, which the client rings only while the
// control page says the poller sleeps.
func (x *session) poller() {
	defer x.pollWG.Done()
	// The poller reads the client's memory (inline data) and rings. The
	// memfd checks (svc.MapFile) leave no page of a mapping past its
	// file's end, so no touch can fault; should one all the same, it
	// panics here instead of killing the process, and the recover below
	// ends this client's session.
	debug.SetPanicOnFault(true)
	defer func() {
		if r := recover(); r != nil {
			// Whatever a client's rings held must cost that client its
			// session, never the service.
			x.logf("poller: %v: ending the session", r)
			x.conn.Close()
		}
	}()
	maxSpin := x.srv.cfg.PollSpin
	spin := maxSpin
	idleSince := time.Now()
	// woke ends an idle period: the spin adapts to the gaps between the
	// client's work requests. A gap the full spin would have covered
	// (a ping-pong, a client posting as completions come) keeps it; a
	// longer one (large transfers, each WR hundreds of µs apart) halves
	// it, down to a sixteenth: spinning through such gaps only takes the
	// CPU from the goroutines that move the data, and the doorbell the
	// client rings then costs little beside the transfer.
	woke := func() {
		if time.Since(idleSince) <= maxSpin {
			spin = maxSpin
		} else {
			spin = max(spin/2, maxSpin/16)
		}
		idleSince = time.Time{}
	}
	for {
		select {
		case <-x.stop:
			return
		default:
		}
		if x.pollOnce() {
			if !idleSince.IsZero() {
				woke()
			}
			continue
		}
		if idleSince.IsZero() {
			idleSince = time.Now()
		}
		if time.Since(idleSince) < spin {
			runtime.Gosched()
			continue
		}
		x.sleeping.Store(1)
		if x.pollOnce() {
			x.sleeping.Store(0)
			woke()
			continue
		}
		// A short wait in a system call first: the doorbell of a client
		// that posts again soon wakes the poller at once, whatever the
		// Go poller's delays (svc.Eventfd.WaitThread); then the Go
		// poller, which holds no thread however long the client idles.
		nap := threadWait
		if x.blocked.Load() != 0 {
			nap = min(nap, blockedNap)
		}
		// Not while streaming (the spin shrunk to its floor: long gaps
		// again and again, many WRs in flight): a thread in ppoll holds
		// a P until the runtime takes it back, which costs the transfer
		// more than the slower wake-up does.
		streaming := spin <= maxSpin/16 && x.blocked.Load() == 0
		if !streaming {
			if rang, err := x.bell.WaitThread(nap); err == nil && rang {
				x.sleeping.Store(0)
				woke()
				continue
			}
		}
		if x.blocked.Load() != 0 {
			// The nap is over: look at the entries waiting for room
			// (the idle period goes on: they are not new work).
			x.sleeping.Store(0)
			continue
		}
		x.bell.SetDeadline(time.Time{})
		err := x.bell.Wait()
		x.sleeping.Store(0)
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return // closed: the session ends
		}
		if err == nil {
			woke()
		}
	}
}

// pollOnce makes one pass over every ring and reports whether it took an
// entry. A client whose producer index is out of range loses its session.
//
// Receives go first. The client may post a receive and then a Send whose
// answer lands in it; the engine must have the receive before the Send
// goes out, as it would on an embedded device where PostRecv returns only
// once the receive is queued. So the pass notes how far each SQ reaches,
// then takes everything from the RQs and SRQs (whatever was published
// before those SQ entries is visible now: the indexes are sequentially
// consistent), and only then posts the SQ entries it noted.
func (x *session) pollOnce() bool {
	x.pollMu.Lock()
	defer x.pollMu.Unlock()
	did, bad := x.passRings()
	if bad != nil {
		x.ringFailed(bad)
	}
	return did
}

// passRings is one pass of pollOnce; a panic in it (a bug a client's
// ring contents reached) comes back as an error for that client.
//
// +checklocksignore: checklocks loses the read lock in the recovering defer.
func (x *session) passRings() (did bool, bad error) {
	x.ringMu.RLock()
	defer x.ringMu.RUnlock()
	defer func() {
		if r := recover(); r != nil {
			bad = fmt.Errorf("internal error: %v", r)
		}
	}()
	for _, q := range x.pollQPs {
		n, err := q.sq.Pending(q.sqCons)
		if err != nil {
			return did, err
		}
		q.sqSnap = n
	}
	for _, q := range x.pollQPs {
		if q.rq == nil {
			continue
		}
		d, full, err := x.drainRQ(q)
		did = did || d
		if full {
			x.setBlocked(q, true)
		}
		if err != nil {
			return did, err
		}
	}
	for _, s := range x.pollSRQs {
		d, err := x.drainSRQ(s)
		did = did || d
		if err != nil {
			return did, err
		}
	}
	for _, q := range x.pollQPs {
		did = x.drainSQ(q) || did
	}
	return did, nil
}

func (x *session) setBlocked(q *servedQP, b bool) {
	if q.blocked != b {
		q.blocked = b
		if b {
			x.blocked.Add(1)
		} else {
			x.blocked.Add(-1)
		}
	}
}

// drainSQ posts the send ring entries pollOnce noted.
func (x *session) drainSQ(q *servedQP) bool {
	n := q.sqSnap
	if n == 0 {
		return false
	}
	did := false
	for ; n > 0; n-- {
		wr := &q.wrs[0]
		obj, err := svc.GetSend(q.sq.Entry(q.sqCons), wr, q.sgl)
		if err == nil && (wr.Op == iwarp.WRRegMR || wr.Op == iwarp.WRBindMW) {
			err = x.resolve(wr, obj)
		}
		if err != nil {
			// A malformed entry completes in error, as the operation it
			// names where it names one; the client's other work goes on.
			e := q.sq.Entry(q.sqCons)
			cop := iwarp.CompSend
			if op, ok := svc.EntryOp(e); ok {
				cop = sendCompOp(op)
			}
			x.failWR(q.scq, q.num, iwarp.Completion{ID: svc.EntryID(e), Status: iwarp.StatusLocalQPOp, Op: cop})
		} else if _, err := q.iw.PostSend(q.wrs[:]...); err != nil {
			if errors.Is(err, iwarp.ErrQueueFull) {
				x.setBlocked(q, true)
				break
			}
			st := iwarp.StatusLocalQPOp
			if errors.Is(err, iwarp.ErrInvalidState) {
				st = iwarp.StatusWRFlush
			}
			x.failWR(q.scq, q.num, iwarp.Completion{ID: wr.ID, Status: st, Op: sendCompOp(wr.Op)})
		}
		q.sqCons++
		q.sq.Cons.Store(q.sqCons)
		did = true
	}
	if n == 0 {
		x.setBlocked(q, false)
	}
	return did
}

// drainRQ posts the QP's new receive ring entries; full: one waits for
// room in the engine's queue.
func (x *session) drainRQ(q *servedQP) (did, full bool, err error) {
	q.rqMu.Lock()
	defer q.rqMu.Unlock()
	if q.rqGone {
		return false, false, nil
	}
	n, err := q.rq.Pending(q.rqCons)
	if err != nil || n == 0 {
		return false, false, err
	}
	for ; n > 0; n-- {
		id, sgl, err := svc.GetRecv(q.rq.Entry(q.rqCons), q.rsgl)
		if err != nil {
			x.failWR(q.rcq, q.num, iwarp.Completion{ID: id, Status: iwarp.StatusLocalQPOp, Op: iwarp.CompRecv})
		} else if err := q.iw.PostRecv(id, sgl); err != nil {
			if errors.Is(err, iwarp.ErrQueueFull) {
				return did, true, nil
			}
			x.failWR(q.rcq, q.num, iwarp.Completion{ID: id, Status: iwarp.StatusWRFlush, Op: iwarp.CompRecv})
		}
		q.rqCons++
		q.rq.Cons.Store(q.rqCons)
		did = true
	}
	return did, false, nil
}

// drainSRQ posts an SRQ's new ring entries; a full SRQ leaves them there.
func (x *session) drainSRQ(s *servedSRQ) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return false, nil
	}
	n, err := s.ring.Pending(s.cons)
	if err != nil || n == 0 {
		return false, err
	}
	did := false
	for ; n > 0; n-- {
		id, sgl, err := svc.GetRecv(s.ring.Entry(s.cons), s.sgl)
		if err == nil {
			if err = s.rq.Post(id, sgl); errors.Is(err, iwarp.ErrQueueFull) {
				break
			}
		}
		if err != nil {
			// No QP is the entry's yet, so no CQ: the client hears of
			// the dropped receive through an SRQ_ERR event.
			x.sendEvent(verbs.AsyncEvent{Type: verbs.EventSRQErr, SRQ: s.srq,
				Err: fmt.Errorf("receive %#x dropped: %w", id, err)})
		}
		s.cons++
		s.ring.Cons.Store(s.cons)
		did = true
	}
	return did, nil
}

// refillRQ is the engine's refill of a served QP's receive queue
// (iwarp.RecvQueue.SetRefill): a Send found it empty, so the receives
// the client has published in its ring but the poller has not taken yet
// are taken now, as the poller would, before the engine declares no
// buffer available. It runs on the engine's receive path.
func (x *session) refillRQ(q *servedQP) {
	defer x.refillDone(debug.SetPanicOnFault(true))
	if _, _, err := x.drainRQ(q); err != nil {
		x.ringFailed(err)
	}
}

// refillSRQ is refillRQ for an SRQ.
func (x *session) refillSRQ(s *servedSRQ) {
	defer x.refillDone(debug.SetPanicOnFault(true))
	if _, err := x.drainSRQ(s); err != nil {
		x.ringFailed(err)
	}
}

// refillDone ends a refill: a panic in it (a fault reading the client's
// ring, or a bug its contents reached) ends the client's session, not the
// service.
func (x *session) refillDone(fault bool) {
	debug.SetPanicOnFault(fault)
	if r := recover(); r != nil {
		x.ringFailed(fmt.Errorf("internal error: %v", r))
	}
}

// ringFailed ends the session of a client whose ring is corrupt.
func (x *session) ringFailed(err error) {
	x.logf("ring: %v: ending the session", err)
	x.conn.Close()
	x.stopPoller()
}

// resolve gives a REG_MR or BIND_MW from a ring the MR or window its
// handle names (of this client only).
func (x *session) resolve(wr *iwarp.SendWR, obj uint64) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	switch wr.Op {
	case iwarp.WRRegMR:
		if f := x.frmrs[obj]; f != nil {
			wr.MR = engine.FastRegMR(f.mr)
			return nil
		}
	case iwarp.WRBindMW:
		if mw := x.mws[obj]; mw != nil {
			wr.MW = engine.Window(mw)
			return nil
		}
	}
	return errNoHandle
}

func (x *session) failWR(cq *servedCQ, num uint32, c iwarp.Completion) {
	c.QPNum = num
	cq.push(&c)
}

// sendCompOp is the completion operation of a send WR.
func sendCompOp(op iwarp.WROp) iwarp.CompletionOp {
	switch op {
	case iwarp.WRWrite, iwarp.WRWriteImm:
		return iwarp.CompWrite
	case iwarp.WRRead, iwarp.WRReadInv:
		return iwarp.CompRead
	case iwarp.WRRegMR:
		return iwarp.CompRegMR
	case iwarp.WRBindMW:
		return iwarp.CompBindMW
	case iwarp.WRLocalInv:
		return iwarp.CompLocalInv
	case iwarp.WRAtomicCmpSwap:
		return iwarp.CompCmpSwap
	case iwarp.WRAtomicFetchAdd:
		return iwarp.CompFetchAdd
	}
	return iwarp.CompSend
}

func (x *session) stopPoller() {
	x.mu.Lock()
	select {
	case <-x.stop:
	default:
		close(x.stop)
	}
	x.mu.Unlock()
}
