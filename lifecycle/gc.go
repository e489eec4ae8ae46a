// Package lifecycle removes payloads that no live record references any
// more: the garbage collection behind `ferry gc` (KIP-1159 leaves payload
// expiry to the store; this is for stores without a TTL, or compacted topics,
// where no TTL fits).
//
// Collect lists the objects under a topic's prefix in the payload store,
// decides which of them are garbage, and removes those in two steps: it
// moves them into a quarantine folder, waits a settle time, reads the records
// appended to the topic since its decision, moves back every quarantined
// object such a record references, and deletes the rest.
//
// # Deciding
//
// An object is a candidate when its ModTime is older than the grace period
// (Options.Grace) and one of these proves that no live record references it:
//
//   - Full read (compacted topics always; delete-policy topics until a
//     checkpoint is usable, or with ModeFull): the topic is read from the
//     start of every partition to its last stable offset with
//     read_uncommitted, and no record read references the object. Live
//     records are, for a topic whose cleanup.policy is delete, every
//     record still in the log, those of aborted transactions included (a
//     read_uncommitted consumer, Kafka's default, reads them); for a
//     compacted topic (cleanup.policy contains compact), every
//     transactional record still in the log (it may be an aborted one,
//     which the log cleaner removes and which must not stand for its
//     key's latest), and the latest other record of each key, as Kafka's
//     log compaction keeps it: a key whose latest record is a
//     tombstone (null value) holds no value payload. An offloaded key stays
//     live as long as any record carrying it is in the log (a tombstone still
//     needs its key). Partitions are read in parallel (Options.ReadWorkers
//     clients, each over its share of the partitions).
//   - Checkpoint (delete-policy topics, ModeAuto or ModeCheckpoint; the
//     topic is not read): every run first stores a checkpoint
//     "<topic>/.ferry-gc/checkpoints": the time on gc's clock, then the high
//     watermark of every partition. Every record acknowledged before that
//     time lies below those offsets. A checkpoint c is usable once every
//     partition's log start offset has reached c's offset (a partition c
//     does not name counts as 0): retention has deleted every record
//     acknowledged before c's time. An object with ModTime m is garbage when
//     a usable checkpoint has m + grace <= its time: every record that
//     references the object was acknowledged within the grace period after
//     the object's ModTime was last set (publish, copy or touch; see the
//     grace rule below), so before c's time, and is gone. Objects no usable
//     checkpoint proves are kept (Summary.Unproven). With ModeAuto a run
//     without a usable checkpoint falls back to the full read. The cost of a
//     checkpoint run does not grow with the number of records in the topic:
//     it lists the store and reads only the records appended during the run.
//     Checkpoints retention has passed are pruned except the newest;
//     checkpoints dated after the run's start (gc's clock was ahead when
//     they were taken) are dropped.
//
// # Quarantine and recheck
//
// Candidates are moved, not deleted, to
// "<topic>/.ferry-gc/q/<run>/<shard>/<id>" (payloadstore.List skips that
// folder). Before it moves anything, the run stores a manifest there: its
// id, start time and E1, per partition the offset from which records were
// not taken into account by the decision (the end of the full read; in
// checkpoint mode the high watermarks taken before the store was listed).
// Then, per candidate: its Version is compared with the listed one before
// the move, and where the move keeps it (the file store's rename(2)) after
// the move as well; an object republished (a content id written again by an
// equal payload) or touched since it was listed stays, or is moved back at
// once (Summary.Changed).
//
// After the last move the run waits Options.Settle, then reads every record
// from E1 to the partitions' current high watermarks with read_uncommitted
// (records of open and aborted transactions count: conservative), and moves
// back every quarantined object a record references (its key or value
// reference, matched on "<topic>/<shard>/<id>"); a restored object is
// touched where the move kept its old ModTime, and when an object is already
// at its key again (republished: same bytes), the quarantined copy is
// removed instead. The records of Options.Mirrors are read the same way.
//
// The late check: before deleting, the run reads the records appended while
// the recheck read. One that references a quarantined object not back at
// its key was acknowledged later than the settle time after the object's
// write: every quarantined object is restored, nothing is deleted, and the
// run fails with ErrSettleExceeded (Summary.LateReferences). Otherwise the
// other quarantined objects are deleted, the manifest last, and the records
// appended meanwhile are read once more: a reference to a deleted object
// is reported the same way (too late to keep it).
//
// The producers' half (payloadstore.Confirm): after the acknowledgement,
// Ferry's Producer, ferry produce and the proxy's large-message interceptor
// check each object the record references, copy it back from the
// quarantine, or publish it again from the bytes they still hold. With
// them, a record whose acknowledgement came after the settle time keeps its
// payload too (see below).
//
// Why this is safe: an acknowledged record R that references a quarantined
// object X either lies below E1, where the decision saw it (full read) or
// proves it deleted (checkpoint), or lies from E1 on. In the latter case, R
// was produced after the write (publish, copy or touch) of X it relies on.
// If it came after the move, a publish or copy put a new object at X's key
// (nothing to restore), and a touch failed on the missing object, so R was
// never produced. If the write came before the move: R appended before the
// recheck's high watermarks is seen by the recheck, which restores X; R
// appended during the recheck's read is seen by the late check, and nothing
// is deleted; R appended later (acknowledged more than the settle time
// after the write) finds X quarantined or gone when its producer confirms
// it after the acknowledgement, and the producer brings it back. A run that
// moves X after that confirmation takes its recheck's high watermarks after
// the move, above R, and restores X. What remains a timing rule: a producer
// that does not confirm (or dies between the broker's append and its
// confirmation) needs the settle rule; checkpoint mode, which does not read
// the records between its checkpoint and E1, needs the grace rule.
//
// A run that stops after moving (crash, kill, cancelled context) leaves its
// folder. The next run lists such folders before it lists the store, and
// finishes them with the same rule, reading from the smallest E1 of all
// folders; a folder without a readable manifest is restored whole, and one
// whose manifest names offsets past the partitions' ends (damaged: no run
// reads past a high watermark) is rechecked from the topic's start. When the
// recheck read fails (stall, corrupt reference), every quarantined object is
// restored and nothing is deleted.
//
// # Rules the operator keeps
//
//   - Grace (24h by default) must exceed the longest time between setting an
//     object's ModTime (publish, copy, touch) and the acknowledgement of the
//     record that references it: producer retries (delivery.timeout.ms) and,
//     for transactional producers, transaction.max.timeout.ms; plus the
//     clock skew between the payload store (ModTime) and gc's host (the
//     checkpoint's time, the cutoff). A payload published but not yet in
//     the log looks like an orphan; grace is what protects it from the full
//     read's point of view, and it is what the checkpoint proof rests on.
//   - Settle (10m by default) must exceed, for producers that do not
//     confirm their objects, the longest time between such a write and the
//     acknowledgement of the record (producer retries and batching; the
//     Java producer's delivery.timeout.ms of 120 s counts in full). For a
//     transactional record that is its produce, not the commit: the
//     recheck reads with read_uncommitted.
//   - Acknowledged means acks=all (the default of idempotent producers): a
//     record acknowledged before a checkpoint's time lies below the high
//     watermark read after it.
//
// Further rules:
//
//   - The store is listed before the topic is read, so an object written
//     while Collect runs is never a candidate of the full read.
//   - Objects newer than the grace period are never candidates.
//   - The full read goes to the last stable offset with read_uncommitted:
//     aborted records hold their payloads while they are in the log, and
//     records of transactions still open are read by the recheck.
//   - A read that does not complete (no progress for 3 polls of 10 s) is an
//     error; so is a record marked large-message (or large-message-key)
//     whose reference does not decode, naming its topic, partition and
//     offset. Collect never deletes when it cannot tell what is live.
//   - References and listed objects are matched on the object's name
//     "<topic>/<shard>/<id>", not on the whole full path, so a reference
//     written through another spelling of the store's root still keeps its
//     object; a reference into another store is otherwise ignored.
//   - Run one Collect per topic at a time. A run treats another run's
//     quarantine folder as left over; the rule above keeps that safe, but
//     the two runs then race for the same objects.
//
// What consumers see: an object a racing producer republishes (or a record
// that was produced within the settle time of its write) can be in
// quarantine for up to the settle time plus the recheck, and a consumer
// resolving such a record then gets ErrPayloadNotFound (the Deserializer
// does not retry it); after the restore it resolves. With a compacted topic,
// a consumer that replays the topic from its start may still meet an
// overwritten record that compaction has not removed yet, whose payload
// Collect deleted: it gets ErrPayloadNotFound
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
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/payloadstore"
)

// latestWrite is the latest time an object of ModTime m may have been
// written: stores that keep ModTimes to the second (S3, Azure) or the
// millisecond (GCS) cut off the rest, so an object written after a
// checkpoint within the same second would read as older than it. A whole
// second counts as its end (a whole millisecond likewise), so that the
// checkpoint proof never takes an object for older than the checkpoint when
// it was written after it.
func latestWrite(m time.Time) time.Time {
	switch ns := m.Nanosecond(); {
	case ns == 0:
		return m.Add(time.Second - time.Nanosecond)
	case ns%int(time.Millisecond) == 0:
		return m.Add(time.Millisecond - time.Nanosecond)
	}
	return m
}

// DefaultGrace is the grace period when Options.Grace is 0 and
// Options.GraceSet is false: one day.
const DefaultGrace = 24 * time.Hour

// DefaultSettle is the settle time when Options.Settle is 0 and
// Options.SettleSet is false: ten minutes, five times the Java producer's
// delivery.timeout.ms (120 s), the longest a producer that does not confirm
// its objects (Plan.Confirm) may take from its publish to the record's
// acknowledgement.
const DefaultSettle = 10 * time.Minute

// DefaultStoreConcurrency is the number of store operations (moves,
// restores, deletes) in flight when Options.StoreConcurrency is 0.
const DefaultStoreConcurrency = 16

// Read-loop bounds: a poll waits at most pollTimeout; when maxIdlePolls poll
// timeouts pass without a record of a pending partition, the read fails.
const (
	pollTimeout  = 10 * time.Second
	maxIdlePolls = 3
	// fetchMaxBytes and fetchMaxPartitionBytes bound one fetch response
	// of each reading client (bytes, compressed as stored). Records are
	// small references: 4 MiB is some 100,000 of them, and what a poll
	// returns is held in memory as franz-go records (docs/BENCHMARKS.md:
	// 64 MiB fetches doubled the peak heap and gained nothing).
	fetchMaxBytes          = 4 << 20
	fetchMaxPartitionBytes = 1 << 20
)

// Mode selects how Collect decides that an object is garbage.
type Mode string

const (
	// ModeAuto: checkpoint mode for a delete-policy topic that has a usable
	// checkpoint, the full read otherwise.
	ModeAuto Mode = "auto"
	// ModeFull: always read the whole topic.
	ModeFull Mode = "full"
	// ModeCheckpoint: never read the whole topic (delete-policy topics
	// only); without a usable checkpoint nothing is a candidate.
	ModeCheckpoint Mode = "checkpoint"
)

// ParseMode parses "auto" (or ""), "full" or "checkpoint".
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case "", ModeAuto:
		return ModeAuto, nil
	case ModeFull, ModeCheckpoint:
		return Mode(s), nil
	}
	return "", fmt.Errorf("gc: mode %q: want auto, full or checkpoint", s)
}

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
	// Settle: how long quarantined objects wait before the records
	// appended meanwhile are read. 0 means DefaultSettle (10m) unless
	// SettleSet is true.
	Settle time.Duration
	// SettleSet makes a Settle of 0 mean zero.
	SettleSet bool
	// Mode: ModeAuto ("" too), ModeFull or ModeCheckpoint.
	Mode Mode
	// Mirrors are topics of the same cluster whose records reference
	// Topic's objects: byte-for-byte copies of its records (MirrorMaker,
	// a replicator), which consumers resolve with
	// large.message.reference.resolve.topics. Their references keep
	// objects exactly like Topic's own: each is read in full with the topic
	// (by its own cleanup.policy) and in every recheck. With mirrors a run
	// always reads (ModeAuto goes to ModeFull; ModeCheckpoint is refused):
	// Topic's checkpoints say nothing of a mirror's retention.
	Mirrors []string
	// ReadWorkers: clients reading partitions in parallel, each over its
	// share of the partitions; 0 means max(2, GOMAXPROCS), at most 8.
	ReadWorkers int
	// StoreConcurrency: store operations in flight; 0 means
	// DefaultStoreConcurrency.
	StoreConcurrency int
	// DryRun: move and delete nothing and store no checkpoint (the
	// checkpoints are read);
	// Summary.Candidates lists what would be quarantined and deleted.
	DryRun bool
	// Now is gc's clock (time.Now when nil): the grace cutoff and the
	// checkpoints' times.
	Now func() time.Time
	// Progress, when set, is called as the run advances, from the calling
	// goroutine (the run waits for it). Phases in order: "list", "read"
	// (full read), "quarantine" (first call before anything is moved),
	// "settle" (first call after the last move), "recheck", "late" (once,
	// before the late check), "finish".
	Progress func(Progress)
}

// Progress is a snapshot of a running Collect.
type Progress struct {
	Phase       string
	Listed      int   // objects listed so far
	RecordsRead int64 // records read so far by the full read (control records excluded)
	Checked     int   // candidates handled so far (quarantine phase)
	Quarantined int   // objects moved to quarantine so far
	Rechecked   int64 // records read so far by the recheck
	Restored    int   // objects restored so far
	Deleted     int   // objects deleted so far
}

// Summary is what a Collect run found and did. For the objects listed by
// this run: Listed = Referenced + TooNew + Unproven + Changed + Restored +
// Deleted + Failed.
type Summary struct {
	// RunID names the run (its quarantine folder).
	RunID string
	// Compacted: the topic's cleanup.policy contains compact.
	Compacted bool
	// Mode: how the run decided, ModeFull or ModeCheckpoint.
	Mode Mode
	// Checkpoint: in checkpoint mode, the time of the usable checkpoint
	// that proves objects garbage (zero when there is none).
	Checkpoint time.Time
	// RecordsRead counts the records the full read read (control records
	// excluded); 0 in checkpoint mode.
	RecordsRead int64
	// Rechecked counts the records the recheck read (appended from E1 on).
	Rechecked int64
	// LiveReferences counts the distinct objects live records reference
	// (full read; matched on "<topic>/<shard>/<id>", whatever store root
	// the reference names).
	LiveReferences int
	// Listed counts the objects under the topic's prefix.
	Listed int
	// Referenced counts listed objects older than the grace period that a
	// live record references (kept; full read).
	Referenced int
	// TooNew counts listed objects within the grace period (kept whether
	// referenced or not).
	TooNew int
	// Unproven counts listed objects older than the grace period that no
	// usable checkpoint proves garbage (kept; checkpoint mode).
	Unproven int
	// Changed counts candidates republished, touched or removed between
	// the listing and the move (left, or put back at once).
	Changed int
	// Quarantined counts the objects moved to quarantine.
	Quarantined int
	// Restored counts quarantined objects moved back because a record
	// appended since E1 references them.
	Restored int
	// Deleted counts deleted objects (with DryRun: objects that would be
	// quarantined, and deleted unless a racing record restores them).
	Deleted int
	// BytesFreed is the size of the objects deleted by this run (of its
	// own quarantine), in bytes.
	BytesFreed int64
	// Failed counts objects a store operation failed on (left in place,
	// or in quarantine for the next run to finish).
	Failed int
	// Candidates are the objects deleted (with DryRun: that would be), by
	// their original full paths, in order.
	Candidates []payloadstore.ObjectInfo
	// RestoredObjects are the objects restored, in order.
	RestoredObjects []payloadstore.ObjectInfo
	// LeftoverRuns counts quarantine folders of earlier runs found (and,
	// unless DryRun, finished).
	LeftoverRuns int
	// LeftoverRestored and LeftoverDeleted count their objects restored
	// and deleted.
	LeftoverRestored, LeftoverDeleted int
	// LeftoverDeletedObjects are the objects of earlier runs' quarantine
	// deleted, by their original full paths, in order; LeftoverBytesFreed
	// is their size in bytes.
	LeftoverDeletedObjects []payloadstore.ObjectInfo
	LeftoverBytesFreed     int64
	// LateReferences are the records appended after the recheck's end
	// that reference an object of the quarantine not back at its key: the
	// settle rule was broken (ErrSettleExceeded). Deleted says the object
	// was deleted before the record was seen (found by the check after
	// the deletes; a producer that confirms its objects brings it back).
	LateReferences []LateReference
}

// LateReference is a record that referenced an object of gc's quarantine
// later than the settle rule allows (Summary.LateReferences).
type LateReference struct {
	Topic     string
	Partition int32
	Offset    int64
	Object    string // the object's full path
	Deleted   bool   // already deleted when the record was seen
}

// ErrSettleExceeded: a record was appended later than the settle time after
// the write of an object it references, which gc had quarantined meanwhile
// (Summary.LateReferences names them). Seen before the deletes, the run
// restores every quarantined object and deletes nothing; seen after, the
// objects are gone unless their producers confirm them (Ferry's Producer,
// ferry produce and the proxy do: docs/OPERATIONS.md §4). Raise --settle.
var ErrSettleExceeded = errors.New("gc: a record referencing a quarantined object was acknowledged after the settle time")

// Collect removes the objects of store under o.Topic's prefix that no live
// record of the topic references and that are older than the grace period
// (see the package documentation for the rules).
//
// cl is used for admin requests (Metadata, DescribeConfigs, ListOffsets);
// the topic is read by separate clients made from cl's options (seed
// brokers, TLS, SASL) plus direct partition consumption, so cl must not be a
// consumer-group client. store must offer payloadstore.ObjectStore (every
// store of package payloadstore does, wrapped or not).
//
// Errors: the topic does not exist, its offsets or configs cannot be read, a
// read stalls (no progress for 3 polls of 10 s; the error names the
// partition and offset), a record has a corrupt reference, or the store
// cannot list or write gc's objects. Before anything is quarantined, nothing
// is changed; after, a failed recheck restores everything. When some store
// operations fail, the others still happen and the error says how many
// failed. A cancelled ctx leaves the quarantine for the next run. The
// Summary is returned in every case.
func Collect(ctx context.Context, cl *kgo.Client, store payloadstore.PayloadStore, o Options) (Summary, error) {
	var sum Summary
	if o.Topic == "" {
		return sum, errors.New("gc: no topic given")
	}
	if o.Grace < 0 {
		return sum, fmt.Errorf("gc: grace %s is negative", o.Grace)
	}
	if o.Settle < 0 {
		return sum, fmt.Errorf("gc: settle %s is negative", o.Settle)
	}
	mode, err := ParseMode(string(o.Mode))
	if err != nil {
		return sum, err
	}
	grace := o.Grace
	if grace == 0 && !o.GraceSet {
		grace = DefaultGrace
	}
	settle := o.Settle
	if settle == 0 && !o.SettleSet {
		settle = DefaultSettle
	}
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	r := &run{o: o, cl: cl, ps: store, sum: &sum, keepsVersion: moveKeepsVersion(store), settle: settle,
		readWorkers: o.ReadWorkers, storeWorkers: o.StoreConcurrency}
	if r.readWorkers <= 0 {
		r.readWorkers = defaultWorkers()
	}
	if r.storeWorkers <= 0 {
		r.storeWorkers = DefaultStoreConcurrency
	}
	if r.g, err = newGCStore(store, o.Topic); err != nil {
		return sum, err
	}
	adm := kadm.NewClient(cl)
	r.adm = adm

	// 1. The topic: its cleanup.policy and id.
	compacted, err := isCompacted(ctx, adm, o.Topic)
	if err != nil {
		return sum, err
	}
	sum.Compacted = compacted
	if compacted && mode == ModeCheckpoint {
		return sum, fmt.Errorf("gc: topic %s is compacted: checkpoint mode needs cleanup.policy=delete", o.Topic)
	}
	topicID, err := topicIDOf(ctx, adm, o.Topic)
	if err != nil {
		return sum, err
	}
	r.topicID = topicID
	mirrorCompacted := map[string]bool{}
	for _, m := range o.Mirrors {
		if m == o.Topic || mirrorCompacted[m] {
			return sum, fmt.Errorf("gc: mirror %s: named twice, or the topic itself", m)
		}
		if mirrorCompacted[m], err = isCompacted(ctx, adm, m); err != nil {
			return sum, fmt.Errorf("%w (a mirror of %s)", err, o.Topic)
		}
	}
	if len(o.Mirrors) > 0 && mode == ModeCheckpoint {
		return sum, fmt.Errorf("gc: topic %s has mirrors: checkpoint mode cannot see their records; use full", o.Topic)
	}

	// 2. gc's clock, then the high watermarks (this order makes them a
	// checkpoint), and the log start offsets.
	start := now()
	sum.RunID = newRunID(start)
	hw, err := listOffsets(ctx, o.Topic, "end offsets", adm.ListEndOffsets)
	if err != nil {
		return sum, err
	}
	logStart, err := listOffsets(ctx, o.Topic, "start offsets", adm.ListStartOffsets)
	if err != nil {
		return sum, err
	}

	// 3. Checkpoints (delete policy), stored before anything is decided.
	var proof *checkpoint
	if !compacted {
		cps, err := r.g.loadCheckpoints(ctx, topicID)
		if err != nil && !o.DryRun {
			return sum, err
		}
		// A checkpoint from the future (gc's clock was ahead then) would
		// prove too much: dropped.
		cps = slices.DeleteFunc(cps, func(c checkpoint) bool { return c.Time.After(start) })
		cps = append(cps, checkpoint{Time: start, Offsets: hw})
		if c, ok := newestPassed(cps, logStart); ok {
			proof = &c
		}
		if !o.DryRun {
			if err := r.g.saveCheckpoints(ctx, topicID, pruneCheckpoints(cps, logStart)); err != nil {
				return sum, err
			}
		}
	}
	if mode == ModeAuto {
		mode = ModeFull
		if proof != nil && len(o.Mirrors) == 0 {
			mode = ModeCheckpoint
		}
	}
	sum.Mode = mode
	if mode == ModeCheckpoint && proof != nil {
		sum.Checkpoint = proof.Time
	}

	// 4. Quarantine folders left by earlier runs.
	leftovers, err := r.g.listLeftovers(ctx, !o.DryRun)
	if err != nil {
		return sum, err
	}
	leftoversListed := time.Now()
	sum.LeftoverRuns = len(leftovers)
	if !o.DryRun {
		r.g.removeTouchLeftovers(ctx, now())
	}

	// 5. List the store before reading: an object written after this is
	// never a candidate of the full read.
	// In checkpoint mode the proof is known already: objects are decided
	// as they are listed, and only candidates are kept in memory.
	cutoff := now().Add(-grace)
	var old, cands []payloadstore.ObjectInfo
	err = payloadstore.List(ctx, store, o.Topic, func(oi payloadstore.ObjectInfo) error {
		sum.Listed++
		switch {
		case !oi.ModTime.Before(cutoff):
			sum.TooNew++
		case mode == ModeFull:
			old = append(old, oi)
		case proof != nil && !latestWrite(oi.ModTime).Add(grace).After(proof.Time):
			cands = append(cands, oi)
		default:
			sum.Unproven++
		}
		if sum.Listed%1000 == 0 {
			r.report(Progress{Phase: "list"})
		}
		return nil
	})
	if err != nil {
		return sum, fmt.Errorf("gc: listing the payloads of topic %s: %w", o.Topic, err)
	}
	r.report(Progress{Phase: "list"})

	// 6. Decide.
	var e1 offsets
	var me1 map[string]offsets // mirrors' E1
	if mode == ModeCheckpoint {
		e1 = hw
	} else {
		live, n, end, err := readLive(ctx, cl, adm, o.Topic, compacted, r.readWorkers, func(n int64) {
			sum.RecordsRead = n
			r.report(Progress{Phase: "read"})
		})
		sum.RecordsRead = n
		if err != nil {
			if ctx.Err() != nil {
				return sum, ctx.Err()
			}
			return sum, fmt.Errorf("%w; nothing deleted", err)
		}
		e1 = end
		for _, m := range o.Mirrors {
			base := sum.RecordsRead
			mlive, mn, mend, err := readLive(ctx, cl, adm, m, mirrorCompacted[m], r.readWorkers, func(n int64) {
				sum.RecordsRead = base + n
				r.report(Progress{Phase: "read"})
			})
			sum.RecordsRead = base + mn
			if err != nil {
				if ctx.Err() != nil {
					return sum, ctx.Err()
				}
				return sum, fmt.Errorf("mirror %s: %w; nothing deleted", m, err)
			}
			for name := range mlive {
				live[name] = struct{}{}
			}
			if me1 == nil {
				me1 = map[string]offsets{}
			}
			me1[m] = mend
		}
		sum.LiveReferences = len(live)
		for _, oi := range old {
			if _, ok := live[objectName(oi.FullPath)]; ok {
				sum.Referenced++
			} else {
				cands = append(cands, oi)
			}
		}
	}
	slices.SortFunc(cands, byPath)

	if o.DryRun {
		sum.Candidates = cands
		sum.Deleted = len(cands)
		for _, c := range cands {
			sum.BytesFreed += c.Size
		}
		return sum, nil
	}

	// 7. Quarantine the candidates.
	own, lastMove, err := r.quarantine(ctx, cands, manifest{Version: 1, Run: sum.RunID, Topic: o.Topic, TopicID: topicID, Mode: mode, Start: start, E1: e1, Mirrors: me1})
	if err != nil {
		return sum, err
	}

	// 8. Wait, recheck, restore what is referenced, delete the rest.
	var all []qobj
	for _, q := range own {
		q.e1, q.me1 = e1, me1
		all = append(all, q)
	}
	runs := map[string]bool{}
	if len(own) > 0 {
		runs[sum.RunID] = true
	}
	for _, lr := range leftovers {
		var le1 offsets // nil: no manifest, restore unconditionally
		var lme1 map[string]offsets
		if lr.manifest != nil {
			runs[lr.run] = true
			le1 = lr.manifest.E1
			if le1 == nil || (lr.manifest.TopicID != "" && topicID != "" && lr.manifest.TopicID != topicID) || beyond(le1, hw) {
				// Another incarnation of the topic, or offsets no run
				// could have read to (a damaged manifest): from its start.
				le1 = offsets{}
			}
			for m, me := range lr.manifest.Mirrors {
				if !slices.Contains(o.Mirrors, m) {
					continue // not read by this run
				}
				ends, err := listOffsets(ctx, m, "end offsets", adm.ListEndOffsets)
				if err != nil || beyond(me, ends) {
					if lme1 == nil {
						lme1 = map[string]offsets{}
					}
					continue // from the mirror's start
				}
				if lme1 == nil {
					lme1 = map[string]offsets{}
				}
				lme1[m] = me
			}
		}
		for _, q := range lr.objs {
			q.e1, q.me1 = le1, lme1
			all = append(all, q)
		}
	}
	if len(all) == 0 {
		for run := range runs {
			_ = r.g.removeManifest(ctx, run) // empty folders of earlier runs
		}
		return sum, r.failures()
	}
	wait := lastMove
	if len(leftovers) > 0 && leftoversListed.After(wait) {
		wait = leftoversListed
	}
	return sum, r.finish(ctx, all, runs, wait.Add(settle))
}

// beyond reports whether e1 names an offset past a partition's end in ends
// (or a partition ends does not have): no run reads past a high watermark,
// so such a manifest is damaged, or of another incarnation of the topic.
func beyond(e1, ends offsets) bool {
	for p, off := range e1 {
		end, ok := ends[p]
		if !ok || off > end || off < 0 {
			return true
		}
	}
	return false
}

// run is the state of one Collect.
type run struct {
	o                         Options
	cl                        *kgo.Client
	adm                       *kadm.Client
	ps                        payloadstore.PayloadStore
	g                         *gcStore
	sum                       *Summary
	topicID                   string
	keepsVersion              bool
	settle                    time.Duration
	readWorkers, storeWorkers int

	mu         sync.Mutex
	firstErr   error
	nFailed    int
	failedRuns map[string]bool // runs with an object not handled: their manifests stay
}

// report calls Options.Progress with p, whose phase-specific counts the
// caller sets, completed with the run's totals so far.
func (r *run) report(p Progress) {
	if r.o.Progress == nil {
		return
	}
	p.Listed, p.RecordsRead, p.Rechecked = r.sum.Listed, r.sum.RecordsRead, r.sum.Rechecked
	if p.Quarantined == 0 {
		p.Quarantined = r.sum.Quarantined
	}
	r.o.Progress(p)
}

// fail records a failed store operation.
func (r *run) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nFailed++
	if r.firstErr == nil {
		r.firstErr = err
	}
}

func (r *run) markRunFailed(run string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failedRuns == nil {
		r.failedRuns = map[string]bool{}
	}
	r.failedRuns[run] = true
}

func (r *run) runFailed(run string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failedRuns[run]
}

// failures is the run's error for its failed store operations, if any.
func (r *run) failures() error {
	if r.nFailed == 0 {
		return nil
	}
	return fmt.Errorf("gc: %d store operations failed (objects left in place or in quarantine for the next run), first: %w", r.nFailed, r.firstErr)
}

func byPath(a, b payloadstore.ObjectInfo) int { return strings.Compare(a.FullPath, b.FullPath) }

// quarantine stores the run's manifest and moves cands to the run's folder.
// It returns the objects moved and the time of the last move.
func (r *run) quarantine(ctx context.Context, cands []payloadstore.ObjectInfo, m manifest) ([]qobj, time.Time, error) {
	if len(cands) == 0 {
		return nil, time.Time{}, nil
	}
	if err := r.g.put(ctx, quarantineDir+m.Run+"/"+manifestName, m); err != nil {
		return nil, time.Time{}, err
	}
	r.report(Progress{Phase: "quarantine"})
	type result struct {
		q   qobj
		out moveOutcome
		at  time.Time
	}
	res := make([]result, len(cands))
	var mu sync.Mutex
	checked, quarantined := 0, 0
	parallel(ctx, len(cands), r.storeWorkers, func(i int) {
		q, out, err := r.g.quarantineOne(ctx, m.Run, cands[i], r.keepsVersion)
		res[i] = result{q: q, out: out, at: time.Now()}
		if out == failed {
			r.fail(err)
		}
		mu.Lock()
		checked++
		if out == moved {
			quarantined++
		}
		mu.Unlock()
	}, func() {
		mu.Lock()
		p := Progress{Phase: "quarantine", Checked: checked, Quarantined: quarantined}
		mu.Unlock()
		r.report(p)
	})
	var own []qobj
	var last time.Time
	for _, x := range res {
		if x.at.IsZero() {
			continue // not started: ctx is done
		}
		switch x.out {
		case moved:
			own = append(own, x.q)
			r.sum.Quarantined++
			if x.at.After(last) {
				last = x.at
			}
		case changed:
			r.sum.Changed++
		case failed:
			r.sum.Failed++
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, last, err // the manifest stays: the next run finishes the folder
	}
	if len(own) == 0 {
		_ = r.g.removeManifest(ctx, m.Run)
	}
	return own, last, nil
}

// finish waits until deadline, reads the records appended from the smallest
// E1 of all to the current high watermarks, restores the objects of all that
// a record references (or that have no E1) and deletes the others, then
// removes the manifests of runs whose objects were all handled.
func (r *run) finish(ctx context.Context, all []qobj, runs map[string]bool, deadline time.Time) error {
	r.report(Progress{Phase: "settle"})
	if d := time.Until(deadline); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}

	// The recheck: every topic whose records may reference the objects,
	// from the smallest E1 of all (a mirror an object's run did not read:
	// from its start) to the current high watermarks.
	topics := append([]string{r.o.Topic}, r.o.Mirrors...)
	referenced := map[string]bool{}
	names := map[string]bool{}
	froms := map[string]offsets{}
	for _, q := range all {
		if q.e1 == nil {
			continue
		}
		names[q.name] = true
		for _, tp := range topics {
			e1, ok := q.e1, true
			if tp != r.o.Topic {
				e1, ok = q.me1[tp]
				if !ok {
					e1 = offsets{}
				}
			}
			from, seen := froms[tp]
			if !seen {
				from = offsets{}
				for p, off := range e1 {
					from[p] = off
				}
				froms[tp] = from
				continue
			}
			for p := range from {
				from[p] = min(from[p], e1[p]) // a partition e1 does not name: 0
			}
		}
	}
	restoreAll := func(err error) error {
		for i := range all {
			all[i].e1 = nil
		}
		r.apply(ctx, all, referenced)
		for run := range runs {
			if !r.runFailed(run) {
				_ = r.g.removeManifest(ctx, run)
			}
		}
		return fmt.Errorf("%w; every quarantined object restored, nothing deleted", err)
	}
	var ends map[string]offsets
	if len(names) > 0 {
		found, e2, err := r.scanAll(ctx, "recheck", froms, names)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// Cannot tell what the appended records reference: put
			// everything back.
			return restoreAll(err)
		}
		for name := range found {
			referenced[name] = true
		}
		// The late check, before anything is deleted: a record appended
		// while the recheck read that references a quarantined object
		// not back at its key was acknowledged later than the settle
		// time after that object's write. The rule is broken: nothing
		// is deleted.
		r.report(Progress{Phase: "late"})
		rest := map[string]bool{}
		for name := range names {
			if !referenced[name] {
				rest[name] = true
			}
		}
		late, e3, err := r.scanAll(ctx, "late", e2, rest)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return restoreAll(err)
		}
		ends = e3
		if len(late) > 0 {
			broken := r.lateReferences(ctx, all, late, false)
			for name := range late {
				referenced[name] = true
			}
			if len(broken) > 0 {
				r.sum.LateReferences = broken
				return restoreAll(fmt.Errorf("%w: %s", ErrSettleExceeded, describeLate(broken, r.settle)))
			}
		}
	}
	deleted := r.apply(ctx, all, referenced)
	if err := ctx.Err(); err != nil {
		return err
	}
	for run := range runs {
		if !r.runFailed(run) {
			if err := r.g.removeManifest(ctx, run); err != nil {
				r.fail(err)
			}
		}
	}
	// The check after the deletes: records appended meanwhile that
	// reference a deleted object. Reported, not undone (the bytes are
	// gone; a producer that confirms its objects publishes them again).
	if len(deleted) > 0 && ends != nil {
		late, _, err := r.scanAll(ctx, "", ends, deleted)
		if err == nil && len(late) > 0 {
			if broken := r.lateReferences(ctx, all, late, true); len(broken) > 0 {
				r.sum.LateReferences = broken
				return errors.Join(fmt.Errorf("%w: %s", ErrSettleExceeded, describeLate(broken, r.settle)), r.failures())
			}
		}
	}
	return r.failures()
}

// lateReferences returns, for each object of all whose name late names,
// a LateReference unless the object is at its key again (republished, or
// brought back by its producer: then nothing was lost and no rule broken).
func (r *run) lateReferences(ctx context.Context, all []qobj, late map[string]refAt, deleted bool) []LateReference {
	var out []LateReference
	seen := map[string]bool{}
	for _, q := range all {
		at, ok := late[q.name]
		if !ok || seen[q.name] {
			continue
		}
		seen[q.name] = true
		if _, err := r.g.ops.Stat(ctx, q.key); err == nil {
			continue
		}
		out = append(out, LateReference{Topic: at.topic, Partition: at.partition, Offset: at.offset, Object: q.info.FullPath, Deleted: deleted})
	}
	slices.SortFunc(out, func(a, b LateReference) int { return strings.Compare(a.Object, b.Object) })
	return out
}

// describeLate names the first late references for an error message.
func describeLate(ls []LateReference, settle time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d object(s) referenced by records appended after the recheck (settle %s)", len(ls), settle)
	for i, l := range ls {
		if i == 3 {
			fmt.Fprintf(&b, ", and %d more", len(ls)-3)
			break
		}
		fmt.Fprintf(&b, "; topic %s partition %d offset %d references %s", l.Topic, l.Partition, l.Offset, l.Object)
		if l.Deleted {
			b.WriteString(" (deleted)")
		}
	}
	return b.String()
}

// refAt is the position of a record.
type refAt struct {
	topic     string
	partition int32
	offset    int64
}

// scanAll scans each topic of froms (scan) and returns the first record
// found for each name, and the offsets each topic was read to.
func (r *run) scanAll(ctx context.Context, phase string, froms map[string]offsets, names map[string]bool) (map[string]refAt, map[string]offsets, error) {
	found := map[string]refAt{}
	ends := map[string]offsets{}
	for _, tp := range append([]string{r.o.Topic}, r.o.Mirrors...) {
		from, ok := froms[tp]
		if !ok {
			from = offsets{}
		}
		f, end, err := r.scan(ctx, phase, tp, from, names)
		if err != nil {
			return nil, nil, err
		}
		ends[tp] = end
		for name, at := range f {
			if _, dup := found[name]; !dup {
				found[name] = at
			}
		}
	}
	return found, ends, nil
}

// scan reads the records of topic from `from` (per partition, no lower
// than the log start offset) to the current high watermarks with
// read_uncommitted, and returns, for each of names that a record's key or
// value reference names, the first such record, and the high watermarks it
// read to. Its progress is reported as phase ("": not reported).
func (r *run) scan(ctx context.Context, phase, topic string, from offsets, names map[string]bool) (map[string]refAt, offsets, error) {
	e2, err := listOffsets(ctx, topic, "end offsets", r.adm.ListEndOffsets)
	if err != nil {
		return nil, nil, err
	}
	if len(names) == 0 {
		return nil, e2, nil
	}
	ls, err := listOffsets(ctx, topic, "start offsets", r.adm.ListStartOffsets)
	if err != nil {
		return nil, nil, err
	}
	spans := make(map[int32]span, len(e2))
	for p, end := range e2 {
		spans[p] = span{start: max(from[p], ls[p]), end: end}
	}
	gs := groups(spans, r.readWorkers)
	found := make([]map[string]refAt, len(gs))
	for i := range found {
		found[i] = map[string]refAt{}
	}
	base := r.sum.Rechecked
	n, err := readGroups(ctx, r.cl, topic, spans, gs, func(g int, rec *kgo.Record) error {
		kp, vp, err := references(rec)
		if err != nil {
			return err
		}
		for _, p := range []string{kp, vp} {
			if p == "" || !names[objectName(p)] {
				continue
			}
			if _, ok := found[g][objectName(p)]; !ok {
				found[g][objectName(p)] = refAt{rec.Topic, rec.Partition, rec.Offset}
			}
		}
		return nil
	}, func(n int64) {
		r.sum.Rechecked = base + n
		if phase != "" {
			r.report(Progress{Phase: phase})
		}
	})
	r.sum.Rechecked = base + n
	if err != nil {
		return nil, nil, err
	}
	out := map[string]refAt{}
	for _, f := range found {
		for name, at := range f {
			out[name] = at
		}
	}
	return out, e2, nil
}

// apply restores every object of all that has no E1 or whose name is
// referenced, and deletes the others.
func (r *run) apply(ctx context.Context, all []qobj, referenced map[string]bool) map[string]bool {
	deleted := map[string]bool{}
	type result struct {
		restore, done bool
		err           error
	}
	res := make([]result, len(all))
	var mu sync.Mutex
	restored, nDeleted := 0, 0
	parallel(ctx, len(all), r.storeWorkers, func(i int) {
		q := all[i]
		restore := q.e1 == nil || referenced[q.name]
		var err error
		if restore {
			err = r.g.restoreOne(ctx, q, r.keepsVersion)
		} else {
			err = r.g.ops.Remove(ctx, q.qkey)
		}
		res[i] = result{restore: restore, done: true, err: err}
		mu.Lock()
		if err == nil && restore {
			restored++
		} else if err == nil {
			nDeleted++
		}
		mu.Unlock()
	}, func() {
		mu.Lock()
		p := Progress{Phase: "finish", Restored: restored, Deleted: nDeleted}
		mu.Unlock()
		r.report(p)
	})
	for i, x := range res {
		q := all[i]
		if !x.done {
			r.markRunFailed(q.run)
			continue
		}
		if x.err != nil {
			r.fail(x.err)
			r.markRunFailed(q.run)
			if q.run == r.sum.RunID {
				r.sum.Failed++
			}
			continue
		}
		own := q.run == r.sum.RunID
		if !x.restore {
			deleted[q.name] = true
		}
		switch {
		case x.restore && own:
			r.sum.Restored++
			r.sum.RestoredObjects = append(r.sum.RestoredObjects, q.info)
		case x.restore:
			r.sum.LeftoverRestored++
			r.sum.RestoredObjects = append(r.sum.RestoredObjects, q.info)
		case own:
			r.sum.Deleted++
			r.sum.BytesFreed += q.info.Size
			r.sum.Candidates = append(r.sum.Candidates, q.info)
		default:
			r.sum.LeftoverDeleted++
			r.sum.LeftoverBytesFreed += q.info.Size
			r.sum.LeftoverDeletedObjects = append(r.sum.LeftoverDeletedObjects, q.info)
		}
	}
	slices.SortFunc(r.sum.Candidates, byPath)
	slices.SortFunc(r.sum.LeftoverDeletedObjects, byPath)
	slices.SortFunc(r.sum.RestoredObjects, byPath)
	return deleted
}

// topicIDOf returns the topic's id ("" when the broker has none).
func topicIDOf(ctx context.Context, adm *kadm.Client, topic string) (string, error) {
	md, err := adm.Metadata(ctx, topic)
	if err != nil {
		return "", fmt.Errorf("gc: topic %s: metadata: %w", topic, err)
	}
	td, ok := md.Topics[topic]
	if !ok || td.Err != nil {
		if ok && !errors.Is(td.Err, kerr.UnknownTopicOrPartition) {
			return "", fmt.Errorf("gc: topic %s: metadata: %w", topic, td.Err)
		}
		return "", fmt.Errorf("gc: topic %s does not exist", topic)
	}
	if td.ID == (kadm.TopicID{}) {
		return "", nil
	}
	return td.ID.String(), nil
}

// moveKeepsVersion reports whether store's Move keeps the object's Version
// (and ModTime): a rename in the file store, a map move in the mem store.
// The cloud stores copy, which gives the copy a new ModTime. An encrypted
// store moves its sealed objects with the store under it.
func moveKeepsVersion(store payloadstore.PayloadStore) bool {
	switch payloadstore.Underlying(store).(type) {
	case *payloadstore.FileStore, *payloadstore.MemStore:
		return true
	}
	return false
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
