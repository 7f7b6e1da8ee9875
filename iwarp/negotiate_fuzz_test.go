package iwarp

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// scriptStream is a Stream whose reads come from a fixed byte string (the
// peer's bytes) and whose writes are recorded.
type scriptStream struct {
	in  *bytes.Reader
	out bytes.Buffer
}

func (s *scriptStream) ReadTo(ctx context.Context, w io.Writer, max int) (int, error) {
	if s.in.Len() == 0 {
		return 0, io.EOF
	}
	b := make([]byte, s.in.Len())
	n, _ := s.in.Read(b)
	return w.Write(b[:n])
}
func (s *scriptStream) TryReadTo(w io.Writer, max int) (int, error) { return s.ReadTo(nil, w, max) }
func (s *scriptStream) WaitReadable(ctx context.Context) error      { return nil }
func (s *scriptStream) ReadFull(ctx context.Context, p []byte) error {
	_, err := io.ReadFull(s.in, p)
	if err == io.ErrUnexpectedEOF {
		err = io.EOF
	}
	return err
}
func (s *scriptStream) Write(ctx context.Context, p []byte) (int, error) { return s.out.Write(p) }
func (s *scriptStream) WritePayload(ctx context.Context, pl tcpip.Payloader) (int64, error) {
	return io.Copy(&s.out, io.LimitReader(pl, int64(pl.Len())))
}
func (s *scriptStream) MaxPayload() int   { return 1420 }
func (s *scriptStream) CloseWrite() error { return nil }
func (s *scriptStream) Abort()            {}
func (s *scriptStream) Close() error      { return nil }

// FuzzMPANegotiation feeds arbitrary peer bytes to both roles of MPA
// setup. Whatever the bytes, negotiation must end in parameters within the
// limits or an error, never a panic, and a responder must never write more
// than one frame.
func FuzzMPANegotiation(f *testing.F) {
	enc := func(m MPAFrameFields) []byte {
		b := make([]byte, m.Len())
		MPAFrame(b).Encode(&m)
		return b
	}
	f.Add(enc(MPAFrameFields{Reply: true, Revision: 2, V2: &MPAv2Params{IRD: 1, ORD: 1}}), uint8(0))
	f.Add(enc(MPAFrameFields{Reply: true, Revision: 2, V2: &MPAv2Params{IRD: 1, ORD: 1, PeerToPeer: true, RTR: RTRWrite}}), uint8(1))
	f.Add(enc(MPAFrameFields{Reply: true, Revision: 1, CRC: true, PrivateData: []byte("x")}), uint8(2))
	f.Add(enc(MPAFrameFields{Reply: true, Reject: true, Revision: 2, V2: &MPAv2Params{}}), uint8(3))
	f.Add(enc(MPAFrameFields{Revision: 2, V2: &MPAv2Params{IRD: 200, ORD: 9000, PeerToPeer: true, RTR: RTRRead | RTRSend}}), uint8(4))
	f.Add(enc(MPAFrameFields{Revision: 2, Markers: true}), uint8(5))
	f.Add([]byte("MPA ID Req Frame\x10\x02\x00\x02ab"), uint8(6))
	f.Fuzz(func(t *testing.T, peer []byte, knobs uint8) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		cfg := MPAConfig{Revision: 1 + knobs&1, CRC: knobs&2 != 0, PeerToPeer: knobs&4 != 0, IRD: int(knobs >> 3 & 7), ORD: int(knobs >> 5)}
		// Initiator reading the peer's reply.
		s := &scriptStream{in: bytes.NewReader(peer)}
		if p, pd, err := Initiate(ctx, s, cfg); err == nil {
			if p.IRD < 0 || p.IRD > MaxIRDORD || p.ORD < 0 || p.ORD > MaxIRDORD || len(pd) > MPAMaxPrivateData {
				t.Fatalf("initiator accepted out-of-range parameters %+v", p)
			}
			if p.PeerToPeer && (p.RTR == 0 || p.RTR&(p.RTR-1) != 0) {
				t.Fatalf("peer-to-peer with RTR %v", p.RTR)
			}
		}
		// Responder reading the peer's request.
		s = &scriptStream{in: bytes.NewReader(peer)}
		req, err := AwaitMPARequest(ctx, s)
		if err != nil {
			return
		}
		s.out.Reset()
		p, err := req.Accept(ctx, s, cfg)
		if err == nil && (p.IRD > MaxIRDORD || p.ORD > MaxIRDORD || p.IRD < 0 || p.ORD < 0) {
			t.Fatalf("responder accepted out-of-range parameters %+v", p)
		}
		if out := s.out.Bytes(); len(out) > 0 {
			n, verr := MPAFrame(out).Validate()
			if verr != nil || n != len(out) || !MPAFrame(out).IsReply() {
				t.Fatalf("responder wrote %x: not exactly one reply frame (%v)", out, verr)
			}
		}
	})
}
