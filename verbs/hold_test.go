package verbs_test

import (
	"testing"
	"time"

	"rdmatap/verbs"
)

// The siw accept-race guard seen from the API: Dial returns without
// waiting for the first-FPDU hold, a Send posted meanwhile arrives once
// the hold is over, and between two rdmatap devices there is no hold.
func TestFirstFPDUHoldThroughDial(t *testing.T) {
	for _, siw := range []bool{true, false} {
		const delay = 300 * time.Millisecond
		hold := delay
		if !siw {
			hold = time.Minute // a hold would fail the test
		}
		p := newPair(t, verbs.DeviceConfig{FirstFPDUDelay: hold}, verbs.DeviceConfig{})
		verbs.SetSiwReply(p.b, siw)
		c := newCMBench(t, p, 64)
		t0 := time.Now()
		cl, _ := c.dial(t)
		dialed := time.Now()
		if err := cl.QP().PostSend(verbs.SendWR{ID: 1, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{c.cl.mr.SGE(0, 8)}}); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(t0); took > delay/2 {
			t.Fatalf("siw %v: Dial, Accept and PostSend took %v", siw, took)
		}
		var wc [1]verbs.WC
		if err := drain(c.sv.rcq, wc[:], 1); err != nil {
			t.Fatal(err)
		}
		// The Reply left before Dial returned, so this gap is at most
		// the one between the Reply and the Send's arrival.
		gap := time.Since(dialed)
		if siw && gap < delay {
			t.Fatalf("the first message arrived %v after Dial returned, want the %v hold", gap, delay)
		}
		if !siw && gap > 10*time.Second {
			t.Fatalf("the first message to an rdmatap responder took %v", gap)
		}
		cl.Close()
	}
}
