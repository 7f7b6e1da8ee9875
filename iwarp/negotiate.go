package iwarp

import (
	"context"
	"errors"
	"fmt"
)

// MPA connection setup (RFC 5044 §7.1, RFC 6581). The initiator sends a
// Request and reads the Reply; the responder reads the Request, lets the
// application decide, and sends a Reply or a Reject. Each side reads
// exactly the frame, never a byte beyond it: the FPDUs that may follow stay
// in the TCP stream for the QP's receive path. Neither side sends anything
// behind its frame: Linux siw drops a connection whose frame is followed by
// early bytes.

// MaxIRDORD is the most inbound or outbound RDMA Reads rdmatap grants per
// QP (siw's limit too).
const MaxIRDORD = 128

// MPAConfig is one end's MPA settings.
type MPAConfig struct {
	// Revision is 1 or 2 (0 means 2, with enhanced setup).
	Revision uint8
	// CRC asks for CRC32c on every FPDU (initiator) or requires it
	// (responder); CRC is on when either end sets it.
	CRC bool
	// Markers enables MPA markers (RFC 5044 §5): this end asks the peer
	// to insert them in what it sends (the M bit, which §7.1 makes a
	// receiver's requirement) and honours a peer's M by inserting them in
	// what it sends. Off by default: Linux siw rejects a Request with M
	// and refuses a Reply with it, and markers cost 4 octets in 512. An
	// end without Markers refuses a peer's M (ErrMarkersUnsupported).
	Markers bool
	// PeerToPeer makes an initiator ask for RFC 6581 peer-to-peer mode.
	// A responder accepts peer-to-peer requests unless NoPeerToPeer.
	PeerToPeer   bool
	NoPeerToPeer bool
	// RTR: the RTR types an initiator offers (0: Write and Read, as siw),
	// or the ones a responder accepts (0: any, preferring Write, then
	// Read, then Send, as siw).
	RTR RTR
	// IRD and ORD this end wants (0..MaxIRDORD).
	IRD, ORD int
	// PrivateData for the application (up to 508 bytes with revision 2,
	// 512 with revision 1; Linux siw accepts 256 bytes in all).
	PrivateData []byte
	// EarlyFPDUQuery makes an initiator ask whether its first FPDU may
	// follow the Reply at once (MPAFlagEarlyFPDUQuery); ConnParams.EarlyFPDUOK
	// reports the answer. A responder always answers a query.
	EarlyFPDUQuery bool
}

func (c *MPAConfig) check() error {
	if c.Revision == 0 {
		c.Revision = 2
	}
	if c.Revision != 1 && c.Revision != 2 {
		return fmt.Errorf("%w: MPA revision %d", ErrMPANegotiation, c.Revision)
	}
	if c.IRD < 0 || c.IRD > MaxIRDORD || c.ORD < 0 || c.ORD > MaxIRDORD {
		return fmt.Errorf("%w: IRD %d / ORD %d outside 0..%d", ErrMPANegotiation, c.IRD, c.ORD, MaxIRDORD)
	}
	limit := MPAMaxPrivateData
	if c.Revision == 2 {
		limit -= MPAv2PrefixSize
	}
	if len(c.PrivateData) > limit {
		return fmt.Errorf("%w: %d bytes of private data, at most %d", ErrMPAPDLength, len(c.PrivateData), limit)
	}
	return nil
}

// Errors of connection setup.
var (
	ErrRejected           = errors.New("mpa: connection rejected by peer")
	ErrMarkersUnsupported = errors.New("mpa: MPA markers not agreed")
	ErrMPANegotiation     = errors.New("mpa: negotiation failed")
	ErrNoMatchingRTR      = errors.New("mpa: no matching RTR option")
	ErrInsufficientIRD    = errors.New("mpa: insufficient IRD resources")
)

// RejectedError is returned when the peer rejects the connection; it
// carries the peer's private data.
type RejectedError struct {
	PrivateData []byte
	// Markers says the Request asked for MPA markers: the likely reason,
	// as Linux siw and most iWARP peers reject any Request with M.
	Markers bool
}

func (e *RejectedError) Error() string {
	if e.Markers {
		return fmt.Sprintf("mpa: connection rejected by peer (%d bytes of private data): the request asked for MPA markers, which Linux siw and most iWARP peers refuse; connect without markers", len(e.PrivateData))
	}
	return fmt.Sprintf("mpa: connection rejected by peer (%d bytes of private data)", len(e.PrivateData))
}

// Is makes errors.Is(err, ErrRejected) true, and errors.Is(err,
// ErrMarkersUnsupported) too when the Request asked for markers.
func (e *RejectedError) Is(target error) bool {
	return target == ErrRejected || e.Markers && target == ErrMarkersUnsupported
}

// MarkerDirs are the directions MPA markers were negotiated for (RFC 5044
// §7.1: each end's M bit asks the other end to insert them).
type MarkerDirs struct {
	Tx bool // this end inserts markers: the peer's frame had M
	Rx bool // the peer inserts markers: this end's frame had M
}

// readMPAFrame reads exactly one Request or Reply frame.
func readMPAFrame(ctx context.Context, s Stream) (MPAFrame, error) {
	var hdr [MPAHeaderSize]byte
	if err := s.ReadFull(ctx, hdr[:]); err != nil {
		return nil, fmt.Errorf("mpa: reading frame: %w", err)
	}
	f := MPAFrame(hdr[:])
	if !f.IsRequest() && !f.IsReply() {
		return nil, ErrMPAKey
	}
	n := int(f.PDLength())
	if n > MPAMaxPrivateData {
		return nil, fmt.Errorf("%w: %d bytes", ErrMPAPDLength, n)
	}
	buf := make([]byte, MPAHeaderSize+n)
	copy(buf, hdr[:])
	if err := s.ReadFull(ctx, buf[MPAHeaderSize:]); err != nil {
		return nil, fmt.Errorf("mpa: reading private data: %w", err)
	}
	f = MPAFrame(buf)
	if _, err := f.Validate(); err != nil {
		return nil, err
	}
	return f, nil
}

func writeMPAFrame(ctx context.Context, s Stream, m *MPAFrameFields) error {
	buf := make([]byte, m.Len())
	if err := MPAFrame(buf).Encode(m); err != nil {
		return err
	}
	_, err := s.Write(ctx, buf)
	return err
}

// Initiate runs the initiator's side of MPA setup on a connected stream.
// It returns the negotiated parameters and the responder's private data.
// It cannot report markers: with cfg.Markers use InitiateMarkers.
func Initiate(ctx context.Context, s Stream, cfg MPAConfig) (ConnParams, []byte, error) {
	if cfg.Markers {
		return ConnParams{}, nil, fmt.Errorf("%w: Initiate cannot report them; use InitiateMarkers", ErrMarkersUnsupported)
	}
	p, _, pd, err := InitiateMarkers(ctx, s, cfg)
	return p, pd, err
}

// InitiateMarkers is Initiate that also returns the directions MPA
// markers were negotiated for. With cfg.Markers the Request carries M and
// the responder must insert markers (Rx); a Reply with M asks this end to
// insert them (Tx), which needs cfg.Markers too.
func InitiateMarkers(ctx context.Context, s Stream, cfg MPAConfig) (ConnParams, MarkerDirs, []byte, error) {
	p, pd, err := initiate(ctx, s, &cfg)
	if err != nil {
		return ConnParams{}, MarkerDirs{}, nil, err
	}
	return p, MarkerDirs{Tx: cfg.Markers && pd.markers, Rx: cfg.Markers}, pd.data, nil
}

// replyData is what initiate keeps of the Reply besides ConnParams.
type replyData struct {
	data    []byte // the ULP's private data
	markers bool   // M
}

func initiate(ctx context.Context, s Stream, cfg *MPAConfig) (ConnParams, replyData, error) {
	if err := cfg.check(); err != nil {
		return ConnParams{}, replyData{}, err
	}
	req := MPAFrameFields{Revision: cfg.Revision, CRC: cfg.CRC, Markers: cfg.Markers, PrivateData: cfg.PrivateData, EarlyFPDUQuery: cfg.EarlyFPDUQuery}
	var offer MPAv2Params
	if cfg.Revision == 2 {
		offer = MPAv2Params{IRD: uint16(cfg.IRD), ORD: uint16(cfg.ORD)}
		if cfg.PeerToPeer {
			offer.PeerToPeer = true
			offer.RTR = cfg.RTR
			if offer.RTR == 0 {
				offer.RTR = RTRWrite | RTRRead
			}
			if offer.RTR&RTRRead != 0 && offer.ORD == 0 {
				// A Read RTR needs one outbound Read (siw forces this too).
				offer.ORD = 1
			}
		}
		req.V2 = &offer
	}
	if err := writeMPAFrame(ctx, s, &req); err != nil {
		return ConnParams{}, replyData{}, fmt.Errorf("mpa: sending request: %w", err)
	}
	rep, err := readMPAFrame(ctx, s)
	if err != nil {
		return ConnParams{}, replyData{}, err
	}
	if !rep.IsReply() {
		return ConnParams{}, replyData{}, fmt.Errorf("%w: expected a reply, got a request", ErrMPANegotiation)
	}
	pd := append([]byte(nil), rep.ULPPrivateData()...)
	if rep.Reject() {
		return ConnParams{}, replyData{}, &RejectedError{PrivateData: pd, Markers: cfg.Markers}
	}
	if rep.Markers() && !cfg.Markers {
		// The responder requires markers in what we send (§7.1);
		// without MPAConfig.Markers this end will not insert them.
		return ConnParams{}, replyData{}, fmt.Errorf("%w: the responder's reply asks for markers and MPAConfig.Markers is off", ErrMarkersUnsupported)
	}
	if rep.Revision() > cfg.Revision {
		return ConnParams{}, replyData{}, fmt.Errorf("%w: reply revision %d to a revision %d request", ErrMPANegotiation, rep.Revision(), cfg.Revision)
	}
	p := ConnParams{Initiator: true, Revision: rep.Revision(), CRC: cfg.CRC || rep.CRC(), IRD: cfg.IRD, ORD: cfg.ORD,
		// Only an answer to our own query counts.
		EarlyFPDUOK: cfg.EarlyFPDUQuery && rep.EarlyFPDUOK()}
	if v, ok := rep.IRDORD(); ok && req.V2 != nil {
		// The responder's ORD is what it may ask of our IRD; relaxed
		// negotiation (as siw) grows our IRD to match, up to the limit.
		if int(v.ORD) > MaxIRDORD {
			return ConnParams{}, replyData{}, fmt.Errorf("%w: responder ORD %d", ErrInsufficientIRD, v.ORD)
		}
		p.IRD = max(p.IRD, int(v.ORD))
		p.ORD = min(int(offer.ORD), int(v.IRD))
		if offer.PeerToPeer && v.PeerToPeer {
			chosen := v.RTR
			// The responder must choose exactly one type. Linux siw,
			// offered only a Send RTR (which it does not support),
			// answers Write instead of rejecting (siw_cm.c "else
			// WRITE"); any initiator can send a Write or Read RTR, so
			// rdmatap follows the responder's choice.
			if chosen == 0 || chosen&(chosen-1) != 0 || (chosen&offer.RTR == 0 && chosen == RTRSend) {
				return ConnParams{}, replyData{}, fmt.Errorf("%w: offered %v, responder chose %v", ErrNoMatchingRTR, offer.RTR, v.RTR)
			}
			p.PeerToPeer, p.RTR = true, chosen
			if chosen == RTRRead {
				p.ORD = max(p.ORD, 1)
			}
		}
	}
	return p, replyData{data: pd, markers: rep.Markers()}, nil
}

// MPARequest is a received MPA Request the application has to accept or
// reject.
type MPARequest struct {
	Revision    uint8
	CRC         bool
	Enhanced    bool
	V2          MPAv2Params // valid when Enhanced
	PrivateData []byte      // the application's part
	// Markers is M: the initiator requires markers in what this end
	// sends. Accept refuses it unless MPAConfig.Markers.
	Markers bool
	// EarlyFPDUQuery: the initiator asked whether its first FPDU may
	// follow the Reply at once; Accept answers yes (MPAFlagEarlyFPDUOK),
	// as rdmatap's receive path reads whatever follows the Reply.
	EarlyFPDUQuery bool
}

// AwaitMPARequest reads the initiator's Request. A frame that is not a
// well-formed Request is reported; a Request asking for markers is
// returned, for Accept (which knows this end's MPAConfig) to take or
// refuse.
func AwaitMPARequest(ctx context.Context, s Stream) (*MPARequest, error) {
	f, err := readMPAFrame(ctx, s)
	if err != nil {
		return nil, err
	}
	if !f.IsRequest() {
		return nil, fmt.Errorf("%w: expected a request, got a reply", ErrMPANegotiation)
	}
	r := &MPARequest{Revision: f.Revision(), CRC: f.CRC(), Markers: f.Markers(), EarlyFPDUQuery: f.EarlyFPDUQuery(),
		PrivateData: append([]byte(nil), f.ULPPrivateData()...)}
	if v, ok := f.IRDORD(); ok {
		r.Enhanced, r.V2 = true, v
	}
	return r, nil
}

// Accept sends the Reply and returns the negotiated parameters. The
// reply echoes the request's revision (siw's initiator fails on anything
// else). It cannot report markers: with cfg.Markers use AcceptMarkers. A
// Request with M is rejected on the wire, as siw does, and reported.
func (r *MPARequest) Accept(ctx context.Context, s Stream, cfg MPAConfig) (ConnParams, error) {
	if cfg.Markers {
		return ConnParams{}, fmt.Errorf("%w: Accept cannot report them; use AcceptMarkers", ErrMarkersUnsupported)
	}
	p, _, err := r.AcceptMarkers(ctx, s, cfg)
	return p, err
}

// AcceptMarkers is Accept that also returns the directions MPA markers
// were negotiated for. With cfg.Markers the Reply carries M, so the
// initiator must insert markers (Rx), and a Request with M is honoured
// (Tx); without it a Request with M is rejected on the wire (M cleared
// in the Reject, as siw does) and reported as ErrMarkersUnsupported.
func (r *MPARequest) AcceptMarkers(ctx context.Context, s Stream, cfg MPAConfig) (ConnParams, MarkerDirs, error) {
	cfg.Revision = r.Revision
	if err := cfg.check(); err != nil {
		return ConnParams{}, MarkerDirs{}, err
	}
	if r.Markers && !cfg.Markers {
		_ = r.Reject(ctx, s, nil)
		return ConnParams{}, MarkerDirs{}, fmt.Errorf("%w: the initiator asked for markers and MPAConfig.Markers is off (Linux siw refuses them too)", ErrMarkersUnsupported)
	}
	dirs := MarkerDirs{Tx: r.Markers, Rx: cfg.Markers}
	rep := MPAFrameFields{Reply: true, Revision: r.Revision, CRC: cfg.CRC || r.CRC, Markers: cfg.Markers, PrivateData: cfg.PrivateData,
		EarlyFPDUOK: r.EarlyFPDUQuery}
	p := ConnParams{Revision: r.Revision, CRC: rep.CRC, IRD: cfg.IRD, ORD: cfg.ORD, EarlyFPDUOK: r.EarlyFPDUQuery}
	var v2 MPAv2Params
	if r.Enhanced {
		// Relaxed IRD/ORD negotiation, as siw: lower our ORD to the
		// peer's IRD, raise our IRD to the peer's ORD.
		if int(r.V2.ORD) > MaxIRDORD {
			_ = r.reject(ctx, s, nil, true)
			return ConnParams{}, MarkerDirs{}, fmt.Errorf("%w: initiator ORD %d", ErrInsufficientIRD, r.V2.ORD)
		}
		p.IRD = max(p.IRD, int(r.V2.ORD))
		p.ORD = min(p.ORD, int(r.V2.IRD))
		v2 = MPAv2Params{IRD: uint16(p.IRD), ORD: uint16(p.ORD)}
		if r.V2.PeerToPeer && !cfg.NoPeerToPeer {
			accept := cfg.RTR
			if accept == 0 {
				accept = RTRWrite | RTRRead | RTRSend
			}
			offered := r.V2.RTR & accept
			var chosen RTR
			for _, t := range []RTR{RTRWrite, RTRRead, RTRSend} {
				if offered&t != 0 {
					chosen = t
					break
				}
			}
			if chosen == 0 {
				_ = r.reject(ctx, s, nil, true)
				return ConnParams{}, MarkerDirs{}, fmt.Errorf("%w: initiator offered %v", ErrNoMatchingRTR, r.V2.RTR)
			}
			if chosen == RTRRead {
				p.IRD = max(p.IRD, 1)
				v2.IRD = uint16(p.IRD)
			}
			v2.PeerToPeer, v2.RTR = true, chosen
			p.PeerToPeer, p.RTR = true, chosen
		}
		rep.V2 = &v2
	}
	if err := writeMPAFrame(ctx, s, &rep); err != nil {
		return ConnParams{}, MarkerDirs{}, fmt.Errorf("mpa: sending reply: %w", err)
	}
	return p, dirs, nil
}

// Reject sends a Reply with the R bit and the given private data.
func (r *MPARequest) Reject(ctx context.Context, s Stream, privateData []byte) error {
	return r.reject(ctx, s, privateData, r.Enhanced)
}

func (r *MPARequest) reject(ctx context.Context, s Stream, privateData []byte, enhanced bool) error {
	rev := r.Revision
	if rev != 1 && rev != 2 {
		rev = 2
	}
	rep := MPAFrameFields{Reply: true, Reject: true, Revision: rev, PrivateData: privateData}
	if enhanced && rev == 2 {
		rep.V2 = &MPAv2Params{}
	}
	if len(privateData) > MPAMaxPrivateData-MPAv2PrefixSize {
		return fmt.Errorf("%w: %d bytes of private data", ErrMPAPDLength, len(privateData))
	}
	return writeMPAFrame(ctx, s, &rep)
}
