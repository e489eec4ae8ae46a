package integration

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/largemessage"
)

// The regressions of "Nothing acknowledged is lost, nothing inline is ever
// too large", one test each, against the real broker.

// A topic whose max.message.bytes is 200000, below franz-go's batch cap:
// records that each fit, sent asynchronously and from several goroutines,
// are never packed into a batch the broker refuses.
func TestAsyncAndConcurrentWithinTopicLimit(t *testing.T) {
	limit := "200000"
	topic := newTopic(t, map[string]*string{"max.message.bytes": &limit})
	e := setup(t, 0, kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.ProducerLinger(50*time.Millisecond))
	ctx := ctxT(t, 2*time.Minute)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for i := range 40 { // async: 40 records of 120 kB, 4.8 MB in flight at once
		wg.Add(1)
		e.prod.Produce(ctx, &kgo.Record{Topic: topic, Value: randomBytes(uint64(i), 120_000)}, func(_ *kgo.Record, err error) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
			wg.Done()
		})
	}
	for g := range 4 { // and four goroutines calling ProduceSync
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				err := e.prod.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: randomBytes(uint64(100*g+i), 120_000)}).FirstErr()
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("a record that fits inline failed: %v", err)
		}
	}
	for _, r := range consumeRaw(t, topic, 80) {
		if largemessage.IsOffloaded(r) {
			t.Fatal("a 120 kB record under a 200 kB limit was offloaded")
		}
	}
}

// A topic whose compression.type is the client's codec: an incompressible
// record within a few bytes of the threshold is sent uncompressed by
// franz-go and compressed by the broker, which makes it larger; Ferry
// counts that, so it never fails.
func TestTopicCodecEqualsClientCodecNearThreshold(t *testing.T) {
	for _, codec := range []string{"zstd", "gzip", "lz4", "snappy"} {
		t.Run(codec, func(t *testing.T) {
			c := codec
			topic := newTopic(t, map[string]*string{"compression.type": &c})
			var cc kgo.CompressionCodec
			switch codec {
			case "zstd":
				cc = kgo.ZstdCompression()
			case "gzip":
				cc = kgo.GzipCompression()
			case "lz4":
				cc = kgo.Lz4Compression()
			default:
				cc = kgo.SnappyCompression()
			}
			e := setup(t, 0, kgo.ProducerBatchCompression(cc), kgo.ProducerBatchMaxBytes(8<<20))
			l := e.prod.Limits(ctxT(t, 30*time.Second), topic)
			for _, d := range []int64{-40, -12, -4, 0} {
				v := randomBytes(uint64(-d), int(l.Threshold+d-10))
				r := &kgo.Record{Topic: topic, Value: bytes.Clone(v)}
				if err := e.prod.ProduceSync(ctxT(t, time.Minute), r).FirstErr(); err != nil {
					t.Fatalf("a %d-byte record (threshold %d): %v", len(v), l.Threshold, err)
				}
			}
		})
	}
}

// The topic's max.message.bytes is lowered while a producer runs (its
// limits are cached): the next records are not refused; the broker's
// MESSAGE_TOO_LARGE makes the Producer read the limit again, offload and
// retry, so the caller sees no error, and the record reads back.
func TestTopicLimitLoweredWhileProducing(t *testing.T) {
	topic := newTopic(t, nil)
	e := setup(t, 0, kgo.ProducerBatchCompression(kgo.NoCompression()))
	ctx := ctxT(t, 2*time.Minute)
	produceOK(t, e, &kgo.Record{Topic: topic, Value: randomBytes(1, 500_000)})
	v := "100000"
	if _, err := kadm.NewClient(client(t)).AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &v}}, topic); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	want := randomBytes(2, 500_000)
	r := &kgo.Record{Topic: topic, Value: bytes.Clone(want)}
	if err := e.prod.ProduceSync(ctx, r).FirstErr(); err != nil {
		t.Fatalf("after the limit was lowered: %v", err)
	}
	if !largemessage.IsOffloaded(r) {
		t.Fatal("the record sent after the limit fell to 100 kB was not offloaded")
	}
	got := consumeRaw(t, topic, 2)[1]
	if err := largemessage.NewDeserializer(e.store, false).Resolve(ctx, got); err != nil || !bytes.Equal(got.Value, want) {
		t.Fatalf("read back: %v", err)
	}
}

// An error that remains names the topic and the limit that applied, and
// the setting to change.
func TestTooLargeErrorNamesTopicAndSetting(t *testing.T) {
	topic := newTopic(t, nil)
	e := setup(t, 0, kgo.ProducerBatchMaxBytes(1<<20))
	hs := []kgo.RecordHeader{{Key: "h", Value: make([]byte, 2<<20)}}
	err := e.prod.ProduceSync(ctxT(t, time.Minute), &kgo.Record{Topic: topic, Value: []byte("v"), Headers: hs}).FirstErr()
	if !errors.Is(err, largemessage.ErrRecordTooLarge) || !strings.Contains(err.Error(), topic) || !strings.Contains(err.Error(), "max.request.size") {
		t.Fatalf("headers alone over the client's cap: %v", err)
	}
	if errors.Is(err, kerr.MessageTooLarge) {
		t.Fatal("refused by the broker, not before sending")
	}
}
