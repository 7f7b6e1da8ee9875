package verbs_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
)

// BenchmarkSoak is a long soak compressed: 256 connections over a link
// with 1% loss and 1% reordering, each running a mix of RDMA Write, RDMA
// Read and Send at once; every byte is verified (a Write is read back, a
// Send carries its sequence number and a pattern the receiver checks),
// and the heap after the run is compared with the heap before it.
//
//	go test -run XXX -bench Soak -benchtime 200x ./verbs/
//
// b.N is the rounds each connection runs (a Write, a Read of what it
// wrote, a Send).
func BenchmarkSoak(b *testing.B) {
	const qps, slot = 256, 16 << 10
	p := impairedPair(b, netstack.ImpairConfig{Seed: 23, LossRate: 0.01, ReorderRate: 0.01}, netstack.LinkConfig{MTU: 1500},
		verbs.DeviceConfig{}, verbs.DeviceConfig{})
	type conn struct{ cl, sv *end }
	conns := make([]conn, qps)
	for i := range conns {
		cl, sv := connect(b, p, 4*slot, verbs.ConnParams{})
		conns[i] = conn{cl, sv}
	}
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse
	}
	round := func(c conn, rng *rand.Rand, n int) error {
		cl, sv := c.cl, c.sv
		for r := 0; r < n; r++ {
			size := 1 + rng.IntN(slot)
			src := cl.buf[:size]
			for i := range src {
				src[i] = byte(rng.Uint32())
			}
			// Write into the peer, then Read it back into another slot.
			if err := cl.qp.PostSend(
				verbs.SendWR{ID: 1, Op: verbs.OpWrite, SGL: []verbs.SGE{cl.mr.SGE(0, size)}, RemoteAddr: cl.remote.Addr, RKey: cl.remote.RKey},
				verbs.SendWR{ID: 2, Op: verbs.OpRead, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(slot, size)}, RemoteAddr: cl.remote.Addr, RKey: cl.remote.RKey},
			); err != nil {
				return err
			}
			var wc [2]verbs.WC
			if err := drain(cl.scq, wc[:], 1); err != nil {
				return fmt.Errorf("read back: %w", err)
			}
			if !bytes.Equal(cl.buf[slot:slot+size], src) {
				return fmt.Errorf("round %d: the %d bytes read back differ from those written", r, size)
			}
			// A Send carrying its round and a pattern.
			msg := cl.buf[2*slot : 2*slot+64]
			binary.LittleEndian.PutUint64(msg, uint64(r))
			for i := 8; i < len(msg); i++ {
				msg[i] = byte(r + i)
			}
			if err := sv.qp.PostRecv(verbs.RecvWR{ID: uint64(r), SGL: []verbs.SGE{sv.mr.SGE(3*slot, 64)}}); err != nil {
				return err
			}
			if err := cl.qp.PostSend(verbs.SendWR{ID: 3, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{cl.mr.SGE(2*slot, 64)}}); err != nil {
				return err
			}
			if err := drain(sv.rcq, wc[:], 1); err != nil {
				return fmt.Errorf("send: %w", err)
			}
			if err := drain(cl.scq, wc[:], 1); err != nil {
				return fmt.Errorf("send: %w", err)
			}
			if !bytes.Equal(sv.buf[3*slot:3*slot+64], msg) {
				return fmt.Errorf("round %d: the Send arrived changed", r)
			}
		}
		return nil
	}
	run := func(n int) {
		var wg sync.WaitGroup
		errs := make(chan error, qps)
		for i, c := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := round(c, rand.New(rand.NewPCG(uint64(i), 5)), n); err != nil {
					errs <- fmt.Errorf("connection %d: %w", i, err)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
	}
	run(2) // warm up: windows open, pools fill
	before := heap()
	b.ResetTimer()
	run(b.N)
	b.StopTimer()
	after := heap()
	st := p.b.Stats()
	b.ReportMetric(float64(after)/(1<<20), "heap-after-MiB")
	b.ReportMetric(float64(before)/(1<<20), "heap-before-MiB")
	b.Logf("%d connections x %d rounds verified; heap %.1f -> %.1f MiB; server: %d FPDUs in, %d Terminates",
		qps, b.N, float64(before)/(1<<20), float64(after)/(1<<20), st.RxFPDUs, st.TerminatesSent+st.TerminatesReceived)
	if after > before+before/4+8<<20 {
		b.Fatalf("heap grew from %d to %d bytes", before, after)
	}
}
