package service

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/internal/bridge"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

// The service side (docs/service.md has the design, verbs/remote.go the
// client's side).
//
// Serve accepts clients on a unix SOCK_SEQPACKET socket. Each client is a
// session with three goroutines: the reader (one message at a time; calls
// that can block — dial, get request, accept, disconnect, reject — run in
// a goroutine of their own so the reader stays free for Cancel), the
// poller (drains the client's SQ, RQ and SRQ rings into the real QPs and
// SRQs) and the doorbell reader (wakes the poller when the client rings).
// Completions need no goroutine: the service-side CQ's Push writes them
// into the client's CQ ring from whatever goroutine completes the WR. One
// more goroutine per QP waits for its end to tell the client.
//
// Every object a client makes lives in its session's tables under handles
// the session hands out, so a handle of another client names nothing; the
// memory a client registers belongs to a PD of that session, and the
// protocol engine checks every SGE and every peer's STag against PD and
// bounds, so a client's work requests reach only its own pages.
//
// When the client goes (Device.Close, exit, kill -9: the socket reaches end
// of file), the session is torn down in this order: calls in progress are
// canceled; listeners close; the poller stops; QPs go to ERROR as on an
// RNIC's local catastrophic error (a connected QP sends its peer a
// Terminate, RDMAP local catastrophic error, then closes; a reset if the
// Terminate cannot go out) and are waited for until flushed; MRs are
// deregistered — their STags invalidated and in-flight placements fenced —
// and only then unmapped; CQ rings are retired under their lock, so a late
// completion finds them gone instead of touching unmapped memory; rings,
// eventfds and the socket are closed.

// Limits bound what one client may hold. Zero fields take the defaults.
type Limits struct {
	QPs int // default 1024
	CQs int // default 1024
	// MRBytes bounds the bytes registered at once (default 1 GiB). A
	// client's memfd may be sparse: pages the service places data into
	// are allocated then, and the kernel charges shared memory to the
	// task that allocates it, the service.
	MRBytes int64
	Conns   int // connections (dialed or accepted) and listeners (default 1024)
	// MaxWR bounds a queue's depth (default 16384): its ring is service
	// memory.
	MaxWR int
	// MRs bounds the registrations (default 4096): each is a mapping in
	// the service (the kernel allows a process about 65,000) and an STag.
	MRs int
	// PDs and SRQs bound the other objects (default 1024 each).
	PDs, SRQs int
	// RingBytes bounds the shared memory of the client's queues (default
	// 256 MiB): the service makes it, and the client can touch all of it.
	RingBytes int64
	// FRPages bounds the pages all of a client's fast-register MRs may
	// map (their maxPages; default 1<<20): a page list is service memory.
	// Fast-register MRs and memory windows count against MRs too.
	FRPages int
	// Memory bounds the service memory a client's objects may hold
	// (default 512 MiB): its rings, its queues' slots at their full
	// depth with their SGE lists and inline buffers, its fast-register
	// page lists, the TCP buffers of its connections at their maximum,
	// its listeners' pending connections, its calls in progress, and its
	// session's own buffers and goroutines. Each object is charged its
	// largest size when it is made, so a client at its limit cannot grow
	// by using what it holds. The client's registered memory is its own
	// (MRBytes bounds it).
	Memory int64
}

func (l Limits) withDefaults() Limits {
	if l.QPs <= 0 {
		l.QPs = 1024
	}
	if l.CQs <= 0 {
		l.CQs = 1024
	}
	if l.MRBytes <= 0 {
		l.MRBytes = 1 << 30
	}
	if l.Conns <= 0 {
		l.Conns = 1024
	}
	if l.MaxWR <= 0 {
		l.MaxWR = 16384
	}
	if l.MRs <= 0 {
		l.MRs = 4096
	}
	if l.PDs <= 0 {
		l.PDs = 1024
	}
	if l.SRQs <= 0 {
		l.SRQs = 1024
	}
	if l.RingBytes <= 0 {
		l.RingBytes = 256 << 20
	}
	if l.FRPages <= 0 {
		l.FRPages = 1 << 20
	}
	if l.Memory <= 0 {
		l.Memory = 512 << 20
	}
	return l
}

// Config configures a service.
type Config struct {
	Limits Limits
	// Logf receives one line per client arriving and leaving (with its
	// uid and pid) and per client error; nil discards them.
	Logf func(format string, args ...any)
	// PollSpin is how long a client's poller keeps polling its rings
	// after the last work request before it sleeps on the doorbell
	// (default 50 µs; negative: sleep at once). Longer costs CPU while
	// a client is idle, shorter costs a wake-up (a doorbell write and a
	// goroutine hand-off) on the next work request after a pause. In a
	// process that also runs the transfers on few cores a long spin
	// costs throughput: BenchmarkServiceRatios measured 1 MiB Writes at
	// 1.1, 0.8-0.9 and 0.5 of embedded with no spin, 50 µs and 1 ms on
	// 2 shared cores, while the 64 B round trip gained from the spin.
	// So the poller adapts: it spins the whole PollSpin while the
	// client's work requests come less than PollSpin apart, and halves
	// its spin (down to PollSpin/16) after each longer gap.
	PollSpin time.Duration
	// MaxClients bounds the sessions at once (default 1024); a
	// connection beyond it is refused at once, with a log line. Each
	// session holds descriptors and goroutines whatever its limits.
	MaxClients int
	// MaxClientsPerUser bounds the sessions of one uid (default 64, and
	// never above MaxClients), so that one user cannot take every slot;
	// MaxPendingPerUser bounds those of them that have not said HELLO
	// yet (default 16). A connection beyond either is refused with a
	// HELLO reply naming the limit (ErrLimit at the client).
	MaxClientsPerUser, MaxPendingPerUser int
	// HelloTimeout is how long a new connection may take to say HELLO
	// before it is dropped (default 2 s).
	HelloTimeout time.Duration
	// MaxMappings lowers the bound on the mappings (MRs and rings) all
	// clients hold at once, a quarter of which one uid may hold; zero,
	// or more than the system allows, keeps the system's bound (half of
	// vm.max_map_count, within the open-file limit).
	MaxMappings int
}

// Server serves a device to clients on a unix socket.
//
// mu guards the sessions, the admission and mapping counts and the QP
// owners (the fields marked +checklocks:mu). It is a leaf: no other lock
// is taken while it is held (ClientStats releases it before it locks
// each session). Sessions take it after their own locks are released or
// inside them: inside session.ringMu and servedCQ.mu (dropRing's dropMap from
// releaseQP, destroySRQ and a served CQ's retire), and from the engine's
// event path (routeEvent, the device's hook, runs where the QP raises
// the event, possibly with its txMu or rxMu held). refusing is an atomic;
// the fields above mu and maxMaps are set by Serve and never change.
type Server struct {
	dev  *verbs.Device
	ln   *net.UnixListener
	cfg  Config
	hook func(verbs.AsyncEvent) bool

	// tcpBufMax is what one TCP connection of the device may hold in its
	// send and receive buffers.
	tcpBufMax int64

	mu sync.Mutex
	// +checklocks:mu
	closed bool
	// +checklocks:mu
	sessions map[*session]struct{}
	refusing atomic.Int32 // refusals in progress (refuse)
	// +checklocks:mu
	perUID map[int]int // sessions of each uid
	// +checklocks:mu
	maps int // mappings made for clients (takeMap)
	// +checklocks:mu
	mapsUID map[int]int // ... for the clients of each uid
	maxMaps int
	// +checklocks:mu
	pending map[int]int // ... of which have not said HELLO yet
	// +checklocks:mu
	qpOwner map[uint32]*session
	// +checklocks:mu
	nextID uint64
	wg     sync.WaitGroup
}

// ListenSocket makes the service's socket at path with mode 0660, owned by
// group gid (-1 keeps the process's group). A socket file no service
// answers on (left by a crashed one) is replaced; a live one, or a path
// that is not a socket, is an error.
//
// The directory is made (mode 0755) if it is missing. An existing one
// must be a directory, not a symbolic link, owned by root or by this
// process's user, and writable by no one else unless it is sticky (as
// /tmp is): whoever may rename entries in it could put a link where the
// socket is about to be and have the service change another file. The
// socket gets its mode from the umask at bind time and its group from a
// call that does not follow a link, so nothing is changed through the path
// after the bind.
func ListenSocket(path string, gid int) (*net.UnixListener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := checkSocketDir(dir); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("service socket %s: the path exists and is not a socket", path)
		}
		c, err := net.DialTimeout("unixpacket", path, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("service socket %s is in use by another running service", path)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("service socket %s: cannot tell whether a service runs on it: %w", path, err)
		}
		os.Remove(path)
	}
	umaskMu.Lock()
	old := syscall.Umask(0o117) // the socket is made 0660
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	syscall.Umask(old)
	umaskMu.Unlock()
	if err != nil {
		return nil, err
	}
	if gid >= 0 {
		if err := unix.Fchownat(unix.AT_FDCWD, path, -1, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			ln.Close()
			return nil, fmt.Errorf("service socket %s: group %d: %w", path, gid, err)
		}
	}
	return ln, nil
}

// umaskMu serializes ListenSocket's change of the process's umask.
var umaskMu sync.Mutex

// SocketDirError says why a service socket's directory is not trusted.
type SocketDirError struct {
	Dir    string
	Reason string
}

func (e *SocketDirError) Error() string {
	return fmt.Sprintf("service socket directory %s is not trusted: %s; it must be a directory owned by root or uid %d that no one else may write to (or a sticky one, as /tmp)",
		e.Dir, e.Reason, os.Geteuid())
}

// checkSocketDir verifies, without following a symbolic link, that dir is
// a directory the socket can be made in safely (see ListenSocket).
func checkSocketDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("service socket directory: %w", err)
	}
	bad := func(format string, args ...any) error {
		return &SocketDirError{Dir: dir, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		return bad("it is a symbolic link")
	case !fi.IsDir():
		return bad("it is not a directory (%v)", fi.Mode().Type())
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return bad("its owner cannot be read")
	}
	if uid := os.Geteuid(); st.Uid != 0 && int(st.Uid) != uid {
		return bad("it is owned by uid %d", st.Uid)
	}
	if fi.Mode().Perm()&0o022 != 0 && fi.Mode()&os.ModeSticky == 0 {
		return bad("it has mode %#o: others may write to it", fi.Mode().Perm())
	}
	return nil
}

// Serve serves d on ln until Close. Events of clients' QPs go to those
// clients instead of d.Events().
func Serve(d *verbs.Device, ln *net.UnixListener, cfg Config) (*Server, error) {
	if d.Netstack() == nil {
		return nil, fmt.Errorf("%w: a device of a service cannot be served again", verbs.ErrInvalidArgument)
	}
	cfg.Limits = cfg.Limits.withDefaults()
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.PollSpin == 0 {
		cfg.PollSpin = 50 * time.Microsecond
	}
	if cfg.MaxClients <= 0 {
		cfg.MaxClients = 1024
	}
	if cfg.MaxClientsPerUser <= 0 {
		cfg.MaxClientsPerUser = 64
	}
	cfg.MaxClientsPerUser = min(cfg.MaxClientsPerUser, cfg.MaxClients)
	if cfg.MaxPendingPerUser <= 0 {
		cfg.MaxPendingPerUser = 16
	}
	cfg.MaxPendingPerUser = min(cfg.MaxPendingPerUser, cfg.MaxClientsPerUser)
	if cfg.HelloTimeout <= 0 {
		cfg.HelloTimeout = 2 * time.Second
	}
	s := &Server{dev: d, ln: ln, cfg: cfg, sessions: map[*session]struct{}{}, qpOwner: map[uint32]*session{},
		perUID: map[int]int{}, pending: map[int]int{}, mapsUID: map[int]int{}, maxMaps: maxMappings(),
		tcpBufMax: tcpBufMax(d)}
	s.hook = s.routeEvent
	if !engine.EventHook(d, &s.hook, true) {
		return nil, fmt.Errorf("%w: device is already served", verbs.ErrBusy)
	}
	// The descriptors the service keeps for its clients are three per
	// session (socket, doorbell, control page) and one per CQ (its
	// eventfd); a CQ's ring is a mapping, so the mappings' bound keeps
	// the CQs' descriptors within the open-file limit too.
	if n := nofile(); n > 0 {
		if fds := int(n) - 3*cfg.MaxClients - fdSlack; fds < s.maxMaps {
			s.maxMaps = max(fds, 0)
			cfg.Logf("service: the open-file limit (%d) leaves room for %d mappings (MRs, rings) beside %d clients' sessions (raise RLIMIT_NOFILE, or lower --max-clients, for more)",
				n, s.maxMaps, cfg.MaxClients)
		}
	}
	if cfg.MaxMappings > 0 && cfg.MaxMappings < s.maxMaps {
		s.maxMaps = cfg.MaxMappings
	}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// tcpBufMax is the most a TCP connection of d may hold in its send and
// receive buffers (the stack's maximums).
func tcpBufMax(d *verbs.Device) int64 {
	var snd tcpip.TCPSendBufferSizeRangeOption
	var rcv tcpip.TCPReceiveBufferSizeRangeOption
	st := d.Netstack().Stack()
	if st.TransportProtocolOption(tcp.ProtocolNumber, &snd) != nil || st.TransportProtocolOption(tcp.ProtocolNumber, &rcv) != nil {
		return 2 * netstack.DefaultBufMax
	}
	return int64(snd.Max) + int64(rcv.Max)
}

// The kernel allows a process vm.max_map_count mappings (65,530 by
// default), and the Go runtime maps its heap too: a process that cannot
// map more dies when its heap must grow. Each MR, ring and control page of
// a client is a mapping of the service's. So all clients together may
// hold at most half of the count (less where the open-file limit is
// lower: see Serve), and the clients of one uid a quarter of that: a
// request beyond fails with ErrLimit.
func maxMappings() int {
	n := 65530
	if b, err := os.ReadFile("/proc/sys/vm/max_map_count"); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && v > 0 {
			n = v
		}
	}
	return n / 2
}

// fdSlack is what the process keeps of its open-file limit for itself
// beside its clients: its TAP, captures, the control socket's
// connections, refusals in progress.
const fdSlack = 256

// nofile is the process's open-file limit (its soft limit, which Go
// raises to the hard limit at start); 0 when it cannot be read.
func nofile() uint64 {
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) != nil {
		return 0
	}
	return rl.Cur
}

// takeMap counts a mapping made for a client of uid.
func (s *Server) takeMap(uid int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.maps >= s.maxMaps {
		return fmt.Errorf("%w: the service holds %d mappings (MRs and rings) for its clients, its limit for all clients together", verbs.ErrLimit, s.maps)
	}
	if s.mapsUID[uid] >= s.maxMaps/4 {
		return fmt.Errorf("%w: the clients of uid %d hold %d mappings (MRs and rings), a quarter of the %d the service allows all clients", verbs.ErrLimit, uid, s.mapsUID[uid], s.maxMaps)
	}
	s.maps++
	s.mapsUID[uid]++
	return nil
}

// dropMap uncounts a mapping takeMap counted.
func (s *Server) dropMap(uid int) {
	s.mu.Lock()
	s.maps--
	if s.mapsUID[uid]--; s.mapsUID[uid] == 0 {
		delete(s.mapsUID, uid)
	}
	s.mu.Unlock()
}

// Clients returns the number of connected clients.
func (s *Server) Clients() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

// ClientStat is what one client of a service holds (rdmatap stat).
type ClientStat struct {
	ID  uint64 `json:"id"`
	UID int    `json:"uid"`
	PID int    `json:"pid"`
	// Memory is the service memory charged to the client (see
	// Limits.Memory), of MemoryLimit.
	Memory      int64 `json:"memory_bytes"`
	MemoryLimit int64 `json:"memory_limit"`
	RingBytes   int64 `json:"ring_bytes"` // of Memory: the shared memory of its rings
	MRBytes     int64 `json:"mr_bytes"`   // its registered memory
	PDs         int   `json:"pds"`
	CQs         int   `json:"cqs"`
	QPs         int   `json:"qps"`
	SRQs        int   `json:"srqs"`
	MRs         int   `json:"mrs"` // MRs, fast-register MRs and windows
	Conns       int   `json:"conns"`
	Calls       int   `json:"calls"` // calls in progress
}

// ClientStats returns what each connected client holds, by session ID.
func (s *Server) ClientStats() []ClientStat {
	s.mu.Lock()
	ss := make([]*session, 0, len(s.sessions))
	for x := range s.sessions {
		ss = append(ss, x)
	}
	s.mu.Unlock()
	out := make([]ClientStat, 0, len(ss))
	for _, x := range ss {
		x.mu.Lock()
		out = append(out, ClientStat{ID: x.id, UID: x.cred.UID, PID: x.cred.PID, Memory: x.memBytes, MemoryLimit: x.lim.Memory,
			RingBytes: x.ringBytes, MRBytes: x.mrBytes, PDs: len(x.pds), CQs: len(x.cqs), QPs: len(x.qps), SRQs: len(x.srqs),
			MRs: x.memObjects(), Conns: x.conns, Calls: len(x.inflight)})
		x.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b ClientStat) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// Close stops accepting, ends every session (as if each client had gone)
// and waits for them.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	ss := make([]*session, 0, len(s.sessions))
	for x := range s.sessions {
		ss = append(ss, x)
	}
	s.mu.Unlock()
	s.ln.Close()
	for _, x := range ss {
		x.conn.Close()
	}
	s.wg.Wait()
	engine.EventHook(s.dev, &s.hook, false)
	return nil
}

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return
			}
			s.cfg.Logf("service: accept: %v", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		cred, err := svc.PeerCred(c)
		if err != nil {
			s.cfg.Logf("service: refusing a client: SO_PEERCRED: %v", err)
			c.Close()
			continue
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		if why := s.admit(cred.UID); why != "" {
			s.mu.Unlock()
			s.refuse(c, cred, why)
			continue
		}
		s.nextID++
		x := newSession(s, c, s.nextID)
		x.cred = cred
		s.sessions[x] = struct{}{}
		s.perUID[cred.UID]++
		s.pending[cred.UID]++
		s.wg.Add(1)
		s.mu.Unlock()
		go x.run()
	}
}

// admit says why a new connection of uid cannot be served, "" if it can
// (s.mu held).
// +checklocks:s.mu
func (s *Server) admit(uid int) string {
	switch {
	case len(s.sessions) >= s.cfg.MaxClients:
		return fmt.Sprintf("the service serves %d clients already (its limit, up --max-clients)", len(s.sessions))
	case s.perUID[uid] >= s.cfg.MaxClientsPerUser:
		return fmt.Sprintf("uid %d has %d sessions already (the per-user limit, up --max-clients-per-user)", uid, s.perUID[uid])
	case s.pending[uid] >= s.cfg.MaxPendingPerUser:
		return fmt.Sprintf("uid %d has %d connections that have not said HELLO yet (the limit, up --max-pending-per-user)", uid, s.pending[uid])
	}
	return ""
}

// refuse tells a connection why it is not served, in the reply to its
// HELLO, and closes it. The HELLO is read first: a socket closed with an
// unread message resets its peer, which would then see ECONNRESET instead
// of the reason. At most maxRefusing refusals wait for their HELLO at once
// (each for refuseWait at most); beyond them a connection is closed at once.
func (s *Server) refuse(c *net.UnixConn, cred svc.Cred, why string) {
	s.cfg.Logf("service: refusing a client (uid %d pid %d): %s", cred.UID, cred.PID, why)
	if s.refusing.Add(1) > maxRefusing {
		s.refusing.Add(-1)
		c.Close()
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.refusing.Add(-1)
		defer c.Close()
		c.SetDeadline(time.Now().Add(refuseWait))
		var buf [svc.MaxMessage]byte
		if _, err := c.Read(buf[:]); err != nil {
			return
		}
		var b svc.Builder
		svc.Write(c, b.Reset(svc.THello, 0, svc.StatusLimit).String(why).Msg())
	}()
}

// maxRefusing and refuseWait bound the refusals in progress.
const (
	maxRefusing = 16
	refuseWait  = 500 * time.Millisecond
)

// helloDone ends a session's pending state (it said HELLO, or failed to).
func (s *Server) helloDone(uid int) {
	s.mu.Lock()
	if s.pending[uid]--; s.pending[uid] == 0 {
		delete(s.pending, uid)
	}
	s.mu.Unlock()
}

// routeEvent hands a QP's event to the client that owns the QP.
func (s *Server) routeEvent(e verbs.AsyncEvent) bool {
	s.mu.Lock()
	x := s.qpOwner[e.QPNum]
	s.mu.Unlock()
	if x == nil {
		return false
	}
	x.sendEvent(e)
	return true
}

// --- sessions ---

// session is one client's connection. Its goroutines: the reader (run:
// HELLO, then each request; the non-blocking ones it handles itself), a
// goroutine per blocking call (dispatch), the poller, the event writer,
// a watcher per QP (watchQP), and at the end teardown (the reader's, with
// a goroutine per QP it releases). From outside: the engine's goroutines
// push into its CQ rings (servedCQ.push) and raise its events
// (sendEvent), and Server.ClientStats reads its counts.
//
// Locks:
//   - wmu: one writer on the socket at a time (replies, events, QP
//     ends). A leaf, held only across svc.Write.
//   - mu guards the handle tables, the limits' counts and the charges
//     (the fields marked +checklocks:mu). A leaf: held for bookkeeping
//     only, never across a call into the device or the engine.
//   - pollMu: one pass over the rings at a time (pollOnce), by the poller
//     or the reader (dispatch). The pass holds it across the engine's
//     PostSend and PostRecv (QP.mu; QP.txMu, for a send the poster
//     transmits itself; RecvQueue.mu), the CQs' locks (failWR, and the
//     completions of those sends) and mu (resolve, stopPoller). It
//     guards the served QPs' send ring consumer state (sqCons, sqSnap,
//     and their scratch).
//   - servedQP.rqMu and servedSRQ.mu: a receive ring's consumer state
//     (its consumer index, scratch, and whether the ring is gone). The
//     pass takes them, and so does the engine's receive path when an
//     untagged message finds the queue empty (refillRQ, refillSRQ, with
//     the receiving QP's rxMu held): both take entries under the same
//     lock, so each entry is taken once. Inside them: the engine's
//     PostRecv (QP.mu, RecvQueue.mu), the CQs' locks (failWR), and mu
//     (stopPoller, when a ring's index is out of range).
//   - ringMu: a pass holds it for reading while it touches the rings and
//     pollQPs and pollSRQs; createQP, createSRQ, destroySRQ and releaseQP
//     hold it for writing while they add or remove a ring (releaseQP
//     also to clear servedQP.blocked, which the pass sets).
//
// Lock order: pollMu → ringMu → mu (createQP, createSRQ and destroySRQ
// take mu inside ringMu); ringMu → Server.mu (dropRing); ringMu → SRQ.mu
// → PD.mu (destroySRQ); pollMu → ringMu → the engine's QP and queue
// locks → servedCQ.mu; pollMu → ringMu → rqMu or servedSRQ.mu → QP.mu,
// RecvQueue.mu, servedCQ.mu and mu; QP.rxMu → rqMu or servedSRQ.mu (the
// engine's refill); servedCQ.mu → Server.mu and servedCQ.mu → mu (a
// served CQ's retire). Server.mu, mu and wmu are leaves. The fast path's ctl, ctlFd,
// sleeping and bell are set by hello before the poller starts and never
// change; blocked is an atomic; stop is closed once, under mu.
type session struct {
	srv  *Server
	dev  *verbs.Device
	conn *net.UnixConn
	id   uint64
	cred svc.Cred
	lim  Limits
	// features are those HELLO agreed on (svc.Features bits); set
	// before the session's first request.
	features uint64

	ctx    context.Context
	cancel context.CancelFunc

	wmu sync.Mutex // one writer at a time

	mu sync.Mutex
	// +checklocks:mu
	next uint64
	// +checklocks:mu
	pds map[uint64]*verbs.PD
	// +checklocks:mu
	cqs map[uint64]*servedCQ
	// +checklocks:mu
	mrs map[uint64]*servedMR
	// +checklocks:mu
	frmrs map[uint64]*servedFRMR
	// +checklocks:mu
	mws map[uint64]*verbs.MW
	// +checklocks:mu
	frPages int // pages the fast-register MRs may map, counted against Limits.FRPages
	// +checklocks:mu
	srqs map[uint64]*servedSRQ
	// +checklocks:mu
	qps map[uint32]*servedQP
	// +checklocks:mu
	lns map[uint64]servedListener
	// +checklocks:mu
	reqs map[uint64]*verbs.ConnRequest
	// +checklocks:mu
	inflight map[uint32]context.CancelFunc
	// +checklocks:mu
	mrBytes int64
	// +checklocks:mu
	mrPending int // registrations under way (counted against Limits.MRs)
	// +checklocks:mu
	ringBytes int64 // queue memory made for the client
	// +checklocks:mu
	memBytes int64 // service memory charged to the client (Limits.Memory)
	// +checklocks:mu
	conns int
	calls sync.WaitGroup

	// Fast path.
	ctl      []byte
	ctlFd    int
	sleeping *atomic.Uint32
	bell     *svc.Eventfd
	pollMu   sync.Mutex   // one pass over the rings at a time (pollOnce)
	ringMu   sync.RWMutex // a pass holds it for reading while it touches rings
	// +checklocks:ringMu
	pollQPs []*servedQP
	// +checklocks:ringMu
	pollSRQs []*servedSRQ
	stop     chan struct{}
	blocked  atomic.Int32 // ring entries waiting for room in a full queue
	pollWG   sync.WaitGroup

	events chan verbs.AsyncEvent
}

func newSession(s *Server, c *net.UnixConn, id uint64) *session {
	ctx, cancel := context.WithCancel(context.Background())
	return &session{srv: s, dev: s.dev, conn: c, id: id, lim: s.cfg.Limits, ctx: ctx, cancel: cancel,
		pds: map[uint64]*verbs.PD{}, cqs: map[uint64]*servedCQ{}, mrs: map[uint64]*servedMR{}, frmrs: map[uint64]*servedFRMR{},
		mws: map[uint64]*verbs.MW{}, srqs: map[uint64]*servedSRQ{},
		qps: map[uint32]*servedQP{}, lns: map[uint64]servedListener{}, reqs: map[uint64]*verbs.ConnRequest{},
		inflight: map[uint32]context.CancelFunc{}, ctlFd: -1, stop: make(chan struct{}),
		events: make(chan verbs.AsyncEvent, 256)}
}

func (x *session) logf(format string, args ...any) {
	x.srv.cfg.Logf("service: client %d (uid %d pid %d): "+format, append([]any{x.id, x.cred.UID, x.cred.PID}, args...)...)
}

// run is the session's reader (one per client).
func (x *session) run() {
	defer x.srv.wg.Done()
	defer x.teardown()
	buf, oob := make([]byte, svc.MaxMessage), make([]byte, svc.OOBSpace)
	var fdbuf [svc.MaxFDs]int
	ok := x.hello(buf, oob, fdbuf[:0])
	x.srv.helloDone(x.cred.UID)
	if !ok {
		return
	}
	x.logf("connected")
	x.pollWG.Add(1)
	go x.poller()
	x.calls.Add(1)
	go x.eventWriter()
	for {
		m, fds, err := svc.Read(x.conn, buf, oob, fdbuf[:0])
		if errors.Is(err, svc.ErrTruncated) || errors.Is(err, svc.ErrFDs) {
			// Too long, or too many descriptors (closed already): an
			// error for this message, and the session goes on.
			x.logf("malformed message: %v", err)
			x.reply(&svc.Builder{}, svc.TError, 0, nil, fmt.Errorf("%w: %v", verbs.ErrInvalidArgument, err))
			continue
		}
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				x.logf("socket: %v", err)
			}
			return
		}
		if err := m.Check(); err != nil {
			closeFDs(fds)
			x.logf("malformed message: %v", err)
			var seq uint32
			if len(m) >= svc.HeaderSize {
				seq = m.Seq()
			}
			x.reply(&svc.Builder{}, svc.TError, seq, nil, err)
			continue
		}
		x.dispatch(m, fds)
	}
}

// hello reads the client's HELLO, checks the version and answers with the
// control page and the doorbell.
func (x *session) hello(buf, oob []byte, fds []int) bool {
	x.conn.SetReadDeadline(time.Now().Add(x.srv.cfg.HelloTimeout))
	m, fds, err := svc.Read(x.conn, buf, oob, fds)
	x.conn.SetReadDeadline(time.Time{})
	if err != nil {
		x.logf("hello: %v", err)
		return false
	}
	closeFDs(fds)
	var b svc.Builder
	if err := m.Check(); err != nil || m.Type() != svc.THello || m.Arg(0) != svc.Magic {
		x.logf("hello: not an rdmatap client")
		svc.Write(x.conn, b.Reset(svc.THello, 0, svc.StatusVersion).String("not an rdmatap service HELLO").Msg())
		return false
	}
	if v := m.Arg(1); v != svc.Version {
		msg := fmt.Sprintf("protocol version mismatch: service speaks %d, client %d", svc.Version, v)
		x.logf("hello: %s", msg)
		svc.Write(x.conn, b.Reset(svc.THello, 0, svc.StatusVersion).Args(svc.Version).String(msg).Msg())
		return false
	}
	if err := x.srv.takeMap(x.cred.UID); err != nil {
		x.logf("hello: %v", err)
		st, text := errStatus(err)
		svc.Write(x.conn, b.Reset(svc.THello, 0, st).String(text).Msg())
		return false
	}
	fd, ctl, err := svc.NewMemfd("rdmatap-ctl", svc.CtlSize)
	if err != nil {
		x.srv.dropMap(x.cred.UID)
		x.logf("hello: control page: %v", err)
		return false
	}
	x.ctl, x.ctlFd, x.sleeping = ctl, fd, svc.U32(ctl, svc.CtlSleeping)
	x.mu.Lock()
	x.memBytes = memSession
	x.mu.Unlock()
	if x.bell, err = svc.NewEventfd(); err != nil {
		x.logf("hello: eventfd: %v", err)
		return false
	}
	var flags uint64
	if x.dev.Query().AtomicCap == verbs.AtomicNone { // DeviceConfig.NoExtensions
		flags |= 1
	}
	// The features both ends know (a client that lists none, as one
	// from before features, gets none).
	features := m.Arg(2) & svc.Features
	x.features = features
	var args [svc.HelloArgs]uint64
	args[svc.HelloVersion] = svc.Version
	args[svc.HelloFlags] = flags
	args[svc.HelloID] = x.id
	args[svc.HelloFeatures] = features
	err = svc.Write(x.conn, b.Reset(svc.THello, 0, 0).Args(args[:]...).String(x.dev.Name()).Msg(), x.ctlFd, x.bell.Fd())
	return err == nil
}

// reply sends a reply: err nil for success with b's arguments and
// payload (b already Reset by the caller unless err is set).
func (x *session) reply(b *svc.Builder, t svc.Type, seq uint32, fds []int, err error) {
	if err != nil {
		st, text := errStatus(err)
		b.Reset(t, seq, st)
		var rej *verbs.RejectedError
		var errno syscall.Errno
		switch {
		case errors.As(err, &rej):
			b.Args(bool64(rej.Markers)).Bytes(rej.PrivateData)
		case st == svc.StatusGeneral && errors.As(err, &errno):
			b.Reset(t, seq, svc.StatusErrno).Args(uint64(errno)).String(text)
		default:
			b.String(text)
		}
		fds = nil
	}
	x.wmu.Lock()
	werr := svc.Write(x.conn, b.Msg(), fds...)
	x.wmu.Unlock()
	if werr != nil && !errors.Is(werr, net.ErrClosed) {
		x.logf("reply %v: %v", t, werr)
	}
}

// errStatus maps an error to a reply status and text.
func errStatus(err error) (uint32, string) {
	text := err.Error()
	switch {
	case errors.Is(err, verbs.ErrRejected):
		return svc.StatusRejected, text
	case errors.Is(err, verbs.ErrLimit):
		return svc.StatusLimit, text
	case errors.Is(err, verbs.ErrQueueFull):
		return svc.StatusQueueFull, text
	case errors.Is(err, verbs.ErrTooManySGE):
		return svc.StatusTooManySGE, text
	case errors.Is(err, verbs.ErrMarkers):
		return svc.StatusMarkers, text
	case errors.Is(err, verbs.ErrNoMatchingRTR):
		return svc.StatusNoMatchingRTR, text
	case errors.Is(err, iwarp.ErrInvalidWR) && errors.Is(err, verbs.ErrInvalidArgument):
		return svc.StatusInvalidArgWR, text
	case errors.Is(err, iwarp.ErrInvalidWR):
		return svc.StatusInvalidWR, text
	case errors.Is(err, verbs.ErrInvalidArgument), errors.Is(err, verbs.ErrUnsupported), errors.Is(err, svc.ErrShort),
		errors.Is(err, svc.ErrLength), errors.Is(err, svc.ErrType), errors.Is(err, svc.ErrArgs), errors.Is(err, svc.ErrTooLarge),
		errors.Is(err, svc.ErrReserved):
		return svc.StatusInvalidArgument, text
	case errors.Is(err, verbs.ErrInvalidState), errors.Is(err, iwarp.ErrInvalidState):
		return svc.StatusInvalidState, text
	case errors.Is(err, verbs.ErrBusy):
		return svc.StatusBusy, text
	case errors.Is(err, os.ErrPermission):
		return svc.StatusPermission, text
	case errors.Is(err, net.ErrClosed):
		return svc.StatusClosed, text
	case errors.Is(err, context.Canceled):
		return svc.StatusCanceled, text
	case errors.Is(err, context.DeadlineExceeded):
		return svc.StatusTimeout, text
	}
	return svc.StatusGeneral, text
}

var errNoHandle = fmt.Errorf("%w: no such handle", verbs.ErrInvalidArgument)

// blocking reports whether a request may wait on the network or a peer.
func blocking(t svc.Type) bool {
	switch t {
	case svc.TDial, svc.TGetRequest, svc.TAccept, svc.TReject, svc.TDisconnect, svc.TDestroyQP, svc.TQPError:
		return true
	}
	return false
}

// dispatch runs one request; fds are the descriptors that came with it
// (dispatch owns them).
func (x *session) dispatch(m svc.Msg, fds []int) {
	t, seq := m.Type(), m.Seq()
	if t == svc.TCancel {
		closeFDs(fds)
		x.mu.Lock()
		if c := x.inflight[uint32(m.Arg(0))]; c != nil {
			c()
		}
		x.mu.Unlock()
		return
	}
	if t == svc.TEvent || t == svc.TQPDone || t == svc.THello || t == svc.TError {
		closeFDs(fds)
		x.reply(&svc.Builder{}, svc.TError, seq, nil, fmt.Errorf("%w: %v is not a request", verbs.ErrInvalidArgument, t))
		return
	}
	if t != svc.TRegMR && len(fds) > 0 {
		closeFDs(fds)
		x.reply(&svc.Builder{}, t, seq, nil, fmt.Errorf("%w: unexpected descriptors", verbs.ErrInvalidArgument))
		return
	}
	// What the client posted before this call is the engine's before the
	// call acts: a receive before Dial or Accept (the peer may send at
	// once), sends before Disconnect (they go out before the FIN) and
	// before DESTROY_QP (they complete flushed), as on an embedded device.
	x.pollOnce()
	if !blocking(t) {
		var b svc.Builder
		out, err := x.handle(x.ctx, &b, m, fds)
		x.reply(&b, t, seq, out, err)
		closeFDs(out)
		return
	}
	// The message buffer is reused by the reader: keep a copy.
	mc := append(svc.Msg(nil), m...)
	ctx, cancel := context.WithCancel(x.ctx)
	x.mu.Lock()
	if err := x.chargeLocked(memCall, "a call in progress"); err != nil {
		x.mu.Unlock()
		cancel()
		x.reply(&svc.Builder{}, t, seq, nil, err)
		return
	}
	x.inflight[seq] = cancel
	x.calls.Add(1)
	x.mu.Unlock()
	go func() {
		defer x.calls.Done()
		defer x.uncharge(memCall)
		var b svc.Builder
		out, err := x.handle(ctx, &b, mc, nil)
		x.mu.Lock()
		delete(x.inflight, seq)
		x.mu.Unlock()
		cancel()
		x.reply(&b, t, seq, out, err)
		closeFDs(out)
	}()
}

// handle runs a request and fills b with the reply; it returns
// descriptors to send (closed after sending) or an error.
func (x *session) handle(ctx context.Context, b *svc.Builder, m svc.Msg, fds []int) (out []int, err error) {
	t := m.Type()
	defer func() {
		if r := recover(); r != nil {
			// A bug reached by a hostile message must cost only this
			// request, never the service.
			err = fmt.Errorf("%w: internal error handling %v: %v", verbs.ErrInvalidArgument, t, r)
			x.logf("panic in %v: %v", t, r)
		}
	}()
	b.Reset(t, m.Seq(), 0)
	switch t {
	case svc.TAllocPD:
		return nil, x.allocPD(b)
	case svc.TDeallocPD:
		return nil, x.deallocPD(m.Arg(0))
	case svc.TCreateCQ:
		return x.createCQ(b, m.Arg(0))
	case svc.TDestroyCQ:
		return nil, x.destroyCQ(m.Arg(0))
	case svc.TRegMR:
		return nil, x.regMR(b, m, fds)
	case svc.TDeregMR:
		return nil, x.deregMR(m.Arg(0))
	case svc.TCreateSRQ:
		return x.createSRQ(b, m)
	case svc.TDestroySRQ:
		return nil, x.destroySRQ(m.Arg(0))
	case svc.TSRQLimit:
		return nil, x.srqLimit(m.Arg(0), m.Arg(1))
	case svc.TCreateQP:
		return x.createQP(b, m)
	case svc.TDestroyQP:
		return nil, x.destroyQP(uint32(m.Arg(0)))
	case svc.TQueryQP:
		q, err := x.qp(m.Arg(0))
		if err != nil {
			return nil, err
		}
		b.Args(uint64(q.qp.State()))
		return nil, nil
	case svc.TDisconnect:
		q, err := x.qp(m.Arg(0))
		if err != nil {
			return nil, err
		}
		return nil, q.qp.Disconnect(ctx)
	case svc.TQPError:
		q, err := x.qp(m.Arg(0))
		if err != nil {
			return nil, err
		}
		return nil, q.qp.SetError()
	case svc.TDial:
		return nil, x.dial(ctx, b, m)
	case svc.TListen:
		return nil, x.listen(b, m)
	case svc.TCloseListener:
		return nil, x.closeListener(m.Arg(0))
	case svc.TGetRequest:
		return nil, x.getRequest(ctx, b, m.Arg(0))
	case svc.TAccept:
		return nil, x.accept(ctx, b, m)
	case svc.TReject:
		return nil, x.reject(m)
	case svc.TAllocMR:
		return nil, x.allocMR(b, m)
	case svc.TMapMR:
		return nil, x.mapMR(b, m)
	case svc.TSetIOVA:
		f, err := x.frmr(m.Arg(0))
		if err != nil {
			return nil, err
		}
		return nil, f.mr.SetIOVA(m.Arg(1))
	case svc.TAllocMW:
		return nil, x.allocMW(b, m)
	case svc.TDeallocMW:
		return nil, x.deallocMW(m.Arg(0))
	case svc.TBindMW:
		return nil, x.bindMW(b, m)
	case svc.TQueryMem:
		return nil, x.queryMem(b, m.Arg(0))
	case svc.TQueryDevice:
		a := x.queryDevice()
		b.Args(encodeAttr(a)...).String(x.dev.Name())
		return nil, nil
	case svc.TQueryPort:
		if m.Arg(0) != 1 {
			return nil, fmt.Errorf("%w: port %d (the device has port 1)", verbs.ErrInvalidArgument, m.Arg(0))
		}
		encodePort(b, x.dev.Link())
		return nil, nil
	case svc.TStats:
		st := x.dev.Stats()
		pay, err := binary.Append(nil, binary.LittleEndian, &st)
		if err != nil {
			return nil, err
		}
		b.Bytes(pay)
		return nil, nil
	}
	closeFDs(fds)
	return nil, fmt.Errorf("%w: unknown request %v", verbs.ErrInvalidArgument, t)
}

// queryDevice is the device's limits as the client may use them: the
// device's, lowered to the client's own limits.
func (x *session) queryDevice() verbs.DeviceAttr {
	a := x.dev.Query()
	l := x.lim
	a.MaxQP = min(a.MaxQP, l.QPs)
	a.MaxQPWR = min(a.MaxQPWR, l.MaxWR)
	a.MaxCQ = min(a.MaxCQ, l.CQs)
	a.MaxCQE = min(a.MaxCQE, 4*l.MaxWR) // createCQ's bound
	a.MaxMR = min(a.MaxMR, l.MRs)
	a.MaxMRSize = min(a.MaxMRSize, uint64(l.MRBytes))
	a.MaxPD = min(a.MaxPD, l.PDs)
	a.MaxSRQ = min(a.MaxSRQ, l.SRQs)
	a.MaxSRQWR = min(a.MaxSRQWR, l.MaxWR)
	a.MaxMW = min(a.MaxMW, l.MRs)
	a.MaxFRPages = min(a.MaxFRPages, l.FRPages)
	return a
}

// ringMemfd makes a ring memfd of n bytes, counted against
// Limits.RingBytes and Limits.Memory until dropRing.
func (x *session) ringMemfd(name string, n int) (int, []byte, error) {
	x.mu.Lock()
	if x.ringBytes+int64(n) > x.lim.RingBytes {
		err := fmt.Errorf("%w: %d bytes of queue memory, limit %d", verbs.ErrLimit, x.ringBytes, x.lim.RingBytes)
		x.mu.Unlock()
		return -1, nil, err
	}
	if err := x.chargeLocked(int64(n), "a ring"); err != nil {
		x.mu.Unlock()
		return -1, nil, err
	}
	x.ringBytes += int64(n)
	x.mu.Unlock()
	if err := x.srv.takeMap(x.cred.UID); err != nil {
		x.mu.Lock()
		x.ringBytes -= int64(n)
		x.memBytes -= int64(n)
		x.mu.Unlock()
		return -1, nil, err
	}
	fd, mem, err := svc.NewMemfd(name, n)
	if err != nil {
		x.dropRing(mem, n)
	}
	return fd, mem, err
}

// dropRing unmaps a ring's memory and uncounts it.
func (x *session) dropRing(mem []byte, n int) {
	if mem != nil {
		svc.Unmap(mem)
	}
	x.srv.dropMap(x.cred.UID)
	x.mu.Lock()
	x.ringBytes -= int64(n)
	x.memBytes -= int64(n)
	x.mu.Unlock()
}

// What a client's objects cost the service beside their rings and queues,
// charged against Limits.Memory: each is the object with what the service
// keeps for it, rounded up; a goroutine counts its smallest stack, 8 KiB.
const (
	// The reader's buffers, the control page, the event queue and the
	// reader's, poller's and event writer's goroutines.
	memSession = 2*svc.MaxMessage + svc.CtlSize + 256*int64(unsafe.Sizeof(verbs.AsyncEvent{})) + 3*8<<10 + 4<<10
	memSmall   = 1 << 10 // a PD, CQ, MR or window: its structures and table entries
	// A QP beside its queues: the served QP, and the QP's transmitter,
	// receiver and watcher goroutines.
	memQP = memSmall + 3*8<<10
	// A call that waits (dial, accept, get request, ...): its goroutine
	// and its copy of the request.
	memCall = 8<<10 + svc.MaxMessage
	// A connection request (pending in a listener's backlog or held by
	// the client): its TCP endpoint before data flows, its MPA request
	// and private data.
	memRequest  = 16 << 10
	memListener = memSmall
)

// chargeLocked charges n bytes of service memory to the client (x.mu
// held), or fails with ErrLimit naming the limit.
// +checklocks:x.mu
func (x *session) chargeLocked(n int64, what string) error {
	if x.memBytes+n > x.lim.Memory {
		return fmt.Errorf("%w: %s needs %d bytes of service memory; the client holds %d of its %d (Limits.Memory, up --client-memory)",
			verbs.ErrLimit, what, n, x.memBytes, x.lim.Memory)
	}
	x.memBytes += n
	return nil
}

// charge is chargeLocked taking x.mu.
func (x *session) charge(n int64, what string) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.chargeLocked(n, what)
}

// uncharge gives back what charge took.
func (x *session) uncharge(n int64) {
	x.mu.Lock()
	x.memBytes -= n
	x.mu.Unlock()
}

// connMemory is what a connection may hold in TCP buffers: the device's
// send and receive buffer maximums, and its endpoint.
func (s *Server) connMemory() int64 {
	return s.tcpBufMax + memRequest
}

// +checklocks:x.mu
func (x *session) handle64() uint64 {
	x.next++
	return x.next
}

// --- PD, MR ---

func (x *session) allocPD(b *svc.Builder) error {
	x.mu.Lock()
	n := len(x.pds)
	x.mu.Unlock()
	if n >= x.lim.PDs {
		return fmt.Errorf("%w: %d PDs", verbs.ErrLimit, n)
	}
	if err := x.charge(memSmall, "a PD"); err != nil {
		return err
	}
	pd, err := x.dev.AllocPD()
	if err != nil {
		x.uncharge(memSmall)
		return err
	}
	x.mu.Lock()
	x.pds[uint64(pd.ID())] = pd
	x.mu.Unlock()
	b.Args(uint64(pd.ID()))
	return nil
}

func (x *session) pd(h uint64) (*verbs.PD, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if pd := x.pds[h]; pd != nil {
		return pd, nil
	}
	return nil, errNoHandle
}

func (x *session) deallocPD(h uint64) error {
	pd, err := x.pd(h)
	if err != nil {
		return err
	}
	if err := pd.Close(); err != nil {
		return err
	}
	x.mu.Lock()
	delete(x.pds, h)
	x.memBytes -= memSmall
	x.mu.Unlock()
	return nil
}

// servedMR is a client's registration: the service's mapping of the
// client's memfd pages, registered at the client's addresses.
type servedMR struct {
	mr      *verbs.MR
	mapping []byte
	n       int64
	va      uint64 // the client's address of the first byte
	// Under session.mu: the fast-register MRs that mapped pages of it
	// (they may place into them until they are freed), and whether it
	// has been deregistered; the pages are unmapped when both are done.
	refs int
	gone bool
}

func (x *session) regMR(b *svc.Builder, m svc.Msg, fds []int) error {
	defer closeFDs(fds)
	if len(fds) != 1 {
		return fmt.Errorf("%w: REG_MR needs one memory file descriptor, got %d", verbs.ErrInvalidArgument, len(fds))
	}
	pd, err := x.pd(m.Arg(0))
	if err != nil {
		return err
	}
	va, n, acc, off, iova := m.Arg(1), m.Arg(2), verbs.Access(m.Arg(3)), m.Arg(4), m.Arg(5)
	if n == 0 || n > 1<<40 || off > 1<<50 || va+n < va {
		return fmt.Errorf("%w: region of %d bytes at offset %d", verbs.ErrInvalidArgument, n, off)
	}
	if iova+n < iova {
		return fmt.Errorf("%w: IOVA %#x + %d bytes wraps", verbs.ErrInvalidArgument, iova, n)
	}
	if va%4096 != off%4096 {
		// The client maps the file from a page boundary, so its address
		// and the file offset agree within the page; a claim that they do
		// not would misalign the Tagged Offsets against the service's
		// mapping (atomics need 8-byte aligned words).
		return fmt.Errorf("%w: address %#x does not sit at file offset %d within its page", verbs.ErrInvalidArgument, va, off)
	}
	x.mu.Lock()
	if x.mrBytes+int64(n) > x.lim.MRBytes {
		err := fmt.Errorf("%w: %d MR bytes registered, limit %d", verbs.ErrLimit, x.mrBytes, x.lim.MRBytes)
		x.mu.Unlock()
		return err
	}
	if x.memObjects()+x.mrPending >= x.lim.MRs {
		err := fmt.Errorf("%w: %d MRs", verbs.ErrLimit, x.memObjects())
		x.mu.Unlock()
		return err
	}
	if err := x.chargeLocked(memSmall, "an MR"); err != nil {
		x.mu.Unlock()
		return err
	}
	x.mrPending++
	defer func() {
		x.mu.Lock()
		x.mrPending--
		x.mu.Unlock()
	}()
	x.mrBytes += int64(n)
	x.mu.Unlock()
	if err := x.srv.takeMap(x.cred.UID); err != nil {
		x.mu.Lock()
		x.mrBytes -= int64(n)
		x.memBytes -= memSmall
		x.mu.Unlock()
		return err
	}
	mapping, part, err := svc.MapFile(fds[0], int64(off), int(n), true)
	if err == nil {
		var mr *verbs.MR
		if mr, err = regMRChecked(pd, part, iova, acc); err == nil {
			x.mu.Lock()
			h := x.handle64()
			x.mrs[h] = &servedMR{mr: mr, mapping: mapping, n: int64(n), va: va}
			x.mu.Unlock()
			b.Args(h, uint64(mr.RKey()))
			return nil
		}
		svc.Unmap(mapping)
	} else {
		err = fmt.Errorf("%w: %v", verbs.ErrInvalidArgument, err)
	}
	x.srv.dropMap(x.cred.UID)
	x.mu.Lock()
	x.mrBytes -= int64(n)
	x.memBytes -= memSmall
	x.mu.Unlock()
	return err
}

// regMRChecked registers a client's pages at its addresses, base on.
func regMRChecked(pd *verbs.PD, buf []byte, base uint64, acc verbs.Access) (*verbs.MR, error) {
	if acc&^(verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead|verbs.AccessRemoteAtomic|verbs.AccessZeroBased|verbs.AccessMWBind) != 0 {
		return nil, fmt.Errorf("%w: access flags %#x not supported", verbs.ErrInvalidArgument, uint32(acc))
	}
	if acc&(verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic) != 0 && acc&verbs.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("%w: remote write and atomic require local write", verbs.ErrInvalidArgument)
	}
	return pd.RegMRIOVA(buf, base, acc)
}

// memObjects counts the STags the client holds (session.mu held).
// +checklocks:x.mu
func (x *session) memObjects() int { return len(x.mrs) + len(x.frmrs) + len(x.mws) }

func (x *session) deregMR(h uint64) error {
	x.mu.Lock()
	r := x.mrs[h]
	delete(x.mrs, h)
	f := x.frmrs[h]
	delete(x.frmrs, h)
	x.mu.Unlock()
	switch {
	case f != nil:
		if err := x.releaseFRMR(f); err != nil {
			x.mu.Lock()
			x.frmrs[h] = f
			x.mu.Unlock()
			return err
		}
		return nil
	case r != nil:
		if err := x.releaseMR(r); err != nil {
			x.mu.Lock()
			x.mrs[h] = r
			x.mu.Unlock()
			return err
		}
		return nil
	}
	return errNoHandle
}

// releaseMR invalidates the STag, waits out placements in progress, and
// only then unmaps the client's pages, unless a fast-register MR still
// maps some of them (then the last one freed unmaps them). It fails,
// doing nothing, while windows are bound to the MR.
func (x *session) releaseMR(r *servedMR) error {
	if err := r.mr.Dereg(); err != nil {
		return err
	}
	x.mu.Lock()
	r.gone = true
	unmap := r.refs == 0
	x.mu.Unlock()
	if unmap {
		x.unmapMR(r)
	}
	return nil
}

func (x *session) unmapMR(r *servedMR) {
	svc.Unmap(r.mapping)
	x.srv.dropMap(x.cred.UID)
	x.mu.Lock()
	x.mrBytes -= r.n
	x.memBytes -= memSmall
	x.mu.Unlock()
}

// --- fast-register MRs and memory windows ---

// servedFRMR is a client's fast-register MR. Its page lists name only
// the client's registered memory (the service's mappings of it), and it
// holds every regular MR whose pages it ever mapped until it is freed:
// a registration of those pages may outlive the next MapPages, and the
// pages must stay mapped while a peer may place into them.
type servedFRMR struct {
	mr   *verbs.MR
	used map[*servedMR]struct{}
	// A MAP_MR in several messages: the entries so far.
	pend []byte
}

func (x *session) frmr(h uint64) (*servedFRMR, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if f := x.frmrs[h]; f != nil {
		return f, nil
	}
	return nil, errNoHandle
}

// frmrMemory is a fast-register MR's charge: the MR with its page list at
// its longest, and a MAP_MR's entries gathered over several messages.
func frmrMemory(maxPages int) int64 {
	return memSmall + iwarp.FastRegFootprint(maxPages) + int64(maxPages)*svc.MapEntrySize
}

func (x *session) allocMR(b *svc.Builder, m svc.Msg) error {
	pd, err := x.pd(m.Arg(0))
	if err != nil {
		return err
	}
	maxPages := m.Arg(1)
	if maxPages == 0 || maxPages > iwarp.MaxFastRegPages {
		return fmt.Errorf("%w: fast-register MR of %d pages", verbs.ErrInvalidArgument, maxPages)
	}
	x.mu.Lock()
	if x.memObjects()+x.mrPending >= x.lim.MRs {
		err := fmt.Errorf("%w: %d MRs", verbs.ErrLimit, x.memObjects())
		x.mu.Unlock()
		return err
	}
	if x.frPages+int(maxPages) > x.lim.FRPages {
		err := fmt.Errorf("%w: fast-register MRs of %d pages, limit %d", verbs.ErrLimit, x.frPages, x.lim.FRPages)
		x.mu.Unlock()
		return err
	}
	cost := frmrMemory(int(maxPages))
	if err := x.chargeLocked(cost, "a fast-register MR"); err != nil {
		x.mu.Unlock()
		return err
	}
	x.frPages += int(maxPages)
	x.mu.Unlock()
	mr, err := pd.AllocMR(int(maxPages))
	if err != nil {
		x.mu.Lock()
		x.frPages -= int(maxPages)
		x.memBytes -= cost
		x.mu.Unlock()
		return err
	}
	x.mu.Lock()
	h := x.handle64()
	x.frmrs[h] = &servedFRMR{mr: mr, used: map[*servedMR]struct{}{}}
	x.mu.Unlock()
	b.Args(h, uint64(mr.RKey()))
	return nil
}

// releaseFRMR frees a fast-register MR (its STag invalidated and fenced)
// and lets go of the client's MRs it mapped.
func (x *session) releaseFRMR(f *servedFRMR) error {
	if err := f.mr.Dereg(); err != nil {
		return err
	}
	var unmap []*servedMR
	x.mu.Lock()
	x.frPages -= engine.FastRegMR(f.mr).MaxPages()
	x.memBytes -= frmrMemory(engine.FastRegMR(f.mr).MaxPages())
	for r := range f.used {
		r.refs--
		if r.refs == 0 && r.gone {
			unmap = append(unmap, r)
		}
	}
	f.used = nil
	x.mu.Unlock()
	for _, r := range unmap {
		x.unmapMR(r)
	}
	return nil
}

// clientMR finds the client's registered MR whose pages hold the client
// addresses [va, va+n); session.mu held.
// +checklocks:x.mu
func (x *session) clientMR(va, n uint64) *servedMR {
	for _, r := range x.mrs {
		if va >= r.va && va-r.va <= uint64(len(r.mr.Bytes())) && n <= uint64(len(r.mr.Bytes()))-(va-r.va) {
			return r
		}
	}
	return nil
}

// mapMR is MAP_MR: MapPages or MapSG of a fast-register MR, over the
// client's registered memory only. Page addresses are the client's: each
// run of pages must lie inside one of its MRs, and the service maps the
// same pages of its own mapping of that MR; SGEs name the client's MRs by
// STag, as embedded.
func (x *session) mapMR(b *svc.Builder, m svc.Msg) error {
	f, err := x.frmr(m.Arg(0))
	if err != nil {
		return err
	}
	mode, pageSize, offset, length := m.Arg(1), m.Arg(2), m.Arg(3), m.Arg(4)
	var fl [1][]byte
	if n, err := svc.Fields(m.Payload(), fl[:]); err != nil || n != 1 || len(fl[0])%svc.MapEntrySize != 0 {
		return fmt.Errorf("%w: MAP_MR entries", verbs.ErrInvalidArgument)
	}
	maxEntries := max(engine.FastRegMR(f.mr).MaxPages(), svc.MapEntries)
	if mode&svc.MapFirst != 0 {
		f.pend = f.pend[:0]
	}
	if (len(f.pend)+len(fl[0]))/svc.MapEntrySize > maxEntries {
		f.pend = nil
		return fmt.Errorf("%w: MAP_MR of more than %d entries", verbs.ErrInvalidArgument, maxEntries)
	}
	f.pend = append(f.pend, fl[0]...)
	if mode&svc.MapLast == 0 {
		return nil
	}
	ents := f.pend
	f.pend = nil
	if pageSize > iwarp.MaxPageSize || offset > iwarp.MaxPageSize || length > 1<<50 {
		return fmt.Errorf("%w: %v", verbs.ErrInvalidArgument, fmt.Errorf("%w: page size %d", iwarp.ErrInvalidWR, pageSize))
	}
	ps := int(pageSize)
	used := map[*servedMR]struct{}{}
	var iova uint64
	x.mu.Lock()
	switch mode & 0xff {
	case svc.MapPages:
		if pageSize < iwarp.MinPageSize || pageSize&(pageSize-1) != 0 {
			x.mu.Unlock()
			return fmt.Errorf("%w: %v", verbs.ErrInvalidArgument, fmt.Errorf("%w: page size %d", iwarp.ErrInvalidWR, pageSize))
		}
		var pages [][]byte
		for i := 0; i+svc.MapEntrySize <= len(ents); i += svc.MapEntrySize {
			va, np := binary.LittleEndian.Uint64(ents[i:]), uint64(binary.LittleEndian.Uint32(ents[i+8:]))
			if np == 0 || uint64(len(pages))+np > uint64(engine.FastRegMR(f.mr).MaxPages()) {
				x.mu.Unlock()
				return fmt.Errorf("%w: %v", verbs.ErrInvalidArgument, fmt.Errorf("%w: %d pages, the MR maps 1 to %d",
					iwarp.ErrInvalidWR, uint64(len(pages))+np, engine.FastRegMR(f.mr).MaxPages()))
			}
			r := x.clientMR(va, np*pageSize)
			if r == nil {
				x.mu.Unlock()
				return fmt.Errorf("%w: pages [%#x, +%d) are not in memory the client registered", verbs.ErrInvalidArgument, va, np*pageSize)
			}
			if len(pages) == 0 {
				iova = va + offset
			}
			used[r] = struct{}{}
			run := r.mr.Bytes()[va-r.va:]
			for k := 0; k < int(np); k++ {
				pages = append(pages, run[k*ps:(k+1)*ps])
			}
		}
		x.mu.Unlock()
		if err := f.mr.MapPages(pages, ps, int(offset), int(length)); err != nil {
			return err
		}
	case svc.MapSG:
		sgl := make([]verbs.SGE, 0, len(ents)/svc.MapEntrySize)
		for i := 0; i+svc.MapEntrySize <= len(ents); i += svc.MapEntrySize {
			s := verbs.SGE{Addr: binary.LittleEndian.Uint64(ents[i:]), Length: binary.LittleEndian.Uint32(ents[i+8:]),
				LKey: binary.LittleEndian.Uint32(ents[i+12:])}
			var r *servedMR
			for _, c := range x.mrs {
				if c.mr.LKey() == s.LKey && c.mr.PD() == f.mr.PD() {
					r = c
					break
				}
			}
			if r == nil {
				x.mu.Unlock()
				return fmt.Errorf("%w: %v", verbs.ErrInvalidArgument, fmt.Errorf("%w: SGE %d: lkey %#x is no MR of the protection domain",
					iwarp.ErrInvalidWR, len(sgl), s.LKey))
			}
			if len(sgl) == 0 {
				iova = r.va + (s.Addr - r.mr.Addr())
			}
			used[r] = struct{}{}
			sgl = append(sgl, s)
		}
		x.mu.Unlock()
		if err := f.mr.MapSG(sgl, ps); err != nil {
			return err
		}
		length = 0
		for _, s := range sgl {
			length += uint64(s.Length)
		}
	default:
		x.mu.Unlock()
		return fmt.Errorf("%w: MAP_MR mode %#x", verbs.ErrInvalidArgument, mode)
	}
	// The IOVA of the client's first byte, as embedded (the service's
	// mapping lies elsewhere).
	if err := f.mr.SetIOVA(iova); err != nil {
		return err
	}
	x.mu.Lock()
	for r := range used {
		if _, ok := f.used[r]; !ok && f.used != nil {
			f.used[r] = struct{}{}
			r.refs++
		}
	}
	x.mu.Unlock()
	b.Args(iova, length)
	return nil
}

func (x *session) allocMW(b *svc.Builder, m svc.Msg) error {
	pd, err := x.pd(m.Arg(0))
	if err != nil {
		return err
	}
	x.mu.Lock()
	if x.memObjects()+x.mrPending >= x.lim.MRs {
		err := fmt.Errorf("%w: %d MRs", verbs.ErrLimit, x.memObjects())
		x.mu.Unlock()
		return err
	}
	x.mu.Unlock()
	if t := m.Arg(1); t != uint64(verbs.MWType1) && t != uint64(verbs.MWType2) {
		return fmt.Errorf("%w: window type %d", verbs.ErrInvalidArgument, t)
	}
	if err := x.charge(memSmall, "a memory window"); err != nil {
		return err
	}
	mw, err := pd.AllocMW(verbs.MWType(m.Arg(1)))
	if err != nil {
		x.uncharge(memSmall)
		return err
	}
	x.mu.Lock()
	h := x.handle64()
	x.mws[h] = mw
	x.mu.Unlock()
	b.Args(h, uint64(mw.RKey()))
	return nil
}

func (x *session) deallocMW(h uint64) error {
	x.mu.Lock()
	mw := x.mws[h]
	delete(x.mws, h)
	x.mu.Unlock()
	if mw == nil {
		return errNoHandle
	}
	x.uncharge(memSmall)
	return mw.Dealloc()
}

// bindMW is QP.BindMW of a type 1 window: args QP, window, WR ID, flags,
// the MR's STag, address, length, access. The engine checks the MR (it
// must be of the window's PD, which only this client's MRs are).
func (x *session) bindMW(b *svc.Builder, m svc.Msg) error {
	q, err := x.qp(m.Arg(0))
	if err != nil {
		return err
	}
	x.mu.Lock()
	mw := x.mws[m.Arg(1)]
	x.mu.Unlock()
	if mw == nil {
		return errNoHandle
	}
	if m.Arg(3) > 0xff || m.Arg(4) > 1<<32-1 || m.Arg(7) > 1<<32-1 {
		return fmt.Errorf("%w: BIND_MW arguments", verbs.ErrInvalidArgument)
	}
	stag, err := q.iw.BindMW1(m.Arg(2), iwarp.SendFlags(m.Arg(3)), engine.Window(mw),
		iwarp.MWBind{MR: uint32(m.Arg(4)), Addr: m.Arg(5), Length: m.Arg(6), Access: iwarp.Access(m.Arg(7))})
	if err != nil {
		return err
	}
	b.Args(uint64(stag))
	return nil
}

// queryMem reports a fast-register MR's or window's current (or last)
// registration: STag, valid, base, length.
func (x *session) queryMem(b *svc.Builder, h uint64) error {
	x.mu.Lock()
	f, mw := x.frmrs[h], x.mws[h]
	x.mu.Unlock()
	var r *iwarp.Region
	switch {
	case f != nil:
		r = engine.FastRegMR(f.mr).Current()
	case mw != nil:
		r = engine.Window(mw).Current()
	default:
		return errNoHandle
	}
	b.Args(uint64(r.STag()), bool64(r.Valid()), r.Base, r.Len())
	return nil
}

// --- CQ ---

// servedCQ is the service's side of a client's CQ ring: the engine's
// QPs complete into cq, whose completions Push writes into the ring.
//
// mu serialises the producers (the engines' transmitters and receivers,
// and failWR) and retire: it guards prod and dead. retire takes the
// session's and the Server's locks under it (dropRing, uncharge).
type servedCQ struct {
	x    *session
	h    uint64
	cq   *verbs.CQ
	mem  []byte
	ring *svc.Ring
	mu   sync.Mutex
	// +checklocks:mu
	prod uint32
	ev   *svc.Eventfd
	// +checklocks:mu
	dead bool // the ring is gone
	refs int  // QPs using it, under session.mu
}

func (x *session) createCQ(b *svc.Builder, cqe uint64) ([]int, error) {
	if cqe == 0 || cqe > uint64(x.lim.MaxWR)*4 {
		return nil, fmt.Errorf("%w: CQ of %d entries (limit %d)", verbs.ErrInvalidArgument, cqe, x.lim.MaxWR*4)
	}
	x.mu.Lock()
	if len(x.cqs) >= x.lim.CQs {
		err := fmt.Errorf("%w: %d CQs", verbs.ErrLimit, len(x.cqs))
		x.mu.Unlock()
		return nil, err
	}
	x.mu.Unlock()
	if err := x.charge(memSmall, "a CQ"); err != nil {
		return nil, err
	}
	capacity := svc.RingCap(int(cqe))
	fd, mem, err := x.ringMemfd("rdmatap-cq", svc.RingBytes(capacity, svc.CQEntrySize))
	if err != nil {
		x.uncharge(memSmall)
		return nil, err
	}
	ring, _ := svc.InitRing(mem, capacity, svc.CQEntrySize)
	ev, err := svc.NewEventfd()
	if err != nil {
		x.dropRing(mem, len(mem))
		x.uncharge(memSmall)
		closeFd(fd)
		return nil, err
	}
	evDup, err := svc.Dup(ev.Fd())
	if err != nil {
		ev.Close()
		x.dropRing(mem, len(mem))
		x.uncharge(memSmall)
		closeFd(fd)
		return nil, err
	}
	s := &servedCQ{x: x, mem: mem, ring: ring, ev: ev}
	s.cq = engine.SinkCQ(x.dev, s)
	x.mu.Lock()
	s.h = x.handle64()
	x.cqs[s.h] = s
	x.mu.Unlock()
	b.Args(s.h)
	// dispatch closes both after sending: the service keeps its mapping
	// and its own eventfd.
	return []int{fd, evDup}, nil
}

// Push implements iwarp.CQ: the engine completes into the ring.
func (s *servedCQ) Push(c iwarp.Completion) bool { return s.push(&c) }

// push writes a completion into the client's ring. It never blocks; a
// full ring (or one whose consumer index the client corrupted) is an
// overflow, as a full CQ is.
func (s *servedCQ) push(c *iwarp.Completion) bool {
	s.mu.Lock()
	if s.dead {
		s.mu.Unlock()
		return true
	}
	free, err := s.ring.Free(s.prod)
	if err != nil || free == 0 {
		s.ring.Overflow.Store(1)
		s.mu.Unlock()
		return false
	}
	svc.PutCompletion(s.ring.Entry(s.prod), c)
	s.prod++
	s.ring.Prod.Store(s.prod)
	signal := false
	switch s.ring.Arm.Load() {
	case svc.ArmAny:
		signal = s.ring.Arm.CompareAndSwap(svc.ArmAny, svc.ArmNone)
	case svc.ArmSolicited:
		if c.Flags&iwarp.CompSolicited != 0 || c.Status != iwarp.StatusSuccess {
			signal = s.ring.Arm.CompareAndSwap(svc.ArmSolicited, svc.ArmNone)
		}
	}
	if signal {
		s.ring.Events.Add(1)
	}
	if signal || s.ring.Waiting.Load() != 0 {
		s.ev.Signal()
	}
	s.mu.Unlock()
	// A send queue freed room: the poller may have entries waiting for it.
	if s.x.blocked.Load() != 0 {
		s.x.kick()
	}
	return true
}

// retire takes the ring away from Push and frees it.
func (s *servedCQ) retire() {
	s.mu.Lock()
	s.dead = true
	s.x.dropRing(s.mem, len(s.mem))
	s.x.uncharge(memSmall)
	s.ev.Close()
	s.mu.Unlock()
	s.cq.Close()
}

func (x *session) destroyCQ(h uint64) error {
	s, err := takeUnused(&x.mu, x.cqs, h, func(s *servedCQ) int { return s.refs }, "CQ") // +checklocksignore: the map is made once; takeUnused reads it under x.mu
	if err != nil {
		return err
	}
	s.retire()
	return nil
}

// takeUnused removes handle h from m (under mu) and returns what it
// named: errNoHandle for an unknown handle, ErrBusy while refs reports QPs
// that still use it.
func takeUnused[T any](mu *sync.Mutex, m map[uint64]*T, h uint64, refs func(*T) int, what string) (*T, error) {
	mu.Lock()
	defer mu.Unlock()
	s := m[h]
	if s == nil {
		return nil, errNoHandle
	}
	if n := refs(s); n > 0 {
		return nil, fmt.Errorf("%w: %d QPs use the %s", verbs.ErrBusy, n, what)
	}
	delete(m, h)
	return s, nil
}

// --- SRQ ---

// servedSRQ is a client's SRQ and the service's side of its ring. cons,
// sgl and gone are under mu (see session); refs is under session.mu; the
// rest never changes.
type servedSRQ struct {
	h    uint64
	srq  *verbs.SRQ
	rq   *iwarp.RecvQueue // srq's, the engine's
	mem  []byte
	ring *svc.Ring
	mu   sync.Mutex
	// +checklocks:mu
	cons uint32
	// +checklocks:mu
	sgl []iwarp.SGE
	// +checklocks:mu
	gone   bool // the ring is unmapped
	refs   int
	maxSGE int
	cost   int64 // charged beside the ring
}

func (x *session) createSRQ(b *svc.Builder, m svc.Msg) ([]int, error) {
	pd, err := x.pd(m.Arg(0))
	if err != nil {
		return nil, err
	}
	maxWR, maxSGE := m.Arg(1), m.Arg(2)
	x.mu.Lock()
	n := len(x.srqs)
	x.mu.Unlock()
	if n >= x.lim.SRQs {
		return nil, fmt.Errorf("%w: %d SRQs", verbs.ErrLimit, n)
	}
	if maxWR == 0 || maxWR > uint64(x.lim.MaxWR) || maxSGE == 0 || maxSGE > 64 {
		return nil, fmt.Errorf("%w: SRQ of %d WRs, %d SGEs", verbs.ErrInvalidArgument, maxWR, maxSGE)
	}
	cost := memSmall + iwarp.RecvQueueFootprint(int(maxWR), int(maxSGE)) + int64(maxSGE)*int64(unsafe.Sizeof(iwarp.SGE{}))
	if err := x.charge(cost, "an SRQ"); err != nil {
		return nil, err
	}
	srq, err := pd.CreateSRQ(int(maxWR), int(maxSGE))
	if err != nil {
		x.uncharge(cost)
		return nil, err
	}
	capacity := svc.RingCap(int(maxWR))
	esize := svc.RecvEntrySize(int(maxSGE))
	fd, mem, err := x.ringMemfd("rdmatap-srq", svc.RingBytes(capacity, esize))
	if err != nil {
		srq.Close()
		x.uncharge(cost)
		return nil, err
	}
	ring, _ := svc.InitRing(mem, capacity, esize)
	s := &servedSRQ{srq: srq, rq: engine.RecvQueue(srq), mem: mem, ring: ring, sgl: make([]iwarp.SGE, maxSGE), maxSGE: int(maxSGE), cost: cost} // +checklocksignore: not shared yet
	s.rq.SetRefill(func() { x.refillSRQ(s) })
	x.ringMu.Lock()
	x.mu.Lock()
	s.h = x.handle64()
	x.srqs[s.h] = s
	x.mu.Unlock()
	x.pollSRQs = append(x.pollSRQs, s)
	x.ringMu.Unlock()
	b.Args(s.h)
	// The ring's descriptor is sent and then closed by dispatch; the
	// service keeps its mapping.
	return []int{fd}, nil
}

func (x *session) destroySRQ(h uint64) error {
	x.ringMu.Lock()
	defer x.ringMu.Unlock()
	s, err := takeUnused(&x.mu, x.srqs, h, func(s *servedSRQ) int { return s.refs }, "SRQ") // +checklocksignore: the map is made once; takeUnused reads it under x.mu
	if err != nil {
		return err
	}
	for i, p := range x.pollSRQs {
		if p == s {
			x.pollSRQs = append(x.pollSRQs[:i], x.pollSRQs[i+1:]...)
			break
		}
	}
	s.rq.SetRefill(nil)
	s.mu.Lock()
	s.gone = true
	s.mu.Unlock()
	x.dropRing(s.mem, len(s.mem))
	x.uncharge(s.cost)
	// No QP of the client uses it (takeUnused), so no QP of the device's.
	return s.srq.Close()
}

func (x *session) srqLimit(h, limit uint64) error {
	x.mu.Lock()
	s := x.srqs[h]
	x.mu.Unlock()
	if s == nil {
		return errNoHandle
	}
	if limit > uint64(s.rq.Cap()) {
		return fmt.Errorf("%w: SRQ limit %d", verbs.ErrInvalidArgument, limit)
	}
	s.rq.SetLimit(int(limit), func() { x.sendEvent(verbs.AsyncEvent{Type: verbs.EventSRQLimitReached, SRQ: s.srq}) })
	return nil
}

// --- QP ---

// servedQP is a client's QP and the service's side of its rings.
//
// The send ring consumer's state (sqCons, sqSnap, wrs, sgl) is the
// pass's, under session.pollMu; blocked too, except that releaseQP
// clears it holding session.ringMu for writing (no pass runs then). The
// receive ring's (rqCons, rsgl, rqGone) is under rqMu (see session).
// conn and cost are under session.mu. The rest never changes.
type servedQP struct {
	qp     *verbs.QP
	iw     *iwarp.QP // qp's, the engine's
	num    uint32
	mem    []byte
	sq     *svc.Ring
	rq     *svc.Ring
	sqCons uint32
	sqSnap uint32 // SQ entries pollOnce saw before it took the receives
	rqMu   sync.Mutex
	// +checklocks:rqMu
	rqCons uint32
	// +checklocks:rqMu
	rsgl []iwarp.SGE
	// +checklocks:rqMu
	rqGone   bool // the receive ring is unmapped
	wrs      [1]iwarp.SendWR
	sgl      []iwarp.SGE
	scq, rcq *servedCQ
	srq      *servedSRQ
	blocked  bool  // an SQ or RQ entry waits for room (poller only)
	conn     bool  // counted against Limits.Conns
	cost     int64 // charged beside the rings, the connection's included
}

func (x *session) createQP(b *svc.Builder, m svc.Msg) ([]int, error) {
	pd, err := x.pd(m.Arg(0))
	if err != nil {
		return nil, err
	}
	x.mu.Lock()
	scq, rcq := x.cqs[m.Arg(1)], x.cqs[m.Arg(2)]
	var srq *servedSRQ
	if h := m.Arg(3); h != 0 {
		srq = x.srqs[h]
		if srq == nil {
			x.mu.Unlock()
			return nil, errNoHandle
		}
	}
	n := len(x.qps)
	x.mu.Unlock()
	if scq == nil || rcq == nil {
		return nil, errNoHandle
	}
	if n >= x.lim.QPs {
		return nil, fmt.Errorf("%w: %d QPs", verbs.ErrLimit, n)
	}
	cfg := verbs.QPConfig{SendCQ: scq.cq, RecvCQ: rcq.cq, MaxSendWR: int(min(m.Arg(4), 1<<31)), MaxRecvWR: int(min(m.Arg(5), 1<<31)),
		MaxSendSGE: int(min(m.Arg(6), 1<<31)), MaxRecvSGE: int(min(m.Arg(7), 1<<31)), MaxInline: int(min(m.Arg(8), 1<<31)),
		SignalAll: m.Arg(9)&1 != 0}
	if srq != nil {
		cfg.SRQ = srq.srq
	}
	if cfg.MaxSendWR <= 0 || cfg.MaxSendWR > x.lim.MaxWR || cfg.MaxRecvWR <= 0 || cfg.MaxRecvWR > x.lim.MaxWR ||
		cfg.MaxSendSGE <= 0 || cfg.MaxSendSGE > 64 || cfg.MaxRecvSGE <= 0 || cfg.MaxRecvSGE > 64 {
		return nil, fmt.Errorf("%w: QP of %d/%d WRs, %d/%d SGEs (limit %d WRs, 64 SGEs)", verbs.ErrInvalidArgument,
			cfg.MaxSendWR, cfg.MaxRecvWR, cfg.MaxSendSGE, cfg.MaxRecvSGE, x.lim.MaxWR)
	}
	if cfg.MaxInline < 0 || cfg.MaxInline > maxInline {
		return nil, fmt.Errorf("%w: %d bytes inline (limit %d)", verbs.ErrInvalidArgument, cfg.MaxInline, maxInline)
	}
	cost := qpMemory(cfg)
	if err := x.charge(cost, "a QP"); err != nil {
		return nil, err
	}
	qp, err := pd.CreateQP(cfg)
	if err != nil {
		x.uncharge(cost)
		return nil, err
	}
	sqCap, rqCap := svc.RingCap(cfg.MaxSendWR), svc.RingCap(cfg.MaxRecvWR)
	sqEntry := svc.SendEntrySize(cfg.MaxSendSGE)
	if x.features&svc.FeatureInlineData != 0 {
		sqEntry = svc.SendEntrySizeInline(cfg.MaxSendSGE, cfg.MaxInline)
	}
	sqBytes := svc.RingBytes(sqCap, sqEntry)
	total := sqBytes
	if srq == nil {
		total += svc.RingBytes(rqCap, svc.RecvEntrySize(cfg.MaxRecvSGE))
	}
	fd, mem, err := x.ringMemfd("rdmatap-qp", total)
	if err != nil {
		qp.Close()
		x.uncharge(cost)
		return nil, err
	}
	q := &servedQP{qp: qp, iw: engine.EngineQP(qp), num: qp.Num(), mem: mem, sgl: make([]iwarp.SGE, cfg.MaxSendSGE), rsgl: make([]iwarp.SGE, cfg.MaxRecvSGE),
		scq: scq, rcq: rcq, srq: srq, cost: cost}
	q.sq, _ = svc.InitRing(mem[:sqBytes], sqCap, sqEntry)
	if srq == nil {
		q.rq, _ = svc.InitRing(mem[sqBytes:], rqCap, svc.RecvEntrySize(cfg.MaxRecvSGE))
		q.iw.RecvQueue().SetRefill(func() { x.refillRQ(q) })
	}
	x.ringMu.Lock()
	x.mu.Lock()
	x.qps[q.num] = q
	scq.refs++
	rcq.refs++
	if srq != nil {
		srq.refs++
	}
	x.mu.Unlock()
	x.pollQPs = append(x.pollQPs, q)
	x.ringMu.Unlock()
	x.srv.mu.Lock()
	x.srv.qpOwner[q.num] = x
	x.srv.mu.Unlock()
	x.calls.Add(1)
	go x.watchQP(q)
	b.Args(uint64(q.num), uint64(sqBytes))
	return []int{fd}, nil
}

// maxInline is the most inline data a send WR of a client's QP carries
// (the engine's limit).
const maxInline = 4096

// qpMemory is a QP's charge beside its rings: the QP, its queues at their
// full depth with their SGE lists and inline buffers (the receive queue
// unless it uses an SRQ), and the served QP's SGE lists.
func qpMemory(cfg verbs.QPConfig) int64 {
	sge := int64(unsafe.Sizeof(iwarp.SGE{}))
	n := memQP + iwarp.QPFootprint() + iwarp.SendQueueFootprint(cfg.MaxSendWR, cfg.MaxSendSGE, cfg.MaxInline) +
		int64(cfg.MaxSendSGE+cfg.MaxRecvSGE)*sge
	if cfg.SRQ == nil {
		n += iwarp.RecvQueueFootprint(cfg.MaxRecvWR, cfg.MaxRecvSGE)
	}
	return n
}

// watchQP tells the client when its QP has ended (one goroutine per QP).
func (x *session) watchQP(q *servedQP) {
	defer x.calls.Done()
	select {
	case <-q.qp.Done():
	case <-x.ctx.Done():
		return
	}
	var b svc.Builder
	b.Reset(svc.TQPDone, 0, 0).Args(uint64(q.num))
	if err := q.qp.Err(); err != nil {
		b.String(err.Error())
	}
	x.wmu.Lock()
	svc.Write(x.conn, b.Msg())
	x.wmu.Unlock()
}

func (x *session) qp(h uint64) (*servedQP, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if h > 1<<32-1 {
		return nil, errNoHandle
	}
	if q := x.qps[uint32(h)]; q != nil {
		return q, nil
	}
	return nil, errNoHandle
}

func (x *session) destroyQP(num uint32) error {
	x.mu.Lock()
	q := x.qps[num]
	x.mu.Unlock()
	if q == nil {
		return errNoHandle
	}
	x.releaseQP(q, false)
	return nil
}

// releaseQP closes the QP, waits until it has flushed (no completion can
// follow), and frees its rings. With fatal (the client is gone) a
// connected QP goes down as on an RNIC's local catastrophic error: the
// peer gets a Terminate before the close rather than a reset.
func (x *session) releaseQP(q *servedQP, fatal bool) {
	x.mu.Lock()
	if x.qps[q.num] != q {
		x.mu.Unlock()
		return
	}
	delete(x.qps, q.num)
	if q.conn {
		x.conns--
	}
	x.mu.Unlock()
	defer x.uncharge(q.cost) // once the QP has flushed, below
	if fatal {
		engine.Fatal(q.qp)
	} else {
		q.qp.Close()
	}
	select {
	case <-q.qp.Done():
	case <-time.After(5 * time.Second):
		x.logf("QP %d did not flush in 5 s", q.num)
	}
	x.ringMu.Lock()
	for i, p := range x.pollQPs {
		if p == q {
			x.pollQPs = append(x.pollQPs[:i], x.pollQPs[i+1:]...)
			break
		}
	}
	if q.blocked {
		q.blocked = false
		x.blocked.Add(-1)
	}
	if q.rq != nil {
		q.iw.RecvQueue().SetRefill(nil)
		q.rqMu.Lock()
		q.rqGone = true
		q.rqMu.Unlock()
	}
	x.dropRing(q.mem, len(q.mem))
	x.ringMu.Unlock()
	x.mu.Lock()
	q.scq.refs--
	q.rcq.refs--
	if q.srq != nil {
		q.srq.refs--
	}
	x.mu.Unlock()
	x.srv.mu.Lock()
	delete(x.srv.qpOwner, q.num)
	x.srv.mu.Unlock()
}

// --- the fast path: the poller ---

// kick wakes the poller if it sleeps: the service rings the client's
// doorbell itself.
func (x *session) kick() {
	if x.sleeping.Load() != 0 {
		x.bell.Signal()
	}
}

// threadWait is how long a sleeping poller waits for its doorbell in a
// system call before it waits through the Go poller.
const threadWait = time.Millisecond

// blockedNap bounds the poller's sleep while entries wait for room in a
// full queue (an unsignaled WR frees its slot without a completion to
// wake the poller).
const blockedNap = 200 * time.Microsecond

// poller drains the client's rings into its QPs and SRQs (one per
// client). It polls while there is work and for up to PollSpin after
// (adaptive, see woke), then
// sleeps on the doorbell eventfd, which the client rings only while the
// control page says the poller sleeps.
func (x *session) poller() {
	defer x.pollWG.Done()
	// The poller reads the client's memory (inline data) and rings. The
	// memfd checks (svc.MapFile) leave no page of a mapping past its
	// file's end, so no touch can fault; should one all the same, it
	// panics here instead of killing the process, and the recover below
	// ends this client's session.
	debug.SetPanicOnFault(true)
	defer func() {
		if r := recover(); r != nil {
			// Whatever a client's rings held must cost that client its
			// session, never the service.
			x.logf("poller: %v: ending the session", r)
			x.conn.Close()
		}
	}()
	maxSpin := x.srv.cfg.PollSpin
	spin := maxSpin
	idleSince := time.Now()
	// woke ends an idle period: the spin adapts to the gaps between the
	// client's work requests. A gap the full spin would have covered
	// (a ping-pong, a client posting as completions come) keeps it; a
	// longer one (large transfers, each WR hundreds of µs apart) halves
	// it, down to a sixteenth: spinning through such gaps only takes the
	// CPU from the goroutines that move the data, and the doorbell the
	// client rings then costs little beside the transfer.
	woke := func() {
		if time.Since(idleSince) <= maxSpin {
			spin = maxSpin
		} else {
			spin = max(spin/2, maxSpin/16)
		}
		idleSince = time.Time{}
	}
	for {
		select {
		case <-x.stop:
			return
		default:
		}
		if x.pollOnce() {
			if !idleSince.IsZero() {
				woke()
			}
			continue
		}
		if idleSince.IsZero() {
			idleSince = time.Now()
		}
		if time.Since(idleSince) < spin {
			runtime.Gosched()
			continue
		}
		x.sleeping.Store(1)
		if x.pollOnce() {
			x.sleeping.Store(0)
			woke()
			continue
		}
		// A short wait in a system call first: the doorbell of a client
		// that posts again soon wakes the poller at once, whatever the
		// Go poller's delays (svc.Eventfd.WaitThread); then the Go
		// poller, which holds no thread however long the client idles.
		nap := threadWait
		if x.blocked.Load() != 0 {
			nap = min(nap, blockedNap)
		}
		// Not while streaming (the spin shrunk to its floor: long gaps
		// again and again, many WRs in flight): a thread in ppoll holds
		// a P until the runtime takes it back, which costs the transfer
		// more than the slower wake-up does.
		streaming := spin <= maxSpin/16 && x.blocked.Load() == 0
		if !streaming {
			if rang, err := x.bell.WaitThread(nap); err == nil && rang {
				x.sleeping.Store(0)
				woke()
				continue
			}
		}
		if x.blocked.Load() != 0 {
			// The nap is over: look at the entries waiting for room
			// (the idle period goes on: they are not new work).
			x.sleeping.Store(0)
			continue
		}
		x.bell.SetDeadline(time.Time{})
		err := x.bell.Wait()
		x.sleeping.Store(0)
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return // closed: the session ends
		}
		if err == nil {
			woke()
		}
	}
}

// pollOnce makes one pass over every ring and reports whether it took an
// entry. A client whose producer index is out of range loses its session.
//
// Receives go first. The client may post a receive and then a Send whose
// answer lands in it; the engine must have the receive before the Send
// goes out, as it would on an embedded device where PostRecv returns only
// once the receive is queued. So the pass notes how far each SQ reaches,
// then takes everything from the RQs and SRQs (whatever was published
// before those SQ entries is visible now: the indexes are sequentially
// consistent), and only then posts the SQ entries it noted.
func (x *session) pollOnce() bool {
	x.pollMu.Lock()
	defer x.pollMu.Unlock()
	did, bad := x.passRings()
	if bad != nil {
		x.ringFailed(bad)
	}
	return did
}

// passRings is one pass of pollOnce; a panic in it (a bug a client's
// ring contents reached) comes back as an error for that client.
//
// +checklocksignore: checklocks loses the read lock in the recovering defer.
func (x *session) passRings() (did bool, bad error) {
	x.ringMu.RLock()
	defer x.ringMu.RUnlock()
	defer func() {
		if r := recover(); r != nil {
			bad = fmt.Errorf("internal error: %v", r)
		}
	}()
	for _, q := range x.pollQPs {
		n, err := q.sq.Pending(q.sqCons)
		if err != nil {
			return did, err
		}
		q.sqSnap = n
	}
	for _, q := range x.pollQPs {
		if q.rq == nil {
			continue
		}
		d, full, err := x.drainRQ(q)
		did = did || d
		if full {
			x.setBlocked(q, true)
		}
		if err != nil {
			return did, err
		}
	}
	for _, s := range x.pollSRQs {
		d, err := x.drainSRQ(s)
		did = did || d
		if err != nil {
			return did, err
		}
	}
	for _, q := range x.pollQPs {
		did = x.drainSQ(q) || did
	}
	return did, nil
}

func (x *session) setBlocked(q *servedQP, b bool) {
	if q.blocked != b {
		q.blocked = b
		if b {
			x.blocked.Add(1)
		} else {
			x.blocked.Add(-1)
		}
	}
}

// drainSQ posts the send ring entries pollOnce noted.
func (x *session) drainSQ(q *servedQP) bool {
	n := q.sqSnap
	if n == 0 {
		return false
	}
	did := false
	for ; n > 0; n-- {
		wr := &q.wrs[0]
		obj, err := svc.GetSend(q.sq.Entry(q.sqCons), wr, q.sgl)
		if err == nil && (wr.Op == iwarp.WRRegMR || wr.Op == iwarp.WRBindMW) {
			err = x.resolve(wr, obj)
		}
		if err != nil {
			// A malformed entry completes in error, as the operation it
			// names where it names one; the client's other work goes on.
			e := q.sq.Entry(q.sqCons)
			cop := iwarp.CompSend
			if op, ok := svc.EntryOp(e); ok {
				cop = sendCompOp(op)
			}
			x.failWR(q.scq, q.num, iwarp.Completion{ID: svc.EntryID(e), Status: iwarp.StatusLocalQPOp, Op: cop})
		} else if _, err := q.iw.PostSend(q.wrs[:]...); err != nil {
			if errors.Is(err, iwarp.ErrQueueFull) {
				x.setBlocked(q, true)
				break
			}
			st := iwarp.StatusLocalQPOp
			if errors.Is(err, iwarp.ErrInvalidState) {
				st = iwarp.StatusWRFlush
			}
			x.failWR(q.scq, q.num, iwarp.Completion{ID: wr.ID, Status: st, Op: sendCompOp(wr.Op)})
		}
		q.sqCons++
		q.sq.Cons.Store(q.sqCons)
		did = true
	}
	if n == 0 {
		x.setBlocked(q, false)
	}
	return did
}

// drainRQ posts the QP's new receive ring entries; full: one waits for
// room in the engine's queue.
func (x *session) drainRQ(q *servedQP) (did, full bool, err error) {
	q.rqMu.Lock()
	defer q.rqMu.Unlock()
	if q.rqGone {
		return false, false, nil
	}
	n, err := q.rq.Pending(q.rqCons)
	if err != nil || n == 0 {
		return false, false, err
	}
	for ; n > 0; n-- {
		id, sgl, err := svc.GetRecv(q.rq.Entry(q.rqCons), q.rsgl)
		if err != nil {
			x.failWR(q.rcq, q.num, iwarp.Completion{ID: id, Status: iwarp.StatusLocalQPOp, Op: iwarp.CompRecv})
		} else if err := q.iw.PostRecv(id, sgl); err != nil {
			if errors.Is(err, iwarp.ErrQueueFull) {
				return did, true, nil
			}
			x.failWR(q.rcq, q.num, iwarp.Completion{ID: id, Status: iwarp.StatusWRFlush, Op: iwarp.CompRecv})
		}
		q.rqCons++
		q.rq.Cons.Store(q.rqCons)
		did = true
	}
	return did, false, nil
}

// drainSRQ posts an SRQ's new ring entries; a full SRQ leaves them there.
func (x *session) drainSRQ(s *servedSRQ) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return false, nil
	}
	n, err := s.ring.Pending(s.cons)
	if err != nil || n == 0 {
		return false, err
	}
	did := false
	for ; n > 0; n-- {
		id, sgl, err := svc.GetRecv(s.ring.Entry(s.cons), s.sgl)
		if err == nil {
			if err = s.rq.Post(id, sgl); errors.Is(err, iwarp.ErrQueueFull) {
				break
			}
		}
		if err != nil {
			// No QP is the entry's yet, so no CQ: the client hears of
			// the dropped receive through an SRQ_ERR event.
			x.sendEvent(verbs.AsyncEvent{Type: verbs.EventSRQErr, SRQ: s.srq,
				Err: fmt.Errorf("receive %#x dropped: %w", id, err)})
		}
		s.cons++
		s.ring.Cons.Store(s.cons)
		did = true
	}
	return did, nil
}

// refillRQ is the engine's refill of a served QP's receive queue
// (iwarp.RecvQueue.SetRefill): a Send found it empty, so the receives
// the client has published in its ring but the poller has not taken yet
// are taken now, as the poller would, before the engine declares no
// buffer available. It runs on the engine's receive path.
func (x *session) refillRQ(q *servedQP) {
	defer x.refillDone(debug.SetPanicOnFault(true))
	if _, _, err := x.drainRQ(q); err != nil {
		x.ringFailed(err)
	}
}

// refillSRQ is refillRQ for an SRQ.
func (x *session) refillSRQ(s *servedSRQ) {
	defer x.refillDone(debug.SetPanicOnFault(true))
	if _, err := x.drainSRQ(s); err != nil {
		x.ringFailed(err)
	}
}

// refillDone ends a refill: a panic in it (a fault reading the client's
// ring, or a bug its contents reached) ends the client's session, not the
// service.
func (x *session) refillDone(fault bool) {
	debug.SetPanicOnFault(fault)
	if r := recover(); r != nil {
		x.ringFailed(fmt.Errorf("internal error: %v", r))
	}
}

// ringFailed ends the session of a client whose ring is corrupt.
func (x *session) ringFailed(err error) {
	x.logf("ring: %v: ending the session", err)
	x.conn.Close()
	x.stopPoller()
}

// resolve gives a REG_MR or BIND_MW from a ring the MR or window its
// handle names (of this client only).
func (x *session) resolve(wr *iwarp.SendWR, obj uint64) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	switch wr.Op {
	case iwarp.WRRegMR:
		if f := x.frmrs[obj]; f != nil {
			wr.MR = engine.FastRegMR(f.mr)
			return nil
		}
	case iwarp.WRBindMW:
		if mw := x.mws[obj]; mw != nil {
			wr.MW = engine.Window(mw)
			return nil
		}
	}
	return errNoHandle
}

func (x *session) failWR(cq *servedCQ, num uint32, c iwarp.Completion) {
	c.QPNum = num
	cq.push(&c)
}

// sendCompOp is the completion operation of a send WR.
func sendCompOp(op iwarp.WROp) iwarp.CompletionOp {
	switch op {
	case iwarp.WRWrite, iwarp.WRWriteImm:
		return iwarp.CompWrite
	case iwarp.WRRead, iwarp.WRReadInv:
		return iwarp.CompRead
	case iwarp.WRRegMR:
		return iwarp.CompRegMR
	case iwarp.WRBindMW:
		return iwarp.CompBindMW
	case iwarp.WRLocalInv:
		return iwarp.CompLocalInv
	case iwarp.WRAtomicCmpSwap:
		return iwarp.CompCmpSwap
	case iwarp.WRAtomicFetchAdd:
		return iwarp.CompFetchAdd
	}
	return iwarp.CompSend
}

func (x *session) stopPoller() {
	x.mu.Lock()
	select {
	case <-x.stop:
	default:
		close(x.stop)
	}
	x.mu.Unlock()
}

// --- events ---

// sendEvent queues an event for the client; a client that does not read
// loses events (as a full Events channel does), never stalls the device.
func (x *session) sendEvent(e verbs.AsyncEvent) {
	select {
	case x.events <- e:
	default:
	}
}

// disconnectReason is EVENT's argument 6: why a DISCONNECTED event's
// connection ended (0 for other events).
func disconnectReason(e verbs.AsyncEvent) uint64 {
	switch {
	case e.Type != verbs.EventDisconnected:
		return 0
	case e.Err != nil:
		return svc.DisconnectError
	case e.ByPeer:
		return svc.DisconnectPeer
	}
	return svc.DisconnectLocal
}

// eventWriter writes queued events to the client (one per client).
func (x *session) eventWriter() {
	defer x.calls.Done()
	var b svc.Builder
	for {
		select {
		case e := <-x.events:
			var srqH uint64
			if e.SRQ != nil {
				x.mu.Lock()
				for h, s := range x.srqs {
					if s.srq == e.SRQ {
						srqH = h
					}
				}
				x.mu.Unlock()
			}
			var args [svc.EventArgs]uint64
			args[svc.EventArgType] = uint64(e.Type)
			args[svc.EventArgQPN] = uint64(e.QPNum)
			args[svc.EventArgSRQ] = srqH
			args[svc.EventArgTermLayer] = uint64(e.Term.Layer)
			args[svc.EventArgTermType] = uint64(e.Term.EType)
			args[svc.EventArgTermCode] = uint64(e.Term.Code)
			n := svc.EventArgReason // a client without FeatureCM gets the arguments before it
			if x.features&svc.FeatureCM != 0 {
				args[svc.EventArgReason] = disconnectReason(e)
				n = svc.EventArgs
			}
			b.Reset(svc.TEvent, 0, 0).Args(args[:n]...)
			if e.Err != nil {
				b.String(e.Err.Error())
			}
			x.wmu.Lock()
			svc.Write(x.conn, b.Msg())
			x.wmu.Unlock()
		case <-x.ctx.Done():
			return
		}
	}
}

// --- connections ---

func connParamsFrom(m svc.Msg, at int, pdata []byte) verbs.ConnParams {
	return verbs.ConnParams{PrivateData: pdata, IRD: int(int64(m.Arg(at))), ORD: int(int64(m.Arg(at + 1))),
		CRC: svc.Untri(m.Arg(at + 2)), MPARevision: uint8(m.Arg(at + 3)), PeerToPeer: svc.Untri(m.Arg(at + 4)),
		RTR: verbs.RTR(m.Arg(at + 5)), Markers: svc.Untri(m.Arg(at + 6))}
}

func bool64(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func connReply(b *svc.Builder, c *verbs.Conn) {
	n := c.Negotiated()
	var a [svc.NegArgs]uint64
	a[svc.NegMPARevision] = uint64(n.MPARevision)
	a[svc.NegCRC] = bool64(n.CRC)
	a[svc.NegIRD] = uint64(n.IRD)
	a[svc.NegORD] = uint64(n.ORD)
	a[svc.NegPeerToPeer] = bool64(n.PeerToPeer)
	a[svc.NegRTR] = uint64(n.RTR)
	a[svc.NegMarkersTx] = bool64(n.MarkersTx)
	a[svc.NegMarkersRx] = bool64(n.MarkersRx)
	b.Args(a[:]...)
	// The fields in ConnField order.
	b.String(c.LocalAddr().String()).String(c.RemoteAddr().String()).Bytes(c.PeerPrivateData())
}

// takeConn counts a connection or listener against Limits.Conns and
// charges its memory.
func (x *session) takeConn(cost int64, what string) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.conns >= x.lim.Conns {
		return fmt.Errorf("%w: %d connections", verbs.ErrLimit, x.conns)
	}
	if err := x.chargeLocked(cost, what); err != nil {
		return err
	}
	x.conns++
	return nil
}

func (x *session) dropConn(cost int64) {
	x.mu.Lock()
	x.conns--
	x.memBytes -= cost
	x.mu.Unlock()
}

// listenerMemory is a listener's charge: itself and a full backlog of
// pending connection requests.
func listenerMemory(backlog int) int64 { return memListener + int64(backlog)*memRequest }

func (x *session) dial(ctx context.Context, b *svc.Builder, m svc.Msg) error {
	q, err := x.qp(m.Arg(0))
	if err != nil {
		return err
	}
	var f [3][]byte
	n, err := svc.Fields(m.Payload(), f[:])
	if err != nil || n < 2 {
		return fmt.Errorf("%w: DIAL needs an address and private data", verbs.ErrInvalidArgument)
	}
	raddr, err := netip.ParseAddrPort(string(f[0]))
	if err != nil {
		return fmt.Errorf("%w: %v", verbs.ErrInvalidArgument, err)
	}
	p := connParamsFrom(m, 1, f[1])
	if n == 3 {
		// The local address to connect from (rdma_bind_addr).
		if p.LocalAddr, err = svc.ParseLocalAddr(string(f[2])); err != nil {
			return fmt.Errorf("%w: local address: %v", verbs.ErrInvalidArgument, err)
		}
		if port := p.LocalAddr.Port(); port != 0 && port < privilegedPorts && x.cred.UID != 0 {
			return fmt.Errorf("%w: connecting from port %d needs root (ports below %d are privileged)", os.ErrPermission, port, privilegedPorts)
		}
	}
	cost := x.srv.connMemory()
	if err := x.takeConn(cost, "a connection"); err != nil {
		return err
	}
	c, err := x.dev.Dial(ctx, q.qp, raddr, p)
	if err != nil {
		x.dropConn(cost)
		return err
	}
	x.markConn(q, cost)
	connReply(b, c)
	return nil
}

// markConn records that q's connection counts against the limits
// (released with the QP).
func (x *session) markConn(q *servedQP, cost int64) {
	x.mu.Lock()
	if x.qps[q.num] == q && !q.conn {
		q.conn = true
		q.cost += cost
	} else {
		x.conns--
		x.memBytes -= cost
	}
	x.mu.Unlock()
}

// privilegedPorts: a client listens below this port only as root.
const privilegedPorts = 1024

func (x *session) listen(b *svc.Builder, m svc.Msg) error {
	var f [1][]byte
	if n, err := svc.Fields(m.Payload(), f[:]); err != nil || n != 1 {
		return fmt.Errorf("%w: LISTEN needs an address", verbs.ErrInvalidArgument)
	}
	// Empty: any address, any port; ":PORT": any address, that port.
	laddr, err := svc.ParseLocalAddr(string(f[0]))
	if err != nil {
		return fmt.Errorf("%w: listen address: %v", verbs.ErrInvalidArgument, err)
	}
	if p := laddr.Port(); p != 0 && p < privilegedPorts && x.cred.UID != 0 {
		// The service listens as root, on the address of the device:
		// a port below 1024 there is a claim to be a system service,
		// which only root may make, as on the host.
		return fmt.Errorf("%w: listening on port %d needs root (ports below %d are privileged)", os.ErrPermission, p, privilegedPorts)
	}
	backlog := int(min(m.Arg(0), 1024))
	if backlog <= 0 {
		backlog = defaultBacklog
	}
	cost := listenerMemory(backlog)
	if err := x.takeConn(cost, "a listener"); err != nil {
		return err
	}
	l, err := x.dev.Listen(laddr, verbs.ListenConfig{Backlog: backlog, MPATimeout: time.Duration(min(m.Arg(1), uint64(time.Minute)))})
	if err != nil {
		x.dropConn(cost)
		return err
	}
	x.mu.Lock()
	h := x.handle64()
	x.lns[h] = servedListener{l, cost}
	x.mu.Unlock()
	la := l.Addr()
	addr := ""
	if la.Addr().IsValid() {
		addr = la.Addr().String()
	}
	var a [svc.ListenArgs]uint64
	a[svc.ListenHandle] = h
	a[svc.ListenPort] = uint64(la.Port())
	b.Args(a[:]...).String(addr)
	return nil
}

// servedListener is a client's listener and what it is charged.
type servedListener struct {
	l    *verbs.Listener
	cost int64
}

func (x *session) closeListener(h uint64) error {
	x.mu.Lock()
	l, ok := x.lns[h]
	delete(x.lns, h)
	x.mu.Unlock()
	if !ok {
		return errNoHandle
	}
	l.l.Close()
	x.dropConn(l.cost)
	return nil
}

func (x *session) getRequest(ctx context.Context, b *svc.Builder, h uint64) error {
	x.mu.Lock()
	l, ok := x.lns[h]
	x.mu.Unlock()
	if !ok {
		return errNoHandle
	}
	r, err := l.l.GetRequest(ctx)
	if err != nil {
		return err
	}
	x.mu.Lock()
	if x.ctx.Err() != nil {
		x.mu.Unlock()
		r.Reject(nil)
		return net.ErrClosed
	}
	// Out of the backlog, the request is the client's to hold.
	if err := x.chargeLocked(memRequest, "a connection request"); err != nil {
		x.mu.Unlock()
		r.Reject(nil)
		return err
	}
	rh := x.handle64()
	x.reqs[rh] = r
	x.mu.Unlock()
	p2p, rtr := r.PeerToPeer()
	var a [svc.ReqArgs]uint64
	a[svc.ReqHandle] = rh
	a[svc.ReqMPARevision] = uint64(r.MPARevision())
	a[svc.ReqCRC] = bool64(r.CRC())
	a[svc.ReqIRD] = uint64(r.IRD())
	a[svc.ReqORD] = uint64(r.ORD())
	a[svc.ReqPeerToPeer] = bool64(p2p)
	a[svc.ReqRTR] = uint64(rtr)
	a[svc.ReqMarkers] = bool64(r.Markers())
	b.Args(a[:]...)
	// The fields in ReqField order.
	b.String(r.RemoteAddr().String()).Bytes(r.PrivateData())
	return nil
}

func (x *session) takeRequest(h uint64) (*verbs.ConnRequest, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	r := x.reqs[h]
	delete(x.reqs, h)
	if r == nil {
		return nil, errNoHandle
	}
	x.memBytes -= memRequest
	return r, nil
}

func (x *session) accept(ctx context.Context, b *svc.Builder, m svc.Msg) error {
	q, err := x.qp(m.Arg(1))
	if err != nil {
		return err
	}
	r, err := x.takeRequest(m.Arg(0))
	if err != nil {
		return err
	}
	var f [1][]byte
	if _, err := svc.Fields(m.Payload(), f[:]); err != nil {
		r.Reject(nil)
		return fmt.Errorf("%w: %v", verbs.ErrInvalidArgument, err)
	}
	if err := checkPrivateData(f[0]); err != nil {
		r.Reject(nil) // taken from the client's table: not to be left pending
		return err
	}
	cost := x.srv.connMemory()
	if err := x.takeConn(cost, "a connection"); err != nil {
		r.Reject(nil)
		return err
	}
	c, err := r.Accept(ctx, q.qp, connParamsFrom(m, 2, f[0]))
	if err != nil {
		x.dropConn(cost)
		return err
	}
	x.markConn(q, cost)
	connReply(b, c)
	return nil
}

func (x *session) reject(m svc.Msg) error {
	r, err := x.takeRequest(m.Arg(0))
	if err != nil {
		return err
	}
	var f [1][]byte
	svc.Fields(m.Payload(), f[:])
	if err := checkPrivateData(f[0]); err != nil {
		r.Reject(nil) // taken from the client's table: not to be left pending
		return err
	}
	return r.Reject(f[0])
}

// --- teardown ---

// teardown releases everything the client held, in the order the design
// comment gives.
func (x *session) teardown() {
	x.cancel()
	x.conn.Close()
	x.mu.Lock()
	lns := x.lns
	reqs := x.reqs
	x.lns, x.reqs = map[uint64]servedListener{}, map[uint64]*verbs.ConnRequest{}
	x.mu.Unlock()
	for _, l := range lns {
		l.l.Close()
	}
	for _, r := range reqs {
		r.Reject(nil)
	}
	x.stopPoller()
	if x.bell != nil {
		x.bell.Close()
	}
	x.pollWG.Wait()
	x.mu.Lock()
	qps := make([]*servedQP, 0, len(x.qps))
	for _, q := range x.qps {
		qps = append(qps, q)
	}
	x.mu.Unlock()
	var wg sync.WaitGroup
	for _, q := range qps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x.releaseQP(q, true)
		}()
	}
	wg.Wait()
	x.calls.Wait() // dial, accept, watchers: all end with the context
	// Windows first (they hold MRs), then fast-register MRs (they hold
	// the pages of MRs), then MRs: STags invalidated and fenced, and only
	// then the pages unmapped.
	x.mu.Lock()
	mws, frmrs, mrs := x.mws, x.frmrs, x.mrs
	x.mws, x.frmrs, x.mrs = map[uint64]*verbs.MW{}, map[uint64]*servedFRMR{}, map[uint64]*servedMR{}
	x.mu.Unlock()
	for _, mw := range mws {
		mw.Dealloc()
	}
	for _, f := range frmrs {
		if err := x.releaseFRMR(f); err != nil {
			x.logf("fast-register MR: %v: its pages stay mapped", err)
		}
	}
	for _, r := range mrs {
		if err := x.releaseMR(r); err != nil {
			x.logf("MR: %v: its pages stay mapped", err)
		}
	}
	// ClientStats may read the tables meanwhile: they change under x.mu.
	x.mu.Lock()
	srqs := make([]uint64, 0, len(x.srqs))
	for h := range x.srqs {
		srqs = append(srqs, h)
	}
	x.mu.Unlock()
	for _, h := range srqs {
		x.destroySRQ(h)
	}
	x.mu.Lock()
	cqs, pds := x.cqs, x.pds
	x.cqs, x.pds = map[uint64]*servedCQ{}, map[uint64]*verbs.PD{}
	x.mu.Unlock()
	for _, s := range cqs {
		s.retire()
	}
	for _, pd := range pds {
		pd.Close()
	}
	if x.ctl != nil {
		svc.Unmap(x.ctl)
		x.srv.dropMap(x.cred.UID)
	}
	if x.ctlFd >= 0 {
		closeFd(x.ctlFd)
	}
	x.srv.mu.Lock()
	delete(x.srv.sessions, x)
	if x.srv.perUID[x.cred.UID]--; x.srv.perUID[x.cred.UID] == 0 {
		delete(x.srv.perUID, x.cred.UID)
	}
	x.srv.mu.Unlock()
	if x.cred.PID != 0 {
		x.logf("gone: resources released")
	}
}

// String names the session in logs.
func (x *session) String() string { return "client " + strconv.FormatUint(x.id, 10) }

// The verbs' internals the service drives (verbs/internal/bridge).
var engine = bridge.Get[*verbs.Device, *verbs.MR, *verbs.MW, *verbs.QP, *verbs.CQ, *verbs.SRQ, verbs.AsyncEvent]()

// defaultBacklog is a listener's backlog when the client names none (the
// verbs' default).
const defaultBacklog = 64

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

func closeFd(fd int) { unix.Close(fd) }

// checkPrivateData refuses more private data than MPA carries.
func checkPrivateData(pd []byte) error {
	if len(pd) > iwarp.MPAMaxPrivateData {
		return fmt.Errorf("%w: %d bytes of private data, MPA carries at most %d", verbs.ErrInvalidArgument, len(pd), iwarp.MPAMaxPrivateData)
	}
	return nil
}

// atomicCapValues are the ibv_atomic_cap values of DeviceAttr.AtomicCap,
// in QUERY_DEVICE's numbering.
var atomicCapValues = [...]string{verbs.AtomicNone, verbs.AtomicHCA, verbs.AtomicGlob}

// encodeAttr lays a out as QUERY_DEVICE's reply arguments.
func encodeAttr(a verbs.DeviceAttr) []uint64 {
	v := make([]uint64, svc.QueryArgs)
	v[svc.QueryMaxQP], v[svc.QueryMaxQPWR], v[svc.QueryMaxSGE] = uint64(a.MaxQP), uint64(a.MaxQPWR), uint64(a.MaxSGE)
	v[svc.QueryMaxSGERd], v[svc.QueryMaxCQ], v[svc.QueryMaxCQE] = uint64(a.MaxSGERd), uint64(a.MaxCQ), uint64(a.MaxCQE)
	v[svc.QueryMaxMR], v[svc.QueryMaxMRSize], v[svc.QueryMaxPD] = uint64(a.MaxMR), a.MaxMRSize, uint64(a.MaxPD)
	v[svc.QueryMaxQPRdAtom], v[svc.QueryMaxQPInitRd] = uint64(a.MaxQPRdAtom), uint64(a.MaxQPInitRd)
	v[svc.QueryMaxSRQ], v[svc.QueryMaxSRQWR], v[svc.QueryMaxSRQSGE] = uint64(a.MaxSRQ), uint64(a.MaxSRQWR), uint64(a.MaxSRQSGE)
	v[svc.QueryMaxInline], v[svc.QueryMaxPrivData], v[svc.QueryMaxMsgSize] = uint64(a.MaxInline), uint64(a.MaxPrivData), a.MaxMsgSize
	v[svc.QueryAtomicCap] = uint64(slices.Index(atomicCapValues[:], a.AtomicCap))
	v[svc.QueryPageSizeCap], v[svc.QueryMaxMW], v[svc.QueryMaxFRPages] = a.PageSizeCap, uint64(a.MaxMW), uint64(a.MaxFRPages)
	v[svc.QueryVendorPartID], v[svc.QueryVendorID] = uint64(a.VendorPartID), uint64(a.VendorID)
	return v
}

// encodePort lays l out as QUERY_PORT's reply.
func encodePort(b *svc.Builder, l verbs.Link) {
	v := make([]uint64, svc.PortArgs)
	w, sp := l.WidthSpeed()
	v[svc.PortState], v[svc.PortPhysState], v[svc.PortLinkMTU] = uint64(l.PortState()), uint64(l.PhysState()), uint64(l.MTU)
	v[svc.PortActiveMTU], v[svc.PortActiveWidth], v[svc.PortActiveSpeed] = uint64(l.ActiveMTU()), uint64(w), uint64(sp)
	var ip []byte
	if l.Addr.Is4() {
		a4 := l.Addr.As4()
		ip = a4[:]
	}
	gid, guid := l.GID(), l.NodeGUID()
	b.Args(v...).Bytes(ip).Bytes(l.MAC).Bytes(gid[:]).Bytes(guid[:])
}
