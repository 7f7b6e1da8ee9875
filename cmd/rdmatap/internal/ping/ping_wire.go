package ping

import (
	"encoding/binary"
	"fmt"
)

// rping's wire format and data pattern (rdma-core
// librdmacm/examples/rping.c), kept byte for byte so that rdmatap ping
// talks to a real rping over Linux siw.

const (
	rpingPort = 7174 // rping's default port
	// rpingInfoSize is sizeof(struct rping_rdma_info): __be64 buf,
	// __be32 rkey, __be32 size, no padding. Every Send of the protocol,
	// in both directions, carries exactly this many bytes.
	rpingInfoSize = 16
	// rpingMinSize is rping's RPING_MIN_BUFSIZE: sizeof(stringify(INT_MAX))
	// + sizeof("rdma-ping-%d: "). rping.c never includes <limits.h>, so
	// INT_MAX stringifies to itself ("INT_MAX", 8 bytes) and the minimum is
	// 8 + 15 = 23.
	rpingMinSize = 23
	// rpingMaxSize: rping accepts sizes up to RPING_BUFSIZE-1 (64 KiB - 1).
	rpingMaxSize     = 64*1024 - 1
	rpingDefaultSize = 64
	// IRD/ORD rping asks for (rping_init_conn_param: responder_resources
	// and initiator_depth 1); the siw captures show IRD=1 ORD=1 in the MPA
	// Request and Reply.
	rpingIRD, rpingORD = 1, 1
	// Queue sizes of rping_create_qp and rping_setup_qp.
	rpingSQDepth = 16
	rpingRQDepth = 2
	rpingCQDepth = 2 * rpingSQDepth
)

// rpingInfo is struct rping_rdma_info: a buffer advertisement. The server's
// "go ahead" Sends carry 16 zero bytes (rping's server never fills its
// send buffer).
type rpingInfo struct {
	Buf  uint64 // virtual address of the buffer (__be64)
	RKey uint32 // its STag (__be32)
	Size uint32 // its length (__be32)
}

func (r rpingInfo) put(b []byte) {
	_ = b[rpingInfoSize-1]
	binary.BigEndian.PutUint64(b, r.Buf)
	binary.BigEndian.PutUint32(b[8:], r.RKey)
	binary.BigEndian.PutUint32(b[12:], r.Size)
}

func parseRpingInfo(b []byte) (rpingInfo, error) {
	if len(b) != rpingInfoSize {
		return rpingInfo{}, fmt.Errorf("Received bogus data, size %d", len(b))
	}
	return rpingInfo{Buf: binary.BigEndian.Uint64(b), RKey: binary.BigEndian.Uint32(b[8:]),
		Size: binary.BigEndian.Uint32(b[12:])}, nil
}

// rpingFill writes ping number ping's data into buf as rping_test_client
// does: "rdma-ping-%d: " (snprintf, truncated to len(buf)-1), then a
// rotating run of the characters 'A' (65) to 'z' (122) that begins at
// start, and a NUL in the last byte. It returns the next ping's start
// character: start+1, wrapping from 'z' to 'A'.
func rpingFill(buf []byte, ping int, start byte) byte {
	if len(buf) == 0 {
		return start
	}
	hdr := fmt.Sprintf("rdma-ping-%d: ", ping)
	cc := copy(buf[:len(buf)-1], hdr)
	buf[cc] = 0
	if len(hdr) > cc {
		cc = len(hdr) // snprintf returns the untruncated length
	}
	c := start
	for i := cc; i < len(buf); i++ {
		buf[i] = c
		c++
		if c > 'z' {
			c = 'A'
		}
	}
	buf[len(buf)-1] = 0
	start++
	if start > 'z' {
		start = 'A'
	}
	return start
}

// cString returns b up to its first NUL (what printf("%s") shows).
func cString(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}

// rpingState is rping's enum test_state; the numbers appear in its error
// messages ("wait for RDMA_READ_ADV state 10").
type rpingState int

const (
	stIdle rpingState = iota + 1
	stConnectRequest
	stAddrResolved
	stRouteResolved
	stConnected
	stReadAdv
	stReadComplete
	stWriteAdv
	stWriteComplete
	stDisconnected
	stError
)

func (s rpingState) String() string {
	names := [...]string{"", "IDLE", "CONNECT_REQUEST", "ADDR_RESOLVED", "ROUTE_RESOLVED", "CONNECTED",
		"RDMA_READ_ADV", "RDMA_READ_COMPLETE", "RDMA_WRITE_ADV", "RDMA_WRITE_COMPLETE", "DISCONNECTED", "ERROR"}
	if s < 1 || int(s) >= len(names) {
		return fmt.Sprintf("state(%d)", int(s))
	}
	return names[s]
}
