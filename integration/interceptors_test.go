package integration

// The proxy's KIP-905 interceptors against the real broker (left at its 1 MiB
// default limits) with real clients: kcat, the Java console tools, Python
// confluent-kafka and franz-go go through an in-process proxy; the Go
// library reads straight from the broker. docs/INTERCEPTORS.md lists the
// client settings these tests found necessary.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/internal/faultproxy"
	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
	"github.com/ferrykit/ferry/proxy"
)

// interceptorProxy starts a proxy in front of the real broker running specs,
// each call limited to timeout (0: the default), and returns its address.
func interceptorProxy(t *testing.T, timeout time.Duration, specs ...interceptor.Spec) string {
	t.Helper()
	return startProxyServer(t, proxy.Config{Upstream: proxy.SplitList(brokers(t)),
		Interceptors: specs, InterceptorTimeout: timeout}).Addr()
}

// largeMessageSpec is the large-message interceptor for topic (a pattern)
// over storeURL; extra are more config keys, name=value.
func largeMessageSpec(topic, storeURL string, extra ...string) interceptor.Spec {
	cfg := map[string]string{interceptor.KeyTopicPattern: topic, largemessage.KeyStoreURL: storeURL}
	for _, kv := range extra {
		k, v, _ := strings.Cut(kv, "=")
		cfg[k] = v
	}
	return interceptor.Spec{Name: "large-message", Config: cfg}
}

// interceptorStoreURL is a store on the real S3 server when one runs
// (FERRY_S3_ENDPOINT; always under scripts/test), else a file store.
func interceptorStoreURL(t *testing.T) string {
	t.Helper()
	if os.Getenv("FERRY_S3_ENDPOINT") != "" || os.Getenv("CI") != "" {
		return storetest.S3URL(t, "ferry-interceptors")
	}
	return fileStoreURL(t)
}

// openStore opens storeURL for the test's own checks.
func openStore(t *testing.T, storeURL string) payloadstore.PayloadStore {
	t.Helper()
	s, err := payloadstore.Open(context.Background(), storeURL, payloadstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// printable is n pseudo-random bytes from a 64-letter alphabet without tab,
// newline, ',' or ':', so every console client carries it unchanged.
func printable(seed uint64, n int) []byte {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	b := randomBytes(seed, n)
	for i := range b {
		b[i] = alphabet[b[i]&63]
	}
	return b
}

// digestRecords maps each record's key to the SHA-256 of its value, and
// fails on a key seen twice or on a Ferry header left on a record.
func digestRecords(t *testing.T, label string, recs []clientRecord) map[string][32]byte {
	t.Helper()
	out := map[string][32]byte{}
	for _, r := range recs {
		if _, dup := out[string(r.Key)]; dup {
			t.Fatalf("%s: key %q twice", label, r.Key)
		}
		for _, h := range r.Headers {
			if h.Key == largemessage.HeaderLargeMessage || strings.HasPrefix(h.Key, "ferry.") {
				t.Fatalf("%s: record %q still has Ferry's header %q", label, r.Key, h.Key)
			}
		}
		out[string(r.Key)] = sha256.Sum256(r.Value)
	}
	return out
}

// sameDigests checks that got has exactly want's keys with the same value
// digests; it reports sizes, never the values.
func sameDigests(t *testing.T, label string, got []clientRecord, want map[string][]byte) {
	t.Helper()
	g := digestRecords(t, label, got)
	if len(g) != len(want) {
		t.Fatalf("%s: %d records, want %d", label, len(g), len(want))
	}
	for k, v := range want {
		d, ok := g[k]
		if !ok {
			t.Fatalf("%s: no record with key %q", label, k)
		}
		if d != sha256.Sum256(v) {
			for _, r := range got {
				if string(r.Key) == k {
					t.Fatalf("%s: record %q: value of %d bytes differs from the %d bytes produced", label, k, len(r.Value), len(v))
				}
			}
		}
	}
}

// javaBigHeap runs a Kafka Java tool with a heap for 50 MiB records (the
// console tools hold a record as a line, a String and bytes at once).
func javaBigHeap(t *testing.T, stdin []byte, main string, args ...string) []byte {
	t.Helper()
	a := javaArgs(t, main, args...)
	for i, s := range a {
		if strings.HasPrefix(s, "-Xmx") {
			a[i] = "-Xmx1g"
		}
	}
	return runClient(t, stdin, "java", a...)
}

// checkReferences reads n records of topic straight from the broker and
// checks which carry a reference (offloaded[key]) and which their value
// inline; it returns the raw records.
func checkReferences(t *testing.T, topic string, n int, offloaded map[string]bool, values map[string][]byte) []*kgo.Record {
	t.Helper()
	raw := consumeRaw(t, topic, n)
	for _, r := range raw {
		k := string(r.Key)
		if offloaded[k] {
			if !largemessage.IsOffloaded(r) || len(r.Value) > 1024 {
				t.Fatalf("broker holds record %q (%d bytes, offloaded=%v), want a reference", k, len(r.Value), largemessage.IsOffloaded(r))
			}
			continue
		}
		if largemessage.IsOffloaded(r) || !bytes.Equal(r.Value, values[k]) {
			t.Fatalf("broker holds record %q as %d bytes (offloaded=%v), want its %d bytes inline", k, len(r.Value), largemessage.IsOffloaded(r), len(values[k]))
		}
	}
	return raw
}

// A 50 MiB record from kcat, one from the Java console producer and one
// from franz-go go through the proxy's large-message interceptor to a broker at its 1 MiB
// default; the Java console consumer, Python and franz-go read both back
// through the proxy, the Go library straight from the broker.
func TestInterceptorsLargeRecordEveryClient(t *testing.T) {
	kcatPath(t)
	kafkaToolsCP(t)
	pythonPath(t)
	storeURL := interceptorStoreURL(t)
	topic := clientTopic(t, 1, nil)
	via := interceptorProxy(t, 0, largeMessageSpec(topic, storeURL))
	const size = 50 << 20
	want := map[string][]byte{"kcat-50MiB": printable(51, size), "java-50MiB": printable(52, size), "franz-go-50MiB": printable(53, size)}
	n := len(want)
	start := time.Now()
	step := func(what string) { t.Logf("%s: done after %v", what, time.Since(start).Round(time.Millisecond)) }

	// librdkafka refuses a record over message.max.bytes (default 1000000)
	// before sending it. kcat sends a file given as argument as one record
	// (its line reader takes ~45 s of CPU for one 50 MiB line).
	file := filepath.Join(t.TempDir(), "value")
	if err := os.WriteFile(file, want["kcat-50MiB"], 0o600); err != nil {
		t.Fatal(err)
	}
	runClient(t, nil, kcatPath(t), "-P", "-b", via, "-t", topic, "-k", "kcat-50MiB", "-X", "message.max.bytes=60000000", file)
	step("kcat produce")
	// The Java producer refuses a record over max.request.size (default
	// 1048576) or over buffer.memory (default 32 MiB).
	var in bytes.Buffer
	fmt.Fprintf(&in, "client:java\tjava-50MiB\t%s\n", want["java-50MiB"])
	javaBigHeap(t, in.Bytes(), javaConsoleProducer, "--bootstrap-server", via, "--topic", topic,
		"--reader-property", "parse.key=true", "--reader-property", "parse.headers=true",
		"--command-property", "max.request.size=60000000", "--command-property", "buffer.memory=134217728",
		// The console producer's request.timeout.ms is 1500: too short
		// for 50 MiB through the proxy to the store on a busy machine (it
		// gives up silently, exit 0, record lost).
		"--command-property", "request.timeout.ms=60000", "--command-property", "delivery.timeout.ms=120000")
	step("Java console producer")
	// franz-go refuses a record over ProducerBatchMaxBytes (default
	// 1000012); BrokerMaxWriteBytes (default 100 MiB) bounds the request.
	fprod := viaClient(t, via, kgo.DefaultProduceTopic(topic), kgo.ProducerBatchMaxBytes(60000000))
	if err := fprod.ProduceSync(ctxT(t, time.Minute), &kgo.Record{Key: []byte("franz-go-50MiB"), Value: want["franz-go-50MiB"]}).FirstErr(); err != nil {
		t.Fatalf("franz-go produce of 50 MiB through the proxy: %v", err)
	}
	step("franz-go producer")

	checkReferences(t, topic, n, map[string]bool{"kcat-50MiB": true, "java-50MiB": true, "franz-go-50MiB": true}, want)

	t.Run("JavaConsumer", func(t *testing.T) {
		a := append([]string{"--bootstrap-server", via, "--topic", topic, "--from-beginning",
			"--max-messages", fmt.Sprint(n), "--timeout-ms", "60000"}, javaConsumerArgs...)
		out := javaBigHeap(t, nil, javaConsoleConsumer, a...)
		recs, err := parseJavaConsole(out)
		if err != nil {
			t.Fatalf("console consumer output (%d bytes): %v", len(out), err)
		}
		for i := range recs { // the header the Java producer sent is expected; drop it for the digest check
			recs[i].Headers = slices.DeleteFunc(recs[i].Headers, func(h clientHeader) bool { return h.Key == "client" })
		}
		sameDigests(t, "java console consumer", recs, want)
	})
	t.Run("Python", func(t *testing.T) {
		sameDigests(t, "python consume", pyConsume(t, via, topic), want)
	})
	t.Run("FranzGo", func(t *testing.T) {
		sameDigests(t, "franz-go consume", fromKgo(proxyRecords(t, via, topic, n)), want)
	})
	t.Run("GoLibraryDirect", func(t *testing.T) {
		cons := largemessage.NewConsumer(client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())),
			largemessage.NewDeserializer(openStore(t, storeURL), false))
		ctx := ctxT(t, time.Minute)
		var got []*kgo.Record
		for len(got) < n {
			recs, err := cons.PollRecords(ctx, n-len(got))
			if err != nil {
				t.Fatalf("Go library consume: %v", err)
			}
			for _, r := range recs {
				if r.Err != nil {
					t.Fatalf("Go library resolve of %q: %v", r.Key, r.Err)
				}
				got = append(got, r.Record)
			}
		}
		sameDigests(t, "Go library from the broker", fromKgo(got), want)
	})
}

// codecs are franz-go's compression codecs with their batch attribute.
var codecs = []struct {
	name  string
	codec kgo.CompressionCodec
	attr  uint8
}{
	{"gzip", kgo.GzipCompression(), 1},
	{"snappy", kgo.SnappyCompression(), 2},
	{"lz4", kgo.Lz4Compression(), 3},
	{"zstd", kgo.ZstdCompression(), 4},
}

// batchHook records the batches a franz-go producer had acknowledged.
type batchHook struct {
	mu      sync.Mutex
	batches []kgo.ProduceBatchMetrics
}

func (h *batchHook) written() []kgo.ProduceBatchMetrics {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.batches)
}

func (h *batchHook) OnProduceBatchWritten(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.ProduceBatchMetrics) {
	h.mu.Lock()
	h.batches = append(h.batches, m)
	h.mu.Unlock()
}

// Small and large records in one compressed batch, for every codec: the
// broker holds references for the large ones and the small ones inline, in
// a batch of the same codec, and all read back exactly through the proxy.
func TestInterceptorsMixedCompressedBatch(t *testing.T) {
	storeURL := interceptorStoreURL(t)
	via := interceptorProxy(t, 0, largeMessageSpec("ferry-cl-testinterceptorsmixed.*", storeURL))
	for _, c := range codecs {
		t.Run(c.name, func(t *testing.T) {
			topic := clientTopic(t, 1, nil)
			hook := &batchHook{}
			prod := viaClient(t, via, kgo.DefaultProduceTopic(topic), kgo.ProducerBatchCompression(c.codec),
				kgo.ProducerBatchMaxBytes(16<<20), kgo.ProducerLinger(time.Minute), kgo.WithHooks(hook))
			values := map[string][]byte{}
			large := map[string]bool{}
			var keys []string
			for i := range 6 {
				k := fmt.Sprintf("%s-%d", c.name, i)
				if i%2 == 1 {
					// 1.5 MiB of random bytes then 1.5 MiB of zeros: over
					// 1 MiB compressed too, and the batch compresses (else
					// franz-go sends it uncompressed).
					values[k], large[k] = append(randomBytes(uint64(100+i), 3<<19), make([]byte, 3<<19)...), true
				} else {
					values[k] = bytes.Repeat([]byte(fmt.Sprintf(`{"record":%d,"codec":%q}`, i, c.name)), 20)
				}
				keys = append(keys, k)
			}
			ctx := ctxT(t, time.Minute)
			var wg sync.WaitGroup
			errs := make([]error, len(keys))
			for i, k := range keys {
				wg.Add(1)
				prod.Produce(ctx, &kgo.Record{Key: []byte(k), Value: values[k]}, func(_ *kgo.Record, err error) {
					errs[i] = err
					wg.Done()
				})
			}
			if err := prod.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("produce through the proxy: %v", err)
			}
			// franz-go calls the hook in its own goroutine, after the promises.
			waitFor(t, 10*time.Second, func() bool { return len(hook.written()) > 0 }, func() string { return "no batch written" })
			if b := hook.written(); len(b) != 1 || b[0].NumRecords != len(keys) || b[0].CompressionType != c.attr {
				t.Fatalf("the producer sent batches %+v, want one %s batch of %d records", b, c.name, len(keys))
			}

			raw := checkReferences(t, topic, len(keys), large, values)
			for _, r := range raw {
				if got := r.Attrs.CompressionType(); got != c.attr {
					t.Fatalf("broker holds record %q in a batch of codec %d, want %d (%s)", r.Key, got, c.attr, c.name)
				}
			}
			got := proxyRecords(t, via, topic, len(keys))
			for i, r := range got {
				if string(r.Key) != keys[i] || !bytes.Equal(r.Value, values[keys[i]]) || len(r.Headers) != 0 {
					t.Fatalf("record %d through the proxy: key %q, %d value bytes, headers %v; want %q with its %d bytes and no headers",
						i, r.Key, len(r.Value), r.Headers, keys[i], len(values[keys[i]]))
				}
			}
		})
	}
}

// A transactional producer with large-message active: the aborted
// transaction's records (a large one among them) stay invisible to
// read_committed consumers through the proxy; the committed ones read back.
func TestInterceptorsTransactions(t *testing.T) {
	storeURL := interceptorStoreURL(t)
	topic := clientTopic(t, 1, nil)
	via := interceptorProxy(t, 0, largeMessageSpec(topic, storeURL))
	prod := viaClient(t, via, kgo.DefaultProduceTopic(topic), kgo.TransactionalID("ferry-it-"+topic),
		kgo.ProducerBatchMaxBytes(8<<20))
	values := map[string][]byte{
		"aborted-large": randomBytes(201, 2<<20), "aborted-small": []byte("aborted small"),
		"committed-large": randomBytes(202, 2<<20), "committed-small": []byte("committed small"),
	}
	ctx := ctxT(t, 2*time.Minute)
	for _, end := range []kgo.TransactionEndTry{kgo.TryAbort, kgo.TryCommit} {
		prefix := map[kgo.TransactionEndTry]string{kgo.TryAbort: "aborted", kgo.TryCommit: "committed"}[end]
		if err := prod.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		res := prod.ProduceSync(ctx, &kgo.Record{Key: []byte(prefix + "-large"), Value: values[prefix+"-large"]},
			&kgo.Record{Key: []byte(prefix + "-small"), Value: values[prefix+"-small"]})
		if err := res.FirstErr(); err != nil {
			t.Fatalf("%s transaction: produce: %v", prefix, err)
		}
		if err := prod.EndTransaction(ctx, end); err != nil {
			t.Fatalf("%s transaction: end: %v", prefix, err)
		}
	}
	// read_uncommitted, straight from the broker: all four, the large ones as references.
	checkReferences(t, topic, 4, map[string]bool{"aborted-large": true, "committed-large": true}, values)

	committed := map[string][]byte{"committed-large": values["committed-large"], "committed-small": values["committed-small"]}
	got := proxyRecords(t, via, topic, 2, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	sameDigests(t, "franz-go read_committed", fromKgo(got), committed)
	if pythonOK() {
		sameDigests(t, "python read_committed", pyConsume(t, via, topic, "isolation.level=read_committed"), committed)
	}
}

// pythonOK reports whether the Python client is there (it is optional in
// the tests that use franz-go first).
func pythonOK() bool { return os.Getenv("FERRY_PYTHON") != "" }

// Idempotent producers whose records the proxy rewrites (offloads):
// franz-go (idempotent by default, up to 5 requests in flight) and
// librdkafka (Python, enable.idempotence=true, 5 in flight). Every record
// is acknowledged at the offset of its produce order (no
// OUT_OF_ORDER_SEQUENCE_NUMBER, no duplicate), the broker holds references
// for the large ones, and all read back in order through the proxy.
func TestInterceptorsIdempotentRewritten(t *testing.T) {
	storeURL := interceptorStoreURL(t)
	topic, pyTopic := clientTopic(t, 1, nil), clientTopic(t, 1, nil)
	via := interceptorProxy(t, 0, largeMessageSpec(topic+"|"+pyTopic, storeURL))
	const n = 30
	var values [][]byte
	values2 := map[string][]byte{}
	large := map[string]bool{}
	for i := range n {
		if i%3 == 0 {
			values = append(values, randomBytes(uint64(300+i), 1200<<10))
			large[fmt.Sprint(i)] = true
		} else {
			values = append(values, []byte(fmt.Sprintf("small record %d", i)))
		}
		values2[fmt.Sprint(i)] = values[i]
	}
	readBack := func(topic string) {
		t.Helper()
		checkReferences(t, topic, n, large, values2)
		got := proxyRecords(t, via, topic, n)
		for i, r := range got {
			if r.Offset != int64(i) || string(r.Key) != fmt.Sprint(i) || !bytes.Equal(r.Value, values[i]) {
				t.Fatalf("record at offset %d: key %q, %d value bytes; want key %d with its %d bytes", r.Offset, r.Key, len(r.Value), i, len(values[i]))
			}
		}
	}

	prod := viaClient(t, via, kgo.DefaultProduceTopic(topic), kgo.ProducerBatchMaxBytes(4<<20),
		kgo.ProducerLinger(5*time.Millisecond))
	ctx := ctxT(t, 2*time.Minute)
	offsets := make([]int64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, v := range values {
		wg.Add(1)
		prod.Produce(ctx, &kgo.Record{Key: []byte(fmt.Sprint(i)), Value: v}, func(r *kgo.Record, err error) {
			offsets[i], errs[i] = r.Offset, err
			wg.Done()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("idempotent produce through the proxy: %v", err)
	}
	for i, o := range offsets {
		if o != int64(i) {
			t.Fatalf("record %d acknowledged at offset %d, want %d (offsets %v)", i, o, i, offsets)
		}
	}
	readBack(topic)

	if !pythonOK() {
		return
	}
	var recs []clientRecord
	for i, v := range values {
		recs = append(recs, clientRecord{Key: []byte(fmt.Sprint(i)), Value: v})
	}
	out := pyRun(t, pyRecordsJSON(t, recs), via, []string{"enable.idempotence=true", "max.in.flight.requests.per.connection=5",
		"message.max.bytes=4000000", "linger.ms=5"}, "produce", pyTopic)
	acks := jsonLines[pyRecord](t, out)
	if len(acks) != n {
		t.Fatalf("python acknowledged %d records, want %d", len(acks), n)
	}
	for i, a := range acks {
		if a.Offset != int64(i) {
			t.Fatalf("python: delivery %d at offset %d, want %d", i, a.Offset, i)
		}
	}
	t.Logf("python (librdkafka, idempotent): %d records acknowledged at offsets 0..%d in order", n, n-1)
	readBack(pyTopic)
}

// validate-json on produce: a batch holding an invalid record is rejected
// whole with INVALID_RECORD, which franz-go returns for each record of the
// batch, and nothing is appended; a valid batch passes; the Java producer
// shows the proxy's message.
func TestInterceptorsValidateJSONRejects(t *testing.T) {
	topic := clientTopic(t, 1, nil)
	via := interceptorProxy(t, 0, interceptor.Spec{Name: "validate-json", Config: map[string]string{interceptor.KeyTopicPattern: topic}})
	prod := viaClient(t, via, kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(time.Minute))
	ctx := ctxT(t, time.Minute)
	produceBatch := func(values ...string) []error {
		errs := make([]error, len(values))
		var wg sync.WaitGroup
		for i, v := range values {
			wg.Add(1)
			prod.Produce(ctx, &kgo.Record{Value: []byte(v)}, func(_ *kgo.Record, err error) { errs[i] = err; wg.Done() })
		}
		if err := prod.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		return errs
	}
	for i, err := range produceBatch(`{"id":1}`, `{"id":2`, `{"id":3}`) {
		if !errors.Is(err, kerr.InvalidRecord) {
			t.Fatalf("record %d of a batch with an invalid JSON value: error %v, want INVALID_RECORD", i, err)
		}
	}
	if off := endOffset(t, topic); off != 0 {
		t.Fatalf("end offset %d after the rejected batch, want 0: nothing of it may be appended", off)
	}
	for i, err := range produceBatch(`{"id":4}`, `[5]`, `"six"`) {
		if err != nil {
			t.Fatalf("valid record %d: %v", i, err)
		}
	}
	if off := endOffset(t, topic); off != 3 {
		t.Fatalf("end offset %d after the valid batch, want 3", off)
	}

	// The Java producer shows the proxy's message (KIP-467's error_message
	// and record_errors); librdkafka (kcat, Python) reports the code with
	// its own text only.
	kafkaToolsCP(t)
	_, errOut, err := runClientErr([]byte("not json\n"), "java", javaArgs(t, javaConsoleProducer, "--bootstrap-server", via, "--topic", topic, "--sync")...)
	first, _, _ := bytes.Cut(bytes.TrimSpace(errOut), []byte("\n"))
	t.Logf("Java console producer --sync (exit %v): %s", err, first)
	if err == nil || !bytes.Contains(errOut, []byte("InvalidRecordException")) || !bytes.Contains(errOut, []byte("is not valid JSON")) {
		t.Fatalf("the Java producer's error lacks INVALID_RECORD with the proxy's message:\n%s", tail(errOut))
	}
	if off := endOffset(t, topic); off != 3 {
		t.Fatalf("end offset %d after the Java producer's invalid record, want 3", off)
	}
}

// sleepCancelled counts test-sleep calls whose context was cancelled.
var sleepCancelled atomic.Int64

func init() {
	// test-sleep blocks every record until its context ends (the chain's
	// time budget), as a hung interceptor would.
	interceptor.Register("test-sleep", func(_ context.Context, cfg map[string]string) (interceptor.Instance, error) {
		re, err := interceptor.CompileTopicPattern(cfg[interceptor.KeyTopicPattern])
		if err != nil {
			return interceptor.Instance{}, err
		}
		return interceptor.Instance{Produce: sleeper{re}}, nil
	})
}

type sleeper struct{ re *regexp.Regexp }

func (sleeper) Name() string                   { return "test-sleep" }
func (s sleeper) TopicPattern() *regexp.Regexp { return s.re }
func (sleeper) ProcessRecord(ctx context.Context, _ *interceptor.Record) error {
	<-ctx.Done()
	sleepCancelled.Add(1)
	return ctx.Err()
}

// An interceptor that runs over produce.request.interceptor.timeout.ms: the
// producer gets REQUEST_TIMED_OUT for that partition, answered by the proxy
// (well before the producer's own request timeout), the interceptor's
// context is cancelled, and the proxy serves other produce requests, on
// the same connection too.
func TestInterceptorsTimeout(t *testing.T) {
	slow, fast := clientTopic(t, 1, nil), clientTopic(t, 1, nil)
	const budget = 300 * time.Millisecond
	via := interceptorProxy(t, budget, interceptor.Spec{Name: "test-sleep", Config: map[string]string{interceptor.KeyTopicPattern: slow}})
	// Not idempotent: an idempotent franz-go producer retries a timed-out
	// request without limit (it cannot know whether the broker appended it).
	prod := viaClient(t, via, kgo.DisableIdempotentWrite(), kgo.RecordRetries(1),
		kgo.ProduceRequestTimeout(30*time.Second), kgo.RecordDeliveryTimeout(40*time.Second))
	ctx := ctxT(t, time.Minute)
	before := sleepCancelled.Load()
	start := time.Now()
	err := prod.ProduceSync(ctx, &kgo.Record{Topic: slow, Value: []byte("stuck")}).FirstErr()
	took := time.Since(start)
	// franz-go retries the retriable REQUEST_TIMED_OUT once (RecordRetries)
	// and then fails the record with ErrRecordRetries, which does not wrap
	// the code; librdkafka below shows it.
	if !errors.Is(err, kgo.ErrRecordRetries) {
		t.Fatalf("produce to a topic whose interceptor hangs: %v, want a failure after the retries", err)
	}
	if took >= 30*time.Second {
		t.Fatalf("the error came after %v: the producer's own timeout, not the proxy's answer", took)
	}
	// The abandoned interceptor call counts its cancellation when it next
	// runs, which a loaded machine may delay past the produce's answer.
	waitFor(t, 30*time.Second, func() bool { return sleepCancelled.Load()-before >= 2 }, func() string {
		return fmt.Sprintf("the hung interceptor's context was cancelled %d times, want once per try (2)", sleepCancelled.Load()-before)
	})
	t.Logf("franz-go failed after %v (budget %v, 2 tries): %v", took, budget, err)
	if pythonOK() {
		out, errOut, err := runClientErr(pyRecordsJSON(t, []clientRecord{{Value: []byte("stuck")}}), pythonPath(t),
			pyArgs(via, []string{"retries=0", "enable.idempotence=false"}, "produce", slow)...)
		if err == nil || !bytes.Contains(errOut, []byte("REQUEST_TIMED_OUT")) {
			t.Fatalf("python produce to the hung topic: %v, want REQUEST_TIMED_OUT\nstdout: %s\nstderr: %s", err, out, tail(errOut))
		}
		t.Logf("python: %s", bytes.TrimSpace(errOut))
	}
	if off := endOffset(t, slow); off != 0 {
		t.Fatalf("end offset of the hung topic %d, want 0", off)
	}
	// The same client (its connections) and a new one still produce.
	for _, cl := range []*kgo.Client{prod, viaClient(t, via)} {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: fast, Value: []byte("ok")}).FirstErr(); err != nil {
			t.Fatalf("produce to another topic after the timeout: %v", err)
		}
	}
	if off := endOffset(t, fast); off != 2 {
		t.Fatalf("end offset of the other topic %d, want 2", off)
	}
}

// The payload store is down while a large record is produced through the
// proxy: the producer gets KAFKA_STORAGE_ERROR and nothing is appended; when
// the store is back the same record goes through and reads back.
func TestInterceptorsStoreOutage(t *testing.T) {
	brokers(t)
	_, storeVia, fp := storetest.S3URLViaFaultProxy(t, "ferry-interceptors")

	topic := clientTopic(t, 1, nil)
	via := interceptorProxy(t, 0, largeMessageSpec(topic, storeVia,
		largemessage.KeyStoreTimeout+"=2000", largemessage.KeyRetryCount+"=1",
		largemessage.KeyRetryBackoff+"=10", largemessage.KeyRetryMaxBackoff+"=50"))
	prod := viaClient(t, via, kgo.DefaultProduceTopic(topic), kgo.RecordRetries(1), kgo.ProducerBatchMaxBytes(8<<20),
		kgo.RecordDeliveryTimeout(40*time.Second))
	value := randomBytes(701, 3<<20)
	ctx := ctxT(t, time.Minute)

	fp.Set(faultproxy.Down, -1)
	err := prod.ProduceSync(ctx, &kgo.Record{Value: value}).FirstErr()
	if !errors.Is(err, kerr.KafkaStorageError) {
		t.Fatalf("produce with the store down: %v, want KAFKA_STORAGE_ERROR", err)
	}
	if off := endOffset(t, topic); off != 0 {
		t.Fatalf("end offset %d with the store down, want 0: nothing may be appended", off)
	}
	fp.Set(faultproxy.Pass, -1)
	if err := prod.ProduceSync(ctx, &kgo.Record{Value: value}).FirstErr(); err != nil {
		t.Fatalf("produce once the store is back: %v", err)
	}
	got := proxyRecords(t, via, topic, 1)
	if got[0].Offset != 0 || !bytes.Equal(got[0].Value, value) {
		t.Fatalf("record read back at offset %d with %d bytes, want offset 0 with %d", got[0].Offset, len(got[0].Value), len(value))
	}
}

// A record over the default 100 MiB bounds: 120 MiB through a proxy whose
// socket.request.max.bytes is raised to 256 MiB, produced by franz-go with
// its write limits raised, read by the Java console consumer with no
// settings, by Python with receive.message.max.bytes raised and by franz-go
// with BrokerMaxReadBytes raised (without it franz-go refuses the response).
// Consumers that fetch a large payload at once, more than the memory
// budget holds together, all get it: a fetch holding its rewritten batch
// while it waits for its response frame's memory gives up at the end of
// its time budget (KAFKA_STORAGE_ERROR, retried) instead of waiting for
// the others for good (CI once saw three such fetches hold 503 MB of a
// 512 MiB budget until the proxy shut down).
func TestInterceptorsFetchesWaitingForMemory(t *testing.T) {
	storeURL := interceptorStoreURL(t)
	topic := clientTopic(t, 1, nil)
	const payload = 6 << 20
	srv := startProxyServer(t, proxy.Config{Upstream: proxy.SplitList(brokers(t)), MaxRequestBytes: 16 << 20,
		MemoryMax: 28 << 20, InterceptorTimeout: 2 * time.Second,
		Interceptors: []interceptor.Spec{largeMessageSpec(topic, storeURL)}})
	via := srv.Addr()
	want := map[string][]byte{"six-mib": printable(61, payload)}
	prod := viaClient(t, via, kgo.DefaultProduceTopic(topic), kgo.ProducerBatchMaxBytes(16<<20))
	if err := prod.ProduceSync(ctxT(t, time.Minute), &kgo.Record{Key: []byte("six-mib"), Value: want["six-mib"]}).FirstErr(); err != nil {
		t.Fatalf("produce through the proxy: %v", err)
	}
	// Six fetches of 6 MiB, each needing its batch and its frame (12 MiB):
	// four holding their batches fill the 28 MiB budget.
	const consumers = 6
	ctx := ctxT(t, 90*time.Second)
	type result struct {
		recs    []clientRecord
		retried int
		err     error
	}
	results := make(chan result, consumers)
	for range consumers {
		cl := viaClient(t, via, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.BrokerMaxReadBytes(64<<20), kgo.FetchMaxBytes(32<<20))
		go func() {
			var r result
			for len(r.recs) == 0 && r.err == nil {
				fs := cl.PollFetches(ctx)
				if ctx.Err() != nil {
					r.err = ctx.Err()
					break
				}
				fs.EachError(func(_ string, _ int32, err error) {
					if kerr.IsRetriable(err) {
						r.retried++
					} else {
						r.err = err
					}
				})
				r.recs = fromKgo(fs.Records())
			}
			cl.Close()
			results <- r
		}()
	}
	retried := 0
	for range consumers {
		r := <-results
		if r.err != nil {
			t.Fatalf("a consumer: %v", r.err)
		}
		sameDigests(t, "franz-go consume", r.recs, want)
		retried += r.retried
	}
	t.Logf("%d consumers read the 6 MiB record through a 28 MiB budget (%d retriable errors seen)", consumers, retried)
	waitMemoryZero(t, srv)
}

func TestInterceptorsRecordOver100MiB(t *testing.T) {
	kafkaToolsCP(t)
	pythonPath(t)
	storeURL := interceptorStoreURL(t)
	topic := clientTopic(t, 1, nil)
	via := startProxyServer(t, proxy.Config{Upstream: proxy.SplitList(brokers(t)), MaxRequestBytes: 256 << 20,
		Interceptors: []interceptor.Spec{largeMessageSpec(topic, storeURL)}}).Addr()
	want := map[string][]byte{"franz-go-120MiB": printable(54, 120<<20)}

	prod := viaClient(t, via, kgo.DefaultProduceTopic(topic), kgo.ProducerBatchMaxBytes(200<<20), kgo.BrokerMaxWriteBytes(256<<20))
	if err := prod.ProduceSync(ctxT(t, time.Minute), &kgo.Record{Key: []byte("franz-go-120MiB"), Value: want["franz-go-120MiB"]}).FirstErr(); err != nil {
		t.Fatalf("franz-go produce of 120 MiB through the proxy: %v", err)
	}
	checkReferences(t, topic, 1, map[string]bool{"franz-go-120MiB": true}, want)

	// franz-go at its default BrokerMaxReadBytes (100 MiB) cannot read it.
	cl := viaClient(t, via, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx := ctxT(t, 30*time.Second)
	var ferr error
	for ferr == nil && ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachError(func(_ string, _ int32, err error) { ferr = err })
		if len(fs.Records()) > 0 {
			t.Fatal("franz-go read a 120 MiB response at its default BrokerMaxReadBytes")
		}
	}
	if ferr == nil || !strings.Contains(ferr.Error(), "BrokerMaxReadBytes") {
		t.Fatalf("franz-go at its default read limit: %v, want a BrokerMaxReadBytes error", ferr)
	}
	cl.Close() // it would fetch again and again in the background

	sameDigests(t, "franz-go consume", fromKgo(proxyRecords(t, via, topic, 1, kgo.BrokerMaxReadBytes(256<<20))), want)
	sameDigests(t, "python consume", pyConsume(t, via, topic, "receive.message.max.bytes=268435456"), want)
	a := append([]string{"--bootstrap-server", via, "--topic", topic, "--from-beginning",
		"--max-messages", "1", "--timeout-ms", "60000"}, javaConsumerArgs...)
	recs, err := parseJavaConsole(javaBigHeap(t, nil, javaConsoleConsumer, a...))
	if err != nil {
		t.Fatalf("console consumer output: %v", err)
	}
	sameDigests(t, "java console consumer", recs, want)
}

// waitMemoryZero waits (up to 10 s) until srv's memory budget is all given
// back (ferry_proxy_memory_bytes 0), failing the test otherwise.
func waitMemoryZero(t *testing.T, srv *proxy.Server) {
	t.Helper()
	var last string
	for range 100 {
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		for line := range strings.Lines(rec.Body.String()) {
			if v, ok := strings.CutPrefix(line, "ferry_proxy_memory_bytes "); ok {
				last = strings.TrimSpace(v)
			}
		}
		if last == "0" {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the proxy's memory budget holds %s bytes after every consumer has gone", last)
}
