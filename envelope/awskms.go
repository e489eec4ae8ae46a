package envelope

import (
	"context"
	"fmt"
	"sync"
	"time"
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
	// refreshing serializes the refreshes (DescribeKey calls), which run
	// without mu: a key already known is answered while a refresh for an
	// unknown one waits on the KMS (a forged record's refresh, once a
	// minute, held up every unwrap for as long as DescribeKey hung).
	refreshing sync.Mutex
	mu         sync.Mutex // guards the fields below
	arns       map[string]bool
	resolve    []func(context.Context) (string, error) // one per URL: DescribeKey
	resolved   int                                     // how many resolved at the last refresh
	refreshed  time.Time
}

// allowed reports whether KMS key arn is one of the configured keys. The
// URLs are resolved (DescribeKey) when first needed, not when the keyring
// opens (a proxy or consumer starts while the KMS is down), and again when
// an unknown ARN shows up: at once while some URL never resolved, else at
// most once a minute (an alias may have moved). When arn is not known and
// a URL failed to resolve, the answer is that failure, not false: a
// DescribeKey throttled or cut short is an outage, and a genuine data key
// refused as another key's would be remembered as a refusal
// (FailedUnwrapTTL).
func (a *awsKeys) allowed(ctx context.Context, arn string) (bool, error) {
	if a.known(arn) {
		return true, nil
	}
	a.refreshing.Lock()
	defer a.refreshing.Unlock()
	a.mu.Lock()
	if a.arns[arn] { // a refresh that just ended found it
		a.mu.Unlock()
		return true, nil
	}
	if a.resolved == len(a.resolve) && time.Since(a.refreshed) < time.Minute {
		a.mu.Unlock()
		return false, nil
	}
	a.refreshed = time.Now()
	a.mu.Unlock()
	var got []string
	var failed error
	for _, r := range a.resolve {
		g, err := r(ctx)
		if err != nil {
			failed = err
			continue
		}
		got = append(got, g)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, g := range got {
		a.arns[g] = true
	}
	a.resolved = max(a.resolved, len(got))
	if !a.arns[arn] && failed != nil {
		return false, fmt.Errorf("the data key was unwrapped by KMS key %s; checking it is a configured key: %w", arn, failed)
	}
	return a.arns[arn], nil
}

// known reports whether arn is a configured key found by a refresh.
func (a *awsKeys) known(arn string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.arns[arn]
}

// foreignKeyError: KMS unwrapped a data key with a key that is not
// configured (a forged header). Not retryable.
type foreignKeyError struct{ arn string }

func (e *foreignKeyError) Error() string {
	return fmt.Sprintf("the data key was wrapped by KMS key %s, which is not a configured key", e.arn)
}
