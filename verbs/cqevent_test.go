package verbs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/verbs"
)

// TestCQEvents: ReqNotify and WaitEvent behave as ibv_req_notify_cq and
// ibv_get_cq_event. Armed for solicited completions only, a plain Send's
// completion raises no event and a Send with Solicited Event does; armed
// for any, the next completion does; an event is raised once per arming;
// an unsuccessful completion raises a solicited-only event too.
func TestCQEvents(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl, sv := connect(t, p, 4096, verbs.ConnParams{})
	noEvent := func(what string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if err := sv.rcq.WaitEvent(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: WaitEvent %v, want no event", what, err)
		}
	}
	event := func(what string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := sv.rcq.WaitEvent(ctx); err != nil {
			t.Fatalf("%s: WaitEvent %v, want the event", what, err)
		}
	}
	send := func(id uint64, flags verbs.SendFlags) verbs.WC {
		t.Helper()
		if err := sv.qp.PostRecv(verbs.RecvWR{ID: id, SGL: []verbs.SGE{sv.mr.SGE(0, 64)}}); err != nil {
			t.Fatal(err)
		}
		if err := cl.qp.PostSend(verbs.SendWR{ID: id, Op: verbs.OpSend, Flags: flags, SGL: []verbs.SGE{cl.mr.SGE(0, 8)}}); err != nil {
			t.Fatal(err)
		}
		return wait1(t, sv.rcq)
	}

	if err := sv.rcq.ReqNotify(true); err != nil {
		t.Fatal(err)
	}
	if wc := send(1, 0); wc.Flags&verbs.WCSolicited != 0 {
		t.Fatalf("plain Send completed as solicited: %+v", wc)
	}
	noEvent("a plain Send, armed for solicited completions")
	if wc := send(2, verbs.Solicited); wc.Flags&verbs.WCSolicited == 0 {
		t.Fatalf("Send with Solicited Event completed without the flag: %+v", wc)
	}
	event("a Send with Solicited Event")
	send(3, verbs.Solicited)
	noEvent("a second solicited Send without arming again")

	if err := sv.rcq.ReqNotify(false); err != nil {
		t.Fatal(err)
	}
	send(4, 0)
	event("a plain Send, armed for any completion")

	// An unsuccessful completion: a receive whose buffer is not this
	// PD's registered memory.
	if err := sv.rcq.ReqNotify(true); err != nil {
		t.Fatal(err)
	}
	if err := sv.qp.PostRecv(verbs.RecvWR{ID: 5, SGL: []verbs.SGE{{Addr: 0x1000, Length: 64, LKey: 0x77}}}); err != nil {
		t.Fatal(err)
	}
	if err := cl.qp.PostSend(verbs.SendWR{ID: 5, Op: verbs.OpSend, SGL: []verbs.SGE{cl.mr.SGE(0, 8)}}); err != nil {
		t.Fatal(err)
	}
	if wc := wait1(t, sv.rcq); wc.Status == verbs.StatusSuccess {
		t.Fatalf("a receive into unregistered memory succeeded: %+v", wc)
	}
	event("an unsuccessful completion, armed for solicited completions")

	if err := sv.rcq.Close(); !errors.Is(err, verbs.ErrBusy) {
		t.Fatalf("closing a CQ a QP completes into: %v, want ErrBusy", err)
	}
	sv.qp.Close()
	if err := sv.rcq.Close(); err != nil {
		t.Fatalf("closing the CQ once its QP is gone: %v", err)
	}
	if err := sv.rcq.ReqNotify(false); err == nil {
		t.Fatal("ReqNotify on a closed CQ")
	}
}
