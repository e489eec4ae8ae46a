//go:build !ferry_nocloud

package envelope

// The cloud key management services: gocloud.dev/secrets' awskms://,
// azurekeyvault://, gcpkms:// and hashivault:// drivers. Everything that
// links a cloud SDK is in this file, so that a build with the
// ferry_nocloud tag (scripts/fuzz) leaves the SDKs out (see
// payloadstore/cloud.go); such a build knows base64key:// only.

import (
	"context"
	"fmt"
	"net/url"
	"path"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kms"
	gcaws "gocloud.dev/aws"
	"gocloud.dev/secrets"
	"gocloud.dev/secrets/awskms"
	_ "gocloud.dev/secrets/azurekeyvault" // azurekeyvault://
	_ "gocloud.dev/secrets/gcpkms"        // gcpkms://
	_ "gocloud.dev/secrets/hashivault"    // hashivault://
)

// openAWSKMS opens an awskms:// key URL as gocloud's URL opener does (key id
// from host and path, EncryptionContext from context_* parameters, the AWS
// config from the rest), adds to keys a way to resolve the key's ARN
// (DescribeKey: an alias gives the key it names now), and returns with the
// keeper an unwrap that refuses a data key KMS unwrapped with a key not in
// keys.
func openAWSKMS(ctx context.Context, u *url.URL, keys *awsKeys) (*secrets.Keeper, func(context.Context, []byte) ([]byte, error), error) {
	keyID := strings.TrimPrefix(path.Join(u.Host, u.Path), "/")
	q := u.Query()
	var opts awskms.KeeperOptions
	for k, vs := range q {
		if strings.HasPrefix(k, "context_") {
			if len(vs) != 1 {
				return nil, nil, fmt.Errorf("EncryptionContext parameter %q must have exactly 1 value", k)
			}
			q.Del(k)
			if opts.EncryptionContext == nil {
				opts.EncryptionContext = map[string]string{}
			}
			opts.EncryptionContext[k[len("context_"):]] = vs[0]
		}
	}
	cfg, err := gcaws.V2ConfigFromURLParams(ctx, q)
	if err != nil {
		return nil, nil, err
	}
	client, err := awskms.Dial(cfg)
	if err != nil {
		return nil, nil, err
	}
	resolve := func(ctx context.Context) (string, error) {
		out, err := client.DescribeKey(ctx, &kms.DescribeKeyInput{KeyId: aws.String(keyID)})
		if err != nil {
			return "", err
		}
		return aws.ToString(out.KeyMetadata.Arn), nil
	}
	keys.mu.Lock()
	keys.resolve = append(keys.resolve, resolve)
	keys.mu.Unlock()
	unwrap := func(ctx context.Context, wrapped []byte) ([]byte, error) {
		out, err := client.Decrypt(ctx, &kms.DecryptInput{CiphertextBlob: wrapped, EncryptionContext: opts.EncryptionContext})
		if err != nil {
			return nil, err
		}
		by := aws.ToString(out.KeyId)
		if ok, err := keys.allowed(ctx, by); !ok {
			clear(out.Plaintext)
			if err != nil {
				return nil, err
			}
			return nil, &foreignKeyError{arn: by}
		}
		return out.Plaintext, nil
	}
	return awskms.OpenKeeper(client, keyID, &opts), unwrap, nil
}
