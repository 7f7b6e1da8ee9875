package perftest

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/rdmatap/rdmatap/internal/lattrace"
	"io"
	"math"
	"slices"
	"time"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/verbs"
)

// The latency tests (run_iter_lat_write, run_iter_lat_send, run_iter_lat
// of perftest_resources.c). write: each side RDMA-Writes the peer's buffer
// and spins on the last byte of its own, which the peer's Write sets to
// the iteration count (ib_write_lat); the server posts first (perftest's
// loop skips the server's first wait), the client answers each Write with
// its own. The QPs are ManualProgress and the spin is QP.WaitProgress, so
// the Write is placed by the waiting goroutine. send: ping-pong of Sends,
// the client first. read: the client RDMA-Reads the server's buffer, one
// at a time; the server only serves. Each side stamps its posts; the
// latency of one iteration is the time between two posts, halved for
// write and send (a round trip), whole for read.
//
// The exchange around the test is that of write_lat.c, read_lat.c,
// atomic_lat.c and send_lat.c (see exchangeDests for the handshakes
// before it): send shakes hands before each size and once at the end
// (ctx_close_connection); read and atomic once at the end (their server
// at once, the client after the test); write not at all: ib_write_lat
// moves from one size to the next without a word and tears down when its
// last Write has landed, so a side that still waits for a handshake
// there waits forever.

func (s *perfSession) runLat(ctx context.Context, stdout io.Writer) error {
	defer dumpLatTrace()
	o := s.o
	if o.oneSided() && !o.client() {
		extra := o.dur + time.Duration(len(o.sizes()))*o.Timeout
		if _, err := s.x.handShake(ctx, s.qps[0].my, extra); err != nil {
			return err
		}
		io.WriteString(stdout, perfResultLine)
		return nil
	}
	io.WriteString(stdout, perfResultLine+o.latHeader())
	if o.verb == perfWrite && !o.client() {
		// ib_write_lat's server speaks first, which siw's responder lets
		// it do and a strict one (--mpa-strict, an RNIC's) does not
		// without an RTR. The client has connected and spoken on the
		// exchange connection since: it is past the MPA Reply.
		for _, q := range s.qps {
			q.qp.OpenTXGate()
		}
	}
	var reps []perfLatReport
	for _, size := range o.sizes() {
		if o.verb == perfSend {
			if err := s.postLatRecvs(size); err != nil {
				return err
			}
			if _, err := s.x.handShake(ctx, s.qps[0].my, o.Timeout); err != nil {
				return err
			}
		}
		stamps, err := s.latSize(ctx, size)
		s.progress.done()
		if err != nil {
			return err
		}
		rep, err := latReport(size, stamps, o.verb, o.dur > 0)
		if err != nil {
			return err
		}
		reps = append(reps, rep)
		io.WriteString(stdout, latRow(rep))
	}
	if o.verb != perfWrite {
		extra := o.dur + o.Timeout
		if _, err := s.x.handShake(ctx, s.qps[0].my, extra); err != nil {
			return err
		}
	}
	io.WriteString(stdout, perfResultLine)
	if s.jsonOut != nil {
		var res any = reps
		if len(reps) == 1 {
			res = reps[0]
		}
		b, _ := json.MarshalIndent(perfJSON{TestInfo: o.testInfo(), Results: res}, "", "  ")
		fmt.Fprintf(s.jsonOut, "%s\n", b)
	}
	return s.plotSweep(nil, reps)
}

func (s *perfSession) postLatRecvs(size int) error {
	q := s.qps[0]
	n := s.o.rxDepth
	if s.o.dur == 0 {
		n = min(n, s.o.iters)
	}
	for k := 0; k < n; k++ {
		if err := q.qp.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{q.mr.SGE(s.bufSize, size)}}); err != nil {
			return err
		}
	}
	return nil
}

// latFill writes iteration i's message: the pattern shifted by i
// (--verify) and i's low byte last, the byte the peer spins on.
func latFill(b []byte, i int, verify bool) {
	if verify {
		for k := range b {
			b[k] = byte(k*7 + i*13)
		}
	}
	b[len(b)-1] = byte(i)
}

func latCheck(b []byte, i int, what string) error {
	for k := range b[:len(b)-1] {
		if b[k] != byte(k*7+i*13) {
			return fmt.Errorf("--verify: %s %d: byte %d is %#02x, want %#02x", what, i, k, b[k], byte(k*7+i*13))
		}
	}
	return nil
}

// latRun is one size of a latency test: its buffers, its work request and
// the post stamps.
type latRun struct {
	s      *perfSession
	o      *perfOpts
	q      *perfQP
	size   int
	client bool
	// rctx ends with the watchdog; wctx, that of the waits for the peer,
	// ends too when a timed run is over (see latWaitCtx).
	rctx, wctx context.Context
	deadline   time.Time // -D: when the client and the write sides stop
	src, dst   []byte
	wc         []verbs.WC
	wr         verbs.SendWR
	stamps     []int64
	rcnt       int // send: receives completed
	n          int // iterations completed
}

// latSize runs one size and returns the post stamps (ns).
func (s *perfSession) latSize(ctx context.Context, size int) ([]int64, error) {
	o := s.o
	if o.trace != nil {
		o.trace("lat")
	}
	l, cancel := s.newLatRun(ctx, size)
	defer cancel()
	var err error
	switch {
	case o.oneSided():
		err = l.readLat()
	case o.verb == perfWrite:
		// ib_write_lat's server Writes first: run_iter_lat_write skips
		// its first wait.
		err = l.pingPong(!l.client)
	default:
		// ib_send_lat's client Sends first: run_iter_lat_send skips its
		// first receive.
		err = l.pingPong(l.client)
	}
	if err != nil {
		return nil, err
	}
	return l.result()
}

// newLatRun prepares one size; the returned cancel ends its contexts.
func (s *perfSession) newLatRun(ctx context.Context, size int) (*latRun, context.CancelFunc) {
	o := s.o
	q := s.qps[0]
	l := &latRun{s: s, o: o, q: q, size: size, client: o.client()}
	rctx, cancel := s.watchdog(ctx)
	if o.dur > 0 {
		l.deadline = time.Now().Add(o.dur)
	}
	wctx, wcancel := s.latWaitCtx(rctx, l.deadline)
	l.rctx, l.wctx = rctx, wctx
	l.src = q.buf[:size]
	// dst is not cleared between sizes: the peer's first Write of this
	// size may already have landed (ib_write_lat starts the next size
	// without a handshake), and the byte each size polls, at size-1, lies
	// beyond every earlier (smaller) message, so it is still zero.
	l.dst = q.buf[s.bufSize : s.bufSize+size]
	l.wc = make([]verbs.WC, 16)
	if o.dur == 0 {
		l.stamps = make([]int64, 0, o.iters)
	}
	l.wr = o.latWR(q, size)
	return l, func() { wcancel(); cancel() }
}

// latWaitCtx is the context of the waits for the peer. The server of a
// timed send run stops when the client's closing handshake arrives; a
// timed write run has none, and each side stops at its own deadline, as
// ib_write_lat's alarm ends its loop.
func (s *perfSession) latWaitCtx(rctx context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	switch {
	case s.o.dur > 0 && s.o.verb == perfWrite:
		return context.WithDeadline(rctx, deadline)
	case s.o.dur > 0 && !s.o.client():
		return s.untilPeerDone(rctx)
	}
	return rctx, func() {}
}

// latWR is the work request every post of a latency test posts.
func (o *perfOpts) latWR(q *perfQP, size int) verbs.SendWR {
	flags := verbs.Signaled
	if size <= o.inline && !o.oneSided() {
		flags |= verbs.Inline
	}
	sgl := []verbs.SGE{q.mr.SGE(0, size)}
	switch o.verb {
	case perfWrite:
		return verbs.SendWR{Op: verbs.OpWrite, Flags: flags, SGL: sgl, RemoteAddr: q.rem.VAddr, RKey: q.rem.RKey}
	case perfSend:
		return verbs.SendWR{Op: verbs.OpSend, Flags: flags, SGL: sgl}
	case perfRead:
		return verbs.SendWR{Op: verbs.OpRead, Flags: flags, SGL: sgl, RemoteAddr: q.rem.VAddr, RKey: q.rem.RKey}
	}
	wr := o.atomicWR(q)
	wr.Flags = flags
	return wr
}

// pingPong is the loop of the write and send tests (run_iter_lat_write,
// run_iter_lat_send). The side that posts first posts i and then waits
// for the peer's i; the other waits for i and answers it.
func (l *latRun) pingPong(postsFirst bool) error {
	for i := 1; l.more(i); i++ {
		if !postsFirst {
			if err := l.wait(i); err != nil {
				return l.waitEnd(err)
			}
		}
		t := l.stamp()
		if err := l.postTwoSided(i); err != nil {
			return stallErr(l.rctx, err)
		}
		if postsFirst {
			if err := l.wait(i); err != nil {
				return l.waitEnd(err)
			}
		}
		l.next(i, t)
	}
	return nil
}

// readLat is the client's loop of the read and atomic tests
// (run_iter_lat): one request at a time, each waited for.
func (l *latRun) readLat() error {
	for i := 1; l.more(i); i++ {
		t := l.stamp()
		if err := l.postOneSided(i); err != nil {
			return stallErr(l.rctx, err)
		}
		l.next(i, t)
	}
	return nil
}

// more reports whether iteration i runs: -n counts the iterations; with
// -D the client and both sides of write stop at the deadline, the send
// server when the client's closing handshake ends its waits.
func (l *latRun) more(i int) bool {
	if l.o.dur == 0 {
		return i <= l.o.iters
	}
	return !(l.client || l.o.verb == perfWrite) || !time.Now().After(l.deadline)
}

// stamp records the time of a post (ns): every post's with -n, the first
// and the latest with -D.
func (l *latRun) stamp() int64 {
	t := time.Now().UnixNano()
	if l.o.dur == 0 || len(l.stamps) < 2 {
		l.stamps = append(l.stamps, t)
	} else {
		l.stamps[1] = t
	}
	return t
}

// next counts iteration i, posted at t, as done.
func (l *latRun) next(i int, t int64) {
	l.n = i
	l.s.lastTick.Store(t) // progress for the watchdog (large messages are slow)
	if i&255 == 0 {
		if l.o.dur > 0 {
			l.s.progress.show(" %s latency %d bytes: %d iterations", perfVerbStr[l.o.verb], l.size, i)
		} else if l.o.all {
			l.s.progress.show(" %s latency %d bytes: %d/%d", perfVerbStr[l.o.verb], l.size, i, l.o.iters)
		}
	}
}

// waitEnd is what a failed wait means: the normal end of a timed run
// whose time is up (or the peer's is and it closed), else the test's
// failure.
func (l *latRun) waitEnd(err error) error {
	switch {
	case l.o.dur == 0 || l.rctx.Err() != nil:
	case l.wctx.Err() != nil:
		return nil
	case l.o.verb == perfWrite && l.n >= 2 && errors.Is(err, iwarp.ErrClosed):
		return nil
	}
	return stallErr(l.rctx, err)
}

// result returns the stamps for latReport: every post's with -n; with -D
// the first and the last post's and the iterations between them
// (print_report_lat_duration: first to last post over the count).
func (l *latRun) result() ([]int64, error) {
	if l.o.dur == 0 {
		return l.stamps, nil
	}
	if len(l.stamps) < 2 || l.n < 2 {
		return nil, errors.New("timed latency run ended before two iterations")
	}
	return []int64{l.stamps[0], l.stamps[1], int64(l.n - 1)}, nil
}

// wait receives iteration i from the peer: its Write or its Send.
func (l *latRun) wait(i int) error {
	if l.o.verb == perfWrite {
		return l.waitWrite(i)
	}
	return l.waitSend(i)
}

// waitWrite spins until the peer's Write i sets the last byte of dst.
func (l *latRun) waitWrite(i int) error {
	for l.dst[l.size-1] != byte(i) {
		if err := l.q.qp.WaitProgress(l.wctx); err != nil {
			return err
		}
	}
	lattrace.Mark(lattrace.AppSaw)
	if l.o.verify {
		return latCheck(l.dst, i, "write")
	}
	return nil
}

// waitSend waits for the peer's Send i and posts a receive in place of
// its own while more Sends are to come.
func (l *latRun) waitSend(i int) error {
	o, q := l.o, l.q
	if err := l.pollOne(l.wctx, l.s.rcq); err != nil {
		return err
	}
	lattrace.Mark(lattrace.AppSaw)
	if err := l.wc[0].Err(); err != nil {
		return err
	}
	l.rcnt++
	if o.dur > 0 || l.rcnt+o.rxDepth <= o.iters {
		if err := q.qp.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{q.mr.SGE(l.s.bufSize, l.size)}}); err != nil {
			return err
		}
	}
	if o.verify {
		return l.checkSend(i)
	}
	return nil
}

// checkSend checks Send i's message (--verify).
func (l *latRun) checkSend(i int) error {
	if int(l.wc[0].ByteLen) != l.size {
		return fmt.Errorf("--verify: send %d: received %d bytes, want %d", i, l.wc[0].ByteLen, l.size)
	}
	if err := latCheck(l.dst, i, "send"); err != nil {
		return err
	}
	if last := l.dst[l.size-1]; last != byte(i) {
		return fmt.Errorf("--verify: send %d: last byte %#02x", i, last)
	}
	return nil
}

// postTwoSided sends iteration i's Write or Send and reaps the send
// completions.
func (l *latRun) postTwoSided(i int) error {
	latFill(l.src, i, l.o.verify)
	if err := l.postWR(); err != nil {
		return err
	}
	wc := l.wc
	for {
		k := l.s.scq.Poll(wc)
		for _, c := range wc[:k] {
			if err := c.Err(); err != nil {
				return err
			}
		}
		if k < len(wc) {
			return nil
		}
	}
}

// postOneSided posts Read or atomic i and waits for its completion, the
// end of the iteration.
func (l *latRun) postOneSided(i int) error {
	if l.o.verify {
		clear(l.src)
	}
	if err := l.postWR(); err != nil {
		return err
	}
	if err := l.pollOne(l.rctx, l.s.scq); err != nil {
		return err
	}
	if err := l.wc[0].Err(); err != nil {
		return err
	}
	if l.o.verify {
		return l.checkOneSided(i)
	}
	return nil
}

// checkOneSided checks what Read or atomic i returned (--verify).
func (l *latRun) checkOneSided(i int) error {
	if l.o.verb != perfAtomic {
		return checkPattern(l.src, 0, fmt.Sprintf("read %d", i))
	}
	// FetchAdd 1 from 0: iteration i sees i-1; CmpSwap 0 for 0: 0.
	want := uint64(0)
	if l.o.atomic == perfFetchAdd {
		want = uint64(i - 1)
	}
	if got := binary.NativeEndian.Uint64(l.src); got != want {
		return fmt.Errorf("--verify: atomic %d returned %d, want %d", i, got, want)
	}
	return nil
}

// postWR posts the work request, reaping send completions while the send
// queue is full.
func (l *latRun) postWR() error {
	for {
		err := l.q.qp.PostSend(l.wr)
		if err == nil {
			return nil
		}
		if !errors.Is(err, verbs.ErrQueueFull) {
			return err
		}
		if _, err := l.s.scq.Wait(l.rctx, l.wc); err != nil {
			return err
		}
	}
}

// pollOne drives the QP until cq has a completion, which it takes into
// wc[0].
func (l *latRun) pollOne(ctx context.Context, cq *verbs.CQ) error {
	for cq.Poll(l.wc[:1]) == 0 {
		if err := l.q.qp.WaitProgress(ctx); err != nil {
			return err
		}
	}
	return nil
}

// latReport is print_report_lat (and _duration) on post stamps in ns.
func latReport(size int, stamps []int64, verb perfVerb, duration bool) (perfLatReport, error) {
	rtt := 2.0
	if verb == perfRead || verb == perfAtomic {
		rtt = 1
	}
	rep := perfLatReport{Size: uint64(size)}
	if duration {
		n := stamps[2]
		usec := float64(stamps[1]-stamps[0]) / 1e3
		rep.Iters = uint64(n)
		rep.Avg = usec / rtt / float64(n)
		rep.TPS = float64(n) / (usec / 1e6)
		rep.Duration = true
		return rep, nil
	}
	rep.Iters = uint64(len(stamps))
	cnt := len(stamps) - 1
	delta := make([]float64, cnt)
	for i := range delta {
		delta[i] = float64(stamps[i+1]-stamps[i]) / 1e3 / rtt
	}
	slices.Sort(delta)
	cnt -= 2 // LAT_MEASURE_TAIL
	if cnt < 2 {
		return rep, errors.New("too few iterations for a latency report")
	}
	var median float64
	if (cnt-1)%2 != 0 {
		median = (delta[cnt/2] + delta[cnt/2-1]) / 2
	} else {
		median = delta[cnt/2]
	}
	var sum float64
	for _, d := range delta[:cnt] {
		sum += d
	}
	avg := sum / float64(cnt)
	var ss float64
	for _, d := range delta[:cnt] {
		// perftest squares the difference as an int.
		v := int(avg - d)
		ss += float64(v * v)
	}
	rep.Min, rep.Max, rep.Typical, rep.Avg = delta[0], delta[cnt], median, avg
	rep.Stdev = math.Sqrt(ss / float64(cnt))
	rep.P99 = delta[int(math.Ceil(float64(cnt)*0.99))]
	rep.P999 = delta[int(math.Ceil(float64(cnt)*0.999))]
	return rep, nil
}
