package verbs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/service"
	"github.com/rdmatap/rdmatap/zerocopy"
)

// startService serves d on a socket in a temporary directory
// (RDMATAP_POLL_SPIN_US sets service.Config.PollSpin in µs).
func startService(t testing.TB, d *verbs.Device, lim service.Limits) (string, *service.Server) {
	t.Helper()
	spin := time.Duration(envInt("RDMATAP_POLL_SPIN_US", 0)) * time.Microsecond
	return startServiceCfg(t, d, service.Config{Limits: lim, PollSpin: spin})
}

// startServiceCfg is startService with a whole configuration.
func startServiceCfg(t testing.TB, d *verbs.Device, cfg service.Config) (string, *service.Server) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rt0.sock")
	ln, err := service.ListenSocket(path, -1)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logf = t.Logf
	srv, err := service.Serve(d, ln, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return path, srv
}

func connectService(t testing.TB, path string) *verbs.Device {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := verbs.Connect(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// Sizes of the operations opsClient and opsPeer run.
const (
	opsSend  = 4096
	opsWrite = 64 << 10
	opsRead  = 48 << 10
	opsPeerW = 32 << 10
	opsBuf   = 256 << 10
)

// waitWC waits for one completion and checks it.
func waitWC(ctx context.Context, cq *verbs.CQ, op verbs.WCOpcode, n int) (verbs.WC, error) {
	var wc [1]verbs.WC
	if _, err := cq.Wait(ctx, wc[:]); err != nil {
		return verbs.WC{}, fmt.Errorf("waiting for %v: %w", op, err)
	}
	if err := wc[0].Err(); err != nil {
		return wc[0], err
	}
	if wc[0].Op != op || (n >= 0 && int(wc[0].ByteLen) != n) {
		return wc[0], fmt.Errorf("completion %v of %d bytes, want %v of %d", wc[0].Op, wc[0].ByteLen, op, n)
	}
	return wc[0], nil
}

// testQP is a PD, a send and a receive CQ and an RC QP on them: how every
// application function of the service tests starts (send and receive
// completions come in no set order between two queues, so one CQ each).
type testQP struct {
	pd       *verbs.PD
	scq, rcq *verbs.CQ
	qp       *verbs.QP
}

func openTestQP(d *verbs.Device) (*testQP, error) {
	q := &testQP{}
	var err error
	if q.pd, err = d.AllocPD(); err != nil {
		return nil, err
	}
	if q.scq, err = d.CreateCQ(64); err == nil {
		if q.rcq, err = d.CreateCQ(64); err == nil {
			q.qp, err = q.pd.CreateQP(verbs.QPConfig{SendCQ: q.scq, RecvCQ: q.rcq})
		}
	}
	if err != nil {
		q.close()
		return nil, err
	}
	return q, nil
}

// close closes what openTestQP opened, the QP first.
func (q *testQP) close() {
	if q.qp != nil {
		q.qp.Close()
	}
	if q.rcq != nil {
		q.rcq.Close()
	}
	if q.scq != nil {
		q.scq.Close()
	}
	q.pd.Close()
}

// opsClient is application code written for the verbs API: it knows
// nothing of where d comes from. It connects to raddr, and runs Send and
// Receive both ways, an RDMA Write into the peer, an RDMA Read from it,
// and lets the peer write into its own memory, checking every byte. The
// test runs it unchanged on an embedded device and on a device of a
// service.
func opsClient(ctx context.Context, d *verbs.Device, raddr netip.AddrPort, seed uint64) error {
	q, err := openTestQP(d)
	if err != nil {
		return err
	}
	defer q.close()
	pd, scq, rcq, qp := q.pd, q.scq, q.rcq, q.qp
	mem, err := zerocopy.AllocShared("ops", opsBuf)
	if err != nil {
		return err
	}
	defer mem.Close()
	buf := mem.Bytes()
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	if err != nil {
		return err
	}
	defer mr.Dereg()

	// Receive buffers first: [0:4K) for the peer's Send, [4K:8K) for
	// its notices.
	if err := qp.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{mr.SGE(0, opsSend)}}); err != nil {
		return err
	}
	pdata, _ := mr.Remote().MarshalBinary()
	conn, err := d.Dial(ctx, qp, raddr, verbs.ConnParams{PrivateData: pdata})
	if err != nil {
		return err
	}
	var peer verbs.RemoteBuf
	if err := peer.UnmarshalBinary(conn.PeerPrivateData()); err != nil {
		return err
	}

	// 1. Send: the peer echoes it back into [0:4K).
	out := buf[opsBuf-opsSend:]
	fill(out, seed)
	if err := qp.PostSend(verbs.SendWR{ID: 10, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{mr.SGE(opsBuf-opsSend, opsSend)}}); err != nil {
		return err
	}
	if _, err := waitWC(ctx, scq, verbs.WCSend, opsSend); err != nil {
		return err
	}
	if _, err := waitWC(ctx, rcq, verbs.WCRecv, opsSend); err != nil {
		return err
	}
	if !bytes.Equal(buf[:opsSend], out) {
		return errors.New("echoed Send differs")
	}

	// 2. RDMA Write 64 KiB into the peer's [0:64K), then a Send naming
	// the seed, which the peer checks the written bytes against.
	src := buf[8<<10 : 8<<10+opsWrite]
	fill(src, seed+1)
	if err := qp.PostRecv(verbs.RecvWR{ID: 2, SGL: []verbs.SGE{mr.SGE(4<<10, 64)}}); err != nil {
		return err
	}
	if err := qp.PostSend(
		verbs.SendWR{ID: 11, Op: verbs.OpWrite, SGL: []verbs.SGE{mr.SGE(8<<10, opsWrite)}, RemoteAddr: peer.Addr, RKey: peer.RKey},
		verbs.SendWR{ID: 12, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{mr.SGE(0, 8)}},
	); err != nil {
		return err
	}
	if _, err := waitWC(ctx, scq, verbs.WCSend, 8); err != nil {
		return err
	}
	// The peer answers once it has checked the Write and has written
	// 32 KiB into our [96K:128K) and filled its own [64K:112K).
	if _, err := waitWC(ctx, rcq, verbs.WCRecv, 1); err != nil {
		return err
	}
	if buf[4<<10] != 'W' {
		return fmt.Errorf("peer reports %q after the RDMA Write", buf[4<<10])
	}
	want := make([]byte, opsPeerW)
	fill(want, seed+2)
	if !bytes.Equal(buf[96<<10:96<<10+opsPeerW], want) {
		return errors.New("peer's RDMA Write did not land in our memory")
	}

	// 3. RDMA Read the peer's [64K:112K) into our [128K:176K).
	rb, err := peer.Slice(64<<10, opsRead)
	if err != nil {
		return err
	}
	if err := qp.PostSend(verbs.SendWR{ID: 13, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{mr.SGE(128<<10, opsRead)},
		RemoteAddr: rb.Addr, RKey: rb.RKey}); err != nil {
		return err
	}
	if _, err := waitWC(ctx, scq, verbs.WCRead, opsRead); err != nil {
		return err
	}
	want = make([]byte, opsRead)
	fill(want, seed+3)
	if !bytes.Equal(buf[128<<10:128<<10+opsRead], want) {
		return errors.New("RDMA Read data differs")
	}
	return conn.Disconnect(ctx)
}

// opsPeer is the embedded peer of opsClient for one connection.
func opsPeer(ctx context.Context, l *verbs.Listener, d *verbs.Device, seed uint64) error {
	q, err := openTestQP(d)
	if err != nil {
		return err
	}
	defer q.close()
	// Send and receive completions on separate CQs: their order between
	// the queues is not set (the client's next Send may arrive before
	// the completion of the echo it answers is pushed).
	pd, cq, rcq, qp := q.pd, q.scq, q.rcq, q.qp
	buf := make([]byte, opsBuf)
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	if err != nil {
		return err
	}
	defer mr.Dereg()
	req, err := l.GetRequest(ctx)
	if err != nil {
		return err
	}
	var cl verbs.RemoteBuf
	if err := cl.UnmarshalBinary(req.PrivateData()); err != nil {
		return err
	}
	if err := qp.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{mr.SGE(0, opsSend)}},
		verbs.RecvWR{ID: 2, SGL: []verbs.SGE{mr.SGE(opsBuf-64, 64)}}); err != nil {
		return err
	}
	pdata, _ := mr.Remote().MarshalBinary()
	if _, err := req.Accept(ctx, qp, verbs.ConnParams{PrivateData: pdata}); err != nil {
		return err
	}
	// 1. Echo the Send.
	if _, err := waitWC(ctx, rcq, verbs.WCRecv, opsSend); err != nil {
		return err
	}
	if err := qp.PostSend(verbs.SendWR{ID: 20, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{mr.SGE(0, opsSend)}}); err != nil {
		return err
	}
	if _, err := waitWC(ctx, cq, verbs.WCSend, opsSend); err != nil {
		return err
	}
	// 2. The Write, announced by an 8-byte Send.
	if _, err := waitWC(ctx, rcq, verbs.WCRecv, 8); err != nil {
		return err
	}
	want := make([]byte, opsWrite)
	fill(want, seed+1)
	verdict := byte('W')
	if !bytes.Equal(buf[:opsWrite], want) {
		verdict = 'X'
	}
	fill(buf[64<<10:64<<10+opsRead], seed+3)
	src := buf[128<<10 : 128<<10+opsPeerW]
	fill(src, seed+2)
	buf[200<<10] = verdict
	dst, err := cl.Slice(96<<10, opsPeerW)
	if err != nil {
		return err
	}
	if err := qp.PostSend(
		verbs.SendWR{ID: 21, Op: verbs.OpWrite, SGL: []verbs.SGE{mr.SGE(128<<10, opsPeerW)}, RemoteAddr: dst.Addr, RKey: dst.RKey},
		verbs.SendWR{ID: 22, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{mr.SGE(200<<10, 1)}},
	); err != nil {
		return err
	}
	if _, err := waitWC(ctx, cq, verbs.WCSend, 1); err != nil {
		return err
	}
	// 3. The client reads and disconnects.
	select {
	case <-qp.Done():
	case <-ctx.Done():
		return ctx.Err()
	}
	if verdict != 'W' {
		return errors.New("client's RDMA Write differs")
	}
	return nil
}

// runOps runs opsClient on d against an embedded peer device.
func runOps(t *testing.T, d, peer *verbs.Device, peerAddr netip.Addr, seed uint64) {
	t.Helper()
	runAgainstPeer(t, d, peer, peerAddr, seed,
		func(ctx context.Context, l *verbs.Listener) error { return opsPeer(ctx, l, peer, seed) }, opsClient)
}

// runAgainstPeer runs client on d against peerFn serving a listener of the
// embedded peer device, and fails t with the error of either.
func runAgainstPeer(t *testing.T, d, peer *verbs.Device, peerAddr netip.Addr, seed uint64,
	peerFn func(context.Context, *verbs.Listener) error,
	client func(context.Context, *verbs.Device, netip.AddrPort, uint64) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := peer.Listen(netip.AddrPort{}, verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	errc := make(chan error, 1)
	go func() { errc <- peerFn(ctx, l) }()
	if err := client(ctx, d, netip.AddrPortFrom(peerAddr, l.Addr().Port()), seed); err != nil {
		cancel()
		t.Fatalf("client: %v (peer: %v)", err, <-errc)
	}
	if err := <-errc; err != nil {
		t.Fatalf("peer: %v", err)
	}
}

// TestServiceSameCode runs the same application code (opsClient, and
// memOpsClient for fast registration, invalidation and memory windows)
// on an embedded device and on the same device through the service.
func TestServiceSameCode(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	peerAddr := p.nb.Addrs()[0].Addr()
	t.Run("embedded", func(t *testing.T) { runOps(t, p.a, p.b, peerAddr, 1) })
	t.Run("embedded/memory", func(t *testing.T) { runMemOps(t, p.a, p.b, peerAddr, 2) })
	path, srv := startService(t, p.a, service.Limits{})
	t.Run("service", func(t *testing.T) {
		d := connectService(t, path)
		runOps(t, d, p.b, peerAddr, 100)
		runOps(t, d, p.b, peerAddr, 200) // the same device again
	})
	t.Run("service/memory", func(t *testing.T) {
		d := connectService(t, path)
		runMemOps(t, d, p.b, peerAddr, 101)
		runMemOps(t, d, p.b, peerAddr, 201)
	})
	deadline := time.Now().Add(5 * time.Second)
	for srv.Clients() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := srv.Clients(); n != 0 {
		t.Fatalf("%d clients still served after Close", n)
	}
}

// --- client death ---

// childEnv names the service socket for TestServiceChild; childPeerEnv
// the peer it writes to.
const (
	childEnv     = "RDMATAP_SVC_CHILD"
	childPeerEnv = "RDMATAP_SVC_CHILD_PEER"
)

// TestServiceChild is not a test of its own: TestServiceClientDeath runs
// the test binary again with this test selected to make a client process,
// which connects to the service, registers memory, connects a QP to the
// peer and writes 256 KiB RDMA Writes into it until it is killed.
func TestServiceChild(t *testing.T) {
	path := os.Getenv(childEnv)
	if path == "" {
		t.Skip("a client process of TestServiceClientDeath")
	}
	ctx := context.Background()
	d, err := verbs.Connect(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	raddr := netip.MustParseAddrPort(os.Getenv(childPeerEnv))
	if n := envInt(pingEnv, 0); n > 0 {
		childPings(t, d, raddr, n)
		return
	}
	pd, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := d.CreateCQ(256)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	mem, err := zerocopy.AllocShared("child", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.RegMR(mem.Bytes(), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	// The sink writes into our memory meanwhile: the service places into
	// these pages until we die.
	pdata, _ := mr.Remote().MarshalBinary()
	conn, err := d.Dial(ctx, qp, raddr, verbs.ConnParams{PrivateData: pdata})
	if err != nil {
		t.Fatal(err)
	}
	var peer verbs.RemoteBuf
	if err := peer.UnmarshalBinary(conn.PeerPrivateData()); err != nil {
		t.Fatal(err)
	}
	if os.Getenv(syscallEnv) != "" {
		// Busy polling: small Writes, 16 in flight, Poll without Wait.
		const ops = 50000
		wcs := make([]verbs.WC, 16)
		wr := verbs.SendWR{Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{mr.SGE(0, 64)}, RemoteAddr: peer.Addr, RKey: peer.RKey}
		before, err := readSyscalls()
		if err != nil {
			t.Fatal(err)
		}
		for posted, done, out := 0, 0, 0; done < ops; {
			for out < 16 && posted < ops {
				if err := qp.PostSend(wr); err != nil {
					t.Fatal(err)
				}
				out++
				posted++
			}
			n := cq.Poll(wcs)
			for _, wc := range wcs[:n] {
				if wc.Status != verbs.StatusSuccess {
					t.Fatalf("write: %v (QP %v: %v)", wc.Status, qp.State(), qp.Err())
				}
			}
			out -= n
			done += n
		}
		after, err := readSyscalls()
		if err != nil {
			t.Fatal(err)
		}
		// (one of them is the read of /proc/self/io itself)
		fmt.Printf("child: %d work requests, %d read/write system calls\n", ops, after-before-1)
		return
	}
	fmt.Fprintln(os.Stderr, "child: transferring")
	wcs := make([]verbs.WC, 16)
	for out := 0; ; {
		for out < 8 {
			if err := qp.PostSend(verbs.SendWR{ID: 1, Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{mr.SGE(0, 256<<10)},
				RemoteAddr: peer.Addr, RKey: peer.RKey}); err != nil {
				t.Fatal(err)
			}
			out++
		}
		n, err := cq.Wait(ctx, wcs)
		if err != nil {
			t.Fatal(err)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != verbs.StatusSuccess {
				t.Fatalf("write: %v", wc.Status)
			}
		}
		out -= n
	}
}

// sinkPeer accepts every connection on l with a QP and a 1 MiB MR that
// the initiator may write, and closes each QP when its connection ends.
// An initiator that sends a RemoteBuf as private data gets 64 KiB RDMA
// Writes into it, four in flight, for as long as the connection lasts.
func sinkPeer(ctx context.Context, d *verbs.Device, l *verbs.Listener) {
	pd, _ := d.AllocPD()
	// What the sink writes back comes from memory nobody writes into.
	src := make([]byte, 64<<10)
	srcMR, _ := pd.RegMR(src, 0)
	for {
		req, err := l.GetRequest(ctx)
		if err != nil {
			return
		}
		// Each connection writes into memory of its own.
		mr, _ := pd.RegMR(make([]byte, 1<<20), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
		pdata, _ := mr.Remote().MarshalBinary()
		cq, _ := d.CreateCQ(16)
		qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
		if err != nil {
			req.Reject(nil)
			continue
		}
		var target verbs.RemoteBuf
		writeBack := target.UnmarshalBinary(req.PrivateData()) == nil && target.Len >= 64<<10
		go func() {
			if _, err := req.Accept(ctx, qp, verbs.ConnParams{PrivateData: pdata}); err == nil {
				if writeBack {
					var wcs [4]verbs.WC
				write:
					for out := 0; ; {
						for ; out < 4; out++ {
							if qp.PostSend(verbs.SendWR{Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{srcMR.SGE(0, 64<<10)},
								RemoteAddr: target.Addr, RKey: target.RKey}) != nil {
								break write // the connection is over
							}
						}
						n, err := cq.Wait(ctx, wcs[:])
						if err != nil || wcs[0].Status != verbs.StatusSuccess {
							break
						}
						out -= n
					}
				}
				select {
				case <-qp.Done():
				case <-ctx.Done():
				}
			}
			qp.Close()
			cq.Close()
			mr.Dereg()
		}()
	}
}

// procCounts are the process-wide resources client deaths must not leak.
type procCounts struct {
	goroutines, fds, memfdMaps int
	rssKiB, anonKiB            int    // VmRSS, RssAnon
	heapKiB                    uint64 // the Go heap's live bytes (HeapAlloc)
}

func countProc(t testing.TB) procCounts {
	var c procCounts
	c.goroutines = runtime.NumGoroutine()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	c.fds = len(ents)
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	c.memfdMaps = bytes.Count(maps, []byte("/memfd:"))
	if st, err := os.ReadFile("/proc/self/status"); err == nil {
		if i := bytes.Index(st, []byte("VmRSS:")); i >= 0 {
			fmt.Sscan(string(st[i+6:]), &c.rssKiB)
		}
		if i := bytes.Index(st, []byte("RssAnon:")); i >= 0 {
			fmt.Sscan(string(st[i+8:]), &c.anonKiB)
		}
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	c.heapKiB = ms.HeapAlloc >> 10
	return c
}

// timeWait is TestServiceClientDeath's TIME-WAIT.
const timeWait = time.Second

// settleHeap collects garbage twice and returns the freed memory to the
// system. Twice: gVisor pools its packet buffers in sync.Pools, whose
// contents outlive one collection (they move to the pools' victim caches
// and go only at the next); after a single one the heap still holds
// every buffer the transfers had in flight (tens of MiB).
func settleHeap() {
	runtime.GC()
	debug.FreeOSMemory() // the second collection, and the return
}

// TestServiceClientDeath kills client processes (SIGKILL) at random
// moments — before they connect, while they set up, in the middle of RDMA
// Writes — while an in-process client runs opsClient through the same
// service over and over, and then checks that the service has released
// everything: goroutines, descriptors, memfd mappings and TCP endpoints
// are back at the baseline, the Go heap too, and RSS within a tolerance
// of it (see the end). RDMATAP_SVC_KILLS sets the number of clients
// (default 100).
//
// What RSS measured after a single collection (10 MiB at the baseline,
// 46-55 MiB after) was no leak of the service: gVisor's pooled packet
// buffers, which a sync.Pool keeps through one collection (settleHeap),
// and the bystander's connections in TIME-WAIT (a few KiB of heap each,
// for a minute). With a second collection and a short TIME-WAIT, 1000
// kills measured heap 1.7 MiB before and 1.8 MiB after, RSS 11.1 and
// 16.5 MiB (anonymous 2.3 and 6.9 MiB).
func TestServiceClientDeath(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("in a child")
	}
	kills := envInt("RDMATAP_SVC_KILLS", 100)
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	peerAddr := p.nb.Addrs()[0].Addr()
	// The bystander's connections end gracefully, and the side that
	// closes first keeps each in TIME-WAIT (a minute by default; a few
	// KiB of heap each, hundreds of them over a full run): shorten it, so
	// that what is measured at the end is what the service kept.
	for _, ns := range []*netstack.Stack{p.na, p.nb} {
		tw := tcpip.TCPTimeWaitTimeoutOption(timeWait)
		if terr := ns.Stack().SetTransportProtocolOption(tcp.ProtocolNumber, &tw); terr != nil {
			t.Fatal(terr)
		}
	}
	endpoints := func() int {
		return p.na.TransportEndpoints() + p.nb.TransportEndpoints()
	}
	path, srv := startService(t, p.a, service.Limits{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sink, err := p.b.Listen(netip.AddrPort{}, verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	sinkDone := make(chan struct{})
	go func() { sinkPeer(ctx, p.b, sink); close(sinkDone) }()
	sinkAddr := netip.AddrPortFrom(peerAddr, sink.Addr().Port())

	// Settle, then take the baseline.
	time.Sleep(50 * time.Millisecond)
	settleHeap()
	base := countProc(t)
	baseEndpoints := endpoints()

	// The bystander: another client's transfers must not notice.
	healthy := make(chan error, 1)
	stopHealthy := make(chan struct{})
	go func() {
		dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
		d, err := verbs.Connect(dctx, path)
		dcancel()
		if err != nil {
			healthy <- err
			return
		}
		defer d.Close()
		for i := uint64(0); ; i++ {
			select {
			case <-stopHealthy:
				healthy <- nil
				return
			default:
			}
			if err := runOpsErr(ctx, d, p.b, peerAddr, 1000+i); err != nil {
				healthy <- fmt.Errorf("round %d: %w", i, err)
				return
			}
		}
	}()

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	// The kill moments span twice the time a client takes to start
	// transferring here and now (at least 120 ms): some die before they
	// connect, some while they set up, most in the middle of the Writes.
	span := 120 * time.Millisecond
	{
		cmd := exec.Command(exe, "-test.run=^TestServiceChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), childEnv+"="+path, childPeerEnv+"="+sinkAddr.String())
		var out syncBuffer
		cmd.Stderr, cmd.Stdout = &out, &out
		t0 := time.Now()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		for !strings.Contains(out.String(), "child: transferring") && time.Since(t0) < 10*time.Second {
			time.Sleep(time.Millisecond)
		}
		span = max(span, 2*time.Since(t0))
		cmd.Process.Kill()
		cmd.Wait()
		t.Logf("a client starts transferring after %v; kill moments span %v", time.Since(t0), span)
	}
	const parallel = 4
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	var transferring atomic.Int32
	for i := 0; i < kills; i++ {
		delay := time.Duration(rng.Int64N(int64(span)))
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			cmd := exec.Command(exe, "-test.run=^TestServiceChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), childEnv+"="+path, childPeerEnv+"="+sinkAddr.String())
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			cmd.Stdout = &stderr
			if err := cmd.Start(); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(delay)
			cmd.Process.Kill()
			cmd.Wait()
			if bytes.Contains(stderr.Bytes(), []byte("child: transferring")) {
				transferring.Add(1)
			}
			if bytes.Contains(stderr.Bytes(), []byte("--- FAIL")) {
				t.Errorf("client process failed before it was killed:\n%s", stderr.Bytes())
			}
		}()
	}
	wg.Wait()
	close(stopHealthy)
	if err := <-healthy; err != nil {
		t.Fatalf("the bystander client: %v", err)
	}
	t.Logf("%d clients killed, %d of them in the middle of RDMA Writes", kills, transferring.Load())
	if transferring.Load() == 0 {
		t.Errorf("no client was killed mid-transfer: the delays are too short for this machine")
	}

	// Every session ends and everything returns: goroutines, descriptors
	// and mappings at once, the connections once TIME-WAIT is over.
	var now procCounts
	deadline := time.Now().Add(15 * time.Second)
	for {
		settleHeap()
		now = countProc(t)
		if srv.Clients() == 0 && now.goroutines <= base.goroutines && now.fds <= base.fds && now.memfdMaps <= base.memfdMaps &&
			endpoints() <= baseEndpoints {
			break
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Fatalf("not back at baseline: clients %d, goroutines %d (base %d), fds %d (base %d), memfd mappings %d (base %d), TCP endpoints %d (base %d)\n%s",
				srv.Clients(), now.goroutines, base.goroutines, now.fds, base.fds, now.memfdMaps, base.memfdMaps, endpoints(), baseEndpoints, buf[:n])
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("baseline: goroutines %d, fds %d, memfd mappings %d, heap %d KiB, RSS %d KiB (anonymous %d KiB); after: %d, %d, %d, %d KiB, %d KiB (%d KiB)",
		base.goroutines, base.fds, base.memfdMaps, base.heapKiB, base.rssKiB, base.anonKiB,
		now.goroutines, now.fds, now.memfdMaps, now.heapKiB, now.rssKiB, now.anonKiB)
	// Memory. The heap must be back (a little slack for what the runtime
	// and the stacks grow once: timer heaps, map buckets, the endpoint
	// tables). RSS comes back to within its tolerance once the freed
	// heap is returned: the anonymous part (heap spans partly in use —
	// the heap arena's resident part was 3.5 MiB after 300 kills — and
	// the runtime's metadata and stacks, sized by the peak the pooled
	// buffers reached: 3-6 MiB more than at the baseline over several
	// runs), and file pages of the test binary's code the run has
	// touched, which no leak makes.
	const heapSlackKiB, anonSlackKiB, rssSlackKiB = 2 << 10, 10 << 10, 12 << 10
	if now.heapKiB > base.heapKiB+heapSlackKiB {
		t.Errorf("heap %d KiB after, %d KiB at the baseline (tolerance %d KiB)", now.heapKiB, base.heapKiB, heapSlackKiB)
	}
	// (The race detector's shadow memory grows with all memory touched
	// and is not given back: RSS says nothing then.)
	if !raceEnabled && now.anonKiB > base.anonKiB+anonSlackKiB {
		t.Errorf("anonymous RSS %d KiB after, %d KiB at the baseline (tolerance %d KiB)", now.anonKiB, base.anonKiB, anonSlackKiB)
	}
	if !raceEnabled && now.rssKiB > base.rssKiB+rssSlackKiB {
		t.Errorf("RSS %d KiB after, %d KiB at the baseline (tolerance %d KiB)", now.rssKiB, base.rssKiB, rssSlackKiB)
	}
	cancel()
	sink.Close()
	<-sinkDone
}

// TestServiceClientDeathTerminate: a client process is killed while its QP
// writes into an embedded peer's memory; the service takes the QP down as
// an RNIC does on a local catastrophic error, so the peer's QP gets a
// Terminate (RDMAP, local catastrophic error) rather than a reset, and
// flushes its work requests.
func TestServiceClientDeathTerminate(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("in a child")
	}
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	peerAddr := p.nb.Addrs()[0].Addr()
	path, srv := startService(t, p.a, service.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := p.b.Listen(netip.AddrPort{}, verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	pd, err := p.b.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.RegMR(make([]byte, 1<<20), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	pdata, _ := mr.Remote().MarshalBinary()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 3; round++ {
		cq, err := p.b.CreateCQ(16)
		if err != nil {
			t.Fatal(err)
		}
		qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
		if err != nil {
			t.Fatal(err)
		}
		// Receives the peer never fills: they must be flushed.
		for i := uint64(1); i <= 2; i++ {
			if err := qp.PostRecv(verbs.RecvWR{ID: i, SGL: []verbs.SGE{mr.SGE(0, 64)}}); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command(exe, "-test.run=^TestServiceChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), childEnv+"="+path, childPeerEnv+"="+netip.AddrPortFrom(peerAddr, l.Addr().Port()).String())
		var out syncBuffer
		cmd.Stderr, cmd.Stdout = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		req, err := l.GetRequest(ctx)
		if err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("no connection request: %v\n%s", err, out.String())
		}
		if _, err := req.Accept(ctx, qp, verbs.ConnParams{PrivateData: pdata}); err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatal(err)
		}
		for !strings.Contains(out.String(), "child: transferring") && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		// Some of its Writes land first.
		time.Sleep(time.Duration(round) * 20 * time.Millisecond)
		cmd.Process.Kill()
		cmd.Wait()
		if strings.Contains(out.String(), "--- FAIL") {
			t.Fatalf("client process failed before it was killed:\n%s", out.String())
		}
		var term verbs.AsyncEvent
	events:
		for {
			select {
			case e := <-p.b.Events():
				if e.QPNum != qp.Num() {
					continue
				}
				if e.Type == verbs.EventTerminateReceived {
					term = e
					break events
				}
				if e.Type == verbs.EventDisconnected {
					t.Fatalf("round %d: the peer's QP ended without a Terminate: %v", round, e.Err)
				}
			case <-ctx.Done():
				t.Fatalf("round %d: no Terminate at the peer", round)
			}
		}
		if term.Term != termLocalCatastroph {
			t.Fatalf("round %d: Terminate %v, want %v", round, term.Term, termLocalCatastroph)
		}
		var te *verbs.TerminateError
		if !errors.As(term.Err, &te) || !te.Received {
			t.Fatalf("round %d: event error %v, want a received Terminate", round, term.Err)
		}
		select {
		case <-qp.Done():
		case <-ctx.Done():
			t.Fatalf("round %d: the peer's QP did not end", round)
		}
		var wcs [4]verbs.WC
		n := cq.Poll(wcs[:])
		if n != 2 {
			t.Fatalf("round %d: %d completions, want the 2 receives flushed", round, n)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != verbs.StatusWRFlush {
				t.Fatalf("round %d: receive %d: %v, want flushed", round, wc.ID, wc.Status)
			}
		}
		if !errors.As(qp.Err(), &te) || te.Code != termLocalCatastroph {
			t.Fatalf("round %d: QP error %v", round, qp.Err())
		}
		qp.Close()
		cq.Close()
		t.Logf("round %d: %v", round, term.Err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for srv.Clients() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if c := srv.Clients(); c != 0 {
		t.Fatalf("%d sessions left", c)
	}
}

// runOpsErr is runOps returning its error.
func runOpsErr(ctx context.Context, d, peer *verbs.Device, peerAddr netip.Addr, seed uint64) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	l, err := peer.Listen(netip.AddrPort{}, verbs.ListenConfig{})
	if err != nil {
		return err
	}
	defer l.Close()
	errc := make(chan error, 1)
	go func() { errc <- opsPeer(ctx, l, peer, seed) }()
	if err := opsClient(ctx, d, netip.AddrPortFrom(peerAddr, l.Addr().Port()), seed); err != nil {
		cancel()
		return fmt.Errorf("client: %w (peer: %v)", err, <-errc)
	}
	if err := <-errc; err != nil {
		return fmt.Errorf("peer: %w", err)
	}
	return nil
}

// srqClient is application code for receives through a shared receive
// queue, the SRQ limit event and CQ completion events: it accepts one
// connection on l, receives n Sends through an SRQ (armed to report when
// fewer than 2 receives remain), waiting for each with ReqNotify and
// WaitEvent, and checks the bytes and the event.
func srqClient(ctx context.Context, d *verbs.Device, l *verbs.Listener, n int) error {
	pd, err := d.AllocPD()
	if err != nil {
		return err
	}
	cq, err := d.CreateCQ(64)
	if err != nil {
		return err
	}
	srq, err := pd.CreateSRQ(16, 1)
	if err != nil {
		return err
	}
	qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq, SRQ: srq})
	if err != nil {
		return err
	}
	defer qp.Close()
	mem, err := zerocopy.AllocShared("srq", 64<<10)
	if err != nil {
		return err
	}
	defer mem.Close()
	mr, err := pd.RegMR(mem.Bytes(), verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	defer mr.Dereg()
	for i := 0; i < n; i++ {
		if err := srq.PostRecv(verbs.RecvWR{ID: uint64(100 + i), SGL: []verbs.SGE{mr.SGE(i*1024, 1024)}}); err != nil {
			return err
		}
	}
	if err := srq.SetLimit(2); err != nil {
		return err
	}
	req, err := l.GetRequest(ctx)
	if err != nil {
		return err
	}
	if string(req.PrivateData()) != "srq" {
		return fmt.Errorf("private data %q", req.PrivateData())
	}
	if _, err := req.Accept(ctx, qp, verbs.ConnParams{PrivateData: []byte("ok")}); err != nil {
		return err
	}
	var wc [1]verbs.WC
	for i := 0; i < n; i++ {
		// Arm, poll, wait for the event, poll: an event may be stale (the
		// completion that raised it was polled before the wait, as after
		// ibv_req_notify_cq), so a wait that finds nothing arms again.
		for stale := 0; ; stale++ {
			if err := cq.ReqNotify(false); err != nil {
				return err
			}
			if cq.Poll(wc[:]) > 0 {
				break
			}
			if err := cq.WaitEvent(ctx); err != nil {
				return fmt.Errorf("completion event %d: %w", i, err)
			}
			if cq.Poll(wc[:]) > 0 {
				break
			}
			if stale == 2 {
				return fmt.Errorf("completion event %d: three events without a completion", i)
			}
		}
		if err := wc[0].Err(); err != nil || wc[0].ID != uint64(100+i) || wc[0].ByteLen != 512 {
			return fmt.Errorf("receive %d: id %d, %d bytes, %v", i, wc[0].ID, wc[0].ByteLen, err)
		}
		want := bytes.Repeat([]byte{byte(i + 1)}, 512)
		if !bytes.Equal(mem.Bytes()[i*1024:i*1024+512], want) {
			return fmt.Errorf("receive %d: bytes differ", i)
		}
	}
	established := false
	for {
		select {
		case e := <-d.Events():
			if e.Type == verbs.EventEstablished && e.QPNum == qp.Num() {
				established = true
			}
			if e.Type == verbs.EventSRQLimitReached {
				if e.SRQ != srq {
					return errors.New("SRQ limit event names another SRQ")
				}
				if !established {
					return errors.New("no ESTABLISHED event for the QP before the SRQ limit event")
				}
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("no SRQ limit event (ESTABLISHED seen: %v)", established)
		}
	}
}

// srqPeer dials and sends n 512-byte messages.
func srqPeer(ctx context.Context, d *verbs.Device, raddr netip.AddrPort, n int) error {
	pd, _ := d.AllocPD()
	cq, _ := d.CreateCQ(64)
	qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		return err
	}
	defer qp.Close()
	buf := make([]byte, 512*n)
	for i := 0; i < n; i++ {
		copy(buf[i*512:], bytes.Repeat([]byte{byte(i + 1)}, 512))
	}
	mr, _ := pd.RegMR(buf, verbs.AccessLocalWrite)
	var c *verbs.Conn
	for {
		c, err = d.Dial(ctx, qp, raddr, verbs.ConnParams{PrivateData: []byte("srq")})
		if err == nil || ctx.Err() != nil {
			break
		}
		return err
	}
	if string(c.PeerPrivateData()) != "ok" {
		return fmt.Errorf("accept's private data %q", c.PeerPrivateData())
	}
	for i := 0; i < n; i++ {
		if err := qp.PostSend(verbs.SendWR{ID: uint64(i), Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{mr.SGE(i*512, 512)}}); err != nil {
			return err
		}
		if _, err := waitWC(ctx, cq, verbs.WCSend, 512); err != nil {
			return err
		}
	}
	<-ctx.Done()
	return nil
}

// TestServiceSRQAndEvents runs srqClient, a passive side, on an embedded
// device and through the service.
func TestServiceSRQAndEvents(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startService(t, p.a, service.Limits{})
	run := func(t *testing.T, d *verbs.Device, addr netip.Addr) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		l, err := d.Listen(netip.AddrPortFrom(addr, 0), verbs.ListenConfig{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		pctx, pcancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() { errc <- srqPeer(pctx, p.b, netip.AddrPortFrom(addr, l.Addr().Port()), 6) }()
		err = srqClient(ctx, d, l, 6)
		pcancel()
		if perr := <-errc; perr != nil {
			t.Errorf("peer: %v", perr)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	addr := p.na.Addrs()[0].Addr()
	t.Run("embedded", func(t *testing.T) { run(t, p.a, addr) })
	t.Run("service", func(t *testing.T) { run(t, connectService(t, path), addr) })
}

// fewestAllocs is the fewest allocations per call of f in three runs of
// testing.AllocsPerRun. It counts every malloc of the process, and the
// other goroutines of a test's devices and service (the stacks' timers,
// a session's reader) allocate now and then; on a loaded machine a run
// lasts long enough to catch hundreds of them. An allocation of f itself
// shows in every run.
func fewestAllocs(runs int, f func()) float64 {
	least := testing.AllocsPerRun(runs, f)
	for i := 0; i < 2 && least > 0; i++ {
		least = min(least, testing.AllocsPerRun(runs, f))
	}
	return least
}

// TestServiceFastPathAllocs: posting sends and receives into the rings,
// the service's poller taking them into the protocol engine, and polling
// the CQ ring allocate nothing (a QP not yet connected: the engine queues
// the WRs, so no network code runs). Everything runs in this process, so
// the count covers both sides.
func TestServiceFastPathAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("skipping: the race detector allocates")
	}
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startService(t, p.a, service.Limits{})
	d := connectService(t, path)
	pd, _ := d.AllocPD()
	cq, _ := d.CreateCQ(16)
	qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: 1024, MaxRecvWR: 1024})
	if err != nil {
		t.Fatal(err)
	}
	mem, _ := zerocopy.AllocShared("allocs", 4096)
	defer mem.Close()
	mr, err := pd.RegMR(mem.Bytes(), verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	wr := []verbs.SendWR{{Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{mr.SGE(0, 64)}, RemoteAddr: 1 << 20, RKey: 7}}
	rwr := []verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{mr.SGE(1024, 64)}}}
	var wcs [4]verbs.WC
	// Warm the engine's queues up to the depth the measured run reaches.
	for i := 0; i < 400; i++ {
		qp.PostSend(wr...)
		qp.PostRecv(rwr...)
		time.Sleep(time.Microsecond)
	}
	qp.Close()
	// Room for the three runs fewestAllocs may make: the QP is not
	// connected, so what is posted stays queued.
	qp, _ = pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: 2048, MaxRecvWR: 2048})
	allocs := fewestAllocs(400, func() {
		if err := qp.PostSend(wr...); err != nil {
			t.Fatal(err)
		}
		if err := qp.PostRecv(rwr...); err != nil {
			t.Fatal(err)
		}
		cq.Poll(wcs[:])
		runtime.Gosched()
	})
	if allocs != 0 {
		t.Errorf("%.2f allocations per PostSend+PostRecv+Poll through the rings", allocs)
	}
	// Memory registration work requests: REG_MR and BIND_MW (which name
	// their MR or window by handle), Local Invalidate.
	frmr, err := pd.AllocMR(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := frmr.MapPages([][]byte{mem.Bytes()}, 4096, 0, 4096); err != nil {
		t.Fatal(err)
	}
	mw, err := pd.AllocMW(verbs.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	mwrs := []verbs.SendWR{
		frmr.RegWR(2, 0, verbs.IncRKey(frmr.RKey()), verbs.AccessLocalWrite),
		mw.BindWR(3, 0, verbs.IncRKey(mw.RKey()), verbs.BindInfo{MR: mr, Addr: mr.Addr(), Length: 64, Access: verbs.AccessRemoteRead}),
		{ID: 4, Op: verbs.OpLocalInv, InvalidateRKey: mr.RKey()},
	}
	qp.Close()
	qp, _ = pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: 2048, MaxRecvWR: 16})
	allocs = fewestAllocs(200, func() {
		if err := qp.PostSend(mwrs...); err != nil {
			t.Fatal(err)
		}
		runtime.Gosched()
	})
	if allocs != 0 {
		t.Errorf("%.2f allocations per REG_MR+BIND_MW+LOCAL_INV posted through the ring", allocs)
	}
}

// TestServiceLimits: a client stops at its limits with ErrLimit; what it
// frees it may allocate again; another client has limits of its own.
func TestServiceLimits(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startService(t, p.a, service.Limits{QPs: 2, CQs: 2, MRBytes: 1<<20 + 16384, Conns: 1, MRs: 3, PDs: 2, RingBytes: 1 << 20})
	a := connectService(t, path)
	pd, _ := a.AllocPD()
	cq1, err := a.CreateCQ(8)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.CreateCQ(8); err != nil {
		t.Fatal(err)
	}
	if _, err := a.CreateCQ(8); !errors.Is(err, verbs.ErrLimit) {
		t.Fatalf("third CQ: %v, want ErrLimit", err)
	}
	q1, _ := pd.CreateQP(verbs.QPConfig{SendCQ: cq1, RecvCQ: cq1})
	if _, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq1, RecvCQ: cq1}); err != nil {
		t.Fatal(err)
	}
	if _, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq1, RecvCQ: cq1}); !errors.Is(err, verbs.ErrLimit) {
		t.Fatalf("third QP: %v, want ErrLimit", err)
	}
	if err := cq1.Close(); !errors.Is(err, verbs.ErrBusy) {
		t.Fatalf("closing a CQ QPs use: %v, want ErrBusy", err)
	}
	q1.Close()
	if _, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq1, RecvCQ: cq1}); err != nil {
		t.Fatalf("a QP after one was destroyed: %v", err)
	}
	mem, _ := zerocopy.AllocShared("lim", 2<<20)
	defer mem.Close()
	m1, err := pd.RegMR(mem.Bytes()[:1<<20], verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pd.RegMR(mem.Bytes()[1<<20:], verbs.AccessLocalWrite); !errors.Is(err, verbs.ErrLimit) {
		t.Fatalf("MR over the byte limit: %v, want ErrLimit", err)
	}
	m1.Dereg()
	if _, err := pd.RegMR(mem.Bytes()[1<<20:], verbs.AccessLocalWrite); err != nil {
		t.Fatalf("MR after deregistering: %v", err)
	}
	if _, err := a.Listen(netip.AddrPort{}, verbs.ListenConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Listen(netip.AddrPort{}, verbs.ListenConfig{}); !errors.Is(err, verbs.ErrLimit) {
		t.Fatalf("second listener with a limit of 1: %v, want ErrLimit", err)
	}
	// Registrations are counted too, however small.
	if _, err := pd.RegMR(mem.Bytes()[:4096], verbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if _, err := pd.RegMR(mem.Bytes()[8192:12288], verbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if _, err := pd.RegMR(mem.Bytes()[16384:20480], verbs.AccessLocalWrite); !errors.Is(err, verbs.ErrLimit) {
		t.Fatalf("fourth MR with a limit of 3: %v, want ErrLimit", err)
	}
	if _, err := a.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.AllocPD(); !errors.Is(err, verbs.ErrLimit) {
		t.Fatalf("third PD with a limit of 2: %v, want ErrLimit", err)
	}
	// Memory that is not from zerocopy.AllocShared cannot be registered.
	if _, err := pd.RegMR(make([]byte, 4096), verbs.AccessLocalWrite); !errors.Is(err, verbs.ErrNotShared) {
		t.Fatalf("Go memory: %v, want ErrNotShared", err)
	}
	b := connectService(t, path)
	// Queue memory is the service's: a CQ of 32768 entries needs 1 MiB
	// and its header.
	if _, err := b.CreateCQ(32768); !errors.Is(err, verbs.ErrLimit) {
		t.Fatalf("a CQ beyond the ring memory limit: %v, want ErrLimit", err)
	}
	for i := 0; i < 2; i++ {
		if _, err := b.CreateCQ(8); err != nil {
			t.Fatalf("another client's CQ %d: %v", i, err)
		}
	}
}

// TestServiceSlowPathOrdering: work requests posted into the rings come
// before a later socket call: receives before Dial (the peer's first Send
// finds them), sends before Disconnect (the peer gets them all), and
// sends before Close (each completes, flushed or not).
func TestServiceSlowPathOrdering(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startService(t, p.a, service.Limits{})
	d := connectService(t, path)
	if os.Getenv("RDMATAP_ORDER_EMBEDDED") != "" {
		d = p.a
	}
	peerAddr := p.nb.Addrs()[0].Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for round := 0; round < 20; round++ {
		l, err := p.b.Listen(netip.AddrPort{}, verbs.ListenConfig{})
		if err != nil {
			t.Fatal(err)
		}
		const n = 32
		got := make(chan error, 1)
		go func() {
			pd, _ := p.b.AllocPD()
			cq, _ := p.b.CreateCQ(2 * n)
			qp, _ := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq, MaxRecvWR: n})
			defer qp.Close()
			buf := make([]byte, 64*n)
			mr, _ := pd.RegMR(buf, verbs.AccessLocalWrite)
			for i := 0; i < n; i++ {
				qp.PostRecv(verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{mr.SGE(64*i, 64)}})
			}
			req, err := l.GetRequest(ctx)
			if err != nil {
				got <- err
				return
			}
			if _, err := req.Accept(ctx, qp, verbs.ConnParams{}); err != nil {
				got <- err
				return
			}
			// The peer speaks first here (the client dialed): answer at
			// once into the receive the client posted before Dial.
			qp.OpenTXGate()
			if err := qp.PostSend(verbs.SendWR{Op: verbs.OpSend, SGL: []verbs.SGE{mr.SGE(0, 8)}}); err != nil {
				got <- err
				return
			}
			for i := 0; i < n; i++ {
				if _, err := waitWC(ctx, cq, verbs.WCRecv, 16); err != nil {
					got <- fmt.Errorf("receive %d of %d: %w", i, n, err)
					return
				}
			}
			got <- nil
		}()
		pd, _ := d.AllocPD()
		cq, _ := d.CreateCQ(4 * n)
		qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: n})
		if err != nil {
			t.Fatal(err)
		}
		mem, _ := zerocopy.AllocShared("order", 4096)
		mr, _ := pd.RegMR(mem.Bytes(), verbs.AccessLocalWrite)
		if err := qp.PostRecv(verbs.RecvWR{ID: 99, SGL: []verbs.SGE{mr.SGE(1024, 64)}}); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Dial(ctx, qp, netip.AddrPortFrom(peerAddr, l.Addr().Port()), verbs.ConnParams{}); err != nil {
			t.Fatal(err)
		}
		wc, err := waitWC(ctx, cq, verbs.WCRecv, 8)
		if err != nil || wc.ID != 99 {
			t.Fatalf("round %d: the peer's first Send: %v (id %d)", round, err, wc.ID)
		}
		for i := 0; i < n; i++ {
			if err := qp.PostSend(verbs.SendWR{ID: uint64(i), Op: verbs.OpSend, SGL: []verbs.SGE{mr.SGE(0, 16)}}); err != nil {
				t.Fatal(err)
			}
		}
		if err := qp.Disconnect(ctx); err != nil {
			t.Fatalf("round %d: disconnect: %v", round, err)
		}
		if err := <-got; err != nil {
			t.Fatalf("round %d: peer: %v", round, err)
		}
		// Sends posted just before Close all complete.
		qp2, _ := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: n})
		for i := 0; i < n; i++ {
			qp2.PostSend(verbs.SendWR{ID: uint64(1000 + i), Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{mr.SGE(0, 16)}})
		}
		qp.Close()
		qp2.Close()
		flushed := 0
		var wcs [64]verbs.WC
		for deadline := time.Now().Add(5 * time.Second); flushed < n && time.Now().Before(deadline); {
			k := cq.Poll(wcs[:])
			for _, w := range wcs[:k] {
				if w.ID >= 1000 && w.Status == verbs.StatusWRFlush {
					flushed++
				}
			}
			if k == 0 {
				time.Sleep(time.Millisecond)
			}
		}
		if flushed != n {
			t.Fatalf("round %d: %d of %d sends posted before Close completed flushed", round, flushed, n)
		}
		mr.Dereg()
		mem.Close()
		l.Close()
	}
}

// TestServiceGone: when the service goes, a client blocked in CQ.Wait and
// in GetRequest returns an error, its QPs end, and later calls fail.
func TestServiceGone(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, srv := startService(t, p.a, service.Limits{})
	d := connectService(t, path)
	pd, _ := d.AllocPD()
	cq, _ := d.CreateCQ(8)
	qp, _ := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
	l, err := d.Listen(netip.AddrPort{}, verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	waitErr := make(chan error, 1)
	go func() {
		var wc [1]verbs.WC
		_, err := cq.Wait(ctx, wc[:])
		waitErr <- err
	}()
	reqErr := make(chan error, 1)
	go func() {
		_, err := l.GetRequest(ctx)
		reqErr <- err
	}()
	time.Sleep(50 * time.Millisecond) // both asleep
	srv.Close()
	for what, ch := range map[string]chan error{"CQ.Wait": waitErr, "GetRequest": reqErr} {
		select {
		case err := <-ch:
			if err == nil || ctx.Err() != nil {
				t.Errorf("%s returned %v after the service went", what, err)
			}
		case <-ctx.Done():
			t.Fatalf("%s still blocked after the service went", what)
		}
	}
	select {
	case <-qp.Done():
	case <-ctx.Done():
		t.Fatal("QP not done after the service went")
	}
	if _, err := d.AllocPD(); err == nil {
		t.Error("AllocPD succeeded without a service")
	}
}

// syscallEnv makes TestServiceChild's process count its own system calls
// around a busy-polling loop instead of writing until it is killed.
const syscallEnv = "RDMATAP_SVC_CHILD_COUNT"

// readSyscalls returns the read- and write-type system calls this process
// has made (/proc/self/io syscr + syscw).
func readSyscalls() (int, error) {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		var v int
		if _, err := fmt.Sscanf(line, "syscr: %d", &v); err == nil {
			n += v
		}
		if _, err := fmt.Sscanf(line, "syscw: %d", &v); err == nil {
			n += v
		}
	}
	return n, nil
}

// BenchmarkServiceBusyPollSyscalls: a client process that busy-polls
// (16 small Writes in flight, Poll without Wait) against a poller that
// spins 20 ms before it sleeps makes next to no system call per work
// request: the rings carry the work, and the doorbell is rung only while
// the poller sleeps. It reports read/write calls per work request (a
// count that depends on how often a loaded machine takes the client off
// its CPU, so it is a figure to watch, not a test's pass mark).
//
//	go test ./verbs/ -run XXX -bench ServiceBusyPollSyscalls -benchtime 1x
func BenchmarkServiceBusyPollSyscalls(b *testing.B) {
	if os.Getenv(childEnv) != "" {
		b.Skip("in a child")
	}
	if _, err := readSyscalls(); err != nil {
		b.Skipf("skipping: /proc/self/io is not readable: %v", err)
	}
	p := newPair(b, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startServiceCfg(b, p.a, service.Config{PollSpin: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sink, err := p.b.Listen(netip.AddrPort{}, verbs.ListenConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	go sinkPeer(ctx, p.b, sink)
	exe, _ := os.Executable()
	var ops, calls int
	for range b.N {
		cmd := exec.Command(exe, "-test.run=^TestServiceChild$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), childEnv+"="+path, childPeerEnv+"="+netip.AddrPortFrom(p.nb.Addrs()[0].Addr(), sink.Addr().Port()).String(),
			syscallEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Fatalf("client process: %v\n%s", err, out)
		}
		var o, c int
		for _, line := range strings.Split(string(out), "\n") {
			if _, err := fmt.Sscanf(strings.TrimSpace(line), "child: %d work requests, %d read/write system calls", &o, &c); err == nil {
				break
			}
		}
		if o == 0 {
			b.Fatalf("no count from the client process:\n%s", out)
		}
		ops, calls = ops+o, calls+c
	}
	b.ReportMetric(float64(calls)/float64(ops), "syscalls/WR")
}

// TestServiceCancel: a blocking call whose context ends returns the
// context's error, the service abandons it (Cancel), and the next call on
// the same listener gets the next request.
func TestServiceCancel(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startService(t, p.a, service.Limits{})
	d := connectService(t, path)
	l, err := d.Listen(netip.AddrPort{}, verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		_, err := l.GetRequest(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("GetRequest with nobody dialing: %v, want DeadlineExceeded", err)
		}
	}
	// A canceled GetRequest must not have taken the request the next one
	// is for.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dialed := make(chan error, 1)
	go func() {
		pd, _ := p.b.AllocPD()
		cq, _ := p.b.CreateCQ(4)
		qp, _ := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
		_, err := p.b.Dial(ctx, qp, netip.AddrPortFrom(p.na.Addrs()[0].Addr(), l.Addr().Port()), verbs.ConnParams{PrivateData: []byte("hi")})
		dialed <- err
	}()
	req, err := l.GetRequest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if string(req.PrivateData()) != "hi" {
		t.Fatalf("private data %q", req.PrivateData())
	}
	if err := req.Reject([]byte("no")); err != nil {
		t.Fatal(err)
	}
	var rej *verbs.RejectedError
	if err := <-dialed; !errors.As(err, &rej) || string(rej.PrivateData) != "no" {
		t.Fatalf("dial: %v, want a rejection with private data %q", err, "no")
	}
}

// TestServiceMaxClients: clients beyond service.Config.MaxClients are
// refused; those served go on, and a place freed is taken again.
func TestServiceMaxClients(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, srv := startServiceCfg(t, p.a, service.Config{MaxClients: 2})
	a := connectService(t, path)
	b, err := verbs.Connect(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c, err := verbs.Connect(ctx, path); err == nil {
		c.Close()
		t.Fatal("a third client was served with MaxClients 2")
	}
	if _, err := a.AllocPD(); err != nil {
		t.Fatalf("a served client after the refusal: %v", err)
	}
	b.Close()
	for deadline := time.Now().Add(5 * time.Second); srv.Clients() != 1; {
		if time.Now().After(deadline) {
			t.Fatalf("%d clients after one left", srv.Clients())
		}
		time.Sleep(time.Millisecond)
	}
	c := connectService(t, path)
	if _, err := c.AllocPD(); err != nil {
		t.Fatal(err)
	}
}

// syncBuffer is a bytes.Buffer safe for a process's output and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestServiceListenPort: a listener on any address and a given port (as
// perftest's servers listen on 18515) gets that port through the service,
// and a peer reaches it there.
func TestServiceListenPort(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startService(t, p.a, service.Limits{})
	d := connectService(t, path)
	const port = 18515
	l, err := d.Listen(netip.AddrPortFrom(netip.Addr{}, port), verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := l.Addr().Port(); got != port {
		t.Fatalf("listening on port %d, want %d", got, port)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pctx, pcancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- srqPeer(pctx, p.b, netip.AddrPortFrom(p.na.Addrs()[0].Addr(), port), 6) }()
	err = srqClient(ctx, d, l, 6)
	pcancel()
	if perr := <-errc; perr != nil {
		t.Errorf("peer: %v", perr)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestServiceStats: Device.Stats on a device of a service reports the
// service's device's counters.
func TestServiceStats(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	peerAddr := p.nb.Addrs()[0].Addr()
	path, _ := startService(t, p.a, service.Limits{})
	d := connectService(t, path)
	if s := d.Stats(); s.TxFPDUs != 0 || s.RxFPDUs != 0 {
		t.Fatalf("before any traffic: %+v", s)
	}
	runOps(t, d, p.b, peerAddr, 7)
	got, want := d.Stats(), p.a.Stats()
	if got.TxFPDUs == 0 || got.RxBytes == 0 || got.TxOps == [16]uint64{} {
		t.Fatalf("after the transfers: %+v", got)
	}
	if got != want {
		t.Fatalf("through the service %+v, the device's %+v", got, want)
	}
	d.Close()
	if s := d.Stats(); s != (verbs.Stats{}) {
		t.Fatalf("after Close: %+v", s)
	}
}

// TestSRQClose: SRQ.Close (ibv_destroy_srq), embedded and through the
// service: ErrBusy while a QP uses the SRQ (and the PD is busy while the
// SRQ lives), then the SRQ is destroyed, its posted receives discarded,
// and every later use fails clearly. Through the service the handle is
// freed too: with a limit of one SRQ, another can be made after Close.
func TestSRQClose(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startService(t, p.a, service.Limits{SRQs: 1})
	for _, tc := range []struct {
		name string
		d    *verbs.Device
	}{{"embedded", p.a}, {"service", connectService(t, path)}} {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.d
			pd, err := d.AllocPD()
			if err != nil {
				t.Fatal(err)
			}
			cq, err := d.CreateCQ(16)
			if err != nil {
				t.Fatal(err)
			}
			defer cq.Close()
			mem, err := zerocopy.AllocShared("srq-close", 4096)
			if err != nil {
				t.Fatal(err)
			}
			defer mem.Close()
			mr, err := pd.RegMR(mem.Bytes(), verbs.AccessLocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			srq, err := pd.CreateSRQ(8, 1)
			if err != nil {
				t.Fatal(err)
			}
			if err := srq.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{mr.SGE(0, 1024)}}); err != nil {
				t.Fatal(err)
			}
			qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq, SRQ: srq})
			if err != nil {
				t.Fatal(err)
			}
			if err := srq.Close(); !errors.Is(err, verbs.ErrBusy) {
				t.Fatalf("closing an SRQ a QP uses: %v, want ErrBusy", err)
			}
			if err := qp.Close(); err != nil {
				t.Fatal(err)
			}
			if err := mr.Dereg(); err != nil {
				t.Fatal(err)
			}
			if err := pd.Close(); !errors.Is(err, verbs.ErrBusy) {
				t.Fatalf("closing a PD with an SRQ: %v, want ErrBusy", err)
			}
			if err := srq.Close(); err != nil {
				t.Fatalf("closing an unused SRQ: %v", err)
			}
			if err := srq.Close(); err != nil {
				t.Fatalf("closing it again: %v", err)
			}
			if err := srq.PostRecv(verbs.RecvWR{ID: 2}); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("PostRecv on a closed SRQ: %v, want net.ErrClosed", err)
			}
			if err := srq.SetLimit(1); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("SetLimit on a closed SRQ: %v, want net.ErrClosed", err)
			}
			if n := srq.Len(); n != 0 {
				t.Fatalf("a closed SRQ holds %d receives", n)
			}
			if _, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq, SRQ: srq}); !errors.Is(err, verbs.ErrInvalidArgument) {
				t.Fatalf("a QP on a closed SRQ: %v, want ErrInvalidArgument", err)
			}
			// The handle is free again (the service allows one SRQ).
			srq2, err := pd.CreateSRQ(8, 1)
			if err != nil {
				t.Fatalf("an SRQ after Close: %v", err)
			}
			if err := srq2.Close(); err != nil {
				t.Fatal(err)
			}
			if err := pd.Close(); err != nil {
				t.Fatalf("closing the PD once its SRQs are closed: %v", err)
			}
			if _, err := pd.CreateSRQ(8, 1); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("an SRQ on a closed PD: %v, want net.ErrClosed", err)
			}
		})
	}
}

// TestCreateQPOnClosedDevice: CreateQP on a device that is closed fails
// with net.ErrClosed and leaves nothing counted: the SRQ it named can
// still be closed.
func TestCreateQPOnClosedDevice(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	pd, err := p.a.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := p.a.CreateCQ(4)
	if err != nil {
		t.Fatal(err)
	}
	srq, err := pd.CreateSRQ(4, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq, SRQ: srq}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("CreateQP on a closed device: %v, want net.ErrClosed", err)
	}
	if err := srq.Close(); err != nil {
		t.Fatalf("closing the SRQ after the failed CreateQP: %v", err)
	}
}

// TestServiceCQSize: a CQ may have up to the device's max_cqe entries as
// the client sees it (Limits.MaxCQE), libfabric's ofi_rxm's 262,144
// among them; its ring is charged to the client's ring memory, so CQs
// that would hold more than Limits.RingBytes together are refused.
func TestServiceCQSize(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startService(t, p.a, service.Limits{RingBytes: 20 << 20})
	a := connectService(t, path)
	max := a.Query().MaxCQE
	if max != 1<<22 {
		t.Fatalf("max_cqe %d, want %d", max, 1<<22)
	}
	if _, err := a.CreateCQ(max + 1); !errors.Is(err, verbs.ErrInvalidArgument) {
		t.Fatalf("a CQ of max_cqe+1 entries: %v, want ErrInvalidArgument", err)
	}
	cq, err := a.CreateCQ(262144) // 8 MiB of ring
	if err != nil {
		t.Fatalf("a CQ of 262,144 entries: %v", err)
	}
	if _, err := a.CreateCQ(262144); err != nil {
		t.Fatalf("a second CQ of 262,144 entries: %v", err)
	}
	if _, err := a.CreateCQ(262144); !errors.Is(err, verbs.ErrLimit) {
		t.Fatalf("a third CQ of 262,144 entries beyond 20 MiB of ring memory: %v, want ErrLimit", err)
	}
	if _, err := a.CreateCQ(max); !errors.Is(err, verbs.ErrLimit) {
		t.Fatalf("a CQ of max_cqe entries (128 MiB) beyond the ring memory: %v, want ErrLimit", err)
	}
	cq.Close()
	if _, err := a.CreateCQ(262144); err != nil {
		t.Fatalf("a CQ once another was closed: %v", err)
	}
	b := connectService(t, path)
	if _, err := b.CreateCQ(262144); err != nil {
		t.Fatalf("another client's CQ: %v", err)
	}
}
