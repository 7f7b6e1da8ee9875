// Package endpoint assembles a standalone RDMA endpoint on a TAP device:
// the TAP (tap), an optional pcap capture of the frames on the wire, an
// optional impairment of the transmit side, the TCP/IP stack (netstack) and
// the RDMA device (verbs) on top. It is what `rdmatap up` and the network
// tools run on, as one call for a program that embeds an endpoint:
//
//	ep, err := endpoint.Open(endpoint.Config{TAP: "rt0", Addr: netip.MustParsePrefix("10.77.0.3/24")})
//	if err != nil { ... }
//	defer ep.Close()
//	pd, err := ep.Device().AllocPD()
//
// Creating or attaching a TAP needs CAP_NET_ADMIN.
package endpoint

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/tap"
	"github.com/rdmatap/rdmatap/verbs"
)

// Config is an endpoint's configuration. TAP and Addr are required; the
// zero value of every other field is a working default.
type Config struct {
	// TAP is the TAP device's name (at most 15 bytes): created when it does
	// not exist (and deleted again by Close), attached to when it does.
	TAP string
	// Addr is the endpoint's IP address with its subnet's prefix length,
	// e.g. 10.77.0.3/24.
	Addr netip.Prefix
	// Gateway is the default gateway; none when not valid.
	Gateway netip.Addr
	// MTU is the link's IP MTU, 576 to 65521; 0: 1500.
	MTU int
	// MAC is the endpoint's MAC address; nil: StableMAC(TAP, Addr).
	MAC net.HardwareAddr
	// NoOffload opens a plain TAP: no virtio-net header, no TSO or
	// checksum offload.
	NoOffload bool
	// BusyPoll keeps the TAP's read loop reading for this long after each
	// frame before it sleeps (tap.Config.BusyPoll): 0 to tap.MaxBusyPoll,
	// offload TAPs only.
	BusyPoll time.Duration
	// Capture, when set, receives a pcap stream of the endpoint's frames
	// as they are on the wire (netstack.NewCapture; outside the
	// impairment, so dropped frames are not in it). The endpoint writes to
	// it until Close returns; flushing and closing it are the caller's.
	Capture io.Writer
	// Impair, when set, impairs what the endpoint sends: loss, reordering,
	// duplication (netstack.NewImpair); rates from 0 to 1.
	Impair *netstack.ImpairConfig
	// Stack tunes the TCP/IP stack: every field of netstack.Config but
	// Link, Addrs and Gateway, which Open sets from the TAP, Addr and
	// Gateway (and refuses when set here).
	Stack netstack.Config
	// Device configures the RDMA device (verbs.Open).
	Device verbs.DeviceConfig
}

// ErrConfig matches (errors.Is) every *ConfigError.
var ErrConfig = errors.New("endpoint: invalid configuration")

// ConfigError is a Config field Open refuses, before it touches the
// system.
type ConfigError struct {
	Field  string // the Config field, e.g. "MTU"
	Value  any    // its value
	Reason string // what is wanted
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("endpoint: Config.%s %v: %s", e.Field, e.Value, e.Reason)
}

// Is makes a *ConfigError match ErrConfig.
func (e *ConfigError) Is(target error) bool { return target == ErrConfig }

// TAPError is a failure to create or attach the TAP device. It unwraps
// to the cause: errors.Is(err, os.ErrPermission) without CAP_NET_ADMIN.
type TAPError struct {
	Name string
	Err  error
}

func (e *TAPError) Error() string {
	if errors.Is(e.Err, os.ErrPermission) {
		return fmt.Sprintf("endpoint: TAP %q: permission denied: creating or attaching a TAP needs root (CAP_NET_ADMIN)", e.Name)
	}
	return fmt.Sprintf("endpoint: TAP %q: %v", e.Name, e.Err)
}

func (e *TAPError) Unwrap() error { return e.Err }

// Check validates cfg without touching the system: nil, or a
// *ConfigError.
func (cfg *Config) Check() error {
	bad := func(field string, v any, reason string) error {
		return &ConfigError{Field: field, Value: v, Reason: reason}
	}
	switch {
	case cfg.TAP == "":
		return bad("TAP", `""`, "required")
	case len(cfg.TAP) > 15:
		return bad("TAP", fmt.Sprintf("%q", cfg.TAP), "interface names have at most 15 bytes")
	case !cfg.Addr.IsValid():
		return bad("Addr", cfg.Addr, "required: an address with prefix length, e.g. 10.77.0.3/24")
	case cfg.Gateway.IsValid() && cfg.Gateway.Is4() != cfg.Addr.Addr().Is4():
		return bad("Gateway", cfg.Gateway, "not of Addr's family")
	case cfg.MTU != 0 && (cfg.MTU < 576 || cfg.MTU > 65521):
		return bad("MTU", cfg.MTU, "want 576..65521 (0: 1500)")
	case cfg.MAC != nil && len(cfg.MAC) != 6:
		return bad("MAC", cfg.MAC, "want 6 bytes")
	case cfg.BusyPoll < 0 || cfg.BusyPoll > tap.MaxBusyPoll:
		return bad("BusyPoll", cfg.BusyPoll, fmt.Sprintf("want 0..%v", tap.MaxBusyPoll))
	case cfg.BusyPoll > 0 && cfg.NoOffload:
		return bad("BusyPoll", cfg.BusyPoll, "needs the offload TAP (not NoOffload)")
	case cfg.Stack.Link != nil || cfg.Stack.Addrs != nil || cfg.Stack.Gateway.IsValid():
		return bad("Stack", "with Link, Addrs or Gateway", "Open sets them: leave them zero")
	}
	if im := cfg.Impair; im != nil {
		for _, r := range []struct {
			name string
			v    float64
		}{{"LossRate", im.LossRate}, {"ReorderRate", im.ReorderRate}, {"DupRate", im.DupRate}} {
			if math.IsNaN(r.v) || r.v < 0 || r.v > 1 {
				return bad("Impair."+r.name, r.v, "want a probability from 0 to 1")
			}
		}
	}
	return nil
}

// Endpoint is a running endpoint: a TAP device, the stack on it and the
// RDMA device on the stack.
type Endpoint struct {
	tap    *tap.Device
	stack  *netstack.Stack
	dev    *verbs.Device
	addr   netip.Prefix
	impair *netstack.Impair
}

// Open brings an endpoint up: it checks cfg (a *ConfigError when it is
// wrong), creates or attaches the TAP (a *TAPError when that fails), and
// starts the stack and the device on it. On an error nothing is left
// behind.
func Open(cfg Config) (*Endpoint, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	mac := cfg.MAC
	if mac == nil {
		mac = StableMAC(cfg.TAP, cfg.Addr.Addr())
	}
	td, err := tap.Open(tap.Config{Name: cfg.TAP, MTU: cfg.MTU, NoOffload: cfg.NoOffload, MAC: mac, BusyPoll: cfg.BusyPoll})
	if err != nil {
		return nil, &TAPError{Name: cfg.TAP, Err: err}
	}
	e := &Endpoint{tap: td, addr: cfg.Addr}
	var link stack.LinkEndpoint = td.LinkEndpoint()
	if cfg.Capture != nil {
		link = netstack.NewCapture(link, cfg.Capture)
	}
	// Outside the capture, so that the capture shows what is on the wire.
	if cfg.Impair != nil {
		link = netstack.NewImpair(link, *cfg.Impair)
		e.impair, _ = link.(*netstack.Impair)
	}
	sc := cfg.Stack
	sc.Link, sc.Addrs, sc.Gateway = link, []netip.Prefix{cfg.Addr}, cfg.Gateway
	if e.stack, err = netstack.New(sc); err != nil {
		e.Close()
		return nil, err
	}
	if e.dev, err = verbs.Open(e.stack, cfg.Device); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// Device is the endpoint's RDMA device.
func (e *Endpoint) Device() *verbs.Device { return e.dev }

// Stack is the endpoint's TCP/IP stack.
func (e *Endpoint) Stack() *netstack.Stack { return e.stack }

// TAP is the endpoint's TAP device.
func (e *Endpoint) TAP() *tap.Device { return e.tap }

// Addr is the endpoint's address with its prefix length.
func (e *Endpoint) Addr() netip.Prefix { return e.addr }

// Stats are an endpoint's counters.
type Stats struct {
	Verbs  verbs.Stats           // the RDMA device's
	Link   tap.Stats             // the TAP's frames
	Impair *netstack.ImpairStats // the impairment's; nil without one
}

// Stats returns the endpoint's counters.
func (e *Endpoint) Stats() Stats {
	s := Stats{Verbs: e.dev.Stats(), Link: e.tap.Stats()}
	if e.impair != nil {
		is := e.impair.Stats()
		s.Impair = &is
	}
	return s
}

// Close takes the endpoint down: the device and its connections, the
// stack, then the TAP (deleted when Open created it). Once it returns,
// nothing more is written to Config.Capture.
func (e *Endpoint) Close() error {
	var errs []error
	if e.dev != nil {
		errs = append(errs, e.dev.Close())
	}
	if e.stack != nil {
		e.stack.Close()
	}
	errs = append(errs, e.tap.Close())
	return errors.Join(errs...)
}

// StableMAC derives an endpoint's MAC from its TAP name and address: a
// locally administered unicast address that stays the same when the
// endpoint restarts, as a NIC's does. With a fresh MAC per process, peers
// keep sending to the previous one from their ARP caches.
func StableMAC(tapName string, addr netip.Addr) net.HardwareAddr {
	h := fnv.New64a()
	h.Write([]byte(tapName))
	h.Write(addr.AsSlice())
	v := h.Sum64()
	return net.HardwareAddr{byte(v>>40)&0xfc | 0x02, byte(v >> 32), byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}
}
