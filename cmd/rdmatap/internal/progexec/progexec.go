// Package progexec holds the exec and env commands: unmodified RDMA
// programs on a service's device through rdmatap's C libraries (capi).
package progexec

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/rdmatap/rdmatap/capi"
	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
)

// `rdmatap exec --via SOCKET -- PROGRAM ARGS...` runs an unmodified RDMA
// program (rping, perftest, qperf, ...) on the device a running `rdmatap up
// --socket SOCKET` serves: it builds rdmatap's libibverbs.so.1 and
// librdmacm.so.1 (package capi) into a cache directory, puts that
// directory first in LD_LIBRARY_PATH, names the socket in RDMATAP_SOCKET
// and executes the program in place of itself. `rdmatap env --via SOCKET`
// prints the same variables for a shell.

func init() {
	cli.Register("exec", "run an unmodified RDMA program on a service's device:\n"+
		"            rdmatap exec --via SOCKET -- PROGRAM [ARGS...] (rdmatap's libibverbs and librdmacm)", execCmd)
	cli.Register("env", "print the variables that run RDMA programs on a service's device:\n"+
		"            eval \"$(rdmatap env --via SOCKET)\"", envCmd)
}

type execOpts struct {
	via      string
	sanitize bool
	cache    string
	maps     addrMap
}

// addrMap is the repeatable --map FROM=TO: kernel addresses a program
// learns out of band and the endpoint addresses they stand for
// (RDMATAP_ADDR_MAP for the libraries).
type addrMap []string

func (m *addrMap) String() string { return strings.Join(*m, ",") }

func (m *addrMap) Set(v string) error {
	for _, e := range strings.Split(v, ",") {
		from, to, ok := strings.Cut(e, "=")
		f, ferr := netip.ParseAddr(from)
		d, derr := netip.ParseAddr(to)
		if !ok || ferr != nil || derr != nil || f.Is4() != d.Is4() || f.Zone() != "" || d.Zone() != "" {
			return fmt.Errorf("%q is not FROM=TO of two IP addresses of one family (e.g. 192.168.1.20=10.77.0.3)", e)
		}
		*m = append(*m, f.String()+"="+d.String())
	}
	if len(*m) > maxMapEntries {
		return fmt.Errorf("more than %d entries", maxMapEntries)
	}
	return nil
}

// maxMapEntries is what the C library takes (CM_MAP_MAX in capi/rdmacm/addr.c).
const maxMapEntries = 64

func (o *execOpts) register(fs *flag.FlagSet) {
	fs.StringVar(&o.via, "via", "", "the socket of a running `rdmatap up --socket SOCKET` (required)")
	fs.Var(&o.maps, "map", "FROM=TO: the program's rdma_cm addresses FROM (a peer host's kernel address it learns out of band) mean the endpoint address TO (repeatable, or comma-separated): docs/librdmacm.md")
	fs.BoolVar(&o.sanitize, "sanitize", false, "use libraries built with AddressSanitizer and UBSan (preloads the compiler's libasan)")
	fs.StringVar(&o.cache, "cache", "", "directory for the built libraries (default: the user's cache directory, rdmatap/capi)")
}

// environment builds the libraries and returns the variables to set, in
// order, as NAME=VALUE.
func (o *execOpts) environment() ([]string, error) {
	if o.via == "" {
		return nil, fmt.Errorf("%w: --via SOCKET is required", cli.ErrUsage)
	}
	sock, err := filepath.Abs(o.via)
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(sock); err != nil {
		return nil, fmt.Errorf("--via: %w", err)
	} else if fi.Mode()&os.ModeSocket == 0 {
		return nil, fmt.Errorf("--via %s: not a socket", o.via)
	}
	cache := o.cache
	if cache == "" {
		d, err := os.UserCacheDir()
		if err != nil {
			return nil, fmt.Errorf("no cache directory (set XDG_CACHE_HOME or --cache): %w", err)
		}
		cache = filepath.Join(d, "rdmatap", "capi")
	}
	dir, err := capi.Build(cache, o.sanitize)
	if err != nil {
		return nil, err
	}
	lp := dir
	if old := os.Getenv("LD_LIBRARY_PATH"); old != "" {
		lp += ":" + old
	}
	env := []string{"LD_LIBRARY_PATH=" + lp, "RDMATAP_SOCKET=" + sock}
	if len(o.maps) > 0 {
		env = append(env, "RDMATAP_ADDR_MAP="+o.maps.String())
	}
	if o.sanitize {
		asan, err := capi.Preload()
		if err != nil {
			return nil, err
		}
		pre := asan
		if old := os.Getenv("LD_PRELOAD"); old != "" {
			pre += ":" + old
		}
		env = append(env, "LD_PRELOAD="+pre)
	}
	return env, nil
}

func execCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o execOpts
	o.register(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: rdmatap exec --via SOCKET [--sanitize] [--map FROM=TO]... -- PROGRAM [ARGS...]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("%w: no program to run", cli.ErrUsage)
	}
	env, err := o.environment()
	if err != nil {
		return err
	}
	prog, err := exec.LookPath(fs.Arg(0))
	if err != nil {
		return err
	}
	return syscall.Exec(prog, fs.Args(), mergeEnv(os.Environ(), env))
}

func envCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("env", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o execOpts
	o.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("%w: unexpected arguments %q", cli.ErrUsage, fs.Args())
	}
	env, err := o.environment()
	if err != nil {
		return err
	}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		fmt.Fprintf(stdout, "export %s=%s\n", k, shellQuote(v))
	}
	return nil
}

// mergeEnv returns base with the variables of set replacing theirs.
func mergeEnv(base, set []string) []string {
	out := make([]string, 0, len(base)+len(set))
	replaced := map[string]bool{}
	for _, kv := range set {
		k, _, _ := strings.Cut(kv, "=")
		replaced[k] = true
	}
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if !replaced[k] {
			out = append(out, kv)
		}
	}
	return append(out, set...)
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
