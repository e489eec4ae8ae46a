package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kms"
	gcaws "gocloud.dev/aws"
	"gocloud.dev/secrets/awskms"

	"github.com/tink-crypto/tink-go/v2/streamingaead/subtle"
	"gocloud.dev/secrets"

	"github.com/ferrykit/ferry/envelope"
	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
)

// A sealed object whose header names KEY's key id but whose data key was
// wrapped by OTHER (someone with Encrypt on another KMS key the consumer may
// decrypt with): the consumer, configured with KEY only, refuses it, as the
// unwrap names KEY to the KMS (gocloud's awskms alone would not), and does
// not retry it.
func TestEncryptedPayloadForgedKeyID(t *testing.T) {
	ctx := context.Background()
	key, other := storetest.KMSKeyURL(t, ""), storetest.KMSKeyURL(t, "other")
	dir := t.TempDir()
	storeURL := "file://" + dir
	cfg := epConfig(storeURL, key)
	store, err := cfg.OpenStore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	resp, err := payloadstore.PublishBytes(ctx, store, "orders", []byte("genuine"))
	if err != nil {
		t.Fatal(err)
	}
	objs, _ := payloadstore.Objects(store)
	objKey, _ := objs.Root().Key(resp.FullPayloadPath)

	// The attacker: Encrypt permission on OTHER only.
	ok, _ := secrets.OpenKeeper(ctx, other)
	dk := make([]byte, 32)
	rand.Read(dk)
	wrapped, err := ok.Encrypt(ctx, dk)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := envelope.KeyIDOf(key) // claims KEY
	var hb []byte
	hb = append(hb, envelope.Magic...)
	hb = append(hb, 1, envelope.AlgStreamAES256GCMHKDF)
	hb = binary.BigEndian.AppendUint32(hb, envelope.DefaultSegmentBytes)
	hb = append(hb, id[:]...)
	hb = binary.BigEndian.AppendUint16(hb, uint16(len(wrapped)))
	hb = append(hb, wrapped...)
	aad := append([]byte("ferry-payload-v1"), 0)
	for _, f := range []string{"orders", objKey} {
		aad = binary.BigEndian.AppendUint32(aad, uint32(len(f)))
		aad = append(aad, f...)
	}
	aad = append(aad, hb...)
	tk, err := subtle.NewAESGCMHKDF(dk, "SHA256", 32, envelope.DefaultSegmentBytes, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	out.Write(hb)
	w, err := tk.NewEncryptingWriter(&out, aad)
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("forged by the holder of another KMS key"))
	w.Close()
	if err := os.WriteFile(dir+"/"+objKey, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := payloadstore.DownloadBytes(ctx, store, resp.FullPayloadPath)
	if !errors.Is(err, envelope.ErrKMS) || payloadstore.IsRetryable(err) {
		t.Fatalf("consumer with %s only: %q, %v; want a KMS refusal that is not retryable", largemessage.KeyEncryptionKeyURL, got, err)
	}
}

// Rotation by moving an alias to a new KMS key: payloads sealed before stay
// readable while the old key is configured too (by its ARN, in
// decrypt.key.urls), and are refused with only the alias, whose key is now
// another.
func TestEncryptedPayloadAliasMoved(t *testing.T) {
	ctx := context.Background()
	storetest.KMSKeyURL(t, "") // skips without the KMS server
	endpoint := os.Getenv("FERRY_KMS_ENDPOINT")
	q := url.Values{"region": {"us-east-1"}, "endpoint": {endpoint}}
	cfg, err := gcaws.V2ConfigFromURLParams(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	client, err := awskms.Dial(cfg)
	if err != nil {
		t.Fatal(err)
	}
	newKey := func() string {
		out, err := client.CreateKey(ctx, &kms.CreateKeyInput{})
		if err != nil {
			t.Fatal(err)
		}
		return aws.ToString(out.KeyMetadata.Arn)
	}
	oldARN, newARN := newKey(), newKey()
	alias := fmt.Sprintf("alias/ferry-rotation-%d", time.Now().UnixNano())
	if _, err := client.CreateAlias(ctx, &kms.CreateAliasInput{AliasName: aws.String(alias), TargetKeyId: aws.String(oldARN)}); err != nil {
		t.Fatal(err)
	}
	// An alias is host and path; an ARN, which has colons, is the path
	// (awskms:///arn:aws:kms:…), as gocloud's awskms documents.
	keyURL := func(id string) string {
		if strings.HasPrefix(id, "arn:") {
			return "awskms:///" + id + "?" + q.Encode()
		}
		return "awskms://" + id + "?" + q.Encode()
	}
	storeURL := "file://" + t.TempDir()
	open := func(key string, decrypt ...string) payloadstore.PayloadStore {
		c := largemessage.DefaultConfig()
		c.StoreURL = storeURL
		c.Encryption.KeyURL, c.Encryption.DecryptKeyURLs = key, decrypt
		s, err := c.OpenStore(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	resp, err := payloadstore.PublishBytes(ctx, open(keyURL(alias)), "orders", []byte("sealed under the old key"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.UpdateAlias(ctx, &kms.UpdateAliasInput{AliasName: aws.String(alias), TargetKeyId: aws.String(newARN)}); err != nil {
		t.Fatal(err)
	}
	if got, err := payloadstore.DownloadBytes(ctx, open(keyURL(alias), keyURL(oldARN)), resp.FullPayloadPath); err != nil || string(got) != "sealed under the old key" {
		t.Fatalf("alias moved, old key in decrypt.key.urls: %q, %v", got, err)
	}
	if _, err := payloadstore.DownloadBytes(ctx, open(keyURL(alias)), resp.FullPayloadPath); !errors.Is(err, envelope.ErrKMS) {
		t.Fatalf("alias moved, old key not configured: %v, want ErrKMS", err)
	}
}
