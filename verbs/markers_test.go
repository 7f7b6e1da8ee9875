package verbs_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"rdmatap/netstack"
	"rdmatap/verbs"
)

// TestMarkersRefusedByDefault: a device without Markers refuses a request
// for MPA markers at once, as Linux siw does; the initiator gets an error
// that matches ErrRejected and ErrMarkers and says why, its QP stays IDLE,
// and the application behind the listener never sees the request.
// Connections that do not ask negotiate no markers.
func TestMarkersRefusedByDefault(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl, sv := connect(t, p, 4096, verbs.ConnParams{})
	if n := cl.conn.Negotiated(); n.MarkersTx || n.MarkersRx {
		t.Fatalf("markers negotiated by default: %+v", n)
	}
	if n := sv.conn.Negotiated(); n.MarkersTx || n.MarkersRx {
		t.Fatalf("markers negotiated by default (responder): %+v", n)
	}

	l, err := p.b.Listen(netip.AddrPort{}, verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q := newEnd(t, p.a, 64, nil, nil)
	yes := true
	raddr := netip.AddrPortFrom(p.nb.Addrs()[0].Addr(), l.Addr().Port())
	_, err = p.a.Dial(ctx, q.qp, raddr, verbs.ConnParams{Markers: &yes})
	if !errors.Is(err, verbs.ErrRejected) || !errors.Is(err, verbs.ErrMarkers) || !strings.Contains(err.Error(), "markers") {
		t.Fatalf("dial asking for markers: %v, want a rejection that names markers", err)
	}
	if q.qp.State() != verbs.QPIdle {
		t.Fatalf("QP state after rejection: %v", q.qp.State())
	}
	gctx, gcancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer gcancel()
	if r, err := l.GetRequest(gctx); err == nil {
		t.Fatalf("the listener passed a marker request on: markers %v", r.Markers())
	}
}

// TestMarkersEndToEnd: with Markers on both devices, both directions carry
// MPA markers (each end's M asks the other to insert them); Sends, RDMA
// Writes and RDMA Reads of sizes around the 512-octet marker spacing and
// across many FPDUs arrive intact, CRC on and off, over a link that cuts
// segments anywhere (64 KB GSO) and one that does not.
func TestMarkersEndToEnd(t *testing.T) {
	for _, crc := range []bool{false, true} {
		for _, mtu := range []uint32{1500, 65535} {
			t.Run(fmt.Sprintf("crc=%v,mtu=%d", crc, mtu), func(t *testing.T) {
				cfg := verbs.DeviceConfig{Markers: true, CRC: crc}
				p := newPairLink(t, netstack.LinkConfig{MTU: mtu}, cfg, cfg)
				yes := true
				cl, sv := connect(t, p, 1<<20, verbs.ConnParams{Markers: &yes})
				for _, c := range []*verbs.Conn{cl.conn, sv.conn} {
					if n := c.Negotiated(); !n.MarkersTx || !n.MarkersRx || n.CRC != crc {
						t.Fatalf("negotiated %+v", n)
					}
				}
				exercise(t, cl, sv, []int{1, 3, 4, 500, 508, 512, 513, 1020, 4096, 9000, 65536, 300000})
				if st := p.b.Stats(); st.CRCErrors != 0 || st.TerminatesSent != 0 {
					t.Fatalf("stats %+v", st)
				}
			})
		}
	}
}
