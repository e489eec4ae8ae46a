// Package lifecycle removes payloads that no live record references any
// more: the garbage collection behind `ferry gc` (KIP-1159 leaves payload
// expiry to the store; this is for stores without a TTL, or compacted topics,
// where no TTL fits).
//
// Collect lists the objects under a topic's prefix in the payload store,
// reads the whole topic, and deletes the listed objects that no live record
// references and that are older than a grace period. Live records are, for a
// topic whose cleanup.policy is delete, every committed record still in the
// log; for a compacted topic (cleanup.policy contains compact), the latest
// record of each key, as Kafka's log compaction keeps it: a key whose latest
// record is a tombstone (null value) holds no value payload. An offloaded key
// stays live as long as any record carrying it is in the log (a tombstone
// still needs its key).
//
// Safety rules:
//
//   - The store is listed before the topic is read, so an object written
//     while Collect runs is never a candidate.
//   - Objects newer than the grace period (Options.Grace, 24h by default) are
//     never deleted. The grace must exceed the longest time between a
//     payload's publish and the produce of the record that references it:
//     producer retries (delivery.timeout.ms) and, for transactional producers,
//     transaction.max.timeout.ms. A payload published but not yet in the log
//     looks like an orphan; the grace is what protects it.
//   - The topic is read up to its last stable offset with read_committed
//     isolation, so aborted records hold nothing and an open transaction is
//     not read past (its payloads are newer than the grace anyway, by the rule
//     above). A read that does not complete is an error and nothing is
//     deleted.
//   - References and listed objects are matched on the object's name
//     "<topic>/<shard>/<id>", not on the whole full path, so a reference
//     written through another spelling of the store's root still keeps its
//     object; a reference into another store is otherwise ignored.
//   - A record marked large-message (or large-message-key) whose reference
//     does not decode stops the run with an error naming its topic, partition
//     and offset: Collect never deletes when it cannot tell what is live.
//
// With a compacted topic, a consumer that replays the topic from its start
// may still meet an overwritten record that compaction has not removed yet,
// whose payload Collect deleted: it gets ErrPayloadNotFound
// (large.message.skip.not.found.error=true skips such records). That is
// Kafka's own compaction contract: only the latest record per key is
// guaranteed.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
)

// DefaultGrace is the grace period when Options.Grace is 0 and
// Options.GraceSet is false: one day.
const DefaultGrace = 24 * time.Hour

// Read-loop bounds: a poll waits at most pollTimeout; when maxIdlePolls poll
// timeouts pass without a record of a pending partition, the read fails.
const (
	pollTimeout  = 10 * time.Second
	maxIdlePolls = 3
	// fetchMaxBytes is the fetch response size asked for (bytes); records
	// are small references, so this is many of them per fetch.
	fetchMaxBytes = 64 << 20
)

// Options configure Collect.
type Options struct {
	// Topic is the Kafka topic whose payloads are collected (required).
	Topic string
	// Grace: objects whose ModTime is within Grace of Now are never
	// deleted. 0 means DefaultGrace (24h) unless GraceSet is true.
	Grace time.Duration
	// GraceSet makes a Grace of 0 mean zero (every unreferenced object is
	// a candidate); for tests and for topics known to be idle.
	GraceSet bool
	// DryRun: delete nothing; Summary.Candidates lists what would be
	// deleted.
	DryRun bool
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Progress, when set, is called as the run advances (from the calling
	// goroutine).
	Progress func(Progress)
}

// Progress is a snapshot of a running Collect.
type Progress struct {
	Phase       string // "list", "read" or "delete"
	Listed      int    // objects listed so far
	RecordsRead int64  // records read so far (control records excluded)
	Checked     int    // candidates checked against the live set so far
	Deleted     int    // objects deleted so far
}

// Summary is what a Collect run found and did.
type Summary struct {
	// Compacted: the topic's cleanup.policy contains compact.
	Compacted bool
	// RecordsRead counts the records read (control records excluded).
	RecordsRead int64
	// LiveReferences counts the distinct objects live records reference
	// (matched on "<topic>/<shard>/<id>", whatever store root the
	// reference names).
	LiveReferences int
	// Listed counts the objects under the topic's prefix.
	Listed int
	// Referenced counts listed objects older than the grace period that a
	// live record references (kept).
	Referenced int
	// TooNew counts listed objects within the grace period (kept whether
	// referenced or not). Listed = Referenced + TooNew + Deleted + Failed.
	TooNew int
	// Deleted counts deleted objects (with DryRun: objects that would be).
	Deleted int
	// BytesFreed is the size of the deleted objects, in bytes.
	BytesFreed int64
	// Failed counts objects whose delete failed.
	Failed int
	// Candidates are the objects deleted (with DryRun: that would be), in
	// full-path order.
	Candidates []payloadstore.ObjectInfo
}

// Collect deletes the objects of store under o.Topic's prefix that no live
// record of the topic references and that are older than the grace period
// (see the package documentation for the rules).
//
// cl is used for admin requests (DescribeConfigs, ListOffsets); the topic is
// read by a separate client made from cl's options (seed brokers, TLS, SASL)
// plus direct partition consumption, so cl must not be a consumer-group
// client. Errors: the topic does not exist, its offsets or configs cannot be
// read, the read stalls (no progress for 3 polls of 10 s; the error names the
// partition and offset), a record has a corrupt reference, or the store
// cannot list. In all those cases nothing is deleted. When some deletes fail,
// the others still happen and the error says how many failed; the Summary is
// returned in every case.
func Collect(ctx context.Context, cl *kgo.Client, store payloadstore.PayloadStore, o Options) (Summary, error) {
	var sum Summary
	if o.Topic == "" {
		return sum, errors.New("gc: no topic given")
	}
	if o.Grace < 0 {
		return sum, fmt.Errorf("gc: grace %s is negative", o.Grace)
	}
	grace := o.Grace
	if grace == 0 && !o.GraceSet {
		grace = DefaultGrace
	}
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	report := func(p Progress) {
		if o.Progress != nil {
			o.Progress(p)
		}
	}
	adm := kadm.NewClient(cl)

	// 1. The topic's cleanup.policy.
	compacted, err := isCompacted(ctx, adm, o.Topic)
	if err != nil {
		return sum, err
	}
	sum.Compacted = compacted

	// 2. List the store first: an object written after this is never a
	// candidate, whatever the read below sees.
	cutoff := now().Add(-grace)
	var old []payloadstore.ObjectInfo
	err = payloadstore.List(ctx, store, o.Topic, func(oi payloadstore.ObjectInfo) error {
		sum.Listed++
		if oi.ModTime.Before(cutoff) {
			old = append(old, oi)
		} else {
			sum.TooNew++
		}
		if sum.Listed%1000 == 0 {
			report(Progress{Phase: "list", Listed: sum.Listed})
		}
		return nil
	})
	if err != nil {
		return sum, fmt.Errorf("gc: listing the payloads of topic %s: %w", o.Topic, err)
	}
	report(Progress{Phase: "list", Listed: sum.Listed})

	// 3. and 4. Read the topic and collect the live references.
	live, n, err := readLive(ctx, cl, adm, o.Topic, compacted, func(n int64) {
		report(Progress{Phase: "read", Listed: sum.Listed, RecordsRead: n})
	})
	sum.RecordsRead = n
	if err != nil {
		return sum, err
	}
	sum.LiveReferences = len(live)

	// 5. Delete the old objects nothing live references.
	slices.SortFunc(old, func(a, b payloadstore.ObjectInfo) int { return strings.Compare(a.FullPath, b.FullPath) })
	var failed []error
	for i, oi := range old {
		if err := ctx.Err(); err != nil {
			return sum, err
		}
		if _, ok := live[objectName(oi.FullPath)]; ok {
			sum.Referenced++
		} else if o.DryRun {
			sum.Candidates = append(sum.Candidates, oi)
			sum.Deleted++
			sum.BytesFreed += oi.Size
		} else if err := store.Delete(ctx, oi.FullPath); err != nil {
			sum.Failed++
			failed = append(failed, err)
		} else {
			sum.Candidates = append(sum.Candidates, oi)
			sum.Deleted++
			sum.BytesFreed += oi.Size
		}
		if (i+1)%100 == 0 || i == len(old)-1 {
			report(Progress{Phase: "delete", Listed: sum.Listed, RecordsRead: sum.RecordsRead, Checked: i + 1, Deleted: sum.Deleted})
		}
	}
	if sum.Failed > 0 {
		return sum, fmt.Errorf("gc: %d of %d deletes failed, first: %w", sum.Failed, sum.Failed+sum.Deleted, failed[0])
	}
	return sum, nil
}

// isCompacted reads the topic's cleanup.policy.
func isCompacted(ctx context.Context, adm *kadm.Client, topic string) (bool, error) {
	rcs, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return false, fmt.Errorf("gc: topic %s: describing configs: %w", topic, err)
	}
	rc, err := rcs.On(topic, nil)
	if err != nil || errors.Is(rc.Err, kerr.UnknownTopicOrPartition) {
		return false, fmt.Errorf("gc: topic %s does not exist", topic)
	}
	if rc.Err != nil {
		return false, fmt.Errorf("gc: topic %s: describing configs: %w", topic, rc.Err)
	}
	for _, c := range rc.Configs {
		if c.Key == "cleanup.policy" && c.Value != nil {
			for _, p := range strings.Split(*c.Value, ",") {
				if strings.TrimSpace(p) == "compact" {
					return true, nil
				}
			}
			return false, nil
		}
	}
	return false, fmt.Errorf("gc: topic %s: the broker did not return cleanup.policy", topic)
}

// span is the part of one partition to read: [next, end).
type span struct{ start, end int64 }

// bounds returns each partition's start offset and last stable offset.
func bounds(ctx context.Context, adm *kadm.Client, topic string) (map[int32]span, error) {
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		if errors.Is(err, kerr.UnknownTopicOrPartition) {
			return nil, fmt.Errorf("gc: topic %s does not exist", topic)
		}
		return nil, fmt.Errorf("gc: topic %s: listing start offsets: %w", topic, err)
	}
	ends, err := adm.ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("gc: topic %s: listing last stable offsets: %w", topic, err)
	}
	out := make(map[int32]span)
	starts.Each(func(lo kadm.ListedOffset) {
		out[lo.Partition] = span{start: lo.Offset}
	})
	var missing error
	ends.Each(func(lo kadm.ListedOffset) {
		sp, ok := out[lo.Partition]
		if !ok {
			missing = fmt.Errorf("gc: topic %s partition %d: no start offset listed", topic, lo.Partition)
			return
		}
		sp.end = lo.Offset
		out[lo.Partition] = sp
	})
	if missing != nil {
		return nil, missing
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("gc: topic %s does not exist", topic)
	}
	return out, nil
}

// pkey is a record key within one partition (compaction is per partition).
type pkey struct {
	partition int32
	key       string
}

// readLive reads every partition of topic from its start to its last stable
// offset and returns the set of live object names (objectName) and the
// number of records read.
//
// A partition is done once a record (control records included, which is why
// they are kept) at or past its end-1 is seen. If the record at end-1 is
// an aborted one whose abort marker lies past the end (transactions
// interleaved with one still open when the run began), the partition is done
// only when a later record arrives; if none does within the stall bound, the
// run fails and deletes nothing.
func readLive(ctx context.Context, cl *kgo.Client, adm *kadm.Client, topic string, compacted bool, progress func(int64)) (map[string]struct{}, int64, error) {
	spans, err := bounds(ctx, adm, topic)
	if err != nil {
		return nil, 0, err
	}
	live := make(map[string]struct{})
	latest := make(map[pkey]string) // compacted: the latest value reference per key ("" for none)
	assign := make(map[int32]kgo.Offset)
	pending := make(map[int32]int64) // partition -> the next offset expected
	for p, sp := range spans {
		if sp.start < sp.end {
			assign[p] = kgo.NewOffset().At(sp.start)
			pending[p] = sp.start
		}
	}
	var read int64
	if len(pending) > 0 {
		rc, err := kgo.NewClient(append(cl.Opts(),
			kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: assign}),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()),
			kgo.KeepControlRecords(),
			kgo.FetchMaxBytes(fetchMaxBytes),
			kgo.FetchMaxPartitionBytes(fetchMaxBytes),
		)...)
		if err != nil {
			return nil, 0, fmt.Errorf("gc: kafka client to read topic %s: %w", topic, err)
		}
		defer rc.Close()
		lastProgress := time.Now()
		for len(pending) > 0 {
			pctx, cancel := context.WithTimeout(ctx, pollTimeout)
			fs := rc.PollFetches(pctx)
			cancel()
			if err := ctx.Err(); err != nil {
				return nil, read, err
			}
			var ferr error
			fs.EachError(func(t string, p int32, err error) {
				if ferr == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
					ferr = fmt.Errorf("gc: fetching topic %s partition %d: %w", t, p, err)
				}
			})
			if ferr != nil {
				return nil, read, ferr
			}
			progressed := false
			for _, r := range fs.Records() {
				next, ok := pending[r.Partition]
				if !ok || r.Offset < next {
					continue // past the end read, or seen
				}
				progressed = true
				pending[r.Partition] = r.Offset + 1
				if r.Offset >= spans[r.Partition].end-1 {
					delete(pending, r.Partition)
					// Records produced since the run began are not
					// wanted: stop fetching them.
					rc.PauseFetchPartitions(map[string][]int32{topic: {r.Partition}})
				}
				if r.Offset >= spans[r.Partition].end || r.Attrs.IsControl() {
					continue
				}
				read++
				if err := addRecord(r, compacted, live, latest); err != nil {
					return nil, read, err
				}
			}
			if progressed {
				lastProgress = time.Now()
				progress(read)
				continue
			}
			if time.Since(lastProgress) >= maxIdlePolls*pollTimeout {
				p, next := firstPending(pending)
				return nil, read, fmt.Errorf("gc: reading topic %s stalled at partition %d offset %d (end %d): no progress for %s; nothing deleted",
					topic, p, next, spans[p].end, time.Duration(maxIdlePolls)*pollTimeout)
			}
		}
	}
	for _, path := range latest {
		if path != "" {
			live[objectName(path)] = struct{}{}
		}
	}
	return live, read, nil
}

// objectName is the part of a full path that names the object within any
// store: its last three segments, "<topic>/<shard>/<id>" (docs/FORMAT.md).
// Live references and listed objects are matched on it rather than on the
// whole path, so that a reference written through another spelling of the
// same store's root (a file store mounted at another directory, a bucket
// reached through another endpoint) still keeps its object. A reference into
// another store can at worst keep an object with the same name here; it
// never makes one deletable.
func objectName(fullPath string) string {
	i := len(fullPath)
	for range 3 {
		j := strings.LastIndexByte(fullPath[:i], '/')
		if j < 0 {
			return fullPath
		}
		i = j
	}
	return fullPath[i+1:]
}

func firstPending(pending map[int32]int64) (int32, int64) {
	ps := make([]int32, 0, len(pending))
	for p := range pending {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps[0], pending[ps[0]]
}

// addRecord adds the references of r to live (its key reference, and its
// value reference unless compacted) or to latest (compacted: the value
// reference of the latest record per key).
func addRecord(r *kgo.Record, compacted bool, live map[string]struct{}, latest map[pkey]string) error {
	if largemessage.IsKeyOffloaded(r) {
		ref, err := largemessage.DecodeReference(r.Key)
		if err != nil {
			return corrupt(r, "key", err)
		}
		live[objectName(ref.FullPayloadPath)] = struct{}{}
	}
	valuePath := ""
	if largemessage.IsOffloaded(r) {
		ref, err := largemessage.DecodeReference(r.Value)
		if err != nil {
			return corrupt(r, "value", err)
		}
		valuePath = ref.FullPayloadPath
	}
	if compacted && r.Key != nil {
		// A later record of the key replaces this one; a tombstone
		// (nil value) or an inline value holds no payload.
		latest[pkey{r.Partition, string(r.Key)}] = valuePath
		return nil
	}
	if valuePath != "" {
		live[objectName(valuePath)] = struct{}{}
	}
	return nil
}

func corrupt(r *kgo.Record, side string, err error) error {
	return fmt.Errorf("gc: topic %s partition %d offset %d: %s: %w; nothing deleted", r.Topic, r.Partition, r.Offset, side, err)
}
