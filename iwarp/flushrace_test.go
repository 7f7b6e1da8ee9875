package iwarp

import (
	"context"
	"testing"
	"time"
)

// TestFlushWaitsForManualReceiver: a ManualProgress QP has no receive
// goroutine; its application receives (WaitProgress, Progress) under
// rxMu. A Close while the application is completing a Read Response must
// not flush the Read from under it: the Read completes once, not once
// flushed and once more by the receiver.
func TestFlushWaitsForManualReceiver(t *testing.T) {
	acc := AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead
	b := newTestEnd(t, 4096, acc)
	a := &testEnd{scq: newTestCQ(), rcq: newTestCQ(), mem: NewMemTable(), events: make(chan Event, 64)}
	rq, err := NewRecvQueue(8, 1)
	if err != nil {
		t.Fatal(err)
	}
	a.qp, err = NewQP(QPConfig{Num: 2, PD: 7, Mem: a.mem, SendCQ: a.scq, RecvCQ: a.rcq, RQ: rq, ManualProgress: true})
	if err != nil {
		t.Fatal(err)
	}
	a.buf = make([]byte, 4096)
	a.reg = &Region{Buf: a.buf, Base: 0x10000, Access: acc, PD: 7}
	if _, err := a.mem.Register(a.reg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.qp.Close() })
	connectQPs(t, a, b, MPAConfig{IRD: 1, ORD: 1}, MPAConfig{IRD: 1, ORD: 1})

	entered, release := make(chan struct{}), make(chan struct{})
	testHookReadResponseEnd = func() {
		close(entered)
		<-release
	}
	defer func() { testHookReadResponseEnd = nil }()
	const id = 77
	if _, err := a.qp.PostSend(SendWR{ID: id, Op: WRRead, Flags: FlagSignaled, SGL: []SGE{a.sge(0, 2048)}, RemoteAddr: b.reg.Base, RKey: b.reg.STag()}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		for a.qp.WaitProgress(ctx) == nil {
		}
	}()
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("the Read Response never arrived")
	}
	go a.qp.Close()
	// The flush must wait for the receiver. Give a flush that does not
	// a moment to finish (it then has flushed the Read).
	select {
	case <-a.qp.Done():
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	select {
	case <-a.qp.Done():
	case <-ctx.Done():
		t.Fatal("the QP did not finish closing")
	}
	<-recvDone
	n := 0
	for {
		select {
		case c := <-a.scq.ch:
			if c.ID == id {
				n++
			}
			continue
		default:
		}
		break
	}
	if n != 1 {
		t.Fatalf("the Read completed %d times, want once", n)
	}
}
