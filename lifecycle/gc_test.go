package lifecycle_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/lifecycle"
	"github.com/ferrykit/ferry/payloadstore"
)

// failingStore fails the delete of one object: a fault the in-memory store
// cannot produce by itself.
type failingStore struct {
	*payloadstore.MemStore
	fail string
}

func (s failingStore) Delete(ctx context.Context, fullPath string) error {
	if fullPath == s.fail {
		return &payloadstore.Error{Op: "delete", Path: fullPath, Retryable: true, Err: errors.New("injected failure")}
	}
	return s.MemStore.Delete(ctx, fullPath)
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

// Records over three partitions (one left empty): referenced payloads stay,
// orphans go, and a failed delete is counted while the others still happen.
func TestCollectPartitionsAndFailedDelete(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := newCluster(t)
	mem := payloadstore.NewMemStore(fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano()), nil)
	cfg := largemessage.DefaultConfig()
	cfg.Threshold = 500
	prod, err := largemessage.NewProducer(cl, mem, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i := range 4 {
		recs = append(recs, &kgo.Record{Topic: "t", Partition: int32(i % 2), Value: noise(uint64(i), 1000+i)})
	}
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var live []string
	for _, r := range recs {
		ref, err := largemessage.DecodeReference(r.Value)
		if err != nil || !largemessage.IsOffloaded(r) {
			t.Fatalf("record not offloaded: %v", err)
		}
		live = append(live, ref.FullPayloadPath)
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
	store := failingStore{MemStore: mem, fail: orphans[1]}

	var phases []string
	sum, err := lifecycle.Collect(ctx, cl, store, lifecycle.Options{
		Topic: "t", Now: func() time.Time { return time.Now().Add(25 * time.Hour) },
		Progress: func(p lifecycle.Progress) {
			if len(phases) == 0 || phases[len(phases)-1] != p.Phase {
				phases = append(phases, p.Phase)
			}
		},
	})
	if err == nil || !strings.Contains(err.Error(), "1 of 3 deletes failed") || !strings.Contains(err.Error(), "injected failure") {
		t.Fatalf("Collect error = %v, want one failed delete reported", err)
	}
	if sum.Listed != 7 || sum.Referenced != 4 || sum.Deleted != 2 || sum.Failed != 1 || sum.BytesFreed != sizes[orphans[0]]+sizes[orphans[2]] || sum.RecordsRead != 4 || sum.Compacted {
		t.Fatalf("summary %+v", sum)
	}
	if !slices.Equal(phases, []string{"list", "read", "delete"}) {
		t.Fatalf("progress phases %v", phases)
	}
	for _, p := range append(live, orphans[1]) {
		if _, err := payloadstore.DownloadBytes(ctx, mem, p); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
	}
	for _, p := range []string{orphans[0], orphans[2]} {
		if _, err := payloadstore.DownloadBytes(ctx, mem, p); !errors.Is(err, payloadstore.ErrPayloadNotFound) {
			t.Fatalf("orphan %s still there: %v", p, err)
		}
	}
}

// Bad options and a missing topic are clear errors that delete nothing.
func TestCollectBadInput(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := newCluster(t)
	mem := payloadstore.NewMemStore(fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano()), nil)
	for _, c := range []struct {
		o    lifecycle.Options
		want string
	}{
		{lifecycle.Options{}, "no topic"},
		{lifecycle.Options{Topic: "t", Grace: -time.Second}, "negative"},
		{lifecycle.Options{Topic: "missing"}, "topic missing does not exist"},
	} {
		if _, err := lifecycle.Collect(ctx, cl, mem, c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.o, err, c.want)
		}
	}
}

func TestObjectName(t *testing.T) {
	for in, want := range map[string]string{
		"file:///var/ferry/orders/3f/abc":       "orders/3f/abc",
		"file:///mnt/other/ferry/orders/3f/abc": "orders/3f/abc",
		"s3://bucket/prefix/orders/3f/abc":      "orders/3f/abc",
		"s3://bucket/orders/3f/abc":             "orders/3f/abc",
		"x/y":                                   "x/y",
		"":                                      "",
	} {
		if got := lifecycle.ObjectName(in); got != want {
			t.Errorf("ObjectName(%q) = %q, want %q", in, got, want)
		}
	}
}
