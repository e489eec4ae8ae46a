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
	// Rewritten counts the partitions whose record batches were re-encoded.
	Rewritten int
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
	var out FetchOutcome
	if len(c.fetch) == 0 {
		return out
	}
	for ti := range resp.Topics {
		t := &resp.Topics[ti]
		name, ok := c.topicName(t.Topic, t.TopicID)
		if !ok {
			continue
		}
		ps := c.fetchProcs(name)
		if len(ps) == 0 {
			continue
		}
		for pi := range t.Partitions {
			p := &t.Partitions[pi]
			if p.ErrorCode != 0 || len(p.RecordBatches) == 0 {
				continue
			}
			type res struct {
				b       []byte
				changed bool
				failAt  int
				err     error
				code    int16
			}
			// The worker must not read p: it may outlive the budget.
			set, part, aborted := p.RecordBatches, p.Partition, slices.Clone(p.AbortedTransactions)
			v, f := c.run(ctx, func(ctx context.Context, w *watch) (any, *failure) {
				b, changed, failAt, code, err := c.fetchPartition(ctx, w, name, part, set, aborted, ps)
				return res{b, changed, failAt, err, code}, nil
			})
			if f != nil {
				p.ErrorCode = kerr.KafkaStorageError.Code
				p.RecordBatches = nil
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
					p.RecordBatches = nil
					fr.ErrorCode = r.code
				} else {
					p.RecordBatches = r.b
					fr.Partial = true
				}
				out.Failed = append(out.Failed, fr)
				continue
			}
			if r.changed {
				p.RecordBatches = r.b
				out.Rewritten++
			}
		}
	}
	return out
}

// fetchPartition rewrites a partition's record set. On error, out holds
// the rewritten batches before the failing one, failAt its index.
func (c *Chain) fetchPartition(ctx context.Context, w *watch, topic string, partition int32, set []byte,
	aborted []kmsg.FetchResponseTopicPartitionAbortedTransaction, ps []proc) (out []byte, changed bool, failAt int, code int16, err error) {
	sort.Slice(aborted, func(i, j int) bool { return aborted[i].FirstOffset < aborted[j].FirstOffset })
	aborting := map[int64]bool{}
	rest := set
	for n := 0; len(rest) > 0; n++ {
		raw, next, complete := splitBatch(rest)
		if !complete {
			out = append(out, rest...) // a partial batch: consumers discard it
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
				out = append(out, raw...)
				continue
			}
		}
		nb, err := c.fetchBatch(ctx, w, topic, partition, raw, ps)
		if err != nil {
			return out, true, n, codeOf(err, kerr.KafkaStorageError.Code), err
		}
		if len(nb) != len(raw) || &nb[0] != &raw[0] {
			changed = true
		}
		out = append(out, nb...)
	}
	if !changed {
		return set, false, 0, 0, nil
	}
	return out, true, 0, 0, nil
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
