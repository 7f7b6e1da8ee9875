package daemon

import (
	"flag"
	"fmt"
	"os/user"
	"strconv"
	"time"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
	"github.com/rdmatap/rdmatap/internal/units"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/service"
)

// The endpoint as a service: `rdmatap up --socket PATH` lets
// unprivileged processes use the endpoint through verbs.Connect. The
// socket is mode 0660; --socket-group names the group that may connect.

// serviceFlags are up's service flags.
type serviceFlags struct {
	socket   string
	group    string
	qps      int
	cqs      int
	mrBytes  string
	mrs      int
	ring     string
	conns    int
	frPages  int
	pollSpin time.Duration
	clients  int
	memory   string
	perUser  int
	pending  int
}

func (f *serviceFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.socket, "socket", "", "serve the device to other processes on this unix socket (verbs.Connect; mode 0660)")
	fs.StringVar(&f.group, "socket-group", "", "group (name or number) that owns the service socket (default: this process's group)")
	fs.IntVar(&f.qps, "client-qps", 1024, "per-client limit on QPs")
	fs.IntVar(&f.cqs, "client-cqs", 1024, "per-client limit on CQs")
	fs.StringVar(&f.mrBytes, "client-mr-bytes", "1G", "per-client limit on registered memory (suffix K, M, G)")
	fs.IntVar(&f.mrs, "client-mrs", 4096, "per-client limit on memory registrations")
	fs.StringVar(&f.ring, "client-ring-bytes", "256M", "per-client limit on the shared memory of its queues (suffix K, M, G)")
	fs.IntVar(&f.conns, "client-conns", 1024, "per-client limit on connections and listeners")
	fs.IntVar(&f.frPages, "client-fr-pages", 1<<20, "per-client limit on the pages all of its fast-register MRs may map (their page lists are service memory)")
	fs.IntVar(&f.clients, "max-clients", 1024, "clients served at once; more are refused")
	fs.StringVar(&f.memory, "client-memory", "512M", "per-client limit on the service memory its objects may hold: rings, queue slots with their inline buffers, page lists, TCP buffers of its connections, pending requests (suffix K, M, G)")
	fs.IntVar(&f.perUser, "max-clients-per-user", 64, "clients of one uid served at once (at most --max-clients); more are refused")
	fs.IntVar(&f.pending, "max-pending-per-user", 16, "connections of one uid that have not said HELLO yet; more are refused")
	fs.DurationVar(&f.pollSpin, "poll-spin", 50*time.Microsecond, "longest a client's ring poller spins after its last work request before it sleeps (less for clients whose work requests come further apart)")
}

// parseBytes reads a positive byte count with an optional K, M or G
// suffix.
func parseBytes(s string) (int64, error) {
	n, err := units.ParseBytes(s, 1<<62)
	if err == nil && n == 0 {
		err = fmt.Errorf("%w %q: must be positive", units.ErrSize, s)
	}
	return n, err
}

// check validates the flags and resolves the group (-1: none given).
func (f *serviceFlags) check() (service.Limits, int, error) {
	var lim service.Limits
	if f.socket == "" {
		if f.group != "" {
			return lim, -1, fmt.Errorf("%w: --socket-group needs --socket", cli.ErrUsage)
		}
		return lim, -1, nil
	}
	if f.qps < 1 || f.cqs < 1 || f.conns < 1 || f.mrs < 1 || f.frPages < 1 || f.clients < 1 || f.perUser < 1 || f.pending < 1 {
		return lim, -1, fmt.Errorf("%w: --client-qps, --client-cqs, --client-mrs, --client-conns, --client-fr-pages, --max-clients, --max-clients-per-user and --max-pending-per-user must be at least 1", cli.ErrUsage)
	}
	if f.perUser > f.clients || f.pending > f.perUser {
		return lim, -1, fmt.Errorf("%w: want --max-pending-per-user %d ≤ --max-clients-per-user %d ≤ --max-clients %d", cli.ErrUsage, f.pending, f.perUser, f.clients)
	}
	memory, err := parseBytes(f.memory)
	if err != nil {
		return lim, -1, fmt.Errorf("%w: --client-memory: %v", cli.ErrUsage, err)
	}
	mr, err := parseBytes(f.mrBytes)
	if err != nil {
		return lim, -1, fmt.Errorf("%w: --client-mr-bytes: %v", cli.ErrUsage, err)
	}
	ring, err := parseBytes(f.ring)
	if err != nil {
		return lim, -1, fmt.Errorf("%w: --client-ring-bytes: %v", cli.ErrUsage, err)
	}
	lim = service.Limits{QPs: f.qps, CQs: f.cqs, MRBytes: mr, MRs: f.mrs, RingBytes: ring, Conns: f.conns, FRPages: f.frPages, Memory: memory}
	gid := -1
	if f.group != "" {
		if n, err := strconv.Atoi(f.group); err == nil && n >= 0 {
			gid = n
		} else {
			g, err := user.LookupGroup(f.group)
			if err != nil {
				return lim, -1, fmt.Errorf("%w: --socket-group %q: %v", cli.ErrUsage, f.group, err)
			}
			gid, _ = strconv.Atoi(g.Gid)
		}
	}
	return lim, gid, nil
}

// startService serves d on the flags' socket; nil without --socket.
func (f *serviceFlags) start(d *verbs.Device, logf func(string, ...any)) (*service.Server, error) {
	lim, gid, err := f.check()
	if err != nil || f.socket == "" {
		return nil, err
	}
	ln, err := service.ListenSocket(f.socket, gid)
	if err != nil {
		return nil, fmt.Errorf("service socket: %w", err)
	}
	spin := f.pollSpin
	if spin == 0 {
		spin = -1
	}
	srv, err := service.Serve(d, ln, service.Config{Limits: lim, Logf: logf, PollSpin: spin, MaxClients: f.clients,
		MaxClientsPerUser: f.perUser, MaxPendingPerUser: f.pending})
	if err != nil {
		ln.Close()
		return nil, err
	}
	return srv, nil
}
