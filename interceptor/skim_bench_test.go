package interceptor

import (
	"context"
	"testing"

	"github.com/ferrykit/ferry/largemessage"
)

// BenchmarkSkim is BenchmarkBatch's uncompressed large-message case as the
// proxy now meets it: the batch skimmed in place (ProduceUntouched,
// FetchUntouched) instead of run through the chain. MB/s counts record
// values; compare with BenchmarkBatch/{produce,fetch}/none/large-message.
func BenchmarkSkim(b *testing.B) {
	vals := benchJSONValues(1000, 1024)
	lm, err := New(context.Background(), "large-message", map[string]string{largemessage.KeyStoreURL: "mem://bench-skim"})
	if err != nil {
		b.Fatal(err)
	}
	defer lm.Close()
	ch := NewChain([]Instance{lm}, Options{})
	sets := []RecordSet{{Topic: "t", Records: plainBatch(&testing.T{}, 0, -1, vals...)}}
	limits := allTopics(16 << 20)
	b.Run("produce", func(b *testing.B) {
		b.SetBytes(int64(len(vals) * 1024))
		b.ReportAllocs()
		for b.Loop() {
			if !ch.ProduceUntouched(context.Background(), sets, limits) {
				b.Fatal("not untouched")
			}
		}
	})
	b.Run("fetch", func(b *testing.B) {
		b.SetBytes(int64(len(vals) * 1024))
		b.ReportAllocs()
		for b.Loop() {
			if !ch.FetchUntouched(sets) {
				b.Fatal("not untouched")
			}
		}
	})
}
