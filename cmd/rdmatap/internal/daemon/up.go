// Package daemon is `rdmatap up`, a standalone endpoint that runs until
// signalled, with its JSON control socket and service socket, and the
// commands that ask a running one: `rdmatap devinfo` and `rdmatap stat`.
package daemon

import (
	"bufio"
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/service"
)

func init() {
	cli.Register("up", "run a standalone endpoint on a TAP device; serves a control socket", upCmd)
	cli.Register("devinfo", "device attributes of a running endpoint (like ibv_devinfo)", devinfoCmd)
	cli.Register("stat", "counters of a running endpoint (like rdma statistic)", statCmd)
}

// The control socket's default place is a directory of rdmatap's own:
// /run/rdmatap for root; otherwise $XDG_RUNTIME_DIR/rdmatap when
// XDG_RUNTIME_DIR is set (to an absolute path), else rdmatap-UID in the
// temporary directory (/tmp/rdmatap-UID). up creates it with mode 0700, and
// up, devinfo and stat all refuse it unless it is a real directory (not a
// symlink) owned by this user with mode 0700: in a shared /tmp another user
// could otherwise create rdmatap-UID first, serve the socket in it and
// answer stat with made-up counters. An explicit --ctl path is the user's
// own choice and is used as given.

// ctlDirFor is the default control socket directory of a process with
// these ids and environment.
func ctlDirFor(euid, uid int, xdgRuntimeDir, tmpDir string) string {
	if euid == 0 {
		return "/run/rdmatap"
	}
	if xdgRuntimeDir != "" && filepath.IsAbs(xdgRuntimeDir) {
		return filepath.Join(xdgRuntimeDir, "rdmatap")
	}
	return filepath.Join(tmpDir, fmt.Sprintf("rdmatap-%d", uid))
}

// defaultCtlDir is this process's default control socket directory (a
// variable so that tests can point it at a directory of their own).
var defaultCtlDir = func() string {
	return ctlDirFor(os.Geteuid(), os.Getuid(), os.Getenv("XDG_RUNTIME_DIR"), os.TempDir())
}

// defaultCtl is the control socket of device name.
func defaultCtl(name string) (string, error) {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return "", fmt.Errorf("%w: device name %q cannot name a control socket (pass --ctl)", cli.ErrUsage, name)
	}
	return filepath.Join(defaultCtlDir(), name+".sock"), nil
}

// ctlDirError says why a control socket directory is not trusted.
type ctlDirError struct {
	Dir    string
	UID    int // the user who must own it
	Reason string
}

func (e *ctlDirError) Error() string {
	return fmt.Sprintf("control socket directory %s is not trusted: %s; it must be a directory owned by uid %d with mode 0700 (remove it, or pass --ctl)",
		e.Dir, e.Reason, e.UID)
}

// checkCtlDir verifies, without following a symlink, that dir is a
// directory owned by this user with mode 0700. A missing dir gives an error
// that wraps fs.ErrNotExist; an untrusted one a *ctlDirError.
func checkCtlDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("control socket directory: %w", err)
	}
	bad := func(format string, args ...any) error {
		return &ctlDirError{Dir: dir, UID: os.Geteuid(), Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return bad("it is a symbolic link")
	case !fi.IsDir():
		return bad("it is not a directory (%v)", fi.Mode().Type())
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return bad("its owner cannot be read")
	}
	if uid := os.Geteuid(); int(st.Uid) != uid {
		return bad("it is owned by uid %d, not by uid %d", st.Uid, uid)
	}
	if perm := fi.Mode().Perm(); perm != 0o700 {
		return bad("it has mode %#o, not 0700", perm)
	}
	return nil
}

// makeCtlDir creates dir with mode 0700 if it is missing, then checks it.
func makeCtlDir(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("control socket directory: %w", err)
	}
	return checkCtlDir(dir)
}

// upCtlPath is the control socket up serves: the --ctl flag, else the
// default one in a directory made (or found) private to this user.
func upCtlPath(flagPath, name string) (string, error) {
	if flagPath != "" {
		return flagPath, nil
	}
	path, err := defaultCtl(name)
	if err != nil {
		return "", err
	}
	if err := makeCtlDir(filepath.Dir(path)); err != nil {
		return "", err
	}
	return path, nil
}

// clientCtlPath is the control socket devinfo and stat connect to: the
// --ctl flag, else the default one, refused if its directory is not
// private to this user. A missing directory is left to ctlCall, which
// says that no endpoint is running.
func clientCtlPath(flagPath, name string) (string, error) {
	if flagPath != "" {
		return flagPath, nil
	}
	path, err := defaultCtl(name)
	if err != nil {
		return "", err
	}
	if err := checkCtlDir(filepath.Dir(path)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	return path, nil
}

func upCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var ef cli.EndpointFlags
	ef.Register(fs)
	ctl := fs.String("ctl", "", "control socket path (default /run/rdmatap/NAME.sock as root, else $XDG_RUNTIME_DIR/rdmatap/NAME.sock or /tmp/rdmatap-UID/NAME.sock)")
	var sf serviceFlags
	sf.register(fs)
	if err := cli.ParseFlags(fs, args, stderr, "up", "Bring up an endpoint on a TAP device and keep it running until SIGINT/SIGTERM."); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", cli.ErrUsage, fs.Arg(0))
	}
	if _, _, _, err := ef.Check(); err != nil {
		return err
	}
	if _, _, err := sf.check(); err != nil {
		return err
	}
	// The control socket's directory is checked before the TAP is touched.
	ctlPath, err := upCtlPath(*ctl, ef.Name)
	if err != nil {
		return err
	}
	e, err := ef.Open()
	if err != nil {
		return err
	}
	defer e.Close()
	logger := log.New(stdout, "", log.LstdFlags|log.Lmicroseconds)
	srv, err := serveControl(ctlPath, e, defaultCtlLimits, logger.Printf)
	if err != nil {
		return err
	}
	defer srv.Close()
	svc, err := sf.start(e.Dev, logger.Printf)
	if err != nil {
		return err
	}
	if svc != nil {
		defer svc.Close()
		srv.service.Store(svc)
		logger.Printf("up: serving %s to other processes on %s", e.Dev.Name(), sf.socket)
	}
	created := "attached to"
	if e.Tap.Created() {
		created = "created"
	}
	logger.Printf("up: device %s on TAP %s (%s), address %s, MTU %d, offload %v, control socket %s",
		e.Dev.Name(), ef.Tap, created, ef.Addr, ef.MTU, e.Tap.Offload(), ctlPath)

	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	for {
		select {
		case s := <-sig:
			logger.Printf("up: %v: closing connections", s)
			if e.Tap.Created() {
				logger.Printf("up: removing TAP %s", ef.Tap)
			}
			return nil
		case ev := <-e.Dev.Events():
			logger.Print(formatEvent(ev))
		case <-e.Tap.Gone():
			// The TAP was deleted (or failed) under the endpoint: with
			// no network left, exit with the reason rather than stay up.
			err := e.Tap.Err()
			if err == nil {
				err = errors.New("the TAP device stopped")
			}
			logger.Printf("up: %v", err)
			return fmt.Errorf("up: TAP %s is gone: %w", ef.Tap, err)
		}
	}
}

func formatEvent(ev verbs.AsyncEvent) string {
	s := fmt.Sprintf("event: %v qp %d", ev.Type, ev.QPNum)
	if ev.Term != (verbs.TermCode{}) {
		s += fmt.Sprintf(" terminate %v", ev.Term)
	}
	if ev.Err != nil {
		s += fmt.Sprintf(" (%v)", ev.Err)
	}
	return s
}

// The control socket speaks one JSON request line and one JSON reply line
// per connection: {"cmd":"devinfo"}, {"cmd":"stat"} or {"cmd":"ss"}.
type ctlRequest struct {
	Cmd string `json:"cmd"`
}

type ctlReply struct {
	Error   string   `json:"error,omitempty"`
	DevInfo *devInfo `json:"devinfo,omitempty"`
	Stat    *statSet `json:"stat,omitempty"`
	Conns   []ssConn `json:"conns,omitempty"`
}

// ctlLimits bound what clients of the control socket can hold.
//
// Every connection is served by one handler goroutine, and at most
// maxConns handlers run at once. A handler gives its client readTimeout to
// send the whole request line and writeTimeout to take the reply, so an
// idle client or one that sends half a request is dropped within
// readTimeout. That alone would still let 64 such clients fill every slot
// again and again, each for readTimeout, and stat would time out. So when
// a connection arrives with every slot taken, the accept loop closes the
// oldest connection that has not yet sent its request (its handler sees
// the closed connection and returns at once) and gives the slot to the new
// one. An honest client writes its request as soon as it connects, and the
// reply is computed and written at once, so it only loses its slot if
// maxConns newer connections arrive before its handler reads a line that
// is already waiting; the idle and the half-sent ones, being older, go
// first. Handlers that have their request are never dropped this way; if
// all maxConns have one, the accept loop waits for the first to finish
// (at most writeTimeout). The same eviction frees a descriptor when
// Accept fails with EMFILE or ENFILE: the clients holding the control
// socket are likely the ones that used the descriptors up.
type ctlLimits struct {
	maxConns     int
	readTimeout  time.Duration
	writeTimeout time.Duration
}

var defaultCtlLimits = ctlLimits{maxConns: 64, readTimeout: 2 * time.Second, writeTimeout: 2 * time.Second}

// An Accept error backs off 5 ms, doubling to 1 s, as net/http's Server
// does; an error that is not known to be temporary waits the full second.
// The loop retries until the listener is closed: an accept loop that
// returned on the first EMFILE left up answering pings but never stat.
const (
	ctlAcceptBackoffMin = 5 * time.Millisecond
	ctlAcceptBackoffMax = time.Second
	ctlAcceptLogEvery   = 10 * time.Second // at most one accept error logged per
	ctlMaxRequest       = 4096             // bytes in a request line
	ctlMaxReply         = 1 << 20          // bytes in a reply line (ctlCall)
)

type ctlServer struct {
	ln    net.Listener
	path  string // removed by Close; "" for none
	e     *cli.Endpoint
	lim   ctlLimits
	logf  func(format string, args ...any)
	slots chan struct{} // a token per running handler
	done  chan struct{} // closed by Close
	once  sync.Once
	wg    sync.WaitGroup

	accepted atomic.Uint64 // connections accepted
	evicted  atomic.Uint64 // connections closed to make room
	// service is the endpoint's service (up --socket), nil without one:
	// stat lists its clients.
	service atomic.Pointer[service.Server]

	mu      sync.Mutex
	closing bool
	conns   list.List // *ctlConn, oldest first
	peak    int       // most handlers at once
}

// ctlConn is a connection being served.
type ctlConn struct {
	c       net.Conn
	elem    *list.Element // in ctlServer.conns; nil once removed
	waiting bool          // its request line has not arrived yet
}

// serveControl serves the control socket at path. logf, if not nil, gets
// the accept errors, one per ctlAcceptLogEvery at most.
func serveControl(path string, e *cli.Endpoint, lim ctlLimits, logf func(string, ...any)) (*ctlServer, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	// A socket left by a crashed endpoint is removed; a live one, or a file
	// that is not a socket, is not.
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("control socket %s: the path exists and is not a socket", path)
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("control socket %s is already in use by another running endpoint", path)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("control socket %s: cannot tell whether another endpoint serves it: %w", path, err)
		}
		os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	return startCtlServer(ln, path, e, lim, logf), nil
}

// startCtlServer serves the control protocol on ln.
func startCtlServer(ln net.Listener, path string, e *cli.Endpoint, lim ctlLimits, logf func(string, ...any)) *ctlServer {
	if lim.maxConns < 1 {
		lim.maxConns = 1
	}
	s := &ctlServer{ln: ln, path: path, e: e, lim: lim, logf: logf,
		slots: make(chan struct{}, lim.maxConns), done: make(chan struct{})}
	s.wg.Add(1)
	go s.loop()
	return s
}

func (s *ctlServer) loop() {
	defer s.wg.Done()
	var delay time.Duration
	var lastLog time.Time // of the last accept error logged
	var quiet int         // accept errors not logged since
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || s.isClosed() {
				return
			}
			if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				s.evictOldestWaiting()
			}
			if s.logf != nil {
				if now := time.Now(); now.Sub(lastLog) >= ctlAcceptLogEvery {
					if quiet > 0 {
						s.logf("control socket: accept: %v (retrying; %d more accept errors since the last report)", err, quiet)
					} else {
						s.logf("control socket: accept: %v (retrying)", err)
					}
					lastLog, quiet = now, 0
				} else {
					quiet++
				}
			}
			delay = acceptBackoff(delay, err)
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-s.done:
				t.Stop()
				return
			}
			continue
		}
		delay = 0
		s.accepted.Add(1)
		if !s.acquire() {
			c.Close()
			return
		}
		cc, ok := s.track(c)
		if !ok {
			<-s.slots
			c.Close()
			return
		}
		s.wg.Add(1)
		go s.serve(cc)
	}
}

// acceptBackoff is the wait after an Accept error, given the last one.
func acceptBackoff(last time.Duration, err error) time.Duration {
	if !acceptTemporary(err) {
		return ctlAcceptBackoffMax
	}
	d := 2 * last
	if d < ctlAcceptBackoffMin {
		d = ctlAcceptBackoffMin
	}
	return min(d, ctlAcceptBackoffMax)
}

// acceptTemporary reports an Accept error that goes away by itself: out of
// descriptors or memory, a connection aborted before it was accepted, or a
// timeout.
func acceptTemporary(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ECONNABORTED, syscall.ENOBUFS, syscall.ENOMEM} {
		if errors.Is(err, errno) {
			return true
		}
	}
	return false
}

func (s *ctlServer) isClosed() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// acquire takes a handler slot, making room if every slot is taken. It
// fails only when the server is closed.
func (s *ctlServer) acquire() bool {
	select {
	case s.slots <- struct{}{}:
	default:
		s.evictOldestWaiting()
		select {
		case s.slots <- struct{}{}:
		case <-s.done:
			return false
		}
	}
	s.mu.Lock()
	s.peak = max(s.peak, len(s.slots))
	s.mu.Unlock()
	return true
}

// evictOldestWaiting closes the oldest connection that has not sent its
// request; its handler returns and frees its slot.
func (s *ctlServer) evictOldestWaiting() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for el := s.conns.Front(); el != nil; el = el.Next() {
		cc := el.Value.(*ctlConn)
		if cc.waiting {
			s.conns.Remove(el)
			cc.elem = nil
			cc.c.Close()
			s.evicted.Add(1)
			return
		}
	}
}

// track adds a new connection; false if the server is closing.
func (s *ctlServer) track(c net.Conn) (*ctlConn, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return nil, false
	}
	cc := &ctlConn{c: c, waiting: true}
	cc.elem = s.conns.PushBack(cc)
	return cc, true
}

// setWaiting marks whether the connection still waits for its request; false
// if it was evicted meanwhile.
func (s *ctlServer) setWaiting(cc *ctlConn, waiting bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	cc.waiting = waiting
	return cc.elem != nil
}

// untrack removes and closes the connection.
func (s *ctlServer) untrack(cc *ctlConn) {
	s.mu.Lock()
	if cc.elem != nil {
		s.conns.Remove(cc.elem)
		cc.elem = nil
	}
	s.mu.Unlock()
	cc.c.Close()
}

// serve answers the one request of a connection.
func (s *ctlServer) serve(cc *ctlConn) {
	defer s.wg.Done()
	defer func() { <-s.slots }()
	defer s.untrack(cc)
	c := cc.c
	c.SetReadDeadline(time.Now().Add(s.lim.readTimeout))
	line, err := bufio.NewReader(io.LimitReader(c, ctlMaxRequest)).ReadBytes('\n')
	// A request cut by EOF (the client shut its side, or the line is over
	// ctlMaxRequest) is still answered; a timeout, an eviction or an empty
	// connection is not.
	if err != nil && (!errors.Is(err, io.EOF) || len(line) == 0) {
		return
	}
	if !s.setWaiting(cc, false) {
		return
	}
	rep := s.reply(line)
	b, err := json.Marshal(rep)
	if err != nil {
		b, _ = json.Marshal(ctlReply{Error: "encoding the reply: " + err.Error()})
	}
	c.SetWriteDeadline(time.Now().Add(s.lim.writeTimeout))
	c.Write(append(b, '\n'))
}

func (s *ctlServer) reply(line []byte) ctlReply {
	var req ctlRequest
	var rep ctlReply
	if err := json.Unmarshal(line, &req); err != nil {
		rep.Error = "bad request: " + err.Error()
		return rep
	}
	switch req.Cmd {
	case "devinfo":
		d := getDevInfo(s.e)
		rep.DevInfo = &d
	case "stat":
		st := getStats(s.e)
		if srv := s.service.Load(); srv != nil {
			st.Clients = srv.ClientStats()
		}
		rep.Stat = &st
	case "ss":
		rep.Conns = getConns(s.e)
	default:
		rep.Error = fmt.Sprintf("unknown command %q", req.Cmd)
	}
	return rep
}

// Close stops accepting, drops the connections being served, waits for
// the handlers and removes the socket.
func (s *ctlServer) Close() {
	s.once.Do(func() {
		close(s.done)
		s.ln.Close()
		s.mu.Lock()
		s.closing = true
		for el := s.conns.Front(); el != nil; el = el.Next() {
			el.Value.(*ctlConn).c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
		if s.path != "" {
			os.Remove(s.path)
		}
	})
}

// ctlCall sends one request to a running endpoint.
func ctlCall(ctx context.Context, path, cmd string) (ctlReply, error) {
	var rep ctlReply
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return rep, fmt.Errorf("no endpoint is running with control socket %s (start one with rdmatap up)", path)
		}
		if errors.Is(err, os.ErrPermission) {
			return rep, fmt.Errorf("control socket %s: permission denied", path)
		}
		return rep, fmt.Errorf("control socket %s: %w", path, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	b, _ := json.Marshal(ctlRequest{Cmd: cmd})
	if _, err := c.Write(append(b, '\n')); err != nil {
		return rep, fmt.Errorf("control socket %s: %w", path, err)
	}
	line, err := bufio.NewReader(io.LimitReader(c, ctlMaxReply)).ReadBytes('\n')
	if err != nil {
		return rep, fmt.Errorf("control socket %s: no reply: %w", path, err)
	}
	if err := json.Unmarshal(line, &rep); err != nil {
		return rep, fmt.Errorf("control socket %s: bad reply: %w", path, err)
	}
	if rep.Error != "" {
		return rep, errors.New(rep.Error)
	}
	return rep, nil
}

// devInfo is what devinfo prints (the ibv_devinfo field names).
type devInfo struct {
	HCAID        string           `json:"hca_id"`
	Transport    string           `json:"transport"`
	FWVer        string           `json:"fw_ver"`
	NodeGUID     string           `json:"node_guid"`
	SysImageGUID string           `json:"sys_image_guid"`
	VendorID     string           `json:"vendor_id"`
	VendorPartID uint32           `json:"vendor_part_id"`
	HWVer        string           `json:"hw_ver"`
	PhysPortCnt  int              `json:"phys_port_cnt"`
	Attr         verbs.DeviceAttr `json:"attr"`
	Port         portInfo         `json:"port"`
}

type portInfo struct {
	State      string `json:"state"`
	ActiveMTU  int    `json:"active_mtu"`
	LinkLayer  string `json:"link_layer"`
	Netdev     string `json:"netdev"`
	MAC        string `json:"mac"`
	Address    string `json:"address"`
	Offload    bool   `json:"offload"`
	TAPCreated bool   `json:"tap_created"`
	TCP        string `json:"tcp"` // the TCP under iWARP: gvisor or rdmatap
}

// nodeGUID derives the node GUID from the MAC as EUI-64, as siw does
// (52:54:00:4d:00:02 -> 5054:00ff:fe4d:0002).
func nodeGUID(mac net.HardwareAddr) string {
	if len(mac) != 6 {
		return "0000:0000:0000:0000"
	}
	g := []byte{mac[0] ^ 2, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]}
	return fmt.Sprintf("%02x%02x:%02x%02x:%02x%02x:%02x%02x", g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7])
}

func getDevInfo(e *cli.Endpoint) devInfo {
	var mac net.HardwareAddr
	d := devInfo{HCAID: e.Dev.Name(), Transport: "iWARP (1)", FWVer: "0.0.0", VendorID: fmt.Sprintf("%#x", verbs.VendorID), HWVer: "0x0",
		PhysPortCnt: 1, Attr: e.Dev.Query()}
	p := portInfo{State: "PORT_ACTIVE (4)", LinkLayer: "Ethernet", Address: e.Addr.String()}
	if e.Net != nil {
		p.TCP = e.Net.TCPName()
	}
	if e.Tap != nil {
		mac = e.Tap.MAC()
		p.Netdev, p.MAC, p.Offload, p.TAPCreated = e.Tap.Name(), mac.String(), e.Tap.Offload(), e.Tap.Created()
		p.ActiveMTU = int(e.Tap.LinkEndpoint().MTU())
	}
	d.NodeGUID = nodeGUID(mac)
	d.SysImageGUID = d.NodeGUID
	d.Port = p
	return d
}

// statSet is what stat prints.
type statSet struct {
	Device string                `json:"device"`
	Verbs  verbs.Stats           `json:"verbs"`
	Link   any                   `json:"link,omitempty"`
	Ops    map[string]uint64     `json:"ops"`
	Impair *netstack.ImpairStats `json:"impair,omitempty"` // --loss, --reorder, --dup
	// The clients of the service (up --socket), each with the service
	// memory it holds against its budget (--client-memory).
	Clients []service.ClientStat `json:"clients,omitempty"`
}

func getStats(e *cli.Endpoint) statSet {
	s := statSet{Device: e.Dev.Name(), Verbs: e.Dev.Stats(), Ops: map[string]uint64{}}
	for i := 0; i < 12; i++ {
		name := strings.ReplaceAll(strings.ToLower(verbs.RDMAPOpcode(i).String()), " ", "_")
		if v := s.Verbs.RxOps[i]; v != 0 {
			s.Ops["rx_"+name] = v
		}
		if v := s.Verbs.TxOps[i]; v != 0 {
			s.Ops["tx_"+name] = v
		}
	}
	if e.EP != nil {
		es := e.EP.Stats()
		s.Link, s.Impair = es.Link, es.Impair
	} else if e.Impair != nil {
		is := e.Impair.Stats()
		s.Impair = &is
	}
	return s
}

func ctlFlags(name string, args []string, stderr io.Writer, what string) (path string, jsonOut, verbose bool, err error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	ctl := fs.String("ctl", "", "control socket of the endpoint (default /run/rdmatap/DEV.sock as root, else $XDG_RUNTIME_DIR/rdmatap/DEV.sock or /tmp/rdmatap-UID/DEV.sock)")
	dev := fs.String("d", "rt0", "device name")
	j := fs.Bool("j", false, "JSON output")
	v := fs.Bool("v", false, "verbose")
	if err := cli.ParseFlags(fs, args, stderr, name, what); err != nil {
		return "", false, false, err
	}
	if fs.NArg() > 0 {
		return "", false, false, fmt.Errorf("%w: unexpected argument %q", cli.ErrUsage, fs.Arg(0))
	}
	path, err = clientCtlPath(*ctl, *dev)
	if err != nil {
		return "", false, false, err
	}
	return path, *j, *v, nil
}

func devinfoCmd(args []string, stdout, stderr io.Writer) error {
	path, jsonOut, verbose, err := ctlFlags("devinfo", args, stderr, "Print the attributes of a running endpoint's device, as ibv_devinfo does.")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rep, err := ctlCall(ctx, path, "devinfo")
	if err != nil {
		return err
	}
	if jsonOut {
		return json.NewEncoder(stdout).Encode(rep.DevInfo)
	}
	d := rep.DevInfo
	w := bufio.NewWriter(stdout)
	defer w.Flush()
	fmt.Fprintf(w, "hca_id:\t%s\n", d.HCAID)
	fmt.Fprintf(w, "\ttransport:\t\t\t%s\n", d.Transport)
	fmt.Fprintf(w, "\tfw_ver:\t\t\t\t%s\n", d.FWVer)
	fmt.Fprintf(w, "\tnode_guid:\t\t\t%s\n", d.NodeGUID)
	fmt.Fprintf(w, "\tsys_image_guid:\t\t\t%s\n", d.SysImageGUID)
	fmt.Fprintf(w, "\tvendor_id:\t\t\t%s\n", d.VendorID)
	fmt.Fprintf(w, "\tvendor_part_id:\t\t\t%d\n", d.VendorPartID)
	fmt.Fprintf(w, "\thw_ver:\t\t\t\t%s\n", d.HWVer)
	fmt.Fprintf(w, "\tphys_port_cnt:\t\t\t%d\n", d.PhysPortCnt)
	if verbose {
		a := d.Attr
		fmt.Fprintf(w, "\tmax_mr_size:\t\t\t%#x\n", a.MaxMRSize)
		fmt.Fprintf(w, "\tpage_size_cap:\t\t\t%#x\n", a.PageSizeCap)
		fmt.Fprintf(w, "\tmax_qp:\t\t\t\t%d\n", a.MaxQP)
		fmt.Fprintf(w, "\tmax_qp_wr:\t\t\t%d\n", a.MaxQPWR)
		fmt.Fprintf(w, "\tmax_sge:\t\t\t%d\n", a.MaxSGE)
		fmt.Fprintf(w, "\tmax_sge_rd:\t\t\t%d\n", a.MaxSGERd)
		fmt.Fprintf(w, "\tmax_cq:\t\t\t\t%d\n", a.MaxCQ)
		fmt.Fprintf(w, "\tmax_cqe:\t\t\t%d\n", a.MaxCQE)
		fmt.Fprintf(w, "\tmax_mr:\t\t\t\t%d\n", a.MaxMR)
		fmt.Fprintf(w, "\tmax_pd:\t\t\t\t%d\n", a.MaxPD)
		fmt.Fprintf(w, "\tmax_qp_rd_atom:\t\t\t%d\n", a.MaxQPRdAtom)
		fmt.Fprintf(w, "\tmax_qp_init_rd_atom:\t\t%d\n", a.MaxQPInitRd)
		fmt.Fprintf(w, "\tatomic_cap:\t\t\t%s (%d)\n", a.AtomicCap, atomicCapValue(a.AtomicCap))
		fmt.Fprintf(w, "\tmax_mw:\t\t\t\t%d\n", a.MaxMW)
		fmt.Fprintf(w, "\tmax_srq:\t\t\t%d\n", a.MaxSRQ)
		fmt.Fprintf(w, "\tmax_srq_wr:\t\t\t%d\n", a.MaxSRQWR)
		fmt.Fprintf(w, "\tmax_srq_sge:\t\t\t%d\n", a.MaxSRQSGE)
		fmt.Fprintf(w, "\tmax_inline_data:\t\t%d\n", a.MaxInline)
		fmt.Fprintf(w, "\tmax_private_data:\t\t%d\n", a.MaxPrivData)
	}
	p := d.Port
	fmt.Fprintf(w, "\t\tport:\t1\n")
	fmt.Fprintf(w, "\t\t\tstate:\t\t\t%s\n", p.State)
	fmt.Fprintf(w, "\t\t\tactive_mtu:\t\t%d\n", p.ActiveMTU)
	fmt.Fprintf(w, "\t\t\tlink_layer:\t\t%s\n", p.LinkLayer)
	fmt.Fprintf(w, "\t\t\tnetdev:\t\t\t%s\n", p.Netdev)
	if p.TCP != "" {
		fmt.Fprintf(w, "\t\t\ttcp:\t\t\t%s\n", p.TCP)
	}
	fmt.Fprintf(w, "\t\t\tmac:\t\t\t%s\n", p.MAC)
	fmt.Fprintf(w, "\t\t\taddress:\t\t%s\n", p.Address)
	fmt.Fprintf(w, "\t\t\toffload:\t\t%v\n", p.Offload)
	return nil
}

func statCmd(args []string, stdout, stderr io.Writer) error {
	path, jsonOut, _, err := ctlFlags("stat", args, stderr, "Print the counters of a running endpoint.")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rep, err := ctlCall(ctx, path, "stat")
	if err != nil {
		return err
	}
	if jsonOut {
		return json.NewEncoder(stdout).Encode(rep.Stat)
	}
	s := rep.Stat
	v := s.Verbs
	w := bufio.NewWriter(stdout)
	defer w.Flush()
	fmt.Fprintf(w, "link %s/1", s.Device)
	for _, kv := range []struct {
		k string
		v uint64
	}{
		{"tx_fpdus", v.TxFPDUs}, {"rx_fpdus", v.RxFPDUs}, {"tx_bytes", v.TxBytes}, {"rx_bytes", v.RxBytes},
		{"placed_bytes", v.PlacedBytes}, {"placement_copies", v.PlacementCopies}, {"crc_errors", v.CRCErrors},
		{"terminates_sent", v.TerminatesSent}, {"terminates_received", v.TerminatesReceived},
	} {
		fmt.Fprintf(w, " %s %d", kv.k, kv.v)
	}
	// Segment placement, then copies per payload byte received (placed
	// bytes over received bytes, 1.00 when every byte is copied once).
	for _, kv := range cli.SegmentCounters(v) {
		fmt.Fprintf(w, " %s %d", kv.K, kv.V)
	}
	fmt.Fprintf(w, " copies_per_byte %s", cli.CopiesPerByte(v))
	for _, k := range sortedKeys(s.Ops) {
		fmt.Fprintf(w, " %s %d", k, s.Ops[k])
	}
	if s.Impair != nil {
		for _, kv := range cli.ImpairCounters(*s.Impair) {
			fmt.Fprintf(w, " %s %d", kv.K, kv.V)
		}
	}
	if m, ok := s.Link.(map[string]any); ok {
		for _, k := range sortedKeys(m) {
			fmt.Fprintf(w, " link_%s %v", strings.ToLower(k), m[k])
		}
	}
	for _, kv := range tcpCounters(v.TCP) {
		fmt.Fprintf(w, " %s %d", kv.k, kv.v)
	}
	fmt.Fprintln(w)
	for _, c := range s.Clients {
		fmt.Fprintf(w, "client %d uid %d pid %d memory_bytes %d memory_limit %d ring_bytes %d mr_bytes %d pds %d cqs %d qps %d srqs %d mrs %d conns %d calls %d\n",
			c.ID, c.UID, c.PID, c.Memory, c.MemoryLimit, c.RingBytes, c.MRBytes, c.PDs, c.CQs, c.QPs, c.SRQs, c.MRs, c.Conns, c.Calls)
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && keys[j] < keys[j-1]; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
	return keys
}

// atomicCapValue is ibv_atomic_cap's number for the name ibv_devinfo prints.
func atomicCapValue(s string) int {
	switch s {
	case verbs.AtomicHCA:
		return 1
	case verbs.AtomicGlob:
		return 2
	}
	return 0
}

// tcpCounters are the device's TCP recovery counters as stat prints them
// (the stack's since it started, and the busiest connection's state), as
// `ss -ti` shows a kernel socket's.
func tcpCounters(t verbs.TCPStats) []struct {
	k string
	v uint64
} {
	return []struct {
		k string
		v uint64
	}{
		{"tcp_segs_out", t.SegmentsSent}, {"tcp_retrans", t.Retransmits}, {"tcp_fast_retrans", t.FastRetransmits},
		{"tcp_rto_timeouts", t.Timeouts}, {"tcp_sack_recoveries", t.SACKRecoveries}, {"tcp_tlp_recoveries", t.TLPRecoveries},
		{"tcp_spurious", t.SpuriousRecoveries + t.SpuriousRTOs}, {"tcp_dsack", t.DSACKs},
		{"tcp_link_resent", t.LinkResentPackets}, {"tcp_link_resent_bytes", t.LinkResentBytes}, {"tcp_conns", t.Conns},
		{"tcp_cwnd", t.Cwnd}, {"tcp_srtt_us", uint64(t.SRTT.Microseconds())}, {"tcp_rto_ms", uint64(t.RTO.Milliseconds())},
	}
}
