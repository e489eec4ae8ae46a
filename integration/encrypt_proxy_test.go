package integration

// The proxy's encrypt interceptor against the real broker, with real
// clients (kcat, the Java console tools, Python confluent-kafka, franz-go)
// through an in-process proxy, and the real KMS-compatible server
// (local-kms, scripts/object-stores) holding the key-encryption key:
// clients through the proxy read what they produced, byte for byte; a
// client reading the broker directly sees only sealed values; a KMS outage
// refuses produces (nothing appended) and holds consumers back until the
// KMS is back (a fault proxy in front of the KMS server).

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/envelope"
	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/internal/faultproxy"
	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/largemessage"
)

// encryptKeyURL is the key of the real KMS server (alias/ferry-test) when
// it runs (FERRY_KMS_KEY_URL; always under scripts/test and CI), else a
// base64key:// key made for the test.
func encryptKeyURL(t *testing.T) string {
	t.Helper()
	if os.Getenv("FERRY_KMS_KEY_URL") != "" || os.Getenv("CI") != "" {
		return storetest.KMSKeyURL(t, "")
	}
	k := make([]byte, 32)
	rand.Read(k)
	return "base64key://" + base64.URLEncoding.EncodeToString(k)
}

// encryptSpec is the encrypt interceptor for topic (a pattern) with
// keyURL; extra are more config keys, name=value.
func encryptSpec(topic, keyURL string, extra ...string) interceptor.Spec {
	cfg := map[string]string{interceptor.KeyTopicPattern: topic, interceptor.KeyEncryptKeyURL: keyURL}
	for _, kv := range extra {
		k, v, _ := strings.Cut(kv, "=")
		cfg[k] = v
	}
	return interceptor.Spec{Name: "encrypt", Config: cfg}
}

// checkSealedOnBroker reads want's records of topic straight from the
// broker (franz-go, no proxy) and checks that every value and every header
// named sealedHeader ("" none) is sealed (starts with envelope.Magic) and holds none
// of the plaintext, other headers are as produced, and each record carries
// the marker.
func checkSealedOnBroker(t *testing.T, topic string, want []clientRecord, sealedHeader string) {
	t.Helper()
	raw := consumeRaw(t, topic, len(want))
	byKey := map[string]clientRecord{}
	for _, r := range want {
		byKey[string(r.Key)] = r
	}
	for _, r := range raw {
		w, ok := byKey[string(r.Key)]
		if !ok {
			t.Fatalf("broker holds a record with key %q that was not produced", r.Key)
		}
		if !bytes.HasPrefix(r.Value, []byte(envelope.Magic)) {
			t.Fatalf("record %q on the broker: value of %d bytes does not start with %s", r.Key, len(r.Value), envelope.Magic)
		}
		if len(w.Value) >= 8 && bytes.Contains(r.Value, w.Value) {
			t.Fatalf("record %q on the broker holds its plaintext value", r.Key)
		}
		marker := ""
		var hs []clientHeader
		for _, h := range r.Headers {
			switch {
			case h.Key == interceptor.HeaderEncrypted:
				marker = string(h.Value)
				continue
			case h.Key == sealedHeader:
				if !envelope.IsSealed(h.Value) {
					t.Fatalf("record %q on the broker: header %s is not sealed", r.Key, h.Key)
				}
			}
			hs = append(hs, clientHeader{Key: h.Key, Value: h.Value})
		}
		want := "value"
		if slices.ContainsFunc(w.Headers, func(h clientHeader) bool { return h.Key == sealedHeader && h.Value != nil }) {
			want += ",header:" + sealedHeader
		}
		if marker != want {
			t.Fatalf("record %q on the broker: marker %q, want %q", r.Key, marker, want)
		}
		if len(hs) != len(w.Headers) {
			t.Fatalf("record %q on the broker: headers %q, produced %q", r.Key, hs, w.Headers)
		}
		for i, h := range w.Headers {
			if hs[i].Key != h.Key || (h.Key != sealedHeader && !bytes.Equal(hs[i].Value, h.Value)) {
				t.Fatalf("record %q on the broker: header %d %q, produced %q", r.Key, i, hs[i], h)
			}
		}
	}
}

// kcat, the Java console producer and Python confluent-kafka each produce
// to an encrypted topic through the proxy (kcat idempotent with lz4, Java
// with gzip, Python idempotent with zstd) and consume it back through the
// proxy byte for byte, values and headers; franz-go through the proxy reads
// the same; franz-go straight from the broker sees sealed values and
// sealed "client" headers only.
func TestEncryptProxyClients(t *testing.T) {
	kcatPath(t)
	kafkaToolsCP(t)
	pythonPath(t)
	key := encryptKeyURL(t)
	topics := map[string]string{"kcat": clientTopic(t, 3, nil), "java": clientTopic(t, 3, nil), "python": clientTopic(t, 3, nil)}
	via := interceptorProxy(t, 0, encryptSpec(strings.Join([]string{topics["kcat"], topics["java"], topics["python"]}, "|"), key,
		interceptor.KeyEncryptHeaders+"=client"))

	kcatHeaders := []clientHeader{{Key: "client", Value: []byte("kcat")}, {Key: "note", Value: []byte("é=ü")}}
	kcatWant := binaryRecords(11, 30, "kcat", "\t\n", kcatHeaders)
	kcatProduce(t, via, topics["kcat"], kcatWant, kcatHeaders, "-z", "lz4", "-X", "enable.idempotence=true")
	sameRecords(t, "kcat consume", kcatConsume(t, via, topics["kcat"]), kcatWant)

	javaWant := textRecords(12, 30, "java")
	javaProduce(t, via, topics["java"], javaWant, "--compression-codec", "gzip")
	sameRecords(t, "java console consumer", javaConsume(t, via, topics["java"], len(javaWant)), javaWant)

	pyHeaders := []clientHeader{{Key: "client", Value: []byte{0, '\n', 0xff, 'p'}}, {Key: "bin", Value: []byte{0, '\n', 0xff, '\t'}}}
	pyWant := binaryRecords(13, 30, "python", "", pyHeaders)
	pyProduce(t, via, topics["python"], pyWant, "enable.idempotence=true", "compression.type=zstd")
	sameRecords(t, "python consume", pyConsume(t, via, topics["python"]), pyWant)

	for name, want := range map[string][]clientRecord{"kcat": kcatWant, "java": javaWant, "python": pyWant} {
		sameRecords(t, "franz-go through the proxy ("+name+")", fromKgo(proxyRecords(t, via, topics[name], len(want))), want)
		checkSealedOnBroker(t, topics[name], want, "client")
	}
	// The Python consumer straight from the broker sees the sealed bytes.
	direct := pyConsume(t, brokers(t), topics["python"])
	if len(direct) != len(pyWant) {
		t.Fatalf("python straight from the broker read %d records, want %d", len(direct), len(pyWant))
	}
	for _, r := range direct {
		if !envelope.IsSealed(r.Value) {
			t.Fatalf("python straight from the broker: record %q is not sealed", r.Key)
		}
	}
}

// The KMS is down (a fault proxy in front of the real KMS server refuses
// every connection: storetest.KMSKeyURLViaFaultProxy, an outage for this
// test's keyrings alone) when a topic needs its first data key: a produce
// through the proxy is refused (franz-go gives up after its retries,
// librdkafka reports KAFKA_STORAGE_ERROR) and the topic's high watermark,
// read with kadm (endOffset), does not move; with the KMS back the same record goes
// through. A proxy that has not unwrapped the data key yet holds its
// consumers back while the KMS is down (no record, sealed or not, reaches
// them), and they read the record once it is back.
func TestEncryptProxyKMSOutage(t *testing.T) {
	key, fp := storetest.KMSKeyURLViaFaultProxy(t, "")
	topic := clientTopic(t, 1, nil)
	via := interceptorProxy(t, 0, encryptSpec(topic, key))
	prod := viaClient(t, via, kgo.DefaultProduceTopic(topic), kgo.RecordRetries(2), kgo.DisableIdempotentWrite(),
		kgo.RecordDeliveryTimeout(60*time.Second))
	value := []byte("produced while the KMS is down")

	fp.Set(faultproxy.Down, -1)
	before := endOffset(t, topic)
	start := time.Now()
	err := prod.ProduceSync(ctxT(t, 90*time.Second), &kgo.Record{Key: []byte("franz-go"), Value: value}).FirstErr()
	if err == nil {
		t.Fatal("a produce went through with the KMS down")
	}
	t.Logf("franz-go with the KMS down, after %v (3 tries): %v", time.Since(start).Round(time.Millisecond), err)
	if pythonOK() {
		out, errOut, err := runClientErr(pyRecordsJSON(t, []clientRecord{{Key: []byte("python"), Value: value}}), pythonPath(t),
			pyArgs(via, []string{"retries=0", "enable.idempotence=false"}, "produce", topic)...)
		if err == nil || !bytes.Contains(errOut, []byte("KAFKA_STORAGE_ERROR")) {
			t.Fatalf("python produce with the KMS down: %v, want KAFKA_STORAGE_ERROR\nstdout: %s\nstderr: %s", err, out, tail(errOut))
		}
		t.Logf("python: %s", bytes.TrimSpace(errOut))
	}
	if after := endOffset(t, topic); after != before {
		t.Fatalf("high watermark %d -> %d during the KMS outage: nothing may be appended", before, after)
	}
	if fp.Count(faultproxy.Down) == 0 {
		t.Fatal("the KMS was never asked")
	}

	fp.Set(faultproxy.Pass, -1)
	if err := prod.ProduceSync(ctxT(t, 60*time.Second), &kgo.Record{Key: []byte("franz-go"), Value: value}).FirstErr(); err != nil {
		t.Fatalf("produce once the KMS is back: %v", err)
	}
	if after := endOffset(t, topic); after != before+1 {
		t.Fatalf("high watermark %d -> %d, want one record appended", before, after)
	}
	checkSealedOnBroker(t, topic, []clientRecord{{Key: []byte("franz-go"), Value: value}}, "")

	// A second proxy, whose keyring has no data key unwrapped yet.
	fp.Set(faultproxy.Down, -1)
	via2 := interceptorProxy(t, 0, encryptSpec(topic, key))
	cons := viaClient(t, via2, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	var fetchErrs []error
	for ctx.Err() == nil {
		fs := cons.PollFetches(ctx)
		if n := fs.NumRecords(); n > 0 {
			cancel()
			t.Fatalf("a consumer got %d records through the proxy with the KMS down (value %.20q)", n, fs.Records()[0].Value)
		}
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				fetchErrs = append(fetchErrs, err)
			}
		})
	}
	cancel()
	t.Logf("franz-go consumer with the KMS down: no record in 8 s, %d fetch errors surfaced (%v)", len(fetchErrs), errors.Join(fetchErrs...))
	for _, err := range fetchErrs {
		if !errors.Is(err, kerr.KafkaStorageError) {
			t.Fatalf("consumer error with the KMS down: %v, want KAFKA_STORAGE_ERROR (retriable)", err)
		}
	}
	fp.Set(faultproxy.Pass, -1)
	got := pollN(t, cons, 1)
	if !bytes.Equal(got[0].Value, value) || got[0].Offset != before {
		t.Fatalf("once the KMS is back: offset %d value %q, want offset %d %q", got[0].Offset, got[0].Value, before, value)
	}
}

// [encrypt, large-message] in one proxy (the store on the real S3 server
// under scripts/test): a 3 MiB record from franz-go is sealed, then its
// sealed value offloaded, so the broker holds a reference and the store
// ciphertext only; a small record stays inline, sealed; both read back
// byte for byte through the proxy (fetch resolves, then opens).
func TestEncryptProxyThenLargeMessage(t *testing.T) {
	storeURL := interceptorStoreURL(t)
	topic := clientTopic(t, 1, nil)
	via := interceptorProxy(t, 0, encryptSpec(topic, encryptKeyURL(t)), largeMessageSpec(topic, storeURL))
	prod := viaClient(t, via, kgo.DefaultProduceTopic(topic), kgo.ProducerBatchMaxBytes(8<<20), kgo.ProducerBatchCompression(kgo.ZstdCompression()))
	values := map[string][]byte{"large": randomBytes(901, 3<<20), "small": []byte("a small secret")}
	ctx := ctxT(t, time.Minute)
	for _, k := range []string{"large", "small"} {
		if err := prod.ProduceSync(ctx, &kgo.Record{Key: []byte(k), Value: values[k]}).FirstErr(); err != nil {
			t.Fatalf("produce %s through the proxy: %v", k, err)
		}
	}
	store := openStore(t, storeURL)
	de := largemessage.NewDeserializer(store, false)
	for _, r := range consumeRaw(t, topic, 2) {
		k := string(r.Key)
		if largemessage.IsOffloaded(r) != (k == "large") {
			t.Fatalf("record %q on the broker: offloaded %v", k, largemessage.IsOffloaded(r))
		}
		if m, _ := encHeader(r, interceptor.HeaderEncrypted); string(m) != "value" {
			t.Fatalf("record %q on the broker: marker %q", k, m)
		}
		lib := *r
		if err := de.Resolve(ctx, &lib); err != nil {
			t.Fatalf("record %q: the Go library cannot resolve it: %v", k, err)
		}
		if !envelope.IsSealed(lib.Value) || bytes.Contains(lib.Value, values[k][:12]) {
			t.Fatalf("record %q: the value (in the store for the large one) is not sealed", k)
		}
	}
	for _, r := range proxyRecords(t, via, topic, 2, kgo.FetchMaxBytes(16<<20)) {
		if !bytes.Equal(r.Value, values[string(r.Key)]) || len(r.Headers) != 0 {
			t.Fatalf("record %q through the proxy: %d bytes, headers %v; want its %d bytes and no header", r.Key, len(r.Value), r.Headers, len(values[string(r.Key)]))
		}
	}
}

func encHeader(r *kgo.Record, name string) ([]byte, bool) {
	for _, h := range r.Headers {
		if h.Key == name {
			return h.Value, true
		}
	}
	return nil, false
}

// A record carrying the ferry.encrypted marker over bytes never sealed (a
// client wrote it while no encrypt interceptor covered its topic, or wrote
// it to the broker directly), between two records sealed through the proxy:
// reading through the proxy, Kafka's Java console consumer prints the
// record before it and then stops as it stops on a corrupt record, naming
// the partition and offset (the proxy answers CORRUPT_MESSAGE: the bytes
// will never open), where with KAFKA_STORAGE_ERROR it waited for ever
// without a word; kcat prints the record before it and reports "Broker:
// Invalid message" (librdkafka's name for code 2); franz-go, which retries
// CORRUPT_MESSAGE, gets the record before it and nothing else; ferry
// consume (with kgo.KeepRetryableFetchErrors) stops with an error naming
// the offset.
func TestEncryptForgedMarkerSurfacesToConsumer(t *testing.T) {
	kafkaToolsCP(t)
	kcatPath(t)
	topic := clientTopic(t, 1, nil)
	via := interceptorProxy(t, 0, encryptSpec(topic, encryptKeyURL(t)))
	sealed := viaClient(t, via, kgo.DefaultProduceTopic(topic))
	direct := client(t, kgo.DefaultProduceTopic(topic))
	for i, rec := range []struct {
		cl     *kgo.Client
		value  string
		marker bool
	}{{sealed, "sealed 0", false}, {direct, "forged 1", true}, {sealed, "sealed 2", false}} {
		r := &kgo.Record{Key: fmt.Appendf(nil, "k%d", i), Value: []byte(rec.value)}
		if rec.marker {
			r.Headers = []kgo.RecordHeader{{Key: interceptor.HeaderEncrypted, Value: []byte("value")}}
		}
		if err := rec.cl.ProduceSync(ctxT(t, 30*time.Second), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	a := append([]string{"--bootstrap-server", via, "--topic", topic, "--from-beginning", "--max-messages", "3", "--timeout-ms", "30000"}, javaConsumerArgs...)
	out, errOut, err := runClientErr(nil, "java", javaArgs(t, javaConsoleConsumer, a...)...)
	recs, perr := parseJavaConsole(out)
	// The console consumer ends on the error, its exit status 0 all the same.
	if perr != nil || len(recs) != 1 || string(recs[0].Value) != "sealed 0" {
		t.Fatalf("console consumer: exit %v, %d records (%v); want the record before the forged one, then an error\nstdout:\n%s\nstderr:\n%s",
			err, len(recs), perr, tail(out), tail(errOut))
	}
	if want := fmt.Sprintf("Encountered corrupt message when fetching offset 1 for topic-partition %s-0", topic); !bytes.Contains(errOut, []byte(want)) {
		t.Fatalf("console consumer stderr lacks %q:\n%s", want, tail(errOut))
	}

	// kcat (librdkafka) prints the record before it and reports the error,
	// then fetches again after its backoff; it is stopped after 5 s.
	kctx, kcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer kcancel()
	kc := exec.CommandContext(kctx, kcatPath(t), "-C", "-b", via, "-t", topic, "-o", "beginning", "-f", "%o %s\n")
	var kout, kerrOut bytes.Buffer
	kc.Stdout, kc.Stderr = &kout, &kerrOut
	_ = kc.Run()
	if kout.String() != "0 sealed 0\n" || !strings.Contains(kerrOut.String(), "Broker: Invalid message") {
		t.Fatalf("kcat: stdout %q, stderr:\n%s\nwant the record before the forged one, then a Broker: Invalid message error", kout.String(), tail(kerrOut.Bytes()))
	}

	cl := viaClient(t, via, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var got []*kgo.Record
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		got = append(got, cl.PollFetches(ctx).Records()...)
	}
	if len(got) != 1 || string(got[0].Value) != "sealed 0" {
		t.Fatalf("franz-go through the proxy: %d records, want the one before the forged record", len(got))
	}

	// ferry consume stops at it with an error naming the offset, as the
	// console consumer does, where it waited for its --timeout and exited 0.
	code, stdout, stderr := runCLI(t, "consume", "--brokers", via, "-t", topic, "-n", "3", "--timeout", "20s")
	if code != 1 || stdout != "sealed 0" || !strings.Contains(stderr, fmt.Sprintf("topic %s partition 0 at offset 1: CORRUPT_MESSAGE", topic)) {
		t.Fatalf("ferry consume: exit %d, stdout %q, stderr %q; want exit 1 after the record before the forged one, naming offset 1", code, stdout, stderr)
	}
}
