package interop

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"
)

const (
	vmIP   = "10.77.0.2"
	ourIP  = "10.77.0.3"
	ourTap = "sitap0"
)

type env struct {
	harness string
	bin     string
	ns      string
	results []row
}

type row struct {
	peer, role, op, crc, mpa, result string
}

func setup(t *testing.T) *env {
	t.Helper()
	if os.Getenv("RDMATAP_INTEROP") == "" {
		t.Skip("skipping the siw interop matrix: set RDMATAP_INTEROP=1 (needs root and qemu-system-x86_64; builds the VM on first use, ~4 min, then ~6 min a run)")
	}
	if os.Geteuid() != 0 {
		t.Skip("skipping the siw interop matrix: needs root (TAP, bridge, network namespace)")
	}
	harness, err := filepath.Abs("siw-vm") // go test runs in test/interop
	if err != nil {
		t.Fatal(err)
	}
	if !exists(filepath.Join(harness, "boot.sh")) {
		t.Fatalf("the siw VM harness is missing: no %s", filepath.Join(harness, "boot.sh"))
	}
	e := &env{harness: harness, ns: fmt.Sprintf("rdsiw%d", os.Getpid()%100000)}
	// The harness installs qemu itself (build.sh); make sure it is built.
	if out, err := exec.Command("bash", filepath.Join(harness, "build.sh")).CombinedOutput(); err != nil {
		t.Fatalf("building the siw VM: %v\n%s", err, tail(out, 20))
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("skipping: qemu-system-x86_64 is missing")
	}
	dir := t.TempDir()
	e.bin = filepath.Join(dir, "rdmatap")
	if out, err := exec.Command("go", "build", "-o", e.bin, "../../cmd/rdmatap").CombinedOutput(); err != nil {
		t.Fatalf("building rdmatap: %v\n%s", err, out)
	}
	exec.Command("ip", "netns", "del", e.ns).Run()
	if out, err := exec.Command("ip", "netns", "add", e.ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	t.Cleanup(func() {
		exec.Command("ip", "netns", "exec", e.ns, "bash", filepath.Join(harness, "net.sh"), "down").Run()
		exec.Command("ip", "netns", "del", e.ns).Run()
	})
	e.nsRun(t, "ip", "link", "set", "lo", "up")
	e.nsRun(t, "bash", filepath.Join(harness, "net.sh"), "add-tap", ourTap)
	return e
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (e *env) nsRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", e.ns}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
	return string(out)
}

// vmDeaf reports whether the VM at ip answers none of three pings from
// the host's bridge address. The guest's kernel answers at once whatever
// siw or perftest do, so silence means its NIC has stopped transmitting
// (the harness trouble in README.md), which the guest's own TX watchdog
// does not always notice.
func (e *env) vmDeaf(ip string) bool {
	err := exec.Command("ip", "netns", "exec", e.ns, "ping", "-n", "-q", "-c", "3", "-i", "0.5", "-W", "2", ip).Run()
	var ee *exec.ExitError
	return errors.As(err, &ee) && ee.ExitCode() == 1 // 1: no reply; 2: ping itself failed
}

// stallLabel is what a failed cell's row gets when the VM is deaf
// after it: its NIC stopped transmitting (the harness's scenarios, unlike
// guest/plan.sh, do not reset it). A VM that has ended, or ends while it
// is pinged (its last cell), proves nothing.
func (e *env) stallLabel(t *testing.T, v *vm, cell string) string {
	if v.exited() || !e.vmDeaf(vmIP) || v.exited() {
		return ""
	}
	t.Errorf("%s: after it failed, the VM (%s) answered none of the host bridge's pings: its NIC stopped transmitting", cell, vmIP)
	return " [VM NIC TX stalled]"
}

// exited reports whether the VM has ended or is powering off (its
// console says so before qemu and then boot.sh exit).
func (v *vm) exited() bool {
	select {
	case <-v.done:
		return true
	default:
	}
	con, _ := os.ReadFile(filepath.Join(v.out, "console.log"))
	return bytes.Contains(con, []byte("SIWVM: powering off"))
}

// vm is a running boot.sh.
type vm struct {
	cmd  *exec.Cmd
	out  string // results dir
	done chan error
	log  bytes.Buffer
}

func (e *env) bootVM(t *testing.T, variant string, size int, args ...string) *vm {
	t.Helper()
	return e.bootVMIn(t, outDir(t), variant, size, args...)
}

// outDir is a results directory for one VM: under $RDMATAP_INTEROP_OUT
// when set (kept: logs, captures), else a temporary one.
func outDir(t *testing.T) string {
	t.Helper()
	base := os.Getenv("RDMATAP_INTEROP_OUT")
	if base == "" {
		return t.TempDir()
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := os.MkdirTemp(base, strings.NewReplacer("/", "-", " ", "_").Replace(t.Name())+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("VM results in %s", d)
	return d
}

// bootVMIn boots the VM with its results (and the host's share) in out,
// which may already hold files for the guest.
func (e *env) bootVMIn(t *testing.T, out, variant string, size int, args ...string) *vm {
	t.Helper()
	v := &vm{out: out, done: make(chan error, 1)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	full := append([]string{"netns", "exec", e.ns, "bash", filepath.Join(e.harness, "boot.sh"), "--no-build",
		"--variant", variant, "--size", strconv.Itoa(size), "--n", "20", "--wait", "120", "--out", v.out}, args...)
	v.cmd = exec.CommandContext(ctx, "ip", full...)
	v.cmd.Stdout, v.cmd.Stderr = &v.log, &v.log
	if err := v.cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	go func() { v.cmd.Wait(); cancel(); close(v.done) }() // closed: every waiter sees it
	t.Cleanup(func() {
		select {
		case <-v.done:
			return
		default:
		}
		// A VM still running would hold its TAP and address when the next
		// one boots: stop qemu itself (killing boot.sh's "ip netns exec"
		// would leave it running), then the harness, which deletes the TAP.
		v.killQemu()
		select {
		case <-v.done:
		case <-time.After(20 * time.Second):
			v.cmd.Process.Kill()
			<-v.done
		}
	})
	return v
}

// killQemu ends the VM's qemu, found by boot.sh's pidfile.
func (v *vm) killQemu() {
	b, err := os.ReadFile(filepath.Join(v.out, "qemu.pid"))
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return
	}
	if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.Contains(string(comm), "qemu") {
		syscall.Kill(pid, syscall.SIGTERM)
	}
}

// waitReady waits for the VM console line announcing the server for test.
func (v *vm) waitReady(t *testing.T, test string) bool {
	t.Helper()
	name := test // the console names perftest servers by binary: ib_write_bw
	if test != "rping" {
		name = "ib_" + test + "_bw"
	}
	re := regexp.MustCompile(`READY ` + regexp.QuoteMeta(name) + ` server`)
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(filepath.Join(v.out, "console.log")); err == nil && re.Match(b) {
			return true
		}
		select {
		case <-v.done:
			return false
		case <-time.After(200 * time.Millisecond):
		}
	}
	return false
}

func (v *vm) results() map[string]string {
	res := map[string]string{}
	f, err := os.Open(filepath.Join(v.out, "results.txt"))
	if err != nil {
		return res
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fs := strings.Fields(s.Text())
		if len(fs) >= 3 && fs[0] == "RESULT" {
			res[fs[1]] = fs[2]
		}
	}
	return res
}

// ours runs rdmatap in the namespace on sitap0, with the placement mode
// RDMATAP_INTEROP_PLACEMENT names (stream or segment; default: rdmatap's).
func (e *env) ours(ctx context.Context, args ...string) (string, error) {
	full := append([]string{"netns", "exec", e.ns, e.bin}, args...)
	full = append(full, "--tap", ourTap, "--addr", ourIP+"/24")
	if pl := os.Getenv("RDMATAP_INTEROP_PLACEMENT"); pl != "" {
		full = append(full, "--placement", pl)
	}
	out, err := exec.CommandContext(ctx, "ip", full...).CombinedOutput()
	return string(out), err
}

func variantFlags(variant string) (crc string, mpa string, extra []string) {
	switch {
	case strings.HasPrefix(variant, "crc"):
		return "on", "v2", []string{"--crc"}
	case strings.HasPrefix(variant, "p2p"):
		return "off", "v2 p2p", []string{"--p2p", "write"}
	}
	return "off", "v2", nil
}

// TestSiwInterop runs the matrix and prints the pass/fail table.
func TestSiwInterop(t *testing.T) {
	e := setup(t)
	// Every siw build with perftest's 4096-byte messages, and the default
	// build again with 64 KiB messages (multi-FPDU messages both ways).
	for _, c := range []struct {
		variant string
		size    int
	}{{"fix", 4096}, {"crc", 4096}, {"p2p", 4096}, {"stock", 4096}, {"fix", 65536}} {
		variant, size := c.variant, c.size
		sz := strconv.Itoa(size)
		crc, mpa, extra := variantFlags(variant)
		name := variant
		if size != 4096 {
			name += "-" + sz
		}
		t.Run(name+"/vm-server", func(t *testing.T) {
			v := e.bootVM(t, variant, size, "server", "rping", "write", "read", "send")
			for _, test := range []string{"rping", "write", "read", "send"} {
				r := row{peer: "siw (" + variant + ")", role: "rdmatap client", op: opLabel(test, sz), crc: crc, mpa: mpa, result: "FAIL"}
				if !v.waitReady(t, test) {
					r.result = "FAIL (VM server never ready)"
					e.results = append(e.results, r)
					t.Errorf("%s: VM server never ready:\n%s", test, tail(v.log.Bytes(), 30))
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				var out string
				var err error
				if test == "rping" {
					out, err = e.ours(ctx, append([]string{"ping", "-c", "-a", vmIP, "-C", "5", "-v", "-V"}, extra...)...)
				} else {
					out, err = e.ours(ctx, append([]string{"bw", test, vmIP, "-F", "-R", "-s", sz, "-n", "20"}, extra...)...)
				}
				cancel()
				if err == nil {
					r.result = "PASS"
				} else {
					t.Errorf("%s against siw %s: %v\n%s", test, variant, err, out)
					r.result += e.stallLabel(t, v, test)
				}
				e.results = append(e.results, r)
			}
			<-v.done
			for test, res := range v.results() {
				t.Logf("VM side %s: %s", test, res)
			}
		})
		t.Run(name+"/vm-client", func(t *testing.T) {
			v := e.bootVM(t, variant, size, "client", ourIP, "rping", "write", "read", "send")
			for _, test := range []string{"rping", "write", "read", "send"} {
				r := row{peer: "siw (" + variant + ")", role: "rdmatap server", op: opLabel(test, sz), crc: crc, mpa: mpa, result: "FAIL"}
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				var out string
				var err error
				if test == "rping" {
					out, err = e.ours(ctx, append([]string{"ping", "-s", "-a", ourIP, "-C", "5", "-v"}, extra...)...)
				} else {
					out, err = e.ours(ctx, append([]string{"bw", test, "-F", "-R", "-s", sz, "-n", "20"}, extra...)...)
				}
				cancel()
				if err == nil {
					r.result = "PASS"
				} else {
					t.Errorf("%s served to siw %s: %v\n%s", test, variant, err, out)
					r.result += e.stallLabel(t, v, test)
				}
				e.results = append(e.results, r)
			}
			select {
			case <-v.done:
			case <-time.After(3 * time.Minute):
			}
			res := v.results()
			for i := len(e.results) - 4; i < len(e.results); i++ {
				op := strings.Fields(e.results[i].op)[0]
				name := "client-" + op
				for k, val := range res {
					if strings.HasSuffix(k, op) && val != "PASS" && e.results[i].result == "PASS" {
						e.results[i].result = "FAIL (siw side " + val + ")"
						t.Errorf("%s: siw reports %s (%s)", name, val, k)
					}
				}
			}
		})
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "peer\trole\toperation\tCRC\tMPA\tresult")
	for _, r := range e.results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.peer, r.role, r.op, r.crc, r.mpa, r.result)
	}
	tw.Flush()
	t.Logf("siw interop matrix:\n%s", b.String())
	fmt.Print(b.String())
}

// opLabel names a matrix cell: rping always uses its own 64-byte default.
func opLabel(test, size string) string {
	if test == "rping" {
		return "rping"
	}
	return "ib_" + test + "_bw -s " + size
}
