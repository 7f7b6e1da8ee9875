package iwarp

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Terminate message (RFC 5040 §4.8): the payload of an untagged DDP segment
// on queue 2.
//
//	|Layer|EType| Error Code |M|D|R| Reserved (13)                 |
//	| DDP Segment Length (16, if D) | Terminated DDP Header (if D)  |
//	| Terminated RDMA Header (28, if R)                             |
//
// M says the DDP Segment Length is valid, D that the offending segment's
// DDP header follows it, R that its RDMAP header (a Read Request header)
// follows that. Linux siw lays the control word out with C bit-fields that,
// on little-endian machines, swap Layer and EType and put M/D/R at the
// bottom of the third byte; see DecodeTerminateLenient.
const (
	termCtrl    = 0
	termCode    = 1
	termHdrCt   = 2
	termSegLen  = 4
	termDDPHdr  = 6
	termFlagM   = 0x80
	termFlagD   = 0x40
	termFlagR   = 0x20
	termCtrlLen = 4

	// TerminateMaxSize is the largest Terminate payload rdmatap builds:
	// control, segment length, an untagged DDP header and a Read Request.
	TerminateMaxSize = termCtrlLen + 2 + DDPUntaggedHeaderSize + ReadRequestSize
)

// Layer is the Terminate's layer field.
type Layer uint8

// Layers (RFC 5040 §7.1).
const (
	LayerRDMAP Layer = 0
	LayerDDP   Layer = 1
	LayerLLP   Layer = 2 // MPA
)

func (l Layer) String() string {
	switch l {
	case LayerRDMAP:
		return "RDMAP"
	case LayerDDP:
		return "DDP"
	case LayerLLP:
		return "LLP"
	}
	return fmt.Sprintf("layer %d", uint8(l))
}

// Error types and codes (RFC 5040 §7, RFC 5041 §7, RFC 5044 §8, RFC 6581
// §9; the IANA "RDDP" registry).
const (
	// RDMAP error types.
	ETypeRDMAPCatastrophic = 0x0
	ETypeRemoteProtection  = 0x1
	ETypeRemoteOperation   = 0x2
	// RDMAP error codes.
	CodeInvalidSTag         = 0x00
	CodeBaseBounds          = 0x01
	CodeAccessRights        = 0x02
	CodeSTagNotAssociated   = 0x03
	CodeTOWrap              = 0x04
	CodeInvalidRDMAPVersion = 0x05
	CodeUnexpectedOpcode    = 0x06
	CodeCatastrophicStream  = 0x07
	CodeCatastrophicGlobal  = 0x08
	CodeCannotInvalidate    = 0x09
	CodeUnspecified         = 0xff

	// DDP error types.
	ETypeDDPCatastrophic = 0x0
	ETypeTaggedBuffer    = 0x1
	ETypeUntaggedBuffer  = 0x2
	// DDP tagged-buffer codes.
	CodeDDPInvalidSTag       = 0x00
	CodeDDPBaseBounds        = 0x01
	CodeDDPSTagNotAssociated = 0x02
	CodeDDPTOWrap            = 0x03
	CodeDDPTaggedVersion     = 0x04
	// DDP untagged-buffer codes.
	CodeInvalidQN          = 0x01
	CodeNoBuffer           = 0x02 // invalid MSN, no buffer available
	CodeMSNRange           = 0x03
	CodeInvalidMO          = 0x04
	CodeMessageTooLong     = 0x05
	CodeDDPUntaggedVersion = 0x06

	// LLP (MPA) error type and codes.
	ETypeMPA                = 0x0
	CodeTCPLost             = 0x01
	CodeCRC                 = 0x02
	CodeFPDUStart           = 0x03 // marker / ULPDU length mismatch
	CodeInvalidRequestReply = 0x04
	CodeLocalCatastrophic   = 0x05
	CodeInsufficientIRD     = 0x06
	CodeNoMatchingRTR       = 0x07
)

// TermCode is the (layer, error type, error code) triple of a Terminate.
type TermCode struct {
	Layer Layer
	EType uint8
	Code  uint8
}

var termNames = map[TermCode]string{
	{LayerRDMAP, ETypeRDMAPCatastrophic, CodeUnspecified}:       "local catastrophic error",
	{LayerRDMAP, ETypeRemoteProtection, CodeInvalidSTag}:        "invalid STag",
	{LayerRDMAP, ETypeRemoteProtection, CodeBaseBounds}:         "base or bounds violation",
	{LayerRDMAP, ETypeRemoteProtection, CodeAccessRights}:       "access rights violation",
	{LayerRDMAP, ETypeRemoteProtection, CodeSTagNotAssociated}:  "STag not associated with RDMAP stream",
	{LayerRDMAP, ETypeRemoteProtection, CodeTOWrap}:             "TO wrap",
	{LayerRDMAP, ETypeRemoteProtection, CodeCannotInvalidate}:   "STag cannot be invalidated",
	{LayerRDMAP, ETypeRemoteOperation, CodeInvalidRDMAPVersion}: "invalid RDMAP version",
	{LayerRDMAP, ETypeRemoteOperation, CodeUnexpectedOpcode}:    "unexpected opcode",
	{LayerRDMAP, ETypeRemoteOperation, CodeCatastrophicStream}:  "catastrophic error, localized to RDMAP stream",
	{LayerRDMAP, ETypeRemoteOperation, CodeCatastrophicGlobal}:  "catastrophic error, global",
	{LayerRDMAP, ETypeRemoteOperation, CodeCannotInvalidate}:    "STag cannot be invalidated",
	{LayerRDMAP, ETypeRemoteOperation, CodeUnspecified}:         "unspecified error",
	{LayerDDP, ETypeDDPCatastrophic, 0}:                         "DDP local catastrophic error",
	{LayerDDP, ETypeTaggedBuffer, CodeDDPInvalidSTag}:           "DDP invalid STag",
	{LayerDDP, ETypeTaggedBuffer, CodeDDPBaseBounds}:            "DDP base or bounds violation",
	{LayerDDP, ETypeTaggedBuffer, CodeDDPSTagNotAssociated}:     "DDP STag not associated with stream",
	{LayerDDP, ETypeTaggedBuffer, CodeDDPTOWrap}:                "DDP TO wrap",
	{LayerDDP, ETypeTaggedBuffer, CodeDDPTaggedVersion}:         "invalid DDP version (tagged)",
	{LayerDDP, ETypeUntaggedBuffer, CodeInvalidQN}:              "invalid QN",
	{LayerDDP, ETypeUntaggedBuffer, CodeNoBuffer}:               "invalid MSN, no buffer available",
	{LayerDDP, ETypeUntaggedBuffer, CodeMSNRange}:               "invalid MSN, MSN range not valid",
	{LayerDDP, ETypeUntaggedBuffer, CodeInvalidMO}:              "invalid MO",
	{LayerDDP, ETypeUntaggedBuffer, CodeMessageTooLong}:         "DDP message too long for available buffer",
	{LayerDDP, ETypeUntaggedBuffer, CodeDDPUntaggedVersion}:     "invalid DDP version (untagged)",
	{LayerLLP, ETypeMPA, CodeTCPLost}:                           "TCP connection closed, terminated or lost",
	{LayerLLP, ETypeMPA, CodeCRC}:                               "MPA CRC error",
	{LayerLLP, ETypeMPA, CodeFPDUStart}:                         "MPA marker and ULPDU length mismatch",
	{LayerLLP, ETypeMPA, CodeInvalidRequestReply}:               "invalid MPA request or reply frame",
	{LayerLLP, ETypeMPA, CodeLocalCatastrophic}:                 "MPA local catastrophic error",
	{LayerLLP, ETypeMPA, CodeInsufficientIRD}:                   "insufficient IRD resources",
	{LayerLLP, ETypeMPA, CodeNoMatchingRTR}:                     "no matching RTR option",
}

func (t TermCode) String() string {
	if n, ok := termNames[t]; ok {
		return fmt.Sprintf("%v/%d/%#02x (%s)", t.Layer, t.EType, t.Code, n)
	}
	return fmt.Sprintf("%v/%d/%#02x", t.Layer, t.EType, t.Code)
}

// Terminate is a view of a Terminate message payload (after the untagged
// DDP header).
type Terminate []byte

// ErrTerminateShort reports a Terminate shorter than the headers it announces.
var ErrTerminateShort = errors.New("rdmap: terminate shorter than its header")

// Code returns the layer, error type and error code in RFC layout.
func (t Terminate) Code() TermCode {
	return TermCode{Layer(t[termCtrl] >> 4), t[termCtrl] & 0x0f, t[termCode]}
}

// HasSegLen returns M: the DDP Segment Length field is valid.
func (t Terminate) HasSegLen() bool { return t[termHdrCt]&termFlagM != 0 }

// HasDDPHeader returns D: the terminated DDP header is included.
func (t Terminate) HasDDPHeader() bool { return t[termHdrCt]&termFlagD != 0 }

// HasRDMAPHeader returns R: the terminated RDMAP header is included.
func (t Terminate) HasRDMAPHeader() bool { return t[termHdrCt]&termFlagR != 0 }

// Validate checks that t holds every header its flags announce.
func (t Terminate) Validate() error {
	if len(t) < termCtrlLen {
		return ErrTerminateShort
	}
	need := termCtrlLen
	if t.HasDDPHeader() || t.HasSegLen() {
		need = termDDPHdr
		if t.HasDDPHeader() {
			if len(t) < termDDPHdr+1 {
				return ErrTerminateShort
			}
			need += DDPHeader(t[termDDPHdr:]).HeaderSize()
		}
	}
	if t.HasRDMAPHeader() {
		need += ReadRequestSize
	}
	if len(t) < need {
		return ErrTerminateShort
	}
	return nil
}

// SegmentLength returns the terminated segment's ULPDU length, if M is set.
func (t Terminate) SegmentLength() (int, bool) {
	if !t.HasSegLen() {
		return 0, false
	}
	return int(binary.BigEndian.Uint16(t[termSegLen:])), true
}

// DDPHeader returns the terminated segment's DDP header, if D is set.
func (t Terminate) DDPHeader() (DDPHeader, bool) {
	if !t.HasDDPHeader() {
		return nil, false
	}
	h := DDPHeader(t[termDDPHdr:])
	return h[:h.HeaderSize()], true
}

// RDMAPHeader returns the terminated RDMAP header, if R is set.
func (t Terminate) RDMAPHeader() (ReadRequest, bool) {
	if !t.HasRDMAPHeader() {
		return nil, false
	}
	off := termCtrlLen
	if h, ok := t.DDPHeader(); ok {
		off = termDDPHdr + len(h)
	} else if t.HasSegLen() {
		off = termDDPHdr
	}
	return ReadRequest(t[off : off+ReadRequestSize]), true
}

// TerminateFields describes a Terminate to encode.
type TerminateFields struct {
	Code TermCode
	// ULPDU is the offending segment's DDP segment (at least its headers),
	// or nil. Its DDP header is included (M and D set); for a Read Request
	// the RDMAP header is included too (R set).
	ULPDU []byte
	// SegmentLength is the offending segment's ULPDU_Length.
	SegmentLength int
}

// Encode writes the Terminate and returns its length. t must hold
// TerminateMaxSize bytes.
func (t Terminate) Encode(f *TerminateFields) int {
	t[termCtrl] = uint8(f.Code.Layer)<<4 | f.Code.EType&0x0f
	t[termCode] = f.Code.Code
	t[termHdrCt] = 0
	t[termHdrCt+1] = 0
	n := termCtrlLen
	h := DDPHeader(f.ULPDU)
	if len(h) < 2 || len(h) < h.HeaderSize() {
		return n
	}
	t[termHdrCt] |= termFlagM | termFlagD
	binary.BigEndian.PutUint16(t[termSegLen:], uint16(f.SegmentLength))
	n = termDDPHdr + copy(t[termDDPHdr:], h[:h.HeaderSize()])
	if !h.Tagged() && h.Opcode() == OpReadRequest && len(h) >= DDPUntaggedHeaderSize+ReadRequestSize {
		t[termHdrCt] |= termFlagR
		n += copy(t[n:], h[DDPUntaggedHeaderSize:DDPUntaggedHeaderSize+ReadRequestSize])
	}
	return n
}

// DecodeTerminateLenient returns the Terminate's code, accepting the
// layout Linux siw produces on little-endian hosts, where the Layer and
// EType nibbles are swapped and M/D/R sit at 0x01/0x02/0x04 of the third
// byte. It is for diagnostics: a Terminate always ends the stream, whichever
// layout it used. swapped reports the siw layout. t must hold at least the
// 4-byte control word (Validate checks that); a shorter t decodes as zero.
func DecodeTerminateLenient(t Terminate) (code TermCode, swapped bool) {
	if len(t) < termCtrlLen {
		return TermCode{}, false
	}
	code = t.Code()
	swappedCode := TermCode{Layer(t[termCtrl] & 0x0f), t[termCtrl] >> 4, t[termCode]}
	// siw's header-control bits land where the RFC has reserved zeros: a
	// sure sign of its layout.
	if t[termHdrCt]&0xe0 == 0 && t[termHdrCt]&0x07 != 0 {
		return swappedCode, true
	}
	// Without them (siw attaches no headers to MPA-layer errors), take
	// the reading that names a defined error, preferring the RFC's.
	_, rfcKnown := termNames[code]
	_, swKnown := termNames[swappedCode]
	if !rfcKnown && (swKnown || code.Layer > LayerLLP && swappedCode.Layer <= LayerLLP) {
		return swappedCode, true
	}
	return code, false
}
