package interceptor

import (
	"bytes"
	"context"
	"errors"
	"net/url"
	"os"
	"testing"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// streamSetup is a chain of large-message streaming values over 1 MiB, and
// a batch (codec from attrs) of a small record, a 3 MiB value and a 2 MiB
// value with an offloaded 1.5 MiB key, offloaded by the library's
// Serializer; it returns the payloads' paths (by value length).
func streamSetup(t *testing.T, attrs int16) (*Chain, []byte, map[int]string, [][]byte) {
	t.Helper()
	in, store := lmSetup(t, map[string]string{KeyStreamThreshold: "1048576"})
	ch := NewChain([]Instance{in}, Options{})
	ser := largemessage.NewSerializer(store, largemessage.Codec{Type: "none"})
	values := [][]byte{[]byte("small"), randomBytes(1, 3<<20), randomBytes(2, 2<<20)}
	d := &decodedBatch{hdr: kmsg.RecordBatch{Magic: 2, Attributes: attrs, ProducerID: -1, ProducerEpoch: -1,
		FirstSequence: -1, FirstOffset: 40, FirstTimestamp: 1700000000000, MaxTimestamp: 1700000000002,
		LastOffsetDelta: 2, PartitionLeaderEpoch: -1}}
	paths := map[int]string{}
	for i, v := range values {
		rec := &kgo.Record{Topic: "big", Value: v, Headers: []kgo.RecordHeader{{Key: "app", Value: []byte{byte(i)}},
			{Key: "empty", Value: []byte{}}, {Key: "null"}}}
		if i == 2 {
			rec.Key = randomBytes(3, 3<<19)
		}
		lim := largemessage.DeriveLimits(1<<20, 1<<20, 0)
		if _, err := ser.Offload(context.Background(), rec, lim); err != nil {
			t.Fatal(err)
		}
		if largemessage.IsOffloaded(rec) {
			ref, err := largemessage.DecodeReference(rec.Value)
			if err != nil {
				t.Fatal(err)
			}
			paths[len(v)] = ref.FullPayloadPath
		}
		kr := kmsg.Record{OffsetDelta: int32(i), TimestampDelta64: int64(i), Key: rec.Key, Value: rec.Value}
		for _, h := range rec.Headers {
			kr.Headers = append(kr.Headers, kmsg.Header{Key: h.Key, Value: h.Value})
		}
		d.recs = append(d.recs, kr)
	}
	batch, err := d.encode(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return ch, batch, paths, values
}

// fill returns set with its holes filled by streaming them.
func fill(t *testing.T, set []byte, holes []*Hole) ([]byte, error) {
	t.Helper()
	var out bytes.Buffer
	from := int64(0)
	for _, h := range holes {
		out.Write(set[from:h.At])
		if _, err := h.Stream(&out); err != nil {
			return out.Bytes(), err
		}
		from = h.At
	}
	out.Write(set[from:])
	return out.Bytes(), nil
}

// TestStreamedFetchSameBytes: an uncompressed batch with two streamed
// values, written by filling its holes, is byte for byte the batch the
// in-memory path writes (lengths, CRC-32C); a compressed one goes out
// uncompressed with the same records.
func TestStreamedFetchSameBytes(t *testing.T) {
	ctx := context.Background()
	ch, batch, _, values := streamSetup(t, 0)
	whole := fetchResponse(map[string][]byte{"big": batch})
	outWhole := ch.InterceptFetchLimited(ctx, whole, FetchLimits{})
	defer outWhole.Release()
	if len(outWhole.Failed) > 0 || len(outWhole.Streamed) > 0 {
		t.Fatalf("in memory: failed %v, streamed %d", outWhole.Failed, len(outWhole.Streamed))
	}
	want := whole.Topics[0].Partitions[0].RecordBatches

	streamed := fetchResponse(map[string][]byte{"big": batch})
	out := ch.InterceptFetchLimited(ctx, streamed, FetchLimits{Stream: true})
	defer out.Release()
	if len(out.Failed) > 0 || len(out.Streamed) != 1 || len(out.Streamed[0].Holes) != 2 {
		t.Fatalf("streamed: failed %v, streamed %+v", out.Failed, out.Streamed)
	}
	set := streamed.Topics[0].Partitions[0].RecordBatches
	if int64(len(set)) > 1<<20+1<<19+64<<10 { // the 1.5 MiB key is put back, not the values
		t.Errorf("the streamed record set holds %d bytes: payloads were put back", len(set))
	}
	if got := out.Streamed[0].Len(); got != int64(len(want)) {
		t.Errorf("streamed set length %d, in memory %d", got, len(want))
	}
	got, err := fill(t, set, out.Streamed[0].Holes)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the streamed batch (%d bytes) differs from the in-memory one (%d bytes)", len(got), len(want))
	}
	checkValues(t, got, values, 0)

	// Compressed source: the batch goes out uncompressed.
	ch, batch, _, values = streamSetup(t, 4) // zstd
	streamed = fetchResponse(map[string][]byte{"big": batch})
	out = ch.InterceptFetchLimited(ctx, streamed, FetchLimits{Stream: true})
	defer out.Release()
	if len(out.Failed) > 0 || len(out.Streamed) != 1 {
		t.Fatalf("zstd: failed %v, streamed %d", out.Failed, len(out.Streamed))
	}
	got, err = fill(t, streamed.Topics[0].Partitions[0].RecordBatches, out.Streamed[0].Holes)
	if err != nil {
		t.Fatal(err)
	}
	checkValues(t, got, values, 0)
}

// checkValues decodes set (CRC checked) and compares its records' values
// with values, with no Ferry headers left.
func checkValues(t *testing.T, set []byte, values [][]byte, codec int16) {
	t.Helper()
	raw, rest, ok := splitBatch(set)
	if !ok || len(rest) != 0 {
		t.Fatalf("not one whole batch: %d bytes, %d left", len(set), len(rest))
	}
	d, err := scanBatch(context.Background(), nil, raw)
	if err != nil {
		t.Fatal(err)
	}
	if c := d.hdr.Attributes & attrCodecMask; c != codec {
		t.Errorf("codec %d, want %d", c, codec)
	}
	if len(d.views) != len(values) {
		t.Fatalf("%d records, want %d", len(d.views), len(values))
	}
	for i, v := range d.views {
		if !bytes.Equal(v.value, values[i]) {
			t.Errorf("record %d: value of %d bytes differs from the %d produced", i, len(v.value), len(values[i]))
		}
		hs := d.headersOf(i)
		for _, h := range hs {
			if h.Key != "app" && h.Key != "empty" && h.Key != "null" {
				t.Errorf("record %d: header %s left", i, h.Key)
			}
		}
		// An empty header value stays empty, a null one null.
		if len(hs) != 3 || hs[1].Value == nil || len(hs[1].Value) != 0 || hs[2].Value != nil {
			t.Errorf("record %d: headers %q, want app, empty (not null), null", i, hs)
		}
	}
}

// TestStreamedFetchCorruptObject: an object changed or cut short in the
// store fails the stream before its last chunk is written, so the bytes
// written never make the whole batch, and the record's next fetch is
// answered CORRUPT_MESSAGE before anything is committed; a missing object
// fails the partition before anything is committed.
func TestStreamedFetchCorruptObject(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		change func(file string)
	}{
		{"byte changed", func(file string) {
			b, _ := os.ReadFile(file)
			b[len(b)/2] ^= 1
			os.WriteFile(file, b, 0o644)
		}},
		{"truncated", func(file string) { os.Truncate(file, 1<<20) }},
		{"longer", func(file string) {
			f, _ := os.OpenFile(file, os.O_APPEND|os.O_WRONLY, 0)
			f.Write([]byte("more"))
			f.Close()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch, batch, paths, _ := streamSetup(t, 0)
			u, err := url.Parse(paths[3<<20])
			if err != nil {
				t.Fatal(err)
			}
			tc.change(u.Path)
			resp := fetchResponse(map[string][]byte{"big": batch})
			out := ch.InterceptFetchLimited(ctx, resp, FetchLimits{Stream: true})
			defer out.Release()
			if len(out.Streamed) != 1 {
				t.Fatalf("streamed %d sets, failed %v", len(out.Streamed), out.Failed)
			}
			set := resp.Topics[0].Partitions[0].RecordBatches
			got, err := fill(t, set, out.Streamed[0].Holes)
			var re *largemessage.RecordError
			if !errors.Is(err, ErrStreamedPayload) && !errors.As(err, &re) {
				t.Fatalf("stream error %v, want ErrStreamedPayload or a *RecordError", err)
			}
			if int64(len(got)) >= out.Streamed[0].Len() {
				t.Fatalf("%d bytes written of a %d-byte set: the whole batch went out", len(got), out.Streamed[0].Len())
			}
			if _, _, complete := splitBatch(got); complete {
				t.Fatal("the bytes written hold a complete batch")
			}
			// Fetched again, the record is answered CORRUPT_MESSAGE before
			// anything is committed, where its stream was cut again: the
			// client then has an error to show.
			resp = fetchResponse(map[string][]byte{"big": batch})
			again := ch.InterceptFetchLimited(ctx, resp, FetchLimits{Stream: true})
			defer again.Release()
			p := resp.Topics[0].Partitions[0]
			if len(again.Streamed) != 0 || len(again.Failed) != 1 || !errors.Is(again.Failed[0].Err, largemessage.ErrDigestMismatch) ||
				p.ErrorCode != kerr.CorruptMessage.Code && !again.Failed[0].Partial {
				t.Fatalf("fetched again: streamed %d, failed %+v, error code %d", len(again.Streamed), again.Failed, p.ErrorCode)
			}
		})
	}
	t.Run("missing", func(t *testing.T) {
		ch, batch, paths, _ := streamSetup(t, 0)
		u, _ := url.Parse(paths[3<<20])
		os.Remove(u.Path)
		resp := fetchResponse(map[string][]byte{"big": batch})
		out := ch.InterceptFetchLimited(ctx, resp, FetchLimits{Stream: true})
		defer out.Release()
		p := resp.Topics[0].Partitions[0]
		if len(out.Failed) != 1 || len(out.Streamed) != 0 {
			t.Fatalf("failed %v, streamed %d", out.Failed, len(out.Streamed))
		}
		// The record before it goes out (Partial), or none with the error.
		if p.ErrorCode != kerr.KafkaStorageError.Code && !out.Failed[0].Partial {
			t.Fatalf("error code %d, partial %v", p.ErrorCode, out.Failed[0].Partial)
		}
	})
}

// TestStreamedFetchBelowThresholdOrWithoutCRC: values at or below the
// threshold, and references without the CRC header (older writers), are
// put back in memory.
func TestStreamedFetchBelowThresholdOrWithoutCRC(t *testing.T) {
	ctx := context.Background()
	in, store := lmSetup(t, map[string]string{KeyStreamThreshold: "4194304"})
	ch := NewChain([]Instance{in}, Options{})
	ser := largemessage.NewSerializer(store, largemessage.Codec{Type: "none"})
	values := [][]byte{randomBytes(4, 3<<20), randomBytes(5, 5<<20)}
	d := &decodedBatch{hdr: kmsg.RecordBatch{Magic: 2, ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1,
		FirstTimestamp: 1700000000000, MaxTimestamp: 1700000000001, LastOffsetDelta: 1, PartitionLeaderEpoch: -1}}
	for i, v := range values {
		rec := &kgo.Record{Topic: "big", Value: v}
		if _, err := ser.Offload(ctx, rec, largemessage.DeriveLimits(1<<20, 1<<20, 0)); err != nil {
			t.Fatal(err)
		}
		kr := kmsg.Record{OffsetDelta: int32(i), Value: rec.Value}
		for _, h := range rec.Headers {
			if i == 1 && h.Key == largemessage.HeaderPayloadCRC32C {
				continue // the 5 MiB one: as an older writer wrote it
			}
			kr.Headers = append(kr.Headers, kmsg.Header{Key: h.Key, Value: h.Value})
		}
		d.recs = append(d.recs, kr)
	}
	batch, err := d.encode(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp := fetchResponse(map[string][]byte{"big": batch})
	out := ch.InterceptFetchLimited(ctx, resp, FetchLimits{Stream: true})
	defer out.Release()
	if len(out.Failed) > 0 || len(out.Streamed) != 0 {
		t.Fatalf("failed %v, streamed %d sets", out.Failed, len(out.Streamed))
	}
	raw, _, _ := splitBatch(resp.Topics[0].Partitions[0].RecordBatches)
	sd, err := scanBatch(ctx, nil, raw)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range sd.views {
		if !bytes.Equal(v.value, values[i]) {
			t.Errorf("record %d not put back", i)
		}
	}
}

// The payload cache is not filled by a streamed download.
func TestStreamedDownloadBypassesCache(t *testing.T) {
	ctx := context.Background()
	mem, err := payloadstore.Open(ctx, "mem://streamcache", payloadstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := payloadstore.Cached(mem, payloadstore.CacheOptions{MaxBytes: 64 << 20}).(*payloadstore.CachedStore)
	defer c.Close()
	v := randomBytes(9, 2<<20)
	resp, err := c.Publish(ctx, "t", payloadstore.BytesPayload(v))
	if err != nil {
		t.Fatal(err)
	}
	p := payloadstore.BytesPayload(v)
	sctx := payloadstore.WithStreaming(payloadstore.WithExpected(ctx, p.Size, p.SHA256[:]), StreamReadAhead)
	for range 2 {
		rc, err := c.Download(sctx, resp.FullPayloadPath)
		if err != nil {
			t.Fatal(err)
		}
		rc.Close()
	}
	if st := c.Stats(); st.Bytes != 0 || st.Fills != 0 || st.Bypassed != 2 {
		t.Fatalf("a streamed download was cached: %+v", st)
	}
}

// A batch passed unchanged before the streamed one (joined through the
// rewritten batch's headroom) and one after it: the holes' offsets are
// the set's, and the set is the in-memory one byte for byte.
func TestStreamedFetchBetweenPassedBatches(t *testing.T) {
	ctx := context.Background()
	ch, batch, _, _ := streamSetup(t, 0)
	before := plainBatch(t, 0, -1, "a", "b")
	after := plainBatch(t, 0, -1, "c")
	binaryPutOffset(after, 43)
	set := append(append(append([]byte{}, before...), batch...), after...)
	whole := fetchResponse(map[string][]byte{"big": set})
	o1 := ch.InterceptFetchLimited(ctx, whole, FetchLimits{})
	defer o1.Release()
	streamed := fetchResponse(map[string][]byte{"big": set})
	o2 := ch.InterceptFetchLimited(ctx, streamed, FetchLimits{Stream: true})
	defer o2.Release()
	if len(o1.Failed)+len(o2.Failed) > 0 || len(o2.Streamed) != 1 {
		t.Fatalf("failed %v %v, streamed %d", o1.Failed, o2.Failed, len(o2.Streamed))
	}
	got, err := fill(t, streamed.Topics[0].Partitions[0].RecordBatches, o2.Streamed[0].Holes)
	if err != nil {
		t.Fatal(err)
	}
	if want := whole.Topics[0].Partitions[0].RecordBatches; !bytes.Equal(got, want) {
		t.Fatalf("streamed set of %d bytes differs from the in-memory one of %d", len(got), len(want))
	}
}

func binaryPutOffset(b []byte, off int64) {
	for i := range 8 {
		b[i] = byte(off >> (56 - 8*i))
	}
}

// TestStreamedFetchChargesWriteChunks: a partition with streamed values
// holds, until its response is written, its record set and the two write
// chunks its holes go through (Hole.Stream), charged to the budget; the
// download buffers are given back as they are read; Release gives back
// everything.
func TestStreamedFetchChargesWriteChunks(t *testing.T) {
	ctx := context.Background()
	ch, batch, _, values := streamSetup(t, 0)
	ch.mem = NewMemory(256 << 20)
	resp := fetchResponse(map[string][]byte{"big": batch})
	out := ch.InterceptFetchLimited(ctx, resp, FetchLimits{Stream: true})
	if len(out.Failed) > 0 || len(out.Streamed) != 1 || len(out.Streamed[0].Holes) != 2 {
		out.Release()
		t.Fatalf("failed %v, streamed %+v", out.Failed, out.Streamed)
	}
	set := resp.Topics[0].Partitions[0].RecordBatches
	held := ch.mem.InUse()
	if min := int64(len(set)) + 2*streamChunk; held < min {
		t.Errorf("a streamed partition of %d bytes (without its values) holds %d bytes of the budget, want at least %d (its set and two write chunks)", len(set), held, min)
	}
	got, err := fill(t, set, out.Streamed[0].Holes)
	if err != nil {
		t.Fatal(err)
	}
	checkValues(t, got, values, 0)
	out.Release()
	if n := ch.mem.InUse(); n != 0 {
		t.Fatalf("%d bytes of the budget held after Release", n)
	}

}
