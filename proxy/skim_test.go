package proxy

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/largemessage"
)

// skimProxy is a kfake cluster with topic "lm" of partitions partitions and
// a started proxy in front of it with large-message on every topic
// (large.message.threshold.bytes threshold, a file store in dir).
func skimProxy(t *testing.T, partitions int32, threshold string) (*Server, *kfake.Cluster, string) {
	t.Helper()
	dir := t.TempDir()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, "lm"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	s, err := New(Config{Upstream: c.ListenAddrs(), Listen: "127.0.0.1:0",
		Interceptors: []interceptor.Spec{{Name: "large-message", Config: map[string]string{
			largemessage.KeyStoreURL: "file://" + dir, largemessage.KeyThreshold: threshold}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	return s, c, dir
}

// skimClient is an uncompressing franz-go client of s, closed at the end
// of the test, and a minute's context for it.
func skimClient(t *testing.T, s *Server) (*kgo.Client, context.Context) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return cl, ctx
}

// Through a proxy with large-message (threshold 4 KiB), small records are
// skimmed and pass as they came, while a large one in a frame of the same
// size class is offloaded, and every value reads back through the proxy.
func TestProxySkimPassesSmallOffloadsLarge(t *testing.T) {
	s, c, dir := skimProxy(t, 1, "4096")
	cl, ctx := skimClient(t, s)
	values := [][]byte{[]byte("a"), randomValue(1, 1000), randomValue(2, 10000), []byte("b")}
	for _, v := range values {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "lm", Value: v}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	objects := 0
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			objects++
		}
		return nil
	})
	if objects != 1 {
		t.Fatalf("%d objects in the store, want 1 (the 10000-byte value)", objects)
	}
	// On the broker: the small values as produced, the large one a reference.
	direct := consume(t, c.ListenAddrs()[0], "lm", len(values), 30*time.Second)
	if len(direct) != len(values) {
		t.Fatalf("read %d records from the broker", len(direct))
	}
	for i, r := range direct {
		if large := largemessage.IsOffloaded(r); large != (i == 2) || !large && !bytes.Equal(r.Value, values[i]) {
			t.Fatalf("record %d on the broker: offloaded %v, %d bytes", i, large, len(r.Value))
		}
	}
	got := consume(t, s.Addr(), "lm", len(values), 30*time.Second)
	if len(got) != len(values) {
		t.Fatalf("read %d records through the proxy", len(got))
	}
	for i, r := range got {
		if !bytes.Equal(r.Value, values[i]) || len(r.Headers) != 0 {
			t.Fatalf("record %d through the proxy: %d bytes, headers %v", i, len(r.Value), r.Headers)
		}
	}
}

// Produce requests of 32–64 KiB that the skim passes are read into pooled
// buffers (readWhole) and reused once written upstream; requests the chain
// rewrites are not. Two producers at once, small and offloaded values
// mixed: every value reads back through the proxy byte for byte, and the
// memory budget is all given back.
func TestProxySkimPooledRequestFrames(t *testing.T) {
	s, _, _ := skimProxy(t, 3, "4096")
	before := requestFramesPooled.Load()
	want := produceMidSized(t, s.Addr(), "lm", func(i int) int {
		if i%500 == 7 {
			return 9000 // offloaded: its request goes through the chain
		}
		return 900
	})
	if n := requestFramesPooled.Load() - before; n == 0 {
		t.Fatal("no Produce request was read into a pooled buffer (none between 32 and 64 KiB?)")
	}
	consumeWant(t, s, "lm", want)
}

// A Produce request of 32–64 KiB that encrypt rewrites (every value sealed
// into a copy) gives its pooled frame back as soon as the copy is written
// upstream (the outcome holds nothing of it), not only requests forwarded as
// they came; the package's tests poison what goes back to the pools, so a
// frame still in use would show as a corrupt record. Every value reads back
// through the proxy, opened, byte for byte, and the budget is all given back.
func TestProxyEncryptFreesRewrittenRequestFrames(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "enc"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(i * 7)
	}
	s := startProxy(t, Config{Upstream: c.ListenAddrs(),
		Interceptors: []interceptor.Spec{spec("encrypt", "", interceptor.KeyEncryptKeyURL, "base64key://"+base64.URLEncoding.EncodeToString(key))}})
	pooled0, freed0 := requestFramesPooled.Load(), requestFramesFreed.Load()
	want := produceMidSized(t, s.Addr(), "enc", func(int) int { return 900 })
	// A frame goes back after its request went upstream, which may be
	// after the client has its answer: waited for, within a bound.
	pooled, freed := requestFramesPooled.Load()-pooled0, requestFramesFreed.Load()-freed0
	for deadline := time.Now().Add(10 * time.Second); freed < pooled && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		freed = requestFramesFreed.Load() - freed0
	}
	if pooled == 0 || freed != pooled {
		t.Fatalf("%d rewritten Produce requests read into pooled frames, %d of them given back; want all, and some", pooled, freed)
	}
	consumeWant(t, s, "enc", want)
}

// produceMidSized produces 1,500 records from each of two producers at once
// through addr to topic (3 partitions), the i-th of a producer size(i)
// bytes, in 16 KiB batches over the partitions, lingering: requests of up to
// three batches, most over the proxy's 32 KiB read buffer. It returns the
// values by key.
func produceMidSized(t *testing.T, addr, topic string, size func(i int) int) map[string][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const perProducer = 1500
	want := map[string][]byte{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for p := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ProducerBatchCompression(kgo.NoCompression()),
				kgo.ProducerBatchMaxBytes(16<<10), kgo.ProducerLinger(20*time.Millisecond), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
			if err != nil {
				errs <- err
				return
			}
			defer cl.Close()
			for i := range perProducer {
				key := fmt.Sprintf("p%d-%d", p, i)
				v := randomValue(uint64(p*perProducer+i), size(i))
				mu.Lock()
				want[key] = v
				mu.Unlock()
				cl.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte(key), Value: v}, func(_ *kgo.Record, err error) {
					if err != nil {
						select {
						case errs <- err:
						default:
						}
					}
				})
			}
			if err := cl.Flush(ctx); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return want
}

// consumeWant reads topic through s and checks that it holds exactly the
// values of want, by key, and that s's memory budget is all given back.
func consumeWant(t *testing.T, s *Server, topic string, want map[string][]byte) {
	t.Helper()
	got := consume(t, s.Addr(), topic, len(want), time.Minute)
	if len(got) != len(want) {
		t.Fatalf("read %d records through the proxy, want %d", len(got), len(want))
	}
	for _, r := range got {
		if v, ok := want[string(r.Key)]; !ok || !bytes.Equal(r.Value, v) {
			t.Fatalf("record %s: %d bytes, not the value produced", r.Key, len(r.Value))
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.mem.InUse() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := s.mem.InUse(); n != 0 {
		t.Fatalf("%d bytes of the memory budget still held", n)
	}
}

// A skimmed Produce request whose partition the broker refuses with
// MESSAGE_TOO_LARGE (the topic's max.message.bytes was lowered after the
// proxy cached it): the response is not passed on undecoded, the proxy
// reads the limit again and answers KAFKA_STORAGE_ERROR, so the producer
// sends the record again, and it is offloaded and accepted; so is the
// next one.
func TestProxySkimTooLargeRereadsLimit(t *testing.T) {
	s, c, _ := skimProxy(t, 1, "8192")
	cl, ctx := skimClient(t, s)
	v1, v2, v3 := randomValue(1, 3000), randomValue(2, 3000), randomValue(3, 3000)
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "lm", Value: v1}).FirstErr(); err != nil {
		t.Fatal(err) // the proxy now holds the topic's max.message.bytes
	}
	adm, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	// A refusal is retried when the limit the batch was checked against
	// had been cached for limitRecheck (the retry of a retried batch,
	// checked against the limit read again, is not).
	time.Sleep(limitRecheck + 100*time.Millisecond)
	limit := "2000"
	if _, err := kadm.NewClient(adm).AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &limit}}, "lm"); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "lm", Value: v2}).FirstErr(); err != nil {
		t.Fatalf("with the cached limit: %v (the broker's MESSAGE_TOO_LARGE was not turned into a retry)", err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "lm", Value: v3}).FirstErr(); err != nil {
		t.Fatalf("after the broker's refusal: %v (the proxy did not read the limit again)", err)
	}
	direct := consume(t, c.ListenAddrs()[0], "lm", 3, 30*time.Second)
	if len(direct) != 3 || largemessage.IsOffloaded(direct[0]) || !largemessage.IsOffloaded(direct[1]) || !largemessage.IsOffloaded(direct[2]) {
		t.Fatalf("on the broker: %d records, want the first as produced and the others offloaded", len(direct))
	}
	got := consume(t, s.Addr(), "lm", 3, 30*time.Second)
	if len(got) != 3 || !bytes.Equal(got[0].Value, v1) || !bytes.Equal(got[1].Value, v2) || !bytes.Equal(got[2].Value, v3) {
		t.Fatalf("through the proxy: %d records, not the values produced", len(got))
	}
}
