package cli

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/rdmatap/rdmatap/endpoint"
	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/tap"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/zerocopy"
)

// EndpointFlags are the flags every network command shares: they make the
// process's own endpoint on a TAP device.
type EndpointFlags struct {
	Tap       string
	Addr      string
	gw        string
	MTU       int
	crc       bool
	Markers   bool
	mpaStrict bool
	mpaRev    int
	p2p       string
	pcap      string
	NoOffload bool
	noRepair  bool
	cc        string
	tcp       string
	minRTO    time.Duration
	Name      string
	ackDelay  time.Duration
	BusyPoll  time.Duration
	Lab       LabFlags
	// Via: use the device a running `rdmatap up --socket` serves instead
	// of a TAP of this process's own (no privileges needed).
	Via string
}

func (f *EndpointFlags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.Tap, "tap", "", "TAP device to create, or attach to if it exists (required)")
	fs.StringVar(&f.Addr, "addr", "", "the endpoint's address with prefix, e.g. 10.77.0.3/24 (required)")
	fs.StringVar(&f.gw, "gw", "", "default gateway")
	fs.IntVar(&f.MTU, "mtu", 1500, "link MTU")
	fs.BoolVar(&f.crc, "crc", false, "ask for MPA CRC32c")
	fs.BoolVar(&f.Markers, "markers", false, "ask for MPA markers and accept requests for them (Linux siw rejects them)")
	fs.IntVar(&f.mpaRev, "mpa-rev", 2, "MPA revision, 1 or 2")
	fs.BoolVar(&f.mpaStrict, "mpa-strict", false, "an accepted connection sends nothing before the initiator's first FPDU (RFC 5044; Linux siw's initiator, without --p2p on its side, then never hears a server that speaks first)")
	fs.StringVar(&f.p2p, "p2p", "", "RFC 6581 peer-to-peer mode with this RTR: write, read or send")
	fs.StringVar(&f.pcap, "pcap", "", "capture the endpoint's frames to this pcap file")
	fs.BoolVar(&f.NoOffload, "no-offload", false, "plain TAP: no virtio-net header, no TSO/checksum offload")
	fs.StringVar(&f.cc, "congestion-control", "auto", "TCP congestion control: auto (each connection starts with cubic and changes to reno at its first loss), cubic or reno: docs/tcp-recovery.md")
	fs.StringVar(&f.tcp, "tcp", "", "the TCP under iWARP: gvisor (gVisor's, the default) or rdmatap (rdmatap's own: docs/tcp.md); empty: $"+netstack.TCPEnv+", else gvisor")
	fs.DurationVar(&f.minRTO, "min-rto", 0, "TCP's minimum retransmission timeout (0: gVisor's, 200ms)")
	fs.BoolVar(&f.noRepair, "no-link-repair", false, "leave lost GSO packets to TCP alone: the link does not send them again (docs/tcp-recovery.md)")
	fs.StringVar(&f.Name, "name", "rt0", "RDMA device name")
	fs.DurationVar(&f.ackDelay, "ack-delay", netstack.DefaultAckDelay, "longest a TCP ACK of less than a segment waits to ride on the next segment (0: never)")
	fs.DurationVar(&f.BusyPoll, "busy-poll", 0, "keep reading the TAP for this long after each frame before sleeping until the next (lower latency, a CPU busy while traffic flows; 0: sleep at once; lat's default: "+LatBusyPoll.String()+")")
	fs.StringVar(&f.Via, "via", "", "use the device a running `rdmatap up --socket SOCKET` serves (instead of --tap/--addr; no root needed)")
	f.Lab.Register(fs, tapLabHelp)
}

// Check validates the flags without touching the system.
func (f *EndpointFlags) Check() (netip.Prefix, netip.Addr, verbs.RTR, error) {
	var none netip.Prefix
	if f.Via != "" {
		if f.Tap != "" || f.Addr != "" || f.gw != "" || f.pcap != "" || f.BusyPoll > 0 || f.mpaStrict || f.tcp != "" || f.Lab.Impaired() {
			return none, netip.Addr{}, 0, fmt.Errorf("%w: --via uses the service's endpoint: --tap, --addr, --gw, --pcap, --busy-poll, --mpa-strict, --tcp and impairments belong to `rdmatap up`", ErrUsage)
		}
		return none, netip.Addr{}, 0, nil
	}
	if f.Tap == "" {
		return none, netip.Addr{}, 0, fmt.Errorf("%w: --tap is required", ErrUsage)
	}
	if _, err := netstack.ParseTCP(f.tcp); err != nil {
		return none, netip.Addr{}, 0, fmt.Errorf("%w: --tcp %q: want gvisor or rdmatap", ErrUsage, f.tcp)
	}
	if len(f.Tap) > 15 {
		return none, netip.Addr{}, 0, fmt.Errorf("%w: --tap %q: interface names have at most 15 characters", ErrUsage, f.Tap)
	}
	if f.Addr == "" {
		return none, netip.Addr{}, 0, fmt.Errorf("%w: --addr is required (e.g. 10.77.0.3/24)", ErrUsage)
	}
	pfx, err := netip.ParsePrefix(f.Addr)
	if err != nil {
		return none, netip.Addr{}, 0, fmt.Errorf("%w: --addr %q: want an address with prefix length, e.g. 10.77.0.3/24", ErrUsage, f.Addr)
	}
	var gw netip.Addr
	if f.gw != "" {
		if gw, err = netip.ParseAddr(f.gw); err != nil {
			return none, netip.Addr{}, 0, fmt.Errorf("%w: --gw %q is not an IP address", ErrUsage, f.gw)
		}
	}
	if f.MTU < 576 || f.MTU > 65521 {
		return none, netip.Addr{}, 0, fmt.Errorf("%w: --mtu must be 576..65521", ErrUsage)
	}
	if f.ackDelay < 0 || f.ackDelay > 100*time.Millisecond {
		return none, netip.Addr{}, 0, fmt.Errorf("%w: --ack-delay must be 0..100ms", ErrUsage)
	}
	if f.BusyPoll < 0 || f.BusyPoll > tap.MaxBusyPoll {
		return none, netip.Addr{}, 0, fmt.Errorf("%w: --busy-poll must be 0..%v", ErrUsage, tap.MaxBusyPoll)
	}
	if f.BusyPoll > 0 && f.NoOffload {
		return none, netip.Addr{}, 0, fmt.Errorf("%w: --busy-poll needs the offload TAP (not --no-offload)", ErrUsage)
	}
	if f.mpaRev != 1 && f.mpaRev != 2 {
		return none, netip.Addr{}, 0, fmt.Errorf("%w: --mpa-rev must be 1 or 2", ErrUsage)
	}
	rtr, err := parseRTR(f.p2p)
	if err != nil {
		return none, netip.Addr{}, 0, err
	}
	if rtr != 0 && f.mpaRev != 2 {
		return none, netip.Addr{}, 0, fmt.Errorf("%w: --p2p needs --mpa-rev 2", ErrUsage)
	}
	if err := f.Lab.Check(); err != nil {
		return none, netip.Addr{}, 0, err
	}
	return pfx, gw, rtr, nil
}

func parseRTR(s string) (verbs.RTR, error) {
	switch s {
	case "":
		return 0, nil
	case "write":
		return verbs.RTRWrite, nil
	case "read":
		return verbs.RTRRead, nil
	case "send":
		return verbs.RTRSend, nil
	}
	return 0, fmt.Errorf("%w: --p2p must be write, read or send", ErrUsage)
}

// Endpoint is a process's own RDMA endpoint: TAP, netstack, device.
type Endpoint struct {
	// EP is the standalone endpoint on a TAP; nil for an embedded
	// endpoint or one of a service (--via).
	EP    *endpoint.Endpoint
	Tap   *tap.Device // EP's TAP; nil without EP
	Net   *netstack.Stack
	Dev   *verbs.Device
	Addr  netip.Addr
	pcap  *os.File
	pcapW *bufio.Writer
	// Impair is the impairment of an embedded endpoint's transmit side,
	// nil without one (EP's is in EP.Stats).
	Impair *netstack.Impair
}

// Config is the library configuration the flags make (Check must have
// accepted them).
func (f *EndpointFlags) Config(pfx netip.Prefix, gw netip.Addr, rtr verbs.RTR) endpoint.Config {
	return endpoint.Config{TAP: f.Tap, Addr: pfx, Gateway: gw, MTU: f.MTU, NoOffload: f.NoOffload, BusyPoll: f.BusyPoll,
		Impair: f.Lab.ImpairConfig(),
		Stack:  netstack.Config{CongestionControl: f.cc, AckDelay: ackDelayConfig(f.ackDelay), NoLinkRepair: f.noRepair, MinRTO: f.minRTO, TCP: f.tcp},
		Device: verbs.DeviceConfig{Name: f.Name, CRC: f.crc, Markers: f.Markers, MPARevision: uint8(f.mpaRev),
			MPAStrict: f.mpaStrict, PeerToPeer: rtr != 0, RTR: rtr, Placement: f.Lab.Mode}}
}

// Open brings the endpoint up.
func (f *EndpointFlags) Open() (*Endpoint, error) {
	pfx, gw, rtr, err := f.Check()
	if err != nil {
		return nil, err
	}
	if f.Via != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d, err := verbs.Connect(ctx, f.Via)
		if err != nil {
			return nil, err
		}
		return &Endpoint{Dev: d}, nil
	}
	cfg := f.Config(pfx, gw, rtr)
	e := &Endpoint{Addr: pfx.Addr()}
	if f.pcap != "" {
		pf, err := os.Create(f.pcap)
		if err != nil {
			return nil, fmt.Errorf("--pcap: %w", err)
		}
		e.pcap, e.pcapW = pf, bufio.NewWriterSize(pf, 1<<20)
		cfg.Capture = e.pcapW
	}
	if e.EP, err = endpoint.Open(cfg); err != nil {
		e.Close()
		return nil, err
	}
	e.Tap, e.Net, e.Dev = e.EP.TAP(), e.EP.Stack(), e.EP.Device()
	return e, nil
}

// EmbeddedPair makes two endpoints in this process on an in-memory link
// (tests, demo-style runs).
func EmbeddedPair(cfg verbs.DeviceConfig) (a, b *Endpoint, err error) {
	na, nb, err := netstack.NewPair(netstack.PairConfig{})
	if err != nil {
		return nil, nil, err
	}
	da, err := verbs.Open(na, cfg)
	if err != nil {
		return nil, nil, err
	}
	db, err := verbs.Open(nb, cfg)
	if err != nil {
		return nil, nil, err
	}
	return &Endpoint{Net: na, Dev: da, Addr: na.Addrs()[0].Addr()},
		&Endpoint{Net: nb, Dev: db, Addr: nb.Addrs()[0].Addr()}, nil
}

// Close takes the endpoint down: connections, stack, then the TAP (which
// is deleted if this process created it).
func (e *Endpoint) Close() {
	if e.EP != nil {
		e.EP.Close()
	} else {
		if e.Dev != nil {
			e.Dev.Close()
		}
		if e.Net != nil {
			e.Net.Close()
		}
	}
	if e.pcapW != nil {
		e.pcapW.Flush()
		e.pcap.Close()
	}
}

// RegMem registers n bytes of fresh memory with pd: Go memory on an
// embedded device, a memfd (zerocopy.AllocShared, kept for the process's
// life) on a device of a service, which maps the client's memory rather
// than copying it.
func RegMem(pd *verbs.PD, n int, acc verbs.Access) ([]byte, *verbs.MR, error) {
	var b []byte
	if pd.Device().Netstack() != nil {
		b = make([]byte, n)
	} else {
		m, err := zerocopy.AllocShared("rdmatap", max(n, 1))
		if err != nil {
			return nil, nil, err
		}
		b = m.Bytes()[:n]
	}
	mr, err := pd.RegMR(b, acc)
	return b, mr, err
}

// LatBusyPoll is lat's --busy-poll unless given: a latency test has one
// message in flight, and a TAP read loop that sleeps between frames adds a
// wake-up to every one-way trip (perftest's lat tests busy-poll their CQs
// by default likewise). Over bridged TAPs on a 2-core machine, 2-byte lat
// write took 19.5–26 µs one way without it and 10–12 µs with it.
const LatBusyPoll = 200 * time.Microsecond

// LatPlacement is lat's --placement unless given (see perftest's latEndpoint).
const LatPlacement = "segment"

// ackDelayConfig maps --ack-delay to netstack.Config.AckDelay (0: off).
func ackDelayConfig(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
