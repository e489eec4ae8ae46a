package kafkaconf

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"software.sslmate.com/src/go-pkcs12"
)

// maxStoreBytes bounds a trust or key store file read into memory.
const maxStoreBytes = 16 << 20

// jksMagic opens a Java KeyStore (JKS) file.
var jksMagic = []byte{0xFE, 0xED, 0xFE, 0xED}

// parseTLS builds the client TLS config: roots from the truststore and CA
// keys (none: the system's), a client certificate from the keystore or
// certificate/key keys, and the verification switches.
func parseTLS(p props) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	roots, err := loadRoots(p)
	if err != nil {
		return nil, err
	}
	cfg.RootCAs = roots
	if cert, err := loadClientCert(p); err != nil {
		return nil, err
	} else if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	verify := true
	if v := p.get(KeyEnableVerification); v != "" {
		if verify, err = strconv.ParseBool(v); err != nil {
			return nil, errorf(KeyEnableVerification, "%q: want true or false", v)
		}
	}
	checkHost := true
	switch alg := p.get(KeyEndpointIdentification); strings.ToLower(alg) {
	case "https":
	case "", "none":
		// Java: an empty value disables the host name check, not the
		// chain check. Only an explicit empty value does: absent is https.
		checkHost = !p.has(KeyEndpointIdentification)
	default:
		return nil, errorf(KeyEndpointIdentification, "%q: want https or empty (no host name check)", alg)
	}
	switch {
	case !verify:
		cfg.InsecureSkipVerify = true //nolint:gosec // the user's explicit enable.ssl.certificate.verification=false
	case !checkHost:
		// Verify the chain against the roots but not the name, as Java does
		// with ssl.endpoint.identification.algorithm= (crypto/tls has no
		// switch for just the name: skip its check and redo the chain here).
		cfg.InsecureSkipVerify = true //nolint:gosec // chain verified in VerifyConnection
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("tls: the broker sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter})
			return err
		}
	}
	return cfg, nil
}

// loadRoots reads every trust source given; nil when none is.
func loadRoots(p props) (*x509.CertPool, error) {
	var certs []*x509.Certificate
	if loc := p.get(KeyTruststoreLocation); loc != "" {
		c, err := readTruststore(loc, p.get(KeyTruststorePassword), p.get(KeyTruststoreType))
		if err != nil {
			return nil, &Error{Key: KeyTruststoreLocation, Err: err}
		}
		certs = append(certs, c...)
	} else if p.get(KeyTruststorePassword) != "" {
		return nil, errorf(KeyTruststorePassword, "set without %s", KeyTruststoreLocation)
	}
	for _, k := range []string{KeyTruststoreCertificates, KeyCAPEM} {
		if v := p.get(k); v != "" {
			c, err := pemCerts([]byte(v))
			if err != nil {
				return nil, &Error{Key: k, Err: err}
			}
			certs = append(certs, c...)
		}
	}
	if loc := p.get(KeyCALocation); loc != "" {
		c, err := readCALocation(loc)
		if err != nil {
			return nil, &Error{Key: KeyCALocation, Err: err}
		}
		certs = append(certs, c...)
	}
	if len(certs) == 0 {
		return nil, nil
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool, nil
}

func readFile(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.Size() > maxStoreBytes {
		return nil, fmt.Errorf("%s: %d bytes, more than %d", path, fi.Size(), maxStoreBytes)
	}
	return os.ReadFile(path)
}

// storeType is the type of a store file: the configured one (PEM, PKCS12,
// JKS), else guessed from its first bytes.
func storeType(data []byte, typ string) string {
	typ = strings.ToUpper(strings.TrimSpace(typ))
	if typ == "" {
		switch {
		case bytes.HasPrefix(data, jksMagic):
			typ = "JKS"
		case bytes.Contains(data, []byte("-----BEGIN ")):
			typ = "PEM"
		default:
			typ = "PKCS12"
		}
	}
	return typ
}

var errJKS = fmt.Errorf("JKS stores are %w: convert with keytool -importkeystore -srckeystore FILE -destkeystore FILE.p12 -deststoretype PKCS12, or use PEM", ErrUnsupported)

func readTruststore(path, password, typ string) ([]*x509.Certificate, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	switch t := storeType(data, typ); t {
	case "PEM":
		return pemCerts(data)
	case "PKCS12":
		certs, err := pkcs12.DecodeTrustStore(data, password)
		if err != nil {
			return nil, fmt.Errorf("%s: PKCS12 trust store: %w", path, err)
		}
		if len(certs) == 0 {
			return nil, fmt.Errorf("%s: PKCS12 trust store holds no trusted certificate", path)
		}
		return certs, nil
	case "JKS":
		return nil, fmt.Errorf("%s: %w", path, errJKS)
	default:
		return nil, fmt.Errorf("%s: ssl.truststore.type %q: want PEM or PKCS12", path, t)
	}
}

// readCALocation reads librdkafka's ssl.ca.location: a PEM file, or a
// folder whose *.pem, *.crt and *.cer files are read.
func readCALocation(path string) ([]*x509.Certificate, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		data, err := readFile(path)
		if err != nil {
			return nil, err
		}
		return pemCerts(data)
	}
	var certs []*x509.Certificate
	for _, pat := range []string{"*.pem", "*.crt", "*.cer"} {
		files, _ := filepath.Glob(filepath.Join(path, pat))
		for _, f := range files {
			data, err := readFile(f)
			if err != nil {
				return nil, err
			}
			c, err := pemCerts(data)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			certs = append(certs, c...)
		}
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("folder %s holds no PEM certificate (*.pem, *.crt, *.cer)", path)
	}
	return certs, nil
}

// pemCerts parses every CERTIFICATE block of data.
func pemCerts(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, err
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return certs, nil
}

// loadClientCert reads the client certificate for mutual TLS, if any.
func loadClientCert(p props) (*tls.Certificate, error) {
	keyPass := p.get(KeyKeyPassword)
	if loc := p.get(KeyKeystoreLocation); loc != "" {
		data, err := readFile(loc)
		if err != nil {
			return nil, &Error{Key: KeyKeystoreLocation, Err: err}
		}
		switch t := storeType(data, p.get(KeyKeystoreType)); t {
		case "PEM":
			c, err := pemKeyPair(data, data, keyPass)
			if err != nil {
				return nil, &Error{Key: KeyKeystoreLocation, Err: fmt.Errorf("%s: %w", loc, err)}
			}
			return c, nil
		case "PKCS12":
			key, leaf, chain, err := pkcs12.DecodeChain(data, p.get(KeyKeystorePassword))
			if err != nil {
				return nil, &Error{Key: KeyKeystoreLocation, Err: fmt.Errorf("%s: PKCS12 key store: %w", loc, err)}
			}
			c := &tls.Certificate{PrivateKey: key, Leaf: leaf, Certificate: [][]byte{leaf.Raw}}
			for _, ca := range chain {
				c.Certificate = append(c.Certificate, ca.Raw)
			}
			return c, nil
		case "JKS":
			return nil, &Error{Key: KeyKeystoreLocation, Err: fmt.Errorf("%s: %w", loc, errJKS)}
		default:
			return nil, errorf(KeyKeystoreType, "%q: want PEM or PKCS12", t)
		}
	}
	for _, pair := range [][2]string{{KeyKeystoreChain, KeyKeystoreKey}, {KeyCertificatePEM, KeyKeyPEM}} {
		if cert, key := p.get(pair[0]), p.get(pair[1]); cert != "" || key != "" {
			if cert == "" || key == "" {
				return nil, errorf(pair[0], "%s and %s go together", pair[0], pair[1])
			}
			c, err := pemKeyPair([]byte(cert), []byte(key), keyPass)
			if err != nil {
				return nil, &Error{Key: pair[0], Err: err}
			}
			return c, nil
		}
	}
	if cert, key := p.get(KeyCertificateLocation), p.get(KeyKeyLocation); cert != "" || key != "" {
		if cert == "" || key == "" {
			return nil, errorf(KeyCertificateLocation, "%s and %s go together", KeyCertificateLocation, KeyKeyLocation)
		}
		cb, err := readFile(cert)
		if err != nil {
			return nil, &Error{Key: KeyCertificateLocation, Err: err}
		}
		kb, err := readFile(key)
		if err != nil {
			return nil, &Error{Key: KeyKeyLocation, Err: err}
		}
		c, err := pemKeyPair(cb, kb, keyPass)
		if err != nil {
			return nil, &Error{Key: KeyKeyLocation, Err: fmt.Errorf("%s / %s: %w", cert, key, err)}
		}
		return c, nil
	}
	return nil, nil
}

// pemKeyPair pairs the certificates of certPEM with the private key of
// keyPEM (they may be the same bytes). Encrypted PEM keys are refused.
func pemKeyPair(certPEM, keyPEM []byte, keyPass string) (*tls.Certificate, error) {
	for rest := keyPEM; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type == "ENCRYPTED PRIVATE KEY" || b.Headers["Proc-Type"] != "" {
			return nil, fmt.Errorf("an encrypted PEM private key (ssl.key.password) is %w: store the key unencrypted with restricted file permissions, or use a PKCS12 key store", ErrUnsupported)
		}
	}
	_ = keyPass // only meaningful for encrypted keys, refused above
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	return &c, nil
}
