package proxy

import (
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/internal/faultproxy"
)

// A small Produce request that only inline built-ins see is not watched
// for its client from the start (interceptor.Chain.QuickProduce), but from
// when it turns out slow (interceptor.WithSlowRequest): a call that has run
// 5 ms, seen by the chain's inline watchdog, which looks every budget/8.
// With a KMS that accepts connections and never answers, a client that
// sends sixteen topics' first records (sixteen data keys to wrap) and goes
// away holds the proxy about a watchdog look, not every partition's budget.
// (A helper found this with a watch never started: 64 partitions ran their
// 5 s budgets 8 at a time, 42 s.)
func TestQuickProduceWatchedOnceSlow(t *testing.T) {
	const budget = 2 * time.Second
	took := quickProduceClientGone(t, 16, budget)
	if took > budget+budget/2+time.Second {
		t.Fatalf("the proxy held a request of a client gone away for %v (budget %v)", took, budget)
	}
}

// With one partition there is no "between partitions" for the request's
// goroutine to start the watch at: the watchdog starts it while the call
// waits for the KMS, and the call ends when the client goes, not at its
// budget (before, a client gone away held it the whole budget).
func TestQuickProduceWatchedDuringSlowCall(t *testing.T) {
	const budget = 8 * time.Second
	took := quickProduceClientGone(t, 1, budget)
	// The watchdog looks every budget/8 (1 s): the watch starts at its
	// first look after the call began, and sees the client gone at once.
	if took >= budget/2 {
		t.Fatalf("the proxy held a one-partition request of a client gone away for %v (budget %v)", took, budget)
	}
}

// quickProduceClientGone sends one Produce request with a record for each
// of parts topics through an encrypting proxy whose KMS never answers,
// closes the connection once the first data key's wrap reached the KMS,
// and returns how long the proxy then kept the connection.
func quickProduceClientGone(t *testing.T, parts int, budget time.Duration) time.Duration {
	t.Helper()
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	kms, err := faultproxy.NewSilent()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kms.Close)
	topics := make([]string, parts)
	for i := range topics {
		topics[i] = fmt.Sprintf("k%d", i)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	keyURL := "awskms://alias/ferry-hang?region=us-east-1&endpoint=" + url.QueryEscape("http://"+kms.Addr())
	s := startProxy(t, Config{Upstream: c.ListenAddrs(), InterceptorTimeout: budget, Interceptors: []interceptor.Spec{
		spec("encrypt", "k.*", interceptor.KeyEncryptKeyURL, keyURL)}})
	req := kmsg.NewPtrProduceRequest()
	req.Version = 9
	req.Acks = 1
	req.TimeoutMillis = 30000
	for _, name := range topics {
		rt := kmsg.NewProduceRequestTopic()
		rt.Topic = name
		rp := kmsg.NewProduceRequestTopicPartition()
		rp.Records = seedBatch(0, "needs a data key")
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
	}
	clientID := "gone"
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(encodeRequest(req, 1, &clientID)); err != nil {
		t.Fatal(err)
	}
	// Wait until the first data key's wrap reached the KMS: the request is
	// being intercepted.
	select {
	case <-kms.Accepted():
	case <-time.After(30 * time.Second):
		t.Fatal("no KMS call within 30 s of the request")
	}
	start := time.Now()
	conn.Close()
	for connCount(s) > 0 {
		if time.Since(start) > 60*time.Second {
			t.Fatalf("the connection of a client gone away still open after %v", time.Since(start))
		}
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(start)
	t.Logf("%d partitions: connection ended %v after its client went away; %d KMS connections made (budget %v)",
		parts, took.Round(time.Millisecond), kms.Count(), budget)
	return took
}
