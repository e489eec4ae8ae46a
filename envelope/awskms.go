package envelope

import (
	"context"
	"fmt"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kms"
	gcaws "gocloud.dev/aws"
	"gocloud.dev/secrets"
	"gocloud.dev/secrets/awskms"
)

// awsKeys is the set of AWS KMS keys (by ARN) a keyring's awskms:// URLs
// name. A data key KMS unwraps must have been wrapped by one of them:
// gocloud's awskms Decrypt sends no KeyId, so KMS opens a data key wrapped
// under any key the caller may decrypt with, and a header forged with a
// configured key id over another key's wrapped data key would otherwise
// authenticate. Checking the key KMS reports (DecryptOutput.KeyId) instead
// of sending a KeyId keeps a rotation by alias working: with the alias moved
// to a new key, data keys of the old key open while the old key is
// configured too (by its ARN or key id in .decrypt.key.urls).
type awsKeys struct {
	mu        sync.Mutex
	arns      map[string]bool
	resolve   []func(context.Context) (string, error) // one per URL: DescribeKey
	resolved  int                                     // how many resolved at the last refresh
	refreshed time.Time
}

// allowed reports whether KMS key arn is one of the configured keys. The
// URLs are resolved (DescribeKey) when first needed, not when the keyring
// opens (a proxy or consumer starts while the KMS is down), and again when
// an unknown ARN shows up: at once while some URL never resolved, else at
// most once a minute (an alias may have moved).
func (a *awsKeys) allowed(ctx context.Context, arn string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.arns[arn] {
		return true
	}
	if a.resolved == len(a.resolve) && time.Since(a.refreshed) < time.Minute {
		return false
	}
	a.refreshed = time.Now()
	ok := 0
	for _, r := range a.resolve {
		if got, err := r(ctx); err == nil {
			a.arns[got] = true
			ok++
		}
	}
	a.resolved = max(a.resolved, ok)
	return a.arns[arn]
}

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
		if by := aws.ToString(out.KeyId); !keys.allowed(ctx, by) {
			clear(out.Plaintext)
			return nil, &foreignKeyError{arn: by}
		}
		return out.Plaintext, nil
	}
	return awskms.OpenKeeper(client, keyID, &opts), unwrap, nil
}

// foreignKeyError: KMS unwrapped a data key with a key that is not
// configured (a forged header). Not retryable.
type foreignKeyError struct{ arn string }

func (e *foreignKeyError) Error() string {
	return fmt.Sprintf("the data key was wrapped by KMS key %s, which is not a configured key", e.arn)
}
