package lattrace

import (
	"bytes"
	"strings"
	"testing"
)

// frame returns an Ethernet/IPv4/TCP frame's headers for a segment of
// payload bytes (options: IP 4 bytes, TCP 12 bytes).
func frame(payload int) []byte {
	f := make([]byte, 14+24+32)
	f[12], f[13] = 0x08, 0x00
	ip := f[14:]
	ip[0] = 0x46 // version 4, 24-byte header
	total := 24 + 32 + payload
	ip[2], ip[3] = byte(total>>8), byte(total)
	ip[9] = 6
	ip[24+12] = 8 << 4 // 32-byte TCP header
	return f
}

func TestTCPPayload(t *testing.T) {
	for _, n := range []int{0, 2, 1448, 65000} {
		if got := TCPPayload(frame(n)); got != n {
			t.Errorf("payload %d: got %d", n, got)
		}
	}
	udp := frame(10)
	udp[14+9] = 17
	arp := frame(10)
	arp[13] = 0x06
	v6 := frame(10)
	v6[14] = 0x66
	for name, f := range map[string][]byte{"udp": udp, "arp": arp, "ipv6 version": v6, "short": frame(10)[:40], "empty": nil} {
		if got := TCPPayload(f); got != 0 {
			t.Errorf("%s: got %d, want 0", name, got)
		}
	}
}

func FuzzTCPPayload(f *testing.F) {
	f.Add(frame(2))
	f.Add(frame(0)[:20])
	f.Fuzz(func(t *testing.T, b []byte) {
		if n := TCPPayload(b); n < 0 || n > 0xffff {
			t.Fatalf("payload %d out of range", n)
		}
	})
}

func TestStageNames(t *testing.T) {
	for s := range NumStages {
		got, ok := ParseStage(s.String())
		if !ok || got != s {
			t.Errorf("stage %d (%q) parses as %d, %v", s, s, got, ok)
		}
	}
	if _, ok := ParseStage("nonsense"); ok {
		t.Error("an unknown name parsed")
	}
}

// TestMarks: with the rdmatrace tag, marks come back in Dump; without it,
// nothing is recorded.
func TestMarks(t *testing.T) {
	MarkAt(Post, 1234)
	Mark(AppSaw)
	var b bytes.Buffer
	if err := Dump(&b); err != nil {
		t.Fatal(err)
	}
	has := strings.Contains(b.String(), "post 1234\n") && strings.Contains(b.String(), "app_saw ")
	if has != Enabled {
		t.Errorf("Enabled %v, but the dump is %q", Enabled, b.String())
	}
}
