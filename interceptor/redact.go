package interceptor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"github.com/twmb/franz-go/pkg/kerr"
)

// Configuration keys of redact.
const (
	// KeyRedactFields lists the JSON fields to mask, comma-separated, as
	// GJSON paths: "user.email", "cards.#.number" (every element).
	KeyRedactFields = "redact.fields"
	// KeyRedactMask is the string a masked field is replaced by (default "***").
	KeyRedactMask = "redact.mask"
)

func init() { Register("redact", newRedact) }

// newRedact builds redact: each configured field present in a record's
// JSON value is replaced by the mask (a JSON string); the rest of the value
// keeps its bytes (field order, spacing). A value that is not JSON fails
// the record (INVALID_RECORD): it cannot be shown to be free of the fields.
// A null value passes. side defaults to produce.
func newRedact(_ context.Context, config map[string]string) (Instance, error) {
	var fields []string
	for f := range strings.SplitSeq(config[KeyRedactFields], ",") {
		if f = strings.TrimSpace(f); f != "" {
			fields = append(fields, f)
		}
	}
	if len(fields) == 0 {
		return Instance{}, fmt.Errorf("%s: name at least one JSON field path, e.g. user.email", KeyRedactFields)
	}
	mask := "***"
	if m, ok := config[KeyRedactMask]; ok {
		mask = m
	}
	fn := func(_ context.Context, r *Record) error {
		if r.Value == nil {
			return nil
		}
		if !gjson.ValidBytes(r.Value) {
			return fmt.Errorf("%w: the value (%d bytes) is not valid JSON, so it cannot be redacted", kerr.InvalidRecord, len(r.Value))
		}
		// Found by review: with a key twice in one object, a path masks
		// one occurrence while last-key-wins parsers read the other.
		if k, dup := duplicateKey(r.Value); dup {
			return fmt.Errorf("%w: the value has the key %q twice in one object, so it cannot be redacted safely", kerr.InvalidRecord, k)
		}
		v := r.Value
		for _, f := range fields {
			res := gjson.GetBytes(v, f)
			if !res.Exists() {
				continue
			}
			var paths []string
			if strings.Contains(f, "#") {
				paths = res.Paths(string(v))
			} else {
				paths = []string{f}
			}
			for _, p := range paths {
				out, err := sjson.SetBytes(v, p, mask)
				if err != nil {
					return fmt.Errorf("%w: redacting %s: %v", kerr.InvalidRecord, p, err)
				}
				v = out
			}
		}
		r.Value = v
		return nil
	}
	return instance("redact", config, "produce", fn, fn)
}

// duplicateKey reports the first key that appears twice in one JSON object
// of b (keys compared after unescaping). b is assumed valid JSON.
func duplicateKey(b []byte) (string, bool) {
	type frame struct {
		obj       bool
		keys      map[string]struct{}
		expectKey bool
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{', '[':
				if top != nil && top.obj {
					top.expectKey = true // this container is the value of a key
				}
				stack = append(stack, &frame{obj: d == '{', keys: map[string]struct{}{}, expectKey: d == '{'})
			default:
				stack = stack[:len(stack)-1]
			}
			continue
		}
		if k, ok := tok.(string); ok && top != nil && top.obj && top.expectKey {
			if _, dup := top.keys[k]; dup {
				return k, true
			}
			top.keys[k] = struct{}{}
			top.expectKey = false
			continue
		}
		if top != nil && top.obj {
			top.expectKey = true
		}
	}
}
