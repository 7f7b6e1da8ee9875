package test

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"
)

// TestTAPSegmentsFPDUAligned: over a TAP with TSO, the super-segments
// rdmatap hands the kernel start on FPDU boundaries, so the kernel's
// MSS cuts keep each 1420-byte FPDU in a segment of its own, and no
// segment boundary falls inside an FPDU's CRC (Linux siw fails the CRC of
// an FPDU whose trailer is split between two segments). The client's
// capture of 32 1 MiB RDMA Writes with CRC is checked. Before the writes
// were cut at FPDU boundaries, gVisor cut them at 65375 bytes, and every
// super-segment after a message's first started inside an FPDU.
func TestTAPSegmentsFPDUAligned(t *testing.T) {
	n := newNetns(t, 1500)
	pcap := filepath.Join(t.TempDir(), "client.pcap")
	args := []string{"bw", "write", "-s", "1048576", "-n", "32"}
	srv := n.start(t, append(args, n.endpointArgs(0, "--crc")...)...)
	n.ready(t, 0)
	cl := n.start(t, append(append([]string{args[0], args[1], n.ips[0]}, args[2:]...), n.endpointArgs(1, "--crc", "--pcap", pcap)...)...)
	if out, err := cl.wait(t, 2*time.Minute); err != nil {
		t.Fatalf("client: %v\n%s\nserver:\n%s", err, out, srv.out.String())
	}
	if out, err := srv.wait(t, 30*time.Second); err != nil {
		t.Fatalf("server: %v\n%s", err, out)
	}
	b, err := os.ReadFile(pcap)
	if err != nil {
		t.Fatal(err)
	}
	flows := tcpFlows(t, b)
	// The iWARP connection's client side starts with the MPA Request.
	var f *tcpFlow
	for _, c := range flows {
		if bytes.HasPrefix(c.data, []byte("MPA ID Req Frame")) {
			f = c
		}
	}
	if f == nil || len(f.data) < 20 {
		t.Fatalf("no MPA Request in the capture (%d TCP flows)", len(flows))
	}
	n0 := 20 + int(binary.BigEndian.Uint16(f.data[18:]))
	// The FPDUs: starts, and the first octet of each CRC.
	starts := map[int]bool{}
	type fpdu struct{ crc, end, len int }
	var fs []fpdu
	for o := n0; o+2 <= len(f.data); {
		l := 2 + int(binary.BigEndian.Uint16(f.data[o:]))
		e := o + (l+3)&^3 + 4
		if e > len(f.data) {
			break
		}
		starts[o] = true
		fs = append(fs, fpdu{e - 4, e, e - o})
		o = e
	}
	// A Write completes once TCP has taken its data (as siw's do), so the
	// client may end, and its capture with it, while the last Writes are
	// still in its send buffer (seen on a loaded machine: 3 of the 32 MiB
	// not yet sent). The FPDUs must cover the stream the capture holds,
	// and that must be most of the 32 MiB.
	if len(fs) < 32*350 || fs[len(fs)-1].end < len(f.data)-1500 {
		t.Fatalf("%d FPDUs, ending at octet %d of the client's %d-octet stream; want at least %d, to its end",
			len(fs), fs[len(fs)-1].end, len(f.data), 32*350)
	}
	// Segments that start elsewhere (a write the send buffer cut short
	// and TCP sent before its rest came, a receive window's edge) start
	// a multiple of 4 octets into their FPDU, as the windows do.
	var segs, aligned, odd, inCRC int
	for _, s := range f.segs {
		if s.off < n0 || s.off >= fs[len(fs)-1].end {
			continue
		}
		segs++
		if starts[s.off] {
			aligned++
		}
		for _, p := range []int{s.off, s.off + s.len} {
			i := sort.Search(len(fs), func(i int) bool { return fs[i].end > p })
			if i == len(fs) {
				continue
			}
			if p > fs[i].crc {
				inCRC++
			}
			if start := fs[i].end - fs[i].len; (p-start)%4 != 0 {
				odd++
			}
		}
	}
	t.Logf("%d FPDUs; %d data segments from the client, %d of them starting on an FPDU; %d boundaries inside a CRC, %d not 4-aligned in their FPDU", len(fs), segs, aligned, inCRC, odd)
	// Seen: 94-98% aligned with a P per process; with bw's one P (the
	// sender is more often held at the window's edge, where gVisor
	// splits a queued write) 77-99% in 46 runs, under 80% in one, and in a
	// CI run that failed at the earlier 80% threshold; every
	// boundary 4-aligned; 7-19% aligned before the writes were cut. (The
	// send buffer's space is a multiple of 4 only as long as everything
	// written and acknowledged is, so a stray cut is allowed for; none
	// inside a CRC.)
	if inCRC > 0 || odd > segs/100 || aligned < segs*60/100 || segs < 32 {
		t.Fatalf("%d of %d segments start on an FPDU (want 60%%); %d boundaries inside a CRC (want none), %d not 4-aligned", aligned, segs, inCRC, odd)
	}
}

// tcpFlow is one direction of a TCP connection in a capture: its stream
// from the first payload octet seen, and its data segments (by offset in
// that stream; retransmissions once, the longest).
type tcpFlow struct {
	data []byte
	segs []struct{ off, len int }
}

// tcpFlows reassembles the TCP payload of an Ethernet pcap per direction.
func tcpFlows(t *testing.T, b []byte) []*tcpFlow {
	t.Helper()
	if len(b) < 24 || binary.LittleEndian.Uint32(b) != 0xa1b2c3d4 || binary.LittleEndian.Uint32(b[20:]) != 1 {
		t.Fatal("not a little-endian Ethernet pcap")
	}
	type key struct{ src, dst [6]byte } // IPv4 address and port
	type flow struct {
		base uint32
		segs map[uint32][]byte
	}
	flows := map[key]*flow{}
	var order []key
	for off := 24; off+16 <= len(b); {
		incl := int(binary.LittleEndian.Uint32(b[off+8:]))
		if off+16+incl > len(b) {
			t.Fatalf("truncated pcap record at %d", off)
		}
		fr := b[off+16 : off+16+incl]
		off += 16 + incl
		if len(fr) < 14+20 || binary.BigEndian.Uint16(fr[12:]) != 0x0800 {
			continue
		}
		ip := fr[14:]
		ihl, tot := int(ip[0]&15)*4, int(binary.BigEndian.Uint16(ip[2:]))
		if ip[9] != 6 || tot > len(ip) || ihl < 20 || tot < ihl+20 {
			continue
		}
		tcp := ip[ihl:tot]
		doff := int(tcp[12]>>4) * 4
		if doff < 20 || doff > len(tcp) {
			continue
		}
		var k key
		copy(k.src[:4], ip[12:16])
		copy(k.src[4:], tcp[0:2])
		copy(k.dst[:4], ip[16:20])
		copy(k.dst[4:], tcp[2:4])
		seq := binary.BigEndian.Uint32(tcp[4:])
		fl := flows[k]
		if fl == nil {
			fl = &flow{base: seq, segs: map[uint32][]byte{}}
			if tcp[13]&0x02 != 0 { // SYN
				fl.base++
			}
			flows[k] = fl
			order = append(order, k)
		}
		if p := tcp[doff:]; len(p) > len(fl.segs[seq]) {
			fl.segs[seq] = p
		}
	}
	var out []*tcpFlow
	for _, k := range order {
		fl := flows[k]
		f := &tcpFlow{}
		for seq, p := range fl.segs {
			o := int(int32(seq - fl.base))
			if o < 0 {
				continue
			}
			if e := o + len(p); e > len(f.data) {
				f.data = append(f.data, make([]byte, e-len(f.data))...)
			}
			copy(f.data[o:], p)
			f.segs = append(f.segs, struct{ off, len int }{o, len(p)})
		}
		sort.Slice(f.segs, func(i, j int) bool { return f.segs[i].off < f.segs[j].off })
		out = append(out, f)
	}
	return out
}
