//go:build !linux

package zerocopy

import (
	"testing"
	"unsafe"
)

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

func guardPagesTest(t *testing.T) { t.Skip("guard pages need linux mmap") }
