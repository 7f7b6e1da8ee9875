//go:build rdmatrace

package lattrace

import (
	"sync/atomic"
	_ "unsafe" // go:linkname
)

// Enabled reports whether marks are recorded (the rdmatrace build tag).
const Enabled = true

// perStage is how many marks each stage keeps; later ones are dropped.
const perStage = 1 << 17

var (
	buf [NumStages][perStage]int64
	cnt [NumStages]atomic.Uint64
)

//go:linkname nanotime runtime.nanotime
func nanotime() int64

// Now returns the clock the marks use (CLOCK_MONOTONIC, ns).
func Now() int64 { return nanotime() }

// Mark records that stage s is reached now.
func Mark(s Stage) { MarkAt(s, nanotime()) }

// MarkAt records that stage s was reached at t (from Now).
func MarkAt(s Stage, t int64) {
	if i := cnt[s].Add(1) - 1; i < perStage {
		buf[s][i] = t
	}
}

func marks(s Stage) []int64 { return buf[s][:min(cnt[s].Load(), perStage)] }
