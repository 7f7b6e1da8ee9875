package ping

import (
	"bytes"
	"testing"
)

// FuzzParseRpingInfo: rping's buffer advertisement from the peer: exactly
// 16 bytes, which encode back to themselves; any other length is the
// error rping prints.
func FuzzParseRpingInfo(f *testing.F) {
	var b [rpingInfoSize]byte
	rpingInfo{Buf: 0x7f0000001000, RKey: 0x1234, Size: 64}.put(b[:])
	f.Add(b[:])
	f.Add(b[:15])
	f.Add(append(b[:], 0))
	f.Fuzz(func(t *testing.T, in []byte) {
		r, err := parseRpingInfo(in)
		if len(in) != rpingInfoSize {
			if err == nil {
				t.Fatalf("%d bytes accepted", len(in))
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		var out [rpingInfoSize]byte
		r.put(out[:])
		if !bytes.Equal(out[:], in) {
			t.Fatalf("round trip: %x, want %x", out, in)
		}
	})
}
