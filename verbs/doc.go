// Package verbs is rdmatap's public RDMA API: device, protection domain,
// memory region (STag), completion queue, queue pair, shared receive queue,
// work requests and completions, and connection management (listen, dial,
// accept and reject with private data and IRD/ORD). It follows the libibverbs
// and librdmacm nouns, with Go idioms on top: every blocking call takes a
// context, errors are typed and work with errors.Is, and the data path
// allocates nothing per operation.
//
// A Device comes from Open (an embedded device on this process's netstack)
// or from Connect (a device a running service offers over a unix socket,
// `rdmatap up --socket`, usable without privileges); the API is the same.
// Package verbs/service is the service side. The split between the two
// (docs/service.md): the slow path goes over the socket, memory is the
// client's own memfd pages, and the queues are rings in shared memory.
//
// # Locks
//
// The package's mutexes, what each guards and where it is taken. A field
// a mutex of its own object guards is marked +checklocks; a field another
// object's mutex guards is marked +checklocksignore with that mutex's
// name, as checklocks names only the locks of a field's own struct. The
// fields not named here are set before their object is shared and never
// change (a device's and its client's by Open or Connect; siwReply by a
// test, before the device is used), or are atomics, channels and onces
// (a device's counters, QP and PD numbers, lost and hook; an SRQ's
// closed).
//
//   - Device.mu guards the device's lists of QPs and listeners and its
//     closed flag. It is held only around their updates: Close copies the
//     lists and closes each QP and listener after releasing it.
//   - PD.mu guards closed and the counts of what uses the PD (mrs, qps,
//     srqs). It is held across a registration in the STag table (regMRAt,
//     AllocMR, AllocMW) and, on a device of a service, across Close's
//     DEALLOC_PD call.
//   - MR.mu guards freed and makes Dereg one step: it is held across the
//     deregistration (the STag table's lock and fence, or the service's
//     DEREG_MR call and the client's table) and the PD's count. A
//     fast-register MR's mapping locks for itself (iwarp FastRegMR.mu,
//     remoteFR.mu).
//   - SRQ.mu guards the count of QPs and makes Close's check of it and its
//     store of closed one step against use; closed is stored under it and
//     read without it (PostRecv, Len, SetLimit). Close holds it across the
//     service's DESTROY_SRQ call and then takes the PD's. The receive queue
//     locks for itself.
//   - CQ.mu guards the ring (ring, head, n, over), the arming and the
//     count of QPs; on a device of a service it serialises the client's
//     consumers of the shared ring (remoteCQ.cons and seen: Poll, Len,
//     WaitEvent). remoteCQ.dead is stored once, by release (under CQ.mu
//     from Close, or by the client's close).
//   - ConnRequest.mu guards used (claim).
//   - client.mu guards a service client's tables (qps, srqs, cqs, frs, mwt,
//     mrKeys), held only to look them up or update them, never across a
//     call or a write. Any caller's goroutine takes it, and the session's
//     read loop (an event's or QP_DONE's lookup, the session's end).
//   - remoteQP.sqMu serialises the posters of a service QP's send ring: it
//     guards sqProd and the entries being written, and is held across the
//     checks and bookkeeping of a REG_MR or BIND_MW; publishSQ stores the
//     index and releases it. remoteQP.rqMu and remoteSRQ.mu do the same
//     for a receive ring (rqProd, prod; postRing is given the lock and the
//     index). remoteQP.errMu guards err.
//   - remoteFR.mu guards a service fast-register MR's mapping and the
//     registration last posted (every field but maxPages); remoteMW.mu a
//     service window's binding last posted (buf).
//
// The order, "A → B" for B taken while A is held (iwarp's locks are the
// protocol engine's; session.Session.mu is package verbs/internal/session's):
//
//   - PD.mu → iwarp MemTable.mu: regMRAt, AllocMR, AllocMW.
//   - PD.mu → session.Session.mu: Close's DEALLOC_PD.
//   - MR.mu → iwarp MemTable.mu, MR.mu → session.Session.mu, MR.mu →
//     client.mu, MR.mu → PD.mu: Dereg.
//   - SRQ.mu → session.Session.mu, SRQ.mu → client.mu (remoteSRQ.destroy),
//     SRQ.mu → PD.mu: Close.
//   - iwarp QP.txMu or QP.rxMu → CQ.mu: the engine's transmitter and
//     receiver push completions, and flush does, with their QP's lock
//     held (not its mu).
//   - remoteQP.sqMu → client.mu, remoteFR.mu, remoteMW.mu: a REG_MR or
//     BIND_MW posted.
//
// Device.mu, CQ.mu (nothing of the engine is locked under it),
// ConnRequest.mu, client.mu, remoteFR.mu, remoteMW.mu, remoteQP.rqMu,
// remoteQP.errMu and remoteSRQ.mu are leaves. client.mu and
// session.Session.mu are never held while the other is taken: the session
// calls back (Config.Message, Config.Failed) with its own mu released,
// and the client makes its calls with client.mu released.
package verbs
