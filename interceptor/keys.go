package interceptor

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ferrykit/ferry/internal/suggest"
	"github.com/ferrykit/ferry/largemessage"
)

// Declared configuration keys. An interceptor whose factory declares the
// keys it reads (RegisterKeys) gets a configuration checked by New: a key
// that no declaring interceptor reads is refused, naming the keys it is
// near, so that a misspelled key in the proxy's YAML file
// (validate.json.schema.fle) cannot leave a default in force (no schema:
// every record valid). The keys are checked against the union of every
// declaring interceptor's keys, not the named one's alone: `ferry proxy
// --interceptors a,b -X ...` gives each interceptor the same properties.
// Interceptors that declare nothing (an application's own, registered
// with Register alone) are not checked.
var (
	declared      = map[string]bool{}
	knownKeys     []string
	knownPrefixes []string
	namespaces    []string
)

// KeySet is what an interceptor declares of its configuration.
type KeySet struct {
	// Keys are the keys it reads.
	Keys []string
	// Prefixes: it reads any key under these too, by prefix
	// ("wasm.config.": the module's own settings).
	Prefixes []string
	// Namespaces are key prefixes it owns ("redact."): a key under one
	// that is not declared is a misspelling, not another program's
	// setting (see CheckKey).
	Namespaces []string
}

// RegisterKeys declares the configuration keys of the interceptor
// registered as name. Call it from an init function, beside Register.
func RegisterKeys(name string, ks KeySet) {
	regMu.Lock()
	defer regMu.Unlock()
	declared[name] = true
	add := func(to *[]string, from []string) {
		for _, k := range from {
			if !slices.Contains(*to, k) {
				*to = append(*to, k)
			}
		}
	}
	add(&knownKeys, ks.Keys)
	add(&knownPrefixes, ks.Prefixes)
	add(&namespaces, ks.Namespaces)
}

// KnownKeys returns the keys and key prefixes declared by RegisterKeys,
// every interceptor's together.
func KnownKeys() (keys, prefixes []string) {
	regMu.RLock()
	defer regMu.RUnlock()
	return slices.Clone(knownKeys), slices.Clone(knownPrefixes)
}

// checkKeys refuses a key of config that no declaring interceptor reads,
// when name declared its keys; regMu is read-held.
func checkKeys(name string, config map[string]string) error {
	if !declared[name] {
		return nil
	}
	keys := make([]string, 0, len(config))
	for k := range config {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if _, err := checkKey(k); err != nil {
			return err
		}
	}
	return nil
}

// CheckKey returns nil when k is a key an interceptor declared
// (RegisterKeys), or lies under a declared prefix; else an error naming k
// and the declared keys it is near, or those of its namespace. ours
// reports whether k is near a declared key or in a declared key's
// namespace ("validate.json.schema.path" beside validate.json.schema.file):
// a misspelling, where another key may be a Kafka client's setting meant
// for no interceptor.
func CheckKey(k string) (ours bool, err error) {
	regMu.RLock()
	defer regMu.RUnlock()
	return checkKey(k)
}

func checkKey(k string) (ours bool, err error) {
	if slices.Contains(knownKeys, k) || slices.ContainsFunc(knownPrefixes, func(p string) bool { return strings.HasPrefix(k, p) }) {
		return true, nil
	}
	if near := suggest.Nearest(k, knownKeys, false); len(near) > 0 {
		return true, fmt.Errorf("unknown key %q (did you mean %s?)", k, suggest.OrList(near))
	}
	for _, ns := range namespaces {
		if strings.HasPrefix(k, ns) {
			own := slices.DeleteFunc(slices.Clone(knownKeys), func(s string) bool { return !strings.HasPrefix(s, ns) })
			slices.Sort(own)
			return true, fmt.Errorf("unknown key %q (the %s* keys are %s)", k, ns, strings.Join(own, ", "))
		}
	}
	return false, fmt.Errorf("unknown key %q: no interceptor reads it", k)
}

// builtinKeys are the keys the built-ins read, with large-message's
// (largemessage.ParseConfig: the large.message.* keys, the serializer
// chains, the compression settings).
func builtinKeys() []string {
	return slices.Concat(Keys(), largemessage.Keys(), []string{
		"key.serializers", "value.serializers", "key.deserializers", "value.deserializers",
		largemessage.KeyMaxBlock, largemessage.KeyMaxPollInterval, largemessage.KeyCompressionType,
		"compression.gzip.level", "compression.lz4.level", "compression.zstd.level",
	})
}

func init() {
	for _, name := range []string{"large-message", "encrypt", "redact", "validate-json", "validate-schema"} {
		RegisterKeys(name, KeySet{Keys: builtinKeys(), Prefixes: []string{KeyValidateSchemaRulePrefix},
			Namespaces: []string{"large.message.", "encrypt.", "redact.", "validate.json.", "validate.schema."}})
	}
}
