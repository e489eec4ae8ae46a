package kafkaconf

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"software.sslmate.com/src/go-pkcs12"
)

// pki is a test CA with a server certificate (for serverName) and a client
// certificate, written as PEM and PKCS12 files.
type pki struct {
	dir                         string
	caPEM, caP12, jks           string
	serverCert                  tls.Certificate
	clientPEM, clientKey        string
	clientP12, clientBundlePEM  string
	encryptedKey                string
	ca                          *x509.Certificate
	caKey                       *ecdsa.PrivateKey
	otherServerCert             tls.Certificate // signed by another CA
	caPEMText, clientCertPEMTxt string
	clientKeyPEMText            string
}

const p12Pass = "store-secret"

func newPKI(t *testing.T, serverName string) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir()}
	p.ca, p.caKey = makeCA(t, "ferry test CA")
	p.serverCert = leaf(t, p.ca, p.caKey, serverName, true)
	client := leaf(t, p.ca, p.caKey, "client", false)
	otherCA, otherKey := makeCA(t, "other CA")
	p.otherServerCert = leaf(t, otherCA, otherKey, serverName, true)

	p.caPEMText = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.ca.Raw}))
	p.caPEM = p.write(t, "ca.pem", []byte(p.caPEMText))
	ts, err := pkcs12.Modern.EncodeTrustStore([]*x509.Certificate{p.ca}, p12Pass)
	if err != nil {
		t.Fatal(err)
	}
	p.caP12 = p.write(t, "truststore.p12", ts)
	p.jks = p.write(t, "truststore.jks", append(append([]byte{}, jksMagic...), 0, 0, 0, 2))

	keyDER, err := x509.MarshalPKCS8PrivateKey(client.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	p.clientCertPEMTxt = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: client.Certificate[0]}))
	p.clientKeyPEMText = string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	p.clientPEM = p.write(t, "client.pem", []byte(p.clientCertPEMTxt))
	p.clientKey = p.write(t, "client.key", []byte(p.clientKeyPEMText))
	p.clientBundlePEM = p.write(t, "client-bundle.pem", []byte(p.clientKeyPEMText+p.clientCertPEMTxt))
	p.encryptedKey = p.write(t, "enc.key", pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: []byte{1, 2, 3}}))
	ks, err := pkcs12.Modern.Encode(client.PrivateKey, client.Leaf, []*x509.Certificate{p.ca}, p12Pass)
	if err != nil {
		t.Fatal(err)
	}
	p.clientP12 = p.write(t, "keystore.p12", ks)
	return p
}

func (p *pki) write(t *testing.T, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

var serial int64

func makeCA(t *testing.T, cn string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c, key
}

func leaf(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, name string, server bool) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{name}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: c}
}

// initial returns the first SASL message the mechanism sends.
func initial(t *testing.T, s *Security) string {
	t.Helper()
	_, msg, err := s.SASL.Authenticate(context.Background(), "broker:9092")
	if err != nil {
		t.Fatalf("Authenticate: %v", err)
	}
	return string(msg)
}

func TestParse(t *testing.T) {
	p := newPKI(t, "broker.test")
	tokenFile := p.write(t, "token", []byte("  eyJ.file.token\n"))
	emptyToken := p.write(t, "empty-token", []byte("\n"))
	caDir := filepath.Join(p.dir, "cas")
	if err := os.Mkdir(caDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(caDir, "ca.crt"), []byte(p.caPEMText), 0o600); err != nil {
		t.Fatal(err)
	}
	jaas := func(module, opts string) string {
		return "org.apache.kafka.common.security." + module + " required " + opts + ";"
	}

	type check func(t *testing.T, s *Security)
	hasRoots := func(t *testing.T, s *Security) {
		t.Helper()
		if s.TLS == nil || s.TLS.RootCAs == nil {
			t.Fatalf("want TLS with the test CA as roots, got %+v", s.TLS)
		}
		if _, err := p.serverCert.Leaf.Verify(x509.VerifyOptions{Roots: s.TLS.RootCAs, DNSName: "broker.test"}); err != nil {
			t.Fatalf("roots do not verify the broker certificate: %v", err)
		}
	}
	hasClientCert := func(t *testing.T, s *Security) {
		t.Helper()
		if s.TLS == nil || len(s.TLS.Certificates) != 1 {
			t.Fatalf("want one client certificate, got %+v", s.TLS)
		}
	}
	mech := func(name, first string) check {
		return func(t *testing.T, s *Security) {
			t.Helper()
			if s.SASL == nil || s.SASL.Name() != name {
				t.Fatalf("mechanism: want %s, got %v", name, s.SASL)
			}
			if first != "" && !strings.Contains(initial(t, s), first) {
				t.Fatalf("first message %q does not contain %q", initial(t, s), first)
			}
		}
	}
	all := func(cs ...check) check {
		return func(t *testing.T, s *Security) {
			t.Helper()
			for _, c := range cs {
				c(t, s)
			}
		}
	}

	cases := []struct {
		name    string
		props   map[string]string
		check   check
		wantErr string // substring; "" means success
		key     string // the *Error key expected
		unsupp  bool   // errors.Is(err, ErrUnsupported)
	}{
		{name: "default plaintext", props: map[string]string{"bootstrap.servers": "b:9092"},
			check: func(t *testing.T, s *Security) {
				if s.Protocol != Plaintext || s.TLS != nil || s.SASL != nil || len(s.Opts()) != 0 {
					t.Fatalf("want plain PLAINTEXT, got %+v", s)
				}
			}},
		{name: "SSL with system roots", props: map[string]string{"security.protocol": "ssl"},
			check: func(t *testing.T, s *Security) {
				if s.TLS == nil || s.TLS.RootCAs != nil || s.TLS.InsecureSkipVerify || len(s.Opts()) != 1 {
					t.Fatalf("want TLS with system roots, got %+v", s.TLS)
				}
			}},
		{name: "java PEM truststore", props: map[string]string{"security.protocol": "SSL", "ssl.truststore.location": p.caPEM, "ssl.truststore.type": "PEM"}, check: hasRoots},
		{name: "java PKCS12 truststore", props: map[string]string{"security.protocol": "SSL", "ssl.truststore.location": p.caP12, "ssl.truststore.password": p12Pass, "ssl.truststore.type": "PKCS12"}, check: hasRoots},
		{name: "PKCS12 truststore type guessed", props: map[string]string{"security.protocol": "SSL", "ssl.truststore.location": p.caP12, "ssl.truststore.password": p12Pass}, check: hasRoots},
		{name: "PKCS12 truststore wrong password", props: map[string]string{"security.protocol": "SSL", "ssl.truststore.location": p.caP12, "ssl.truststore.password": "nope"},
			wantErr: "PKCS12 trust store", key: KeyTruststoreLocation},
		{name: "JKS truststore refused", props: map[string]string{"security.protocol": "SSL", "ssl.truststore.location": p.jks},
			wantErr: "keytool -importkeystore", key: KeyTruststoreLocation, unsupp: true},
		{name: "JKS type refused", props: map[string]string{"security.protocol": "SSL", "ssl.truststore.location": p.caP12, "ssl.truststore.type": "JKS"},
			wantErr: "JKS", key: KeyTruststoreLocation, unsupp: true},
		{name: "truststore missing file", props: map[string]string{"security.protocol": "SSL", "ssl.truststore.location": "/nonexistent/ts.p12"},
			wantErr: "no such file", key: KeyTruststoreLocation},
		{name: "inline truststore certificates", props: map[string]string{"security.protocol": "SSL", "ssl.truststore.certificates": p.caPEMText}, check: hasRoots},
		{name: "librdkafka ca file", props: map[string]string{"security.protocol": "SSL", "ssl.ca.location": p.caPEM}, check: hasRoots},
		{name: "librdkafka ca folder", props: map[string]string{"security.protocol": "SSL", "ssl.ca.location": caDir}, check: hasRoots},
		{name: "librdkafka ca pem", props: map[string]string{"security.protocol": "SSL", "ssl.ca.pem": p.caPEMText}, check: hasRoots},
		{name: "ca file not PEM", props: map[string]string{"security.protocol": "SSL", "ssl.ca.location": p.caP12},
			wantErr: "no PEM certificate", key: KeyCALocation},
		{name: "java PKCS12 keystore (mTLS)", props: map[string]string{"security.protocol": "SSL", "ssl.truststore.location": p.caPEM,
			"ssl.keystore.location": p.clientP12, "ssl.keystore.password": p12Pass, "ssl.keystore.type": "PKCS12"},
			check: all(hasRoots, hasClientCert, func(t *testing.T, s *Security) {
				if len(s.TLS.Certificates[0].Certificate) != 2 {
					t.Fatalf("want leaf + CA in the chain, got %d", len(s.TLS.Certificates[0].Certificate))
				}
			})},
		{name: "PKCS12 keystore wrong password", props: map[string]string{"security.protocol": "SSL", "ssl.keystore.location": p.clientP12, "ssl.keystore.password": "x"},
			wantErr: "PKCS12 key store", key: KeyKeystoreLocation},
		{name: "java PEM keystore", props: map[string]string{"security.protocol": "SSL", "ssl.keystore.location": p.clientBundlePEM, "ssl.keystore.type": "PEM"}, check: hasClientCert},
		{name: "java inline keystore", props: map[string]string{"security.protocol": "SSL", "ssl.keystore.certificate.chain": p.clientCertPEMTxt, "ssl.keystore.key": p.clientKeyPEMText}, check: hasClientCert},
		{name: "java inline keystore half", props: map[string]string{"security.protocol": "SSL", "ssl.keystore.certificate.chain": p.clientCertPEMTxt},
			wantErr: "go together", key: KeyKeystoreChain},
		{name: "librdkafka cert and key", props: map[string]string{"security.protocol": "SSL", "ssl.certificate.location": p.clientPEM, "ssl.key.location": p.clientKey}, check: hasClientCert},
		{name: "librdkafka inline cert and key", props: map[string]string{"security.protocol": "SSL", "ssl.certificate.pem": p.clientCertPEMTxt, "ssl.key.pem": p.clientKeyPEMText}, check: hasClientCert},
		{name: "librdkafka cert without key", props: map[string]string{"security.protocol": "SSL", "ssl.certificate.location": p.clientPEM},
			wantErr: "go together", key: KeyCertificateLocation},
		{name: "encrypted PEM key refused", props: map[string]string{"security.protocol": "SSL", "ssl.certificate.location": p.clientPEM, "ssl.key.location": p.encryptedKey, "ssl.key.password": "k"},
			wantErr: "encrypted PEM private key", key: KeyKeyLocation, unsupp: true},
		{name: "hostname check off (java empty)", props: map[string]string{"security.protocol": "SSL", "ssl.ca.location": p.caPEM, "ssl.endpoint.identification.algorithm": ""},
			check: func(t *testing.T, s *Security) {
				if !s.TLS.InsecureSkipVerify || s.TLS.VerifyConnection == nil {
					t.Fatal("want the name check off and the chain checked in VerifyConnection")
				}
			}},
		{name: "hostname check https", props: map[string]string{"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "HTTPS"},
			check: func(t *testing.T, s *Security) {
				if s.TLS.InsecureSkipVerify || s.TLS.VerifyConnection != nil {
					t.Fatal("want full verification")
				}
			}},
		{name: "hostname algorithm unknown", props: map[string]string{"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "dns"},
			wantErr: "want https or empty", key: KeyEndpointIdentification},
		{name: "verification off", props: map[string]string{"security.protocol": "SSL", "enable.ssl.certificate.verification": "false"},
			check: func(t *testing.T, s *Security) {
				if !s.TLS.InsecureSkipVerify || s.TLS.VerifyConnection != nil {
					t.Fatal("want no verification")
				}
			}},
		{name: "verification not a bool", props: map[string]string{"security.protocol": "SSL", "enable.ssl.certificate.verification": "maybe"},
			wantErr: "want true or false", key: KeyEnableVerification},

		{name: "java PLAIN", props: map[string]string{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
			"sasl.jaas.config": jaas("plain.PlainLoginModule", `username="alice" password="alice-secret"`)},
			check: all(mech("PLAIN", "\x00alice\x00alice-secret"), func(t *testing.T, s *Security) {
				if s.TLS != nil || s.String() != "SASL_PLAINTEXT (PLAIN as alice)" {
					t.Fatalf("got %s, TLS %v", s, s.TLS)
				}
			})},
		{name: "java SCRAM-SHA-256 over SSL", props: map[string]string{"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
			"sasl.jaas.config": jaas("scram.ScramLoginModule", `username="bob" password="p\"w;d"`), "ssl.truststore.location": p.caP12, "ssl.truststore.password": p12Pass},
			check: all(hasRoots, mech("SCRAM-SHA-256", "n=bob,"), func(t *testing.T, s *Security) {
				if len(s.Opts()) != 2 {
					t.Fatalf("want TLS and SASL options, got %d", len(s.Opts()))
				}
			})},
		{name: "java SCRAM-SHA-512 unquoted and tokenauth", props: map[string]string{"security.protocol": "SASL_SSL", "sasl.mechanism": "scram-sha-512",
			"sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required\n username=bob\n password=x tokenauth=true ;"},
			check: mech("SCRAM-SHA-512", "tokenauth=true")},
		{name: "librdkafka SCRAM", props: map[string]string{"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "alice", "sasl.password": "s", "ssl.ca.location": p.caPEM},
			check: all(hasRoots, mech("SCRAM-SHA-256", "n=alice,"))},
		{name: "librdkafka PLAIN", props: map[string]string{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "alice", "sasl.password": "s"},
			check: mech("PLAIN", "\x00alice\x00s")},
		{name: "jaas and username both", props: map[string]string{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "a",
			"sasl.jaas.config": jaas("plain.PlainLoginModule", `username="alice" password="x"`)},
			wantErr: "use one style", key: KeySASLJAASConfig},
		{name: "jaas module does not match mechanism", props: map[string]string{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
			"sasl.jaas.config": jaas("plain.PlainLoginModule", `username="alice" password="x"`)},
			wantErr: "does not serve sasl.mechanism", key: KeySASLJAASConfig},
		{name: "jaas unknown module", props: map[string]string{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
			"sasl.jaas.config": `com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true;`},
			wantErr: "Krb5LoginModule", key: KeySASLJAASConfig, unsupp: true},
		{name: "jaas unknown option", props: map[string]string{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
			"sasl.jaas.config": jaas("plain.PlainLoginModule", `username="alice" pasword="x"`)},
			wantErr: "option pasword", key: KeySASLJAASConfig},
		{name: "jaas missing semicolon", props: map[string]string{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
			"sasl.jaas.config": `org.apache.kafka.common.security.plain.PlainLoginModule required username="alice"`},
			wantErr: "missing ';'", key: KeySASLJAASConfig},
		{name: "jaas two modules", props: map[string]string{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
			"sasl.jaas.config": jaas("plain.PlainLoginModule", `username="a"`) + jaas("plain.PlainLoginModule", `username="b"`)},
			wantErr: "more than one login module", key: KeySASLJAASConfig},
		{name: "jaas unterminated quote", props: map[string]string{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
			"sasl.jaas.config": `org.apache.kafka.common.security.plain.PlainLoginModule required username="alice;`},
			wantErr: "unterminated", key: KeySASLJAASConfig},
		{name: "jaas stray value not echoed", props: map[string]string{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
			"sasl.jaas.config": jaas("plain.PlainLoginModule", `username="alice" "TopSecret"`)},
			wantErr: "a value where an option name belongs", key: KeySASLJAASConfig},
		{name: "jaas unquoted value with a space not echoed", props: map[string]string{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
			"sasl.jaas.config": jaas("plain.PlainLoginModule", `username="alice" password=Top TopSecret`)},
			wantErr: "option 3 of", key: KeySASLJAASConfig},
		{name: "jaas stray word not echoed", props: map[string]string{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
			"sasl.jaas.config": jaas("plain.PlainLoginModule", `username="alice" password="x" TopSecret`)},
			wantErr: "option 3 of", key: KeySASLJAASConfig},
		{name: "jaas option without value", props: map[string]string{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
			"sasl.jaas.config": jaas("plain.PlainLoginModule", `username="alice" password`)},
			wantErr: `want password="value"`, key: KeySASLJAASConfig},
		{name: "no user", props: map[string]string{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"},
			wantErr: "needs a user name", key: KeySASLMechanism},
		{name: "GSSAPI refused", props: map[string]string{"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"},
			wantErr: "GSSAPI", key: KeySASLMechanism, unsupp: true},
		{name: "mechanism missing", props: map[string]string{"security.protocol": "SASL_SSL", "sasl.username": "a"},
			wantErr: "required with a SASL", key: KeySASLMechanism},
		{name: "mechanism unknown", props: map[string]string{"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-1", "sasl.username": "a"},
			wantErr: `"SCRAM-SHA-1"`, key: KeySASLMechanism},

		{name: "oauth static token", props: map[string]string{"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
			"sasl.jaas.config": jaas("oauthbearer.OAuthBearerLoginModule", `token="eyJ.static.token"`)},
			check: mech("OAUTHBEARER", "auth=Bearer eyJ.static.token")},
		{name: "oauth token file", props: map[string]string{"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
			"sasl.jaas.config": jaas("oauthbearer.OAuthBearerLoginModule", `tokenFile="`+tokenFile+`"`)},
			check: mech("OAUTHBEARER", "auth=Bearer eyJ.file.token\x01")},
		{name: "oauth java file endpoint", props: map[string]string{"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
			"sasl.jaas.config":                    jaas("oauthbearer.OAuthBearerLoginModule", ""),
			"sasl.login.callback.handler.class":   "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
			"sasl.oauthbearer.token.endpoint.url": "file://" + tokenFile},
			check: mech("OAUTHBEARER", "auth=Bearer eyJ.file.token\x01")},
		{name: "oauth endpoint without jaas", props: map[string]string{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
			"sasl.oauthbearer.token.endpoint.url": "file:" + tokenFile},
			check: mech("OAUTHBEARER", "eyJ.file.token")},
		{name: "oauth http endpoint refused", props: map[string]string{"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
			"sasl.oauthbearer.token.endpoint.url": "https://idp.example/token"},
			wantErr: "only a file: URL", key: KeyOAuthTokenEndpoint, unsupp: true},
		{name: "oauth no token", props: map[string]string{"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
			"sasl.jaas.config": jaas("oauthbearer.OAuthBearerLoginModule", "")},
			wantErr: "OAUTHBEARER needs exactly one token source", key: KeySASLMechanism},
		{name: "oauth unsecured login refused", props: map[string]string{"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
			"sasl.jaas.config": jaas("oauthbearer.OAuthBearerLoginModule", `unsecuredLoginStringClaim_sub="alice"`)},
			wantErr: "unsecured OAUTHBEARER", key: KeySASLJAASConfig, unsupp: true},
		{name: "oauth empty token file", props: map[string]string{"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
			"sasl.jaas.config": jaas("oauthbearer.OAuthBearerLoginModule", `tokenFile="`+emptyToken+`"`)},
			wantErr: "is empty", key: KeySASLMechanism},
		{name: "custom callback class refused", props: map[string]string{"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "a",
			"sasl.login.callback.handler.class": "com.example.MyHandler"},
			wantErr: "com.example.MyHandler", key: KeyLoginCallback, unsupp: true},

		{name: "protocol unknown", props: map[string]string{"security.protocol": "TLS"},
			wantErr: "want PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL", key: KeySecurityProtocol},
		{name: "ssl key without SSL", props: map[string]string{"ssl.truststore.location": p.caPEM},
			wantErr: "would not use TLS", key: KeyTruststoreLocation},
		{name: "ssl key with SASL_PLAINTEXT", props: map[string]string{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "a", "ssl.ca.location": p.caPEM},
			wantErr: "would not use TLS", key: KeyCALocation},
		{name: "sasl key without SASL", props: map[string]string{"security.protocol": "SSL", "sasl.mechanism": "PLAIN"},
			wantErr: "would not authenticate with SASL", key: KeySASLMechanism},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse(tc.props)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				tc.check(t, s)
				return
			}
			if err == nil {
				t.Fatalf("want an error containing %q, got %s", tc.wantErr, s)
			}
			var ke *Error
			if !errors.As(err, &ke) || ke.Key != tc.key {
				t.Fatalf("want *Error for key %s, got %T %v", tc.key, err, err)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %q does not contain %q", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), "TopSecret") {
				t.Fatalf("a secret is echoed: %v", err)
			}
			if errors.Is(err, ErrUnsupported) != tc.unsupp {
				t.Fatalf("errors.Is(ErrUnsupported) = %v, want %v (%v)", !tc.unsupp, tc.unsupp, err)
			}
		})
	}
}

// TestHostnameCheckOff handshakes with a real TLS server whose certificate
// names another host: refused by default, accepted with
// ssl.endpoint.identification.algorithm= (the chain is still checked: a
// certificate from another CA is refused), accepted by anything with
// enable.ssl.certificate.verification=false.
func TestHostnameCheckOff(t *testing.T) {
	p := newPKI(t, "broker.test")
	serve := func(cert tls.Certificate) string {
		ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					_ = c.(*tls.Conn).Handshake()
					c.Close()
				}()
			}
		}()
		return ln.Addr().String()
	}
	good, other := serve(p.serverCert), serve(p.otherServerCert)
	dial := func(props map[string]string, addr string) error {
		s, err := Parse(props)
		if err != nil {
			t.Fatal(err)
		}
		cfg := s.TLS.Clone()
		cfg.ServerName = "127.0.0.1" // as franz-go sets it from the address
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
		if err == nil {
			c.Close()
		}
		return err
	}
	base := map[string]string{"security.protocol": "SSL", "ssl.truststore.location": p.caPEM}
	with := func(k, v string) map[string]string {
		m := map[string]string{k: v}
		for k, v := range base {
			m[k] = v
		}
		return m
	}
	if err := dial(base, good); err == nil || !strings.Contains(err.Error(), "127.0.0.1") {
		t.Fatalf("default: want a host name error, got %v", err)
	}
	if err := dial(with(KeyEndpointIdentification, ""), good); err != nil {
		t.Fatalf("name check off, same CA: %v", err)
	}
	if err := dial(with(KeyEndpointIdentification, ""), other); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("name check off, other CA: want unknown authority, got %v", err)
	}
	if err := dial(with(KeyEnableVerification, "false"), other); err != nil {
		t.Fatalf("verification off: %v", err)
	}
}

func TestKeysAndHandles(t *testing.T) {
	for _, k := range Keys() {
		if !Handles(k) {
			t.Fatalf("Handles(%s) = false", k)
		}
	}
	if Handles("bootstrap.servers") || Handles("ssl.cipher.suites") {
		t.Fatal("Handles claims a key Parse does not read")
	}
	if n := len(Keys()); n != 25 {
		t.Fatalf("Keys: %d keys, want 25 (update the docs' table too)", n)
	}
}

func TestMisspelled(t *testing.T) {
	for k, want := range map[string]string{
		"securty.protocol":    KeySecurityProtocol,
		"security.protocoll":  KeySecurityProtocol,
		"secruity.protocol":   KeySecurityProtocol,
		"security_protocol":   KeySecurityProtocol,
		"sasl.mechanisms":     KeySASLMechanism, // librdkafka's plural spelling
		"ssl.ca.locaton":      KeyCALocation,
		"sasl.jaas.confg":     KeySASLJAASConfig,
		"security.protocol":   "", // a key itself
		"ssl.crl.location":    "", // librdkafka's, two edits from ssl.ca.location
		"ssl.cipher.suites":   "",
		"client.id":           "",
		"ssl.keystore.type":   "",
		"ssl.truststore.type": "",
	} {
		got, ok := Misspelled(k)
		if got != want || ok != (want != "") {
			t.Errorf("Misspelled(%q) = %q, %v; want %q", k, got, ok, want)
		}
	}
}
