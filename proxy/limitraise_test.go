package proxy

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/interceptor"
)

// A topic's max.message.bytes raised after the proxy refused a batch over
// it (the usual answer to MESSAGE_TOO_LARGE) applies to the first batch a
// second after the refusal, not after topic.config.refresh.ms (60 s by
// default: a helper saw the old limit still applied 50 s after the raise).
func TestRaisedLimitReadAgain(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	direct, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	adm := kadm.NewClient(direct)
	small, large := "3000", "100000"
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"max.message.bytes": &small}, "t"); err != nil {
		t.Fatal(err)
	}
	s := startProxy(t, Config{Upstream: c.ListenAddrs(), Logger: slog.New(slog.DiscardHandler), Interceptors: []interceptor.Spec{encryptSpec("")}})
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.DefaultProduceTopic("t"), kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	value := []byte(strings.Repeat("v", 2900)) // fits 3000 as sent, not once sealed
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: value}).FirstErr(); !errors.Is(err, kerr.MessageTooLarge) {
		t.Fatalf("a sealed record over the topic's 3000 bytes: %v, want MESSAGE_TOO_LARGE", err)
	}
	if _, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "max.message.bytes", Value: &large}}, "t"); err != nil {
		t.Fatal(err)
	}
	// The first batch after a second is accepted: the refusal made the
	// cached limit expire a second after it was read (a helper's producer
	// that resent once, 4 s after the raise, was refused again).
	time.Sleep(limitRecheck + 100*time.Millisecond)
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: value}).FirstErr(); err != nil {
		t.Fatalf("%v after the limit was raised: %v", limitRecheck+100*time.Millisecond, err)
	}
}
