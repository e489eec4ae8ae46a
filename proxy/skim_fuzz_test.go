package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/crc32"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/largemessage"
)

// skimFuzzChain is large-message (threshold 64) on lm.* and redact (no
// Skimmer) on red.*; topic ids with an even first byte are "lm-by-id".
func skimFuzzChain(tb testing.TB) *interceptor.Chain {
	tb.Helper()
	ch, err := interceptor.Build(context.Background(), []interceptor.Spec{
		{Name: "large-message", Config: map[string]string{interceptor.KeyTopicPattern: "lm.*", largemessage.KeyStoreURL: "mem://fuzz-skim", largemessage.KeyThreshold: "64"}},
		{Name: "redact", Config: map[string]string{interceptor.KeyTopicPattern: "red.*", "redact.fields": "a", "side": "both"}},
	}, interceptor.Options{Timeout: 2 * time.Second, Memory: interceptor.NewMemory(256 << 20),
		BatchDecompressedMax: 1 << 20, RequestDecompressedMax: 4 << 20,
		TopicName: func(id [16]byte) (string, bool) { return "lm-by-id", id[0]&1 == 0 }})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ch.Close() })
	return ch
}

// skimLimits are the fuzz targets' topic limits: a small max.message.bytes
// and a compression.type that varies with the topic's name.
func skimLimits(_ context.Context, topics []string) map[string]interceptor.TopicLimit {
	m := map[string]interceptor.TopicLimit{}
	for _, tp := range topics {
		m[tp] = interceptor.TopicLimit{MaxMessageBytes: 4096, Compression: []string{"", "zstd", "uncompressed"}[len(tp)%3]}
	}
	return m
}

// fixCRCs sets the CRC-32C of every whole magic v2 batch of set, in place,
// so that the differential below compares decisions, not checksums (the
// skim leaves the CRC to the broker; the chain checks it).
func fixCRCs(set []byte) {
	for len(set) >= 61 {
		n := int64(int32(binary.BigEndian.Uint32(set[8:])))
		if n < 49 || 12+n > int64(len(set)) {
			return
		}
		b := set[:12+n]
		if b[16] == 2 {
			binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)))
		}
		set = set[12+n:]
	}
}

// skimSeedRecords are batches for the seeds: small values, a value over
// the threshold, a reference header, a compressed batch.
func skimSeedRecords() [][]byte {
	ref := kmsg.Record{Value: []byte("r"), Headers: []kmsg.Header{{Key: largemessage.HeaderLargeMessage, Value: []byte("true")}}}
	body := ref.AppendTo(nil)[1:]
	refBatch := seedBatchOf(0, 1, append(binary.AppendVarint(nil, int64(len(body))), body...))
	// A record whose timestamp delta runs past a varlong's 10 bytes
	// (kbin reads it as length -10; CI's run found the skim sliced with it).
	overlong := append([]byte{0x22, 0x00}, bytes.Repeat([]byte{0xff}, 10)...)
	overlong = seedBatchOf(0, 1, append(overlong, make([]byte, 6)...))
	return [][]byte{
		seedBatch(0, "a", "bb", "ccc"),
		seedBatch(0, "a", strings.Repeat("x", 100)),
		refBatch,
		seedBatch(4, "a"),
		append(seedBatch(0, "a"), seedBatch(0, "b", "c")...),
		overlong,
	}
}

// FuzzSkimProduce feeds Produce request bodies to the proxy's skim
// (produceRecordSets, Chain.ProduceUntouched), CRCs fixed: no input may
// panic, and a request the skim passes as untouched must be one the chain
// itself forwards as it came (nothing rewritten, answered or published).
func FuzzSkimProduce(f *testing.F) {
	for _, v := range []int16{3, 8, 9, 12, 13} {
		for _, recs := range skimSeedRecords() {
			req := kmsg.NewPtrProduceRequest()
			req.Version = v
			req.Acks = -1
			for _, topic := range []string{"lm", "other", "red"} {
				rt := kmsg.NewProduceRequestTopic()
				rt.Topic = topic
				rp := kmsg.NewProduceRequestTopicPartition()
				rp.Records = recs
				rt.Partitions = append(rt.Partitions, rp)
				req.Topics = append(req.Topics, rt)
			}
			f.Add(v, req.AppendTo(nil))
			req.Topics = req.Topics[:1]
			f.Add(v, req.AppendTo(nil))
		}
	}
	ch := skimFuzzChain(f)
	f.Fuzz(func(t *testing.T, version int16, body []byte) {
		if version < 0 || version > 13 {
			return
		}
		body = bytes.Clone(body)
		sets, err := produceRecordSets(version, body, version >= produceFirstFlexible, nil)
		if err != nil {
			return
		}
		for _, s := range sets {
			fixCRCs(s.Records)
		}
		untouched := ch.ProduceUntouched(context.Background(), sets, skimLimits)
		req, err := decodeProduce(version, body)
		if err != nil {
			t.Fatalf("the skim read a body kmsg does not decode: %v", err)
		}
		if !untouched {
			return
		}
		var out interceptor.ProduceOutcome
		watchdog(t, 20*time.Second, func() { out = ch.InterceptProduce(context.Background(), req, skimLimits) })
		out.Release()
		if out.Rewritten != 0 || len(out.Answered) != 0 {
			t.Fatalf("skimmed as untouched, but the chain rewrote %d partitions and answered %+v", out.Rewritten, out.Answered)
		}
	})
}

// FuzzSkimFetch feeds Fetch response bodies to the proxy's skim
// (fetchRecordSets, Chain.FetchUntouched), CRCs fixed: no panic, and a
// response the skim passes as untouched is one the chain leaves as it
// came, but for a trailing partial batch, which the chain leaves out.
func FuzzSkimFetch(f *testing.F) {
	for _, v := range []int16{4, 11, 12, 13, 16} {
		for _, recs := range skimSeedRecords() {
			resp := kmsg.NewPtrFetchResponse()
			resp.Version = v
			for _, topic := range []string{"lm", "other"} {
				rt := kmsg.NewFetchResponseTopic()
				rt.Topic = topic
				rp := kmsg.NewFetchResponseTopicPartition()
				rp.RecordBatches = append(bytes.Clone(recs), recs[:len(recs)-3]...) // a partial batch at the end
				rt.Partitions = append(rt.Partitions, rp)
				resp.Topics = append(resp.Topics, rt)
			}
			f.Add(v, resp.AppendTo(nil))
		}
	}
	ch := skimFuzzChain(f)
	f.Fuzz(func(t *testing.T, version int16, body []byte) {
		if version < 4 || version > 16 {
			return
		}
		body = bytes.Clone(body)
		sets, _, err := fetchRecordSets(version, body, nil)
		if err != nil {
			return
		}
		for _, s := range sets {
			fixCRCs(s.Records)
		}
		untouched := ch.FetchUntouched(sets)
		resp := kmsg.NewPtrFetchResponse()
		resp.SetVersion(version)
		if err := resp.ReadFrom(body); err != nil {
			// kmsg decodes tag 0 as NodeEndpoints at every flexible
			// version, where the skim (like Kafka before v16) skips an
			// unknown tag: a body with such a tag (seed 2792c7061c5777ac,
			// v13) reads for the skim and not for kmsg. Fetch responses
			// come from the broker, which is trusted; the skim forwards
			// such a body as it came, as the plain proxy does, so there is
			// nothing to compare.
			return
		}
		if !untouched {
			return
		}
		var before [][]byte
		for _, tp := range resp.Topics {
			for _, p := range tp.Partitions {
				before = append(before, p.RecordBatches)
			}
		}
		var out interceptor.FetchOutcome
		watchdog(t, 20*time.Second, func() { out = ch.InterceptFetch(context.Background(), resp) })
		out.Release()
		if len(out.Failed) != 0 {
			t.Fatalf("skimmed as untouched, but the chain failed %+v", out.Failed)
		}
		i := 0
		for _, tp := range resp.Topics {
			for _, p := range tp.Partitions {
				if b := before[i]; !bytes.Equal(p.RecordBatches, b) && !(p.ErrorCode == 0 && bytes.HasPrefix(b, p.RecordBatches)) {
					t.Fatalf("skimmed as untouched, but the chain changed partition %d of %s", p.Partition, tp.Topic)
				}
				i++
			}
		}
	})
}

// produceResponseBody is a Produce response of two topics, the second
// partition of "b" refused with code.
func produceResponseBody(version, code int16) []byte {
	resp := kmsg.NewPtrProduceResponse()
	resp.Version = version
	for _, name := range []string{"a", "b"} {
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic = name
		rt.TopicID = [16]byte{byte(name[0])}
		for i := range int32(2) {
			rp := kmsg.NewProduceResponseTopicPartition()
			rp.Partition = i
			if name == "b" && i == 1 {
				rp.ErrorCode = code
				msg := "refused"
				rp.ErrorMessage = &msg
				e := kmsg.NewProduceResponseTopicPartitionErrorRecord()
				e.ErrorMessage = &msg
				rp.ErrorRecords = append(rp.ErrorRecords, e)
			}
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp.AppendTo(nil)
}

// produceTooLarge finds MESSAGE_TOO_LARGE in every Produce response
// version the proxy reads, and only there.
func TestProduceTooLarge(t *testing.T) {
	for v := int16(3); v <= kmsg.NewPtrProduceResponse().MaxVersion(); v++ {
		for _, code := range []int16{0, kerr.NotLeaderForPartition.Code, kerr.MessageTooLarge.Code} {
			got, err := produceTooLarge(v, produceResponseBody(v, code))
			if err != nil || got != (code == kerr.MessageTooLarge.Code) {
				t.Fatalf("v%d code %d: produceTooLarge = %v, %v", v, code, got, err)
			}
		}
		if _, err := produceTooLarge(v, produceResponseBody(v, 0)[:20]); err == nil {
			t.Fatalf("v%d: a truncated body was read", v)
		}
	}
}

// FuzzProduceTooLarge: the walk agrees with kmsg's decode on every body
// both read, and panics on none.
func FuzzProduceTooLarge(f *testing.F) {
	for _, v := range []int16{3, 8, 9, 13} {
		f.Add(v, produceResponseBody(v, kerr.MessageTooLarge.Code))
	}
	f.Fuzz(func(t *testing.T, version int16, body []byte) {
		if version < 3 || version > kmsg.NewPtrProduceResponse().MaxVersion() {
			return
		}
		got, err := produceTooLarge(version, body)
		if err != nil {
			return
		}
		resp := kmsg.NewPtrProduceResponse()
		resp.SetVersion(version)
		if resp.ReadFrom(body) != nil {
			// kmsg reads some tagged fields the walk skips (tag 0,
			// NodeEndpoints, in any flexible version): the broker's
			// response then goes on as it came, as through the plain
			// proxy.
			return
		}
		want := false
		for _, tp := range resp.Topics {
			for _, p := range tp.Partitions {
				want = want || p.ErrorCode == kerr.MessageTooLarge.Code
			}
		}
		if got != want {
			t.Fatalf("produceTooLarge = %v, kmsg says %v", got, want)
		}
	})
}
