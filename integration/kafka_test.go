// Package integration runs Ferry against a real Apache Kafka broker started
// by scripts/test (FERRY_KAFKA_BROKERS). The broker keeps Kafka's default
// limits (message.max.bytes 1048588). Without the variable the tests skip,
// except under CI, where they fail: they must never pass on kfake alone.
package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// brokers returns the real broker's address or skips (fails under CI).
func brokers(t testing.TB) string {
	t.Helper()
	b := os.Getenv("FERRY_KAFKA_BROKERS")
	if b == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("FERRY_KAFKA_BROKERS is not set: run the tests with scripts/test, which starts a real Kafka broker")
		}
		t.Skip("FERRY_KAFKA_BROKERS not set; scripts/test starts a real Kafka broker")
	}
	return b
}

var topicSeq atomic.Int64

// newTopic creates a fresh topic with configs on the real broker.
func newTopic(t testing.TB, configs map[string]*string) string {
	t.Helper()
	cl := client(t)
	name := fmt.Sprintf("ferry-it-%s-%d-%d", strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")), time.Now().UnixNano()%1e6, topicSeq.Add(1))
	if len(name) > 200 {
		name = name[:200]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, configs, name)
	if err != nil || resp.Err != nil {
		t.Fatalf("create topic %s: %v %v", name, err, resp.Err)
	}
	waitTopic(t, name, 1)
	return name
}

// waitTopic waits (up to a minute) until the broker serves topic's n
// partitions: each has a leader in Metadata, its end offset lists, and its
// configs describe. CreateTopics answers before a busy broker's metadata
// has the topic, and a test that uses it at once would find it missing.
func waitTopic(t testing.TB, topic string, n int) {
	t.Helper()
	adm := kadm.NewClient(client(t))
	deadline := time.Now().Add(time.Minute)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		last = func() error {
			md, err := adm.Metadata(ctx, topic)
			if err != nil {
				return err
			}
			td, ok := md.Topics[topic]
			if !ok || td.Err != nil || len(td.Partitions) != n {
				return fmt.Errorf("metadata: %v (%d partitions)", td.Err, len(td.Partitions))
			}
			for _, p := range td.Partitions {
				if p.Err != nil || p.Leader < 0 {
					return fmt.Errorf("partition %d: leader %d, %v", p.Partition, p.Leader, p.Err)
				}
			}
			ends, err := adm.ListEndOffsets(ctx, topic)
			if err == nil {
				err = ends.Error()
			}
			if err != nil {
				return err
			}
			rcs, err := adm.DescribeTopicConfigs(ctx, topic)
			if err != nil {
				return err
			}
			rc, err := rcs.On(topic, nil)
			if err != nil {
				return err
			}
			return rc.Err
		}()
		cancel()
		if last == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("topic %s created but not served within a minute: %v", topic, last)
}

func client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(strings.Split(brokers(t), ",")...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

type env struct {
	store payloadstore.PayloadStore
	dir   string
	prod  *largemessage.Producer
	cfg   largemessage.Config
}

// setup opens a file store in a temp dir and a Producer with the given
// client options; threshold 0 derives it from the broker.
func setup(t testing.TB, threshold int64, opts ...kgo.Opt) *env {
	t.Helper()
	dir := t.TempDir()
	cfg := largemessage.DefaultConfig()
	cfg.StoreURL = "file://" + dir
	cfg.Threshold = threshold
	e := envWith(t, cfg, opts...)
	e.dir = dir
	return e
}

// envWith opens cfg's store (closed at the end of the test) and a Producer
// on a client with opts; the producer takes the client's codec.
func envWith(t testing.TB, cfg largemessage.Config, opts ...kgo.Opt) *env {
	t.Helper()
	cfg.Codec.Type = "" // take the client's
	store, err := cfg.OpenStore(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	prod, err := largemessage.NewProducer(client(t, opts...), store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &env{store: store, prod: prod, cfg: cfg}
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// consumeRaw reads n records of topic from the start without resolving.
func consumeRaw(t testing.TB, topic string, n int) []*kgo.Record {
	t.Helper()
	return pollN(t, client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxBytes(64<<20)), n)
}

func produceOK(t testing.TB, e *env, recs ...*kgo.Record) {
	t.Helper()
	for _, r := range e.prod.ProduceSync(ctxT(t, 5*time.Minute), recs...) {
		if r.Err != nil {
			t.Fatalf("produce to %s: %v", r.Record.Topic, r.Err)
		}
	}
}

func randomBytes(seed uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), 7})
	r.Read(b)
	return b
}

func TestBrokerHasDefaultLimits(t *testing.T) {
	e := setup(t, 0, kgo.ProducerBatchMaxBytes(16<<20))
	topic := newTopic(t, nil)
	l := e.prod.Limits(ctxT(t, 30*time.Second), topic)
	if l.MaxMessageBytes != 1048588 {
		t.Fatalf("topic max.message.bytes read from the cluster = %d, want Kafka's default 1048588", l.MaxMessageBytes)
	}
	if l.Threshold != 1048588-largemessage.BatchOverhead {
		t.Fatalf("derived threshold = %d", l.Threshold)
	}
}

// The derived threshold is exact: a record of exactly the threshold is
// accepted inline by the real broker (its batch is exactly max.message.bytes)
// and one byte more is offloaded, and without Ferry that record fails with
// MESSAGE_TOO_LARGE.
func TestExactThresholdAtBrokerLimit(t *testing.T) {
	e := setup(t, 0, kgo.ProducerBatchMaxBytes(16<<20), kgo.ProducerBatchCompression(kgo.NoCompression()))
	topic := newTopic(t, nil)
	l := e.prod.Limits(ctxT(t, 30*time.Second), topic)
	key := []byte("k")
	// value length such that RecordLen == threshold
	n := int(l.Threshold) - 20
	for largemessage.RecordLen(key, make([]byte, n), nil) < l.Threshold {
		n++
	}
	if largemessage.RecordLen(key, make([]byte, n), nil) != l.Threshold {
		t.Fatalf("no value length gives a record of exactly %d bytes", l.Threshold)
	}
	atLimit := &kgo.Record{Topic: topic, Key: key, Value: randomBytes(1, n)}
	over := &kgo.Record{Topic: topic, Key: key, Value: randomBytes(2, n+1)}
	produceOK(t, e, atLimit)
	produceOK(t, e, over)
	if largemessage.IsOffloaded(atLimit) || !largemessage.IsOffloaded(over) {
		t.Fatalf("offloaded: at limit %v, one over %v; want false, true", largemessage.IsOffloaded(atLimit), largemessage.IsOffloaded(over))
	}
	// The same over-limit record without Ferry: the real broker refuses it.
	raw := client(t, kgo.ProducerBatchMaxBytes(16<<20), kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.RecordRetries(0))
	err := raw.ProduceSync(ctxT(t, 30*time.Second), &kgo.Record{Topic: topic, Key: key, Value: randomBytes(2, n+1)}).FirstErr()
	if !errors.Is(err, kerr.MessageTooLarge) {
		t.Fatalf("broker answered %v to a %d-byte batch, want MESSAGE_TOO_LARGE", err, l.MaxMessageBytes+1)
	}
	got := consumeRaw(t, topic, 2)
	if len(got[0].Value) != n || len(got[1].Value) > 1024 {
		t.Fatalf("kafka holds values of %d and %d bytes", len(got[0].Value), len(got[1].Value))
	}
	cons := largemessage.NewConsumer(nil, largemessage.NewDeserializer(e.store, false))
	for i, r := range cons.Resolve(ctxT(t, time.Minute), got) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		want := atLimit.Value
		if i == 1 {
			want = randomBytes(2, n+1)
		}
		if !bytes.Equal(r.Value, want) {
			t.Fatalf("record %d differs after resolve", i)
		}
	}
}

// 5 MiB and 100 MiB values through a broker at default limits, with the
// default franz-go client (ProducerBatchMaxBytes 1000012, snappy).
func TestLargeValuesDefaultLimits(t *testing.T) {
	for _, size := range []int{5 << 20, 100 << 20} {
		t.Run(strconv.Itoa(size>>20)+"MiB", func(t *testing.T) {
			e := setup(t, 0)
			topic := newTopic(t, nil)
			val := randomBytes(uint64(size), size)
			rec := &kgo.Record{Topic: topic, Key: []byte("file"), Value: val}
			produceOK(t, e, rec)
			raw := consumeRaw(t, topic, 1)[0]
			if !largemessage.IsOffloaded(raw) || len(raw.Value) > 1024 {
				t.Fatalf("kafka holds %d value bytes, offloaded=%v", len(raw.Value), largemessage.IsOffloaded(raw))
			}
			de := largemessage.NewDeserializer(e.store, false)
			if err := de.Resolve(ctxT(t, time.Minute), raw); err != nil {
				t.Fatal(err)
			}
			if sha256.Sum256(raw.Value) != sha256.Sum256(val) || largemessage.IsOffloaded(raw) || len(raw.Headers) != 0 {
				t.Fatalf("resolved value differs (len %d) or Ferry headers left: %v", len(raw.Value), raw.Headers)
			}
		})
	}
}

// 1 GiB streamed: written to a file, published from the file, read back
// through the verifying reader; never held in memory whole.
func TestOneGiBStreamed(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	const size = 1 << 30
	e := setup(t, 0)
	topic := newTopic(t, nil)
	src := filepath.Join(t.TempDir(), "1g.bin")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	r := rand.NewChaCha8([32]byte{1, 2, 3})
	if _, err := io.CopyN(io.MultiWriter(f, h), r, size); err != nil {
		t.Fatal(err)
	}
	want := h.Sum(nil)
	p, err := payloadstore.FilePayload(f)
	if err != nil {
		t.Fatal(err)
	}
	rec := &kgo.Record{Topic: topic, Key: []byte("1g.bin")}
	if _, err := e.prod.Serializer().OffloadValue(ctxT(t, 5*time.Minute), rec, p); err != nil {
		t.Fatal(err)
	}
	f.Close()
	os.Remove(src)
	produceOK(t, e, rec)
	raw := consumeRaw(t, topic, 1)[0]
	rc, n, err := largemessage.NewDeserializer(e.store, false).OpenValue(ctxT(t, 5*time.Minute), raw)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	h.Reset()
	got, err := io.Copy(h, rc)
	if err != nil {
		t.Fatal(err)
	}
	if n != size || got != size || !bytes.Equal(h.Sum(nil), want) {
		t.Fatalf("read %d bytes (header %d), digest match %v", got, n, bytes.Equal(h.Sum(nil), want))
	}
}

// An oversized key is offloaded under its content id: equal key bytes give
// byte-identical reference keys, so both records land in one partition.
func TestOffloadedKey(t *testing.T) {
	e := setup(t, 0)
	topic := newTopic(t, nil)
	kadmCl := kadm.NewClient(client(t))
	if _, err := kadmCl.CreatePartitions(ctxT(t, 30*time.Second), 4, topic); err != nil {
		t.Fatal(err)
	}
	key := randomBytes(9, 2<<20)
	recs := []*kgo.Record{
		{Topic: topic, Key: key, Value: []byte("v1")},
		{Topic: topic, Key: bytes.Clone(key), Value: []byte("v2")},
		{Topic: topic, Key: bytes.Clone(key), Value: nil}, // tombstone
	}
	produceOK(t, e, recs...)
	got := consumeRaw(t, topic, 3)
	for _, r := range got {
		if !largemessage.IsKeyOffloaded(r) || largemessage.IsOffloaded(r) {
			t.Fatalf("record at %d: key offloaded %v, value offloaded %v", r.Offset, largemessage.IsKeyOffloaded(r), largemessage.IsOffloaded(r))
		}
		if !bytes.Equal(r.Key, got[0].Key) || r.Partition != got[0].Partition {
			t.Fatalf("equal keys gave different references or partitions")
		}
	}
	de := largemessage.NewDeserializer(e.store, false)
	for i, r := range got {
		if err := de.Resolve(ctxT(t, time.Minute), r); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(r.Key, key) {
			t.Fatalf("record %d: key differs after resolve", i)
		}
	}
	if string(got[0].Value) != "v1" || string(got[1].Value) != "v2" || got[2].Value != nil {
		t.Fatalf("values %q %q %v", got[0].Value, got[1].Value, got[2].Value)
	}
}

// On a zstd topic, a record over the threshold uncompressed but under it
// compressed stays inline and the real broker accepts it; an incompressible
// record of the same size is offloaded.
func TestZstdCompressedStaysInline(t *testing.T) {
	zstd := "zstd"
	e := setup(t, 0, kgo.ProducerBatchCompression(kgo.ZstdCompression()), kgo.ProducerBatchMaxBytes(16<<20))
	topic := newTopic(t, map[string]*string{"compression.type": &zstd})
	l := e.prod.Limits(ctxT(t, 30*time.Second), topic)
	size := int(l.Threshold) + 50_000
	text := bytes.Repeat([]byte("change-data-capture row: id=42 name=ferry status=ok; "), size/53+1)[:size]
	noise := randomBytes(5, size)
	inline := &kgo.Record{Topic: topic, Value: text}
	offload := &kgo.Record{Topic: topic, Value: noise}
	if largemessage.RecordLen(nil, text, nil) <= l.Threshold {
		t.Fatal("test record is not over the threshold uncompressed")
	}
	produceOK(t, e, inline, offload)
	if largemessage.IsOffloaded(inline) || !largemessage.IsOffloaded(offload) {
		t.Fatalf("offloaded: compressible %v, incompressible %v", largemessage.IsOffloaded(inline), largemessage.IsOffloaded(offload))
	}
	got := consumeRaw(t, topic, 2)
	if !bytes.Equal(got[0].Value, text) {
		t.Fatal("inline compressed record differs")
	}
	de := largemessage.NewDeserializer(e.store, false)
	if err := de.Resolve(ctxT(t, time.Minute), got[1]); err != nil || !bytes.Equal(got[1].Value, noise) {
		t.Fatalf("offloaded record: %v", err)
	}
}

// Faults on the consumer side, each named by topic/partition/offset.
func TestConsumerFaults(t *testing.T) {
	e := setup(t, 0)
	topic := newTopic(t, nil)
	val := randomBytes(11, 3<<20)
	missing := &kgo.Record{Topic: topic, Value: val}
	tampered := &kgo.Record{Topic: topic, Value: bytes.Clone(val)}
	produceOK(t, e, missing, tampered)
	// a plain client writes what a broken or hostile producer could
	raw := client(t)
	corrupt := &kgo.Record{Topic: topic, Value: []byte{0, 0, 0, 200, 'x'}, Headers: []kgo.RecordHeader{{Key: "large-message", Value: []byte("true")}}}
	refPasswd, _ := largemessage.PayloadReferenceValue{FullPayloadPath: "file:///etc/passwd", PayloadStoreClass: payloadstore.FileStoreClass}.AppendTo(nil)
	refDotDot, _ := largemessage.PayloadReferenceValue{FullPayloadPath: "file://" + e.dir + "/" + topic + "/../../../etc/passwd", PayloadStoreClass: payloadstore.FileStoreClass}.AppendTo(nil)
	hdr := []kgo.RecordHeader{{Key: "large-message", Value: []byte("true")}}
	if err := raw.ProduceSync(ctxT(t, 30*time.Second), corrupt,
		&kgo.Record{Topic: topic, Value: refPasswd, Headers: hdr},
		&kgo.Record{Topic: topic, Value: refDotDot, Headers: hdr}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// delete one payload, tamper with the other
	pathOf := func(r *kgo.Record) string {
		ref, err := largemessage.DecodeReference(r.Value)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimPrefix(ref.FullPayloadPath, "file://")
	}
	if err := os.Remove(pathOf(missing)); err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(val)
	bad[12345] ^= 1
	if err := os.WriteFile(pathOf(tampered), bad, 0o644); err != nil {
		t.Fatal(err)
	}

	got := consumeRaw(t, topic, 5)
	want := []error{largemessage.ErrPayloadNotFound, largemessage.ErrDigestMismatch, largemessage.ErrCorruptReference, payloadstore.ErrInvalidPath, payloadstore.ErrInvalidPath}
	de := largemessage.NewDeserializer(e.store, false)
	for i, r := range got {
		before := bytes.Clone(r.Value)
		err := de.Resolve(ctxT(t, time.Minute), r)
		var re *largemessage.RecordError
		if !errors.Is(err, want[i]) || !errors.As(err, &re) {
			t.Fatalf("record %d: got %v, want %v", i, err, want[i])
		}
		if re.Topic != topic || re.Partition != 0 || re.Offset != int64(i) || !strings.Contains(err.Error(), fmt.Sprintf("offset %d", i)) {
			t.Fatalf("record %d: error does not name topic/partition/offset: %v", i, err)
		}
		if re.Skipped || !bytes.Equal(r.Value, before) {
			t.Fatalf("record %d: a failed resolve changed the record", i)
		}
	}
	// large.message.skip.not.found.error=true: the missing one comes back
	// with a nil value and the error recorded; the others still fail.
	skip := largemessage.NewDeserializer(e.store, true)
	again := consumeRaw(t, topic, 5)
	err := skip.Resolve(ctxT(t, time.Minute), again[0])
	var re *largemessage.RecordError
	if !errors.As(err, &re) || !re.Skipped || again[0].Value != nil || largemessage.IsOffloaded(again[0]) {
		t.Fatalf("skip mode: err %v, value %v", err, again[0].Value)
	}
	if err := skip.Resolve(ctxT(t, time.Minute), again[1]); !errors.Is(err, largemessage.ErrDigestMismatch) {
		t.Fatalf("skip mode must not skip a digest mismatch: %v", err)
	}
}

// A store that cannot be written: the producer gets the error and nothing
// is appended to the topic.
func TestStoreFailureProducesNothing(t *testing.T) {
	e := setup(t, 0)
	topic := newTopic(t, nil)
	// Replace the topic folder with a file: every publish fails.
	if err := os.WriteFile(filepath.Join(e.dir, topic), []byte("not a dir"), 0o644); err != nil {
		t.Fatal(err)
	}
	res := e.prod.ProduceSync(ctxT(t, time.Minute), &kgo.Record{Topic: topic, Value: randomBytes(3, 2<<20)})
	var se *payloadstore.Error
	if err := res.FirstErr(); !errors.As(err, &se) || se.Op != "publish" {
		t.Fatalf("produce error = %v, want a payload store publish error", err)
	}
	offs, err := kadm.NewClient(client(t)).ListEndOffsets(ctxT(t, 30*time.Second), topic)
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := offs.Lookup(topic, 0); o.Offset != 0 {
		t.Fatalf("end offset %d: a record was appended although the payload was not stored", o.Offset)
	}
}

// Found by review: records that each fit, batched together by a client
// whose ProducerBatchMaxBytes exceeds max.message.bytes, must not be
// rejected; and a topic whose compression.type makes the broker re-encode
// must not see an inline record grow past its limit.
func TestNoMessageTooLargeFromBatchingOrBrokerRecompression(t *testing.T) {
	e := setup(t, 0, kgo.ProducerBatchMaxBytes(8<<20), kgo.ProducerBatchCompression(kgo.NoCompression()))
	topic := newTopic(t, nil)
	a, b := &kgo.Record{Topic: topic, Value: randomBytes(21, 600_000)}, &kgo.Record{Topic: topic, Value: randomBytes(22, 600_000)}
	produceOK(t, e, a, b)
	if largemessage.IsOffloaded(a) || largemessage.IsOffloaded(b) {
		t.Fatal("600 kB records were offloaded under a 1 MiB limit")
	}
	for _, codec := range []string{"gzip", "lz4", "zstd", "snappy", "uncompressed"} {
		c := codec
		topic := newTopic(t, map[string]*string{"compression.type": &c})
		l := e.prod.Limits(ctxT(t, 30*time.Second), topic)
		n := int(l.Threshold) - 8
		orig := randomBytes(23, n)
		produceOK(t, e, &kgo.Record{Topic: topic, Value: bytes.Clone(orig)}) // fails on MESSAGE_TOO_LARGE
		got := consumeRaw(t, topic, 1)[0]
		if err := largemessage.NewDeserializer(e.store, false).Resolve(ctxT(t, time.Minute), got); err != nil || !bytes.Equal(got.Value, orig) {
			t.Fatalf("%s topic: resolve %v, equal %v", codec, err, bytes.Equal(got.Value, orig))
		}
	}
}

// With franz-go's default client (ProducerBatchMaxBytes 1000012, snappy),
// a record of exactly the derived threshold is accepted by the client and
// the broker, and one byte more is offloaded: the client-side limit is
// exact too.
func TestExactThresholdAtClientCap(t *testing.T) {
	e := setup(t, 0)
	topic := newTopic(t, nil)
	l := e.prod.Limits(ctxT(t, 30*time.Second), topic)
	if l.Threshold != 1000012-65 {
		t.Fatalf("threshold %d, want franz-go's cap 1000012 less 65", l.Threshold)
	}
	key := []byte("k")
	n := int(l.Threshold) - 20
	for largemessage.RecordLen(key, make([]byte, n), nil) < l.Threshold {
		n++
	}
	atCap := &kgo.Record{Topic: topic, Key: key, Value: randomBytes(31, n)}
	over := &kgo.Record{Topic: topic, Key: key, Value: randomBytes(32, n+1)}
	produceOK(t, e, atCap, over)
	if largemessage.IsOffloaded(atCap) || !largemessage.IsOffloaded(over) {
		t.Fatalf("offloaded: at cap %v, one over %v; want false, true", largemessage.IsOffloaded(atCap), largemessage.IsOffloaded(over))
	}
	if got := consumeRaw(t, topic, 1)[0]; len(got.Value) != n {
		t.Fatalf("kafka holds %d bytes, want the %d-byte record inline", len(got.Value), n)
	}
}
