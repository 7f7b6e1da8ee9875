package capi_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/verbs"
)

// TestBadArgs runs testdata/badargs.c: bad arguments to libibverbs and
// librdmacm get the errnos rdma-core and siw give (each case in the
// program names the reference's), nothing crashes or hangs, and the
// objects a refused call named go on working; also with ASan and UBSan.
// testdata/cm.c runs beside it on the same service, and a new client is
// served after it: the bad calls disturb no other client.
func TestBadArgs(t *testing.T) {
	for _, san := range []bool{false, true} {
		t.Run(fmt.Sprintf("sanitize=%v", san), func(t *testing.T) {
			dir := libs(t, san)
			prog := compileCM(t, dir, "testdata/badargs.c", san)
			cm := compileCM(t, dir, "testdata/cm.c", san)
			s := startService(t)
			other := command(t, dir, s.sock, cm, s.addr)
			var otherOut bytes.Buffer
			other.Stdout, other.Stderr = &otherOut, &otherOut
			if err := other.Start(); err != nil {
				t.Fatal(err)
			}
			otherDone := make(chan error, 1)
			go func() { otherDone <- other.Wait() }()
			otherWaited := false
			t.Cleanup(func() {
				if !otherWaited {
					other.Process.Kill()
					<-otherDone
				}
			})
			c := command(t, dir, s.sock, prog, s.addr)
			c.Env = append(c.Env, "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1", "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
			done := make(chan struct{})
			defer close(done)
			go func() {
				select {
				case <-done:
				case <-time.After(2 * time.Minute):
					c.Process.Kill()
				}
			}()
			out, err := c.CombinedOutput()
			t.Logf("%s", out)
			if err != nil || !bytes.Contains(out, []byte("cases ok\n")) {
				t.Fatalf("badargs: %v", err)
			}
			otherWaited = true
			select {
			case err := <-otherDone:
				if err != nil || !bytes.Contains(otherOut.Bytes(), []byte("ok\n")) {
					t.Fatalf("cm beside badargs: %v\n%s", err, otherOut.String())
				}
			case <-time.After(time.Minute):
				otherWaited = false
				t.Fatalf("cm beside badargs did not finish\n%s", otherOut.String())
			}
			waitClients(t, s, 0)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			d, err := verbs.Connect(ctx, s.sock)
			if err != nil {
				t.Fatalf("a client after badargs: %v", err)
			}
			defer d.Close()
			if _, err := d.AllocPD(); err != nil {
				t.Fatalf("a client after badargs: %v", err)
			}
		})
	}
}

// waitClients waits (up to 10 s) until the service has n clients.
func waitClients(t testing.TB, s *testService, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.srv.Clients() != n {
		if time.Now().After(deadline) {
			t.Fatalf("the service has %d clients, want %d: %+v", s.srv.Clients(), n, s.srv.ClientStats())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
