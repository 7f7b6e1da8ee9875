package capi

import (
	"io/fs"
	"regexp"
	"strings"
	"testing"
)

// TestSystemHeadersListed: every header of rdma-core the libraries'
// sources include is one CheckTools looks for, so that a machine without
// it hears which package to install rather than the compiler's error.
func TestSystemHeadersListed(t *testing.T) {
	known := map[string]bool{}
	for _, h := range systemHeaders {
		known[h.header] = true
	}
	inc := regexp.MustCompile(`(?m)^\s*#\s*include\s*<((?:infiniband|rdma)/[^>]+)>`)
	n := 0
	err := fs.WalkDir(sources, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(p, "testdata/") {
			return err
		}
		b, err := fs.ReadFile(sources, p)
		if err != nil {
			return err
		}
		for _, m := range inc.FindAllStringSubmatch(string(b), -1) {
			n++
			if !known[m[1]] {
				t.Errorf("%s includes <%s>, which systemHeaders does not list", p, m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no rdma-core include found in the sources")
	}
}
