package interceptor

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/ferrykit/ferry/internal/crc32c"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// FuzzEncodeStreamed: a batch of random records, some of whose values are
// holes, encoded around the holes and then filled by Hole.Stream, is the
// batch encoded with the values in memory, byte for byte (lengths, CRC-32C
// combined around the holes).
func FuzzEncodeStreamed(f *testing.F) {
	for _, s := range []uint64{1, 2, 3, 42, 1 << 40} {
		f.Add(s, uint8(3))
	}
	f.Fuzz(func(t *testing.T, seed uint64, n uint8) {
		rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		count := int(n%6) + 1
		hdr := kmsg.RecordBatch{Magic: 2, ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1, FirstOffset: int64(rng.IntN(1000)),
			FirstTimestamp: 1700000000000, MaxTimestamp: 1700000000000, LastOffsetDelta: int32(count - 1), PartitionLeaderEpoch: -1}
		bytesOf := func(max int) []byte {
			if rng.IntN(5) == 0 {
				return nil
			}
			b := make([]byte, rng.IntN(max+1))
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			return b
		}
		mem := &decodedBatch{hdr: hdr}
		str := &decodedBatch{hdr: hdr}
		for i := range count {
			r := kmsg.Record{OffsetDelta: int32(i), TimestampDelta64: int64(rng.IntN(1 << 20)), Key: bytesOf(40)}
			for range rng.IntN(4) {
				r.Headers = append(r.Headers, kmsg.Header{Key: string(bytesOf(12)), Value: bytesOf(20)})
			}
			hole := rng.IntN(2) == 0
			v := bytesOf(300 << 10)
			if hole && v == nil {
				v = []byte{}
			}
			m := r
			m.Value = v
			mem.recs = append(mem.recs, m)
			s := r
			s.Value = v
			if hole {
				s.Value = []byte{}
				str.holes = append(str.holes, holeRec{rec: i, s: &valueStream{rc: io.NopCloser(bytes.NewReader(v)),
					size: int64(len(v)), crc: crc32c.Checksum(v), stop: func() {}}})
			}
			str.recs = append(str.recs, s)
		}
		want, err := mem.encode(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(str.holes) == 0 {
			return
		}
		set, holes, err := str.encodeStreamed(context.Background(), nil, "t", 0)
		if err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		from := int64(0)
		for _, h := range holes {
			got.Write(set[from:h.At])
			if _, err := h.Stream(&got); err != nil {
				t.Fatal(err)
			}
			from = h.At
		}
		got.Write(set[from:])
		if !bytes.Equal(got.Bytes(), want) {
			t.Fatalf("streamed batch (%d bytes) differs from the in-memory one (%d bytes)", got.Len(), len(want))
		}
	})
}
