// Package progtest holds what the tests of Debian's RDMA programs on
// rdmatap's C libraries share: knowledge of those programs' own defects.
package progtest

import "bytes"

// PerftestListenRace reports whether a perftest client's output shows
// perftest's race between its two ends: with -R, the client connects its
// data QPs right after the handshake over its TCP control connection, while
// the server only then starts listening for them. A connection that wins
// the race is refused (RDMA_CM_EVENT_REJECTED with ECONNREFUSED, as the
// kernel's iWARP CM reports it), and perftest 4.5-0.17 (Debian bookworm)
// then retries with CM IDs it has just destroyed, so the client usually
// dies by a signal. err is how the client ended; a client that survived its
// retry has not raced.
func PerftestListenRace(out []byte, err error) bool {
	return err != nil && bytes.Contains(out, []byte("Event: RDMA_CM_EVENT_REJECTED; error: -111"))
}
