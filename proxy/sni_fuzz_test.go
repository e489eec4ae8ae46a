package proxy

import (
	"strings"
	"testing"
)

// FuzzSNIRoute: a server name routes to a broker only when it is exactly
// the host the pattern makes for that node id (case and a trailing dot
// aside), and to the bootstrap only when it is the bootstrap host.
func FuzzSNIRoute(f *testing.F) {
	r, err := newSNIRouter(SNIConfig{BootstrapHost: "bootstrap.kafka.example.com", BrokerHostPattern: "broker-$(nodeId).kafka.example.com"})
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"broker-0.kafka.example.com", "BROKER-7.kafka.example.com.", "broker-007.kafka.example.com",
		"broker-2147483648.kafka.example.com", "broker--1.kafka.example.com", "bootstrap.kafka.example.com", "broker-\u0661.kafka.example.com"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		id, err := r.route(name)
		if err != nil {
			return
		}
		want := strings.ToLower(strings.TrimSuffix(name, "."))
		if id == -1 {
			if want != r.bootstrap {
				t.Fatalf("%q routes to the bootstrap", name)
			}
			return
		}
		if id < 0 || r.brokerHost(id) != want {
			t.Fatalf("%q routes to node %d, whose host is %q", name, id, r.brokerHost(id))
		}
	})
}
