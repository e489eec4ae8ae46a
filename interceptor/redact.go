package interceptor

import (
	"context"

	"github.com/ferrykit/ferry/internal/jsonvalue"
)

// Configuration keys of redact.
const (
	// KeyRedactFields lists the JSON fields to mask, comma-separated, as
	// paths from the value's root: member names separated by dots,
	// "user.email"; "#" for every element of an array, "cards.#.number";
	// digits for one element, "cards.0.number" (or a member of that name in
	// an object); "\" before a character makes it part of a name
	// ("a\.b"). Other GJSON syntax is refused (see parseRedactPath).
	KeyRedactFields = jsonvalue.KeyRedactFields
	// KeyRedactMask is the string a masked field is replaced by (default "***").
	KeyRedactMask = jsonvalue.KeyRedactMask
	// KeyRedactCaseSensitive, "true", compares member names with the fields
	// exactly; by default (false) they are compared case-insensitively (as
	// Go's encoding/json matches struct fields), and an object with two
	// names equal but for case is refused.
	KeyRedactCaseSensitive = jsonvalue.KeyRedactCaseSensitive
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
// unmasked). A null value passes. side defaults to produce. The masking is
// jsonvalue's, shared with the WebAssembly port (examples/wasm/redact).
func newRedact(_ context.Context, config map[string]string) (Instance, error) {
	rd, err := jsonvalue.NewRedactor(config)
	if err != nil {
		return Instance{}, err
	}
	fn := func(ctx context.Context, r *Record) error {
		if r.Value == nil {
			return nil
		}
		v, err := rd.Redact(ctx, r.Value)
		if err != nil {
			return err
		}
		r.Value = v
		return nil
	}
	return instance("redact", config, "produce", fn, fn)
}
