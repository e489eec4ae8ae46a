package largemessage_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ResolveKey restores an offloaded key and leaves the offloaded value as
// fetched, for OpenValue to stream.
func TestResolveKeyLeavesValue(t *testing.T) {
	store := payloadstore.NewMemStore(t.Name(), nil)
	ctx := context.Background()
	key, value := bytes.Repeat([]byte("k"), 5000), bytes.Repeat([]byte("v"), 6000)
	rec := &kgo.Record{Topic: "t", Key: bytes.Clone(key), Value: bytes.Clone(value)}
	ser := largemessage.NewSerializer(store, largemessage.Codec{})
	if did, err := ser.Offload(ctx, rec, largemessage.Limits{Threshold: 1000}); err != nil || !did.Key || !did.Value {
		t.Fatalf("offload: %+v %v", did, err)
	}
	de := largemessage.NewDeserializer(store, false)
	if err := de.ResolveKey(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(rec.Key, key) || largemessage.IsKeyOffloaded(rec) {
		t.Fatal("key not resolved")
	}
	if !largemessage.IsOffloaded(rec) || bytes.Equal(rec.Value, value) {
		t.Fatal("ResolveKey touched the value")
	}
	if err := de.Resolve(ctx, rec); err != nil || !bytes.Equal(rec.Value, value) {
		t.Fatalf("value: %v", err)
	}
}
