// Package wasmtest builds the repository's example WebAssembly
// interceptors (examples/wasm) for tests: Go modules with the standard
// toolchain (GOOS=wasip1 GOARCH=wasm, -buildmode=c-shared), AssemblyScript
// ones with the compiler from npm, installed into $FERRY_CACHE (default
// ~/.cache/ferry), never into the repository. A built module is cached
// there under the hash of its inputs (sources, toolchain version), and
// once per test binary in memory, so a suite builds each example at most
// once and not at all when nothing changed. Nothing built is committed.
package wasmtest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
)

// GoBuildFlags are the flags a Go module is built with besides
// GOOS=wasip1 GOARCH=wasm (docs/INTERCEPTORS.md gives the same command).
var GoBuildFlags = []string{"-buildmode=c-shared", "-trimpath"}

// AssemblyScriptVersion is the npm version of the assemblyscript compiler
// the AssemblyScript examples are built with (their package.json pins it).
const AssemblyScriptVersion = "0.28.20"

var (
	mu    sync.Mutex
	built = map[string]string{} // example dir → .wasm path
)

// Root returns the repository's root (the directory of go.mod), found
// from the working directory upwards.
func Root(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("wasmtest: no go.mod above the working directory")
		}
		dir = parent
	}
}

// CacheDir returns $FERRY_CACHE/wasm (default ~/.cache/ferry/wasm),
// created.
func CacheDir(t testing.TB) string {
	t.Helper()
	root := os.Getenv("FERRY_CACHE")
	if root == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Fatal(err)
		}
		root = filepath.Join(home, ".cache", "ferry")
	}
	dir := filepath.Join(root, "wasm")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Go returns the path of the module built from the Go package in dir
// (relative to the repository's root, e.g. "examples/wasm/uppercase").
// The file is shared: copy it before changing it.
func Go(t testing.TB, dir string) string {
	t.Helper()
	return once(t, "go:"+dir, func() string { return buildGo(t, dir) })
}

// AssemblyScript returns the path of the module built from the
// AssemblyScript example in dir (assembly/index.ts, package.json and
// package-lock.json), installing the compiler on first use.
func AssemblyScript(t testing.TB, dir string) string {
	t.Helper()
	return once(t, "as:"+dir, func() string { return buildAS(t, dir) })
}

func once(t testing.TB, key string, build func() string) string {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if p, ok := built[key]; ok {
		return p
	}
	p := build()
	built[key] = p
	return p
}

func buildGo(t testing.TB, dir string) string {
	t.Helper()
	root := Root(t)
	env := append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	// The module's inputs: the files of every package of this repository
	// it imports (go list -deps), go.mod, go.sum and the toolchain.
	list := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.Dir}}{{end}}", "./"+dir)
	list.Dir, list.Env = root, env
	out, err := list.Output()
	if err != nil {
		t.Fatalf("wasmtest: go list %s: %v %s", dir, err, stderrOf(err))
	}
	h := sha256.New()
	fmt.Fprintf(h, "go %s %s %v\n", runtime.Version(), goVersion(t, root), GoBuildFlags)
	var files []string
	for _, d := range strings.Fields(string(out)) {
		if !strings.HasPrefix(d, root) {
			continue // module cache: pinned by go.sum
		}
		ents, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if !e.IsDir() && strings.HasSuffix(e.Name(), ".go") && !strings.HasSuffix(e.Name(), "_test.go") {
				files = append(files, filepath.Join(d, e.Name()))
			}
		}
	}
	files = append(files, filepath.Join(root, "go.mod"), filepath.Join(root, "go.sum"))
	hashFiles(t, h, root, files)
	dst := filepath.Join(CacheDir(t), filepath.Base(dir)+"-"+hex.EncodeToString(h.Sum(nil))[:16]+".wasm")
	if _, err := os.Stat(dst); err == nil {
		return dst
	}
	tmp := dst + fmt.Sprintf(".%d.tmp", os.Getpid())
	args := append([]string{"build"}, GoBuildFlags...)
	cmd := exec.Command("go", append(args, "-o", tmp, "./"+dir)...)
	cmd.Dir, cmd.Env = root, env
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("wasmtest: GOOS=wasip1 GOARCH=wasm go build %s: %v\n%s", dir, err, b)
	}
	return publish(t, tmp, dst)
}

func buildAS(t testing.TB, dir string) string {
	t.Helper()
	root := Root(t)
	src := filepath.Join(root, dir)
	var files []string
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "node_modules" {
			return filepath.SkipDir
		}
		if !d.IsDir() {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "asc %s\n", AssemblyScriptVersion)
	hashFiles(t, h, root, files)
	dst := filepath.Join(CacheDir(t), filepath.Base(dir)+"-"+hex.EncodeToString(h.Sum(nil))[:16]+".wasm")
	if _, err := os.Stat(dst); err == nil {
		return dst
	}
	asc := installAS(t, src)
	tmp := dst + fmt.Sprintf(".%d.tmp", os.Getpid())
	cmd := exec.Command("node", asc, "assembly/index.ts", "--config", "asconfig.json", "--target", "release", "--outFile", tmp)
	cmd.Dir = src
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("wasmtest: asc %s: %v\n%s", dir, err, b)
	}
	return publish(t, tmp, dst)
}

// installAS installs the example's package.json and package-lock.json
// (npm ci) into a cache directory named after their hash, and returns the
// path of the asc compiler script there.
func installAS(t testing.TB, src string) string {
	t.Helper()
	if _, err := exec.LookPath("npm"); err != nil {
		const msg = "wasmtest: npm not found (Node.js; scripts/object-stores needs it too, for Azurite)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	h := sha256.New()
	hashFiles(t, h, src, []string{filepath.Join(src, "package.json"), filepath.Join(src, "package-lock.json")})
	dir := filepath.Join(CacheDir(t), "npm-"+hex.EncodeToString(h.Sum(nil))[:16])
	asc := filepath.Join(dir, "node_modules", "assemblyscript", "bin", "asc.js")
	if _, err := os.Stat(asc); err == nil {
		return asc
	}
	tmp, err := os.MkdirTemp(CacheDir(t), "npm-install-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	for _, f := range []string{"package.json", "package-lock.json"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tmp, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts")
	cmd.Dir = tmp
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("wasmtest: npm ci (assemblyscript %s): %v\n%s", AssemblyScriptVersion, err, b)
	}
	if err := os.Rename(tmp, dir); err != nil && !os.IsExist(err) {
		if _, serr := os.Stat(asc); serr != nil { // not another test binary's install
			t.Fatal(err)
		}
	}
	return asc
}

// publish moves a finished build to its cache name (atomic: another test
// binary building the same module at once is harmless).
func publish(t testing.TB, tmp, dst string) string {
	t.Helper()
	if err := os.Rename(tmp, dst); err != nil {
		os.Remove(tmp)
		t.Fatal(err)
	}
	return dst
}

// hashFiles hashes each file's path (relative to root) and content, in
// sorted order.
func hashFiles(t testing.TB, h io.Writer, root string, files []string) {
	t.Helper()
	sort.Strings(files)
	for _, f := range files {
		rel, err := filepath.Rel(root, f)
		if err != nil {
			rel = f
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(h, "%s %d\n", rel, len(b))
		h.Write(b)
	}
}

func goVersion(t testing.TB, root string) string {
	t.Helper()
	cmd := exec.Command("go", "env", "GOVERSION")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("wasmtest: go env GOVERSION: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func stderrOf(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}
