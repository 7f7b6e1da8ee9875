// Package svc holds the endpoint service's wire formats: the messages of
// the slow path (one per SOCK_SEQPACKET datagram on the service's unix
// socket) and the layout of the shared-memory rings of the fast path. The
// verbs package speaks both, as a client (verbs.Connect) and as the
// service (verbs.Serve).
//
// A message is a fixed header, up to MaxArgs 64-bit arguments and a
// payload of bytes (addresses, private data, error text), all little
// endian (the two ends share a machine):
//
//	 0      2      3      4          8          12         16
//	+------+------+------+----------+----------+----------+--------...
//	| Type |NArgs | rsvd |   Seq    |  Status  |PayloadLen| args, payload
//	+------+------+------+----------+----------+----------+--------...
//
// Seq pairs a reply with its request (the client numbers its requests;
// unsolicited service messages carry 0); Status is 0 in requests and
// successful replies and an error code otherwise (the payload then holds
// the error's text). Descriptors (memfds, eventfds) travel beside a
// message as SCM_RIGHTS.
//
// An empty datagram cannot be told from end of file on SOCK_SEQPACKET:
// the service takes it as the client leaving.
//
// The first message each way is Hello: it carries Magic and Version, and
// an end that finds a different version refuses with ErrVersion's text
// naming both, so mismatched builds fail at once and clearly.
package svc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Protocol identification (Hello's first two arguments).
const (
	Magic = 0x7264_6d61_7461_7000 // "rdmatap\0"
	// Version 2: fast-register MRs, memory windows and their work
	// requests, RegMRIOVA (REG_MR's IOVA argument), device statistics.
	// The version changes only for a change an older end cannot live
	// with; what is added beside it is offered as a feature (HELLO's
	// feature bits), which an end that does not know it ignores.
	Version = 2
)

// Features (HELLO's feature bits): the client's request lists those it
// knows, the service's reply those of them it offers.
const (
	// FeatureQueryDevice: QUERY_DEVICE answers with the device's
	// limits as this client may use them.
	FeatureQueryDevice uint64 = 1 << 0
	// FeatureInlineData: a send entry may carry its payload itself
	// (FlagInlineData), and the SQ entries of CREATE_QP's rings have room
	// for the QP's max inline bytes (SendEntrySizeInline).
	FeatureInlineData uint64 = 1 << 1
	// FeatureLink: the QUERY_PORT request answers with the device's port
	// (its link, addresses and GID).
	FeatureLink uint64 = 1 << 2

	// FeatureCM: what the CM adds: DIAL from a chosen local address
	// (its third field), QP_ERROR, and the reason of a DISCONNECTED
	// event (EVENT's argument 6).
	FeatureCM uint64 = 1 << 3

	// Features is every feature this implementation knows.
	Features = FeatureQueryDevice | FeatureInlineData | FeatureLink | FeatureCM
)

// Sizes and limits.
const (
	HeaderSize = 16
	MaxArgs    = 24
	// MaxMessage bounds a datagram; private data (≤ 512 B), addresses
	// and error text fit with room to spare.
	MaxMessage = 4096
	MaxFDs     = 4
)

// Header field offsets.
const (
	offType       = 0
	offNArgs      = 2
	offSeq        = 4
	offStatus     = 8
	offPayloadLen = 12
)

// Type is a message type.
type Type uint16

// Message types. Requests come from the client; the service answers each
// with a reply of the same type and Seq. Event and QPDone are unsolicited;
// Error answers a message the service could not read.
const (
	THello Type = iota + 1
	TAllocPD
	TDeallocPD
	TCreateCQ
	TDestroyCQ
	TRegMR   // PD, address, length, access, memfd offset, IOVA; the memfd → handle, STag
	TDeregMR // an MR or fast-register MR
	TCreateSRQ
	TDestroySRQ
	TSRQLimit
	TCreateQP
	TDestroyQP
	TQueryQP
	TDisconnect
	TDial
	TListen
	TCloseListener
	TGetRequest
	TAccept
	TReject
	TCancel
	TEvent     // service → client: an async event of one of the client's QPs or SRQs
	TQPDone    // service → client: a QP is in ERROR with every WR completed
	TError     // service → client: a message it could not read (Seq when the header was readable)
	TAllocMR   // PD, max pages → handle, STag (DEREG_MR frees it)
	TMapMR     // MR, mode, page size, offset, length; entries → IOVA, length (see MapPages)
	TSetIOVA   // MR, IOVA
	TAllocMW   // PD, type → handle, STag
	TDeallocMW // window
	TBindMW    // QP, window, WR ID, flags, MR's STag, address, length, access → STag (a type 1 bind)
	TQueryMem  // MR or window → STag, valid, base, length of its current (or last) registration
	TStats     // → the device's Stats, little endian, as the payload's one field
	// TQueryDevice (FeatureQueryDevice) → the device's limits for this
	// client, in QueryArg order; the device's name.
	TQueryDevice
	// TQueryPort (FeatureLink) → the port's state and link, in
	// PortArg order; its addresses and GID, in PortField order.
	TQueryPort
	// TQPError (FeatureCM): QP → — once the QP is in ERROR, its
	// connection reset and every outstanding WR flushed
	// (ibv_modify_qp to IBV_QPS_ERR). Blocking.
	TQPError
	tLast
)

var typeNames = [...]string{"", "HELLO", "ALLOC_PD", "DEALLOC_PD", "CREATE_CQ", "DESTROY_CQ", "REG_MR", "DEREG_MR",
	"CREATE_SRQ", "DESTROY_SRQ", "SRQ_LIMIT", "CREATE_QP", "DESTROY_QP", "QUERY_QP", "DISCONNECT", "DIAL", "LISTEN",
	"CLOSE_LISTENER", "GET_REQUEST", "ACCEPT", "REJECT", "CANCEL", "EVENT", "QP_DONE", "ERROR", "ALLOC_MR", "MAP_MR",
	"SET_IOVA", "ALLOC_MW", "DEALLOC_MW", "BIND_MW", "QUERY_MEM", "STATS", "QUERY_DEVICE", "QUERY_PORT", "QP_ERROR"}

func (t Type) String() string {
	if t > 0 && t < tLast {
		return typeNames[t]
	}
	return fmt.Sprintf("Type(%d)", uint16(t))
}

// Valid reports whether t is a known type.
func (t Type) Valid() bool { return t > 0 && t < tLast }

// Status codes of replies; each maps to one verbs error.
const (
	StatusOK uint32 = iota
	StatusInvalidArgument
	StatusInvalidState
	StatusBusy
	StatusClosed
	StatusQueueFull
	StatusRejected // payload: the peer's private data
	StatusLimit    // a per-client limit
	StatusPermission
	StatusCanceled
	StatusVersion
	StatusGeneral
	StatusTooManySGE
	StatusMarkers
	StatusNoMatchingRTR
	StatusTimeout
	StatusInvalidWR    // iwarp.ErrInvalidWR (a work request or memory object refused)
	StatusInvalidArgWR // both verbs.ErrInvalidArgument and iwarp.ErrInvalidWR
	StatusErrno        // a system error: argument 0 is its errno (EADDRINUSE, EADDRNOTAVAIL, ECONNREFUSED, ...)
)

// MAP_MR's modes (its second argument) and the size of one entry of its
// payload. A page list goes as runs of pages that follow one another in
// the client's memory (address, page count); an SGE list as the SGEs
// (address, length, lkey). A list longer than one message holds goes in
// several MAP_MRs, the first flagged MapFirst and the last MapLast.
const (
	MapPages     = 0
	MapSG        = 1
	MapFirst     = 1 << 8
	MapLast      = 1 << 9
	MapEntrySize = 16
	// MapEntries is the most entries one MAP_MR carries.
	MapEntries = (MaxMessage - HeaderSize - 8*MaxArgs - 2) / MapEntrySize
)

// Errors of decoding.
var (
	ErrShort    = errors.New("svc: message shorter than its header")
	ErrLength   = errors.New("svc: message length does not match its header")
	ErrTooLarge = errors.New("svc: message too large")
	ErrType     = errors.New("svc: unknown message type")
	ErrArgs     = errors.New("svc: too many arguments")
	ErrVersion  = errors.New("svc: protocol version mismatch")
	ErrReserved = errors.New("svc: reserved header byte set")
	ErrAddr     = errors.New("svc: malformed address")
)

// Msg is a view of one message.
type Msg []byte

// Type returns the message type.
func (m Msg) Type() Type { return Type(binary.LittleEndian.Uint16(m[offType:])) }

// NArgs returns the number of 64-bit arguments.
func (m Msg) NArgs() int { return int(m[offNArgs]) }

// Seq returns the request number a reply answers.
func (m Msg) Seq() uint32 { return binary.LittleEndian.Uint32(m[offSeq:]) }

// Status returns the reply status (StatusOK or an error code).
func (m Msg) Status() uint32 { return binary.LittleEndian.Uint32(m[offStatus:]) }

// PayloadLen returns the payload's length.
func (m Msg) PayloadLen() int { return int(binary.LittleEndian.Uint32(m[offPayloadLen:])) }

// Arg returns argument i, or 0 past the last one (so a short message
// reads as zeros, never out of bounds).
func (m Msg) Arg(i int) uint64 {
	if i < 0 || i >= m.NArgs() {
		return 0
	}
	return binary.LittleEndian.Uint64(m[HeaderSize+8*i:])
}

// Payload returns the payload bytes.
func (m Msg) Payload() []byte {
	off := HeaderSize + 8*m.NArgs()
	return m[off : off+m.PayloadLen()]
}

// Check validates the header against the message's length. Accessors may
// be used only on a message Check accepted.
func (m Msg) Check() error {
	if len(m) < HeaderSize {
		return ErrShort
	}
	if len(m) > MaxMessage {
		return ErrTooLarge
	}
	if !m.Type().Valid() {
		return fmt.Errorf("%w %d", ErrType, uint16(m.Type()))
	}
	if m.NArgs() > MaxArgs {
		return ErrArgs
	}
	if m[offNArgs+1] != 0 {
		return ErrReserved
	}
	if HeaderSize+8*m.NArgs()+m.PayloadLen() != len(m) {
		return ErrLength
	}
	return nil
}

// CheckSize reports a message too long for one datagram (MaxMessage): the
// other end would get it cut off.
func CheckSize(m Msg) error {
	if len(m) > MaxMessage {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrTooLarge, len(m), MaxMessage)
	}
	return nil
}

// Builder encodes a message into a reusable buffer.
type Builder struct {
	b     []byte
	nargs int
	args  [MaxArgs]uint64
	pay   []byte
}

// Reset starts a message.
func (w *Builder) Reset(t Type, seq uint32, status uint32) *Builder {
	w.b = w.b[:0]
	w.nargs = 0
	w.pay = w.pay[:0]
	w.b = binary.LittleEndian.AppendUint16(w.b, uint16(t))
	w.b = append(w.b, 0, 0)
	w.b = binary.LittleEndian.AppendUint32(w.b, seq)
	w.b = binary.LittleEndian.AppendUint32(w.b, status)
	w.b = binary.LittleEndian.AppendUint32(w.b, 0)
	return w
}

// Args appends arguments (at most MaxArgs in all; more panic, a
// programming error).
func (w *Builder) Args(a ...uint64) *Builder {
	for _, x := range a {
		w.args[w.nargs] = x
		w.nargs++
	}
	return w
}

// Bytes appends a length-prefixed field to the payload (see Fields).
func (w *Builder) Bytes(p []byte) *Builder {
	w.pay = binary.LittleEndian.AppendUint16(w.pay, uint16(len(p)))
	w.pay = append(w.pay, p...)
	return w
}

// String appends a length-prefixed string to the payload.
func (w *Builder) String(s string) *Builder {
	w.pay = binary.LittleEndian.AppendUint16(w.pay, uint16(len(s)))
	w.pay = append(w.pay, s...)
	return w
}

// Msg finishes the message; it is valid until the next Reset.
func (w *Builder) Msg() Msg {
	w.b[offNArgs] = byte(w.nargs)
	for i := 0; i < w.nargs; i++ {
		w.b = binary.LittleEndian.AppendUint64(w.b, w.args[i])
	}
	binary.LittleEndian.PutUint32(w.b[offPayloadLen:], uint32(len(w.pay)))
	w.b = append(w.b, w.pay...)
	return Msg(w.b)
}

// Fields splits a payload of length-prefixed fields (Builder.Bytes) into
// dst, up to len(dst) of them; it returns how many it found and an error
// if a field's length runs past the payload.
func Fields(p []byte, dst [][]byte) (int, error) {
	n := 0
	for len(p) > 0 && n < len(dst) {
		if len(p) < 2 {
			return n, ErrLength
		}
		l := int(binary.LittleEndian.Uint16(p))
		p = p[2:]
		if l > len(p) {
			return n, ErrLength
		}
		dst[n] = p[:l:l]
		p = p[l:]
		n++
	}
	return n, nil
}

// HELLO's reply arguments, by index.
const (
	HelloVersion  = iota // the service's protocol version
	HelloFlags           // bit 0: the device runs without extensions
	HelloID              // the session's ID
	HelloFeatures        // the features the service offers: those of the request's it knows
	HelloArgs            // the number of arguments
)

// EVENT's arguments, by index.
const (
	EventArgType      = iota // the event's type (verbs.AsyncEventType)
	EventArgQPN              // the QP's number (0 for an SRQ's event)
	EventArgSRQ              // the SRQ's handle (0 unless the event is an SRQ's)
	EventArgTermLayer        // the Terminate's layer (iwarp.Layer)
	EventArgTermType         // the Terminate's error type
	EventArgTermCode         // the Terminate's error code
	EventArgReason           // DISCONNECTED: why the connection ended (FeatureCM)
	EventArgs                // the number of arguments
)

// A DIAL or ACCEPT reply's arguments, by index: what the connection
// negotiated.
const (
	NegMPARevision = iota
	NegCRC         // 1: on
	NegIRD
	NegORD
	NegPeerToPeer // 1: on
	NegRTR        // the RTR type used
	NegMarkersTx  // 1: this end inserts markers
	NegMarkersRx  // 1: the peer inserts markers
	NegArgs       // the number of arguments
)

// A DIAL or ACCEPT reply's fields, by index.
const (
	ConnFieldLocal       = iota // the local address, IP:PORT
	ConnFieldRemote             // the remote address
	ConnFieldPrivateData        // the peer's private data
	ConnFields                  // the number of fields
)

// LISTEN's reply arguments, by index.
const (
	ListenHandle = iota // the listener's handle
	ListenPort          // the port listened on
	ListenArgs          // the number of arguments
)

// GET_REQUEST's reply arguments, by index: the connection request and
// what its initiator asked for.
const (
	ReqHandle      = iota // the connection request's handle
	ReqMPARevision        // the initiator's MPA revision
	ReqCRC                // 1: CRC asked
	ReqIRD                // IRD offered
	ReqORD                // ORD offered
	ReqPeerToPeer         // 1: peer-to-peer asked
	ReqRTR                // RTR types offered
	ReqMarkers            // 1: markers asked
	ReqArgs               // the number of arguments
)

// GET_REQUEST's reply fields, by index.
const (
	ReqFieldAddr        = iota // the initiator's address, IP:PORT
	ReqFieldPrivateData        // its private data
	ReqFields                  // the number of fields
)

// DISCONNECTED events' reasons (EVENT's argument EventArgReason, FeatureCM).
const (
	DisconnectLocal = 1 // this end closed gracefully first (DISCONNECT)
	DisconnectPeer  = 2 // the peer closed gracefully first
	DisconnectError = 3 // an error ended it: a reset, a Terminate, a failure (the text says which)
)

// ParseLocalAddr reads a local address as LISTEN and DIAL carry it: empty
// (any address, port 0), ":PORT" (any address, that port) or "IP:PORT".
func ParseLocalAddr(s string) (netip.AddrPort, error) {
	switch {
	case s == "":
		return netip.AddrPort{}, nil
	case strings.HasPrefix(s, ":"):
		port, err := strconv.ParseUint(s[1:], 10, 16)
		if err != nil {
			return netip.AddrPort{}, fmt.Errorf("port %q: %w", s[1:], ErrAddr)
		}
		return netip.AddrPortFrom(netip.Addr{}, uint16(port)), nil
	}
	a, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%q: %w", s, ErrAddr)
	}
	return a, nil
}

// FormatLocalAddr writes a local address as ParseLocalAddr reads it.
func FormatLocalAddr(a netip.AddrPort) string {
	switch {
	case a.Addr().IsValid():
		return a.String()
	case a.Port() != 0:
		return ":" + strconv.Itoa(int(a.Port()))
	}
	return ""
}

// Tri's values.
const (
	TriUnset = 0
	TriFalse = 1
	TriTrue  = 2
)

// Tri encodes an optional bool (a *bool of ConnParams): TriUnset,
// TriFalse or TriTrue.
func Tri(b *bool) uint64 {
	switch {
	case b == nil:
		return TriUnset
	case *b:
		return TriTrue
	}
	return TriFalse
}

// Untri decodes Tri; values other than TriFalse and TriTrue are unset.
func Untri(v uint64) *bool {
	switch v {
	case TriFalse:
		f := false
		return &f
	case TriTrue:
		t := true
		return &t
	}
	return nil
}

// QUERY_DEVICE's reply arguments, by index: the ibv_device_attr limits as
// this client may use them (the device's, lowered to the client's limits
// where those are lower).
const (
	QueryMaxQP = iota
	QueryMaxQPWR
	QueryMaxSGE
	QueryMaxSGERd
	QueryMaxCQ
	QueryMaxCQE
	QueryMaxMR
	QueryMaxMRSize
	QueryMaxPD
	QueryMaxQPRdAtom // IRD
	QueryMaxQPInitRd // ORD
	QueryMaxSRQ
	QueryMaxSRQWR
	QueryMaxSRQSGE
	QueryMaxInline
	QueryMaxPrivData
	QueryMaxMsgSize
	QueryAtomicCap // 0 IBV_ATOMIC_NONE, 1 IBV_ATOMIC_HCA, 2 IBV_ATOMIC_GLOB
	QueryPageSizeCap
	QueryMaxMW
	QueryMaxFRPages
	QueryVendorPartID
	QueryVendorID // siw's, 0x626d74
	QueryArgs     // the number of arguments
)

// QUERY_PORT's reply arguments, by index (ibv_port_attr's values, as
// verbs.Link gives them).
const (
	PortState       = iota // ibv_port_state: 1 DOWN, 4 ACTIVE
	PortPhysState          // 5 LinkUp, 3 Disabled
	PortLinkMTU            // the link's IP MTU in bytes
	PortActiveMTU          // ibv_mtu: 1 (256) to 5 (4096)
	PortActiveWidth        // active_width: 1 (1X)
	PortActiveSpeed        // active_speed: 1 (SDR)
	PortArgs               // the number of arguments
)

// QUERY_PORT's reply fields, by index: the device's IPv4 address (4
// bytes, or empty), MAC (6 bytes), GID (16 bytes) and node GUID (8 bytes,
// network order).
const (
	PortFieldIPv4 = iota
	PortFieldMAC
	PortFieldGID
	PortFieldGUID
	PortFields
)
