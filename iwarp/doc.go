// Package iwarp implements the iWARP protocol suite over a TCP stream:
// MPA (RFC 5044) with enhanced connection setup (RFC 6581), DDP (RFC 5041),
// RDMAP (RFC 5040) and the RFC 7306 extensions.
//
// Wire formats are typed byte views in the style of gVisor's header package
// (type X []byte with accessors and an Encode method; parsing never
// allocates). The protocol engines beside them negotiate MPA, frame and
// unframe FPDUs, place DDP segments into registered memory, run the RDMAP
// operations and the QP state machine, and raise Terminates.
//
// # Locks
//
// The package's mutexes, what each guards and who takes it. Every field a
// mutex guards is marked +checklocks with it (checklocks checks them in
// CI); the fields not marked are set before their object is shared and
// never change (a QP's cfg; the receiver's seg, waitOr, waitUnread and
// heldFn, which Start sets and the RX goroutine reads while it waits), are
// atomics or channels, or are named below.
//
//   - QP.mu guards what everyone shares: the state, the send queue, the
//     ORQ and IRQ, the queued Terminate, the TX gate and the first-FPDU
//     hold, the MSNs sent, the error. It is held for short bookkeeping
//     only: never across a stream read or write, a completion or an
//     event. Posters (PostSend, PostRecv) take it for the send queue and
//     the state; the hold and Terminate timers take it too.
//   - QP.txMu is held while transmitting; its holder owns the transmitter
//     (QP.tx) and writes to the stream: the TX goroutine for each drain of
//     work; a poster that transmits in its own goroutine (postInline,
//     postDirect, TryLock only); the link's goroutine answering a short
//     Read or atomic Request (respondInline, TryLock only); flush, once,
//     to wait for a poster's write to end.
//   - QP.rxMu is held while receiving; its holder owns the receiver
//     (QP.rx) and reads from the stream: the RX goroutine for each read; a
//     poller in Progress (TryLock) or WaitProgress; the segment placer
//     feeding the receiver on netstack's link goroutine (segPlacer.feed,
//     TryLock); flush, once the RX goroutine has ended.
//   - Start holds rxMu, txMu and mu while it sets the QP up, before its
//     goroutines start: the only place rxMu and txMu are held together.
//     What it sets there and everyone reads without a lock after (the
//     stream, ctx, cancel, txDone, rxDone, seg, segUntap) never changes
//     again; live is an atomic copy of the stream, for Progress.
//   - segPlacer.placeMu serializes placement and guards its scratch (the
//     marked segment's views, the holds, the header and the Send
//     destination being resolved): the link's goroutine holds it in
//     placeRetain, the receive goroutine in work.
//   - segPlacer.mu guards the placer's shared state: the FPDUs placed
//     ahead, what the tap has seen, the queued segments, the kept ones,
//     and the receiver's Send state as the receiver last told it. front,
//     nrec, parsed and nkept are atomics read without it. Kept packets
//     are released (netstack.Kept.Release) with it held.
//   - RecvQueue.mu guards a receive queue's ring, its SRQ limit and its
//     refill function; onLimit and refill run after it is released.
//   - MemTable.mu serializes every change of the memory table (Register,
//     Deregister, and the memory objects' reserve, rebind, release and
//     invalidateUnbound); lookups, one per tagged FPDU, take no lock.
//   - FastRegMR.mu guards the mapping a fast-register MR's next REG_MR
//     registers.
//
// The order, "A → B" for B taken while A is held:
//
//   - rxMu → txMu → mu: Start.
//   - txMu → mu: pick, claimORQ, nextMSN and the transmitter's other
//     bookkeeping. rxMu → mu: the receive path's ORQ, IRQ and gate
//     checks.
//   - mu → txMu: PostSend's TryLock (postDirect releases mu inside),
//     which cannot wait. Nothing else is taken under mu.
//   - txMu or rxMu → the CQs' locks: completions are pushed by the holder
//     of txMu or rxMu (and by flush, holding neither); a CQ's Push must
//     not block (see CQ).
//   - txMu or rxMu → MemTable.mu: registration and invalidation work
//     requests, a Send with Invalidate, a Read's local invalidate.
//   - txMu → FastRegMR.mu: the transmitter executing a REG_MR.
//   - rxMu → segPlacer.mu → RecvQueue.mu: the receiver's Send bookkeeping
//     (publishSends, takeRecv). rxMu → RecvQueue.mu: the receiver's take
//     without segment placement.
//   - rxMu → a receive queue's refill function, which takes its own locks
//     inside (QP.mu and RecvQueue.mu through PostRecv, a CQ's lock) but
//     no txMu or rxMu.
//   - placeMu → rxMu (feed, TryLock only) → segPlacer.mu; placeMu →
//     segPlacer.mu → RecvQueue.mu (sendDst's peek); placeMu → QP.mu
//     (readResponseDst); placeMu → txMu (respondInline, TryLock only).
//   - txMu or no lock → segPlacer.mu: stop, from QP.fail.
//
// segPlacer.mu is never held while QP.mu, rxMu, txMu or placeMu is taken;
// RecvQueue.mu, MemTable.mu and FastRegMR.mu are leaves.
package iwarp
