package interceptor

import "github.com/ferrykit/ferry/internal/jsonvalue"

// KeyJSONMaxDepth bounds the nesting of arrays and objects a JSON
// interceptor (validate-json, redact) reads in one value. Deeper values
// fail with INVALID_RECORD before any recursive code sees them.
const KeyJSONMaxDepth = jsonvalue.KeyMaxDepth

// DefaultJSONMaxDepth is KeyJSONMaxDepth's default: Jackson's
// (StreamReadConstraints.maxNestingDepth).
const DefaultJSONMaxDepth = jsonvalue.DefaultMaxDepth
