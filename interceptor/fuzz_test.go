package interceptor

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"regexp"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// FuzzRewriteBatch feeds arbitrary record sets to both sides of a chain
// that changes and skips records: no input may panic, and whatever the
// chain forwards must be valid batches (CRC, lengths, record counts).
func FuzzRewriteBatch(f *testing.F) {
	for attrs := int16(0); attrs <= 4; attrs++ {
		f.Add(plainBatch(&testing.T{}, attrs, -1, "a", "skip", `{"k":"v"}`), false, uint8(0))
		f.Add(plainBatch(&testing.T{}, attrs, 7, "idempotent"), false, uint8(0))
		// The records section alone, wrapped with a valid header below.
		f.Add(plainBatch(&testing.T{}, 0, -1, "a", "skip")[61:], true, uint8(2))
	}
	f.Add([]byte{}, false, uint8(0))
	f.Add(make([]byte, 61), false, uint8(0))
	fn := func(_ context.Context, r *Record) error {
		if bytes.Equal(r.Value, []byte("skip")) {
			return ErrSkipRecord
		}
		r.Value = append(bytes.Clone(r.Value), '!')
		r.Headers = append(r.Headers, Header{Key: "h", Value: r.Key})
		return nil
	}
	ch := NewChain([]Instance{{Produce: &funcIcpt{name: "p", re: mustPattern("t"), fn: fn},
		Fetch: &funcIcpt{name: "f", re: mustPattern("t"), fn: fn}}}, Options{})
	f.Fuzz(func(t *testing.T, b []byte, wrap bool, n uint8) {
		if wrap {
			// A batch with a valid CRC around fuzzed records, so the
			// record decoder is reached.
			d := &decodedBatch{hdr: plainHeader(int32(n), int16(n>>4)&7)}
			h := d.hdr
			h.Records = b
			h.Length = int32(49 + len(b))
			b = h.AppendTo(nil)
			binary.BigEndian.PutUint32(b[crcOffset:], crc32.Checksum(b[attrOffset:], castagnoli))
		}
		req := buildRequest(t, map[string][]byte{"t": bytes.Clone(b)})
		out := ch.InterceptProduce(context.Background(), req, allTopics(1<<20))
		if out.Forward {
			rest := req.Topics[0].Partitions[0].Records
			for len(rest) > 0 {
				raw, next, ok := splitBatch(rest)
				if !ok {
					t.Fatalf("forwarded a truncated batch")
				}
				if _, err := decodeBatch(context.Background(), nil, raw); err != nil && raw[magicOffset] == 2 {
					t.Fatalf("forwarded an invalid batch: %v", err)
				}
				rest = next
			}
		}
		resp := fetchResponse(map[string][]byte{"t": bytes.Clone(b)})
		ch.InterceptFetch(context.Background(), resp)
	})
}

func mustPattern(p string) *regexp.Regexp {
	re, err := CompileTopicPattern(p)
	if err != nil {
		panic(err)
	}
	return re
}

func plainHeader(n int32, attrs int16) kmsg.RecordBatch {
	return kmsg.RecordBatch{Magic: 2, Attributes: attrs, ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1,
		NumRecords: n, LastOffsetDelta: n - 1, PartitionLeaderEpoch: -1}
}

// FuzzJSON feeds arbitrary values to the JSON check and to both JSON
// interceptors: no input may panic or recurse without bound, and what the
// check accepts is valid JSON without a duplicate name (encoding/json
// agrees on validity).
func FuzzJSON(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `{"n":1e400,"email":"a","email":"secret"}`, `[[[[[]]]]]`,
		`{"a":{"b":[1,2,{"c":"\u00e9"}]}}`, `"\ud800"`, `{"a":1,"a":2}`, `{"\u0061":1,"a":2}`, strings.Repeat("[", 2000)} {
		f.Add([]byte(s))
	}
	red, err := New(context.Background(), "redact", map[string]string{KeyRedactFields: "a,email,b.#.c", KeyJSONMaxDepth: "64"})
	if err != nil {
		f.Fatal(err)
	}
	val, err := New(context.Background(), "validate-json", map[string]string{KeyJSONMaxDepth: "64",
		KeyJSONSchema: `{"type":"object","properties":{"a":{"type":"integer"}}}`})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		err := checkJSON(b, 64)
		if err == nil && !json.Valid(b) {
			t.Fatalf("checkJSON accepted %q, which encoding/json rejects", b)
		}
		r := &Record{Topic: "t", Value: bytes.Clone(b)}
		if rerr := red.Produce.ProcessRecord(context.Background(), r); rerr == nil && !json.Valid(r.Value) {
			t.Fatalf("redact turned %q into invalid JSON %q", b, r.Value)
		}
		_ = val.Produce.ProcessRecord(context.Background(), &Record{Topic: "t", Value: bytes.Clone(b)})
	})
}
