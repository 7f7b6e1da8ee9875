//go:build race

package svc

// raceEnabled: the race detector's instrumentation allocates, so the
// allocation counts are skipped.
const raceEnabled = true
