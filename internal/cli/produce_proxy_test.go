package cli

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/proxy"
)

// ferry produce through a proxy running large-message (docs/INTERCEPTORS.md,
// "Client settings for large records through the proxy"): with the proxy's
// store the CLI offloads a record over max.message.bytes itself and the
// proxy passes the reference on, read back whole through the proxy; with
// another store the reference is refused (INVALID_RECORD) and its payload
// deleted; with none the record is refused before it is sent, naming
// --store.
func TestCLIProduceThroughProxy(t *testing.T) {
	dir := t.TempDir()
	store, other := filepath.Join(dir, "store"), filepath.Join(dir, "other")
	for _, d := range []string{store, other} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s := proxyOverKfake(t, interceptor.Spec{
		Name: "large-message", Config: map[string]string{largemessage.KeyStoreURL: "file://" + store, "topic.pattern": ".*"}})
	p, sum := randomFile(t, dir, "big.bin", 3<<20, 9)

	r := run(t, nil, "produce", "--brokers", s.Addr(), "--topic", "t", p)
	if r.code == 0 || !strings.Contains(r.stderr, "--store URL") {
		t.Fatalf("without a store: exit %d, want a refusal naming --store:\n%s", r.code, r.stderr)
	}
	r = run(t, nil, "produce", "--brokers", s.Addr(), "--topic", "t", "--store", other, p)
	if r.code == 0 || !strings.Contains(r.stderr, "INVALID_RECORD") || !strings.Contains(r.stderr, "was deleted") {
		t.Fatalf("with another store: exit %d, want INVALID_RECORD and the payload deleted:\n%s", r.code, r.stderr)
	}
	if n := countFiles(t, other); n != 0 {
		t.Fatalf("%d objects left in the other store", n)
	}
	if r = run(t, nil, "produce", "--brokers", s.Addr(), "--topic", "t", "--store", store, p); r.code != 0 {
		t.Fatalf("with the proxy's store: exit %d\n%s", r.code, r.stderr)
	}
	out := filepath.Join(dir, "out")
	if r = run(t, nil, "consume", "--brokers", s.Addr(), "--topic", "t", "--out", out, "-n", "1"); r.code != 0 {
		t.Fatalf("consume through the proxy: exit %d\n%s", r.code, r.stderr)
	}
	if fileSHA(t, filepath.Join(out, "big.bin")) != sum {
		t.Fatal("the record read back through the proxy differs from the file")
	}
}

// proxyOverKfake starts kfake (one broker, topic t, the default
// message.max.bytes) and a proxy in front of it running specs; both stop
// with the test.
func proxyOverKfake(t *testing.T, specs ...interceptor.Spec) *proxy.Server {
	t.Helper()
	c, _ := cluster(t)
	s, err := proxy.New(proxy.Config{Upstream: c.ListenAddrs(), Listen: "127.0.0.1:0", Interceptors: specs})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s
}

// countFiles is the number of regular files under dir.
func countFiles(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n++
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// ferry produce --store through a proxy running [encrypt, large-message]:
// the CLI's own offload would have its reference sealed by encrypt, which
// large-message can then neither check nor resolve, and the payload would
// sit in the store unsealed. The record is refused (INVALID_RECORD, naming
// why), the CLI deletes its payload, and nothing is appended. (Found by a
// new-user helper: the header was dropped as stale and the 5 MB file read
// back as its 100-byte sealed reference, exit 0.)
func TestCLIProduceThroughEncryptingProxy(t *testing.T) {
	dir := t.TempDir()
	store := filepath.Join(dir, "store")
	if err := os.Mkdir(store, 0o755); err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(i * 7)
	}
	s := proxyOverKfake(t,
		interceptor.Spec{Name: "encrypt", Config: map[string]string{interceptor.KeyEncryptKeyURL: "base64key://" + base64.URLEncoding.EncodeToString(key), "topic.pattern": ".*"}},
		interceptor.Spec{Name: "large-message", Config: map[string]string{largemessage.KeyStoreURL: "file://" + store, "topic.pattern": ".*"}})
	p, _ := randomFile(t, dir, "big.bin", 3<<20, 11)
	r := run(t, nil, "produce", "--brokers", s.Addr(), "--topic", "t", "--store", store, p)
	// The reason (the partition's error message) is in the proxy's log:
	// franz-go hands the producer the code alone.
	if r.code == 0 || !strings.Contains(r.stderr, "INVALID_RECORD") || !strings.Contains(r.stderr, "was deleted") {
		t.Fatalf("exit %d, want INVALID_RECORD and the payload deleted:\n%s", r.code, r.stderr)
	}
	if n := countFiles(t, store); n != 0 {
		t.Fatalf("%d objects left in the store", n)
	}
	small := filepath.Join(dir, "small.txt")
	if err := os.WriteFile(small, []byte("fits inline"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r = run(t, nil, "produce", "--brokers", s.Addr(), "--topic", "t", "--store", store, small); r.code != 0 {
		t.Fatalf("a small record through the same proxy: exit %d\n%s", r.code, r.stderr)
	}
	out := filepath.Join(dir, "out")
	if r = run(t, nil, "consume", "--brokers", s.Addr(), "--topic", "t", "--out", out, "-n", "1"); r.code != 0 {
		t.Fatalf("consume through the proxy: exit %d\n%s", r.code, r.stderr)
	}
	if got, err := os.ReadFile(filepath.Join(out, "small.txt")); err != nil || string(got) != "fits inline" {
		t.Fatalf("read back %q, %v: the refused record must not have been appended before it", got, err)
	}
}

// ferry produce gives up on a record the brokers keep refusing with a
// retriable error after delivery.timeout.ms (the Java producer's key and
// default), naming the key, instead of retrying in silence for ever: here a proxy whose encrypt KMS cannot be reached answers
// KAFKA_STORAGE_ERROR. (Found by a new-user helper: 11.5 minutes without
// a word.)
func TestCLIProduceDeliveryTimeout(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	s := proxyOverKfake(t, interceptor.Spec{Name: "encrypt", Config: map[string]string{"topic.pattern": ".*",
		interceptor.KeyEncryptKeyURL: "awskms://alias/ferry-down?region=us-east-1&endpoint=http%3A%2F%2F127.0.0.1%3A1"}})
	dir := t.TempDir()
	p := filepath.Join(dir, "v.txt")
	if err := os.WriteFile(p, []byte("needs a data key"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := run(t, nil, "produce", "--brokers", s.Addr(), "--topic", "t", "-X", "delivery.timeout.ms=1500", p)
	if r.code == 0 || !strings.Contains(r.stderr, "timed out") || !strings.Contains(r.stderr, "delivery.timeout.ms=1500") {
		t.Fatalf("exit %d, want a delivery timeout naming delivery.timeout.ms:\n%s", r.code, r.stderr)
	}
	if r = run(t, nil, "produce", "--brokers", s.Addr(), "--topic", "t", "-X", "delivery.timeout.ms=soon", p); r.code != 2 ||
		!strings.Contains(r.stderr, "delivery.timeout.ms") {
		t.Fatalf("a bad delivery.timeout.ms: exit %d, want 2 naming the key:\n%s", r.code, r.stderr)
	}
}

// ferry consume through a proxy running large-message: the proxy resolves
// the reference and removes Ferry's headers, so the record reaches the CLI
// as a value and its line says "inline" although its payload came from the
// store. Nothing on the record tells the two apart, so consume --help says
// what "inline" means: arrived as a value, which includes a record a proxy
// resolved. (A new user read "inline" as "never in the store".)
func TestCLIConsumeThroughProxySaysInline(t *testing.T) {
	dir := t.TempDir()
	store := filepath.Join(dir, "store")
	if err := os.Mkdir(store, 0o755); err != nil {
		t.Fatal(err)
	}
	s := proxyOverKfake(t, interceptor.Spec{
		Name: "large-message", Config: map[string]string{largemessage.KeyStoreURL: "file://" + store, "topic.pattern": ".*"}})
	p, sum := randomFile(t, dir, "big.bin", 3<<20, 11)
	if r := run(t, nil, "produce", "--brokers", s.Addr(), "--topic", "t", "--store", store, p); r.code != 0 ||
		!strings.Contains(r.stdout, "bytes offloaded") {
		t.Fatalf("produce: exit %d, want the record offloaded\n%s%s", r.code, r.stdout, r.stderr)
	}
	out := filepath.Join(dir, "out")
	r := run(t, nil, "consume", "--brokers", s.Addr(), "--topic", "t", "--out", out, "-n", "1")
	want := fmt.Sprintf("t/0@0 %d bytes inline key=%q -> %s\n", 3<<20, "big.bin", filepath.Join(out, "big.bin"))
	if r.code != 0 || r.stdout != want {
		t.Fatalf("consume through the proxy: exit %d, stdout %q, want %q\n%s", r.code, r.stdout, want, r.stderr)
	}
	if fileSHA(t, filepath.Join(out, "big.bin")) != sum {
		t.Fatal("the record read back through the proxy differs from the file")
	}
	h := run(t, nil, "consume", "--help")
	help := strings.Join(strings.Fields(h.stdout), " ")
	for _, w := range []string{
		`"inline": the record arrived carrying its value`,
		"Through a ferry proxy running the large-message interceptor, every record arrives inline",
		"ferry cannot tell it from a value kept in Kafka",
	} {
		if h.code != 0 || !strings.Contains(help, w) {
			t.Errorf("consume --help does not say %q (what an inline line means through a proxy):\n%s", w, h.stdout)
		}
	}
}
