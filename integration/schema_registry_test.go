package integration

// The real schema registry that scripts/test starts (scripts/schema-registry:
// Apicurio Registry's Confluent-compatible API), driven by franz-go's sr
// client as a Confluent client would: these tests check that what later
// schema-aware code will lean on (ids, versions, compatibility, the error
// codes) behaves as Confluent Schema Registry's REST API documents it.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
)

// schemaRegistry returns a client of the registry at FERRY_SCHEMA_REGISTRY_URL
// or skips (fails under CI, like brokers).
func schemaRegistry(t testing.TB) *sr.Client {
	t.Helper()
	url := os.Getenv("FERRY_SCHEMA_REGISTRY_URL")
	if url == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("FERRY_SCHEMA_REGISTRY_URL is not set: run the tests with scripts/test, which starts a real schema registry")
		}
		t.Skip("FERRY_SCHEMA_REGISTRY_URL not set; scripts/test starts a real schema registry (scripts/schema-registry start)")
	}
	cl, err := sr.NewClient(sr.URLs(url))
	if err != nil {
		t.Fatalf("sr client for %s: %v", url, err)
	}
	return cl
}

const (
	ordersAvro = `{"type":"record","name":"Order","namespace":"dev.ferry.test","fields":[` +
		`{"name":"id","type":"long"},{"name":"item","type":"string"}]}`
	// Backward compatible with ordersAvro: a new field with a default.
	ordersAvroV2 = `{"type":"record","name":"Order","namespace":"dev.ferry.test","fields":[` +
		`{"name":"id","type":"long"},{"name":"item","type":"string"},{"name":"qty","type":"int","default":1}]}`
	// Not backward compatible: id changes type.
	ordersAvroBroken = `{"type":"record","name":"Order","namespace":"dev.ferry.test","fields":[` +
		`{"name":"id","type":"string"},{"name":"item","type":"string"}]}`
	ordersProto = "syntax = \"proto3\";\npackage dev.ferry.test;\n\nmessage Order {\n  int64 id = 1;\n  string item = 2;\n}\n"
	ordersJSON  = `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object",` +
		`"properties":{"id":{"type":"integer"},"item":{"type":"string"}},"required":["id"]}`
)

// sameJSON reports whether two JSON texts hold the same value (a registry may
// store a schema re-serialized).
func sameJSON(t *testing.T, a, b string) bool {
	t.Helper()
	var va, vb any
	if err := json.Unmarshal([]byte(a), &va); err != nil {
		t.Fatalf("not JSON: %v: %s", err, a)
	}
	if err := json.Unmarshal([]byte(b), &vb); err != nil {
		t.Fatalf("not JSON: %v: %s", err, b)
	}
	return reflect.DeepEqual(va, vb)
}

// responseError unwraps the registry's error response, failing the test when
// err is not one.
func responseError(t *testing.T, op string, err error) *sr.ResponseError {
	t.Helper()
	var re *sr.ResponseError
	if !errors.As(err, &re) {
		t.Fatalf("%s: want the registry's error response, got %v", op, err)
	}
	return re
}

// TestSchemaRegistryTypes registers an Avro schema under orders-value and a
// Protobuf and a JSON Schema one, and reads each back by id and by version.
func TestSchemaRegistryTypes(t *testing.T) {
	cl := schemaRegistry(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	cases := []struct {
		subject string
		schema  sr.Schema
		same    func(got string) bool
	}{
		{"orders-value", sr.Schema{Schema: ordersAvro}, func(got string) bool { return sameJSON(t, got, ordersAvro) }},
		{"orders-proto-value", sr.Schema{Schema: ordersProto, Type: sr.TypeProtobuf}, nil},
		{"orders-json-value", sr.Schema{Schema: ordersJSON, Type: sr.TypeJSON}, func(got string) bool { return sameJSON(t, got, ordersJSON) }},
	}
	ids := map[int]string{}
	for _, c := range cases {
		id, err := cl.RegisterSchema(ctx, c.subject, c.schema, -1, -1)
		if err != nil {
			t.Fatalf("register %s under %s: %v", c.schema.Type, c.subject, err)
		}
		if id <= 0 {
			t.Fatalf("register %s under %s: id %d, want > 0", c.schema.Type, c.subject, id)
		}
		if prev, dup := ids[id]; dup {
			t.Fatalf("%s and %s got the same id %d for different schemas", prev, c.subject, id)
		}
		ids[id] = c.subject

		// Registering the same schema again is idempotent: same id, no new version.
		again, err := cl.RegisterSchema(ctx, c.subject, c.schema, -1, -1)
		if err != nil || again != id {
			t.Fatalf("re-register under %s: id %d, %v; want %d", c.subject, again, err, id)
		}
		versions, err := cl.SubjectVersions(ctx, c.subject)
		if err != nil {
			t.Fatalf("versions of %s: %v", c.subject, err)
		}
		if len(versions) != 1 {
			t.Fatalf("versions of %s after registering one schema twice: %v, want one", c.subject, versions)
		}

		got, err := cl.SchemaByID(ctx, id)
		if err != nil {
			t.Fatalf("schema id %d (%s): %v", id, c.subject, err)
		}
		if got.Type != c.schema.Type {
			t.Fatalf("schema id %d: type %s, want %s", id, got.Type, c.schema.Type)
		}
		if c.same != nil && !c.same(got.Schema) || c.same == nil && got.Schema != c.schema.Schema {
			t.Fatalf("schema id %d: text %q, want %q", id, got.Schema, c.schema.Schema)
		}

		// By subject and version: the same id, and a lookup finds it.
		byVersion, err := cl.SchemaByVersion(ctx, c.subject, versions[0])
		if err != nil {
			t.Fatalf("%s version %d: %v", c.subject, versions[0], err)
		}
		if byVersion.ID != id || byVersion.Subject != c.subject || byVersion.Type != c.schema.Type {
			t.Fatalf("%s version %d: id %d subject %q type %s; want id %d, %s", c.subject, versions[0],
				byVersion.ID, byVersion.Subject, byVersion.Type, id, c.schema.Type)
		}
		found, err := cl.LookupSchema(ctx, c.subject, c.schema)
		if err != nil {
			t.Fatalf("lookup under %s: %v", c.subject, err)
		}
		if found.ID != id || found.Version != versions[0] {
			t.Fatalf("lookup under %s: id %d version %d; want %d, %d", c.subject, found.ID, found.Version, id, versions[0])
		}
	}

	subjects, err := cl.Subjects(ctx)
	if err != nil {
		t.Fatalf("subjects: %v", err)
	}
	for _, c := range cases {
		if !slices.Contains(subjects, c.subject) {
			t.Fatalf("subjects %v lack %s", subjects, c.subject)
		}
	}
	t.Logf("ids: %v", ids)
}

// TestSchemaRegistryCompatibility checks Confluent's compatibility behaviour:
// BACKWARD by default, the compatibility endpoint's verdicts, a 409 for an
// incompatible registration, versions numbered from 1, and schema ids that
// are global (the same schema under two subjects has one id).
func TestSchemaRegistryCompatibility(t *testing.T) {
	cl := schemaRegistry(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	global := cl.Compatibility(ctx)
	if len(global) != 1 || global[0].Err != nil {
		t.Fatalf("global compatibility: %+v", global)
	}
	if global[0].Level != sr.CompatBackward {
		t.Fatalf("global compatibility %s, want BACKWARD (Confluent's default)", global[0].Level)
	}

	subject := fmt.Sprintf("ferry-it-evolve-%d-value", time.Now().UnixNano())
	v1, err := cl.RegisterSchema(ctx, subject, sr.Schema{Schema: ordersAvro}, -1, -1)
	if err != nil {
		t.Fatalf("register v1 under %s: %v", subject, err)
	}

	// The same schema in another subject: the same global id.
	orders, err := cl.RegisterSchema(ctx, "orders-value", sr.Schema{Schema: ordersAvro}, -1, -1)
	if err != nil {
		t.Fatalf("register under orders-value: %v", err)
	}
	if orders != v1 {
		t.Fatalf("one schema under two subjects got ids %d and %d; Confluent gives one id", v1, orders)
	}

	ok, err := cl.CheckCompatibility(ctx, subject, -1, sr.Schema{Schema: ordersAvroV2})
	if err != nil {
		t.Fatalf("check compatibility of v2: %v", err)
	}
	if !ok.Is {
		t.Fatalf("a field added with a default is not backward compatible: %+v", ok)
	}
	bad, err := cl.CheckCompatibility(ctx, subject, -1, sr.Schema{Schema: ordersAvroBroken})
	if err != nil {
		t.Fatalf("check compatibility of the broken schema: %v", err)
	}
	if bad.Is {
		t.Fatalf("long -> string for a field is reported backward compatible")
	}

	_, err = cl.RegisterSchema(ctx, subject, sr.Schema{Schema: ordersAvroBroken}, -1, -1)
	if err == nil {
		t.Fatalf("an incompatible schema was registered under %s", subject)
	}
	if re := responseError(t, "register incompatible", err); re.StatusCode != http.StatusConflict {
		t.Fatalf("register incompatible: HTTP %d (%s), want 409", re.StatusCode, re.Message)
	}

	v2, err := cl.RegisterSchema(ctx, subject, sr.Schema{Schema: ordersAvroV2}, -1, -1)
	if err != nil {
		t.Fatalf("register v2 under %s: %v", subject, err)
	}
	if v2 == v1 {
		t.Fatalf("v2 got v1's id %d", v1)
	}
	versions, err := cl.SubjectVersions(ctx, subject)
	if err != nil {
		t.Fatalf("versions of %s: %v", subject, err)
	}
	if !slices.Equal(versions, []int{1, 2}) {
		t.Fatalf("versions of %s: %v, want [1 2] (the rejected schema made none)", subject, versions)
	}
	latest, err := cl.SchemaByVersion(ctx, subject, -1)
	if err != nil {
		t.Fatalf("latest of %s: %v", subject, err)
	}
	if latest.ID != v2 || latest.Version != 2 {
		t.Fatalf("latest of %s: id %d version %d; want %d, 2", subject, latest.ID, latest.Version, v2)
	}
}

// TestSchemaRegistryNotFound checks Confluent's 404 error codes, which
// clients branch on: 40401 for an unknown subject, 40403 for an unknown id.
func TestSchemaRegistryNotFound(t *testing.T) {
	cl := schemaRegistry(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	_, err := cl.SubjectVersions(ctx, fmt.Sprintf("ferry-it-none-%d-value", time.Now().UnixNano()))
	re := responseError(t, "versions of an unknown subject", err)
	if re.StatusCode != http.StatusNotFound || re.ErrorCode != sr.ErrSubjectNotFound.Code {
		t.Fatalf("versions of an unknown subject: HTTP %d error_code %d (%s); want 404, %d",
			re.StatusCode, re.ErrorCode, re.Message, sr.ErrSubjectNotFound.Code)
	}

	_, err = cl.SchemaByID(ctx, 1<<30)
	re = responseError(t, "an unknown schema id", err)
	if re.StatusCode != http.StatusNotFound || re.ErrorCode != sr.ErrSchemaNotFound.Code {
		t.Fatalf("an unknown schema id: HTTP %d error_code %d (%s); want 404, %d",
			re.StatusCode, re.ErrorCode, re.Message, sr.ErrSchemaNotFound.Code)
	}
}
