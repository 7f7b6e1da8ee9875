package verbs_test

import (
	"context"
	"encoding/binary"
	"errors"
	stdflag "flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
	"github.com/rdmatap/rdmatap/verbs/service"
	"github.com/rdmatap/rdmatap/zerocopy"
)

// FuzzServiceSession mutates whole sessions of a hostile client rather
// than single messages: the input is a program of steps (requests whose
// arguments are often handles the service handed out earlier, so that deep
// states are reached; descriptors of every kind; ring entries written into
// the rings the service made, with the doorbell rung; corrupted ring
// indexes and control page; a peer dialing the client's listeners; the
// connection closed mid-way). Whatever the program does, the session must
// be released once the client has gone, the service must serve a fresh
// well-behaved client, and a client running beside it must go on moving
// and checking data undisturbed.
func FuzzServiceSession(f *testing.F) {
	boundMinimizing()
	env := newSessEnv(f)
	for _, seed := range sessSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, prog []byte) {
		env.run(t, prog)
	})
}

// boundMinimizing limits the minimizing of inputs to a few runs, unless
// -test.fuzzminimizetime says otherwise. An input's coverage here depends
// on timing as well as on the input (the service's poller and the
// network stack run beside the session), so inputs keep looking new for
// a while, and the fuzzer's default minute of minimizing each one took
// almost all of a run: 11 inputs fuzzed in two minutes, the rest spent
// minimizing.
func boundMinimizing() {
	set := false
	stdflag.Visit(func(fl *stdflag.Flag) { set = set || fl.Name == "test.fuzzminimizetime" })
	if !set {
		stdflag.Set("test.fuzzminimizetime", "20x")
	}
}

// Step kinds: the first byte of each step, modulo sessSteps.
const (
	stReq     = 0 // 0-6 and 15: a request built from the request table
	stRaw     = 7
	stRing    = 8 // 8-10: entries into one of the rings, and the doorbell
	stCorrupt = 11
	stCtl     = 12
	stPeer    = 13
	stClose   = 14
	sessSteps = 16
)

// Bounds of one input: how many steps run, and for how long, so that a
// long input costs no more than a short one.
const (
	sessMaxSteps = 48
	sessBudget   = 4 * time.Second
	// replyWait bounds the wait for a reply to a request that cannot
	// block: a service that does not answer within it hangs.
	replyWait = 10 * time.Second
	// blockWait bounds the wait for a call that may block (dial, accept,
	// disconnect, destroy): past it the call stays pending.
	blockWait = 500 * time.Millisecond
)

// Argument kinds of the request table: most pick a handle the service
// gave this session (or a small value), any of them a random 64-bit word
// now and then.
type sessArg uint8

const (
	aPD sessArg = iota
	aCQ
	aSRQOpt // 0 (no SRQ) most of the time
	aSRQ
	aQP
	aMRAny // a regular or fast-register MR
	aFR
	aMW
	aLn
	aReq
	aSeq // a call in progress (CANCEL)
	aWR
	aSGE
	aCQE
	aInline
	aAccess
	aVA
	aLen
	aOff
	aPages
	aPageSize
	aMapMode
	aMWType
	aStag
	aByte
	aTri
)

// Payload kinds.
type sessPay uint8

const (
	pNone sessPay = iota
	pListen
	pDial
	pDialLocal // pDial's fields and a local address
	pPData
	pMap
)

type sessReq struct {
	t    svc.Type
	args []sessArg
	pay  sessPay
}

// sessReqs is the request table (its index is the byte after a request
// step's kind).
var sessReqs = []sessReq{
	{svc.TAllocPD, nil, pNone},
	{svc.TCreateCQ, []sessArg{aCQE}, pNone},
	{svc.TCreateQP, []sessArg{aPD, aCQ, aCQ, aSRQOpt, aWR, aWR, aSGE, aSGE, aInline, aByte}, pNone},
	{svc.TCreateSRQ, []sessArg{aPD, aWR, aSGE}, pNone},
	{svc.TRegMR, []sessArg{aPD, aVA, aLen, aAccess, aOff, aVA}, pNone},
	{svc.TDeregMR, []sessArg{aMRAny}, pNone},
	{svc.TDeallocPD, []sessArg{aPD}, pNone},
	{svc.TDestroyCQ, []sessArg{aCQ}, pNone},
	{svc.TDestroySRQ, []sessArg{aSRQ}, pNone},
	{svc.TSRQLimit, []sessArg{aSRQ, aByte}, pNone},
	{svc.TDestroyQP, []sessArg{aQP}, pNone},
	{svc.TQueryQP, []sessArg{aQP}, pNone},
	{svc.TDisconnect, []sessArg{aQP}, pNone},
	{svc.TDial, []sessArg{aQP, aByte, aByte, aTri, aByte, aTri, aByte, aTri}, pDial},
	{svc.TListen, []sessArg{aByte, aByte}, pListen},
	{svc.TCloseListener, []sessArg{aLn}, pNone},
	{svc.TGetRequest, []sessArg{aLn}, pNone},
	{svc.TAccept, []sessArg{aReq, aQP, aByte, aByte, aTri, aByte, aTri, aByte, aTri}, pPData},
	{svc.TReject, []sessArg{aReq}, pPData},
	{svc.TCancel, []sessArg{aSeq}, pNone},
	{svc.TAllocMR, []sessArg{aPD, aPages}, pNone},
	{svc.TMapMR, []sessArg{aFR, aMapMode, aPageSize, aByte, aLen}, pMap},
	{svc.TSetIOVA, []sessArg{aFR, aVA}, pNone},
	{svc.TAllocMW, []sessArg{aPD, aMWType}, pNone},
	{svc.TDeallocMW, []sessArg{aMW}, pNone},
	{svc.TBindMW, []sessArg{aQP, aMW, aByte, aByte, aStag, aVA, aLen, aAccess}, pNone},
	{svc.TQueryMem, []sessArg{aMRAny}, pNone},
	{svc.TStats, nil, pNone},
	{svc.TQueryPort, []sessArg{aByte}, pNone},
	{svc.TQPError, []sessArg{aQP}, pNone},
	{svc.TQueryDevice, nil, pNone},
	{svc.TDial, []sessArg{aQP, aByte, aByte, aTri, aByte, aTri, aByte, aTri}, pDialLocal},
}

// Indexes into sessReqs, for the seeds.
const (
	rAllocPD = iota
	rCreateCQ
	rCreateQP
	rCreateSRQ
	rRegMR
	rDeregMR
	rDeallocPD
	rDestroyCQ
	rDestroySRQ
	rSRQLimit
	rDestroyQP
	rQueryQP
	rDisconnect
	rDial
	rListen
	rCloseListener
	rGetRequest
	rAccept
	rReject
	rCancel
	rAllocMR
	rMapMR
	rSetIOVA
	rAllocMW
	rDeallocMW
	rBindMW
	rQueryMem
	rStats
	rQueryPort
	rQPError
	rQueryDevice
	rDialLocal
)

// Descriptor kinds a request may carry (REG_MR's one descriptor, or
// descriptors nobody asked for).
const (
	fdShared   = iota // the sealed memfd of zerocopy.AllocShared
	fdUnsealed        // a memfd with no seals
	fdShrunk          // a memfd shrunk to nothing, then sealed against shrinking
	fdRingFile        // a small sealed memfd of svc.NewMemfd
	fdPipe
	fdEventfd
	fdDevNull
	fdSocket
	fdDir
	fdKinds
)

// sessVABase is where the client claims its registrations lie: the
// service takes the address as a label, so any will do, and a fixed one
// keeps an input's run the same every time.
const sessVABase = 0x7f00_0000_0000

// sessSharedBytes is the size of the sealed memfd sessions register from.
const sessSharedBytes = 256 << 10

// sessEnv is what every input of a fuzzing process shares: a service on
// one end of a link, a peer on the other that accepts every connection
// (and writes back into the initiator's memory when asked), and a
// bystander client of the same service moving data to the peer.
type sessEnv struct {
	p        *pair
	path     string
	srv      *service.Server
	log      sessLog
	peerAddr netip.Addr
	svcAddr  netip.Addr
	sink     netip.AddrPort
	closed   netip.AddrPort // a port of the peer nobody listens on
	mem      *zerocopy.Buffer
	by       *sessBystander
	peerPD   *verbs.PD
	baseFDs  int
	baseMaps int
}

// sessLog keeps the service's last log lines (they go into a failure's
// message; an unbounded log would grow for the whole fuzzing run).
type sessLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *sessLog) logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) >= 64 {
		l.lines = append(l.lines[:0], l.lines[32:]...)
	}
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

func (l *sessLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

func newSessEnv(f *testing.F) *sessEnv {
	e := &sessEnv{p: newPair(f, verbs.DeviceConfig{}, verbs.DeviceConfig{})}
	e.peerAddr = e.p.nb.Addrs()[0].Addr()
	e.svcAddr = e.p.na.Addrs()[0].Addr()
	e.path = filepath.Join(f.TempDir(), "rt0.sock")
	ln, err := service.ListenSocket(e.path, -1)
	if err != nil {
		f.Fatal(err)
	}
	if e.srv, err = service.Serve(e.p.a, ln, service.Config{Logf: e.log.logf}); err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sink, err := e.p.b.Listen(netip.AddrPort{}, verbs.ListenConfig{})
	if err != nil {
		f.Fatal(err)
	}
	sinkDone := make(chan struct{})
	go func() { sinkPeer(ctx, e.p.b, sink); close(sinkDone) }()
	e.sink = netip.AddrPortFrom(e.peerAddr, sink.Addr().Port())
	// A port nobody listens on: one a listener had and gave back.
	l2, err := e.p.b.Listen(netip.AddrPort{}, verbs.ListenConfig{})
	if err != nil {
		f.Fatal(err)
	}
	e.closed = netip.AddrPortFrom(e.peerAddr, l2.Addr().Port())
	l2.Close()
	if e.peerPD, err = e.p.b.AllocPD(); err != nil {
		f.Fatal(err)
	}
	if e.mem, err = zerocopy.AllocShared("fuzz-session", sessSharedBytes); err != nil {
		f.Fatal(err)
	}
	if e.by, err = newSessBystander(ctx, e.path, e.p.b, e.peerAddr); err != nil {
		f.Fatal(err)
	}
	// The service and the devices go first (newPair's cleanup runs
	// after this one).
	f.Cleanup(func() {
		e.by.d.Close()
		e.by.mem.Close()
		e.srv.Close()
		cancel()
		sink.Close()
		<-sinkDone
		e.mem.Close()
	})
	e.baseFDs, e.baseMaps = sessCounts(f)
	return e
}

// sessCounts returns the process's open descriptors and memfd mappings.
func sessCounts(t testing.TB) (fds, maps int) {
	c := countProc(t)
	return c.fds, c.memfdMaps
}

// sessBystander is a well-behaved client beside the hostile one: it
// RDMA-Writes a pattern into a peer's memory and reads it back, checking
// every byte, round after round.
type sessBystander struct {
	d      *verbs.Device
	qp     *verbs.QP
	cq     *verbs.CQ
	mr     *verbs.MR
	mem    *zerocopy.Buffer
	peer   verbs.RemoteBuf
	rounds atomic.Uint64
	stop   chan struct{}
	done   chan error
}

func newSessBystander(ctx context.Context, path string, peer *verbs.Device, peerAddr netip.Addr) (*sessBystander, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// The peer's end: one connection, 64 KiB it may write and read.
	l, err := peer.Listen(netip.AddrPort{}, verbs.ListenConfig{})
	if err != nil {
		return nil, err
	}
	defer l.Close()
	ppd, err := peer.AllocPD()
	if err != nil {
		return nil, err
	}
	pmr, err := ppd.RegMR(make([]byte, 64<<10), verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	if err != nil {
		return nil, err
	}
	pcq, err := peer.CreateCQ(4)
	if err != nil {
		return nil, err
	}
	pqp, err := ppd.CreateQP(verbs.QPConfig{SendCQ: pcq, RecvCQ: pcq})
	if err != nil {
		return nil, err
	}
	pdata, _ := pmr.Remote().MarshalBinary()
	accepted := make(chan error, 1)
	go func() {
		req, err := l.GetRequest(dctx)
		if err == nil {
			_, err = req.Accept(dctx, pqp, verbs.ConnParams{PrivateData: pdata})
		}
		accepted <- err
	}()
	d, err := verbs.Connect(dctx, path)
	if err != nil {
		return nil, err
	}
	b := &sessBystander{d: d}
	pd, err := d.AllocPD()
	if err != nil {
		return nil, err
	}
	if b.cq, err = d.CreateCQ(16); err != nil {
		return nil, err
	}
	if b.qp, err = pd.CreateQP(verbs.QPConfig{SendCQ: b.cq, RecvCQ: b.cq}); err != nil {
		return nil, err
	}
	if b.mem, err = zerocopy.AllocShared("fuzz-bystander", 64<<10); err != nil {
		return nil, err
	}
	if b.mr, err = pd.RegMR(b.mem.Bytes(), verbs.AccessLocalWrite); err != nil {
		return nil, err
	}
	conn, err := d.Dial(dctx, b.qp, netip.AddrPortFrom(peerAddr, l.Addr().Port()), verbs.ConnParams{})
	if err != nil {
		return nil, err
	}
	if err := <-accepted; err != nil {
		return nil, err
	}
	if err := b.peer.UnmarshalBinary(conn.PeerPrivateData()); err != nil {
		return nil, err
	}
	return b, nil
}

// start runs rounds until halt.
func (b *sessBystander) start() {
	b.stop, b.done = make(chan struct{}), make(chan error, 1)
	go func() { b.done <- b.loop() }()
}

func (b *sessBystander) loop() error {
	const n = 4096
	buf := b.mem.Bytes()
	for i := b.rounds.Load(); ; i++ {
		select {
		case <-b.stop:
			return nil
		default:
		}
		fill(buf[:n], i)
		clear(buf[n : 2*n])
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := b.qp.PostSend(verbs.SendWR{ID: 1, Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{b.mr.SGE(0, n)},
			RemoteAddr: b.peer.Addr, RKey: b.peer.RKey})
		if err == nil {
			_, err = waitWC(ctx, b.cq, verbs.WCWrite, n)
		}
		if err == nil {
			err = b.qp.PostSend(verbs.SendWR{ID: 2, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{b.mr.SGE(n, n)},
				RemoteAddr: b.peer.Addr, RKey: b.peer.RKey})
		}
		if err == nil {
			_, err = waitWC(ctx, b.cq, verbs.WCRead, n)
		}
		cancel()
		if err != nil {
			return fmt.Errorf("round %d: %w", i, err)
		}
		for k := 0; k < n; k++ {
			if buf[n+k] != buf[k] {
				return fmt.Errorf("round %d: byte %d read back as %#x, written %#x", i, k, buf[n+k], buf[k])
			}
		}
		b.rounds.Add(1)
	}
}

// halt stops the rounds and returns the first error.
func (b *sessBystander) halt() error {
	close(b.stop)
	return <-b.done
}

// sessRing is a ring the service handed the session.
type sessRing struct {
	kind byte // 's' SQ, 'r' RQ, 'q' SRQ, 'c' CQ
	ring *svc.Ring
	mem  []byte // the ring's part of its mapping (its header first)
}

type sessMR struct {
	h    uint64
	stag uint32
	va   uint64
	n    uint64
}

// sessRun is one input's session: the program, what the service has
// handed out, and the calls still in progress.
type sessRun struct {
	t    *testing.T
	env  *sessEnv
	r    *rawClient
	prog []byte
	dead bool // the session has ended (the service ended it, or the program closed it)
	b    svc.Builder

	pds, cqs, srqs, frs, mws, lns, reqs []uint64
	qps                                 []uint32
	mrs                                 []sessMR
	stags                               []uint32
	remotes                             []verbs.RemoteBuf
	lnPorts                             map[uint64]uint16
	rings                               []sessRing
	maps                                [][]byte
	sent                                map[uint32]svc.Msg // requests without a reply yet, by seq
	getReq                              map[uint64]uint32  // a GET_REQUEST in progress on a listener: its seq
	ctx                                 context.Context
	cancel                              context.CancelFunc
	peers                               sync.WaitGroup
}

func (e *sessEnv) run(t *testing.T, prog []byte) {
	e.by.start()
	byHalted := false
	defer func() {
		if !byHalted {
			e.by.halt()
		}
	}()
	r, m := dialRaw(t, e.path, svc.Version)
	if m.Status() != svc.StatusOK {
		t.Fatalf("HELLO: status %d", m.Status())
	}
	s := &sessRun{t: t, env: e, r: r, prog: prog, lnPorts: map[uint64]uint16{}, sent: map[uint32]svc.Msg{}, getReq: map[uint64]uint32{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	start := time.Now()
	for step := 0; step < sessMaxSteps && len(s.prog) > 0 && !s.dead && time.Since(start) < sessBudget; step++ {
		s.step()
	}
	// The client goes: whatever it left behind is the service's to
	// release.
	r.conn.Close()
	s.cancel()
	s.peers.Wait()
	for _, m := range s.maps {
		svc.Unmap(m)
	}
	svc.Unmap(r.ctl)
	r.bell.Close()
	deadline := time.Now().Add(15 * time.Second)
	for e.srv.Clients() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions 15 s after the hostile client left (want the bystander's alone)\nservice log:\n%s\n%s",
				e.srv.Clients(), e.log.String(), allStacks())
		}
		time.Sleep(100 * time.Microsecond)
	}
	// A fresh well-behaved client is served.
	if err := e.freshClient(); err != nil {
		t.Fatalf("a fresh client after the hostile session: %v\nservice log:\n%s", err, e.log.String())
	}
	// The bystander has gone on: a round after the session ended, and
	// every round checked.
	after := e.by.rounds.Load()
	for deadline := time.Now().Add(15 * time.Second); e.by.rounds.Load() <= after; {
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Microsecond)
	}
	byHalted = true
	if err := e.by.halt(); err != nil {
		t.Fatalf("the bystander client: %v\nservice log:\n%s", err, e.log.String())
	}
	if e.by.rounds.Load() <= after {
		t.Fatalf("the bystander client made no progress for 15 s after the hostile session\nservice log:\n%s", e.log.String())
	}
	// Everything the session held is released: descriptors and memfd
	// mappings (the service's and this test's) are back where they were.
	// (The fresh client's rings stay mapped until the collector finds
	// its CQ and QP unreachable: collect.)
	for deadline := time.Now().Add(5 * time.Second); ; {
		runtime.GC()
		fds, maps := sessCounts(t)
		if fds <= e.baseFDs && maps <= e.baseMaps {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d descriptors and %d memfd mappings after the session, %d and %d before\nservice log:\n%s",
				fds, maps, e.baseFDs, e.baseMaps, e.log.String())
		}
		time.Sleep(time.Millisecond)
	}
}

// freshClient connects a client that does everything right, registers
// memory and leaves.
func (e *sessEnv) freshClient() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := verbs.Connect(ctx, e.path)
	if err != nil {
		return err
	}
	defer func() {
		d.Close()
		for deadline := time.Now().Add(10 * time.Second); e.srv.Clients() > 1 && time.Now().Before(deadline); {
			time.Sleep(100 * time.Microsecond)
		}
	}()
	pd, err := d.AllocPD()
	if err != nil {
		return fmt.Errorf("AllocPD: %w", err)
	}
	cq, err := d.CreateCQ(16)
	if err != nil {
		return fmt.Errorf("CreateCQ: %w", err)
	}
	mr, err := pd.RegMR(e.mem.Bytes()[:64<<10], verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		return fmt.Errorf("RegMR: %w", err)
	}
	if _, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq}); err != nil {
		return fmt.Errorf("CreateQP: %w", err)
	}
	return mr.Dereg()
}

func allStacks() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

// --- reading the program ---

func (s *sessRun) byte() byte {
	if len(s.prog) == 0 {
		return 0
	}
	c := s.prog[0]
	s.prog = s.prog[1:]
	return c
}

func (s *sessRun) u32() uint32 {
	var b [4]byte
	n := copy(b[:], s.prog)
	s.prog = s.prog[n:]
	return binary.LittleEndian.Uint32(b[:])
}

func (s *sessRun) u64() uint64 {
	var b [8]byte
	n := copy(b[:], s.prog)
	s.prog = s.prog[n:]
	return binary.LittleEndian.Uint64(b[:])
}

func (s *sessRun) bytes(n int) []byte {
	n = min(n, len(s.prog))
	p := s.prog[:n:n]
	s.prog = s.prog[n:]
	return p
}

func pick[T any](s []T, sel byte) (T, bool) {
	var z T
	if len(s) == 0 {
		return z, false
	}
	return s[int(sel)%len(s)], true
}

// arg makes one argument: a selector byte picks from what the kind
// offers; a selector of 0xf0 or more takes the next 8 bytes as is.
func (s *sessRun) arg(k sessArg) uint64 {
	sel := s.byte()
	if sel >= 0xf0 {
		return s.u64()
	}
	or := func(v uint64, ok bool) uint64 {
		if ok {
			return v
		}
		return uint64(sel)
	}
	switch k {
	case aPD:
		return or(pick(s.pds, sel))
	case aCQ:
		return or(pick(s.cqs, sel))
	case aSRQOpt:
		if sel%4 != 3 {
			return 0
		}
		return or(pick(s.srqs, sel/4))
	case aSRQ:
		return or(pick(s.srqs, sel))
	case aQP:
		q, ok := pick(s.qps, sel)
		return or(uint64(q), ok)
	case aMRAny:
		hs := append([]uint64(nil), s.frs...)
		for _, m := range s.mrs {
			hs = append(hs, m.h)
		}
		return or(pick(hs, sel))
	case aFR:
		return or(pick(s.frs, sel))
	case aMW:
		return or(pick(s.mws, sel))
	case aLn:
		return or(pick(s.lns, sel))
	case aReq:
		return or(pick(s.reqs, sel))
	case aSeq:
		var seqs []uint64
		for q := range s.sent {
			seqs = append(seqs, uint64(q))
		}
		if len(seqs) > 1 {
			// (map order is random: keep an input's run the same)
			for i := 1; i < len(seqs); i++ {
				for j := i; j > 0 && seqs[j] < seqs[j-1]; j-- {
					seqs[j], seqs[j-1] = seqs[j-1], seqs[j]
				}
			}
		}
		return or(pick(seqs, sel))
	case aWR:
		return 1 + uint64(sel%16)
	case aSGE:
		return 1 + uint64(sel%4)
	case aCQE:
		return 1 + uint64(sel)*4
	case aInline:
		return []uint64{0, 64, 256, 4096}[sel%4]
	case aAccess:
		return uint64(sel & 0x3f)
	case aVA:
		return sessVABase + uint64(sel%64)*4096
	case aLen:
		return []uint64{4096, 8192, 64 << 10, sessSharedBytes, 1, 4095, 100}[int(sel)%7]
	case aOff:
		return uint64(sel%64) * 4096
	case aPages:
		return 1 + uint64(sel%32)
	case aPageSize:
		return []uint64{4096, 512, 8192, 3000, 64 << 10, 0}[int(sel)%6]
	case aMapMode:
		return []uint64{svc.MapPages | svc.MapFirst | svc.MapLast, svc.MapSG | svc.MapFirst | svc.MapLast,
			svc.MapPages | svc.MapFirst, svc.MapPages | svc.MapLast, svc.MapSG | svc.MapFirst, 7 | svc.MapLast}[int(sel)%6]
	case aMWType:
		return uint64(sel % 3)
	case aStag:
		v, ok := pick(s.stags, sel)
		return or(uint64(v), ok)
	case aTri:
		return uint64(sel % 3)
	}
	return uint64(sel)
}

// --- steps ---

// sessTrace logs every step of every input (RDMATAP_FUZZ_TRACE=1 with
// -v): to see what a seed or a crasher does.
var sessTrace = os.Getenv("RDMATAP_FUZZ_TRACE") != ""

func (s *sessRun) tracef(format string, args ...any) {
	if sessTrace {
		s.t.Logf(format, args...)
	}
}

func (s *sessRun) step() {
	k := s.byte() % sessSteps
	s.tracef("step %d, %d bytes left", k, len(s.prog))
	switch k {
	case stRaw:
		s.rawRequest()
	case stRing, stRing + 1, stRing + 2:
		s.ringStep()
	case stCorrupt:
		s.corrupt()
	case stCtl:
		svc.U32(s.r.ctl, svc.CtlSleeping).Store(s.u32())
		s.r.bell.Signal()
	case stPeer:
		s.peerDial()
	case stClose:
		s.r.conn.Close()
		s.dead = true
	default:
		s.request()
	}
}

func blockingType(t svc.Type) bool {
	switch t {
	case svc.TDial, svc.TGetRequest, svc.TAccept, svc.TReject, svc.TDisconnect, svc.TDestroyQP, svc.TQPError:
		return true
	}
	return false
}

// request sends one request of the table with arguments, payload and
// descriptors from the program, and waits for its reply (a GET_REQUEST
// stays in progress until a peer dials; CANCEL has no reply).
func (s *sessRun) request() {
	spec := sessReqs[int(s.byte())%len(sessReqs)]
	args := make([]uint64, len(spec.args))
	for i, k := range spec.args {
		args[i] = s.arg(k)
	}
	if spec.t == svc.TRegMR {
		// The address sits at the file offset within its page, mostly.
		if s.byte() < 0xe0 {
			args[4] = args[1] - sessVABase
		}
	}
	s.r.seq++
	seq := s.r.seq
	s.b.Reset(spec.t, seq, 0).Args(args...)
	switch spec.pay {
	case pListen:
		s.b.String(s.listenAddr())
	case pDial:
		s.b.String(s.dialAddr()).Bytes(s.pdata())
	case pDialLocal:
		s.b.String(s.dialAddr()).Bytes(s.pdata()).String(s.localAddr())
	case pPData:
		s.b.Bytes(s.pdata())
	case pMap:
		s.b.Bytes(s.mapEntries(args[1]&0xff == svc.MapSG))
	}
	m := append(svc.Msg(nil), s.b.Msg()...)
	var fds []int
	sel := s.byte()
	switch {
	case spec.t == svc.TRegMR && sel < 0xe0:
		fds = []int{s.makeFD(int(sel) % fdKinds)}
	case sel >= 0xe0:
		for i := 0; i < int(sel-0xe0)%6; i++ {
			fds = append(fds, s.makeFD(int(s.byte())%fdKinds))
		}
	}
	s.send(m, seq, spec.t, fds)
}

// send writes a request with its descriptors (closed after) and waits for
// the reply as the request's type allows.
func (s *sessRun) send(m svc.Msg, seq uint32, t svc.Type, fds []int) {
	err := s.write(m, fds)
	for _, fd := range fds {
		if fd != s.env.mem.Fd() {
			unix.Close(fd)
		}
	}
	if err != nil {
		return
	}
	if len(m) == 0 {
		s.dead = true // an empty datagram is an end of file
		return
	}
	s.tracef("%v seq %d, %d descriptors", t, seq, len(fds))
	s.sent[seq] = m
	switch {
	case len(fds) > svc.MaxFDs:
		// The service cannot read the message: its error names no
		// request.
		delete(s.sent, seq)
		s.await(0, replyWait, true)
	case t == svc.TCancel:
		delete(s.sent, seq)
	case t == svc.TGetRequest:
		s.getReq[m.Arg(0)] = seq
	case blockingType(t):
		s.await(seq, blockWait, false)
	default:
		s.await(seq, replyWait, true)
	}
}

// write sends a datagram; a service that reads none for replyWait hangs.
// An error means the datagram did not go (the session is over, or the
// kernel refused it).
func (s *sessRun) write(m svc.Msg, fds []int) error {
	s.r.conn.SetWriteDeadline(time.Now().Add(replyWait))
	err := svc.Write(s.r.conn, m, fds...)
	s.r.conn.SetWriteDeadline(time.Time{})
	var ne net.Error
	switch {
	case err == nil, errors.Is(err, syscall.EMSGSIZE), errors.Is(err, syscall.ENOBUFS):
	case errors.As(err, &ne) && ne.Timeout():
		s.t.Fatalf("the service read nothing from the session for %v\nservice log:\n%s\n%s", replyWait, s.env.log.String(), allStacks())
	default:
		s.dead = true // the service ended the session
	}
	return err
}

// rawRequest sends bytes of the program as a datagram (its Seq field
// replaced, so that its reply is known), with a reply awaited when one
// is due.
func (s *sessRun) rawRequest() {
	n := int(s.byte()) * 2
	m := append(svc.Msg(nil), s.bytes(n)...)
	s.r.seq++
	seq := s.r.seq
	t := svc.Type(0)
	if len(m) >= svc.HeaderSize {
		binary.LittleEndian.PutUint32(m[4:], seq)
		t = svc.Type(binary.LittleEndian.Uint16(m))
	} else {
		seq = 0 // the service's error for it names no request
	}
	if len(m) >= svc.HeaderSize && m.Check() == nil && (blockingType(t) || t == svc.TCancel) {
		// What a well-formed blocking call's reply needs is a peer: do not
		// wait for it.
		if s.write(m, nil) != nil {
			return
		}
		if t == svc.TGetRequest {
			s.sent[seq] = m
			s.getReq[m.Arg(0)] = seq
		} else if t != svc.TCancel {
			s.sent[seq] = m
		}
		return
	}
	s.send(m, seq, svc.TStats, nil)
}

// await reads until the reply numbered seq, noting what other replies
// hand out. A request that cannot block must be answered (must says so).
func (s *sessRun) await(seq uint32, wait time.Duration, must bool) {
	c := s.r.conn
	c.SetReadDeadline(time.Now().Add(wait))
	defer c.SetReadDeadline(time.Time{})
	for {
		m, fds, err := svc.Read(c, s.r.buf, s.r.oob, nil)
		if err != nil {
			var ne net.Error
			switch {
			case errors.As(err, &ne) && ne.Timeout():
				if must {
					s.t.Fatalf("no reply to request %d (%v) in %v\nservice log:\n%s", seq, s.sent[seq].Type(), wait, s.env.log.String())
				}
				return
			case errors.Is(err, net.ErrClosed), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
				s.dead = true
				return
			}
			s.t.Fatalf("reading from the service: %v", err)
		}
		if err := m.Check(); err != nil {
			s.t.Fatalf("the service sent a malformed message: %v", err)
		}
		s.note(m, fds)
		if (m.Type() != svc.TEvent && m.Type() != svc.TQPDone && m.Seq() == seq) || (seq == 0 && m.Type() == svc.TError) {
			s.tracef("  reply %v seq %d: status %d", m.Type(), m.Seq(), m.Status())
			return
		}
	}
}

// note records what a reply hands out and maps the rings it carries.
func (s *sessRun) note(m svc.Msg, fds []int) {
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	if m.Type() == svc.TEvent || m.Type() == svc.TQPDone {
		return
	}
	req, ok := s.sent[m.Seq()]
	if !ok {
		return
	}
	delete(s.sent, m.Seq())
	if req.Check() != nil {
		return // a malformed request: its reply is an error
	}
	if req.Type() == svc.TGetRequest {
		delete(s.getReq, req.Arg(0))
	}
	if m.Status() != svc.StatusOK || m.Type() != req.Type() {
		return
	}
	switch m.Type() {
	case svc.TAllocPD:
		s.pds = append(s.pds, m.Arg(0))
	case svc.TCreateCQ:
		s.cqs = append(s.cqs, m.Arg(0))
		if len(fds) > 0 {
			s.mapRings(fds[0], 'c', 0)
		}
	case svc.TCreateQP:
		s.qps = append(s.qps, uint32(m.Arg(0)))
		if len(fds) > 0 {
			s.mapRings(fds[0], 's', int(m.Arg(1)))
		}
	case svc.TCreateSRQ:
		s.srqs = append(s.srqs, m.Arg(0))
		if len(fds) > 0 {
			s.mapRings(fds[0], 'q', 0)
		}
	case svc.TRegMR:
		s.mrs = append(s.mrs, sessMR{h: m.Arg(0), stag: uint32(m.Arg(1)), va: req.Arg(1), n: req.Arg(2)})
		s.stags = append(s.stags, uint32(m.Arg(1)))
	case svc.TAllocMR:
		s.frs = append(s.frs, m.Arg(0))
		s.stags = append(s.stags, uint32(m.Arg(1)))
	case svc.TAllocMW:
		s.mws = append(s.mws, m.Arg(0))
		s.stags = append(s.stags, uint32(m.Arg(1)))
	case svc.TBindMW:
		s.stags = append(s.stags, uint32(m.Arg(0)))
	case svc.TListen:
		s.lns = append(s.lns, m.Arg(0))
		s.lnPorts[m.Arg(0)] = uint16(m.Arg(1))
	case svc.TGetRequest:
		s.reqs = append(s.reqs, m.Arg(0))
	case svc.TDial, svc.TAccept:
		var f [3][]byte
		svc.Fields(m.Payload(), f[:])
		var rb verbs.RemoteBuf
		if rb.UnmarshalBinary(f[2]) == nil {
			s.remotes = append(s.remotes, rb)
			s.stags = append(s.stags, rb.RKey)
		}
	}
}

// mapRings maps a ring file: a CQ's or SRQ's ring, or a QP's SQ (sqBytes
// long) and its RQ after it unless the QP uses an SRQ.
func (s *sessRun) mapRings(fd int, kind byte, sqBytes int) {
	mem, err := svc.MapRing(fd)
	if err != nil {
		s.t.Fatalf("mapping a ring the service sent: %v", err)
	}
	s.maps = append(s.maps, mem)
	if kind != 's' {
		s.addRing(kind, mem)
		return
	}
	if sqBytes <= 0 || sqBytes > len(mem) {
		s.t.Fatalf("CREATE_QP: SQ of %d bytes in a ring file of %d", sqBytes, len(mem))
	}
	s.addRing('s', mem[:sqBytes])
	if sqBytes < len(mem) {
		s.addRing('r', mem[sqBytes:])
	}
}

func (s *sessRun) addRing(kind byte, mem []byte) {
	ring, err := svc.OpenRing(mem)
	if err != nil {
		s.t.Fatalf("a ring the service sent: %v", err)
	}
	s.rings = append(s.rings, sessRing{kind: kind, ring: ring, mem: mem})
}

// makeFD makes a descriptor of a kind (the caller closes it, unless it
// is the shared memfd).
func (s *sessRun) makeFD(kind int) int {
	t := s.t
	must := func(fd int, err error) int {
		if err != nil {
			t.Fatalf("making a descriptor of kind %d: %v", kind, err)
		}
		return fd
	}
	switch kind {
	case fdShared:
		return s.env.mem.Fd()
	case fdUnsealed:
		fd := must(unix.MemfdCreate("fuzz-unsealed", unix.MFD_CLOEXEC))
		unix.Ftruncate(fd, sessSharedBytes)
		return fd
	case fdShrunk:
		fd := must(unix.MemfdCreate("fuzz-shrunk", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING))
		unix.Ftruncate(fd, sessSharedBytes)
		unix.Ftruncate(fd, 0)
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK); err != nil {
			t.Fatal(err)
		}
		return fd
	case fdRingFile:
		fd, mem, err := svc.NewMemfd("fuzz-small", 8192)
		must(fd, err)
		svc.Unmap(mem)
		return fd
	case fdPipe:
		var p [2]int
		must(0, unix.Pipe2(p[:], unix.O_CLOEXEC))
		unix.Close(p[1])
		return p[0]
	case fdEventfd:
		return must(unix.Eventfd(0, unix.EFD_CLOEXEC))
	case fdDevNull:
		return must(unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0))
	case fdSocket:
		sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		must(0, err)
		unix.Close(sp[1])
		return sp[0]
	}
	return must(unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0))
}

func (s *sessRun) listenAddr() string {
	switch s.byte() % 6 {
	case 0:
		return ""
	case 1:
		return ":0"
	case 2:
		return ":" + strconv.Itoa(int(uint16(s.u32())))
	case 3:
		return netip.AddrPortFrom(s.env.svcAddr, 0).String()
	case 4:
		return netip.AddrPortFrom(s.env.peerAddr, 0).String()
	}
	return string(s.bytes(int(s.byte() % 32)))
}

// localAddr is DIAL's local address: a port of its own, one in use (a
// listener's), privileged, the service's address, or bytes.
func (s *sessRun) localAddr() string {
	switch s.byte() % 6 {
	case 0:
		return ""
	case 1:
		return ":" + strconv.Itoa(30000+int(s.byte()))
	case 2:
		ln, _ := pick(s.lns, s.byte())
		return ":" + strconv.Itoa(int(s.lnPorts[ln]))
	case 3:
		return ":" + strconv.Itoa(int(s.byte()))
	case 4:
		return netip.AddrPortFrom(s.env.svcAddr, 30000+uint16(s.byte())).String()
	}
	return string(s.bytes(int(s.byte() % 32)))
}

func (s *sessRun) dialAddr() string {
	switch s.byte() % 6 {
	case 0, 1:
		return s.env.sink.String()
	case 2:
		return s.env.closed.String()
	case 3:
		// One of the session's own listeners.
		ln, ok := pick(s.lns, s.byte())
		return netip.AddrPortFrom(s.env.svcAddr, s.lnPorts[ln]+uint16(bool64(!ok))).String()
	case 4:
		return ""
	}
	return string(s.bytes(int(s.byte() % 32)))
}

func bool64(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// pdata is private data: none, a RemoteBuf of one of the session's MRs
// (the peer then RDMA-Writes into it for as long as the connection
// lasts), too much, or a few bytes.
func (s *sessRun) pdata() []byte {
	switch s.byte() % 4 {
	case 0:
		return nil
	case 1:
		mr, ok := pick(s.mrs, s.byte())
		if !ok {
			return nil
		}
		p, _ := verbs.RemoteBuf{Addr: mr.va, Len: mr.n, RKey: mr.stag}.MarshalBinary()
		return p
	case 2:
		return make([]byte, int(s.byte())*3)
	}
	return []byte("hi")
}

// mapEntries is MAP_MR's payload: page runs or SGEs, mostly in the
// session's MRs.
func (s *sessRun) mapEntries(sg bool) []byte {
	n := 1 + int(s.byte()%4)
	var out []byte
	for i := 0; i < n; i++ {
		mr, _ := pick(s.mrs, s.byte())
		va := mr.va + uint64(s.byte()%16)*4096
		if s.byte() >= 0xf0 {
			va = s.u64()
		}
		out = binary.LittleEndian.AppendUint64(out, va)
		if sg {
			out = binary.LittleEndian.AppendUint32(out, uint32(s.byte())*64)
			out = binary.LittleEndian.AppendUint32(out, mr.stag)
		} else {
			out = binary.LittleEndian.AppendUint32(out, uint32(s.byte()%8))
			out = binary.LittleEndian.AppendUint32(out, 0)
		}
	}
	return out
}

// ringStep writes entries into one of the session's rings and rings the
// doorbell; the next request's dispatch makes the service take them
// (it polls the rings before each call), so the run does not depend on
// when its poller wakes.
func (s *sessRun) ringStep() {
	rg, ok := pick(s.rings, s.byte())
	n := 1 + int(s.byte()%4)
	if !ok {
		return
	}
	ring := rg.ring
	s.tracef("  ring %c, %d entries", rg.kind, n)
	if rg.kind == 'c' {
		// The client consumes completions, or arms the CQ.
		switch s.byte() % 4 {
		case 0:
			ring.Cons.Store(ring.Prod.Load())
		case 1:
			ring.Arm.Store(svc.ArmAny)
		case 2:
			ring.Arm.Store(svc.ArmSolicited)
		case 3:
			ring.Waiting.Store(1)
		}
		return
	}
	prod := ring.Prod.Load()
	for i := 0; i < n; i++ {
		e := ring.Entry(prod + uint32(i))
		if s.byte() >= 0xc0 {
			clear(e)
			copy(e, s.bytes(int(s.byte())))
			continue
		}
		if rg.kind == 's' {
			s.sendEntry(e)
		} else {
			s.recvEntry(e)
		}
	}
	ring.Prod.Store(prod + uint32(n))
	s.r.bell.Signal()
}

// sgl makes n SGEs, mostly within the session's MRs (4 bytes of the
// program each, 8 with a random lkey).
func (s *sessRun) sgl(n int) []iwarp.SGE {
	sgl := make([]iwarp.SGE, n)
	for i := range sgl {
		mr, _ := pick(s.mrs, s.byte())
		sgl[i] = iwarp.SGE{Addr: mr.va + uint64(s.byte())*256, Length: uint32(s.byte()) * 64, LKey: mr.stag}
		if s.byte() >= 0xf0 {
			sgl[i].LKey = s.u32()
		}
	}
	return sgl
}

// sendEntry fills an SQ entry: opcode, flags, SGE count, ID; the SGEs;
// which remote buffer (the peer's, as its private data told, or the
// session's own MR) and an offset in it; compare/add, swap, immediate;
// five bytes the memory registration operations use.
func (s *sessRun) sendEntry(e []byte) {
	op := iwarp.WROp(s.byte() % 14)
	flags := iwarp.SendFlags(s.byte() & 0x1f)
	nsge := int(s.byte() % 4)
	id := uint64(s.byte())
	room := (len(e) - svc.SendEntryBase) / svc.SGESize
	wr := iwarp.SendWR{ID: id, Op: op, Flags: flags, SGL: s.sgl(min(nsge, room))}
	rsel, rmode, roff := s.byte(), s.byte(), uint64(s.byte())*64
	if rb, ok := pick(s.remotes, rsel); ok && rmode%2 == 0 {
		wr.RemoteAddr, wr.RKey = rb.Addr+roff, rb.RKey
	} else {
		mr, _ := pick(s.mrs, rsel)
		wr.RemoteAddr, wr.RKey = mr.va+roff, mr.stag
	}
	wr.CompareAdd, wr.Swap, wr.Imm = uint64(s.byte()), uint64(s.byte()), uint32(s.byte())
	x := s.bytes(5)
	x = append(x, make([]byte, 5-len(x))...)
	stag, _ := pick(s.stags, x[2])
	var obj uint64
	switch op {
	case iwarp.WRRegMR:
		obj, _ = pick(s.frs, x[0])
		wr.Access = iwarp.Access(x[1] & 0x3f)
		wr.RKey = stag&^0xff | uint32(x[3])
	case iwarp.WRBindMW:
		obj, _ = pick(s.mws, x[0])
		wr.RKey = stag&^0xff | uint32(x[3])
		wr.Bind = iwarp.MWBind{MR: stag, Addr: sessVABase + uint64(x[3])*4096, Length: uint64(x[4]) * 4096, Access: iwarp.Access(x[1] & 0x3f)}
	case iwarp.WRLocalInv, iwarp.WRSendInvalidate, iwarp.WRReadInv:
		wr.InvalidateRKey = stag
	}
	clear(e)
	svc.PutSend(e, &wr, obj)
	if nsge > room {
		// An SGE count beyond the entry's room.
		binary.LittleEndian.PutUint16(e[10:], uint16(nsge))
	}
}

// recvEntry fills an RQ or SRQ entry: SGE count, ID, the SGEs.
func (s *sessRun) recvEntry(e []byte) {
	nsge := int(s.byte() % 4)
	id := uint64(s.byte())
	room := (len(e) - svc.RecvEntryBase) / svc.SGESize
	clear(e)
	svc.PutRecv(e, id, s.sgl(min(nsge, room)))
	if nsge > room {
		binary.LittleEndian.PutUint32(e[8:], uint32(nsge))
	}
}

// corrupt writes a word of the program over an index, flag or the
// geometry of one of the session's rings (the service keeps its own copy
// of the geometry and must check every index it reads).
func (s *sessRun) corrupt() {
	rg, ok := pick(s.rings, s.byte())
	field, v := s.byte()%6, s.u32()
	if !ok {
		return
	}
	s.tracef("  ring %c: field %d := %#x", rg.kind, field, v)
	switch field {
	case 0:
		rg.ring.Prod.Store(v)
	case 1:
		rg.ring.Cons.Store(v)
	case 2:
		rg.ring.Waiting.Store(v)
	case 3:
		rg.ring.Arm.Store(v)
	case 4:
		svc.U32(rg.mem, 192).Store(v) // the capacity the header claims
	case 5:
		svc.U32(rg.mem, 196).Store(v) // the entry size it claims
	}
	s.r.bell.Signal()
}

// peerDial has the peer dial one of the session's listeners; when a
// GET_REQUEST is in progress on it, its reply (the connection request)
// is awaited, so that an ACCEPT or REJECT later in the program finds it.
func (s *sessRun) peerDial() {
	ln, ok := pick(s.lns, s.byte())
	if !ok {
		return
	}
	raddr := netip.AddrPortFrom(s.env.svcAddr, s.lnPorts[ln])
	e := s.env
	s.peers.Add(1)
	go func() {
		defer s.peers.Done()
		cq, err := e.p.b.CreateCQ(8)
		if err != nil {
			return
		}
		defer cq.Close()
		qp, err := e.peerPD.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
		if err != nil {
			return
		}
		defer qp.Close()
		ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
		defer cancel()
		if _, err := e.p.b.Dial(ctx, qp, raddr, verbs.ConnParams{PrivateData: []byte("peer")}); err != nil {
			return
		}
		select {
		case <-qp.Done():
		case <-s.ctx.Done():
		}
	}()
	if seq, ok := s.getReq[ln]; ok {
		s.await(seq, blockWait, false)
	}
}

// --- seeds ---

// sessProg builds a program; each method appends one step.
type sessProg []byte

// req is a request of the table: a selector byte per argument (and
// after them REG_MR's offset byte, the payload's bytes and the descriptor
// byte, as request reads them).
func (p *sessProg) req(r int, sels ...byte) *sessProg {
	*p = append(*p, stReq, byte(r))
	*p = append(*p, sels...)
	return p
}

func (p *sessProg) raw(b ...byte) *sessProg {
	*p = append(*p, b...)
	return p
}

// sq writes one SQ entry into ring ri: nsge SGEs at the start of the
// session's first MR, 1 KiB each; the remote buffer is the peer's (its
// private data) when peer is set, else the session's first MR; x are
// the memory registration bytes.
func (p *sessProg) sq(ri byte, op iwarp.WROp, flags iwarp.SendFlags, nsge, id byte, peer bool, x [5]byte) *sessProg {
	*p = append(*p, stRing, ri, 0, 0, byte(op), byte(flags), nsge, id)
	for i := byte(0); i < nsge; i++ {
		*p = append(*p, 0, i*4, 16, 0)
	}
	*p = append(*p, 0, byte(bool64(!peer)), 0, 0, 0, 0)
	*p = append(*p, x[:]...)
	return p
}

// rq writes one receive entry (nsge SGEs of 1 KiB) into ring ri.
func (p *sessProg) rq(ri, nsge, id byte) *sessProg {
	*p = append(*p, stRing, ri, 0, 0, nsge, id)
	for i := byte(0); i < nsge; i++ {
		*p = append(*p, 0, i*4, 16, 0)
	}
	return p
}

// junk writes raw bytes as one entry of ring ri.
func (p *sessProg) junk(ri byte, b []byte) *sessProg {
	*p = append(*p, stRing, ri, 0, 0xc0, byte(len(b)))
	*p = append(*p, b...)
	return p
}

func (p *sessProg) corrupt(ri, field byte, v uint32) *sessProg {
	*p = append(*p, stCorrupt, ri, field)
	*p = binary.LittleEndian.AppendUint32(*p, v)
	return p
}

func sessSeeds() [][]byte {
	var seeds [][]byte
	rw := byte(verbs.AccessLocalWrite | verbs.AccessRemoteWrite)
	var none [5]byte

	// A PD, a CQ, a QP (rings: 0 the CQ, 1 the SQ, 2 the RQ); a memfd
	// registered; the QP dials the peer with the MR as private data (the
	// peer then RDMA-Writes into it); a Write and a Read through the ring;
	// a receive; a Send the peer has no receive for (it terminates); the
	// session ends with all of it in flight.
	var p sessProg
	p.req(rAllocPD, 0).
		req(rCreateCQ, 15, 0).
		req(rCreateQP, 0, 0, 0, 0, 7, 7, 1, 1, 1, 0, 0).
		req(rRegMR, 0, 0, 2, rw, 0, 0, 0, fdShared).
		req(rDial, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0).
		sq(1, iwarp.WRWrite, iwarp.FlagSignaled, 1, 7, true, none).
		sq(1, iwarp.WRRead, iwarp.FlagSignaled, 1, 8, true, none).
		req(rQueryQP, 0, 0).
		raw(stRing, 0, 0, 0). // the CQ's completions consumed
		rq(2, 1, 1).
		sq(1, iwarp.WRSend, iwarp.FlagSignaled|iwarp.FlagInline, 1, 9, true, none).
		req(rStats, 0)
	seeds = append(seeds, p)

	// Every kind of descriptor offered to REG_MR, and descriptors beside
	// requests that take none (more than a message may carry, too).
	p = nil
	p.req(rAllocPD, 0)
	for k := byte(0); k < fdKinds; k++ {
		p.req(rRegMR, 0, k, 0, byte(verbs.AccessLocalWrite), 0, 0, 0, k)
	}
	p.req(rAllocPD, 0xe2, fdPipe, fdEventfd)
	p.req(rStats, 0xe5, fdDir, fdRingFile, fdSocket, fdDevNull, fdShared)
	seeds = append(seeds, p)

	// Rings: an SRQ and a QP on it, a plain QP (rings: 0 CQ, 1 SRQ, 2 the
	// first QP's SQ, 3 the second's SQ, 4 its RQ); entries in each, good
	// and bad; then the headers' geometry rewritten, the CQ's consumer
	// index and an SQ's producer index corrupted (that ends the session).
	p = nil
	p.req(rAllocPD, 0).
		req(rCreateCQ, 1, 0).
		req(rCreateSRQ, 0, 3, 1, 0).
		req(rCreateQP, 0, 0, 0, 3, 3, 3, 0, 0, 0, 0, 0).
		req(rCreateQP, 0, 0, 0, 0, 1, 1, 1, 1, 3, 0, 0).
		req(rRegMR, 0, 0, 2, byte(verbs.AccessLocalWrite), 0, 0, 0, fdShared).
		rq(1, 1, 1).
		rq(1, 2, 2).
		junk(1, []byte{1, 2, 3, 4, 5, 6, 7, 8, 0xff, 0xff, 0xff, 0xff}).
		sq(2, iwarp.WRRegMR, iwarp.FlagSignaled, 0, 3, false, [5]byte{0, 0x3f, 0, 1, 0}).
		sq(3, iwarp.WRWrite, iwarp.FlagSignaled|iwarp.FlagInline, 2, 4, false, none).
		sq(3, iwarp.WRAtomicCmpSwap, iwarp.FlagSignaled, 1, 5, false, none).
		junk(3, bytesOf(64, 0xff)).
		rq(4, 2, 6).
		req(rQueryQP, 0, 1).
		corrupt(0, 4, 1<<30).
		corrupt(2, 5, 1).
		raw(stCtl, 0xff, 0xff, 0xff, 0xff).
		sq(2, iwarp.WRSend, iwarp.FlagSignaled, 1, 7, false, none).
		req(rStats, 0).
		corrupt(0, 1, 0x7fffffff).
		req(rStats, 0).
		corrupt(3, 0, 1<<20).
		req(rStats, 0)
	seeds = append(seeds, p)

	// Connections: a listener, a GET_REQUEST the peer's dial answers, an
	// ACCEPT onto a QP, a second GET_REQUEST left in progress and
	// canceled, a DIAL to a closed port, a DISCONNECT, a listener on port
	// 22; the connection closes with a GET_REQUEST pending.
	p = nil
	p.req(rAllocPD, 0).
		req(rCreateCQ, 3, 0).
		req(rCreateQP, 0, 0, 0, 0, 3, 3, 0, 0, 0, 0, 0).
		req(rCreateQP, 0, 0, 0, 0, 3, 3, 0, 0, 0, 0, 0).
		req(rCreateQP, 0, 0, 0, 0, 3, 3, 0, 0, 0, 0, 0).
		req(rListen, 4, 0, 0, 0).
		req(rGetRequest, 0, 0).
		raw(stPeer, 0).
		req(rAccept, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0).
		req(rGetRequest, 0, 0).
		req(rCancel, 0, 0).
		req(rDial, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0).
		req(rDisconnect, 0, 0).
		req(rListen, 1, 0, 2, 22, 0, 0, 0, 0).
		req(rGetRequest, 1, 0).
		raw(stClose)
	seeds = append(seeds, p)

	// Fast-register MRs and windows: ALLOC_MR, MAP_MR of pages and of
	// SGEs, SET_IOVA, a REG_MR work request through the ring, ALLOC_MW of
	// both types, BIND_MW, QUERY_MEM, the MR deregistered under them, the
	// PD freed with everything in it, then the QP and the CQ.
	p = nil
	p.req(rAllocPD, 0).
		req(rCreateCQ, 3, 0).
		req(rCreateQP, 0, 0, 0, 0, 3, 3, 0, 0, 0, 0, 0).
		req(rRegMR, 0, 0, 2, byte(verbs.AccessLocalWrite|verbs.AccessMWBind), 0, 0, 0, fdShared).
		req(rAllocMR, 0, 3, 0).
		req(rMapMR, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0).
		req(rMapMR, 0, 1, 0, 0, 0, 0, 0, 0, 0, 16, 0).
		req(rSetIOVA, 0, 5, 0).
		req(rAllocMW, 0, 1, 0).
		req(rAllocMW, 0, 2, 0).
		req(rBindMW, 0, 0, 1, 1, 0, 0, 0, byte(verbs.AccessRemoteRead), 0).
		sq(1, iwarp.WRRegMR, iwarp.FlagSignaled, 0, 1, false, [5]byte{0, byte(verbs.AccessRemoteWrite | verbs.AccessLocalWrite), 1, 7, 0}).
		sq(1, iwarp.WRBindMW, iwarp.FlagSignaled, 0, 2, false, [5]byte{1, byte(verbs.AccessRemoteRead), 0, 0, 1}).
		sq(1, iwarp.WRLocalInv, iwarp.FlagSignaled, 0, 3, false, [5]byte{0, 0, 1, 0, 0}).
		req(rQueryMem, 0, 0).
		req(rDeregMR, 1, 0).
		req(rDeallocMW, 0, 0).
		req(rDeallocPD, 0, 0).
		req(rDestroyQP, 0, 0).
		req(rDestroyCQ, 0, 0)
	seeds = append(seeds, p)

	// Malformed framing amid good requests, and an empty datagram (an
	// end of file) mid-session.
	p = nil
	p.req(rAllocPD, 0).
		raw(stRaw, 12, 2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8).
		raw(stRaw, 2, 0xc8, 0, 0, 0).
		req(rStats, 0).
		raw(stRaw, 0)
	seeds = append(seeds, p)
	// The CM feature's requests: a QP with a receive dials from a port of
	// its own, then goes to ERROR; another moves to ERROR in IDLE; the
	// port and the device are queried.
	p = nil
	p.req(rAllocPD, 0).
		req(rCreateCQ, 15, 0).
		req(rCreateQP, 0, 0, 0, 0, 7, 7, 1, 1, 1, 0, 0).
		req(rRegMR, 0, 0, 2, rw, 0, 0, 0, fdShared).
		rq(2, 1, 1).
		req(rDialLocal, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 7).
		req(rQPError, 0, 0).
		req(rCreateQP, 0, 0, 0, 0, 7, 7, 1, 1, 1, 0, 0).
		req(rQPError, 0, 1).
		req(rQueryPort, 0, 1).
		req(rQueryDevice, 0)
	seeds = append(seeds, p)
	return seeds
}

func bytesOf(n int, b byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = b
	}
	return p
}
