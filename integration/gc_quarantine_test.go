package integration

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/lifecycle"
	"github.com/ferrykit/ferry/payloadstore"
)

// contentIDEnv is a store and producer with content ids for values.
func contentIDEnv(t *testing.T, storeURL string) *env {
	cfg := largemessage.DefaultConfig()
	cfg.StoreURL = storeURL
	cfg.Threshold = gcThreshold
	cfg.IDGenerator = payloadstore.IDSHA256{}
	return envWith(t, cfg)
}

// resolves checks that r, as consumed, resolves to value.
func resolves(t *testing.T, e *env, topic string, r *kgo.Record, value []byte) {
	t.Helper()
	for _, got := range readAll(t, topic) {
		if got.Partition != r.Partition || got.Offset != r.Offset {
			continue
		}
		if err := largemessage.NewDeserializer(e.store, false).Resolve(ctxT(t, time.Minute), got); err != nil {
			t.Fatalf("offset %d: %v", r.Offset, err)
		}
		if !bytes.Equal(got.Value, value) {
			t.Fatalf("offset %d resolved to other bytes", r.Offset)
		}
		return
	}
	t.Fatalf("offset %d not found", r.Offset)
}

func quarantined(t *testing.T, s payloadstore.PayloadStore, topic string) []string {
	t.Helper()
	ops, err := payloadstore.Objects(s)
	if err != nil {
		t.Fatal(err)
	}
	prefix, _ := payloadstore.GCPrefix(topic)
	var keys []string
	if err := ops.ListKeys(ctxT(t, time.Minute), prefix+"q/", func(k string, _ payloadstore.ObjectInfo) error {
		keys = append(keys, k)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return keys
}

// The race: an orphan under a content id (a produce that failed)
// is listed and found garbage; then a producer publishes the same bytes
// again and its record is acknowledged, before gc moves the object
// ("quarantine") or after ("settle"). The acknowledged record must resolve
// after gc; nothing is deleted.
func TestGCContentIDRepublishedFileStore(t *testing.T) { gcContentIDRepublished(t, fileStoreURL(t)) }
func TestGCContentIDRepublishedS3(t *testing.T) {
	gcContentIDRepublished(t, storetest.S3URL(t, "ferry-gc"))
}

func TestGCContentIDRepublishedGCS(t *testing.T) {
	gcContentIDRepublished(t, storetest.GCSURL(t, "ferry-gc"))
}
func TestGCContentIDRepublishedAzure(t *testing.T) {
	gcContentIDRepublished(t, storetest.AzureURL(t, "ferry-gc"))
}

func gcContentIDRepublished(t *testing.T, storeURL string) {
	for _, phase := range []string{"quarantine", "settle"} {
		t.Run(phase, func(t *testing.T) {
			e := contentIDEnv(t, storeURL)
			topic := newTopic(t, nil)
			payload := randomBytes(4001, 5000)
			orphan, err := payloadstore.PublishBytes(ctxT(t, time.Minute), e.store, topic, payload)
			if err != nil {
				t.Fatal(err)
			}
			// S3 and Azure keep modification times to the second, and gc
			// takes an object of its checkpoint's own second for written
			// after it (never provably garbage): gc starts in the next one.
			time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
			rec := &kgo.Record{Topic: topic, Value: payload}
			sum := collect(t, e, lifecycle.Options{Topic: topic, GraceSet: true, Progress: func(p lifecycle.Progress) {
				if p.Phase == phase && rec.Value != nil && !largemessage.IsOffloaded(rec) {
					produceOK(t, e, rec)
				}
			}})
			if valuePath(t, rec) != orphan.FullPayloadPath {
				t.Fatalf("republished to %s, want the orphan's path %s", valuePath(t, rec), orphan.FullPayloadPath)
			}
			if sum.Deleted != 0 || sum.Changed+sum.Restored != 1 {
				t.Fatalf("summary %+v: want the object kept (changed) or restored", sum)
			}
			if phase == "settle" && (sum.Restored != 1 || sum.Rechecked != 1) {
				t.Fatalf("summary %+v: want the object restored by the recheck", sum)
			}
			resolves(t, e, topic, rec, payload)
			if q := quarantined(t, e.store, topic); len(q) != 0 {
				t.Fatalf("quarantine holds %v after the run", q)
			}
		})
	}
}

// A run interrupted after moving (its context cancelled during the settle
// time, as a crash would) leaves its quarantine folder and manifest; a
// record is then produced that references one of the quarantined objects (a
// slow producer: published before gc listed). The next run finds the
// folder, reads from the interrupted run's E1, restores that object and
// deletes the other.
func TestGCInterruptedRunS3(t *testing.T) {
	e := storeEnv(t, storetest.S3URL(t, "ferry-gc"))
	topic := newTopic(t, nil)
	live := &kgo.Record{Topic: topic, Value: randomBytes(4101, 4000)}
	produceOK(t, e, live)
	slowValue := randomBytes(4102, 4000)
	slow := &kgo.Record{Topic: topic, Value: slowValue}
	if _, err := e.prod.Prepare(ctxT(t, time.Minute), slow); err != nil {
		t.Fatal(err)
	}
	orphan, _ := orphans(t, e.store, topic, 4103, 1)
	ctx, cancel := context.WithCancel(ctxT(t, 3*time.Minute))
	sum, err := lifecycle.Collect(ctx, client(t), e.store, lifecycle.Options{Topic: topic, GraceSet: true, Settle: time.Minute, SettleSet: true,
		Progress: func(p lifecycle.Progress) {
			if p.Phase == "settle" {
				cancel()
			}
		}})
	if !errors.Is(err, context.Canceled) || sum.Quarantined != 2 || sum.Deleted != 0 {
		t.Fatalf("interrupted run: %v, %+v", err, sum)
	}
	if q := quarantined(t, e.store, topic); len(q) != 3 || !slices.ContainsFunc(q, func(k string) bool { return strings.HasSuffix(k, "/manifest.json") }) {
		t.Fatalf("quarantine after the interrupted run: %v", q)
	}
	if exists(t, e.store, valuePath(t, slow)) {
		t.Fatal("the slow record's object is not in quarantine")
	}
	if err := e.prod.Client().ProduceSync(ctxT(t, time.Minute), slow).FirstErr(); err != nil {
		t.Fatal(err)
	}

	sum = collect(t, e, lifecycle.Options{Topic: topic, Grace: time.Hour})
	if sum.LeftoverRuns != 1 || sum.LeftoverRestored != 1 || sum.LeftoverDeleted != 1 || sum.Rechecked < 1 ||
		len(sum.RestoredObjects) != 1 || sum.RestoredObjects[0].FullPath != valuePath(t, slow) {
		t.Fatalf("next run: %+v", sum)
	}
	if exists(t, e.store, orphan[0]) || !exists(t, e.store, valuePath(t, live)) {
		t.Fatal("the orphan was kept, or the live object deleted")
	}
	resolves(t, e, topic, slow, slowValue)
	if q := quarantined(t, e.store, topic); len(q) != 0 {
		t.Fatalf("quarantine holds %v after the next run", q)
	}
}

// Checkpoint mode on a delete-policy topic: the first run reads the topic
// (no checkpoint yet) and stores one; runs in checkpoint mode read no record
// and delete nothing until retention (DeleteRecords here) has moved every
// partition's log start offset past a checkpoint; then the objects older
// than that checkpoint by the grace go, still without reading the topic,
// and newer ones stay. A record re-produced (same-topic reference: a touch)
// while its object is in quarantine is refused.
func TestGCCheckpointMode(t *testing.T) {
	e := storeEnv(t, fileStoreURL(t))
	topic := newTopicPartitions(t, 3, nil)
	var old []*kgo.Record
	for i := range 6 {
		old = append(old, &kgo.Record{Topic: topic, Partition: int32(i % 3), Value: randomBytes(uint64(4200+i), 3000)})
	}
	e2 := storeEnv(t, e.cfg.StoreURL, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	produceOK(t, e2, old...)
	orphan, _ := orphans(t, e.store, topic, 4300, 1)
	o := lifecycle.Options{Topic: topic, GraceSet: true}

	first := collect(t, e, o)
	if first.Mode != lifecycle.ModeFull || first.RecordsRead != 6 || first.Deleted != 1 || !first.Checkpoint.IsZero() {
		t.Fatalf("first run: %+v", first)
	}
	o.Mode = lifecycle.ModeCheckpoint
	before := collect(t, e, o)
	if before.RecordsRead != 0 || before.Rechecked != 0 || before.Unproven != 6 || before.Deleted != 0 || before.Quarantined != 0 {
		t.Fatalf("checkpoint run before retention: %+v", before)
	}
	// Retention passes the checkpoints; then newer records arrive.
	adm := kadm.NewClient(client(t))
	ends, err := adm.ListEndOffsets(ctxT(t, time.Minute), topic)
	if err != nil {
		t.Fatal(err)
	}
	var offs kadm.Offsets
	ends.Each(func(lo kadm.ListedOffset) {
		offs.Add(kadm.Offset{Topic: topic, Partition: lo.Partition, At: lo.Offset})
	})
	if _, err := adm.DeleteRecords(ctxT(t, time.Minute), offs); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	freshValue := randomBytes(4400, 3000)
	fresh := &kgo.Record{Topic: topic, Partition: 1, Value: freshValue}
	produceOK(t, e2, fresh)

	var refused error
	sum := collect(t, e, lifecycle.Options{Topic: topic, GraceSet: true, Progress: func(p lifecycle.Progress) {
		if p.Phase == "settle" && refused == nil {
			// A consumer of the deleted record re-produces it.
			r := &kgo.Record{Topic: topic, Value: old[0].Value, Headers: old[0].Headers}
			refused = e.prod.ProduceSync(ctxT(t, time.Minute), r).FirstErr()
			if refused == nil {
				t.Error("a record whose object is in quarantine was re-produced")
			}
		}
	}})
	if !errors.Is(refused, payloadstore.ErrPayloadNotFound) {
		t.Fatalf("re-produce during the quarantine: %v, want ErrPayloadNotFound", refused)
	}
	if sum.Mode != lifecycle.ModeCheckpoint || sum.RecordsRead != 0 || sum.Rechecked != 0 || sum.Deleted != 6 || sum.Unproven != 1 || sum.Checkpoint.IsZero() {
		t.Fatalf("checkpoint run after retention: %+v", sum)
	}
	for _, r := range old {
		if exists(t, e.store, valuePath(t, r)) {
			t.Fatalf("object of deleted record %d kept", r.Offset)
		}
	}
	resolves(t, e, topic, fresh, freshValue)
	if exists(t, e.store, orphan[0]) {
		t.Fatal("the orphan survived the first run")
	}
}

// A compacted topic over four partitions read by three clients: only the
// latest value per key (per partition) is live.
func TestGCCompactedPartitionsInParallel(t *testing.T) {
	compact := "compact"
	e := storeEnv(t, fileStoreURL(t), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	topic := newTopicPartitions(t, 4, map[string]*string{"cleanup.policy": &compact})
	var recs []*kgo.Record
	var keep, gone []int
	for p := range int32(4) {
		for i := range 3 {
			recs = append(recs, &kgo.Record{Topic: topic, Partition: p, Key: []byte("k"), Value: randomBytes(uint64(4500+int(p)*10+i), 2000)})
			if i == 2 {
				keep = append(keep, len(recs)-1)
			} else {
				gone = append(gone, len(recs)-1)
			}
		}
	}
	produceOK(t, e, recs...)
	sum := collect(t, e, lifecycle.Options{Topic: topic, GraceSet: true, ReadWorkers: 3})
	if !sum.Compacted || sum.Mode != lifecycle.ModeFull || sum.RecordsRead != 12 || sum.Referenced != 4 || sum.Deleted != 8 {
		t.Fatalf("summary %+v", sum)
	}
	for _, i := range keep {
		if !exists(t, e.store, valuePath(t, recs[i])) {
			t.Fatalf("latest value of partition %d deleted", recs[i].Partition)
		}
	}
	for _, i := range gone {
		if exists(t, e.store, valuePath(t, recs[i])) {
			t.Fatalf("overwritten value of partition %d kept", recs[i].Partition)
		}
	}
	// A compacted topic has no checkpoint mode.
	if _, err := lifecycle.Collect(ctxT(t, time.Minute), client(t), e.store, lifecycle.Options{Topic: topic, Mode: lifecycle.ModeCheckpoint}); err == nil || !strings.Contains(err.Error(), "compacted") {
		t.Fatalf("checkpoint mode on a compacted topic: %v", err)
	}
}
