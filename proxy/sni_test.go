package proxy

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func TestSNIRoute(t *testing.T) {
	r, err := newSNIRouter(SNIConfig{BootstrapHost: "Bootstrap.Kafka.Test", BrokerHostPattern: "broker-$(nodeId).kafka.test"})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int32{
		"bootstrap.kafka.test":          -1,
		"BOOTSTRAP.kafka.test.":         -1, // DNS names: case and a trailing dot do not matter
		"broker-0.kafka.test":           0,
		"broker-7.KAFKA.test":           7,
		"broker-2147483647.kafka.test":  1<<31 - 1, // the largest node id
		"broker-2147483648.kafka.test":  -9,        // past int32
		"broker-07.kafka.test":          -9,        // one name per broker: no leading zero
		"broker--1.kafka.test":          -9,
		"broker-.kafka.test":            -9,
		"broker-1x.kafka.test":          -9,
		"broker-1.kafka.test.evil.com":  -9,
		"x.broker-1.kafka.test":         -9,
		"bootstrap.kafka.test.evil.com": -9,
		"":                              -9,
	} {
		got, err := r.route(name)
		if want == -9 {
			if err == nil || !strings.Contains(err.Error(), ErrSNIUnknown.Error()) {
				t.Errorf("route(%q) = %d, %v; want ErrSNIUnknown", name, got, err)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("route(%q) = %d, %v; want %d", name, got, err, want)
		}
	}
	if h := r.brokerHost(12); h != "broker-12.kafka.test" {
		t.Errorf("brokerHost(12) = %q", h)
	}
	// The token may start the name; the id is still found.
	r, err = newSNIRouter(SNIConfig{BootstrapHost: "kafka.test", BrokerHostPattern: "$(nodeId).brokers.kafka.test"})
	if err != nil {
		t.Fatal(err)
	}
	if id, err := r.route("42.brokers.kafka.test"); err != nil || id != 42 {
		t.Errorf("route = %d, %v; want 42", id, err)
	}
}

func TestSNIConfigValidate(t *testing.T) {
	tlsOn := TLSConfig{Enabled: true, Cert: "c.pem", Key: "k.pem"}
	ok := Config{Upstream: []string{"127.0.0.1:9092"}, Listen: "127.0.0.1:9092", ClientTLS: tlsOn,
		SNI: SNIConfig{BootstrapHost: "bootstrap.kafka.test", BrokerHostPattern: "broker-$(nodeId).kafka.test"}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	label := func(n int) string { return strings.Repeat("b", n) }
	// A label of 63 characters is the limit: 53 + the 10 digits of the largest node id.
	atLimit := ok
	atLimit.SNI.BrokerHostPattern = label(53) + "$(nodeId).kafka.test"
	if err := atLimit.Validate(); err != nil {
		t.Fatalf("a 63-character label: %v", err)
	}
	for name, tc := range map[string]struct {
		mut  func(*Config)
		want string
	}{
		"no token":              {func(c *Config) { c.SNI.BrokerHostPattern = "broker.kafka.test" }, "must contain $(nodeId) exactly once"},
		"two tokens":            {func(c *Config) { c.SNI.BrokerHostPattern = "b$(nodeId)-$(nodeId).kafka.test" }, "must contain $(nodeId) exactly once"},
		"misspelt token":        {func(c *Config) { c.SNI.BrokerHostPattern = "broker-${nodeId}.kafka.test" }, "must contain $(nodeId)"},
		"no bootstrap":          {func(c *Config) { c.SNI.BootstrapHost = "" }, "sni.bootstrap.host"},
		"no pattern":            {func(c *Config) { c.SNI.BrokerHostPattern = "" }, "sni.broker.host.pattern"},
		"no TLS":                {func(c *Config) { c.ClientTLS = TLSConfig{} }, "set tls.client.enabled"},
		"with broker.port.base": {func(c *Config) { c.BrokerPortBase = 19100 }, "remove broker.port.base"},
		"with advertised.host":  {func(c *Config) { c.AdvertisedHost = "proxy" }, "remove advertised.host"},
		"port in pattern":       {func(c *Config) { c.SNI.BrokerHostPattern = "broker-$(nodeId).kafka.test:9092" }, "only letters"},
		"underscore":            {func(c *Config) { c.SNI.BrokerHostPattern = "broker_$(nodeId).kafka.test" }, "only letters"},
		"label too long":        {func(c *Config) { c.SNI.BrokerHostPattern = label(54) + "$(nodeId).kafka.test" }, "1 to 63"},
		"empty label":           {func(c *Config) { c.SNI.BrokerHostPattern = "broker-$(nodeId)..kafka.test" }, "1 to 63"},
		"IP bootstrap":          {func(c *Config) { c.SNI.BootstrapHost = "10.0.0.1" }, "an IP address"},
		"bootstrap is a broker": {func(c *Config) {
			c.SNI.BootstrapHost = "broker-1.kafka.test"
		}, "also the host of broker 1"},
		"advertised port": {func(c *Config) { c.SNI.AdvertisedPort = 65536 }, "sni.advertised.port"},
		"advertised port without sni": {func(c *Config) { c.SNI = SNIConfig{AdvertisedPort: 443} },
			"sni.advertised.port needs"},
	} {
		c := ok
		tc.mut(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one with %q", name, err, tc.want)
		}
	}
}

func TestLoadConfigFileSNI(t *testing.T) {
	c, err := LoadConfigFile(writeYAML(t, `
upstream: [kafka-1:9093]
listen: 0.0.0.0:9092
tls.client: {enabled: true, cert: c.pem, key: k.pem}
sni:
  bootstrap.host: bootstrap.kafka.example.com
  broker.host.pattern: broker-$(nodeId).kafka.example.com
  advertised.port: 443
`))
	if err != nil {
		t.Fatal(err)
	}
	want := SNIConfig{BootstrapHost: "bootstrap.kafka.example.com", BrokerHostPattern: "broker-$(nodeId).kafka.example.com", AdvertisedPort: 443}
	if c.SNI != want {
		t.Fatalf("sni = %+v, want %+v", c.SNI, want)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	path := writeYAML(t, "upstream: [a:1]\nsni.advertised.port: 70000\n")
	if _, err := LoadConfigFile(path); err == nil || !strings.Contains(err.Error(), "sni.advertised.port") {
		t.Fatalf("sni.advertised.port 70000: %v", err)
	}
}

// wildcardCert writes a CA and a certificate for *.domain, signed by it, in
// dir; it returns the cert and key paths and the CA pool.
func wildcardCert(t *testing.T, domain string) (cert, key string, pool *x509.CertPool) {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sni test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	pool = x509.NewCertPool()
	pool.AddCert(ca)
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "*." + domain},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"*." + domain}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key, pool
}

// sniDialer dials every name to addr over TLS, sending the name as SNI:
// what DNS pointing *.kafka.test at the proxy would do.
func sniDialer(addr string, pool *x509.CertPool) func(ctx context.Context, network, host string) (net.Conn, error) {
	return func(ctx context.Context, network, host string) (net.Conn, error) {
		name, _, err := net.SplitHostPort(host)
		if err != nil {
			return nil, err
		}
		d := &tls.Dialer{Config: &tls.Config{ServerName: name, RootCAs: pool, MinVersion: tls.VersionTLS12}}
		return d.DialContext(ctx, network, addr)
	}
}

// Three kfake brokers behind one SNI listener: Metadata names each broker
// broker-N.kafka.test on the listener's port; a connection whose server
// name is broker-N reaches node N (kfake reports which node handled each
// request); records go to and come back from partitions led by every
// broker; names that route nowhere are refused at the handshake and
// counted.
func TestProxySNIRouting(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(6, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cert, key, pool := wildcardCert(t, "kafka.test")
	logs := &logCounter{}
	s, err := New(Config{Upstream: c.ListenAddrs()[:1], Listen: "127.0.0.1:0",
		ClientTLS: TLSConfig{Enabled: true, Cert: cert, Key: key},
		SNI:       SNIConfig{BootstrapHost: "bootstrap.kafka.test", BrokerHostPattern: "broker-$(nodeId).kafka.test"},
		Logger:    slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	_, port, _ := net.SplitHostPort(s.Addr())

	// Which node served each ListGroups request.
	var mu sync.Mutex
	var served []int32
	c.ControlKey(kmsg.ListGroups.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		mu.Lock()
		served = append(served, c.CurrentNode())
		mu.Unlock()
		return nil, nil, false
	})

	cl, err := kgo.NewClient(kgo.SeedBrokers("bootstrap.kafka.test:"+port), kgo.Dialer(sniDialer(s.Addr(), pool)),
		kgo.DefaultProduceTopic("t"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	md, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if len(md.Brokers) != 3 {
		t.Fatalf("metadata names %d brokers, want 3", len(md.Brokers))
	}
	for _, b := range md.Brokers {
		if want := "broker-" + strconv.Itoa(int(b.NodeID)) + ".kafka.test"; b.Host != want || strconv.Itoa(int(b.Port)) != port {
			t.Fatalf("broker %d is %s:%d, want %s:%s", b.NodeID, b.Host, b.Port, want, port)
		}
		if addr, ok := s.BrokerAddr(b.NodeID); !ok || addr != net.JoinHostPort(b.Host, port) {
			t.Fatalf("BrokerAddr(%d) = %q, %v", b.NodeID, addr, ok)
		}
	}
	for _, b := range md.Brokers {
		if _, err := cl.Broker(int(b.NodeID)).Request(ctx, kmsg.NewPtrListGroupsRequest()); err != nil {
			t.Fatalf("ListGroups to broker %d: %v", b.NodeID, err)
		}
		mu.Lock()
		last := served[len(served)-1]
		mu.Unlock()
		if last != b.NodeID {
			t.Fatalf("a request to broker-%d.kafka.test was served by node %d", b.NodeID, last)
		}
	}

	// Records to all six partitions (led by all three brokers) and back.
	var recs []*kgo.Record
	leaders := map[int32]bool{}
	for p := range int32(6) {
		if err := c.MoveTopicPartition("t", p, md.Brokers[int(p)%len(md.Brokers)].NodeID); err != nil {
			t.Fatal(err)
		}
		leaders[c.LeaderFor("t", p)] = true
		recs = append(recs, &kgo.Record{Partition: p, Value: []byte("sni-" + strconv.Itoa(int(p)))})
	}
	if len(leaders) != 3 {
		t.Fatalf("partitions led by %d brokers, want 3", len(leaders))
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers("bootstrap.kafka.test:"+port), kgo.Dialer(sniDialer(s.Addr(), pool)),
		kgo.ConsumeTopics("t"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond)) // Shutdown waits for a fetch in flight
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	got := map[string]bool{}
	for len(got) < len(recs) {
		fs := cons.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("consume: %v (got %d of %d)", err, len(got), len(recs))
		}
		fs.EachRecord(func(r *kgo.Record) { got[string(r.Value)] = true })
	}

	// Refused at the handshake: another name, and no name at all.
	for _, name := range []string{"evil.example.com", ""} {
		conn, err := tls.Dial("tcp", s.Addr(), &tls.Config{ServerName: name, InsecureSkipVerify: true}) //nolint:gosec // the refusal is what is tested
		if err == nil {
			conn.Close()
			t.Fatalf("a client with server name %q was served", name)
		}
	}
	waitMetric := func(kind string, want float64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for testutil.ToFloat64(s.m.errors.WithLabelValues(kind)) != want {
			if time.Now().After(deadline) {
				t.Fatalf("ferry_proxy_errors_total{kind=%q} = %v, want %v", kind, testutil.ToFloat64(s.m.errors.WithLabelValues(kind)), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitMetric("sni_unknown", 1)
	waitMetric("sni_missing", 1)
	waitMetric("client_tls", 0) // counted once, as a refusal

	// A broker name of the pattern that no broker has: served TLS, then
	// closed when its first request cannot reach a broker 99.
	one, err := kgo.NewClient(kgo.SeedBrokers("broker-99.kafka.test:"+port), kgo.Dialer(sniDialer(s.Addr(), pool)),
		kgo.RequestRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	if _, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, one); err == nil {
		t.Fatal("a request to broker-99 was answered")
	}
	// The connection is reset, not closed (upstream.go: resetUnanswered), so
	// franz-go may dial broker-99 again before it gives up: at least once.
	for deadline := time.Now().Add(5 * time.Second); testutil.ToFloat64(s.m.errors.WithLabelValues("unknown_node")) < 1; {
		if time.Now().After(deadline) {
			t.Fatal(`ferry_proxy_errors_total{kind="unknown_node"} stayed 0`)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// More connections naming broker 99: each counted, and one warning
	// line in all (rate-limited like the other refusals), not one each.
	before := testutil.ToFloat64(s.m.errors.WithLabelValues("unknown_node"))
	for range 20 {
		conn, err := tls.Dial("tcp", s.Addr(), &tls.Config{ServerName: "broker-99.kafka.test", RootCAs: pool})
		if err != nil {
			t.Fatal(err)
		}
		_, _ = conn.Write(apiVersionsV0)
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Read(make([]byte, 1)); err == nil {
			t.Fatal("a request to broker-99 was answered")
		}
		conn.Close()
	}
	one.Close() // franz-go may still be dialling broker-99 (counted too)
	for deadline := time.Now().Add(5 * time.Second); testutil.ToFloat64(s.m.errors.WithLabelValues("unknown_node")) < before+20; {
		if time.Now().After(deadline) {
			t.Fatalf(`ferry_proxy_errors_total{kind="unknown_node"} = %v, want at least %v`, testutil.ToFloat64(s.m.errors.WithLabelValues("unknown_node")), before+20)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := logs.count(slog.LevelWarn, "names no broker with this node id"); n != 1 {
		t.Fatalf("%d warnings for connections naming an unknown broker id, want 1 (rate-limited)", n)
	}
	if n := testutil.ToFloat64(s.m.connsTotal.WithLabelValues("broker")); n < 3 {
		t.Fatalf("client_connections_total{listener=broker} = %v, want at least 3", n)
	}
	if n := testutil.ToFloat64(s.m.connsTotal.WithLabelValues("bootstrap")); n < 1 {
		t.Fatalf("client_connections_total{listener=bootstrap} = %v, want at least 1", n)
	}
}
