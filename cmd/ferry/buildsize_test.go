package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The README and scripts/demo tell a new user how much the first build
// downloads and compiles; the numbers they give must be the build's, within
// a fifth: the packages of go list -deps ./cmd/ferry (the standard
// library's included, as go build -v prints them on a first build) and the
// modules other than Ferry that provide them. (scripts/demo said "a few
// hundred packages" and the README "about a thousand" of some 1,200.)
func TestFirstBuildSizeInDocs(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH")
	}
	root := filepath.Join("..", "..")
	list := func(format string) map[string]bool {
		t.Helper()
		cmd := exec.Command("go", "list", "-deps", "-f", format, "./cmd/ferry")
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list: %v", err)
		}
		set := map[string]bool{}
		for _, l := range strings.Fields(string(out)) {
			set[l] = true
		}
		return set
	}
	packages := len(list("{{.ImportPath}}"))
	mods := list("{{with .Module}}{{.Path}}{{end}}")
	delete(mods, "github.com/ferrykit/ferry")
	modules := len(mods)
	t.Logf("go list -deps ./cmd/ferry: %d packages from %d modules", packages, modules)

	near := func(stated string, actual int) bool {
		n, err := strconv.Atoi(strings.ReplaceAll(stated, ",", ""))
		return err == nil && float64(n) >= 0.8*float64(actual) && float64(n) <= 1.2*float64(actual)
	}
	pkgRe := regexp.MustCompile(`compiles\s+(?:#\s+)?about\s+([0-9,]+)\s+(?:#\s+)?packages`)
	modRe := regexp.MustCompile(`downloads\s+(?:#\s+)?about\s+([0-9,]+)\s+(?:#\s+)?Go\s+(?:#\s+)?modules`)
	for _, f := range []string{"README.md", filepath.Join("scripts", "demo")} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		if m := pkgRe.FindSubmatch(b); m == nil || !near(string(m[1]), packages) {
			t.Errorf("%s: the first build's packages: want \"compiles about N packages\" with N within a fifth of %d, found %q", f, packages, m)
		}
		if m := modRe.FindSubmatch(b); m == nil || !near(string(m[1]), modules) {
			t.Errorf("%s: the first build's modules: want \"downloads about N Go modules\" with N within a fifth of %d, found %q", f, modules, m)
		}
	}
}
