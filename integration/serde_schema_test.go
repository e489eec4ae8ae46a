package integration

// Issue 21's second done-when, its Go half: the serde chain's
// schema-registry stages (value.serializers=avro,large-message) against the
// real schema registry (scripts/schema-registry) and the real broker, read
// by a plain franz-go consumer with franz-go's sr.Serde, and the reverse.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/serde"
)

// blobAvro is a record with a bytes field that makes it as large as a test
// needs.
const blobAvro = `{"type":"record","name":"Blob","namespace":"dev.ferry.test","fields":[` +
	`{"name":"id","type":"long"},{"name":"item","type":"string"},{"name":"blob","type":"bytes"}]}`

// blobRecord is blobAvro as franz-go's sr.Serde users write it: a struct
// with hamba/avro tags.
type blobRecord struct {
	ID   int64  `avro:"id"`
	Item string `avro:"item"`
	Blob []byte `avro:"blob"`
}

// schemaChain is a large-message config with the serde chains given, the
// registry's URL and a file store, and its producer and consumer.
func schemaChain(t *testing.T, ser, de string, extra map[string]string) (*largemessage.Producer, *largemessage.Consumer) {
	t.Helper()
	schemaRegistry(t) // skips (or fails under CI) without a registry
	props := map[string]string{
		"bootstrap.servers":               brokers(t),
		"large.message.payload.store.url": "file://" + t.TempDir(),
		"value.serializers":               ser,
		"value.deserializers":             de,
		"schema.registry.url":             registryURL(),
	}
	for k, v := range extra {
		props[k] = v
	}
	cfg, err := largemessage.ParseConfig(props)
	if err != nil {
		t.Fatal(err)
	}
	store, err := cfg.OpenStore(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	prod, err := largemessage.NewProducer(client(t), store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cons := largemessage.NewConsumer(nil, largemessage.NewDeserializer(store, false)).WithDeserializers(nil, cfg.ValueDeserializers)
	return prod, cons
}

func registryURL() string { return strings.TrimSpace(os.Getenv("FERRY_SCHEMA_REGISTRY_URL")) }

// register registers text under subject and returns its id.
func register(t *testing.T, subject, text string, typ sr.SchemaType) int {
	t.Helper()
	ss, err := schemaRegistry(t).CreateSchema(ctxT(t, 30*time.Second), subject, sr.Schema{Schema: text, Type: typ})
	if err != nil {
		t.Fatalf("register %s: %v", subject, err)
	}
	return ss.ID
}

// decodeAll resolves and decodes n records of topic with cons.
func decodeAll(t *testing.T, cons *largemessage.Consumer, topic string, n int) []any {
	t.Helper()
	var out []any
	for _, r := range cons.Resolve(ctxT(t, time.Minute), consumeRaw(t, topic, n)) {
		_, v, err := cons.Decode(ctxT(t, time.Minute), r)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	return out
}

// TestSerdeAvroInteroperatesWithFranzGoSR: value.serializers=avro,large-message
// writes what franz-go's sr.Serde (Confluent's wire format) reads, small or
// offloaded and resolved; value.deserializers=large-message,avro reads what
// sr.Serde wrote; and a value its schema refuses gets a typed error.
func TestSerdeAvroInteroperatesWithFranzGoSR(t *testing.T) {
	prod, cons := schemaChain(t, "avro,large-message", "large-message,avro", nil)
	topic := newTopic(t, nil)
	id := register(t, topic+"-value", blobAvro, sr.TypeAvro)
	schema := avro.MustParse(blobAvro)
	// hamba/avro refuses bytes over 1 MiB unless told otherwise.
	api := avro.Config{MaxByteSliceSize: -1}.Freeze()
	var srSerde sr.Serde
	srSerde.Register(id, blobRecord{},
		sr.EncodeFn(func(v any) ([]byte, error) { return api.Marshal(schema, v) }),
		sr.DecodeFn(func(b []byte, v any) error { return api.Unmarshal(schema, b, v) }))

	small := map[string]any{"id": int64(1), "item": "small", "blob": []byte("tiny")}
	large := map[string]any{"id": int64(2), "item": "large", "blob": bytes.Repeat([]byte("ferry-avro"), 300_000)} // 3 MB
	for i, v := range []map[string]any{small, large} {
		rec, err := prod.ProduceValue(ctxT(t, time.Minute), topic, nil, v)
		if err != nil {
			t.Fatalf("produce %d: %v", i, err)
		}
		if got := largemessage.IsOffloaded(rec); got != (i == 1) {
			t.Fatalf("record %d offloaded %v", i, got)
		}
	}
	// franz-go's sr.Serde reads the small record as Kafka holds it.
	raw := consumeRaw(t, topic, 2)
	var got blobRecord
	if err := srSerde.Decode(raw[0].Value, &got); err != nil {
		t.Fatalf("sr.Serde decode of the chain's record: %v", err)
	}
	if got.ID != 1 || got.Item != "small" || string(got.Blob) != "tiny" {
		t.Fatalf("sr.Serde read %+v", got)
	}
	// The large one is a reference; resolved, sr.Serde reads it too.
	resolved := cons.Resolve(ctxT(t, time.Minute), raw)
	if resolved[1].Err != nil {
		t.Fatal(resolved[1].Err)
	}
	if err := srSerde.Decode(resolved[1].Value, &got); err != nil || got.ID != 2 || !bytes.Equal(got.Blob, large["blob"].([]byte)) {
		t.Fatalf("sr.Serde decode of the resolved large record: %v (id %d, %d blob bytes)", err, got.ID, len(got.Blob))
	}
	// The chain's deserializer reads both.
	for i, v := range decodeAll(t, cons, topic, 2) {
		if want := []map[string]any{small, large}[i]; !reflect.DeepEqual(v, want) {
			t.Fatalf("record %d decoded as %T (want %v)", i, v, want["item"])
		}
	}

	// The reverse: sr.Serde writes, the chain reads.
	other := newTopic(t, nil)
	register(t, other+"-value", blobAvro, sr.TypeAvro)
	b, err := srSerde.Encode(blobRecord{ID: 3, Item: "from-sr", Blob: []byte{0, 1, 2}})
	if err != nil {
		t.Fatal(err)
	}
	if err := client(t).ProduceSync(ctxT(t, time.Minute), &kgo.Record{Topic: other, Value: b}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"id": int64(3), "item": "from-sr", "blob": []byte{0, 1, 2}}
	if v := decodeAll(t, cons, other, 1)[0]; !reflect.DeepEqual(v, want) {
		t.Fatalf("the chain read sr.Serde's record as %#v", v)
	}

	// A value the schema refuses, and a topic whose subject has no schema.
	_, err = prod.ProduceValue(ctxT(t, time.Minute), topic, nil, map[string]any{"id": "not a long"})
	if !errors.Is(err, serde.ErrSchema) || !strings.Contains(err.Error(), "schema id") {
		t.Fatalf("a value its schema refuses: %v", err)
	}
	_, err = prod.ProduceValue(ctxT(t, time.Minute), newTopic(t, nil), nil, small)
	if !errors.Is(err, serde.ErrSchema) || !strings.Contains(err.Error(), "-value") {
		t.Fatalf("a subject without a schema: %v", err)
	}
}

// TestSerdeProtobufAndJSONSchema: the protobuf and json-schema stages round
// trip through the real broker and registry, write Confluent's framing
// (sr.ConfluentHeader reads the id and, for Protobuf, the message
// indexes), and refuse a JSON value its schema does not allow.
func TestSerdeProtobufAndJSONSchema(t *testing.T) {
	var h sr.ConfluentHeader
	t.Run("protobuf", func(t *testing.T) {
		prod, cons := schemaChain(t, "protobuf,large-message", "large-message,protobuf", nil)
		topic := newTopic(t, nil)
		text := "syntax = \"proto3\";\npackage dev.ferry.test;\n\nmessage Header { string k = 1; }\nmessage Order {\n  int64 id = 1;\n  string item = 2;\n}\n"
		id := register(t, topic+"-value", text, sr.TypeProtobuf)
		files, err := (&protocompile.Compiler{Resolver: &protocompile.SourceResolver{
			Accessor: protocompile.SourceAccessorFromMap(map[string]string{"o.proto": text})}}).Compile(context.Background(), "o.proto")
		if err != nil {
			t.Fatal(err)
		}
		md := files[0].Messages().ByName("Order")
		m := dynamicpb.NewMessage(md)
		m.Set(md.Fields().ByName("id"), protoreflect.ValueOfInt64(7))
		m.Set(md.Fields().ByName("item"), protoreflect.ValueOfString(strings.Repeat("p", 2_000_000)))
		rec, err := prod.ProduceValue(ctxT(t, time.Minute), topic, nil, m)
		if err != nil {
			t.Fatal(err)
		}
		if !largemessage.IsOffloaded(rec) {
			t.Fatal("a 2 MB Protobuf record was not offloaded")
		}
		resolved := cons.Resolve(ctxT(t, time.Minute), consumeRaw(t, topic, 1))
		gotID, rest, err := h.DecodeID(resolved[0].Value)
		if err != nil || gotID != id {
			t.Fatalf("framing: id %d (want %d): %v", gotID, id, err)
		}
		if idx, _, err := h.DecodeIndex(rest, 10); err != nil || !reflect.DeepEqual(idx, []int{1}) {
			t.Fatalf("message indexes %v (want [1]): %v", idx, err)
		}
		got := decodeAll(t, cons, topic, 1)[0]
		gm, ok := got.(proto.Message)
		if !ok {
			t.Fatalf("decoded %T", got)
		}
		// Compared field by field: the two messages' descriptors are compiled
		// apart, and dynamicpb's wire order of fields is not fixed.
		g := gm.ProtoReflect()
		if g.Descriptor().FullName() != md.FullName() {
			t.Fatalf("read back a %s", g.Descriptor().FullName())
		}
		for _, f := range []protoreflect.Name{"id", "item"} {
			if got, want := g.Get(g.Descriptor().Fields().ByName(f)), m.Get(md.Fields().ByName(f)); !got.Equal(want) {
				t.Fatalf("field %s read back as %.40v, want %.40v", f, got, want)
			}
		}
	})
	t.Run("json-schema", func(t *testing.T) {
		prod, cons := schemaChain(t, "json-schema,large-message", "large-message,json-schema", nil)
		topic := newTopic(t, nil)
		id := register(t, topic+"-value", ordersJSON, sr.TypeJSON)
		// 2^53+1: a float64 would read it back as 2^53.
		v := map[string]any{"id": json.Number("9007199254740993"), "item": "json"}
		if _, err := prod.ProduceValue(ctxT(t, time.Minute), topic, nil, v); err != nil {
			t.Fatal(err)
		}
		raw := consumeRaw(t, topic, 1)
		if gotID, _, err := h.DecodeID(raw[0].Value); err != nil || gotID != id {
			t.Fatalf("framing: id %d (want %d): %v", gotID, id, err)
		}
		if got := decodeAll(t, cons, topic, 1)[0]; !reflect.DeepEqual(got, v) {
			t.Fatalf("read back %#v", got)
		}
		_, err := prod.ProduceValue(ctxT(t, time.Minute), topic, nil, map[string]any{"item": "no id"})
		if !errors.Is(err, serde.ErrSchema) || !strings.Contains(err.Error(), "id") {
			t.Fatalf("a value missing a required property: %v", err)
		}
	})
}

// TestCLISchemaRegistryAvro: issue 21 item 6's second half. ferry produce
// with value.serializers=avro,large-message encodes JSON inputs (Avro's JSON
// encoding, as kafka-avro-console-producer reads it) under the subject's
// registered schema, one offloaded; what Kafka holds is Confluent's wire
// format, which franz-go's sr.Serde reads; ferry consume with
// value.deserializers=large-message,avro prints each value as a line of
// Avro JSON; an input that does not fit the schema is refused, naming the
// field, and nothing is produced for it.
func TestCLISchemaRegistryAvro(t *testing.T) {
	b := brokers(t)
	schemaRegistry(t)
	topic := newTopic(t, nil)
	id := register(t, topic+"-value", blobAvro, sr.TypeAvro)
	dir := t.TempDir()
	big := strings.Repeat("z", 200<<10) // offloaded: over the 64 KiB threshold below
	inputs := []string{`{"id": 1, "item": "one", "blob": "\u0000\u00ff"}`, `{"id": 2, "item": "two", "blob": "` + big + `"}`}
	var files []string
	for i, in := range inputs {
		p := filepath.Join(dir, fmt.Sprintf("r%d.json", i))
		if err := os.WriteFile(p, []byte(in), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, p)
	}
	sreg := "-Xschema.registry.url=" + registryURL()
	store := fileStoreURL(t)
	args := append([]string{"produce", "--brokers", b, "--topic", topic, "--store", store, sreg,
		"-Xvalue.serializers=avro,large-message", "-X" + largemessage.KeyThreshold + "=65536"}, files...)
	if code, out, errs := runCLI(t, args...); code != 0 || !strings.Contains(out, "offloaded") {
		t.Fatalf("produce exited %d: %s %s", code, out, errs)
	}
	raw := consumeRaw(t, topic, 2)
	api := avro.Config{MaxByteSliceSize: -1}.Freeze()
	schema := avro.MustParse(blobAvro)
	var srSerde sr.Serde
	srSerde.Register(id, blobRecord{}, sr.DecodeFn(func(b []byte, v any) error { return api.Unmarshal(schema, b, v) }))
	var got blobRecord
	if err := srSerde.Decode(raw[0].Value, &got); err != nil || got.ID != 1 || got.Item != "one" || !bytes.Equal(got.Blob, []byte{0, 0xff}) {
		t.Fatalf("sr.Serde read %+v: %v", got, err)
	}
	if !largemessage.IsOffloaded(raw[1]) {
		t.Fatal("the 200 KiB record is not offloaded")
	}

	code, out, errs := runCLI(t, "consume", "--brokers", b, "--topic", topic, "--store", store, sreg,
		"-Xvalue.deserializers=large-message,avro", "-n", "2")
	if code != 0 {
		t.Fatalf("consume exited %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("consume printed %d lines: %.300s", len(lines), out)
	}
	for i, line := range lines {
		var have, want map[string]any
		if err := json.Unmarshal([]byte(line), &have); err != nil {
			t.Fatalf("line %d is not JSON: %v: %.200s", i, err, line)
		}
		_ = json.Unmarshal([]byte(inputs[i]), &want)
		if !reflect.DeepEqual(have, want) {
			t.Fatalf("line %d: %.200s, want %.200s", i, line, inputs[i])
		}
	}

	// --out restores each input's name (the ferry.file.name header), the
	// decoded JSON in it.
	outDir := filepath.Join(dir, "out")
	if code, _, errs := runCLI(t, "consume", "--brokers", b, "--topic", topic, "--store", store, sreg,
		"-Xvalue.deserializers=large-message,avro", "-n", "2", "--out", outDir); code != 0 {
		t.Fatalf("consume --out exited %d: %s", code, errs)
	}
	if got, err := os.ReadFile(filepath.Join(outDir, "r0.json")); err != nil || !strings.Contains(string(got), `"item":"one"`) {
		t.Fatalf("consume --out: r0.json: %v %.200s", err, got)
	}

	notJSON := filepath.Join(dir, "notjson.json")
	if err := os.WriteFile(notJSON, []byte("id=3"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errs = runCLI(t, "produce", "--brokers", b, "--topic", topic, sreg, "-Xvalue.serializers=avro,large-message", notJSON)
	if code == 0 || !strings.Contains(errs, "is not JSON") || strings.Contains(errs, "broker") {
		t.Fatalf("an input that is not JSON: exit %d: %s", code, errs)
	}

	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"id": "x", "item": "bad", "blob": ""}`), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errs = runCLI(t, "produce", "--brokers", b, "--topic", topic, sreg, "-Xvalue.serializers=avro,large-message", bad)
	if code == 0 || !strings.Contains(errs, ".id: want an integer") {
		t.Fatalf("a bad input: exit %d: %s", code, errs)
	}
	if end := endOffset(t, topic); end != 2 {
		t.Fatalf("the topic holds %d records after the refused input, want 2", end)
	}

	// avro alone, no store: a small input goes inline; one over the
	// threshold is refused before it is sent, naming the stage that
	// would offload it (it is not offloaded behind the chain's back, and
	// no store is asked for).
	code, out, errs = runCLI(t, "produce", "--brokers", b, "--topic", topic, sreg, "-Xvalue.serializers=avro",
		"-X"+largemessage.KeyThreshold+"=65536", files[0])
	if code != 0 || strings.Contains(out, "offloaded") {
		t.Fatalf("a small input through avro alone: exit %d: %s %s", code, out, errs)
	}
	code, _, errs = runCLI(t, "produce", "--brokers", b, "--topic", topic, sreg, "-Xvalue.serializers=avro",
		"-X"+largemessage.KeyThreshold+"=65536", files[1])
	if code == 0 || !strings.Contains(errs, "value.serializers=avro,large-message") || strings.Contains(errs, "store") {
		t.Fatalf("a 200 KiB input through avro alone: exit %d: %s", code, errs)
	}
	if end := endOffset(t, topic); end != 3 {
		t.Fatalf("the topic holds %d records, want 3", end)
	}
	if raw := consumeRaw(t, topic, 3); largemessage.IsOffloaded(raw[2]) || !bytes.Equal(raw[2].Value, raw[0].Value) {
		t.Fatal("the small input through avro alone is not the inline bytes avro,large-message wrote")
	}
}
