package service

import (
	"fmt"
	"sync"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

// servedCQ is the service's side of a client's CQ ring: the engine's
// QPs complete into cq, whose completions Push writes into the ring.
//
// Locks: see the package documentation.
type servedCQ struct {
	x    *session
	h    uint64
	cq   *verbs.CQ
	mem  []byte
	ring *svc.Ring
	mu   sync.Mutex
	// +checklocks:mu
	prod uint32
	ev   *svc.Eventfd
	// +checklocks:mu
	dead bool // the ring is gone
	// QPs using it.
	// +checklocksignore: under session.mu, another object's lock.
	refs int
}

func (x *session) createCQ(b *svc.Builder, cqe uint64) ([]int, error) {
	if limit := x.queryDevice().MaxCQE; cqe == 0 || cqe > uint64(limit) {
		return nil, fmt.Errorf("%w: CQ of %d entries (limit %d)", verbs.ErrInvalidArgument, cqe, limit)
	}
	x.mu.Lock()
	if len(x.cqs) >= x.lim.CQs {
		err := fmt.Errorf("%w: %d CQs", verbs.ErrLimit, len(x.cqs))
		x.mu.Unlock()
		return nil, err
	}
	x.mu.Unlock()
	if err := x.charge(memSmall, "a CQ"); err != nil {
		return nil, err
	}
	capacity := svc.RingCap(int(cqe))
	fd, mem, err := x.ringMemfd("rdmatap-cq", svc.RingBytes(capacity, svc.CQEntrySize))
	if err != nil {
		x.uncharge(memSmall)
		return nil, err
	}
	ring, _ := svc.InitRing(mem, capacity, svc.CQEntrySize)
	ev, err := svc.NewEventfd()
	if err != nil {
		x.dropRing(mem, len(mem))
		x.uncharge(memSmall)
		closeFd(fd)
		return nil, err
	}
	evDup, err := svc.Dup(ev.Fd())
	if err != nil {
		ev.Close()
		x.dropRing(mem, len(mem))
		x.uncharge(memSmall)
		closeFd(fd)
		return nil, err
	}
	s := &servedCQ{x: x, mem: mem, ring: ring, ev: ev}
	s.cq = engine.SinkCQ(x.dev, s)
	x.mu.Lock()
	s.h = x.handle64()
	x.cqs[s.h] = s
	x.mu.Unlock()
	b.Args(s.h)
	// dispatch closes both after sending: the service keeps its mapping
	// and its own eventfd.
	return []int{fd, evDup}, nil
}

// Push implements iwarp.CQ: the engine completes into the ring.
func (s *servedCQ) Push(c iwarp.Completion) bool { return s.push(&c) }

// push writes a completion into the client's ring. It never blocks; a
// full ring (or one whose consumer index the client corrupted) is an
// overflow, as a full CQ is.
func (s *servedCQ) push(c *iwarp.Completion) bool {
	s.mu.Lock()
	if s.dead {
		s.mu.Unlock()
		return true
	}
	free, err := s.ring.Free(s.prod)
	if err != nil || free == 0 {
		s.ring.Overflow.Store(1)
		s.mu.Unlock()
		return false
	}
	svc.PutCompletion(s.ring.Entry(s.prod), c)
	s.prod++
	s.ring.Prod.Store(s.prod)
	signal := false
	switch s.ring.Arm.Load() {
	case svc.ArmAny:
		signal = s.ring.Arm.CompareAndSwap(svc.ArmAny, svc.ArmNone)
	case svc.ArmSolicited:
		if c.Flags&iwarp.CompSolicited != 0 || c.Status != iwarp.StatusSuccess {
			signal = s.ring.Arm.CompareAndSwap(svc.ArmSolicited, svc.ArmNone)
		}
	}
	if signal {
		s.ring.Events.Add(1)
	}
	if signal || s.ring.Waiting.Load() != 0 {
		s.ev.Signal()
	}
	s.mu.Unlock()
	// A send queue freed room: the poller may have entries waiting for it.
	if s.x.blocked.Load() != 0 {
		s.x.kick()
	}
	return true
}

// retire takes the ring away from Push and frees it.
func (s *servedCQ) retire() {
	s.mu.Lock()
	s.dead = true
	s.x.dropRing(s.mem, len(s.mem))
	s.x.uncharge(memSmall)
	s.ev.Close()
	s.mu.Unlock()
	s.cq.Close()
}

func (x *session) destroyCQ(h uint64) error {
	s, err := takeUnused(&x.mu, x.cqs, h, func(s *servedCQ) int { return s.refs }, "CQ") // +checklocksignore: the map is made once; takeUnused reads it under x.mu
	if err != nil {
		return err
	}
	s.retire()
	return nil
}
