package service

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
)

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
	// MaxCQE bounds a CQ's entries (default 1<<22, the device's max_cqe;
	// siw's is 3,276,800). A CQ's ring, 32 bytes an entry, is charged to
	// RingBytes and Memory when it is made, so those bound what CQs hold
	// together: libfabric's ofi_rxm asks for (its queues' depth) x
	// FI_UNIVERSE_SIZE, 262,144 entries (8 MiB) by default.
	MaxCQE int
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
	if l.MaxCQE <= 0 {
		l.MaxCQE = 1 << 22
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
