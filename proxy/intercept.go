package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/largemessage"
)

// defaultTopicConfigTTL is how long a topic's max.message.bytes, read from
// the cluster, is trusted before it is read again (topic.config.refresh.ms).
const defaultTopicConfigTTL = time.Minute

// unknownTopicIDTTL is how long "the cluster does not know this topic id"
// is trusted, so a client naming made-up ids cannot make the proxy ask the
// cluster on every request.
const unknownTopicIDTTL = 5 * time.Second

// interception is the Server's KIP-905 state besides the chain (which is
// reloadable, reload.go): an admin client of the upstream cluster for topic
// configs and ids, and their caches. The client connects on first use.
type interception struct {
	admin   *kgo.Client
	configs *largemessage.TopicConfigs

	mu      sync.Mutex
	names   map[[16]byte]string
	unknown map[[16]byte]time.Time // ids the cluster did not name, and when
	lookup  *nameLookup            // the Metadata request in flight, if any
	learnt  time.Time              // when the last Metadata request ended
	lookups atomic.Int64           // Metadata requests made to name topic ids
	logged  map[string]time.Time   // last warning per topic/partition
	// retried: per topic, when the proxy last turned the broker's
	// MESSAGE_TOO_LARGE into a retriable error (retryTooLarge).
	retried map[string]time.Time
}

// nameLookup is one Metadata request of the admin client that every
// caller wanting a topic id resolved meanwhile waits for.
type nameLookup struct{ done chan struct{} }

// maxLogged bounds the partitions whose last warning is remembered.
const maxLogged = 10000

// logEvery bounds how often the failure of one partition's fetch is logged.
const logEvery = time.Minute

// shouldLog reports whether a warning about topic/partition is due.
func (ic *interception) shouldLog(topic string, partition int32) bool {
	key := topic + "/" + strconv.Itoa(int(partition))
	ic.mu.Lock()
	defer ic.mu.Unlock()
	if t, ok := ic.logged[key]; ok && time.Since(t) < logEvery {
		return false
	}
	if len(ic.logged) >= maxLogged { // bounded: forget what is past logEvery, or everything
		for k, t := range ic.logged {
			if time.Since(t) >= logEvery {
				delete(ic.logged, k)
			}
		}
		if len(ic.logged) >= maxLogged {
			clear(ic.logged)
		}
	}
	ic.logged[key] = time.Now()
	return true
}

// newInterception makes the admin client (with the upstream TLS and
// upstream.sasl.* settings). Errors: an admin client that cannot be made.
func newInterception(cfg Config, upstreamTLS kgo.Opt) (*interception, error) {
	ic := &interception{names: map[[16]byte]string{}, unknown: map[[16]byte]time.Time{}, logged: map[string]time.Time{},
		retried: map[string]time.Time{}}
	ttl := cfg.TopicConfigRefresh
	if ttl <= 0 {
		ttl = defaultTopicConfigTTL
	}
	opts := []kgo.Opt{kgo.SeedBrokers(cfg.Upstream...), kgo.ClientID("ferry-proxy"), kgo.DialTimeout(cfg.DialTimeout)}
	if upstreamTLS != nil {
		opts = append(opts, upstreamTLS)
	}
	m, err := cfg.UpstreamSASL.mechanism()
	if err != nil {
		return nil, err
	}
	if m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	if ic.admin, err = kgo.NewClient(opts...); err != nil {
		return nil, fmt.Errorf("interceptors: admin client of the upstream cluster: %w", err)
	}
	ic.configs = largemessage.NewTopicConfigs(ic.admin, ttl)
	return ic, nil
}

func (ic *interception) close() {
	ic.admin.Close()
}

// maxMessageBytes answers the limits callback of Chain.InterceptProduce
// (conn.topicLimits): the max.message.bytes and compression.type of topics
// as the cluster reports them (one DescribeConfigs for all that are not
// cached; the broker's message.max.bytes for a topic that does not exist
// yet), cached for topic.config.refresh.ms, waited for until ctx ends and
// at most 10 s. A topic the cluster cannot be asked about in that time is
// left out (the broker's own check then applies); one it says does not
// exist is Missing (for a few seconds: a topic created meanwhile is
// refused with the retriable UNKNOWN_TOPIC_OR_PARTITION until then, as a
// broker that has not seen it yet would).
func (ic *interception) maxMessageBytes(ctx context.Context, topics []string) map[string]interceptor.TopicLimit {
	out := make(map[string]interceptor.TopicLimit, len(topics))
	if len(topics) == 1 {
		// Most requests name one topic: Get answers a cached one without
		// GetAll's three maps (they were a third of the produce skim's CPU
		// behind Kafka's perf producer: docs/BENCHMARKS.md).
		c, err := ic.configs.Get(ctx, topics[0])
		addLimit(out, topics[0], c, err)
		return out
	}
	for t, r := range ic.configs.GetAll(ctx, topics) {
		addLimit(out, t, r.Config, r.Err)
	}
	return out
}

// cachedLimits is maxMessageBytes answered from the cache alone: ok is
// false when a topic is not cached (the cluster must be asked).
func (ic *interception) cachedLimits(topics []string) (map[string]interceptor.TopicLimit, bool) {
	out := make(map[string]interceptor.TopicLimit, len(topics))
	for _, t := range topics {
		c, ok := ic.configs.Cached(t)
		if !ok {
			return nil, false
		}
		addLimit(out, t, c, nil)
	}
	return out, true
}

// addLimit adds topic's limit to out, unless the lookup failed or the
// limit is not one a batch can be checked against.
func addLimit(out map[string]interceptor.TopicLimit, topic string, c largemessage.TopicConfig, err error) {
	if err == nil && c.MaxMessageBytes > 0 && c.MaxMessageBytes <= math.MaxInt32 {
		out[topic] = interceptor.TopicLimit{MaxMessageBytes: int32(c.MaxMessageBytes), Compression: c.Compression,
			Missing: !c.Exists}
	}
}

// clientWatchedKey marks a context that already ends when the client goes
// away (watchClient), or that must not (an acks=0 request's, whose client
// wants its records whatever it does after sending them): topicLimits
// starts no watch of its own under it.
type clientWatchedKey struct{}

// topicLimits is the limits callback of c's Produce requests
// (Chain.InterceptProduce, Chain.ProduceUntouched, the streamed read):
// maxMessageBytes within ctx. When the cluster must be asked (a topic not
// cached) the wait also ends when the client closes or resets its
// connection (watchGone), unless ctx is marked clientWatchedKey: the
// reader waits here, and it would otherwise hold the connection, its
// chain generation and its request's memory for up to the lookup's 10 s
// after its client had gone (and Shutdown with them, past its deadline).
// A lookup cut short leaves its topics out, as one the cluster did not
// answer.
func (c *conn) topicLimits(ctx context.Context, topics []string) map[string]interceptor.TopicLimit {
	if out, ok := c.s.ic.cachedLimits(topics); ok {
		return out
	}
	if ctx.Value(clientWatchedKey{}) == nil {
		var stop func()
		ctx, stop = c.watchGone(ctx)
		defer stop()
	}
	return c.s.ic.maxMessageBytes(ctx, topics)
}

// watchGone returns parent, also cancelled when the client ends its
// connection (a close or a reset) while the reader waits on something else
// and reads nothing. It looks at the socket itself (waitSocket), not the
// read buffer, which may hold the request being handled; bytes arriving
// (the client's next request) end the watch, the client being there.
// stop ends the watch, and waits for it.
func (c *conn) watchGone(parent context.Context) (context.Context, func()) {
	return c.watch(parent, func() error {
		if err := waitSocket(c.client); !errors.Is(err, errors.ErrUnsupported) {
			return err
		}
		return nil
	})
}

// learnTopics records the topic ids of a Metadata (or
// DescribeTopicPartitions) response that passed through the proxy
// (produce and fetch v13+ name topics by id).
func (ic *interception) learnTopics(key, version int16, body []byte) {
	learn := func(name *string, id [16]byte) {
		if name != nil && *name != "" && id != ([16]byte{}) {
			ic.names[id] = *name
			delete(ic.unknown, id)
		}
	}
	switch key {
	case keyMetadata:
		resp := kmsg.NewPtrMetadataResponse()
		resp.SetVersion(version)
		if resp.ReadFrom(body) != nil {
			return
		}
		ic.mu.Lock()
		defer ic.mu.Unlock()
		for _, t := range resp.Topics {
			learn(t.Topic, t.TopicID)
		}
	case keyDescribeTopicPartitions:
		resp := kmsg.NewPtrDescribeTopicPartitionsResponse()
		resp.SetVersion(version)
		if resp.ReadFrom(body) != nil {
			return
		}
		ic.mu.Lock()
		defer ic.mu.Unlock()
		for _, t := range resp.Topics {
			learn(t.Topic, t.TopicID)
		}
	}
}

// topicName resolves a topic id: from responses seen by the proxy, else by
// asking the cluster (one Metadata request shared by all callers waiting
// meanwhile). An id the cluster does not know is remembered for
// unknownTopicIDTTL. false: the id cannot be named; the chain then refuses
// its partitions (UNKNOWN_TOPIC_ID) rather than pass them uninspected.
func (ic *interception) topicName(id [16]byte) (string, bool) {
	ic.mu.Lock()
	if name, ok := ic.names[id]; ok {
		ic.mu.Unlock()
		return name, true
	}
	if at, ok := ic.unknown[id]; ok && time.Since(at) < unknownTopicIDTTL || time.Since(ic.learnt) < unknownTopicIDTTL && ic.lookup == nil {
		// Unknown, or the cluster was asked moments ago: every id a
		// client makes up would otherwise cost one Metadata request.
		ic.mu.Unlock()
		return "", false
	}
	l := ic.lookup
	if l == nil {
		l = &nameLookup{done: make(chan struct{})}
		ic.lookup = l
		go ic.refreshNames(l)
	}
	ic.mu.Unlock()
	<-l.done
	ic.mu.Lock()
	defer ic.mu.Unlock()
	if name, ok := ic.names[id]; ok {
		return name, true
	}
	if len(ic.unknown) >= 10000 { // bound what made-up ids can fill
		clear(ic.unknown)
	}
	ic.unknown[id] = time.Now()
	return "", false
}

// refreshNames asks the cluster for every topic's id.
func (ic *interception) refreshNames(l *nameLookup) {
	defer func() {
		ic.mu.Lock()
		ic.lookup = nil
		ic.learnt = time.Now()
		ic.mu.Unlock()
		close(l.done)
	}()
	ic.lookups.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	md, err := kadm.NewClient(ic.admin).Metadata(ctx)
	if err != nil {
		return
	}
	ic.mu.Lock()
	defer ic.mu.Unlock()
	for _, t := range md.Topics {
		if t.ID != ([16]byte{}) {
			ic.names[t.ID] = t.Topic
			delete(ic.unknown, t.ID)
		}
	}
}

// decodeProduce decodes a Produce request body of the given version.
func decodeProduce(version int16, body []byte) (*kmsg.ProduceRequest, error) {
	req := kmsg.NewPtrProduceRequest()
	req.SetVersion(version)
	if err := req.ReadFrom(body); err != nil {
		return nil, fmt.Errorf("decode Produce v%d request: %w", version, err)
	}
	return req, nil
}

// decodeFetch decodes a Fetch request body of the given version.
func decodeFetch(version int16, body []byte) (*kmsg.FetchRequest, error) {
	req := kmsg.NewPtrFetchRequest()
	req.SetVersion(version)
	if err := req.ReadFrom(body); err != nil {
		return nil, fmt.Errorf("decode Fetch v%d request: %w", version, err)
	}
	return req, nil
}

// requestFrame encodes a request frame: size, the client's own header bytes
// (kept as sent: api key, version, correlation id, client id, tags), body.
func requestFrame(header []byte, req kmsg.Request) []byte {
	return requestFrameSized(header, req, 256)
}

// requestFrameSized is requestFrame with room for body bytes after the
// header from the start, so that a large request is not grown (and copied)
// by doubling as it is encoded. Over 32 KiB the frame comes from the frame
// pools (pool.go): give it back with putFrame once written.
func requestFrameSized(header []byte, req kmsg.Request, body int) []byte {
	// Encoded in place after the header: a produce request may be large.
	out := getFrame(4 + len(header) + body)[:4]
	out = append(out, header...)
	out = req.AppendTo(out)
	binary.BigEndian.PutUint32(out, uint32(len(out)-4))
	return out
}

// responseFrame encodes a response frame the proxy answers itself.
func responseFrame(key, version int16, corr int32, resp kmsg.Response) []byte {
	header := kbin.AppendInt32(nil, corr)
	if ResponseHeaderFlexible(key, version) {
		header = append(header, 0) // no tagged fields
	}
	resp.SetVersion(version)
	return joinFrame(header, resp.AppendTo(nil))
}

// interceptProduce runs the produce interceptors over a Produce request
// frame. It returns the frame to forward (nil: the original, unchanged) and
// whether to forward at all; partitions the interceptors answered are kept
// in f, to be merged into the broker's response, or, when nothing is left
// to forward, f.local is the whole answer. The interceptors' work stops
// when the client goes away meanwhile. Errors: a request that does not
// decode.
func (c *conn) interceptProduce(h RequestHeader, frame []byte, f *inflight) (out []byte, forward bool, err error) {
	body := frame[4+h.Len:]
	if f.streams.Len() == 0 && c.produceUntouched(h, body, f.gen.chain) {
		return nil, true, nil // forwarded as it came, f.produce nil: nothing to merge or undo
	}
	req, err := decodeProduce(h.Version, body)
	if err != nil {
		return nil, false, err
	}
	// An acks=0 request is whole and wants no answer: a client that closes
	// right after sending it still wants its records, and the broker would
	// append them (found by a helper: 20 records of 1 MB lost when the
	// client closed at once). Only the connection's end (a failure,
	// shutdown) stops its interceptors. A request the chain runs through
	// quickly on this goroutine (QuickProduce) is watched only from when it
	// turns out slow (a KMS that does not answer): a watch for every such
	// request was 3 % of `encrypt`'s produce CPU.
	ctx, stop := c.ctx, func() {}
	switch {
	case f.acks0:
		ctx = context.WithValue(ctx, clientWatchedKey{}, true)
	case f.gen.chain.QuickProduce(len(frame)):
		ctx = interceptor.WithSlowRequest(ctx, func(ctx context.Context) context.Context {
			ctx, stop = c.watchClient(ctx)
			return ctx
		})
	default:
		ctx, stop = c.watchClient(ctx)
	}
	if f.streams != nil {
		ctx = interceptor.WithStreams(ctx, f.streams)
	}
	res := f.gen.chain.InterceptProduce(ctx, req, c.topicLimits)
	stop()
	defer res.Release()
	// Values streamed to the store for records the chain refused are
	// referenced by nothing: deleted before the client can hear of the
	// refusal (readRequest's AbortUncommitted, after the answer may have
	// gone out, remains the catch-all). Found by a loaded CI run: the
	// object of a refused 3 MiB record was still there when the client
	// had its MESSAGE_TOO_LARGE.
	f.streams.AbortUncommitted(c.ctx)
	// One line per request (the first refusal; the rest at debug level),
	// at most once a minute per topic: a request of a million refused
	// partitions is not a million lines.
	logged := false
	for _, a := range res.Answered {
		if a.ErrorCode != 0 {
			f.refused = true
		}
		if a.Err == nil {
			continue
		}
		topic := a.Topic
		if topic == "" { // Produce v13+ names topics by id
			topic, _ = c.s.ic.topicName(a.TopicID)
		}
		if a.ErrorCode == kerr.MessageTooLarge.Code {
			// Refused by the cached max.message.bytes: the topic's owner
			// may just have raised it (the usual answer to
			// MESSAGE_TOO_LARGE). Read it again, at most once a second
			// (a raise was ignored for topic.config.refresh.ms: found
			// by a helper).
			c.s.ic.configs.ForgetOlder(topic, limitRecheck)
		}
		// Built only for a line that is written: a request of many
		// refused partitions formats no error text for the debug level.
		attrs := func() []any {
			return []any{"topic", topic, "partition", a.Partition, "error_code", a.ErrorCode, "error", errorName(a.ErrorCode), "err", answerCause(a.Err, a.ErrorCode)}
		}
		if !logged && c.s.ic.shouldLog(topic, -2) {
			// A refusal of the client's records is news; a dependency
			// that failed (the store, the KMS, the schema registry, an
			// interceptor past its budget) is the operator's to see.
			level := slog.LevelInfo
			if dependencyFailed(a.ErrorCode) {
				level = slog.LevelWarn
			}
			c.log.Log(context.Background(), level, "produce interceptor answered a partition (logged once per minute per topic; the others at debug level)",
				append(attrs(), "partitions_answered", len(res.Answered))...)
		} else if c.log.Enabled(context.Background(), slog.LevelDebug) {
			c.log.Debug("produce interceptor answered a partition", attrs()...)
		}
		logged = true
	}
	if len(res.Answered) > 0 {
		c.s.m.errors.WithLabelValues("interceptor_produce").Add(float64(len(res.Answered)))
	}
	if !res.Forward {
		f.local = responseFrame(h.Key, h.Version, h.CorrelationID, res.Response(req))
		return nil, false, nil
	}
	f.produce = &res
	if res.Rewritten == 0 && len(res.Answered) == 0 {
		return nil, true, nil
	}
	// Rewritten records grow (encrypt: about 150 bytes per 1 KiB value):
	// room for a quarter more than the request as it came.
	out = requestFrameSized(frame[4:4+h.Len], req, len(body)+len(body)/4+256)
	if n := int64(len(out) - 4); n > int64(c.s.cfg.MaxRequestBytes) {
		// Grown past socket.request.max.bytes (the proxy takes the
		// broker's to be at least its own): the broker would close the
		// connection on it, an EOF with no reason (found by a helper: a
		// 96.6 MB request sealed to 110 MB). Every partition left in it
		// is answered MESSAGE_TOO_LARGE instead (a Java producer splits
		// its batches and retries) and its interceptor work undone.
		putFrame(out)
		err := fmt.Errorf("the request is %d bytes after interceptors, over socket.request.max.bytes %d (the broker closes a connection that sends more); nothing of it was forwarded", n, c.s.cfg.MaxRequestBytes)
		res.AbortAll(c.ctx)
		before := len(res.Answered)
		for _, t := range req.Topics {
			for _, p := range t.Partitions {
				res.Answered = append(res.Answered, interceptor.ProducePartitionResult{Topic: t.Topic, TopicID: t.TopicID,
					Partition: p.Partition, ErrorCode: kerr.MessageTooLarge.Code, ErrorMessage: err.Error(), Err: err})
			}
		}
		c.log.Info("produce request grew past socket.request.max.bytes after interceptors; answered MESSAGE_TOO_LARGE", "err", err)
		c.s.m.errors.WithLabelValues("interceptor_produce").Add(float64(len(res.Answered) - before))
		f.produce, f.refused = nil, true
		f.local = responseFrame(h.Key, h.Version, h.CorrelationID, res.Response(req))
		return nil, false, nil
	}
	return out, true, nil
}

// produceUntouched reports whether the chain would forward a Produce
// request body as it came, by a skim of its record sets
// (interceptor.Chain.ProduceUntouched): then it is forwarded undecoded.
// A body the skim cannot read goes through the full decode. The limits
// it needs are waited for within the connection's life, and the client's
// unless the request is acks=0 (topicLimits).
func (c *conn) produceUntouched(h RequestHeader, body []byte, chain *interceptor.Chain) bool {
	var buf [8]interceptor.RecordSet
	sets, err := produceRecordSets(h.Version, body, h.Flexible, buf[:0])
	if err != nil {
		return false
	}
	ctx := c.ctx
	if acks, err := produceAcks(body, h.Version, h.Flexible); err == nil && acks == 0 {
		ctx = context.WithValue(ctx, clientWatchedKey{}, true)
	}
	return chain.ProduceUntouched(ctx, sets, c.topicLimits)
}

// fetchUntouched reports whether the chain would leave a Fetch response
// body as it came (interceptor.Chain.FetchUntouched) and it names no
// broker endpoint to rewrite, by a skim: then it is passed on undecoded,
// once the fetch session it opens (session id) is noted.
func (c *conn) fetchUntouched(f *inflight, body []byte) bool {
	var buf [8]interceptor.RecordSet
	sets, session, err := fetchRecordSets(f.version, body, buf[:0])
	if err != nil || !f.gen.chain.FetchUntouched(sets) {
		return false
	}
	if needsRewrite(keyFetch, f.version) {
		if named, err := namesBrokers(keyFetch, f.version, body); err != nil || named {
			return false
		}
	}
	c.sessions.opened(session, f.newSession)
	return true
}

// produceAsIs reports whether a Produce response to a request whose
// partitions the interceptors did not answer or change (nothing to merge,
// undo or confirm) goes to the client as it came: it refuses nothing as
// MESSAGE_TOO_LARGE (which makes the proxy read the topic's
// max.message.bytes again) and names no broker endpoint to rewrite. Found
// by a walk of the body, not a decode.
func (c *conn) produceAsIs(version int16, body []byte) bool {
	if big, err := produceTooLarge(version, body); err != nil || big {
		return false
	}
	if !needsRewrite(keyProduce, version) {
		return true
	}
	named, err := namesBrokers(keyProduce, version, body)
	return err == nil && !named
}

// watchClient returns a context for work done on the client's behalf while
// the reader is busy with it: it ends when parent does (the connection's
// context, or one derived from it) or the client goes away (a peek at its socket sees the end). stop ends the
// watch; the reader may read again afterwards.
func (c *conn) watchClient(parent context.Context) (context.Context, func()) {
	return c.watch(context.WithValue(parent, clientWatchedKey{}, true), func() error {
		_, err := c.cr.Peek(1)
		return err
	})
}

// watch returns parent, also cancelled when wait, run on a goroutine of
// its own while the reader reads nothing, ends with an error other than
// the read deadline's (the client closed or broke the connection). stop
// ends the watch (by a read deadline in the past), waits for wait to
// return, then lets reads block again (unless Shutdown is draining: its
// deadline stays).
func (c *conn) watch(parent context.Context, wait func() error) (context.Context, func()) {
	ctx, cancel := context.WithCancel(parent)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := wait(); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			cancel()
		}
	}()
	return ctx, func() {
		cancel()
		_ = c.client.SetReadDeadline(time.Now())
		<-done
		c.setReadDeadline(time.Time{})
	}
}

// interceptResponse handles the responses the interceptors need: a Produce
// response to merge the proxy's own partition answers into (and to undo
// the published payloads of partitions the broker refused), a Fetch
// response whose records the fetch interceptors see, a Metadata or
// DescribeTopicPartitions response whose topic ids the proxy learns. Broker
// endpoints are rewritten first, as for any response. release gives back
// the fetch interceptors' memory once the frame is written.
func (c *conn) interceptResponse(f *inflight, frame, msg []byte, hlen int) ([]byte, func(), error) {
	release := func() {}
	body := msg[hlen:]
	changed := false
	// Produce and Fetch responses are decoded below: their endpoints are
	// mapped there, on the one decoded response.
	if needsRewrite(f.key, f.version) && f.key != keyProduce && f.key != keyFetch {
		b, ch, err := RewriteResponse(f.key, f.version, body, c.s.mapAddress)
		if err != nil {
			return nil, release, err
		}
		if ch {
			body, changed = b, true
			c.s.m.rewrites.WithLabelValues(apiName(f.key)).Inc()
		}
	}
	switch f.key {
	case keyMetadata, keyDescribeTopicPartitions:
		c.s.ic.learnTopics(f.key, f.version, body)
	case keyProduce:
		if f.produce == nil && c.produceAsIs(f.version, body) {
			return frame, release, nil
		}
		resp := kmsg.NewPtrProduceResponse()
		resp.SetVersion(f.version)
		if err := resp.ReadFrom(body); err != nil {
			return nil, release, fmt.Errorf("decode Produce v%d response: %w", f.version, err)
		}
		var err error
		if changed, err = c.rewriteDecoded(resp); err != nil {
			return nil, release, err
		}
		// The broker refused a batch as too large although the proxy's
		// check passed it: the cached max.message.bytes is stale (the
		// topic's limit was lowered). Read it again next time, and have
		// the producer send the batch again where the chain will offload
		// it then (retryTooLarge).
		if c.retryTooLarge(f, resp) {
			changed = true
		}
		if f.produce != nil {
			if n := f.produce.Refused(c.ctx, resp); n > 0 {
				c.log.Debug("the broker refused partitions whose payloads the interceptors had published; they were deleted", "partitions", n)
			}
			// Before the client's acknowledgement: payloads ferry gc
			// took while the broker's answer was on its way come back.
			if n, errs := f.produce.Confirm(c.ctx, resp); n > 0 || len(errs) > 0 {
				c.log.Warn("payloads of acknowledged records were quarantined or deleted by ferry gc before the acknowledgement; brought back", "objects", n)
				for _, err := range errs {
					c.log.Error("an acknowledged record's payload could not be brought back", "err", err)
				}
			}
			if len(f.produce.Answered) > 0 {
				f.produce.Merge(resp)
				changed = true
			}
		}
		if changed {
			body = resp.AppendTo(nil)
		}
	case keyFetch:
		if !c.auth.ok() {
			return nil, release, errors.New("a Fetch response on a connection that has not authenticated")
		}
		if c.fetchUntouched(f, body) {
			return frame, release, nil
		}
		resp := kmsg.NewPtrFetchResponse()
		resp.SetVersion(f.version)
		if err := resp.ReadFrom(body); err != nil {
			return nil, release, fmt.Errorf("decode Fetch v%d response: %w", f.version, err)
		}
		var err error
		if changed, err = c.rewriteDecoded(resp); err != nil {
			return nil, release, err
		}
		c.sessions.opened(resp.SessionID, f.newSession)
		// A rewritten response is held twice for a moment (its batches,
		// then its frame): its records are kept within a quarter of the
		// memory budget, whatever the consumer allows, so that a fetch
		// always fits and several fit at once (beyond the first record,
		// the consumer fetches the rest next time, KIP-74).
		limits := f.fetchLimits
		limits.Stream = true // written by writeParts
		if mx := c.s.mem.Limit() / 4; limits.MaxBytes <= 0 || int64(limits.MaxBytes) > mx {
			limits.MaxBytes = int32(min(mx, math.MaxInt32))
		}
		out := f.gen.chain.InterceptFetchLimited(c.fetchCtx, resp, limits)
		release = out.Release
		if out.Truncated > 0 {
			c.log.Debug("fetch response cut to the consumer's limits", "partitions", out.Truncated, "max_bytes", f.fetchLimits.MaxBytes)
		}
		for _, p := range out.Failed {
			topic := p.Topic
			if topic == "" {
				topic, _ = c.s.ic.topicName(p.TopicID)
			}
			// A consumer retries a failed partition at once: log it once
			// per partition every logEvery, not on every fetch.
			if c.s.ic.shouldLog(topic, p.Partition) {
				msg := "fetch interceptor failed a partition; the consumer will retry it (logged once per minute)"
				if p.ErrorCode == kerr.CorruptMessage.Code {
					// interceptor.fetchCode: the record will never open.
					msg = "fetch interceptor found a corrupt record; the partition is answered CORRUPT_MESSAGE from it on (Java consumers raise it, naming the offset; logged once per minute)"
				}
				c.log.Warn(msg, "topic", topic, "partition", p.Partition, "error_code", p.ErrorCode, "partial", p.Partial, "err", p.Err)
			}
		}
		if len(out.Failed) > 0 {
			c.s.m.errors.WithLabelValues("interceptor_fetch").Add(float64(len(out.Failed)))
		}
		// Every interceptor call returned (none ran over its budget and
		// was left running on the frame's bytes): the frame is free once
		// the response is written.
		f.frameFree = len(out.Failed) == 0
		if out.Rewritten > 0 || len(out.Failed) > 0 {
			// Encoded once, straight into the frame, charged first: it
			// holds every payload put back. The rewritten batches are
			// held while the frame's memory is awaited, so the wait is
			// bounded by the time budget: fetches that each hold their
			// batches and wait for their frames would otherwise wait for
			// each other for good. At the end of the budget the records
			// are dropped for a retriable error, which needs almost no
			// memory, and the consumer fetches them again.
			// Large record sets are written from where they lie
			// (fetchframe.go): only the rest of the frame is encoded.
			large := detachLarge(resp, out.Streamed)
			est := fetchFrameBytes(resp, hlen)
			ctx, cancel := context.WithTimeout(c.fetchCtx, f.gen.chain.Timeout())
			err := c.s.mem.Take(ctx, est)
			cancel()
			if err != nil {
				reattach(large)
				large = nil
				out.Release()
				release = func() {}
				n := dropFetchRecords(resp, kerr.KafkaStorageError.Code)
				c.s.m.errors.WithLabelValues("interceptor_fetch").Add(float64(n))
				if c.s.ic.shouldLog("fetch-memory", -1) {
					c.log.Warn("no memory for a rewritten fetch response within the time budget; its partitions get KAFKA_STORAGE_ERROR and the consumer will fetch them again (logged once per minute)", "partitions", n, "bytes", est, "err", err)
				}
				est = fetchFrameBytes(resp, hlen)
				if err := c.s.mem.Take(c.ctx, est); err != nil {
					return nil, release, err
				}
			}
			release = func() { out.Release(); c.s.mem.Give(est) }
			enc := append(make([]byte, 4, est), msg[:hlen]...)
			enc = resp.AppendTo(enc)
			binary.BigEndian.PutUint32(enc, uint32(len(enc)-4))
			if len(large) > 0 {
				parts, err := spliceFrame(f.version, enc, 4+hlen, large)
				if err == nil {
					f.parts = &parts
					return nil, release, nil
				}
				if hasHoles(large) {
					// Encoded whole, the streamed values' batches would be
					// wrong: the response cannot be written.
					return nil, release, fmt.Errorf("a fetch response with streamed values could not be written in parts: %w", err)
				}
				// Not expected (the walk follows kmsg): encoded whole.
				c.log.Warn("a rewritten fetch response could not be written in parts; encoding it whole", "err", err)
				reattach(large)
				enc = append(enc[:4+hlen], resp.AppendTo(nil)...)
				binary.BigEndian.PutUint32(enc, uint32(len(enc)-4))
			}
			return enc, release, nil
		}
		if changed {
			body = resp.AppendTo(nil)
		}
	}
	if !changed {
		return frame, release, nil
	}
	return joinFrame(msg[:hlen], body), release, nil
}

// rewriteDecoded maps the broker endpoints of a decoded Produce or Fetch
// response (KIP-951) in place, counting the rewrite; changed: it must be
// encoded again.
func (c *conn) rewriteDecoded(resp kmsg.Response) (bool, error) {
	if !needsRewrite(resp.Key(), resp.GetVersion()) {
		return false, nil
	}
	changed, err := rewriteDecoded(resp, c.s.mapAddress)
	if changed {
		c.s.m.rewrites.WithLabelValues(apiName(resp.Key())).Inc()
	}
	return changed, err
}

// fetchFrameBytes bounds the bytes of resp encoded as a frame after a
// response header of hlen bytes.
func fetchFrameBytes(resp *kmsg.FetchResponse, hlen int) int64 {
	n := int64(4+hlen) + 1024
	for _, t := range resp.Topics {
		n += int64(len(t.Topic)) + 64
		for _, p := range t.Partitions {
			n += int64(len(p.RecordBatches)) + 128 + int64(len(p.AbortedTransactions))*16
		}
	}
	return n
}

// dropFetchRecords empties the record sets of resp's partitions that have
// records, setting code on them (a retriable error: the consumer fetches
// the same offsets again), and returns how many it changed.
func dropFetchRecords(resp *kmsg.FetchResponse, code int16) int {
	n := 0
	for ti := range resp.Topics {
		for pi := range resp.Topics[ti].Partitions {
			p := &resp.Topics[ti].Partitions[pi]
			if len(p.RecordBatches) == 0 {
				continue
			}
			p.ErrorCode = code
			p.RecordBatches = []byte{} // empty, not null: librdkafka cannot parse a null record set (size -1)
			p.AbortedTransactions = nil
			n++
		}
	}
	return n
}

// retryTooLarge forgets the cached max.message.bytes of each topic whose
// partitions resp, the broker's answer to f, refuses as MESSAGE_TOO_LARGE,
// and answers those partitions KAFKA_STORAGE_ERROR (retriable for every
// Kafka client, which sends the batch again unchanged) where
// interception.retryTooLarge says so. It reports whether it changed resp.
func (c *conn) retryTooLarge(f *inflight, resp *kmsg.ProduceResponse) bool {
	changed := false
	var now time.Time
	for ti := range resp.Topics {
		t := &resp.Topics[ti]
		name, retry, seen := t.Topic, false, false
		for pi := range t.Partitions {
			p := &t.Partitions[pi]
			if p.ErrorCode != kerr.MessageTooLarge.Code {
				continue
			}
			if !seen {
				seen = true
				if name == "" { // v13+: by id
					name, _ = c.s.ic.topicName(t.TopicID)
				}
				readAt, cached := c.s.ic.configs.ReadAt(name)
				c.s.ic.configs.Forget(name)
				if now.IsZero() {
					now = time.Now()
				}
				retry = name != "" && f.gen.chain.Shrinks(name) && c.s.ic.retryTooLarge(name, f.start, readAt, cached, now)
				if retry && c.s.ic.shouldLog(name, -3) {
					c.log.Info("the broker refused a batch as over the topic's max.message.bytes, lowered since the proxy read it; answered KAFKA_STORAGE_ERROR so that the producer sends it again, and the proxy offloads it then (logged once per minute per topic)",
						"topic", name, "partition", p.Partition)
				}
			}
			if !retry {
				continue
			}
			p.ErrorCode = kerr.KafkaStorageError.Code
			if resp.Version >= 8 {
				msg := "ferry proxy: the topic's max.message.bytes was lowered after the proxy checked this batch against it; send it again (the proxy offloads what no longer fits)"
				p.ErrorMessage = &msg
				p.ErrorRecords = nil
			}
			changed = true
		}
	}
	return changed
}

// limitRecheck is how often a topic's max.message.bytes is read again
// while the proxy refuses batches as over it.
const limitRecheck = time.Second

// retryTooLarge reports whether the broker's MESSAGE_TOO_LARGE for a batch
// of topic, in a Produce request the proxy read at start, goes to the
// client as a retriable error instead, now: the batch was checked against
// a cached max.message.bytes that the topic's owner may have lowered since
// (readAt: when the limit cached at the refusal was read, cached false:
// none), the topic's chain offloads (Chain.Shrinks), and the producer's
// retry will be checked against the limit read again (the caller forgets
// the cached one) and offloaded. Kafka's producers give up on
// MESSAGE_TOO_LARGE (Java splits a batch of several records first), so
// the record that met the lowered limit would otherwise fail although
// ferry could carry it.
//
// Retried:
//   - a request read when the cached limit was already at least
//     limitRecheck old (the cache entry the refusal finds was read before
//     the request: the one it was checked against);
//   - a request read before the last retried answer for topic (in flight
//     with it, checked against the same stale limit; that entry is gone or
//     read again by now).
//
// Not retried: a request checked against a limit read for it, or just
// before it, and the retry of a retried one (read after that answer, so
// checked against the limit read again): the broker refuses what ferry's
// check passes, and the refusal goes through. A record is retried once,
// however long its producer waits before sending it again (franz-go waits
// for a metadata refresh, up to 5 s), never in a loop.
func (ic *interception) retryTooLarge(topic string, start, readAt time.Time, cached bool, now time.Time) bool {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	if last, ok := ic.retried[topic]; ok && start.Before(last) {
		return true // in flight with the last retried one
	}
	if !cached || !readAt.Before(start) || start.Sub(readAt) < limitRecheck {
		return false
	}
	for t, at := range ic.retried { // bounded: only answers in flight matter
		if now.Sub(at) >= retriedKeep {
			delete(ic.retried, t)
		}
	}
	ic.retried[topic] = now
	return true
}

// retriedKeep is how long a retried MESSAGE_TOO_LARGE answer is remembered
// for the requests in flight with it (their answers come within the
// producer's request timeout, 30 s by default).
const retriedKeep = time.Minute

// dependencyFailed reports whether a partition answered with code was
// refused for something other than its records: a store, KMS or schema
// registry that failed (KAFKA_STORAGE_ERROR, as the interceptors answer
// it), an interceptor past its budget (REQUEST_TIMED_OUT) or one that
// failed unexpectedly (UNKNOWN_SERVER_ERROR).
func dependencyFailed(code int16) bool {
	switch code {
	case kerr.KafkaStorageError.Code, kerr.RequestTimedOut.Code, kerr.UnknownServerError.Code:
		return true
	}
	return false
}

// answerCause is err's text without the Kafka error of code in front
// (logged as its name beside it: KAFKA_STORAGE_ERROR's own text speaks of
// a disk, not of the KMS that failed).
func answerCause(err error, code int16) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	if ke := kerr.ErrorForCode(code); ke != nil {
		if rest, ok := strings.CutPrefix(s, ke.Error()+": "); ok {
			return rest
		}
	}
	return s
}

// errorName is the name of the Kafka error of code (KAFKA_STORAGE_ERROR).
func errorName(code int16) string {
	var ke *kerr.Error
	if errors.As(kerr.ErrorForCode(code), &ke) {
		return ke.Message
	}
	return fmt.Sprintf("error code %d", code)
}
