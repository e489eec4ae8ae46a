package proxy

// SNI routing: one TLS listener (`listen`) serves the bootstrap and every
// broker. Clients are told broker N as sni.broker.host.pattern with
// $(nodeId) replaced by N, on the listener's port; the server name a client
// sends in its TLS ClientHello (SNI, RFC 6066) says which broker it wants.
// The names must resolve to the proxy (a wildcard DNS record) and the
// proxy's certificate must name them all (a wildcard certificate such as
// *.kafka.example.com). The same idea as Kroxylicious' SNI routing
// (bootstrapAddress, advertisedBrokerAddressPattern with $(nodeId)).

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// NodeIDToken is the placeholder of sni.broker.host.pattern that stands for
// a broker's node id (Kroxylicious spells it the same way).
const NodeIDToken = "$(nodeId)"

// SNIConfig routes one TLS listener to the bootstrap and to every broker by
// the TLS server name (`sni.*`). It is on when BrokerHostPattern is set.
type SNIConfig struct {
	// BootstrapHost is the server name of the bootstrap
	// (`sni.bootstrap.host`, e.g. bootstrap.kafka.example.com): a client
	// sending it is served by one of the upstream seeds. Required with
	// BrokerHostPattern.
	BootstrapHost string
	// BrokerHostPattern is the host name clients are told for each broker
	// (`sni.broker.host.pattern`, e.g. broker-$(nodeId).kafka.example.com):
	// NodeIDToken, exactly once, stands for the node id in decimal. A
	// client sending broker-3.kafka.example.com is forwarded to node 3.
	BrokerHostPattern string
	// AdvertisedPort is the port clients are told for every broker
	// (`sni.advertised.port`); 0 (default): the port of `listen`. Set it
	// when a load balancer in front of the proxy listens on another port.
	AdvertisedPort int
}

// Enabled reports whether SNI routing is configured (either key set; Validate
// requires both).
func (c SNIConfig) Enabled() bool { return c.BootstrapHost != "" || c.BrokerHostPattern != "" }

// nodeSNI is the node id a connection of the SNI listener has until its TLS
// handshake names the bootstrap (-1) or a broker.
const nodeSNI int32 = -2

// ErrSNIUnknown: a client's TLS server name is neither sni.bootstrap.host nor
// a host of sni.broker.host.pattern, or it sent none. Its handshake ends with
// a TLS alert (internal_error: Go cannot send unrecognized_name).
var ErrSNIUnknown = errors.New("TLS server name (SNI) names neither the bootstrap nor a broker")

// sniRouter maps TLS server names to node ids and node ids to host names.
// Names compare case-insensitively (DNS), a trailing dot ignored.
type sniRouter struct {
	bootstrap      string // lower case
	prefix, suffix string // of the pattern, around NodeIDToken, lower case
}

// validate checks the SNI keys against the rest of c; each error names the
// key.
func (c SNIConfig) validate(cfg *Config) error {
	if !c.Enabled() {
		if c.AdvertisedPort != 0 {
			return errors.New("sni.advertised.port needs sni.broker.host.pattern and sni.bootstrap.host")
		}
		return nil
	}
	if c.BrokerHostPattern == "" {
		return fmt.Errorf("sni.bootstrap.host is set: sni.broker.host.pattern (e.g. broker-%s.kafka.example.com) is required with it", NodeIDToken)
	}
	if c.BootstrapHost == "" {
		return errors.New("sni.broker.host.pattern is set: sni.bootstrap.host (e.g. bootstrap.kafka.example.com) is required with it")
	}
	if _, err := newSNIRouter(c); err != nil {
		return err
	}
	if c.AdvertisedPort < 0 || c.AdvertisedPort > 65535 {
		return fmt.Errorf("sni.advertised.port %d: want 0..65535", c.AdvertisedPort)
	}
	if !cfg.ClientTLS.Enabled {
		return errors.New("sni.*: SNI routing reads the server name of the client's TLS handshake: set tls.client.enabled, with a certificate for the bootstrap and broker names (e.g. *.kafka.example.com)")
	}
	if cfg.BrokerPortBase != 0 {
		return errors.New("broker.port.base: with sni.* every broker is served on the listen port; remove broker.port.base")
	}
	if cfg.AdvertisedHost != "" {
		return errors.New("advertised.host: with sni.* brokers are advertised as sni.broker.host.pattern; remove advertised.host")
	}
	return nil
}

func newSNIRouter(c SNIConfig) (*sniRouter, error) {
	p := strings.ToLower(strings.TrimSuffix(c.BrokerHostPattern, "."))
	token := strings.ToLower(NodeIDToken)
	if n := strings.Count(p, token); n != 1 {
		return nil, fmt.Errorf("sni.broker.host.pattern %q: must contain %s exactly once (found %d), e.g. broker-%s.kafka.example.com",
			c.BrokerHostPattern, NodeIDToken, n, NodeIDToken)
	}
	r := &sniRouter{bootstrap: strings.ToLower(strings.TrimSuffix(c.BootstrapHost, "."))}
	r.prefix, r.suffix, _ = strings.Cut(p, token)
	// The longest name the pattern makes must be a host name.
	if err := checkHostName(r.brokerHost(1<<31 - 1)); err != nil {
		return nil, fmt.Errorf("sni.broker.host.pattern %q: %w", c.BrokerHostPattern, err)
	}
	if err := checkHostName(r.bootstrap); err != nil {
		return nil, fmt.Errorf("sni.bootstrap.host %q: %w", c.BootstrapHost, err)
	}
	if id, ok := r.broker(r.bootstrap); ok {
		return nil, fmt.Errorf("sni.bootstrap.host %q is also the host of broker %d in sni.broker.host.pattern %q: choose names that differ",
			c.BootstrapHost, id, c.BrokerHostPattern)
	}
	return r, nil
}

// checkHostName accepts a DNS host name (RFC 1123: labels of letters,
// digits and inner hyphens, 1–63 bytes each, 253 in all); SNI carries no IP
// addresses.
func checkHostName(h string) error {
	if h == "" {
		return errors.New("empty host name")
	}
	if len(h) > 253 {
		return fmt.Errorf("host name of %d bytes, more than 253", len(h))
	}
	if net.ParseIP(h) != nil {
		return errors.New("an IP address: TLS server names (SNI) are host names")
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("label %q: want 1 to 63 characters", label)
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("label %q starts or ends with '-'", label)
		}
		for _, ch := range label {
			if !(ch >= 'a' && ch <= 'z' || ch >= '0' && ch <= '9' || ch == '-') {
				return fmt.Errorf("label %q: only letters, digits and '-'", label)
			}
		}
	}
	return nil
}

// brokerHost is the host name clients are told for node id.
func (r *sniRouter) brokerHost(id int32) string {
	return r.prefix + strconv.FormatInt(int64(id), 10) + r.suffix
}

// broker reports the node id whose host name is name (lower case): the
// pattern's prefix and suffix around a node id in canonical decimal (no sign,
// no leading zero), at most 2^31-1.
func (r *sniRouter) broker(name string) (int32, bool) {
	if len(name) <= len(r.prefix)+len(r.suffix) || !strings.HasPrefix(name, r.prefix) || !strings.HasSuffix(name, r.suffix) {
		return 0, false
	}
	digits := name[len(r.prefix) : len(name)-len(r.suffix)]
	if digits != "0" && digits[0] == '0' {
		return 0, false
	}
	for _, ch := range digits {
		if ch < '0' || ch > '9' {
			return 0, false
		}
	}
	id, err := strconv.ParseInt(digits, 10, 32)
	if err != nil {
		return 0, false
	}
	return int32(id), true
}

// route maps a TLS server name to -1 (the bootstrap) or a broker's node id.
// Errors: ErrSNIUnknown.
func (r *sniRouter) route(serverName string) (int32, error) {
	name := strings.ToLower(strings.TrimSuffix(serverName, "."))
	if name == "" {
		return 0, fmt.Errorf("%w: the client sent no server name (it connected by IP address, or its TLS library sends no SNI)", ErrSNIUnknown)
	}
	if name == r.bootstrap {
		return -1, nil
	}
	if id, ok := r.broker(name); ok {
		return id, nil
	}
	return 0, fmt.Errorf("%w: %q", ErrSNIUnknown, serverName)
}

// sniTLSConfig is the client-side TLS config of the SNI listener: the
// handshake of a client whose server name routes nowhere is refused before
// the proxy's certificate is sent.
func (s *Server) sniTLSConfig() *tls.Config {
	cfg := s.clientTLS.Clone()
	cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		if _, err := s.sni.route(hello.ServerName); err != nil {
			s.refuseSNI(hello, err)
			return nil, err
		}
		return nil, nil // the listener's config
	}
	return cfg
}

// refuseSNI counts a refused server name (ferry_proxy_errors_total{kind=
// "sni_missing"|"sni_unknown"}) and logs it, at most one line every
// sniLogEvery with the number refused since the previous line.
func (s *Server) refuseSNI(hello *tls.ClientHelloInfo, err error) {
	kind := "sni_unknown"
	if hello.ServerName == "" {
		kind = "sni_missing"
	}
	s.m.errors.WithLabelValues(kind).Inc()
	s.sniRefused.Add(1)
	now := time.Now().UnixNano()
	last := s.sniRefusalLogged.Load()
	if now-last < int64(sniLogEvery) || !s.sniRefusalLogged.CompareAndSwap(last, now) {
		return
	}
	n := s.sniRefused.Swap(0)
	client := ""
	if hello.Conn != nil {
		client = hello.Conn.RemoteAddr().String()
	}
	s.log.Warn("connection refused: its TLS server name (SNI) is neither sni.bootstrap.host nor a host of sni.broker.host.pattern (logged at most every 10s)",
		"client", client, "server_name", hello.ServerName, "sni.bootstrap.host", s.cfg.SNI.BootstrapHost,
		"sni.broker.host.pattern", s.cfg.SNI.BrokerHostPattern, "refused", n, "err", err)
}

// sniLogEvery rate-limits the refusal warning of refuseSNI.
const sniLogEvery = 10 * time.Second

// routeSNI sets the node id of a connection of the SNI listener from its
// completed handshake's server name; false: closed (a name routeing nowhere,
// which the handshake should already have refused).
func (c *conn) routeSNI() bool {
	cs, ok := c.client.(interface{ ConnectionState() tls.ConnectionState })
	if !ok {
		c.fail("sni_missing", "connection refused: no TLS on the SNI listener", ErrSNIUnknown)
		return false
	}
	name := cs.ConnectionState().ServerName
	id, err := c.s.sni.route(name)
	if err != nil {
		c.fail("sni_unknown", "connection refused", err)
		return false
	}
	c.nodeID = id
	kind := "broker"
	if id < 0 {
		kind = "bootstrap"
	}
	c.s.m.connsTotal.WithLabelValues(kind).Inc()
	c.log = c.s.log.With("client", c.client.RemoteAddr().String(), "node", id, "sni", name)
	return true
}

// rediscover asks the upstream cluster for its brokers again when a client
// names a broker by SNI that the proxy has not seen since it started (its
// start-up discovery failed, or the broker joined since): at most once a
// second, one at a time.
func (s *Server) rediscover(ctx context.Context, nodeID int32) {
	s.probeMu.Lock()
	defer s.probeMu.Unlock()
	if s.upstreamFor(nodeID) != "" || time.Since(s.lastRediscover) < time.Second {
		return
	}
	s.lastRediscover = time.Now()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
	defer cancel()
	if err := s.probe(ctx); err != nil {
		s.log.Debug("broker discovery for an SNI name failed", "node", nodeID, "err", err)
	}
}
