package svc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/rdmatap/rdmatap/iwarp"
)

func TestBuilderRoundTrip(t *testing.T) {
	var b Builder
	m := b.Reset(TDial, 42, StatusRejected).Args(1, 2, 1<<63).String("10.0.0.1:7").Bytes([]byte{9, 8}).Msg()
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
	if m.Type() != TDial || m.Seq() != 42 || m.Status() != StatusRejected || m.NArgs() != 3 || m.Arg(2) != 1<<63 || m.Arg(3) != 0 {
		t.Fatalf("fields: %v %d %d %d %d", m.Type(), m.Seq(), m.Status(), m.NArgs(), m.Arg(2))
	}
	var f [3][]byte
	n, err := Fields(m.Payload(), f[:])
	if err != nil || n != 2 || string(f[0]) != "10.0.0.1:7" || !bytes.Equal(f[1], []byte{9, 8}) {
		t.Fatalf("fields %d %q %v", n, f[:n], err)
	}
	// Every corruption of the length is caught.
	for _, bad := range []Msg{m[:HeaderSize-1], m[:len(m)-1], append(append(Msg(nil), m...), 0)} {
		if bad.Check() == nil {
			t.Errorf("Check accepted a %d-byte message of %d", len(bad), len(m))
		}
	}
}

func TestRingEntries(t *testing.T) {
	mem := make([]byte, RingBytes(4, SendEntrySize(2)))
	r, err := InitRing(mem, 4, SendEntrySize(2))
	if err != nil {
		t.Fatal(err)
	}
	wr := iwarp.SendWR{ID: 7, Op: iwarp.WRWrite, Flags: iwarp.FlagSignaled, RemoteAddr: 1 << 40, RKey: 0x1234,
		SGL: []iwarp.SGE{{Addr: 100, Length: 200, LKey: 300}, {Addr: 400, Length: 500, LKey: 600}}}
	PutSend(r.Entry(5), &wr, 0)
	var got iwarp.SendWR
	if _, err := GetSend(r.Entry(1), &got, make([]iwarp.SGE, 2)); err != nil {
		t.Fatal(err)
	}
	if got.ID != 7 || got.Op != wr.Op || got.RemoteAddr != wr.RemoteAddr || len(got.SGL) != 2 || got.SGL[1] != wr.SGL[1] {
		t.Fatalf("got %+v", got)
	}
	// More SGEs than the QP allows, and an unknown opcode, are refused.
	if _, err := GetSend(r.Entry(1), &got, make([]iwarp.SGE, 1)); err == nil {
		t.Error("3 SGEs accepted with room for 1")
	}
	r.Entry(1)[8] = 0xee
	if _, err := GetSend(r.Entry(1), &got, make([]iwarp.SGE, 2)); err == nil {
		t.Error("opcode 0xee accepted from a ring")
	}
	// The memory registration operations carry their MR or window as a
	// handle, and their other fields in the data fields.
	reg := iwarp.SendWR{ID: 8, Op: iwarp.WRRegMR, Flags: iwarp.FlagSignaled | iwarp.FlagFence, RKey: 0x4501,
		Access: iwarp.AccessLocalWrite | iwarp.AccessRemoteWrite | iwarp.AccessZeroBased}
	PutSend(r.Entry(2), &reg, 77)
	if obj, err := GetSend(r.Entry(2), &got, make([]iwarp.SGE, 2)); err != nil || obj != 77 || got.Op != reg.Op ||
		got.RKey != reg.RKey || got.Access != reg.Access || got.Flags != reg.Flags || got.Imm != 0 || got.Swap != 0 {
		t.Fatalf("REG_MR: got %+v, handle %d, %v", got, obj, err)
	}
	bind := iwarp.SendWR{ID: 9, Op: iwarp.WRBindMW, RKey: 0x6602,
		Bind: iwarp.MWBind{MR: 0x3303, Addr: 1 << 33, Length: 4096, Access: iwarp.AccessRemoteRead}}
	PutSend(r.Entry(3), &bind, 78)
	if obj, err := GetSend(r.Entry(3), &got, make([]iwarp.SGE, 2)); err != nil || obj != 78 || got.Bind != bind.Bind ||
		got.RKey != bind.RKey || got.RemoteAddr != 0 || got.InvalidateRKey != 0 {
		t.Fatalf("BIND_MW: got %+v, handle %d, %v", got, obj, err)
	}
	for _, op := range []iwarp.WROp{iwarp.WRLocalInv, iwarp.WRReadInv} {
		inv := iwarp.SendWR{ID: 10, Op: op, InvalidateRKey: 0x7704, RemoteAddr: 5, RKey: 6}
		PutSend(r.Entry(0), &inv, 0)
		if obj, err := GetSend(r.Entry(0), &got, make([]iwarp.SGE, 2)); err != nil || obj != 0 || got.InvalidateRKey != 0x7704 ||
			got.RemoteAddr != 5 || got.RKey != 6 {
			t.Fatalf("%v: got %+v, %v", op, got, err)
		}
	}
	// An inline Send carries its payload in the entry; a length past the
	// entry, SGEs beside it or an opcode that sends no data are refused.
	im := make([]byte, SendEntrySizeInline(1, 64))
	send := iwarp.SendWR{ID: 11, Op: iwarp.WRSendImm, Flags: iwarp.FlagSignaled, Imm: 0xabcd}
	payload := bytes.Repeat([]byte("0123456789abcdef"), 4)
	PutSendData(im, &send, payload)
	if _, err := GetSend(im, &got, make([]iwarp.SGE, 1)); err != nil || !bytes.Equal(got.Data, payload) ||
		got.Flags != iwarp.FlagSignaled|iwarp.FlagInline || got.Imm != 0xabcd || len(got.SGL) != 0 || got.ID != 11 {
		t.Fatalf("inline data: got %+v, %v", got, err)
	}
	for name, spoil := range map[string]func(e []byte){
		"length past the entry": func(e []byte) { binary.LittleEndian.PutUint32(e[12:], uint32(len(e)-SendEntryBase+1)) },
		"an SGE beside":         func(e []byte) { binary.LittleEndian.PutUint16(e[10:], 1) },
		"an RDMA Read":          func(e []byte) { e[8] = byte(iwarp.WRRead) },
		"a REG_MR":              func(e []byte) { e[8] = byte(iwarp.WRRegMR) },
		"a length of 2^32-1":    func(e []byte) { binary.LittleEndian.PutUint32(e[12:], 1<<32-1) },
	} {
		e := bytes.Clone(im)
		spoil(e)
		if _, err := GetSend(e, &got, make([]iwarp.SGE, 1)); err == nil {
			t.Errorf("inline data with %s accepted: %+v", name, got)
		}
	}
	if n := SendEntrySizeInline(1, 100); n != SendEntryBase+112 {
		t.Errorf("entry of 1 SGE and 100 inline bytes: %d", n)
	}
	if n := SendEntrySizeInline(8, 64); n != SendEntrySize(8) {
		t.Errorf("entry of 8 SGEs and 64 inline bytes: %d", n)
	}
	// A producer index beyond the capacity is refused.
	r.Prod.Store(5)
	if _, err := r.Pending(0); err == nil {
		t.Error("5 pending in a ring of 4 accepted")
	}
	if n, err := r.Pending(1); err != nil || n != 4 {
		t.Errorf("pending %d, %v", n, err)
	}
}

// FuzzMsg: Check never panics, and what it accepts can be read in full.
func FuzzMsg(f *testing.F) {
	var b Builder
	f.Add([]byte(b.Reset(THello, 0, 0).Args(Magic, Version).Msg()))
	f.Add([]byte(b.Reset(TRegMR, 3, 0).Args(1, 2, 3, 4, 5).Msg()))
	f.Add([]byte(b.Reset(TDial, 9, 0).Args(16, 0, 0, 0, 0, 0, 0, 0).String("10.0.0.2:1").Bytes([]byte("pd")).Msg()))
	f.Add([]byte(b.Reset(TRegMR, 4, 0).Args(1, 0x10000, 4096, 7, 0, 0x5000).Msg()))
	f.Add([]byte(b.Reset(TAllocMR, 5, 0).Args(1, 16).Msg()))
	f.Add([]byte(b.Reset(TMapMR, 6, 0).Args(2, MapPages|MapFirst|MapLast, 4096, 16, 8192, 1).Bytes(make([]byte, MapEntrySize)).Msg()))
	f.Add([]byte(b.Reset(TMapMR, 7, 0).Args(2, MapSG|MapFirst|MapLast, 4096, 0, 0, 1).Bytes(make([]byte, MapEntrySize)).Msg()))
	f.Add([]byte(b.Reset(TSetIOVA, 8, 0).Args(2, 1<<40).Msg()))
	f.Add([]byte(b.Reset(TAllocMW, 9, 0).Args(1, 2).Msg()))
	f.Add([]byte(b.Reset(TBindMW, 10, 0).Args(3, 4, 11, 1, 0x100, 0x10000, 4096, 2).Msg()))
	f.Add([]byte(b.Reset(TQueryMem, 11, 0).Args(4).Msg()))
	f.Add([]byte(b.Reset(TDeallocMW, 12, 0).Args(4).Msg()))
	f.Add([]byte(b.Reset(TStats, 13, 0).Msg()))
	f.Fuzz(func(t *testing.T, data []byte) {
		m := Msg(data)
		if m.Check() != nil {
			return
		}
		for i := -1; i <= m.NArgs()+1; i++ {
			m.Arg(i)
		}
		var fs [4][]byte
		Fields(m.Payload(), fs[:])
		_ = m.Type().String()
		// Rebuilding it gives the same bytes.
		var w Builder
		w.Reset(m.Type(), m.Seq(), m.Status())
		for i := 0; i < m.NArgs(); i++ {
			w.Args(m.Arg(i))
		}
		w.pay = append(w.pay, m.Payload()...)
		if got := w.Msg(); !bytes.Equal(got, m) {
			t.Fatalf("rebuilt %x, was %x", []byte(got), data)
		}
	})
}

// FuzzRingEntry: hostile ring entries decode or are refused, never panic,
// and a decoded entry's SGL fits the QP's SGE limit.
func FuzzRingEntry(f *testing.F) {
	for i, wr := range []iwarp.SendWR{
		{ID: 1, Op: iwarp.WRSend, SGL: []iwarp.SGE{{Addr: 1, Length: 2, LKey: 3}}},
		{ID: 2, Op: iwarp.WRRegMR, RKey: 0x101, Access: iwarp.AccessLocalWrite},
		{ID: 3, Op: iwarp.WRBindMW, RKey: 0x202, Bind: iwarp.MWBind{MR: 0x303, Addr: 1, Length: 2, Access: iwarp.AccessRemoteRead}},
		{ID: 4, Op: iwarp.WRLocalInv, InvalidateRKey: 0x404},
		{ID: 5, Op: iwarp.WRReadInv, SGL: []iwarp.SGE{{Addr: 1, Length: 2, LKey: 3}}, RemoteAddr: 4, RKey: 5, InvalidateRKey: 0x505},
	} {
		e := make([]byte, SendEntrySize(2))
		PutSend(e, &wr, uint64(i))
		f.Add(e)
	}
	for _, n := range []int{0, 1, 40, 48} {
		e := make([]byte, SendEntrySizeInline(2, 48))
		PutSendData(e, &iwarp.SendWR{ID: 6, Op: iwarp.WRWrite, RemoteAddr: 7, RKey: 8}, bytes.Repeat([]byte{9}, n))
		f.Add(e)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		sgl := make([]iwarp.SGE, 2)
		var wr iwarp.SendWR
		if obj, err := GetSend(data, &wr, sgl); err == nil && len(wr.SGL) > 2 {
			t.Fatalf("%d SGEs", len(wr.SGL))
		} else if err == nil && obj != 0 && wr.Op != iwarp.WRRegMR && wr.Op != iwarp.WRBindMW {
			t.Fatalf("%v with an object handle", wr.Op)
		} else if err == nil && wr.Data != nil && (len(wr.SGL) != 0 || len(wr.Data) > len(data)-SendEntryBase ||
			wr.Flags&iwarp.FlagInline == 0 || wr.Flags&FlagInlineData != 0 || !InlineDataOp(wr.Op)) {
			t.Fatalf("inline data of %d bytes in an entry of %d: %+v", len(wr.Data), len(data), wr)
		}
		if _, s, err := GetRecv(data, sgl); err == nil && len(s) > 2 {
			t.Fatalf("%d SGEs", len(s))
		}
		if len(data) >= CQEntrySize {
			var c iwarp.Completion
			GetCompletion(data, &c)
		}
	})
}

// FuzzLocalAddr: LISTEN's and DIAL's local address decodes or is refused
// with ErrAddr, never panics, and what decodes formats back to an
// address that decodes the same.
func FuzzLocalAddr(f *testing.F) {
	for _, s := range []string{"", ":0", ":31337", ":65536", ":-1", "10.0.0.1:80", "[::1]:5", "[fe80::1%eth0]:1", "1.2.3.4", ":", "a:b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseLocalAddr(s)
		if err != nil {
			if !errors.Is(err, ErrAddr) {
				t.Fatalf("%q: %v is not ErrAddr", s, err)
			}
			return
		}
		b, err := ParseLocalAddr(FormatLocalAddr(a))
		if err != nil || b != a {
			t.Fatalf("%q: %v formats as %q, which reads %v, %v", s, a, FormatLocalAddr(a), b, err)
		}
	})
}
