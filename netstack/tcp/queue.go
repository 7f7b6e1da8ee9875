package tcp

import (
	"io"
	"slices"

	"gvisor.dev/gvisor/pkg/buffer"
)

// byteQueue is a FIFO of bytes in one slice: written at the back, read
// and dropped at the front, compacted when the front's waste passes half
// of it.
type byteQueue struct {
	b []byte
	r int
	// pinned: a reader holds a view of the front (Conn.ReadView), so a
	// write appends and never moves the bytes it sees.
	pinned bool
}

func (q *byteQueue) len() int { return len(q.b) - q.r }

// bytes is the queue's content from offset off on.
func (q *byteQueue) bytes(off int) []byte { return q.b[q.r+off:] }

func (q *byteQueue) write(p []byte) {
	q.compact()
	q.b = append(q.b, p...)
}

func (q *byteQueue) compact() {
	if !q.pinned && q.r > 0 && q.r >= len(q.b)/2 {
		n := copy(q.b, q.b[q.r:])
		q.b, q.r = q.b[:n], 0
	}
}

// grow appends n bytes to fill and returns them; shrink gives back the
// ones not filled.
func (q *byteQueue) grow(n int) []byte {
	q.compact()
	l := len(q.b)
	q.b = slices.Grow(q.b, n)[:l+n]
	return q.b[l:]
}

func (q *byteQueue) shrink(n int) { q.b = q.b[:len(q.b)-n] }

func (q *byteQueue) read(p []byte) int {
	n := copy(p, q.b[q.r:])
	q.drop(n)
	return n
}

func (q *byteQueue) drop(n int) {
	q.r += n
	if q.r == len(q.b) && !q.pinned {
		q.b, q.r = q.b[:0], 0
	}
}

// sendQueue is the send buffer: bytes in blocks of gVisor's pooled,
// reference-counted chunks (buffer.View), written at the back and
// dropped at the front as the peer acknowledges them. A packet carries
// its payload as clones of the blocks' views (appendTo), so the bytes go
// from the writer to the link without another copy, and a block's chunk
// goes back to gVisor's pool only once the queue and every packet that
// holds a piece of it have released it. Bytes once written are never
// written again: the queue writes only past a block's end, and a block
// acknowledged whole is released, not reused.
type sendQueue struct {
	blocks []sendBlock
	r      int // bytes of blocks[0] dropped
	n      int // bytes held
}

// sendBlock is one chunk of the send buffer; every block but the last is
// full.
type sendBlock struct {
	v   *buffer.View // the queue's reference: the whole chunk
	mem []byte       // v's memory
	w   int          // bytes written
}

// The sizes of the blocks: a block is made for what the writer has, at
// least sendBlockMin (gVisor rounds it up to its pool's size class) and
// at most the largest chunk gVisor pools.
const (
	sendBlockMin = 2048
	sendBlockMax = buffer.MaxChunkSize
)

func (q *sendQueue) len() int { return q.n }

// room is free memory at the queue's end for up to n bytes: the rest of
// the last block, or a new block. wrote says how much of it was filled.
func (q *sendQueue) room(n int) []byte {
	if k := len(q.blocks); k > 0 {
		if b := &q.blocks[k-1]; b.w < len(b.mem) {
			return b.mem[b.w:]
		}
	}
	size := min(max(n, sendBlockMin), sendBlockMax)
	v := buffer.NewViewSize(size)
	v.Grow(v.Capacity() - size) // the chunk entire
	q.blocks = append(q.blocks, sendBlock{v: v, mem: v.AsSlice()})
	return q.blocks[len(q.blocks)-1].mem
}

func (q *sendQueue) wrote(k int) {
	q.blocks[len(q.blocks)-1].w += k
	q.n += k
}

func (q *sendQueue) write(p []byte) {
	for len(p) > 0 {
		k := copy(q.room(len(p)), p)
		q.wrote(k)
		p = p[k:]
	}
}

// fill reads up to n bytes from r onto the queue's end, as io.ReadFull
// does, block by block.
func (q *sendQueue) fill(r io.Reader, n int) (int, error) {
	done := 0
	for done < n {
		m := q.room(n - done)
		m = m[:min(len(m), n-done)]
		k, err := io.ReadFull(r, m)
		q.wrote(k)
		done += k
		if err != nil {
			if err == io.EOF && done > 0 {
				err = io.ErrUnexpectedEOF
			}
			return done, err
		}
	}
	return done, nil
}

// drop removes n bytes from the front; an empty queue releases its
// blocks, so an idle connection holds none.
func (q *sendQueue) drop(n int) {
	q.n -= n
	if q.n <= 0 {
		q.release()
		return
	}
	n += q.r
	k := 0
	for n >= q.blocks[k].w {
		n -= q.blocks[k].w
		q.blocks[k].v.Release()
		k++
	}
	if k > 0 {
		m := copy(q.blocks, q.blocks[k:])
		clear(q.blocks[m:])
		q.blocks = q.blocks[:m]
	}
	q.r = n
}

func (q *sendQueue) release() {
	for i := range q.blocks {
		q.blocks[i].v.Release()
	}
	clear(q.blocks)
	q.blocks, q.r, q.n = q.blocks[:0], 0, 0
}

// pieces calls fn with the blocks' pieces of the n bytes from offset off
// on, in order.
func (q *sendQueue) pieces(off, n int, fn func(b *sendBlock, start, l int)) {
	off += q.r
	for i := 0; n > 0 && i < len(q.blocks); i++ {
		b := &q.blocks[i]
		if off >= b.w {
			off -= b.w
			continue
		}
		l := min(b.w-off, n)
		fn(b, off, l)
		n -= l
		off = 0
	}
}

// contiguous is the n bytes from off on when they lie in one block.
func (q *sendQueue) contiguous(off, n int) ([]byte, bool) {
	var p []byte
	k := 0
	q.pieces(off, n, func(b *sendBlock, start, l int) {
		p = b.mem[start : start+l : start+l]
		k++
	})
	return p, k == 1
}

// appendTo appends the n bytes from off on to buf, by reference: clones
// of the blocks' views, each trimmed to its piece.
func (q *sendQueue) appendTo(buf *buffer.Buffer, off, n int) {
	q.pieces(off, n, func(b *sendBlock, start, l int) {
		v := b.v.Clone()
		v.TrimFront(start)
		v.CapLength(l)
		buf.Append(v)
	})
}

// copyOut copies the n bytes from off on into p.
func (q *sendQueue) copyOut(p []byte, off, n int) {
	at := 0
	q.pieces(off, n, func(b *sendBlock, start, l int) {
		at += copy(p[at:], b.mem[start:start+l])
	})
}
