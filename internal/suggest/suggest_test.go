package suggest

import (
	"slices"
	"testing"
)

func TestEditDistance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		d    int
	}{
		{"", "", 0}, {"gc", "", 2}, {"produce", "produce", 0}, {"prodcue", "produce", 1},
		{"ls", "gc", 2}, {"large.mesage.threshold.bytes", "large.message.threshold.bytes", 1},
		{"ca", "abc", 3}, // OSA, not Damerau: no edit of a swapped pair
	} {
		if d := EditDistance(c.a, c.b); d != c.d {
			t.Errorf("EditDistance(%q, %q) = %d, want %d", c.a, c.b, d, c.d)
		}
	}
}

// Within bounds every word by the same number of edits (Nearest allows one
// below eight bytes), closest first, prefixes included when asked.
func TestWithin(t *testing.T) {
	known := []string{"upstream", "out", "brokers", "timeout", "topic"}
	for _, c := range []struct {
		word   string
		edits  int
		prefix bool
		want   []string
	}{
		{"uptream", 2, true, []string{"upstream"}},
		{"brkrs", 2, true, []string{"brokers"}},      // two edits, seven bytes: Nearest says nothing
		{"tim", 2, true, []string{"timeout"}},        // a prefix
		{"t", 0, true, []string{"topic", "timeout"}}, // prefixes only, shortest first
		{"tpoic", 2, false, []string{"topic"}},       // a swap is one edit
		{"out", 2, true, nil},                        // an exact match is no suggestion
		{"zzzz", 2, true, nil},
	} {
		if got := Within(c.word, known, c.edits, c.prefix); !slices.Equal(got, c.want) {
			t.Errorf("Within(%q, %d, %t) = %q, want %q", c.word, c.edits, c.prefix, got, c.want)
		}
	}
	if got := Nearest("brkrs", known, true); len(got) != 0 {
		t.Errorf("Nearest(brkrs) = %q, want nothing (one edit below eight bytes)", got)
	}
}
