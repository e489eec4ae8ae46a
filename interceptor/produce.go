package interceptor

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ProducePartitionResult is a partition the proxy must answer itself: it was
// removed from the request by InterceptProduce.
type ProducePartitionResult struct {
	Topic     string
	TopicID   [16]byte // set for produce requests v13+
	Partition int32
	// ErrorCode is the Kafka error code to answer with; 0 means every record
	// was skipped: answer success with base offset -1 (nothing appended).
	ErrorCode int16
	// ErrorMessage is the partition's error_message (ProduceResponse v8+).
	ErrorMessage string
	// RecordErrors are the record_errors (ProduceResponse v8+): the index
	// of each failed record in its batch (batch_index) with a message.
	RecordErrors []kmsg.ProduceResponseTopicPartitionErrorRecord
	// Err is the underlying error, for logs and metrics.
	Err error
}

// ProduceOutcome is what InterceptProduce did to a request.
type ProduceOutcome struct {
	// Answered are the partitions removed from the request, which the proxy
	// answers with Merge or Response.
	Answered []ProducePartitionResult
	// Forward is false when no partition is left in the request: the proxy
	// must not forward it, and answers with Response (unless acks=0, when
	// nothing is answered at all).
	Forward bool
	// Rewritten counts the partitions whose record batches were re-encoded.
	Rewritten int
}

// InterceptProduce runs the chain's produce interceptors over req, in place.
//
// Only partitions of topics some interceptor matches are decoded; the
// others keep their exact bytes. A matching partition's batches are
// rewritten when a record changed (lengths, CRC-32C, offset deltas and
// record count recomputed; same codec; attributes, producer id/epoch and
// base sequence kept) and otherwise keep their bytes. A partition that
// fails, or whose records were all skipped, is removed from req and
// reported in the outcome. limits gives a topic's max.message.bytes (ok
// false when unknown: no size check, the broker's own check applies);
// every batch of a matching topic is checked against it, exactly:
// over is MESSAGE_TOO_LARGE, after the BatchShrinker interceptors (large-
// message) had their chance.
//
// Error codes: a v0/v1 message set UNSUPPORTED_FOR_MESSAGE_FORMAT; a
// malformed batch or bad CRC CORRUPT_MESSAGE; an interceptor's error the
// *kerr.Error it wraps, else INVALID_RECORD with record_errors; a skip in a
// batch with a producer id INVALID_RECORD; a call over the time budget
// REQUEST_TIMED_OUT.
//
// The proxy's contract: call InterceptProduce on the decoded request; if
// Forward, encode and forward req and, on the broker's response, call
// Merge before answering the client; if not Forward, answer with
// Response(req) without contacting the broker. With acks=0 neither
// answer is sent (the producer expects none). The request's buffer must stay
// unchanged until InterceptProduce returns: timed-out calls that are still
// running only read it and their results are discarded.
// maxParallelPartitions bounds how many partitions of one produce request
// are intercepted at once.
const maxParallelPartitions = 8

func (c *Chain) InterceptProduce(ctx context.Context, req *kmsg.ProduceRequest, limits func(topic string) (maxMessageBytes int32, ok bool)) ProduceOutcome {
	var out ProduceOutcome
	if len(c.produce) == 0 {
		out.Forward = len(req.Topics) > 0
		return out
	}
	// Partitions are processed concurrently (at most maxParallelPartitions
	// at a time), each within its own time budget: a request of many
	// partitions takes about one budget, not one per partition. Found by
	// review.
	type result struct {
		v any
		f *failure
	}
	names := make([]string, len(req.Topics))
	results := make([][]result, len(req.Topics))
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxParallelPartitions)
	for ti, t := range req.Topics {
		name, ok := c.topicName(t.Topic, t.TopicID)
		var ps []proc
		var shrinkers []BatchShrinker
		if ok {
			ps, shrinkers = c.produceProcs(name)
		}
		if len(ps) == 0 {
			continue
		}
		names[ti] = name
		var maxBytes int32
		if limits != nil {
			if m, ok := limits(name); ok && m > 0 {
				maxBytes = m
			}
		}
		results[ti] = make([]result, len(t.Partitions))
		for pi, p := range t.Partitions {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				v, f := c.run(ctx, func(ctx context.Context, w *watch) (any, *failure) {
					return c.producePartition(ctx, w, name, p.Partition, p.Records, ps, shrinkers, maxBytes)
				})
				results[ti][pi] = result{v, f}
			}()
		}
	}
	wg.Wait()
	topics := req.Topics[:0]
	for ti, t := range req.Topics {
		if results[ti] == nil {
			topics = append(topics, t)
			continue
		}
		parts := t.Partitions[:0]
		for pi, p := range t.Partitions {
			v, f := results[ti][pi].v, results[ti][pi].f
			if f != nil {
				out.Answered = append(out.Answered, ProducePartitionResult{Topic: t.Topic, TopicID: t.TopicID,
					Partition: p.Partition, ErrorCode: f.code, ErrorMessage: f.msg, RecordErrors: f.records, Err: f.err})
				continue
			}
			if nb := v.([]byte); len(nb) != len(p.Records) || len(nb) > 0 && &nb[0] != &p.Records[0] {
				p.Records = nb
				out.Rewritten++
			}
			parts = append(parts, p)
		}
		if len(parts) > 0 {
			t.Partitions = parts
			topics = append(topics, t)
		}
	}
	req.Topics = topics
	out.Forward = len(topics) > 0
	return out
}

// producePartition rewrites one partition's records; the returned slice is
// records itself when nothing changed.
func (c *Chain) producePartition(ctx context.Context, w *watch, topic string, partition int32, records []byte,
	ps []proc, shrinkers []BatchShrinker, maxBytes int32) (any, *failure) {
	where := fmt.Sprintf("topic %s partition %d", topic, partition)
	var out []byte
	changed := false
	rest := records
	for len(rest) > 0 {
		raw, next, complete := splitBatch(rest)
		if !complete {
			return nil, fail(kerr.CorruptMessage.Code, fmt.Errorf("%s: truncated record batch (%d bytes left)", where, len(rest)))
		}
		rest = next
		nb, f := c.produceBatch(ctx, w, topic, partition, raw, ps, shrinkers, maxBytes)
		if f != nil {
			f.msg = where + ": " + f.msg
			return nil, f
		}
		if len(nb) != len(raw) || len(nb) > 0 && &nb[0] != &raw[0] {
			changed = true
		}
		out = append(out, nb...)
	}
	if !changed {
		return records, nil
	}
	if len(out) == 0 {
		return nil, &failure{code: 0, msg: "every record was skipped by an interceptor"}
	}
	return out, nil
}

func batchFailure(err error) *failure {
	var eb *errBatch
	switch {
	case errors.Is(err, errMagic):
		return fail(kerr.UnsupportedForMessageFormat.Code, err)
	case errors.As(err, &eb):
		return fail(kerr.CorruptMessage.Code, err)
	}
	return fail(kerr.UnknownServerError.Code, err)
}

// produceBatch runs the interceptors over one batch. It returns raw when
// nothing changed, nil when every record was skipped.
func (c *Chain) produceBatch(ctx context.Context, w *watch, topic string, partition int32, raw []byte,
	ps []proc, shrinkers []BatchShrinker, maxBytes int32) ([]byte, *failure) {
	d, err := decodeBatch(raw)
	if err != nil {
		return nil, batchFailure(err)
	}
	if d.hdr.Attributes&attrControl != 0 {
		return raw, nil // control batches (transaction markers) pass untouched
	}
	info := batchInfo(&d.hdr, maxBytes)
	dirty, skipped := false, false
	keep := d.recs[:0:0]
	for i := range d.recs {
		kr := &d.recs[i]
		r := toRecord(topic, partition, &d.hdr, info, kr, i, false)
		skip := false
		for _, p := range ps {
			err := c.call(ctx, w, p, i, &r)
			if err == nil {
				continue
			}
			if errors.Is(err, ErrSkipRecord) {
				if d.hdr.ProducerID >= 0 {
					msg := fmt.Sprintf("interceptor %s skipped record %d, but the batch is idempotent or transactional (producer id %d): dropping a record would break its sequence numbers, so the batch is rejected", p.name, i, d.hdr.ProducerID)
					return nil, &failure{code: kerr.InvalidRecord.Code, msg: msg, err: fmt.Errorf("%s: %w", msg, err),
						records: []kmsg.ProduceResponseTopicPartitionErrorRecord{recordError(i, msg)}}
				}
				skip = true
				break
			}
			msg := fmt.Sprintf("interceptor %s failed record %d: %v", p.name, i, err)
			return nil, &failure{code: codeOf(err, kerr.InvalidRecord.Code), msg: msg, err: err,
				records: []kmsg.ProduceResponseTopicPartitionErrorRecord{recordError(i, msg)}}
		}
		if skip {
			skipped, dirty = true, true
			continue
		}
		if apply(&r, kr) {
			dirty = true
		}
		keep = append(keep, *kr)
	}
	if skipped {
		if len(keep) == 0 {
			return nil, nil
		}
		renumber(&d.hdr, keep)
	}
	d.recs = keep
	enc := raw
	if dirty {
		if enc, err = d.encode(); err != nil {
			return nil, fail(kerr.UnknownServerError.Code, err)
		}
	}
	if maxBytes > 0 && len(enc) > int(maxBytes) && len(shrinkers) > 0 {
		if enc, err = c.shrink(ctx, w, topic, partition, d, info, shrinkers, enc, maxBytes); err != nil {
			return nil, &failure{code: codeOf(err, kerr.InvalidRecord.Code), msg: err.Error(), err: err}
		}
	}
	if maxBytes > 0 && len(enc) > int(maxBytes) {
		err := fmt.Errorf("the record batch is %d bytes (%s, %d records) after interceptors, over the topic's max.message.bytes %d",
			len(enc), info.Compression, len(d.recs), maxBytes)
		return nil, fail(kerr.MessageTooLarge.Code, err)
	}
	return enc, nil
}

func recordError(i int, msg string) kmsg.ProduceResponseTopicPartitionErrorRecord {
	e := kmsg.NewProduceResponseTopicPartitionErrorRecord()
	e.RelativeOffset = int32(i)
	e.ErrorMessage = &msg
	return e
}

// renumber gives the kept records of a produce batch consecutive offset
// deltas from 0 and rebases timestamps on the first, as a producer would
// have built the batch without the skipped records.
func renumber(h *kmsg.RecordBatch, recs []kmsg.Record) {
	first := h.FirstTimestamp + recs[0].TimestampDelta64
	maxTs := first
	for i := range recs {
		ts := h.FirstTimestamp + recs[i].TimestampDelta64
		maxTs = max(maxTs, ts)
		recs[i].TimestampDelta64 = ts - first
		recs[i].TimestampDelta = int32(ts - first)
		recs[i].OffsetDelta = int32(i)
	}
	h.FirstTimestamp, h.MaxTimestamp = first, maxTs
	h.LastOffsetDelta = int32(len(recs) - 1)
}

// shrink asks the shrinkers to make records smaller, largest first, until
// the batch fits maxBytes or no record shrinks; each step is measured
// exactly by encoding the batch.
func (c *Chain) shrink(ctx context.Context, w *watch, topic string, partition int32, d *decodedBatch, info BatchInfo,
	shrinkers []BatchShrinker, enc []byte, maxBytes int32) ([]byte, error) {
	idx := make([]int, len(d.recs))
	for i := range idx {
		idx[i] = i
	}
	bySize(d.recs, idx)
	next := 0
	for len(enc) > int(maxBytes) && next < len(idx) {
		over := len(enc) - int(maxBytes)
		freed := 0
		for next < len(idx) && freed < over {
			i := idx[next]
			next++
			kr := &d.recs[i]
			r := toRecord(topic, partition, &d.hdr, info, kr, i, false)
			before := len(r.Key) + len(r.Value)
			for _, s := range shrinkers {
				var did bool
				name := fmt.Sprintf("%T", s)
				if n, ok := s.(interface{ Name() string }); ok {
					name = n.Name()
				}
				err := c.call(ctx, w, proc{name: name, call: func(ctx context.Context, r *Record) error {
					var err error
					did, err = s.Shrink(ctx, r)
					return err
				}}, i, &r)
				if err != nil {
					return nil, fmt.Errorf("making record %d smaller to fit max.message.bytes %d: %w", i, maxBytes, err)
				}
				if did {
					break
				}
			}
			if apply(&r, kr) {
				freed += before - len(r.Key) - len(r.Value)
			}
		}
		if freed == 0 {
			break // no record could be made smaller
		}
		var err error
		if enc, err = d.encode(); err != nil {
			return nil, err
		}
	}
	return enc, nil
}

// Merge adds the answered partitions to the broker's response to the
// forwarded request, so the producer gets an answer for every partition it
// sent. Error messages and record errors are set only for versions that
// carry them (v8+).
func (o ProduceOutcome) Merge(resp *kmsg.ProduceResponse) {
	for _, a := range o.Answered {
		var t *kmsg.ProduceResponseTopic
		for i := range resp.Topics {
			rt := &resp.Topics[i]
			if rt.Topic == a.Topic && rt.TopicID == a.TopicID {
				t = rt
				break
			}
		}
		if t == nil {
			nt := kmsg.NewProduceResponseTopic()
			nt.Topic, nt.TopicID = a.Topic, a.TopicID
			resp.Topics = append(resp.Topics, nt)
			t = &resp.Topics[len(resp.Topics)-1]
		}
		p := kmsg.NewProduceResponseTopicPartition()
		p.Partition = a.Partition
		p.ErrorCode = a.ErrorCode
		p.BaseOffset = -1
		p.LogAppendTime = -1
		p.LogStartOffset = -1
		if resp.Version >= 8 && a.ErrorCode != 0 {
			msg := a.ErrorMessage
			p.ErrorMessage = &msg
			p.ErrorRecords = a.RecordErrors
		}
		t.Partitions = append(t.Partitions, p)
	}
}

// Response is the whole answer to req when nothing was forwarded (Forward
// false): one partition result per answered partition, in req's version.
func (o ProduceOutcome) Response(req *kmsg.ProduceRequest) *kmsg.ProduceResponse {
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	resp.Version = req.Version
	o.Merge(resp)
	return resp
}
