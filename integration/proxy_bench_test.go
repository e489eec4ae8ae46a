package integration

import (
	"context"
	"errors"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/proxy"
)

// countFiles counts the regular files under dir (0 when it does not exist).
func countFiles(tb testing.TB, dir string) int {
	n := 0
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n++
		}
		return err
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		tb.Fatal(err)
	}
	return n
}

// benchLargeMessageSpec is the large-message interceptor on every topic, both
// sides, with a file store in dir and the default (derived) threshold.
func benchLargeMessageSpec(dir string) interceptor.Spec {
	return interceptor.Spec{Name: "large-message", Config: map[string]string{
		largemessage.KeyStoreURL: "file://" + dir,
	}}
}

// BenchmarkProxy measures, on the same real broker and in one run, 1 KiB
// records produced and consumed direct, through an in-process proxy, and
// through an in-process proxy running the large-message interceptor (file
// store in a temp dir, threshold derived from the topic's max.message.bytes,
// so no 1 KiB record is offloaded: the cost is decoding every batch on
// produce and fetch). Sub-benchmarks "direct", "proxy" and "proxy-lm";
// scripts/bench proxy runs them and prints the ratios. Per op:
//   - produce-MB/s: proxyBenchRecords records of 1 KiB produced
//     asynchronously (acks=all, franz-go's default batching), until all are
//     acknowledged;
//   - consume-MB/s: the same records read back from offset 0 by a new client;
//   - p50-ms / p99-ms: latency of proxyBenchSync single-record ProduceSync
//     calls one after another (acks=all).
func BenchmarkProxy(b *testing.B) {
	for _, mode := range []string{"direct", "proxy", "proxy-lm"} {
		b.Run(mode, func(b *testing.B) {
			bootstrap := brokers(b)
			switch mode {
			case "proxy":
				bootstrap = startProxy(b, bootstrap)
			case "proxy-lm":
				store := b.TempDir()
				bootstrap = startProxyServer(b, proxy.Config{
					Upstream:     proxy.SplitList(bootstrap),
					Interceptors: []interceptor.Spec{benchLargeMessageSpec(store)},
				}).Addr()
				// The workload is meant to stay under the threshold: a payload in
				// the store means the figures measure something else.
				defer func() {
					if n := countFiles(b, store); n != 0 {
						b.Fatalf("%d payload(s) in the store: a 1 KiB record was offloaded", n)
					}
				}()
			}
			var prodSecs, consSecs float64
			var lat []time.Duration
			for range b.N {
				p, c, l := proxyBenchOnce(b, bootstrap)
				prodSecs += p.Seconds()
				consSecs += c.Seconds()
				lat = append(lat, l...)
			}
			mb := float64(b.N) * proxyBenchRecords * 1024 / 1e6
			slices.Sort(lat)
			b.ReportMetric(mb/prodSecs, "produce-MB/s")
			b.ReportMetric(mb/consSecs, "consume-MB/s")
			b.ReportMetric(float64(lat[len(lat)/2])/1e6, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100])/1e6, "p99-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}

const (
	proxyBenchRecords = 100000
	proxyBenchSync    = 1000
)

func proxyBenchOnce(b *testing.B, bootstrap string) (produce, consume time.Duration, lat []time.Duration) {
	b.StopTimer()
	defer b.StartTimer()
	topic := newTopic(b, nil)
	defer func() { // keep the broker's disk small across runs
		_, _ = kadm.NewClient(client(b)).DeleteTopics(context.Background(), topic)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	seed := []kgo.Opt{kgo.SeedBrokers(strings.Split(bootstrap, ",")...)}
	prod, err := kgo.NewClient(append(seed, kgo.DefaultProduceTopic(topic))...)
	if err != nil {
		b.Fatal(err)
	}
	defer prod.Close()
	value := randomBytes(1, 1024)
	// Warm up: metadata and connections.
	if err := prod.ProduceSync(ctx, &kgo.Record{Value: value}).FirstErr(); err != nil {
		b.Fatal(err)
	}
	for range proxyBenchSync {
		start := time.Now()
		if err := prod.ProduceSync(ctx, &kgo.Record{Value: value}).FirstErr(); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	errs := make(chan error, 1)
	start := time.Now()
	for range proxyBenchRecords {
		prod.Produce(ctx, &kgo.Record{Value: value}, func(_ *kgo.Record, err error) {
			if err != nil {
				select {
				case errs <- err:
				default:
				}
			}
		})
	}
	if err := prod.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	produce = time.Since(start)
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}

	total := 1 + proxyBenchSync + proxyBenchRecords
	cons, err := kgo.NewClient(append(seed, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxBytes(64<<20))...)
	if err != nil {
		b.Fatal(err)
	}
	defer cons.Close()
	start = time.Now()
	for n := 0; n < total; {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			b.Fatalf("consumed %d of %d", n, total)
		}
		fs.EachError(func(tp string, p int32, err error) { b.Fatalf("fetch %s/%d: %v", tp, p, err) })
		n += fs.NumRecords()
	}
	// Consume throughput counts the async records' share of the time.
	consume = time.Duration(float64(time.Since(start)) * proxyBenchRecords / float64(total))
	return produce, consume, lat
}
