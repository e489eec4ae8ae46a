package integration

// Fleet-shaped faults (issue 22, item 2): a real three-broker KRaft cluster
// (scripts/kafka-broker with FERRY_KAFKA_NODES=3: replication factor 3,
// min.insync.replicas 2) behind two `ferry proxy` replicas (a port per
// broker) that clients know through one bootstrap list, a third replica
// routing by SNI (one TLS port) with clients of its own, and a fourth
// without interceptors with a reader of its own (fleetplain_test.go: the
// plain proxy's streamed Fetch responses). Idempotent franz-go
// producers (acks=all) write through the proxies' large-message interceptor
// (every 20th record offloaded to the real S3 server, sealed under the real
// KMS's key when it runs), two consumers in a group read back through the
// proxies, and the faults come one after another on the one cluster:
//
//   - leader-kill: a partition's leader is killed (SIGKILL), a new one is
//     elected, the broker comes back and catches up;
//   - rolling-restart: every broker restarted in turn, as an upgrade does
//     (scripts/kafka-broker rolling-restart waits for the ISR in between);
//   - broker-added: a broker joins (scripts/kafka-broker add) and leads a new
//     partition of the topic, which the clients use through the proxies: the
//     proxies open a listener for its node id without a restart;
//   - reassignment: partitions move to new replica sets with Kafka's own
//     kafka-reassign-partitions (leaders included);
//   - broker-removed: the added broker is decommissioned: every partition
//     moved off it (kafka-reassign-partitions), the broker stopped and
//     unregistered (kafka-cluster unregister);
//   - proxy-killed: one proxy replica is killed (SIGKILL) and started again
//     later on its ports; clients carry on through the other.
//
// Each fault is a phase: records produced during it are tallied on their
// own (sent, acknowledged, failed, missing, duplicated, dangling references,
// corrupt, consumer errors), and every phase must show 0 failed, 0 missing,
// 0 duplicates, 0 dangling, 0 corrupt.
//
// FERRY_SOAK_FLEET=DURATION (scripts/soak fleet DURATION) cycles the faults
// until DURATION has passed (a new broker is added and removed each cycle)
// and, in the first cycle, also makes the S3 server and the KMS unavailable
// for a while each (a fault proxy in front of each refuses every connection).

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/internal/faultproxy"
	"github.com/ferrykit/ferry/internal/storetest"
)

const (
	fleetPartitions = 3
	// fleetMinAcked is the records each phase must see acknowledged
	// (2 producers × 10 records/s: a phase lasts at least ~10 s).
	fleetMinAcked = 200
	// fleetBound bounds every wait for the cluster (a broker's start takes
	// 20-50 s on a loaded machine).
	fleetBound = 6 * time.Minute
	// fleetStartTimeout bounds each node's start (scripts/kafka-broker).
	fleetStartTimeout = "FERRY_KAFKA_START_TIMEOUT=300"
	// fleetOutage is how long the S3 server or the KMS stays unavailable.
	fleetOutage = 20 * time.Second
)

// fleet is the cluster, the proxies and the load of one TestFleetFaults run.
type fleet struct {
	t        *testing.T
	state    string // the cluster's scripts/kafka-broker state dir
	adm      *kadm.Client
	cl       *kgo.Client // straight to the cluster
	topic    string
	proxies  []*proxyReplica // a port per broker
	sni      *proxyReplica   // SNI routing
	plain    *plainReader    // a replica without interceptors, and its reader
	sniSeeds []string        // its bootstrap name
	sniDial  kgo.Opt         // a dialer that sends each name as SNI to its one port
	load     *faultLoad
	live     []int32 // node ids of the running, registered brokers
	s3, kms  *faultproxy.Proxy
	phases   []string
	cycle    int
	checkLog []string // per-phase facts the faults proved, logged at the end
}

func TestFleetFaults(t *testing.T) {
	brokers(t) // same skip rule as the shared broker
	kafkaToolsCP(t)
	var soak time.Duration
	if s := os.Getenv("FERRY_SOAK_FLEET"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < time.Minute {
			t.Fatalf("FERRY_SOAK_FLEET %q: want a duration of at least 1m", s)
		}
		soak = d
	}
	t0 := time.Now()
	t.Setenv("FERRY_TEST_PROXY_LOG_LEVEL", "info") // listeners opened, held requests
	bin := buildFerry(t)
	// A node's start takes 20 s on a quiet machine and minutes on a busy one.
	env := ownBrokerEnv(t, "FERRY_KAFKA_NODES=3", fleetStartTimeout)
	t.Setenv("FERRY_KAFKA_BROKERS", env["FERRY_KAFKA_BROKERS"]) // client(t), readAll: this cluster
	t.Logf("%s: cluster of 3 on %s", time.Since(t0).Round(time.Second), env["FERRY_KAFKA_BROKERS"])
	f := &fleet{t: t, state: env["FERRY_KAFKA_STATE"], cl: client(t), live: []int32{1, 2, 3}}
	f.adm = kadm.NewClient(f.cl)

	// The store: the real S3 server behind a fault proxy (and the real KMS
	// behind another) when they run, else a file store without outages.
	var storeURL, readURL, sealing string
	if os.Getenv("FERRY_S3_ENDPOINT") != "" {
		readURL, storeURL, f.s3 = storetest.S3URLViaFaultProxy(t, "ferry-fleet")
	} else {
		storeURL = interceptorStoreURL(t)
		readURL = storeURL
	}
	readCfg := epConfig(readURL, "")
	if os.Getenv("FERRY_KMS_KEY_URL") != "" {
		var keyURL string
		keyURL, f.kms = storetest.KMSKeyURLViaFaultProxy(t, "")
		// A new data key (a KMS call) every 10 payloads, so the KMS is in
		// the path of every few produces.
		sealing = fmt.Sprintf("\n      large.message.payload.encryption.key.url: %q\n      large.message.payload.encryption.data.key.max.uses: 10", keyURL)
		readCfg = epConfig(readURL, "", storetest.KMSKeyURL(t, ""))
	}
	readStore, err := readCfg.OpenStoreForReading(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { readStore.Close() })

	f.topic = fmt.Sprintf("fleet-%d", time.Now().UnixNano()%1e9)
	if resp, err := f.adm.CreateTopic(ctxT(t, time.Minute), fleetPartitions, 3, nil, f.topic); err != nil || resp.Err != nil {
		t.Fatalf("create %s: %v %v", f.topic, err, resp.Err)
	}
	f.waitInSync("topic created")

	// Two proxy replicas with a port per broker, fixed ports each (a
	// killed one comes back where clients left it), every broker of the
	// cluster as upstream seeds; and a third replica routing by SNI (one
	// TLS port, a wildcard certificate for *.ferry-sni.test).
	chain := fmt.Sprintf(`
interceptors:
  - name: large-message
    config:
      topic.pattern: "fleet-.*"
      large.message.payload.store.url: %q
      large.message.threshold.bytes: %d%s
`, storeURL, soakThreshold, sealing)
	for range 2 {
		// The bootstrap on base, node N on base+N: a block of ports below
		// the kernel's ephemeral range, which hands out no port of it.
		base := freePortBlock(t, 32)
		listen := base
		cfg := fmt.Sprintf(`
upstream: [%s]
listen: 127.0.0.1:%d
broker.port.base: %d
admin.listen: 127.0.0.1:0
`, env["FERRY_KAFKA_BROKERS"], listen, base) + chain
		f.proxies = append(f.proxies, startProxyReplica(t, bin, cfg))
	}
	_, cert, key, pool := wildcardPKI(t, sniDomain)
	sniListen := freePort(t)
	f.sni = startProxyReplica(t, bin, fmt.Sprintf(`
upstream: [%s]
listen: 127.0.0.1:%d
admin.listen: 127.0.0.1:0
tls.client: {enabled: true, cert: %q, key: %q}
sni:
  bootstrap.host: %s
  broker.host.pattern: %q
`, env["FERRY_KAFKA_BROKERS"], sniListen, cert, key, sniBootstrap, sniPattern)+chain)
	// Every name the SNI replica hands out leads to its one port; the name
	// goes in the TLS handshake.
	f.sniDial = kgo.Dialer(func(ctx context.Context, network, host string) (net.Conn, error) {
		name, _, err := net.SplitHostPort(host)
		if err != nil {
			return nil, err
		}
		d := &tls.Dialer{Config: &tls.Config{ServerName: name, RootCAs: pool, MinVersion: tls.VersionTLS12}}
		return d.DialContext(ctx, network, net.JoinHostPort("127.0.0.1", strconv.Itoa(sniListen)))
	})
	f.sniSeeds = []string{net.JoinHostPort(sniBootstrap, strconv.Itoa(sniListen))}
	defer logHeld(t, append(f.proxies, f.sni)...)
	a, b := f.proxies[0].bootstrap, f.proxies[1].bootstrap

	f.load = newFaultLoad(t, f.topic, "start")
	f.phases = append(f.phases, "start")
	// New partitions reach producers and the group at the next metadata
	// refresh: every 5 s here (franz-go's default is 5 min).
	for _, seeds := range [][]string{{a, b}, {b, a}} {
		f.load.startProducer(seeds, 100*time.Millisecond, kgo.MetadataMaxAge(5*time.Second))
	}
	f.load.startProducer(f.sniSeeds, 100*time.Millisecond, kgo.MetadataMaxAge(5*time.Second), f.sniDial)
	group := "fleet-group-" + f.topic
	f.load.startConsumer([]string{a, b}, group)
	f.load.startConsumer([]string{b, a}, group)
	f.load.startConsumer(f.sniSeeds, group, f.sniDial)
	// A fourth replica, without interceptors, and a reader through it
	// (fleetplain_test.go).
	f.plain = startPlainReader(f, bin, env["FERRY_KAFKA_BROKERS"])
	f.awaitAcked("start")

	faults := []struct {
		name string
		run  func()
	}{
		{"leader-kill", f.leaderKill},
		{"rolling-restart", f.rollingRestart},
		{"broker-added", f.brokerAdded},
		{"reassignment", f.reassignment},
		{"broker-removed", f.brokerRemoved},
		{"proxy-killed", f.proxyKilled},
	}
	faultsFrom := time.Now() // the soak's DURATION counts from here
	for {
		f.cycle++
		for _, fault := range faults {
			f.phase(fault.name, fault.run)
		}
		if soak > 0 && f.cycle == 1 {
			if f.s3 != nil {
				f.phase("s3-unavailable", func() { f.outage("S3", f.s3) })
			}
			if f.kms != nil {
				f.phase("kms-unavailable", func() { f.outage("KMS", f.kms) })
			}
		}
		if soak == 0 || time.Since(faultsFrom) >= soak {
			break
		}
	}
	f.load.setPhase("end")

	tallies := f.load.finish(3*time.Minute, readStore, f.phases)
	f.plain.finish(f.phases)
	for _, c := range tallies {
		t.Logf("%s", c)
		min := fleetMinAcked
		if c.phase == "all" {
			min = 1
		}
		f.load.check(c, min)
	}
	for _, l := range f.checkLog {
		t.Log(l)
	}
	if all := tallies[len(tallies)-1]; all.refs == 0 {
		t.Errorf("no record was offloaded: the store was never in play")
	}
	t.Logf("fleet faults: %d cycle(s), %s", f.cycle, time.Since(t0).Round(time.Second))
}

// phase runs one fault with its own record tally, then waits until the
// cluster is whole and the phase has its records.
func (f *fleet) phase(name string, run func()) {
	t := f.t
	if f.cycle > 1 {
		name = fmt.Sprintf("%s#%d", name, f.cycle)
	}
	f.phases = append(f.phases, name)
	f.load.setPhase(name)
	t0 := time.Now()
	t.Logf("phase %s", name)
	run()
	f.waitInSync(name)
	f.awaitAcked(name)
	t.Logf("phase %s done (%s, %d records acknowledged)", name, time.Since(t0).Round(time.Second), f.load.ackedIn(name, -1))
}

// awaitAcked waits until phase has fleetMinAcked acknowledged records.
func (f *fleet) awaitAcked(phase string) {
	waitFor(f.t, fleetBound, func() bool { return f.load.ackedIn(phase, -1) >= fleetMinAcked },
		func() string { return fmt.Sprintf("%s: %d records acknowledged", phase, f.load.ackedIn(phase, -1)) })
}

// awaitMore waits until n more records of the current phase are acknowledged
// (partition p, or any when p < 0): the clients go on through the fault.
func (f *fleet) awaitMore(n int, p int32, what string) {
	phase := *f.load.phase.Load()
	from := f.load.ackedIn(phase, p)
	waitFor(f.t, fleetBound, func() bool { return f.load.ackedIn(phase, p) >= from+n },
		func() string {
			return fmt.Sprintf("%s: %d records acknowledged, want %d", what, f.load.ackedIn(phase, p)-from, n)
		})
}

// freePortBlock is a port p with p..p+n-1 all free just now, below 32768
// (Linux's ephemeral ports start there), so that no port the kernel picks
// for another socket of the run lands in the block.
func freePortBlock(t *testing.T, n int) int {
	t.Helper()
	for range 200 {
		p := 20000 + mrand.IntN(12000-n)
		ok := true
		for i := range n {
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+i)))
			if err != nil {
				ok = false
				break
			}
			ln.Close()
		}
		if ok {
			return p
		}
	}
	t.Fatalf("no block of %d free ports", n)
	return 0
}

// script runs scripts/kafka-broker ARGS on the cluster and returns its stdout.
func (f *fleet) script(args ...string) string {
	t := f.t
	t.Helper()
	cmd := exec.Command("../scripts/kafka-broker", args...)
	cmd.Env = append(os.Environ(), "FERRY_KAFKA_STATE="+f.state, "FERRY_KAFKA_WATCH_PID="+strconv.Itoa(os.Getpid()), fleetStartTimeout)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	t0 := time.Now()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kafka-broker %v: %v\n%s", args, err, stderr.String())
	}
	t.Logf("kafka-broker %s (%s)", strings.Join(args, " "), time.Since(t0).Round(time.Second))
	return string(out)
}

// metadata is the cluster's view of every topic (internal ones too).
func (f *fleet) metadata() (kadm.Metadata, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return f.adm.Metadata(ctx)
}

// waitInSync waits until every partition of every topic has a leader and
// all its replicas in the ISR, and the cluster lists exactly f.live.
func (f *fleet) waitInSync(what string) {
	var last string
	waitFor(f.t, fleetBound, func() bool {
		m, err := f.metadata()
		if err != nil {
			last = err.Error()
			return false
		}
		ids := m.Brokers.NodeIDs()
		slices.Sort(ids)
		if !slices.Equal(ids, f.live) {
			last = fmt.Sprintf("brokers %v, want %v", ids, f.live)
			return false
		}
		for _, td := range m.Topics {
			for _, p := range td.Partitions {
				if p.Err != nil || p.Leader < 0 || len(p.ISR) != len(p.Replicas) {
					last = fmt.Sprintf("%s/%d: leader %d, replicas %v, ISR %v, %v", td.Topic, p.Partition, p.Leader, p.Replicas, p.ISR, p.Err)
					return false
				}
			}
		}
		return true
	}, func() string { return what + ": the cluster is not whole: " + last })
}

func (f *fleet) partition(m kadm.Metadata, p int32) kadm.PartitionDetail {
	return m.Topics[f.topic].Partitions[p]
}

// leaderKill kills partition 0's leader with SIGKILL, waits for another
// leader and for records to go on, then starts the broker again.
func (f *fleet) leaderKill() {
	m, err := f.metadata()
	if err != nil {
		f.t.Fatal(err)
	}
	old := f.partition(m, 0).Leader
	f.script("kill", strconv.Itoa(int(old)))
	f.live = slices.DeleteFunc(f.live, func(id int32) bool { return id == old })
	var now int32
	waitFor(f.t, fleetBound, func() bool {
		m, err := f.metadata()
		if err != nil {
			return false
		}
		now = f.partition(m, 0).Leader
		return now >= 0 && now != old
	}, func() string { return fmt.Sprintf("partition 0 still led by %d after its broker was killed", now) })
	f.awaitMore(50, 0, "partition 0 with its leader killed")
	f.script("start", strconv.Itoa(int(old)))
	f.live = sortedIDs(append(f.live, old))
	f.checkLog = append(f.checkLog, fmt.Sprintf("leader-kill: partition 0's leader %d killed, %d elected, 50 records acknowledged on it before %d came back", old, now, old))
}

func sortedIDs(ids []int32) []int32 { slices.Sort(ids); return ids }

func (f *fleet) rollingRestart() {
	f.script("rolling-restart")
}

// brokerAdded starts a new broker and adds a partition led by it; the
// clients produce to and consume from it through the proxies, which must
// open a listener for the new node id on their own.
func (f *fleet) brokerAdded() {
	t := f.t
	id64, err := strconv.ParseInt(strings.TrimSpace(f.script("add")), 10, 32)
	if err != nil {
		t.Fatalf("kafka-broker add printed no node id: %v", err)
	}
	id := int32(id64)
	f.live = sortedIDs(append(f.live, id))
	f.waitInSync("broker added")
	m, err := f.metadata()
	if err != nil {
		t.Fatal(err)
	}
	n := int32(len(m.Topics[f.topic].Partitions))
	replicas := []int32{id}
	for _, other := range f.live {
		if other != id && len(replicas) < 3 {
			replicas = append(replicas, other)
		}
	}
	req := kmsg.NewPtrCreatePartitionsRequest()
	rt := kmsg.NewCreatePartitionsRequestTopic()
	rt.Topic, rt.Count = f.topic, n+1
	as := kmsg.NewCreatePartitionsRequestTopicAssignment()
	as.Replicas = replicas
	rt.Assignment = append(rt.Assignment, as)
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 60000
	resp, err := req.RequestWith(ctxT(t, time.Minute), f.cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.Topics[0].ErrorCode)
	}
	if err != nil {
		t.Fatalf("create partition %d on %v: %v", n, replicas, err)
	}
	f.waitInSync("partition added")
	f.awaitMore(50, n, fmt.Sprintf("partition %d led by the new broker %d", n, id))
	// Each replica is asked for Metadata as a new client would (its own
	// clients may all be on the other replica), then must have opened a
	// listener for (or routed by SNI) the node id it saw for the first time.
	portPerBroker := append(slices.Clone(f.proxies), f.plain.proxy)
	for _, p := range portPerBroker {
		f.brokerVia(p.bootstrap, id)
	}
	f.brokerVia(f.sniSeeds[0], id, f.sniDial)
	want := fmt.Sprintf("node=%d ", id)
	for i, p := range portPerBroker {
		if l := logLines(p.stderr(), "broker listener opened"); !strings.Contains(l, want) {
			t.Errorf("proxy %d logged no listener for the new broker %d:\n%s", i, id, l)
		}
	}
	if l := logLines(f.sni.stderr(), "broker routed by SNI"); !strings.Contains(l, want) {
		t.Errorf("the SNI proxy logged no route for the new broker %d:\n%s", id, l)
	}
	f.checkLog = append(f.checkLog, fmt.Sprintf("broker-added: broker %d joined, partition %d on %v, 50 records acknowledged on it through the proxies (the three port-per-broker replicas opened a listener for node %d, the SNI replica routed broker-%d)", id, n, replicas, id, id))
}

// brokerVia asks the proxy at seed for the cluster's brokers and checks
// that node id is among them, then connects to its address (through the
// proxy: the listener of a port-per-broker replica).
func (f *fleet) brokerVia(seed string, id int32, opts ...kgo.Opt) {
	t := f.t
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seed)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := ctxT(t, time.Minute)
	var addr string
	waitFor(t, fleetBound, func() bool {
		resp, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
		if err != nil {
			return false
		}
		for _, b := range resp.Brokers {
			if b.NodeID == id {
				addr = net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port)))
				return true
			}
		}
		return false
	}, func() string { return fmt.Sprintf("the proxy at %s names no broker %d", seed, id) })
	// A request to the address the proxy gave for the new broker, as the
	// only seed of a new client.
	direct, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if _, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, direct); err != nil {
		t.Errorf("broker %d at %s, the address the proxy at %s gave: %v", id, addr, seed, err)
	}
}

// logLines are the lines of log that contain msg.
func logLines(log, msg string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, msg) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// reassign moves partitions with Kafka's kafka-reassign-partitions:
// --execute, then --verify until every move is complete.
func (f *fleet) reassign(moves map[int32][]int32, topic string) {
	t := f.t
	type part struct {
		Topic     string  `json:"topic"`
		Partition int32   `json:"partition"`
		Replicas  []int32 `json:"replicas"`
	}
	plan := struct {
		Version    int    `json:"version"`
		Partitions []part `json:"partitions"`
	}{Version: 1}
	for p, r := range moves {
		plan.Partitions = append(plan.Partitions, part{topic, p, r})
	}
	b, err := json.Marshal(plan)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "reassignment.json")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	bootstrap := os.Getenv("FERRY_KAFKA_BROKERS")
	const tool = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"
	out := strings.TrimSpace(string(javaTool(t, nil, tool, "--bootstrap-server", bootstrap, "--reassignment-json-file", file, "--execute")))
	t.Logf("kafka-reassign-partitions --execute %s: %s", b, out[strings.LastIndexByte(out, '\n')+1:])
	var verify string
	waitFor(t, fleetBound, func() bool {
		verify = string(javaTool(t, nil, tool, "--bootstrap-server", bootstrap, "--reassignment-json-file", file, "--verify"))
		return !strings.Contains(verify, "in progress")
	}, func() string { return "reassignment not complete: " + verify })
	if strings.Count(verify, "is completed") != len(moves) {
		t.Fatalf("kafka-reassign-partitions --verify: %s", verify)
	}
}

// reassignment moves each partition of the topic to a new replica set that
// drops its leader (so leadership moves too) and takes in the broker with
// the fewest of its replicas.
func (f *fleet) reassignment() {
	m, err := f.metadata()
	if err != nil {
		f.t.Fatal(err)
	}
	moves := map[int32][]int32{}
	for _, p := range m.Topics[f.topic].Partitions {
		var out []int32
		for _, id := range f.live {
			if !slices.Contains(p.Replicas, id) {
				out = append(out, id)
			}
		}
		if len(out) == 0 {
			continue
		}
		r := slices.DeleteFunc(slices.Clone(p.Replicas), func(id int32) bool { return id == p.Leader })
		moves[p.Partition] = append([]int32{out[int(p.Partition)%len(out)]}, r...)
	}
	if len(moves) == 0 {
		f.t.Fatalf("no partition to move: brokers %v", f.live)
	}
	f.reassign(moves, f.topic)
	f.waitInSync("reassigned")
	// --verify asks the controller; the broker answering Metadata learns
	// the new replica sets from the metadata log a moment later (seen: a
	// whole phase later on a quiet machine), so wait for it to say so.
	var last string
	waitFor(f.t, fleetBound, func() bool {
		m, err := f.metadata()
		if err != nil {
			last = err.Error()
			return false
		}
		for p, want := range moves {
			if got := f.partition(m, p).Replicas; !sameSet(got, want) {
				last = fmt.Sprintf("partition %d: replicas %v after the reassignment, want %v", p, got, want)
				return false
			}
		}
		return true
	}, func() string { return last })
	f.checkLog = append(f.checkLog, fmt.Sprintf("reassignment: %d partitions moved with kafka-reassign-partitions: %v", len(moves), moves))
}

func sameSet(a, b []int32) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// brokerRemoved decommissions the newest broker (the one brokerAdded
// started): its partitions move to the others, it stops, and it is
// unregistered from the cluster.
func (f *fleet) brokerRemoved() {
	t := f.t
	id := slices.Max(f.live)
	if id <= 3 {
		t.Fatalf("no added broker to remove: %v", f.live)
	}
	m, err := f.metadata()
	if err != nil {
		t.Fatal(err)
	}
	rest := slices.DeleteFunc(slices.Clone(f.live), func(x int32) bool { return x == id })
	// Every topic's partitions that live on it (internal ones too).
	for _, td := range m.Topics {
		moves := map[int32][]int32{}
		for _, p := range td.Partitions {
			if !slices.Contains(p.Replicas, id) {
				continue
			}
			var in []int32
			for _, x := range rest {
				if !slices.Contains(p.Replicas, x) {
					in = append(in, x)
				}
			}
			r := slices.Clone(p.Replicas)
			r[slices.Index(r, id)] = in[0]
			moves[p.Partition] = r
		}
		if len(moves) > 0 {
			f.reassign(moves, td.Topic)
		}
	}
	f.script("stop", strconv.Itoa(int(id)))
	javaTool(t, nil, "org.apache.kafka.tools.ClusterTool", "unregister", "--bootstrap-server", os.Getenv("FERRY_KAFKA_BROKERS"), "--id", strconv.Itoa(int(id)))
	f.live = rest
	f.waitInSync("broker removed")
	f.checkLog = append(f.checkLog, fmt.Sprintf("broker-removed: broker %d emptied with kafka-reassign-partitions, stopped and unregistered (kafka-cluster unregister)", id))
}

// proxyKilled kills the second proxy replica (SIGKILL); the clients go on
// through the first; the replica comes back on its ports.
func (f *fleet) proxyKilled() {
	p := f.proxies[1]
	p.kill()
	f.awaitMore(100, -1, "with a proxy replica killed")
	p.start()
	f.awaitMore(50, -1, "the killed proxy replica back")
	f.checkLog = append(f.checkLog, "proxy-killed: 100 records acknowledged while one of the two proxies was down")
}

// outage makes a server (through its fault proxy) refuse every connection
// for fleetOutage, then serve again; records produced meanwhile wait in the
// producers (the proxy answers KAFKA_STORAGE_ERROR, retriable).
func (f *fleet) outage(what string, fp *faultproxy.Proxy) {
	before := fp.Count(faultproxy.Down)
	fp.Set(faultproxy.Down, -1)
	time.Sleep(fleetOutage) // the outage's length is the fault itself, not a wait for a condition
	fp.Set(faultproxy.Pass, -1)
	refused := fp.Count(faultproxy.Down) - before
	f.awaitMore(100, -1, what+" back")
	if refused == 0 {
		f.t.Errorf("%s outage: no request reached the fault proxy while it was down", what)
	}
	f.checkLog = append(f.checkLog, fmt.Sprintf("%s-unavailable: %d requests refused over %s", what, refused, fleetOutage))
}
