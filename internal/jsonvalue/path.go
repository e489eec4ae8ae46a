package jsonvalue

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// pathNode is a node of the trie of redact's configured fields: the root
// stands for the whole value, each child for one step of a path.
type pathNode struct {
	// terminal: a configured field ends here (the value is masked).
	terminal bool
	// names: children by member name, unescaped, and folded (foldName)
	// unless names are compared exactly.
	names map[string]*pathNode
	// index: children by array index (a segment of digits; the same node
	// is in names under the digits, as GJSON reads "0" on an object).
	index map[int64]*pathNode
	// any: the child for "#", every element of an array.
	any *pathNode
}

// compileRedactPaths parses the configured fields into a trie. fold: names
// are compared case-insensitively (foldName).
func compileRedactPaths(fields []string, fold bool) (*pathNode, error) {
	root := &pathNode{}
	for _, f := range fields {
		segs, err := parseRedactPath(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %s", KeyRedactFields, f, err)
		}
		n := root
		for _, s := range segs {
			n = n.child(s, fold)
		}
		n.terminal = true
	}
	return root, nil
}

// child returns (creating it) the node one step from n along s.
func (n *pathNode) child(s pathSeg, fold bool) *pathNode {
	if s.any {
		if n.any == nil {
			n.any = &pathNode{}
		}
		return n.any
	}
	key := s.name
	if fold {
		key = string(appendFoldedName(nil, []byte(key)))
	}
	c := n.names[key]
	if c == nil {
		c = &pathNode{}
		if n.names == nil {
			n.names = map[string]*pathNode{}
		}
		n.names[key] = c
	}
	if s.index >= 0 {
		if n.index == nil {
			n.index = map[int64]*pathNode{}
		}
		n.index[s.index] = c
	}
	return c
}

// pathSeg is one step of a configured field.
type pathSeg struct {
	any   bool   // "#": every element of an array
	name  string // a member name, unescaped
	index int64  // the array index name stands for (digits), else -1
}

// parseRedactPath reads one configured field: member names separated by
// dots, "#" for every element of an array, a segment of digits for the
// element of that index (or the member of that name in an object), and a
// backslash making the next character literal ("a\.b" is the member
// "a.b"). The rest of GJSON's syntax (wildcards, queries, modifiers,
// pipes, multipaths, literals, JSON Lines) is refused: those characters
// must be escaped to be part of a name.
func parseRedactPath(p string) ([]pathSeg, error) {
	if !utf8.ValidString(p) {
		return nil, fmt.Errorf("not valid UTF-8")
	}
	var segs []pathSeg
	var cur strings.Builder
	escaped := false // cur holds an escaped character
	whole := func() error {
		s := cur.String()
		switch {
		case s == "" && !escaped:
			return fmt.Errorf("empty member name (no leading, trailing or double dots; GJSON's \"..\" for JSON Lines is not supported)")
		case s == "#" && !escaped:
			segs = append(segs, pathSeg{any: true, index: -1})
		default:
			segs = append(segs, pathSeg{name: s, index: arrayIndex(s, escaped)})
		}
		cur.Reset()
		escaped = false
		return nil
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch c {
		case '\\':
			if i+1 == len(p) {
				return nil, fmt.Errorf("ends with a lone \\ (escape the character after it)")
			}
			_, n := utf8.DecodeRuneInString(p[i+1:])
			cur.WriteString(p[i+1 : i+1+n])
			escaped = true
			i += n
			continue
		case '.':
			if err := whole(); err != nil {
				return nil, err
			}
			continue
		case '*', '?':
			return nil, fmt.Errorf("wildcards (* ?) are not supported: name the members, or write \\%c for a literal %c", c, c)
		case '|':
			return nil, fmt.Errorf("pipes (|) are not supported: write \\| for a literal |")
		case '@':
			return nil, fmt.Errorf("modifiers (@) are not supported: write \\@ for a literal @")
		case '#':
			// Only a whole segment; "#(" starts a GJSON query.
			atStart := cur.Len() == 0 && !escaped
			if atStart && (i+1 == len(p) || p[i+1] == '.') {
				cur.WriteByte('#')
				continue
			}
			return nil, fmt.Errorf("# is supported only as a whole segment, every element of an array (queries #(…) are not): write \\# for a literal #")
		case '!', '[', ']', '{', '}', '(', ')':
			return nil, fmt.Errorf("%c is GJSON syntax (literals, multipaths, queries) that is not supported: write \\%c for a literal %c", c, c, c)
		}
		cur.WriteByte(c)
	}
	if err := whole(); err != nil {
		return nil, err
	}
	return segs, nil
}

// arrayIndex returns the index a segment stands for: decimal digits
// without a leading zero (or "0"), none escaped; else -1.
func arrayIndex(s string, escaped bool) int64 {
	if escaped || s == "" || len(s) > 1 && s[0] == '0' {
		return -1
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return -1
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// appendFoldedName appends name folded so that two names fold alike if
// and only if strings.EqualFold says they are equal: each character
// becomes the smallest of its Unicode simple case folding orbit (ASCII
// letters their upper case, "K" for k, K and the Kelvin sign). This is the
// equality Go's encoding/json uses to match struct fields.
func appendFoldedName(dst, name []byte) []byte {
	for i := 0; i < len(name); {
		c := name[i]
		if c < utf8.RuneSelf {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			dst = append(dst, c)
			i++
			continue
		}
		r, n := utf8.DecodeRune(name[i:])
		dst = utf8.AppendRune(dst, foldRune(r))
		i += n
	}
	return dst
}

// foldRune returns the smallest rune of r's simple case folding orbit.
func foldRune(r rune) rune {
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}
