package interceptor

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// runProduce runs a chain of instance over one partition of topic "t"
// holding a batch of values (no producer id) and returns the outcome and
// the values as they would be sent.
func runProduce(t *testing.T, in Instance, values ...string) (ProduceOutcome, []string) {
	t.Helper()
	return runProduceChain(t, NewChain([]Instance{in}, Options{}), values...)
}

func runProduceChain(t *testing.T, ch *Chain, values ...string) (ProduceOutcome, []string) {
	t.Helper()
	req := buildRequest(t, map[string][]byte{"t": plainBatch(t, 1, -1, values...)}) // gzip
	out := ch.InterceptProduce(context.Background(), req, nil)
	var got []string
	if len(req.Topics) == 1 {
		checkBatches(t, req.Topics[0].Partitions[0].Records)
		d, err := decodeBatch(context.Background(), nil, req.Topics[0].Partitions[0].Records)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range d.recs {
			got = append(got, string(r.Value))
		}
	}
	return out, got
}

func newBuiltin(t *testing.T, name string, cfg map[string]string) Instance {
	t.Helper()
	in, err := New(context.Background(), name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func TestValidateJSON(t *testing.T) {
	dir := t.TempDir()
	schema := `{"type":"object","required":["id"],"properties":{"id":{"type":"integer"}}}`
	file := filepath.Join(dir, "s.json")
	if err := os.WriteFile(file, []byte(schema), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		cfg    map[string]string
		values []string
		bad    int // index of the failing record, -1 none
		want   string
	}{
		{"json ok", nil, []string{`{"a":1}`, `[1,2]`, `"s"`}, -1, ""},
		{"not json", nil, []string{`{"a":1}`, `{"a":`}, 1, "not valid JSON"},
		{"schema ok", map[string]string{KeyJSONSchema: schema}, []string{`{"id":1}`, `{"id":2,"x":"y"}`}, -1, ""},
		{"schema violation", map[string]string{KeyJSONSchema: schema}, []string{`{"id":1}`, `{"id":"one"}`}, 1, "JSON Schema"},
		{"schema file missing field", map[string]string{KeyJSONSchemaFile: file}, []string{`{"x":1}`}, 0, "id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, got := runProduce(t, newBuiltin(t, "validate-json", tc.cfg), tc.values...)
			if tc.bad < 0 {
				if len(out.Answered) != 0 || len(got) != len(tc.values) {
					t.Fatalf("outcome %+v", out)
				}
				return
			}
			if len(out.Answered) != 1 {
				t.Fatalf("outcome %+v", out)
			}
			a := out.Answered[0]
			if a.ErrorCode != kerr.InvalidRecord.Code || a.RecordErrors[0].RelativeOffset != int32(tc.bad) ||
				!strings.Contains(*a.RecordErrors[0].ErrorMessage, tc.want) || !strings.Contains(a.ErrorMessage, "validate-json") {
				t.Fatalf("answer %+v (%s)", a, *a.RecordErrors[0].ErrorMessage)
			}
		})
	}
	for _, bad := range []map[string]string{
		{KeyJSONSchema: `{"type":`}, {KeyJSONSchema: `{"type":"nope"}`}, {KeyJSONSchemaFile: filepath.Join(dir, "missing.json")},
		{KeyJSONSchema: schema, KeyJSONSchemaFile: file}, {KeySide: "sideways"}, {KeyTopicPattern: "("},
	} {
		if _, err := New(context.Background(), "validate-json", bad); err == nil {
			t.Errorf("config %v accepted", bad)
		}
	}
}

func TestRedact(t *testing.T) {
	in := newBuiltin(t, "redact", map[string]string{KeyRedactFields: "user.email, cards.#.number,absent"})
	out, got := runProduce(t, in,
		`{"user":{"name":"a","email":"a@example.com"},"cards":[{"number":"4111","exp":"01/30"},{"number":"5500"}]}`,
		`{"other":true}`)
	if len(out.Answered) != 0 {
		t.Fatalf("outcome %+v", out)
	}
	want := []string{`{"user":{"name":"a","email":"***"},"cards":[{"number":"***","exp":"01/30"},{"number":"***"}]}`, `{"other":true}`}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("record %d: %s, want %s", i, got[i], want[i])
		}
	}
	// Unchanged records keep the batch's bytes.
	req := buildRequest(t, map[string][]byte{"t": plainBatch(t, 0, -1, `{"x":1}`)})
	before := req.Topics[0].Partitions[0].Records
	NewChain([]Instance{in}, Options{}).InterceptProduce(context.Background(), req, nil)
	if &req.Topics[0].Partitions[0].Records[0] != &before[0] {
		t.Fatal("a batch without redacted fields was re-encoded")
	}
	// Not JSON: rejected rather than passed unredacted.
	out, _ = runProduce(t, in, `plain text`)
	if len(out.Answered) != 1 || out.Answered[0].ErrorCode != kerr.InvalidRecord.Code {
		t.Fatalf("outcome %+v", out)
	}
	// On fetch, with a custom mask.
	fin := newBuiltin(t, "redact", map[string]string{KeyRedactFields: "ssn", KeyRedactMask: "", KeySide: "fetch"})
	if fin.Produce != nil || fin.Fetch == nil {
		t.Fatal("side=fetch built a produce interceptor")
	}
	resp := fetchResponse(map[string][]byte{"t": plainBatch(t, 4, -1, `{"ssn":"123","n":1}`)})
	NewChain([]Instance{fin}, Options{}).InterceptFetch(context.Background(), resp)
	recs := records(t, "t", &resp.Topics[0].Partitions[0])
	if len(recs) != 1 || string(recs[0].Value) != `{"ssn":"","n":1}` {
		t.Fatalf("fetched %v", recs)
	}
	if _, err := New(context.Background(), "redact", map[string]string{}); err == nil {
		t.Fatal("redact without fields accepted")
	}
}

// Message format v0/v1 on a matching topic is rejected; on another topic it
// passes untouched. A corrupt CRC or a truncated batch is CORRUPT_MESSAGE.
func TestBadBatches(t *testing.T) {
	m := kmsg.MessageV1{Magic: 1, Key: nil, Value: []byte("old")}
	m.MessageSize = int32(len(m.AppendTo(nil)) - 12)
	v1 := m.AppendTo(nil)
	good := plainBatch(t, 0, -1, "a", "b")
	badCRC := append([]byte(nil), good...)
	badCRC[len(badCRC)-1] ^= 1
	short := good[:len(good)-3]
	huge := append([]byte(nil), good...)
	binary.BigEndian.PutUint32(huge[8:], 1<<30)
	ch := NewChain([]Instance{{Produce: icpt(t, "id", "t", func(context.Context, *Record) error { return nil })}}, Options{})
	for _, tc := range []struct {
		name string
		b    []byte
		code int16
	}{{"v1", v1, kerr.UnsupportedForMessageFormat.Code}, {"crc", badCRC, kerr.CorruptMessage.Code},
		{"truncated", short, kerr.CorruptMessage.Code}, {"length", huge, kerr.CorruptMessage.Code},
		{"empty header", good[:10], kerr.CorruptMessage.Code}} {
		req := buildRequest(t, map[string][]byte{"t": tc.b, "u": tc.b})
		out := ch.InterceptProduce(context.Background(), req, nil)
		if len(out.Answered) != 1 || out.Answered[0].Topic != "t" || out.Answered[0].ErrorCode != tc.code {
			t.Fatalf("%s: outcome %+v", tc.name, out)
		}
		if len(req.Topics) != 1 || req.Topics[0].Topic != "u" || &req.Topics[0].Partitions[0].Records[0] != &tc.b[0] {
			t.Fatalf("%s: the unmatched topic was changed", tc.name)
		}
	}
}

// A fetch interceptor error on the first batch drops the partition's
// records with KAFKA_STORAGE_ERROR (or the code it wraps); on a later batch
// the batches before it are returned. A partial batch at the end passes.
func TestFetchErrors(t *testing.T) {
	fail := func(_ context.Context, r *Record) error {
		switch string(r.Value) {
		case "bad":
			return errTest
		case "gone":
			return kerr.UnknownTopicOrPartition
		case "skip":
			return ErrSkipRecord
		}
		return nil
	}
	ch := NewChain([]Instance{{Fetch: icpt(t, "f", ".*", fail)}}, Options{})
	b1 := plainBatch(t, 0, -1, "a", "skip", "c")
	b2 := plainBatch(t, 0, -1, "bad")
	binary.BigEndian.PutUint64(b2, 3) // second batch at offset 3
	resp := fetchResponse(map[string][]byte{"t": append(append([]byte(nil), b1...), b2...)})
	out := ch.InterceptFetch(context.Background(), resp)
	p := resp.Topics[0].Partitions[0]
	if len(out.Failed) != 1 || !out.Failed[0].Partial || p.ErrorCode != 0 || !errors.Is(out.Failed[0].Err, errTest) {
		t.Fatalf("outcome %+v partition error %d", out, p.ErrorCode)
	}
	got := records(t, "t", &p)
	if len(got) != 2 || string(got[0].Value) != "a" || string(got[1].Value) != "c" || got[1].Offset != 2 {
		t.Fatalf("records %v", got)
	}
	rb := checkBatches(t, p.RecordBatches)
	if rb[0].NumRecords != 2 || rb[0].LastOffsetDelta != 2 {
		t.Fatalf("skipped batch: %d records, last offset delta %d (must stay 2)", rb[0].NumRecords, rb[0].LastOffsetDelta)
	}
	for _, tc := range []struct {
		v    string
		code int16
	}{{"bad", kerr.KafkaStorageError.Code}, {"gone", kerr.UnknownTopicOrPartition.Code}} {
		resp = fetchResponse(map[string][]byte{"t": plainBatch(t, 0, -1, tc.v)})
		ch.InterceptFetch(context.Background(), resp)
		if p := resp.Topics[0].Partitions[0]; p.ErrorCode != tc.code || p.RecordBatches == nil || len(p.RecordBatches) != 0 { // empty, not null (librdkafka)
			t.Fatalf("%s: code %d", tc.v, p.ErrorCode)
		}
	}
	// A record set cut in the middle of its last batch: the partial batch
	// is dropped (the interceptors cannot read it; a raw client could),
	// the whole batches before it go out.
	x := plainBatch(t, 0, -1, "x")
	for _, n := range []int{20, len(b1) - 1} {
		cut := append(append([]byte(nil), x...), b1[:n]...)
		resp = fetchResponse(map[string][]byte{"t": cut})
		ch.InterceptFetch(context.Background(), resp)
		p := resp.Topics[0].Partitions[0]
		if got := records(t, "t", &p); p.ErrorCode != 0 || len(got) != 1 || string(got[0].Value) != "x" || len(p.RecordBatches) != len(x) {
			t.Fatalf("partial batch of %d bytes: code %d, %d bytes, records %v", n, p.ErrorCode, len(p.RecordBatches), got)
		}
	}
}

// acks=0 and Response/Merge: answered partitions reach the producer's
// response with base offset -1 and, from v8, messages and record errors.
func TestMergeAndResponse(t *testing.T) {
	ch := NewChain([]Instance{{Produce: icpt(t, "bad", "t", func(context.Context, *Record) error { return errTest })}}, Options{})
	req := buildRequest(t, map[string][]byte{"t": plainBatch(t, 0, -1, "a"), "u": plainBatch(t, 0, -1, "b")})
	out := ch.InterceptProduce(context.Background(), req, nil)
	if !out.Forward || len(req.Topics) != 1 {
		t.Fatalf("outcome %+v", out)
	}
	resp := kmsg.NewPtrProduceResponse()
	resp.Version = req.Version
	rt := kmsg.NewProduceResponseTopic()
	rt.Topic = "u"
	rt.Partitions = append(rt.Partitions, kmsg.NewProduceResponseTopicPartition())
	resp.Topics = append(resp.Topics, rt)
	out.Merge(resp)
	if len(resp.Topics) != 2 || resp.Topics[1].Topic != "t" {
		t.Fatalf("merged %+v", resp.Topics)
	}
	p := resp.Topics[1].Partitions[0]
	if p.ErrorCode != kerr.InvalidRecord.Code || p.BaseOffset != -1 || p.ErrorMessage == nil || len(p.ErrorRecords) != 1 {
		t.Fatalf("merged partition %+v", p)
	}
	// The response encodes and decodes at the request's version.
	b := resp.AppendTo(nil)
	back := kmsg.NewPtrProduceResponse()
	back.Version = resp.Version
	if err := back.ReadFrom(b); err != nil || *back.Topics[1].Partitions[0].ErrorMessage != *p.ErrorMessage {
		t.Fatalf("round trip: %v", err)
	}
	old := buildRequest(t, map[string][]byte{"t": plainBatch(t, 0, -1, "a")})
	old.Version = 7
	o2 := ch.InterceptProduce(context.Background(), old, nil)
	r2 := o2.Response(old)
	if o2.Forward || r2.Topics[0].Partitions[0].ErrorMessage != nil || len(r2.Topics[0].Partitions[0].ErrorRecords) != 0 {
		t.Fatalf("v7 response carries v8 fields: %+v", r2.Topics[0].Partitions[0])
	}
}

func TestRegistry(t *testing.T) {
	for _, n := range []string{"large-message", "redact", "validate-json"} {
		found := false
		for _, have := range Names() {
			found = found || have == n
		}
		if !found {
			t.Fatalf("%s not registered: %v", n, Names())
		}
	}
	if _, err := New(context.Background(), "nope", nil); err == nil || !strings.Contains(err.Error(), "not registered") {
		t.Fatalf("unknown name: %v", err)
	}
	if _, err := New(context.Background(), "large-message", map[string]string{}); err == nil {
		t.Fatal("large-message without a store URL accepted")
	}
	re, _ := CompileTopicPattern("orders")
	if re.MatchString("orders-dlq") || !re.MatchString("orders") {
		t.Fatal("topic patterns must match whole names")
	}
	_ = kgo.Record{}
}

func TestBuild(t *testing.T) {
	ch, err := Build(context.Background(), []Spec{
		{Name: "validate-json"},
		{Name: "redact", Config: map[string]string{KeyRedactFields: "pw"}},
	}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if !ch.HasProduce() || ch.HasFetch() {
		t.Fatal("both built-ins default to produce")
	}
	_, got := runProduceChain(t, ch, `{"pw":"x"}`)
	if len(got) != 1 || got[0] != `{"pw":"***"}` {
		t.Fatalf("got %v", got)
	}
	if _, err := Build(context.Background(), []Spec{{Name: "validate-json"}, {Name: "redact"}}, Options{}); err == nil ||
		!strings.Contains(err.Error(), "interceptors[1]") {
		t.Fatalf("bad spec: %v", err)
	}
	for v, want := range map[string]time.Duration{"": DefaultTimeout, "250": 250 * time.Millisecond} {
		if d, err := ParseTimeout(map[string]string{KeyTimeout: v}); err != nil || d != want {
			t.Fatalf("%q: %v %v", v, d, err)
		}
	}
	if _, err := ParseTimeout(map[string]string{KeyTimeout: "-1"}); err == nil {
		t.Fatal("negative timeout accepted")
	}
}

// A fetch interceptor that makes records larger (as large-message does)
// keeps the response within the consumer's max_bytes and partition max
// bytes (KIP-74): later batches are left out, the first batch of the
// response is always kept, a later partition may be left empty.
func TestInterceptFetchLimits(t *testing.T) {
	grow := func(_ context.Context, r *Record) error { r.Value = bytes.Repeat(r.Value, 1000); return nil }
	ch := NewChain([]Instance{{Fetch: icpt(t, "grow", "t", grow)}}, Options{})
	set := func() []byte {
		var b []byte
		for i := range 3 {
			pb := plainBatch(t, 0, -1, "x")
			binary.BigEndian.PutUint64(pb, uint64(i))
			b = append(b, pb...)
		}
		return b
	}
	build := func() *kmsg.FetchResponse {
		resp := fetchResponse(map[string][]byte{"t": set()})
		resp.Topics = append(resp.Topics, fetchResponse(map[string][]byte{"u": plainBatch(t, 0, -1, "small")}).Topics...)
		return resp
	}
	offsets := func(p *kmsg.FetchResponseTopicPartition) []int64 {
		var o []int64
		for _, r := range records(t, "t", p) {
			if len(r.Value) != 1000 {
				t.Fatalf("record at %d has %d bytes, want 1000", r.Offset, len(r.Value))
			}
			o = append(o, r.Offset)
		}
		return o
	}
	for _, tc := range []struct {
		name     string
		limits   FetchLimits
		want     []int64
		uEmpty   bool
		truncate int
	}{
		{"no limits", FetchLimits{}, []int64{0, 1, 2}, false, 0},
		{"max bytes below one batch", FetchLimits{MaxBytes: 100}, []int64{0}, true, 2},
		{"max bytes for two", FetchLimits{MaxBytes: 2300}, []int64{0, 1}, false, 1},
		{"partition max bytes", FetchLimits{MaxBytes: 1 << 20, PartitionMaxBytes: map[FetchPartition]int32{{Topic: "t"}: 1500}}, []int64{0}, false, 1},
	} {
		resp := build()
		out := ch.InterceptFetchLimited(context.Background(), resp, tc.limits)
		p := &resp.Topics[0].Partitions[0]
		if got := offsets(p); !slices.Equal(got, tc.want) {
			t.Fatalf("%s: offsets %v, want %v", tc.name, got, tc.want)
		}
		if u := resp.Topics[1].Partitions[0]; (len(u.RecordBatches) == 0) != tc.uEmpty || u.ErrorCode != 0 {
			t.Fatalf("%s: untouched topic left with %d bytes, error %d", tc.name, len(u.RecordBatches), u.ErrorCode)
		}
		if out.Truncated != tc.truncate || p.ErrorCode != 0 {
			t.Fatalf("%s: truncated %d partitions, want %d (error %d)", tc.name, out.Truncated, tc.truncate, p.ErrorCode)
		}
		checkBatches(t, p.RecordBatches)
	}
}

// Batches already over the fetch limits as the broker sent them are left
// out without being seen by the interceptors (large-message would read
// their payloads only to drop them).
func TestInterceptFetchLimitsSkipsWork(t *testing.T) {
	var calls atomic.Int64
	count := func(_ context.Context, r *Record) error { calls.Add(1); return nil }
	ch := NewChain([]Instance{{Fetch: icpt(t, "count", "t", count)}}, Options{})
	var set []byte
	for i := range 3 {
		pb := plainBatch(t, 0, -1, strings.Repeat("x", 100))
		binary.BigEndian.PutUint64(pb, uint64(i))
		set = append(set, pb...)
	}
	resp := fetchResponse(map[string][]byte{"t": set})
	out := ch.InterceptFetchLimited(context.Background(), resp, FetchLimits{MaxBytes: 10})
	if n := calls.Load(); n != 1 || out.Truncated != 1 {
		t.Fatalf("interceptor called %d times (want 1: the first batch only), %d partitions truncated", n, out.Truncated)
	}
	if got := records(t, "t", &resp.Topics[0].Partitions[0]); len(got) != 1 || got[0].Offset != 0 {
		t.Fatalf("records %v, want the first only", got)
	}
}

// Found by review: a key twice in one object would leave one occurrence
// unmasked for last-key-wins parsers; such values are refused.
func TestRedactRefusesDuplicateKeys(t *testing.T) {
	in, err := New(context.Background(), "redact", map[string]string{KeyTopicPattern: "t", KeyRedactFields: "user.email,cards.#.number"})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{
		`{"id":6,"user":{"email":"x","email":"leak2"}}`,
		`{"id":7,"cards":[{"number":"1"},{"number":"leak3","number":"leak3b"}]}`,
		`{"user":{"email":"x","em\u0061il":"leak"}}`,
	} {
		r := &Record{Topic: "t", Value: []byte(v)}
		if err := in.Produce.ProcessRecord(context.Background(), r); !errors.Is(err, kerr.InvalidRecord) {
			t.Errorf("%s: %v, want INVALID_RECORD", v, err)
		}
	}
	for _, v := range []string{`{"user":{"email":"x"},"other":{"email":"y"}}`, `[{"a":1},{"a":2}]`, `{"a":{"b":1},"b":2}`} {
		r := &Record{Topic: "t", Value: []byte(v)}
		if err := in.Produce.ProcessRecord(context.Background(), r); err != nil {
			t.Errorf("%s: %v, want it accepted", v, err)
		}
	}
}

// An interceptor that panics fails its partition (UNKNOWN_SERVER_ERROR)
// and nothing else: the chain, and the other partitions, go on.
func TestInterceptorPanicContained(t *testing.T) {
	boom := func(_ context.Context, r *Record) error {
		if string(r.Value) == "boom" {
			panic("interceptor bug")
		}
		return nil
	}
	ch := NewChain([]Instance{{Produce: icpt(t, "boom", ".*", boom)}}, Options{})
	req := buildRequest(t, map[string][]byte{"a": plainBatch(t, 0, -1, "boom"), "b": plainBatch(t, 0, -1, "fine")})
	out := ch.InterceptProduce(context.Background(), req, nil)
	if len(out.Answered) != 1 || out.Answered[0].Topic != "a" || out.Answered[0].ErrorCode != kerr.UnknownServerError.Code {
		t.Fatalf("answered %+v", out.Answered)
	}
	if !out.Forward || len(req.Topics) != 1 || req.Topics[0].Topic != "b" {
		t.Fatalf("the healthy partition was not forwarded: %+v", req.Topics)
	}
}

// A partition whose record set is null or empty is forwarded as it is:
// the broker answers it (it is not "every record skipped").
func TestEmptyRecordSetForwarded(t *testing.T) {
	ch := NewChain([]Instance{{Produce: icpt(t, "any", ".*", func(context.Context, *Record) error { return nil })}}, Options{})
	for _, recs := range [][]byte{nil, {}} {
		req := buildRequest(t, map[string][]byte{"t": recs})
		out := ch.InterceptProduce(context.Background(), req, nil)
		if len(out.Answered) != 0 || !out.Forward || len(req.Topics) != 1 {
			t.Fatalf("records %v: answered %+v, forward %v", recs, out.Answered, out.Forward)
		}
	}
}

// cancelOnCommit is deferred work whose Commit succeeds while the
// request's context ends (the client goes away mid-commit).
type cancelOnCommit struct {
	cancel  context.CancelFunc
	aborted *atomic.Int64
}

func (d cancelOnCommit) Commit(ctx context.Context, _ *Record) error {
	d.cancel()
	<-ctx.Done()
	return nil // the work was done
}

func (d cancelOnCommit) Abort(context.Context) { d.aborted.Add(1) }

// Work committed while the request's context ended is undone: the chain
// counts the partition as failed, so nothing it wrote may stay.
func TestCommitOverCancelledContextIsUndone(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var aborted atomic.Int64
	ch := NewChain([]Instance{{Produce: icpt(t, "defer", ".*", func(_ context.Context, r *Record) error {
		r.Defer(cancelOnCommit{cancel: cancel, aborted: &aborted})
		return nil
	})}}, Options{})
	out := ch.InterceptProduce(ctx, buildRequest(t, map[string][]byte{"t": plainBatch(t, 0, -1, "v")}), nil)
	if out.Forward || len(out.Answered) != 1 {
		t.Fatalf("forward %v, answered %+v: want the partition answered", out.Forward, out.Answered)
	}
	deadline := time.Now().Add(5 * time.Second)
	for aborted.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if aborted.Load() != 1 {
		t.Fatalf("Abort called %d times after a Commit that ended with its context, want 1", aborted.Load())
	}
}

// encodedLen is computed, not encoded: it must agree with kmsg's encoding
// for every shape of record.
func TestEncodedLenMatchesEncoding(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 1<<21)
	for _, r := range []kmsg.Record{
		{},
		{Key: []byte{}, Value: []byte{}},
		{TimestampDelta64: -1, OffsetDelta: 1 << 30, Key: []byte("k"), Value: big},
		{TimestampDelta64: 1 << 40, Value: big[:300], Headers: []kmsg.Header{{Key: "", Value: nil}, {Key: strings.Repeat("h", 200), Value: big[:70000]}}},
		{Attributes: 1, OffsetDelta: -5, Headers: make([]kmsg.Header, 1000)},
	} {
		enc := r.AppendTo(nil)
		want := len(enc) - 1 // without the zero length kmsg writes first
		want += len(binary.AppendVarint(nil, int64(want)))
		if got := encodedLen(&r); got != want {
			t.Errorf("encodedLen %d, encoding %d bytes", got, want)
		}
	}
}
