package proxy

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferrykit/ferry/interceptor"
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

// A misspelled key in an interceptor's config map of the YAML file is
// refused when the chain is built (at start and on reload), naming the key
// meant: validate.json.schema.fle left validate-json without its schema
// (every record valid) and large.message.treshold.bytes large-message at
// its default threshold, without a word. A key in an interceptor's
// namespace that none reads is refused too, listing that namespace's keys.
func TestInterceptorConfigKeyTypoRefused(t *testing.T) {
	schema := filepath.Join(t.TempDir(), "schema.json")
	if err := os.WriteFile(schema, []byte(`{"type":"object","required":["id"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, key, want string }{
		{"validate-json", "validate.json.schema.fle: " + schema, `unknown key "validate.json.schema.fle" (did you mean validate.json.schema.file?)`},
		{"large-message", "large.message.treshold.bytes: 1000", `unknown key "large.message.treshold.bytes" (did you mean large.message.threshold.bytes?)`},
		{"redact", "redact.field.names: ssn", `unknown key "redact.field.names" (the redact.* keys are`},
		{"validate-json", "validate.json.schema.file: " + schema, ""},
	} {
		path := filepath.Join(t.TempDir(), "proxy.yaml")
		body := "upstream: 127.0.0.1:9092\nlisten: 127.0.0.1:0\ninterceptors:\n  - name: " + c.name + "\n    config:\n      topic.pattern: orders\n      " + c.key + "\n"
		if c.name == "large-message" {
			body += "      large.message.payload.store.url: mem://typo\n"
		}
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := LoadConfigFile(path)
		if err != nil {
			t.Fatal(err)
		}
		ch, err := interceptor.Build(context.Background(), cfg.Interceptors, interceptor.Options{})
		if ch != nil {
			ch.Close()
		}
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.key, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "interceptors[0]")):
			t.Errorf("%s: %v, want an error at interceptors[0] saying %s", c.key, err, c.want)
		}
	}
}

// A Kafka client.properties file given to the proxy as its --config says
// that the proxy's file is YAML, not a YAML parser's "cannot unmarshal
// !!str" (found by a new-user helper).
func TestLoadConfigFilePropertiesSaysYAML(t *testing.T) {
	path := filepath.Join(t.TempDir(), "client.properties")
	if err := os.WriteFile(path, []byte("# client\nbootstrap.servers=localhost:9092\nsecurity.protocol=PLAINTEXT\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadConfigFile(path)
	if err == nil || !strings.Contains(err.Error(), "is not YAML: it reads as Kafka-style properties") {
		t.Fatalf("LoadConfigFile(client.properties): %v, want an error saying the file is properties, not YAML", err)
	}
}
