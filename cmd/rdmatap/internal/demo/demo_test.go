package demo

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
)

func TestDemoVerifiesEveryOperation(t *testing.T) {
	for _, args := range [][]string{
		{"demo", "--size", "0", "--iters", "5"},
		{"demo", "--size", "1", "--iters", "50"},
		{"demo", "--size", "1M", "--iters", "20", "--crc"},
		{"demo", "--size", "4097", "--iters", "40", "--mpa-rev", "1"},
		{"demo", "--size", "64K", "--iters", "20", "--p2p", "read"},
	} {
		var out, errOut bytes.Buffer
		if code := cli.Run(args, &out, &errOut); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut.String())
		}
		for _, op := range []string{"SEND/RECV", "RDMA WRITE", "RDMA READ"} {
			re := regexp.MustCompile(regexp.QuoteMeta(op) + `\s+(\d+)\s+(\d+)\s+\S+\s+\S+\s+\S+\s+(\d+)/(\d+)`)
			m := re.FindStringSubmatch(out.String())
			if m == nil {
				t.Fatalf("%v: no %s row in\n%s", args, op, out.String())
			}
			if m[2] != m[3] || m[3] != m[4] {
				t.Fatalf("%v: %s verified %s of %s iterations", args, op, m[3], m[2])
			}
		}
	}
}

func TestDemoBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"demo", "--size", "-1"},
		{"demo", "--size", "2G"},
		{"demo", "--size", "lots"},
		{"demo", "--iters", "0"},
		{"demo", "--mpa-rev", "3"},
		{"demo", "--p2p", "sideways"},
		{"demo", "--mpa-rev", "1", "--p2p", "write"},
		{"demo", "--bogus"},
		{"demo", "extra"},
		{"frobnicate"},
		{},
	} {
		var out, errOut bytes.Buffer
		code := cli.Run(args, &out, &errOut)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
		lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
		if len(args) > 0 && args[0] == "demo" && len(lines) != 1 {
			t.Errorf("%v: want a one-line error, got %q", args, errOut.String())
		}
		if strings.Contains(errOut.String(), "goroutine") {
			t.Errorf("%v: stack trace in %q", args, errOut.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := cli.Run([]string{"demo", "--pcap", "/nonexistent-dir/x.pcap"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "nonexistent-dir") {
		t.Errorf("unwritable pcap: exit %d, %q", code, errOut.String())
	}
}

// TestDemoPcapDecodesInTshark: tshark's iWARP dissectors decode the capture
// with no malformed frame and a good CRC on every FPDU.
func TestDemoPcapDecodesInTshark(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed (.ci/run installs it): skipping the capture decode check")
	}
	path := filepath.Join(t.TempDir(), "demo.pcap")
	var out, errOut bytes.Buffer
	if code := cli.Run([]string{"demo", "--size", "5000", "--iters", "16", "--crc", "--pcap", path}, &out, &errOut); code != 0 {
		t.Fatalf("demo: %s", errOut.String())
	}
	m := regexp.MustCompile(`sent (\d+) FPDUs, received (\d+)`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no FPDU counts in %s", out.String())
	}
	sent, _ := strconv.Atoi(m[1])
	recv, _ := strconv.Atoi(m[2])
	// Frames sent again (the link's repair of a GSO packet it takes for
	// lost, as a loaded machine can make it do) carry FPDUs counted once
	// already: tshark's TCP analysis marks them, and they are left out.
	v, err := exec.Command(tshark, "-n", "--disable-heuristic", "rpcrdma_iwarp", "-r", path,
		"-Y", "!tcp.analysis.retransmission && !tcp.analysis.spurious_retransmission && !tcp.analysis.fast_retransmission",
		"-O", "iwarp_mpa,iwarp_ddp_rdmap", "-V").Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	text := string(v)
	if n := strings.Count(text, "Malformed"); n != 0 {
		t.Fatalf("%d malformed frames", n)
	}
	if n := strings.Count(strings.ToLower(text), "bad crc"); n != 0 {
		t.Fatalf("%d FPDUs with a bad CRC", n)
	}
	if good := strings.Count(text, "Good CRC32"); good != sent+recv {
		t.Fatalf("tshark found %d FPDUs with a good CRC, the endpoint counted %d", good, sent+recv)
	}
	for _, want := range []string{"Request frame header", "Reply frame header", "Read Request", "Read Response", "Send", "Write"} {
		if !strings.Contains(text, want) {
			t.Errorf("tshark output lacks %q", want)
		}
	}
}
