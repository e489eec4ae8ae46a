package cli

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/ferrykit/ferry/payloadstore"
)

const knownSchemes = "(known schemes: azblob, file, gs, mem, s3)"

func TestParseStoreURL(t *testing.T) {
	cwd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ in, want, err string }{
		// Plain directory paths become file://ABS.
		{in: "/var/ferry", want: "file:///var/ferry"},
		{in: "./payloads", want: "file://" + filepath.ToSlash(filepath.Join(cwd, "payloads"))},
		{in: "payloads", want: "file://" + filepath.ToSlash(filepath.Join(cwd, "payloads"))},
		{in: "./odd:name", want: "file://" + filepath.ToSlash(filepath.Join(cwd, "odd:name"))},
		{in: "/data/a:b", want: "file:///data/a:b"},
		{in: "/tmp/with space#and?query%", want: "file:///tmp/with%20space%23and%3Fquery%25"},
		{in: "  /var/ferry  ", want: "file:///var/ferry"},
		{in: "", want: ""},
		// URLs of the known schemes pass as they are.
		{in: "file:///var/ferry", want: "file:///var/ferry"},
		{in: "file://localhost/var/ferry", want: "file://localhost/var/ferry"},
		{in: "s3://payloads/kafka?region=eu-west-1", want: "s3://payloads/kafka?region=eu-west-1"},
		{in: "S3://payloads", want: "S3://payloads"},
		{in: "gs://b/p", want: "gs://b/p"},
		{in: "azblob://c/p", want: "azblob://c/p"},
		{in: "mem://x", want: "mem://x"},
		// A malformed escape is payloadstore.Open's to report.
		{in: "s3://b/%zz", want: "s3://b/%zz"},
		// Malformed URLs are errors, never folders.
		{in: "s3:/bucket", err: "not a store URL: want s3://BUCKET/PREFIX " + knownSchemes},
		{in: "s3:bucket", err: "want s3://BUCKET/PREFIX"},
		{in: "s3:///prefix", err: "want s3://BUCKET/PREFIX"},
		{in: "gs:/b", err: "want gs://BUCKET/PREFIX"},
		{in: "azblob:/c", err: "want azblob://CONTAINER/PREFIX"},
		{in: "mem:x", err: "want mem://NAME"},
		{in: "file:dir", err: "not a store URL: want file:///ABSOLUTE/DIR or a directory path " + knownSchemes},
		{in: "file:/dir", err: "want file:///ABSOLUTE/DIR"},
		{in: "file://dir", err: "want file:///ABSOLUTE/DIR"},
		{in: "file://relative/dir", err: "want file:///ABSOLUTE/DIR"},
		{in: "foo://x", err: `not a store URL: unknown scheme "foo" ` + knownSchemes},
		{in: "sftp://host/dir", err: `unknown scheme "sftp"`},
		{in: "payloads:2024", err: `unknown scheme "payloads" ` + knownSchemes + "; a directory whose name contains ':' is written ./NAME"},
		{in: "c:", err: `unknown scheme "c"`},
	} {
		got, err := parseStoreURL(tc.in)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("parseStoreURL(%q): %v, want %q", tc.in, err, tc.want)
		case tc.err == "" && got != tc.want:
			t.Errorf("parseStoreURL(%q) = %q, want %q", tc.in, got, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("parseStoreURL(%q) = %q, %v; want an error with %q", tc.in, got, err, tc.err)
		}
	}
	// A drive letter starts a path on Windows, and is an unknown scheme
	// elsewhere (a folder named "C:" would surprise).
	for _, in := range []string{`C:\ferry`, "C:/ferry", "c:/x"} {
		got, err := parseStoreURL(in)
		switch {
		case runtime.GOOS == "windows" && (err != nil || !strings.HasPrefix(got, "file://")):
			t.Errorf("parseStoreURL(%q) = %q, %v; want a file:// URL on Windows", in, got, err)
		case runtime.GOOS != "windows" && (err == nil || !strings.Contains(err.Error(), "unknown scheme")):
			t.Errorf("parseStoreURL(%q) = %q, %v; want an unknown scheme", in, got, err)
		}
	}
}

func TestShownStoreURL(t *testing.T) {
	for in, want := range map[string]string{
		"s3:/bucket":                    "s3:/bucket",
		"s3:/AKIA:TopSecret@bucket/p":   "s3:/...@bucket/p",
		"s3://AKIA:TopSecret@b/p?sig=x": "s3://...@b/p?...",
		"foo://x?token=TopSecret":       "foo://x?...",
	} {
		if got := shownStoreURL(in); got != want {
			t.Errorf("shownStoreURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// A malformed store URL given to any command, as --store, -X or in
// --config, fails with one line and exit 2, and creates no folder named
// after it (it used to be taken as a relative directory: the payload
// landed in ./s3:/bucket and the command exited 0).
func TestStoreURLStrictInCommands(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	f, _ := randomFile(t, dir, "f", 10, 11)
	cfg := filepath.Join(dir, "client.properties")
	if err := os.WriteFile(cfg, []byte("large.message.payload.store.url=file:payloads\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	proxyYAML := filepath.Join(dir, "proxy.yaml")
	yaml := "upstream: [127.0.0.1:1]\nlisten: 127.0.0.1:0\ninterceptors:\n  - name: large-message\n    config:\n      large.message.payload.store.url: \"s3:/bucket\"\n"
	if err := os.WriteFile(proxyYAML, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	b := "127.0.0.1:1" // never reached: the URL is refused first
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"produce --store s3:/", []string{"produce", "--brokers", b, "-t", "t", "--store", "s3:/bucket", f},
			`--store "s3:/bucket": not a store URL: want s3://BUCKET/PREFIX ` + knownSchemes},
		{"produce --store file:dir", []string{"produce", "--brokers", b, "-t", "t", "--store", "file:dir", f},
			`--store "file:dir": not a store URL: want file:///ABSOLUTE/DIR or a directory path`},
		{"produce --store file:/dir", []string{"produce", "--brokers", b, "-t", "t", "--store", "file:/dir", f},
			`--store "file:/dir": not a store URL: want file:///ABSOLUTE/DIR`},
		{"produce --store foo://", []string{"produce", "--brokers", b, "-t", "t", "--store", "foo://x", f},
			`--store "foo://x": not a store URL: unknown scheme "foo" ` + knownSchemes},
		{"produce --store sftp:// with a secret", []string{"produce", "--brokers", b, "-t", "t", "--store", "sftp://me:TopSecret@host/d?k=TopSecret", f},
			`--store "sftp://...@host/d?...": not a store URL: unknown scheme "sftp"`},
		{"consume --store", []string{"consume", "--brokers", b, "-t", "t", "--store", "s3:/bucket"},
			`--store "s3:/bucket": not a store URL`},
		{"gc --store", []string{"gc", "--brokers", b, "-t", "t", "--store", "gs:/bucket"},
			`--store "gs:/bucket": not a store URL: want gs://BUCKET/PREFIX`},
		{"-X", []string{"-X", "large.message.payload.store.url=s3:/bucket", "produce", "--brokers", b, "-t", "t", f},
			`-X large.message.payload.store.url="s3:/bucket": not a store URL: want s3://BUCKET/PREFIX`},
		{"--config", []string{"--config", cfg, "consume", "--brokers", b, "-t", "t"},
			`large.message.payload.store.url="file:payloads" in ` + cfg + `: not a store URL: want file:///ABSOLUTE/DIR`},
		{"proxy --store", []string{"proxy", "--upstream", b, "--listen", "127.0.0.1:0", "--interceptors", "large-message", "--store", "s3:/bucket"},
			`--store "s3:/bucket": not a store URL: want s3://BUCKET/PREFIX`},
		{"proxy -X", []string{"-X", "large.message.payload.store.url=azblob:/c", "proxy", "--upstream", b, "--listen", "127.0.0.1:0", "--interceptors", "large-message"},
			`-X large.message.payload.store.url="azblob:/c": not a store URL: want azblob://CONTAINER/PREFIX`},
		{"proxy --config YAML", []string{"proxy", "--config", proxyYAML},
			proxyYAML + `: interceptors[0] (large-message): large.message.payload.store.url "s3:/bucket": not a store URL: want s3://BUCKET/PREFIX`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, nil, tc.args...)
			if r.code != ExitUsage {
				t.Errorf("exit %d, want %d", r.code, ExitUsage)
			}
			oneErrorLine(t, r, tc.want)
			if strings.Contains(r.stderr, "TopSecret") {
				t.Errorf("a secret is echoed: %q", r.stderr)
			}
		})
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() {
			t.Errorf("a folder %q was created in the working directory", e.Name())
		}
	}
}

// A store directory that does not exist and cannot be created (a file in
// its path, /proc/x), or, for a command that only reads, one that does not
// exist, is a configuration error like a bucket that does not exist: exit 2,
// one line saying so (it was exit 1, a runtime failure, against the exit
// status table of README.md and ferry --help).
func TestStoreDirectoryUnusable(t *testing.T) {
	dir := t.TempDir()
	f, _ := randomFile(t, dir, "f", 10, 13)
	inFile := filepath.Join(f, "payloads") // a regular file in the path
	missing := filepath.Join(dir, "missing")
	b := "127.0.0.1:1" // never reached: the store is opened first
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"produce", []string{"produce", "--brokers", b, "-t", "t", "--store", inFile, f}, "does not exist and cannot be created"},
		{"produce -X", []string{"-X", "large.message.payload.store.url=file://" + inFile, "produce", "--brokers", b, "-t", "t", f}, "does not exist and cannot be created"},
		{"consume", []string{"consume", "--brokers", b, "-t", "t", "--store", missing}, "the store's directory does not exist"},
		{"consume, a file", []string{"consume", "--brokers", b, "-t", "t", "--store", f}, "not a directory"},
		{"gc", []string{"gc", "--brokers", b, "-t", "t", "--store", missing}, "the store's directory does not exist"},
		{"proxy", []string{"proxy", "--upstream", b, "--listen", "127.0.0.1:0", "--interceptors", "large-message", "--store", inFile}, "does not exist and cannot be created"},
	}
	if st, err := os.Stat("/proc/self"); err == nil && st.IsDir() {
		cases = append(cases, struct {
			name string
			args []string
			want string
		}{"produce /proc/x", []string{"produce", "--brokers", b, "-t", "t", "--store", "/proc/x", f}, "does not exist and cannot be created"})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, nil, tc.args...)
			if r.code != ExitUsage {
				t.Errorf("exit %d, want %d", r.code, ExitUsage)
			}
			oneErrorLine(t, r, "invalid payload store configuration: ")
			oneErrorLine(t, r, tc.want)
		})
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("consume or gc created the store directory they only read: %v", err)
	}
}

// A plain directory path is still a store: it becomes file://ABS.
func TestStoreDirectoryPath(t *testing.T) {
	brokers := newCluster(t)
	dir := t.TempDir()
	t.Chdir(dir)
	big, _ := randomFile(t, dir, "big", 2<<20, 12)
	r := run(t, nil, "produce", "--brokers", brokers, "--topic", "t", "--store", "payloads", big)
	want := "t/0@0 2097152 bytes offloaded file://" + filepath.ToSlash(filepath.Join(dir, "payloads")) + "/t/"
	if r.code != 0 || !strings.HasPrefix(r.stdout, want) {
		t.Fatalf("exit %d, stdout %q; want %q...", r.code, r.stdout, want)
	}
}

// The root's --help names every registered store scheme.
func TestHelpListsEveryStoreScheme(t *testing.T) {
	r := run(t, nil, "--help")
	if len(payloadstore.Schemes()) < 5 {
		t.Fatalf("registered schemes: %v", payloadstore.Schemes())
	}
	for _, s := range payloadstore.Schemes() {
		// mem:// is the library's and the tests' (every command refuses it).
		if named := strings.Contains(r.stdout, " "+s+"://"); named != (s != "mem") {
			t.Errorf("--help names %s:// %v, want %v:\n%s", s, named, s != "mem", r.stdout)
		}
	}
}
