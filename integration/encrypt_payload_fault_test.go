package integration

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/internal/faultproxy"
	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/proxy"
)

// An encrypted payload (the real KMS key) in the real S3 server, read
// through the proxy while a fault proxy cuts every S3 response after 100
// bytes (inside the sealed header's wrapped data key): the proxy answers
// the partition KAFKA_STORAGE_ERROR, which the consumer retries, never
// CORRUPT_MESSAGE, which tells the application the record will never be
// readable (a Java application may seek past it, ferry consume stops with
// exit 1). Once S3 answers whole again, the same record comes back.
func TestEncryptedPayloadStoreCutIsNotCorrupt(t *testing.T) {
	brokers(t)
	key := storetest.KMSKeyURL(t, "")
	_, via, fp := storetest.S3URLViaFaultProxy(t, "ferry-it-cut")
	topic := clientTopic(t, 1, nil)
	srv := startProxyServer(t, proxy.Config{Upstream: proxy.SplitList(brokers(t)),
		Interceptors: []interceptor.Spec{largeMessageSpec(topic, via, largemessage.KeyEncryptionKeyURL+"="+key,
			"large.message.payload.store.retry.count=1", "large.message.payload.store.retry.backoff.ms=10",
			"large.message.payload.store.retry.max.backoff.ms=50")}})
	value := randomBytes(902, 3<<20)
	prod := viaClient(t, srv.Addr(), kgo.DefaultProduceTopic(topic), kgo.ProducerBatchMaxBytes(8<<20))
	if err := prod.ProduceSync(ctxT(t, time.Minute), &kgo.Record{Value: bytes.Clone(value)}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	fp.SetCutAfter(100)
	fp.Set(faultproxy.CutBody, -1)
	cl := viaClient(t, srv.Addr(), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxBytes(64<<20), kgo.MetadataMinAge(250*time.Millisecond), kgo.KeepRetryableFetchErrors())
	storage := 0
	deadline := time.Now().Add(30 * time.Second)
	for storage < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s: %d KAFKA_STORAGE_ERROR fetch errors (the fault proxy cut %d responses)", storage, fp.Count(faultproxy.CutBody))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachError(func(_ string, _ int32, err error) {
			switch {
			case errors.Is(err, kerr.KafkaStorageError):
				storage++
			case errors.Is(err, context.DeadlineExceeded):
			default:
				t.Fatalf("fetch error while S3 responses are cut: %v; want KAFKA_STORAGE_ERROR (a store fault is not a corrupt record)", err)
			}
		})
		if n := len(fs.Records()); n > 0 {
			t.Fatalf("%d records while every S3 response is cut", n)
		}
	}
	if fp.Count(faultproxy.CutBody) == 0 {
		t.Fatal("the fault proxy cut no response")
	}

	fp.Set(faultproxy.Pass, -1)
	deadline = time.Now().Add(30 * time.Second)
	for {
		if time.Now().After(deadline) {
			t.Fatal("the record did not come back within 30 s of S3 answering whole again")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		fs := cl.PollFetches(ctx)
		cancel()
		if recs := fs.Records(); len(recs) > 0 {
			if recs[0].Offset != 0 || !bytes.Equal(recs[0].Value, value) {
				t.Fatalf("record at offset %d, %d bytes; want offset 0, the produced value", recs[0].Offset, len(recs[0].Value))
			}
			break
		}
	}
}
