package perftest

import (
	"fmt"
	"os"

	"github.com/rdmatap/rdmatap/internal/lattrace"
)

// dumpLatTrace writes the latency trace marks (a binary built with the
// rdmatrace tag) to the file $RDMATAP_TRACE names, for
// BenchmarkLatencyBreakdown.
func dumpLatTrace() {
	path := os.Getenv("RDMATAP_TRACE")
	if !lattrace.Enabled || path == "" {
		return
	}
	f, err := os.Create(path)
	if err == nil {
		err = lattrace.Dump(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "rdmatap: latency trace: %v\n", err)
	}
}
