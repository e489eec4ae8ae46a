package integration

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
	"github.com/ferrykit/ferry/proxy"
)

// A record with a 2 MB key and a 9.5 MB value, through the proxy's
// large-message interceptor to a broker at its 1 MiB default: the value is
// over large.message.stream.threshold.bytes (8 MiB), so it goes to the
// store as it arrives, and the reference record, its key inline, would not
// fit. The key is offloaded too, as when the value is read whole: the same
// headers, the key's object under its content id (one object for the same
// key, streamed or not). franz-go and kcat produce such records; franz-go
// and kcat read them back through the proxy byte for byte (key, value,
// headers). A record whose headers alone are over the limit is refused
// MESSAGE_TOO_LARGE and leaves nothing in the store. Found by a user: the
// streamed record was refused "even with key and value offloaded", its key
// never offloaded.
func TestProxyStreamedValueOffloadsKey(t *testing.T) {
	kcatPath(t)
	storeURL := interceptorStoreURL(t)
	topic := clientTopic(t, 1, nil)
	srv := startProxyServer(t, proxy.Config{Upstream: proxy.SplitList(brokers(t)),
		Interceptors: []interceptor.Spec{largeMessageSpec(topic, storeURL)}})
	via := srv.Addr()

	keyA, keyC := printable(61, 2_000_000), printable(64, 2_000_000)
	want := []clientRecord{
		// streamed (9.5 MB), then read whole (2 MB), with the same key
		{Key: keyA, Value: printable(62, 9_500_000), Headers: []clientHeader{{Key: "app", Value: []byte("franz-go")}, {Key: "n", Value: []byte("1")}}},
		{Key: keyA, Value: printable(63, 2_000_000), Headers: []clientHeader{{Key: "app", Value: []byte("franz-go")}, {Key: "n", Value: []byte("1")}}},
		{Key: keyC, Value: printable(65, 9_500_000), Headers: []clientHeader{{Key: "app", Value: []byte("kcat")}}},
	}
	prod := viaClient(t, via, kgo.DefaultProduceTopic(topic), kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.ProducerBatchMaxBytes(16<<20), kgo.RecordRetries(0))
	produce := func(r clientRecord) error {
		kr := &kgo.Record{Partition: 0, Key: r.Key, Value: r.Value}
		for _, h := range r.Headers {
			kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		return prod.ProduceSync(ctxT(t, 2*time.Minute), kr).FirstErr()
	}
	for i, r := range want[:2] {
		if err := produce(r); err != nil {
			t.Fatalf("franz-go, record %d (key %d bytes, value %d bytes) through the proxy: %v", i, len(r.Key), len(r.Value), err)
		}
	}
	kcatProduce(t, via, topic, want[2:], want[2].Headers, "-X", "message.max.bytes=20000000", "-X", "compression.codec=none")

	// The broker holds three references, each with its key offloaded.
	store := openStore(t, storeURL)
	raw := consumeRaw(t, topic, 3)
	for i, r := range raw {
		if !largemessage.IsOffloaded(r) || !largemessage.IsKeyOffloaded(r) || len(r.Key) > 1024 || len(r.Value) > 1024 {
			t.Fatalf("record %d: the broker holds a key of %d bytes and a value of %d (value offloaded %v, key offloaded %v)",
				i, len(r.Key), len(r.Value), largemessage.IsOffloaded(r), largemessage.IsKeyOffloaded(r))
		}
		ref, err := largemessage.DecodeReference(r.Key)
		if err != nil {
			t.Fatal(err)
		}
		if !payloadstore.IsContentID(ref.FullPayloadPath) {
			t.Fatalf("record %d: key at %s, not under its content id", i, ref.FullPayloadPath)
		}
		b, err := payloadstore.DownloadBytes(context.Background(), store, ref.FullPayloadPath)
		if err != nil || !bytes.Equal(b, want[i].Key) {
			t.Fatalf("record %d: the key's object has %d bytes (want %d), equal %v, %v", i, len(b), len(want[i].Key), bytes.Equal(b, want[i].Key), err)
		}
	}
	// Streamed or read whole, the same key gives the same reference and
	// the same headers (names in order; the key's values too).
	if !bytes.Equal(raw[0].Key, raw[1].Key) {
		t.Fatalf("the same key streamed and read whole: references %q and %q", raw[0].Key, raw[1].Key)
	}
	names := func(r *kgo.Record) (ns []string) {
		for _, h := range r.Headers {
			ns = append(ns, h.Key)
		}
		return ns
	}
	if !slices.Equal(names(raw[0]), names(raw[1])) {
		t.Fatalf("headers streamed %v, read whole %v", names(raw[0]), names(raw[1]))
	}
	for _, k := range []string{largemessage.HeaderLargeMessageKey, largemessage.HeaderKeyPayloadSize, largemessage.HeaderKeyPayloadSHA256} {
		if a, b := headerOf(raw[0], k), headerOf(raw[1], k); a == nil || !bytes.Equal(a, b) {
			t.Fatalf("header %s: streamed %q, read whole %q", k, a, b)
		}
	}
	if v := headerOf(raw[0], largemessage.HeaderLargeMessageKey); string(v) != "true" {
		t.Fatalf("%s = %q", largemessage.HeaderLargeMessageKey, v)
	}
	objects := countObjects(t, store, topic)
	if objects != 5 { // three values, two keys
		t.Fatalf("%d objects in the store, want 5 (three values, two keys)", objects)
	}

	// Back through the proxy, byte for byte.
	cons := viaClient(t, via, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxBytes(64<<20), kgo.FetchMaxPartitionBytes(64<<20), kgo.BrokerMaxReadBytes(128<<20))
	sameBig(t, "franz-go consume", fromKgo(pollN(t, cons, 3)), want)
	cons.Close() // (it would fetch again in the background)
	sameBig(t, "kcat consume", kcatConsume(t, via, topic, "-X", "fetch.message.max.bytes=64000000", "-X", "fetch.max.bytes=64000000",
		"-X", "receive.message.max.bytes=128000000"), want)

	// Headers alone over the limit: refused, nothing left in the store.
	huge := clientRecord{Key: printable(66, 2_000_000), Value: printable(67, 9_500_000),
		Headers: []clientHeader{{Key: "huge", Value: printable(68, 1_100_000)}}}
	err := produce(huge)
	if !errors.Is(err, kerr.MessageTooLarge) {
		t.Fatalf("a record whose headers alone are over the limit: %v, want MESSAGE_TOO_LARGE", err)
	}
	if n := countObjects(t, store, topic); n != objects {
		t.Fatalf("%d objects in the store after the refusal, want %d", n, objects)
	}
	prod.Close()
	waitMemoryZero(t, srv)
}

// headerOf is the value of r's header k, nil if none.
func headerOf(r *kgo.Record, k string) []byte {
	for _, h := range r.Headers {
		if h.Key == k {
			return h.Value
		}
	}
	return nil
}

// countObjects is the number of objects of topic in store.
func countObjects(t *testing.T, store payloadstore.PayloadStore, topic string) int {
	t.Helper()
	n := 0
	if err := payloadstore.List(context.Background(), store, topic, func(payloadstore.ObjectInfo) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// sameBig checks that got holds want's records in order, key, value and
// headers byte for byte, reporting sizes rather than the bytes.
func sameBig(t *testing.T, label string, got, want []clientRecord) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d records, want %d", label, len(got), len(want))
	}
	for i, w := range want {
		g := got[i]
		if !bytes.Equal(g.Key, w.Key) || !bytes.Equal(g.Value, w.Value) {
			t.Fatalf("%s: record %d: key %d bytes (want %d, equal %v), value %d bytes (want %d, equal %v)", label, i,
				len(g.Key), len(w.Key), bytes.Equal(g.Key, w.Key), len(g.Value), len(w.Value), bytes.Equal(g.Value, w.Value))
		}
		if len(g.Headers) != len(w.Headers) {
			t.Fatalf("%s: record %d: headers %q, want %q", label, i, g.Headers, w.Headers)
		}
		for j, h := range w.Headers {
			if g.Headers[j].Key != h.Key || !bytes.Equal(g.Headers[j].Value, h.Value) {
				t.Fatalf("%s: record %d: headers %q, want %q", label, i, g.Headers, w.Headers)
			}
		}
	}
}
