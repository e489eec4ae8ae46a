package interceptor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/ferrykit/ferry/internal/schemareg"
)

// Configuration keys of validate-schema: Confluent's serializer names where
// they exist.
const (
	// KeySchemaRegistryURL is the registry's Confluent-compatible base
	// URL (required); several, comma-separated, are tried in order.
	KeySchemaRegistryURL = schemareg.KeyURL
	// KeyBasicAuthSource is Confluent's basic.auth.credentials.source:
	// USER_INFO (basic.auth.user.info), URL (the user info of the URL) or
	// unset (no authentication unless the URL carries user info).
	KeyBasicAuthSource = schemareg.KeyBasicAuthSource
	// KeyBasicAuthUserInfo is "user:password" for USER_INFO.
	KeyBasicAuthUserInfo = schemareg.KeyBasicAuthUserInfo
	// KeySchemaRegistryTruststore is a PEM file of CA certificates the
	// registry's TLS certificate must chain to (default: the system's).
	KeySchemaRegistryTruststore = schemareg.KeyTruststore
	// KeySchemaRegistryTruststoreType must be PEM when set (JKS and
	// PKCS12 stores are not read).
	KeySchemaRegistryTruststoreType = schemareg.KeyTruststoreType
	// KeySchemaRegistryTimeout bounds each registry call, in ms (default
	// 3000, below the chain's 5000 ms budget).
	KeySchemaRegistryTimeout = schemareg.KeyTimeout
	// KeySchemaRegistryCacheMax bounds the cache of parsed schemas and
	// subject registrations, in bytes (default 67108864, 64 MiB); a schema
	// over a sixteenth of it is refused.
	KeySchemaRegistryCacheMax = schemareg.KeyCacheMax
	// KeyValidateSchemaKey: check record keys (default false).
	KeyValidateSchemaKey = "validate.schema.key"
	// KeyValidateSchemaValue: check record values (default true).
	KeyValidateSchemaValue = "validate.schema.value"
	// KeyKeySubjectStrategy and KeyValueSubjectStrategy choose how a
	// subject is named: TopicNameStrategy (default), RecordNameStrategy or
	// TopicRecordNameStrategy (Confluent's class names also accepted).
	KeyKeySubjectStrategy   = "key.subject.name.strategy"
	KeyValueSubjectStrategy = "value.subject.name.strategy"
	// KeyValidateSchemaMaxDepth bounds the nesting of a decoded payload
	// (Avro records, arrays, maps, unions; Protobuf messages; JSON arrays
	// and objects), default 1000 (Jackson's JSON bound).
	KeyValidateSchemaMaxDepth = "validate.schema.max.depth"
	// KeyValidateSchemaMaxItems bounds the Avro array and map items of one
	// payload, default 10000000.
	KeyValidateSchemaMaxItems = "validate.schema.avro.max.items"
	// KeyValidateSchemaMaxMessages bounds the Protobuf messages (nested
	// ones and map entries) of one payload, counted before it is decoded
	// (each costs a dynamicpb message, about 350 bytes, though it may
	// take 2 bytes), default 1000000.
	KeyValidateSchemaMaxMessages = "validate.schema.protobuf.max.messages"
	// KeyValidateSchemaUnavailableAllow: when the registry cannot be
	// reached, let records through unchecked (default false: fail the
	// partition with the retriable KAFKA_STORAGE_ERROR).
	KeyValidateSchemaUnavailableAllow = "validate.schema.registry.unavailable.allow"
)

// validateSchemaKeys are the keys validate-schema reads (for Keys).
var validateSchemaKeys = []string{KeySchemaRegistryURL, KeyBasicAuthSource, KeyBasicAuthUserInfo,
	KeySchemaRegistryTruststore, KeySchemaRegistryTruststoreType, KeySchemaRegistryTimeout,
	KeySchemaRegistryCacheMax, KeyValidateSchemaKey, KeyValidateSchemaValue, KeyKeySubjectStrategy,
	KeyValueSubjectStrategy, KeyValidateSchemaMaxDepth, KeyValidateSchemaMaxItems, KeyValidateSchemaMaxMessages,
	KeyValidateSchemaUnavailableAllow, KeyValidateSchemaRuleCostMax}

// Defaults of validate-schema's keys.
const (
	DefaultSchemaRegistryTimeout     = schemareg.DefaultTimeout
	DefaultSchemaRegistryCacheMax    = schemareg.DefaultCacheMax
	DefaultValidateSchemaMaxDepth    = schemareg.DefaultMaxDepth
	DefaultValidateSchemaMaxItems    = schemareg.DefaultMaxItems
	DefaultValidateSchemaMaxMessages = schemareg.DefaultMaxMessages
	maxValidateSchemaMaxDepth        = 10000
)

func init() { Register("validate-schema", newValidateSchema) }

// newValidateSchema builds validate-schema: each record's value (and key,
// with validate.schema.key) must be in Confluent's wire format (magic byte
// 0, a 4-byte big-endian schema id, for Protobuf the message indexes), carry
// an id that its subject (TopicNameStrategy by default) has registered in
// the schema registry at schema.registry.url, and decode under that schema
// (Avro, JSON Schema, Protobuf). A record that fails gets INVALID_RECORD
// with a message naming the side, subject, id and the first error. A null
// key or value passes (a tombstone). When the registry cannot be reached
// (connection, timeout, 5xx, 401/403) the partition fails with
// KAFKA_STORAGE_ERROR, which producers retry, unless
// validate.schema.registry.unavailable.allow is true. side defaults to
// produce.
func newValidateSchema(_ context.Context, config map[string]string) (Instance, error) {
	regCfg, tr, err := schemareg.FromProps(config, "ferry-validate-schema")
	if err != nil {
		return Instance{}, err
	}
	depth, err := intKey(config, KeyValidateSchemaMaxDepth, DefaultValidateSchemaMaxDepth, 1, maxValidateSchemaMaxDepth)
	if err != nil {
		return Instance{}, err
	}
	items, err := intKey(config, KeyValidateSchemaMaxItems, DefaultValidateSchemaMaxItems, 0, 1<<40)
	if err != nil {
		return Instance{}, err
	}
	messages, err := intKey(config, KeyValidateSchemaMaxMessages, DefaultValidateSchemaMaxMessages, 0, 1<<40)
	if err != nil {
		return Instance{}, err
	}
	checkKey, err := boolKey(config, KeyValidateSchemaKey, false)
	if err != nil {
		return Instance{}, err
	}
	checkValue, err := boolKey(config, KeyValidateSchemaValue, true)
	if err != nil {
		return Instance{}, err
	}
	if !checkKey && !checkValue {
		return Instance{}, fmt.Errorf("%s and %s are both false: nothing to validate", KeyValidateSchemaKey, KeyValidateSchemaValue)
	}
	allow, err := boolKey(config, KeyValidateSchemaUnavailableAllow, false)
	if err != nil {
		return Instance{}, err
	}
	keyStrategy, ok := schemareg.ParseStrategy(strings.TrimSpace(config[KeyKeySubjectStrategy]))
	if !ok {
		return Instance{}, fmt.Errorf("%s: %q is not TopicNameStrategy, RecordNameStrategy or TopicRecordNameStrategy", KeyKeySubjectStrategy, config[KeyKeySubjectStrategy])
	}
	valueStrategy, ok := schemareg.ParseStrategy(strings.TrimSpace(config[KeyValueSubjectStrategy]))
	if !ok {
		return Instance{}, fmt.Errorf("%s: %q is not TopicNameStrategy, RecordNameStrategy or TopicRecordNameStrategy", KeyValueSubjectStrategy, config[KeyValueSubjectStrategy])
	}
	regCfg.Limits = schemareg.Limits{MaxDepth: int(depth), MaxItems: items, MaxMessages: messages}
	reg := schemareg.New(regCfg)
	rules, err := schemaRules(config)
	if err != nil {
		return Instance{}, err
	}
	// checkSide checks one side and, when there are rules, returns it
	// decoded (subject and id for their messages).
	checkSide := func(ctx context.Context, r *Record, isKey bool, st schemareg.Strategy, b []byte) (decoded any, subject string, id int, err error) {
		if b == nil {
			return nil, "", -1, nil
		}
		side := "value"
		if isKey {
			side = "key"
		}
		if rules != nil {
			subject, id, decoded, err = reg.CheckDecode(ctx, r.Topic, isKey, st, b)
		} else {
			subject, id, err = reg.Check(ctx, r.Topic, isKey, st, b)
		}
		if allow && errors.Is(err, schemareg.ErrUnavailable) {
			return nil, subject, id, errUnchecked
		}
		return decoded, subject, id, sideError(ctx, side, subject, id, err)
	}
	check := func(ctx context.Context, r *Record) error {
		var key, value any
		var subject string
		id := -1
		var err error
		// A side the registry could not answer for (with
		// validate.schema.registry.unavailable.allow) passes unchecked,
		// and so do the rules, which read both sides; the other side is
		// still checked.
		unchecked := false
		if checkKey {
			if key, _, _, err = checkSide(ctx, r, true, keyStrategy, r.Key); err == errUnchecked {
				unchecked = true
			} else if err != nil {
				return err
			}
		}
		if checkValue {
			if value, subject, id, err = checkSide(ctx, r, false, valueStrategy, r.Value); err == errUnchecked {
				unchecked = true
			} else if err != nil {
				return err
			}
		}
		if rules == nil || unchecked {
			return nil
		}
		if err := checkRules(ctx, rules, r.Topic, key, value); err != nil {
			if ctx.Err() != nil {
				return err
			}
			if subject != "" {
				return fmt.Errorf("%w: the record, subject %s, schema id %d: %w", kerr.InvalidRecord, subject, id, err)
			}
			return fmt.Errorf("%w: the record: %w", kerr.InvalidRecord, err)
		}
		return nil
	}
	in, err := instance("validate-schema", config, "produce", check, check)
	if err != nil {
		return Instance{}, err
	}
	in.Close = func() error { tr.CloseIdleConnections(); return nil }
	return notInline(in), nil // it asks the registry over HTTP, runs CEL rules
}

// errUnchecked: the registry could not answer and
// validate.schema.registry.unavailable.allow lets the record through
// unchecked (its rules too).
var errUnchecked = errors.New("unchecked")

// sideError maps a record side's check error (schemareg) to what the
// producer gets: nil, INVALID_RECORD naming the side, subject and id, or
// the retriable KAFKA_STORAGE_ERROR when the registry could not answer.
func sideError(ctx context.Context, side, subject string, id int, err error) error {
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return err
	case errors.Is(err, schemareg.ErrUnavailable):
		return fmt.Errorf("%w: the record's %s (schema id %d) could not be checked: %w", kerr.KafkaStorageError, side, id, err)
	case errors.Is(err, schemareg.ErrNotFramed):
		return fmt.Errorf("%w: the record's %s is %w", kerr.InvalidRecord, side, err)
	case !errors.Is(err, schemareg.ErrUnknownSchema) && !errors.Is(err, schemareg.ErrInvalidPayload) && !errors.Is(err, schemareg.ErrBadSchema):
		// Not a verdict on the record (another caller's time budget
		// ending during a shared call): retriable.
		return fmt.Errorf("%w: the record's %s (schema id %d) could not be checked: %w", kerr.KafkaStorageError, side, id, err)
	}
	if subject == "" {
		return fmt.Errorf("%w: the record's %s, schema id %d: %w", kerr.InvalidRecord, side, id, err)
	}
	return fmt.Errorf("%w: the record's %s, subject %s, schema id %d: %w", kerr.InvalidRecord, side, subject, id, err)
}

func intKey(config map[string]string, key string, def, lo, hi int64) (int64, error) {
	return schemareg.IntKey(config, key, def, lo, hi)
}

func boolKey(config map[string]string, key string, def bool) (bool, error) {
	v := strings.TrimSpace(config[key])
	if v == "" {
		return def, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s: %q is not true or false", key, config[key])
	}
	return b, nil
}
