package iwarp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"gvisor.dev/gvisor/pkg/tcpip"

	"github.com/rdmatap/rdmatap/zerocopy"
)

// MPA markers (RFC 5044): a 4-octet marker at every 512th octet of one
// direction's TCP stream, so that a receiver holding a segment out of
// order can find the FPDU it lies in.
//
//	 0                   1                   2                   3
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|           RESERVED            |            FPDUPTR            |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// The rules this file follows:
//
//   - Negotiation is per direction (§7.1): the M bit of a Request or Reply
//     is its sender's requirement to *receive* markers, so an end inserts
//     markers when the peer's frame had M and strips them when its own had.
//   - Position (§5): the first marker immediately precedes the first FPDU
//     after the MPA frames, and one follows every 512 octets of TCP
//     sequence space from there. Offsets here count from that first octet:
//     marker j occupies octets [512j, 512j+4) of the direction's stream.
//   - FPDUPTR (§4): the number of octets from the FPDU's ULPDU_Length
//     field to the marker, markers inside the FPDU counted; zero for a
//     marker between two FPDUs (the first marker is one). RESERVED is sent
//     as zero and not checked.
//   - ULPDU_Length and the pad (§4) ignore markers; since both FPDUs and
//     markers are multiples of 4 octets and the stream starts aligned, a
//     marker never splits the ULPDU_Length or the CRC field.
//   - CRC (§4): the CRC32c covers the whole FPDU as it travels, the markers
//     inside it included (a receiver ignores RESERVED except in the CRC);
//     a marker between FPDUs belongs to neither. Wireshark's MPA dissector
//     agrees for markers inside an FPDU, but also folds a marker that
//     opens a TCP segment into the CRC of the FPDU after it.
//
// Transmit: markerInserter wraps the FPDU producer (fpduWriter) as the
// tcpip.Payloader of the stream's WritePayload, inserts the markers and
// writes the CRC field over the marked FPDU; the producer sizes each FPDU
// so that with its markers it fills one TCP segment (markerTiles), and the
// inserter keeps writes on those segments (RecordRest). Receive:
// markerStripper sits between the stream and the receiver, checks each
// FPDUPTR and the CRC, and forwards the FPDU stream without markers in
// sub-slices of what the stream gave it. Both keep their position for the
// whole connection.
const (
	// MPAMarkerSize is the size of a marker.
	MPAMarkerSize = 4
	// MPAMarkerInterval is the distance between two markers in the stream.
	MPAMarkerInterval = 512

	// markerRun is how many FPDU-stream octets lie between two markers.
	markerRun = MPAMarkerInterval - MPAMarkerSize

	// maxMarkedFPDU bounds an FPDU with its markers so that every FPDUPTR
	// fits its 16 bits (the marker farthest into an FPDU precedes its CRC
	// field).
	maxMarkedFPDU = 0xffff &^ 3
)

// MPAMarker is a view of a marker.
type MPAMarker []byte

// Reserved returns the RESERVED field.
func (m MPAMarker) Reserved() uint16 { return binary.BigEndian.Uint16(m) }

// FPDUPtr returns FPDUPTR.
func (m MPAMarker) FPDUPtr() uint16 { return binary.BigEndian.Uint16(m[2:]) }

// Encode writes a marker with the given FPDUPTR and RESERVED zero.
func (m MPAMarker) Encode(fpduPtr uint16) {
	binary.BigEndian.PutUint16(m, 0)
	binary.BigEndian.PutUint16(m[2:], fpduPtr)
}

// MarkerWireOffset returns the offset in a marked stream of octet d of
// the FPDU stream it carries: markers 0..d/508 precede it.
func MarkerWireOffset(d uint64) uint64 { return d + MPAMarkerSize*(d/markerRun+1) }

// MarkerDataOffset returns how many FPDU-stream octets a marked stream
// carries before its offset w; if the octet at w is FPDU data, it is that
// octet's offset in the FPDU stream.
func MarkerDataOffset(w uint64) uint64 {
	return w/MPAMarkerInterval*markerRun + max(w%MPAMarkerInterval, MPAMarkerSize) - MPAMarkerSize
}

// markerWireEnd returns how long a marked stream is that carries the first
// d octets of the FPDU stream: a marker is sent only with the octet it
// precedes, so a stream that ends at an FPDU boundary on a marker position
// does not end with that marker.
func markerWireEnd(d uint64) uint64 {
	if d == 0 {
		return 0
	}
	return MarkerWireOffset(d-1) + 1
}

// MarkerFPDUStart returns the stream offset of the ULPDU_Length field a
// marker at stream offset w (a multiple of MPAMarkerInterval) points to:
// the FPDU it lies in, or, with FPDUPTR zero, the one that follows it. The
// segment path uses it to find FPDUs in a segment that arrived out of
// order; the caller checks that the result lies in what it holds.
func MarkerFPDUStart(w uint64, m MPAMarker) uint64 {
	if p := uint64(m.FPDUPtr()); p != 0 {
		return w - p
	}
	return w + MPAMarkerSize
}

// MarkersMaxFPDU returns the largest FPDU (without markers, a multiple of
// 4) that fits a TCP segment payload of seg octets with its markers,
// wherever in the stream it starts: seg octets hold at most
// ceil(seg/512) markers, which is RFC 5044's MULPDU with markers
// (EMSS - (6 + 4*ceil(EMSS/512) + EMSS mod 4)) plus the 6 octets of
// ULPDU_Length and CRC. The transmitter sizes FPDUs with it when it
// inserts markers.
func MarkersMaxFPDU(seg int) int {
	seg = min(seg, maxMarkedFPDU)
	return max(seg-MPAMarkerSize*((seg+MPAMarkerInterval-1)/MPAMarkerInterval), 0) &^ 3
}

// markerTiles lays a message's FPDUs out on the TCP segments of a marked
// stream, so that the sender is aligned as RFC 5044 Appendix A asks:
// every segment starts with an FPDU and holds it whole. MarkersMaxFPDU
// alone does not do that: it leaves room for the most markers an FPDU
// could meet, so most FPDUs with their markers are shorter than a
// segment, TCP packs the next FPDU's start behind them, and from then on
// segments are cut inside FPDUs, where their markers point back to FPDUs
// that began in an earlier segment.
//
// TCP (no GSO, Nagle off) cuts a write into segments of its maximum
// payload from the write's start; a message is one WritePayload, and a
// write the stack cuts short is completed to the end of its tile next
// (markerInserter.RecordRest), so the segments of a message starting at
// stream offset w0 are its tiles [w0+k*size, w0+(k+1)*size). FPDU k takes
// exactly the FPDU-stream octets that fall in tile k: with the markers
// among them it fills the segment. A tile that begins at a marker begins
// with that marker (FPDUPTR 0, pointing to the FPDU right after it); one
// whose last 4 octets are a marker ends between two FPDUs, with that
// marker. Only a message's last FPDU ends early. As tile k holds 4 octets
// of marker per 512, the FPDUs of a message differ in length by 4 octets
// here and there, all multiples of 4 (no pad but in the last), and none
// is longer with its markers than the segment, as with MarkersMaxFPDU.
type markerTiles struct {
	w0, d0 uint64 // the message's first stream octet, and its FPDU-stream offset
	size   uint64 // the tile, a multiple of 4; 0: the message is not tiled
}

// minMarkerTile is the least tile: one that carries an FPDU with payload
// (60 FPDU-stream octets at worst, of which 24 are header and CRC).
const minMarkerTile = 64

// newMarkerTiles tiles a message starting at stream offset w0 (FPDU-stream
// offset d0) by segment payloads of seg octets, rounded down to a multiple
// of 4 and kept short enough for FPDUPTR; seg <= 0 tiles nothing.
func newMarkerTiles(w0, d0 uint64, seg int) markerTiles {
	if seg <= 0 {
		return markerTiles{w0: w0, d0: d0}
	}
	return markerTiles{w0: w0, d0: d0, size: uint64(min(max(seg, minMarkerTile), maxMarkedFPDU) &^ 3)}
}

// start returns where the message's FPDU k begins, in FPDU-stream octets
// from the message's first: at the first FPDU-stream octet of tile k.
func (t markerTiles) start(k int) int {
	return int(MarkerDataOffset(t.w0+uint64(k)*t.size) - t.d0)
}

// rest returns the stream octets from stream offset w to the end of the
// tile w lies in; 0 at a tile boundary, or for a message not tiled.
func (t markerTiles) rest(w uint64) int {
	if t.size == 0 {
		return 0
	}
	if r := (w - t.w0) % t.size; r != 0 {
		return int(t.size - r)
	}
	return 0
}

// ErrMarker reports a marker whose FPDUPTR does not point to the start of
// the FPDU the receiver is in (see MarkerError).
var ErrMarker = errors.New("mpa: marker does not point to its FPDU")

// ErrMarkedFPDUTooLong reports, on transmit, an FPDU whose markers cannot
// point back to it: with its markers it is longer than FPDUPTR reaches.
// MarkersMaxFPDU keeps FPDUs short enough.
var ErrMarkedFPDUTooLong = errors.New("mpa: FPDU too long for its markers to point to it")

// MarkerError is what markerStripper finds wrong in a marked stream. Code
// is the Terminate the receiver sends: LLP/MPA 0x03 (marker and ULPDU
// length mismatch) for a wrong FPDUPTR, LLP/MPA 0x02 for a CRC that does
// not match the FPDU with its markers.
type MarkerError struct {
	Code TermCode
	// Offset is the stream offset (from the first FPDU octet) of the
	// marker, or of the CRC octet that differed.
	Offset uint64
	// Got and Want are the FPDUPTR received and the one the framing
	// called for (Want is -1 when no 16-bit value could point back that
	// far); for a CRC error, the CRC field and the computed CRC.
	Got, Want int64
}

func (e *MarkerError) Error() string {
	if e.Code.Code == CodeCRC {
		return fmt.Sprintf("mpa: CRC error in a marked FPDU at stream offset %d: field %#08x, computed %#08x", e.Offset, uint32(e.Got), uint32(e.Want))
	}
	return fmt.Sprintf("mpa: marker at stream offset %d has FPDUPTR %d, want %d", e.Offset, e.Got, e.Want)
}

// Is makes errors.Is(err, ErrMarker) true for an FPDUPTR mismatch.
func (e *MarkerError) Is(target error) bool {
	return target == ErrMarker && e.Code.Code == CodeFPDUStart
}

// Framing states of markerFramer.
const (
	mfStart = iota // the next FPDU-stream octet begins an FPDU
	mfLen          // the first octet of ULPDU_Length is in
	mfBody         // ULPDU and pad
	mfCRC          // the CRC field
)

// markerFramer follows one direction's FPDUs through a marked stream:
// where the current FPDU began (for FPDUPTR), how far its CRC field is, and
// the CRC32c of what precedes it, markers within the FPDU included.
type markerFramer struct {
	state  uint8
	hi     byte   // first ULPDU_Length octet (mfLen)
	start  uint64 // stream offset of the FPDU's ULPDU_Length field
	left   int    // octets of ULPDU and pad still to come (mfBody)
	crcPos int    // octets of the CRC field passed (mfCRC)
	crc    uint32
	field  [MPACRCSize]byte // the CRC field's value, once the CRC is complete
}

// marker returns the FPDUPTR due for the marker at stream offset w and
// whether the marker lies within an FPDU, and so in its CRC. A marker
// before an FPDU's CRC field is within it; one at an FPDU boundary points
// nowhere (zero).
func (f *markerFramer) marker(w uint64) (ptr uint64, within bool) {
	if f.state == mfStart {
		return 0, false
	}
	return w - f.start, f.state != mfCRC || f.crcPos == 0
}

// foldMarker adds the octets of a marker within an FPDU to its CRC.
func (f *markerFramer) foldMarker(b []byte) { f.crc = zerocopy.UpdateCRC32C(f.crc, b) }

// run passes FPDU-stream octets q, the first at stream offset w, with no
// marker among them, through the framing. With fill it writes the CRC
// field (transmit); otherwise it compares it (receive) and returns how
// many octets of q precede the first that differs, with a *MarkerError.
// Without crcOn the CRC field is neither written nor checked.
func (f *markerFramer) run(q []byte, w uint64, crcOn, fill bool) (int, error) {
	i := 0
	for i < len(q) {
		switch f.state {
		case mfStart:
			f.start = w + uint64(i)
			f.crc = 0
			if len(q)-i >= MPALengthSize {
				f.sized(int(binary.BigEndian.Uint16(q[i:])))
				if crcOn {
					f.crc = zerocopy.UpdateCRC32C(0, q[i:i+MPALengthSize])
				}
				i += MPALengthSize
				continue
			}
			f.hi = q[i]
			if crcOn {
				f.crc = zerocopy.UpdateCRC32C(0, q[i:i+1])
			}
			f.state = mfLen
			i++
		case mfLen:
			f.sized(int(f.hi)<<8 | int(q[i]))
			if crcOn {
				f.crc = zerocopy.UpdateCRC32C(f.crc, q[i:i+1])
			}
			i++
		case mfBody:
			c := min(len(q)-i, f.left)
			if crcOn {
				f.crc = zerocopy.UpdateCRC32C(f.crc, q[i:i+c])
			}
			f.left -= c
			i += c
			if f.left == 0 {
				f.state, f.crcPos = mfCRC, 0
			}
		case mfCRC:
			if f.crcPos == 0 {
				// Everything the CRC covers has passed, a marker
				// just before the field included.
				binary.LittleEndian.PutUint32(f.field[:], f.crc)
			}
			c := min(len(q)-i, MPACRCSize-f.crcPos)
			if crcOn {
				if fill {
					copy(q[i:i+c], f.field[f.crcPos:])
				} else {
					for j := range c {
						if q[i+j] != f.field[f.crcPos+j] {
							var got [MPACRCSize]byte
							copy(got[:], f.field[:])
							copy(got[f.crcPos:], q[i:i+c])
							return i + j, &MarkerError{Code: TermCode{LayerLLP, ETypeMPA, CodeCRC}, Offset: w + uint64(i+j),
								Got: int64(binary.LittleEndian.Uint32(got[:])), Want: int64(f.crc)}
						}
					}
				}
			}
			f.crcPos += c
			i += c
			if f.crcPos == MPACRCSize {
				f.state = mfStart
			}
		}
	}
	return len(q), nil
}

// sized starts the body of an FPDU whose ULPDU_Length is n. Every FPDU has
// at least two octets of ULPDU and pad (FPDULen is a multiple of 4).
func (f *markerFramer) sized(n int) {
	f.left = FPDULen(n) - MPALengthSize - MPACRCSize
	f.state = mfBody
}

// markerInserter inserts markers into the FPDU stream of one direction. It
// is the tcpip.Payloader netstack reads a message from: set inner to the
// message's FPDU producer before each WritePayload. Its position carries
// over from message to message.
//
// It learns where FPDUs start from the ULPDU_Length fields passing
// through, so the producer needs no marker knowledge; with CRC negotiated
// it computes each CRC over the FPDU with its markers and writes it over
// the producer's CRC field (the producer may then skip its own CRC).
type markerInserter struct {
	inner tcpip.Payloader
	crcOn bool
	wire  uint64      // stream octets produced, markers included
	data  uint64      // FPDU-stream octets taken from producers
	tiles markerTiles // the message's segments (see tile)
	fr    markerFramer
	mk    [MPAMarkerSize]byte // the marker being written (here, not on the stack: the CRC call would move it to the heap)
}

// reset starts a connection's stream at its first octet.
func (m *markerInserter) reset(crcOn bool) { *m = markerInserter{crcOn: crcOn} }

// tile starts a message at the current position, to be cut into segments
// of seg octets (0: not tiled), and returns its tiles, by which the
// producer sizes its FPDUs (fpduWriter.tileMarked).
func (m *markerInserter) tile(seg int) markerTiles {
	m.tiles = newMarkerTiles(m.wire, m.data, seg)
	return m.tiles
}

// RecordRest implements netstack.RecordPayloader in stream octets: what is
// left of the tile being produced (the FPDU, the markers among it
// included), so that a write the stack cut short is completed to the end
// of a segment and the next write, which TCP cuts into segments from its
// start, starts on the next tile. 0 for a message not tiled.
func (m *markerInserter) RecordRest() int {
	if r := m.tiles.rest(m.wire); r > 0 {
		return min(r, m.Len())
	}
	return 0
}

// RecordFit implements netstack.RecordPayloader in stream octets: the
// most octets, at most max, to the end of a tile (or of the message); 0
// for a message not tiled or where no tile ends within max.
func (m *markerInserter) RecordFit(max int) int {
	if l := m.Len(); l <= max {
		return l
	}
	t := m.tiles
	if t.size == 0 {
		return 0
	}
	end := m.wire + uint64(max)
	if b := end - (end-t.w0)%t.size; b > m.wire {
		return int(b - m.wire)
	}
	return 0
}

// Len implements tcpip.Payloader: the octets the rest of the message takes
// with its markers.
func (m *markerInserter) Len() int {
	l := m.inner.Len()
	if l <= 0 {
		return 0
	}
	return int(markerWireEnd(m.data+uint64(l)) - m.wire)
}

// Read implements io.Reader. It reads the producer's octets into p where
// they fit with their markers, moves each run between two markers to its
// place (one memmove; netstack's buffer is the only copy), then fills in
// the markers and the CRC fields in stream order.
func (m *markerInserter) Read(p []byte) (int, error) {
	l := m.inner.Len()
	if l <= 0 {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	// Marker octets due before the next FPDU-stream octet: 4 at a marker
	// position, fewer if the last Read ended inside the marker.
	g := int(MarkerWireOffset(m.data) - m.wire)
	k := min(l, int(MarkerDataOffset(m.wire+uint64(len(p)))-m.data))
	if k <= 0 {
		// Only (part of) the marker fits; the octet it precedes comes
		// next time (the producer has more).
		if err := m.putMarker(p, m.wire); err != nil {
			return 0, err
		}
		m.wire += uint64(len(p))
		return len(p), nil
	}
	k, err := m.inner.Read(p[g : g+k])
	if k <= 0 {
		return 0, err
	}
	d0, d1 := m.data, m.data+uint64(k)
	// Move the runs, last first, each to after the markers before it.
	for e := d1; e > d0; {
		s := max(d0, (e-1)/markerRun*markerRun)
		from, to := g+int(s-d0), int(MarkerWireOffset(s)-m.wire)
		if to != from {
			copy(p[to:to+int(e-s)], p[from:from+int(e-s)])
		}
		e = s
	}
	n := int(MarkerWireOffset(d1-1) + 1 - m.wire)
	w := m.wire
	for i := 0; i < n; {
		r := int(w % MPAMarkerInterval)
		c := 0
		if r < MPAMarkerSize {
			// Data follows in p, so the whole rest of the marker is here.
			c = MPAMarkerSize - r
			if merr := m.putMarker(p[i:i+c], w); merr != nil {
				return 0, merr
			}
		} else {
			c = min(MPAMarkerInterval-r, n-i)
			m.fr.run(p[i:i+c], w, m.crcOn, true)
		}
		i += c
		w += uint64(c)
	}
	m.wire, m.data = w, d1
	return n, err
}

// putMarker writes the octets of the marker that covers stream offset w,
// from w on, into b (at most the rest of the marker).
func (m *markerInserter) putMarker(b []byte, w uint64) error {
	r := int(w % MPAMarkerInterval)
	ptr, within := m.fr.marker(w - uint64(r))
	if ptr > 0xffff {
		return ErrMarkedFPDUTooLong
	}
	MPAMarker(m.mk[:]).Encode(uint16(ptr))
	c := copy(b, m.mk[r:])
	if within && m.crcOn {
		m.fr.foldMarker(m.mk[r : r+c])
	}
	return nil
}

// resync puts the inserter at stream offset w after a WritePayload that
// failed part-way: netstack drops what it read in the failing call, so
// TCP holds fewer octets than the inserter produced. It returns the
// FPDU-stream offset there, for the caller to tell whether w is an FPDU
// boundary; it assumes it is (a stream torn inside an FPDU is reset, and
// nothing more is sent on it).
func (m *markerInserter) resync(w uint64) uint64 {
	m.wire, m.data = w, MarkerDataOffset(w)
	m.fr = markerFramer{}
	return m.data
}

// markerStripper removes the markers from one direction's marked stream.
// It is the io.Writer the stream's reads feed (cut anywhere, a marker
// included); it checks each marker's FPDUPTR against the FPDUs it follows
// and, with CRC negotiated, each CRC against the FPDU with its markers,
// and hands the FPDU stream to inner in the runs between markers:
// sub-slices of what it was given, never copied. The receiver behind it
// then does no CRC check of its own.
type markerStripper struct {
	inner io.Writer
	crcOn bool
	// onErr, when set, takes the first error (the receiver sends its
	// Terminate) and Write then swallows the rest of the stream, as
	// receiver.Write does; without it Write returns the error.
	onErr func(*MarkerError)
	wire  uint64 // stream octets consumed, markers included
	data  uint64 // FPDU-stream octets forwarded
	fr    markerFramer
	mk    [MPAMarkerSize]byte // the marker being received
	err   error
}

// reset starts a connection's stream at its first octet.
func (s *markerStripper) reset(inner io.Writer, crcOn bool, onErr func(*MarkerError)) {
	*s = markerStripper{inner: inner, crcOn: crcOn, onErr: onErr}
}

// Write implements io.Writer.
func (s *markerStripper) Write(p []byte) (int, error) {
	if s.err != nil {
		if s.onErr != nil {
			return len(p), nil
		}
		return 0, s.err
	}
	n := 0
	for n < len(p) {
		r := int(s.wire % MPAMarkerInterval)
		if r < MPAMarkerSize {
			c := min(MPAMarkerSize-r, len(p)-n)
			copy(s.mk[r:], p[n:n+c])
			n += c
			s.wire += uint64(c)
			if r+c == MPAMarkerSize {
				if err := s.marker(s.wire - MPAMarkerSize); err != nil {
					return s.fail(n, len(p), err)
				}
			}
			continue
		}
		c := min(MPAMarkerInterval-r, len(p)-n)
		q := p[n : n+c]
		k, ferr := s.fr.run(q, s.wire, s.crcOn, false)
		if k > 0 {
			if _, err := s.inner.Write(q[:k]); err != nil {
				s.err = err
				return n + k, err
			}
		}
		n += k
		s.wire += uint64(k)
		s.data += uint64(k)
		if ferr != nil {
			return s.fail(n, len(p), ferr)
		}
	}
	return n, nil
}

// marker checks the marker just received at stream offset w.
func (s *markerStripper) marker(w uint64) error {
	want, within := s.fr.marker(w)
	got := uint64(MPAMarker(s.mk[:]).FPDUPtr())
	if got != want {
		e := &MarkerError{Code: TermCode{LayerLLP, ETypeMPA, CodeFPDUStart}, Offset: w, Got: int64(got), Want: int64(want)}
		if want > 0xffff {
			e.Want = -1
		}
		return e
	}
	if within && s.crcOn {
		s.fr.foldMarker(s.mk[:])
	}
	return nil
}

// skipTo moves the stripper, standing at an FPDU boundary, on to the
// FPDU boundary at FPDU-stream offset d, as if it had been handed the
// marked stream up to there: the FPDUs in between were delivered another
// way (segment placement). A marker right at d is still to come.
func (s *markerStripper) skipTo(d uint64) {
	s.data, s.wire = d, markerWireEnd(d)
	s.fr = markerFramer{}
}

func (s *markerStripper) fail(n, total int, err error) (int, error) {
	s.err = err
	if s.onErr != nil {
		s.onErr(err.(*MarkerError))
		return total, nil
	}
	return n, err
}
