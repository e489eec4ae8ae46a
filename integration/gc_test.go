package integration

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/internal/cli"
	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/lifecycle"
	"github.com/ferrykit/ferry/payloadstore"
)

// gcThreshold offloads anything over 1 KiB, so that the tests move small
// payloads.
const gcThreshold = 1024

// storeEnv is setup with a store URL (file, S3, ...) and threshold.
func storeEnv(t testing.TB, storeURL string, opts ...kgo.Opt) *env {
	t.Helper()
	cfg := largemessage.DefaultConfig()
	cfg.StoreURL = storeURL
	cfg.Threshold = gcThreshold
	return envWith(t, cfg, opts...)
}

func fileStoreURL(t testing.TB) string { return "file://" + t.TempDir() }

// valuePath and keyPath are the full paths a produced record references.
func valuePath(t testing.TB, r *kgo.Record) string {
	t.Helper()
	if !largemessage.IsOffloaded(r) {
		t.Fatalf("record at offset %d: value not offloaded", r.Offset)
	}
	ref, err := largemessage.DecodeReference(r.Value)
	if err != nil {
		t.Fatal(err)
	}
	return ref.FullPayloadPath
}

func keyPath(t testing.TB, r *kgo.Record) string {
	t.Helper()
	if !largemessage.IsKeyOffloaded(r) {
		t.Fatalf("record at offset %d: key not offloaded", r.Offset)
	}
	ref, err := largemessage.DecodeReference(r.Key)
	if err != nil {
		t.Fatal(err)
	}
	return ref.FullPayloadPath
}

// exists reports whether the store still holds fullPath.
func exists(t testing.TB, s payloadstore.PayloadStore, fullPath string) bool {
	t.Helper()
	_, err := payloadstore.DownloadBytes(ctxT(t, time.Minute), s, fullPath)
	if errors.Is(err, payloadstore.ErrPayloadNotFound) {
		return false
	}
	if err != nil {
		t.Fatalf("download %s: %v", fullPath, err)
	}
	return true
}

// orphans publishes n objects under topic that no record references.
func orphans(t testing.TB, s payloadstore.PayloadStore, topic string, seed uint64, n int) (paths []string, size int64) {
	t.Helper()
	for i := range n {
		b := randomBytes(seed+uint64(i), 3000+i)
		resp, err := payloadstore.PublishBytes(ctxT(t, time.Minute), s, topic, b)
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, resp.FullPayloadPath)
		size += int64(len(b))
	}
	return paths, size
}

// testSettle is the settle time of the tests' gc runs: their producers
// append within milliseconds of a publish.
const testSettle = time.Second

func collect(t testing.TB, e *env, o lifecycle.Options) lifecycle.Summary {
	t.Helper()
	if !o.SettleSet {
		o.Settle, o.SettleSet = testSettle, true
	}
	sum, err := lifecycle.Collect(ctxT(t, 3*time.Minute), client(t), e.store, o)
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	return sum
}

func candidatePaths(sum lifecycle.Summary) []string {
	var ps []string
	for _, c := range sum.Candidates {
		ps = append(ps, c.FullPath)
	}
	return ps
}

func sorted(ps []string) []string { s := slices.Clone(ps); slices.Sort(s); return s }

// A delete-retention topic: objects referenced by records are kept, old
// orphans are deleted, objects within the grace period are kept, and a dry
// run deletes nothing and lists exactly the old orphans. Every record still
// resolves to its bytes afterwards.
func TestGCDeleteTopicFileStore(t *testing.T) {
	// The file store's ModTime is the file's: age the old orphans by two
	// days, so that a run on the real clock with the default 24h grace
	// sees them old and everything else new.
	gcDeleteTopic(t, fileStoreURL(t), func(paths []string) {
		old := time.Now().Add(-48 * time.Hour)
		for _, p := range paths {
			if err := os.Chtimes(strings.TrimPrefix(p, "file://"), old, old); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// The same against the real S3 server, whose clock cannot be moved: there
// "now" moves instead.
func TestGCDeleteTopicS3(t *testing.T) { gcDeleteTopic(t, storetest.S3URL(t, "ferry-gc"), nil) }

// gcDeleteTopic runs the delete-retention checks on storeURL; age, when
// set, makes the given objects older than the 24h grace.
func gcDeleteTopic(t *testing.T, storeURL string, age func([]string)) {
	e := storeEnv(t, storeURL)
	topic := newTopic(t, nil)
	vals := [][]byte{randomBytes(101, 5000), randomBytes(102, 6000), randomBytes(103, 7000)}
	bigKey := randomBytes(104, 4000)
	recs := []*kgo.Record{
		{Topic: topic, Key: []byte("a"), Value: vals[0]},
		{Topic: topic, Key: []byte("b"), Value: vals[1]},
		{Topic: topic, Key: bigKey, Value: vals[2]},
		{Topic: topic, Key: []byte("inline"), Value: []byte("small")},
	}
	produceOK(t, e, recs...)
	referenced := []string{valuePath(t, recs[0]), valuePath(t, recs[1]), valuePath(t, recs[2]), keyPath(t, recs[2])}
	old, oldSize := orphans(t, e.store, topic, 200, 3)
	fresh, freshSize := orphans(t, e.store, topic, 300, 1)

	// On the real clock with the default grace, everything is new: kept.
	first := collect(t, e, lifecycle.Options{Topic: topic})
	if first.Listed != 8 || first.TooNew != 8 || first.Deleted != 0 || len(first.Candidates) != 0 {
		t.Fatalf("run within the grace period: %+v", first)
	}

	var now func() time.Time
	wantNew := 1
	if age != nil {
		age(old)
		age(referenced) // referenced objects are kept for being referenced, not for being new
	} else {
		// "now" two days ahead: every object is past the grace, the fresh
		// orphan too (its grace case was checked above).
		now = func() time.Time { return time.Now().Add(48 * time.Hour) }
		old = append(old, fresh...)
		oldSize += freshSize
		fresh, wantNew = nil, 0
	}

	dry := collect(t, e, lifecycle.Options{Topic: topic, Now: now, DryRun: true})
	if got, want := candidatePaths(dry), sorted(old); !slices.Equal(got, want) {
		t.Fatalf("dry run would delete %v, want exactly the old orphans %v", got, want)
	}
	if dry.Compacted || dry.Listed != 8 || dry.Referenced != 4 || dry.TooNew != wantNew || dry.Deleted != len(old) || dry.BytesFreed != oldSize || dry.RecordsRead != 4 || dry.LiveReferences != 4 {
		t.Fatalf("dry-run summary %+v", dry)
	}
	for _, p := range append(append(slices.Clone(old), fresh...), referenced...) {
		if !exists(t, e.store, p) {
			t.Fatalf("dry run deleted %s", p)
		}
	}

	sum := collect(t, e, lifecycle.Options{Topic: topic, Now: now})
	if got, want := candidatePaths(sum), sorted(old); !slices.Equal(got, want) || sum.Deleted != len(old) || sum.BytesFreed != oldSize || sum.Failed != 0 || sum.TooNew != wantNew || sum.Referenced != 4 {
		t.Fatalf("gc deleted %v (summary %+v), want %v", got, sum, want)
	}
	for _, p := range old {
		if exists(t, e.store, p) {
			t.Fatalf("old orphan %s not deleted", p)
		}
	}
	for _, p := range append(slices.Clone(fresh), referenced...) {
		if !exists(t, e.store, p) {
			t.Fatalf("gc deleted %s, which is referenced or within the grace period", p)
		}
	}
	// Every record still resolves to the bytes produced.
	de := largemessage.NewDeserializer(e.store, false)
	for i, r := range consumeRaw(t, topic, len(recs)) {
		if err := de.Resolve(ctxT(t, time.Minute), r); err != nil {
			t.Fatalf("record %d after gc: %v", i, err)
		}
		wantKey, wantVal := []byte{'a' + byte(i)}, []byte(nil)
		switch i {
		case 2:
			wantKey = bigKey
		case 3:
			wantKey, wantVal = []byte("inline"), []byte("small")
		}
		if i < 3 {
			wantVal = vals[i]
		}
		if !bytes.Equal(r.Key, wantKey) || !bytes.Equal(r.Value, wantVal) {
			t.Fatalf("record %d differs after gc", i)
		}
	}
	// A second run finds nothing more to delete.
	again := collect(t, e, lifecycle.Options{Topic: topic, Now: now})
	if again.Deleted != 0 || again.Listed != 8-len(old) {
		t.Fatalf("second run: %+v", again)
	}
}

// A compacted topic: only the latest record per key is live. Overwritten
// values' objects go, a tombstoned key's value objects go, the latest
// values stay, and an offloaded key whose latest record is a tombstone keeps
// its key object (the tombstone still carries the reference).
func TestGCCompactedTopic(t *testing.T) {
	e := storeEnv(t, fileStoreURL(t))
	compact := "compact"
	topic := newTopic(t, map[string]*string{"cleanup.policy": &compact})
	bigKey := randomBytes(501, 4000)
	v := func(i uint64) []byte { return randomBytes(600+i, 2000+int(i)) }
	recs := []*kgo.Record{
		{Topic: topic, Key: []byte("k1"), Value: v(1)}, // 0 overwritten
		{Topic: topic, Key: []byte("k1"), Value: v(2)}, // 1 latest of k1
		{Topic: topic, Key: []byte("k2"), Value: v(3)}, // 2 tombstoned
		{Topic: topic, Key: []byte("k2"), Value: nil},  // 3 tombstone
		{Topic: topic, Key: bigKey, Value: v(4)},       // 4 offloaded key and value, tombstoned
		{Topic: topic, Key: bigKey, Value: nil},        // 5 tombstone with an offloaded key
		{Topic: topic, Key: []byte("k3"), Value: v(5)}, // 6 overwritten by an inline value
		{Topic: topic, Key: []byte("k3"), Value: []byte("inline")},
		{Topic: topic, Key: []byte("k4"), Value: v(6)}, // 8 latest of k4
	}
	produceOK(t, e, recs...)
	if !largemessage.IsKeyOffloaded(recs[5]) || largemessage.IsOffloaded(recs[5]) || recs[5].Value != nil {
		t.Fatal("the big-key tombstone was not produced as a tombstone with an offloaded key")
	}
	keep := []string{valuePath(t, recs[1]), valuePath(t, recs[8]), keyPath(t, recs[5])}
	if keyPath(t, recs[4]) != keyPath(t, recs[5]) {
		t.Fatal("equal keys gave different key objects")
	}
	gone := []string{valuePath(t, recs[0]), valuePath(t, recs[2]), valuePath(t, recs[4]), valuePath(t, recs[6])}
	now := func() time.Time { return time.Now().Add(48 * time.Hour) }

	sum := collect(t, e, lifecycle.Options{Topic: topic, Now: now})
	if !sum.Compacted || sum.RecordsRead != int64(len(recs)) {
		t.Fatalf("summary %+v: want a compacted topic with %d records read", sum, len(recs))
	}
	if got, want := candidatePaths(sum), sorted(gone); !slices.Equal(got, want) {
		t.Fatalf("deleted %v, want %v", got, want)
	}
	if sum.Listed != len(keep)+len(gone) || sum.Referenced != len(keep) {
		t.Fatalf("summary %+v", sum)
	}
	for _, p := range keep {
		if !exists(t, e.store, p) {
			t.Fatalf("live object %s deleted", p)
		}
	}
	for _, p := range gone {
		if exists(t, e.store, p) {
			t.Fatalf("dead object %s kept", p)
		}
	}
	// The latest record of every key still resolves.
	de := largemessage.NewDeserializer(e.store, false)
	got := consumeRaw(t, topic, len(recs))
	for _, i := range []int{1, 5, 7, 8} {
		r := got[i]
		if err := de.Resolve(ctxT(t, time.Minute), r); err != nil {
			t.Fatalf("latest record at offset %d: %v", i, err)
		}
		if !bytes.Equal(r.Key, recs[i].Key) && !(i == 5 && bytes.Equal(r.Key, bigKey)) {
			t.Fatalf("record %d: key differs", i)
		}
	}
	if !bytes.Equal(got[1].Value, v(2)) || !bytes.Equal(got[8].Value, v(6)) || got[5].Value != nil {
		t.Fatal("latest values differ after gc")
	}
}

// A transactional producer. The record of an aborted transaction stays in
// the log, and a read_uncommitted consumer (Kafka's default isolation
// level) reads it: its payload is live while the record is there, in a
// delete-retention topic and in a compacted one, where an aborted record
// after the latest committed one of its key must not stand for it (the
// log cleaner removes the aborted one). An orphan is still deleted.
func TestGCTransactions(t *testing.T) {
	compact := "compact"
	for _, policy := range []*string{nil, &compact} {
		name := "delete"
		if policy != nil {
			name = *policy
		}
		t.Run(name, func(t *testing.T) {
			e := storeEnv(t, fileStoreURL(t), kgo.TransactionalID(fmt.Sprintf("ferry-gc-%s-%d", name, time.Now().UnixNano())))
			var configs map[string]*string
			if policy != nil {
				configs = map[string]*string{"cleanup.policy": policy}
			}
			topic := newTopic(t, configs)
			cl := e.prod.Client()
			run := func(val []byte, commit kgo.TransactionEndTry) *kgo.Record {
				t.Helper()
				ctx := ctxT(t, time.Minute)
				if err := cl.BeginTransaction(); err != nil {
					t.Fatal(err)
				}
				r := &kgo.Record{Topic: topic, Key: []byte("k"), Value: val}
				produceOK(t, e, r)
				if err := cl.EndTransaction(ctx, commit); err != nil {
					t.Fatal(err)
				}
				return r
			}
			committed := run(randomBytes(702, 5000), kgo.TryCommit)
			aborted := run(randomBytes(701, 5000), kgo.TryAbort)
			orphan, _ := orphans(t, e.store, topic, 703, 1)
			sum := collect(t, e, lifecycle.Options{Topic: topic, Now: func() time.Time { return time.Now().Add(48 * time.Hour) }})
			if got := candidatePaths(sum); !slices.Equal(got, orphan) || sum.RecordsRead != 2 {
				t.Fatalf("deleted %v (summary %+v), want only the orphan %v, 2 records read", got, sum, orphan)
			}
			if !exists(t, e.store, valuePath(t, aborted)) || !exists(t, e.store, valuePath(t, committed)) {
				t.Fatal("a payload of a record still in the log was deleted")
			}
			// A read_uncommitted consumer resolves both records.
			de := largemessage.NewDeserializer(e.store, false)
			for i, r := range consumeRaw(t, topic, 2) {
				if err := de.Resolve(ctxT(t, time.Minute), r); err != nil || !bytes.Equal(r.Value, randomBytes(702-uint64(i), 5000)) {
					t.Fatalf("offset %d after gc: %v", r.Offset, err)
				}
			}
		})
	}
}

// A record marked large-message whose reference does not decode: gc fails,
// naming the record, and deletes nothing.
func TestGCCorruptReferenceDeletesNothing(t *testing.T) {
	e := storeEnv(t, fileStoreURL(t))
	topic := newTopic(t, nil)
	good := &kgo.Record{Topic: topic, Value: randomBytes(801, 5000)}
	produceOK(t, e, good)
	corrupt := &kgo.Record{Topic: topic, Value: []byte{0, 0, 0, 200, 'x'}, Headers: []kgo.RecordHeader{{Key: largemessage.HeaderLargeMessage, Value: []byte("true")}}}
	if err := client(t).ProduceSync(ctxT(t, 30*time.Second), corrupt).FirstErr(); err != nil {
		t.Fatal(err)
	}
	orphan, _ := orphans(t, e.store, topic, 900, 2)
	_, err := lifecycle.Collect(ctxT(t, 3*time.Minute), client(t), e.store, lifecycle.Options{Topic: topic, Now: func() time.Time { return time.Now().Add(48 * time.Hour) }})
	if !errors.Is(err, largemessage.ErrCorruptReference) || !strings.Contains(err.Error(), fmt.Sprintf("topic %s partition 0 offset 1", topic)) {
		t.Fatalf("Collect error = %v, want a corrupt reference naming offset 1", err)
	}
	for _, p := range append(orphan, valuePath(t, good)) {
		if !exists(t, e.store, p) {
			t.Fatalf("%s deleted by a failed run", p)
		}
	}
}

// A topic that does not exist is a clear error.
func TestGCMissingTopic(t *testing.T) {
	e := storeEnv(t, fileStoreURL(t))
	_, err := lifecycle.Collect(ctxT(t, time.Minute), client(t), e.store, lifecycle.Options{Topic: "ferry-it-no-such-topic"})
	if err == nil || !strings.Contains(err.Error(), "topic ferry-it-no-such-topic does not exist") {
		t.Fatalf("Collect on a missing topic: %v", err)
	}
}

// `ferry gc --dry-run` lists exactly the orphans, deletes nothing and exits
// 0; `ferry gc` then deletes them; a missing topic exits 1.
func TestCLIGC(t *testing.T) {
	b := brokers(t)
	storeURL := fileStoreURL(t)
	e := storeEnv(t, storeURL)
	topic := newTopic(t, nil)
	rec := &kgo.Record{Topic: topic, Value: randomBytes(1001, 5000)}
	produceOK(t, e, rec)
	orphan, size := orphans(t, e.store, topic, 1100, 2)
	ctx := ctxT(t, 3*time.Minute)
	var out, errb bytes.Buffer
	if code := cli.Run(ctx, []string{"gc", "--brokers", b, "--topic", topic, "--store", storeURL, "--grace", "0s", "--settle", "1s", "--dry-run"}, &out, &errb); code != cli.ExitOK {
		t.Fatalf("ferry gc --dry-run exited %d: %s", code, errb.String())
	}
	var listed []string
	for _, line := range strings.Split(out.String(), "\n") {
		if p, ok := strings.CutPrefix(line, "would delete "); ok {
			listed = append(listed, strings.Fields(p)[0])
		}
	}
	if !slices.Equal(listed, sorted(orphan)) {
		t.Fatalf("dry run listed %v, want %v; output:\n%s", listed, sorted(orphan), out.String())
	}
	wantLine := fmt.Sprintf("objects: 3 listed, 1 kept referenced, 0 kept newer than 0s (not checked), 2 would delete, %d bytes would be freed", size)
	if !strings.Contains(out.String(), wantLine) {
		t.Fatalf("dry-run summary missing %q:\n%s", wantLine, out.String())
	}
	for _, p := range append(slices.Clone(orphan), valuePath(t, rec)) {
		if !exists(t, e.store, p) {
			t.Fatalf("dry run deleted %s", p)
		}
	}

	out.Reset()
	errb.Reset()
	if code := cli.Run(ctx, []string{"gc", "--brokers", b, "--topic", topic, "--store", storeURL, "--grace", "0s", "--settle", "1s"}, &out, &errb); code != cli.ExitOK {
		t.Fatalf("ferry gc exited %d: %s", code, errb.String())
	}
	if want := fmt.Sprintf("2 deleted, %d bytes freed", size); !strings.Contains(out.String(), want) {
		t.Fatalf("summary missing %q:\n%s", want, out.String())
	}
	if exists(t, e.store, orphan[0]) || exists(t, e.store, orphan[1]) || !exists(t, e.store, valuePath(t, rec)) {
		t.Fatal("ferry gc did not delete exactly the orphans")
	}

	out.Reset()
	errb.Reset()
	code := cli.Run(ctx, []string{"gc", "--brokers", b, "--topic", "ferry-it-no-such-topic", "--store", storeURL}, &out, &errb)
	if code != cli.ExitFailure || !strings.Contains(errb.String(), "does not exist") {
		t.Fatalf("missing topic: exit %d, stderr %q", code, errb.String())
	}
	if code := cli.Run(ctx, []string{"gc", "--brokers", b, "--store", storeURL}, &out, &errb); code != cli.ExitUsage {
		t.Fatalf("no --topic: exit %d, want %d", code, cli.ExitUsage)
	}
}

// The producer wrote references through one path of a file store and gc
// opens the same directory through another (a symlink, as another mount
// point would be): referenced objects are still recognised and kept.
func TestGCStoreThroughAnotherPath(t *testing.T) {
	dir := t.TempDir()
	e := storeEnv(t, "file://"+dir)
	topic := newTopic(t, nil)
	rec := &kgo.Record{Topic: topic, Value: randomBytes(1201, 5000)}
	produceOK(t, e, rec)
	orphan, _ := orphans(t, e.store, topic, 1300, 1)
	link := t.TempDir() + "/mounted-elsewhere"
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	other := storeEnv(t, "file://"+link)
	sum := collect(t, other, lifecycle.Options{Topic: topic, Now: func() time.Time { return time.Now().Add(48 * time.Hour) }})
	if sum.Referenced != 1 || sum.Deleted != 1 || !strings.HasPrefix(sum.Candidates[0].FullPath, "file://"+link+"/") {
		t.Fatalf("summary %+v: want the referenced object kept and the orphan deleted", sum)
	}
	if !exists(t, e.store, valuePath(t, rec)) || exists(t, e.store, orphan[0]) {
		t.Fatal("gc through another path deleted the referenced object or kept the orphan")
	}
}
