package verbs_test

import (
	"bytes"
	"testing"

	"github.com/rdmatap/rdmatap/verbs"
)

// FuzzRemoteBuf: a peer's buffer descriptor (private data, a Send) decodes
// only from exactly 20 bytes and re-encodes to the same bytes.
func FuzzRemoteBuf(f *testing.F) {
	b, _ := verbs.RemoteBuf{Addr: 0x7f0012345000, Len: 1 << 20, RKey: 0x123456ab}.MarshalBinary()
	f.Add(b)
	f.Add([]byte{})
	f.Add(make([]byte, 21))
	f.Fuzz(func(t *testing.T, in []byte) {
		var r verbs.RemoteBuf
		err := r.UnmarshalBinary(in)
		if (err == nil) != (len(in) == verbs.RemoteBufSize) {
			t.Fatalf("len %d: err %v", len(in), err)
		}
		if err != nil {
			return
		}
		out, _ := r.MarshalBinary()
		if !bytes.Equal(out, in) {
			t.Fatalf("round trip %x -> %x", in, out)
		}
		if s, err := r.Slice(r.Len/2, r.Len-r.Len/2); err != nil || s.Addr != r.Addr+r.Len/2 {
			t.Fatalf("slice: %+v %v", s, err)
		}
		if _, err := r.Slice(r.Len, 1); err == nil {
			t.Fatal("slice past the end accepted")
		}
	})
}
