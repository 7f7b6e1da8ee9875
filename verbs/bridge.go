package verbs

import (
	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/verbs/internal/bridge"
)

// The service (verbs/service) drives the engine behind an embedded
// device's objects; bridge hands it the parts it needs.
func init() {
	bridge.Set(bridge.Hooks[*Device, *MR, *MW, *QP, *CQ, *SRQ, AsyncEvent]{
		EventHook: func(d *Device, h *func(AsyncEvent) bool, install bool) bool {
			if install {
				return d.hook.CompareAndSwap(nil, h)
			}
			return d.hook.CompareAndSwap(h, nil)
		},
		SinkCQ: func(d *Device, sink iwarp.CQ) *CQ {
			cq := newCQ(d, nil)
			cq.ops, cq.sink = (*engineCQ)(cq), sink
			return cq
		},
		EngineQP:  func(qp *QP) *iwarp.QP { return qp.iw },
		Fatal:     func(qp *QP) error { return qp.fatal() },
		RecvQueue: func(s *SRQ) *iwarp.RecvQueue { return s.rq },
		FastRegMR: func(m *MR) *iwarp.FastRegMR { return m.fr },
		Window:    func(mw *MW) *iwarp.Window { return mw.w },
	})
}
