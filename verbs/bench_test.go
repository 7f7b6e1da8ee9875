package verbs_test

import (
	"context"
	"io"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"rdmatap/netstack"
	"rdmatap/verbs"
)

// The benchmarks compare rdmatap with plain netstack TCP on the same
// in-memory link, in one run:
//
//	go test -run XXX -bench . -benchtime 3s ./verbs/
//
// BenchmarkRDMAWrite/BenchmarkRDMARead move 1 MiB messages (CRC off and
// on) and BenchmarkTCPBulk moves 1 MiB writes read into a user buffer;
// compare their MB/s. BenchmarkRDMAWritePingPong64 and
// BenchmarkTCPPingPong64 report one round trip per op (ns/op).

const benchMsg = 1 << 20

// benchLink is the in-memory link of the benchmarks: 64 KB packets, so that
// TCP segments and FPDUs are 64 KB (FPDUs follow the segment payload). Set
// RDMATAP_BENCH_MTU=1500 for 1420-byte FPDUs on a GSO link.
var benchLink = netstack.LinkConfig{MTU: uint32(envInt("RDMATAP_BENCH_MTU", 65535))}

func benchPair(b *testing.B, crc bool) (cl, sv *end) {
	p := newPairLink(b, benchLink, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	return connect(b, p, 16*benchMsg, verbs.ConnParams{CRC: &crc})
}

func drain(b *testing.B, cq *verbs.CQ, wc []verbs.WC, n int) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for n > 0 {
		k, err := cq.Wait(ctx, wc[:min(n, len(wc))])
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range wc[:k] {
			if c.Status != verbs.StatusSuccess {
				b.Fatal(c.Err())
			}
		}
		n -= k
	}
}

// benchRDMA keeps a window of 1 MiB RDMA Writes or Reads in flight
// between two endpoints, rotating over 16 slots of the peer's MR.
func benchRDMA(b *testing.B, op verbs.Opcode, crc bool) {
	cl, sv := benchPair(b, crc)
	// Up to window WRs in flight; every mod-th is signaled (perftest's CQ
	// moderation, -Q), so the poster wakes once per mod messages.
	const window, mod = 16, 4
	wc := make([]verbs.WC, window)
	b.SetBytes(benchMsg)
	b.ResetTimer()
	inflight := 0 // signaled WRs outstanding
	for i := 0; i < b.N; i++ {
		slot := i % 16
		wr := verbs.SendWR{ID: uint64(i), Op: op,
			SGL: []verbs.SGE{cl.mr.SGE(slot*benchMsg, benchMsg)}, RemoteAddr: cl.remote.Addr + uint64(slot*benchMsg), RKey: cl.remote.RKey}
		if i%mod == mod-1 || i == b.N-1 {
			wr.Flags = verbs.Signaled
			if inflight == window/mod {
				drain(b, cl.scq, wc, 1)
				inflight--
			}
			inflight++
		}
		if err := cl.qp.PostSend(wr); err != nil {
			b.Fatal(err)
		}
	}
	if op == verbs.OpWrite {
		// A Send behind the Writes tells when the last one has been placed.
		if err := sv.qp.PostRecv(verbs.RecvWR{ID: 1}); err != nil {
			b.Fatal(err)
		}
		if err := cl.qp.PostSend(verbs.SendWR{ID: 1 << 40, Op: verbs.OpSend, Flags: verbs.Signaled}); err != nil {
			b.Fatal(err)
		}
		inflight++
		defer drain(b, sv.rcq, wc, 1)
	}
	drain(b, cl.scq, wc, inflight)
}

func BenchmarkRDMAWrite(b *testing.B) {
	b.Run("crc=off", func(b *testing.B) { benchRDMA(b, verbs.OpWrite, false) })
	b.Run("crc=on", func(b *testing.B) { benchRDMA(b, verbs.OpWrite, true) })
}

func BenchmarkRDMARead(b *testing.B) {
	b.Run("crc=off", func(b *testing.B) { benchRDMA(b, verbs.OpRead, false) })
	b.Run("crc=on", func(b *testing.B) { benchRDMA(b, verbs.OpRead, true) })
}

// copyWriter copies what netstack hands it into a user buffer.
type copyWriter struct {
	buf []byte
	off int
}

func (w *copyWriter) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		n := copy(w.buf[w.off:], p)
		w.off = (w.off + n) % len(w.buf)
		p = p[n:]
	}
	return total, nil
}

func tcpPair(b *testing.B) (*netstack.Conn, *netstack.Conn) {
	na, nb, err := netstack.NewPair(netstack.PairConfig{Link: benchLink})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { na.Close(); nb.Close() })
	l, err := nb.Listen(netip.AddrPort{}, 4)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	ch := make(chan *netstack.Conn, 1)
	go func() {
		c, _ := l.Accept(ctx)
		ch <- c
	}()
	c, err := na.Dial(ctx, netip.AddrPortFrom(nb.Addrs()[0].Addr(), l.Addr().Port()))
	if err != nil {
		b.Fatal(err)
	}
	s := <-ch
	if s == nil {
		b.Fatal("accept failed")
	}
	return c, s
}

func BenchmarkTCPBulk(b *testing.B) {
	c, s := tcpPair(b)
	// The sender cycles over 16 MiB as the RDMA benchmarks do, so neither
	// side of the comparison sends from a cache-hot buffer.
	src := make([]byte, 16*benchMsg)
	total := int64(b.N) * benchMsg
	done := make(chan error, 1)
	go func() {
		w := &copyWriter{buf: make([]byte, 16*benchMsg)}
		ctx := context.Background()
		var got int64
		for got < total {
			n, err := s.ReadTo(ctx, w, 0)
			if err != nil {
				done <- err
				return
			}
			got += int64(n)
		}
		done <- nil
	}()
	b.SetBytes(benchMsg)
	b.ResetTimer()
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		slot := i % 16
		if _, err := c.Write(ctx, src[slot*benchMsg:(slot+1)*benchMsg]); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil && err != io.EOF {
		b.Fatal(err)
	}
}

func BenchmarkTCPPingPong64(b *testing.B) {
	c, s := tcpPair(b)
	ctx := context.Background()
	go func() {
		buf := make([]byte, 64)
		for {
			if err := s.ReadFull(ctx, buf); err != nil {
				return
			}
			if _, err := s.Write(ctx, buf); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Write(ctx, buf); err != nil {
			b.Fatal(err)
		}
		if err := c.ReadFull(ctx, buf); err != nil {
			b.Fatal(err)
		}
	}
}

// flag returns the word at buf[off:off+4], read atomically: perftest's
// write_lat polls the last bytes of its receive buffer the same way.
func flag(buf []byte, off int) *uint32 {
	return (*uint32)(unsafe.Pointer(&buf[off]))
}

// waitFlag waits until *p == v, running the QP's receive path in this
// goroutine (a ManualProgress QP): it blocks on the connection like a TCP
// reader, then places the Write itself and checks the flag word, as
// perftest's write_lat polls the last bytes of its buffer.
func waitFlag(qp *verbs.QP, p *uint32, v uint32) error {
	ctx := context.Background()
	for atomic.LoadUint32(p) != v {
		if err := qp.WaitProgress(ctx); err != nil {
			return err
		}
	}
	return nil
}

// BenchmarkRDMAWritePingPong64: A writes 64 bytes into B's receive area; B
// sees the last word change and writes 64 bytes back (ib_write_lat). Each
// end's MR is [receive area 64 B | send area 64 B]. One op = one round trip.
func BenchmarkRDMAWritePingPong64(b *testing.B) {
	p := newPairLink(b, benchLink, verbs.DeviceConfig{}, verbs.DeviceConfig{})
	cl := newEndCfg(b, p.a, 128, verbs.QPConfig{ManualProgress: true})
	sv := newEndCfg(b, p.b, 128, verbs.QPConfig{ManualProgress: true})
	connectEnds(b, p, cl, sv, verbs.ConnParams{})
	pong := func(e *end, i uint32) error {
		*flag(e.buf, 124) = i
		return e.qp.PostSend(verbs.SendWR{Op: verbs.OpWrite, Flags: verbs.Inline, SGL: []verbs.SGE{e.mr.SGE(64, 64)},
			RemoteAddr: e.remote.Addr, RKey: e.remote.RKey})
	}
	go func() {
		for i := uint32(1); ; i++ {
			if waitFlag(sv.qp, flag(sv.buf, 60), i) != nil || pong(sv, i) != nil {
				return
			}
		}
	}()
	b.ResetTimer()
	for i := uint32(1); i <= uint32(b.N); i++ {
		if err := pong(cl, i); err != nil {
			b.Fatal(err)
		}
		if err := waitFlag(cl.qp, flag(cl.buf, 60), i); err != nil {
			b.Fatal(err)
		}
	}
}
