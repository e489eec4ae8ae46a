package envelope

import (
	"context"
	"testing"
	"time"
)

// A refresh of the configured keys' ARNs (DescribeKey, for a data key
// unwrapped by a key not known yet: a forged record, at most once a minute)
// that waits on the KMS does not hold up the check of a key already known:
// every other record's unwrap would wait for it, up to its time budget
// (found by a helper: the refresh held the lock through DescribeKey).
func TestAWSKeysKnownWhileRefreshWaits(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{})
	a := &awsKeys{arns: map[string]bool{"arn:known": true}, resolved: 1, refreshed: time.Now().Add(-time.Hour)}
	a.resolve = []func(context.Context) (string, error){func(ctx context.Context) (string, error) {
		close(entered)
		select {
		case <-release:
			return "arn:known", nil
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}}
	done := make(chan bool, 1)
	go func() {
		ok, _ := a.allowed(context.Background(), "arn:forged")
		done <- ok
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the refresh for an unknown key never called DescribeKey")
	}
	known := make(chan bool, 1)
	go func() {
		ok, _ := a.allowed(context.Background(), "arn:known")
		known <- ok
	}()
	select {
	case ok := <-known:
		if !ok {
			t.Fatal("a configured key was refused")
		}
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("the check of a known key waited for a refresh stuck in DescribeKey")
	}
	close(release)
	if ok := <-done; ok {
		t.Fatal("an unknown key was allowed")
	}
}
