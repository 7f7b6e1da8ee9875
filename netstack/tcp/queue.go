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

// The sizes of the blocks: at most the largest chunk gVisor pools, and
// at least sendBlockMin (gVisor rounds it up to its pool's size class).
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
	// A block for n bytes when the queue is empty (a message at a
	// time), a large one while data piles up.
	size := sendBlockMax
	if q.n == 0 {
		size = min(max(n, sendBlockMin), sendBlockMax)
	}
	v := buffer.NewViewSize(size)
	v.Grow(v.Capacity() - size) // the chunk entire
	q.blocks = append(q.blocks, sendBlock{v: v, mem: v.AsSlice()})
	return q.blocks[len(q.blocks)-1].mem
}

// reserve readies the queue's end for a record of need bytes, of want
// bytes to come: a last block with less room than need, when a block can
// hold it, is sealed (the rest of its chunk left unused), so that the
// record starts a new block rather than straddle two. A segment of whole
// records then lies in pieces that are whole records too, and so do
// the peer's pieces of it. It returns the room there is now (0: a new
// block comes with the next write).
func (q *sendQueue) reserve(need int) int {
	k := len(q.blocks)
	if k == 0 {
		return 0
	}
	b := &q.blocks[k-1]
	if room := len(b.mem) - b.w; room >= need || need > sendBlockMax {
		return room
	}
	b.mem = b.mem[:b.w]
	return 0
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
		// Empty: the blocks go, but for a large last one with room,
		// which the next bytes fill (a sender that keeps up with its
		// writer empties the queue at every ACK). Small blocks go
		// all: an idle connection that only exchanged messages holds
		// none.
		if k := len(q.blocks); k > 0 {
			last := q.blocks[k-1]
			if len(last.mem) == sendBlockMax && last.w < len(last.mem) {
				q.blocks = q.blocks[:k-1]
				q.release()
				q.blocks = append(q.blocks, last)
				q.r = last.w
				return
			}
		}
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

// recvQueue is the receive buffer: the in-order bytes not read yet, in
// pieces of gVisor's reference-counted chunks. A segment's payload that
// fills enough of the packet's chunk stays in it, by reference (take):
// the reader's copy into its own memory is then the only one. Smaller
// ones, which would pin a chunk much larger than themselves, and data
// that waited out of order are copied (write) into a chunk of the
// queue's own, filled one after another. An empty queue holds no chunk.
type recvQueue struct {
	ps []recvPiece
	n  int // bytes held
	// pinned: a reader holds the front piece's bytes (Conn.ReadView).
	pinned bool
	// own is the chunk write fills (nil: none), mem its memory, w the
	// bytes written.
	own *buffer.View
	mem []byte
	w   int
	// ownLast: the last piece is own's, up to w.
	ownLast bool
}

// recvPiece is a run of the queue's bytes in one chunk.
type recvPiece struct {
	v *buffer.View // the piece's reference to the chunk
	b []byte       // the bytes not read yet
}

// The rule for taking a packet's memory by reference: at least
// recvRefMin bytes, and at least a sixteenth of the chunk they lie in.
const (
	recvRefMin   = 512
	recvRefShare = 16
)

func (q *recvQueue) len() int { return q.n }

// front is the bytes of the first piece.
func (q *recvQueue) front() []byte {
	if len(q.ps) == 0 {
		return nil
	}
	b := q.ps[0].b
	return b[:len(b):len(b)]
}

// write copies p onto the queue's end.
func (q *recvQueue) write(p []byte) {
	for len(p) > 0 {
		if q.w == len(q.mem) {
			q.dropOwn()
			// A chunk for p alone when nothing else waits (one
			// segment at a time), a large one while data piles up.
			size := sendBlockMax
			if q.n == 0 {
				size = min(max(len(p), sendBlockMin), sendBlockMax)
			}
			q.own = buffer.NewViewSize(size)
			q.own.Grow(q.own.Capacity() - size)
			q.mem = q.own.AsSlice()
		}
		k := copy(q.mem[q.w:], p)
		b := q.mem[q.w : q.w+k]
		if last := len(q.ps) - 1; q.ownLast && last >= 0 {
			q.ps[last].b = q.mem[q.w-len(q.ps[last].b) : q.w+k] // it continues the last piece
		} else {
			q.ps = append(q.ps, recvPiece{v: q.own.Clone(), b: b})
			q.ownLast = true
		}
		q.w += k
		q.n += k
		p = p[k:]
	}
}

// dropOwn gives up the chunk write fills; its pieces keep their own
// references.
func (q *recvQueue) dropOwn() {
	if q.own != nil {
		q.own.Release()
	}
	q.own, q.mem, q.w, q.ownLast = nil, nil, 0, false
}

// take appends p, which lies in v (a view of the packet the caller
// borrows), by reference when the rule allows and by copy otherwise.
func (q *recvQueue) take(v *buffer.View, p []byte) {
	if len(p) < recvRefMin || len(p)*recvRefShare < v.Capacity() {
		q.write(p)
		return
	}
	q.ps = append(q.ps, recvPiece{v: v.Clone(), b: p[:len(p):len(p)]})
	q.ownLast = false
	q.n += len(p)
}

// read copies bytes from the front into p and drops them.
func (q *recvQueue) read(p []byte) int {
	n := 0
	for _, pc := range q.ps {
		if n == len(p) {
			break
		}
		n += copy(p[n:], pc.b)
	}
	q.drop(n)
	return n
}

// drop removes n bytes from the front, releasing the chunks read whole.
func (q *recvQueue) drop(n int) {
	q.n -= n
	k := 0
	for k < len(q.ps) && n >= len(q.ps[k].b) {
		n -= len(q.ps[k].b)
		q.ps[k].v.Release()
		k++
	}
	if k > 0 {
		m := copy(q.ps, q.ps[k:])
		clear(q.ps[m:])
		q.ps = q.ps[:m]
	}
	if n > 0 {
		q.ps[0].b = q.ps[0].b[n:]
	}
	if q.n == 0 {
		q.dropOwn()
		if cap(q.ps) > 128 {
			q.ps = nil // (a few kept: a reader that catches up empties it often)
		}
	}
}
