package schemareg

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
)

// fakeRegistry serves GET /schemas/ids/{id} and /schemas/ids/{id}/versions
// of Confluent's REST API from a map, and fails on demand: the faults (an
// outage, a 500) that the real registry of the integration tests cannot be
// made to produce on cue.
type fakeRegistry struct {
	schemas map[int]sr.Schema
	subject map[int][]string
	byVer   map[string]sr.Schema // "subject/version" for references
	down    atomic.Bool
	calls   atomic.Int64
}

func (f *fakeRegistry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.calls.Add(1)
	if f.down.Load() {
		http.Error(w, `{"error_code":50001,"message":"down"}`, http.StatusInternalServerError)
		return
	}
	var id int
	var rest string
	if sub, ok := strings.CutPrefix(r.URL.Path, "/subjects/"); ok {
		name, ver, _ := strings.Cut(sub, "/versions/")
		s, ok := f.byVer[name+"/"+ver]
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error_code":40401,"message":"Subject not found"}`))
			return
		}
		_ = json.NewEncoder(w).Encode(sr.SubjectSchema{Subject: name, Version: 1, ID: 100, Schema: s})
		return
	}
	if _, err := fmt.Sscanf(r.URL.Path, "/schemas/ids/%d", &id); err != nil {
		http.NotFound(w, r)
		return
	}
	rest = strings.TrimPrefix(r.URL.Path, fmt.Sprintf("/schemas/ids/%d", id))
	s, ok := f.schemas[id]
	if !ok {
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"error_code":40403,"message":"Schema not found"}`))
		return
	}
	switch rest {
	case "":
		_ = json.NewEncoder(w).Encode(s)
	case "/versions":
		var vs []sr.SubjectVersion
		for _, sub := range f.subject[id] {
			vs = append(vs, sr.SubjectVersion{Subject: sub, Version: 1})
		}
		_ = json.NewEncoder(w).Encode(vs)
	default:
		http.NotFound(w, r)
	}
}

func newTestRegistry(t *testing.T, f *fakeRegistry, cacheMax int64) *Registry {
	t.Helper()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	cl, err := sr.NewClient(sr.URLs(srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	return New(Config{Client: cl, Timeout: 5 * time.Second, CacheMaxBytes: cacheMax, Limits: testLimits})
}

func TestRegistryCheck(t *testing.T) {
	f := &fakeRegistry{
		schemas: map[int]sr.Schema{1: {Schema: testAvroSchema}, 2: {Schema: testJSONSchema, Type: sr.TypeJSON},
			3: {Schema: testProto, Type: sr.TypeProtobuf}, 4: {Schema: `"long"`}},
		subject: map[int][]string{1: {"orders-value", "dev.ferry.test.Order", "orders-dev.ferry.test.Order"},
			2: {"orders-value"}, 3: {"orders-value"}, 4: {"other-value"}},
	}
	reg := newTestRegistry(t, f, 1<<20)
	ctx := context.Background()
	as, _ := parseAvro(testAvroSchema, nil)
	avroBytes, err := avro.Marshal(as.s, testAvroValue())
	if err != nil {
		t.Fatal(err)
	}
	good := AppendFrame(nil, 1, nil, avroBytes)
	for _, st := range []Strategy{TopicName, RecordName, TopicRecordName} {
		if _, _, err := reg.Check(ctx, "orders", false, st, good); err != nil {
			t.Fatalf("strategy %d: %v", st, err)
		}
	}
	if _, _, err := reg.Check(ctx, "orders", false, TopicName, AppendFrame(nil, 2, nil, []byte(`{"id":3}`))); err != nil {
		t.Fatalf("JSON Schema: %v", err)
	}
	if _, _, err := reg.Check(ctx, "orders", false, TopicName, AppendFrame(nil, 3, []int{0}, []byte{0x08, 0x2a})); err != nil {
		t.Fatalf("Protobuf: %v", err)
	}
	for _, tc := range []struct {
		name    string
		topic   string
		b       []byte
		want    error
		subject string
	}{
		{"unframed", "orders", avroBytes, ErrNotFramed, ""},
		{"unknown id", "orders", AppendFrame(nil, 99, nil, avroBytes), ErrUnknownSchema, "orders-value"},
		{"id of another subject", "orders", AppendFrame(nil, 4, nil, []byte{2}), ErrUnknownSchema, "orders-value"},
		{"bytes that do not decode", "orders", AppendFrame(nil, 1, nil, avroBytes[:5]), ErrInvalidPayload, "orders-value"},
		{"key subject", "orders", good, ErrUnknownSchema, "orders-key"},
	} {
		subject, _, err := reg.Check(ctx, tc.topic, tc.name == "key subject", TopicName, tc.b)
		if !errors.Is(err, tc.want) || subject != tc.subject {
			t.Errorf("%s: subject %q, %v; want %q, %v", tc.name, subject, err, tc.subject, tc.want)
		}
	}
	// Cached: the same checks again cost no call, unknown ids included.
	before := f.calls.Load()
	_, _, _ = reg.Check(ctx, "orders", false, TopicName, good)
	_, _, _ = reg.Check(ctx, "orders", false, TopicName, AppendFrame(nil, 4, nil, []byte{2}))
	if n := f.calls.Load() - before; n != 0 {
		t.Fatalf("%d registry calls for cached checks", n)
	}
	// An outage: a schema not yet cached fails with ErrUnavailable, the
	// cached ones still pass; once back, it recovers by itself.
	f.down.Store(true)
	f.schemas[5] = sr.Schema{Schema: `"string"`}
	f.subject[5] = []string{"orders-value"}
	if _, _, err := reg.Check(ctx, "orders", false, TopicName, AppendFrame(nil, 5, nil, []byte{2, 'a'})); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("registry down: %v, want ErrUnavailable", err)
	}
	if _, _, err := reg.Check(ctx, "orders", false, TopicName, good); err != nil {
		t.Fatalf("cached schema while the registry is down: %v", err)
	}
	f.down.Store(false)
	if _, _, err := reg.Check(ctx, "orders", false, TopicName, AppendFrame(nil, 5, nil, []byte{2, 'a'})); err != nil {
		t.Fatalf("registry back: %v", err)
	}
}

// The cache stays within its bound, and a schema too large for it is
// refused with ErrBadSchema, not fetched again and again.
func TestRegistryCacheBound(t *testing.T) {
	f := &fakeRegistry{schemas: map[int]sr.Schema{}, subject: map[int][]string{}}
	for id := 1; id <= 200; id++ {
		f.schemas[id] = sr.Schema{Schema: fmt.Sprintf(`{"type":"fixed","name":"F%d","size":1,"doc":"%s"}`, id, strings.Repeat("x", 900))}
		f.subject[id] = []string{"t-value"}
	}
	f.schemas[1000] = sr.Schema{Schema: `{"type":"fixed","name":"Big","size":1,"doc":"` + strings.Repeat("x", 20000) + `"}`}
	f.subject[1000] = []string{"t-value"}
	const bound = 64 << 10
	reg := newTestRegistry(t, f, bound)
	for id := 1; id <= 200; id++ {
		if _, _, err := reg.Check(context.Background(), "t", false, TopicName, AppendFrame(nil, id, nil, []byte{7})); err != nil {
			t.Fatalf("id %d: %v", id, err)
		}
		if n := reg.CachedBytes(); n > bound {
			t.Fatalf("cache at %d bytes, over its bound %d", n, bound)
		}
	}
	if _, _, err := reg.Check(context.Background(), "t", false, TopicName, AppendFrame(nil, 1000, nil, []byte{7})); !errors.Is(err, ErrBadSchema) {
		t.Fatalf("schema over a sixteenth of the cache: %v, want ErrBadSchema", err)
	}
}

// Schema references (Avro named types, JSON Schema $ref, Protobuf imports)
// are fetched from their subjects' versions, nested ones first; a missing
// one and a cycle are bounded.
func TestRegistryReferences(t *testing.T) {
	item := `{"type":"record","name":"Item","namespace":"dev.ferry.test","fields":[{"name":"sku","type":"string"}]}`
	order := `{"type":"record","name":"Order","namespace":"dev.ferry.test","fields":[{"name":"item","type":"dev.ferry.test.Item"}]}`
	f := &fakeRegistry{
		schemas: map[int]sr.Schema{
			1: {Schema: order, References: []sr.SchemaReference{{Name: "dev.ferry.test.Item", Subject: "item", Version: 1}}},
			2: {Schema: `{"type":"object","properties":{"a":{"$ref":"a.json"}}}`, Type: sr.TypeJSON,
				References: []sr.SchemaReference{{Name: "a.json", Subject: "a", Version: 1}}},
			3: {Schema: "syntax = \"proto3\";\nimport \"item.proto\";\nmessage Order { Item item = 1; }\n", Type: sr.TypeProtobuf,
				References: []sr.SchemaReference{{Name: "item.proto", Subject: "pitem", Version: 1}}},
			4: {Schema: order, References: []sr.SchemaReference{{Name: "dev.ferry.test.Item", Subject: "missing", Version: 1}}},
			5: {Schema: order, References: []sr.SchemaReference{{Name: "x", Subject: "loop0", Version: 1}}},
		},
		subject: map[int][]string{1: {"orders-value"}, 2: {"orders-value"}, 3: {"orders-value"}, 4: {"orders-value"}, 5: {"orders-value"}},
		byVer: map[string]sr.Schema{
			"item/1":  {Schema: item},
			"a/1":     {Schema: `{"type":"integer"}`, Type: sr.TypeJSON},
			"pitem/1": {Schema: "syntax = \"proto3\";\nmessage Item { string sku = 1; }\n", Type: sr.TypeProtobuf},
		},
	}
	for i := range maxReferenceDepth + 2 { // a chain longer than the bound
		f.byVer[fmt.Sprintf("loop%d/1", i)] = sr.Schema{Schema: `"null"`, References: []sr.SchemaReference{{Name: "x", Subject: fmt.Sprintf("loop%d", i+1), Version: 1}}}
	}
	reg := newTestRegistry(t, f, 1<<20)
	ctx := context.Background()
	if _, _, err := reg.Check(ctx, "orders", false, TopicName, AppendFrame(nil, 1, nil, []byte{6, 'a', 'b', 'c'})); err != nil {
		t.Fatalf("Avro with a reference: %v", err)
	}
	if _, _, err := reg.Check(ctx, "orders", false, TopicName, AppendFrame(nil, 1, nil, []byte{6, 'a'})); !errors.Is(err, ErrInvalidPayload) {
		t.Fatalf("Avro with a reference, truncated: %v", err)
	}
	if _, _, err := reg.Check(ctx, "orders", false, TopicName, AppendFrame(nil, 2, nil, []byte(`{"a":1}`))); err != nil {
		t.Fatalf("JSON Schema with a reference: %v", err)
	}
	if _, _, err := reg.Check(ctx, "orders", false, TopicName, AppendFrame(nil, 2, nil, []byte(`{"a":"x"}`))); !errors.Is(err, ErrInvalidPayload) {
		t.Fatalf("JSON Schema with a reference, invalid: %v", err)
	}
	if _, _, err := reg.Check(ctx, "orders", false, TopicName, AppendFrame(nil, 3, []int{0}, []byte{0x0a, 0x02, 0x0a, 0x00})); err != nil {
		t.Fatalf("Protobuf with an import: %v", err)
	}
	if _, _, err := reg.Check(ctx, "orders", false, TopicName, AppendFrame(nil, 4, nil, []byte{0})); !errors.Is(err, ErrUnknownSchema) {
		t.Fatalf("a missing reference: %v", err)
	}
	if _, _, err := reg.Check(ctx, "orders", false, TopicName, AppendFrame(nil, 5, nil, []byte{0})); !errors.Is(err, ErrBadSchema) || !strings.Contains(err.Error(), "deeper than") {
		t.Fatalf("references nested past the bound: %v", err)
	}
}
