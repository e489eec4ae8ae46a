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

func openCloudBucket(context.Context, *url.URL, string, int) (*blob.Bucket, func(context.Context, string), *connSet, error) {
	return nil, nil, nil, errors.New("this build has no cloud stores (built with the ferry_nocloud tag)")
}

func bucketMissing(error) bool { return false }

func httpStatus(error) int { return 0 }
