package largemessage_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
)

// fileCount counts the regular files under dir (the file store's objects).
func fileCount(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A record whose headers alone do not fit is refused before anything is
// published: the store gains no object (the key and value were offloaded
// first before, and stayed).
func TestRecordTooLargeLeavesNothing(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env) {
		if e.dir == "" {
			t.Skip("counts files")
		}
		before := fileCount(t, e.dir)
		hs := []kgo.RecordHeader{{Key: "huge", Value: make([]byte, 4096)}}
		rec := &kgo.Record{Topic: "t", Key: bytes.Repeat([]byte("k"), 3000), Value: make([]byte, 10000), Headers: hs}
		_, err := e.ser.Offload(context.Background(), rec, largemessage.Limits{Threshold: 2048, MaxMessageBytes: 2048 + 61})
		if !errors.Is(err, largemessage.ErrRecordTooLarge) {
			t.Fatalf("headers alone over the threshold: %v, want ErrRecordTooLarge", err)
		}
		if !strings.Contains(err.Error(), "topic t") || !strings.Contains(err.Error(), "max.message.bytes") {
			t.Fatalf("the error names neither the topic nor the limit: %v", err)
		}
		if after := fileCount(t, e.dir); after != before {
			t.Fatalf("the refused record left %d objects in the store", after-before)
		}
	})
}

// A dead-letter pattern re-produces a consumed record with its headers
// kept: the value is the payload, the header still says large-message:
// true. The Serializer drops the stale headers and sizes the value as any
// other: inline when small, offloaded (and resolvable) when large.
func TestStaleHeadersWithoutReference(t *testing.T) {
	ctx := context.Background()
	forEachEnv(t, func(t *testing.T, e *env) {
		rec, payload, _ := offloaded(t, e, 5000)
		if err := e.de.ResolveKey(ctx, rec); err != nil {
			t.Fatal(err)
		}
		stale := func(v []byte) *kgo.Record {
			r := cloneRecord(rec)
			r.Value = v
			return r
		}
		small := stale([]byte("a small payload"))
		if _, err := e.ser.Offload(ctx, small, defaultLimits); err != nil {
			t.Fatal(err)
		}
		if largemessage.IsOffloaded(small) || headerCount(small, largemessage.HeaderPayloadSHA256) != 0 {
			t.Fatalf("a small value with stale headers kept them: %v", small.Headers)
		}
		large := stale(payload)
		if _, err := e.ser.Offload(ctx, large, largemessage.DeriveLimits(1024, 0, 0)); err != nil {
			t.Fatal(err)
		}
		if headerCount(large, largemessage.HeaderLargeMessage) != 1 {
			t.Fatalf("after offloading, %d large-message headers", headerCount(large, largemessage.HeaderLargeMessage))
		}
		if err := e.de.Resolve(ctx, large); err != nil || !bytes.Equal(large.Value, payload) {
			t.Fatalf("resolve: %v", err)
		}
		// The consumer's error on such a record says what is wrong.
		bad := stale([]byte(`{"order":42}`))
		err := e.de.Resolve(ctx, bad)
		if !errors.Is(err, largemessage.ErrCorruptReference) || !strings.Contains(err.Error(), "not a PayloadReferenceValue") || strings.Contains(err.Error(), "version") && !strings.Contains(err.Error(), "version-0") {
			t.Fatalf("Resolve of a payload marked as a reference: %v", err)
		}
	})
}

// References are bound to their topic. A consumer refuses a record whose
// reference names another topic's object (unless resolve.topics allows
// it); a producer copies such an object into the record's own topic
// (library default) or refuses (copy.topics unset).
func TestReferencesBoundToTopic(t *testing.T) {
	ctx := context.Background()
	forEachEnv(t, func(t *testing.T, e *env) {
		rec, payload, ref := offloaded(t, e, 5000) // topic "faults"
		moved := cloneRecord(rec)
		moved.Topic = "other"
		err := e.de.Resolve(ctx, cloneRecord(moved))
		if !errors.Is(err, payloadstore.ErrWrongTopic) || !errors.Is(err, payloadstore.ErrInvalidPath) || payloadstore.IsRetryable(err) {
			t.Fatalf("a record of topic other naming faults's object resolved: %v", err)
		}
		allowed := largemessage.NewDeserializer(e.store, false).WithResolveTopics(regexp.MustCompile(`^faults$`))
		if r := cloneRecord(moved); allowed.Resolve(ctx, r) != nil || !bytes.Equal(r.Value, payload) {
			t.Fatalf("resolve.topics did not allow topic faults: %v", allowed.Resolve(ctx, cloneRecord(moved)))
		}

		// Producing it to topic other copies the object.
		copied := cloneRecord(moved)
		if _, err := e.ser.Offload(ctx, copied, defaultLimits); err != nil {
			t.Fatal(err)
		}
		cref, err := largemessage.DecodeReference(copied.Value)
		if err != nil {
			t.Fatal(err)
		}
		kp, err := payloadstore.PathKey(cref.FullPayloadPath)
		if err != nil || kp.Topic != "other" || cref.FullPayloadPath == ref.FullPayloadPath {
			t.Fatalf("copied reference %q (%+v, %v): want a new object of topic other", cref.FullPayloadPath, kp, err)
		}
		if err := e.de.Resolve(ctx, copied); err != nil || !bytes.Equal(copied.Value, payload) {
			t.Fatalf("the copy does not resolve: %v", err)
		}
		// With copy.topics unset the producer refuses, and publishes nothing.
		strict := largemessage.NewSerializer(e.store, largemessage.Codec{Type: "none"}).WithCopyTopics(nil)
		if _, err := strict.Offload(ctx, cloneRecord(moved), defaultLimits); !errors.Is(err, payloadstore.ErrWrongTopic) {
			t.Fatalf("copy.topics unset: %v, want ErrWrongTopic", err)
		}
		// A reference into another store is refused either way.
		foreign := cloneRecord(rec)
		foreign.Value = mustEncode(t, "s3://elsewhere/"+strings.TrimPrefix(ref.FullPayloadPath, e.root+"/"), ref.PayloadStoreClass)
		if _, err := e.ser.Offload(ctx, foreign, defaultLimits); !errors.Is(err, payloadstore.ErrInvalidPath) {
			t.Fatalf("a reference into another store: %v, want ErrInvalidPath", err)
		}
	})
}

// References with long paths never reach the store: ErrInvalidPath, not
// retryable, and the error quotes the path once, shortened.
func TestLongReferencePath(t *testing.T) {
	ctx := context.Background()
	forEachEnv(t, func(t *testing.T, e *env) {
		for _, path := range []string{
			e.root + "/t/" + strings.Repeat("x", 300) + "/id",
			e.root + "/" + strings.Repeat("seg/", 1250),
			e.root + "/t/ab/" + strings.Repeat("y", 5000),
		} {
			rec := forged(t, path, payloadstore.FileStoreClass, []byte("x"))
			err := e.de.Resolve(ctx, rec)
			if !errors.Is(err, payloadstore.ErrInvalidPath) || payloadstore.IsRetryable(err) {
				t.Fatalf("a %d-byte path: %v, want ErrInvalidPath", len(path), err)
			}
			if n := len(err.Error()); n > 400 {
				t.Fatalf("the error on a %d-byte path is %d bytes: %.300s", len(path), n, err)
			}
		}
	})
}

// A reference read without the store's root can name another topic: under
// a root ending in "orders", "<root>/2d/<id>" is the two-segment key (the
// layout before shards) of topic "2d" when the shard of <id> is "2d", but
// its last three segments read as topic "orders", shard "2d". Topic binding
// uses the root (FuzzKey found the ambiguity): a record of topic "orders"
// can neither carry nor resolve that reference.
func TestReferenceBindingUsesTheRoot(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "orders")
	st, err := payloadstore.NewFileStore(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	id := ""
	for i := 0; id == ""; i++ {
		c := fmt.Sprint("id", i)
		if sum := sha256.Sum256([]byte(c)); hex.EncodeToString(sum[:1]) == "2d" {
			id = c
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "2d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "2d", id), []byte("topic 2d's secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := st.Root().Path("2d/" + id)
	ref, err := largemessage.PayloadReferenceValue{FullPayloadPath: path, PayloadStoreClass: st.Class()}.AppendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	mk := func() *kgo.Record {
		return &kgo.Record{Topic: "orders", Value: ref, Headers: []kgo.RecordHeader{{Key: largemessage.HeaderLargeMessage, Value: []byte("true")}}}
	}
	ctx := context.Background()
	ser := largemessage.NewSerializer(st, largemessage.Codec{Type: "none"}).WithCopyTopics(nil)
	if _, _, err := ser.Adopt(ctx, mk()); !errors.Is(err, payloadstore.ErrWrongTopic) {
		t.Fatalf("producing a reference to topic 2d's object on topic orders: %v, want ErrWrongTopic", err)
	}
	r := mk()
	if err := largemessage.NewDeserializer(st, false).Resolve(ctx, r); !errors.Is(err, payloadstore.ErrWrongTopic) {
		t.Fatalf("resolving it on topic orders: %v (value %q), want ErrWrongTopic", err, r.Value)
	}
}
