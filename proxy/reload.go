package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferrykit/ferry/interceptor"
)

// Hot reload (docs/PROXY.md, "Reloading the configuration").
//
// The interceptor chain lives in generations. The Server holds one
// reference to the current generation; each request takes one when its
// header has been read (acquireChain) and its in-flight entry keeps one
// until its response is written, so a request is handled from its read to
// its response by the chain in force when it arrived. Reload builds the
// next generation, swaps it in (new requests take it from then on) and
// drops the Server's reference to the old one, whose interceptors are
// closed (their payload stores released) when its last request is done.
// Connections are never touched: no client connection drops.

// chainGen is one generation of the interceptor chain; nil-safe (a nil
// *chainGen is "no interceptors").
type chainGen struct {
	chain   *interceptor.Chain // nil: no interceptors configured
	gen     uint64             // 1 for the chain New built, +1 per successful reload
	version string             // Config.Version of the configuration it came from
	specs   []interceptor.Spec // the interceptors it was built from (reload_guard.go)
	refs    atomic.Int64
	once    sync.Once
}

// active reports whether the generation has interceptors at all.
func (g *chainGen) active() bool { return g != nil && g.chain != nil }

// hasProduce and hasFetch: the generation decodes Produce requests / Fetch
// responses.
func (g *chainGen) hasProduce() bool { return g.active() && g.chain.HasProduce() }
func (g *chainGen) hasFetch() bool   { return g.active() && g.chain.HasFetch() }

// retain takes a reference. A generation without interceptors has nothing
// to close, so it is not counted: the plain proxy's per-request path does no
// atomic work on a counter every connection shares.
func (g *chainGen) retain() {
	if g.active() {
		g.refs.Add(1)
	}
}

// release drops one reference; the last one closes the chain's
// interceptors. (The count may touch zero for a moment when acquireChain
// races a swap; the chain is then already retired, and closed once.)
func (g *chainGen) release() {
	if g.active() && g.refs.Add(-1) == 0 {
		g.once.Do(func() { _ = g.chain.Close() })
	}
}

// acquireChain returns the current generation with a reference the caller
// must release; nil before New has built one.
func (s *Server) acquireChain() *chainGen {
	for {
		g := s.chain.Load()
		if !g.active() {
			return g // nothing to hold
		}
		g.refs.Add(1)
		if s.chain.Load() == g {
			return g // still current after the reference was taken: not retired
		}
		g.release()
	}
}

// buildChain builds the interceptor chain of cfg (nil: none configured).
func (s *Server) buildChain(ctx context.Context, cfg Config) (*interceptor.Chain, error) {
	if len(cfg.Interceptors) == 0 {
		return nil, nil
	}
	return interceptor.Build(ctx, cfg.Interceptors, interceptor.Options{
		Timeout: cfg.InterceptorTimeout, TopicName: s.ic.topicName, Memory: s.mem,
		BatchDecompressedMax: cfg.BatchDecompressedMax, RequestDecompressedMax: cfg.RequestDecompressedMax,
		Metrics: s.obs.metrics, Tracer: s.obs.tracer})
}

// ReloadableKeys are the configuration keys a Reload applies to new
// requests; every other key takes effect only when the proxy restarts.
var ReloadableKeys = []string{
	"interceptors", "reload.allow.unprotected", "produce.request.interceptor.timeout.ms",
	"interceptor.batch.decompressed.max.bytes", "interceptor.request.decompressed.max.bytes",
}

// restartKeys names each restart-only field of Config by its YAML key, so a
// reload can say which changed keys it did not apply.
var restartKeys = []struct {
	key   string
	field func(*Config) any
}{
	{"upstream", func(c *Config) any { return c.Upstream }},
	{"listen", func(c *Config) any { return c.Listen }},
	{"advertised.host", func(c *Config) any { return c.AdvertisedHost }},
	{"broker.port.base", func(c *Config) any { return c.BrokerPortBase }},
	{"socket.request.max.bytes", func(c *Config) any { return c.MaxRequestBytes }},
	{"upstream.response.max.bytes", func(c *Config) any { return c.MaxResponseBytes }},
	{"dial.timeout.ms", func(c *Config) any { return c.DialTimeout }},
	{"upstream.connect.timeout.ms", func(c *Config) any { return c.ConnectTimeout }},
	{"upstream.reconnect.backoff.ms", func(c *Config) any { return c.ReconnectBackoff }},
	{"upstream.reconnect.backoff.max.ms", func(c *Config) any { return c.ReconnectBackoffMax }},
	{"connections.max.idle.ms", func(c *Config) any { return c.IdleTimeout }},
	{"connections.first.request.timeout.ms", func(c *Config) any { return c.FirstRequestTimeout }},
	{"shutdown.timeout.ms", func(c *Config) any { return c.ShutdownTimeout }},
	{"admin.listen", func(c *Config) any { return c.AdminListen }},
	{"admin.pprof.enabled", func(c *Config) any { return c.Pprof }},
	{"tls.client.*", func(c *Config) any { return c.ClientTLS }},
	{"tls.upstream.*", func(c *Config) any { return c.UpstreamTLS }},
	{"sni.bootstrap.host", func(c *Config) any { return c.SNI.BootstrapHost }},
	{"sni.broker.host.pattern", func(c *Config) any { return c.SNI.BrokerHostPattern }},
	{"sni.advertised.port", func(c *Config) any { return c.SNI.AdvertisedPort }},
	{"topic.config.refresh.ms", func(c *Config) any { return c.TopicConfigRefresh }},
	{"max.connections", func(c *Config) any { return c.MaxConnections }},
	{"max.connections.per.ip", func(c *Config) any { return c.MaxConnectionsPerIP }},
	{"max.in.flight.requests.per.connection", func(c *Config) any { return c.MaxInFlight }},
	{"proxy.memory.max.bytes", func(c *Config) any { return c.MemoryMax }},
	{"upstream.sasl.*", func(c *Config) any { return c.UpstreamSASL }},
	{"metrics.topics.max", func(c *Config) any { return c.MetricsMaxTopics }},
	{"tracing.*", func(c *Config) any { return c.Tracing }},
}

// restartOnly returns the keys whose values differ between running and
// next and that a reload does not apply. Fields not in restartKeys (added
// later) are reported together as "other keys".
func restartOnly(running, next Config) []string {
	var out []string
	for _, k := range restartKeys {
		if !reflect.DeepEqual(k.field(&running), k.field(&next)) {
			out = append(out, k.key)
		}
	}
	if len(out) == 0 {
		// Compare everything but what reloads or is not configuration.
		a, b := running, next
		for _, c := range []*Config{&a, &b} {
			c.Interceptors, c.InterceptorTimeout, c.BatchDecompressedMax, c.RequestDecompressedMax = nil, 0, 0, 0
			c.ReloadAllowUnprotected = false
			c.Logger, c.Version = nil, ""
		}
		if !reflect.DeepEqual(a, b) {
			out = append(out, "other keys")
		}
	}
	return out
}

// liveHash is a digest of the reloadable part of cfg (its interceptors
// and their limits): the config version shown when Config.Version is
// empty.
func liveHash(cfg Config) string {
	b, _ := json.Marshal(struct {
		I        []interceptor.Spec
		T        time.Duration
		BMax, RM int64
	}{cfg.Interceptors, cfg.InterceptorTimeout, cfg.BatchDecompressedMax, cfg.RequestDecompressedMax})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// reloadMetrics are the collectors of reloads.
type reloadMetrics struct {
	reloads     *prometheus.CounterVec // result: success|failure
	lastSuccess prometheus.Gauge
	generation  prometheus.Gauge
	info        *prometheus.GaugeVec // version
	unprotected prometheus.Counter   // reloads refused by checkProtection
}

func newReloadMetrics(reg *prometheus.Registry) *reloadMetrics {
	m := &reloadMetrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_proxy_config_reloads_total",
			Help: "Configuration reloads (SIGHUP or a change of the config file), by result (success, failure: the old configuration kept)."}, []string{"result"}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_proxy_config_last_reload_success_timestamp_seconds",
			Help: "Unix time of the last successful reload (the start-up counts as one)."}),
		generation: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_proxy_config_generation",
			Help: "Generation of the interceptor chain in force: 1 at start-up, +1 per successful reload."}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ferry_proxy_config_info",
			Help: "1 for the version of the configuration in force (ferry proxy: the first 16 hex digits of the config file's SHA-256)."}, []string{"version"}),
	}
	m.reloads.WithLabelValues("success")
	m.reloads.WithLabelValues("failure")
	reg.MustRegister(m.reloads, m.lastSuccess, m.generation, m.info)
	m.unprotected = newUnprotectedCounter(reg)
	return m
}

// closeChain closes a chain that was built but never installed.
func closeChain(c *interceptor.Chain) {
	if c != nil {
		_ = c.Close()
	}
}

// replaceChain makes g the current generation in place of old and retires
// old; false (nothing changed) when old is no longer current: Shutdown
// retired it, and g must not outlive the Server.
func (s *Server) replaceChain(old, g *chainGen) bool {
	g.refs.Store(1) // the Server's reference
	if !s.chain.CompareAndSwap(old, g) {
		return false
	}
	s.afterInstall(old, g)
	return true
}

// installChain makes g the current generation and retires the previous one.
func (s *Server) installChain(g *chainGen) {
	g.refs.Store(1) // the Server's reference
	old := s.chain.Swap(g)
	s.afterInstall(old, g)
}

// afterInstall updates the metrics of a switch from old to g and drops the
// Server's reference to old.
func (s *Server) afterInstall(old, g *chainGen) {
	s.rm.generation.Set(float64(g.gen))
	s.rm.lastSuccess.SetToCurrentTime()
	if old != nil {
		s.rm.info.DeleteLabelValues(old.version)
	}
	s.rm.info.WithLabelValues(g.version).Set(1)
	old.release()
}

// ErrReloadShutdown: Reload was called after Shutdown began.
var ErrReloadShutdown = errors.New("proxy shutting down: reload refused")

// Reload applies the reloadable keys of cfg (ReloadableKeys: the
// interceptors and their limits) to requests read from now on; requests
// in flight finish on the chain they started with, whose interceptors are
// closed once the last of them is done. No connection is closed. Keys
// that need a restart are compared with the running configuration and, if
// changed, named in a warning and otherwise ignored.
//
// Errors (the running chain is kept, the failure counted and logged): an
// invalid Config (Validate), an unknown interceptor, a bad interceptor
// configuration (topic pattern, store URL that does not open...), each
// naming the interceptor; ErrReloadShutdown. One log line per call.
func (s *Server) Reload(ctx context.Context, cfg Config) error {
	return s.ReloadWith(ctx, "Reload", func() (Config, error) { return cfg, nil })
}

// ReloadWith is Reload of the Config load returns, counted and logged with
// trigger (e.g. "SIGHUP", "file change"): an error of load (a file that
// does not parse) is a refused reload too.
func (s *Server) ReloadWith(ctx context.Context, trigger string, load func() (Config, error)) error {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	cfg, err := load()
	if err == nil {
		err = s.reload(ctx, trigger, cfg)
	}
	if err != nil {
		s.rm.reloads.WithLabelValues("failure").Inc()
		gen, version := s.ChainGeneration()
		s.log.Error("config reload refused; the running configuration is kept", "trigger", trigger, "err", err,
			"generation", gen, "version", version)
		return err
	}
	return nil
}

func (s *Server) reload(ctx context.Context, trigger string, cfg Config) error {
	start := time.Now()
	s.mu.Lock()
	closing := s.closing
	s.mu.Unlock()
	if closing {
		return ErrReloadShutdown
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.Version == "" {
		cfg.Version = liveHash(cfg)
	}
	chain, err := s.buildChain(ctx, cfg)
	if err != nil {
		return err
	}
	old := s.chain.Load()
	if old != nil {
		// After the build: a file that is wrong is reported as such first.
		if err := s.checkProtection(old.specs, cfg); err != nil {
			closeChain(chain)
			return err
		}
	}
	if old == nil {
		// Shutdown retired the chain while this one was being built.
		closeChain(chain)
		return ErrReloadShutdown
	}
	g := &chainGen{chain: chain, gen: old.gen + 1, version: cfg.Version, specs: cfg.Interceptors}
	if !s.replaceChain(old, g) {
		closeChain(chain) // only Shutdown swaps while reloadMu is held
		return ErrReloadShutdown
	}
	s.rm.reloads.WithLabelValues("success").Inc()
	attrs := []any{"trigger", trigger, "generation", g.gen, "version", g.version, "previous_version", old.version,
		"interceptors", specNames(cfg.Interceptors), "took", time.Since(start).Round(time.Microsecond)}
	if keys := restartOnly(s.cfg, cfg); len(keys) > 0 {
		s.log.Warn("config reloaded: interceptors switched for new requests; changed keys that need a restart were NOT applied",
			append(attrs, "restart_required", keys)...)
	} else {
		s.log.Info("config reloaded: interceptors switched for new requests", attrs...)
	}
	return nil
}

// ChainGeneration returns the generation of the interceptor chain in force
// (1 at start, +1 per successful Reload) and its configuration version.
func (s *Server) ChainGeneration() (gen uint64, version string) {
	g := s.chain.Load()
	if g == nil {
		return 0, ""
	}
	return g.gen, g.version
}

// specNames is the interceptors' names in chain order, as the logs show
// them, each with its topic.pattern unless it sees every topic.
func specNames(specs []interceptor.Spec) []string {
	names := make([]string, len(specs))
	for i, sp := range specs {
		names[i] = sp.Name
		// The topics it sees: a pattern that matches none of those meant
		// leaves them untouched, in silence (found by a new-user helper).
		if p := sp.Config[interceptor.KeyTopicPattern]; p != "" && p != ".*" {
			names[i] += "(" + interceptor.KeyTopicPattern + "=" + p + ")"
		}
	}
	return names
}
