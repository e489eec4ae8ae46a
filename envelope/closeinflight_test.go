package envelope

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// A KMS call in flight when the keyring closes (a reload or Shutdown
// closing a chain while a partition's data key rotates, a fetch's unwrap)
// cached its key in the maps Close had just cleared, with an expiry timer
// armed for DataKeyMaxAge (an hour by default): Close "forgets every cached
// data key", yet the key and its timer lived on in a keyring no one can use.
// A key made or unwrapped after Close is not cached, and the call fails
// with ErrClosed, as one that starts after Close does.
func TestKeyMadeDuringCloseNotCached(t *testing.T) {
	cfg := Config{KeyURL: testKeyURL(t)}
	a := RecordAAD{Topic: "t", Field: "value"}

	// Sealing: the wrap call has returned; Close runs before the key is
	// cached (gocloud's Keeper.Close waits for the Encrypt call itself;
	// the clock read after it is where Close lands here).
	k := openTest(t, cfg)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	k.now = func() time.Time {
		once.Do(func() {
			close(entered)
			<-release
		})
		return time.Now()
	}
	errc := make(chan error, 1)
	go func() {
		_, err := k.SealRecord(context.Background(), nil, []byte("plain"), a)
		errc <- err
	}()
	<-entered
	k.Close()
	close(release)
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Errorf("seal whose KMS call ended after Close: %v, want ErrClosed", err)
	}
	k.mu.Lock()
	ns, no := len(k.sealing), len(k.opened)
	k.mu.Unlock()
	if ns != 0 || no != 0 {
		t.Errorf("after Close: %d sealing and %d opened keys cached (their expiry timers armed), want none", ns, no)
	}

	// Opening: the unwrap call returns after Close.
	w := openTest(t, cfg)
	sealed, err := w.SealRecord(context.Background(), nil, []byte("plain"), a)
	if err != nil {
		t.Fatal(err)
	}
	o := openTest(t, cfg)
	real := o.current.unwrap
	entered, release = make(chan struct{}), make(chan struct{})
	o.current.unwrap = func(ctx context.Context, b []byte) ([]byte, error) {
		key, err := real(ctx, b) // (awskms's unwrap does not go through the keeper Close waits for)
		close(entered)
		<-release
		return key, err
	}
	go func() {
		_, err := o.OpenRecord(context.Background(), nil, sealed, a)
		errc <- err
	}()
	<-entered
	o.Close()
	close(release)
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Errorf("open whose KMS call ended after Close: %v, want ErrClosed", err)
	}
	o.mu.Lock()
	no = len(o.opened)
	o.mu.Unlock()
	if no != 0 {
		t.Errorf("after Close: %d opened keys cached (their expiry timers armed), want none", no)
	}
}
