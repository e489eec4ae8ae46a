package storetest_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"net/url"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kms"
	gcaws "gocloud.dev/aws"
	"gocloud.dev/secrets"
	"gocloud.dev/secrets/awskms"

	"github.com/ferrykit/ferry/internal/faultproxy"
	"github.com/ferrykit/ferry/internal/storetest"
)

func openKeeper(t *testing.T, which string) *secrets.Keeper {
	t.Helper()
	u := storetest.KMSKeyURL(t, which)
	k, err := secrets.OpenKeeper(context.Background(), u)
	if err != nil {
		t.Fatalf("open keeper %s: %v", u, err)
	}
	t.Cleanup(func() { _ = k.Close() })
	return k
}

// The test KMS server's keys work through gocloud.dev/secrets: each
// round-trips 32 bytes, and the server refuses to decrypt a ciphertext of
// alias/ferry-test with alias/ferry-test-other.
//
// Through a gocloud keeper of the other key the same Decrypt succeeds: the
// awskms keeper sends no KeyId with Decrypt, so KMS (AWS's as well as
// local-kms) uses the key named inside the ciphertext. A keeper's URL does not
// limit what it decrypts; the test pins that, so code that relies on it
// learns when it changes.
func TestKMSRoundTrip(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	plain := make([]byte, 32)
	if _, err := rand.Read(plain); err != nil {
		t.Fatal(err)
	}
	keepers := map[string]*secrets.Keeper{}
	cts := map[string][]byte{}
	for _, which := range []string{"", "old", "other"} {
		k := openKeeper(t, which)
		keepers[which] = k
		ct, err := k.Encrypt(ctx, plain)
		if err != nil {
			t.Fatalf("key %q: Encrypt: %v", which, err)
		}
		if bytes.Contains(ct, plain) {
			t.Fatalf("key %q: the ciphertext holds the plaintext", which)
		}
		got, err := k.Decrypt(ctx, ct)
		if err != nil {
			t.Fatalf("key %q: Decrypt: %v", which, err)
		}
		if !bytes.Equal(got, plain) {
			t.Fatalf("key %q: Decrypt gave %x, want %x", which, got, plain)
		}
		cts[which] = ct
	}
	if bytes.Equal(cts[""], cts["other"]) || bytes.Equal(cts[""], cts["old"]) {
		t.Fatal("two keys gave the same ciphertext")
	}

	// Decrypt with the other key named: refused.
	client, err := awskms.Dial(kmsConfig(t, storetest.KMSKeyURL(t, "other")))
	if err != nil {
		t.Fatal(err)
	}
	out, err := client.Decrypt(ctx, &kms.DecryptInput{
		CiphertextBlob: cts[""],
		KeyId:          aws.String("alias/ferry-test-other"),
	})
	if err == nil {
		t.Fatalf("KMS decrypted a ciphertext of alias/ferry-test with alias/ferry-test-other (to %x)", out.Plaintext)
	}
	t.Logf("Decrypt with alias/ferry-test-other named: %v", err)
	// A damaged ciphertext: refused.
	bad := bytes.Clone(cts[""])
	bad[len(bad)-1] ^= 1
	if got, err := keepers[""].Decrypt(ctx, bad); err == nil {
		t.Fatalf("Decrypt of a damaged ciphertext gave %x", got)
	}

	// The keeper of the other key: decrypts with the key in the ciphertext.
	got, err := keepers["other"].Decrypt(ctx, cts[""])
	if err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("the awskms keeper of alias/ferry-test-other on a ciphertext of alias/ferry-test: %x, %v; "+
			"it used to decrypt it (no KeyId sent): if that changed, update this test and the doc of storetest.KMSKeyURL", got, err)
	}
}

// kmsConfig is the AWS config the awskms URL opener makes of keyURL's query.
func kmsConfig(t *testing.T, keyURL string) aws.Config {
	t.Helper()
	u, err := url.Parse(keyURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := gcaws.V2ConfigFromURLParams(context.Background(), u.Query())
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// A KMS outage through storetest.KMSKeyURLViaFaultProxy: with the fault
// proxy dropping connections unanswered or answering 503, Encrypt and Decrypt through
// the proxied URL fail within seconds, while the shared server still serves
// the direct URL (other tests and packages use it meanwhile); once the fault
// is cleared the proxied URL works again, with the same key material as the
// direct one.
func TestKMSOutage(t *testing.T) {
	viaURL, fp := storetest.KMSKeyURLViaFaultProxy(t, "")
	via, err := secrets.OpenKeeper(context.Background(), viaURL)
	if err != nil {
		t.Fatalf("open keeper %s: %v", viaURL, err)
	}
	t.Cleanup(func() { _ = via.Close() })
	direct := openKeeper(t, "")
	plain := make([]byte, 32)
	if _, err := rand.Read(plain); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	before, err := via.Encrypt(ctx, plain)
	cancel()
	if err != nil {
		t.Fatalf("Encrypt through the fault proxy before the outage: %v", err)
	}
	if fp.Count(faultproxy.Pass) == 0 {
		t.Fatal("the proxied key URL did not go through the fault proxy")
	}

	for _, fault := range []struct {
		name string
		mode faultproxy.Mode
	}{{"connection dropped unanswered", faultproxy.Down}, {"503", faultproxy.Throttle}} {
		fp.Set(fault.mode, -1)
		seen := fp.Count(fault.mode)
		for op, call := range map[string]func(context.Context) error{
			"Encrypt": func(ctx context.Context) error { _, err := via.Encrypt(ctx, plain); return err },
			"Decrypt": func(ctx context.Context) error { _, err := via.Decrypt(ctx, before); return err },
		} {
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := call(ctx)
			cancel()
			took := time.Since(start)
			if err == nil {
				t.Fatalf("%s: %s succeeded through the failing proxy", fault.name, op)
			}
			if took > 9*time.Second {
				t.Fatalf("%s: %s failed only after %v", fault.name, op, took)
			}
			t.Logf("%s: %s failed after %v: %v", fault.name, op, took.Round(time.Millisecond), err)
		}
		if fp.Count(fault.mode) == seen {
			t.Fatalf("%s: the fault proxy saw no request in that mode", fault.name)
		}
		// The shared server is up all along for everyone else.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		got, err := direct.Decrypt(ctx, before)
		cancel()
		if err != nil || !bytes.Equal(got, plain) {
			t.Fatalf("%s: the direct key URL failed during the proxied outage: %x, %v", fault.name, got, err)
		}
	}

	fp.Set(faultproxy.Pass, -1)
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	after, err := via.Encrypt(ctx, plain)
	if err != nil {
		t.Fatalf("Encrypt once the fault is cleared: %v", err)
	}
	// The same key material, through the proxy and directly.
	for name, ct := range map[string][]byte{"before": before, "after": after} {
		for kname, k := range map[string]*secrets.Keeper{"proxied": via, "direct": direct} {
			got, err := k.Decrypt(ctx, ct)
			if err != nil || !bytes.Equal(got, plain) {
				t.Fatalf("Decrypt (%s keeper) of the ciphertext made %s the outage: %x, %v", kname, name, got, err)
			}
		}
	}
}
