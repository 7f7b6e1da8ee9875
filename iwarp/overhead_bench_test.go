package iwarp

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// sinkStream is a Stream whose writes are drained into buf, as netstack's
// copy into its own buffer; nothing is read.
type sinkStream struct {
	buf []byte
	n   int
	mp  int // MaxPayload; 0: 65000
}

func (s *sinkStream) ReadTo(ctx context.Context, w io.Writer, max int) (int, error) {
	<-ctx.Done()
	return 0, ctx.Err()
}
func (s *sinkStream) TryReadTo(w io.Writer, max int) (int, error)      { return 0, nil }
func (s *sinkStream) WaitReadable(ctx context.Context) error           { <-ctx.Done(); return ctx.Err() }
func (s *sinkStream) ReadFull(ctx context.Context, p []byte) error     { <-ctx.Done(); return ctx.Err() }
func (s *sinkStream) Write(ctx context.Context, p []byte) (int, error) { return len(p), nil }
func (s *sinkStream) MaxPayload() int {
	if s.mp > 0 {
		return s.mp
	}
	return 65000
}
func (s *sinkStream) CloseWrite() error { return nil }
func (s *sinkStream) Abort()            {}
func (s *sinkStream) Close() error      { return nil }
func (s *sinkStream) WritePayload(ctx context.Context, pl tcpip.Payloader) (int64, error) {
	s.n = 0
	for {
		k, err := pl.Read(s.buf[s.n:])
		s.n += k
		if err == io.EOF || pl.Len() == 0 {
			return int64(s.n), nil
		}
	}
}

// inlineWriteEnds returns a sending end started on a sinkStream (what it
// writes lands in s.buf, nothing is read) and a receiving end whose
// receiver is fed by hand, once the sender's TX goroutine has (most
// likely) finished its first pass: from then on a single WR posted to the
// idle QP is transmitted by the poster itself (postDirect) before PostSend
// returns, which the benchmarks check.
func inlineWriteEnds(tb testing.TB) (a, r *testEnd, s *sinkStream) {
	tb.Helper()
	acc := AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead
	a, r = newTestEnd(tb, 4096, acc), newTestEnd(tb, 4096, acc)
	s = &sinkStream{buf: make([]byte, 4096)}
	if err := a.qp.Start(s, ConnParams{Initiator: true, IRD: 1, ORD: 1}); err != nil {
		tb.Fatal(err)
	}
	r.qp.rx.init(ConnParams{Initiator: true})
	// The first pass writes nothing (nothing is queued); while it holds
	// the transmitter, a post would be queued for it instead. Nothing
	// tells when it has run: give it the time, then wait for the lock.
	time.Sleep(10 * time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for !a.qp.txMu.TryLock() {
		if time.Now().After(deadline) {
			tb.Fatal("the TX goroutine holds the transmitter")
		}
		time.Sleep(time.Millisecond)
	}
	a.qp.txMu.Unlock()
	return a, r, s
}

// BenchmarkEngineWrite64 is the engine's own cost of one 64-byte inline
// RDMA Write: posting and framing it on one QP, parsing and placing it on
// another; BenchmarkEngineWrite64Baseline is what a TCP application does
// for the same bytes (a copy out, a copy in).
func BenchmarkEngineWrite64(b *testing.B) {
	a, r, s := inlineWriteEnds(b)
	wr := SendWR{Op: WRWrite, Flags: FlagInline, SGL: []SGE{a.sge(64, 64)}, RemoteAddr: r.reg.Base, RKey: r.reg.STag()}
	for b.Loop() {
		if _, err := a.qp.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		if s.n != 84 {
			b.Fatalf("the Write was not transmitted inline (%d bytes)", s.n)
		}
		r.qp.rx.Write(s.buf[:s.n])
		s.n = 0
		r.qp.rx.flushStats()
	}
}

// BenchmarkEngineWrite64Cold is BenchmarkEngineWrite64 with the caches
// cleared between messages, as a ping-pong's other goroutines (netstack's,
// the peer's) leave them: before each message it writes to every cache
// line of evict bytes of other memory (1 MiB: about the L2; 16 MiB: the
// L3 too). It reports the poster's time (tx-ns: post, frame, write) and
// the receiver's (rx-ns: parse, check, place) per message, each with a
// clock read (~20 ns) in it.
func BenchmarkEngineWrite64Cold(b *testing.B) {
	for _, evict := range []int{0, 1 << 20, 16 << 20} {
		b.Run(fmt.Sprintf("evict=%dKiB", evict>>10), func(b *testing.B) {
			a, r, s := inlineWriteEnds(b)
			junk := make([]byte, evict)
			wr := SendWR{Op: WRWrite, Flags: FlagInline, SGL: []SGE{a.sge(64, 64)}, RemoteAddr: r.reg.Base, RKey: r.reg.STag()}
			var tx, rx time.Duration
			for b.Loop() {
				for i := 0; i < len(junk); i += 64 {
					junk[i]++
				}
				t0 := time.Now()
				if _, err := a.qp.PostSend(wr); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if s.n != 84 {
					b.Fatalf("the Write was not transmitted inline (%d bytes)", s.n)
				}
				r.qp.rx.Write(s.buf[:s.n])
				r.qp.rx.flushStats()
				tx += t1.Sub(t0)
				rx += time.Since(t1)
				s.n = 0
			}
			b.ReportMetric(float64(tx.Nanoseconds())/float64(b.N), "tx-ns/op")
			b.ReportMetric(float64(rx.Nanoseconds())/float64(b.N), "rx-ns/op")
		})
	}
}

func BenchmarkEngineWrite64Baseline(b *testing.B) {
	src, dst := make([]byte, 64), make([]byte, 64)
	var netbuf [4096]byte
	for b.Loop() {
		n := copy(netbuf[:], src)
		copy(dst, netbuf[:n])
	}
}

// BenchmarkEngineFPDUs is the engine's cost of a 64 KiB RDMA Write cut
// into FPDUs of a 1500-byte MTU's segment payload (1420 bytes) with CRC:
// framing and CRC on one QP, parsing, CRC check and placement on another.
// BenchmarkEngineFPDUsBaseline copies the same bytes twice, as TCP does.
func BenchmarkEngineFPDUs(b *testing.B) {
	const size = 64 << 10
	acc := AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead
	a, r := newTestEnd(b, size, acc), newTestEnd(b, size, acc)
	s := &sinkStream{buf: make([]byte, 2*size), mp: 1420}
	if err := a.qp.Start(s, ConnParams{Initiator: true, CRC: true, IRD: 1, ORD: 1}); err != nil {
		b.Fatal(err)
	}
	r.qp.rx.init(ConnParams{Initiator: true, CRC: true})
	time.Sleep(10 * time.Millisecond)
	wr := SendWR{Op: WRWrite, SGL: []SGE{a.sge(0, size)}, RemoteAddr: r.reg.Base, RKey: r.reg.STag()}
	b.SetBytes(size)
	for b.Loop() {
		// Posted to an idle QP, a 64 KiB Write is sent by the poster.
		if _, err := a.qp.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		if s.n == 0 {
			b.Fatal("not transmitted inline")
		}
		if fp := FPDULen(int(binary.BigEndian.Uint16(s.buf))); fp > s.mp {
			b.Fatalf("%d-byte FPDUs, want at most %d", fp, s.mp)
		}
		// Hand the stream over in 64 KiB pieces, as netstack's views.
		for p := s.buf[:s.n]; len(p) > 0; {
			k := min(len(p), 65536)
			r.qp.rx.Write(p[:k])
			p = p[k:]
		}
		r.qp.rx.flushStats()
		s.n = 0
	}
	if r.qp.rx.state == rxDead {
		b.Fatal("receiver failed")
	}
}

func BenchmarkEngineFPDUsBaseline(b *testing.B) {
	const size = 64 << 10
	src, mid, dst := make([]byte, size), make([]byte, 2*size), make([]byte, size)
	b.SetBytes(size)
	for b.Loop() {
		copy(mid, src)
		copy(dst, mid[:size])
	}
}

// BenchmarkEngineRxFPDUs is the receive side of BenchmarkEngineFPDUs
// alone (a QP's receive goroutine is the busiest at 1420-byte FPDUs): the
// 64 KiB Write is framed once, then parsed, checked and placed again and
// again, CRC on and off.
func BenchmarkEngineRxFPDUs(b *testing.B) {
	for _, crc := range []bool{true, false} {
		name := "crc=off"
		if crc {
			name = "crc=on"
		}
		b.Run(name, func(b *testing.B) {
			const size = 64 << 10
			acc := AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead
			a, r := newTestEnd(b, size, acc), newTestEnd(b, size, acc)
			s := &sinkStream{buf: make([]byte, 2*size), mp: 1420}
			if err := a.qp.Start(s, ConnParams{Initiator: true, CRC: crc, IRD: 1, ORD: 1}); err != nil {
				b.Fatal(err)
			}
			r.qp.rx.init(ConnParams{Initiator: true, CRC: crc})
			time.Sleep(10 * time.Millisecond)
			wr := SendWR{Op: WRWrite, SGL: []SGE{a.sge(0, size)}, RemoteAddr: r.reg.Base, RKey: r.reg.STag()}
			if _, err := a.qp.PostSend(wr); err != nil {
				b.Fatal(err)
			}
			stream := s.buf[:s.n]
			b.SetBytes(size)
			for b.Loop() {
				for p := stream; len(p) > 0; {
					k := min(len(p), 65536)
					r.qp.rx.Write(p[:k])
					p = p[k:]
				}
				r.qp.rx.flushStats()
			}
			if r.qp.rx.state == rxDead {
				b.Fatal("receiver failed")
			}
		})
	}
}

// collectStream is a sinkStream that keeps every byte written.
type collectStream struct {
	sinkStream
	mu  sync.Mutex
	all []byte
}

func (s *collectStream) WritePayload(ctx context.Context, pl tcpip.Payloader) (int64, error) {
	n, err := s.sinkStream.WritePayload(ctx, pl)
	s.mu.Lock()
	s.all = append(s.all, s.buf[:n]...)
	s.mu.Unlock()
	return n, err
}

func (s *collectStream) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.all)
}

func (s *collectStream) bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]byte(nil), s.all...)
}

// BenchmarkSegmentFillDeliver is segment placement's cost of a long hole:
// a 1 MiB RDMA Write in 1420-byte FPDUs (CRC on) whose first segment is
// lost, so that every other FPDU is placed from its segment beyond the
// hole; the timed part is what the hole-filling segment sets off — its
// feed and the in-order delivery of every FPDU placed beyond it — against
// BenchmarkEngineRxFPDUs' stream placement of the same bytes (reported
// per FPDU as deliver-ns/fpdu).
func BenchmarkSegmentFillDeliver(b *testing.B) {
	const size = 1 << 20
	acc := AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead
	a, r := newTestEnd(b, size, acc), newTestEnd(b, size, acc)
	s := &collectStream{sinkStream: sinkStream{buf: make([]byte, 2*size), mp: 1420}}
	if err := a.qp.Start(s, ConnParams{Initiator: true, CRC: true, IRD: 1, ORD: 1}); err != nil {
		b.Fatal(err)
	}
	ns := &nullStream{closed: make(chan struct{})}
	if err := r.qp.Start(ns, ConnParams{CRC: true, IRD: 1, ORD: 1}); err != nil {
		b.Fatal(err)
	}
	defer close(ns.closed)
	seg := attachSegPlacer(r.qp, true, false)
	time.Sleep(10 * time.Millisecond)
	if _, err := a.qp.PostSend(SendWR{Op: WRWrite, SGL: []SGE{a.sge(0, size)}, RemoteAddr: r.reg.Base, RKey: r.reg.STag()}); err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.len() < size && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	stream := s.bytes()
	var cuts []int // FPDU starts
	for off := 0; off < len(stream); off += FPDULen(int(binary.BigEndian.Uint16(stream[off:]))) {
		cuts = append(cuts, off)
	}
	cuts = append(cuts, len(stream))
	fpdus := len(cuts) - 1
	base := uint64(0)
	var timed time.Duration
	for b.Loop() {
		for i := 1; i < fpdus; i++ {
			seg.place(base+uint64(cuts[i]), [][]byte{stream[cuts[i]:cuts[i+1]]})
		}
		start := time.Now()
		seg.place(base, [][]byte{stream[:cuts[1]]})
		timed += time.Since(start)
		base += uint64(len(stream))
		if at := r.qp.rx.offset; at != base {
			b.Fatalf("the receiver stands at %d after the fill, want %d", at, base)
		}
	}
	b.ReportMetric(float64(timed.Nanoseconds())/float64(b.N)/float64(fpdus), "deliver-ns/fpdu")
}
