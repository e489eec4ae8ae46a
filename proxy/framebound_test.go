package proxy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ferrykit/ferry/interceptor"
)

// produceFrameOf is a Produce v9 frame of exactly size bytes after its
// prefix: acks 1, topic "other", one uncompressed batch of 500 KB values.
func produceFrameOf(t *testing.T, size int) []byte {
	t.Helper()
	build := func(last int) []byte {
		var values []string
		for left := size; left > 500_000; left -= 500_000 {
			values = append(values, strings.Repeat("v", 500_000))
		}
		values = append(values, strings.Repeat("w", last))
		return produceV9FrameTo("other", 1, "c", 1, values...)
	}
	last := 1000
	for range 5 {
		f := build(last)
		if len(f)-4 == size {
			return f
		}
		last += size - (len(f) - 4)
	}
	t.Fatalf("no Produce frame of %d bytes", size)
	return nil
}

// Produce frames up to socket.request.max.bytes with proxy.memory.max.bytes
// as small as it may be (the same): a frame over half the budget is read
// (its buffer used to double past the budget, holding the old one while
// the new one was charged: the read whole waited for good, the streaming
// reader refused it at the frame's last bytes), and one that needs more
// than the whole budget with its decoding closes its connection at once
// rather than waiting, holding the budget, for room it holds itself. The
// budget is back at zero after each, and the proxy serves on.
func TestProduceFrameNearMemoryBound(t *testing.T) {
	const limit = 8 << 20
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "big", "other"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	specs := map[string]interceptor.Spec{
		"read whole": encryptSpec("big"),
		"streaming":  spec("large-message", "big", "large.message.payload.store.url", "file://"+t.TempDir()),
	}
	for name, ic := range specs {
		t.Run(name, func(t *testing.T) {
			s, err := New(Config{Upstream: c.ListenAddrs(), Listen: "127.0.0.1:0", MaxRequestBytes: limit, MemoryMax: limit,
				Logger: slog.New(slog.DiscardHandler), Interceptors: []interceptor.Spec{ic}})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				s.Shutdown(ctx)
			}()
			for _, tc := range []struct {
				size     int
				answered bool
			}{{limit/2 + 100_000, true}, {limit * 3 / 4, true}, {limit - 10, false}} {
				conn, err := net.Dial("tcp", s.Addr())
				if err != nil {
					t.Fatal(err)
				}
				_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
				_, _ = conn.Write(produceFrameOf(t, tc.size))
				var b [4]byte
				_, err = io.ReadFull(conn, b[:])
				conn.Close()
				switch {
				case errors.Is(err, os.ErrDeadlineExceeded):
					t.Fatalf("a Produce frame of %d bytes (socket.request.max.bytes and proxy.memory.max.bytes %d): neither answered nor closed in 10 s", tc.size, limit)
				case tc.answered && err != nil:
					t.Fatalf("a Produce frame of %d bytes (socket.request.max.bytes and proxy.memory.max.bytes %d): %v, want an answer", tc.size, limit, err)
				}
				deadline := time.Now().Add(5 * time.Second)
				for s.mem.InUse() != 0 && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				if n := s.mem.InUse(); n != 0 {
					t.Fatalf("after a frame of %d bytes: %d bytes of the budget still held", tc.size, n)
				}
			}
		})
	}
}
