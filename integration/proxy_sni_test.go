package integration

// SNI routing against the real broker: one TLS listener of the proxy serves
// the bootstrap and every broker, and the server name each client sends in
// its TLS handshake picks the broker. kcat, Kafka's Java console tools and
// franz-go produce and consume through that one port.
//
// The names (bootstrap.ferry-sni.test, broker-N.ferry-sni.test) must resolve
// to the proxy. franz-go dials them with a kgo.Dialer; kcat and Java run in a
// private mount namespace whose /etc/hosts maps them to 127.0.0.1 (unshare
// --mount, then a bind mount: the tests run as root). Without root or
// unshare those parts skip.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/proxy"
)

const (
	sniDomain    = "ferry-sni.test"
	sniBootstrap = "bootstrap." + sniDomain
	sniPattern   = "broker-" + proxy.NodeIDToken + "." + sniDomain
)

// sniSetup is a proxy routing by SNI in front of the real broker.
type sniSetup struct {
	s         *proxy.Server
	port      string
	bootstrap string // bootstrap.ferry-sni.test:port
	caPEM     string // the CA of the proxy's wildcard certificate
	pool      *x509.CertPool
	hosts     string // a hosts file naming the proxy for every SNI name
}

// startSNIProxy starts a proxy with tls.client (a certificate for
// *.ferry-sni.test) and sni.* on 127.0.0.1:0.
func startSNIProxy(t *testing.T) *sniSetup {
	t.Helper()
	caPEM, cert, key, pool := wildcardPKI(t, sniDomain)
	s := startProxyServer(t, proxy.Config{Upstream: realAddrs(t),
		ClientTLS: proxy.TLSConfig{Enabled: true, Cert: cert, Key: key},
		SNI:       proxy.SNIConfig{BootstrapHost: sniBootstrap, BrokerHostPattern: sniPattern}})
	_, port, _ := net.SplitHostPort(s.Addr())
	// The hosts file names the bootstrap and every broker of the cluster.
	md, err := kmsg.NewPtrMetadataRequest().RequestWith(ctxT(t, 30*time.Second), client(t))
	if err != nil {
		t.Fatal(err)
	}
	hosts := "127.0.0.1 localhost\n::1 localhost\n127.0.0.1 " + sniBootstrap
	for _, b := range md.Brokers {
		hosts += " broker-" + strconv.Itoa(int(b.NodeID)) + "." + sniDomain
	}
	path := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(path, []byte(hosts+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return &sniSetup{s: s, port: port, bootstrap: net.JoinHostPort(sniBootstrap, port), caPEM: caPEM, pool: pool, hosts: path}
}

// wildcardPKI writes a CA and a server certificate for *.domain signed by
// it (PEM) and returns the CA file, the certificate and key files and the
// CA as a pool.
func wildcardPKI(t *testing.T, domain string) (caPEM, cert, key string, pool *x509.CertPool) {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ferry SNI test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(2 * time.Hour), IsCA: true,
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
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(2 * time.Hour),
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
	write := func(name, typ string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("cert.pem", "CERTIFICATE", der), write("key.pem", "EC PRIVATE KEY", kder), pool
}

// dialer connects every name to the proxy's one port over TLS, sending the
// name as SNI and checking the certificate against it; what a client
// receives goes through scan (nil: none).
func (x *sniSetup) dialer(scan *portScanner) func(ctx context.Context, network, host string) (net.Conn, error) {
	return func(ctx context.Context, network, host string) (net.Conn, error) {
		name, _, err := net.SplitHostPort(host)
		if err != nil {
			return nil, err
		}
		d := &tls.Dialer{Config: &tls.Config{ServerName: name, RootCAs: x.pool, MinVersion: tls.VersionTLS12}}
		c, err := d.DialContext(ctx, network, x.s.Addr())
		if err != nil || scan == nil {
			return c, err
		}
		return &scanConn{Conn: c, s: scan}, nil
	}
}

// metric reads one sample of the proxy's /metrics (0 when absent).
func (x *sniSetup) metric(t *testing.T, series string) float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	x.s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(rec.Body.String())
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// inHostsNamespace makes the clients named by the env vars FERRY_KCAT (kcat)
// and FERRY_PYTHON (confluent-kafka) and the `java` on PATH run in a private mount namespace whose /etc/hosts
// is x.hosts, for the rest of the test: each becomes a small script that
// runs the real one through unshare. It skips the test when that cannot
// work here (not root, no unshare, mounts not allowed).
func (x *sniSetup) inHostsNamespace(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SNI client tests need root: each client runs in a private mount namespace (unshare --mount) with its own /etc/hosts")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("SNI client tests need unshare (util-linux) to give each client its own /etc/hosts")
	}
	// The script's $0 is the hosts file; the client and its arguments follow.
	const script = `mount --bind "$0" /etc/hosts && exec "$@"`
	if out, err := exec.Command(unshare, "--mount", "sh", "-c", script, x.hosts, "true").CombinedOutput(); err != nil {
		t.Skipf("SNI client tests: unshare --mount with a bind mount of /etc/hosts fails here: %v %s", err, out)
	}
	dir := t.TempDir()
	wrap := func(name, real string) string {
		p := filepath.Join(dir, name)
		body := fmt.Sprintf("#!/bin/sh\nexec %s --mount sh -c '%s' %s %s \"$@\"\n", unshare, script, x.hosts, real)
		if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if os.Getenv("FERRY_KCAT") != "" || hasCmd("kcat") {
		t.Setenv("FERRY_KCAT", wrap("kcat", kcatPath(t)))
	}
	if py := os.Getenv("FERRY_PYTHON"); py != "" {
		t.Setenv("FERRY_PYTHON", wrap("python", py))
	}
	if java, err := exec.LookPath("java"); err == nil {
		wrap("java", java)
		t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	}
}

func hasCmd(name string) bool {
	_, err := exec.LookPath(name)
	return err == nil
}

// franz-go through the SNI listener: Metadata, FindCoordinator and
// DescribeCluster name broker-N.ferry-sni.test on the one port; records
// make the round trip; no response carries the real broker's address; the
// proxy opened no listener of its own for a broker.
func TestProxySNIFranzGo(t *testing.T) {
	x := startSNIProxy(t)
	scan := &portScanner{}
	opts := []kgo.Opt{kgo.Dialer(x.dialer(scan))}
	cl := proxyClient(t, x.bootstrap, nil, opts...)
	ctx := ctxT(t, time.Minute)
	md, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if len(md.Brokers) == 0 {
		t.Fatal("metadata names no broker")
	}
	for _, b := range md.Brokers {
		want := "broker-" + strconv.Itoa(int(b.NodeID)) + "." + sniDomain
		if b.Host != want || strconv.Itoa(int(b.Port)) != x.port {
			t.Fatalf("metadata: broker %d at %s:%d, want %s:%s", b.NodeID, b.Host, b.Port, want, x.port)
		}
	}
	fc := kmsg.NewPtrFindCoordinatorRequest()
	fc.CoordinatorKeys = []string{"ferry-sni-group"}
	fcr, err := fc.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range fcr.Coordinators {
		if c.ErrorCode == 0 && (!strings.HasSuffix(c.Host, "."+sniDomain) || strconv.Itoa(int(c.Port)) != x.port) {
			t.Fatalf("coordinator at %s:%d, want a broker-N.%s:%s", c.Host, c.Port, sniDomain, x.port)
		}
	}
	dc, err := kmsg.NewPtrDescribeClusterRequest().RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range dc.Brokers {
		if !strings.HasPrefix(b.Host, "broker-") || strconv.Itoa(int(b.Port)) != x.port {
			t.Fatalf("DescribeCluster: broker %d at %s:%d", b.NodeID, b.Host, b.Port)
		}
	}
	produceConsumeWith(t, x.bootstrap, nil, 50, opts)
	if n := scan.check(t, realAddrs(t)); n == 0 {
		t.Fatal("the client received nothing")
	}
	if n := x.metric(t, `ferry_proxy_client_connections_total{listener="broker"}`); n == 0 {
		t.Fatal("no connection was routed to a broker by its server name")
	}
	if n := x.metric(t, "ferry_proxy_broker_listeners"); n != 0 {
		t.Fatalf("ferry_proxy_broker_listeners = %v with SNI routing, want 0", n)
	}
}

// kcat (librdkafka), Kafka's Java console tools and Python confluent-kafka
// produce and consume
// through the SNI listener, resolving the names through their own
// /etc/hosts; franz-go reads back what each wrote. A client that connects
// by IP address (no SNI) is refused and counted.
func TestProxySNIClients(t *testing.T) {
	x := startSNIProxy(t)
	x.inHostsNamespace(t)
	viaOpts := []kgo.Opt{kgo.Dialer(x.dialer(nil))}
	readBack := func(t *testing.T, topic string, n int) []clientRecord {
		t.Helper()
		return fromKgo(proxyRecords(t, x.bootstrap, topic, n, viaOpts...))
	}

	t.Run("kcat", func(t *testing.T) {
		kcat := kcatPath(t)
		tlsArgs := []string{"-X", "security.protocol=ssl", "-X", "ssl.ca.location=" + x.caPEM}
		topic := clientTopic(t, 3, nil)
		headers := []clientHeader{{Key: "client", Value: []byte("kcat-sni")}}
		want := binaryRecords(11, 30, "kcat-sni", "\t\n", headers)
		before := x.metric(t, `ferry_proxy_client_connections_total{listener="broker"}`)
		kcatProduce(t, x.bootstrap, topic, want, headers, append(tlsArgs, "-X", "enable.idempotence=true")...)
		sameRecords(t, "kcat consume", kcatConsume(t, x.bootstrap, topic, tlsArgs...), want)
		sameRecords(t, "franz-go consume", readBack(t, topic, len(want)), want)
		if after := x.metric(t, `ferry_proxy_client_connections_total{listener="broker"}`); after <= before {
			t.Fatalf("kcat made no connection routed to a broker by SNI (%v before, %v after)", before, after)
		}

		md := runClient(t, nil, kcat, append([]string{"-L", "-J", "-b", x.bootstrap, "-t", topic}, tlsArgs...)...)
		var meta struct {
			Brokers []struct{ Name string } `json:"brokers"`
		}
		if err := json.Unmarshal(md, &meta); err != nil {
			t.Fatalf("kcat -L -J: %v\n%s", err, md)
		}
		if len(meta.Brokers) == 0 {
			t.Fatalf("kcat -L names no broker:\n%s", md)
		}
		for _, b := range meta.Brokers {
			if !regexp.MustCompile(`^broker-\d+\.` + regexp.QuoteMeta(sniDomain) + `:` + x.port + `$`).MatchString(b.Name) {
				t.Fatalf("kcat -L: broker %q, want broker-N.%s:%s", b.Name, sniDomain, x.port)
			}
		}
		noRealBrokerPort(t, x.bootstrap, "kcat -L", md)

		// By IP address: no server name, refused at the handshake.
		missing := x.metric(t, `ferry_proxy_errors_total{kind="sni_missing"}`)
		_, stderr, err := runClientErr(nil, kcat, append([]string{"-L", "-b", net.JoinHostPort("127.0.0.1", x.port), "-m", "3"}, tlsArgs...)...)
		if err == nil {
			t.Fatal("kcat without SNI was served")
		}
		if got := x.metric(t, `ferry_proxy_errors_total{kind="sni_missing"}`); got <= missing {
			t.Fatalf("ferry_proxy_errors_total{kind=sni_missing} = %v, not above %v; kcat said:\n%s", got, missing, tail(stderr))
		}
	})

	t.Run("java", func(t *testing.T) {
		kafkaToolsCP(t)
		tlsProps := []string{"security.protocol=SSL", "ssl.truststore.type=PEM", "ssl.truststore.location=" + x.caPEM}
		var args []string
		for _, p := range tlsProps {
			args = append(args, "--command-property", p)
		}
		topic := clientTopic(t, 3, nil)
		want := textRecords(12, 30, "java-sni")
		before := x.metric(t, `ferry_proxy_client_connections_total{listener="broker"}`)
		javaProduce(t, x.bootstrap, topic, want, args...)
		sameRecords(t, "java console consumer", javaConsume(t, x.bootstrap, topic, len(want), args...), want)
		sameRecords(t, "franz-go consume", readBack(t, topic, len(want)), want)
		if after := x.metric(t, `ferry_proxy_client_connections_total{listener="broker"}`); after <= before {
			t.Fatalf("java made no connection routed to a broker by SNI (%v before, %v after)", before, after)
		}
		// The Java admin client's view: every broker by its SNI name.
		av := javaBrokerAPIVersionsRun(t, x.bootstrap, tlsProps...)
		if !bytes.Contains(av, []byte("broker-")) || !bytes.Contains(av, []byte("."+sniDomain+":"+x.port)) {
			t.Fatalf("kafka-broker-api-versions does not name broker-N.%s:%s:\n%s", sniDomain, x.port, tail(av))
		}
		noRealBrokerPort(t, x.bootstrap, "kafka-broker-api-versions", av)
	})

	t.Run("python", func(t *testing.T) {
		pythonPath(t)
		props := []string{"security.protocol=SSL", "ssl.ca.location=" + x.caPEM}
		topic := clientTopic(t, 3, nil)
		headers := []clientHeader{{Key: "client", Value: []byte("python-sni")}}
		want := binaryRecords(13, 30, "python-sni", "", headers)
		pyProduce(t, x.bootstrap, topic, want, append(props, "enable.idempotence=true")...)
		sameRecords(t, "python consume", pyConsume(t, x.bootstrap, topic, props...), want)
		sameRecords(t, "franz-go consume", readBack(t, topic, len(want)), want)
	})
}
