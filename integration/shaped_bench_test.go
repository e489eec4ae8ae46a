package integration

// scripts/bench shaped: a 1 GiB payload read from the real S3 server
// through internal/shaper (about one real S3 GET stream per connection),
// with one GET and with concurrent ranged GETs.

import (
	"io"
	"net/url"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/largemessage"
)

// TestShapedSetup (only when FERRY_BENCH_SHAPED_SETUP names a file) makes
// the benchmark's bucket and writes two store URLs of one fresh prefix into
// that file, one a line: straight to the S3 server, and through the shaper
// at FERRY_BENCH_SHAPED_VIA (HOST:PORT).
func TestShapedSetup(t *testing.T) {
	out := os.Getenv("FERRY_BENCH_SHAPED_SETUP")
	if out == "" {
		t.Skip("FERRY_BENCH_SHAPED_SETUP not set: scripts/bench shaped runs this")
	}
	direct := storetest.S3URL(t, "ferry-bench")
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("endpoint", "http://"+os.Getenv("FERRY_BENCH_SHAPED_VIA"))
	u.RawQuery = q.Encode()
	if err := os.WriteFile(out, []byte(direct+"\n"+u.String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkShapedRead reads the value of the first record of
// FERRY_BENCH_SHAPED_TOPIC from FERRY_BENCH_SHAPED_STORE (a store URL) with
// large.message.payload.store.download.concurrency
// FERRY_BENCH_SHAPED_CONCURRENCY (empty: the default) through the verifying
// reader into io.Discard. Reports MB/s of the payload and peak-heap-MiB.
func BenchmarkShapedRead(b *testing.B) {
	topic, storeURL := os.Getenv("FERRY_BENCH_SHAPED_TOPIC"), os.Getenv("FERRY_BENCH_SHAPED_STORE")
	if topic == "" || storeURL == "" {
		b.Skip("FERRY_BENCH_SHAPED_TOPIC and FERRY_BENCH_SHAPED_STORE not set: scripts/bench shaped runs this")
	}
	cfg := largemessage.DefaultConfig()
	cfg.StoreURL = storeURL
	if v := os.Getenv("FERRY_BENCH_SHAPED_CONCURRENCY"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			b.Fatal(err)
		}
		cfg.DownloadConcurrency = n
	}
	store, err := cfg.OpenStoreForReading(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	rec := pollN(b, client(b, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())), 1)[0]
	de := cfg.NewDeserializer(store)
	var size int64
	stop := sampleHeap()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		rc, n, err := de.OpenValue(b.Context(), rec)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, rc); err != nil {
			b.Fatal(err)
		}
		rc.Close()
		size += n
	}
	el := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(size)/el.Seconds()/1e6, "MB/s")
	b.ReportMetric(stop(), "peak-heap-MiB")
}
