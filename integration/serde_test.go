package integration

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ferrykit/ferry/largemessage"
)

// value.serializers=json,large-message: a 3 MB JSON document is encoded,
// offloaded, and decoded back by value.deserializers=large-message,json.
func TestJSONChainThroughRealBroker(t *testing.T) {
	b := brokers(t)
	topic := newTopic(t, nil)
	dir := t.TempDir()
	cfg, err := largemessage.ParseConfig(map[string]string{
		"bootstrap.servers":               b,
		"large.message.payload.store.url": "file://" + dir,
		"key.serializers":                 "string",
		"value.serializers":               "json,large-message",
		"key.deserializers":               "string",
		"value.deserializers":             "large-message,json",
	})
	if err != nil {
		t.Fatal(err)
	}
	store, err := cfg.OpenStore(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	prod, err := largemessage.NewProducer(client(t), store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	doc := map[string]any{"id": "row-1", "blob": strings.Repeat("x9", 1_500_000), "n": 42.0}
	rec, err := prod.ProduceValue(ctxT(t, time.Minute), topic, "row-1", doc)
	if err != nil {
		t.Fatal(err)
	}
	if !largemessage.IsOffloaded(rec) {
		t.Fatal("3 MB JSON value was not offloaded")
	}
	cons := largemessage.NewConsumer(nil, largemessage.NewDeserializer(store, false)).WithDeserializers(cfg.KeyDeserializers, cfg.ValueDeserializers)
	got := cons.Resolve(ctxT(t, time.Minute), consumeRaw(t, topic, 1))
	key, value, err := cons.Decode(ctxT(t, time.Minute), got[0])
	if err != nil {
		t.Fatal(err)
	}
	if key != "row-1" || !reflect.DeepEqual(value, doc) {
		t.Fatalf("decoded key %v, value equal %v", key, reflect.DeepEqual(value, doc))
	}
}
