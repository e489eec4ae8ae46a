//go:build !ferry_nocloud

package payloadstore

// The cloud stores' drivers: Amazon S3 (and S3-compatible servers), Google
// Cloud Storage and Azure Blob Storage, registered under their gocloud.dev
// URL schemes. Everything that links a cloud SDK is in this file, so that a
// build with the ferry_nocloud tag (scripts/fuzz) leaves the SDKs out:
// they hold about 95 % of a test binary's fuzzing coverage counters, which
// Go's fuzzer scans after every execution.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"cloud.google.com/go/storage"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go/logging"
	gcaws "gocloud.dev/aws"
	"gocloud.dev/blob"
	"gocloud.dev/blob/azureblob"
	"gocloud.dev/blob/gcsblob"
	"gocloud.dev/blob/s3blob"
	"google.golang.org/api/googleapi"

	"github.com/ferrykit/ferry/internal/suggest"
)

func init() {
	Register(s3blob.Scheme, openBlob(S3StoreClass))
	Register(gcsblob.Scheme, openBlob(GCSStoreClass))
	Register(azureblob.Scheme, openBlob(AzureBlobStoreClass))
}

// openCloudBucket opens the bucket of u (scheme s3, gs or azblob) without
// its prefix. For S3 it also returns the S3 calls gocloud.dev does not
// make (s3Uploads) and the set of connections the client dials (conns:
// the most requests one upload or download has in flight).
func openCloudBucket(ctx context.Context, u *url.URL, bucketName string, conns int) (*blob.Bucket, *s3Uploads, *connSet, error) {
	// gocloud.dev takes the bucket from the host and its own options from
	// the query; the prefix is applied with PrefixedBucket by the caller.
	if u.Scheme == s3blob.Scheme {
		set := &connSet{}
		b, client, checksum, err := openS3Bucket(ctx, bucketName, u.Query(), conns, set)
		if err != nil {
			return nil, nil, nil, err
		}
		return b, &s3Uploads{client: client, bucket: bucketName, checksum: checksum}, set, nil
	}
	gu := url.URL{Scheme: u.Scheme, Host: bucketName, RawQuery: u.RawQuery}
	b, err := blob.OpenBucket(ctx, gu.String())
	return b, nil, nil, err
}

// bucketMissing reports whether err says the bucket or container itself is
// gone (S3 NoSuchBucket, Azure ContainerNotFound, GCS bucket not found): that
// is a configuration problem, not a missing payload, and must not be skipped
// by large.message.skip.not.found.error.
func bucketMissing(err error) bool {
	var coded interface{ ErrorCode() string }
	if errors.As(err, &coded) && coded.ErrorCode() == "NoSuchBucket" {
		return true
	}
	var az *azcore.ResponseError
	if errors.As(err, &az) && az.ErrorCode == "ContainerNotFound" {
		return true
	}
	return errors.Is(err, storage.ErrBucketNotExist)
}

// httpStatus digs the HTTP status out of an SDK error (AWS, Azure, Google),
// or returns 0 when there is none (a connection error, say).
func httpStatus(err error) int {
	var aws interface{ HTTPStatusCode() int }
	if errors.As(err, &aws) {
		return aws.HTTPStatusCode()
	}
	var az *azcore.ResponseError
	if errors.As(err, &az) {
		return az.StatusCode
	}
	var g *googleapi.Error
	if errors.As(err, &g) {
		return g.Code
	}
	return 0
}

// openS3Bucket opens an S3 bucket the way gocloud.dev's s3blob URL opener
// does (the same query parameters and credential chain), but builds the S3
// client itself: the opener offers no way to set client options, and Ferry
// needs one, DisableLogOutputChecksumValidationSkipped, or every download
// from an S3-compatible server that sends no checksum prints an SDK line on
// stderr.
//
// conns is the most requests one upload or download has in flight: the
// client keeps at least four times as many idle connections to the server,
// so that ranged GETs reuse them instead of opening new ones (the SDK keeps
// 10 per host by default). Every connection it dials is held in set, which
// the store's Close closes.
func openS3Bucket(ctx context.Context, bucket string, q url.Values, conns int, set *connSet) (*blob.Bucket, *s3.Client, aws.RequestChecksumCalculation, error) {
	var opts s3blob.Options
	var clientOpts []func(*s3.Options)
	boolParam := func(key string, set func(o *s3.Options, v bool)) error {
		v := q.Get(key)
		if v == "" {
			return nil
		}
		q.Del(key)
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("invalid value %q for %q", v, key)
		}
		clientOpts = append(clientOpts, func(o *s3.Options) { set(o, b) })
		return nil
	}
	for key, set := range map[string]func(*s3.Options, bool){
		"use_path_style":   func(o *s3.Options, v bool) { o.UsePathStyle = v },
		"s3ForcePathStyle": func(o *s3.Options, v bool) { o.UsePathStyle = v },
		"disable_https":    func(o *s3.Options, v bool) { o.EndpointOptions.DisableHTTPS = v },
		"accelerate":       func(o *s3.Options, v bool) { o.UseAccelerate = v },
	} {
		if err := boolParam(key, set); err != nil {
			return nil, nil, 0, err
		}
	}
	if v := q.Get("ssetype"); v != "" {
		q.Del("ssetype")
		opts.EncryptionType = s3types.ServerSideEncryption(v)
	}
	if v := q.Get("kmskeyid"); v != "" {
		q.Del("kmskeyid")
		opts.KMSEncryptionID = v
	}
	cfg, err := gcaws.V2ConfigFromURLParams(ctx, q)
	if err != nil {
		return nil, nil, 0, withParamHint(err, q)
	}
	// The SDK logs to stderr by default (e.g. "falling back to IMDSv1"
	// while looking for credentials); Ferry reports errors itself.
	cfg.Logger = logging.Nop{}
	if hc, ok := cfg.HTTPClient.(*awshttp.BuildableClient); ok {
		cfg.HTTPClient = hc.WithTransportOptions(func(tr *http.Transport) {
			tr.MaxIdleConnsPerHost = max(tr.MaxIdleConnsPerHost, 4*conns)
			tr.MaxIdleConns = max(tr.MaxIdleConns, tr.MaxIdleConnsPerHost)
			tr.DialContext = set.dialer(tr.DialContext)
		})
	}
	clientOpts = append(clientOpts, func(o *s3.Options) { o.DisableLogOutputChecksumValidationSkipped = true })
	client := s3.NewFromConfig(cfg, clientOpts...)
	opts.RequestChecksumCalculation = cfg.RequestChecksumCalculation
	b, err := s3blob.OpenBucket(ctx, client, bucket, &opts)
	return b, client, cfg.RequestChecksumCalculation, err
}

// s3Params are the query parameters of an s3:// store URL: Ferry's
// (openS3Bucket) and gocloud.dev's (aws.V2ConfigFromURLParams, v0.49).
var s3Params = []string{"use_path_style", "s3ForcePathStyle", "disable_https", "accelerate", "ssetype", "kmskeyid",
	"region", "endpoint", "profile", "hostname_immutable", "dualstack", "fips", "rate_limiter_capacity", "anonymous",
	"role", "role_session_name", "role_external_id", "role_duration", "web_identity_token_file",
	"request_checksum_calculation", "response_checksum_validation", "awssdk"}

// withParamHint adds to gocloud.dev's "unknown query parameter" error the
// parameters the unknown one of q is near (use_path_stye: use_path_style),
// as the CLI names the key a misspelled property is near.
func withParamHint(err error, q url.Values) error {
	for p := range q {
		if slices.Contains(s3Params, p) {
			continue
		}
		if near := suggest.Nearest(p, s3Params, false); len(near) > 0 {
			return fmt.Errorf("%w (did you mean %s?)", err, suggest.OrList(near))
		}
	}
	return err
}

// s3Uploads are the S3 calls of a BlobStore that gocloud.dev's bucket
// does not make: aborting the multipart uploads a failed Publish left, and
// choosing an upload's multipart threshold.
type s3Uploads struct {
	client   *s3.Client
	bucket   string
	checksum aws.RequestChecksumCalculation // the client's, which the transfer manager must repeat
}

// abort aborts the multipart uploads of full (a key in the bucket, its
// prefix included) begun in the last hour, within 30 s; failures are
// ignored (see BlobStore.abortIncomplete).
func (u *s3Uploads) abort(ctx context.Context, full string) {
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := u.client.ListMultipartUploads(actx, &s3.ListMultipartUploadsInput{Bucket: &u.bucket, Prefix: &full})
	if err != nil {
		return
	}
	since := time.Now().Add(-time.Hour)
	for _, up := range out.Uploads {
		if up.Key == nil || *up.Key != full || (up.Initiated != nil && up.Initiated.Before(since)) {
			continue
		}
		_, _ = u.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{Bucket: &u.bucket, Key: up.Key, UploadId: up.UploadId})
	}
}

// partSized returns a blob.WriterOptions.BeforeWrite that makes an upload
// go multipart from its first part of partSize bytes, with concurrency
// parts in flight. The transfer manager otherwise reads the first 16 MiB
// (its MultipartUploadThreshold) whole, into a slice grown by appending
// (about five times that allocated on the way), before it starts a
// multipart upload; for a value streamed from a client that is most of
// what the upload holds. The cost: an object of partSize to 16 MiB is a
// multipart upload (two more requests) instead of one PUT.
func (u *s3Uploads) partSized(partSize, concurrency int) func(as func(any) bool) error {
	return func(as func(any) bool) error {
		var tm *transfermanager.Client
		if !as(&tm) || tm == nil {
			return nil
		}
		// gocloud.dev makes one transfer manager per writer and hands it
		// out for this; its options are set only by New.
		*tm = *transfermanager.New(u.client, func(o *transfermanager.Options) {
			o.RequestChecksumCalculation = u.checksum
			o.PartSizeBytes = int64(partSize)
			o.Concurrency = concurrency
			o.MultipartUploadThreshold = int64(partSize)
		})
		return nil
	}
}
