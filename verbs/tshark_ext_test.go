package verbs_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
)

// lockedBuffer is a bytes.Buffer the capture may write from the links'
// goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) Bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Clone(l.b.Bytes())
}

// TestExtensionsDecodeInTshark: RFC 7306 traffic on the wire, with the MPA
// CRC — FetchAdd, CmpSwap, their Atomic Responses, Write with Immediate,
// Send with Immediate, and the Terminate a misaligned atomic draws — decodes
// in tshark with no malformed frame: the atomics with the operands sent,
// the Terminate with the layer, type and code rdmatap reports.
func TestExtensionsDecodeInTshark(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not on PATH (.ci/run installs it): skipping the dissector check")
	}
	var capture lockedBuffer
	na, nb, err := netstack.NewPair(netstack.PairConfig{Link: testLink, PcapA: &capture})
	if err != nil {
		t.Fatal(err)
	}
	p := pairOn(t, na, nb, verbs.DeviceConfig{CRC: true}, verbs.DeviceConfig{CRC: true})
	cl, sv := connect(t, p, 4096, verbs.ConnParams{})
	target := atomicTarget(t, sv.pd, 64)
	postAtomic(t, cl, 1, verbs.OpAtomicFetchAdd, 0, target, 0, 0x1111, 0)
	mustOK(t, wait1(t, cl.scq), verbs.WCFetchAdd, 8)
	postAtomic(t, cl, 2, verbs.OpAtomicCmpSwap, 8, target, 0, 0x1111, 0x2222)
	mustOK(t, wait1(t, cl.scq), verbs.WCCompSwap, 8)
	for i, op := range []verbs.Opcode{verbs.OpWriteImm, verbs.OpSendImm} {
		if err := sv.qp.PostRecv(verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{sv.mr.SGE(0, 64)}}); err != nil {
			t.Fatal(err)
		}
		wr := verbs.SendWR{ID: uint64(10 + i), Op: op, Imm: 0xabcd0000 + uint32(i), SGL: []verbs.SGE{cl.mr.SGE(16, 32)}}
		if op == verbs.OpWriteImm {
			wr.RemoteAddr, wr.RKey = cl.remote.Addr+128, cl.remote.RKey
		}
		if err := cl.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		if wc := wait1(t, sv.rcq); wc.Status != verbs.StatusSuccess || wc.Imm != 0xabcd0000+uint32(i) {
			t.Fatalf("receive completion %+v", wc)
		}
	}
	// A misaligned target: the responder terminates the stream.
	postAtomic(t, cl, 3, verbs.OpAtomicFetchAdd, 0, target, 4, 1, 0)
	wc := wait1(t, cl.scq)
	if wc.Status == verbs.StatusSuccess {
		t.Fatal("a misaligned atomic succeeded")
	}
	<-cl.qp.Done()

	f := filepath.Join(t.TempDir(), "ext.pcap")
	if err := os.WriteFile(f, capture.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	tsh := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(tshark, append([]string{"-n", "-r", f}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("tshark %v: %v\n%s", args, err, stderr.Bytes())
		}
		return strings.TrimSpace(string(out))
	}
	if out := tsh("-Y", "_ws.malformed || _ws.expert.severity >= error"); out != "" {
		t.Fatalf("tshark reports malformed or erroneous frames:\n%s", out)
	}
	ops := tsh("-Y", "iwarp_rdma", "-T", "fields", "-e", "iwarp_rdma.opcode")
	for _, want := range []string{"0x0a", "0x0b", "0x08", "0x07"} {
		if !strings.Contains(ops, want) {
			t.Errorf("no RDMAP opcode %s in the capture; opcodes seen:\n%s", want, ops)
		}
	}
	adds := tsh("-Y", "iwarp_rdma.atomic.add_data", "-T", "fields", "-e", "iwarp_rdma.atomic.add_data")
	if !strings.Contains(adds, "4369") { // 0x1111
		t.Errorf("FetchAdd's add data not decoded: %q", adds)
	}
	swaps := tsh("-Y", "iwarp_rdma.atomic.swap_data", "-T", "fields", "-e", "iwarp_rdma.atomic.swap_data", "-e", "iwarp_rdma.atomic.compare_data")
	if swaps != "8738\t4369" { // 0x2222, 0x1111
		t.Errorf("CmpSwap's swap and compare data not decoded: %q", swaps)
	}
	term := tsh("-Y", "iwarp_rdma.term_layer", "-T", "fields", "-e", "iwarp_rdma.term_layer", "-e", "iwarp_rdma.term_etype_rdma", "-e", "iwarp_rdma.term_errcode_rdma")
	// RDMAP (0), Remote Operation (2), Unspecified (0xff): what
	// TestAtomicErrors asserts for a misaligned target.
	if fields := strings.Fields(term); len(fields) != 3 || fields[0] != "0x00" || fields[1] != "0x02" || fields[2] != "0xff" {
		t.Fatalf("the Terminate decodes as %q, want RDMAP / Remote Operation / Unspecified", term)
	}
}
