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

// bwClientSize runs one message size of write, read or atomic on every QP
// (run_iter_bw).
func (s *perfSession) bwClientSize(ctx context.Context, size int) (*bwRun, error) {
	o := s.o
	if o.verify {
		for qi, q := range s.qps {
			if o.verb == perfWrite {
				fillPattern(q.buf[:size], qi)
			} else {
				clear(q.buf[:size])
			}
		}
	}
	flags := verbs.SendFlags(0)
	if o.verb == perfWrite && size <= o.inline {
		flags |= verbs.Inline
	}
	wrs := make([]verbs.SendWR, len(s.qps))
	for qi, q := range s.qps {
		wrs[qi] = verbs.SendWR{Op: verbs.OpWrite, SGL: []verbs.SGE{q.mr.SGE(0, size)}, RemoteAddr: q.rem.VAddr, RKey: q.rem.RKey}
		switch o.verb {
		case perfRead:
			wrs[qi].Op = verbs.OpRead
		case perfAtomic:
			wrs[qi] = o.atomicWR(q)
		}
	}
	p := s.newBWPoster(size, wrs, flags, wrs[0].Op.String())
	defer func() {
		if o.verb == perfAtomic {
			s.atomicPosts = append(s.atomicPosts[:0], p.scnt...)
		}
	}()
	rctx, cancel := p.start(ctx)
	defer cancel()
	for {
		posted, done, err := p.step(false)
		if done || err != nil {
			return p.end(err)
		}
		var n int
		if posted {
			n = s.scq.Poll(p.wc)
		}
		if n == 0 {
			var more bool
			if n, more, err = p.waitBW(rctx); err != nil {
				return nil, err
			} else if !more {
				continue
			}
		}
		if err := p.reap(n); err != nil {
			return nil, err
		}
	}
}

// bwPoster is a bw client's run of one size: the work requests of each
// QP, what they have posted and what has completed.
type bwPoster struct {
	s               *perfSession
	o               *perfOpts
	r               *bwRun
	wrs             []verbs.SendWR // one a QP
	flags           verbs.SendFlags
	opName          string // the operation, for a failed post's error
	iters, total    uint64 // per QP, all QPs'
	scnt, ccnt      []uint64
	totS, totC      uint64
	wc              []verbs.WC
	win             durWindow
	stopPosting     bool
	pendingSignaled int
}

func (s *perfSession) newBWPoster(size int, wrs []verbs.SendWR, flags verbs.SendFlags, opName string) *bwPoster {
	o := s.o
	nq := len(s.qps)
	p := &bwPoster{s: s, o: o, wrs: wrs, flags: flags, opName: opName, iters: uint64(o.iters),
		scnt: make([]uint64, nq), ccnt: make([]uint64, nq), wc: make([]verbs.WC, 64)}
	p.r = &bwRun{size: size, cqMod: o.cqMod, qps: nq, gbits: o.gbits, noPeak: o.noPeak, durationMode: o.dur > 0}
	p.total = p.iters * uint64(nq)
	if !p.r.noPeak {
		p.r.posted = make([]int64, p.total)
		p.r.completed = make([]int64, p.total)
	}
	return p
}

// start starts the watchdog and the clock.
func (p *bwPoster) start(ctx context.Context) (context.Context, context.CancelFunc) {
	rctx, cancel := p.s.watchdog(ctx)
	p.r.start = nowNS()
	p.win = newDurWindow(p.r.start, p.o.dur, p.o.margin)
	return rctx, cancel
}

// nowNS is the time in ns, as the measurement takes it.
func nowNS() int64 { return time.Now().UnixNano() }

// step posts on every QP what its TX depth (and with credit, the peer's
// credits) allows, and reports whether the run is over.
func (p *bwPoster) step(credit bool) (posted, done bool, err error) {
	t := nowNS()
	p.clock(t)
	for qi := range p.wrs {
		for p.mayPost(qi, credit) {
			if err := p.post(qi, t); err != nil {
				return posted, false, err
			}
			posted = true
		}
	}
	// An unsignaled tail after the deadline completes with nothing to count.
	done = p.totC == p.totS && !p.r.durationMode && p.totC == p.total || p.stopPosting && p.pendingSignaled == 0
	return posted, done, nil
}

// clock moves the duration window to t and shows the progress line.
func (p *bwPoster) clock(t int64) {
	o, r := p.o, p.r
	if r.durationMode {
		if p.win.tick(r, t, p.totC) {
			p.stopPosting = true
		}
		p.s.progress.show(" %s %d bytes: %.0f/%.0f s", perfVerbStr[o.verb], r.size, float64(t-r.start+int64(o.margin))/1e9, o.dur.Seconds())
	} else if o.all || p.total > 100000 {
		p.s.progress.show(" %s %d bytes: %d/%d", perfVerbStr[o.verb], r.size, p.totC, p.total)
	}
}

// mayPost reports whether QP qi may post its next work request.
func (p *bwPoster) mayPost(qi int, credit bool) bool {
	if p.stopPosting || !(p.r.durationMode || p.scnt[qi] < p.iters) || p.scnt[qi]-p.ccnt[qi] >= uint64(p.o.txDepth) {
		return false
	}
	// Without a credit the peer may not have a receive posted.
	return !credit || uint32(p.scnt[qi])+1-atomic.LoadUint32(p.s.qps[qi].credit()) < uint32(p.o.rxDepth)
}

// post posts QP qi's next work request at time t, signaled every CQ
// moderation and at the last.
func (p *bwPoster) post(qi int, t int64) error {
	o, r := p.o, p.r
	wr := &p.wrs[qi]
	idx := p.scnt[qi]
	wr.ID = uint64(qi)<<40 | idx
	wr.Flags = p.flags
	if o.cqMod == 1 || idx%uint64(o.cqMod) == uint64(o.cqMod-1) || (!r.durationMode && idx == p.iters-1) {
		wr.Flags |= verbs.Signaled
	}
	if r.posted != nil {
		r.posted[p.totS] = t
	}
	if err := p.s.qps[qi].qp.PostSend(*wr); err != nil {
		return fmt.Errorf("post %s on QP %d: %w", p.opName, qi, err)
	}
	if wr.Flags&verbs.Signaled != 0 {
		p.pendingSignaled++
	}
	p.scnt[qi]++
	p.totS++
	return nil
}

// waitBW blocks for send completions, in duration mode until the
// deadline at the most: more is false when that time passed with none.
func (p *bwPoster) waitBW(rctx context.Context) (n int, more bool, err error) {
	if p.r.durationMode {
		wctx, c := context.WithDeadline(rctx, time.Unix(0, max(p.win.deadline, nowNS()+int64(time.Millisecond))))
		n, err = p.s.scq.Wait(wctx, p.wc)
		c()
		if err != nil && rctx.Err() == nil && wctx.Err() != nil {
			p.stopPosting = nowNS() >= p.win.deadline
			return 0, false, nil
		}
	} else {
		n, err = p.s.scq.Wait(rctx, p.wc)
	}
	if err != nil {
		return 0, false, stallErr(rctx, err)
	}
	return n, true, nil
}

// reap counts the n completions in wc.
func (p *bwPoster) reap(n int) error {
	t := nowNS()
	p.s.tick()
	p.pendingSignaled -= n
	return p.r.account(p.wc[:n], p.ccnt, &p.totC, t)
}

// end ends the run: its measurement, or err.
func (p *bwPoster) end(err error) (*bwRun, error) {
	if err != nil {
		return nil, err
	}
	p.r.finish(nowNS(), p.total, p.totC, &p.win)
	return p.r, nil
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
	flags := verbs.SendFlags(0)
	if size <= s.o.inline {
		flags |= verbs.Inline
	}
	wrs := make([]verbs.SendWR, len(s.qps))
	for qi, q := range s.qps {
		wrs[qi] = verbs.SendWR{Op: verbs.OpSend, SGL: []verbs.SGE{q.mr.SGE(0, size)}}
	}
	p := s.newBWPoster(size, wrs, flags, "Send")
	rctx, cancel := p.start(ctx)
	defer cancel()
	spins := 0
	for {
		posted, done, err := p.step(true)
		if done || err != nil {
			return p.end(err)
		}
		n := s.scq.Poll(p.wc)
		if n == 0 && p.pendingSignaled > 0 {
			// Completions come: block for them.
			if n, err = s.scq.Wait(rctx, p.wc); err != nil {
				return nil, stallErr(rctx, err)
			}
		} else if n == 0 {
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
		spins = 0
		if err := p.reap(n); err != nil {
			return nil, err
		}
	}
}

// sendServerSize is run_iter_bw_server: post rx_depth receives per QP,
// handshake, then receive, repost and grant credits.
func (s *perfSession) sendServerSize(ctx context.Context, size int) (*bwRun, error) {
	o := s.o
	r := &bwRun{size: size, qps: len(s.qps), gbits: o.gbits, noPeak: true, durationMode: o.dur > 0, cqMod: 1}
	v := &sendServer{s: s, o: o, size: size}
	if err := v.postRecvs(); err != nil {
		return nil, err
	}
	if _, err := s.x.handShake(ctx, s.qps[0].my, 0); err != nil {
		return nil, err
	}
	v.creditCnt = uint64(max(1, o.rxDepth/3))
	v.rcnt, v.sinceCredit = make([]uint64, len(s.qps)), make([]uint64, len(s.qps))
	v.wc, v.swc = make([]verbs.WC, 64), make([]verbs.WC, 64)
	total := uint64(o.iters) * uint64(len(s.qps))
	rctx, cancel := s.watchdog(ctx)
	defer cancel()
	v.rctx = rctx
	// In duration mode the client's handshake after its run ends ours.
	wctx := rctx
	if r.durationMode {
		var wcancel context.CancelFunc
		wctx, wcancel = s.untilPeerDone(rctx)
		defer wcancel()
	}
	r.start = nowNS()
	win := newDurWindow(r.start, o.dur, o.margin)
	var tot uint64
	for r.durationMode || tot < total {
		n, err := s.rcq.Wait(wctx, v.wc)
		if err != nil {
			if r.durationMode && rctx.Err() == nil {
				break // the client is done
			}
			return nil, stallErr(rctx, err)
		}
		t := nowNS()
		s.tick()
		for _, c := range v.wc[:n] {
			if err := v.receive(c); err != nil {
				return nil, err
			}
		}
		tot += uint64(n)
		if k := s.scq.Poll(v.swc); k > 0 {
			if err := v.credited(k); err != nil {
				return nil, err
			}
		}
		if r.durationMode {
			win.tick(r, t, tot)
			s.progress.show(" Send %d bytes: %.0f s", size, float64(t-r.start+int64(o.margin))/1e9)
		} else if o.all || total > 100000 {
			s.progress.show(" Send %d bytes: %d/%d", size, tot, total)
		}
	}
	if err := v.finish(r.durationMode); err != nil {
		return nil, err
	}
	if !r.durationMode {
		r.end, r.msgs = nowNS(), total
	} else if r.end == 0 {
		r.end, r.msgs = nowNS(), tot-win.atStart
	}
	return r, nil
}

// sendServer is the send bw server's run of one size.
type sendServer struct {
	s           *perfSession
	o           *perfOpts
	size        int
	rctx        context.Context // the watchdog's
	creditCnt   uint64          // receives a credit
	rcnt        []uint64        // receives completed, per QP
	sinceCredit []uint64        // receives since the last credit, per QP
	wc, swc     []verbs.WC      // receive, send completions
	outstanding int             // credit Writes not yet completed
}

// slot is receive slot k of q. A receive's ID is its QP and slot; without
// --verify all the receives of a QP share slot 0, as perftest's do.
func (v *sendServer) slot(q *perfQP, k int) []byte {
	off := (1 + k) * v.s.bufSize
	return q.buf[off : off+v.size]
}

func (v *sendServer) postRecv(qi, k int) error {
	q := v.s.qps[qi]
	return q.qp.PostRecv(verbs.RecvWR{ID: uint64(qi)<<32 | uint64(k), SGL: []verbs.SGE{q.mr.SGE((1+k)*v.s.bufSize, v.size)}})
}

// postRecvs posts rx_depth receives on every QP and clears its credit
// counter.
func (v *sendServer) postRecvs() error {
	s := v.s
	for qi, q := range s.qps {
		for k := 0; k < v.o.rxDepth; k++ {
			if v.o.verify {
				clear(v.slot(q, k%s.rxSlots))
			}
			if err := v.postRecv(qi, k%s.rxSlots); err != nil {
				return err
			}
		}
		binary32(q.ctrl[:4], 0)
	}
	return nil
}

// receive takes one receive completion: it checks the message (--verify),
// reposts the receive while more are to come and grants a credit every
// creditCnt receives.
func (v *sendServer) receive(c verbs.WC) error {
	o := v.o
	if err := c.Err(); err != nil {
		return err
	}
	qi, k := int(c.ID>>32), int(uint32(c.ID))
	q := v.s.qps[qi]
	if o.verify {
		if int(c.ByteLen) != v.size {
			return fmt.Errorf("--verify: QP %d received %d bytes, want %d", qi, c.ByteLen, v.size)
		}
		// The slot is this receive's alone until it is reposted;
		// clearing it makes a message that never lands fail the next
		// check.
		if err := checkPattern(v.slot(q, k), qi, "data received"); err != nil {
			return err
		}
		clear(v.slot(q, k))
	}
	v.rcnt[qi]++
	if o.dur > 0 || v.rcnt[qi]+uint64(o.rxDepth) <= uint64(o.iters) {
		if err := v.postRecv(qi, k); err != nil {
			return err
		}
	}
	v.sinceCredit[qi]++
	if v.sinceCredit[qi] != v.creditCnt {
		return nil
	}
	v.sinceCredit[qi] = 0
	for v.outstanding >= o.txDepth {
		k, err := v.s.scq.Wait(v.rctx, v.swc)
		if err != nil {
			return stallErr(v.rctx, err)
		}
		if err := v.credited(k); err != nil {
			return err
		}
	}
	return v.postCredit(qi)
}

// credited takes k completions of credit Writes from swc.
func (v *sendServer) credited(k int) error {
	for _, c := range v.swc[:k] {
		if err := c.Err(); err != nil {
			return err
		}
	}
	v.outstanding -= k
	return nil
}

// postCredit RDMA-Writes QP qi's receive count into the peer's credit
// word.
func (v *sendServer) postCredit(qi int) error {
	q := v.s.qps[qi]
	binary32(q.ctrl[:4], uint32(v.rcnt[qi]))
	if err := q.qp.PostSend(verbs.SendWR{ID: uint64(qi), Op: verbs.OpWrite, Flags: verbs.Signaled | verbs.Inline,
		SGL: []verbs.SGE{q.ctrlMR.SGE(0, 4)}, RemoteAddr: q.rem.VAddr, RKey: q.rem.RKey}); err != nil {
		return fmt.Errorf("post credit on QP %d: %w", qi, err)
	}
	v.outstanding++
	return nil
}

// finish grants a last credit for the whole count (perftest's server ends
// on one, so that a sender of several sizes knows every credit has
// landed), then waits for the credit Writes to complete.
func (v *sendServer) finish(durationMode bool) error {
	if !durationMode {
		for qi := range v.s.qps {
			if v.sinceCredit[qi] == 0 {
				continue
			}
			if err := v.postCredit(qi); err != nil {
				return err
			}
		}
	}
	for v.outstanding > 0 {
		k, err := v.s.scq.Wait(v.rctx, v.swc)
		if err != nil {
			return stallErr(v.rctx, err)
		}
		v.outstanding -= k
	}
	return nil
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
