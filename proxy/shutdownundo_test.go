package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
)

// hangingDeletes is a file store whose Delete hangs until its context ends
// or the test releases it: a store that stopped answering. A real store
// cannot be made to hang on demand.
type hangingDeletes struct {
	payloadstore.PayloadStore
	published, deletes atomic.Int64
	release            chan struct{}
}

func (s *hangingDeletes) Publish(ctx context.Context, topic string, p payloadstore.Payload) (payloadstore.PayloadResponse, error) {
	r, err := s.PayloadStore.Publish(ctx, topic, p)
	if err == nil {
		s.published.Add(1)
	}
	return r, err
}

func (s *hangingDeletes) Delete(ctx context.Context, fullPath string) error {
	s.deletes.Add(1)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-s.release:
		return s.PayloadStore.Delete(ctx, fullPath)
	}
}

// hanging holds the stores opened under the scheme "test-hanging-deletes"
// (the file store of the URL's path), by path.
var hanging = struct {
	sync.Mutex
	m map[string]*hangingDeletes
}{m: map[string]*hangingDeletes{}}

func init() {
	payloadstore.Register("test-hanging-deletes", func(ctx context.Context, u *url.URL, opts payloadstore.Options) (payloadstore.PayloadStore, error) {
		fs, err := payloadstore.Open(ctx, "file://"+u.Path, opts)
		if err != nil {
			return nil, err
		}
		s := &hangingDeletes{PayloadStore: fs, release: make(chan struct{})}
		hanging.Lock()
		hanging.m[u.Path] = s
		hanging.Unlock()
		return s, nil
	})
}

// A Produce request whose payload was published and that is abandoned when
// Shutdown's deadline closes its connection (never forwarded: the
// connection's queue was full) has its payload's delete cut short at that
// deadline, not held for the store's own timeout: Shutdown keeps its bound
// when the store hangs (a fault hunt saw a 3 s bound take 5.2 s), and says
// how many payloads were left for ferry gc.
func TestShutdownBoundsAbandonedDeletes(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	dir := t.TempDir()
	logs := &logCounter{}
	s := startProxy(t, Config{Upstream: c.ListenAddrs(), Logger: slog.New(logs), MaxInFlight: 1,
		Interceptors: []interceptor.Spec{{Name: "large-message", Config: map[string]string{
			largemessage.KeyStoreURL: "test-hanging-deletes://" + dir, largemessage.KeyThreshold: "1000",
			largemessage.KeyStoreTimeout: "60000", "topic.pattern": ".*"}}}})
	hanging.Lock()
	store := hanging.m[dir]
	hanging.Unlock()
	if store == nil {
		t.Fatal("the large-message interceptor did not open the test store")
	}
	var released sync.Once
	release := func() { released.Do(func() { close(store.release) }) }
	t.Cleanup(release)

	client, err := net.DialTimeout("tcp", s.Addr(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// Two Fetch requests the broker holds (no data, 30 s MaxWait): one
	// being answered, one queued, which fills the queue (max.in.flight 1).
	for corr := int32(1); corr <= 2; corr++ {
		req := kmsg.NewPtrFetchRequest()
		req.Version, req.MaxWaitMillis, req.MinBytes, req.MaxBytes = 12, 30000, 1, 1<<20
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic = "t"
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.PartitionMaxBytes, rp.CurrentLeaderEpoch, rp.LogStartOffset = 1<<20, -1, -1
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		if _, err := client.Write(kmsg.NewRequestFormatter(kmsg.FormatterClientID("t")).AppendRequest(nil, req, corr)); err != nil {
			t.Fatal(err)
		}
	}
	// A Produce request of a 100 KB value: offloaded (its payload
	// published), then waiting for room in the queue.
	produce := bigProduceFrame("t", 100_000)
	binary.BigEndian.PutUint32(produce[8:], 3) // correlation id
	if _, err := client.Write(produce); err != nil {
		t.Fatal(err)
	}
	var cn *conn
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.mu.Lock()
		for x := range s.conns {
			cn = x
		}
		s.mu.Unlock()
		if cn != nil && cn.inFlight.Load() == 3 && store.published.Load() == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Produce request did not wait for the queue with its payload published (in flight %d, published %d)",
				func() int32 {
					if cn == nil {
						return -1
					}
					return cn.inFlight.Load()
				}(), store.published.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}

	const bound, margin = 500 * time.Millisecond, 5 * time.Second // the store's own timeout is 60 s
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	start := time.Now()
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(ctx) }()
	select {
	case err = <-shut:
	case <-time.After(bound + margin):
		release() // let it end
		err = <-shut
		t.Fatalf("Shutdown with a %v bound returned after %v (%v): the abandoned request's payload delete held it (deletes %d)",
			bound, time.Since(start).Round(time.Millisecond), err, store.deletes.Load())
	}
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v, want its deadline (the held Fetch requests were in flight)", err)
	}
	if store.deletes.Load() != 1 {
		t.Fatalf("%d deletes asked of the store, want 1 (the abandoned request's payload)", store.deletes.Load())
	}
	var left int64 = -1
	logs.mu.Lock()
	for _, r := range logs.recs {
		if r.Level == slog.LevelWarn && r.Message != "" && containsAll(r.Message, "left in the store", "ferry gc") {
			r.Attrs(func(a slog.Attr) bool {
				if a.Key == "payloads" {
					left = a.Value.Int64()
				}
				return true
			})
		}
	}
	logs.mu.Unlock()
	if left != 1 {
		t.Fatalf("the warning of payloads left for ferry gc counts %d, want 1", left)
	}
	t.Logf("Shutdown returned after %v (bound %v)", took.Round(time.Millisecond), bound)
}

// containsAll reports whether s contains every one of subs.
func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
