//go:build !ferry_nocloud

package payloadstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/ferrykit/ferry/envelope"
	"github.com/ferrykit/ferry/internal/faultproxy"
	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/payloadstore"
)

// Security review of issue #13 (held): store and KMS faults around a
// sealed upload to the real S3 server, with the real KMS key.
//   - S3 throttles (503) the first two requests of a sealed 5 MiB upload:
//     the retry seals the payload again from its start and the object
//     opens to the payload;
//   - S3 refuses every connection: the publish fails and no object is
//     left under the prefix;
//   - the KMS hangs past the store timeout when the first data key is
//     due: the publish fails within the timeout, nothing is stored;
//   - the KMS throttles (503): a retryable ErrKMS, nothing stored.
func TestAttackEncSealedUploadFaults(t *testing.T) {
	ctx := context.Background()
	plain := make([]byte, 5<<20+17)
	rand.Read(plain)
	open := func(t *testing.T, storeURL, keyURL string, timeout time.Duration) payloadstore.PayloadStore {
		s, err := payloadstore.Open(ctx, storeURL, payloadstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		k, err := envelope.OpenKeyring(ctx, envelope.Config{KeyURL: keyURL})
		if err != nil {
			t.Fatal(err)
		}
		e := payloadstore.Wrap(payloadstore.Encrypted(s, payloadstore.Encryption{Keyring: k}),
			payloadstore.Policy{Timeout: timeout, RetryCount: 3, RetryBackoff: 10 * time.Millisecond, CustomMetadataMaxBytes: 128})
		t.Cleanup(func() { e.Close() })
		return e
	}
	empty := func(t *testing.T, s payloadstore.PayloadStore) {
		o, err := payloadstore.Objects(s)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		if err := o.ListKeys(ctx, "", func(k string, _ payloadstore.ObjectInfo) error { n++; t.Logf("left: %s", k); return nil }); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatalf("%d objects left after a failed sealed publish", n)
		}
	}

	t.Run("S3 throttles then recovers", func(t *testing.T) {
		direct, via, fp := storetest.S3URLViaFaultProxy(t, "ferry-atk-enc")
		key := storetest.KMSKeyURL(t, "")
		s := open(t, via, key, 60*time.Second)
		fp.SetThrottleStatus(503)
		fp.Set(faultproxy.Throttle, 2)
		resp, err := payloadstore.PublishBytes(ctx, s, "orders", plain)
		if err != nil {
			t.Fatalf("publish with two 503s: %v", err)
		}
		if fp.Count(faultproxy.Throttle) != 2 {
			t.Fatalf("throttled %d requests", fp.Count(faultproxy.Throttle))
		}
		got, err := payloadstore.DownloadBytes(ctx, open(t, direct, key, time.Minute), resp.FullPayloadPath)
		if err != nil || !bytes.Equal(got, plain) {
			t.Fatalf("download after retried sealed upload: %v (%d bytes)", err, len(got))
		}
	})
	t.Run("S3 down", func(t *testing.T) {
		direct, via, fp := storetest.S3URLViaFaultProxy(t, "ferry-atk-enc")
		key := storetest.KMSKeyURL(t, "")
		s := open(t, via, key, 5*time.Second)
		fp.Set(faultproxy.Down, -1)
		if _, err := payloadstore.PublishBytes(ctx, s, "orders", plain); err == nil {
			t.Fatal("publish with S3 down succeeded")
		}
		empty(t, open(t, direct, key, time.Minute))
	})
	t.Run("KMS hangs", func(t *testing.T) {
		direct, _, _ := storetest.S3URLViaFaultProxy(t, "ferry-atk-enc")
		key, kfp := storetest.KMSKeyURLViaFaultProxy(t, "")
		kfp.SetDelay(20 * time.Second)
		kfp.Set(faultproxy.Slow, -1)
		s := open(t, direct, key, 2*time.Second)
		start := time.Now()
		_, err := payloadstore.PublishBytes(ctx, s, "orders", plain)
		if err == nil {
			t.Fatal("publish with the KMS hanging succeeded")
		}
		if d := time.Since(start); d > 8*time.Second {
			t.Fatalf("publish with the KMS hanging took %v (store timeout 2 s)", d)
		}
		t.Logf("KMS hanging: %v after %v", err, time.Since(start).Round(time.Millisecond))
		empty(t, open(t, direct, storetest.KMSKeyURL(t, ""), time.Minute))
	})
	t.Run("KMS throttles", func(t *testing.T) {
		direct, _, _ := storetest.S3URLViaFaultProxy(t, "ferry-atk-enc")
		key, kfp := storetest.KMSKeyURLViaFaultProxy(t, "")
		kfp.SetThrottleStatus(503)
		kfp.Set(faultproxy.Throttle, -1)
		s := open(t, direct, key, 3*time.Second)
		_, err := payloadstore.PublishBytes(ctx, s, "orders", plain)
		var pe *payloadstore.Error
		if !errors.Is(err, envelope.ErrKMS) || !errors.As(err, &pe) {
			t.Fatalf("publish with the KMS throttling: %v, want a *payloadstore.Error wrapping ErrKMS", err)
		}
		t.Logf("KMS throttling: retryable=%v: %v", pe.Retryable, err)
		empty(t, open(t, direct, storetest.KMSKeyURL(t, ""), time.Minute))
	})
}
