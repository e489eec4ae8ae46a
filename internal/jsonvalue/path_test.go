package jsonvalue

import (
	"strings"
	"testing"
	"unicode"
)

// appendFoldedName folds two names alike exactly when strings.EqualFold
// says they are equal.
func TestFoldName(t *testing.T) {
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if r >= 0xD800 && r <= 0xDFFF {
			continue
		}
		f := string(appendFoldedName(nil, []byte(string(r))))
		for o := unicode.SimpleFold(r); o != r; o = unicode.SimpleFold(o) {
			if g := string(appendFoldedName(nil, []byte(string(o)))); g != f {
				t.Fatalf("%U folds to %q, %U (same orbit) to %q", r, f, o, g)
			}
		}
		if !strings.EqualFold(f, string(r)) {
			t.Fatalf("%U folds to %q, which EqualFold does not equal", r, f)
		}
	}
	if got := string(appendFoldedName(nil, []byte("Straße.ΣΑΣ-x_1"))); got != string(appendFoldedName(nil, []byte("STRAẞE.σας-X_1"))) {
		t.Fatalf("folded %q", got)
	}
}

func TestParseRedactPath(t *testing.T) {
	for _, tc := range []struct {
		path string
		want []pathSeg
	}{
		{`user.email`, []pathSeg{{name: "user", index: -1}, {name: "email", index: -1}}},
		{`cards.#.number`, []pathSeg{{name: "cards", index: -1}, {any: true, index: -1}, {name: "number", index: -1}}},
		{`a.0.10.01.\1`, []pathSeg{{name: "a", index: -1}, {name: "0", index: 0}, {name: "10", index: 10}, {name: "01", index: -1}, {name: "1", index: -1}}},
		{`a\.b.\#.c\\`, []pathSeg{{name: "a.b", index: -1}, {name: "#", index: -1}, {name: `c\`, index: -1}}},
		{`99999999999999999999`, []pathSeg{{name: "99999999999999999999", index: -1}}},
		{`é\é`, []pathSeg{{name: "éé", index: -1}}},
	} {
		got, err := parseRedactPath(tc.path)
		if err != nil || len(got) != len(tc.want) {
			t.Fatalf("%s: %+v, %v", tc.path, got, err)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Fatalf("%s: segment %d is %+v, want %+v", tc.path, i, got[i], tc.want[i])
			}
		}
	}
	for _, p := range []string{`*`, `a?`, `@this`, `a|b`, `#(a)`, `a#`, `a..b`, `.a`, `a.`, `[a]`, `{a}`, `!true`, `a(`, `a\`, "\xff"} {
		if _, err := parseRedactPath(p); err == nil {
			t.Errorf("%s accepted", p)
		}
	}
}
