//go:build ferry_nocloud

package payloadstore

// A build with the ferry_nocloud tag has no cloud stores (see cloud.go):
// s3://, gs:// and azblob:// URLs are unknown schemes. scripts/fuzz builds
// this way; the fuzz targets use mem:// and file:// stores.

import (
	"context"
	"errors"
	"net/url"

	"gocloud.dev/blob"
)

func openCloudBucket(context.Context, *url.URL, string, int) (*blob.Bucket, *s3Uploads, *connSet, error) {
	return nil, nil, nil, errors.New("this build has no cloud stores (built with the ferry_nocloud tag)")
}

func bucketMissing(error) bool { return false }

func httpStatus(error) int { return 0 }

// s3Uploads is cloud.go's; a BlobStore of this build never has one.
type s3Uploads struct{}

func (*s3Uploads) abort(context.Context, string) {}

func (*s3Uploads) partSized(int, int) func(func(any) bool) error { return nil }
