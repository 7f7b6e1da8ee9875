package verbs

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/rdmatap/rdmatap/iwarp"
)

// TestSeamLayouts checks that the verbs' SendWR, SGE and WC have the
// memory layout of the engine's types they are reinterpreted as (seam.go):
// the same size and alignment, and field for field the same offset, size
// and kind, down through slices, arrays and nested structs. Pointer
// fields must point to the same type.
func TestSeamLayouts(t *testing.T) {
	for _, c := range []struct{ verbs, engine any }{
		{SendWR{}, iwarp.SendWR{}},
		{SGE{}, iwarp.SGE{}},
		{WC{}, iwarp.Completion{}},
		{Histogram{}, iwarp.Histogram{}},
	} {
		v, e := reflect.TypeOf(c.verbs), reflect.TypeOf(c.engine)
		sameLayout(t, v.String(), v, e)
	}
}

func sameLayout(t *testing.T, where string, v, e reflect.Type) {
	t.Helper()
	if v.Size() != e.Size() || v.Align() != e.Align() || v.Kind() != e.Kind() {
		t.Errorf("%s: %v (%d bytes, align %d, %v) against the engine's %v (%d bytes, align %d, %v)",
			where, v, v.Size(), v.Align(), v.Kind(), e, e.Size(), e.Align(), e.Kind())
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		if v.NumField() != e.NumField() {
			t.Errorf("%s: %d fields, the engine's %v has %d", where, v.NumField(), e, e.NumField())
			return
		}
		for i := range v.NumField() {
			fv, fe := v.Field(i), e.Field(i)
			w := where + "." + fv.Name
			if fv.Offset != fe.Offset {
				t.Errorf("%s: offset %d, the engine's %s is at %d", w, fv.Offset, fe.Name, fe.Offset)
			}
			sameLayout(t, w, fv.Type, fe.Type)
		}
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Array && v.Len() != e.Len() {
			t.Errorf("%s: %d elements, the engine's %d", where, v.Len(), e.Len())
		}
		sameLayout(t, where+"[]", v.Elem(), e.Elem())
	case reflect.Pointer, reflect.Map, reflect.Chan, reflect.Func, reflect.Interface:
		if v != e {
			t.Errorf("%s: %v, the engine's is %v", where, v, e)
		}
	}
}

// TestSeamValues checks that the verbs' enumerations have the engine's
// values, as the seam converts them as integers.
func TestSeamValues(t *testing.T) {
	type pair struct {
		name          string
		verbs, engine uint64
	}
	pairs := []pair{
		{"StatusSuccess", uint64(StatusSuccess), uint64(iwarp.StatusSuccess)},
		{"StatusLocalLength", uint64(StatusLocalLength), uint64(iwarp.StatusLocalLength)},
		{"StatusLocalQPOp", uint64(StatusLocalQPOp), uint64(iwarp.StatusLocalQPOp)},
		{"StatusLocalProtection", uint64(StatusLocalProtection), uint64(iwarp.StatusLocalProtection)},
		{"StatusWRFlush", uint64(StatusWRFlush), uint64(iwarp.StatusWRFlush)},
		{"StatusMWBind", uint64(StatusMWBind), uint64(iwarp.StatusMWBind)},
		{"StatusLocalAccess", uint64(StatusLocalAccess), uint64(iwarp.StatusLocalAccess)},
		{"StatusRemoteInvalidRequest", uint64(StatusRemoteInvalidRequest), uint64(iwarp.StatusRemoteInvalidRequest)},
		{"StatusRemoteAccess", uint64(StatusRemoteAccess), uint64(iwarp.StatusRemoteAccess)},
		{"StatusRemoteOperation", uint64(StatusRemoteOperation), uint64(iwarp.StatusRemoteOperation)},
		{"StatusFatal", uint64(StatusFatal), uint64(iwarp.StatusFatal)},
		{"StatusGeneral", uint64(StatusGeneral), uint64(iwarp.StatusGeneral)},
		{"WCSend", uint64(WCSend), uint64(iwarp.CompSend)},
		{"WCWrite", uint64(WCWrite), uint64(iwarp.CompWrite)},
		{"WCRead", uint64(WCRead), uint64(iwarp.CompRead)},
		{"WCCompSwap", uint64(WCCompSwap), uint64(iwarp.CompCmpSwap)},
		{"WCFetchAdd", uint64(WCFetchAdd), uint64(iwarp.CompFetchAdd)},
		{"WCBindMW", uint64(WCBindMW), uint64(iwarp.CompBindMW)},
		{"WCLocalInv", uint64(WCLocalInv), uint64(iwarp.CompLocalInv)},
		{"WCRegMR", uint64(WCRegMR), uint64(iwarp.CompRegMR)},
		{"WCRecv", uint64(WCRecv), uint64(iwarp.CompRecv)},
		{"WCRecvRDMAWithImm", uint64(WCRecvRDMAWithImm), uint64(iwarp.CompRecvRDMAWithImm)},
		{"WCWithInvalidate", uint64(WCWithInvalidate), uint64(iwarp.CompWithInvalidate)},
		{"WCSolicited", uint64(WCSolicited), uint64(iwarp.CompSolicited)},
		{"WCWithImm", uint64(WCWithImm), uint64(iwarp.CompWithImm)},
		{"OpSend", uint64(OpSend), uint64(iwarp.WRSend)},
		{"OpSendInvalidate", uint64(OpSendInvalidate), uint64(iwarp.WRSendInvalidate)},
		{"OpWrite", uint64(OpWrite), uint64(iwarp.WRWrite)},
		{"OpRead", uint64(OpRead), uint64(iwarp.WRRead)},
		{"OpWriteImm", uint64(OpWriteImm), uint64(iwarp.WRWriteImm)},
		{"OpSendImm", uint64(OpSendImm), uint64(iwarp.WRSendImm)},
		{"OpAtomicCmpSwap", uint64(OpAtomicCmpSwap), uint64(iwarp.WRAtomicCmpSwap)},
		{"OpAtomicFetchAdd", uint64(OpAtomicFetchAdd), uint64(iwarp.WRAtomicFetchAdd)},
		{"OpLocalInv", uint64(OpLocalInv), uint64(iwarp.WRLocalInv)},
		{"OpRegMR", uint64(OpRegMR), uint64(iwarp.WRRegMR)},
		{"OpBindMW", uint64(OpBindMW), uint64(iwarp.WRBindMW)},
		{"OpReadInv", uint64(OpReadInv), uint64(iwarp.WRReadInv)},
		{"Signaled", uint64(Signaled), uint64(iwarp.FlagSignaled)},
		{"Inline", uint64(Inline), uint64(iwarp.FlagInline)},
		{"Solicited", uint64(Solicited), uint64(iwarp.FlagSolicited)},
		{"Fence", uint64(Fence), uint64(iwarp.FlagFence)},
		{"QPIdle", uint64(QPIdle), uint64(iwarp.StateIdle)},
		{"QPRTS", uint64(QPRTS), uint64(iwarp.StateRTS)},
		{"QPClosing", uint64(QPClosing), uint64(iwarp.StateClosing)},
		{"QPTerminate", uint64(QPTerminate), uint64(iwarp.StateTerminate)},
		{"QPError", uint64(QPError), uint64(iwarp.StateError)},
		{"AccessLocalWrite", uint64(AccessLocalWrite), uint64(iwarp.AccessLocalWrite)},
		{"AccessRemoteWrite", uint64(AccessRemoteWrite), uint64(iwarp.AccessRemoteWrite)},
		{"AccessRemoteRead", uint64(AccessRemoteRead), uint64(iwarp.AccessRemoteRead)},
		{"AccessRemoteAtomic", uint64(AccessRemoteAtomic), uint64(iwarp.AccessRemoteAtomic)},
		{"AccessMWBind", uint64(AccessMWBind), uint64(iwarp.AccessMWBind)},
		{"AccessZeroBased", uint64(AccessZeroBased), uint64(iwarp.AccessZeroBased)},
		{"MWType1", uint64(MWType1), uint64(iwarp.MWType1)},
		{"MWType2", uint64(MWType2), uint64(iwarp.MWType2)},
		{"RTRSend", uint64(RTRSend), uint64(iwarp.RTRSend)},
		{"RTRWrite", uint64(RTRWrite), uint64(iwarp.RTRWrite)},
		{"RTRRead", uint64(RTRRead), uint64(iwarp.RTRRead)},
		{"PlacementStream", uint64(PlacementStream), uint64(iwarp.PlacementStream)},
		{"PlacementSegment", uint64(PlacementSegment), uint64(iwarp.PlacementSegment)},
		{"TermRDMAP", uint64(TermRDMAP), uint64(iwarp.LayerRDMAP)},
		{"TermDDP", uint64(TermDDP), uint64(iwarp.LayerDDP)},
		{"TermLLP", uint64(TermLLP), uint64(iwarp.LayerLLP)},
		{"RDMAPWrite", uint64(RDMAPWrite), uint64(iwarp.OpWrite)},
		{"RDMAPReadRequest", uint64(RDMAPReadRequest), uint64(iwarp.OpReadRequest)},
		{"RDMAPReadResponse", uint64(RDMAPReadResponse), uint64(iwarp.OpReadResponse)},
		{"RDMAPSend", uint64(RDMAPSend), uint64(iwarp.OpSend)},
		{"RDMAPSendInvalidate", uint64(RDMAPSendInvalidate), uint64(iwarp.OpSendInvalidate)},
		{"RDMAPSendSE", uint64(RDMAPSendSE), uint64(iwarp.OpSendSE)},
		{"RDMAPSendSEInvalidate", uint64(RDMAPSendSEInvalidate), uint64(iwarp.OpSendSEInval)},
		{"RDMAPTerminate", uint64(RDMAPTerminate), uint64(iwarp.OpTerminate)},
		{"RDMAPImmediate", uint64(RDMAPImmediate), uint64(iwarp.OpImmediate)},
		{"RDMAPImmediateSE", uint64(RDMAPImmediateSE), uint64(iwarp.OpImmediateSE)},
		{"RDMAPAtomicRequest", uint64(RDMAPAtomicRequest), uint64(iwarp.OpAtomicRequest)},
		{"RDMAPAtomicResponse", uint64(RDMAPAtomicResponse), uint64(iwarp.OpAtomicResp)},
	}
	for _, p := range pairs {
		if p.verbs != p.engine {
			t.Errorf("%s is %d, the engine's %d", p.name, p.verbs, p.engine)
		}
	}
	var ops Stats
	if len(ops.RxOps) != len(iwarp.Stats{}.RxOps) {
		t.Errorf("Stats.RxOps has %d opcodes, the engine counts %d", len(ops.RxOps), len(iwarp.Stats{}.RxOps))
	}
}

// TestSeamErrors checks that errors.As finds the verbs' error types in
// the engine's errors, and that errors.Is and the message stay the
// engine's.
func TestSeamErrors(t *testing.T) {
	code := iwarp.TermCode{Layer: iwarp.LayerDDP, EType: iwarp.ETypeTaggedBuffer, Code: iwarp.CodeDDPInvalidSTag}
	err := engineErr(fmt.Errorf("context: %w", &iwarp.TerminateError{Code: code, Received: true}))
	var te *TerminateError
	if !errors.As(err, &te) || te.Code != verbsTermCode(code) || !te.Received {
		t.Fatalf("errors.As(%v) = %+v", err, te)
	}
	if !errors.Is(err, ErrTerminated) || !strings.HasPrefix(err.Error(), "context: ") || te.Error() != (&iwarp.TerminateError{Code: code, Received: true}).Error() {
		t.Fatalf("%v: errors.Is ErrTerminated %v; %q", err, errors.Is(err, ErrTerminated), te.Error())
	}
	var rej *RejectedError
	if errors.As(err, &rej) {
		t.Fatalf("errors.As(%v) found a RejectedError", err)
	}
	err = engineErr(fmt.Errorf("connect: %w", &iwarp.RejectedError{PrivateData: []byte("no"), Markers: true}))
	if !errors.As(err, &rej) || string(rej.PrivateData) != "no" || !rej.Markers {
		t.Fatalf("errors.As(%v) = %+v", err, rej)
	}
	if !errors.Is(err, ErrRejected) || !errors.Is(err, ErrMarkers) || !errors.Is(rej, ErrMarkers) {
		t.Fatalf("%v does not match ErrRejected and ErrMarkers", err)
	}
	joined := engineErr(errors.Join(errors.New("first"), &iwarp.TerminateError{Code: code}))
	if !errors.As(joined, &te) || te.Code != verbsTermCode(code) || te.Received {
		t.Fatalf("errors.As(%v) = %+v", joined, te)
	}
	plain := errors.New("plain")
	if n := testing.AllocsPerRun(10, func() { engineErr(plain) }); n != 0 {
		t.Fatalf("engineErr of an error without a Reject or Terminate: %.0f allocations", n)
	}
	if engineErr(plain) != plain || engineErr(nil) != nil {
		t.Fatal("engineErr changed an error without a Reject or Terminate")
	}
}
