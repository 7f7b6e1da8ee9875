package capi_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"
)

// TestCMBind runs testdata/cmbind.c: connections from a port chosen at
// bind and from one the service picked, QP-to-ERROR, and DISCONNECTED's
// status (see the program's comment), also with ASan and UBSan.
func TestCMBind(t *testing.T) {
	for _, sanitize := range []bool{false, true} {
		t.Run(fmt.Sprintf("sanitize=%v", sanitize), func(t *testing.T) {
			dir := libs(t, sanitize)
			prog := compileCM(t, dir, "testdata/cmbind.c", sanitize)
			s := startService(t)
			c := command(t, dir, s.sock, prog, s.addr)
			c.Env = append(c.Env, "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1", "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
			done := make(chan struct{})
			defer close(done)
			go func() {
				select {
				case <-done:
				case <-time.After(60 * time.Second):
					c.Process.Kill()
				}
			}()
			out, err := c.CombinedOutput()
			if err != nil || !bytes.Contains(out, []byte("ok\n")) {
				t.Fatalf("%v\n%s", err, out)
			}
		})
	}
}
