//go:build !ferry_nocloud

package payloadstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferrykit/ferry/envelope"
	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/payloadstore"
)

func randomKeyURL() string {
	k := make([]byte, 32)
	rand.Read(k)
	return "base64key://" + base64.URLEncoding.EncodeToString(k)
}

// encrypt wraps s with a keyring over keyURL (and the policy, as
// largemessage.Config.OpenStore does).
func encrypt(t *testing.T, s payloadstore.PayloadStore, cfg envelope.Config, allowPlain bool) payloadstore.PayloadStore {
	t.Helper()
	k, err := envelope.OpenKeyring(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := payloadstore.Wrap(payloadstore.Encrypted(s, payloadstore.Encryption{Keyring: k, AllowPlaintext: allowPlain}),
		payloadstore.Policy{Timeout: 30 * time.Second, RetryCount: 2, RetryBackoff: time.Millisecond, CustomMetadataMaxBytes: 128})
	return e
}

// The whole store contract holds with encryption, over each store, with a
// base64key:// key and (S3) the real KMS-compatible server's key.
func TestConformanceEncrypted(t *testing.T) {
	key := randomKeyURL()
	t.Run("mem", func(t *testing.T) {
		runConformance(t, func(t *testing.T) payloadstore.PayloadStore {
			return encrypt(t, openMem(t), envelope.Config{KeyURL: key}, false)
		})
	})
	t.Run("file", func(t *testing.T) {
		runConformance(t, func(t *testing.T) payloadstore.PayloadStore {
			return encrypt(t, openFile(t), envelope.Config{KeyURL: key}, false)
		})
	})
	t.Run("s3+awskms", func(t *testing.T) {
		kms := storetest.KMSKeyURL(t, "")
		runConformance(t, func(t *testing.T) payloadstore.PayloadStore {
			return encrypt(t, openURL(t, s3URL(t, "ferry-conformance")), envelope.Config{KeyURL: kms}, false)
		})
	})
}

// objectFile returns the file of fullPath in the file store at dir.
func objectFile(t *testing.T, dir, root, fullPath string) string {
	t.Helper()
	key, ok := strings.CutPrefix(fullPath, root+"/")
	if !ok {
		t.Fatalf("%s is not under %s", fullPath, root)
	}
	return filepath.Join(dir, filepath.FromSlash(key))
}

// At rest the object holds no plaintext; altered, truncated or swapped
// objects, a plaintext object and a missing key give typed errors and never
// wrong bytes.
func TestEncryptedTamper(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	raw, err := payloadstore.Open(ctx, "file://"+dir, payloadstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	key := randomKeyURL()
	s := encrypt(t, raw, envelope.Config{KeyURL: key}, false)
	defer s.Close()
	root := string(payloadstore.Root("file://" + dir))
	plain := bytes.Repeat([]byte("confidential payload "), 150_000) // 3 MiB
	publish := func(topic string) (string, string) {
		resp, err := payloadstore.PublishBytes(ctx, s, topic, plain)
		if err != nil {
			t.Fatal(err)
		}
		return resp.FullPayloadPath, objectFile(t, dir, root, resp.FullPayloadPath)
	}
	download := func(path string) ([]byte, error) { return payloadstore.DownloadBytes(ctx, s, path) }

	a, af := publish("orders")
	b, bf := publish("orders")
	sealed, _ := os.ReadFile(af)
	if bytes.Contains(sealed, []byte("confidential")) {
		t.Fatal("the object at rest holds the plaintext")
	}
	if got, err := download(a); err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("round trip: %v", err)
	}
	write := func(f string, b []byte) {
		if err := os.WriteFile(f, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bSealed, _ := os.ReadFile(bf)
	cases := []struct {
		name  string
		bytes []byte
		want  error
	}{
		{"a byte flipped mid-object", func() []byte { c := bytes.Clone(sealed); c[len(c)/2] ^= 1; return c }(), envelope.ErrAuthentication},
		{"truncated", sealed[:len(sealed)-1000], envelope.ErrAuthentication},
		{"truncated to its header", sealed[:200], envelope.ErrAuthentication},
		{"swapped with another object of the same key", bSealed, envelope.ErrAuthentication},
		{"plaintext", plain, payloadstore.ErrPlaintextRefused},
	}
	for _, c := range cases {
		write(af, c.bytes)
		got, err := download(a)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v (%d bytes back), want %v", c.name, err, len(got), c.want)
		}
		if err == nil || bytes.Equal(got, plain) {
			t.Errorf("%s: read back without error", c.name)
		}
	}
	write(af, sealed)
	if got, err := download(a); err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("restored: %v", err)
	}
	if _, err := download(b); err != nil {
		t.Fatalf("b: %v", err)
	}

	// Another key: the object names a key this store does not have.
	other := encrypt(t, raw, envelope.Config{KeyURL: randomKeyURL()}, false)
	if _, err := payloadstore.DownloadBytes(ctx, other, a); !errors.Is(err, envelope.ErrUnknownKey) {
		t.Errorf("wrong key: %v, want ErrUnknownKey", err)
	}
	// Rotation: the old key among the decryption keys reads it.
	rotated := encrypt(t, raw, envelope.Config{KeyURL: randomKeyURL(), DecryptKeyURLs: []string{key}}, false)
	if got, err := payloadstore.DownloadBytes(ctx, rotated, a); err != nil || !bytes.Equal(got, plain) {
		t.Errorf("rotated: %v", err)
	}
	// A plaintext object is read with allow.plaintext.
	resp, err := payloadstore.PublishBytes(ctx, payloadstore.Wrap(raw, payloadstore.DefaultPolicy), "orders", []byte("old and clear"))
	if err != nil {
		t.Fatal(err)
	}
	allow := encrypt(t, raw, envelope.Config{KeyURL: key}, true)
	if got, err := payloadstore.DownloadBytes(ctx, allow, resp.FullPayloadPath); err != nil || string(got) != "old and clear" {
		t.Errorf("allow.plaintext: %q, %v", got, err)
	}
	if _, err := download(resp.FullPayloadPath); !errors.Is(err, payloadstore.ErrPlaintextRefused) {
		t.Errorf("plaintext without allow.plaintext: %v", err)
	}
}

// A copy into another topic is sealed again for its new key (a byte copy
// would not open there), and reads back the same bytes.
func TestEncryptedCopyToTopic(t *testing.T) {
	ctx := context.Background()
	for name, open := range map[string]func(*testing.T) payloadstore.PayloadStore{"file": openFile, "mem": openMem} {
		t.Run(name, func(t *testing.T) {
			s := encrypt(t, open(t), envelope.Config{KeyURL: randomKeyURL()}, false)
			plain := make([]byte, 700_000)
			rand.Read(plain)
			resp, err := payloadstore.PublishBytes(ctx, s, "a", plain)
			if err != nil {
				t.Fatal(err)
			}
			path, err := payloadstore.CopyToTopic(ctx, s, resp.FullPayloadPath, "b")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(path, "/b/") {
				t.Fatalf("copy at %s, not under topic b", path)
			}
			got, err := payloadstore.DownloadBytes(ctx, s, path)
			if err != nil || !bytes.Equal(got, plain) {
				t.Fatalf("copy: %v", err)
			}
		})
	}
}

// A KMS that refuses (a decrypt-only keyring stands for it here; the real
// server's outage is in the integration tests) leaves nothing behind.
func TestEncryptedPublishWithoutKeyLeavesNothing(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	raw, err := payloadstore.Open(ctx, "file://"+dir, payloadstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := encrypt(t, raw, envelope.Config{DecryptKeyURLs: []string{randomKeyURL()}}, false)
	if _, err := payloadstore.PublishBytes(ctx, s, "t", []byte("x")); !errors.Is(err, envelope.ErrDecryptOnly) {
		t.Fatalf("publish: %v, want ErrDecryptOnly", err)
	}
	if files := dirEntries(t, dir); len(files) != 0 {
		t.Fatalf("left %v", files)
	}
}
