package cli

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// proxyConfigWith is the configuration ferry proxy builds from -X
// overrides, an optional config file and --interceptors.
func proxyConfigWith(t *testing.T, overrides []string, configFile string, interceptors ...string) (cfgErr error, maxConns, perIP int, ic map[string]string) {
	t.Helper()
	a := &app{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard, overrides: overrides}
	cmd := a.proxyCommand()
	if err := cmd.Flags().Set("upstream", "127.0.0.1:9092"); err != nil {
		t.Fatal(err)
	}
	if len(interceptors) > 0 {
		if err := cmd.Flags().Set("interceptors", strings.Join(interceptors, ",")); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := a.proxyConfig(cmd, configFile, proxyFlags{upstream: "127.0.0.1:9092", listen: "127.0.0.1:0", interceptors: interceptors})
	if err != nil {
		return err, 0, 0, nil
	}
	if len(cfg.Interceptors) > 0 {
		ic = cfg.Interceptors[0].Config
	}
	return nil, cfg.MaxConnections, cfg.MaxConnectionsPerIP, ic
}

// Every -X key of ferry proxy is checked and applied, with or without
// --interceptors: the proxy's own keys override the config file, a
// misspelled key is a usage error naming the nearest key, an interceptor
// key without --interceptors is an error instead of being ignored.
func TestProxyProperties(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "proxy.yaml")
	if err := os.WriteFile(file, []byte("upstream: 127.0.0.1:9092\nmax.connections: 500\nmax.connections.per.ip: 50\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, ics := range [][]string{nil, {"redact"}} {
		err, maxConns, perIP, _ := proxyConfigWith(t, []string{"max.connections=10000"}, "", ics...)
		if err != nil || maxConns != 10000 {
			t.Fatalf("-X max.connections=10000 (interceptors %v): err %v, max.connections %d", ics, err, maxConns)
		}
		err, maxConns, perIP, _ = proxyConfigWith(t, []string{"max.connections=10000"}, file, ics...)
		if err != nil || maxConns != 10000 || perIP != 50 {
			t.Fatalf("-X over --config (interceptors %v): err %v, max.connections %d, per ip %d", ics, err, maxConns, perIP)
		}
		for _, tc := range []struct{ x, want string }{
			{"max.conections=10000", "unknown property max.conections (did you mean max.connections?)"},
			{"max.connection.per.ip=10", "unknown property max.connection.per.ip (did you mean max.connections.per.ip?)"},
			{"connections.first.request.timout.ms=5", "did you mean connections.first.request.timeout.ms?"},
			{"max.connections=lots", `max.connections "lots": want an integer`},
			{"interceptors=redact", "--interceptors"},
		} {
			err, _, _, _ := proxyConfigWith(t, []string{tc.x}, "", ics...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("-X %s (interceptors %v): %v, want an error containing %q", tc.x, ics, err, tc.want)
			}
			if _, ok := err.(*usageError); err != nil && !ok {
				t.Errorf("-X %s: %T, want a usage error", tc.x, err)
			}
		}
	}
	// Interceptor keys go to the interceptors --interceptors names, and
	// only there; without it they are refused, not silently dropped.
	err, _, _, ic := proxyConfigWith(t, []string{"redact.fields=email", "max.connections=7"}, "", "redact")
	if err != nil || ic["redact.fields"] != "email" || ic["max.connections"] != "" {
		t.Fatalf("redact.fields with --interceptors: err %v, interceptor config %v", err, ic)
	}
	if err, _, _, _ := proxyConfigWith(t, []string{"redact.fields=email"}, file); err == nil || !strings.Contains(err.Error(), "--interceptors") {
		t.Fatalf("an interceptor key without --interceptors: %v, want an error", err)
	}
	// validate-schema's rules reach it; a key in its namespace that it does
	// not read (a misspelled rule prefix) is refused.
	err, _, _, ic = proxyConfigWith(t, []string{"validate.schema.rule.positive=value.id > 0"}, "", "validate-schema")
	if err != nil || ic["validate.schema.rule.positive"] != "value.id > 0" {
		t.Fatalf("a rule key: err %v, interceptor config %v", err, ic)
	}
	if err, _, _, _ := proxyConfigWith(t, []string{"validate.schema.rulez.positive=true"}, "", "validate-schema"); err == nil || !strings.Contains(err.Error(), "unknown property validate.schema.rulez.positive") {
		t.Fatalf("a misspelled rule prefix: %v", err)
	}
	// A Kafka client key the proxy has no use for is passed over, as
	// produce and consume do.
	if err, _, _, _ := proxyConfigWith(t, []string{"linger.ms=5"}, ""); err != nil {
		t.Fatalf("linger.ms: %v", err)
	}
}

// The command itself: a misspelled -X key stops ferry proxy before it
// listens (exit 2, one line naming the nearest key), without --interceptors.
func TestProxyMisspelledKeyWithoutInterceptors(t *testing.T) {
	r := run(t, nil, "proxy", "--upstream", "127.0.0.1:1", "--listen", "127.0.0.1:0", "-X", "max.conections=10000")
	if r.code != ExitUsage {
		t.Errorf("exit %d", r.code)
	}
	oneErrorLine(t, r, "unknown property max.conections (did you mean max.connections?)")
}
