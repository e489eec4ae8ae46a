package integration

// faultLoad is the record accounting shared by the tests that run clients
// through `ferry proxy` processes while brokers and proxies fail
// (soak_restarts_test.go, fleet_test.go): idempotent franz-go producers
// (acks=all) write records whose keys are unique ids and whose values
// follow from the ids (some above the large-message threshold, so the
// payload store is in play), consumers read them back, and at the end each
// phase (a fault) is tallied: sent, acknowledged, failed, missing
// (acknowledged, never read), duplicated (one id at two offsets), dangling
// references (a reference record whose object cannot be read), corrupt
// values and consumer errors.

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
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

type loadPos struct {
	p int32
	o int64
}

// faultLoad counts one run's records. Ids are "PHASE/pN-SEQ": the phase
// current when the record was produced, so each fault gets its own tally.
type faultLoad struct {
	t     *testing.T
	topic string
	phase atomic.Pointer[string]

	mu        sync.Mutex
	acked     map[string]bool
	ackedOn   map[string]map[int32]int // per phase, per partition
	sent      map[string]int           // per phase
	failed    map[string]int           // per phase
	firstErrs []string

	cmu       sync.Mutex
	seen      map[string]map[loadPos]bool
	rereads   int64
	corrupt   []string
	fetchErrs map[string]int // per phase

	producers     sync.WaitGroup
	stopProducers chan struct{}
	produceCtx    context.Context
	cancelProduce context.CancelFunc
	consumers     sync.WaitGroup
	consCtx       context.Context
	stopConsumers context.CancelFunc
}

func newFaultLoad(t *testing.T, topic, phase string) *faultLoad {
	l := &faultLoad{t: t, topic: topic, acked: map[string]bool{}, ackedOn: map[string]map[int32]int{}, sent: map[string]int{}, failed: map[string]int{},
		seen: map[string]map[loadPos]bool{}, fetchErrs: map[string]int{}, stopProducers: make(chan struct{})}
	l.produceCtx, l.cancelProduce = context.WithCancel(context.Background())
	l.consCtx, l.stopConsumers = context.WithCancel(context.Background())
	t.Cleanup(l.cancelProduce)
	t.Cleanup(l.stopConsumers)
	l.setPhase(phase)
	return l
}

// setPhase names the records produced from now on.
func (l *faultLoad) setPhase(p string) { l.phase.Store(&p) }

func phaseOf(id string) string { p, _, _ := strings.Cut(id, "/"); return p }

// startProducer runs one idempotent producer (acks=all) on seeds, a record
// every interval, until finish; opts are more client options.
func (l *faultLoad) startProducer(seeds []string, interval time.Duration, opts ...kgo.Opt) {
	l.producers.Add(1)
	name := fmt.Sprintf("p%d", producerSeq.Add(1))
	go func() {
		defer l.producers.Done()
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seeds...), kgo.DefaultProduceTopic(l.topic),
			kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerBatchMaxBytes(1 << 20)}, opts...)...)
		if err != nil {
			l.fail(*l.phase.Load(), name+": "+err.Error())
			return
		}
		defer cl.Close()
		sem := make(chan struct{}, 200)
		tick := time.NewTicker(interval)
		defer tick.Stop()
	loop:
		for seq := 0; ; seq++ {
			select {
			case <-l.stopProducers:
				break loop
			case <-tick.C:
			}
			phase := *l.phase.Load()
			id := fmt.Sprintf("%s/%s-%07d", phase, name, seq)
			large := seq%soakLargeEvery == soakLargeEvery-1
			sem <- struct{}{}
			l.mu.Lock()
			l.sent[phase]++
			l.mu.Unlock()
			cl.Produce(l.produceCtx, &kgo.Record{Key: []byte(id), Value: soakValue(id, large)}, func(r *kgo.Record, err error) {
				<-sem
				if err != nil {
					l.fail(phase, fmt.Sprintf("%s: %v", id, err))
					return
				}
				l.mu.Lock()
				l.acked[id] = true
				if l.ackedOn[phase] == nil {
					l.ackedOn[phase] = map[int32]int{}
				}
				l.ackedOn[phase][r.Partition]++
				l.mu.Unlock()
			})
		}
		if err := cl.Flush(ctxT(l.t, 5*time.Minute)); err != nil {
			l.mu.Lock()
			l.firstErrs = append(l.firstErrs, name+" flush: "+err.Error())
			l.mu.Unlock()
		}
	}()
}

var producerSeq atomic.Int64

func (l *faultLoad) fail(phase, msg string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failed[phase]++
	if len(l.firstErrs) < 10 {
		l.firstErrs = append(l.firstErrs, phase+": "+msg)
	}
}

// ackedIn is how many records of phase were acknowledged so far, in all
// partitions, or in partition p alone when p >= 0.
func (l *faultLoad) ackedIn(phase string, p int32) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for part, c := range l.ackedOn[phase] {
		if p < 0 || part == p {
			n += c
		}
	}
	return n
}

// startConsumer reads the topic on seeds from its start: in group (a
// consumer group, committing as it goes) or, with group "", every
// partition without a group; extra are more client options.
func (l *faultLoad) startConsumer(seeds []string, group string, extra ...kgo.Opt) {
	l.consumers.Add(1)
	go func() {
		defer l.consumers.Done()
		opts := append([]kgo.Opt{kgo.SeedBrokers(seeds...), kgo.ConsumeTopics(l.topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxBytes(16 << 20)}, extra...)
		if group != "" {
			// New partitions (a broker added) join the assignment at the
			// next metadata refresh.
			opts = append(opts, kgo.ConsumerGroup(group), kgo.MetadataMaxAge(5*time.Second))
		}
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			l.consumerErr(err)
			return
		}
		defer cl.Close()
		for l.consCtx.Err() == nil {
			fs := cl.PollFetches(l.consCtx)
			fs.EachError(func(_ string, _ int32, err error) {
				if l.consCtx.Err() == nil {
					l.consumerErr(err)
				}
			})
			l.cmu.Lock()
			fs.EachRecord(l.read)
			l.cmu.Unlock()
		}
	}()
}

func (l *faultLoad) consumerErr(err error) {
	phase := *l.phase.Load()
	l.cmu.Lock()
	l.fetchErrs[phase]++
	l.cmu.Unlock()
	l.t.Logf("%s: consumer error (the client retries): %v", phase, err)
}

// read checks one record a consumer got; l.cmu is held.
func (l *faultLoad) read(r *kgo.Record) {
	id := string(r.Key)
	large := len(r.Value) > soakSmallValue
	if largemessage.IsOffloaded(r) || !bytes.Equal(r.Value, soakValue(id, large)) {
		l.corrupt = append(l.corrupt, fmt.Sprintf("%s at %d/%d (%d bytes)", id, r.Partition, r.Offset, len(r.Value)))
	}
	if l.seen[id] == nil {
		l.seen[id] = map[loadPos]bool{}
	}
	at := loadPos{r.Partition, r.Offset}
	if l.seen[id][at] {
		l.rereads++
	}
	l.seen[id][at] = true
}

// loadTally is one phase's figures.
type loadTally struct {
	phase                                       string
	sent, acked, large, failed, missing, dups   int
	refs, dangling, corrupt, consumerErrs       int
	rereads                                     int64 // "all" only: a record read again at its offset (a rebalance, a retried fetch)
	missingIDs, dupIDs, danglingIDs, corruptIDs []string
}

func (c loadTally) String() string {
	return fmt.Sprintf("%s: %d records sent, %d acknowledged (%d large), failed %d, missing %d, duplicates %d, dangling references %d (of %d), corrupt %d, consumer errors %d",
		c.phase, c.sent, c.acked, c.large, c.failed, c.missing, c.dups, c.dangling, c.refs, c.corrupt, c.consumerErrs) + map[bool]string{true: fmt.Sprintf(", re-reads at one offset %d", c.rereads)}[c.phase == "all"]
}

// finish stops the producers, waits (within bound) for the consumers to
// read every acknowledged record, stops them, checks every reference record
// in the topic against store (resolve), and returns the tallies of phases,
// in that order, plus their sum as "all". readAll reads the topic straight
// from the cluster FERRY_KAFKA_BROKERS names.
func (l *faultLoad) finish(bound time.Duration, store payloadstore.PayloadStore, phases []string) []loadTally {
	t := l.t
	close(l.stopProducers)
	l.producers.Wait()
	l.mu.Lock()
	want := make([]string, 0, len(l.acked))
	for id := range l.acked {
		want = append(want, id)
	}
	l.mu.Unlock()
	missing := func() []string {
		l.cmu.Lock()
		defer l.cmu.Unlock()
		var m []string
		for _, id := range want {
			if l.seen[id] == nil {
				m = append(m, id)
			}
		}
		return m
	}
	for deadline := time.Now().Add(bound); len(missing()) > 0 && time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
	}
	l.stopConsumers()
	l.consumers.Wait()

	tallies := map[string]*loadTally{}
	tally := func(id string) *loadTally {
		p := phaseOf(id)
		if tallies[p] == nil {
			tallies[p] = &loadTally{phase: p}
		}
		return tallies[p]
	}
	for _, id := range missing() {
		c := tally(id)
		c.missing++
		c.missingIDs = append(c.missingIDs, id)
	}
	for _, id := range want {
		c := tally(id)
		c.acked++
		if isLargeID(id) {
			c.large++
		}
	}
	l.mu.Lock()
	for p, n := range l.sent {
		tally(p + "/").sent += n
	}
	for p, n := range l.failed {
		tally(p + "/").failed += n
	}
	l.mu.Unlock()
	l.cmu.Lock()
	for id, at := range l.seen {
		if len(at) > 1 {
			c := tally(id)
			c.dups++
			c.dupIDs = append(c.dupIDs, fmt.Sprintf("%s at %v", id, at))
		}
	}
	for _, s := range l.corrupt {
		c := tally(s)
		c.corrupt++
		c.corruptIDs = append(c.corruptIDs, s)
	}
	for p, n := range l.fetchErrs {
		tally(p + "/").consumerErrs += n
	}
	l.cmu.Unlock()

	de := largemessage.NewDeserializer(store, false)
	for _, r := range readAll(t, l.topic) {
		if !largemessage.IsOffloaded(r) {
			continue
		}
		c := tally(string(r.Key))
		c.refs++
		if err := de.Resolve(ctxT(t, time.Minute), r); err != nil {
			c.dangling++
			c.danglingIDs = append(c.danglingIDs, fmt.Sprintf("%s at %d/%d: %v", r.Key, r.Partition, r.Offset, err))
		}
	}

	out := make([]loadTally, 0, len(phases)+1)
	all := loadTally{phase: "all", rereads: l.rereads}
	for _, p := range phases {
		c := tallies[p]
		if c == nil {
			c = &loadTally{phase: p}
		}
		out = append(out, *c)
	}
	for _, c := range tallies {
		all.sent += c.sent
		all.acked += c.acked
		all.large += c.large
		all.failed += c.failed
		all.missing += c.missing
		all.dups += c.dups
		all.refs += c.refs
		all.dangling += c.dangling
		all.corrupt += c.corrupt
		all.consumerErrs += c.consumerErrs
		all.missingIDs = append(all.missingIDs, c.missingIDs...)
		all.dupIDs = append(all.dupIDs, c.dupIDs...)
		all.danglingIDs = append(all.danglingIDs, c.danglingIDs...)
		all.corruptIDs = append(all.corruptIDs, c.corruptIDs...)
	}
	return append(out, all)
}

// isLargeID: the producer made id's value large (every soakLargeEvery-th
// sequence number).
func isLargeID(id string) bool {
	i := strings.LastIndexByte(id, '-')
	var seq int
	if _, err := fmt.Sscanf(id[i+1:], "%d", &seq); err != nil {
		return false
	}
	return seq%soakLargeEvery == soakLargeEvery-1
}

// check fails the test unless c has 0 failed, missing, duplicated, dangling
// and corrupt records; minAcked > 0 also wants that many acknowledged.
func (l *faultLoad) check(c loadTally, minAcked int) {
	t := l.t
	t.Helper()
	if c.failed != 0 {
		l.mu.Lock()
		t.Errorf("%s: %d records failed: %v", c.phase, c.failed, l.firstErrs)
		l.mu.Unlock()
	}
	if c.missing != 0 {
		t.Errorf("%s: %d acknowledged records never read, e.g. %v", c.phase, c.missing, c.missingIDs[:min(5, len(c.missingIDs))])
	}
	if c.dups != 0 {
		t.Errorf("%s: %d records read at more than one offset, e.g. %v", c.phase, c.dups, c.dupIDs[:min(5, len(c.dupIDs))])
	}
	if c.dangling != 0 {
		t.Errorf("%s: %d of %d reference records name a missing object, e.g. %v", c.phase, c.dangling, c.refs, c.danglingIDs[:min(5, len(c.danglingIDs))])
	}
	if c.corrupt != 0 {
		t.Errorf("%s: %d values read wrong, e.g. %v", c.phase, c.corrupt, c.corruptIDs[:min(5, len(c.corruptIDs))])
	}
	if c.acked < minAcked {
		t.Errorf("%s proved little: %d acknowledged records, want at least %d", c.phase, c.acked, minAcked)
	}
}

// proxyReplica is a `ferry proxy` process (config cfg, fixed ports) that a
// test kills with SIGKILL and starts again where its clients left it.
type proxyReplica struct {
	t        *testing.T
	bin, cfg string

	mu        sync.Mutex
	p         *ferryProxy // nil while killed
	bootstrap string
	logs      []string // stderr of every earlier process
}

func startProxyReplica(t *testing.T, bin, cfg string) *proxyReplica {
	r := &proxyReplica{t: t, bin: bin, cfg: cfg}
	r.start()
	return r
}

// kill ends the process with SIGKILL: no drain, clients' requests in flight are cut.
func (r *proxyReplica) kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.p == nil {
		return
	}
	_ = r.p.cmd.Process.Kill()
	_ = r.p.cmd.Wait()
	r.logs = append(r.logs, r.p.stderr.String())
	r.p = nil
}

// start runs the process again; it must listen where it did.
func (r *proxyReplica) start() {
	np := startFerryProxy(r.t, r.bin, r.cfg)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.bootstrap != "" && np.bootstrap != r.bootstrap {
		r.t.Fatalf("the restarted proxy listens on %s, not %s", np.bootstrap, r.bootstrap)
	}
	r.p, r.bootstrap = np, np.bootstrap
}

// adminAddr is the running process's admin address (host:port, for scrape).
func (r *proxyReplica) adminAddr() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.p == nil {
		r.t.Fatalf("the proxy replica is not running")
	}
	return strings.TrimSuffix(strings.TrimPrefix(r.p.metrics, "http://"), "/metrics")
}

// stderr is the log of every process so far, the running one's too.
func (r *proxyReplica) stderr() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	all := strings.Join(r.logs, "")
	if r.p != nil {
		all += r.p.stderr.String()
	}
	return all
}

// logHeld logs what the proxies' logs say of the requests they held while
// an upstream broker was away (logged at info).
func logHeld(t *testing.T, replicas ...*proxyReplica) {
	var all string
	for _, r := range replicas {
		all += r.stderr()
	}
	t.Logf("proxy logs: %d held connections, %d reached the broker after waiting, %d gave up",
		strings.Count(all, "holding the client's request"), strings.Count(all, "the held request goes on"),
		strings.Count(all, "cannot reach the upstream broker; closing"))
}
