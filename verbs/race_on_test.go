//go:build race

package verbs_test

// raceEnabled: the race detector's instrumentation allocates, so tests
// that count allocations skip.
const raceEnabled = true
