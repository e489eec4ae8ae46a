package interceptor

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/ferrykit/ferry/internal/schemareg"
)

// stubRegistry serves schemas by id (each registered under orders-value
// and orders-key) and fails with 503 while down: the outage a real
// registry cannot be made to have on cue.
func stubRegistry(t *testing.T, schemas map[int][2]string) (url string, down *atomic.Bool, schemaCalls *atomic.Int64) {
	t.Helper()
	down, schemaCalls = new(atomic.Bool), new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/versions") {
			schemaCalls.Add(1)
		}
		if down.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		var id int
		var rest string
		if n, _ := fmt.Sscanf(r.URL.Path, "/schemas/ids/%d%s", &id, &rest); n >= 1 {
			if s, ok := schemas[id]; ok {
				if rest == "/versions" {
					_, _ = w.Write([]byte(`[{"subject":"orders-value","version":1},{"subject":"orders-key","version":1}]`))
					return
				}
				_ = json.NewEncoder(w).Encode(map[string]string{"schema": s[0], "schemaType": s[1]})
				return
			}
		}
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"error_code":40403,"message":"Schema not found"}`))
	}))
	t.Cleanup(srv.Close)
	return srv.URL, down, schemaCalls
}

func buildValidateSchema(t *testing.T, cfg map[string]string) ProduceRequestInterceptor {
	t.Helper()
	in, err := New(context.Background(), "validate-schema", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.Close() })
	return in.Produce
}

// Hostile values a client sends through rules: JSON integers a double
// would round must not slip past a rule comparing them (ids beyond 2^53);
// integers within 2^53 stay doubles, so double arithmetic still works; a
// few Avro bytes claiming millions of nulls are refused before they are
// decoded (with rules), and still pass the walk alone (no rules).
func TestValidateSchemaRulesHostileValues(t *testing.T) {
	url, _, _ := stubRegistry(t, map[int][2]string{
		1: {`{"type":"object"}`, "JSON"},
		2: {`{"type":"array","items":"null"}`, "AVRO"},
	})
	p := buildValidateSchema(t, map[string]string{KeySchemaRegistryURL: url,
		KeyValidateSchemaRulePrefix + "not-blocked": "!has(value.id) || value.id != 1234567890123456789",
		KeyValidateSchemaRulePrefix + "cheap":       "!has(value.price) || value.price * 2.0 < 100.0",
		KeyValidateSchemaRulePrefix + "max":         "!has(value.n) || value.n <= 9007199254740992",
	})
	ctx := context.Background()
	rec := func(v []byte) *Record { return &Record{Topic: "orders", Value: v} }
	for _, ok := range []string{`{"id":1234567890123456788}`, `{"price":5}`, `{"price":5.5}`, `{"n":9007199254740992}`, `{"id":18446744073709551615}`} {
		if err := p.ProcessRecord(ctx, rec(schemareg.AppendFrame(nil, 1, nil, []byte(ok)))); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, tc := range []struct{ v, want string }{
		{`{"id":1234567890123456789}`, "rule not-blocked"},
		{`{"n":9007199254740993}`, "rule max"},
		{`{"price":60}`, "rule cheap"},
		{`{"n":1e400}`, "out of range"},
	} {
		err := p.ProcessRecord(ctx, rec(schemareg.AppendFrame(nil, 1, nil, []byte(tc.v))))
		if !errors.Is(err, kerr.InvalidRecord) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want INVALID_RECORD naming %q", tc.v, err, tc.want)
		}
	}
	nulls := schemareg.AppendFrame(nil, 2, nil, append(binary.AppendVarint(nil, 9_000_000), 0))
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	err := p.ProcessRecord(ctx, rec(nulls))
	runtime.ReadMemStats(&m1)
	if !errors.Is(err, kerr.InvalidRecord) || !strings.Contains(err.Error(), "take no bytes") {
		t.Fatalf("9M nulls in 5 bytes, with rules: %v", err)
	}
	if grew := m1.TotalAlloc - m0.TotalAlloc; grew > 4<<20 {
		t.Errorf("refusing 9M nulls allocated %d bytes", grew)
	}
	if err := buildValidateSchema(t, map[string]string{KeySchemaRegistryURL: url}).ProcessRecord(ctx, rec(nulls)); err != nil {
		t.Fatalf("9M nulls in 5 bytes, walked without rules: %v", err)
	}
}

// The registry down mid-stream, with rules: records whose schema is cached
// are still checked, rules included; one that needs the registry fails
// with the retriable KAFKA_STORAGE_ERROR, or, with
// validate.schema.registry.unavailable.allow, passes unchecked (rules
// too). With keys checked, a key the registry cannot answer for does not
// let an invalid value through when the value's schema is cached.
func TestValidateSchemaRulesRegistryDown(t *testing.T) {
	url, down, _ := stubRegistry(t, map[int][2]string{1: {`"long"`, "AVRO"}, 2: {`"string"`, "AVRO"}})
	ctx := context.Background()
	long := func(v int64) []byte { return schemareg.AppendFrame(nil, 1, nil, binary.AppendVarint(nil, v)) }
	for _, allow := range []bool{false, true} {
		down.Store(false)
		p := buildValidateSchema(t, map[string]string{KeySchemaRegistryURL: url, KeyValidateSchemaKey: "true",
			KeyValidateSchemaUnavailableAllow:        fmt.Sprint(allow),
			KeyValidateSchemaRulePrefix + "positive": "value > 0"})
		if err := p.ProcessRecord(ctx, &Record{Topic: "orders", Key: long(1), Value: long(5)}); err != nil {
			t.Fatalf("allow=%v: warm-up: %v", allow, err)
		}
		down.Store(true)
		if err := p.ProcessRecord(ctx, &Record{Topic: "orders", Key: long(1), Value: long(5)}); err != nil {
			t.Errorf("allow=%v: cached schema during the outage: %v", allow, err)
		}
		if err := p.ProcessRecord(ctx, &Record{Topic: "orders", Key: long(1), Value: long(-5)}); !errors.Is(err, kerr.InvalidRecord) || !strings.Contains(err.Error(), "rule positive") {
			t.Errorf("allow=%v: cached schema, rule false, during the outage: %v", allow, err)
		}
		key2 := schemareg.AppendFrame(nil, 2, nil, []byte{2, 'k'}) // schema 2: not cached
		err := p.ProcessRecord(ctx, &Record{Topic: "orders", Key: key2, Value: long(5)})
		if allow && err != nil || !allow && !errors.Is(err, kerr.KafkaStorageError) {
			t.Errorf("allow=%v: uncached key schema during the outage: %v", allow, err)
		}
		bad := schemareg.AppendFrame(nil, 1, nil, []byte{0x80}) // truncated varint under a cached schema
		if err := p.ProcessRecord(ctx, &Record{Topic: "orders", Key: key2, Value: bad}); !errors.Is(err, kerr.InvalidRecord) && !(!allow && errors.Is(err, kerr.KafkaStorageError)) {
			t.Errorf("allow=%v: uncached key, undecodable value during the outage: %v", allow, err)
		}
		err = p.ProcessRecord(ctx, &Record{Topic: "orders", Value: schemareg.AppendFrame(nil, 2, nil, []byte{2, 'v'})})
		if allow && err != nil || !allow && !errors.Is(err, kerr.KafkaStorageError) {
			t.Errorf("allow=%v: uncached value schema during the outage: %v", allow, err)
		}
		down.Store(false)
		if err := p.ProcessRecord(ctx, &Record{Topic: "orders", Key: key2, Value: long(-1)}); !errors.Is(err, kerr.InvalidRecord) || !strings.Contains(err.Error(), "rule positive") {
			t.Errorf("allow=%v: after the outage: %v", allow, err)
		}
	}
}

// validate.schema.protobuf.max.messages at its limit: a payload of that
// many nested messages passes, one more is refused with INVALID_RECORD.
func TestValidateSchemaProtobufMessages(t *testing.T) {
	url, _, _ := stubRegistry(t, map[int][2]string{1: {"syntax = \"proto3\";\nmessage O { message L { int32 n = 1; } repeated L lines = 1; }\n", "PROTOBUF"}})
	p := buildValidateSchema(t, map[string]string{KeySchemaRegistryURL: url, KeyValidateSchemaMaxMessages: "3"})
	ctx := context.Background()
	lines := func(n int) []byte {
		return schemareg.AppendFrame(nil, 1, []int{0}, []byte(strings.Repeat("\x0a\x00", n)))
	}
	if err := p.ProcessRecord(ctx, &Record{Topic: "orders", Value: lines(3)}); err != nil {
		t.Fatalf("3 messages at the bound 3: %v", err)
	}
	if err := p.ProcessRecord(ctx, &Record{Topic: "orders", Value: lines(4)}); !errors.Is(err, kerr.InvalidRecord) || !strings.Contains(err.Error(), "more than 3 nested messages") {
		t.Fatalf("4 messages over the bound 3: %v", err)
	}
	if _, err := New(ctx, "validate-schema", map[string]string{KeySchemaRegistryURL: url, KeyValidateSchemaMaxMessages: "-1"}); err == nil || !strings.Contains(err.Error(), KeyValidateSchemaMaxMessages) {
		t.Fatalf("a negative bound: %v", err)
	}
}

// Many producers at once through one instance with rules, over more
// schemas than schema.registry.cache.max.bytes holds (each schema about
// 3.5 KiB, 14 KiB of cost: four fit in the 64 KiB minimum), so entries
// are evicted and fetched again under load: every valid record passes,
// every invalid one is refused for its own reason (run with -race).
func TestValidateSchemaRulesConcurrentEviction(t *testing.T) {
	const schemas = 12
	m := map[int][2]string{}
	for i := 1; i <= schemas; i++ {
		doc := fmt.Sprintf(`{"type":"record","name":"R%d","doc":"%s","fields":[{"name":"n","type":"long"}]}`, i, strings.Repeat("d", 3500))
		m[i] = [2]string{doc, "AVRO"}
	}
	url, _, calls := stubRegistry(t, m)
	p := buildValidateSchema(t, map[string]string{KeySchemaRegistryURL: url, KeySchemaRegistryCacheMax: "65536",
		KeyValidateSchemaRulePrefix + "positive": "value.n > 0"})
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 60 {
				id := (g*7+i)%schemas + 1
				n := int64(i%5 - 1) // -1 and 0 break the rule
				err := p.ProcessRecord(ctx, &Record{Topic: "orders", Value: schemareg.AppendFrame(nil, id, nil, binary.AppendVarint(nil, n))})
				switch {
				case n > 0 && err != nil:
					errs <- fmt.Errorf("id %d, n %d: %v", id, n, err)
				case n <= 0 && (!errors.Is(err, kerr.InvalidRecord) || !strings.Contains(err.Error(), "rule positive")):
					errs <- fmt.Errorf("id %d, n %d: %v, want the rule's INVALID_RECORD", id, n, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := calls.Load(); n <= schemas {
		t.Errorf("%d schema fetches for %d schemas: the cache did not evict, so the test proved nothing", n, schemas)
	}
}
