package suggest

import "testing"

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
