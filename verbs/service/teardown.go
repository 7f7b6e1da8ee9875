package service

import (
	"sync"

	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

// teardown releases everything the client held, in the order the design
// comment gives.
func (x *session) teardown() {
	x.cancel()
	x.conn.Close()
	x.mu.Lock()
	lns := x.lns
	reqs := x.reqs
	x.lns, x.reqs = map[uint64]servedListener{}, map[uint64]*verbs.ConnRequest{}
	x.mu.Unlock()
	for _, l := range lns {
		l.l.Close()
	}
	for _, r := range reqs {
		r.Reject(nil)
	}
	x.stopPoller()
	if x.bell != nil {
		x.bell.Close()
	}
	x.pollWG.Wait()
	x.mu.Lock()
	qps := make([]*servedQP, 0, len(x.qps))
	for _, q := range x.qps {
		qps = append(qps, q)
	}
	x.mu.Unlock()
	var wg sync.WaitGroup
	for _, q := range qps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x.releaseQP(q, true)
		}()
	}
	wg.Wait()
	x.calls.Wait() // dial, accept, watchers: all end with the context
	// Windows first (they hold MRs), then fast-register MRs (they hold
	// the pages of MRs), then MRs: STags invalidated and fenced, and only
	// then the pages unmapped.
	x.mu.Lock()
	mws, frmrs, mrs := x.mws, x.frmrs, x.mrs
	x.mws, x.frmrs, x.mrs = map[uint64]*verbs.MW{}, map[uint64]*servedFRMR{}, map[uint64]*servedMR{}
	x.mu.Unlock()
	for _, mw := range mws {
		mw.Dealloc()
	}
	for _, f := range frmrs {
		if err := x.releaseFRMR(f); err != nil {
			x.logf("fast-register MR: %v: its pages stay mapped", err)
		}
	}
	for _, r := range mrs {
		if err := x.releaseMR(r); err != nil {
			x.logf("MR: %v: its pages stay mapped", err)
		}
	}
	// ClientStats may read the tables meanwhile: they change under x.mu.
	x.mu.Lock()
	srqs := make([]uint64, 0, len(x.srqs))
	for h := range x.srqs {
		srqs = append(srqs, h)
	}
	x.mu.Unlock()
	for _, h := range srqs {
		x.destroySRQ(h)
	}
	x.mu.Lock()
	cqs, pds := x.cqs, x.pds
	x.cqs, x.pds = map[uint64]*servedCQ{}, map[uint64]*verbs.PD{}
	x.mu.Unlock()
	for _, s := range cqs {
		s.retire()
	}
	for _, pd := range pds {
		pd.Close()
	}
	if x.ctl != nil {
		svc.Unmap(x.ctl)
		x.srv.dropMap(x.cred.UID)
	}
	if x.ctlFd >= 0 {
		closeFd(x.ctlFd)
	}
	x.srv.mu.Lock()
	delete(x.srv.sessions, x)
	if x.srv.perUID[x.cred.UID]--; x.srv.perUID[x.cred.UID] == 0 {
		delete(x.srv.perUID, x.cred.UID)
	}
	x.srv.mu.Unlock()
	if x.cred.PID != 0 {
		x.logf("gone: resources released")
	}
}
