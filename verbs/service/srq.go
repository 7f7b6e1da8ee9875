package service

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

// servedSRQ is a client's SRQ and the service's side of its ring.
//
// Locks: see the package documentation.
type servedSRQ struct {
	h    uint64
	srq  *verbs.SRQ
	rq   *iwarp.RecvQueue // srq's, the engine's
	mem  []byte
	ring *svc.Ring
	mu   sync.Mutex
	// +checklocks:mu
	cons uint32
	// +checklocks:mu
	sgl []iwarp.SGE
	// +checklocks:mu
	gone bool // the ring is unmapped
	// +checklocksignore: under session.mu, another object's lock.
	refs   int
	maxSGE int
	cost   int64 // charged beside the ring
}

func (x *session) createSRQ(b *svc.Builder, m svc.Msg) ([]int, error) {
	pd, err := x.pd(m.Arg(0))
	if err != nil {
		return nil, err
	}
	maxWR, maxSGE := m.Arg(1), m.Arg(2)
	x.mu.Lock()
	n := len(x.srqs)
	x.mu.Unlock()
	if n >= x.lim.SRQs {
		return nil, fmt.Errorf("%w: %d SRQs", verbs.ErrLimit, n)
	}
	if maxWR == 0 || maxWR > uint64(x.lim.MaxWR) || maxSGE == 0 || maxSGE > 64 {
		return nil, fmt.Errorf("%w: SRQ of %d WRs, %d SGEs", verbs.ErrInvalidArgument, maxWR, maxSGE)
	}
	cost := memSmall + iwarp.RecvQueueFootprint(int(maxWR), int(maxSGE)) + int64(maxSGE)*int64(unsafe.Sizeof(iwarp.SGE{}))
	if err := x.charge(cost, "an SRQ"); err != nil {
		return nil, err
	}
	srq, err := pd.CreateSRQ(int(maxWR), int(maxSGE))
	if err != nil {
		x.uncharge(cost)
		return nil, err
	}
	capacity := svc.RingCap(int(maxWR))
	esize := svc.RecvEntrySize(int(maxSGE))
	fd, mem, err := x.ringMemfd("rdmatap-srq", svc.RingBytes(capacity, esize))
	if err != nil {
		srq.Close()
		x.uncharge(cost)
		return nil, err
	}
	ring, _ := svc.InitRing(mem, capacity, esize)
	s := &servedSRQ{srq: srq, rq: engine.RecvQueue(srq), mem: mem, ring: ring, sgl: make([]iwarp.SGE, maxSGE), maxSGE: int(maxSGE), cost: cost} // +checklocksignore: not shared yet
	s.rq.SetRefill(func() { x.refillSRQ(s) })
	x.ringMu.Lock()
	x.mu.Lock()
	s.h = x.handle64()
	x.srqs[s.h] = s
	x.mu.Unlock()
	x.pollSRQs = append(x.pollSRQs, s)
	x.ringMu.Unlock()
	b.Args(s.h)
	// The ring's descriptor is sent and then closed by dispatch; the
	// service keeps its mapping.
	return []int{fd}, nil
}

func (x *session) destroySRQ(h uint64) error {
	x.ringMu.Lock()
	defer x.ringMu.Unlock()
	s, err := takeUnused(&x.mu, x.srqs, h, func(s *servedSRQ) int { return s.refs }, "SRQ") // +checklocksignore: the map is made once; takeUnused reads it under x.mu
	if err != nil {
		return err
	}
	for i, p := range x.pollSRQs {
		if p == s {
			x.pollSRQs = append(x.pollSRQs[:i], x.pollSRQs[i+1:]...)
			break
		}
	}
	s.rq.SetRefill(nil)
	s.mu.Lock()
	s.gone = true
	s.mu.Unlock()
	x.dropRing(s.mem, len(s.mem))
	x.uncharge(s.cost)
	// No QP of the client uses it (takeUnused), so no QP of the device's.
	return s.srq.Close()
}

func (x *session) srqLimit(h, limit uint64) error {
	x.mu.Lock()
	s := x.srqs[h]
	x.mu.Unlock()
	if s == nil {
		return errNoHandle
	}
	if limit > uint64(s.rq.Cap()) {
		return fmt.Errorf("%w: SRQ limit %d", verbs.ErrInvalidArgument, limit)
	}
	s.rq.SetLimit(int(limit), func() { x.sendEvent(verbs.AsyncEvent{Type: verbs.EventSRQLimitReached, SRQ: s.srq}) })
	return nil
}
