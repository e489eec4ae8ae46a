package interceptor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// lmSetup builds the large-message interceptor from its configuration over
// a file store and returns it with the store opened the way the Go library
// opens it.
func lmSetup(t *testing.T, extra map[string]string) (Instance, payloadstore.PayloadStore) {
	t.Helper()
	url := "file://" + t.TempDir()
	cfg := map[string]string{largemessage.KeyStoreURL: url, KeyTopicPattern: "big.*"}
	for k, v := range extra {
		cfg[k] = v
	}
	in, err := New(context.Background(), "large-message", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.Close() })
	store, err := payloadstore.Open(context.Background(), url, payloadstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return in, store
}

func hasFerryHeaders(r *kgo.Record) bool {
	for _, h := range r.Headers {
		if h.Key == largemessage.HeaderLargeMessage || strings.HasPrefix(h.Key, "ferry.") {
			return true
		}
	}
	return false
}

// Small and large records in one compressed batch: the large ones are
// offloaded so the batch fits max.message.bytes (kfake accepts it), the
// Go library resolves them straight from Kafka, and the fetch side gives
// every client the records as produced.
func TestLargeMessageMixedBatch(t *testing.T) {
	for name, codec := range codecs {
		t.Run(name, func(t *testing.T) {
			in, store := lmSetup(t, nil)
			limit := "100000"
			cl := newCluster(t, map[string]map[string]*string{"big": {"max.message.bytes": &limit}})
			cl.use(Options{}, in)
			c := cl.client(t, kgo.ProducerBatchCompression(codec))
			var recs []*kgo.Record
			for i := range 8 {
				v := []byte(fmt.Sprintf("small record %d", i))
				switch i {
				case 2, 5:
					v = randomBytes(uint64(i), 300<<10)
				case 6:
					v = bytes.Repeat([]byte("compressible "), 25<<10)
				}
				recs = append(recs, &kgo.Record{Topic: "big", Key: []byte(fmt.Sprint(i)), Value: v})
			}
			if err := firstErr(produceBatch(t, c, recs...)); err != nil {
				t.Fatal(err)
			}
			sent := cl.sent[0].Topics[0].Partitions[0].Records
			if len(sent) > 100000 {
				t.Fatalf("sent a %d-byte batch over max.message.bytes", len(sent))
			}
			if b := checkBatches(t, sent); len(b) != 1 || codecName(b[0].Attributes) != name {
				t.Fatalf("sent %d batches, codec %s", len(b), codecName(b[0].Attributes))
			}
			resp, _ := fetchRaw(t, c, "big")
			raw := records(t, "big", &resp.Topics[0].Partitions[0])
			if len(raw) != len(recs) {
				t.Fatalf("fetched %d records", len(raw))
			}
			de := largemessage.NewDeserializer(store, false)
			offloaded := 0
			for i, r := range raw {
				if largemessage.IsOffloaded(r) {
					offloaded++
				}
				if (i == 2 || i == 5) && !largemessage.IsOffloaded(r) {
					t.Fatalf("record %d (300 KiB random) was not offloaded", i)
				}
				if i < 2 && hasFerryHeaders(r) {
					t.Fatalf("small record %d got headers %v", i, r.Headers)
				}
				lib := *r
				if err := de.Resolve(context.Background(), &lib); err != nil {
					t.Fatalf("the Go library cannot resolve record %d: %v", i, err)
				}
				if !bytes.Equal(lib.Value, recs[i].Value) {
					t.Fatalf("record %d resolved by the library differs", i)
				}
			}
			t.Logf("%s: %d of %d records offloaded, batch %d bytes", name, offloaded, len(recs), len(sent))
			fc := NewChain([]Instance{in}, Options{TopicName: cl.names})
			if out := fc.InterceptFetch(context.Background(), resp); len(out.Failed) != 0 || out.Rewritten != 1 {
				t.Fatalf("fetch outcome %+v", out)
			}
			got := records(t, "big", &resp.Topics[0].Partitions[0])
			for i, r := range got {
				if !bytes.Equal(r.Value, recs[i].Value) || !bytes.Equal(r.Key, recs[i].Key) || hasFerryHeaders(r) || r.Offset != int64(i) {
					t.Fatalf("record %d after fetch: key %q, %d bytes, headers %v, offset %d", i, r.Key, len(r.Value), r.Headers, r.Offset)
				}
			}
		})
	}
}

// Records each under the threshold whose batch is over max.message.bytes:
// the chain offloads the largest (BatchShrinker) until the batch fits.
func TestLargeMessageBatchShrink(t *testing.T) {
	in, _ := lmSetup(t, nil)
	limit := "100000"
	cl := newCluster(t, map[string]map[string]*string{"big": {"max.message.bytes": &limit}})
	cl.use(Options{}, in)
	c := cl.client(t, kgo.DisableIdempotentWrite())
	var recs []*kgo.Record
	for i := range 10 {
		recs = append(recs, &kgo.Record{Topic: "big", Value: randomBytes(uint64(100+i), 20000+i*100)})
	}
	if err := firstErr(produceBatch(t, c, recs...)); err != nil {
		t.Fatal(err)
	}
	sent := cl.sent[0].Topics[0].Partitions[0].Records
	if len(cl.orig[0].Topics[0].Partitions[0].Records) <= 100000 || len(sent) > 100000 {
		t.Fatalf("client batch %d bytes, sent %d", len(cl.orig[0].Topics[0].Partitions[0].Records), len(sent))
	}
	resp, _ := fetchRaw(t, c, "big")
	raw := records(t, "big", &resp.Topics[0].Partitions[0])
	n := 0
	for _, r := range raw {
		if largemessage.IsOffloaded(r) {
			n++
		}
	}
	// The largest go first: the last records are the largest.
	if n == 0 || n == len(recs) || !largemessage.IsOffloaded(raw[len(raw)-1]) {
		t.Fatalf("%d of %d offloaded", n, len(recs))
	}
	NewChain([]Instance{in}, Options{TopicName: cl.names}).InterceptFetch(context.Background(), resp)
	for i, r := range records(t, "big", &resp.Topics[0].Partitions[0]) {
		if !bytes.Equal(r.Value, recs[i].Value) {
			t.Fatalf("record %d differs after fetch", i)
		}
	}
}

// Topics the pattern does not match are left alone, even when over.
func TestLargeMessagePattern(t *testing.T) {
	in, _ := lmSetup(t, nil)
	cl := newCluster(t, map[string]map[string]*string{"other": nil})
	cl.use(Options{}, in)
	c := cl.client(t)
	v := randomBytes(1, 500<<10) // under kfake's 1 MiB default, over no limit of ours
	if err := firstErr(produceBatch(t, c, &kgo.Record{Topic: "other", Value: v})); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(cl.orig[0].Topics[0].Partitions[0].Records, cl.sent[0].Topics[0].Partitions[0].Records) {
		t.Fatal("a topic outside the pattern was rewritten")
	}
}

// A store that cannot take the payload (its directory replaced by a file, a
// real fault of the file store): the producer gets KAFKA_STORAGE_ERROR
// (retriable) and nothing is appended.
func TestLargeMessageStoreOutage(t *testing.T) {
	dir := t.TempDir() + "/store"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	in, err := New(context.Background(), "large-message", map[string]string{largemessage.KeyStoreURL: "file://" + dir,
		largemessage.KeyRetryCount: "1", largemessage.KeyRetryBackoff: "1", largemessage.KeyStoreTimeout: "2000"})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, []byte("not a directory"), 0o644); err != nil {
		t.Fatal(err)
	}
	cl := newCluster(t, map[string]map[string]*string{"big": nil})
	cl.use(Options{}, in)
	c := cl.client(t, kgo.RecordRetries(1))
	err = firstErr(produceBatch(t, c, &kgo.Record{Topic: "big", Value: randomBytes(3, 2<<20)}, &kgo.Record{Topic: "big", Value: []byte("small")}))
	if !errors.Is(err, kerr.KafkaStorageError) {
		t.Fatalf("producer got %v, want KAFKA_STORAGE_ERROR", err)
	}
	a := cl.outcomes[0].Answered[0]
	var se *payloadstore.Error
	if !errors.As(a.Err, &se) || !strings.Contains(a.ErrorMessage, "large-message") {
		t.Fatalf("answer %+v", a)
	}
	resp, _ := fetchRaw(t, c, "big")
	if n := len(records(t, "big", &resp.Topics[0].Partitions[0])); n != 0 {
		t.Fatalf("%d records appended", n)
	}
}

// A transactional producer with large-message active: both transactions'
// large records are offloaded, the batches stay transactional (kfake
// accepts them), and a read_committed fetch resolves the committed record
// while the aborted one is left alone.
func TestLargeMessageTransactional(t *testing.T) {
	in, _ := lmSetup(t, nil)
	limit := "100000"
	cl := newCluster(t, map[string]map[string]*string{"big": {"max.message.bytes": &limit}})
	cl.use(Options{}, in)
	c := cl.client(t, kgo.TransactionalID("lm-tx"), kgo.ProducerBatchCompression(kgo.ZstdCompression()))
	ctx := context.Background()
	vals := map[bool][]byte{false: randomBytes(7, 400<<10), true: randomBytes(8, 400<<10)}
	for _, commit := range []bool{false, true} {
		if err := c.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := firstErr(produceBatch(t, c, &kgo.Record{Topic: "big", Value: vals[commit]})); err != nil {
			t.Fatal(err)
		}
		if err := c.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	resp, _ := fetchRaw(t, c, "big")
	var resolved int
	// Fetch interceptors run in reverse order: count runs after
	// large-message has resolved the reference.
	fc := NewChain([]Instance{{Fetch: icpt(t, "count", "big", func(_ context.Context, r *Record) error {
		if r.Aborted {
			return nil // large-message leaves aborted records unresolved
		}
		resolved++
		if !bytes.Equal(r.Value, vals[true]) {
			t.Errorf("the fetch chain saw a record other than the committed one (%d bytes)", len(r.Value))
		}
		return nil
	})}, in}, Options{TopicName: cl.names})
	if out := fc.InterceptFetch(ctx, resp); len(out.Failed) != 0 {
		t.Fatalf("fetch outcome %+v", out)
	}
	got := records(t, "big", &resp.Topics[0].Partitions[0])
	if resolved != 1 || len(got) != 1 || !bytes.Equal(got[0].Value, vals[true]) || hasFerryHeaders(got[0]) {
		t.Fatalf("read_committed: %d records, %d seen by the chain", len(got), resolved)
	}
}

// A record marked large-message whose value is not a reference (stale
// headers kept by a dead-letter pattern, or forged) is produced as a plain
// record: the stale headers go, so it can never stop the consumers of its
// partition. A reference into another topic's object is refused
// (INVALID_RECORD): a client allowed on one topic cannot read another's
// payloads through the proxy.
func TestLargeMessageRefusesForgedReference(t *testing.T) {
	in, _ := lmSetup(t, nil)
	r := &Record{Topic: "big", Value: []byte("garbage"), Headers: []Header{{Key: "large-message", Value: []byte("true")}}}
	if err := in.Produce.ProcessRecord(context.Background(), r); err != nil || len(r.Headers) != 0 || string(r.Value) != "garbage" {
		t.Fatalf("stale header: %v, headers %v", err, r.Headers)
	}
	// A real object of topic "secret", referenced from a record of "big".
	_, store := lmSetup(t, nil)
	in, _ = lmSetupStore(t, store)
	resp, err := payloadstore.PublishBytes(context.Background(), store, "secret", []byte("the secret payload"))
	if err != nil {
		t.Fatal(err)
	}
	ref, err := largemessage.PayloadReferenceValue{FullPayloadPath: resp.FullPayloadPath, PayloadStoreClass: store.Class()}.AppendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	forged := &Record{Topic: "big", Value: ref, Headers: []Header{{Key: "large-message", Value: []byte("true")}}}
	if err := in.Produce.ProcessRecord(context.Background(), forged); !errors.Is(err, kerr.InvalidRecord) || !errors.Is(err, payloadstore.ErrWrongTopic) {
		t.Fatalf("a reference into topic secret produced to big: %v, want INVALID_RECORD", err)
	}
	// On fetch too: a record of big naming secret's object is not resolved.
	fetched := &Record{Topic: "big", Value: ref, Headers: []Header{{Key: "large-message", Value: []byte("true")}}}
	if err := in.Fetch.ProcessRecord(context.Background(), fetched); !errors.Is(err, payloadstore.ErrWrongTopic) || bytes.Contains(fetched.Value, []byte("secret payload")) {
		t.Fatalf("fetch of a reference into topic secret: %v", err)
	}
}

// lmSetupStore is lmSetup over an existing store's URL.
func lmSetupStore(t *testing.T, store payloadstore.PayloadStore) (Instance, payloadstore.PayloadStore) {
	t.Helper()
	ops, err := payloadstore.Objects(store)
	if err != nil {
		t.Fatal(err)
	}
	in, err := New(context.Background(), "large-message", map[string]string{largemessage.KeyStoreURL: string(ops.Root()), KeyTopicPattern: "big.*"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.Close() })
	return in, store
}

// countingStore counts a file store's downloads and touches.
type countingStore struct {
	*payloadstore.FileStore
	downloads, touches atomic.Int64
}

func (c *countingStore) Download(ctx context.Context, path string) (io.ReadCloser, error) {
	c.downloads.Add(1)
	return c.FileStore.Download(ctx, path)
}

func (c *countingStore) Touch(ctx context.Context, key string) error {
	c.touches.Add(1)
	return c.FileStore.Touch(ctx, key)
}

// A Produce whose records reference one object of their own topic many
// times reads (to verify it) and touches that object once per request,
// not once per record (break review 2: 200 references to one 90 MiB object
// in a 698-byte request read 18 GB). Every record still gets the object's
// true size and digest.
func TestLargeMessageReferencesVerifiedOncePerRequest(t *testing.T) {
	fs, err := payloadstore.NewFileStore(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	st := &countingStore{FileStore: fs}
	payload := randomBytes(7, 200<<10)
	resp, err := payloadstore.PublishBytes(context.Background(), st, "big", payload)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := largemessage.PayloadReferenceValue{FullPayloadPath: resp.FullPayloadPath, PayloadStoreClass: st.Class()}.AppendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	re, _ := CompileTopicPattern("big")
	l := NewLargeMessage(st, largemessage.DefaultConfig(), re)
	ch := NewChain([]Instance{{Produce: l}}, Options{})
	const n = 50
	d := &decodedBatch{hdr: kmsg.RecordBatch{Magic: 2, ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1,
		FirstTimestamp: 1700000000000, MaxTimestamp: 1700000000000, LastOffsetDelta: n - 1, PartitionLeaderEpoch: -1}}
	for i := range n {
		d.recs = append(d.recs, kmsg.Record{OffsetDelta: int32(i), Value: ref,
			Headers: []kmsg.Header{{Key: largemessage.HeaderLargeMessage, Value: []byte("true")}, {Key: largemessage.HeaderPayloadSize, Value: []byte("1")}}})
	}
	batch, err := d.encode(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	req := buildRequest(t, map[string][]byte{"big": batch})
	out := ch.InterceptProduce(context.Background(), req, nil)
	defer out.Release()
	if len(out.Answered) != 0 || !out.Forward {
		t.Fatalf("outcome %+v", out)
	}
	if dl, tc := st.downloads.Load(), st.touches.Load(); dl != 1 || tc != 1 {
		t.Fatalf("%d references to one object: %d downloads, %d touches; want 1 and 1", n, dl, tc)
	}
	got, err := decodeBatch(context.Background(), nil, req.Topics[0].Partitions[0].Records)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range got.recs {
		size := ""
		for _, h := range r.Headers {
			if h.Key == largemessage.HeaderPayloadSize {
				size = string(h.Value)
			}
		}
		if size != fmt.Sprint(len(payload)) {
			t.Fatalf("record %d: size header %q, want the object's %d", r.OffsetDelta, size, len(payload))
		}
	}
}

// TestChainCanStream: a Produce frame is parsed as it arrives only for a
// chain with a ValueStreamer (large-message); validate-json alone reads its
// frames whole, however large.
func TestChainCanStream(t *testing.T) {
	fs, err := payloadstore.NewFileStore(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	re, _ := CompileTopicPattern(".*")
	lm := NewLargeMessage(fs, largemessage.DefaultConfig(), re)
	if !NewChain([]Instance{{Produce: lm}}, Options{}).CanStream() {
		t.Fatal("a chain with large-message: CanStream() false, want true")
	}
	only := NewChain([]Instance{{Produce: jsonOnly{re}}}, Options{})
	if only.CanStream() {
		t.Fatal("a chain without a ValueStreamer: CanStream() true, want false")
	}
	if only.Streamer("t") != nil {
		t.Fatal("a chain without a ValueStreamer names one for topic t")
	}
}

// jsonOnly is a produce interceptor that is no ValueStreamer.
type jsonOnly struct{ re *regexp.Regexp }

func (j jsonOnly) Name() string                               { return "json-only" }
func (j jsonOnly) TopicPattern() *regexp.Regexp               { return j.re }
func (jsonOnly) ProcessRecord(context.Context, *Record) error { return nil }
