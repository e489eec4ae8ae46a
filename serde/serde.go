// Package serde is the composable serializer chain of KIP-1159:
// key.serializers / value.serializers list stages applied in order
// ("json,large-message"), and the consumer's key.deserializers /
// value.deserializers list them in reverse ("large-message,json").
//
// Built-in stages: "bytes" ([]byte as is), "string" (string <-> UTF-8
// bytes), "json" (any <-> encoding/json). "large-message" is the record-level
// offload of package largemessage: it must be the last serializer and the
// first deserializer, and the chain only marks where it runs, because the
// decision needs the whole record (key, value and headers), not one side.
// "avro", "protobuf" and "json-schema" are Confluent's schema-registry
// formats (schemaregistry.go): they need schema.registry.url among the
// client's properties, so a chain holding them is parsed with
// ParseSerializersFor / ParseDeserializersFor. Add a stage with Register, or
// with RegisterFactory when it needs the client's properties.
package serde

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// LargeMessage is the name of the large-message stage.
const LargeMessage = "large-message"

// Stage converts one side (key or value) of a record. Serialize turns the
// application's value into the next stage's input (the last one must give
// []byte); Deserialize reverses it. topic is the record's topic.
type Stage interface {
	Serialize(ctx context.Context, topic string, v any) (any, error)
	Deserialize(ctx context.Context, topic string, v any) (any, error)
}

// StageFuncs adapts two functions to a Stage.
type StageFuncs struct {
	Ser, De func(ctx context.Context, topic string, v any) (any, error)
}

func (f StageFuncs) Serialize(ctx context.Context, topic string, v any) (any, error) {
	return f.Ser(ctx, topic, v)
}
func (f StageFuncs) Deserialize(ctx context.Context, topic string, v any) (any, error) {
	return f.De(ctx, topic, v)
}

// StageFactory builds a stage that needs the client's configuration: props
// are the producer's or consumer's Kafka-style properties (nil when the
// chain is parsed without them), isKey tells which side of the record the
// stage converts (a schema registry subject is "<topic>-key" or
// "<topic>-value"). An error names the key at fault.
type StageFactory func(props map[string]string, isKey bool) (Stage, error)

var (
	mu     sync.RWMutex
	stages = map[string]StageFactory{}
)

// Register adds a stage under name; it panics if name is taken.
func Register(name string, s Stage) {
	RegisterFactory(name, func(map[string]string, bool) (Stage, error) { return s, nil })
}

// RegisterFactory adds a stage built from the client's properties for each
// chain that names it; it panics if name is taken.
func RegisterFactory(name string, f StageFactory) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := stages[name]; dup || name == LargeMessage {
		panic("serde: stage registered twice: " + name)
	}
	stages[name] = f
}

func init() {
	Register("bytes", StageFuncs{
		Ser: func(_ context.Context, _ string, v any) (any, error) { return asBytes("bytes", v) },
		De:  func(_ context.Context, _ string, v any) (any, error) { return asBytes("bytes", v) },
	})
	Register("string", StageFuncs{
		Ser: func(_ context.Context, _ string, v any) (any, error) {
			if s, ok := v.(string); ok {
				return []byte(s), nil
			}
			return asBytes("string", v)
		},
		De: func(_ context.Context, _ string, v any) (any, error) {
			b, err := asBytes("string", v)
			if err != nil || b == nil {
				return nil, err
			}
			return string(b), nil
		},
	})
	Register("json", StageFuncs{
		Ser: func(_ context.Context, _ string, v any) (any, error) {
			if v == nil {
				return []byte(nil), nil
			}
			return json.Marshal(v)
		},
		De: func(_ context.Context, _ string, v any) (any, error) {
			b, err := asBytes("json", v)
			if err != nil || b == nil {
				return nil, err
			}
			var out any
			if err := json.Unmarshal(b, &out); err != nil {
				return nil, fmt.Errorf("json stage: %w", err)
			}
			return out, nil
		},
	})
}

func asBytes(stage string, v any) ([]byte, error) {
	switch b := v.(type) {
	case nil:
		return nil, nil
	case []byte:
		return b, nil
	case json.RawMessage:
		return b, nil
	}
	return nil, fmt.Errorf("%s stage: got %T, want []byte", stage, v)
}

// Chain is a parsed list of stage names.
type Chain struct {
	names        []string
	stages       []Stage
	largeMessage bool
	deserialize  bool
}

// ParseSerializers parses a key.serializers/value.serializers value:
// comma-separated stage names, large-message only last. Empty means "bytes".
// Stages that need properties (the schema-registry ones) fail here: use
// ParseSerializersFor.
func ParseSerializers(list string) (*Chain, error) { return parse(list, false, nil, false) }

// ParseDeserializers parses a key.deserializers/value.deserializers value:
// the reverse order, large-message only first.
func ParseDeserializers(list string) (*Chain, error) { return parse(list, true, nil, false) }

// ParseSerializersFor is ParseSerializers for one side of the record (isKey:
// key.serializers) with the client's properties, which stages built by a
// StageFactory read.
func ParseSerializersFor(list string, props map[string]string, isKey bool) (*Chain, error) {
	return parse(list, false, props, isKey)
}

// ParseDeserializersFor is ParseDeserializers for one side of the record
// with the client's properties.
func ParseDeserializersFor(list string, props map[string]string, isKey bool) (*Chain, error) {
	return parse(list, true, props, isKey)
}

func parse(list string, de bool, props map[string]string, isKey bool) (*Chain, error) {
	c := &Chain{deserialize: de}
	for _, n := range strings.Split(list, ",") {
		if n = strings.TrimSpace(n); n != "" {
			c.names = append(c.names, n)
		}
	}
	if len(c.names) == 0 {
		c.names = []string{"bytes"}
	}
	mu.RLock()
	defer mu.RUnlock()
	for i, n := range c.names {
		if n == LargeMessage {
			if (de && i != 0) || (!de && i != len(c.names)-1) {
				where := "last serializer"
				if de {
					where = "first deserializer"
				}
				return nil, fmt.Errorf("%q: %s must be the %s", list, LargeMessage, where)
			}
			c.largeMessage = true
			continue
		}
		f, ok := stages[n]
		if !ok {
			return nil, fmt.Errorf("%q: unknown stage %q (registered: %s)", list, n, strings.Join(names(), ", "))
		}
		s, err := f(props, isKey)
		if err != nil {
			return nil, fmt.Errorf("%q: stage %s: %w", list, n, err)
		}
		c.stages = append(c.stages, s)
	}
	return c, nil
}

// Names lists the registered stages and large-message, sorted.
func Names() []string {
	mu.RLock()
	defer mu.RUnlock()
	return names()
}

// names is Names for a caller that holds mu.
func names() []string {
	out := []string{LargeMessage}
	for n := range stages {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// LargeMessage reports whether the chain includes the large-message stage.
func (c *Chain) LargeMessage() bool { return c.largeMessage }

// PassesBytes reports whether the chain's stages hand bytes through as they
// are (only "bytes", besides large-message): a consumer may then stream
// the value instead of decoding it.
func (c *Chain) PassesBytes() bool {
	for _, n := range c.names {
		if n != "bytes" && n != LargeMessage {
			return false
		}
	}
	return true
}

// String is the chain as configured.
func (c *Chain) String() string { return strings.Join(c.names, ",") }

// Serialize runs the stages in order and returns the bytes for Kafka (before
// the large-message step, which the producer applies to the whole record).
func (c *Chain) Serialize(ctx context.Context, topic string, v any) ([]byte, error) {
	var err error
	for _, s := range c.stages {
		if v, err = s.Serialize(ctx, topic, v); err != nil {
			return nil, err
		}
	}
	return asBytes("last", v)
}

// Deserialize runs the stages (the large-message step already applied by
// the consumer) and returns the application's value.
func (c *Chain) Deserialize(ctx context.Context, topic string, b []byte) (any, error) {
	var v any = b
	var err error
	for _, s := range c.stages {
		if v, err = s.Deserialize(ctx, topic, v); err != nil {
			return nil, err
		}
	}
	return v, nil
}
