package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/ferrykit/ferry/interceptor"
)

// countingWriter records each Write's size and implements no ReaderFrom,
// so stream's splice path falls back to io.CopyN.
type countingWriter struct {
	buf    bytes.Buffer
	writes []int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.writes = append(w.writes, len(p))
	return w.buf.Write(p)
}

// TestStreamFrame: stream forwards a frame's bytes exactly whatever its size
// (within the reader's buffer, read whole through a pooled buffer, spliced),
// in one write up to copyMax when the budget has room, the budget back to
// zero afterwards; without room it streams in parts; a frame that ends early
// is io.ErrUnexpectedEOF, and a frame read whole writes nothing of it then.
func TestStreamFrame(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		name   string
		n      int
		budget int64
		writes int // -1: more than one
	}{
		{"buffered", 1000, 1 << 20, 1},
		{"copied", 46 << 10, 1 << 20, 1},
		{"copied at copyMax", copyMax, 1 << 20, 1},
		{"spliced over copyMax", copyMax + 1, 1 << 20, -1},
		{"no room in the budget", 46 << 10, 32 << 10, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			frame := make([]byte, tc.n)
			for i := range frame {
				frame[i] = byte(rng.Uint32())
			}
			next := []byte("next frame")
			src := bytes.NewReader(append(append([]byte{}, frame...), next...))
			r := bufio.NewReaderSize(src, readerSize)
			if _, err := r.Peek(min(tc.n, readerSize)); err != nil {
				t.Fatal(err)
			}
			mem := interceptor.NewMemory(tc.budget)
			var w countingWriter
			if err := stream(&w, r, src, int64(tc.n), mem); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(w.buf.Bytes(), frame) {
				t.Fatalf("forwarded %d bytes, not the frame's %d", w.buf.Len(), tc.n)
			}
			if tc.writes > 0 && len(w.writes) != tc.writes || tc.writes < 0 && len(w.writes) < 2 {
				t.Fatalf("writes %v, want %d (-1: more than one)", w.writes, tc.writes)
			}
			if got := mem.InUse(); got != 0 {
				t.Fatalf("budget in use after the frame: %d bytes", got)
			}
			rest, _ := io.ReadAll(io.MultiReader(r, src))
			if !bytes.Equal(rest, next) {
				t.Fatalf("after the frame the reader holds %q, want %q", rest, next)
			}
		})
	}
	for _, n := range []int{1000, 46 << 10, copyMax + 1} {
		short := make([]byte, n-10)
		src := bytes.NewReader(short)
		r := bufio.NewReaderSize(src, readerSize)
		mem := interceptor.NewMemory(1 << 20)
		var w countingWriter
		err := stream(&w, r, src, int64(n), mem)
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("%d-byte frame cut short: err %v, want io.ErrUnexpectedEOF", n, err)
		}
		if n <= copyMax && w.buf.Len() != 0 {
			t.Fatalf("%d-byte frame cut short: %d bytes forwarded, want none", n, w.buf.Len())
		}
		if got := mem.InUse(); got != 0 {
			t.Fatalf("budget in use after a short frame: %d bytes", got)
		}
	}
}
