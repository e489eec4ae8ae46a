package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferrykit/ferry/proxy"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// testPKI writes a CA, a server certificate for 127.0.0.1/localhost and a
// client certificate, all signed by the CA, as PEM files in dir.
type testPKI struct {
	dir                                                 string
	caPEM, serverCert, serverKey, clientCert, clientKey string
	pool                                                *x509.CertPool
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	p := &testPKI{dir: dir}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ferry test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	p.pool = x509.NewCertPool()
	p.pool.AddCert(caCert)
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	p.caPEM = write("ca.pem", "CERTIFICATE", caDER)
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "EC PRIVATE KEY", kder)
	}
	p.serverCert, p.serverKey = leaf("server", 2, x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = leaf("client", 3, x509.ExtKeyUsageClientAuth)
	return p
}

// TLS on both sides of the proxy, with client certificates required:
// a client speaks TLS to proxy A (tls.client, client.auth required), which
// forwards to the broker; proxy B (plaintext to its clients) reaches proxy A
// over TLS (tls.upstream with a client certificate). A franz-go client
// produces and consumes through A directly and through B→A.
func TestProxyTLS(t *testing.T) {
	pki := newTestPKI(t)
	a := startProxyServer(t, proxy.Config{Upstream: proxy.SplitList(brokers(t)),
		ClientTLS: proxy.TLSConfig{Enabled: true, Cert: pki.serverCert, Key: pki.serverKey, CA: pki.caPEM, ClientAuth: "required"}})
	cert, err := tls.LoadX509KeyPair(pki.clientCert, pki.clientKey)
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg := &tls.Config{RootCAs: pki.pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}

	t.Run("client to proxy", func(t *testing.T) {
		cl := proxyClient(t, a.Addr(), nil, kgo.DialTLSConfig(tlsCfg))
		if _, err := kmsg.NewPtrMetadataRequest().RequestWith(ctxT(t, 30*time.Second), cl); err != nil {
			t.Fatal(err)
		}
		produceConsumeWith(t, a.Addr(), nil, 20, []kgo.Opt{kgo.DialTLSConfig(tlsCfg)})
	})
	t.Run("client without certificate is refused", func(t *testing.T) {
		noCert := &tls.Config{RootCAs: pki.pool, MinVersion: tls.VersionTLS12}
		cl := proxyClient(t, a.Addr(), nil, kgo.DialTLSConfig(noCert), kgo.RequestRetries(0))
		if _, err := kmsg.NewPtrMetadataRequest().RequestWith(ctxT(t, 5*time.Second), cl); err == nil {
			t.Fatal("a client without a certificate was served")
		}
	})
	t.Run("proxy to proxy over TLS", func(t *testing.T) {
		b := startProxyServer(t, proxy.Config{Upstream: []string{a.Addr()},
			UpstreamTLS: proxy.TLSConfig{Enabled: true, CA: pki.caPEM, Cert: pki.clientCert, Key: pki.clientKey}})
		produceConsume(t, b.Addr(), nil, 20)
	})
}
