// Package units reads the byte counts that rdmatap's commands and examples
// take on their command lines: a number with an optional binary suffix,
// K, M or G (either case), as "4096", "64K", "1M", "8G".
package units

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ErrSize reports a byte count that is malformed, negative or too large.
var ErrSize = errors.New("bad byte count")

// ParseBytes reads s as a byte count of at most max bytes.
func ParseBytes(s string, max int64) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'k', 'K':
			mult, t = 1<<10, t[:len(t)-1]
		case 'm', 'M':
			mult, t = 1<<20, t[:len(t)-1]
		case 'g', 'G':
			mult, t = 1<<30, t[:len(t)-1]
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%w %q (a number with an optional K, M or G suffix)", ErrSize, s)
	}
	if n > math.MaxInt64/mult || n*mult > max {
		return 0, fmt.Errorf("%w %q: more than %s", ErrSize, s, Format(max))
	}
	return n * mult, nil
}

// Format writes n with the largest suffix that divides it.
func Format(n int64) string {
	switch {
	case n != 0 && n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + "G"
	case n != 0 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + "M"
	case n != 0 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + "K"
	}
	return strconv.FormatInt(n, 10)
}

// Size is a flag.Value holding a byte count of at most Max bytes.
type Size struct {
	N   int64
	Max int64
}

// String returns the count as Format writes it.
func (z *Size) String() string {
	if z == nil {
		return "0"
	}
	return Format(z.N)
}

// Set reads a count (ParseBytes).
func (z *Size) Set(s string) error {
	n, err := ParseBytes(s, z.Max)
	if err != nil {
		return err
	}
	z.N = n
	return nil
}

// Int is a flag.Value that sets *P to a byte count of at most Max (the
// flag's default is whatever *P holds when it is registered).
type Int struct {
	P   *int
	Max int64
}

// String returns *P.
func (z Int) String() string {
	if z.P == nil {
		return "0"
	}
	return strconv.Itoa(*z.P)
}

// Set reads a count (ParseBytes).
func (z Int) Set(s string) error {
	n, err := ParseBytes(s, z.Max)
	if err != nil {
		return err
	}
	*z.P = int(n)
	return nil
}
