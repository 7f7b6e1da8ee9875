package iwarp

import "unsafe"

// The most heap a queue may come to hold, for whoever must budget it (a
// service charges its clients' queues against their memory limits before
// it creates them). Queues grow as posts need slots, doubling up to their
// depth; while one grows, the old entry array lives beside the new one
// until the collector takes it, so the entry arrays count one and a half
// times. The SGE slabs and inline buffers are never copied: once each.

// SendQueueFootprint is the most heap the send queue of a QP with maxWR
// work requests of maxSGE SGEs and maxInline bytes of inline data holds,
// with the transmitter's inline buffer.
func SendQueueFootprint(maxWR, maxSGE, maxInline int) int64 {
	n := int64(maxWR)
	wqe := int64(unsafe.Sizeof(sendWQE{}))
	sge := int64(unsafe.Sizeof(SGE{}))
	return n*wqe*3/2 + n*int64(maxSGE)*sge + n*int64(maxInline) + int64(maxInline)
}

// RecvQueueFootprint is the most heap a receive queue (a QP's own or an
// SRQ) of depth receives of maxSGE SGEs holds.
func RecvQueueFootprint(depth, maxSGE int) int64 {
	n := int64(depth)
	wqe := int64(unsafe.Sizeof(recvWQE{}))
	sge := int64(unsafe.Sizeof(SGE{}))
	return int64(unsafe.Sizeof(RecvQueue{})) + n*wqe*3/2 + n*int64(maxSGE)*sge
}

// QPFootprint is a QP's own heap beside its queues: the QP with its
// receiver and transmitter, and its ORD and IRD queues at their largest.
func QPFootprint() int64 {
	return int64(unsafe.Sizeof(QP{})) + MaxIRDORD*int64(unsafe.Sizeof(orqEntry{})+unsafe.Sizeof(irqEntry{}))
}

// FastRegFootprint is the most heap a fast-register MR of maxPages pages
// holds: the MR and its page list at its longest.
func FastRegFootprint(maxPages int) int64 {
	return int64(unsafe.Sizeof(FastRegMR{})) + int64(unsafe.Sizeof(pageList{})) + int64(maxPages)*int64(unsafe.Sizeof([]byte(nil)))
}
