package schemareg

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/ferrykit/ferry/internal/jsonvalue"
)

// jsonSchema validates JSON payloads against a registry's JSON Schema
// (drafts 4 to 2020-12, santhosh-tekuri/jsonschema). The payload is first
// read by the iterative tokenizer of jsonvalue (Limits.MaxDepth, duplicate
// member names), as the validator decodes recursively.
type jsonSchema struct {
	s     *jsonschema.Schema
	title string // Confluent's record name for JSON Schema
}

// noLoader refuses every URL: a registry's schema must not make the proxy
// read files or the network ($ref to anything but itself or a draft's
// meta-schema, which the library has built in).
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("$ref to %q: schemas that load other documents are not supported", url)
}

func parseJSONSchema(id int, text string, refs []namedText, lim Limits) (*jsonSchema, error) {
	c := jsonschema.NewCompiler()
	c.UseLoader(noLoader{})
	// References are resources under the names the schema's $ref uses.
	for _, ref := range refs {
		rdoc, err := jsonDoc(ref.text, lim)
		if err == nil {
			err = c.AddResource(ref.name, rdoc)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: JSON Schema reference %s: %v", ErrBadSchema, ref.name, err)
		}
	}
	doc, err := jsonDoc(text, lim)
	if err != nil {
		return nil, fmt.Errorf("%w: JSON Schema: %v", ErrBadSchema, err)
	}
	loc := fmt.Sprintf("ferry-registry-schema-%d.json", id)
	if err := c.AddResource(loc, doc); err != nil {
		return nil, fmt.Errorf("%w: JSON Schema: %v", ErrBadSchema, err)
	}
	s, err := c.Compile(loc)
	if err != nil {
		return nil, fmt.Errorf("%w: JSON Schema: %s", ErrBadSchema, oneLine(err.Error()))
	}
	js := &jsonSchema{s: s}
	if m, ok := doc.(map[string]any); ok {
		js.title, _ = m["title"].(string)
	}
	return js, nil
}

// jsonDoc reads a schema's JSON, its nesting bounded first (the compiler
// reads recursively).
func jsonDoc(text string, lim Limits) (any, error) {
	if err := jsonvalue.Check([]byte(text), lim.MaxDepth); err != nil {
		return nil, err
	}
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("not JSON: %v", err)
	}
	return doc, nil
}

func (j *jsonSchema) validate(_ context.Context, b []byte, lim Limits) error {
	if err := jsonvalue.Check(b, lim.MaxDepth); err != nil {
		return fmt.Errorf("%w: JSON: %s", ErrInvalidPayload, oneLine(err.Error()))
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("%w: JSON: %v", ErrInvalidPayload, err)
	}
	if err := j.s.Validate(doc); err != nil {
		return fmt.Errorf("%w: JSON Schema: %s", ErrInvalidPayload, oneLine(err.Error()))
	}
	return nil
}

// oneLine folds a multi-line message for a Kafka error message.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
