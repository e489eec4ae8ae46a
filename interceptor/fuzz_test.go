package interceptor

import (
	"bytes"
	"context"
	"encoding/binary"
	"github.com/twmb/franz-go/pkg/kmsg"
	"hash/crc32"
	"regexp"
	"testing"
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
