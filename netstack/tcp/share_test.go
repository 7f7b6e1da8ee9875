package tcp_test

import (
	"context"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/netstack"
	rtcp "github.com/rdmatap/rdmatap/netstack/tcp"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/seqnum"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// holdLink is a link that keeps a clone of every packet written to it,
// as a slow link or a queue would hold it, and drops chosen data packets
// the first time they pass.
type holdLink struct {
	stack.LinkEndpoint
	mu    sync.Mutex
	held  []*stack.PacketBuffer
	data  int          // data packets written
	drop  map[int]bool // data packets (counted from 1) dropped
	fresh chan struct{}
}

func (l *holdLink) GSOMaxSize() uint32 { return l.LinkEndpoint.(stack.GSOEndpoint).GSOMaxSize() }
func (l *holdLink) SupportedGSO() stack.SupportedGSO {
	return l.LinkEndpoint.(stack.GSOEndpoint).SupportedGSO()
}

func (l *holdLink) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	var pass stack.PacketBufferList
	l.mu.Lock()
	for _, pkt := range pkts.AsSlice() {
		l.held = append(l.held, pkt.Clone())
		if pkt.Data().Size() > 0 {
			l.data++
			if l.drop[l.data] {
				continue
			}
		}
		pass.PushBack(pkt)
	}
	l.mu.Unlock()
	if pass.Len() > 0 {
		if _, err := l.LinkEndpoint.WritePackets(pass); err != nil {
			return 0, err
		}
	}
	return pkts.Len(), nil
}

// shortWriter keeps a random part of what it is given, at times all.
type shortWriter struct {
	rng *rand.Rand
	got *[]byte
}

func (w *shortWriter) Write(p []byte) (int, error) {
	n := len(p)
	if w.rng.Intn(2) == 0 {
		n = w.rng.Intn(len(p) + 1)
	}
	*w.got = append(*w.got, p[:n]...)
	return n, nil
}

type heldSeg struct {
	flags   header.TCPFlags
	seq     seqnum.Value
	payload []byte
}

// heldSegment is the TCP segment a packet carries, copied out of it.
func heldSegment(pkt *stack.PacketBuffer) heldSeg {
	v := pkt.ToView()
	defer v.Release()
	b := v.AsSlice()
	ip := header.IPv4(b)
	b = b[ip.HeaderLength():ip.TotalLength()]
	h := header.TCP(b)
	return heldSeg{flags: h.Flags(), seq: seqnum.Value(h.SequenceNumber()), payload: append([]byte(nil), b[h.DataOffset():]...)}
}

// TestSharedSendBuffer checks the send buffer's bytes that packets carry
// by reference. A link holds every packet the connection sends, to the
// end, while the connection goes on: the peer acknowledges, the send
// buffer drops what it acknowledged, gives its blocks back and takes new
// data. Every byte of every packet held must still be the stream's byte
// at its sequence number, and so must the bytes of retransmissions of
// packets the link dropped, sent after the data around them was
// acknowledged and more was written; the peer, whose receive buffer
// keeps large payloads in the packets' memory, reads the stream whole.
func TestSharedSendBuffer(t *testing.T) {
	for _, gso := range []bool{true, false} {
		t.Run(map[bool]string{true: "gso", false: "nogso"}[gso], func(t *testing.T) {
			la, lb := netstack.NewLinkPair(netstack.LinkConfig{MTU: 1500, NoGSO: !gso})
			hl := &holdLink{LinkEndpoint: la, drop: map[int]bool{3: true, 40: true, 41: true, 200: true}}
			p := rtcp.NewProtocol(rtcp.Config{MinRTO: 20 * time.Millisecond, SndBuf: 256 << 10})
			pb := rtcp.NewProtocol(rtcp.Config{MinRTO: 20 * time.Millisecond})
			a := stack.New(stack.Options{
				NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol},
				TransportProtocols: []stack.TransportProtocolFactory{p.Factory()},
			})
			b := stack.New(stack.Options{
				NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol},
				TransportProtocols: []stack.TransportProtocolFactory{pb.Factory()},
			})
			for _, x := range []struct {
				s    *stack.Stack
				l    stack.LinkEndpoint
				addr tcpip.Address
			}{{a, hl, addrA}, {b, lb, addrB}} {
				if err := x.s.CreateNIC(1, x.l); err != nil {
					t.Fatal(err)
				}
				pa := tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber, AddressWithPrefix: x.addr.WithPrefix()}
				pa.AddressWithPrefix.PrefixLen = 24
				if err := x.s.AddProtocolAddress(1, pa, stack.AddressProperties{}); err != nil {
					t.Fatal(err)
				}
				x.s.SetRouteTable([]tcpip.Route{{Destination: pa.AddressWithPrefix.Subnet(), NIC: 1}})
			}
			defer func() {
				hl.mu.Lock()
				for _, pkt := range hl.held {
					pkt.DecRef()
				}
				hl.held = nil
				hl.mu.Unlock()
				a.Close()
				b.Close()
				a.Wait()
				b.Wait()
			}()
			l, err := pb.Listen(80, 1)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, err := p.Dial(ctx, 1, tcpip.FullAddress{}, tcpip.FullAddress{Addr: addrB, Port: 80}, ipv4.ProtocolNumber)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Abort()
			s, err := l.Accept(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Abort()

			rng := rand.New(rand.NewSource(1))
			src := make([]byte, 6<<20)
			rng.Read(src)
			done := make(chan []byte)
			go func() {
				// The peer reads with copies (Read) and in place
				// (TryReadTo), taking what a writer takes of each
				// view.
				rr := rand.New(rand.NewSource(3))
				var got []byte
				w := &shortWriter{rng: rr, got: &got}
				for {
					var n int
					var err error
					if rr.Intn(2) == 0 {
						n, err = s.TryReadTo(w, rr.Intn(200<<10))
						if n == 0 && err == nil {
							select {
							case <-s.ReadWake():
							case <-time.After(10 * time.Millisecond):
							}
						}
					} else {
						b := make([]byte, 1+rr.Intn(100<<10))
						n, err = s.Read(b)
						got = append(got, b[:n]...)
					}
					if err != nil {
						break
					}
				}
				done <- got
			}()
			// Writes of every size, so blocks fill in pieces and
			// segments span blocks.
			for off := 0; off < len(src); {
				n := min(1+rng.Intn(100<<10), len(src)-off)
				if _, err := c.Write(src[off : off+n]); err != nil {
					t.Fatal(err)
				}
				off += n
			}
			c.CloseWrite()
			got := <-done
			if len(got) != len(src) || string(got) != string(src) {
				t.Fatalf("the peer read %d bytes, not the %d written, or other bytes", len(got), len(src))
			}

			hl.mu.Lock()
			defer hl.mu.Unlock()
			var iss seqnum.Value
			checked, seen := 0, map[seqnum.Value]int{}
			for _, pkt := range hl.held {
				h := heldSegment(pkt)
				if h.flags&header.TCPFlagSyn != 0 {
					iss = h.seq
					continue
				}
				if len(h.payload) == 0 {
					continue
				}
				off := int(iss.Add(1).Size(h.seq))
				if off+len(h.payload) > len(src) {
					t.Fatalf("a segment at %d of %d bytes lies beyond the stream", off, len(h.payload))
				}
				for i, x := range h.payload {
					if x != src[off+i] {
						t.Fatalf("a held segment at stream offset %d (%d bytes) has byte %d wrong: %#x, not %#x", off, len(h.payload), i, x, src[off+i])
					}
				}
				checked += len(h.payload)
				seen[h.seq]++
			}
			resent := 0
			for _, n := range seen {
				if n > 1 {
					resent++
				}
			}
			if checked < len(src) || resent == 0 {
				t.Fatalf("the link held %d bytes of data for a stream of %d, %d segments sent again", checked, len(src), resent)
			}
			t.Logf("%d packets held, %d bytes checked, %d segments sent again", len(hl.held), checked, resent)
		})
	}
}
