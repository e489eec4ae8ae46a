package interceptor

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	"github.com/ferrykit/ferry/internal/jsonvalue"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/twmb/franz-go/pkg/kerr"
)

// Configuration keys of validate-json.
const (
	// KeyJSONSchema is an inline JSON Schema the values must satisfy.
	KeyJSONSchema = "validate.json.schema"
	// KeyJSONSchemaFile is a file (path or file:// URL) holding the schema.
	KeyJSONSchemaFile = "validate.json.schema.file"
)

func init() { Register("validate-json", newValidateJSON) }

// newValidateJSON builds validate-json: a record whose value is not JSON
// or, with a schema configured (validate.json.schema or
// validate.json.schema.file, drafts 4 to 2020-12), does not satisfy it
// fails with INVALID_RECORD and a message naming the violation; so does a
// value nested deeper than json.max.depth (default 1000) or with a member
// name twice in one object (readers disagree on which one counts). A null value
// (a tombstone) passes. side defaults to produce; on fetch an invalid
// record fails the partition (see Chain.InterceptFetch).
func newValidateJSON(_ context.Context, config map[string]string) (Instance, error) {
	var schema *jsonschema.Schema
	inline, file := strings.TrimSpace(config[KeyJSONSchema]), strings.TrimSpace(config[KeyJSONSchemaFile])
	if inline != "" && file != "" {
		return Instance{}, fmt.Errorf("set only one of %s and %s", KeyJSONSchema, KeyJSONSchemaFile)
	}
	if inline != "" || file != "" {
		c := jsonschema.NewCompiler()
		loc := file
		if inline != "" {
			doc, err := jsonschema.UnmarshalJSON(strings.NewReader(inline))
			if err != nil {
				return Instance{}, fmt.Errorf("%s: not JSON: %w", KeyJSONSchema, err)
			}
			loc = "ferry-inline-schema.json"
			if err := c.AddResource(loc, doc); err != nil {
				return Instance{}, fmt.Errorf("%s: %w", KeyJSONSchema, err)
			}
		}
		var err error
		if schema, err = c.Compile(loc); err != nil {
			key := KeyJSONSchema
			if file != "" {
				key = KeyJSONSchemaFile
			}
			return Instance{}, fmt.Errorf("%s: %w", key, err)
		}
	}
	maxDepth, err := jsonvalue.ParseMaxDepth(config)
	if err != nil {
		return Instance{}, err
	}
	check := func(_ context.Context, r *Record) error {
		if r.Value == nil {
			return nil
		}
		// A streaming tokenizer first: the schema validator decodes
		// recursively, one level per nesting level.
		if err := jsonvalue.Check(r.Value, maxDepth); err != nil {
			return err
		}
		if schema == nil {
			return nil
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(r.Value))
		if err != nil {
			return fmt.Errorf("%w: the value is not valid JSON: %v", kerr.InvalidRecord, err)
		}
		if err := schema.Validate(doc); err != nil {
			return fmt.Errorf("%w: the value does not satisfy the JSON Schema: %s", kerr.InvalidRecord, oneLine(err.Error()))
		}
		return nil
	}
	in, err := instance("validate-json", config, "produce", check, check)
	if err != nil || schema == nil {
		return in, err
	}
	// A schema's validation ignores ctx and can take exponential time on
	// a small value (a recursive oneOf over nested arrays): only its own
	// goroutine lets the budget cut it off (found by a fault-finding run:
	// 1 min 22 s against a 100 ms budget).
	return notInline(in), nil
}

// oneLine folds a multi-line message for a Kafka error message.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
