//go:build !ferry_nocloud

package payloadstore_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ferrykit/ferry/envelope"
	"github.com/ferrykit/ferry/payloadstore"
)

// socketLike is a body that cannot seek (a client's socket): what
// OncePayload wraps.
type socketLike struct{ r io.Reader }

func (s socketLike) Read(p []byte) (int, error) { return s.r.Read(p) }

// stallingReader gives what r holds, then blocks until stop is closed or
// 5 s have passed (a socket whose read deadline the caller sets when the
// publish's context ends: the store cannot unblock a read itself).
type stallingReader struct {
	r    io.Reader
	stop chan struct{}
}

func (s *stallingReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if n == 0 && err == io.EOF {
		select {
		case <-s.stop:
		case <-time.After(5 * time.Second):
		}
		return 0, io.ErrUnexpectedEOF
	}
	return n, err
}

// A ReadOnce payload is published in one pass by the file, mem, encrypted
// and cloud stores through Wrap: the digest comes back from the store, the
// object holds the bytes; a body that ends early, a store that needs the
// digest first (a content id) and a body that stops giving bytes leave
// nothing behind.
func TestOncePayload(t *testing.T) {
	key := randomKeyURL()
	policy := payloadstore.Policy{Timeout: 2 * time.Second, RetryCount: 3, RetryBackoff: time.Millisecond, CustomMetadataMaxBytes: 128}
	stores := map[string]func(t *testing.T) payloadstore.PayloadStore{
		"mem":  func(t *testing.T) payloadstore.PayloadStore { return payloadstore.Wrap(openMem(t), policy) },
		"file": func(t *testing.T) payloadstore.PayloadStore { return payloadstore.Wrap(openFile(t), policy) },
		"mem-encrypted": func(t *testing.T) payloadstore.PayloadStore {
			return payloadstore.Wrap(encrypt(t, openMem(t), envelope.Config{KeyURL: key}, false), policy)
		},
		"s3": func(t *testing.T) payloadstore.PayloadStore {
			return payloadstore.Wrap(openURL(t, s3URL(t, "ferry-conformance")), policy)
		},
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			ctx := context.Background()
			topic := "once-" + name
			body := make([]byte, 6<<20+123)
			rng := rand.NewChaCha8([32]byte{7})
			_, _ = rng.Read(body)
			p := payloadstore.OncePayload(socketLike{bytes.NewReader(body)}, int64(len(body)))
			if !payloadstore.OnePass(s, p) {
				t.Fatal("OnePass is false for a read-once payload with a random id")
			}
			resp, err := s.Publish(ctx, topic, p)
			if err != nil {
				t.Fatal(err)
			}
			if resp.SHA256 != sha256.Sum256(body) {
				t.Fatalf("digest %x, want %x", resp.SHA256, sha256.Sum256(body))
			}
			got, err := payloadstore.DownloadBytes(ctx, s, resp.FullPayloadPath)
			if err != nil || !bytes.Equal(got, body) {
				t.Fatalf("downloaded %d bytes (want %d), equal %v, %v", len(got), len(body), bytes.Equal(got, body), err)
			}
			if err := s.Delete(ctx, resp.FullPayloadPath); err != nil {
				t.Fatal(err)
			}

			// Ends early: one attempt (a retry cannot read it again), nothing left.
			short := payloadstore.OncePayload(socketLike{bytes.NewReader(body[:1<<20])}, int64(len(body)))
			if _, err := s.Publish(ctx, topic, short); err == nil {
				t.Fatal("a body shorter than its size was published")
			}

			// Stops giving bytes: ended after the timeout between reads.
			stop := make(chan struct{})
			defer close(stop)
			stall := payloadstore.OncePayload(&stallingReader{r: bytes.NewReader(body[:1<<20]), stop: stop}, int64(len(body)))
			start := time.Now()
			_, err = s.Publish(ctx, topic, stall)
			if !errors.Is(err, payloadstore.ErrNoProgress) {
				t.Fatalf("a stalled body: %v, want ErrNoProgress", err)
			}
			if d := time.Since(start); d > time.Minute {
				t.Fatalf("a stalled body took %s to fail", d)
			}
			assertEmpty(t, s, topic)
		})
	}

	t.Run("content id", func(t *testing.T) {
		s, err := payloadstore.Open(context.Background(), "mem://once-sha", payloadstore.Options{IDGenerator: payloadstore.IDSHA256{}})
		if err != nil {
			t.Fatal(err)
		}
		s = payloadstore.Wrap(s, policy)
		p := payloadstore.OncePayload(socketLike{bytes.NewReader([]byte("abc"))}, 3)
		if payloadstore.OnePass(s, p) {
			t.Fatal("OnePass is true for a content id")
		}
		if _, err := s.Publish(context.Background(), "t", p); !errors.Is(err, payloadstore.ErrNotRewindable) {
			t.Fatalf("content id: %v, want ErrNotRewindable", err)
		}
	})
}

// assertEmpty fails when topic holds an object.
func assertEmpty(t *testing.T, s payloadstore.PayloadStore, topic string) {
	t.Helper()
	var left []string
	if err := payloadstore.List(context.Background(), s, topic, func(o payloadstore.ObjectInfo) error {
		left = append(left, o.FullPath)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Fatalf("objects left behind: %v", left)
	}
}
