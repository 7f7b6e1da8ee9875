package ping

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/perftest"
	"github.com/rdmatap/rdmatap/verbs"
)

// TestMarkersFlag: --markers (and rping's single-dash spelling) reaches
// the endpoint's flags in every command that takes them; it is off by
// default.
func TestMarkersFlag(t *testing.T) {
	_, ef, err := ParsePingFlags([]string{"-c", "-a", "192.0.2.2", "-markers"}, io.Discard)
	if err != nil || !ef.Markers {
		t.Fatalf("ping -markers: %+v, %v", ef, err)
	}
	if _, ef, err = ParsePingFlags([]string{"-c", "-a", "192.0.2.2"}, io.Discard); err != nil || ef.Markers {
		t.Fatalf("ping default: markers %v, %v", ef.Markers, err)
	}
	_, ef, err = perftest.ParsePerfFlags(perftest.PerfBW, []string{"write", "--markers", "192.0.2.2"}, io.Discard)
	if err != nil || !ef.Markers {
		t.Fatalf("bw --markers: %+v, %v", ef, err)
	}
}

// TestPingMarkersRejectedWording: rping's one-line rejection says when the
// request asked for markers (what siw refuses), and only then.
func TestPingMarkersRejectedWording(t *testing.T) {
	ctx := context.Background()
	raddr := netip.MustParseAddrPort("10.77.0.2:7174")
	err := connectError(ctx, ctx, raddr, time.Second, fmt.Errorf("verbs: connect: %w", &verbs.RejectedError{Markers: true}))
	if !strings.Contains(err.Error(), "RDMA_CM_EVENT_REJECTED") || !strings.Contains(err.Error(), "markers") {
		t.Fatalf("marker rejection: %v", err)
	}
	err = connectError(ctx, ctx, raddr, time.Second, &verbs.RejectedError{})
	if !strings.Contains(err.Error(), "RDMA_CM_EVENT_REJECTED") || strings.Contains(err.Error(), "markers") {
		t.Fatalf("plain rejection: %v", err)
	}
}
