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
// Add a stage with Register.
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

var (
	mu     sync.RWMutex
	stages = map[string]Stage{}
)

// Register adds a stage under name; it panics if name is taken.
func Register(name string, s Stage) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := stages[name]; dup || name == LargeMessage {
		panic("serde: stage registered twice: " + name)
	}
	stages[name] = s
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
func ParseSerializers(list string) (*Chain, error) { return parse(list, false) }

// ParseDeserializers parses a key.deserializers/value.deserializers value:
// the reverse order, large-message only first.
func ParseDeserializers(list string) (*Chain, error) { return parse(list, true) }

func parse(list string, de bool) (*Chain, error) {
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
		s, ok := stages[n]
		if !ok {
			return nil, fmt.Errorf("%q: unknown stage %q (registered: %s)", list, n, strings.Join(names(), ", "))
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
