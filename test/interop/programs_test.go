package interop

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"
)

// TestSiwPrograms runs Debian's RDMA programs, unmodified, on both ends:
// in the VM on siw, and on the host as the user nobody through `rdmatap
// exec` (rdmatap's libibverbs and librdmacm) on the device a running
// `rdmatap up --socket` serves on the harness's TAP. Each program runs
// twice, siw serving and rdmatap serving. One boot of siw's default build
// runs the cells one after another (guest/plan.sh), a second boot, of its
// peer-to-peer build, the two whose server speaks first again
// (progCell.variants).
// A cell passes when both sides exit 0 and the
// program's own report holds: rping's data byte for byte on both sides,
// a perftest result row, ucmatose's and rdma_server's completion lines,
// qperf's figures.
func TestSiwPrograms(t *testing.T) {
	e := setup(t)
	run := e.programService(t)
	cells, skipped := programCells()
	if only := os.Getenv("RDMATAP_INTEROP_PROGRAMS"); only != "" {
		// Only the cells whose names begin with one of the words.
		var some []progCell
		for _, c := range cells {
			for _, w := range strings.Split(only, ",") {
				if w = strings.TrimSpace(w); w != "" && strings.HasPrefix(c.name, w) {
					some = append(some, c)
					break
				}
			}
		}
		cells = some
	}
	for _, s := range skipped {
		t.Logf("skipped: %s", s)
	}
	if len(cells) == 0 {
		t.Skip("skipping: none of the programs is installed (rdmacm-utils, perftest, qperf)")
	}
	e.holdFirstSYNs(t)
	if cellsUse(cells, "qperf") {
		e.divertQperfControl(t)
	}
	start := time.Now()
	var rows [][3]string
	var info []byte
	boots := 0
	for _, variant := range []string{"fix", "p2p_fix"} {
		var some []progCell
		for _, c := range cells {
			if slices.Contains(c.variants(), variant) {
				some = append(some, c)
			}
		}
		if len(some) == 0 {
			continue
		}
		boots++
		t.Run(variant, func(t *testing.T) {
			out := run.boot(t, variant, some, &rows)
			if variant == "fix" {
				info, _ = os.ReadFile(filepath.Join(out, "info.txt"))
			}
		})
	}
	// siw has no RFC 7306 atomics: perftest's atomic programs cannot pass
	// against it, whichever side serves.
	switch m := regexp.MustCompile(`atomic_cap:\s*(\S+)`).FindSubmatch(info); {
	case info == nil:
		// No boot of the default build.
	case m == nil:
		t.Errorf("no atomic_cap in the VM's ibv_devinfo -v (info.txt)")
	case string(m[1]) == "ATOMIC_NONE":
		for _, p := range []string{"ib_atomic_bw", "ib_atomic_lat"} {
			rows = append(rows, [3]string{p + " -R", "both", "skipped: siw reports atomic_cap ATOMIC_NONE"})
		}
	default:
		t.Errorf("siw reports atomic_cap %s: perftest's atomic programs belong in the plan", m[1])
	}
	run.svc.checkNobody(t)
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "program\troles\tresult")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r[0], r[1], r[2])
	}
	tw.Flush()
	for _, s := range skipped {
		fmt.Fprintf(&b, "skipped: %s\n", s)
	}
	t.Logf("Debian's programs, siw ↔ rdmatap through the service (%d boots, %s):\n%s", boots, time.Since(start).Round(time.Second), b.String())
}

// programService starts the service Debian's programs run on, as
// nobody through `rdmatap exec`, and builds its C libraries once, before
// any program starts; it skips without setpriv or a C compiler.
func (e *env) programService(t *testing.T) *programRun {
	t.Helper()
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("skipping: setpriv (util-linux) is missing")
	}
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skip("skipping: no C compiler (cc) to build rdmatap's libibverbs and librdmacm")
	}
	svc := e.startService(t)
	cache := filepath.Join(svc.dir, "capi")
	os.Mkdir(cache, 0o755)
	if out, err := exec.Command(e.bin, "env", "--via", svc.sock, "--cache", cache).CombinedOutput(); err != nil {
		t.Fatalf("rdmatap env (building the libraries): %v\n%s", err, out)
	}
	return &programRun{e: e, svc: svc, cache: cache, setpriv: setpriv}
}

// boot runs cells in one boot of the siw build variant and adds a row a
// cell to rows; it returns the boot's results directory.
func (r *programRun) boot(t *testing.T, variant string, cells []progCell, rows *[][3]string) string {
	e := r.e
	out := outDir(t)
	if os.Getenv("RDMATAP_INTEROP_PCAP") != "" {
		os.WriteFile(filepath.Join(out, "pcap"), nil, 0o644) // guest/plan.sh captures each cell
	}
	if cellsUse(cells, "qperf") {
		// The guest has no qperf: it runs the host's (the same Debian
		// release and rdma-core) from the share.
		path, _ := exec.LookPath("qperf")
		if data, err := os.ReadFile(path); err != nil || os.WriteFile(filepath.Join(out, "qperf"), data, 0o755) != nil {
			t.Fatalf("copying qperf into the VM's share: %v", err)
		}
	}
	// stderr split: rping buffers its standard output, which would
	// otherwise be cut by its own messages on standard error.
	plan := strings.Builder{}
	plan.WriteString("stderr split\n")
	plan.WriteString(r.guest)
	port := 0
	for _, c := range cells {
		if c.vmServes {
			if c.port != port {
				fmt.Fprintf(&plan, "port %d\n", c.port)
				port = c.port
			}
		} else {
			fmt.Fprintf(&plan, "await %s 180\n", c.name)
		}
		fmt.Fprintf(&plan, "%s %s 120 %s\n", c.vmKind, c.name, strings.Join(c.vm, " "))
	}
	plan.WriteString(r.guestAfter)
	if err := os.WriteFile(filepath.Join(out, "plan.txt"), []byte(plan.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	script, err := filepath.Abs("guest/plan.sh")
	if err != nil {
		t.Fatal(err)
	}
	v := e.bootVMIn(t, out, variant, 4096, "--script", script, "script")
	run := &programRun{e: e, svc: r.svc, cache: r.cache, setpriv: r.setpriv, v: v, out: out}
	hostOut := make([]string, len(cells))
	hostStderr := make([]string, len(cells))
	hostErr := make([]error, len(cells))
	for i, c := range cells {
		hostOut[i], hostStderr[i], hostErr[i] = run.cell(t, c)
		os.WriteFile(filepath.Join(out, c.name+".host.log"), []byte(hostOut[i]), 0o644)
		os.WriteFile(filepath.Join(out, c.name+".host.err"), []byte(hostStderr[i]), 0o644)
		if hostErr[i] != nil {
			t.Logf("%s: rdmatap's side: %v", c.name, hostErr[i])
		}
	}
	select {
	case <-v.done:
	case <-time.After(3 * time.Minute):
		t.Errorf("the VM did not power off: stopping it")
		v.killQemu()
		<-v.done
	}
	res := v.results()
	os.WriteFile(filepath.Join(out, "up.log"), []byte(r.svc.out.String()), 0o644)
	for _, n := range r.preCells {
		if res[n] != "PASS" {
			log, _ := os.ReadFile(filepath.Join(out, n+".log"))
			vmErr, _ := os.ReadFile(filepath.Join(out, n+".err"))
			t.Errorf("the guest's %s: %q\n%s\n%s", n, res[n], tail(log, 10), tail(vmErr, 10))
		}
	}
	for i, c := range cells {
		t.Run(c.name, func(t *testing.T) {
			log, _ := os.ReadFile(filepath.Join(out, c.name+".log"))
			vmErr, _ := os.ReadFile(filepath.Join(out, c.name+".err"))
			vmOut := string(log)
			both := func() string {
				return fmt.Sprintf("rdmatap's side:\n%s\n%s\nsiw's side:\n%s\n%s", tail([]byte(hostOut[i]), 20), tail([]byte(hostStderr[i]), 10),
					tail(log, 20), tail(vmErr, 10))
			}
			result := "pass"
			fail := func(f string, args ...any) {
				t.Errorf(f, args...)
				if result == "pass" {
					result = "FAIL (" + lastLine(fmt.Sprintf(f, args...)) + ")"
				}
			}
			if hostErr[i] != nil {
				fail("rdmatap's side (%s): %v\n%s", strings.Join(c.host, " "), hostErr[i], both())
			}
			if res[c.name] != "PASS" {
				fail("siw's side (%s): %q\n%s", strings.Join(c.vm, " "), res[c.name], both())
			}
			if hostErr[i] == nil && res[c.name] == "PASS" {
				if err := c.check(hostOut[i], vmOut); err != nil {
					fail("%v\n%s", err, both())
				}
			}
			label := c.label
			if variant != "fix" {
				label += " (siw " + variant + ")"
			}
			*rows = append(*rows, [3]string{label, c.roles(), result})
		})
	}
	return out
}

// progCell is one program run, siw's side in the VM and rdmatap's on the
// host.
type progCell struct {
	name     string // the plan's name: the program's short name and who serves
	label    string // the matrix's name of the program
	vmServes bool
	port     int      // the server's port
	vmKind   string   // the guest cell: server, daemon (siw serves); exec, client (siw connects)
	vm       []string // siw's command
	host     []string // rdmatap's command: program and arguments
	inNS     bool     // run rdmatap's side in the test's namespace (qperf's kernel TCP)
	check    func(host, vm string) error
}

// variants are the siw builds c runs against: the default (fix), and for
// a program whose server speaks first on a connection rdmatap accepts,
// also the build whose initiator sends an RFC 6581 RTR (p2p_fix).
// rdmatap's responder transmits before the initiator's first FPDU, as
// siw's does, so siw's default initiator, which sends none before its
// application does, hears ib_write_lat's and ucmatose's servers; the RTR
// of peer-to-peer mode, which a responder waits for, is the other path.
func (c progCell) variants() []string {
	if !c.vmServes && (c.host[0] == "ib_write_lat" || c.host[0] == "ucmatose") {
		return []string{"fix", "p2p_fix"}
	}
	return []string{"fix"}
}

func (c progCell) roles() string {
	if c.vmServes {
		return "siw server, rdmatap client"
	}
	return "rdmatap server, siw client"
}

func cellsUse(cells []progCell, prog string) bool {
	for _, c := range cells {
		if c.host[0] == prog {
			return true
		}
	}
	return false
}

const (
	rpingCount = 10
	rpingSize  = 1000
	qperfPort  = 19765 // qperf's control port (kernel TCP)
	// qperfTests are qperf's tests through rdma_cm, each for -t seconds:
	// the two whose QPs siw can create. Its others give one side's QP no
	// send queue (the siw kernel driver refuses it: "QP must have send
	// queue") or no receive queue (rdma-core 44's libsiw maps the RQ's 0
	// bytes, which fails), or use RDMA Write with Immediate
	// (rc_rdma_write_lat), which siw does not have.
	qperfTests = "rc_lat rc_bi_bw"
)

// programCells are the cells of the programs installed on the host (the
// guest has rdma-core's and perftest's; qperf, which it lacks, runs there
// from the host's copy in the share, out), and what was left out.
func programCells() (cells []progCell, skipped []string) {
	have := func(prog, pkg string) bool {
		if _, err := exec.LookPath(prog); err != nil {
			skipped = append(skipped, fmt.Sprintf("%s (not installed on the host; Debian package %s)", prog, pkg))
			return false
		}
		return true
	}
	both := func(short, label string, port int, vmServer, vmClient, hostServer, hostClient []string, check func(vmServes bool) func(host, vm string) error) {
		cells = append(cells,
			progCell{name: short + "-siw-serves", label: label, vmServes: true, port: port, vmKind: "server",
				vm: vmServer, host: hostClient, check: check(true)},
			progCell{name: short + "-rdmatap-serves", label: label, port: port, vmKind: "exec",
				vm: vmClient, host: hostServer, check: check(false)})
	}
	if have("rping", "rdmacm-utils") {
		args := []string{"-v", "-C", strconv.Itoa(rpingCount), "-S", strconv.Itoa(rpingSize)}
		both("rping", "rping -V", 7174,
			append([]string{"rping", "-s", "-a", vmIP}, args...), append([]string{"rping", "-c", "-V", "-a", ourIP}, args...),
			append([]string{"rping", "-s", "-a", ourIP}, args...), append([]string{"rping", "-c", "-V", "-a", vmIP}, args...),
			func(vmServes bool) func(host, vm string) error {
				return func(host, vm string) error {
					client, server := host, vm
					if !vmServes {
						client, server = vm, host
					}
					if err := checkPings("the client", client, "ping data: "); err != nil {
						return err
					}
					return checkPings("the server", server, "server ping data: ")
				}
			})
	}
	for _, p := range perftestTests {
		prog := "ib_" + p.name
		if !have(prog, "perftest") {
			continue
		}
		args := []string{"-R", "-F", "-s", "4096", "-n", "20"}
		siw := append([]string{prog, "-d", "siw0"}, args...)
		ours := append([]string{prog}, args...)
		both(p.name, prog+" -R", 18515, siw, append(siw, ourIP), ours, append(ours, vmIP),
			func(vmServes bool) func(host, vm string) error {
				return func(host, vm string) error {
					client, server := host, vm
					if !vmServes {
						client, server = vm, host
					}
					if n := len(resultRow.FindAllString(client, -1)); n != 1 {
						return fmt.Errorf("%s: the client printed %d result rows, want 1", prog, n)
					}
					if want := tableRows(false, p.name, 1); want >= 0 {
						if n := len(resultRow.FindAllString(server, -1)); n != want {
							return fmt.Errorf("%s: the server printed %d result rows, want %d", prog, n, want)
						}
					}
					return nil
				}
			})
	}
	// The guest's perftest tries its client again while the host's server
	// is not up yet; the others run once (rping -c hangs after a refused
	// connect), after the host said its server listens.
	for i := range cells {
		if strings.HasPrefix(cells[i].vm[0], "ib_") && !cells[i].vmServes {
			cells[i].vmKind = "client"
		}
	}
	if have("ucmatose", "rdmacm-utils") {
		args := []string{"-c", "2", "-C", "10", "-S", "1000"}
		both("ucmatose", "ucmatose", 7471,
			append([]string{"ucmatose", "-b", vmIP}, args...), append([]string{"ucmatose", "-s", ourIP}, args...),
			append([]string{"ucmatose", "-b", ourIP}, args...), append([]string{"ucmatose", "-s", vmIP}, args...),
			func(bool) func(host, vm string) error {
				return func(host, vm string) error {
					for _, o := range []string{host, vm} {
						if !strings.Contains(o, "data transfers complete") || !strings.Contains(o, "test complete") {
							return errors.New("ucmatose: a side did not complete its transfers")
						}
					}
					return nil
				}
			})
	}
	if have("rdma_server", "rdmacm-utils") && have("rdma_client", "rdmacm-utils") {
		both("rdma_server", "rdma_server, rdma_client", 7471,
			[]string{"rdma_server", "-p", "7471"}, []string{"rdma_client", "-s", ourIP, "-p", "7471"},
			[]string{"rdma_server", "-p", "7471"}, []string{"rdma_client", "-s", vmIP, "-p", "7471"},
			func(vmServes bool) func(host, vm string) error {
				return func(host, vm string) error {
					client, server := host, vm
					if !vmServes {
						client, server = vm, host
					}
					if !strings.Contains(server, "rdma_server: end 0") || !strings.Contains(client, "rdma_client: end 0") {
						return errors.New("no \"rdma_server: end 0\" and \"rdma_client: end 0\"")
					}
					return nil
				}
			})
	}
	if _, err := exec.LookPath("qperf"); err == nil {
		// The guest has no qperf: it runs the host's from the share.
		tests := strings.Fields(qperfTests)
		args := append([]string{"-cm1", "-cp1", "-t", "2"}, tests...)
		check := func(bool) func(host, vm string) error {
			return func(host, vm string) error { return checkQperf(host, vm, tests) }
		}
		both("qperf", "qperf -cm1 "+qperfTests, qperfPort,
			[]string{"/host/qperf"}, append([]string{"/host/qperf", ourIP}, args...),
			[]string{"qperf"}, append([]string{"qperf", vmIP}, args...), check)
		for i := range cells {
			if cells[i].host[0] == "qperf" {
				cells[i].inNS = true
				if cells[i].vmServes {
					cells[i].vmKind = "daemon"
				}
			}
		}
	} else {
		skipped = append(skipped, "qperf (not installed on the host; Debian package qperf)")
	}
	return cells, skipped
}

// checkPings checks rping's verbose lines with prefix: rpingCount of
// them, each ping's pattern byte for byte.
func checkPings(who, out, prefix string) error {
	var got []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			got = append(got, strings.TrimPrefix(l, prefix))
		}
	}
	if len(got) != rpingCount {
		return fmt.Errorf("rping: %s printed %d %q lines, want %d", who, len(got), prefix, rpingCount)
	}
	for i, g := range got {
		if want := rpingData(i, rpingSize); g != want {
			return fmt.Errorf("rping: %s, ping %d: got %q, want %q", who, i, g, want)
		}
	}
	return nil
}

// rpingData is what rping -c sends in ping i of size bytes: "rdma-ping-i: "
// and then letters from 'A' + i%58 on, cycling through the 58 from 'A' to
// 'z', the last byte a NUL.
func rpingData(i, size int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "rdma-ping-%d: ", i)
	for c := i % 58; b.Len() < size-1; c = (c + 1) % 58 {
		b.WriteByte(byte('A' + c))
	}
	return b.String()[:size-1]
}

// checkQperf wants each test's figure in the client's report, whichever
// side that is.
func checkQperf(host, vm string, tests []string) error {
	client := host
	if !strings.Contains(client, tests[0]+":") {
		client = vm
	}
	for _, name := range tests {
		want := "bw  ="
		if strings.HasSuffix(name, "_lat") {
			want = "latency  ="
		}
		i := strings.Index(client, name+":")
		if i < 0 || !strings.Contains(client[i:], want) {
			return fmt.Errorf("qperf %s: no %q in the client's report", name, want)
		}
	}
	return nil
}

// programRun runs rdmatap's side of the cells.
type programRun struct {
	e       *env
	svc     *service
	cache   string
	setpriv string
	v       *vm
	out     string
	// guest are plan lines the guest runs before the cells (exec
	// cells named in preCells, which must pass: an impairment of the
	// path).
	guest    string
	preCells []string
	// guestAfter are plan lines the guest runs after the cells.
	guestAfter string
}

// command is rdmatap's side of c: `rdmatap exec` on the service, the
// program as nobody.
func (r *programRun) command(ctx context.Context, c progCell) *exec.Cmd {
	path, _ := exec.LookPath(c.host[0])
	args := append([]string{r.e.bin, "exec", "--via", r.svc.sock, "--cache", r.cache, "--",
		r.setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", path}, c.host[1:]...)
	if c.inNS {
		args = append([]string{"ip", "netns", "exec", r.e.ns}, args...)
	}
	return exec.CommandContext(ctx, args[0], args[1:]...)
}

// cell runs rdmatap's side of c in step with the VM's and returns its
// standard output and error. When it fails, it tells the VM to stop its
// side (NAME.stop).
func (r *programRun) cell(t *testing.T, c progCell) (stdout, stderr string, err error) {
	t.Helper()
	done := regexp.MustCompile(`DONE ` + regexp.QuoteMeta(c.name) + `\b`)
	defer func() {
		if err != nil {
			os.WriteFile(filepath.Join(r.out, c.name+".stop"), nil, 0o644)
		}
		if !r.v.waitLine(done, 5*time.Minute) {
			t.Errorf("%s: the VM's side never finished:\n%s", c.name, tail(r.v.log.Bytes(), 30))
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	if c.vmServes && !r.v.waitLine(regexp.MustCompile(`READY `+regexp.QuoteMeta(c.name)+`\b`), 3*time.Minute) {
		return "", "", fmt.Errorf("the VM's server never listened:\n%s", tail(r.v.log.Bytes(), 30))
	}
	cmd := r.command(ctx, c)
	var out, errOut syncBuilder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		return "", "", err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if c.vmServes {
		err := <-exited
		if err == nil && c.vmKind == "daemon" {
			os.WriteFile(filepath.Join(r.out, c.name+".stop"), nil, 0o644)
		}
		return out.String(), errOut.String(), err
	}
	if err := r.waitListening(c, exited); err != nil {
		cancel()
		<-exited
		return out.String(), errOut.String(), err
	}
	os.WriteFile(filepath.Join(r.out, c.name+".go"), nil, 0o644)
	vmDone := make(chan struct{})
	go func() {
		if r.v.waitLine(done, 150*time.Second) {
			close(vmDone)
		}
	}()
	if c.host[0] == "qperf" {
		// qperf serves until it is stopped: once the VM's client is done.
		select {
		case <-vmDone:
		case <-ctx.Done():
		case err := <-exited:
			return out.String(), errOut.String(), fmt.Errorf("qperf's server ended while the VM's client ran: %v", err)
		}
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		return out.String(), errOut.String(), nil
	}
	select {
	case err := <-exited:
		return out.String(), errOut.String(), err
	case <-vmDone:
		// The VM's client has ended: the server has a little while to
		// see the disconnection.
		select {
		case err := <-exited:
			return out.String(), errOut.String(), err
		case <-time.After(20 * time.Second):
		}
	case <-ctx.Done():
	}
	cancel()
	<-exited
	return out.String(), errOut.String(), errors.New("the server did not exit")
}

// waitListening waits until rdmatap's server for c listens: a TCP
// connection from the namespace's kernel to its port on the service's
// address (which the service drops: it sends no MPA request), or for
// qperf the kernel's own listener in the namespace.
func (r *programRun) waitListening(c progCell, exited <-chan error) error {
	probe := fmt.Sprintf("exec 3<>/dev/tcp/%s/%d", ourIP, c.port)
	if c.host[0] == "qperf" {
		probe = fmt.Sprintf("ss -Hltn 'sport = :%d' | grep -q .", c.port)
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		if exec.Command("ip", "netns", "exec", r.e.ns, "bash", "-c", probe).Run() == nil {
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("the server ended before it listened: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("the server did not listen on port %d in 30 s", c.port)
}

// divertQperfControl lets the VM's qperf client reach the host's qperf
// server. qperf's control connection is kernel TCP to the same address
// its RDMA connection goes to, rdmatap's 10.77.0.3, whose frames the
// bridge hands to rdmatap's TAP. In the test's namespace, frames to
// 10.77.0.3's qperf port go up to the bridge's own stack instead (its
// MAC, packet type host) and are NATed there to the bridge's address,
// where the host's qperf listens; replies leave as from 10.77.0.3.
func (e *env) divertQperfControl(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("skipping: nft (Debian package nftables) is missing: qperf's control connection needs it")
	}
	mac := strings.TrimSpace(e.nsRun(t, "cat", "/sys/class/net/sibr0/address"))
	rules := fmt.Sprintf(`table bridge rdmatap_qperf {
	chain pre {
		type filter hook prerouting priority -300; policy accept;
		ip daddr %[1]s tcp dport %[2]d meta pkttype set host ether daddr set %[3]s
	}
}
table ip rdmatap_qperf {
	chain pre {
		type nat hook prerouting priority -100; policy accept;
		ip daddr %[1]s tcp dport %[2]d dnat to %[4]s
	}
}
`, ourIP, qperfPort, mac, "10.77.0.1")
	e.nft(t, rules)
}

// holdFirstSYNs gives siw's servers time to listen. Debian's perftest
// (4.5-0.17) client connects its test connection the moment the server's
// last message before it arrives, and the server only then starts
// listening: a client much faster than its server is refused (a TCP
// reset). perftest then tries again with the rdma_cm IDs it has just
// destroyed, from the array of them it has freed, and crashes in
// librdmacm, rdma-core's or rdmatap's alike. qperf's server on siw
// likewise resets a connection that arrives within milliseconds of the
// port message it sends once it listens. rdmatap on the host is that much
// faster than siw under qemu's TCG. So the bridge drops the first SYN of
// every connection from rdmatap to the VM (the set remembers the source
// address and port), and rdmatap's TCP sends it again after its
// retransmission timeout (1 s). Nothing else is touched.
func (e *env) holdFirstSYNs(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("skipping: nft (Debian package nftables) is missing")
	}
	rules := fmt.Sprintf(`table bridge rdmatap_first_syn {
	set seen {
		type ipv4_addr . inet_service
		flags dynamic, timeout
		timeout 60s
	}
	chain forward_syn {
		type filter hook forward priority 0; policy accept;
		ip saddr %[2]s ip daddr %[1]s tcp flags & (syn | ack) == syn ip saddr . tcp sport @seen accept
		ip saddr %[2]s ip daddr %[1]s tcp flags & (syn | ack) == syn add @seen { ip saddr . tcp sport } drop
	}
}
`, vmIP, ourIP)
	e.nft(t, rules)
}

// nft loads rules in the test's namespace.
func (e *env) nft(t *testing.T, rules string) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", e.ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v\n%s\n%s", err, out, rules)
	}
}
