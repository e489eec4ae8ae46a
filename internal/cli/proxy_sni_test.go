package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A proxy config with sni.* that cannot work is a usage error (exit 2)
// naming the key, before anything listens.
func TestProxyCommandSNIConfigErrors(t *testing.T) {
	for name, tc := range map[string]struct{ yaml, want string }{
		"no TLS": {"sni.bootstrap.host: bootstrap.kafka.test\nsni.broker.host.pattern: broker-$(nodeId).kafka.test\n",
			"tls.client.enabled"},
		"no node id": {"tls.client: {enabled: true, cert: c.pem, key: k.pem}\nsni.bootstrap.host: bootstrap.kafka.test\n" +
			"sni.broker.host.pattern: broker.kafka.test\n", "must contain $(nodeId)"},
		"no bootstrap host": {"tls.client: {enabled: true, cert: c.pem, key: k.pem}\nsni.broker.host.pattern: b-$(nodeId).kafka.test\n",
			"sni.bootstrap.host"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := filepath.Join(t.TempDir(), "proxy.yaml")
			if err := os.WriteFile(cfg, []byte("upstream: [127.0.0.1:9092]\nlisten: 127.0.0.1:0\n"+tc.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			r := run(t, nil, "proxy", "--config", cfg)
			if r.code != ExitUsage || !strings.Contains(r.stderr, "ferry: ") || !strings.Contains(r.stderr, tc.want) {
				t.Fatalf("exit %d, stderr %q; want exit 2 naming %q", r.code, r.stderr, tc.want)
			}
		})
	}
}
