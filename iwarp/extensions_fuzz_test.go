package iwarp

// Fuzz targets for the RFC 7306 decoders (Atomic Request, Atomic Response,
// Immediate Data) in the style of fuzz_test.go: every input is clipped to
// its length, every accessor is called, and headers re-encode to the bytes
// they were decoded from. FuzzAtomicExecute checks the responder's
// operation against a bit-by-bit model. Run one with, e.g.,
//
//	go test -run XXX -fuzz FuzzAtomicRequest -fuzztime 60s ./iwarp/

import (
	"bytes"
	"encoding/binary"
	"testing"
)

func fclip(b []byte) []byte { return b[:len(b):len(b)] }

func atomicSeeds() [][]byte {
	var out [][]byte
	for _, f := range []AtomicRequestFields{
		{Op: AtomicFetchAdd, RequestID: 1, RemoteSTag: 0x1234500, RemoteTO: 0x10000, AddSwapData: 5},
		{Op: AtomicCmpSwap, RequestID: 2, RemoteSTag: 7, RemoteTO: 8, AddSwapData: 9, AddSwapMask: ^uint64(0), CompareData: 3, CompareMask: ^uint64(0)},
		{Op: AtomicSwap, RequestID: ^uint32(0), RemoteSTag: ^uint32(0), RemoteTO: ^uint64(0), AddSwapData: 1 << 63, AddSwapMask: 0xff00},
		{Op: AtomicFetchAdd, AddSwapData: 0x00000001_ffffffff, AddSwapMask: 1 << 31},
	} {
		b := make([]byte, AtomicRequestSize)
		AtomicRequest(b).Encode(&f)
		out = append(out, b)
	}
	rsvd := bytes.Clone(out[0])
	rsvd[0] = 0xff // reserved bits set
	return append(out, rsvd, make([]byte, AtomicRequestSize-1))
}

func FuzzAtomicRequest(f *testing.F) {
	for _, b := range atomicSeeds() {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < AtomicRequestSize {
			return
		}
		a := AtomicRequest(fclip(data[:AtomicRequestSize]))
		fl := a.Fields()
		_ = a.Op().String()
		if uint32(a.Op())|a.Reserved()<<4 != binary.BigEndian.Uint32(data) {
			t.Fatalf("op %v and reserved %#x do not make up the first word % x", a.Op(), a.Reserved(), data[:4])
		}
		enc := make([]byte, AtomicRequestSize)
		AtomicRequest(enc).Encode(&fl)
		want := bytes.Clone(data[:AtomicRequestSize])
		want[0], want[1], want[2], want[3] = 0, 0, 0, want[3]&0x0f // reserved bits are not kept
		if !bytes.Equal(enc, want) {
			t.Fatalf("re-encoded % x, decoded from % x", enc, data[:AtomicRequestSize])
		}
		if AtomicRequest(enc).Fields() != fl {
			t.Fatal("fields differ after a round trip")
		}
	})
}

func FuzzAtomicResponse(f *testing.F) {
	b := make([]byte, AtomicResponseSize)
	AtomicResponse(b).Encode(0xa1, 1005)
	f.Add(b)
	f.Add(bytes.Repeat([]byte{0xff}, AtomicResponseSize))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < AtomicResponseSize {
			return
		}
		r := AtomicResponse(fclip(data[:AtomicResponseSize]))
		id, v := r.RequestID(), r.OriginalValue()
		enc := make([]byte, AtomicResponseSize)
		AtomicResponse(enc).Encode(id, v)
		if !bytes.Equal(enc, data[:AtomicResponseSize]) {
			t.Fatalf("re-encoded % x, decoded from % x", enc, data[:AtomicResponseSize])
		}
	})
}

func FuzzImmediateData(f *testing.F) {
	for _, v := range []uint64{0, 7, ImmFlagForSend | 0xdeadbeef, ^uint64(0)} {
		b := make([]byte, ImmediateDataSize)
		ImmediateData(b).Encode(v)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < ImmediateDataSize {
			return
		}
		d := ImmediateData(fclip(data[:ImmediateDataSize]))
		v := d.Value()
		if d.Imm() != binary.BigEndian.Uint32(data[4:]) || d.ForSend() != (data[3]&1 != 0) {
			t.Fatalf("imm %#x for-send %v from % x", d.Imm(), d.ForSend(), data[:8])
		}
		enc := make([]byte, ImmediateDataSize)
		ImmediateData(enc).Encode(v)
		if !bytes.Equal(enc, data[:ImmediateDataSize]) {
			t.Fatalf("re-encoded % x, decoded from % x", enc, data[:ImmediateDataSize])
		}
	})
}

// modelAtomic is the responder's operation done one bit at a time.
func modelAtomic(old uint64, f AtomicRequestFields) uint64 {
	switch f.Op {
	case AtomicFetchAdd:
		var sum, carry uint64
		for i := 0; i < 64; i++ {
			a, b := old>>i&1, f.AddSwapData>>i&1
			s := a ^ b ^ carry
			sum |= s << i
			carry = (a&b | a&carry | b&carry) &^ (f.AddSwapMask >> i & 1)
		}
		return sum
	case AtomicSwap:
		return old&^f.AddSwapMask | f.AddSwapData&f.AddSwapMask
	}
	for i := 0; i < 64; i++ {
		if f.CompareMask>>i&1 == 1 && (old^f.CompareData)>>i&1 == 1 {
			return old
		}
	}
	return old&^f.AddSwapMask | f.AddSwapData&f.AddSwapMask
}

func FuzzAtomicExecute(f *testing.F) {
	for _, b := range atomicSeeds()[:4] {
		f.Add(b, uint64(1000))
		f.Add(b, ^uint64(0))
	}
	f.Fuzz(func(t *testing.T, data []byte, old uint64) {
		if len(data) < AtomicRequestSize {
			return
		}
		a := AtomicRequest(fclip(data[:AtomicRequestSize]))
		fl := a.Fields()
		if fl.Op > AtomicCmpSwap {
			return // refused before execution
		}
		w := old
		if got := executeAtomic(&w, a); got != old {
			t.Fatalf("%v returned %#x, the word held %#x", fl.Op, got, old)
		}
		if want := modelAtomic(old, fl); w != want {
			t.Fatalf("%+v on %#x: %#x, model %#x", fl, old, w, want)
		}
	})
}
