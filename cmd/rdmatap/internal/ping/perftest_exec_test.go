package ping

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/netip"
	"regexp"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/perftest"
	"github.com/rdmatap/rdmatap/verbs"
)

// TestExecPerftestGoTools: perftest's ib_write_bw and ib_write_lat (-R,
// through rdmatap exec on a service) against rdmatap bw write and lat
// write on an embedded endpoint, each program in both roles: the Go tools
// speak perftest's parameter exchange byte for byte.
func TestExecPerftestGoTools(t *testing.T) {
	port := 18620
	for _, tc := range []struct {
		prog, verb string
		test       perftest.PerfTestKind
		size       string
	}{
		{"ib_write_bw", "write", perftest.PerfBW, "65536"},
		{"ib_write_lat", "write", perftest.PerfLat, "64"},
	} {
		for _, cServer := range []bool{true, false} {
			port++
			name := tc.prog + " server"
			if !cServer {
				name = tc.prog + " client"
			}
			t.Run(name, func(t *testing.T) {
				needProgram(t, tc.prog, "perftest")
				a, b, err := cli.EmbeddedPair(verbs.DeviceConfig{})
				if err != nil {
					t.Fatal(err)
				}
				defer a.Close()
				defer b.Close()
				sockA := serveOn(t, a)
				ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
				defer cancel()
				prebuild(t, false)
				args := []string{"-n", "300", "-s", tc.size, "-p", fmt.Sprint(port)}
				row := regexp.MustCompile(`(?m)^\s*` + tc.size + `\s+300\s`)
				var goOut bytes.Buffer
				if cServer {
					// The C server on A's service, rdmatap on B.
					p := startProgram(t, execProgram(t, ctx, sockA, false, tc.prog, append([]string{"-R"}, args...)...))
					waitListen(t, b, netip.AddrPortFrom(a.Addr, uint16(port)), p)
					o, _, err := perftest.ParsePerfFlags(tc.test, append([]string{tc.verb, a.Addr.String()}, args...), io.Discard)
					if err != nil {
						t.Fatal(err)
					}
					if err := perftest.RunPerf(ctx, b.Dev, o, &goOut); err != nil {
						t.Fatalf("rdmatap %s client: %v\n%s\n%s:\n%s\n%s", tc.verb, err, goOut.String(), tc.prog, p.out.String(), p.errOut.String())
					}
					if err := p.wait(t, tc.prog+" server", 60*time.Second); err != nil {
						t.Fatal(err)
					}
					if tc.test == perftest.PerfBW && !row.MatchString(p.out.String()) {
						t.Fatalf("%s server: no result\n%s", tc.prog, p.out.String())
					}
					if !row.MatchString(goOut.String()) {
						t.Fatalf("rdmatap %s client: no result\n%s", tc.verb, goOut.String())
					}
					return
				}
				// rdmatap's server on B, the C client on A's service.
				so, _, err := perftest.ParsePerfFlags(tc.test, append([]string{tc.verb}, args...), io.Discard)
				if err != nil {
					t.Fatal(err)
				}
				listening := make(chan struct{})
				so.Listening = func(netip.AddrPort) { close(listening) }
				sdone := make(chan error, 1)
				go func() { sdone <- perftest.RunPerf(ctx, b.Dev, so, &goOut) }()
				select {
				case <-listening:
				case err := <-sdone:
					t.Fatal(err)
				}
				p := startProgram(t, execProgram(t, ctx, sockA, false, tc.prog, append(append([]string{"-R"}, args...), b.Addr.String())...))
				if err := p.wait(t, tc.prog+" client", 60*time.Second); err != nil {
					t.Fatal(err)
				}
				if err := <-sdone; err != nil {
					t.Fatalf("rdmatap %s server: %v\n%s", tc.verb, err, goOut.String())
				}
				if !row.MatchString(p.out.String()) {
					t.Fatalf("%s client: no result\n%s", tc.prog, p.out.String())
				}
				if tc.test == perftest.PerfBW && !row.MatchString(goOut.String()) {
					t.Fatalf("rdmatap %s server: no result\n%s", tc.verb, goOut.String())
				}
			})
		}
	}
}
