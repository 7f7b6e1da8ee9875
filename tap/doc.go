// Package tap owns a Linux TAP device and provides a netstack link endpoint
// for it. The fast path uses the virtio-net header with checksum offload and
// TSO (IFF_VNET_HDR, TUNSETOFFLOAD), which water cannot set up.
package tap
