package integration

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/ferrykit/ferry/envelope"
	"github.com/ferrykit/ferry/internal/storetest"
)

// An awskms:// keyring checks the KMS key that unwrapped a data key against
// the configured keys' ARNs (DescribeKey, resolved when first needed). A
// DescribeKey that fails (KMS throttling it, right after the Decrypt
// answered) is an outage, not a forged data key: the unwrap fails
// retryably and is not remembered, so that the record opens once
// DescribeKey answers. Before, it was a "wrapped by KMS key …, which is not
// a configured key" refusal, remembered for envelope.FailedUnwrapTTL: every
// record of that data key failed for a minute after the KMS was back.
func TestEncryptDescribeKeyOutageNotForgery(t *testing.T) {
	ctx := context.Background()
	direct := storetest.KMSKeyURL(t, "")
	endpoint := storetest.NeedEnv(t, "FERRY_KMS_ENDPOINT")[0]
	up, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	// A KMS that throttles DescribeKey alone while failing is set.
	var failing atomic.Bool
	var described atomic.Int64
	rp := httputil.NewSingleHostReverseProxy(up)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Amz-Target") == "TrentService.DescribeKey" {
			described.Add(1)
			if failing.Load() {
				io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/x-amz-json-1.1")
				w.WriteHeader(http.StatusBadRequest)
				io.WriteString(w, `{"__type":"ThrottlingException","message":"Rate exceeded"}`)
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	defer srv.Close()
	du, _ := url.Parse(direct)
	q := du.Query()
	q.Set("endpoint", srv.URL)
	du.RawQuery = q.Encode()
	viaProxy := du.String()

	sealer, err := envelope.OpenKeyring(ctx, envelope.Config{KeyURL: direct})
	if err != nil {
		t.Fatal(err)
	}
	defer sealer.Close()
	a := envelope.RecordAAD{Topic: "orders", Field: "value"}
	sealed, err := sealer.SealRecord(ctx, nil, []byte("genuine"), a)
	if err != nil {
		t.Fatal(err)
	}
	k, err := envelope.OpenKeyring(ctx, envelope.Config{KeyURL: viaProxy})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	failing.Store(true)
	_, err = k.OpenRecord(ctx, nil, sealed, a)
	var ke *envelope.KMSError
	if !errors.As(err, &ke) || !ke.Retryable {
		t.Errorf("DescribeKey throttled: %v, want a retryable KMS error", err)
	}
	if described.Load() == 0 {
		t.Fatal("no DescribeKey was asked")
	}
	failing.Store(false)
	got, err := k.OpenRecord(ctx, nil, sealed, a)
	if err != nil || !bytes.Equal(got, []byte("genuine")) {
		t.Fatalf("DescribeKey answering again: %q, %v (the outage was remembered as a forged data key)", got, err)
	}
}
