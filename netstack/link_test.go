package netstack

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// lockedBuffer is a bytes.Buffer safe for the test to read after capture.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) Bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]byte(nil), l.b.Bytes()...)
}

type pcapRecord struct {
	ts       time.Time
	incl     int
	orig     int
	data     []byte
	linkType uint32
}

// readPcap is a minimal classic-pcap reader (little-endian, microseconds).
func readPcap(b []byte) (linkType, snap uint32, recs []pcapRecord, err error) {
	if len(b) < 24 {
		return 0, 0, nil, fmt.Errorf("short global header: %d bytes", len(b))
	}
	if m := binary.LittleEndian.Uint32(b); m != 0xa1b2c3d4 {
		return 0, 0, nil, fmt.Errorf("bad magic %#x", m)
	}
	if maj, min := binary.LittleEndian.Uint16(b[4:]), binary.LittleEndian.Uint16(b[6:]); maj != 2 || min != 4 {
		return 0, 0, nil, fmt.Errorf("version %d.%d", maj, min)
	}
	snap = binary.LittleEndian.Uint32(b[16:])
	linkType = binary.LittleEndian.Uint32(b[20:])
	b = b[24:]
	for len(b) > 0 {
		if len(b) < 16 {
			return 0, 0, nil, fmt.Errorf("truncated record header")
		}
		sec, usec := binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:])
		incl, orig := int(binary.LittleEndian.Uint32(b[8:])), int(binary.LittleEndian.Uint32(b[12:]))
		if usec >= 1e6 {
			return 0, 0, nil, fmt.Errorf("usec %d out of range", usec)
		}
		if incl > orig || incl > int(snap) || len(b) < 16+incl {
			return 0, 0, nil, fmt.Errorf("bad record lengths incl=%d orig=%d left=%d", incl, orig, len(b)-16)
		}
		recs = append(recs, pcapRecord{
			ts: time.Unix(int64(sec), int64(usec)*1000), incl: incl, orig: orig,
			data: b[16 : 16+incl], linkType: linkType,
		})
		b = b[16+incl:]
	}
	return linkType, snap, recs, nil
}

func TestCapture(t *testing.T) {
	var buf lockedBuffer
	a, b := newTestPair(t, PairConfig{PcapA: &buf})
	c1, c2 := connect(t, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const total = 300000
	errc := make(chan error, 1)
	go func() { errc <- sendPattern(ctx, c1, 4, total, 100000) }()
	if _, err := recvPattern(ctx, c2, 4, total); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	capt := CaptureOf(a)
	if capt == nil {
		t.Fatal("CaptureOf(a) = nil")
	}
	a.Close()
	b.Close()
	if err := capt.Err(); err != nil {
		t.Fatalf("capture error: %v", err)
	}
	raw := buf.Bytes()
	lt, snap, recs, err := readPcap(raw)
	if err != nil {
		t.Fatal(err)
	}
	if lt != LinkTypeRaw || snap != CaptureSnapLen {
		t.Fatalf("link type %d snaplen %d", lt, snap)
	}
	var payload [2]int // [0] A->B, [1] B->A
	big := 0
	clientPort := c1.LocalAddr().Port()
	for i, r := range recs {
		if r.incl != r.orig {
			t.Fatalf("record %d truncated: %d/%d", i, r.incl, r.orig)
		}
		ip := header.IPv4(r.data)
		if len(r.data) < header.IPv4MinimumSize || header.IPVersion(r.data) != 4 {
			t.Fatalf("record %d is not IPv4", i)
		}
		if int(ip.TotalLength()) != r.incl {
			t.Fatalf("record %d: IPv4 total length %d, captured %d", i, ip.TotalLength(), r.incl)
		}
		if !ip.IsChecksumValid() {
			t.Fatalf("record %d: bad IPv4 header checksum", i)
		}
		if ip.TransportProtocol() != header.TCPProtocolNumber {
			continue
		}
		tcp := header.TCP(ip.Payload())
		n := len(tcp) - int(tcp.DataOffset())
		if tcp.SourcePort() == clientPort {
			payload[0] += n
		} else {
			payload[1] += n
		}
		if r.incl > 1500 {
			big++
		}
	}
	if payload[0] < total {
		t.Fatalf("capture holds %d payload bytes A->B, want >= %d", payload[0], total)
	}
	if big == 0 {
		t.Fatal("no GSO super-segment in the capture")
	}
	t.Logf("%d records, %d larger than the MTU", len(recs), big)

	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not on PATH: skipping dissector check")
	}
	f := filepath.Join(t.TempDir(), "cap.pcap")
	if err := os.WriteFile(f, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(tshark, "-n", "-r", f, "-Y", "_ws.malformed")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tshark: %v\n%s", err, stderr.Bytes())
	}
	if s := strings.TrimSpace(string(out)); s != "" {
		t.Fatalf("tshark reports malformed packets:\n%s", s)
	}
	out, err = exec.Command(tshark, "-n", "-r", f, "-T", "fields", "-e", "tcp.len", "-Y", fmt.Sprintf("tcp.srcport==%d", clientPort)).Output()
	if err != nil {
		t.Fatalf("tshark fields: %v", err)
	}
	sum := 0
	for _, l := range strings.Fields(string(out)) {
		v, err := strconv.Atoi(l)
		if err != nil {
			t.Fatalf("tshark tcp.len %q", l)
		}
		sum += v
	}
	if sum != payload[0] {
		t.Fatalf("tshark decodes %d TCP payload bytes A->B, our reader %d", sum, payload[0])
	}
}

func TestCaptureWriteErrorDisables(t *testing.T) {
	la, lb := NewLinkPair(LinkConfig{})
	defer lb.Close()
	fails := 0
	c := NewCapture(la, writerFunc(func(p []byte) (int, error) {
		fails++
		if fails > 1 {
			return 0, fmt.Errorf("disk full")
		}
		return len(p), nil
	}))
	defer c.Close()
	if c.Err() != nil {
		t.Fatalf("header write: %v", c.Err())
	}
	pkt := testPacket(1, 100)
	defer pkt.DecRef()
	var l stack.PacketBufferList
	l.PushBack(pkt)
	for i := 0; i < 3; i++ {
		if n, err := c.WritePackets(l); n != 1 || err != nil {
			t.Fatalf("WritePackets with failing capture: %d %v", n, err)
		}
	}
	if c.Err() == nil || fails != 2 {
		t.Fatalf("Err=%v after %d writes; want error and capture disabled after first failure", c.Err(), fails)
	}
}

// testPacket builds a minimal IPv4/TCP packet with payload byte id.
func testPacket(id byte, payloadLen int) *stack.PacketBuffer {
	b := make([]byte, header.IPv4MinimumSize+header.TCPMinimumSize+payloadLen)
	ip := header.IPv4(b)
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(len(b)), TTL: 64, Protocol: uint8(header.TCPProtocolNumber),
		SrcAddr: toTCPIPAddr(netip.MustParseAddr("192.0.2.1")), DstAddr: toTCPIPAddr(netip.MustParseAddr("192.0.2.2")),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	tcp := header.TCP(b[header.IPv4MinimumSize:])
	tcp.Encode(&header.TCPFields{SrcPort: 1, DstPort: 2, SeqNum: uint32(id), DataOffset: header.TCPMinimumSize, Flags: header.TCPFlagAck})
	for i := header.IPv4MinimumSize + header.TCPMinimumSize; i < len(b); i++ {
		b[i] = id
	}
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(b)})
	pkt.NetworkProtocolNumber = header.IPv4ProtocolNumber
	return pkt
}

// impairTrace sends n packets through an Impair over a channel endpoint and
// returns the ids in delivery order.
func impairTrace(t *testing.T, cfg ImpairConfig, n int) ([]byte, ImpairStats) {
	ch := channel.New(4*n, 1500, "")
	im := NewImpair(ch, cfg).(*Impair)
	im.noTimer = true // the trace must not depend on how fast this loop runs
	defer im.Close()
	for i := 0; i < n; i++ {
		pkt := testPacket(byte(i), 10)
		var l stack.PacketBufferList
		l.PushBack(pkt)
		if got, err := im.WritePackets(l); got != 1 || err != nil {
			t.Fatalf("WritePackets: %d %v", got, err)
		}
		pkt.DecRef()
	}
	im.flush() // a packet held back after the last one
	// The channel endpoint queues what it is given at once.
	var ids []byte
	for {
		p := ch.Read()
		if p == nil {
			break
		}
		v := p.ToView()
		ids = append(ids, v.AsSlice()[header.IPv4MinimumSize+header.TCPMinimumSize])
		v.Release()
		p.DecRef()
	}
	return ids, im.Stats()
}

func TestImpairDeterministic(t *testing.T) {
	cfg := ImpairConfig{Seed: 42, LossRate: 0.1, ReorderRate: 0.1, DupRate: 0.1}
	ids1, st1 := impairTrace(t, cfg, 200)
	ids2, st2 := impairTrace(t, cfg, 200)
	if string(ids1) != string(ids2) || st1 != st2 {
		t.Fatalf("same seed, different results:\n%v %+v\n%v %+v", ids1, st1, ids2, st2)
	}
	if st1.Dropped == 0 || st1.Duplicated == 0 || st1.Reordered == 0 || st1.Packets != 200 {
		t.Fatalf("stats %+v: expected every impairment to occur", st1)
	}
	if want := 200 - int(st1.Dropped) + int(st1.Duplicated); len(ids1) != want {
		t.Fatalf("delivered %d packets, want %d", len(ids1), want)
	}
	inversions := 0
	for i := 1; i < len(ids1); i++ {
		if ids1[i] < ids1[i-1] {
			inversions++
		}
	}
	if inversions == 0 {
		t.Fatal("no reordering observed")
	}
	cfg.Seed = 43
	ids3, _ := impairTrace(t, cfg, 200)
	if string(ids3) == string(ids1) {
		t.Fatal("different seeds gave identical traces")
	}
	// Filter: nothing matches, nothing is impaired.
	cfg.Filter = func(*stack.PacketBuffer) bool { return false }
	ids4, st4 := impairTrace(t, cfg, 50)
	if len(ids4) != 50 || st4.Packets != 0 {
		t.Fatalf("filtered: %d delivered, stats %+v", len(ids4), st4)
	}
	for i, id := range ids4 {
		if int(id) != i {
			t.Fatalf("filtered packets reordered: %v", ids4)
		}
	}
}

// newImpairedPair builds a pair whose side A sends through an Impair.
func newImpairedPair(t testing.TB, icfg ImpairConfig, lcfg LinkConfig) (a, b *Stack, im *Impair) {
	la, lb := NewLinkPair(lcfg)
	im = NewImpair(la, icfg).(*Impair)
	scfg := Config{MinRTO: 20 * time.Millisecond}
	scfg.Link, scfg.Addrs = im, []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}
	a, err := New(scfg)
	if err != nil {
		t.Fatal(err)
	}
	scfg.Link, scfg.Addrs = lb, []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}
	b, err = New(scfg)
	if err != nil {
		a.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close()
		b.Close()
	})
	return a, b, im
}

func TestImpairLossRecovers(t *testing.T) {
	a, b, im := newImpairedPair(t, ImpairConfig{Seed: 1, LossRate: 0.01}, LinkConfig{NoGSO: true})
	c1, c2 := connect(t, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const total = 8 << 20
	errc := make(chan error, 1)
	go func() { errc <- sendPattern(ctx, c1, 8, total, 64<<10) }()
	if _, err := recvPattern(ctx, c2, 8, total); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	st := im.Stats()
	if st.Dropped == 0 {
		t.Fatalf("no packet dropped: %+v", st)
	}
	t.Logf("impair stats %+v", st)
}

func TestSegmentTapSeesOutOfOrder(t *testing.T) {
	// Only data segments from A are impaired.
	isData := func(pkt *stack.PacketBuffer) bool {
		return pkt.Data().Size() > 0
	}
	a, b, _ := newImpairedPair(t, ImpairConfig{Seed: 7, LossRate: 0.01, ReorderRate: 0.02, Filter: isData}, LinkConfig{NoGSO: true})
	c1, c2 := connect(t, a, b)

	var mu sync.Mutex
	var nxt uint32
	var started bool
	var ooo, inOrder, bytesSeen int
	var calls atomic.Int64
	src, dst := c1.LocalAddr(), c1.RemoteAddr()
	remove := b.TapSegments(func(s *Segment) {
		calls.Add(1)
		if s.Src != src || s.Dst != dst {
			return
		}
		n := s.Len()
		if n == 0 {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		bytesSeen += n
		switch {
		case !started:
			started, nxt = true, s.Seq+uint32(n)
			inOrder++
		case int32(s.Seq-nxt) > 0:
			ooo++
			nxt = s.Seq + uint32(n)
		case int32(s.Seq+uint32(n)-nxt) > 0:
			inOrder++
			nxt = s.Seq + uint32(n)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const total = 4 << 20
	errc := make(chan error, 1)
	go func() { errc <- sendPattern(ctx, c1, 5, total, 64<<10) }()
	if _, err := recvPattern(ctx, c2, 5, total); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	remove()
	remove()
	mu.Lock()
	t.Logf("tap: %d in order, %d out of order, %d payload bytes", inOrder, ooo, bytesSeen)
	if ooo == 0 {
		t.Error("the tap saw no out-of-order segment")
	}
	if bytesSeen < total {
		t.Errorf("the tap saw %d payload bytes, want >= %d", bytesSeen, total)
	}
	mu.Unlock()
	before := calls.Load()
	if err := sendPattern(ctx, c1, 5, 100000, 10000); err != nil {
		t.Fatal(err)
	}
	if err := c2.ReadFull(ctx, make([]byte, 100000)); err != nil {
		t.Fatal(err)
	}
	if after := calls.Load(); after != before {
		t.Fatalf("tap called %d times after remove", after-before)
	}
}

func TestSegmentTapIPv6Payload(t *testing.T) {
	a, b := newTestPair(t, PairConfig{
		AddrA: netip.MustParsePrefix("2001:db8::1/64"),
		AddrB: netip.MustParsePrefix("2001:db8::2/64"),
	})
	var mu sync.Mutex
	var got []byte
	remove := b.TapSegments(func(s *Segment) {
		mu.Lock()
		for _, p := range s.Payload {
			got = append(got, p...)
		}
		mu.Unlock()
	})
	defer remove()
	c1, c2 := connect(t, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c1.Write(ctx, []byte("hello tap")); err != nil {
		t.Fatal(err)
	}
	if err := c2.ReadFull(ctx, make([]byte, 9)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if string(got) != "hello tap" {
		t.Fatalf("tap payload %q", got)
	}
}

func BenchmarkTCPBulk(b *testing.B) {
	sa, sb := newTestPair(b, PairConfig{})
	c1, c2 := connect(b, sa, sb)
	ctx := context.Background()
	const msg = 1 << 20
	src := make([]byte, msg)
	dst := make([]byte, msg)
	fillPattern(1, 0, src)
	errc := make(chan error, 1)
	b.SetBytes(msg)
	b.ResetTimer()
	go func() {
		for i := 0; i < b.N; i++ {
			if _, err := c1.Write(ctx, src); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for i := 0; i < b.N; i++ {
		if err := c2.ReadFull(ctx, dst); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if !bytes.Equal(src, dst) {
		b.Fatal("data mismatch")
	}
}

func BenchmarkTCPPingPong64(b *testing.B) {
	sa, sb := newTestPair(b, PairConfig{})
	c1, c2 := connect(b, sa, sb)
	ctx := context.Background()
	errc := make(chan error, 1)
	go func() {
		buf := make([]byte, 64)
		for {
			if err := c2.ReadFull(ctx, buf); err != nil {
				errc <- err
				return
			}
			if _, err := c2.Write(ctx, buf); err != nil {
				errc <- err
				return
			}
		}
	}()
	req := make([]byte, 64)
	resp := make([]byte, 64)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req[0] = byte(i)
		if _, err := c1.Write(ctx, req); err != nil {
			b.Fatal(err)
		}
		if err := c1.ReadFull(ctx, resp); err != nil {
			b.Fatal(err)
		}
		if resp[0] != byte(i) {
			b.Fatal("wrong response")
		}
	}
	b.StopTimer()
	c1.CloseWrite()
	<-errc
}

// slowDispatcher counts delivered packets, taking a while over each.
type slowDispatcher struct{ n atomic.Int64 }

func (d *slowDispatcher) DeliverNetworkPacket(tcpip.NetworkProtocolNumber, *stack.PacketBuffer) {
	for start := time.Now(); time.Since(start) < 20*time.Microsecond; {
	}
	d.n.Add(1)
}
func (d *slowDispatcher) DeliverLinkPacket(tcpip.NetworkProtocolNumber, *stack.PacketBuffer) {}

// TestLinkBackpressure: a writer that outruns the peer's delivery waits
// for room in the in-memory link's queue and loses nothing; with TailDrop
// the full queue drops, as before.
func TestLinkBackpressure(t *testing.T) {
	for _, tailDrop := range []bool{false, true} {
		// A generous MaxWait: a loaded machine may stall the delivery
		// goroutine for longer than the default.
		la, lb := NewLinkPair(LinkConfig{QueueLen: 4, TailDrop: tailDrop, MaxWait: 10 * time.Second})
		d := &slowDispatcher{}
		lb.Attach(d)
		const n = 200
		sent := 0
		for i := 0; i < n; i++ {
			pkt := testPacket(byte(i), 10)
			var l stack.PacketBufferList
			l.PushBack(pkt)
			k, err := la.WritePackets(l)
			pkt.DecRef()
			sent += k
			if !tailDrop && (k != 1 || err != nil) {
				t.Fatalf("packet %d: written %d, %v", i, k, err)
			}
		}
		deadline := time.Now().Add(5 * time.Second)
		for d.n.Load() < int64(sent) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		drops := LinkDrops(la)
		t.Logf("tail drop %v: %d delivered, %d dropped", tailDrop, d.n.Load(), drops)
		if d.n.Load() != int64(sent) || drops != uint64(n-sent) {
			t.Errorf("tail drop %v: %d written, %d delivered, %d dropped", tailDrop, sent, d.n.Load(), drops)
		}
		if !tailDrop && drops != 0 {
			t.Errorf("backpressure: %d dropped", drops)
		}
		if tailDrop && drops == 0 {
			t.Errorf("tail drop: nothing dropped from a 4-packet queue")
		}
		la.Close()
		lb.Close()
	}
}

// blockedDispatcher takes one packet and never returns until released.
type blockedDispatcher struct{ release chan struct{} }

func (d *blockedDispatcher) DeliverNetworkPacket(tcpip.NetworkProtocolNumber, *stack.PacketBuffer) {
	<-d.release
}
func (d *blockedDispatcher) DeliverLinkPacket(tcpip.NetworkProtocolNumber, *stack.PacketBuffer) {}

// TestLinkWaitBounded: a writer waits for room no longer than MaxWait,
// then the packet is dropped and counted.
func TestLinkWaitBounded(t *testing.T) {
	la, lb := NewLinkPair(LinkConfig{QueueLen: 1, MaxWait: 30 * time.Millisecond})
	d := &blockedDispatcher{release: make(chan struct{})}
	lb.Attach(d)
	defer func() { close(d.release); la.Close(); lb.Close() }()
	write := func(i int) (int, tcpip.Error) {
		pkt := testPacket(byte(i), 10)
		defer pkt.DecRef()
		var l stack.PacketBufferList
		l.PushBack(pkt)
		return la.WritePackets(l)
	}
	// The first is taken by the (blocked) delivery, the second fills the
	// queue; the third finds it full.
	for i := 0; i < 2; i++ {
		if k, err := write(i); k != 1 || err != nil {
			t.Fatalf("packet %d: %d, %v", i, k, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Twice: the second wait (on a reused timer) is as long as the first.
	for i := 2; i < 4; i++ {
		start := time.Now()
		k, err := write(i)
		waited := time.Since(start)
		if k != 0 || err == nil || LinkDrops(la) != uint64(i-1) {
			t.Fatalf("write %d to a full queue that never drains: %d written, %v, %d dropped", i, k, err, LinkDrops(la))
		}
		if waited < 30*time.Millisecond || waited > 5*time.Second {
			t.Fatalf("write %d waited %v for room, want MaxWait (30ms)", i, waited)
		}
	}
}
