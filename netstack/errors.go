package netstack

import (
	"errors"
	"io"
	"net"
	"syscall"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// sentinel is an exported error value that also matches a syscall errno with
// errors.Is, so callers can test either ErrReset or syscall.ECONNRESET.
type sentinel struct {
	msg     string
	errno   syscall.Errno
	timeout bool
}

func (e *sentinel) Error() string   { return e.msg }
func (e *sentinel) Unwrap() error   { return e.errno }
func (e *sentinel) Timeout() bool   { return e.timeout }
func (e *sentinel) Temporary() bool { return e.timeout }

var (
	// ErrReset reports that the peer reset the connection (TCP RST).
	// errors.Is(err, syscall.ECONNRESET) also holds for it.
	ErrReset error = &sentinel{msg: "connection reset by peer", errno: syscall.ECONNRESET}

	// ErrTimeout reports that a connection attempt (or a retransmission or
	// user timeout of an established connection) timed out.
	// errors.Is(err, syscall.ETIMEDOUT) also holds for it.
	ErrTimeout error = &sentinel{msg: "connection timed out", errno: syscall.ETIMEDOUT, timeout: true}

	// ErrConfig is matched (errors.Is) by every configuration error of New,
	// NewPair and Listen/Dial address validation.
	ErrConfig = errors.New("netstack: invalid configuration")
)

// configError is an invalid-argument error; it matches ErrConfig and
// syscall.EINVAL.
type configError struct{ msg string }

func (e *configError) Error() string { return "netstack: " + e.msg }
func (e *configError) Unwrap() []error {
	return []error{ErrConfig, syscall.EINVAL}
}

func errConfig(msg string) error { return &configError{msg: msg} }

// OpError is the error type returned for failed stack operations. It carries
// the operation name, the original gVisor error and the Go error it maps to
// (a syscall.Errno, ErrReset, ErrTimeout, net.ErrClosed...). errors.Is and
// errors.As see through it to the mapped error.
type OpError struct {
	Op    string      // "dial", "listen", "accept", "read", "write", "shutdown"
	Addr  string      // remote or local address involved, may be empty
	TCPIP tcpip.Error // the gVisor error, nil if the error did not come from gVisor
	Err   error       // the mapped Go error
}

func (e *OpError) Error() string {
	s := "netstack: " + e.Op
	if e.Addr != "" {
		s += " " + e.Addr
	}
	return s + ": " + e.Err.Error()
}

func (e *OpError) Unwrap() error { return e.Err }

// Timeout reports whether the error is a timeout (net.Error style).
func (e *OpError) Timeout() bool {
	var t interface{ Timeout() bool }
	return errors.As(e.Err, &t) && t.Timeout()
}

// Temporary is part of the legacy net.Error interface.
func (e *OpError) Temporary() bool { return e.Timeout() }

var _ net.Error = (*OpError)(nil)

// errnoError gives a gVisor error a Go error value that prints gVisor's
// message but matches the corresponding errno.
type errnoError struct {
	msg   string
	errno syscall.Errno
}

func (e *errnoError) Error() string { return e.msg }
func (e *errnoError) Unwrap() error { return e.errno }

// MapError converts a gVisor tcpip.Error into a Go error. The result matches
// (errors.Is) the corresponding syscall.Errno; resets map to ErrReset,
// timeouts to ErrTimeout, a receive side closed by the peer to io.EOF and
// ErrWouldBlock to syscall.EAGAIN. MapError(nil) is nil.
func MapError(err tcpip.Error) error {
	if err == nil {
		return nil
	}
	switch err.(type) {
	case *tcpip.ErrConnectionReset:
		return ErrReset
	case *tcpip.ErrTimeout:
		return ErrTimeout
	case *tcpip.ErrClosedForReceive:
		return io.EOF
	}
	msg := err.String()
	var errno syscall.Errno
	switch err.(type) {
	case *tcpip.ErrConnectionRefused:
		errno = syscall.ECONNREFUSED
	case *tcpip.ErrConnectionAborted, *tcpip.ErrAborted:
		errno = syscall.ECONNABORTED
	case *tcpip.ErrPortInUse:
		errno = syscall.EADDRINUSE
	case *tcpip.ErrDuplicateAddress:
		errno = syscall.EEXIST
	case *tcpip.ErrBadLocalAddress, *tcpip.ErrNoPortAvailable:
		errno = syscall.EADDRNOTAVAIL
	case *tcpip.ErrClosedForSend:
		errno = syscall.EPIPE
	case *tcpip.ErrWouldBlock:
		errno = syscall.EAGAIN
	case *tcpip.ErrConnectStarted:
		errno = syscall.EINPROGRESS
	case *tcpip.ErrAlreadyConnecting:
		errno = syscall.EALREADY
	case *tcpip.ErrAlreadyConnected:
		errno = syscall.EISCONN
	case *tcpip.ErrNotConnected:
		errno = syscall.ENOTCONN
	case *tcpip.ErrHostUnreachable, *tcpip.ErrHostDown:
		errno = syscall.EHOSTUNREACH
	case *tcpip.ErrNetworkUnreachable, *tcpip.ErrNoNet:
		errno = syscall.ENETUNREACH
	case *tcpip.ErrNoBufferSpace:
		errno = syscall.ENOBUFS
	case *tcpip.ErrMessageTooLong:
		errno = syscall.EMSGSIZE
	case *tcpip.ErrNotSupported, *tcpip.ErrQueueSizeNotSupported:
		errno = syscall.EOPNOTSUPP
	case *tcpip.ErrAddressFamilyNotSupported:
		errno = syscall.EAFNOSUPPORT
	case *tcpip.ErrDestinationRequired:
		errno = syscall.EDESTADDRREQ
	case *tcpip.ErrNotPermitted:
		errno = syscall.EPERM
	case *tcpip.ErrNoSuchFile:
		errno = syscall.ENOENT
	case *tcpip.ErrBadAddress, *tcpip.ErrBadBuffer:
		errno = syscall.EFAULT
	default:
		// ErrInvalidEndpointState, ErrInvalidOptionValue, ErrMalformedHeader,
		// ErrUnknownProtocol, ErrInvalidNICID ... : invalid argument.
		errno = syscall.EINVAL
	}
	return &errnoError{msg: msg, errno: errno}
}

func opError(op, addr string, err tcpip.Error) error {
	return &OpError{Op: op, Addr: addr, TCPIP: err, Err: MapError(err)}
}

func closedError(op string) error {
	return &OpError{Op: op, Err: net.ErrClosed}
}
