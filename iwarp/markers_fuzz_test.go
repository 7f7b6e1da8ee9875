package iwarp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// refStrip removes the markers from a marked stream one octet at a time,
// the rules spelled out independently of markerStripper: at each marker
// the FPDUPTR must be zero if the next FPDU-stream octet starts an FPDU,
// else the distance back to the current FPDU's ULPDU_Length field; with
// crcOn each CRC octet must match the CRC32c of the FPDU's octets on the
// wire before the field. It returns the FPDU-stream octets before the
// first error and the error's LLP/MPA code (0 for none).
func refStrip(wire []byte, crcOn bool) ([]byte, uint8) {
	var out []byte
	var wireOf []int
	next := 0         // FPDU-stream offset of the next FPDU, -1 while its ULPDU_Length is read
	cur, curW := 0, 0 // the current FPDU's FPDU-stream and stream offsets
	for w := range wire {
		if w%MPAMarkerInterval < MPAMarkerSize {
			if w%MPAMarkerInterval == MPAMarkerSize-1 {
				ptr := int(binary.BigEndian.Uint16(wire[w-1:]))
				want := 0
				if len(out) != next {
					want = w - (MPAMarkerSize - 1) - curW
				}
				if ptr != want {
					return out, CodeFPDUStart
				}
			}
			continue
		}
		d := len(out)
		if d == next {
			cur, curW, next = d, w, -1
		}
		out = append(out, wire[w])
		wireOf = append(wireOf, w)
		if d == cur+1 {
			next = cur + FPDULen(int(binary.BigEndian.Uint16(out[cur:])))
		}
		if crcOn && next > 0 && d >= next-MPACRCSize {
			var f [4]byte
			binary.LittleEndian.PutUint32(f[:], crc32.Checksum(wire[curW:wireOf[next-MPACRCSize]], markerCRCTable))
			if wire[w] != f[d-(next-MPACRCSize)] {
				return out[:d], CodeCRC
			}
		}
	}
	return out, 0
}

// FuzzMarkerStripper feeds arbitrary peer bytes, cut anywhere, to
// markerStripper: it must never panic, and must forward exactly what the
// reference does and stop with the same error.
func FuzzMarkerStripper(f *testing.F) {
	rng := rand.New(rand.NewPCG(11, 13))
	for i := range 8 {
		crcOn := i%2 == 0
		r := refMark(randomFPDUs(rng, 1+rng.IntN(6), 1200), crcOn)
		f.Add(r.wire, crcOn, uint16(i*97))
		if len(r.wire) > 600 {
			bad := bytes.Clone(r.wire)
			bad[515] ^= 0x10
			f.Add(bad, crcOn, uint16(i))
		}
	}
	f.Add([]byte{0, 0, 0, 0, 0, 2, 0xaa, 0xbb, 0, 0, 0, 0}, false, uint16(1))
	f.Add([]byte{0, 0, 0, 4, 0, 0}, true, uint16(0))
	f.Fuzz(func(t *testing.T, wire []byte, crcOn bool, cuts uint16) {
		want, code := refStrip(wire, crcOn)
		rec := &bytes.Buffer{}
		var s markerStripper
		s.reset(rec, crcOn, nil)
		var err error
		cut := rand.New(rand.NewPCG(uint64(cuts), 1))
		for w := 0; w < len(wire) && err == nil; {
			n := 1 + cut.IntN(1+int(cuts%700))
			p := wire[w:min(len(wire), w+n)]
			var k int
			k, err = s.Write(p[:len(p):len(p)])
			if err == nil && k != len(p) {
				t.Fatalf("Write took %d of %d octets without an error", k, len(p))
			}
			w += len(p)
		}
		var me *MarkerError
		switch {
		case code == 0 && err != nil:
			t.Fatalf("stripper: %v; reference: no error", err)
		case code != 0 && (!errors.As(err, &me) || me.Code != (TermCode{LayerLLP, ETypeMPA, code})):
			t.Fatalf("stripper: %v; reference: LLP/MPA code %#x", err, code)
		}
		if !bytes.Equal(rec.Bytes(), want) {
			t.Fatalf("stripper forwarded %d octets, reference %d (error %v)", rec.Len(), len(want), err)
		}
		if err != nil {
			if _, again := s.Write([]byte{0}); !errors.Is(again, err) {
				t.Fatalf("the error is not sticky: %v", again)
			}
		}
	})
}
