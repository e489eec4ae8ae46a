package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/internal/faultproxy"
	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
)

// s3Setup is setup() with an S3 store on the real S3 server, reached through
// a fault proxy, plus a direct handle on the same prefix for checks.
func s3Setup(t *testing.T) (e *env, direct payloadstore.PayloadStore, fp *faultproxy.Proxy) {
	t.Helper()
	brokers(t)
	raw, via, fp := storetest.S3URLViaFaultProxy(t, "ferry-integration")

	cfg := largemessage.DefaultConfig()
	cfg.StoreURL = via
	cfg.Policy.Timeout = 20 * time.Second
	cfg.Policy.RetryBackoff = 10 * time.Millisecond
	cfg.Policy.RetryMaxBackoff = 100 * time.Millisecond
	e = envWith(t, cfg)
	direct, err := payloadstore.Open(context.Background(), raw, payloadstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close() })
	return e, direct, fp
}

func endOffset(t *testing.T, topic string) int64 {
	t.Helper()
	offs, err := kadm.NewClient(client(t)).ListEndOffsets(ctxT(t, 30*time.Second), topic)
	if err != nil {
		t.Fatal(err)
	}
	o, _ := offs.Lookup(topic, 0)
	return o.Offset
}

func objectsUnder(t *testing.T, s payloadstore.PayloadStore, topic string) []string {
	t.Helper()
	var out []string
	if err := payloadstore.List(context.Background(), s, topic, func(o payloadstore.ObjectInfo) error {
		out = append(out, o.FullPath)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// The S3 server is down, or slow past the store timeout, while a large
// record is produced: the producer gets a store error after bounded retries,
// no record is appended, and no object is left. Once the server is back the
// same produce works and the record resolves.
func TestS3OutageDuringProduceAppendsNothing(t *testing.T) {
	e, direct, fp := s3Setup(t)
	topic := newTopic(t, nil)
	value := randomBytes(31, 6<<20)

	for _, fault := range []struct {
		name string
		set  func()
	}{
		{"down", func() { fp.Set(faultproxy.Down, -1) }},
		{"slow", func() { fp.SetDelay(time.Hour); fp.Set(faultproxy.Slow, -1) }},
	} {
		fault.set()
		res := e.prod.ProduceSync(ctxT(t, 2*time.Minute), &kgo.Record{Topic: topic, Value: value})
		err := res.FirstErr()
		var se *payloadstore.Error
		if !errors.As(err, &se) || se.Op != "publish" {
			t.Fatalf("%s: produce error = %v, want a payload store publish error", fault.name, err)
		}
		if off := endOffset(t, topic); off != 0 {
			t.Fatalf("%s: end offset %d: a record was appended although its payload was not stored", fault.name, off)
		}
		fp.Set(faultproxy.Pass, -1)
		if left := objectsUnder(t, direct, topic); len(left) != 0 {
			t.Fatalf("%s: objects left after the failed produce: %v", fault.name, left)
		}
		t.Logf("%s: %v", fault.name, err)
	}

	produceOK(t, e, &kgo.Record{Topic: topic, Value: value})
	recs := consumeRaw(t, topic, 1)
	de := largemessage.NewDeserializer(direct, false)
	err := de.Resolve(ctxT(t, time.Minute), recs[0])
	if err != nil || !bytes.Equal(recs[0].Value, value) {
		t.Fatalf("resolve after the server came back: %v", err)
	}
}

// buildFerry compiles the ferry command once per test binary run.
func buildFerry(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ferry")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/ferrykit/ferry/cmd/ferry")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// runFerry runs the ferry binary and returns its peak resident memory in
// bytes: the largest VmHWM read from /proc/PID/status while it runs. (The
// rusage of wait4 would not do: Linux carries the parent's high-water mark
// into a child across exec, so it reports the test binary's own peak.)
func runFerry(t *testing.T, bin string, args ...string) (maxRSS int64, stdout string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	peak := make(chan int64)
	go func() {
		var max int64
		status := fmt.Sprintf("/proc/%d/status", cmd.Process.Pid)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			if b, err := os.ReadFile(status); err == nil {
				for _, line := range strings.Split(string(b), "\n") {
					var kib int64
					if _, err := fmt.Sscanf(line, "VmHWM: %d kB", &kib); err == nil && kib*1024 > max {
						max = kib * 1024
					}
				}
			}
			select {
			case <-done:
				peak <- max
				return
			case <-tick.C:
			}
		}
	}()
	err := cmd.Wait()
	close(done)
	maxRSS = <-peak
	if err != nil {
		t.Fatalf("ferry %s: %v\n%s", args[0], err, errb.String())
	}
	if maxRSS == 0 {
		t.Fatal("could not read the command's VmHWM from /proc")
	}
	return maxRSS, out.String()
}

// slowStoreArgs let one store operation on a 1 GiB payload take up to 15
// minutes: large.message.payload.store.timeout.ms (default 60 s) bounds a
// whole upload, retries included, and on a busy test machine the local S3
// server took longer than that (the upload failed after 160 s). The tests
// that use them measure memory and bytes, not speed.
var slowStoreArgs = []string{"-X", largemessage.KeyStoreTimeout + "=900000",
	"-X", largemessage.KeyMaxBlock + "=900000", "-X", largemessage.KeyMaxPollInterval + "=900000"}

// `ferry produce` then `ferry consume` move a 1 GiB file through the real
// broker (default limits) and the real S3 server with identical bytes, each
// command streaming: its peak memory stays far below the payload's size.
// FERRY_CLI_S3_BYTES overrides the size.
func TestCLIProduceConsumeS3OneGiB(t *testing.T) {
	b := brokers(t)
	raw := storetest.S3URL(t, "ferry-integration")
	size := int64(1 << 30)
	if v := os.Getenv("FERRY_CLI_S3_BYTES"); v != "" {
		fmt.Sscan(v, &size)
	}
	topic := newTopic(t, nil)
	dir := t.TempDir()
	src := filepath.Join(dir, "payload.bin")
	want := randomFile(t, src, size, 1, 2, 3)
	bin := buildFerry(t)

	rssProduce, out := runFerry(t, bin, append([]string{"produce", "--brokers", b, "--topic", topic, "--store", raw, src}, slowStoreArgs...)...)
	if !strings.Contains(out, "offloaded") {
		t.Fatalf("produce output: %q", out)
	}
	recs := consumeRaw(t, topic, 1)
	if len(recs[0].Value) > 1024 || !largemessage.IsOffloaded(recs[0]) {
		t.Fatalf("kafka holds a %d-byte value, want only the reference", len(recs[0].Value))
	}
	outDir := filepath.Join(dir, "out")
	rssConsume, _ := runFerry(t, bin, append([]string{"consume", "--brokers", b, "--topic", topic, "--store", raw, "--out", outDir, "-n", "1"}, slowStoreArgs...)...)
	os.Remove(src)

	g, err := os.Open(filepath.Join(outDir, filepath.Base(src))) // named after the file produce sent (ferry.file.name)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	h := sha256.New()
	n, err := io.Copy(h, g)
	if err != nil || n != size || !bytes.Equal(h.Sum(nil), want) {
		t.Fatalf("consumed %d bytes (want %d), digest match %v, %v", n, size, bytes.Equal(h.Sum(nil), want), err)
	}
	t.Logf("%d bytes through S3: ferry produce peak RSS %.1f MiB, ferry consume peak RSS %.1f MiB",
		size, float64(rssProduce)/(1<<20), float64(rssConsume)/(1<<20))
	// Streaming: 4 parts of 8 MiB in flight plus the process itself. A
	// command that held the payload would need at least its size.
	const limit = 256 << 20
	if rssProduce > limit || rssConsume > limit {
		t.Fatalf("peak RSS produce %d, consume %d bytes: over %d, the payload is being held in memory", rssProduce, rssConsume, limit)
	}
}
