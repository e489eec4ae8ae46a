package jsonvalue

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/twmb/franz-go/pkg/kerr"
)

// Redactor masks the configured fields of JSON values in one pass over
// each value: a streaming tokenizer (jsontext, iterative) reads the value
// once, follows the path of each position in the trie of configured
// fields, and notes the byte span of every value a field names; the output
// is the input with those spans replaced by the mask. The same pass
// refuses what Check refuses (not exactly one JSON value, invalid
// UTF-8, nesting deeper than maxDepth), and an object with a member name
// twice, compared case-insensitively unless fold is false. Work is linear
// in the value's size, and ctx is looked at every redactCheckEvery tokens.
// A Redactor is safe for concurrent use.
type Redactor struct {
	root     *pathNode
	fold     bool // names are compared case-insensitively
	maxDepth int
	mask     []byte // the mask, as a JSON string
}

// Configuration keys of redact (interceptor.KeyRedactFields and the
// others are the same keys; their docs there are the reference).
const (
	KeyRedactFields        = "redact.fields"
	KeyRedactMask          = "redact.mask"
	KeyRedactCaseSensitive = "redact.case.sensitive"
)

// NewRedactor reads redact's configuration (KeyRedactFields, required;
// KeyRedactMask, default "***"; KeyRedactCaseSensitive, default false;
// KeyMaxDepth, default DefaultMaxDepth) and returns its Redactor, or an
// error naming the key at fault. Other keys are ignored.
func NewRedactor(config map[string]string) (*Redactor, error) {
	var fields []string
	for f := range strings.SplitSeq(config[KeyRedactFields], ",") {
		if f = strings.TrimSpace(f); f != "" {
			fields = append(fields, f)
		}
	}
	if len(fields) == 0 {
		return nil, fmt.Errorf("%s: name at least one JSON field path, e.g. user.email", KeyRedactFields)
	}
	caseSensitive := false
	if v := strings.TrimSpace(config[KeyRedactCaseSensitive]); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not true or false", KeyRedactCaseSensitive, config[KeyRedactCaseSensitive])
		}
		caseSensitive = b
	}
	root, err := compileRedactPaths(fields, !caseSensitive)
	if err != nil {
		return nil, err
	}
	mask := "***"
	if m, ok := config[KeyRedactMask]; ok {
		mask = m
	}
	quoted, err := jsontext.AppendQuote(nil, mask)
	if err != nil {
		return nil, fmt.Errorf("%s: %q is not valid UTF-8", KeyRedactMask, mask)
	}
	maxDepth, err := ParseMaxDepth(config)
	if err != nil {
		return nil, err
	}
	return &Redactor{root: root, fold: !caseSensitive, maxDepth: maxDepth, mask: quoted}, nil
}

// redactCheckEvery is how many tokens redact reads between two looks at
// its context.
const redactCheckEvery = 4096

// redactLinearNames is how many member names of one object are compared
// one by one for duplicates before a map takes over.
const redactLinearNames = 16

// span is the byte range [start, end) of one value to mask.
type span struct{ start, end int }

// Redact returns b with the configured fields masked, or b itself (the
// same slice) when no field is present; it never writes into b. A value
// that is not one JSON value, or breaks a bound, gives an error wrapping
// kerr.InvalidRecord that ends "so it cannot be redacted"; a ctx that ends
// gives ctx's error (wrapped, with the byte reached). A nil b is not JSON:
// the interceptors pass a null value before calling Redact.
func (rd *Redactor) Redact(ctx context.Context, b []byte) ([]byte, error) {
	spans, err := rd.spans(ctx, b)
	if errors.Is(err, kerr.InvalidRecord) {
		return b, fmt.Errorf("%w, so it cannot be redacted", err)
	}
	if err != nil || len(spans) == 0 {
		return b, err
	}
	return rd.apply(b, spans), nil
}

// Span is the byte range [Start, End) of one value Redact masks.
type Span struct{ Start, End int }

// Spans returns the spans of b that Redact replaces by the mask, in order
// and disjoint, or the error Redact gives (without its "so it cannot be
// redacted"). For tests that check the output against the input.
func (rd *Redactor) Spans(ctx context.Context, b []byte) ([]Span, error) {
	spans, err := rd.spans(ctx, b)
	out := make([]Span, len(spans))
	for i, sp := range spans {
		out[i] = Span{sp.start, sp.end}
	}
	return out, err
}

// apply returns a new slice: b with each span replaced by the mask.
// spans are in order and disjoint.
func (rd *Redactor) apply(b []byte, spans []span) []byte {
	n := len(b)
	for _, sp := range spans {
		n += len(rd.mask) - (sp.end - sp.start)
	}
	out := make([]byte, 0, n)
	prev := 0
	for _, sp := range spans {
		out = append(out, b[prev:sp.start]...)
		out = append(out, rd.mask...)
		prev = sp.end
	}
	return append(out, b[prev:]...)
}

// redactFrame is an open array or object.
type redactFrame struct {
	array    bool
	wantName bool        // object: a member name comes next
	idx      int64       // array: the index of the next element
	active   []*pathNode // the trie nodes this container's position matches
	next     []*pathNode // the nodes the next value matches
	names    int         // object: where its names start in redactScan.arena
	ends     []int       // object: the ends of its names in arena
	set      map[string]struct{}
}

// redactScan is the state of one pass.
type redactScan struct {
	rd      *Redactor
	frames  []redactFrame // frames[:depth] are open
	depth   int
	arena   []byte // the member names of the open objects (folded when rd.fold)
	scratch []byte // an unescaped name
	root    []*pathNode
	spans   []span
	// masking: inside the value that starts at maskStart, at depth
	// maskFrom; nothing in it is matched (the outer span wins).
	masking   bool
	maskFrom  int
	maskStart int
}

// spans reads b and returns the spans of the values to mask, in order,
// disjoint; errors wrap kerr.InvalidRecord, or ctx's error.
func (rd *Redactor) spans(ctx context.Context, b []byte) ([]span, error) {
	s := redactScan{rd: rd, root: []*pathNode{rd.root}}
	// A bytes.Reader: the decoder reads into its own buffer and never
	// writes into b (which aliases the request).
	dec := jsontext.NewDecoder(bytes.NewReader(b), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(false))
	done := false // the top-level value is read
	for n := 0; ; n++ {
		if n%redactCheckEvery == 0 {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("redact stopped at byte %d of %d: %w", dec.InputOffset(), len(b), err)
			}
		}
		k := dec.PeekKind()
		if k == 0 { // the end, or an error ReadToken returns
			_, err := dec.ReadToken()
			switch {
			case err == io.EOF && done:
				return s.spans, nil
			case err == io.EOF:
				return nil, fmt.Errorf("%w: the value (%d bytes) is not one JSON value but 0", kerr.InvalidRecord, len(b))
			case err == nil:
				err = errors.New("jsontext read a token it could not peek at")
			}
			return nil, invalidJSON(b, err)
		}
		if done {
			return nil, fmt.Errorf("%w: the value (%d bytes) holds more than one JSON value", kerr.InvalidRecord, len(b))
		}
		var top *redactFrame
		if s.depth > 0 {
			top = &s.frames[s.depth-1]
		}
		switch {
		case k == '}' || k == ']':
			if _, err := dec.ReadToken(); err != nil {
				return nil, invalidJSON(b, err)
			}
			s.pop()
			done = s.endValue(int(dec.InputOffset()))
		case k == '"' && top != nil && top.wantName:
			raw, err := dec.ReadValue()
			if err != nil {
				return nil, invalidJSON(b, err)
			}
			if err := s.name(top, raw, int(dec.InputOffset())-len(raw)); err != nil {
				return nil, err
			}
		case k == '{' || k == '[':
			if _, err := dec.ReadToken(); err != nil {
				return nil, invalidJSON(b, err)
			}
			if dec.StackDepth() > rd.maxDepth {
				return nil, tooDeep(rd.maxDepth, dec.InputOffset())
			}
			nodes := s.valueNodes(top)
			s.beginValue(nodes, int(dec.InputOffset())-1)
			s.push(k == '[', nodes)
		default: // a scalar
			raw, err := dec.ReadValue()
			if err != nil {
				return nil, invalidJSON(b, err)
			}
			end := int(dec.InputOffset())
			s.beginValue(s.valueNodes(top), end-len(raw))
			done = s.endValue(end)
		}
	}
}

// valueNodes returns the trie nodes the value about to be read in top
// matches (the root when top is nil), none inside a masked value. In an
// array it counts the element.
func (s *redactScan) valueNodes(top *redactFrame) []*pathNode {
	if top == nil {
		if s.masking {
			return nil
		}
		return s.root
	}
	if !top.array {
		return top.next // computed at the member's name
	}
	i := top.idx
	top.idx++
	top.next = top.next[:0]
	if s.masking {
		return nil
	}
	for _, a := range top.active {
		if a.any != nil {
			top.next = append(top.next, a.any)
		}
		if c := a.index[i]; c != nil {
			top.next = append(top.next, c)
		}
	}
	return top.next
}

// beginValue starts masking at the value starting at byte start when one
// of its nodes ends a configured field (and no outer value is masked).
func (s *redactScan) beginValue(nodes []*pathNode, start int) {
	if s.masking {
		return
	}
	for _, n := range nodes {
		if n.terminal {
			s.masking, s.maskFrom, s.maskStart = true, s.depth, start
			return
		}
	}
}

// endValue ends the value whose last byte is before end; it reports
// whether that was the top-level value.
func (s *redactScan) endValue(end int) bool {
	if s.masking && s.depth == s.maskFrom {
		s.spans = append(s.spans, span{s.maskStart, end})
		s.masking = false
	}
	if s.depth == 0 {
		return true
	}
	if top := &s.frames[s.depth-1]; !top.array {
		top.wantName = true
	}
	return false
}

// push opens an array or object whose position matches nodes (none when
// a mask is under way).
func (s *redactScan) push(array bool, nodes []*pathNode) {
	if s.masking {
		nodes = nil
	}
	if s.depth == len(s.frames) {
		s.frames = append(s.frames, redactFrame{})
	}
	f := &s.frames[s.depth]
	s.depth++
	f.array, f.wantName, f.idx = array, !array, 0
	f.active = append(f.active[:0], nodes...)
	f.next = f.next[:0]
	f.names, f.ends, f.set = len(s.arena), f.ends[:0], nil
}

// pop closes the innermost array or object.
func (s *redactScan) pop() {
	s.depth--
	f := &s.frames[s.depth]
	s.arena = s.arena[:f.names]
	f.set = nil
}

// name reads the member name raw (a JSON string at byte off) of object
// top: it refuses a name the object already has (case-insensitively when
// rd.fold) and finds the nodes the member's value matches.
func (s *redactScan) name(top *redactFrame, raw []byte, off int) error {
	name := raw[1 : len(raw)-1]
	if bytes.IndexByte(raw, '\\') >= 0 {
		var err error
		if s.scratch, err = jsontext.AppendUnquote(s.scratch[:0], raw); err != nil {
			return fmt.Errorf("%w: the value has a member name it cannot read at byte %d: %v", kerr.InvalidRecord, off, err)
		}
		name = s.scratch
	}
	start := len(s.arena)
	if s.rd.fold {
		s.arena = appendFoldedName(s.arena, name)
	} else {
		s.arena = append(s.arena, name...)
	}
	key := s.arena[start:]

	top.wantName = false
	top.next = top.next[:0]
	if !s.masking {
		for _, a := range top.active {
			if c := a.names[string(key)]; c != nil {
				top.next = append(top.next, c)
			}
		}
	}

	dup := false
	if top.set != nil {
		_, dup = top.set[string(key)]
		top.set[string(key)] = struct{}{}
		s.arena = s.arena[:start]
	} else {
		prev := top.names
		for _, e := range top.ends {
			if bytes.Equal(s.arena[prev:e], key) {
				dup = true
				break
			}
			prev = e
		}
		top.ends = append(top.ends, len(s.arena))
		if len(top.ends) > redactLinearNames {
			top.set = make(map[string]struct{}, 2*len(top.ends))
			prev = top.names
			for _, e := range top.ends {
				top.set[string(s.arena[prev:e])] = struct{}{}
				prev = e
			}
			s.arena, top.ends = s.arena[:top.names], top.ends[:0]
		}
	}
	if dup {
		if s.rd.fold {
			return fmt.Errorf("%w: the value has the member name %s twice in one object, names compared ignoring case (at byte %d)", kerr.InvalidRecord, shortName(name), off)
		}
		return fmt.Errorf("%w: the value has the member name %s twice in one object (at byte %d)", kerr.InvalidRecord, shortName(name), off)
	}
	return nil
}

// shortName quotes a member name for an error message, bounded.
func shortName(name []byte) string {
	if len(name) > 64 {
		return strconv.Quote(string(name[:64])) + "…"
	}
	return strconv.Quote(string(name))
}
