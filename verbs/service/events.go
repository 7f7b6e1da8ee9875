package service

import (
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

// sendEvent queues an event for the client; a client that does not read
// loses events (as a full Events channel does), never stalls the device.
func (x *session) sendEvent(e verbs.AsyncEvent) {
	select {
	case x.events <- e:
	default:
	}
}

// disconnectReason is EVENT's argument 6: why a DISCONNECTED event's
// connection ended (0 for other events).
func disconnectReason(e verbs.AsyncEvent) uint64 {
	switch {
	case e.Type != verbs.EventDisconnected:
		return 0
	case e.Err != nil:
		return svc.DisconnectError
	case e.ByPeer:
		return svc.DisconnectPeer
	}
	return svc.DisconnectLocal
}

// eventWriter writes queued events to the client (one per client).
func (x *session) eventWriter() {
	defer x.calls.Done()
	var b svc.Builder
	for {
		select {
		case e := <-x.events:
			var srqH uint64
			if e.SRQ != nil {
				x.mu.Lock()
				for h, s := range x.srqs {
					if s.srq == e.SRQ {
						srqH = h
					}
				}
				x.mu.Unlock()
			}
			var args [svc.EventArgs]uint64
			args[svc.EventArgType] = uint64(e.Type)
			args[svc.EventArgQPN] = uint64(e.QPNum)
			args[svc.EventArgSRQ] = srqH
			args[svc.EventArgTermLayer] = uint64(e.Term.Layer)
			args[svc.EventArgTermType] = uint64(e.Term.EType)
			args[svc.EventArgTermCode] = uint64(e.Term.Code)
			n := svc.EventArgReason // a client without FeatureCM gets the arguments before it
			if x.features&svc.FeatureCM != 0 {
				args[svc.EventArgReason] = disconnectReason(e)
				n = svc.EventArgs
			}
			b.Reset(svc.TEvent, 0, 0).Args(args[:n]...)
			if e.Err != nil {
				b.String(e.Err.Error())
			}
			x.wmu.Lock()
			svc.Write(x.conn, b.Msg())
			x.wmu.Unlock()
		case <-x.ctx.Done():
			return
		}
	}
}
