package payloadstore_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ferrykit/ferry/payloadstore"
)

// A cloud store whose server accepts connections and never answers fails
// the open once OpenTimeout has passed, with a retryable *Error, rather
// than holding it (a helper saw ferry proxy hang at start-up, past
// SIGTERM, with the S3 server stopped).
func TestOpenSilentServerTimesOut(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	var held []net.Conn // accepted, never answered
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	_, err = payloadstore.Open(ctx, "s3://bucket/p?region=us-east-1&use_path_style=true&endpoint=http://"+ln.Addr().String(),
		payloadstore.Options{OpenTimeout: 500 * time.Millisecond})
	took := time.Since(start)
	if err == nil {
		t.Fatal("a store that never answers opened")
	}
	if !payloadstore.IsRetryable(err) {
		t.Errorf("not retryable: %v", err)
	}
	if took > 20*time.Second {
		t.Fatalf("the open took %v with a 500 ms bound", took)
	}
	t.Logf("failed after %v: %v", took.Round(time.Millisecond), err)
}
