package iwarp

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestResponderFirstFPDU: when an accepted QP's first FPDU goes out. By
// default a responder transmits what its application posts without
// waiting for the initiator to speak (as Linux siw's responder does), its
// first FPDU held for FirstFPDUDelay after the MPA Reply against an
// initiator that did not say it takes FPDUs right behind the Reply (siw's,
// which refuses a Reply followed by early bytes), and not past the
// initiator's own first FPDU. With MPAStrict, and in peer-to-peer mode, it
// sends nothing before the initiator's first FPDU.
func TestResponderFirstFPDU(t *testing.T) {
	const long = 5 * time.Second
	for _, tc := range []struct {
		name   string
		strict bool
		delay  time.Duration
		init   MPAConfig
		speak  bool          // the initiator sends a zero-length Write after the Reply
		min    time.Duration // the responder's first FPDU no sooner after the Reply
		max    time.Duration // and no later (0: it must not come before the initiator speaks)
	}{
		{"siw-initiator", false, 50 * time.Millisecond, MPAConfig{IRD: 1, ORD: 1}, false, 50 * time.Millisecond, long},
		{"initiator-spoke", false, long, MPAConfig{IRD: 1, ORD: 1}, true, 0, long / 2},
		{"rdmatap-initiator", false, long, MPAConfig{IRD: 1, ORD: 1, EarlyFPDUQuery: true}, false, 0, long / 2},
		{"strict", true, 0, MPAConfig{IRD: 1, ORD: 1, EarlyFPDUQuery: true}, true, 0, 0},
		{"peer-to-peer", false, 0, MPAConfig{IRD: 1, ORD: 1, PeerToPeer: true, RTR: RTRWrite, EarlyFPDUQuery: true}, true, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &testEnd{scq: newTestCQ(), rcq: newTestCQ(), mem: NewMemTable()}
			rq, _ := NewRecvQueue(4, 1)
			var err error
			if b.qp, err = NewQP(QPConfig{Num: 2, PD: 7, Mem: b.mem, SendCQ: b.scq, RecvCQ: b.rcq, RQ: rq, MaxInline: 64,
				FirstFPDUDelay: tc.delay, MPAStrict: tc.strict}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.qp.Close() })
			b.buf = make([]byte, 64)
			b.reg = &Region{Buf: b.buf, Base: 0x1000, Access: AccessLocalWrite, PD: 7}
			b.mem.Register(b.reg)
			sa, sb := tcpPair(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*long)
			defer cancel()
			started := make(chan error, 1)
			var replied time.Time
			go func() {
				req, err := AwaitMPARequest(ctx, sb)
				if err != nil {
					started <- err
					return
				}
				p, err := req.Accept(ctx, sb, MPAConfig{IRD: 1, ORD: 1})
				replied = time.Now()
				if err == nil {
					err = b.qp.Start(sb, p)
				}
				if err == nil {
					_, err = b.qp.PostSend(SendWR{Op: WRSend, Flags: FlagInline, SGL: []SGE{b.sge(0, 8)}})
				}
				started <- err
			}()
			if _, _, err := Initiate(ctx, sa, tc.init); err != nil {
				t.Fatal(err)
			}
			if err := <-started; err != nil {
				t.Fatal(err)
			}
			var first [2]byte
			if tc.max == 0 {
				// Nothing may come before the initiator speaks.
				quiet, stop := context.WithTimeout(ctx, 100*time.Millisecond)
				err := sa.ReadFull(quiet, first[:])
				stop()
				if err == nil {
					t.Fatal("the responder sent an FPDU before the initiator's first")
				} else if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatal(err)
				}
			}
			if tc.speak {
				if _, err := sa.Write(ctx, rawFPDU(rawULPDU(DDPFields{Opcode: OpWrite, Last: true, STag: 1}, nil), false)); err != nil {
					t.Fatal(err)
				}
			}
			if err := sa.ReadFull(ctx, first[:]); err != nil {
				t.Fatal(err)
			}
			gap := time.Since(replied)
			if gap < tc.min {
				t.Errorf("first FPDU %v after the MPA Reply, want at least %v", gap, tc.min)
			}
			if tc.max > 0 && gap > tc.max {
				t.Errorf("first FPDU %v after the MPA Reply, want at most %v", gap, tc.max)
			}
		})
	}
}
