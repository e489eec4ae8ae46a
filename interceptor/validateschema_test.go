package interceptor

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/ferrykit/ferry/internal/schemareg"
)

func TestValidateSchemaConfig(t *testing.T) {
	for _, tc := range []struct {
		config map[string]string
		want   string
	}{
		{map[string]string{}, KeySchemaRegistryURL + " is required"},
		{map[string]string{KeySchemaRegistryURL: "ftp://x"}, "not an http or https URL"},
		{map[string]string{KeySchemaRegistryURL: "http://r", KeyValueSubjectStrategy: "Nope"}, KeyValueSubjectStrategy},
		{map[string]string{KeySchemaRegistryURL: "http://r", KeyValidateSchemaValue: "false"}, "nothing to validate"},
		{map[string]string{KeySchemaRegistryURL: "http://r", KeyBasicAuthSource: "SASL_INHERIT"}, KeyBasicAuthSource},
		{map[string]string{KeySchemaRegistryURL: "http://r", KeyBasicAuthSource: "USER_INFO"}, KeyBasicAuthUserInfo},
		{map[string]string{KeySchemaRegistryURL: "http://r", KeySchemaRegistryCacheMax: "10"}, KeySchemaRegistryCacheMax},
		{map[string]string{KeySchemaRegistryURL: "http://r", KeyValidateSchemaMaxDepth: "0"}, KeyValidateSchemaMaxDepth},
		{map[string]string{KeySchemaRegistryURL: "http://r", KeySchemaRegistryTruststoreType: "JKS"}, "only PEM"},
		{map[string]string{KeySchemaRegistryURL: "http://r", KeySchemaRegistryTruststore: "/nonexistent.pem"}, KeySchemaRegistryTruststore},
	} {
		_, err := New(context.Background(), "validate-schema", tc.config)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config %v: error %v, want one naming %q", tc.config, err, tc.want)
		}
	}
}

// The codes producers get: INVALID_RECORD naming side, subject and id for a
// bad record; KAFKA_STORAGE_ERROR (retriable) when the registry fails, or
// the record let through with validate.schema.registry.unavailable.allow.
// The registry here is a stub for the outage only; integration tests use a
// real one.
func TestValidateSchemaCodes(t *testing.T) {
	var down atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case down.Load():
			http.Error(w, "down", http.StatusServiceUnavailable)
		case r.URL.Path == "/schemas/ids/1":
			_, _ = w.Write([]byte(`{"schema":"\"long\""}`))
		case r.URL.Path == "/schemas/ids/1/versions":
			_, _ = w.Write([]byte(`[{"subject":"orders-value","version":1}]`))
		default:
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error_code":40403,"message":"Schema not found"}`))
		}
	}))
	defer srv.Close()
	build := func(extra map[string]string) ProduceRequestInterceptor {
		cfg := map[string]string{KeySchemaRegistryURL: srv.URL}
		for k, v := range extra {
			cfg[k] = v
		}
		in, err := New(context.Background(), "validate-schema", cfg)
		if err != nil {
			t.Fatal(err)
		}
		return in.Produce
	}
	p := build(nil)
	ctx := context.Background()
	rec := func(v []byte) *Record { return &Record{Topic: "orders", Value: v, Key: []byte("not framed")} }
	if err := p.ProcessRecord(ctx, rec(schemareg.AppendFrame(nil, 1, nil, []byte{0x54}))); err != nil {
		t.Fatalf("valid record: %v", err)
	}
	if err := p.ProcessRecord(ctx, rec(nil)); err != nil {
		t.Fatalf("tombstone: %v", err)
	}
	for _, tc := range []struct {
		v    []byte
		want string
	}{
		{[]byte("plain"), "the record's value is not in the Confluent wire format"},
		{schemareg.AppendFrame(nil, 2, nil, []byte{0x54}), "schema id 2: schema id not registered"},
		{schemareg.AppendFrame(nil, 1, nil, []byte{0x80}), "subject orders-value, schema id 1: payload does not decode"},
	} {
		err := p.ProcessRecord(ctx, rec(tc.v))
		if !errors.Is(err, kerr.InvalidRecord) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("value %x: %v, want INVALID_RECORD with %q", tc.v, err, tc.want)
		}
	}
	// Keys are checked only when asked.
	if err := build(map[string]string{KeyValidateSchemaKey: "true"}).ProcessRecord(ctx, rec(schemareg.AppendFrame(nil, 1, nil, []byte{0x54}))); !errors.Is(err, kerr.InvalidRecord) || !strings.Contains(err.Error(), "key") {
		t.Fatalf("unframed key with validate.schema.key: %v", err)
	}
	down.Store(true)
	fresh := rec(schemareg.AppendFrame(nil, 3, nil, []byte{0x54}))
	if err := p.ProcessRecord(ctx, fresh); !errors.Is(err, kerr.KafkaStorageError) {
		t.Fatalf("registry down: %v, want KAFKA_STORAGE_ERROR", err)
	}
	if err := build(map[string]string{KeyValidateSchemaUnavailableAllow: "true"}).ProcessRecord(ctx, fresh); err != nil {
		t.Fatalf("registry down with %s: %v", KeyValidateSchemaUnavailableAllow, err)
	}
}

// Field rules: CEL expressions over the decoded record; each failure names
// the rule; the cost bound stops a rule that would run long, at the limit;
// a rule that does not compile or is not bool is a configuration error
// naming its key.
func TestValidateSchemaRules(t *testing.T) {
	for _, tc := range []struct {
		config map[string]string
		want   string
	}{
		{map[string]string{KeyValidateSchemaRulePrefix + "bad": "value.id >"}, "does not compile"},
		{map[string]string{KeyValidateSchemaRulePrefix + "notbool": "1 + 2"}, "not bool"},
		{map[string]string{KeyValidateSchemaRulePrefix: "true"}, "needs a name"},
		{map[string]string{KeyValidateSchemaRulePrefix + "x": "true", KeyValidateSchemaRuleCostMax: "0"}, KeyValidateSchemaRuleCostMax},
	} {
		tc.config[KeySchemaRegistryURL] = "http://r"
		_, err := New(context.Background(), "validate-schema", tc.config)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config %v: error %v, want one naming %q", tc.config, err, tc.want)
		}
	}
	ctx := context.Background()
	rules, err := schemaRules(map[string]string{
		KeyValidateSchemaRulePrefix + "positive-id":  "value.id > 0",
		KeyValidateSchemaRulePrefix + "items-small":  "value.items.all(i, i < 100)",
		KeyValidateSchemaRulePrefix + "topic-prefix": "topic.startsWith('orders')",
	})
	if err != nil {
		t.Fatal(err)
	}
	items := make([]any, 1000)
	for i := range items {
		items[i] = int64(i % 50)
	}
	// Avro ints and longs, JSON float64s, fixed as [N]byte: all compare.
	for _, v := range []map[string]any{{"id": int64(7), "items": items}, {"id": 2.5, "items": []any{}}, {"id": int32(1), "items": []any{}, "f": [2]byte{1, 2}}} {
		if err := checkRules(ctx, rules, "orders", nil, v); err != nil {
			t.Errorf("%v: %v", v["id"], err)
		}
	}
	for _, tc := range []struct {
		topic string
		value map[string]any
		want  string
	}{
		{"orders", map[string]any{"id": int64(0), "items": []any{}}, "rule positive-id (value.id > 0) is false"},
		{"orders", map[string]any{"id": int64(1), "items": []any{int64(100)}}, "rule items-small"},
		{"orders", map[string]any{"items": []any{}}, "rule positive-id (value.id > 0): no such key: id"},
		{"other", map[string]any{"id": int64(1), "items": []any{}}, "rule topic-prefix"},
	} {
		if err := checkRules(ctx, rules, tc.topic, nil, tc.value); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.value, err, tc.want)
		}
	}
	// The cost bound: 1000 items cost over 1000 units; at 100000 they pass.
	for limit, ok := range map[string]bool{"500": false, "100000": true} {
		costly, err := schemaRules(map[string]string{KeyValidateSchemaRulePrefix + "all": "value.items.all(i, i >= 0)", KeyValidateSchemaRuleCostMax: limit})
		if err != nil {
			t.Fatal(err)
		}
		err = checkRules(ctx, costly, "orders", nil, map[string]any{"items": items})
		if (err == nil) != ok || !ok && !strings.Contains(err.Error(), "cost") {
			t.Errorf("cost limit %s: %v", limit, err)
		}
	}
}
