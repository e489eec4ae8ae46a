package cli

import (
	"fmt"
	"path/filepath"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
)

// headerFileName is the record header in which ferry produce sends the
// base name of the file a record's value came from ("big.iso"); ferry
// consume --out DIR writes the value to DIR/NAME. Standard input sends
// none. It is a Ferry header that other consumers may ignore.
const headerFileName = "ferry.file.name"

// maxFileNameBytes is the longest name used as it is (most file systems'
// limit); a longer one is not used.
const maxFileNameBytes = 255

// fileNameHeaders is the ferry.file.name header for the file at path.
func fileNameHeaders(path string) []kgo.RecordHeader {
	return []kgo.RecordHeader{{Key: headerFileName, Value: []byte(filepath.Base(path))}}
}

// outputName is the name under --out of record r's value: the file name
// it was produced with (ferry.file.name) if that is a plain file name, and
// TOPIC-PARTITION-OFFSET otherwise (no header: standard input, another
// producer; or a name that is not safe to use). A name already written by
// an earlier record of this run (taken) gets TOPIC-PARTITION-OFFSET- in
// front, so that no record's file replaces another's (and, should that be
// taken too, ~2, ~3, ... after it).
//
// The header comes from whoever produced the record, so the name is used
// only when it cannot leave DIR or hide in it: no directory part ('/' or
// '\'), no leading '.', no control characters, valid UTF-8, at most 255
// bytes.
func outputName(r *kgo.Record, taken map[string]bool) string {
	coords := fmt.Sprintf("%s-%d-%d", r.Topic, r.Partition, r.Offset)
	name := coords
	for _, h := range r.Headers {
		if h.Key == headerFileName && plainFileName(string(h.Value)) {
			name = string(h.Value)
		}
	}
	if !taken[name] {
		return name
	}
	prefixed := coords + "-" + name
	if len(prefixed) > maxFileNameBytes {
		prefixed = coords
	}
	cand := prefixed
	for i := 2; taken[cand]; i++ {
		cand = fmt.Sprintf("%s~%d", prefixed, i)
	}
	return cand
}

// plainFileName reports whether name can be used as a file name in a
// directory without naming anything outside it or hidden in it.
func plainFileName(name string) bool {
	if name == "" || len(name) > maxFileNameBytes || !utf8.ValidString(name) ||
		strings.HasPrefix(name, ".") || strings.ContainsAny(name, `/\`) {
		return false
	}
	return !strings.ContainsFunc(name, unicode.IsControl)
}
