package interceptor

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/largemessage"
)

// skimChain is large-message (threshold 400 bytes) on lm.*, redact (no
// Skimmer) on red.*, and nothing on other topics.
func skimChain(t *testing.T) *Chain {
	t.Helper()
	ch, err := Build(context.Background(), []Spec{
		{Name: "large-message", Config: map[string]string{KeyTopicPattern: "lm.*", largemessage.KeyStoreURL: "mem://skim-" + t.Name(), largemessage.KeyThreshold: "400"}},
		{Name: "redact", Config: map[string]string{KeyTopicPattern: "red.*", "redact.fields": "a", "side": "both"}},
	}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	return ch
}

// skimBatch encodes a magic v2 batch of recs (codec from attrs), CRC set.
func skimBatch(t *testing.T, attrs int16, recs ...kmsg.Record) []byte {
	t.Helper()
	d := &decodedBatch{hdr: kmsg.RecordBatch{Magic: 2, Attributes: attrs, ProducerID: -1, ProducerEpoch: -1,
		FirstSequence: -1, LastOffsetDelta: int32(len(recs) - 1), PartitionLeaderEpoch: -1}}
	for i := range recs {
		recs[i].OffsetDelta = int32(i)
		d.recs = append(d.recs, recs[i])
	}
	b, err := d.encode(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func small(v string) kmsg.Record { return kmsg.Record{Value: []byte(v)} }

// withCRC sets b's CRC-32C (after a test changed its bytes), so only the
// change itself can make the batch fail.
func withCRC(b []byte) []byte {
	binary.BigEndian.PutUint32(b[crcOffset:], crc32.Checksum(b[attrOffset:], castagnoli))
	return b
}

func limit64k(context.Context, []string) map[string]TopicLimit {
	return map[string]TopicLimit{"lm": {MaxMessageBytes: 1 << 16}, "lm2": {MaxMessageBytes: 200}}
}

// The skim passes only what it can read cleanly and what large-message
// would leave as it came; hostile batches (lying lengths and counts, a
// large value hidden by compression) go through the chain.
func TestSkimHostile(t *testing.T) {
	ch := skimChain(t)
	clean := skimBatch(t, 0, small("a"), small("bb"), kmsg.Record{Key: []byte("k"), Value: []byte("v"),
		Headers: []kmsg.Header{{Key: "trace", Value: []byte("x")}, {Key: "large-message-x", Value: nil}}})
	// A batch whose length says less than its records: the records no
	// longer fill their section.
	short := withCRC(bytes.Clone(clean))
	binary.BigEndian.PutUint32(short[lengthOffset:], binary.BigEndian.Uint32(short[lengthOffset:])-3)
	// A batch whose length says more than there is.
	long := bytes.Clone(clean)
	binary.BigEndian.PutUint32(long[lengthOffset:], binary.BigEndian.Uint32(long[lengthOffset:])+3)
	// A record count that lies, either way.
	more := withCRC(bytes.Clone(clean))
	binary.BigEndian.PutUint32(more[numRecordsOffset:], 4)
	fewer := withCRC(bytes.Clone(clean))
	binary.BigEndian.PutUint32(fewer[numRecordsOffset:], 2)
	// The last record's header count says 1 where it has 2 (the second
	// header is then trailing bytes of the record), and 3.
	hdrs := func(n int64) []byte {
		b := bytes.Clone(clean)
		i := bytes.LastIndex(b, []byte("\x0atrace")) - 1 // the count, before the first key's length
		if b[i] != 4 {                                   // zigzag 2
			t.Fatalf("header count byte is %d", b[i])
		}
		b[i] = byte(binary.AppendVarint(nil, n)[0])
		return withCRC(b)
	}
	big := strings.Repeat("x", 500)
	ref := kmsg.Record{Value: []byte("r"), Headers: []kmsg.Header{{Key: largemessage.HeaderLargeMessage, Value: []byte("true")}}}
	keyRef := kmsg.Record{Value: []byte("r"), Headers: []kmsg.Header{{Key: largemessage.HeaderLargeMessageKey, Value: []byte("no")}}}
	for _, c := range []struct {
		name  string
		topic string
		set   []byte
		want  bool
	}{
		{"clean", "lm", clean, true},
		{"two clean batches", "lm", append(bytes.Clone(clean), clean...), true},
		{"no interceptor", "other", skimBatch(t, 0, small(big)), true},
		{"not a Skimmer", "red", clean, false},
		{"length says less", "lm", short, false},
		{"length says more", "lm", long, false},
		{"count says more", "lm", more, false},
		{"count says fewer", "lm", fewer, false},
		{"header count says fewer", "lm", hdrs(1), false},
		{"header count says more", "lm", hdrs(3), false},
		{"header count negative", "lm", hdrs(-1), false},
		{"value over the threshold", "lm", skimBatch(t, 0, small("a"), small(big)), false},
		{"a reference", "lm", skimBatch(t, 0, small("a"), ref), false},
		{"a key reference", "lm", skimBatch(t, 0, keyRef), false},
		{"compressed, hiding a large value", "lm", skimBatch(t, 4, small(big)), false},
		{"compressed, small", "lm", skimBatch(t, 4, small("a")), false},
		{"over max.message.bytes", "lm2", skimBatch(t, 0, small(strings.Repeat("y", 50)), small(strings.Repeat("y", 50)), small(strings.Repeat("y", 50))), false},
		{"magic 1", "lm", func() []byte { b := bytes.Clone(clean); b[magicOffset] = 1; return b }(), false},
		{"truncated header", "lm", clean[:40], false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := ch.ProduceUntouched(context.Background(), []RecordSet{{Topic: c.topic, Records: c.set}}, limit64k)
			if got != c.want {
				t.Fatalf("ProduceUntouched = %v, want %v", got, c.want)
			}
			// What the skim passes, the chain leaves as it came.
			req := buildRequest(t, map[string][]byte{c.topic: c.set})
			out := ch.InterceptProduce(context.Background(), req, limit64k)
			out.Release()
			if got && (out.Rewritten != 0 || len(out.Answered) != 0 || !out.Forward) {
				t.Fatalf("skimmed as untouched, but the chain: %+v", out)
			}
		})
	}
	// A compressed batch can hide a large value: the chain offloads it.
	noisy := string(randomBytes(1, 1000))
	if ch.ProduceUntouched(context.Background(), []RecordSet{{Topic: "lm", Records: skimBatch(t, 4, small(noisy))}}, limit64k) {
		t.Fatal("a compressed batch was skimmed")
	}
	req := buildRequest(t, map[string][]byte{"lm": skimBatch(t, 4, small(noisy))})
	out := ch.InterceptProduce(context.Background(), req, limit64k)
	out.Release()
	if out.Rewritten != 1 {
		t.Fatalf("the compressed batch's large value was not offloaded: %+v", out)
	}
}

// On fetch, a trailing partial batch is read up to its last whole record;
// a reference among those records sends the response through the chain.
func TestSkimFetch(t *testing.T) {
	ch := skimChain(t)
	big := strings.Repeat("x", 500)
	clean := skimBatch(t, 0, small("a"), small(big), small("c"))
	ref := skimBatch(t, 0, small("a"), kmsg.Record{Value: []byte("r"), Headers: []kmsg.Header{{Key: largemessage.HeaderLargeMessage, Value: []byte("true")}}}, small(big))
	for _, c := range []struct {
		name string
		set  []byte
		want bool
	}{
		{"large values are not references", clean, true},
		{"partial, clean", append(bytes.Clone(clean), clean[:len(clean)-20]...), true},
		{"partial, cut in its header", append(bytes.Clone(clean), clean[:30]...), true},
		{"a reference", ref, false},
		{"partial, a reference before the cut", append(bytes.Clone(clean), ref[:len(ref)-20]...), false},
		{"compressed", skimBatch(t, 4, small("a")), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := ch.FetchUntouched([]RecordSet{{Topic: "lm", Records: c.set}}); got != c.want {
				t.Fatalf("FetchUntouched = %v, want %v", got, c.want)
			}
		})
	}
	if ch.FetchUntouched([]RecordSet{{TopicID: [16]byte{1}, Records: clean}}) {
		t.Fatal("a topic id the chain cannot name was skimmed as untouched")
	}
}

// A varint or varlong that runs past its longest encoding (kbin returns a
// negative length for it) at any field of a record is refused by the skim
// and by the chain's record decoder, never sliced with: a client's batch
// with a valid CRC around such a record must not panic the proxy.
func TestOverlongVarintInRecord(t *testing.T) {
	ch := skimChain(t)
	fn := func(context.Context, *Record) error { return nil }
	look := NewChain([]Instance{{Produce: &funcIcpt{name: "p", re: mustPattern("lm"), fn: fn},
		Fetch: &funcIcpt{name: "f", re: mustPattern("lm"), fn: fn}}}, Options{})
	over5, over10 := bytes.Repeat([]byte{0xff}, 5), bytes.Repeat([]byte{0xff}, 10)
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	withLen := func(body []byte) []byte { return append(binary.AppendVarint(nil, int64(len(body))), body...) }
	null, one, zero := []byte{0x01}, []byte{0x02, 'a'}, []byte{0x00}
	for _, c := range []struct {
		name    string
		records []byte
	}{
		{"record length", cat(over5, []byte{0x0f}, make([]byte, 8))},
		{"timestamp delta", withLen(cat(zero, over10, make([]byte, 6)))},
		{"offset delta", withLen(cat(zero, zero, over5, make([]byte, 6)))},
		{"key length", withLen(cat(zero, zero, zero, over5, make([]byte, 6)))},
		{"value length", withLen(cat(zero, zero, zero, null, over5, make([]byte, 6)))},
		{"header count", withLen(cat(zero, zero, zero, null, one, over5, make([]byte, 6)))},
		{"header key length", withLen(cat(zero, zero, zero, null, one, []byte{0x02}, over5, make([]byte, 6)))},
		{"header value length", withLen(cat(zero, zero, zero, null, one, []byte{0x02}, []byte{0x02, 'h'}, over5, make([]byte, 6)))},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := plainHeader(1, 0)
			h.Records = c.records
			h.Length = int32(49 + len(c.records))
			b := withCRC(h.AppendTo(nil))
			set := []RecordSet{{Topic: "lm", Records: b}}
			if ch.ProduceUntouched(context.Background(), set, limit64k) {
				t.Fatal("the produce skim passed the batch")
			}
			if ch.FetchUntouched(set) {
				t.Fatal("the fetch skim passed the batch")
			}
			out := look.InterceptProduce(context.Background(), buildRequest(t, map[string][]byte{"lm": bytes.Clone(b)}), allTopics(1<<20))
			if out.Forward {
				t.Fatal("the chain forwarded the batch")
			}
			out.Release()
			fo := look.InterceptFetch(context.Background(), fetchResponse(map[string][]byte{"lm": bytes.Clone(b)}))
			if len(fo.Failed) == 0 {
				t.Fatal("the chain's fetch did not fail the partition")
			}
			fo.Release()
		})
	}
}
