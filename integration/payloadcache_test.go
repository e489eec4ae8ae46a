package integration

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/proxy"
)

// Several consumers of the same offloaded records through the proxy: with
// large.message.payload.cache.max.bytes (default) each payload is
// downloaded once; with the cache off, once per consumer. The
// ferry_resolved_* metrics count the downloads and the records delivered
// separately.
func TestProxyPayloadCacheOneDownload(t *testing.T) {
	const size, records, consumers = 2 << 20, 3, 4
	for _, tc := range []struct {
		name          string
		extra         []string
		wantDownloads int
	}{
		{"cache", nil, records},
		{"no cache", []string{interceptor.KeyPayloadCacheMax + "=0"}, records * consumers},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topic := newTopic(t, nil)
			srv := startProxyServer(t, proxy.Config{Upstream: proxy.SplitList(brokers(t)), AdminListen: "127.0.0.1:0",
				Interceptors: []interceptor.Spec{largeMessageSpec(topic, interceptorStoreURL(t), tc.extra...)}})
			via := srv.Addr()
			cl := viaClient(t, via, kgo.DefaultProduceTopic(topic), kgo.ProducerBatchMaxBytes(16<<20), kgo.MaxBufferedBytes(64<<20))
			want := map[string][]byte{}
			for i := range records {
				k := fmt.Sprintf("big-%d", i)
				want[k] = printable(uint64(300+i), size)
				if err := cl.ProduceSync(ctxT(t, time.Minute), &kgo.Record{Key: []byte(k), Value: want[k]}).FirstErr(); err != nil {
					t.Fatalf("produce %s: %v", k, err)
				}
			}
			var wg sync.WaitGroup
			errs := make(chan error, consumers)
			for c := range consumers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					cons := viaClient(t, via, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxBytes(64<<20))
					ctx := ctxT(t, 3*time.Minute)
					got := 0
					for got < records {
						fs := cons.PollFetches(ctx)
						if err := fs.Err0(); err != nil {
							errs <- fmt.Errorf("consumer %d: %w", c, err)
							return
						}
						for _, r := range fs.Records() {
							if !bytes.Equal(r.Value, want[string(r.Key)]) {
								errs <- fmt.Errorf("consumer %d: record %s: %d bytes back, not the %d produced", c, r.Key, len(r.Value), size)
								return
							}
							got++
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			fams := scrape(t, srv.AdminAddr())
			// A client may fetch a record again (a retry): then it is
			// delivered again, and without the cache downloaded again.
			for _, c := range []struct {
				name  string
				want  float64
				exact bool
			}{
				{"ferry_resolved_records_total", float64(tc.wantDownloads), tc.wantDownloads == records},
				{"ferry_resolved_bytes_total", float64(tc.wantDownloads * size), tc.wantDownloads == records},
				{"ferry_resolved_delivered_records_total", records * consumers, false},
				{"ferry_resolved_delivered_bytes_total", records * consumers * (size + 5), false},
			} {
				got := metricValue(fams, c.name, map[string]string{"topic": topic})
				if got < c.want || c.exact && got != c.want {
					t.Errorf("%s = %v, want %v (%d consumers of %d records)", c.name, got, c.want, consumers, records)
				}
			}
		})
	}
}
