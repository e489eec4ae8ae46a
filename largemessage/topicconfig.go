package largemessage

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TopicConfig is what Ferry reads of a topic's configuration for exact
// sizing.
type TopicConfig struct {
	// MaxMessageBytes is the topic's max.message.bytes, or the broker's
	// message.max.bytes for a topic that does not exist (yet): the limit
	// an auto-created topic gets.
	MaxMessageBytes int64
	// Compression is the topic's compression.type ("producer", "gzip",
	// …), or the broker's for a topic that does not exist.
	Compression string
	// Exists is false when the cluster answered UNKNOWN_TOPIC_OR_PARTITION.
	Exists bool
}

// Defaults of a TopicConfigs cache.
const (
	DefaultTopicConfigTTL        = 5 * time.Minute  // how long a topic's config is trusted
	DefaultUnknownTopicConfigTTL = 5 * time.Second  // how long "no such topic" is trusted
	topicConfigTimeout           = 10 * time.Second // one DescribeConfigs round, for all topics asked at once
)

// TopicConfigs reads topic configurations from the cluster (DescribeConfigs)
// and caches them: known topics for a TTL, unknown topics for a few
// seconds. Concurrent lookups of one topic share one request, and the
// topics of one GetAll go in one request. Forget drops a topic, e.g. when
// the broker answered MESSAGE_TOO_LARGE for a record sized with a limit
// that has since been lowered. It is safe for concurrent use.
type TopicConfigs struct {
	cl      *kgo.Client
	ttl     time.Duration
	unknown time.Duration

	requests atomic.Int64 // DescribeConfigs rounds made

	mu       sync.Mutex
	m        map[string]cachedConfig
	inflight map[string]*configCall
	broker   cachedConfig // the broker's message.max.bytes and compression.type
}

type cachedConfig struct {
	c  TopicConfig
	at time.Time
}

type configCall struct {
	done chan struct{}
	c    TopicConfig
	err  error
}

// NewTopicConfigs returns a cache that asks the cluster through cl (any
// client of the cluster: it issues admin requests only) and trusts a
// topic's configuration for ttl (0: DefaultTopicConfigTTL), and the answer
// "no such topic" for DefaultUnknownTopicConfigTTL (see WithUnknownTTL).
func NewTopicConfigs(cl *kgo.Client, ttl time.Duration) *TopicConfigs {
	if ttl <= 0 {
		ttl = DefaultTopicConfigTTL
	}
	return &TopicConfigs{cl: cl, ttl: ttl, unknown: DefaultUnknownTopicConfigTTL,
		m: map[string]cachedConfig{}, inflight: map[string]*configCall{}}
}

// WithUnknownTTL sets how long "no such topic" is trusted (0: not at all,
// the cluster is asked again each time) and returns t. A topic just created
// is unknown to DescribeConfigs for a moment, and its own limits may be
// lower than the broker's defaults that stand in meanwhile.
func (t *TopicConfigs) WithUnknownTTL(d time.Duration) *TopicConfigs {
	t.unknown = d
	return t
}

// Requests returns how many times the cache asked the cluster (one
// DescribeConfigs round each, however many topics), for metrics.
func (t *TopicConfigs) Requests() int64 { return t.requests.Load() }

// Forget drops topic's cached configuration: the next lookup asks the
// cluster.
func (t *TopicConfigs) Forget(topic string) {
	t.mu.Lock()
	delete(t.m, topic)
	t.mu.Unlock()
}

// ForgetOlder drops topic's cached configuration if it was read at least
// age ago, and otherwise trusts it only until age after it was read, so
// that a caller that suspects it (a batch refused as too large by the
// cached limit, which the topic's owner may just have raised) asks the
// cluster at most once per age, and again for the next lookup after that.
func (t *TopicConfigs) ForgetOlder(topic string, age time.Duration) {
	t.mu.Lock()
	if e, ok := t.m[topic]; ok {
		if time.Since(e.at) >= age {
			delete(t.m, topic)
		} else if ttl := t.ttlOf(e.c); ttl > age {
			e.at = e.at.Add(age - ttl) // expires age after it was read
			t.m[topic] = e
		}
	}
	t.mu.Unlock()
}

// ReadAt returns when topic's cached configuration was read from the
// cluster; ok is false when none is cached (expired entries included: a
// lookup would ask again).
func (t *TopicConfigs) ReadAt(topic string) (at time.Time, ok bool) {
	now := time.Now()
	t.mu.Lock()
	e, ok := t.m[topic]
	t.mu.Unlock()
	if !ok || now.Sub(e.at) >= t.ttlOf(e.c) {
		return time.Time{}, false
	}
	return e.at, true
}

// Get returns topic's configuration, waiting for the cluster as GetAll
// does. Errors: the cluster could not be asked and nothing is cached (a
// stale entry is returned rather than an error); ctx's error when it ended
// first.
func (t *TopicConfigs) Get(ctx context.Context, topic string) (TopicConfig, error) {
	// A cached topic (every record of a Producer asks): no allocation.
	if c, ok := t.Cached(topic); ok {
		return c, nil
	}
	r := t.GetAll(ctx, []string{topic})
	return r[topic].Config, r[topic].Err
}

// Cached returns topic's configuration when it is cached and within its
// TTL, what Get answers at once without asking the cluster; ok is false
// otherwise.
func (t *TopicConfigs) Cached(topic string) (c TopicConfig, ok bool) {
	now := time.Now()
	t.mu.Lock()
	e, ok := t.m[topic]
	t.mu.Unlock()
	if !ok || now.Sub(e.at) >= t.ttlOf(e.c) {
		return TopicConfig{}, false
	}
	return e.c, true
}

// getUntil is Get that also says until when the answer may be reused
// without asking again: the end of its cache entry's TTL, or the zero time
// when it is not cached (an error, or an unknown topic with an unknown TTL
// of 0).
func (t *TopicConfigs) getUntil(ctx context.Context, topic string) (TopicConfig, time.Time, error) {
	c, err := t.Get(ctx, topic)
	if err != nil {
		return c, time.Time{}, err
	}
	t.mu.Lock()
	e, ok := t.m[topic]
	t.mu.Unlock()
	if !ok || e.c != c {
		return c, time.Time{}, nil
	}
	return c, e.at.Add(t.ttlOf(e.c)), nil
}

// TopicConfigResult is one topic's answer of GetAll.
type TopicConfigResult struct {
	Config TopicConfig
	Err    error
}

// GetAll returns the configurations of topics, asking the cluster once for
// all that are not cached or being asked for already. It waits for the
// cluster's answer at most until ctx ends (a topic not answered by then
// has ctx's error) and at most 10 s in any case; the lookup itself goes on
// for the other callers waiting for it, within those 10 s.
func (t *TopicConfigs) GetAll(ctx context.Context, topics []string) map[string]TopicConfigResult {
	out := make(map[string]TopicConfigResult, len(topics))
	var ask []string
	var own *configBatch
	wait := map[string]*configCall{}
	now := time.Now()
	t.mu.Lock()
	for _, topic := range topics {
		if _, seen := out[topic]; seen {
			continue
		}
		if e, ok := t.m[topic]; ok && now.Sub(e.at) < t.ttlOf(e.c) {
			out[topic] = TopicConfigResult{Config: e.c}
			continue
		}
		if call, ok := t.inflight[topic]; ok {
			wait[topic] = call
			continue
		}
		if own == nil {
			own = &configBatch{calls: map[string]*configCall{}}
		}
		call := &configCall{done: make(chan struct{})}
		t.inflight[topic] = call
		own.calls[topic] = call
		ask = append(ask, topic)
		out[topic] = TopicConfigResult{} // placeholder, filled below
	}
	t.mu.Unlock()
	if own != nil {
		// Asked on a goroutine of its own, detached from ctx (and capped
		// at topicConfigTimeout): the callers that joined the lookup
		// meanwhile are not failed when this one's ctx ends (its client
		// went away), and this one stops waiting when it does.
		go t.describe(context.WithoutCancel(ctx), ask, own)
		for topic, call := range own.calls {
			wait[topic] = call
		}
	}
	for topic, call := range wait {
		select {
		case <-call.done:
			out[topic] = TopicConfigResult{Config: call.c, Err: call.err}
		case <-ctx.Done():
			out[topic] = TopicConfigResult{Err: ctx.Err()}
		}
	}
	return out
}

func (t *TopicConfigs) ttlOf(c TopicConfig) time.Duration {
	if c.Exists {
		return t.ttl
	}
	return t.unknown
}

type configBatch struct{ calls map[string]*configCall }

// describe asks the cluster for topics and completes their calls; on
// failure a stale cached entry is used where there is one.
func (t *TopicConfigs) describe(ctx context.Context, topics []string, b *configBatch) {
	t.requests.Add(1)
	ctx, cancel := context.WithTimeout(ctx, topicConfigTimeout)
	defer cancel()
	adm := kadm.NewClient(t.cl)
	rcs, err := adm.DescribeTopicConfigs(ctx, topics...)
	results := map[string]TopicConfigResult{}
	var needBroker bool
	if err == nil {
		for _, topic := range topics {
			rc, rerr := rcs.On(topic, nil)
			switch {
			case rerr != nil:
				results[topic] = TopicConfigResult{Err: rerr}
			case errors.Is(rc.Err, kerr.UnknownTopicOrPartition):
				needBroker = true
				results[topic] = TopicConfigResult{}
			case rc.Err != nil:
				results[topic] = TopicConfigResult{Err: rc.Err}
			default:
				c := TopicConfig{Exists: true, Compression: configValue(rc.Configs, "compression.type")}
				c.MaxMessageBytes, rerr = strconv.ParseInt(configValue(rc.Configs, "max.message.bytes"), 10, 64)
				if rerr != nil {
					results[topic] = TopicConfigResult{Err: fmt.Errorf("topic %s: max.message.bytes not read: %w", topic, rerr)}
					continue
				}
				results[topic] = TopicConfigResult{Config: c}
			}
		}
	}
	var brokerErr error
	if needBroker {
		var bc TopicConfig
		bc, brokerErr = t.brokerConfig(ctx, adm)
		for topic, r := range results {
			if r.Err == nil && !r.Config.Exists {
				results[topic] = TopicConfigResult{Config: bc, Err: brokerErr}
			}
		}
	}
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	for topic, call := range b.calls {
		r, ok := results[topic]
		if !ok {
			r = TopicConfigResult{Err: err}
		}
		if r.Err != nil {
			if e, ok := t.m[topic]; ok { // stale beats nothing
				r = TopicConfigResult{Config: e.c}
			} else {
				r.Err = fmt.Errorf("reading the configuration of topic %s: %w", topic, r.Err)
			}
		} else if r.Config.Exists || t.unknown > 0 {
			t.m[topic] = cachedConfig{c: r.Config, at: now}
		}
		call.c, call.err = r.Config, r.Err
		delete(t.inflight, topic)
		close(call.done)
	}
}

// brokerConfig returns the broker's message.max.bytes and compression.type
// (cached for the TTL), the limits of a topic that does not exist yet.
func (t *TopicConfigs) brokerConfig(ctx context.Context, adm *kadm.Client) (TopicConfig, error) {
	t.mu.Lock()
	b := t.broker
	t.mu.Unlock()
	if !b.at.IsZero() && time.Since(b.at) < t.ttl {
		return b.c, nil
	}
	// With no broker ids, DescribeBrokerConfigs returns only dynamic
	// cluster-wide configs; ask one broker for its effective value.
	md, err := adm.BrokerMetadata(ctx)
	if err != nil {
		return TopicConfig{}, err
	}
	if len(md.Brokers) == 0 {
		return TopicConfig{}, errors.New("the cluster named no broker")
	}
	rcs, err := adm.DescribeBrokerConfigs(ctx, md.Brokers[0].NodeID)
	if err != nil {
		return TopicConfig{}, err
	}
	var c TopicConfig
	for _, rc := range rcs {
		if rc.Err != nil {
			return TopicConfig{}, rc.Err
		}
		c.Compression = configValue(rc.Configs, "compression.type")
		if c.MaxMessageBytes, err = strconv.ParseInt(configValue(rc.Configs, "message.max.bytes"), 10, 64); err != nil {
			return TopicConfig{}, fmt.Errorf("the broker's message.max.bytes not read: %w", err)
		}
	}
	t.mu.Lock()
	t.broker = cachedConfig{c: c, at: time.Now()}
	t.mu.Unlock()
	return c, nil
}

func configValue(cs []kadm.Config, key string) string {
	for _, c := range cs {
		if c.Key == key && c.Value != nil {
			return *c.Value
		}
	}
	return ""
}
