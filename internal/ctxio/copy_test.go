package ctxio

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"testing/iotest"
)

func randomBytes(n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{7})
	r.Read(b)
	return b
}

// onlyReader hides every method but Read (no WriterTo fast path).
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

func TestCopySizes(t *testing.T) {
	for _, n := range []int{0, 1, BufferSize - 1, BufferSize, BufferSize + 1, 7*BufferSize/2 + 3, 9 * BufferSize} {
		data := randomBytes(n)
		for name, src := range map[string]io.Reader{
			"reader":      onlyReader{bytes.NewReader(data)},
			"small reads": iotest.HalfReader(onlyReader{bytes.NewReader(data)}),
			"data+EOF":    iotest.DataErrReader(onlyReader{bytes.NewReader(data)}),
			"bytes":       bytes.NewReader(data),
		} {
			var out bytes.Buffer
			got, err := Copy(context.Background(), &out, src)
			if err != nil || got != int64(n) || !bytes.Equal(out.Bytes(), data) {
				t.Fatalf("%s, %d bytes: copied %d (%d out), %v", name, n, got, out.Len(), err)
			}
		}
	}
}

// The bytes that come with a read error are written, then the error is
// returned (as io.Copy does).
func TestCopyReadError(t *testing.T) {
	boom := errors.New("boom")
	data := randomBytes(3*BufferSize + 5)
	src := io.MultiReader(onlyReader{bytes.NewReader(data)}, iotest.ErrReader(boom))
	var out bytes.Buffer
	n, err := Copy(context.Background(), &out, src)
	if !errors.Is(err, boom) || n != int64(len(data)) || !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("copied %d, %v; want %d then boom", n, err, len(data))
	}
}

type failWriter struct {
	left int
	err  error
}

func (w *failWriter) Write(p []byte) (int, error) {
	if w.left <= 0 {
		return 0, w.err
	}
	w.left--
	return len(p), nil
}

type shortWriter struct{}

func (shortWriter) Write(p []byte) (int, error) { return len(p) / 2, nil }

// countingReader counts the bytes read from it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// A write error stops the copy at once.
func TestCopyWriteError(t *testing.T) {
	full := errors.New("disk full")
	src := &countingReader{r: onlyReader{bytes.NewReader(randomBytes(64 * BufferSize))}}
	n, err := Copy(context.Background(), &failWriter{left: 2, err: full}, src)
	if !errors.Is(err, full) || n != 2*BufferSize {
		t.Fatalf("copied %d, %v; want %d then disk full", n, err, 2*BufferSize)
	}
	if src.n != 3*BufferSize {
		t.Fatalf("read %d bytes; the write failed at the third buffer", src.n)
	}
	if _, err := Copy(context.Background(), shortWriter{}, onlyReader{bytes.NewReader(randomBytes(10))}); !errors.Is(err, io.ErrShortWrite) {
		t.Fatalf("short write: %v", err)
	}
}

// cancelAfter cancels its context once n reads happened.
type cancelAfter struct {
	r      io.Reader
	n      int
	cancel context.CancelFunc
}

func (c *cancelAfter) Read(p []byte) (int, error) {
	c.n--
	if c.n == 0 {
		c.cancel()
	}
	return c.r.Read(p)
}

func TestCopyStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	src := &cancelAfter{r: onlyReader{bytes.NewReader(randomBytes(16 * BufferSize))}, n: 3, cancel: cancel}
	n, err := Copy(ctx, io.Discard, src)
	if !errors.Is(err, context.Canceled) || n >= 16*BufferSize {
		t.Fatalf("copied %d, %v; want it stopped by the context", n, err)
	}
	if _, err := Copy(ctx, io.Discard, bytes.NewReader([]byte("x"))); !errors.Is(err, context.Canceled) {
		t.Fatalf("copy with an ended context: %v", err)
	}
}
