package largemessage

import (
	"context"
	"errors"
	"fmt"
	"github.com/ferrykit/ferry/observe"
	"go.opentelemetry.io/otel/trace"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/payloadstore"
	"github.com/ferrykit/ferry/serde"
)

// Producer wraps a franz-go client: each record is offloaded as needed
// before it is handed to the client. It is an explicit wrapper rather than a
// kgo hook because a hook can neither return an error nor take a context.
//
// Sizing invariant (KIP-126): a record the Producer lets through inline
// never fails with MESSAGE_TOO_LARGE. Each record is sized exactly against
// its topic's limits (Serializer.Offload), and so is each batch franz-go
// builds: where the client's batch cap (ProducerBatchMaxBytes) is larger
// than the topic accepts, the Producer bounds the bytes of the topic's
// records in flight so that no batch of records that each fit can exceed
// max.message.bytes. Should the broker still answer MESSAGE_TOO_LARGE (the
// topic's limit was lowered since it was read), the Producer forgets the
// topic's cached limits, offloads the record and produces it once more,
// once the records still in flight from before fit in one batch with it
// under the new limit.
type Producer struct {
	cl        *kgo.Client
	ser       *Serializer
	threshold int64
	keySer    *serde.Chain
	valueSer  *serde.Chain
	configs   *TopicConfigs
	// The client's options that bound a batch, read once (kgo's OptValue
	// is far too slow to call per record: it names functions through the
	// runtime): ProducerBatchMaxBytesFn, BrokerMaxWriteBytes and
	// DefaultProduceTopic.
	batchMaxFn   func(string) int32
	maxWrite     int32
	defaultTopic string

	gates    sync.Map             // topic → *gate
	lastGate atomic.Pointer[gate] // the gate of the last record's topic

	tr *observe.Tracer // nil: not traced
}

// WithTracer traces each record Produce sends (a "send <topic>" span, kind
// producer, with Kafka's messaging attributes and, once acknowledged, its
// partition and offset) and carries the span's W3C trace context in the
// record's traceparent header, so that a consumer's span links to it. With
// a store wrapped by observe.Store with the same tracer, the object's
// publish is a child span. nil turns tracing off. It returns p.
func (p *Producer) WithTracer(t *observe.Tracer) *Producer {
	p.tr = t
	return p
}

// gate counts the batch bytes of one topic's records in flight (from the
// Producer's hand-off to franz-go to the record's promise: buffered in the
// client or awaiting the broker's answer) and, when franz-go's batch cap is
// larger than the topic accepts, admits a record only while the bytes in
// flight stay within one batch the topic accepts. franz-go builds a batch
// of records in flight only, so no batch is larger. Every record is
// counted, bounded or not, so that when the topic's limit is lowered the
// records sent under the old limit are counted against the new one: a
// record retried after MESSAGE_TOO_LARGE waits for them.
type gate struct {
	topic string
	mu    sync.Mutex
	// The batch bytes admitted and not yet released are taken - given
	// (inflight): two counters that only grow, on cache lines of their
	// own, so that the producing goroutine (take) and franz-go's promise
	// goroutine (give) do not write to one line.
	_     [64]byte
	taken atomic.Int64
	_     [56]byte
	given atomic.Int64
	_     [56]byte
	// slow is set while admitting takes mu: the capacity is bounded or
	// records wait. While it is clear every record fits, and take and
	// give only add to their counter (no lock shared between the
	// producing goroutine and franz-go's). It changes under mu only.
	slow     atomic.Bool
	waiters  []*gateWaiter // FIFO
	capacity int64         // batch bytes one batch may hold; math.MaxInt64 when franz-go's cap suffices
	limits   Limits        // the limits capacity was derived from
	limitsAt uint64        // the generation those limits were read in
	gen      atomic.Uint64 // bumped when the topic's limits are found stale (MESSAGE_TOO_LARGE)
	warned   bool
	// config holds the limits derived from the topic's configuration as
	// the Producer last read it, for the records of generation
	// config.gen, until its cache entry expires (a timer clears it):
	// Produce reads them without a lock or a clock. applied is the last
	// config whose limits went through setLimits.
	config  atomic.Pointer[gateConfig]
	applied atomic.Pointer[gateConfig]
}

type gateConfig struct {
	l   Limits
	gen uint64
}

type gateWaiter struct {
	n     int64
	ready chan struct{}
}

// NewProducer returns a Producer over cl. cfg gives the store (opened with
// cfg.OpenStore by the caller and passed as store), the threshold and the
// codec. When cfg.Codec.Type is empty the codec is taken from the client's
// ProducerBatchCompression; when it is set it must be the client's (checked
// on a sample, since exact sizing needs it). Errors: a codec mismatch.
func NewProducer(cl *kgo.Client, store payloadstore.PayloadStore, cfg Config) (*Producer, error) {
	codec, err := clientCodec(cl, cfg.Codec)
	if err != nil {
		return nil, err
	}
	ser := NewSerializer(store, codec).WithCopyTopics(cfg.CopyTopics)
	d := DefaultConfig()
	p := &Producer{cl: cl, ser: ser, threshold: cfg.Threshold, keySer: cfg.KeySerializers, valueSer: cfg.ValueSerializers,
		configs: NewTopicConfigs(cl, 0).WithUnknownTTL(0)}
	p.batchMaxFn, _ = cl.OptValue(kgo.ProducerBatchMaxBytesFn).(func(string) int32)
	p.maxWrite, _ = cl.OptValue(kgo.BrokerMaxWriteBytes).(int32)
	p.defaultTopic, _ = cl.OptValue(kgo.DefaultProduceTopic).(string)
	if p.keySer == nil {
		p.keySer = d.KeySerializers
	}
	if p.valueSer == nil {
		p.valueSer = d.ValueSerializers
	}
	ser.noKey, ser.noValue = !p.keySer.LargeMessage(), !p.valueSer.LargeMessage()
	return p, nil
}

// clientCodec finds the Codec matching cl's compressor.
func clientCodec(cl *kgo.Client, want Codec) (Codec, error) {
	codecs, _ := cl.OptValue(kgo.ProducerBatchCompression).([]kgo.CompressionCodec)
	comp, err := kgo.DefaultCompressor(append([]kgo.CompressionCodec(nil), codecs...)...)
	if err != nil {
		return Codec{}, err
	}
	if want.Type != "" && !(want.Type == "none" && comp == nil) {
		return want, want.checkAgainstClient(comp)
	}
	if comp == nil {
		return Codec{Type: "none"}, nil
	}
	for _, t := range []string{"snappy", "lz4", "zstd", "gzip", "none"} {
		c := Codec{Type: t}
		if c.checkAgainstClient(comp) == nil {
			return c, nil
		}
	}
	return Codec{}, errors.New("cannot tell the client's compression codec and level: set compression.type (and compression.<codec>.level) to match kgo.ProducerBatchCompression")
}

// Serializer returns the producer's serializer.
func (p *Producer) Serializer() *Serializer { return p.ser }

// Client returns the wrapped client.
func (p *Producer) Client() *kgo.Client { return p.cl }

// Limits returns the limits in force for topic: its max.message.bytes and
// compression.type read from the cluster (DescribeConfigs, cached for five
// minutes; the broker's message.max.bytes if the topic does not exist yet;
// Kafka's default, with a warning, when the cluster cannot be asked), the
// client's batch cap for it, and the threshold.
func (p *Producer) Limits(ctx context.Context, topic string) Limits {
	var tc TopicConfig
	var err error
	if topic == "" {
		// No topic to ask about (a record without one and no
		// kgo.DefaultProduceTopic): offloading it fails with ErrNoTopic.
		tc = TopicConfig{MaxMessageBytes: DefaultMaxMessageBytes}
	} else {
		tc, err = p.configs.Get(ctx, topic)
	}
	if err != nil {
		slog.Warn("could not read max.message.bytes; assuming Kafka's default", "topic", topic, "bytes", DefaultMaxMessageBytes, "err", err)
		tc = TopicConfig{MaxMessageBytes: DefaultMaxMessageBytes}
	}
	l := DeriveLimits(p.threshold, tc.MaxMessageBytes, p.clientBatchMax(topic))
	l.TopicCompression = tc.Compression
	return l
}

// clientBatchMax is franz-go's uncompressed batch cap for topic.
func (p *Producer) clientBatchMax(topic string) int64 {
	limit := int64(0)
	if p.batchMaxFn != nil {
		limit = int64(p.batchMaxFn(topic))
	}
	if w := p.maxWrite; w > 0 {
		// franz-go keeps a batch under the request size cap too; 512 bytes
		// covers the request header, client and transactional ids up to
		// the client's own lengths, and the topic name.
		reqCap := int64(w) - 512 - int64(len(topic))
		if limit == 0 || reqCap < limit {
			limit = reqCap
		}
	}
	return limit
}

// Prepare offloads rec as needed for its topic's limits; rec can then be
// produced with the wrapped client as usual. A record without a topic gets
// the client's kgo.DefaultProduceTopic first, as kgo would give it. (Produce
// and ProduceSync also keep batches within the topic's limits; a record
// produced with the client directly gets no such guard, and its objects are
// not confirmed after its acknowledgement: PreparePlan returns the plan
// whose Confirm does that.)
func (p *Producer) Prepare(ctx context.Context, rec *kgo.Record) (Offloaded, error) {
	p.defaultTopicFor(rec)
	return p.ser.Offload(ctx, rec, p.Limits(ctx, rec.Topic))
}

// defaultTopicFor gives rec the client's kgo.DefaultProduceTopic when it
// has no topic, as kgo does when it produces it: the record is sized for
// that topic and its payload goes to that topic's folder. Without a default
// the topic stays "" and offloading fails (kgo fails such a record too).
func (p *Producer) defaultTopicFor(rec *kgo.Record) {
	if rec.Topic == "" {
		rec.Topic = p.defaultTopic
	}
}

// ProduceSync prepares each record and produces them, waiting for the
// acknowledgements. A record that cannot be prepared is not produced, and
// its error comes back in the result; the others are produced. results[i]
// is recs[i]'s, as with kgo.Client.ProduceSync.
func (p *Producer) ProduceSync(ctx context.Context, recs ...*kgo.Record) kgo.ProduceResults {
	results := make(kgo.ProduceResults, len(recs))
	var wg sync.WaitGroup
	wg.Add(len(recs))
	for i, r := range recs {
		p.Produce(ctx, r, func(r *kgo.Record, err error) {
			results[i] = kgo.ProduceResult{Record: r, Err: err}
			wg.Done()
		})
	}
	wg.Wait()
	return results
}

// ProduceValue serializes key and value with the key.serializers and
// value.serializers chains, then prepares and produces the record, waiting
// for the acknowledgement. topic "" is the client's kgo.DefaultProduceTopic
// (the stages see that name). Errors: a stage's, Prepare's, or the broker's.
func (p *Producer) ProduceValue(ctx context.Context, topic string, key, value any, headers ...kgo.RecordHeader) (*kgo.Record, error) {
	rec := &kgo.Record{Topic: topic, Headers: headers}
	p.defaultTopicFor(rec)
	topic = rec.Topic
	var err error
	if key != nil {
		if rec.Key, err = p.keySer.Serialize(ctx, topic, key); err != nil {
			return nil, fmt.Errorf("key.serializers %s: %w", p.keySer, err)
		}
	}
	if value != nil {
		if rec.Value, err = p.valueSer.Serialize(ctx, topic, value); err != nil {
			return nil, fmt.Errorf("value.serializers %s: %w", p.valueSer, err)
		}
	}
	return rec, p.ProduceSync(ctx, rec).FirstErr()
}

// Produce prepares rec and produces it asynchronously; promise gets the
// preparation error or the broker's answer. It may block (until ctx ends)
// while the topic's bytes in flight are at their bound (see Producer).
// A record the broker refuses as too large is offloaded and produced once
// more, after the records produced meanwhile. Once an offloaded record is
// acknowledged, the objects it references are confirmed (Plan.Confirm: one
// Stat each; brought back if ferry gc quarantined or deleted them while the
// acknowledgement was on its way) before promise is called, on a goroutine
// of its own: the promise of an offloaded record may come after those of
// records produced after it. The Producer holds the record's payload bytes
// (the caller's, not a copy) until then.
func (p *Producer) Produce(ctx context.Context, rec *kgo.Record, promise func(*kgo.Record, error)) {
	if promise == nil {
		promise = func(*kgo.Record, error) {}
	}
	p.defaultTopicFor(rec)
	if p.tr != nil {
		var span trace.Span
		ctx, span = p.tr.StartSend(ctx, rec.Topic, -1, rec.Headers)
		// Before sizing: the header is part of what the broker stores.
		p.tr.Inject(ctx, &rec.Headers)
		inner := promise
		promise = func(r *kgo.Record, err error) {
			observe.EndSend(span, r.Partition, r.Offset, err)
			inner(r, err)
		}
	}
	g := p.gate(rec.Topic)
	gen := g.gen.Load()
	c := p.limits(ctx, g, rec.Topic, gen)
	u := RecordLen(rec.Key, rec.Value, rec.Headers)
	// A record far below the limits, without Ferry's headers, is left as
	// it is: Offload would decide the same, at more cost.
	if !p.ser.untouched(rec, c.l, u) {
		plan, err := p.ser.offload(ctx, rec, c.l)
		if err != nil {
			promise(rec, err)
			return
		}
		if plan != nil {
			promise = p.confirming(ctx, promise, plan)
		}
		u = RecordLen(rec.Key, rec.Value, rec.Headers)
	}
	p.send(ctx, g, rec, u, c, true, promise)
}

// confirming wraps promise so that, once the broker acknowledged the
// record, the objects plans published or re-bound for it are confirmed
// (Plan.Confirm: brought back if ferry gc quarantined or deleted them while
// the acknowledgement was on its way) before promise is called, on a
// goroutine of its own (store I/O must not hold franz-go's promise
// goroutine). An error of the confirmation is the record's error. A
// record the broker refused is answered at once.
func (p *Producer) confirming(ctx context.Context, promise func(*kgo.Record, error), plans ...*Plan) func(*kgo.Record, error) {
	return func(r *kgo.Record, err error) {
		if err != nil {
			promise(r, err)
			return
		}
		go func() {
			cctx := context.WithoutCancel(ctx) // the record is in the log: finish
			for _, pl := range plans {
				if _, cerr := pl.Confirm(cctx); cerr != nil {
					promise(r, fmt.Errorf("partition %d offset %d: %w", r.Partition, r.Offset, cerr))
					return
				}
			}
			promise(r, nil)
		}()
	}
}

// PreparePlan is Prepare for a record the caller produces with the wrapped
// client itself: it returns the committed plan (nil when the record is left
// as it is), whose Confirm the caller calls once the broker acknowledged the
// record (see Plan.Confirm; Produce and ProduceSync do it themselves).
func (p *Producer) PreparePlan(ctx context.Context, rec *kgo.Record) (*Plan, error) {
	p.defaultTopicFor(rec)
	return p.ser.offload(ctx, rec, p.Limits(ctx, rec.Topic))
}

// limits returns the limits (Limits) for the records of topic's gate g in
// generation gen: the topic's configuration is read through the gate
// while its cache entry lasts (up to DefaultTopicConfigTTL) and no
// MESSAGE_TOO_LARGE has made it stale (a later generation). The client's
// batch cap for the topic is read with it.
func (p *Producer) limits(ctx context.Context, g *gate, topic string, gen uint64) *gateConfig {
	if c := g.config.Load(); c != nil && c.gen == gen {
		return c
	}
	tc, until, err := p.configs.getUntil(ctx, topic)
	if err != nil {
		slog.Warn("could not read max.message.bytes; assuming Kafka's default", "topic", topic, "bytes", DefaultMaxMessageBytes, "err", err)
		tc = TopicConfig{MaxMessageBytes: DefaultMaxMessageBytes}
	}
	c := &gateConfig{l: DeriveLimits(p.threshold, tc.MaxMessageBytes, p.clientBatchMax(topic)), gen: gen}
	c.l.TopicCompression = tc.Compression
	if d := time.Until(until); err == nil && d > 0 {
		g.config.Store(c)
		time.AfterFunc(d, func() { g.config.CompareAndSwap(c, nil) })
	}
	return c
}

// send produces rec (u bytes: RecordLen) through the topic's gate g;
// c.l are the limits rec was sized with, read in the gate's generation
// c.gen. With retry, a MESSAGE_TOO_LARGE answer goes to retryTooLarge
// instead of promise.
func (p *Producer) send(ctx context.Context, g *gate, rec *kgo.Record, u int64, c *gateConfig, retry bool, promise func(*kgo.Record, error)) {
	n, err := p.acquire(ctx, g, rec, u, c)
	if err != nil {
		promise(rec, err)
		return
	}
	// One closure per record (franz-go calls it exactly once): release
	// the gate, then answer, or retry a record refused as too large. (A
	// sync.Pool of promise objects cost more: franz-go's goroutine puts
	// them back on another P than the producer gets them from.)
	p.cl.Produce(ctx, rec, func(r *kgo.Record, err error) {
		g.give(n)
		if retry && errors.Is(err, kerr.MessageTooLarge) {
			// Not on franz-go's callback goroutine: offloading does
			// store I/O.
			go p.retryTooLarge(ctx, r, promise)
			return
		}
		promise(r, err)
	})
}

// retryTooLarge handles a MESSAGE_TOO_LARGE answer: the topic's limits are
// read again, the record offloaded (its value, then its key, whatever their
// size) and produced once more. An error that remains names the topic and
// the limit.
func (p *Producer) retryTooLarge(ctx context.Context, rec *kgo.Record, promise func(*kgo.Record, error)) {
	// Limits read before now may be the old ones: they no longer set the
	// gate's capacity.
	g := p.gate(rec.Topic)
	gen := g.gen.Add(1)
	p.configs.Forget(rec.Topic)
	// A topic just created is unknown to DescribeConfigs for a moment:
	// wait (up to 5 s) for its own limits rather than the broker's
	// defaults, which refused this record already.
	for range 20 {
		if tc, err := p.configs.Get(ctx, rec.Topic); err != nil || tc.Exists || !sleep(ctx, 250*time.Millisecond) {
			break
		}
	}
	c := p.limits(ctx, g, rec.Topic, gen)
	l := c.l
	plan, err := p.ser.offloadAll(ctx, rec, l)
	if err != nil {
		promise(rec, fmt.Errorf("topic %s: the broker refused the record as too large and offloading it failed: %w", rec.Topic, err))
		return
	}
	if plan != nil {
		promise = p.confirming(ctx, promise, plan)
	}
	p.send(ctx, g, rec, RecordLen(rec.Key, rec.Value, rec.Headers), c, false, func(r *kgo.Record, err error) {
		if errors.Is(err, kerr.MessageTooLarge) {
			err = fmt.Errorf("topic %s: %w twice, the second time with the record offloaded (%d bytes; limits now: threshold %d, %s)",
				r.Topic, err, RecordLen(r.Key, r.Value, r.Headers), l.Threshold, l.describe())
		}
		promise(r, err)
	})
}

// acquire admits the batch bytes of rec (u bytes: RecordLen) to its
// topic's gate g (waiting, until ctx ends, while the topic's bytes in
// flight are at their bound) and returns how many it took, for g.give.
// c.l, read in generation c.gen, set the gate's capacity unless limits of
// a later generation have (setLimits, skipped when c went through it
// last: it would change nothing).
func (p *Producer) acquire(ctx context.Context, g *gate, rec *kgo.Record, u int64, c *gateConfig) (int64, error) {
	if g.applied.Load() != c {
		g.setLimits(rec.Topic, c.l, p.ser.codec, c.gen)
		g.applied.Store(c)
	}
	n := u + maxDeltaBytes
	if err := g.take(ctx, n); err != nil {
		return 0, err
	}
	return n, nil
}

// maxDeltaBytes is what a record inside a batch may take beyond RecordLen
// (which counts zero timestamp and offset deltas): up to 9 more bytes of
// timestamp delta and 4 of offset delta.
const maxDeltaBytes = 13

// gate returns topic's gate, made on first use.
func (p *Producer) gate(topic string) *gate {
	if last := p.lastGate.Load(); last != nil && last.topic == topic {
		return last
	}
	g, ok := p.gates.Load(topic)
	if !ok {
		g, _ = p.gates.LoadOrStore(topic, &gate{topic: topic, capacity: math.MaxInt64})
	}
	p.lastGate.Store(g.(*gate))
	return g.(*gate)
}

// setLimits makes l, read in generation gen, the gate's limits unless
// limits of a later generation are in force; the gate's capacity becomes
// the record bytes one of the topic's batches may hold
// (Limits.batchCapacity for codec c).
func (g *gate) setLimits(topic string, l Limits, c Codec, gen uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if gen < g.limitsAt || (gen == g.limitsAt && l == g.limits) {
		return
	}
	capacity := l.batchCapacity(c)
	g.limits, g.limitsAt = l, gen
	g.capacity = math.MaxInt64
	if l.ClientBatchMaxBytes <= 0 || l.ClientBatchMaxBytes-clientBatchOverhead > capacity {
		g.capacity = capacity
		if !g.warned {
			g.warned = true
			slog.Warn("the client's batch cap is larger than the topic accepts: Ferry bounds the bytes in flight to one batch, which slows producing; set ProducerBatchMaxBytes (max.request.size) to at most the topic's max.message.bytes",
				"topic", topic, "max.message.bytes", l.MaxMessageBytes, "client batch cap", l.ClientBatchMaxBytes)
		}
	}
	g.admit()
}

// take admits n bytes, waiting FIFO until they fit (or nothing else is in
// flight: a record larger than the capacity goes alone) or ctx ends.
//
// While the gate is not slow (unbounded, nobody waiting) it only adds n to
// taken, and checks slow again after: a gate that became slow meanwhile
// read the counters after setting slow (under mu), so it either counted these
// bytes or this take sees slow and decides under mu (sequentially
// consistent atomics: of the add-then-check here and the set-then-read
// there, one sees the other).
func (g *gate) take(ctx context.Context, n int64) error {
	if !g.slow.Load() {
		g.taken.Add(n)
		if !g.slow.Load() {
			return nil
		}
		g.given.Add(n) // taken back: decided under mu instead
	}
	g.mu.Lock()
	g.admit() // a waiter the bytes just taken back may have held back
	if len(g.waiters) == 0 && g.fits(n) {
		g.taken.Add(n)
		g.mu.Unlock()
		return nil
	}
	w := &gateWaiter{n: n, ready: make(chan struct{})}
	g.waiters = append(g.waiters, w)
	g.admit() // sets slow, then sees every give that did not see it
	g.mu.Unlock()
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-w.ready: // admitted meanwhile
		g.given.Add(n)
	default:
		g.waiters = slices.DeleteFunc(g.waiters, func(o *gateWaiter) bool { return o == w })
	}
	g.admit()
	return ctx.Err()
}

// give releases n admitted bytes; only a slow gate has waiters to admit
// (a gate that turns slow after the check below reads the counters after
// it did, and sees the bytes released).
func (g *gate) give(n int64) {
	g.given.Add(n)
	if g.slow.Load() {
		g.mu.Lock()
		g.admit()
		g.mu.Unlock()
	}
}

func (g *gate) fits(n int64) bool {
	in := g.inflight()
	return in == 0 || in <= g.capacity-n
}

// inflight is the batch bytes admitted and not yet released. given is read
// first: a give or take in between can only make the answer larger than
// the truth, never smaller.
func (g *gate) inflight() int64 {
	given := g.given.Load()
	return g.taken.Load() - given
}

// admit sets slow as the gate now is, then lets waiters in, in order,
// while they fit, and clears slow when nobody waits and the capacity is
// unbounded. g.mu is held.
func (g *gate) admit() {
	g.slow.Store(true)
	for len(g.waiters) > 0 && g.fits(g.waiters[0].n) {
		w := g.waiters[0]
		g.waiters = g.waiters[1:]
		g.taken.Add(w.n)
		close(w.ready)
	}
	if len(g.waiters) == 0 && g.capacity == math.MaxInt64 {
		g.slow.Store(false)
	}
}

// batchCapacity is the most record bytes (uncompressed, as franz-go counts
// them) one batch of the topic may hold so that the broker stores it within
// max.message.bytes: compressed batches are smaller than that (franz-go
// sends the records uncompressed otherwise), except where the broker
// compresses them itself, which a worst-case bound of its codec covers.
func (l Limits) batchCapacity(c Codec) int64 {
	room := l.MaxMessageBytes - BatchOverhead
	t := l.TopicCompression
	if !brokerRecompresses(t, c) && !(t == c.Type && c.Type != "none" && c.Type != "") {
		return room
	}
	lo, hi := int64(0), room
	for lo < hi { // the largest n with recompressedBound(t, n) <= room
		mid := (lo + hi + 1) / 2
		if recompressedBound(t, mid) <= room {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return max(lo, 1)
}

// sleep waits d, or until ctx ends (false).
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
