package svc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Socket plumbing: messages are SOCK_SEQPACKET datagrams ("unixpacket"),
// descriptors ride along as SCM_RIGHTS, and the service learns who its
// client is from SO_PEERCRED.

// Errors of the socket layer.
var (
	ErrTruncated = errors.New("svc: message or its descriptors truncated")
	ErrFDs       = errors.New("svc: too many descriptors")
)

// Write sends m with fds.
func Write(c *net.UnixConn, m Msg, fds ...int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_, _, err := c.WriteMsgUnix(m, oob, nil)
	return err
}

// OOBSpace is the control buffer Read needs.
var OOBSpace = unix.CmsgSpace(4 * MaxFDs)

// Read receives one datagram into buf (MaxMessage bytes) with its
// descriptors (oob holds OOBSpace bytes). It returns the message unchecked
// (see Msg.Check) and the descriptors, which the caller owns; on any error
// every received descriptor is closed already.
func Read(c *net.UnixConn, buf, oob []byte, fds []int) (Msg, []int, error) {
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	fds = fds[:0]
	if oobn > 0 {
		cmsgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		if perr == nil {
			for _, cm := range cmsgs {
				got, rerr := unix.ParseUnixRights(&cm)
				if rerr == nil {
					fds = append(fds, got...)
				}
			}
		}
	}
	fail := func(e error) (Msg, []int, error) {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, nil, e
	}
	if errors.Is(err, io.EOF) {
		return fail(net.ErrClosed)
	}
	if err != nil {
		return fail(err)
	}
	if n == 0 && oobn == 0 {
		return fail(net.ErrClosed) // SOCK_SEQPACKET: end of file
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		return fail(ErrTruncated)
	}
	if len(fds) > MaxFDs {
		return fail(ErrFDs)
	}
	return Msg(buf[:n]), fds, nil
}

// Cred is a peer's identity.
type Cred struct{ PID, UID, GID int }

// PeerCred returns the identity of c's peer (SO_PEERCRED).
func PeerCred(c *net.UnixConn) (Cred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return Cred{}, err
	}
	var u *unix.Ucred
	var uerr error
	if err := rc.Control(func(fd uintptr) { u, uerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return Cred{}, err
	}
	if uerr != nil {
		return Cred{}, uerr
	}
	return Cred{PID: int(u.Pid), UID: int(u.Uid), GID: int(u.Gid)}, nil
}

// NewMemfd makes a sealed memfd of size bytes (it can be neither shrunk nor
// grown, nor its seals changed) and maps it shared.
func NewMemfd(name string, size int) (int, []byte, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, err
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return -1, nil, err
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return -1, nil, err
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return -1, nil, err
	}
	return fd, mem, nil
}

// MapFile maps length bytes of the file behind fd from off, shared. With
// needSealed the file must be a memfd sealed against shrinking (a client
// could otherwise truncate it under the mapping and fault the service).
// It returns the mapping and the part of it [off, off+length) stands for.
//
// The seals are read before the size: once F_SEAL_SHRINK is on, no one can
// shrink the file again, so the size read after it bounds the file for
// as long as the mapping lives. Read the other way round, a client could
// truncate the file between the two reads and seal it then: both checks
// would pass and the service would map pages past the file's end, whose
// first touch is a SIGBUS no recover catches.
func MapFile(fd int, off int64, length int, needSealed bool) (mapping, part []byte, err error) {
	if off < 0 || length <= 0 {
		return nil, nil, fmt.Errorf("svc: bad range %d+%d", off, length)
	}
	if needSealed {
		seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
		if err != nil || seals&unix.F_SEAL_SHRINK == 0 {
			return nil, nil, errors.New("svc: memory file not sealed against shrinking (use zerocopy.AllocShared)")
		}
	}
	if testHookSealsChecked != nil {
		testHookSealsChecked(fd)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, nil, errors.New("svc: descriptor is not a regular file")
	}
	if off+int64(length) > st.Size || off+int64(length) < off {
		return nil, nil, fmt.Errorf("svc: range %d+%d beyond the file's %d bytes", off, length, st.Size)
	}
	page := int64(os.Getpagesize())
	start := off &^ (page - 1)
	n := int(off + int64(length) - start)
	mem, err := unix.Mmap(fd, start, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, err
	}
	s := int(off - start)
	return mem, mem[s : s+length : s+length], nil
}

// testHookSealsChecked, when set by a test, runs between MapFile's two
// checks: what a racing client may do to the file there.
var testHookSealsChecked func(fd int)

// Unmap releases a mapping made by NewMemfd, MapFile or MapRing.
func Unmap(mem []byte) error { return unix.Munmap(mem) }

// MapRing maps a ring memfd received from the service.
func MapRing(fd int) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Size < RingHeader || st.Size > 1<<32 {
		return nil, errors.New("svc: ring file of a bad size")
	}
	return unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
}

// Eventfd is a doorbell: an eventfd, non-blocking, waited on through the
// Go poller (no thread per waiter), or briefly in a system call
// (WaitThread).
type Eventfd struct {
	f  *os.File
	fd int
	// WaitThread's state (one caller at a time).
	rc   syscall.RawConn
	ctl  func(uintptr)
	pfd  [1]unix.PollFd
	ts   unix.Timespec
	rang bool
	err  error
}

// NewEventfd makes an eventfd.
func NewEventfd() (*Eventfd, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, err
	}
	return &Eventfd{f: os.NewFile(uintptr(fd), "eventfd"), fd: fd}, nil
}

// OpenEventfd adopts a received eventfd descriptor.
func OpenEventfd(fd int) (*Eventfd, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &Eventfd{f: os.NewFile(uintptr(fd), "eventfd"), fd: fd}, nil
}

// Fd returns the descriptor (to pass to the other side).
func (e *Eventfd) Fd() int { return e.fd }

// Signal rings the doorbell (one write(2)).
func (e *Eventfd) Signal() {
	var b [8]byte
	binary.NativeEndian.PutUint64(b[:], 1)
	unix.Write(e.fd, b[:])
}

// Wait blocks until the doorbell rings (consuming every ring so far), the
// deadline set with SetDeadline passes, or the Eventfd is closed.
func (e *Eventfd) Wait() error {
	var b [8]byte
	_, err := e.f.Read(b[:])
	return err
}

// WaitThread waits up to d for the doorbell in a system call of the
// calling goroutine's thread rather than through the Go poller, and
// consumes the rings it finds; it reports whether it rang. The Go
// scheduler looks at the poller only when its run queues are empty, so
// while other goroutines spin with runtime.Gosched a Wait can end
// milliseconds after its doorbell rang (the runtime's monitor polls
// every 10 ms at most); a thread woken from ppoll(2) takes the next turn
// instead. It holds a thread (and, until the runtime takes it back, a P)
// for up to d: for short waits. One caller at a time; it allocates
// nothing.
func (e *Eventfd) WaitThread(d time.Duration) (bool, error) {
	if e.rc == nil {
		rc, err := e.f.SyscallConn()
		if err != nil {
			return false, err
		}
		e.rc, e.ctl = rc, e.pollCtl
	}
	e.ts = unix.NsecToTimespec(int64(d))
	e.rang, e.err = false, nil
	if err := e.rc.Control(e.ctl); err != nil {
		return false, err // closed
	}
	return e.rang, e.err
}

func (e *Eventfd) pollCtl(fd uintptr) {
	e.pfd[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	n, err := unix.Ppoll(e.pfd[:], &e.ts, nil)
	if err != nil {
		if err != unix.EINTR {
			e.err = err
		}
		return
	}
	if n > 0 && e.pfd[0].Revents&unix.POLLIN != 0 {
		var b [8]byte
		unix.Read(int(fd), b[:])
		e.rang = true
	}
}

// SetDeadline bounds Wait (the zero time removes the bound).
func (e *Eventfd) SetDeadline(t time.Time) error { return e.f.SetReadDeadline(t) }

// Close closes the eventfd; a Wait in progress returns os.ErrClosed.
func (e *Eventfd) Close() error { return e.f.Close() }

// Dup duplicates a descriptor (close-on-exec).
func Dup(fd int) (int, error) { return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0) }
