//go:build ferry_nocloud

package envelope

import (
	"context"
	"errors"
	"net/url"

	"gocloud.dev/secrets"
)

// openAWSKMS: a build with the ferry_nocloud tag has no cloud KMS (see
// kms_cloud.go).
func openAWSKMS(context.Context, *url.URL, *awsKeys) (*secrets.Keeper, func(context.Context, []byte) ([]byte, error), error) {
	return nil, nil, errors.New("this build has no cloud KMS (built with the ferry_nocloud tag)")
}
