package service

import (
	"slices"

	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

// queryDevice is the device's limits as the client may use them: the
// device's, lowered to the client's own limits.
func (x *session) queryDevice() verbs.DeviceAttr {
	a := x.dev.Query()
	l := x.lim
	a.MaxQP = min(a.MaxQP, l.QPs)
	a.MaxQPWR = min(a.MaxQPWR, l.MaxWR)
	a.MaxCQ = min(a.MaxCQ, l.CQs)
	a.MaxCQE = min(a.MaxCQE, l.MaxCQE) // createCQ's bound
	a.MaxMR = min(a.MaxMR, l.MRs)
	a.MaxMRSize = min(a.MaxMRSize, uint64(l.MRBytes))
	a.MaxPD = min(a.MaxPD, l.PDs)
	a.MaxSRQ = min(a.MaxSRQ, l.SRQs)
	a.MaxSRQWR = min(a.MaxSRQWR, l.MaxWR)
	a.MaxMW = min(a.MaxMW, l.MRs)
	a.MaxFRPages = min(a.MaxFRPages, l.FRPages)
	return a
}

// atomicCapValues are the ibv_atomic_cap values of DeviceAttr.AtomicCap,
// in QUERY_DEVICE's numbering.
var atomicCapValues = [...]string{verbs.AtomicNone, verbs.AtomicHCA, verbs.AtomicGlob}

// encodeAttr lays a out as QUERY_DEVICE's reply arguments.
func encodeAttr(a verbs.DeviceAttr) []uint64 {
	v := make([]uint64, svc.QueryArgs)
	v[svc.QueryMaxQP], v[svc.QueryMaxQPWR], v[svc.QueryMaxSGE] = uint64(a.MaxQP), uint64(a.MaxQPWR), uint64(a.MaxSGE)
	v[svc.QueryMaxSGERd], v[svc.QueryMaxCQ], v[svc.QueryMaxCQE] = uint64(a.MaxSGERd), uint64(a.MaxCQ), uint64(a.MaxCQE)
	v[svc.QueryMaxMR], v[svc.QueryMaxMRSize], v[svc.QueryMaxPD] = uint64(a.MaxMR), a.MaxMRSize, uint64(a.MaxPD)
	v[svc.QueryMaxQPRdAtom], v[svc.QueryMaxQPInitRd] = uint64(a.MaxQPRdAtom), uint64(a.MaxQPInitRd)
	v[svc.QueryMaxSRQ], v[svc.QueryMaxSRQWR], v[svc.QueryMaxSRQSGE] = uint64(a.MaxSRQ), uint64(a.MaxSRQWR), uint64(a.MaxSRQSGE)
	v[svc.QueryMaxInline], v[svc.QueryMaxPrivData], v[svc.QueryMaxMsgSize] = uint64(a.MaxInline), uint64(a.MaxPrivData), a.MaxMsgSize
	v[svc.QueryAtomicCap] = uint64(slices.Index(atomicCapValues[:], a.AtomicCap))
	v[svc.QueryPageSizeCap], v[svc.QueryMaxMW], v[svc.QueryMaxFRPages] = a.PageSizeCap, uint64(a.MaxMW), uint64(a.MaxFRPages)
	v[svc.QueryVendorPartID], v[svc.QueryVendorID] = uint64(a.VendorPartID), uint64(a.VendorID)
	return v
}

// encodePort lays l out as QUERY_PORT's reply.
func encodePort(b *svc.Builder, l verbs.Link) {
	v := make([]uint64, svc.PortArgs)
	w, sp := l.WidthSpeed()
	v[svc.PortState], v[svc.PortPhysState], v[svc.PortLinkMTU] = uint64(l.PortState()), uint64(l.PhysState()), uint64(l.MTU)
	v[svc.PortActiveMTU], v[svc.PortActiveWidth], v[svc.PortActiveSpeed] = uint64(l.ActiveMTU()), uint64(w), uint64(sp)
	var ip []byte
	if l.Addr.Is4() {
		a4 := l.Addr.As4()
		ip = a4[:]
	}
	gid, guid := l.GID(), l.NodeGUID()
	b.Args(v...).Bytes(ip).Bytes(l.MAC).Bytes(gid[:]).Bytes(guid[:])
}
