package schemareg

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
)

// Connection keys of a schema registry client, in Confluent's serializer
// names. Both the proxy's validate-schema interceptor and the serde
// chain's schema stages read them.
const (
	// KeyURL is the registry's Confluent-compatible base URL (required);
	// several, comma-separated, are tried in order.
	KeyURL = "schema.registry.url"
	// KeyBasicAuthSource is Confluent's basic.auth.credentials.source:
	// USER_INFO (basic.auth.user.info), URL (the user info of the URL) or
	// unset (no authentication unless the URL carries user info).
	KeyBasicAuthSource = "basic.auth.credentials.source"
	// KeyBasicAuthUserInfo is "user:password" for USER_INFO.
	KeyBasicAuthUserInfo = "basic.auth.user.info"
	// KeyTruststore is a PEM file of CA certificates the registry's TLS
	// certificate must chain to (default: the system's).
	KeyTruststore = "schema.registry.ssl.truststore.location"
	// KeyTruststoreType must be PEM when set (JKS and PKCS12 stores are not
	// read).
	KeyTruststoreType = "schema.registry.ssl.truststore.type"
	// KeyTimeout bounds each registry call, in ms (default 3000).
	KeyTimeout = "schema.registry.request.timeout.ms"
	// KeyCacheMax bounds the cache of parsed schemas, subject registrations
	// and latest versions, in bytes (default 67108864, 64 MiB); a schema
	// over a sixteenth of it is refused.
	KeyCacheMax = "schema.registry.cache.max.bytes"
)

// Defaults of the connection keys and of Limits.
const (
	DefaultTimeout  = 3 * time.Second
	DefaultCacheMax = 64 << 20
	// DefaultMaxDepth is Jackson's JSON nesting bound.
	DefaultMaxDepth = 1000
	DefaultMaxItems = 10_000_000
	// DefaultMaxMessages bounds the Protobuf messages (nested ones and map
	// entries) of one payload: each costs a dynamicpb message, about 350
	// bytes, though it may take 2 bytes of the payload.
	DefaultMaxMessages = 1_000_000
	minCacheMax        = 64 << 10
)

// ConnectionKeys are the keys FromProps reads.
var ConnectionKeys = []string{KeyURL, KeyBasicAuthSource, KeyBasicAuthUserInfo, KeyTruststore,
	KeyTruststoreType, KeyTimeout, KeyCacheMax}

// FromProps reads a Config from Kafka-style properties: the connection keys
// above, and Limits at their defaults (the caller may change them). The
// transport is the client's own, for CloseIdleConnections when done.
// Errors name the key and its value.
func FromProps(props map[string]string, userAgent string) (Config, *http.Transport, error) {
	cl, tr, err := client(props, userAgent)
	if err != nil {
		return Config{}, nil, err
	}
	timeout, err := IntKey(props, KeyTimeout, DefaultTimeout.Milliseconds(), 1, 3_600_000)
	if err != nil {
		return Config{}, nil, err
	}
	cacheMax, err := IntKey(props, KeyCacheMax, DefaultCacheMax, minCacheMax, 1<<40)
	if err != nil {
		return Config{}, nil, err
	}
	first, _ := url.Parse(strings.TrimSpace(strings.Split(props[KeyURL], ",")[0]))
	first.User = nil // credentials stay out of messages
	return Config{Client: cl, URL: first.String(), Timeout: time.Duration(timeout) * time.Millisecond, CacheMaxBytes: cacheMax,
		Limits: Limits{MaxDepth: DefaultMaxDepth, MaxItems: DefaultMaxItems, MaxMessages: DefaultMaxMessages}}, tr, nil
}

// client builds the sr client from the connection keys.
func client(props map[string]string, userAgent string) (*sr.Client, *http.Transport, error) {
	raw := strings.TrimSpace(props[KeyURL])
	if raw == "" {
		return nil, nil, fmt.Errorf("%s is required", KeyURL)
	}
	var urls []string
	var urlUser *url.Userinfo
	for _, s := range strings.Split(raw, ",") {
		u, err := url.Parse(strings.TrimSpace(s))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, nil, fmt.Errorf("%s: %q is not an http or https URL", KeyURL, s)
		}
		if u.User != nil {
			urlUser, u.User = u.User, nil
		}
		urls = append(urls, u.String())
	}
	opts := []sr.ClientOpt{sr.URLs(urls...), sr.UserAgent(userAgent)}
	switch src := strings.ToUpper(strings.TrimSpace(props[KeyBasicAuthSource])); src {
	case "", "URL":
		if urlUser != nil {
			pass, _ := urlUser.Password()
			opts = append(opts, sr.BasicAuth(urlUser.Username(), pass))
		}
	case "USER_INFO":
		user, pass, ok := strings.Cut(props[KeyBasicAuthUserInfo], ":")
		if !ok {
			return nil, nil, fmt.Errorf("%s: want user:password for %s=USER_INFO", KeyBasicAuthUserInfo, KeyBasicAuthSource)
		}
		opts = append(opts, sr.BasicAuth(user, pass))
	default:
		return nil, nil, fmt.Errorf("%s: %q is not USER_INFO or URL", KeyBasicAuthSource, props[KeyBasicAuthSource])
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if t := strings.TrimSpace(props[KeyTruststoreType]); t != "" && !strings.EqualFold(t, "PEM") {
		return nil, nil, fmt.Errorf("%s: %q: only PEM truststores are read", KeyTruststoreType, t)
	}
	if f := strings.TrimSpace(props[KeyTruststore]); f != "" {
		pem, err := os.ReadFile(f)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", KeyTruststore, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, nil, fmt.Errorf("%s: %s holds no PEM certificate", KeyTruststore, f)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	opts = append(opts, sr.HTTPClient(&http.Client{Transport: tr}))
	cl, err := sr.NewClient(opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", KeyURL, err)
	}
	return cl, tr, nil
}

// IntKey reads an integer key between lo and hi (def when unset).
func IntKey(props map[string]string, key string, def, lo, hi int64) (int64, error) {
	v := strings.TrimSpace(props[key])
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s: %q is not an integer between %d and %d", key, props[key], lo, hi)
	}
	return n, nil
}
