package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/crc32"
	"runtime"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/largemessage"
)

// fuzzChain is every built-in interceptor on every topic, with a small
// memory budget and small decompression bounds, so that the fuzzer reaches
// their limits.
func fuzzChain(tb testing.TB) *interceptor.Chain {
	tb.Helper()
	ch, err := interceptor.Build(context.Background(), []interceptor.Spec{
		{Name: "validate-json", Config: map[string]string{interceptor.KeyTopicPattern: "json.*", "side": "both"}},
		{Name: "redact", Config: map[string]string{interceptor.KeyTopicPattern: "json.*|red.*", "redact.fields": "a,b.#.c", "side": "both"}},
		{Name: "large-message", Config: map[string]string{largemessage.KeyStoreURL: "mem://fuzz-proxy", largemessage.KeyThreshold: "64"}},
	}, interceptor.Options{Timeout: 2 * time.Second, Memory: interceptor.NewMemory(256 << 20),
		BatchDecompressedMax: 1 << 20, RequestDecompressedMax: 4 << 20,
		TopicName: func(id [16]byte) (string, bool) { return "red-by-id", id[0]&1 == 0 }})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ch.Close() })
	return ch
}

// seedBatch is a valid magic v2 batch of values, compressed with codec
// (0 none, 4 zstd).
func seedBatch(codec int16, values ...string) []byte {
	var recs []byte
	for i, v := range values {
		r := kmsg.Record{OffsetDelta: int32(i), Value: []byte(v)}
		body := r.AppendTo(nil)[1:]
		recs = binary.AppendVarint(recs, int64(len(body)))
		recs = append(recs, body...)
	}
	return seedBatchOf(codec, int32(len(values)), recs)
}

// seedBatchOf wraps recs, the records section of n records (zstd-compressed
// here when codec is 4), in a magic v2 batch with its CRC-32C.
func seedBatchOf(codec int16, n int32, recs []byte) []byte {
	if codec == 4 {
		enc, _ := zstd.NewWriter(nil)
		recs = enc.EncodeAll(recs, nil)
	}
	h := kmsg.RecordBatch{Magic: 2, Attributes: codec, LastOffsetDelta: n - 1, ProducerID: -1,
		ProducerEpoch: -1, FirstSequence: -1, NumRecords: n, Records: recs, PartitionLeaderEpoch: -1}
	h.Length = int32(49 + len(recs))
	b := h.AppendTo(nil)
	binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)))
	return b
}

// FuzzProduceRequest feeds arbitrary Produce request bodies (any version)
// through the proxy's request path: decode, the interceptor chain, encode.
// No input may panic; what is forwarded decodes again; the memory budget
// is all given back.
func FuzzProduceRequest(f *testing.F) {
	for _, v := range []int16{3, 7, 9, 11, 12, 13} {
		req := kmsg.NewPtrProduceRequest()
		req.Version = v
		req.Acks = -1
		for _, topic := range []string{"json", "red", "lm"} {
			rt := kmsg.NewProduceRequestTopic()
			rt.Topic = topic
			rp := kmsg.NewProduceRequestTopicPartition()
			rp.Records = seedBatch(int16(v%2)*4, `{"a":1,"b":[{"c":2}]}`, string(bytes.Repeat([]byte("x"), 200)))
			rt.Partitions = append(rt.Partitions, rp)
			req.Topics = append(req.Topics, rt)
		}
		f.Add(v, req.AppendTo(nil))
		// Records every interceptor leaves as they are (valid JSON
		// without a redacted field, values under large-message's
		// threshold): the batches are read in place and forwarded as
		// their bytes.
		req.Topics = req.Topics[:0]
		for _, topic := range []string{"json", "red", "lm"} {
			rt := kmsg.NewProduceRequestTopic()
			rt.Topic = topic
			rp := kmsg.NewProduceRequestTopicPartition()
			rp.Records = seedBatch(int16(v%2)*4, `{"x":1,"b":[{"d":2}]}`, `[]`)
			rt.Partitions = append(rt.Partitions, rp)
			req.Topics = append(req.Topics, rt)
		}
		f.Add(v, req.AppendTo(nil))
	}
	ch := fuzzChain(f)
	f.Fuzz(func(t *testing.T, version int16, body []byte) { fuzzProduceRequest(t, ch, version, body) })
}

// fuzzProduceRequest is one FuzzProduceRequest input.
func fuzzProduceRequest(t testing.TB, ch *interceptor.Chain, version int16, body []byte) {
	if version < 0 || version > 13 {
		return
	}
	req, err := decodeProduce(version, body)
	if err != nil {
		return
	}
	var out interceptor.ProduceOutcome
	watchdog(t, 20*time.Second, func() {
		out = ch.InterceptProduce(context.Background(), req, func(_ context.Context, topics []string) map[string]interceptor.TopicLimit {
			m := map[string]interceptor.TopicLimit{}
			for _, tp := range topics {
				m[tp] = interceptor.TopicLimit{MaxMessageBytes: 4096, Compression: []string{"", "zstd", "uncompressed"}[len(tp)%3]}
			}
			return m
		})
	})
	frame := requestFrame([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff}, req)
	out.Release()
	if _, err := decodeProduce(version, frame[14:]); err != nil && out.Forward {
		t.Fatalf("the forwarded request does not decode: %v", err)
	}
	if n := ch.Memory().InUse(); n != 0 {
		// Abandoned workers give theirs back when they end.
		deadline := time.Now().Add(5 * time.Second)
		for ch.Memory().InUse() != 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := ch.Memory().InUse(); n != 0 {
			t.Fatalf("%d bytes of the memory budget were not given back", n)
		}
	}
}

// FuzzFetchResponse feeds arbitrary Fetch response bodies through the fetch
// interceptors with the consumer's limits: no panic, the budget given back,
// the rewritten response encodes and decodes.
func FuzzFetchResponse(f *testing.F) {
	for _, v := range []int16{4, 11, 12, 13, 16} {
		resp := kmsg.NewPtrFetchResponse()
		resp.Version = v
		for _, topic := range []string{"json", "red", "lm"} {
			rt := kmsg.NewFetchResponseTopic()
			rt.Topic = topic
			rp := kmsg.NewFetchResponseTopicPartition()
			rp.RecordBatches = append(seedBatch(0, `{"a":"x"}`), seedBatch(4, "y", "z")...)
			rt.Partitions = append(rt.Partitions, rp)
			resp.Topics = append(resp.Topics, rt)
		}
		f.Add(v, resp.AppendTo(nil), int32(1<<20), int32(1000))
		// Records every interceptor leaves as they are (read in place).
		for i := range resp.Topics {
			resp.Topics[i].Partitions[0].RecordBatches = append(seedBatch(0, `{"x":"y"}`), seedBatch(4, `{}`, `[1]`)...)
		}
		f.Add(v, resp.AppendTo(nil), int32(1<<20), int32(1048572)) // fetch offset 1048572 % 7 = 0
	}
	ch := fuzzChain(f)
	f.Fuzz(func(t *testing.T, version int16, body []byte, maxBytes, partMax int32) {
		fuzzFetchResponse(t, ch, version, body, maxBytes, partMax)
	})
}

// fuzzFetchResponse is one FuzzFetchResponse input.
func fuzzFetchResponse(t testing.TB, ch *interceptor.Chain, version int16, body []byte, maxBytes, partMax int32) {
	if version < 4 || version > 16 {
		return
	}
	resp := kmsg.NewPtrFetchResponse()
	resp.SetVersion(version)
	if resp.ReadFrom(body) != nil {
		return
	}
	limits := interceptor.FetchLimits{MaxBytes: maxBytes, PartitionMaxBytes: map[interceptor.FetchPartition]int32{},
		FetchOffset: map[interceptor.FetchPartition]int64{}}
	for _, tp := range resp.Topics {
		for _, p := range tp.Partitions {
			k := interceptor.FetchPartition{Topic: tp.Topic, TopicID: tp.TopicID, Partition: p.Partition}
			limits.PartitionMaxBytes[k] = partMax
			limits.FetchOffset[k] = int64(partMax % 7)
		}
	}
	var out interceptor.FetchOutcome
	watchdog(t, 20*time.Second, func() { out = ch.InterceptFetchLimited(context.Background(), resp, limits) })
	enc := resp.AppendTo(nil)
	out.Release()
	again := kmsg.NewPtrFetchResponse()
	again.SetVersion(version)
	if err := again.ReadFrom(enc); err != nil {
		t.Fatalf("the rewritten response does not decode: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for ch.Memory().InUse() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := ch.Memory().InUse(); n != 0 {
		t.Fatalf("%d bytes of the memory budget were not given back", n)
	}
}

// watchdog runs f and fails with every goroutine's stack if it does not
// return within d (a hang is a finding too).
func watchdog(t testing.TB, d time.Duration, f func()) {
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(d):
		buf := make([]byte, 1<<20)
		t.Fatalf("no return within %s:\n%s", d, buf[:runtime.Stack(buf, true)])
	}
}
