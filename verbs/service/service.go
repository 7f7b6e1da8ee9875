package service

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/internal/bridge"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

// The service side (docs/service.md has the design, verbs/remote*.go the
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
// Locks: see the package documentation.
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

// The verbs' internals the service drives (verbs/internal/bridge).
var engine = bridge.Get[*verbs.Device, *verbs.MR, *verbs.MW, *verbs.QP, *verbs.CQ, *verbs.SRQ, verbs.AsyncEvent]()
