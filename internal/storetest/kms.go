package storetest

import (
	"net/url"
	"testing"

	"github.com/ferrykit/ferry/internal/faultproxy"
)

// KMSKeyURL returns the gocloud.dev/secrets URL (awskms://alias/...?region=
// ...&endpoint=...) of one of the three AES keys seeded in the test KMS server
// (local-kms, started by scripts/object-stores): which is "" for
// alias/ferry-test, "old" for alias/ferry-test-old, "other" for
// alias/ferry-test-other. The keeper finds its credentials in
// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (local-kms takes any). Without
// the servers' environment the test skips, and under CI it fails (NeedEnv).
//
// The keeper of such a URL decrypts a ciphertext of any of the keys: gocloud's
// awskms sends no KeyId with Decrypt, so KMS uses the key the ciphertext
// names (so does AWS KMS). Only Encrypt is bound to the URL's key.
func KMSKeyURL(t testing.TB, which string) string {
	t.Helper()
	var name string
	switch which {
	case "":
		name = "FERRY_KMS_KEY_URL"
	case "old":
		name = "FERRY_KMS_KEY_URL_OLD"
	case "other":
		name = "FERRY_KMS_KEY_URL_OTHER"
	default:
		t.Fatalf("storetest.KMSKeyURL: unknown key %q (want \"\", \"old\" or \"other\")", which)
	}
	return NeedEnv(t, name, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")[0]
}

// KMSKeyURLViaFaultProxy is KMSKeyURL reached through a fault proxy
// (internal/faultproxy) in front of the test KMS server: the URL names the
// same key with the proxy as its endpoint, so a test can make the KMS
// refuse connections (faultproxy.Down), throttle (Throttle, 503) or hang
// (Slow) for its own keepers alone. (Stopping the shared server would be an
// outage for every package go test runs beside it.) The key id Ferry
// derives from the URL (envelope.KeyIDOf) leaves the query out, so what is
// sealed through the proxy opens with the direct URL and the other way
// round. The proxy passes the client's Host header on (local-kms checks no
// signature, and AWS SigV4 signs the Host) and is closed at the end of the
// test.
func KMSKeyURLViaFaultProxy(t testing.TB, which string) (keyURL string, fp *faultproxy.Proxy) {
	t.Helper()
	direct := KMSKeyURL(t, which)
	endpoint := NeedEnv(t, "FERRY_KMS_ENDPOINT")[0]
	fp, err := faultproxy.New(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fp.Close)
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatalf("%s: %v", direct, err)
	}
	q := u.Query()
	if q.Get("endpoint") == "" {
		t.Fatalf("storetest.KMSKeyURLViaFaultProxy: %s names no endpoint", direct)
	}
	q.Set("endpoint", fp.URL())
	u.RawQuery = q.Encode()
	return u.String(), fp
}
