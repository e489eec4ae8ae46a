package cli

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// rssFileKiB is this process's file-backed resident memory (RssFile).
func rssFileKiB(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status:", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "RssFile:"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Skip("no RssFile in /proc/self/status")
	return 0
}

// The test binary's program pages are unmapped (its code and read-only
// data: tens of MiB of address space) and its file-backed RSS falls; the
// process (this test, then the package's other tests) goes on running the
// code it unmapped.
func TestReleaseProgramPages(t *testing.T) {
	before := rssFileKiB(t)
	released := releaseProgramPages()
	after := rssFileKiB(t)
	t.Logf("released %d MiB of mappings; RssFile %d -> %d KiB", released>>20, before, after)
	if released < 1<<20 {
		t.Fatalf("released %d bytes of the program's mappings, want at least its code", released)
	}
	if after >= before {
		t.Fatalf("RssFile %d KiB after, %d KiB before: nothing was unmapped", after, before)
	}
}

// Only the program's private read-only mappings without anonymous pages
// are released: a position-independent build's RELRO mapping (read-only,
// but written by the loader: its pages are anonymous copies) is kept, as
// are writable mappings and other files' (the crash this prevents: a
// `-buildmode=pie` test binary died in its first function call after the
// release, its relocated pointers replaced by the file's bytes).
func TestProgramMappingsSkipsWrittenPages(t *testing.T) {
	smaps := []byte(`55d0c0000000-55d0c2000000 r-xp 00000000 08:01 42 /usr/bin/ferry
Size:              32768 kB
Anonymous:             0 kB
55d0c2000000-55d0c3000000 r--p 02000000 08:01 42 /usr/bin/ferry
Size:              16384 kB
Anonymous:             0 kB
55d0c3000000-55d0c3100000 r--p 03000000 08:01 42 /usr/bin/ferry
Size:               1024 kB
Anonymous:           412 kB
55d0c3100000-55d0c3200000 rw-p 03100000 08:01 42 /usr/bin/ferry
Anonymous:          1024 kB
7f0000000000-7f0000100000 r--p 00000000 08:01 43 /usr/lib/other.so
Anonymous:             0 kB
`)
	got := programMappings(smaps, "/usr/bin/ferry")
	want := []mapping{{0x55d0c0000000, 0x55d0c2000000}, {0x55d0c2000000, 0x55d0c3000000}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("programMappings = %x, want %x", got, want)
	}
}
