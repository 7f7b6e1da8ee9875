package capi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/capi"
	"github.com/rdmatap/rdmatap/internal/progtest"
	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/service"
)

// cacheDir holds the built libraries, readable by every user (the
// unprivileged clients load them).
func cacheDir(t testing.TB) string {
	d := filepath.Join(os.TempDir(), "rdmatap-capi-test")
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

var (
	buildMu   sync.Mutex
	buildDirs = map[bool]string{}
)

// libs builds the libraries once per test binary and flavour.
func libs(t testing.TB, sanitize bool) string {
	t.Helper()
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skip("skipping: no C compiler (cc)")
	}
	if _, err := os.Stat("/usr/include/infiniband/verbs.h"); err != nil {
		t.Skip("skipping: no libibverbs headers (Debian package libibverbs-dev)")
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	if d, ok := buildDirs[sanitize]; ok {
		return d
	}
	d, err := capi.Build(cacheDir(t), sanitize)
	if err != nil {
		t.Fatal(err)
	}
	buildDirs[sanitize] = d
	return d
}

// world makes a temporary directory every user may enter.
func world(t testing.TB) string {
	dir, err := os.MkdirTemp("", "capi")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// testService serves one end of an in-memory pair on a socket (group nogroup
// when root) and returns the socket's path and the other end's device.
type testService struct {
	sock     string
	srv      *service.Server
	dev      *verbs.Device // the device served
	peer     *verbs.Device // the other end of the link, used from Go
	addr     string        // the service device's IP address
	peerAddr string
}

const nogroup = 65534

func startService(t testing.TB) *testService {
	t.Helper()
	return startServiceConfig(t, service.Config{Logf: t.Logf})
}

func startServiceConfig(t testing.TB, cfg service.Config) *testService {
	t.Helper()
	na, nb, err := netstack.NewPair(netstack.PairConfig{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := verbs.Open(na, verbs.DeviceConfig{Name: "rt0"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := verbs.Open(nb, verbs.DeviceConfig{Name: "rt1"})
	if err != nil {
		t.Fatal(err)
	}
	gid := -1
	if os.Geteuid() == 0 {
		gid = nogroup
	}
	sock := filepath.Join(world(t), "rt0.sock")
	ln, err := service.ListenSocket(sock, gid)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := service.Serve(a, ln, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Close()
		a.Close()
		b.Close()
		na.Close()
		nb.Close()
	})
	return &testService{sock: sock, srv: srv, dev: a, peer: b, addr: "192.0.2.1", peerAddr: "192.0.2.2"}
}

// command runs a program with the libraries and the service, as the
// unprivileged user nobody when the test runs as root.
func command(t testing.TB, libdir, sock string, name string, args ...string) *exec.Cmd {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		path = name
	}
	var c *exec.Cmd
	if os.Geteuid() == 0 {
		setpriv, err := exec.LookPath("setpriv")
		if err != nil {
			t.Skip("skipping: setpriv not found")
		}
		c = exec.Command(setpriv, append([]string{"--reuid=65534", fmt.Sprintf("--regid=%d", nogroup), "--clear-groups", path}, args...)...)
	} else {
		c = exec.Command(path, args...)
	}
	c.Env = append(os.Environ(), "LD_LIBRARY_PATH="+libdir, "RDMATAP_SOCKET="+sock)
	return c
}

// installed returns the path of an installed program, or skips.
func installed(t testing.TB, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("skipping: %s not installed (Debian package %s)", name, pkg)
	}
	return p
}

// TestDevinfo lists and queries the service's device with rdma-core's
// ibv_devices and ibv_devinfo -v, unprivileged.
func TestDevinfo(t *testing.T) {
	installed(t, "ibv_devinfo", "ibverbs-utils")
	dir := libs(t, false)
	s := startService(t)
	out, err := command(t, dir, s.sock, "ibv_devices").CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("rt0")) {
		t.Fatalf("ibv_devices: %v\n%s", err, out)
	}
	out, err = command(t, dir, s.sock, "ibv_devinfo", "-v").CombinedOutput()
	if err != nil {
		t.Fatalf("ibv_devinfo -v: %v\n%s", err, out)
	}
	// The port and the IDs are the service device's, as siw makes them
	// from its netdev: the node GUID is the MAC's EUI-64.
	link := s.dev.Link()
	g := link.NodeGUID()
	guid := fmt.Sprintf("%02x%02x:%02x%02x:%02x%02x:%02x%02x", g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7])
	mtu := fmt.Sprintf("%d (%d)", 128<<link.ActiveMTU(), link.ActiveMTU())
	for _, want := range []string{"hca_id:\trt0", "transport:\t\t\tiWARP (1)", "PORT_ACTIVE (4)", "link_layer:\t\tEthernet",
		"max_qp:\t\t\t\t1024", "node_guid:\t\t\t" + guid, "sys_image_guid:\t\t\t" + guid, "vendor_id:\t\t\t0x626d74",
		"active_mtu:\t\t" + mtu, "max_mtu:\t\t" + mtu, "active_width:\t\t1X (1)", "active_speed:\t\t2.5 Gbps (1)",
		"atomic_cap:\t\t\tATOMIC_GLOB (2)", "max_qp_rd_atom:\t\t\t128"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("ibv_devinfo -v: no %q in\n%s", want, out)
		}
	}
	// The sanitized build under the same program (libasan preloaded).
	asan, err := capi.Preload()
	if err != nil {
		t.Fatalf("the compiler's libasan: %v", err)
	}
	c := command(t, libs(t, true), s.sock, "ibv_devinfo", "-v")
	c.Env = append(c.Env, "LD_PRELOAD="+asan, "ASAN_OPTIONS=detect_leaks=0")
	if out, err := c.CombinedOutput(); err != nil || !bytes.Contains(out, []byte("hca_id:\trt0")) {
		t.Errorf("ibv_devinfo -v on the sanitized library: %v\n%s", err, out)
	}
	// ibv_query_gid gives siw's GID: the MAC, then zeros (ibv_devinfo
	// prints no GID of that form, as for siw).
	out, err = command(t, dir, s.sock, compile(t, dir, "testdata/query.c", false)).CombinedOutput()
	gid := append(append([]byte{}, link.MAC...), make([]byte, 10)...)
	wantQ := fmt.Sprintf("vendor_id=0x626d74 part_id=0 guid=%x device_guid=%x gid=%x state=4 phys_state=5 active_mtu=%d max_mtu=%d width=1 speed=1 atomic_cap=2 max_qp_rd_atom=128 phys_port_cnt=1 phys_port_cnt_ex=1\n",
		g, g, gid, link.ActiveMTU(), link.ActiveMTU())
	if err != nil || string(out) != wantQ {
		t.Errorf("query: %v\n%s\nwant\n%s", err, out, wantQ)
	}
	// Without a service the device list is empty, not an error.
	out, _ = command(t, dir, filepath.Join(world(t), "none.sock"), "ibv_devices").CombinedOutput()
	if bytes.Contains(out, []byte("rt0")) {
		t.Errorf("ibv_devices without a service:\n%s", out)
	}
}

// compile builds a C test program from testdata against the libraries.
func compile(t testing.TB, libdir, src string, sanitize bool) string {
	t.Helper()
	out := filepath.Join(world(t), strings.TrimSuffix(filepath.Base(src), ".c"))
	args := append([]string{}, capi.CFlags...)
	if sanitize {
		args = append(append(args, "-O1"), capi.SanitizeFlags...)
	} else {
		args = append(args, "-O2")
	}
	args = append(args, "-I", filepath.Join(libdir, "include"), "-o", out, src, "-L", libdir, "-libverbs")
	if b, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
		t.Fatalf("cc %s: %v\n%s", src, err, b)
	}
	os.Chmod(out, 0o755)
	return out
}

func fill(b []byte, seed int) {
	for i := range b {
		b[i] = byte(i*7 + seed)
	}
}

func checkFill(t testing.TB, what string, b []byte, seed int) {
	t.Helper()
	for i := range b {
		if b[i] != byte(i*7+seed) {
			t.Fatalf("%s: byte %d is %d, want %d", what, i, b[i], byte(i*7+seed))
		}
	}
}

// Sizes in testdata/transfer.c.
const (
	tWriteLen     = 64*1024 + 123
	tSendLen      = 4000
	tInlineLen    = 40
	tPeerWriteLen = 32*1024 + 7
	tPeerSendLen  = 3000
)

// TestTransfer runs testdata/transfer.c through a service against a Go
// peer: RDMA Writes and Sends both ways with malloc'd memory, every byte
// checked on both sides; also built with AddressSanitizer and UBSan.
func TestTransfer(t *testing.T) {
	for _, san := range []bool{false, true} {
		t.Run(fmt.Sprintf("sanitize=%v", san), func(t *testing.T) { testTransfer(t, san) })
	}
}

func testTransfer(t *testing.T, sanitize bool) {
	dir := libs(t, sanitize)
	prog := compile(t, dir, "testdata/transfer.c", sanitize)
	s := startService(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	pd, err := s.peer.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	scq, err := s.peer.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	rcq, err := s.peer.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: scq, RecvCQ: rcq})
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Close()
	buf := make([]byte, 128<<10)
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	rbuf := make([]byte, 16<<10)
	rmr, err := pd.RegMR(rbuf, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	sbuf := make([]byte, 64<<10)
	smr, err := pd.RegMR(sbuf, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if err := qp.PostRecv(verbs.RecvWR{ID: 10, SGL: []verbs.SGE{rmr.SGE(0, 8192)}}, verbs.RecvWR{ID: 11, SGL: []verbs.SGE{rmr.SGE(8192, 8192)}}); err != nil {
		t.Fatal(err)
	}
	ln, err := s.peer.Listen(netip.MustParseAddrPort(s.peerAddr+":0"), verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	cmd := command(t, dir, s.sock, prog, ln.Addr().String())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		exited <- err
		if err != nil {
			cancel()
		}
	}()
	fatal := func(f string, a ...any) {
		t.Helper()
		cancel()
		<-exited
		t.Fatalf("%s\ntransfer's output:\n%s", fmt.Sprintf(f, a...), out.String())
	}

	req, err := ln.GetRequest(ctx)
	if err != nil {
		fatal("GetRequest: %v", err)
	}
	pdata := req.PrivateData()
	if len(pdata) != 16 {
		fatal("private data of %d bytes", len(pdata))
	}
	cAddr, cKey, cLen := binary.LittleEndian.Uint64(pdata), binary.LittleEndian.Uint32(pdata[8:]), binary.LittleEndian.Uint32(pdata[12:])
	if cLen != tPeerWriteLen {
		fatal("the C buffer is %d bytes", cLen)
	}
	ours := make([]byte, 16)
	binary.LittleEndian.PutUint64(ours, mr.Addr())
	binary.LittleEndian.PutUint32(ours[8:], uint32(mr.RKey()))
	binary.LittleEndian.PutUint32(ours[12:], uint32(len(buf)))
	if _, err := req.Accept(ctx, qp, verbs.ConnParams{PrivateData: ours}); err != nil {
		fatal("Accept: %v", err)
	}
	var wc [1]verbs.WC
	for i, want := range []int{tSendLen, tInlineLen} {
		if _, err := rcq.Wait(ctx, wc[:]); err != nil {
			fatal("receive %d: %v", i, err)
		}
		if err := wc[0].Err(); err != nil || wc[0].Op != verbs.WCRecv || int(wc[0].ByteLen) != want || wc[0].ID != uint64(10+i) {
			fatal("receive %d: %+v %v", i, wc[0], err)
		}
	}
	checkFill(t, "the C program's RDMA Write", buf[:tWriteLen], 3)
	checkFill(t, "the C program's Send", rbuf[:tSendLen], 4)
	checkFill(t, "the C program's inline Send from its stack", rbuf[8192:8192+tInlineLen], 5)

	fill(sbuf[:tPeerWriteLen], 6)
	fill(sbuf[tPeerWriteLen:tPeerWriteLen+tPeerSendLen], 8)
	if err := qp.PostSend(
		verbs.SendWR{ID: 20, Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: []verbs.SGE{smr.SGE(0, tPeerWriteLen)}, RemoteAddr: cAddr, RKey: verbs.STag(cKey)},
		verbs.SendWR{ID: 21, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{smr.SGE(tPeerWriteLen, tPeerSendLen)}},
	); err != nil {
		fatal("PostSend: %v", err)
	}
	for i := 0; i < 2; i++ {
		if _, err := scq.Wait(ctx, wc[:]); err != nil || wc[0].Err() != nil {
			fatal("send %d: %v %+v", i, err, wc[0])
		}
	}
	select {
	case err := <-exited:
		if err != nil || !strings.Contains(out.String(), "transfer: ok") {
			t.Fatalf("transfer: %v\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-exited
		t.Fatalf("transfer did not finish\n%s", out.String())
	}
	t.Logf("transfer's output:\n%s", out.String())
}

// TestMemory runs testdata/memory.c: registering heap, stack and static
// memory keeps its contents, fork gives the child a copy, bad
// registrations fail with libibverbs' errnos.
func TestMemory(t *testing.T) {
	for _, san := range []bool{false, true} {
		t.Run(fmt.Sprintf("sanitize=%v", san), func(t *testing.T) {
			dir := libs(t, san)
			prog := compile(t, dir, "testdata/memory.c", san)
			s := startService(t)
			out, err := command(t, dir, s.sock, prog).CombinedOutput()
			if err != nil || !bytes.Contains(out, []byte("memory: ok")) {
				t.Fatalf("memory: %v\n%s", err, out)
			}
		})
	}
}

// FuzzDecode feeds the session's decoder of the service's messages
// (testdata/decode.c, built with ASan and UBSan) arbitrary datagrams.
func FuzzDecode(f *testing.F) {
	f.Add([]byte{1, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 3, 0, 'r', 't', '0'})
	f.Add([]byte{5, 0, 0, 0, 7, 0, 0, 0, 3, 0, 0, 0, 6, 0, 0, 0, 4, 0, 'b', 'u', 's', 'y'})
	f.Add([]byte{5, 0, 0, 0, 7, 0, 0, 0, 3, 0, 0, 0, 6, 0, 0, 0, 9, 0, 'b', 'u', 's', 'y'})
	f.Add([]byte{18, 0, 1, 0, 9, 0, 0, 0, 18, 0, 0, 0, 0, 0, 0, 0, 111, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{22, 0, 25, 1, 0, 0, 0, 0})
	if _, err := exec.LookPath("cc"); err != nil {
		f.Skip("skipping: no C compiler (cc)")
	}
	if _, err := os.Stat("/usr/include/infiniband/verbs.h"); err != nil {
		f.Skip("skipping: no libibverbs headers (Debian package libibverbs-dev)")
	}
	prog := filepath.Join(world(f), "decode")
	args := append(append(append([]string{}, capi.CFlags...), "-O1"), capi.SanitizeFlags...)
	args = append(args, "-I", "core", "-I", "include", "-o", prog, "testdata/decode.c")
	if out, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
		f.Fatalf("cc decode.c: %v\n%s", err, out)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c := exec.Command(prog)
		c.Stdin = bytes.NewReader(data)
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("decode % x: %v\n%s", data, err, out)
		}
	})
}

// TestCalls runs testdata/calls.c: the private interface's calls,
// asynchronous calls and CANCEL, calls from several threads.
func TestCalls(t *testing.T) {
	for _, san := range []bool{false, true} {
		t.Run(fmt.Sprintf("sanitize=%v", san), func(t *testing.T) {
			dir := libs(t, san)
			prog := compile(t, dir, "testdata/calls.c", san)
			s := startService(t)
			c := command(t, dir, s.sock, prog)
			if san {
				c.Env = append(c.Env, "CALLS_NO_CANCEL=1")
			}
			out, err := c.CombinedOutput()
			if err != nil || !bytes.Contains(out, []byte("calls: ok")) {
				t.Fatalf("calls: %v\n%s", err, out)
			}
		})
	}
}

// perftestPrograms are perftest's bandwidth and latency programs.
var perftestPrograms = []string{"ib_write_bw", "ib_read_bw", "ib_send_bw", "ib_atomic_bw", "ib_write_lat", "ib_read_lat", "ib_send_lat", "ib_atomic_lat"}

// perftestSizes are the sizes perftest's -a runs: 2 to 8 MiB.
func perftestSizes() []int {
	var v []int
	for s := 2; s <= 1<<23; s *= 2 {
		v = append(v, s)
	}
	return v
}

// TestPerftest runs perftest's bandwidth and latency programs (-R:
// connections through librdmacm) as server and client on one service's
// device, unprivileged: once with one size (300 iterations) and once with
// -a (every size from 2 bytes to 8 MiB, 5 iterations each); the atomic
// programs, whose size is fixed, with each of their two operations
// instead. Their fast path is ibv_post_send and ibv_poll_cq on the
// shared rings (ib_write_lat's polls the written memory).
func TestPerftest(t *testing.T) {
	installed(t, "ib_write_bw", "perftest")
	dir := libs(t, false)
	s := startService(t)
	port := 7600
	for _, prog := range perftestPrograms {
		type run struct {
			name  string
			args  []string // besides -n
			iters int
			sizes []int
		}
		var runs []run
		if strings.HasPrefix(prog, "ib_atomic") {
			runs = []run{{"FETCH_AND_ADD", []string{"-A", "FETCH_AND_ADD"}, 300, []int{8}},
				{"CMP_AND_SWAP", []string{"-A", "CMP_AND_SWAP"}, 300, []int{8}}}
		} else {
			size := 65536
			if strings.HasSuffix(prog, "_lat") {
				size = 64
			}
			runs = []run{{"one size", []string{"-s", strconv.Itoa(size)}, 300, []int{size}},
				{"all sizes", []string{"-a"}, 5, perftestSizes()}}
		}
		for _, r := range runs {
			port += 3
			t.Run(prog+"/"+r.name, func(t *testing.T) {
				iters := strconv.Itoa(r.iters)
				for attempt := 0; ; attempt++ {
					// A port per attempt: the last pair's connections may linger.
					args := append([]string{"-R", "-p", strconv.Itoa(port + attempt), "-n", iters}, r.args...)
					out, srvOut, err, serr := perftestPair(t, dir, s, prog, args)
					if attempt < 2 && progtest.PerftestListenRace(out, err) {
						t.Logf("%s: perftest's client connected before its server listened, and crashed in its retry; running the pair again\n%s", prog, out)
						continue
					}
					if err != nil || serr != nil {
						t.Fatalf("%s: client %v, server %v\nclient:\n%s\nserver:\n%s", prog, err, serr, out, srvOut)
					}
					for _, size := range r.sizes {
						if !regexp.MustCompile(`(?m)^\s*` + strconv.Itoa(size) + `\s+` + iters + `\s`).Match(out) {
							t.Fatalf("%s: no result for %d bytes\nclient:\n%s\nserver:\n%s", prog, size, out, srvOut)
						}
					}
					t.Logf("%s", out[bytes.LastIndex(out, []byte(" #bytes")):])
					return
				}
			})
		}
	}
}

// TestAsyncwatch runs rdma-core's ibv_asyncwatch, which prints the
// device and then every asynchronous event: a signal ends it, and so does
// the service's end (IBV_EVENT_DEVICE_FATAL, after which
// ibv_get_async_event fails).
func TestAsyncwatch(t *testing.T) {
	installed(t, "ibv_asyncwatch", "ibverbs-utils")
	installed(t, "stdbuf", "coreutils")
	dir := libs(t, false)
	for _, how := range []string{"signal", "service gone"} {
		t.Run(how, func(t *testing.T) {
			s := startService(t)
			// stdbuf: its output is a pipe, which printf would buffer.
			c := command(t, dir, s.sock, "stdbuf", "-oL", "ibv_asyncwatch")
			stdout, err := c.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var errOut bytes.Buffer
			c.Stderr = &errOut
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			r := bufio.NewReader(stdout)
			line, err := r.ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "rt0: async event FD ") {
				c.Process.Kill()
				c.Wait()
				t.Fatalf("ibv_asyncwatch: %q %v\n%s", line, err, errOut.String())
			}
			var rest []byte
			go func() {
				rest, _ = io.ReadAll(r)
				done <- c.Wait()
			}()
			if how == "signal" {
				c.Process.Signal(os.Interrupt)
			} else {
				s.srv.Close()
			}
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				c.Process.Kill()
				<-done
				t.Fatalf("ibv_asyncwatch did not end\n%s%s", rest, errOut.String())
			}
			ee, ok := err.(*exec.ExitError)
			if how == "signal" {
				if !ok || ee.Exited() || len(rest) != 0 {
					t.Fatalf("ibv_asyncwatch after SIGINT: %v, want the signal's end\n%s%s", err, rest, errOut.String())
				}
				return
			}
			if !ok || !ee.Exited() || !bytes.Contains(rest, []byte("IBV_EVENT_DEVICE_FATAL")) {
				t.Fatalf("ibv_asyncwatch after the service's end: %v, want an exit after IBV_EVENT_DEVICE_FATAL\n%s%s", err, rest, errOut.String())
			}
			t.Logf("%s%s", rest, errOut.String())
		})
	}
}

// TestPerftestListenRace makes perftest's listen race happen (its
// server's second rdma_listen delayed by testdata/listen_delay.c) and
// checks that progtest.PerftestListenRace recognizes the client's end,
// which TestPerftest and the exec tests rely on.
func TestPerftestListenRace(t *testing.T) {
	installed(t, "ib_read_bw", "perftest")
	dir := libs(t, false)
	shim := filepath.Join(world(t), "listen_delay.so")
	args := append(append([]string{}, capi.CFlags...), "-O2", "-shared", "-I", filepath.Join(dir, "include"), "-o", shim, "testdata/listen_delay.c", "-ldl")
	if b, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, b)
	}
	s := startService(t)
	pargs := []string{"-R", "-p", "7690", "-n", "300", "-s", "65536"}
	out, _, err, _ := perftestPair(t, dir, s, "ib_read_bw", pargs, "LD_PRELOAD="+shim)
	if !progtest.PerftestListenRace(out, err) {
		t.Fatalf("client %v, not recognized as the listen race:\n%s", err, out)
	}
}

// perftestPair runs one perftest program as server and then as client
// with args, and returns the client's output, the server's, and how each
// ended; srvEnv is added to the server's environment. A server left
// waiting by a failed client is killed.
func perftestPair(t *testing.T, dir string, s *testService, prog string, args []string, srvEnv ...string) (out, srvOut []byte, err, serr error) {
	srv := command(t, dir, s.sock, prog, args...)
	srv.Env = append(srv.Env, srvEnv...)
	var sb bytes.Buffer
	srv.Stdout, srv.Stderr = &sb, &sb
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	// The server listens once it has printed its banner; the client
	// retries its connection meanwhile (perftest does not).
	for try := 0; try < 50; try++ {
		out, err = command(t, dir, s.sock, prog, append(args, s.addr)...).CombinedOutput()
		if err == nil || !bytes.Contains(out, []byte("Unable to perform rdma_client function")) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	wait := 60 * time.Second
	if err != nil {
		wait = time.Second // a failed client leaves its server waiting
	}
	select {
	case serr = <-done:
	case <-time.After(wait):
		srv.Process.Kill()
		serr = <-done
	}
	return out, sb.Bytes(), err, serr
}

// TestFastPath runs testdata/fastpath.c: a Send ping-pong with an echo
// peer whose ibv_post_send, ibv_post_recv and ibv_poll_cq, on a thread
// that traps every system call (seccomp), make no system call and
// allocate nothing while the service's ring poller is awake (its spin
// here outlasts the test) and completions come within the library's poll
// spin (here longer than the test).
func TestFastPath(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("skipping: testdata/fastpath.c's seccomp filter is for x86-64")
	}
	dir := libs(t, false)
	prog := compile(t, dir, "testdata/fastpath.c", false)
	s := startServiceConfig(t, service.Config{Logf: t.Logf, PollSpin: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, _ := echoPeer(ctx, t, s, 64)
	c := command(t, dir, s.sock, prog, addr.String(), "2000")
	c.Env = append(c.Env, "RDMATAP_POLL_SPIN=3600000000")
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("fastpath: %v\n%s", err, out)
	}
	if want := "fastpath: 2000 rounds, 0 system calls, 0 allocations\n"; string(out) != want {
		t.Fatalf("fastpath printed %q, want %q", out, want)
	}
}

// TestCMlessPrograms runs rdma-core's examples that connect without the CM
// or use transports iWARP lacks: each must fail with its own message (UD,
// UC and XRC QPs are refused, and an RC QP cannot be moved to RTR by QP
// number), never by a signal.
func TestCMlessPrograms(t *testing.T) {
	installed(t, "ibv_rc_pingpong", "ibverbs-utils")
	dir := libs(t, false)
	s := startService(t)
	for i, tc := range []struct{ prog, msg string }{
		{"ibv_rc_pingpong", "Couldn't connect to remote QP"},
		{"ibv_ud_pingpong", "Couldn't create QP"},
		{"ibv_uc_pingpong", "Couldn't create QP"},
		{"ibv_xsrq_pingpong", "Couldn't Open the XRC Domain"},
	} {
		t.Run(tc.prog, func(t *testing.T) {
			// ibv_rc_pingpong fails once a client has sent its QP number
			// over TCP; the others fail before they listen.
			port := strconv.Itoa(18700 + i)
			srv := command(t, dir, s.sock, tc.prog, "-p", port)
			var out bytes.Buffer
			srv.Stdout, srv.Stderr = &out, &out
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- srv.Wait() }()
			var cerr error
			var cout []byte
			if tc.prog == "ibv_rc_pingpong" {
				for try := 0; try < 50; try++ {
					cout, cerr = command(t, dir, s.sock, tc.prog, "-p", port, "localhost").CombinedOutput()
					if !bytes.Contains(cout, []byte("Couldn't connect to localhost")) {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				srv.Process.Kill()
				err = <-done
				t.Fatalf("%s did not end:\n%s", tc.prog, out.String())
			}
			t.Logf("server: %v\n%s\nclient: %v\n%s", err, out.String(), cerr, cout)
			st, ok := err.(*exec.ExitError)
			if !ok || !st.Exited() || !strings.Contains(out.String()+string(cout), tc.msg) {
				t.Fatalf("%s: %v, want an exit with %q:\n%s\nclient (%v):\n%s", tc.prog, err, tc.msg, out.String(), cerr, cout)
			}
			if cerr != nil {
				if ce, ok := cerr.(*exec.ExitError); !ok || !ce.Exited() {
					t.Fatalf("%s client: %v\n%s", tc.prog, cerr, cout)
				}
			}
		})
	}
}

// TestServiceGone runs testdata/gone.c: when the service stops, a thread
// waiting for a completion event returns with an error, polling reports
// one, the context gets IBV_EVENT_DEVICE_FATAL and calls fail.
// TestSignals (testdata/eintr.c): ibv_get_cq_event and
// ibv_get_async_event end with EINTR on a signal whose handler lacks
// SA_RESTART, and ibv_get_cq_event waits on through signals with it.
func TestSignals(t *testing.T) {
	for _, san := range []bool{false, true} {
		t.Run(fmt.Sprintf("sanitize=%v", san), func(t *testing.T) {
			dir := libs(t, san)
			prog := compile(t, dir, "testdata/eintr.c", san)
			s := startService(t)
			c := command(t, dir, s.sock, prog)
			var out bytes.Buffer
			c.Stdout, c.Stderr = &out, &out
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			// A wait that swallows the signal never ends: the test
			// says so rather than hang.
			hung := time.AfterFunc(time.Minute, func() { c.Process.Kill() })
			err := c.Wait()
			if !hung.Stop() {
				t.Fatalf("eintr: still waiting after a minute: killed\n%s", out.Bytes())
			}
			if err != nil || !bytes.Contains(out.Bytes(), []byte("eintr: ok")) {
				t.Fatalf("eintr: %v\n%s", err, out.Bytes())
			}
		})
	}
}

func TestServiceGone(t *testing.T) {
	for _, san := range []bool{false, true} {
		t.Run(fmt.Sprintf("sanitize=%v", san), func(t *testing.T) {
			dir := libs(t, san)
			prog := compile(t, dir, "testdata/gone.c", san)
			s := startService(t)
			c := command(t, dir, s.sock, prog)
			stdout, err := c.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var errOut bytes.Buffer
			c.Stderr = &errOut
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			r := bufio.NewReader(stdout)
			line, err := r.ReadString('\n')
			if err != nil || line != "waiting\n" {
				c.Process.Kill()
				c.Wait()
				t.Fatalf("gone: %q %v\n%s", line, err, errOut.String())
			}
			s.srv.Close()
			rest, _ := io.ReadAll(r)
			if err := c.Wait(); err != nil || !bytes.Contains(rest, []byte("gone: ok")) {
				t.Fatalf("gone: %v\n%s%s", err, rest, errOut.String())
			}
		})
	}
}
