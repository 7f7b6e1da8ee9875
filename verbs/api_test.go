package verbs_test

import (
	"encoding/json"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestAPIHasNoEngineTypes walks the exported API of the verbs and of
// verbs/service as the type checker sees it (its exported names, their types, the exported fields
// and methods of its types, the signatures of its functions) and fails on
// every type of package iwarp it reaches: the protocol engine stays behind
// the verbs, and an alias of one of its types would make go doc show the
// engine's type instead of the verbs'.
func TestAPIHasNoEngineTypes(t *testing.T) {
	if testing.Short() {
		t.Skip("loads the package's export data with go list")
	}
	const (
		self   = "github.com/rdmatap/rdmatap/verbs"
		engine = "github.com/rdmatap/rdmatap/iwarp"
	)
	for _, c := range []struct {
		path     string
		minTypes int // what the walk reaches at least
	}{{self, 20}, {self + "/service", 5}} {
		pkg := loadPackage(t, c.path)
		w := apiWalker{self: c.path, engine: engine, seen: map[types.Type]bool{}}
		scope := pkg.Scope()
		for _, name := range scope.Names() {
			obj := scope.Lookup(name)
			if !obj.Exported() {
				continue
			}
			if tn, ok := obj.(*types.TypeName); ok && tn.IsAlias() {
				w.check(name+" (alias)", types.Unalias(tn.Type()))
				continue
			}
			w.check(name, obj.Type())
		}
		for _, p := range w.bad {
			t.Errorf("%s: %s", pkg.Name(), p)
		}
		if len(w.seen) < c.minTypes {
			t.Fatalf("%s: walked %d types only: the walk is broken", c.path, len(w.seen))
		}
	}
}

// apiWalker collects the places where the exported API reaches the engine.
type apiWalker struct {
	self, engine string
	seen         map[types.Type]bool
	bad          []string
}

func (w *apiWalker) check(where string, t types.Type) {
	switch t := t.(type) {
	case *types.Alias:
		if o := t.Obj(); o.Pkg() != nil && o.Pkg().Path() == w.engine {
			w.bad = append(w.bad, where+": "+t.String())
			return
		}
		w.check(where, types.Unalias(t))
	case *types.Named:
		o := t.Obj()
		if o.Pkg() == nil {
			return
		}
		switch o.Pkg().Path() {
		case w.engine:
			w.bad = append(w.bad, where+": "+t.String())
			return
		case w.self:
		default:
			return // another package's type: its API is its own
		}
		if w.seen[t] {
			return
		}
		w.seen[t] = true
		w.check(o.Name(), t.Underlying())
		for m := range t.Methods() {
			if m.Exported() {
				w.check(o.Name()+"."+m.Name(), m.Type())
			}
		}
	case *types.Pointer:
		w.check(where, t.Elem())
	case *types.Slice:
		w.check(where, t.Elem())
	case *types.Array:
		w.check(where, t.Elem())
	case *types.Map:
		w.check(where, t.Key())
		w.check(where, t.Elem())
	case *types.Chan:
		w.check(where, t.Elem())
	case *types.Signature:
		for v := range t.Params().Variables() {
			w.check(where+" parameter", v.Type())
		}
		for v := range t.Results().Variables() {
			w.check(where+" result", v.Type())
		}
	case *types.Struct:
		for f := range t.Fields() {
			if f.Exported() {
				w.check(where+"."+f.Name(), f.Type())
			}
		}
	case *types.Interface:
		for m := range t.Methods() {
			if m.Exported() {
				w.check(where+"."+m.Name(), m.Type())
			}
		}
	}
}

// loadPackage type-checks the package at path from its export data,
// which go list builds.
func loadPackage(t *testing.T, path string) *types.Package {
	t.Helper()
	out, err := exec.Command("go", "list", "-export", "-deps", "-json=ImportPath,Export", path).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	exports := map[string]string{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p struct{ ImportPath, Export string }
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		exports[p.ImportPath] = p.Export
	}
	imp := importer.ForCompiler(token.NewFileSet(), "gc", func(p string) (io.ReadCloser, error) {
		return os.Open(exports[p])
	})
	pkg, err := imp.Import(path)
	if err != nil {
		t.Fatal(err)
	}
	return pkg
}
