// Package ping is `rdmatap ping`: an rping-compatible client and server
// that interoperate with rdma-core's rping over Linux siw.
package ping

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
	"github.com/rdmatap/rdmatap/internal/units"
	"github.com/rdmatap/rdmatap/verbs"
)

// rdmatap ping is rdma-core's rping, wire- and output-compatible: the same
// 16-byte buffer advertisements, the same Send / RDMA Read / Send / Send /
// RDMA Write / Send sequence per ping, the same data and the same -v lines,
// so that it runs against a real rping over Linux siw in either role.
//
// Per ping (rping.c's header comment and the siw captures):
//
//	client                                      server
//	Send {start buf, rkey, size}         ->
//	                                     <-     RDMA Read Request (size bytes)
//	Read Response                        ->
//	                                     <-     Send "go ahead" (16 zero bytes)
//	Send {rdma buf, rkey, size}          ->
//	                                     <-     RDMA Write (strlen(data)+1 bytes)
//	                                     <-     Send "go ahead"
//
// The client validates (-V) and prints (-v) the echoed data; the server
// prints what it read (-v). Each side has one receive posted and reposts
// it as soon as it completes, before it sends anything the peer answers.

func init() {
	cli.Register("ping", "rping-compatible RDMA ping (Send, RDMA Read, RDMA Write per ping);\n"+
		"            interoperates with rdma-core's rping over Linux siw", pingCmd)
}

// pingOpts are rping's options.
type pingOpts struct {
	server     bool
	persistent bool
	addr       netip.Addr // -a: bind address (server, optional) or server address (client)
	port       uint16
	count      int // 0: forever
	size       int
	verbose    bool
	validate   bool
	debug      bool
	timeout    time.Duration // connect, and each step of a ping

	// Test hooks.
	listening func(netip.AddrPort)           // server: called once listening
	connected func(*verbs.Conn)              // called on each established connection
	corrupt   func(ping int, data []byte)    // server: alters the echo before the RDMA Write
	finished  func(c *verbs.Conn, err error) // server: called when a connection is over
}

const pingSummary = "rping-compatible RDMA ping. Server: rdmatap ping -s [-a ADDR] [-p PORT] [-P] ...;\n" +
	"client: rdmatap ping -c -a ADDR [-p PORT] [-C N] [-S SIZE] [-v] [-V] [-d].\n" +
	"Single-letter flags may be combined and take attached values as in rping (-vVd, -C5).\n" +
	"The endpoint flags (--tap, --addr, ...) make this process's TAP endpoint."

func pingCmd(args []string, stdout, stderr io.Writer) error {
	o, ef, err := ParsePingFlags(args, stderr)
	if err != nil {
		return err
	}
	if _, _, _, err := ef.Check(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	e, err := ef.Open()
	if err != nil {
		return err
	}
	defer e.Close()
	return runPing(ctx, e.Dev, o, stdout, stderr)
}

// ParsePingFlags parses rping's flags (getopt style accepted) and the
// endpoint flags.
func ParsePingFlags(args []string, stderr io.Writer) (pingOpts, *cli.EndpointFlags, error) {
	fs := flag.NewFlagSet("ping", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	ef := new(cli.EndpointFlags)
	ef.Register(fs)
	var o pingOpts
	var client bool
	fs.BoolVar(&o.server, "s", false, "server side")
	fs.BoolVar(&client, "c", false, "client side")
	a := fs.String("a", "", "server: address to bind to (default any); client: the server's address (required)")
	port := fs.Int("p", rpingPort, "port")
	fs.IntVar(&o.count, "C", 0, "ping count (default 0: forever)")
	o.size = rpingDefaultSize
	fs.Var(units.Int{P: &o.size, Max: 1 << 32}, "S", fmt.Sprintf("ping data size, %d to %d (K, M, G suffixes)", rpingMinSize, rpingMaxSize))
	fs.BoolVar(&o.verbose, "v", false, "display ping data on stdout")
	fs.BoolVar(&o.validate, "V", false, "validate ping data (client)")
	fs.BoolVar(&o.debug, "d", false, "debug printfs")
	fs.BoolVar(&o.persistent, "P", false, "persistent server: serve clients until killed")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "give up on a peer that does not answer for this long (connect, each step)")
	if err := cli.ParseFlags(fs, expandGetopt(fs, args), stderr, "ping", pingSummary); err != nil {
		return o, nil, err
	}
	if fs.NArg() > 0 {
		return o, nil, fmt.Errorf("%w: unexpected argument %q", cli.ErrUsage, fs.Arg(0))
	}
	switch {
	case o.server && client:
		return o, nil, fmt.Errorf("%w: -s and -c exclude each other", cli.ErrUsage)
	case !o.server && !client:
		return o, nil, fmt.Errorf("%w: give -s (server) or -c (client)", cli.ErrUsage)
	case o.persistent && client:
		return o, nil, fmt.Errorf("%w: -P is a server option (-s)", cli.ErrUsage)
	case client && *a == "":
		return o, nil, fmt.Errorf("%w: -c needs -a ADDR, the server's address", cli.ErrUsage)
	}
	if *a != "" {
		addr, err := netip.ParseAddr(*a)
		if err != nil || addr.Zone() != "" {
			return o, nil, fmt.Errorf("%w: -a %q is not an IP address (host names are not resolved)", cli.ErrUsage, *a)
		}
		if client && addr.IsUnspecified() {
			return o, nil, fmt.Errorf("%w: -a %s: the client needs the server's address", cli.ErrUsage, addr)
		}
		o.addr = addr.Unmap()
	}
	if *port < 1 || *port > 65535 {
		return o, nil, fmt.Errorf("%w: invalid port %d (valid range is 1 to 65535)", cli.ErrUsage, *port)
	}
	o.port = uint16(*port)
	if o.count < 0 {
		return o, nil, fmt.Errorf("%w: Invalid count %d", cli.ErrUsage, o.count)
	}
	if o.size < rpingMinSize || o.size > rpingMaxSize {
		return o, nil, fmt.Errorf("%w: Invalid size %d (valid range is %d to %d)", cli.ErrUsage, o.size, rpingMinSize, rpingMaxSize)
	}
	if o.timeout <= 0 {
		return o, nil, fmt.Errorf("%w: --timeout must be positive", cli.ErrUsage)
	}
	return o, ef, nil
}

// expandGetopt rewrites getopt-style arguments that the flag package does
// not take: clustered single-letter flags ("-vVd" → -v -V -d) and attached
// values ("-C5" → -C 5). Arguments naming a defined flag ("-crc",
// "-addr=...") are left alone.
func expandGetopt(fs *flag.FlagSet, args []string) []string {
	isBool := func(f *flag.Flag) bool {
		b, ok := f.Value.(interface{ IsBoolFlag() bool })
		return ok && b.IsBoolFlag()
	}
	var out []string
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			return append(out, args[i:]...)
		}
		if len(arg) < 2 || arg[0] != '-' || arg[1] == '-' {
			out = append(out, arg)
			continue
		}
		name, _, hasValue := strings.Cut(arg[1:], "=")
		if f := fs.Lookup(name); f != nil {
			out = append(out, arg)
			if !hasValue && !isBool(f) && i+1 < len(args) {
				i++
				out = append(out, args[i]) // the flag's value, verbatim
			}
			continue
		}
		// getopt: letters until one that takes a value, which takes the rest.
		var exp []string
		ok := true
		for j := 1; j < len(arg); j++ {
			f := fs.Lookup(arg[j : j+1])
			if f == nil {
				ok = false
				break
			}
			exp = append(exp, "-"+arg[j:j+1])
			if !isBool(f) {
				if j+1 < len(arg) {
					exp = append(exp, arg[j+1:])
				} else if i+1 < len(args) {
					i++
					exp = append(exp, args[i])
				}
				break
			}
		}
		if !ok {
			out = append(out, arg) // let the flag package report it
			continue
		}
		out = append(out, exp...)
	}
	return out
}

// pingOut serialises the output of concurrent connections (-P).
type pingOut struct {
	mu             sync.Mutex
	stdout, stderr io.Writer
	debug          bool
}

func (p *pingOut) printf(format string, a ...any) {
	p.mu.Lock()
	fmt.Fprintf(p.stdout, format, a...)
	p.mu.Unlock()
}

func (p *pingOut) eprintf(format string, a ...any) {
	p.mu.Lock()
	fmt.Fprintf(p.stderr, format, a...)
	p.mu.Unlock()
}

// dbg is rping's DEBUG_LOG (stdout, -d).
func (p *pingOut) dbg(format string, a ...any) {
	if p.debug {
		p.printf(format, a...)
	}
}

// runPing is the protocol core: it runs a server or a client on dev.
func runPing(ctx context.Context, dev *verbs.Device, o pingOpts, stdout, stderr io.Writer) error {
	out := &pingOut{stdout: stdout, stderr: stderr, debug: o.debug}
	if o.server {
		out.dbg("server\n")
	} else {
		out.dbg("client\n")
	}
	out.dbg("port %d\n", o.port)
	out.dbg("size %d\n", o.size)
	if o.count > 0 {
		out.dbg("count %d\n", o.count)
	}
	if o.verbose {
		out.dbg("verbose\n")
	}
	if o.validate {
		out.dbg("validate data\n")
	}
	if o.server {
		return pingServe(ctx, dev, o, out)
	}
	return pingClient(ctx, dev, o, out)
}

// pingConn is one connection's resources and state (rping's control block).
type pingConn struct {
	o      *pingOpts
	out    *pingOut
	server bool
	peer   netip.AddrPort

	pd                                  *verbs.PD
	cq                                  *verbs.CQ
	qp                                  *verbs.QP
	conn                                *verbs.Conn
	recvMR, sendMR, rdmaMR, startMR     *verbs.MR
	recvBuf, sendBuf, rdmaBuf, startBuf []byte

	ctx    context.Context // ends when the connection is over
	cancel context.CancelFunc
	wc     [1]verbs.WC
	state  rpingState
	err    error // why state is ERROR (or what ended the connection)
	remote rpingInfo
	discon bool // "DISCONNECT EVENT" printed
}

func (c *pingConn) side() string {
	if c.server {
		return "server"
	}
	return "client"
}

// setup makes the PD, CQ, QP and buffers (rping_setup_qp and
// rping_setup_buffers) and posts the first receive.
func (c *pingConn) setup(dev *verbs.Device) error {
	var err error
	if c.pd, err = dev.AllocPD(); err != nil {
		return fmt.Errorf("ibv_alloc_pd failed: %w", err)
	}
	c.out.dbg("created pd %p\n", c.pd)
	if c.cq, err = dev.CreateCQ(rpingCQDepth); err != nil {
		return fmt.Errorf("ibv_create_cq failed: %w", err)
	}
	c.out.dbg("created cq %p\n", c.cq)
	c.qp, err = c.pd.CreateQP(verbs.QPConfig{SendCQ: c.cq, RecvCQ: c.cq, MaxSendWR: rpingSQDepth,
		MaxRecvWR: rpingRQDepth, MaxSendSGE: 1, MaxRecvSGE: 1})
	if err != nil {
		return fmt.Errorf("rdma_create_qp: %w", err)
	}
	c.out.dbg("created qp %p\n", c.qp)
	c.out.dbg("rping_setup_buffers called on cb %p\n", c)
	reg := func(n int, acc verbs.Access) ([]byte, *verbs.MR, error) { return cli.RegMem(c.pd, n, acc) }
	remote := verbs.AccessLocalWrite | verbs.AccessRemoteRead | verbs.AccessRemoteWrite
	if c.recvBuf, c.recvMR, err = reg(rpingInfoSize, verbs.AccessLocalWrite); err != nil {
		return fmt.Errorf("recv_buf reg_mr failed: %w", err)
	}
	if c.sendBuf, c.sendMR, err = reg(rpingInfoSize, 0); err != nil {
		return fmt.Errorf("send_buf reg_mr failed: %w", err)
	}
	if c.rdmaBuf, c.rdmaMR, err = reg(c.o.size, remote); err != nil {
		return fmt.Errorf("rdma_buf reg_mr failed: %w", err)
	}
	if !c.server {
		if c.startBuf, c.startMR, err = reg(c.o.size, remote); err != nil {
			return fmt.Errorf("start_buf reg_mr failed: %w", err)
		}
	}
	c.out.dbg("allocated & registered buffers...\n")
	if err := c.postRecv(); err != nil {
		return fmt.Errorf("ibv_post_recv failed: %w", err)
	}
	return nil
}

func (c *pingConn) postRecv() error {
	return c.qp.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{c.recvMR.SGE(0, rpingInfoSize)}})
}

// free releases everything setup made (rping_free_buffers, rping_free_qp).
func (c *pingConn) free() {
	c.out.dbg("rping_free_buffers called on cb %p\n", c)
	if c.cancel != nil {
		c.cancel()
	}
	if c.qp != nil {
		c.qp.Close()
	}
	for _, mr := range []*verbs.MR{c.recvMR, c.sendMR, c.rdmaMR, c.startMR} {
		if mr != nil {
			mr.Dereg()
		}
	}
	if c.cq != nil {
		c.cq.Close()
	}
	if c.pd != nil {
		c.pd.Close()
	}
}

// established starts watching the connection: c.ctx ends when it is over.
func (c *pingConn) established(ctx context.Context, conn *verbs.Conn) {
	c.conn = conn
	c.ctx, c.cancel = context.WithCancel(ctx)
	go func() {
		select {
		case <-conn.Done():
			c.cancel()
		case <-c.ctx.Done():
		}
	}()
	if c.o.connected != nil {
		c.o.connected(conn)
	}
	if !c.server {
		c.state = stConnected
	}
}

// disconnect closes the connection gracefully (rping_disconnect).
func (c *pingConn) disconnect(ctx context.Context) {
	dctx, cancel := context.WithTimeout(ctx, c.o.timeout)
	defer cancel()
	c.conn.Disconnect(dctx)
	c.disconnected()
}

// disconnected prints rping's DISCONNECTED event line, once.
func (c *pingConn) disconnected() {
	if !c.discon {
		c.discon = true
		c.out.eprintf("%s DISCONNECT EVENT...\n", c.side())
	}
}

// post posts one send WR.
func (c *pingConn) post(wr verbs.SendWR) error {
	if err := c.qp.PostSend(wr); err != nil {
		return fmt.Errorf("post send error: %w", err)
	}
	return nil
}

// sendInfo Sends the 16-byte buffer advertisement in sendBuf.
func (c *pingConn) sendInfo() error {
	return c.post(verbs.SendWR{ID: 2, Op: verbs.OpSend, Flags: verbs.Signaled,
		SGL: []verbs.SGE{c.sendMR.SGE(0, rpingInfoSize)}})
}

// formatSend advertises mr (rping_format_send).
func (c *pingConn) formatSend(mr *verbs.MR) {
	info := rpingInfo{Buf: mr.Addr(), RKey: mr.RKey(), Size: uint32(c.o.size)}
	info.put(c.sendBuf)
	c.out.dbg("RDMA addr %x rkey %x len %d\n", info.Buf, info.RKey, info.Size)
}

// next handles completions until one that moves the state (rping's CQ
// thread up to its sem_post), the connection's end, or the step timeout.
func (c *pingConn) next(want rpingState) {
	tctx, cancel := context.WithTimeout(c.ctx, c.o.timeout)
	defer cancel()
	for {
		if _, err := c.cq.Wait(tctx, c.wc[:]); err != nil {
			select {
			case <-c.conn.Done():
				// The connection is over and every WR completed (flushed).
				c.disconnected()
				c.state, c.err = stDisconnected, c.qp.Err()
				return
			default:
			}
			if c.ctx.Err() != nil {
				c.state, c.err = stError, errInterrupted
				return
			}
			c.state = stError
			c.err = fmt.Errorf("timeout: no answer from %s %v within %v (wait for %v)", peerRole(c.server), c.peer, c.o.timeout, want)
			return
		}
		if c.handle(c.wc[0]) {
			return
		}
	}
}

var errInterrupted = errors.New("interrupted")

func peerRole(server bool) string {
	if server {
		return "client"
	}
	return "server"
}

// handle processes one completion (rping_cq_event_handler); it reports
// whether the state moved.
func (c *pingConn) handle(wc verbs.WC) bool {
	if wc.Status != verbs.StatusSuccess {
		if wc.Status == verbs.StatusWRFlush {
			return false
		}
		c.state = stError
		c.err = fmt.Errorf("cq completion failed status %d: %w", int(wc.Status), wc.Err())
		return true
	}
	switch wc.Op {
	case verbs.WCSend:
		c.out.dbg("send completion\n")
		return false
	case verbs.WCWrite:
		c.out.dbg("rdma write completion\n")
		c.state = stWriteComplete
	case verbs.WCRead:
		c.out.dbg("rdma read completion\n")
		c.state = stReadComplete
	case verbs.WCRecv:
		c.out.dbg("recv completion\n")
		info, err := parseRpingInfo(c.recvBuf[:min(int(wc.ByteLen), len(c.recvBuf))])
		if err != nil || int(wc.ByteLen) != rpingInfoSize {
			c.state, c.err = stError, fmt.Errorf("recv wc error: Received bogus data, size %d", wc.ByteLen)
			return true
		}
		if c.server {
			c.remote = info
			c.out.dbg("Received rkey %x addr %x len %d from peer\n", info.RKey, info.Buf, info.Size)
			if c.state <= stConnected || c.state == stWriteComplete {
				c.state = stReadAdv
			} else {
				c.state = stWriteAdv
			}
		} else if c.state == stReadAdv {
			c.state = stWriteAdv
		} else {
			c.state = stWriteComplete
		}
		if err := c.postRecv(); err != nil {
			c.state, c.err = stError, fmt.Errorf("post recv error: %w", err)
		}
	default:
		c.out.dbg("unknown!!!!! completion\n")
		c.state, c.err = stError, fmt.Errorf("unknown completion %v", wc.Op)
	}
	return true
}

// errStateDisconnected ends a server's loop normally: the client left.
var errStateDisconnected = errors.New("disconnected")

// wait waits for state want; otherwise it reports as rping does.
func (c *pingConn) wait(want rpingState) error {
	c.next(want)
	if c.state == want {
		return nil
	}
	msg := fmt.Sprintf("wait for %v state %d", want, c.state)
	switch {
	case c.state == stDisconnected && c.server:
		c.out.eprintf("%s\n", msg) // rping prints this when a client leaves
		return errStateDisconnected
	case c.state == stDisconnected:
		if c.err != nil {
			return fmt.Errorf("server %v disconnected (%s): %w", c.peer, msg, c.err)
		}
		return fmt.Errorf("server %v disconnected (%s)", c.peer, msg)
	case errors.Is(c.err, errInterrupted):
		return c.err
	case c.err != nil:
		return fmt.Errorf("%s: %w", msg, c.err)
	}
	return errors.New(msg)
}

// pingServe listens and serves one client, or clients until ctx ends (-P).
func pingServe(ctx context.Context, dev *verbs.Device, o pingOpts, out *pingOut) error {
	out.dbg("created cm_id %p\n", &o)
	laddr := netip.AddrPortFrom(o.addr, o.port)
	l, err := dev.Listen(laddr, verbs.ListenConfig{Backlog: 3})
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("rdma_bind_addr: port %d is in use", o.port)
		}
		return fmt.Errorf("rdma_bind_addr: %w", err)
	}
	defer l.Close()
	out.dbg("rdma_bind_addr successful\n")
	out.dbg("rdma_listen\n")
	if o.listening != nil {
		o.listening(l.Addr())
	}
	if !o.persistent {
		req, err := l.GetRequest(ctx)
		if err != nil {
			return errInterrupted
		}
		l.Close() // one client: later ones are refused
		err = serveOne(ctx, dev, req, &o, out)
		if err != nil {
			return fmt.Errorf("rping server failed: %w", err)
		}
		return nil
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		req, err := l.GetRequest(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil // killed: the persistent server's normal end
			}
			return fmt.Errorf("rdma_get_request: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := serveOne(ctx, dev, req, &o, out); err != nil && !errors.Is(err, errInterrupted) {
				out.eprintf("rping server failed for client %v: %v\n", req.RemoteAddr(), err)
			}
		}()
	}
}

// serveOne accepts req and serves it until the client leaves.
func serveOne(ctx context.Context, dev *verbs.Device, req *verbs.ConnRequest, o *pingOpts, out *pingOut) (err error) {
	out.dbg("cma_event type RDMA_CM_EVENT_CONNECT_REQUEST cma_id %p (child)\n", req)
	out.dbg("child cma %p\n", req)
	c := &pingConn{o: o, out: out, server: true, peer: req.RemoteAddr(), state: stConnectRequest}
	defer c.free()
	if err := c.setup(dev); err != nil {
		req.Reject(nil)
		return err
	}
	out.dbg("accepting client connection request\n")
	actx, cancel := context.WithTimeout(ctx, o.timeout)
	conn, err := req.Accept(actx, c.qp, verbs.ConnParams{IRD: rpingIRD, ORD: rpingORD})
	cancel()
	if err != nil {
		return fmt.Errorf("rdma_accept from %v: %w", c.peer, err)
	}
	if o.finished != nil {
		defer func() { o.finished(conn, err) }()
	}
	c.established(ctx, conn)
	out.dbg("cma_event type RDMA_CM_EVENT_ESTABLISHED cma_id %p (child)\n", req)
	out.dbg("ESTABLISHED\n")
	err = c.testServer()
	c.disconnect(ctx)
	if errors.Is(err, errStateDisconnected) {
		return nil
	}
	return err
}

// testServer is rping_test_server: per ping, RDMA Read the client's
// data, tell it to go on, RDMA Write the data back to its sink, tell it
// again.
func (c *pingConn) testServer() error {
	for ping := 0; ; ping++ {
		// Wait for the client's start STag/TO/Len.
		if err := c.wait(stReadAdv); err != nil {
			return err
		}
		c.out.dbg("server received sink adv\n")
		n := int(c.remote.Size)
		if n > len(c.rdmaBuf) {
			return fmt.Errorf("client %v advertised %d bytes, more than this server's -S %d", c.peer, n, len(c.rdmaBuf))
		}
		if err := c.post(verbs.SendWR{ID: 3, Op: verbs.OpRead, Flags: verbs.Signaled,
			SGL: []verbs.SGE{c.rdmaMR.SGE(0, n)}, RemoteAddr: c.remote.Buf, RKey: c.remote.RKey}); err != nil {
			return err
		}
		c.out.dbg("server posted rdma read req \n")
		if err := c.wait(stReadComplete); err != nil {
			return err
		}
		c.out.dbg("server received read complete\n")
		data := cString(c.rdmaBuf[:n])
		if c.o.verbose {
			c.out.printf("server ping data: %s\n", data)
		}
		// Tell the client to continue (16 zero bytes, as rping's server).
		if err := c.sendInfo(); err != nil {
			return err
		}
		c.out.dbg("server posted go ahead\n")
		// Wait for the client's sink STag/TO/Len.
		if err := c.wait(stWriteAdv); err != nil {
			return err
		}
		c.out.dbg("server received sink adv\n")
		// Echo strlen(data)+1 bytes, as rping.
		wlen := min(len(data)+1, n, int(c.remote.Size))
		if c.o.corrupt != nil {
			c.o.corrupt(ping, c.rdmaBuf[:wlen])
		}
		sge := c.rdmaMR.SGE(0, wlen)
		c.out.dbg("rdma write from lkey %x laddr %x len %d\n", sge.LKey, sge.Addr, sge.Length)
		if err := c.post(verbs.SendWR{ID: 4, Op: verbs.OpWrite, Flags: verbs.Signaled,
			SGL: []verbs.SGE{sge}, RemoteAddr: c.remote.Buf, RKey: c.remote.RKey}); err != nil {
			return err
		}
		if err := c.wait(stWriteComplete); err != nil {
			return err
		}
		c.out.dbg("server rdma write complete \n")
		// Tell the client to begin again.
		if err := c.sendInfo(); err != nil {
			return err
		}
		c.out.dbg("server posted go ahead\n")
	}
}

// pingClient connects and pings (rping_run_client).
func pingClient(ctx context.Context, dev *verbs.Device, o pingOpts, out *pingOut) error {
	raddr := netip.AddrPortFrom(o.addr, o.port)
	c := &pingConn{o: &o, out: out, peer: raddr, state: stIdle}
	out.dbg("created cm_id %p\n", c)
	out.dbg("cma_event type RDMA_CM_EVENT_ADDR_RESOLVED cma_id %p (parent)\n", c)
	out.dbg("cma_event type RDMA_CM_EVENT_ROUTE_RESOLVED cma_id %p (parent)\n", c)
	out.dbg("rdma_resolve_addr - rdma_resolve_route successful\n")
	defer c.free()
	if err := c.setup(dev); err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, o.timeout)
	conn, err := dev.Dial(dctx, c.qp, raddr, verbs.ConnParams{IRD: rpingIRD, ORD: rpingORD})
	cancel()
	if err != nil {
		return connectError(ctx, dctx, raddr, o.timeout, err)
	}
	c.established(ctx, conn)
	out.dbg("cma_event type RDMA_CM_EVENT_ESTABLISHED cma_id %p (parent)\n", c)
	out.dbg("ESTABLISHED\n")
	out.dbg("rdma_connect successful\n")
	err = c.testClient()
	c.disconnect(ctx)
	if err != nil {
		return fmt.Errorf("rping client failed: %w", err)
	}
	return nil
}

// connectError words a failed connect in one line.
func connectError(ctx, dctx context.Context, raddr netip.AddrPort, timeout time.Duration, err error) error {
	var rej *verbs.RejectedError
	switch {
	case ctx.Err() != nil:
		return errInterrupted
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("rdma_connect: connection refused by %v (no rping server on port %d?)", raddr, raddr.Port())
	case (errors.As(err, &rej) || errors.Is(err, verbs.ErrRejected)) && errors.Is(err, verbs.ErrMarkers):
		return fmt.Errorf("rdma_connect: %v rejected the connection (cma event RDMA_CM_EVENT_REJECTED): it asked for MPA markers (--markers), which Linux siw and most iWARP peers refuse", raddr)
	case errors.As(err, &rej) || errors.Is(err, verbs.ErrRejected):
		return fmt.Errorf("rdma_connect: %v rejected the connection (cma event RDMA_CM_EVENT_REJECTED)", raddr)
	case dctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return fmt.Errorf("rdma_connect: timeout: no answer from %v within %v", raddr, timeout)
	case errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH):
		return fmt.Errorf("rdma_connect: %v is unreachable", raddr)
	}
	return fmt.Errorf("rdma_connect to %v: %w", raddr, err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// testClient is rping_test_client.
func (c *pingConn) testClient() error {
	start := byte('A')
	for ping := 0; c.o.count == 0 || ping < c.o.count; ping++ {
		c.state = stReadAdv
		start = rpingFill(c.startBuf, ping, start)
		c.formatSend(c.startMR)
		if err := c.sendInfo(); err != nil {
			return err
		}
		// Wait for the server to have read the data.
		if err := c.wait(stWriteAdv); err != nil {
			return err
		}
		c.formatSend(c.rdmaMR)
		if err := c.sendInfo(); err != nil {
			return err
		}
		// Wait for the server to say the RDMA Write is complete.
		if err := c.wait(stWriteComplete); err != nil {
			return err
		}
		if c.o.validate && !bytes.Equal(c.startBuf, c.rdmaBuf) {
			return fmt.Errorf("data mismatch! (ping %d: %s)", ping, firstDiff(c.startBuf, c.rdmaBuf))
		}
		if c.o.verbose {
			c.out.printf("ping data: %s\n", cString(c.rdmaBuf))
		}
	}
	return nil
}

// firstDiff describes where got first differs from want.
func firstDiff(want, got []byte) string {
	for i := range want {
		if got[i] != want[i] {
			return "byte " + strconv.Itoa(i) + " is " + strconv.QuoteRune(rune(got[i])) + ", sent " + strconv.QuoteRune(rune(want[i]))
		}
	}
	return "lengths differ"
}
