package interop

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestSiwMarkersRejected asks Linux siw for MPA markers: siw rejects any
// MPA Request with M (a Reply with R set and M cleared), and rdmatap must
// report that as a clear error naming markers, then connect as usual
// without them.
func TestSiwMarkersRejected(t *testing.T) {
	e := setup(t)
	v := e.bootVM(t, "fix", 4096, "server", "rping")
	if !v.waitReady(t, "rping") {
		t.Fatalf("VM server never ready:\n%s", tail(v.log.Bytes(), 30))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := e.ours(ctx, "ping", "-c", "-a", vmIP, "-C", "1", "-v", "--markers")
	if err == nil {
		t.Fatalf("siw accepted a request for markers:\n%s", out)
	}
	low := strings.ToLower(out)
	if !strings.Contains(low, "rejected") || !strings.Contains(low, "markers") {
		t.Fatalf("want a rejection naming markers, got:\n%s", out)
	}
	t.Logf("rdmatap with --markers against siw: %s", strings.TrimSpace(out))
	// siw's rping never saw the rejected request; it serves the next one.
	if out, err := e.ours(ctx, "ping", "-c", "-a", vmIP, "-C", "1", "-v"); err != nil {
		t.Fatalf("ping without markers after the rejection: %v\n%s", err, out)
	}
	<-v.done
}
