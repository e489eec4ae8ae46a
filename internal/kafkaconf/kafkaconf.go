// Package kafkaconf maps a Kafka client's security properties — the keys of
// a Java client.properties or a librdkafka configuration — onto franz-go
// options: TLS (kgo.DialTLSConfig) and SASL (kgo.SASL with franz-go's
// pkg/sasl/plain, scram and oauth). It is the one place where Ferry reads
// these keys: the ferry CLI (produce, consume, gc) and the proxy's own
// admin client both build their security from here.
//
// Keys (docs/SECURITY.md has the table):
//
//   - security.protocol: PLAINTEXT (default), SSL, SASL_PLAINTEXT, SASL_SSL.
//   - sasl.mechanism: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER
//     (required with a SASL protocol: Kafka's default, GSSAPI, is not
//     supported).
//   - Java style: sasl.jaas.config (PlainLoginModule and ScramLoginModule
//     with username/password, ScramLoginModule's tokenauth; for
//     OAuthBearerLoginModule Ferry's options token="…" or tokenFile="…"),
//     sasl.oauthbearer.token.endpoint.url=file:… (a token file, as Java's
//     OAuthBearerLoginCallbackHandler reads it), ssl.truststore.location,
//     .password, .type (PEM or PKCS12; JKS is refused), ssl.truststore.certificates
//     (inline PEM), ssl.keystore.location, .password, .type (PEM or PKCS12),
//     ssl.keystore.certificate.chain and ssl.keystore.key (inline PEM),
//     ssl.key.password, ssl.endpoint.identification.algorithm (https, the
//     default, or empty: no host name check, as in Java).
//   - librdkafka style: sasl.username, sasl.password, ssl.ca.location (a
//     PEM file or a folder of them), ssl.ca.pem, ssl.certificate.location,
//     ssl.key.location, ssl.certificate.pem, ssl.key.pem, ssl.key.password,
//     enable.ssl.certificate.verification (true by default; false: no
//     certificate check at all).
//
// Anything that cannot be honoured is an *Error, never a silent downgrade:
// an unsupported mechanism or store type, an ssl.* or sasl.* key with a
// protocol that does not use it, a file that cannot be read.
package kafkaconf

import (
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
)

// Property keys, as Kafka's Java client and librdkafka name them.
const (
	KeySecurityProtocol   = "security.protocol"
	KeySASLMechanism      = "sasl.mechanism"
	KeySASLJAASConfig     = "sasl.jaas.config"
	KeySASLUsername       = "sasl.username"
	KeySASLPassword       = "sasl.password"
	KeyOAuthTokenEndpoint = "sasl.oauthbearer.token.endpoint.url"
	KeyLoginCallback      = "sasl.login.callback.handler.class"

	KeyTruststoreLocation     = "ssl.truststore.location"
	KeyTruststorePassword     = "ssl.truststore.password"
	KeyTruststoreType         = "ssl.truststore.type"
	KeyTruststoreCertificates = "ssl.truststore.certificates"
	KeyKeystoreLocation       = "ssl.keystore.location"
	KeyKeystorePassword       = "ssl.keystore.password"
	KeyKeystoreType           = "ssl.keystore.type"
	KeyKeystoreChain          = "ssl.keystore.certificate.chain"
	KeyKeystoreKey            = "ssl.keystore.key"
	KeyKeyPassword            = "ssl.key.password"
	KeyEndpointIdentification = "ssl.endpoint.identification.algorithm"

	KeyCALocation          = "ssl.ca.location"
	KeyCAPEM               = "ssl.ca.pem"
	KeyCertificateLocation = "ssl.certificate.location"
	KeyCertificatePEM      = "ssl.certificate.pem"
	KeyKeyLocation         = "ssl.key.location"
	KeyKeyPEM              = "ssl.key.pem"
	KeyEnableVerification  = "enable.ssl.certificate.verification"
)

// Security protocols (security.protocol).
const (
	Plaintext     = "PLAINTEXT"
	SSL           = "SSL"
	SASLPlaintext = "SASL_PLAINTEXT"
	SASLSSL       = "SASL_SSL"
)

// SASL mechanisms (sasl.mechanism).
const (
	MechPlain       = "PLAIN"
	MechScramSHA256 = "SCRAM-SHA-256"
	MechScramSHA512 = "SCRAM-SHA-512"
	MechOAuthBearer = "OAUTHBEARER"
)

var sslKeys = []string{
	KeyTruststoreLocation, KeyTruststorePassword, KeyTruststoreType, KeyTruststoreCertificates,
	KeyKeystoreLocation, KeyKeystorePassword, KeyKeystoreType, KeyKeystoreChain, KeyKeystoreKey, KeyKeyPassword,
	KeyEndpointIdentification,
	KeyCALocation, KeyCAPEM, KeyCertificateLocation, KeyCertificatePEM, KeyKeyLocation, KeyKeyPEM, KeyEnableVerification,
}

var saslKeys = []string{
	KeySASLMechanism, KeySASLJAASConfig, KeySASLUsername, KeySASLPassword, KeyOAuthTokenEndpoint, KeyLoginCallback,
}

// Keys returns every key Parse reads, sorted.
func Keys() []string {
	k := append(append([]string{KeySecurityProtocol}, sslKeys...), saslKeys...)
	slices.Sort(k)
	return k
}

// Handles reports whether Parse reads key.
func Handles(key string) bool {
	return key == KeySecurityProtocol || slices.Contains(sslKeys, key) || slices.Contains(saslKeys, key)
}

// ErrUnsupported marks a value Ferry recognises but cannot honour (GSSAPI,
// a JKS store, an HTTP token endpoint, an encrypted PEM key…).
var ErrUnsupported = errors.New("not supported by ferry")

// Error is a security property that cannot be applied: Key names it, Err
// says why (errors.Is(err, ErrUnsupported) for values Ferry cannot honour).
type Error struct {
	Key string
	Err error
}

func (e *Error) Error() string { return e.Key + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

func errorf(key, format string, args ...any) error {
	return &Error{Key: key, Err: fmt.Errorf(format, args...)}
}

// Security is what Parse made of the properties.
type Security struct {
	// Protocol is security.protocol, upper case.
	Protocol string
	// TLS is the client TLS configuration; nil unless Protocol is SSL or
	// SASL_SSL.
	TLS *tls.Config
	// SASL is the mechanism to authenticate with; nil unless Protocol is
	// SASL_PLAINTEXT or SASL_SSL.
	SASL sasl.Mechanism
	// Mechanism is sasl.mechanism, upper case ("" without SASL); User the
	// user name it logs in as ("" for OAUTHBEARER). For messages.
	Mechanism, User string
}

// Opts returns the franz-go options of s: kgo.DialTLSConfig and kgo.SASL
// as needed (none for PLAINTEXT). franz-go fills in the TLS server name
// from each broker's host when the config has none.
func (s *Security) Opts() []kgo.Opt {
	var opts []kgo.Opt
	if s.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(s.TLS))
	}
	if s.SASL != nil {
		opts = append(opts, kgo.SASL(s.SASL))
	}
	return opts
}

// String describes s for log lines and error messages, without secrets:
// "SASL_SSL (SCRAM-SHA-256 as alice)".
func (s *Security) String() string {
	switch {
	case s.Mechanism == "":
		return s.Protocol
	case s.User == "":
		return fmt.Sprintf("%s (%s)", s.Protocol, s.Mechanism)
	}
	return fmt.Sprintf("%s (%s as %s)", s.Protocol, s.Mechanism, s.User)
}

// Parse reads the security keys of p (other keys are left alone) and builds
// the TLS config and SASL mechanism they describe, reading the files they
// name. Values are trimmed; protocol, mechanism and store types are case
// insensitive.
//
// Errors (*Error naming the key): an unknown protocol or mechanism, an
// unsupported one (ErrUnsupported: GSSAPI, JKS, an HTTP token endpoint), an
// ssl.* key without SSL or a sasl.* key without SASL in security.protocol,
// missing credentials, a file that cannot be read or parsed, a wrong store
// password.
func Parse(p map[string]string) (*Security, error) {
	pr := props(p)
	s := &Security{Protocol: strings.ToUpper(pr.get(KeySecurityProtocol))}
	if s.Protocol == "" {
		s.Protocol = Plaintext
	}
	var useTLS, useSASL bool
	switch s.Protocol {
	case Plaintext:
	case SSL:
		useTLS = true
	case SASLPlaintext:
		useSASL = true
	case SASLSSL:
		useTLS, useSASL = true, true
	default:
		return nil, errorf(KeySecurityProtocol, "%q: want PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL", p[KeySecurityProtocol])
	}
	for _, k := range slices.Sorted(maps.Keys(p)) {
		if !useTLS && slices.Contains(sslKeys, k) {
			return nil, errorf(k, "set, but security.protocol is %s: the connection would not use TLS (set security.protocol=SSL or SASL_SSL, or remove the key)", s.Protocol)
		}
		if !useSASL && slices.Contains(saslKeys, k) {
			return nil, errorf(k, "set, but security.protocol is %s: the connection would not authenticate with SASL (set security.protocol=SASL_PLAINTEXT or SASL_SSL, or remove the key)", s.Protocol)
		}
	}
	var err error
	if useTLS {
		if s.TLS, err = parseTLS(pr); err != nil {
			return nil, err
		}
	}
	if useSASL {
		a, err := parseSASL(pr)
		if err != nil {
			return nil, err
		}
		if s.SASL, err = NewMechanism(a); err != nil {
			return nil, err
		}
		s.Mechanism, s.User = a.Mechanism, a.Username
	}
	return s, nil
}

// props are the properties as given; get trims a value, has tells whether a
// key was given at all (an empty value can mean something, as for
// ssl.endpoint.identification.algorithm).
type props map[string]string

func (p props) get(k string) string { return strings.TrimSpace(p[k]) }
func (p props) has(k string) bool   { _, ok := p[k]; return ok }

// Misspelled returns the key Parse reads that k is one edit (an insertion,
// deletion, substitution or swap of neighbours) away from, if k is not a
// key itself: a misspelled security key (securty.protocol=SASL_SSL) would
// otherwise be ignored and the client would connect without TLS or SASL.
func Misspelled(k string) (string, bool) {
	if Handles(k) {
		return "", false
	}
	for _, known := range Keys() {
		if oneEdit(k, known) {
			return known, true
		}
	}
	return "", false
}

// oneEdit reports whether a and b differ by exactly one edit (Damerau:
// a swap of neighbours counts as one).
func oneEdit(a, b string) bool {
	if len(a) > len(b) {
		a, b = b, a
	}
	switch len(b) - len(a) {
	case 0:
		i := 0
		for i < len(a) && a[i] == b[i] {
			i++
		}
		if i == len(a) {
			return false // equal
		}
		if a[i+1:] == b[i+1:] {
			return true // substitution
		}
		return i+1 < len(a) && a[i] == b[i+1] && a[i+1] == b[i] && a[i+2:] == b[i+2:]
	case 1:
		i := 0
		for i < len(a) && a[i] == b[i] {
			i++
		}
		return a[i:] == b[i+1:]
	}
	return false
}
