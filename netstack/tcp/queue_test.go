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
		// Empty, it keeps at most a large block with room.
		if q.len() > 0 && len(q.blocks) == 0 || q.len() == 0 && (len(q.blocks) > 1 ||
			len(q.blocks) == 1 && (len(q.blocks[0].mem) != sendBlockMax || q.blocks[0].w == sendBlockMax)) {
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

// TestRecvQueueKeeps checks the receive buffer's pieces: payloads taken
// by reference stay intact after the packet that held them is released
// and gVisor's pool hands its chunks out again for other bytes, copies
// and references come out in order whether read by copy or in place, and
// an empty queue holds no chunk.
func TestRecvQueueKeeps(t *testing.T) {
	rng := rand.New(rand.NewSource(4))
	src := make([]byte, 8<<20)
	rng.Read(src)
	var q recvQueue
	in, out := 0, 0
	refs := 0
	for out < len(src) {
		for in < len(src) && q.len() < 1<<20 && rng.Intn(4) != 0 {
			// A packet: its payload after a header, in a chunk
			// that fits it or one much larger.
			n := min(1+rng.Intn(20000), len(src)-in)
			hdr := rng.Intn(60)
			size := hdr + n
			if rng.Intn(3) == 0 {
				size = 64 << 10
				n = min(n, size-hdr)
			}
			v := buffer.NewViewSize(size)
			mem := v.AsSlice()
			rng.Read(mem[:hdr])
			copy(mem[hdr:], src[in:in+n])
			before := len(q.ps)
			q.take(v, mem[hdr:hdr+n])
			if len(q.ps) > before && q.ps[len(q.ps)-1].v != q.own {
				refs++
			}
			v.Release() // the stack is done with the packet
			// Others take the pool's chunks and write over them.
			for range 2 {
				g := buffer.NewViewSize(size)
				rng.Read(g.AsSlice())
				g.Release()
			}
			in += n
		}
		if q.len() == 0 {
			if len(q.ps) != 0 || q.own != nil {
				t.Fatalf("an empty queue holds %d pieces and chunk %v", len(q.ps), q.own != nil)
			}
			continue
		}
		if rng.Intn(2) == 0 {
			q.pinned = true
			b := q.front()
			k := rng.Intn(len(b) + 1)
			if !bytes.Equal(b[:k], src[out:out+k]) {
				t.Fatalf("the front piece at %d differs", out)
			}
			q.pinned = false
			q.drop(k)
			out += k
		} else {
			p := make([]byte, 1+rng.Intn(100<<10))
			k := q.read(p)
			if !bytes.Equal(p[:k], src[out:out+k]) {
				t.Fatalf("the %d bytes read at %d differ", k, out)
			}
			out += k
		}
		if q.len() != in-out {
			t.Fatalf("the queue holds %d bytes, not %d", q.len(), in-out)
		}
	}
	if refs == 0 {
		t.Fatal("no payload was taken by reference")
	}
}
