package proxy

import (
	"context"
	"time"

	"github.com/ferrykit/ferry/observe"
	"github.com/ferrykit/ferry/observe/otlp"
	"github.com/prometheus/client_golang/prometheus"
)

// observability is what the interceptors report to: the per-topic metrics
// (registered on the proxy's /metrics) and the tracer (nil when
// tracing.enabled is off and no TracerProvider was given).
type observability struct {
	metrics  *observe.Metrics
	tracer   *observe.Tracer
	shutdown func(context.Context) error
}

// newObservability makes the per-topic metrics on reg and, when
// cfg.Tracing.Enabled, the OTLP exporter. Errors: metrics.topics.max
// negative, a tracing.otlp.endpoint that is not a URL.
func newObservability(cfg Config, reg prometheus.Registerer) (*observability, error) {
	m, err := observe.NewMetrics(reg, observe.MetricsOptions{MaxTopics: cfg.MetricsMaxTopics})
	if err != nil {
		return nil, err
	}
	o := &observability{metrics: m, shutdown: func(context.Context) error { return nil }}
	tp := cfg.TracerProvider
	if tp == nil {
		tc := cfg.Tracing
		if tc.ServiceName == "" {
			tc.ServiceName = "ferry-proxy"
		}
		if tp, o.shutdown, err = otlp.SetupTracing(context.Background(), tc); err != nil {
			return nil, err
		}
	}
	o.tracer = observe.NewTracer(tp, "proxy")
	return o, nil
}

// close flushes the spans not exported yet (within 5 s).
func (o *observability) close() {
	if o == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = o.shutdown(ctx)
}
