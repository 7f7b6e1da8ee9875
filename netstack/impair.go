package netstack

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/link/nested"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// ImpairConfig configures NewImpair. Rates are probabilities in [0, 1]
// (values outside are clamped) applied independently per packet, in the
// order loss, duplication, reordering.
type ImpairConfig struct {
	Seed                           int64
	LossRate, ReorderRate, DupRate float64
	Filter                         func(pkt *stack.PacketBuffer) bool // nil = all packets
}

// reorderFlush bounds how long a packet held back for reordering waits for
// a successor before it is sent anyway.
const reorderFlush = time.Millisecond

// ImpairStats counts what an impairment endpoint did.
type ImpairStats struct {
	Packets, Dropped, Duplicated, Reordered uint64
}

// Impair is a link endpoint wrapper that drops, duplicates and reorders the
// packets the wrapped endpoint sends (received packets pass untouched). The
// decisions are a deterministic function of Seed and the sequence of
// packets matched by Filter. A reordered packet is held back and sent right
// after the next packet written (or after 1 ms if none follows).
type Impair struct {
	nested.Endpoint

	loss, reorder, dup float64
	filter             func(*stack.PacketBuffer) bool

	mu     sync.Mutex
	rng    *rand.Rand
	held   *stack.PacketBuffer // held-back packet (our clone), guarded by mu
	timer  *time.Timer
	closed bool
	// noTimer (tests): a held-back packet waits for a successor or an
	// explicit flush, never for the timer, so a trace does not depend on
	// how fast its writer runs.
	noTimer bool

	packets, dropped, duplicated, reordered atomic.Uint64
}

var (
	_ stack.LinkEndpoint      = (*Impair)(nil)
	_ stack.GSOEndpoint       = (*Impair)(nil)
	_ stack.NetworkDispatcher = (*Impair)(nil)
)

// NewImpair wraps ep so that packets it sends are impaired per cfg. The
// result is an *Impair.
func NewImpair(ep stack.LinkEndpoint, cfg ImpairConfig) stack.LinkEndpoint {
	clamp := func(f float64) float64 {
		if f != f || f < 0 { // NaN or negative
			return 0
		}
		return min(f, 1)
	}
	seed := uint64(cfg.Seed)
	im := &Impair{
		loss:    clamp(cfg.LossRate),
		reorder: clamp(cfg.ReorderRate),
		dup:     clamp(cfg.DupRate),
		filter:  cfg.Filter,
		rng:     rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
	}
	im.Endpoint.Init(ep, im)
	return im
}

// Stats returns the impairment counters.
func (im *Impair) Stats() ImpairStats {
	return ImpairStats{
		Packets:    im.packets.Load(),
		Dropped:    im.dropped.Load(),
		Duplicated: im.duplicated.Load(),
		Reordered:  im.reordered.Load(),
	}
}

// WritePackets implements stack.LinkWriter. Dropped packets count as
// written (they are lost "on the wire").
func (im *Impair) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	var out stack.PacketBufferList
	var owned []*stack.PacketBuffer // clones we must release
	im.mu.Lock()
	if im.closed {
		im.mu.Unlock()
		return 0, &tcpip.ErrClosedForSend{}
	}
	for _, pkt := range pkts.AsSlice() {
		if im.filter != nil && !im.filter(pkt) {
			out.PushBack(pkt)
			owned = im.releaseHeldLocked(&out, owned)
			continue
		}
		im.packets.Add(1)
		// Draw all three numbers for every packet so that one rate does not
		// shift the random sequence of the others.
		rLoss, rDup, rReorder := im.rng.Float64(), im.rng.Float64(), im.rng.Float64()
		if rLoss < im.loss {
			im.dropped.Add(1)
			continue
		}
		if rReorder < im.reorder && im.held == nil {
			im.reordered.Add(1)
			im.held = pkt.Clone()
			if rDup < im.dup {
				im.duplicated.Add(1)
				c := pkt.Clone()
				owned = append(owned, c)
				out.PushBack(c)
			}
			im.armTimerLocked()
			continue
		}
		out.PushBack(pkt)
		if rDup < im.dup {
			im.duplicated.Add(1)
			c := pkt.Clone()
			owned = append(owned, c)
			out.PushBack(c)
		}
		owned = im.releaseHeldLocked(&out, owned)
	}
	im.mu.Unlock()

	var err tcpip.Error
	if out.Len() > 0 {
		var n int
		n, err = im.Endpoint.WritePackets(out)
		if n > 0 {
			err = nil
		}
	}
	for _, c := range owned {
		c.DecRef()
	}
	if err != nil {
		return 0, err
	}
	return pkts.Len(), nil
}

// releaseHeldLocked appends the held-back packet (if any) after the packets
// in out.
func (im *Impair) releaseHeldLocked(out *stack.PacketBufferList, owned []*stack.PacketBuffer) []*stack.PacketBuffer {
	if im.held == nil {
		return owned
	}
	out.PushBack(im.held)
	owned = append(owned, im.held)
	im.held = nil
	if im.timer != nil {
		im.timer.Stop()
	}
	return owned
}

func (im *Impair) armTimerLocked() {
	if im.noTimer {
		return
	}
	if im.timer == nil {
		im.timer = time.AfterFunc(reorderFlush, im.flush)
		return
	}
	im.timer.Reset(reorderFlush)
}

// flush sends a held-back packet that found no successor.
func (im *Impair) flush() {
	im.mu.Lock()
	if im.held == nil || im.closed {
		im.mu.Unlock()
		return
	}
	var out stack.PacketBufferList
	owned := im.releaseHeldLocked(&out, nil)
	im.mu.Unlock()
	im.Endpoint.WritePackets(out)
	for _, c := range owned {
		c.DecRef()
	}
}

// Close implements stack.NetworkLinkEndpoint: it discards a held-back
// packet and closes the wrapped endpoint.
func (im *Impair) Close() {
	im.mu.Lock()
	im.closed = true
	if im.timer != nil {
		im.timer.Stop()
	}
	if im.held != nil {
		im.held.DecRef()
		im.held = nil
	}
	im.mu.Unlock()
	im.Endpoint.Close()
}
