package lifecycle_test

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/envelope"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/lifecycle"
	"github.com/ferrykit/ferry/payloadstore"
)

// failingStore fails the removal of one quarantined object: a fault the
// in-memory store cannot produce by itself.
type failingStore struct {
	*payloadstore.MemStore
	fail string // an object id
}

func (s failingStore) Remove(ctx context.Context, key string) error {
	if strings.Contains(key, "/.ferry-gc/q/") && strings.HasSuffix(key, "/"+s.fail) {
		return &payloadstore.Error{Op: "delete", Path: key, Retryable: true, Err: errors.New("injected failure")}
	}
	return s.MemStore.Remove(ctx, key)
}

// noise is n incompressible bytes (compressible ones would stay inline).
func noise(seed uint64, n int) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{byte(seed)}).Read(b)
	return b
}

func newCluster(t *testing.T) *kgo.Client {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "t"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func memStore(t *testing.T, gen payloadstore.IDGenerator) *payloadstore.MemStore {
	return payloadstore.NewMemStore(fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), time.Now().UnixNano()), gen)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// produce offloads and produces one record per value to partition p of "t"
// and returns the full paths of their value objects.
func produce(t *testing.T, cl *kgo.Client, store payloadstore.PayloadStore, p int32, vals ...[]byte) []string {
	t.Helper()
	cfg := largemessage.DefaultConfig()
	cfg.Threshold = 500
	prod, err := largemessage.NewProducer(cl, store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, v := range vals {
		r := &kgo.Record{Topic: "t", Partition: p, Value: v}
		if err := prod.ProduceSync(ctxT(t), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
		ref, err := largemessage.DecodeReference(r.Value)
		if err != nil || !largemessage.IsOffloaded(r) {
			t.Fatalf("record not offloaded: %v", err)
		}
		paths = append(paths, ref.FullPayloadPath)
	}
	return paths
}

func exists(t *testing.T, s payloadstore.PayloadStore, path string) bool {
	t.Helper()
	_, err := payloadstore.DownloadBytes(ctxT(t), s, path)
	if errors.Is(err, payloadstore.ErrPayloadNotFound) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// quarantineKeys lists the keys under the topic's quarantine folder.
func quarantineKeys(t *testing.T, s payloadstore.PayloadStore) []string {
	t.Helper()
	ops, err := payloadstore.Objects(s)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	if err := ops.ListKeys(ctxT(t), "t/.ferry-gc/q/", func(k string, _ payloadstore.ObjectInfo) error {
		keys = append(keys, k)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return keys
}

var later = func() time.Time { return time.Now().Add(25 * time.Hour) }

// Records over three partitions (one left empty): referenced payloads stay,
// orphans go through quarantine and are deleted, and a failed removal is
// counted while the others still happen (the failed one stays in
// quarantine with its run's manifest, for the next run).
func TestCollectPartitionsAndFailedDelete(t *testing.T) {
	ctx := ctxT(t)
	cl := newCluster(t)
	mem := memStore(t, nil)
	var live []string
	for i := range 4 {
		live = append(live, produce(t, cl, mem, int32(i%2), noise(uint64(i), 1000+i))...)
	}
	var orphans []string
	sizes := map[string]int64{}
	for i := range 3 {
		resp, err := payloadstore.PublishBytes(ctx, mem, "t", bytes.Repeat([]byte{'o'}, 10+i))
		if err != nil {
			t.Fatal(err)
		}
		orphans = append(orphans, resp.FullPayloadPath)
		sizes[resp.FullPayloadPath] = int64(10 + i)
	}
	slices.Sort(orphans)
	kp, _ := payloadstore.PathKey(orphans[1])
	store := failingStore{MemStore: mem, fail: kp.ID}

	var phases []string
	sum, err := lifecycle.Collect(ctx, cl, store, lifecycle.Options{
		Topic: "t", Now: later, SettleSet: true,
		Progress: func(p lifecycle.Progress) {
			if len(phases) == 0 || phases[len(phases)-1] != p.Phase {
				phases = append(phases, p.Phase)
			}
		},
	})
	if err == nil || !strings.Contains(err.Error(), "1 store operations failed") || !strings.Contains(err.Error(), "injected failure") {
		t.Fatalf("Collect error = %v, want one failed removal reported", err)
	}
	if sum.Listed != 7 || sum.Referenced != 4 || sum.Quarantined != 3 || sum.Deleted != 2 || sum.Failed != 1 ||
		sum.BytesFreed != sizes[orphans[0]]+sizes[orphans[2]] || sum.RecordsRead != 4 || sum.Compacted || sum.Mode != lifecycle.ModeFull {
		t.Fatalf("summary %+v", sum)
	}
	if want := []string{"list", "read", "quarantine", "settle", "recheck", "late", "finish"}; !slices.Equal(phases, want) {
		t.Fatalf("progress phases %v, want %v", phases, want)
	}
	for _, p := range live {
		if !exists(t, mem, p) {
			t.Fatalf("live %s deleted", p)
		}
	}
	for _, p := range orphans {
		if exists(t, mem, p) {
			t.Fatalf("orphan %s still at its key", p)
		}
	}
	// The failed one is in quarantine, with the manifest.
	if q := quarantineKeys(t, mem); len(q) != 2 || !strings.HasSuffix(q[0]+q[1], "manifest.json") && !strings.Contains(q[0], "manifest.json") {
		t.Fatalf("quarantine holds %v, want the failed object and the manifest", q)
	}
	// The next run finishes the folder: the object is deleted.
	sum, err = lifecycle.Collect(ctx, cl, mem, lifecycle.Options{Topic: "t", Now: later, SettleSet: true})
	if err != nil || sum.LeftoverRuns != 1 || sum.LeftoverDeleted != 1 || sum.Deleted != 0 || sum.BytesFreed != 0 ||
		len(sum.LeftoverDeletedObjects) != 1 || sum.LeftoverBytesFreed != sum.LeftoverDeletedObjects[0].Size || sum.LeftoverBytesFreed == 0 {
		t.Fatalf("second run: %v, %+v", err, sum)
	}
	if q := quarantineKeys(t, mem); len(q) != 0 {
		t.Fatalf("quarantine still holds %v", q)
	}
}

// Bad options and a missing topic are clear errors that delete nothing.
func TestCollectBadInput(t *testing.T) {
	ctx := ctxT(t)
	cl := newCluster(t)
	mem := memStore(t, nil)
	for _, c := range []struct {
		o    lifecycle.Options
		want string
	}{
		{lifecycle.Options{}, "no topic"},
		{lifecycle.Options{Topic: "t", Grace: -time.Second}, "negative"},
		{lifecycle.Options{Topic: "t", Settle: -time.Second}, "negative"},
		{lifecycle.Options{Topic: "t", Mode: "sometimes"}, "want auto, full or checkpoint"},
		{lifecycle.Options{Topic: "missing"}, "topic missing does not exist"},
	} {
		if _, err := lifecycle.Collect(ctx, cl, mem, c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.o, err, c.want)
		}
	}
}

// A content id republished between the listing and the move is not
// quarantined (its Version changed), and its record resolves.
func TestCollectRepublishedBeforeMove(t *testing.T) {
	ctx := ctxT(t)
	cl := newCluster(t)
	mem := memStore(t, payloadstore.IDSHA256{})
	payload := noise(7, 2000)
	resp, err := payloadstore.PublishBytes(ctx, mem, "t", payload) // an orphan, for now
	if err != nil {
		t.Fatal(err)
	}
	var path []string
	sum, err := lifecycle.Collect(ctx, cl, mem, lifecycle.Options{Topic: "t", GraceSet: true, SettleSet: true,
		Progress: func(p lifecycle.Progress) {
			if p.Phase == "quarantine" && path == nil {
				// A producer publishes the same bytes again and produces.
				path = produce(t, cl, mem, 0, payload)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if len(path) != 1 || path[0] != resp.FullPayloadPath {
		t.Fatalf("republished to %v, want %s", path, resp.FullPayloadPath)
	}
	if sum.Changed != 1 || sum.Quarantined != 0 || sum.Deleted != 0 || !exists(t, mem, path[0]) {
		t.Fatalf("summary %+v; object exists: %v", sum, exists(t, mem, path[0]))
	}
}

// A record produced after the move, referencing a quarantined object (its
// producer published before gc listed and produced late, within the settle
// time), makes gc restore the object; the other quarantined object is
// deleted.
func TestCollectRestoresObjectReferencedDuringSettle(t *testing.T) {
	t.Run("plain", func(t *testing.T) { collectRestores(t, memStore(t, nil)) })
	// Encrypted: the quarantine moves sealed objects and back to their
	// own key, where they still open.
	t.Run("encrypted", func(t *testing.T) {
		k := make([]byte, 32)
		crand.Read(k)
		kr, err := envelope.OpenKeyring(context.Background(), envelope.Config{KeyURL: "base64key://" + base64.URLEncoding.EncodeToString(k)})
		if err != nil {
			t.Fatal(err)
		}
		s := payloadstore.Encrypted(memStore(t, nil), payloadstore.Encryption{Keyring: kr})
		t.Cleanup(func() { s.Close() })
		collectRestores(t, s)
	})
}

func collectRestores(t *testing.T, mem payloadstore.PayloadStore) {
	ctx := ctxT(t)
	cl := newCluster(t)
	cfg := largemessage.DefaultConfig()
	cfg.Threshold = 500
	prod, err := largemessage.NewProducer(cl, mem, cfg)
	if err != nil {
		t.Fatal(err)
	}
	late := &kgo.Record{Topic: "t", Partition: 1, Value: noise(11, 3000)}
	if _, err := prod.Prepare(ctx, late); err != nil { // published, not produced yet
		t.Fatal(err)
	}
	orphan, err := payloadstore.PublishBytes(ctx, mem, "t", noise(12, 3000))
	if err != nil {
		t.Fatal(err)
	}
	sum, err := lifecycle.Collect(ctx, cl, mem, lifecycle.Options{Topic: "t", GraceSet: true, Settle: 200 * time.Millisecond, SettleSet: true,
		Progress: func(p lifecycle.Progress) {
			if p.Phase == "settle" && late.Offset == 0 {
				if err := cl.ProduceSync(ctx, late).FirstErr(); err != nil {
					t.Error(err)
				}
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := largemessage.DecodeReference(late.Value)
	if sum.Quarantined != 2 || sum.Restored != 1 || sum.Deleted != 1 || sum.Rechecked != 1 ||
		len(sum.RestoredObjects) != 1 || sum.RestoredObjects[0].FullPath != ref.FullPayloadPath {
		t.Fatalf("summary %+v", sum)
	}
	if !exists(t, mem, ref.FullPayloadPath) || exists(t, mem, orphan.FullPayloadPath) {
		t.Fatal("the late record's object was not restored, or the orphan not deleted")
	}
	// Restored objects get a new ModTime: a later run sees them as new.
	ops, _ := payloadstore.Objects(mem)
	key, _ := ops.Root().Key(ref.FullPayloadPath)
	if oi, err := ops.Stat(ctx, key); err != nil || time.Since(oi.ModTime) > 5*time.Second {
		t.Fatalf("restored object: %+v %v", oi, err)
	}
}

// A run cancelled during the settle time leaves its quarantine; the next
// run finishes it with the same rule: an object a record appended since
// references is restored, the other deleted. A folder without a manifest is
// restored whole.
func TestCollectFinishesInterruptedRun(t *testing.T) {
	cl := newCluster(t)
	mem := memStore(t, nil)
	ctx := ctxT(t)
	cfg := largemessage.DefaultConfig()
	cfg.Threshold = 500
	prod, err := largemessage.NewProducer(cl, mem, cfg)
	if err != nil {
		t.Fatal(err)
	}
	late := &kgo.Record{Topic: "t", Partition: 2, Value: noise(21, 3000)}
	if _, err := prod.Prepare(ctx, late); err != nil {
		t.Fatal(err)
	}
	orphan, err := payloadstore.PublishBytes(ctx, mem, "t", noise(22, 3000))
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	sum, err := lifecycle.Collect(cctx, cl, mem, lifecycle.Options{Topic: "t", GraceSet: true, Settle: time.Minute, SettleSet: true,
		Progress: func(p lifecycle.Progress) {
			if p.Phase == "settle" {
				cancel()
			}
		}})
	if !errors.Is(err, context.Canceled) || sum.Quarantined != 2 {
		t.Fatalf("cancelled run: %v %+v", err, sum)
	}
	if q := quarantineKeys(t, mem); len(q) != 3 {
		t.Fatalf("quarantine after the interrupted run: %v", q)
	}
	if err := cl.ProduceSync(ctx, late).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// A folder without a manifest (written by hand).
	stray, err := payloadstore.PublishBytes(ctx, mem, "t", noise(23, 3000))
	if err != nil {
		t.Fatal(err)
	}
	ops, _ := payloadstore.Objects(mem)
	key, kp, _ := ops.Root().KeyOf(stray.FullPayloadPath)
	if err := ops.Move(ctx, key, "t/.ferry-gc/q/stray/"+kp.Shard+"/"+kp.ID); err != nil {
		t.Fatal(err)
	}

	sum, err = lifecycle.Collect(ctx, cl, mem, lifecycle.Options{Topic: "t", Grace: time.Hour, SettleSet: true})
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := largemessage.DecodeReference(late.Value)
	if sum.LeftoverRuns != 2 || sum.LeftoverRestored != 2 || sum.LeftoverDeleted != 1 || sum.Quarantined != 0 {
		t.Fatalf("summary %+v", sum)
	}
	if !exists(t, mem, ref.FullPayloadPath) || !exists(t, mem, stray.FullPayloadPath) || exists(t, mem, orphan.FullPayloadPath) {
		t.Fatal("leftovers not finished by the rule")
	}
	if q := quarantineKeys(t, mem); len(q) != 0 {
		t.Fatalf("quarantine still holds %v", q)
	}
}

// Checkpoint mode: the first run reads the topic (no usable checkpoint) and
// stores one; once DeleteRecords moved every partition's log start past it,
// a run deletes the objects older than it without reading a record, and
// keeps the newer ones.
func TestCollectCheckpointMode(t *testing.T) {
	ctx := ctxT(t)
	cl := newCluster(t)
	mem := memStore(t, nil)
	oldPaths := produce(t, cl, mem, 0, noise(31, 1000), noise(32, 1000))
	oldPaths = append(oldPaths, produce(t, cl, mem, 1, noise(33, 1000))...)
	o := lifecycle.Options{Topic: "t", GraceSet: true, SettleSet: true}
	sum, err := lifecycle.Collect(ctx, cl, mem, o)
	if err != nil || sum.Mode != lifecycle.ModeFull || sum.RecordsRead != 3 || sum.Deleted != 0 {
		t.Fatalf("first run: %v %+v", err, sum)
	}
	// Checkpoint mode without a usable checkpoint: nothing is a candidate.
	o.Mode = lifecycle.ModeCheckpoint
	sum, err = lifecycle.Collect(ctx, cl, mem, o)
	if err != nil || sum.Mode != lifecycle.ModeCheckpoint || sum.RecordsRead != 0 || sum.Unproven != 3 || sum.Deleted != 0 {
		t.Fatalf("checkpoint run before retention: %v %+v", err, sum)
	}
	time.Sleep(10 * time.Millisecond)
	newPaths := produce(t, cl, mem, 0, noise(34, 1000))
	// Retention: delete partitions 0 and 1 up to the first run's checkpoint.
	adm := kadm.NewClient(cl)
	var offs kadm.Offsets
	offs.Add(kadm.Offset{Topic: "t", Partition: 0, At: 2})
	offs.Add(kadm.Offset{Topic: "t", Partition: 1, At: 1})
	if _, err := adm.DeleteRecords(ctx, offs); err != nil {
		t.Fatal(err)
	}
	o.Mode = lifecycle.ModeAuto
	sum, err = lifecycle.Collect(ctx, cl, mem, o)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Mode != lifecycle.ModeCheckpoint || sum.RecordsRead != 0 || sum.Deleted != 3 || sum.Unproven != 1 || sum.Checkpoint.IsZero() {
		t.Fatalf("checkpoint run: %+v", sum)
	}
	for _, p := range oldPaths {
		if exists(t, mem, p) {
			t.Fatalf("%s kept", p)
		}
	}
	if !exists(t, mem, newPaths[0]) {
		t.Fatal("the object of the live record was deleted")
	}
}

func TestCheckpoints(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := lifecycle.NewCheckpoint(t0, map[int32]int64{0: 10, 1: 5})
	for _, tc := range []struct {
		ls   map[int32]int64
		want bool
	}{
		{map[int32]int64{0: 10, 1: 5}, true},
		{map[int32]int64{0: 10, 1: 5, 2: 0}, true}, // a partition added later counts as 0
		{map[int32]int64{0: 9, 1: 5}, false},
		{map[int32]int64{0: 10}, false}, // partition 1 unknown now
	} {
		if got := c.Passed(tc.ls); got != tc.want {
			t.Errorf("passed(%v) = %v", tc.ls, got)
		}
	}
	var cps []lifecycle.Checkpoint
	for i := range 100 {
		cps = append(cps, lifecycle.NewCheckpoint(t0.Add(time.Duration(i)*time.Hour), map[int32]int64{0: int64(i * 10)}))
	}
	got := lifecycle.PruneCheckpoints(cps, map[int32]int64{0: 205}) // 0..20 passed
	if !got[0].Time.Equal(t0.Add(20*time.Hour)) || len(got) != 1+lifecycle.MaxPendingCheckpoints {
		t.Fatalf("pruned to %d, first %v", len(got), got[0].Time)
	}
	if !got[len(got)-1].Time.Equal(t0.Add(99 * time.Hour)) {
		t.Fatal("the newest checkpoint was dropped")
	}
}

func TestGroups(t *testing.T) {
	gs := lifecycle.Groups(map[int32][2]int64{0: {0, 100}, 1: {0, 10}, 2: {5, 5}, 3: {0, 90}, 4: {0, 20}}, 2)
	if len(gs) != 2 || !slices.Equal(gs[0], []int32{0, 1}) || !slices.Equal(gs[1], []int32{3, 4}) {
		t.Fatalf("groups %v", gs)
	}
	if gs := lifecycle.Groups(map[int32][2]int64{0: {3, 3}}, 4); len(gs) != 0 {
		t.Fatalf("groups %v for nothing to read", gs)
	}
}

func TestObjectName(t *testing.T) {
	for in, want := range map[string]string{
		"file:///var/ferry/orders/ba/abc":       "orders/ba/abc",
		"file:///mnt/other/ferry/orders/ba/abc": "orders/ba/abc",
		"s3://bucket/prefix/orders/ba/abc":      "orders/ba/abc",
		"s3://bucket/orders/ba/abc":             "orders/ba/abc",
		"file:///var/ferry/orders/abc":          "orders/abc", // the layout before shards
		"x/y":                                   "x/y",
		"":                                      "",
	} {
		if got := lifecycle.ObjectName(in); got != want {
			t.Errorf("ObjectName(%q) = %q, want %q", in, got, want)
		}
	}
}

// secondStore is a mem store whose ModTimes have the resolution of S3's
// (and Azure's): whole seconds, as its listing and HEAD report them.
type secondStore struct{ *payloadstore.MemStore }

func (s secondStore) List(ctx context.Context, topic string, fn func(payloadstore.ObjectInfo) error) error {
	return s.MemStore.List(ctx, topic, func(oi payloadstore.ObjectInfo) error {
		oi.ModTime = oi.ModTime.Truncate(time.Second)
		return fn(oi)
	})
}

func (s secondStore) ListKeys(ctx context.Context, prefix string, fn func(string, payloadstore.ObjectInfo) error) error {
	return s.MemStore.ListKeys(ctx, prefix, func(k string, oi payloadstore.ObjectInfo) error {
		oi.ModTime = oi.ModTime.Truncate(time.Second)
		return fn(k, oi)
	})
}

func (s secondStore) Stat(ctx context.Context, key string) (payloadstore.ObjectInfo, error) {
	oi, err := s.MemStore.Stat(ctx, key)
	oi.ModTime = oi.ModTime.Truncate(time.Second)
	return oi, err
}

// A payload published after a checkpoint was taken, within the same second,
// on a store that keeps ModTimes to the second (S3): its ModTime reads as
// earlier than the checkpoint, and checkpoint mode took it for garbage and
// deleted the payload of a live record (seen with ferry gc --grace 0s on the
// S3 server). A ModTime of whole seconds counts as the end of its second.
func TestCollectCheckpointModeSecondResolution(t *testing.T) {
	ctx := ctxT(t)
	cl := newCluster(t)
	store := secondStore{memStore(t, nil)}
	produce(t, cl, store, 0, noise(41, 1000))
	// Early in a second, so that the checkpoint and the next publish share it.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
	t0 := time.Now()
	o := lifecycle.Options{Topic: "t", GraceSet: true, SettleSet: true, Now: func() time.Time { return t0 }}
	if sum, err := lifecycle.Collect(ctx, cl, store, o); err != nil || sum.Mode != lifecycle.ModeFull {
		t.Fatalf("first run: %v %+v", err, sum)
	}
	live := produce(t, cl, store, 0, noise(42, 1000))
	if time.Now().Truncate(time.Second).After(t0) {
		t.Skip("the publish fell in the second after the checkpoint's: nothing to check (a slow machine)")
	}
	var offs kadm.Offsets
	offs.Add(kadm.Offset{Topic: "t", Partition: 0, At: 1})
	if _, err := kadm.NewClient(cl).DeleteRecords(ctx, offs); err != nil {
		t.Fatal(err)
	}
	o.Now = nil
	sum, err := lifecycle.Collect(ctx, cl, store, o)
	if err != nil || sum.Mode != lifecycle.ModeCheckpoint {
		t.Fatalf("checkpoint run: %v %+v", err, sum)
	}
	if !exists(t, store, live[0]) {
		t.Fatalf("the object of the live record, published after the checkpoint, was deleted: %+v", sum)
	}
	if sum.Deleted != 1 || sum.Unproven != 1 {
		t.Fatalf("checkpoint run: %+v, want the old object deleted and the live one kept", sum)
	}
}
