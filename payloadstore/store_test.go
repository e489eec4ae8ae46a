//go:build !ferry_nocloud

package payloadstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ferrykit/ferry/payloadstore"
)

// ---------------------------------------------------------------------------
// Conformance suite: every PayloadStore must pass it.

const conformanceTopic = "orders"

// runConformance checks the PayloadStore contract of store.go against the
// stores open returns (a fresh, empty store per call).
func runConformance(t *testing.T, open func(t *testing.T) payloadstore.PayloadStore) {
	ctx := context.Background()

	// rootOf publishes a probe object under a fixed id and derives the store
	// root from the returned path, so the suite needs nothing but the
	// interface.
	rootOf := func(t *testing.T, s payloadstore.PayloadStore) string {
		t.Helper()
		p := payloadstore.BytesPayload([]byte("probe"))
		p.ID = "fixed-probe-id"
		resp, err := s.Publish(ctx, conformanceTopic, p)
		if err != nil {
			t.Fatalf("Publish probe: %v", err)
		}
		suffix := "/" + objectKey(conformanceTopic, "fixed-probe-id")
		root, ok := strings.CutSuffix(resp.FullPayloadPath, suffix)
		if !ok || root == "" {
			t.Fatalf("full path %q does not end in %q: the layout must be <root>/<topic>/<shard>/<id>", resp.FullPayloadPath, suffix)
		}
		return root
	}

	t.Run("Class", func(t *testing.T) {
		if open(t).Class() == "" {
			t.Fatal("Class() is empty; it is written into every reference")
		}
	})

	t.Run("RoundTrip", func(t *testing.T) {
		s := open(t)
		for _, size := range []int{0, 1, 3 << 20} {
			t.Run(fmt.Sprint(size), func(t *testing.T) {
				b := randBytes(t, size)
				resp, err := payloadstore.PublishBytes(ctx, s, conformanceTopic, b)
				if err != nil {
					t.Fatalf("Publish: %v", err)
				}
				if !strings.Contains(resp.FullPayloadPath, "/"+conformanceTopic+"/") {
					t.Errorf("full path %q does not contain the topic folder", resp.FullPayloadPath)
				}
				if resp.CustomMetadata != nil {
					t.Errorf("store returned custom metadata %q; file and mem stores have none", resp.CustomMetadata)
				}
				got, err := payloadstore.DownloadBytes(ctx, s, resp.FullPayloadPath)
				if err != nil {
					t.Fatalf("Download: %v", err)
				}
				if !bytes.Equal(got, b) {
					t.Fatalf("downloaded %d bytes that differ from the %d published", len(got), len(b))
				}
			})
		}
	})

	t.Run("PublishFromOffset", func(t *testing.T) {
		// Publish reads Body from offset 0 even if it was left elsewhere
		// (a retry seeks back).
		s := open(t)
		b := []byte("0123456789")
		p := payloadstore.BytesPayload(b)
		if _, err := p.Body.Seek(7, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		resp, err := s.Publish(ctx, conformanceTopic, p)
		if err != nil {
			t.Fatal(err)
		}
		got, err := payloadstore.DownloadBytes(ctx, s, resp.FullPayloadPath)
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("got %q, %v; want %q", got, err, b)
		}
	})

	t.Run("DownloadMissing", func(t *testing.T) {
		s := open(t)
		root := rootOf(t, s)
		_, err := s.Download(ctx, root+"/"+objectKey(conformanceTopic, "does-not-exist"))
		if !errors.Is(err, payloadstore.ErrPayloadNotFound) {
			t.Fatalf("Download of a missing object: %v, want ErrPayloadNotFound", err)
		}
		var se *payloadstore.Error
		if !errors.As(err, &se) {
			t.Fatalf("error %T is not a *payloadstore.Error", err)
		}
		if se.Retryable || payloadstore.IsRetryable(err) {
			t.Errorf("not found is marked retryable: %v", err)
		}
		// A topic folder that does not exist is not found either.
		if _, err := s.Download(ctx, root+"/"+objectKey("no-such-topic", "x")); !errors.Is(err, payloadstore.ErrPayloadNotFound) {
			t.Fatalf("Download from a missing topic: %v, want ErrPayloadNotFound", err)
		}
	})

	t.Run("DeleteThenDownload", func(t *testing.T) {
		s := open(t)
		resp, err := payloadstore.PublishBytes(ctx, s, conformanceTopic, []byte("short-lived"))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(ctx, resp.FullPayloadPath); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		if _, err := s.Download(ctx, resp.FullPayloadPath); !errors.Is(err, payloadstore.ErrPayloadNotFound) {
			t.Fatalf("Download after Delete: %v, want ErrPayloadNotFound", err)
		}
		if err := s.Delete(ctx, resp.FullPayloadPath); err != nil {
			t.Fatalf("second Delete of the same object: %v, want nil", err)
		}
	})

	t.Run("DeleteMissing", func(t *testing.T) {
		s := open(t)
		root := rootOf(t, s)
		for _, p := range []string{root + "/" + objectKey(conformanceTopic, "never-written"), root + "/" + objectKey("no-such-topic", "x")} {
			if err := s.Delete(ctx, p); err != nil {
				t.Errorf("Delete(%q) of a missing object: %v, want nil", p, err)
			}
		}
	})

	t.Run("InvalidPaths", func(t *testing.T) {
		s := open(t)
		root := rootOf(t, s)
		// A real object next to the bad paths: an escape that worked would
		// find it.
		target := root + "/" + objectKey(conformanceTopic, "fixed-probe-id")
		if _, err := payloadstore.DownloadBytes(ctx, s, target); err != nil {
			t.Fatalf("probe object not readable: %v", err)
		}
		bad := []string{
			"",
			root,
			root + "/",
			"/etc/passwd",
			"file:///etc/passwd",
			"nope://bucket/" + conformanceTopic + "/fixed-probe-id",
			"mem://some-other-bucket/" + conformanceTopic + "/fixed-probe-id",
			root + "-evil/" + conformanceTopic + "/fixed-probe-id",
			root + "evil/" + conformanceTopic + "/fixed-probe-id",
			root + "/../x",
			root + "/" + conformanceTopic + "/../" + conformanceTopic + "/fixed-probe-id",
			root + "/./" + conformanceTopic + "/fixed-probe-id",
			root + "//" + conformanceTopic + "/fixed-probe-id",
			root + "/" + conformanceTopic + "//fixed-probe-id",
			root + "/" + conformanceTopic + "/fixed-probe-id/",
			root + "/" + conformanceTopic + "/%2e%2e/" + conformanceTopic + "/fixed-probe-id",
			root + "/" + conformanceTopic + "/fixed%2dprobe-id",
			root + "/" + conformanceTopic + "/fixed-probe-id?x=1",
			root + "/" + conformanceTopic + "/fixed-probe-id#frag",
			root + "/" + conformanceTopic + "\\fixed-probe-id",
			root + "/" + conformanceTopic + "/fixed-probe-id\x00",
			strings.ToUpper(root) + "/" + conformanceTopic + "/fixed-probe-id",
		}
		for _, p := range bad {
			rc, err := s.Download(ctx, p)
			if rc != nil {
				rc.Close()
			}
			if !errors.Is(err, payloadstore.ErrInvalidPath) {
				t.Errorf("Download(%q): %v, want ErrInvalidPath", p, err)
			}
			if err := s.Delete(ctx, p); !errors.Is(err, payloadstore.ErrInvalidPath) {
				t.Errorf("Delete(%q): %v, want ErrInvalidPath", p, err)
			}
		}
		// The probe survived every Delete above.
		if _, err := payloadstore.DownloadBytes(ctx, s, target); err != nil {
			t.Fatalf("probe object gone after invalid Deletes: %v", err)
		}
	})

	t.Run("InvalidTopics", func(t *testing.T) {
		s := open(t)
		for _, topic := range []string{"", ".", "..", "a/b", "../x", "a\\b", "a%2f", "a?b", "a#b", "a\x00"} {
			_, err := payloadstore.PublishBytes(ctx, s, topic, []byte("x"))
			if !errors.Is(err, payloadstore.ErrInvalidPath) {
				t.Errorf("Publish to topic %q: %v, want ErrInvalidPath", topic, err)
			}
		}
		for _, id := range []string{".", "..", "a/b", "a\\b", "%2e", "a?", "a#"} {
			p := payloadstore.BytesPayload([]byte("x"))
			p.ID = id
			if _, err := s.Publish(ctx, conformanceTopic, p); !errors.Is(err, payloadstore.ErrInvalidPath) {
				t.Errorf("Publish with id %q: %v, want ErrInvalidPath", id, err)
			}
		}
	})

	// Paths longer than any store accepts are refused before any I/O, as
	// ErrInvalidPath (never retryable), and the error quotes them shortened.
	t.Run("OverlongPaths", func(t *testing.T) {
		s := open(t)
		root := rootOf(t, s)
		long := strings.Repeat("x", 300)
		for _, p := range []string{
			root + "/" + objectKey(conformanceTopic, long),
			root + "/" + objectKey(long[:250], "id"),
			root + "/" + strings.Repeat("a/", 2500) + "x",
		} {
			rc, err := s.Download(ctx, p)
			if rc != nil {
				rc.Close()
			}
			if !errors.Is(err, payloadstore.ErrInvalidPath) || payloadstore.IsRetryable(err) {
				t.Errorf("Download of a %d-byte path: %v, want ErrInvalidPath, not retryable", len(p), err)
			}
			if err != nil && len(err.Error()) > 600 {
				t.Errorf("the error on a %d-byte path is %d bytes long: %.200s…", len(p), len(err.Error()), err)
			}
		}
		p := payloadstore.BytesPayload([]byte("x"))
		p.ID = long
		if _, err := s.Publish(ctx, conformanceTopic, p); !errors.Is(err, payloadstore.ErrInvalidPath) || payloadstore.IsRetryable(err) {
			t.Errorf("Publish with a 300-byte id: %v, want ErrInvalidPath, not retryable", err)
		}
	})

	// The key-level operations of ObjectStore (copy, touch, move, remove,
	// stat, list) that the reference rules and ferry gc use.
	t.Run("ObjectStore", func(t *testing.T) {
		s := open(t)
		ops, err := payloadstore.Objects(s)
		if err != nil {
			t.Fatal(err)
		}
		body := []byte("object-store ops")
		resp, err := payloadstore.PublishBytes(ctx, s, conformanceTopic, body)
		if err != nil {
			t.Fatal(err)
		}
		src, kp, err := ops.Root().KeyOf(resp.FullPayloadPath)
		if err != nil || kp.Topic != conformanceTopic {
			t.Fatalf("KeyOf(%q) = %q %+v, %v", resp.FullPayloadPath, src, kp, err)
		}
		before, err := ops.Stat(ctx, src)
		if err != nil || !sizeIs(s, before.Size, int64(len(body))) || before.Version == "" {
			t.Fatalf("Stat: %+v, %v", before, err)
		}
		time.Sleep(1100 * time.Millisecond) // cloud ModTimes have one-second steps
		if err := ops.Touch(ctx, src); err != nil {
			t.Fatalf("Touch: %v", err)
		}
		after, err := ops.Stat(ctx, src)
		if err != nil || !after.ModTime.After(before.ModTime) || after.Version == before.Version {
			t.Fatalf("after Touch: %+v (before %+v), %v", after, before, err)
		}
		if got, err := payloadstore.DownloadBytes(ctx, s, resp.FullPayloadPath); err != nil || !bytes.Equal(got, body) {
			t.Fatalf("after Touch the object reads %q, %v", got, err)
		}
		// CopyToTopic: another topic gets its own object; the same topic a touch.
		other := conformanceTopic + "-copy"
		copied, err := payloadstore.CopyToTopic(ctx, s, resp.FullPayloadPath, other)
		if err != nil {
			t.Fatalf("CopyToTopic: %v", err)
		}
		if _, ckp, err := ops.Root().KeyOf(copied); err != nil || ckp.Topic != other || ckp.ID == kp.ID {
			t.Fatalf("copy at %q (%+v), %v: want a fresh id under topic %s", copied, ckp, err, other)
		}
		if same, err := payloadstore.CopyToTopic(ctx, s, resp.FullPayloadPath, conformanceTopic); err != nil || same != resp.FullPayloadPath {
			t.Fatalf("CopyToTopic to its own topic = %q, %v; want the same path", same, err)
		}
		if err := s.Delete(ctx, resp.FullPayloadPath); err != nil {
			t.Fatal(err)
		}
		if got, err := payloadstore.DownloadBytes(ctx, s, copied); err != nil || !bytes.Equal(got, body) {
			t.Fatalf("the copy after the source was deleted reads %q, %v", got, err)
		}
		// Move into gc's folder: the topic's List no longer shows it;
		// ListKeys does; moving back restores it.
		copiedKey, _ := ops.Root().Key(copied)
		gcp, err := payloadstore.GCPrefix(other)
		if err != nil {
			t.Fatal(err)
		}
		q := gcp + "q/" + copiedKey
		if err := ops.Move(ctx, copiedKey, q); err != nil {
			t.Fatalf("Move: %v", err)
		}
		if _, err := ops.Stat(ctx, copiedKey); !errors.Is(err, payloadstore.ErrPayloadNotFound) {
			t.Fatalf("Stat after Move: %v, want ErrPayloadNotFound", err)
		}
		if err := payloadstore.List(ctx, s, other, func(o payloadstore.ObjectInfo) error {
			return fmt.Errorf("List shows %q, which lies in gc's folder", o.FullPath)
		}); err != nil {
			t.Fatal(err)
		}
		var keys []string
		if err := ops.ListKeys(ctx, gcp, func(k string, _ payloadstore.ObjectInfo) error { keys = append(keys, k); return nil }); err != nil || len(keys) != 1 || keys[0] != q {
			t.Fatalf("ListKeys(%q) = %v, %v; want [%s]", gcp, keys, err, q)
		}
		if err := ops.Move(ctx, q, copiedKey); err != nil {
			t.Fatal(err)
		}
		if got, err := payloadstore.DownloadBytes(ctx, s, copied); err != nil || !bytes.Equal(got, body) {
			t.Fatalf("moved back, the object reads %q, %v", got, err)
		}
		if err := ops.Remove(ctx, copiedKey); err != nil {
			t.Fatal(err)
		}
		if err := ops.Remove(ctx, copiedKey); err != nil {
			t.Fatalf("Remove of a missing object: %v", err)
		}
		if err := ops.Copy(ctx, copiedKey, q); !errors.Is(err, payloadstore.ErrPayloadNotFound) {
			t.Fatalf("Copy of a missing object: %v, want ErrPayloadNotFound", err)
		}
		// Put and Get: gc's own small objects.
		if err := ops.Put(ctx, gcp+"state.json", []byte(`{"a":1}`)); err != nil {
			t.Fatalf("Put: %v", err)
		}
		if err := ops.Put(ctx, gcp+"state.json", []byte(`{"a":2}`)); err != nil {
			t.Fatalf("Put again: %v", err)
		}
		if b, err := ops.Get(ctx, gcp+"state.json", 100); err != nil || string(b) != `{"a":2}` {
			t.Fatalf("Get = %q, %v", b, err)
		}
		if _, err := ops.Get(ctx, gcp+"state.json", 3); !errors.Is(err, payloadstore.ErrObjectTooLarge) {
			t.Fatalf("Get over its bound: %v, want ErrObjectTooLarge", err)
		}
		if _, err := ops.Get(ctx, gcp+"missing.json", 100); !errors.Is(err, payloadstore.ErrPayloadNotFound) {
			t.Fatalf("Get of a missing object: %v, want ErrPayloadNotFound", err)
		}
		for _, bad := range []string{"", "../x", "a//b", "/abs", strings.Repeat("y", 300)} {
			if err := ops.Touch(ctx, bad); !errors.Is(err, payloadstore.ErrInvalidPath) {
				t.Errorf("Touch(%q): %v, want ErrInvalidPath", bad, err)
			}
		}
	})

	t.Run("ContentID", func(t *testing.T) {
		s := open(t)
		publish := func(b []byte) string {
			p := payloadstore.BytesPayload(b)
			p.ID = payloadstore.IDSHA256{}.ID(p)
			resp, err := s.Publish(ctx, conformanceTopic, p)
			if err != nil {
				t.Fatal(err)
			}
			return resp.FullPayloadPath
		}
		a := randBytes(t, 4096)
		p1 := publish(a)
		p2 := publish(bytes.Clone(a))
		if p1 != p2 {
			t.Fatalf("same bytes, content id: paths %q and %q differ", p1, p2)
		}
		sum := sha256.Sum256(a)
		if !strings.HasSuffix(p1, "/"+objectKey(conformanceTopic, hex.EncodeToString(sum[:]))) {
			t.Fatalf("content-id path %q does not end in /<topic>/<shard>/<sha256 hex>", p1)
		}
		if p3 := publish(append(bytes.Clone(a), 0)); p3 == p1 {
			t.Fatalf("different bytes gave the same content-id path %q", p3)
		}
		got, err := payloadstore.DownloadBytes(ctx, s, p1)
		if err != nil || !bytes.Equal(got, a) {
			t.Fatalf("content-id object: %v", err)
		}
	})

	t.Run("ConcurrentPublish", func(t *testing.T) {
		s := open(t)
		const n = 16
		var wg sync.WaitGroup
		paths := make([]string, n)
		datas := make([][]byte, n)
		errs := make([]error, n)
		for i := range n {
			datas[i] = randBytes(t, 64<<10+i)
		}
		shared := randBytes(t, 32<<10) // every goroutine also publishes this under its content id
		sharedPaths := make([]string, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := payloadstore.PublishBytes(ctx, s, conformanceTopic, datas[i])
				if err != nil {
					errs[i] = err
					return
				}
				paths[i] = resp.FullPayloadPath
				p := payloadstore.BytesPayload(shared)
				p.ID = p.HexSHA256()
				resp, err = s.Publish(ctx, conformanceTopic, p)
				errs[i], sharedPaths[i] = err, resp.FullPayloadPath
			}()
		}
		wg.Wait()
		seen := map[string]bool{}
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("publisher %d: %v", i, errs[i])
			}
			if seen[paths[i]] {
				t.Fatalf("two publishes got the same path %q", paths[i])
			}
			seen[paths[i]] = true
			got, err := payloadstore.DownloadBytes(ctx, s, paths[i])
			if err != nil || !bytes.Equal(got, datas[i]) {
				t.Fatalf("publisher %d's object: %v (equal=%v)", i, err, bytes.Equal(got, datas[i]))
			}
			if sharedPaths[i] != sharedPaths[0] {
				t.Fatalf("content id paths differ: %q vs %q", sharedPaths[i], sharedPaths[0])
			}
		}
		got, err := payloadstore.DownloadBytes(ctx, s, sharedPaths[0])
		if err != nil || !bytes.Equal(got, shared) {
			t.Fatalf("shared object after concurrent overwrites: %v", err)
		}
	})

	// An Unhashed payload (StreamPayload) gets its digest from the store,
	// computed over what it wrote; a store that can (OnePass) reads the
	// body once.
	t.Run("StreamPayload", func(t *testing.T) {
		s := open(t)
		for _, size := range []int{0, 1, 3<<20 + 17} {
			t.Run(fmt.Sprint(size), func(t *testing.T) {
				b := randBytes(t, size)
				body := &countingBody{ReadSeeker: bytes.NewReader(b)}
				p := payloadstore.StreamPayload(body, int64(size))
				onePass := payloadstore.OnePass(s, p)
				resp, err := s.Publish(ctx, conformanceTopic, p)
				if err != nil {
					t.Fatalf("Publish: %v", err)
				}
				if want := sha256.Sum256(b); resp.SHA256 != want {
					t.Fatalf("the store returned SHA-256 %x, the bytes have %x", resp.SHA256, want)
				}
				if onePass && body.n != int64(size) {
					t.Fatalf("OnePass, yet the store read %d bytes of a %d-byte body", body.n, size)
				}
				got, err := payloadstore.DownloadBytes(ctx, s, resp.FullPayloadPath)
				if err != nil || !bytes.Equal(got, b) {
					t.Fatalf("Download: %d bytes (%v), want the %d published", len(got), err, size)
				}
			})
		}
		// A body that is not Size long leaves nothing behind.
		for name, size := range map[string]int64{"shorter": 11, "longer": 9} {
			t.Run(name, func(t *testing.T) {
				p := payloadstore.StreamPayload(bytes.NewReader([]byte("0123456789")), size)
				p.ID = "stream-" + name
				if _, err := s.Publish(ctx, conformanceTopic, p); !errors.Is(err, payloadstore.ErrPayloadChanged) {
					t.Fatalf("Publish of a body %s than Size: %v, want ErrPayloadChanged", name, err)
				}
				if _, err := s.Download(ctx, rootOf(t, s)+"/"+objectKey(conformanceTopic, p.ID)); !errors.Is(err, payloadstore.ErrPayloadNotFound) {
					t.Fatalf("an object exists after a failed publish: %v", err)
				}
			})
		}
	})

	t.Run("BodyShorterThanSize", func(t *testing.T) {
		s := open(t)
		p := payloadstore.BytesPayload([]byte("abc"))
		p.Size = 10
		p.ID = "short-body"
		if _, err := s.Publish(ctx, conformanceTopic, p); err == nil {
			t.Fatal("Publish of a body shorter than Size succeeded")
		}
		root := rootOf(t, s)
		if _, err := s.Download(ctx, root+"/"+objectKey(conformanceTopic, "short-body")); !errors.Is(err, payloadstore.ErrPayloadNotFound) {
			t.Fatalf("an object exists after a failed publish: %v", err)
		}
	})

	t.Run("BodyLongerThanSize", func(t *testing.T) {
		s := open(t)
		p := payloadstore.BytesPayload([]byte("abcdefghij"))
		p.Size = 3
		p.ID = "long-body"
		if _, err := s.Publish(ctx, conformanceTopic, p); err == nil {
			t.Fatal("Publish of a body longer than Size succeeded")
		}
		root := rootOf(t, s)
		if _, err := s.Download(ctx, root+"/"+objectKey(conformanceTopic, "long-body")); !errors.Is(err, payloadstore.ErrPayloadNotFound) {
			t.Fatalf("an object exists after a failed publish: %v", err)
		}
	})

	t.Run("CanceledContext", func(t *testing.T) {
		s := open(t)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		p := payloadstore.BytesPayload(randBytes(t, 1<<20))
		p.ID = "canceled"
		if _, err := s.Publish(cctx, conformanceTopic, p); !errors.Is(err, context.Canceled) {
			t.Fatalf("Publish with a canceled context: %v, want context.Canceled", err)
		}
		root := rootOf(t, s)
		if _, err := s.Download(ctx, root+"/"+objectKey(conformanceTopic, "canceled")); !errors.Is(err, payloadstore.ErrPayloadNotFound) {
			t.Fatalf("an object exists after a canceled publish: %v", err)
		}
	})

	t.Run("List", func(t *testing.T) {
		s := open(t)
		topic := "listed-" + uuid.NewString()[:8]
		before := time.Now().Add(-time.Minute)
		want := map[string]int64{}
		for i, size := range []int{0, 10, 70 << 10} {
			resp, err := payloadstore.PublishBytes(ctx, s, topic, randBytes(t, size))
			if err != nil {
				t.Fatalf("publish %d: %v", i, err)
			}
			want[resp.FullPayloadPath] = int64(size)
		}
		// Another topic whose name extends this one must not be listed.
		if _, err := payloadstore.PublishBytes(ctx, s, topic+"x", []byte("other")); err != nil {
			t.Fatal(err)
		}
		list := func() map[string]payloadstore.ObjectInfo {
			got := map[string]payloadstore.ObjectInfo{}
			err := payloadstore.List(ctx, s, topic, func(o payloadstore.ObjectInfo) error {
				got[o.FullPath] = o
				return nil
			})
			if err != nil {
				t.Fatalf("List: %v", err)
			}
			return got
		}
		got := list()
		if len(got) != len(want) {
			t.Fatalf("List gave %d objects %v, want %d", len(got), got, len(want))
		}
		for p, size := range want {
			o, ok := got[p]
			if !ok || !sizeIs(s, o.Size, size) {
				t.Fatalf("List: %q = %+v, want size %d", p, o, size)
			}
			if o.ModTime.Before(before) || o.ModTime.After(time.Now().Add(time.Minute)) {
				t.Fatalf("List: %q modified at %v, not about now", p, o.ModTime)
			}
		}
		for p := range want {
			if err := s.Delete(ctx, p); err != nil {
				t.Fatal(err)
			}
			break
		}
		if n := len(list()); n != len(want)-1 {
			t.Fatalf("after one delete List gave %d objects, want %d", n, len(want)-1)
		}
		stop := errors.New("stop")
		if err := payloadstore.List(ctx, s, topic, func(payloadstore.ObjectInfo) error { return stop }); err != stop {
			t.Fatalf("List returned %v, want the callback's own error", err)
		}
		if err := payloadstore.List(ctx, s, "no-such-topic-"+uuid.NewString()[:8], func(o payloadstore.ObjectInfo) error {
			return fmt.Errorf("unexpected object %q", o.FullPath)
		}); err != nil {
			t.Fatalf("List of an empty topic: %v", err)
		}
	})

	// Found by review: a content-id object may already be referenced by
	// other records. A second publish of the same content whose body
	// changes during the upload must fail without touching (overwriting or
	// deleting) the object that is already there.
	t.Run("ChangedBodyKeepsSharedContentObject", func(t *testing.T) {
		s := payloadstore.Wrap(open(t), payloadstore.Policy{Timeout: 60 * time.Second, CustomMetadataMaxBytes: 128})
		data := randBytes(t, 6<<20+7)
		p := payloadstore.BytesPayload(data)
		p.ID = p.HexSHA256()
		first, err := s.Publish(ctx, conformanceTopic, p)
		if err != nil {
			t.Fatal(err)
		}
		changed := bytes.Clone(data)
		changed[len(changed)-1] ^= 0xff
		p2 := p
		p2.Body = bytes.NewReader(changed) // same Size and SHA256, other bytes
		if _, err := s.Publish(ctx, conformanceTopic, p2); !errors.Is(err, payloadstore.ErrPayloadChanged) {
			t.Fatalf("publish of a changed body: %v, want ErrPayloadChanged", err)
		}
		got, err := payloadstore.DownloadBytes(ctx, s, first.FullPayloadPath)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("the shared content-id object after a failed publish: %d bytes, %v; want the original %d bytes", len(got), err, len(data))
		}
	})

	// A payload of several upload parts (cloud stores use 5 MiB parts in
	// these tests) streams from a reader that is not a byte slice.
	t.Run("MultiPartStream", func(t *testing.T) {
		s := open(t)
		const size = 12<<20 + 123
		f, err := os.CreateTemp(t.TempDir(), "payload")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := io.CopyN(f, rand.Reader, size); err != nil {
			t.Fatal(err)
		}
		p, err := payloadstore.FilePayload(f)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := s.Publish(ctx, conformanceTopic, p)
		if err != nil {
			t.Fatalf("Publish %d bytes: %v", size, err)
		}
		rc, err := s.Download(ctx, resp.FullPayloadPath)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		h := sha256.New()
		n, err := io.Copy(h, rc)
		if err != nil || n != size || !bytes.Equal(h.Sum(nil), p.SHA256[:]) {
			t.Fatalf("download: %d bytes, err %v, digest match %v; want %d bytes", n, err, bytes.Equal(h.Sum(nil), p.SHA256[:]), size)
		}
	})
}

// sizeIs reports whether an ObjectInfo size got is that of a payload of
// want bytes: equal, or for an encrypted store (whose objects are sealed)
// larger by the sealing's overhead, which is at least 100 bytes.
func sizeIs(s payloadstore.PayloadStore, got, want int64) bool {
	if payloadstore.IsEncrypted(s) {
		return got >= want+100
	}
	return got == want
}

var memSeq atomic.Int64

// openMem opens a fresh, uniquely named mem store through the registry.
func openMem(t *testing.T) payloadstore.PayloadStore {
	t.Helper()
	s, err := payloadstore.Open(context.Background(), fmt.Sprintf("mem://conformance-%d", memSeq.Add(1)), payloadstore.Options{})
	if err != nil {
		t.Fatalf("Open mem: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// openFile opens a file store on a fresh temporary directory through the
// registry.
func openFile(t *testing.T) payloadstore.PayloadStore {
	t.Helper()
	s, err := payloadstore.Open(context.Background(), "file://"+t.TempDir(), payloadstore.Options{})
	if err != nil {
		t.Fatalf("Open file: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// A file store whose directory does not exist and cannot be created (a
// file in its path), or, opened for reading, does not exist or is a file,
// is ErrInvalidConfig (the URL names no store, as a missing bucket's does),
// keeping the file system's error; an existing directory opens.
func TestFileStoreDirectoryErrors(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path     string
		readOnly bool
		cause    error
	}{
		{filepath.Join(file, "sub"), false, nil},
		{filepath.Join(dir, "missing"), true, fs.ErrNotExist},
		{file, true, nil},
	} {
		_, err := payloadstore.Open(ctx, "file://"+c.path, payloadstore.Options{ReadOnly: c.readOnly})
		var se *payloadstore.Error
		if !errors.Is(err, payloadstore.ErrInvalidConfig) || !errors.As(err, &se) || se.Op != "open" || se.Retryable ||
			(c.cause != nil && !errors.Is(err, c.cause)) {
			t.Errorf("Open %s (read-only %t): %v, want an open error wrapping ErrInvalidConfig", c.path, c.readOnly, err)
		}
	}
	for _, ro := range []bool{false, true} {
		s, err := payloadstore.Open(ctx, "file://"+dir, payloadstore.Options{ReadOnly: ro})
		if err != nil {
			t.Fatalf("Open an existing directory (read-only %t): %v", ro, err)
		}
		s.Close()
	}
}

func TestConformanceMem(t *testing.T)  { runConformance(t, openMem) }
func TestConformanceFile(t *testing.T) { runConformance(t, openFile) }

// The policy wrapper must not break the contract either.
func TestConformanceWrapped(t *testing.T) {
	p := payloadstore.Policy{Timeout: 30 * time.Second, RetryCount: 2, RetryBackoff: time.Millisecond, CustomMetadataMaxBytes: 128}
	t.Run("mem", func(t *testing.T) {
		runConformance(t, func(t *testing.T) payloadstore.PayloadStore { return payloadstore.Wrap(openMem(t), p) })
	})
	t.Run("file", func(t *testing.T) {
		runConformance(t, func(t *testing.T) payloadstore.PayloadStore { return payloadstore.Wrap(openFile(t), p) })
	})
}

// ---------------------------------------------------------------------------
// File store specifics.

// dirEntries lists every file below dir, relative to it.
func dirEntries(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestFileStoreLayoutAndNoTempFiles(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := payloadstore.NewFileStore(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := dirEntries(t, dir); len(got) != 0 {
		t.Fatalf("opening left files behind: %v", got)
	}
	if want := payloadstore.Root("file://" + filepath.ToSlash(dir)); s.Root() != want {
		t.Fatalf("Root() = %q, want %q", s.Root(), want)
	}
	b := randBytes(t, 100<<10)
	resp, err := payloadstore.PublishBytes(ctx, s, "orders", b)
	if err != nil {
		t.Fatal(err)
	}
	files := dirEntries(t, dir)
	if len(files) != 1 {
		t.Fatalf("after one publish the store holds %v, want exactly one object", files)
	}
	rest, ok := strings.CutPrefix(files[0], "orders/")
	if !ok {
		t.Fatalf("object %q is not in the topic folder", files[0])
	}
	shard, id, _ := strings.Cut(rest, "/")
	if want := objectKey("orders", id); files[0] != want {
		t.Fatalf("object %q is not in its shard folder: want %q", files[0], want)
	}
	if u, err := uuid.Parse(id); err != nil || u.Version() != 4 || u.String() != id {
		t.Fatalf("default object id %q is not a canonical UUID v4 (%v)", id, err)
	}
	if want := "file://" + filepath.ToSlash(dir) + "/orders/" + shard + "/" + id; resp.FullPayloadPath != want {
		t.Fatalf("full path %q, want %q", resp.FullPayloadPath, want)
	}
	onDisk, err := os.ReadFile(filepath.Join(dir, "orders", shard, id))
	if err != nil || !bytes.Equal(onDisk, b) {
		t.Fatalf("the file on disk differs from the payload: %v", err)
	}
}

// failingBody yields good bytes for n bytes, then fails.
type failingBody struct {
	r   *bytes.Reader
	n   int64
	off int64
	err error
}

func (f *failingBody) Read(p []byte) (int, error) {
	if f.off >= f.n {
		return 0, f.err
	}
	if rest := f.n - f.off; int64(len(p)) > rest {
		p = p[:rest]
	}
	k, err := f.r.Read(p)
	f.off += int64(k)
	return k, err
}

func (f *failingBody) Seek(off int64, whence int) (int64, error) {
	o, err := f.r.Seek(off, whence)
	f.off = o
	return o, err
}

func TestFileStoreFailedBodyLeavesNothing(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := payloadstore.NewFileStore(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	data := randBytes(t, 1<<20)
	boom := errors.New("disk on fire")
	p := payloadstore.Payload{
		Body:   &failingBody{r: bytes.NewReader(data), n: 300 << 10, err: boom},
		Size:   int64(len(data)),
		SHA256: sha256.Sum256(data),
		ID:     "would-be",
	}
	_, err = s.Publish(ctx, "orders", p)
	if !errors.Is(err, boom) {
		t.Fatalf("Publish with a failing body: %v, want the body's error", err)
	}
	var se *payloadstore.Error
	if !errors.As(err, &se) || se.Op != "publish" {
		t.Fatalf("error is not a publish *payloadstore.Error: %#v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "orders", "would-be")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("an object exists at the would-be path after a failed publish (stat: %v)", err)
	}
	if left := dirEntries(t, dir); len(left) != 0 {
		t.Fatalf("a failed publish left files behind: %v", left)
	}
	if _, err := s.Download(ctx, string(s.Root())+"/"+objectKey("orders", "would-be")); !errors.Is(err, payloadstore.ErrPayloadNotFound) {
		t.Fatalf("Download of the would-be path: %v, want ErrPayloadNotFound", err)
	}

	// A later publish of the same id, with a good body, works and leaves
	// exactly the object.
	p.Body = bytes.NewReader(data)
	if _, err := s.Publish(ctx, "orders", p); err != nil {
		t.Fatal(err)
	}
	if left := dirEntries(t, dir); len(left) != 1 || left[0] != objectKey("orders", "would-be") {
		t.Fatalf("after a good publish the store holds %v, want [%s]", left, objectKey("orders", "would-be"))
	}
}

// TestFileStoreTraversalDoesNotReadOutside plants files where an escaping
// path would land and checks that the store refuses them before opening.
func TestFileStoreTraversalDoesNotReadOutside(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	dir := filepath.Join(base, "store")
	s, err := payloadstore.NewFileStore(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte("secret outside the store")
	for _, p := range []string{filepath.Join(base, "x"), filepath.Join(base, "store-evil", "x"), filepath.Join(dir, "orders", "..", "..", "y")} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, secret, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	root := string(s.Root())
	for _, p := range []string{
		"file:///etc/passwd",
		root + "/../x",
		root + "/orders/../../y",
		root + "/orders/%2e%2e/%2e%2e/x",
		root + "-evil/x",
		"file://" + filepath.ToSlash(base) + "/x",
		"mem://other/x",
	} {
		rc, err := s.Download(ctx, p)
		if rc != nil {
			b, _ := io.ReadAll(rc)
			rc.Close()
			t.Errorf("Download(%q) opened something (%q)", p, b)
		}
		if !errors.Is(err, payloadstore.ErrInvalidPath) {
			t.Errorf("Download(%q): %v, want ErrInvalidPath", p, err)
		}
		if err := s.Delete(ctx, p); !errors.Is(err, payloadstore.ErrInvalidPath) {
			t.Errorf("Delete(%q): %v, want ErrInvalidPath", p, err)
		}
	}
	// Nothing outside was deleted.
	for _, p := range []string{filepath.Join(base, "x"), filepath.Join(base, "store-evil", "x"), filepath.Join(base, "y")} {
		if b, err := os.ReadFile(p); err != nil || !bytes.Equal(b, secret) {
			t.Errorf("%s was touched: %v", p, err)
		}
	}
}

// ---------------------------------------------------------------------------
// IDs.

func TestIDGenerators(t *testing.T) {
	b := []byte("the same bytes")
	p := payloadstore.BytesPayload(b)
	sum := sha256.Sum256(b)
	if got := (payloadstore.IDSHA256{}).ID(p); got != hex.EncodeToString(sum[:]) {
		t.Fatalf("IDSHA256 = %q, want the lowercase hex SHA-256", got)
	}
	if (payloadstore.IDSHA256{}).ID(payloadstore.BytesPayload(bytes.Clone(b))) != (payloadstore.IDSHA256{}).ID(p) {
		t.Fatal("IDSHA256 differs for equal bytes")
	}
	u1, u2 := (payloadstore.IDUUID{}).ID(p), (payloadstore.IDUUID{}).ID(p)
	if u1 == u2 {
		t.Fatal("IDUUID gave the same id twice")
	}
	for _, id := range []string{u1, u2} {
		if u, err := uuid.Parse(id); err != nil || u.Version() != 4 || u.String() != id {
			t.Fatalf("IDUUID %q is not a canonical UUID v4", id)
		}
	}
	for name, want := range map[string]payloadstore.IDGenerator{"": payloadstore.IDUUID{}, "uuid": payloadstore.IDUUID{}, "sha256": payloadstore.IDSHA256{}} {
		g, err := payloadstore.ParseIDGenerator(name)
		if err != nil || g != want {
			t.Errorf("ParseIDGenerator(%q) = %T, %v", name, g, err)
		}
	}
	if _, err := payloadstore.ParseIDGenerator("md5"); err == nil {
		t.Error("ParseIDGenerator(md5) succeeded")
	}
	f, err := os.CreateTemp(t.TempDir(), "payload")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Write(b)
	fp, err := payloadstore.FilePayload(f)
	if err != nil || fp.Size != int64(len(b)) || fp.SHA256 != sum {
		t.Fatalf("FilePayload: size %d sha %x, %v", fp.Size, fp.SHA256, err)
	}
}

func TestOpenWithSHA256Generator(t *testing.T) {
	ctx := context.Background()
	for _, u := range []string{"file://" + t.TempDir(), fmt.Sprintf("mem://sha-%d", memSeq.Add(1))} {
		t.Run(strings.SplitN(u, ":", 2)[0], func(t *testing.T) {
			s, err := payloadstore.Open(ctx, u, payloadstore.Options{IDGenerator: payloadstore.IDSHA256{}})
			if err != nil {
				t.Fatal(err)
			}
			b := randBytes(t, 10000)
			r1, err1 := payloadstore.PublishBytes(ctx, s, "t", b)
			r2, err2 := payloadstore.PublishBytes(ctx, s, "t", bytes.Clone(b))
			if err1 != nil || err2 != nil {
				t.Fatal(err1, err2)
			}
			if r1.FullPayloadPath != r2.FullPayloadPath {
				t.Fatalf("sha256 generator: same bytes, paths %q and %q", r1.FullPayloadPath, r2.FullPayloadPath)
			}
			// The default generator names each publish anew.
			d, err := payloadstore.Open(ctx, u, payloadstore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			r3, _ := payloadstore.PublishBytes(ctx, d, "t", b)
			r4, _ := payloadstore.PublishBytes(ctx, d, "t", b)
			if r3.FullPayloadPath == r4.FullPayloadPath {
				t.Fatalf("uuid generator: two publishes share path %q", r3.FullPayloadPath)
			}
		})
	}
}

// countingBody counts the bytes read from it.
type countingBody struct {
	io.ReadSeeker
	n int64
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.ReadSeeker.Read(p)
	c.n += int64(n)
	return n, err
}

// foreignStore hides what the stores of this package are: a store from
// outside it.
type foreignStore struct{ payloadstore.PayloadStore }

// Which stores publish an Unhashed payload in one pass, and what the others
// do with it: hash it first, so that its digest is right.
func TestOnePass(t *testing.T) {
	ctx := context.Background()
	uuidStore, err := payloadstore.Open(ctx, "file://"+t.TempDir(), payloadstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	shaStore, err := payloadstore.Open(ctx, "file://"+t.TempDir(), payloadstore.Options{IDGenerator: payloadstore.IDSHA256{}})
	if err != nil {
		t.Fatal(err)
	}
	p := payloadstore.StreamPayload(bytes.NewReader(nil), 0)
	withID := p
	withID.ID = "fixed"
	for _, c := range []struct {
		name string
		s    payloadstore.PayloadStore
		p    payloadstore.Payload
		want bool
	}{
		{"file, uuid", uuidStore, p, true},
		{"file, uuid, wrapped", payloadstore.Wrap(uuidStore, payloadstore.DefaultPolicy), p, true},
		{"mem, uuid", payloadstore.NewMemStore(fmt.Sprintf("onepass-%d", memSeq.Add(1)), nil), p, true},
		{"file, sha256 ids", shaStore, p, false},
		{"file, sha256 ids, id given", shaStore, withID, true},
		{"mem, sha256 ids", payloadstore.NewMemStore(fmt.Sprintf("onepass-%d", memSeq.Add(1)), payloadstore.IDSHA256{}), p, false},
		{"another package's store", foreignStore{uuidStore}, p, false},
		{"another package's store, wrapped", payloadstore.Wrap(foreignStore{uuidStore}, payloadstore.DefaultPolicy), p, false},
	} {
		if got := payloadstore.OnePass(c.s, c.p); got != c.want {
			t.Errorf("%s: OnePass = %v, want %v", c.name, got, c.want)
		}
	}

	// Content ids: the payload is hashed first, the object named by it.
	b := randBytes(t, 5<<20+3)
	sum := sha256.Sum256(b)
	for name, s := range map[string]payloadstore.PayloadStore{
		"direct":  shaStore,
		"wrapped": payloadstore.Wrap(shaStore, payloadstore.DefaultPolicy),
	} {
		body := &countingBody{ReadSeeker: bytes.NewReader(b)}
		resp, err := s.Publish(ctx, "t", payloadstore.StreamPayload(body, int64(len(b))))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !strings.HasSuffix(resp.FullPayloadPath, "/"+hex.EncodeToString(sum[:])) || resp.SHA256 != sum {
			t.Fatalf("%s: path %s, SHA-256 %x: want the content id %x", name, resp.FullPayloadPath, resp.SHA256, sum)
		}
		if body.n != 2*int64(len(b)) {
			t.Fatalf("%s: read %d bytes, want two passes of %d", name, body.n, len(b))
		}
	}

	// A store from outside the package, through Wrap: hashed first, and
	// what it read checked against that (a body that changes in between
	// fails).
	w := payloadstore.Wrap(foreignStore{uuidStore}, payloadstore.DefaultPolicy)
	resp, err := w.Publish(ctx, "t", payloadstore.StreamPayload(bytes.NewReader(b), int64(len(b))))
	if err != nil || resp.SHA256 != sum {
		t.Fatalf("foreign store through Wrap: SHA-256 %x, %v; want %x", resp.SHA256, err, sum)
	}
	if _, err := w.Publish(ctx, "t", payloadstore.StreamPayload(&changingBody{a: b, b: randBytes(t, len(b))}, int64(len(b)))); !errors.Is(err, payloadstore.ErrPayloadChanged) {
		t.Fatalf("foreign store through Wrap, body changed after hashing: %v, want ErrPayloadChanged", err)
	}
}

// changingBody yields a until its first seek back to the start after
// being read to the end, then b.
type changingBody struct {
	a, b []byte
	r    *bytes.Reader
}

func (c *changingBody) Read(p []byte) (int, error) {
	if c.r == nil {
		c.r = bytes.NewReader(c.a)
	}
	return c.r.Read(p)
}

func (c *changingBody) Seek(off int64, whence int) (int64, error) {
	if c.r != nil && c.r.Len() == 0 {
		c.r = bytes.NewReader(c.b)
	}
	if c.r == nil {
		c.r = bytes.NewReader(c.a)
	}
	return c.r.Seek(off, whence)
}

func TestMemStoresShareByName(t *testing.T) {
	ctx := context.Background()
	name := fmt.Sprintf("shared-%d", memSeq.Add(1))
	a := payloadstore.NewMemStore(name, nil)
	b := payloadstore.NewMemStore(name, nil)
	other := payloadstore.NewMemStore(name+"-other", nil)
	resp, err := payloadstore.PublishBytes(ctx, a, "t", []byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := payloadstore.DownloadBytes(ctx, b, resp.FullPayloadPath); err != nil || string(got) != "hello" {
		t.Fatalf("a second store of the same name cannot read: %q %v", got, err)
	}
	if _, err := other.Download(ctx, resp.FullPayloadPath); !errors.Is(err, payloadstore.ErrInvalidPath) {
		t.Fatalf("another bucket read the object: %v", err)
	}
}

// ---------------------------------------------------------------------------
// Retry policy (Wrap).

var errFlaky = errors.New("connection reset")

// stubStore is a PayloadStore whose operations are scripted.
type stubStore struct {
	mu        sync.Mutex
	calls     map[string]int
	ids       []string
	deleted   []string
	publish   func(n int) (payloadstore.PayloadResponse, error)
	download  func(n int) (io.ReadCloser, error)
	delete    func(n int) error
	onPublish func(ctx context.Context)
}

func (s *stubStore) count(op string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.calls == nil {
		s.calls = map[string]int{}
	}
	s.calls[op]++
	return s.calls[op]
}

func (s *stubStore) n(op string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[op]
}

func (s *stubStore) Publish(ctx context.Context, topic string, p payloadstore.Payload) (payloadstore.PayloadResponse, error) {
	n := s.count("publish")
	s.mu.Lock()
	s.ids = append(s.ids, p.ID)
	s.mu.Unlock()
	if s.onPublish != nil {
		s.onPublish(ctx)
	}
	return s.publish(n)
}

func (s *stubStore) Download(ctx context.Context, fullPath string) (io.ReadCloser, error) {
	return s.download(s.count("download"))
}

func (s *stubStore) Delete(ctx context.Context, fullPath string) error {
	n := s.count("delete")
	s.mu.Lock()
	s.deleted = append(s.deleted, fullPath)
	s.mu.Unlock()
	if s.delete == nil {
		return nil
	}
	return s.delete(n)
}

func (s *stubStore) ID(payloadstore.Payload) string { return uuid.NewString() }
func (s *stubStore) Class() string                  { return "stub" }
func (s *stubStore) Close() error                   { return nil }

func retryable(op string) error {
	return &payloadstore.Error{Op: op, Path: "stub://x", Retryable: true, Err: errFlaky}
}

func fastPolicy(retries int) payloadstore.Policy {
	return payloadstore.Policy{Timeout: 10 * time.Second, RetryCount: retries, RetryBackoff: time.Millisecond, RetryMaxBackoff: 2 * time.Millisecond, CustomMetadataMaxBytes: 128}
}

func TestRetrySucceedsOnThirdAttempt(t *testing.T) {
	ctx := context.Background()
	stub := &stubStore{
		publish: func(n int) (payloadstore.PayloadResponse, error) {
			if n < 3 {
				return payloadstore.PayloadResponse{}, retryable("publish")
			}
			return payloadstore.PayloadResponse{FullPayloadPath: "stub://x/t/ok"}, nil
		},
		download: func(n int) (io.ReadCloser, error) {
			if n < 3 {
				return nil, retryable("download")
			}
			return io.NopCloser(strings.NewReader("payload")), nil
		},
		delete: func(n int) error {
			if n < 3 {
				return retryable("delete")
			}
			return nil
		},
	}
	s := payloadstore.Wrap(stub, fastPolicy(3))
	resp, err := payloadstore.PublishBytes(ctx, s, "t", []byte("x"))
	if err != nil || resp.FullPayloadPath != "stub://x/t/ok" {
		t.Fatalf("Publish: %+v, %v", resp, err)
	}
	if got := stub.n("publish"); got != 3 {
		t.Fatalf("publish attempts = %d, want 3", got)
	}
	// Every attempt wrote the same object: the id is fixed once.
	if len(stub.ids) != 3 || stub.ids[0] == "" || stub.ids[0] != stub.ids[1] || stub.ids[1] != stub.ids[2] {
		t.Fatalf("ids per attempt = %q, want one non-empty id thrice", stub.ids)
	}
	b, err := payloadstore.DownloadBytes(ctx, s, "stub://x/t/ok")
	if err != nil || string(b) != "payload" || stub.n("download") != 3 {
		t.Fatalf("Download: %q, %v after %d attempts", b, err, stub.n("download"))
	}
	if err := s.Delete(ctx, "stub://x/t/ok"); err != nil || stub.n("delete") != 3 {
		t.Fatalf("Delete: %v after %d attempts", err, stub.n("delete"))
	}
}

func TestRetryKeepsCallerID(t *testing.T) {
	stub := &stubStore{publish: func(n int) (payloadstore.PayloadResponse, error) {
		if n < 2 {
			return payloadstore.PayloadResponse{}, retryable("publish")
		}
		return payloadstore.PayloadResponse{FullPayloadPath: "stub://x/t/k"}, nil
	}}
	p := payloadstore.BytesPayload([]byte("key"))
	p.ID = "content-id"
	if _, err := payloadstore.Wrap(stub, fastPolicy(3)).Publish(context.Background(), "t", p); err != nil {
		t.Fatal(err)
	}
	if len(stub.ids) != 2 || stub.ids[0] != "content-id" || stub.ids[1] != "content-id" {
		t.Fatalf("ids = %q, want the caller's id on every attempt", stub.ids)
	}
}

func TestRetryFatalErrorNotRetried(t *testing.T) {
	denied := &payloadstore.Error{Op: "publish", Path: "stub://x", Err: fs.ErrPermission}
	stub := &stubStore{
		publish: func(int) (payloadstore.PayloadResponse, error) { return payloadstore.PayloadResponse{}, denied },
		download: func(int) (io.ReadCloser, error) {
			return nil, &payloadstore.Error{Op: "download", Err: payloadstore.ErrPayloadNotFound}
		},
		delete: func(int) error { return errors.New("plain error, not an *Error: not retryable") },
	}
	s := payloadstore.Wrap(stub, fastPolicy(5))
	if _, err := payloadstore.PublishBytes(context.Background(), s, "t", []byte("x")); !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("Publish: %v, want the fatal cause", err)
	}
	if _, err := s.Download(context.Background(), "stub://x/t/y"); !errors.Is(err, payloadstore.ErrPayloadNotFound) {
		t.Fatalf("Download: %v", err)
	}
	if err := s.Delete(context.Background(), "stub://x/t/y"); err == nil {
		t.Fatal("Delete: nil error")
	}
	for _, op := range []string{"publish", "download", "delete"} {
		if n := stub.n(op); n != 1 {
			t.Errorf("%s was tried %d times after a fatal error, want 1", op, n)
		}
	}
}

func TestRetryCountExceeded(t *testing.T) {
	stub := &stubStore{publish: func(int) (payloadstore.PayloadResponse, error) {
		return payloadstore.PayloadResponse{}, retryable("publish")
	}}
	_, err := payloadstore.PublishBytes(context.Background(), payloadstore.Wrap(stub, fastPolicy(2)), "t", []byte("x"))
	if err == nil {
		t.Fatal("Publish succeeded against an always-failing store")
	}
	if stub.n("publish") != 3 {
		t.Fatalf("attempts = %d, want 1 + RetryCount(2) = 3", stub.n("publish"))
	}
	if !strings.Contains(err.Error(), "3 attempts") {
		t.Errorf("error %q does not say how many attempts were made", err)
	}
	if !errors.Is(err, errFlaky) || !payloadstore.IsRetryable(err) {
		t.Errorf("error %v lost its cause or retryability", err)
	}

	// RetryCount 0 tries once.
	stub0 := &stubStore{publish: stub.publish}
	payloadstore.PublishBytes(context.Background(), payloadstore.Wrap(stub0, fastPolicy(0)), "t", []byte("x"))
	if stub0.n("publish") != 1 {
		t.Fatalf("RetryCount 0: %d attempts, want 1", stub0.n("publish"))
	}
}

func TestRetryTimeoutBoundsTotalTime(t *testing.T) {
	stub := &stubStore{
		publish: func(int) (payloadstore.PayloadResponse, error) {
			return payloadstore.PayloadResponse{}, retryable("publish")
		},
		download: func(int) (io.ReadCloser, error) { return nil, retryable("download") },
	}
	p := payloadstore.Policy{Timeout: 300 * time.Millisecond, RetryCount: 1000, RetryBackoff: 100 * time.Millisecond, RetryMaxBackoff: 100 * time.Millisecond}
	s := payloadstore.Wrap(stub, p)

	start := time.Now()
	_, err := payloadstore.PublishBytes(context.Background(), s, "t", []byte("x"))
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Publish took %v with a 300ms timeout", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Publish: %v, want a context.DeadlineExceeded", err)
	}
	if !errors.Is(err, errFlaky) {
		t.Errorf("Publish: %v does not carry the last attempt's error", err)
	}

	start = time.Now()
	_, err = s.Download(context.Background(), "stub://x/t/y")
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Download took %v with a 300ms timeout", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Download: %v, want a context.DeadlineExceeded", err)
	}
}

func TestRetryTimeoutReachesStore(t *testing.T) {
	// The store sees a context bounded by Policy.Timeout.
	var deadline atomic.Bool
	stub := &stubStore{
		publish: func(int) (payloadstore.PayloadResponse, error) {
			return payloadstore.PayloadResponse{FullPayloadPath: "stub://x/t/y"}, nil
		},
		onPublish: func(ctx context.Context) {
			_, ok := ctx.Deadline()
			deadline.Store(ok)
		},
	}
	payloadstore.PublishBytes(context.Background(), payloadstore.Wrap(stub, fastPolicy(0)), "t", []byte("x"))
	if !deadline.Load() {
		t.Fatal("the store's context has no deadline under a Policy.Timeout")
	}
}

func TestRetryCallerCancel(t *testing.T) {
	stub := &stubStore{publish: func(int) (payloadstore.PayloadResponse, error) {
		return payloadstore.PayloadResponse{}, retryable("publish")
	}}
	p := payloadstore.Policy{Timeout: time.Minute, RetryCount: 1000, RetryBackoff: 50 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := payloadstore.PublishBytes(ctx, payloadstore.Wrap(stub, p), "t", []byte("x"))
		done <- err
	}()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("after cancel: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Publish kept retrying after the caller's context was canceled")
	}
}

func TestWrapCustomMetadataLimit(t *testing.T) {
	for _, n := range []int{0, 128, 129} {
		stub := &stubStore{publish: func(int) (payloadstore.PayloadResponse, error) {
			return payloadstore.PayloadResponse{FullPayloadPath: "stub://x/t/obj", CustomMetadata: bytes.Repeat([]byte{'m'}, n)}, nil
		}}
		resp, err := payloadstore.PublishBytes(context.Background(), payloadstore.Wrap(stub, fastPolicy(0)), "t", []byte("x"))
		if n <= 128 {
			if err != nil || len(resp.CustomMetadata) != n {
				t.Errorf("%d bytes of metadata: %v (got %d)", n, err, len(resp.CustomMetadata))
			}
			if len(stub.deleted) != 0 {
				t.Errorf("%d bytes of metadata: object deleted", n)
			}
			continue
		}
		if !errors.Is(err, payloadstore.ErrCustomMetadataTooLarge) {
			t.Fatalf("%d bytes of metadata: %v, want ErrCustomMetadataTooLarge", n, err)
		}
		if resp.FullPayloadPath != "" {
			t.Errorf("a failed publish returned path %q", resp.FullPayloadPath)
		}
		if len(stub.deleted) != 1 || stub.deleted[0] != "stub://x/t/obj" {
			t.Fatalf("uploaded object not deleted: deletes %q", stub.deleted)
		}
	}
}

func TestWrapUnwrap(t *testing.T) {
	base := payloadstore.NewMemStore(fmt.Sprintf("wrap-%d", memSeq.Add(1)), nil)
	w := payloadstore.Wrap(payloadstore.Wrap(base, fastPolicy(1)), fastPolicy(2))
	if payloadstore.Unwrap(w) != payloadstore.PayloadStore(base) {
		t.Fatal("Wrap(Wrap(s)) does not unwrap to s in one step")
	}
	if payloadstore.Unwrap(base) != payloadstore.PayloadStore(base) {
		t.Fatal("Unwrap of an unwrapped store is not the store")
	}
	if w.Class() != base.Class() {
		t.Fatal("Wrap changed the class")
	}
}

func TestErrorFormatting(t *testing.T) {
	e := &payloadstore.Error{Op: "download", Path: "file:///x/t/y", Retryable: true, Err: errFlaky}
	msg := e.Error()
	for _, want := range []string{"download", "file:///x/t/y", "connection reset", "retryable"} {
		if !strings.Contains(msg, want) {
			t.Errorf("Error() = %q lacks %q", msg, want)
		}
	}
	if !payloadstore.IsRetryable(fmt.Errorf("wrapped: %w", e)) {
		t.Error("IsRetryable does not look through wrapping")
	}
	e.Retryable = false
	if strings.Contains(e.Error(), "retryable") || payloadstore.IsRetryable(e) {
		t.Errorf("fatal error: %q", e.Error())
	}
	if payloadstore.IsRetryable(context.DeadlineExceeded) || payloadstore.IsRetryable(nil) {
		t.Error("a bare context error or nil is retryable")
	}
}

// ---------------------------------------------------------------------------
// Registry.

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	_, err := payloadstore.Open(ctx, "nope://x", payloadstore.Options{})
	if !errors.Is(err, payloadstore.ErrUnknownScheme) {
		t.Fatalf("Open(nope://x): %v, want ErrUnknownScheme", err)
	}
	for _, s := range []string{"file", "mem"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("unknown-scheme error %q does not list the known scheme %q", err, s)
		}
	}
	if _, err := payloadstore.Open(ctx, "://bad", payloadstore.Options{}); err == nil {
		t.Error("Open of an unparsable URL succeeded")
	}
	for _, u := range []string{"file://relative", "file://relative/dir", "file:relative", "file://host.example/abs"} {
		if _, err := payloadstore.Open(ctx, u, payloadstore.Options{}); err == nil {
			t.Errorf("Open(%q) succeeded; a file store needs file:///ABSOLUTE/DIR", u)
		}
	}
	if _, err := payloadstore.NewFileStore("relative/dir", nil); err == nil {
		t.Error("NewFileStore on a relative dir succeeded")
	}
	if _, err := payloadstore.Open(ctx, "mem://", payloadstore.Options{}); err == nil {
		t.Error("Open(mem://) without a bucket name succeeded")
	}
	// localhost is the same as no host.
	dir := t.TempDir()
	if s, err := payloadstore.Open(ctx, "file://localhost"+dir, payloadstore.Options{}); err != nil {
		t.Errorf("Open(file://localhost/DIR): %v", err)
	} else if s.Class() != payloadstore.FileStoreClass {
		t.Errorf("class %q", s.Class())
	}
}

func TestOpenFileStoreNotWritable(t *testing.T) {
	ctx := context.Background()
	tmp := t.TempDir()
	// A path under a regular file can be neither created nor written, even
	// by root, who ignores permission bits.
	file := filepath.Join(tmp, "file")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := payloadstore.Open(ctx, "file://"+filepath.Join(file, "sub"), payloadstore.Options{})
	var se *payloadstore.Error
	if err == nil || !errors.As(err, &se) || se.Op != "open" {
		t.Fatalf("Open under a regular file: %v, want an open *payloadstore.Error", err)
	}

	t.Run("read-only dir", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("running as root: permission bits do not stop root, so a read-only directory is writable")
		}
		ro := filepath.Join(tmp, "ro")
		if err := os.Mkdir(ro, 0o755); err != nil {
			t.Fatal(err)
		}
		// An object put there before the directory became read-only.
		w, err := payloadstore.NewFileStore(ro, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := payloadstore.PublishBytes(ctx, w, "t", []byte("old"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(ro, 0o555); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(ro, "t"), 0o555); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(filepath.Join(ro, "t"), 0o755); os.Chmod(ro, 0o755) })
		// Either opening fails, or (a consumer on a read-only mount) it
		// opens, reads, and fails every publish fatally.
		s, err := payloadstore.Open(ctx, "file://"+ro, payloadstore.Options{})
		if err != nil {
			return
		}
		if b, err := payloadstore.DownloadBytes(ctx, s, resp.FullPayloadPath); err != nil || string(b) != "old" {
			t.Fatalf("reading a read-only store: %q, %v", b, err)
		}
		_, err = payloadstore.PublishBytes(ctx, s, "t", []byte("new"))
		if err == nil {
			t.Fatal("Publish into a read-only directory succeeded")
		}
		if payloadstore.IsRetryable(err) {
			t.Errorf("Publish into a read-only directory is retryable: %v", err)
		}
	})
}

func TestRegistry(t *testing.T) {
	ctx := context.Background()
	schemes := payloadstore.Schemes()
	for i := 1; i < len(schemes); i++ {
		if schemes[i-1] >= schemes[i] {
			t.Fatalf("Schemes() not sorted: %q", schemes)
		}
	}
	for _, want := range []string{"file", "mem"} {
		found := false
		for _, s := range schemes {
			found = found || s == want
		}
		if !found {
			t.Errorf("Schemes() = %q lacks %q", schemes, want)
		}
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("registering the file scheme twice did not panic")
			}
		}()
		payloadstore.Register("file", nil)
	}()

	var gotOpts payloadstore.Options
	scheme := fmt.Sprintf("storetest%d", memSeq.Add(1)) // unique, so -count=N works
	payloadstore.Register(scheme, func(_ context.Context, u *url.URL, opts payloadstore.Options) (payloadstore.PayloadStore, error) {
		gotOpts = opts
		return payloadstore.NewMemStore("storetest-"+u.Host, opts.IDGenerator), nil
	})
	s, err := payloadstore.Open(ctx, scheme+"://abc", payloadstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := gotOpts.IDGenerator.(payloadstore.IDUUID); !ok {
		t.Errorf("Open passed IDGenerator %T, want the IDUUID default", gotOpts.IDGenerator)
	}
	if s.Class() != payloadstore.MemStoreClass {
		t.Errorf("custom opener's store not returned")
	}
}

func randBytes(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// objectKey is the documented layout (docs/FORMAT.md), written out again
// here so that a change to the store's code cannot silently move objects:
// "<topic>/<first byte of SHA-256(id) in hex>/<id>".
func objectKey(topic, id string) string {
	sum := sha256.Sum256([]byte(id))
	return topic + "/" + hex.EncodeToString(sum[:1]) + "/" + id
}

func TestIsContentID(t *testing.T) {
	sum := sha256.Sum256([]byte("x"))
	for path, want := range map[string]bool{
		"s3://b/p/orders/ab/" + hex.EncodeToString(sum[:]):                  true,
		"file:///d/orders/" + hex.EncodeToString(sum[:]):                    true,
		"s3://b/p/orders/ab/" + strings.ToUpper(hex.EncodeToString(sum[:])): false,
		"s3://b/p/orders/ab/" + uuid.NewString():                            false,
		"":                                                                  false,
	} {
		if got := payloadstore.IsContentID(path); got != want {
			t.Errorf("IsContentID(%q) = %v, want %v", path, got, want)
		}
	}
}

// A symbolic link inside a file store leads nowhere: not outside the store
// (a publish would land there, a download read there), and not from one
// topic's folder to another's (which would defeat the binding of references
// to their topic).
func TestFileStoreSymlinks(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	outside := t.TempDir()
	s, err := payloadstore.NewFileStore(filepath.Join(dir, "store"), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := payloadstore.PublishBytes(ctx, s, "a", []byte("topic a's payload"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "store", "a"), filepath.Join(dir, "store", "alias")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "store", "out")); err != nil {
		t.Fatal(err)
	}
	aliased := strings.Replace(resp.FullPayloadPath, "/a/", "/alias/", 1)
	if _, err := payloadstore.DownloadBytes(ctx, s, aliased); !errors.Is(err, payloadstore.ErrInvalidPath) {
		t.Fatalf("download through a topic alias: %v, want ErrInvalidPath", err)
	}
	if _, err := payloadstore.PublishBytes(ctx, s, "out", []byte("x")); !errors.Is(err, payloadstore.ErrInvalidPath) {
		t.Fatalf("publish into a folder linked outside the store: %v, want ErrInvalidPath", err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("the publish wrote %d entries outside the store", len(entries))
	}
	if got, err := payloadstore.DownloadBytes(ctx, s, resp.FullPayloadPath); err != nil || string(got) != "topic a's payload" {
		t.Fatalf("the real path: %q, %v", got, err)
	}
}
