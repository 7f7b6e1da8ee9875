// Package lattrace timestamps the stages of a small message's way through
// rdmatap — the application's post, the engine's write to TCP, the TAP's
// write and read, the stack's processing, the reader's wake-up, placement,
// the application's notice — to show where the microseconds of one message
// go (docs/performance.md, BenchmarkLatencyBreakdown).
//
// Marks cost nothing unless the binary is built with the rdmatrace tag:
// Enabled is then true and each Mark stores a CLOCK_MONOTONIC timestamp in
// a fixed array per stage. The clock is the host's, so the traces of two
// processes on one host line up.
package lattrace

import (
	"bufio"
	"fmt"
	"io"
)

// Stage is a point on a message's way.
type Stage uint8

// The stages, in the order a message passes them: the sender's first,
// then the receiver's.
const (
	Post       Stage = iota // the application posts the work request
	TCPWrite                // the engine hands the message's FPDUs to TCP
	LinkEnter               // TCP hands a data segment to rdmatap's NIC link
	LinkWrite               // the TAP link writes a frame carrying TCP data
	TAPWritten              // that write returned
	TCPWritten              // the engine's write to TCP returned
	TAPRead                 // the TAP link has read a frame carrying TCP data
	Fed                     // segment placement: the frame's message is placed and delivered from the link's goroutine
	Delivered               // the stack's processing of that frame returned
	Readable                // TCP has made the connection readable (its goroutine)
	ReadStart               // the reader begins the read that returns the data
	ReadDone                // the read returned: the message is parsed and placed
	AppSaw                  // the application sees the message
	NumStages
)

var names = [NumStages]string{"post", "tcp_write", "link_enter", "link_write", "tap_written", "tcp_written", "tap_read", "fed", "delivered", "readable", "read_start", "read_done", "app_saw"}

func (s Stage) String() string {
	if s < NumStages {
		return names[s]
	}
	return fmt.Sprintf("stage%d", s)
}

// ParseStage returns the stage named name.
func ParseStage(name string) (Stage, bool) {
	for i, n := range names {
		if n == name {
			return Stage(i), true
		}
	}
	return 0, false
}

// TCPPayload returns the TCP payload length of an Ethernet frame whose
// headers (Ethernet, IPv4, TCP) are in hdr, or 0 for anything else.
func TCPPayload(hdr []byte) int {
	if len(hdr) < 14+20 || hdr[12] != 0x08 || hdr[13] != 0x00 {
		return 0
	}
	ip := hdr[14:]
	ihl := int(ip[0]&0x0f) * 4
	if ip[0]>>4 != 4 || ip[9] != 6 || ihl < 20 || len(ip) < ihl+20 {
		return 0
	}
	total := int(ip[2])<<8 | int(ip[3])
	doff := int(ip[ihl+12]>>4) * 4
	return max(total-ihl-doff, 0)
}

// Dump writes the marks: a line per mark, "stage nanoseconds", stages in
// order, each stage's marks in the order they were made.
func Dump(w io.Writer) error {
	bw := bufio.NewWriter(w)
	for s := range NumStages {
		for _, t := range marks(s) {
			fmt.Fprintf(bw, "%s %d\n", s, t)
		}
	}
	return bw.Flush()
}
