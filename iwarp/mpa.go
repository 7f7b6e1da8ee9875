package iwarp

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// MPA connection setup frames (RFC 5044 §7.1, RFC 6581 §5).
//
//	 0                   1                   2                   3
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                          Key (16 bytes)                       |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|M|C|R|S| Res   |     Rev       |          PD_Length            |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|             Private Data (PD_Length bytes)                    |
//
// With enhanced connection setup (RFC 6581) the private data starts with
// the IRD/ORD word:
//
//	|A|B|        IRD (14)           |C|D|        ORD (14)           |
//
// A = peer-to-peer, B = zero-length Send RTR, C = zero-length RDMA Write
// RTR, D = zero-length RDMA Read RTR.
const (
	mpaKey       = 0
	mpaFlags     = 16
	mpaRev       = 17
	mpaPDLength  = 18
	mpaPrivData  = 20
	mpaKeyLength = 16

	// MPAHeaderSize is the size of a Request/Reply frame without private data.
	MPAHeaderSize = 20
	// MPAMaxPrivateData is the largest PD_Length RFC 5044 allows.
	MPAMaxPrivateData = 512
	// MPAv2PrefixSize is the size of the RFC 6581 IRD/ORD word.
	MPAv2PrefixSize = 4
	// MPAMaxIRDORD is the largest IRD or ORD the 14-bit fields carry.
	MPAMaxIRDORD = 0x3fff
)

// The MPA keys (RFC 5044 §7.1).
var (
	MPAKeyRequest = [mpaKeyLength]byte{'M', 'P', 'A', ' ', 'I', 'D', ' ', 'R', 'e', 'q', ' ', 'F', 'r', 'a', 'm', 'e'}
	MPAKeyReply   = [mpaKeyLength]byte{'M', 'P', 'A', ' ', 'I', 'D', ' ', 'R', 'e', 'p', ' ', 'F', 'r', 'a', 'm', 'e'}
)

// MPA Request/Reply flag bits (the byte at offset 16).
const (
	// MPAFlagMarkers is M: the sender wants markers.
	MPAFlagMarkers = 0x80
	// MPAFlagCRC is C: the sender wants CRC32c on every FPDU.
	MPAFlagCRC = 0x40
	// MPAFlagReject is R: the reply rejects the connection.
	MPAFlagReject = 0x20
	// MPAFlagEnhanced is the bit Linux siw and RNICs set with revision 2 to
	// announce enhanced connection setup (the IRD/ORD prefix is present).
	MPAFlagEnhanced = 0x10
	// MPAFlagGSOExp is siw's private, non-standard "FPDUs may exceed the
	// MSS" bit. rdmatap never sets it and ignores it on receipt.
	MPAFlagGSOExp = 0x08
	// MPAFlagEarlyFPDUQuery and MPAFlagEarlyFPDUOK are rdmatap's own
	// reserved bits, in the manner of siw's MPAFlagGSOExp. An initiator
	// sets the query in its Request: "may my first FPDU follow your Reply
	// at once?". A responder that can take FPDUs right behind its Reply
	// (rdmatap) answers with OK in the Reply; the initiator then skips
	// its first-FPDU hold (QPConfig.FirstFPDUDelay). The answer is a
	// different bit from the question because Linux siw builds its Reply
	// from the Request's header and so echoes every reserved bit it was
	// sent: a siw Reply carries the query back, never OK (siw itself sets
	// only MPAFlagGSOExp among the reserved bits), and an RFC 5044 peer
	// sends reserved bits as zero.
	MPAFlagEarlyFPDUQuery = 0x01
	MPAFlagEarlyFPDUOK    = 0x02
)

// IRD/ORD word control bits (RFC 6581 §5).
const (
	MPAv2PeerToPeer = 0x8000 // A, in the IRD half
	MPAv2SendRTR    = 0x4000 // B, in the IRD half: zero-length Send
	MPAv2WriteRTR   = 0x8000 // C, in the ORD half: zero-length RDMA Write
	MPAv2ReadRTR    = 0x4000 // D, in the ORD half: zero-length RDMA Read
	mpaIRDORDMask   = 0x3fff
)

// RTR is a set of Ready-To-Receive message types (RFC 6581 §4).
type RTR uint8

// RTR types.
const (
	RTRSend  RTR = 1 << iota // zero-length Send (FPDU)
	RTRWrite                 // zero-length RDMA Write
	RTRRead                  // zero-length RDMA Read
)

func (r RTR) String() string {
	if r == 0 {
		return "none"
	}
	s := ""
	for _, t := range []struct {
		b RTR
		n string
	}{{RTRSend, "send"}, {RTRWrite, "write"}, {RTRRead, "read"}} {
		if r&t.b != 0 {
			if s != "" {
				s += "|"
			}
			s += t.n
		}
	}
	return s
}

// Errors of MPA frame decoding.
var (
	ErrMPAShort     = errors.New("mpa: frame shorter than its header")
	ErrMPAKey       = errors.New("mpa: bad key")
	ErrMPARevision  = errors.New("mpa: unsupported revision")
	ErrMPAPDLength  = errors.New("mpa: private data length over the RFC 5044 limit")
	ErrMPAv2Prefix  = errors.New("mpa: enhanced setup without the IRD/ORD word")
	ErrMPATruncated = errors.New("mpa: private data truncated")
)

// MPAFrame is a view of an MPA Request or Reply frame.
type MPAFrame []byte

// Key returns the 16-byte key.
func (f MPAFrame) Key() []byte { return f[mpaKey : mpaKey+mpaKeyLength] }

// IsRequest reports whether the key is "MPA ID Req Frame".
func (f MPAFrame) IsRequest() bool { return string(f.Key()) == string(MPAKeyRequest[:]) }

// IsReply reports whether the key is "MPA ID Rep Frame".
func (f MPAFrame) IsReply() bool { return string(f.Key()) == string(MPAKeyReply[:]) }

// Flags returns the flag byte (M, C, R, enhanced, reserved bits).
func (f MPAFrame) Flags() uint8 { return f[mpaFlags] }

// Markers returns the M bit.
func (f MPAFrame) Markers() bool { return f[mpaFlags]&MPAFlagMarkers != 0 }

// CRC returns the C bit.
func (f MPAFrame) CRC() bool { return f[mpaFlags]&MPAFlagCRC != 0 }

// Reject returns the R bit.
func (f MPAFrame) Reject() bool { return f[mpaFlags]&MPAFlagReject != 0 }

// Enhanced reports whether the frame uses RFC 6581 enhanced setup:
// revision 2 with the enhanced flag, so the private data starts with the
// IRD/ORD word.
func (f MPAFrame) Enhanced() bool { return f.Revision() == 2 && f[mpaFlags]&MPAFlagEnhanced != 0 }

// EarlyFPDUQuery returns rdmatap's query bit (see MPAFlagEarlyFPDUQuery).
func (f MPAFrame) EarlyFPDUQuery() bool { return f[mpaFlags]&MPAFlagEarlyFPDUQuery != 0 }

// EarlyFPDUOK returns rdmatap's answer bit (see MPAFlagEarlyFPDUQuery).
func (f MPAFrame) EarlyFPDUOK() bool { return f[mpaFlags]&MPAFlagEarlyFPDUOK != 0 }

// Revision returns the Rev field.
func (f MPAFrame) Revision() uint8 { return f[mpaRev] }

// PDLength returns PD_Length.
func (f MPAFrame) PDLength() uint16 { return binary.BigEndian.Uint16(f[mpaPDLength:]) }

// PrivateData returns all private data, the IRD/ORD word included.
func (f MPAFrame) PrivateData() []byte { return f[mpaPrivData : mpaPrivData+int(f.PDLength())] }

// ULPPrivateData returns the private data meant for the application: all of
// it, or what follows the IRD/ORD word with enhanced setup.
func (f MPAFrame) ULPPrivateData() []byte {
	pd := f.PrivateData()
	if f.Enhanced() {
		return pd[MPAv2PrefixSize:]
	}
	return pd
}

// IRDORD returns the RFC 6581 IRD/ORD word; ok is false without enhanced setup.
func (f MPAFrame) IRDORD() (v MPAv2Params, ok bool) {
	if !f.Enhanced() {
		return MPAv2Params{}, false
	}
	return DecodeMPAv2Params(f.PrivateData()), true
}

// Validate checks that b holds a complete, well-formed frame (any key and
// revision 1 or 2) and returns the frame's total length.
func (f MPAFrame) Validate() (int, error) {
	if len(f) < MPAHeaderSize {
		return 0, ErrMPAShort
	}
	if !f.IsRequest() && !f.IsReply() {
		return 0, ErrMPAKey
	}
	if r := f.Revision(); r != 1 && r != 2 {
		return 0, fmt.Errorf("%w: %d", ErrMPARevision, r)
	}
	n := int(f.PDLength())
	if n > MPAMaxPrivateData {
		return 0, fmt.Errorf("%w: %d bytes", ErrMPAPDLength, n)
	}
	if f.Enhanced() && n < MPAv2PrefixSize {
		return 0, ErrMPAv2Prefix
	}
	if len(f) < MPAHeaderSize+n {
		return 0, ErrMPATruncated
	}
	return MPAHeaderSize + n, nil
}

// MPAv2Params is the decoded RFC 6581 IRD/ORD word.
type MPAv2Params struct {
	IRD, ORD   uint16 // 14-bit values
	PeerToPeer bool
	RTR        RTR // the RTR types offered (request) or chosen (reply)
}

// DecodeMPAv2Params decodes the 4-byte IRD/ORD word at the start of b.
func DecodeMPAv2Params(b []byte) MPAv2Params {
	ird := binary.BigEndian.Uint16(b[0:])
	ord := binary.BigEndian.Uint16(b[2:])
	p := MPAv2Params{IRD: ird & mpaIRDORDMask, ORD: ord & mpaIRDORDMask, PeerToPeer: ird&MPAv2PeerToPeer != 0}
	if ird&MPAv2SendRTR != 0 {
		p.RTR |= RTRSend
	}
	if ord&MPAv2WriteRTR != 0 {
		p.RTR |= RTRWrite
	}
	if ord&MPAv2ReadRTR != 0 {
		p.RTR |= RTRRead
	}
	return p
}

// Encode writes the 4-byte IRD/ORD word into b.
func (p MPAv2Params) Encode(b []byte) {
	ird := p.IRD & mpaIRDORDMask
	ord := p.ORD & mpaIRDORDMask
	if p.PeerToPeer {
		ird |= MPAv2PeerToPeer
	}
	if p.RTR&RTRSend != 0 {
		ird |= MPAv2SendRTR
	}
	if p.RTR&RTRWrite != 0 {
		ord |= MPAv2WriteRTR
	}
	if p.RTR&RTRRead != 0 {
		ord |= MPAv2ReadRTR
	}
	binary.BigEndian.PutUint16(b[0:], ird)
	binary.BigEndian.PutUint16(b[2:], ord)
}

// MPAFrameFields describes a Request or Reply frame to encode.
type MPAFrameFields struct {
	Reply    bool
	Markers  bool
	CRC      bool
	Reject   bool
	Revision uint8 // 1 or 2
	// V2 is the IRD/ORD word; when non-nil and Revision is 2, the frame
	// carries the enhanced flag and the word before PrivateData.
	V2          *MPAv2Params
	PrivateData []byte // ULP private data
	// rdmatap's reserved bits (MPAFlagEarlyFPDUQuery): the Request's
	// query, the Reply's answer.
	EarlyFPDUQuery, EarlyFPDUOK bool
}

// Len returns the encoded size of the frame.
func (m *MPAFrameFields) Len() int {
	n := MPAHeaderSize + len(m.PrivateData)
	if m.V2 != nil && m.Revision == 2 {
		n += MPAv2PrefixSize
	}
	return n
}

// Encode writes the frame into f, which must be at least m.Len() bytes. It
// returns an error if the private data exceeds the RFC 5044 limit.
func (f MPAFrame) Encode(m *MPAFrameFields) error {
	n := m.Len() - MPAHeaderSize
	if n > MPAMaxPrivateData {
		return fmt.Errorf("%w: %d bytes", ErrMPAPDLength, n)
	}
	if m.Reply {
		copy(f[mpaKey:], MPAKeyReply[:])
	} else {
		copy(f[mpaKey:], MPAKeyRequest[:])
	}
	var flags uint8
	if m.Markers {
		flags |= MPAFlagMarkers
	}
	if m.CRC {
		flags |= MPAFlagCRC
	}
	if m.Reject {
		flags |= MPAFlagReject
	}
	if m.EarlyFPDUQuery {
		flags |= MPAFlagEarlyFPDUQuery
	}
	if m.EarlyFPDUOK {
		flags |= MPAFlagEarlyFPDUOK
	}
	pd := f[mpaPrivData:]
	if m.V2 != nil && m.Revision == 2 {
		flags |= MPAFlagEnhanced
		m.V2.Encode(pd)
		pd = pd[MPAv2PrefixSize:]
	}
	f[mpaFlags] = flags
	f[mpaRev] = m.Revision
	binary.BigEndian.PutUint16(f[mpaPDLength:], uint16(n))
	copy(pd, m.PrivateData)
	return nil
}

// FPDU framing (RFC 5044 §6):
//
//	| ULPDU_Length (16) | ULPDU (DDP segment) ... | PAD (0-3) | CRC (32) |
//
// PAD brings ULPDU_Length field + ULPDU to a multiple of 4; the CRC32c
// covers everything before it and is sent least significant byte first. When CRC was not negotiated the field is
// still sent, as zero (what siw and RNICs do).
const (
	// MPALengthSize is the size of the ULPDU_Length field.
	MPALengthSize = 2
	// MPACRCSize is the size of the CRC trailer.
	MPACRCSize = 4
	// MaxULPDU is the largest ULPDU the 16-bit length field can describe.
	MaxULPDU = 0xffff
)

// FPDUPad returns the number of pad bytes after a ULPDU of n bytes.
func FPDUPad(n int) int { return (4 - (MPALengthSize+n)&3) & 3 }

// FPDULen returns the total size of an FPDU carrying a ULPDU of n bytes.
func FPDULen(n int) int { return MPALengthSize + n + FPDUPad(n) + MPACRCSize }

// FPDU is a view of a complete FPDU (no markers).
type FPDU []byte

// ULPDULength returns the ULPDU_Length field.
func (f FPDU) ULPDULength() int { return int(binary.BigEndian.Uint16(f)) }

// ULPDU returns the DDP segment the FPDU carries.
func (f FPDU) ULPDU() []byte { return f[MPALengthSize : MPALengthSize+f.ULPDULength()] }

// CRC returns the CRC trailer field. The CRC32c travels least significant
// byte first, as iSCSI's digest does (RFC 3720 B.4); Linux siw and tshark
// agree.
func (f FPDU) CRC() uint32 {
	n := f.ULPDULength()
	return binary.LittleEndian.Uint32(f[MPALengthSize+n+FPDUPad(n):])
}

// Len returns the FPDU's total length according to its length field.
func (f FPDU) Len() int { return FPDULen(f.ULPDULength()) }
