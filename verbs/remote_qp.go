package verbs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

// remoteQP is the client's side of a QP's rings.
//
// Locks: see the package documentation.
type remoteQP struct {
	qp   *QP
	cl   *client
	num  uint32
	mem  []byte
	sq   *svc.Ring
	rq   *svc.Ring
	sqMu sync.Mutex
	// +checklocks:sqMu
	sqProd uint32
	rqMu   sync.Mutex
	// +checklocks:rqMu
	rqProd uint32

	maxSendSGE int
	maxRecvSGE int
	maxInline  int

	done     chan struct{}
	doneOnce sync.Once
	errMu    sync.Mutex
	// +checklocks:errMu
	err     error
	relOnce sync.Once
}

func (pd *PD) remoteCreateQP(cfg QPConfig) (*QP, error) {
	cl := pd.dev.client()
	if cfg.SendCQ.remote() == nil || cfg.RecvCQ.remote() == nil || cfg.SendCQ.dev != pd.dev || cfg.RecvCQ.dev != pd.dev {
		return nil, fmt.Errorf("%w: CQ of another device", ErrInvalidArgument)
	}
	var srq uint64
	if cfg.SRQ != nil {
		if cfg.SRQ.pd != pd || cfg.SRQ.remote() == nil {
			return nil, fmt.Errorf("%w: SRQ belongs to another PD", ErrInvalidArgument)
		}
		if !cfg.SRQ.use() {
			return nil, fmt.Errorf("%w: the SRQ is closed", ErrInvalidArgument)
		}
		srq = cfg.SRQ.remote().h
	}
	qp, err := pd.remoteCreateQPOn(cl, cfg, srq)
	if err != nil && cfg.SRQ != nil {
		cfg.SRQ.unuse()
	}
	return qp, err
}

func (pd *PD) remoteCreateQPOn(cl *client, cfg QPConfig, srq uint64) (*QP, error) {
	var flags uint64
	if cfg.SignalAll {
		flags |= 1
	}
	r, err := cl.do(context.Background(), svc.TCreateQP, func(b *svc.Builder) {
		b.Args(pd.handle(), cfg.SendCQ.remote().h, cfg.RecvCQ.remote().h, srq, uint64(cfg.MaxSendWR), uint64(cfg.MaxRecvWR),
			uint64(cfg.MaxSendSGE), uint64(cfg.MaxRecvSGE), uint64(cfg.MaxInline), flags)
	})
	if err != nil {
		return nil, err
	}
	if len(r.fds) != 1 {
		closeFDs(r.fds)
		return nil, fmt.Errorf("verbs: service's CREATE_QP reply carried %d descriptors", len(r.fds))
	}
	num := uint32(r.m.Arg(0))
	sqBytes := int(r.m.Arg(1))
	rq := &remoteQP{cl: cl, num: num, maxSendSGE: cfg.MaxSendSGE, maxRecvSGE: cfg.MaxRecvSGE, maxInline: cfg.MaxInline,
		done: make(chan struct{})}
	mem, err := svc.MapRing(r.fds[0])
	closeFd(r.fds[0])
	if err == nil {
		rq.mem = mem
		if sqBytes <= 0 || sqBytes > len(mem) {
			err = svc.ErrRingEntry
		}
	}
	if err == nil {
		rq.sq, err = svc.OpenRing(mem[:sqBytes])
	}
	if err == nil && cfg.SRQ == nil {
		rq.rq, err = svc.OpenRing(mem[sqBytes:])
	}
	if err != nil {
		if rq.mem != nil {
			svc.Unmap(rq.mem)
		}
		cl.do(context.Background(), svc.TDestroyQP, func(b *svc.Builder) { b.Args(uint64(num)) })
		return nil, err
	}
	qp := &QP{pd: pd, cfg: cfg, ops: rq}
	rq.qp = qp
	cl.mu.Lock()
	cl.qps[num] = qp
	cl.mu.Unlock()
	pd.mu.Lock()
	pd.qps++
	pd.mu.Unlock()
	return qp, nil
}

func (r *remoteQP) finish(err error) {
	r.errMu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.errMu.Unlock()
	r.doneOnce.Do(func() { close(r.done) })
}

func (r *remoteQP) release() {
	r.relOnce.Do(func() {
		mem := r.mem
		runtime.AddCleanup(r, func(m []byte) { svc.Unmap(m) }, mem)
	})
}

// waitProgress is WaitProgress on a device of a service: the service's
// receive path runs on its own, so a caller spinning on memory need only
// look again; it yields once, and reports the QP's end as WaitProgress
// does.
func (r *remoteQP) waitProgress(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-r.done:
		r.errMu.Lock()
		defer r.errMu.Unlock()
		if r.err != nil {
			return r.err
		}
		return net.ErrClosed
	default:
	}
	runtime.Gosched()
	return nil
}

func (r *remoteQP) state() QPState {
	rep, err := r.cl.do(context.Background(), svc.TQueryQP, func(b *svc.Builder) { b.Args(uint64(r.num)) })
	if err != nil {
		return QPError
	}
	return QPState(rep.m.Arg(0))
}

// checkSend checks what the service would refuse at once, so the common
// mistakes fail in PostSend as they do on an embedded device; it returns
// the handle of a REG_MR's MR or a BIND_MW's window.
func (r *remoteQP) checkSend(qp *QP, wr *SendWR) (uint64, error) {
	if !svc.SendOpAllowed(iwarp.WROp(wr.Op)) {
		return 0, fmt.Errorf("%w: opcode %v", iwarp.ErrInvalidWR, wr.Op)
	}
	if wr.Op == OpRegMR || wr.Op == OpBindMW || wr.Op == OpLocalInv {
		return r.checkLocal(qp, wr)
	}
	return 0, r.checkData(wr)
}

func (r *remoteQP) checkData(wr *SendWR) error {
	if len(wr.SGL) > r.maxSendSGE {
		return ErrTooManySGE
	}
	if (wr.Op == OpRead || wr.Op == OpReadInv) && len(wr.SGL) > 1 {
		return fmt.Errorf("%w: RDMA Read takes at most one SGE", ErrTooManySGE)
	}
	if wr.Flags&Inline != 0 {
		var n uint64
		for _, s := range wr.SGL {
			n += uint64(s.Length)
		}
		if n > uint64(r.maxInline) {
			return fmt.Errorf("%w: %d bytes inline, max %d", iwarp.ErrInvalidWR, n, r.maxInline)
		}
	}
	return nil
}

func (qp *QP) remotePostSend(wrs []SendWR) error {
	r := qp.remote()
	select {
	case <-r.done:
		return &PostError{Index: 0, Err: iwarp.ErrInvalidState}
	default:
	}
	r.sqMu.Lock()
	free, err := r.sq.Free(r.sqProd)
	if err != nil {
		r.sqMu.Unlock()
		return &PostError{Index: 0, Err: err}
	}
	for i := range wrs {
		obj, err := r.checkSend(qp, &wrs[i])
		if err != nil {
			r.publishSQ()
			return &PostError{Index: i, Err: err}
		}
		if free == 0 {
			r.publishSQ()
			return &PostError{Index: i, Err: ErrQueueFull}
		}
		if e := r.sq.Entry(r.sqProd); !r.putInline(qp, e, &wrs[i]) {
			svc.PutSend(e, engineWR(&wrs[i]), obj)
		}
		if obj != 0 {
			r.posted(&wrs[i])
		}
		r.sqProd++
		free--
	}
	r.publishSQ()
	return nil
}

// putInline writes an inline Send or RDMA Write with its payload in the
// entry (FeatureInlineData), gathered from this process's own mapping of
// its MRs, and reports whether it did: a WR that is not inline, or whose
// SGEs name no regular MR of the QP's PD within its bounds, goes with its
// SGL, which the service checks (and copies) when it takes the entry.
func (r *remoteQP) putInline(qp *QP, e []byte, wr *SendWR) bool {
	if r.cl.features&svc.FeatureInlineData == 0 || wr.Flags&Inline == 0 || !svc.InlineDataOp(iwarp.WROp(wr.Op)) {
		return false
	}
	room := e[svc.SendEntryBase:]
	n := 0
	for _, s := range wr.SGL {
		r.cl.mu.Lock()
		mr := r.cl.mrKeys[s.LKey]
		r.cl.mu.Unlock()
		if mr == nil || mr.pd != qp.pd {
			return false
		}
		b, ok := mr.r.Slice(s.Addr, uint64(s.Length))
		if !ok || len(b) > len(room)-n {
			return false
		}
		n += copy(room[n:], b)
	}
	svc.PutSendData(e, engineWR(wr), room[:n])
	return true
}

// publishSQ stores the producer index, unlocks and rings the doorbell.
// +checklocksrelease:r.sqMu
func (r *remoteQP) publishSQ() {
	r.sq.Prod.Store(r.sqProd)
	r.sqMu.Unlock()
	r.cl.ring()
}

func (qp *QP) remotePostRecv(wrs []RecvWR) error {
	r := qp.remote()
	if r.rq == nil {
		return &PostError{Index: 0, Err: fmt.Errorf("%w: QP uses a shared receive queue", iwarp.ErrInvalidWR)}
	}
	select {
	case <-r.done:
		return &PostError{Index: 0, Err: iwarp.ErrInvalidState}
	default:
	}
	return postRing(r.cl, r.rq, &r.rqMu, &r.rqProd, r.maxRecvSGE, wrs) // +checklocksignore: postRing takes rqMu before it touches rqProd
}

// postRing writes receive WRs into an RQ ring.
func postRing(cl *client, ring *svc.Ring, mu *sync.Mutex, prod *uint32, maxSGE int, wrs []RecvWR) error {
	mu.Lock()
	free, err := ring.Free(*prod)
	if err != nil {
		mu.Unlock()
		return &PostError{Index: 0, Err: err}
	}
	var perr error
	for i := range wrs {
		if len(wrs[i].SGL) > maxSGE {
			perr = &PostError{Index: i, Err: ErrTooManySGE}
			break
		}
		if free == 0 {
			perr = &PostError{Index: i, Err: ErrQueueFull}
			break
		}
		svc.PutRecv(ring.Entry(*prod), wrs[i].ID, engineSGL(wrs[i].SGL))
		*prod++
		free--
	}
	ring.Prod.Store(*prod)
	mu.Unlock()
	cl.ring()
	return perr
}

func (qp *QP) remoteClose() error {
	r := qp.remote()
	_, err := r.cl.do(context.Background(), svc.TDestroyQP, func(b *svc.Builder) { b.Args(uint64(r.num)) })
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	r.finish(nil)
	r.cl.mu.Lock()
	_, ok := r.cl.qps[r.num]
	delete(r.cl.qps, r.num)
	r.cl.mu.Unlock()
	if ok {
		qp.pd.mu.Lock()
		qp.pd.qps--
		qp.pd.mu.Unlock()
		if qp.cfg.SRQ != nil {
			qp.cfg.SRQ.unuse()
		}
	}
	r.release()
	return nil
}

func (qp *QP) remoteDisconnect(ctx context.Context) error {
	_, err := qp.remote().cl.do(ctx, svc.TDisconnect, func(b *svc.Builder) { b.Args(uint64(qp.remote().num)) })
	return err
}

// remoteQP's qpOps: a QP of a service.

// remote returns a service's QP's side; nil for an embedded QP.
func (qp *QP) remote() *remoteQP {
	r, _ := qp.ops.(*remoteQP)
	return r
}

func (r *remoteQP) qpNum() uint32 { return r.num }

func (r *remoteQP) qpState() QPState { return r.state() }

func (r *remoteQP) qpErr() error {
	r.errMu.Lock()
	defer r.errMu.Unlock()
	return r.err
}

func (r *remoteQP) qpDone() <-chan struct{} { return r.done }

func (r *remoteQP) progress() {} // the service progresses the QP

func (r *remoteQP) openTXGate() {} // the service's QP opens its own

func (r *remoteQP) postSend(wrs []SendWR) error { return r.qp.remotePostSend(wrs) }

func (r *remoteQP) postRecv(wrs []RecvWR) error { return r.qp.remotePostRecv(wrs) }

func (r *remoteQP) disconnect(ctx context.Context) error { return r.qp.remoteDisconnect(ctx) }

func (r *remoteQP) destroy() error { return r.qp.remoteClose() }

// setError asks the service to move the QP to ERROR (QP_ERROR; a service
// without the CM feature has only DESTROY_QP, which would free the QP).
func (r *remoteQP) setError() error {
	if r.cl.features&svc.FeatureCM == 0 {
		return fmt.Errorf("%w: the service cannot move a QP to ERROR (no CM feature)", ErrInvalidArgument)
	}
	if _, err := r.cl.do(context.Background(), svc.TQPError, func(b *svc.Builder) { b.Args(uint64(r.num)) }); err != nil {
		return err
	}
	// The QP is done: its QP_DONE follows the reply (or the session
	// ends); from then on posting fails, as on an embedded QP.
	<-r.done
	return nil
}
