// Package suggest names the known words a mistyped one is likely meant to
// be: the "did you mean" of ferry's commands, property keys, interceptor
// names and the proxy's configuration file.
package suggest

import (
	"slices"
	"strings"
)

// EditDistance is the optimal-string-alignment distance between a and b:
// the fewest insertions, deletions, substitutions and swaps of two adjacent
// characters (a common typo, "prodcue") that turn a into b. Bytes are
// compared; command names and property keys are ASCII.
func EditDistance(a, b string) int {
	// Three rows: d[i-2], d[i-1], d[i].
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// typoDistance is how many edits a word of n bytes may be from a known one
// and still be taken for its misspelling: one for a short word (so that
// "ls" is nobody's typo of "gc"), two from eight bytes on.
func typoDistance(n int) int {
	if n >= 8 {
		return 2
	}
	return 1
}

// Nearest returns the known words word is likely a misspelling of, closest
// first (ties in known's order): those within typoDistance of it, compared
// without case, and, when prefix is set, those word begins (for "p":
// produce, proxy). Exact matches are not suggestions.
func Nearest(word string, known []string, prefix bool) []string {
	return nearest(word, known, prefix, typoDistance)
}

// Within is Nearest with one bound for every word: the known words at most
// edits away from word and, when prefix is set, those word begins. For
// names that are long next to a typo, as a command's flags are ("uptream":
// upstream, "brokrs": brokers).
func Within(word string, known []string, edits int, prefix bool) []string {
	return nearest(word, known, prefix, func(int) int { return edits })
}

func nearest(word string, known []string, prefix bool, limit func(n int) int) []string {
	w := strings.ToLower(word)
	type cand struct {
		name string
		d    int
	}
	var cs []cand
	for _, k := range known {
		lk := strings.ToLower(k)
		if lk == w && k == word {
			continue
		}
		d := EditDistance(w, lk)
		switch {
		case d <= limit(max(len(w), len(lk))):
		case prefix && w != "" && strings.HasPrefix(lk, w):
			d = len(lk) - len(w)
		default:
			continue
		}
		cs = append(cs, cand{k, d})
	}
	slices.SortStableFunc(cs, func(a, b cand) int { return a.d - b.d })
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.name
	}
	return out
}

// OrList joins words as "a", "a or b", "a, b or c".
func OrList(words []string) string {
	if len(words) <= 1 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}
