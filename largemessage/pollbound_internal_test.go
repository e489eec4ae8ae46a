package largemessage

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// takeWithin at the limit: records that fill the bound exactly are taken,
// one byte more holds the last back; the first record goes out whatever its
// size; max still counts records.
func TestTakeWithinAtLimit(t *testing.T) {
	recs := func(sizes ...int) []*kgo.Record {
		out := make([]*kgo.Record, len(sizes))
		for i, n := range sizes {
			out[i] = &kgo.Record{Value: make([]byte, n)}
		}
		return out
	}
	size := func(r *kgo.Record) int64 { return int64(len(r.Value)) }
	for _, tc := range []struct {
		name  string
		sizes []int
		max   int
		limit int64
		want  int
	}{
		{"exactly at the bound", []int{40, 60, 1}, 0, 100, 2},
		{"one byte over", []int{40, 61, 1}, 0, 100, 1},
		{"first alone over the bound", []int{500, 1}, 0, 100, 1},
		{"max counts", []int{1, 1, 1, 1}, 3, 100, 3},
		{"all fit", []int{10, 10}, 50, 100, 2},
		{"empty", nil, 0, 100, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := takeWithin(recs(tc.sizes...), tc.max, tc.limit, size); got != tc.want {
				t.Fatalf("takeWithin(%v, max %d, limit %d) = %d, want %d", tc.sizes, tc.max, tc.limit, got, tc.want)
			}
		})
	}
}

// The size counted for a record is its resolved size, from the headers,
// before any download.
func TestResolvedSizeFromHeaders(t *testing.T) {
	ref := []byte("a reference of a few bytes")
	r := &kgo.Record{Key: []byte("k"), Value: ref, Headers: sideHeaders(valueSide, 8<<20, [32]byte{}, nil, nil)}
	c := NewConsumer(nil, NewDeserializer(nil, false))
	if got, want := c.resolvedSize(t.Context(), r), int64(1+8<<20); got != want {
		t.Fatalf("resolved size %d, want %d (key plus the size header's payload)", got, want)
	}
}
