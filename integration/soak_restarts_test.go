package integration

// Broker restarts and proxy restarts cost clients nothing (issue 12, item
// 6): idempotent franz-go producers (acks=all) and a consumer work through
// a `ferry proxy` process with the large-message interceptor (some records
// above its threshold, so references and the store are in play) while the
// broker behind it is restarted (scripts/kafka-broker restart: same ports
// and data) and the proxy is killed (SIGKILL) and started again on the same
// ports. At the end: 0 failed records (produce errors), 0 missing
// (acknowledged but never read), 0 duplicates (one id at two offsets), 0
// dangling references (a reference record whose object is gone), 0 corrupt
// values.
//
// FERRY_SOAK_RESTARTS sets the run's length (default 60s: one broker
// restart and one proxy kill); scripts/soak restarts DURATION runs it long,
// with a restart of one or the other every 80 s or so.

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

func TestSoakRestarts(t *testing.T) {
	brokers(t)
	dur := 60 * time.Second
	if s := os.Getenv("FERRY_SOAK_RESTARTS"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 30*time.Second {
			t.Fatalf("FERRY_SOAK_RESTARTS %q: want a duration of at least 30s", s)
		}
		dur = d
	}
	t.Setenv("FERRY_TEST_PROXY_LOG_LEVEL", "info") // the held connections are logged at info
	bin := buildFerry(t)
	env := ownBrokerEnv(t)
	broker, state := env["FERRY_KAFKA_BROKERS"], env["FERRY_KAFKA_STATE"]
	t.Setenv("FERRY_KAFKA_BROKERS", broker) // client(t) and readAll: this test's own broker
	storeURL := interceptorStoreURL(t)
	adm := kadm.NewClient(client(t))
	topic := fmt.Sprintf("soak-restarts-%d", time.Now().UnixNano()%1e9)
	if resp, err := adm.CreateTopic(ctxT(t, 30*time.Second), 3, 1, nil, topic); err != nil || resp.Err != nil {
		t.Fatalf("create %s: %v %v", topic, err, resp.Err)
	}
	meta, err := adm.BrokerMetadata(ctxT(t, 30*time.Second))
	if err != nil || len(meta.Brokers) != 1 {
		t.Fatalf("broker metadata: %v %v", meta, err)
	}
	// Fixed ports: a restarted proxy is where the clients left it.
	listen, brokerPort := freePort(t), freePort(t)
	base := brokerPort - int(meta.Brokers[0].NodeID)
	cfg := fmt.Sprintf(`
upstream: %s
listen: 127.0.0.1:%d
broker.port.base: %d
admin.listen: 127.0.0.1:0
interceptors:
  - name: large-message
    config:
      topic.pattern: "soak-restarts-.*"
      large.message.payload.store.url: %s
      large.message.threshold.bytes: %d
`, broker, listen, base, storeURL, soakThreshold)
	proxy := startProxyReplica(t, bin, cfg)
	defer logHeld(t, proxy)
	bootstrap := proxy.bootstrap

	end := time.Now().Add(dur)
	// Two producers, ~100 records/s each, and a consumer without a group,
	// all through the proxy from the start.
	load := newFaultLoad(t, topic, "restarts")
	for range 2 {
		load.startProducer([]string{bootstrap}, 10*time.Millisecond)
	}
	load.startConsumer([]string{bootstrap}, "")

	// The restarts: broker and proxy in turn, evenly spread.
	n := max(2, int(dur/(80*time.Second)))
	start := time.Now()
	brokerRestarts, proxyKills := 0, 0
	for i := range n {
		// A restart takes its time (a broker's is 20-50 s on a loaded
		// machine): the next event comes at its turn, or 5 s after.
		time.Sleep(time.Until(start.Add(dur * time.Duration(i+1) / time.Duration(n+1))))
		if i%2 == 0 {
			t0 := time.Now()
			kafkaBrokerScript(t, state, "restart")
			brokerRestarts++
			t.Logf("%s: broker restarted (%s)", time.Since(start).Round(time.Second), time.Since(t0).Round(time.Millisecond))
		} else {
			proxy.kill()
			time.Sleep(2 * time.Second) // clients find nothing listening: connection refused
			proxy.start()
			proxyKills++
			t.Logf("%s: proxy killed and started again", time.Since(start).Round(time.Second))
		}
		time.Sleep(5 * time.Second)
	}
	// The clients go on for a while after the last restart too.
	if last := time.Now().Add(10 * time.Second); last.After(end) {
		end = last
	}
	time.Sleep(time.Until(end))
	tallies := load.finish(2*time.Minute, openStore(t, storeURL), nil)
	all := tallies[len(tallies)-1]
	t.Logf("soak %s through the proxy: %d broker restarts, %d proxy kills; %s",
		end.Sub(start).Round(time.Second), brokerRestarts, proxyKills, all)
	load.check(all, 1)
	if all.refs == 0 || brokerRestarts == 0 || proxyKills == 0 {
		t.Errorf("the soak proved nothing: %d references, %d broker restarts, %d proxy kills",
			all.refs, brokerRestarts, proxyKills)
	}
}
