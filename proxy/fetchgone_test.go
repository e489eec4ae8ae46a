package proxy

import (
	"context"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/interceptor"
)

var fetchEntered, fetchCancelled atomic.Int64

func init() {
	interceptor.Register("test-blocking-fetch", func(context.Context, map[string]string) (interceptor.Instance, error) {
		return interceptor.Instance{Fetch: blocking{&fetchEntered, &fetchCancelled, regexp.MustCompile(`^blkf$`)}}, nil
	})
}

// A consumer that resets its connection (SO_LINGER 0: librdkafka's close, a
// killed process) while the fetch interceptors work on its response gets
// that work cancelled at once: no one will read the response. Before, it
// ran until the time budget (found by a helper: 5 s per such fetch).
func TestClientResetCancelsFetchWork(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "blkf"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	direct, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if err := direct.ProduceSync(context.Background(), &kgo.Record{Topic: "blkf", Value: []byte("v")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	s := startProxy(t, Config{Upstream: c.ListenAddrs(), InterceptorTimeout: time.Minute,
		Interceptors: []interceptor.Spec{{Name: "test-blocking-fetch"}}})
	conn := dialLinger0(t, s.Addr())
	req := kmsg.NewPtrFetchRequest()
	req.Version = 12
	req.MaxWaitMillis = 100
	req.MaxBytes = 1 << 20
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic = "blkf"
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.PartitionMaxBytes = 1 << 20
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	before := fetchEntered.Load()
	if _, err := conn.Write(kmsg.NewRequestFormatter(kmsg.FormatterClientID("gone")).AppendRequest(nil, req, 1)); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); fetchEntered.Load() == before; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the fetch interceptor never ran")
		}
	}
	cancelled := fetchCancelled.Load()
	start := time.Now()
	_ = conn.Close() // a reset: the socket is gone
	for fetchCancelled.Load() == cancelled {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the fetch interceptor's call still running %v after its client reset the connection (time budget: 1m)", time.Since(start))
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("cancelled %v after the client reset (time budget: 1m)", time.Since(start).Round(time.Millisecond))
}
