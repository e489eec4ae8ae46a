//go:build !ferry_nocloud

package payloadstore_test

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/ferrykit/ferry/envelope"
	"github.com/ferrykit/ferry/internal/faultproxy"
	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/payloadstore"
)

// A sealed payload (payload encryption, the real KMS key) downloaded from
// the real S3 server through a fault proxy that cuts the response early or
// throttles the ranges after the first: the download fails with the
// store's retryable error, never envelope.ErrAuthentication or ErrFormat,
// which say the object's bytes are at fault (the proxy answers those with
// CORRUPT_MESSAGE, and an application may skip the record for good).
func TestS3SealedDownloadFaultIsNotCorruption(t *testing.T) {
	ctx := context.Background()
	plain := make([]byte, 4<<20+17)
	rand.Read(plain)
	keyURL := storetest.KMSKeyURL(t, "")
	open := func(t *testing.T, u string, o payloadstore.Options) payloadstore.PayloadStore {
		s, err := payloadstore.Open(ctx, u, o)
		if err != nil {
			t.Fatal(err)
		}
		k, err := envelope.OpenKeyring(ctx, envelope.Config{KeyURL: keyURL})
		if err != nil {
			t.Fatal(err)
		}
		e := payloadstore.Wrap(payloadstore.Encrypted(s, payloadstore.Encryption{Keyring: k}),
			payloadstore.Policy{Timeout: 30 * time.Second, RetryCount: 2, RetryBackoff: 10 * time.Millisecond, CustomMetadataMaxBytes: 128})
		t.Cleanup(func() { e.Close() })
		return e
	}
	single := payloadstore.Options{DownloadConcurrency: 1}
	for _, c := range []struct {
		name string
		o    payloadstore.Options
		cut  int64 // CutBody after cut bytes of every response; 0: throttle every request after the first Read
	}{
		{"one GET cut after 20 bytes", single, 20},
		{"one GET cut inside the wrapped key", single, 100},
		{"ranged GETs throttled after the first range", rangedOpts, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			direct, via, fp := storetest.S3URLViaFaultProxy(t, "ferry-faults")
			resp, err := payloadstore.PublishBytes(ctx, open(t, direct, rangedOpts), "orders", plain)
			if err != nil {
				t.Fatal(err)
			}
			s := open(t, via, c.o)
			if c.cut > 0 {
				fp.SetCutAfter(c.cut)
				fp.Set(faultproxy.CutBody, -1)
				_, err = payloadstore.DownloadBytes(ctx, s, resp.FullPayloadPath)
			} else {
				rc, oerr := s.Download(ctx, resp.FullPayloadPath)
				if oerr != nil {
					t.Fatal(oerr)
				}
				if _, err := rc.Read(make([]byte, 1000)); err != nil {
					t.Fatal(err)
				}
				fp.SetThrottleStatus(503)
				fp.Set(faultproxy.Throttle, -1)
				_, err = io.Copy(io.Discard, rc)
				rc.Close()
			}
			if err == nil || errors.Is(err, envelope.ErrAuthentication) || errors.Is(err, envelope.ErrFormat) || !payloadstore.IsRetryable(err) {
				t.Fatalf("sealed download with the store failing: %v; want the store's retryable error, not a corrupt object", err)
			}
		})
	}
}
