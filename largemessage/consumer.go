package largemessage

import (
	"context"
	"errors"
	"fmt"
	"github.com/ferrykit/ferry/observe"

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
