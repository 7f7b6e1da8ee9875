package zerocopy

import (
	"errors"
	"strconv"
	"sync"
)

// MaxAlloc is the largest size Alloc, AllocShared and MapShared accept.
const MaxAlloc = 1 << 40

// Errors reported (wrapped in a *MemError) by the memory functions; test with
// errors.Is.
var (
	// ErrInvalidSize: the size is not in (0, MaxAlloc].
	ErrInvalidSize = errors.New("zerocopy: size out of range")
	// ErrInvalidFd: the descriptor is negative.
	ErrInvalidFd = errors.New("zerocopy: invalid file descriptor")
	// ErrNotMappable: the descriptor does not refer to a regular file or
	// memfd, so it cannot be mapped as registered memory.
	ErrNotMappable = errors.New("zerocopy: descriptor is not a mappable file")
	// ErrFileTooSmall: the file behind the descriptor is shorter than the
	// requested mapping (touching the excess would raise SIGBUS).
	ErrFileTooSmall = errors.New("zerocopy: file smaller than the requested mapping")
	// ErrInvalidName: the memfd name contains a NUL byte or is too long.
	ErrInvalidName = errors.New("zerocopy: invalid memfd name")
)

// MemError describes a failed memory operation.
type MemError struct {
	Op   string // "alloc", "allocshared", "mapshared" or "close"
	Size int    // requested size in bytes
	Err  error  // one of the Err* values above or a syscall.Errno
}

func (e *MemError) Error() string {
	return "zerocopy: " + e.Op + " (" + strconv.Itoa(e.Size) + " bytes): " + e.Err.Error()
}

func (e *MemError) Unwrap() error { return e.Err }

// Buffer is a region of registered memory: page-aligned, outside the Go heap
// (never moved by the garbage collector), and optionally shared with other
// processes through a memory file descriptor.
//
// A Buffer must be released with Close; it is not freed by the garbage
// collector. Slices obtained from Bytes must not be used after Close (the
// memory is unmapped and an access faults). Close is safe to call from any
// goroutine, more than once, but must not race with users of the memory.
type Buffer struct {
	mu   sync.Mutex
	data []byte // len == cap == requested size; nil after Close
	mem  []byte // the whole mapping as returned by mmap; nil after Close
	fd   int    // owned descriptor, -1 if none
}

// Bytes returns the buffer's memory: exactly the requested number of bytes,
// starting on a page boundary, with capacity equal to length. It returns nil
// after Close.
func (b *Buffer) Bytes() []byte {
	if b == nil {
		return nil
	}
	return b.data
}

// Fd returns the memory file descriptor backing the buffer, which can be
// passed to another process (SCM_RIGHTS) for MapShared, or -1 for private
// memory and after Close. The descriptor is owned by the Buffer.
func (b *Buffer) Fd() int {
	if b == nil {
		return -1
	}
	return b.fd
}

// Len returns the size of the buffer in bytes (0 after Close).
func (b *Buffer) Len() int {
	if b == nil {
		return 0
	}
	return len(b.data)
}

// Close unmaps the memory and closes the owned descriptor, if any. Calling
// Close again (or on a nil Buffer) does nothing and returns nil.
func (b *Buffer) Close() error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mem == nil {
		return nil
	}
	size := len(b.data)
	mem, fd := b.mem, b.fd
	b.data, b.mem, b.fd = nil, nil, -1
	err := unmap(mem)
	if fd >= 0 {
		if cerr := closeFd(fd); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return &MemError{Op: "close", Size: size, Err: err}
	}
	return nil
}

// checkSize validates a requested size.
func checkSize(op string, n int) error {
	if n <= 0 || uint64(n) > MaxAlloc {
		return &MemError{Op: op, Size: n, Err: ErrInvalidSize}
	}
	return nil
}
