package cli

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// ferry consume applies large.message.reference.resolve.topics: a record
// of topic t referencing an object of topic a is refused without it and
// resolved with it.
func TestConsumeResolveTopics(t *testing.T) {
	_, brokers := cluster(t)
	dir := t.TempDir()
	store := filepath.Join(dir, "store")
	big, sum := randomFile(t, dir, "big", 2<<20, 25)
	if r := run(t, nil, "produce", "--brokers", brokers, "-t", "a", "--store", store, big); r.code != 0 {
		t.Fatalf("produce: exit %d", r.code)
	}
	// Copy the reference record, as is, from a to t.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics("a"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	fs := cl.PollRecords(ctx, 1)
	if err := fs.Err0(); err != nil || len(fs.Records()) != 1 {
		t.Fatalf("reading a: %v, %d records", err, len(fs.Records()))
	}
	ref := fs.Records()[0]
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "t", Key: ref.Key, Value: ref.Value, Headers: ref.Headers}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	out := filepath.Join(dir, "out")
	r := run(t, nil, "consume", "--brokers", brokers, "-t", "t", "--store", store, "--out", out, "-n", "1")
	if r.code != 1 {
		t.Errorf("without the property: exit %d, want 1", r.code)
	}
	r = run(t, nil, "consume", "--brokers", brokers, "-t", "t", "--store", store, "--out", out, "-n", "1",
		"-X", "large.message.reference.resolve.topics=a")
	if r.code != 0 || fileSHA(t, filepath.Join(out, "t-0-0")) != sum {
		t.Fatalf("with large.message.reference.resolve.topics=a: exit %d", r.code)
	}
}
