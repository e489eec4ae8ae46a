package integration

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/lifecycle"
	"github.com/ferrykit/ferry/payloadstore"
)

// BenchmarkGC measures ferry gc on a delete-policy topic of
// FERRY_GC_BENCH_RECORDS records (10^6 by default) over 8 partitions on the
// real broker, and FERRY_GC_BENCH_OBJECTS objects (10^5) in a file store,
// in full-read mode and in checkpoint mode (go test -bench BenchmarkGC; it
// runs only when asked for with -bench).
//
// Setup (not timed): a tenth of the objects ("dead") are written with a
// ModTime an hour back and referenced by one record each; a gc run stores a
// checkpoint; DeleteRecords then deletes those records (retention); then the
// other objects ("live") are written, and the records, each a real
// PayloadReferenceValue with its large-message header produced straight with
// franz-go in large batches, reference them round robin. So the checkpoint
// has been passed by retention, the dead objects are older than it by more
// than the grace (2 s), and the live ones are newer.
//
// Sub-benchmarks, each op one Collect:
//
//   - MODE/decide: a dry run (list and decide, move nothing), MODE full or
//     checkpoint; full/decide-workers=N reads with N clients.
//   - MODE/collect: a real run that quarantines the dead objects (written
//     again before each op, not timed), waits the settle time (1 s,
//     included), rechecks and deletes them.
//
// Metrics: list-s/op (from the start of Collect to the end of the store
// listing: offsets, checkpoints, leftover folders and the listing),
// records-read, objects deleted, peak-heap-MiB (the Go heap in use,
// sampled every 5 ms during the op) and peak-rss-MiB (VmHWM of the test
// process, reset through /proc/self/clear_refs before the op; it includes
// the process's baseline, reported as base-rss-MiB).
func BenchmarkGC(b *testing.B) {
	nRecords := benchEnvInt(b, "FERRY_GC_BENCH_RECORDS", 1_000_000)
	nObjects := benchEnvInt(b, "FERRY_GC_BENCH_OBJECTS", 100_000)
	nDead := nObjects / 10
	s := gcBenchSetup(b, nRecords, nObjects, nDead)
	const grace, settle = 2 * time.Second, time.Second
	run := func(b *testing.B, o lifecycle.Options, rewriteDead bool, wantDeleted int) {
		o.Topic, o.Grace, o.GraceSet, o.Settle, o.SettleSet = s.topic, grace, true, settle, true
		var read int64
		var peakHeap, peakRSS, baseRSS float64
		var listTime time.Duration // summed over the ops
		var opStart, listed time.Time
		o.Progress = func(p lifecycle.Progress) {
			if p.Phase == "list" {
				listed = time.Now()
			}
		}
		for b.Loop() {
			if rewriteDead {
				b.StopTimer()
				s.writeObjects(b, s.dead, time.Now().Add(-time.Hour))
				b.StartTimer()
			}
			b.StopTimer()
			runtime.GC()
			debug.FreeOSMemory()
			resetPeakRSS(b)
			base := rssMiB("VmRSS")
			stopSampling := sampleHeap()
			b.StartTimer()
			opStart = time.Now()
			sum, err := lifecycle.Collect(context.Background(), s.cl, s.store, o)
			b.StopTimer()
			listTime += listed.Sub(opStart)
			heap := stopSampling()
			if err != nil {
				b.Fatal(err)
			}
			if sum.Deleted != wantDeleted {
				b.Fatalf("deleted %d, want %d (summary %+v)", sum.Deleted, wantDeleted, sum)
			}
			read = sum.RecordsRead
			peakHeap, peakRSS, baseRSS = max(peakHeap, heap), max(peakRSS, rssMiB("VmHWM")), max(baseRSS, base)
			b.StartTimer()
		}
		b.ReportMetric(listTime.Seconds()/float64(b.N), "list-s/op")
		b.ReportMetric(float64(read), "records-read")
		b.ReportMetric(float64(wantDeleted), "deleted")
		b.ReportMetric(peakHeap, "peak-heap-MiB")
		b.ReportMetric(peakRSS, "peak-rss-MiB")
		b.ReportMetric(baseRSS, "base-rss-MiB")
	}
	b.Run("checkpoint/decide", func(b *testing.B) {
		run(b, lifecycle.Options{Mode: lifecycle.ModeCheckpoint, DryRun: true}, false, nDead)
	})
	b.Run("full/decide", func(b *testing.B) { run(b, lifecycle.Options{Mode: lifecycle.ModeFull, DryRun: true}, false, nDead) })
	for _, w := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("full/decide-workers=%d", w), func(b *testing.B) {
			run(b, lifecycle.Options{Mode: lifecycle.ModeFull, DryRun: true, ReadWorkers: w}, false, nDead)
		})
	}
	b.Run("checkpoint/collect", func(b *testing.B) {
		run(b, lifecycle.Options{Mode: lifecycle.ModeCheckpoint}, true, nDead)
	})
	b.Run("full/collect", func(b *testing.B) { run(b, lifecycle.Options{Mode: lifecycle.ModeFull}, true, nDead) })
}

type gcBench struct {
	topic, dir string
	store      payloadstore.PayloadStore
	cl         *kgo.Client
	dead, live []string // object keys
}

var (
	gcBenchOnce  sync.Once
	gcBenchState *gcBench
)

func gcBenchSetup(b *testing.B, nRecords, nObjects, nDead int) *gcBench {
	gcBenchOnce.Do(func() { gcBenchState = newGCBench(b, nRecords, nObjects, nDead) })
	if gcBenchState == nil {
		b.Fatal("setup failed")
	}
	return gcBenchState
}

func newGCBench(b *testing.B, nRecords, nObjects, nDead int) *gcBench {
	start := time.Now()
	dir, err := os.MkdirTemp("", "ferry-gc-bench-")
	if err != nil {
		b.Fatal(err)
	}
	// The state outlives the sub-benchmarks; removed at exit of the
	// process would be nicer, but a temp dir is fine.
	store, err := payloadstore.Open(context.Background(), "file://"+dir, payloadstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers(b), ",")...))
	if err != nil {
		b.Fatal(err)
	}
	topic := fmt.Sprintf("ferry-gc-bench-%d", time.Now().UnixNano())
	adm := kadm.NewClient(cl)
	ctx := context.Background()
	if resp, err := adm.CreateTopic(ctx, 8, 1, nil, topic); err != nil || resp.Err != nil {
		b.Fatalf("create topic: %v %v", err, resp.Err)
	}
	s := &gcBench{topic: topic, dir: dir, store: store, cl: cl}
	for i := range nObjects {
		key, err := payloadstore.ObjectKey(topic, uuid.NewString())
		if err != nil {
			b.Fatal(err)
		}
		if i < nDead {
			s.dead = append(s.dead, key)
		} else {
			s.live = append(s.live, key)
		}
	}
	s.writeObjects(b, s.dead, time.Now().Add(-time.Hour))
	s.produceRefs(b, s.dead, len(s.dead))
	// A run that stores the checkpoint (everything within its grace).
	if _, err := lifecycle.Collect(ctx, cl, store, lifecycle.Options{Topic: topic, Grace: 2 * time.Hour, Mode: lifecycle.ModeFull}); err != nil {
		b.Fatal(err)
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		b.Fatal(err)
	}
	var offs kadm.Offsets
	ends.Each(func(lo kadm.ListedOffset) {
		offs.Add(kadm.Offset{Topic: topic, Partition: lo.Partition, At: lo.Offset})
	})
	if _, err := adm.DeleteRecords(ctx, offs); err != nil {
		b.Fatal(err)
	}
	time.Sleep(3 * time.Second) // past the grace: live objects are newer than the checkpoint
	s.writeObjects(b, s.live, time.Time{})
	s.produceRefs(b, s.live, nRecords)
	b.Logf("setup: %d records, %d objects (%d dead) in %s", nRecords, nObjects, nDead, time.Since(start).Round(time.Second))
	return s
}

// writeObjects writes small objects at keys straight into the store's
// directory (no fsync: setup speed), with ModTime mod unless zero.
func (s *gcBench) writeObjects(b *testing.B, keys []string, mod time.Time) {
	body := []byte("ferry gc benchmark payload")
	made := map[string]bool{}
	for _, k := range keys {
		name := filepath.Join(s.dir, filepath.FromSlash(k))
		if d := filepath.Dir(name); !made[d] {
			if err := os.MkdirAll(d, 0o755); err != nil {
				b.Fatal(err)
			}
			made[d] = true
		}
		if err := os.WriteFile(name, body, 0o644); err != nil {
			b.Fatal(err)
		}
		if !mod.IsZero() {
			if err := os.Chtimes(name, mod, mod); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// produceRefs produces n reference records over keys, round robin, with
// franz-go in large batches.
func (s *gcBench) produceRefs(b *testing.B, keys []string, n int) {
	pcl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers(b), ",")...),
		kgo.DefaultProduceTopic(s.topic), kgo.ProducerLinger(20*time.Millisecond),
		kgo.ProducerBatchMaxBytes(900_000), kgo.MaxBufferedRecords(200_000),
		kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	if err != nil {
		b.Fatal(err)
	}
	defer pcl.Close()
	refs := make([][]byte, len(keys))
	for i, k := range keys {
		refs[i], err = largemessage.PayloadReferenceValue{FullPayloadPath: "file://" + s.dir + "/" + k, PayloadStoreClass: payloadstore.FileStoreClass}.AppendTo(nil)
		if err != nil {
			b.Fatal(err)
		}
	}
	hdr := []kgo.RecordHeader{{Key: largemessage.HeaderLargeMessage, Value: []byte("true")}}
	var failed atomic.Pointer[error]
	ctx := context.Background()
	for i := range n {
		pcl.Produce(ctx, &kgo.Record{Value: refs[i%len(refs)], Headers: hdr}, func(_ *kgo.Record, err error) {
			if err != nil {
				failed.CompareAndSwap(nil, &err)
			}
		})
	}
	if err := pcl.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	if p := failed.Load(); p != nil {
		b.Fatal(*p)
	}
}

func benchEnvInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 10 {
		b.Fatalf("%s=%q: want a number of at least 10", name, v)
	}
	return n
}

// resetPeakRSS resets the process's VmHWM (Linux: "5" to clear_refs).
func resetPeakRSS(b testing.TB) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Logf("cannot reset the peak RSS: %v", err)
	}
}

// rssMiB reads a Vm* line of /proc/self/status, in MiB.
func rssMiB(field string) float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// sampleHeap samples the Go heap in use every 5 ms until the returned
// function is called, which returns the peak in MiB.
func sampleHeap() func() float64 {
	var peak atomic.Uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var ms runtime.MemStats
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() float64 {
		close(done)
		wg.Wait()
		return float64(peak.Load()) / (1 << 20)
	}
}
