package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/interceptor/wasm"
	"github.com/ferrykit/ferry/internal/props"
	"github.com/ferrykit/ferry/internal/suggest"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/observe"
	"github.com/ferrykit/ferry/payloadstore"
	"github.com/ferrykit/ferry/proxy"
)

// proxyCommand is "ferry proxy": the Kafka protocol proxy (package proxy).
func (a *app) proxyCommand() *cobra.Command {
	var (
		configFile, upstream, listen, advertised, admin string
		pprofOn, watch, tracing                         bool
		tracingEndpoint                                 string
		metricsMaxTopics                                int
		portBase                                        int
		maxRequest                                      int32
		interceptors                                    []string
		store                                           string
		logLevel                                        string
	)
	cmd := &cobra.Command{
		Use:   "proxy --upstream HOST:PORT[,HOST:PORT] --listen HOST:PORT",
		Short: "Run a transparent Kafka protocol proxy in front of a cluster",
		Long: `ferry proxy listens on a bootstrap address and on one address per broker
(broker node id N on --broker-port-base + N, by default the --listen port + 1 + N)
and forwards every request to the upstream cluster. Responses that name brokers
(Metadata, FindCoordinator, DescribeCluster, KIP-951 leader endpoints) are
rewritten to the proxy's addresses; everything else passes through untouched.
With sni.* in the config file, one TLS listener (--listen) serves the bootstrap
and every broker instead, routed by the TLS server name (SNI) each client sends.

Settings come from a YAML file (--config, keys in docs/PROXY.md), then from flags.
SIGTERM or Ctrl-C stops accepting, answers the requests in flight (bounded by
shutdown.timeout.ms) and exits 0; /healthz answers 503 meanwhile. SIGHUP, or a
change of the --config file, reloads the interceptors for new requests without
closing a connection; a bad file is refused and the running ones kept (keys
that need a restart are named in a warning).`,
		Example: `  ferry proxy --upstream 127.0.0.1:9092 --listen 127.0.0.1:19092
  ferry proxy --upstream 127.0.0.1:9092 --listen 127.0.0.1:19092 --interceptors large-message --store file:///var/ferry
  ferry proxy --config proxy.yaml --admin 127.0.0.1:9644`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// SIGHUP reloads (its default action would end the process):
			// caught from the start.
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			pf := proxyFlags{upstream, listen, advertised, admin, pprofOn, portBase, maxRequest, interceptors, store,
				tracing, tracingEndpoint, metricsMaxTopics}
			cfg, err := a.proxyConfig(cmd, configFile, pf)
			if err != nil {
				return err
			}
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return usageErrorf("--log-level %q: want debug, info, warn or error", logLevel)
			}
			cfg.Logger = slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: level}))
			slog.SetDefault(cfg.Logger) // the interceptors' libraries log at the same level
			s, err := newProxy(cmd.Context(), cfg)
			if err != nil && cmd.Context().Err() != nil {
				return fmt.Errorf("%w while the proxy started (opening its interceptors: a payload store, KMS or schema registry that does not answer)", context.Cause(cmd.Context()))
			}
			if err != nil {
				if errors.Is(err, largemessage.ErrNoStore) {
					err = fmt.Errorf("%w (--store URL, or -X %s=URL)", err, largemessage.KeyStoreURL)
				}
				if errors.Is(err, payloadstore.ErrInvalidConfig) || !errors.As(err, new(*payloadstore.Error)) {
					return &usageError{err: err}
				}
				return err // a store that cannot be reached: a runtime failure
			}
			if os.Getenv("GOMEMLIMIT") == "" {
				// Collect garbage before the documented bound is reached
				// (docs/SECURITY.md), whatever GOGC would wait for.
				debug.SetMemoryLimit(s.GoMemoryLimit())
			}
			ctx := cmd.Context()
			if err := s.Start(ctx); err != nil {
				if errors.Is(err, proxy.ErrBrokerPort) {
					return &usageError{err: err} // a port layout that cannot work: fix the config
				}
				return err
			}
			if cfg.SNI.Enabled() {
				_, port, _ := net.SplitHostPort(s.Addr())
				fmt.Fprintf(a.stdout, "ferry proxy: bootstrap %s (SNI routing on %s) -> %v\n",
					net.JoinHostPort(cfg.SNI.BootstrapHost, port), s.Addr(), cfg.Upstream)
			} else {
				fmt.Fprintf(a.stdout, "ferry proxy: bootstrap %s -> %v\n", s.Addr(), cfg.Upstream)
			}
			if s.AdminAddr() != "" {
				fmt.Fprintf(a.stdout, "ferry proxy: metrics http://%s/metrics\n", s.AdminAddr())
			}
			// Serving from here on: what start-up alone used of the
			// program's pages and of the heap goes back (docs/OPERATIONS.md).
			releaseProgramPages()
			debug.FreeOSMemory()
			reload := func(trigger string) {
				_ = s.ReloadWith(ctx, trigger, func() (proxy.Config, error) {
					c, err := a.proxyConfig(cmd, configFile, pf)
					c.Logger = cfg.Logger
					return c, err
				})
			}
			rctx, stopReloads := context.WithCancel(ctx)
			reloads := startReloader(rctx, cfg.Logger, hup, configFile, watch && configFile != "", reload)
			<-ctx.Done()
			stopReloads()
			<-reloads
			timeout := cfg.ShutdownTimeout
			if timeout == 0 {
				timeout = proxy.DefaultShutdownTimeout
			}
			sctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			if err := s.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return err
			} else if err != nil {
				cfg.Logger.Warn("shutdown drain cut short; connections closed", "timeout", timeout)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&configFile, "config", "", "YAML config `FILE` (keys in docs/PROXY.md); flags override it. Reloaded on SIGHUP and when it changes")
	f.BoolVar(&watch, "config-watch", true, "reload --config when the file changes (its directory is watched: editors' renames and Kubernetes ConfigMap updates count); SIGHUP reloads either way")
	f.StringVar(&upstream, "upstream", "", "upstream seed brokers, `HOST:PORT[,HOST:PORT]`")
	f.StringVar(&listen, "listen", "127.0.0.1:19092", "bootstrap listener `HOST:PORT`")
	f.StringVar(&advertised, "advertised-host", "", "host clients are told for each broker (default: the listen host)")
	f.IntVar(&portBase, "broker-port-base", 0, "broker node id N listens on `BASE`+N (default: listen port + 1 + N)")
	f.StringVar(&admin, "admin", "", "HTTP `HOST:PORT` for /metrics and /healthz (default: none)")
	f.BoolVar(&pprofOn, "pprof", false, "serve Go profiles under /debug/pprof/ on the --admin listener (admin.pprof.enabled; off by default)")
	f.BoolVar(&tracing, "tracing", false, "export OpenTelemetry traces of offloaded and resolved records over OTLP/HTTP ("+observe.KeyTracingEnabled+"; off by default; endpoint from OTEL_EXPORTER_OTLP_ENDPOINT)")
	f.StringVar(&tracingEndpoint, "tracing-endpoint", "", "OTLP/HTTP traces `URL`, e.g. http://collector:4318/v1/traces ("+observe.KeyTracingEndpoint+"; default: the OTEL_EXPORTER_OTLP_* variables)")
	f.IntVar(&metricsMaxTopics, "metrics-max-topics", observe.DefaultMaxTopics, "distinct topic label values of the per-topic metrics; later topics count as \"other\" ("+observe.KeyMetricsMaxTopics+")")
	f.Int32Var(&maxRequest, "socket-request-max-bytes", proxy.DefaultMaxRequestBytes, "largest request accepted, `BYTES` (Kafka's socket.request.max.bytes)")
	f.StringSliceVar(&interceptors, "interceptors", nil, "KIP-905 interceptors to run, in order: `NAME[,NAME]` of large-message, validate-json, validate-schema, redact, encrypt, wasm (configured with -X key=value; docs/INTERCEPTORS.md)")
	f.StringVar(&store, "store", "", "payload store `URL` of the large-message interceptor (property "+largemessage.KeyStoreURL+")")
	// The proxy's own --log-level, in place of the root's (warn): a server
	// logs its listeners, endpoint changes and shutdown at info.
	f.StringVar(&logLevel, "log-level", "info", "log level on stderr: debug, info, warn or error")
	return cmd
}

// proxyFlags are the flag values of ferry proxy that override the file.
type proxyFlags struct {
	upstream, listen, advertised, admin string
	pprof                               bool
	portBase                            int
	maxRequest                          int32
	interceptors                        []string
	store                               string
	tracing                             bool
	tracingEndpoint                     string
	metricsMaxTopics                    int
}

// proxyConfig reads configFile (if any) and applies the flags set on the
// command line over it: the configuration at start-up and at each reload.
// Errors are usage errors (exit 2 at start-up; a refused reload later).
func (a *app) proxyConfig(cmd *cobra.Command, configFile string, pf proxyFlags) (proxy.Config, error) {
	upstream, listen, advertised, admin, pprofOn, portBase, maxRequest, interceptors, store :=
		pf.upstream, pf.listen, pf.advertised, pf.admin, pf.pprof, pf.portBase, pf.maxRequest, pf.interceptors, pf.store
	var cfg proxy.Config
	f := cmd.Flags()
	// -X: the proxy's own keys override the file; the interceptors' keys
	// configure those --interceptors names (proxyProperties).
	p, err := a.props()
	if err != nil {
		return cfg, err
	}
	own, icProps, err := proxyProperties(p, f.Changed("interceptors"))
	if err != nil {
		return cfg, err
	}
	if configFile != "" || len(own) > 0 {
		var raw []byte
		if configFile != "" {
			if raw, err = os.ReadFile(configFile); err != nil {
				return cfg, &usageError{err: fmt.Errorf("config file %s: %w", configFile, err)}
			}
		}
		c, err := proxy.LoadConfig(configFile, own)
		if err != nil {
			return cfg, &usageError{err: err}
		}
		if configFile != "" {
			c.Version = configVersion(raw)
		}
		// The interceptors' store URLs, as strictly as --store.
		for i, sp := range c.Interceptors {
			raw, ok := sp.Config[largemessage.KeyStoreURL]
			if !ok {
				continue
			}
			u, err := parseStoreURL(raw)
			if err != nil {
				return cfg, usageErrorf("%s: interceptors[%d] (%s): %s %q: %v", configFile, i, sp.Name,
					largemessage.KeyStoreURL, shownStoreURL(raw), err)
			}
			c.Interceptors[i].Config[largemessage.KeyStoreURL] = u
		}
		cfg = c
	}
	if f.Changed("upstream") {
		cfg.Upstream = proxy.SplitList(upstream)
	}
	if f.Changed("listen") || cfg.Listen == "" {
		cfg.Listen = listen
	}
	if f.Changed("advertised-host") {
		cfg.AdvertisedHost = advertised
	}
	if f.Changed("broker-port-base") {
		cfg.BrokerPortBase = portBase
	}
	if f.Changed("admin") {
		cfg.AdminListen = admin
	}
	if f.Changed("pprof") {
		cfg.Pprof = pprofOn
	}
	if f.Changed("tracing") {
		cfg.Tracing.Enabled = pf.tracing
	}
	if f.Changed("tracing-endpoint") {
		cfg.Tracing.Endpoint = pf.tracingEndpoint
	}
	if f.Changed("metrics-max-topics") {
		if pf.metricsMaxTopics < 0 {
			return cfg, usageErrorf("--metrics-max-topics %d (%s): want 0 (default %d) or more", pf.metricsMaxTopics, observe.KeyMetricsMaxTopics, observe.DefaultMaxTopics)
		}
		cfg.MetricsMaxTopics = pf.metricsMaxTopics
	}
	if cfg.Pprof && cfg.AdminListen == "" {
		return cfg, usageErrorf("--pprof (admin.pprof.enabled) serves profiles on the admin listener: set --admin HOST:PORT (admin.listen) too")
	}
	if f.Changed("socket-request-max-bytes") {
		cfg.MaxRequestBytes = maxRequest
	}
	if f.Changed("interceptors") {
		// The simple case: built-ins by name, configured by -X
		// properties (large.message.*, ...) and --store.
		p := icProps
		if err := a.applyStoreURL(p, store); err != nil {
			return cfg, err
		}
		cfg.Interceptors = nil
		for _, name := range interceptors {
			if !slices.Contains(interceptor.Names(), name) {
				if near := suggest.Nearest(name, interceptor.Names(), false); len(near) > 0 {
					return cfg, usageErrorf("--interceptors: %q is not an interceptor (did you mean %s?)", name, suggest.OrList(near))
				}
			}
			cfg.Interceptors = append(cfg.Interceptors, interceptor.Spec{Name: name, Config: p})
		}
	} else if store != "" {
		return cfg, usageErrorf("--store is for the large-message interceptor: add --interceptors large-message")
	}
	for _, sp := range cfg.Interceptors {
		if err := refuseMemStore(sp.Config[largemessage.KeyStoreURL]); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

// proxyProperties sorts ferry proxy's -X properties, each checked as the
// other commands check theirs, with or without interceptors: own are the
// proxy's configuration keys (proxy.ConfigKeys: max.connections, ...),
// applied over the config file; ic are the built-in interceptors' keys
// (large.message.*, redact.*, ...), which configure the interceptors that
// --interceptors names. Errors (usage): a key that looks like a
// misspelling of either kind (naming the nearest keys), "interceptors",
// and an interceptor key without --interceptors (the config file's
// interceptors take theirs from their config map: it would be ignored).
// Any other key (a Kafka client setting the proxy has no use for) is
// logged and ignored, as produce and consume do.
func proxyProperties(p map[string]string, interceptorsFlag bool) (own, ic map[string]string, err error) {
	proxyKeys := slices.DeleteFunc(proxy.ConfigKeys(), func(k string) bool { return k == "interceptors" })
	icKeys := interceptorKeys()
	own, ic = map[string]string{}, map[string]string{}
	for _, k := range props.Keys(p) {
		switch {
		case k == "interceptors":
			return nil, nil, usageErrorf("-X interceptors: name them with --interceptors, or list them in the --config file")
		case slices.Contains(proxyKeys, k):
			own[k] = p[k]
		case slices.Contains(icKeys, k) || strings.HasPrefix(k, wasm.KeyConfigPrefix) || strings.HasPrefix(k, interceptor.KeyValidateSchemaRulePrefix):
			if !interceptorsFlag {
				return nil, nil, usageErrorf("-X %s configures the interceptors --interceptors names, and none is named: "+
					"add --interceptors NAME, or set it in the config map of an interceptor of the --config file", k)
			}
			ic[k] = p[k]
		case strings.HasPrefix(k, "validate.schema."):
			// validate-schema's namespace: an unknown key there is a typo
			// (a misspelled rule prefix would drop the rule in silence).
			return nil, nil, usageErrorf("unknown property %s (validate-schema's keys are %s and %sNAME)", k,
				strings.Join(slices.DeleteFunc(slices.Clone(icKeys), func(s string) bool { return !strings.HasPrefix(s, "validate.schema.") }), ", "),
				interceptor.KeyValidateSchemaRulePrefix)
		default:
			if err := misspelledKey(k, slices.Concat(proxyKeys, icKeys)); err != nil {
				return nil, nil, err
			}
			if ours, err := interceptor.CheckKey(k); ours && !slices.Contains(kafkaKeysNearOurs, k) {
				// In an interceptor's namespace (validate.json.schema.path
				// beside validate.json.schema.file): a typo that would
				// leave the interceptor at its default.
				return nil, nil, usageErrorf("-X %s: %v", k, err)
			}
			slog.Warn("property not read by ferry proxy; ignored", "key", k)
		}
	}
	return own, ic, nil
}

// newProxy is proxy.New given up when ctx ends first: SIGTERM while an
// interceptor's store or KMS does not answer at start-up (the store's
// check is bounded by large.message.payload.store.timeout.ms, 60 s by
// default, not by the signal). The abandoned start-up ends with the
// process.
func newProxy(ctx context.Context, cfg proxy.Config) (*proxy.Server, error) {
	type result struct {
		s   *proxy.Server
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := proxy.New(cfg)
		done <- result{s, err}
	}()
	select {
	case r := <-done:
		return r.s, r.err
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}
