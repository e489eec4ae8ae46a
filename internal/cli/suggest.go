package cli

import (
	"slices"
	"strings"

	"github.com/spf13/cobra"
)

// editDistance is the optimal-string-alignment distance between a and b:
// the fewest insertions, deletions, substitutions and swaps of two adjacent
// characters (a common typo, "prodcue") that turn a into b. Bytes are
// compared; command names and property keys are ASCII.
func editDistance(a, b string) int {
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

// nearest returns the known words word is likely a misspelling of, closest
// first (ties in known's order): those within typoDistance of it, compared
// without case, and, when prefix is set, those word begins (for "p":
// produce, proxy). Exact matches are not suggestions.
func nearest(word string, known []string, prefix bool) []string {
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
		d := editDistance(w, lk)
		switch {
		case d <= typoDistance(max(len(w), len(lk))):
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

// orList joins words as "a", "a or b", "a, b or c".
func orList(words []string) string {
	if len(words) <= 1 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// unknownCommand is root's Args: a word that names no command is a usage
// error, with the commands it is likely a misspelling of (nearest). It
// stands in for cobra's suggestions, which offer any command within two
// edits, and with two-letter names ("gc") that is any two-letter word.
func unknownCommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	return usageErrorf("unknown command %q for %q%s", args[0], cmd.CommandPath(), didYouMean(args[0], commandNames(cmd)))
}

// didYouMean is " (did you mean X?)" for the commands word may be a
// misspelling of, or "".
func didYouMean(word string, names []string) string {
	s := nearest(word, names, true)
	if len(s) == 0 {
		return ""
	}
	return " (did you mean " + orList(s) + "?)"
}

// commandNames are the names and aliases of cmd's visible subcommands.
func commandNames(cmd *cobra.Command) []string {
	var names []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() || c.Name() == "help" {
			names = append(names, c.Name())
			names = append(names, c.Aliases...)
		}
	}
	return names
}

// helpCommand is "ferry help [COMMAND...]": cobra's, except that an unknown
// topic is a usage error with suggestions (exit 2), not the root's usage
// printed with exit 0.
func helpCommand(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		Long:  "Help prints the help of any command: ferry help COMMAND (the same as ferry COMMAND --help).",
		RunE: func(_ *cobra.Command, args []string) error {
			c := root
			for _, a := range args {
				next := findSub(c, a)
				if next == nil {
					return usageErrorf("no help for %q: unknown command %q for %q%s",
						strings.Join(args, " "), a, c.CommandPath(), didYouMean(a, commandNames(c)))
				}
				c = next
			}
			return c.Help()
		},
	}
}

// findSub is cmd's subcommand named (or aliased) name, or nil.
func findSub(cmd *cobra.Command, name string) *cobra.Command {
	for _, c := range cmd.Commands() {
		if c.Name() == name || slices.Contains(c.Aliases, name) {
			return c
		}
	}
	return nil
}
