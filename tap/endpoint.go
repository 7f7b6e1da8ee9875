package tap

import (
	"errors"
	"fmt"
	"github.com/rdmatap/rdmatap/internal/lattrace"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// gsoMaxSize is the largest super-segment handed to the kernel (TSO).
const gsoMaxSize = 65536

// copyBelow: received frames shorter than this are copied into a right-sized
// buffer so that small segments queued in TCP do not pin 64 KiB each; longer
// ones keep the read buffer (at most 2x overhead).
const copyBelow = 32 << 10

// The busy-polling read loop yields the CPU (sched_yield) every
// busyYieldEvery reads and reads the clock every busyClockEvery reads (a
// read that finds nothing takes about 0.2 µs, a sched_yield as long).
// A sched_yield that takes longer than busyYieldLong makes the loop yield
// only after busyYieldPatience without a frame.
const (
	busyYieldEvery    = 4
	busyClockEvery    = 8
	busyYieldLong     = 100 * time.Microsecond
	busyYieldPatience = 30 * time.Microsecond
)

// smallFrame: frames up to this long (with the virtio header) are copied
// into one buffer for the TAP write.
const smallFrame = 256

// endpoint is the Ethernet stack.LinkEndpoint of a Device.
type endpoint struct {
	d    *Device
	caps stack.LinkEndpointCapabilities
	mtu  atomic.Uint32
	addr atomic.Pointer[tcpip.LinkAddress]

	// dispatcher is loaded without a lock by the read loop. Attach(nil)
	// does not wait for an in-flight delivery: it is called by the stack
	// with its own lock held while a delivery may need that lock, and the
	// NIC is already disabled at that point, so it drops such packets.
	dispatcher atomic.Pointer[dispatcherBox]

	onCloseMu sync.Mutex
	onClose   func()
}

var (
	_ stack.LinkEndpoint = (*endpoint)(nil)
	_ stack.GSOEndpoint  = (*endpoint)(nil)
)

func newEndpoint(d *Device) *endpoint {
	e := &endpoint{d: d, caps: stack.CapabilityResolutionRequired}
	if d.offload {
		e.caps |= stack.CapabilityTXChecksumOffload | stack.CapabilityRXChecksumOffload
	}
	e.mtu.Store(uint32(d.mtu))
	a := tcpip.LinkAddress(d.mac)
	e.addr.Store(&a)
	return e
}

func (e *endpoint) MTU() uint32       { return e.mtu.Load() }
func (e *endpoint) SetMTU(mtu uint32) { e.mtu.Store(mtu) }
func (e *endpoint) MaxHeaderLength() uint16 {
	return header.EthernetMinimumSize
}
func (e *endpoint) LinkAddress() tcpip.LinkAddress { return *e.addr.Load() }
func (e *endpoint) SetLinkAddress(a tcpip.LinkAddress) {
	e.addr.Store(&a)
}
func (e *endpoint) Capabilities() stack.LinkEndpointCapabilities { return e.caps }
func (e *endpoint) ARPHardwareType() header.ARPHardwareType      { return header.ARPHardwareEther }

type dispatcherBox struct{ d stack.NetworkDispatcher }

func (e *endpoint) Attach(d stack.NetworkDispatcher) {
	if d == nil {
		e.dispatcher.Store(nil)
		return
	}
	e.dispatcher.Store(&dispatcherBox{d})
}

func (e *endpoint) IsAttached() bool { return e.dispatcher.Load() != nil }

// Wait returns when the read loop has ended (after Device.Close).
func (e *endpoint) Wait() {
	if e.d.closing.Load() {
		<-e.d.loopDone
	}
}

// Close is called by the stack when the NIC is removed; the TAP stays open
// until Device.Close.
func (e *endpoint) Close() {}

func (e *endpoint) SetOnCloseAction(f func()) {
	e.onCloseMu.Lock()
	e.onClose = f
	e.onCloseMu.Unlock()
}

// GSOMaxSize implements stack.GSOEndpoint.
func (e *endpoint) GSOMaxSize() uint32 {
	if e.d.offload {
		return gsoMaxSize
	}
	return 0
}

// SupportedGSO implements stack.GSOEndpoint.
func (e *endpoint) SupportedGSO() stack.SupportedGSO {
	if e.d.offload {
		return stack.HostGSOSupported
	}
	return stack.GSONotSupported
}

func (e *endpoint) AddHeader(pkt *stack.PacketBuffer) {
	eth := header.Ethernet(pkt.LinkHeader().Push(header.EthernetMinimumSize))
	eth.Encode(&header.EthernetFields{
		SrcAddr: pkt.EgressRoute.LocalLinkAddress,
		DstAddr: pkt.EgressRoute.RemoteLinkAddress,
		Type:    pkt.NetworkProtocolNumber,
	})
}

func (e *endpoint) ParseHeader(pkt *stack.PacketBuffer) bool {
	_, ok := pkt.LinkHeader().Consume(header.EthernetMinimumSize)
	return ok
}

// WritePackets implements stack.LinkWriter: one writev per packet (a TAP fd
// has no sendmmsg).
func (e *endpoint) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	d := e.d
	d.txMu.RLock()
	defer d.txMu.RUnlock()
	if d.txClosed {
		return 0, &tcpip.ErrClosedForSend{}
	}
	n := 0
	for _, pkt := range pkts.AsSlice() {
		if err := d.writePacket(pkt); err != nil {
			d.st.txErrors.Add(1)
			if n == 0 {
				return 0, err
			}
			return n, err
		}
		n++
	}
	return n, nil
}

func (d *Device) writePacket(pkt *stack.PacketBuffer) tcpip.Error {
	var h vnetHdr
	gso := false
	hlen := 0
	if d.offload {
		h, gso = txVnetHdr(pkt)
		hlen = vnetHdrLen
	}
	views, off := pkt.AsViewList()
	size := pkt.Size()
	traced := lattrace.Enabled && pkt.TransportProtocolNumber == header.TCPProtocolNumber && pkt.Data().Size() > 0
	var errno unix.Errno
	if hlen+size <= smallFrame {
		// A small frame (an ACK, a short message) goes as one buffer:
		// the kernel takes a single buffer faster than a list. The
		// buffer stays on the stack (no iovec points into it).
		var small [smallFrame]byte
		if hlen > 0 {
			h.encode((*[vnetHdrLen]byte)(small[:vnetHdrLen]))
		}
		n := hlen
		for v := views.Front(); v != nil; v = v.Next() {
			b := v.AsSlice()
			if off >= len(b) {
				off -= len(b)
				continue
			}
			n += copy(small[n:], b[off:])
			off = 0
		}
		if traced {
			lattrace.Mark(lattrace.LinkWrite)
		}
		errno = write1(d.fd, small[:n])
	} else {
		hdrBuf := new([vnetHdrLen]byte)
		var iovArr [16]unix.Iovec
		iovs := iovArr[:0]
		if hlen > 0 {
			h.encode(hdrBuf)
			iovs = appendIov(iovs, hdrBuf[:])
		}
		for v := views.Front(); v != nil; v = v.Next() {
			b := v.AsSlice()
			if off >= len(b) {
				off -= len(b)
				continue
			}
			iovs = appendIov(iovs, b[off:])
			off = 0
		}
		if len(iovs) > 1024 { // UIO_MAXIOV: flatten (never seen in practice)
			flat := make([]byte, 0, size)
			for _, s := range pkt.AsSlices() {
				flat = append(flat, s...)
			}
			iovs = iovs[:0]
			if hlen > 0 {
				iovs = appendIov(iovs, hdrBuf[:])
			}
			iovs = appendIov(iovs, flat)
		}
		if traced {
			lattrace.Mark(lattrace.LinkWrite)
		}
		// Plain path: d.fd is water's fd; Close takes txMu before
		// closing it, so it cannot be closed (and reused) under us.
		errno = writev(d.fd, iovs)
	}
	if traced {
		lattrace.Mark(lattrace.TAPWritten)
	}
	if errno != 0 {
		return tcpip.TranslateErrno(errno)
	}
	d.st.txFrames.Add(1)
	d.st.txBytes.Add(uint64(size))
	if gso {
		d.st.txGSO.Add(1)
	}
	return nil
}

// write1 writes b to fd in one write(2), retrying on EINTR.
func write1(fd int, b []byte) unix.Errno {
	for {
		_, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		if e != unix.EINTR {
			return e
		}
	}
}

func appendIov(iovs []unix.Iovec, b []byte) []unix.Iovec {
	if len(b) == 0 {
		return iovs
	}
	iov := unix.Iovec{Base: &b[0]}
	iov.SetLen(len(b))
	return append(iovs, iov)
}

// writev on a non-blocking fd; a TAP write does not block, so a raw syscall
// avoids the scheduler hand-off.
func writev(fd int, iovs []unix.Iovec) unix.Errno {
	for {
		_, _, e := unix.RawSyscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iovs[0])), uintptr(len(iovs)))
		if e != unix.EINTR {
			return e
		}
	}
}

// readLoop reads frames until Close and delivers them synchronously to the
// attached NIC.
func (d *Device) readLoop() {
	defer close(d.loopDone)
	if d.offload {
		d.readLoopOffload()
	} else {
		d.readLoopPlain()
	}
}

func (d *Device) readLoopOffload() {
	var hdrBuf [vnetHdrLen]byte
	big := buffer.NewViewSize(rxBufSize)
	defer func() { big.Release() }()
	// The loop waits for frames in Go's netpoller, through a duplicate of
	// the TAP's fd, rather than in a blocking poll(2): a goroutine parked
	// in the netpoller costs no thread, and it runs again as soon as a P
	// is free, where one returning from a blocking system call may wait
	// for the scheduler's monitor to notice (tens of microseconds a frame
	// on a busy two-core machine). Close closes the duplicate, which ends
	// the wait.
	rc := d.pollConn()
	pfds := []unix.PollFd{{Fd: int32(d.fd), Events: unix.POLLIN}, {Fd: int32(d.evfd), Events: unix.POLLIN}}
	var last time.Time // the last frame's arrival (busy polling)
	// patient > 0: the busy poll yields the CPU only after that long
	// without a frame (see below).
	var patient time.Duration
	for !d.closing.Load() {
		var iovs [2]unix.Iovec
		iovs[0] = unix.Iovec{Base: &hdrBuf[0]}
		iovs[0].SetLen(vnetHdrLen)
		bs := big.AsSlice()
		iovs[1] = unix.Iovec{Base: &bs[0]}
		iovs[1].SetLen(len(bs))
		var n uintptr
		errno := unix.EAGAIN
		if d.busyPoll > 0 {
			// Busy polling: read again, yielding in between, until a
			// frame comes or BusyPoll has passed since the last one.
			for i := 0; ; i++ {
				// Yield the P first: the frame just delivered has made
				// the stack's goroutines runnable, and they should not
				// wait for another read of the TAP.
				runtime.Gosched()
				if i%busyYieldEvery == busyYieldEvery-1 && (patient == 0 || time.Since(last) >= patient) {
					// And the CPU now and then: a thread that waits
					// for this CPU — the peer's process when two
					// endpoints share a core — runs now rather than
					// when the kernel preempts the spin (a
					// millisecond or more), which would make every
					// message wait out a peer's BusyPoll. With the
					// CPU to itself, sched_yield returns at once.
					//
					// A yield that comes back late went to a thread
					// that keeps the CPU for its time slice (another
					// program's work, not a peer that answers and
					// yields back): from then on the loop yields only
					// after busyYieldPatience without a frame, longer
					// than a small message's round trip, until a
					// yield comes back soon again. Else every message
					// would pay that thread a slice.
					t0 := time.Now()
					unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
					if time.Since(t0) > busyYieldLong {
						patient = busyYieldPatience
					} else {
						patient = 0
					}
				}
				// A raw system call: the fd is non-blocking, and the
				// runtime's bookkeeping around a system call costs as
				// much as the read itself.
				n, _, errno = unix.RawSyscall(unix.SYS_READV, uintptr(d.fd), uintptr(unsafe.Pointer(&iovs[0])), 2)
				if errno != unix.EAGAIN || d.closing.Load() ||
					(i%busyClockEvery == busyClockEvery-1 && time.Since(last) >= d.busyPoll) {
					break
				}
			}
		}
		switch {
		case errno != unix.EAGAIN:
		case rc != nil:
			err := rc.Read(func(uintptr) bool {
				n, _, errno = unix.Syscall(unix.SYS_READV, uintptr(d.fd), uintptr(unsafe.Pointer(&iovs[0])), 2)
				return errno != unix.EAGAIN
			})
			if err != nil {
				if !d.closing.Load() {
					d.st.rxErrors.Add(1)
					d.loopErr = fmt.Errorf("tap: %s: wait for frames: %w", d.name, err)
				}
				return
			}
		default:
			n, _, errno = unix.Syscall(unix.SYS_READV, uintptr(d.fd), uintptr(unsafe.Pointer(&iovs[0])), 2)
		}
		switch errno {
		case 0:
			if d.busyPoll > 0 {
				last = time.Now()
			}
		case unix.EAGAIN:
			if _, err := unix.Poll(pfds, -1); err != nil && !errors.Is(err, unix.EINTR) {
				d.st.rxErrors.Add(1)
				d.loopErr = fmt.Errorf("tap: %s: poll: %w", d.name, err)
				return
			}
			continue
		case unix.EINTR:
			continue
		default:
			// EBADFD etc.: the device was deleted under us.
			d.st.rxErrors.Add(1)
			if !d.closing.Load() {
				d.loopErr = fmt.Errorf("tap: %s: read: %w (the device was deleted or went away)", d.name, errno)
			}
			return
		}
		if int(n) <= vnetHdrLen {
			continue
		}
		flen := int(n) - vnetHdrLen
		d.st.rxFrames.Add(1)
		d.st.rxBytes.Add(uint64(flen))
		var h vnetHdr
		h.decode(hdrBuf[:])
		if h.gsoType&^vnetGSOECN != vnetGSONone {
			d.st.rxGSO.Add(1)
		}
		if flen >= rxBufSize {
			d.st.rxDropped.Add(1) // truncated
			continue
		}
		frame := bs[:flen]
		if h.flags&(vnetFlagNeedsCsum|vnetFlagDataValid) == 0 && !rxChecksumOK(frame) {
			d.st.rxDropped.Add(1)
			continue
		}
		// Headers go into their own small view, the payload into one
		// contiguous view. gVisor pulls up the IP header while holding a
		// reference to it, which copies the whole chunk the header lives in
		// (64 KiB for a GRO frame) unless that chunk is a small one.
		hl := headersLen(frame)
		var payload *buffer.View
		switch {
		case hl >= flen:
			d.deliver(buffer.MakeWithView(buffer.NewViewWithData(frame)), frame)
			continue
		case flen < copyBelow:
			payload = buffer.NewViewWithData(frame[hl:])
		default:
			payload = big
			payload.CapLength(flen)
			payload.TrimFront(hl)
			big = buffer.NewViewSize(rxBufSize)
		}
		hv := buffer.NewViewWithData(frame[:hl])
		// frame may now belong to payload; deliver only reads the header.
		buf := buffer.MakeWithView(hv)
		buf.Append(payload)
		d.deliver(buf, hv.AsSlice())
	}
}

// pollConn returns a raw connection on a duplicate of the TAP's fd, for
// waiting in Go's netpoller (nil if that cannot be set up: the loop then
// falls back to poll(2)).
func (d *Device) pollConn() syscall.RawConn {
	dup, err := unix.FcntlInt(uintptr(d.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	f := os.NewFile(uintptr(dup), d.name) // non-blocking: the netpoller takes it
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil
	}
	d.pollMu.Lock()
	if d.closing.Load() {
		d.pollMu.Unlock()
		f.Close()
		return nil
	}
	d.pollFile = f
	d.pollMu.Unlock()
	return rc
}

// headersLen returns the length of the Ethernet, IP and TCP headers of a
// TCP frame, or len(frame) for anything else.
func headersLen(frame []byte) int {
	const eth = header.EthernetMinimumSize
	if len(frame) < eth+header.IPv4MinimumSize {
		return len(frame)
	}
	var l4 int
	switch header.Ethernet(frame).Type() {
	case header.IPv4ProtocolNumber:
		ip := header.IPv4(frame[eth:])
		if ip.Protocol() != uint8(header.TCPProtocolNumber) {
			return len(frame)
		}
		l4 = eth + int(ip.HeaderLength())
	case header.IPv6ProtocolNumber:
		if len(frame) < eth+header.IPv6MinimumSize || header.IPv6(frame[eth:]).NextHeader() != uint8(header.TCPProtocolNumber) {
			return len(frame)
		}
		l4 = eth + header.IPv6MinimumSize
	default:
		return len(frame)
	}
	if len(frame) < l4+header.TCPMinimumSize {
		return len(frame)
	}
	hl := l4 + int(header.TCP(frame[l4:]).DataOffset())
	if hl < l4+header.TCPMinimumSize || hl > len(frame) {
		return len(frame)
	}
	return hl
}

func (d *Device) readLoopPlain() {
	buf := make([]byte, rxBufSize)
	for {
		n, err := d.wif.Read(buf)
		if err != nil {
			if d.closing.Load() {
				return
			}
			d.st.rxErrors.Add(1)
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
				continue
			}
			d.loopErr = fmt.Errorf("tap: %s: read: %w (the device was deleted or went away)", d.name, err)
			return
		}
		if n == 0 {
			continue
		}
		d.st.rxFrames.Add(1)
		d.st.rxBytes.Add(uint64(n))
		v := buffer.NewViewWithData(buf[:n])
		d.deliver(buffer.MakeWithView(v), v.AsSlice())
	}
}

// deliver hands a frame to the stack; it takes ownership of buf. hdr holds
// at least the Ethernet header of the frame.
func (d *Device) deliver(buf buffer.Buffer, hdr []byte) {
	if lattrace.Enabled && lattrace.TCPPayload(hdr) > 0 {
		lattrace.Mark(lattrace.TAPRead)
		defer lattrace.Mark(lattrace.Delivered)
	}
	if len(hdr) < header.EthernetMinimumSize {
		buf.Release()
		d.st.rxDropped.Add(1)
		return
	}
	eth := header.Ethernet(hdr)
	dst := eth.DestinationAddress()
	pktType := tcpip.PacketHost
	switch {
	case dst == header.EthernetBroadcastAddress:
		pktType = tcpip.PacketBroadcast
	case header.IsMulticastEthernetAddress(dst):
		pktType = tcpip.PacketMulticast
	case dst != d.ep.LinkAddress():
		buf.Release()
		d.st.rxDropped.Add(1)
		return
	}
	proto := eth.Type()
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buf})
	defer pkt.DecRef()
	if _, ok := pkt.LinkHeader().Consume(header.EthernetMinimumSize); !ok {
		d.st.rxDropped.Add(1)
		return
	}
	pkt.PktType = pktType
	pkt.NetworkProtocolNumber = proto
	// The NIC sets RXChecksumValidated from the link capabilities (RX
	// checksum offload on the vnet path); set it here too for consumers
	// that look at the packet before the NIC does.
	pkt.RXChecksumValidated = d.offload

	box := d.ep.dispatcher.Load()
	if box == nil {
		d.st.rxDropped.Add(1)
		return
	}
	box.d.DeliverNetworkPacket(proto, pkt)
}
