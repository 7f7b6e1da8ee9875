package daemon

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/zerocopy"
)

func TestServiceFlags(t *testing.T) {
	for _, bad := range [][]string{
		{"--socket-group", "0"},
		{"--socket", "/tmp/x.sock", "--client-qps", "0"},
		{"--socket", "/tmp/x.sock", "--client-mr-bytes", "lots"},
		{"--socket", "/tmp/x.sock", "--client-fr-pages", "0"},
		{"--socket", "/tmp/x.sock", "--client-fr-pages", "many"},
		{"--socket", "/tmp/x.sock", "--socket-group", "no-such-group-rdmatap"},
		{"--socket", "/tmp/x.sock", "--client-memory", "0"},
		{"--socket", "/tmp/x.sock", "--client-memory", "much"},
		{"--socket", "/tmp/x.sock", "--max-clients-per-user", "0"},
		{"--socket", "/tmp/x.sock", "--max-clients", "8", "--max-clients-per-user", "9"},
		{"--socket", "/tmp/x.sock", "--max-pending-per-user", "65"},
	} {
		args := append([]string{"up", "--tap", "rtsvcx0", "--addr", "10.77.9.1/24"}, bad...)
		var out, errOut bytes.Buffer
		if code := cli.Run(args, &out, &errOut); code != 2 {
			t.Errorf("%q: exit %d, want 2 (%s)", args, code, errOut.String())
		}
	}
	f := serviceFlags{socket: "/x", mrBytes: "3M", ring: "5K", mrs: 6, qps: 2, cqs: 3, conns: 4, frPages: 7, group: "0",
		memory: "9M", clients: 10, perUser: 5, pending: 2}
	lim, gid, err := f.check()
	if err != nil || lim.MRBytes != 3<<20 || lim.RingBytes != 5<<10 || lim.MRs != 6 || lim.QPs != 2 || lim.CQs != 3 || lim.Conns != 4 ||
		lim.FRPages != 7 || lim.Memory != 9<<20 || gid != 0 {
		t.Fatalf("%+v %d %v", lim, gid, err)
	}
	// The flag reaches the limits; its default is service.Limits' default.
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	var g serviceFlags
	g.register(fs)
	if err := fs.Parse([]string{"--socket", "/x", "--client-fr-pages", "512"}); err != nil {
		t.Fatal(err)
	}
	if lim, _, err := g.check(); err != nil || lim.FRPages != 512 {
		t.Fatalf("--client-fr-pages 512: %+v %v", lim, err)
	}
	fs = flag.NewFlagSet("up", flag.ContinueOnError)
	g = serviceFlags{}
	g.register(fs)
	if err := fs.Parse([]string{"--socket", "/x"}); err != nil {
		t.Fatal(err)
	}
	if lim, _, err := g.check(); err != nil || lim.FRPages != 1<<20 {
		t.Fatalf("default: %+v %v", lim, err)
	}
}

// upChildEnv makes the test binary run `rdmatap up` with the arguments
// in the variable (separated by spaces) instead of the tests.
const upChildEnv = "RDMATAP_UP_CHILD"

func TestMain(m *testing.M) {
	if a := os.Getenv(upChildEnv); a != "" {
		os.Exit(cli.Run(strings.Fields(a), os.Stdout, os.Stderr))
	}
	if a := os.Getenv(svcClientEnv); a != "" {
		if err := serviceClient(strings.Fields(a)); err != nil {
			fmt.Fprintln(os.Stderr, "client:", err)
			os.Exit(1)
		}
		fmt.Println("client: ok")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// svcClientEnv makes the test binary a client of a service: "SOCKET
// listen ADDR" or "SOCKET dial ADDR:PORT".
const svcClientEnv = "RDMATAP_SVC_CLIENT"

// serviceClient is one side of a Send and an RDMA Write between two
// clients of the same service.
func serviceClient(args []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d, err := verbs.Connect(ctx, args[0])
	if err != nil {
		return err
	}
	defer d.Close()
	pd, err := d.AllocPD()
	if err != nil {
		return err
	}
	cq, err := d.CreateCQ(16)
	if err != nil {
		return err
	}
	qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		return err
	}
	mem, err := zerocopy.AllocShared("client", 1<<20)
	if err != nil {
		return err
	}
	mr, err := pd.RegMR(mem.Bytes(), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		return err
	}
	var wc [1]verbs.WC
	switch args[1] {
	case "listen":
		l, err := d.Listen(netip.MustParseAddrPort(args[2]), verbs.ListenConfig{})
		if err != nil {
			return err
		}
		fmt.Printf("listening %v\n", l.Addr())
		if err := qp.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{mr.SGE(0, 64)}}); err != nil {
			return err
		}
		pdata, _ := mr.Remote().MarshalBinary()
		req, err := l.GetRequest(ctx)
		if err != nil {
			return err
		}
		if _, err := req.Accept(ctx, qp, verbs.ConnParams{PrivateData: pdata}); err != nil {
			return err
		}
		if _, err := cq.Wait(ctx, wc[:]); err != nil || wc[0].Err() != nil {
			return fmt.Errorf("receive: %v %v", err, wc[0].Err())
		}
		// The Send says the Write before it has landed.
		if string(mem.Bytes()[:wc[0].ByteLen]) != "written" || !bytes.Equal(mem.Bytes()[4096:4096+5], []byte("hello")) {
			return fmt.Errorf("got %q and %q", mem.Bytes()[:wc[0].ByteLen], mem.Bytes()[4096:4096+5])
		}
	case "dial":
		conn, err := d.Dial(ctx, qp, netip.MustParseAddrPort(args[2]), verbs.ConnParams{})
		if err != nil {
			return err
		}
		var rb verbs.RemoteBuf
		if err := rb.UnmarshalBinary(conn.PeerPrivateData()); err != nil {
			return err
		}
		copy(mem.Bytes(), "hello")
		copy(mem.Bytes()[64:], "written")
		if err := qp.PostSend(
			verbs.SendWR{Op: verbs.OpWrite, SGL: []verbs.SGE{mr.SGE(0, 5)}, RemoteAddr: rb.Addr + 4096, RKey: rb.RKey},
			verbs.SendWR{Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{mr.SGE(64, 7)}}); err != nil {
			return err
		}
		if _, err := cq.Wait(ctx, wc[:]); err != nil || wc[0].Err() != nil {
			return fmt.Errorf("send: %v %v", err, wc[0].Err())
		}
	}
	return nil
}

// TestUpServesUnprivilegedClients runs `rdmatap up --socket` on a TAP
// and two client processes without privileges (setpriv to nobody, in the
// socket's group) that connect through it to each other and do an RDMA
// Write and a Send.
func TestUpServesUnprivilegedClients(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root to create a TAP device and to drop privileges with setpriv")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("skipping: setpriv not found")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// nobody must be able to run the test binary and reach the socket.
	dir, err := os.MkdirTemp("", "rdmatap-up")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "rdmatap.test")
	if data, err := os.ReadFile(exe); err != nil || os.WriteFile(bin, data, 0o755) != nil {
		t.Fatalf("copying the test binary: %v", err)
	}
	const gid = 65534 // nogroup
	sock := filepath.Join(dir, "rt0.sock")
	tapName := fmt.Sprintf("rtsvc%d", os.Getpid()%100000)
	args := fmt.Sprintf("up --tap %s --addr 10.77.231.1/24 --ctl %s --socket %s --socket-group %d", tapName, filepath.Join(dir, "ctl.sock"), sock, gid)
	up := exec.Command(bin)
	up.Env = append(os.Environ(), upChildEnv+"="+args)
	var upOut syncBuf
	up.Stdout, up.Stderr = &upOut, &upOut
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		up.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- up.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			up.Process.Kill()
			<-done
		}
		t.Logf("up's log:\n%s", upOut.String())
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if fi, err := os.Stat(sock); err == nil {
			st := fi.Sys().(*syscall.Stat_t)
			if fi.Mode().Perm() != 0o660 || st.Gid != gid {
				t.Fatalf("socket mode %v group %d, want 0660 group %d", fi.Mode().Perm(), st.Gid, gid)
			}
			break
		}
		if time.Now().After(deadline) || up.ProcessState != nil {
			t.Fatalf("no service socket after 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	client := func(a string) *exec.Cmd {
		c := exec.Command(setpriv, "--reuid=65534", fmt.Sprintf("--regid=%d", gid), "--clear-groups", bin)
		c.Env = append(os.Environ(), svcClientEnv+"="+sock+" "+a)
		return c
	}
	lst := client("listen 10.77.231.1:7471")
	var lout syncBuf
	lst.Stdout, lst.Stderr = &lout, &lout
	if err := lst.Start(); err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(lout.String(), "listening") {
		if time.Now().After(deadline.Add(5 * time.Second)) {
			lst.Process.Kill()
			lst.Wait()
			t.Fatalf("listener client: %s", lout.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// stat lists the listening client with the service memory it holds.
	var stOut, stErr bytes.Buffer
	if err := statCmd([]string{"--ctl", filepath.Join(dir, "ctl.sock")}, &stOut, &stErr); err != nil {
		t.Fatalf("stat: %v %s", err, stErr.String())
	}
	if m := regexp.MustCompile(`(?m)^client \d+ uid 65534 pid \d+ memory_bytes (\d+) memory_limit 536870912 .* conns 1 `).FindStringSubmatch(stOut.String()); m == nil || m[1] == "0" {
		t.Errorf("stat shows no listening client of uid 65534 with its memory:\n%s", stOut.String())
	}
	dout, derr := client("dial 10.77.231.1:7471").CombinedOutput()
	lerr := lst.Wait()
	if derr != nil || lerr != nil {
		t.Fatalf("dialing client: %v\n%s\nlistening client: %v\n%s", derr, dout, lerr, lout.String())
	}
	if !strings.Contains(upOut.String(), "uid 65534") {
		t.Errorf("up did not log the clients' uid:\n%s", upOut.String())
	}
}

// syncBuf is a bytes.Buffer safe for a writer and a later reader.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
