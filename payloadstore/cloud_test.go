//go:build !ferry_nocloud

package payloadstore_test

// The cloud stores against real servers started by scripts/object-stores
// (scripts/test starts them): versitygw for S3, fake-gcs-server for GCS,
// Azurite for Azure Blob. Without their environment the tests skip, except
// under CI, where they fail.

import (
	"context"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/payloadstore"
)

var (
	s3URL    = storetest.S3URL
	gcsURL   = storetest.GCSURL
	azureURL = storetest.AzureURL
)

// openURL opens rawURL with 5 MiB parts and ranges, two in flight (so the
// conformance suite's 12 MiB payload takes three of each), and closes the
// store at the end of the test.
func openURL(t *testing.T, rawURL string) payloadstore.PayloadStore {
	t.Helper()
	s, err := payloadstore.Open(context.Background(), rawURL, payloadstore.Options{PartSizeBytes: 5 << 20, UploadConcurrency: 2, DownloadPartBytes: 5 << 20, DownloadConcurrency: 2})
	if err != nil {
		t.Fatalf("Open %s: %v", rawURL, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformanceS3(t *testing.T) {
	runConformance(t, func(t *testing.T) payloadstore.PayloadStore { return openURL(t, s3URL(t, "ferry-conformance")) })
}

func TestConformanceGCS(t *testing.T) {
	runConformance(t, func(t *testing.T) payloadstore.PayloadStore { return openURL(t, gcsURL(t, "ferry-conformance")) })
}

func TestConformanceAzureBlob(t *testing.T) {
	runConformance(t, func(t *testing.T) payloadstore.PayloadStore { return openURL(t, azureURL(t, "ferry-conformance")) })
}

// The full path names the object by scheme, bucket, prefix and key only: no
// endpoint, region or credentials.
func TestCloudFullPathHasNoQueryOrSecrets(t *testing.T) {
	for name, mk := range map[string]func(testing.TB, string) string{"s3": s3URL, "gs": gcsURL, "azblob": azureURL} {
		t.Run(name, func(t *testing.T) {
			raw := mk(t, "ferry-conformance")
			s := openURL(t, raw)
			resp, err := payloadstore.PublishBytes(context.Background(), s, "orders", []byte("x"))
			if err != nil {
				t.Fatal(err)
			}
			u, _ := url.Parse(raw)
			want := name + "://" + u.Host + u.Path + "/orders/"
			if !strings.HasPrefix(resp.FullPayloadPath, want) || strings.ContainsAny(resp.FullPayloadPath, "?@") {
				t.Fatalf("full path %q, want %s<shard>/<id> without query or user info", resp.FullPayloadPath, want)
			}
			for _, secret := range []string{os.Getenv("AWS_SECRET_ACCESS_KEY"), os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AZURE_STORAGE_KEY")} {
				if secret != "" && strings.Contains(resp.FullPayloadPath, secret) {
					t.Fatalf("full path %q carries a credential", resp.FullPayloadPath)
				}
			}
		})
	}
}

// A misspelled query parameter of an s3:// store URL is refused naming the
// parameter it is near, as a misspelled property is (gocloud.dev's error
// alone said only "unknown query parameter").
func TestS3URLParamTypoSuggests(t *testing.T) {
	for typo, want := range map[string]string{"use_path_stye": "use_path_style", "regin": "region", "endpont": "endpoint"} {
		st, err := payloadstore.Open(context.Background(), "s3://bucket/p?"+typo+"=x", payloadstore.Options{})
		if err == nil {
			st.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "(did you mean "+want+"?)") {
			t.Errorf("%s: %v, want a suggestion of %s", typo, err, want)
		}
	}
}
