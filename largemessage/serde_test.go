package largemessage_test

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/envelope"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
)

// env is one real store (mem:// or file://) with a serializer and
// deserializers over it.
type env struct {
	name  string
	url   string
	dir   string // the file store's directory; "" for mem
	root  string // every full path starts with root + "/"
	store payloadstore.PayloadStore
	ser   *largemessage.Serializer
	de    *largemessage.Deserializer
	skip  *largemessage.Deserializer // large.message.skip.not.found.error=true
	// keyURL, when set, encrypts the payloads
	// (large.message.payload.encryption.key.url): the objects on disk are
	// sealed, and every promise of the serde must hold the same.
	keyURL string
}

// testKeyURL is a fresh base64key:// KEK.
func testKeyURL() string {
	k := make([]byte, 32)
	crand.Read(k)
	return "base64key://" + base64.URLEncoding.EncodeToString(k)
}

var memSeq atomic.Int64

// envs opens a fresh mem store and a fresh file store (in t.TempDir) through
// Config.OpenStore, as an application would.
func envs(t *testing.T) []*env {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "store")
	encDir := filepath.Join(t.TempDir(), "sealed")
	out := []*env{
		{name: "mem", url: fmt.Sprintf("mem://serde-%d", memSeq.Add(1))},
		{name: "file", url: "file://" + dir, dir: dir},
		{name: "file+encryption", url: "file://" + encDir, dir: encDir, keyURL: testKeyURL()},
	}
	for _, e := range out {
		cfg := largemessage.DefaultConfig()
		cfg.StoreURL = e.url
		cfg.Encryption.KeyURL = e.keyURL
		cfg.Policy.RetryBackoff = time.Millisecond
		s, err := cfg.OpenStore(context.Background())
		if err != nil {
			t.Fatalf("OpenStore(%s): %v", e.url, err)
		}
		t.Cleanup(func() { s.Close() })
		e.store = s
		e.root = e.url
		e.ser = largemessage.NewSerializer(s, cfg.Codec)
		e.de = largemessage.NewDeserializer(s, false)
		e.skip = largemessage.NewDeserializer(s, true)
	}
	return out
}

// forEachEnv runs fn as a subtest per store.
func forEachEnv(t *testing.T, fn func(t *testing.T, e *env)) {
	for _, e := range envs(t) {
		t.Run(e.name, func(t *testing.T) { fn(t, e) })
	}
}

var defaultLimits = largemessage.DeriveLimits(0, 0, 0)

func random(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := crand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func hexSum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func headerValue(rec *kgo.Record, name string) (string, bool) {
	for _, h := range rec.Headers {
		if h.Key == name {
			return string(h.Value), true
		}
	}
	return "", false
}

func headerCount(rec *kgo.Record, name string) int {
	n := 0
	for _, h := range rec.Headers {
		if h.Key == name {
			n++
		}
	}
	return n
}

func appHeaders() []kgo.RecordHeader {
	return []kgo.RecordHeader{{Key: "app-trace-id", Value: []byte("7d1e4a")}, {Key: "app-empty", Value: nil}}
}

func cloneRecord(r *kgo.Record) *kgo.Record {
	c := *r
	c.Key = bytes.Clone(r.Key)
	c.Value = bytes.Clone(r.Value)
	if r.Value == nil {
		c.Value = nil
	}
	if r.Key == nil {
		c.Key = nil
	}
	c.Headers = nil
	for _, h := range r.Headers {
		c.Headers = append(c.Headers, kgo.RecordHeader{Key: h.Key, Value: bytes.Clone(h.Value)})
	}
	return &c
}

// checkSide checks that side of rec (the value, or the key) is a reference
// to an object inside e's store holding want, with Ferry's headers.
func checkSide(t *testing.T, e *env, rec *kgo.Record, key bool, want []byte) largemessage.PayloadReferenceValue {
	t.Helper()
	marker, sizeH, shaH, metaH, refBytes := largemessage.HeaderLargeMessage, largemessage.HeaderPayloadSize, largemessage.HeaderPayloadSHA256, largemessage.HeaderPayloadMetadata, rec.Value
	if key {
		marker, sizeH, shaH, metaH, refBytes = largemessage.HeaderLargeMessageKey, largemessage.HeaderKeyPayloadSize, largemessage.HeaderKeyPayloadSHA256, largemessage.HeaderKeyPayloadMetadata, rec.Key
	}
	if v, ok := headerValue(rec, marker); !ok || v != "true" || headerCount(rec, marker) != 1 {
		t.Fatalf("header %s = %q (present %v, %d times), want true once", marker, v, ok, headerCount(rec, marker))
	}
	if v, _ := headerValue(rec, sizeH); v != fmt.Sprint(len(want)) {
		t.Errorf("header %s = %q, want %d", sizeH, v, len(want))
	}
	if v, _ := headerValue(rec, shaH); v != hexSum(want) {
		t.Errorf("header %s = %q, want %s", shaH, v, hexSum(want))
	}
	if _, ok := headerValue(rec, metaH); ok {
		t.Errorf("header %s present, but %s stores return no custom metadata", metaH, e.name)
	}
	ref, err := largemessage.DecodeReference(refBytes)
	if err != nil {
		t.Fatalf("the record's %s is not a reference: %v", map[bool]string{true: "key", false: "value"}[key], err)
	}
	prefix := e.root + "/" + rec.Topic + "/"
	if !strings.HasPrefix(ref.FullPayloadPath, prefix) {
		t.Fatalf("reference path %q is not under %q", ref.FullPayloadPath, prefix)
	}
	if ref.PayloadStoreClass != e.store.Class() {
		t.Errorf("reference class %q, store class %q", ref.PayloadStoreClass, e.store.Class())
	}
	got, err := payloadstore.DownloadBytes(context.Background(), e.store, ref.FullPayloadPath)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the stored object differs from the payload (%v)", err)
	}
	if e.dir != "" {
		id := strings.TrimPrefix(ref.FullPayloadPath, prefix)
		onDisk, err := os.ReadFile(filepath.Join(e.dir, rec.Topic, id))
		switch {
		case e.keyURL != "":
			// Sealed: the magic, and no run of the payload's bytes.
			if err != nil || !bytes.HasPrefix(onDisk, []byte("FERRYENC")) || len(want) >= 64 && bytes.Contains(onDisk, want[len(want)/2:len(want)/2+64]) {
				t.Fatalf("<dir>/<topic>/<id> is not the sealed payload: %v", err)
			}
		case err != nil || !bytes.Equal(onDisk, want):
			t.Fatalf("<dir>/<topic>/<id> does not hold the payload: %v", err)
		}
	}
	return ref
}

func TestSmallRecordPassesThroughUntouched(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env) {
		hs := appHeaders()
		rec := &kgo.Record{Topic: "orders", Key: []byte("k"), Value: random(t, 100<<10), Headers: hs}
		value, key := rec.Value, rec.Key
		before := cloneRecord(rec)

		did, err := e.ser.Offload(context.Background(), rec, defaultLimits)
		if err != nil {
			t.Fatal(err)
		}
		if did != (largemessage.Offloaded{}) {
			t.Fatalf("Offload reported %+v for a small record", did)
		}
		if unsafe.SliceData(rec.Value) != unsafe.SliceData(value) || len(rec.Value) != len(value) {
			t.Fatal("the value was copied or replaced")
		}
		if unsafe.SliceData(rec.Key) != unsafe.SliceData(key) {
			t.Fatal("the key was copied or replaced")
		}
		if len(rec.Headers) != len(hs) || unsafe.SliceData(rec.Headers) != unsafe.SliceData(hs) {
			t.Fatalf("headers changed: %v", rec.Headers)
		}
		if !bytes.Equal(rec.Value, before.Value) || !slices.EqualFunc(rec.Headers, before.Headers, headerEq) {
			t.Fatal("record contents changed")
		}
		if largemessage.IsOffloaded(rec) || largemessage.IsKeyOffloaded(rec) {
			t.Fatal("small record marked as offloaded")
		}

		// Resolving a record without the headers leaves it as it is.
		if err := e.de.Resolve(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
		if unsafe.SliceData(rec.Value) != unsafe.SliceData(value) || len(rec.Headers) != len(hs) {
			t.Fatal("Resolve changed a record without references")
		}
		rc, n, err := e.de.OpenValue(context.Background(), rec)
		if err != nil || n != int64(len(value)) {
			t.Fatalf("OpenValue of an inline value: %d, %v", n, err)
		}
		got, _ := io.ReadAll(rc)
		rc.Close()
		if !bytes.Equal(got, value) {
			t.Fatal("OpenValue of an inline value gave other bytes")
		}
	})
}

func headerEq(a, b kgo.RecordHeader) bool { return a.Key == b.Key && bytes.Equal(a.Value, b.Value) }

func TestLargeValueOffloadedAndResolved(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		payload := random(t, 5<<20)
		rec := &kgo.Record{Topic: "orders", Partition: 3, Offset: 77, Key: []byte("order-42"), Value: bytes.Clone(payload), Headers: appHeaders()}

		did, err := e.ser.Offload(ctx, rec, defaultLimits)
		if err != nil {
			t.Fatal(err)
		}
		if !did.Value || did.Key || did.StoredBytes != int64(len(payload)) {
			t.Fatalf("Offloaded = %+v", did)
		}
		if !largemessage.IsOffloaded(rec) || largemessage.IsKeyOffloaded(rec) {
			t.Fatal("markers wrong")
		}
		if string(rec.Key) != "order-42" {
			t.Fatalf("key changed: %q", rec.Key)
		}
		// The application's headers come first, unchanged.
		if !slices.EqualFunc(rec.Headers[:2], appHeaders(), headerEq) {
			t.Fatalf("application headers changed: %v", rec.Headers)
		}
		checkSide(t, e, rec, false, payload)
		if n := largemessage.RecordLen(rec.Key, rec.Value, rec.Headers); n > defaultLimits.Threshold {
			t.Fatalf("the offloaded record is %d bytes, still over %d", n, defaultLimits.Threshold)
		}
		// Offloading again keeps the reference (same topic: the object is
		// only touched) and publishes nothing.
		again := cloneRecord(rec)
		if did, err := e.ser.Offload(ctx, again, defaultLimits); err != nil || did != (largemessage.Offloaded{}) || !bytes.Equal(again.Value, rec.Value) {
			t.Fatalf("re-offloading an offloaded record: %+v, %v", did, err)
		}

		streamed := cloneRecord(rec)
		if err := e.de.Resolve(ctx, rec); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(rec.Value, payload) {
			t.Fatal("Resolve gave other bytes")
		}
		if !slices.EqualFunc(rec.Headers, appHeaders(), headerEq) {
			t.Fatalf("after Resolve headers are %v, want only the application's", rec.Headers)
		}
		if string(rec.Key) != "order-42" {
			t.Fatalf("key changed: %q", rec.Key)
		}

		rc, n, err := e.de.OpenValue(ctx, streamed)
		if err != nil || n != int64(len(payload)) {
			t.Fatalf("OpenValue: %d, %v", n, err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, payload) {
			t.Fatalf("OpenValue stream: %v", err)
		}
	})
}

func TestLargeKeyOffloadedByContentID(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		key := random(t, 2<<20)
		r1 := &kgo.Record{Topic: "orders", Key: bytes.Clone(key), Value: []byte("v1")}
		r2 := &kgo.Record{Topic: "orders", Key: bytes.Clone(key), Value: []byte("another value")}
		for _, r := range []*kgo.Record{r1, r2} {
			did, err := e.ser.Offload(ctx, r, defaultLimits)
			if err != nil {
				t.Fatal(err)
			}
			if !did.Key || did.Value {
				t.Fatalf("Offloaded = %+v, want the key only", did)
			}
			if !largemessage.IsKeyOffloaded(r) || largemessage.IsOffloaded(r) {
				t.Fatal("markers wrong")
			}
			ref := checkSide(t, e, r, true, key)
			if !strings.HasSuffix(ref.FullPayloadPath, "/"+hexSum(key)) || !strings.Contains(ref.FullPayloadPath, "/orders/") {
				t.Fatalf("key path %q is not the content id", ref.FullPayloadPath)
			}
		}
		if !bytes.Equal(r1.Key, r2.Key) {
			t.Fatalf("equal keys got different references:\n%x\n%x", r1.Key, r2.Key)
		}
		if string(r1.Value) != "v1" {
			t.Fatal("the small value changed")
		}
		if err := e.de.Resolve(ctx, r2); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(r2.Key, key) || string(r2.Value) != "another value" || len(r2.Headers) != 0 {
			t.Fatalf("after Resolve: key equal %v, value %q, headers %v", bytes.Equal(r2.Key, key), r2.Value, r2.Headers)
		}
	})
}

func TestTombstoneWithLargeKey(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		key := random(t, 2<<20)
		rec := &kgo.Record{Topic: "compacted", Key: bytes.Clone(key), Value: nil}
		did, err := e.ser.Offload(ctx, rec, defaultLimits)
		if err != nil {
			t.Fatal(err)
		}
		if !did.Key || did.Value {
			t.Fatalf("Offloaded = %+v", did)
		}
		if rec.Value != nil {
			t.Fatalf("the tombstone's value became %x; it must stay null", rec.Value)
		}
		if largemessage.IsOffloaded(rec) {
			t.Fatal("a tombstone's null value is marked offloaded")
		}
		checkSide(t, e, rec, true, key)
		if err := e.de.Resolve(ctx, rec); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(rec.Key, key) || rec.Value != nil || len(rec.Headers) != 0 {
			t.Fatalf("after Resolve: value %v, headers %v", rec.Value, rec.Headers)
		}
	})
}

func TestKeyAndValueOffloaded(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		key, value := random(t, 1<<20), random(t, 3<<20)
		rec := &kgo.Record{Topic: "both", Key: bytes.Clone(key), Value: bytes.Clone(value), Headers: appHeaders()}
		did, err := e.ser.Offload(ctx, rec, defaultLimits)
		if err != nil {
			t.Fatal(err)
		}
		if !did.Key || !did.Value || did.StoredBytes != int64(len(key)+len(value)) {
			t.Fatalf("Offloaded = %+v", did)
		}
		checkSide(t, e, rec, false, value)
		checkSide(t, e, rec, true, key)
		if err := e.de.Resolve(ctx, rec); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(rec.Key, key) || !bytes.Equal(rec.Value, value) || !slices.EqualFunc(rec.Headers, appHeaders(), headerEq) {
			t.Fatal("Resolve did not restore the record")
		}
	})
}

func TestRecordTooLargeEvenOffloaded(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env) {
		hs := []kgo.RecordHeader{{Key: "huge", Value: make([]byte, 4096)}}
		rec := &kgo.Record{Topic: "t", Key: []byte("k"), Value: make([]byte, 10000), Headers: hs}
		_, err := e.ser.Offload(context.Background(), rec, largemessage.Limits{Threshold: 2048})
		if !errors.Is(err, largemessage.ErrRecordTooLarge) {
			t.Fatalf("headers alone over the threshold: %v, want ErrRecordTooLarge", err)
		}
	})
}

// offloaded returns a record whose value of n random bytes was offloaded to
// e's store (threshold 1 KiB, so that n can stay small), its payload, and
// the reference.
func offloaded(t *testing.T, e *env, n int) (*kgo.Record, []byte, largemessage.PayloadReferenceValue) {
	t.Helper()
	payload := random(t, n)
	rec := &kgo.Record{Topic: "faults", Partition: 7, Offset: 12345, Key: []byte("k"), Value: bytes.Clone(payload), Headers: appHeaders()}
	did, err := e.ser.Offload(context.Background(), rec, largemessage.DeriveLimits(1024, 0, 0))
	if err != nil || !did.Value {
		t.Fatalf("Offload: %+v, %v", did, err)
	}
	ref, err := largemessage.DecodeReference(rec.Value)
	if err != nil {
		t.Fatal(err)
	}
	return rec, payload, ref
}

// recordError checks that err is a *RecordError naming rec and side.
func recordError(t *testing.T, err error, rec *kgo.Record, side string) *largemessage.RecordError {
	t.Helper()
	var re *largemessage.RecordError
	if !errors.As(err, &re) {
		t.Fatalf("error %v (%T) is not a *RecordError", err, err)
	}
	if re.Topic != rec.Topic || re.Partition != rec.Partition || re.Offset != rec.Offset || re.Side != side {
		t.Fatalf("RecordError names %s/%d@%d %s, want %s/%d@%d %s", re.Topic, re.Partition, re.Offset, re.Side, rec.Topic, rec.Partition, rec.Offset, side)
	}
	msg := err.Error()
	for _, want := range []string{rec.Topic, fmt.Sprint(rec.Partition), fmt.Sprint(rec.Offset), side} {
		if !strings.Contains(msg, want) {
			t.Errorf("error message %q does not name %q", msg, want)
		}
	}
	return re
}

// overwrite replaces the object behind ref with b, through the store (the
// same id under the same topic).
func overwrite(t *testing.T, e *env, rec *kgo.Record, ref largemessage.PayloadReferenceValue, b []byte) {
	t.Helper()
	id := ref.FullPayloadPath[strings.LastIndexByte(ref.FullPayloadPath, '/')+1:]
	p := payloadstore.BytesPayload(b)
	p.ID = id
	resp, err := e.store.Publish(context.Background(), rec.Topic, p)
	if err != nil || resp.FullPayloadPath != ref.FullPayloadPath {
		t.Fatalf("overwriting %s: %q, %v", ref.FullPayloadPath, resp.FullPayloadPath, err)
	}
}

func TestResolveMissingPayload(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		rec, _, ref := offloaded(t, e, 10000)
		if err := e.store.Delete(ctx, ref.FullPayloadPath); err != nil {
			t.Fatal(err)
		}
		before := cloneRecord(rec)

		err := e.de.Resolve(ctx, rec)
		if !errors.Is(err, largemessage.ErrPayloadNotFound) || !errors.Is(err, payloadstore.ErrPayloadNotFound) {
			t.Fatalf("Resolve: %v, want ErrPayloadNotFound", err)
		}
		re := recordError(t, err, rec, "value")
		if re.Skipped || re.Path != ref.FullPayloadPath {
			t.Fatalf("RecordError %+v: Skipped without skipNotFound, or wrong path", re)
		}
		if !bytes.Equal(rec.Value, before.Value) || !slices.EqualFunc(rec.Headers, before.Headers, headerEq) {
			t.Fatal("a failed Resolve changed the record")
		}

		// With large.message.skip.not.found.error the record goes through
		// with a null value and the error recorded.
		err = e.skip.Resolve(ctx, rec)
		if !errors.Is(err, largemessage.ErrPayloadNotFound) {
			t.Fatalf("Resolve with skip: %v", err)
		}
		if re := recordError(t, err, rec, "value"); !re.Skipped || !strings.Contains(err.Error(), "skip") {
			t.Fatalf("RecordError %+v not marked skipped", re)
		}
		if rec.Value != nil {
			t.Fatalf("skipped value is %q, want nil", rec.Value)
		}
		if !slices.EqualFunc(rec.Headers, appHeaders(), headerEq) {
			t.Fatalf("skipped record keeps Ferry headers: %v", rec.Headers)
		}

		// OpenValue reports it at open.
		_, _, err = e.de.OpenValue(ctx, before)
		if !errors.Is(err, largemessage.ErrPayloadNotFound) {
			t.Fatalf("OpenValue: %v", err)
		}
		recordError(t, err, before, "value")
	})
}

func TestResolveMissingKeyPayload(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		key, value := random(t, 2<<20), random(t, 3<<20)
		rec := &kgo.Record{Topic: "both", Partition: 1, Offset: 9, Key: bytes.Clone(key), Value: bytes.Clone(value), Headers: appHeaders()}
		if did, err := e.ser.Offload(ctx, rec, defaultLimits); err != nil || !did.Key || !did.Value {
			t.Fatalf("Offload: %+v, %v", did, err)
		}
		keyRef, err := largemessage.DecodeReference(rec.Key)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.store.Delete(ctx, keyRef.FullPayloadPath); err != nil {
			t.Fatal(err)
		}
		before := cloneRecord(rec)
		err = e.de.Resolve(ctx, rec)
		recordError(t, err, rec, "key")
		if !errors.Is(err, largemessage.ErrPayloadNotFound) {
			t.Fatalf("Resolve: %v", err)
		}
		if !bytes.Equal(rec.Key, before.Key) || !bytes.Equal(rec.Value, before.Value) || !slices.EqualFunc(rec.Headers, before.Headers, headerEq) {
			t.Fatal("a failed Resolve changed the record")
		}
		// Skipping the missing key still resolves the value.
		err = e.skip.Resolve(ctx, rec)
		if re := recordError(t, err, rec, "key"); !re.Skipped {
			t.Fatalf("not skipped: %v", err)
		}
		if rec.Key != nil || !bytes.Equal(rec.Value, value) || !slices.EqualFunc(rec.Headers, appHeaders(), headerEq) {
			t.Fatalf("after a skipped key: key %d bytes, value resolved %v, headers %v", len(rec.Key), bytes.Equal(rec.Value, value), rec.Headers)
		}
	})
}

func TestResolveValueFailureLeavesKey(t *testing.T) {
	// Key and value offloaded, the value's object missing: a failed Resolve
	// leaves the whole record unchanged, the resolvable key included.
	forEachEnv(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		rec := &kgo.Record{Topic: "both", Key: random(t, 2<<20), Value: random(t, 3<<20)}
		if did, err := e.ser.Offload(ctx, rec, defaultLimits); err != nil || !did.Key || !did.Value {
			t.Fatalf("Offload: %+v, %v", did, err)
		}
		valueRef, _ := largemessage.DecodeReference(rec.Value)
		if err := e.store.Delete(ctx, valueRef.FullPayloadPath); err != nil {
			t.Fatal(err)
		}
		before := cloneRecord(rec)
		err := e.de.Resolve(ctx, rec)
		recordError(t, err, rec, "value")
		if !bytes.Equal(rec.Key, before.Key) || !bytes.Equal(rec.Value, before.Value) || !slices.EqualFunc(rec.Headers, before.Headers, headerEq) {
			t.Fatal("a failed Resolve changed the record")
		}
	})
}

func TestResolveCorruptReference(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		for _, v := range [][]byte{nil, {}, {0}, {0, 1, 0, 1, 'x', 0, 0}, {0, 0, 0xff, 0xff, 0, 0}, append(bytes.Clone(mustEncode(t, e.root+"/t/x", "")), 0)} {
			rec := &kgo.Record{Topic: "t", Partition: 2, Offset: 5, Value: v, Headers: []kgo.RecordHeader{{Key: largemessage.HeaderLargeMessage, Value: []byte("true")}}}
			err := e.de.Resolve(ctx, rec)
			if !errors.Is(err, largemessage.ErrCorruptReference) {
				t.Fatalf("value %x: %v, want ErrCorruptReference", v, err)
			}
			recordError(t, err, rec, "value")
			if !bytes.Equal(rec.Value, v) || !largemessage.IsOffloaded(rec) {
				t.Fatal("a failed Resolve changed the record")
			}
			// skipNotFound does not skip corruption.
			if err := e.skip.Resolve(ctx, rec); !errors.Is(err, largemessage.ErrCorruptReference) {
				t.Fatalf("with skip: %v", err)
			} else if re := recordError(t, err, rec, "value"); re.Skipped {
				t.Fatal("a corrupt reference was skipped")
			}
		}
		// Malformed digest headers are corrupt too.
		rec, _, _ := offloaded(t, e, 5000)
		for _, hs := range [][2]string{
			{largemessage.HeaderPayloadSize, "-1"},
			{largemessage.HeaderPayloadSize, "five"},
			{largemessage.HeaderPayloadSHA256, "zz"},
			{largemessage.HeaderPayloadSHA256, strings.Repeat("ab", 31)},
		} {
			r := cloneRecord(rec)
			for i := range r.Headers {
				if r.Headers[i].Key == hs[0] {
					r.Headers[i].Value = []byte(hs[1])
				}
			}
			if err := e.de.Resolve(ctx, r); !errors.Is(err, largemessage.ErrCorruptReference) {
				t.Errorf("%s=%q: %v, want ErrCorruptReference", hs[0], hs[1], err)
			}
		}
		// Only one of size and digest.
		r := cloneRecord(rec)
		r.Headers = slices.DeleteFunc(r.Headers, func(h kgo.RecordHeader) bool { return h.Key == largemessage.HeaderPayloadSHA256 })
		if err := e.de.Resolve(ctx, r); !errors.Is(err, largemessage.ErrCorruptReference) {
			t.Errorf("size without digest: %v, want ErrCorruptReference", err)
		}
	})
}

func mustEncode(t *testing.T, path, class string) []byte {
	t.Helper()
	b, err := largemessage.PayloadReferenceValue{FullPayloadPath: path, PayloadStoreClass: class}.AppendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// forged is a record whose value references path, with size and digest
// headers that match want: if the store read the file, Resolve would succeed.
func forged(t *testing.T, path, class string, want []byte) *kgo.Record {
	t.Helper()
	return &kgo.Record{Topic: "t", Partition: 4, Offset: 40, Value: mustEncode(t, path, class), Headers: []kgo.RecordHeader{
		{Key: largemessage.HeaderLargeMessage, Value: []byte("true")},
		{Key: largemessage.HeaderPayloadSize, Value: []byte(fmt.Sprint(len(want)))},
		{Key: largemessage.HeaderPayloadSHA256, Value: []byte(hexSum(want))},
	}}
}

func TestResolvePathTraversal(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	dir := filepath.Join(base, "store")
	cfg := largemessage.DefaultConfig()
	cfg.StoreURL = "file://" + dir
	store, err := cfg.OpenStore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	de := largemessage.NewDeserializer(store, true)
	root := cfg.StoreURL

	// Files an escape would reach, holding a secret the headers vouch for.
	secret := []byte("a secret outside the payload store")
	for _, p := range []string{
		filepath.Join(base, "x"),
		filepath.Join(base, "store-evil", "x"),
		filepath.Join(base, "store", "..", "topic-x"),
	} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, secret, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Another mem bucket holding the secret.
	other := payloadstore.NewMemStore(fmt.Sprintf("other-%d", memSeq.Add(1)), nil)
	otherResp, err := payloadstore.PublishBytes(ctx, other, "t", secret)
	if err != nil {
		t.Fatal(err)
	}
	passwd, _ := os.ReadFile("/etc/passwd")

	cases := []struct {
		path string
		want []byte
	}{
		{"file:///etc/passwd", passwd},
		{root + "/../x", secret},
		{root + "/t/../../x", secret},
		{root + "/../topic-x", secret},
		{root + "/t/%2e%2e/%2e%2e/x", secret},
		{root + "/t/%2e%2e/x", secret},
		{root + "-evil/x", secret},
		{"mem://other/x", secret},
		{otherResp.FullPayloadPath, secret},
		{"file://" + filepath.ToSlash(base) + "/x", secret},
	}
	for _, c := range cases {
		for _, class := range []string{payloadstore.FileStoreClass, "some.other.Store"} {
			rec := forged(t, c.path, class, c.want)
			before := cloneRecord(rec)
			err := de.Resolve(ctx, rec)
			if !errors.Is(err, payloadstore.ErrInvalidPath) {
				t.Fatalf("reference %q: %v, want ErrInvalidPath", c.path, err)
			}
			re := recordError(t, err, rec, "value")
			if re.Skipped {
				t.Fatalf("reference %q: an invalid path was skipped as not found", c.path)
			}
			if !bytes.Equal(rec.Value, before.Value) {
				t.Fatalf("reference %q: the record's value became %q", c.path, rec.Value)
			}
			if bytes.Contains(rec.Value, secret) {
				t.Fatalf("reference %q: the secret was read", c.path)
			}
			if _, _, err := de.OpenValue(ctx, before); !errors.Is(err, payloadstore.ErrInvalidPath) {
				t.Fatalf("OpenValue of %q: %v", c.path, err)
			}
			if class != payloadstore.FileStoreClass && !strings.Contains(err.Error(), class) {
				t.Errorf("error %q does not mention the writer's class %q", err, class)
			}
		}
	}
	// And the store itself refuses before opening anything.
	for _, c := range cases {
		rc, err := store.Download(ctx, c.path)
		if rc != nil {
			rc.Close()
			t.Fatalf("Download(%q) opened a reader", c.path)
		}
		if !errors.Is(err, payloadstore.ErrInvalidPath) {
			t.Fatalf("Download(%q): %v", c.path, err)
		}
	}
}

func TestResolveTampered(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		cases := []struct {
			name   string
			mutate func(payload []byte) []byte
			want   error
		}{
			{"digest mismatch (same length)", func(p []byte) []byte { q := bytes.Clone(p); q[len(q)/2] ^= 1; return q }, largemessage.ErrDigestMismatch},
			{"shorter", func(p []byte) []byte { return p[:len(p)-1] }, largemessage.ErrSizeMismatch},
			{"longer", func(p []byte) []byte { return append(bytes.Clone(p), 'x') }, largemessage.ErrSizeMismatch},
			{"empty", func(p []byte) []byte { return []byte{} }, largemessage.ErrSizeMismatch},
			{"much longer", func(p []byte) []byte { return append(bytes.Clone(p), p...) }, largemessage.ErrSizeMismatch},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				rec, payload, ref := offloaded(t, e, 200<<10)
				overwrite(t, e, rec, ref, c.mutate(payload))
				streamed := cloneRecord(rec)
				before := cloneRecord(rec)

				err := e.de.Resolve(ctx, rec)
				if !errors.Is(err, c.want) {
					t.Fatalf("Resolve: %v, want %v", err, c.want)
				}
				recordError(t, err, rec, "value")
				if !bytes.Equal(rec.Value, before.Value) || !slices.EqualFunc(rec.Headers, before.Headers, headerEq) {
					t.Fatal("a failed Resolve changed the record")
				}
				if err := e.skip.Resolve(ctx, rec); !errors.Is(err, c.want) {
					t.Fatalf("with skip: %v", err)
				} else if re := recordError(t, err, rec, "value"); re.Skipped {
					t.Fatal("a tampered payload was skipped")
				}

				// The stream opens fine and fails at its end.
				rc, n, err := e.de.OpenValue(ctx, streamed)
				if err != nil {
					t.Fatalf("OpenValue: %v", err)
				}
				if n != int64(len(payload)) {
					t.Fatalf("OpenValue size %d, want the header's %d", n, len(payload))
				}
				got, err := io.ReadAll(rc)
				rc.Close()
				if !errors.Is(err, c.want) {
					t.Fatalf("stream ended with %v after %d bytes, want %v", err, len(got), c.want)
				}
				recordError(t, err, streamed, "value")
				if len(got) > len(payload) {
					t.Fatalf("the stream delivered %d bytes, more than the %d the header allows", len(got), len(payload))
				}
				// Reading on after the failure keeps failing.
				if _, err2 := rc.Read(make([]byte, 10)); !errors.Is(err2, c.want) {
					t.Fatalf("read after failure: %v", err2)
				}
			})
		}
	})
}

func TestResolveForgedHugeSize(t *testing.T) {
	// A forged size header must not make the consumer allocate it up front.
	forEachEnv(t, func(t *testing.T, e *env) {
		rec, _, _ := offloaded(t, e, 5000)
		for i := range rec.Headers {
			if rec.Headers[i].Key == largemessage.HeaderPayloadSize {
				rec.Headers[i].Value = []byte("9223372036854775807")
			}
		}
		err := e.de.Resolve(context.Background(), rec)
		if !errors.Is(err, largemessage.ErrSizeMismatch) {
			t.Fatalf("Resolve: %v, want ErrSizeMismatch", err)
		}
	})
}

func TestResolveKIPOnlyRecord(t *testing.T) {
	// A KIP-only producer writes the marker and the reference, without
	// Ferry's size and digest headers: Ferry resolves it unverified.
	forEachEnv(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		payload := random(t, 3000)
		resp, err := payloadstore.PublishBytes(ctx, e.store, "kip", payload)
		if err != nil {
			t.Fatal(err)
		}
		rec := &kgo.Record{Topic: "kip", Value: mustEncode(t, resp.FullPayloadPath, "org.example.KipStore"),
			Headers: []kgo.RecordHeader{{Key: "a", Value: []byte("1")}, {Key: largemessage.HeaderLargeMessage, Value: []byte("true")}}}
		streamed := cloneRecord(rec)
		if err := e.de.Resolve(ctx, rec); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(rec.Value, payload) || len(rec.Headers) != 1 || rec.Headers[0].Key != "a" {
			t.Fatalf("KIP-only record not resolved: %d bytes, headers %v", len(rec.Value), rec.Headers)
		}
		rc, n, err := e.de.OpenValue(ctx, streamed)
		if err != nil || n != -1 {
			t.Fatalf("OpenValue without a size header: n=%d, %v; want -1", n, err)
		}
		got, _ := io.ReadAll(rc)
		rc.Close()
		if !bytes.Equal(got, payload) {
			t.Fatal("OpenValue gave other bytes")
		}
		// An empty object resolves to an empty value, not a null one
		// (null would read as a tombstone).
		empty, err := payloadstore.PublishBytes(ctx, e.store, "kip", []byte{})
		if err != nil {
			t.Fatal(err)
		}
		for _, withHeaders := range []bool{false, true} {
			r := &kgo.Record{Topic: "kip", Value: mustEncode(t, empty.FullPayloadPath, ""),
				Headers: []kgo.RecordHeader{{Key: largemessage.HeaderLargeMessage, Value: []byte("true")}}}
			if withHeaders {
				r.Headers = append(r.Headers,
					kgo.RecordHeader{Key: largemessage.HeaderPayloadSize, Value: []byte("0")},
					kgo.RecordHeader{Key: largemessage.HeaderPayloadSHA256, Value: []byte(hexSum(nil))})
			}
			if err := e.de.Resolve(ctx, r); err != nil {
				t.Fatal(err)
			}
			if r.Value == nil || len(r.Value) != 0 {
				t.Fatalf("an empty payload resolved to %#v, want a non-nil empty value", r.Value)
			}
		}
		// Markers other than exactly "true" mean "not offloaded".
		for _, v := range []string{"TRUE", "true ", "1", ""} {
			r := &kgo.Record{Value: []byte("plain"), Headers: []kgo.RecordHeader{{Key: largemessage.HeaderLargeMessage, Value: []byte(v)}}}
			if largemessage.IsOffloaded(r) {
				t.Errorf("marker %q counts as offloaded", v)
			}
			if err := e.de.Resolve(ctx, r); err != nil || string(r.Value) != "plain" {
				t.Errorf("marker %q: %v", v, err)
			}
		}
	})
}

// ---------------------------------------------------------------------------
// Custom metadata (KIP-917).

// metadataStore makes Publish return n bytes of KIP-917 custom metadata.
// Ferry's real stores (file, mem) never return custom metadata, so a store
// that returns too much is a fault no real store here can be made to
// produce; this test-only wrapper is the only way to exercise it. It remembers
// the paths it published, so the test can check the object was deleted.
type metadataStore struct {
	payloadstore.PayloadStore
	n         int
	published []string
}

func (m *metadataStore) Publish(ctx context.Context, topic string, p payloadstore.Payload) (payloadstore.PayloadResponse, error) {
	resp, err := m.PayloadStore.Publish(ctx, topic, p)
	if err == nil {
		m.published = append(m.published, resp.FullPayloadPath)
		resp.CustomMetadata = bytes.Repeat([]byte{0xa5}, m.n)
		for i := range resp.CustomMetadata {
			resp.CustomMetadata[i] ^= byte(i)
		}
	}
	return resp, err
}

func TestCustomMetadata(t *testing.T) {
	ctx := context.Background()
	policy := payloadstore.Policy{Timeout: 10 * time.Second, RetryCount: 1, RetryBackoff: time.Millisecond, CustomMetadataMaxBytes: 128}
	open := func(t *testing.T, n int) (*metadataStore, string, *largemessage.Serializer, *largemessage.Deserializer) {
		dir := t.TempDir()
		fs, err := payloadstore.NewFileStore(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		ms := &metadataStore{PayloadStore: fs, n: n}
		s := payloadstore.Wrap(ms, policy)
		return ms, dir, largemessage.NewSerializer(s, largemessage.Codec{Type: "none"}), largemessage.NewDeserializer(s, false)
	}

	t.Run("128 bytes travel in the header", func(t *testing.T) {
		ms, _, ser, de := open(t, 128)
		payload := random(t, 2<<20)
		rec := &kgo.Record{Topic: "meta", Value: bytes.Clone(payload), Key: random(t, 2<<20)}
		key := bytes.Clone(rec.Key)
		if _, err := ser.Offload(ctx, rec, largemessage.DeriveLimits(1<<20, 0, 0)); err != nil {
			t.Fatal(err)
		}
		want := string(ms.publishedMetadata())
		for _, h := range []string{largemessage.HeaderPayloadMetadata, largemessage.HeaderKeyPayloadMetadata} {
			if v, ok := headerValue(rec, h); !ok || v != want {
				t.Fatalf("header %s = %x (present %v), want the store's 128 bytes", h, v, ok)
			}
		}
		if err := de.Resolve(ctx, rec); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(rec.Value, payload) || !bytes.Equal(rec.Key, key) || len(rec.Headers) != 0 {
			t.Fatalf("Resolve left headers %v", rec.Headers)
		}
	})

	t.Run("129 bytes fail and the object is deleted", func(t *testing.T) {
		ms, dir, ser, _ := open(t, 129)
		rec := &kgo.Record{Topic: "meta", Value: random(t, 2<<20)}
		_, err := ser.Offload(ctx, rec, defaultLimits)
		if !errors.Is(err, payloadstore.ErrCustomMetadataTooLarge) {
			t.Fatalf("Offload: %v, want ErrCustomMetadataTooLarge", err)
		}
		if largemessage.IsOffloaded(rec) {
			t.Fatal("the record was marked offloaded after a failed publish")
		}
		if len(ms.published) != 1 {
			t.Fatalf("published %d objects, want 1", len(ms.published))
		}
		name := strings.TrimPrefix(ms.published[0], "file://")
		if !strings.HasPrefix(name, filepath.Join(dir, "meta")+"/") {
			t.Fatalf("published %q, not under the topic folder", ms.published[0])
		}
		if _, err := os.Stat(name); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("the uploaded object %s still exists (stat: %v)", name, err)
		}
		var files []string
		filepath.WalkDir(filepath.Join(dir, "meta"), func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				files = append(files, p)
			}
			return nil
		})
		if len(files) != 0 {
			t.Fatalf("the topic folder still holds %v", files)
		}
	})
}

func (m *metadataStore) publishedMetadata() []byte {
	b := bytes.Repeat([]byte{0xa5}, m.n)
	for i := range b {
		b[i] ^= byte(i)
	}
	return b
}

// storeOutsidePackage hides what a payloadstore store is: a store from
// outside that package, called directly (not through payloadstore.Wrap),
// which returns no digest.
type storeOutsidePackage struct{ payloadstore.PayloadStore }

func (s storeOutsidePackage) Publish(ctx context.Context, topic string, p payloadstore.Payload) (payloadstore.PayloadResponse, error) {
	resp, err := s.PayloadStore.Publish(ctx, topic, p)
	resp.SHA256 = [32]byte{}
	return resp, err
}

// OffloadValue of a StreamPayload (the file read once, hashed by the store
// as it writes): the record's digest header is the payload's, the consumer
// verifies it, and a store that gives no digest fails the offload rather
// than produce a reference with a wrong one.
func TestOffloadValueStreamPayload(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		b := random(t, 3<<20+5)
		rec := &kgo.Record{Topic: "stream", Key: []byte("k")}
		did, err := e.ser.OffloadValue(ctx, rec, payloadstore.StreamPayload(bytes.NewReader(b), int64(len(b))))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		if did.ValueSHA256 != sum || !did.Value || did.StoredBytes != int64(len(b)) {
			t.Fatalf("Offloaded %+v, want the value's %d bytes with SHA-256 %x", did, len(b), sum)
		}
		if got, _ := headerValue(rec, largemessage.HeaderPayloadSHA256); got != hex.EncodeToString(sum[:]) {
			t.Fatalf("digest header %q, want %x", got, sum)
		}
		rc, size, err := e.de.OpenValue(ctx, rec)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || size != int64(len(b)) || !bytes.Equal(got, b) {
			t.Fatalf("read back %d of %d bytes (size %d): %v", len(got), len(b), size, err)
		}

		ser := largemessage.NewSerializer(storeOutsidePackage{payloadstore.Unwrap(e.store)}, largemessage.Codec{Type: "none"})
		rec = &kgo.Record{Topic: "stream"}
		if _, err := ser.OffloadValue(ctx, rec, payloadstore.StreamPayload(bytes.NewReader(b), int64(len(b)))); err == nil || !strings.Contains(err.Error(), "no SHA-256") {
			t.Fatalf("a store that returns no digest: %v, want an error", err)
		}
		if rec.Value != nil {
			t.Fatalf("the record got a value (%q) from a failed offload", rec.Value)
		}
	})
}

// An encrypted payload altered at rest (a byte flipped in the sealed object,
// the object cut short, or swapped for another record's object of the same
// topic) fails with a *RecordError wrapping envelope.ErrAuthentication that
// is not retryable, and never gives bytes that are not the payload's; a
// consumer without encryption configured is told the object is encrypted.
func TestResolveEncryptedTampered(t *testing.T) {
	e := envs(t)[2]
	if e.keyURL == "" {
		t.Fatal("envs()[2] is not the encrypted store")
	}
	ctx := context.Background()
	file := func(ref largemessage.PayloadReferenceValue) string {
		return filepath.Join(e.dir, filepath.FromSlash(strings.TrimPrefix(ref.FullPayloadPath, e.url+"/")))
	}
	_, _, otherRef := offloaded(t, e, 300<<10)
	other, err := os.ReadFile(file(otherRef))
	if err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func([]byte) []byte{
		"byte flipped mid-object": func(b []byte) []byte { b = bytes.Clone(b); b[len(b)/2] ^= 1; return b },
		"cut short":               func(b []byte) []byte { return b[:len(b)-300] },
		"swapped":                 func([]byte) []byte { return other },
	} {
		t.Run(name, func(t *testing.T) {
			rec, payload, ref := offloaded(t, e, 300<<10)
			sealed, err := os.ReadFile(file(ref))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(file(ref), mutate(sealed), 0o644); err != nil {
				t.Fatal(err)
			}
			before := cloneRecord(rec)
			err = e.de.Resolve(ctx, rec)
			if !errors.Is(err, envelope.ErrAuthentication) {
				t.Fatalf("Resolve: %v, want ErrAuthentication", err)
			}
			recordError(t, err, rec, "value")
			if payloadstore.IsRetryable(err) {
				t.Errorf("a tampered object is retryable: %v", err)
			}
			if !bytes.Equal(rec.Value, before.Value) || bytes.Equal(rec.Value, payload) {
				t.Fatal("a failed Resolve changed the record")
			}
		})
	}
	// Read without encryption: the size check fails and says why.
	rec, _, _ := offloaded(t, e, 300<<10)
	plainCfg := largemessage.DefaultConfig()
	plainCfg.StoreURL = e.url
	s, err := plainCfg.OpenStore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = largemessage.NewDeserializer(s, false).Resolve(ctx, rec)
	if !errors.Is(err, largemessage.ErrSizeMismatch) || !strings.Contains(err.Error(), "the payload is encrypted, and "+largemessage.KeyEncryptionKeyURL+" is not set: set it to the producer's key") {
		t.Fatalf("without encryption: %v, want a size mismatch naming %s", err, largemessage.KeyEncryptionKeyURL)
	}
}
