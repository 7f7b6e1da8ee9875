package capi_test

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/netstack"
)

// kernelAddrs returns the IPv4 addresses of the up, non-loopback kernel
// interfaces: libfabric's verbs provider finds its devices by binding an
// rdma_cm ID to each such address (vrb_getifaddrs), so the address map
// must name one of them for the endpoint. It skips without any.
func kernelAddrs(t *testing.T) []netip.Addr {
	t.Helper()
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, i := range ifs {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 {
			continue
		}
		as, _ := i.Addrs()
		for _, a := range as {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
				out = append(out, netip.AddrFrom4([4]byte(n.IP.To4())))
			}
		}
	}
	if len(out) == 0 {
		t.Skip("skipping: no up, non-loopback IPv4 kernel interface (libfabric's verbs provider looks for its devices there)")
	}
	return out
}

// fabricServices serves the two ends of one link, as startLinkedServices,
// on a documentation range none of the kernel's addresses is in: the
// address map sends the kernel's address to the program's own endpoint,
// so an endpoint holding that address would be unreachable from its
// peer. It returns the services and the kernel address the maps name.
func fabricServices(t *testing.T) (*linkedServices, netip.Addr) {
	t.Helper()
	ks := kernelAddrs(t)
	for _, r := range []string{"192.0.2", "198.51.100", "203.0.113"} {
		pfx := netip.MustParsePrefix(r + ".0/24")
		if slices.ContainsFunc(ks, pfx.Contains) {
			continue
		}
		return startLinkedServicesPair(t, nil, netstack.PairConfig{
			AddrA: netip.MustParsePrefix(r + ".1/24"), AddrB: netip.MustParsePrefix(r + ".2/24")}), ks[0]
	}
	t.Skipf("skipping: the kernel holds addresses in each of the documentation ranges (%v)", ks)
	return nil, netip.Addr{}
}

// fabricSide is one end of a pair of programs: its service's socket and
// its endpoint's address.
type fabricSide struct {
	sock string
	addr netip.Addr
}

// sides returns A and B, server first, or B and A with swap.
func (l *linkedServices) sides(swap bool) (srv, cl fabricSide) {
	a, b := fabricSide{l.sockA, l.addrA}, fabricSide{l.sockB, l.addrB}
	if swap {
		return b, a
	}
	return a, b
}

// fabricMap is the address map of a program on side me whose peer is on
// srv: the kernel's address is its own endpoint's (where the verbs
// provider looks for its device), and 127.0.0.1, where the programs
// exchange addresses over kernel TCP, the server's.
func fabricMap(k netip.Addr, me, srv fabricSide) string {
	return fmt.Sprintf("RDMATAP_ADDR_MAP=%s=%s,127.0.0.1=%s", k, me.addr, srv.addr)
}

// runFabricPair runs fi_pingpong's server on srv and its client on cl.
// fi_pingpong exchanges addresses over a kernel TCP connection to
// 127.0.0.1; each end's address map (fabricMap) sends the kernel
// addresses to the endpoints.
func runFabricPair(t *testing.T, dir string, k netip.Addr, srv, cl fabricSide, env []string, args ...string) (string, error) {
	s := command(t, dir, srv.sock, "fi_pingpong", args...)
	s.Env = append(append(s.Env, env...), fabricMap(k, srv, srv))
	var srvOut bytes.Buffer
	s.Stdout, s.Stderr = &srvOut, &srvOut
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Wait() }()
	time.Sleep(2 * time.Second) // fi_pingpong's client does not retry its control connection
	c := command(t, dir, cl.sock, "fi_pingpong", append(append([]string{}, args...), "127.0.0.1")...)
	c.Env = append(append(c.Env, env...), fabricMap(k, cl, srv))
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	c.Start()
	cdone := make(chan error, 1)
	go func() { cdone <- c.Wait() }()
	cerr := waitExit(c, cdone, 2*time.Minute, "fi_pingpong's client")
	serr := waitExit(s, done, 30*time.Second, "fi_pingpong's server")
	if cerr != nil || serr != nil {
		return out.String(), fmt.Errorf("client %v, server %v\nclient:\n%s\nserver:\n%s", cerr, serr, out.String(), srvOut.String())
	}
	return out.String() + srvOut.String(), nil
}

// checkPingpong checks fi_pingpong's result rows of both ends (every size
// of its default sweep, each message acknowledged) and logs them.
func checkPingpong(t *testing.T, out string) {
	t.Helper()
	if strings.Contains(out, "Error at iteration") {
		t.Fatalf("fi_pingpong found a message's bytes wrong:\n%s", out)
	}
	rows := pingpongRow.FindAllStringSubmatch(out, -1)
	if len(rows) != 12 {
		t.Fatalf("want 6 result rows per end, got %d:\n%s", len(rows), out)
	}
	for _, r := range rows {
		if r[2] != r[3] {
			t.Errorf("%s bytes: %s sent, %s acknowledged", r[1], r[2], r[3])
		}
		t.Logf("%-4s %s MB/s, %s µs/xfer", r[1], r[4], r[5])
	}
}

var pingpongRow = regexp.MustCompile(`(?m)^(\S+)\s+(\d+)\s+=(\d+)\s+\S+\s+\S+\s+(\S+)\s+(\S+)`)

// TestFabric runs libfabric's fi_info and fi_pingpong (Debian's
// libfabric-bin) on the libraries, unprivileged: the verbs provider finds
// each service's device, and fi_pingpong -c (every message's bytes
// checked) runs between two services of one link, over verbs' msg
// endpoints and over ofi_rxm's rdm endpoints on them (with messages and
// with tagged messages), each with its server on A and on B.
func TestFabric(t *testing.T) {
	installed(t, "fi_pingpong", "libfabric-bin")
	dir := libs(t, false)
	l, k := fabricServices(t)
	t.Run("fi_info", func(t *testing.T) {
		for i, s := range []fabricSide{{l.sockA, l.addrA}, {l.sockB, l.addrB}} {
			c := command(t, dir, s.sock, "fi_info", "-p", "verbs", "-t", "FI_EP_MSG")
			c.Env = append(c.Env, fabricMap(k, s, s))
			out, err := c.CombinedOutput()
			if err != nil || !bytes.Contains(out, []byte(fmt.Sprintf("domain: rt%d", i))) || !bytes.Contains(out, []byte("FI_EP_MSG")) {
				t.Fatalf("fi_info on rt%d: %v\n%s", i, err, out)
			}
		}
	})
	t.Run("latency/against-ib_send_lat", func(t *testing.T) {
		// Figures, not a check: fi_pingpong's 64 B messages over verbs'
		// msg endpoints beside perftest's ib_send_lat on the same two
		// services, both averages of half a round trip.
		installed(t, "ib_send_lat", "perftest")
		var anchor float64
		for port := 7700; ; port++ {
			out, err := l.runPerfPair(t, dir, port, []string{"ib_send_lat", "-R", "-s", "64", "-n", "2000", "-p", strconv.Itoa(port)},
				[]string{"ib_send_lat", "-R", "-s", "64", "-n", "2000", "-p", strconv.Itoa(port), l.addrB.String()})
			if errors.Is(err, errRaced) && port < 7703 {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if anchor, err = perfRow(out, 64, 3); err != nil { // t_avg
				t.Fatal(err)
			}
			break
		}
		srv, cl := l.sides(false)
		out, err := runFabricPair(t, dir, k, srv, cl, nil, "-p", "verbs", "-e", "msg", "-S", "64", "-I", "2000")
		if err != nil {
			t.Fatal(err)
		}
		// Its columns: bytes, #sent, #ack, total, time, MB/sec, usec/xfer.
		row := regexp.MustCompile(`(?m)^64\s+\S+\s+=\S+\s+\S+\s+\S+\s+\S+\s+(\S+)`).FindStringSubmatch(out)
		if row == nil {
			t.Fatalf("no fi_pingpong result row:\n%s", out)
		}
		pp, _ := strconv.ParseFloat(row[1], 64)
		t.Logf("64 B: fi_pingpong %.2f µs/xfer, ib_send_lat t_avg %.2f µs, fi_pingpong/ib_send_lat %.2f×", pp, anchor, pp/anchor)
	})
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"verbs/msg", []string{"-p", "verbs", "-e", "msg"}},
		{"verbs;ofi_rxm/rdm", []string{"-p", "verbs;ofi_rxm", "-e", "rdm"}},
		{"verbs;ofi_rxm/rdm/tagged", []string{"-p", "verbs;ofi_rxm", "-e", "rdm", "-m", "tagged"}},
	} {
		for _, swap := range []bool{false, true} {
			srv, cl := l.sides(swap)
			t.Run(fmt.Sprintf("pingpong/%s/server-%s", tc.name, srv.addr), func(t *testing.T) {
				out, err := runFabricPair(t, dir, k, srv, cl, nil, append(tc.args, "-c", "-I", "200")...)
				if err != nil {
					t.Fatal(err)
				}
				checkPingpong(t, out)
			})
		}
	}
}
