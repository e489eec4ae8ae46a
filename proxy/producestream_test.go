package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
)

// smallStreamer is large-message with a stream threshold of 64 bytes (the
// key's own minimum is 1 MiB), so that tests and the fuzzer reach the
// streaming path with small frames.
type smallStreamer struct{ *interceptor.LargeMessage }

func (smallStreamer) StreamThreshold() int64 { return 64 }

// streamEnv is a produceEnv over a fresh mem store with large-message on
// every topic (max.message.bytes maxMessage), and the store.
func streamEnv(t testing.TB, maxMessage int32) (produceEnv, payloadstore.PayloadStore, *interceptor.Chain) {
	t.Helper()
	store := payloadstore.Wrap(payloadstore.NewMemStore(fmt.Sprintf("pstream-%d", rand.Int64()), payloadstore.IDUUID{}),
		payloadstore.Policy{Timeout: 5 * time.Second, CustomMetadataMaxBytes: 128})
	cfg, err := largemessage.ParseConfig(map[string]string{largemessage.KeyStoreURL: "mem://unused"})
	if err != nil {
		t.Fatal(err)
	}
	lm := interceptor.NewLargeMessage(store, cfg, regexp.MustCompile(".*"))
	mem := interceptor.NewMemory(64 << 20)
	names := func(id [16]byte) (string, bool) { return "by-id", id[0] == 1 }
	chain := interceptor.NewChain([]interceptor.Instance{{Produce: lm}}, interceptor.Options{Memory: mem, Timeout: 5 * time.Second, TopicName: names})
	env := produceEnv{ctx: context.Background(), mem: mem,
		streamer: func(string) interceptor.ValueStreamer { return smallStreamer{lm} },
		names:    names,
		limits:   func(string) interceptor.TopicLimit { return interceptor.TopicLimit{MaxMessageBytes: maxMessage} }}
	return env, store, chain
}

// produceFrame is a whole Produce request frame (size prefix, header, body).
func streamedProduceFrame(req *kmsg.ProduceRequest) []byte {
	hdr := kbin.AppendInt16(nil, kmsg.Produce.Int16())
	hdr = kbin.AppendInt16(hdr, req.Version)
	hdr = kbin.AppendInt32(hdr, 7)
	hdr = kbin.AppendNullableString(hdr, nil)
	if req.IsFlexible() {
		hdr = append(hdr, 0)
	}
	return requestFrame(hdr, req)
}

// batchOf is a valid uncompressed magic v2 batch of records.
func batchOf(recs ...kmsg.Record) []byte {
	var raw []byte
	for i, r := range recs {
		r.OffsetDelta = int32(i)
		body := r.AppendTo(nil)[1:] // (after the Length 0 it writes)
		raw = binary.AppendVarint(raw, int64(len(body)))
		raw = append(raw, body...)
	}
	h := kmsg.RecordBatch{Magic: 2, LastOffsetDelta: int32(len(recs) - 1), ProducerID: -1, ProducerEpoch: -1,
		FirstSequence: -1, NumRecords: int32(len(recs)), Records: raw, PartitionLeaderEpoch: -1}
	h.Length = int32(49 + len(raw))
	b := h.AppendTo(nil)
	binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)))
	return b
}

func readStreamFrame(t testing.TB, env produceEnv, frame []byte) ([]byte, func(), *interceptor.Streams, error) {
	t.Helper()
	h, err := ParseRequestHeader(frame[4:])
	if err != nil {
		t.Fatal(err)
	}
	return readProduceFrame(bufio.NewReaderSize(bytes.NewReader(frame), 4096), h, int32(len(frame)-4), env)
}

func storeObjects(t testing.TB, s payloadstore.PayloadStore, topic string) int {
	t.Helper()
	n := 0
	if err := payloadstore.List(context.Background(), s, topic, func(payloadstore.ObjectInfo) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// A large value of an uncompressed batch goes to the store as it is read,
// in every request version; its record comes out as large-message writes
// it (reference, the client's headers less stale Ferry ones, Ferry's
// headers with ferry.payload.crc32c), the rest of the frame as it came;
// the chain defers the streamed value like its own offload.
func TestProduceStream(t *testing.T) {
	for _, version := range []int16{3, 8, 9, 12, 13} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			env, store, chain := streamEnv(t, 4096)
			big := make([]byte, 300_000)
			_, _ = rand.NewChaCha8([32]byte{byte(version)}).Read(big)
			topic := "lm"
			req := kmsg.NewPtrProduceRequest()
			req.Version, req.Acks, req.TimeoutMillis = version, -1, 30000
			rt := kmsg.NewProduceRequestTopic()
			rt.Topic = topic
			if version >= 13 {
				rt.Topic, rt.TopicID, topic = "", [16]byte{1}, "by-id"
			}
			// An empty header value stays empty and a null one null
			// (a consumer tells them apart: librdkafka, the Java client).
			headers := []kmsg.Header{{Key: "h", Value: []byte("1")}, {Key: "empty", Value: []byte{}}, {Key: "null"},
				{Key: largemessage.HeaderPayloadSize, Value: []byte("9")}}
			rp := kmsg.NewProduceRequestTopicPartition()
			rp.Records = batchOf(kmsg.Record{Value: []byte("small")}, kmsg.Record{Key: []byte("k"), Value: big, Headers: headers}, kmsg.Record{Value: []byte("tail")})
			rt.Partitions = append(rt.Partitions, rp)
			req.Topics = append(req.Topics, rt)
			frame, release, streams, err := readStreamFrame(t, env, streamedProduceFrame(req))
			if err != nil {
				t.Fatal(err)
			}
			if streams.Len() != 1 {
				t.Fatalf("%d values streamed, want 1", streams.Len())
			}
			h, _ := ParseRequestHeader(frame[4:])
			got, err := decodeProduce(version, frame[4+h.Len:])
			if err != nil {
				t.Fatal(err)
			}
			batches, recs := decodeBatch(t, got.Topics[0].Partitions[0].Records)
			if len(batches) != 1 || len(recs) != 3 || string(recs[0].Value) != "small" || string(recs[2].Value) != "tail" || string(recs[1].Key) != "k" {
				t.Fatalf("the batch came out as %d batches, %d records", len(batches), len(recs))
			}
			ref, err := largemessage.DecodeReference(recs[1].Value)
			if err != nil {
				t.Fatal(err)
			}
			payload, err := payloadstore.DownloadBytes(context.Background(), store, ref.FullPayloadPath)
			if err != nil || !bytes.Equal(payload, big) {
				t.Fatalf("stored %d bytes, equal %v, %v", len(payload), bytes.Equal(payload, big), err)
			}
			if hs := recs[1].Headers; len(hs) < 3 || hs[1].Key != "empty" || hs[1].Value == nil || len(hs[1].Value) != 0 || hs[2].Key != "null" || hs[2].Value != nil {
				t.Fatalf("headers %q: want empty (non-null) then null as sent", hs)
			}
			want := map[string]string{"h": "1", "empty": "", "null": "", largemessage.HeaderLargeMessage: "true", largemessage.HeaderPayloadSize: "300000",
				largemessage.HeaderPayloadSHA256: fmt.Sprintf("%x", sha256.Sum256(big)),
				largemessage.HeaderPayloadCRC32C: fmt.Sprintf("%08x", crc32.Checksum(big, crc32.MakeTable(crc32.Castagnoli)))}
			if len(recs[1].Headers) != len(want) || recs[1].Headers[0].Key != "h" {
				t.Fatalf("headers %v, want %v", recs[1].Headers, want)
			}
			for _, hd := range recs[1].Headers {
				if want[hd.Key] != string(hd.Value) {
					t.Fatalf("header %s = %q, want %q", hd.Key, hd.Value, want[hd.Key])
				}
			}
			// The chain takes the streamed record as it is, and commits it.
			ctx := interceptor.WithStreams(context.Background(), streams)
			out := chain.InterceptProduce(ctx, got, env.limits2())
			out.Release()
			if !out.Forward || len(out.Answered) != 0 {
				t.Fatalf("chain: forward %v, answered %+v", out.Forward, out.Answered)
			}
			if n := streams.AbortUncommitted(context.Background()); n != 0 {
				t.Fatalf("%d streamed values left uncommitted", n)
			}
			release()
			if n := env.mem.InUse(); n != 0 {
				t.Fatalf("%d bytes of the budget held after release", n)
			}
			if n := storeObjects(t, store, topic); n != 1 {
				t.Fatalf("%d objects in the store, want 1", n)
			}
			// The broker refuses the partition: the object goes.
			resp := kmsg.NewPtrProduceResponse()
			resp.Version = version
			rtp := kmsg.NewProduceResponseTopic()
			rtp.Topic, rtp.TopicID = got.Topics[0].Topic, got.Topics[0].TopicID
			rpp := kmsg.NewProduceResponseTopicPartition()
			rpp.ErrorCode = kerr.InvalidRecord.Code
			rtp.Partitions = append(rtp.Partitions, rpp)
			resp.Topics = append(resp.Topics, rtp)
			out.Refused(context.Background(), resp)
			if n := storeObjects(t, store, topic); n != 0 {
				t.Fatalf("%d objects left after the broker refused the partition", n)
			}
		})
	}
}

// limits2 adapts env.limits to the chain's callback.
func (e produceEnv) limits2() func(context.Context, []string) map[string]interceptor.TopicLimit {
	return func(_ context.Context, topics []string) map[string]interceptor.TopicLimit {
		m := map[string]interceptor.TopicLimit{}
		for _, tp := range topics {
			m[tp] = e.limits(tp)
		}
		return m
	}
}

// decodeBatch decodes the batches of records and their records, checking
// each batch's CRC-32C.
func decodeBatch(t testing.TB, records []byte) ([]kmsg.RecordBatch, []kmsg.Record) {
	t.Helper()
	var bs []kmsg.RecordBatch
	var rs []kmsg.Record
	for len(records) > 0 {
		var b kmsg.RecordBatch
		if err := b.ReadFrom(records); err != nil {
			t.Fatal(err)
		}
		n := 12 + int(b.Length)
		if crc32.Checksum(records[21:n], crc32.MakeTable(crc32.Castagnoli)) != uint32(b.CRC) {
			t.Fatal("the batch's CRC-32C does not match")
		}
		records = records[n:]
		bs = append(bs, b)
		raw := b.Records
		for range b.NumRecords {
			l, m := binary.Varint(raw)
			var r kmsg.Record
			if err := r.ReadFrom(raw[:m+int(l)]); err != nil {
				t.Fatal(err)
			}
			rs = append(rs, r)
			raw = raw[m+int(l):]
		}
	}
	return bs, rs
}

// Hostile frames: a value whose bytes were changed on the way (CRC), a
// record whose length lies, a client that goes away mid-value, a frame
// whose lengths run past it. Nothing streamed is left in the store or
// referenced, and the budget is given back.
func TestProduceStreamHostile(t *testing.T) {
	big := bytes.Repeat([]byte("v"), 100_000)
	good := func() *kmsg.ProduceRequest {
		req := kmsg.NewPtrProduceRequest()
		req.Version, req.Acks = 9, -1
		rt := kmsg.NewProduceRequestTopic()
		rt.Topic = "lm"
		rp := kmsg.NewProduceRequestTopicPartition()
		rp.Records = batchOf(kmsg.Record{Value: big})
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		return req
	}
	valueAt := func(frame []byte) int { return bytes.Index(frame, big[:64]) }

	t.Run("crc", func(t *testing.T) {
		env, store, chain := streamEnv(t, 4096)
		frame := streamedProduceFrame(good())
		frame[valueAt(frame)+500] ^= 1
		wantCorruptNothingLeft(t, env, store, chain, frame)
	})
	t.Run("record length", func(t *testing.T) {
		env, store, chain := streamEnv(t, 4096)
		req := good()
		b := req.Topics[0].Partitions[0].Records
		// The record's headers count claims one header that is not there.
		b[len(b)-1] = 2
		binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)))
		wantCorruptNothingLeft(t, env, store, chain, streamedProduceFrame(req))
	})
	t.Run("client gone mid-value", func(t *testing.T) {
		env, store, _ := streamEnv(t, 4096)
		frame := streamedProduceFrame(good())
		cut := frame[:valueAt(frame)+50_000]
		h, _ := ParseRequestHeader(frame[4:])
		_, _, _, err := readProduceFrame(bufio.NewReader(bytes.NewReader(cut)), h, int32(len(frame)-4), env)
		if err == nil {
			t.Fatal("a frame cut mid-value was read")
		}
		if n := storeObjects(t, store, "lm"); n != 0 {
			t.Fatalf("%d objects left", n)
		}
		if n := env.mem.InUse(); n != 0 {
			t.Fatalf("%d bytes of the budget held", n)
		}
	})
	t.Run("frame lengths", func(t *testing.T) {
		env, store, _ := streamEnv(t, 4096)
		frame := streamedProduceFrame(good())
		// The records field claims more than the frame holds.
		i := bytes.Index(frame, []byte("lm")) + 2 + 1 + 4
		frame[i] = 0xff
		frame[i+1] = 0xff
		frame[i+2] = 0xff
		frame[i+3] = 0x0f
		_, _, _, err := readStreamFrame(t, env, frame)
		if err == nil {
			t.Fatal("a frame whose lengths lie was read")
		}
		if n := storeObjects(t, store, "lm"); n != 0 || env.mem.InUse() != 0 {
			t.Fatalf("%d objects left, %d bytes held", n, env.mem.InUse())
		}
	})
}

// FuzzProduceStream feeds arbitrary Produce bodies (any version from 3)
// through the streaming reader and then the chain: no panic, no hang;
// what comes out decodes when the input did; nothing streamed is left in
// the store unless the chain committed it; the budget is given back.
func FuzzProduceStream(f *testing.F) {
	for _, v := range []int16{3, 9, 13} {
		req := kmsg.NewPtrProduceRequest()
		req.Version, req.Acks = v, -1
		rt := kmsg.NewProduceRequestTopic()
		rt.Topic, rt.TopicID = "lm", [16]byte{1}
		rp := kmsg.NewProduceRequestTopicPartition()
		rp.Records = batchOf(kmsg.Record{Value: []byte("a")}, kmsg.Record{Value: bytes.Repeat([]byte("x"), 300),
			Headers: []kmsg.Header{{Key: "h", Value: []byte("v")}}})
		rt.Partitions = append(rt.Partitions, rp, rp)
		req.Topics = append(req.Topics, rt)
		frame := streamedProduceFrame(req)
		h, _ := ParseRequestHeader(frame[4:])
		f.Add(v, frame[4+h.Len:])
	}
	f.Fuzz(func(t *testing.T, version int16, body []byte) {
		if version < 3 || version > 13 {
			return
		}
		env, store, chain := streamEnv(t, 200)
		req := kmsg.NewPtrProduceRequest()
		req.Version = version
		frame := streamedProduceFrame(req)
		h, _ := ParseRequestHeader(frame[4:])
		frame = append(frame[:4+h.Len], body...)
		binary.BigEndian.PutUint32(frame, uint32(len(frame)-4))
		watchdog(t, 20*time.Second, func() {
			out, release, streams, err := readStreamFrame(t, env, frame)
			if err != nil {
				if env.mem.InUse() != 0 || storeObjects(t, store, "lm")+storeObjects(t, store, "by-id") != 0 {
					t.Fatalf("after %v: %d bytes held, objects left", err, env.mem.InUse())
				}
				return
			}
			_, inErr := decodeProduce(version, body)
			dreq, err := decodeProduce(version, out[4+h.Len:])
			if err != nil {
				if inErr == nil {
					t.Fatalf("the input decodes, the output does not: %v", err)
				}
			} else if streams != nil {
				res := chain.InterceptProduce(interceptor.WithStreams(context.Background(), streams), dreq, env.limits2())
				res.Release()
				res.AbortAll(context.Background())
			}
			streams.AbortUncommitted(context.Background())
			release()
			if n := env.mem.InUse(); n != 0 {
				t.Fatalf("%d bytes of the budget held", n)
			}
			if n := storeObjects(t, store, "lm") + storeObjects(t, store, "by-id"); n != 0 {
				t.Fatalf("%d objects left", n)
			}
		})
	})
}

// wantCorruptNothingLeft reads frame (a streamed Produce v9 request), runs
// chain over it, and wants its one partition answered CORRUPT_MESSAGE and,
// once the uncommitted streams are aborted, no object left under "lm".
func wantCorruptNothingLeft(t *testing.T, env produceEnv, store payloadstore.PayloadStore, chain *interceptor.Chain, frame []byte) {
	t.Helper()
	out, release, streams, err := readStreamFrame(t, env, frame)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := ParseRequestHeader(out[4:])
	req, err := decodeProduce(9, out[4+h.Len:])
	if err != nil {
		t.Fatal(err)
	}
	res := chain.InterceptProduce(interceptor.WithStreams(context.Background(), streams), req, env.limits2())
	res.Release()
	if len(res.Answered) != 1 || res.Answered[0].ErrorCode != kerr.CorruptMessage.Code {
		t.Fatalf("answered %+v, want CORRUPT_MESSAGE", res.Answered)
	}
	streams.AbortUncommitted(context.Background())
	release()
	if n := storeObjects(t, store, "lm"); n != 0 {
		t.Fatalf("%d objects left", n)
	}
}

// A record's timestamp delta is a varlong (Kafka's DefaultRecord): a batch
// back-filling records a year apart has deltas of 6 bytes, which the broker
// accepts; the streaming parser reads them too, around a streamed value and
// beside it, and passes their bytes through as they came.
func TestProduceStreamLongTimestampDelta(t *testing.T) {
	env, store, _ := streamEnv(t, 4096)
	year := int64(366 * 24 * time.Hour / time.Millisecond) // zig-zag: 6 bytes
	big := bytes.Repeat([]byte("y"), 100_000)
	req := kmsg.NewPtrProduceRequest()
	req.Version, req.Acks, req.TimeoutMillis = 9, -1, 30000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = "lm"
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Records = batchOf(kmsg.Record{Value: []byte("old")}, kmsg.Record{TimestampDelta64: year, Value: big},
		kmsg.Record{TimestampDelta64: 2 * year, Value: []byte("new")})
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	frame, release, streams, err := readStreamFrame(t, env, streamedProduceFrame(req))
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if streams.Len() != 1 {
		t.Fatalf("%d values streamed, want 1", streams.Len())
	}
	h, _ := ParseRequestHeader(frame[4:])
	got, err := decodeProduce(9, frame[4+h.Len:])
	if err != nil {
		t.Fatal(err)
	}
	_, recs := decodeBatch(t, got.Topics[0].Partitions[0].Records)
	if len(recs) != 3 || recs[1].TimestampDelta64 != year || recs[2].TimestampDelta64 != 2*year || string(recs[2].Value) != "new" {
		t.Fatalf("records came out as %+v", recs)
	}
	if _, err := largemessage.DecodeReference(recs[1].Value); err != nil {
		t.Fatalf("the large value was not replaced by a reference: %v", err)
	}
	if n := storeObjects(t, store, "lm"); n != 1 {
		t.Fatalf("%d objects in the store, want 1", n)
	}
}

// streamKeyRequest is a Produce v9 request to "lm" of one batch: a small
// record, then one with key and a streamed value big (and headers hs).
func streamKeyRequest(key, big []byte, hs []kmsg.Header) *kmsg.ProduceRequest {
	req := kmsg.NewPtrProduceRequest()
	req.Version, req.Acks, req.TimeoutMillis = 9, -1, 30000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = "lm"
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Records = batchOf(kmsg.Record{Value: []byte("small")}, kmsg.Record{Key: key, Value: big, Headers: hs})
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	return req
}

// interceptStreamed reads req as a streamed frame (its large value to the
// store) and runs chain over it; it returns the outcome, the request as
// rewritten and the streams (release once done with them).
func interceptStreamed(t *testing.T, env produceEnv, chain *interceptor.Chain, req *kmsg.ProduceRequest) (interceptor.ProduceOutcome, *kmsg.ProduceRequest, *interceptor.Streams, func()) {
	t.Helper()
	frame, release, streams, err := readStreamFrame(t, env, streamedProduceFrame(req))
	if err != nil {
		t.Fatal(err)
	}
	if streams.Len() != 1 {
		t.Fatalf("%d values streamed, want 1", streams.Len())
	}
	h, _ := ParseRequestHeader(frame[4:])
	got, err := decodeProduce(req.Version, frame[4+h.Len:])
	if err != nil {
		t.Fatal(err)
	}
	out := chain.InterceptProduce(interceptor.WithStreams(context.Background(), streams), got, env.limits2())
	return out, got, streams, func() { out.Release(); release() }
}

// A record whose value streams to the store and whose key is too large
// for the reference record to fit the threshold: the key is offloaded as
// large-message offloads it when the value is read whole (same reference,
// same headers in the same order, the key's object under its content id),
// published once the batch fits. Found by a user: a 2 MB key with a 9.5 MB
// value was refused MESSAGE_TOO_LARGE, "even with key and value offloaded",
// its key never offloaded.
func TestProduceStreamOffloadsKey(t *testing.T) {
	env, store, chain := streamEnv(t, 4096)
	key := make([]byte, 5000)
	_, _ = rand.NewChaCha8([32]byte{41}).Read(key)
	big := make([]byte, 300_000)
	_, _ = rand.NewChaCha8([32]byte{42}).Read(big)
	hs := []kmsg.Header{{Key: "h", Value: []byte("1")}}

	out, got, streams, release := interceptStreamed(t, env, chain, streamKeyRequest(key, big, hs))
	if !out.Forward || len(out.Answered) != 0 {
		t.Fatalf("chain: forward %v, answered %+v", out.Forward, out.Answered)
	}
	if n := streams.AbortUncommitted(context.Background()); n != 0 {
		t.Fatalf("%d streamed values left uncommitted", n)
	}
	_, recs := decodeBatch(t, got.Topics[0].Partitions[0].Records)
	streamed := recs[1]
	if string(recs[0].Value) != "small" {
		t.Fatalf("records came out as %+v", recs)
	}
	kref, err := largemessage.DecodeReference(streamed.Key)
	if err != nil {
		t.Fatalf("the key (%d bytes) is not a reference: %v", len(streamed.Key), err)
	}
	vref, err := largemessage.DecodeReference(streamed.Value)
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string][]byte{kref.FullPayloadPath: key, vref.FullPayloadPath: big} {
		b, err := payloadstore.DownloadBytes(context.Background(), store, path)
		if err != nil || !bytes.Equal(b, want) {
			t.Fatalf("%s: %d bytes stored, equal %v, %v", path, len(b), bytes.Equal(b, want), err)
		}
	}
	if !payloadstore.IsContentID(kref.FullPayloadPath) {
		t.Fatalf("key path %s is not the key's content id", kref.FullPayloadPath)
	}
	if n := storeObjects(t, store, "lm"); n != 2 {
		t.Fatalf("%d objects in the store, want the value's and the key's", n)
	}

	// The same record read whole (not streamed): the same key reference and
	// the same headers, in the same order.
	whole := streamKeyRequest(key, big, hs)
	wout := chain.InterceptProduce(context.Background(), whole, env.limits2())
	if !wout.Forward || len(wout.Answered) != 0 {
		t.Fatalf("chain, read whole: forward %v, answered %+v", wout.Forward, wout.Answered)
	}
	_, wrecs := decodeBatch(t, whole.Topics[0].Partitions[0].Records)
	wout.Release()
	if !bytes.Equal(wrecs[1].Key, streamed.Key) {
		t.Fatalf("key reference %q, read whole %q", streamed.Key, wrecs[1].Key)
	}
	if len(wrecs[1].Headers) != len(streamed.Headers) {
		t.Fatalf("headers %v, read whole %v", streamed.Headers, wrecs[1].Headers)
	}
	for i, h := range streamed.Headers {
		if w := wrecs[1].Headers[i]; w.Key != h.Key || !bytes.Equal(w.Value, h.Value) {
			t.Fatalf("header %d: %s=%q, read whole %s=%q", i, h.Key, h.Value, w.Key, w.Value)
		}
	}
	wantKeys := []string{"h", largemessage.HeaderLargeMessage, largemessage.HeaderPayloadSize, largemessage.HeaderPayloadSHA256,
		largemessage.HeaderPayloadCRC32C, largemessage.HeaderLargeMessageKey, largemessage.HeaderKeyPayloadSize, largemessage.HeaderKeyPayloadSHA256}
	for i, h := range streamed.Headers {
		if i >= len(wantKeys) || h.Key != wantKeys[i] {
			t.Fatalf("headers %v, want the keys %v", streamed.Headers, wantKeys)
		}
	}
	if v := streamed.Headers[5].Value; string(v) != "true" {
		t.Fatalf("%s = %q", largemessage.HeaderLargeMessageKey, v)
	}

	// The broker refuses the partition: the streamed value goes with the
	// rest of the record's offload (the key's object, named by content id,
	// is shared by the record read whole, and stays, as it does for that one).
	resp := kmsg.NewPtrProduceResponse()
	resp.Version = 9
	rtp := kmsg.NewProduceResponseTopic()
	rtp.Topic = "lm"
	rpp := kmsg.NewProduceResponseTopicPartition()
	rpp.ErrorCode = kerr.InvalidRecord.Code
	rtp.Partitions = append(rtp.Partitions, rpp)
	resp.Topics = append(resp.Topics, rtp)
	out.Refused(context.Background(), resp)
	release()
	if _, err := payloadstore.DownloadBytes(context.Background(), store, vref.FullPayloadPath); err == nil {
		t.Fatal("the streamed value's object is still there after the broker refused its partition")
	}
	if n := env.mem.InUse(); n != 0 {
		t.Fatalf("%d bytes of the budget held after release", n)
	}
}

// A streamed record that cannot fit even with its key and value offloaded
// (its headers alone are over the threshold) is refused MESSAGE_TOO_LARGE
// with a message that says so, and nothing of it is left in the store:
// neither the streamed value nor the key (never published).
func TestProduceStreamKeyCannotFit(t *testing.T) {
	env, store, chain := streamEnv(t, 4096)
	key := bytes.Repeat([]byte("k"), 3000)
	big := bytes.Repeat([]byte("v"), 200_000)
	hs := []kmsg.Header{{Key: "huge", Value: bytes.Repeat([]byte("h"), 5000)}}
	out, _, streams, release := interceptStreamed(t, env, chain, streamKeyRequest(key, big, hs))
	defer release()
	if len(out.Answered) != 1 || out.Answered[0].ErrorCode != kerr.MessageTooLarge.Code {
		t.Fatalf("answered %+v, want MESSAGE_TOO_LARGE", out.Answered)
	}
	if msg := out.Answered[0].ErrorMessage; !strings.Contains(msg, largemessage.ErrRecordTooLarge.Error()) {
		t.Fatalf("error message %q, want %q", msg, largemessage.ErrRecordTooLarge)
	}
	t.Logf("refused: %s", out.Answered[0].ErrorMessage)
	streams.AbortUncommitted(context.Background())
	if n := storeObjects(t, store, "lm"); n != 0 {
		t.Fatalf("%d objects left in the store", n)
	}
}

// objectStore is a store with key-level operations (the mem store).
type objectStore interface {
	payloadstore.PayloadStore
	payloadstore.ObjectStore
}

// failSize is a store whose Publish fails for payloads of one size.
type failSize struct {
	objectStore
	size int64
}

func (f failSize) UnwrapStore() payloadstore.PayloadStore { return f.objectStore }

func (f failSize) Publish(ctx context.Context, topic string, p payloadstore.Payload) (payloadstore.PayloadResponse, error) {
	if p.Size == f.size {
		return payloadstore.PayloadResponse{}, &payloadstore.Error{Op: "publish", Path: topic, Err: fmt.Errorf("injected failure")}
	}
	return f.objectStore.Publish(ctx, topic, p)
}

// The key's publish fails (a store error, once the batch fits): the
// partition fails KAFKA_STORAGE_ERROR and the streamed value is deleted
// with it, as when the value's own offload fails.
func TestProduceStreamKeyPublishFails(t *testing.T) {
	env, _, _ := streamEnv(t, 4096)
	inner, ok := payloadstore.Wrap(payloadstore.NewMemStore(fmt.Sprintf("pstream-%d", rand.Int64()), payloadstore.IDUUID{}),
		payloadstore.Policy{Timeout: 5 * time.Second}).(objectStore)
	if !ok {
		t.Skip("the mem store has no key-level operations")
	}
	key := bytes.Repeat([]byte("k"), 5000)
	store := failSize{inner, int64(len(key))}
	cfg, err := largemessage.ParseConfig(map[string]string{largemessage.KeyStoreURL: "mem://unused"})
	if err != nil {
		t.Fatal(err)
	}
	lm := interceptor.NewLargeMessage(store, cfg, regexp.MustCompile(".*"))
	chain := interceptor.NewChain([]interceptor.Instance{{Produce: lm}}, interceptor.Options{Memory: env.mem, Timeout: 5 * time.Second})
	env.streamer = func(string) interceptor.ValueStreamer { return smallStreamer{lm} }
	out, _, streams, release := interceptStreamed(t, env, chain, streamKeyRequest(key, bytes.Repeat([]byte("v"), 200_000), nil))
	defer release()
	if len(out.Answered) != 1 || out.Answered[0].ErrorCode != kerr.KafkaStorageError.Code {
		t.Fatalf("answered %+v, want KAFKA_STORAGE_ERROR", out.Answered)
	}
	streams.AbortUncommitted(context.Background())
	if n := storeObjects(t, store, "lm"); n != 0 {
		t.Fatalf("%d objects left in the store", n)
	}
}
