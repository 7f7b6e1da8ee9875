package netstack

import (
	"sync"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// directQDisc is the NIC's queueing discipline: as gVisor's default one it
// hands each packet straight to the link, but without allocating. The
// default builds a one-packet PacketBufferList per packet, whose slice
// escapes into the link's WritePackets (an interface call): an allocation
// for every segment and ACK sent, in whatever goroutine sends it (an RDMA
// poster, a service's ring poller). Here the lists come from a pool.
type directQDisc struct {
	link stack.LinkWriter
}

// pktLists holds one-packet lists for directQDisc.
var pktLists = sync.Pool{New: func() any {
	l := new(stack.PacketBufferList)
	return l
}}

// WritePacket implements stack.QueueingDiscipline. The links take the
// list, not the packet: the caller keeps its reference, so the list holds
// one of its own, which Reset drops while it empties the list for reuse
// (PacketBufferList has no other way to empty itself and keep its array).
// No link of ours keeps a list past WritePackets.
func (q directQDisc) WritePacket(pkt *stack.PacketBuffer) tcpip.Error {
	l := pktLists.Get().(*stack.PacketBufferList)
	l.PushBack(pkt.IncRef())
	_, err := q.link.WritePackets(*l)
	l.Reset()
	pktLists.Put(l)
	return err
}

// Close implements stack.QueueingDiscipline.
func (directQDisc) Close() {}
