package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// reloadDebounce is how long the config file's directory must be quiet
// after a change before the proxy reloads: an editor's write-and-rename or
// a ConfigMap's symlink swap is several events, and one reload.
const reloadDebounce = 300 * time.Millisecond

// configVersion names a config file's contents: the first 16 hex digits of
// its SHA-256 (compare with `sha256sum FILE`), shown in the proxy's
// ferry_proxy_config_info metric and reload logs.
func configVersion(raw []byte) string {
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:8])
}

// startReloader calls reload on each SIGHUP (from hup; with or without a
// config file) and, when watch is
// set, whenever the contents of configFile change. The file's directory is
// watched, not the file (an editor replaces the file by a rename, and
// Kubernetes updates a mounted ConfigMap by swapping a symlink of the
// directory), and the contents are compared after reloadDebounce of quiet,
// so a change is one reload and a touch none. It stops when ctx ends; the
// returned channel is closed then.
func startReloader(ctx context.Context, log *slog.Logger, hup <-chan os.Signal, configFile string, watch bool, reload func(trigger string)) <-chan struct{} {
	done := make(chan struct{})
	var events <-chan fsnotify.Event
	var errs <-chan error
	last := ""
	if watch {
		if raw, err := os.ReadFile(configFile); err == nil {
			last = configVersion(raw)
		}
		w, err := fsnotify.NewWatcher()
		if err == nil {
			dirs := []string{filepath.Dir(configFile)}
			if real, err := filepath.EvalSymlinks(configFile); err == nil && filepath.Dir(real) != dirs[0] {
				dirs = append(dirs, filepath.Dir(real))
			}
			for _, d := range dirs {
				if err = w.Add(d); err != nil {
					break
				}
			}
		}
		if err != nil {
			log.Warn("cannot watch the config file; reload it with SIGHUP", "config", configFile, "err", err)
			if w != nil {
				w.Close()
			}
		} else {
			events, errs = w.Events, w.Errors
			go func() { <-ctx.Done(); w.Close() }()
		}
	}
	go func() {
		defer close(done)
		timer := time.NewTimer(time.Hour)
		timer.Stop()
		for {
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-hup:
				// Without --config the chain is built again from the
				// flags: what the interceptors read from files (a wasm
				// module, a JSON Schema file) is read again, as the README
				// promises for `--interceptors wasm -X wasm.module.path=…`.
				if configFile != "" {
					if raw, err := os.ReadFile(configFile); err == nil {
						last = configVersion(raw)
					}
				}
				reload("SIGHUP")
			case _, ok := <-events:
				if !ok {
					events = nil
					continue
				}
				timer.Reset(reloadDebounce)
			case err, ok := <-errs:
				if !ok {
					errs = nil
					continue
				}
				log.Warn("config file watch", "err", err)
			case <-timer.C:
				raw, err := os.ReadFile(configFile)
				if err != nil {
					// Mid-swap, or removed: the next event retries; a file
					// that stays away is reported by the reload's error.
					log.Debug("config file unreadable after a change", "err", err)
					continue
				}
				if v := configVersion(raw); v != last {
					last = v
					reload("file change")
				}
			}
		}
	}()
	return done
}
