package service

import (
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

// servedQP is a client's QP and the service's side of its rings.
//
// Locks: see the package documentation.
type servedQP struct {
	qp  *verbs.QP
	iw  *iwarp.QP // qp's, the engine's
	num uint32
	mem []byte
	sq  *svc.Ring
	rq  *svc.Ring
	// +checklocksignore: under session.pollMu, another object's lock.
	sqCons uint32
	// SQ entries pollOnce saw before it took the receives.
	// +checklocksignore: under session.pollMu, another object's lock.
	sqSnap uint32
	rqMu   sync.Mutex
	// +checklocks:rqMu
	rqCons uint32
	// +checklocks:rqMu
	rsgl []iwarp.SGE
	// +checklocks:rqMu
	rqGone bool // the receive ring is unmapped
	// +checklocksignore: under session.pollMu, another object's lock.
	wrs [1]iwarp.SendWR
	// +checklocksignore: under session.pollMu, another object's lock.
	sgl []iwarp.SGE
	scq *servedCQ
	rcq *servedCQ
	srq *servedSRQ
	// An SQ or RQ entry waits for room (set by the pass; releaseQP
	// clears it holding session.ringMu for writing).
	// +checklocksignore: under session.pollMu, another object's lock.
	blocked bool
	// +checklocksignore: under session.mu, another object's lock.
	conn bool // counted against Limits.Conns
	// +checklocksignore: under session.mu, another object's lock.
	cost int64 // charged beside the rings, the connection's included
}

func (x *session) createQP(b *svc.Builder, m svc.Msg) ([]int, error) {
	pd, err := x.pd(m.Arg(0))
	if err != nil {
		return nil, err
	}
	x.mu.Lock()
	scq, rcq := x.cqs[m.Arg(1)], x.cqs[m.Arg(2)]
	var srq *servedSRQ
	if h := m.Arg(3); h != 0 {
		srq = x.srqs[h]
		if srq == nil {
			x.mu.Unlock()
			return nil, errNoHandle
		}
	}
	n := len(x.qps)
	x.mu.Unlock()
	if scq == nil || rcq == nil {
		return nil, errNoHandle
	}
	if n >= x.lim.QPs {
		return nil, fmt.Errorf("%w: %d QPs", verbs.ErrLimit, n)
	}
	cfg := verbs.QPConfig{SendCQ: scq.cq, RecvCQ: rcq.cq, MaxSendWR: int(min(m.Arg(4), 1<<31)), MaxRecvWR: int(min(m.Arg(5), 1<<31)),
		MaxSendSGE: int(min(m.Arg(6), 1<<31)), MaxRecvSGE: int(min(m.Arg(7), 1<<31)), MaxInline: int(min(m.Arg(8), 1<<31)),
		SignalAll: m.Arg(9)&1 != 0}
	if srq != nil {
		cfg.SRQ = srq.srq
	}
	if cfg.MaxSendWR <= 0 || cfg.MaxSendWR > x.lim.MaxWR || cfg.MaxRecvWR <= 0 || cfg.MaxRecvWR > x.lim.MaxWR ||
		cfg.MaxSendSGE <= 0 || cfg.MaxSendSGE > 64 || cfg.MaxRecvSGE <= 0 || cfg.MaxRecvSGE > 64 {
		return nil, fmt.Errorf("%w: QP of %d/%d WRs, %d/%d SGEs (limit %d WRs, 64 SGEs)", verbs.ErrInvalidArgument,
			cfg.MaxSendWR, cfg.MaxRecvWR, cfg.MaxSendSGE, cfg.MaxRecvSGE, x.lim.MaxWR)
	}
	if cfg.MaxInline < 0 || cfg.MaxInline > maxInline {
		return nil, fmt.Errorf("%w: %d bytes inline (limit %d)", verbs.ErrInvalidArgument, cfg.MaxInline, maxInline)
	}
	cost := qpMemory(cfg)
	if err := x.charge(cost, "a QP"); err != nil {
		return nil, err
	}
	qp, err := pd.CreateQP(cfg)
	if err != nil {
		x.uncharge(cost)
		return nil, err
	}
	sqCap, rqCap := svc.RingCap(cfg.MaxSendWR), svc.RingCap(cfg.MaxRecvWR)
	sqEntry := svc.SendEntrySize(cfg.MaxSendSGE)
	if x.features&svc.FeatureInlineData != 0 {
		sqEntry = svc.SendEntrySizeInline(cfg.MaxSendSGE, cfg.MaxInline)
	}
	sqBytes := svc.RingBytes(sqCap, sqEntry)
	total := sqBytes
	if srq == nil {
		total += svc.RingBytes(rqCap, svc.RecvEntrySize(cfg.MaxRecvSGE))
	}
	fd, mem, err := x.ringMemfd("rdmatap-qp", total)
	if err != nil {
		qp.Close()
		x.uncharge(cost)
		return nil, err
	}
	q := &servedQP{qp: qp, iw: engine.EngineQP(qp), num: qp.Num(), mem: mem, sgl: make([]iwarp.SGE, cfg.MaxSendSGE), rsgl: make([]iwarp.SGE, cfg.MaxRecvSGE),
		scq: scq, rcq: rcq, srq: srq, cost: cost}
	q.sq, _ = svc.InitRing(mem[:sqBytes], sqCap, sqEntry)
	if srq == nil {
		q.rq, _ = svc.InitRing(mem[sqBytes:], rqCap, svc.RecvEntrySize(cfg.MaxRecvSGE))
		q.iw.RecvQueue().SetRefill(func() { x.refillRQ(q) })
	}
	x.ringMu.Lock()
	x.mu.Lock()
	x.qps[q.num] = q
	scq.refs++
	rcq.refs++
	if srq != nil {
		srq.refs++
	}
	x.mu.Unlock()
	x.pollQPs = append(x.pollQPs, q)
	x.ringMu.Unlock()
	x.srv.mu.Lock()
	x.srv.qpOwner[q.num] = x
	x.srv.mu.Unlock()
	x.calls.Add(1)
	go x.watchQP(q)
	b.Args(uint64(q.num), uint64(sqBytes))
	return []int{fd}, nil
}

// maxInline is the most inline data a send WR of a client's QP carries
// (the engine's limit).
const maxInline = 4096

// qpMemory is a QP's charge beside its rings: the QP, its queues at their
// full depth with their SGE lists and inline buffers (the receive queue
// unless it uses an SRQ), and the served QP's SGE lists.
func qpMemory(cfg verbs.QPConfig) int64 {
	sge := int64(unsafe.Sizeof(iwarp.SGE{}))
	n := memQP + iwarp.QPFootprint() + iwarp.SendQueueFootprint(cfg.MaxSendWR, cfg.MaxSendSGE, cfg.MaxInline) +
		int64(cfg.MaxSendSGE+cfg.MaxRecvSGE)*sge
	if cfg.SRQ == nil {
		n += iwarp.RecvQueueFootprint(cfg.MaxRecvWR, cfg.MaxRecvSGE)
	}
	return n
}

// watchQP tells the client when its QP has ended (one goroutine per QP).
func (x *session) watchQP(q *servedQP) {
	defer x.calls.Done()
	select {
	case <-q.qp.Done():
	case <-x.ctx.Done():
		return
	}
	var b svc.Builder
	b.Reset(svc.TQPDone, 0, 0).Args(uint64(q.num))
	if err := q.qp.Err(); err != nil {
		b.String(err.Error())
	}
	x.wmu.Lock()
	svc.Write(x.conn, b.Msg())
	x.wmu.Unlock()
}

func (x *session) qp(h uint64) (*servedQP, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if h > 1<<32-1 {
		return nil, errNoHandle
	}
	if q := x.qps[uint32(h)]; q != nil {
		return q, nil
	}
	return nil, errNoHandle
}

func (x *session) destroyQP(num uint32) error {
	x.mu.Lock()
	q := x.qps[num]
	x.mu.Unlock()
	if q == nil {
		return errNoHandle
	}
	x.releaseQP(q, false)
	return nil
}

// releaseQP closes the QP, waits until it has flushed (no completion can
// follow), and frees its rings. With fatal (the client is gone) a
// connected QP goes down as on an RNIC's local catastrophic error: the
// peer gets a Terminate before the close rather than a reset.
func (x *session) releaseQP(q *servedQP, fatal bool) {
	x.mu.Lock()
	if x.qps[q.num] != q {
		x.mu.Unlock()
		return
	}
	delete(x.qps, q.num)
	if q.conn {
		x.conns--
	}
	x.mu.Unlock()
	defer x.uncharge(q.cost) // once the QP has flushed, below
	if fatal {
		engine.Fatal(q.qp)
	} else {
		q.qp.Close()
	}
	select {
	case <-q.qp.Done():
	case <-time.After(5 * time.Second):
		x.logf("QP %d did not flush in 5 s", q.num)
	}
	x.ringMu.Lock()
	for i, p := range x.pollQPs {
		if p == q {
			x.pollQPs = append(x.pollQPs[:i], x.pollQPs[i+1:]...)
			break
		}
	}
	if q.blocked {
		q.blocked = false
		x.blocked.Add(-1)
	}
	if q.rq != nil {
		q.iw.RecvQueue().SetRefill(nil)
		q.rqMu.Lock()
		q.rqGone = true
		q.rqMu.Unlock()
	}
	x.dropRing(q.mem, len(q.mem))
	x.ringMu.Unlock()
	x.mu.Lock()
	q.scq.refs--
	q.rcq.refs--
	if q.srq != nil {
		q.srq.refs--
	}
	x.mu.Unlock()
	x.srv.mu.Lock()
	delete(x.srv.qpOwner, q.num)
	x.srv.mu.Unlock()
}
