package largemessage_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ProduceSync answers in the order of its records, as kgo's does, also
// when one of them cannot be prepared. (kfake is enough here: this checks
// the wrapper's bookkeeping, not Kafka's limits.)
func TestProduceSyncKeepsOrder(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	p, err := largemessage.NewProducer(cl, nil, largemessage.DefaultConfig()) // no store
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs := []*kgo.Record{
		{Topic: "t", Value: []byte("first")},
		{Topic: "t", Value: make([]byte, 2<<20)}, // must be offloaded: no store
		{Topic: "t", Value: []byte("third")},
	}
	res := p.ProduceSync(ctx, recs...)
	if len(res) != 3 {
		t.Fatalf("%d results", len(res))
	}
	for i, r := range res {
		if r.Record != recs[i] {
			t.Fatalf("result %d is for another record", i)
		}
	}
	if res[0].Err != nil || res[2].Err != nil || !errors.Is(res[1].Err, largemessage.ErrNoPayloadStore) {
		t.Fatalf("errors: %v / %v / %v", res[0].Err, res[1].Err, res[2].Err)
	}
	if res[0].Record.Offset != 0 || res[2].Record.Offset != 1 {
		t.Fatalf("offsets %d, %d", res[0].Record.Offset, res[2].Record.Offset)
	}
}

// A record without a topic goes to the client's DefaultProduceTopic, as
// with kgo, and is sized for that topic (not for a topic named "").
func TestProduceDefaultTopic(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "dflt"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("dflt"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	p, err := largemessage.NewProducer(cl, nil, largemessage.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res := p.ProduceSync(ctx, &kgo.Record{Value: []byte("small")}, &kgo.Record{Value: make([]byte, 2<<20)})
	if res[0].Err != nil || res[0].Record.Topic != "dflt" {
		t.Fatalf("small record: topic %q, %v", res[0].Record.Topic, res[0].Err)
	}
	if !errors.Is(res[1].Err, largemessage.ErrNoPayloadStore) || !strings.Contains(res[1].Err.Error(), "topic dflt") {
		t.Fatalf("large record without a store: %v, want ErrNoPayloadStore for topic dflt", res[1].Err)
	}
}
