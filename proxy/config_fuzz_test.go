package proxy

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// FuzzConfigFile feeds arbitrary bytes to LoadConfigFile (a proxy reads its
// file again on every reload, perhaps half-written): no input panics or
// hangs; an error names the file; what loads gives the same Config when
// loaded again, has no negative limit, and Validate does not panic on it.
// One file per process, rewritten for each input.
func FuzzConfigFile(f *testing.F) {
	for _, s := range []string{
		"upstream: a:1, b:2\nlisten: 127.0.0.1:0\n",
		"upstream: [a:1]\nlisten: :9092\nmax.connections: 10\nproxy.memory.max.bytes: 1048576\n",
		"upstream:\n  - a:1\nlisten: :0\ntls:\n  client:\n    enabled: true\n    cert: c\n    key: k\n",
		"upstream: a:1\nlisten: :0\nsni:\n  bootstrap.host: b.example\n  broker.host.pattern: broker-$(nodeId).example\n",
		"upstream: a:1\nlisten: :0\ninterceptors:\n  - name: large-message\n    config:\n      large.message.payload.store.url: mem://x\n",
		"upstream: a:1\nlisten: :0\ninterceptors:\n",
		"upstream: a:1\nlisten: :0\nupstream.sasl.mechanism: PLAIN\nupstream.sasl.username: \"u\"\nupstream.sasl.password: 012345\n",
		"a: &a [*a]\n", "x: !!binary AAAA\n", "connections.max.idle.ms: -1\nupstream.connect.timeout.ms: -1\n",
	} {
		f.Add([]byte(s))
	}
	path := filepath.Join(f.TempDir(), "proxy.yaml")
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 16<<10 {
			return
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := LoadConfigFile(path)
		if err != nil {
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		again, err := LoadConfigFile(path)
		if err != nil || !reflect.DeepEqual(c, again) {
			t.Fatalf("loaded twice: %+v, then %+v, %v", c, again, err)
		}
		if c.BrokerPortBase < 0 || c.MaxRequestBytes < 0 || c.MaxResponseBytes < 0 || c.DialTimeout < 0 ||
			c.ShutdownTimeout < 0 || c.ReconnectBackoff < 0 || c.ReconnectBackoffMax < 0 || c.MaxConnections < 0 ||
			c.MaxConnectionsPerIP < 0 || c.MaxInFlight < 0 || c.MemoryMax < 0 || c.BatchDecompressedMax < 0 ||
			c.RequestDecompressedMax < 0 || c.MetricsMaxTopics < 0 || c.InterceptorTimeout < 0 || c.TopicConfigRefresh < 0 ||
			c.ConnectTimeout < -1 || c.IdleTimeout < -1 {
			t.Fatalf("a negative limit loaded: %+v", c)
		}
		for _, s := range c.Interceptors {
			if s.Name == "" {
				t.Fatalf("an interceptor without a name loaded: %+v", c.Interceptors)
			}
		}
		if c.UpstreamSASL.TokenFile == "" {
			_ = c.Validate()
		}
	})
}
