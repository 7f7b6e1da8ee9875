package cli

import (
	"errors"
	"flag"
	"io"
	"net/netip"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/verbs"
)

func parseEndpointFlags(t *testing.T, args ...string) (*EndpointFlags, error) {
	t.Helper()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var f EndpointFlags
	f.Register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	_, _, _, err := f.Check()
	return &f, err
}

// TestEndpointFlagsMakeConfig: every endpoint flag lands in the
// endpoint.Config the network commands open, which endpoint accepts.
func TestEndpointFlagsMakeConfig(t *testing.T) {
	f, err := parseEndpointFlags(t, "--tap", "rtflags0", "--addr", "10.77.0.3/24", "--gw", "10.77.0.1", "--mtu", "9000",
		"--crc", "--markers", "--mpa-strict", "--p2p", "read", "--no-link-repair", "--congestion-control", "reno", "--min-rto", "20ms",
		"--name", "rt9", "--ack-delay", "0", "--busy-poll", "100us", "--placement", "segment", "--loss", "0.01", "--seed", "5")
	if err != nil {
		t.Fatal(err)
	}
	pfx, gw, rtr, _ := f.Check()
	c := f.Config(pfx, gw, rtr)
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
	if c.TAP != "rtflags0" || c.Addr != netip.MustParsePrefix("10.77.0.3/24") || c.Gateway != netip.MustParseAddr("10.77.0.1") ||
		c.MTU != 9000 || c.NoOffload || c.BusyPoll != 100*time.Microsecond {
		t.Errorf("link %+v", c)
	}
	if c.Impair == nil || c.Impair.LossRate != 0.01 || c.Impair.Seed != 5 || c.Impair.DupRate != 0 {
		t.Errorf("impairment %+v", c.Impair)
	}
	if s := c.Stack; s.CongestionControl != "reno" || s.MinRTO != 20*time.Millisecond || !s.NoLinkRepair || s.AckDelay >= 0 {
		t.Errorf("stack %+v", s)
	}
	if d := c.Device; d.Name != "rt9" || !d.CRC || !d.Markers || !d.MPAStrict || d.MPARevision != 2 || !d.PeerToPeer || d.RTR != verbs.RTRRead || d.Placement != verbs.PlacementSegment {
		t.Errorf("device %+v", d)
	}

	f, err = parseEndpointFlags(t, "--tap", "rtflags0", "--addr", "10.77.0.3/24")
	if err != nil {
		t.Fatal(err)
	}
	pfx, gw, rtr, _ = f.Check()
	if c := f.Config(pfx, gw, rtr); c.Impair != nil || c.Gateway.IsValid() || c.Stack.CongestionControl != "auto" || c.Device.PeerToPeer || c.Device.MPAStrict {
		t.Errorf("defaults %+v", c)
	}
}

// TestEndpointFlagsErrors: bad endpoint flags are ErrUsage errors found
// before anything is opened.
func TestEndpointFlagsErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--addr", "10.77.0.3/24"},
		{"--tap", "rtflags0"},
		{"--tap", "a-name-of-16-byt", "--addr", "10.77.0.3/24"},
		{"--tap", "rtflags0", "--addr", "10.77.0.3"},
		{"--tap", "rtflags0", "--addr", "10.77.0.3/24", "--gw", "gateway"},
		{"--tap", "rtflags0", "--addr", "10.77.0.3/24", "--mtu", "100"},
		{"--tap", "rtflags0", "--addr", "10.77.0.3/24", "--ack-delay", "1s"},
		{"--tap", "rtflags0", "--addr", "10.77.0.3/24", "--busy-poll", "2s"},
		{"--tap", "rtflags0", "--addr", "10.77.0.3/24", "--busy-poll", "1ms", "--no-offload"},
		{"--tap", "rtflags0", "--addr", "10.77.0.3/24", "--mpa-rev", "3"},
		{"--tap", "rtflags0", "--addr", "10.77.0.3/24", "--p2p", "atomic"},
		{"--tap", "rtflags0", "--addr", "10.77.0.3/24", "--p2p", "send", "--mpa-rev", "1"},
		{"--tap", "rtflags0", "--addr", "10.77.0.3/24", "--dup", "2"},
		{"--via", "/x.sock", "--tap", "rtflags0"},
		{"--via", "/x.sock", "--loss", "0.1"},
		{"--via", "/x.sock", "--mpa-strict"},
	} {
		if _, err := parseEndpointFlags(t, args...); !errors.Is(err, ErrUsage) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
}
