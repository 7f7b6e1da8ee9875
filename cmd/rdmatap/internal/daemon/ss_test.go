package daemon

import (
	"context"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
	"github.com/rdmatap/rdmatap/netstack"
)

// TestSS: `rdmatap ss` lists an endpoint's TCP connections, on either
// TCP, with the state, addresses and counters of each; `-j` the same as
// JSON. The byte counters (rdmatap's TCP) are the bytes each side moved.
func TestSS(t *testing.T) {
	for _, tcp := range []string{netstack.TCPGVisor, netstack.TCPRdmatap} {
		t.Run(tcp, func(t *testing.T) {
			na, nb, err := netstack.NewPair(netstack.PairConfig{Stack: netstack.Config{TCP: tcp}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { na.Close(); nb.Close() })
			baddr := netip.AddrPortFrom(nb.Addrs()[0].Addr(), 4791)
			ln, err := nb.Listen(baddr, 4)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			ca, err := na.Dial(ctx, baddr)
			if err != nil {
				t.Fatal(err)
			}
			defer ca.Close()
			cb, err := ln.Accept(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer cb.Close()
			const n = 300 << 10
			go ca.Write(ctx, make([]byte, n))
			if err := cb.ReadFull(ctx, make([]byte, n)); err != nil {
				t.Fatal(err)
			}
			// The last ACK reaches A after B has read.
			deadline := time.Now().Add(5 * time.Second)
			for ca.TCP().SendQ > 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}

			ss := func(ep *cli.Endpoint, args ...string) string {
				t.Helper()
				return ctlCommand(t, ep, ssCmd, args...)
			}
			for _, side := range []struct {
				name        string
				net         *netstack.Stack
				local, peer netip.AddrPort
				sent, rcvd  uint64
			}{
				{"A", na, ca.LocalAddr(), baddr, n, 0},
				{"B", nb, baddr, ca.LocalAddr(), 0, n},
			} {
				ep := &cli.Endpoint{Net: side.net}
				text := ss(ep)
				t.Logf("%s:\n%s", side.name, text)
				lines := strings.Split(strings.TrimSpace(text), "\n")
				if len(lines) != 3 || !strings.HasPrefix(lines[0], "State") {
					t.Fatalf("side %s: want a header and 2 lines of one connection:\n%s", side.name, text)
				}
				if f := strings.Fields(lines[1]); len(f) != 5 || f[0] != "ESTAB" || f[3] != side.local.String() || f[4] != side.peer.String() {
					t.Errorf("side %s: connection line %q, want ESTAB %v %v", side.name, lines[1], side.local, side.peer)
				}
				info := " " + strings.TrimSpace(lines[2]) + " "
				for _, w := range []string{" tcp:" + tcp + " ", " rto:", " rtt:", " cwnd:", " ca_state:open "} {
					if !strings.Contains(info, w) {
						t.Errorf("side %s: no %q in %q", side.name, w, info)
					}
				}
				var conns []ssConn
				if err := json.Unmarshal([]byte(ss(ep, "-j")), &conns); err != nil {
					t.Fatal(err)
				}
				if len(conns) != 1 {
					t.Fatalf("side %s: %d connections in JSON, want 1", side.name, len(conns))
				}
				c := conns[0]
				if c.State != "ESTAB" || c.Local != side.local.String() || c.Peer != side.peer.String() || c.TCP != tcp || c.SegsOut == 0 || c.SegsIn == 0 || c.RTOUs <= 0 || c.Cwnd == 0 {
					t.Errorf("side %s: %+v", side.name, c)
				}
				if tcp == netstack.TCPRdmatap {
					if c.BytesAcked == nil || *c.BytesAcked != side.sent || c.BytesRecv == nil || *c.BytesRecv != side.rcvd {
						t.Errorf("side %s: bytes_acked %v bytes_received %v, want %d and %d", side.name, c.BytesAcked, c.BytesRecv, side.sent, side.rcvd)
					}
					if c.Timestamps == nil || !*c.Timestamps || c.SACK == nil || !*c.SACK || c.SndWScale == nil || c.MSS == 0 {
						t.Errorf("side %s: options: %+v", side.name, c)
					}
					for _, w := range []string{" ts sack ", " wscale:", " bytes_acked:", " snd_wnd:"} {
						if !strings.Contains(" "+info, w) {
							t.Errorf("side %s: no %q in %q", side.name, w, info)
						}
					}
				} else if c.BytesAcked != nil {
					t.Errorf("side %s: gVisor's TCP reports no byte counters, got %v", side.name, *c.BytesAcked)
				}
			}
			// An endpoint without a stack of its own lists nothing.
			if got := ss(&cli.Endpoint{}, "-j"); strings.TrimSpace(got) != "[]" {
				t.Errorf("no stack: %q, want []", got)
			}
		})
	}
}
