// Package jsonvalue reads Kafka record values as JSON for the validate-json
// and redact interceptors: the checks both make (one JSON value, valid
// UTF-8, bounded nesting, no member name twice) and redact's one-pass
// masking. The built-in interceptors and the WebAssembly port of redact
// (examples/wasm/redact) share it, so they answer alike byte for byte. It
// is portable Go (no cgo, no files): it builds for GOOS=wasip1 too.
package jsonvalue

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/twmb/franz-go/pkg/kerr"
)

// KeyMaxDepth bounds the nesting of arrays and objects a JSON
// interceptor (validate-json, redact) reads in one value. Deeper values
// fail with INVALID_RECORD before any recursive code sees them.
// interceptor.KeyJSONMaxDepth is the same key.
const KeyMaxDepth = "json.max.depth"

// DefaultMaxDepth is KeyMaxDepth's default: Jackson's
// (StreamReadConstraints.maxNestingDepth).
const DefaultMaxDepth = 1000

// ParseMaxDepth reads KeyMaxDepth from an interceptor's config: an
// integer from 1 to 10000, DefaultMaxDepth when absent or blank.
func ParseMaxDepth(config map[string]string) (int, error) {
	v, ok := config[KeyMaxDepth]
	if !ok || strings.TrimSpace(v) == "" {
		return DefaultMaxDepth, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 1 || n > 10000 {
		return 0, fmt.Errorf("%s: %q is not a depth between 1 and 10000", KeyMaxDepth, v)
	}
	return n, nil
}

// Check reads b as one JSON value with a streaming tokenizer (jsontext,
// iterative: no input can exhaust the stack) and returns an error wrapping
// kerr.InvalidRecord when b is not exactly one valid JSON value, nests
// arrays and objects deeper than maxDepth, or has a member name twice in
// one object (compared after unescaping: with two, a reader that keeps the
// last one sees what a check of the first one let through). Numbers are
// checked against JSON's grammar only (1e400 is valid JSON).
func Check(b []byte, maxDepth int) error {
	// A value of a usual size is read with a decoder reused from value to
	// value (its buffers and name sets: a new one costs a dozen
	// allocations); a large one gets its own, so that no pooled decoder
	// keeps a large buffer.
	var dec *jsontext.Decoder
	if len(b) <= pooledCheckMax {
		c := checkers.Get().(*checker)
		defer checkers.Put(c)
		c.rd.Reset(b)
		c.dec.Reset(&c.rd, checkOpts...)
		defer c.rd.Reset(nil) // the pooled reader keeps no value
		dec = &c.dec
	} else {
		dec = jsontext.NewDecoder(bytes.NewReader(b), checkOpts...)
	}
	values := 0 // complete top-level values read
	for {
		_, err := dec.ReadToken()
		if err == io.EOF {
			if values != 1 {
				return fmt.Errorf("%w: the value (%d bytes) is not one JSON value but %d", kerr.InvalidRecord, len(b), values)
			}
			return nil
		}
		if err == nil && values > 0 {
			return fmt.Errorf("%w: the value (%d bytes) holds more than one JSON value", kerr.InvalidRecord, len(b))
		}
		if err != nil {
			return invalidJSON(b, err)
		}
		if dec.StackDepth() > maxDepth {
			return tooDeep(maxDepth, dec.InputOffset())
		}
		if dec.StackDepth() == 0 {
			values++
		}
	}
}

// pooledCheckMax is the largest value Check reads with a pooled decoder.
const pooledCheckMax = 64 << 10

// checker is a decoder and its reader, reused by Check.
type checker struct {
	dec jsontext.Decoder
	rd  bytes.Reader
}

var (
	checkers  = sync.Pool{New: func() any { return new(checker) }}
	checkOpts = []jsontext.Options{jsontext.AllowDuplicateNames(false), jsontext.AllowInvalidUTF8(false)}
)

// invalidJSON is the error for b, which a jsontext.Decoder failed to read
// with err.
func invalidJSON(b []byte, err error) error {
	var se *jsontext.SyntacticError
	msg := err.Error()
	if errors.As(err, &se) {
		msg = fmt.Sprintf("at byte %d: %v", se.ByteOffset, se.Err)
	}
	return fmt.Errorf("%w: the value (%d bytes) is not valid JSON %s", kerr.InvalidRecord, len(b), shortMsg(msg))
}

// tooDeep is the error for a value nesting deeper than maxDepth at byte off.
func tooDeep(maxDepth int, off int64) error {
	return fmt.Errorf("%w: the value nests arrays and objects deeper than %s=%d (at byte %d)", kerr.InvalidRecord, KeyMaxDepth, maxDepth, off)
}

// shortMsg bounds a parser message quoted in a Kafka error message.
func shortMsg(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}
