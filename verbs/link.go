package verbs

import (
	"bytes"
	"context"
	"math"
	"net"
	"net/netip"

	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

// VendorID is the vendor ID the device reports (ibv_device_attr's
// vendor_id): Linux siw's, 0x626d74 ("bmt"), as rdmatap speaks siw's
// protocol byte for byte.
const VendorID = 0x626d74

// Link is the device's port as a port query reports it (ibv_port_attr,
// ibv_query_gid), with the values Linux siw reports for its netdev.
type Link struct {
	// Addr is the device's IPv4 address (the zero Addr: none).
	Addr netip.Addr
	// MAC is the link's Ethernet address; a link without one (an
	// in-memory link) reports 02:00 followed by the IPv4 address, a
	// locally administered address of its own.
	MAC net.HardwareAddr
	// MTU is the link's IP MTU in bytes.
	MTU int
	// Up is whether the link is up (PORT_ACTIVE; else PORT_DOWN).
	Up bool
}

// Port states, IB MTUs, widths and speeds in libibverbs' numbering
// (ibv_port_state, ibv_mtu, active_width, active_speed).
const (
	PortDown   = 1
	PortActive = 4
	Width1X    = 1
	SpeedSDR   = 1
)

// PortState returns the ibv_port_state of the link.
func (l Link) PortState() int {
	if l.Up {
		return PortActive
	}
	return PortDown
}

// PhysState returns the port's physical state: 5 (LinkUp) when the link
// is up, else 3 (Disabled), as siw.
func (l Link) PhysState() int {
	if l.Up {
		return 5
	}
	return 3
}

// ActiveMTU returns the link's MTU as an ibv_mtu (1: 256 to 5: 4096): the
// largest IB MTU within the link's, as siw (ib_mtu_int_to_enum).
func (l Link) ActiveMTU() int {
	switch {
	case l.MTU >= 4096:
		return 5
	case l.MTU >= 2048:
		return 4
	case l.MTU >= 1024:
		return 3
	case l.MTU >= 512:
		return 2
	}
	return 1
}

// WidthSpeed returns the port's active width and speed: 1X SDR, what
// siw reports for a netdev of 1 Gb/s or less or of no known speed (a TAP
// device), as the link has no speed of its own.
func (l Link) WidthSpeed() (width, speed int) { return Width1X, SpeedSDR }

// GID returns the port's one GID as siw makes it: the MAC in the first six
// bytes, the rest zero.
func (l Link) GID() [16]byte {
	var g [16]byte
	copy(g[:], l.MAC)
	return g
}

// NodeGUID returns the node GUID (and system image GUID) as siw makes it:
// the EUI-64 of the MAC (its universal/local bit flipped, ff:fe in the
// middle), in network order.
func (l Link) NodeGUID() [8]byte {
	var g [8]byte
	if len(l.MAC) != 6 {
		return g
	}
	m := l.MAC
	return [8]byte{m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]}
}

// Link returns the device's port: on an embedded device its netstack's
// link; on a device of a service what the service reports (QUERY_PORT;
// the zero Link from a service that does not offer it, or is gone).
func (d *Device) Link() Link {
	if cl, ok := d.ops.(*client); ok {
		return cl.queryLink()
	}
	return stackLink(d.ns)
}

// queryLink asks the service for its device's port.
func (cl *client) queryLink() Link {
	if cl.features&svc.FeatureLink == 0 {
		return Link{}
	}
	r, err := cl.do(context.Background(), svc.TQueryPort, func(b *svc.Builder) { b.Args(1) })
	if err != nil {
		return Link{}
	}
	return decodeLink(r.m)
}

// decodeLink reads QUERY_PORT's reply: an address field of the wrong
// length reads as none.
func decodeLink(m svc.Msg) Link {
	var f [svc.PortFields][]byte
	svc.Fields(m.Payload(), f[:])
	l := Link{MTU: int(min(m.Arg(svc.PortLinkMTU), math.MaxInt32)), Up: m.Arg(svc.PortState) == PortActive}
	if len(f[svc.PortFieldIPv4]) == 4 {
		l.Addr = netip.AddrFrom4([4]byte(f[svc.PortFieldIPv4]))
	}
	if len(f[svc.PortFieldMAC]) == 6 {
		l.MAC = net.HardwareAddr(bytes.Clone(f[svc.PortFieldMAC]))
	}
	return l
}

// stackLink reads the link of a device's stack.
func stackLink(ns *netstack.Stack) Link {
	var l Link
	if ns == nil {
		return l
	}
	for _, p := range ns.Addrs() {
		if a := p.Addr(); a.Is4() {
			l.Addr = a
			break
		}
	}
	if info, ok := ns.Stack().NICInfo()[ns.NIC()]; ok {
		l.MTU = int(info.MTU)
		l.Up = info.Flags.Up
		if len(info.LinkAddress) == 6 {
			l.MAC = net.HardwareAddr(info.LinkAddress)
		}
	}
	if l.MAC == nil {
		a := l.Addr.As4()
		l.MAC = net.HardwareAddr{0x02, 0x00, a[0], a[1], a[2], a[3]}
	}
	return l
}
