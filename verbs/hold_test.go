package verbs_test

import (
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/verbs"
)

// The siw accept-race guard seen from the API: Dial returns without
// waiting for the first-FPDU hold, a Send posted meanwhile arrives once
// the hold is over, and between two rdmatap devices there is no hold.
// Nothing is timed from above: a hold of a minute that Dial waited for
// would fail the dial's 10 s deadline, and a Send posted during it cannot
// have arrived; a short hold's Send arrives no sooner than the hold ends,
// which no load can make earlier.
func TestFirstFPDUHoldThroughDial(t *testing.T) {
	for _, tc := range []struct {
		name string
		siw  bool
		hold time.Duration
	}{{"siw, a long hold", true, time.Minute}, {"siw, a short hold", true, 300 * time.Millisecond}, {"rdmatap", false, 5 * time.Minute}} {
		p := newPair(t, verbs.DeviceConfig{FirstFPDUDelay: tc.hold}, verbs.DeviceConfig{})
		verbs.SetSiwReply(p.b, tc.siw)
		c := newCMBench(t, p, 64)
		t0 := time.Now()
		cl, _ := c.dial(t)
		if err := cl.QP().PostSend(verbs.SendWR{ID: 1, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{c.cl.mr.SGE(0, 8)}}); err != nil {
			t.Fatal(err)
		}
		var wc [1]verbs.WC
		switch {
		case tc.siw && tc.hold == time.Minute:
			if n := c.sv.rcq.Poll(wc[:]); n != 0 {
				t.Fatalf("%s: the first message arrived during the hold: %+v", tc.name, wc[0])
			}
		default:
			// Without a hold the Send arrives; with a 5-minute hold
			// drain (60 s) would give up first.
			if err := drain(c.sv.rcq, wc[:], 1); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if took := time.Since(t0); tc.siw && took < tc.hold {
				t.Fatalf("%s: the first message arrived %v after the dial began, within the %v hold", tc.name, took, tc.hold)
			}
		}
		cl.Close()
	}
}
