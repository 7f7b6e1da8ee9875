package tcp

import (
	"bytes"
	"math/rand"
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
)

// TestSendQueueShares checks what packets take of the send buffer by
// reference: a range taken before the queue drops its front, gives its
// blocks back and takes more bytes (so that gVisor's pool hands out
// chunks again) still holds its bytes, and a range taken after, a
// retransmission of bytes not dropped yet, holds the right ones.
func TestSendQueueShares(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	src := make([]byte, 4<<20)
	rng.Read(src)
	var q sendQueue
	type taken struct {
		off int // in src
		buf buffer.Buffer
	}
	var held []taken
	front, back := 0, 0 // src's bytes in the queue
	for back < len(src) || q.len() > 0 {
		if back < len(src) && q.len() < 300<<10 {
			n := min(1+rng.Intn(70<<10), len(src)-back)
			if rng.Intn(2) == 0 {
				q.write(src[back : back+n])
			} else if k, err := q.fill(bytes.NewReader(src[back:back+n]), n); k != n || err != nil {
				t.Fatalf("fill: %d, %v", k, err)
			}
			back += n
		}
		// A packet of what the queue holds, anywhere in it.
		if q.len() > 0 {
			off := rng.Intn(q.len())
			n := min(1+rng.Intn(64<<10), q.len()-off)
			var b buffer.Buffer
			q.appendTo(&b, off, n)
			if int(b.Size()) != n {
				t.Fatalf("appendTo gave %d bytes, not %d", b.Size(), n)
			}
			if p, ok := q.contiguous(off, n); ok && !bytes.Equal(p, src[front+off:front+off+n]) {
				t.Fatal("contiguous gave other bytes")
			}
			held = append(held, taken{front + off, b})
		}
		k := min(rng.Intn(80<<10), q.len())
		if back == len(src) && rng.Intn(4) == 0 {
			k = q.len()
		}
		q.drop(k)
		front += k
		if q.len() != back-front {
			t.Fatalf("the queue holds %d bytes, not %d", q.len(), back-front)
		}
		if len(q.blocks) == 0 != (q.len() == 0) {
			t.Fatalf("%d blocks for %d bytes", len(q.blocks), q.len())
		}
	}
	for _, h := range held {
		got := h.buf.Flatten()
		if !bytes.Equal(got, src[h.off:h.off+len(got)]) {
			t.Fatalf("the %d bytes taken at %d changed", len(got), h.off)
		}
		h.buf.Release()
	}
}
