package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
)

// TestStreamFrame: stream forwards exactly a frame's bytes, whether all of
// it is in the reader's buffer, part of it, or none, to a writer with and
// without io.ReaderFrom (the splice path and its fallback), leaves the next
// frame where it was, and reports a frame that ends early as
// io.ErrUnexpectedEOF on every path; its progress is called before each
// streamChunk bytes.
func TestStreamFrame(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1000, readerSize, 46 << 10, 1 << 20, 5 << 19} {
		for _, buffered := range []int{0, min(n, readerSize)} {
			for _, readerFrom := range []bool{false, true} {
				frame := make([]byte, n)
				for i := range frame {
					frame[i] = byte(rng.Uint32())
				}
				next := []byte("next frame")
				src := bytes.NewReader(append(append([]byte{}, frame...), next...))
				r := bufio.NewReaderSize(src, readerSize)
				if buffered > 0 {
					if _, err := r.Peek(buffered); err != nil {
						t.Fatal(err)
					}
				}
				var out bytes.Buffer
				var dst io.Writer = struct{ io.Writer }{&out} // no ReaderFrom
				if readerFrom {
					dst = &out
				}
				calls := 0
				if err := stream(dst, r, src, int64(n), func() { calls++ }); err != nil {
					t.Fatalf("%d bytes, %d buffered: %v", n, buffered, err)
				}
				if want := (n - buffered + streamChunk - 1) / streamChunk; calls < want {
					t.Fatalf("%d bytes, %d buffered: progress called %d times, want at least %d", n, buffered, calls, want)
				}
				if !bytes.Equal(out.Bytes(), frame) {
					t.Fatalf("%d bytes, %d buffered, ReaderFrom %v: forwarded %d bytes, not the frame", n, buffered, readerFrom, out.Len())
				}
				rest, _ := io.ReadAll(io.MultiReader(r, src))
				if !bytes.Equal(rest, next) {
					t.Fatalf("%d bytes, %d buffered: after the frame the reader holds %q, want %q", n, buffered, rest, next)
				}

				src = bytes.NewReader(frame[:n-10])
				r = bufio.NewReaderSize(src, readerSize)
				if _, err := r.Peek(min(buffered, n-10)); buffered > 0 && err != nil {
					t.Fatal(err)
				}
				out.Reset()
				if err := stream(dst, r, src, int64(n), func() {}); !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("%d-byte frame cut short, %d buffered, ReaderFrom %v: err %v, want io.ErrUnexpectedEOF", n, buffered, readerFrom, err)
				}
			}
		}
	}
}
