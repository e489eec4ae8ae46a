package interceptor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
)

// redactValue runs a produce-side redact built with cfg over one value.
func redactValue(t *testing.T, cfg map[string]string, v string) (string, error) {
	t.Helper()
	in := newBuiltin(t, "redact", cfg)
	r := &Record{Topic: "t", Value: []byte(v)}
	err := in.Produce.ProcessRecord(context.Background(), r)
	return string(r.Value), err
}

// cardsValue is {"cards":[{"number":"4111111111111111","exp":"01/30"},…]}
// with n elements.
func cardsValue(n int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"cards":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"number":"4111111111111111"}`)
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

// redactFoldConfig and redactFoldCases: names compared ignoring case.
var redactFoldConfig = map[string]string{KeyRedactFields: "email,user.email,kind"}

var redactFoldCases = []struct{ in, want string }{
	{`{"EMAIL":"secret"}`, `{"EMAIL":"***"}`},
	{`{"User":{"eMail":"secret"}}`, `{"User":{"eMail":"***"}}`},
	{`{"em\u0061il":"secret"}`, `{"em\u0061il":"***"}`},
	{`{"\u0045mail":"secret"}`, `{"\u0045mail":"***"}`},
	{`{"\u212aind":"secret"}`, `{"\u212aind":"***"}`}, // Kelvin sign: EqualFold("Kind", "\u212aind")
	{`{"KIND":1,"user":{"EMAIL":[1]}}`, `{"KIND":"***","user":{"EMAIL":"***"}}`},
	{`{"emails":"x","e-mail":"y"}`, `{"emails":"x","e-mail":"y"}`},
}

// redactFoldRefused have two names equal but for case in one object.
var redactFoldRefused = []string{
	`{"email":"x","Email":"secret"}`,
	`{"a":[{"Name":1,"NAME":2}]}`,
	`{"user":{"email":"x","em\u0041il":"secret"}}`,
	`{"\u212a":1,"k":2}`,
}

// redactExactConfig and redactExactCases: redact.case.sensitive=true.
var redactExactConfig = map[string]string{KeyRedactFields: "email,user.email", KeyRedactCaseSensitive: "true"}

var redactExactCases = []struct{ in, want string }{
	{`{"EMAIL":"secret"}`, `{"EMAIL":"secret"}`},
	{`{"email":"x","Email":"y"}`, `{"email":"***","Email":"y"}`},
	{`{"User":{"email":"x"},"user":{"email":"y"}}`, `{"User":{"email":"x"},"user":{"email":"***"}}`},
	{`{"em\u0061il":"x"}`, `{"em\u0061il":"***"}`},
}

// redactExactRefused have a name twice, compared exactly.
var redactExactRefused = []string{`{"email":"x","email":"y"}`, `{"email":"x","em\u0061il":"y"}`}

// redactPathCases: fields, a value, and the value redacted.
var redactPathCases = []struct{ fields, in, want string }{
	// An escaped dot is part of the name.
	{`a\.b`, `{"a.b":1,"a":{"b":2}}`, `{"a.b":"***","a":{"b":2}}`},
	{`a.b`, `{"a.b":1,"a":{"b":2}}`, `{"a.b":1,"a":{"b":"***"}}`},
	// Other escaped characters.
	{`x\@y,\#,p\*`, `{"x@y":1,"#":2,"p*":3,"p":4}`, `{"x@y":"***","#":"***","p*":"***","p":4}`},
	// Nested #.
	{`a.#.#.b`, `{"a":[[{"b":1},{"b":2,"c":3}],[],[{"c":4},5,{"b":[6]}]],"b":7}`,
		`{"a":[[{"b":"***"},{"b":"***","c":3}],[],[{"c":4},5,{"b":"***"}]],"b":7}`},
	// # at the end: every element.
	{`cards.#`, `{"cards":[1,{"a":2},[3]],"n":[4]}`, `{"cards":["***","***","***"],"n":[4]}`},
	// # on an object matches nothing; a top-level array.
	{`#.a`, `[{"a":1},{"b":2}]`, `[{"a":"***"},{"b":2}]`},
	{`o.#`, `{"o":{"a":1}}`, `{"o":{"a":1}}`},
	// Digits: an array index, or a member of that name.
	{`cards.1.number`, `{"cards":[{"number":1},{"number":2},{"number":3}]}`, `{"cards":[{"number":1},{"number":"***"},{"number":3}]}`},
	{`cards.1.number`, `{"cards":{"1":{"number":2},"0":{"number":1}}}`, `{"cards":{"1":{"number":"***"},"0":{"number":1}}}`},
	{`a.01`, `{"a":[0,1],"b":{"01":1}}`, `{"a":[0,1],"b":{"01":1}}`},
	{`a.01`, `{"a":{"01":1,"1":2}}`, `{"a":{"01":"***","1":2}}`},
	{`a.\0`, `{"a":[1]}`, `{"a":[1]}`},
	// Overlapping fields: the outer value is masked once.
	{`user,user.email`, `{"user":{"email":"x"},"u":1}`, `{"user":"***","u":1}`},
	{`user.email,user`, `{"user":{"email":"x"}}`, `{"user":"***"}`},
	{`cards.#.number,cards.0`, `{"cards":[{"number":1},{"number":2}]}`, `{"cards":["***",{"number":"***"}]}`},
	{`a.#.b,a.0.b,a.0.b.c`, `{"a":[{"b":{"c":1}},{"b":2}]}`, `{"a":[{"b":"***"},{"b":"***"}]}`},
	// Spacing and order are kept; only the masked values change.
	{`a.#.b`, " { \"z\" : 1 ,\n \"a\" : [ { \"b\" : [ 1 , 2 ] } , 3 ] }\n", " { \"z\" : 1 ,\n \"a\" : [ { \"b\" : \"***\" } , 3 ] }\n"},
	// Strings with escapes, numbers, literals as masked values.
	{`s,n,t,z`, `{"s":"a\"b\u00e9","n":-1.5e3,"t":true,"z":null}`, `{"s":"***","n":"***","t":"***","z":"***"}`},
	// A top-level scalar: nothing to mask.
	{`a`, `"a"`, `"a"`},
}

// redactInvalidConfig and redactInvalidCases: values refused, and a part of
// the message.
var redactInvalidConfig = map[string]string{KeyRedactFields: "a", KeyJSONMaxDepth: "3"}

var redactInvalidCases = []struct{ in, want string }{
	{``, "not one JSON value but 0"},
	{`  `, "not one JSON value but 0"},
	{`1 2`, "more than one JSON value"},
	{`{"a":1}{}`, "more than one JSON value"},
	{`{"a":1} x`, "not valid JSON at byte 8"},
	{`{"a":1`, "not valid JSON"},
	{`{"a" 1}`, "not valid JSON at byte 5"},
	{`{1:2}`, "not valid JSON at byte 1"},
	{`[1,]`, "not valid JSON"},
	{`{"a":[1}`, "not valid JSON"},
	{"{\"a\":\"\xff\"}", "not valid JSON"},
	{"{\"\xff\":1}", "not valid JSON"},
	{`{"a":"\ud800"}`, "not valid JSON"},
	{`[[[[1]]]]`, "deeper than json.max.depth=3 (at byte 4)"},
	{`{"a":{"b":{"c":{}}}}`, "deeper than json.max.depth=3"},
	{`{"a":1,"a":2}`, "ignoring case"},
}

// redactValidCases pass redactInvalidConfig's checks.
var redactValidCases = []string{`[[[1]]]`, ` {"b":[{}]} `, `null`, `{"":1,"b":""}`}

// Found by an adversarial test: each element masked by its own sjson call
// rewrote the whole value (2.2 MB took 87 s). Now one pass: 100,000
// elements (2.9 MB) are redacted well inside a 5 s deadline, with memory
// allocated in proportion to the value (the quadratic rewrite allocated
// the value's size once per element: about 290 GB here).
func TestRedactLinear(t *testing.T) {
	in := newBuiltin(t, "redact", map[string]string{KeyRedactFields: "cards.#.number"})
	v := cardsValue(100_000)
	if len(v) < 2<<20 {
		t.Fatalf("value of %d bytes, want at least 2 MiB", len(v))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r := &Record{Topic: "t", Value: v}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := in.Produce.ProcessRecord(ctx, r)
	runtime.ReadMemStats(&after)
	if err != nil || ctx.Err() != nil {
		t.Fatalf("redact: %v (deadline: %v)", err, ctx.Err())
	}
	if n := bytes.Count(r.Value, []byte(`{"number":"***"}`)); n != 100_000 {
		t.Fatalf("%d elements masked, want 100000", n)
	}
	if len(r.Value) != len(v)-100_000*(len(`"4111111111111111"`)-len(`"***"`)) {
		t.Fatalf("output of %d bytes", len(r.Value))
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; !raceEnabled && alloc > 16*uint64(len(v)) {
		t.Fatalf("redacting %d bytes allocated %d bytes", len(v), alloc)
	}
}

// countingCtx reports Canceled from its stop-th call of Err on.
type countingCtx struct {
	context.Context
	calls atomic.Int64
	stop  int64
}

func (c *countingCtx) Err() error {
	if c.calls.Add(1) >= c.stop {
		return context.Canceled
	}
	return nil
}

// A context cancelled in the middle of a large value stops the pass at
// the next look (every redactCheckEvery tokens) with the context's error.
func TestRedactCancel(t *testing.T) {
	in := newBuiltin(t, "redact", map[string]string{KeyRedactFields: "cards.#.number"})
	v := cardsValue(100_000) // 500,002 tokens
	ctx := &countingCtx{Context: context.Background(), stop: 3}
	r := &Record{Topic: "t", Value: v}
	err := in.Produce.ProcessRecord(ctx, r)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if n := ctx.calls.Load(); n != 3 {
		t.Fatalf("ctx looked at %d times, want 3 (stopped at the first look after the cancel)", n)
	}
	if !bytes.Equal(r.Value, v) {
		t.Fatal("the record was changed")
	}
	// Already cancelled: nothing is read.
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if err := in.Produce.ProcessRecord(done, &Record{Topic: "t", Value: v}); !errors.Is(err, context.Canceled) ||
		!strings.Contains(err.Error(), "at byte 0 of") {
		t.Fatalf("got %v", err)
	}
}

// Found by an adversarial test: names were matched exactly, while Go's
// encoding/json (and others) match struct fields case-insensitively, so
// {"email":"x","Email":"secret"} kept "secret" for a Go reader, and
// {"EMAIL":"secret"} passed unmasked.
func TestRedactCaseInsensitive(t *testing.T) {
	cfg := redactFoldConfig
	for _, tc := range redactFoldCases {
		got, err := redactValue(t, cfg, tc.in)
		if err != nil || got != tc.want {
			t.Errorf("%s: %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	// A Go reader sees the mask.
	got, err := redactValue(t, cfg, `{"EMAIL":"secret","User":{"Email":"secret"}}`)
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Email string
		User  struct{ Email string }
	}
	if err := json.Unmarshal([]byte(got), &s); err != nil || s.Email != "***" || s.User.Email != "***" {
		t.Fatalf("%s read as %+v, %v", got, s, err)
	}
	// Two names equal but for case: refused, wherever they are.
	for _, v := range redactFoldRefused {
		if _, err := redactValue(t, cfg, v); !errors.Is(err, kerr.InvalidRecord) || !strings.Contains(err.Error(), "ignoring case") {
			t.Errorf("%s: %v, want INVALID_RECORD for names equal but for case", v, err)
		}
	}
	_, err = redactValue(t, cfg, `{"id":1,"Email":"x","eMail":"y"}`)
	if err == nil || !strings.Contains(err.Error(), `"eMail" twice in one object, names compared ignoring case (at byte 20)`) {
		t.Errorf("error %v, want the second name and its offset", err)
	}

	// redact.case.sensitive=true: exact names, exact duplicates refused.
	exact := redactExactConfig
	for _, tc := range redactExactCases {
		got, err := redactValue(t, exact, tc.in)
		if err != nil || got != tc.want {
			t.Errorf("case-sensitive %s: %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	for _, v := range redactExactRefused {
		if _, err := redactValue(t, exact, v); !errors.Is(err, kerr.InvalidRecord) || !strings.Contains(err.Error(), "twice") {
			t.Errorf("case-sensitive %s: %v, want INVALID_RECORD", v, err)
		}
	}
	if _, err := New(context.Background(), "redact", map[string]string{KeyRedactFields: "a", KeyRedactCaseSensitive: "maybe"}); err == nil ||
		!strings.Contains(err.Error(), KeyRedactCaseSensitive) {
		t.Errorf("redact.case.sensitive=maybe: %v", err)
	}
}

// Objects with many names switch from a list to a map for duplicates.
func TestRedactManyNames(t *testing.T) {
	var names []string
	for i := range 40 {
		names = append(names, fmt.Sprintf(`"n%d":%d`, i, i))
	}
	obj := "{" + strings.Join(names, ",") + "}"
	cfg := map[string]string{KeyRedactFields: "N39,x.n0"}
	got, err := redactValue(t, cfg, `{"x":`+obj+`,"y":`+obj+`}`)
	want := `{"x":` + strings.Replace(obj, `"n0":0`, `"n0":"***"`, 1) + `,"y":` + obj + `}`
	if err != nil || got != want {
		t.Fatalf("got %s, %v", got, err)
	}
	for _, dup := range []string{`"N0":1`, `"n39":1`, `"n2\u0030":1`} {
		v := `{"x":{` + strings.Join(names, ",") + "," + dup + `}}`
		if _, err := redactValue(t, cfg, v); !errors.Is(err, kerr.InvalidRecord) {
			t.Errorf("%s added: %v, want INVALID_RECORD", dup, err)
		}
	}
	// The names of a closed object do not count in the next one.
	if _, err := redactValue(t, cfg, `[`+obj+`,`+obj+`,{"a":`+obj+`,"n0":1}]`); err != nil {
		t.Fatal(err)
	}
}

func TestRedactPaths(t *testing.T) {
	for _, tc := range redactPathCases {
		got, err := redactValue(t, map[string]string{KeyRedactFields: tc.fields}, tc.in)
		if err != nil || got != tc.want {
			t.Errorf("%s on %s: %s, %v; want %s", tc.fields, tc.in, got, err, tc.want)
		}
	}
	// A mask that needs escaping is written as a JSON string.
	got, err := redactValue(t, map[string]string{KeyRedactFields: "a", KeyRedactMask: `<"x">`}, `{"a":1}`)
	if err != nil || got != `{"a":"<\"x\">"}` {
		t.Fatalf("got %s, %v", got, err)
	}
	if _, err := New(context.Background(), "redact", map[string]string{KeyRedactFields: "a", KeyRedactMask: "\xff"}); err == nil {
		t.Fatal("a mask of invalid UTF-8 accepted")
	}
}

// GJSON syntax beyond names, # and digits is refused at configuration
// time, naming the key and the path.
func TestRedactPathRefused(t *testing.T) {
	for _, p := range []string{
		`*`, `a.*`, `a.b*`, `a?c`, `@this`, `a.@reverse`, `a|b`, `friends.#(last=="Murphy").first`,
		`#(a)`, `a.#b`, `a..b`, `.a`, `a.`, `{a}`, `[a]`, `!true`, `a\`, "a\xffb",
	} {
		_, err := New(context.Background(), "redact", map[string]string{KeyRedactFields: "ok," + p})
		if err == nil || !strings.Contains(err.Error(), KeyRedactFields) || !strings.Contains(err.Error(), fmt.Sprintf("%q", p)) {
			t.Errorf("%s: %v, want an error naming %s and the path", p, err, KeyRedactFields)
		}
	}
	for _, p := range []string{`a\*b`, `a\@b`, `a\|b`, `a\#b`, `\!true`, `a.\[0\]`, `é.#.0`, `a\\b`} {
		if _, err := New(context.Background(), "redact", map[string]string{KeyRedactFields: p}); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}

// The checks of checkJSON, in the same pass, with the byte offset.
func TestRedactRefusesInvalid(t *testing.T) {
	cfg := redactInvalidConfig
	for _, tc := range redactInvalidCases {
		_, err := redactValue(t, cfg, tc.in)
		if !errors.Is(err, kerr.InvalidRecord) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "cannot be redacted") {
			t.Errorf("%q: %v, want INVALID_RECORD with %q", tc.in, err, tc.want)
		}
	}
	for _, v := range redactValidCases {
		if _, err := redactValue(t, cfg, v); err != nil {
			t.Errorf("%s: %v", v, err)
		}
	}
	// A value without the fields is kept as is (same slice: the batch
	// is not re-encoded); a null value passes.
	in := newBuiltin(t, "redact", cfg)
	v := []byte(`{"b":1}`)
	r := &Record{Topic: "t", Value: v}
	if err := in.Produce.ProcessRecord(context.Background(), r); err != nil || &r.Value[0] != &v[0] {
		t.Fatalf("%v, value %s", err, r.Value)
	}
	r = &Record{Topic: "t"}
	if err := in.Produce.ProcessRecord(context.Background(), r); err != nil || r.Value != nil {
		t.Fatalf("null: %v, %q", err, r.Value)
	}
}
