package interceptor

import (
	"context"
	"errors"
	"fmt"
	"github.com/ferrykit/ferry/observe"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/largemessage"
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

	// committed is the deferred work done for each forwarded partition,
	// undone by Refused when the broker refuses the partition for good.
	committed map[FetchPartition][]Deferred
	// led holds the memory of the rewritten batches until Release.
	led *ledger
}

// WithSlowRequest returns ctx carrying slow, for a request the proxy does
// not watch while it is intercepted (Chain.QuickProduce): when
// InterceptProduce, running such a request's partitions one after the other
// (serialMaxBytes), finds them slow (serialMaxTime has passed: a KMS that
// does not answer, a call cut at its budget), or does not run them so (a
// compressed batch), it calls slow once, and intercepts the partitions left
// under the context slow returns (the proxy's watch of the client's
// socket: a client gone away then stops them at once instead of leaving
// each its budget). slow is called on the caller's goroutine, or on the
// chain's watchdog for a call that has run serialMaxTime (at most
// budget/8 later): the call in progress then ends with that context too.
// Either way it has returned before InterceptProduce does.
func WithSlowRequest(ctx context.Context, slow func(context.Context) context.Context) context.Context {
	return context.WithValue(ctx, slowKey{}, slow)
}

type slowKey struct{}

// slowRequest is a request's WithSlowRequest hook, called at most once:
// between partitions by the request's goroutine (InterceptProduce), or by
// the chain's inline watchdog for a call in progress (runInline: the
// watch's context then cancels that call too).
type slowRequest struct {
	parent context.Context
	hook   func(context.Context) context.Context
	once   sync.Once
	ctx    context.Context
}

// slowRunKey carries the *slowRequest of a request run serially to
// runInline.
type slowRunKey struct{}

// newSlowRequest returns ctx's hook, nil when it has none.
func newSlowRequest(ctx context.Context) *slowRequest {
	if hook, ok := ctx.Value(slowKey{}).(func(context.Context) context.Context); ok {
		return &slowRequest{parent: ctx, hook: hook}
	}
	return nil
}

// start calls the hook once and returns the context it returned.
func (s *slowRequest) start() context.Context {
	s.once.Do(func() { s.ctx = s.hook(s.parent) })
	return s.ctx
}

// maxParallelPartitions bounds how many partitions of one produce request
// are intercepted at once.
const maxParallelPartitions = 8

// A request whose partitions are all run inline (runPart), uncompressed
// (compressed), and hold at most serialMaxBytes of records together is
// intercepted one partition after
// the other on the request's goroutine: sealing, opening or validating
// them takes well under a millisecond each, less than handing each to a
// partition worker and waking the request's goroutine when it is done
// (22 % of `encrypt`'s CPU on the perf producer's requests of three 16 KiB
// batches: BenchmarkEncryptSmallBatches/produce3, cpu-ns/op). Once the
// partitions run so far have taken serialMaxTime (a KMS call on a data
// key's rotation, a slow call cut at its budget), the rest are run
// concurrently as for a large request: a request of n partitions whose
// calls all run over takes 1 + ⌈(n−1)/maxParallelPartitions⌉ budgets, one
// more than side by side from the start, not n.
const (
	serialMaxBytes = 1 << 20
	serialMaxTime  = 5 * time.Millisecond
)

// compressed reports whether records, a partition's record set, starts
// with a compressed batch: decompressing and compressing it again takes
// several times what handing it to a partition worker costs, so such
// partitions run side by side (serialMaxBytes).
func compressed(records []byte) bool {
	return len(records) > attrOffset+1 && records[magicOffset] == 2 && records[attrOffset+1]&attrCodecMask != 0
}

// InterceptProduce runs the chain's produce interceptors over req, in place.
//
// Only partitions of topics some interceptor matches are decoded; the
// others keep their exact bytes. A matching partition's batches are
// rewritten when a record changed (lengths, CRC-32C, offset deltas and
// record count recomputed; same codec; attributes, producer id/epoch and
// base sequence kept) and otherwise keep their bytes. A partition that
// fails, or whose records were all skipped, is removed from req and
// reported in the outcome. limits gives the max.message.bytes of the
// matching topics, asked for all at once with ctx (a topic missing from
// the answer, or 0: unknown; no size check, the broker's own check
// applies; it should return soon after ctx ends, leaving out what it has
// not learnt by then); every
// batch of a matching topic is checked against it, exactly: over is
// MESSAGE_TOO_LARGE, after the BatchShrinker interceptors (large-message)
// had their chance. The interceptors' deferred work (large-message's
// publishing) is committed only for partitions whose every batch fits, so a
// refused partition leaves nothing behind.
//
// A topic named by id (Produce v13+) that the chain cannot name is refused
// with UNKNOWN_TOPIC_ID: records are never forwarded uninspected when an
// interceptor could match them.
//
// Error codes: a v0/v1 message set UNSUPPORTED_FOR_MESSAGE_FORMAT; a
// malformed batch or bad CRC CORRUPT_MESSAGE; a batch or request that
// decompresses past its bound MESSAGE_TOO_LARGE; the memory budget busy
// for the whole time budget REQUEST_TIMED_OUT; an interceptor's error the
// *kerr.Error it wraps, else INVALID_RECORD with record_errors; a skip in a
// batch with a producer id INVALID_RECORD; a call over the time budget
// REQUEST_TIMED_OUT.
//
// The proxy's contract: call InterceptProduce on the decoded request; if
// Forward, encode and forward req and, on the broker's response, call
// Merge (and Refused for partitions it failed) before answering the client;
// if not Forward, answer with Response(req) without contacting the broker.
// With acks=0 neither answer is sent (the producer expects none). Call
// Release once the request is encoded. The request's buffer must stay
// unchanged until InterceptProduce returns: timed-out calls that are still
// running only read it and their results are discarded.
func (c *Chain) InterceptProduce(ctx context.Context, req *kmsg.ProduceRequest, limits func(ctx context.Context, topics []string) map[string]TopicLimit) ProduceOutcome {
	out := ProduceOutcome{committed: map[FetchPartition][]Deferred{}, led: c.ledger(nil)}
	if len(c.produce) == 0 {
		out.Forward = len(req.Topics) > 0
		return out
	}
	keepLastPartitions(req)
	// The request's references share one cache: an object many of its
	// records reference is verified and touched once (break review 2:
	// 200 references to one 90 MiB object read it 200 times).
	ctx = largemessage.WithReferenceCache(ctx)
	type result struct {
		v *partitionResult
		f *failure
	}
	names := make([]string, len(req.Topics))
	procs := make([][]proc, len(req.Topics))
	shrinkers := make([][]BatchShrinker, len(req.Topics))
	unnamed := make([]bool, len(req.Topics))
	var matching []string
	for ti, t := range req.Topics {
		name, ok := c.topicName(t.Topic, t.TopicID)
		if !ok {
			unnamed[ti] = true
			continue
		}
		names[ti] = name
		procs[ti], shrinkers[ti] = c.produceProcs(name)
		if len(procs[ti]) > 0 && !slices.Contains(matching, name) {
			matching = append(matching, name)
		}
	}
	var lims map[string]TopicLimit
	if limits != nil && len(matching) > 0 {
		lims = limits(ctx, matching)
	}
	// Partitions are processed concurrently (at most maxParallelPartitions
	// at a time; small requests serially, serialMaxBytes), each within its
	// own time budget: a request of n partitions whose calls all run over
	// takes ⌈n/maxParallelPartitions⌉ budgets (one more for a small one),
	// not n.
	bnds := c.newBounds()
	results := make([][]result, len(req.Topics))
	var jobs []func(context.Context) // one per partition the interceptors see
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxParallelPartitions)
	serialBytes, serial := 0, true // see serialMaxBytes
	for ti, t := range req.Topics {
		if len(procs[ti]) == 0 {
			continue
		}
		name, ps, shr, lim := names[ti], procs[ti], shrinkers[ti], lims[names[ti]]
		results[ti] = make([]result, len(t.Partitions))
		if lim.Missing {
			err := fmt.Errorf("topic %s does not exist (the cluster says so); its records were not processed", name)
			for pi := range t.Partitions {
				results[ti][pi] = result{f: fail(kerr.UnknownTopicOrPartition.Code, err)}
			}
			continue
		}
		for pi, p := range t.Partitions {
			pp := &producePart{topic: name, partition: p.Partition, records: p.Records, ps: ps, shrinkers: shr, lim: lim,
				pooled: len(shr) == 0 && inlineOnly(ps)}
			serialBytes += len(p.Records)
			serial = serial && runsInline(ps, len(p.Records)) && !compressed(p.Records)
			jobs = append(jobs, func(ctx context.Context) {
				led := c.ledger(bnds)
				v, f := c.runPart(ctx, led, pp.ps, len(pp.records), func(ctx context.Context, w *watch) (any, *failure) {
					return c.producePartition(ctx, w, led, pp)
				})
				pr, _ := v.(*partitionResult)
				results[ti][pi] = result{pr, f}
			})
		}
	}
	// The last partition waits for its worker on this goroutine (a
	// producer's request usually holds one partition per topic it writes),
	// and so do all of a request small enough to be run serially.
	serial = serial && serialBytes <= serialMaxBytes
	slow := newSlowRequest(ctx)
	watch := func() {
		if slow != nil {
			ctx = slow.start()
		}
	}
	if !serial {
		watch()
	} else if slow != nil {
		// A call that has run serialMaxTime (the KMS of the request's
		// first partition does not answer) starts the watch from the
		// inline watchdog, without waiting for the call to end.
		ctx = context.WithValue(ctx, slowRunKey{}, slow)
	}
	start := time.Now()
	for k, job := range jobs {
		if serial && k > 0 && time.Since(start) >= serialMaxTime {
			serial = false
			watch()
		}
		sem <- struct{}{}
		if k == len(jobs)-1 || serial {
			job(ctx)
			<-sem
			continue
		}
		wg.Add(1)
		partitionWorkers.do(func() {
			defer wg.Done()
			defer func() { <-sem }()
			job(ctx)
		})
	}
	wg.Wait()
	topics := req.Topics[:0]
	for ti, t := range req.Topics {
		if unnamed[ti] {
			err := fmt.Errorf("the proxy cannot name topic id %x, so its records cannot be inspected by the interceptors; not forwarded", t.TopicID)
			for _, p := range t.Partitions {
				c.rejected("", observe.DirectionProduce, kerr.UnknownTopicID.Code)
				out.Answered = append(out.Answered, ProducePartitionResult{TopicID: t.TopicID, Partition: p.Partition,
					ErrorCode: kerr.UnknownTopicID.Code, ErrorMessage: err.Error(), Err: err})
			}
			continue
		}
		if results[ti] == nil {
			topics = append(topics, t)
			continue
		}
		parts := t.Partitions[:0]
		for pi, p := range t.Partitions {
			r := results[ti][pi]
			if r.f != nil {
				label := names[ti]
				if lims[label].Missing {
					label = "" // a made-up name takes no metric label
				}
				c.rejected(label, observe.DirectionProduce, r.f.code)
				out.Answered = append(out.Answered, ProducePartitionResult{Topic: t.Topic, TopicID: t.TopicID,
					Partition: p.Partition, ErrorCode: r.f.code, ErrorMessage: r.f.msg, RecordErrors: r.f.records, Err: r.f.err})
				continue
			}
			if r.v.changed {
				p.Records = r.v.records
				out.Rewritten++
			}
			if len(r.v.committed) > 0 {
				out.committed[FetchPartition{t.Topic, t.TopicID, p.Partition}] = r.v.committed
			}
			out.led.adopt(r.v.led)
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

// Release gives back the memory held for the rewritten batches; call it
// once the request is encoded: the rewritten record sets' bytes may be
// reused afterwards (encoded into pooled buffers).
func (o *ProduceOutcome) Release() { o.led.release() }

// HoldsRequest reports whether anything may still read the bytes of the
// request the outcome came from once it has been encoded again: an answered
// partition (merged into the response, or left to an interceptor call that
// ran over its time budget and may still be reading its records) or
// deferred work (an Abort may refer to its record). When false, the
// request's buffer may be reused as soon as the rewritten request is
// encoded.
func (o *ProduceOutcome) HoldsRequest() bool {
	return len(o.Answered) > 0 || len(o.committed) > 0
}

// partitionResult is a partition that passed the interceptors.
type partitionResult struct {
	records   []byte
	changed   bool
	committed []Deferred
	led       *ledger // holds the rewritten batches' memory
}

// TopicLimit is what the chain checks a produce batch of a topic against:
// its max.message.bytes (0: unknown, no check) and compression.type
// ("producer" or "": the broker keeps batches as sent; a codec or
// "uncompressed": it re-encodes the others, which can make them larger).
type TopicLimit struct {
	MaxMessageBytes int32
	Compression     string
	// Missing: the cluster said the topic does not exist. Its partitions
	// are answered UNKNOWN_TOPIC_OR_PARTITION, as the broker would answer
	// them, before any interceptor runs: a client cannot make the
	// interceptors do work (KMS calls, uploads) for topics it invents.
	Missing bool
}

func (l TopicLimit) over(stored int64) bool {
	return l.MaxMessageBytes > 0 && stored > int64(l.MaxMessageBytes)
}

func (l TopicLimit) compression() string {
	if l.Compression == "" {
		return "producer"
	}
	return l.Compression
}

// stored is an upper bound of bw as the broker stores it under lim (see
// largemessage.StoredBatchSize).
func (bw *batchWork) stored(lim TopicLimit) int64 {
	sent := int64(len(bw.enc))
	if lim.Compression == "" || lim.Compression == "producer" || bw.d == nil {
		return sent
	}
	u := bw.d.recordsLen // as read, when no record was materialized
	if bw.d.recs != nil {
		u = 0
		for i := range bw.d.recs {
			u += recordWireLen(&bw.d.recs[i])
		}
	}
	return largemessage.StoredBatchSize(lim.Compression, bw.info.Compression, sent, u)
}

// abandon undoes the committed work of a partition whose result came too
// late to be forwarded (the time budget ran out, the client went away).
func (r *partitionResult) abandon(ctx context.Context) {
	for _, d := range r.committed {
		d.Abort(ctx)
	}
}

// batchWork is one batch of a partition between planning and committing.
type batchWork struct {
	d        *decodedBatch
	raw, enc []byte
	info     BatchInfo
	deferred map[int][]namedDeferred // by record index in d.recs
}

// producePart is one partition of a Produce request as the chain's worker
// reads it (fetchPart's counterpart): producePartition, produceBatch,
// commitPartition and shrink share it. The worker must not read the
// request itself: it may outlive the time budget.
type producePart struct {
	topic     string
	partition int32
	records   []byte // the partition's records field, as the client sent it
	ps        []proc // the produce interceptors matching topic, in order
	shrinkers []BatchShrinker
	lim       TopicLimit
	// pooled: only inliners see the partition (no deferred work, no
	// shrinking): its rewritten batches are encoded into pooled buffers.
	pooled bool
}

// producePartition rewrites one partition's records: every batch is run
// through the interceptors and checked against the topic's limit, then the
// deferred work of all of them is committed (and checked again when a
// commit changed a record). Any failure undoes what was committed.
func (c *Chain) producePartition(ctx context.Context, w *watch, led *ledger, pp *producePart) (any, *failure) {
	where := func(f *failure) (any, *failure) {
		f.msg = fmt.Sprintf("topic %s partition %d: %s", pp.topic, pp.partition, f.msg)
		return nil, f
	}
	records := pp.records
	if len(records) == 0 {
		// Null or empty: nothing to see; the broker answers it.
		return &partitionResult{records: records, led: led}, nil
	}
	var works []*batchWork
	defer func() {
		for _, bw := range works {
			bw.d.done(led)
		}
	}()
	changed := false
	rest := records
	for len(rest) > 0 {
		raw, next, complete := splitBatch(rest)
		if !complete {
			return where(fail(kerr.CorruptMessage.Code, fmt.Errorf("truncated record batch (%d bytes left)", len(rest))))
		}
		rest = next
		bw, f := c.produceBatch(ctx, w, led, pp, raw)
		if f != nil {
			return where(f)
		}
		if bw == nil {
			changed = true // every record skipped
			continue
		}
		if len(bw.enc) != len(raw) || &bw.enc[0] != &raw[0] {
			changed = true
		}
		works = append(works, bw)
	}
	if len(works) == 0 {
		return nil, &failure{code: 0, msg: "every record was skipped by an interceptor"}
	}
	committed, reencoded, f := c.commitPartition(ctx, w, led, pp, works)
	if f != nil {
		return where(f)
	}
	res := &partitionResult{records: records, committed: committed, led: led}
	if changed || reencoded {
		// One batch (a producer's usual request per partition): its
		// encoding is the partition's records, not copied into a new one.
		out := works[0].enc
		if len(works) > 1 {
			out = nil
			for _, bw := range works {
				out = append(out, bw.enc...)
			}
		}
		res.records, res.changed = out, true
	}
	return res, nil
}

// commitPartition commits the deferred work of works, in order; a commit
// that changed its record gets the batch re-encoded and checked again.
// On failure everything committed is aborted.
func (c *Chain) commitPartition(ctx context.Context, w *watch, led *ledger, pp *producePart, works []*batchWork) (done []Deferred, reencoded bool, _ *failure) {
	lim := pp.lim
	abort := func(f *failure) ([]Deferred, bool, *failure) {
		for _, d := range done {
			d.Abort(context.WithoutCancel(ctx))
		}
		return nil, false, f
	}
	for _, bw := range works {
		dirty := false
		idx := make([]int, 0, len(bw.deferred))
		for i := range bw.deferred {
			idx = append(idx, i)
		}
		sort.Ints(idx)
		for _, i := range idx {
			kr := &bw.d.recs[i]
			r := toRecord(pp.topic, pp.partition, &bw.d.hdr, bw.info, kr, i, false)
			for _, d := range bw.deferred[i] {
				err := c.call(ctx, w, &proc{name: d.name, call: d.d.Commit}, i, &r)
				if err != nil {
					// A Commit that ended well after its context did
					// is a failure too: its work is undone with the rest.
					done = append(done, d.d)
					msg := fmt.Sprintf("interceptor %s failed record %d: %v", d.name, i, err)
					return abort(&failure{code: codeOf(err, kerr.KafkaStorageError.Code), msg: msg, err: err,
						records: []kmsg.ProduceResponseTopicPartitionErrorRecord{recordError(i, msg)}})
				}
				done = append(done, d.d)
			}
			if apply(&r, kr) {
				dirty = true
				bw.d.edited(i)
			}
		}
		if !dirty {
			continue
		}
		enc, err := bw.d.encode(ctx, led)
		if err != nil {
			return abort(fail(kerr.UnknownServerError.Code, err))
		}
		bw.enc, reencoded = enc, true
		if n := bw.stored(lim); lim.over(n) {
			return abort(fail(kerr.MessageTooLarge.Code, fmt.Errorf("the record batch is %d bytes as the broker stores it after the payload store's answers, over the topic's max.message.bytes %d", n, lim.MaxMessageBytes)))
		}
	}
	return done, reencoded, nil
}

func batchFailure(err error) *failure {
	var eb *errBatch
	switch {
	case errors.Is(err, errMagic):
		return fail(kerr.UnsupportedForMessageFormat.Code, err)
	case errors.Is(err, ErrDecompressedTooLarge):
		return fail(kerr.MessageTooLarge.Code, err)
	case errors.Is(err, ErrMemoryBusy):
		return fail(kerr.RequestTimedOut.Code, err)
	case errors.As(err, &eb):
		return fail(kerr.CorruptMessage.Code, err)
	}
	return fail(kerr.UnknownServerError.Code, err)
}

// produceBatch runs the interceptors over one batch, read in place,
// shrinks it if needed and checks its size. It returns nil when every
// record was skipped; the batch's encoding is raw when nothing changed (no
// record materialized, nothing encoded).
func (c *Chain) produceBatch(ctx context.Context, w *watch, led *ledger, pp *producePart, raw []byte) (bw *batchWork, f *failure) {
	ps, lim := pp.ps, pp.lim
	d, err := scanBatch(ctx, led, raw)
	if err != nil {
		return nil, batchFailure(err)
	}
	if d.hdr.Attributes&attrControl != 0 {
		return &batchWork{d: d, raw: raw, enc: raw}, nil // control batches (transaction markers) pass untouched
	}
	defer func() {
		if f != nil {
			d.done(led)
		}
	}()
	bw = &batchWork{d: d, raw: raw, info: batchInfo(&d.hdr, lim)}
	dirty, skipped := false, false
	// keep: the records kept, materialized from the first record that
	// changed, was skipped or has deferred work (nil while none has).
	var keep []kmsg.Record
	materialized := false
	// With a BatchInterceptor among ps, the records go through ps
	// interceptor by interceptor first (staged); the loop below then
	// reads their outcomes instead of calling ps. Otherwise one Record is
	// filled for each record in turn.
	var rs []Record
	var outcomes []stageResult
	var one *Record
	if hasBatch(ps) {
		rs = make([]Record, len(d.views))
		for i := range d.views {
			d.fill(&rs[i], i, pp.topic, pp.partition, bw.info, false, led)
		}
		outcomes = c.staged(ctx, w, ps, rs, 0)
	} else {
		one = &Record{}
	}
	for i := range d.views {
		var r *Record
		var err error
		var pname string
		if rs != nil {
			r, err, pname = &rs[i], outcomes[i].err, outcomes[i].name
		} else {
			r = one
			d.fill(r, i, pp.topic, pp.partition, bw.info, false, led)
			for j := range ps {
				if err = c.call(ctx, w, &ps[j], i, r); err != nil {
					pname = ps[j].name
					break
				}
			}
		}
		skip := false
		if err != nil {
			if !errors.Is(err, ErrSkipRecord) {
				msg := fmt.Sprintf("interceptor %s failed record %d: %v", pname, i, err)
				return nil, &failure{code: codeOf(err, kerr.InvalidRecord.Code), msg: msg, err: err,
					records: []kmsg.ProduceResponseTopicPartitionErrorRecord{recordError(i, msg)}}
			}
			if d.hdr.ProducerID >= 0 {
				msg := fmt.Sprintf("interceptor %s skipped record %d, but the batch is idempotent or transactional (producer id %d): dropping a record would break its sequence numbers, so the batch is rejected", pname, i, d.hdr.ProducerID)
				return nil, &failure{code: kerr.InvalidRecord.Code, msg: msg, err: fmt.Errorf("%s: %w", msg, err),
					records: []kmsg.ProduceResponseTopicPartitionErrorRecord{recordError(i, msg)}}
			}
			skip = true
		}
		changed := !skip && d.changed(r, i)
		if !materialized && (skip || changed || len(r.deferred) > 0) {
			// Every record before this one is kept as it came.
			if keep, err = d.materialize(ctx, led, i); err != nil {
				return nil, batchFailure(err)
			}
			materialized = true
		}
		if skip {
			skipped, dirty = true, true
			continue
		}
		if !materialized {
			continue
		}
		kr, from := d.record(i), int32(i)
		if changed {
			d.setFrom(&kr, r)
			dirty, from = true, -1
		}
		if len(r.deferred) > 0 {
			if bw.deferred == nil {
				bw.deferred = map[int][]namedDeferred{}
			}
			bw.deferred[len(keep)] = r.deferred
			d.pinned = true // the deferred work may hold the record's bytes
		}
		keep = append(keep, kr)
		d.from = append(d.from, from)
	}
	if materialized {
		d.recs = keep
	}
	if skipped {
		if len(keep) == 0 {
			d.done(led)
			return nil, nil
		}
		renumber(&d.hdr, keep)
		d.from = nil // new offset and timestamp deltas: every record encoded
	}
	bw.enc = raw
	if dirty {
		d.pooled = pp.pooled
		if bw.enc, err = d.encode(ctx, led); err != nil {
			return nil, batchFailure(err)
		}
	}
	if lim.over(bw.stored(lim)) && len(pp.shrinkers) > 0 {
		if d.recs == nil {
			if d.recs, err = d.materialize(ctx, led, len(d.views)); err != nil {
				return nil, batchFailure(err)
			}
		}
		d.pinned = true // shrinking defers work that holds the records' bytes
		if err := c.shrink(ctx, w, led, pp, bw); err != nil {
			return nil, &failure{code: codeOf(err, kerr.InvalidRecord.Code), msg: err.Error(), err: err}
		}
	}
	// A batch that goes on as the client sent it is the broker's to
	// measure, as it would be without the proxy: with a topic
	// compression.type the bound below is the codec's worst case over the
	// records, which refused batches the broker stores well within the
	// limit (found by a helper: 3.9 MB snappy batches of JSON that lz4
	// stores in 46 KB, all refused through validate-json).
	if n := bw.stored(lim); lim.over(n) && !sameSlice(bw.enc, raw) {
		err := fmt.Errorf("the record batch is %d bytes (%s, %d records; as the broker stores it, topic compression.type %s) after interceptors, over the topic's max.message.bytes %d; nothing was published",
			n, bw.info.Compression, d.count(), lim.compression(), lim.MaxMessageBytes)
		return nil, fail(kerr.MessageTooLarge.Code, err)
	}
	return bw, nil
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

// encodedLen is a record's length inside a batch's records section,
// computed (not encoded: the record may hold a resolved payload of any
// size).
func encodedLen(r *kmsg.Record) int { return int(recordWireLen(r)) }

// shrink asks the shrinkers to make records smaller, those that gain most
// first, until the batch fits the topic's limit or no record gains; a shrink that
// does not make its record smaller is undone (its deferred work dropped, so
// nothing is published for it). Records that already have deferred work
// are left alone. Each round is measured exactly by encoding the batch.
func (c *Chain) shrink(ctx context.Context, w *watch, led *ledger, pp *producePart, bw *batchWork) error {
	d, lim := bw.d, pp.lim
	if bw.deferred == nil {
		bw.deferred = map[int][]namedDeferred{}
	}
	idx := make([]int, 0, len(d.recs))
	for i := range d.recs {
		if len(bw.deferred[i]) == 0 {
			idx = append(idx, i)
		}
	}
	bySize(d.recs, idx)
	next := 0
	for lim.over(bw.stored(lim)) && next < len(idx) {
		over := int(bw.stored(lim) - int64(lim.MaxMessageBytes))
		freed := 0
		for next < len(idx) && freed < over {
			i := idx[next]
			next++
			kr := &d.recs[i]
			before := encodedLen(kr)
			r := toRecord(pp.topic, pp.partition, &d.hdr, bw.info, kr, i, false)
			r.led = led
			for _, s := range pp.shrinkers {
				var did bool
				name := fmt.Sprintf("%T", s)
				if n, ok := s.(interface{ Name() string }); ok {
					name = n.Name()
				}
				err := c.call(ctx, w, &proc{name: name, call: func(ctx context.Context, r *Record) error {
					var err error
					did, err = s.Shrink(ctx, r)
					return err
				}}, i, &r)
				if err != nil {
					return fmt.Errorf("making record %d smaller to fit max.message.bytes %d: %w", i, lim.MaxMessageBytes, err)
				}
				if did {
					break
				}
			}
			saved := *kr
			saved.Headers = slices.Clone(kr.Headers) // apply reuses the slice
			if !apply(&r, kr) {
				continue
			}
			d.edited(i)
			if gain := before - encodedLen(kr); gain > 0 {
				freed += gain
				if len(r.deferred) > 0 {
					bw.deferred[i] = r.deferred
				}
			} else {
				*kr = saved // offloading would make it larger: keep it inline
			}
		}
		if freed == 0 {
			break // no record could be made smaller
		}
		enc, err := d.encode(ctx, led)
		if err != nil {
			return err
		}
		bw.enc = enc
	}
	return nil
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

// notAppended are the produce error codes with which the broker appended
// none of the partition's records: the objects published for them are
// referenced by nothing. (REQUEST_TIMED_OUT and
// NOT_ENOUGH_REPLICAS_AFTER_APPEND may come after an append, and are not
// here; nor is NOT_LEADER_OR_FOLLOWER: an acks=all produce the leader has
// appended and is waiting to replicate is answered with it when leadership
// moves (a controlled shutdown), and the new leader may hold the batch, so
// an idempotent retry is acknowledged as a duplicate of the first, whose
// payloads must stay.)
var notAppended = map[int16]bool{
	kerr.CorruptMessage.Code: true, kerr.UnknownTopicOrPartition.Code: true,
	kerr.MessageTooLarge.Code: true, kerr.RecordListTooLarge.Code: true, kerr.NotEnoughReplicas.Code: true,
	kerr.InvalidRequiredAcks.Code: true, kerr.TopicAuthorizationFailed.Code: true, kerr.ClusterAuthorizationFailed.Code: true,
	kerr.TransactionalIDAuthorizationFailed.Code: true, kerr.InvalidProducerEpoch.Code: true, kerr.OutOfOrderSequenceNumber.Code: true,
	kerr.DuplicateSequenceNumber.Code: true, kerr.InvalidTxnState.Code: true, kerr.UnsupportedForMessageFormat.Code: true,
	kerr.PolicyViolation.Code: true, kerr.InvalidRecord.Code: true, kerr.InvalidTimestamp.Code: true,
	kerr.InvalidProducerIDMapping.Code: true, kerr.UnknownProducerID.Code: true, kerr.FencedLeaderEpoch.Code: true,
	kerr.UnknownLeaderEpoch.Code: true, kerr.UnknownTopicID.Code: true, kerr.InvalidTopicException.Code: true,
	kerr.KafkaStorageError.Code: true, kerr.TransactionAbortable.Code: true,
	kerr.IllegalSaslState.Code: true, kerr.SaslAuthenticationFailed.Code: true,
}

// Refused undoes the deferred work of the partitions of resp that the
// broker refused for good (an error code with which nothing is appended):
// the payloads published for their records are deleted (except content
// ids), so retries leave nothing behind. It returns how many partitions
// were undone.
func (o ProduceOutcome) Refused(ctx context.Context, resp *kmsg.ProduceResponse) int {
	ctx = context.WithoutCancel(ctx) // undoing goes on when the client has gone
	n := 0
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if !notAppended[p.ErrorCode] {
				continue
			}
			k := FetchPartition{t.Topic, t.TopicID, p.Partition}
			for _, d := range o.committed[k] {
				d.Abort(ctx)
			}
			if len(o.committed[k]) > 0 {
				n++
			}
			delete(o.committed, k)
		}
	}
	return n
}

// Confirmer is a Deferred whose work must be checked once the broker
// acknowledged the record: large-message confirms that the objects it
// published are still at their keys (largemessage.Plan.Confirm), so that a
// ferry gc run that quarantined or deleted one while the acknowledgement was
// on its way cannot leave an acknowledged record unreadable.
type Confirmer interface {
	// Confirm returns how many objects it brought back.
	Confirm(ctx context.Context) (int, error)
}

// Confirm confirms the deferred work of the partitions resp acknowledged
// (error code 0), before the response goes to the client: the client's
// acknowledgement comes after the record's payloads are known to be in
// place. It returns how many objects were brought back and the errors of
// those that could not be (the records are in the log: the error is for the
// operator's log).
func (o ProduceOutcome) Confirm(ctx context.Context, resp *kmsg.ProduceResponse) (int, []error) {
	ctx = context.WithoutCancel(ctx)
	n := 0
	var errs []error
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 {
				continue
			}
			k := FetchPartition{t.Topic, t.TopicID, p.Partition}
			for _, d := range o.committed[k] {
				if c, ok := d.(Confirmer); ok {
					m, err := c.Confirm(ctx)
					n += m
					if err != nil {
						errs = append(errs, fmt.Errorf("topic %s partition %d: %w", t.Topic, p.Partition, err))
					}
				}
			}
		}
	}
	return n, errs
}

// AbortAll undoes the deferred work of every forwarded partition: the
// request never reached the broker (its client went away).
func (o ProduceOutcome) AbortAll(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	for k, ds := range o.committed {
		for _, d := range ds {
			d.Abort(ctx)
		}
		delete(o.committed, k)
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

// Per partition entry of a Produce request, what InterceptProduce
// allocates besides the records, for the memory the proxy charges before
// decoding the request: DuplicateEntryBytes for keepLastPartitions' map,
// PartitionWorkBytes for a partition's result, its answer and error, and
// its part of the response (measured: 860 bytes live and 3.1 KiB allocated
// in all per partition for 100,000 partitions the interceptors refuse).
const (
	DuplicateEntryBytes = 128
	PartitionWorkBytes  = 2048
)

// keepLastPartitions keeps, of a Produce request's entries for one
// partition (a topic may even be listed twice), only the last, as the
// broker does: it keys the record sets by partition, appends the last and
// answers it once. The earlier entries would otherwise go through the
// interceptors, publish payloads, and never be answered: objects nothing
// references.
func keepLastPartitions(req *kmsg.ProduceRequest) {
	type key struct {
		topic     string
		id        [16]byte
		partition int32
	}
	n := 0
	for _, t := range req.Topics {
		n += len(t.Partitions)
	}
	last := make(map[key]int, n)
	i := 0
	for _, t := range req.Topics {
		for _, p := range t.Partitions {
			last[key{t.Topic, t.TopicID, p.Partition}] = i
			i++
		}
	}
	if len(last) == n {
		return
	}
	i = 0
	topics := req.Topics[:0]
	for _, t := range req.Topics {
		had := len(t.Partitions) > 0
		parts := t.Partitions[:0]
		for _, p := range t.Partitions {
			if last[key{t.Topic, t.TopicID, p.Partition}] == i {
				parts = append(parts, p)
			}
			i++
		}
		t.Partitions = parts
		if len(parts) > 0 || !had {
			topics = append(topics, t)
		}
	}
	req.Topics = topics
}

// sameSlice reports whether a and b are the same slice (not only equal
// bytes): a batch forwarded as it came.
func sameSlice(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}
