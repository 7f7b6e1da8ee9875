package tap

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

var modes = []struct {
	name    string
	offload bool
}{{"offload", true}, {"plain", false}}

func TestPing(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			r := newRig(t, m.offload, 0)
			if r.dev.MTU() != 1500 {
				t.Errorf("MTU = %d, want 1500", r.dev.MTU())
			}
			if out := r.ns.mustRun(t, "cat", "/sys/class/net/"+tapName+"/mtu"); strings.TrimSpace(out) != "1500" {
				t.Logf("kernel MTU (sysfs may belong to another netns): %q", out)
			}
			r.ns.kernelPing(t, gvisorV4, 3, 56, false)
			r.ns.kernelPing(t, gvisorV6, 3, 56, false)
			st := r.dev.Stats()
			if st.RxFrames < 6 || st.TxFrames < 6 {
				t.Errorf("stats too low: %+v", st)
			}
			t.Logf("stats: %+v", st)
		})
	}
}

func TestTCPBulk(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			bulk(t, m.offload, 1500, bulkBytes)
		})
	}
}

func TestMTU9000(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			r := bulk(t, m.offload, 9000, 16<<20)
			// A 9000-byte IPv4 packet unfragmented (8972 + 28).
			r.ns.kernelPing(t, gvisorV4, 2, 8972, true)
			r.ns.kernelPing(t, gvisorV6, 2, 8952, true)
		})
	}
}

func bulk(t *testing.T, offload bool, mtu, n int) *rig {
	r := newRig(t, offload, mtu)
	if got := r.dev.MTU(); got != mtu {
		t.Fatalf("MTU = %d, want %d", got, mtu)
	}
	if got := r.dev.LinkEndpoint().MTU(); got != uint32(mtu) {
		t.Fatalf("LinkEndpoint MTU = %d, want %d", got, mtu)
	}
	if out := r.ns.mustRun(t, "ip", "-o", "link", "show", tapName); !strings.Contains(out, fmt.Sprintf("mtu %d ", mtu)) {
		t.Fatalf("kernel MTU not %d: %s", mtu, out)
	}
	gv, kc := r.connect(t)
	dt, err := transfer(gv, kc, n)
	if err != nil {
		t.Fatalf("gVisor->kernel: %v", err)
	}
	t.Logf("gVisor->kernel %d MiB: %.2f Gbit/s", n>>20, gbps(n, dt))
	dt, err = transfer(kc, gv, n)
	if err != nil {
		t.Fatalf("kernel->gVisor: %v", err)
	}
	t.Logf("kernel->gVisor %d MiB: %.2f Gbit/s", n>>20, gbps(n, dt))
	st := r.dev.Stats()
	t.Logf("stats: %+v", st)
	if offload && (st.TxGSOFrames == 0 || st.RxGSOFrames == 0) {
		t.Errorf("offload: expected GSO frames both ways: %+v", st)
	}
	if !offload && (st.TxGSOFrames != 0 || st.RxGSOFrames != 0) {
		t.Errorf("plain: unexpected GSO frames: %+v", st)
	}
	if st.TxErrors != 0 || st.RxErrors != 0 {
		t.Errorf("errors: %+v", st)
	}
	return r
}

// TestBusyPoll: a busy-polling TAP carries traffic both ways, and its read
// loop stops spinning once frames stop coming: over an idle stretch the
// process uses a small part of a CPU, not all of it.
func TestBusyPoll(t *testing.T) {
	ns := newNetns(t)
	d := openIn(t, ns, Config{Name: tapName, BusyPoll: 20 * time.Millisecond})
	ns.mustRun(t, "ip", "addr", "add", kernelV4+"/24", "dev", tapName)
	ns.mustRun(t, "ip", "link", "set", tapName, "up")
	s := newGVisorStack(t, d)
	r := &rig{ns: ns, dev: d, s: s}
	r.ns.kernelPing(t, gvisorV4, 3, 56, false)
	gv, kc := r.connect(t)
	if _, err := transfer(gv, kc, 4<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := transfer(kc, gv, 4<<20); err != nil {
		t.Fatal(err)
	}
	if st := d.Stats(); st.RxErrors != 0 || st.TxErrors != 0 || st.RxFrames == 0 {
		t.Fatalf("stats: %+v", st)
	}
	// Idle: after BusyPoll the loop sleeps in the netpoller.
	time.Sleep(50 * time.Millisecond)
	cpu := func() time.Duration {
		var ru unix.Rusage
		if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	before, start := cpu(), time.Now()
	time.Sleep(300 * time.Millisecond)
	used, wall := cpu()-before, time.Since(start)
	t.Logf("idle: %v of CPU over %v", used, wall)
	if used > wall/4 {
		t.Fatalf("idle TAP: the process used %v of CPU over %v: the read loop kept spinning", used, wall)
	}
}

func TestAttachExisting(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			ns := newNetns(t)
			ns.mustRun(t, "ip", "tuntap", "add", "dev", tapName, "mode", "tap")
			ns.mustRun(t, "ip", "link", "set", tapName, "mtu", "1400")
			d := openIn(t, ns, Config{Name: tapName, NoOffload: !m.offload})
			if d.Created() {
				t.Errorf("Created() = true for an existing TAP")
			}
			if d.MTU() != 1400 {
				t.Errorf("MTU = %d, want the kernel's 1400", d.MTU())
			}
			// Traffic works on an attached TAP.
			ns.mustRun(t, "ip", "addr", "add", kernelV4+"/24", "dev", tapName)
			ns.mustRun(t, "ip", "-6", "addr", "add", kernelV6+"/64", "dev", tapName, "nodad")
			ns.mustRun(t, "ip", "link", "set", tapName, "up")
			newGVisorStack(t, d)
			ns.kernelPing(t, gvisorV4, 2, 56, false)

			// A second open of the same (single-queue, attached) TAP fails.
			if err := ns.do(func() error {
				d2, err := Open(Config{Name: tapName, NoOffload: !m.offload})
				if err == nil {
					d2.Close()
					return errors.New("second Open succeeded")
				}
				return nil
			}); err != nil {
				t.Error(err)
			}

			if err := d.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if !ns.linkExists(tapName) {
				t.Fatalf("Close deleted a TAP it did not create")
			}
			// Still persistent: a re-open attaches again.
			d3 := openIn(t, ns, Config{Name: tapName, NoOffload: !m.offload})
			if d3.Created() {
				t.Errorf("re-open: Created() = true")
			}
			d3.Close()
			if !ns.linkExists(tapName) {
				t.Fatalf("second Close deleted the TAP")
			}
		})
	}
}

func TestCloseDeletesCreated(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			ns := newNetns(t)
			d := openIn(t, ns, Config{Name: tapName, NoOffload: !m.offload})
			if !d.Created() {
				t.Fatalf("Created() = false")
			}
			if !ns.linkExists(tapName) {
				t.Fatalf("TAP not visible in the namespace")
			}
			if !strings.Contains(ns.mustRun(t, "ip", "link", "show", tapName), "UP") {
				t.Errorf("created TAP is not up")
			}
			done := make(chan error, 1)
			go func() { done <- d.Close() }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Close: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("Close hangs")
			}
			if err := d.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
			d.LinkEndpoint().Wait()
			if ns.linkExists(tapName) {
				t.Fatalf("Close did not delete the TAP it created")
			}
		})
	}
}

func TestEmptyNameKernelPicks(t *testing.T) {
	ns := newNetns(t)
	d := openIn(t, ns, Config{})
	if d.Name() == "" || !d.Created() {
		t.Fatalf("name %q created %v", d.Name(), d.Created())
	}
	if !ns.linkExists(d.Name()) {
		t.Fatalf("%s missing", d.Name())
	}
	if mac := d.MAC(); len(mac) != 6 || mac[0]&1 != 0 || mac[0]&2 == 0 {
		t.Errorf("default MAC %v not a locally administered unicast address", mac)
	}
	d.Close()
	if ns.linkExists(d.Name()) {
		t.Fatalf("%s not deleted", d.Name())
	}
}

func TestBadConfig(t *testing.T) {
	// Checked before any syscall: no root needed.
	for _, cfg := range []Config{
		{Name: "this-name-is-too-long"},
		{Name: "tap0", MTU: 70000},
		{Name: "tap0", MAC: []byte{1, 2, 3, 4, 5, 6}}, // multicast
		{Name: "tap0", BusyPoll: -time.Microsecond},
		{Name: "tap0", BusyPoll: 2 * time.Second},
		{Name: "tap0", BusyPoll: time.Millisecond, NoOffload: true},
	} {
		if d, err := Open(cfg); err == nil {
			d.Close()
			t.Errorf("Open(%+v) succeeded", cfg)
		} else {
			t.Logf("Open(%+v): %v", cfg, err)
		}
	}
	ns := newNetns(t)
	for _, m := range modes {
		err := ns.do(func() error {
			d, err := Open(Config{Name: "bad/name", NoOffload: !m.offload})
			if err == nil {
				d.Close()
				return errors.New("Open(bad/name) succeeded")
			}
			t.Logf("%s: Open(bad/name): %v", m.name, err)
			return nil
		})
		if err != nil {
			t.Error(err)
		}
	}
}

func TestPermissionErrorMapping(t *testing.T) {
	err := mapErr("tap9", "TUNSETIFF", unix.EPERM)
	if !errors.Is(err, ErrPermission) || !errors.Is(err, os.ErrPermission) || !errors.Is(err, unix.EPERM) {
		t.Fatalf("EPERM not mapped: %v", err)
	}
	if want := `tap: need CAP_NET_ADMIN (run as root) to create or attach TAP "tap9"`; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("message %q, want prefix %q", err, want)
	}
	if !errors.Is(mapErr("x", "open", unix.EACCES), ErrPermission) {
		t.Errorf("EACCES not mapped")
	}
	if errors.Is(mapErr("x", "open", unix.EINVAL), ErrPermission) {
		t.Errorf("EINVAL mapped to ErrPermission")
	}
	if !errors.Is(ErrPermission, os.ErrPermission) {
		t.Errorf("ErrPermission is not os.ErrPermission")
	}
}

// TestPermissionDenied drops CAP_NET_ADMIN from the effective set of one
// locked thread (capabilities are per thread) and opens a TAP from it.
func TestPermissionDenied(t *testing.T) {
	ns := newNetns(t)
	for _, m := range modes {
		errc := make(chan error, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread is discarded
			if err := unix.Setns(ns.fd, unix.CLONE_NEWNET); err != nil {
				errc <- err
				return
			}
			hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
			var data [2]unix.CapUserData
			if err := unix.Capget(&hdr, &data[0]); err != nil {
				errc <- err
				return
			}
			data[unix.CAP_NET_ADMIN/32].Effective &^= 1 << (unix.CAP_NET_ADMIN % 32)
			if err := unix.Capset(&hdr, &data[0]); err != nil {
				errc <- err
				return
			}
			d, err := Open(Config{Name: tapName, NoOffload: !m.offload})
			if err == nil {
				d.Close()
				errc <- errors.New("Open succeeded without CAP_NET_ADMIN")
				return
			}
			if !errors.Is(err, ErrPermission) || !errors.Is(err, os.ErrPermission) {
				errc <- fmt.Errorf("error not ErrPermission: %v", err)
				return
			}
			t.Logf("%s: %v", m.name, err)
			errc <- nil
		}()
		if err := <-errc; err != nil {
			t.Errorf("%s: %v", m.name, err)
		}
	}
}

// TestDeletedUnderUs: a TAP deleted while the endpoint runs is reported
// (Gone closes, Err says the device went away) instead of leaving the
// endpoint up with no network; Close still works.
func TestDeletedUnderUs(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			ns := newNetns(t)
			d := openIn(t, ns, Config{Name: tapName, NoOffload: !m.offload})
			if d.Err() != nil {
				t.Fatalf("Err before anything happened: %v", d.Err())
			}
			ns.mustRun(t, "ip", "link", "del", tapName)
			select {
			case <-d.Gone():
			case <-time.After(5 * time.Second):
				t.Fatal("the device was deleted, and Gone never closed")
			}
			if err := d.Err(); err == nil || !strings.Contains(err.Error(), tapName) {
				t.Fatalf("Err after the deletion: %v", err)
			}
			t.Logf("reported: %v", d.Err())
			done := make(chan struct{})
			go func() { d.Close(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("Close hangs after the deletion")
			}
		})
	}
}

// TestSmallFrameWriteAllocs: a small frame (an ACK, a short message) is
// written without a heap allocation, with and without the virtio-net
// header: its copy into one buffer stays on the stack.
func TestSmallFrameWriteAllocs(t *testing.T) {
	requireRoot(t)
	for _, m := range modes {
		t.Run(fmt.Sprintf("offload=%v", m.offload), func(t *testing.T) {
			r := newRig(t, m.offload, 1500)
			frame := make([]byte, 80) // an Ethernet frame no one is addressed by
			for i := range frame {
				frame[i] = byte(i)
			}
			pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(frame)})
			defer pkt.DecRef()
			if err := r.dev.writePacket(pkt); err != nil {
				t.Fatal(err)
			}
			if n := testing.AllocsPerRun(200, func() { r.dev.writePacket(pkt) }); n != 0 {
				t.Fatalf("%v allocations per small frame", n)
			}
		})
	}
}
