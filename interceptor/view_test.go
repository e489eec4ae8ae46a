package interceptor

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"
)

// Issue 19: a batch whose records all stay as they came goes out as the
// very bytes that came in (same array: nothing encoded, compressed or
// copied), in every codec, on produce and on fetch, with an interceptor
// that reads every field.
func TestInPlaceUnchangedBatchKeepsItsBytes(t *testing.T) {
	look := func(_ context.Context, r *Record) error {
		if len(r.Value) == 0 || r.Offset < 0 || len(r.Headers) != 0 {
			return errTest
		}
		return nil
	}
	ch := NewChain([]Instance{{Produce: icpt(t, "look", "t", look), Fetch: icpt(t, "look", "t", look)}}, Options{})
	vals := benchJSONValues(50, 300)
	for codec := int16(0); codec <= 4; codec++ {
		t.Run(codecNames[codec], func(t *testing.T) {
			batch := plainBatch(t, codec, -1, vals...)
			set := append(bytes.Clone(batch), plainBatch(t, codec, 7, vals[:3]...)...)
			req := buildRequest(t, map[string][]byte{"t": set})
			out := ch.InterceptProduce(context.Background(), req, allTopics(1<<20))
			defer out.Release()
			got := req.Topics[0].Partitions[0].Records
			if !out.Forward || out.Rewritten != 0 || len(got) != len(set) || &got[0] != &set[0] {
				t.Fatalf("produce: forward %v, rewritten %d, answered %v: the batches were not forwarded as they came", out.Forward, out.Rewritten, out.Answered)
			}
			resp := fetchResponse(map[string][]byte{"t": set})
			fo := ch.InterceptFetch(context.Background(), resp)
			defer fo.Release()
			got = resp.Topics[0].Partitions[0].RecordBatches
			if fo.Rewritten != 0 || len(fo.Failed) != 0 || len(got) != len(set) || &got[0] != &set[0] {
				t.Fatalf("fetch: rewritten %d, failed %v: the batches were not returned as they came", fo.Rewritten, fo.Failed)
			}
		})
	}
}

// A record that changes among unchanged ones: the batch is encoded once,
// the changed record from its fields and the others as the bytes they came
// as; every record reads back as it should, in every codec, on both sides.
func TestInPlaceMixedBatch(t *testing.T) {
	fn := func(_ context.Context, r *Record) error {
		if bytes.Equal(r.Value, []byte("change")) {
			r.Value = []byte("changed")
			r.Headers = append(r.Headers, Header{Key: "h", Value: []byte("v")})
		}
		return nil
	}
	ch := NewChain([]Instance{{Produce: icpt(t, "f", "t", fn), Fetch: icpt(t, "f", "t", fn)}}, Options{})
	vals := []string{"a", "bb", "change", "ccc", "change", "dddd"}
	want := []string{"a", "bb", "changed", "ccc", "changed", "dddd"}
	check := func(t *testing.T, side string, b []byte) {
		t.Helper()
		checkBatches(t, b)
		d, err := decodeBatch(context.Background(), nil, b)
		if err != nil {
			t.Fatal(err)
		}
		if len(d.recs) != len(want) {
			t.Fatalf("%s: %d records, want %d", side, len(d.recs), len(want))
		}
		for i, r := range d.recs {
			hs := len(r.Headers)
			if string(r.Value) != want[i] || r.OffsetDelta != int32(i) || r.TimestampDelta64 != int64(i) || (hs == 1) != (want[i] == "changed") {
				t.Fatalf("%s: record %d is %q (offset delta %d, timestamp delta %d, %d headers)", side, i, r.Value, r.OffsetDelta, r.TimestampDelta64, hs)
			}
		}
	}
	for codec := int16(0); codec <= 4; codec++ {
		t.Run(codecNames[codec], func(t *testing.T) {
			batch := plainBatch(t, codec, -1, vals...)
			req := buildRequest(t, map[string][]byte{"t": bytes.Clone(batch)})
			out := ch.InterceptProduce(context.Background(), req, allTopics(1<<20))
			defer out.Release()
			if !out.Forward || out.Rewritten != 1 {
				t.Fatalf("produce: forward %v, rewritten %d, answered %v", out.Forward, out.Rewritten, out.Answered)
			}
			check(t, "produce", req.Topics[0].Partitions[0].Records)
			resp := fetchResponse(map[string][]byte{"t": bytes.Clone(batch)})
			fo := ch.InterceptFetch(context.Background(), resp)
			defer fo.Release()
			if fo.Rewritten != 1 || len(fo.Failed) != 0 {
				t.Fatalf("fetch: rewritten %d, failed %v", fo.Rewritten, fo.Failed)
			}
			check(t, "fetch", resp.Topics[0].Partitions[0].RecordBatches)
		})
	}
}

// No allocation per record on the path where nothing changes: the
// allocations of a produce request and a fetch response of one batch do
// not grow with the batch's records (large-message with nothing to
// offload, validate-json, a no-op), uncompressed and compressed.
func TestInPlaceNoAllocationPerRecord(t *testing.T) {
	lm := newBuiltin(t, "large-message", map[string]string{"large.message.payload.store.url": "mem://inplace-allocs"})
	t.Cleanup(func() { _ = lm.Close() })
	vj := newBuiltin(t, "validate-json", map[string]string{KeySide: "both"})
	nothing := func(context.Context, *Record) error { return nil }
	for _, tc := range []struct {
		name string
		in   Instance
	}{{"no-op", Instance{Produce: icpt(t, "x", "t", nothing), Fetch: icpt(t, "x", "t", nothing)}}, {"large-message", lm}, {"validate-json", vj}} {
		for _, codec := range []int16{0, 3, 4} {
			t.Run(fmt.Sprintf("%s/%s", tc.name, codecNames[codec]), func(t *testing.T) {
				ch := NewChain([]Instance{tc.in}, Options{})
				allocs := func(n int) (float64, float64) {
					batch := plainBatch(t, codec, -1, benchJSONValues(n, 200)...)
					p := testing.AllocsPerRun(20, func() {
						req := buildRequest(t, map[string][]byte{"t": batch})
						out := ch.InterceptProduce(context.Background(), req, allTopics(1<<20))
						if !out.Forward || out.Rewritten != 0 {
							t.Fatalf("produce: forward %v, rewritten %d, answered %v", out.Forward, out.Rewritten, out.Answered)
						}
						out.Release()
					})
					f := testing.AllocsPerRun(20, func() {
						resp := fetchResponse(map[string][]byte{"t": batch})
						out := ch.InterceptFetch(context.Background(), resp)
						if out.Rewritten != 0 || len(out.Failed) != 0 {
							t.Fatalf("fetch: rewritten %d, failed %v", out.Rewritten, out.Failed)
						}
						out.Release()
					})
					return p, f
				}
				p10, f10 := allocs(10)
				p1000, f1000 := allocs(1000)
				// A few allocations more for the larger batch are the
				// pool's buffers growing once; one per record would be
				// 990 more.
				if p1000-p10 > 10 || f1000-f10 > 10 {
					t.Fatalf("allocations per request: produce %.0f for 10 records, %.0f for 1000; fetch %.0f and %.0f", p10, p1000, f10, f1000)
				}
			})
		}
	}
}

// The buffers kept for the next batch are bounded and part of the memory
// budget: idle, they are counted as reclaimable (not in use), at most
// poolMax of the budget, and a charge that needs their room gets it.
func TestInPlacePoolWithinBudget(t *testing.T) {
	const limit = 32 << 20
	mem := NewMemory(limit)
	ch := NewChain([]Instance{{Produce: icpt(t, "x", "t", func(context.Context, *Record) error { return nil })}}, Options{Memory: mem})
	batch := plainBatch(t, 4, -1, benchJSONValues(1000, 500)...) // 500 KB decompressed
	for range 5 {
		req := buildRequest(t, map[string][]byte{"t": batch, "u": batch})
		req.Topics[1].Topic = "t" // two partitions of t, in parallel
		req.Topics[1].Partitions[0].Partition = 1
		out := ch.InterceptProduce(context.Background(), req, allTopics(1<<20))
		if !out.Forward || out.Rewritten != 0 {
			t.Fatalf("forward %v, rewritten %d, answered %v", out.Forward, out.Rewritten, out.Answered)
		}
		out.Release()
	}
	if n := mem.InUse(); n != 0 {
		t.Fatalf("%d bytes in use after the requests", n)
	}
	idle := mem.Reclaimable()
	if idle <= 0 || idle > poolMax(limit) {
		t.Fatalf("%d idle bytes kept, want some and at most %d", idle, poolMax(limit))
	}
	// The whole budget at once: the idle buffers are given up for it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := mem.Take(ctx, limit); err != nil {
		t.Fatalf("the whole budget with %d idle bytes pooled: %v", idle, err)
	}
	if n := mem.Reclaimable(); n != 0 {
		t.Fatalf("%d idle bytes still kept after a charge of the whole budget", n)
	}
	mem.Give(limit)
}

// TryTake (ranged download buffers, wasm memory, fetch sessions) gets the
// room idle batch buffers hold, as a waiting charge does.
func TestInPlacePoolGivesWayToTryTake(t *testing.T) {
	const limit = 32 << 20
	mem := NewMemory(limit)
	ch := NewChain([]Instance{{Produce: icpt(t, "x", "t", func(context.Context, *Record) error { return nil })}}, Options{Memory: mem})
	req := buildRequest(t, map[string][]byte{"t": plainBatch(t, 4, -1, benchJSONValues(1000, 500)...)})
	out := ch.InterceptProduce(context.Background(), req, allTopics(1<<20))
	out.Release()
	if mem.Reclaimable() == 0 {
		t.Fatal("no idle buffer kept")
	}
	if !mem.TryTake(limit) {
		t.Fatalf("TryTake of the whole budget failed with %d idle bytes pooled", mem.Reclaimable())
	}
	mem.Give(limit)
}

// The buffer fields are written into (Record.buffer, encrypt's) is reused
// from batch to batch: once a batch's shape has been seen, batches like it
// add no chunk, even when the first record's field was smaller than the
// rest (encrypt's first seal of a topic, before the wrapped key's length is
// known); what it charged is given back; and the fields hold what was
// written into them.
func TestFieldBufferReused(t *testing.T) {
	first := true
	fn := func(ctx context.Context, r *Record) error {
		n := 1100
		if first {
			n, first = 1000, false
		}
		b, err := r.buffer(ctx, n)
		if err != nil {
			return err
		}
		for i := range b {
			b[i] = byte(r.Offset)
		}
		r.Value = b
		return nil
	}
	mem := NewMemory(64 << 20)
	ch := NewChain([]Instance{{Produce: icpt(t, "f", "t", fn)}}, Options{Memory: mem})
	batch := plainBatch(t, 0, -1, benchJSONValues(15, 1024)...)
	pooled := func() (n int64) {
		mem.pool.mu.Lock()
		defer mem.pool.mu.Unlock()
		for _, s := range mem.pool.free {
			n += s.outsSize()
		}
		return n
	}
	var sizes []int64
	for range 8 {
		req := buildRequest(t, map[string][]byte{"t": batch})
		out := ch.InterceptProduce(context.Background(), req, allTopics(1<<20))
		if len(out.Answered) != 0 {
			t.Fatalf("answered %+v", out.Answered)
		}
		d, err := decodeBatch(context.Background(), nil, req.Topics[0].Partitions[0].Records)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range d.recs {
			if len(r.Value) < 1000 || r.Value[0] != byte(i) || r.Value[len(r.Value)-1] != byte(i) {
				t.Fatalf("record %d: %d bytes of %d, want its index", i, len(r.Value), r.Value[0])
			}
		}
		out.Release()
		sizes = append(sizes, pooled())
	}
	for _, n := range sizes[2:] {
		if n != sizes[1] {
			t.Fatalf("pooled field buffers by batch: %v bytes: they keep changing", sizes)
		}
	}
	if sizes[1] < 15*1100 || sizes[1] > 4*15*1100 {
		t.Errorf("pooled field buffers of %d bytes for batches needing %d", sizes[1], 15*1100)
	}
	if mem.InUse() != 0 {
		t.Errorf("%d bytes still charged", mem.InUse())
	}
}
