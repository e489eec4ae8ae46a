package proxy

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferrykit/ferry/observe"
)

// TestObservabilityConfig: metrics.topics.max up to its limit (1048576),
// tracing.enabled and tracing.otlp.endpoint from the YAML file; values
// past the limit, not booleans or not URLs are clear errors.
func TestObservabilityConfig(t *testing.T) {
	c, err := LoadConfigFile(writeYAML(t, `
upstream: k:9092
listen: 127.0.0.1:0
metrics.topics.max: 1048576
tracing:
  enabled: true
  otlp.endpoint: http://collector:4318/v1/traces
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.MetricsMaxTopics != 1<<20 || !c.Tracing.Enabled || c.Tracing.Endpoint != "http://collector:4318/v1/traces" {
		t.Fatalf("config: %d %+v", c.MetricsMaxTopics, c.Tracing)
	}
	for _, bad := range []struct{ yaml, want string }{
		{"metrics.topics.max: 1048577", "metrics.topics.max \"1048577\": want an integer 0..1048576"},
		{"metrics.topics.max: -1", "metrics.topics.max \"-1\""},
		{"tracing.enabled: maybe", "tracing.enabled \"maybe\": want true or false"},
	} {
		_, err := LoadConfigFile(writeYAML(t, "upstream: k:9092\n"+bad.yaml+"\n"))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v, want %q", bad.yaml, err, bad.want)
		}
	}

	// Tracing off: no tracer; on, an endpoint that is not a URL is refused.
	o, err := newObservability(Config{}, prometheus.NewRegistry())
	if err != nil || o.tracer != nil || o.metrics == nil {
		t.Fatalf("defaults: %+v, %v", o, err)
	}
	o.close()
	_, err = newObservability(Config{Tracing: observe.TracingConfig{Enabled: true, Endpoint: "collector:4318"}}, prometheus.NewRegistry())
	if err == nil || !strings.Contains(err.Error(), observe.KeyTracingEndpoint) {
		t.Fatalf("bad endpoint: %v", err)
	}
	o, err = newObservability(Config{Tracing: observe.TracingConfig{Enabled: true, Endpoint: "http://127.0.0.1:1/v1/traces"}}, prometheus.NewRegistry())
	if err != nil || o.tracer == nil {
		t.Fatalf("tracing on: %+v, %v", o, err)
	}
	o.close() // nothing to flush: returns at once
}
