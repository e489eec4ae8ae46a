package interceptor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/ferrykit/ferry/observe"
	"go.opentelemetry.io/otel/trace"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

func init() { Register("large-message", newLargeMessageFromConfig) }

// LargeMessage is the large-message interceptor (KIP-1159 in the proxy). On
// produce it offloads every record that would not fit inline to the payload
// store, in the Go library's wire format (large-message header,
// PayloadReferenceValue, ferry.payload.size / ferry.payload.sha256 headers),
// and, as a BatchShrinker, offloads more values when the rewritten batch is
// still over the topic's max.message.bytes. The decision is made before
// anything is published: the records hold their final references, and the
// payloads are published (Deferred) only once the whole batch fits. On
// fetch it replaces references by their payloads and removes Ferry's
// headers, whether the proxy or the Go library offloaded them; a reference
// is resolved only when its object belongs to the record's topic.
//
// A produced record that already carries a reference (a client offloaded
// it itself) must name an object of its own topic, which is then touched;
// one naming another topic's object is refused with INVALID_RECORD unless
// that topic matches large.message.reference.copy.topics (default: none,
// since the proxy's clients are untrusted), and then it is copied.
type LargeMessage struct {
	pattern   *regexp.Regexp
	threshold int64         // large.message.threshold.bytes; 0 derives it
	stream    int64         // large.message.stream.threshold.bytes
	stall     time.Duration // large.message.payload.store.timeout.ms
	sers      map[string]*largemessage.Serializer
	de        *largemessage.Deserializer
	store     payloadstore.PayloadStore
	tr        *observe.Tracer  // nil: not traced
	m         *observe.Metrics // nil: not counted
	corrupt   corruptStreams   // streamed values whose payload failed its checks
}

// corruptStreams remembers, for CorruptStreamTTL, the records whose value
// was streamed to a client (KeyStreamThreshold) and whose payload, read
// whole, did not match the record's SHA-256 or CRC-32C header. That is
// found only once the response is committed, so its connection is cut,
// with no error the client could show, and the client fetches the record
// again: the next fetch is answered CORRUPT_MESSAGE instead (fetchCode),
// before anything is written, as a payload that fails its checks in memory
// is. At most maxCorruptStreams records are held; the oldest goes first.
type corruptStreams struct {
	mu sync.Mutex
	m  map[corruptKey]corruptEntry
}

type corruptKey struct {
	topic     string
	partition int32
	offset    int64
}

type corruptEntry struct {
	err error
	at  time.Time
}

// CorruptStreamTTL is how long a streamed payload that failed its checks
// is answered CORRUPT_MESSAGE without being read again (a payload put
// right in the store meanwhile is read again after it).
const CorruptStreamTTL = time.Minute

const maxCorruptStreams = 1024

func (c *corruptStreams) add(k corruptKey, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[corruptKey]corruptEntry{}
	}
	if len(c.m) >= maxCorruptStreams {
		var oldest corruptKey
		first := true
		for k, e := range c.m {
			if first || e.at.Before(c.m[oldest].at) {
				oldest, first = k, false
			}
		}
		delete(c.m, oldest)
	}
	c.m[k] = corruptEntry{err: err, at: time.Now()}
}

// check returns the failure remembered for k, if within CorruptStreamTTL.
func (c *corruptStreams) check(k corruptKey) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	if !ok {
		return nil
	}
	if time.Since(e.at) >= CorruptStreamTTL {
		delete(c.m, k)
		return nil
	}
	return e.err
}

// KeyPayloadCacheMax bounds the bytes of the payloads the fetch side keeps
// in memory to serve again without a download (payloadstore.Cached): a
// consumer that retries a fetch, or several consumer groups reading the same
// records, cost one download per payload. The cache takes its bytes from
// proxy.memory.max.bytes, only while they are free: a record that needs
// room drops cached payloads first. 0 turns it off. A payload larger than
// the bound is never cached.
const KeyPayloadCacheMax = "large.message.payload.cache.max.bytes"

// DefaultPayloadCacheMax is KeyPayloadCacheMax's default: 128 MiB.
const DefaultPayloadCacheMax = 128 << 20

// KeyStreamThreshold is the size in bytes above which a record value goes
// between the client's socket and the payload store as a stream instead of
// being held whole in memory: on produce it is published as it arrives, on
// fetch it is read from the store as it is written to the client. The
// proxy's memory for such a record does not grow with its size.
const KeyStreamThreshold = "large.message.stream.threshold.bytes"

// DefaultStreamThreshold is KeyStreamThreshold's default: 8 MiB.
const DefaultStreamThreshold = 8 << 20

// WithTracer traces the records l offloads ("send <topic>", kind producer,
// parent: the record's own traceparent when a client set one; the
// reference record then carries the span's traceparent) and resolves
// ("receive <topic>", kind consumer, linked to the producer's span), with
// the store's publish and download as child spans when the store is
// wrapped by observe.Store with the same tracer. It returns l.
func (l *LargeMessage) WithTracer(t *observe.Tracer) *LargeMessage {
	l.tr = t
	return l
}

// NewLargeMessage returns the interceptor over store (normally from
// largemessage.Config.OpenStore) with cfg's threshold, skip-not-found
// setting and reference rules (CopyTopics, ResolveTopics), for topics
// matching pattern.
func NewLargeMessage(store payloadstore.PayloadStore, cfg largemessage.Config, pattern *regexp.Regexp) *LargeMessage {
	l := &LargeMessage{pattern: pattern, threshold: cfg.Threshold, store: store, stall: cfg.Policy.Timeout,
		sers: map[string]*largemessage.Serializer{},
		de:   cfg.NewDeserializer(store)}
	for _, c := range codecNames {
		l.sers[c] = largemessage.NewSerializer(store, largemessage.Codec{Type: c}).WithCopyTopics(cfg.CopyTopics).WithVerifiedReferences()
	}
	return l
}

// newLargeMessageFromConfig reads topic.pattern, side (default both) and
// the large.message.* keys (largemessage.ParseConfig; the store URL
// large.message.payload.store.url is required) and opens the store.
// large.message.reference.copy.topics defaults to none here.
func newLargeMessageFromConfig(ctx context.Context, config map[string]string) (Instance, error) {
	cfg, err := largemessage.ParseConfig(config)
	if err != nil {
		return Instance{}, err
	}
	if _, set := config[largemessage.KeyReferenceCopyTopics]; !set {
		cfg.CopyTopics = nil
	}
	re, err := CompileTopicPattern(config[KeyTopicPattern])
	if err != nil {
		return Instance{}, err
	}
	p, f, err := sides(config, "both")
	if err != nil {
		return Instance{}, err
	}
	cacheMax, err := parseCacheMax(config, memoryFrom(ctx))
	if err != nil {
		return Instance{}, err
	}
	stream, err := parseStreamThreshold(config)
	if err != nil {
		return Instance{}, err
	}
	if mem := memoryFrom(ctx); mem != nil {
		// Ranged downloads take their buffers from the proxy's budget.
		cfg.DownloadBudget = payloadstore.Budget{Take: mem.TryTake, Give: mem.Give}
	}
	store, err := cfg.OpenStore(ctx)
	if err != nil {
		return Instance{}, err
	}
	m, tr := observedFrom(ctx)
	store = observe.Store(store, m, tr)
	closeStore := store.Close
	if cacheMax > 0 {
		o := payloadstore.CacheOptions{MaxBytes: cacheMax}
		mem := memoryFrom(ctx)
		if mem != nil {
			o.Take, o.Give = mem.takeReclaimable, mem.giveReclaimable
		}
		cached := payloadstore.Cached(store, o).(*payloadstore.CachedStore)
		store, closeStore = cached, cached.Close
		if mem != nil {
			remove := mem.addReclaimer(cached.Reclaim)
			closeStore = func() error { remove(); return cached.Close() }
		}
	}
	l := NewLargeMessage(store, cfg, re).WithTracer(tr)
	l.m = m
	l.stream = stream
	in := Instance{Close: closeStore}
	if p {
		in.Produce = l
	}
	if f {
		in.Fetch = fetchSide{l}
	}
	return in, nil
}

// parseCacheMax reads KeyPayloadCacheMax (default DefaultPayloadCacheMax,
// at most the memory budget mem's size, when known).
func parseCacheMax(config map[string]string, mem *Memory) (int64, error) {
	v, ok := config[KeyPayloadCacheMax]
	if !ok || strings.TrimSpace(v) == "" {
		n := int64(DefaultPayloadCacheMax)
		if mem != nil {
			n = min(n, mem.Limit()/2)
		}
		return n, nil
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s: %q is not a non-negative number of bytes", KeyPayloadCacheMax, v)
	}
	if mem != nil && n > mem.Limit() {
		return 0, fmt.Errorf("%s is %d: it must be at most %s (%d), from which the cache takes its bytes", KeyPayloadCacheMax, n, KeyMemoryMax, mem.Limit())
	}
	return n, nil
}

// parseStreamThreshold reads KeyStreamThreshold (default
// DefaultStreamThreshold; at least 1 MiB, so that a stream is worth its
// set-up).
func parseStreamThreshold(config map[string]string) (int64, error) {
	v, ok := config[KeyStreamThreshold]
	if !ok || strings.TrimSpace(v) == "" {
		return DefaultStreamThreshold, nil
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n < 1<<20 {
		return 0, fmt.Errorf("%s: %q is not a number of bytes of at least 1048576", KeyStreamThreshold, v)
	}
	return n, nil
}

func (l *LargeMessage) Name() string                 { return "large-message" }
func (l *LargeMessage) TopicPattern() *regexp.Regexp { return l.pattern }

// limits are the record limits for r's batch: the configured threshold (or
// the derived one), capped so a record offloaded or not fits
// max.message.bytes with the batch overhead.
func (l *LargeMessage) limits(r *Record) largemessage.Limits {
	lim := largemessage.DeriveLimits(l.threshold, int64(r.Batch.MaxMessageBytes), 0)
	lim.TopicCompression = r.Batch.TopicCompression
	return lim
}

func (l *LargeMessage) serializer(r *Record) *largemessage.Serializer {
	if ser := l.sers[r.Batch.Compression]; ser != nil {
		return ser
	}
	return l.sers["none"]
}

func toKgo(r *Record) kgo.Record {
	return kgo.Record{Topic: r.Topic, Partition: r.Partition, Key: r.Key, Value: r.Value, Headers: r.Headers}
}

// storeErr maps a large-message error to the code the client gets: a
// record too large even offloaded is MESSAGE_TOO_LARGE; a reference the
// record may not carry (another topic's, another store's, malformed)
// INVALID_RECORD; a store failure KAFKA_STORAGE_ERROR (retriable: nothing
// was appended).
func storeErr(err error) error {
	var se *payloadstore.Error
	switch {
	case errors.Is(err, largemessage.ErrRecordTooLarge):
		return fmt.Errorf("%w: %w", kerr.MessageTooLarge, err)
	case errors.Is(err, payloadstore.ErrInvalidPath):
		return fmt.Errorf("%w: %w", kerr.InvalidRecord, err)
	case errors.As(err, &se), errors.Is(err, largemessage.ErrNoPayloadStore):
		return fmt.Errorf("%w: %w", kerr.KafkaStorageError, err)
	}
	return err
}

// ProcessRecord plans r's offload when the record does not fit the
// threshold, measured exactly with the batch's codec: r gets its final
// references at once, and the publishing is deferred until the batch fits.
func (l *LargeMessage) ProcessRecord(ctx context.Context, r *Record) error {
	if v, err := l.streamed(ctx, r); v != nil || err != nil {
		// Published as it arrived (StreamValue): the record holds its
		// reference and headers, as PlanOffload's value offload would
		// have left them. If the reference record does not fit the
		// threshold, its key (in memory) is offloaded as PlanOffload
		// offloads it after the value (PlanKey: the same plan, deferred,
		// published only once the batch fits); a record that cannot fit
		// even so is refused (ErrRecordTooLarge). Refused, the partition
		// fails and the value is deleted (Streams.AbortUncommitted).
		if err != nil {
			return err
		}
		lim := l.limits(r)
		if err := l.plan(r, func(ser *largemessage.Serializer, kr *kgo.Record) (*largemessage.Plan, error) {
			return ser.PlanKey(ctx, kr, lim)
		}); err != nil {
			return err
		}
		r.Defer(v)
		return nil
	}
	// Most records carry no reference and fit: decided on the record's
	// headers and length alone, before it is copied into a kgo.Record (a
	// copy that escapes costs an allocation per record). This is the
	// serializer's own first step (no reference to adopt, Codec.Fits).
	if !referenced(r.Headers) {
		codec := largemessage.Codec{Type: "none"}
		switch r.Batch.Compression {
		case "gzip", "snappy", "lz4", "zstd":
			codec.Type = r.Batch.Compression
		}
		if fits, err := codec.Fits(l.limits(r), r.Key, r.Value, r.Headers); err == nil && fits {
			return nil
		}
	}
	if err := sealedReference(r); err != nil { // off the path of records that fit
		return err
	}
	return l.plan(r, func(ser *largemessage.Serializer, kr *kgo.Record) (*largemessage.Plan, error) {
		return ser.PlanOffload(ctx, kr, l.limits(r))
	})
}

// sealedReference refuses (INVALID_RECORD) a record whose value its client
// offloaded (header large-message: true) and that encrypt, listed before
// large-message, then sealed (its ferry.encrypted marker names the value):
// the reference can no longer be checked here, nor resolved on fetch
// (large-message runs before encrypt opens it), and its payload is in the
// store unsealed. Taken for a stale header, it was dropped and the record
// appended as its sealed reference alone: found by a helper, a 5 MB file
// sent with `ferry produce --store` through [encrypt, large-message] read
// back as 100 bytes, its payload left to ferry gc.
func sealedReference(r *Record) error {
	offloaded, sealed := false, false
	for _, h := range r.Headers {
		switch h.Key {
		case largemessage.HeaderLargeMessage:
			offloaded = offloaded || string(h.Value) == "true"
		case HeaderEncrypted:
			for f := range bytes.SplitSeq(h.Value, []byte{','}) {
				sealed = sealed || string(f) == encryptFieldValue
			}
		}
	}
	if !offloaded || !sealed {
		return nil
	}
	return fmt.Errorf("%w: topic %s: the record's value was offloaded by its client (header %s) and sealed by encrypt, listed before large-message: "+
		"this proxy cannot check or resolve a sealed reference, and the payload would stay in the store unsealed; send the value itself "+
		"(the proxy seals, then offloads it)", kerr.InvalidRecord, r.Topic, largemessage.HeaderLargeMessage)
}

// referenceHeaders are the headers that mark a record's key or value as a
// reference (referenced): such a record is always acted on.
var referenceHeaders = []string{largemessage.HeaderLargeMessage, largemessage.HeaderLargeMessageKey}

// Skim implements Skimmer: in an uncompressed batch, ProcessRecord acts on
// a record that carries a reference (its header, whatever its value) or
// that does not fit the threshold; the skim bounds the record by its
// length in the batch, which is at least the length Codec.Fits measures
// (that one has zero timestamp and offset deltas), so a record the skim
// passes fits. ok false for a compressed batch.
func (l *LargeMessage) Skim(info BatchInfo) (Skim, bool) {
	if info.Compression != "none" {
		return Skim{}, false
	}
	lim := l.limits(&Record{Batch: info})
	codec := largemessage.Codec{Type: "none"}
	fits := func(u int64) bool { ok, decided := codec.FitsLen(lim, u); return ok && decided }
	hi := lim.Threshold
	if !fits(hi) {
		// The broker recompresses the batch (the topic's compression.type
		// is a codec): the largest length that fits, by bisection.
		lo := int64(0)
		if !fits(lo) {
			return Skim{}, false
		}
		for lo < hi-1 {
			mid := lo + (hi-lo)/2
			if fits(mid) {
				lo = mid
			} else {
				hi = mid
			}
		}
		hi = lo
	}
	return Skim{MaxRecordBytes: hi, Headers: referenceHeaders}, true
}

// Shrink plans the offload of r's value whatever its size (BatchShrinker),
// unless it is null or already a reference.
func (l *LargeMessage) Shrink(ctx context.Context, r *Record) (bool, error) {
	if v, err := l.streamed(ctx, r); v != nil || err != nil {
		return false, err // already a reference
	}
	before := len(r.Value)
	err := l.plan(r, func(ser *largemessage.Serializer, kr *kgo.Record) (*largemessage.Plan, error) {
		return ser.PlanValue(ctx, kr, l.limits(r))
	})
	return err == nil && len(r.Value) != before, err
}

func (l *LargeMessage) plan(r *Record, plan func(*largemessage.Serializer, *kgo.Record) (*largemessage.Plan, error)) error {
	kr := toKgo(r)
	p, err := plan(l.serializer(r), &kr)
	if err != nil {
		return storeErr(err)
	}
	r.Key, r.Value, r.Headers = kr.Key, kr.Value, kr.Headers
	if p != nil {
		d := &deferredPlan{p: p}
		if l.tr != nil {
			// Only offloaded records are traced (their batch is rewritten
			// anyway): the span's context goes into the reference
			// record's traceparent header, after the plan's sizing (a
			// reference is far below any limit; the chain measures the
			// batch again).
			d.tr = l.tr
			d.ctx, d.span = l.tr.StartSend(context.Background(), r.Topic, r.Partition, r.Headers)
			l.tr.Inject(d.ctx, &r.Headers)
		}
		r.Defer(d)
	}
	return nil
}

// deferredPlan publishes a planned offload once the batch fits; span
// (with its context ctx) is the record's "send" span when traced.
type deferredPlan struct {
	p    *largemessage.Plan
	tr   *observe.Tracer
	ctx  context.Context
	span trace.Span
	done atomic.Bool // span ended (Abort may follow Commit)
}

func (d *deferredPlan) Commit(ctx context.Context, r *Record) error {
	if d.span != nil {
		ctx = trace.ContextWithSpan(ctx, d.span)
	}
	changed, err := d.p.Commit(ctx)
	if err != nil {
		d.end(err)
		return storeErr(err)
	}
	if changed {
		kr := d.p.Record()
		r.Key, r.Value, r.Headers = kr.Key, kr.Value, kr.Headers
		d.tr.Inject(d.ctx, &r.Headers)
	}
	d.end(nil)
	return nil
}

// Confirm implements Confirmer (largemessage.Plan.Confirm).
func (d *deferredPlan) Confirm(ctx context.Context) (int, error) { return d.p.Confirm(ctx) }

func (d *deferredPlan) Abort(ctx context.Context) {
	d.p.Abort(ctx)
	d.end(errAborted)
}

// errAborted ends the span of an offload undone.
var errAborted = errors.New("offload undone: the batch was refused")

func (d *deferredPlan) end(err error) {
	if d.span == nil || !d.done.CompareAndSwap(false, true) {
		return
	}
	observe.EndSend(d.span, -1, -1, err)
}

// referenced reports whether hs mark the key or the value as a
// reference (largemessage.IsOffloaded, IsKeyOffloaded), without copying
// the record.
func referenced(hs []Header) bool {
	marks := kgo.Record{Headers: hs}
	return largemessage.IsOffloaded(&marks) || largemessage.IsKeyOffloaded(&marks)
}

// fetchSide is the fetch-time half.
type fetchSide struct{ l *LargeMessage }

func (f fetchSide) Name() string                 { return "large-message" }
func (f fetchSide) TopicPattern() *regexp.Regexp { return f.l.pattern }

// Skim implements Skimmer: on fetch only a record carrying a reference is
// acted on.
func (f fetchSide) Skim(BatchInfo) (Skim, bool) {
	return Skim{MaxRecordBytes: -1, Headers: referenceHeaders}, true
}

// GrowsBy implements FetchSizer: a reference grows by its payload's size,
// read from the record's size header (the digest check stops a download
// that passes it), less the reference it replaces.
func (f fetchSide) GrowsBy(r *Record) (int64, bool) {
	if r.Aborted || !referenced(r.Headers) {
		return 0, true
	}
	kr := toKgo(r)
	return largemessage.ResolvedGrowth(&kr)
}

// ProcessRecord resolves r's references (largemessage.Deserializer.Resolve),
// after reserving the payloads' size in the memory budget.
// With large.message.skip.not.found.error a missing payload leaves a null
// value and the record passes; other errors (store down, corrupt reference,
// another topic's object, digest mismatch) fail the partition's fetch with
// KAFKA_STORAGE_ERROR.
func (f fetchSide) ProcessRecord(ctx context.Context, r *Record) (err error) {
	// Most records carry no reference: decided on their headers alone,
	// before the record is copied (a copy that escapes costs an allocation
	// per record).
	if r.Aborted || !referenced(r.Headers) {
		return nil // an aborted record is dropped by consumers: not resolved
	}
	kr := toKgo(r)
	kr.Offset = r.Offset
	if streamed, err := f.stream(ctx, r, &kr); streamed || err != nil {
		return err
	}
	n, ok := largemessage.ResolvedGrowth(&kr)
	if !ok {
		// A reference without size headers (a KIP-only producer): the
		// objects' stored sizes bound what is read.
		var err error
		if n, err = largemessage.PayloadSizes(ctx, f.l.store, &kr); err != nil {
			// The Deserializer's own error names the record; with a
			// bound of 0 it reads nothing.
			kr.Offset = r.Offset
			if rerr := f.l.de.ResolveBounded(ctx, &kr, 0); rerr != nil {
				return rerr
			}
			return err
		}
	}
	if err := r.Reserve(ctx, n); err != nil {
		return err
	}
	kr.Offset = r.Offset
	if f.l.tr != nil {
		var span trace.Span
		ctx, span = f.l.tr.StartReceive(ctx, "receive", r.Topic, r.Partition, r.Offset, r.Headers)
		defer func() { observe.End(span, err) }()
	}
	err = f.l.de.ResolveBounded(ctx, &kr, n)
	var re *largemessage.RecordError
	if err != nil && !(errors.As(err, &re) && re.Skipped) {
		return err
	}
	if err == nil {
		f.l.m.Delivered(r.Topic, int64(len(kr.Key)+len(kr.Value)))
	}
	r.Key, r.Value, r.Headers = kr.Key, kr.Value, kr.Headers
	return nil
}

// stream leaves r's value as a hole (stream.go) when it may: the chain
// allows it (r.canStream), the value's payload is larger than
// large.message.stream.threshold.bytes and its record carries the size,
// SHA-256 and CRC-32C headers. The download is opened here, so that a
// missing object or a store outage fails the partition (or, with
// large.message.skip.not.found.error, gives a null value) before the
// response is committed; its bytes are read only as the proxy writes them.
// A referenced key is resolved in memory first (keys are never streamed).
// streamed false (and no error): r takes the in-memory path.
func (f fetchSide) stream(ctx context.Context, r *Record, kr *kgo.Record) (streamed bool, err error) {
	if !r.canStream || f.l.stream <= 0 || !largemessage.IsOffloaded(kr) {
		return false, nil
	}
	crc, ok := largemessage.PayloadCRC32C(kr)
	if !ok {
		return false, nil
	}
	vr := kgo.Record{Topic: kr.Topic, Partition: kr.Partition, Offset: kr.Offset, Value: kr.Value, Headers: kr.Headers}
	size, ok := largemessage.ResolvedGrowth(&kgo.Record{Value: vr.Value, Headers: valueHeaders(vr.Headers)})
	size += int64(len(vr.Value)) // the growth less the reference: the payload's size
	if !ok || size <= f.l.stream || size > maxStreamSize {
		return false, nil
	}
	if largemessage.IsKeyOffloaded(kr) {
		kn, ok := largemessage.ResolvedGrowth(&kgo.Record{Key: kr.Key, Headers: keyHeaders(kr.Headers)})
		if !ok {
			return false, nil
		}
		if err := r.Reserve(ctx, kn+int64(len(kr.Key))); err != nil {
			return false, err
		}
		if err := f.l.de.ResolveKey(ctx, kr); err != nil {
			var re *largemessage.RecordError
			if !(errors.As(err, &re) && re.Skipped) {
				return false, err
			}
		}
		vr.Headers = kr.Headers
	}
	key := corruptKey{r.Topic, r.Partition, r.Offset}
	if err := f.l.corrupt.check(key); err != nil {
		ref, _ := largemessage.DecodeReference(vr.Value)
		return false, &largemessage.RecordError{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Side: "value", Path: ref.FullPayloadPath,
			Err: fmt.Errorf("%w: when it was last streamed to a client: %v", largemessage.ErrDigestMismatch, err)}
	}
	// The download outlives this call (the proxy reads it while writing
	// the response): its context is ended by the stream's Close.
	dctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	dctx = payloadstore.WithStreaming(dctx, StreamReadAhead)
	rc, got, err := f.l.de.OpenValue(dctx, &vr)
	if err != nil {
		stop()
		var re *largemessage.RecordError
		if errors.As(err, &re) && re.Skipped {
			// large.message.skip.not.found.error: a null value, as
			// Resolve gives.
			r.Key, r.Value, r.Headers = kr.Key, nil, largemessage.WithoutValueHeaders(kr.Headers)
			return true, nil
		}
		return false, err
	}
	if got != size {
		rc.Close()
		stop()
		return false, nil
	}
	s := &valueStream{rc: rc, size: size, crc: crc, stop: stop, corrupt: func(err error) { f.l.corrupt.add(key, err) }}
	r.led.addCloser(s)
	f.l.m.Delivered(r.Topic, size+int64(len(kr.Key)))
	r.Key, r.Value, r.Headers = kr.Key, []byte{}, largemessage.WithoutValueHeaders(kr.Headers)
	r.stream = s
	return true, nil
}

// valueHeaders and keyHeaders keep the headers of one side only, so that
// ResolvedGrowth measures that side alone.
func valueHeaders(hs []kgo.RecordHeader) []kgo.RecordHeader {
	return sideOnly(hs, largemessage.HeaderLargeMessage, largemessage.HeaderPayloadSize, largemessage.HeaderPayloadSHA256)
}

func keyHeaders(hs []kgo.RecordHeader) []kgo.RecordHeader {
	return sideOnly(hs, largemessage.HeaderLargeMessageKey, largemessage.HeaderKeyPayloadSize, largemessage.HeaderKeyPayloadSHA256)
}

func sideOnly(hs []kgo.RecordHeader, names ...string) []kgo.RecordHeader {
	var out []kgo.RecordHeader
	for _, h := range hs {
		for _, n := range names {
			if h.Key == n {
				out = append(out, h)
			}
		}
	}
	return out
}
