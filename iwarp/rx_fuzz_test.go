package iwarp

import (
	"context"
	"io"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// nullStream is a Stream whose reads block until the QP ends and whose
// writes are discarded: the fuzzer drives the receiver directly.
type nullStream struct{ closed chan struct{} }

func (s *nullStream) ReadTo(ctx context.Context, w io.Writer, max int) (int, error) {
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-s.closed:
		return 0, io.EOF
	}
}
func (s *nullStream) TryReadTo(w io.Writer, max int) (int, error) { return 0, nil }
func (s *nullStream) WaitReadable(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-s.closed:
		return io.EOF
	}
}
func (s *nullStream) ReadFull(ctx context.Context, p []byte) error { return io.EOF }
func (s *nullStream) Write(ctx context.Context, p []byte) (int, error) {
	return len(p), nil
}
func (s *nullStream) WritePayload(ctx context.Context, pl tcpip.Payloader) (int64, error) {
	n, err := io.Copy(io.Discard, io.LimitReader(pl, int64(pl.Len())))
	return n, err
}
func (s *nullStream) MaxPayload() int   { return 1420 }
func (s *nullStream) CloseWrite() error { return nil }
func (s *nullStream) Abort()            {}
func (s *nullStream) Close() error      { return nil }

// FuzzReceiver feeds arbitrary stream bytes to a QP's receive path: it
// must never panic and never write outside the registered region.
func FuzzReceiver(f *testing.F) {
	seeds := [][]byte{
		rawFPDU(rawULPDU(DDPFields{Opcode: OpSend, Last: true, QN: QNSend, MSN: 1}, []byte("hello")), false),
		rawFPDU(rawULPDU(DDPFields{Opcode: OpWrite, Last: true, STag: 0x100, TO: 0x10000}, make([]byte, 40)), false),
		rawFPDU(rawULPDU(DDPFields{Opcode: OpReadRequest, Last: true, QN: QNReadReq, MSN: 1}, make([]byte, ReadRequestSize)), false),
		rawFPDU(rawULPDU(DDPFields{Opcode: OpTerminate, Last: true, QN: QNTerminate, MSN: 1}, []byte{0x20, 2, 0, 0}), false),
		{0, 0, 0, 0},
		{0xff, 0xff, 0x41, 0x43},
	}
	for _, s := range seeds {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, data []byte, crc bool) {
		guard := make([]byte, 3*4096)
		mem := NewMemTable()
		reg := &Region{Buf: guard[4096:8192], Base: 0x10000, Access: AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead, PD: 1}
		mem.Register(reg)
		rq, _ := NewRecvQueue(4, 2)
		for i := 0; i < 4; i++ {
			rq.Post(uint64(i), []SGE{{Addr: reg.Base + uint64(i*1024), Length: 1024, LKey: reg.STag()}})
		}
		qp, err := NewQP(QPConfig{Num: 1, PD: 1, Mem: mem, SendCQ: newTestCQ(), RecvCQ: newTestCQ(), RQ: rq})
		if err != nil {
			t.Fatal(err)
		}
		s := &nullStream{closed: make(chan struct{})}
		if err := qp.Start(s, ConnParams{CRC: crc, IRD: 2, ORD: 2}); err != nil {
			t.Fatal(err)
		}
		// Feed in a few uneven pieces, as packet views arrive.
		for len(data) > 0 {
			k := min(len(data), 1+int(data[0])%97)
			if n, err := qp.rx.Write(data[:k]); n != k || err != nil {
				t.Fatalf("Write took %d of %d: %v", n, k, err)
			}
			data = data[k:]
		}
		close(s.closed)
		qp.Close()
		for i, c := range guard[:4096] {
			if c != 0 {
				t.Fatalf("byte %d before the region written", i)
			}
		}
		for i, c := range guard[8192:] {
			if c != 0 {
				t.Fatalf("byte %d after the region written", i)
			}
		}
	})
}
