package tap

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/songgao/water"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// Config describes the TAP device to open.
type Config struct {
	Name      string           // TAP name (<16 bytes); created if missing, attached if it exists. Empty: the kernel picks tapN.
	MTU       int              // IP MTU; default 1500 (or the kernel's MTU of an attached TAP); set on the kernel side of a TAP we create
	NoOffload bool             // plain TAP: no IFF_VNET_HDR, no checksum offload/TSO (opened with github.com/songgao/water)
	MAC       net.HardwareAddr // the endpoint's MAC; default a random locally administered unicast one
	// BusyPoll, when positive, makes the read loop keep reading the TAP
	// for up to this long after each frame before it waits for the next
	// one in the netpoller (as SO_BUSY_POLL does for a socket): a frame
	// that comes within it is taken without a wake-up, which on a
	// two-core machine halves a small message's one-way time, at the
	// price of a CPU kept busy while traffic flows. Between two reads the
	// loop yields its P to the rest of the process, and every few reads
	// the CPU (sched_yield), so that two busy-polling endpoints that
	// share a core take turns rather than spin out each other's BusyPoll
	// on every message; once a yield has handed the core to another
	// program for its time slice, it yields only after a round trip's
	// time without a frame. Offload TAPs only
	// (refused with NoOffload); at most MaxBusyPoll.
	BusyPoll time.Duration
}

// MaxBusyPoll is the longest Config.BusyPoll.
const MaxBusyPoll = time.Second

// Stats are the device's frame counters (all monotonically increasing).
type Stats struct {
	RxFrames    uint64 // frames read from the TAP (including dropped ones)
	RxBytes     uint64 // Ethernet bytes read (without the virtio header)
	RxGSOFrames uint64 // received GRO/TSO super-frames (virtio gso_type != NONE)
	RxDropped   uint64 // frames not delivered: runt, not for our MAC, no NIC attached, bad checksum, bad virtio header
	RxErrors    uint64 // read errors
	TxFrames    uint64 // frames written to the TAP
	TxBytes     uint64 // Ethernet bytes written (without the virtio header)
	TxGSOFrames uint64 // written super-frames the kernel segments (virtio gso_type != NONE)
	TxErrors    uint64 // write errors (frames dropped)
}

const (
	defaultMTU = 1500
	maxMTU     = 65521 // largest MTU the kernel accepts on a TAP
	// rxBufSize is the receive buffer for one frame (without virtio header).
	// TSO/GRO frames from the kernel are at most 64 KiB including headers.
	rxBufSize = 65536
)

// ErrPermission is matched (errors.Is) by the error Open returns when the
// process lacks CAP_NET_ADMIN; such errors also match os.ErrPermission.
var ErrPermission error = permissionSentinel{}

type permissionSentinel struct{}

func (permissionSentinel) Error() string {
	return "tap: need CAP_NET_ADMIN (run as root) to create or attach TAP"
}
func (permissionSentinel) Is(target error) bool { return target == os.ErrPermission }

// PermissionError is returned by Open on EPERM/EACCES.
type PermissionError struct {
	Name string // TAP name asked for
	Err  error  // underlying error (errno)
}

func (e *PermissionError) Error() string {
	return fmt.Sprintf("tap: need CAP_NET_ADMIN (run as root) to create or attach TAP %q: %v", e.Name, e.Err)
}

// Is reports ErrPermission and os.ErrPermission.
func (e *PermissionError) Is(target error) bool {
	return target == ErrPermission || target == os.ErrPermission
}

func (e *PermissionError) Unwrap() error { return e.Err }

// mapErr turns a syscall failure during Open into a descriptive error,
// mapping EPERM/EACCES to a *PermissionError.
func mapErr(name, op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		return &PermissionError{Name: name, Err: fmt.Errorf("%s: %w", op, err)}
	}
	return fmt.Errorf("tap: %s for TAP %q: %w", op, name, err)
}

// Device is an open TAP device and its gVisor link endpoint.
type Device struct {
	name    string
	created bool
	offload bool
	mac     net.HardwareAddr
	mtu     int

	fd       int           // the /dev/net/tun fd (non-blocking); on the plain path owned by wif
	busyPoll time.Duration // Config.BusyPoll
	evfd     int           // offload path: eventfd that wakes the read loop on Close (poll(2) fallback)
	// Offload path: the duplicate fd the read loop waits on in the
	// netpoller; Close closes it to end the wait.
	pollMu   sync.Mutex
	pollFile *os.File
	ctlfd    int // AF_INET datagram socket in the TAP's netns for SIOC* ioctls

	wif  *water.Interface // plain path (d.fd is then its fd, owned by wif)
	file *os.File         // plain path: wif's file

	ep *endpoint

	closing  atomic.Bool
	txMu     sync.RWMutex // R: writers; W: Close (fd teardown)
	txClosed bool
	loopDone chan struct{}
	loopErr  error // why the read loop ended before Close (set before loopDone closes)

	closeOnce sync.Once
	closeErr  error

	st struct {
		rxFrames, rxBytes, rxGSO, rxDropped, rxErrors atomic.Uint64
		txFrames, txBytes, txGSO, txErrors            atomic.Uint64
	}
}

// Open creates the TAP cfg.Name (or attaches to it if it already exists) in
// the network namespace of the calling thread and starts its read loop.
// A TAP created here is not persistent: it disappears when the Device is
// closed or the process dies. A created TAP is brought up and gets cfg.MTU;
// an attached TAP's kernel-side settings are left alone.
func Open(cfg Config) (*Device, error) {
	if len(cfg.Name) >= unix.IFNAMSIZ {
		return nil, fmt.Errorf("tap: name %q too long (%d bytes, max %d)", cfg.Name, len(cfg.Name), unix.IFNAMSIZ-1)
	}
	if cfg.MTU < 0 || cfg.MTU > maxMTU || (cfg.MTU != 0 && cfg.MTU < 68) {
		return nil, fmt.Errorf("tap: MTU %d out of range [68, %d]", cfg.MTU, maxMTU)
	}
	if cfg.BusyPoll < 0 || cfg.BusyPoll > MaxBusyPoll {
		return nil, fmt.Errorf("tap: BusyPoll %v out of range [0, %v]", cfg.BusyPoll, MaxBusyPoll)
	}
	if cfg.BusyPoll > 0 && cfg.NoOffload {
		return nil, errors.New("tap: BusyPoll needs the offload TAP (NoOffload reads through water's blocking file)")
	}
	mac := cfg.MAC
	if mac == nil {
		mac = make(net.HardwareAddr, 6)
		if _, err := rand.Read(mac); err != nil {
			return nil, fmt.Errorf("tap: random MAC: %w", err)
		}
		mac[0] = mac[0]&^0x01 | 0x02 // unicast, locally administered
	} else {
		if len(mac) != 6 || mac[0]&1 != 0 {
			return nil, fmt.Errorf("tap: MAC %v is not a unicast Ethernet address", mac)
		}
		mac = append(net.HardwareAddr(nil), mac...)
	}

	// Every namespace-relative step (opening /dev/net/tun, the control
	// socket, the existence check) must happen in the same netns: keep this
	// goroutine on one thread for the duration.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	d := &Device{fd: -1, evfd: -1, ctlfd: -1, mac: mac, offload: !cfg.NoOffload, busyPoll: cfg.BusyPoll, loopDone: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			d.closeFDs()
		}
	}()

	ctl, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, mapErr(cfg.Name, "control socket", err)
	}
	d.ctlfd = ctl

	if d.offload {
		err = d.openOffload(cfg.Name)
	} else {
		err = d.openPlain(cfg.Name)
	}
	if err != nil {
		return nil, err
	}

	// MTU.
	d.mtu = cfg.MTU
	if d.created {
		if d.mtu == 0 {
			d.mtu = defaultMTU
		}
		if err := d.setKernelMTU(d.mtu); err != nil {
			return nil, mapErr(d.name, "set MTU", err)
		}
		if err := d.setUp(true); err != nil {
			return nil, mapErr(d.name, "bring link up", err)
		}
	} else if d.mtu == 0 {
		if m, err := d.kernelMTU(); err == nil && m > 0 {
			d.mtu = m
		} else {
			d.mtu = defaultMTU
		}
	}

	d.ep = newEndpoint(d)
	ok = true
	go d.readLoop()
	return d, nil
}

func (d *Device) openOffload(name string) error {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return mapErr(name, "open /dev/net/tun", err)
	}
	d.fd = fd
	flags := uint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	// Try to create exclusively first so Created() is race-free; EBUSY
	// means the device exists, so attach to it.
	created := true
	name2, err := tunSetIff(fd, name, flags|unix.IFF_TUN_EXCL)
	if errors.Is(err, unix.EBUSY) {
		created = false
		name2, err = tunSetIff(fd, name, flags)
	}
	if err != nil {
		if errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("tap: TUNSETIFF %q: %w (bad name, or it exists and is not a single-queue TAP)", name, err)
		}
		if errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("tap: TAP %q is in use by another process: %w", name, err)
		}
		return mapErr(name, "TUNSETIFF", err)
	}
	d.name, d.created = name2, created
	if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, vnetHdrLen); err != nil {
		return mapErr(d.name, "TUNSETVNETHDRSZ", err)
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, tunFCsum|tunFTSO4|tunFTSO6); err != nil {
		return mapErr(d.name, "TUNSETOFFLOAD", err)
	}
	ev, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("tap: eventfd: %w", err)
	}
	d.evfd = ev
	return nil
}

func (d *Device) openPlain(name string) error {
	existed := false
	if name != "" {
		if _, err := d.ifIndex(name); err == nil {
			existed = true
		}
	}
	wif, err := water.New(water.Config{
		DeviceType:             water.TAP,
		PlatformSpecificParams: water.PlatformSpecificParams{Name: name},
	})
	if err != nil {
		if errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("tap: open %q: %w (bad name, or it exists and is not a single-queue TAP)", name, err)
		}
		return mapErr(name, "water.New", err)
	}
	f, isFile := wif.ReadWriteCloser.(*os.File)
	if !isFile {
		wif.Close()
		return fmt.Errorf("tap: water returned %T, want *os.File", wif.ReadWriteCloser)
	}
	d.wif, d.file, d.name, d.created = wif, f, wif.Name(), !existed
	rc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("tap: %w", err)
	}
	var ierr error
	err = rc.Control(func(fd uintptr) {
		// water opens without O_CLOEXEC: a child process would inherit the
		// fd and keep a created TAP alive.
		unix.CloseOnExec(int(fd))
		d.fd = int(fd) // for writev; water keeps ownership
		// water always clears TUNSETPERSIST; an existing TAP we could attach
		// to was persistent, so restore that.
		if existed {
			ierr = unix.IoctlSetInt(int(fd), unix.TUNSETPERSIST, 1)
		}
	})
	if err == nil {
		err = ierr
	}
	if err != nil {
		return mapErr(d.name, "TUNSETPERSIST", err)
	}
	return nil
}

func tunSetIff(fd int, name string, flags uint16) (string, error) {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return "", err
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return "", err
	}
	return ifr.Name(), nil
}

func (d *Device) ifIndex(name string) (int, error) {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return 0, err
	}
	if err := unix.IoctlIfreq(d.ctlfd, unix.SIOCGIFINDEX, ifr); err != nil {
		return 0, err
	}
	return int(ifr.Uint32()), nil
}

func (d *Device) kernelMTU() (int, error) {
	ifr, err := unix.NewIfreq(d.name)
	if err != nil {
		return 0, err
	}
	if err := unix.IoctlIfreq(d.ctlfd, unix.SIOCGIFMTU, ifr); err != nil {
		return 0, err
	}
	return int(int32(ifr.Uint32())), nil
}

func (d *Device) setKernelMTU(mtu int) error {
	ifr, err := unix.NewIfreq(d.name)
	if err != nil {
		return err
	}
	ifr.SetUint32(uint32(mtu))
	return unix.IoctlIfreq(d.ctlfd, unix.SIOCSIFMTU, ifr)
}

func (d *Device) setUp(up bool) error {
	ifr, err := unix.NewIfreq(d.name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(d.ctlfd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	fl := ifr.Uint16()
	if up {
		fl |= unix.IFF_UP
	} else {
		fl &^= unix.IFF_UP
	}
	ifr.SetUint16(fl)
	return unix.IoctlIfreq(d.ctlfd, unix.SIOCSIFFLAGS, ifr)
}

// Name is the kernel name of the TAP.
func (d *Device) Name() string { return d.name }

// Created reports whether this process created the TAP (Close deletes it).
func (d *Device) Created() bool { return d.created }

// MAC is the endpoint's (gVisor side) Ethernet address.
func (d *Device) MAC() net.HardwareAddr { return append(net.HardwareAddr(nil), d.mac...) }

// MTU is the IP MTU of the endpoint.
func (d *Device) MTU() int { return d.mtu }

// Offload reports whether the virtio-net header path (checksum offload and
// TSO/GRO super-frames) is in use.
func (d *Device) Offload() bool { return d.offload }

// LinkEndpoint is the Ethernet link endpoint to give to stack.CreateNIC. It
// is the same object on every call. Removing the NIC detaches it but does
// not close the Device.
func (d *Device) LinkEndpoint() stack.LinkEndpoint { return d.ep }

// Stats returns a snapshot of the counters.
func (d *Device) Stats() Stats {
	return Stats{
		RxFrames:    d.st.rxFrames.Load(),
		RxBytes:     d.st.rxBytes.Load(),
		RxGSOFrames: d.st.rxGSO.Load(),
		RxDropped:   d.st.rxDropped.Load(),
		RxErrors:    d.st.rxErrors.Load(),
		TxFrames:    d.st.txFrames.Load(),
		TxBytes:     d.st.txBytes.Load(),
		TxGSOFrames: d.st.txGSO.Load(),
		TxErrors:    d.st.txErrors.Load(),
	}
}

// Close stops the read loop, makes further writes fail, and closes the TAP
// fd. A TAP created by Open is brought down and deleted; an attached TAP is
// left in place. Close is idempotent and safe to call concurrently with
// traffic; it does not remove the NIC from a gVisor stack.
func (d *Device) Close() error {
	d.closeOnce.Do(func() { d.closeErr = d.close() })
	return d.closeErr
}

func (d *Device) close() error {
	d.closing.Store(true)
	if d.offload {
		var one = [8]byte{1}
		unix.Write(d.evfd, one[:])
		d.pollMu.Lock()
		if d.pollFile != nil {
			d.pollFile.Close()
		}
		d.pollMu.Unlock()
	} else {
		// Closing the *os.File unblocks the pending Read (netpoller).
		d.txMu.Lock()
		d.txClosed = true
		if d.created {
			d.setUp(false)
		}
		err := d.wif.Close()
		d.fd = -1 // closed by water
		d.txMu.Unlock()
		<-d.loopDone
		d.closeFDs()
		return err
	}
	<-d.loopDone

	d.txMu.Lock()
	defer d.txMu.Unlock()
	d.txClosed = true
	var errs []error
	if d.created {
		// Not persistent unless someone set it; make sure, so closing the
		// last fd unregisters the device.
		if err := unix.IoctlSetInt(d.fd, unix.TUNSETPERSIST, 0); err != nil {
			errs = append(errs, fmt.Errorf("tap: TUNSETPERSIST 0 on %q: %w", d.name, err))
		}
		d.setUp(false)
	}
	if err := unix.Close(d.fd); err != nil {
		errs = append(errs, fmt.Errorf("tap: close %q: %w", d.name, err))
	}
	d.fd = -1
	d.closeFDs()
	return errors.Join(errs...)
}

// Gone is closed when the device stops receiving: after Close, or when the
// TAP was deleted or failed under a running endpoint (Err then says why).
func (d *Device) Gone() <-chan struct{} { return d.loopDone }

// Err returns why the device stopped receiving before Close, or nil.
func (d *Device) Err() error {
	select {
	case <-d.loopDone:
		return d.loopErr
	default:
		return nil
	}
}

// closeFDs closes whatever is still open (also used on Open failure).
func (d *Device) closeFDs() {
	if d.fd >= 0 && d.wif == nil {
		unix.Close(d.fd)
		d.fd = -1
	}
	if d.evfd >= 0 {
		unix.Close(d.evfd)
		d.evfd = -1
	}
	if d.ctlfd >= 0 {
		unix.Close(d.ctlfd)
		d.ctlfd = -1
	}
	if d.wif != nil && d.loopDone != nil {
		select {
		case <-d.loopDone:
		default:
			if d.ep == nil { // Open failed before the loop started
				d.wif.Close()
			}
		}
	}
}
