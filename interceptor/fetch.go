package interceptor

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// FetchPartitionResult is a partition whose records an interceptor could
// not process.
type FetchPartitionResult struct {
	Topic     string
	TopicID   [16]byte
	Partition int32
	// ErrorCode is the code set on the partition (0 when Partial).
	ErrorCode int16
	// Partial: the batches before the failing one were kept (rewritten)
	// and the rest dropped, with no error code; the consumer's next fetch
	// starts at the failing batch and gets the error then.
	Partial bool
	Err     error
}

// FetchOutcome is what InterceptFetch did to a response.
type FetchOutcome struct {
	// Failed are the partitions with an error, for logs and metrics.
	Failed []FetchPartitionResult
	// Rewritten counts the partitions whose record batches were re-encoded
	// or cut to the fetch limits.
	Rewritten int
	// Truncated counts the partitions whose trailing batches were left
	// out to keep the response within the FetchLimits.
	Truncated int
}

// FetchPartition names a partition of a fetch: by topic name (Fetch v0-v12)
// or topic id (v13+), as the request and response do.
type FetchPartition struct {
	Topic     string
	TopicID   [16]byte
	Partition int32
}

// FetchLimits are the consumer's limits from its Fetch request (KIP-74):
// the record bytes of the whole response (max_bytes, fetch.max.bytes) and
// of each partition (partition_max_bytes, max.partition.fetch.bytes). Zero
// or absent means no limit.
type FetchLimits struct {
	MaxBytes          int32
	PartitionMaxBytes map[FetchPartition]int32
}

// FetchLimitsOf reads the limits of a Fetch request.
func FetchLimitsOf(req *kmsg.FetchRequest) FetchLimits {
	l := FetchLimits{MaxBytes: req.MaxBytes, PartitionMaxBytes: map[FetchPartition]int32{}}
	for _, t := range req.Topics {
		for _, p := range t.Partitions {
			l.PartitionMaxBytes[FetchPartition{t.Topic, t.TopicID, p.Partition}] = p.PartitionMaxBytes
		}
	}
	return l
}

// InterceptFetch runs the chain's fetch interceptors over resp, in place.
//
// Only partitions of matching topics are decoded; a batch whose records
// are unchanged keeps its bytes. A changed batch is re-encoded with the same
// codec, offsets kept: each record keeps its offset delta, the batch its
// first offset, last offset delta, timestamps, producer id/epoch, base
// sequence and attributes; CRC-32C and lengths are recomputed. A skipped
// record is left out (the batch's record count drops; consumers handle the
// gap as they do for compacted topics; a batch may become empty and still
// advances the consumer's offset). Control batches and a partial batch at
// the end of the record set pass untouched.
//
// Errors: when the first batch of a partition fails (an interceptor error,
// a call over the time budget, a v0/v1 message set, a corrupt batch), the
// partition's record set is dropped and its error code set to the
// *kerr.Error the interceptor's error wraps, else KAFKA_STORAGE_ERROR,
// which consumers (Java, librdkafka, franz-go) treat as retriable: they
// refresh metadata and fetch the same offset again. When a later batch
// fails, the batches before it are returned without error (Partial). An
// interceptor that wants consumers to go past a record returns
// ErrSkipRecord rather than an error. Fetch responses carry no error
// message: the proxy logs FetchOutcome.Failed.
func (c *Chain) InterceptFetch(ctx context.Context, resp *kmsg.FetchResponse) FetchOutcome {
	return c.InterceptFetchLimited(ctx, resp, FetchLimits{})
}

// InterceptFetchLimited is InterceptFetch keeping the response within the
// consumer's limits, as the broker does (KIP-74): rewritten records may be
// far larger than the broker's (large-message replaces references by their
// payloads), so after rewriting, the batches that would take the response
// over limits.MaxBytes, or their partition over its partition max bytes,
// are left out, with every later batch of that partition; the consumer
// fetches them next time. The first batch of the response is always kept
// (the consumer could never make progress otherwise). A partition left
// without batches keeps its high watermark and no error.
func (c *Chain) InterceptFetchLimited(ctx context.Context, resp *kmsg.FetchResponse, limits FetchLimits) FetchOutcome {
	var out FetchOutcome
	if len(c.fetch) == 0 {
		return out
	}
	var used int64 // record bytes of the response so far
	limitFor := func(t *kmsg.FetchResponseTopic, partition int32) int64 {
		lim := int64(-1)
		if limits.MaxBytes > 0 {
			lim = max(int64(limits.MaxBytes)-used, 0)
		}
		if pm := limits.PartitionMaxBytes[FetchPartition{t.Topic, t.TopicID, partition}]; pm > 0 && (lim < 0 || int64(pm) < lim) {
			lim = int64(pm)
		}
		return lim
	}
	for ti := range resp.Topics {
		t := &resp.Topics[ti]
		name, ok := c.topicName(t.Topic, t.TopicID)
		var ps []proc
		if ok {
			ps = c.fetchProcs(name)
		}
		for pi := range t.Partitions {
			p := &t.Partitions[pi]
			if len(ps) == 0 || p.ErrorCode != 0 || len(p.RecordBatches) == 0 {
				// Not rewritten: within the broker's bounds on its own, but
				// not after earlier partitions grew.
				if lim := limitFor(t, p.Partition); lim >= 0 && used > 0 && int64(len(p.RecordBatches)) > lim {
					p.RecordBatches = []byte{} // empty, not null: librdkafka cannot parse a null record set (size -1)
					out.Truncated++
					out.Rewritten++
				}
				used += int64(len(p.RecordBatches))
				continue
			}
			limit, firstOK := limitFor(t, p.Partition), used == 0
			type res struct {
				b       []byte
				changed bool
				cut     bool
				failAt  int
				err     error
				code    int16
			}
			// The worker must not read p: it may outlive the budget.
			set, part, aborted := p.RecordBatches, p.Partition, slices.Clone(p.AbortedTransactions)
			v, f := c.run(ctx, func(ctx context.Context, w *watch) (any, *failure) {
				b, changed, cut, failAt, code, err := c.fetchPartition(ctx, w, name, part, set, aborted, ps, limit, firstOK)
				return res{b, changed, cut, failAt, err, code}, nil
			})
			if f != nil {
				p.ErrorCode = kerr.KafkaStorageError.Code
				p.RecordBatches = []byte{} // empty, not null: librdkafka cannot parse a null record set (size -1)
				out.Failed = append(out.Failed, FetchPartitionResult{Topic: t.Topic, TopicID: t.TopicID, Partition: p.Partition,
					ErrorCode: p.ErrorCode, Err: fmt.Errorf("topic %s partition %d: %s", name, p.Partition, f.msg)})
				continue
			}
			r := v.(res)
			if r.err != nil {
				fr := FetchPartitionResult{Topic: t.Topic, TopicID: t.TopicID, Partition: p.Partition,
					Err: fmt.Errorf("topic %s partition %d: %w", name, p.Partition, r.err)}
				if r.failAt == 0 {
					p.ErrorCode = r.code
					p.RecordBatches = []byte{} // empty, not null: librdkafka cannot parse a null record set (size -1)
					fr.ErrorCode = r.code
				} else {
					p.RecordBatches = r.b
					fr.Partial = true
				}
				used += int64(len(p.RecordBatches))
				out.Failed = append(out.Failed, fr)
				continue
			}
			if r.changed {
				p.RecordBatches = r.b
				out.Rewritten++
				if r.cut {
					out.Truncated++
				}
			}
			used += int64(len(p.RecordBatches))
		}
	}
	return out
}

// fetchPartition rewrites a partition's record set. On error, out holds
// the rewritten batches before the failing one, failAt its index. With
// limit >= 0 the rewritten set is cut before the first batch that would take
// it over limit bytes (cut reports it), unless that is its first batch and
// firstOK.
func (c *Chain) fetchPartition(ctx context.Context, w *watch, topic string, partition int32, set []byte,
	aborted []kmsg.FetchResponseTopicPartitionAbortedTransaction, ps []proc, limit int64, firstOK bool) (out []byte, changed, cut bool, failAt int, code int16, err error) {
	sort.Slice(aborted, func(i, j int) bool { return aborted[i].FirstOffset < aborted[j].FirstOffset })
	aborting := map[int64]bool{}
	fits := func(b []byte) bool {
		return limit < 0 || int64(len(out)+len(b)) <= limit || (firstOK && len(out) == 0)
	}
	rest := set
	for n := 0; len(rest) > 0; n++ {
		raw, next, complete := splitBatch(rest)
		if !complete {
			if fits(rest) {
				out = append(out, rest...) // a partial batch: consumers discard it
			} else {
				changed, cut = true, true
			}
			break
		}
		rest = next
		// Batches of aborted transactions (read_committed: the response
		// lists them) pass untouched, as consumers drop them: their
		// payloads may be gone (ferry gc keeps committed data only).
		if len(raw) >= batchHeaderLen && raw[magicOffset] == 2 {
			first := int64(binary.BigEndian.Uint64(raw))
			last := first + int64(int32(binary.BigEndian.Uint32(raw[23:])))
			pid := int64(binary.BigEndian.Uint64(raw[43:]))
			attrs := int16(binary.BigEndian.Uint16(raw[attrOffset:]))
			for len(aborted) > 0 && aborted[0].FirstOffset <= last {
				aborting[aborted[0].ProducerID] = true
				aborted = aborted[1:]
			}
			if attrs&attrTransactional != 0 && aborting[pid] {
				if attrs&attrControl != 0 {
					delete(aborting, pid) // the abort marker ends the transaction
				}
				if !fits(raw) {
					changed, cut = true, true
					break
				}
				out = append(out, raw...)
				continue
			}
		}
		if !fits(raw) {
			// Over the limits already as the broker sent it: not worth
			// rewriting (large-message would read payloads to drop them).
			changed, cut = true, true
			break
		}
		nb, err := c.fetchBatch(ctx, w, topic, partition, raw, ps)
		if err != nil {
			return out, true, false, n, codeOf(err, kerr.KafkaStorageError.Code), err
		}
		if !fits(nb) {
			changed, cut = true, true
			break
		}
		if len(nb) != len(raw) || &nb[0] != &raw[0] {
			changed = true
		}
		out = append(out, nb...)
	}
	if !changed {
		return set, false, false, 0, 0, nil
	}
	return out, true, cut, 0, 0, nil
}

func (c *Chain) fetchBatch(ctx context.Context, w *watch, topic string, partition int32, raw []byte, ps []proc) ([]byte, error) {
	d, err := decodeBatch(raw)
	if err != nil {
		var eb *errBatch
		if errors.As(err, &eb) || errors.Is(err, errMagic) {
			return nil, fmt.Errorf("batch at offset %d: %w", firstOffset(raw), err)
		}
		return nil, err
	}
	if d.hdr.Attributes&attrControl != 0 {
		return raw, nil
	}
	info := batchInfo(&d.hdr, 0)
	dirty := false
	keep := d.recs[:0:0]
	for i := range d.recs {
		kr := &d.recs[i]
		r := toRecord(topic, partition, &d.hdr, info, kr, i, true)
		skip := false
		for _, p := range ps {
			err := c.call(ctx, w, p, i, &r)
			if err == nil {
				continue
			}
			if errors.Is(err, ErrSkipRecord) {
				skip = true
				break
			}
			return nil, fmt.Errorf("interceptor %s failed the record at offset %d: %w", p.name, r.Offset, err)
		}
		if skip {
			dirty = true
			continue
		}
		if apply(&r, kr) {
			dirty = true
		}
		keep = append(keep, *kr)
	}
	if !dirty {
		return raw, nil
	}
	d.recs = keep
	return d.encode()
}

func firstOffset(raw []byte) int64 {
	var h kmsg.RecordBatch
	_ = h.ReadFrom(raw)
	return h.FirstOffset
}
