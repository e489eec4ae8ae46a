// Package storetest is test support shared by Ferry's test packages: it
// hands out URLs of fresh prefixes in buckets of the real object-store servers
// that scripts/object-stores starts (versitygw for S3, fake-gcs-server for
// GCS, Azurite for Azure Blob), creating each bucket once with the cloud's
// own SDK. Without the servers' environment a test skips, and under CI it
// fails. It is not part of Ferry's API.
package storetest

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

	"github.com/ferrykit/ferry/internal/faultproxy"
)

// NeedEnv returns the value of each variable, skipping the test (failing it
// under CI) when one is unset.
func NeedEnv(t testing.TB, names ...string) []string {
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

// S3URL returns an s3:// store URL on the test S3 server with a fresh
// prefix, creating the bucket once.
func S3URL(t testing.TB, bucket string) string {
	t.Helper()
	endpoint := NeedEnv(t, "FERRY_S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")[0]
	if _, done := bucketsMade.Load("s3/" + bucket); !done {
		ctx := context.Background()
		c := S3Client(t)
		_, err := c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)})
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

// S3Client is an S3 client of the test S3 server, for checks the
// PayloadStore interface cannot make (multipart uploads left behind).
func S3Client(t testing.TB) *s3.Client {
	t.Helper()
	endpoint := NeedEnv(t, "FERRY_S3_ENDPOINT")[0]
	cfg, err := config.LoadDefaultConfig(context.Background(), config.WithRegion("us-east-1"))
	if err != nil {
		t.Fatal(err)
	}
	return s3.NewFromConfig(cfg, func(o *s3.Options) {
		o.BaseEndpoint = aws.String(endpoint)
		o.UsePathStyle = true
	})
}

// S3URLViaFaultProxy is S3URL plus a fault proxy (internal/faultproxy) in
// front of the test S3 server: it returns the store URL of a fresh prefix,
// the same prefix reached through the proxy, and the proxy, closed at the
// end of the test.
func S3URLViaFaultProxy(t testing.TB, bucket string) (direct, via string, fp *faultproxy.Proxy) {
	t.Helper()
	direct = S3URL(t, bucket)
	fp, err := faultproxy.New(os.Getenv("FERRY_S3_ENDPOINT"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fp.Close)
	u, _ := url.Parse(direct)
	q := u.Query()
	q.Set("endpoint", fp.URL())
	u.RawQuery = q.Encode()
	return direct, u.String(), fp
}

// GCSURL returns a gs:// store URL on the fake GCS server with a fresh
// prefix, creating the bucket once.
func GCSURL(t testing.TB, bucket string) string {
	t.Helper()
	NeedEnv(t, "STORAGE_EMULATOR_HOST")
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

// AzureURL returns an azblob:// store URL on Azurite with a fresh prefix,
// creating the container once.
func AzureURL(t testing.TB, container string) string {
	t.Helper()
	env := NeedEnv(t, "FERRY_AZURE_ENDPOINT", "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY")
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
