package envelope

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
)

// openAWSKMS opens an awskms:// key URL as gocloud's URL opener does (key id
// from host and path, EncryptionContext from context_* parameters, the AWS
// config from the rest), and returns with the keeper an unwrap that names
// the key: gocloud's awskms Decrypt sends no KeyId, so AWS KMS would open a
// data key wrapped under any key the caller may decrypt with, and a header
// forged to carry this key's id over another key's wrapped data key would
// authenticate. With KeyId set, KMS refuses a ciphertext of another key
// (IncorrectKeyException).
func openAWSKMS(ctx context.Context, u *url.URL) (*secrets.Keeper, func(context.Context, []byte) ([]byte, error), error) {
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
	unwrap := func(ctx context.Context, wrapped []byte) ([]byte, error) {
		out, err := client.Decrypt(ctx, &kms.DecryptInput{CiphertextBlob: wrapped, KeyId: aws.String(keyID), EncryptionContext: opts.EncryptionContext})
		if err != nil {
			return nil, err
		}
		return out.Plaintext, nil
	}
	return awskms.OpenKeeper(client, keyID, &opts), unwrap, nil
}
