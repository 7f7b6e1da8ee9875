package bridge

import (
	"testing"

	"github.com/rdmatap/rdmatap/iwarp"
)

// TestGet: Get returns the hooks Set was given with the same type
// arguments, and panics with any others.
func TestGet(t *testing.T) {
	type dev struct{ name string }
	Set(Hooks[*dev, int, int, int, int, int, string]{
		EngineQP: func(int) *iwarp.QP { return nil },
		EventHook: func(d *dev, h *func(string) bool, install bool) bool {
			return install && d.name == "rt0" && (*h)("ev")
		},
	})
	h := Get[*dev, int, int, int, int, int, string]()
	f := func(e string) bool { return e == "ev" }
	if !h.EventHook(&dev{"rt0"}, &f, true) || h.EventHook(&dev{"rt1"}, &f, true) || h.EngineQP == nil {
		t.Fatal("Get did not return the hooks Set was given")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Get with other type arguments did not panic")
		}
	}()
	Get[*dev, int, int, int, int, int, int]()
}
