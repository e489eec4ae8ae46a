package envelope

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// An unwrap cut short by its caller's context (the client went away, or
// the chain's watchdog cancelled a call that ran over its budget while the
// KMS was slow) says nothing about the wrapped key: it is not remembered as
// a refusal for FailedUnwrapTTL, and another caller waiting on the same
// KMS call (singleflight) with its own context alive is not failed by the
// first one's cancellation. Before, both got the cancellation, and every
// fetch of that data key's records failed for a minute after the KMS was
// back.
func TestUnwrapCancelledNotRemembered(t *testing.T) {
	url := testKeyURL(t)
	sealer := openTest(t, Config{KeyURL: url})
	a := RecordAAD{Topic: "t", Field: "value"}
	sealed, err := sealer.SealRecord(context.Background(), nil, []byte("plain"), a)
	if err != nil {
		t.Fatal(err)
	}
	k := openTest(t, Config{KeyURL: url})
	id, _ := k.CurrentKeyID()
	kk := k.keks[id]
	real := kk.unwrap
	kk.local = false // as a KMS: its failures may pass
	started := make(chan struct{}, 4)
	var hang sync.Mutex
	hang.Lock()
	kk.unwrap = func(ctx context.Context, w []byte) ([]byte, error) {
		started <- struct{}{}
		done := make(chan struct{})
		go func() { hang.Lock(); hang.Unlock(); close(done) }()
		select {
		case <-ctx.Done():
			// As the AWS SDK: "operation error KMS: Decrypt, canceled, context canceled".
			return nil, errors.Join(errors.New("operation error KMS: Decrypt, canceled"), ctx.Err())
		case <-done:
			return real(ctx, w)
		}
	}

	// A caller whose context is cancelled while the KMS hangs, and one
	// that waits on the same call with its own context alive.
	ctx1, cancel1 := context.WithCancel(context.Background())
	errs := make(chan error, 2)
	go func() { _, err := k.OpenRecord(ctx1, nil, sealed, a); errs <- err }()
	<-started
	var got []byte
	go func() {
		var err error
		got, err = k.OpenRecord(context.Background(), nil, sealed, a)
		errs <- err
	}()
	time.Sleep(50 * time.Millisecond) // the second caller joins the call in flight
	cancel1()
	if err := <-errs; err == nil {
		t.Fatal("the cancelled caller opened the record while the KMS hung")
	}
	hang.Unlock() // the KMS answers again
	select {
	case err := <-errs:
		if err != nil || !bytes.Equal(got, []byte("plain")) {
			t.Errorf("a caller whose context is alive, waiting on a cancelled caller's KMS call: %q, %v", got, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the second caller did not return")
	}
	// The KMS is back: a new fetch opens the record.
	plain, err := k.OpenRecord(context.Background(), nil, sealed, a)
	if err != nil || !bytes.Equal(plain, []byte("plain")) {
		t.Fatalf("after a cancelled unwrap, with the KMS answering: %q, %v (the cancellation was remembered as a refusal)", plain, err)
	}
}
