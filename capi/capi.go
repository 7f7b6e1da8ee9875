// Package capi builds rdmatap's C libraries: a libibverbs.so.1 and a
// librdmacm.so.1 that speak the service protocol (docs/service-protocol.md)
// to an `rdmatap up --socket` service, so that unmodified RDMA programs run
// on rdmatap when the libraries' directory comes first in LD_LIBRARY_PATH
// and RDMATAP_SOCKET names the service's socket.
//
// The C sources are embedded. Each directory under capi holding version
// scripts (*.map) builds libraries: a script NAME.map whose first line is
// the comment "/* soname: SONAME */" makes the shared library SONAME from
// the directory's C files (when the directory holds one script) or from
// its C files whose names start with NAME (when it holds several).
// libibverbs (directory ibverbs) also gets the C files of core; every other
// library is linked against it. Headers come from include and the
// library's own directory. testdata is not built.
package capi

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

//go:embed */*.h */*.c */*.map
var sources embed.FS

// CFlags are the flags every C file is compiled with.
var CFlags = []string{"-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror", "-fPIC", "-pthread", "-g"}

// SanitizeFlags are added (with -O1) for a sanitized build; without them
// the build uses -O2.
var SanitizeFlags = []string{"-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer"}

// lib is one library to build.
type lib struct {
	soname string
	script string   // path in sources
	srcs   []string // paths in sources
	dir    string   // its directory in sources
}

// The directory whose library every other one links against.
const coreLib = "ibverbs"

func plan() ([]lib, error) {
	dirs, err := fs.ReadDir(sources, ".")
	if err != nil {
		return nil, err
	}
	var libs []lib
	for _, d := range dirs {
		if !d.IsDir() || d.Name() == "include" || d.Name() == "core" || d.Name() == "testdata" {
			continue
		}
		maps, _ := fs.Glob(sources, d.Name()+"/*.map")
		cs, _ := fs.Glob(sources, d.Name()+"/*.c")
		for _, m := range maps {
			text, err := fs.ReadFile(sources, m)
			if err != nil {
				return nil, err
			}
			first, _, _ := strings.Cut(string(text), "\n")
			soname, ok := strings.CutPrefix(strings.TrimSpace(first), "/* soname:")
			soname, ok2 := strings.CutSuffix(strings.TrimSpace(soname), "*/")
			soname = strings.TrimSpace(soname)
			if !ok || !ok2 || soname == "" || strings.ContainsAny(soname, "/ ") {
				return nil, fmt.Errorf("capi: %s: first line must be /* soname: NAME */", m)
			}
			l := lib{soname: soname, script: m, dir: d.Name()}
			base := strings.TrimSuffix(path.Base(m), ".map")
			for _, c := range cs {
				if len(maps) == 1 || strings.HasPrefix(path.Base(c), base) {
					l.srcs = append(l.srcs, c)
				}
			}
			if d.Name() == coreLib {
				core, _ := fs.Glob(sources, "core/*.c")
				l.srcs = append(l.srcs, core...)
			}
			if len(l.srcs) == 0 {
				return nil, fmt.Errorf("capi: %s: no C files", m)
			}
			libs = append(libs, l)
		}
	}
	sort.SliceStable(libs, func(i, j int) bool { return libs[i].dir == coreLib && libs[j].dir != coreLib })
	if len(libs) == 0 || libs[0].dir != coreLib {
		return nil, fmt.Errorf("capi: no %s library", coreLib)
	}
	return libs, nil
}

// hash names the sources and flags of a build.
// linkFlags link each library: bound at load, and never unloaded. The
// session's reader and the channels' forwarders are threads of the
// libraries that run until the process ends; a library unloaded under
// them (Open MPI's MPI_Finalize dlcloses libfabric, and with it these)
// would leave them running in unmapped code.
var linkFlags = []string{"-Wl,-z,now", "-Wl,-z,nodelete"}

func hash(sanitize bool) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%q %q %q %v\n", CFlags, SanitizeFlags, linkFlags, sanitize)
	err := fs.WalkDir(sources, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(p, "testdata/") {
			return err
		}
		b, err := fs.ReadFile(sources, p)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %d\n", p, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", err
	}
	if out, err := exec.Command("cc", "--version").Output(); err == nil {
		h.Write(out)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// Build compiles the libraries with the system's cc into a directory under
// dir named by the hash of the sources and flags, and returns that
// directory (for LD_LIBRARY_PATH; it also holds NAME.so links for linking
// and the headers of include). A directory built before is reused; a
// build on a machine without cc or rdma-core's headers fails with a
// *MissingError naming the packages to install (CheckTools). With
// sanitize the libraries carry AddressSanitizer and UBSan: a program that
// is not itself built with them needs libasan preloaded (see Preload).
func Build(dir string, sanitize bool) (string, error) {
	libs, err := plan()
	if err != nil {
		return "", err
	}
	sum, err := hash(sanitize)
	if err != nil {
		return "", err
	}
	kind := "plain"
	if sanitize {
		kind = "san"
	}
	out := filepath.Join(dir, kind+"-"+sum)
	if _, err := os.Stat(filepath.Join(out, ".built")); err == nil {
		return out, nil
	}
	if err := CheckTools(); err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	src := filepath.Join(tmp, "src")
	err = fs.WalkDir(sources, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		target := filepath.Join(src, filepath.FromSlash(p))
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := fs.ReadFile(sources, p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
	if err != nil {
		return "", err
	}
	libdir := filepath.Join(tmp, "lib")
	if err := os.MkdirAll(libdir, 0o755); err != nil {
		return "", err
	}
	for _, l := range libs {
		args := append([]string{}, CFlags...)
		if sanitize {
			args = append(args, "-O1")
			args = append(args, SanitizeFlags...)
		} else {
			args = append(args, "-O2")
		}
		args = append(args, "-shared", "-I", filepath.Join(src, "include"), "-I", filepath.Join(src, l.dir),
			"-Wl,-soname,"+l.soname, "-Wl,--version-script="+filepath.Join(src, l.script))
		args = append(args, linkFlags...)
		args = append(args, "-o", filepath.Join(libdir, l.soname))
		if !sanitize {
			args = append(args, "-Wl,-z,defs")
		}
		for _, s := range l.srcs {
			args = append(args, filepath.Join(src, s))
		}
		if l.dir == coreLib {
			args = append(args, "-I", filepath.Join(src, "core"))
		} else {
			args = append(args, "-L", libdir, "-l:"+libs[0].soname)
		}
		cmd := exec.Command("cc", args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("capi: building %s: %v\n%s", l.soname, err, stderr.String())
		}
		if i := strings.Index(l.soname, ".so"); i > 0 {
			if err := os.Symlink(l.soname, filepath.Join(libdir, l.soname[:i+3])); err != nil {
				return "", err
			}
		}
	}
	if err := os.Rename(filepath.Join(src, "include"), filepath.Join(libdir, "include")); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(libdir, ".built"), nil, 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(libdir, out); err != nil {
		if _, serr := os.Stat(filepath.Join(out, ".built")); serr == nil {
			return out, nil // built meanwhile by another process
		}
		return "", err
	}
	return out, nil
}

// Preload returns the path of the C compiler's AddressSanitizer runtime,
// for LD_PRELOAD when a program that is not sanitized loads sanitized
// libraries.
func Preload() (string, error) {
	out, err := exec.Command("cc", "-print-file-name=libasan.so").Output()
	if err != nil {
		return "", err
	}
	p := strings.TrimSpace(string(out))
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("capi: cc does not know libasan.so")
	}
	return p, nil
}
