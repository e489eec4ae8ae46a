package interceptor

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/ferrykit/ferry/internal/schemareg"
)

// Configuration keys of validate-schema: Confluent's serializer names where
// they exist.
const (
	// KeySchemaRegistryURL is the registry's Confluent-compatible base
	// URL (required); several, comma-separated, are tried in order.
	KeySchemaRegistryURL = "schema.registry.url"
	// KeyBasicAuthSource is Confluent's basic.auth.credentials.source:
	// USER_INFO (basic.auth.user.info), URL (the user info of the URL) or
	// unset (no authentication unless the URL carries user info).
	KeyBasicAuthSource = "basic.auth.credentials.source"
	// KeyBasicAuthUserInfo is "user:password" for USER_INFO.
	KeyBasicAuthUserInfo = "basic.auth.user.info"
	// KeySchemaRegistryTruststore is a PEM file of CA certificates the
	// registry's TLS certificate must chain to (default: the system's).
	KeySchemaRegistryTruststore = "schema.registry.ssl.truststore.location"
	// KeySchemaRegistryTruststoreType must be PEM when set (JKS and
	// PKCS12 stores are not read).
	KeySchemaRegistryTruststoreType = "schema.registry.ssl.truststore.type"
	// KeySchemaRegistryTimeout bounds each registry call, in ms (default
	// 3000, below the chain's 5000 ms budget).
	KeySchemaRegistryTimeout = "schema.registry.request.timeout.ms"
	// KeySchemaRegistryCacheMax bounds the cache of parsed schemas and
	// subject registrations, in bytes (default 67108864, 64 MiB); a schema
	// over a sixteenth of it is refused.
	KeySchemaRegistryCacheMax = "schema.registry.cache.max.bytes"
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
	// KeyValidateSchemaUnavailableAllow: when the registry cannot be
	// reached, let records through unchecked (default false: fail the
	// partition with the retriable KAFKA_STORAGE_ERROR).
	KeyValidateSchemaUnavailableAllow = "validate.schema.registry.unavailable.allow"
)

// validateSchemaKeys are the keys validate-schema reads (for Keys).
var validateSchemaKeys = []string{KeySchemaRegistryURL, KeyBasicAuthSource, KeyBasicAuthUserInfo,
	KeySchemaRegistryTruststore, KeySchemaRegistryTruststoreType, KeySchemaRegistryTimeout,
	KeySchemaRegistryCacheMax, KeyValidateSchemaKey, KeyValidateSchemaValue, KeyKeySubjectStrategy,
	KeyValueSubjectStrategy, KeyValidateSchemaMaxDepth, KeyValidateSchemaMaxItems,
	KeyValidateSchemaUnavailableAllow}

// Defaults of validate-schema's keys.
const (
	DefaultSchemaRegistryTimeout   = 3 * time.Second
	DefaultSchemaRegistryCacheMax  = 64 << 20
	DefaultValidateSchemaMaxDepth  = 1000
	DefaultValidateSchemaMaxItems  = 10_000_000
	maxValidateSchemaMaxDepth      = 10000
	minSchemaRegistryCacheMaxBytes = 64 << 10
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
	cl, tr, err := schemaRegistryClient(config)
	if err != nil {
		return Instance{}, err
	}
	timeout, err := msKey(config, KeySchemaRegistryTimeout, DefaultSchemaRegistryTimeout)
	if err != nil {
		return Instance{}, err
	}
	cacheMax, err := intKey(config, KeySchemaRegistryCacheMax, DefaultSchemaRegistryCacheMax, minSchemaRegistryCacheMaxBytes, 1<<40)
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
	reg := schemareg.New(schemareg.Config{Client: cl, Timeout: timeout, CacheMaxBytes: cacheMax,
		Limits: schemareg.Limits{MaxDepth: int(depth), MaxItems: items}})
	checkSide := func(ctx context.Context, r *Record, isKey bool, st schemareg.Strategy, b []byte) error {
		if b == nil {
			return nil
		}
		side := "value"
		if isKey {
			side = "key"
		}
		subject, id, err := reg.Check(ctx, r.Topic, isKey, st, b)
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return err
		case errors.Is(err, schemareg.ErrUnavailable):
			if allow {
				return nil
			}
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
	check := func(ctx context.Context, r *Record) error {
		if checkKey {
			if err := checkSide(ctx, r, true, keyStrategy, r.Key); err != nil {
				return err
			}
		}
		if checkValue {
			return checkSide(ctx, r, false, valueStrategy, r.Value)
		}
		return nil
	}
	in, err := instance("validate-schema", config, "produce", check, check)
	if err != nil {
		return Instance{}, err
	}
	in.Close = func() error { tr.CloseIdleConnections(); return nil }
	return in, nil
}

// schemaRegistryClient builds the sr client from the connection keys.
func schemaRegistryClient(config map[string]string) (*sr.Client, *http.Transport, error) {
	raw := strings.TrimSpace(config[KeySchemaRegistryURL])
	if raw == "" {
		return nil, nil, fmt.Errorf("%s is required", KeySchemaRegistryURL)
	}
	var urls []string
	var urlUser *url.Userinfo
	for _, s := range strings.Split(raw, ",") {
		u, err := url.Parse(strings.TrimSpace(s))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, nil, fmt.Errorf("%s: %q is not an http or https URL", KeySchemaRegistryURL, s)
		}
		if u.User != nil {
			urlUser, u.User = u.User, nil
		}
		urls = append(urls, u.String())
	}
	opts := []sr.ClientOpt{sr.URLs(urls...), sr.UserAgent("ferry-validate-schema")}
	switch src := strings.ToUpper(strings.TrimSpace(config[KeyBasicAuthSource])); src {
	case "", "URL":
		if urlUser != nil {
			pass, _ := urlUser.Password()
			opts = append(opts, sr.BasicAuth(urlUser.Username(), pass))
		}
	case "USER_INFO":
		user, pass, ok := strings.Cut(config[KeyBasicAuthUserInfo], ":")
		if !ok {
			return nil, nil, fmt.Errorf("%s: want user:password for %s=USER_INFO", KeyBasicAuthUserInfo, KeyBasicAuthSource)
		}
		opts = append(opts, sr.BasicAuth(user, pass))
	default:
		return nil, nil, fmt.Errorf("%s: %q is not USER_INFO or URL", KeyBasicAuthSource, config[KeyBasicAuthSource])
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if t := strings.TrimSpace(config[KeySchemaRegistryTruststoreType]); t != "" && !strings.EqualFold(t, "PEM") {
		return nil, nil, fmt.Errorf("%s: %q: only PEM truststores are read", KeySchemaRegistryTruststoreType, t)
	}
	if f := strings.TrimSpace(config[KeySchemaRegistryTruststore]); f != "" {
		pem, err := os.ReadFile(f)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", KeySchemaRegistryTruststore, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, nil, fmt.Errorf("%s: %s holds no PEM certificate", KeySchemaRegistryTruststore, f)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	opts = append(opts, sr.HTTPClient(&http.Client{Transport: tr}))
	cl, err := sr.NewClient(opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", KeySchemaRegistryURL, err)
	}
	return cl, tr, nil
}

func msKey(config map[string]string, key string, def time.Duration) (time.Duration, error) {
	n, err := intKey(config, key, def.Milliseconds(), 1, 3_600_000)
	return time.Duration(n) * time.Millisecond, err
}

func intKey(config map[string]string, key string, def, lo, hi int64) (int64, error) {
	v := strings.TrimSpace(config[key])
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s: %q is not an integer between %d and %d", key, config[key], lo, hi)
	}
	return n, nil
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
