package verbs

import (
	"errors"
	"fmt"

	"github.com/rdmatap/rdmatap/iwarp"
)

// Errors. They work with errors.Is, and an error matches the same one
// whichever device kind (embedded or a service's) and whichever layer (the
// verbs, the protocol engine, the service) found it; closed objects report
// net.ErrClosed.
var (
	ErrInvalidArgument = errors.New("verbs: invalid argument")
	// ErrInvalidState: the object's state does not allow the call (a
	// post to a QP in ERROR or closed, a connect of a connected QP).
	ErrInvalidState = iwarp.ErrInvalidState
	// ErrInvalidWR: a work request the QP cannot execute (an unknown
	// opcode, more inline data than MaxInline, a REG_MR or BIND_MW of
	// another protection domain), as ibv_post_send's EINVAL.
	ErrInvalidWR     = iwarp.ErrInvalidWR
	ErrBusy          = errors.New("verbs: resource busy")
	ErrQueueFull     = iwarp.ErrQueueFull
	ErrTooManySGE    = iwarp.ErrTooManySGE
	ErrRejected      = iwarp.ErrRejected
	ErrMarkers       = iwarp.ErrMarkersUnsupported
	ErrNoMatchingRTR = iwarp.ErrNoMatchingRTR
	ErrTerminated    = iwarp.ErrTerminated
	ErrCompletion    = errors.New("verbs: work completion error")
	// ErrUnsupported reports an operation a device cannot do.
	ErrUnsupported = fmt.Errorf("verbs: %w", errors.ErrUnsupported)
	// ErrLimit reports a per-client limit of the service.
	ErrLimit = errors.New("verbs: per-client limit reached")
	// ErrNotShared reports an MR buffer a service cannot map: it must lie
	// in a zerocopy.AllocShared buffer.
	ErrNotShared = errors.New("verbs: memory for a device of a service must come from zerocopy.AllocShared")
)

// RejectedError carries the private data of a peer's rejection (the
// MPA Reply with the Reject bit). errors.As finds it in the error Dial
// returns; the error matches ErrRejected too.
type RejectedError struct {
	PrivateData []byte
	// Markers says the Request asked for MPA markers: the likely reason,
	// as Linux siw and most iWARP peers reject any Request with M.
	Markers bool
}

func (e *RejectedError) Error() string {
	return (&iwarp.RejectedError{PrivateData: e.PrivateData, Markers: e.Markers}).Error()
}

// Is matches ErrRejected, and ErrMarkers when the Request asked for
// markers.
func (e *RejectedError) Is(target error) bool {
	return target == ErrRejected || target == ErrMarkers && e.Markers
}

// TerminateError describes a Terminate sent or received. errors.As finds
// it in a QP's error (QP.Err, AsyncEvent.Err) when a Terminate ended the
// QP; the error matches ErrTerminated too.
type TerminateError struct {
	Code     TermCode
	Received bool // true: the peer sent it
}

func (e *TerminateError) Error() string {
	return (&iwarp.TerminateError{Code: e.Code.engine(), Received: e.Received}).Error()
}

// Is matches ErrTerminated.
func (e *TerminateError) Is(target error) bool { return target == ErrTerminated }

// TermCode is the (layer, error type, error code) triple of a Terminate
// (RFC 5040 §7.1, RFC 5041 §7.2, RFC 5044 §8).
type TermCode struct {
	Layer TermLayer
	EType uint8
	Code  uint8
}

func (c TermCode) String() string { return c.engine().String() }

// TermLayer is the layer a Terminate names.
type TermLayer uint8

// Terminate layers.
const (
	TermRDMAP TermLayer = 0
	TermDDP   TermLayer = 1
	TermLLP   TermLayer = 2 // MPA
)

func (l TermLayer) String() string { return iwarp.Layer(l).String() }

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
	if e.WC.Term != (TermCode{}) {
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
		return e.WC.Term != (TermCode{})
	}
	return false
}
