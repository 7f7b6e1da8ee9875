//go:build !rdmatrace

package lattrace

// Enabled reports whether marks are recorded (the rdmatrace build tag).
const Enabled = false

// Now returns 0: marks are not recorded.
func Now() int64 { return 0 }

// Mark does nothing without the rdmatrace build tag.
func Mark(Stage) {}

// MarkAt does nothing without the rdmatrace build tag.
func MarkAt(Stage, int64) {}

func marks(Stage) []int64 { return nil }
