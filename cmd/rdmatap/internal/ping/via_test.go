package ping

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/perftest"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/service"
)

// TestViaService: ping, bw and lat run with --via against a service of an
// embedded endpoint, as clients and (ping) as the server, against an
// embedded peer.
func TestViaService(t *testing.T) {
	a, b, err := cli.EmbeddedPair(verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	sock := filepath.Join(t.TempDir(), "rt0.sock")
	var mu sync.Mutex
	clients := 0
	ln, err := service.ListenSocket(sock, -1)
	if err != nil {
		t.Fatal(err)
	}
	lim := service.Limits{QPs: 64, CQs: 64, Conns: 64, MRs: 64, FRPages: 1024, MRBytes: 1 << 30, RingBytes: 64 << 20, Memory: 512 << 20}
	srv, err := service.Serve(a.Dev, ln, service.Config{Limits: lim, PollSpin: 50 * time.Microsecond, MaxClients: 1024, MaxClientsPerUser: 64, MaxPendingPerUser: 16,
		Logf: func(format string, args ...any) {
			if strings.HasSuffix(format, "connected") {
				mu.Lock()
				clients++
				mu.Unlock()
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	check := func(t *testing.T, what string, code int, out, errOut string, want string) {
		t.Helper()
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("%s: exit %d, want %q in\n%s\n%s", what, code, want, out, errOut)
		}
	}

	t.Run("ping client", func(t *testing.T) {
		s := startServer(t, ctx, b, opts(t, "-s", "-v"))
		var out, errOut bytes.Buffer
		code := cli.Run([]string{"ping", "-c", "-a", b.Addr.String(), "-C", "5", "-v", "--via", sock}, &out, &errOut)
		check(t, "ping -c --via", code, out.String(), errOut.String(), "ping data: rdma-ping-4")
		if err := waitServer(t, s); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("ping server", func(t *testing.T) {
		o := opts(t, "-s", "-v", "-a", a.Addr.String())
		ready := make(chan struct{})
		o.listening = func(netip.AddrPort) { close(ready) }
		ep, err := (&cli.EndpointFlags{Via: sock}).Open()
		if err != nil {
			t.Fatal(err)
		}
		defer ep.Close()
		var sout, serr bytes.Buffer
		done := make(chan error, 1)
		go func() { done <- runPing(ctx, ep.Dev, o, &sout, &serr) }()
		select {
		case <-ready:
		case err := <-done:
			t.Fatalf("server through the service: %v\n%s", err, serr.String())
		}
		c, err := runClient(b, opts(t, "-c", "-a", a.Addr.String(), "-C", "5", "-v"))
		if err != nil {
			t.Fatalf("client: %v\n%s", err, c.errOut.String())
		}
		if err := <-done; err != nil {
			t.Fatalf("server through the service: %v\n%s", err, serr.String())
		}
		check(t, "ping -s --via", 0, sout.String(), serr.String(), "ping data: rdma-ping-4")
	})
	port := 18600
	for _, tc := range []struct {
		test perftest.PerfTestKind
		cmd  string
		verb string
	}{{perftest.PerfBW, "bw", "write"}, {perftest.PerfBW, "bw", "send"}, {perftest.PerfBW, "bw", "read"}, {perftest.PerfLat, "lat", "write"}, {perftest.PerfLat, "lat", "send"}} {
		port++ // a port per run: the last run's connections may linger
		t.Run(tc.cmd+" "+tc.verb, func(t *testing.T) {
			args := []string{tc.verb, "-n", "200", "-s", "4096", "-p", fmt.Sprint(port)}
			so, _, err := perftest.ParsePerfFlags(tc.test, args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			listening := make(chan struct{})
			so.Listening = func(netip.AddrPort) { close(listening) }
			so.Timeout = 10 * time.Second
			var sb bytes.Buffer
			sdone := make(chan error, 1)
			go func() { sdone <- perftest.RunPerf(ctx, b.Dev, so, &sb) }()
			select {
			case <-listening:
			case err := <-sdone:
				t.Fatal(err)
			}
			var out, errOut bytes.Buffer
			code := cli.Run(append([]string{tc.cmd}, append(args, b.Addr.String(), "--via", sock)...), &out, &errOut)
			if err := <-sdone; err != nil {
				t.Errorf("server: %v", err)
			}
			check(t, tc.cmd+" "+tc.verb+" --via", code, out.String(), errOut.String(), " 4096 ")
		})
	}
	mu.Lock()
	defer mu.Unlock()
	if clients < 7 {
		t.Errorf("the service saw %d clients, want one per run", clients)
	}
}
