// Command rdmatap is the rdmatap endpoint and its tools.
//
//	rdmatap demo    two endpoints in this process over an in-memory link
//	                (no root): Send/Recv, RDMA Write, RDMA Read, every byte
//	                verified; a table of throughput and latency
//	rdmatap up      a standalone endpoint on a TAP device, with a JSON
//	                control socket for devinfo and stat
//	rdmatap ping    rping-compatible client and server
//	rdmatap bw/lat  perftest-compatible bandwidth and latency tests
//	rdmatap devinfo / stat   attributes and counters of a running endpoint
//
// The network commands own their endpoint: --tap, --addr and the other
// endpoint flags (rdmatap <command> -h lists them).
package main
