package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"

	"github.com/twmb/franz-go/pkg/sasl"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/internal/kafkaconf"
	"github.com/ferrykit/ferry/internal/suggest"
	"github.com/ferrykit/ferry/observe"
	"go.opentelemetry.io/otel/trace"
)

// Config is a proxy's configuration. The YAML file keys (LoadConfigFile) are
// given with each field; docs/PROXY.md has the full table.
type Config struct {
	// Upstream lists the seed brokers, host:port (`upstream`: a list or a
	// comma-separated string). Required.
	Upstream []string
	// Listen is the bootstrap listener, host:port (`listen`). Required.
	// Port 0 picks a free port, and then every broker listener gets a free
	// port too (for tests: not deterministic).
	Listen string
	// AdvertisedHost is the host clients are told for each broker
	// (`advertised.host`); default: Listen's host, or "localhost" when that
	// is a wildcard.
	AdvertisedHost string
	// BrokerPortBase: broker node id N listens on BrokerPortBase+N
	// (`broker.port.base`). 0 (default): the bootstrap port + 1 + N.
	BrokerPortBase int
	// MaxRequestBytes is socket.request.max.bytes (`socket.request.max.bytes`,
	// default 104857600): a request whose size prefix is larger closes the
	// connection without an answer, as the broker does.
	MaxRequestBytes int32
	// MaxResponseBytes bounds a response read from a broker
	// (`upstream.response.max.bytes`, default 1 GiB); larger closes the
	// connection.
	MaxResponseBytes int32
	// DialTimeout bounds an upstream connect and each TLS handshake
	// (`dial.timeout.ms`, default 10000).
	DialTimeout time.Duration
	// ConnectTimeout bounds, in total, how long a client connection waits
	// for its upstream broker (`upstream.connect.timeout.ms`, default
	// 30000, Kafka's request.timeout.ms): while the broker cannot be
	// reached (restarting, failing over), the proxy holds the client's
	// first request and dials again with backoff instead of closing the
	// connection, so clients see a slow answer, not an error. Past the
	// bound the connection is reset (TCP RST): every client takes that as
	// a retriable network error. A client that closes its side meanwhile
	// stops the dialling. Negative (-1): one attempt only.
	ConnectTimeout time.Duration
	// ReconnectBackoff and ReconnectBackoffMax are the wait between two
	// dials of one held connection (`upstream.reconnect.backoff.ms`,
	// default 50; `upstream.reconnect.backoff.max.ms`, default 1000):
	// doubled after each failure up to the max, with ±20% jitter, as
	// Kafka's reconnect.backoff.ms and reconnect.backoff.max.ms.
	ReconnectBackoff, ReconnectBackoffMax time.Duration
	// IdleTimeout closes a client connection with nothing in flight and no
	// frame read or written for that long (`connections.max.idle.ms`,
	// default 600000 as in Kafka; a partial frame does not count as
	// activity). Negative: never.
	IdleTimeout time.Duration
	// FirstRequestTimeout closes a client connection that has not sent one
	// whole request within that long of its accept, TLS handshake included
	// (`connections.first.request.timeout.ms`, default 10000; -1: never).
	// connections.max.idle.ms is for established clients: a socket that
	// sends a few bytes of a header and stalls would otherwise hold its
	// slot of max.connections for the whole idle timeout. Every client's
	// first request (ApiVersions, or SASL) is a few dozen bytes sent at
	// once; a first request held for an unreachable broker is the proxy's
	// wait, not the client's, and is not cut short by it. The metric is
	// ferry_proxy_errors_total{kind="first_request_timeout"}.
	FirstRequestTimeout time.Duration
	// ShutdownTimeout bounds the drain of in-flight requests on SIGTERM
	// (`shutdown.timeout.ms`, default 30000).
	ShutdownTimeout time.Duration
	// AdminListen is the HTTP address of /metrics and /healthz
	// (`admin.listen`); empty: none.
	AdminListen string
	// Pprof serves Go's runtime profiles (net/http/pprof) under
	// /debug/pprof/ on the admin listener (`admin.pprof.enabled`, default
	// false): CPU, heap, goroutine and mutex profiles of the running proxy.
	// Off by default because a profile exposes code paths and pauses the
	// process briefly; bind admin.listen to a private address when on.
	Pprof bool
	// ClientTLS is TLS towards clients (`tls.client.*`).
	ClientTLS TLSConfig
	// UpstreamTLS is TLS towards brokers (`tls.upstream.*`).
	UpstreamTLS TLSConfig
	// SNI serves the bootstrap and every broker on the one TLS listener
	// `listen`, routed by the server name of each client's handshake
	// (`sni.*`, sni.go); needs ClientTLS. Off by default: a listener per
	// broker.
	SNI SNIConfig
	// Interceptors run on produce requests and fetch responses of matching
	// topics, in order (`interceptors`: a list of {name, config}); the
	// built-ins are large-message, validate-json, redact and encrypt
	// (docs/INTERCEPTORS.md). Empty: every request passes opaque.
	Interceptors []interceptor.Spec
	// ReloadAllowUnprotected lets a reload remove or narrow an interceptor
	// that protects data (encrypt, redact, validate-*) or empty the chain
	// (`reload.allow.unprotected`, default false: such a reload is refused
	// and the running chain kept, reload_guard.go). Read from the
	// configuration being loaded, so it must be in the new file.
	ReloadAllowUnprotected bool
	// InterceptorTimeout is the time budget of one interceptor call
	// (`produce.request.interceptor.timeout.ms`, default 5000); a call over
	// it fails its partition (REQUEST_TIMED_OUT) instead of stalling.
	InterceptorTimeout time.Duration
	// TopicConfigRefresh is how long a topic's max.message.bytes, read from
	// the cluster for the interceptors' exact size check, is cached
	// (`topic.config.refresh.ms`, default 60000).
	TopicConfigRefresh time.Duration
	// MaxConnections bounds the client connections open at once
	// (`max.connections`); one more is closed at accept. Default:
	// DefaultMaxConnections, derived from the process's file-descriptor
	// limit (RLIMIT_NOFILE): as many connections as the descriptors allow,
	// each client connection holding two (its own and its upstream
	// connection's), with a tenth kept for listeners, payload store files
	// and the admin client. Kafka's broker has no cap by default
	// (Int.MaxValue) and meets the same descriptor limit; a proxy in front
	// of it must not turn away a fleet the broker would serve, and past
	// the descriptor limit accept and upstream dials fail with EMFILE for
	// everyone instead of one connection being refused cleanly.
	MaxConnections int
	// MaxConnectionsPerIP bounds the client connections from one address
	// (`max.connections.per.ip`, Kafka's key; default: a quarter of
	// max.connections, at least 1): one host can hold at most a quarter
	// of the slots, whatever it opens.
	MaxConnectionsPerIP int
	// MaxInFlight bounds the requests of one client connection forwarded
	// and not yet answered (`max.in.flight.requests.per.connection`,
	// default 512); the proxy stops reading that client meanwhile.
	MaxInFlight int
	// MemoryMax bounds the bytes the proxy's variable buffers hold at once,
	// shared by all connections (`proxy.memory.max.bytes`, default 512 MiB,
	// at least socket.request.max.bytes): frames read whole (requests the
	// proxy decodes, responses it rewrites) and the interceptors' work. A
	// request waits for room (the proxy stops reading its client, as Kafka
	// does with queued.max.request.bytes); an interceptor that finds no
	// room within its time budget fails its partition (docs/SECURITY.md).
	MemoryMax int64
	// BatchDecompressedMax and RequestDecompressedMax bound what one record
	// batch, and all batches of one request or fetch response, may
	// decompress to (`interceptor.batch.decompressed.max.bytes`, default
	// 100 MiB; `interceptor.request.decompressed.max.bytes`, default
	// 200 MiB).
	BatchDecompressedMax, RequestDecompressedMax int64
	// UpstreamSASL authenticates the proxy's own admin client (topic
	// configs and ids) and, when set, marks the upstream listener as one
	// that requires SASL: interceptors then run only for client
	// connections the broker has authenticated (`upstream.sasl.*`).
	UpstreamSASL SASLConfig
	// MetricsMaxTopics bounds the topic label of the per-topic metrics
	// (`metrics.topics.max`, default 100): later topics are counted under
	// topic="other" (docs/OPERATIONS.md).
	MetricsMaxTopics int
	// Tracing exports OpenTelemetry traces of the records large-message
	// offloads and resolves over OTLP/HTTP (`tracing.enabled`, default
	// false; `tracing.otlp.endpoint`, default from the standard
	// OTEL_EXPORTER_OTLP_* environment variables).
	Tracing observe.TracingConfig
	// TracerProvider, when set, is used instead of the one Tracing would
	// build (a program embedding the proxy, a test).
	TracerProvider trace.TracerProvider
	// Logger receives the proxy's structured logs; nil: slog.Default().
	Logger *slog.Logger
	// Version names this configuration in the ferry_proxy_config_info
	// metric and reload logs (not a file key; `ferry proxy` sets the first
	// 16 hex digits of the config file's SHA-256). Empty: a digest of the
	// reloadable keys.
	Version string
}

// SASLConfig is the proxy's own SASL login to the upstream cluster, mapped
// onto franz-go by internal/kafkaconf (as the ferry CLI's sasl.* keys are).
type SASLConfig struct {
	// Mechanism is PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER
	// (`upstream.sasl.mechanism`); empty: none.
	Mechanism string
	// Username and Password (`upstream.sasl.username`,
	// `upstream.sasl.password`) for PLAIN and SCRAM.
	Username, Password string
	// TokenFile holds the OAUTHBEARER token, read again at each login
	// (`upstream.sasl.oauthbearer.token.file`).
	TokenFile string
}

// mechanism is the franz-go mechanism of c (kafkaconf.NewMechanism), nil
// for none. Errors name the upstream.sasl.* keys.
func (c SASLConfig) mechanism() (sasl.Mechanism, error) {
	if c.Mechanism == "" {
		return nil, nil
	}
	m, err := kafkaconf.NewMechanism(kafkaconf.SASL{Mechanism: c.Mechanism, Username: c.Username, Password: c.Password, TokenFile: c.TokenFile})
	if err != nil {
		var ke *kafkaconf.Error
		if errors.As(err, &ke) {
			err = ke.Err
		}
		return nil, fmt.Errorf("upstream.sasl.mechanism %q: %w", c.Mechanism, err)
	}
	return m, nil
}

// DefaultMaxInFlight is max.in.flight.requests.per.connection's default.
const DefaultMaxInFlight = 512

// DefaultFirstRequestTimeout is connections.first.request.timeout.ms's
// default.
const DefaultFirstRequestTimeout = 10 * time.Second

// maxConnectionsPerIPShare: max.connections.per.ip defaults to
// max.connections / maxConnectionsPerIPShare, but never below
// min(max.connections, minConnectionsPerIP): a small max.connections (a
// test, a sidecar) still serves one client host, which opens a bootstrap
// connection plus one per broker.
const (
	maxConnectionsPerIPShare = 4
	minConnectionsPerIP      = 64
)

// DefaultMaxConnections is max.connections' default for this process:
// derived from the file-descriptor limit (RLIMIT_NOFILE, which Go raises
// to the hard limit at start-up) as (limit - max(256, limit/10)) / 2: two
// descriptors per client connection (its own and its upstream
// connection's) and the rest kept for listeners, payload store files and
// the proxy's admin client. At least 64; 1,000,000 when the limit is
// unlimited or unknown to the platform.
func DefaultMaxConnections() int {
	return maxConnectionsForFDs(fileDescriptorLimit())
}

// maxConnectionsForFDs is DefaultMaxConnections for a descriptor limit
// (0: unknown or unlimited).
func maxConnectionsForFDs(limit uint64) int {
	const ceiling = 1_000_000
	if limit == 0 || limit >= 2*ceiling+ceiling/4 {
		return ceiling
	}
	reserve := max(256, limit/10)
	if limit <= reserve+128 {
		return 64
	}
	return int((limit - reserve) / 2)
}

// DefaultShutdownTimeout bounds the drain on shutdown (shutdown.timeout.ms).
const DefaultShutdownTimeout = 30 * time.Second

// Defaults of the wait for an unreachable upstream broker
// (upstream.connect.timeout.ms, upstream.reconnect.backoff.ms,
// upstream.reconnect.backoff.max.ms).
const (
	DefaultConnectTimeout      = 30 * time.Second
	DefaultReconnectBackoff    = 50 * time.Millisecond
	DefaultReconnectBackoffMax = time.Second
)

// TLSConfig is one side's TLS settings; PEM files.
type TLSConfig struct {
	Enabled bool   // `enabled`
	Cert    string // `cert`: certificate chain (the proxy's own; required on the client side)
	Key     string // `key`
	CA      string // `ca`: client side: CAs of client certificates; upstream side: CAs of brokers (default: the system's)
	// ClientAuth (client side only, `client.auth`): none (default),
	// requested, or required — Kafka's ssl.client.auth.
	ClientAuth string
	// ServerName (upstream side, `server.name`): expected broker name;
	// default: the host of the address dialed.
	ServerName string
	// InsecureSkipVerify (upstream side, `insecure.skip.verify`): no
	// certificate check. For tests only.
	InsecureSkipVerify bool
}

func (c *Config) setDefaults() {
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = 10 * time.Second
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.ReconnectBackoff == 0 {
		c.ReconnectBackoff = DefaultReconnectBackoff
	}
	if c.ReconnectBackoffMax == 0 {
		c.ReconnectBackoffMax = max(DefaultReconnectBackoffMax, c.ReconnectBackoff)
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 10 * time.Minute
	}
	if c.FirstRequestTimeout == 0 {
		c.FirstRequestTimeout = DefaultFirstRequestTimeout
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections()
	}
	if c.MaxConnectionsPerIP == 0 {
		c.MaxConnectionsPerIP = max(c.MaxConnections/maxConnectionsPerIPShare, min(c.MaxConnections, minConnectionsPerIP))
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.MemoryMax == 0 {
		c.MemoryMax = max(interceptor.DefaultMemoryMax, int64(c.MaxRequestBytes)+int64(c.MaxRequestBytes)/2)
	}
}

func (c *Config) listenPortZero() bool {
	_, p, err := net.SplitHostPort(c.Listen)
	return err == nil && (p == "0" || p == "")
}

// Validate reports the first problem in c, naming the key.
func (c *Config) Validate() error {
	if len(c.Upstream) == 0 {
		return errors.New("upstream: at least one broker host:port is required")
	}
	for _, u := range c.Upstream {
		if _, p, err := net.SplitHostPort(u); err != nil || p == "" {
			return fmt.Errorf("upstream %q: want host:port", u)
		}
	}
	if c.Listen == "" {
		return errors.New("listen: a host:port is required")
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("listen %q: want host:port", c.Listen)
	}
	if c.BrokerPortBase < 0 || c.BrokerPortBase > 65535 {
		return fmt.Errorf("broker.port.base %d: want 0..65535", c.BrokerPortBase)
	}
	if c.MaxRequestBytes < 0 || c.MaxResponseBytes < 0 {
		return errors.New("socket.request.max.bytes and upstream.response.max.bytes must be positive")
	}
	if c.DialTimeout < 0 || c.ShutdownTimeout < 0 {
		return errors.New("dial.timeout.ms and shutdown.timeout.ms must not be negative")
	}
	if c.ReconnectBackoff < 0 || c.ReconnectBackoffMax < 0 {
		return errors.New("upstream.reconnect.backoff.ms and upstream.reconnect.backoff.max.ms must not be negative")
	}
	if c.ReconnectBackoffMax != 0 && c.ReconnectBackoffMax < c.ReconnectBackoff {
		return fmt.Errorf("upstream.reconnect.backoff.max.ms (%d) must be at least upstream.reconnect.backoff.ms (%d)",
			c.ReconnectBackoffMax.Milliseconds(), c.ReconnectBackoff.Milliseconds())
	}
	if c.ClientTLS.Enabled && (c.ClientTLS.Cert == "" || c.ClientTLS.Key == "") {
		return errors.New("tls.client: cert and key are required when enabled")
	}
	switch c.ClientTLS.ClientAuth {
	case "", "none", "requested", "required":
	default:
		return fmt.Errorf("tls.client.client.auth %q: want none, requested or required", c.ClientTLS.ClientAuth)
	}
	if (c.UpstreamTLS.Cert == "") != (c.UpstreamTLS.Key == "") {
		return errors.New("tls.upstream: cert and key go together")
	}
	if err := c.SNI.validate(c); err != nil {
		return err
	}
	if c.MaxConnections < 0 || c.MaxConnectionsPerIP < 0 || c.MaxInFlight < 0 {
		return errors.New("max.connections, max.connections.per.ip and max.in.flight.requests.per.connection must be positive")
	}
	if c.MemoryMax != 0 && c.MemoryMax < int64(c.MaxRequestBytes) {
		return fmt.Errorf("proxy.memory.max.bytes (%d) must be at least socket.request.max.bytes (%d): a request is read whole within it", c.MemoryMax, c.MaxRequestBytes)
	}
	if c.BatchDecompressedMax < 0 || c.RequestDecompressedMax < 0 {
		return errors.New("interceptor.batch.decompressed.max.bytes and interceptor.request.decompressed.max.bytes must be positive")
	}
	if c.UpstreamSASL.Mechanism != "" {
		if _, err := c.UpstreamSASL.mechanism(); err != nil {
			return err
		}
	}
	return nil
}

func loadCAs(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate", path)
	}
	return pool, nil
}

// serverConfig is the TLS config for the client-side listeners (nil when
// disabled).
func (t TLSConfig) serverConfig() (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if t.CA != "" {
		if cfg.ClientCAs, err = loadCAs(t.CA); err != nil {
			return nil, err
		}
	}
	switch t.ClientAuth {
	case "requested":
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	case "required":
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// clientConfig is the TLS config for upstream connections (nil when
// disabled).
func (t TLSConfig) clientConfig() (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	cfg := &tls.Config{ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify, MinVersion: tls.VersionTLS12} //nolint:gosec // opt-in, for tests
	var err error
	if t.CA != "" {
		if cfg.RootCAs, err = loadCAs(t.CA); err != nil {
			return nil, err
		}
	}
	if t.Cert != "" {
		cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// configKeys are the YAML keys LoadConfigFile accepts, flattened with ".".
var configKeys = []string{
	"upstream", "listen", "advertised.host", "broker.port.base", "socket.request.max.bytes",
	"upstream.response.max.bytes", "dial.timeout.ms",
	"upstream.connect.timeout.ms", "upstream.reconnect.backoff.ms", "upstream.reconnect.backoff.max.ms", "shutdown.timeout.ms", "connections.max.idle.ms", "connections.first.request.timeout.ms", "admin.listen",
	"admin.pprof.enabled",
	"tls.client.enabled", "tls.client.cert", "tls.client.key", "tls.client.ca", "tls.client.client.auth",
	"tls.upstream.enabled", "tls.upstream.cert", "tls.upstream.key", "tls.upstream.ca",
	"tls.upstream.server.name", "tls.upstream.insecure.skip.verify",
	"sni.bootstrap.host", "sni.broker.host.pattern", "sni.advertised.port",
	"interceptors", "reload.allow.unprotected", "produce.request.interceptor.timeout.ms", "topic.config.refresh.ms",
	"max.connections", "max.connections.per.ip", "max.in.flight.requests.per.connection", "proxy.memory.max.bytes",
	"interceptor.batch.decompressed.max.bytes", "interceptor.request.decompressed.max.bytes",
	"upstream.sasl.mechanism", "upstream.sasl.username", "upstream.sasl.password", "upstream.sasl.oauthbearer.token.file",
	observe.KeyMetricsMaxTopics, observe.KeyTracingEnabled, observe.KeyTracingEndpoint,
}

// ConfigKeys are the keys of a proxy configuration (the YAML file's, and
// ferry proxy's -X properties), flattened with ".".
func ConfigKeys() []string { return slices.Clone(configKeys) }

// LoadConfigFile reads a YAML config file with koanf. Keys may be nested
// (tls: {client: {cert: ...}}) or dotted (socket.request.max.bytes: ...).
//
// Errors: an unreadable or malformed file, an unknown key, a value of the
// wrong type; each names the file and key.
func LoadConfigFile(path string) (Config, error) {
	return LoadConfig(path, nil)
}

// LoadConfig is LoadConfigFile of path ("": no file) with overrides set
// over it: key=value properties of ConfigKeys (ferry proxy's -X), each
// value a string checked as the file's value would be ("interceptors", a
// list, cannot be given this way). Errors name the file or, for a value
// of overrides, "-X" and the key.
func LoadConfig(path string, overrides map[string]string) (Config, error) {
	if len(overrides) > 0 {
		// The properties alone first, so that an error names where the
		// value came from.
		only := koanf.New(".")
		for key := range overrides {
			if key == "interceptors" || !slices.Contains(configKeys, key) {
				return Config{}, fmt.Errorf("-X %s: not a proxy configuration key", key)
			}
		}
		m := make(map[string]any, len(overrides))
		for key, v := range overrides {
			m[key] = v
		}
		if err := only.Load(confmap.Provider(m, ""), nil); err != nil {
			return Config{}, fmt.Errorf("-X: %w", err)
		}
		if _, err := parseConfig(only, "-X"); err != nil {
			return Config{}, err
		}
	}
	k := koanf.New(".")
	source := "properties"
	if path != "" {
		source = "config file " + path
		if err := k.Load(file.Provider(path), yaml.Parser()); err != nil {
			if looksLikeProperties(path) {
				return Config{}, fmt.Errorf("%s is not YAML: it reads as Kafka-style properties (key=value), but the proxy's configuration is YAML, key: value, with the keys of docs/PROXY.md (%w)", source, err)
			}
			return Config{}, fmt.Errorf("%s: %w", source, err)
		}
	}
	if len(overrides) > 0 {
		// Flattened, then set: the file may spell a key nested or dotted.
		flat := k.All()
		for key, v := range overrides {
			flat[key] = v
		}
		k = koanf.New(".")
		if err := k.Load(confmap.Provider(flat, ""), nil); err != nil { // keys kept as spelled
			return Config{}, fmt.Errorf("%s and -X: %w", source, err)
		}
	}
	return parseConfig(k, source)
}

// looksLikeProperties reports whether the file at path has a key=value
// line (Java properties, client.properties) and no key: value one.
func looksLikeProperties(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	props := false
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == '!' {
			continue
		}
		eq, colon := strings.IndexByte(line, '='), strings.IndexByte(line, ':')
		switch {
		case colon >= 0 && (eq < 0 || colon < eq):
			return false
		case eq > 0:
			props = true
		}
	}
	return props
}

// parseConfig reads a Config from k; errors are prefixed with source.
func parseConfig(k *koanf.Koanf, source string) (Config, error) {
	var c Config
	for _, key := range k.Keys() {
		if !slices.Contains(configKeys, key) {
			if near := suggest.Nearest(key, configKeys, false); len(near) > 0 {
				// A misspelling, as -X reports one (ferry proxy -X).
				return c, fmt.Errorf("%s: unknown key %q (did you mean %s?)", source, key, suggest.OrList(near))
			}
			return c, fmt.Errorf("%s: unknown key %q (known: %s)", source, key, strings.Join(configKeys, ", "))
		}
	}
	var errs []error
	str := func(key string) string {
		v := k.Get(key)
		switch v := v.(type) {
		case nil:
			return ""
		case string:
			return v
		case int, int64, float64, bool:
			return fmt.Sprint(v)
		default:
			errs = append(errs, fmt.Errorf("%s: want a string, got %T", key, v))
			return ""
		}
	}
	// secret reads a credential: YAML turns an unquoted 012345 into the
	// octal number 5349 and 1e3 into 1000, so only a string is taken (the
	// value is not shown in the error).
	secret := func(key string) string {
		switch v := k.Get(key).(type) {
		case nil:
			return ""
		case string:
			return v
		default:
			errs = append(errs, fmt.Errorf("%s: YAML read the value as a %T, which may differ from what was written: quote it (%s: \"…\")", key, v, key))
			return ""
		}
	}
	num := func(key string, max int64) int64 {
		s := str(key)
		if s == "" {
			return 0
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 || n > max {
			errs = append(errs, fmt.Errorf("%s %q: want an integer 0..%d", key, s, max))
		}
		return n
	}
	boolean := func(key string) bool {
		s := str(key)
		if s == "" {
			return false
		}
		b, err := strconv.ParseBool(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %q: want true or false", key, s))
		}
		return b
	}
	switch v := k.Get("upstream").(type) {
	case nil:
	case string:
		c.Upstream = SplitList(v)
	case []any:
		for _, e := range v {
			c.Upstream = append(c.Upstream, strings.TrimSpace(fmt.Sprint(e)))
		}
	default:
		errs = append(errs, fmt.Errorf("upstream: want a list or a comma-separated string, got %T", v))
	}
	c.Listen = str("listen")
	c.AdvertisedHost = str("advertised.host")
	c.BrokerPortBase = int(num("broker.port.base", 65535))
	c.MaxRequestBytes = int32(num("socket.request.max.bytes", 1<<31-1))
	c.MaxResponseBytes = int32(num("upstream.response.max.bytes", 1<<31-1))
	c.DialTimeout = time.Duration(num("dial.timeout.ms", 1<<31-1)) * time.Millisecond
	c.ShutdownTimeout = time.Duration(num("shutdown.timeout.ms", 1<<31-1)) * time.Millisecond
	if s := str("upstream.connect.timeout.ms"); s == "-1" {
		c.ConnectTimeout = -1
	} else {
		c.ConnectTimeout = time.Duration(num("upstream.connect.timeout.ms", 1<<31-1)) * time.Millisecond
	}
	c.ReconnectBackoff = time.Duration(num("upstream.reconnect.backoff.ms", 1<<31-1)) * time.Millisecond
	c.ReconnectBackoffMax = time.Duration(num("upstream.reconnect.backoff.max.ms", 1<<31-1)) * time.Millisecond
	if s := str("connections.max.idle.ms"); s == "-1" {
		c.IdleTimeout = -1
	} else {
		c.IdleTimeout = time.Duration(num("connections.max.idle.ms", 1<<31-1)) * time.Millisecond
	}
	if s := str("connections.first.request.timeout.ms"); s == "-1" {
		c.FirstRequestTimeout = -1
	} else {
		c.FirstRequestTimeout = time.Duration(num("connections.first.request.timeout.ms", 1<<31-1)) * time.Millisecond
	}
	c.AdminListen = str("admin.listen")
	c.Pprof = boolean("admin.pprof.enabled")
	for _, side := range []struct {
		prefix string
		t      *TLSConfig
	}{{"tls.client.", &c.ClientTLS}, {"tls.upstream.", &c.UpstreamTLS}} {
		side.t.Enabled = boolean(side.prefix + "enabled")
		side.t.Cert = str(side.prefix + "cert")
		side.t.Key = str(side.prefix + "key")
		side.t.CA = str(side.prefix + "ca")
		side.t.ClientAuth = str(side.prefix + "client.auth")
		side.t.ServerName = str(side.prefix + "server.name")
		side.t.InsecureSkipVerify = boolean(side.prefix + "insecure.skip.verify")
	}
	c.SNI = SNIConfig{BootstrapHost: str("sni.bootstrap.host"), BrokerHostPattern: str("sni.broker.host.pattern"),
		AdvertisedPort: int(num("sni.advertised.port", 65535))}
	c.InterceptorTimeout = time.Duration(num("produce.request.interceptor.timeout.ms", 1<<31-1)) * time.Millisecond
	c.TopicConfigRefresh = time.Duration(num("topic.config.refresh.ms", 1<<31-1)) * time.Millisecond
	c.MaxConnections = int(num("max.connections", 1<<31-1))
	c.MaxConnectionsPerIP = int(num("max.connections.per.ip", 1<<31-1))
	c.MaxInFlight = int(num("max.in.flight.requests.per.connection", 1<<20))
	c.MemoryMax = num("proxy.memory.max.bytes", 1<<62)
	c.BatchDecompressedMax = num("interceptor.batch.decompressed.max.bytes", 1<<62)
	c.RequestDecompressedMax = num("interceptor.request.decompressed.max.bytes", 1<<62)
	c.MetricsMaxTopics = int(num(observe.KeyMetricsMaxTopics, 1<<20))
	c.Tracing = observe.TracingConfig{Enabled: boolean(observe.KeyTracingEnabled), Endpoint: str(observe.KeyTracingEndpoint)}
	c.UpstreamSASL = SASLConfig{Mechanism: str("upstream.sasl.mechanism"), Username: secret("upstream.sasl.username"), Password: secret("upstream.sasl.password"),
		TokenFile: str("upstream.sasl.oauthbearer.token.file")}
	c.ReloadAllowUnprotected = boolean("reload.allow.unprotected")
	specs, err := interceptorSpecs(k.Get("interceptors"))
	if err != nil {
		errs = append(errs, err)
	}
	c.Interceptors = specs
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("%s: %w", source, err)
	}
	return c, nil
}

// interceptorSpecs reads the `interceptors` list: each item a map with
// `name` and an optional `config` map of string keys (dotted keys as
// written, e.g. large.message.payload.store.url) to scalar values.
func interceptorSpecs(v any) ([]interceptor.Spec, error) {
	if v == nil {
		return nil, nil
	}
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("interceptors: want a list of {name, config}, got %T", v)
	}
	var out []interceptor.Spec
	for i, item := range list {
		m, ok := item.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("interceptors[%d]: want a map with name and config, got %T", i, item)
		}
		spec := interceptor.Spec{Config: map[string]string{}}
		for k, val := range m {
			switch k {
			case "name":
				spec.Name = fmt.Sprint(val)
			case "config":
				cm, ok := val.(map[string]any)
				if !ok {
					return nil, fmt.Errorf("interceptors[%d].config: want a map, got %T", i, val)
				}
				if err := flattenConfig("", cm, spec.Config); err != nil {
					return nil, fmt.Errorf("interceptors[%d].config: %w", i, err)
				}
			default:
				return nil, fmt.Errorf("interceptors[%d]: unknown key %q (want name, config)", i, k)
			}
		}
		if spec.Name == "" {
			return nil, fmt.Errorf("interceptors[%d]: name is required", i)
		}
		out = append(out, spec)
	}
	return out, nil
}

// flattenConfig turns nested YAML maps into dotted keys (a: {b: 1} is a.b).
func flattenConfig(prefix string, m map[string]any, out map[string]string) error {
	for k, v := range m {
		key := prefix + k
		switch v := v.(type) {
		case map[string]any:
			if err := flattenConfig(key+".", v, out); err != nil {
				return err
			}
		case []any:
			parts := make([]string, len(v))
			for i, e := range v {
				parts[i] = fmt.Sprint(e)
			}
			out[key] = strings.Join(parts, ",")
		case nil:
			out[key] = ""
		default:
			out[key] = fmt.Sprint(v)
		}
	}
	return nil
}

// SplitList splits "a:1, b:2" into ["a:1" "b:2"], dropping empty items.
func SplitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
