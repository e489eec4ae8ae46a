package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/internal/faultproxy"
	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
	"github.com/ferrykit/ferry/proxy"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A 1,000,000,000-byte record (the largest librdkafka allows), published by
// `ferry produce` (the Go library's Serializer: it writes the payload's
// CRC-32C) to the real S3 server, consumed through a `ferry proxy` process
// with large-message on fetch by kcat and by franz-go, byte for byte: the
// proxy streams the payload from S3 to each client's socket, so its peak
// RSS stays within 128 MiB for one fetch and 256 MiB for four at once.
// FERRY_PROXY_STREAM_BYTES overrides the size.
func TestProxyStreamsOneGBRecord(t *testing.T) {
	b := brokers(t)
	raw := storetest.S3URL(t, "ferry-integration")
	kcat := kcatPath(t)
	size := int64(1_000_000_000)
	if v := os.Getenv("FERRY_PROXY_STREAM_BYTES"); v != "" {
		fmt.Sscan(v, &size)
	}
	topic := newTopic(t, nil)
	dir := t.TempDir()
	src := filepath.Join(dir, "payload.bin")
	want := randomFile(t, src, size, 4, 5, 6)
	bin := buildFerry(t)
	if _, out := runFerry(t, bin, append([]string{"produce", "--brokers", b, "--topic", topic, "--store", raw, src}, slowStoreArgs...)...); !strings.Contains(out, "offloaded") {
		t.Fatalf("produce output: %q", out)
	}
	os.Remove(src)
	ref := consumeRaw(t, topic, 1)[0]
	if _, ok := largemessage.PayloadCRC32C(ref); !ok || !largemessage.IsOffloaded(ref) {
		t.Fatalf("the reference record has no ferry.payload.crc32c header: %v", ref.Headers)
	}

	p := startFerryProxy(t, bin, fmt.Sprintf(`
upstream: %s
listen: 127.0.0.1:0
admin.listen: 127.0.0.1:0
interceptors:
  - name: large-message
    config:
      topic.pattern: %q
      side: fetch
      large.message.payload.store.url: %q
      large.message.payload.store.timeout.ms: 900000
      max.block.ms: 900000
      max.poll.interval.ms: 900000
`, b, topic, raw))
	idle := p.peakRSS(t)

	// kcat, through the proxy.
	if got, n := kcatValueDigest(t, kcat, p.bootstrap, topic); n != size || !bytes.Equal(got, want) {
		t.Fatalf("kcat read %d bytes (want %d), digest match %v", n, size, bytes.Equal(got, want))
	}
	peakKcat := p.peakRSS(t)

	// franz-go, through the proxy.
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.bootstrap), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxBytes(1<<30-1<<20), kgo.FetchMaxPartitionBytes(1<<30-1<<20), kgo.BrokerMaxReadBytes(1<<30))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	var rec *kgo.Record
	for rec == nil && ctx.Err() == nil {
		fs := cl.PollRecords(ctx, 1)
		for _, e := range fs.Errors() {
			t.Logf("franz-go fetch error (retried): %v", e.Err)
		}
		if rs := fs.Records(); len(rs) > 0 {
			rec = rs[0]
		}
	}
	cancel()
	cl.Close()
	if rec == nil {
		t.Fatal("franz-go got no record through the proxy")
	}
	sum := sha256.Sum256(rec.Value)
	if int64(len(rec.Value)) != size || !bytes.Equal(sum[:], want) || len(rec.Headers) != 1 || rec.Headers[0].Key != "ferry.file.name" {
		t.Fatalf("franz-go read %d bytes (want %d), digest match %v, headers %v", len(rec.Value), size, bytes.Equal(sum[:], want), rec.Headers)
	}
	rec = nil
	peakOne := p.peakRSS(t)
	t.Logf("%d-byte record through the proxy: proxy peak RSS %.1f MiB idle, %.1f MiB after kcat, %.1f MiB after franz-go",
		size, mib(idle), mib(peakKcat), mib(peakOne))
	if peakOne > streamOneRSSMax {
		t.Fatalf("proxy peak RSS %.1f MiB for one streamed fetch: over streamOneRSSMax", mib(peakOne))
	}

	// Four kcat consumers at once, of a second record of 200 MB: a
	// stream's memory does not grow with its record (so the bound is the
	// same as for 1 GB ones), and four 1 GB values would hold 4 GB in the
	// kcat processes. scripts/bench huge runs four 1 GB records.
	const size2 = 200_000_000
	src2 := filepath.Join(dir, "payload2.bin")
	want2 := randomFile(t, src2, size2, 7, 8, 9)
	if _, out := runFerry(t, bin, append([]string{"produce", "--brokers", b, "--topic", topic, "--store", raw, src2}, slowStoreArgs...)...); !strings.Contains(out, "offloaded") {
		t.Fatalf("produce output: %q", out)
	}
	os.Remove(src2)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if got, n := kcatValueDigestAt(t, kcat, p.bootstrap, topic, "1"); n != size2 || !bytes.Equal(got, want2) {
				errs <- fmt.Errorf("kcat read %d bytes (want %d), digest match %v", n, size2, bytes.Equal(got, want2))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	peakFour := p.peakRSS(t)
	t.Logf("four at once: proxy peak RSS %.1f MiB", mib(peakFour))
	if peakFour > 256<<20 {
		t.Fatalf("proxy peak RSS %.1f MiB for four streamed fetches at once: over 256 MiB", mib(peakFour))
	}
}

// randomFile writes size pseudo-random bytes (ChaCha8 from seed) to path
// and returns their SHA-256.
func randomFile(t *testing.T, path string, size int64, seed ...byte) []byte {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var key [32]byte
	copy(key[:], seed)
	h := sha256.New()
	if _, err := io.CopyN(io.MultiWriter(f, h), rand.NewChaCha8(key), size); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return h.Sum(nil)
}

// streamOneRSSMax bounds the proxy's peak RSS while it streams one 1 GB
// record: issue 19's goal, 128 MiB. Of the 61-76 MiB an idle proxy used to
// hold, most was its program's pages mapped by start-up; `ferry proxy`
// gives those back once it serves (about 35 MiB idle since), and a
// streamed S3 upload holds 20 MiB instead of 31, so one record measured
// 81-105 MiB in three runs on a loaded machine where it measured 107-119.
// A value held in memory (a gigabyte) fails the bound by far. scripts/bench huge reports the figure
// against the goal.
const streamOneRSSMax = 128 << 20

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// kcatValueDigest consumes the first record of topic with kcat and returns
// the SHA-256 and length of its value, read from kcat's output as it comes
// (not held).
func kcatValueDigest(t *testing.T, kcat, bootstrap, topic string) ([]byte, int64) {
	t.Helper()
	return kcatValueDigestAt(t, kcat, bootstrap, topic, "beginning")
}

// kcatValueDigestAt is kcatValueDigest from offset (kcat's -o).
func kcatValueDigestAt(t *testing.T, kcat, bootstrap, topic, offset string) ([]byte, int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kcat, "-C", "-b", bootstrap, "-t", topic, "-o", offset, "-c", "1", "-e", "-q", "-f", "%s",
		"-X", "fetch.message.max.bytes=1000000000", "-X", "fetch.max.bytes=1100000000",
		"-X", "receive.message.max.bytes=1200000000", "-X", "queued.max.messages.kbytes=2097151")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Error(err)
		return nil, 0
	}
	if err := cmd.Start(); err != nil {
		t.Error(err)
		return nil, 0
	}
	h := sha256.New()
	n, _ := io.Copy(h, out)
	if err := cmd.Wait(); err != nil {
		t.Errorf("kcat: %v\n%s", err, tail(errb.Bytes()))
	}
	return h.Sum(nil), n
}

// A store that fails mid-stream (S3 responses cut off after 64 KiB, through
// internal/faultproxy, more often than a download resumes) closes the
// consumer's connection before it has a whole batch, and the proxy keeps
// serving: once the store is back, the same consumer reads the record.
func TestProxyStreamStoreFailsMidStream(t *testing.T) {
	b := brokers(t)
	direct, via, fp := storetest.S3URLViaFaultProxy(t, "ferry-integration")
	topic := newTopic(t, nil)
	ctx := context.Background()
	value, _ := offloadedRecord(t, direct, topic, 24<<20, 7)
	s := startProxyServer(t, proxy.Config{Upstream: proxy.SplitList(b), Interceptors: []interceptor.Spec{{Name: "large-message",
		Config: map[string]string{"topic.pattern": topic, "side": "fetch", largemessage.KeyStoreURL: via}}}})
	fp.SetCutAfter(64 << 10)
	fp.Set(faultproxy.CutBody, -1)
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxBytes(64<<20), kgo.FetchMaxPartitionBytes(64<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pctx, cancel := context.WithTimeout(ctx, 8*time.Second)
	fs := cl.PollFetches(pctx)
	cancel()
	if n := len(fs.Records()); n != 0 {
		t.Fatalf("the consumer got %d records while the store was cutting responses", n)
	}
	if fp.Count(faultproxy.CutBody) == 0 {
		t.Fatal("no download reached the store while it was cutting responses")
	}
	fp.Set(faultproxy.Pass, -1)
	pctx, cancel = context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var got []*kgo.Record
	for len(got) == 0 && pctx.Err() == nil {
		got = append(got, cl.PollFetches(pctx).Records()...)
	}
	if len(got) != 1 || !bytes.Equal(got[0].Value, value) {
		t.Fatalf("after the store came back: %d records", len(got))
	}
}

// A streamed value whose object was changed in the store: the first fetch
// through the proxy is cut mid-stream (the response was committed before
// the payload failed its SHA-256), and the client's next fetch is answered
// CORRUPT_MESSAGE before anything is written, so the consumer has an error
// to show (ferry consume exits 1 naming the offset; Kafka's Java console
// consumer stops with "Encountered corrupt message"), where it fetched the
// record again and again, cut each time, without a word.
func TestProxyStreamCorruptPayloadSurfaces(t *testing.T) {
	kafkaToolsCP(t)
	b := brokers(t)
	storeURL := "file://" + t.TempDir()
	topic := newTopic(t, nil)
	_, rec := offloadedRecord(t, storeURL, topic, 6<<20, 9)
	ref, err := largemessage.DecodeReference(rec.Value)
	if err != nil {
		t.Fatal(err)
	}
	f := strings.TrimPrefix(ref.FullPayloadPath, "file://")
	stored, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	stored[len(stored)-10] ^= 1 // past the first chunks: the response is committed by then
	if err := os.WriteFile(f, stored, 0o644); err != nil {
		t.Fatal(err)
	}
	s := startProxyServer(t, proxy.Config{Upstream: proxy.SplitList(b), Interceptors: []interceptor.Spec{{Name: "large-message",
		Config: map[string]string{"topic.pattern": topic, "side": "fetch", largemessage.KeyStoreURL: storeURL,
			interceptor.KeyStreamThreshold: "1048576"}}}})

	code, stdout, stderr := runCLI(t, "consume", "--brokers", s.Addr(), "-t", topic, "-n", "1", "--timeout", "30s")
	if code != 1 || stdout != "" || !strings.Contains(stderr, "partition 0") || !strings.Contains(stderr, "CORRUPT_MESSAGE") {
		t.Fatalf("ferry consume through the proxy: exit %d, %d bytes out, stderr %q; want exit 1 and CORRUPT_MESSAGE", code, len(stdout), stderr)
	}
	a := append([]string{"--bootstrap-server", s.Addr(), "--topic", topic, "--from-beginning", "--max-messages", "1", "--timeout-ms", "30000",
		"--command-property", "fetch.max.bytes=67108864", "--command-property", "max.partition.fetch.bytes=67108864"}, javaConsumerArgs...)
	out, errOut, _ := runClientErr(nil, "java", javaArgs(t, javaConsoleConsumer, a...)...)
	if len(out) != 0 || !bytes.Contains(errOut, []byte("Encountered corrupt message when fetching offset 0")) {
		t.Fatalf("console consumer: stdout %q, stderr:\n%s", out, tail(errOut))
	}
}

// offloadedRecord offloads size random bytes (from seed) of topic to the
// store at storeURL as the library's Serializer does, produces the record
// (its reference) straight to the broker, and returns the value and the
// record produced.
func offloadedRecord(t *testing.T, storeURL, topic string, size int, seed byte) ([]byte, *kgo.Record) {
	t.Helper()
	ctx := context.Background()
	store, err := payloadstore.Open(ctx, storeURL, payloadstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	value := make([]byte, size)
	if _, err := io.ReadFull(rand.NewChaCha8([32]byte{seed}), value); err != nil {
		t.Fatal(err)
	}
	rec := &kgo.Record{Topic: topic, Value: bytes.Clone(value)}
	if _, err := largemessage.NewSerializer(store, largemessage.Codec{Type: "none"}).Offload(ctx, rec, largemessage.DeriveLimits(0, 1<<20, 0)); err != nil {
		t.Fatal(err)
	}
	if err := client(t).ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return value, rec
}
