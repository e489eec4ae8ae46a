// Package otlp builds the OpenTelemetry tracer provider of the proxy (and
// of programs that want the same): OTLP over HTTP, batched. It is apart
// from package observe so that the library links the OpenTelemetry API
// only, not the SDK and exporter, unless a program asks for them.
package otlp

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferrykit/ferry/observe"
)

// SetupTracing returns, for cfg (tracing.enabled, tracing.otlp.endpoint), a tracer provider exporting to an OTLP/HTTP
// receiver in batches, and its shutdown (which flushes what is left; call it
// before the process exits), or a nil provider and a no-op shutdown when
// cfg.Enabled is false. The sampler follows OTEL_TRACES_SAMPLER (default:
// parent-based, always on). Errors: an endpoint that is not a URL.
func SetupTracing(ctx context.Context, cfg observe.TracingConfig) (trace.TracerProvider, func(context.Context) error, error) {
	noop := func(context.Context) error { return nil }
	if !cfg.Enabled {
		return nil, noop, nil
	}
	var opts []otlptracehttp.Option
	if cfg.Endpoint != "" {
		u, err := url.Parse(cfg.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, noop, fmt.Errorf("%s %q: want an http:// or https:// URL, e.g. http://collector:4318/v1/traces", observe.KeyTracingEndpoint, cfg.Endpoint)
		}
		opts = append(opts, otlptracehttp.WithEndpointURL(cfg.Endpoint))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, noop, fmt.Errorf("%s %q: %w", observe.KeyTracingEndpoint, cfg.Endpoint, err)
	}
	name := cfg.ServiceName
	if name == "" {
		name = "ferry"
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(name)))
	if err != nil {
		res = resource.Default()
	}
	// OTEL_SERVICE_NAME, when set, wins over the default name.
	if envRes, err := resource.New(ctx, resource.WithFromEnv()); err == nil {
		if merged, err := resource.Merge(res, envRes); err == nil {
			res = merged
		}
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(2*time.Second)), sdktrace.WithResource(res))
	return tp, tp.Shutdown, nil
}
