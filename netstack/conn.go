package netstack

import (
	"bytes"
	"context"
	"errors"
	"github.com/rdmatap/rdmatap/internal/lattrace"
	"io"
	"net/netip"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	owntcp "github.com/rdmatap/rdmatap/netstack/tcp"
)

// Conn is an established TCP connection on a Stack.
//
// Reads and writes block on the endpoint's wait queue and honour a context.
// ReadTo/ReadFull may be called concurrently with Write/WritePayload.
// Concurrent writers are serialized: each Write or WritePayload call's bytes
// go out together, in the order the calls got the connection. Several
// concurrent readers are memory-safe but the byte stream is then split
// between them in an unspecified way, so use one reader goroutine.
type Conn struct {
	s  *Stack
	ep tcpip.Endpoint // gVisor's TCP; nil on rdmatap's
	wq *waiter.Queue
	// own is the connection on rdmatap's TCP (owntcp.go); nil on
	// gVisor's.
	own *owntcp.Endpoint

	readEntry  waiter.Entry
	writeEntry waiter.Entry
	doneEntry  waiter.Entry
	readCh     chan struct{}
	writeCh    chan struct{}
	// wsem is held by the one writer (a buffered channel of one, so that
	// waiting for it honours a context and Close).
	wsem chan struct{}

	closed    atomic.Bool
	readBytes atomic.Uint64 // bytes read so far (connection taps place segments by it)
	closedCh  chan struct{} // closed by Close/Abort
	done      chan struct{} // see Done
	doneOnce  sync.Once
	closeOnce sync.Once

	// addrs are the connection's addresses, set once it is connected;
	// Stack.Close and Stack.TCPStats read them from other goroutines,
	// a Dial's connection before it is.
	addrs atomic.Pointer[connAddrs]

	// gsoSeg > 0 is the most payload gVisor puts in one segment on this
	// GSO link; writes of records are cut to fit it (see writePayload).
	gsoSeg int

	// ccAuto: the connection still runs Cubic and changes to Reno at its
	// first loss (congestion.go). Read and written by the one writer.
	ccAuto bool
}

func newConn(s *Stack, ep tcpip.Endpoint, wq *waiter.Queue) *Conn {
	c := &Conn{
		s:        s,
		ep:       ep,
		wq:       wq,
		closedCh: make(chan struct{}),
		done:     make(chan struct{}),
		wsem:     make(chan struct{}, 1),
		gsoSeg:   gsoSegmentMax(s.link),
		ccAuto:   s.ccAuto,
	}
	c.readEntry, c.readCh = waiter.NewChannelEntry(waiter.ReadableEvents | waiter.EventHUp | waiter.EventErr)
	c.writeEntry, c.writeCh = waiter.NewChannelEntry(waiter.WritableEvents | waiter.EventHUp | waiter.EventErr)
	c.doneEntry = waiter.NewFunctionEntry(waiter.EventHUp|waiter.EventErr, func(waiter.EventMask) {
		// Runs inside the stack's notification path, possibly with endpoint
		// locks held: only an atomic state load is allowed here.
		if finishedState(tcp.EndpointState(ep.State())) {
			c.markDone()
		}
	})
	wq.EventRegister(&c.readEntry)
	if lattrace.Enabled {
		e := waiter.NewFunctionEntry(waiter.ReadableEvents, func(waiter.EventMask) { lattrace.Mark(lattrace.Readable) })
		wq.EventRegister(&e)
	}
	wq.EventRegister(&c.writeEntry)
	wq.EventRegister(&c.doneEntry)
	return c
}

// gsoSegmentMax returns the most payload gVisor's TCP sender puts in one
// segment on a GSO link (sender.sendData: the link's GSO maximum less
// header.TCPTotalHeaderMaximumSize and one), or 0 on a link without GSO,
// where segments are cut at the MSS.
func gsoSegmentMax(l stack.LinkEndpoint) int {
	g, ok := l.(stack.GSOEndpoint)
	if !ok || g.SupportedGSO() == stack.GSONotSupported {
		return 0
	}
	return max(int(g.GSOMaxSize())-header.TCPTotalHeaderMaximumSize-1, 0)
}

func finishedState(st tcp.EndpointState) bool {
	switch st {
	case tcp.StateClose, tcp.StateError, tcp.StateTimeWait:
		return true
	}
	return false
}

// connAddrs are a connection's local and remote addresses.
type connAddrs struct{ local, remote netip.AddrPort }

// epAddrs reads the endpoint's addresses.
func (c *Conn) epAddrs() *connAddrs {
	var a connAddrs
	if fa, err := c.ep.GetLocalAddress(); err == nil {
		a.local = netip.AddrPortFrom(fromTCPIPAddr(fa.Addr), fa.Port)
	}
	if fa, err := c.ep.GetRemoteAddress(); err == nil {
		a.remote = netip.AddrPortFrom(fromTCPIPAddr(fa.Addr), fa.Port)
	}
	return &a
}

func (c *Conn) initAddrs() {
	c.addrs.Store(c.epAddrs())
	if finishedState(tcp.EndpointState(c.ep.State())) {
		c.markDone()
	}
}

// release unregisters the waiter entries.
func (c *Conn) release() {
	if c.own != nil {
		return
	}
	c.wq.EventUnregister(&c.readEntry)
	c.wq.EventUnregister(&c.writeEntry)
	c.wq.EventUnregister(&c.doneEntry)
}

func (c *Conn) markDone() { c.doneOnce.Do(func() { close(c.done) }) }

// Endpoint returns the underlying gVisor endpoint (a *tcp.Endpoint).
func (c *Conn) Endpoint() tcpip.Endpoint { return c.ep }

// LocalAddr returns the local address of the connection.
func (c *Conn) LocalAddr() netip.AddrPort { return c.addrsOrZero().local }

// RemoteAddr returns the peer's address.
func (c *Conn) RemoteAddr() netip.AddrPort { return c.addrsOrZero().remote }

// addrsOrZero is the connection's addresses, zero until it is connected.
func (c *Conn) addrsOrZero() connAddrs {
	if a := c.addrs.Load(); a != nil {
		return *a
	}
	return connAddrs{}
}

// Done returns a channel that is closed when the connection is finished:
// after Close or Abort, or once gVisor reports the endpoint closed, reset,
// failed or in TIME-WAIT (both directions shut). It is best effort: it
// relies on gVisor's hang-up notifications, and a passive close that ends
// in LAST-ACK is only reported when the final ACK arrives.
func (c *Conn) Done() <-chan struct{} { return c.done }

// readState is the per-call writer chain of ReadTo, pooled to avoid
// allocations on the hot path.
type readState struct {
	guard guardWriter
	lim   tcpip.LimitedWriter
}

var readStatePool = sync.Pool{New: func() any { return new(readState) }}

// errStop is returned to gVisor by guardWriter to end a Read early without
// failing it (the caller's writer accepted fewer bytes than offered).
var errStop = errors.New("netstack: reader stopped")

// guardWriter protects gVisor's Read from writers that break the io.Writer
// contract (a short write with a nil error makes gVisor panic) and records
// the caller's own error.
type guardWriter struct {
	w     io.Writer
	err   error // error returned by w
	short bool  // w accepted fewer bytes than offered without error
}

func (g *guardWriter) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, err := g.w.Write(p)
	if n < 0 {
		n = 0
	} else if n > len(p) {
		n = len(p)
	}
	if err != nil {
		g.err = err
		return n, err
	}
	if n < len(p) {
		g.short = true
		return n, errStop
	}
	return n, nil
}

// ReadTo blocks until at least one byte is readable (or EOF, Close/Abort,
// reset or ctx cancellation), then calls the endpoint's Read ONCE with w,
// limited to max bytes when max > 0, and returns the number of bytes
// consumed.
//
// w.Write receives slices of the stack's own packet memory, one per
// underlying buffer view (packet boundaries and view boundaries split the
// stream arbitrarily; headers can straddle slices). w must not retain or
// modify them. If w accepts fewer bytes than offered (with or without an
// error) the rest stays in the stack for the next read. If w returns an error
// after consuming bytes, ReadTo returns the count and that error; a short
// write of zero bytes without an error returns (0, io.ErrShortWrite).
//
// Errors: io.EOF after the peer's FIN once no data is left; errors matching
// net.ErrClosed after Close/Abort; ErrReset when the peer reset the
// connection; ctx.Err() on cancellation.
func (c *Conn) ReadTo(ctx context.Context, w io.Writer, max int) (int, error) {
	return c.readTo(ctx, w, max, true)
}

// TryReadTo is ReadTo that never blocks: it returns (0, nil) when nothing
// is queued. A busy-polling caller uses it to run the receive path in its
// own goroutine.
func (c *Conn) TryReadTo(w io.Writer, max int) (int, error) {
	return c.readTo(context.Background(), w, max, false)
}

// WaitReadable blocks until a read would not block — data, the peer's FIN
// or an error is there — or ctx ends (ctx.Err()) or the Conn is closed.
func (c *Conn) WaitReadable(ctx context.Context) error { return c.WaitReadableOr(ctx, nil) }

// WaitReadableOr is WaitReadable that also returns, with nil, when wake
// delivers.
func (c *Conn) WaitReadableOr(ctx context.Context, wake <-chan struct{}) error {
	if c.own != nil {
		return c.ownWaitReadable(ctx, wake)
	}
	for {
		if c.closed.Load() {
			return closedError("read")
		}
		if c.ep.Readiness(waiter.ReadableEvents|waiter.EventHUp|waiter.EventErr) != 0 {
			return nil
		}
		if woke, err := c.waitOnce(ctx, wake); woke || err != nil {
			return err
		}
	}
}

// waitOnce blocks until TCP posts a wake-up, the Conn is closed, ctx ends
// (its error) or wake delivers (woke).
func (c *Conn) waitOnce(ctx context.Context, wake <-chan struct{}) (woke bool, err error) {
	select {
	case <-c.readCh:
	case <-c.closedCh:
	case <-ctx.Done():
		return false, ctx.Err()
	case <-wake:
		return true, nil
	}
	return false, nil
}

// WaitUnreadOr is WaitReadableOr for a reader that has had some of the
// bytes TCP holds by another way (a connection tap): had reports how many
// of the first bytes TCP holds it has had, or a negative number when it
// means to read them now. WaitUnreadOr returns, with nil, once TCP holds
// more than had says, had is negative, the connection is no longer
// established (the peer's FIN, a reset, an error), or wake delivers; it
// calls had again at each wake-up. Reading the bytes had can wait: such a
// reader drains them now and then rather than after every message.
//
// With spin > 0 it first checks for this long without sleeping, yielding
// its P between checks (runtime.Gosched): for a reader beside a link that
// busy-polls, whose goroutine then runs in turn with it, and whose wake-up
// would cost more than the wait.
func (c *Conn) WaitUnreadOr(ctx context.Context, wake <-chan struct{}, had func() int, spin time.Duration) error {
	if c.own != nil {
		return c.ownWaitUnread(ctx, wake, had)
	}
	if spin > 0 {
		if done, err := c.spinUnread(ctx, wake, had, spin); done {
			return err
		}
	}
	for {
		if done, err := c.unreadDone(had); done {
			return err
		}
		if woke, err := c.waitOnce(ctx, wake); woke || err != nil {
			return err
		}
	}
}

// unreadDone reports whether WaitUnreadOr is done, and with which error.
func (c *Conn) unreadDone(had func() int) (bool, error) {
	if c.closed.Load() {
		return true, closedError("read")
	}
	if tcp.EndpointState(c.ep.State()) != tcp.StateEstablished {
		return true, nil
	}
	switch h := had(); {
	case h < 0:
		return true, nil
	case h == 0:
		// Nothing had: plain readability, which takes fewer locks.
		return c.ep.Readiness(waiter.ReadableEvents|waiter.EventHUp|waiter.EventErr) != 0, nil
	default:
		n, err := c.ep.GetSockOptInt(tcpip.ReceiveQueueSizeOption)
		return err != nil || n > h, nil
	}
}

// spinUnread is WaitUnreadOr's spin; done is false when spin passed
// without a reason to return. The checks that take locks run only when
// TCP has posted a wake-up.
func (c *Conn) spinUnread(ctx context.Context, wake <-chan struct{}, had func() int, spin time.Duration) (done bool, err error) {
	start := time.Now()
	// Once in full (a wake-up TCP posted before may be gone), then on
	// TCP's wake-ups.
	if done, err := c.unreadDone(had); done {
		return true, err
	}
	for i := 1; ; i++ {
		select {
		case <-wake:
			return true, nil
		default:
		}
		select {
		case <-c.readCh:
			if done, err := c.unreadDone(had); done {
				return true, err
			}
		default:
		}
		if i%16 == 0 {
			if c.closed.Load() {
				return true, closedError("read")
			}
			if err := ctx.Err(); err != nil {
				return true, err
			}
			if time.Since(start) >= spin {
				return false, nil
			}
		}
		runtime.Gosched()
	}
}

func (c *Conn) readTo(ctx context.Context, w io.Writer, max int, block bool) (int, error) {
	if w == nil {
		return 0, &OpError{Op: "read", Err: errConfig("nil writer")}
	}
	if c.own != nil {
		return c.ownReadTo(ctx, w, max, block)
	}
	st := readStatePool.Get().(*readState)
	defer func() {
		*st = readState{}
		readStatePool.Put(st)
	}()
	st.guard.w = w
	var dst io.Writer = &st.guard
	if max > 0 {
		st.lim = tcpip.LimitedWriter{W: &st.guard, N: int64(max)}
		dst = &st.lim
	}
	woke := false
	for {
		if c.closed.Load() {
			return 0, closedError("read")
		}
		t0 := lattrace.Now()
		res, terr := c.ep.Read(dst, tcpip.ReadOptions{})
		if terr == nil && res.Count > 0 {
			if lattrace.Enabled {
				lattrace.MarkAt(lattrace.ReadStart, t0)
				lattrace.Mark(lattrace.ReadDone)
			}
			c.readBytes.Add(uint64(res.Count))
			c.ep.ModerateRecvBuf(res.Count)
			if woke && ((max > 0 && st.lim.N == 0) || st.guard.short) {
				// Data is probably left and another reader may be
				// waiting: pass the consumed wake-up on.
				c.repost(c.readCh)
			}
			if st.guard.err != nil {
				return res.Count, st.guard.err
			}
			return res.Count, nil
		}
		switch terr.(type) {
		case nil, *tcpip.ErrWouldBlock:
		case *tcpip.ErrBadBuffer:
			// The writer failed before consuming anything.
			if st.guard.err != nil {
				return 0, st.guard.err
			}
			return 0, io.ErrShortWrite
		case *tcpip.ErrClosedForReceive:
			if c.closed.Load() {
				return 0, closedError("read")
			}
			return 0, io.EOF
		default:
			if c.closed.Load() {
				return 0, closedError("read")
			}
			return 0, opError("read", c.RemoteAddr().String(), terr)
		}
		if !block {
			return 0, nil
		}
		select {
		case <-c.readCh:
			woke = true
		case <-c.closedCh:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// repost passes a consumed wake-up on so that another waiter re-checks.
func (c *Conn) repost(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// sliceFiller copies the stream into a byte slice.
type sliceFiller struct {
	p []byte
	n int
}

func (f *sliceFiller) Write(b []byte) (int, error) {
	n := copy(f.p[f.n:], b)
	f.n += n
	return n, nil
}

// ReadFull reads exactly len(p) bytes into p, consuming nothing beyond them.
// It returns io.ErrUnexpectedEOF if the stream ends after some but not all
// bytes, io.EOF if it ends before the first byte, and the errors of ReadTo
// otherwise (p then holds a prefix of the data).
func (c *Conn) ReadFull(ctx context.Context, p []byte) error {
	// Pooled: the filler escapes through gVisor's io.Writer, one heap
	// allocation per call otherwise.
	f := fillerPool.Get().(*sliceFiller)
	f.p, f.n = p, 0
	defer func() {
		f.p = nil
		fillerPool.Put(f)
	}()
	for f.n < len(p) {
		_, err := c.ReadTo(ctx, f, len(p)-f.n)
		if err != nil {
			if err == io.EOF && f.n > 0 {
				return io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

var fillerPool = sync.Pool{New: func() any { return new(sliceFiller) }}

// payloadGuard records the error of a caller's Payloader (gVisor turns it
// into ErrBadBuffer).
type payloadGuard struct {
	pl    tcpip.Payloader
	err   error
	limit int // > 0: offer at most this many bytes to the next write
}

func (g *payloadGuard) Read(p []byte) (int, error) {
	n, err := g.pl.Read(p)
	if err != nil && err != io.EOF {
		g.err = err
	}
	return n, err
}

func (g *payloadGuard) Len() int {
	if n := g.pl.Len(); g.limit <= 0 || n < g.limit {
		return n
	}
	return g.limit
}

// RecordPayloader is a Payloader of records (MPA FPDUs) whose writes keep
// the records aligned with TCP segments where the stack allows it. TCP cuts
// each write into segments from the write's start, so records that each
// fill a segment stay aligned as long as every write starts on a record
// boundary; a write the stack cuts short (the send buffer filled) ends
// inside a record, and WritePayload then writes only the rest of that
// record next, which realigns what follows (RFC 5044 Appendix A's aligned
// sender: a receiver can then find the records in segments that arrive
// out of order).
//
// On a GSO link gVisor builds segments of up to gsoSegmentMax bytes, which
// the link (or the kernel behind a TAP) cuts at the MSS; a longer write is
// cut at that maximum, which is no multiple of a record, and every segment
// after the cut would start inside a record. WritePayload therefore offers
// such a link at most RecordFit(gsoSegmentMax) bytes per write; records
// longer than that (the 64 KB FPDUs of a 64 KB-MTU link) are left to the
// stack's cut. A record trailer split between two segments also trips
// Linux siw's receiver, which then fails the FPDU's CRC check: its
// siw_get_trailer copies each piece of a split trailer to the trailer's
// start.
type RecordPayloader interface {
	tcpip.Payloader
	// RecordRest returns the bytes left of the record being produced
	// (0 at a record boundary).
	RecordRest() int
	// RecordFit returns the most bytes, at most max, that can be produced
	// next and end on a record boundary; 0 if no boundary lies within max
	// bytes (the write is then left whole).
	RecordFit(max int) int
}

var readerPool = sync.Pool{New: func() any { return new(bytes.Reader) }}

var guardPool = sync.Pool{New: func() any { return new(payloadGuard) }}

// Write writes all of p, blocking while the send buffer is full. It returns
// the number of bytes queued and, if not all, the error (net.ErrClosed after
// Close/Abort, ErrReset, syscall.EPIPE after CloseWrite, ctx.Err()).
// Each successful call of the endpoint's Write queues one TCP write; with
// Nagle off a Write of at most MaxPayload bytes leaves in one segment when
// the window allows.
func (c *Conn) Write(ctx context.Context, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r := readerPool.Get().(*bytes.Reader)
	r.Reset(p)
	n, err := c.writePayload(ctx, r, nil)
	r.Reset(nil)
	readerPool.Put(r)
	return int(n), err
}

// WritePayload calls the endpoint's Write(pl) repeatedly until pl.Len() == 0,
// waiting for send-buffer space when needed. TCP takes only what fits in the
// send buffer per call, reading pl sequentially (pl must continue where it
// stopped, as bytes.Reader does). Each endpoint Write copies the bytes it
// takes into gVisor memory, so pl's backing memory is free on return. An
// error returned by pl.Read is returned (wrapped in *OpError).
func (c *Conn) WritePayload(ctx context.Context, pl tcpip.Payloader) (int64, error) {
	if pl == nil {
		return 0, &OpError{Op: "write", Err: errConfig("nil payloader")}
	}
	// Pooled: one heap allocation per message showed up in the RDMA
	// ping-pong (every FPDU batch is one WritePayload).
	g := guardPool.Get().(*payloadGuard)
	g.pl, g.err, g.limit = pl, nil, 0
	n, err := c.writePayload(ctx, g, g)
	g.pl, g.err, g.limit = nil, nil, 0
	guardPool.Put(g)
	return n, err
}

// atomicWriteMax is the largest write that is copied into the stack with
// the endpoint locked (tcpip.WriteOptions.Atomic). Unlocking and relocking
// around a copy this small costs more than the copy, and it lets the
// stack's processor take the endpoint in between, which a writer then
// spins on: a 64-byte ping-pong over the in-memory link is ~4% faster
// this way.
const atomicWriteMax = 4096

// lockWrite makes the caller the connection's one writer. Writers must be
// serialized, not only for the order of their bytes: in a non-atomic
// write, gVisor drops the endpoint lock while it reads the payloader and
// then trims what it read to the space left, which a concurrent writer may
// have taken, and the trimmed bytes are lost (TestConcurrentWriters).
func (c *Conn) lockWrite(ctx context.Context) error {
	select {
	case c.wsem <- struct{}{}:
		return nil
	default:
	}
	select {
	case c.wsem <- struct{}{}:
		return nil
	case <-c.closedCh:
		return closedError("write")
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Conn) writePayload(ctx context.Context, pl tcpip.Payloader, g *payloadGuard) (int64, error) {
	if c.own != nil {
		return c.ownWrite(ctx, pl, g)
	}
	if err := c.lockWrite(ctx); err != nil {
		return 0, err
	}
	defer func() { <-c.wsem }()
	var total int64
	want := int64(pl.Len())
	woke := false
	var rp RecordPayloader
	if g != nil {
		rp, _ = g.pl.(RecordPayloader)
	}
	for pl.Len() > 0 {
		if c.closed.Load() {
			return total, closedError("write")
		}
		if rp != nil && g.limit == 0 && c.gsoSeg > 0 && g.pl.Len() > c.gsoSeg {
			// 0 (records longer than a super-segment): left whole.
			g.limit = rp.RecordFit(c.gsoSeg)
		}
		offered := pl.Len()
		n, terr := c.ep.Write(pl, tcpip.WriteOptions{Atomic: offered <= atomicWriteMax})
		total += n
		if rp != nil {
			g.limit = 0
			if n < int64(offered) {
				// Cut short: the next write ends the record cut.
				g.limit = rp.RecordRest()
			}
		}
		if terr == nil {
			if n == 0 {
				// Nothing taken although data is left: the payloader
				// returned no bytes (EOF before Len bytes).
				if pl.Len() > 0 {
					return total, &OpError{Op: "write", Err: io.ErrUnexpectedEOF}
				}
			}
			continue
		}
		switch terr.(type) {
		case *tcpip.ErrWouldBlock:
			if c.ccAuto {
				c.congestionAuto()
			}
		case *tcpip.ErrBadBuffer:
			if g != nil && g.err != nil {
				return total, &OpError{Op: "write", Err: g.err}
			}
			return total, opError("write", c.RemoteAddr().String(), terr)
		default:
			if c.closed.Load() {
				return total, closedError("write")
			}
			return total, opError("write", c.RemoteAddr().String(), terr)
		}
		select {
		case <-c.writeCh:
			woke = true
		case <-c.closedCh:
		case <-ctx.Done():
			return total, ctx.Err()
		}
	}
	if woke {
		c.repost(c.writeCh)
	}
	if total < want {
		// The stack took fewer bytes than it read (it trims a write to
		// the space left, which only a change of the send buffer size
		// can shrink now that writers are serialized): they are lost.
		return total, &OpError{Op: "write", Err: io.ErrShortWrite}
	}
	return total, nil
}

// CloseWrite sends a FIN (shuts the write side down); reads continue.
func (c *Conn) CloseWrite() error {
	if c.closed.Load() {
		return closedError("shutdown")
	}
	if c.own != nil {
		if err := c.own.CloseWrite(); err != nil {
			return c.ownErr("shutdown", err)
		}
		return nil
	}
	if terr := c.ep.Shutdown(tcpip.ShutdownWrite); terr != nil {
		return opError("shutdown", c.RemoteAddr().String(), terr)
	}
	return nil
}

// Abort resets the connection (RST) and releases it; blocked and later calls
// fail with net.ErrClosed. It is idempotent with Close.
func (c *Conn) Abort() { c.finish(true) }

// Close closes the connection gracefully (FIN; gVisor lingers in the
// background to deliver queued data, and resets instead if unread received
// data is pending, as Linux does). It unblocks ReadTo/Write callers with
// net.ErrClosed. Close is idempotent and returns nil.
func (c *Conn) Close() error {
	c.finish(false)
	return nil
}

func (c *Conn) finish(abort bool) {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		close(c.closedCh)
		c.release()
		switch {
		case c.own != nil && abort:
			c.own.Abort()
		case c.own != nil:
			c.own.Close()
		case abort:
			a := c.addrs.Load()
			if a == nil { // a Dial under way: what the endpoint has
				a = c.epAddrs()
			}
			c.ep.Abort()
			c.s.nic.rp.forget(ackKey{src: toTCPIPAddr(a.local.Addr()), dst: toTCPIPAddr(a.remote.Addr()), sport: a.local.Port(), dport: a.remote.Port()})
		default:
			c.ep.Close()
		}
		c.markDone()
		c.s.untrackConn(c)
	})
}

// maxPayloadFromSender reads gVisor's per-segment payload limit
// (sender.MaxPayloadSize: MSS minus the option space gVisor reserves for
// timestamps and SACK blocks). gVisor does not export it, so it is read by
// reflection under the endpoint's user lock; ok is false if the field layout
// differs from the pinned gVisor version. The fields are found by name once
// (senderFields): looking them up on every call took 850 ns and 5
// allocations, and the transmitter asks every 64 messages.
func maxPayloadFromSender(ep *tcp.Endpoint) (int, bool) {
	sf := senderFields()
	if !sf.ok {
		return 0, false
	}
	ep.LockUser()
	defer ep.UnlockUser()
	v := reflect.ValueOf(ep).Elem().FieldByIndex(sf.snd)
	if v.IsNil() {
		return 0, false
	}
	n := int(v.Elem().FieldByIndex(sf.maxPayload).Int())
	if n <= 0 || n > header.TCPMaximumMSS {
		return 0, false
	}
	return n, true
}

// senderField is where maxPayloadFromSender finds the sender's
// MaxPayloadSize: the index paths of tcp.Endpoint's snd (a pointer) and of
// the sender's MaxPayloadSize (an int, promoted from TCPSenderState).
type senderField struct {
	snd, maxPayload []int
	ok              bool
}

var senderFields = sync.OnceValue(func() senderField {
	snd, ok := reflect.TypeFor[tcp.Endpoint]().FieldByName("snd")
	if !ok || snd.Type.Kind() != reflect.Pointer || snd.Type.Elem().Kind() != reflect.Struct {
		return senderField{}
	}
	mp, ok := snd.Type.Elem().FieldByName("MaxPayloadSize")
	if !ok || mp.Type.Kind() != reflect.Int {
		return senderField{}
	}
	// FieldByIndex panics on a nil embedded pointer: the path must go
	// through embedded values only.
	t := snd.Type.Elem()
	for _, i := range mp.Index[:len(mp.Index)-1] {
		f := t.Field(i)
		if f.Type.Kind() != reflect.Struct {
			return senderField{}
		}
		t = f.Type
	}
	return senderField{snd: snd.Index, maxPayload: mp.Index, ok: true}
})

// MaxPayload returns the connection's current maximum TCP segment payload,
// i.e. the most bytes gVisor puts into one wire segment: the MSS (minimum of
// the peer's advertised MSS and the route MTU minus IP and TCP headers) minus
// the option space gVisor always reserves (12 bytes for timestamps plus up to
// 28/36 for SACK blocks; 1420 at MTU 1500 with both). With GSO the link may
// carry several such segments in one super-segment, which a real NIC (TSO)
// cuts at multiples of this size.
//
// The value comes from gVisor's sender state; if that is unavailable (not
// connected, or an incompatible gVisor) it is computed from the link MTU and
// the negotiated options, which ignores a smaller peer MSS.
func (c *Conn) MaxPayload() int {
	if c.own != nil {
		return c.own.Info().SndMSS
	}
	tep, ok := c.ep.(*tcp.Endpoint)
	if ok {
		if n, ok := maxPayloadFromSender(tep); ok {
			return n
		}
	}
	return c.maxPayloadEstimate(tep)
}

func (c *Conn) maxPayloadEstimate(tep *tcp.Endpoint) int {
	mtu := int(c.s.link.MTU())
	ipHdr := header.IPv4MinimumSize
	if c.LocalAddr().Addr().Is6() {
		ipHdr = header.IPv6MinimumSize
	}
	ts, sack := true, true
	if tep != nil {
		tep.LockUser()
		ts, sack = tep.SendTSOk, tep.SACKPermitted
		tep.UnlockUser()
	}
	opt := 0
	if ts {
		opt += 12 // 2 NOPs + timestamp option
	}
	if sack {
		if ts {
			opt += 28 // 2 NOPs + 3 SACK blocks fill the 40-byte option space
		} else {
			opt += 36 // 2 NOPs + 4 SACK blocks
		}
	}
	n := mtu - ipHdr - header.TCPMinimumSize - opt
	if n > header.TCPMaximumMSS {
		n = header.TCPMaximumMSS
	}
	if n < 1 {
		n = 1
	}
	return n
}
