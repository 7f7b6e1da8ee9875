package perftest

import (
	"bytes"
	"math"
	"strconv"
	"testing"
)

// FuzzParseDest: perftest's pingpong_dest from the peer. Anything shorter
// than 56 bytes is an error; anything else decodes, and encodes back to
// the same 56 bytes (but the 4 pad bytes, which are sent as zeros).
func FuzzParseDest(f *testing.F) {
	var b [perfDestSize]byte
	perfDest{LID: 1, QPN: 0x11, PSN: 0x22, RKey: 0xabcdef01, VAddr: 0x7f0000001000, SRQN: 3, GIDIndex: 4}.marshal(b[:])
	f.Add(b[:])
	f.Add(b[:10])
	f.Add(append(b[:], 1, 2, 3))
	f.Fuzz(func(t *testing.T, in []byte) {
		d, err := parseDest(in)
		if len(in) < perfDestSize {
			if err == nil {
				t.Fatalf("%d bytes accepted", len(in))
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		var out [perfDestSize]byte
		d.marshal(out[:])
		want := bytes.Clone(in[:perfDestSize])
		clear(want[20:24])
		if !bytes.Equal(out[:], want) {
			t.Fatalf("round trip: %x, want %x", out, want)
		}
	})
}

// FuzzParseRemoteVersion: the peer's perftest version field. An accepted
// version is the field up to its first NUL, a finite number of at least
// 5.70; nothing else is accepted.
func FuzzParseRemoteVersion(f *testing.F) {
	for _, s := range []string{"6.06\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00", "5.70", "5.69", "NaN", "+Inf", "1e400", "", "6.06 "} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		v, err := parseRemoteVersion(in)
		if err != nil {
			return
		}
		if len(v) > 16 || bytes.IndexByte([]byte(v), 0) >= 0 || !bytes.HasPrefix(in, []byte(v)) {
			t.Fatalf("accepted %q from %q", v, in)
		}
		x, perr := strconv.ParseFloat(v, 64)
		if perr != nil || !(x >= perfMinRemVer) || math.IsInf(x, 0) {
			t.Fatalf("accepted version %q (%v, %v)", v, x, perr)
		}
	})
}
