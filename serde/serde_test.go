package serde_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ferrykit/ferry/serde"
)

// upper is a custom stage: Serialize upper-cases a string, Deserialize
// lower-cases one. It takes and gives strings, so it must sit before
// "string" in a serializer chain and after it in a deserializer chain.
var upper = serde.StageFuncs{
	Ser: func(_ context.Context, _ string, v any) (any, error) {
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("upper stage: got %T, want string", v)
		}
		return strings.ToUpper(s), nil
	},
	De: func(_ context.Context, _ string, v any) (any, error) {
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("upper stage: got %T, want string", v)
		}
		return strings.ToLower(s), nil
	},
}

var (
	registerUpper sync.Once
	seq           atomic.Int64
)

func useUpper() { registerUpper.Do(func() { serde.Register("upper-test", upper) }) }

func TestParseSerializers(t *testing.T) {
	c, err := serde.ParseSerializers("json,large-message")
	if err != nil {
		t.Fatal(err)
	}
	if !c.LargeMessage() {
		t.Error("json,large-message: LargeMessage() = false")
	}
	if c.String() != "json,large-message" {
		t.Errorf("String() = %q", c.String())
	}
	// Whitespace and empty items are ignored.
	c, err = serde.ParseSerializers(" json , , large-message ")
	if err != nil || !c.LargeMessage() || c.String() != "json,large-message" {
		t.Fatalf("with spaces: %v, %v", c, err)
	}
	c, err = serde.ParseSerializers("json")
	if err != nil || c.LargeMessage() {
		t.Fatalf("json alone: LargeMessage %v, %v", c.LargeMessage(), err)
	}
	c, err = serde.ParseSerializers("large-message")
	if err != nil || !c.LargeMessage() {
		t.Fatalf("large-message alone: %v", err)
	}
	// Empty means bytes.
	for _, list := range []string{"", " ", ","} {
		c, err := serde.ParseSerializers(list)
		if err != nil || c.String() != "bytes" || c.LargeMessage() {
			t.Fatalf("ParseSerializers(%q) = %v, %v; want bytes", list, c, err)
		}
	}
}

func TestLargeMessagePosition(t *testing.T) {
	for _, list := range []string{"large-message,json", "string,large-message,json", "large-message,large-message"} {
		_, err := serde.ParseSerializers(list)
		if err == nil {
			t.Errorf("serializers %q: no error; large-message must be last", list)
		} else if !strings.Contains(err.Error(), "last") {
			t.Errorf("serializers %q: error %q does not say it must be last", list, err)
		}
	}
	// Deserializers list the stages in reverse: large-message first.
	c, err := serde.ParseDeserializers("large-message,json")
	if err != nil || !c.LargeMessage() {
		t.Fatalf("deserializers large-message,json: %v", err)
	}
	for _, list := range []string{"json,large-message", "string,large-message,json"} {
		_, err := serde.ParseDeserializers(list)
		if err == nil {
			t.Errorf("deserializers %q: no error; large-message must be first", list)
		} else if !strings.Contains(err.Error(), "first") {
			t.Errorf("deserializers %q: error %q does not say it must be first", list, err)
		}
	}
}

func TestRoundTrips(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		ser, de string
		in      any
		wire    []byte
		out     any
	}{
		{"string,large-message", "large-message,string", "héllo, wörld", []byte("héllo, wörld"), "héllo, wörld"},
		{"string", "string", "", []byte{}, ""},
		{"bytes,large-message", "large-message,bytes", []byte{0, 1, 0xff}, []byte{0, 1, 0xff}, []byte{0, 1, 0xff}},
		{"", "", []byte("raw"), []byte("raw"), []byte("raw")},
		{"json,large-message", "large-message,json",
			map[string]any{"id": 42, "tags": []string{"a", "b"}, "ok": true},
			[]byte(`{"id":42,"ok":true,"tags":["a","b"]}`),
			map[string]any{"id": float64(42), "tags": []any{"a", "b"}, "ok": true}},
		{"json", "json", "text", []byte(`"text"`), "text"},
		{"json", "json", json.RawMessage(`[1,2]`), []byte(`[1,2]`), []any{float64(1), float64(2)}},
	}
	for _, c := range cases {
		sc, err := serde.ParseSerializers(c.ser)
		if err != nil {
			t.Fatal(err)
		}
		dc, err := serde.ParseDeserializers(c.de)
		if err != nil {
			t.Fatal(err)
		}
		wire, err := sc.Serialize(ctx, "t", c.in)
		if err != nil {
			t.Fatalf("%s: Serialize(%v): %v", c.ser, c.in, err)
		}
		if !bytes.Equal(wire, c.wire) {
			t.Fatalf("%s: Serialize(%v) = %q, want %q", c.ser, c.in, wire, c.wire)
		}
		out, err := dc.Deserialize(ctx, "t", wire)
		if err != nil {
			t.Fatalf("%s: Deserialize(%q): %v", c.de, wire, err)
		}
		if !reflect.DeepEqual(out, c.out) {
			t.Fatalf("%s: Deserialize(%q) = %#v, want %#v", c.de, wire, out, c.out)
		}
	}
}

func TestNulls(t *testing.T) {
	// A null (tombstone) stays null through every built-in stage.
	ctx := context.Background()
	for _, list := range []string{"bytes", "string", "json"} {
		sc, _ := serde.ParseSerializers(list)
		dc, _ := serde.ParseDeserializers(list)
		wire, err := sc.Serialize(ctx, "t", nil)
		if err != nil || wire != nil {
			t.Errorf("%s: Serialize(nil) = %#v, %v; want nil", list, wire, err)
		}
		out, err := dc.Deserialize(ctx, "t", nil)
		if b, isBytes := out.([]byte); err != nil || (out != nil && !(isBytes && b == nil)) {
			t.Errorf("%s: Deserialize(nil) = %#v, %v; want nil", list, out, err)
		}
	}
}

func TestStageErrors(t *testing.T) {
	ctx := context.Background()
	jc, _ := serde.ParseDeserializers("json")
	if _, err := jc.Deserialize(ctx, "t", []byte("{not json")); err == nil {
		t.Error("json: invalid JSON deserialized")
	}
	bc, _ := serde.ParseSerializers("bytes")
	if _, err := bc.Serialize(ctx, "t", 42); err == nil {
		t.Error("bytes: an int serialized")
	}
	js, _ := serde.ParseSerializers("json")
	if _, err := js.Serialize(ctx, "t", make(chan int)); err == nil {
		t.Error("json: a channel serialized")
	}
	sc, _ := serde.ParseSerializers("string")
	if _, err := sc.Serialize(ctx, "t", 3.5); err == nil {
		t.Error("string: a float serialized")
	}
}

func TestUnknownStage(t *testing.T) {
	useUpper()
	for _, parse := range []func(string) (*serde.Chain, error){serde.ParseSerializers, serde.ParseDeserializers} {
		_, err := parse("jsn")
		if err == nil {
			t.Fatal("unknown stage jsn parsed")
		}
		msg := err.Error()
		if !strings.Contains(msg, `"jsn"`) {
			t.Errorf("error %q does not name the unknown stage", msg)
		}
		for _, name := range []string{"bytes", "string", "json", "large-message", "upper-test"} {
			if !strings.Contains(msg, name) {
				t.Errorf("error %q does not list registered stage %q", msg, name)
			}
		}
	}
	names := serde.Names()
	for i := 1; i < len(names); i++ {
		if names[i-1] >= names[i] {
			t.Fatalf("Names() not sorted: %q", names)
		}
	}
}

func TestCustomStage(t *testing.T) {
	useUpper()
	ctx := context.Background()
	sc, err := serde.ParseSerializers("upper-test,string,large-message")
	if err != nil {
		t.Fatal(err)
	}
	wire, err := sc.Serialize(ctx, "t", "hello ferry")
	if err != nil || string(wire) != "HELLO FERRY" {
		t.Fatalf("Serialize = %q, %v; want HELLO FERRY", wire, err)
	}
	// Reverse order to deserialize.
	dc, err := serde.ParseDeserializers("large-message,string,upper-test")
	if err != nil {
		t.Fatal(err)
	}
	out, err := dc.Deserialize(ctx, "t", wire)
	if err != nil || out != "hello ferry" {
		t.Fatalf("Deserialize = %#v, %v; want hello ferry", out, err)
	}
	// In serializer order, the stages get the wrong types and say so.
	wrong, err := serde.ParseDeserializers("upper-test,string")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wrong.Deserialize(ctx, "t", wire); err == nil || !strings.Contains(err.Error(), "upper") {
		t.Fatalf("deserializing in serializer order: %v, want the upper stage's type error", err)
	}
	// A chain whose last serializer does not give bytes fails.
	last, _ := serde.ParseSerializers("upper-test")
	if _, err := last.Serialize(ctx, "t", "x"); err == nil {
		t.Fatal("a chain ending in a string-valued stage serialized")
	}
	// The stage sees the topic.
	var seen string
	name := fmt.Sprintf("topic-test-%d", seq.Add(1))
	serde.Register(name, serde.StageFuncs{
		Ser: func(_ context.Context, topic string, v any) (any, error) { seen = topic; return v, nil },
		De:  func(_ context.Context, topic string, v any) (any, error) { seen = topic; return v, nil },
	})
	tc, _ := serde.ParseSerializers(name)
	tc.Serialize(ctx, "orders", []byte("x"))
	if seen != "orders" {
		t.Fatalf("stage saw topic %q", seen)
	}
}

func TestRegisterDuplicatePanics(t *testing.T) {
	for _, name := range []string{"json", "bytes", serde.LargeMessage} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Register(%q) did not panic", name)
				}
			}()
			serde.Register(name, upper)
		}()
	}
}

func TestConcurrentRegisterAndParse(t *testing.T) {
	// The registry is read by ParseSerializers and Names while stages are
	// registered; run under -race.
	run := seq.Add(1)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(3)
		go func() { defer wg.Done(); serde.Register(fmt.Sprintf("concurrent-%d-%d", run, i), upper) }()
		go func() { defer wg.Done(); serde.ParseSerializers("json,large-message") }()
		go func() { defer wg.Done(); _ = serde.Names() }()
	}
	wg.Wait()
	names := strings.Join(serde.Names(), ",") + ","
	for i := range 8 {
		if !strings.Contains(names, fmt.Sprintf("concurrent-%d-%d,", run, i)) {
			t.Fatalf("stage concurrent-%d-%d missing from %s", run, i, names)
		}
	}
}

// The schema-registry stages need schema.registry.url and refuse what they
// cannot do (a Go value carries no schema to register or to name a record
// subject after), each naming the key.
func TestSchemaStageConfig(t *testing.T) {
	url := "http://127.0.0.1:1/apis/ccompat/v7"
	for _, tc := range []struct {
		name  string
		props map[string]string
		isKey bool
		want  string // "" is no error
	}{
		{"no properties", nil, false, "schema.registry.url is required"},
		{"not a URL", map[string]string{"schema.registry.url": "ftp://x"}, false, "schema.registry.url"},
		{"latest version", map[string]string{"schema.registry.url": url}, false, ""},
		{"fixed id", map[string]string{"schema.registry.url": url, "use.schema.id": "7"}, true, ""},
		{"auto register", map[string]string{"schema.registry.url": url, "auto.register.schemas": "true"}, false, "auto.register.schemas"},
		{"not latest", map[string]string{"schema.registry.url": url, "use.latest.version": "false"}, false, "use.latest.version"},
		{"bad id", map[string]string{"schema.registry.url": url, "use.schema.id": "x"}, false, "use.schema.id"},
		{"bad ttl", map[string]string{"schema.registry.url": url, "latest.cache.ttl.sec": "-2"}, false, "latest.cache.ttl.sec"},
		{"record strategy without id", map[string]string{"schema.registry.url": url, "value.subject.name.strategy": "RecordNameStrategy"}, false, "use.schema.id"},
		{"record strategy with id", map[string]string{"schema.registry.url": url, "key.subject.name.strategy": "io.confluent.kafka.serializers.subject.TopicRecordNameStrategy", "use.schema.id": "3"}, true, ""},
		{"unknown strategy", map[string]string{"schema.registry.url": url, "key.subject.name.strategy": "Nope"}, true, "key.subject.name.strategy"},
		{"basic auth without password", map[string]string{"schema.registry.url": url, "basic.auth.credentials.source": "USER_INFO", "basic.auth.user.info": "alice"}, false, "basic.auth.user.info"},
	} {
		for _, stage := range []string{"avro", "protobuf", "json-schema"} {
			_, err := serde.ParseSerializersFor(stage+",large-message", tc.props, tc.isKey)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("%s, %s: got %v, want %q", tc.name, stage, err, tc.want)
			}
		}
	}
	if _, err := serde.ParseDeserializers("large-message,avro"); err == nil || !strings.Contains(err.Error(), "schema.registry.url") {
		t.Errorf("ParseDeserializers without properties: %v", err)
	}
	// A registry that is down fails the record, typed, not the parse.
	c, err := serde.ParseSerializersFor("avro", map[string]string{"schema.registry.url": url, "schema.registry.request.timeout.ms": "500"}, false)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Serialize(context.Background(), "orders", map[string]any{"id": 1})
	if !errors.Is(err, serde.ErrSchema) || !errors.Is(err, serde.ErrSchemaUnavailable) || !strings.Contains(err.Error(), "orders-value") {
		t.Fatalf("registry down: %v", err)
	}
	if v, err := c.Serialize(context.Background(), "orders", nil); err != nil || v != nil {
		t.Fatalf("a null value: %v %v", v, err)
	}
}
