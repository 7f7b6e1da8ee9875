package endpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/tap"
)

// TestConfigErrors: every bad Config field is a *ConfigError naming the
// field, matching ErrConfig, found before the system is touched (so it
// needs no privileges).
func TestConfigErrors(t *testing.T) {
	good := Config{TAP: "rtcfg0", Addr: netip.MustParsePrefix("10.77.0.3/24")}
	for _, tc := range []struct {
		field string
		edit  func(c *Config)
	}{
		{"TAP", func(c *Config) { c.TAP = "" }},
		{"TAP", func(c *Config) { c.TAP = "a-name-of-16-byt" }},
		{"Addr", func(c *Config) { c.Addr = netip.Prefix{} }},
		{"Gateway", func(c *Config) { c.Gateway = netip.MustParseAddr("fe80::1") }},
		{"MTU", func(c *Config) { c.MTU = 575 }},
		{"MTU", func(c *Config) { c.MTU = 65522 }},
		{"MTU", func(c *Config) { c.MTU = -1 }},
		{"MAC", func(c *Config) { c.MAC = net.HardwareAddr{1, 2, 3} }},
		{"BusyPoll", func(c *Config) { c.BusyPoll = -time.Microsecond }},
		{"BusyPoll", func(c *Config) { c.BusyPoll = tap.MaxBusyPoll + 1 }},
		{"BusyPoll", func(c *Config) { c.BusyPoll = time.Microsecond; c.NoOffload = true }},
		{"Stack", func(c *Config) { c.Stack.Addrs = []netip.Prefix{c.Addr} }},
		{"Stack", func(c *Config) { c.Stack.Gateway = netip.MustParseAddr("10.77.0.1") }},
		{"Impair.LossRate", func(c *Config) { c.Impair = &netstack.ImpairConfig{LossRate: 1.5} }},
		{"Impair.ReorderRate", func(c *Config) { c.Impair = &netstack.ImpairConfig{ReorderRate: -0.1} }},
		{"Impair.DupRate", func(c *Config) { c.Impair = &netstack.ImpairConfig{DupRate: math.NaN()} }},
	} {
		c := good
		tc.edit(&c)
		ep, err := Open(c)
		var ce *ConfigError
		if ep != nil || !errors.As(err, &ce) || ce.Field != tc.field || !errors.Is(err, ErrConfig) {
			t.Errorf("%s: Open = %v, %v; want a *ConfigError for %s", tc.field, ep, err, tc.field)
			continue
		}
		if !strings.Contains(err.Error(), "Config."+tc.field) {
			t.Errorf("%s: %q does not name the field", tc.field, err)
		}
	}
	for _, c := range []Config{good, {TAP: "rtcfg0", Addr: good.Addr, MTU: 576, Gateway: netip.MustParseAddr("10.77.0.1"),
		BusyPoll: tap.MaxBusyPoll, Impair: &netstack.ImpairConfig{LossRate: 1, DupRate: 0}}} {
		if err := c.Check(); err != nil {
			t.Errorf("Check(%+v) = %v", c, err)
		}
	}
}

// TestStableMAC: the same TAP and address give the same locally
// administered unicast MAC; another address another one.
func TestStableMAC(t *testing.T) {
	a := StableMAC("rt0", netip.MustParseAddr("10.77.0.3"))
	if !bytes.Equal(a, StableMAC("rt0", netip.MustParseAddr("10.77.0.3"))) {
		t.Error("not stable")
	}
	if bytes.Equal(a, StableMAC("rt0", netip.MustParseAddr("10.77.0.4"))) {
		t.Error("the same MAC for another address")
	}
	if len(a) != 6 || a[0]&1 != 0 || a[0]&2 == 0 {
		t.Errorf("%v is not a locally administered unicast MAC", a)
	}
}

// netnsEnv runs TestOpenOnTAP's body in the child the test starts in a
// network namespace of its own.
const netnsEnv = "RDMATAP_ENDPOINT_NETNS"

// TestOpenOnTAP opens an endpoint on a TAP it creates in a namespace of
// its own, with a capture and an impairment; the kernel on the TAP's other
// side sends to a listener on the endpoint's stack over TCP; the counters,
// the capture and Close (which deletes the TAP) are checked.
func TestOpenOnTAP(t *testing.T) {
	if os.Getenv(netnsEnv) != "" {
		openOnTAP(t)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root to create a network namespace and a TAP device")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skip("skipping: /dev/net/tun is missing")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("skipping: the ip command (iproute2) is missing")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ns := fmt.Sprintf("rdep%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v\n%s", err, out)
	}
	defer exec.Command("ip", "netns", "del", ns).Run()
	cmd := exec.Command("ip", "netns", "exec", ns, exe, "-test.run", "^TestOpenOnTAP$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), netnsEnv+"="+ns)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestOpenOnTAP") {
		t.Fatalf("in namespace %s: %v\n%s", ns, err, out)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func openOnTAP(t *testing.T) {
	const name = "rdep0"
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ip("link", "set", "lo", "up")
	var capture syncBuffer
	pfx := netip.MustParsePrefix("10.89.0.2/24")
	ep, err := Open(Config{TAP: name, Addr: pfx, Capture: &capture, Impair: &netstack.ImpairConfig{Seed: 7, DupRate: 0.2}})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			ep.Close()
		}
	}()
	if !ep.TAP().Created() || ep.TAP().Name() != name || !bytes.Equal(ep.TAP().MAC(), StableMAC(name, pfx.Addr())) {
		t.Errorf("TAP %s created %v MAC %v", ep.TAP().Name(), ep.TAP().Created(), ep.TAP().MAC())
	}
	if ep.Addr() != pfx || ep.Device() == nil || ep.Device().Netstack() != ep.Stack() {
		t.Fatalf("Addr %v, device %v on stack %v", ep.Addr(), ep.Device(), ep.Stack())
	}
	ip("addr", "add", "10.89.0.1/24", "dev", name)
	ip("link", "set", name, "up")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ln, err := ep.Stack().Listen(netip.MustParseAddrPort("10.89.0.2:7000"), 1)
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("through the TAP, the capture, the impairment and the stack")
	go func() {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", "10.89.0.2:7000")
		if err != nil {
			t.Errorf("kernel dial: %v", err)
			return
		}
		defer c.Close()
		c.Write(msg)
		c.Read(make([]byte, 1)) // until the endpoint closes
	}()
	c, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if err := c.ReadFull(ctx, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("read %q, %v", got, err)
	}
	c.Close()

	s := ep.Stats()
	if s.Link.RxFrames == 0 || s.Link.TxFrames == 0 {
		t.Errorf("link counters %+v", s.Link)
	}
	if s.Impair == nil || s.Impair.Packets == 0 {
		t.Errorf("impairment counters %+v", s.Impair)
	}
	if err := ep.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	closed = true
	if _, err := net.InterfaceByName(name); err == nil {
		t.Errorf("TAP %s still there after Close", name)
	}
	capture.mu.Lock()
	b := capture.b.Bytes()
	capture.mu.Unlock()
	if len(b) < 24+16+54 || binary.LittleEndian.Uint32(b) != 0xa1b2c3d4 && binary.LittleEndian.Uint32(b) != 0xa1b23c4d {
		t.Errorf("capture of %d bytes is not a pcap of frames: % x", len(b), b[:min(len(b), 24)])
	}
	if !bytes.Contains(b, msg) {
		t.Error("the capture lacks the message")
	}
}
