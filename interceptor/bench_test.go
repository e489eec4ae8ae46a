package interceptor

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/ferrykit/ferry/largemessage"
)

// BenchmarkInterceptProduce: one partition with a batch of 100 records of
// 1 KiB (lz4), through a chain whose interceptor does not match, an
// identity interceptor (decode, no re-encode), one that changes every
// record (decode and re-encode), and large-message with nothing over the
// threshold.
func BenchmarkInterceptProduce(b *testing.B) {
	vals := make([]string, 100)
	for i := range vals {
		vals[i] = string(randomBytes(uint64(i), 1024))
	}
	batch := plainBatch(&testing.T{}, 3, -1, vals...)
	plain := plainBatch(&testing.T{}, 0, -1, vals...) // uncompressed (the Java producer's default)
	lm, err := New(context.Background(), "large-message", map[string]string{largemessage.KeyStoreURL: "mem://bench"})
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		in    Instance
		batch []byte // nil: the lz4 one
	}{
		{"unmatched", Instance{Produce: &funcIcpt{name: "x", re: mustPattern("other"), fn: func(context.Context, *Record) error { return nil }}}, nil},
		{"identity", Instance{Produce: &funcIcpt{name: "x", re: mustPattern("t"), fn: func(context.Context, *Record) error { return nil }}}, nil},
		{"change", Instance{Produce: &funcIcpt{name: "x", re: mustPattern("t"), fn: func(_ context.Context, r *Record) error {
			r.Headers = append(r.Headers, Header{Key: "k"})
			return nil
		}}}, nil},
		{"large-message", lm, nil},
		{"identity-uncompressed", Instance{Produce: &funcIcpt{name: "x", re: mustPattern("t"), fn: func(context.Context, *Record) error { return nil }}}, plain},
		{"large-message-uncompressed", lm, plain},
	} {
		ch := NewChain([]Instance{tc.in}, Options{})
		batch := batch
		if tc.batch != nil {
			batch = tc.batch
		}
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(vals) * 1024))
			for b.Loop() {
				req := buildRequest(&testing.T{}, map[string][]byte{"t": batch})
				if out := ch.InterceptProduce(context.Background(), req, allTopics(1<<20)); !out.Forward {
					b.Fatal(fmt.Sprint(out.Answered))
				}
			}
		})
	}
}

// BenchmarkInterceptFetch: a Fetch response of one partition holding ten
// batches of 100 records of 1 KiB each (uncompressed and lz4), through
// large-message with no reference among them (nothing changes: the
// response's bytes go out as they came). MB/s counts the record values.
func BenchmarkInterceptFetch(b *testing.B) {
	lm, err := New(context.Background(), "large-message", map[string]string{largemessage.KeyStoreURL: "mem://bench"})
	if err != nil {
		b.Fatal(err)
	}
	ch := NewChain([]Instance{lm}, Options{})
	for _, codec := range []struct {
		name  string
		attrs int16
	}{{"none", 0}, {"lz4", 3}} {
		var set []byte
		for j := range 10 {
			vals := make([]string, 100)
			for i := range vals {
				vals[i] = string(randomBytes(uint64(j*100+i), 1024))
			}
			bt := plainBatch(&testing.T{}, codec.attrs, -1, vals...)
			binary.BigEndian.PutUint64(bt, uint64(j*100)) // first offset
			set = append(set, bt...)
		}
		b.Run(codec.name, func(b *testing.B) {
			b.SetBytes(1000 * 1024)
			b.ReportAllocs()
			for b.Loop() {
				resp := fetchResponse(map[string][]byte{"t": set})
				out := ch.InterceptFetch(context.Background(), resp)
				if out.Rewritten != 0 || len(out.Failed) != 0 || &resp.Topics[0].Partitions[0].RecordBatches[0] != &set[0] {
					b.Fatalf("rewritten %d, failed %v", out.Rewritten, out.Failed)
				}
				out.Release()
			}
		})
	}
}
