package iwarp

import (
	"errors"
	"reflect"
	"testing"
)

// TestRebindKeys: a fast-register MR's registrations take the consumer's
// keys under its index; an immediate repeat, another index or a valid MR
// are refused; every key used is recorded in the index's history, so that
// no later registration of the index draws it; an old registration's STag
// finds nothing, and an access that looked it up before cannot start.
func TestRebindKeys(t *testing.T) {
	mem := NewMemTable()
	m, err := NewFastRegMR(mem, 7, 1)
	if err != nil {
		t.Fatal(err)
	}
	if m.Current().Valid() || mem.Lookup(m.STag()) != nil {
		t.Fatal("a new fast-register MR is valid")
	}
	buf := make([]byte, 4096)
	if err := m.MapPages([][]byte{buf}, 4096, 0, 4096); err != nil {
		t.Fatal(err)
	}
	idx := m.STag() >> 8
	reg := func(stag uint32) error {
		return (&QP{cfg: QPConfig{PD: 7, Mem: mem}}).fastReg(m, &SendWR{RKey: stag, Access: AccessRemoteRead})
	}
	if err := reg((idx+1)<<8 | 5); !errors.Is(err, ErrBadKey) {
		t.Fatalf("another index: %v", err)
	}
	if err := reg(idx<<8 | 5); err != nil {
		t.Fatal(err)
	}
	first := m.Current()
	if mem.Lookup(idx<<8|5) != first || first.Base != BufferAddr(buf) {
		t.Fatal("the registration is not in the table")
	}
	if err := reg(idx<<8 | 6); !errors.Is(err, ErrMemBusy) {
		t.Fatalf("registration of a valid MR: %v", err)
	}
	first.Invalidate()
	if err := reg(idx<<8 | 5); !errors.Is(err, ErrSameKey) {
		t.Fatalf("same key: %v", err)
	}
	if err := reg(idx<<8 | 6); err != nil {
		t.Fatal(err)
	}
	if mem.Lookup(idx<<8|5) != nil || first.acquire() {
		t.Fatal("the old registration is still reachable")
	}
	h := &mem.chunk(idx).keys[idx%memChunkSize]
	for _, k := range []uint32{5, 6} {
		if h.used[k/64]&(1<<(k%64)) == 0 {
			t.Fatalf("key %d not in the index's history", k)
		}
	}
	if !m.Release() || mem.Len() != 0 || m.Current().Valid() {
		t.Fatal("release")
	}
	if err := reg(idx<<8 | 7); !errors.Is(err, ErrMemFreed) {
		t.Fatalf("registration after release: %v", err)
	}
}

// TestWindowHoldsItsMR: a bound window counts in its MR, which then can
// be neither deregistered nor invalidated; once the window is invalid,
// both can.
func TestWindowHoldsItsMR(t *testing.T) {
	mem := NewMemTable()
	mr := &Region{Buf: make([]byte, 256), Access: AccessLocalWrite | AccessRemoteWrite | AccessMWBind, PD: 7}
	if _, err := mem.Register(mr); err != nil {
		t.Fatal(err)
	}
	w, err := NewWindow(mem, 7, MWType2)
	if err != nil {
		t.Fatal(err)
	}
	qp := &QP{cfg: QPConfig{PD: 7, Num: 0, Mem: mem}} // QP number 0 binds it too
	b := MWBind{MR: mr.STag(), Addr: 16, Length: 32, Access: AccessRemoteWrite | AccessZeroBased}
	if err := w.bind(qp, &b, incKey(w.STag())); err != nil {
		t.Fatal(err)
	}
	win := w.Current()
	if !win.Valid() || win.Base != 0 || len(win.Buf) != 32 || &win.Buf[0] != &mr.Buf[16] || !win.QPOnly {
		t.Fatalf("window %+v", win)
	}
	if win.Associated(7, 21) || !win.Associated(7, 0) || win.Associated(8, 0) {
		t.Fatal("a type 2 window is associated with its QP only")
	}
	if mem.DeregisterUnbound(mr) || mem.invalidateUnbound(mr) || !mr.Valid() {
		t.Fatal("an MR with a window bound went away")
	}
	win.Invalidate()
	win.Invalidate() // counted once
	if mr.windows.Load() != 0 || !mem.DeregisterUnbound(mr) {
		t.Fatal("the MR is still held")
	}
	// Bound to an MR that is gone: refused.
	if err := w.bind(qp, &b, incKey(w.STag())); !errors.Is(err, ErrNoParent) {
		t.Fatalf("bind to a deregistered MR: %v", err)
	}
}

// incKey returns stag with its key advanced by one (ibv_inc_rkey).
func incKey(stag uint32) uint32 { return stag&^0xff | (stag+1)&0xff }

// TestSendWQESet: a queued WR keeps every field of the posted one but its
// SGL and inline Data (the caller copies them) and its MR and window, which it names by
// memRef; the reference finds the object while it lives, and nothing once
// it was released, however its index is reused.
func TestSendWQESet(t *testing.T) {
	var wr SendWR
	v := reflect.ValueOf(&wr).Elem()
	var fill func(f reflect.Value, n uint64)
	fill = func(f reflect.Value, n uint64) {
		switch f.Kind() {
		case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			f.SetUint(n)
		case reflect.Int, reflect.Int64:
			f.SetInt(int64(n))
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Struct:
			for i := range f.NumField() {
				fill(f.Field(i), n*16+uint64(i)+1)
			}
		default:
			// A new field that holds a pointer: sendWQE.set must not
			// keep it (see memRef); decide how the WQE names it.
			t.Fatalf("SendWR field of kind %v: teach sendWQE.set about it", f.Kind())
		}
	}
	for i := range v.NumField() {
		switch v.Type().Field(i).Name {
		case "SGL", "MR", "MW", "Data":
			continue
		}
		fill(v.Field(i), uint64(i)+1)
	}
	mem := NewMemTable()
	m, err := NewFastRegMR(mem, 7, 1)
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWindow(mem, 7, MWType2)
	if err != nil {
		t.Fatal(err)
	}
	full := wr
	full.SGL, full.MR, full.MW = []SGE{{LKey: 1}}, m, w
	var e sendWQE
	e.set(&full)
	if !reflect.DeepEqual(e.wr, wr) {
		t.Fatalf("set kept\n%+v\nwant\n%+v", e.wr, wr)
	}
	if mem.owner(e.mr) != m || mem.owner(e.mw) != w {
		t.Fatal("the references do not find the MR and the window")
	}
	if mem.owner(e.mw) == any(m) || mem.owner(memRef{e.mr.idx, e.mw.serial}) != nil {
		t.Fatal("a reference found another object")
	}
	idx := m.idx
	if !m.Release() {
		t.Fatal("release refused")
	}
	if mem.owner(e.mr) != nil {
		t.Fatal("a released MR is still found")
	}
	// A later object under the same index is not the released one (the
	// free list made long enough for the index to leave quarantine).
	mem.mu.Lock()
	mem.free = make([]uint32, memQuarantine+1)
	for i := range mem.free {
		mem.free[i] = idx
	}
	mem.freeHead = 0
	mem.mu.Unlock()
	m2, err := NewFastRegMR(mem, 7, 1)
	if err != nil {
		t.Fatal(err)
	}
	if m2.idx != idx {
		t.Fatalf("index %d not reused (got %d)", idx, m2.idx)
	}
	if mem.owner(e.mr) != nil || mem.owner(m2.ref()) != m2 {
		t.Fatal("a reference to the released MR finds its index's next object")
	}
}
