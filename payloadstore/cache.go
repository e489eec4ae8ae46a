package payloadstore

import (
	"bytes"
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/singleflight"
)

// expectedKey carries a download's expected size and SHA-256 in its context.
type expectedKey struct{}

type expectation struct {
	size int64
	sum  [sha256.Size]byte
}

// WithExpected returns ctx telling a Download which bytes the caller expects
// (size bytes with SHA-256 sum, from the record's ferry.payload.size and
// ferry.payload.sha256 headers). A Cached store keeps only objects that
// match it; other stores ignore it. largemessage.Deserializer sets it.
func WithExpected(ctx context.Context, size int64, sum []byte) context.Context {
	if len(sum) != sha256.Size || size < 0 {
		return ctx
	}
	var e expectation
	e.size = size
	copy(e.sum[:], sum)
	return context.WithValue(ctx, expectedKey{}, e)
}

// CacheOptions configure Cached.
type CacheOptions struct {
	// MaxBytes bounds the payload bytes the cache holds
	// (large.message.payload.cache.max.bytes); a payload larger than it is
	// never cached. <= 0: no cache (Cached returns its store as it is).
	MaxBytes int64
	// Take, when set, takes n bytes from a wider memory budget before an
	// entry of n bytes is filled, without waiting (false: no room, the
	// payload is read without the cache); Give returns them when the entry
	// is dropped. The proxy passes its proxy.memory.max.bytes budget.
	Take func(n int64) bool
	Give func(n int64)
}

// CacheStats count a cache's work since it was made.
type CacheStats struct {
	// Hits are downloads served from a cached entry; Shared are downloads
	// that waited for another caller's download of the same payload;
	// Fills are downloads from the store into the cache; Bypassed are
	// downloads read without the cache (no expectation, too large, no
	// room, or bytes that did not match).
	Hits, Shared, Fills, Bypassed int64
	// Bytes are the bytes held now, Entries the payloads.
	Bytes   int64
	Entries int
}

// CachedStore is a PayloadStore whose Download serves payloads fetched
// again and again from memory (see Cached).
type CachedStore struct {
	PayloadStore
	o CacheOptions

	mu      sync.Mutex
	lru     *list.List // of *cacheEntry, most recent first
	entries map[string]*list.Element
	bytes   int64
	closed  bool

	sf                            singleflight.Group
	hits, shared, fills, bypassed atomic.Int64
}

type cacheEntry struct {
	key string
	b   []byte
}

// Cached returns s with a cache of whole payloads in front of its Download,
// bounded by o.MaxBytes: a download whose context carries the expected size
// and SHA-256 (WithExpected) is served from the cache when the payload is
// there; otherwise it is downloaded once, however many callers ask for it
// at the same time (the others wait for that download), checked against
// its size and SHA-256, and kept, dropping the least recently used entries
// to stay within the bound. Bytes that do not match are never kept, and each
// caller then reads the object itself (its own checks report the mismatch).
// The shared download is not cancelled when the caller that started it
// gives up: it runs within the store's own time bound
// (large.message.payload.store.timeout.ms, Wrap), and a caller that gives up
// returns at once. Entries are keyed by full path and digest. Callers must
// not modify the bytes they read (they are read through an io.Reader, so
// they cannot). Every other operation is s's. Unwrap sees through it.
func Cached(s PayloadStore, o CacheOptions) PayloadStore {
	if o.MaxBytes <= 0 {
		return s
	}
	return &CachedStore{PayloadStore: s, o: o, lru: list.New(), entries: map[string]*list.Element{}}
}

// UnwrapStore implements Wrapper.
func (c *CachedStore) UnwrapStore() PayloadStore { return c.PayloadStore }

// Stats returns the cache's counters.
func (c *CachedStore) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return CacheStats{Hits: c.hits.Load(), Shared: c.shared.Load(), Fills: c.fills.Load(), Bypassed: c.bypassed.Load(),
		Bytes: c.bytes, Entries: c.lru.Len()}
}

// Download serves fullPath from the cache, or fills it (see Cached).
func (c *CachedStore) Download(ctx context.Context, fullPath string) (io.ReadCloser, error) {
	e, ok := ctx.Value(expectedKey{}).(expectation)
	if !ok || e.size > c.o.MaxBytes || streaming(ctx) {
		c.bypassed.Add(1)
		return c.PayloadStore.Download(ctx, fullPath)
	}
	key := fullPath + "#" + hex.EncodeToString(e.sum[:])
	if b, ok := c.get(key); ok {
		c.hits.Add(1)
		return io.NopCloser(bytes.NewReader(b)), nil
	}
	ch := c.sf.DoChan(key, func() (any, error) {
		if b, ok := c.get(key); ok {
			return b, nil
		}
		return c.fill(context.WithoutCancel(ctx), key, fullPath, e)
	})
	var res singleflight.Result
	select {
	case res = <-ch:
	case <-ctx.Done():
		return nil, &Error{Op: "download", Path: fullPath, Err: ctx.Err()}
	}
	if res.Err != nil {
		return nil, res.Err
	}
	if res.Shared {
		c.shared.Add(1)
	}
	b, _ := res.Val.([]byte)
	if b == nil {
		c.bypassed.Add(1)
		return c.PayloadStore.Download(ctx, fullPath)
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

// fill downloads fullPath into a new entry; nil (and no error) when the
// entry cannot be kept: no room in the budget, or bytes that do not match e.
func (c *CachedStore) fill(ctx context.Context, key, fullPath string, e expectation) ([]byte, error) {
	if !c.makeRoom(e.size) {
		return nil, nil
	}
	keep := false
	defer func() {
		if !keep && c.o.Give != nil {
			c.o.Give(e.size)
		}
	}()
	rc, err := c.PayloadStore.Download(ctx, fullPath)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b := make([]byte, e.size)
	if _, err := io.ReadFull(rc, b); err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil, nil // shorter than expected: the caller's own read reports it
		}
		return nil, &Error{Op: "download", Path: fullPath, Retryable: true, Err: err}
	}
	var one [1]byte
	if n, _ := rc.Read(one[:]); n > 0 || sha256.Sum256(b) != e.sum {
		return nil, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return b, nil // served once, not kept
	}
	// Other fills made room before this one's entry was added: room is
	// made again, so that entries filled at once stay within the bound.
	for c.bytes+e.size > c.o.MaxBytes && c.lru.Len() > 0 {
		c.dropOldest()
	}
	c.entries[key] = c.lru.PushFront(&cacheEntry{key: key, b: b})
	c.bytes += e.size
	c.fills.Add(1)
	keep = true
	return b, nil
}

func (c *CachedStore) get(key string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[key]
	if !ok {
		return nil, false
	}
	c.lru.MoveToFront(el)
	return el.Value.(*cacheEntry).b, true
}

// makeRoom drops entries until n more bytes fit MaxBytes, then takes n
// from the budget; false when the budget has no room even so.
func (c *CachedStore) makeRoom(n int64) bool {
	c.mu.Lock()
	for c.bytes+n > c.o.MaxBytes && c.lru.Len() > 0 {
		c.dropOldest()
	}
	c.mu.Unlock()
	if c.o.Take == nil || c.o.Take(n) {
		return true
	}
	// The budget is short: give it what this cache holds, once.
	c.Reclaim(n)
	return c.o.Take(n)
}

// Reclaim drops the least recently used entries until at least n bytes
// went back to the budget (or none are left), and returns the bytes
// dropped: for a budget short of room (the proxy's memory budget calls it
// before a record waits for memory). Readers of a dropped entry finish
// reading it.
func (c *CachedStore) Reclaim(n int64) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var freed int64
	for freed < n && c.lru.Len() > 0 {
		freed += c.dropOldest()
	}
	return freed
}

// dropOldest drops the least recently used entry; c.mu is held.
func (c *CachedStore) dropOldest() int64 {
	el := c.lru.Back()
	en := c.lru.Remove(el).(*cacheEntry)
	delete(c.entries, en.key)
	n := int64(len(en.b))
	c.bytes -= n
	if c.o.Give != nil {
		c.o.Give(n)
	}
	return n
}

// Close drops every entry (giving their bytes back) and closes the store.
func (c *CachedStore) Close() error {
	c.mu.Lock()
	c.closed = true
	for c.lru.Len() > 0 {
		c.dropOldest()
	}
	c.mu.Unlock()
	return c.PayloadStore.Close()
}
