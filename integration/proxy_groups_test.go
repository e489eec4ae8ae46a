package integration

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferrykit/ferry/proxy"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A transactional producer through the proxy: an aborted and a committed
// transaction; a read_committed consumer sees only the committed records.
func TestProxyTransactions(t *testing.T) {
	bootstrap := startProxy(t, brokers(t))
	scan := &portScanner{}
	topic := createTopicVia(t, bootstrap, scan)
	ctx := ctxT(t, 2*time.Minute)
	prod := proxyClient(t, bootstrap, scan, kgo.DefaultProduceTopic(topic),
		kgo.TransactionalID(fmt.Sprintf("ferry-proxy-txn-%d", time.Now().UnixNano())))
	txn := func(prefix string, commit kgo.TransactionEndTry) {
		t.Helper()
		if err := prod.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for i := range 5 {
			if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte(prefix + strconv.Itoa(i))}).FirstErr(); err != nil {
				t.Fatalf("produce in transaction %s: %v", prefix, err)
			}
		}
		if err := prod.EndTransaction(ctx, commit); err != nil {
			t.Fatalf("end transaction %s: %v", prefix, err)
		}
	}
	txn("aborted-", kgo.TryAbort)
	txn("committed-", kgo.TryCommit)

	cons := proxyClient(t, bootstrap, scan, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	var got []string
	for len(got) < 5 {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read_committed consumer got %v before timing out", got)
		}
		fs.EachError(func(tp string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", tp, p, err) })
		for _, r := range fs.Records() {
			got = append(got, string(r.Value))
		}
	}
	// The aborted records come first in the log: had they leaked, they
	// would be among the first five.
	for i, v := range got {
		if v != "committed-"+strconv.Itoa(i) {
			t.Fatalf("read_committed consumer got %v, want committed-0..4 only", got)
		}
	}
	scan.check(t, realAddrs(t))
}

// Both group protocols through the proxy, with a rebalance when a second
// member joins: classic (JoinGroup/SyncGroup) and KIP-848
// (ConsumerGroupHeartbeat, franz-go's ServerSideBalancer).
func TestProxyConsumerGroups(t *testing.T) {
	for _, proto := range []string{"classic", "consumer"} {
		t.Run(proto, func(t *testing.T) { groupRebalance(t, proto) })
	}
}

func groupRebalance(t *testing.T, proto string) {
	bootstrap := startProxy(t, brokers(t))
	scan := &portScanner{}
	ctx := ctxT(t, 3*time.Minute)
	adm := kadm.NewClient(proxyClient(t, bootstrap, scan))
	topic := fmt.Sprintf("ferry-proxy-group-%s-%d", proto, time.Now().UnixNano())
	if r, err := adm.CreateTopic(ctx, 4, 1, nil, topic); err != nil || r.Err != nil {
		t.Fatalf("create topic: %v %v", err, r.Err)
	}
	group := topic
	prod := proxyClient(t, bootstrap, scan, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	produce := func(from, n int) {
		for i := from; i < from+n; i++ {
			if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte(strconv.Itoa(i))}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}

	var mu sync.Mutex
	seen := map[string]bool{}
	owned := map[string]map[int32]bool{} // member -> partitions
	member := func(name string) *kgo.Client {
		opts := []kgo.Opt{kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, a map[string][]int32) {
				mu.Lock()
				defer mu.Unlock()
				for _, p := range a[topic] {
					if owned[name] == nil {
						owned[name] = map[int32]bool{}
					}
					owned[name][p] = true
				}
			}),
			kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, r map[string][]int32) {
				mu.Lock()
				defer mu.Unlock()
				for _, p := range r[topic] {
					delete(owned[name], p)
				}
			}),
			kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, r map[string][]int32) {
				mu.Lock()
				defer mu.Unlock()
				for _, p := range r[topic] {
					delete(owned[name], p)
				}
			}),
		}
		if proto == "consumer" {
			opts = append(opts, kgo.ServerSideBalancer(), kgo.Balancers(kgo.RangeBalancer()))
		}
		cl := proxyClient(t, bootstrap, scan, opts...)
		go func() {
			for {
				fs := cl.PollFetches(ctx)
				if fs.IsClientClosed() || ctx.Err() != nil {
					return
				}
				mu.Lock()
				for _, r := range fs.Records() {
					seen[string(r.Value)] = true
				}
				mu.Unlock()
			}
		}()
		return cl
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for !func() bool { mu.Lock(); defer mu.Unlock(); return cond() }() {
			if ctx.Err() != nil {
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("%s protocol: timed out waiting for %s; owned %v, seen %d", proto, what, owned, len(seen))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	all := func(n int) func() bool {
		return func() bool {
			for i := range n {
				if !seen[strconv.Itoa(i)] {
					return false
				}
			}
			return true
		}
	}

	produce(0, 40)
	member("a")
	waitFor("member a to own all 4 partitions", func() bool { return len(owned["a"]) == 4 })
	waitFor("the first 40 records", all(40))

	member("b")
	waitFor("the rebalance to split the partitions", func() bool {
		return len(owned["a"]) > 0 && len(owned["b"]) > 0 && len(owned["a"])+len(owned["b"]) == 4
	})
	produce(40, 40)
	waitFor("all 80 records across both members", all(80))

	// The group is described through the proxy with its two members.
	var members int
	switch proto {
	case "classic":
		dg, err := adm.DescribeGroups(ctx, group)
		if err != nil {
			t.Fatal(err)
		}
		members = len(dg[group].Members)
	case "consumer":
		req := kmsg.NewPtrConsumerGroupDescribeRequest()
		req.Groups = []string{group}
		resp, err := req.RequestWith(ctx, proxyClient(t, bootstrap, scan))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Groups) != 1 || resp.Groups[0].ErrorCode != 0 {
			t.Fatalf("ConsumerGroupDescribe: %+v", resp.Groups)
		}
		members = len(resp.Groups[0].Members)
	}
	if members != 2 {
		t.Fatalf("%s group has %d members, want 2", proto, members)
	}
	scan.check(t, realAddrs(t))
}

// Shutdown answers the requests already in flight before closing: a Fetch
// that waits at the broker (max wait 3 s) still gets its response.
func TestProxyShutdownDrainsInFlight(t *testing.T) {
	s := startProxyServer(t, proxy.Config{Upstream: proxy.SplitList(brokers(t)), AdminListen: "127.0.0.1:0"})
	topic := createTopicVia(t, s.Addr(), nil)
	ctx := ctxT(t, time.Minute)
	cl := proxyClient(t, s.Addr(), nil)
	// Until the new topic is in the metadata with its id and a leader: a
	// Fetch before that is answered at once (UNKNOWN_TOPIC_ID), not held.
	var meta *kmsg.MetadataResponse
	var topicID [16]byte
	for topicID == [16]byte{} {
		m, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		meta = m
		for _, tp := range m.Topics {
			if tp.Topic != nil && *tp.Topic == topic && tp.ErrorCode == 0 && len(tp.Partitions) > 0 && tp.Partitions[0].Leader >= 0 {
				topicID = tp.TopicID
			}
		}
		if topicID == [16]byte{} {
			time.Sleep(100 * time.Millisecond)
		}
	}
	fetch := kmsg.NewPtrFetchRequest()
	fetch.MaxWaitMillis = 3000
	fetch.MinBytes = 1 << 20 // nothing to read: the broker waits the whole max wait
	fetch.MaxBytes = 1 << 20
	ft := kmsg.NewFetchRequestTopic()
	ft.Topic, ft.TopicID = topic, topicID
	fp := kmsg.NewFetchRequestTopicPartition()
	fp.Partition, fp.PartitionMaxBytes = 0, 1<<20
	ft.Partitions = append(ft.Partitions, fp)
	fetch.Topics = append(fetch.Topics, ft)
	// And until the broker serves the partition: Metadata may name the
	// leader before the leader serves it (NOT_LEADER_OR_FOLLOWER, seen on a
	// loaded machine). A probe Fetch that does not wait proves it.
	probe := *fetch
	probe.MaxWaitMillis, probe.MinBytes = 0, 1
	waitFor(t, 30*time.Second, func() bool {
		r, err := probe.RequestWith(ctx, cl)
		return err == nil && r.ErrorCode == 0 && len(r.Topics) == 1 && len(r.Topics[0].Partitions) == 1 &&
			r.Topics[0].Partitions[0].ErrorCode == 0
	}, func() string { return "the partition's leader does not serve Fetch" })

	type result struct {
		resp kmsg.Response
		err  error
		took time.Duration
	}
	done := make(chan result, 1)
	br := cl.Broker(int(meta.Brokers[0].NodeID))
	// Open the broker connection first, so the Fetch is in flight at once.
	if _, err := br.Request(ctx, kmsg.NewPtrApiVersionsRequest()); err != nil {
		t.Fatal(err)
	}
	go func() {
		start := time.Now()
		r, err := br.Request(ctx, fetch)
		done <- result{r, err, time.Since(start)}
	}()
	time.Sleep(500 * time.Millisecond)
	sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	health := "http://" + s.AdminAddr() + "/healthz"
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(sctx) }()
	// While it drains, /healthz says so (load balancers stop sending).
	sawDraining := false
	for !sawDraining {
		resp, err := http.Get(health)
		if err != nil {
			break // the admin listener closes once the drain is over
		}
		resp.Body.Close()
		sawDraining = resp.StatusCode == http.StatusServiceUnavailable
		select {
		case <-shut:
			t.Fatal("shutdown finished before /healthz reported it")
		default:
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !sawDraining {
		t.Fatal("/healthz never answered 503 during the drain")
	}
	if err := <-shut; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("in-flight Fetch lost by the shutdown: %v", r.err)
	}
	if err := kerr.ErrorForCode(r.resp.(*kmsg.FetchResponse).ErrorCode); err != nil {
		t.Fatalf("Fetch error: %v", err)
	}
	for _, rt := range r.resp.(*kmsg.FetchResponse).Topics {
		for _, rp := range rt.Partitions {
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				t.Fatalf("Fetch error on partition %d: %v", rp.Partition, err)
			}
		}
	}
	if r.took < 2*time.Second {
		t.Fatalf("the Fetch came back after %s: it did not wait at the broker, so it proves nothing", r.took)
	}
	// New connections are refused now.
	if _, err := kmsg.NewPtrMetadataRequest().RequestWith(ctxT(t, 3*time.Second), proxyClient(t, s.Addr(), nil)); err == nil {
		t.Fatal("a new client was served after shutdown")
	}
}

// ownBroker starts a broker of its own with scripts/kafka-broker (state in a
// temp dir) and returns its address and a restart function; it is stopped at
// cleanup.
func ownBroker(t *testing.T) (addr string, restart func()) {
	t.Helper()
	env := ownBrokerEnv(t)
	return env["FERRY_KAFKA_BROKERS"], func() { kafkaBrokerScript(t, env["FERRY_KAFKA_STATE"], "restart") }
}

// ownBrokerEnv starts a broker of its own (extra environment: "K=V") and
// returns the FERRY_KAFKA_* variables it exported, plus FERRY_KAFKA_STATE.
func ownBrokerEnv(t *testing.T, extra ...string) map[string]string {
	t.Helper()
	brokers(t) // same skip rule as the shared broker
	state := t.TempDir()
	out := kafkaBrokerScript(t, state, "start", extra...)
	t.Cleanup(func() { kafkaBrokerScript(t, state, "stop") })
	env := map[string]string{"FERRY_KAFKA_STATE": state}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if kv, ok := strings.CutPrefix(sc.Text(), "export "); ok {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
	}
	if env["FERRY_KAFKA_BROKERS"] == "" {
		t.Fatalf("no FERRY_KAFKA_BROKERS in %q", out)
	}
	return env
}

// kafkaBrokerScript runs scripts/kafka-broker VERB with its own state dir
// and returns its stdout.
func kafkaBrokerScript(t *testing.T, state, verb string, extra ...string) string {
	t.Helper()
	cmd := exec.Command("../scripts/kafka-broker", verb)
	cmd.Env = append(append(os.Environ(), "FERRY_KAFKA_STATE="+state,
		"FERRY_KAFKA_WATCH_PID="+strconv.Itoa(os.Getpid())), extra...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kafka-broker %s: %v\n%s", verb, err, stderr.String())
	}
	return string(out)
}

// An upstream broker restart is survived: the proxy closes the clients'
// connections with the broker's, clients reconnect through the proxy and go
// on producing and consuming.
func TestProxyBrokerRestart(t *testing.T) {
	addr, restart := ownBroker(t)
	s := startProxyServer(t, proxy.Config{Upstream: []string{addr}, AdminListen: "127.0.0.1:0"})
	scan := &portScanner{}
	topic := createTopicVia(t, s.Addr(), scan)
	ctx := ctxT(t, 3*time.Minute)
	prod := proxyClient(t, s.Addr(), scan, kgo.DefaultProduceTopic(topic))
	produce := func(from int) {
		for i := from; i < from+10; i++ {
			if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte(strconv.Itoa(i))}).FirstErr(); err != nil {
				t.Fatalf("produce %d: %v", i, err)
			}
		}
	}
	produce(0)
	// An idle connection through the proxy, with its upstream connection
	// open (one ApiVersions v0 round trip).
	idle := rawConn(t, s.Addr())
	apiv0 := []byte{0, 0, 0, 10, 0, 18, 0, 0, 0, 0, 0, 1, 0xff, 0xff}
	if _, err := idle.Write(apiv0); err != nil {
		t.Fatal(err)
	}
	if _, err := readRawFrame(idle); err != nil {
		t.Fatal(err)
	}
	restart()
	// The broker's restart closed the idle upstream connection; the proxy
	// closed the client's at once, as the broker would have.
	_ = idle.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := readRawFrame(idle); err == nil {
		t.Fatal("the idle connection answered without a request")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the idle client connection stayed open after its broker restarted")
	}
	produce(10)
	cons := proxyClient(t, s.Addr(), scan, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var got []string
	for len(got) < 20 {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %v after the restart", got)
		}
		for _, r := range fs.Records() {
			got = append(got, string(r.Value))
		}
	}
	for i, v := range got {
		if v != strconv.Itoa(i) {
			t.Fatalf("records after the restart: %v", got)
		}
	}
	scan.check(t, []string{addr})
	m := httpGet(t, "http://"+s.AdminAddr()+"/metrics")
	if !strings.Contains(m, `ferry_proxy_errors_total{kind="upstream_io"}`) {
		t.Errorf("/metrics counted no upstream_io error across the restart")
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("timed out")
	}
}
