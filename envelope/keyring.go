// Package envelope is Ferry's envelope encryption: data keys (DEKs) made
// locally and wrapped by a key-encryption key (KEK) that lives in a key
// management service, named by a gocloud.dev/secrets URL (awskms://,
// gcpkms://, azurekeyvault://, hashivault://, base64key://).
//
// Two formats use it, both written down in docs/FORMAT.md §9:
//   - a sealed object (NewStreamSealer, OpenStream): a payload encrypted with
//     Tink's streaming AEAD AES256-GCM-HKDF, so that a payload of any size is
//     encrypted and checked in bounded memory, segment by segment; a
//     truncated, reordered or altered segment fails while streaming;
//   - a sealed record value or header (SealRecord, OpenRecord): AES-256-GCM.
//
// Each sealed thing starts with a header naming the KEK (by its key id, a
// digest of its URL), carrying the wrapped DEK, and is authenticated together
// with associated data the caller binds it to (the topic and object key of a
// payload; the topic and field of a record).
//
// A Keyring caches data keys so that the KMS is not called per record: a
// wrapped DEK is reused for at most DataKeyMaxAge and DataKeyMaxUses, and an
// unwrapped DEK is kept for DataKeyMaxAge, at most CacheMaxEntries of each.
package envelope

import (
	"bytes"
	"context"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/smithy-go"
	"gocloud.dev/gcerrors"
	"gocloud.dev/secrets"
	"gocloud.dev/secrets/localsecrets" // base64key://; the KMS schemes: kms_cloud.go
	"golang.org/x/sync/singleflight"
)

// Errors. Each error this package returns wraps one of these (errors.Is).
var (
	// ErrUnknownKey: a sealed payload or record names a KEK (by key id)
	// that is neither the current key URL nor one of the decryption key
	// URLs. Configure the old key URL in the decryption list to read it.
	ErrUnknownKey = errors.New("encrypted under a key that is not configured")
	// ErrKMS: the KMS failed to wrap or unwrap a data key (unreachable,
	// refused, or the wrapped key is not its own). The gocloud error is
	// wrapped too; Retryable says whether trying again may help.
	ErrKMS = errors.New("key management service failed")
	// ErrAuthentication: the ciphertext does not authenticate under its
	// data key and associated data: it was altered, truncated, reordered,
	// moved to another path or topic, or sealed under another key. No byte
	// of plaintext that failed is ever returned.
	ErrAuthentication = errors.New("ciphertext does not authenticate (altered, truncated, reordered, or not bound to this topic and path)")
	// ErrFormat: the bytes start like a sealed header but do not parse:
	// an unknown version or algorithm, a length out of bounds, a short
	// header.
	ErrFormat = errors.New("malformed encryption header")
	// ErrVersion: the header is of a later version, or names an algorithm,
	// that this Ferry does not read (a Ferry upgraded before its readers
	// sealed it). It wraps ErrFormat; the proxy answers it
	// KAFKA_STORAGE_ERROR (retriable: readable once the reader is
	// upgraded), not CORRUPT_MESSAGE.
	ErrVersion = fmt.Errorf("%w: a later version or algorithm than this Ferry reads", ErrFormat)
	// ErrNotSealed: the bytes are not sealed (no magic), where sealed bytes
	// were required.
	ErrNotSealed = errors.New("not encrypted")
	// ErrKeyURL: OpenKeyring refused its configuration: a key URL that
	// does not parse, names no key, has an unknown scheme or options, or is
	// listed twice (a configuration error: fix it and start again).
	ErrKeyURL = errors.New("invalid key URL")
)

// KMSError is an ErrKMS with the KEK's key id and what was being done.
type KMSError struct {
	Op        string // "wrap" or "unwrap"
	KeyID     KeyID
	Retryable bool
	Err       error
}

func (e *KMSError) Error() string {
	return fmt.Sprintf("%s data key with KEK %s: %v: %v", e.Op, e.KeyID, ErrKMS, e.Err)
}

// Unwrap returns ErrKMS and the cause.
func (e *KMSError) Unwrap() []error { return []error{ErrKMS, e.Err} }

// KeyID names a key-encryption key inside sealed headers: the first 8 bytes
// of SHA-256("ferry-kek\x00" + scheme + "://" + host + path) of its URL. The
// query (region, endpoint, credentials profile) is left out, so that the
// same KMS key reached another way keeps its id.
type KeyID [8]byte

func (id KeyID) String() string { return fmt.Sprintf("%x", id[:]) }

// KeyIDOf returns the key id of a key URL, or an error when it does not
// parse as scheme://key (an opaque "scheme:key" is refused: gocloud would
// open it with an empty key, which base64key fills with a random one), or
// is a base64key URL without a key.
func KeyIDOf(keyURL string) (KeyID, error) {
	u, err := url.Parse(keyURL)
	if err == nil && u.Scheme == localsecrets.Scheme {
		// gocloud.dev's localsecrets would say only "illegal base64 data
		// at input byte N" (and fill an empty key with a random one).
		const want = "32 random bytes in URL-safe base64 with its = padding, 44 characters (make one: head -c 32 /dev/urandom | base64 | tr '+/' '-_')"
		if u.Host == "" {
			return KeyID{}, fmt.Errorf("a base64key URL needs its key right after the two slashes of \"base64key://\" (an empty one would be random and lost at exit): %s", want)
		}
		if k, err := base64.URLEncoding.DecodeString(u.Host); err != nil || len(k) != 32 {
			return KeyID{}, fmt.Errorf("key URL base64key://… holds %d characters that are not %s", len(u.Host), want)
		}
	}
	if err != nil || u.Scheme == "" || u.Opaque != "" || u.Host+u.Path == "" {
		return KeyID{}, fmt.Errorf("key URL %s: not a URL of the form scheme://key (gocloud.dev/secrets)", redact(keyURL))
	}
	sum := sha256.Sum256([]byte("ferry-kek\x00" + u.Scheme + "://" + u.Host + u.Path))
	var id KeyID
	copy(id[:], sum[:])
	return id, nil
}

// redact keeps the scheme of a key URL: a base64key:// URL holds the key.
func redact(keyURL string) string {
	if i := strings.Index(keyURL, "://"); i >= 0 {
		return keyURL[:i+3] + "…"
	}
	return "(unparsable)"
}

// Config configures a Keyring. Its fields are set from the
// large.message.payload.encryption.* keys (library, large-message
// interceptor) or from the encrypt interceptor's keys.
type Config struct {
	// KeyURL names the KEK that wraps new data keys. Empty: the keyring
	// only decrypts.
	KeyURL string
	// DecryptKeyURLs are older KEKs whose sealed data stays readable
	// (key rotation). KeyURL is always usable for decryption too.
	DecryptKeyURLs []string
	// DataKeyMaxAge bounds how long one data key seals new data and how
	// long an unwrapped data key is cached. Default 1 h.
	DataKeyMaxAge time.Duration
	// DataKeyMaxUses bounds how many objects or records one data key
	// seals. Default 1,000,000 (AES-GCM with random 96-bit nonces stays
	// far below the 2^32 NIST bound).
	DataKeyMaxUses int64
	// CacheMaxEntries bounds the data keys held per direction (sealing:
	// one per topic; opening: one per wrapped key). Default 1000.
	CacheMaxEntries int
}

// Defaults of Config.
const (
	DefaultDataKeyMaxAge   = time.Hour
	DefaultDataKeyMaxUses  = 1_000_000
	DefaultCacheMaxEntries = 1000
	// MaxWrappedKeyBytes bounds a wrapped data key in a header.
	MaxWrappedKeyBytes = 4096
)

// Keyring wraps and unwraps data keys through the configured KEKs and caches
// them. It is safe for concurrent use.
type Keyring struct {
	cfg     Config
	current *kek // nil: decrypt only
	keks    map[KeyID]*kek

	mu      sync.Mutex
	closed  bool
	sealing map[string]*dataKey // by scope (topic)
	opened  map[string]*openedKey
	now     func() time.Time
	aws     awsKeys // the awskms:// keys' ARNs

	unwrapping singleflight.Group // by cache key: one KMS call per wrapped key at a time
	wrapping   singleflight.Group // by scope: one KMS call per rotation of a topic's key

	// last is the data key openKey returned last: a fetch's records were
	// nearly all sealed under one, and finding it here costs a comparison
	// of its wrapped bytes where the cache costs a lock and a hash of them
	// (openKey was 8 % of `encrypt`'s fetch CPU behind Kafka's perf
	// consumer). Close clears it.
	last atomic.Pointer[openedKey]
}

type kek struct {
	id     KeyID
	keeper *secrets.Keeper
	// unwrap decrypts a wrapped data key with this key and no other
	// (keeper.Decrypt, except for awskms: openAWSKMS).
	unwrap func(context.Context, []byte) ([]byte, error)
	// local: base64key://, whose failures never pass with time.
	local bool
	name  string // the URL without its query (base64key: the scheme only), for messages
}

type dataKey struct {
	key     []byte      // 32 bytes
	gcm     cipher.AEAD // AES-256-GCM under key, for records (safe for concurrent use)
	wrapped []byte
	kek     KeyID
	made    time.Time
	uses    int64
	memo    *aadMemo // shared by the copies sealKey hands out
	// stale is set DataKeyMaxAge after made (expiry): sealKey reads it
	// instead of a clock per record (time.Now was 5 % of `encrypt`'s
	// produce CPU in BenchmarkEncryptSmallBatches).
	stale  *atomic.Bool
	expiry *time.Timer
}

// retire stops d's expiry timer: d left the sealing cache.
func (d *dataKey) retire() { d.expiry.Stop() }

type openedKey struct {
	key  []byte
	gcm  cipher.AEAD
	memo aadMemo
	made time.Time
	err  error // the KMS refused to unwrap it (not retryable), at made
	// id and wrapped name the key (Keyring.last); wrapped nil: not kept there
	id      KeyID
	wrapped []byte
	// stale is set DataKeyMaxAge after made (expiry, a timer per unwrapped
	// key): openKey's fast path reads it instead of a clock per record
	// (time.Now was 2–4 % of `encrypt`'s fetch CPU).
	stale  atomic.Bool
	expiry *time.Timer
}

// FailedUnwrapTTL is how long a wrapped data key the KMS refused to unwrap
// (not retryable: another key's, altered, access denied) is refused without
// asking the KMS again.
const FailedUnwrapTTL = time.Minute

// OpenKeyring opens the KEKs named by cfg. A base64key:// URL without a key
// (which gocloud would fill with a random, unsaved key) is refused. Errors
// name the URL by its scheme only: a base64key:// URL is a secret.
func OpenKeyring(ctx context.Context, cfg Config) (*Keyring, error) {
	if cfg.DataKeyMaxAge <= 0 {
		cfg.DataKeyMaxAge = DefaultDataKeyMaxAge
	}
	if cfg.DataKeyMaxUses <= 0 {
		cfg.DataKeyMaxUses = DefaultDataKeyMaxUses
	}
	if cfg.CacheMaxEntries <= 0 {
		cfg.CacheMaxEntries = DefaultCacheMaxEntries
	}
	k := &Keyring{cfg: cfg, keks: map[KeyID]*kek{}, sealing: map[string]*dataKey{}, opened: map[string]*openedKey{}, now: time.Now,
		aws: awsKeys{arns: map[string]bool{}}}
	urls := cfg.DecryptKeyURLs
	if cfg.KeyURL != "" {
		urls = append([]string{cfg.KeyURL}, urls...)
	}
	if len(urls) == 0 {
		return nil, fmt.Errorf("%w: none configured", ErrKeyURL)
	}
	for i, u := range urls {
		id, err := KeyIDOf(u)
		if err != nil {
			k.Close()
			which := "the key URL"
			if n := i - len(urls) + len(cfg.DecryptKeyURLs); n >= 0 { // urls ends with the decryption keys
				which = fmt.Sprintf("decryption key URL %d of %d", n+1, len(cfg.DecryptKeyURLs))
			}
			return nil, fmt.Errorf("%w: %s: %v", ErrKeyURL, which, err)
		}
		if _, dup := k.keks[id]; dup {
			if i == 0 || cfg.KeyURL == "" {
				k.Close()
				return nil, fmt.Errorf("%w: %s is listed twice (key id %s)", ErrKeyURL, redact(u), id)
			}
			continue // the current key listed again among the decryption keys
		}
		var keeper *secrets.Keeper
		var unwrap func(context.Context, []byte) ([]byte, error)
		if pu, _ := url.Parse(u); pu.Scheme == "awskms" {
			keeper, unwrap, err = openAWSKMS(ctx, pu, &k.aws)
		} else {
			keeper, err = secrets.OpenKeeper(ctx, u)
		}
		if err != nil {
			k.Close()
			return nil, fmt.Errorf("%w: open %s: %v", ErrKeyURL, redact(u), scrub(err, u))
		}
		if unwrap == nil {
			unwrap = keeper.Decrypt
		}
		local := strings.EqualFold(strings.SplitN(u, ":", 2)[0], localsecrets.Scheme)
		name := redact(u)
		if pu, err := url.Parse(u); err == nil && !local {
			name = pu.Scheme + "://" + pu.Host + pu.Path
		}
		kk := &kek{id: id, keeper: keeper, unwrap: unwrap, local: local, name: name}
		k.keks[id] = kk
		if i == 0 && cfg.KeyURL != "" {
			k.current = kk
		}
	}
	return k, nil
}

// describe lists the configured keys as "id (URL without its query)", a
// base64key:// URL by its scheme only.
func (k *Keyring) describe() string {
	var parts []string
	for id, kk := range k.keks {
		parts = append(parts, fmt.Sprintf("%s (%s)", id, kk.name))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// scrub removes the URL (which may hold a key) from an error's text.
func scrub(err error, keyURL string) string {
	return strings.ReplaceAll(err.Error(), keyURL, redact(keyURL))
}

// CurrentKeyID is the key id of KeyURL, and false when the keyring only
// decrypts.
func (k *Keyring) CurrentKeyID() (KeyID, bool) {
	if k.current == nil {
		return KeyID{}, false
	}
	return k.current.id, true
}

// Close closes the KEKs' keepers and forgets every cached data key.
func (k *Keyring) Close() error {
	var errs []error
	for _, kk := range k.keks {
		errs = append(errs, kk.keeper.Close())
	}
	// The cached keys are dropped, not zeroed: a sealer or reader made
	// before Close may still be using one (zeroing it under them sealed
	// objects under an all-zero key), and Go's collector may have copied
	// them anyway.
	k.mu.Lock()
	k.closed = true
	for _, o := range k.opened {
		o.retire()
	}
	for _, d := range k.sealing {
		d.retire()
	}
	k.sealing, k.opened = map[string]*dataKey{}, map[string]*openedKey{}
	k.last.Store(nil)
	k.mu.Unlock()
	return errors.Join(errs...)
}

// ErrClosed: the keyring was used after Close.
var ErrClosed = errors.New("keyring closed")

// ErrDecryptOnly: sealing was asked of a keyring without a KeyURL.
var ErrDecryptOnly = errors.New("no key URL to encrypt with (decryption keys only)")

// sealKey returns the data key for new data of scope (a topic), counting one
// use, and makes and wraps a new one (one KMS call) when there is none or
// the current one is too old or used up.
func (k *Keyring) sealKey(ctx context.Context, scope string) (dataKey, error) {
	if k.current == nil {
		return dataKey{}, ErrDecryptOnly
	}
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return dataKey{}, ErrClosed
	}
	if d, ok := k.sealing[scope]; ok && d.uses < k.cfg.DataKeyMaxUses && !d.stale.Load() {
		d.uses++
		dk := *d
		k.mu.Unlock()
		return dk, nil
	}
	k.mu.Unlock()
	// One KMS call per rotation of a topic's key however many goroutines
	// (the partitions of several producers' requests) meet it, as opening
	// does: they share the new key while it has uses left (before, each
	// made and wrapped its own: a call per partition in flight, just when
	// the KMS is slow). One that finds it used up (a DataKeyMaxUses smaller
	// than the goroutines waiting), or that got the first one's
	// cancellation while its own context is alive, makes its own.
	v, err, _ := k.wrapping.Do(scope, func() (any, error) {
		_, d, err := k.makeKey(ctx, scope, 0)
		return d, err
	})
	if err == nil {
		d := v.(*dataKey)
		k.mu.Lock()
		if d.uses < k.cfg.DataKeyMaxUses {
			d.uses++
			dk := *d // copied under the lock: other sealers count uses on d
			k.mu.Unlock()
			return dk, nil
		}
		k.mu.Unlock()
	} else if ctx.Err() != nil || !ended(err) {
		return dataKey{}, err
	}
	dk, _, err := k.makeKey(ctx, scope, 1)
	return dk, err
}

// makeKey makes a data key for scope and wraps it (one KMS call), puts it
// in scope's slot with uses counted, and returns a copy and the slot's
// key. Made outside the lock: a slow KMS must not stall other topics. Two
// goroutines may both make one; the later one wins the slot.
func (k *Keyring) makeKey(ctx context.Context, scope string, uses int64) (dataKey, *dataKey, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return dataKey{}, nil, err
	}
	wrapped, err := k.current.keeper.Encrypt(ctx, key)
	if err != nil {
		return dataKey{}, nil, &KMSError{Op: "wrap", KeyID: k.current.id, Retryable: !k.current.local && retryable(err), Err: err}
	}
	if len(wrapped) > MaxWrappedKeyBytes {
		return dataKey{}, nil, &KMSError{Op: "wrap", KeyID: k.current.id, Err: fmt.Errorf("wrapped data key is %d bytes, more than %d", len(wrapped), MaxWrappedKeyBytes)}
	}
	gcm, err := newGCM(key)
	if err != nil {
		return dataKey{}, nil, err
	}
	// Its age runs from the KMS's answer: from before the call, a KMS
	// slower than DataKeyMaxAge handed over keys already too old, and
	// every record made one (a KMS call per record).
	made := k.now()
	d := &dataKey{key: key, gcm: gcm, wrapped: wrapped, kek: k.current.id, made: made, uses: uses, memo: &aadMemo{}, stale: new(atomic.Bool)}
	k.mu.Lock()
	if k.closed {
		// Closed during the KMS call: cached now, the key and its expiry
		// timer would outlive Close by DataKeyMaxAge in a keyring no one
		// can use.
		k.mu.Unlock()
		return dataKey{}, nil, ErrClosed
	}
	d.expiry = time.AfterFunc(k.cfg.DataKeyMaxAge, func() { d.stale.Store(true) })
	if old, ok := k.sealing[scope]; ok {
		old.retire()
	} else if len(k.sealing) >= k.cfg.CacheMaxEntries {
		evictOldest(k.sealing, func(d *dataKey) time.Time { return d.made }).retire()
	}
	k.sealing[scope] = d
	// The opening side knows it already: reading back what was just
	// written costs no KMS call.
	k.putOpened(string(d.kek[:])+string(wrapped), &openedKey{key: key, gcm: gcm, made: made, id: d.kek, wrapped: bytes.Clone(wrapped)})
	dk := *d // copied under the lock: other sealers count uses on d
	k.mu.Unlock()
	return dk, d, nil
}

// openKey unwraps a data key wrapped by the KEK id, from the cache when it
// was unwrapped (or made) less than DataKeyMaxAge ago.
func (k *Keyring) openKey(ctx context.Context, id KeyID, wrapped []byte) (*openedKey, error) {
	kk, ok := k.keks[id]
	if !ok {
		return nil, fmt.Errorf("%w: key id %s; the configured keys are %s", ErrUnknownKey, id, k.describe())
	}
	if o := k.last.Load(); o != nil && o.id == id && !o.stale.Load() && bytes.Equal(o.wrapped, wrapped) {
		return o, nil
	}
	now := k.now()
	// The cache key is built on the stack for the lookup (a hit allocates
	// nothing) and as a string only on a miss.
	var kb [320]byte // a KMS-wrapped key is 100 to 300 bytes
	key := append(append(kb[:0], id[:]...), wrapped...)
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return nil, ErrClosed
	}
	if o, ok := k.opened[string(key)]; ok {
		switch {
		case o.err != nil && now.Sub(o.made) < FailedUnwrapTTL:
			k.mu.Unlock()
			return nil, o.err
		case o.err == nil && now.Sub(o.made) < k.cfg.DataKeyMaxAge && !o.stale.Load():
			if o.wrapped != nil {
				k.last.Store(o)
			}
			k.mu.Unlock()
			return o, nil
		}
	}
	k.mu.Unlock()
	ck := string(key)
	// One KMS call for a wrapped key however many goroutines (fetches of
	// several consumers) meet it at once. The call runs under the context
	// of the goroutine that started it: one that joined it and got that
	// goroutine's cancellation (its client went away, its budget ran out)
	// while its own context is alive asks again, once.
	for try := 0; ; try++ {
		v, err, shared := k.unwrapping.Do(ck, func() (any, error) { return k.unwrap(ctx, kk, ck, wrapped, now) })
		if err != nil {
			if shared && try == 0 && ctx.Err() == nil && ended(err) {
				continue
			}
			return nil, err
		}
		return v.(*openedKey), nil
	}
}

// ended reports whether err is a context's end (cancelled or past its
// deadline): the caller stopped waiting, the KMS refused nothing.
func ended(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// unwrap asks the KMS for the data key wrapped, and caches the answer: the
// key, or a refusal that will not pass with time.
func (k *Keyring) unwrap(ctx context.Context, kk *kek, ck string, wrapped []byte, now time.Time) (*openedKey, error) {
	// A call that just ended may have cached the answer after this
	// goroutine looked.
	k.mu.Lock()
	if o, ok := k.opened[ck]; ok && !o.made.Before(now) {
		k.mu.Unlock()
		if o.err != nil {
			return nil, o.err
		}
		return o, nil
	}
	k.mu.Unlock()
	key, err := kk.unwrap(ctx, wrapped)
	if err != nil {
		// A call its context ended (the client went away, the chain's
		// watchdog cancelled a call over its budget while the KMS was
		// slow) is no refusal: remembered, it failed every record of
		// the data key for FailedUnwrapTTL after the KMS answered again.
		cut := ctx.Err() != nil || ended(err)
		kerr := &KMSError{Op: "unwrap", KeyID: kk.id, Retryable: cut || !kk.local && retryable(err), Err: err}
		if !kerr.Retryable {
			// Remembered: a record with a forged wrapped key that its
			// consumers fetch again and again costs one KMS call per
			// FailedUnwrapTTL, not one per fetch.
			k.mu.Lock()
			if !k.closed {
				k.putOpened(ck, &openedKey{err: kerr, made: now})
			}
			k.mu.Unlock()
		}
		return nil, kerr
	}
	if len(key) != 32 {
		return nil, &KMSError{Op: "unwrap", KeyID: kk.id, Err: fmt.Errorf("unwrapped data key is %d bytes, want 32", len(key))}
	}
	gcm, err := newGCM(key)
	if err != nil {
		return nil, err
	}
	// Cached from the KMS's answer (as sealKey's keys): from before the
	// call, a KMS slower than DataKeyMaxAge was asked again per record.
	o := &openedKey{key: key, gcm: gcm, made: k.now(), id: kk.id, wrapped: bytes.Clone(wrapped)}
	k.mu.Lock()
	if k.closed {
		// Closed during the KMS call: not cached (and no expiry timer
		// armed) in a keyring Close has cleared, as makeKey.
		k.mu.Unlock()
		return nil, ErrClosed
	}
	k.putOpened(ck, o)
	k.mu.Unlock()
	return o, nil
}

// putOpened caches an unwrapped key (or a refusal, o.err), arming its
// expiry; k.mu is held.
func (k *Keyring) putOpened(ck string, o *openedKey) {
	if o.err == nil {
		o.expiry = time.AfterFunc(k.cfg.DataKeyMaxAge-k.now().Sub(o.made), func() { o.stale.Store(true) })
	}
	if old, ok := k.opened[ck]; ok {
		old.retire()
	} else if len(k.opened) >= k.cfg.CacheMaxEntries {
		evictOldest(k.opened, func(o *openedKey) time.Time { return o.made }).retire()
	}
	k.opened[ck] = o
}

// evictOldest drops the oldest entry of m (a linear scan: m is bounded by
// CacheMaxEntries and this runs only when a new key is made).
// It returns the entry dropped.
func evictOldest[V any](m map[string]V, made func(V) time.Time) V {
	var oldest string
	var t time.Time
	first := true
	for k, v := range m {
		if first || made(v).Before(t) {
			oldest, t, first = k, made(v), false
		}
	}
	v := m[oldest]
	delete(m, oldest)
	return v
}

// retire marks o stale and stops its expiry timer: the key leaves the
// cache (evicted, replaced, closed), and Keyring.last may still hold it. o
// may be a cached refusal, without a timer.
func (o *openedKey) retire() {
	o.stale.Store(true)
	if o.expiry != nil {
		o.expiry.Stop()
	}
}

// retryable reports whether a KMS error may pass: the service was
// unreachable, overloaded or timed out.
func retryable(err error) bool {
	var fe *foreignKeyError
	if errors.As(err, &fe) {
		return false
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		// The AWS KMS client's own errors (openAWSKMS's unwrap).
		switch ae.ErrorCode() {
		case "KMSInternalException", "DependencyTimeoutException", "KeyUnavailableException", "ThrottlingException", "LimitExceededException":
			return true
		}
		return false
	}
	switch gcerrors.Code(err) {
	case gcerrors.Internal, gcerrors.ResourceExhausted, gcerrors.DeadlineExceeded, gcerrors.Unknown:
		return !errors.Is(err, context.Canceled)
	}
	return false
}
