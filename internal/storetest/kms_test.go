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

// After scripts/object-stores kms-stop an Encrypt fails within seconds, and
// after kms-start the same key works again.
func TestKMSOutage(t *testing.T) {
	k := openKeeper(t, "")
	plain := make([]byte, 32)
	if _, err := rand.Read(plain); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	before, err := k.Encrypt(ctx, plain)
	cancel()
	if err != nil {
		t.Fatalf("Encrypt before the outage: %v", err)
	}

	storetest.KMSStop(t)
	start := time.Now()
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	_, err = k.Encrypt(ctx, plain)
	cancel()
	took := time.Since(start)
	if err == nil {
		t.Fatal("Encrypt succeeded with the KMS server stopped")
	}
	if took > 6*time.Second {
		t.Fatalf("Encrypt failed only after %v with the KMS server stopped", took)
	}
	t.Logf("Encrypt during the outage failed after %v: %v", took.Round(time.Millisecond), err)

	storetest.KMSStart(t)
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	after, err := k.Encrypt(ctx, plain)
	if err != nil {
		t.Fatalf("Encrypt after kms-start: %v", err)
	}
	// The same key material: both ciphertexts decrypt.
	for name, ct := range map[string][]byte{"before": before, "after": after} {
		got, err := k.Decrypt(ctx, ct)
		if err != nil || !bytes.Equal(got, plain) {
			t.Fatalf("Decrypt of the ciphertext made %s the outage: %x, %v", name, got, err)
		}
	}
}
