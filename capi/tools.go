package capi

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ErrTools matches the error Build returns when the machine lacks what it
// needs to compile the libraries (a *MissingError).
var ErrTools = errors.New("capi: build tools missing")

// MissingError names the Debian packages Build needs and the machine
// lacks: the C compiler, and the rdma-core headers the sources include.
type MissingError struct {
	Packages []string
}

func (e *MissingError) Error() string {
	return fmt.Sprintf("building rdmatap's libibverbs and librdmacm needs %s: apt-get install %s",
		strings.Join(e.Packages, ", "), strings.Join(e.Packages, " "))
}

// Is makes a *MissingError match ErrTools.
func (e *MissingError) Is(target error) bool { return target == ErrTools }

// systemHeaders are the headers of the distribution's rdma-core that the
// sources include, and the Debian packages that ship them (a test checks
// that the list covers every such include).
var systemHeaders = []struct{ header, pkg string }{
	{"infiniband/verbs.h", "libibverbs-dev"},
	{"infiniband/mlx5dv.h", "libibverbs-dev"},
	{"infiniband/efadv.h", "libibverbs-dev"},
	{"rdma/rdma_cma.h", "librdmacm-dev"},
	{"rdma/rdma_verbs.h", "librdmacm-dev"},
}

// CheckTools reports what Build needs and the machine lacks, as a
// *MissingError, or nil: cc on PATH (Debian's gcc), and each header of
// systemHeaders where cc finds it. Without cc it looks for the headers
// under /usr/include.
func CheckTools() error {
	var pkgs []string
	add := func(p string) {
		for _, q := range pkgs {
			if q == p {
				return
			}
		}
		pkgs = append(pkgs, p)
	}
	_, err := exec.LookPath("cc")
	if err != nil {
		add("gcc")
	}
	for _, h := range systemHeaders {
		var found bool
		if err == nil {
			cmd := exec.Command("cc", "-E", "-x", "c", "-o", os.DevNull, "-")
			cmd.Stdin = strings.NewReader("#include <" + h.header + ">\n")
			found = cmd.Run() == nil
		} else {
			_, serr := os.Stat(filepath.Join("/usr/include", h.header))
			found = serr == nil
		}
		if !found {
			add(h.pkg)
		}
	}
	if len(pkgs) == 0 {
		return nil
	}
	return &MissingError{Packages: pkgs}
}
