package cli

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The watcher reloads once per change of contents, whatever the way the
// file changed (in place, an editor's rename, a ConfigMap symlink swap),
// not on a touch; SIGHUP always reloads.
func TestReloaderTriggers(t *testing.T) {
	mount := t.TempDir()
	for _, d := range []string{"..v1", "..v2"} {
		if err := os.Mkdir(filepath.Join(mount, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(path, s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(mount, "..v1", "proxy.yaml"), "a")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink("..v1", filepath.Join(mount, "..data")))
	must(os.Symlink("..data/proxy.yaml", filepath.Join(mount, "proxy.yaml")))
	var mu sync.Mutex
	var triggers []string
	hup := make(chan os.Signal, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := startReloader(ctx, slog.New(slog.DiscardHandler), hup, filepath.Join(mount, "proxy.yaml"), true, func(tr string) {
		mu.Lock()
		triggers = append(triggers, tr)
		mu.Unlock()
	})
	defer func() { cancel(); <-done }()
	await := func(n int, what string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			got := len(triggers)
			mu.Unlock()
			if got == n {
				// and no second reload for the same change
				time.Sleep(2 * reloadDebounce)
				mu.Lock()
				got = len(triggers)
				mu.Unlock()
				if got != n {
					t.Fatalf("%s: %d reloads, want %d", what, got, n)
				}
				return
			}
			if got > n || time.Now().After(deadline) {
				t.Fatalf("%s: %d reloads, want %d", what, got, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	real := filepath.Join(mount, "..v1", "proxy.yaml")
	write(real, "b") // in place
	await(1, "in-place write")
	write(real+".tmp", "c")
	must(os.Rename(real+".tmp", real)) // an editor's rename
	await(2, "rename")
	now := time.Now()
	must(os.Chtimes(real, now, now)) // a touch
	time.Sleep(3 * reloadDebounce)
	await(2, "touch")
	write(filepath.Join(mount, "..v2", "proxy.yaml"), "d") // ConfigMap swap
	must(os.Symlink("..v2", filepath.Join(mount, "..data_tmp")))
	must(os.Rename(filepath.Join(mount, "..data_tmp"), filepath.Join(mount, "..data")))
	await(3, "ConfigMap symlink swap")
	hup <- syscall.SIGHUP
	await(4, "SIGHUP")
	mu.Lock()
	defer mu.Unlock()
	if triggers[3] != "SIGHUP" || triggers[0] != "file change" {
		t.Fatalf("triggers %v", triggers)
	}
}

// Without a config file (flags only), SIGHUP still reloads: the chain is
// built again from the flags, so a wasm module or schema file named by -X
// is read again.
func TestReloaderSIGHUPWithoutConfigFile(t *testing.T) {
	hup := make(chan os.Signal, 1)
	got := make(chan string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := startReloader(ctx, slog.New(slog.DiscardHandler), hup, "", false, func(tr string) { got <- tr })
	defer func() { cancel(); <-done }()
	hup <- syscall.SIGHUP
	select {
	case tr := <-got:
		if tr != "SIGHUP" {
			t.Fatalf("trigger %q", tr)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("SIGHUP without --config did not reload")
	}
}
