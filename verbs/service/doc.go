// Package service offers an embedded device (verbs.Open) to other
// processes on a unix socket: they open it with verbs.Connect and use it
// through the same verbs API as their own, without privileges, while this
// process owns the TAP device and the netstack. `rdmatap up --socket`
// runs it; a program that embeds the device serves it with Serve.
//
// Each client's objects are its own (handles of another client name
// nothing), bounded by Limits, and released when it goes, however it
// goes. The work requests and completions cross in rings of shared
// memory, and the client's memory is registered in place: nothing is
// copied between the processes. docs/service.md describes the design and
// docs/service-protocol.md the wire format.
//
// # Locks
//
// The package's mutexes, what each guards and where it is taken. A field
// a mutex of its own object guards is marked +checklocks; a field another
// object's mutex guards is marked +checklocksignore with that mutex's
// name, as checklocks names only the locks of a field's own struct. The
// fields not named here are set before their object is shared and never
// change (a session's ctl, ctlFd, sleeping and bell by hello, before the
// poller starts), are atomics, channels or wait groups, or belong to one
// goroutine (servedFRMR.pend, the reader's).
//
//   - Server.mu guards the sessions, the admission and mapping counts and
//     the QP owners (closed, sessions, perUID, pending, maps, mapsUID,
//     qpOwner, nextID). The fields above it and maxMaps are set by Serve;
//     refusing is an atomic.
//   - umaskMu serialises ListenSocket's change of the process's umask,
//     held across the bind only.
//   - session.wmu lets one writer on the socket at a time (replies,
//     events, QP ends); it is held only across svc.Write and guards no
//     field.
//   - session.mu guards the handle tables, the limits' counts and the
//     charges, and of the objects in those tables servedMR.refs and
//     gone, servedFRMR.used, servedCQ.refs, servedSRQ.refs, servedQP.conn
//     and servedQP.cost; stop is closed once, under it. It is held for
//     bookkeeping only, never across a call into the device or the
//     engine.
//   - session.pollMu lets one pass over the rings run at a time
//     (pollOnce), by the poller or the reader (dispatch). It guards the
//     served QPs' send ring consumer state (servedQP.sqCons, sqSnap, wrs,
//     sgl) and servedQP.blocked, which the pass sets; releaseQP clears
//     blocked holding ringMu for writing instead (no pass runs then).
//   - session.ringMu (a RWMutex) guards pollQPs and pollSRQs: a pass holds
//     it for reading while it touches the rings; createQP, createSRQ,
//     destroySRQ and releaseQP hold it for writing while they add or
//     remove a ring.
//   - servedQP.rqMu and servedSRQ.mu guard a receive ring's consumer
//     state: its consumer index, scratch SGEs and whether the ring is gone
//     (rqCons, rsgl, rqGone; cons, sgl, gone). The pass takes them, and so
//     does the engine's receive path when an untagged message finds the
//     queue empty (refillRQ, refillSRQ, with the receiving QP's rxMu
//     held): both take entries under the same lock, so each entry is
//     taken once.
//   - servedCQ.mu serialises a CQ ring's producers (the engines'
//     transmitters and receivers, and failWR) and retire: it guards prod
//     and dead.
//
// The order, "A → B" for B taken while A is held (the engine's locks are
// package iwarp's and verbs'):
//
//   - pollMu → ringMu → mu: createQP, createSRQ and destroySRQ take mu
//     inside ringMu; a pass takes it in resolve and stopPoller.
//   - pollMu → ringMu → the engine's PostSend and PostRecv (iwarp QP.mu;
//     QP.txMu, for a send the poster transmits itself; RecvQueue.mu) →
//     servedCQ.mu (failWR, and the completions of those sends).
//   - pollMu → ringMu → rqMu or servedSRQ.mu → the engine's PostRecv
//     (iwarp QP.mu, RecvQueue.mu), servedCQ.mu (failWR) and mu
//     (stopPoller, when a ring's index is out of range).
//   - iwarp QP.rxMu → rqMu or servedSRQ.mu: the engine's refill.
//   - iwarp QP.txMu or QP.rxMu → servedCQ.mu: the engine completes into
//     a served CQ (Push).
//   - ringMu → Server.mu: dropRing's dropMap, from releaseQP and
//     destroySRQ.
//   - ringMu → verbs SRQ.mu → verbs PD.mu: destroySRQ.
//   - servedCQ.mu → mu and servedCQ.mu → Server.mu: a served CQ's retire
//     (uncharge, dropRing).
//   - iwarp QP.txMu or QP.rxMu → Server.mu: routeEvent, the device's
//     event hook, runs where the QP raises the event.
//
// Server.mu, session.mu, session.wmu and umaskMu are leaves: nothing is
// locked while one is held (ClientStats releases Server.mu before it
// locks each session's mu).
package service
