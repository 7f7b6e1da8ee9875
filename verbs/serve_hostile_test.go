package verbs_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
	"github.com/rdmatap/rdmatap/verbs/service"
	"github.com/rdmatap/rdmatap/zerocopy"
)

// rawClient speaks the service's socket protocol by hand, to say what
// verbs.Connect never would.
type rawClient struct {
	t    testing.TB
	conn *net.UnixConn
	buf  []byte
	oob  []byte
	seq  uint32
	ctl  []byte
	bell *svc.Eventfd
}

func dialRaw(t testing.TB, path string, version uint64) (*rawClient, svc.Msg) {
	t.Helper()
	return dialRawHello(t, path, version, 0)
}

// dialRawFeatures is dialRaw of this version asking for features.
func dialRawFeatures(t testing.TB, path string, features uint64) (*rawClient, svc.Msg) {
	t.Helper()
	return dialRawHello(t, path, svc.Version, features)
}

func dialRawHello(t testing.TB, path string, version, features uint64) (*rawClient, svc.Msg) {
	t.Helper()
	c, err := net.Dial("unixpacket", path)
	if err != nil {
		t.Fatal(err)
	}
	r := &rawClient{t: t, conn: c.(*net.UnixConn), buf: make([]byte, svc.MaxMessage), oob: make([]byte, svc.OOBSpace)}
	t.Cleanup(func() { r.conn.Close() })
	var b svc.Builder
	b.Reset(svc.THello, 0, 0).Args(svc.Magic, version)
	if features != 0 {
		b.Args(features)
	}
	if err := svc.Write(r.conn, b.Msg()); err != nil {
		t.Fatal(err)
	}
	m, fds := r.read()
	if len(fds) == 2 {
		r.ctl, _ = svc.MapRing(fds[0])
		unix.Close(fds[0])
		r.bell, _ = svc.OpenEventfd(fds[1])
		t.Cleanup(func() { r.bell.Close() })
	}
	return r, m
}

// read returns the next message (with a deadline) and its descriptors.
func (r *rawClient) read() (svc.Msg, []int) {
	r.t.Helper()
	r.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	m, fds, err := svc.Read(r.conn, r.buf, r.oob, nil)
	if err != nil {
		r.t.Fatalf("reading from the service: %v", err)
	}
	if err := m.Check(); err != nil {
		r.t.Fatalf("service sent a malformed message: %v", err)
	}
	return append(svc.Msg(nil), m...), fds
}

// call sends a request and returns its reply, skipping events.
func (r *rawClient) call(t svc.Type, args []uint64, payload [][]byte, fds ...int) (svc.Msg, []int) {
	r.t.Helper()
	r.seq++
	var b svc.Builder
	b.Reset(t, r.seq, 0).Args(args...)
	for _, p := range payload {
		b.Bytes(p)
	}
	return r.send(b.Msg(), r.seq, fds...)
}

// send writes raw bytes and waits for the reply numbered seq.
func (r *rawClient) send(m []byte, seq uint32, fds ...int) (svc.Msg, []int) {
	r.t.Helper()
	if err := svc.Write(r.conn, m, fds...); err != nil {
		r.t.Fatal(err)
	}
	for {
		rep, rfds := r.read()
		if rep.Type() != svc.TEvent && rep.Type() != svc.TQPDone && rep.Seq() == seq {
			return rep, rfds
		}
		for _, fd := range rfds {
			unix.Close(fd)
		}
	}
}

// alive checks that the session still answers.
func (r *rawClient) alive() uint64 {
	r.t.Helper()
	m, _ := r.call(svc.TAllocPD, nil, nil)
	if m.Status() != svc.StatusOK {
		r.t.Fatalf("ALLOC_PD after the bad request: status %d", m.Status())
	}
	return m.Arg(0)
}

func TestServiceVersionMismatch(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startService(t, p.a, service.Limits{})
	_, m := dialRaw(t, path, svc.Version+1)
	if m.Status() != svc.StatusVersion {
		t.Fatalf("HELLO of version %d: status %d", svc.Version+1, m.Status())
	}
	var f [1][]byte
	svc.Fields(m.Payload(), f[:])
	if want := fmt.Sprintf("protocol version mismatch: service speaks %d, client %d", svc.Version, svc.Version+1); string(f[0]) != want || m.Arg(0) != svc.Version {
		t.Fatalf("refusal %q names version %d", f[0], m.Arg(0))
	}
	// The right version is welcome.
	if _, m := dialRaw(t, path, svc.Version); m.Status() != svc.StatusOK {
		t.Fatalf("HELLO of version %d: status %d", svc.Version, m.Status())
	}
}

// TestServiceMalformedMessages: each malformed or hostile request gets an
// error reply and the session goes on.
func TestServiceMalformedMessages(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	path, _ := startService(t, p.a, service.Limits{MRBytes: 1 << 20})
	r, _ := dialRaw(t, path, svc.Version)
	pd := r.alive()
	expectErr := func(what string, m svc.Msg, want uint32) {
		t.Helper()
		if m.Status() == svc.StatusOK || (want != 0 && m.Status() != want) {
			t.Errorf("%s: status %d, want %d", what, m.Status(), want)
		}
		r.alive()
	}
	// Bad framing: a header claiming a longer payload, a set reserved
	// byte, an unknown type.
	var b svc.Builder
	bad := append(svc.Msg(nil), b.Reset(svc.TAllocPD, 0, 0).Args(1).Msg()...)
	bad[12] = 9
	m, _ := r.send(bad, 0)
	expectErr("payload length beyond the datagram", m, svc.StatusInvalidArgument)
	bad = append(svc.Msg(nil), b.Reset(svc.TAllocPD, 0, 0).Msg()...)
	bad[0] = 200
	m, _ = r.send(bad, 0)
	expectErr("unknown type", m, svc.StatusInvalidArgument)
	m, _ = r.send([]byte{1, 2, 3}, 0)
	expectErr("3-byte datagram", m, svc.StatusInvalidArgument)
	m, _ = r.send(make([]byte, 3*svc.MaxMessage), 0)
	expectErr("datagram longer than any message", m, svc.StatusInvalidArgument)
	fds := make([]int, svc.MaxFDs+2)
	for i := range fds {
		fds[i], _ = unix.Eventfd(0, unix.EFD_CLOEXEC)
		defer unix.Close(fds[i])
	}
	m, _ = r.send(b.Reset(svc.TAllocPD, 0, 0).Msg(), 0, fds...)
	expectErr("six descriptors", m, svc.StatusInvalidArgument)
	// Handles that name nothing.
	m, _ = r.call(svc.TDestroyQP, []uint64{12345}, nil)
	expectErr("DESTROY_QP of no QP", m, svc.StatusInvalidArgument)
	m, _ = r.call(svc.TCreateQP, []uint64{pd, 77, 78, 0, 16, 16, 1, 1, 0, 0}, nil)
	expectErr("CREATE_QP with CQs that do not exist", m, svc.StatusInvalidArgument)
	// REG_MR: no descriptor; a memfd not sealed against shrinking; a
	// range beyond the file; more than the client's MR byte limit.
	m, _ = r.call(svc.TRegMR, []uint64{pd, 0x1000, 4096, uint64(verbs.AccessLocalWrite), 0}, nil)
	expectErr("REG_MR without a descriptor", m, svc.StatusInvalidArgument)
	fd, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	unix.Ftruncate(fd, 8192)
	m, _ = r.call(svc.TRegMR, []uint64{pd, 0x1000, 4096, uint64(verbs.AccessLocalWrite), 0}, nil, fd)
	expectErr("REG_MR of an unsealed memfd", m, svc.StatusInvalidArgument)
	mem, err := zerocopy.AllocShared("hostile", 8192)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	m, _ = r.call(svc.TRegMR, []uint64{pd, 0x1000, 8192, uint64(verbs.AccessLocalWrite), 4096}, nil, mem.Fd())
	expectErr("REG_MR beyond the file", m, svc.StatusInvalidArgument)
	big, err := zerocopy.AllocShared("big", 2<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close()
	m, _ = r.call(svc.TRegMR, []uint64{pd, 0x1000, 2 << 20, uint64(verbs.AccessLocalWrite), 0}, nil, big.Fd())
	expectErr("REG_MR over the MR byte limit", m, svc.StatusLimit)
	m, _ = r.call(svc.TRegMR, []uint64{pd, 0x1000, 8192, uint64(verbs.AccessLocalWrite), 0}, nil, mem.Fd())
	if m.Status() != svc.StatusOK {
		t.Fatalf("a good REG_MR: status %d", m.Status())
	}
	// Requests the client may not send, and unasked descriptors.
	m, _ = r.call(svc.TQPDone, []uint64{1}, nil)
	expectErr("QP_DONE from a client", m, svc.StatusInvalidArgument)
	m, _ = r.call(svc.TAllocPD, nil, nil, mem.Fd())
	expectErr("ALLOC_PD with a descriptor", m, svc.StatusInvalidArgument)
}

// TestServiceIsolation: a client cannot use another client's objects or
// memory, and a client that corrupts its ring loses only its own session.
func TestServiceIsolation(t *testing.T) {
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	peerAddr := p.nb.Addrs()[0].Addr()
	path, srv := startService(t, p.a, service.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sink, err := p.b.Listen(netip.AddrPort{}, verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); sinkPeer(ctx, p.b, sink) }()
	defer wg.Wait()
	defer cancel()
	sinkAddr := netip.AddrPortFrom(peerAddr, sink.Addr().Port())

	// Client A: an MR with a known pattern and a QP.
	a := connectService(t, path)
	apd, _ := a.AllocPD()
	amem, _ := zerocopy.AllocShared("a", 1<<20)
	defer amem.Close()
	for i := range amem.Bytes() {
		amem.Bytes()[i] = 0xAA
	}
	amr, err := apd.RegMR(amem.Bytes(), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	acq, _ := a.CreateCQ(16)
	aqp, err := apd.CreateQP(verbs.QPConfig{SendCQ: acq, RecvCQ: acq})
	if err != nil {
		t.Fatal(err)
	}

	// Client B, connected to the sink, names A's STag and addresses.
	b := connectService(t, path)
	bpd, _ := b.AllocPD()
	bmem, _ := zerocopy.AllocShared("b", 1<<20)
	defer bmem.Close()
	bmr, err := bpd.RegMR(bmem.Bytes(), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	bcq, _ := b.CreateCQ(16)
	bqp, err := bpd.CreateQP(verbs.QPConfig{SendCQ: bcq, RecvCQ: bcq})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := b.Dial(ctx, bqp, sinkAddr, verbs.ConnParams{})
	if err != nil {
		t.Fatal(err)
	}
	var peer verbs.RemoteBuf
	peer.UnmarshalBinary(conn.PeerPrivateData())
	// An RDMA Read whose sink is A's memory: the service must not write it.
	if err := bqp.PostSend(verbs.SendWR{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{amr.SGE(0, 4096)},
		RemoteAddr: peer.Addr, RKey: peer.RKey}); err != nil {
		t.Fatal(err)
	}
	wc, err := waitWC(ctx, bcq, verbs.WCRead, -1)
	if wc.Status != verbs.StatusLocalProtection {
		t.Fatalf("RDMA Read into another client's MR: %v (%v)", wc.Status, err)
	}
	for i, c := range amem.Bytes()[:4096] {
		if c != 0xAA {
			t.Fatalf("another client's RDMA Read wrote A's byte %d", i)
		}
	}
	// B's QP is in ERROR now; a second B QP tries its own STag beyond
	// its region: the service reads nothing outside it.
	bqp.Close()
	bqp2, _ := bpd.CreateQP(verbs.QPConfig{SendCQ: bcq, RecvCQ: bcq})
	if _, err := b.Dial(ctx, bqp2, sinkAddr, verbs.ConnParams{}); err != nil {
		t.Fatal(err)
	}
	drain := make([]verbs.WC, 16)
	bcq.Poll(drain)
	out := bmr.SGE(0, 4096)
	out.Addr += 1 << 20 // just past B's region
	if err := bqp2.PostSend(verbs.SendWR{ID: 2, Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{out},
		RemoteAddr: peer.Addr, RKey: peer.RKey}); err != nil {
		t.Fatal(err)
	}
	if wc, err := waitWC(ctx, bcq, verbs.WCWrite, -1); wc.Status != verbs.StatusLocalProtection {
		t.Fatalf("RDMA Write from beyond the client's MR: %v (%v)", wc.Status, err)
	}

	// A raw client: A's QP number names nothing in its session.
	r, _ := dialRaw(t, path, svc.Version)
	m, _ := r.call(svc.TDestroyQP, []uint64{uint64(aqp.Num())}, nil)
	if m.Status() != svc.StatusInvalidArgument {
		t.Fatalf("DESTROY_QP of another client's QP: status %d", m.Status())
	}
	if st := aqp.State(); st != verbs.QPIdle {
		t.Fatalf("A's QP is %v after another client's DESTROY_QP", st)
	}
	// The raw client corrupts its SQ ring's producer index: its session
	// ends, nobody else's.
	pd := r.alive()
	m, fds := r.call(svc.TCreateCQ, []uint64{16}, nil)
	if m.Status() != svc.StatusOK {
		t.Fatal(m.Status())
	}
	cqh := m.Arg(0)
	for _, fd := range fds {
		unix.Close(fd)
	}
	m, fds = r.call(svc.TCreateQP, []uint64{pd, cqh, cqh, 0, 16, 16, 1, 1, 0, 0}, nil)
	if m.Status() != svc.StatusOK || len(fds) != 1 {
		t.Fatalf("CREATE_QP: status %d, %d fds", m.Status(), len(fds))
	}
	ring, err := svc.MapRing(fds[0])
	unix.Close(fds[0])
	if err != nil {
		t.Fatal(err)
	}
	sq, err := svc.OpenRing(ring[:m.Arg(1)])
	if err != nil {
		t.Fatal(err)
	}
	// First a malformed entry (a REG_MR naming no MR of the client): an
	// error completion, the session lives.
	e := sq.Entry(0)
	svc.PutSend(e, &iwarp.SendWR{ID: 99, Op: iwarp.WRSend}, 0)
	e[8] = byte(iwarp.WRRegMR)
	sq.Prod.Store(1)
	bell(t, r)
	r.alive()
	// Then an index a million entries ahead.
	sq.Prod.Store(1 << 20)
	bell(t, r)
	r.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		_, fds, err := svc.Read(r.conn, r.buf, r.oob, nil)
		for _, fd := range fds {
			unix.Close(fd)
		}
		if errors.Is(err, net.ErrClosed) {
			break
		}
		if err != nil {
			t.Fatalf("waiting for the service to end the hostile session: %v", err)
		}
	}
	svc.Unmap(ring)
	// A and B are still served.
	if st := aqp.State(); st != verbs.QPIdle {
		t.Fatalf("A's QP is %v", st)
	}
	runOps(t, a, p.b, peerAddr, 7)
	if n := srv.Clients(); n != 2 {
		t.Errorf("%d clients served, want A and B", n)
	}
}

// bell rings the service's doorbell, as a client does when the poller
// sleeps.
func bell(t testing.TB, r *rawClient) {
	r.bell.Signal()
	time.Sleep(5 * time.Millisecond)
}

// fuzzService is one service for every input of FuzzServiceRequest (it
// lives as long as the fuzzing process).
var fuzzService struct {
	once sync.Once
	path string
	srv  *service.Server
	err  error
	fds  int // descriptors with the service idle
}

// FuzzServiceRequest sends one arbitrary datagram (after a proper HELLO)
// and checks that the service still answers the same client. Whatever the
// bytes claim — handles, sizes, addresses, types — the service must
// neither crash nor stop serving.
func FuzzServiceRequest(f *testing.F) {
	var b svc.Builder
	for _, m := range []svc.Msg{
		b.Reset(svc.TAllocPD, 1, 0).Msg(),
		b.Reset(svc.TCreateCQ, 2, 0).Args(16).Msg(),
		b.Reset(svc.TCreateQP, 3, 0).Args(1, 1, 1, 0, 16, 16, 1, 1, 0, 0).Msg(),
		b.Reset(svc.TCreateSRQ, 4, 0).Args(1, 16, 1).Msg(),
		b.Reset(svc.TListen, 5, 0).Args(4, 0).String("0.0.0.0:0").Msg(),
		b.Reset(svc.TGetRequest, 6, 0).Args(1).Msg(),
		b.Reset(svc.TDial, 7, 0).Args(16, 0, 0, 0, 0, 0, 0, 0).String("10.0.0.2:9").Bytes(nil).Msg(),
		b.Reset(svc.TDeregMR, 8, 0).Args(1).Msg(),
		b.Reset(svc.TCancel, 9, 0).Args(6).Msg(),
		b.Reset(svc.TReject, 10, 0).Args(1).Bytes([]byte("no")).Msg(),
		b.Reset(svc.TRegMR, 11, 0).Args(1, 0x10000, 4096, uint64(verbs.AccessMWBind), 0, 1<<40).Msg(),
		b.Reset(svc.TAllocMR, 12, 0).Args(1, 16).Msg(),
		b.Reset(svc.TMapMR, 13, 0).Args(2, svc.MapPages|svc.MapFirst|svc.MapLast, 4096, 0, 4096).Bytes(make([]byte, svc.MapEntrySize)).Msg(),
		b.Reset(svc.TMapMR, 14, 0).Args(2, svc.MapSG|svc.MapFirst, 512, 0, 0).Bytes(make([]byte, 2*svc.MapEntrySize)).Msg(),
		b.Reset(svc.TSetIOVA, 15, 0).Args(2, 1<<63).Msg(),
		b.Reset(svc.TAllocMW, 16, 0).Args(1, 2).Msg(),
		b.Reset(svc.TBindMW, 17, 0).Args(1, 3, 7, 1, 0x100, 0, 4096, 2).Msg(),
		b.Reset(svc.TQueryMem, 18, 0).Args(2).Msg(),
		b.Reset(svc.TDeallocMW, 19, 0).Args(3).Msg(),
		b.Reset(svc.TStats, 20, 0).Msg(),
		b.Reset(svc.TQueryPort, 21, 0).Args(1).Msg(),
		b.Reset(svc.TQPError, 22, 0).Args(17).Msg(),
		b.Reset(svc.TDial, 23, 0).Args(17, 0, 0, 0, 0, 0, 0, 0).String("10.0.0.2:9").Bytes(nil).String(":31337").Msg(),
		b.Reset(svc.TDial, 24, 0).Args(17, 0, 0, 0, 0, 0, 0, 0).String("10.0.0.2:9").Bytes(nil).String("[::1]:80").Msg(),
	} {
		f.Add([]byte(m))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzService.once.Do(func() {
			na, nb, err := netstack.NewPair(netstack.PairConfig{Link: testLink})
			if err != nil {
				fuzzService.err = err
				return
			}
			_ = nb
			d, err := verbs.Open(na, verbs.DeviceConfig{})
			if err != nil {
				fuzzService.err = err
				return
			}
			dir, err := os.MkdirTemp("", "rdmatap-fuzz")
			if err != nil {
				fuzzService.err = err
				return
			}
			fuzzService.path = filepath.Join(dir, "rt0.sock")
			ln, err := service.ListenSocket(fuzzService.path, -1)
			if err != nil {
				fuzzService.err = err
				return
			}
			fuzzService.srv, fuzzService.err = service.Serve(d, ln, service.Config{})
			ents, _ := os.ReadDir("/proc/self/fd")
			fuzzService.fds = len(ents)
		})
		if fuzzService.err != nil {
			t.Fatal(fuzzService.err)
		}
		r, m := dialRaw(t, fuzzService.path, svc.Version)
		if m.Status() != svc.StatusOK {
			t.Fatalf("HELLO: %d", m.Status())
		}
		if len(data) > svc.MaxMessage {
			data = data[:svc.MaxMessage]
		}
		if len(data) == 0 {
			// On SOCK_SEQPACKET an empty datagram reads as end of file:
			// the service ends that session, as for a client gone.
			return
		}
		if len(data) >= 8 {
			// Its reply must not pass for the one alive waits for.
			data = append([]byte(nil), data...)
			copy(data[4:8], []byte{0, 0, 0, 0})
		}
		if err := svc.Write(r.conn, data); err != nil {
			t.Fatal(err)
		}
		// A request numbered beyond anything the input can name.
		r.seq = 1 << 31
		r.alive()
		// Once the client has gone, the session has released everything.
		r.conn.Close()
		deadline := time.Now().Add(5 * time.Second)
		for fuzzService.srv.Clients() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%d sessions still open 5 s after their client left", fuzzService.srv.Clients())
			}
			time.Sleep(100 * time.Microsecond)
		}
		// (the test's own descriptors: the ring mapping's and the bell)
		if ents, _ := os.ReadDir("/proc/self/fd"); len(ents) > fuzzService.fds+4 {
			t.Fatalf("%d descriptors open, %d with the service idle", len(ents), fuzzService.fds)
		}
	})
}

// FuzzServiceRing writes arbitrary bytes into a raw client's send and
// receive ring entries (and arbitrary producer indexes) for a QP not yet
// connected (the engine queues and checks what the service posts), rings
// the doorbell, and checks that the service still serves
// the client, or has ended that client's session alone, and never
// crashes.
func FuzzServiceRing(f *testing.F) {
	e := make([]byte, svc.SendEntrySize(1))
	svc.PutSend(e, &iwarp.SendWR{ID: 1, Op: iwarp.WRWrite, SGL: []iwarp.SGE{{Addr: 0x1000, Length: 8, LKey: 0x100}}, RemoteAddr: 1, RKey: 2}, 0)
	f.Add(e, []byte{1, 2, 3}, uint32(1), uint32(1))
	f.Add(e, e, uint32(1<<31), uint32(2))
	for _, wr := range []iwarp.SendWR{
		{ID: 2, Op: iwarp.WRRegMR, RKey: 0x101, Access: iwarp.AccessLocalWrite},
		{ID: 3, Op: iwarp.WRBindMW, RKey: 0x202, Bind: iwarp.MWBind{MR: 0x303, Length: 8, Access: iwarp.AccessRemoteRead}},
		{ID: 4, Op: iwarp.WRLocalInv, InvalidateRKey: 0x404},
	} {
		e := make([]byte, svc.SendEntrySize(1))
		svc.PutSend(e, &wr, 1)
		f.Add(e, []byte{}, uint32(1), uint32(0))
	}
	for _, n := range []int{0, 8, 16, 17} {
		// Inline data in the entry (16 bytes of room beyond its header).
		e := make([]byte, svc.SendEntrySize(1))
		svc.PutSendData(e, &iwarp.SendWR{ID: 5, Op: iwarp.WRSend}, make([]byte, min(n, 16)))
		if n > 16 {
			binary.LittleEndian.PutUint32(e[12:], uint32(n))
		}
		f.Add(e, []byte{}, uint32(1), uint32(0))
	}
	f.Fuzz(func(t *testing.T, sqEntry, rqEntry []byte, sqProd, rqProd uint32) {
		fuzzRingService(t)
		r, m := dialRaw(t, fuzzRing.path, svc.Version)
		if m.Status() != svc.StatusOK {
			t.Fatalf("HELLO: %d", m.Status())
		}
		pd := r.alive()
		m, fds := r.call(svc.TCreateCQ, []uint64{16}, nil)
		for _, fd := range fds {
			unix.Close(fd)
		}
		cq := m.Arg(0)
		m, fds = r.call(svc.TCreateQP, []uint64{pd, cq, cq, 0, 4, 4, 1, 1, 0, 0}, nil)
		if m.Status() != svc.StatusOK || len(fds) != 1 {
			t.Fatalf("CREATE_QP: %d", m.Status())
		}
		mem, err := svc.MapRing(fds[0])
		unix.Close(fds[0])
		if err != nil {
			t.Fatal(err)
		}
		defer svc.Unmap(mem)
		sq, err := svc.OpenRing(mem[:m.Arg(1)])
		if err != nil {
			t.Fatal(err)
		}
		rq, err := svc.OpenRing(mem[m.Arg(1):])
		if err != nil {
			t.Fatal(err)
		}
		for i := uint32(0); i < uint32(sq.Cap()); i++ {
			copy(sq.Entry(i), sqEntry)
		}
		for i := uint32(0); i < uint32(rq.Cap()); i++ {
			copy(rq.Entry(i), rqEntry)
		}
		rq.Prod.Store(rqProd % 8)
		sq.Prod.Store(sqProd)
		r.bell.Signal()
		// Either the session still answers, or it has been ended (an
		// index out of range); the service goes on either way.
		r.seq++
		var b svc.Builder
		svc.Write(r.conn, b.Reset(svc.TAllocPD, r.seq, 0).Msg())
		r.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		for {
			m, fds, err := svc.Read(r.conn, r.buf, r.oob, nil)
			for _, fd := range fds {
				unix.Close(fd)
			}
			if errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) {
				break // ended (with our request unread: a reset)
			}
			if err != nil {
				t.Fatalf("the service neither answered nor ended the session: %v", err)
			}
			if m.Check() == nil && m.Type() == svc.TAllocPD && m.Seq() == r.seq {
				break
			}
		}
		// Another client is served.
		r2, m := dialRaw(t, fuzzRing.path, svc.Version)
		if m.Status() != svc.StatusOK {
			t.Fatalf("another client's HELLO: %d", m.Status())
		}
		r2.alive()
		// Both sessions end once their clients go.
		r.conn.Close()
		r2.conn.Close()
		deadline := time.Now().Add(5 * time.Second)
		for fuzzRing.srv.Clients() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%d sessions still open 5 s after their clients left", fuzzRing.srv.Clients())
			}
			time.Sleep(100 * time.Microsecond)
		}
	})
}

var fuzzRing struct {
	path string
	srv  *service.Server
}

func fuzzRingService(t *testing.T) {
	if fuzzRing.path != "" {
		return
	}
	na, _, err := netstack.NewPair(netstack.PairConfig{Link: testLink})
	if err != nil {
		t.Fatal(err)
	}
	d, err := verbs.Open(na, verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "rdmatap-fuzz")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "rt0.sock")
	ln, err := service.ListenSocket(path, -1)
	if err != nil {
		t.Fatal(err)
	}
	if fuzzRing.srv, err = service.Serve(d, ln, service.Config{}); err != nil {
		t.Fatal(err)
	}
	fuzzRing.path = path
}
