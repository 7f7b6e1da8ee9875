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
		// it do and an iWARP responder does not (without an RTR). The
		// client has connected and spoken on the exchange connection
		// since: it is past the MPA Reply.
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

// latSize runs one size and returns the post stamps (ns).
func (s *perfSession) latSize(ctx context.Context, size int) ([]int64, error) {
	o := s.o
	q := s.qps[0]
	client := o.client()
	if o.trace != nil {
		o.trace("lat")
	}
	rctx, cancel := s.watchdog(ctx)
	defer cancel()
	var deadline time.Time
	if o.dur > 0 {
		deadline = time.Now().Add(o.dur)
	}
	// The server of a timed send run stops when the client's closing
	// handshake arrives; a timed write run has none, and each side stops
	// at its own deadline, as ib_write_lat's alarm ends its loop.
	wctx := rctx
	if o.dur > 0 && o.verb == perfWrite {
		var c context.CancelFunc
		wctx, c = context.WithDeadline(rctx, deadline)
		defer c()
	} else if o.dur > 0 && !client {
		stop := s.x.watch(rctx)
		var c context.CancelFunc
		wctx, c = context.WithCancel(rctx)
		defer c()
		go func() {
			select {
			case <-stop:
				c()
			case <-wctx.Done():
			}
		}()
	}
	src := q.buf[:size]
	// dst is not cleared between sizes: the peer's first Write of this
	// size may already have landed (ib_write_lat starts the next size
	// without a handshake), and the byte each size polls, at size-1, lies
	// beyond every earlier (smaller) message, so it is still zero.
	dst := q.buf[s.bufSize : s.bufSize+size]
	wc := make([]verbs.WC, 16)
	iters := o.iters
	var stamps []int64
	if o.dur == 0 {
		stamps = make([]int64, 0, iters)
	}
	flags := verbs.Signaled
	if size <= o.inline && !o.oneSided() {
		flags |= verbs.Inline
	}
	var wr verbs.SendWR
	switch o.verb {
	case perfWrite:
		wr = verbs.SendWR{Op: verbs.OpWrite, Flags: flags, SGL: []verbs.SGE{q.mr.SGE(0, size)}, RemoteAddr: q.rem.VAddr, RKey: q.rem.RKey}
	case perfSend:
		wr = verbs.SendWR{Op: verbs.OpSend, Flags: flags, SGL: []verbs.SGE{q.mr.SGE(0, size)}}
	case perfRead:
		wr = verbs.SendWR{Op: verbs.OpRead, Flags: flags, SGL: []verbs.SGE{q.mr.SGE(0, size)}, RemoteAddr: q.rem.VAddr, RKey: q.rem.RKey}
	case perfAtomic:
		wr = o.atomicWR(q)
		wr.Flags = flags
	}
	rcnt := 0
	// wait receives iteration i from the peer.
	wait := func(i int) error {
		switch o.verb {
		case perfWrite:
			for dst[size-1] != byte(i) {
				if err := q.qp.WaitProgress(wctx); err != nil {
					return err
				}
			}
			lattrace.Mark(lattrace.AppSaw)
			if o.verify {
				return latCheck(dst, i, "write")
			}
		case perfSend:
			for {
				if k := s.rcq.Poll(wc[:1]); k > 0 {
					lattrace.Mark(lattrace.AppSaw)
					if err := wc[0].Err(); err != nil {
						return err
					}
					break
				}
				if err := q.qp.WaitProgress(wctx); err != nil {
					return err
				}
			}
			rcnt++
			if o.dur > 0 || rcnt+o.rxDepth <= iters {
				if err := q.qp.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{q.mr.SGE(s.bufSize, size)}}); err != nil {
					return err
				}
			}
			if o.verify {
				if int(wc[0].ByteLen) != size {
					return fmt.Errorf("--verify: send %d: received %d bytes, want %d", i, wc[0].ByteLen, size)
				}
				if err := latCheck(dst, i, "send"); err != nil {
					return err
				}
				if dst[size-1] != byte(i) {
					return fmt.Errorf("--verify: send %d: last byte %#02x", i, dst[size-1])
				}
			}
		}
		return nil
	}
	// post sends iteration i's message and reaps send completions (a Read
	// is waited for: its completion is the end of the iteration).
	post := func(i int) error {
		if !o.oneSided() {
			latFill(src, i, o.verify)
		} else if o.verify {
			clear(src)
		}
		for {
			err := q.qp.PostSend(wr)
			if err == nil {
				break
			}
			if !errors.Is(err, verbs.ErrQueueFull) {
				return err
			}
			if _, err := s.scq.Wait(rctx, wc); err != nil {
				return err
			}
		}
		if o.oneSided() {
			for {
				if k := s.scq.Poll(wc[:1]); k > 0 {
					if err := wc[0].Err(); err != nil {
						return err
					}
					break
				}
				if err := q.qp.WaitProgress(rctx); err != nil {
					return err
				}
			}
			if o.verify && o.verb == perfAtomic {
				// FetchAdd 1 from 0: iteration i sees i-1; CmpSwap 0 for 0: 0.
				want := uint64(0)
				if o.atomic == perfFetchAdd {
					want = uint64(i - 1)
				}
				if got := binary.NativeEndian.Uint64(src); got != want {
					return fmt.Errorf("--verify: atomic %d returned %d, want %d", i, got, want)
				}
				return nil
			}
			if o.verify {
				return checkPattern(src, 0, fmt.Sprintf("read %d", i))
			}
			return nil
		}
		for {
			k := s.scq.Poll(wc)
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
	// Who posts first: ib_write_lat's server (run_iter_lat_write skips
	// its first wait), ib_send_lat's client (run_iter_lat_send skips its
	// first receive). The first poster posts i and then waits for the
	// peer's i; the other waits for i and answers it.
	postsFirst := !o.oneSided() && (o.verb == perfSend) == client
	waitFirst := !o.oneSided() && !postsFirst
	// waitErr: whether a failed wait ends a timed run normally (its time
	// is up, or the peer's is and it closed) rather than the test.
	timedEnd := func(err error, n int) bool {
		if o.dur == 0 || rctx.Err() != nil {
			return false
		}
		if wctx.Err() != nil {
			return true
		}
		return o.verb == perfWrite && n >= 2 && errors.Is(err, iwarp.ErrClosed)
	}
	var n int
	for i := 1; o.dur > 0 || i <= iters; i++ {
		if o.dur > 0 && (client || o.verb == perfWrite) && time.Now().After(deadline) {
			break
		}
		if waitFirst {
			if err := wait(i); err != nil {
				if timedEnd(err, n) {
					break
				}
				return nil, stallErr(rctx, err)
			}
		}
		t := time.Now().UnixNano()
		if o.dur == 0 {
			stamps = append(stamps, t)
		} else if len(stamps) < 2 {
			stamps = append(stamps, t)
		} else {
			stamps[1] = t
		}
		if err := post(i); err != nil {
			return nil, stallErr(rctx, err)
		}
		if postsFirst {
			if err := wait(i); err != nil {
				if timedEnd(err, n) {
					break
				}
				return nil, stallErr(rctx, err)
			}
		}
		n = i
		s.lastTick.Store(t) // progress for the watchdog (large messages are slow)
		if i&255 == 0 {
			if o.dur > 0 {
				s.progress.show(" %s latency %d bytes: %d iterations", perfVerbStr[o.verb], size, i)
			} else if o.all {
				s.progress.show(" %s latency %d bytes: %d/%d", perfVerbStr[o.verb], size, i, iters)
			}
		}
	}
	if o.dur > 0 {
		// print_report_lat_duration: first to last post over the count.
		if len(stamps) < 2 || n < 2 {
			return nil, errors.New("timed latency run ended before two iterations")
		}
		return []int64{stamps[0], stamps[1], int64(n - 1)}, nil
	}
	return stamps, nil
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
