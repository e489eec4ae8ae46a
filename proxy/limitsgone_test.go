package proxy

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/largemessage"
)

// A Produce request with interceptors waits for its topics'
// max.message.bytes (a DescribeConfigs the cluster is slow to answer: the
// controller busy, a broker failing over). The wait took
// context.Background() with a 10 s cap: a client that closed its connection
// meanwhile still held the connection's reader, its chain generation and
// its request's memory for those 10 s (and Shutdown with them). It ends
// with the client now, on each path the lookup is made from: the skim of
// a request large-message may leave untouched (the frame still in the read
// buffer), the chain run on the request's goroutine (encrypt: watched only
// once slow), and the chain run under the client's watch.
func TestLimitsLookupEndsWithClient(t *testing.T) {
	for _, tc := range []struct {
		name  string
		specs func(t *testing.T) []interceptor.Spec
	}{
		{"skim", func(t *testing.T) []interceptor.Spec {
			return []interceptor.Spec{{Name: "large-message", Config: map[string]string{
				largemessage.KeyStoreURL: "file://" + t.TempDir(), "topic.pattern": ".*"}}}
		}},
		{"quick", func(*testing.T) []interceptor.Spec { return []interceptor.Spec{encryptSpec("")} }},
		{"watched", func(*testing.T) []interceptor.Spec { return []interceptor.Spec{{Name: "test-counting"}} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			release := make(chan struct{})
			defer close(release)
			asked := make(chan struct{}, 16)
			c.ControlKey(kmsg.DescribeConfigs.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				asked <- struct{}{}
				c.SleepControl(func() { <-release })
				return nil, nil, false // then answered as usual
			})
			s := startProxy(t, Config{Upstream: c.ListenAddrs(), Logger: slog.New(slog.DiscardHandler), Interceptors: tc.specs(t)})
			cl, err := net.DialTimeout("tcp", s.Addr(), time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cl.Write(produceFrame(t, "t")); err != nil {
				t.Fatal(err)
			}
			select {
			case <-asked:
			case <-time.After(10 * time.Second):
				t.Fatal("the proxy asked the cluster for no topic configuration")
			}
			cl.Close()
			closed := time.Now()
			for conns(s) > 0 && time.Since(closed) < 8*time.Second {
				time.Sleep(10 * time.Millisecond)
			}
			if n := conns(s); n > 0 {
				t.Fatalf("%d connections still open %v after their client closed, its request waiting for max.message.bytes", n, time.Since(closed).Round(time.Millisecond))
			}
			t.Logf("the connection ended %v after its client closed", time.Since(closed).Round(time.Millisecond))
		})
	}
}

// conns counts s's client connections.
func conns(s *Server) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// A lookup of topic configurations shared by several callers goes on when
// the caller that started it stops waiting (its client went away): the
// others get the answer, not that caller's cancellation.
func TestLimitsLookupSharedOutlivesItsStarter(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	release := make(chan struct{})
	asked := make(chan struct{}, 16)
	c.ControlKey(kmsg.DescribeConfigs.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		asked <- struct{}{}
		c.SleepControl(func() { <-release })
		return nil, nil, false
	})
	ic, err := newInterception(Config{Upstream: c.ListenAddrs(), DialTimeout: 5 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ic.close()
	first, cancel := context.WithCancel(context.Background())
	firstDone := make(chan map[string]interceptor.TopicLimit, 1)
	go func() { firstDone <- ic.maxMessageBytes(first, []string{"t"}) }()
	<-asked
	second := make(chan map[string]interceptor.TopicLimit, 1)
	go func() { second <- ic.maxMessageBytes(context.Background(), []string{"t"}) }()
	time.Sleep(100 * time.Millisecond) // the second joins the lookup in flight
	cancel()
	select {
	case got := <-firstDone:
		if _, ok := got["t"]; ok {
			t.Errorf("the cancelled caller got %v, want nothing", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the caller whose context ended still waits")
	}
	close(release)
	select {
	case got := <-second:
		if got["t"].MaxMessageBytes <= 0 {
			t.Errorf("the caller that joined the lookup got %v after its starter's context ended, want the topic's limit", got)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the caller that joined the lookup still waits")
	}
}
