package capi_test

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/rdmatap/rdmatap/capi"
)

// ourSonames are the libraries the build makes in place of rdma-core's.
var ourSonames = []string{"libibverbs.so.1", "librdmacm.so.1", "libmlx5.so.1", "libefa.so.1"}

// debianPackages are the Debian (bookworm) packages whose programs,
// Python extension modules and libraries link rdma-core's libraries.
// libfabric-bin holds libfabric's programs (bookworm has no fabtests).
var debianPackages = []string{"ibverbs-utils", "rdmacm-utils", "perftest", "qperf", "python3-pyverbs", "libfabric1", "libfabric-bin"}

// rsockets are librdmacm's socket API over RDMA, which the build does not
// offer (rdmacm/librdmacm.map; rpoll only): the programs that need them
// (rdmacm-utils' rstream, riostream, rcopy, udpong) do not load, and
// TestDebianImportsResolve logs them rather than failing.
var rsockets = map[string]bool{}

func init() {
	for _, s := range strings.Fields(`rsocket rbind rlisten raccept rconnect rshutdown rclose rrecv rrecvfrom
		rrecvmsg rsend rsendto rsendmsg rread rreadv rwrite rwritev rpoll rselect rgetpeername rgetsockname
		rsetsockopt rgetsockopt rfcntl riomap riounmap riowrite`) {
		rsockets[s+"@RDMACM_1.0"] = true
	}
}

// TestDebianImportsResolve: every ELF file of the Debian packages above
// that loads one of the built libraries, directly or through another
// library (the packages' programs, libfabric.so.1, pyverbs' extension
// modules), finds under `ldd -r` with LD_LIBRARY_PATH at the build each
// of those libraries in the build and every symbol it imports at the
// version it imports. The files are linked BIND_NOW: one missing symbol
// and they do not load (Python's import of a pyverbs module fails). A
// package not installed is skipped, naming it. What `ldd -r` reports
// against the system's own libraries as well is logged, not failed: that
// is not the build's doing; so are the programs that need rsockets.
func TestDebianImportsResolve(t *testing.T) {
	if _, err := exec.LookPath("dpkg-query"); err != nil {
		t.Skip("skipping: not a Debian system (no dpkg-query)")
	}
	if _, err := exec.LookPath("ldd"); err != nil {
		t.Skip("skipping: no ldd")
	}
	dir := libs(t, false)
	for _, pkg := range debianPackages {
		t.Run(pkg, func(t *testing.T) {
			n := 0
			for _, f := range packageELFs(t, pkg) {
				if checkImports(t, dir, f) {
					n++
				}
			}
			if n == 0 {
				t.Fatalf("package %s holds no ELF file that loads %s", pkg, strings.Join(ourSonames, ", "))
			}
			t.Logf("%s: %d files checked", pkg, n)
		})
	}
}

// packageELFs lists the regular, dynamically linked ELF files of an
// installed package, or skips when it is not installed.
func packageELFs(t *testing.T, pkg string) []string {
	t.Helper()
	st, err := exec.Command("dpkg-query", "-W", "-f=${Status}", pkg).Output()
	if err != nil || !strings.HasSuffix(strings.TrimSpace(string(st)), " installed") {
		t.Skipf("skipping: Debian package %s not installed (apt-get install %s)", pkg, pkg)
	}
	out, err := exec.Command("dpkg-query", "-L", pkg).Output()
	if err != nil {
		t.Fatalf("dpkg-query -L %s: %v", pkg, err)
	}
	var files []string
	for _, p := range strings.Split(string(out), "\n") {
		if fi, err := os.Lstat(p); err != nil || !fi.Mode().IsRegular() {
			continue
		}
		f, err := elf.Open(p)
		if err != nil {
			continue // not ELF
		}
		needed, _ := f.ImportedLibraries()
		f.Close()
		if len(needed) > 0 {
			files = append(files, p)
		}
	}
	sort.Strings(files)
	return files
}

// lddProblems runs `ldd -r` on a file, with LD_LIBRARY_PATH at libdir
// unless it is empty, and returns its output and the lines that report a
// library, a version or a symbol not found.
func lddProblems(t *testing.T, file, libdir string) ([]byte, []string) {
	t.Helper()
	c := exec.Command("ldd", "-r", file)
	c.Env = os.Environ()
	if libdir != "" {
		c.Env = append(c.Env, "LD_LIBRARY_PATH="+libdir)
	}
	out, _ := c.CombinedOutput() // ldd exits non-zero on some problems; the lines say which
	var bad []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if strings.Contains(l, "undefined symbol") || strings.Contains(l, "not found") {
			bad = append(bad, l)
		}
	}
	return out, bad
}

var undefinedRE = regexp.MustCompile(`^undefined symbol: ([^\s,]+)(?:, version (\S+))?`)

// checkImports checks one file (see TestDebianImportsResolve) and says
// whether it loads any of ourSonames.
func checkImports(t *testing.T, libdir, file string) bool {
	t.Helper()
	name := filepath.Base(file)
	out, bad := lddProblems(t, file, libdir)
	resolved := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if so, path, ok := strings.Cut(strings.TrimSpace(sc.Text()), " => "); ok {
			path, _, _ = strings.Cut(path, " (")
			resolved[so] = path
		}
	}
	loads := false
	for _, so := range ourSonames {
		if p, ok := resolved[so]; ok {
			loads = true
			if p != filepath.Join(libdir, so) {
				t.Errorf("%s: %s resolves to %s, not the build's", name, so, p)
			}
		}
	}
	if !loads || len(bad) == 0 {
		return loads
	}
	_, system := lddProblems(t, file, "")
	known := map[string]bool{}
	for _, l := range system {
		known[l] = true
	}
	var rs []string
	for _, l := range bad {
		if known[l] {
			t.Logf("%s: %s (so too with the system's libraries)", name, l)
			continue
		}
		if m := undefinedRE.FindStringSubmatch(l); m != nil {
			sym := m[1]
			if m[2] != "" {
				sym += "@" + m[2]
			}
			if rsockets[sym] {
				rs = append(rs, m[1])
				continue
			}
			t.Errorf("%s: symbol %s not found in the build", name, sym)
			continue
		}
		t.Errorf("%s: %s", name, l)
	}
	if len(rs) > 0 {
		sort.Strings(rs)
		t.Logf("%s does not load: it needs rsockets, which the build does not offer (%s)", name, strings.Join(rs, " "))
	}
	return true
}

// TestUnsupportedVerbs runs testdata/unsupported.c on a service's device:
// the verbs of IBVERBS_1.10 to 1.14 the device lacks (imports, ECE,
// dma-buf MRs, data-in-order), and libmlx5's and libefa's functions, give
// the answers rdma-core and the real provider libraries give for a device
// without them, NULL objects crash nothing, and the objects the calls
// named go on working; also with ASan and UBSan.
func TestUnsupportedVerbs(t *testing.T) {
	for _, san := range []bool{false, true} {
		t.Run(fmt.Sprintf("sanitize=%v", san), func(t *testing.T) {
			dir := libs(t, san)
			prog := compileLinked(t, dir, "testdata/unsupported.c", san, "-libverbs", "-lmlx5", "-lefa")
			s := startService(t)
			c := command(t, dir, s.sock, prog)
			c.Env = append(c.Env, "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1", "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
			out, err := c.CombinedOutput()
			t.Logf("%s", out)
			if err != nil || !bytes.Contains(out, []byte("cases ok\n")) {
				t.Fatalf("unsupported: %v", err)
			}
		})
	}
}

// compileLinked builds a C test program from testdata against the
// libraries with the given -l flags.
func compileLinked(t testing.TB, libdir, src string, sanitize bool, libflags ...string) string {
	t.Helper()
	out := filepath.Join(world(t), strings.TrimSuffix(filepath.Base(src), ".c"))
	args := append([]string{}, capi.CFlags...)
	if sanitize {
		args = append(append(args, "-O1"), capi.SanitizeFlags...)
	} else {
		args = append(args, "-O2")
	}
	args = append(args, "-I", filepath.Join(libdir, "include"), "-o", out, src, "-L", libdir)
	args = append(args, libflags...)
	if b, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
		t.Fatalf("cc %s: %v\n%s", src, err, b)
	}
	os.Chmod(out, 0o755)
	return out
}
