package verbs

import (
	"context"

	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

func (cl *client) allocPD() (*PD, error) {
	r, err := cl.do(context.Background(), svc.TAllocPD, nil)
	if err != nil {
		return nil, err
	}
	pd := &PD{dev: cl.dev, id: uint32(r.m.Arg(0))}
	pd.ops = &remotePD{pd: pd, h: r.m.Arg(0)}
	return pd, nil
}

// remotePD is a PD of a service: its handle.
type remotePD struct {
	pd *PD
	h  uint64
}

// handle returns the service's handle of a PD of a service.
func (pd *PD) handle() uint64 { return pd.ops.(*remotePD).h }

func (r *remotePD) regMR(buf []byte, iova uint64, acc Access) (*MR, error) {
	return r.pd.remoteRegMRCounted(buf, iova, acc)
}

func (r *remotePD) allocMR(maxPages int) (*MR, error) { return r.pd.remoteAllocMR(maxPages) }

func (r *remotePD) allocMW(t MWType) (*MW, error) { return r.pd.remoteAllocMW(t) }

func (r *remotePD) createQP(cfg QPConfig) (*QP, error) { return r.pd.remoteCreateQP(cfg) }

func (r *remotePD) createSRQ(maxWR, maxSGE int) (*SRQ, error) {
	return r.pd.remoteCreateSRQ(maxWR, maxSGE)
}

func (r *remotePD) destroy() error { return r.pd.remoteClose() }

func (pd *PD) remoteClose() error {
	_, err := pd.dev.client().do(context.Background(), svc.TDeallocPD, func(b *svc.Builder) { b.Args(pd.handle()) })
	return err
}
