package ctxio

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
)

func TestReaderStopsWhenContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	r := Reader(ctx, bytes.NewReader([]byte("payload")))
	buf := make([]byte, 3)
	if n, err := r.Read(buf); n != 3 || err != nil {
		t.Fatalf("read %d, %v", n, err)
	}
	cancel()
	if _, err := io.ReadAll(r); !errors.Is(err, context.Canceled) {
		t.Fatalf("after cancel: %v", err)
	}
}
