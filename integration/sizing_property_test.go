package integration

// Property: a record Ferry lets through inline never fails with
// MESSAGE_TOO_LARGE, on every send path, and every acknowledged record
// reads back identical. Random cases against the real broker: record sizes
// clustered around every limit (the derived threshold, the client's batch
// cap, the topic's max.message.bytes), every codec on the producer and on
// the topic (compression.type), sync (one and many records), async and
// concurrent sends, and the topic's limit lowered in the middle of the run.
//
// FERRY_SIZING_CASES sets the number of cases (default 24, which
// ./scripts/test runs), FERRY_SOAK_UNTIL (unix seconds; scripts/soak sets
// it) keeps adding cases until then, and FERRY_SIZING_SEED sets the seed
// (default: the time, logged).

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/largemessage"
)

type sizingCase struct {
	producerCodec string // none, gzip, snappy, lz4, zstd
	topicCodec    string // producer, uncompressed, gzip, snappy, lz4, zstd
	maxMessage    int64  // the topic's max.message.bytes
	clientCap     int32  // ProducerBatchMaxBytes (0: franz-go's default)
	mode          string // sync1, syncN, async, concurrent
	lowerTo       int64  // the topic's limit after half the records (0: unchanged)
	records       int
}

func (c sizingCase) String() string {
	return fmt.Sprintf("producer %s, topic %s, max.message.bytes %d, client cap %d, %s, lowered to %d, %d records",
		c.producerCodec, c.topicCodec, c.maxMessage, c.clientCap, c.mode, c.lowerTo, c.records)
}

func envInt(name string, def int64) int64 {
	if v, err := strconv.ParseInt(os.Getenv(name), 10, 64); err == nil {
		return v
	}
	return def
}

func TestSizingProperty(t *testing.T) {
	brokers(t)
	cases := int(envInt("FERRY_SIZING_CASES", 24))
	seed := uint64(envInt("FERRY_SIZING_SEED", time.Now().UnixNano()))
	t.Logf("FERRY_SIZING_SEED=%d FERRY_SIZING_CASES=%d", seed, cases)
	rng := rand.New(rand.NewPCG(seed, 7))
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	until := envInt("FERRY_SOAK_UNTIL", 0)
	var tooLarge, acked, read int
	ran := 0
	for i := 0; i < cases || time.Now().Unix() < until; i++ {
		ran++
		c := sizingCase{
			producerCodec: pick("none", "gzip", "snappy", "lz4", "zstd"),
			topicCodec:    pick("producer", "producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"),
			maxMessage:    []int64{60_000, 150_000, 400_000, 1048588}[rng.IntN(4)] + int64(rng.IntN(5000)),
			mode:          pick("sync1", "syncN", "async", "concurrent"),
			records:       12 + rng.IntN(12),
		}
		switch rng.IntN(3) {
		case 0:
			c.clientCap = int32(c.maxMessage/2 + int64(rng.IntN(1000)))
		case 1:
			c.clientCap = int32(c.maxMessage * 3)
		}
		if rng.IntN(3) == 0 {
			c.lowerTo = c.maxMessage/2 + int64(rng.IntN(1000))
		}
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			a, r, tl := runSizingCase(t, rng, c)
			acked += a
			read += r
			tooLarge += tl
		})
	}
	t.Logf("%d cases: %d records acknowledged, %d read back identical, %d MESSAGE_TOO_LARGE", ran, acked, read, tooLarge)
	if tooLarge != 0 {
		t.Fatalf("%d records failed with MESSAGE_TOO_LARGE", tooLarge)
	}
}

// sizingValue is n bytes: random (incompressible), text-like, or zeros.
func sizingValue(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	switch rng.IntN(3) {
	case 0:
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
	case 1:
		words := []string{"kafka ", "record ", "batch ", "topic ", "ferry ", "offset ", "12345 "}
		var buf bytes.Buffer
		for buf.Len() < n {
			buf.WriteString(words[rng.IntN(len(words))])
		}
		copy(b, buf.Bytes())
	}
	return b
}

func runSizingCase(t *testing.T, rng *rand.Rand, c sizingCase) (acked, read, tooLarge int) {
	t.Logf("case: %s", c)
	maxMsg := strconv.FormatInt(c.maxMessage, 10)
	topicCodec := c.topicCodec
	topic := newTopic(t, map[string]*string{"max.message.bytes": &maxMsg, "compression.type": &topicCodec})
	opts := []kgo.Opt{kgo.ProducerLinger(20 * time.Millisecond)}
	switch c.producerCodec {
	case "none":
		opts = append(opts, kgo.ProducerBatchCompression(kgo.NoCompression()))
	case "gzip":
		opts = append(opts, kgo.ProducerBatchCompression(kgo.GzipCompression()))
	case "snappy":
		opts = append(opts, kgo.ProducerBatchCompression(kgo.SnappyCompression()))
	case "lz4":
		opts = append(opts, kgo.ProducerBatchCompression(kgo.Lz4Compression()))
	case "zstd":
		opts = append(opts, kgo.ProducerBatchCompression(kgo.ZstdCompression()))
	}
	if c.clientCap > 0 {
		opts = append(opts, kgo.ProducerBatchMaxBytes(c.clientCap))
	}
	e := setup(t, 0, opts...)
	ctx := ctxT(t, 5*time.Minute)
	l := e.prod.Limits(ctx, topic)
	// Sizes clustered around the limits: the threshold, the client's cap,
	// the topic's limit, each +-16 bytes, and a few far from them.
	anchors := []int64{l.Threshold, l.MaxMessageBytes - largemessage.BatchOverhead, l.Threshold / 3}
	if l.ClientBatchMaxBytes > 0 {
		anchors = append(anchors, l.ClientBatchMaxBytes-65)
	}
	recs := make([]*kgo.Record, c.records)
	want := map[string][32]byte{}
	for i := range recs {
		n := anchors[rng.IntN(len(anchors))] + int64(rng.IntN(33)) - 16 - 30 // ~30 bytes of key and framing
		n = max(n, 0)
		if rng.IntN(8) == 0 {
			n = int64(rng.IntN(int(c.maxMessage * 2)))
		}
		key := fmt.Sprintf("k%03d", i)
		v := sizingValue(rng, int(n))
		want[key] = sha256.Sum256(v)
		recs[i] = &kgo.Record{Topic: topic, Key: []byte(key), Value: v}
	}
	errs := make([]error, len(recs))
	var mu sync.Mutex
	done := func(i int) func(*kgo.Record, error) {
		return func(_ *kgo.Record, err error) {
			mu.Lock()
			errs[i] = err
			mu.Unlock()
		}
	}
	half := len(recs) / 2
	lower := func() {
		if c.lowerTo == 0 {
			return
		}
		v := strconv.FormatInt(c.lowerTo, 10)
		_, err := kadm.NewClient(client(t)).AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &v}}, topic)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond) // the broker applies it
	}
	send := func(from, to int) {
		switch c.mode {
		case "sync1":
			for i := from; i < to; i++ {
				errs[i] = e.prod.ProduceSync(ctx, recs[i]).FirstErr()
			}
		case "syncN":
			for j, r := range e.prod.ProduceSync(ctx, recs[from:to]...) {
				errs[from+j] = r.Err
			}
		case "async":
			var wg sync.WaitGroup
			for i := from; i < to; i++ {
				wg.Add(1)
				cb := done(i)
				e.prod.Produce(ctx, recs[i], func(r *kgo.Record, err error) { cb(r, err); wg.Done() })
			}
			wg.Wait()
		case "concurrent":
			var wg sync.WaitGroup
			for g := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := from + g; i < to; i += 4 {
						err := e.prod.ProduceSync(ctx, recs[i]).FirstErr()
						mu.Lock()
						errs[i] = err
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
		}
	}
	send(0, half)
	lower()
	send(half, len(recs))
	for i, err := range errs {
		switch {
		case err == nil:
			acked++
		case errors.Is(err, kerr.MessageTooLarge):
			tooLarge++
			t.Errorf("record %d (%d bytes) failed with MESSAGE_TOO_LARGE: %v", i, len(recs[i].Value), err)
		case errors.Is(err, largemessage.ErrRecordTooLarge):
			t.Errorf("record %d refused: %v", i, err)
		default:
			t.Errorf("record %d: %v", i, err)
		}
	}
	// Every acknowledged record reads back identical.
	de := largemessage.NewDeserializer(e.store, false)
	for _, r := range consumeRaw(t, topic, acked) {
		if err := de.Resolve(ctx, r); err != nil {
			t.Errorf("offset %d: %v", r.Offset, err)
			continue
		}
		if sha256.Sum256(r.Value) != want[string(r.Key)] {
			t.Errorf("offset %d (key %s): the value read back differs", r.Offset, r.Key)
			continue
		}
		read++
	}
	if read != acked {
		t.Errorf("%d records acknowledged, %d read back identical", acked, read)
	}
	return acked, read, tooLarge
}
