package pcapread

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
)

// frame builds an Ethernet/IPv4/TCP frame with trailing Ethernet padding.
func frame(src, dst uint16, seq uint32, flags uint8, payload string) []byte {
	b := make([]byte, 14+20+20+len(payload), 14+20+20+len(payload)+8)
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(40+len(payload)))
	ip[9] = 6
	a, z := []byte{10, 0, 0, 1}, []byte{10, 0, 0, 2}
	if src > dst { // the lower port lives on 10.0.0.1
		a, z = z, a
	}
	copy(ip[12:], a)
	copy(ip[16:], z)
	tcp := ip[20:]
	binary.BigEndian.PutUint16(tcp[0:], src)
	binary.BigEndian.PutUint16(tcp[2:], dst)
	binary.BigEndian.PutUint32(tcp[4:], seq)
	tcp[12] = 5 << 4
	tcp[13] = flags
	copy(tcp[20:], payload)
	return append(b, make([]byte, 8)...) // Ethernet trailer/padding
}

func pcapFile(frames ...[]byte) []byte {
	b := make([]byte, 24)
	binary.LittleEndian.PutUint32(b, 0xa1b2c3d4)
	binary.LittleEndian.PutUint32(b[16:], 65535)
	binary.LittleEndian.PutUint32(b[20:], LinkTypeEthernet)
	for _, f := range frames {
		var h [16]byte
		binary.LittleEndian.PutUint32(h[8:], uint32(len(f)))
		binary.LittleEndian.PutUint32(h[12:], uint32(len(f)))
		b = append(append(b, h[:]...), f...)
	}
	return b
}

func TestReassemble(t *testing.T) {
	var isn uint32 = 0xfffffff0 // the stream wraps the sequence space
	f, err := Parse(pcapFile(
		frame(1000, 2000, isn, SYN, ""),
		frame(2000, 1000, 77, SYN|ACK, ""),
		frame(1000, 2000, isn+1+10, ACK, "klmnop"),  // out of order
		frame(1000, 2000, isn+1, ACK, "abcdefghij"), // crosses the wrap
		frame(1000, 2000, isn+1+5, ACK, "fghijklm"), // overlapping retransmission
		frame(1000, 2000, isn+1, ACK, "abcdefghij"), // full retransmission
		frame(2000, 1000, 78, ACK|PSH, "reply"),     // other direction
		frame(1000, 2000, isn+1+16, ACK|FIN, "q"),   // FIN with data
	))
	if err != nil {
		t.Fatal(err)
	}
	segs, err := f.Segments()
	if err != nil || len(segs) != 8 {
		t.Fatalf("%d segments, %v", len(segs), err)
	}
	if len(segs[2].Payload) != 6 {
		t.Fatalf("Ethernet padding not trimmed: %q", segs[2].Payload)
	}
	ss, err := Reassemble(segs)
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 2 {
		t.Fatalf("%d streams", len(ss))
	}
	a, b := ss[0], ss[1]
	want := Flow{Endpoint{netip.MustParseAddr("10.0.0.1"), 1000}, Endpoint{netip.MustParseAddr("10.0.0.2"), 2000}}
	if a.Flow != want || b.Flow != want.Reverse() || !a.SawSYN || !a.SawFIN || b.SawFIN {
		t.Fatalf("flows %v / %v, SYN %v FIN %v/%v", a.Flow, b.Flow, a.SawSYN, a.SawFIN, b.SawFIN)
	}
	if string(a.Data) != "abcdefghijklmnopq" || string(b.Data) != "reply" {
		t.Fatalf("data %q / %q", a.Data, b.Data)
	}
	if a.Segments != 5 || a.Retransmitted != 2 {
		t.Errorf("segments %d retransmitted %d", a.Segments, a.Retransmitted)
	}
	if a.FrameOf(0) != 4 || a.FrameOf(10) != 3 || a.FrameOf(16) != 8 {
		t.Errorf("FrameOf: %d %d %d", a.FrameOf(0), a.FrameOf(10), a.FrameOf(16))
	}

	// A hole, and a retransmission that disagrees, are errors.
	f, _ = Parse(pcapFile(frame(1, 2, 100, SYN, ""), frame(1, 2, 105, ACK, "x")))
	segs, _ = f.Segments()
	if _, err := Reassemble(segs); err == nil {
		t.Error("hole accepted")
	}
	f, _ = Parse(pcapFile(frame(1, 2, 100, SYN, ""), frame(1, 2, 101, ACK, "xy"), frame(1, 2, 101, ACK, "xz")))
	segs, _ = f.Segments()
	if _, err := Reassemble(segs); err == nil {
		t.Error("inconsistent retransmission accepted")
	}
}

func TestParseErrors(t *testing.T) {
	if _, err := Parse([]byte("not a pcap file at all!!")); !errors.Is(err, ErrMagic) {
		t.Errorf("bad magic: %v", err)
	}
	b := pcapFile(frame(1, 2, 3, SYN, ""))
	if _, err := Parse(b[:len(b)-1]); !errors.Is(err, ErrTruncated) {
		t.Errorf("truncated: %v", err)
	}
	if _, err := DecodeEthernet(make([]byte, 60)); !errors.Is(err, ErrNotTCP) {
		t.Errorf("zero frame: %v", err)
	}
}
