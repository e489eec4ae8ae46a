package interceptor

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/ferrykit/ferry/largemessage"
)

// benchJSONValues are n JSON values of about size bytes each: objects with
// a counter and a varied text, so that validate-json has work and the
// compressed batches compress as real data does (not as random bytes).
func benchJSONValues(n, size int) []string {
	vals := make([]string, n)
	for i := range vals {
		pre := fmt.Sprintf(`{"id":%d,"kind":"order","text":"`, i)
		body := randomBytes(uint64(i), size)
		for j := range body {
			body[j] = 'a' + body[j]%26
		}
		vals[i] = pre + string(body[:max(size-len(pre)-2, 0)]) + `"}`
	}
	return vals
}

// BenchmarkBatch is issue 19's in-place figure: one partition with one
// batch of 1000 records of 1 KiB (JSON values), uncompressed, lz4 and zstd,
// through a chain of none (an interceptor matching another topic: what the
// proxy costs without interceptors), large-message with nothing to offload,
// validate-json, and encrypt (every record sealed on produce, opened on
// fetch); produce requests and fetch responses. MB/s counts record values;
// compare allocs/op and B/op across commits (ns/op on a busy machine is
// noise).
func BenchmarkBatch(b *testing.B) {
	vals := benchJSONValues(1000, 1024)
	ctx := context.Background()
	lm, err := New(ctx, "large-message", map[string]string{largemessage.KeyStoreURL: "mem://bench-batch"})
	if err != nil {
		b.Fatal(err)
	}
	defer lm.Close()
	vj, err := New(ctx, "validate-json", map[string]string{KeySide: "both"})
	if err != nil {
		b.Fatal(err)
	}
	enc, err := New(ctx, "encrypt", map[string]string{KeyEncryptKeyURL: encKeyURL(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer enc.Close()
	nothing := func(context.Context, *Record) error { return nil }
	chains := []struct {
		name string
		in   Instance
	}{
		{"none", Instance{Produce: &funcIcpt{name: "x", re: mustPattern("other"), fn: nothing}, Fetch: &funcIcpt{name: "x", re: mustPattern("other"), fn: nothing}}},
		{"large-message", lm},
		{"validate-json", vj},
		{"encrypt", enc},
	}
	for _, codec := range []struct {
		name  string
		attrs int16
	}{{"none", 0}, {"lz4", 3}, {"zstd", 4}} {
		batch := plainBatch(&testing.T{}, codec.attrs, -1, vals...)
		// What a broker returns for the encrypt chain: the batch as
		// encrypt sealed it.
		sealer := NewChain([]Instance{enc}, Options{})
		req := buildRequest(&testing.T{}, map[string][]byte{"t": batch})
		out := sealer.InterceptProduce(ctx, req, nil)
		sealed := bytes.Clone(req.Topics[0].Partitions[0].Records)
		out.Release()
		binary.BigEndian.PutUint64(batch, 0)
		for _, tc := range chains {
			ch := NewChain([]Instance{tc.in}, Options{})
			b.Run(fmt.Sprintf("produce/%s/%s", codec.name, tc.name), func(b *testing.B) {
				b.SetBytes(int64(len(vals) * 1024))
				b.ReportAllocs()
				for b.Loop() {
					req := buildRequest(&testing.T{}, map[string][]byte{"t": batch})
					out := ch.InterceptProduce(ctx, req, allTopics(16<<20))
					if !out.Forward || len(out.Answered) != 0 {
						b.Fatal(fmt.Sprint(out.Answered))
					}
					out.Release()
				}
			})
			set := batch
			if tc.name == "encrypt" {
				set = sealed
			}
			b.Run(fmt.Sprintf("fetch/%s/%s", codec.name, tc.name), func(b *testing.B) {
				b.SetBytes(int64(len(vals) * 1024))
				b.ReportAllocs()
				for b.Loop() {
					resp := fetchResponse(map[string][]byte{"t": set})
					out := ch.InterceptFetch(ctx, resp)
					if len(out.Failed) != 0 {
						b.Fatalf("failed %v", out.Failed)
					}
					out.Release()
				}
			})
		}
	}
}
