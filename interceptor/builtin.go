package interceptor

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// KeySide selects where a built-in runs: "produce", "fetch" or "both".
const KeySide = "side"

// Keys returns the configuration keys the built-in interceptors read
// besides the large.message.* keys of large-message (largemessage.Keys,
// largemessage.ParseConfig).
func Keys() []string {
	return slices.Concat([]string{KeySide, KeyTopicPattern, KeyTimeout, KeyJSONMaxDepth, KeyRedactFields, KeyRedactMask,
		KeyRedactCaseSensitive, KeyJSONSchema, KeyJSONSchemaFile, KeyPayloadCacheMax, KeyStreamThreshold}, encryptKeys, validateSchemaKeys)
}

// named is the common part of the built-ins.
type named struct {
	name    string
	pattern *regexp.Regexp
	fn      func(context.Context, *Record) error
	// noInline: fn may run on after ctx is cancelled (validate-schema's
	// registry; a JSON Schema's validation, which can take exponential
	// time on a small value): its partitions keep their own goroutine
	// (see inliner).
	noInline bool
}

// inline reports whether fn's calls may run on the request's goroutine.
func (n *named) inline() bool { return !n.noInline }

// notInline marks in's built-ins as no inliners: their calls may run past
// a cancelled ctx (see inliner).
func notInline(in Instance) Instance {
	for _, ic := range []any{in.Produce, in.Fetch} {
		if n, ok := ic.(*named); ok {
			n.noInline = true
		}
	}
	return in
}

func (n *named) Name() string                                       { return n.name }
func (n *named) TopicPattern() *regexp.Regexp                       { return n.pattern }
func (n *named) ProcessRecord(ctx context.Context, r *Record) error { return n.fn(ctx, r) }

// sides reads KeySide (default def) and returns whether to run on produce
// and on fetch.
func sides(config map[string]string, def string) (produce, fetch bool, err error) {
	s := strings.ToLower(strings.TrimSpace(config[KeySide]))
	if s == "" {
		s = def
	}
	switch s {
	case "produce":
		return true, false, nil
	case "fetch":
		return false, true, nil
	case "both":
		return true, true, nil
	}
	return false, false, fmt.Errorf("%s: %q is not produce, fetch or both", KeySide, config[KeySide])
}

// instance builds an Instance that runs produceFn and fetchFn as selected
// by the configuration's side (def when unset) and topic.pattern.
func instance(name string, config map[string]string, def string, produceFn, fetchFn func(context.Context, *Record) error) (Instance, error) {
	re, err := CompileTopicPattern(config[KeyTopicPattern])
	if err != nil {
		return Instance{}, err
	}
	p, f, err := sides(config, def)
	if err != nil {
		return Instance{}, err
	}
	var in Instance
	if p {
		in.Produce = &named{name: name, pattern: re, fn: produceFn}
	}
	if f {
		in.Fetch = &named{name: name, pattern: re, fn: fetchFn}
	}
	return in, nil
}
