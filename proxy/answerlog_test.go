package proxy

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/largemessage"
)

// A partition the produce chain answers is logged at info when the
// client's records are refused, and at warn when a dependency failed (a
// store that cannot be written: KAFKA_STORAGE_ERROR); the line gives the
// Kafka error's name and the cause, without KAFKA_STORAGE_ERROR's own text,
// which speaks of a disk (a new user read "Disk error" for a KMS outage).
func TestProduceAnswerLogged(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "big", "other"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dir := filepath.Join(t.TempDir(), "store")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	logs := &logCounter{}
	s := startProxy(t, Config{Upstream: c.ListenAddrs(), Logger: slog.New(logs), Interceptors: []interceptor.Spec{
		{Name: "validate-json", Config: map[string]string{"topic.pattern": ".*"}},
		{Name: "large-message", Config: map[string]string{largemessage.KeyStoreURL: "file://" + dir, largemessage.KeyThreshold: "100000", "topic.pattern": ".*"}}}})
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.ProducerBatchMaxBytes(4<<20), kgo.RecordDeliveryTimeout(3*time.Second),
		kgo.RecordRetries(1))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const msg = "produce interceptor answered a partition"
	answered := func(level slog.Level) map[string]string {
		t.Helper()
		logs.mu.Lock()
		defer logs.mu.Unlock()
		for _, r := range logs.recs {
			if r.Level != level || !strings.HasPrefix(r.Message, msg) {
				continue
			}
			attrs := map[string]string{}
			r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
			return attrs
		}
		return nil
	}

	// The client's fault: a value that is not JSON.
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "big", Value: []byte("not json")}).FirstErr(); err == nil {
		t.Fatal("a value that is not JSON was accepted")
	}
	a := answered(slog.LevelInfo)
	if a == nil || a["error"] != "INVALID_RECORD" || strings.HasPrefix(a["err"], "INVALID_RECORD") {
		t.Fatalf("the refused record's line at info: %v, want error=INVALID_RECORD and the cause alone", a)
	}
	if answered(slog.LevelWarn) != nil {
		t.Fatal("a refused record logged at warn")
	}

	// The store's fault: its directory replaced by a file.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, []byte("not a directory"), 0o644); err != nil {
		t.Fatal(err)
	}
	big := &kgo.Record{Topic: "other", Value: []byte(`{"v":"` + strings.Repeat("x", 2<<20) + `"}`)}
	if err := cl.ProduceSync(ctx, big).FirstErr(); err == nil {
		t.Fatal("a record offloaded to a broken store was acknowledged")
	}
	a = answered(slog.LevelWarn)
	if a == nil || a["error"] != kerr.KafkaStorageError.Message || strings.Contains(a["err"], "Disk error") || a["topic"] != "other" {
		t.Fatalf("the store's failure at warn: %v, want error=KAFKA_STORAGE_ERROR and the store's cause alone", a)
	}
}
