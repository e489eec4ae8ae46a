package proxy

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/interceptor"
)

// topicConfigTTL is how long a topic's max.message.bytes, read from the
// cluster, is trusted before it is read again (`topic.config.refresh.ms`).
const defaultTopicConfigTTL = time.Minute

// interception is the Server's KIP-905 state: the interceptor chain, an
// admin client of the upstream cluster for topic configs and ids, and their
// caches. nil when no interceptor is configured: requests then pass opaque.
type interception struct {
	chain *interceptor.Chain
	admin *kgo.Client
	ttl   time.Duration

	mu     sync.Mutex
	limits map[string]limitEntry
	names  map[[16]byte]string
	logged map[string]time.Time // last warning per topic/partition
}

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
	ic.logged[key] = time.Now()
	return true
}

type limitEntry struct {
	max int32
	at  time.Time
}

// newInterception builds the chain of cfg.Interceptors and the admin
// client. Errors: an unknown interceptor name or a bad interceptor config
// (each names the interceptor), an admin client that cannot be made.
func newInterception(cfg Config, upstreamTLS kgo.Opt) (*interception, error) {
	ic := &interception{ttl: cfg.TopicConfigRefresh, limits: map[string]limitEntry{}, names: map[[16]byte]string{}, logged: map[string]time.Time{}}
	if ic.ttl <= 0 {
		ic.ttl = defaultTopicConfigTTL
	}
	opts := []kgo.Opt{kgo.SeedBrokers(cfg.Upstream...), kgo.ClientID("ferry-proxy"), kgo.DialTimeout(cfg.DialTimeout)}
	if upstreamTLS != nil {
		opts = append(opts, upstreamTLS)
	}
	var err error
	if ic.admin, err = kgo.NewClient(opts...); err != nil {
		return nil, fmt.Errorf("interceptors: admin client of the upstream cluster: %w", err)
	}
	ic.chain, err = interceptor.Build(context.Background(), cfg.Interceptors, interceptor.Options{
		Timeout: cfg.InterceptorTimeout, TopicName: ic.topicName})
	if err != nil {
		ic.admin.Close()
		return nil, err
	}
	return ic, nil
}

func (ic *interception) close() {
	ic.chain.Close()
	ic.admin.Close()
}

// maxMessageBytes is the limits callback of Chain.InterceptProduce: the
// topic's max.message.bytes as the cluster reports it (DescribeConfigs),
// cached for topic.config.refresh.ms. When the cluster cannot be asked, the
// last known value is used, or none (ok false: the broker's own check then
// applies).
func (ic *interception) maxMessageBytes(topic string) (int32, bool) {
	ic.mu.Lock()
	e, ok := ic.limits[topic]
	ic.mu.Unlock()
	if ok && time.Since(e.at) < ic.ttl {
		return e.max, true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rcs, err := kadm.NewClient(ic.admin).DescribeTopicConfigs(ctx, topic)
	if err == nil {
		if rc, rerr := rcs.On(topic, nil); rerr == nil && rc.Err == nil {
			for _, c := range rc.Configs {
				if c.Key == "max.message.bytes" && c.Value != nil {
					if n, perr := strconv.ParseInt(*c.Value, 10, 32); perr == nil {
						ic.mu.Lock()
						ic.limits[topic] = limitEntry{max: int32(n), at: time.Now()}
						ic.mu.Unlock()
						return int32(n), true
					}
				}
			}
		}
	}
	return e.max, ok
}

// forgetLimit drops the cached max.message.bytes of topic.
func (ic *interception) forgetLimit(topic string) {
	ic.mu.Lock()
	delete(ic.limits, topic)
	ic.mu.Unlock()
}

// learnTopics records the topic ids of a Metadata response that passed
// through the proxy (produce and fetch v13+ name topics by id).
func (ic *interception) learnTopics(version int16, body []byte) {
	resp := kmsg.NewPtrMetadataResponse()
	resp.SetVersion(version)
	if resp.ReadFrom(body) != nil {
		return
	}
	ic.mu.Lock()
	defer ic.mu.Unlock()
	for _, t := range resp.Topics {
		if t.Topic != nil && t.TopicID != ([16]byte{}) {
			ic.names[t.TopicID] = *t.Topic
		}
	}
}

// topicName resolves a topic id: from Metadata seen by the proxy, else by
// asking the cluster once.
func (ic *interception) topicName(id [16]byte) (string, bool) {
	ic.mu.Lock()
	name, ok := ic.names[id]
	ic.mu.Unlock()
	if ok {
		return name, true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	md, err := kadm.NewClient(ic.admin).Metadata(ctx)
	if err != nil {
		return "", false
	}
	ic.mu.Lock()
	defer ic.mu.Unlock()
	for _, t := range md.Topics {
		ic.names[t.ID] = t.Topic
	}
	name, ok = ic.names[id]
	return name, ok
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
	// Encoded in place after the header: a produce request may be large.
	out := make([]byte, 4, 4+len(header)+256)
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
// to forward, f.local is the whole answer. Errors: a request that does not
// decode.
func (c *conn) interceptProduce(h RequestHeader, frame []byte, f *inflight) (out []byte, forward bool, err error) {
	body := frame[4+h.Len:]
	req, err := decodeProduce(h.Version, body)
	if err != nil {
		return nil, false, err
	}
	res := c.s.ic.chain.InterceptProduce(c.ctx, req, c.s.ic.maxMessageBytes)
	for _, a := range res.Answered {
		if a.Err != nil {
			topic := a.Topic
			if topic == "" { // Produce v13+ names topics by id
				topic, _ = c.s.ic.topicName(a.TopicID)
			}
			c.log.Info("produce interceptor answered a partition", "topic", topic, "partition", a.Partition, "error_code", a.ErrorCode, "err", a.Err)
		}
	}
	if len(res.Answered) > 0 {
		c.s.m.errors.WithLabelValues("interceptor_produce").Add(float64(len(res.Answered)))
	}
	if !res.Forward {
		f.local = responseFrame(h.Key, h.Version, h.CorrelationID, res.Response(req))
		return nil, false, nil
	}
	if len(res.Answered) > 0 {
		f.produce = &res
	}
	if res.Rewritten == 0 && len(res.Answered) == 0 {
		return nil, true, nil
	}
	return requestFrame(frame[4:4+h.Len], req), true, nil
}

// interceptResponse handles the responses the interceptors need: a Produce
// response to merge the proxy's own partition answers into, a Fetch response
// whose records the fetch interceptors see, a Metadata response whose topic
// ids the proxy learns. Broker endpoints are rewritten first, as for any
// response.
func (c *conn) interceptResponse(f *inflight, frame, msg []byte, hlen int) ([]byte, error) {
	body := msg[hlen:]
	changed := false
	if needsRewrite(f.key, f.version) {
		b, ch, err := RewriteResponse(f.key, f.version, body, c.s.mapAddress)
		if err != nil {
			return nil, err
		}
		if ch {
			body, changed = b, true
			c.s.m.rewrites.WithLabelValues(apiName(f.key)).Inc()
		}
	}
	switch f.key {
	case 3:
		c.s.ic.learnTopics(f.version, body)
	case 0:
		resp := kmsg.NewPtrProduceResponse()
		resp.SetVersion(f.version)
		if err := resp.ReadFrom(body); err != nil {
			return nil, fmt.Errorf("decode Produce v%d response: %w", f.version, err)
		}
		// The broker refused a batch as too large although the proxy's
		// check passed it: the cached max.message.bytes is stale (the
		// topic's limit was lowered). Read it again next time.
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if p.ErrorCode == kerr.MessageTooLarge.Code {
					name := t.Topic
					if name == "" { // v13+: by id
						name, _ = c.s.ic.topicName(t.TopicID)
					}
					c.s.ic.forgetLimit(name)
				}
			}
		}
		if f.produce != nil {
			f.produce.Merge(resp)
			body, changed = resp.AppendTo(nil), true
		}
	case 1:
		resp := kmsg.NewPtrFetchResponse()
		resp.SetVersion(f.version)
		if err := resp.ReadFrom(body); err != nil {
			return nil, fmt.Errorf("decode Fetch v%d response: %w", f.version, err)
		}
		out := c.s.ic.chain.InterceptFetchLimited(c.ctx, resp, f.fetchLimits)
		if out.Truncated > 0 {
			c.log.Debug("fetch response cut to the consumer's limits after interceptors", "partitions", out.Truncated, "max_bytes", f.fetchLimits.MaxBytes)
		}
		for _, p := range out.Failed {
			topic := p.Topic
			if topic == "" {
				topic, _ = c.s.ic.topicName(p.TopicID)
			}
			// A consumer retries a failed partition at once: log it once
			// per partition every logEvery, not on every fetch.
			if c.s.ic.shouldLog(topic, p.Partition) {
				c.log.Warn("fetch interceptor failed a partition; the consumer will retry it (logged once per minute)", "topic", topic, "partition", p.Partition, "error_code", p.ErrorCode, "partial", p.Partial, "err", p.Err)
			}
		}
		if len(out.Failed) > 0 {
			c.s.m.errors.WithLabelValues("interceptor_fetch").Add(float64(len(out.Failed)))
		}
		if out.Rewritten > 0 || len(out.Failed) > 0 {
			body, changed = resp.AppendTo(nil), true
		}
	}
	if !changed {
		return frame, nil
	}
	return joinFrame(msg[:hlen], body), nil
}
