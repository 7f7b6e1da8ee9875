// Package iwarp implements the iWARP protocol suite over a TCP stream:
// MPA (RFC 5044) with enhanced connection setup (RFC 6581), DDP (RFC 5041),
// RDMAP (RFC 5040) and the RFC 7306 extensions.
//
// Wire formats are typed byte views in the style of gVisor's header package
// (type X []byte with accessors and an Encode method; parsing never
// allocates). The protocol engines beside them negotiate MPA, frame and
// unframe FPDUs, place DDP segments into registered memory, run the RDMAP
// operations and the QP state machine, and raise Terminates.
package iwarp
