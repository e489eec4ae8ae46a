package interceptor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/ferrykit/ferry/observe"
	"github.com/prometheus/client_golang/prometheus"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// KeyTimeout is the configuration key of the per-call time budget.
const KeyTimeout = "produce.request.interceptor.timeout.ms"

// DefaultTimeout is KeyTimeout's default.
const DefaultTimeout = 5 * time.Second

// Options configure a Chain.
type Options struct {
	// Timeout is the time budget of one interceptor call
	// (produce.request.interceptor.timeout.ms, also used on fetch);
	// 0 means DefaultTimeout.
	Timeout time.Duration
	// TopicName resolves a topic id to its name, for produce requests v13+
	// and fetch responses v13+, which carry ids instead of names. A topic
	// it cannot name (nil, or false) is refused with UNKNOWN_TOPIC_ID:
	// never passed uninspected.
	TopicName func(id [16]byte) (string, bool)
	// Memory is the budget all calls share (proxy.memory.max.bytes);
	// nil: NewMemory(DefaultMemoryMax).
	Memory *Memory
	// BatchDecompressedMax and RequestDecompressedMax bound the bytes one
	// batch, and all batches of one request or response, decompress to
	// (interceptor.batch.decompressed.max.bytes, default 100 MiB;
	// interceptor.request.decompressed.max.bytes, default 200 MiB).
	BatchDecompressedMax, RequestDecompressedMax int64
	// Metrics counts each interceptor call's time and the partitions
	// refused or failed, by reason (observe.Metrics); Build also hands it
	// to the built-ins, whose payload store it then counts. nil: none.
	Metrics *observe.Metrics
	// Tracer traces the records large-message offloads and resolves (see
	// docs/OPERATIONS.md); Build hands it to the built-ins. nil: off.
	Tracer *observe.Tracer
}

// Chain runs interceptors in their configured order. It is safe for
// concurrent use; its interceptors must be too.
type Chain struct {
	produce []ProduceRequestInterceptor
	fetch   []FetchResponseInterceptor
	timeout time.Duration
	names   func([16]byte) (string, bool)
	mem     *Memory
	// per-batch and per-request decompression bounds (bytes)
	batchMax, requestMax int64
	// instances are closed by Close (set by Build).
	instances []Instance
	// m counts calls and rejections (nil: not counted); produceObs and
	// fetchObs are the call-time histograms of produce[i] and fetch[i].
	m                    *observe.Metrics
	produceObs, fetchObs []prometheus.Observer
	// calls counts the goroutines of run still going, abandoned ones
	// included; closing is set by Close, which leaves closing the
	// instances to the last of them (callMu guards both).
	callMu    sync.Mutex
	calls     int
	closing   bool
	closeOnce sync.Once
	// skimMu guards skimTopics: the skimmers of the topics skimmed so
	// far, produce [0] and fetch [1] (skim.go), so that a topic's
	// patterns are matched once, not on every request.
	skimMu     sync.Mutex
	skimTopics [2]map[string]skimEntry
	// dog times the inline runs (runInline).
	dog inlineDog
	// produceInline: every produce interceptor is an inliner (QuickProduce).
	produceInline bool
}

// closeInstances closes the instances, once.
func (c *Chain) closeInstances() (err error) {
	c.closeOnce.Do(func() { err = closeAll(c.instances) })
	return err
}

// enter counts a run goroutine.
func (c *Chain) enter() {
	c.callMu.Lock()
	c.calls++
	c.callMu.Unlock()
}

// leave counts a run goroutine's end (an abandoned one's after its undo):
// the last one after Close closes the instances.
func (c *Chain) leave() {
	c.callMu.Lock()
	c.calls--
	last := c.closing && c.calls == 0
	c.callMu.Unlock()
	if last {
		_ = c.closeInstances()
	}
}

// Timeout returns the time budget of one interceptor call, which also
// bounds a wait for memory (produce.request.interceptor.timeout.ms).
func (c *Chain) Timeout() time.Duration { return c.timeout }

// NewChain returns a chain of the produce interceptors of instances in their
// order, and of the fetch interceptors in the reverse order: a fetch undoes
// what a produce did, so with [redact, large-message] a produce redacts then
// offloads, and a fetch restores the payload then redacts it (as response
// filters run in reverse in other proxies).
func NewChain(instances []Instance, o Options) *Chain {
	c := &Chain{timeout: o.Timeout, names: o.TopicName, mem: o.Memory, batchMax: o.BatchDecompressedMax, requestMax: o.RequestDecompressedMax}
	if c.timeout <= 0 {
		c.timeout = DefaultTimeout
	}
	if c.mem == nil {
		c.mem = NewMemory(DefaultMemoryMax)
	}
	if c.batchMax <= 0 {
		c.batchMax = DefaultBatchDecompressedMax
	}
	if c.requestMax <= 0 {
		c.requestMax = DefaultRequestDecompressedMax
	}
	for _, in := range instances {
		if in.Produce != nil {
			c.produce = append(c.produce, in.Produce)
		}
		if in.Fetch != nil {
			c.fetch = append(c.fetch, in.Fetch)
		}
	}
	slices.Reverse(c.fetch)
	c.produceInline = len(c.produce) > 0 && !slices.ContainsFunc(c.produce, func(ic ProduceRequestInterceptor) bool { return !inlineOf(ic) })
	c.m = o.Metrics
	if c.m != nil {
		for _, ic := range c.produce {
			c.produceObs = append(c.produceObs, c.m.InterceptorObserver(ic.Name(), observe.DirectionProduce))
		}
		for _, ic := range c.fetch {
			c.fetchObs = append(c.fetchObs, c.m.InterceptorObserver(ic.Name(), observe.DirectionFetch))
		}
	}
	return c
}

// rejected counts a partition failed with code (0: every record skipped).
func (c *Chain) rejected(topic, direction string, code int16) {
	if c.m == nil {
		return
	}
	reason := "ALL_RECORDS_SKIPPED"
	if ke, ok := kerr.ErrorForCode(code).(*kerr.Error); ok {
		reason = ke.Message
	}
	if topic == "" {
		topic = observe.OtherTopic
	}
	c.m.Rejected(topic, direction, reason)
}

// HasProduce and HasFetch report whether the chain has interceptors of that
// kind, so the proxy can leave requests or responses undecoded otherwise.
func (c *Chain) HasProduce() bool { return len(c.produce) > 0 }
func (c *Chain) HasFetch() bool   { return len(c.fetch) > 0 }

// QuickProduce reports whether a Produce request frame of size bytes may
// be one InterceptProduce runs on the caller's goroutine alone: every
// produce interceptor is an inliner and the records fit serialMaxBytes
// (uncompressed batches; compressed ones run side by side). It then
// takes well under a millisecond, unless a call waits (a KMS), and the
// proxy need not watch the client's socket from the start to stop it (a
// goroutine, a park and two deadline changes per request): it watches from
// when the request turns out slow (WithSlowRequest).
func (c *Chain) QuickProduce(size int) bool { return c.produceInline && size <= serialMaxBytes }

// proc is one interceptor as the chain calls it.
type proc struct {
	name string
	call func(context.Context, *Record) error
	obs  prometheus.Observer // the call-time histogram; nil: not timed
	// batch is the interceptor's ProcessBatch when it is a
	// BatchInterceptor (nil otherwise).
	batch func(context.Context, []*Record) ([]error, error)
	// inline: the interceptor is an inliner.
	inline bool
}

// inliner is a built-in whose calls do CPU work linear in the record they
// are given and otherwise wait only on what ctx ends (the memory budget, a
// KMS, another call's KMS request within its own budget): a call it makes
// returns soon after ctx is cancelled. A small partition that only
// inliners see runs on the request's goroutine (see runPart). encrypt,
// redact and validate-json without a schema are inliners.
type inliner interface{ inline() bool }

// inlineOnly reports whether every one of ps is an inliner.
func inlineOnly(ps []proc) bool {
	return !slices.ContainsFunc(ps, func(p proc) bool { return !p.inline })
}

func inlineOf(ic any) bool {
	in, ok := ic.(inliner)
	return ok && in.inline()
}

// batchOf returns ic's ProcessBatch if it has one.
func batchOf(ic any) func(context.Context, []*Record) ([]error, error) {
	if b, ok := ic.(BatchInterceptor); ok {
		return b.ProcessBatch
	}
	return nil
}

func (c *Chain) obsOf(obs []prometheus.Observer, i int) prometheus.Observer {
	if i < len(obs) {
		return obs[i]
	}
	return nil
}

func (c *Chain) topicName(name string, id [16]byte) (string, bool) {
	if name != "" {
		return name, true
	}
	if c.names == nil || id == ([16]byte{}) {
		return "", false
	}
	return c.names(id)
}

// Memory returns the chain's memory budget.
func (c *Chain) Memory() *Memory { return c.mem }

// newBounds starts a request's decompression allowance.
func (c *Chain) newBounds() *bounds { return &bounds{batchMax: c.batchMax, requestMax: c.requestMax} }

// ledger starts a worker's (or an outcome's) charges against the budget.
func (c *Chain) ledger(b *bounds) *ledger { return &ledger{mem: c.mem, req: b, wait: c.timeout} }

// Shrinks reports whether a produce interceptor for topic can make its
// records smaller (a BatchShrinker: large-message), so that a batch the
// broker refused as over the topic's max.message.bytes may fit when the
// producer sends it again and the chain checks it against the topic's
// current limit.
func (c *Chain) Shrinks(topic string) bool {
	for _, ic := range c.produce {
		if _, ok := ic.(BatchShrinker); ok && ic.TopicPattern().MatchString(topic) {
			return true
		}
	}
	return false
}

func (c *Chain) produceProcs(topic string) (ps []proc, shrinkers []BatchShrinker) {
	for i, ic := range c.produce {
		if ic.TopicPattern().MatchString(topic) {
			ps = append(ps, proc{ic.Name(), ic.ProcessRecord, c.obsOf(c.produceObs, i), batchOf(ic), inlineOf(ic)})
			if s, ok := ic.(BatchShrinker); ok {
				shrinkers = append(shrinkers, s)
			}
		}
	}
	return ps, shrinkers
}

func (c *Chain) fetchProcs(topic string) (ps []proc, sizers []FetchSizer) {
	for i, ic := range c.fetch {
		if ic.TopicPattern().MatchString(topic) {
			ps = append(ps, proc{ic.Name(), ic.ProcessRecord, c.obsOf(c.fetchObs, i), batchOf(ic), inlineOf(ic)})
			if s, ok := ic.(FetchSizer); ok {
				sizers = append(sizers, s)
			}
		}
	}
	return ps, sizers
}

// failure is why a partition failed.
type failure struct {
	code    int16
	msg     string
	records []kmsg.ProduceResponseTopicPartitionErrorRecord
	err     error
}

func fail(code int16, err error) *failure { return &failure{code: code, msg: err.Error(), err: err} }

// codeOf is the Kafka error code for an interceptor's error: the *kerr.Error
// it wraps, else def.
func codeOf(err error, def int16) int16 {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return ke.Code
	}
	return def
}

// clockBase is where the chain's call clock starts: a call's start is
// read as the monotonic time since it (one clock reading per call, where
// time.Now reads two clocks).
var clockBase = time.Now()

// callClock returns the monotonic ns since clockBase, never 0 (0 marks
// "between calls" in a watch).
func callClock() int64 { return int64(time.Since(clockBase)) | 1 }

// watch is the call tracker shared by a partition's worker and its waiter.
type watch struct {
	start atomic.Int64 // callClock when the current call started, 0 between calls
	name  atomic.Pointer[string]
	index atomic.Int64
}

// inlineMaxBytes bounds the record bytes of a partition that runPart may
// process on the request's goroutine: what an inliner does with them (seal,
// open, redact, validate) takes milliseconds, well within any budget.
const inlineMaxBytes = 1 << 20

// runPart runs the work of one partition of size record bytes whose
// interceptors are ps. When every one of them is an inliner and the
// partition is at most inlineMaxBytes, it runs on this goroutine
// (runInline): a goroutine per partition, its stack growth and the wake-up
// of its waiter were a third of encrypt's CPU behind Kafka's perf producer
// (BenchmarkEncryptSmallBatches). Otherwise in a goroutine of its own
// (run), so that a call that ignores ctx cannot hold the connection past
// its budget.
func (c *Chain) runPart(ctx context.Context, led *ledger, ps []proc, size int, work func(ctx context.Context, w *watch) (any, *failure)) (any, *failure) {
	if runsInline(ps, size) {
		return c.runInline(ctx, led, work)
	}
	return c.run(ctx, led, work)
}

// runsInline reports whether runPart runs a partition of size record
// bytes that ps see on the caller's goroutine.
func runsInline(ps []proc, size int) bool { return size <= inlineMaxBytes && inlineOnly(ps) }

// overrun is what run's timer or the inline watchdog found: the failure of the call that
// ran over it (nil if none did), or how long until the current call (or
// the next) can run over.
func (c *Chain) overrun(w *watch) (*failure, time.Duration) {
	s := w.start.Load()
	if s == 0 {
		return nil, c.timeout
	}
	over := time.Duration(callClock() - s)
	if over < c.timeout {
		return nil, c.timeout - over
	}
	name := "?"
	if p := w.name.Load(); p != nil {
		name = *p
	}
	return fail(kerr.RequestTimedOut.Code, fmt.Errorf(
		"interceptor %s ran over %s=%d on record %d; the partition was not processed",
		name, KeyTimeout, c.timeout.Milliseconds(), w.index.Load())), 0
}

// run runs work in a goroutine and waits for it, giving each interceptor
// call (timed by calls made through w) the chain's budget. A call that runs
// over cancels ctx and fails the partition with REQUEST_TIMED_OUT at once;
// the abandoned goroutine's result is discarded and the memory it charged
// to led given back when it ends. On success the caller owns led's
// charges; on failure they are given back.
func (c *Chain) run(ctx context.Context, led *ledger, work func(ctx context.Context, w *watch) (any, *failure)) (any, *failure) {
	wctx, cancel := context.WithCancel(ctx)
	type result struct {
		v any
		f *failure
	}
	done := make(chan result, 1)
	w := &watch{}
	c.enter()
	go func() {
		var r result
		defer func() {
			if p := recover(); p != nil {
				r = result{f: fail(kerr.UnknownServerError.Code, fmt.Errorf("interceptor panicked: %v", p))}
			}
			if r.f != nil {
				led.release()
			}
			done <- r
		}()
		r.v, r.f = work(wctx, w)
	}()
	got := false
	defer func() {
		if !got { // abandoned: give its memory back, undo its work, when it ends
			go func() {
				defer c.leave() // its instances stay open until then
				if r := <-done; r.f == nil {
					led.release()
					abandon(ctx, r.v)
				}
			}()
		} else {
			c.leave()
		}
	}()
	timer := time.NewTimer(c.timeout)
	defer timer.Stop()
	for {
		select {
		case r := <-done:
			got = true
			cancel()
			return r.v, r.f
		case <-ctx.Done():
			cancel()
			return nil, stopped(ctx)
		case <-timer.C:
			f, next := c.overrun(w)
			if f != nil {
				cancel()
				return nil, f
			}
			timer.Reset(next)
		}
	}
}

// runInline is run on the caller's goroutine, for work whose calls return
// soon after ctx is cancelled (runPart): the chain's inline watchdog
// (inlineDog) does what run's waiter does, cancelling ctx when a call runs
// over its budget, and the partition fails with REQUEST_TIMED_OUT when
// that call returns. Its results, led's charges and a panic are handled as
// run handles them.
func (c *Chain) runInline(ctx context.Context, led *ledger, work func(ctx context.Context, w *watch) (any, *failure)) (v any, f *failure) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := &inlineRun{cancel: cancel}
	if slow, ok := ctx.Value(slowRunKey{}).(*slowRequest); ok {
		r.slow = slow
	}
	c.dog.watch(c, r)
	c.enter()
	defer c.leave()
	func() {
		defer func() {
			if p := recover(); p != nil {
				v, f = nil, fail(kerr.UnknownServerError.Code, fmt.Errorf("interceptor panicked: %v", p))
			}
		}()
		v, f = work(wctx, &r.w)
	}()
	over := c.dog.unwatch(r)
	if over == nil && ctx.Err() == nil {
		if f != nil {
			led.release()
		}
		return v, f
	}
	led.release() // ran over, or the client went away: as run's abandoned work
	if f == nil {
		abandon(ctx, v)
	}
	if over != nil {
		return nil, over
	}
	return nil, stopped(ctx)
}

// inlineDog cancels the inline runs (runInline) whose current call has run
// over the chain's budget: one goroutine per chain, looking every
// budget/dogTicks while runs are in progress and ending when none is.
// A timer per run (time.AfterFunc) woke an idle P and its thread each time
// it was armed, to watch a 5 s budget that a run of a millisecond never
// reached: 6 % of `encrypt`'s produce CPU behind Kafka's perf producer
// (futex wake-ups under time.AfterFunc). A call is cancelled at most
// budget/dogTicks after its budget ran out.
type inlineDog struct {
	mu      sync.Mutex
	live    map[*inlineRun]struct{}
	running bool // a goroutine runs loop
}

// dogTicks: the watchdog looks this many times per budget.
const dogTicks = 8

// inlineRun is one inline run as its watchdog sees it.
type inlineRun struct {
	w       watch
	cancel  context.CancelFunc
	overran *failure // set by the watchdog (under its mu) when it cancelled the run
	// slow: the request's hook (WithSlowRequest) when it runs serially;
	// the watchdog starts it for a call that has run serialMaxTime, and
	// the run is cancelled when its context ends (the client went away).
	// Under the watchdog's mu; nil once started, and watched is then the
	// context it returned.
	slow    *slowRequest
	watched context.Context
}

// watch adds r to the runs watched, starting the watchdog's goroutine if
// none runs.
func (d *inlineDog) watch(c *Chain, r *inlineRun) {
	d.mu.Lock()
	if d.live == nil {
		d.live = map[*inlineRun]struct{}{}
	}
	d.live[r] = struct{}{}
	if !d.running {
		d.running = true
		go d.loop(c)
	}
	d.mu.Unlock()
}

// unwatch removes r and returns why the watchdog cancelled it (nil: it
// did not): the run went over its budget, or the watch it started for a
// slow request (inlineRun.slow) ended (the client went away).
func (d *inlineDog) unwatch(r *inlineRun) *failure {
	d.mu.Lock()
	delete(d.live, r)
	f, watched := r.overran, r.watched
	d.mu.Unlock()
	if f == nil && watched != nil && watched.Err() != nil {
		f = stopped(watched)
	}
	return f
}

// loop looks at the runs every budget/dogTicks until none is left.
func (d *inlineDog) loop(c *Chain) {
	t := time.NewTicker(max(c.timeout/dogTicks, time.Millisecond))
	defer t.Stop()
	for range t.C {
		d.mu.Lock()
		for r := range d.live {
			if f, _ := c.overrun(&r.w); f != nil {
				r.overran = f
				r.cancel()
				delete(d.live, r)
				continue
			}
			if s := r.w.start.Load(); r.slow != nil && s != 0 && time.Duration(callClock()-s) >= serialMaxTime {
				// Under mu: the run's unwatch, and so the return of
				// the request's InterceptProduce, comes after the hook.
				r.watched = r.slow.start()
				context.AfterFunc(r.watched, r.cancel)
				r.slow = nil
			}
		}
		if len(d.live) == 0 {
			d.running = false
			d.mu.Unlock()
			return
		}
		d.mu.Unlock()
	}
}

// stopped is the failure of a partition whose ctx ended (the client went
// away, or the proxy is closing).
func stopped(ctx context.Context) *failure {
	return fail(kerr.RequestTimedOut.Code, fmt.Errorf("interceptors stopped: %w", ctx.Err()))
}

// abandon undoes the work of a partition whose result is discarded.
func abandon(ctx context.Context, v any) {
	if a, ok := v.(interface{ abandon(context.Context) }); ok {
		a.abandon(context.WithoutCancel(ctx))
	}
}

// call makes one timed interceptor call. The budget is enforced by run's
// watcher, which cancels ctx when the call runs over: no timer per call.
// p must stay valid while the watcher may read its name (procs live in
// the partition's slice: passing a pointer keeps a call free of
// allocations).
func (c *Chain) call(ctx context.Context, w *watch, p *proc, index int, r *Record) error {
	w.name.Store(&p.name)
	w.index.Store(int64(index))
	start := callClock()
	w.start.Store(start)
	n := len(r.deferred)
	err := p.call(ctx, r)
	if p.obs != nil {
		p.obs.Observe(time.Duration(callClock() - start).Seconds())
	}
	for i := n; i < len(r.deferred); i++ {
		r.deferred[i].name = p.name
	}
	w.start.Store(0)
	if err == nil && ctx.Err() != nil {
		err = fmt.Errorf("stopped: %w", ctx.Err())
	}
	return err
}

// toRecord converts a decoded record for an interceptor.
func toRecord(topic string, partition int32, h *kmsg.RecordBatch, info BatchInfo, kr *kmsg.Record, index int, fetch bool) Record {
	r := Record{Topic: topic, Partition: partition, Key: kr.Key, Value: kr.Value, Batch: info,
		Timestamp: h.FirstTimestamp + kr.TimestampDelta64, Offset: int64(index)}
	if fetch {
		r.Offset = h.FirstOffset + int64(kr.OffsetDelta)
		if h.Attributes&0x08 != 0 { // LogAppendTime
			r.Timestamp = h.MaxTimestamp
		}
	}
	if len(kr.Headers) > 0 {
		r.Headers = make([]Header, len(kr.Headers))
		for i, hd := range kr.Headers {
			r.Headers[i] = Header{Key: hd.Key, Value: hd.Value}
		}
	}
	return r
}

// apply writes r's key, value and headers back into kr and reports whether
// anything changed.
func apply(r *Record, kr *kmsg.Record) bool {
	changed := !sameBytes(r.Key, kr.Key) || !sameBytes(r.Value, kr.Value) || len(r.Headers) != len(kr.Headers)
	if !changed {
		for i, h := range r.Headers {
			if h.Key != kr.Headers[i].Key || !sameBytes(h.Value, kr.Headers[i].Value) {
				changed = true
				break
			}
		}
	}
	if !changed {
		return false
	}
	kr.Key, kr.Value = r.Key, r.Value
	kr.Headers = kr.Headers[:0]
	for _, h := range r.Headers {
		kr.Headers = append(kr.Headers, kmsg.Header{Key: h.Key, Value: h.Value})
	}
	return true
}

// sameBytes compares with Kafka's null distinct from empty.
func sameBytes(a, b []byte) bool { return (a == nil) == (b == nil) && bytes.Equal(a, b) }

func batchInfo(h *kmsg.RecordBatch, lim TopicLimit) BatchInfo {
	return BatchInfo{Compression: codecName(h.Attributes), ProducerID: h.ProducerID, ProducerEpoch: h.ProducerEpoch,
		Transactional: h.Attributes&attrTransactional != 0, MaxMessageBytes: lim.MaxMessageBytes, TopicCompression: lim.Compression}
}

// bySize orders record indexes by encoded size, largest first.
func bySize(recs []kmsg.Record, idx []int) {
	size := func(r *kmsg.Record) int {
		n := len(r.Key) + len(r.Value)
		for _, h := range r.Headers {
			n += len(h.Key) + len(h.Value)
		}
		return n
	}
	sort.SliceStable(idx, func(a, b int) bool { return size(&recs[idx[a]]) > size(&recs[idx[b]]) })
}
