// Package docs checks the documentation against the repository: the import
// table of architecture.md against the packages' real imports, README.md's
// documentation list against docs/*.md, and every relative link of the
// repository's Markdown files against the files it names.
package docs

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// root is the repository's root (go test runs in docs/).
const root = ".."

// goPackage is what this test reads of `go list -json`.
type goPackage struct {
	ImportPath string
	Imports    []string // non-test imports, for the default build context
	Module     *struct{ Path string }
}

// listPackages returns the module's packages' non-test imports of the
// module, keyed by the package's path inside the module ("iwarp",
// "cmd/rdmatap/internal/cli"; "." for the root package).
func listPackages(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -json ./...: %v\n%s", err, stderr.Bytes())
	}
	var mod string
	pkgs := map[string][]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p goPackage
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("decoding go list's output: %v", err)
		}
		if p.Module == nil || p.Module.Path == "" {
			t.Fatalf("go list names no module for %s", p.ImportPath)
		}
		mod = p.Module.Path
		rel, ok := inModule(mod, p.ImportPath)
		if !ok {
			t.Fatalf("go list reports %s outside module %s", p.ImportPath, mod)
		}
		var own []string
		for _, imp := range p.Imports {
			if r, ok := inModule(mod, imp); ok {
				own = append(own, r)
			}
		}
		pkgs[rel] = own
	}
	if len(pkgs) == 0 {
		t.Fatal("go list reports no package")
	}
	return pkgs
}

// inModule returns path's part inside module mod, and whether path is in it.
func inModule(mod, path string) (string, bool) {
	if path == mod {
		return ".", true
	}
	rel, ok := strings.CutPrefix(path, mod+"/")
	return rel, ok
}

// tableRow is one row of architecture.md's import table.
type tableRow struct {
	line    int
	imports []string
}

var backticked = regexp.MustCompile("`([^`]*)`")

// parseImportTable reads the table under the heading "Packages and their
// imports": a package in backticks in the first column, the packages it
// imports in backticks in the second, or "—" (optionally followed by a
// remark) for none. `a/{b,c}` stands for `a/b` and `a/c`.
func parseImportTable(md []byte) (map[string]tableRow, error) {
	rows := map[string]tableRow{}
	section, inTable := false, false
	s := bufio.NewScanner(bytes.NewReader(md))
	for n := 1; s.Scan(); n++ {
		line := strings.TrimSpace(s.Text())
		if strings.HasPrefix(line, "#") {
			if section && inTable {
				break
			}
			section = strings.TrimSpace(strings.TrimLeft(line, "#")) == "Packages and their imports"
			continue
		}
		if !section {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			if inTable {
				break // the table has ended
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 2 {
			return nil, fmt.Errorf("architecture.md:%d: a row of the import table has %d columns, want 2", n, len(cells))
		}
		first, second := strings.TrimSpace(cells[0]), strings.TrimSpace(cells[1])
		if !inTable {
			inTable = true // the header row
			continue
		}
		if strings.Trim(first, "-: ") == "" {
			continue // the delimiter row
		}
		m := backticked.FindAllStringSubmatch(first, -1)
		if len(m) != 1 || strings.TrimSpace(strings.Trim(first, "`")) != m[0][1] {
			return nil, fmt.Errorf("architecture.md:%d: the first column is %q, want one package in backticks", n, first)
		}
		pkg := m[0][1]
		if prev, dup := rows[pkg]; dup {
			return nil, fmt.Errorf("architecture.md:%d: package %s has a second row (the first is line %d)", n, pkg, prev.line)
		}
		row := tableRow{line: n}
		if !strings.HasPrefix(second, "—") {
			ms := backticked.FindAllStringSubmatch(second, -1)
			if len(ms) == 0 {
				return nil, fmt.Errorf("architecture.md:%d: %s's imports are %q: want packages in backticks, or — for none", n, pkg, second)
			}
			for _, m := range ms {
				exp, err := expandBraces(m[1])
				if err != nil {
					return nil, fmt.Errorf("architecture.md:%d: %v", n, err)
				}
				row.imports = append(row.imports, exp...)
			}
		}
		rows[pkg] = row
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("architecture.md has no import table under a heading \"Packages and their imports\"")
	}
	return rows, nil
}

// expandBraces expands one {a,b,...} group: "x/{a,b}" is "x/a", "x/b".
func expandBraces(s string) ([]string, error) {
	i := strings.IndexByte(s, '{')
	if i < 0 {
		if strings.ContainsAny(s, "}, ") || s == "" {
			return nil, fmt.Errorf("%q is not a package path", s)
		}
		return []string{s}, nil
	}
	j := strings.IndexByte(s[i:], '}')
	if j < 0 {
		return nil, fmt.Errorf("%q has an unclosed brace", s)
	}
	j += i
	var out []string
	for _, alt := range strings.Split(s[i+1:j], ",") {
		rest, err := expandBraces(s[:i] + strings.TrimSpace(alt) + s[j+1:])
		if err != nil {
			return nil, err
		}
		out = append(out, rest...)
	}
	return out, nil
}

// importTableProblems lists each disagreement between the table and the
// packages' imports, in either direction.
func importTableProblems(table map[string]tableRow, pkgs map[string][]string) []string {
	var probs []string
	for _, pkg := range sortedKeys(pkgs) {
		row, ok := table[pkg]
		if !ok {
			probs = append(probs, fmt.Sprintf("package %s is not in the import table (it imports %s)", pkg, orNone(pkgs[pkg])))
			continue
		}
		for _, imp := range pkgs[pkg] {
			if !slices.Contains(row.imports, imp) {
				probs = append(probs, fmt.Sprintf("architecture.md:%d: package %s imports %s, which its row does not list", row.line, pkg, imp))
			}
		}
		seen := map[string]bool{}
		for _, imp := range row.imports {
			switch {
			case seen[imp]:
				probs = append(probs, fmt.Sprintf("architecture.md:%d: package %s's row lists %s twice", row.line, pkg, imp))
			case !slices.Contains(pkgs[pkg], imp):
				probs = append(probs, fmt.Sprintf("architecture.md:%d: package %s's row lists %s, which it does not import", row.line, pkg, imp))
			}
			seen[imp] = true
		}
	}
	for _, pkg := range sortedKeys(table) {
		if _, ok := pkgs[pkg]; !ok {
			probs = append(probs, fmt.Sprintf("architecture.md:%d: the import table has a row for %s, which is not a package of the module", table[pkg].line, pkg))
		}
	}
	return probs
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "nothing of the module"
	}
	return strings.Join(s, ", ")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// TestImportTable checks architecture.md's import table against every
// package's non-test imports of the module, both ways.
func TestImportTable(t *testing.T) {
	md, err := os.ReadFile("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	table, err := parseImportTable(md)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range importTableProblems(table, listPackages(t)) {
		t.Error(p)
	}
}

// TestImportTableProblems checks that the comparison reports each kind of
// disagreement, and none for a table that matches.
func TestImportTableProblems(t *testing.T) {
	md := []byte("# A\n\n## Packages and their imports\n\n| package | imports |\n|---|---|\n" +
		"| `a` | — (a remark with `code`) |\n" +
		"| `b` | `a`, `c/{x,y}` |\n" +
		"| `c/x` | — |\n| `c/y` | `a` |\n\n## Next\n\n| `z` | — |\n")
	table, err := parseImportTable(md)
	if err != nil {
		t.Fatal(err)
	}
	match := map[string][]string{"a": nil, "b": {"a", "c/x", "c/y"}, "c/x": nil, "c/y": {"a"}}
	if p := importTableProblems(table, match); len(p) != 0 {
		t.Fatalf("a matching table has problems: %q", p)
	}
	differ := map[string][]string{"a": {"c/x"}, "b": {"a", "c/x"}, "c/x": nil, "d": {"a"}}
	want := []string{
		"architecture.md:7: package a imports c/x, which its row does not list",
		"architecture.md:8: package b's row lists c/y, which it does not import",
		"package d is not in the import table (it imports a)",
		"architecture.md:10: the import table has a row for c/y, which is not a package of the module",
	}
	if got := importTableProblems(table, differ); !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, bad := range []string{
		"## Packages and their imports\n| p | i |\n|---|---|\n| `a` | a |\n",
		"## Packages and their imports\n| p | i |\n|---|---|\n| a | — |\n",
		"## Packages and their imports\n| p | i |\n|---|---|\n| `a` | `b/{c` |\n",
		"## Packages and their imports\n| p | i |\n|---|---|\n| `a` | — |\n| `a` | — |\n",
		"## Packages and their imports\n| p | i | x |\n",
		"## Something else\n| p | i |\n|---|---|\n| `a` | — |\n",
	} {
		if _, err := parseImportTable([]byte(bad)); err == nil {
			t.Errorf("parseImportTable(%q) succeeded", bad)
		}
	}
}

// TestReadmeListsDocs checks that README.md's Documentation section links
// every docs/*.md, and links nothing in docs/ that is not there.
func TestReadmeListsDocs(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	section, ok := sectionOf(readme, "Documentation")
	if !ok {
		t.Fatal("README.md has no section \"Documentation\"")
	}
	listed := map[string]bool{}
	for _, l := range links(section) {
		if rest, ok := strings.CutPrefix(l.target, "docs/"); ok {
			listed[strings.SplitN(rest, "#", 2)[0]] = true
		}
	}
	docs, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		if !listed[d] {
			t.Errorf("README.md's Documentation section does not list docs/%s", d)
		}
		delete(listed, d)
	}
	for _, d := range sortedKeys(listed) {
		t.Errorf("README.md's Documentation section lists docs/%s, which does not exist", d)
	}
	if n := bytes.Count(readme, []byte("\n")); n > 300 {
		t.Errorf("README.md has %d lines; keep it to 300", n)
	}
}

// sectionOf returns the lines under the heading named title, up to the next
// heading of the same or a higher level.
func sectionOf(md []byte, title string) ([]byte, bool) {
	var out bytes.Buffer
	level, fence := 0, false
	for _, line := range strings.SplitAfter(string(md), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
		}
		if !fence && strings.HasPrefix(line, "#") {
			l := len(line) - len(strings.TrimLeft(line, "#"))
			if level > 0 && l <= level {
				break
			}
			if level == 0 && strings.TrimSpace(line[l:]) == title {
				level = l
				continue
			}
		}
		if level > 0 {
			out.WriteString(line)
		}
	}
	return out.Bytes(), level > 0
}

// link is a Markdown link's target and the line it is on.
type link struct {
	target string
	line   int
}

var (
	inlineLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	refLink    = regexp.MustCompile(`^\s*\[[^\]]+\]:\s+(\S+)`)
	codeSpan   = regexp.MustCompile("`[^`]*`")
)

// links returns the inline and reference link targets of md, outside
// fenced code blocks and code spans.
func links(md []byte) []link {
	var out []link
	fence := false
	for i, line := range strings.Split(string(md), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			continue
		}
		if fence {
			continue
		}
		if m := refLink.FindStringSubmatch(line); m != nil {
			out = append(out, link{strings.Trim(m[1], "<>"), i + 1})
			continue
		}
		// A code span may be a link's text ([`x`](x)): blank it out, keep
		// the brackets around it.
		line = codeSpan.ReplaceAllStringFunc(line, func(s string) string { return strings.Repeat("x", len(s)) })
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			out = append(out, link{strings.Trim(m[1], "<>"), i + 1})
		}
	}
	return out
}

// TestRelativeLinks checks that every relative link of the repository's
// Markdown files names a file or directory that exists, and that a link's
// #fragment into a Markdown file names one of its headings.
func TestRelativeLinks(t *testing.T) {
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(files, filepath.Join(root, "README.md")) {
		t.Fatalf("no README.md among %d Markdown files", len(files))
	}
	checked := 0
	for _, f := range files {
		md, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name, _ := filepath.Rel(root, f)
		for _, l := range links(md) {
			if strings.Contains(l.target, "://") || strings.HasPrefix(l.target, "mailto:") {
				continue
			}
			target, frag, _ := strings.Cut(l.target, "#")
			if strings.HasPrefix(target, "/") {
				t.Errorf("%s:%d: link %s is absolute; make it relative", name, l.line, l.target)
				continue
			}
			p := f
			if target != "" {
				p = filepath.Join(filepath.Dir(f), filepath.FromSlash(target))
			}
			checked++
			if _, err := os.Stat(p); err != nil {
				t.Errorf("%s:%d: link %s names no file", name, l.line, l.target)
				continue
			}
			if frag == "" || !strings.HasSuffix(p, ".md") {
				continue
			}
			dest, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if !anchors(dest)[frag] {
				t.Errorf("%s:%d: link %s names no heading of %s", name, l.line, l.target, target)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative link checked")
	}
}

// anchors returns the fragments that name md's headings, as GitHub makes
// them: lower case, spaces as hyphens, punctuation dropped, and -1, -2, ...
// after a repeated one.
func anchors(md []byte) map[string]bool {
	out := map[string]bool{}
	fence := false
	for _, line := range strings.Split(string(md), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
		}
		if fence || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		for n := 1; out[a]; n++ {
			a = fmt.Sprintf("%s-%d", b.String(), n)
		}
		out[a] = true
	}
	return out
}

// TestAnchors checks anchors against GitHub's fragments of a few headings.
func TestAnchors(t *testing.T) {
	got := anchors([]byte("# Tests, benchmarks and fuzzing\n## 8.5 What the service does with entries\n" +
		"```\n# not a heading\n```\n## The sender's alignment\n## `up --socket`\n## Limits\n## Limits\n"))
	for _, a := range []string{"tests-benchmarks-and-fuzzing", "85-what-the-service-does-with-entries",
		"the-senders-alignment", "up---socket", "limits", "limits-1"} {
		if !got[a] {
			t.Errorf("no anchor %q among %v", a, sortedKeys(got))
		}
	}
	if len(got) != 6 {
		t.Errorf("anchors = %v, want 6", sortedKeys(got))
	}
}

// TestLinks checks what links finds: inline and reference links, with code
// spans for text, and none inside code.
func TestLinks(t *testing.T) {
	md := []byte("see [a](a.md) and [`b`](dir/b.md#x \"title\"), `[c](c.md)`\n" +
		"```\n[d](d.md)\n```\n[e]: e.md\n")
	var got []string
	for _, l := range links(md) {
		got = append(got, fmt.Sprintf("%d:%s", l.line, l.target))
	}
	want := []string{"1:a.md", "1:dir/b.md#x", "5:e.md"}
	if !slices.Equal(got, want) {
		t.Errorf("links = %q, want %q", got, want)
	}
}
