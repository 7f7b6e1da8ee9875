package verbs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

// remoteCQ is the client's side of a CQ ring.
//
// Locks: see the package documentation.
type remoteCQ struct {
	cq   *CQ
	cl   *client
	h    uint64
	mem  []byte
	ring *svc.Ring
	// +checklocksignore: under CQ.mu, another object's lock.
	cons uint32
	ev   *svc.Eventfd
	// Events consumed.
	// +checklocksignore: under CQ.mu, another object's lock.
	seen uint32
	// spin is how long Wait polls before it sleeps (see remoteCQ.wait);
	// zero: spinWait.
	spin atomic.Int64
	dead atomic.Bool
	once sync.Once
}

func (cl *client) createCQ(cqe int) (*CQ, error) {
	r, err := cl.do(context.Background(), svc.TCreateCQ, func(b *svc.Builder) { b.Args(uint64(cqe)) })
	if err != nil {
		return nil, err
	}
	if len(r.fds) != 2 {
		closeFDs(r.fds)
		return nil, fmt.Errorf("verbs: service's CREATE_CQ reply carried %d descriptors", len(r.fds))
	}
	rc := &remoteCQ{cl: cl, h: r.m.Arg(0)}
	mem, err := svc.MapRing(r.fds[0])
	closeFd(r.fds[0])
	if err == nil {
		rc.mem = mem
		rc.ring, err = svc.OpenRing(mem)
		if err == nil && rc.ring.EntrySize() != svc.CQEntrySize {
			err = svc.ErrRingEntry
		}
	}
	if err == nil {
		rc.ev, err = svc.OpenEventfd(r.fds[1])
	} else {
		closeFd(r.fds[1])
	}
	if err != nil {
		if rc.mem != nil {
			svc.Unmap(rc.mem)
		}
		cl.do(context.Background(), svc.TDestroyCQ, func(b *svc.Builder) { b.Args(rc.h) })
		return nil, err
	}
	cq := newCQ(cl.dev, nil)
	rc.cq, cq.ops = cq, rc
	cl.mu.Lock()
	cl.cqs[cq] = struct{}{}
	cl.mu.Unlock()
	return cq, nil
}

// remote returns a service's CQ's side; nil for an embedded CQ.
func (cq *CQ) remote() *remoteCQ {
	r, _ := cq.ops.(*remoteCQ)
	return r
}

func (rc *remoteCQ) poll(dst []WC) int {
	rc.cq.mu.Lock()
	n := rc.take(dst)
	rc.cq.mu.Unlock()
	return n
}

// take moves completions from the ring; cq.mu is held.
func (rc *remoteCQ) take(dst []WC) int {
	if rc.dead.Load() {
		return 0
	}
	n, err := rc.ring.Pending(rc.cons)
	if err != nil {
		return 0
	}
	k := min(len(dst), int(n))
	for i := 0; i < k; i++ {
		svc.GetCompletion(rc.ring.Entry(rc.cons), engineWC(&dst[i]))
		rc.cons++
	}
	if k > 0 {
		rc.ring.Cons.Store(rc.cons)
	}
	return k
}

// spinWait is how long CQ.Wait polls at most before it sleeps on the
// eventfd.
const spinWait = 20 * time.Microsecond

// wait polls, then sleeps on the CQ's eventfd. The spin adapts as the
// service's ring poller's does: the whole spinWait while completions come
// within it, halved (down to a sixteenth) after each wait that took longer
// — spinning through the gaps between the completions of large transfers
// only takes the CPU from the goroutines that move the data.
func (rc *remoteCQ) wait(ctx context.Context, dst []WC) (int, error) {
	start := time.Now()
	spin := time.Duration(rc.spin.Load())
	if spin == 0 {
		spin = spinWait
	}
	done := func() {
		if time.Since(start) <= spinWait {
			spin = spinWait
		} else {
			spin = max(spin/2, spinWait/16)
		}
		rc.spin.Store(int64(spin))
	}
	for {
		if n := rc.poll(dst); n > 0 {
			done()
			return n, nil
		}
		if rc.dead.Load() {
			return 0, net.ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		select {
		case <-rc.cl.s.Done():
			return 0, rc.cl.s.Err() // the service is gone
		default:
		}
		if time.Since(start) < spin {
			runtime.Gosched()
			continue
		}
		rc.ring.Waiting.Add(1)
		if n := rc.poll(dst); n > 0 {
			rc.ring.Waiting.Add(^uint32(0))
			done()
			return n, nil
		}
		err := rc.sleep(ctx)
		rc.ring.Waiting.Add(^uint32(0))
		if err != nil {
			return 0, err
		}
	}
}

// sleep waits on the CQ's eventfd until it rings, ctx ends or the CQ closes.
func (rc *remoteCQ) sleep(ctx context.Context) error {
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { rc.ev.SetDeadline(time.Unix(1, 0)) })
		defer stop()
	}
	rc.ev.SetDeadline(time.Time{})
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case <-rc.cl.s.Done():
		return rc.cl.s.Err()
	default:
	}
	if err := rc.ev.Wait(); err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil // another waiter's context ended: look again
		}
		return net.ErrClosed
	}
	return nil
}

func (rc *remoteCQ) reqNotify(solicitedOnly bool) error {
	if rc.dead.Load() {
		return net.ErrClosed
	}
	arm := rc.ring.Arm
	if solicitedOnly {
		arm.CompareAndSwap(svc.ArmNone, svc.ArmSolicited)
	} else {
		arm.Store(svc.ArmAny)
	}
	return nil
}

func (rc *remoteCQ) waitEvent(ctx context.Context) error {
	cq := rc.cq
	for {
		cq.mu.Lock()
		if rc.ring.Events.Load() != rc.seen {
			rc.seen++
			cq.mu.Unlock()
			return nil
		}
		cq.mu.Unlock()
		if rc.dead.Load() {
			return net.ErrClosed
		}
		select {
		case <-rc.cl.s.Done():
			return rc.cl.s.Err()
		default:
		}
		rc.ring.Waiting.Add(1)
		if rc.ring.Events.Load() != rc.seen {
			rc.ring.Waiting.Add(^uint32(0))
			continue
		}
		err := rc.sleep(ctx)
		rc.ring.Waiting.Add(^uint32(0))
		if err != nil {
			return err
		}
	}
}

func (rc *remoteCQ) pending() int {
	rc.cq.mu.Lock()
	defer rc.cq.mu.Unlock()
	if rc.dead.Load() {
		return 0
	}
	n, _ := rc.ring.Pending(rc.cons)
	return int(n)
}

func (rc *remoteCQ) overflowed() bool {
	return !rc.dead.Load() && rc.ring.Overflow.Load() != 0
}

func (rc *remoteCQ) destroy() error {
	cq := rc.cq
	if rc.dead.Load() {
		return nil
	}
	_, err := rc.cl.do(context.Background(), svc.TDestroyCQ, func(b *svc.Builder) { b.Args(rc.h) })
	if errors.Is(err, ErrBusy) {
		return err
	}
	rc.cl.mu.Lock()
	delete(rc.cl.cqs, cq)
	rc.cl.mu.Unlock()
	cq.mu.Lock()
	rc.release()
	cq.mu.Unlock()
	return nil
}

// release unmaps the ring; Poll then finds nothing.
func (rc *remoteCQ) release() {
	rc.once.Do(func() {
		rc.dead.Store(true)
		rc.ev.Close()
		// The mapping stays until the CQ is unreachable: a Poll racing
		// with Close must not fault.
		mem := rc.mem
		runtime.AddCleanup(rc, func(m []byte) { svc.Unmap(m) }, mem)
	})
}
