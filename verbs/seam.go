package verbs

import (
	"errors"
	"unsafe"

	"github.com/rdmatap/rdmatap/iwarp"
)

// The seam between the verbs and the protocol engine (package iwarp).
//
// The verbs have types of their own for everything an application
// handles: work requests, SGEs, completions, flags, states. The data
// path hands them to the engine as they are: SendWR, SGE and WC have the
// memory layout of the engine's SendWR, SGE and Completion (field for
// field: the same offsets, sizes and kinds; TestSeamLayouts checks it),
// so a post or a completion is reinterpreted in place, not copied or
// converted field by field. The small enumerations (Opcode, Status,
// Access, ...) have the engine's values (TestSeamValues) and convert as
// integers.

// engineWRs returns wrs as the engine's work requests (the same memory).
func engineWRs(wrs []SendWR) []iwarp.SendWR {
	return unsafe.Slice((*iwarp.SendWR)(unsafe.Pointer(unsafe.SliceData(wrs))), len(wrs))
}

// engineWR returns wr as the engine's work request (the same memory).
func engineWR(wr *SendWR) *iwarp.SendWR { return (*iwarp.SendWR)(unsafe.Pointer(wr)) }

// engineSGL returns sgl as the engine's SGEs (the same memory).
func engineSGL(sgl []SGE) []iwarp.SGE {
	return unsafe.Slice((*iwarp.SGE)(unsafe.Pointer(unsafe.SliceData(sgl))), len(sgl))
}

// verbsSGL returns the engine's SGEs as the verbs' (the same memory).
func verbsSGL(sgl []iwarp.SGE) []SGE {
	return unsafe.Slice((*SGE)(unsafe.Pointer(unsafe.SliceData(sgl))), len(sgl))
}

// engineWC returns wc as the engine's completion (the same memory).
func engineWC(wc *WC) *iwarp.Completion { return (*iwarp.Completion)(unsafe.Pointer(wc)) }

// verbsWC returns the engine's completion as the verbs' (the same memory).
func verbsWC(c *iwarp.Completion) *WC { return (*WC)(unsafe.Pointer(c)) }

// engineErr gives an error of the engine the verbs' error types: errors.As
// finds a *RejectedError or *TerminateError in it where the engine's chain
// has its own. The message and errors.Is (ErrRejected, ErrTerminated, ...)
// are the engine's. Errors without either type come back as they are.
func engineErr(err error) error {
	if !carriesEngineType(err) {
		return err
	}
	return &engineError{err: err}
}

// carriesEngineType reports whether err's chain has a *RejectedError or
// *TerminateError of the engine. It allocates nothing (errors.As would
// move its targets to the heap): every QP event with an error takes this
// path.
func carriesEngineType(err error) bool {
	for err != nil {
		switch e := err.(type) {
		case *iwarp.RejectedError, *iwarp.TerminateError:
			return true
		case interface{ Unwrap() []error }:
			for _, x := range e.Unwrap() {
				if carriesEngineType(x) {
					return true
				}
			}
			return false
		}
		err = errors.Unwrap(err)
	}
	return false
}

// engineError wraps an engine error that carries a Reject or a Terminate
// (see engineErr).
type engineError struct{ err error }

func (e *engineError) Error() string { return e.err.Error() }
func (e *engineError) Unwrap() error { return e.err }

// As fills a **RejectedError or **TerminateError from the engine's error.
func (e *engineError) As(target any) bool {
	switch t := target.(type) {
	case **RejectedError:
		var rej *iwarp.RejectedError
		if !errors.As(e.err, &rej) {
			return false
		}
		*t = &RejectedError{PrivateData: rej.PrivateData, Markers: rej.Markers}
		return true
	case **TerminateError:
		var term *iwarp.TerminateError
		if !errors.As(e.err, &term) {
			return false
		}
		*t = &TerminateError{Code: verbsTermCode(term.Code), Received: term.Received}
		return true
	}
	return false
}

func verbsTermCode(c iwarp.TermCode) TermCode {
	return TermCode{Layer: TermLayer(c.Layer), EType: c.EType, Code: c.Code}
}

func (c TermCode) engine() iwarp.TermCode {
	return iwarp.TermCode{Layer: iwarp.Layer(c.Layer), EType: c.EType, Code: c.Code}
}
