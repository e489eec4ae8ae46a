package envelope

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func testKeyURL(t testing.TB) string {
	t.Helper()
	k := make([]byte, 32)
	rand.Read(k)
	return "base64key://" + base64.URLEncoding.EncodeToString(k)
}

func openTest(t testing.TB, cfg Config) *Keyring {
	t.Helper()
	k, err := OpenKeyring(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

func seal(t testing.TB, k *Keyring, plain []byte, a PayloadAAD) ([]byte, *StreamSealer) {
	t.Helper()
	s, err := k.NewStreamSealer(context.Background(), a.Topic)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	w, err := s.NewWriter(&buf, a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(plain); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), s
}

func open(k *Keyring, sealed []byte, a PayloadAAD) ([]byte, error) {
	r, err := k.OpenStream(context.Background(), bytes.NewReader(sealed), a)
	if err != nil {
		return nil, err
	}
	return io.ReadAll(r)
}

// The sizes around segment boundaries: SealedSize is exact and PlainSize
// inverts it.
func TestStreamSizes(t *testing.T) {
	k := openTest(t, Config{KeyURL: testKeyURL(t)})
	a := PayloadAAD{Topic: "t", Key: "t/00/x"}
	first := DefaultSegmentBytes - tinkTagBytes - tinkHeader
	per := DefaultSegmentBytes - tinkTagBytes
	for _, n := range []int{0, 1, first - 1, first, first + 1, first + per - 1, first + per, first + per + 1, first + 3*per} {
		plain := make([]byte, n)
		rand.Read(plain)
		sealed, s := seal(t, k, plain, a)
		if got := s.SealedSize(int64(n)); got != int64(len(sealed)) {
			t.Errorf("%d bytes: SealedSize %d, sealed %d", n, got, len(sealed))
		}
		if p, ok := PlainSize(int64(len(sealed)), s.HeaderBytes(), DefaultSegmentBytes); !ok || p != int64(n) {
			t.Errorf("%d bytes: PlainSize(%d) = %d, %v", n, len(sealed), p, ok)
		}
		back, err := open(k, sealed, a)
		if err != nil || !bytes.Equal(back, plain) {
			t.Fatalf("%d bytes: round trip: %v (equal %v)", n, err, bytes.Equal(back, plain))
		}
	}
}

func TestStreamTamper(t *testing.T) {
	old := testKeyURL(t)
	k := openTest(t, Config{KeyURL: testKeyURL(t), DecryptKeyURLs: []string{old}})
	a := PayloadAAD{Topic: "orders", Key: "orders/0a/id1"}
	plain := make([]byte, 3*DefaultSegmentBytes+77)
	rand.Read(plain)
	sealed, s := seal(t, k, plain, a)
	hl := s.HeaderBytes()
	flip := func(i int) []byte {
		b := bytes.Clone(sealed)
		b[i] ^= 1
		return b
	}
	segs := func(b []byte) [][]byte { // Tink segments after both headers
		body := b[hl+tinkHeader:]
		var out [][]byte
		first := DefaultSegmentBytes - tinkHeader
		out = append(out, body[:first])
		for body = body[first:]; len(body) > 0; {
			n := min(len(body), DefaultSegmentBytes)
			out = append(out, body[:n])
			body = body[n:]
		}
		return out
	}
	sg := segs(sealed)
	swapped := bytes.Clone(sealed[:hl+tinkHeader])
	swapped = append(append(append(append(swapped, sg[0]...), sg[2]...), sg[1]...), sg[3]...)
	other, _ := seal(t, k, plain, PayloadAAD{Topic: "orders", Key: "orders/0b/id2"})
	for name, c := range map[string]struct {
		b    []byte
		a    PayloadAAD
		want error
	}{
		"byte mid-object":         {flip(len(sealed) / 2), a, ErrAuthentication},
		"byte in tag":             {flip(len(sealed) - 1), a, ErrAuthentication},
		"byte in salt":            {flip(hl + 3), a, ErrAuthentication},
		"byte in wrapped key":     {flip(fixedHeaderBytes + 5), a, ErrKMS},
		"key id":                  {flip(15), a, ErrUnknownKey},
		"version":                 {flip(8), a, ErrFormat},
		"truncated at a segment":  {sealed[:hl+tinkHeader+len(sg[0])+len(sg[1])], a, ErrAuthentication},
		"truncated mid segment":   {sealed[:len(sealed)-100], a, ErrAuthentication},
		"segments reordered":      {swapped, a, ErrAuthentication},
		"other path":              {sealed, PayloadAAD{Topic: "orders", Key: "orders/0b/id2"}, ErrAuthentication},
		"other topic":             {sealed, PayloadAAD{Topic: "orders2", Key: "orders/0a/id1"}, ErrAuthentication},
		"object swapped":          {other, a, ErrAuthentication},
		"header only":             {sealed[:hl], a, ErrAuthentication},
		"cut after Tink's header": {sealed[:hl+tinkHeader], a, ErrAuthentication},
		"not sealed":              {plain, a, ErrNotSealed},
		"short magic":             {sealed[:5], a, ErrNotSealed},
		"short header":            {sealed[:12], a, ErrFormat},
	} {
		got, err := open(k, c.b, c.a)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v (%d bytes back)", name, err, c.want, len(got))
		}
	}
	// Sealed under a key this keyring does not know.
	k2 := openTest(t, Config{KeyURL: testKeyURL(t)})
	if _, err := open(k2, sealed, a); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("other keyring: %v, want ErrUnknownKey", err)
	}
}

// Rotation: data sealed under the old key stays readable while the old key
// URL is among the decryption keys, and not after.
func TestRotation(t *testing.T) {
	oldURL, newURL := testKeyURL(t), testKeyURL(t)
	a := PayloadAAD{Topic: "t", Key: "t/00/x"}
	before, _ := seal(t, openTest(t, Config{KeyURL: oldURL}), []byte("old payload"), a)
	rec, err := openTest(t, Config{KeyURL: oldURL}).SealRecord(context.Background(), nil, []byte("old record"), RecordAAD{Topic: "t", Field: "value"})
	if err != nil {
		t.Fatal(err)
	}
	rotated := openTest(t, Config{KeyURL: newURL, DecryptKeyURLs: []string{oldURL}})
	if got, err := open(rotated, before, a); err != nil || string(got) != "old payload" {
		t.Fatalf("old payload after rotation: %q, %v", got, err)
	}
	if got, err := rotated.OpenRecord(context.Background(), nil, rec, RecordAAD{Topic: "t", Field: "value"}); err != nil || string(got) != "old record" {
		t.Fatalf("old record after rotation: %q, %v", got, err)
	}
	after, _ := seal(t, rotated, []byte("new"), a)
	if id, _ := KeyIDOf(newURL); !bytes.Equal(after[14:22], id[:]) {
		t.Errorf("new payload sealed under key id %x, want the new key's %s", after[14:22], id)
	}
	dropped := openTest(t, Config{KeyURL: newURL})
	if _, err := open(dropped, before, a); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("old key dropped: %v, want ErrUnknownKey", err)
	}
	if _, err := dropped.OpenRecord(context.Background(), nil, rec, RecordAAD{Topic: "t", Field: "value"}); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("old key dropped, record: %v, want ErrUnknownKey", err)
	}
}

func TestRecordSealOpen(t *testing.T) {
	k := openTest(t, Config{KeyURL: testKeyURL(t)})
	a := RecordAAD{Topic: "t", Field: "value"}
	for _, n := range []int{0, 1, 1000, 1 << 20} {
		plain := make([]byte, n)
		rand.Read(plain)
		sealed, err := k.SealRecord(context.Background(), nil, plain, a)
		if err != nil {
			t.Fatal(err)
		}
		if got := SealedRecordSize(n, len(sealed)-n-recordOverhead); got != len(sealed) {
			t.Errorf("size %d vs %d", got, len(sealed))
		}
		back, err := k.OpenRecord(context.Background(), nil, sealed, a)
		if err != nil || !bytes.Equal(back, plain) {
			t.Fatalf("%d: %v", n, err)
		}
		if _, err := k.OpenRecord(context.Background(), nil, sealed, RecordAAD{Topic: "t", Field: "header:x"}); !errors.Is(err, ErrAuthentication) {
			t.Errorf("other field: %v", err)
		}
		if n > 0 {
			b := bytes.Clone(sealed)
			b[len(b)-n/2-17] ^= 0x80
			if _, err := k.OpenRecord(context.Background(), nil, b, a); !errors.Is(err, ErrAuthentication) {
				t.Errorf("flipped: %v", err)
			}
		}
		for i := 0; i < len(sealed) && i < 200; i++ { // every prefix fails cleanly
			if _, err := k.OpenRecord(context.Background(), nil, sealed[:i], a); err == nil {
				t.Fatalf("prefix %d opened", i)
			}
		}
	}
}

// Sealing into a buffer with room, and opening likewise, allocate nothing
// once the topic's data key is made and cached (the proxy seals every record
// of a batch into one pooled buffer), and the buffer's bytes before the
// output are left as they were.
func TestRecordSealOpenInPlace(t *testing.T) {
	k := openTest(t, Config{KeyURL: testKeyURL(t)})
	ctx := context.Background()
	a := RecordAAD{Topic: "t", Field: "header:email"}
	plain := make([]byte, 1024)
	rand.Read(plain)
	first, err := k.SealRecord(ctx, nil, plain, a) // makes the data key
	if err != nil {
		t.Fatal(err)
	}
	size := len(first)
	buf := make([]byte, 3, 3+size)
	copy(buf, "abc")
	opened := make([]byte, 0, size)
	var sealed []byte
	allocs := testing.AllocsPerRun(100, func() {
		if sealed, err = k.SealRecord(ctx, buf, plain, a); err != nil {
			t.Fatal(err)
		}
		if opened, err = k.OpenRecord(ctx, opened[:0], sealed[3:], a); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("seal and open allocate %.1f times, want 0", allocs)
	}
	if &sealed[0] != &buf[0] || string(sealed[:3]) != "abc" || len(sealed) != 3+size || !bytes.Equal(opened, plain) {
		t.Errorf("sealed into %p (buffer %p), %q..., %d bytes (want %d); opened equal: %v", &sealed[0], &buf[0], sealed[:3], len(sealed), 3+size, bytes.Equal(opened, plain))
	}
	if bytes.Equal(sealed[3:], first) {
		t.Error("two seals of the same plaintext are equal: the nonce is not fresh")
	}
}

// The data key is reused within its bounds (no KMS call per record) and
// replaced when its count or age runs out.
func TestDataKeyReuse(t *testing.T) {
	k := openTest(t, Config{KeyURL: testKeyURL(t), DataKeyMaxUses: 3, DataKeyMaxAge: time.Hour})
	wrapped := func() string {
		b, err := k.SealRecord(context.Background(), nil, []byte("x"), RecordAAD{Topic: "t", Field: "value"})
		if err != nil {
			t.Fatal(err)
		}
		return string(b[fixedHeaderBytes : len(b)-1-12-16])
	}
	a, b, c, d := wrapped(), wrapped(), wrapped(), wrapped()
	if a != b || b != c || c == d {
		t.Errorf("uses: want the key reused 3 times, then replaced (%v %v %v)", a == b, b == c, c == d)
	}
	// Age: a keyring whose keys last 200 ms; its first key is replaced once
	// it is marked stale (sealKey reads the mark, not a clock), not before.
	const age = 200 * time.Millisecond
	k = openTest(t, Config{KeyURL: testKeyURL(t), DataKeyMaxAge: age})
	e := wrapped()
	k.mu.Lock()
	dk := k.sealing["t"]
	k.mu.Unlock()
	if f := wrapped(); f != e && time.Since(dk.made) < age {
		t.Error("age: the data key was replaced before DataKeyMaxAge")
	}
	for deadline := time.Now().Add(10 * time.Second); !dk.stale.Load(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("age: the data key was not marked stale 10 s after DataKeyMaxAge")
		}
	}
	if since := time.Since(dk.made); since < age {
		t.Fatalf("age: marked stale %v after it was made, before DataKeyMaxAge %v", since, age)
	}
	if g := wrapped(); g == e {
		t.Error("age: the data key was not replaced after DataKeyMaxAge")
	}
}

func TestOpenKeyringRefuses(t *testing.T) {
	ctx := context.Background()
	u := testKeyURL(t)
	for name, cfg := range map[string]Config{
		"none":           {},
		"empty key":      {KeyURL: "base64key://"},
		"listed twice":   {DecryptKeyURLs: []string{u, u}},
		"not a url":      {KeyURL: "nokey"},
		"unknown scheme": {KeyURL: "rot13://x"},
	} {
		if k, err := OpenKeyring(ctx, cfg); err == nil {
			k.Close()
			t.Errorf("%s: opened", name)
		} else if bytes.Contains([]byte(err.Error()), []byte(u[12:])) {
			t.Errorf("%s: the key leaked into %q", name, err)
		}
	}
	if _, err := OpenKeyring(ctx, Config{KeyURL: u, DecryptKeyURLs: []string{u}}); err != nil {
		t.Errorf("current key listed among decryption keys: %v", err)
	}
	k := openTest(t, Config{DecryptKeyURLs: []string{u}})
	if _, err := k.SealRecord(ctx, nil, nil, RecordAAD{}); !errors.Is(err, ErrDecryptOnly) {
		t.Errorf("decrypt-only keyring sealed: %v", err)
	}
}

// The caches hold at most CacheMaxEntries keys each way.
func TestCacheBound(t *testing.T) {
	k := openTest(t, Config{KeyURL: testKeyURL(t), CacheMaxEntries: 3})
	for i := range 10 {
		if _, err := k.SealRecord(context.Background(), nil, []byte("x"), RecordAAD{Topic: string(rune('a' + i)), Field: "value"}); err != nil {
			t.Fatal(err)
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.sealing) != 3 || len(k.opened) != 3 {
		t.Fatalf("caches hold %d and %d keys, want 3 each", len(k.sealing), len(k.opened))
	}
}

// A data key keeps the associated data of its first few (topic, field)
// pairs (aadMemo): records of more pairs than it keeps still seal and open,
// each bound to its own pair whether its pair is kept or not, and a record
// whose header differs from the one kept for its pair (its wrapped key's
// bytes altered) is bound to its own header and fails.
func TestRecordAADMemo(t *testing.T) {
	ctx := context.Background()
	k := openTest(t, Config{KeyURL: testKeyURL(t)})
	var pairs []RecordAAD
	for _, f := range []string{"value", "header:a", "header:b", "header:c", "header:d", "header:e"} {
		pairs = append(pairs, RecordAAD{Topic: "t", Field: f})
	}
	sealed := make([][]byte, len(pairs))
	for round := range 2 { // the first fills the memo, the second reads it
		for i, a := range pairs {
			plain := []byte(a.Field)
			var err error
			if sealed[i], err = k.SealRecord(ctx, nil, plain, a); err != nil {
				t.Fatal(err)
			}
			back, err := k.OpenRecord(ctx, nil, sealed[i], a)
			if err != nil || !bytes.Equal(back, plain) {
				t.Fatalf("round %d %s: %q %v", round, a.Field, back, err)
			}
		}
		for i := range pairs {
			for j, a := range pairs {
				if i == j {
					continue
				}
				if _, err := k.OpenRecord(ctx, nil, sealed[i], a); !errors.Is(err, ErrAuthentication) {
					t.Fatalf("round %d: %s opened as %s: %v", round, pairs[i].Field, a.Field, err)
				}
			}
			if _, err := k.OpenRecord(ctx, nil, sealed[i], RecordAAD{Topic: "u", Field: pairs[i].Field}); !errors.Is(err, ErrAuthentication) {
				t.Fatalf("round %d: %s opened under another topic: %v", round, pairs[i].Field, err)
			}
		}
	}
	// A header of the same key id and wrapped-key length whose wrapped
	// key differs in one byte: not the key the memo holds, refused (by
	// the KMS, or by authentication).
	b := bytes.Clone(sealed[0])
	b[fixedHeaderBytes] ^= 1
	if _, err := k.OpenRecord(ctx, nil, b, pairs[0]); err == nil {
		t.Fatal("a record with an altered wrapped key opened")
	}
}

// A base64key URL whose key is not 32 bytes of URL-safe base64 with its
// padding is refused naming what it needs and how to make one (gocloud.dev
// said only "illegal base64 data at input byte N"); a good one opens.
func TestBase64KeyURLChecked(t *testing.T) {
	key := make([]byte, 32)
	good := "base64key://" + base64.URLEncoding.EncodeToString(key)
	for _, tc := range []struct{ name, url, want string }{
		{"empty", "base64key://", "right after the two slashes"},
		{"one slash", "base64key:/" + base64.URLEncoding.EncodeToString(key), "right after the two slashes"},
		{"short", "base64key://c2hvcnQ=", "holds 8 characters"},
		{"unpadded", "base64key://" + base64.RawURLEncoding.EncodeToString(key), "holds 43 characters"},
		{"standard alphabet", "base64key://" + strings.Repeat("+", 43) + "=", "URL-safe base64"},
	} {
		_, err := OpenKeyring(context.Background(), Config{KeyURL: tc.url})
		if err == nil || !errors.Is(err, ErrKeyURL) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "head -c 32 /dev/urandom") {
			t.Errorf("%s: %v, want ErrKeyURL saying %q and how to make a key", tc.name, err, tc.want)
		}
	}
	k, err := OpenKeyring(context.Background(), Config{KeyURL: good, DecryptKeyURLs: []string{"base64key://bad"}})
	if err == nil || !strings.Contains(err.Error(), "decryption key URL 1 of 1") {
		t.Errorf("a bad decryption key URL: %v, want it named", err)
	}
	k, err = OpenKeyring(context.Background(), Config{KeyURL: good})
	if err != nil {
		t.Fatalf("a good key URL: %v", err)
	}
	k.Close()
}

// An unwrapped data key is used for records without asking the KMS again
// until DataKeyMaxAge has passed, then asked for once more (openKey's fast
// path reads the key's expiry flag, not a clock).
func TestOpenedKeyMaxAge(t *testing.T) {
	const age = 200 * time.Millisecond
	k := openTest(t, Config{KeyURL: testKeyURL(t), DataKeyMaxAge: age})
	var calls atomic.Int64
	aad := RecordAAD{Topic: "t", Field: "value"}
	sealed, err := k.SealRecord(context.Background(), nil, []byte("x"), aad)
	if err != nil {
		t.Fatal(err)
	}
	// A reader's keyring: the sealer's caches its own data keys.
	k = openTest(t, Config{DecryptKeyURLs: []string{k.cfg.KeyURL}, DataKeyMaxAge: age})
	for _, kk := range k.keks {
		unwrap := kk.unwrap
		kk.unwrap = func(ctx context.Context, b []byte) ([]byte, error) { calls.Add(1); return unwrap(ctx, b) }
	}
	open := func() {
		t.Helper()
		if plain, err := k.OpenRecord(context.Background(), nil, sealed, aad); err != nil || string(plain) != "x" {
			t.Fatalf("open: %q, %v", plain, err)
		}
	}
	start := time.Now()
	open()
	open()
	if n := calls.Load(); n != 1 && time.Since(start) < age {
		t.Fatalf("two opens within DataKeyMaxAge: %d KMS calls, want 1", n)
	}
	o := k.last.Load()
	for deadline := time.Now().Add(10 * time.Second); !o.stale.Load(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the opened key was not marked stale 10 s after DataKeyMaxAge")
		}
	}
	if since := time.Since(o.made); since < age {
		t.Fatalf("marked stale %v after it was made, before DataKeyMaxAge %v", since, age)
	}
	before := calls.Load()
	open()
	open()
	if n := calls.Load() - before; n != 1 {
		t.Fatalf("opens after DataKeyMaxAge: %d KMS calls, want 1", n)
	}
}
