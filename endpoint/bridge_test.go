package endpoint

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmatap/rdmatap/verbs"
)

// bridgeNS is a network namespace with a bridge and two TAPs on it; the
// test's endpoints attach to the TAPs from inside it.
type bridgeNS struct {
	name string
	fd   int
	taps [2]string
}

func newBridgeNS(t *testing.T) *bridgeNS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: opening endpoints on TAPs in a network namespace needs root")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skip("skipping: /dev/net/tun is missing")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("skipping: the ip command (iproute2) is missing")
	}
	id := fmt.Sprintf("%d", os.Getpid()%10000000)
	n := &bridgeNS{name: "rdbr" + id, fd: -1, taps: [2]string{"rdba" + id, "rdbb" + id}}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	exec.Command("ip", "netns", "del", n.name).Run()
	run("ip", "netns", "add", n.name)
	t.Cleanup(func() {
		if n.fd >= 0 {
			unix.Close(n.fd)
		}
		exec.Command("ip", "netns", "del", n.name).Run()
	})
	ns := func(args ...string) { t.Helper(); run(append([]string{"ip", "netns", "exec", n.name}, args...)...) }
	ns("ip", "link", "set", "lo", "up")
	ns("ip", "link", "add", "br0", "type", "bridge")
	for _, tp := range n.taps {
		ns("ip", "tuntap", "add", "dev", tp, "mode", "tap", "vnet_hdr")
		ns("ip", "link", "set", tp, "master", "br0")
		ns("ip", "link", "set", tp, "up")
	}
	ns("ip", "link", "set", "br0", "up")
	fd, err := unix.Open("/run/netns/"+n.name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open namespace: %v", err)
	}
	n.fd = fd
	return n
}

// open opens an endpoint from a thread inside the namespace: its TAP is
// the namespace's, whichever thread uses it later.
func (n *bridgeNS) open(t *testing.T, cfg Config) *Endpoint {
	t.Helper()
	type res struct {
		e   *Endpoint
		err error
	}
	c := make(chan res, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			c <- res{nil, err}
			return
		}
		defer unix.Close(orig)
		if err := unix.Setns(n.fd, unix.CLONE_NEWNET); err != nil {
			c <- res{nil, fmt.Errorf("setns: %w", err)}
			return
		}
		e, err := Open(cfg)
		if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		} // else the locked thread ends with this goroutine
		c <- res{e, err}
	}()
	r := <-c
	if r.err != nil {
		t.Fatalf("Open(%s): %v", cfg.TAP, r.err)
	}
	return r.e
}

// TestWriteOverBridge: two endpoints of this process on TAPs on a Linux
// bridge in a namespace; A writes 256 KiB of random bytes into B's memory
// with an RDMA Write followed by a Send, B finds every byte, the counters
// of both count them, and A's capture holds them.
func TestWriteOverBridge(t *testing.T) {
	n := newBridgeNS(t)
	var capA syncBuffer
	a := n.open(t, Config{TAP: n.taps[0], Addr: netip.MustParsePrefix("10.89.0.2/24"), Capture: &capA,
		Device: verbs.DeviceConfig{Name: "rta", CRC: true}})
	b := n.open(t, Config{TAP: n.taps[1], Addr: netip.MustParsePrefix("10.89.0.3/24"), Device: verbs.DeviceConfig{Name: "rtb"}})
	defer b.Close()
	aClosed := false
	defer func() {
		if !aClosed {
			a.Close()
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const size = 256 << 10
	// B: a buffer A may write, its descriptor as private data, a receive
	// for A's Send.
	bd := b.Device()
	bpd, _ := bd.AllocPD()
	bcq, _ := bd.CreateCQ(16)
	bbuf := make([]byte, size+64)
	bmr, err := bpd.RegMR(bbuf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	bqp, err := bpd.CreateQP(verbs.QPConfig{SendCQ: bcq, RecvCQ: bcq})
	if err != nil {
		t.Fatal(err)
	}
	if err := bqp.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{bmr.SGE(size, 64)}}); err != nil {
		t.Fatal(err)
	}
	l, err := bd.Listen(netip.AddrPortFrom(netip.Addr{}, 7471), verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan error, 1)
	go func() {
		req, err := l.GetRequest(ctx)
		if err != nil {
			accepted <- err
			return
		}
		rb := bmr.Remote()
		rb.Len = size
		pdata, _ := rb.MarshalBinary()
		_, err = req.Accept(ctx, bqp, verbs.ConnParams{PrivateData: pdata})
		accepted <- err
	}()

	// A: the data, the Write and the Send.
	ad := a.Device()
	apd, _ := ad.AllocPD()
	acq, _ := ad.CreateCQ(16)
	abuf := make([]byte, size)
	rand.Read(abuf)
	amr, err := apd.RegMR(abuf, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	aqp, err := apd.CreateQP(verbs.QPConfig{SendCQ: acq, RecvCQ: acq})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := ad.Dial(ctx, aqp, netip.AddrPortFrom(b.Addr().Addr(), 7471), verbs.ConnParams{})
	if err != nil {
		t.Fatalf("Dial over the bridge: %v", err)
	}
	if err := <-accepted; err != nil {
		t.Fatalf("Accept: %v", err)
	}
	var peer verbs.RemoteBuf
	if err := peer.UnmarshalBinary(conn.PeerPrivateData()); err != nil {
		t.Fatal(err)
	}
	if peer.Len < size {
		t.Fatalf("B offers %d bytes, want %d", peer.Len, size)
	}
	err = aqp.PostSend(
		verbs.SendWR{ID: 1, Op: verbs.OpWrite, SGL: []verbs.SGE{amr.SGE(0, size)}, RemoteAddr: peer.Addr, RKey: peer.RKey},
		verbs.SendWR{ID: 2, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{amr.SGE(0, 8)}})
	if err != nil {
		t.Fatal(err)
	}
	wc := make([]verbs.WC, 1)
	if _, err := bcq.Wait(ctx, wc); err != nil || wc[0].Status != verbs.StatusSuccess || wc[0].Op != verbs.WCRecv {
		t.Fatalf("B's completion: %v %+v", err, wc[0])
	}
	if !bytes.Equal(bbuf[:size], abuf) {
		t.Fatal("B's buffer differs from what A wrote")
	}
	if !bytes.Equal(bbuf[size:size+8], abuf[:8]) {
		t.Fatal("B's receive buffer differs from what A sent")
	}
	if _, err := acq.Wait(ctx, wc); err != nil || wc[0].Status != verbs.StatusSuccess {
		t.Fatalf("A's completion: %v %+v", err, wc[0])
	}

	sa, sb := a.Stats(), b.Stats()
	if sa.Verbs.TxBytes < size || sb.Verbs.RxBytes < size {
		t.Errorf("verbs counters: A sent %d payload bytes, B received %d; want at least %d", sa.Verbs.TxBytes, sb.Verbs.RxBytes, size)
	}
	if sa.Link.TxFrames == 0 || sb.Link.RxFrames == 0 {
		t.Errorf("link counters: A wrote %d frames, B read %d", sa.Link.TxFrames, sb.Link.RxFrames)
	}
	if sa.Impair != nil {
		t.Error("an endpoint without impairment reports one")
	}

	conn.Close()
	aClosed = true
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// A's capture: the pcap header, then at least one record a frame of
	// which carries the Write's bytes.
	pc := capA.b.Bytes() // Close has returned: no more writes
	if len(pc) < 24 || binary.LittleEndian.Uint32(pc) != 0xa1b2c3d4 {
		t.Fatalf("capture of %d bytes does not start with a pcap header", len(pc))
	}
	if !bytes.Contains(pc, abuf[:64]) {
		t.Error("the capture does not hold the written bytes")
	}
}
