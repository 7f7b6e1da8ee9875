package perftest

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rdmatap/rdmatap/verbs"
)

// The bandwidth tests (run_iter_bw, run_iter_bw_server of
// perftest_resources.c): the client keeps up to TX depth work requests
// outstanding on each QP, signalling every CQ-moderation-th one, and
// measures; the server of write/read only waits and prints the client's
// report; the send server receives and returns credits.
//
// Send over iWARP has no RNR retry, so perftest (send_bw.c, iWARP only)
// makes the receiver grant credits: every rx_depth/3 receives it
// RDMA-Writes its receive count (a host-order uint32) into the sender's
// credit word, and the sender keeps fewer than rx_depth Sends beyond the
// last credit.

// bwRun is the measurement of one size.
type bwRun struct {
	size                  int
	posted, completed     []int64 // tposted, tcompleted (ns), when peak is computed
	start, end            int64
	iters                 uint64 // iterations per QP (or counted in duration mode)
	msgs                  uint64 // messages in [start, end]
	durationMode, noPeak  bool
	cqMod                 int
	qps                   int
	gbits                 bool
	windowStart, windowNS int64
}

func (r *bwRun) report() perfBWReport {
	rep := perfBWReport{Size: uint64(r.size), Iters: r.msgs}
	factor := float64(1 << 20)
	if r.gbits {
		factor = 125000000
	}
	ns := float64(r.end - r.start)
	if ns <= 0 {
		ns = 1
	}
	rep.Avg = float64(r.size) * float64(r.msgs) * 1e9 / ns / factor
	rep.MsgRate = float64(r.msgs) * 1e9 / ns / 1e6
	rep.Bytes = uint64(r.size) * r.msgs
	rep.Seconds = ns / 1e9
	if !r.noPeak && len(r.posted) > 0 {
		// print_report_bw's peak: the best rate over any run of WRs from a
		// post to a moderated completion.
		n := len(r.posted)
		opt := float64(r.end - r.start)
		for i := 0; i < n; i++ {
			j := (i/r.cqMod+1)*r.cqMod - 1
			for ; j < n; j += r.cqMod {
				if t := float64(r.completed[j]-r.posted[i]) / float64(j-i+1); t < opt {
					opt = t
				}
			}
			if n%r.cqMod != 0 {
				j = n - 1
				if t := float64(r.completed[j]-r.posted[i]) / float64(j-i+1); t < opt {
					opt = t
				}
			}
		}
		if opt > 0 {
			rep.Peak = float64(r.size) * 1e9 / opt / factor
		}
	}
	return rep
}

func (s *perfSession) runBW(ctx context.Context, stdout io.Writer) error {
	o := s.o
	var err error
	switch {
	case o.verb == perfSend:
		err = s.runSendBW(ctx, stdout)
	case o.client():
		err = s.runBWClient(ctx, stdout)
	default:
		err = s.runBWServer(ctx, stdout)
	}
	s.progress.done()
	return err
}

func (s *perfSession) emitBW(stdout io.Writer, reps []perfBWReport) {
	if s.jsonOut != nil {
		var res any = reps
		if len(reps) == 1 {
			res = reps[0]
		}
		b, _ := json.MarshalIndent(perfJSON{TestInfo: s.o.testInfo(), Results: res}, "", "  ")
		fmt.Fprintf(s.jsonOut, "%s\n", b)
	}
}

// runBWClient is the write/read client.
func (s *perfSession) runBWClient(ctx context.Context, stdout io.Writer) error {
	o := s.o
	io.WriteString(stdout, perfResultLine+o.bwHeader())
	var reps []perfBWReport
	var last perfBWReport
	for _, size := range o.sizes() {
		r, err := s.bwClientSize(ctx, size)
		if err != nil {
			return err
		}
		last = r.report()
		reps = append(reps, last)
		s.progress.done()
		io.WriteString(stdout, o.bwRow(last))
	}
	io.WriteString(stdout, perfResultLine)
	if o.verify {
		if err := s.verifyRemote(ctx, last.Size); err != nil {
			return err
		}
	}
	// Client done; reports; ctx_close_connection.
	if _, err := s.x.handShake(ctx, s.qps[0].my, 0); err != nil {
		return err
	}
	if _, err := s.x.xchgReports(ctx, last); err != nil {
		return err
	}
	if _, err := s.x.handShake(ctx, s.qps[0].my, 0); err != nil {
		return err
	}
	s.emitBW(stdout, reps)
	return s.plotSweep(reps, nil)
}

// verifyRemote checks the data where it landed: after Writes it reads the
// server's region back; after Reads it checks the local sink; after
// atomics it reads the server's word back (FetchAdd: one per atomic
// posted; CmpSwap, which compares with 0 and swaps in 0: still 0) and
// checks the last original value received.
func (s *perfSession) verifyRemote(ctx context.Context, size uint64) error {
	n := int(size)
	for qi, q := range s.qps {
		if s.o.verb == perfAtomic {
			if err := s.verifyAtomic(ctx, qi, q); err != nil {
				return err
			}
			continue
		}
		if s.o.verb == perfRead {
			if err := checkPattern(q.buf[:n], qi, "data read from the server"); err != nil {
				return err
			}
			continue
		}
		scratch := q.buf[s.bufSize : s.bufSize+n]
		clear(scratch)
		if err := q.qp.PostSend(verbs.SendWR{ID: 1 << 62, Op: verbs.OpRead, Flags: verbs.Signaled,
			SGL: []verbs.SGE{q.mr.SGE(s.bufSize, n)}, RemoteAddr: q.rem.VAddr, RKey: q.rem.RKey}); err != nil {
			return err
		}
		if err := s.waitOne(ctx, s.scq); err != nil {
			return err
		}
		if err := checkPattern(scratch, qi, "data written to the server (read back)"); err != nil {
			return err
		}
	}
	return nil
}

func (s *perfSession) verifyAtomic(ctx context.Context, qi int, q *perfQP) error {
	var want, last uint64
	if s.o.atomic == perfFetchAdd {
		want = s.atomicPosts[qi]
		last = want - 1
	}
	if got := binary.NativeEndian.Uint64(q.buf[:8]); got != last {
		return fmt.Errorf("--verify: QP %d: the last atomic returned %d, want %d", qi, got, last)
	}
	scratch := q.buf[s.bufSize : s.bufSize+8]
	clear(scratch)
	if err := q.qp.PostSend(verbs.SendWR{ID: 1 << 62, Op: verbs.OpRead, Flags: verbs.Signaled,
		SGL: []verbs.SGE{q.mr.SGE(s.bufSize, 8)}, RemoteAddr: q.rem.VAddr, RKey: q.rem.RKey}); err != nil {
		return err
	}
	if err := s.waitOne(ctx, s.scq); err != nil {
		return err
	}
	if got := binary.NativeEndian.Uint64(scratch); got != want {
		return fmt.Errorf("--verify: QP %d: the server's word is %d after the run, want %d", qi, got, want)
	}
	return nil
}

// atomicWR is the work request of an atomic test (-A): FetchAdd adds 1;
// CmpSwap compares with 0 and swaps in 0, as both perftest's values are.
func (o *perfOpts) atomicWR(q *perfQP) verbs.SendWR {
	wr := verbs.SendWR{Op: verbs.OpAtomicFetchAdd, SGL: []verbs.SGE{q.mr.SGE(0, perfAtomicSize)},
		RemoteAddr: q.rem.VAddr, RKey: q.rem.RKey, CompareAdd: 1}
	if o.atomic == perfCmpSwap {
		wr.Op, wr.CompareAdd = verbs.OpAtomicCmpSwap, 0
	}
	return wr
}

func (s *perfSession) waitOne(ctx context.Context, cq *verbs.CQ) error {
	wc := make([]verbs.WC, 1)
	for {
		wctx, cancel := context.WithTimeout(ctx, s.o.Timeout)
		_, err := cq.Wait(wctx, wc)
		cancel()
		if err != nil {
			return err
		}
		if err := wc[0].Err(); err != nil {
			return err
		}
		if wc[0].ID == 1<<62 {
			return nil
		}
	}
}

// bwClientSize runs one message size on every QP (run_iter_bw).
func (s *perfSession) bwClientSize(ctx context.Context, size int) (*bwRun, error) {
	o := s.o
	nq := len(s.qps)
	r := &bwRun{size: size, cqMod: o.cqMod, qps: nq, gbits: o.gbits, noPeak: o.noPeak, durationMode: o.dur > 0}
	iters := uint64(o.iters)
	total := iters * uint64(nq)
	if !r.noPeak {
		r.posted = make([]int64, total)
		r.completed = make([]int64, total)
	}
	if o.verify {
		for qi, q := range s.qps {
			if o.verb == perfWrite {
				fillPattern(q.buf[:size], qi)
			} else {
				clear(q.buf[:size])
			}
		}
	}
	op := verbs.OpWrite
	if o.verb == perfRead {
		op = verbs.OpRead
	}
	flags := verbs.SendFlags(0)
	if o.verb == perfWrite && size <= o.inline {
		flags |= verbs.Inline
	}
	wrs := make([]verbs.SendWR, nq)
	for qi, q := range s.qps {
		wrs[qi] = verbs.SendWR{Op: op, SGL: []verbs.SGE{q.mr.SGE(0, size)}, RemoteAddr: q.rem.VAddr, RKey: q.rem.RKey}
		if o.verb == perfAtomic {
			wrs[qi] = o.atomicWR(q)
			op = wrs[qi].Op
		}
	}
	scnt := make([]uint64, nq)
	defer func() {
		if o.verb == perfAtomic {
			s.atomicPosts = append(s.atomicPosts[:0], scnt...)
		}
	}()
	ccnt := make([]uint64, nq)
	var totS, totC uint64
	wc := make([]verbs.WC, 64)
	rctx, cancel := s.watchdog(ctx)
	defer cancel()

	now := func() int64 { return time.Now().UnixNano() }
	r.start = now()
	win := newDurWindow(r.start, o.dur, o.margin)
	stopPosting := false
	pendingSignaled := 0
	for {
		t := now()
		if r.durationMode {
			if win.tick(r, t, totC) {
				stopPosting = true
			}
			s.progress.show(" %s %d bytes: %.0f/%.0f s", perfVerbStr[o.verb], size, float64(t-r.start+int64(o.margin))/1e9, o.dur.Seconds())
		} else if o.all || total > 100000 {
			s.progress.show(" %s %d bytes: %d/%d", perfVerbStr[o.verb], size, totC, total)
		}
		posted := false
		for qi := range s.qps {
			for !stopPosting && (r.durationMode || scnt[qi] < iters) && scnt[qi]-ccnt[qi] < uint64(o.txDepth) {
				wr := &wrs[qi]
				idx := scnt[qi]
				wr.ID = uint64(qi)<<40 | idx
				wr.Flags = flags
				if o.cqMod == 1 || idx%uint64(o.cqMod) == uint64(o.cqMod-1) || (!r.durationMode && idx == iters-1) {
					wr.Flags |= verbs.Signaled
				}
				if r.posted != nil {
					r.posted[totS] = t
				}
				if err := s.qps[qi].qp.PostSend(*wr); err != nil {
					return nil, fmt.Errorf("post %v on QP %d: %w", op, qi, err)
				}
				if wr.Flags&verbs.Signaled != 0 {
					pendingSignaled++
				}
				scnt[qi]++
				totS++
				posted = true
			}
		}
		if totC == totS && !r.durationMode && totC == total {
			break
		}
		if stopPosting && pendingSignaled == 0 {
			break // an unsignaled tail completes with nothing to count
		}
		var n int
		if posted {
			n = s.scq.Poll(wc)
		}
		if n == 0 {
			var err error
			if r.durationMode {
				wctx, c := context.WithDeadline(rctx, time.Unix(0, max(win.deadline, now()+int64(time.Millisecond))))
				n, err = s.scq.Wait(wctx, wc)
				c()
				if err != nil && rctx.Err() == nil && wctx.Err() != nil {
					stopPosting = now() >= win.deadline
					continue
				}
			} else {
				n, err = s.scq.Wait(rctx, wc)
			}
			if err != nil {
				return nil, stallErr(rctx, err)
			}
		}
		t = now()
		s.tick()
		pendingSignaled -= n
		if err := r.account(wc[:n], ccnt, &totC, t); err != nil {
			return nil, err
		}
	}
	r.finish(now(), total, totC, &win)
	return r, nil
}

// runBWServer is the write/read server: it waits for the client and
// prints the client's report.
func (s *perfSession) runBWServer(ctx context.Context, stdout io.Writer) error {
	o := s.o
	io.WriteString(stdout, perfResultLine+o.bwHeader())
	extra := o.dur + time.Duration(len(o.sizes()))*o.Timeout
	if _, err := s.x.handShake(ctx, s.qps[0].my, extra); err != nil {
		return err
	}
	rem, err := s.x.xchgReports(ctx, perfBWReport{})
	if err != nil {
		return err
	}
	io.WriteString(stdout, o.bwRow(rem))
	if _, err := s.x.handShake(ctx, s.qps[0].my, 0); err != nil {
		return err
	}
	io.WriteString(stdout, perfResultLine)
	if o.verb == perfWrite && o.verify {
		for qi, q := range s.qps {
			if err := checkPattern(q.buf[s.bufSize:s.bufSize+int(rem.Size)], qi, "data the client wrote"); err != nil {
				return err
			}
		}
	}
	s.emitBW(stdout, []perfBWReport{rem})
	return nil
}

// credit returns the word the peer RDMA-Writes its receive count into.
func (q *perfQP) credit() *uint32 { return (*uint32)(unsafe.Pointer(&q.ctrl[4])) }

// runSendBW runs send bw on either side (send_bw.c: each side prints its
// own measurement; a handshake before and after every size).
func (s *perfSession) runSendBW(ctx context.Context, stdout io.Writer) error {
	o := s.o
	io.WriteString(stdout, perfResultLine+o.bwHeader())
	var reps []perfBWReport
	for _, size := range o.sizes() {
		var r *bwRun
		var err error
		if o.client() {
			for _, q := range s.qps {
				atomic.StoreUint32(q.credit(), 0)
			}
			if o.verify {
				for qi, q := range s.qps {
					fillPattern(q.buf[:size], qi)
				}
			}
			if _, err = s.x.handShake(ctx, s.qps[0].my, 0); err != nil {
				return err
			}
			r, err = s.sendClientSize(ctx, size)
			if err == nil && o.all {
				s.awaitFinalCredits(uint32(o.iters))
			}
		} else {
			r, err = s.sendServerSize(ctx, size)
		}
		if err != nil {
			return err
		}
		rep := r.report()
		reps = append(reps, rep)
		s.progress.done()
		io.WriteString(stdout, o.bwRow(rep))
		if o.all {
			if _, err := s.x.handShake(ctx, s.qps[0].my, o.Timeout); err != nil {
				return err
			}
		}
	}
	io.WriteString(stdout, perfResultLine)
	// ctx_close_connection, after the last size's handshake too: send_bw.c
	// ends -a and a single size alike (a peer left without it waits).
	if _, err := s.x.handShake(ctx, s.qps[0].my, o.dur+o.Timeout); err != nil {
		return err
	}
	s.emitBW(stdout, reps)
	return s.plotSweep(reps, nil)
}

// sendClientSize is run_iter_bw with send credits.
func (s *perfSession) sendClientSize(ctx context.Context, size int) (*bwRun, error) {
	o := s.o
	nq := len(s.qps)
	r := &bwRun{size: size, cqMod: o.cqMod, qps: nq, gbits: o.gbits, noPeak: o.noPeak, durationMode: o.dur > 0}
	iters := uint64(o.iters)
	total := iters * uint64(nq)
	if !r.noPeak {
		r.posted = make([]int64, total)
		r.completed = make([]int64, total)
	}
	flags := verbs.SendFlags(0)
	if size <= o.inline {
		flags |= verbs.Inline
	}
	wrs := make([]verbs.SendWR, nq)
	for qi, q := range s.qps {
		wrs[qi] = verbs.SendWR{Op: verbs.OpSend, SGL: []verbs.SGE{q.mr.SGE(0, size)}}
	}
	scnt := make([]uint64, nq)
	ccnt := make([]uint64, nq)
	var totS, totC uint64
	wc := make([]verbs.WC, 64)
	rctx, cancel := s.watchdog(ctx)
	defer cancel()
	now := func() int64 { return time.Now().UnixNano() }
	r.start = now()
	win := newDurWindow(r.start, o.dur, o.margin)
	stopPosting := false
	spins := 0
	pendingSignaled := 0
	for {
		t := now()
		if r.durationMode {
			if win.tick(r, t, totC) {
				stopPosting = true
			}
			s.progress.show(" Send %d bytes: %.0f/%.0f s", size, float64(t-r.start+int64(o.margin))/1e9, o.dur.Seconds())
		} else if o.all || total > 100000 {
			s.progress.show(" Send %d bytes: %d/%d", size, totC, total)
		}
		posted := false
		for qi, q := range s.qps {
			for !stopPosting && (r.durationMode || scnt[qi] < iters) && scnt[qi]-ccnt[qi] < uint64(o.txDepth) {
				if uint32(scnt[qi])+1-atomic.LoadUint32(q.credit()) >= uint32(o.rxDepth) {
					break // no credit: the peer may not have a receive posted
				}
				wr := &wrs[qi]
				idx := scnt[qi]
				wr.ID = uint64(qi)<<40 | idx
				wr.Flags = flags
				if o.cqMod == 1 || idx%uint64(o.cqMod) == uint64(o.cqMod-1) || (!r.durationMode && idx == iters-1) {
					wr.Flags |= verbs.Signaled
				}
				if r.posted != nil {
					r.posted[totS] = t
				}
				if err := q.qp.PostSend(*wr); err != nil {
					return nil, fmt.Errorf("post Send on QP %d: %w", qi, err)
				}
				if wr.Flags&verbs.Signaled != 0 {
					pendingSignaled++
				}
				scnt[qi]++
				totS++
				posted = true
			}
		}
		if totC == totS && !r.durationMode && totC == total {
			break
		}
		if stopPosting && pendingSignaled == 0 {
			break
		}
		n := s.scq.Poll(wc)
		if n == 0 {
			if pendingSignaled > 0 {
				// Completions come: block for them.
				var err error
				if n, err = s.scq.Wait(rctx, wc); err != nil {
					return nil, stallErr(rctx, err)
				}
			} else {
				// Waiting for a credit, which is an RDMA Write into our
				// memory: poll it, as perftest spins.
				if rctx.Err() != nil {
					return nil, stallErr(rctx, rctx.Err())
				}
				if !posted {
					spins++
					if spins > 64 {
						time.Sleep(20 * time.Microsecond)
					} else {
						runtime.Gosched()
					}
				}
				continue
			}
		}
		spins = 0
		pendingSignaled -= n
		t = now()
		s.tick()
		if err := r.account(wc[:n], ccnt, &totC, t); err != nil {
			return nil, err
		}
	}
	r.finish(now(), total, totC, &win)
	return r, nil
}

// sendServerSize is run_iter_bw_server: post rx_depth receives per QP,
// handshake, then receive, repost and grant credits.
func (s *perfSession) sendServerSize(ctx context.Context, size int) (*bwRun, error) {
	o := s.o
	nq := len(s.qps)
	r := &bwRun{size: size, qps: nq, gbits: o.gbits, noPeak: true, durationMode: o.dur > 0, cqMod: 1}
	// A receive's ID is its QP and slot; without --verify all the
	// receives of a QP share slot 0, as perftest's do.
	slot := func(q *perfQP, k int) []byte {
		off := (1 + k) * s.bufSize
		return q.buf[off : off+size]
	}
	post := func(qi, k int) error {
		q := s.qps[qi]
		return q.qp.PostRecv(verbs.RecvWR{ID: uint64(qi)<<32 | uint64(k), SGL: []verbs.SGE{q.mr.SGE((1+k)*s.bufSize, size)}})
	}
	for qi, q := range s.qps {
		for k := 0; k < o.rxDepth; k++ {
			if o.verify {
				clear(slot(q, k%s.rxSlots))
			}
			if err := post(qi, k%s.rxSlots); err != nil {
				return nil, err
			}
		}
		binary32(q.ctrl[:4], 0)
	}
	if _, err := s.x.handShake(ctx, s.qps[0].my, 0); err != nil {
		return nil, err
	}
	creditCnt := uint64(max(1, o.rxDepth/3))
	rcnt := make([]uint64, nq)
	sinceCredit := make([]uint64, nq)
	iters := uint64(o.iters)
	total := iters * uint64(nq)
	var tot uint64
	wc := make([]verbs.WC, 64)
	swc := make([]verbs.WC, 64)
	rctx, cancel := s.watchdog(ctx)
	defer cancel()
	// In duration mode the client's handshake after its run ends ours.
	var stop <-chan struct{}
	if r.durationMode {
		stop = s.x.watch(rctx)
	}
	wctx, wcancel := context.WithCancel(rctx)
	defer wcancel()
	if stop != nil {
		go func() {
			select {
			case <-stop:
				wcancel()
			case <-wctx.Done():
			}
		}()
	}
	now := func() int64 { return time.Now().UnixNano() }
	r.start = now()
	win := newDurWindow(r.start, o.dur, o.margin)
	outstandingCredits := 0
	for r.durationMode || tot < total {
		n, err := s.rcq.Wait(wctx, wc)
		if err != nil {
			if r.durationMode && rctx.Err() == nil {
				break // the client is done
			}
			return nil, stallErr(rctx, err)
		}
		t := now()
		s.tick()
		for _, c := range wc[:n] {
			if err := c.Err(); err != nil {
				return nil, err
			}
			qi, k := int(c.ID>>32), int(uint32(c.ID))
			q := s.qps[qi]
			if o.verify {
				if int(c.ByteLen) != size {
					return nil, fmt.Errorf("--verify: QP %d received %d bytes, want %d", qi, c.ByteLen, size)
				}
				// The slot is this receive's alone until it is
				// reposted; clearing it makes a message that never
				// lands fail the next check.
				if err := checkPattern(slot(q, k), qi, "data received"); err != nil {
					return nil, err
				}
				clear(slot(q, k))
			}
			tot++
			rcnt[qi]++
			if r.durationMode || rcnt[qi]+uint64(o.rxDepth) <= iters {
				if err := post(qi, k); err != nil {
					return nil, err
				}
			}
			sinceCredit[qi]++
			if sinceCredit[qi] == creditCnt {
				sinceCredit[qi] = 0
				for outstandingCredits >= o.txDepth {
					k, err := s.scq.Wait(rctx, swc)
					if err != nil {
						return nil, stallErr(rctx, err)
					}
					for _, c := range swc[:k] {
						if err := c.Err(); err != nil {
							return nil, err
						}
					}
					outstandingCredits -= k
				}
				binary32(q.ctrl[:4], uint32(rcnt[qi]))
				if err := q.qp.PostSend(verbs.SendWR{ID: uint64(qi), Op: verbs.OpWrite, Flags: verbs.Signaled | verbs.Inline,
					SGL: []verbs.SGE{q.ctrlMR.SGE(0, 4)}, RemoteAddr: q.rem.VAddr, RKey: q.rem.RKey}); err != nil {
					return nil, fmt.Errorf("post credit on QP %d: %w", qi, err)
				}
				outstandingCredits++
			}
		}
		if k := s.scq.Poll(swc); k > 0 {
			for _, c := range swc[:k] {
				if err := c.Err(); err != nil {
					return nil, err
				}
			}
			outstandingCredits -= k
		}
		if r.durationMode {
			win.tick(r, t, tot)
			s.progress.show(" Send %d bytes: %.0f s", size, float64(t-r.start+int64(o.margin))/1e9)
		} else if o.all || total > 100000 {
			s.progress.show(" Send %d bytes: %d/%d", size, tot, total)
		}
	}
	// A last credit for the whole count (perftest's server ends on one),
	// so that a sender of several sizes knows every credit has landed.
	if !r.durationMode {
		for qi, q := range s.qps {
			if sinceCredit[qi] != 0 {
				binary32(q.ctrl[:4], uint32(rcnt[qi]))
				if err := q.qp.PostSend(verbs.SendWR{ID: uint64(qi), Op: verbs.OpWrite, Flags: verbs.Signaled | verbs.Inline,
					SGL: []verbs.SGE{q.ctrlMR.SGE(0, 4)}, RemoteAddr: q.rem.VAddr, RKey: q.rem.RKey}); err != nil {
					return nil, fmt.Errorf("post credit on QP %d: %w", qi, err)
				}
				outstandingCredits++
			}
		}
	}
	// Drain our credit writes.
	for outstandingCredits > 0 {
		k, err := s.scq.Wait(rctx, swc)
		if err != nil {
			return nil, stallErr(rctx, err)
		}
		outstandingCredits -= k
	}
	if !r.durationMode {
		r.end, r.msgs = now(), total
	} else if r.end == 0 {
		r.end, r.msgs = now(), tot-win.atStart
	}
	return r, nil
}

// binary32 stores v in host order, as perftest's ctrl_buf[i] = rcnt does.
func binary32(b []byte, v uint32) { *(*uint32)(unsafe.Pointer(&b[0])) = v }

// awaitFinalCredits waits (briefly) until every QP's credit word shows the
// peer's last credit of a size, so that resetting it for the next size
// cannot race with a credit still on its way.
func (s *perfSession) awaitFinalCredits(want uint32) {
	deadline := time.Now().Add(time.Second)
	for _, q := range s.qps {
		for atomic.LoadUint32(q.credit()) != want && time.Now().Before(deadline) {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// durWindow is perftest's duration mode (-D): the completions between the
// two margins are measured (r.start, r.end, r.msgs), and posting stops at
// the deadline.
type durWindow struct {
	deadline, winStart, winEnd int64
	measuring                  bool
	atStart                    uint64 // completions when the window opened
}

func newDurWindow(start int64, dur, margin time.Duration) durWindow {
	d := start + int64(dur)
	return durWindow{deadline: d, winStart: start + int64(margin), winEnd: d - int64(margin)}
}

// tick moves the window to time t with tot completions so far and reports
// whether the deadline has passed.
func (w *durWindow) tick(r *bwRun, t int64, tot uint64) bool {
	if !w.measuring && t >= w.winStart {
		w.measuring, w.atStart, r.start = true, tot, t
	}
	if w.measuring && r.end == 0 && t >= w.winEnd {
		r.end, r.msgs = t, tot-w.atStart
	}
	return t >= w.deadline
}

// account counts the sends a batch of (moderated) completions covers: a
// completion's ID carries its QP and send index, and every send up to it
// has completed too.
func (r *bwRun) account(wcs []verbs.WC, ccnt []uint64, totC *uint64, t int64) error {
	for _, c := range wcs {
		if err := c.Err(); err != nil {
			return err
		}
		qi := int(c.ID >> 40)
		idx := c.ID & (1<<40 - 1)
		done := idx + 1 - ccnt[qi]
		ccnt[qi] = idx + 1
		for k := uint64(0); k < done; k++ {
			if r.completed != nil {
				r.completed[*totC] = t
			}
			*totC++
		}
	}
	return nil
}

// finish closes the measurement: all total messages, or in duration mode
// what completed since the window opened if it never closed.
func (r *bwRun) finish(now int64, total, totC uint64, win *durWindow) {
	if !r.durationMode {
		r.end = now
		if r.completed != nil {
			r.end = r.completed[total-1]
		}
		r.msgs = total
	} else if r.end == 0 {
		r.end, r.msgs = now, totC-win.atStart
	}
}
