package payloadstore_test

// The cloud stores against real servers started by scripts/object-stores
// (scripts/test starts them): versitygw for S3, fake-gcs-server for GCS,
// Azurite for Azure Blob. Without their environment the tests skip, except
// under CI, where they fail.

import (
	"context"
	"errors"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"

	"cloud.google.com/go/storage"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/google/uuid"
	"google.golang.org/api/option"

	"github.com/ferrykit/ferry/payloadstore"
)

// needEnv returns the value of each variable, skipping the test (failing it
// under CI) when one is unset.
func needEnv(t *testing.T, names ...string) []string {
	t.Helper()
	var vals []string
	for _, n := range names {
		v := os.Getenv(n)
		if v == "" {
			msg := n + " is not set: run the tests with ./scripts/test (it starts the object-store servers)"
			if os.Getenv("CI") != "" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
		vals = append(vals, v)
	}
	return vals
}

var bucketsMade sync.Map

// s3URL returns an s3:// store URL on the test S3 server with a fresh
// prefix, creating the bucket once.
func s3URL(t *testing.T, bucket string) string {
	t.Helper()
	endpoint := needEnv(t, "FERRY_S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")[0]
	if _, done := bucketsMade.Load("s3/" + bucket); !done {
		ctx := context.Background()
		cfg, err := config.LoadDefaultConfig(ctx, config.WithRegion("us-east-1"))
		if err != nil {
			t.Fatal(err)
		}
		c := s3.NewFromConfig(cfg, func(o *s3.Options) {
			o.BaseEndpoint = aws.String(endpoint)
			o.UsePathStyle = true
		})
		_, err = c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)})
		var owned *s3types.BucketAlreadyOwnedByYou
		var exists *s3types.BucketAlreadyExists
		if err != nil && !errors.As(err, &owned) && !errors.As(err, &exists) {
			t.Fatalf("create S3 bucket %q: %v", bucket, err)
		}
		bucketsMade.Store("s3/"+bucket, true)
	}
	q := url.Values{"endpoint": {endpoint}, "use_path_style": {"true"}, "region": {"us-east-1"}}
	return "s3://" + bucket + "/t-" + uuid.NewString()[:8] + "?" + q.Encode()
}

// gcsURL returns a gs:// store URL on the fake GCS server with a fresh
// prefix, creating the bucket once.
func gcsURL(t *testing.T, bucket string) string {
	t.Helper()
	needEnv(t, "STORAGE_EMULATOR_HOST")
	if _, done := bucketsMade.Load("gs/" + bucket); !done {
		ctx := context.Background()
		c, err := storage.NewClient(ctx, option.WithoutAuthentication())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		err = c.Bucket(bucket).Create(ctx, "ferry-test", nil)
		if err != nil && !strings.Contains(err.Error(), "409") && !strings.Contains(strings.ToLower(err.Error()), "already") {
			t.Fatalf("create GCS bucket %q: %v", bucket, err)
		}
		bucketsMade.Store("gs/"+bucket, true)
	}
	return "gs://" + bucket + "/t-" + uuid.NewString()[:8]
}

// azureURL returns an azblob:// store URL on Azurite with a fresh prefix,
// creating the container once.
func azureURL(t *testing.T, container string) string {
	t.Helper()
	env := needEnv(t, "FERRY_AZURE_ENDPOINT", "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY")
	if _, done := bucketsMade.Load("az/" + container); !done {
		cred, err := azblob.NewSharedKeyCredential(env[1], env[2])
		if err != nil {
			t.Fatal(err)
		}
		c, err := azblob.NewClientWithSharedKeyCredential(env[0], cred, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.CreateContainer(context.Background(), container, nil)
		if err != nil && !bloberror.HasCode(err, bloberror.ContainerAlreadyExists) {
			t.Fatalf("create Azure container %q: %v", container, err)
		}
		bucketsMade.Store("az/"+container, true)
	}
	return "azblob://" + container + "/t-" + uuid.NewString()[:8]
}

// openURL opens rawURL with 5 MiB parts (so the conformance suite's 12 MiB
// payload takes three) and closes the store at the end of the test.
func openURL(t *testing.T, rawURL string) payloadstore.PayloadStore {
	t.Helper()
	s, err := payloadstore.Open(context.Background(), rawURL, payloadstore.Options{PartSizeBytes: 5 << 20, UploadConcurrency: 2})
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
	for name, mk := range map[string]func(*testing.T, string) string{"s3": s3URL, "gs": gcsURL, "azblob": azureURL} {
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
