package tap

import (
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// BenchmarkTAPTCP measures one TCP connection between a kernel socket and
// gVisor (gonet) across the TAP, MTU 1500, 1 MiB writes, for the offload
// (virtio-net header, TSO/GRO, checksum offload) and plain TAP paths.
func BenchmarkTAPTCP(b *testing.B) {
	requireRoot(b)
	for _, m := range modes {
		r := newRig(b, m.offload, 1500)
		gv, kc := r.connect(b)
		for _, dir := range []struct {
			name string
			w    net.Conn
			r    net.Conn
		}{{"gvisor-to-kernel", gv, kc}, {"kernel-to-gvisor", kc, gv}} {
			b.Run(fmt.Sprintf("offload=%v/%s", m.offload, dir.name), func(b *testing.B) {
				msg := make([]byte, 1<<20)
				for i := range msg {
					msg[i] = byte(i * 7)
				}
				b.SetBytes(int64(len(msg)))
				done := make(chan error, 1)
				total := int64(b.N) * int64(len(msg))
				go func() {
					_, err := io.CopyN(io.Discard, dir.r, total)
					done <- err
				}()
				start := time.Now()
				b.ResetTimer()
				for range b.N {
					if _, err := dir.w.Write(msg); err != nil {
						b.Fatal(err)
					}
				}
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				b.ReportMetric(float64(total)*8/time.Since(start).Seconds()/1e9, "Gbit/s")
			})
		}
	}
}
