package verbs_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
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

// clientStat returns the one client's figures of srv.
func clientStat(t *testing.T, srv *service.Server) service.ClientStat {
	t.Helper()
	cs := srv.ClientStats()
	if len(cs) != 1 {
		t.Fatalf("%d clients, want 1", len(cs))
	}
	return cs[0]
}

// TestServiceMemoryCharged: every object a client makes is charged its
// service memory (queues at full depth with their inline buffers), a QP
// beyond the budget is refused with an error naming the limit, and
// destroying objects gives their charge back.
func TestServiceMemoryCharged(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	const budget = 16 << 20
	path, srv := startService(t, p.a, service.Limits{Memory: budget})
	d := connectService(t, path)
	base := clientStat(t, srv).Memory
	if base <= 0 || base > 1<<20 {
		t.Fatalf("a new session is charged %d bytes", base)
	}
	pd, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := d.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	before := clientStat(t, srv).Memory
	// 4096 slots of 4 KiB inline: 16 MiB of inline buffers alone.
	_, err = pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: 4096, MaxInline: 4096, MaxSendSGE: 1})
	if !errors.Is(err, verbs.ErrLimit) || !strings.Contains(err.Error(), "Limits.Memory") {
		t.Fatalf("a QP whose inline buffers exceed the budget: %v, want ErrLimit naming the limit", err)
	}
	if got := clientStat(t, srv).Memory; got != before {
		t.Fatalf("a refused QP left %d bytes charged", got-before)
	}
	qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: 1024, MaxInline: 4096, MaxSendSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	st := clientStat(t, srv)
	if cost := st.Memory - before; cost < 1024*4096 {
		t.Fatalf("a QP with 4 MiB of inline slots was charged %d bytes", cost)
	}
	if st.Memory > st.MemoryLimit || st.MemoryLimit != budget || st.QPs != 1 || st.CQs != 1 || st.PDs != 1 {
		t.Fatalf("client figures %+v", st)
	}
	if err := qp.Close(); err != nil {
		t.Fatal(err)
	}
	if got := clientStat(t, srv).Memory; got != before {
		t.Fatalf("after the QP was destroyed %d bytes are charged, want %d", got, before)
	}
	srq, err := pd.CreateSRQ(1024, 4)
	if err != nil {
		t.Fatal(err)
	}
	if clientStat(t, srv).Memory <= before {
		t.Fatal("an SRQ was not charged")
	}
	srq.Close()
	cq.Close()
	pd.Close()
	if got := clientStat(t, srv).Memory; got != base {
		t.Fatalf("with nothing left %d bytes are charged, want the session's %d", got, base)
	}
}

// TestServiceCallUncharged: a blocking call (DESTROY_QP here) gives its
// charge back before its reply, so a client that has its answer reads
// the figure it had before the call, every time.
func TestServiceCallUncharged(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, srv := startService(t, p.a, service.Limits{})
	d := connectService(t, path)
	pd, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := d.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	before := clientStat(t, srv).Memory
	for i := 0; i < 300; i++ {
		qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
		if err != nil {
			t.Fatal(err)
		}
		if err := qp.Close(); err != nil {
			t.Fatal(err)
		}
		if got := clientStat(t, srv).Memory; got != before {
			t.Fatalf("round %d: after DESTROY_QP answered, %d bytes are charged, want %d", i, got, before)
		}
	}
}

// TestServiceSRQRingLimit: an SRQ refused for want of ring memory is not
// left behind, so its PD can still be freed.
func TestServiceSRQRingLimit(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startService(t, p.a, service.Limits{RingBytes: 64 << 10})
	d := connectService(t, path)
	pd, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		if _, err := pd.CreateSRQ(16384, 4); !errors.Is(err, verbs.ErrLimit) {
			t.Fatalf("an SRQ beyond the ring limit: %v, want ErrLimit", err)
		}
	}
	if err := pd.Close(); err != nil {
		t.Fatalf("freeing the PD after refused SRQs: %v", err)
	}
}

// rss is the process's resident memory.
func rss(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Skipf("no /proc/self/statm: %v", err)
	}
	f := strings.Fields(string(b))
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

// TestServiceMemoryBound: a client that makes as many inline-capable QPs as
// its limits allow and fills every send slot with 4 KiB of inline data
// (the QPs idle, so nothing drains) grows the service's resident memory by
// no more than its budget and a small constant. The ring limit alone
// would let it take gigabytes: inline buffers are not ring memory.
func TestServiceMemoryBound(t *testing.T) {
	if testing.Short() {
		t.Skip("fills 64 MiB of inline buffers")
	}
	if raceEnabled {
		t.Skip("skipping: the race detector's shadow memory grows with the heap")
	}
	const (
		budget = 64 << 20
		slack  = 32 << 20 // the client's side, rings mapped twice, the heap's own growth
		depth  = 1024
	)
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, srv := startService(t, p.a, service.Limits{Memory: budget, RingBytes: 16 << 20})
	d := connectService(t, path)
	pd, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := d.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := zerocopy.AllocShared("inline", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	mr, err := pd.RegMR(mem.Bytes(), verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	debug.FreeOSMemory()
	start := rss(t)
	wr := verbs.SendWR{Op: verbs.OpSend, Flags: verbs.Inline, SGL: []verbs.SGE{mr.SGE(0, 4096)}}
	qps := 0
	for ; qps < 1024; qps++ {
		qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: depth, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: 4096})
		if errors.Is(err, verbs.ErrLimit) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < depth; i++ {
			if err := qp.PostSend(wr); err != nil {
				t.Fatalf("QP %d, send %d: %v", qps, i, err)
			}
		}
		// A call makes the service take what the rings hold first.
		if _, err := d.AllocPD(); err != nil && !errors.Is(err, verbs.ErrLimit) {
			t.Fatal(err)
		}
	}
	grew := rss(t) - start
	st := clientStat(t, srv)
	t.Logf("%d QPs of %d inline slots of 4 KiB: resident memory grew %d MiB; %d MiB charged of %d", qps, depth, grew>>20, st.Memory>>20, budget>>20)
	if qps == 0 {
		t.Fatal("no QP fitted the budget")
	}
	if grew > budget+slack {
		t.Fatalf("resident memory grew by %d MiB for a client with a budget of %d MiB", grew>>20, budget>>20)
	}
}

// TestServiceAdmission: one user cannot take every slot (a cap per uid),
// nor hold slots with connections that never say HELLO (a cap on those,
// and a short deadline for the HELLO); a refused client is told which
// limit it met.
func TestServiceAdmission(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, srv := startServiceCfg(t, p.a, service.Config{MaxClientsPerUser: 3, MaxPendingPerUser: 2, HelloTimeout: 300 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Two connections that say nothing.
	var silent []net.Conn
	for i := 0; i < 2; i++ {
		c, err := net.Dial("unixpacket", path)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		silent = append(silent, c)
	}
	for srv.Clients() != 2 {
		runtime.Gosched()
	}
	if d, err := verbs.Connect(ctx, path); err == nil {
		d.Close()
		t.Fatal("a client was served beside two silent connections with MaxPendingPerUser 2")
	} else if !errors.Is(err, verbs.ErrLimit) || !strings.Contains(err.Error(), "HELLO") {
		t.Fatalf("refusal: %v, want ErrLimit naming the HELLO limit", err)
	}
	// The silent ones are dropped once their time for HELLO is up.
	for _, c := range silent {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Read(make([]byte, 64)); !errors.Is(err, io.EOF) {
			t.Fatalf("a connection that never said HELLO: read %v, want end of file", err)
		}
	}
	var held []*verbs.Device
	for len(held) < 3 {
		d, err := verbs.Connect(ctx, path)
		if err != nil {
			if errors.Is(err, verbs.ErrLimit) && srv.Clients() > len(held) {
				runtime.Gosched() // a dropped connection not yet torn down
				continue
			}
			t.Fatal(err)
		}
		held = append(held, d)
	}
	_, err := verbs.Connect(ctx, path)
	if !errors.Is(err, verbs.ErrLimit) || !strings.Contains(err.Error(), "per-user limit") {
		t.Fatalf("a fourth session of one uid with MaxClientsPerUser 3: %v, want ErrLimit naming the limit", err)
	}
	if _, err := held[0].AllocPD(); err != nil {
		t.Fatalf("a served client after the refusal: %v", err)
	}
	held[0].Close()
	for srv.Clients() != 2 {
		runtime.Gosched()
	}
	d := connectService(t, path)
	if _, err := d.AllocPD(); err != nil {
		t.Fatal(err)
	}
	for _, d := range held[1:] {
		d.Close()
	}
}

// TestListenSocketDir: the service's socket is made only in a directory no
// one else can rename entries in, with its mode from the umask at bind
// time and its group set without following a link.
func TestListenSocketDir(t *testing.T) {
	root := t.TempDir()
	symlink := filepath.Join(root, "link")
	good := filepath.Join(root, "good")
	if err := os.Mkdir(good, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(good, symlink); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(root, "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o777)
	sticky := filepath.Join(root, "sticky")
	if err := os.Mkdir(sticky, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(sticky, 0o777|os.ModeSticky)
	cases := []struct {
		dir string
		ok  bool
	}{{good, true}, {symlink, false}, {open, false}, {sticky, true}}
	if os.Geteuid() == 0 {
		other := filepath.Join(root, "other")
		if err := os.Mkdir(other, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, struct {
			dir string
			ok  bool
		}{other, false})
	}
	gid := -1
	if os.Geteuid() == 0 {
		gid = 65534
	}
	for _, c := range cases {
		path := filepath.Join(c.dir, "rt0.sock")
		ln, err := service.ListenSocket(path, gid)
		if !c.ok {
			var de *service.SocketDirError
			if err == nil {
				ln.Close()
				t.Errorf("%s: a socket was made in an untrusted directory", c.dir)
			} else if !errors.As(err, &de) {
				t.Errorf("%s: %v, want a SocketDirError", c.dir, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.dir, err)
			continue
		}
		fi, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
			t.Errorf("%s: socket mode %v, want a socket of mode 0660", c.dir, fi.Mode())
		}
		if st := fi.Sys().(*syscall.Stat_t); gid >= 0 && int(st.Gid) != gid {
			t.Errorf("%s: socket group %d, want %d", c.dir, st.Gid, gid)
		}
		ln.Close()
	}
}

// unprivEnv names the service socket for TestServiceUnprivilegedChild.
const unprivEnv = "RDMATAP_SVC_UNPRIV"

// TestServicePrivilegedPort: a client that is not root cannot listen on,
// or connect from, a port below 1024 of the service's address
// (os.ErrPermission); root can, and anyone can above.
func TestServicePrivilegedPort(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root to run a client as another user")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("skipping: setpriv (util-linux) is missing")
	}
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Dir(dir), 0o755)
	path := filepath.Join(dir, "rt0.sock")
	ln, err := service.ListenSocket(path, 65534)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := service.Serve(p.a, ln, service.Config{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	// The test binary, where uid 65534 may run it.
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "verbs.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", bin, "-test.run=^TestServiceUnprivilegedChild$", "-test.v")
	cmd.Env = append(os.Environ(), unprivEnv+"="+path)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestServiceUnprivilegedChild") {
		t.Fatalf("the unprivileged client: %v\n%s", err, out)
	}
	d := connectService(t, path)
	l, err := d.Listen(netip.AddrPortFrom(netip.Addr{}, 22), verbs.ListenConfig{})
	if err != nil {
		t.Fatalf("root listening on port 22: %v", err)
	}
	l.Close()
}

// TestServiceUnprivilegedChild is TestServicePrivilegedPort's client,
// run as uid 65534.
func TestServiceUnprivilegedChild(t *testing.T) {
	path := os.Getenv(unprivEnv)
	if path == "" {
		t.Skip("a client process of TestServicePrivilegedPort")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := verbs.Connect(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if l, err := d.Listen(netip.AddrPortFrom(netip.Addr{}, 22), verbs.ListenConfig{}); !errors.Is(err, os.ErrPermission) {
		if err == nil {
			l.Close()
		}
		t.Fatalf("uid %d listening on port 22: %v, want os.ErrPermission", os.Getuid(), err)
	}
	l, err := d.Listen(netip.AddrPortFrom(netip.Addr{}, 18522), verbs.ListenConfig{})
	if err != nil {
		t.Fatalf("listening on port 18522: %v", err)
	}
	l.Close()
	// Nor may it connect from such a port.
	q, err := openTestQP(d)
	if err != nil {
		t.Fatal(err)
	}
	defer q.close()
	_, err = d.Dial(ctx, q.qp, netip.MustParseAddrPort("192.0.2.2:1"), verbs.ConnParams{LocalAddr: netip.AddrPortFrom(netip.Addr{}, 22)})
	if !errors.Is(err, os.ErrPermission) {
		t.Fatalf("uid %d connecting from port 22: %v, want os.ErrPermission", os.Getuid(), err)
	}
}

// TestServiceMappings: the MRs and rings of one uid's clients, each a
// mapping of the service, stop at a quarter of what the service allows
// for all clients (half of vm.max_map_count: past it, the runtime could
// not map its heap and the process would die).
func TestServiceMappings(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startServiceCfg(t, p.a, service.Config{MaxMappings: 40}) // 10 for one uid
	a := connectService(t, path)                                        // its control page: one
	var cqs []*verbs.CQ
	for {
		cq, err := a.CreateCQ(8)
		if err != nil {
			if !errors.Is(err, verbs.ErrLimit) || !strings.Contains(err.Error(), "mappings") {
				t.Fatalf("CQ %d: %v, want ErrLimit naming the mappings", len(cqs), err)
			}
			break
		}
		cqs = append(cqs, cq)
	}
	if len(cqs) != 9 {
		t.Fatalf("%d CQ rings beside the control page, want 9", len(cqs))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if d, err := verbs.Connect(ctx, path); !errors.Is(err, verbs.ErrLimit) {
		if err == nil {
			d.Close()
		}
		t.Fatalf("a session whose control page would pass the uid's mappings: %v, want ErrLimit", err)
	}
	cqs[0].Close()
	b := connectService(t, path)
	if _, err := b.AllocPD(); err != nil {
		t.Fatal(err)
	}
}

// TestServiceMalformedEntriesComplete: a malformed SQ entry completes in
// error with its WR ID and the operation it names; a malformed RQ entry
// with its WR ID.
func TestServiceMalformedEntriesComplete(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startService(t, p.a, service.Limits{})
	r, _ := dialRaw(t, path, svc.Version)
	pd := r.alive()
	m, fds := r.call(svc.TCreateCQ, []uint64{16}, nil)
	if m.Status() != svc.StatusOK || len(fds) != 2 {
		t.Fatalf("CREATE_CQ: status %d, %d fds", m.Status(), len(fds))
	}
	cqh := m.Arg(0)
	cqMem, err := svc.MapRing(fds[0])
	unix.Close(fds[0])
	unix.Close(fds[1])
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Unmap(cqMem)
	cq, err := svc.OpenRing(cqMem)
	if err != nil {
		t.Fatal(err)
	}
	// 1 send SGE, 1 receive SGE.
	m, fds = r.call(svc.TCreateQP, []uint64{pd, cqh, cqh, 0, 16, 16, 1, 1, 0, 0}, nil)
	if m.Status() != svc.StatusOK || len(fds) != 1 {
		t.Fatalf("CREATE_QP: status %d, %d fds", m.Status(), len(fds))
	}
	qpMem, err := svc.MapRing(fds[0])
	unix.Close(fds[0])
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Unmap(qpMem)
	sqBytes := int(m.Arg(1))
	sq, err := svc.OpenRing(qpMem[:sqBytes])
	if err != nil {
		t.Fatal(err)
	}
	rq, err := svc.OpenRing(qpMem[sqBytes:])
	if err != nil {
		t.Fatal(err)
	}
	// An RDMA Write entry claiming 2 SGEs on a QP of 1.
	e := sq.Entry(0)
	svc.PutSend(e, &iwarp.SendWR{ID: 77, Op: iwarp.WRWrite}, 0)
	binary.LittleEndian.PutUint16(e[10:], 2)
	sq.Prod.Store(1)
	// A receive entry claiming 2 SGEs.
	e = rq.Entry(0)
	binary.LittleEndian.PutUint64(e, 88)
	binary.LittleEndian.PutUint32(e[8:], 2)
	rq.Prod.Store(1)
	r.alive() // a call: the service takes the rings first
	got := map[uint64]iwarp.Completion{}
	for i := uint32(0); i < cq.Prod.Load(); i++ {
		var c iwarp.Completion
		svc.GetCompletion(cq.Entry(i), &c)
		got[c.ID] = c
	}
	if c, ok := got[77]; !ok || c.Op != iwarp.CompWrite || c.Status != iwarp.StatusLocalQPOp {
		t.Errorf("malformed RDMA Write entry: %+v (found %v), want an RDMA Write completion in error, ID 77", c, ok)
	}
	if c, ok := got[88]; !ok || c.Op != iwarp.CompRecv || c.Status != iwarp.StatusLocalQPOp {
		t.Errorf("malformed receive entry: %+v (found %v), want a receive completion in error, ID 88", c, ok)
	}
}

// TestServiceQueryDevice: a client of a service that knows QUERY_DEVICE
// sees the device's limits lowered to its own; a client that lists no
// features (one from before them) is offered none.
func TestServiceQueryDevice(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	lim := service.Limits{QPs: 7, MaxWR: 512, MaxCQE: 3000, CQs: 9, MRs: 11, MRBytes: 1 << 24, PDs: 3, SRQs: 5, FRPages: 100}
	path, _ := startService(t, p.a, lim)
	d := connectService(t, path)
	want := p.a.Query()
	want.MaxQP, want.MaxQPWR, want.MaxCQ, want.MaxCQE = 7, 512, 9, 3000
	want.MaxMR, want.MaxMRSize, want.MaxPD, want.MaxSRQ, want.MaxSRQWR = 11, 1<<24, 3, 5, 512
	want.MaxMW, want.MaxFRPages = 11, 100
	if got := d.Query(); got != want {
		t.Fatalf("a service client's limits:\n%+v\nwant\n%+v", got, want)
	}
	if _, err := d.CreateCQ(3001); !errors.Is(err, verbs.ErrInvalidArgument) {
		t.Fatalf("a CQ over the queried MaxCQE: %v, want ErrInvalidArgument", err)
	}
	r, m := dialRaw(t, path, svc.Version)
	if m.Status() != svc.StatusOK || m.Arg(3) != 0 {
		t.Fatalf("HELLO without features: status %d, features %#x, want none", m.Status(), m.Arg(3))
	}
	// QUERY_DEVICE still answers such a client.
	q, _ := r.call(svc.TQueryDevice, nil, nil)
	if q.Status() != svc.StatusOK || q.Arg(svc.QueryMaxQP) != 7 || q.NArgs() != svc.QueryArgs {
		t.Fatalf("QUERY_DEVICE: status %d, %d args, max QP %d", q.Status(), q.NArgs(), q.Arg(svc.QueryMaxQP))
	}
}
