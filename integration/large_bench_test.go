package integration

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/proxy"
)

// BenchmarkLarge measures single large records end to end (produce, then
// consume from offset 0 by a new client, bytes compared) in two ways, in one
// run (scripts/bench large runs it and prints the medians and ratios):
//   - "direct": straight to the broker of FERRY_BENCH_BIG_BROKERS, whose
//     limits were raised to allow such records (message.max.bytes,
//     socket.request.max.bytes, replica.fetch.max.bytes);
//   - "proxy-lm": through an in-process proxy running the large-message
//     interceptor (file store in a temp dir) in front of the broker of
//     FERRY_KAFKA_BROKERS, left at Kafka's default 1 MiB limits. The proxy
//     takes requests up to 256 MiB (socket.request.max.bytes) and gives each
//     interceptor call 60 s (produce.request.interceptor.timeout.ms).
//     With FERRY_BENCH_PROXY_ADDR set, proxy-lm goes instead through the
//     ferry proxy process listening there (configured the same way by the
//     caller, its file store in FERRY_BENCH_PROXY_STORE), so the caller can
//     read that process's peak RSS.
//
// Sub-benchmarks are MODE/SIZE, SIZE 10MiB or 100MiB. The client is the same
// franz-go configuration on both sides: no compression (the random values
// would not shrink), batch, write, read and fetch limits raised to
// largeBenchClientMax. Per op, on a fresh one-partition topic: one
// ProduceSync (acks=all) of a record of SIZE random bytes (produce-MB/s),
// then a new client reads it back (consume-MB/s, until the record is
// polled); e2e-MB/s is SIZE over both times. The comparison of bytes is not
// timed.
func BenchmarkLarge(b *testing.B) {
	for _, mode := range []string{"direct", "proxy-lm"} {
		b.Run(mode, func(b *testing.B) {
			var bootstrap, admin, store string
			switch mode {
			case "direct":
				bootstrap = os.Getenv("FERRY_BENCH_BIG_BROKERS")
				if bootstrap == "" {
					b.Skip("FERRY_BENCH_BIG_BROKERS not set: scripts/bench large starts a broker with raised limits")
				}
				admin = bootstrap
			case "proxy-lm":
				admin = brokers(b)
				if addr := os.Getenv("FERRY_BENCH_PROXY_ADDR"); addr != "" {
					// A separate ferry proxy process (scripts/bench large starts
					// one per round and size, to read its peak RSS): it must run
					// large-message with its file store in FERRY_BENCH_PROXY_STORE,
					// in front of FERRY_KAFKA_BROKERS.
					store = os.Getenv("FERRY_BENCH_PROXY_STORE")
					if store == "" {
						b.Fatal("FERRY_BENCH_PROXY_ADDR is set without FERRY_BENCH_PROXY_STORE (the proxy's file store directory)")
					}
					bootstrap = addr
					break
				}
				store = b.TempDir()
				bootstrap = startProxyServer(b, proxy.Config{
					Upstream:           proxy.SplitList(admin),
					MaxRequestBytes:    256 << 20,
					InterceptorTimeout: 60 * time.Second,
					Interceptors:       []interceptor.Spec{benchLargeMessageSpec(store)},
				}).Addr()
			}
			for _, size := range []struct {
				name  string
				bytes int
			}{{"10MiB", 10 << 20}, {"100MiB", 100 << 20}} {
				b.Run(size.name, func(b *testing.B) {
					value := randomBytes(uint64(size.bytes), size.bytes)
					var prodSecs, consSecs float64
					for range b.N {
						before := 0
						if store != "" {
							before = countFiles(b, store)
						}
						p, c := largeBenchOnce(b, bootstrap, admin, value)
						prodSecs += p.Seconds()
						consSecs += c.Seconds()
						// Through the proxy the record must have gone to the store
						// (the broker keeps its 1 MiB limit, so it could not have
						// been appended whole anyway).
						if store != "" && countFiles(b, store) <= before {
							b.Fatal("no payload was written to the store")
						}
					}
					mb := float64(b.N) * float64(size.bytes) / 1e6
					b.ReportMetric(mb/prodSecs, "produce-MB/s")
					b.ReportMetric(mb/consSecs, "consume-MB/s")
					b.ReportMetric(mb/(prodSecs+consSecs), "e2e-MB/s")
					b.ReportMetric(0, "ns/op")
				})
			}
		})
	}
}

// largeBenchClientMax is the clients' batch, write, read and fetch limit in
// BenchmarkLarge (bytes): room for a 100 MiB record and its request.
const largeBenchClientMax = 256 << 20

func largeBenchOnce(b *testing.B, bootstrap, admin string, value []byte) (produce, consume time.Duration) {
	b.StopTimer()
	defer b.StartTimer()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	adm := kadm.NewClient(client(b, kgo.SeedBrokers(strings.Split(admin, ",")...)))
	topic := newTopicOn(b, adm)
	defer func() { _, _ = adm.DeleteTopics(context.Background(), topic) }()

	opts := []kgo.Opt{
		kgo.SeedBrokers(strings.Split(bootstrap, ",")...),
		kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.ProducerBatchMaxBytes(largeBenchClientMax - 1<<20),
		kgo.BrokerMaxWriteBytes(largeBenchClientMax),
		kgo.BrokerMaxReadBytes(largeBenchClientMax),
		kgo.FetchMaxBytes(largeBenchClientMax),
		kgo.FetchMaxPartitionBytes(largeBenchClientMax),
		kgo.ProduceRequestTimeout(2 * time.Minute),
	}
	prod, err := kgo.NewClient(append(opts, kgo.DefaultProduceTopic(topic))...)
	if err != nil {
		b.Fatal(err)
	}
	defer prod.Close()
	// Metadata and connections first, so the timing is the record's.
	if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte("warm-up")}).FirstErr(); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := prod.ProduceSync(ctx, &kgo.Record{Value: value}).FirstErr(); err != nil {
		b.Fatalf("produce %d bytes: %v", len(value), err)
	}
	produce = time.Since(start)

	cons, err := kgo.NewClient(append(opts, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	if err != nil {
		b.Fatal(err)
	}
	defer cons.Close()
	var got []*kgo.Record
	start = time.Now()
	for len(got) < 2 {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			b.Fatalf("consumed %d of 2 records", len(got))
		}
		fs.EachError(func(tp string, p int32, err error) { b.Fatalf("fetch %s/%d: %v", tp, p, err) })
		got = append(got, fs.Records()...)
	}
	consume = time.Since(start)
	if len(got) != 2 || !bytes.Equal(got[1].Value, value) {
		b.Fatalf("read back %d records; the large one differs from what was produced", len(got))
	}
	return produce, consume
}

// newTopicOn creates a fresh one-partition topic through adm (the cluster's
// defaults for every config) and returns its name.
func newTopicOn(b *testing.B, adm *kadm.Client) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := "ferry-bench-large-" + time.Now().Format("150405.000000000")
	resp, err := adm.CreateTopic(ctx, 1, 1, nil, name)
	if err != nil || resp.Err != nil {
		b.Fatalf("create topic %s: %v %v", name, err, resp.Err)
	}
	return name
}
