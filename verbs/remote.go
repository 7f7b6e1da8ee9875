package verbs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/verbs/internal/session"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
	"github.com/rdmatap/rdmatap/zerocopy"

	"golang.org/x/sys/unix"
)

// The endpoint as a service: the client side.
//
// Connect returns a *Device like Open does, and every object made from it
// (PD, MR, CQ, QP, SRQ, Listener, ConnRequest, Conn) is the same struct
// type an embedded device makes, so code written against the verbs API
// runs unchanged on either. Each of those structs reaches what its kind
// does through an interface (Device.ops, PD.ops, CQ.ops, QP.ops, SRQ.ops,
// MR.ops, MW.ops, Listener.ops, ConnRequest.ops) with one implementation
// per kind: the engine's (engineDevice, enginePD, ...) and the service's,
// here (client, remotePD, remoteCQ, remoteQP, remoteSRQ, remoteMR,
// remoteMW, remoteListener, remoteRequest). The data path (QP.PostSend
// and PostRecv, SRQ.PostRecv, CQ.Poll and Wait) picks its implementation
// with a type switch and calls it statically, so that the compiler sees
// the work requests and completions stay on the caller's stack.
//
// What crosses to the service, and how (package verbs/service is the other side):
//
//   - Slow path: one SOCK_SEQPACKET message per call (svc.Msg), answered
//     by a reply with the same sequence number (package
//     verbs/internal/session keeps the session); a call whose context ends
//     sends a Cancel and still waits for the reply: the context's error
//     if the service abandoned the call, else what it did (so a
//     connection request it had taken is not lost). Alloc and destroy,
//     register and deregister, dial, listen, get request, accept, reject,
//     disconnect and QP state queries go this way.
//   - Memory: an MR's buffer must lie in a zerocopy.AllocShared (memfd)
//     buffer; RegMR passes the memfd (SCM_RIGHTS) with the offset, and the
//     service maps the same pages and registers them at this process's
//     addresses, so SGEs, RemoteBuf and the peer's Tagged Offsets are this
//     process's virtual addresses and placement lands in this process's
//     pages. Nothing is copied between processes.
//   - Fast path: the service makes each QP's SQ and RQ, each SRQ's queue
//     and each CQ's queue as rings in sealed memfds that both map
//     (svc.Ring). PostSend and PostRecv write ring entries and publish the
//     producer index; Poll reads completions and publishes the consumer
//     index. No system call happens per work request or completion,
//     except the eventfd doorbell write when the service's poller has
//     gone to sleep, and a CQ.Wait that finds nothing sleeps on the CQ's
//     eventfd.
//
// Differences from an embedded device, all documented where they show:
// PostSend and PostRecv check what they can (opcode, SGE counts, queue
// room) at once, but an error the protocol engine finds later (an SGE
// outside the client's registrations, a QP already in ERROR) arrives as
// an error completion instead of a *PostError; the service's queue and
// the ring each hold up to MaxSendWR (MaxRecvWR) WRs; a fast-register
// MR's and a window's accessors (RKey, Addr, Len, Remote) report the
// registration or binding last posted, Valid asks the service; the pages
// a fast-register MR maps must lie in memory the client registered (in
// MRs of its own; the service maps nothing else); Stats are the service
// device's, all its clients' traffic together; QP.Progress does nothing
// and WaitProgress only yields (the service progresses the QP;
// ManualProgress is ignored).
//
// Fast-register MRs and windows cross as handles: AllocMR, AllocMW,
// MapPages, MapSG, SetIOVA and QP.BindMW are slow-path calls; the MR's
// and window's fr and w fields are tokens that name them in REG_MR and
// BIND_MW work requests, which go through the ring with the service's
// handle in the entry (svc.PutSend).

// client is a device's connection to a service: its session (package
// verbs/internal/session: the socket, the control page and doorbell, the
// calls in flight and the session's end) and the tables of what the
// client made.
//
// Locks: mu here and the session's mu (session.Session), neither ever
// held while the other is taken: the session calls back (Config.Message,
// Config.Failed) with its own mu released, and the client makes its calls
// with mu released. mu guards the tables (the fields marked
// +checklocks:mu). It is a leaf: held only to look up or update them,
// never across a call or a write. It is taken by any caller's goroutine,
// the read loop (an event's or QP_DONE's lookup, the session's end), and
// inside remoteQP.sqMu (the checks and bookkeeping of a REG_MR or BIND_MW
// posted), MR.mu (Dereg) and SRQ.mu (Close). The session's mu is taken
// inside MR.mu, SRQ.mu and PD.mu (the service calls of Dereg and Close).
// s is set by Connect before the read loop starts.
type client struct {
	dev *Device
	s   session.Session

	mu sync.Mutex
	// +checklocks:mu
	qps map[uint32]*QP
	// +checklocks:mu
	srqs map[uint64]*SRQ
	// +checklocks:mu
	cqs map[*CQ]struct{}
	// Memory objects: the fast-register MRs and windows by the tokens
	// their work requests carry, and the regular MRs by STag (MapSG).
	// +checklocks:mu
	frs map[*iwarp.FastRegMR]*MR
	// +checklocks:mu
	mwt map[*iwarp.Window]*MW
	// +checklocks:mu
	mrKeys map[STag]*MR
	// attr: the service device's limits for this client (QUERY_DEVICE),
	// set by Connect; nil from a service that does not answer it.
	attr *DeviceAttr
	// features: those HELLO agreed on (svc.Feature* bits).
	features uint64
}

type reply struct {
	m   svc.Msg
	fds []int
}

// Connect opens the device a running service (rdmatap up --socket PATH)
// offers on its unix socket. The device is used as one from Open is, and
// Close ends the session: the service then releases everything this
// process made.
func Connect(ctx context.Context, path string) (*Device, error) {
	cl := &client{qps: map[uint32]*QP{}, srqs: map[uint64]*SRQ{}, cqs: map[*CQ]struct{}{},
		frs: map[*iwarp.FastRegMR]*MR{}, mwt: map[*iwarp.Window]*MW{}, mrKeys: map[STag]*MR{}}
	h, err := cl.s.Dial(ctx, path, session.Config{Status: statusError, Message: cl.message, Failed: cl.failed})
	if err != nil {
		return nil, fmt.Errorf("verbs: connect to service %s: %w", path, err)
	}
	cfg := DeviceConfig{Name: h.Name, NoExtensions: h.Flags&1 != 0, EventQueue: 256}
	dev := &Device{cfg: cfg, ops: cl, events: make(chan AsyncEvent, cfg.EventQueue), qps: map[uint32]*QP{},
		listeners: map[*Listener]struct{}{}}
	cl.dev = dev
	cl.features = h.Features
	cl.s.Start()
	if h.Features&svc.FeatureQueryDevice != 0 {
		r, err := cl.do(ctx, svc.TQueryDevice, nil)
		if err != nil {
			dev.Close()
			return nil, fmt.Errorf("verbs: connect to service %s: %w", path, err)
		}
		a := decodeAttr(r.m)
		cl.attr = &a
	}
	return dev, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		closeFd(fd)
	}
}

// message handles what the service sends unasked (the session's
// Config.Message).
func (cl *client) message(m svc.Msg) {
	switch m.Type() {
	case svc.TEvent:
		cl.event(m)
	case svc.TQPDone:
		cl.qpDone(m)
	}
}

// failed learns the session's end (its Config.Failed): waiters on CQs
// and QPs wake.
func (cl *client) failed(err error) {
	cl.mu.Lock()
	qps := make([]*QP, 0, len(cl.qps))
	for _, q := range cl.qps {
		qps = append(qps, q)
	}
	cqs := make([]*remoteCQ, 0, len(cl.cqs))
	for cq := range cl.cqs {
		cqs = append(cqs, cq.ops.(*remoteCQ))
	}
	cl.mu.Unlock()
	for _, q := range qps {
		q.remote().finish(err)
	}
	// Wake CQ waiters: no service is left to ring their eventfds.
	for _, rc := range cqs {
		if !rc.dead.Load() {
			rc.ev.Signal()
		}
	}
}

// do sends a request of type t that build fills in, with fds, and waits
// for its reply (session.Session.Do).
func (cl *client) do(ctx context.Context, t svc.Type, build func(*svc.Builder), fds ...int) (reply, error) {
	r, err := cl.s.Do(ctx, t, build, fds...)
	if err != nil {
		if errors.Is(err, svc.ErrTooLarge) {
			// The service would get it cut off and could not tell
			// which call it was.
			return reply{}, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
		}
		return reply{}, err
	}
	return reply{m: r.M, fds: r.FDs}, nil
}

// statusError turns a reply's status and text into the verbs error.
func statusError(m svc.Msg) error {
	st := m.Status()
	var f [1][]byte
	svc.Fields(m.Payload(), f[:])
	text := string(f[0])
	wrap := func(e error) error {
		if text == "" {
			return e
		}
		return fmt.Errorf("%w: %s", e, text)
	}
	switch st {
	case svc.StatusInvalidArgument:
		return wrap(ErrInvalidArgument)
	case svc.StatusInvalidState:
		return wrap(ErrInvalidState)
	case svc.StatusBusy:
		return wrap(ErrBusy)
	case svc.StatusClosed:
		return wrap(net.ErrClosed)
	case svc.StatusQueueFull:
		return wrap(ErrQueueFull)
	case svc.StatusRejected:
		return &RejectedError{PrivateData: append([]byte(nil), f[0]...), Markers: m.Arg(0) != 0}
	case svc.StatusLimit:
		return wrap(ErrLimit)
	case svc.StatusPermission:
		return wrap(os.ErrPermission)
	case svc.StatusCanceled:
		return wrap(context.Canceled)
	case svc.StatusTimeout:
		return wrap(context.DeadlineExceeded)
	case svc.StatusVersion:
		return wrap(svc.ErrVersion)
	case svc.StatusTooManySGE:
		return wrap(ErrTooManySGE)
	case svc.StatusMarkers:
		return wrap(ErrMarkers)
	case svc.StatusNoMatchingRTR:
		return wrap(ErrNoMatchingRTR)
	case svc.StatusInvalidWR:
		return &svcError{text: text, errs: []error{iwarp.ErrInvalidWR}}
	case svc.StatusInvalidArgWR:
		return &svcError{text: text, errs: []error{ErrInvalidArgument, iwarp.ErrInvalidWR}}
	case svc.StatusErrno:
		if e := syscall.Errno(m.Arg(0)); e != 0 && m.Arg(0) < 4096 {
			return &svcError{text: text, errs: []error{e}}
		}
	}
	return errors.New("verbs: service: " + text)
}

// svcError is an error the service found, with its text as the service
// gave it (it names the sentinels already) and the sentinels it matches.
type svcError struct {
	text string
	errs []error
}

func (e *svcError) Error() string   { return e.text }
func (e *svcError) Unwrap() []error { return e.errs }

func (cl *client) event(m svc.Msg) {
	e := AsyncEvent{Type: AsyncEventType(m.Arg(svc.EventArgType)), QPNum: uint32(m.Arg(svc.EventArgQPN)),
		Term: TermCode{Layer: TermLayer(m.Arg(svc.EventArgTermLayer)), EType: uint8(m.Arg(svc.EventArgTermType)),
			Code: uint8(m.Arg(svc.EventArgTermCode))}}
	if e.Type > EventSRQErr {
		return
	}
	if h := m.Arg(svc.EventArgSRQ); h != 0 {
		cl.mu.Lock()
		e.SRQ = cl.srqs[h]
		cl.mu.Unlock()
	}
	var f [1][]byte
	if n, _ := svc.Fields(m.Payload(), f[:]); n == 1 && len(f[0]) > 0 {
		e.Err = errors.New(string(f[0]))
	}
	if e.Type == EventDisconnected && m.Arg(svc.EventArgReason) == svc.DisconnectPeer && e.Err == nil {
		e.ByPeer = true
	}
	cl.dev.post(e)
}

func (cl *client) qpDone(m svc.Msg) {
	cl.mu.Lock()
	q := cl.qps[uint32(m.Arg(0))]
	cl.mu.Unlock()
	if q == nil {
		return
	}
	var err error
	var f [1][]byte
	if n, _ := svc.Fields(m.Payload(), f[:]); n == 1 && len(f[0]) > 0 {
		err = errors.New(string(f[0]))
	}
	q.remote().finish(err)
}

// close ends the session and releases this process's side of it.
func (cl *client) close() error {
	cl.s.Close(func() {
		cl.mu.Lock()
		cqs := make([]*CQ, 0, len(cl.cqs))
		for cq := range cl.cqs {
			cqs = append(cqs, cq)
		}
		qps := make([]*QP, 0, len(cl.qps))
		for _, q := range cl.qps {
			qps = append(qps, q)
		}
		srqs := make([]*SRQ, 0, len(cl.srqs))
		for _, s := range cl.srqs {
			srqs = append(srqs, s)
		}
		cl.mu.Unlock()
		for _, cq := range cqs {
			cq.ops.(*remoteCQ).release()
		}
		for _, q := range qps {
			q.remote().release()
		}
		for _, s := range srqs {
			s.ops.(*remoteSRQ).release()
		}
	})
	return nil
}

// query returns the limits this client may use.
func (cl *client) query() DeviceAttr {
	if cl.attr != nil {
		return *cl.attr
	}
	return defaultAttr(cl.dev.cfg)
}

// counters asks the service for its device's counters.
func (cl *client) counters() Stats {
	var st Stats
	r, err := cl.do(context.Background(), svc.TStats, nil)
	if err != nil {
		return st
	}
	var f [1][]byte
	if n, err := svc.Fields(r.m.Payload(), f[:]); err == nil && n == 1 {
		binary.Decode(f[0], binary.LittleEndian, &st)
	}
	return st
}

// ring rings the service's doorbell if its poller sleeps.
func (cl *client) ring() { cl.s.Ring() }

// client returns a service's device's connection; nil for an embedded
// device.
func (d *Device) client() *client {
	cl, _ := d.ops.(*client)
	return cl
}

// --- PD and MR ---

func (cl *client) allocPD() (*PD, error) {
	r, err := cl.do(context.Background(), svc.TAllocPD, nil)
	if err != nil {
		return nil, err
	}
	pd := &PD{dev: cl.dev, id: uint32(r.m.Arg(0))}
	pd.ops = &remotePD{pd: pd, h: r.m.Arg(0)}
	return pd, nil
}

// remotePD is a PD of a service: its handle.
type remotePD struct {
	pd *PD
	h  uint64
}

// handle returns the service's handle of a PD of a service.
func (pd *PD) handle() uint64 { return pd.ops.(*remotePD).h }

func (r *remotePD) regMR(buf []byte, iova uint64, acc Access) (*MR, error) {
	return r.pd.remoteRegMRCounted(buf, iova, acc)
}
func (r *remotePD) allocMR(maxPages int) (*MR, error)  { return r.pd.remoteAllocMR(maxPages) }
func (r *remotePD) allocMW(t MWType) (*MW, error)      { return r.pd.remoteAllocMW(t) }
func (r *remotePD) createQP(cfg QPConfig) (*QP, error) { return r.pd.remoteCreateQP(cfg) }
func (r *remotePD) createSRQ(maxWR, maxSGE int) (*SRQ, error) {
	return r.pd.remoteCreateSRQ(maxWR, maxSGE)
}
func (r *remotePD) destroy() error { return r.pd.remoteClose() }

func (pd *PD) remoteClose() error {
	_, err := pd.dev.client().do(context.Background(), svc.TDeallocPD, func(b *svc.Builder) { b.Args(pd.handle()) })
	return err
}

func (pd *PD) remoteRegMR(buf []byte, iova uint64, acc Access) (*MR, error) {
	fd, off, ok := zerocopy.Backing(buf)
	if !ok {
		return nil, ErrNotShared
	}
	va := iwarp.BufferAddr(buf)
	cl := pd.dev.client()
	r, err := cl.do(context.Background(), svc.TRegMR, func(b *svc.Builder) {
		b.Args(pd.handle(), va, uint64(len(buf)), uint64(acc), uint64(off), iova)
	}, fd)
	if err != nil {
		return nil, err
	}
	reg := &iwarp.Region{Buf: buf, Access: iwarp.Access(acc), PD: pd.id, Kind: iwarp.KindMR}
	if acc&AccessZeroBased == 0 {
		reg.Base = iova
	}
	m := &MR{pd: pd, r: reg}
	m.ops = &remoteMR{m: m, h: r.m.Arg(0), stag: STag(r.m.Arg(1))}
	cl.mu.Lock()
	cl.mrKeys[m.remote().stag] = m
	cl.mu.Unlock()
	return m, nil
}

// remoteMR is an MR of a service: its handle and STag, and for a
// fast-register MR, what the client knows of its mapping and
// registration (fr).
type remoteMR struct {
	m    *MR
	h    uint64
	stag STag
	fr   *remoteFR
}

// remote returns an MR of a service's side; nil for an embedded MR.
func (m *MR) remote() *remoteMR {
	r, _ := m.ops.(*remoteMR)
	return r
}

func (r *remoteMR) view() ([]byte, uint64, uint64, STag) {
	if r.fr != nil {
		return r.fr.view()
	}
	g := r.m.r
	return g.Buf, g.Base, g.Len(), r.stag
}

// valid: a regular MR of a service is valid until Dereg (an invalidation
// by the peer is not seen); a fast-register MR's state is the service's.
func (r *remoteMR) valid() bool {
	r.m.mu.Lock()
	freed := r.m.freed
	r.m.mu.Unlock()
	if freed || r.fr == nil {
		return !freed
	}
	return r.m.remoteValid()
}

func (r *remoteMR) dereg() (bool, error) {
	cl := r.m.pd.dev.client()
	if _, err := cl.do(context.Background(), svc.TDeregMR, func(b *svc.Builder) { b.Args(r.h) }); err != nil {
		return false, err
	}
	cl.forget(r.m)
	return true, nil
}

func (r *remoteMR) mapPages(pages [][]byte, pageSize, offset, length int) error {
	return r.m.remoteMapPages(pages, pageSize, offset, length)
}
func (r *remoteMR) mapSG(sgl []SGE, pageSize int) error { return r.m.remoteMapSG(sgl, pageSize) }
func (r *remoteMR) setIOVA(iova uint64) error           { return r.m.remoteSetIOVA(iova) }

// forget drops a freed MR from the client's tables.
func (cl *client) forget(m *MR) {
	r := m.remote()
	cl.mu.Lock()
	if r.fr != nil {
		delete(cl.frs, m.fr)
	} else if cl.mrKeys[r.stag] == m {
		delete(cl.mrKeys, r.stag)
	}
	cl.mu.Unlock()
}

// --- fast-register MRs and memory windows ---

// remoteFR is the client's side of a fast-register MR of a service: what
// its next REG_MR maps and the registration last posted.
//
// mu, a leaf, guards every field but maxPages (base, n and rbuf too: they
// are not annotated because checklocks attributes the annotations after
// a multi-name field to the wrong fields). It is taken inside
// remoteQP.sqMu when a REG_MR is posted (registered).
type remoteFR struct {
	maxPages int

	mu sync.Mutex
	// +checklocks:mu
	mapped bool
	// +checklocks:mu
	mapLen uint64
	// +checklocks:mu
	iova uint64
	// +checklocks:mu
	buf []byte // the mapped bytes when they are one run
	// The registration last posted (the first STag until then).
	// +checklocks:mu
	stag    STag
	base, n uint64
	rbuf    []byte
}

func (f *remoteFR) view() ([]byte, uint64, uint64, STag) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rbuf, f.base, f.n, f.stag
}

// registered records a REG_MR posted with rkey and acc.
func (f *remoteFR) registered(rkey STag, acc Access) {
	f.mu.Lock()
	f.stag, f.n, f.rbuf, f.base = rkey, f.mapLen, f.buf, f.iova
	if acc&AccessZeroBased != 0 {
		f.base = 0
	}
	f.mu.Unlock()
}

// remoteAlloc asks the service for a memory object (t) of the PD, unless
// the PD is closed; arg is the object's size or type.
func (pd *PD) remoteAlloc(t svc.Type, arg uint64) (reply, error) {
	pd.mu.Lock()
	closed := pd.closed
	pd.mu.Unlock()
	if closed {
		return reply{}, net.ErrClosed
	}
	return pd.dev.client().do(context.Background(), t, func(b *svc.Builder) { b.Args(pd.handle(), arg) })
}

func (pd *PD) remoteAllocMR(maxPages int) (*MR, error) {
	if maxPages <= 0 || maxPages > iwarp.MaxFastRegPages {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, fmt.Errorf("%w: fast-register MR of %d pages", iwarp.ErrInvalidWR, maxPages))
	}
	cl := pd.dev.client()
	r, err := pd.remoteAlloc(svc.TAllocMR, uint64(maxPages))
	if err != nil {
		return nil, err
	}
	m := &MR{pd: pd, fr: &iwarp.FastRegMR{}}
	m.ops = &remoteMR{m: m, h: r.m.Arg(0), stag: STag(r.m.Arg(1)), fr: &remoteFR{maxPages: maxPages, stag: STag(r.m.Arg(1))}}
	cl.mu.Lock()
	cl.frs[m.fr] = m
	cl.mu.Unlock()
	pd.mu.Lock()
	pd.mrs++
	pd.mu.Unlock()
	return m, nil
}

// invalidWR is the error an embedded MR's map calls return for what
// iwarp refuses.
func invalidWR(format string, args ...any) error {
	return fmt.Errorf("%w: %v", ErrInvalidArgument, fmt.Errorf("%w: "+format, append([]any{iwarp.ErrInvalidWR}, args...)...))
}

func checkPageSize(pageSize int) error {
	if pageSize < iwarp.MinPageSize || pageSize > iwarp.MaxPageSize || pageSize&(pageSize-1) != 0 {
		return invalidWR("page size %d", pageSize)
	}
	return nil
}

// mapEntries sends a MAP_MR's entries, as many messages as they need,
// and returns the IOVA and length of the mapping.
func (m *MR) mapEntries(mode uint64, pageSize, offset, length int, ents []byte) (uint64, uint64, error) {
	cl := m.pd.dev.client()
	flags := uint64(svc.MapFirst)
	for {
		k := min(len(ents), svc.MapEntries*svc.MapEntrySize)
		chunk := ents[:k]
		ents = ents[k:]
		if len(ents) == 0 {
			flags |= svc.MapLast
		}
		r, err := cl.do(context.Background(), svc.TMapMR, func(b *svc.Builder) {
			b.Args(m.remote().h, mode|flags, uint64(pageSize), uint64(offset), uint64(length)).Bytes(chunk)
		})
		if err != nil {
			return 0, 0, err
		}
		if flags&svc.MapLast != 0 {
			return r.m.Arg(0), r.m.Arg(1), nil
		}
		flags = 0
	}
}

func (m *MR) remoteMapPages(pages [][]byte, pageSize, offset, length int) error {
	f := m.remote().fr
	if err := checkPageSize(pageSize); err != nil {
		return err
	}
	if len(pages) == 0 || len(pages) > f.maxPages {
		return invalidWR("%d pages, the MR maps 1 to %d", len(pages), f.maxPages)
	}
	if offset < 0 || offset >= pageSize || length < 0 || offset+length > len(pages)*pageSize {
		return invalidWR("%d bytes at offset %d of %d pages of %d", length, offset, len(pages), pageSize)
	}
	// Runs of pages that follow one another in memory.
	var ents []byte
	var runAddr, runEnd uint64
	var runN uint32
	flush := func() {
		if runN > 0 {
			ents = binary.LittleEndian.AppendUint64(ents, runAddr)
			ents = binary.LittleEndian.AppendUint64(ents, uint64(runN))
		}
	}
	for i, p := range pages {
		if len(p) != pageSize {
			return invalidWR("page %d is %d bytes, not %d", i, len(p), pageSize)
		}
		a := iwarp.BufferAddr(p)
		if runN > 0 && a == runEnd && runN < 1<<31 {
			runN++
		} else {
			flush()
			runAddr, runN = a, 1
		}
		runEnd = a + uint64(pageSize)
	}
	flush()
	iova, n, err := m.mapEntries(svc.MapPages, pageSize, offset, length, ents)
	if err != nil {
		return err
	}
	var buf []byte
	if len(ents) == svc.MapEntrySize {
		buf = unsafe.Slice(unsafe.SliceData(pages[0]), len(pages)*pageSize)[offset : offset+length : offset+length]
	}
	f.setMapping(iova, n, buf)
	return nil
}

func (f *remoteFR) setMapping(iova, n uint64, buf []byte) {
	f.mu.Lock()
	f.mapped, f.iova, f.mapLen, f.buf = true, iova, n, buf
	f.mu.Unlock()
}

func (m *MR) remoteMapSG(sgl []SGE, pageSize int) error {
	if err := checkPageSize(pageSize); err != nil {
		return err
	}
	if len(sgl) == 0 {
		return invalidWR("empty SGE list")
	}
	ents := make([]byte, 0, len(sgl)*svc.MapEntrySize)
	for _, s := range sgl {
		ents = binary.LittleEndian.AppendUint64(ents, s.Addr)
		ents = binary.LittleEndian.AppendUint32(ents, s.Length)
		ents = binary.LittleEndian.AppendUint32(ents, s.LKey)
	}
	iova, n, err := m.mapEntries(svc.MapSG, pageSize, 0, 0, ents)
	if err != nil {
		return err
	}
	// The bytes, when the SGEs make one run of this process's memory.
	cl := m.pd.dev.client()
	var buf []byte
	one := true
	for i, s := range sgl {
		cl.mu.Lock()
		mr := cl.mrKeys[s.LKey]
		cl.mu.Unlock()
		var b []byte
		if mr != nil {
			b, _ = mr.r.Slice(s.Addr, uint64(s.Length))
		}
		switch {
		case b == nil && s.Length > 0:
			one = false
		case i == 0:
			buf = b
		case len(b) == 0:
		case len(buf) > 0 && cap(buf)-len(buf) >= len(b) && unsafe.SliceData(buf[len(buf):len(buf)+1]) == unsafe.SliceData(b):
			buf = buf[:len(buf)+len(b)]
		default:
			one = false
		}
	}
	if !one {
		buf = nil
	}
	m.remote().fr.setMapping(iova, n, buf)
	return nil
}

func (m *MR) remoteSetIOVA(iova uint64) error {
	_, err := m.pd.dev.client().do(context.Background(), svc.TSetIOVA, func(b *svc.Builder) { b.Args(m.remote().h, iova) })
	if err != nil {
		return err
	}
	fr := m.remote().fr
	fr.mu.Lock()
	fr.iova = iova
	fr.mu.Unlock()
	return nil
}

// remoteValid asks the service whether a fast-register MR is valid.
func (m *MR) remoteValid() bool {
	r, err := m.pd.dev.client().do(context.Background(), svc.TQueryMem, func(b *svc.Builder) { b.Args(m.remote().h) })
	return err == nil && r.m.Arg(1) != 0
}

// remoteMW is the client's side of a window of a service: the binding
// last posted. mu, a leaf, guards buf; it is taken inside remoteQP.sqMu
// when a BIND_MW is checked and posted.
type remoteMW struct {
	cl  *client
	h   uint64
	typ MWType

	mu sync.Mutex
	// +checklocks:mu
	buf RemoteBuf
}

func (pd *PD) remoteAllocMW(t MWType) (*MW, error) {
	if t != MWType1 && t != MWType2 {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, fmt.Errorf("%w: window type %d", iwarp.ErrInvalidWR, t))
	}
	cl := pd.dev.client()
	r, err := pd.remoteAlloc(svc.TAllocMW, uint64(t))
	if err != nil {
		return nil, err
	}
	mw := &MW{pd: pd, w: &iwarp.Window{}, ops: &remoteMW{cl: cl, h: r.m.Arg(0), typ: t, buf: RemoteBuf{RKey: STag(r.m.Arg(1))}}}
	cl.mu.Lock()
	cl.mwt[mw.w] = mw
	cl.mu.Unlock()
	pd.mu.Lock()
	pd.mrs++
	pd.mu.Unlock()
	return mw, nil
}

func (r *remoteMW) binding() RemoteBuf {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf
}

// bound records a binding posted.
func (r *remoteMW) bound(stag STag, b *iwarp.MWBind) {
	r.mu.Lock()
	r.buf = RemoteBuf{Addr: b.Addr, Len: b.Length, RKey: stag}
	if Access(b.Access)&AccessZeroBased != 0 {
		r.buf.Addr = 0
	}
	r.mu.Unlock()
}

// remote returns a service's window's side; nil for an embedded window.
func (mw *MW) remote() *remoteMW {
	r, _ := mw.ops.(*remoteMW)
	return r
}

func (r *remoteMW) mwType() MWType { return r.typ }
func (r *remoteMW) rkey() STag     { return r.binding().RKey }

func (r *remoteMW) valid() bool {
	rep, err := r.cl.do(context.Background(), svc.TQueryMem, func(b *svc.Builder) { b.Args(r.h) })
	return err == nil && rep.m.Arg(1) != 0
}

func (r *remoteMW) dealloc(mw *MW) {
	r.cl.do(context.Background(), svc.TDeallocMW, func(b *svc.Builder) { b.Args(r.h) })
	r.cl.mu.Lock()
	delete(r.cl.mwt, mw.w)
	r.cl.mu.Unlock()
}

func (rq *remoteQP) bindMW(mw *MW, id uint64, flags SendFlags, b BindInfo) (STag, error) {
	qp := rq.qp
	cl := qp.remote().cl
	if mw.remote() == nil || mw.remote().cl != cl {
		return 0, &PostError{Err: fmt.Errorf("%w: BIND_MW of a window of another device", iwarp.ErrInvalidWR)}
	}
	if mw.pd != qp.pd {
		return 0, &PostError{Err: fmt.Errorf("%w: BIND_MW of a window of another protection domain", iwarp.ErrInvalidWR)}
	}
	if mw.remote().typ != MWType1 {
		return 0, &PostError{Err: fmt.Errorf("%w: a type 2 window is bound by a BIND_MW work request", iwarp.ErrInvalidWR)}
	}
	bi := b.iwarp()
	if b.Access&^windowAccess != 0 {
		return 0, &PostError{Err: fmt.Errorf("%w: window access %#x (remote read, write, atomic, zero-based only)", iwarp.ErrInvalidWR, uint32(bi.Access))}
	}
	select {
	case <-qp.remote().done:
		return 0, &PostError{Err: iwarp.ErrInvalidState}
	default:
	}
	r, err := cl.do(context.Background(), svc.TBindMW, func(bb *svc.Builder) {
		bb.Args(uint64(qp.remote().num), mw.remote().h, id, uint64(flags), uint64(bi.MR), bi.Addr, bi.Length, uint64(bi.Access))
	})
	if err != nil {
		return 0, &PostError{Err: err}
	}
	stag := STag(r.m.Arg(0))
	if bi.Length > 0 {
		mw.remote().bound(stag, &bi)
	}
	return stag, nil
}

// windowAccess are the rights a window may grant (iwarp's).
const windowAccess = AccessRemoteRead | AccessRemoteWrite | AccessRemoteAtomic | AccessZeroBased

// checkLocal checks a memory registration WR as the engine does at post
// time, and returns the service's handle of its MR or window.
func (r *remoteQP) checkLocal(qp *QP, wr *SendWR) (uint64, error) {
	if len(wr.SGL) != 0 || wr.Flags&(Inline|Solicited) != 0 {
		return 0, fmt.Errorf("%w: %v takes no SGEs, inline data or solicited event", iwarp.ErrInvalidWR, wr.Op)
	}
	switch wr.Op {
	case OpRegMR:
		r.cl.mu.Lock()
		m := r.cl.frs[wr.mr]
		r.cl.mu.Unlock()
		switch {
		case m == nil:
			return 0, fmt.Errorf("%w: REG_MR without an MR", iwarp.ErrInvalidWR)
		case m.pd != qp.pd:
			return 0, fmt.Errorf("%w: REG_MR of an MR of another protection domain", iwarp.ErrInvalidWR)
		case wr.RKey>>8 != m.remote().stag>>8:
			return 0, fmt.Errorf("%w: REG_MR key %#x is not of the MR's STag %#x", iwarp.ErrInvalidWR, wr.RKey, m.stag())
		}
		all := AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic | AccessMWBind | AccessZeroBased
		switch {
		case wr.Access&^all != 0:
			return 0, fmt.Errorf("%w: access flags %#x", iwarp.ErrInvalidWR, uint32(wr.Access))
		case wr.Access&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && wr.Access&AccessLocalWrite == 0:
			return 0, fmt.Errorf("%w: remote write and atomic access require local write", iwarp.ErrInvalidWR)
		}
		return m.remote().h, nil
	case OpBindMW:
		r.cl.mu.Lock()
		w := r.cl.mwt[wr.mw]
		r.cl.mu.Unlock()
		switch {
		case w == nil:
			return 0, fmt.Errorf("%w: BIND_MW without a window", iwarp.ErrInvalidWR)
		case w.pd != qp.pd:
			return 0, fmt.Errorf("%w: BIND_MW of a window of another protection domain", iwarp.ErrInvalidWR)
		case w.remote().typ != MWType2:
			return 0, fmt.Errorf("%w: a type 1 window is bound by QP.BindMW, not a work request", iwarp.ErrInvalidWR)
		case wr.RKey>>8 != w.remote().binding().RKey>>8:
			return 0, fmt.Errorf("%w: BIND_MW key %#x is not of the window's STag %#x", iwarp.ErrInvalidWR, wr.RKey, w.remote().binding().RKey)
		case wr.bind.MR == 0:
			return 0, fmt.Errorf("%w: BIND_MW without an MR", iwarp.ErrInvalidWR)
		case Access(wr.bind.Access)&^windowAccess != 0:
			return 0, fmt.Errorf("%w: window access %#x (remote read, write, atomic, zero-based only)", iwarp.ErrInvalidWR, uint32(wr.bind.Access))
		}
		return w.remote().h, nil
	}
	return 0, nil
}

// posted records what a memory registration WR just posted will register.
func (r *remoteQP) posted(wr *SendWR) {
	switch wr.Op {
	case OpRegMR:
		r.cl.mu.Lock()
		m := r.cl.frs[wr.mr]
		r.cl.mu.Unlock()
		m.remote().fr.registered(wr.RKey, wr.Access)
	case OpBindMW:
		r.cl.mu.Lock()
		w := r.cl.mwt[wr.mw]
		r.cl.mu.Unlock()
		w.remote().bound(wr.RKey, &wr.bind)
	}
}

// --- CQ ---

// remoteCQ is the client's side of a CQ ring. Its consumer state, cons
// and seen, is under the CQ's mu (Poll, Len, WaitEvent); the ring's
// shared indexes are atomics; dead is stored once, by release (under the
// CQ's mu from Close, or by the client's close).
type remoteCQ struct {
	cq   *CQ
	cl   *client
	h    uint64
	mem  []byte
	ring *svc.Ring
	cons uint32 // under CQ.mu
	ev   *svc.Eventfd
	seen uint32 // events consumed; under CQ.mu
	// spin is how long Wait polls before it sleeps (see remoteCQ.wait);
	// zero: spinWait.
	spin atomic.Int64
	dead atomic.Bool
	once sync.Once
}

func (cl *client) createCQ(cqe int) (*CQ, error) {
	r, err := cl.do(context.Background(), svc.TCreateCQ, func(b *svc.Builder) { b.Args(uint64(cqe)) })
	if err != nil {
		return nil, err
	}
	if len(r.fds) != 2 {
		closeFDs(r.fds)
		return nil, fmt.Errorf("verbs: service's CREATE_CQ reply carried %d descriptors", len(r.fds))
	}
	rc := &remoteCQ{cl: cl, h: r.m.Arg(0)}
	mem, err := svc.MapRing(r.fds[0])
	closeFd(r.fds[0])
	if err == nil {
		rc.mem = mem
		rc.ring, err = svc.OpenRing(mem)
		if err == nil && rc.ring.EntrySize() != svc.CQEntrySize {
			err = svc.ErrRingEntry
		}
	}
	if err == nil {
		rc.ev, err = svc.OpenEventfd(r.fds[1])
	} else {
		closeFd(r.fds[1])
	}
	if err != nil {
		if rc.mem != nil {
			svc.Unmap(rc.mem)
		}
		cl.do(context.Background(), svc.TDestroyCQ, func(b *svc.Builder) { b.Args(rc.h) })
		return nil, err
	}
	cq := newCQ(cl.dev, nil)
	rc.cq, cq.ops = cq, rc
	cl.mu.Lock()
	cl.cqs[cq] = struct{}{}
	cl.mu.Unlock()
	return cq, nil
}

// remote returns a service's CQ's side; nil for an embedded CQ.
func (cq *CQ) remote() *remoteCQ {
	r, _ := cq.ops.(*remoteCQ)
	return r
}

func (rc *remoteCQ) poll(dst []WC) int {
	rc.cq.mu.Lock()
	n := rc.take(dst)
	rc.cq.mu.Unlock()
	return n
}

// take moves completions from the ring; cq.mu is held.
func (rc *remoteCQ) take(dst []WC) int {
	if rc.dead.Load() {
		return 0
	}
	n, err := rc.ring.Pending(rc.cons)
	if err != nil {
		return 0
	}
	k := min(len(dst), int(n))
	for i := 0; i < k; i++ {
		svc.GetCompletion(rc.ring.Entry(rc.cons), engineWC(&dst[i]))
		rc.cons++
	}
	if k > 0 {
		rc.ring.Cons.Store(rc.cons)
	}
	return k
}

// spinWait is how long CQ.Wait polls at most before it sleeps on the
// eventfd.
const spinWait = 20 * time.Microsecond

// wait polls, then sleeps on the CQ's eventfd. The spin adapts as the
// service's ring poller's does: the whole spinWait while completions come
// within it, halved (down to a sixteenth) after each wait that took longer
// — spinning through the gaps between the completions of large transfers
// only takes the CPU from the goroutines that move the data.
func (rc *remoteCQ) wait(ctx context.Context, dst []WC) (int, error) {
	start := time.Now()
	spin := time.Duration(rc.spin.Load())
	if spin == 0 {
		spin = spinWait
	}
	done := func() {
		if time.Since(start) <= spinWait {
			spin = spinWait
		} else {
			spin = max(spin/2, spinWait/16)
		}
		rc.spin.Store(int64(spin))
	}
	for {
		if n := rc.poll(dst); n > 0 {
			done()
			return n, nil
		}
		if rc.dead.Load() {
			return 0, net.ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		select {
		case <-rc.cl.s.Done():
			return 0, rc.cl.s.Err() // the service is gone
		default:
		}
		if time.Since(start) < spin {
			runtime.Gosched()
			continue
		}
		rc.ring.Waiting.Add(1)
		if n := rc.poll(dst); n > 0 {
			rc.ring.Waiting.Add(^uint32(0))
			done()
			return n, nil
		}
		err := rc.sleep(ctx)
		rc.ring.Waiting.Add(^uint32(0))
		if err != nil {
			return 0, err
		}
	}
}

// sleep waits on the CQ's eventfd until it rings, ctx ends or the CQ closes.
func (rc *remoteCQ) sleep(ctx context.Context) error {
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { rc.ev.SetDeadline(time.Unix(1, 0)) })
		defer stop()
	}
	rc.ev.SetDeadline(time.Time{})
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case <-rc.cl.s.Done():
		return rc.cl.s.Err()
	default:
	}
	if err := rc.ev.Wait(); err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil // another waiter's context ended: look again
		}
		return net.ErrClosed
	}
	return nil
}

func (rc *remoteCQ) reqNotify(solicitedOnly bool) error {
	if rc.dead.Load() {
		return net.ErrClosed
	}
	arm := rc.ring.Arm
	if solicitedOnly {
		arm.CompareAndSwap(svc.ArmNone, svc.ArmSolicited)
	} else {
		arm.Store(svc.ArmAny)
	}
	return nil
}

func (rc *remoteCQ) waitEvent(ctx context.Context) error {
	cq := rc.cq
	for {
		cq.mu.Lock()
		if rc.ring.Events.Load() != rc.seen {
			rc.seen++
			cq.mu.Unlock()
			return nil
		}
		cq.mu.Unlock()
		if rc.dead.Load() {
			return net.ErrClosed
		}
		select {
		case <-rc.cl.s.Done():
			return rc.cl.s.Err()
		default:
		}
		rc.ring.Waiting.Add(1)
		if rc.ring.Events.Load() != rc.seen {
			rc.ring.Waiting.Add(^uint32(0))
			continue
		}
		err := rc.sleep(ctx)
		rc.ring.Waiting.Add(^uint32(0))
		if err != nil {
			return err
		}
	}
}

func (rc *remoteCQ) pending() int {
	rc.cq.mu.Lock()
	defer rc.cq.mu.Unlock()
	if rc.dead.Load() {
		return 0
	}
	n, _ := rc.ring.Pending(rc.cons)
	return int(n)
}

func (rc *remoteCQ) overflowed() bool {
	return !rc.dead.Load() && rc.ring.Overflow.Load() != 0
}

func (rc *remoteCQ) destroy() error {
	cq := rc.cq
	if rc.dead.Load() {
		return nil
	}
	_, err := rc.cl.do(context.Background(), svc.TDestroyCQ, func(b *svc.Builder) { b.Args(rc.h) })
	if errors.Is(err, ErrBusy) {
		return err
	}
	rc.cl.mu.Lock()
	delete(rc.cl.cqs, cq)
	rc.cl.mu.Unlock()
	cq.mu.Lock()
	rc.release()
	cq.mu.Unlock()
	return nil
}

// release unmaps the ring; Poll then finds nothing.
func (rc *remoteCQ) release() {
	rc.once.Do(func() {
		rc.dead.Store(true)
		rc.ev.Close()
		// The mapping stays until the CQ is unreachable: a Poll racing
		// with Close must not fault.
		mem := rc.mem
		runtime.AddCleanup(rc, func(m []byte) { svc.Unmap(m) }, mem)
	})
}

// --- QP ---

// remoteQP is the client's side of a QP's rings.
//
// sqMu serialises the posters of the send ring: it guards sqProd and the
// entries being written, and is held across the checks of a REG_MR or
// BIND_MW (sqMu → client.mu, remoteFR.mu, remoteMW.mu); publishSQ stores
// the index and releases it. rqMu guards rqProd and the receive ring's
// entries being written (postRing); errMu guards err. They are not
// annotated for checklocks: it attributes the annotations after a
// multi-name field to the wrong fields. The rest never changes.
type remoteQP struct {
	qp     *QP
	cl     *client
	num    uint32
	mem    []byte
	sq, rq *svc.Ring
	sqMu   sync.Mutex
	sqProd uint32
	rqMu   sync.Mutex
	rqProd uint32

	maxSendSGE, maxRecvSGE, maxInline int

	done     chan struct{}
	doneOnce sync.Once
	errMu    sync.Mutex
	err      error
	relOnce  sync.Once
}

func (pd *PD) remoteCreateQP(cfg QPConfig) (*QP, error) {
	cl := pd.dev.client()
	if cfg.SendCQ.remote() == nil || cfg.RecvCQ.remote() == nil || cfg.SendCQ.dev != pd.dev || cfg.RecvCQ.dev != pd.dev {
		return nil, fmt.Errorf("%w: CQ of another device", ErrInvalidArgument)
	}
	var srq uint64
	if cfg.SRQ != nil {
		if cfg.SRQ.pd != pd || cfg.SRQ.remote() == nil {
			return nil, fmt.Errorf("%w: SRQ belongs to another PD", ErrInvalidArgument)
		}
		if !cfg.SRQ.use() {
			return nil, fmt.Errorf("%w: the SRQ is closed", ErrInvalidArgument)
		}
		srq = cfg.SRQ.remote().h
	}
	qp, err := pd.remoteCreateQPOn(cl, cfg, srq)
	if err != nil && cfg.SRQ != nil {
		cfg.SRQ.unuse()
	}
	return qp, err
}

func (pd *PD) remoteCreateQPOn(cl *client, cfg QPConfig, srq uint64) (*QP, error) {
	var flags uint64
	if cfg.SignalAll {
		flags |= 1
	}
	r, err := cl.do(context.Background(), svc.TCreateQP, func(b *svc.Builder) {
		b.Args(pd.handle(), cfg.SendCQ.remote().h, cfg.RecvCQ.remote().h, srq, uint64(cfg.MaxSendWR), uint64(cfg.MaxRecvWR),
			uint64(cfg.MaxSendSGE), uint64(cfg.MaxRecvSGE), uint64(cfg.MaxInline), flags)
	})
	if err != nil {
		return nil, err
	}
	if len(r.fds) != 1 {
		closeFDs(r.fds)
		return nil, fmt.Errorf("verbs: service's CREATE_QP reply carried %d descriptors", len(r.fds))
	}
	num := uint32(r.m.Arg(0))
	sqBytes := int(r.m.Arg(1))
	rq := &remoteQP{cl: cl, num: num, maxSendSGE: cfg.MaxSendSGE, maxRecvSGE: cfg.MaxRecvSGE, maxInline: cfg.MaxInline,
		done: make(chan struct{})}
	mem, err := svc.MapRing(r.fds[0])
	closeFd(r.fds[0])
	if err == nil {
		rq.mem = mem
		if sqBytes <= 0 || sqBytes > len(mem) {
			err = svc.ErrRingEntry
		}
	}
	if err == nil {
		rq.sq, err = svc.OpenRing(mem[:sqBytes])
	}
	if err == nil && cfg.SRQ == nil {
		rq.rq, err = svc.OpenRing(mem[sqBytes:])
	}
	if err != nil {
		if rq.mem != nil {
			svc.Unmap(rq.mem)
		}
		cl.do(context.Background(), svc.TDestroyQP, func(b *svc.Builder) { b.Args(uint64(num)) })
		return nil, err
	}
	qp := &QP{pd: pd, cfg: cfg, ops: rq}
	rq.qp = qp
	cl.mu.Lock()
	cl.qps[num] = qp
	cl.mu.Unlock()
	pd.mu.Lock()
	pd.qps++
	pd.mu.Unlock()
	return qp, nil
}

func (r *remoteQP) finish(err error) {
	r.errMu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.errMu.Unlock()
	r.doneOnce.Do(func() { close(r.done) })
}

func (r *remoteQP) release() {
	r.relOnce.Do(func() {
		mem := r.mem
		runtime.AddCleanup(r, func(m []byte) { svc.Unmap(m) }, mem)
	})
}

// waitProgress is WaitProgress on a device of a service: the service's
// receive path runs on its own, so a caller spinning on memory need only
// look again; it yields once, and reports the QP's end as WaitProgress
// does.
func (r *remoteQP) waitProgress(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-r.done:
		r.errMu.Lock()
		defer r.errMu.Unlock()
		if r.err != nil {
			return r.err
		}
		return net.ErrClosed
	default:
	}
	runtime.Gosched()
	return nil
}

func (r *remoteQP) state() QPState {
	rep, err := r.cl.do(context.Background(), svc.TQueryQP, func(b *svc.Builder) { b.Args(uint64(r.num)) })
	if err != nil {
		return QPError
	}
	return QPState(rep.m.Arg(0))
}

// checkSend checks what the service would refuse at once, so the common
// mistakes fail in PostSend as they do on an embedded device; it returns
// the handle of a REG_MR's MR or a BIND_MW's window.
func (r *remoteQP) checkSend(qp *QP, wr *SendWR) (uint64, error) {
	if !svc.SendOpAllowed(iwarp.WROp(wr.Op)) {
		return 0, fmt.Errorf("%w: opcode %v", iwarp.ErrInvalidWR, wr.Op)
	}
	if wr.Op == OpRegMR || wr.Op == OpBindMW || wr.Op == OpLocalInv {
		return r.checkLocal(qp, wr)
	}
	return 0, r.checkData(wr)
}

func (r *remoteQP) checkData(wr *SendWR) error {
	if len(wr.SGL) > r.maxSendSGE {
		return ErrTooManySGE
	}
	if (wr.Op == OpRead || wr.Op == OpReadInv) && len(wr.SGL) > 1 {
		return fmt.Errorf("%w: RDMA Read takes at most one SGE", ErrTooManySGE)
	}
	if wr.Flags&Inline != 0 {
		var n uint64
		for _, s := range wr.SGL {
			n += uint64(s.Length)
		}
		if n > uint64(r.maxInline) {
			return fmt.Errorf("%w: %d bytes inline, max %d", iwarp.ErrInvalidWR, n, r.maxInline)
		}
	}
	return nil
}

func (qp *QP) remotePostSend(wrs []SendWR) error {
	r := qp.remote()
	select {
	case <-r.done:
		return &PostError{Index: 0, Err: iwarp.ErrInvalidState}
	default:
	}
	r.sqMu.Lock()
	free, err := r.sq.Free(r.sqProd)
	if err != nil {
		r.sqMu.Unlock()
		return &PostError{Index: 0, Err: err}
	}
	for i := range wrs {
		obj, err := r.checkSend(qp, &wrs[i])
		if err != nil {
			r.publishSQ()
			return &PostError{Index: i, Err: err}
		}
		if free == 0 {
			r.publishSQ()
			return &PostError{Index: i, Err: ErrQueueFull}
		}
		if e := r.sq.Entry(r.sqProd); !r.putInline(qp, e, &wrs[i]) {
			svc.PutSend(e, engineWR(&wrs[i]), obj)
		}
		if obj != 0 {
			r.posted(&wrs[i])
		}
		r.sqProd++
		free--
	}
	r.publishSQ()
	return nil
}

// putInline writes an inline Send or RDMA Write with its payload in the
// entry (FeatureInlineData), gathered from this process's own mapping of
// its MRs, and reports whether it did: a WR that is not inline, or whose
// SGEs name no regular MR of the QP's PD within its bounds, goes with its
// SGL, which the service checks (and copies) when it takes the entry.
func (r *remoteQP) putInline(qp *QP, e []byte, wr *SendWR) bool {
	if r.cl.features&svc.FeatureInlineData == 0 || wr.Flags&Inline == 0 || !svc.InlineDataOp(iwarp.WROp(wr.Op)) {
		return false
	}
	room := e[svc.SendEntryBase:]
	n := 0
	for _, s := range wr.SGL {
		r.cl.mu.Lock()
		mr := r.cl.mrKeys[s.LKey]
		r.cl.mu.Unlock()
		if mr == nil || mr.pd != qp.pd {
			return false
		}
		b, ok := mr.r.Slice(s.Addr, uint64(s.Length))
		if !ok || len(b) > len(room)-n {
			return false
		}
		n += copy(room[n:], b)
	}
	svc.PutSendData(e, engineWR(wr), room[:n])
	return true
}

// publishSQ stores the producer index, unlocks and rings the doorbell.
// +checklocksrelease:r.sqMu
func (r *remoteQP) publishSQ() {
	r.sq.Prod.Store(r.sqProd)
	r.sqMu.Unlock()
	r.cl.ring()
}

func (qp *QP) remotePostRecv(wrs []RecvWR) error {
	r := qp.remote()
	if r.rq == nil {
		return &PostError{Index: 0, Err: fmt.Errorf("%w: QP uses a shared receive queue", iwarp.ErrInvalidWR)}
	}
	select {
	case <-r.done:
		return &PostError{Index: 0, Err: iwarp.ErrInvalidState}
	default:
	}
	return postRing(r.cl, r.rq, &r.rqMu, &r.rqProd, r.maxRecvSGE, wrs)
}

// postRing writes receive WRs into an RQ ring.
func postRing(cl *client, ring *svc.Ring, mu *sync.Mutex, prod *uint32, maxSGE int, wrs []RecvWR) error {
	mu.Lock()
	free, err := ring.Free(*prod)
	if err != nil {
		mu.Unlock()
		return &PostError{Index: 0, Err: err}
	}
	var perr error
	for i := range wrs {
		if len(wrs[i].SGL) > maxSGE {
			perr = &PostError{Index: i, Err: ErrTooManySGE}
			break
		}
		if free == 0 {
			perr = &PostError{Index: i, Err: ErrQueueFull}
			break
		}
		svc.PutRecv(ring.Entry(*prod), wrs[i].ID, engineSGL(wrs[i].SGL))
		*prod++
		free--
	}
	ring.Prod.Store(*prod)
	mu.Unlock()
	cl.ring()
	return perr
}

func (qp *QP) remoteClose() error {
	r := qp.remote()
	_, err := r.cl.do(context.Background(), svc.TDestroyQP, func(b *svc.Builder) { b.Args(uint64(r.num)) })
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	r.finish(nil)
	r.cl.mu.Lock()
	_, ok := r.cl.qps[r.num]
	delete(r.cl.qps, r.num)
	r.cl.mu.Unlock()
	if ok {
		qp.pd.mu.Lock()
		qp.pd.qps--
		qp.pd.mu.Unlock()
		if qp.cfg.SRQ != nil {
			qp.cfg.SRQ.unuse()
		}
	}
	r.release()
	return nil
}

func (qp *QP) remoteDisconnect(ctx context.Context) error {
	_, err := qp.remote().cl.do(ctx, svc.TDisconnect, func(b *svc.Builder) { b.Args(uint64(qp.remote().num)) })
	return err
}

// --- SRQ ---

// remoteSRQ is the client's side of an SRQ's ring. mu, a leaf, serialises
// the posters: it guards prod and the entries being written (postRing,
// which is given the lock and the index; not annotated, as checklocks
// cannot follow them there). The rest never changes.
type remoteSRQ struct {
	cl      *client
	h       uint64
	mem     []byte
	ring    *svc.Ring
	mu      sync.Mutex
	prod    uint32
	maxSGE  int
	relOnce sync.Once
}

func (pd *PD) remoteCreateSRQ(maxWR, maxSGE int) (*SRQ, error) {
	cl := pd.dev.client()
	r, err := cl.do(context.Background(), svc.TCreateSRQ, func(b *svc.Builder) { b.Args(pd.handle(), uint64(maxWR), uint64(maxSGE)) })
	if err != nil {
		return nil, err
	}
	if len(r.fds) != 1 {
		closeFDs(r.fds)
		return nil, fmt.Errorf("verbs: service's CREATE_SRQ reply carried %d descriptors", len(r.fds))
	}
	rs := &remoteSRQ{cl: cl, h: r.m.Arg(0), maxSGE: maxSGE}
	mem, err := svc.MapRing(r.fds[0])
	closeFd(r.fds[0])
	if err == nil {
		rs.mem = mem
		rs.ring, err = svc.OpenRing(mem)
	}
	if err != nil {
		if rs.mem != nil {
			svc.Unmap(rs.mem)
		}
		return nil, err
	}
	s := &SRQ{pd: pd, ops: rs}
	cl.mu.Lock()
	cl.srqs[rs.h] = s
	cl.mu.Unlock()
	return s, nil
}

func (r *remoteSRQ) release() {
	r.relOnce.Do(func() {
		mem := r.mem
		runtime.AddCleanup(r, func(m []byte) { svc.Unmap(m) }, mem)
	})
}

// remote returns a service's SRQ's side; nil for an embedded SRQ.
func (s *SRQ) remote() *remoteSRQ {
	r, _ := s.ops.(*remoteSRQ)
	return r
}

func (r *remoteSRQ) postRecv(wrs []RecvWR) error {
	return postRing(r.cl, r.ring, &r.mu, &r.prod, r.maxSGE, wrs)
}

// pending: the receives the service has not yet taken from the ring are
// not known; none are counted.
func (r *remoteSRQ) pending() int { return 0 }

// destroy destroys the service's SRQ; the ring stays mapped until the
// SRQ is unreachable (release).
func (r *remoteSRQ) destroy() error {
	_, err := r.cl.do(context.Background(), svc.TDestroySRQ, func(b *svc.Builder) { b.Args(r.h) })
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	r.cl.mu.Lock()
	delete(r.cl.srqs, r.h)
	r.cl.mu.Unlock()
	r.release()
	return nil
}

func (r *remoteSRQ) setLimit(limit int) error {
	_, err := r.cl.do(context.Background(), svc.TSRQLimit, func(b *svc.Builder) { b.Args(r.h, uint64(limit)) })
	return err
}

// --- connections ---

func connArgs(b *svc.Builder, p ConnParams) {
	b.Args(uint64(int64(p.IRD)), uint64(int64(p.ORD)), svc.Tri(p.CRC), uint64(p.MPARevision), svc.Tri(p.PeerToPeer),
		uint64(p.RTR), svc.Tri(p.Markers))
}

// connFrom reads a DIAL or ACCEPT reply: negotiated parameters, the
// addresses and the peer's private data.
func connFrom(qp *QP, m svc.Msg) (*Conn, error) {
	var f [svc.ConnFields][]byte
	if n, err := svc.Fields(m.Payload(), f[:]); err != nil || n != svc.ConnFields {
		return nil, fmt.Errorf("verbs: malformed connection reply from the service")
	}
	la, err1 := netip.ParseAddrPort(string(f[svc.ConnFieldLocal]))
	ra, err2 := netip.ParseAddrPort(string(f[svc.ConnFieldRemote]))
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("verbs: malformed addresses from the service")
	}
	neg := Negotiated{MPARevision: uint8(m.Arg(svc.NegMPARevision)), CRC: m.Arg(svc.NegCRC) != 0, IRD: int(m.Arg(svc.NegIRD)),
		ORD: int(m.Arg(svc.NegORD)), PeerToPeer: m.Arg(svc.NegPeerToPeer) != 0, RTR: RTR(m.Arg(svc.NegRTR)),
		MarkersTx: m.Arg(svc.NegMarkersTx) != 0, MarkersRx: m.Arg(svc.NegMarkersRx) != 0}
	return &Conn{qp: qp, peerData: append([]byte(nil), f[svc.ConnFieldPrivateData]...), neg: neg, laddr: la, raddr: ra}, nil
}

func (cl *client) dial(ctx context.Context, qp *QP, raddr netip.AddrPort, p ConnParams) (*Conn, error) {
	d := cl.dev
	if qp == nil || qp.remote() == nil || qp.pd.dev != d {
		return nil, fmt.Errorf("%w: QP of another device", ErrInvalidArgument)
	}
	local := ""
	if p.LocalAddr.Port() != 0 {
		if cl.features&svc.FeatureCM == 0 {
			return nil, fmt.Errorf("%w: the service cannot connect from a chosen port (no CM feature)", ErrInvalidArgument)
		}
		local = svc.FormatLocalAddr(p.LocalAddr)
	}
	r, err := d.client().do(ctx, svc.TDial, func(b *svc.Builder) {
		b.Args(uint64(qp.remote().num))
		connArgs(b, p)
		b.String(raddr.String()).Bytes(p.PrivateData)
		if local != "" {
			b.String(local)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("verbs: connect %v: %w", raddr, err)
	}
	return connFrom(qp, r.m)
}

func (cl *client) listen(laddr netip.AddrPort, cfg ListenConfig) (*Listener, error) {
	d := cl.dev
	addr := "" // any address, any port
	switch {
	case laddr.IsValid():
		addr = laddr.String()
	case laddr.Port() != 0:
		addr = ":" + strconv.Itoa(int(laddr.Port())) // any address, this port (perftest's 18515)
	}
	r, err := d.client().do(context.Background(), svc.TListen, func(b *svc.Builder) {
		b.Args(uint64(cfg.Backlog), uint64(cfg.MPATimeout)).String(addr)
	})
	if err != nil {
		return nil, fmt.Errorf("verbs: listen %v: %w", laddr, err)
	}
	var f [1][]byte
	svc.Fields(r.m.Payload(), f[:])
	var ip netip.Addr // the unspecified address: listening on all
	if len(f[0]) > 0 {
		if ip, err = netip.ParseAddr(string(f[0])); err != nil {
			return nil, fmt.Errorf("verbs: malformed listen address from the service")
		}
	}
	l := &Listener{dev: d, closed: make(chan struct{})}
	l.ops = &remoteListener{l: l, h: r.m.Arg(svc.ListenHandle), laddr: netip.AddrPortFrom(ip, uint16(r.m.Arg(svc.ListenPort)))}
	d.mu.Lock()
	d.listeners[l] = struct{}{}
	d.mu.Unlock()
	return l, nil
}

// remoteListener is a listener of a service: its handle and address.
type remoteListener struct {
	l     *Listener
	h     uint64
	laddr netip.AddrPort
}

func (rl *remoteListener) addr() netip.AddrPort { return rl.laddr }

func (rl *remoteListener) getRequest(ctx context.Context) (*ConnRequest, error) {
	l := rl.l
	select {
	case <-l.closed:
		return nil, net.ErrClosed
	default:
	}
	r, err := l.dev.client().do(ctx, svc.TGetRequest, func(b *svc.Builder) { b.Args(rl.h) })
	if err != nil {
		return nil, err
	}
	m := r.m
	var f [svc.ReqFields][]byte
	if n, err := svc.Fields(m.Payload(), f[:]); err != nil || n != svc.ReqFields {
		return nil, fmt.Errorf("verbs: malformed connection request from the service")
	}
	ra, _ := netip.ParseAddrPort(string(f[svc.ReqFieldAddr]))
	req := &iwarp.MPARequest{Revision: uint8(m.Arg(svc.ReqMPARevision)), CRC: m.Arg(svc.ReqCRC) != 0,
		Enhanced: m.Arg(svc.ReqMPARevision) == 2,
		V2: iwarp.MPAv2Params{IRD: uint16(m.Arg(svc.ReqIRD)), ORD: uint16(m.Arg(svc.ReqORD)),
			PeerToPeer: m.Arg(svc.ReqPeerToPeer) != 0, RTR: iwarp.RTR(m.Arg(svc.ReqRTR))},
		PrivateData: append([]byte(nil), f[svc.ReqFieldPrivateData]...), Markers: m.Arg(svc.ReqMarkers) != 0}
	cr := &ConnRequest{l: l, req: req}
	cr.ops = &remoteRequest{r: cr, h: m.Arg(svc.ReqHandle), raddr: ra}
	return cr, nil
}

func (rl *remoteListener) close() error {
	l := rl.l
	l.once.Do(func() {
		close(l.closed)
		l.dev.client().do(context.Background(), svc.TCloseListener, func(b *svc.Builder) { b.Args(rl.h) })
		l.dev.mu.Lock()
		delete(l.dev.listeners, l)
		l.dev.mu.Unlock()
	})
	return nil
}

// remoteRequest is a connection request a service passed on: its handle
// and the initiator's address.
type remoteRequest struct {
	r     *ConnRequest
	h     uint64
	raddr netip.AddrPort
}

func (rr *remoteRequest) remoteAddr() netip.AddrPort { return rr.raddr }

func (rr *remoteRequest) accept(ctx context.Context, qp *QP, p ConnParams) (*Conn, error) {
	r := rr.r
	if qp == nil || qp.remote() == nil || qp.pd.dev != r.l.dev {
		return nil, fmt.Errorf("%w: QP of another device", ErrInvalidArgument)
	}
	if err := r.claim(); err != nil {
		return nil, err
	}
	rep, err := r.l.dev.client().do(ctx, svc.TAccept, func(b *svc.Builder) {
		b.Args(rr.h, uint64(qp.remote().num))
		connArgs(b, p)
		b.Bytes(p.PrivateData)
	})
	if err != nil {
		return nil, err
	}
	return connFrom(qp, rep.m)
}

func (rr *remoteRequest) reject(privateData []byte) error {
	r := rr.r
	if err := r.claim(); err != nil {
		return err
	}
	_, err := r.l.dev.client().do(context.Background(), svc.TReject, func(b *svc.Builder) { b.Args(rr.h).Bytes(privateData) })
	return err
}

func closeFd(fd int) { unix.Close(fd) }

// remoteQP's qpOps: a QP of a service.

// remote returns a service's QP's side; nil for an embedded QP.
func (qp *QP) remote() *remoteQP {
	r, _ := qp.ops.(*remoteQP)
	return r
}

func (r *remoteQP) qpNum() uint32    { return r.num }
func (r *remoteQP) qpState() QPState { return r.state() }

func (r *remoteQP) qpErr() error {
	r.errMu.Lock()
	defer r.errMu.Unlock()
	return r.err
}

func (r *remoteQP) qpDone() <-chan struct{}              { return r.done }
func (r *remoteQP) progress()                            {} // the service progresses the QP
func (r *remoteQP) openTXGate()                          {} // the service's QP opens its own
func (r *remoteQP) postSend(wrs []SendWR) error          { return r.qp.remotePostSend(wrs) }
func (r *remoteQP) postRecv(wrs []RecvWR) error          { return r.qp.remotePostRecv(wrs) }
func (r *remoteQP) disconnect(ctx context.Context) error { return r.qp.remoteDisconnect(ctx) }
func (r *remoteQP) destroy() error                       { return r.qp.remoteClose() }

// setError asks the service to move the QP to ERROR (QP_ERROR; a service
// without the CM feature has only DESTROY_QP, which would free the QP).
func (r *remoteQP) setError() error {
	if r.cl.features&svc.FeatureCM == 0 {
		return fmt.Errorf("%w: the service cannot move a QP to ERROR (no CM feature)", ErrInvalidArgument)
	}
	if _, err := r.cl.do(context.Background(), svc.TQPError, func(b *svc.Builder) { b.Args(uint64(r.num)) }); err != nil {
		return err
	}
	// The QP is done: its QP_DONE follows the reply (or the session
	// ends); from then on posting fails, as on an embedded QP.
	<-r.done
	return nil
}
