package wasm

import (
	"bytes"
	"log/slog"
	"sync"
	"time"
)

// Bounds of a module's stdout and stderr in the proxy's log.
const (
	logLineMax    = 1024 // bytes of one logged line; the rest is cut
	logLinesPerS  = 10   // lines logged per second and module; the rest counted
	logPendingMax = logLineMax
)

// logWriter puts a module's stdout and stderr into the proxy's log, one
// line per entry, bounded and rate limited (a module printing in a loop
// costs the log little), so that a guest's panic message is visible.
type logWriter struct {
	module  string
	mu      sync.Mutex
	line    []byte
	cut     bool
	window  time.Time
	n       int
	dropped int
}

func newLogWriter(module string) *logWriter { return &logWriter{module: module} }

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		chunk := p
		if i >= 0 {
			chunk = p[:i]
		}
		take := min(len(chunk), logPendingMax-len(w.line))
		w.line = append(w.line, chunk[:take]...)
		if take < len(chunk) {
			w.cut = true
		}
		if i < 0 {
			break
		}
		w.flush()
		p = p[i+1:]
	}
	return n, nil
}

// flush logs the pending line, within the rate.
func (w *logWriter) flush() {
	now := time.Now()
	if now.Sub(w.window) >= time.Second {
		if w.dropped > 0 {
			slog.Warn("wasm module output dropped (rate limited)", "module", w.module, "lines", w.dropped)
		}
		w.window, w.n, w.dropped = now, 0, 0
	}
	if w.n < logLinesPerS {
		w.n++
		slog.Info("wasm module output", "module", w.module, "line", string(w.line), "cut", w.cut)
	} else {
		w.dropped++
	}
	w.line, w.cut = w.line[:0], false
}
