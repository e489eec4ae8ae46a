package observe

// Configuration keys of the proxy's YAML file (and its flags --tracing,
// --tracing-endpoint, --metrics-max-topics).
const (
	// KeyTracingEnabled turns tracing on (default false).
	KeyTracingEnabled = "tracing.enabled"
	// KeyTracingEndpoint is the OTLP/HTTP traces endpoint URL, e.g.
	// "http://collector:4318/v1/traces" (default: the standard
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT,
	// else http://localhost:4318/v1/traces).
	KeyTracingEndpoint = "tracing.otlp.endpoint"
	// KeyMetricsMaxTopics is MetricsOptions.MaxTopics.
	KeyMetricsMaxTopics = "metrics.topics.max"
)

// TracingConfig configures otlp.SetupTracing (package observe/otlp).
type TracingConfig struct {
	// Enabled turns tracing on (tracing.enabled, default false).
	Enabled bool
	// Endpoint is the OTLP/HTTP traces URL (tracing.otlp.endpoint); ""
	// leaves it to the standard OTEL_EXPORTER_OTLP_* environment
	// variables, which also set headers, TLS, compression and timeout.
	Endpoint string
	// ServiceName is the service.name resource attribute, unless
	// OTEL_SERVICE_NAME sets it.
	ServiceName string
}
