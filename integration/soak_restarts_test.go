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
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/largemessage"
)

const (
	soakSmallValue = 512
	soakLargeValue = 96 << 10 // above the threshold below: offloaded
	soakThreshold  = 32 << 10
	soakLargeEvery = 20 // every 20th record of a producer is large
)

// soakValue is record id's value: deterministic bytes, so a reader checks
// every value it gets.
func soakValue(id string, large bool) []byte {
	n := soakSmallValue
	if large {
		n = soakLargeValue
	}
	h := fnv.New64a()
	h.Write([]byte(id))
	r := rand.New(rand.NewPCG(h.Sum64(), 1))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b
}

// freePort is a TCP port nothing listens on just now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

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
	var pmu sync.Mutex
	p := startFerryProxy(t, bin, cfg)
	var logs []string // stderr of every proxy process
	defer func() {
		pmu.Lock()
		defer pmu.Unlock()
		logs = append(logs, p.stderr.String())
		all := strings.Join(logs, "")
		t.Logf("proxy logs: %d held connections, %d reached the broker after waiting, %d gave up",
			strings.Count(all, "holding the client's request"), strings.Count(all, "the held request goes on"),
			strings.Count(all, "cannot reach the upstream broker; closing"))
	}()
	bootstrap := p.bootstrap

	end := time.Now().Add(dur)
	var (
		mu                 sync.Mutex
		acked              = map[string]bool{}
		failed, sent       atomic.Int64
		largeAcked         atomic.Int64
		firstErrs          []string
		producersDone      sync.WaitGroup
		stopProducers      = make(chan struct{})
		produceCtx, cancel = context.WithCancel(context.Background())
	)
	defer cancel()
	for pi := range 2 {
		producersDone.Add(1)
		go func() {
			defer producersDone.Done()
			cl, err := kgo.NewClient(kgo.SeedBrokers(bootstrap), kgo.DefaultProduceTopic(topic),
				kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerBatchMaxBytes(1<<20))
			if err != nil {
				failed.Add(1)
				return
			}
			defer cl.Close()
			sem := make(chan struct{}, 200)
			tick := time.NewTicker(10 * time.Millisecond) // ~100 records/s per producer
			defer tick.Stop()
		loop:
			for seq := 0; ; seq++ {
				select {
				case <-stopProducers:
					break loop
				case <-tick.C:
				}
				id := fmt.Sprintf("p%d-%07d", pi, seq)
				large := seq%soakLargeEvery == soakLargeEvery-1
				sem <- struct{}{}
				sent.Add(1)
				cl.Produce(produceCtx, &kgo.Record{Key: []byte(id), Value: soakValue(id, large)}, func(r *kgo.Record, err error) {
					<-sem
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						failed.Add(1)
						if len(firstErrs) < 5 {
							firstErrs = append(firstErrs, fmt.Sprintf("%s: %v", id, err))
						}
						return
					}
					acked[id] = true
					if large {
						largeAcked.Add(1)
					}
				})
			}
			if err := cl.Flush(ctxT(t, 5*time.Minute)); err != nil {
				mu.Lock()
				firstErrs = append(firstErrs, "flush: "+err.Error())
				mu.Unlock()
			}
		}()
	}

	// The consumer, through the proxy from the start, without a group.
	type pos struct {
		p int32
		o int64
	}
	var (
		cmu       sync.Mutex
		seen      = map[string]map[pos]bool{}
		rereads   int64
		corrupt   []string
		fetchErrs atomic.Int64
	)
	consCtx, stopCons := context.WithCancel(context.Background())
	consDone := make(chan struct{})
	go func() {
		defer close(consDone)
		cl, err := kgo.NewClient(kgo.SeedBrokers(bootstrap), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxBytes(16<<20))
		if err != nil {
			fetchErrs.Add(1)
			return
		}
		defer cl.Close()
		for consCtx.Err() == nil {
			fs := cl.PollFetches(consCtx)
			fs.EachError(func(_ string, _ int32, err error) {
				if consCtx.Err() == nil {
					fetchErrs.Add(1)
					t.Logf("fetch error (the client retries): %v", err)
				}
			})
			cmu.Lock()
			fs.EachRecord(func(r *kgo.Record) {
				id := string(r.Key)
				large := len(r.Value) > soakSmallValue
				if largemessage.IsOffloaded(r) || !bytes.Equal(r.Value, soakValue(id, large)) {
					corrupt = append(corrupt, fmt.Sprintf("%s at %d/%d (%d bytes)", id, r.Partition, r.Offset, len(r.Value)))
				}
				if seen[id] == nil {
					seen[id] = map[pos]bool{}
				}
				at := pos{r.Partition, r.Offset}
				if seen[id][at] {
					rereads++
				}
				seen[id][at] = true
			})
			cmu.Unlock()
		}
	}()

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
			pmu.Lock()
			_ = p.cmd.Process.Kill() // SIGKILL: no drain
			_ = p.cmd.Wait()
			logs = append(logs, p.stderr.String())
			pmu.Unlock()
			time.Sleep(2 * time.Second) // clients find nothing listening: connection refused
			np := startFerryProxy(t, bin, cfg)
			if np.bootstrap != bootstrap {
				t.Fatalf("the restarted proxy listens on %s, not %s", np.bootstrap, bootstrap)
			}
			pmu.Lock()
			p = np
			pmu.Unlock()
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
	close(stopProducers)
	producersDone.Wait()

	// Every acknowledged record is read back, within a bound.
	mu.Lock()
	want := make([]string, 0, len(acked))
	for id := range acked {
		want = append(want, id)
	}
	mu.Unlock()
	missing := func() []string {
		cmu.Lock()
		defer cmu.Unlock()
		var m []string
		for _, id := range want {
			if seen[id] == nil {
				m = append(m, id)
			}
		}
		return m
	}
	for deadline := time.Now().Add(2 * time.Minute); len(missing()) > 0 && time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
	}
	stopCons()
	<-consDone
	miss := missing()
	dups := 0
	cmu.Lock()
	for id, at := range seen {
		if len(at) > 1 {
			dups++
			if dups <= 5 {
				t.Logf("duplicate: %s at %v", id, at)
			}
		}
	}
	cmu.Unlock()

	// Every reference record in the log names an object the store has.
	refs, dangling := 0, 0
	store := openStore(t, storeURL)
	de := largemessage.NewDeserializer(store, false)
	for _, r := range readAll(t, topic) {
		if !largemessage.IsOffloaded(r) {
			continue
		}
		refs++
		if err := de.Resolve(ctxT(t, time.Minute), r); err != nil {
			dangling++
			if dangling <= 5 {
				t.Logf("dangling reference at %d/%d: %v", r.Partition, r.Offset, err)
			}
		}
	}

	t.Logf("soak %s through the proxy: %d broker restarts, %d proxy kills; %d records sent, %d acknowledged (%d large), "+
		"failed %d, missing %d, duplicates %d, dangling references %d (of %d), corrupt %d; consumer re-reads at one offset %d, fetch errors %d",
		end.Sub(start).Round(time.Second), brokerRestarts, proxyKills, sent.Load(), len(want), largeAcked.Load(),
		failed.Load(), len(miss), dups, dangling, refs, len(corrupt), rereads, fetchErrs.Load())
	if failed.Load() != 0 || len(firstErrs) > 0 {
		t.Errorf("%d records failed: %v", failed.Load(), firstErrs)
	}
	if len(miss) != 0 {
		t.Errorf("%d acknowledged records never read, e.g. %v", len(miss), miss[:min(5, len(miss))])
	}
	if dups != 0 {
		t.Errorf("%d records read at more than one offset", dups)
	}
	if dangling != 0 {
		t.Errorf("%d of %d reference records name a missing object", dangling, refs)
	}
	if len(corrupt) != 0 {
		t.Errorf("%d values read wrong, e.g. %v", len(corrupt), corrupt[:min(5, len(corrupt))])
	}
	if len(want) == 0 || refs == 0 || brokerRestarts == 0 || proxyKills == 0 {
		t.Errorf("the soak proved nothing: %d acknowledged, %d references, %d broker restarts, %d proxy kills",
			len(want), refs, brokerRestarts, proxyKills)
	}
}
