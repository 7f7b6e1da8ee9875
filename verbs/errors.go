package verbs

import (
	"errors"
	"fmt"

	"rdmatap/iwarp"
)

// Errors. They work with errors.Is; closed objects report net.ErrClosed.
var (
	ErrInvalidArgument = errors.New("verbs: invalid argument")
	ErrInvalidState    = errors.New("verbs: invalid state")
	ErrBusy            = errors.New("verbs: resource busy")
	ErrQueueFull       = iwarp.ErrQueueFull
	ErrTooManySGE      = iwarp.ErrTooManySGE
	ErrRejected        = iwarp.ErrRejected
	ErrMarkers         = iwarp.ErrMarkersUnsupported
	ErrNoMatchingRTR   = iwarp.ErrNoMatchingRTR
	ErrTerminated      = iwarp.ErrTerminated
	ErrCompletion      = errors.New("verbs: work completion error")
)

// RejectedError carries the private data of a peer's rejection.
type RejectedError = iwarp.RejectedError

// TerminateError describes a Terminate sent or received.
type TerminateError = iwarp.TerminateError

// PostError reports which work request of a post failed (bad_wr).
type PostError struct {
	Index int
	Err   error
}

func (e *PostError) Error() string {
	return fmt.Sprintf("verbs: post failed at WR %d: %v", e.Index, e.Err)
}

// Unwrap returns the cause.
func (e *PostError) Unwrap() error { return e.Err }

// CompletionError is a failed work completion.
type CompletionError struct{ WC WC }

func (e *CompletionError) Error() string {
	s := fmt.Sprintf("verbs: %v WR %d: %v", e.WC.Op, e.WC.ID, e.WC.Status)
	if e.WC.Term != (iwarp.TermCode{}) {
		s += fmt.Sprintf(" (terminate %v)", e.WC.Term)
	}
	return s
}

// Is matches ErrCompletion and the statuses' sentinel meanings.
func (e *CompletionError) Is(target error) bool {
	switch target {
	case ErrCompletion:
		return true
	case ErrTerminated:
		return e.WC.Term != (iwarp.TermCode{})
	}
	return false
}
