package perftest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
	"github.com/rdmatap/rdmatap/verbs"
)

// perftest's -R parameter exchange (perftest_communication.c), byte for
// byte as the siw captures show it (testdata/siw-pcaps, stream 0):
// one rdma_cm connection to the port, one receive of
// sizeof(struct pingpong_dest) posted at a time and reposted as soon as it
// completes; every exchange is "client Sends, server Sends back"
// (ctx_xchg_data_rdma, ctx_hand_shake). The messages, in order:
//
//	version      16 B  "6.06" NUL-padded (char version[MAX_VERSION])
//	cycle_buffer  4 B  big-endian int (page size)
//	cache_line    4 B  big-endian int
//	mtu           2 B  "%d" of enum ibv_mtu ("3" = 1024) and NUL
//	handshake    56 B  struct pingpong_dest, all zero (before the test connections)
//	    ... one test connection per QP to the same port (rdma_cm) ...
//	handshake    56 B  all zero again
//	handshakes   56 B  the QPs' pingpong_dest (see the per-test sequences)
//	    ... the test ...
//	handshake    56 B  client done
//	bw report   5×8 B  size, iters (be64), bw_peak, bw_avg, msgRate (be double)
//	handshake    56 B  ctx_close_connection
//
// struct pingpong_dest on the wire (HAVE_ENDIAN): lid, out_reads, qpn,
// psn, rkey (be32), 4 pad bytes, vaddr (be64), gid[16], srqn, gid_index
// (be32) = 56 bytes.

const (
	perfDestSize  = 56
	perfSyncID    = 5 // SYNC_SPEC_ID
	perfVersion   = "6.06"
	perfMinRemVer = 5.70
)

// perfDest is struct pingpong_dest.
type perfDest struct {
	LID, OutReads, QPN, PSN, RKey uint32
	VAddr                         uint64
	GID                           [16]byte
	SRQN, GIDIndex                uint32
}

func (d perfDest) marshal(b []byte) {
	_ = b[perfDestSize-1]
	binary.BigEndian.PutUint32(b[0:], d.LID)
	binary.BigEndian.PutUint32(b[4:], d.OutReads)
	binary.BigEndian.PutUint32(b[8:], d.QPN)
	binary.BigEndian.PutUint32(b[12:], d.PSN)
	binary.BigEndian.PutUint32(b[16:], d.RKey)
	binary.BigEndian.PutUint32(b[20:], 0)
	binary.BigEndian.PutUint64(b[24:], d.VAddr)
	copy(b[32:48], d.GID[:])
	binary.BigEndian.PutUint32(b[48:], d.SRQN)
	binary.BigEndian.PutUint32(b[52:], d.GIDIndex)
}

func parseDest(b []byte) (perfDest, error) {
	if len(b) < perfDestSize {
		return perfDest{}, fmt.Errorf("perftest handshake of %d bytes, want %d", len(b), perfDestSize)
	}
	d := perfDest{LID: binary.BigEndian.Uint32(b[0:]), OutReads: binary.BigEndian.Uint32(b[4:]),
		QPN: binary.BigEndian.Uint32(b[8:]), PSN: binary.BigEndian.Uint32(b[12:]), RKey: binary.BigEndian.Uint32(b[16:]),
		VAddr: binary.BigEndian.Uint64(b[24:]), SRQN: binary.BigEndian.Uint32(b[48:]), GIDIndex: binary.BigEndian.Uint32(b[52:])}
	copy(d.GID[:], b[32:48])
	return d, nil
}

// parseRemoteVersion reads the peer's version message: a decimal number
// in a NUL-padded 16-byte field, at least 5.70 (perftest refuses older
// peers the same way). A number that is not finite is refused too.
func parseRemoteVersion(rem []byte) (string, error) {
	remVer := string(rem[:min(len(rem), 16)])
	if i := strings.IndexByte(remVer, 0); i >= 0 {
		remVer = remVer[:i]
	}
	if f, err := strconv.ParseFloat(remVer, 64); err != nil || !(f >= perfMinRemVer) || math.IsInf(f, 0) {
		return remVer, fmt.Errorf("peer's perftest version %q: current implementation is not compatible with versions older than 5.70", remVer)
	}
	return remVer, nil
}

// perfXchg is the parameter-exchange connection.
type perfXchg struct {
	client   bool
	qp       *verbs.QP
	conn     *verbs.Conn
	scq, rcq *verbs.CQ
	mr       *verbs.MR
	wc       []verbs.WC
	timeout  time.Duration
	stash    chan verbs.WC // a receive completion taken by watch
	watching bool
	trace    func(string) // perfOpts.trace
}

func newXchg(pd *verbs.PD, client bool, timeout time.Duration) (*perfXchg, error) {
	dev := pd.Device()
	x := &perfXchg{client: client, wc: make([]verbs.WC, 1), timeout: timeout}
	var err error
	if x.scq, err = dev.CreateCQ(4); err != nil {
		return nil, err
	}
	if x.rcq, err = dev.CreateCQ(4); err != nil {
		return nil, err
	}
	if x.qp, err = pd.CreateQP(verbs.QPConfig{SendCQ: x.scq, RecvCQ: x.rcq, MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}); err != nil {
		return nil, err
	}
	if _, x.mr, err = cli.RegMem(pd, 2*64, verbs.AccessLocalWrite); err != nil {
		return nil, err
	}
	return x, x.postRecv()
}

func (x *perfXchg) postRecv() error {
	return x.qp.PostRecv(verbs.RecvWR{ID: perfSyncID, SGL: []verbs.SGE{x.mr.SGE(0, perfDestSize)}})
}

func (x *perfXchg) close() {
	if x.conn != nil {
		perfDisconnect(x.conn)
	} else if x.qp != nil {
		x.qp.Close()
	}
	if x.mr != nil {
		x.mr.Dereg()
	}
}

func (x *perfXchg) wait(ctx context.Context, cq *verbs.CQ, extra time.Duration) (verbs.WC, error) {
	ctx, cancel := context.WithTimeout(ctx, x.timeout+extra)
	defer cancel()
	if _, err := cq.Wait(ctx, x.wc); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return verbs.WC{}, errors.New("the peer stopped answering on the parameter exchange connection")
		}
		return verbs.WC{}, err
	}
	wc := x.wc[0]
	if err := wc.Err(); err != nil {
		return wc, fmt.Errorf("parameter exchange: %w", err)
	}
	return wc, nil
}

// write is rdma_write_data: one signaled Send, waited for.
func (x *perfXchg) write(ctx context.Context, msg []byte) error {
	buf := x.mr.Bytes()[64:]
	copy(buf, msg)
	if err := x.qp.PostSend(verbs.SendWR{ID: perfSyncID, Op: verbs.OpSend, Flags: verbs.Signaled,
		SGL: []verbs.SGE{x.mr.SGE(64, len(msg))}}); err != nil {
		return fmt.Errorf("parameter exchange: %w", err)
	}
	_, err := x.wait(ctx, x.scq, 0)
	return err
}

// read is rdma_read_data: wait for the receive, copy it out, repost.
func (x *perfXchg) read(ctx context.Context, extra time.Duration) ([]byte, error) {
	var wc verbs.WC
	var err error
	if x.watching {
		select {
		case wc = <-x.stash:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		x.watching = false
		err = wc.Err()
	} else {
		wc, err = x.wait(ctx, x.rcq, extra)
	}
	if err != nil {
		return nil, err
	}
	if wc.Op != verbs.WCRecv {
		return nil, fmt.Errorf("parameter exchange: unexpected %v completion", wc.Op)
	}
	out := append([]byte(nil), x.mr.Bytes()[:min(int(wc.ByteLen), perfDestSize)]...)
	// The last message may be followed by the peer's close at once: a
	// failed repost only matters to a next read, which then fails.
	_ = x.postRecv()
	return out, nil
}

// watch waits for the peer's next message in the background; the returned
// channel closes when it has arrived (the next read returns it).
func (x *perfXchg) watch(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	x.stash = make(chan verbs.WC, 1)
	x.watching = true
	go func() {
		defer close(done)
		wc := make([]verbs.WC, 1)
		if _, err := x.rcq.Wait(ctx, wc); err != nil {
			wc[0] = verbs.WC{Status: verbs.StatusGeneral}
		}
		x.stash <- wc[0]
	}()
	return done
}

// xchg is ctx_xchg_data: the client writes first, the server reads first.
func (x *perfXchg) xchg(ctx context.Context, my []byte, extra time.Duration) ([]byte, error) {
	if x.client {
		if err := x.write(ctx, my); err != nil {
			return nil, err
		}
		return x.read(ctx, extra)
	}
	rem, err := x.read(ctx, extra)
	if err != nil {
		return nil, err
	}
	return rem, x.write(ctx, my)
}

// handShake is ctx_hand_shake.
func (x *perfXchg) handShake(ctx context.Context, my perfDest, extra time.Duration) (perfDest, error) {
	if x.trace != nil {
		x.trace("hs")
	}
	var b [perfDestSize]byte
	my.marshal(b[:])
	rem, err := x.xchg(ctx, b[:], extra)
	if err != nil {
		return perfDest{}, err
	}
	return parseDest(rem)
}

// versions runs exchange_versions, check_version_compatibility,
// check_sys_data and check_mtu.
func (x *perfXchg) versions(ctx context.Context) (string, error) {
	var v [16]byte
	copy(v[:], perfVersion)
	rem, err := x.xchg(ctx, v[:], 0)
	if err != nil {
		return "", err
	}
	remVer, err := parseRemoteVersion(rem)
	if err != nil {
		return remVer, err
	}
	var w [4]byte
	binary.BigEndian.PutUint32(w[:], 4096) // cycle_buffer: the page size
	if _, err := x.xchg(ctx, w[:], 0); err != nil {
		return "", err
	}
	binary.BigEndian.PutUint32(w[:], 64) // cache_line_size
	if _, err := x.xchg(ctx, w[:], 0); err != nil {
		return "", err
	}
	mtu := []byte{'0' + perfMTUEnum, 0}
	if _, err := x.xchg(ctx, mtu, 0); err != nil {
		return "", err
	}
	return remVer, nil
}

// xchgReports is xchg_bw_reports for a peer of version >= 5.33.
func (x *perfXchg) xchgReports(ctx context.Context, my perfBWReport) (perfBWReport, error) {
	var rem perfBWReport
	vals := []uint64{my.Size, my.Iters, math.Float64bits(my.Peak), math.Float64bits(my.Avg), math.Float64bits(my.MsgRate)}
	out := make([]uint64, len(vals))
	for i, v := range vals {
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], v)
		r, err := x.xchg(ctx, b[:], 0)
		if err != nil {
			return rem, err
		}
		if len(r) < 8 {
			return rem, fmt.Errorf("bw report field of %d bytes", len(r))
		}
		out[i] = binary.BigEndian.Uint64(r)
	}
	rem.Size, rem.Iters = out[0], out[1]
	rem.Peak, rem.Avg, rem.MsgRate = math.Float64frombits(out[2]), math.Float64frombits(out[3]), math.Float64frombits(out[4])
	return rem, nil
}

// perfQP is one test connection and its memory: [0:bufSize) the local
// side (source of Writes and Sends, sink of Reads), [bufSize:2*bufSize)
// the region the peer targets (Writes land, Reads are served, Sends are
// received there). A send bw server with --verify has rx-depth receive
// slots of bufSize bytes from bufSize on.
type perfQP struct {
	qp     *verbs.QP
	conn   *verbs.Conn
	mr     *verbs.MR
	buf    []byte
	ctrl   []byte // send bw: [0:4) our credit counter, [4:8) the peer's credits to us
	ctrlMR *verbs.MR
	my     perfDest
	rem    perfDest
}

// maxVerifyRecvBytes bounds the per-QP receive slots of send --verify.
const maxVerifyRecvBytes = 1 << 30

// perfSession is one side of a test after setup.
type perfSession struct {
	o        *perfOpts
	dev      *verbs.Device
	pd       *verbs.PD
	x        *perfXchg
	l        *verbs.Listener
	scq, rcq *verbs.CQ
	qps      []*perfQP
	bufSize  int
	rxSlots  int // receive buffers per QP (see perfQP)
	remVer   string
	manual   bool
	progress *progressLine
	stdout   io.Writer    // the human output (banner, table)
	jsonOut  io.Writer    // -j: the JSON document goes here
	lastTick atomic.Int64 // watchdog: time of the last progress
	// atomicPosts counts the atomics the last size posted, per QP
	// (--verify of atomic tests).
	atomicPosts []uint64
}

func (s *perfSession) close() {
	for _, q := range s.qps {
		if q.conn != nil && !s.manual {
			perfDisconnect(q.conn)
		} else if q.conn != nil {
			perfDisconnectManual(q.conn, s.linger())
		} else if q.qp != nil {
			q.qp.Close()
		}
		if q.mr != nil {
			q.mr.Dereg()
		}
		if q.ctrlMR != nil {
			q.ctrlMR.Dereg()
		}
	}
	if s.x != nil {
		s.x.close()
	}
	if s.l != nil {
		s.l.Close()
	}
	if s.scq != nil {
		s.scq.Close()
		s.rcq.Close()
	}
}

func (s *perfSession) connParams() verbs.ConnParams {
	if s.o.test == PerfLat && s.o.verb == perfWrite && s.o.client() {
		// ib_write_lat's server Writes first. A strict responder
		// (--mpa-strict, an iWARP RNIC's) waits for the initiator's
		// first FPDU (RFC 5044) unless the initiator asks for
		// peer-to-peer mode, whose RTR frees it, and this client speaks
		// only once it has been written to. librdmacm's rdma_connect
		// asks for the same.
		p2p := true
		return verbs.ConnParams{IRD: -1, ORD: -1, PeerToPeer: &p2p}
	}
	if s.o.oneSided() {
		// Atomics count against IRD/ORD as Reads do (RFC 7306).
		return verbs.ConnParams{IRD: s.o.outs, ORD: s.o.outs}
	}
	if s.o.verify && s.o.verb == perfWrite {
		// The client reads the written data back.
		return verbs.ConnParams{IRD: 1, ORD: 1}
	}
	return verbs.ConnParams{IRD: -1, ORD: -1}
}

// perfSetup connects and runs the exchange up to the test.
func perfSetup(ctx context.Context, dev *verbs.Device, o *perfOpts, stdout io.Writer) (s *perfSession, err error) {
	s = &perfSession{o: o, dev: dev, stdout: stdout, bufSize: o.bufSize(), progress: &progressLine{w: o.progress}}
	defer func() {
		if err != nil {
			s.close()
			s = nil
		}
	}()
	if s.pd, err = dev.AllocPD(); err != nil {
		return s, err
	}
	// Latency tests poll memory and drive the receive path themselves, as
	// ib_write_lat spins on its buffer (the read lat server only serves).
	s.manual = o.test == PerfLat && (o.client() || !o.oneSided())
	if s.x, err = newXchg(s.pd, o.client(), o.Timeout); err != nil {
		return s, err
	}
	s.x.trace = o.trace
	raddr := netip.AddrPortFrom(o.server, o.port)
	if o.client() {
		dctx, cancel := context.WithTimeout(ctx, o.Timeout)
		s.x.conn, err = dev.Dial(dctx, s.x.qp, raddr, verbs.ConnParams{IRD: -1, ORD: -1})
		cancel()
		if err != nil {
			return s, fmt.Errorf("cannot reach %v: %w", raddr, perfConnErr(err))
		}
	} else {
		io.WriteString(stdout, "\n************************************\n* Waiting for client to connect... *\n************************************\n")
		if s.l, err = dev.Listen(netip.AddrPortFrom(o.bind, o.port), verbs.ListenConfig{Backlog: o.qps + 4}); err != nil {
			return s, err
		}
		if o.Listening != nil {
			o.Listening(s.l.Addr())
		}
		if s.x.conn, err = s.l.Accept(ctx, s.x.qp, verbs.ConnParams{IRD: -1, ORD: -1}); err != nil {
			return s, err
		}
	}
	if s.remVer, err = s.x.versions(ctx); err != nil {
		return s, err
	}
	// create_rdma_cm_connection: handshake, connect every QP, handshake.
	if _, err = s.x.handShake(ctx, perfDest{}, 0); err != nil {
		return s, err
	}
	if err = s.connectQPs(ctx, raddr); err != nil {
		return s, err
	}
	if _, err = s.x.handShake(ctx, perfDest{}, 0); err != nil {
		return s, err
	}
	o.printBanner(stdout)
	return s, s.exchangeDests(ctx)
}

func perfConnErr(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return errors.New("connection timed out")
	}
	return err
}

const perfAccess = verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead

func (s *perfSession) connectQPs(ctx context.Context, raddr netip.AddrPort) error {
	o := s.o
	cqe := o.qps*(o.txDepth+o.rxDepth+8) + 64
	var err error
	if s.scq, err = s.dev.CreateCQ(cqe); err != nil {
		return err
	}
	if s.rcq, err = s.dev.CreateCQ(cqe); err != nil {
		return err
	}
	s.rxSlots = 1
	if o.verify && o.verb == perfSend && o.test == PerfBW && !o.client() {
		// Each posted receive gets its own slot, so that a received
		// message is checked while the next ones land elsewhere.
		s.rxSlots = o.rxDepth
		if need := uint64(s.rxSlots) * uint64(s.bufSize); need > maxVerifyRecvBytes {
			return fmt.Errorf("--verify with send gives every posted receive its own buffer: rx-depth %d x %d bytes = %d MiB, more than %d MiB; lower --rx-depth or the size",
				s.rxSlots, s.bufSize, need>>20, maxVerifyRecvBytes>>20)
		}
	}
	for i := 0; i < o.qps; i++ {
		q := &perfQP{}
		acc := perfAccess
		if o.verb == perfAtomic {
			acc |= verbs.AccessRemoteAtomic
		}
		if q.buf, q.mr, err = cli.RegMem(s.pd, (1+s.rxSlots)*s.bufSize, acc); err != nil {
			return err
		}
		s.qps = append(s.qps, q)
		if o.verb == perfRead && o.verify && !o.client() {
			// What the client will Read, written before the QP exists:
			// its first Read can come as soon as the connection is up.
			fillPattern(q.buf[s.bufSize:], i)
		}
		cfg := verbs.QPConfig{SendCQ: s.scq, RecvCQ: s.rcq, MaxSendWR: max(o.txDepth, 16) + 8, MaxRecvWR: o.rxDepth + 8,
			MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: max(o.inline, 64), ManualProgress: s.manual}
		if s.manual {
			cfg.WaitSpin = o.waitSpin
		}
		if q.qp, err = s.pd.CreateQP(cfg); err != nil {
			return err
		}
		if o.verb == perfSend && o.test == PerfBW {
			if q.ctrl, q.ctrlMR, err = cli.RegMem(s.pd, 8, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
				return err
			}
		}
		if o.client() {
			// perftest retries a refused connect 10 times, 100 ms apart:
			// its server listens for the test QPs only after the handshake.
			for try := 0; ; try++ {
				dctx, cancel := context.WithTimeout(ctx, o.Timeout)
				q.conn, err = s.dev.Dial(dctx, q.qp, raddr, s.connParams())
				cancel()
				if err == nil || try == 9 || ctx.Err() != nil || q.qp.State() != verbs.QPIdle {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				return fmt.Errorf("test connection %d to %v: %w", i, raddr, perfConnErr(err))
			}
		} else {
			actx, cancel := context.WithTimeout(ctx, o.Timeout)
			q.conn, err = s.l.Accept(actx, q.qp, s.connParams())
			cancel()
			if err != nil {
				return fmt.Errorf("test connection %d: %w", i, perfConnErr(err))
			}
		}
	}
	return nil
}

// exchangeDests runs the handshakes between the connections and the test
// (write_bw.c / send_bw.c order) and prints the address lines.
func (s *perfSession) exchangeDests(ctx context.Context) error {
	o := s.o
	outReads := uint32(1)
	if o.oneSided() {
		outReads = uint32(o.outs)
	}
	for _, q := range s.qps {
		q.my = perfDest{OutReads: outReads, QPN: q.qp.Num(), PSN: rand.Uint32() & 0xffffff,
			RKey: q.mr.RKey(), VAddr: q.mr.Addr() + uint64(s.bufSize)}
		if q.ctrlMR != nil {
			// ctx_alloc_credit: the peer RDMA-Writes its credits here.
			q.my.RKey, q.my.VAddr = q.ctrlMR.RKey(), q.ctrlMR.Addr()+4
		}
	}
	var err error
	if o.test == PerfLat && o.verb != perfSend {
		// write_lat.c, read_lat.c and atomic_lat.c shake hands once more,
		// before the per-QP handshakes: four in all, where the bw tests
		// and send_lat.c have three. One short and perftest's server
		// still waits for it when the test begins (ib_write_lat stalls),
		// or its closing handshake finds the connection gone (ib_read_lat
		// exits with status 1).
		if _, err = s.x.handShake(ctx, s.qps[0].my, 0); err != nil {
			return err
		}
	}
	for _, q := range s.qps {
		if q.rem, err = s.x.handShake(ctx, q.my, 0); err != nil {
			return err
		}
	}
	credit := o.verb == perfSend && o.test == PerfBW
	if credit {
		if _, err = s.x.handShake(ctx, s.qps[0].my, 0); err != nil {
			return err
		}
	}
	for _, q := range s.qps {
		printDest(s.stdout, "local", q.my)
	}
	for _, q := range s.qps {
		rem, err := s.x.handShake(ctx, q.my, 0)
		if err != nil {
			return err
		}
		if !credit {
			q.rem = rem
		}
		printDest(s.stdout, "remote", rem)
	}
	if !credit {
		// "An additional handshake is required after moving qp to RTR."
		if _, err = s.x.handShake(ctx, s.qps[0].my, 0); err != nil {
			return err
		}
	}
	return nil
}

// watchdog cancels the returned context when the test makes no progress
// (tick) for the timeout.
func (s *perfSession) watchdog(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	s.tick()
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				if time.Since(time.Unix(0, s.lastTick.Load())) > s.o.Timeout {
					cancel(errors.New("the test stalled: no progress from the peer"))
					return
				}
			}
		}
	}()
	return ctx, func() { close(stop); cancel(nil) }
}

func (s *perfSession) tick() { s.lastTick.Store(time.Now().UnixNano()) }

// untilPeerDone returns a context that ends with ctx or when the peer's
// next exchange message arrives: the handshake that ends its timed run.
func (s *perfSession) untilPeerDone(ctx context.Context) (context.Context, context.CancelFunc) {
	stop := s.x.watch(ctx)
	wctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-stop:
			cancel()
		case <-wctx.Done():
		}
	}()
	return wctx, cancel
}

// stallErr turns a watchdog cancel into its cause.
func stallErr(ctx context.Context, err error) error {
	if c := context.Cause(ctx); c != nil && ctx.Err() != nil && !errors.Is(c, context.Canceled) {
		return c
	}
	return err
}

// patternByte is the --verify data: byte i of QP q's message.
func patternByte(q, i int) byte { return byte(i*131+q*29+(i>>11)) ^ 0x5a }

func fillPattern(b []byte, q int) {
	for i := range b {
		b[i] = patternByte(q, i)
	}
}

func checkPattern(b []byte, q int, what string) error {
	for i := range b {
		if b[i] != patternByte(q, i) {
			return fmt.Errorf("--verify: %s: QP %d byte %d is %#02x, want %#02x", what, q, i, b[i], patternByte(q, i))
		}
	}
	return nil
}

// linger is how long a ManualProgress test QP waits for the peer to close
// first. ib_write_lat has no closing handshake: each side tears down when
// its own loop ends, and Linux siw flushes a Write it has sent whole but
// not yet retired (its last FPDU on the wire, the WQE still in progress
// under TCG) with "local QP operation error" when the peer's FIN comes
// first, failing its test. So the side that sent the last message (the
// client) waits up to a second for the server's FIN, and the server, which
// received it, up to 200 ms for the client's: long enough for siw to
// retire its last Write, and between two rdmatap endpoints the server's
// close ends both waits.
func (s *perfSession) linger() time.Duration {
	if s.o.test != PerfLat || s.o.verb != perfWrite {
		return 0
	}
	if s.o.client() {
		return time.Second
	}
	return 200 * time.Millisecond
}

// perfDisconnectManual is perfDisconnect for a ManualProgress QP, whose
// receive path runs only when someone calls WaitProgress: this goroutine
// does, first for up to linger while the peer may close first, then while
// Disconnect sends what is queued and the FIN and waits for the peer's.
// An abortive close (RST) could discard a last Write still queued.
func perfDisconnectManual(c *verbs.Conn, linger time.Duration) {
	if linger > 0 {
		lctx, cancel := context.WithTimeout(context.Background(), linger)
		for c.QP().WaitProgress(lctx) == nil {
		}
		cancel()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Disconnect(ctx) }()
	for c.QP().WaitProgress(ctx) == nil {
	}
	if <-done != nil {
		c.Close()
	}
}

// perfDisconnect closes gracefully (TCP FIN, as perftest's teardown
// shows), aborting when that takes long.
func perfDisconnect(c *verbs.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if c.Disconnect(ctx) != nil {
		c.Close()
	}
}
