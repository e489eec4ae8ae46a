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

	"github.com/ferrykit/ferry/envelope"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/observe"
)

// corruptRecord lists the errors of a fetched record that no retry and no
// configuration can make readable, because its own bytes are at fault: a
// sealed field that does not authenticate or parse, a marker over bytes
// never sealed, a reference that does not decode, a payload whose SHA-256
// is not the record's. Such a record was altered, or written by a client
// while no interceptor covered its topic (a forged marker or reference).
var corruptRecord = []error{envelope.ErrAuthentication, envelope.ErrFormat, envelope.ErrNotSealed,
	largemessage.ErrCorruptReference, largemessage.ErrDigestMismatch}

// fetchCode is the error code a fetch interceptor's error gives the
// partition: the Kafka error it wraps, if any; CORRUPT_MESSAGE for a
// corrupt record (corruptRecord), as a broker answers a record batch that
// fails its checks: the Java consumer then throws to the application
// naming the partition and offset ("Encountered corrupt message when
// fetching offset"), which can seek past it, and librdkafka reports it as
// a consumer error; a retry would fail the same way for good. Else
// KAFKA_STORAGE_ERROR (retriable): a store or KMS outage, a missing
// payload, a key not configured or a format version of a later Ferry
// (envelope.ErrVersion, largemessage.ErrReferenceVersion), which pass once
// the dependency, the configuration or this Ferry is fixed, so the
// consumer fetches the record again.
func fetchCode(err error) int16 {
	code := kerr.KafkaStorageError.Code
	later := errors.Is(err, envelope.ErrVersion) || errors.Is(err, largemessage.ErrReferenceVersion) // readable once upgraded
	if !later && slices.ContainsFunc(corruptRecord, func(c error) bool { return errors.Is(err, c) }) {
		code = kerr.CorruptMessage.Code
	}
	return codeOf(err, code)
}

// FetchPartitionResult is a partition whose records an interceptor could
// not process.
type FetchPartitionResult struct {
	Topic     string
	TopicID   [16]byte
	Partition int32
	// ErrorCode is the code set on the partition (0 when Partial).
	ErrorCode int16
	// Partial: the records before the failing one were kept (rewritten)
	// and the rest dropped, with no error code; the consumer's next fetch
	// starts at the failing record and gets the error then.
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
	// Truncated counts the partitions whose trailing records were left
	// out to keep the response within the FetchLimits.
	Truncated int
	// Streamed are the partitions whose record sets hold streamed values
	// (holes, stream.go): the response must be written with each hole
	// filled by Hole.Stream, or not at all. Release closes their
	// downloads.
	Streamed []StreamedSet

	led *ledger // the rewritten batches' memory, until Release
}

// Release gives back the memory held for the rewritten batches; call it
// once the response is written: the rewritten record sets' bytes may be
// reused afterwards (built in pooled buffers when only inliners see the
// partition).
func (o *FetchOutcome) Release() { o.led.release() }

// FetchPartition names a partition of a fetch: by topic name (Fetch v0-v12)
// or topic id (v13+), as the request and response do.
type FetchPartition struct {
	Topic     string
	TopicID   [16]byte
	Partition int32
}

// FetchLimits are the consumer's limits from its Fetch request (KIP-74):
// the record bytes of the whole response (max_bytes, fetch.max.bytes) and
// of each partition (partition_max_bytes, max.partition.fetch.bytes), and
// the offset each partition is fetched from. Zero or absent means no limit.
type FetchLimits struct {
	MaxBytes          int32
	PartitionMaxBytes map[FetchPartition]int32
	// FetchOffset is each partition's fetch_offset: records before it
	// (the start of a batch the broker sends whole) are left out unread,
	// as consumers drop them anyway.
	FetchOffset map[FetchPartition]int64
	// Stream: the caller writes FetchOutcome.Streamed (the proxy), so
	// large-message may leave values over large.message.stream.threshold.bytes
	// as holes to stream (interceptor/stream.go). Otherwise every value is
	// put back in memory.
	Stream bool
}

// FetchLimitsOf reads the limits of a Fetch request.
func FetchLimitsOf(req *kmsg.FetchRequest) FetchLimits {
	l := FetchLimits{MaxBytes: req.MaxBytes, PartitionMaxBytes: map[FetchPartition]int32{}, FetchOffset: map[FetchPartition]int64{}}
	for _, t := range req.Topics {
		for _, p := range t.Partitions {
			k := FetchPartition{t.Topic, t.TopicID, p.Partition}
			l.PartitionMaxBytes[k] = p.PartitionMaxBytes
			l.FetchOffset[k] = p.FetchOffset
		}
	}
	return l
}

// InterceptFetch runs the chain's fetch interceptors over resp, in place.
//
// Only partitions of matching topics are decoded; a batch whose records
// are unchanged keeps its bytes. A changed batch is re-encoded with the same
// codec, offsets kept: each record keeps its offset delta, the batch its
// first offset, timestamps, producer id/epoch, base sequence and
// attributes; CRC-32C and lengths are recomputed. A skipped record is left
// out (the batch's record count drops; consumers handle the gap as they do
// for compacted topics; a batch may become empty and still advances the
// consumer's offset). Control batches and a partial batch at the end of the
// record set pass untouched.
//
// A topic named by id (Fetch v13+) that the chain cannot name gets
// UNKNOWN_TOPIC_ID and no records: never records uninspected.
//
// Errors: when the first record of a partition fails (an interceptor error,
// a call over the time budget, a v0/v1 message set, a corrupt batch, a
// batch that decompresses past its bound, the memory budget busy), the
// partition's record set is dropped and its error code set to the
// *kerr.Error the interceptor's error wraps, else KAFKA_STORAGE_ERROR,
// which consumers (Java, librdkafka, franz-go) treat as retriable: they
// refresh metadata and fetch the same offset again. When a later record
// fails, the records before it are returned without error (Partial). An
// interceptor that wants consumers to go past a record returns
// ErrSkipRecord rather than an error. Fetch responses carry no error
// message: the proxy logs FetchOutcome.Failed.
func (c *Chain) InterceptFetch(ctx context.Context, resp *kmsg.FetchResponse) FetchOutcome {
	return c.InterceptFetchLimited(ctx, resp, FetchLimits{})
}

// InterceptFetchLimited is InterceptFetch keeping the response within the
// consumer's limits, as the broker does (KIP-74), and deciding that before
// any interceptor reads anything: rewritten records may be far larger than
// the broker's (large-message replaces references by their payloads; a
// FetchSizer says by how much), so the records that would take the response
// over limits.MaxBytes, or their partition over its partition max bytes,
// are left out with every later record of that partition (a batch is cut
// after its last kept record); the consumer fetches them next time. The
// first record of the response is always kept (the consumer could never
// make progress otherwise). A partition left without records keeps its high
// watermark and no error.
func (c *Chain) InterceptFetchLimited(ctx context.Context, resp *kmsg.FetchResponse, limits FetchLimits) FetchOutcome {
	out := FetchOutcome{led: c.ledger(nil)}
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
	bnds := c.newBounds()
	for ti := range resp.Topics {
		t := &resp.Topics[ti]
		name, named := c.topicName(t.Topic, t.TopicID)
		var ps []proc
		var sizers []FetchSizer
		canStream := false
		if named {
			ps, sizers = c.fetchProcs(name)
			canStream = limits.Stream && c.streamable(name)
		}
		for pi := range t.Partitions {
			p := &t.Partitions[pi]
			if !named && p.ErrorCode == 0 {
				p.ErrorCode = kerr.UnknownTopicID.Code
				p.RecordBatches = []byte{} // empty, not null: librdkafka cannot parse a null record set (size -1)
				out.Failed = append(out.Failed, FetchPartitionResult{Topic: t.Topic, TopicID: t.TopicID, Partition: p.Partition, ErrorCode: p.ErrorCode,
					Err: fmt.Errorf("the proxy cannot name topic id %x, so its records cannot be inspected by the interceptors", t.TopicID)})
				out.Rewritten++
				continue
			}
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
			fp := fetchPart{topic: name, partition: p.Partition, set: p.RecordBatches, aborted: slices.Clone(p.AbortedTransactions),
				limit: limitFor(t, p.Partition), firstOK: used == 0, ps: ps, sizers: sizers, from: -1, canStream: canStream,
				pooled: inlineOnly(ps)}
			if off, ok := limits.FetchOffset[FetchPartition{t.Topic, t.TopicID, p.Partition}]; ok {
				fp.from = off
			}
			// The worker must not read p: it may outlive the budget.
			led := c.ledger(bnds)
			v, f := c.runPart(ctx, led, fp.ps, len(fp.set), func(ctx context.Context, w *watch) (any, *failure) {
				r := c.fetchPartition(ctx, w, led, &fp)
				return r, nil
			})
			if f != nil {
				c.rejected(name, observe.DirectionFetch, f.code)
				p.ErrorCode = kerr.KafkaStorageError.Code
				p.RecordBatches = []byte{} // empty, not null: librdkafka cannot parse a null record set (size -1)
				out.Failed = append(out.Failed, FetchPartitionResult{Topic: t.Topic, TopicID: t.TopicID, Partition: p.Partition,
					ErrorCode: p.ErrorCode, Err: fmt.Errorf("topic %s partition %d: %s", name, p.Partition, f.msg)})
				continue
			}
			r := v.(fetchResult)
			out.led.adopt(led)
			if r.err != nil {
				c.rejected(name, observe.DirectionFetch, r.code)
				fr := FetchPartitionResult{Topic: t.Topic, TopicID: t.TopicID, Partition: p.Partition,
					Err: fmt.Errorf("topic %s partition %d: %w", name, p.Partition, r.err)}
				if len(r.out) == 0 {
					p.ErrorCode = r.code
					p.RecordBatches = []byte{} // empty, not null: librdkafka cannot parse a null record set (size -1)
					fr.ErrorCode = r.code
				} else {
					p.RecordBatches = r.out
					fr.Partial = true
					if len(r.holes) > 0 {
						out.Streamed = append(out.Streamed, StreamedSet{Partition: p, Holes: r.holes})
					}
				}
				used += int64(len(p.RecordBatches)) + r.holeBytes
				out.Failed = append(out.Failed, fr)
				continue
			}
			if r.changed {
				p.RecordBatches = r.out
				out.Rewritten++
				if r.cut {
					out.Truncated++
				}
				if len(r.holes) > 0 {
					out.Streamed = append(out.Streamed, StreamedSet{Partition: p, Holes: r.holes})
				}
			}
			used += int64(len(p.RecordBatches)) + r.holeBytes
		}
	}
	return out
}

// fetchPart is one partition's work.
type fetchPart struct {
	topic     string
	partition int32
	set       []byte
	aborted   []kmsg.FetchResponseTopicPartitionAbortedTransaction
	// limit: the partition's record bytes may not pass it (-1: none),
	// except for its first record when firstOK (the response's first).
	limit   int64
	firstOK bool
	ps      []proc
	sizers  []FetchSizer
	from    int64 // the consumer's fetch offset (-1: unknown)
	// canStream: large-message may leave large values as holes.
	canStream bool
	// into, when set, is the partition's output so far: a batch rewritten
	// without holes or headroom is appended to it (decodedBatch.into), and
	// appended says so.
	into     *[]byte
	appended bool
	// pooled: only inliners see the partition: its output is built in
	// pooled buffers (outpool.go).
	pooled bool
}

// fetchResult is a partition's rewritten record set. On error, out holds
// the records before the failing one.
type fetchResult struct {
	out     []byte
	changed bool
	cut     bool
	code    int16
	err     error
	// holes are the streamed values in out (At relative to out), whose
	// bytes (holeBytes in all) are not in out.
	holes     []*Hole
	holeBytes int64
}

// fetchPartition rewrites a partition's record set within its limit.
func (c *Chain) fetchPartition(ctx context.Context, w *watch, led *ledger, fp *fetchPart) fetchResult {
	var r fetchResult
	sort.Slice(fp.aborted, func(i, j int) bool { return fp.aborted[i].FirstOffset < fp.aborted[j].FirstOffset })
	aborting := map[int64]bool{}
	aborted := fp.aborted
	// The output is fp.set's first passed bytes (batches passed on
	// unchanged, not copied) until a batch is rewritten or left out; from
	// then on it is a copy in r.out (copied: true).
	passed, copied := 0, false
	emitted := func() int64 {
		if copied {
			return int64(len(r.out)) + r.holeBytes
		}
		return int64(passed)
	}
	// at is where the next batch starts in the output's bytes.
	at := func() int64 {
		if copied {
			return int64(len(r.out))
		}
		return int64(passed)
	}
	// grow makes room for n more bytes in the copied output: a buffer
	// from the pools (outpool.go) when only inliners see the partition,
	// given back by the outcome's Release once the response is written
	// (a fresh one was zeroed and collected per response), else allocated.
	grow := func(n int) { r.out = growOut(led, fp.pooled, r.out, n) }
	copyOut := func() {
		if !copied {
			r.out, copied = nil, true
			grow(len(fp.set))
			r.out = append(r.out, fp.set[:passed]...)
		}
	}
	rest := fp.set
	// reserve makes room for n more bytes in the copied output, growing it
	// once for them and what is left of the input (an eighth more, for
	// records that grow), not by doubling batch after batch: a fetch whose
	// every batch is rewritten (encrypt) otherwise allocated about five
	// times its size.
	reserve := func(n int) {
		if cap(r.out)-len(r.out) < n {
			grow(n + len(rest) + len(rest)/8)
		}
	}
	// appendOut appends b to the copied output.
	appendOut := func(b []byte) {
		reserve(len(b))
		r.out = append(r.out, b...)
	}
	// pass emits raw, the next batch of fp.set, unchanged.
	pass := func(raw []byte) {
		if copied {
			appendOut(raw)
		} else {
			passed += len(raw)
		}
	}
	// room reports whether n more bytes fit; the response's first record
	// always does.
	room := func(n int64) bool {
		return fp.limit < 0 || emitted()+n <= fp.limit
	}
	for len(rest) > 0 && !r.cut {
		raw, next, complete := splitBatch(rest)
		if !complete {
			// A partial batch (the broker cut the response at the
			// consumer's limit) is dropped, not passed on: the
			// interceptors cannot read it, and a client that does not
			// discard partial batches as consumers do would read its
			// records uninspected. The consumer fetches it next time.
			r.changed, r.cut = true, true
			break
		}
		rest = next
		// Batches of aborted transactions (read_committed: the response
		// lists them) go through the interceptors too, since a client can
		// ignore the aborted list and read them (a redact on fetch must
		// hold for them), but leniently: their records are marked Aborted
		// (large-message leaves them unresolved: their payloads may be
		// gone, ferry gc keeps committed data only), and a record an
		// interceptor fails is left out instead of failing the partition.
		inAborted := false
		if len(raw) >= batchHeaderLen && raw[magicOffset] == 2 {
			first := int64(binary.BigEndian.Uint64(raw))
			last := first + int64(int32(binary.BigEndian.Uint32(raw[23:])))
			pid := int64(binary.BigEndian.Uint64(raw[43:]))
			attrs := int16(binary.BigEndian.Uint16(raw[attrOffset:]))
			for len(aborted) > 0 && aborted[0].FirstOffset <= last {
				aborting[aborted[0].ProducerID] = true
				aborted = aborted[1:]
			}
			if attrs&attrControl != 0 {
				delete(aborting, pid) // a marker ends the transaction
				if !room(int64(len(raw))) && !(fp.firstOK && emitted() == 0) {
					r.changed, r.cut = true, true
					break
				}
				pass(raw)
				continue
			}
			inAborted = attrs&attrTransactional != 0 && aborting[pid]
		}
		// A rewritten batch comes back with room in front for the
		// batches passed so far (not copied yet): they are copied into
		// it, and the large one is not copied at all.
		headroom := 0
		if !copied {
			headroom = passed
		}
		start := at()
		// Once the output is a copy, a rewritten batch is encoded at its
		// end, with room for the batch as it came and an eighth more.
		fp.into, fp.appended = nil, false
		if copied {
			reserve(len(raw) + len(raw)/8)
			fp.into = &r.out
		}
		nb, holes, cut, err := c.fetchBatch(ctx, w, led, fp, raw, emitted(), room, inAborted, headroom)
		rewritten := len(nb) > 0 && (len(nb) != len(raw) || &nb[0] != &raw[0])
		for _, h := range holes {
			// (a batch with holes is always rewritten, and starts at
			// start in the output, however it is joined below)
			h.At += start
			r.holes = append(r.holes, h)
			r.holeBytes += h.Size
		}
		if rewritten && headroom > 0 {
			copy(nb, fp.set[:passed])
			r.out, copied = nb, true
		}
		if err != nil {
			// The output keeps the records before the failing one.
			switch {
			case rewritten && headroom > 0: // joined above
			case fp.appended: // encoded at the output's end
			case len(nb) > 0:
				copyOut()
				appendOut(nb)
			case !copied:
				r.out = fp.set[:passed:passed]
			}
			r.changed, r.code, r.err = true, fetchCode(err), err
			return r
		}
		if cut {
			r.changed, r.cut = true, true
		}
		switch {
		case len(nb) == 0:
			// Left out (records before the fetch offset, or cut): the
			// batches after it no longer follow the ones passed in fp.set.
			copyOut()
		case rewritten:
			r.changed = true
			switch {
			case headroom > 0:
				// joined to the batches before it above
			case !copied:
				// The first batch out is a rewritten one (a payload put
				// back: perhaps 100 MiB): it is the output so far, not
				// copied into a new one.
				r.out, copied = nb, true
			case fp.appended:
				// encoded at the output's end
			default:
				appendOut(nb)
			}
		default:
			pass(raw)
		}
	}
	switch {
	case !r.changed:
		r.out = fp.set
	case !copied:
		r.out = fp.set[:passed:passed] // cut after the batches passed: no copy
	}
	return r
}

// fetchBatch runs the interceptors over one batch, within room: each
// record's size after the interceptors is known in advance where a
// FetchSizer says it, else measured after; the batch is cut before the
// first record that does not fit (cut true), keeping the records before it
// with the batch's last offset delta set to the last record kept. Records
// before the consumer's fetch offset are left out unread. It returns raw
// when nothing changed and nil when no record is left (cut, or all before
// the fetch offset).
func (c *Chain) fetchBatch(ctx context.Context, w *watch, led *ledger, fp *fetchPart, raw []byte, emitted int64,
	room func(int64) bool, aborted bool, headroom int) (out []byte, holes []*Hole, cut bool, err error) {
	out, cut, err = c.fetchBatchBytes(ctx, w, led, fp, raw, emitted, room, aborted, headroom, &holes)
	return out, holes, cut, err
}

// fetchBatchBytes is fetchBatch; holes receives the batch's streamed
// values (At relative to the batch's first byte).
func (c *Chain) fetchBatchBytes(ctx context.Context, w *watch, led *ledger, fp *fetchPart, raw []byte, emitted int64,
	room func(int64) bool, aborted bool, headroom int, holes *[]*Hole) (out []byte, cut bool, err error) {
	d, err := scanBatch(ctx, led, raw)
	if err != nil {
		var eb *errBatch
		if errors.As(err, &eb) || errors.Is(err, errMagic) || errors.Is(err, ErrDecompressedTooLarge) {
			return nil, false, fmt.Errorf("batch at offset %d: %w", firstOffset(raw), err)
		}
		return nil, false, err
	}
	defer d.done(led)
	// What the interceptors reserve for this batch's records (payloads
	// downloaded) is given back once the batch is encoded: the encoded
	// batch, charged on its own, holds a copy (Record.Reserve's contract).
	// (What materializing charges is the batch's, given back by done.)
	mark, transient := heldOf(led), d.transient
	var encoded int64
	defer func() { led.give(heldOf(led) - mark - encoded - (d.transient - transient)) }()
	if d.hdr.Attributes&attrControl != 0 {
		return raw, false, nil
	}
	info := batchInfo(&d.hdr, TopicLimit{})
	dirty := false
	var failed error // an interceptor's error after some records were kept
	// The records kept: counted, and materialized (keep) only from the
	// first record left out or changed; until then every record read is
	// kept as it came, and nothing is copied.
	var keep []kmsg.Record
	materialized := false
	nkept := 0
	materialize := func() error {
		if materialized {
			return nil
		}
		var err error
		keep, err = d.materialize(ctx, led, nkept)
		materialized = err == nil
		return err
	}
	size := int64(batchHeaderLen) // the batch as it will be encoded, uncompressed
	lastDelta := int32(-1)        // the offset delta of the last record considered
	first := func() bool { return fp.firstOK && emitted == 0 && nkept == 0 }
	early := func(i int) bool { return fp.from >= 0 && d.hdr.FirstOffset+int64(d.views[i].offDelta) < fp.from }
	// predict is a record's size after the interceptors as far as the
	// FetchSizers know it in advance (known false: measured after).
	predict := func(i int, r *Record) (n int64, known bool) {
		n, known = d.wireLen(i), len(fp.sizers) > 0
		for _, s := range fp.sizers {
			g, ok := s.GrowsBy(r)
			n += g
			known = known && ok
		}
		return n, known
	}
	// With a BatchInterceptor among the interceptors, the records that can
	// fit (from the fetch offset, as predicted) go through them
	// interceptor by interceptor first (staged: rs[k] is record start+k);
	// the loop below reads their outcomes and cuts the batch where they end.
	// Otherwise one Record is filled for each record in turn.
	var rs []Record
	var pre []int64
	var known []bool
	var outcomes []stageResult
	var one *Record
	start := 0
	if hasBatch(fp.ps) {
		sz := size
		rs = make([]Record, 0, len(d.views))
		for i := range d.views {
			if early(i) {
				start = i + 1
				continue
			}
			rs = append(rs, Record{})
			r := &rs[len(rs)-1]
			d.fill(r, i, fp.topic, fp.partition, info, true, led)
			r.Aborted = aborted
			n, k := predict(i, r)
			if !room(sz+n) && !(fp.firstOK && emitted == 0 && len(rs) == 1) {
				rs = rs[:len(rs)-1]
				break
			}
			sz += n
			pre, known = append(pre, n), append(known, k)
		}
		outcomes = c.staged(ctx, w, fp.ps, rs, start)
	} else {
		one = &Record{}
	}
	for i := range d.views {
		if early(i) {
			dirty = true // before the fetch offset: consumers drop it
			if err := materialize(); err != nil {
				return nil, false, err
			}
			continue
		}
		var r *Record
		var n int64
		var known1 bool
		if rs != nil {
			if i-start >= len(rs) {
				cut = true // past what was staged: does not fit
				break
			}
			r, n, known1 = &rs[i-start], pre[i-start], known[i-start]
		} else {
			r = one
			d.fill(r, i, fp.topic, fp.partition, info, true, led)
			r.Aborted = aborted
			r.canStream = fp.canStream
			n, known1 = predict(i, r)
		}
		// Over the limits already (as sent, plus the growth a FetchSizer
		// predicts): left out unread (large-message would download a
		// payload only to drop it).
		if !room(size+n) && !first() {
			cut = true
			break
		}
		var err error
		var pname string
		if rs != nil {
			err, pname = outcomes[i-start].err, outcomes[i-start].name
		} else {
			for j := range fp.ps {
				if err = c.call(ctx, w, &fp.ps[j], i, r); err != nil {
					pname = fp.ps[j].name
					break
				}
			}
		}
		skip := false
		if err != nil {
			if errors.Is(err, ErrSkipRecord) || aborted {
				skip = true
			} else {
				failed = fmt.Errorf("interceptor %s failed the record at offset %d: %w", pname, r.Offset, err)
				if nkept == 0 {
					return nil, false, failed
				}
				// The records so far go out; the consumer meets the error
				// at this record next time.
				cut = true
				break
			}
		}
		if skip {
			dirty = true
			if err := materialize(); err != nil {
				return nil, false, err
			}
			lastDelta = d.views[i].offDelta
			continue
		}
		changed := d.changed(r, i)
		var kr kmsg.Record
		if changed {
			dirty = true
			if err := materialize(); err != nil {
				return nil, false, err
			}
			kr = d.record(i)
			d.setFrom(&kr, r)
			n = int64(encodedLen(&kr))
			if r.stream != nil {
				n = streamedWireLen(&kr, r.stream.size)
			}
		}
		if !known1 && !room(size+n) && !first() {
			cut = true
			break
		}
		size += n
		if materialized {
			from := int32(-1)
			if !changed {
				kr, from = d.record(i), int32(i)
			}
			keep = append(keep, kr)
			d.from = append(d.from, from)
			if changed && r.stream != nil {
				d.holes = append(d.holes, holeRec{rec: len(keep) - 1, s: r.stream})
			}
		}
		nkept++
		lastDelta = d.views[i].offDelta
	}
	if cut {
		dirty = true
	}
	if !dirty {
		return raw, false, nil
	}
	if nkept == 0 && (cut || lastDelta < 0) {
		return nil, cut, nil
	}
	// Cut before anything else was left out or changed: the records kept
	// are the first nkept, as they came.
	if err := materialize(); err != nil {
		return nil, false, err
	}
	d.recs = keep
	if cut {
		d.hdr.LastOffsetDelta = lastDelta
	}
	before := heldOf(led)
	d.headroom = headroom
	var enc []byte
	if len(d.holes) > 0 {
		enc, *holes, err = d.encodeStreamed(ctx, led, fp.topic, fp.partition)
	} else {
		if headroom == 0 {
			d.into, d.pooled = fp.into, fp.pooled
		}
		enc, err = d.encode(ctx, led)
		fp.appended = d.into != nil && err == nil
	}
	encoded = heldOf(led) - before
	if err == nil {
		err = failed
	}
	return enc, cut, err
}

func firstOffset(raw []byte) int64 {
	var h kmsg.RecordBatch
	_ = h.ReadFrom(raw)
	return h.FirstOffset
}
