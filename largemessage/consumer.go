package largemessage

import (
	"context"
	"errors"
	"fmt"
	"github.com/ferrykit/ferry/observe"
	"slices"

	"github.com/ferrykit/ferry/serde"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Consumer wraps a franz-go client's fetches: references are resolved in
// the caller's goroutine, with the caller's context, not on the fetch
// goroutine.
type Consumer struct {
	cl             *kgo.Client
	de             *Deserializer
	keyDe, valueDe *serde.Chain
	tr             *observe.Tracer // nil: not traced
	pollMax        int64           // large.message.consumer.poll.max.bytes
	held           []*kgo.Record   // fetched, not yet returned (unresolved)
}

// DefaultPollMaxBytes is the default of large.message.consumer.poll.max.bytes:
// 52428800 (50 MiB), the default of Kafka's fetch.max.bytes.
const DefaultPollMaxBytes = 50 << 20

// WithPollMaxBytes sets large.message.consumer.poll.max.bytes (default
// DefaultPollMaxBytes): the most resolved key and value bytes one
// PollRecords returns. Kafka's fetch.max.bytes counts the records as the
// broker holds them, where an offloaded value is a reference of a few
// hundred bytes, so without this bound one poll of 50 records of 8 MiB
// payloads would hold 400 MiB. The first record of a poll is returned
// whatever its size (as Kafka returns a first batch larger than
// fetch.max.bytes), so a consumer always progresses. n <= 0 keeps the
// current bound. It returns c.
func (c *Consumer) WithPollMaxBytes(n int64) *Consumer {
	if n > 0 {
		c.pollMax = n
	}
	return c
}

// WithTracer traces the resolution of each record that carries a
// reference or a trace context (a "process <topic>" span, kind consumer,
// with Kafka's messaging attributes, linked to the producer's span named
// by the record's traceparent header); with a store wrapped by
// observe.Store with the same tracer, the object's download is a child
// span. nil turns tracing off. It returns c.
func (c *Consumer) WithTracer(t *observe.Tracer) *Consumer {
	c.tr = t
	return c
}

// NewConsumer returns a Consumer over cl that resolves references with de.
func NewConsumer(cl *kgo.Client, de *Deserializer) *Consumer {
	d := DefaultConfig()
	return &Consumer{cl: cl, de: de, keyDe: d.KeyDeserializers, valueDe: d.ValueDeserializers, pollMax: DefaultPollMaxBytes}
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

// PollRecords returns up to max records (max <= 0: all buffered), resolved,
// whose resolved key and value bytes together stay within
// large.message.consumer.poll.max.bytes (WithPollMaxBytes; the first record
// is returned whatever its size). A record's resolved size comes from its
// size headers, without I/O, or for a reference without them (a KIP-only
// producer) from the store's object size. Records the client fetched beyond
// the bound are held, unresolved (only their references are in memory), and
// the next PollRecords returns them first, in order, before it polls the
// client again.
//
// Offsets: franz-go counts a record as consumed when the client's poll
// returns it, so with its default autocommit a held record's offset can be
// committed before PollRecords has returned the record; a crash then skips
// it. Commit what the application has processed instead: kgo.AutoCommitMarks
// with cl.MarkCommitRecords on the records PollRecords returned, or
// kgo.DisableAutoCommit with cl.CommitRecords. Held records of a partition
// revoked by a rebalance are still returned by the next poll (the new owner
// reads them too: at-least-once); franz-go keeps no offsets of a partition
// the member no longer owns, so marking them commits nothing.
//
// The error is the fetch's: the first non-retryable fetch error, or ctx's
// error; a record's own resolution error is in its Record.Err.
func (c *Consumer) PollRecords(ctx context.Context, max int) ([]Record, error) {
	var errs []error
	if len(c.held) == 0 {
		fs := c.cl.PollRecords(ctx, max)
		fs.EachError(func(t string, p int32, err error) {
			errs = append(errs, fmt.Errorf("fetch topic %s partition %d: %w", t, p, err))
		})
		c.held = fs.Records()
	}
	n := takeWithin(c.held, max, c.pollMax, func(r *kgo.Record) int64 { return c.resolvedSize(ctx, r) })
	// The records returned are resolved in place: the held array must not
	// keep them (and their payloads) reachable after the caller drops them.
	recs := slices.Clone(c.held[:n])
	clear(c.held[:n])
	if c.held = c.held[n:]; len(c.held) == 0 {
		c.held = nil
	}
	out := c.Resolve(ctx, recs)
	return out, errors.Join(errs...)
}

// Held returns how many fetched records PollRecords holds for its next call
// because they did not fit in the last one's byte bound.
func (c *Consumer) Held() int { return len(c.held) }

// takeWithin returns how many of recs, from the first, fit in limit bytes by
// size, and at most max (max <= 0: no count limit); at least one when recs
// is not empty.
func takeWithin(recs []*kgo.Record, max int, limit int64, size func(*kgo.Record) int64) int {
	var used int64
	n := 0
	for n < len(recs) && (max <= 0 || n < max) {
		sz := size(recs[n])
		if n > 0 && used+sz > limit {
			break
		}
		used += sz
		n++
	}
	return n
}

// resolvedSize is r's key and value length once resolved: from the size
// headers, or the stored objects' sizes for references without them. When
// neither is known (the store cannot say) the reference's own length
// counts, and resolution reports the error.
func (c *Consumer) resolvedSize(ctx context.Context, r *kgo.Record) int64 {
	n := int64(len(r.Key) + len(r.Value))
	if c.de.keepValue && (c.de.keepKey || !IsKeyOffloaded(r)) {
		return n // nothing of r is resolved (WithDeserializers)
	}
	if g, ok := ResolvedGrowth(r); ok {
		return n + g
	}
	if sz, err := PayloadSizes(ctx, c.de.store, r); err == nil {
		return n + sz
	}
	return n
}

// Resolve resolves records already fetched.
func (c *Consumer) Resolve(ctx context.Context, recs []*kgo.Record) []Record {
	out := make([]Record, len(recs))
	for i, r := range recs {
		if c.tr != nil && (IsOffloaded(r) || IsKeyOffloaded(r) || c.tr.Extract(r.Headers).IsValid()) {
			sctx, span := c.tr.StartReceive(ctx, "process", r.Topic, r.Partition, r.Offset, r.Headers)
			err := c.de.Resolve(sctx, r)
			observe.End(span, err)
			out[i] = Record{Record: r, Err: err}
			continue
		}
		out[i] = Record{Record: r, Err: c.de.Resolve(ctx, r)}
	}
	return out
}
