package largemessage_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
)

// The Producer confirms a record's objects after its acknowledgement: an
// object removed while the Produce request was in flight (as ferry gc would
// after its settle time) is published again before the promise, and the
// record resolves. (kfake: the fault, a removal between the publish and the
// append, is injected where the broker receives the request.)
func TestProducerConfirmsAfterAck(t *testing.T) {
	store := payloadstore.NewMemStore("confirm", nil)
	ops, err := payloadstore.Objects(store)
	if err != nil {
		t.Fatal(err)
	}
	var removed atomic.Int64
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		// gc deletes every object of the topic while the request is on
		// its way.
		var keys []string
		_ = ops.ListKeys(context.Background(), "t/", func(key string, _ payloadstore.ObjectInfo) error {
			keys = append(keys, key)
			return nil
		})
		for _, k := range keys {
			if err := ops.Remove(context.Background(), k); err == nil {
				removed.Add(1)
			}
		}
		return nil, nil, false
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cfg := largemessage.DefaultConfig()
	cfg.Threshold = 1024
	p, err := largemessage.NewProducer(cl, store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	value := make([]byte, 8000) // incompressible: offloaded whatever the codec
	if _, err := rand.Read(value); err != nil {
		t.Fatal(err)
	}
	rec := &kgo.Record{Topic: "t", Value: bytes.Clone(value)}
	if err := p.ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if !largemessage.IsOffloaded(rec) {
		t.Fatal("the record was not offloaded")
	}
	if removed.Load() != 1 {
		t.Fatalf("%d objects removed in flight, want 1", removed.Load())
	}
	got := &kgo.Record{Topic: "t", Value: rec.Value, Headers: rec.Headers}
	if err := largemessage.NewDeserializer(store, false).Resolve(ctx, got); err != nil || !bytes.Equal(got.Value, value) {
		t.Fatalf("record after the in-flight removal: %v", err)
	}

	// Produced with the client after PreparePlan, the record's bytes
	// reused meanwhile: Confirm cannot publish other bytes, and says so.
	buf := bytes.Clone(value)
	rec = &kgo.Record{Topic: "t", Value: buf}
	plan, err := p.PreparePlan(ctx, rec)
	if err != nil || plan == nil {
		t.Fatalf("PreparePlan: %v %v", plan, err)
	}
	if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	buf[0] ^= 1
	if _, err := plan.Confirm(ctx); !errors.Is(err, payloadstore.ErrPayloadNotFound) {
		t.Fatalf("Confirm with the bytes changed: %v, want an error wrapping ErrPayloadNotFound", err)
	}
}
