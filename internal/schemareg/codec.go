package schemareg

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/ferrykit/ferry/internal/jsonvalue"
)

// avroAPI encodes and decodes for the serde chain. Its bytes and string
// bound is off: a payload is walked by avroSchema.validate first, which
// bounds every length by the payload's size (the 1 MiB default would refuse
// the large records Ferry exists for).
var avroAPI = avro.Config{MaxByteSliceSize: -1}.Freeze()

// Latest returns the schema id of subject's latest version (GET
// /subjects/{subject}/versions/latest), cached for ttl (0: not cached).
// Errors wrap ErrUnknownSchema (no such subject) or ErrUnavailable.
func (r *Registry) Latest(ctx context.Context, subject string, ttl time.Duration) (int, error) {
	key := "l" + subject
	if e, ok := r.get(key); ok {
		return e.id, nil
	}
	v, err := r.shared(ctx, key, func(cctx context.Context) (any, error) {
		ss, err := r.cfg.Client.SchemaByVersion(cctx, subject, -1)
		if err != nil {
			if e := callError("GET /subjects/"+subject+"/versions/latest", err, -1); !errors.Is(e, ErrUnknownSchema) {
				return nil, e
			}
			return nil, fmt.Errorf("%w: subject %s has no version in the registry at %s (register a schema first: POST %s/subjects/%s/versions; the URL must be the registry's Confluent-compatible base)",
				ErrUnknownSchema, subject, r.cfg.URL, r.cfg.URL, subject)
		}
		if ttl > 0 {
			r.put(&cacheEntry{key: key, cost: 64 + int64(len(key)), id: ss.ID, ok: true, expires: time.Now().Add(ttl)})
		}
		return ss.ID, nil
	})
	if err != nil {
		return 0, err
	}
	return v.(int), nil
}

// Encode writes v under schema id in Confluent's wire format: magic byte 0,
// the 4-byte id, for Protobuf the message indexes, then the payload. want
// is the type the caller's stage serializes (the schema must be of it). v
// is, for Avro, what hamba/avro marshals (a map[string]any or a struct with
// avro tags) or a json.RawMessage in Avro's JSON encoding; for JSON Schema,
// what encoding/json marshals, or []byte / json.RawMessage holding JSON,
// validated against the schema; for Protobuf, a proto.Message whose full
// name is a message of the schema, or a json.RawMessage in protojson's
// mapping of the schema's first message.
// Errors wrap ErrInvalidPayload, ErrBadSchema, ErrUnknownSchema or
// ErrUnavailable.
func (r *Registry) Encode(ctx context.Context, id int, want sr.SchemaType, v any) ([]byte, error) {
	s, err := r.schema(ctx, id)
	if err != nil {
		return nil, err
	}
	if s.typ != want {
		return nil, fmt.Errorf("%w: schema id %d is %s, not %s", ErrBadSchema, id, s.typ, want)
	}
	switch want {
	case sr.TypeAvro:
		if j, ok := v.(json.RawMessage); ok {
			if v, err = s.avro.fromJSON(j, r.cfg.Limits); err != nil {
				return nil, err
			}
		}
		b, err := avroAPI.Marshal(s.avro.s, v)
		if err != nil {
			return nil, fmt.Errorf("%w: Avro: %v", ErrInvalidPayload, err)
		}
		return AppendFrame(nil, id, nil, b), nil
	case sr.TypeJSON:
		var b []byte
		switch j := v.(type) {
		case []byte:
			b = j
		case json.RawMessage:
			b = j
		default:
			if b, err = json.Marshal(v); err != nil {
				return nil, fmt.Errorf("%w: JSON: %v", ErrInvalidPayload, err)
			}
		}
		if err := s.json.validate(ctx, b, r.cfg.Limits); err != nil {
			return nil, err
		}
		return AppendFrame(nil, id, nil, b), nil
	default:
		if j, ok := v.(json.RawMessage); ok {
			md, err := s.proto.message([]int{0})
			if err != nil {
				return nil, err
			}
			dm := dynamicpb.NewMessage(md)
			if err := (protojson.UnmarshalOptions{RecursionLimit: r.cfg.Limits.MaxDepth}).Unmarshal(j, dm); err != nil {
				return nil, fmt.Errorf("%w: Protobuf JSON for %s under schema id %d: %v", ErrInvalidPayload, md.FullName(), id, err)
			}
			v = dm
		}
		m, ok := v.(proto.Message)
		if !ok {
			return nil, fmt.Errorf("%w: Protobuf under schema id %d: got %T, want a proto.Message", ErrInvalidPayload, id, v)
		}
		name := m.ProtoReflect().Descriptor().FullName()
		idx, ok := indexesOf(s.proto.file.Messages(), name, nil)
		if !ok {
			return nil, fmt.Errorf("%w: Protobuf: schema id %d has no message %s", ErrInvalidPayload, id, name)
		}
		b, err := proto.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("%w: Protobuf %s: %v", ErrInvalidPayload, name, err)
		}
		return AppendFrame(nil, id, idx, b), nil
	}
}

// indexesOf finds the message-index path of name among msgs (and their
// nested messages).
func indexesOf(msgs protoreflect.MessageDescriptors, name protoreflect.FullName, path []int) ([]int, bool) {
	for i := range msgs.Len() {
		md := msgs.Get(i)
		p := append(path[:len(path):len(path)], i)
		if md.FullName() == name {
			return p, true
		}
		if found, ok := indexesOf(md.Messages(), name, p); ok {
			return found, true
		}
	}
	return nil, false
}

// Decode reads one record side in Confluent's wire format: the schema of its
// id (which must be of type want), the payload checked within Config.Limits
// first, then decoded: Avro into hamba/avro's generic values (a record is a
// map[string]any), JSON into encoding/json's, Protobuf into a
// *dynamicpb.Message of the message the indexes name. It returns the value
// and the schema id (-1 when the framing is not read). Errors wrap
// ErrNotFramed, ErrUnknownSchema, ErrInvalidPayload, ErrBadSchema or
// ErrUnavailable.
func (r *Registry) Decode(ctx context.Context, b []byte, want sr.SchemaType) (any, int, error) {
	f, err := ParseFrame(b, false)
	if err != nil {
		return nil, -1, err
	}
	s, err := r.schema(ctx, f.ID)
	if err != nil {
		return nil, f.ID, err
	}
	if s.typ != want {
		return nil, f.ID, fmt.Errorf("%w: schema id %d is %s, not %s", ErrBadSchema, f.ID, s.typ, want)
	}
	if s.typ == sr.TypeProtobuf {
		if f.Indexes, f.Payload, err = parseIndexes(f.Payload); err != nil {
			return nil, f.ID, err
		}
	}
	out, err := s.decode(ctx, f, r.cfg.Limits)
	if err != nil {
		return nil, f.ID, err
	}
	return out, f.ID, nil
}

// decode checks f's payload within lim, then decodes it (see Decode).
// Errors wrap ErrInvalidPayload.
func (s *parsedSchema) decode(ctx context.Context, f Frame, lim Limits) (any, error) {
	if s.proto != nil { // its check is the decoding: once is enough
		m, err := s.proto.unmarshal(f.Indexes, f.Payload, lim)
		if err != nil {
			return nil, err
		}
		return m, nil
	}
	lim.decoding = true
	if err := s.validate(ctx, f, lim); err != nil {
		return nil, err
	}
	var out any
	var err error
	switch {
	case s.avro != nil:
		err = avroAPI.Unmarshal(s.avro.s, f.Payload, &out)
	case s.json != nil && lim.ruleNumbers:
		d := json.NewDecoder(bytes.NewReader(f.Payload))
		d.UseNumber()
		if err = d.Decode(&out); err == nil {
			out, err = ruleNumbers(out)
		}
	case s.json != nil:
		// Numbers as json.Number: an id or an amount beyond 2^53 comes
		// back exact, as Confluent's JsonNode keeps it, not rounded to
		// the nearest float64.
		d := json.NewDecoder(bytes.NewReader(f.Payload))
		d.UseNumber()
		err = d.Decode(&out)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidPayload, err)
	}
	return out, nil
}

// fromJSON reads j, in Avro's JSON encoding, into hamba/avro's generic
// values under a, its nesting bounded by lim.MaxDepth first.
func (a *avroSchema) fromJSON(j []byte, lim Limits) (any, error) {
	if err := jsonvalue.Check(j, lim.MaxDepth); err != nil {
		return nil, fmt.Errorf("%w: JSON: %s", ErrInvalidPayload, oneLine(err.Error()))
	}
	d := json.NewDecoder(bytes.NewReader(j))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: JSON: %v", ErrInvalidPayload, err)
	}
	return avroFromJSON(a.s, v, "", 0, lim.MaxDepth)
}

// maxExactFloat: integers of at most this magnitude are exact as float64.
const maxExactFloat = 1 << 53

// ruleNumbers replaces v's json.Numbers: float64, except integers beyond
// ±2^53 (ids, amounts in minor units), which a float64 would round so that
// a rule compares another number than the record holds: int64, or uint64
// when positive and over int64's range. An integer beyond both stays a
// float64 (its nearest). Errors: a number out of float64's range.
func ruleNumbers(v any) (any, error) {
	switch t := v.(type) {
	case json.Number:
		if i, err := t.Int64(); err == nil {
			if i > maxExactFloat || i < -maxExactFloat {
				return i, nil
			}
			return float64(i), nil
		}
		if u, err := strconv.ParseUint(string(t), 10, 64); err == nil {
			return u, nil
		}
		f, err := t.Float64()
		if err != nil {
			return nil, fmt.Errorf("JSON number %.40s: %w", t, err)
		}
		return f, nil
	case map[string]any:
		for k, e := range t {
			n, err := ruleNumbers(e)
			if err != nil {
				return nil, err
			}
			t[k] = n
		}
	case []any:
		for i, e := range t {
			n, err := ruleNumbers(e)
			if err != nil {
				return nil, err
			}
			t[i] = n
		}
	}
	return v, nil
}
