package serde

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/ferrykit/ferry/internal/schemareg"
)

// Keys of the schema-registry stages ("avro", "protobuf", "json-schema"),
// in the names of Confluent's serializers. The connection keys are those of
// the proxy's validate-schema interceptor: schema.registry.url (required),
// basic.auth.credentials.source, basic.auth.user.info,
// schema.registry.ssl.truststore.location (PEM),
// schema.registry.request.timeout.ms (default 3000) and
// schema.registry.cache.max.bytes (default 64 MiB).
const (
	// KeyUseSchemaID (use.schema.id, default -1: unset) makes the
	// serializer write under this schema id instead of the subject's
	// latest version.
	KeyUseSchemaID = "use.schema.id"
	// KeyUseLatestVersion (use.latest.version) must be true or unset: the
	// serializer writes under the subject's latest version, as Confluent's
	// does with use.latest.version=true and auto.register.schemas=false.
	KeyUseLatestVersion = "use.latest.version"
	// KeyAutoRegisterSchemas (auto.register.schemas) must be false or
	// unset: a Go value carries no schema to register. Register schemas
	// with the registry first (Confluent's advice for production).
	KeyAutoRegisterSchemas = "auto.register.schemas"
	// KeyLatestCacheTTL (latest.cache.ttl.sec, default 300) is how long the
	// subject's latest version is used before it is asked again; -1 keeps
	// it for the client's life (Confluent's default), 0 asks every record.
	KeyLatestCacheTTL = "latest.cache.ttl.sec"
	// KeyKeySubjectStrategy / KeyValueSubjectStrategy
	// (key.subject.name.strategy / value.subject.name.strategy) must be
	// TopicNameStrategy for a serializer without use.schema.id: the other
	// strategies name the subject after the value's schema, which a Go
	// value does not carry.
	KeyKeySubjectStrategy   = "key.subject.name.strategy"
	KeyValueSubjectStrategy = "value.subject.name.strategy"
)

// SchemaKeys are the keys of the schema-registry stages besides the
// connection keys.
var SchemaKeys = []string{KeyUseSchemaID, KeyUseLatestVersion, KeyAutoRegisterSchemas, KeyLatestCacheTTL,
	KeyKeySubjectStrategy, KeyValueSubjectStrategy}

// DefaultLatestCacheTTL is latest.cache.ttl.sec's default.
const DefaultLatestCacheTTL = 300 * time.Second

func init() {
	for name, typ := range map[string]sr.SchemaType{"avro": sr.TypeAvro, "protobuf": sr.TypeProtobuf, "json-schema": sr.TypeJSON} {
		RegisterFactory(name, func(props map[string]string, isKey bool) (Stage, error) {
			return newSchemaStage(typ, props, isKey)
		})
	}
}

// schemaStage is one of the schema-registry stages: Serialize takes the
// application's value and gives it in Confluent's wire format (magic byte
// 0, the 4-byte schema id, for Protobuf the message indexes, then the
// payload), as Confluent's KafkaAvroSerializer, KafkaProtobufSerializer and
// KafkaJsonSchemaSerializer write it; Deserialize reads what any of them (or
// franz-go's sr.Serde) wrote.
type schemaStage struct {
	typ   sr.SchemaType
	reg   *schemareg.Registry
	isKey bool
	id    int           // use.schema.id, or -1
	ttl   time.Duration // latest.cache.ttl.sec
}

func newSchemaStage(typ sr.SchemaType, props map[string]string, isKey bool) (Stage, error) {
	cfg, _, err := schemareg.FromProps(props, "ferry-serde")
	if err != nil {
		return nil, err
	}
	st := &schemaStage{typ: typ, reg: schemareg.New(cfg), isKey: isKey, id: -1, ttl: DefaultLatestCacheTTL}
	id, err := schemareg.IntKey(props, KeyUseSchemaID, -1, -1, math.MaxInt32)
	if err != nil {
		return nil, err
	}
	st.id = int(id)
	ttl, err := schemareg.IntKey(props, KeyLatestCacheTTL, int64(DefaultLatestCacheTTL/time.Second), -1, math.MaxInt32)
	if err != nil {
		return nil, err
	}
	switch {
	case ttl < 0:
		st.ttl = 100 * 365 * 24 * time.Hour
	default:
		st.ttl = time.Duration(ttl) * time.Second
	}
	for key, want := range map[string]bool{KeyUseLatestVersion: true, KeyAutoRegisterSchemas: false} {
		if v := strings.TrimSpace(props[key]); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil || b != want {
				return nil, fmt.Errorf("%s: %q: only %v is supported (the serializer writes under the subject's latest version, or use.schema.id; register schemas with the registry first)", key, props[key], want)
			}
		}
	}
	strategyKey := KeyValueSubjectStrategy
	if isKey {
		strategyKey = KeyKeySubjectStrategy
	}
	s, ok := schemareg.ParseStrategy(strings.TrimSpace(props[strategyKey]))
	if !ok {
		return nil, fmt.Errorf("%s: %q is not TopicNameStrategy, RecordNameStrategy or TopicRecordNameStrategy", strategyKey, props[strategyKey])
	}
	if s != schemareg.TopicName && st.id < 0 {
		return nil, fmt.Errorf("%s: %q needs %s: the subject is named after the value's schema, which a Go value does not carry", strategyKey, props[strategyKey], KeyUseSchemaID)
	}
	return st, nil
}

// subject is the TopicNameStrategy subject of topic for the stage's side.
func (s *schemaStage) subject(topic string) string {
	if s.isKey {
		return topic + "-key"
	}
	return topic + "-value"
}

// Serialize encodes v under the subject's latest version (or use.schema.id)
// in Confluent's wire format. nil stays nil (a null key or a tombstone).
// Errors wrap ErrSchema.
func (s *schemaStage) Serialize(ctx context.Context, topic string, v any) (any, error) {
	if v == nil {
		return []byte(nil), nil
	}
	id := s.id
	if id < 0 {
		var err error
		if id, err = s.reg.Latest(ctx, s.subject(topic), s.ttl); err != nil {
			return nil, s.fail("serialize", topic, -1, err)
		}
	}
	b, err := s.reg.Encode(ctx, id, s.typ, v)
	if err != nil {
		return nil, s.fail("serialize", topic, id, err)
	}
	return b, nil
}

// Deserialize decodes Confluent's wire format under the schema its id names
// (read from the registry once, then cached): Avro into hamba/avro's
// generic values (a record is a map[string]any), JSON Schema into
// encoding/json's with numbers as json.Number (exact: an integer beyond
// 2^53 is not rounded), Protobuf into a *dynamicpb.Message. nil stays nil.
// Errors wrap ErrSchema.
func (s *schemaStage) Deserialize(ctx context.Context, topic string, v any) (any, error) {
	b, err := asBytes(s.typ.String(), v)
	if err != nil || b == nil {
		return nil, err
	}
	out, id, err := s.reg.Decode(ctx, b, s.typ)
	if err != nil {
		return nil, s.fail("deserialize", topic, id, err)
	}
	return out, nil
}

// ErrSchema is wrapped by every error of a schema-registry stage, beside
// the cause: errors.Is(err, ErrSchemaUnavailable) tells a registry outage
// (retriable) from a value that does not fit its schema.
var ErrSchema = errors.New("schema registry stage")

// ErrSchemaUnavailable: the registry could not be reached or answered with
// a server error or a timeout.
var ErrSchemaUnavailable = schemareg.ErrUnavailable

func (s *schemaStage) fail(op, topic string, id int, err error) error {
	side := "value"
	if s.isKey {
		side = "key"
	}
	if id >= 0 {
		return fmt.Errorf("%w: %s %s: %s of topic %s, schema id %d: %w", ErrSchema, s.typ, op, side, topic, id, err)
	}
	return fmt.Errorf("%w: %s %s: %s of topic %s, subject %s: %w", ErrSchema, s.typ, op, side, topic, s.subject(topic), err)
}
