package interceptor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/twmb/franz-go/pkg/kerr"
)

// Configuration keys of redact.
const (
	// KeyRedactFields lists the JSON fields to mask, comma-separated, as
	// paths from the value's root: member names separated by dots,
	// "user.email"; "#" for every element of an array, "cards.#.number";
	// digits for one element, "cards.0.number" (or a member of that name in
	// an object); "\" before a character makes it part of a name
	// ("a\.b"). Other GJSON syntax is refused (see parseRedactPath).
	KeyRedactFields = "redact.fields"
	// KeyRedactMask is the string a masked field is replaced by (default "***").
	KeyRedactMask = "redact.mask"
	// KeyRedactCaseSensitive, "true", compares member names with the fields
	// exactly; by default (false) they are compared case-insensitively (as
	// Go's encoding/json matches struct fields), and an object with two
	// names equal but for case is refused.
	KeyRedactCaseSensitive = "redact.case.sensitive"
)

func init() { Register("redact", newRedact) }

// newRedact builds redact: each configured field present in a record's
// JSON value is replaced by the mask (a JSON string); the rest of the value
// keeps its bytes (field order, spacing). Member names are compared after
// unescaping, case-insensitively unless redact.case.sensitive is true. A
// value that is not JSON fails the record (INVALID_RECORD): it cannot be
// shown to be free of the fields; so does a value nested deeper than
// json.max.depth (default 1000) or with a member name twice in one object
// (compared as fields are: a reader that keeps the other one would see it
// unmasked). A null value passes. side defaults to produce.
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
	caseSensitive := false
	if v := strings.TrimSpace(config[KeyRedactCaseSensitive]); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return Instance{}, fmt.Errorf("%s: %q is not true or false", KeyRedactCaseSensitive, config[KeyRedactCaseSensitive])
		}
		caseSensitive = b
	}
	root, err := compileRedactPaths(fields, !caseSensitive)
	if err != nil {
		return Instance{}, err
	}
	mask := "***"
	if m, ok := config[KeyRedactMask]; ok {
		mask = m
	}
	quoted, err := jsontext.AppendQuote(nil, mask)
	if err != nil {
		return Instance{}, fmt.Errorf("%s: %q is not valid UTF-8", KeyRedactMask, mask)
	}
	maxDepth, err := parseJSONMaxDepth(config)
	if err != nil {
		return Instance{}, err
	}
	rd := &redactor{root: root, fold: !caseSensitive, maxDepth: maxDepth, mask: quoted}
	fn := func(ctx context.Context, r *Record) error {
		if r.Value == nil {
			return nil
		}
		v, err := rd.redact(ctx, r.Value)
		if errors.Is(err, kerr.InvalidRecord) {
			return fmt.Errorf("%w, so it cannot be redacted", err)
		}
		if err != nil {
			return err // ctx's
		}
		r.Value = v
		return nil
	}
	return instance("redact", config, "produce", fn, fn)
}
