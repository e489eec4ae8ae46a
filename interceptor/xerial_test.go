package interceptor

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/crc32"
	"testing"

	"github.com/klauspost/compress/s2"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The Java producer frames snappy with xerial's stream format (a magic
// header, then length-prefixed snappy blocks). Such a batch is read, and a
// changed one is written back as snappy that franz-go's consumer reads.
func TestXerialSnappyBatch(t *testing.T) {
	// The records section of an uncompressed batch, framed as xerial does.
	plain := plainBatch(t, 0, -1, "one", "two", "three")
	recs := plain[batchHeaderLen:]
	framed := []byte{0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0, 0, 0, 0, 1, 0, 0, 0, 1}
	for len(recs) > 0 {
		chunk := recs[:min(len(recs), 8)] // several blocks
		recs = recs[len(chunk):]
		blk := s2.EncodeSnappy(nil, chunk)
		framed = binary.BigEndian.AppendUint32(framed, uint32(len(blk)))
		framed = append(framed, blk...)
	}
	var h kmsg.RecordBatch
	if err := h.ReadFrom(plain); err != nil {
		t.Fatal(err)
	}
	h.Attributes = 2
	h.Records = framed
	h.Length = int32(49 + len(framed))
	b := h.AppendTo(nil)
	binary.BigEndian.PutUint32(b[crcOffset:], crc32.Checksum(b[attrOffset:], castagnoli))

	ch := NewChain([]Instance{{Produce: icpt(t, "upper", "t", upper)}}, Options{})
	req := buildRequest(t, map[string][]byte{"t": b})
	if out := ch.InterceptProduce(context.Background(), req, nil); !out.Forward || out.Rewritten != 1 {
		t.Fatalf("outcome %+v", out)
	}
	sent := req.Topics[0].Partitions[0].Records
	if codecName(checkBatches(t, sent)[0].Attributes) != "snappy" {
		t.Fatal("codec changed")
	}
	resp := fetchResponse(map[string][]byte{"t": sent})
	got := records(t, "t", &resp.Topics[0].Partitions[0])
	want := []string{"ONE", "TWO", "THREE"}
	if len(got) != 3 {
		t.Fatalf("%d records", len(got))
	}
	for i, r := range got {
		if !bytes.Equal(r.Value, []byte(want[i])) {
			t.Fatalf("record %d: %q", i, r.Value)
		}
	}
}
