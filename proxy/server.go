// Package proxy is Ferry's Kafka protocol proxy ("ferry proxy"): clients
// connect to it as if it were the cluster, and it forwards every request to
// the upstream brokers.
//
// Wire handling: each client connection gets one upstream connection (so
// SASL authentication binds to that client). Requests and responses travel
// as opaque frames; only request headers are decoded (kbin), and only the
// responses that carry broker endpoints (Metadata, FindCoordinator,
// DescribeCluster, the KIP-951 endpoints of Produce/Fetch, ShareFetch,
// ShareAcknowledge) and ApiVersions are decoded and re-encoded with kmsg.
// Responses are matched to requests in order through a per-connection queue
// of in-flight requests (key, version, correlation id); acks=0 Produce
// requests get no entry, since the broker sends no response.
//
// Ports: one bootstrap listener, and one listener per broker node id at
// BrokerPortBase+nodeID (default: the bootstrap port + 1 + nodeID), so a
// restarted proxy hands out the same addresses. Brokers that appear later in
// a response get their listener before the response reaches the client.
// With SNI routing (Config.SNI, sni.go) the one TLS listener serves them all,
// and the server name of each client's handshake picks the broker.
package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/payloadstore"
)

// Server is a running proxy. Create it with New, start it with Start, stop
// it with Shutdown.
type Server struct {
	collecting atomic.Bool // collectLarge's collection is running

	cfg    Config
	log    *slog.Logger
	m      *metrics
	obs    *observability // per-topic metrics and tracing of the interceptors
	dialer *net.Dialer

	clientTLS   *tls.Config
	upstreamTLS *tls.Config

	advertisedHost string
	listenHost     string
	bootstrapPort  int

	mu        sync.Mutex
	bootstrap net.Listener
	nodes     map[int32]*node
	conns     map[*conn]struct{}
	closing   bool
	admin     *http.Server
	adminLn   net.Listener
	seedIndex atomic.Uint32
	// refusalLog, firstTimeoutLog, unknownNodeLog rate-limit the warnings
	// about refused connections (limits.go).
	refusalLog, firstTimeoutLog, unknownNodeLog logLimiter

	// ic is the interceptors' admin client and caches (always made: a
	// reload may add interceptors); chain is the current generation of the
	// interceptor chain (reload.go), reloadMu orders reloads, rm counts them.
	ic       *interception
	chain    atomic.Pointer[chainGen]
	reloadMu sync.Mutex
	rm       *reloadMetrics
	// mem is the budget of proxy.memory.max.bytes: frames read whole and
	// the interceptors' work.
	mem *interceptor.Memory
	// saslUpstream: the upstream listener requires SASL (configured, or
	// found by a probe); interceptors then wait for each client's
	// authentication. saslKnown: configured, or a probe concluded.
	saslUpstream, saslKnown atomic.Bool
	probeMu                 sync.Mutex // one probe at a time
	// probing ends with the probe in flight for authRequired (nil: none);
	// under probingMu. stopped is closed by Shutdown (probeUntilKnown).
	probingMu sync.Mutex
	probing   chan struct{}
	stopped   chan struct{}
	// perIP counts client connections by remote address (max.connections.per.ip).
	perIP map[string]int

	// sni routes the one listener by TLS server name; nil: a listener per
	// broker. sniRefused counts refusals since sniRefusalLogged (unix ns),
	// the last warning about one. lastRediscover: guarded by probeMu.
	sni                          *sniRouter
	sniRefused, sniRefusalLogged atomic.Int64
	lastRediscover               time.Time
	advertisedPort               int32 // SNI: the port told for every broker

	wg sync.WaitGroup // accept loops and connections

	// undo bounds the deletes of the payloads of requests never
	// acknowledged (abandoned, refused), which outlive their connection:
	// carried in every connection's context, stopped when Shutdown's
	// deadline comes, so that a hanging store cannot hold Shutdown past it.
	undo *payloadstore.UndoBound
}

// node is one upstream broker as the proxy knows it.
type node struct {
	id       int32
	upstream string       // real host:port, from the latest response naming it
	ln       net.Listener // nil with SNI routing
	port     int32        // advertised port
}

// New checks cfg and returns a Server that is not listening yet.
//
// Errors: an invalid Config (see Config.Validate), unreadable TLS files.
func New(cfg Config) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, m: newMetrics(), nodes: map[int32]*node{}, conns: map[*conn]struct{}{},
		perIP: map[string]int{}, mem: interceptor.NewMemory(cfg.MemoryMax), undo: payloadstore.NewUndoBound(), stopped: make(chan struct{})}
	s.saslUpstream.Store(cfg.UpstreamSASL.Mechanism != "")
	// Known only when configured: otherwise the start-up probe (or the
	// first interception, after a reload added interceptors) finds out.
	s.saslKnown.Store(cfg.UpstreamSASL.Mechanism != "")
	if s.log == nil {
		s.log = slog.Default()
	}
	s.dialer = &net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 30 * time.Second}
	var err error
	if cfg.SNI.Enabled() {
		if s.sni, err = newSNIRouter(cfg.SNI); err != nil {
			return nil, err
		}
	}
	if s.clientTLS, err = cfg.ClientTLS.serverConfig(); err != nil {
		return nil, fmt.Errorf("client-side TLS: %w", err)
	}
	if s.upstreamTLS, err = cfg.UpstreamTLS.clientConfig(); err != nil {
		return nil, fmt.Errorf("upstream TLS: %w", err)
	}
	var tlsOpt kgo.Opt
	if s.upstreamTLS != nil {
		tlsOpt = kgo.DialTLSConfig(s.upstreamTLS)
	}
	// Made with or without interceptors: a reload may add them.
	if s.obs, err = newObservability(cfg, s.m.reg); err != nil {
		return nil, err
	}
	if s.ic, err = newInterception(cfg, tlsOpt); err != nil {
		s.obs.close()
		return nil, err
	}
	chain, err := s.buildChain(context.Background(), cfg)
	if err != nil {
		s.ic.close()
		s.obs.close()
		return nil, err
	}
	version := cfg.Version
	if version == "" {
		version = liveHash(cfg)
	}
	s.rm = newReloadMetrics(s.m.reg)
	s.installChain(&chainGen{chain: chain, gen: 1, version: version, specs: cfg.Interceptors})
	s.m.observe(s)
	return s, nil
}

// Start opens the bootstrap listener (and the admin HTTP listener when
// configured), starts serving, and in the background asks the upstream
// cluster for its brokers to open their listeners early. It returns once
// the listeners are open.
func (s *Server) Start(ctx context.Context) error {
	ln, err := s.listen(s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("bootstrap listener %s: %w", s.cfg.Listen, err)
	}
	host, portStr, _ := net.SplitHostPort(ln.Addr().String())
	s.bootstrapPort, _ = strconv.Atoi(portStr)
	s.advertisedPort = int32(s.cfg.SNI.AdvertisedPort)
	if s.advertisedPort == 0 {
		s.advertisedPort = int32(s.bootstrapPort)
	}
	s.listenHost, _, _ = net.SplitHostPort(s.cfg.Listen)
	s.advertisedHost = s.cfg.AdvertisedHost
	if s.advertisedHost == "" {
		s.advertisedHost = s.listenHost
		if ip := net.ParseIP(s.listenHost); s.listenHost == "" || (ip != nil && ip.IsUnspecified()) {
			s.advertisedHost = host
			if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
				s.advertisedHost = "localhost"
			}
		}
	}
	s.mu.Lock()
	s.bootstrap = ln
	s.mu.Unlock()
	if s.cfg.AdminListen != "" {
		if err := s.startAdmin(); err != nil {
			ln.Close()
			return err
		}
	}
	listener := int32(-1)
	if s.sni != nil {
		listener = nodeSNI
		s.log.Info("proxy listening, routing by TLS server name (SNI)", "listen", ln.Addr().String(),
			"sni.bootstrap.host", s.cfg.SNI.BootstrapHost, "sni.broker.host.pattern", s.cfg.SNI.BrokerHostPattern,
			"advertised_port", s.advertisedPort, "upstream", s.cfg.Upstream, "interceptors", specNames(s.cfg.Interceptors),
			"max.connections", s.cfg.MaxConnections, "max.connections.per.ip", s.cfg.MaxConnectionsPerIP)
	} else {
		s.log.Info("proxy listening", "bootstrap", ln.Addr().String(), "advertised_host", s.advertisedHost,
			"upstream", s.cfg.Upstream, "tls", s.clientTLS != nil, "interceptors", specNames(s.cfg.Interceptors),
			"max.connections", s.cfg.MaxConnections, "max.connections.per.ip", s.cfg.MaxConnectionsPerIP)
	}
	s.wg.Add(1)
	go s.acceptLoop(ln, listener)
	// Discover the brokers now: a broker port that cannot be opened (taken,
	// or past 65535) is a configuration error to report at start-up, not at
	// every client's first Metadata. An unreachable upstream is only logged.
	if err := s.discover(ctx); err != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = s.Shutdown(sctx)
		cancel()
		return err
	}
	if s.cfg.IdleTimeout > 0 {
		go s.reapIdle()
	}
	return nil
}

// reapIdle closes connections idle for longer than connections.max.idle.ms,
// as the broker does, until Shutdown.
func (s *Server) reapIdle() {
	period := min(s.cfg.IdleTimeout/4, 30*time.Second)
	t := time.NewTicker(period)
	defer t.Stop()
	for range t.C {
		cutoff := time.Now().Add(-s.cfg.IdleTimeout)
		var idle []*conn
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			return
		}
		for c := range s.conns {
			if c.idleSince(cutoff) {
				idle = append(idle, c)
			}
		}
		s.mu.Unlock()
		for _, c := range idle {
			s.m.idleClosed.Inc()
			c.log.Debug("closing an idle connection", "idle_timeout", s.cfg.IdleTimeout)
			c.close()
		}
	}
}

// Addr returns the bootstrap listener's address.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bootstrap == nil {
		return ""
	}
	return s.bootstrap.Addr().String()
}

// AdminAddr returns the admin HTTP listener's address ("" when none).
func (s *Server) AdminAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.adminLn == nil {
		return ""
	}
	return s.adminLn.Addr().String()
}

// Handler returns the admin HTTP handler: /metrics (Prometheus), /healthz
// (readiness: 200 "ok" while serving, 503 from the start of Shutdown's
// drain), /livez (liveness: 200 while the process runs, draining included)
// and, when Config.Pprof
// is set, Go's profiles under /debug/pprof/ (net/http/pprof: profile?seconds=N
// for CPU, heap, goroutine, mutex, block, trace).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		closing := s.closing
		s.mu.Unlock()
		if closing {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	if s.cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

func (s *Server) startAdmin() error {
	ln, err := net.Listen("tcp", s.cfg.AdminListen)
	if err != nil {
		return fmt.Errorf("admin listener %s: %w", s.cfg.AdminListen, err)
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	s.mu.Lock()
	s.admin, s.adminLn = srv, ln
	s.mu.Unlock()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("admin listener stopped", "err", err)
		}
	}()
	return nil
}

func (s *Server) listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	switch {
	case s.sni != nil:
		ln = tls.NewListener(ln, s.sniTLSConfig())
	case s.clientTLS != nil:
		ln = tls.NewListener(ln, s.clientTLS)
	}
	return ln, nil
}

// brokerPort returns the advertised port of nodeID, 0 for an ephemeral one
// (when the bootstrap port itself was ephemeral, as in tests).
func (s *Server) brokerPort(nodeID int32) (int, error) {
	if nodeID < 0 {
		return 0, fmt.Errorf("negative node id %d", nodeID)
	}
	var p int64
	switch {
	case s.cfg.BrokerPortBase > 0:
		p = int64(s.cfg.BrokerPortBase) + int64(nodeID)
	case s.cfg.listenPortZero():
		return 0, nil
	default:
		p = int64(s.bootstrapPort) + 1 + int64(nodeID)
	}
	if p > 65535 {
		return 0, fmt.Errorf("%w: node id %d gives port %d > 65535: set broker.port.base lower", ErrBrokerPort, nodeID, p)
	}
	return int(p), nil
}

// mapAddress is the AddressMapper of every connection: it records the real
// endpoint of nodeID, opens its listener if needed, and returns the
// proxy's endpoint for it.
func (s *Server) mapAddress(nodeID int32, host string, port int32) (string, int32, error) {
	real := net.JoinHostPort(host, strconv.Itoa(int(port)))
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodes[nodeID]
	if n != nil {
		if n.upstream != real {
			s.log.Info("broker endpoint changed", "node", nodeID, "from", n.upstream, "to", real)
			n.upstream = real
		}
		return s.advertisedHostOf(nodeID), n.port, nil
	}
	if s.closing {
		return "", 0, errors.New("proxy shutting down")
	}
	if s.sni != nil {
		// No listener of its own: the SNI listener serves it.
		s.nodes[nodeID] = &node{id: nodeID, upstream: real, port: s.advertisedPort}
		s.log.Info("broker routed by SNI", "node", nodeID, "host", s.sni.brokerHost(nodeID), "upstream", real)
		return s.sni.brokerHost(nodeID), s.advertisedPort, nil
	}
	want, err := s.brokerPort(nodeID)
	if err != nil {
		return "", 0, err
	}
	ln, err := s.listen(net.JoinHostPort(s.listenHost, strconv.Itoa(want)))
	if err != nil {
		s.m.errors.WithLabelValues("listen").Inc()
		return "", 0, fmt.Errorf("%w: listener for broker %d: %w (broker node id N listens on broker.port.base + N, by default the bootstrap port + 1 + N: set --broker-port-base to a free range)", ErrBrokerPort, nodeID, err)
	}
	_, ps, _ := net.SplitHostPort(ln.Addr().String())
	p, _ := strconv.Atoi(ps)
	n = &node{id: nodeID, upstream: real, ln: ln, port: int32(p)}
	s.nodes[nodeID] = n
	s.m.listeners.Inc()
	s.log.Info("broker listener opened", "node", nodeID, "listen", ln.Addr().String(), "upstream", real)
	s.wg.Add(1)
	go s.acceptLoop(ln, nodeID)
	return s.advertisedHost, n.port, nil
}

// BrokerAddr returns the proxy's address for node id, once a response has
// named that broker.
func (s *Server) BrokerAddr(nodeID int32) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodes[nodeID]
	if n == nil {
		return "", false
	}
	return net.JoinHostPort(s.advertisedHostOf(nodeID), strconv.Itoa(int(n.port))), true
}

// advertisedHostOf is the host clients are told for nodeID: its SNI host
// name, or advertised.host.
func (s *Server) advertisedHostOf(nodeID int32) string {
	if s.sni != nil {
		return s.sni.brokerHost(nodeID)
	}
	return s.advertisedHost
}

func (s *Server) upstreamFor(nodeID int32) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.nodes[nodeID]; n != nil {
		return n.upstream
	}
	return ""
}

func (s *Server) acceptLoop(ln net.Listener, nodeID int32) {
	defer s.wg.Done()
	kind := "broker"
	if nodeID < 0 {
		kind = "bootstrap"
	}
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Temporary errors (EMFILE...): back off as net/http does.
			if delay == 0 {
				delay = 5 * time.Millisecond
			} else if delay *= 2; delay > time.Second {
				delay = time.Second
			}
			s.log.Warn("accept failed", "listener", ln.Addr().String(), "err", err)
			time.Sleep(delay)
			continue
		}
		delay = 0
		if nodeID != nodeSNI { // counted once routed (routeSNI)
			s.m.connsTotal.WithLabelValues(kind).Inc()
		}
		ip := remoteIP(c)
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			c.Close()
			continue
		}
		if len(s.conns) >= s.cfg.MaxConnections || s.perIP[ip] >= s.cfg.MaxConnectionsPerIP {
			n, nip := len(s.conns), s.perIP[ip]
			s.mu.Unlock()
			kind, limit := "too_many_connections", "max.connections"
			if n < s.cfg.MaxConnections {
				kind, limit = "too_many_connections_per_ip", "max.connections.per.ip"
			}
			s.m.errors.WithLabelValues(kind).Inc()
			if refused, ok := s.refusalLog.allow(refusalLogEvery); ok {
				s.log.Warn("connection refused: "+limit+" reached (logged at most every 10s)",
					"client", c.RemoteAddr().String(), "connections", n, "from_address", nip,
					"max.connections", s.cfg.MaxConnections, "max.connections.per.ip", s.cfg.MaxConnectionsPerIP,
					"refused", refused)
			}
			c.Close()
			continue
		}
		cn := newConn(s, c, nodeID)
		s.conns[cn] = struct{}{}
		s.perIP[ip]++
		s.wg.Add(1)
		s.mu.Unlock()
		go cn.serve()
	}
}

// dialUpstream connects to the broker behind nodeID, or for the bootstrap
// listener (nodeID < 0) to the first upstream seed that answers, starting
// from a rotating index.
func (s *Server) dialUpstream(ctx context.Context, nodeID int32) (net.Conn, error) {
	var addrs []string
	if nodeID >= 0 {
		a := s.upstreamFor(nodeID)
		if a == "" && s.sni != nil {
			s.rediscover(ctx, nodeID)
			a = s.upstreamFor(nodeID)
		}
		if a == "" {
			return nil, fmt.Errorf("%w %d", errUnknownNode, nodeID)
		}
		addrs = []string{a}
	} else {
		start := int(s.seedIndex.Add(1))
		for i := range s.cfg.Upstream {
			addrs = append(addrs, s.cfg.Upstream[(start+i)%len(s.cfg.Upstream)])
		}
	}
	var errs []error
	for _, a := range addrs {
		c, err := s.dialer.DialContext(ctx, "tcp", a)
		if err == nil && s.upstreamTLS != nil {
			cfg := s.upstreamTLS
			if cfg.ServerName == "" {
				cfg = cfg.Clone()
				cfg.ServerName, _, _ = net.SplitHostPort(a)
			}
			tc := tls.Client(c, cfg)
			hctx, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
			err = tc.HandshakeContext(hctx)
			cancel()
			if err != nil {
				c.Close()
			} else {
				c = tc
			}
		}
		if err == nil {
			s.m.upstreamConnects.WithLabelValues("ok").Inc()
			return c, nil
		}
		s.m.upstreamConnects.WithLabelValues("error").Inc()
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// Shutdown stops accepting connections, stops reading new requests, waits
// until every in-flight request has its response written (or ctx ends), then
// closes all connections and listeners. It returns ctx's error if the drain
// was cut short.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return nil
	}
	s.closing = true
	close(s.stopped)
	if s.bootstrap != nil {
		s.bootstrap.Close()
	}
	for _, n := range s.nodes {
		if n.ln != nil {
			n.ln.Close()
		}
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	admin := s.admin
	s.mu.Unlock()
	s.log.Info("proxy shutting down", "connections", len(conns))
	start := time.Now()
	for _, c := range conns {
		c.drain()
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
		// The undo of abandoned work ends first: the connections closed
		// now abandon what they were forwarding, and their readers and
		// writers delete its payloads before they end.
		s.undo.Stop()
		s.mu.Lock()
		for c := range s.conns {
			c.close()
		}
		s.mu.Unlock()
		<-done
		if n := s.undo.Left(); n > 0 {
			s.log.Warn("payloads of requests never acknowledged were left in the store: their deletes were cut short at shutdown.timeout.ms; nothing references them, ferry gc removes them",
				"payloads", n)
		}
	}
	if admin != nil {
		actx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = admin.Shutdown(actx)
		cancel()
	}
	// Retire the chain: closed now, or by the last request still holding it
	// (none once every connection has ended).
	if g := s.chain.Swap(nil); g != nil {
		g.release()
	}
	s.ic.close()
	s.obs.close()
	if err != nil {
		s.log.Warn("proxy stopped before its connections drained", "after", time.Since(start).Round(time.Millisecond), "err", err)
	} else {
		s.log.Info("proxy stopped", "drained_in", time.Since(start).Round(time.Millisecond))
	}
	return err
}

func (s *Server) removeConn(c *conn) {
	ip := remoteIP(c.client)
	s.mu.Lock()
	delete(s.conns, c)
	if s.perIP[ip]--; s.perIP[ip] <= 0 {
		delete(s.perIP, ip)
	}
	s.mu.Unlock()
}

// remoteIP is the address a connection comes from, without its port.
func remoteIP(c net.Conn) string {
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}

// authRequired reports whether c's client must authenticate before the
// interceptors run (see saslState): upstream.sasl.* is set, or a probe
// found the broker closing unauthenticated connections. Until a probe has
// concluded (the upstream unreachable so far; probeUntilKnown keeps
// probing in the background), it answers true (fail closed: the client's
// connection is closed, as the broker closes an unauthenticated one),
// after waiting, when wait is set (c's reader only), for the probe in
// flight or one it starts (up to dial.timeout.ms), and not after c's
// client has gone or c has closed.
func (s *Server) authRequired(c *conn, wait bool) bool {
	if s.saslKnown.Load() {
		return s.saslUpstream.Load()
	}
	if !wait {
		return true
	}
	p := s.startProbe()
	ctx, stop := c.watchGone(c.ctx)
	select {
	case <-p:
	case <-ctx.Done():
	}
	stop()
	return !s.saslKnown.Load() || s.saslUpstream.Load()
}

// startProbe returns the end of the probe in flight, starting one (bounded
// by dial.timeout.ms) when none is: connections waiting for the answer
// share one probe rather than each making its own in turn.
func (s *Server) startProbe() <-chan struct{} {
	s.probingMu.Lock()
	defer s.probingMu.Unlock()
	if s.probing != nil {
		return s.probing
	}
	done := make(chan struct{})
	s.probing = done
	go func() {
		s.probeMu.Lock()
		if !s.saslKnown.Load() {
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.DialTimeout)
			_ = s.probe(ctx)
			cancel()
		}
		s.probeMu.Unlock()
		s.probingMu.Lock()
		s.probing = nil
		s.probingMu.Unlock()
		close(done)
	}()
	return done
}

// probeUntilKnown probes the upstream in the background, a probe at a
// time with upstream.reconnect.backoff.ms between them (doubled up to
// upstream.reconnect.backoff.max.ms), until one concludes whether it
// requires SASL or Shutdown: the start-up probe did not (the cluster
// unreachable as the proxy started), and the clients' first intercepted
// requests would otherwise each wait for a probe of their own, up to
// dial.timeout.ms, and have their connections closed when it fails.
func (s *Server) probeUntilKnown() {
	wait := s.cfg.ReconnectBackoff
	t := time.NewTimer(wait)
	defer t.Stop()
	for !s.saslKnown.Load() {
		select {
		case <-t.C:
		case <-s.stopped:
			return
		}
		select {
		case <-s.startProbe():
		case <-s.stopped:
			return
		}
		wait = min(2*wait, s.cfg.ReconnectBackoffMax)
		t.Reset(wait)
	}
}

// probe asks the upstream cluster for its brokers on a connection of its
// own, without authentication, which opens their listeners and tells
// whether the listener requires SASL (the broker closes the connection).
// Errors: ErrBrokerPort; an unreachable upstream or another failure leaves
// the SASL question open (logged by the caller).
func (s *Server) probe(ctx context.Context) error {
	up, err := s.dialUpstream(ctx, -1)
	if err != nil {
		return err
	}
	defer up.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = up.SetDeadline(dl)
	}
	err = discoverBrokers(up, s.mapAddress)
	switch {
	case err == nil:
		s.saslKnown.Store(true)
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET):
		// The broker closed an unauthenticated connection: a SASL
		// listener. Interceptors wait for each client's authentication.
		if !s.saslUpstream.Swap(true) {
			s.log.Warn("the upstream broker closes unauthenticated connections: treating it as a SASL listener (interceptors run only for authenticated clients); set upstream.sasl.* to say so", "err", err)
		}
		s.saslKnown.Store(true)
	}
	return err
}

// discover asks the upstream cluster for its brokers through an in-process
// connection to the proxy itself, so listeners exist before any client asks;
// a failure (e.g. an upstream that requires SASL) is logged and harmless.
func (s *Server) discover(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s.probeMu.Lock()
	defer s.probeMu.Unlock()
	if err := s.probe(ctx); err != nil {
		if errors.Is(err, ErrBrokerPort) {
			return err
		}
		s.log.Warn("broker discovery at start-up failed; listeners open on first metadata", "err", err)
	}
	if !s.saslKnown.Load() && s.chain.Load().active() {
		// Asked only with interceptors (a reload that adds the first
		// ones leaves it to their first requests).
		go s.probeUntilKnown()
	}
	return nil
}

// ErrBrokerPort: a broker's listener cannot be opened (its port is taken, or
// the node id puts it past 65535).
var ErrBrokerPort = errors.New("cannot open the listener of a broker")

// largeGarbageBytes: a request or response at least this large leaves that
// much garbage once handled (its frame, the payloads and batches an
// interceptor built for it), so a collection is started at once
// (collectLarge) rather than when the heap has doubled past what is live:
// between large records the process's peak memory is then about one
// record's working set, not two or three (issue 11: peak RSS with 100 MiB
// records).
const largeGarbageBytes = 32 << 20

// collectLarge starts a garbage collection in the background after a large
// request or response was handled; at most one runs at a time (its cost
// follows the live heap, which is small: byte slices are not scanned).
func (s *Server) collectLarge(n int64) {
	if n < largeGarbageBytes || !s.collecting.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer s.collecting.Store(false)
		runtime.GC()
	}()
}

// Memory bound of a proxy process (docs/SECURITY.md): the budget, a fixed
// allowance for the program's mapped code (about 65 MiB of the binary is
// resident: 58 MiB before the CEL rules of validate-schema were linked in,
// whose growth took a loaded run's peak 9 MiB over the bound),
// the runtime and garbage not yet collected, and a per-connection allowance
// (two 32 KiB read buffers, goroutine stacks, TLS state).
const (
	baseMemoryBytes          = 128 << 20
	codeMemoryBytes          = 120 << 20 // of baseMemoryBytes, not the Go heap's
	perConnectionMemoryBytes = 100 << 10
)

// MemoryBound is the peak resident memory, in bytes, the proxy is built to
// stay under with connections client connections allowed:
// proxy.memory.max.bytes + 128 MiB + 100 KiB per connection.
func (s *Server) MemoryBound(connections int) int64 {
	return s.cfg.MemoryMax + baseMemoryBytes + int64(connections)*perConnectionMemoryBytes
}

// GoMemoryLimit is the soft memory limit `ferry proxy` gives the Go
// runtime (unless GOMEMLIMIT is set): MemoryBound for max.connections less
// the 120 MiB the runtime does not count (the mapped binary, stacks, freed
// memory not yet returned, slack), so
// that garbage is collected before the bound is reached.
func (s *Server) GoMemoryLimit() int64 {
	return s.MemoryBound(s.cfg.MaxConnections) - codeMemoryBytes
}
