package service

import (
	"fmt"

	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

func (x *session) allocPD(b *svc.Builder) error {
	x.mu.Lock()
	n := len(x.pds)
	x.mu.Unlock()
	if n >= x.lim.PDs {
		return fmt.Errorf("%w: %d PDs", verbs.ErrLimit, n)
	}
	if err := x.charge(memSmall, "a PD"); err != nil {
		return err
	}
	pd, err := x.dev.AllocPD()
	if err != nil {
		x.uncharge(memSmall)
		return err
	}
	x.mu.Lock()
	x.pds[uint64(pd.ID())] = pd
	x.mu.Unlock()
	b.Args(uint64(pd.ID()))
	return nil
}

func (x *session) pd(h uint64) (*verbs.PD, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if pd := x.pds[h]; pd != nil {
		return pd, nil
	}
	return nil, errNoHandle
}

func (x *session) deallocPD(h uint64) error {
	pd, err := x.pd(h)
	if err != nil {
		return err
	}
	if err := pd.Close(); err != nil {
		return err
	}
	x.mu.Lock()
	delete(x.pds, h)
	x.memBytes -= memSmall
	x.mu.Unlock()
	return nil
}
