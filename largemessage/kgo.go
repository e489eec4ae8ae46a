package largemessage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/ferrykit/ferry/payloadstore"
	"github.com/ferrykit/ferry/serde"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Producer wraps a franz-go client: each record is offloaded as needed
// before it is handed to the client. It is an explicit wrapper rather than a
// kgo hook because a hook can neither return an error nor take a context.
type Producer struct {
	cl        *kgo.Client
	ser       *Serializer
	threshold int64
	keySer    *serde.Chain
	valueSer  *serde.Chain

	mu     sync.Mutex
	limits map[string]cachedLimits
}

type cachedLimits struct {
	l  Limits
	at time.Time
}

// limitsTTL is how long a topic's max.message.bytes is cached.
const limitsTTL = 5 * time.Minute

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
	ser := NewSerializer(store, codec)
	d := DefaultConfig()
	p := &Producer{cl: cl, ser: ser, threshold: cfg.Threshold, keySer: cfg.KeySerializers, valueSer: cfg.ValueSerializers, limits: map[string]cachedLimits{}}
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

// Limits returns the limits in force for topic: its max.message.bytes read
// from the cluster (DescribeConfigs, cached for five minutes; the broker's
// message.max.bytes if the topic does not exist yet), the client's batch cap
// for it, and the threshold.
func (p *Producer) Limits(ctx context.Context, topic string) Limits {
	p.mu.Lock()
	c, ok := p.limits[topic]
	p.mu.Unlock()
	if ok && time.Since(c.at) < limitsTTL {
		return c.l
	}
	maxBytes, topicCodec := topicLimits(ctx, p.cl, topic)
	l := DeriveLimits(p.threshold, maxBytes, clientBatchMax(p.cl, topic))
	l.TopicCompression = topicCodec
	p.mu.Lock()
	p.limits[topic] = cachedLimits{l: l, at: time.Now()}
	p.mu.Unlock()
	return l
}

// topicLimits reads the topic's max.message.bytes (or the broker's
// message.max.bytes, or Kafka's default with a warning) and its
// compression.type.
func topicLimits(ctx context.Context, cl *kgo.Client, topic string) (maxBytes int64, compression string) {
	adm := kadm.NewClient(cl)
	value := func(rcs kadm.ResourceConfigs, key string) (string, bool) {
		for _, rc := range rcs {
			if rc.Err != nil {
				continue
			}
			for _, c := range rc.Configs {
				if c.Key == key && c.Value != nil {
					return *c.Value, true
				}
			}
		}
		return "", false
	}
	parse := func(rcs kadm.ResourceConfigs, key string) (int64, bool) {
		v, ok := value(rcs, key)
		if !ok {
			return 0, false
		}
		n, err := strconv.ParseInt(v, 10, 64)
		return n, err == nil
	}
	if rcs, err := adm.DescribeTopicConfigs(ctx, topic); err == nil {
		compression, _ = value(rcs, "compression.type")
		if n, ok := parse(rcs, "max.message.bytes"); ok {
			return n, compression
		}
	}
	// With no broker ids, DescribeBrokerConfigs returns only dynamic
	// cluster-wide configs; ask one broker for its effective value.
	var ids []int32
	if md, err := adm.BrokerMetadata(ctx); err == nil {
		for _, b := range md.Brokers {
			ids = append(ids, b.NodeID)
		}
	}
	if rcs, err := adm.DescribeBrokerConfigs(ctx, ids...); len(ids) > 0 && err == nil {
		if c, ok := value(rcs, "compression.type"); ok && compression == "" {
			compression = c
		}
		if n, ok := parse(rcs, "message.max.bytes"); ok {
			return n, compression
		}
	}
	slog.Warn("could not read max.message.bytes; assuming Kafka's default", "topic", topic, "bytes", DefaultMaxMessageBytes)
	return DefaultMaxMessageBytes, compression
}

// clientBatchMax is franz-go's uncompressed batch cap for topic.
func clientBatchMax(cl *kgo.Client, topic string) int64 {
	limit := int64(0)
	if fn, ok := cl.OptValue(kgo.ProducerBatchMaxBytesFn).(func(string) int32); ok && fn != nil {
		limit = int64(fn(topic))
	}
	if w, ok := cl.OptValue(kgo.BrokerMaxWriteBytes).(int32); ok && w > 0 {
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
// produced with the wrapped client as usual.
func (p *Producer) Prepare(ctx context.Context, rec *kgo.Record) (Offloaded, error) {
	return p.ser.Offload(ctx, rec, p.Limits(ctx, rec.Topic))
}

// ProduceSync prepares each record and produces them, waiting for the
// acknowledgements. A record that cannot be prepared is not produced, and
// its error comes back in the result; the others are produced.
func (p *Producer) ProduceSync(ctx context.Context, recs ...*kgo.Record) kgo.ProduceResults {
	// results[i] is recs[i]'s, as with kgo.Client.ProduceSync.
	results := make(kgo.ProduceResults, len(recs))
	var ready []int
	for i, r := range recs {
		results[i].Record = r
		l := p.Limits(ctx, r.Topic)
		if _, err := p.ser.Offload(ctx, r, l); err != nil {
			results[i].Err = err
			continue
		}
		if l.ClientBatchMaxBytes > l.MaxMessageBytes+clientBatchOverhead-BatchOverhead {
			// The client may fill a batch past max.message.bytes with
			// several records that each fit: send these one at a time.
			// (The limits are per topic, so a topic's records keep
			// their order.)
			results[i] = p.cl.ProduceSync(ctx, r)[0]
			continue
		}
		ready = append(ready, i)
	}
	batch := make([]*kgo.Record, len(ready))
	for j, i := range ready {
		batch[j] = recs[i]
	}
	for j, res := range p.cl.ProduceSync(ctx, batch...) {
		results[ready[j]] = res
	}
	return results
}

// ProduceValue serializes key and value with the key.serializers and
// value.serializers chains, then prepares and produces the record, waiting
// for the acknowledgement. Errors: a stage's, Prepare's, or the broker's.
func (p *Producer) ProduceValue(ctx context.Context, topic string, key, value any, headers ...kgo.RecordHeader) (*kgo.Record, error) {
	rec := &kgo.Record{Topic: topic, Headers: headers}
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
// preparation error or the broker's answer.
func (p *Producer) Produce(ctx context.Context, rec *kgo.Record, promise func(*kgo.Record, error)) {
	if _, err := p.Prepare(ctx, rec); err != nil {
		if promise != nil {
			promise(rec, err)
		}
		return
	}
	p.cl.Produce(ctx, rec, promise)
}

// Consumer wraps a franz-go client's fetches: references are resolved in
// the caller's goroutine, with the caller's context, not on the fetch
// goroutine.
type Consumer struct {
	cl             *kgo.Client
	de             *Deserializer
	keyDe, valueDe *serde.Chain
}

// NewConsumer returns a Consumer over cl that resolves references with de.
func NewConsumer(cl *kgo.Client, de *Deserializer) *Consumer {
	d := DefaultConfig()
	return &Consumer{cl: cl, de: de, keyDe: d.KeyDeserializers, valueDe: d.ValueDeserializers}
}

// WithDeserializers sets the key.deserializers and value.deserializers
// chains Decode runs (nil keeps the current one) and returns c.
func (c *Consumer) WithDeserializers(key, value *serde.Chain) *Consumer {
	if key != nil {
		c.keyDe = key
	}
	if value != nil {
		c.valueDe = value
	}
	return c
}

// Decode runs a resolved record's key and value through the deserializer
// chains and returns the application's values. A record with Err set is
// not decoded: its Err comes back.
func (c *Consumer) Decode(ctx context.Context, r Record) (key, value any, err error) {
	if r.Err != nil {
		return nil, nil, r.Err
	}
	if key, err = c.keyDe.Deserialize(ctx, r.Topic, r.Key); err != nil {
		return nil, nil, fmt.Errorf("topic %s partition %d offset %d: key.deserializers %s: %w", r.Topic, r.Partition, r.Offset, c.keyDe, err)
	}
	if value, err = c.valueDe.Deserialize(ctx, r.Topic, r.Value); err != nil {
		return nil, nil, fmt.Errorf("topic %s partition %d offset %d: value.deserializers %s: %w", r.Topic, r.Partition, r.Offset, c.valueDe, err)
	}
	return key, value, nil
}

// Deserializer returns the consumer's deserializer.
func (c *Consumer) Deserializer() *Deserializer { return c.de }

// Record is a fetched record after resolution. Err is nil, or the
// *RecordError that kept it from resolving (then Record still holds the
// reference as fetched, unless Err.Skipped).
type Record struct {
	*kgo.Record
	Err error
}

// PollRecords polls up to max records (max <= 0: all buffered) and resolves
// them. The error is the fetch's: the first non-retryable fetch error, or
// ctx's error; a record's own resolution error is in its Record.Err.
func (c *Consumer) PollRecords(ctx context.Context, max int) ([]Record, error) {
	fs := c.cl.PollRecords(ctx, max)
	var errs []error
	fs.EachError(func(t string, p int32, err error) {
		errs = append(errs, fmt.Errorf("fetch topic %s partition %d: %w", t, p, err))
	})
	out := c.Resolve(ctx, fs.Records())
	return out, errors.Join(errs...)
}

// Resolve resolves records already fetched.
func (c *Consumer) Resolve(ctx context.Context, recs []*kgo.Record) []Record {
	out := make([]Record, len(recs))
	for i, r := range recs {
		out[i] = Record{Record: r, Err: c.de.Resolve(ctx, r)}
	}
	return out
}
