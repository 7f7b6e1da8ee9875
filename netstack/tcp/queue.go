package tcp

import "slices"

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
