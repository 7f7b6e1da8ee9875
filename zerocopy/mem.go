package zerocopy

import (
	"errors"
	"sort"
	"strconv"
	"sync"
	"unsafe"
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
	if b.fd >= 0 {
		backings.remove(b)
	}
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

// Backing finds the memory file behind p, which must lie inside the Bytes
// of one open Buffer made by AllocShared or MapShared: it returns that
// Buffer's descriptor and the offset of p[0] in the file. A process hands
// the pair to another (SCM_RIGHTS) to share exactly the pages p names, as
// verbs does when it registers memory with the endpoint service.
func Backing(p []byte) (fd int, off int64, ok bool) {
	if len(p) == 0 {
		return -1, 0, false
	}
	return backings.find(uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
}

// backings are the open Buffers that have a memory file, by address.
var backings backingSet

type backingSet struct {
	mu   sync.Mutex
	bufs []*Buffer // sorted by address of data[0]
}

func bufAddr(b *Buffer) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b.data))) }

func (s *backingSet) add(b *Buffer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := bufAddr(b)
	i := sort.Search(len(s.bufs), func(i int) bool { return bufAddr(s.bufs[i]) >= a })
	s.bufs = append(s.bufs, nil)
	copy(s.bufs[i+1:], s.bufs[i:])
	s.bufs[i] = b
}

// remove runs with b.mu held, before b.data is cleared.
func (s *backingSet) remove(b *Buffer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, x := range s.bufs {
		if x == b {
			s.bufs = append(s.bufs[:i], s.bufs[i+1:]...)
			return
		}
	}
}

func (s *backingSet) find(a, n uintptr) (int, int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := sort.Search(len(s.bufs), func(i int) bool { return bufAddr(s.bufs[i]) > a }) - 1
	if i < 0 {
		return -1, 0, false
	}
	b := s.bufs[i]
	start := bufAddr(b)
	if a+n > start+uintptr(len(b.data)) {
		return -1, 0, false
	}
	return b.fd, int64(a - start), true
}
