package schemareg

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
	"golang.org/x/sync/singleflight"
)

// Limits bound the decoding of one payload.
type Limits struct {
	// MaxDepth bounds nesting: Avro records, arrays, maps and unions,
	// Protobuf messages (its recursion limit), JSON arrays and objects,
	// and a JSON Schema's own nesting.
	MaxDepth int
	// MaxItems bounds the Avro array and map items of one payload.
	MaxItems int64
	// MaxMessages bounds the Protobuf messages of one payload (nested
	// messages and map entries, counted before it is decoded); 0: none
	// beyond the top-level one.
	MaxMessages int64
	// decoding: the payload is checked to be decoded into values next
	// (Registry.Decode, CheckDecode), which bounds the Avro values that
	// take no bytes (avroWalk.zeroLeft).
	decoding bool
	// ruleNumbers: JSON numbers decode as float64, except integers a
	// float64 cannot hold exactly (beyond 2^53), which decode as int64 or
	// uint64 (CheckDecode: rules must not compare a rounded id).
	ruleNumbers bool
}

// Strategy names a subject (Confluent's subject name strategies).
type Strategy int

const (
	// TopicName: "<topic>-key" / "<topic>-value" (the default).
	TopicName Strategy = iota
	// RecordName: the record's fully-qualified name (Avro: the schema's
	// full name; Protobuf: the message's; JSON Schema: its title).
	RecordName
	// TopicRecordName: "<topic>-<record name>".
	TopicRecordName
)

// ParseStrategy reads a subject name strategy: Confluent's class names
// (io.confluent.kafka.serializers.subject.TopicNameStrategy, …) or their
// simple names, case-insensitively; "" is TopicName.
func ParseStrategy(s string) (Strategy, bool) {
	for i, n := range []string{"TopicNameStrategy", "RecordNameStrategy", "TopicRecordNameStrategy"} {
		if s == "" && i == 0 || equalFoldSuffix(s, n) {
			return Strategy(i), true
		}
	}
	return 0, false
}

func equalFoldSuffix(s, name string) bool {
	for _, full := range []string{name, "io.confluent.kafka.serializers.subject." + name} {
		if len(s) == len(full) && equalFold(s, full) {
			return true
		}
	}
	return false
}

func equalFold(a, b string) bool {
	for i := range len(a) {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// Config configures a Registry.
type Config struct {
	// Client is a franz-go sr client of the registry (URL, auth, TLS, its
	// http.Client's timeout).
	Client *sr.Client
	// URL is the (first) base URL, for messages.
	URL string
	// Timeout bounds each registry call (within the caller's context).
	Timeout time.Duration
	// CacheMaxBytes bounds the cache of parsed schemas and of subject
	// registrations (an estimate: 4 bytes per byte of schema text, 64 per
	// registration plus its subject). A schema over a quarter of it is
	// refused (ErrBadSchema).
	CacheMaxBytes int64
	Limits        Limits
}

// Cache lifetimes of a subject's registration of an id: a registration
// found is trusted for positiveTTL (a schema deleted meanwhile is still
// accepted that long, as Confluent's serializers cache ids for good); one
// not found is remembered for negativeTTL, so that a producer sending an
// unknown id costs the registry one call per id every few seconds, not one
// per record.
const (
	positiveTTL = 5 * time.Minute
	negativeTTL = 10 * time.Second
)

// Registry checks framed record sides against a schema registry, caching
// what it learns within Config.CacheMaxBytes. Safe for concurrent use.
type Registry struct {
	cfg   Config
	group singleflight.Group

	mu    sync.Mutex
	lru   *list.List // of *cacheEntry, most recent first
	byKey map[string]*list.Element
	bytes int64
}

type cacheEntry struct {
	key     string
	cost    int64
	schema  *parsedSchema // a schema by id
	ok      bool          // a registration: found or not
	id      int           // a subject's latest version: its schema id
	expires time.Time     // registrations and latest versions only
}

// parsedSchema is one schema of the registry, ready to validate payloads.
type parsedSchema struct {
	id    int
	typ   sr.SchemaType
	avro  *avroSchema
	json  *jsonSchema
	proto *protoSchema
}

// New returns a Registry.
func New(cfg Config) *Registry {
	return &Registry{cfg: cfg, lru: list.New(), byKey: map[string]*list.Element{}}
}

// Check validates one framed record side (isKey: the key, else the value)
// of topic: the framing, the id's registration under the subject that
// strategy names, and the payload's decoding. It returns the subject and
// id it checked (for messages; "" and -1 when not known) and an error
// wrapping ErrNotFramed, ErrUnknownSchema, ErrInvalidPayload, ErrBadSchema
// or ErrUnavailable, or ctx's error.
func (r *Registry) Check(ctx context.Context, topic string, isKey bool, strategy Strategy, b []byte) (subject string, id int, err error) {
	subject, id, _, err = r.check(ctx, topic, isKey, strategy, b, false)
	return subject, id, err
}

// CheckDecode is Check that also returns the payload decoded (as Decode
// does), for rules over its fields; JSON integers beyond 2^53 (which a
// float64 would round) decode as int64 or uint64 when they fit.
func (r *Registry) CheckDecode(ctx context.Context, topic string, isKey bool, strategy Strategy, b []byte) (subject string, id int, value any, err error) {
	return r.check(ctx, topic, isKey, strategy, b, true)
}

func (r *Registry) check(ctx context.Context, topic string, isKey bool, strategy Strategy, b []byte, decode bool) (subject string, id int, value any, err error) {
	f, err := ParseFrame(b, false)
	if err != nil {
		return "", -1, nil, err
	}
	s, err := r.schema(ctx, f.ID)
	if err != nil {
		if strategy == TopicName { // the subject is known without the schema
			subject, _ = (&parsedSchema{}).subject(topic, isKey, TopicName, nil)
		}
		return subject, f.ID, nil, err
	}
	if s.typ == sr.TypeProtobuf {
		if f.Indexes, f.Payload, err = parseIndexes(f.Payload); err != nil {
			return "", f.ID, nil, err
		}
	}
	if subject, err = s.subject(topic, isKey, strategy, f.Indexes); err != nil {
		return "", f.ID, nil, err
	}
	if err := r.registered(ctx, subject, f.ID); err != nil {
		return subject, f.ID, nil, err
	}
	if decode {
		lim := r.cfg.Limits
		lim.ruleNumbers = true
		value, err = s.decode(ctx, f, lim)
		return subject, f.ID, value, err
	}
	return subject, f.ID, nil, s.validate(ctx, f, r.cfg.Limits)
}

func (s *parsedSchema) subject(topic string, isKey bool, st Strategy, indexes []int) (string, error) {
	if st == TopicName {
		if isKey {
			return topic + "-key", nil
		}
		return topic + "-value", nil
	}
	var name string
	switch {
	case s.avro != nil:
		name = s.avro.name
	case s.json != nil:
		name = s.json.title
	case s.proto != nil:
		var err error
		if name, err = s.proto.recordName(indexes); err != nil {
			return "", err
		}
	}
	if name == "" {
		return "", fmt.Errorf("%w: schema id %d names no record (an Avro named type, a Protobuf message, a JSON Schema title), which the subject name strategy needs", ErrBadSchema, s.id)
	}
	if st == TopicRecordName {
		return topic + "-" + name, nil
	}
	return name, nil
}

func (s *parsedSchema) validate(ctx context.Context, f Frame, lim Limits) error {
	switch {
	case s.avro != nil:
		return s.avro.validate(ctx, f.Payload, lim)
	case s.json != nil:
		return s.json.validate(ctx, f.Payload, lim)
	default:
		return s.proto.validate(ctx, f.Indexes, f.Payload, lim)
	}
}

// schema returns schema id, from the cache or the registry.
func (r *Registry) schema(ctx context.Context, id int) (*parsedSchema, error) {
	key := "s" + strconv.Itoa(id)
	if e, ok := r.get(key); ok {
		return e.schema, nil
	}
	v, err := r.shared(ctx, key, func(cctx context.Context) (any, error) {
		s, err := r.cfg.Client.SchemaByID(cctx, id)
		if err != nil {
			return nil, callError(fmt.Sprintf("GET /schemas/ids/%d", id), err, id)
		}
		refs, err := r.references(cctx, s.References, id)
		if err != nil {
			return nil, err
		}
		cost := 4 * int64(len(s.Schema))
		for _, ref := range refs {
			cost += 4*int64(len(ref.text)) + int64(len(ref.name))
		}
		if cost > r.cfg.CacheMaxBytes/4 {
			return nil, fmt.Errorf("%w: schema id %d is %d bytes with its references, over %d (schema.registry.cache.max.bytes/16)", ErrBadSchema, id, cost/4, r.cfg.CacheMaxBytes/16)
		}
		p := &parsedSchema{id: id, typ: s.Type}
		switch s.Type {
		case sr.TypeAvro:
			p.avro, err = parseAvro(s.Schema, refs)
		case sr.TypeJSON:
			p.json, err = parseJSONSchema(id, s.Schema, refs, r.cfg.Limits)
		case sr.TypeProtobuf:
			p.proto, err = parseProtobuf(cctx, s.Schema, refs)
		default:
			err = fmt.Errorf("%w: schema type %q", ErrBadSchema, s.Type)
		}
		if err != nil {
			return nil, fmt.Errorf("schema id %d: %w", id, err)
		}
		r.put(&cacheEntry{key: key, cost: cost, schema: p})
		return p, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*parsedSchema), nil
}

// Bounds of a schema's references (Confluent's schema references: another
// subject's version, named as the referring schema names it: an Avro full
// name, a JSON Schema $ref URL, a Protobuf import path).
const (
	maxReferenceDepth = 10
	maxReferences     = 100
)

// namedText is one referenced schema: the name it is referred to by and its
// text.
type namedText struct{ name, text string }

// references fetches refs and theirs (GET /subjects/{subject}/versions/
// {version}), each once, and returns them dependencies first: the order in
// which Avro must parse them.
func (r *Registry) references(ctx context.Context, refs []sr.SchemaReference, id int) ([]namedText, error) {
	var out []namedText
	seen := map[string]bool{}
	var walk func(refs []sr.SchemaReference, depth int) error
	walk = func(refs []sr.SchemaReference, depth int) error {
		if len(refs) > 0 && depth > maxReferenceDepth {
			return fmt.Errorf("%w: schema id %d: references nest deeper than %d", ErrBadSchema, id, maxReferenceDepth)
		}
		for _, ref := range refs {
			key := ref.Subject + "\x00" + strconv.Itoa(ref.Version)
			if seen[key] {
				continue
			}
			seen[key] = true
			if len(seen) > maxReferences {
				return fmt.Errorf("%w: schema id %d: more than %d references", ErrBadSchema, id, maxReferences)
			}
			ss, err := r.cfg.Client.SchemaByVersion(ctx, ref.Subject, ref.Version)
			if err != nil {
				return callError(fmt.Sprintf("GET /subjects/%s/versions/%d (a reference of schema id %d)", ref.Subject, ref.Version, id), err, id)
			}
			if err := walk(ss.References, depth+1); err != nil {
				return err
			}
			out = append(out, namedText{name: ref.Name, text: ss.Schema.Schema})
		}
		return nil
	}
	return out, walk(refs, 1)
}

// registered checks that subject has registered schema id (GET
// /schemas/ids/{id}/versions, the subject-version pairs of the id).
func (r *Registry) registered(ctx context.Context, subject string, id int) error {
	key := "r" + strconv.Itoa(id) + "\x00" + subject
	e, ok := r.get(key)
	if !ok {
		v, err := r.shared(ctx, key, func(cctx context.Context) (any, error) {
			vs, err := r.cfg.Client.SchemaVersionsByID(cctx, id)
			if err != nil {
				return nil, callError(fmt.Sprintf("GET /schemas/ids/%d/versions", id), err, id)
			}
			found := false
			for _, sv := range vs {
				found = found || sv.Subject == subject
			}
			ttl := negativeTTL
			if found {
				ttl = positiveTTL
			}
			e := &cacheEntry{key: key, cost: 64 + int64(len(key)), ok: found, expires: time.Now().Add(ttl)}
			r.put(e)
			return e, nil
		})
		if err != nil {
			return err
		}
		e = v.(*cacheEntry)
	}
	if !e.ok {
		return fmt.Errorf("%w: subject %s has not registered schema id %d", ErrUnknownSchema, subject, id)
	}
	return nil
}

// shared runs one registry call for all the records that need key at once
// (singleflight). The call runs under its own Config.Timeout, detached from
// the first caller's context, so that one request's time budget ending does
// not fail the others sharing the call; each caller waits only as long as
// its own ctx allows.
func (r *Registry) shared(ctx context.Context, key string, call func(context.Context) (any, error)) (any, error) {
	ch := r.group.DoChan(key, func() (any, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.Timeout)
		defer cancel()
		return call(cctx)
	})
	select {
	case res := <-ch:
		return res.Val, res.Err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// callError classifies a registry call's error: 404 (Confluent's 40403
// schema not found, 40401 subject not found) is ErrUnknownSchema, anything
// else (connection, timeout, 5xx, 401/403) is ErrUnavailable.
func callError(op string, err error, id int) error {
	var re *sr.ResponseError
	if errors.As(err, &re) && re.StatusCode == http.StatusNotFound {
		return fmt.Errorf("%w: the registry knows no schema id %d", ErrUnknownSchema, id)
	}
	return fmt.Errorf("%w: %s: %v", ErrUnavailable, op, err)
}

func (r *Registry) get(key string) (*cacheEntry, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	el, ok := r.byKey[key]
	if !ok {
		return nil, false
	}
	e := el.Value.(*cacheEntry)
	if !e.expires.IsZero() && time.Now().After(e.expires) {
		r.remove(el)
		return nil, false
	}
	r.lru.MoveToFront(el)
	return e, true
}

func (r *Registry) put(e *cacheEntry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if el, ok := r.byKey[e.key]; ok {
		r.remove(el)
	}
	if e.cost > r.cfg.CacheMaxBytes {
		return
	}
	r.byKey[e.key] = r.lru.PushFront(e)
	r.bytes += e.cost
	for r.bytes > r.cfg.CacheMaxBytes {
		r.remove(r.lru.Back())
	}
}

func (r *Registry) remove(el *list.Element) {
	e := r.lru.Remove(el).(*cacheEntry)
	delete(r.byKey, e.key)
	r.bytes -= e.cost
}

// CachedBytes is the cache's current estimate in bytes (for tests and
// metrics).
func (r *Registry) CachedBytes() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bytes
}
