package interceptor

import (
	"bytes"
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

// BenchmarkInterceptEncrypt: the encrypt interceptor against the plain
// paths, per byte of record values (b.SetBytes), so plain and encrypted
// can be compared per GB. Produce: one partition with an uncompressed
// batch of 100 records of 1 KiB (random: encryption leaves nothing to
// compress) through a chain whose interceptor does not match
// ("unmatched": the proxy's cost without interceptors), an identity one
// (decoded, not re-encoded), one that adds a header to every record
// (decoded and re-encoded: encrypt's work but the cryptography), and
// encrypt (every value sealed, the batch re-encoded). Fetch: ten such
// batches as the broker returns them, plain through the first three,
// sealed through encrypt (opened, re-encoded). The data key is cached: no KMS call per record.
func BenchmarkInterceptEncrypt(b *testing.B) {
	vals := make([]string, 100)
	for i := range vals {
		vals[i] = string(randomBytes(uint64(i), 1024))
	}
	batch := plainBatch(&testing.T{}, 0, -1, vals...)
	enc, err := New(context.Background(), "encrypt", map[string]string{KeyTopicPattern: "t", KeyEncryptKeyURL: encKeyURL(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer enc.Close()
	none := func(context.Context, *Record) error { return nil }
	unmatched := Instance{Produce: &funcIcpt{name: "x", re: mustPattern("other"), fn: none}, Fetch: &funcIcpt{name: "x", re: mustPattern("other"), fn: none}}
	identity := Instance{Produce: &funcIcpt{name: "x", re: mustPattern("t"), fn: none}, Fetch: &funcIcpt{name: "x", re: mustPattern("t"), fn: none}}
	change := func(_ context.Context, r *Record) error {
		r.Headers = append(r.Headers, Header{Key: "k"})
		return nil
	}
	changed := Instance{Produce: &funcIcpt{name: "x", re: mustPattern("t"), fn: change}, Fetch: &funcIcpt{name: "x", re: mustPattern("t"), fn: change}}
	ins := []struct {
		name string
		in   Instance
	}{{"unmatched", unmatched}, {"identity", identity}, {"change", changed}, {"encrypt", enc}}
	for _, tc := range ins {
		ch := NewChain([]Instance{tc.in}, Options{})
		b.Run("produce/"+tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(vals) * 1024))
			b.ReportAllocs()
			for b.Loop() {
				req := buildRequest(&testing.T{}, map[string][]byte{"t": batch})
				out := ch.InterceptProduce(context.Background(), req, allTopics(1<<20))
				if !out.Forward || len(out.Answered) != 0 {
					b.Fatal(fmt.Sprint(out.Answered))
				}
				out.Release()
			}
		})
	}
	// The record sets a broker returns: plain, and as encrypt sealed them.
	sealer := NewChain([]Instance{enc}, Options{})
	var plainSet, sealedSet []byte
	for j := range 10 {
		bt := bytes.Clone(batch)
		binary.BigEndian.PutUint64(bt, uint64(j*100)) // first offset
		plainSet = append(plainSet, bt...)
		req := buildRequest(&testing.T{}, map[string][]byte{"t": batch})
		out := sealer.InterceptProduce(context.Background(), req, nil)
		sb := bytes.Clone(req.Topics[0].Partitions[0].Records)
		out.Release()
		binary.BigEndian.PutUint64(sb, uint64(j*100))
		sealedSet = append(sealedSet, sb...)
	}
	for _, tc := range ins {
		ch := NewChain([]Instance{tc.in}, Options{})
		set := plainSet
		if tc.name == "encrypt" {
			set = sealedSet
		}
		b.Run("fetch/"+tc.name, func(b *testing.B) {
			b.SetBytes(1000 * 1024)
			b.ReportAllocs()
			for b.Loop() {
				resp := fetchResponse(map[string][]byte{"t": set})
				out := ch.InterceptFetch(context.Background(), resp)
				if len(out.Failed) != 0 {
					b.Fatalf("failed %v", out.Failed)
				}
				out.Release()
			}
		})
	}
}
