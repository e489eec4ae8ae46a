package proxy

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// streamProxy is a proxy with large-message on fetch streaming values over
// 1 MiB from a file store, in front of kfake with topics big and other,
// whose records the Go library offloaded to the same store.
func streamProxy(t *testing.T) (*Server, *kfake.Cluster, *largemessage.Serializer) {
	t.Helper()
	s, c, store := bothProxyConfig(t, map[string]string{"side": "fetch"}, nil)
	return s, c, largemessage.NewSerializer(store, largemessage.Codec{Type: "none"})
}

// produceOffloaded produces values to topic directly (not through the
// proxy), offloaded by ser, and returns their objects' file paths.
func produceOffloaded(t *testing.T, c *kfake.Cluster, ser *largemessage.Serializer, topic string, values ...[]byte) []string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var files []string
	for _, v := range values {
		rec := &kgo.Record{Topic: topic, Value: v, Headers: []kgo.RecordHeader{{Key: "app", Value: []byte("x")}}}
		if _, err := ser.Offload(context.Background(), rec, largemessage.DeriveLimits(1<<20, 1<<20, 0)); err != nil {
			t.Fatal(err)
		}
		ref, err := largemessage.DecodeReference(rec.Value)
		if err != nil {
			t.Fatal(err)
		}
		u, _ := url.Parse(ref.FullPayloadPath)
		files = append(files, u.Path)
		if err := cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	return files
}

func randomValue(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// consume reads up to n records of topic through the proxy within d.
func consume(t *testing.T, addr, topic string, n int, d time.Duration) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxBytes(64<<20), kgo.FetchMaxPartitionBytes(64<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var got []*kgo.Record
	for len(got) < n && ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) { got = append(got, r) })
	}
	return got
}

// Values streamed through the proxy reach a franz-go consumer as produced
// (byte for byte, headers as produced); a corrupted object closes the
// consumer's connection without a valid batch, is counted, and the proxy
// keeps serving other topics.
func TestProxyStreamsLargeValues(t *testing.T) {
	s, c, ser := streamProxy(t)
	values := [][]byte{randomValue(1, 3<<20), randomValue(2, 5<<20+3)}
	produceOffloaded(t, c, ser, "other", values...)
	got := consume(t, s.Addr(), "other", 2, 30*time.Second)
	if len(got) != 2 {
		t.Fatalf("consumed %d records, want 2", len(got))
	}
	for i, r := range got {
		if !bytes.Equal(r.Value, values[i]) {
			t.Errorf("record %d: %d bytes differ from the %d produced", i, len(r.Value), len(values[i]))
		}
		if len(r.Headers) != 1 || r.Headers[0].Key != "app" {
			t.Errorf("record %d: headers %v", i, r.Headers)
		}
	}
	if n := s.mem.InUse(); n > 32<<20 {
		t.Errorf("%d bytes of the budget held after the fetch", n)
	}

	files := produceOffloaded(t, c, ser, "big", randomValue(3, 4<<20))
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-10] ^= 0xff // near the end: most of the value is written before the check fails
	if err := os.WriteFile(files[0], b, 0o644); err != nil {
		t.Fatal(err)
	}
	bad := consume(t, s.Addr(), "big", 1, 5*time.Second)
	if len(bad) != 0 {
		t.Fatalf("the consumer got %d records from a corrupted object", len(bad))
	}
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(s.m.errors.WithLabelValues("fetch_stream")) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := testutil.ToFloat64(s.m.errors.WithLabelValues("fetch_stream")); n == 0 {
		t.Fatal("no fetch_stream error counted")
	}
	// Other consumers are still served.
	if got := consume(t, s.Addr(), "other", 2, 30*time.Second); len(got) != 2 || !bytes.Equal(got[1].Value, values[1]) {
		t.Fatalf("after the corrupt stream: %d records", len(got))
	}
	// Every stream's buffers and downloads are given back, failed or not.
	deadline = time.Now().Add(10 * time.Second)
	for s.mem.InUse() != 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := s.mem.InUse(); n != 0 {
		t.Fatalf("%d bytes of proxy.memory.max.bytes still held after the streams", n)
	}
}
