// Package bridge is what the service (package verbs/service) reaches of
// the verbs' internals: the protocol engine's objects behind a device's
// QPs, SRQs, MRs and windows, a CQ whose completions go to a sink of the
// service's, the device's event hook and the fatal end of a QP. The
// service drives the engine directly (it posts the work requests its
// clients' rings carry to the engine's QP), and the verbs keep those parts
// unexported.
//
// Package verbs fills the hooks in its init (Set), with its own types as
// the type arguments; the service takes them (Get) with the same ones, so
// both sides are type-checked and only Get's one assertion is made at
// run time. This package cannot name the verbs' types: verbs imports it.
package bridge

import "github.com/rdmatap/rdmatap/iwarp"

// Hooks are the verbs' internals the service uses.
type Hooks[Device, MR, MW, QP, CQ, SRQ, Event any] struct {
	// EventHook installs h as d's event hook, which sees each QP event
	// first and keeps those it returns true for from the device's own
	// channel (install), if d has none; or removes h if it is d's hook.
	// It reports whether it did.
	EventHook func(d Device, h *func(Event) bool, install bool) bool
	// SinkCQ makes a CQ of d whose completions the engine gives to sink
	// instead of keeping them.
	SinkCQ func(d Device, sink iwarp.CQ) CQ
	// EngineQP returns an embedded QP's engine QP.
	EngineQP func(QP) *iwarp.QP
	// Fatal destroys an embedded QP as an RNIC does on a local
	// catastrophic error (a Terminate to the peer first).
	Fatal func(QP) error
	// RecvQueue returns an embedded SRQ's queue.
	RecvQueue func(SRQ) *iwarp.RecvQueue
	// FastRegMR returns the engine's fast-register MR of an embedded MR
	// from AllocMR (nil for a regular MR).
	FastRegMR func(MR) *iwarp.FastRegMR
	// Window returns an embedded memory window's engine window.
	Window func(MW) *iwarp.Window
}

var hooks any

// Set makes h the hooks Get returns.
func Set[Device, MR, MW, QP, CQ, SRQ, Event any](h Hooks[Device, MR, MW, QP, CQ, SRQ, Event]) {
	hooks = h
}

// Get returns the hooks Set was given. It panics if they were set with
// other type arguments (or not at all): a build that links the service
// links the verbs, whose init sets them.
func Get[Device, MR, MW, QP, CQ, SRQ, Event any]() Hooks[Device, MR, MW, QP, CQ, SRQ, Event] {
	h, ok := hooks.(Hooks[Device, MR, MW, QP, CQ, SRQ, Event])
	if !ok {
		panic("verbs/internal/bridge: the hooks were not set with these types")
	}
	return h
}
