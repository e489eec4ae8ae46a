package schemareg

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/hamba/avro/v2"
	"google.golang.org/protobuf/encoding/protowire"
)

var testLimits = Limits{MaxDepth: 64, MaxItems: 1000, MaxMessages: 1000}

func TestParseFrame(t *testing.T) {
	framed := AppendFrame(nil, 7, nil, []byte("body"))
	f, err := ParseFrame(framed, false)
	if err != nil || f.ID != 7 || string(f.Payload) != "body" || f.Indexes != nil {
		t.Fatalf("ParseFrame(%x) = %+v, %v", framed, f, err)
	}
	// The id is a signed big-endian int32, as Java writes it.
	if f, err := ParseFrame([]byte{0, 0xff, 0xff, 0xff, 0xfe}, false); err != nil || f.ID != -2 || len(f.Payload) != 0 {
		t.Fatalf("id -2: %+v, %v", f, err)
	}
	for _, tc := range []struct {
		name  string
		b     []byte
		proto bool
	}{
		{"empty", nil, false},
		{"4 bytes", []byte{0, 0, 0, 1}, false},
		{"magic 1", []byte{1, 0, 0, 0, 1, 2}, false},
		{"JSON text", []byte(`{"id":1}`), false},
		{"no index count", []byte{0, 0, 0, 0, 1}, true},
		{"negative count", AppendFrame(nil, 1, nil, binary.AppendVarint(nil, -1)), true},
		{"count over the bound", AppendFrame(nil, 1, nil, binary.AppendVarint(nil, maxMessageIndexes+1)), true},
		{"truncated indexes", AppendFrame(nil, 1, nil, binary.AppendVarint(nil, 3)), true},
		{"negative index", AppendFrame(nil, 1, nil, binary.AppendVarint(binary.AppendVarint(nil, 1), -5)), true},
		{"overlong varint", AppendFrame(nil, 1, nil, bytes.Repeat([]byte{0xff}, 11)), true},
	} {
		if _, err := ParseFrame(tc.b, tc.proto); !errors.Is(err, ErrNotFramed) {
			t.Errorf("%s: ParseFrame(%x) error %v, want ErrNotFramed", tc.name, tc.b, err)
		}
	}
	for _, idx := range [][]int{{0}, {1, 2}, {0, 0, 3}} {
		b := AppendFrame(nil, 9, idx, []byte{0x08, 0x01})
		f, err := ParseFrame(b, true)
		if err != nil || f.ID != 9 || !slicesEqual(f.Indexes, idx) || !bytes.Equal(f.Payload, []byte{0x08, 0x01}) {
			t.Fatalf("indexes %v: %+v, %v", idx, f, err)
		}
	}
}

func slicesEqual(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

const testAvroSchema = `{"type":"record","name":"Order","namespace":"dev.ferry.test","fields":[
 {"name":"id","type":"long"},{"name":"item","type":"string"},{"name":"ok","type":"boolean"},
 {"name":"qty","type":"int"},{"name":"price","type":"double"},{"name":"w","type":"float"},
 {"name":"tags","type":{"type":"array","items":"string"}},
 {"name":"attrs","type":{"type":"map","values":"long"}},
 {"name":"kind","type":{"type":"enum","name":"Kind","symbols":["A","B"]}},
 {"name":"hash","type":{"type":"fixed","name":"H","size":4}},
 {"name":"blob","type":"bytes"},
 {"name":"next","type":["null","Order"],"default":null}]}`

func testAvroValue() map[string]any {
	inner := map[string]any{"id": int64(2), "item": "b", "ok": false, "qty": int32(1), "price": 0.5, "w": float32(1),
		"tags": []any{}, "attrs": map[string]any{}, "kind": "B", "hash": [4]byte{}, "blob": []byte{}, "next": nil}
	return map[string]any{"id": int64(1), "item": "widget", "ok": true, "qty": int32(-3), "price": 9.5, "w": float32(2),
		"tags": []any{"x", "y"}, "attrs": map[string]any{"k": int64(5)}, "kind": "A", "hash": [4]byte{1, 2, 3, 4},
		"blob": []byte{0, 1}, "next": map[string]any{"dev.ferry.test.Order": inner}}
}

func TestAvroValidAndHostile(t *testing.T) {
	s, err := parseAvro(testAvroSchema, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.name != "dev.ferry.test.Order" {
		t.Fatalf("record name %q", s.name)
	}
	good, err := avro.Marshal(s.s, testAvroValue())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.validate(ctx, good, testLimits); err != nil {
		t.Fatalf("a value hamba/avro encoded: %v", err)
	}
	// Every proper prefix is truncated somewhere: each must fail, and so
	// must a trailing byte.
	for n := range len(good) {
		if err := s.validate(ctx, good[:n], testLimits); !errors.Is(err, ErrInvalidPayload) {
			t.Fatalf("prefix of %d bytes (of %d): %v, want ErrInvalidPayload", n, len(good), err)
		}
	}
	if err := s.validate(ctx, append(bytes.Clone(good), 0), testLimits); !errors.Is(err, ErrInvalidPayload) {
		t.Fatalf("trailing byte: %v", err)
	}

	hostile := []struct {
		name, schema string
		payload      []byte
	}{
		{"boolean 2", `"boolean"`, []byte{2}},
		{"int over int32", `"int"`, binary.AppendVarint(nil, 1<<40)},
		{"negative string length", `"string"`, binary.AppendVarint(nil, -1)},
		{"string longer than the payload", `"string"`, append(binary.AppendVarint(nil, 1<<40), 'a')},
		{"union branch out of range", `["null","long"]`, binary.AppendVarint(nil, 2)},
		{"negative union branch", `["null","long"]`, binary.AppendVarint(nil, -1)},
		{"enum symbol out of range", `{"type":"enum","name":"E","symbols":["A"]}`, binary.AppendVarint(nil, 1)},
		{"array of nulls over the item bound", `{"type":"array","items":"null"}`, binary.AppendVarint(nil, 1<<62)},
		{"array count MinInt64", `{"type":"array","items":"null"}`, binary.AppendVarint(nil, -1<<63)},
		{"array of nulls, many blocks", `{"type":"array","items":"null"}`, bytes.Repeat(binary.AppendVarint(nil, 999), 3)},
		{"fixed truncated", `{"type":"fixed","name":"F","size":16}`, []byte{1, 2}},
		// A recursive list nested deeper than MaxDepth: each level is one
		// byte (the union branch), so the payload's size does not bound it.
		{"recursion deeper than the bound", `{"type":"record","name":"L","fields":[{"name":"n","type":["null","L"]}]}`,
			append(bytes.Repeat([]byte{2}, 10000), 0)},
	}
	for _, tc := range hostile {
		s, err := parseAvro(tc.schema, nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if err := s.validate(ctx, tc.payload, testLimits); !errors.Is(err, ErrInvalidPayload) {
			t.Errorf("%s: %v, want ErrInvalidPayload", tc.name, err)
		}
	}
	// At the bounds exactly: MaxItems items and MaxDepth levels pass.
	arr, _ := parseAvro(`{"type":"array","items":"null"}`, nil)
	if err := arr.validate(ctx, append(binary.AppendVarint(nil, testLimits.MaxItems), 0), testLimits); err != nil {
		t.Fatalf("array of exactly MaxItems: %v", err)
	}
	if err := arr.validate(ctx, append(binary.AppendVarint(nil, testLimits.MaxItems+1), 0), testLimits); !errors.Is(err, ErrInvalidPayload) {
		t.Fatalf("array of MaxItems+1: %v", err)
	}
	for _, bad := range []string{``, `{`, `{"type":"record","name":"R","fields":[{"name":"a","type":"Nope"}]}`, `"nope"`} {
		if _, err := parseAvro(bad, nil); !errors.Is(err, ErrBadSchema) {
			t.Errorf("schema %q: %v, want ErrBadSchema", bad, err)
		}
	}
}

func TestAvroDepthBound(t *testing.T) {
	s, err := parseAvro(`{"type":"record","name":"L","fields":[{"name":"n","type":["null","L"]}]}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Each level of the list is a record (depth+1), the union (+1) and its
	// branch; count how deep a payload of k levels goes and check both
	// sides of the bound.
	nested := func(k int) []byte { return append(bytes.Repeat([]byte{2}, k), 0) }
	lim := Limits{MaxDepth: 30, MaxItems: 10}
	if err := s.validate(context.Background(), nested(14), lim); err != nil {
		t.Fatalf("14 levels under depth 30: %v", err)
	}
	if err := s.validate(context.Background(), nested(16), lim); !errors.Is(err, ErrInvalidPayload) || !strings.Contains(err.Error(), "deeper than 30") {
		t.Fatalf("16 levels under depth 30: %v", err)
	}
}

// Decoding into values (rules, the library's Deserializer) bounds the Avro
// values that take no bytes: a few bytes of array count over nulls or
// empty records would otherwise decode into gigabytes. At the bound
// (payload size + maxZeroWidthValues) the payload decodes, one more is
// refused; walking without decoding keeps only MaxItems; optional fields
// that are null (one union byte each) are not limited by it.
func TestAvroDecodeZeroWidthBound(t *testing.T) {
	ctx := context.Background()
	lim := Limits{MaxDepth: DefaultMaxDepth, MaxItems: DefaultMaxItems}
	nulls := func(n int64) []byte { return append(binary.AppendVarint(nil, n), 0) }
	for _, schema := range []string{`{"type":"array","items":"null"}`, `{"type":"array","items":{"type":"record","name":"E","fields":[]}}`} {
		s, err := parseAvro(schema, nil)
		if err != nil {
			t.Fatal(err)
		}
		p := &parsedSchema{avro: s}
		at := int64(len(nulls(maxZeroWidthValues))) + maxZeroWidthValues
		if v, err := p.decode(ctx, Frame{Payload: nulls(at)}, lim); err != nil || int64(len(v.([]any))) != at {
			t.Fatalf("%s: %d items at the bound: %v", schema, at, err)
		}
		if _, err := p.decode(ctx, Frame{Payload: nulls(at + 1)}, lim); !errors.Is(err, ErrInvalidPayload) || !strings.Contains(err.Error(), "take no bytes") {
			t.Fatalf("%s: %d items, one over the bound: %v", schema, at+1, err)
		}
		// 5 bytes claiming 9 million items: refused before any is built.
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		if _, err := p.decode(ctx, Frame{Payload: nulls(9_000_000)}, lim); !errors.Is(err, ErrInvalidPayload) {
			t.Fatalf("%s: 9M items: %v", schema, err)
		}
		runtime.ReadMemStats(&m1)
		if grew := m1.TotalAlloc - m0.TotalAlloc; grew > 1<<20 {
			t.Errorf("%s: refusing 9M items allocated %d bytes", schema, grew)
		}
		// The walk alone (no rules) allocates nothing: MaxItems is its bound.
		if err := p.validate(ctx, Frame{Payload: nulls(9_000_000)}, lim); err != nil {
			t.Fatalf("%s: walk of 9M items: %v", schema, err)
		}
	}
	// 200000 optional fields that are null: one byte each, decoded.
	s, err := parseAvro(`{"type":"array","items":["null","long"]}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	opt := append(binary.AppendVarint(nil, 200_000), bytes.Repeat([]byte{0}, 200_000)...)
	if v, err := (&parsedSchema{avro: s}).decode(ctx, Frame{Payload: append(opt, 0)}, lim); err != nil || len(v.([]any)) != 200_000 {
		t.Fatalf("200000 null unions: %v", err)
	}
}

const testProto = "syntax = \"proto3\";\npackage dev.ferry.test;\n\nmessage Order {\n  int64 id = 1;\n  string item = 2;\n  message Line { int32 n = 1; }\n  repeated Line lines = 3;\n}\nmessage Other { bytes b = 1; }\n"

func TestProtobuf(t *testing.T) {
	ctx := context.Background()
	p, err := parseProtobuf(ctx, testProto, nil)
	if err != nil {
		t.Fatal(err)
	}
	var good []byte
	good = protowire.AppendTag(good, 1, protowire.VarintType)
	good = protowire.AppendVarint(good, 42)
	good = protowire.AppendTag(good, 2, protowire.BytesType)
	good = protowire.AppendString(good, "widget")
	if err := p.validate(ctx, []int{0}, good, testLimits); err != nil {
		t.Fatalf("valid Order: %v", err)
	}
	for _, tc := range []struct {
		name string
		idx  []int
		b    []byte
		want string
	}{
		{"truncated", []int{0}, good[:len(good)-1], ""},
		{"field number 0", []int{0}, protowire.AppendVarint(protowire.AppendTag(nil, 0, protowire.VarintType), 1), ""},
		{"invalid UTF-8 in a proto3 string", []int{0}, protowire.AppendString(protowire.AppendTag(nil, 2, protowire.BytesType), "\xff"), ""},
		{"index of no message", []int{5}, good, "name no message"},
		{"nested index of no message", []int{0, 3}, good, "name no message"},
	} {
		err := p.validate(ctx, tc.idx, tc.b, testLimits)
		if !errors.Is(err, ErrInvalidPayload) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalidPayload (%q)", tc.name, err, tc.want)
		}
	}
	if n, err := p.recordName([]int{0, 0}); err != nil || n != "dev.ferry.test.Order.Line" {
		t.Fatalf("record name of [0 0]: %q, %v", n, err)
	}
	// Deep nesting of a recursive message is bounded by MaxDepth.
	r, err := parseProtobuf(ctx, "syntax = \"proto3\";\nmessage N { N n = 1; }\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	var deep []byte
	for range 100 {
		deep = protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), deep)
	}
	if err := r.validate(ctx, []int{0}, deep, testLimits); !errors.Is(err, ErrInvalidPayload) {
		t.Fatalf("100 levels under depth 64: %v", err)
	}
	for _, bad := range []string{"", "syntax = \"proto3\";\nmessage A { B b = 1; }\n", "syntax = \"proto3\";\nimport \"/etc/passwd\";\n", "message {"} {
		if _, err := parseProtobuf(ctx, bad, nil); !errors.Is(err, ErrBadSchema) && bad != "" {
			t.Errorf("schema %q: %v, want ErrBadSchema", bad, err)
		}
	}
}

const testJSONSchema = `{"$schema":"http://json-schema.org/draft-07/schema#","title":"Order","type":"object",` +
	`"properties":{"id":{"type":"integer"},"item":{"type":"string"}},"required":["id"]}`

// Protobuf messages are counted before the payload is decoded: a 2-byte
// empty message costs dynamicpb some 350 bytes. At MaxMessages the payload
// decodes, one more is refused, without building any; nested messages and
// map entries count; a payload with no nested message is not limited.
func TestProtobufMessageBound(t *testing.T) {
	ctx := context.Background()
	p, err := parseProtobuf(ctx, "syntax = \"proto3\";\nmessage O {\n  message L { L l = 1; }\n  repeated L lines = 3;\n  map<string, L> m = 4;\n  string s = 5;\n}\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	lim := Limits{MaxDepth: DefaultMaxDepth, MaxItems: DefaultMaxItems, MaxMessages: 1000}
	empties := func(n int) []byte { return bytes.Repeat([]byte{0x1a, 0x00}, n) }
	if v, err := (&parsedSchema{proto: p}).decode(ctx, Frame{Indexes: []int{0}, Payload: empties(1000)}, lim); err != nil || v == nil {
		t.Fatalf("1000 nested messages at the bound 1000: %v", err)
	}
	if _, err := (&parsedSchema{proto: p}).decode(ctx, Frame{Indexes: []int{0}, Payload: empties(1001)}, lim); !errors.Is(err, ErrInvalidPayload) || !strings.Contains(err.Error(), "more than 1000 nested messages") {
		t.Fatalf("1001 nested messages: %v", err)
	}
	// 500 lines each holding one more message: 1000 in all, then 1002.
	nested := bytes.Repeat([]byte{0x1a, 0x02, 0x0a, 0x00}, 500)
	if err := p.validate(ctx, []int{0}, nested, lim); err != nil {
		t.Fatalf("500 lines of 2 messages: %v", err)
	}
	if err := p.validate(ctx, []int{0}, append(nested, 0x1a, 0x02, 0x0a, 0x00), lim); !errors.Is(err, ErrInvalidPayload) {
		t.Fatalf("501 lines of 2 messages: %v", err)
	}
	// Map entries (key "", no value) count too.
	if err := p.validate(ctx, []int{0}, bytes.Repeat([]byte{0x22, 0x00}, 1001), lim); !errors.Is(err, ErrInvalidPayload) {
		t.Fatalf("1001 map entries: %v", err)
	}
	// A long string is one message.
	s := protowire.AppendString(protowire.AppendTag(nil, 5, protowire.BytesType), strings.Repeat("x", 100000))
	if err := p.validate(ctx, []int{0}, s, Limits{MaxDepth: 10}); err != nil {
		t.Fatalf("a string with no nested message under MaxMessages 0: %v", err)
	}
	// 512Ki empty messages in 1 MiB, under the default: refused without
	// allocating what decoding them would (about 180 MB).
	many := empties(512 << 10)
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	err = p.validate(ctx, []int{0}, many, Limits{MaxDepth: DefaultMaxDepth, MaxMessages: 100_000})
	runtime.ReadMemStats(&m1)
	if !errors.Is(err, ErrInvalidPayload) {
		t.Fatalf("512Ki empty messages: %v", err)
	}
	if grew := m1.TotalAlloc - m0.TotalAlloc; grew > 1<<20 {
		t.Errorf("refusing 512Ki empty messages allocated %d bytes", grew)
	}
}

func TestJSONSchema(t *testing.T) {
	ctx := context.Background()
	j, err := parseJSONSchema(1, testJSONSchema, nil, testLimits)
	if err != nil {
		t.Fatal(err)
	}
	if j.title != "Order" {
		t.Fatalf("title %q", j.title)
	}
	if err := j.validate(ctx, []byte(`{"id":1,"item":"x"}`), testLimits); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{`{"item":"x"}`, `{"id":"1"}`, `{"id":1`, `{"id":1,"id":2}`, strings.Repeat("[", 100) + strings.Repeat("]", 100), ``} {
		if err := j.validate(ctx, []byte(bad), testLimits); !errors.Is(err, ErrInvalidPayload) {
			t.Errorf("value %.40q: %v, want ErrInvalidPayload", bad, err)
		}
	}
	for _, bad := range []string{`{"$ref":"file:///etc/passwd"}`, `{"$ref":"http://127.0.0.1:1/x.json"}`, `{"type":`,
		strings.Repeat(`{"items":`, 100) + `{}` + strings.Repeat(`}`, 100), `{"type":"nope"}`} {
		if _, err := parseJSONSchema(2, bad, nil, testLimits); !errors.Is(err, ErrBadSchema) {
			t.Errorf("schema %.40q: %v, want ErrBadSchema", bad, err)
		}
	}
}

func TestParseStrategy(t *testing.T) {
	for in, want := range map[string]Strategy{"": TopicName, "TopicNameStrategy": TopicName,
		"io.confluent.kafka.serializers.subject.RecordNameStrategy": RecordName, "topicrecordnamestrategy": TopicRecordName} {
		if got, ok := ParseStrategy(in); !ok || got != want {
			t.Errorf("ParseStrategy(%q) = %v, %v", in, got, ok)
		}
	}
	if _, ok := ParseStrategy("Nope"); ok {
		t.Error("ParseStrategy(Nope) accepted")
	}
}
