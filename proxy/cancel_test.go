package proxy

import (
	"context"
	"errors"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/interceptor"
)

// blocking is an interceptor (produce or fetch: the two share a method
// set) that waits until its call is cancelled, counting calls entered and
// cancelled, on the topics pattern matches.
type blocking struct {
	entered, cancelled *atomic.Int64
	pattern            *regexp.Regexp
}

func (b blocking) Name() string                 { return "blocking" }
func (b blocking) TopicPattern() *regexp.Regexp { return b.pattern }
func (b blocking) ProcessRecord(ctx context.Context, _ *interceptor.Record) error {
	b.entered.Add(1)
	<-ctx.Done()
	b.cancelled.Add(1)
	return ctx.Err()
}

var blockingEntered, blockingCancelled atomic.Int64

func init() {
	interceptor.Register("test-blocking", func(context.Context, map[string]string) (interceptor.Instance, error) {
		return interceptor.Instance{Produce: blocking{&blockingEntered, &blockingCancelled, regexp.MustCompile(`^blk$`)}}, nil
	})
}

// A client that goes away while an interceptor works on its request gets
// that work cancelled at once, not when the time budget ends.
func TestClientGoneCancelsInterception(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "blk"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := New(Config{Upstream: c.ListenAddrs(), Listen: "127.0.0.1:0", InterceptorTimeout: time.Minute,
		Interceptors: []interceptor.Spec{{Name: "test-blocking"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.RecordRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	cl.Produce(context.Background(), &kgo.Record{Topic: "blk", Value: []byte("v")}, nil)
	deadline := time.Now().Add(10 * time.Second)
	for blockingEntered.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if blockingEntered.Load() == 0 {
		t.Fatal("the interceptor never ran")
	}
	start := time.Now()
	cl.Close() // the client goes away mid-interception
	for blockingCancelled.Load() == 0 && time.Since(start) < 10*time.Second {
		time.Sleep(10 * time.Millisecond)
	}
	if blockingCancelled.Load() == 0 {
		t.Fatal("the interceptor's call was not cancelled when its client went away")
	}
	t.Logf("cancelled %v after the client closed (time budget: 1m)", time.Since(start).Round(time.Millisecond))
}

// A broker that closes the connection instead of answering leaves nothing
// of the budget held: the memory charged for each queued Fetch request's
// limits comes back when the connection closes.
func TestUpstreamCloseGivesBackMemory(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "red"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var fetches atomic.Int64
	c.ControlKey(int16(kmsg.Fetch), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		fetches.Add(1)
		return nil, errors.New("closing"), true
	})
	s, err := New(Config{Upstream: c.ListenAddrs(), Listen: "127.0.0.1:0",
		Interceptors: []interceptor.Spec{{Name: "redact", Config: map[string]string{"topic.pattern": "red", "redact.fields": "a", "side": "fetch"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.ConsumeTopics("red"), kgo.RequestRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	cl.PollFetches(ctx)
	cancel()
	if fetches.Load() == 0 {
		t.Fatal("no Fetch request reached the broker")
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.mem.InUse() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := s.mem.InUse(); n != 0 {
		t.Fatalf("%d bytes of proxy.memory.max.bytes still held after %d Fetch requests met a closed connection", n, fetches.Load())
	}
}
