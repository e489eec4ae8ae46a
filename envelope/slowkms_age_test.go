package envelope

import (
	"context"
	"sync"
	"testing"
	"time"

	"gocloud.dev/gcerrors"
	"gocloud.dev/secrets"
)

// slowKeeper is a KMS whose every call takes d on the keyring's clock.
type slowKeeper struct {
	real  *secrets.Keeper
	tick  func()
	mu    sync.Mutex
	calls int
}

func (s *slowKeeper) Encrypt(ctx context.Context, p []byte) ([]byte, error) {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	s.tick()
	return s.real.Encrypt(ctx, p)
}
func (s *slowKeeper) Decrypt(ctx context.Context, c []byte) ([]byte, error) {
	return s.real.Decrypt(ctx, c)
}
func (s *slowKeeper) Close() error                       { return nil }
func (s *slowKeeper) ErrorAs(error, any) bool            { return false }
func (s *slowKeeper) ErrorCode(error) gcerrors.ErrorCode { return gcerrors.Unknown }

// A KMS slower than DataKeyMaxAge (a tiny max age, a KMS far away) does
// not make every data key too old before its first use: a key's age runs
// from when the KMS handed it over. Before, it ran from before the call:
// every record made and wrapped a new key, or unwrapped its key again, one
// KMS call per record.
func TestDataKeyAgeFromKMSAnswer(t *testing.T) {
	var mu sync.Mutex
	clock := time.Unix(1e9, 0)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	tick := func() { mu.Lock(); clock = clock.Add(150 * time.Millisecond); mu.Unlock() }
	url := testKeyURL(t)
	cfg := Config{KeyURL: url, DataKeyMaxAge: 100 * time.Millisecond}

	k := openTest(t, cfg)
	k.now = now
	kk := k.current
	sk := &slowKeeper{real: kk.keeper, tick: tick}
	kk.keeper = secrets.NewKeeper(sk)
	a := RecordAAD{Topic: "t", Field: "value"}
	var sealed [][]byte
	for range 10 {
		s, err := k.SealRecord(context.Background(), nil, []byte("plain"), a)
		if err != nil {
			t.Fatal(err)
		}
		sealed = append(sealed, s)
	}
	if sk.calls != 1 {
		t.Errorf("10 records sealed at once through a KMS slower than the max age: %d wrap calls, want 1", sk.calls)
	}

	o := openTest(t, cfg)
	o.now = now
	ok := o.current
	real := ok.unwrap
	unwraps := 0
	ok.unwrap = func(ctx context.Context, w []byte) ([]byte, error) {
		unwraps++
		tick()
		return real(ctx, w)
	}
	for _, s := range sealed[:1] {
		for range 10 {
			if _, err := o.OpenRecord(context.Background(), nil, s, a); err != nil {
				t.Fatal(err)
			}
		}
	}
	if unwraps != 1 {
		t.Errorf("10 records of one data key opened at once through a KMS slower than the max age: %d unwrap calls, want 1", unwraps)
	}
}
