package interceptor

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// RedactCase is one value of the redact test corpus with the config the
// redact tests give it.
type RedactCase struct {
	Config map[string]string
	Value  []byte
}

// RedactCorpus returns every value the redact tests (redact_test.go,
// FuzzJSON's seeds and testdata/fuzz/FuzzJSON) redact, with its config:
// values redacted, refused, and kept. Ports of redact (the WebAssembly
// example) must answer alike on each.
func RedactCorpus(t testing.TB) []RedactCase {
	t.Helper()
	var cs []RedactCase
	add := func(cfg map[string]string, v string) { cs = append(cs, RedactCase{Config: cfg, Value: []byte(v)}) }
	for _, c := range redactFoldCases {
		add(redactFoldConfig, c.in)
	}
	for _, v := range redactFoldRefused {
		add(redactFoldConfig, v)
	}
	for _, c := range redactExactCases {
		add(redactExactConfig, c.in)
	}
	for _, v := range redactExactRefused {
		add(redactExactConfig, v)
	}
	for _, c := range redactPathCases {
		add(map[string]string{KeyRedactFields: c.fields}, c.in)
	}
	add(map[string]string{KeyRedactFields: "a", KeyRedactMask: `<"x">`}, `{"a":1}`)
	for _, c := range redactInvalidCases {
		add(redactInvalidConfig, c.in)
	}
	for _, v := range redactValidCases {
		add(redactInvalidConfig, v)
	}
	var names []string
	for i := range 40 {
		names = append(names, fmt.Sprintf(`"n%d":%d`, i, i))
	}
	obj := "{" + strings.Join(names, ",") + "}"
	many := map[string]string{KeyRedactFields: "N39,x.n0"}
	add(many, `{"x":`+obj+`,"y":`+obj+`}`)
	add(many, `{"x":{`+strings.Join(names, ",")+`,"N0":1}}`)
	add(map[string]string{KeyRedactFields: "cards.#.number"}, string(cardsValue(1000)))
	fuzz := map[string]string{KeyRedactFields: fuzzJSONFields, KeyJSONMaxDepth: "64"}
	exact := map[string]string{KeyRedactFields: fuzzJSONFields, KeyJSONMaxDepth: "64", KeyRedactCaseSensitive: "true"}
	seeds := append([]string(nil), fuzzJSONSeeds...)
	files, err := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzJSON", "*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		seeds = append(seeds, string(readFuzzBytes(t, f)))
	}
	for _, v := range seeds {
		add(fuzz, v)
		add(exact, v)
	}
	return cs
}

// readFuzzBytes reads a corpus file of go test's fuzzing ("go test fuzz
// v1" and one []byte("...") line).
func readFuzzBytes(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2 || lines[0] != "go test fuzz v1" || !strings.HasPrefix(lines[1], "[]byte(") || !strings.HasSuffix(lines[1], ")") {
		t.Fatalf("%s: not a one-[]byte fuzz corpus file", path)
	}
	s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")"))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return []byte(s)
}
