package integration

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/lifecycle"
	"github.com/ferrykit/ferry/payloadstore"
)

// gcRaceScenarios is the number of race scenarios (2 stores x 2 modes);
// gcRaceStarted counts those started, to share a soak's time among them.
const gcRaceScenarios = 4

var gcRaceStarted atomic.Int64

// gcRaceRuns returns the number of gc runs a race scenario makes at least,
// FERRY_GC_RACE_ITERATIONS (8 by default), and until when it goes on: with
// FERRY_SOAK_UNTIL (unix seconds; scripts/soak sets it), this scenario's
// share of the time left (zero otherwise).
func gcRaceRuns(t *testing.T) (int, time.Time) {
	n := 8
	if s := os.Getenv("FERRY_GC_RACE_ITERATIONS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			t.Fatalf("FERRY_GC_RACE_ITERATIONS=%q: want a positive number", s)
		}
	}
	started := gcRaceStarted.Add(1)
	var until time.Time
	if s := os.Getenv("FERRY_SOAK_UNTIL"); s != "" {
		secs, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("FERRY_SOAK_UNTIL=%q: want unix seconds", s)
		}
		if left := time.Until(time.Unix(secs, 0)); left > 0 {
			until = time.Now().Add(left / time.Duration(max(1, gcRaceScenarios-started+1)))
		}
	}
	return n, until
}

// gc racing producers, on the file store and on the real S3 server. Each
// scenario runs gc back to back (gcRaceRuns: 8 runs, more when soaking)
// while producers (the Go library, content ids
// for values and offloaded keys, threshold 1 KiB) keep
//
//   - republishing a pool of contents and keys (equal bytes, same object);
//   - publishing a content as an orphan (a produce that failed), then, up to
//     a few seconds later, producing it for real: gc may have found the
//     orphan garbage meanwhile (issue: the object named by a content id is
//     deleted after its republish was acknowledged);
//   - publishing, then producing the record up to 200 ms later (a slow
//     producer; within the settle time);
//   - re-producing acknowledged records as they were consumed (same-topic
//     references: the object is touched instead of published).
//
// At the end every acknowledged record still in the log must resolve to the
// bytes it was produced with, however long its acknowledgement took: the
// producers confirm their objects after it (the Producer itself; the slow
// producer, which produces with the client, calls Plan.Confirm).
//
// "full": grace 0, no retention: every run reads the topic. "checkpoint":
// the test plays retention with DeleteRecords, so runs go to checkpoint
// mode (grace 2 s; a slower acknowledgement is the confirmation's to
// repair, as in full mode).
func TestGCRaceFileStore(t *testing.T) {
	t.Run("full", func(t *testing.T) { gcRace(t, fileStoreURL(t), false) })
	t.Run("checkpoint", func(t *testing.T) { gcRace(t, fileStoreURL(t), true) })
}

func TestGCRaceS3(t *testing.T) {
	t.Run("full", func(t *testing.T) { gcRace(t, storetest.S3URL(t, "ferry-gc"), false) })
	t.Run("checkpoint", func(t *testing.T) { gcRace(t, storetest.S3URL(t, "ferry-gc"), true) })
}

// raceExpect is what an acknowledged record must resolve to, and the time
// from the write of its objects to its acknowledgement.
type raceExpect struct {
	key, value [32]byte
	delay      time.Duration
}

type raceLog struct {
	mu      sync.Mutex
	acked   map[[2]int64]raceExpect // (partition, offset) -> digests
	records []*kgo.Record           // acknowledged records, as produced (references)
	digests []raceExpect
}

func (l *raceLog) add(r *kgo.Record, key, value []byte, delay time.Duration) {
	e := raceExpect{sha256.Sum256(key), sha256.Sum256(value), delay}
	l.addExpect(r, e)
}

func (l *raceLog) addExpect(r *kgo.Record, e raceExpect) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.acked[[2]int64{int64(r.Partition), r.Offset}] = e
	l.records = append(l.records, r)
	l.digests = append(l.digests, e)
}

func (l *raceLog) pick(rng *rand.Rand) (*kgo.Record, raceExpect, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.records) == 0 {
		return nil, raceExpect{}, false
	}
	// Mostly older records: their objects are the ones gc may find garbage.
	i := rng.IntN(len(l.records)/2 + 1)
	return l.records[i], l.digests[i], true
}

func gcRace(t *testing.T, storeURL string, checkpoints bool) {
	minRuns, until := gcRaceRuns(t)
	cfg := largemessage.DefaultConfig()
	cfg.StoreURL = storeURL
	cfg.Threshold = gcThreshold
	cfg.IDGenerator = payloadstore.IDSHA256{}
	e := envWith(t, cfg, kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	topic := newTopicPartitions(t, 2, nil)
	// Checkpoint mode proves an object garbage only once it is older than
	// the grace at a checkpoint that retention passed (two runs back
	// here): runs are spaced, republishes rarer and orphans wait longer, so
	// that objects age into candidates while producers still use them.
	grace, settle, gap, republishPause, orphanWait := time.Duration(0), time.Second, time.Duration(0), 15*time.Millisecond, 2*time.Second
	if checkpoints {
		grace, gap, republishPause, orphanWait = 2*time.Second, time.Second, 100*time.Millisecond, 8*time.Second
	}
	const poolSize = 64
	pool := make([][]byte, poolSize)
	for i := range pool {
		pool[i] = randomBytes(uint64(50000+i), 1500+i)
	}
	keys := make([][]byte, 8)
	for i := range keys {
		keys[i] = randomBytes(uint64(60000+i), 1200+i)
	}
	log := &raceLog{acked: map[[2]int64]raceExpect{}}
	var unique atomic.Uint64
	var produced, touchRefused, orphansRepublished atomic.Int64
	// The longest write-to-acknowledgement delay seen: the settle time (and
	// in checkpoint mode the grace) must exceed it, an operator's rule that
	// a very busy machine could break for this test.
	var maxDelay atomic.Int64
	acked := func(since time.Time) time.Duration {
		d := int64(time.Since(since))
		for {
			m := maxDelay.Load()
			if d <= m || maxDelay.CompareAndSwap(m, d) {
				return time.Duration(d)
			}
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	var failMu sync.Mutex
	var failures []error
	fail := func(err error) {
		failMu.Lock()
		failures = append(failures, err)
		failMu.Unlock()
	}
	pctx := ctxT(t, 10*time.Minute) // producer calls outlive stop() so that none is cut in half
	loop := func(seed uint64, pause time.Duration, body func(rng *rand.Rand)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 1))
			for ctx.Err() == nil {
				body(rng)
				time.Sleep(pause + time.Duration(rng.IntN(int(pause))))
			}
		}()
	}
	produceLib := func(r *kgo.Record, key, value []byte) error {
		start := time.Now()
		if err := e.prod.ProduceSync(pctx, r).FirstErr(); err != nil {
			return err
		}
		d := acked(start)
		produced.Add(1)
		log.add(r, key, value, d)
		return nil
	}
	// Republishers: pool contents with offloaded keys.
	for w := range 2 {
		loop(uint64(w), republishPause, func(rng *rand.Rand) {
			k, v := keys[rng.IntN(len(keys))], pool[rng.IntN(poolSize)]
			if err := produceLib(&kgo.Record{Topic: topic, Key: k, Value: v}, k, v); err != nil {
				fail(fmt.Errorf("republisher: %w", err))
			}
		})
	}
	// Orphan, then the same content produced for real a little later.
	for w := range 3 {
		loop(uint64(10+w), 20*time.Millisecond, func(rng *rand.Rand) {
			v := randomBytes(1e6+unique.Add(1), 1100+rng.IntN(500))
			if _, err := payloadstore.PublishBytes(pctx, e.store, topic, v); err != nil {
				fail(fmt.Errorf("orphan publish: %w", err))
				return
			}
			time.Sleep(time.Duration(rng.IntN(int(orphanWait))))
			if err := produceLib(&kgo.Record{Topic: topic, Key: []byte("o"), Value: v}, []byte("o"), v); err != nil {
				fail(fmt.Errorf("orphan republished: %w", err))
				return
			}
			orphansRepublished.Add(1)
		})
	}
	// Slow producer: publish, then produce up to 200 ms later.
	loop(20, 20*time.Millisecond, func(rng *rand.Rand) {
		v := randomBytes(2e6+unique.Add(1), 1100+rng.IntN(500))
		r := &kgo.Record{Topic: topic, Key: []byte("slow"), Value: v}
		start := time.Now()
		plan, err := e.prod.PreparePlan(pctx, r)
		if err != nil {
			fail(fmt.Errorf("slow prepare: %w", err))
			return
		}
		time.Sleep(time.Duration(rng.IntN(200)) * time.Millisecond)
		if err := e.prod.Client().ProduceSync(pctx, r).FirstErr(); err != nil {
			fail(fmt.Errorf("slow produce: %w", err))
			return
		}
		// Produced with the client itself: the confirmation the
		// Producer makes after the acknowledgement is the caller's.
		if plan != nil {
			if _, err := plan.Confirm(pctx); err != nil {
				fail(fmt.Errorf("slow produce: confirming: %w", err))
				return
			}
		}
		d := acked(start)
		produced.Add(1)
		log.add(r, []byte("slow"), v, d)
	})
	// Re-producers: an acknowledged record, as a consumer would have it
	// (reference and headers), produced again: the object is touched.
	loop(30, 15*time.Millisecond, func(rng *rand.Rand) {
		old, want, ok := log.pick(rng)
		if !ok {
			return
		}
		r := &kgo.Record{Topic: topic, Key: old.Key, Value: old.Value, Headers: old.Headers}
		start := time.Now()
		if err := e.prod.ProduceSync(pctx, r).FirstErr(); err != nil {
			if errors.Is(err, payloadstore.ErrPayloadNotFound) {
				touchRefused.Add(1) // in quarantine or deleted: refused, never acknowledged
				return
			}
			fail(fmt.Errorf("re-produce: %w", err))
			return
		}
		want.delay = acked(start)
		produced.Add(1)
		log.addExpect(r, want)
	})

	// gc, back to back.
	adm := kadm.NewClient(client(t))
	var ends []kadm.ListedOffsets
	var total lifecycle.Summary
	modes := map[lifecycle.Mode]int{}
	time.Sleep(500 * time.Millisecond)
	iterations, settleExceeded, lateReferences := 0, 0, 0
	for i := 0; i < minRuns || time.Now().Before(until); i++ {
		iterations++
		time.Sleep(gap)
		if checkpoints && len(ends) >= 2 {
			// Retention: records before the end of the run two back go.
			var offs kadm.Offsets
			ends[len(ends)-2].Each(func(lo kadm.ListedOffset) {
				offs.Add(kadm.Offset{Topic: topic, Partition: lo.Partition, At: lo.Offset})
			})
			if _, err := adm.DeleteRecords(ctxT(t, time.Minute), offs); err != nil {
				t.Fatalf("DeleteRecords: %v", err)
			}
		}
		sum, err := lifecycle.Collect(ctxT(t, 3*time.Minute), client(t), e.store, lifecycle.Options{
			Topic: topic, Grace: grace, GraceSet: true, Settle: settle, SettleSet: true})
		switch {
		case errors.Is(err, lifecycle.ErrSettleExceeded):
			// A record came after the recheck (a slow acknowledgement
			// on a busy machine): gc saw it; before its deletes it
			// restores everything, after them the producers' own
			// confirmation brings the objects back. Either way every
			// acknowledged record must still resolve below.
			settleExceeded++
			lateReferences += len(sum.LateReferences)
		case err != nil:
			t.Fatalf("gc run %d: %v", i, err)
		}
		modes[sum.Mode]++
		total.Listed += sum.Listed
		total.Quarantined += sum.Quarantined
		total.Changed += sum.Changed
		total.Restored += sum.Restored
		total.Deleted += sum.Deleted
		total.RecordsRead += sum.RecordsRead
		total.Rechecked += sum.Rechecked
		total.Unproven += sum.Unproven
		end, err := adm.ListEndOffsets(ctxT(t, time.Minute), topic)
		if err != nil {
			t.Fatal(err)
		}
		ends = append(ends, end)
	}
	stop()
	wg.Wait()
	for _, err := range failures {
		t.Errorf("producer: %v", err)
	}

	// Every acknowledged record still in the log resolves to its bytes.
	starts, err := adm.ListStartOffsets(ctxT(t, time.Minute), topic)
	if err != nil {
		t.Fatal(err)
	}
	recs := readAll(t, topic)
	de := largemessage.NewDeserializer(e.store, false)
	checked, unreadable, unknown, beyondGrace := 0, 0, 0, 0
	for _, r := range recs {
		want, ok := log.acked[[2]int64{int64(r.Partition), r.Offset}]
		if !ok {
			unknown++
			continue
		}
		checked++
		if err := de.Resolve(ctxT(t, time.Minute), r); err != nil {
			if checkpoints && want.delay >= grace {
				// Checkpoint mode does not read the records between the
				// checkpoint and the run's start: its proof rests on the
				// grace rule (an acknowledgement within the grace of
				// the write), which no confirmation replaces for an
				// object moved after it (docs/OPERATIONS.md §4). This
				// record's own acknowledgement broke it.
				beyondGrace++
				t.Logf("partition %d offset %d: %v (acknowledged %s after its write, beyond the grace %s)", r.Partition, r.Offset, err, want.delay.Round(time.Millisecond), grace)
				continue
			}
			unreadable++
			t.Errorf("partition %d offset %d: %v (acknowledged %s after its write)", r.Partition, r.Offset, err, want.delay.Round(time.Millisecond))
			continue
		}
		if sha256.Sum256(r.Key) != want.key || sha256.Sum256(r.Value) != want.value {
			unreadable++
			t.Errorf("partition %d offset %d: resolved to other bytes", r.Partition, r.Offset)
		}
	}
	inLog := 0
	for k := range log.acked {
		if lo, ok := starts.Lookup(topic, int32(k[0])); ok && k[1] >= lo.Offset {
			inLog++
		}
	}
	t.Logf("%d gc runs (modes %v): %d objects listed, %d quarantined, %d changed before the move, %d restored by the recheck, %d deleted, %d unproven; %d records read by full reads, %d rechecked",
		iterations, modes, total.Listed, total.Quarantined, total.Changed, total.Restored, total.Deleted, total.Unproven, total.RecordsRead, total.Rechecked)
	t.Logf("producers: %d records acknowledged (%d orphans republished and produced, %d re-produces refused because the object was in quarantine or deleted); %d acknowledged records in the log checked, %d unreadable, %d records not acknowledged",
		produced.Load(), orphansRepublished.Load(), touchRefused.Load(), checked, unreadable, unknown)
	// The producers confirm their objects after each acknowledgement
	// (Plan.Confirm), so no delay breaks them: a record acknowledged
	// later than the settle time (or, in checkpoint mode, the grace)
	// finds its object in quarantine or gone, and brings it back.
	t.Logf("longest write-to-acknowledgement delay of the producers: %s (settle %s, grace %s); %d runs saw a record after their recheck (%d late references, ErrSettleExceeded)",
		time.Duration(maxDelay.Load()).Round(time.Millisecond), settle, grace, settleExceeded, lateReferences)
	if beyondGrace > 0 {
		t.Logf("%d records unreadable whose own acknowledgement came later than the grace after their write (checkpoint mode's rule)", beyondGrace)
	}
	if checked != inLog {
		t.Errorf("checked %d acknowledged records, %d are in the log", checked, inLog)
	}
	if checkpoints && modes[lifecycle.ModeCheckpoint] == 0 {
		t.Error("no run went to checkpoint mode")
	}
}

// newTopicPartitions creates a fresh topic with n partitions.
func newTopicPartitions(t testing.TB, n int32, configs map[string]*string) string {
	t.Helper()
	name := fmt.Sprintf("ferry-it-gc-%d-%d", time.Now().UnixNano()%1e9, topicSeq.Add(1))
	resp, err := kadm.NewClient(client(t)).CreateTopic(ctxT(t, 30*time.Second), n, 1, configs, name)
	if err != nil || resp.Err != nil {
		t.Fatalf("create topic %s: %v %v", name, err, resp.Err)
	}
	waitTopic(t, name, int(n))
	return name
}

// readAll reads every record of topic from the log start offsets to the
// current high watermarks, without resolving.
func readAll(t testing.TB, topic string) []*kgo.Record {
	t.Helper()
	adm := kadm.NewClient(client(t))
	ctx := ctxT(t, 2*time.Minute)
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	assign := map[int32]kgo.Offset{}
	pending := map[int32]int64{}
	ends.Each(func(lo kadm.ListedOffset) {
		s, _ := starts.Lookup(topic, lo.Partition)
		if s.Offset < lo.Offset {
			assign[lo.Partition] = kgo.NewOffset().At(s.Offset)
			pending[lo.Partition] = lo.Offset
		}
	})
	if len(assign) == 0 {
		return nil
	}
	cl := client(t, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: assign}), kgo.FetchMaxBytes(64<<20), kgo.KeepControlRecords())
	var out []*kgo.Record
	for len(pending) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("reading %s: %v (pending %v)", topic, err, pending)
		}
		fs.EachError(func(_ string, p int32, err error) { t.Fatalf("fetch partition %d: %v", p, err) })
		for _, r := range fs.Records() {
			end, ok := pending[r.Partition]
			if !ok || r.Offset >= end {
				continue
			}
			if r.Offset >= end-1 {
				delete(pending, r.Partition)
			}
			if !r.Attrs.IsControl() {
				out = append(out, r)
			}
		}
	}
	return out
}
