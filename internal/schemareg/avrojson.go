package schemareg

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strings"
	"time"

	"github.com/hamba/avro/v2"
)

// Avro's JSON encoding (Avro 1.11 specification, "JSON Encoding"), the text
// form kafka-avro-console-producer reads and kafka-avro-console-consumer
// prints: a union is null or {"<branch type name>": value}, bytes and fixed
// are strings whose code points 0-255 are the bytes, the rest as in JSON.
// hamba/avro's generic values have the same shape except for numbers (Go
// types per Avro type) and bytes ([]byte).

// avroFromJSON converts v, decoded by encoding/json with UseNumber, from
// Avro's JSON encoding into the generic values hamba/avro marshals under s.
// Errors name the field path and wrap ErrInvalidPayload.
func avroFromJSON(s avro.Schema, v any, path string, depth, maxDepth int) (any, error) {
	fail := func(format string, args ...any) error {
		if path == "" {
			path = "the value"
		}
		return fmt.Errorf("%w: Avro JSON: %s: %s", ErrInvalidPayload, path, fmt.Sprintf(format, args...))
	}
	if depth > maxDepth {
		return nil, fail("nested deeper than %d", maxDepth)
	}
	switch t := s.(type) {
	case *avro.RefSchema:
		return avroFromJSON(t.Schema(), v, path, depth, maxDepth)
	case *avro.RecordSchema:
		m, ok := v.(map[string]any)
		if !ok {
			return nil, fail("want an object for record %s", t.FullName())
		}
		out := make(map[string]any, len(m))
		for _, f := range t.Fields() {
			fv, ok := m[f.Name()]
			if !ok {
				continue // hamba/avro writes the field's default, or fails naming it
			}
			c, err := avroFromJSON(f.Type(), fv, path+"."+f.Name(), depth+1, maxDepth)
			if err != nil {
				return nil, err
			}
			out[f.Name()] = c
		}
		return out, nil
	case *avro.UnionSchema:
		if v == nil {
			return nil, nil
		}
		if m, ok := v.(map[string]any); ok && len(m) == 1 {
			for name, inner := range m {
				for _, b := range t.Types() {
					if unionName(b) == name {
						c, err := avroFromJSON(b, inner, path, depth+1, maxDepth)
						if err != nil {
							return nil, err
						}
						return map[string]any{name: c}, nil
					}
				}
			}
		}
		// A union of null and one type also takes that type's value as it
		// is (as ferry consume prints it, and hamba/avro decodes it).
		if only := optionalBranch(t); only != nil {
			c, err := avroFromJSON(only, v, path, depth+1, maxDepth)
			if err != nil {
				return nil, err
			}
			return map[string]any{unionName(only): c}, nil
		}
		if m, ok := v.(map[string]any); ok && len(m) == 1 {
			for name := range m {
				return nil, fail("the union has no branch %q", name)
			}
		}
		return nil, fail("want null or {\"<type>\": value} for a union")
	case *avro.ArraySchema:
		a, ok := v.([]any)
		if !ok {
			return nil, fail("want an array")
		}
		out := make([]any, len(a))
		for i, e := range a {
			c, err := avroFromJSON(t.Items(), e, fmt.Sprintf("%s[%d]", path, i), depth+1, maxDepth)
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	case *avro.MapSchema:
		m, ok := v.(map[string]any)
		if !ok {
			return nil, fail("want an object for a map")
		}
		out := make(map[string]any, len(m))
		for k, e := range m {
			c, err := avroFromJSON(t.Values(), e, path+"."+k, depth+1, maxDepth)
			if err != nil {
				return nil, err
			}
			out[k] = c
		}
		return out, nil
	case *avro.EnumSchema:
		if _, ok := v.(string); !ok {
			return nil, fail("want a string for enum %s", t.FullName())
		}
		return v, nil
	case *avro.FixedSchema:
		b, err := jsonBytes(v, fail)
		if err != nil {
			return nil, err
		}
		if len(b) != t.Size() {
			return nil, fail("%d bytes for fixed %s of %d", len(b), t.FullName(), t.Size())
		}
		// hamba/avro takes a fixed as a [size]byte.
		arr := reflect.New(reflect.ArrayOf(t.Size(), reflect.TypeFor[byte]())).Elem()
		reflect.Copy(arr, reflect.ValueOf(b))
		return arr.Interface(), nil
	}
	switch s.Type() {
	case avro.Null:
		if v != nil {
			return nil, fail("want null")
		}
		return nil, nil
	case avro.Boolean:
		if _, ok := v.(bool); !ok {
			return nil, fail("want true or false")
		}
		return v, nil
	case avro.String:
		if _, ok := v.(string); !ok {
			return nil, fail("want a string")
		}
		return v, nil
	case avro.Bytes:
		return jsonBytes(v, fail)
	case avro.Int, avro.Long:
		if str, ok := v.(string); ok {
			if tm, ok := timeOf(s, str); ok {
				return tm, nil
			}
		}
		n, ok := v.(json.Number)
		if !ok {
			return nil, fail("want an integer")
		}
		i, err := n.Int64()
		if err != nil {
			return nil, fail("%s is not an integer", n)
		}
		if s.Type() == avro.Int {
			if i < math.MinInt32 || i > math.MaxInt32 {
				return nil, fail("%d is out of an int's range", i)
			}
			return int32(i), nil
		}
		return i, nil
	case avro.Float, avro.Double:
		n, ok := v.(json.Number)
		if !ok {
			return nil, fail("want a number")
		}
		f, err := n.Float64()
		if err != nil {
			return nil, fail("%s is not a number", n)
		}
		if s.Type() == avro.Float {
			return float32(f), nil
		}
		return f, nil
	}
	return nil, fail("schema type %s is not supported", s.Type())
}

// optionalBranch is the non-null branch of a union of null and one type,
// else nil.
func optionalBranch(u *avro.UnionSchema) avro.Schema {
	types := u.Types()
	if len(types) != 2 {
		return nil
	}
	switch {
	case types[0].Type() == avro.Null:
		return types[1]
	case types[1].Type() == avro.Null:
		return types[0]
	}
	return nil
}

// timeOf reads str as the time of a timestamp (RFC 3339) or date
// (2006-01-02, or RFC 3339) logical type, which hamba/avro takes and gives
// as a time.Time.
func timeOf(s avro.Schema, str string) (time.Time, bool) {
	ps, ok := s.(*avro.PrimitiveSchema)
	if !ok || ps.Logical() == nil {
		return time.Time{}, false
	}
	switch ps.Logical().Type() {
	case avro.TimestampMillis, avro.TimestampMicros, avro.LocalTimestampMillis, avro.LocalTimestampMicros:
		tm, err := time.Parse(time.RFC3339Nano, str)
		return tm, err == nil
	case avro.Date:
		if tm, err := time.Parse(time.DateOnly, str); err == nil {
			return tm, true
		}
		tm, err := time.Parse(time.RFC3339Nano, str)
		return tm, err == nil
	}
	return time.Time{}, false
}

// unionName is the name a union's branch goes by in Avro's JSON encoding
// (and in hamba/avro's generic values): a named type's full name, else the
// type's name.
func unionName(s avro.Schema) string {
	if r, ok := s.(*avro.RefSchema); ok {
		s = r.Schema()
	}
	if n, ok := s.(avro.NamedSchema); ok {
		return n.FullName()
	}
	return string(s.Type())
}

func jsonBytes(v any, fail func(string, ...any) error) ([]byte, error) {
	str, ok := v.(string)
	if !ok {
		return nil, fail("want a string of code points 0-255 for bytes")
	}
	b := make([]byte, 0, len(str))
	for _, r := range str {
		if r > 255 {
			return nil, fail("code point U+%04X in bytes (at most U+00FF)", r)
		}
		b = append(b, byte(r))
	}
	return b, nil
}

// AvroJSON turns hamba/avro's generic values (what the serde chain's avro
// stage decodes) into values that encoding/json writes in Avro's JSON
// encoding: []byte (bytes) and [N]byte (fixed) become a string of code
// points 0-255; maps and slices are copied with their items turned
// likewise.
func AvroJSON(v any) any {
	switch t := v.(type) {
	case []byte:
		return codePoints(t)
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			out[k] = AvroJSON(e)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = AvroJSON(e)
		}
		return out
	}
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Array && rv.Type().Elem().Kind() == reflect.Uint8 {
		b := make([]byte, rv.Len())
		reflect.Copy(reflect.ValueOf(b), rv)
		return codePoints(b)
	}
	return v
}

func codePoints(b []byte) string {
	var sb strings.Builder
	for _, c := range b {
		sb.WriteRune(rune(c))
	}
	return sb.String()
}
