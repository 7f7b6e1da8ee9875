package verbs_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/internal/svc"
	"github.com/rdmatap/rdmatap/verbs/service"
	"github.com/rdmatap/rdmatap/zerocopy"
)

// killStateEnv makes TestServiceKillChild's process bring its session to
// one state and wait there to be killed.
const killStateEnv = "RDMATAP_SVC_KILL_STATE"

// The states TestServiceKilledInState kills a client in. (Killed while
// its memory is RDMA-Written by a peer, and in the middle of its own RDMA
// Writes: TestServiceClientDeath and TestServiceClientDeathTerminate.)
const (
	killPreHello   = "pre-hello"   // connected, no HELLO sent
	killGetRequest = "get-request" // a GET_REQUEST in progress on its listener
	killDial       = "dial"        // a DIAL waiting for the peer's MPA reply
	killListener   = "listener"    // a listener and nothing else
	killRings      = "rings"       // WRs queued on an idle QP and more waiting in its rings
)

// TestServiceKillChild is not a test of its own: TestServiceKilledInState
// runs the test binary again with this test selected to make a client
// process in a given state. It prints "child: ready" once there (with the
// port its listener has, if any) and waits to be killed.
func TestServiceKillChild(t *testing.T) {
	state := os.Getenv(killStateEnv)
	if state == "" {
		t.Skip("a client process of TestServiceKilledInState")
	}
	path := os.Getenv(childEnv)
	ctx := context.Background()
	ready := func(port uint64) {
		fmt.Printf("child: ready port=%d\n", port)
		select {} // until killed
	}
	switch state {
	case killPreHello:
		c, err := net.Dial("unixpacket", path)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ready(0)
	case killGetRequest:
		// By hand: the reply to a call sent after the GET_REQUEST shows
		// the service has taken the GET_REQUEST in (the reader dispatches
		// in order, a blocking call to a goroutine of its own).
		r, m := dialRaw(t, path, svc.Version)
		if m.Status() != svc.StatusOK {
			t.Fatalf("HELLO: status %d", m.Status())
		}
		m, _ = r.call(svc.TListen, []uint64{4, 0}, [][]byte{nil})
		if m.Status() != svc.StatusOK {
			t.Fatalf("LISTEN: status %d", m.Status())
		}
		port := m.Arg(1)
		r.seq++
		var b svc.Builder
		if err := svc.Write(r.conn, b.Reset(svc.TGetRequest, r.seq, 0).Args(m.Arg(0)).Msg()); err != nil {
			t.Fatal(err)
		}
		r.alive()
		ready(port)
	case killDial:
		d, err := verbs.Connect(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		pd, _ := d.AllocPD()
		cq, _ := d.CreateCQ(4)
		qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
		if err != nil {
			t.Fatal(err)
		}
		// The peer takes the request and never answers: the parent kills
		// this process while the service waits for the MPA reply.
		_, err = d.Dial(ctx, qp, netip.MustParseAddrPort(os.Getenv(childPeerEnv)), verbs.ConnParams{PrivateData: []byte("dying")})
		t.Fatalf("the dial ended before the process was killed: %v", err)
	case killListener:
		d, err := verbs.Connect(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		l, err := d.Listen(netip.AddrPort{}, verbs.ListenConfig{})
		if err != nil {
			t.Fatal(err)
		}
		ready(uint64(l.Addr().Port()))
	case killRings:
		d, err := verbs.Connect(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		pd, _ := d.AllocPD()
		cq, _ := d.CreateCQ(16)
		// Rings of 4 entries for queues of 3 WRs: of 4 WRs posted on an
		// idle QP the service queues 3 and the 4th waits in the ring for
		// room that never comes.
		qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: 3, MaxRecvWR: 3})
		if err != nil {
			t.Fatal(err)
		}
		mem, err := zerocopy.AllocShared("kill-rings", 64<<10)
		if err != nil {
			t.Fatal(err)
		}
		mr, err := pd.RegMR(mem.Bytes(), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		for i := uint64(1); i <= 4; i++ {
			if err := qp.PostSend(verbs.SendWR{ID: i, Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{mr.SGE(0, 4096)},
				RemoteAddr: 0x1000, RKey: 0x1234}); err != nil {
				t.Fatalf("post send %d: %v", i, err)
			}
			if err := qp.PostRecv(verbs.RecvWR{ID: 100 + i, SGL: []verbs.SGE{mr.SGE(4096*int(i), 4096)}}); err != nil {
				t.Fatalf("post receive %d: %v", i, err)
			}
		}
		// The service drains the rings before it serves any call.
		if _, err := d.AllocPD(); err != nil {
			t.Fatal(err)
		}
		ready(0)
	}
	t.Fatalf("unknown state %q", state)
}

// TestServiceKilledInState kills client processes (SIGKILL) in states the
// random kills of TestServiceClientDeath reach only by chance or not at
// all: before HELLO, with a GET_REQUEST in progress, with a DIAL waiting
// for the peer, holding a listener, with WRs queued and waiting in its
// rings. Each session must be released (the count of clients comes back),
// and what it held must be free again (its listening port, the peer's
// side of its dial); a client served throughout keeps working, and at
// the end descriptors, memfd mappings and goroutines are back at the
// baseline.
func TestServiceKilledInState(t *testing.T) {
	if os.Getenv(childEnv) != "" || os.Getenv(killStateEnv) != "" {
		t.Skip("in a child")
	}
	p := newPair(t, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	peerAddr := p.nb.Addrs()[0].Addr()
	var log syncBuffer
	path, srv := startServiceLog(t, p.a, &log)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The bystander, a client served throughout.
	by := connectService(t, path)
	bystander := func(t *testing.T) {
		t.Helper()
		pd, err := by.AllocPD()
		if err != nil {
			t.Fatalf("the bystander: %v", err)
		}
		defer pd.Close()
		cq, err := by.CreateCQ(8)
		if err != nil {
			t.Fatalf("the bystander: %v", err)
		}
		defer cq.Close()
		qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
		if err != nil {
			t.Fatalf("the bystander: %v", err)
		}
		defer qp.Close()
		mem, err := zerocopy.AllocShared("bystander", 64<<10)
		if err != nil {
			t.Fatal(err)
		}
		defer mem.Close()
		mr, err := pd.RegMR(mem.Bytes(), verbs.AccessLocalWrite)
		if err != nil {
			t.Fatalf("the bystander: %v", err)
		}
		if err := mr.Dereg(); err != nil {
			t.Fatalf("the bystander: %v", err)
		}
	}
	bystander(t)
	runOps(t, by, p.b, peerAddr, 1)
	const clients = 1 // the bystander
	settle := func() {
		runtime.GC() // the clients' rings go with their CQs and QPs
		time.Sleep(20 * time.Millisecond)
	}
	settle()
	base := countProc(t)

	run := func(t *testing.T, state string, env ...string) (*exec.Cmd, *syncBuffer) {
		t.Helper()
		cmd := exec.Command(exe, "-test.run=^TestServiceKillChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), append(env, childEnv+"="+path, killStateEnv+"="+state)...)
		out := &syncBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
		})
		return cmd, out
	}
	waitReady := func(t *testing.T, out *syncBuffer) uint16 {
		t.Helper()
		re := regexp.MustCompile(`child: ready port=(\d+)`)
		for ctx.Err() == nil {
			if m := re.FindStringSubmatch(out.String()); m != nil {
				port, _ := strconv.Atoi(m[1])
				return uint16(port)
			}
			if strings.Contains(out.String(), "--- FAIL") {
				t.Fatalf("the client process failed before it was killed:\n%s", out.String())
			}
			time.Sleep(time.Millisecond)
		}
		t.Fatalf("the client process never got ready:\n%s", out.String())
		return 0
	}
	kill := func(t *testing.T, cmd *exec.Cmd, out *syncBuffer) {
		t.Helper()
		cmd.Process.Kill()
		cmd.Wait()
		if strings.Contains(out.String(), "--- FAIL") {
			t.Fatalf("the client process failed before it was killed:\n%s", out.String())
		}
		deadline := time.Now().Add(15 * time.Second)
		for srv.Clients() != clients {
			if time.Now().After(deadline) {
				t.Fatalf("%d clients 15 s after the kill, want %d\nservice log:\n%s", srv.Clients(), clients, log.String())
			}
			time.Sleep(time.Millisecond)
		}
		bystander(t)
	}
	// listenBusy reports whether the bystander cannot listen on a port.
	listenBusy := func(t *testing.T, port uint16) bool {
		t.Helper()
		l, err := by.Listen(netip.AddrPortFrom(netip.Addr{}, port), verbs.ListenConfig{})
		if err != nil {
			return true
		}
		l.Close()
		return false
	}

	t.Run(killPreHello, func(t *testing.T) {
		cmd, out := run(t, killPreHello)
		waitReady(t, out)
		for deadline := time.Now().Add(10 * time.Second); srv.Clients() != clients+1; {
			if time.Now().After(deadline) {
				t.Fatalf("%d clients with one connected before HELLO, want %d", srv.Clients(), clients+1)
			}
			time.Sleep(time.Millisecond)
		}
		kill(t, cmd, out)
		// The session ended because its socket reached end of file, not
		// because the wait for HELLO ran out.
		for _, line := range strings.Split(log.String(), "\n") {
			if strings.Contains(line, "hello:") && strings.Contains(line, "timeout") {
				t.Fatalf("the session of a client killed before HELLO ended on the HELLO deadline: %s", line)
			}
		}
	})

	for _, state := range []string{killListener, killGetRequest} {
		t.Run(state, func(t *testing.T) {
			cmd, out := run(t, state)
			port := waitReady(t, out)
			if !listenBusy(t, port) {
				t.Fatalf("port %d is free while the client listens on it", port)
			}
			kill(t, cmd, out)
			if listenBusy(t, port) {
				t.Fatalf("port %d is still taken after its listener's client was killed", port)
			}
		})
	}

	t.Run(killDial, func(t *testing.T) {
		l, err := p.b.Listen(netip.AddrPort{}, verbs.ListenConfig{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		cmd, out := run(t, killDial, childPeerEnv+"="+netip.AddrPortFrom(peerAddr, l.Addr().Port()).String())
		// The dial's MPA Request has arrived: the service waits for the
		// reply now.
		req, err := l.GetRequest(ctx)
		if err != nil {
			t.Fatalf("no connection request: %v\n%s", err, out.String())
		}
		if string(req.PrivateData()) != "dying" {
			t.Fatalf("private data %q", req.PrivateData())
		}
		kill(t, cmd, out)
		// The service gave the connection up: accepting it now fails,
		// or the connection ends at once.
		pd, err := p.b.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		defer pd.Close()
		cq, err := p.b.CreateCQ(4)
		if err != nil {
			t.Fatal(err)
		}
		defer cq.Close()
		qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
		if err != nil {
			t.Fatal(err)
		}
		defer qp.Close()
		actx, acancel := context.WithTimeout(ctx, 10*time.Second)
		defer acancel()
		if _, err := req.Accept(actx, qp, verbs.ConnParams{}); err != nil {
			t.Logf("accepting the killed client's request: %v", err)
			return
		}
		select {
		case <-qp.Done():
			t.Logf("the accepted connection ended: %v", qp.Err())
		case <-actx.Done():
			t.Fatal("the killed client's connection was accepted and stays up")
		}
	})

	t.Run(killRings, func(t *testing.T) {
		cmd, out := run(t, killRings)
		waitReady(t, out)
		kill(t, cmd, out)
	})

	// The bystander's data path, and nothing left of the killed clients.
	runOps(t, by, p.b, peerAddr, 2)
	var now procCounts
	for deadline := time.Now().Add(15 * time.Second); ; {
		settle()
		now = countProc(t)
		if now.fds <= base.fds && now.memfdMaps <= base.memfdMaps && now.goroutines <= base.goroutines {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not back at the baseline: descriptors %d (base %d), memfd mappings %d (base %d), goroutines %d (base %d)\n%s",
				now.fds, base.fds, now.memfdMaps, base.memfdMaps, now.goroutines, base.goroutines, allStacks())
		}
	}
}

// startServiceLog is startService with the service's log kept in log as
// well as the test's.
func startServiceLog(t *testing.T, d *verbs.Device, log *syncBuffer) (string, *service.Server) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rt0.sock")
	ln, err := service.ListenSocket(path, -1)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := service.Serve(d, ln, service.Config{Logf: func(format string, args ...any) {
		fmt.Fprintf(log, format+"\n", args...)
		t.Logf(format, args...)
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return path, srv
}
