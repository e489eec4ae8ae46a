package integration

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/largemessage"
)

// A record without a topic goes to the client's kgo.DefaultProduceTopic, as
// kgo itself does, through every entry point of the Producer: its payload is
// published under that topic's folder and it resolves back, against the real
// broker and a file store.
func TestProducerDefaultProduceTopic(t *testing.T) {
	topic := newTopic(t, nil)
	e := setup(t, 0, kgo.DefaultProduceTopic(topic))
	ctx := ctxT(t, 2*time.Minute)
	big := func(seed uint64) []byte { return randomBytes(seed, 2<<20) } // over the default 1 MiB limit

	// Produce / ProduceSync.
	viaSync := &kgo.Record{Key: []byte("sync"), Value: big(1)}
	produceOK(t, e, viaSync)
	// Prepare, then the client's own produce.
	viaPrepare := &kgo.Record{Key: []byte("prepare"), Value: big(2)}
	if _, err := e.prod.Prepare(ctx, viaPrepare); err != nil {
		t.Fatalf("Prepare of a record without a topic: %v", err)
	}
	if err := e.prod.Client().ProduceSync(ctx, viaPrepare).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// ProduceValue with topic "".
	viaValue, err := e.prod.ProduceValue(ctx, "", []byte("value"), big(3))
	if err != nil {
		t.Fatalf("ProduceValue with topic \"\": %v", err)
	}
	for _, r := range []*kgo.Record{viaSync, viaPrepare, viaValue} {
		if r.Topic != topic || !largemessage.IsOffloaded(r) {
			t.Fatalf("record %q: topic %q offloaded %v; want %s, true", r.Key, r.Topic, largemessage.IsOffloaded(r), topic)
		}
	}
	if objs, _ := filepath.Glob(filepath.Join(e.dir, topic, "*", "*")); len(objs) != 3 { // <topic>/<shard>/<id>
		t.Fatalf("store folder %s holds %d objects, want the 3 payloads", topic, len(objs))
	}
	if _, err := os.Stat(filepath.Join(e.dir, "_")); err == nil {
		t.Fatal("a folder for an empty topic name exists")
	}
	got := consumeRaw(t, topic, 3)
	de := largemessage.NewDeserializer(e.store, false)
	for i, r := range got {
		if err := de.Resolve(ctx, r); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(r.Value, big(uint64(i+1))) {
			t.Fatalf("record %d (%q) differs after resolve", i, r.Key)
		}
	}
}

// Without a default topic, a record without a topic that must be offloaded
// fails with ErrNoTopic and publishes nothing.
func TestProducerNoTopic(t *testing.T) {
	e := setup(t, 0)
	_, err := e.prod.Prepare(ctxT(t, time.Minute), &kgo.Record{Value: randomBytes(4, 2<<20)})
	if !errors.Is(err, largemessage.ErrNoTopic) {
		t.Fatalf("Prepare of a record without a topic, no default: %v, want ErrNoTopic", err)
	}
	if ents, _ := os.ReadDir(e.dir); len(ents) != 0 {
		t.Fatalf("the store holds %d entries after a refused record", len(ents))
	}
}
