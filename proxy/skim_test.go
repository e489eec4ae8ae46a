package proxy

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/largemessage"
)

// Through a proxy with large-message (threshold 4 KiB), small records are
// skimmed and pass as they came, while a large one in a frame of the same
// size class is offloaded, and every value reads back through the proxy.
func TestProxySkimPassesSmallOffloadsLarge(t *testing.T) {
	dir := t.TempDir()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "lm"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	s, err := New(Config{Upstream: c.ListenAddrs(), Listen: "127.0.0.1:0",
		Interceptors: []interceptor.Spec{{Name: "large-message", Config: map[string]string{
			largemessage.KeyStoreURL: "file://" + dir, largemessage.KeyThreshold: "4096"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	values := [][]byte{[]byte("a"), randomValue(1, 1000), randomValue(2, 10000), []byte("b")}
	for _, v := range values {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "lm", Value: v}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	objects := 0
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			objects++
		}
		return nil
	})
	if objects != 1 {
		t.Fatalf("%d objects in the store, want 1 (the 10000-byte value)", objects)
	}
	// On the broker: the small values as produced, the large one a reference.
	direct := consume(t, c.ListenAddrs()[0], "lm", len(values), 30*time.Second)
	if len(direct) != len(values) {
		t.Fatalf("read %d records from the broker", len(direct))
	}
	for i, r := range direct {
		if large := largemessage.IsOffloaded(r); large != (i == 2) || !large && !bytes.Equal(r.Value, values[i]) {
			t.Fatalf("record %d on the broker: offloaded %v, %d bytes", i, large, len(r.Value))
		}
	}
	got := consume(t, s.Addr(), "lm", len(values), 30*time.Second)
	if len(got) != len(values) {
		t.Fatalf("read %d records through the proxy", len(got))
	}
	for i, r := range got {
		if !bytes.Equal(r.Value, values[i]) || len(r.Headers) != 0 {
			t.Fatalf("record %d through the proxy: %d bytes, headers %v", i, len(r.Value), r.Headers)
		}
	}
}
