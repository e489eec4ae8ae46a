package interceptor

import (
	"context"
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
// the record (INVALID_RECORD): it cannot be shown to be free of the fields;
// so does a value nested deeper than json.max.depth (default 1000) or with
// a member name twice in one object. A null value passes. side defaults to
// produce.
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
	maxDepth, err := parseJSONMaxDepth(config)
	if err != nil {
		return Instance{}, err
	}
	fn := func(_ context.Context, r *Record) error {
		if r.Value == nil {
			return nil
		}
		// Checked first, with a streaming tokenizer: gjson and sjson
		// recurse per nesting level, and a path masks one occurrence of a
		// key that last-key-wins readers may read twice.
		if err := checkJSON(r.Value, maxDepth); err != nil {
			return fmt.Errorf("%w, so it cannot be redacted", err)
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
