//go:build !linux

package zerocopy

import (
	"errors"
	"os"
)

// Registered memory needs mmap and memfd_create; this build only supports
// Linux, so every constructor reports errors.ErrUnsupported.

// Alloc is unsupported on this platform.
func Alloc(n int) (*Buffer, error) {
	if err := checkSize("alloc", n); err != nil {
		return nil, err
	}
	return nil, &MemError{Op: "alloc", Size: n, Err: errors.ErrUnsupported}
}

// AllocShared is unsupported on this platform.
func AllocShared(name string, n int) (*Buffer, error) {
	if err := checkSize("allocshared", n); err != nil {
		return nil, err
	}
	return nil, &MemError{Op: "allocshared", Size: n, Err: errors.ErrUnsupported}
}

// MapShared is unsupported on this platform.
func MapShared(fd int, n int) (*Buffer, error) {
	if err := checkSize("mapshared", n); err != nil {
		return nil, err
	}
	return nil, &MemError{Op: "mapshared", Size: n, Err: errors.ErrUnsupported}
}

// PageSize returns the system page size.
func PageSize() int { return os.Getpagesize() }

func unmap([]byte) error { return errors.ErrUnsupported }

func closeFd(int) error { return errors.ErrUnsupported }
