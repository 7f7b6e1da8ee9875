// Package netstack builds and tunes the gVisor TCP/IP stack an rdmatap
// endpoint runs on, and gives the iWARP layer the TCP it needs: blocking,
// context-aware connections whose receive side hands the reader slices of
// the stack's own packet memory. It also provides the in-memory link pair of
// the embedded mode (64 KB super-segments with checksum offload and GSO),
// link impairment, pcap capture and the segment tap that lets DDP see TCP
// segments before TCP reassembles them.
package netstack
