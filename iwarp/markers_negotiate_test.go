package iwarp

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

func encodeFrame(t *testing.T, m MPAFrameFields) []byte {
	t.Helper()
	b := make([]byte, m.Len())
	if err := MPAFrame(b).Encode(&m); err != nil {
		t.Fatal(err)
	}
	return b
}

// frames splits what a side wrote into MPA frames.
func frames(t *testing.T, b []byte) []MPAFrame {
	t.Helper()
	var fs []MPAFrame
	for len(b) > 0 {
		n, err := MPAFrame(b).Validate()
		if err != nil {
			t.Fatalf("wrote %x: %v", b, err)
		}
		fs = append(fs, MPAFrame(b[:n]))
		b = b[n:]
	}
	return fs
}

func negCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestMarkersNotRequestedByDefault: without MPAConfig.Markers no frame
// carries M, and Initiate/Accept, which cannot report markers, refuse
// MPAConfig.Markers before sending anything.
func TestMarkersNotRequestedByDefault(t *testing.T) {
	ctx := negCtx(t)
	reply := encodeFrame(t, MPAFrameFields{Reply: true, Revision: 2, V2: &MPAv2Params{IRD: 1, ORD: 1}})
	s := &scriptStream{in: bytes.NewReader(reply)}
	if _, _, err := Initiate(ctx, s, MPAConfig{IRD: 1, ORD: 1}); err != nil {
		t.Fatal(err)
	}
	if fs := frames(t, s.out.Bytes()); len(fs) != 1 || fs[0].Markers() {
		t.Fatalf("default request: %x", s.out.Bytes())
	}
	s = &scriptStream{in: bytes.NewReader(reply)}
	if _, _, err := Initiate(ctx, s, MPAConfig{Markers: true}); !errors.Is(err, ErrMarkersUnsupported) || s.out.Len() != 0 {
		t.Fatalf("Initiate with Markers: %v, wrote %d octets", err, s.out.Len())
	}
	req := encodeFrame(t, MPAFrameFields{Revision: 2, V2: &MPAv2Params{IRD: 1, ORD: 1}})
	s = &scriptStream{in: bytes.NewReader(req)}
	r, err := AwaitMPARequest(ctx, s)
	if err != nil || r.Markers {
		t.Fatalf("request: %+v, %v", r, err)
	}
	if _, err := r.Accept(ctx, s, MPAConfig{Markers: true}); !errors.Is(err, ErrMarkersUnsupported) || s.out.Len() != 0 {
		t.Fatalf("Accept with Markers: %v, wrote %d octets", err, s.out.Len())
	}
	if _, err := r.Accept(ctx, s, MPAConfig{}); err != nil {
		t.Fatal(err)
	}
	if fs := frames(t, s.out.Bytes()); len(fs) != 1 || fs[0].Markers() || fs[0].Reject() {
		t.Fatalf("default reply: %x", s.out.Bytes())
	}
}

// TestMarkersNegotiatedBothWays: two ends with Markers, over TCP, each
// inserts and strips (RFC 5044 §7.1: M in each frame).
func TestMarkersNegotiatedBothWays(t *testing.T) {
	ctx := negCtx(t)
	for _, rev := range []uint8{1, 2} {
		sa, sb := tcpPair(t)
		var wg sync.WaitGroup
		var dirsB MarkerDirs
		var errB error
		var askedB bool
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := AwaitMPARequest(ctx, sb)
			if err != nil {
				errB = err
				return
			}
			askedB = r.Markers
			_, dirsB, errB = r.AcceptMarkers(ctx, sb, MPAConfig{Markers: true, IRD: 1, ORD: 1})
		}()
		_, dirsA, _, errA := InitiateMarkers(ctx, sa, MPAConfig{Revision: rev, Markers: true, CRC: true, IRD: 1, ORD: 1})
		wg.Wait()
		if errA != nil || errB != nil {
			t.Fatalf("rev %d: initiator %v, responder %v", rev, errA, errB)
		}
		both := MarkerDirs{Tx: true, Rx: true}
		if !askedB || dirsA != both || dirsB != both {
			t.Fatalf("rev %d: request M %v; initiator %+v, responder %+v; want both ways", rev, askedB, dirsA, dirsB)
		}
	}
}

// TestMarkersOneDirection: markers are per direction; an end with Markers
// facing a peer that does not ask for them strips but does not insert.
func TestMarkersOneDirection(t *testing.T) {
	ctx := negCtx(t)
	// Initiator asks, the responder's Reply has no M.
	reply := encodeFrame(t, MPAFrameFields{Reply: true, Revision: 2, V2: &MPAv2Params{IRD: 1, ORD: 1}})
	s := &scriptStream{in: bytes.NewReader(reply)}
	_, dirs, _, err := InitiateMarkers(ctx, s, MPAConfig{Markers: true, IRD: 1, ORD: 1})
	if err != nil || dirs != (MarkerDirs{Rx: true}) {
		t.Fatalf("initiator: %+v, %v; want Rx only", dirs, err)
	}
	if fs := frames(t, s.out.Bytes()); !fs[0].Markers() {
		t.Fatal("the request does not carry M")
	}
	// Responder with Markers, Request without M: its Reply has M.
	req := encodeFrame(t, MPAFrameFields{Revision: 2, V2: &MPAv2Params{IRD: 1, ORD: 1}})
	s = &scriptStream{in: bytes.NewReader(req)}
	r, err := AwaitMPARequest(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if _, dirs, err = r.AcceptMarkers(ctx, s, MPAConfig{Markers: true}); err != nil || dirs != (MarkerDirs{Rx: true}) {
		t.Fatalf("responder: %+v, %v; want Rx only", dirs, err)
	}
	if fs := frames(t, s.out.Bytes()); len(fs) != 1 || !fs[0].Markers() || fs[0].Reject() {
		t.Fatalf("reply %x: want M, no R", s.out.Bytes())
	}
}

// TestMarkersRefused: a peer that refuses markers, as Linux siw does
// (a Reject echoing the Request with M cleared), gives the initiator an
// error that says why; an end without Markers refuses a peer's M.
func TestMarkersRefused(t *testing.T) {
	ctx := negCtx(t)
	siwReject := encodeFrame(t, MPAFrameFields{Reply: true, Reject: true, Revision: 2, V2: &MPAv2Params{IRD: 1, ORD: 1}})
	s := &scriptStream{in: bytes.NewReader(siwReject)}
	_, _, _, err := InitiateMarkers(ctx, s, MPAConfig{Markers: true, IRD: 1, ORD: 1})
	var rej *RejectedError
	if !errors.As(err, &rej) || !rej.Markers || !errors.Is(err, ErrRejected) || !errors.Is(err, ErrMarkersUnsupported) {
		t.Fatalf("siw-style reject of a marker request: %v", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "markers") || !strings.Contains(msg, "siw") {
		t.Fatalf("error %q does not say markers were the likely cause", msg)
	}
	// A reject of a request without M says nothing of markers.
	s = &scriptStream{in: bytes.NewReader(siwReject)}
	if _, _, err := Initiate(ctx, s, MPAConfig{IRD: 1, ORD: 1}); !errors.Is(err, ErrRejected) || errors.Is(err, ErrMarkersUnsupported) || strings.Contains(err.Error(), "markers") {
		t.Fatalf("plain reject: %v", err)
	}

	// Responder without Markers: the Request's M is refused on the wire
	// (R set, M clear), once.
	req := encodeFrame(t, MPAFrameFields{Revision: 2, Markers: true, V2: &MPAv2Params{IRD: 1, ORD: 1}})
	for _, useAccept := range []bool{false, true} {
		s = &scriptStream{in: bytes.NewReader(req)}
		r, err := AwaitMPARequest(ctx, s)
		if err != nil || !r.Markers {
			t.Fatalf("request with M: %+v, %v", r, err)
		}
		if useAccept {
			_, err = r.Accept(ctx, s, MPAConfig{})
		} else {
			_, _, err = r.AcceptMarkers(ctx, s, MPAConfig{})
		}
		if !errors.Is(err, ErrMarkersUnsupported) {
			t.Fatalf("responder without Markers: %v", err)
		}
		if fs := frames(t, s.out.Bytes()); len(fs) != 1 || !fs[0].IsReply() || !fs[0].Reject() || fs[0].Markers() || !fs[0].Enhanced() {
			t.Fatalf("responder wrote %x, want one enhanced Reject without M", s.out.Bytes())
		}
	}

	// Initiator without Markers, Reply with M: refused.
	replyM := encodeFrame(t, MPAFrameFields{Reply: true, Markers: true, Revision: 2, V2: &MPAv2Params{IRD: 1, ORD: 1}})
	s = &scriptStream{in: bytes.NewReader(replyM)}
	if _, _, _, err := InitiateMarkers(ctx, s, MPAConfig{IRD: 1, ORD: 1}); !errors.Is(err, ErrMarkersUnsupported) {
		t.Fatalf("initiator without Markers, Reply with M: %v", err)
	}
	// ... and taken with Markers.
	s = &scriptStream{in: bytes.NewReader(replyM)}
	if _, dirs, _, err := InitiateMarkers(ctx, s, MPAConfig{Markers: true, IRD: 1, ORD: 1}); err != nil || dirs != (MarkerDirs{Tx: true, Rx: true}) {
		t.Fatalf("initiator with Markers, Reply with M: %+v, %v", dirs, err)
	}
}
