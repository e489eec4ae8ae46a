package proxy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A SASL password or user name that YAML reads as a number or a boolean
// (password: 012345 is the octal number 5349; 1e3 is 1000) would be sent
// changed; it is refused, asking for quotes, and the value is not shown.
func TestLoadConfigFileSASLSecretNotString(t *testing.T) {
	for _, v := range []string{"012345", "1e3", "0x1F", "true", "1_000"} {
		path := filepath.Join(t.TempDir(), "proxy.yaml")
		body := "upstream: 127.0.0.1:9092\nlisten: 127.0.0.1:0\nupstream.sasl.mechanism: PLAIN\nupstream.sasl.username: alice\nupstream.sasl.password: " + v + "\n"
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := LoadConfigFile(path)
		if err == nil {
			if cfg.UpstreamSASL.Password != v {
				t.Errorf("password: %s read as %q", v, cfg.UpstreamSASL.Password)
			}
			continue
		}
		if !strings.Contains(err.Error(), "upstream.sasl.password") || !strings.Contains(err.Error(), "quote") || strings.Contains(err.Error(), v) {
			t.Errorf("password: %s: error %q does not name the key and ask for quotes", v, err)
		}
	}
}
