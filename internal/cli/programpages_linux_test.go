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
