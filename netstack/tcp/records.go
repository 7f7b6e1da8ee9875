package tcp

import (
	"errors"
	"io"
	"sort"

	"gvisor.dev/gvisor/pkg/tcpip/seqnum"
)

// Records tells where the records (MPA FPDUs) of the bytes a writer
// produces end, so that segments can be cut at their boundaries (RFC 5044
// Appendix A's FPDU-aligned sender): a receiver then finds an FPDU at the
// start of every segment, in whatever order segments arrive, and places
// it from the segment. netstack.RecordPayloader is one.
type Records interface {
	// RecordRest is the bytes left of the record being produced; they
	// end on a boundary. 0 at a boundary (some producers give the next
	// record's length there instead).
	RecordRest() int
	// RecordFit is the most bytes, at most max, that can be produced
	// next and end on a boundary; 0 if no boundary lies within max.
	RecordFit(max int) int
}

// RecordPlanner is Records that can tell the lengths of the records
// ahead before producing them: RecordPlan appends to ls those of the
// records (the first one's rest, when one is under way) that end within
// max bytes. TCP then reads them in one Read rather than one per record.
type RecordPlanner interface {
	RecordPlan(max int, ls []int) []int
}

// The send buffer's record boundaries: the sequence numbers at which a
// record ends, ascending, every one beyond sndUna. Segments, first
// transmissions and retransmissions alike, end at the last boundary that
// fits them, and a run of equal records goes out as one GSO
// super-segment cut at the record's length, so each segment holds whole
// records (a record longer than a segment is cut at the segment and
// realigned at its end). Bytes written without Records carry no
// boundaries and are cut at the MSS.
type recordMarks struct {
	m []seqnum.Value
	r int // m[r:] are the boundaries still in the send buffer
	// partial: the buffer ends inside a record (the writer ran out of
	// room), whose rest comes once an ACK makes room.
	partial bool
	hint    int // after's latest answer
}

func (q *recordMarks) len() int { return len(q.m) - q.r }

func (q *recordMarks) push(end seqnum.Value) {
	if q.len() > 0 && !q.m[len(q.m)-1].LessThan(end) {
		return
	}
	if q.r > 0 && q.r >= len(q.m)/2 {
		n := copy(q.m, q.m[q.r:])
		q.m, q.r = q.m[:n], 0
	}
	q.m = append(q.m, end)
}

// ack drops the boundaries at or before una; an empty queue gives its
// memory back unless it is small (an idle connection keeps little, and
// a sender that empties it at every ACK does not grow it again each
// time).
func (q *recordMarks) ack(una seqnum.Value) {
	for q.r < len(q.m) && q.m[q.r].LessThanEq(una) {
		q.r++
	}
	if q.r == len(q.m) {
		if cap(q.m) > 1024 {
			q.m = nil
		} else {
			q.m = q.m[:0]
		}
		q.r = 0
	}
}

// marked is how many bytes from seq on end on the last boundary (0 when
// none lies beyond seq).
func (q *recordMarks) marked(seq seqnum.Value) int {
	if q.len() == 0 || !seq.LessThan(q.m[len(q.m)-1]) {
		return 0
	}
	return int(seq.Size(q.m[len(q.m)-1]))
}

// after is the index in m of the first boundary beyond seq. The cuts of
// one output ask for boundaries a record or so apart, so the search
// first walks a few boundaries on from the previous answer.
func (q *recordMarks) after(seq seqnum.Value) int {
	if h := q.hint; h >= q.r && h <= len(q.m) && (h == q.r || !seq.LessThan(q.m[h-1])) {
		for end := min(h+4, len(q.m)); h < end; h++ {
			if seq.LessThan(q.m[h]) {
				q.hint = h
				return h
			}
		}
		if h == len(q.m) {
			q.hint = h
			return h
		}
	}
	q.hint = q.r + sort.Search(q.len(), func(i int) bool { return seq.LessThan(q.m[q.r+i]) })
	return q.hint
}

// errBadPlan is a RecordPlanner's plan longer than it was asked for.
var errBadPlan = errors.New("tcp: record plan beyond its bound")

// trailerSize is the MPA CRC field that ends every FPDU. A cut inside it
// trips Linux siw's receiver, which reassembles a split trailer wrongly.
const trailerSize = 4

// cutOne is the length of a segment from seq of at most max bytes: to
// the last boundary within max when there is one (onMark); otherwise
// max, moved back out of a record's last trailerSize bytes.
func (c *Conn) cutOne(seq seqnum.Value, max int) (n int, onMark bool) {
	q := &c.marks
	if q.len() == 0 || max <= 0 {
		return max, false
	}
	end := seq.Add(seqnum.Size(max))
	i := q.after(end) // the first boundary beyond the cut
	if i > q.r && seq.LessThan(q.m[i-1]) {
		return int(seq.Size(q.m[i-1])), true
	}
	if i < len(q.m) {
		if d := int(end.Size(q.m[i])); d < trailerSize && max > trailerSize-d {
			return max - (trailerSize - d), false
		}
	}
	return max, false
}

// cutLen is cutOne's length alone.
func (c *Conn) cutLen(seq seqnum.Value, max int) int {
	n, _ := c.cutOne(seq, max)
	return n
}

// cut sizes an output of up to n bytes from seq: one segment (segSize 0)
// of at most the MSS, or, when n is more than one (GSO), a super-segment
// of equal segments of segSize bytes each but the last, which may be
// shorter. Every segment of it ends on a boundary, but for full ones
// through a record longer than a segment.
func (c *Conn) cut(seq seqnum.Value, n int) (total, segSize int) {
	mss := c.sndMSS
	if c.marks.len() == 0 {
		if n > mss {
			return n, mss
		}
		return n, 0
	}
	if n <= mss {
		return c.cutLen(seq, n), 0
	}
	size, _ := c.cutOne(seq, mss)
	total = size
	for total < n {
		k, on := c.cutOne(seq.Add(seqnum.Size(total)), min(size, n-total))
		if k <= 0 || !on && (size < mss || k < size) {
			break
		}
		total += k
		if k < size {
			break // the last, shorter segment
		}
	}
	if total > size {
		return total, size
	}
	return total, 0
}

// fillRecords reads the records of lens from r onto the send buffer, as
// fill does, each in one block of it when a block holds it
// (sendQueue.reserve): as many at a time as the block has room for.
func (c *Conn) fillRecords(r io.Reader, lens []int) (int, error) {
	total := 0
	for i := 0; i < len(lens); {
		room := c.sndBuf.reserve(lens[i])
		k, j := lens[i], i+1
		if room >= k {
			for j < len(lens) && k+lens[j] <= room {
				k += lens[j]
				j++
			}
		} else if room == 0 {
			// A new block: for as many as it holds.
			for j < len(lens) && k+lens[j] <= sendBlockMax {
				k += lens[j]
				j++
			}
		}
		got, err := c.fill(r, k)
		total += got
		if err != nil || got < k {
			return total, err
		}
		i = j
	}
	return total, nil
}

// writeRecords is WriteFrom for a producer of records: it reads up to n
// bytes in pieces that each end on a record boundary where one fits a
// segment, and notes the boundaries.
func (c *Conn) writeRecords(r io.Reader, n int, rec Records) (int, error) {
	total := 0
	planner, _ := rec.(RecordPlanner)
	for total < n {
		room := n - total
		if planner != nil {
			c.plan = planner.RecordPlan(room, c.plan[:0])
			if len(c.plan) > 0 {
				k := 0
				for _, l := range c.plan {
					k += l
				}
				if k <= 0 || k > room {
					return total, errBadPlan
				}
				got, err := c.fillRecords(r, c.plan)
				base := c.sndUna.Add(seqnum.Size(c.sndBuf.len() - got))
				at := 0
				for _, l := range c.plan {
					if at += l; at > got {
						break
					}
					c.marks.push(base.Add(seqnum.Size(at)))
				}
				total += got
				c.marks.partial = got < k
				if err != nil {
					return total, err
				}
				continue
			}
		}
		k := rec.RecordRest()
		if k <= 0 || k > room {
			k = rec.RecordFit(min(room, c.sndMSS))
			if k <= 0 {
				k = rec.RecordFit(room)
			}
		}
		mark := k > 0
		if !mark {
			k = room // no boundary within room: its rest comes next time
		} else {
			c.sndBuf.reserve(k)
		}
		got, err := c.fill(r, k)
		total += got
		c.marks.partial = got < k || !mark
		if !c.marks.partial {
			c.marks.push(c.sndUna.Add(seqnum.Size(c.sndBuf.len())))
		}
		if err != nil {
			return total, err
		}
	}
	return total, nil
}
