package verbs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"

	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

// remoteSRQ is the client's side of an SRQ's ring.
//
// Locks: see the package documentation.
type remoteSRQ struct {
	cl   *client
	h    uint64
	mem  []byte
	ring *svc.Ring
	mu   sync.Mutex
	// +checklocks:mu
	prod    uint32
	maxSGE  int
	relOnce sync.Once
}

func (pd *PD) remoteCreateSRQ(maxWR, maxSGE int) (*SRQ, error) {
	cl := pd.dev.client()
	r, err := cl.do(context.Background(), svc.TCreateSRQ, func(b *svc.Builder) { b.Args(pd.handle(), uint64(maxWR), uint64(maxSGE)) })
	if err != nil {
		return nil, err
	}
	if len(r.fds) != 1 {
		closeFDs(r.fds)
		return nil, fmt.Errorf("verbs: service's CREATE_SRQ reply carried %d descriptors", len(r.fds))
	}
	rs := &remoteSRQ{cl: cl, h: r.m.Arg(0), maxSGE: maxSGE}
	mem, err := svc.MapRing(r.fds[0])
	closeFd(r.fds[0])
	if err == nil {
		rs.mem = mem
		rs.ring, err = svc.OpenRing(mem)
	}
	if err != nil {
		if rs.mem != nil {
			svc.Unmap(rs.mem)
		}
		return nil, err
	}
	s := &SRQ{pd: pd, ops: rs}
	cl.mu.Lock()
	cl.srqs[rs.h] = s
	cl.mu.Unlock()
	return s, nil
}

func (r *remoteSRQ) release() {
	r.relOnce.Do(func() {
		mem := r.mem
		runtime.AddCleanup(r, func(m []byte) { svc.Unmap(m) }, mem)
	})
}

// remote returns a service's SRQ's side; nil for an embedded SRQ.
func (s *SRQ) remote() *remoteSRQ {
	r, _ := s.ops.(*remoteSRQ)
	return r
}

func (r *remoteSRQ) postRecv(wrs []RecvWR) error {
	return postRing(r.cl, r.ring, &r.mu, &r.prod, r.maxSGE, wrs) // +checklocksignore: postRing takes mu before it touches prod
}

// pending: the receives the service has not yet taken from the ring are
// not known; none are counted.
func (r *remoteSRQ) pending() int { return 0 }

// destroy destroys the service's SRQ; the ring stays mapped until the
// SRQ is unreachable (release).
func (r *remoteSRQ) destroy() error {
	_, err := r.cl.do(context.Background(), svc.TDestroySRQ, func(b *svc.Builder) { b.Args(r.h) })
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	r.cl.mu.Lock()
	delete(r.cl.srqs, r.h)
	r.cl.mu.Unlock()
	r.release()
	return nil
}

func (r *remoteSRQ) setLimit(limit int) error {
	_, err := r.cl.do(context.Background(), svc.TSRQLimit, func(b *svc.Builder) { b.Args(r.h, uint64(limit)) })
	return err
}
