package proxy

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeYAML(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadConfigFile(t *testing.T) {
	// Nested and dotted keys mix; upstream as a list.
	c, err := LoadConfigFile(writeYAML(t, `
upstream: [kafka-1:9093, "kafka-2:9093"]
listen: 0.0.0.0:19092
advertised.host: proxy.example.com
broker:
  port.base: 19100
socket.request.max.bytes: 1048576
dial.timeout.ms: 2500
shutdown.timeout.ms: 7000
admin.listen: 127.0.0.1:9644
tls:
  client: {enabled: true, cert: c.pem, key: k.pem, ca: ca.pem, client.auth: required}
  upstream:
    enabled: true
    server.name: kafka.internal
    insecure.skip.verify: false
`))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.Upstream, ",") != "kafka-1:9093,kafka-2:9093" || c.Listen != "0.0.0.0:19092" ||
		c.AdvertisedHost != "proxy.example.com" || c.BrokerPortBase != 19100 || c.MaxRequestBytes != 1048576 ||
		c.DialTimeout != 2500*time.Millisecond || c.ShutdownTimeout != 7*time.Second || c.AdminListen != "127.0.0.1:9644" {
		t.Fatalf("config = %+v", c)
	}
	if !c.ClientTLS.Enabled || c.ClientTLS.Cert != "c.pem" || c.ClientTLS.ClientAuth != "required" ||
		!c.UpstreamTLS.Enabled || c.UpstreamTLS.ServerName != "kafka.internal" {
		t.Fatalf("tls = %+v / %+v", c.ClientTLS, c.UpstreamTLS)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}

	// upstream as a comma-separated string.
	c, err = LoadConfigFile(writeYAML(t, "upstream: a:1, b:2\nlisten: 127.0.0.1:0\n"))
	if err != nil || strings.Join(c.Upstream, ",") != "a:1,b:2" {
		t.Fatalf("upstream string: %v %v", c.Upstream, err)
	}
}

func TestLoadConfigFileErrors(t *testing.T) {
	for name, tc := range map[string]struct{ body, want string }{
		"unknown key":       {"upstream: a:1\nlisten.port: 3\n", `unknown key "listen.port" (known: upstream, `},
		"misspelled key":    {"upstream: a:1\nmax.conections: 3\n", `unknown key "max.conections" (did you mean max.connections?)`},
		"not a number":      {"broker.port.base: many\n", "broker.port.base"},
		"port base range":   {"broker.port.base: 70000\n", "broker.port.base"},
		"not a bool":        {"tls.client.enabled: perhaps\n", "tls.client.enabled"},
		"malformed YAML":    {"upstream: [a:1\n", "config file"},
		"upstream is a map": {"upstream: {a: 1}\n", "upstream"},
	} {
		t.Run(name, func(t *testing.T) {
			path := writeYAML(t, tc.body)
			_, err := LoadConfigFile(path)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("err = %v, want one naming %q and the file", err, tc.want)
			}
		})
	}
	if _, err := LoadConfigFile(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Fatal("a missing file gave no error")
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{Upstream: []string{"127.0.0.1:9092"}, Listen: "127.0.0.1:19092"}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Config){
		"no upstream":               func(c *Config) { c.Upstream = nil },
		"upstream without port":     func(c *Config) { c.Upstream = []string{"kafka"} },
		"no listen":                 func(c *Config) { c.Listen = "" },
		"listen without port":       func(c *Config) { c.Listen = "localhost" },
		"client TLS without key":    func(c *Config) { c.ClientTLS = TLSConfig{Enabled: true, Cert: "c.pem"} },
		"bad client.auth":           func(c *Config) { c.ClientTLS.ClientAuth = "always" },
		"upstream cert without key": func(c *Config) { c.UpstreamTLS = TLSConfig{Enabled: true, Cert: "c.pem"} },
		"SASL GSSAPI":               func(c *Config) { c.UpstreamSASL = SASLConfig{Mechanism: "GSSAPI", Username: "u"} },
		"SASL PLAIN without user":   func(c *Config) { c.UpstreamSASL = SASLConfig{Mechanism: "PLAIN"} },
		"OAUTHBEARER without token": func(c *Config) { c.UpstreamSASL = SASLConfig{Mechanism: "OAUTHBEARER"} },
		"OAUTHBEARER missing file":  func(c *Config) { c.UpstreamSASL = SASLConfig{Mechanism: "OAUTHBEARER", TokenFile: "/nonexistent/t"} },
	} {
		c := ok
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("eyJ.token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, sc := range []SASLConfig{
		{Mechanism: "scram-sha-512", Username: "alice", Password: "p"},
		{Mechanism: "OAUTHBEARER", TokenFile: tok},
	} {
		c := ok
		c.UpstreamSASL = sc
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", sc, err)
		}
	}
	// New reports unreadable TLS files.
	c := ok
	c.ClientTLS = TLSConfig{Enabled: true, Cert: "/nonexistent/c.pem", Key: "/nonexistent/k.pem"}
	if _, err := New(c); err == nil || !strings.Contains(err.Error(), "client-side TLS") {
		t.Fatalf("New with missing cert files: %v", err)
	}
}

// TestPprofOnlyWhenEnabled: /debug/pprof/ is served only with
// admin.pprof.enabled, and then serves a real profile.
func TestPprofOnlyWhenEnabled(t *testing.T) {
	for _, on := range []bool{false, true} {
		s, err := New(Config{Upstream: []string{"127.0.0.1:9"}, Listen: "127.0.0.1:0", Pprof: on})
		if err != nil {
			t.Fatal(err)
		}
		for path, want := range map[string]string{
			"/debug/pprof/":                  "goroutine",
			"/debug/pprof/heap?debug=1":      "heap profile",
			"/debug/pprof/goroutine?debug=1": "goroutine profile",
		} {
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
			if !on {
				if rec.Code != http.StatusNotFound {
					t.Errorf("pprof off: GET %s = %d, want 404", path, rec.Code)
				}
				continue
			}
			if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), want) {
				t.Errorf("pprof on: GET %s = %d, body without %q: %.200s", path, rec.Code, want, rec.Body.String())
			}
		}
	}
	c, err := LoadConfigFile(writeYAML(t, "upstream: [127.0.0.1:9092]\nadmin.listen: 127.0.0.1:0\nadmin.pprof.enabled: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Pprof {
		t.Error("admin.pprof.enabled: true did not set Pprof")
	}
}
