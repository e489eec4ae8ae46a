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

// blockingKeeper is a KMS whose Encrypt waits for release.
type blockingKeeper struct {
	slowKeeper
	release chan struct{}
}

func (b *blockingKeeper) Encrypt(ctx context.Context, p []byte) ([]byte, error) {
	b.mu.Lock()
	b.calls++
	b.mu.Unlock()
	select {
	case <-b.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return b.real.Encrypt(ctx, p)
}

// Goroutines that meet a topic's rotation at once (the partitions of many
// producers' requests while the KMS takes its time) share one new data
// key, one KMS call, as opening does; with DataKeyMaxUses too small for
// them all, each still gets a key of its own and no key seals more than
// its uses. Before, every one of them made and wrapped its own: a
// rotation through the proxy cost a KMS call per partition in flight (64
// for 48,000 records at 150 ms KMS latency).
func TestSealRotationOneKMSCall(t *testing.T) {
	for _, uses := range []int64{1_000_000, 1, 3} {
		k := openTest(t, Config{KeyURL: testKeyURL(t), DataKeyMaxUses: uses})
		bk := &blockingKeeper{slowKeeper: slowKeeper{real: k.current.keeper}, release: make(chan struct{})}
		k.current.keeper = secrets.NewKeeper(bk)
		a := RecordAAD{Topic: "t", Field: "value"}
		const n = 16
		var wg sync.WaitGroup
		sealed := make([][]byte, n)
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sealed[i], errs[i] = k.SealRecord(context.Background(), nil, []byte{byte(i)}, a)
			}()
		}
		time.Sleep(100 * time.Millisecond) // all waiting on the KMS
		close(bk.release)
		wg.Wait()
		keys := map[string]int{}
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("uses=%d: %v", uses, errs[i])
			}
			p, err := k.OpenRecord(context.Background(), nil, sealed[i], a)
			if err != nil || len(p) != 1 || p[0] != byte(i) {
				t.Fatalf("uses=%d: record %d opened to %v, %v", uses, i, p, err)
			}
			_, m, _ := parseFixed(sealed[i])
			keys[string(sealed[i][fixedHeaderBytes:fixedHeaderBytes+m])]++
		}
		for _, c := range keys {
			if int64(c) > uses {
				t.Errorf("uses=%d: a data key sealed %d records", uses, c)
			}
		}
		if uses >= n && bk.calls != 1 {
			t.Errorf("uses=%d: %d goroutines meeting a rotation made %d KMS calls, want 1", uses, n, bk.calls)
		}
	}
}
