package ctxio

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"testing/iotest"
)

func TestPipeCopySizes(t *testing.T) {
	for _, n := range []int{0, 1, PipeBufferSize - 1, PipeBufferSize, PipeBufferSize + 1, 7*PipeBufferSize/2 + 3, 3 * PipeBuffers * PipeBufferSize} {
		data := randomBytes(n)
		for name, src := range map[string]io.Reader{
			"reader":      onlyReader{bytes.NewReader(data)},
			"small reads": iotest.HalfReader(onlyReader{bytes.NewReader(data)}),
			"one byte":    iotest.OneByteReader(onlyReader{bytes.NewReader(data[:min(n, 3*PipeBuffers)])}),
			"data+EOF":    iotest.DataErrReader(onlyReader{bytes.NewReader(data)}),
		} {
			want := data
			if name == "one byte" {
				want = data[:min(n, 3*PipeBuffers)]
			}
			var out bytes.Buffer
			got, err := PipeCopy(context.Background(), &out, src)
			if err != nil || got != int64(len(want)) || !bytes.Equal(out.Bytes(), want) {
				t.Fatalf("%s, %d bytes: copied %d (%d out), %v", name, len(want), got, out.Len(), err)
			}
		}
	}
}

// The bytes that come with a read error are written, then the error is
// returned (as io.Copy does).
func TestPipeCopyReadError(t *testing.T) {
	boom := errors.New("boom")
	data := randomBytes(3*PipeBufferSize + 5)
	src := io.MultiReader(onlyReader{bytes.NewReader(data)}, iotest.DataErrReader(iotest.ErrReader(boom)))
	var out bytes.Buffer
	n, err := PipeCopy(context.Background(), &out, src)
	if !errors.Is(err, boom) || n != int64(len(data)) || !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("copied %d, %v; want %d then boom", n, err, len(data))
	}
	// A read that returns bytes and an error together: both count.
	src = iotest.TimeoutReader(onlyReader{bytes.NewReader(data)}) // second read: ErrTimeout
	out.Reset()
	n, err = PipeCopy(context.Background(), &out, src)
	if !errors.Is(err, iotest.ErrTimeout) || n != PipeBufferSize || !bytes.Equal(out.Bytes(), data[:PipeBufferSize]) {
		t.Fatalf("copied %d, %v; want %d then a timeout", n, err, PipeBufferSize)
	}
}

// A write error stops the reads within PipeBuffers reads and is returned
// (not a later read error); the count is of the bytes written.
func TestPipeCopyWriteError(t *testing.T) {
	full := errors.New("disk full")
	src := &countingReader{r: onlyReader{bytes.NewReader(randomBytes(64 * PipeBufferSize))}}
	n, err := PipeCopy(context.Background(), &failWriter{left: 2, err: full}, src)
	if !errors.Is(err, full) || n != 2*PipeBufferSize {
		t.Fatalf("copied %d, %v; want %d then disk full", n, err, 2*PipeBufferSize)
	}
	if src.n > int64(3+PipeBuffers)*PipeBufferSize {
		t.Fatalf("read %d bytes; the write failed at the third buffer, so at most %d more reads were due", src.n, PipeBuffers)
	}
	if _, err := PipeCopy(context.Background(), shortWriter{}, onlyReader{bytes.NewReader(randomBytes(10))}); !errors.Is(err, io.ErrShortWrite) {
		t.Fatalf("short write: %v", err)
	}
}

func TestPipeCopyStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	src := &cancelAfter{r: onlyReader{bytes.NewReader(randomBytes(16 * PipeBufferSize))}, n: 3, cancel: cancel}
	var out bytes.Buffer
	n, err := PipeCopy(ctx, &out, src)
	if !errors.Is(err, context.Canceled) || n != 3*PipeBufferSize || out.Len() != 3*PipeBufferSize {
		t.Fatalf("copied %d (%d out), %v; want the 3 buffers read, then stopped by the context", n, out.Len(), err)
	}
	if _, err := PipeCopy(ctx, io.Discard, bytes.NewReader([]byte("x"))); !errors.Is(err, context.Canceled) {
		t.Fatalf("copy with an ended context: %v", err)
	}
}

// gateWriter blocks each Write until the test lets it go, and counts the
// writes under way at once.
type gateWriter struct {
	gate       chan struct{}
	busy, peak atomic.Int32
	wrote      atomic.Int64
}

func (g *gateWriter) Write(p []byte) (int, error) {
	if b := g.busy.Add(1); b > g.peak.Load() {
		g.peak.Store(b)
	}
	<-g.gate
	g.busy.Add(-1)
	g.wrote.Add(int64(len(p)))
	return len(p), nil
}

// atomicCountingReader counts the bytes read from it, for another
// goroutine to see.
type atomicCountingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *atomicCountingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// The reads run ahead of a blocked write by at most PipeBuffers buffers
// (the copy's memory bound), and resume as the writes are let go.
func TestPipeCopyReadsAheadOfWrites(t *testing.T) {
	data := randomBytes(4 * PipeBuffers * PipeBufferSize)
	src := &atomicCountingReader{r: onlyReader{bytes.NewReader(data)}}
	w := &gateWriter{gate: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := PipeCopy(context.Background(), w, src)
		done <- err
	}()
	// Let one write through at a time; the reader may be at most
	// PipeBuffers buffers (one being written, the rest queued) ahead.
	for {
		select {
		case err := <-done:
			if err != nil || w.wrote.Load() != int64(len(data)) {
				t.Fatalf("copied %d of %d bytes, %v", w.wrote.Load(), len(data), err)
			}
			if w.peak.Load() != 1 {
				t.Fatalf("%d writes at once; want one writer", w.peak.Load())
			}
			return
		case w.gate <- struct{}{}:
			if ahead := src.n.Load() - w.wrote.Load(); ahead > int64(PipeBuffers)*PipeBufferSize {
				t.Fatalf("the reads ran %d bytes ahead of the writes; the bound is %d", ahead, PipeBuffers*PipeBufferSize)
			}
		}
	}
}
