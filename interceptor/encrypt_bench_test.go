package interceptor

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// BenchmarkEncryptSmallBatches is what the encrypt interceptor sees behind
// Kafka's perf producer (batch.size 16 KiB): one partition per request
// holding one batch of 15 records of 1 KiB on produce, and a fetch response
// of 64 such batches in one partition, as a consumer's 1 MiB fetch brings
// them. MB/s counts the record values. Where the per-batch and per-request
// costs show, which BenchmarkBatch's 1000-record batch hides.
func BenchmarkEncryptSmallBatches(b *testing.B) {
	ctx := context.Background()
	enc, err := New(ctx, "encrypt", map[string]string{KeyEncryptKeyURL: encKeyURL(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer enc.Close()
	vals := benchJSONValues(15, 1024)
	for _, codec := range []struct {
		name  string
		attrs int16
	}{{"none", 0}, {"lz4", 3}} {
		batch := plainBatch(&testing.T{}, codec.attrs, -1, vals...)
		ch := NewChain([]Instance{enc}, Options{})
		req := buildRequest(&testing.T{}, map[string][]byte{"t": batch})
		out := ch.InterceptProduce(ctx, req, nil)
		sealed := bytes.Clone(req.Topics[0].Partitions[0].Records)
		out.Release()
		var set []byte
		for range 64 {
			set = append(set, sealed...)
		}
		b.Run(fmt.Sprintf("produce/%s", codec.name), func(b *testing.B) {
			b.SetBytes(int64(len(vals) * 1024))
			b.ReportAllocs()
			for b.Loop() {
				req := buildRequest(&testing.T{}, map[string][]byte{"t": batch})
				out := ch.InterceptProduce(ctx, req, allTopics(1<<20))
				if !out.Forward || len(out.Answered) != 0 {
					b.Fatal(fmt.Sprint(out.Answered))
				}
				out.Release()
			}
		})
		// Three partitions per request, as the perf producer sends to a
		// topic of three: run one after the other on the request's
		// goroutine (serialMaxBytes). cpu-ns/op is the process's CPU time
		// per request: ns/op alone hides what running partitions side by
		// side costs the other core.
		b.Run(fmt.Sprintf("produce3/%s", codec.name), func(b *testing.B) {
			b.SetBytes(int64(3 * len(vals) * 1024))
			b.ReportAllocs()
			cpu0 := cpuTime()
			defer func() { b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op") }()
			for b.Loop() {
				req := buildRequest(&testing.T{}, map[string][]byte{"t": batch})
				for p := int32(1); p < 3; p++ {
					rp := kmsg.NewProduceRequestTopicPartition()
					rp.Partition, rp.Records = p, batch
					req.Topics[0].Partitions = append(req.Topics[0].Partitions, rp)
				}
				out := ch.InterceptProduce(ctx, req, allTopics(1<<20))
				if !out.Forward || len(out.Answered) != 0 || out.Rewritten != 3 {
					b.Fatalf("answered %v, rewritten %d", out.Answered, out.Rewritten)
				}
				out.Release()
			}
		})
		b.Run(fmt.Sprintf("fetch/%s", codec.name), func(b *testing.B) {
			b.SetBytes(int64(64 * len(vals) * 1024))
			b.ReportAllocs()
			for b.Loop() {
				resp := fetchResponse(map[string][]byte{"t": set})
				out := ch.InterceptFetch(ctx, resp)
				if len(out.Failed) != 0 || out.Rewritten == 0 {
					b.Fatalf("failed %v, rewritten %d", out.Failed, out.Rewritten)
				}
				out.Release()
			}
		})
	}
}
