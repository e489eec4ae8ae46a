// Package props loads Kafka-style client properties for the ferry command:
// a Java .properties file (--config) followed by repeated "-X key=value"
// overrides, merged with koanf. Dotted keys such as "bootstrap.servers" or
// "large.message.payload.store.url" stay flat: the koanf delimiter is a
// control character that never appears in a property name.
package props

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/v2"
	"github.com/magiconair/properties"
)

// delim is koanf's key-path delimiter. It is not "." so that Kafka's dotted
// property names are kept as single flat keys.
const delim = "\x1f"

// Load reads the properties file at file (none when file is "") and then
// applies each override, "key=value", in order; a later value wins. Keys and
// values are trimmed of surrounding blanks (as Java's Properties does for
// keys); "${...}" is not expanded, so values reach the client verbatim.
//
// Errors: a missing or unreadable file, a malformed file, or an override
// without "=" or with an empty key. Each names the file or the override.
func Load(file string, overrides []string) (map[string]string, error) {
	k := koanf.New(delim)
	if file != "" {
		m, err := loadFile(file)
		if err != nil {
			return nil, err
		}
		if err := k.Load(confmap.Provider(m, ""), nil); err != nil {
			return nil, fmt.Errorf("config file %s: %w", file, err)
		}
	}
	if len(overrides) > 0 {
		m := make(map[string]any, len(overrides))
		for _, o := range overrides {
			key, value, err := ParseOverride(o)
			if err != nil {
				return nil, err
			}
			m[key] = value
		}
		if err := k.Load(confmap.Provider(m, ""), nil); err != nil {
			return nil, fmt.Errorf("-X overrides: %w", err)
		}
	}
	out := make(map[string]string, len(k.Keys()))
	for key, v := range k.All() {
		if s, ok := v.(string); ok {
			out[key] = s
		} else {
			out[key] = fmt.Sprint(v)
		}
	}
	return out, nil
}

// ParseOverride splits one -X argument, "key=value", into its trimmed key
// and its value (trimmed too; a value may itself contain "=").
func ParseOverride(s string) (key, value string, err error) {
	key, value, ok := strings.Cut(s, "=")
	key = strings.TrimSpace(key)
	if !ok {
		return "", "", fmt.Errorf("-X %q: expected key=value", s)
	}
	if key == "" {
		return "", "", fmt.Errorf("-X %q: the key before '=' is empty", s)
	}
	return key, strings.TrimSpace(value), nil
}

func loadFile(file string) (map[string]any, error) {
	if _, err := os.Stat(file); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("config file %s does not exist", file)
		}
		return nil, fmt.Errorf("config file %s: %w", file, err)
	}
	l := &properties.Loader{Encoding: properties.UTF8, DisableExpansion: true}
	p, err := l.LoadFile(file)
	if err != nil {
		return nil, fmt.Errorf("config file %s: %w", file, err)
	}
	m := make(map[string]any, p.Len())
	for key, v := range p.Map() {
		m[strings.TrimSpace(key)] = strings.TrimSpace(v)
	}
	return m, nil
}

// Keys returns the keys of m, sorted; handy for logging what was loaded.
func Keys(m map[string]string) []string {
	return slices.Sorted(maps.Keys(m))
}
